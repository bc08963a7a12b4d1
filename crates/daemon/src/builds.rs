//! Template builds: a [`BuildSpec`] (from a Dockerfile or the e2b Template
//! SDK) run step by step into a template of the layer store.
//!
//! Each RUN runs in a sandbox of the build so far (the base's layers and
//! the layers of the steps before it), under the operator's build network
//! policy; each COPY unpacks the build context's files into such a
//! sandbox. The sandbox's writable layer is then frozen into a layer
//! (`airlock_layers::snapshot`), unpacked into the store like a pulled one,
//! and cached under the step's key (`airlock_build::cache`): a later build
//! whose step has the same key takes the layer instead of running the step.
//! ENV, WORKDIR and USER change only the configuration later steps run with
//! and the template records.

use crate::{Daemon, DaemonError};
use airlock_build::BuildSpec;
use airlock_store::{KeyRow, TemplateRow};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

/// A build to run.
#[derive(Debug, Clone)]
pub struct BuildRequest {
    /// The template it makes (replacing one of that name once it is done).
    pub name: String,
    /// What to build; checked again here.
    pub spec: BuildSpec,
    /// The build context COPY sources are relative to (a directory the
    /// daemon reads beneath, see `airlock_build::context`); `None`
    /// refuses every COPY that has no context of its own.
    pub context: Option<PathBuf>,
    /// Contexts of single COPY steps (by index into `spec.steps`), in
    /// place of `context` (e2b uploads one archive per COPY).
    pub step_contexts: BTreeMap<usize, PathBuf>,
    /// Run every step, even one whose key the cache holds.
    pub no_cache: bool,
    /// The command every sandbox of the template starts in the background
    /// and the one that says it is ready (recorded in the template's
    /// configuration; see `airlock_layers::ImageConfig::start_cmd`).
    pub start_cmd: Option<String>,
    pub ready_cmd: Option<String>,
    /// What the template's `source` says it came from ("dockerfile",
    /// "e2b").
    pub source: String,
}

/// What a running build reports.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum BuildEvent {
    /// The base is ready: its name or reference and its digest.
    Base { base: String, digest: String },
    /// Step `index` (from 1) of `total` starts; `instruction` says what it
    /// does in Dockerfile form. `cached`: its layer is taken from the
    /// cache and nothing runs.
    Step {
        index: usize,
        total: usize,
        instruction: String,
        cached: bool,
    },
    /// Output of step `index`'s command (`stream`: `stdout` or `stderr`),
    /// as it comes, lossily decoded.
    Output {
        index: usize,
        stream: &'static str,
        text: String,
    },
    /// Step `index` made a layer (`diff_id`, bytes of files) in `ms`; a step
    /// that changed no file makes none.
    Layer {
        index: usize,
        diff_id: String,
        bytes: u64,
        ms: u64,
    },
}

/// Where a build reports; called from any thread.
pub type BuildEvents = Arc<dyn Fn(BuildEvent) + Send + Sync>;

/// A directory of the layer store's staging area that a build context is
/// unpacked into; removed when dropped (and by the collector if its
/// owner died).
pub struct ContextDir {
    staging: airlock_layers::store::Staging,
}

impl ContextDir {
    /// The directory.
    pub fn path(&self) -> &std::path::Path {
        self.staging.path()
    }
}

impl Daemon {
    /// A new, empty build context directory.
    pub fn stage_build_context(&self) -> Result<ContextDir, DaemonError> {
        let staging = self
            .layer_store()?
            .stage()
            .map_err(|e| DaemonError::Internal(format!("cannot stage a build context: {e}")))?;
        Ok(ContextDir { staging })
    }

    /// Unpacks the tar stream `archive` (plain, gzip or zstd) into the
    /// empty context directory `dir`, refusing hostile entries as a layer's
    /// are refused, at most `max_bytes` of files. Blocking.
    pub fn unpack_build_context(
        &self,
        dir: &ContextDir,
        archive: impl std::io::Read,
        max_bytes: u64,
    ) -> Result<(), DaemonError> {
        let limits = airlock_layers::unpack::UnpackLimits {
            max_bytes,
            max_entries: airlock_build::context::MAX_ENTRIES as u64,
        };
        airlock_layers::unpack::unpack_layer(archive, dir.path(), &limits)
            .map(|_| ())
            .map_err(|e| {
                DaemonError::BadInput(format!(
                    "the build context: {}",
                    airlock_backend::error_chain(&e)
                ))
            })
    }

    /// Runs the build `request` for `owner` (whose sandboxes its steps
    /// run in), reporting to `events`, and records the template.
    pub async fn build_template(
        &self,
        owner: &KeyRow,
        request: BuildRequest,
        events: BuildEvents,
    ) -> Result<TemplateRow, DaemonError> {
        let _ = (owner, request, events);
        Err(DaemonError::Conflict("builds are not wired yet".into()))
    }
}
