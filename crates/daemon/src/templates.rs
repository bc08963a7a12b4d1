//! Templates: named stacks of layers in the layer store
//! (`<data-dir>/layers`), what a create's `"template": NAME` resolves to,
//! and the collector that removes what nothing references.
//!
//! - `host` is the host's own /usr (no layers); it is always there.
//! - A template imported (or, later, pulled or built) is a row of the
//!   store naming its layers by `diff_id`; `NAME@sha256:<hex>` pins the
//!   digest of its image configuration.
//! - A directory `<data-dir>/templates/NAME` prepared by hand is a template
//!   of one layer (the first way airlock had; it stays).
//!
//! A sandbox records the layers it runs on at create, so removing its
//! template while it runs leaves them in place; the collector removes a
//! layer once no template stacks it and no sandbox that is not dead runs
//! on it, and sweeps what the store holds but no record names (the
//! half-unpacked layers of an import killed half-way).

use crate::{Daemon, DaemonError};
use airlock_layers::bootstrap::{BootstrapError, BootstrapProgress, Recipe};
use airlock_layers::{ImageConfig, ImportProgress, ImportedImage, LayerStore};
use airlock_policy::{SandboxSpec, Template, Tier};
use airlock_registry::{ImageRef, PullError, PullLimits, PullProgress};
use airlock_store::{NewTemplate, TemplateRow};
use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

/// The name that is the host's own system.
pub const HOST: &str = "host";
/// The default template of e2b's SDKs: `host` until one is stored.
pub const BASE: &str = "base";

/// What a template name gives a create.
#[derive(Debug, Clone)]
pub struct ResolvedTemplate {
    /// The root filesystem.
    pub template: Template,
    /// The layers (by diff_id) the sandbox runs on, to record.
    pub layers: Vec<String>,
    /// How its processes start by default.
    pub config: ImageConfig,
    /// The tier its sandboxes run on when a create names none, if the
    /// template has one of its own.
    pub tier: Option<Tier>,
}

/// The tier `row` records, if any (one this daemon cannot name, written
/// by a newer airlock, counts as none).
pub fn recorded_tier(row: &TemplateRow) -> Option<Tier> {
    let name = row.tier.as_deref()?;
    match name.parse() {
        Ok(tier) => Some(tier),
        Err(e) => {
            tracing::warn!(template = %row.name, "ignoring the template's tier: {e}");
            None
        }
    }
}

/// What [`Daemon::collect_garbage`] removed.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Collected {
    /// Layers no template or live sandbox referenced.
    pub layers: Vec<String>,
    /// Abandoned entries of the store's staging area (imports killed
    /// half-way).
    pub abandoned: usize,
    /// Entries under the store's layers that no record named.
    pub strays: usize,
    /// Build cache entries evicted (unused for longer than the cache's
    /// lifetime, or all on request), whose layers could then go.
    pub build_steps: usize,
    /// Snapshot archives no snapshot recorded (a crash between writing
    /// and recording one).
    pub archives: usize,
}

/// Whether `name` may name a template: 1 to 128 of letters, digits and
/// `._-:`, not starting with `.` or `-`, no `..`.
pub fn is_template_name(name: &str) -> bool {
    (1..=128).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-:".contains(&b))
        && !name.starts_with(['.', '-'])
        && !name.contains("..")
        && !name.contains('@')
}

/// A template being built; the mark goes with it.
pub(crate) struct Building {
    daemon: Daemon,
    name: String,
}

impl Drop for Building {
    fn drop(&mut self) {
        self.daemon
            .inner
            .building
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.name);
    }
}

/// Refuses a name a new template cannot have.
pub fn check_new_template_name(name: &str) -> Result<(), DaemonError> {
    if name == HOST || !is_template_name(name) {
        return Err(DaemonError::BadInput(format!(
            "{name:?} cannot name a template: use 1 to 128 letters, digits and ._-: (not `host`)"
        )));
    }
    Ok(())
}

/// The daemon's error for a failed pull.
pub(crate) fn pull_error(error: PullError) -> DaemonError {
    let message = airlock_backend::error_chain(&error);
    match error {
        PullError::NoRegistries | PullError::NotAllowed { .. } | PullError::Signature(_) => {
            DaemonError::Forbidden(message)
        }
        PullError::NotFound { .. } => DaemonError::NotFound(message),
        PullError::TooLarge { .. } => DaemonError::TooLarge(message),
        PullError::Unreachable { .. }
        | PullError::Unauthorized { .. }
        | PullError::Registry { .. }
        | PullError::Transfer { .. } => DaemonError::Upstream(message),
        PullError::BadImage { .. } | PullError::DigestMismatch { .. } | PullError::Layer { .. } => {
            DaemonError::BadInput(message)
        }
        PullError::Store(_) => DaemonError::Internal(message),
    }
}

impl Daemon {
    /// The layer store.
    pub fn layer_store(&self) -> Result<LayerStore, DaemonError> {
        LayerStore::open(self.config().data_dir.join("layers"))
            .map_err(|e| DaemonError::Internal(format!("cannot open the layer store: {e}")))
    }

    /// Resolves a create's template name (see the module doc).
    pub fn resolve_template(&self, name: &str) -> Result<ResolvedTemplate, DaemonError> {
        if name == HOST {
            return Ok(ResolvedTemplate {
                template: Template::Host,
                layers: Vec::new(),
                config: ImageConfig::default(),
                tier: None,
            });
        }
        let (bare, pin) = match name.split_once('@') {
            Some((bare, pin)) => (bare, Some(pin)),
            None => (name, None),
        };
        let missing = || DaemonError::NotFound(format!("there is no template named {name:?}"));
        if !is_template_name(bare) || pin.is_some_and(|p| !airlock_layers::is_sha256_digest(p)) {
            return Err(DaemonError::BadInput(format!(
                "template: {name:?} is not a template name (letters, digits and ._-:, optionally @sha256:<digest>)"
            )));
        }
        if let Some(row) = self.with_store(|s| s.get_template(bare))? {
            if pin.is_some_and(|pin| pin != row.digest) {
                return Err(DaemonError::NotFound(format!(
                    "template {bare:?} is {}, not {}",
                    row.digest,
                    pin.unwrap_or_default()
                )));
            }
            let paths = self.layer_paths(&format!("template {:?}", row.name), &row.layers)?;
            let config = serde_json::from_value(row.config.clone()).unwrap_or_default();
            return Ok(ResolvedTemplate {
                template: Template::Layers { layers: paths },
                tier: recorded_tier(&row),
                layers: row.layers,
                config,
            });
        }
        let dir = self.config().data_dir.join("templates").join(bare);
        if pin.is_none() && !bare.contains(':') && dir.is_dir() {
            return Ok(ResolvedTemplate {
                template: Template::Dir { path: dir },
                layers: Vec::new(),
                config: ImageConfig::default(),
                tier: None,
            });
        }
        if bare == BASE && pin.is_none() {
            // Until a `base` template exists, `base` is the host's system.
            return self.resolve_template(HOST);
        }
        Err(missing())
    }

    /// Applies a template's start configuration beneath a spec: its
    /// environment under the spec's own, its working directory when the
    /// spec names none.
    pub fn apply_template_config(spec: &mut SandboxSpec, config: &ImageConfig) {
        for entry in &config.env {
            if let Some((key, value)) = entry.split_once('=') {
                if !key.is_empty() && !spec.env.contains_key(key) {
                    spec.env.insert(key.to_owned(), value.to_owned());
                }
            }
        }
        if spec.cwd.is_none() {
            if let Some(dir) = config.workdir.as_ref().filter(|d| d.starts_with('/')) {
                spec.cwd = Some(dir.clone());
            }
        }
    }

    /// Sets (with `None`, clears) the tier template `name`'s sandboxes run
    /// on when a create names none. The tier need not be available here:
    /// a create then answers with the tier's probe sentence.
    pub fn set_template_tier(&self, name: &str, tier: Option<Tier>) -> Result<(), DaemonError> {
        match self.with_store(|s| s.set_template_tier(name, tier.map(Tier::as_str))) {
            Ok(()) => Ok(()),
            Err(airlock_store::StoreError::NotFound { .. }) => Err(DaemonError::NotFound(format!(
                "there is no template named {name:?} (the built-in ones take `serve --template-tier`)"
            ))),
            Err(e) => Err(e.into()),
        }
    }

    /// Every template (the host one is not listed).
    pub fn templates(&self) -> Result<Vec<TemplateRow>, DaemonError> {
        Ok(self.with_store(|s| s.templates())?)
    }

    /// The template `name`.
    pub fn template(&self, name: &str) -> Result<TemplateRow, DaemonError> {
        self.with_store(|s| s.get_template(name))?
            .ok_or_else(|| DaemonError::NotFound(format!("there is no template named {name:?}")))
    }

    /// The software bill of materials of template `name`: a CycloneDX
    /// document of the packages its layers hold (see
    /// [`airlock_layers::sbom`]), derived from the layers on each call (the
    /// same layers give the same bytes). Blocking.
    pub fn template_sbom(&self, name: &str) -> Result<Vec<u8>, DaemonError> {
        let row = self.template(name)?;
        let paths = self.layer_paths(&format!("template {:?}", row.name), &row.layers)?;
        let subject = airlock_layers::sbom::Subject {
            name: row.name.clone(),
            digest: row.digest.clone(),
            layers: row.layers.clone(),
        };
        let document = airlock_layers::sbom::sbom(&paths, &subject).map_err(|e| {
            DaemonError::Internal(format!(
                "the SBOM of {name}: {}",
                airlock_backend::error_chain(&e)
            ))
        })?;
        document
            .to_json()
            .map_err(|e| DaemonError::Internal(format!("cannot encode an SBOM: {e}")))
    }

    /// Removes the template `name`; its layers go at the next collection
    /// once nothing else references them.
    pub fn delete_template(&self, name: &str) -> Result<(), DaemonError> {
        if name == HOST {
            return Err(DaemonError::Conflict(
                "the host template is built in and cannot be removed".into(),
            ));
        }
        match self.with_store(|s| s.delete_template(name)) {
            Ok(()) => Ok(()),
            Err(airlock_store::StoreError::NotFound { .. }) => Err(DaemonError::NotFound(format!(
                "there is no template named {name:?}"
            ))),
            Err(e) => Err(e.into()),
        }
    }

    /// Imports the image in the archive at `archive` (docker-save or OCI
    /// layout) as template `name`, replacing one of that name. Blocking:
    /// call it from a blocking thread.
    pub fn import_template(
        &self,
        name: &str,
        archive: &Path,
        image: Option<&str>,
        progress: &mut dyn FnMut(ImportProgress),
    ) -> Result<TemplateRow, DaemonError> {
        check_new_template_name(name)?;
        let store = self.layer_store()?;
        // Shared with other imports and creates, exclusive of a collection:
        // between committing a layer to the store and recording it, the
        // collector must not take it for a stray.
        let _using = self.inner.layers_lock.blocking_read();
        let recorded = self.recorded_layers()?;
        let imported = airlock_layers::import(
            archive,
            image,
            &store,
            &|diff_id| recorded.contains(diff_id),
            &airlock_layers::unpack::UnpackLimits::default(),
            progress,
        )
        .map_err(|e| match e {
            airlock_layers::ImportError::Read(_) | airlock_layers::ImportError::Store(_) => {
                DaemonError::Internal(format!(
                    "importing {name}: {}",
                    airlock_backend::error_chain(&e)
                ))
            }
            other => DaemonError::BadInput(airlock_backend::error_chain(&other)),
        })?;
        let source = match imported.tags.as_slice() {
            [] => "archive".to_owned(),
            tags => format!("archive ({})", tags.join(", ")),
        };
        self.record_image(name, &imported, source)
    }

    /// Builds a Debian system from the host's apt sources (mmdebstrap) as
    /// template `name`: `packages` beyond the essential ones, the `base`
    /// template's ([`airlock_layers::bootstrap::BASE_PACKAGES`]) when
    /// `None`. One build of a name at a time. Blocking (minutes).
    pub fn bootstrap_template(
        &self,
        name: &str,
        packages: Option<Vec<String>>,
        progress: &mut dyn FnMut(BootstrapProgress),
    ) -> Result<TemplateRow, DaemonError> {
        check_new_template_name(name)?;
        let mut recipe = Recipe::default();
        if let Some(packages) = packages {
            recipe.packages = packages;
        }
        let _building = self.start_building(name)?;
        let store = self.layer_store()?;
        let _using = self.inner.layers_lock.blocking_read();
        let image = airlock_layers::bootstrap::bootstrap(
            &recipe,
            &store,
            &airlock_layers::unpack::UnpackLimits::default(),
            progress,
        )
        .map_err(|e| {
            let message = airlock_backend::error_chain(&e);
            match e {
                BootstrapError::BadName(_) | BootstrapError::TooManyPackages => {
                    DaemonError::BadInput(message)
                }
                BootstrapError::NotInstalled
                | BootstrapError::NoSuite
                | BootstrapError::NoSources => DaemonError::Conflict(message),
                BootstrapError::Failed { .. } => DaemonError::Upstream(message),
                BootstrapError::Spawn(_) | BootstrapError::Layer(_) | BootstrapError::Store(_) => {
                    DaemonError::Internal(message)
                }
            }
        })?;
        let source = format!("bootstrap {}", image.tags.join(", "));
        self.record_image(name, &image, source)
    }

    /// Marks `name` as being built until the guard goes; 409 if it is.
    pub(crate) fn start_building(&self, name: &str) -> Result<Building, DaemonError> {
        let mut building = self
            .inner
            .building
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if !building.insert(name.to_owned()) {
            return Err(DaemonError::Conflict(format!(
                "template {name:?} is being built already"
            )));
        }
        Ok(Building {
            daemon: self.clone(),
            name: name.to_owned(),
        })
    }

    /// Pulls `image` (a reference that names its registry) as template
    /// `name`, replacing one of that name.
    pub async fn pull_template(
        &self,
        name: &str,
        image: &str,
        progress: Arc<dyn Fn(PullProgress) + Send + Sync>,
    ) -> Result<TemplateRow, DaemonError> {
        // Refused before anything is locked or staged.
        let reference = self.check_pull(name, image)?;
        let registries = self.config().registries.clone();
        let store = self.layer_store()?;
        // As for an import: no collection between committing a layer and
        // recording it.
        let _using = self.inner.layers_lock.read().await;
        let recorded = self.recorded_layers()?;
        let limits = PullLimits {
            max_image_bytes: self.config().max_image_bytes,
            layer: airlock_layers::unpack::UnpackLimits::default(),
        };
        let pulled = registries
            .pull(
                &reference,
                &store,
                &|diff_id| recorded.contains(diff_id),
                limits,
                progress,
            )
            .await
            .map_err(pull_error)?;
        let source = format!("registry {reference} ({})", pulled.manifest_digest);
        self.record_image(name, &pulled.image, source)
    }

    /// The reference a pull of `image` as template `name` would fetch:
    /// `400` for a bad name or reference, `403` for a registry this daemon
    /// does not pull from.
    pub fn check_pull(&self, name: &str, image: &str) -> Result<ImageRef, DaemonError> {
        check_new_template_name(name)?;
        let reference: ImageRef = image
            .parse()
            .map_err(|e: airlock_registry::ReferenceError| DaemonError::BadInput(e.to_string()))?;
        self.config()
            .registries
            .check_allowed(&reference)
            .map_err(pull_error)?;
        Ok(reference)
    }

    /// The directories of `layers` in the layer store, bottom first;
    /// `whose` (what names them, e.g. `template "base"`) is for the error
    /// when one is missing.
    pub(crate) fn layer_paths(
        &self,
        whose: &str,
        layers: &[String],
    ) -> Result<Vec<std::path::PathBuf>, DaemonError> {
        let store = self.layer_store()?;
        layers
            .iter()
            .map(|diff_id| match store.path_of(diff_id) {
                Some(path) if path.is_dir() => Ok(path),
                _ => Err(DaemonError::Internal(format!(
                    "{whose} names layer {diff_id}, which is not in the store"
                ))),
            })
            .collect()
    }

    fn recorded_layers(&self) -> Result<HashSet<String>, DaemonError> {
        Ok(self
            .with_store(|s| s.layers())?
            .into_iter()
            .map(|l| l.diff_id)
            .collect())
    }

    /// Records an image whose layers are in the store as template `name`.
    fn record_image(
        &self,
        name: &str,
        image: &ImportedImage,
        source: String,
    ) -> Result<TemplateRow, DaemonError> {
        let config = serde_json::to_value(&image.config)
            .map_err(|e| DaemonError::Internal(format!("cannot encode an image config: {e}")))?;
        let layers: Vec<String> = image.layers.iter().map(|l| l.diff_id.clone()).collect();
        self.with_store(|s| {
            for layer in &image.layers {
                let (bytes, entries) = layer
                    .unpacked
                    .as_ref()
                    .map_or((0, 0), |u| (u.bytes, u.entries));
                s.record_layer(&layer.diff_id, bytes, entries)?;
            }
            s.put_template(&NewTemplate {
                name: name.to_owned(),
                digest: image.digest.clone(),
                source,
                config,
                layers,
            })
        })
        .map_err(DaemonError::from)
    }

    /// Removes every layer nothing references, and whatever the layer
    /// store holds that no record names, after evicting the build cache's
    /// stale entries, and snapshot archives no snapshot records. Blocking.
    pub fn collect_garbage(&self) -> Result<Collected, DaemonError> {
        self.collect_garbage_with(false)
    }

    /// [`Daemon::collect_garbage`], evicting the whole build cache when
    /// `whole_build_cache`.
    pub fn collect_garbage_with(&self, whole_build_cache: bool) -> Result<Collected, DaemonError> {
        let store = self.layer_store()?;
        let _collecting = self.inner.layers_lock.blocking_write();
        let mut collected = Collected::default();
        let before = if whole_build_cache {
            i64::MAX
        } else {
            crate::audit::now_ms().saturating_sub(self.config().build_cache_ttl.as_millis() as i64)
        };
        collected.build_steps = self.with_store(|s| s.evict_build_steps(before))?;
        let swept = store
            .sweep()
            .map_err(|e| DaemonError::Internal(format!("sweeping the layer store: {e}")))?;
        collected.abandoned = swept.abandoned;
        collected.archives = self.sweep_archives();
        collected.strays = swept.strays;
        for diff_id in self.with_store(|s| s.unreferenced_layers())? {
            // The record goes first only if still unreferenced (a create
            // may have taken the layer meanwhile), then the files.
            if self.with_store(|s| s.forget_layer(&diff_id))? {
                store
                    .remove(&diff_id)
                    .map_err(|e| DaemonError::Internal(format!("removing {diff_id}: {e}")))?;
                collected.layers.push(diff_id);
            }
        }
        // Layers on disk that no record names (a crash between unpacking
        // and recording).
        let recorded = self.recorded_layers()?;
        let on_disk = store
            .layers()
            .map_err(|e| DaemonError::Internal(format!("listing the layer store: {e}")))?;
        for diff_id in on_disk {
            if !recorded.contains(&diff_id) {
                store
                    .remove(&diff_id)
                    .map_err(|e| DaemonError::Internal(format!("removing {diff_id}: {e}")))?;
                collected.strays += 1;
            }
        }
        Ok(collected)
    }

    /// Entries of the layer store that no record names and no process is
    /// working on: layers on disk the store does not record, abandoned
    /// staging entries. 0 unless something leaked (a metric; tests check it
    /// after every run).
    pub fn unowned_store_entries(&self) -> usize {
        let Ok(store) = self.layer_store() else {
            return 0;
        };
        // Not while an import is between committing and recording a layer.
        let Ok(_quiet) = self.inner.layers_lock.try_write() else {
            return 0;
        };
        let Ok(recorded) = self.with_store(|s| s.layers()) else {
            return 0;
        };
        let recorded: HashSet<String> = recorded.into_iter().map(|l| l.diff_id).collect();
        let unrecorded = store.layers().map_or(0, |layers| {
            layers.iter().filter(|l| !recorded.contains(*l)).count()
        });
        let snapshots: HashSet<String> = self
            .with_store(|s| s.snapshot_ids())
            .unwrap_or_default()
            .into_iter()
            .collect();
        let archives = self.stray_archives(&snapshots).len();
        unrecorded + store.abandoned().unwrap_or(0) + archives
    }

    /// Collects now and then every `every`, for the daemon's life.
    pub async fn run_collector(self, every: std::time::Duration) {
        loop {
            let daemon = self.clone();
            match tokio::task::spawn_blocking(move || daemon.collect_garbage()).await {
                Ok(Ok(collected)) if collected != Collected::default() => tracing::info!(
                    layers = collected.layers.len(),
                    build_steps = collected.build_steps,
                    abandoned = collected.abandoned,
                    strays = collected.strays,
                    "collected the layer store"
                ),
                Ok(Ok(_)) => {}
                Ok(Err(e)) => tracing::warn!("collecting the layer store: {e}"),
                Err(e) => tracing::error!("the layer collector failed: {e}"),
            }
            match self.sweep_outputs().await {
                Ok(0) => {}
                Ok(removed) => tracing::info!(removed, "swept outputs past their TTL"),
                Err(e) => tracing::warn!("{e}"),
            }
            tokio::time::sleep(every).await;
        }
    }
}
