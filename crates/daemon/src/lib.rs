//! The engine of `airlock serve`: everything the daemon does, without HTTP.
//!
//! [`Daemon`] owns the live sandboxes and drives each through the lifecycle
//! state machine of `airlock-core`, persisting every transition in the store
//! with compare-and-set so the API, the TTL reaper and a sandbox's own death
//! can race without corrupting its record. Creation passes admission control
//! first; every sandbox holds a lease on its slot until its teardown ends.
//!
//! - [`sandboxes`]: create, get, list, stop (delete and timeout), the reaper.
//! - [`exec`]: processes and their output hubs (attach, replay).
//! - [`files`]: file operations, all carried out by the agent inside.
//! - [`reconcile`]: what a starting daemon does with what it finds.
//! - [`audit`] and [`metrics`]: the trail and the numbers.
//!
//! The API routers (`airlock-api`) translate HTTP into these calls and hold
//! no state of their own, so every wire dialect behaves the same.
#![forbid(unsafe_code)]

pub mod audit;
pub mod builds;
pub mod exec;
pub mod files;
pub mod files_only;
pub mod interpreter;
pub mod metrics;
pub mod outputs;
pub mod pools;
pub mod ports;
pub mod processes;
pub mod reconcile;
pub mod sandboxes;
pub mod snapshots;
pub mod startup;
pub mod templates;
pub mod tiers;
pub mod tokens;
pub mod volume_files;
pub mod volumes;

use airlock_backend::{Backend, Resources};
use airlock_core::{Admission, AdmissionLimits, LiveLease, Rejected, State};
use airlock_policy::SandboxSpec;
use airlock_protocol::{AgentClient, ErrorKind};
use airlock_store::{Store, StoreError};
use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What a pause keeps (the tiers' own type, named by the dialects).
pub use airlock_backend::PauseMode;
pub use audit::{Audit, AuditLimits};
pub use exec::{Attached, ExitInfo, Output, ProcessHub, ProcessView};
pub use metrics::Metrics;
pub use ports::PortStream;

/// The store, shared by the daemon's tasks (it is `Send`, not `Sync`).
pub type SharedStore = Arc<Mutex<Store>>;

/// What the daemon was told at start.
#[derive(Debug, Clone)]
pub struct Config {
    /// State, keys and audit streams live here.
    pub data_dir: PathBuf,
    /// Lifetime of a sandbox whose request names none.
    pub default_timeout: Duration,
    /// Longest lifetime a request may ask for (and `timeout` may set).
    pub max_timeout: Duration,
    /// How long a paused sandbox is kept: its deadline while paused.
    pub paused_ttl: Duration,
    /// Caps and queue in front of creation.
    pub admission: AdmissionLimits,
    /// Largest file upload, bytes.
    pub max_upload_bytes: u64,
    /// Largest image an import or a pull takes (an import's archive, a
    /// pull's compressed layers), bytes.
    pub max_image_bytes: u64,
    /// The registries pulls may use, their credentials and the key their
    /// images must be signed with (none: pulls are refused).
    pub registries: std::sync::Arc<airlock_registry::Registries>,
    /// The disk store writable layers are made in (`airlock_jail::disk`);
    /// `None` keeps them in memory.
    pub disk_store: Option<PathBuf>,
    /// Host directories under which API clients may bind-mount paths; empty
    /// means no host mounts from the API.
    pub mount_roots: Vec<PathBuf>,
    /// What this machine has, for refusing limits beyond it.
    pub capacity: Capacity,
    /// `name=ip` entries that replace the host's resolver for sandbox
    /// egress (tests and air-gapped setups); empty means the host's
    /// `/etc/resolv.conf`.
    pub egress_hosts: Vec<String>,
    /// The resolver sandbox egress asks instead of the host's
    /// `/etc/resolv.conf` (ignored when `egress_hosts` is set).
    pub egress_dns: Option<std::net::SocketAddr>,
    /// Whether an e2b create that leaves internet access on (the SDKs'
    /// default) gets mode `open`; otherwise it gets `none`.
    pub e2b_internet: bool,
    /// The domain under which sandboxes' ports are reached by name
    /// (`PORT-ID.DOMAIN`), lower case, without a leading dot; `None`: by
    /// path only.
    pub sandbox_domain: Option<String>,
    /// The tier of a create that names none, by the template it names
    /// (the bare name, without a `@digest` pin); a template not listed
    /// gets `default_tier`.
    pub template_tiers: std::collections::BTreeMap<String, airlock_policy::Tier>,
    /// The tier of a create that names none and whose template has none.
    pub default_tier: airlock_policy::Tier,
    /// What the audit trail may write, whatever floods it.
    pub audit: audit::AuditLimits,
    /// What one sandbox's egress path may make the daemon do.
    pub egress_limits: airlock_egress::EgressLimits,
    /// How to start the confined egress worker; `None` serves egress from
    /// the daemon's own process (tests without the binary).
    pub egress_worker: Option<airlock_egress::WorkerSpawn>,
    /// What the sandboxes running template build steps may reach (`none`
    /// unless the operator allows e.g. the package mirror).
    pub build_network: airlock_policy::NetworkPolicy,
    /// Longest a build step may run.
    pub build_step_timeout: Duration,
    /// How long an unused build cache entry keeps its layer: the collector
    /// evicts older ones.
    pub build_cache_ttl: Duration,
    /// The zstd level snapshots' archives are written at.
    pub snapshot_zstd_level: i32,
    /// How many snapshots, of how many bytes, one API key may keep.
    pub snapshot_quota: airlock_store::SnapshotQuota,
    /// How many sandboxes one API key may keep paused with only their
    /// files (they hold disk, no live slot).
    pub max_files_only_paused: u64,
    /// Where sandboxes' outputs are copied (`file:///dir` or
    /// `s3://bucket/prefix`); `None`: `<data_dir>/outputs`.
    pub outputs_store: Option<String>,
    /// Most bytes one collection of outputs copies.
    pub outputs_max_bytes: u64,
    /// How long collected outputs are kept: the collector deletes older
    /// ones, so the store does not grow without bound.
    pub outputs_ttl: Duration,
    /// The quota of a volume whose create names none, bytes.
    pub volume_default_bytes: u64,
    /// The largest quota a volume may have, bytes.
    pub volume_max_bytes: u64,
    /// How many volumes one API key may keep.
    pub max_volumes_per_key: u64,
}

/// What one API key may keep in snapshots unless the operator says
/// otherwise: 100 of them, 20 GiB.
pub const DEFAULT_SNAPSHOT_QUOTA: airlock_store::SnapshotQuota = airlock_store::SnapshotQuota {
    count: 100,
    bytes: 20 << 30,
};

/// How many sandboxes one API key may keep paused with only their files
/// unless the operator says otherwise.
pub const DEFAULT_MAX_FILES_ONLY_PAUSED: u64 = 100;

/// What the machine can give one sandbox at most.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    /// Physical memory, bytes.
    pub memory_bytes: u64,
    /// Online CPUs, in thousandths.
    pub cpu_millis: u32,
}

impl Capacity {
    /// Reads /proc/meminfo and the online CPU count.
    pub fn of_this_machine() -> Capacity {
        let memory_bytes = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|text| {
                text.lines()
                    .find_map(|l| l.strip_prefix("MemTotal:"))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            })
            .map_or(u64::MAX, |kb| kb.saturating_mul(1024));
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
        Capacity {
            memory_bytes,
            cpu_millis: cpus.saturating_mul(1000),
        }
    }
}

impl Config {
    /// Defaults: 300 s lifetime (24 h at most), default admission limits,
    /// 1 GiB uploads, no host mounts.
    pub fn new(data_dir: PathBuf) -> Config {
        Config {
            data_dir,
            default_timeout: Duration::from_secs(300),
            max_timeout: Duration::from_secs(24 * 3600),
            paused_ttl: Duration::from_secs(24 * 3600),
            admission: AdmissionLimits::default(),
            max_upload_bytes: 1 << 30,
            max_image_bytes: 16 << 30,
            registries: std::sync::Arc::default(),
            disk_store: None,
            mount_roots: Vec::new(),
            capacity: Capacity::of_this_machine(),
            egress_hosts: Vec::new(),
            egress_dns: None,
            e2b_internet: false,
            sandbox_domain: None,
            template_tiers: std::collections::BTreeMap::new(),
            default_tier: airlock_policy::Tier::Process,
            audit: audit::AuditLimits::default(),
            egress_limits: airlock_egress::EgressLimits::default(),
            egress_worker: None,
            build_network: airlock_policy::NetworkPolicy::None,
            build_step_timeout: Duration::from_secs(3600),
            build_cache_ttl: Duration::from_secs(7 * 24 * 3600),
            snapshot_zstd_level: airlock_layers::keep::DEFAULT_LEVEL,
            snapshot_quota: DEFAULT_SNAPSHOT_QUOTA,
            max_files_only_paused: DEFAULT_MAX_FILES_ONLY_PAUSED,
            outputs_store: None,
            outputs_max_bytes: 1 << 30,
            outputs_ttl: Duration::from_secs(7 * 24 * 3600),
            volume_default_bytes: 1 << 30,
            volume_max_bytes: 64 << 30,
            max_volumes_per_key: 100,
        }
    }
}

/// Why a call failed, in the terms the API answers with.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// The request cannot be carried out as written (400).
    #[error("{0}")]
    BadInput(String),
    /// No such sandbox, process or path (404).
    #[error("{0}")]
    NotFound(String),
    /// The sandbox exists but is not running (409).
    #[error("sandbox {0} is not running")]
    NotRunning(String),
    /// The target exists already, or the state forbids it (409).
    #[error("{0}")]
    Conflict(String),
    /// Permission denied inside the sandbox (403).
    #[error("{0}")]
    Forbidden(String),
    /// Too large (413).
    #[error("{0}")]
    TooLarge(String),
    /// A service the daemon relies on for the request (an image registry)
    /// failed or cannot be reached (502); the message says which and how.
    #[error("{0}")]
    Upstream(String),
    /// The sandbox's disk is full (507).
    #[error("{0}")]
    NoSpace(String),
    /// The sandbox's own system failed the operation (an I/O error inside
    /// it, not the daemon's fault) (422).
    #[error("{0}")]
    InSandbox(String),
    /// A template build's step failed (its command exited non-zero, was
    /// killed or ran out of time) (422); the message names the step and
    /// shows the end of its output.
    #[error("{0}")]
    StepFailed(String),
    /// Admission refused the creation (429, or 503 while shutting down).
    #[error("{0}")]
    Rejected(Rejected),
    /// The sandbox's tier cannot do what was asked (yet) (501); the message
    /// names the tier.
    #[error("{0}")]
    Unsupported(String),
    /// The caller holds as much of something as it may (403).
    #[error("{0}")]
    QuotaExceeded(String),
    /// The sandbox runs, but the daemon (restarted) has not reconnected to
    /// it yet: its adoption is being retried (503 with Retry-After).
    #[error("sandbox {0} is being reconnected after a daemon restart; try again")]
    Reconnecting(String),
    /// The state database is unavailable for now (busy, locked, its disk
    /// failing) (503 with Retry-After); the message goes to the log only.
    #[error("{0}")]
    Unavailable(String),
    /// Something failed inside the daemon; the message goes to the log only.
    #[error("{0}")]
    Internal(String),
    /// Nothing listens on the port of the sandbox a forwarded request is
    /// for (502).
    #[error("{0}")]
    PortClosed(String),
}

impl DaemonError {
    /// Maps an agent's error answer onto an API error.
    pub fn from_agent(kind: ErrorKind, message: String) -> DaemonError {
        match kind {
            ErrorKind::NotFound => DaemonError::NotFound(message),
            ErrorKind::AlreadyExists | ErrorKind::Busy | ErrorKind::Closed => {
                DaemonError::Conflict(message)
            }
            ErrorKind::PermissionDenied => DaemonError::Forbidden(message),
            ErrorKind::InvalidArgument
            | ErrorKind::NotADirectory
            | ErrorKind::IsADirectory
            | ErrorKind::DirectoryNotEmpty
            | ErrorKind::NotExecutable => DaemonError::BadInput(message),
            ErrorKind::NoSpace => DaemonError::NoSpace(message),
            ErrorKind::Io => DaemonError::InSandbox(message),
            ErrorKind::UnsupportedVersion => DaemonError::Internal(message),
            ErrorKind::Unsupported => DaemonError::Unsupported(message),
            ErrorKind::Refused => DaemonError::PortClosed(message),
        }
    }
}

impl From<StoreError> for DaemonError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::InvalidCursor => DaemonError::BadInput("the cursor is not valid".into()),
            StoreError::SnapshotQuota(exceeded) => DaemonError::QuotaExceeded(exceeded.to_string()),
            e @ StoreError::VolumeQuota(_) => DaemonError::QuotaExceeded(e.to_string()),
            e @ StoreError::InUse { .. } => DaemonError::Conflict(e.to_string()),
            StoreError::InvalidLimit { .. } => {
                DaemonError::BadInput("limit must be between 1 and 1000".into())
            }
            other if other.is_unavailable() => {
                let cause = std::error::Error::source(&other)
                    .map(ToString::to_string)
                    .unwrap_or_default();
                DaemonError::Unavailable(format!("store: {other}: {cause}"))
            }
            other => DaemonError::Internal(format!("store: {other}")),
        }
    }
}

/// The processes of one sandbox that the daemon started.
#[derive(Default)]
struct ProcessTable {
    hubs: HashMap<u32, Arc<ProcessHub>>,
    /// Ended pids, oldest first; past [`exec::ENDED_KEPT`] they are forgotten.
    ended: VecDeque<u32>,
}

/// A sandbox the daemon is connected to.
pub struct LiveSandbox {
    /// `sbx-…`.
    pub id: String,
    /// The API key that created it.
    pub owner: String,
    /// What it was created with.
    pub spec: SandboxSpec,
    agent: AgentClient,
    resources: Resources,
    state: Mutex<State>,
    lease: Mutex<Option<LiveLease>>,
    processes: Mutex<ProcessTable>,
    /// Watchers polled by name (the e2b dialect's CreateWatcher); they end
    /// with the sandbox.
    watchers: files::NamedWatchers,
    /// Code contexts and their kernels; they end with the sandbox.
    interpreters: interpreter::CodeContexts,
    /// Its egress path, when its policy lets anything out.
    egress: Mutex<Option<airlock_egress::Attachment>>,
    /// Held through a teardown, so stops and deaths run one at a time.
    teardown: tokio::sync::Mutex<()>,
    /// Connections to its ports from outside; a pause closes them.
    tunnels: airlock_protocol::tunnel::Registry,
    /// Where its ports can be dialled directly (else through its agent).
    ports: Option<Arc<airlock_backend::PortsPoint>>,
}

impl LiveSandbox {
    fn new(
        id: String,
        owner: String,
        spec: SandboxSpec,
        instance: airlock_backend::Instance,
        state: State,
        lease: Option<LiveLease>,
    ) -> (Arc<LiveSandbox>, airlock_backend::Ended) {
        let sandbox = Arc::new(LiveSandbox {
            id,
            owner,
            spec,
            agent: instance.agent,
            resources: instance.resources,
            state: Mutex::new(state),
            lease: Mutex::new(lease),
            processes: Mutex::new(ProcessTable::default()),
            watchers: files::NamedWatchers::default(),
            interpreters: interpreter::CodeContexts::default(),
            egress: Mutex::new(None),
            teardown: tokio::sync::Mutex::new(()),
            tunnels: airlock_protocol::tunnel::Registry::default(),
            ports: instance.ports.map(Arc::new),
        });
        (sandbox, instance.ended)
    }

    /// The current state.
    pub fn state(&self) -> State {
        *self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn set_state(&self, state: State) {
        *self.state.lock().unwrap_or_else(|p| p.into_inner()) = state;
    }

    /// The connection to its agent.
    pub fn agent(&self) -> &AgentClient {
        &self.agent
    }
}

pub(crate) struct Inner {
    config: Config,
    store: SharedStore,
    tiers: tiers::Tiers,
    admission: Admission,
    live: Mutex<HashMap<String, Arc<LiveSandbox>>>,
    /// Ids being created (no live entry yet); they count as recorded.
    creating: Mutex<std::collections::HashSet<String>>,
    /// Recorded sandboxes whose adoption failed for a reason that may pass
    /// (see [`reconcile`]), each with what wakes its retrying task; they
    /// count as recorded.
    adopting: Mutex<HashMap<String, Arc<tokio::sync::Notify>>>,
    /// One lock per sandbox being resumed, so two resumes of one sandbox
    /// (a files-only one boots again) run one after the other.
    resuming: files_only::Resuming,
    audit: Audit,
    metrics: Metrics,
    /// What sandbox access tokens are derived from.
    token_key: tokens::TokenKey,
    /// The egress path of sandboxes that may reach the network.
    egress: airlock_egress::Egress,
    /// Taken shared by imports and creates while they bring layers in or
    /// record them, exclusive by the layer collector.
    /// (A tokio lock: a pull holds it across its awaits, and a create
    /// must not block a runtime thread while a collection runs.)
    layers_lock: tokio::sync::RwLock<()>,
    /// Templates being built (one build of a name at a time).
    building: std::sync::Mutex<std::collections::HashSet<String>>,
    /// Warm pools and their ready members.
    pools: pools::Pools,
    /// Where outputs are copied.
    outputs: outputs::OutputStore,
}

/// The daemon's engine. Cheap to clone; clones share everything.
#[derive(Clone)]
pub struct Daemon {
    inner: Arc<Inner>,
}

/// The egress path, reporting to the audit streams and metrics: every
/// refusal is a security event; allowed connections count in the metrics
/// only.
fn egress_path(
    config: &Config,
    audit: &Audit,
    metrics: &Metrics,
) -> Result<airlock_egress::Egress, String> {
    let resolver = match airlock_egress::resolver(&config.egress_hosts, config.egress_dns) {
        Ok(resolver) => resolver,
        Err(airlock_egress::ResolverError::System(e)) => {
            tracing::warn!("{e}; sandboxes will resolve no names");
            Arc::new(airlock_egress::HostsResolver::default())
        }
        Err(e) => return Err(e.to_string()),
    };
    let audit = audit.clone();
    let counters = metrics.egress.clone();
    let events: airlock_egress::Events = Arc::new(move |event: airlock_egress::EgressEvent| {
        counters
            .get_or_create(&metrics::EgressLabel {
                protocol: event.protocol,
                reason: event.reason,
            })
            .inc();
        if !event.allowed {
            // Being rate-limited is its own kind, so the denials of a flood
            // never use up its budget of events written in full.
            let kind = match event.reason {
                "rate_limited" | "too_many_at_once" => "egress.limited",
                _ => "egress.denied",
            };
            audit.record(
                airlock_store::Stream::Security,
                kind,
                Some(&event.sandbox),
                None,
                serde_json::json!({
                    "protocol": event.protocol,
                    "destination": event.destination,
                    "port": event.port,
                    "reason": event.reason,
                    "rule": event.rule,
                }),
            );
        }
    });
    match &config.egress_worker {
        Some(spawn) => airlock_egress::Egress::confined(
            spawn.clone(),
            airlock_egress::WorkerConfig {
                hosts: config.egress_hosts.clone(),
                dns: config.egress_dns,
                limits: config.egress_limits,
            },
            events,
        )
        .map_err(|e| e.to_string()),
        None => Ok(airlock_egress::Egress::new(resolver, events).with_limits(config.egress_limits)),
    }
}

/// The daemon could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("the egress resolver is not configured right: {0}")]
    Egress(String),
    #[error("the admission limits are not valid: {0}")]
    Limits(#[from] airlock_core::LimitsError),
    #[error("cannot open the audit streams in {0}")]
    Audit(PathBuf, #[source] std::io::Error),
    #[error("cannot set up the sandbox token key in {0}")]
    TokenKey(PathBuf, #[source] tokens::TokenKeyError),
    #[error("{0}")]
    Outputs(#[from] outputs::OutputStoreError),
}

impl Daemon {
    /// A daemon over `store` running sandboxes on `backend` (its one
    /// tier, probed). Call [`Daemon::reconcile`] next, then start the
    /// reaper.
    pub fn new(
        config: Config,
        store: SharedStore,
        backend: Arc<dyn Backend>,
    ) -> Result<Daemon, StartError> {
        Daemon::with_tiers(config, store, tiers::Tiers::probe(vec![backend]))
    }

    /// A daemon over `store` running sandboxes on the available `tiers`.
    pub fn with_tiers(
        config: Config,
        store: SharedStore,
        tiers: tiers::Tiers,
    ) -> Result<Daemon, StartError> {
        let admission = Admission::new(config.admission)?;
        let token_key = tokens::TokenKey::load_or_create(&config.data_dir)
            .map_err(|e| StartError::TokenKey(config.data_dir.clone(), e))?;
        let audit_dir = config.data_dir.join("audit");
        let audit = Audit::start_with(&audit_dir, Arc::clone(&store), config.audit)
            .map_err(|e| StartError::Audit(audit_dir, e))?;
        let metrics = Metrics::new();
        let egress = egress_path(&config, &audit, &metrics).map_err(StartError::Egress)?;
        let outputs_url = match &config.outputs_store {
            Some(url) => url.clone(),
            None => format!("file://{}", config.data_dir.join("outputs").display()),
        };
        let outputs = outputs::OutputStore::open(&outputs_url)?;
        Ok(Daemon {
            inner: Arc::new(Inner {
                config,
                store,
                tiers,
                admission,
                live: Mutex::new(HashMap::new()),
                creating: Mutex::new(Default::default()),
                adopting: Mutex::new(HashMap::new()),
                resuming: files_only::Resuming::default(),
                audit,
                metrics,
                token_key,
                egress,
                layers_lock: tokio::sync::RwLock::new(()),
                building: std::sync::Mutex::default(),
                pools: pools::Pools::default(),
                outputs,
            }),
        })
    }

    /// Lets every tier prepare ahead for the first create.
    pub fn warm(&self) {
        for backend in self.inner.tiers.all() {
            backend.warm();
        }
    }

    /// Releases what was prepared ahead; sandboxes keep running.
    pub fn shutdown(&self) {
        self.inner.admission.close();
        for backend in self.inner.tiers.all() {
            backend.shutdown();
        }
    }

    /// The tiers, available or not, and why not.
    pub fn tiers(&self) -> Vec<tiers::TierStatus> {
        self.inner.tiers.statuses()
    }

    /// The tier a create on `template` (a name as a request gives it,
    /// resolved as `resolved`) runs on when it names none: the template's
    /// own, else the operator's for that name (`template_tiers`), else the
    /// daemon's.
    pub fn default_tier_of(
        &self,
        template: &str,
        resolved: &templates::ResolvedTemplate,
    ) -> airlock_policy::Tier {
        let bare = template.split_once('@').map_or(template, |(bare, _)| bare);
        let config = self.config();
        resolved
            .tier
            .or_else(|| config.template_tiers.get(bare).copied())
            .unwrap_or(config.default_tier)
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// The audit trail.
    pub fn audit(&self) -> &Audit {
        &self.inner.audit
    }

    /// The metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// Runs `f` with the store locked.
    pub fn with_store<T>(&self, f: impl FnOnce(&Store) -> T) -> T {
        let store = self.inner.store.lock().unwrap_or_else(|p| p.into_inner());
        f(&store)
    }

    fn live_sandbox(&self, id: &str) -> Option<Arc<LiveSandbox>> {
        self.inner
            .live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned()
    }

    /// What wakes the adoption task of `id`, if its adoption is retried.
    fn adopting(&self, id: &str) -> Option<Arc<tokio::sync::Notify>> {
        self.inner
            .adopting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned()
    }

    /// The running sandbox `id`, or why not.
    pub fn running(&self, id: &str) -> Result<Arc<LiveSandbox>, DaemonError> {
        match self.live_sandbox(id) {
            Some(sandbox) if sandbox.state() == State::Running => Ok(sandbox),
            Some(_) => Err(DaemonError::NotRunning(id.to_owned())),
            None => match self.with_store(|s| s.get_sandbox(id))? {
                Some(row)
                    if !crate::sandboxes::state_of(&row).is_dead()
                        && self.adopting(id).is_some() =>
                {
                    // Someone wants it: try now rather than at the next
                    // backoff.
                    if let Some(adopting) = self.adopting(id) {
                        adopting.notify_one();
                    }
                    Err(DaemonError::Reconnecting(id.to_owned()))
                }
                Some(_) => Err(DaemonError::NotRunning(id.to_owned())),
                None => Err(not_found(id)),
            },
        }
    }

    /// Ids the daemon accounts for: live and being created.
    fn recorded_ids(&self) -> std::collections::HashSet<String> {
        let mut ids: std::collections::HashSet<String> = self
            .inner
            .live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .cloned()
            .collect();
        ids.extend(
            self.inner
                .creating
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .cloned(),
        );
        ids.extend(
            self.inner
                .adopting
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .keys()
                .cloned(),
        );
        ids
    }

    /// Sets the gauges that mirror current state, then encodes every metric.
    pub async fn scrape_metrics(&self) -> String {
        let keep = self.recorded_ids();
        let backends = self.inner.tiers.all();
        let leaked = futures_util::future::join_all(backends.iter().map(|b| b.leaked(&keep)))
            .await
            .into_iter()
            .sum::<usize>();
        self.encode_metrics(leaked)
    }

    /// Sets the gauges (`leaked` is what the tiers' leak checks found),
    /// then encodes every metric.
    fn encode_metrics(&self, leaked: usize) -> String {
        let metrics = &self.inner.metrics;
        let mut counts: HashMap<&'static str, i64> = HashMap::new();
        for sandbox in self
            .inner
            .live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
        {
            *counts.entry(sandbox.state().as_str()).or_default() += 1;
        }
        let creating = self
            .inner
            .creating
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len() as i64;
        // Warm pool members wait as being created; they are counted apart.
        let pooled = self.inner.pools.held() as i64;
        *counts.entry("creating").or_default() += (creating - pooled).max(0);
        for pool in self.inner.pools.views() {
            let label = metrics::PoolLabel { pool: pool.name };
            metrics
                .pool_ready
                .get_or_create(&label)
                .set(i64::from(pool.ready));
            metrics
                .pool_starting
                .get_or_create(&label)
                .set(i64::from(pool.starting));
            metrics
                .pool_target
                .get_or_create(&label)
                .set(i64::from(pool.target));
        }
        for state in ["creating", "running", "paused", "stopping"] {
            metrics
                .sandboxes
                .get_or_create(&metrics::StateLabel { state })
                .set(counts.get(state).copied().unwrap_or(0));
        }
        let admission = self.inner.admission.snapshot();
        metrics.queue_depth.set(admission.queued as i64);
        metrics.leaked_resources.set(leaked as i64);
        metrics
            .unowned_layers
            .set(self.unowned_store_entries() as i64);
        metrics.audit_dropped.set(self.inner.audit.dropped() as i64);
        metrics
            .audit_suppressed
            .set(self.inner.audit.suppressed() as i64);
        metrics.encode()
    }
}

/// The agent identity of a sandbox user.
pub(crate) fn identity(user: airlock_policy::RunAs) -> airlock_protocol::Identity {
    match user {
        airlock_policy::RunAs::User => airlock_protocol::Identity::User,
        airlock_policy::RunAs::Root => airlock_protocol::Identity::Root,
    }
}

/// The limits the agent applies to every process of a sandbox with
/// `limits`: a file may grow to the writable layer's size (plus a page, so
/// the layer's ENOSPC is what stops it).
pub(crate) fn process_limits(limits: &airlock_policy::Limits) -> airlock_protocol::ProcessLimits {
    airlock_protocol::ProcessLimits {
        nofile: limits.nofile,
        fsize_bytes: limits.writable_layer_bytes() + 4096,
    }
}

/// Maps a broken agent connection onto "sandbox `id` is not running".
pub(crate) fn closed(id: &str) -> impl Fn(airlock_protocol::ClientError) -> DaemonError + '_ {
    move |_| DaemonError::NotRunning(id.to_owned())
}

/// An answer of the agent that its request does not allow.
pub(crate) fn unexpected(event: &airlock_protocol::Event) -> DaemonError {
    DaemonError::Internal(format!("unexpected answer from the agent: {event:?}"))
}

impl Daemon {
    /// Sends one request (with `payload`) to the agent of the running
    /// sandbox `id` and returns its final event; an agent error is `Err`.
    pub(crate) async fn final_answer(
        &self,
        id: &str,
        request: airlock_protocol::Request,
        payload: Vec<u8>,
    ) -> Result<airlock_protocol::Event, DaemonError> {
        let sandbox = self.running(id)?;
        match sandbox
            .agent()
            .request_with_payload(request, payload)
            .await
            .map_err(closed(id))?
            .finish()
            .await
            .map_err(closed(id))?
        {
            airlock_protocol::Event::Error { kind, message } => {
                Err(DaemonError::from_agent(kind, message))
            }
            event => Ok(event),
        }
    }

    /// [`Daemon::final_answer`] for a request answered by `done`.
    pub(crate) async fn done(
        &self,
        id: &str,
        request: airlock_protocol::Request,
        payload: Vec<u8>,
    ) -> Result<(), DaemonError> {
        match self.final_answer(id, request, payload).await? {
            airlock_protocol::Event::Done => Ok(()),
            other => Err(unexpected(&other)),
        }
    }
}

pub(crate) fn not_found(id: &str) -> DaemonError {
    DaemonError::NotFound(format!("no sandbox {id}"))
}

#[cfg(test)]
mod config_tests {
    use super::*;

    #[test]
    fn build_steps_reach_no_network_unless_the_operator_allows_it() {
        let config = Config::new(PathBuf::from("/nowhere"));
        assert_eq!(config.build_network, airlock_policy::NetworkPolicy::None);
    }
}
