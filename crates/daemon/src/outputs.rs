//! Outputs that survive their sandbox: the regular files under
//! [`OUTPUTS_DIR`] copied to an object store (the `object_store` crate: a
//! local directory by default, `<data>/outputs`; an S3-compatible bucket
//! with `serve --outputs-store s3://bucket/prefix`, credentials and
//! endpoint from the `AWS_*` environment).
//!
//! - **When:** on request (`POST /v1/sandboxes/{id}/outputs`), and at
//!   teardown, whatever ends the sandbox (a delete, its timeout, a
//!   daemon-side stop), for a sandbox created with `collect_outputs`. A
//!   paused sandbox is thawed for it; a dead one has nothing to read, which
//!   the audit trail says.
//! - **What:** each regular file, at `<prefix>/<sandbox id>/<its path
//!   under the outputs directory>`, replacing what an earlier collection
//!   put there. Symlinks and special files are skipped (never followed);
//!   at most [`MAX_FILES`] files and `outputs_max_bytes` bytes are copied,
//!   the rest counted as left out. Reads go through the sandbox's agent,
//!   as file reads of the API do.
//! - **Record:** the audit event `outputs.collected` names the files (the
//!   first [`AUDITED_FILES`]) with their sizes and SHA-256 digests and
//!   where they went, or `outputs.failed` says why not.
//! - **Retention:** files older than `outputs_ttl` (`serve --outputs-ttl`,
//!   7 days by default) are deleted by the collector (and `POST /v1/gc`),
//!   so what many sandboxes leave does not grow the store without bound.

use std::sync::Arc;
use std::time::Duration;

use object_store::path::{Path as StorePath, PathPart};
use object_store::ObjectStore;
use serde::Serialize;
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::{Daemon, DaemonError, LiveSandbox};
use airlock_protocol::FileKind;
use airlock_store::{KeyRow, Stream};

/// The directory collected.
pub const OUTPUTS_DIR: &str = "/mnt/user-data/outputs";
/// Most files one collection copies.
pub const MAX_FILES: usize = 10_000;
/// Most files one audit event names.
pub const AUDITED_FILES: usize = 100;
/// How deep under [`OUTPUTS_DIR`] files are looked for.
const DEPTH: u32 = 32;
/// Longest a collection at teardown may hold the teardown up.
pub const TEARDOWN_BOUND: Duration = Duration::from_secs(120);
/// Bytes of one part of an upload.
const PART_BYTES: usize = 8 << 20;

/// Where outputs go.
pub struct OutputStore {
    store: Arc<dyn ObjectStore>,
    prefix: StorePath,
    /// The URL, for records.
    url: String,
}

/// The object store cannot be opened as configured.
#[derive(Debug, thiserror::Error)]
pub enum OutputStoreError {
    #[error("the outputs store {0:?} is not a URL (file:///dir or s3://bucket/prefix): {1}")]
    NotAUrl(String, url::ParseError),
    #[error("the outputs store {0:?} has scheme {1:?}: use file:///dir or s3://bucket/prefix")]
    Scheme(String, String),
    #[error("cannot make the outputs directory {0}")]
    Dir(std::path::PathBuf, #[source] std::io::Error),
    #[error("the outputs store {0:?} cannot be opened")]
    Open(String, #[source] object_store::Error),
}

impl OutputStore {
    /// Opens `url`: `file:///dir` (made if missing) or `s3://bucket/prefix`.
    pub fn open(url: &str) -> Result<OutputStore, OutputStoreError> {
        let parsed =
            url::Url::parse(url).map_err(|e| OutputStoreError::NotAUrl(url.to_owned(), e))?;
        let store: Arc<dyn ObjectStore> = match parsed.scheme() {
            "file" => {
                let dir = parsed
                    .to_file_path()
                    .map_err(|()| OutputStoreError::Scheme(url.to_owned(), "file".into()))?;
                std::fs::create_dir_all(&dir).map_err(|e| OutputStoreError::Dir(dir.clone(), e))?;
                let local = object_store::local::LocalFileSystem::new_with_prefix(&dir)
                    .map_err(|e| OutputStoreError::Open(url.to_owned(), e))?;
                return Ok(OutputStore {
                    store: Arc::new(local),
                    prefix: StorePath::default(),
                    url: url.to_owned(),
                });
            }
            "s3" => Arc::new(
                object_store::aws::AmazonS3Builder::from_env()
                    .with_url(url)
                    .build()
                    .map_err(|e| OutputStoreError::Open(url.to_owned(), e))?,
            ),
            other => return Err(OutputStoreError::Scheme(url.to_owned(), other.to_owned())),
        };
        let prefix = StorePath::from_iter(
            parsed
                .path_segments()
                .into_iter()
                .flatten()
                .filter(|s| !s.is_empty())
                .map(PathPart::from),
        );
        Ok(OutputStore {
            store,
            prefix,
            url: url.to_owned(),
        })
    }

    /// Where `relative` (a path under the outputs directory) of sandbox
    /// `id` goes: each component encoded as one part, so no name can climb
    /// out of the sandbox's own prefix.
    fn location(&self, id: &str, relative: &str) -> StorePath {
        let parts = self
            .prefix
            .parts()
            .chain(std::iter::once(PathPart::from(id)))
            .chain(
                relative
                    .split('/')
                    .filter(|c| !c.is_empty())
                    .map(PathPart::from),
            );
        StorePath::from_iter(parts)
    }
}

impl OutputStore {
    /// Deletes every object under the store's prefix last written before
    /// `cutoff_ms` (unix milliseconds); how many.
    async fn sweep(&self, cutoff_ms: i64) -> Result<usize, object_store::Error> {
        use futures_util::StreamExt;
        let mut listing = self.store.list(Some(&self.prefix));
        let mut removed = 0;
        while let Some(meta) = listing.next().await {
            let meta = meta?;
            if meta.last_modified.timestamp_millis() < cutoff_ms {
                match self.store.delete(&meta.location).await {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => removed += 1,
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(removed)
    }
}

/// One file copied.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct CollectedFile {
    /// Its path under the outputs directory.
    pub path: String,
    pub bytes: u64,
    /// `sha256:` and 64 hex digits.
    pub sha256: String,
}

/// What one collection copied.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Collected {
    /// Where the files went: the store's URL and the sandbox's prefix.
    pub location: String,
    pub files: Vec<CollectedFile>,
    pub bytes: u64,
    /// Symlinks, special files and files past the bounds, not copied.
    pub left_out: u64,
}

impl Daemon {
    /// Deletes collected outputs older than the configured TTL; how many
    /// files went.
    pub async fn sweep_outputs(&self) -> Result<usize, DaemonError> {
        let ttl = i64::try_from(self.config().outputs_ttl.as_millis()).unwrap_or(i64::MAX);
        let cutoff = crate::audit::now_ms().saturating_sub(ttl);
        self.inner.outputs.sweep(cutoff).await.map_err(|e| {
            DaemonError::Internal(format!(
                "sweeping the outputs store: {}",
                airlock_backend::error_chain(&e)
            ))
        })
    }

    /// Copies the outputs of running sandbox `id` (which `key` may see) now.
    pub async fn collect_outputs(
        &self,
        key: &KeyRow,
        id: &str,
        request_id: &str,
    ) -> Result<Collected, DaemonError> {
        self.get(key, id)?;
        let sandbox = self.running(id)?;
        self.collect_outputs_of(&sandbox, "request", request_id)
            .await
    }

    /// Copies the outputs of `sandbox` (in any state whose agent answers),
    /// recording in the audit trail what went where, or why nothing did.
    pub(crate) async fn collect_outputs_of(
        &self,
        sandbox: &LiveSandbox,
        why: &str,
        request_id: &str,
    ) -> Result<Collected, DaemonError> {
        let result = self.copy_outputs(sandbox, request_id).await;
        let id = sandbox.id.as_str();
        match &result {
            Ok(collected) => self.audit().record(
                Stream::Runtime,
                "outputs.collected",
                Some(id),
                Some(request_id),
                json!({
                    "why": why,
                    "location": collected.location,
                    "count": collected.files.len(),
                    "bytes": collected.bytes,
                    "left_out": collected.left_out,
                    "files": collected.files.iter().take(AUDITED_FILES).collect::<Vec<_>>(),
                }),
            ),
            Err(e) => self.audit().record(
                Stream::Runtime,
                "outputs.failed",
                Some(id),
                Some(request_id),
                json!({"why": why, "error": e.to_string()}),
            ),
        }
        result
    }

    async fn copy_outputs(
        &self,
        sandbox: &LiveSandbox,
        request_id: &str,
    ) -> Result<Collected, DaemonError> {
        let outputs = &self.inner.outputs;
        let id = sandbox.id.as_str();
        let entries = match crate::files::list_all_of(sandbox, OUTPUTS_DIR, DEPTH, None).await {
            Ok(entries) => entries,
            Err(DaemonError::NotFound(_)) => Vec::new(),
            Err(e) => return Err(e),
        };
        let budget = self.config().outputs_max_bytes;
        let mut collected = Collected {
            location: format!("{}/{}", outputs.url.trim_end_matches('/'), id),
            files: Vec::new(),
            bytes: 0,
            left_out: 0,
        };
        for entry in entries {
            let Some(relative) = entry
                .path
                .strip_prefix(OUTPUTS_DIR)
                .map(|r| r.trim_start_matches('/'))
                .filter(|r| !r.is_empty())
            else {
                continue;
            };
            match entry.kind {
                FileKind::Dir => continue,
                FileKind::File
                    if collected.files.len() < MAX_FILES
                        && collected.bytes.saturating_add(entry.size) <= budget => {}
                _ => {
                    collected.left_out += 1;
                    continue;
                }
            }
            let location = outputs.location(id, relative);
            match self
                .upload(
                    sandbox,
                    &entry.path,
                    outputs,
                    &location,
                    budget - collected.bytes,
                    request_id,
                )
                .await?
            {
                Some((bytes, sha256)) => {
                    collected.bytes += bytes;
                    collected.files.push(CollectedFile {
                        path: relative.to_owned(),
                        bytes,
                        sha256,
                    });
                }
                None => collected.left_out += 1,
            }
        }
        Ok(collected)
    }

    /// Streams `path` of `sandbox` to `location`; its size and digest, or
    /// `None` when it grew past `allowance` bytes (the upload is aborted).
    async fn upload(
        &self,
        sandbox: &LiveSandbox,
        path: &str,
        outputs: &OutputStore,
        location: &StorePath,
        allowance: u64,
        request_id: &str,
    ) -> Result<Option<(u64, String)>, DaemonError> {
        let store_error =
            |e: object_store::Error| DaemonError::Upstream(format!("the outputs store: {e}"));
        let mut reader = self.read_file_of(sandbox, path, request_id).await?;
        let upload = outputs
            .store
            .put_multipart(location)
            .await
            .map_err(store_error)?;
        let mut writer = object_store::WriteMultipart::new_with_chunk_size(upload, PART_BYTES);
        let mut hasher = Sha256::new();
        let mut bytes: u64 = 0;
        while let Some(chunk) = reader.next_chunk().await {
            let chunk = match chunk {
                Ok(chunk) => chunk,
                Err(e) => {
                    let _ = writer.abort().await;
                    return Err(e);
                }
            };
            bytes += chunk.len() as u64;
            if bytes > allowance {
                let _ = writer.abort().await;
                return Ok(None);
            }
            hasher.update(&chunk);
            if let Err(e) = writer.wait_for_capacity(4).await {
                return Err(store_error(e));
            }
            writer.write(&chunk);
        }
        writer.finish().await.map_err(store_error)?;
        Ok(Some((bytes, format!("sha256:{:x}", hasher.finalize()))))
    }
}
