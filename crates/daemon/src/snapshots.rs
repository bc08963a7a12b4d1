//! Snapshots and forks: a sandbox's filesystem frozen into a layer.
//!
//! # What a snapshot is
//!
//! What a sandbox changed of its template (its overlay's writable layer)
//! becomes one new content-addressed layer of the layer store, on top of
//! the template's own layers: a snapshot is that stack, like a template,
//! but owned by the key that took it. The same bytes are written once
//! more as a zstd-compressed tar (`<data>/snapshots/<id>.tar.zst`, at
//! [`crate::Config::snapshot_zstd_level`]), the snapshot's portable form;
//! its sizes, digest, level and the time taken are recorded.
//!
//! - **Consistency.** A running sandbox is frozen (its tier's memory-mode
//!   pause) while its layer is read, and thawed after, so the snapshot is
//!   one instant of its files; a paused one stays as it is. Pause, resume,
//!   stop and other snapshots of it wait meanwhile. One paused keeping
//!   only its files ([`crate::files_only`]) is its layers already: its
//!   snapshots and forks stack them as they are, with no new layer and
//!   no archive.
//! - **Memory.** No tier here captures processes or memory into a
//!   snapshot: sandboxes created from one start fresh processes on its
//!   files (the template's start command runs again).
//! - **Names.** Unique among a key's snapshots; taking a snapshot under a
//!   name it already has replaces that snapshot's contents and keeps its
//!   id, as e2b does with a snapshot template's builds. A name may not be
//!   one of the daemon's templates.
//! - **Creating from one.** A create's template may name a snapshot of
//!   the caller's, by id or name (templates are looked at first); its
//!   sandboxes run on the snapshot's tier unless the create names one.
//! - **Lifetime.** A snapshot outlives its sandbox. Deleting it drops its
//!   reference on its layers and removes its archive; the collector
//!   removes layers nothing references any more, and archives no snapshot
//!   records.
//!
//! # Forks
//!
//! A fork freezes the parent's layer the same way (once, whatever the
//! count), then creates each child on the parent's layers and that one:
//! every child shares the same layers, copy-on-write, none copies them.
//! Each child is a create of its own (admission, fresh id, hostname and
//! access token, its own writable layer), with the parent's spec
//! (limits, network, env, user, lifecycle) and metadata and the fork's
//! timeout; each succeeds or fails alone. The new layer is held by a
//! snapshot record only while the children are being created; from then
//! on the children's own references keep it, and it goes when the last
//! of them does.
//!
//! # What is not carried
//!
//! The files the launcher generates per sandbox (`/etc/hostname`,
//! `/etc/hosts`, `/etc/resolv.conf`) are left out of the layer, so each
//! new sandbox gets its own. Access tokens never live in a sandbox's
//! files. The kernel's random pool and `boot_id` are the host's on the
//! process and oci tiers and gVisor's own per sandbox on the gvisor tier;
//! no memory is restored, so no two sandboxes share a generator's state.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock_layers::ImageConfig;
use airlock_policy::{SandboxSpec, Template};
use airlock_store::{KeyRow, SandboxRow, SnapshotFilter, SnapshotRow, Stream};
use serde_json::json;

use crate::sandboxes::{Created, NewSandboxRequest};
use crate::templates::ResolvedTemplate;
use crate::{Daemon, DaemonError, LiveSandbox, State};

/// At most this many children per fork (e2b's bound).
pub const MAX_FORKS: u32 = 100;

/// An archive still being written; the collector leaves it alone for
/// this long.
const PARTIAL_GRACE: Duration = Duration::from_secs(3600);

/// What a snapshot request asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SnapshotRequest {
    /// Its name, unique among the caller's snapshots.
    pub name: Option<String>,
}

/// What a fork asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForkRequest {
    /// How many children (1 to [`MAX_FORKS`]).
    pub count: u32,
    /// Each child's lifetime.
    pub timeout_ms: u64,
}

/// What a snapshot or a fork is taken of.
enum Source {
    /// A live sandbox: its writable layer is frozen into one more layer.
    Live(Arc<LiveSandbox>),
    /// One paused keeping only its files (see [`crate::files_only`]):
    /// the layers it runs on are its whole state already.
    Files(Box<SandboxSpec>),
}

impl Source {
    fn spec(&self) -> &SandboxSpec {
        match self {
            Source::Live(sandbox) => &sandbox.spec,
            Source::Files(spec) => spec,
        }
    }
}

/// A sandbox's writable layer, frozen into the layer store and recorded.
pub(crate) struct FrozenLayer<'a> {
    /// The layer, `None` when the sandbox changed no file.
    pub layer: Option<FrozenDiff>,
    /// The archive, when one was asked for.
    pub archived: Option<airlock_layers::keep::Archived>,
    /// Held until the caller has recorded what references the layer: the
    /// collector cannot take it meanwhile.
    pub _using: tokio::sync::RwLockReadGuard<'a, ()>,
}

/// A frozen layer's figures.
pub(crate) struct FrozenDiff {
    pub diff_id: String,
    pub bytes: u64,
    pub entries: u64,
}

/// Whether `name` may name a snapshot: 1 to 128 of letters, digits and
/// `._-`, starting with a letter or digit, and not `snap-…` (ids).
pub fn is_snapshot_name(name: &str) -> bool {
    (1..=128).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        && !name.starts_with("snap-")
}

/// A snapshot's id or name as an e2b client may spell it (`team/NAME`,
/// `NAME:default`) bare; `None` for a tag other than `default`, which no
/// snapshot has.
fn bare_snapshot_name(text: &str) -> Option<&str> {
    let bare = text.rsplit('/').next().unwrap_or(text);
    match bare.split_once(':') {
        Some((bare, "default")) => Some(bare),
        Some(_) => None,
        None => Some(bare),
    }
}

/// The diff ids of the layers `spec` runs on, bottom first; `None` for a
/// template that is not a stack of layers of the store.
pub(crate) fn spec_layers(spec: &SandboxSpec) -> Option<Vec<String>> {
    let Template::Layers { layers } = &spec.template else {
        return None;
    };
    layers
        .iter()
        .map(|path| {
            let hex = path.file_name()?.to_str()?;
            let diff_id = format!("sha256:{hex}");
            airlock_layers::is_sha256_digest(&diff_id).then_some(diff_id)
        })
        .collect()
}

impl Daemon {
    fn archive_dir(&self) -> PathBuf {
        self.config().data_dir.join("snapshots")
    }

    /// Where snapshot `id`'s archive is kept.
    pub fn snapshot_archive(&self, id: &str) -> PathBuf {
        self.archive_dir().join(format!("{id}.tar.zst"))
    }

    /// Freezes the writable layer of live sandbox `sandbox` into the layer
    /// store and records the layer; with `archive`, also writes the same
    /// stream compressed at that level to that file. The sandbox should be
    /// still (frozen, paused, or a finished build step).
    pub(crate) async fn freeze_layer(
        &self,
        sandbox: &LiveSandbox,
        archive: Option<(std::fs::File, i32)>,
    ) -> Result<FrozenLayer<'_>, DaemonError> {
        let id = sandbox.id.as_str();
        let store = self.layer_store()?;
        let staging = store
            .stage()
            .map_err(|e| DaemonError::Internal(format!("cannot stage a layer: {e}")))?;
        let (reader, writer) = std::io::pipe()
            .map_err(|e| DaemonError::Internal(format!("cannot make a pipe: {e}")))?;
        let into = staging.path().to_owned();
        let unpacking = tokio::task::spawn_blocking(move || {
            let limits = airlock_layers::unpack::UnpackLimits::default();
            match archive {
                None => airlock_layers::unpack::unpack_layer(reader, &into, &limits)
                    .map(|unpacked| (unpacked, None)),
                Some((file, level)) => {
                    let mut tee = airlock_layers::keep::ArchivingReader::new(reader, file, level)
                        .map_err(|source| airlock_layers::unpack::UnpackError::Io {
                        what: "start the snapshot's archive",
                        at: airlock_layers::unpack::Place::Start,
                        source,
                    })?;
                    let unpacked = airlock_layers::unpack::unpack_layer(&mut tee, &into, &limits)?;
                    let archived =
                        tee.finish()
                            .map_err(|source| airlock_layers::unpack::UnpackError::Io {
                                what: "write the snapshot's archive",
                                at: airlock_layers::unpack::Place::Start,
                                source,
                            })?;
                    Ok((unpacked, Some(archived)))
                }
            }
        });
        let exported = match self.inner.tiers.get(sandbox.spec.tier) {
            Ok(backend) => backend.export_writable_layer(id, Box::new(writer)).await,
            Err(e) => Err(airlock_backend::ExportError::Unsupported {
                tier: sandbox.spec.tier.as_str(),
            })
            .inspect_err(|_| tracing::warn!("{e}")),
        };
        let unpacked = unpacking
            .await
            .map_err(|e| DaemonError::Internal(format!("the layer's unpacking was lost: {e}")))?;
        let snapshot = exported.map_err(|e| match e {
            airlock_backend::ExportError::Snapshot(e) => DaemonError::BadInput(format!(
                "the sandbox's changes cannot be a layer: {}",
                airlock_backend::error_chain(&e)
            )),
            airlock_backend::ExportError::Unsupported { .. }
            | airlock_backend::ExportError::NotOnDisk
            | airlock_backend::ExportError::NoLayers(_) => DaemonError::Conflict(format!(
                "{id}'s files cannot be frozen: {}",
                airlock_backend::error_chain(&e)
            )),
            other => DaemonError::Internal(airlock_backend::error_chain(&other)),
        })?;
        let (unpacked, archived) = unpacked.map_err(|e| {
            DaemonError::Internal(format!(
                "unpacking a sandbox's layer: {}",
                airlock_backend::error_chain(&e)
            ))
        })?;
        let using = self.inner.layers_lock.read().await;
        // Only the root: nothing changed.
        if snapshot.entries <= 1 {
            return Ok(FrozenLayer {
                layer: None,
                archived,
                _using: using,
            });
        }
        store
            .commit(staging, &unpacked.diff_id)
            .map_err(|e| DaemonError::Internal(format!("cannot commit a layer: {e}")))?;
        self.with_store(|s| s.record_layer(&unpacked.diff_id, unpacked.bytes, unpacked.entries))?;
        Ok(FrozenLayer {
            layer: Some(FrozenDiff {
                diff_id: unpacked.diff_id,
                bytes: unpacked.bytes,
                entries: unpacked.entries,
            }),
            archived,
            _using: using,
        })
    }

    /// Runs `freeze` on live sandbox `id` while it is still: a running
    /// sandbox is frozen for it and thawed after, a paused one stays
    /// paused. Pause, resume and teardown of it wait meanwhile.
    async fn while_still<'a, T, F>(
        &'a self,
        sandbox: &'a Arc<LiveSandbox>,
        freeze: impl FnOnce(&'a Daemon, &'a Arc<LiveSandbox>) -> F,
    ) -> Result<T, DaemonError>
    where
        F: std::future::Future<Output = Result<T, DaemonError>>,
    {
        let backend = Arc::clone(self.inner.tiers.get(sandbox.spec.tier)?);
        let _teardown = sandbox.teardown.lock().await;
        let frozen = match sandbox.state() {
            State::Running => match backend
                .pause(&sandbox.id, &sandbox.resources, crate::PauseMode::Freeze)
                .await
            {
                Ok(()) => true,
                // A tier that cannot freeze: its files are read live (a
                // file changing under the walk fails it cleanly).
                Err(airlock_backend::StateError::Unsupported { .. }) => false,
                Err(e) => return Err(crate::sandboxes::state_error(e)),
            },
            State::Paused => false,
            _ => return Err(DaemonError::NotRunning(sandbox.id.clone())),
        };
        let result = freeze(self, sandbox).await;
        if frozen {
            if let Err(e) = backend.resume(&sandbox.id, &sandbox.resources).await {
                tracing::error!("cannot thaw {} after freezing its files: {e}", sandbox.id);
                return Err(crate::sandboxes::state_error(e));
            }
        }
        result
    }

    /// The sandbox `id` that `key` may see, its record and the layers it
    /// runs on; 409 for one whose template is not layered.
    fn layered(
        &self,
        key: &KeyRow,
        id: &str,
    ) -> Result<(Source, SandboxRow, Vec<String>), DaemonError> {
        let row = self.get(key, id)?;
        let Some(sandbox) = self.live_sandbox(id) else {
            if row.is_paused_files_only() {
                let spec: SandboxSpec = serde_json::from_str(&row.spec_json).map_err(|e| {
                    DaemonError::Internal(format!("the recorded spec of {id} is unreadable: {e}"))
                })?;
                if let Some(layers) = spec_layers(&spec) {
                    return Ok((Source::Files(Box::new(spec)), row, layers));
                }
            }
            return Err(DaemonError::NotRunning(id.to_owned()));
        };
        let Some(layers) = spec_layers(&sandbox.spec) else {
            return Err(DaemonError::Conflict(format!(
                "sandbox {id} runs on the template {:?}, which is not a stack of layers: only sandboxes of imported, pulled, built or bootstrapped templates (and of snapshots) can be snapshotted or forked",
                row.template
            )));
        };
        if layers.len() + 1 >= airlock_policy::MAX_LAYERS {
            return Err(DaemonError::Conflict(format!(
                "sandbox {id} runs on {} layers already: a snapshot of it would have more than {}",
                layers.len(),
                airlock_policy::MAX_LAYERS - 1
            )));
        }
        Ok((Source::Live(sandbox), row, layers))
    }

    /// The start configuration of the template sandbox `row` was made
    /// from, if it still has the layers `layers` starts with (the rest
    /// are what its files-only pauses froze), else none.
    pub(crate) fn start_config_of(
        &self,
        key: &KeyRow,
        row: &SandboxRow,
        layers: &[String],
    ) -> ImageConfig {
        match self.resolve_template_for(key, &row.template) {
            Ok(resolved) if layers.starts_with(&resolved.layers) => resolved.config,
            _ => ImageConfig::default(),
        }
    }

    /// Freezes what `source` changed of `layers` into one more layer (a
    /// live sandbox, made still for it, with `archive` written too), or
    /// takes its layers as they are (one paused keeping only its files:
    /// they are its state already, and it has no archive).
    async fn freeze_source<'a>(
        &'a self,
        source: &'a Source,
        archive: Option<(std::fs::File, i32)>,
    ) -> Result<FrozenLayer<'a>, DaemonError> {
        match source {
            Source::Live(sandbox) => {
                self.while_still(sandbox, |daemon, sandbox| {
                    daemon.freeze_layer(sandbox, archive)
                })
                .await
            }
            Source::Files(_) => Ok(FrozenLayer {
                layer: None,
                archived: None,
                _using: self.inner.layers_lock.read().await,
            }),
        }
    }

    /// Takes a snapshot of sandbox `id` for `key` (see the module doc).
    pub async fn snapshot(
        &self,
        key: &KeyRow,
        id: &str,
        request: SnapshotRequest,
        request_id: &str,
    ) -> Result<SnapshotRow, DaemonError> {
        if let Some(name) = &request.name {
            if !is_snapshot_name(name) {
                return Err(DaemonError::BadInput(format!(
                    "name: {name:?} is not a snapshot name (1 to 128 letters, digits and ._-, starting with a letter or digit, not snap-)"
                )));
            }
            if self.with_store(|s| s.get_template(name))?.is_some() {
                return Err(DaemonError::Conflict(format!(
                    "name: a template is named {name:?}; give the snapshot another name"
                )));
            }
        }
        let (source, row, layers) = self.layered(key, id)?;
        // Refused before the work when the key is at its quota already (the
        // store refuses again, counting this snapshot's bytes, at the end).
        let quota = self.config().snapshot_quota;
        let usage = self.with_store(|s| s.snapshot_usage(&key.id, request.name.as_deref()))?;
        if let Some(exceeded) = usage.exceeded_by(0, &quota) {
            return Err(DaemonError::QuotaExceeded(exceeded.to_string()));
        }
        // A name taken again keeps its snapshot's id: the store says which
        // id was recorded, and the archive is named after it.
        let snapshot_id = airlock_store::new_snapshot_id()?;
        let dir = self.archive_dir();
        std::fs::create_dir_all(&dir)
            .map_err(|e| DaemonError::Internal(format!("cannot make {}: {e}", dir.display())))?;
        let partial = dir.join(format!("{snapshot_id}.{}.partial", std::process::id()));
        let file = std::fs::File::create(&partial).map_err(|e| {
            DaemonError::Internal(format!("cannot write {}: {e}", partial.display()))
        })?;
        let level = self.config().snapshot_zstd_level;
        let started = Instant::now();
        let frozen = self
            .freeze_source(&source, Some((file, level)))
            .await
            .inspect_err(|_| {
                let _ = std::fs::remove_file(&partial);
            })?;
        let took_ms = started.elapsed().as_millis() as u64;
        let config = self.start_config_of(key, &row, &layers);
        let mut stack = layers;
        let (entries, bytes) = match &frozen.layer {
            Some(diff) => {
                stack.push(diff.diff_id.clone());
                (diff.entries, diff.bytes)
            }
            None => (0, 0),
        };
        let archived = frozen.archived.clone();
        let recorded = self.with_store(|s| {
            s.put_snapshot(
                &SnapshotRow {
                    id: snapshot_id.clone(),
                    name: request.name.clone(),
                    owner_key_id: key.id.clone(),
                    sandbox_id: id.to_owned(),
                    template: row.template.clone(),
                    tier: source.spec().tier.as_str().to_owned(),
                    config: serde_json::to_value(&config).unwrap_or_else(|_| json!({})),
                    layers: stack,
                    entries,
                    bytes,
                    tar_bytes: archived.as_ref().map_or(0, |a| a.tar_bytes),
                    archive_bytes: archived.as_ref().map_or(0, |a| a.archive_bytes),
                    archive_digest: archived.as_ref().map(|a| a.digest.clone()),
                    zstd_level: level,
                    took_ms,
                    created_at: 0,
                },
                Some(&quota),
            )
        });
        // A layer the store refused to record a snapshot of is the
        // collector's.
        drop(frozen);
        let recorded = match recorded {
            Ok(row) => row,
            Err(e) => {
                let _ = std::fs::remove_file(&partial);
                return Err(e.into());
            }
        };
        let archive = self.snapshot_archive(&recorded.id);
        if archived.is_some() {
            std::fs::rename(&partial, &archive).map_err(|e| {
                DaemonError::Internal(format!("cannot keep {}: {e}", archive.display()))
            })?;
        } else {
            let _ = std::fs::remove_file(&partial);
            // A name taken again: its earlier archive is not this one's.
            let _ = std::fs::remove_file(&archive);
        }
        self.inner.audit.record(
            Stream::Runtime,
            "sandbox.snapshot",
            Some(id),
            Some(request_id),
            json!({
                "snapshot_id": recorded.id,
                "name": recorded.name,
                "layers": recorded.layers.len(),
                "bytes": recorded.bytes,
                "tar_bytes": recorded.tar_bytes,
                "archive_bytes": recorded.archive_bytes,
                "archive_digest": recorded.archive_digest,
                "zstd_level": recorded.zstd_level,
                "took_ms": recorded.took_ms,
            }),
        );
        Ok(recorded)
    }

    /// The snapshot `id_or_name` (an e2b `:tag` suffix and `team/`
    /// namespace ignored) that `key` may use: its own first; any, by id,
    /// for an admin.
    pub fn find_snapshot(
        &self,
        key: &KeyRow,
        id_or_name: &str,
    ) -> Result<Option<SnapshotRow>, DaemonError> {
        let Some(bare) = bare_snapshot_name(id_or_name) else {
            return Ok(None);
        };
        let mine = self.with_store(|s| {
            s.snapshots(&SnapshotFilter {
                owner_key_id: Some(key.id.clone()),
                id_or_name: Some(bare.to_owned()),
                ..SnapshotFilter::default()
            })
        })?;
        if let Some(found) = mine.into_iter().next() {
            return Ok(Some(found));
        }
        if key.is_admin {
            return Ok(self.with_store(|s| s.get_snapshot(bare))?);
        }
        Ok(None)
    }

    /// The snapshots `key` may see (its own; an admin every one), of
    /// sandbox `sandbox_id` and by `name` (id or name) when given.
    pub fn snapshots(
        &self,
        key: &KeyRow,
        sandbox_id: Option<&str>,
        name: Option<&str>,
    ) -> Result<Vec<SnapshotRow>, DaemonError> {
        let name = match name.map(bare_snapshot_name) {
            None => None,
            Some(Some(bare)) => Some(bare.to_owned()),
            // A tag other than `default`: no snapshot has it.
            Some(None) => return Ok(Vec::new()),
        };
        Ok(self.with_store(|s| {
            s.snapshots(&SnapshotFilter {
                owner_key_id: (!key.is_admin).then(|| key.id.clone()),
                sandbox_id: sandbox_id.map(str::to_owned),
                id_or_name: name,
            })
        })?)
    }

    /// Deletes snapshot `id_or_name` of `key`'s (404 if there is none):
    /// its record and archive now, its layers at the next collection once
    /// nothing else uses them. Sandboxes created from it keep running.
    pub fn delete_snapshot(
        &self,
        key: &KeyRow,
        id_or_name: &str,
        request_id: &str,
    ) -> Result<SnapshotRow, DaemonError> {
        let Some(snapshot) = self.find_snapshot(key, id_or_name)? else {
            return Err(DaemonError::NotFound(format!(
                "there is no snapshot {id_or_name:?}"
            )));
        };
        match self.with_store(|s| s.delete_snapshot(&snapshot.id)) {
            Ok(()) | Err(airlock_store::StoreError::NotFound { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        let _ = std::fs::remove_file(self.snapshot_archive(&snapshot.id));
        self.inner.audit.record(
            Stream::Runtime,
            "snapshot.deleted",
            Some(&snapshot.sandbox_id),
            Some(request_id),
            json!({"snapshot_id": snapshot.id, "key_id": key.id}),
        );
        Ok(snapshot)
    }

    /// A create's template resolved for `key`: a template of the daemon's,
    /// else one of `key`'s snapshots by id or name.
    pub fn resolve_template_for(
        &self,
        key: &KeyRow,
        name: &str,
    ) -> Result<ResolvedTemplate, DaemonError> {
        match self.resolve_template(name) {
            Err(DaemonError::NotFound(message)) | Err(DaemonError::BadInput(message)) => {
                match self.find_snapshot(key, name)? {
                    Some(snapshot) => self.resolve_snapshot(&snapshot),
                    None if message.contains("is not a template name") => {
                        Err(DaemonError::BadInput(message))
                    }
                    None => Err(DaemonError::NotFound(message)),
                }
            }
            other => other,
        }
    }

    /// What a create from `snapshot` runs on.
    fn resolve_snapshot(&self, snapshot: &SnapshotRow) -> Result<ResolvedTemplate, DaemonError> {
        let paths = self.layer_paths(&format!("snapshot {}", snapshot.id), &snapshot.layers)?;
        Ok(ResolvedTemplate {
            template: Template::Layers { layers: paths },
            layers: snapshot.layers.clone(),
            config: serde_json::from_value(snapshot.config.clone()).unwrap_or_default(),
            tier: snapshot.tier.parse().ok(),
        })
    }

    /// Forks sandbox `id` for `key` into `request.count` children (see the
    /// module doc). The outer error is the fork's (nothing was created);
    /// each inner one is one child's.
    pub async fn fork(
        &self,
        key: &KeyRow,
        id: &str,
        request: ForkRequest,
        request_id: &str,
    ) -> Result<Vec<Result<Created, DaemonError>>, DaemonError> {
        if !(1..=MAX_FORKS).contains(&request.count) {
            return Err(DaemonError::BadInput(format!(
                "count: must be between 1 and {MAX_FORKS}"
            )));
        }
        let max = self.config().max_timeout.as_millis() as u64;
        if request.timeout_ms == 0 || request.timeout_ms > max {
            return Err(DaemonError::BadInput(format!(
                "timeout: must be between 1 and {} s",
                max / 1000
            )));
        }
        let (source, row, layers) = self.layered(key, id)?;
        let started = Instant::now();
        let frozen = self.freeze_source(&source, None).await?;
        let mut stack = layers.clone();
        // Held while the children are created, then dropped: they hold it.
        let holder = match &frozen.layer {
            Some(diff) => {
                stack.push(diff.diff_id.clone());
                let holder = airlock_store::new_snapshot_id()?;
                self.with_store(|s| {
                    s.put_snapshot(
                        &SnapshotRow {
                            id: holder.clone(),
                            name: None,
                            owner_key_id: key.id.clone(),
                            sandbox_id: id.to_owned(),
                            template: row.template.clone(),
                            tier: source.spec().tier.as_str().to_owned(),
                            config: json!({}),
                            layers: stack.clone(),
                            entries: diff.entries,
                            bytes: diff.bytes,
                            tar_bytes: 0,
                            archive_bytes: 0,
                            archive_digest: None,
                            zstd_level: 0,
                            took_ms: 0,
                            created_at: 0,
                        },
                        None,
                    )
                })?;
                Some(holder)
            }
            None => None,
        };
        drop(frozen);
        let froze_ms = started.elapsed().as_millis() as u64;
        let children = match self.layer_paths(&format!("the fork of {id}"), &stack) {
            Ok(paths) => {
                let config = self.start_config_of(key, &row, &layers);
                let mut spec = source.spec().clone();
                spec.template = Template::Layers { layers: paths };
                spec.timeout_ms = request.timeout_ms;
                let creates = (0..request.count).map(|_| {
                    let request = NewSandboxRequest {
                        spec: spec.clone(),
                        template_name: row.template.clone(),
                        metadata: row.metadata.clone(),
                        layers: stack.clone(),
                    };
                    let startup = crate::startup::Startup::of(&config);
                    self.create_started(key, request, startup, request_id)
                });
                futures_util::future::join_all(creates).await
            }
            Err(e) => vec![Err(e)],
        };
        if let Some(holder) = holder {
            let _ = self.with_store(|s| s.delete_snapshot(&holder));
        }
        let made: Vec<&str> = children
            .iter()
            .filter_map(|c| c.as_ref().ok().map(|c| c.row.id.as_str()))
            .collect();
        self.inner.audit.record(
            Stream::Runtime,
            "sandbox.forked",
            Some(id),
            Some(request_id),
            json!({
                "count": request.count,
                "children": made,
                "failed": children.len() - made.len(),
                "froze_ms": froze_ms,
            }),
        );
        Ok(children)
    }

    /// Removes archives no snapshot records (and partial ones older than
    /// an hour); how many.
    pub(crate) fn sweep_archives(&self) -> usize {
        let Ok(recorded) = self.with_store(|s| s.snapshot_ids()) else {
            return 0;
        };
        let recorded: std::collections::HashSet<String> = recorded.into_iter().collect();
        let mut removed = 0;
        for stray in self.stray_archives(&recorded) {
            if std::fs::remove_file(&stray).is_ok() {
                removed += 1;
            }
        }
        removed
    }

    /// Files of the archive directory no snapshot in `recorded` owns:
    /// finished archives of no record, partial ones older than
    /// [`PARTIAL_GRACE`] (younger ones are being written).
    pub(crate) fn stray_archives(
        &self,
        recorded: &std::collections::HashSet<String>,
    ) -> Vec<PathBuf> {
        let Ok(entries) = std::fs::read_dir(self.archive_dir()) else {
            return Vec::new();
        };
        entries
            .filter_map(Result::ok)
            .filter(|entry| {
                let name = entry.file_name();
                let name = name.to_string_lossy();
                match name.strip_suffix(".tar.zst") {
                    Some(id) => !recorded.contains(id),
                    None => entry
                        .metadata()
                        .and_then(|m| m.modified())
                        .ok()
                        .and_then(|t| t.elapsed().ok())
                        .is_none_or(|age| age > PARTIAL_GRACE),
                }
            })
            .map(|entry| entry.path())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_names_are_not_ids_and_stay_simple() {
        for good in ["a", "my-snapshot", "v1.2_x", &"a".repeat(128)] {
            assert!(is_snapshot_name(good), "{good}");
        }
        for bad in [
            "",
            "-a",
            ".a",
            "snap-0011",
            "a/b",
            "a:b",
            "a b",
            &"a".repeat(129),
        ] {
            assert!(!is_snapshot_name(bad), "{bad}");
        }
    }

    #[test]
    fn e2b_spellings_of_a_snapshot_are_bare_but_other_tags_match_none() {
        assert_eq!(bare_snapshot_name("snap-1"), Some("snap-1"));
        assert_eq!(bare_snapshot_name("mine:default"), Some("mine"));
        assert_eq!(bare_snapshot_name("team/mine:default"), Some("mine"));
        assert_eq!(bare_snapshot_name("mine:v2"), None);
    }

    #[test]
    fn only_a_stack_of_store_layers_has_layers() {
        let mut spec = SandboxSpec::default();
        assert_eq!(spec_layers(&spec), None);
        let hex = "ab".repeat(32);
        spec.template = Template::Layers {
            layers: vec![PathBuf::from(format!("/d/layers/sha256/{hex}"))],
        };
        assert_eq!(spec_layers(&spec), Some(vec![format!("sha256:{hex}")]));
        spec.template = Template::Layers {
            layers: vec![PathBuf::from("/d/layers/sha256/nothex")],
        };
        assert_eq!(spec_layers(&spec), None);
    }
}
