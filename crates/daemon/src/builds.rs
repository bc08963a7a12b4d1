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

use crate::exec::Output;
use crate::processes::ExecRequest;
use crate::sandboxes::NewSandboxRequest;
use crate::templates::check_new_template_name;
use crate::{Daemon, DaemonError};
use airlock_build::cache::{base_key, step_key, StepInputs};
use airlock_build::context::{Context, PackOptions, SourcesDigest};
use airlock_build::{Base, BuildSpec, Command, RunConfig, Step};
use airlock_core::DeadReason;
use airlock_layers::ImageConfig;
use airlock_policy::{LayerBacking, Limits, RunAs, SandboxSpec, Template};
use airlock_protocol::Request;
use airlock_store::{CachedStep, KeyRow, NewTemplate, TemplateRow};
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// The most output of a failed step its error shows (the end of it).
const ERROR_TAIL: usize = 4096;
/// Memory and writable-layer size of a step's sandbox, at most (less when
/// the machine or the disk store has less).
const STEP_MEMORY: u64 = 2 << 30;
const STEP_DISK: u64 = 10 << 30;

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
    /// The Dockerfile `spec` was read from, if it was: read again over the
    /// base's configuration once the base is known (its `$PATH`, working
    /// directory and user change what the steps say), replacing `spec`.
    pub dockerfile: Option<DockerfileSource>,
    /// The command every sandbox of the template starts in the background
    /// and the one that says it is ready (recorded in the template's
    /// configuration; see `airlock_layers::ImageConfig::start_cmd`).
    pub start_cmd: Option<String>,
    pub ready_cmd: Option<String>,
    /// What the template's `source` says it came from ("dockerfile",
    /// "e2b").
    pub source: String,
}

/// A Dockerfile to read over the base's configuration.
#[derive(Debug, Clone)]
pub struct DockerfileSource {
    /// Its name, for errors.
    pub name: String,
    pub text: String,
    /// The build arguments.
    pub args: BTreeMap<String, String>,
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
    /// run in, counted by admission like any), reporting to `events`, and
    /// records the template. One build of a name at a time.
    pub async fn build_template(
        &self,
        owner: &KeyRow,
        request: BuildRequest,
        events: BuildEvents,
    ) -> Result<TemplateRow, DaemonError> {
        check_new_template_name(&request.name)?;
        request
            .spec
            .validate()
            .map_err(|e| DaemonError::BadInput(e.to_string()))?;
        if self.config().disk_store.is_none() {
            return Err(DaemonError::Conflict(
                "template builds need writable layers on disk (airlock serve --writable-layers disk)"
                    .into(),
            ));
        }
        let _building = self.start_building(&request.name)?;
        let base = self.build_base(&request.spec.from, &events).await?;
        let config = RunConfig::of_base(
            &base.config.env,
            base.config.workdir.as_deref(),
            base.config.user.as_deref(),
        );
        // A Dockerfile's values depend on the base's configuration (`ENV
        // PATH=/x:$PATH`, a relative WORKDIR): read again over it.
        let mut request = request;
        if let Some(dockerfile) = &request.dockerfile {
            let parsed =
                airlock_build::dockerfile::parse_over(&dockerfile.text, &dockerfile.args, &config)
                    .map_err(|e| DaemonError::BadInput(format!("{}: {e}", dockerfile.name)))?;
            if parsed.spec.from != request.spec.from {
                return Err(DaemonError::Internal(
                    "the Dockerfile names another base when read again".into(),
                ));
            }
            request.spec = parsed.spec;
        }
        let request = request;
        let mut run = Build {
            daemon: self,
            owner,
            request: &request,
            events: &events,
            layers: base.layers,
            config,
            parent: base_key(&base.digest),
        };
        let total = request.spec.steps.len();
        for (index, step) in request.spec.steps.iter().enumerate() {
            run.step(index, total, step).await?;
        }
        let Build { layers, config, .. } = run;
        self.record_build(&request, &base.config, layers, &config)
    }

    /// The layers, configuration and digest a build starts from.
    async fn build_base(
        &self,
        from: &Base,
        events: &BuildEvents,
    ) -> Result<BuildBase, DaemonError> {
        let base = match from {
            Base::Template { name } => {
                let resolved = self.resolve_template(name)?;
                if !matches!(resolved.template, Template::Layers { .. }) {
                    return Err(DaemonError::BadInput(format!(
                        "cannot build on template {name:?}: it is not made of layers (build on an imported, pulled, built or bootstrapped template, such as `base`)"
                    )));
                }
                let bare = name.split('@').next().unwrap_or(name);
                let digest = self.template(bare)?.digest;
                events(BuildEvent::Base {
                    base: name.clone(),
                    digest: digest.clone(),
                });
                BuildBase {
                    layers: resolved.layers,
                    config: resolved.config,
                    digest,
                }
            }
            Base::Image { reference } => self.pull_base(reference, events).await?,
            Base::Scratch {} => {
                return Err(DaemonError::BadInput(
                    "FROM scratch is not supported: every step runs in a sandbox of the build, which needs a base with a shell (build on a template such as `base`, or an image)"
                        .into(),
                ))
            }
        };
        Ok(base)
    }

    /// Pulls the base image `reference`; its layers are held by the build
    /// cache (so no collection takes them while the build runs, and the
    /// next build of the same base finds them).
    async fn pull_base(
        &self,
        reference: &str,
        events: &BuildEvents,
    ) -> Result<BuildBase, DaemonError> {
        let reference: airlock_registry::ImageRef = reference
            .parse()
            .map_err(|e: airlock_registry::ReferenceError| DaemonError::BadInput(e.to_string()))?;
        let registries = self.config().registries.clone();
        registries
            .check_allowed(&reference)
            .map_err(crate::templates::pull_error)?;
        let store = self.layer_store()?;
        let _using = self.inner.layers_lock.read().await;
        let recorded = self.recorded_layer_ids()?;
        let limits = airlock_registry::PullLimits {
            max_image_bytes: self.config().max_image_bytes,
            layer: airlock_layers::unpack::UnpackLimits::default(),
        };
        let pulled = registries
            .pull(
                &reference,
                &store,
                &|diff_id| recorded.contains(diff_id),
                limits,
                Arc::new(|_| {}),
            )
            .await
            .map_err(crate::templates::pull_error)?;
        let image = pulled.image;
        self.with_store(|s| {
            for (position, layer) in image.layers.iter().enumerate() {
                let (bytes, entries) = layer
                    .unpacked
                    .as_ref()
                    .map_or((0, 0), |u| (u.bytes, u.entries));
                s.record_layer(&layer.diff_id, bytes, entries)?;
                s.cache_step(
                    &base_layer_key(&image.digest, position),
                    &CachedStep::Layer(layer.diff_id.clone()),
                )?;
            }
            Ok::<(), airlock_store::StoreError>(())
        })?;
        events(BuildEvent::Base {
            base: reference.to_string(),
            digest: image.digest.clone(),
        });
        Ok(BuildBase {
            layers: image.layers.iter().map(|l| l.diff_id.clone()).collect(),
            config: image.config.clone(),
            digest: image.digest.clone(),
        })
    }

    /// Records the built template.
    fn record_build(
        &self,
        request: &BuildRequest,
        base: &ImageConfig,
        layers: Vec<String>,
        config: &RunConfig,
    ) -> Result<TemplateRow, DaemonError> {
        let start = &request.spec.start;
        let image = ImageConfig {
            env: config.env.iter().map(|(k, v)| format!("{k}={v}")).collect(),
            workdir: Some(config.workdir.clone()),
            user: Some(config.user.clone()).filter(|u| !u.is_empty()),
            entrypoint: start
                .entrypoint
                .clone()
                .unwrap_or_else(|| base.entrypoint.clone()),
            cmd: start.cmd.clone().unwrap_or_else(|| base.cmd.clone()),
            start_cmd: request.start_cmd.clone(),
            ready_cmd: request.ready_cmd.clone(),
        };
        let config_json = serde_json::to_value(&image)
            .map_err(|e| DaemonError::Internal(format!("cannot encode an image config: {e}")))?;
        // The digest names what a sandbox of it gets: its configuration and
        // its layers.
        let mut hasher = Sha256::new();
        hasher.update(b"airlock-build template\0");
        hasher.update(config_json.to_string().as_bytes());
        for layer in &layers {
            hasher.update(b"\0");
            hasher.update(layer.as_bytes());
        }
        let digest = hex("sha256:", &hasher.finalize());
        Ok(self.with_store(|s| {
            s.put_template(&NewTemplate {
                name: request.name.clone(),
                digest,
                source: request.source.clone(),
                config: config_json,
                layers,
            })
        })?)
    }

    /// Makes the sandbox a step runs in, on `layers` with `config`.
    async fn step_sandbox(
        &self,
        owner: &KeyRow,
        name: &str,
        layers: &[String],
        config: &RunConfig,
        user: RunAs,
    ) -> Result<StepSandbox, DaemonError> {
        let paths = self.layer_paths(&format!("the build of {name:?}"), layers)?;
        if paths.len() >= airlock_policy::MAX_LAYERS {
            return Err(DaemonError::BadInput(format!(
                "the build has more than {} layers: merge RUN steps",
                airlock_policy::MAX_LAYERS - 1
            )));
        }
        let capacity = self.config().capacity;
        let disk_room = self
            .config()
            .disk_store
            .as_deref()
            .and_then(|store| rustix::fs::statvfs(store).ok())
            .map_or(STEP_DISK, |s| s.f_blocks.saturating_mul(s.f_frsize) / 2);
        let spec = SandboxSpec {
            template: Template::Layers { layers: paths },
            limits: Limits {
                memory_bytes: STEP_MEMORY.min(capacity.memory_bytes),
                cpu_millis: capacity.cpu_millis,
                pids: 4096,
                disk_bytes: STEP_DISK.min(disk_room).min(capacity.memory_bytes),
                layer: LayerBacking::Disk,
                ..Limits::default()
            },
            network: self.config().build_network.clone(),
            env: config.env.iter().cloned().collect(),
            user,
            cwd: Some("/".to_owned()),
            timeout_ms: self
                .config()
                .build_step_timeout
                .min(self.config().max_timeout)
                .as_millis() as u64,
            ..SandboxSpec::default()
        };
        let created = self
            .create(
                owner,
                NewSandboxRequest {
                    spec,
                    template_name: format!("build:{name}"),
                    metadata: BTreeMap::from([("airlock.build".to_owned(), name.to_owned())]),
                    layers: layers.to_vec(),
                },
                "build",
            )
            .await?;
        Ok(StepSandbox {
            daemon: self.clone(),
            id: Some(created.row.id),
        })
    }

    /// Freezes the writable layer of the step sandbox `id` into a layer of
    /// the store and records it: `None` when the step changed no file.
    async fn commit_layer(&self, id: &str) -> Result<Option<(String, u64)>, DaemonError> {
        let sandbox = self.running(id)?;
        let frozen = self
            .freeze_layer(&sandbox, None)
            .await
            .map_err(|e| match e {
                DaemonError::BadInput(message) => DaemonError::BadInput(
                    message.replace("the sandbox's changes", "the step's changes"),
                ),
                other => other,
            })?;
        Ok(frozen.layer.as_ref().map(|l| (l.diff_id.clone(), l.bytes)))
    }

    /// The layer ids the store records.
    fn recorded_layer_ids(&self) -> Result<std::collections::HashSet<String>, DaemonError> {
        Ok(self
            .with_store(|s| s.layers())?
            .into_iter()
            .map(|l| l.diff_id)
            .collect())
    }
}

/// What a build starts from.
struct BuildBase {
    layers: Vec<String>,
    config: ImageConfig,
    digest: String,
}

/// A build under way: the layers so far, the configuration in effect and
/// the key of the last step.
struct Build<'a> {
    daemon: &'a Daemon,
    owner: &'a KeyRow,
    request: &'a BuildRequest,
    events: &'a BuildEvents,
    layers: Vec<String>,
    config: RunConfig,
    parent: String,
}

impl Build<'_> {
    async fn step(&mut self, index: usize, total: usize, step: &Step) -> Result<(), DaemonError> {
        let number = index + 1;
        let at = |e: DaemonError| step_error(number, step, e);
        let sources = match step {
            Step::Copy { sources, .. } => Some(self.hash_sources(index, sources).map_err(at)?),
            _ => None,
        };
        let key = step_key(
            &self.parent,
            step,
            &StepInputs {
                config: &self.config,
                sources: sources.as_ref().map(|(_, digest)| digest),
            },
        );
        let instruction = describe(step);
        let makes_files = matches!(
            step,
            Step::Run { .. } | Step::Copy { .. } | Step::Workdir { .. }
        );
        let cached = if makes_files && !self.request.no_cache {
            self.cached(&key).map_err(at)?
        } else {
            None
        };
        (self.events)(BuildEvent::Step {
            index: number,
            total,
            instruction,
            cached: cached.is_some(),
        });
        match cached {
            Some(CachedStep::Layer(diff_id)) => self.layers.push(diff_id),
            Some(CachedStep::Empty) => {}
            None if makes_files => {
                let started = Instant::now();
                let made = self
                    .run(number, step, sources.as_ref().map(|(dir, _)| dir))
                    .await
                    .map_err(at)?;
                let cached = match made {
                    Some((diff_id, bytes)) => {
                        (self.events)(BuildEvent::Layer {
                            index: number,
                            diff_id: diff_id.clone(),
                            bytes,
                            ms: started.elapsed().as_millis() as u64,
                        });
                        self.layers.push(diff_id.clone());
                        CachedStep::Layer(diff_id)
                    }
                    None => CachedStep::Empty,
                };
                self.daemon
                    .with_store(|s| s.cache_step(&key, &cached))
                    .map_err(|e| at(e.into()))?;
            }
            None => {}
        }
        self.config.apply(step);
        self.parent = key;
        Ok(())
    }

    /// What the cache holds for `key`, if its layer is still there.
    fn cached(&self, key: &str) -> Result<Option<CachedStep>, DaemonError> {
        let cached = self.daemon.with_store(|s| s.cached_step(key))?;
        Ok(match cached {
            Some(CachedStep::Layer(diff_id)) if !self.daemon.layer_store()?.has(&diff_id) => None,
            other => other,
        })
    }

    /// The context a COPY at `index` reads, and the digest of its sources.
    fn hash_sources(
        &self,
        index: usize,
        sources: &[String],
    ) -> Result<(PathBuf, SourcesDigest), DaemonError> {
        let dir = self
            .request
            .step_contexts
            .get(&index)
            .or(self.request.context.as_ref())
            .ok_or_else(|| {
                DaemonError::BadInput("COPY needs a build context, and this build has none".into())
            })?
            .clone();
        let context = Context::open(&dir, Default::default()).map_err(context_error)?;
        let digest = context.hash_sources(sources).map_err(context_error)?;
        Ok((dir, digest))
    }

    /// Runs a step that changes files in a sandbox and freezes what it
    /// changed.
    async fn run(
        &mut self,
        number: usize,
        step: &Step,
        context: Option<&PathBuf>,
    ) -> Result<Option<(String, u64)>, DaemonError> {
        let daemon = self.daemon;
        let user = match step {
            Step::Run {
                user: Some(user), ..
            } => run_as(user)?,
            Step::Run { .. } => run_as(&self.config.user)?,
            // Files are made as root and chowned as the step says.
            _ => RunAs::Root,
        };
        let mut sandbox = daemon
            .step_sandbox(
                self.owner,
                &self.request.name,
                &self.layers,
                &self.config,
                user,
            )
            .await?;
        let id = sandbox.id().to_owned();
        let done = match step {
            Step::Run { command, env, .. } => {
                self.run_command(number, &id, command, env, user).await
            }
            Step::Copy {
                sources,
                dest,
                chown,
                chmod,
            } => match context {
                Some(dir) => {
                    self.copy(&id, dir, sources, dest, chown.as_deref(), *chmod)
                        .await
                }
                None => Err(DaemonError::Internal("a COPY without its context".into())),
            },
            Step::Workdir { path } => {
                let dir = airlock_build::spec::resolve_path(&self.config.workdir, path);
                let owner = match self.config.user.as_str() {
                    "user" | "1000" | "1000:1000" => airlock_protocol::Identity::User,
                    _ => airlock_protocol::Identity::Root,
                };
                daemon
                    .done(
                        &id,
                        Request::MakeDir {
                            path: dir,
                            parents: true,
                            mode: None,
                            owner,
                        },
                        Vec::new(),
                    )
                    .await
                    // There already, as Docker allows: nothing changes.
                    .or_else(|e| match e {
                        DaemonError::Conflict(_) => Ok(()),
                        other => Err(other),
                    })
            }
            _ => Ok(()),
        };
        let made = match done {
            Ok(()) => daemon.commit_layer(&id).await,
            Err(e) => Err(e),
        };
        sandbox.destroy().await;
        made
    }

    async fn run_command(
        &self,
        number: usize,
        id: &str,
        command: &Command,
        step_env: &BTreeMap<String, String>,
        user: RunAs,
    ) -> Result<(), DaemonError> {
        let (cmd, args) = match command {
            Command::Shell(line) => ("/bin/sh".to_owned(), vec!["-c".to_owned(), line.clone()]),
            Command::Exec(argv) => match argv.split_first() {
                Some((cmd, args)) => (cmd.clone(), args.to_vec()),
                None => return Err(DaemonError::BadInput("RUN has an empty command".into())),
            },
        };
        // ARG values the environment in effect has none for.
        let env = step_env
            .iter()
            .filter(|(name, _)| self.config.get(name).is_none())
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let workdir = self.config.workdir.clone();
        // The working directory may not exist yet (a WORKDIR of the base).
        self.daemon
            .done(
                id,
                Request::MakeDir {
                    path: workdir.clone(),
                    parents: true,
                    mode: None,
                    owner: crate::identity(user),
                },
                Vec::new(),
            )
            .await
            .or_else(|e| match e {
                DaemonError::Conflict(_) => Ok(()),
                other => Err(other),
            })?;
        let (_hub, mut output) = self
            .daemon
            .exec(
                id,
                ExecRequest {
                    cmd,
                    args,
                    env,
                    cwd: Some(workdir),
                    user: Some(user),
                    timeout_ms: None,
                    stdin: false,
                    pty: None,
                    tag: None,
                },
                "build",
            )
            .await?;
        let mut tail: Vec<u8> = Vec::new();
        while let Some(item) = output.next().await {
            let (stream, bytes) = match item {
                Output::Stdout(bytes) => ("stdout", bytes),
                Output::Stderr(bytes) => ("stderr", bytes),
                Output::Exited(exit) => {
                    if exit.exit_code == Some(0) {
                        return Ok(());
                    }
                    let how = match (exit.exit_code, exit.signal) {
                        _ if exit.oom => "was killed for running out of memory".to_owned(),
                        _ if exit.timed_out => "ran out of time".to_owned(),
                        (Some(code), _) => format!("exited with code {code}"),
                        (None, Some(signal)) => format!("was killed by signal {signal}"),
                        (None, None) => "ended".to_owned(),
                    };
                    let shown = String::from_utf8_lossy(&tail);
                    return Err(DaemonError::StepFailed(if shown.trim().is_empty() {
                        format!("the command {how}")
                    } else {
                        format!(
                            "the command {how}; its output ends with:\n{}",
                            shown.trim_end()
                        )
                    }));
                }
                Output::Error { message, .. } => return Err(DaemonError::InSandbox(message)),
            };
            tail.extend_from_slice(&bytes);
            if tail.len() > 2 * ERROR_TAIL {
                tail.drain(..tail.len() - ERROR_TAIL);
            }
            (self.events)(BuildEvent::Output {
                index: number,
                stream,
                text: String::from_utf8_lossy(&bytes).into_owned(),
            });
        }
        Err(DaemonError::InSandbox(
            "the command's output ended without an exit".into(),
        ))
    }

    /// Unpacks the COPY's sources from `dir` into the sandbox `id`.
    async fn copy(
        &self,
        id: &str,
        dir: &std::path::Path,
        sources: &[String],
        dest: &str,
        chown: Option<&str>,
        chmod: Option<u32>,
    ) -> Result<(), DaemonError> {
        let dest = self.config.resolve_dest(dest);
        let (uid, gid) = match chown {
            Some(owner) => owner_ids(owner)?,
            None => (0, 0),
        };
        let dest_is_dir = matches!(
            self.daemon.stat(id, dest.trim_end_matches('/')).await,
            Ok(info) if info.kind == airlock_protocol::FileKind::Dir
        ) && dest != "/";
        let options = PackOptions {
            uid,
            gid,
            chmod,
            dest_is_dir: dest_is_dir || dest == "/",
        };
        let context = Context::open(dir, Default::default()).map_err(context_error)?;
        let into = context
            .pack_dir(sources, &dest, &options)
            .map_err(context_error)?;
        let sandbox = self.daemon.running(id)?;
        let agent = sandbox.agent();
        let events = agent
            .request(Request::Extract { dir: into })
            .await
            .map_err(crate::closed(id))?;
        let extract_id = events.id();
        let (chunks, mut receiving) = tokio::sync::mpsc::channel::<Vec<u8>>(4);
        let sources = sources.to_vec();
        let packing = tokio::task::spawn_blocking(move || {
            context.pack_sources(&sources, &dest, &options, ChunkWriter::new(chunks))
        });
        while let Some(chunk) = receiving.recv().await {
            agent
                .send(extract_id, Request::WriteData, chunk)
                .await
                .map_err(crate::closed(id))?;
        }
        agent
            .send(extract_id, Request::WriteEnd, Vec::new())
            .await
            .map_err(crate::closed(id))?;
        let outcome = events.finish().await.map_err(crate::closed(id))?;
        packing
            .await
            .map_err(|e| DaemonError::Internal(format!("the COPY's packing was lost: {e}")))?
            .map_err(context_error)?;
        match outcome {
            airlock_protocol::Event::Written { .. } => Ok(()),
            airlock_protocol::Event::Error { kind, message } => {
                Err(DaemonError::from_agent(kind, message))
            }
            other => Err(DaemonError::Internal(format!(
                "the agent answered an extract with {other:?}"
            ))),
        }
    }
}

/// A step's sandbox; destroyed by [`StepSandbox::destroy`], or in the
/// background if dropped (a build whose client went away).
struct StepSandbox {
    daemon: Daemon,
    id: Option<String>,
}

impl StepSandbox {
    fn id(&self) -> &str {
        self.id.as_deref().unwrap_or_default()
    }

    async fn destroy(&mut self) {
        if let Some(id) = self.id.take() {
            if let Err(e) = self.daemon.stop(&id, DeadReason::Deleted, None).await {
                tracing::warn!("removing the build sandbox {id}: {e}");
            }
        }
    }
}

impl Drop for StepSandbox {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            let daemon = self.daemon.clone();
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    let _ = daemon.stop(&id, DeadReason::Deleted, None).await;
                });
            }
        }
    }
}

/// A writer handing 1 MiB chunks to an async task (blocking while the
/// task is behind).
struct ChunkWriter {
    tx: tokio::sync::mpsc::Sender<Vec<u8>>,
    buf: Vec<u8>,
}

const CHUNK: usize = 1 << 20;

impl ChunkWriter {
    fn new(tx: tokio::sync::mpsc::Sender<Vec<u8>>) -> ChunkWriter {
        ChunkWriter {
            tx,
            buf: Vec::with_capacity(CHUNK),
        }
    }

    fn send(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK));
        self.tx.blocking_send(chunk).map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::BrokenPipe,
                "the sandbox stopped taking the files",
            )
        })
    }
}

impl Write for ChunkWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        let n = data.len().min(CHUNK - self.buf.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() >= CHUNK {
            self.send()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.send()
    }
}

impl Drop for ChunkWriter {
    fn drop(&mut self) {
        let _ = self.send();
    }
}

/// The error of step `number`, naming it.
fn step_error(number: usize, step: &Step, error: DaemonError) -> DaemonError {
    let what = format!("step {number} ({})", describe(step));
    match error {
        DaemonError::BadInput(m) => DaemonError::BadInput(format!("{what}: {m}")),
        DaemonError::InSandbox(m) => DaemonError::InSandbox(format!("{what} failed: {m}")),
        DaemonError::StepFailed(m) => DaemonError::StepFailed(format!("{what} failed: {m}")),
        DaemonError::NotFound(m) => DaemonError::NotFound(format!("{what}: {m}")),
        DaemonError::Forbidden(m) => DaemonError::Forbidden(format!("{what}: {m}")),
        DaemonError::NoSpace(m) => DaemonError::NoSpace(format!("{what}: {m}")),
        DaemonError::TooLarge(m) => DaemonError::TooLarge(format!("{what}: {m}")),
        other => other,
    }
}

/// A step in Dockerfile form, for progress and errors (long commands cut).
pub fn describe(step: &Step) -> String {
    let text = match step {
        Step::Run { command, .. } => match command {
            Command::Shell(line) => format!("RUN {line}"),
            Command::Exec(argv) => {
                format!("RUN {}", serde_json::to_string(argv).unwrap_or_default())
            }
        },
        Step::Copy { sources, dest, .. } => format!("COPY {} {dest}", sources.join(" ")),
        Step::Env { vars } => format!(
            "ENV {}",
            vars.iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(" ")
        ),
        Step::Workdir { path } => format!("WORKDIR {path}"),
        Step::User { user } => format!("USER {user}"),
    };
    let line = text.lines().next().unwrap_or_default();
    if line.len() > 200 || line.len() < text.len() {
        let mut cut = 200.min(line.len());
        while !line.is_char_boundary(cut) {
            cut -= 1;
        }
        format!("{}…", &line[..cut])
    } else {
        text
    }
}

/// Who a step runs as: the sandbox's root or `user` (uid 1000); other
/// users are refused (a sandbox's processes run as one of the two).
fn run_as(user: &str) -> Result<RunAs, DaemonError> {
    let name = user.split(':').next().unwrap_or_default();
    match name {
        "" | "root" | "0" => Ok(RunAs::Root),
        "user" | "1000" => Ok(RunAs::User),
        other => Err(DaemonError::BadInput(format!(
            "steps run as root or as user (uid 1000), not as {other:?}"
        ))),
    }
}

/// The numeric owner of `--chown` (`user[:group]`): numbers, `root` or
/// `user`.
fn owner_ids(owner: &str) -> Result<(u64, u64), DaemonError> {
    let id = |name: &str| -> Result<u64, DaemonError> {
        match name {
            "root" => Ok(0),
            "user" => Ok(1000),
            number => number.parse::<u32>().map(u64::from).map_err(|_| {
                DaemonError::BadInput(format!("--chown {owner}: owners are numbers, root or user"))
            }),
        }
    };
    match owner.split_once(':') {
        Some((user, group)) => Ok((id(user)?, id(group)?)),
        None => {
            let uid = id(owner)?;
            Ok((uid, uid))
        }
    }
}

fn context_error(error: airlock_build::context::ContextError) -> DaemonError {
    use airlock_build::context::ContextError as E;
    let message = airlock_backend::error_chain(&error);
    match error {
        E::OpenContext { .. } | E::Write(_) => DaemonError::Internal(message),
        _ => DaemonError::BadInput(message),
    }
}

/// The cache key holding layer `position` of the base image `digest`.
fn base_layer_key(digest: &str, position: usize) -> String {
    let mut hasher = Sha256::new();
    hasher.update(b"airlock-build base layer\0");
    hasher.update(digest.as_bytes());
    hasher.update(position.to_le_bytes());
    hex("sha256:", &hasher.finalize())
}

fn hex(prefix: &str, bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(prefix.len() + bytes.len() * 2);
    out.push_str(prefix);
    for b in bytes {
        let _ = write!(out, "{b:02x}");
    }
    out
}
