//! `airlockd serve` (the daemon; `airlock serve` execs it) and
//! `airlockd keys` (its API keys; `airlock keys`).
//!
//! The daemon keeps its state in `<data-dir>/airlock.db` (SQLite, WAL), its
//! audit streams in `<data-dir>/audit/`, and on first start writes an admin
//! API key to `<data-dir>/admin.key` (0600). Only one daemon may use a data
//! directory at a time (`<data-dir>/daemon.lock`).
//!
//! Sandboxes outlive the daemon: each has its own supervisor, so stopping or
//! restarting the daemon leaves them running, and the next start adopts
//! them (see `airlock_daemon::reconcile`).

use airlock_api::server::ServerLimits;
use airlock_backend::process::ProcessBackend;
use airlock_backend::Backend;
use airlock_core::AdmissionLimits;
use airlock_daemon::{AuditLimits, Config, Daemon};
use airlock_store::Store;
use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use std::io::Write;
use std::net::SocketAddr;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The descriptor limit the daemon asks for (capped by `fs.nr_open`).
const DESCRIPTORS_WANTED: u64 = 1 << 20;

/// Where state lives unless `--data-dir` says otherwise: `/var/lib/airlock`
/// for root, `$XDG_DATA_HOME/airlock` (or `~/.local/share/airlock`) otherwise.
pub fn default_data_dir() -> PathBuf {
    if rustix::process::geteuid().is_root() {
        return PathBuf::from("/var/lib/airlock");
    }
    if let Some(xdg) = std::env::var_os("XDG_DATA_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(xdg).join("airlock");
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/".into());
    PathBuf::from(home).join(".local/share/airlock")
}

/// Options of `airlock serve`.
#[derive(Args)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:7070", env = "AIRLOCK_LISTEN")]
    listen: SocketAddr,
    /// State directory (database, audit streams, admin key).
    #[arg(long, env = "AIRLOCK_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// Live sandboxes in all.
    #[arg(long, default_value_t = AdmissionLimits::default().max_live_total)]
    max_live: usize,
    /// Live sandboxes per API key.
    #[arg(long, default_value_t = AdmissionLimits::default().max_live_per_key)]
    max_live_per_key: usize,
    /// Sandbox creations running at once.
    #[arg(long, default_value_t = AdmissionLimits::default().max_concurrent_creates)]
    max_concurrent_creates: usize,
    /// Creations waiting for a slot before the API answers 429.
    #[arg(long, default_value_t = AdmissionLimits::default().max_queue)]
    max_queue: usize,
    /// Lifetime of a sandbox whose request names none (e.g. 300s, 5m).
    #[arg(long, default_value = "300s", value_parser = parse_duration)]
    default_timeout: Duration,
    /// How long a paused sandbox is kept (its timeout while paused; a
    /// resume gives it its own timeout again).
    #[arg(long, default_value = "24h", value_parser = parse_duration)]
    paused_ttl: Duration,
    /// The zstd level snapshots' archives are written at (-7 to 19;
    /// higher is smaller and slower).
    #[arg(long, default_value_t = airlock_layers::keep::DEFAULT_LEVEL, value_parser = clap::value_parser!(i32).range(-7..=19), allow_negative_numbers = true)]
    snapshot_zstd_level: i32,
    /// How many snapshots one API key may keep; past it a snapshot is
    /// refused (403) until one is deleted.
    #[arg(long, default_value_t = airlock_daemon::DEFAULT_SNAPSHOT_QUOTA.count)]
    max_snapshots_per_key: u64,
    /// How many bytes one API key's snapshots may take together (their
    /// changes and archives, e.g. 20G).
    #[arg(long, default_value = "20G", value_parser = parse_size)]
    max_snapshot_bytes_per_key: u64,
    /// How many sandboxes one API key may keep paused with only their
    /// files (they hold their layers on disk, and nothing else); past it
    /// such a pause is refused (403) until one is resumed or deleted.
    #[arg(long, default_value_t = airlock_daemon::DEFAULT_MAX_FILES_ONLY_PAUSED)]
    max_files_only_paused_per_key: u64,
    /// Largest file upload (e.g. 1G).
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    max_upload: u64,
    /// The quota of a named volume whose create names none (e.g. 1G).
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    volume_size: u64,
    /// The largest quota a named volume may have (e.g. 64G); they are
    /// subvolumes of the disk store, whose size bounds them all together.
    #[arg(long, default_value = "64G", value_parser = parse_size)]
    max_volume_size: u64,
    /// How many named volumes one API key may keep.
    #[arg(long, default_value_t = 100)]
    max_volumes_per_key: u64,
    /// Where sandboxes' writable layers live: `disk` (a quota per sandbox
    /// on the disk store) or `memory` (a tmpfs counted against the
    /// sandbox's memory limit).
    #[arg(long, value_enum, default_value_t = WritableLayers::Disk)]
    writable_layers: WritableLayers,
    /// Size of the disk store's image when the data directory is not
    /// btrfs (a sparse file: it takes what the layers hold).
    #[arg(long, default_value = "64G", value_parser = parse_size)]
    disk_store_size: u64,
    /// How often unreferenced layers and abandoned imports are collected
    /// (also once at start).
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    gc_interval: Duration,
    /// Warm pools to keep (set at start, kept in the state database like
    /// those set through the API): a JSON array of
    /// `{"name", "template", "tier"?, "networked"?, "min_ready", "max"?, "refill"?}`.
    #[arg(long, value_name = "FILE")]
    pools: Option<PathBuf>,
    /// Where sandboxes' `/mnt/user-data/outputs` are copied: `file:///dir`
    /// or `s3://bucket/prefix` (credentials and endpoint from the AWS_*
    /// environment); default `<data-dir>/outputs`.
    #[arg(long, value_name = "URL")]
    outputs_store: Option<String>,
    /// How long collected outputs are kept (e.g. 7d): the collector
    /// deletes older ones.
    #[arg(long, default_value = "7d", value_parser = parse_duration)]
    outputs_ttl: Duration,
    /// Most bytes one collection of outputs copies (e.g. 1G).
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    outputs_max_bytes: u64,
    /// Largest image `airlock template import` may send, or a pull may
    /// fetch (its compressed layers), e.g. 16G.
    #[arg(long, default_value = "16G", value_parser = parse_size)]
    max_image: u64,
    /// A registry (`HOST[:PORT]`) or a repository prefix on one
    /// (`HOST[:PORT]/ORG`) that `template pull` and e2b `from_image` may
    /// pull from, over HTTPS (repeatable). None by default: pulls are
    /// refused.
    #[arg(long = "registry", value_name = "HOST[:PORT][/PREFIX]")]
    registry: Vec<airlock_registry::Allowed>,
    /// A registry reached over plain HTTP, e.g. one on loopback
    /// (repeatable); it is allowed too.
    #[arg(long = "insecure-registry", value_name = "HOST[:PORT]")]
    insecure_registry: Vec<airlock_registry::Allowed>,
    /// Registry credentials: a file as `docker login` or `skopeo login`
    /// writes it (`{"auths": {HOST: {"auth": BASE64}}}`).
    #[arg(long, value_name = "FILE")]
    registry_auth: Option<PathBuf>,
    /// A cosign public key (PEM, as `cosign generate-key-pair` writes
    /// cosign.pub): every pulled image must carry a signature by it.
    #[arg(long, value_name = "FILE")]
    image_signing_key: Option<PathBuf>,
    /// What the sandboxes running template build steps (RUN) may reach:
    /// `none` (the default) or `open`.
    #[arg(
        long,
        value_enum,
        value_name = "none|open",
        conflicts_with = "build_allow"
    )]
    build_net: Option<crate::net_args::NetMode>,
    /// Let build steps reach what RULE matches (repeatable), e.g. the
    /// package mirror: `deb.debian.org:80`; rules as `airlock run --allow`
    /// takes them.
    #[arg(long = "build-allow", value_name = "RULE")]
    build_allow: Vec<airlock_policy::Rule>,
    /// Longest one build step may run.
    #[arg(long, default_value = "1h", value_parser = parse_duration)]
    build_step_timeout: std::time::Duration,
    /// How long a build cache entry nobody used keeps its layer before
    /// the collector evicts it.
    #[arg(long, default_value = "7d", value_parser = parse_duration)]
    build_cache_ttl: std::time::Duration,
    /// The gvisor tier's runtime: gVisor's runsc (a name is looked up in
    /// PATH).
    #[arg(long, default_value = "runsc", value_name = "BINARY")]
    gvisor_runtime: PathBuf,
    /// The platform gVisor's kernel runs on: `ptrace` works on any host;
    /// `kvm` needs hardware virtualization (where /dev/kvm is a software
    /// hypervisor it spins, and the tier's probe says so).
    #[arg(long, default_value = "ptrace", value_name = "PLATFORM")]
    gvisor_platform: String,
    /// What a pause keeping memory does on the gvisor tier: `checkpoint`
    /// saves the sandbox's memory to disk and lets its processes go (a
    /// paused sandbox holds no RAM; resume restores it), `freeze` stops it
    /// in place as the other tiers do.
    #[arg(long, value_enum, default_value_t = GvisorPause::Checkpoint)]
    gvisor_pause: GvisorPause,
    /// DeerFlow's base directory on this host (its `DEER_FLOW_HOST_BASE_DIR`):
    /// the AIO dialect mounts a thread's sandbox `/mnt/user-data` from
    /// `DIR/users/{user}/threads/{thread}/user-data` and the skills from
    /// `DIR/skills_view`, and takes DeerFlow's extra mounts only from
    /// under it (none without it).
    #[arg(long, value_name = "DIR")]
    deerflow_base_dir: Option<PathBuf>,
    /// The template DeerFlow's sandboxes start from (default `host`); its
    /// own tier, if it records one, applies (else `--default-tier`).
    #[arg(long, value_name = "NAME")]
    deerflow_template: Option<String>,
    /// The oci tier's runtime (a name is looked up in PATH).
    #[arg(long, default_value = "runc", value_name = "BINARY")]
    oci_runtime: PathBuf,
    /// Host directory under which API clients may bind-mount paths
    /// (repeatable). None by default.
    #[arg(long = "allow-mount", value_name = "DIR")]
    allow_mount: Vec<PathBuf>,
    /// `NAME=IP` the sandboxes' egress resolves NAME to, instead of asking
    /// the host's resolver (repeatable; for tests and air-gapped hosts).
    /// With any given, the host's resolver is not used at all.
    #[arg(long = "egress-host", value_name = "NAME=IP")]
    egress_host: Vec<String>,
    /// The resolver (`IP:PORT`) the sandboxes' egress asks instead of the
    /// host's `/etc/resolv.conf`.
    #[arg(long = "egress-dns", value_name = "IP:PORT")]
    egress_dns: Option<std::net::SocketAddr>,
    /// Network of an e2b sandbox whose create leaves internet access on
    /// (the SDKs' default): `none` (airlock denies by default) or `open`.
    #[arg(
        long = "e2b-internet",
        value_enum,
        value_name = "none|open",
        default_value = "none"
    )]
    e2b_internet: crate::net_args::NetMode,
    /// The domain under which sandboxes' ports are reached by name:
    /// `PORT-SANDBOXID.DOMAIN` on this daemon's listener (the wildcard DNS
    /// record, and TLS in front when wanted, are the operator's). It is
    /// what e2b's `get_host` answers. Without it ports are reached at
    /// `/v1/sandboxes/ID/ports/PORT/` only.
    #[arg(long, value_name = "DOMAIN", value_parser = parse_sandbox_domain)]
    sandbox_domain: Option<String>,
    /// The tier of a create that names none (native `tier`, e2b metadata
    /// `airlock.tier`) and whose template has none of its own.
    #[arg(long, value_name = "process|oci|gvisor", default_value = "process", value_parser = parse_tier)]
    default_tier: airlock_policy::Tier,
    /// `TEMPLATE=TIER`: the tier of a create on TEMPLATE that names none
    /// (repeatable), e.g. `--template-tier base=gvisor`.
    #[arg(long = "template-tier", value_name = "TEMPLATE=TIER", value_parser = parse_template_tier)]
    template_tier: Vec<(String, airlock_policy::Tier)>,
    /// Size past which an audit stream file (`<data-dir>/audit/*.jsonl`)
    /// rotates.
    #[arg(long, default_value = "64M", value_parser = parse_size)]
    audit_file_size: u64,
    /// Rotated files kept per audit stream (`.1` … `.N`; older ones go).
    #[arg(long, default_value_t = AuditLimits::default().files_kept)]
    audit_files_kept: u32,
    /// Security events of one kind about one sandbox written in full per
    /// 10 s interval; the rest are summed into one `audit.suppressed`.
    #[arg(long, default_value_t = AuditLimits::default().full_per_kind)]
    audit_events_in_full: u32,
    /// How long audit events stay queryable in the state database.
    #[arg(long, default_value = "30d", value_parser = parse_duration)]
    audit_retention: Duration,
    /// HTTP connections open at once; past it an idle or unauthenticated
    /// one makes room, else the new one is refused (503).
    #[arg(long, default_value_t = ServerLimits::default().max_connections)]
    max_connections: usize,
    /// HTTP connections open at once from one address (same rule).
    #[arg(long, default_value_t = ServerLimits::default().max_per_peer)]
    max_connections_per_peer: usize,
    /// Time a client has to send a request head, and a keep-alive
    /// connection may stay idle.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    header_timeout: Duration,
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    airlock_policy::parse_duration(text).map_err(|e| e.to_string())
}

fn parse_size(text: &str) -> Result<u64, String> {
    airlock_policy::parse_size(text).map_err(|e| e.to_string())
}

/// Creates `dir` (and parents) and makes it private.
/// The registries pulls may use, from the flags.
fn registries(args: &ServeArgs) -> anyhow::Result<airlock_registry::Registries> {
    let mut registries =
        airlock_registry::Registries::new(args.registry.clone(), args.insecure_registry.clone());
    if let Some(path) = &args.registry_auth {
        let credentials = airlock_registry::read_auth_file(path)
            .map_err(|e| anyhow::anyhow!(crate::error_chain(&e)))?;
        registries = registries.with_credentials(credentials);
    }
    if let Some(path) = &args.image_signing_key {
        let trust = airlock_registry::Trust::from_file(path)
            .map_err(|e| anyhow::anyhow!(crate::error_chain(&e)))?;
        registries = registries.with_trust(trust);
    }
    Ok(registries)
}

fn private_dir(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .with_context(|| format!("cannot make {} private", dir.display()))
}

/// How long a starting daemon waits for the data directory's lock.
const LOCK_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// Takes the data directory's lock, or says who holds it.
fn lock_data_dir(dir: &Path) -> anyhow::Result<std::fs::File> {
    let path = dir.join("daemon.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(&path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    // A daemon killed a moment ago may still have a child between fork and
    // exec holding a copy of its descriptor (the lock goes at that exec), so
    // a restart waits a little before it calls the directory taken.
    let deadline = std::time::Instant::now() + LOCK_GRACE;
    while rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_err() {
        if std::time::Instant::now() >= deadline {
            bail!(
                "another airlock daemon is using {}; stop it first",
                dir.display()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    Ok(file)
}

fn open_store(dir: &Path) -> anyhow::Result<Store> {
    private_dir(dir)?;
    let path = dir.join("airlock.db");
    Store::open(&path).with_context(|| format!("cannot open the state database {}", path.display()))
}

/// The tag that marks this data directory's sandboxes on the host (random,
/// made on first start, kept in `<data-dir>/instance`).
fn instance_tag(dir: &Path) -> anyhow::Result<String> {
    let path = dir.join("instance");
    if let Ok(text) = std::fs::read_to_string(&path) {
        let tag = text.trim();
        if (1..=32).contains(&tag.len()) && tag.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Ok(tag.to_owned());
        }
    }
    let tag: String = airlock_store::new_secret("")?.chars().take(16).collect();
    std::fs::write(&path, format!("{tag}\n"))
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(tag)
}

/// Creates the admin key on first start and writes it to `admin.key`.
fn bootstrap_admin_key(store: &Store, dir: &Path) -> anyhow::Result<Option<PathBuf>> {
    if store.count_keys()? > 0 {
        return Ok(None);
    }
    let (_, secret) = store.create_key("admin", true)?;
    let path = dir.join("admin.key");
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(&path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    writeln!(file, "{secret}")?;
    Ok(Some(path))
}

pub fn main(args: ServeArgs) -> ExitCode {
    match serve(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("airlock: error: {e:#}");
            ExitCode::from(crate::EXIT_INTERNAL)
        }
    }
}

fn serve(args: ServeArgs) -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("AIRLOCK_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let data_dir = args.data_dir.clone().unwrap_or_else(default_data_dir);
    private_dir(&data_dir)?;
    let _lock = lock_data_dir(&data_dir)?;
    let store = open_store(&data_dir)?;
    if let Some(path) = bootstrap_admin_key(&store, &data_dir)? {
        eprintln!("airlock: created an admin API key in {}", path.display());
    }
    // Supervisors and the egress worker are the small `airlock` binary
    // beside this one.
    let exe = crate::sibling_binary("airlock").context("cannot find the airlock binary")?;
    if !exe.is_file() {
        bail!(
            "{} is missing: airlockd starts its sandboxes' supervisors with the airlock binary installed beside it",
            exe.display()
        );
    }
    let tag = instance_tag(&data_dir)?;
    let mut backend = ProcessBackend::new(exe.clone(), tag.clone());
    backend.probe()?;
    let mut gvisor = ProcessBackend::oci(
        exe.clone(),
        tag.clone(),
        airlock_oci::Runtime::gvisor(
            crate::in_path(&args.gvisor_runtime),
            args.gvisor_platform.clone(),
        ),
    );
    gvisor = gvisor.with_checkpoints(args.gvisor_pause == GvisorPause::Checkpoint);
    let mut oci = ProcessBackend::oci(
        exe.clone(),
        tag.clone(),
        airlock_oci::Runtime::runc(crate::in_path(&args.oci_runtime)),
    );
    let mut config = Config::new(data_dir.clone());
    if args.writable_layers == WritableLayers::Disk {
        let disk = airlock_jail::disk::DiskStore::open(&data_dir, args.disk_store_size)
            .map_err(|e| anyhow::anyhow!(crate::error_chain(&e)))
            .context(
                "cannot set up the disk store for sandboxes' writable layers (install btrfs-progs, or serve with --writable-layers memory)",
            )?;
        config.disk_store = Some(disk.root().to_owned());
        gvisor = gvisor.with_disk(disk.clone());
        oci = oci.with_disk(disk.clone());
        backend = backend.with_disk(disk);
    }
    config.admission = AdmissionLimits {
        max_live_total: args.max_live,
        max_live_per_key: args.max_live_per_key,
        max_concurrent_creates: args.max_concurrent_creates,
        max_queue: args.max_queue,
    };
    config.default_timeout = args.default_timeout;
    config.paused_ttl = args.paused_ttl;
    config.snapshot_zstd_level = args.snapshot_zstd_level;
    config.outputs_store = args.outputs_store.clone();
    config.outputs_max_bytes = args.outputs_max_bytes;
    config.outputs_ttl = args.outputs_ttl;
    config.snapshot_quota = airlock_store::SnapshotQuota {
        count: args.max_snapshots_per_key,
        bytes: args.max_snapshot_bytes_per_key,
    };
    config.max_files_only_paused = args.max_files_only_paused_per_key;
    config.max_upload_bytes = args.max_upload;
    config.volume_default_bytes = args.volume_size;
    config.volume_max_bytes = args.max_volume_size;
    config.max_volumes_per_key = args.max_volumes_per_key;
    config.max_image_bytes = args.max_image;
    config.registries = std::sync::Arc::new(registries(&args)?);
    config.egress_hosts = args.egress_host.clone();
    config.egress_dns = args.egress_dns;
    config.e2b_internet = args.e2b_internet == crate::net_args::NetMode::Open;
    config.sandbox_domain = args.sandbox_domain.clone();
    config.default_tier = args.default_tier;
    config.template_tiers = args.template_tier.iter().cloned().collect();
    config.build_network = crate::net_args::NetArgs {
        net: args.build_net,
        allow: args.build_allow.clone(),
    }
    .policy();
    config.build_step_timeout = args.build_step_timeout;
    config.build_cache_ttl = args.build_cache_ttl;
    config.egress_worker = Some(crate::egress_worker::spawn(exe));
    config.audit = AuditLimits {
        file_bytes: args.audit_file_size,
        files_kept: args.audit_files_kept,
        retention: args.audit_retention,
        full_per_kind: args.audit_events_in_full,
        full_total: AuditLimits::default()
            .full_total
            .max(args.audit_events_in_full),
        ..AuditLimits::default()
    };
    config.mount_roots = args
        .allow_mount
        .iter()
        .map(|d| {
            d.canonicalize()
                .with_context(|| format!("--allow-mount {}", d.display()))
        })
        .collect::<anyhow::Result<_>>()?;
    // DeerFlow's base directory is one the AIO dialect mounts from (only
    // the paths its provisioner allows).
    if let Some(base) = &args.deerflow_base_dir {
        config.mount_roots.push(
            base.canonicalize()
                .with_context(|| format!("--deerflow-base-dir {}", base.display()))?,
        );
    }

    // Every connection, sandbox channel and egress socket is a descriptor.
    // The daemon lifts its soft limit to the hard one (and the hard one, if
    // it may, to DESCRIPTORS_WANTED); half of what it gets is for HTTP
    // connections, the other half for sandboxes.
    let descriptors = airlock_api::server::raise_descriptor_limit(DESCRIPTORS_WANTED);
    let max_connections = args
        .max_connections
        .min(usize::try_from(descriptors / 2).unwrap_or(usize::MAX))
        .max(1);
    if max_connections < args.max_connections {
        tracing::warn!(
            "RLIMIT_NOFILE is {descriptors}: serving at most {max_connections} connections, not {} (raise the limit, e.g. LimitNOFILE= in a systemd unit)",
            args.max_connections
        );
    }
    let limits = ServerLimits {
        max_connections,
        max_per_peer: args.max_connections_per_peer.min(max_connections),
        header_timeout: args.header_timeout,
        after_burst: release_freed_memory,
        ..ServerLimits::default()
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async move {
        let candidates: Vec<Arc<dyn Backend>> =
            vec![Arc::new(backend), Arc::new(oci), Arc::new(gvisor)];
        let tiers = airlock_daemon::tiers::Tiers::probe(candidates);
        for status in tiers.statuses() {
            match &status.reason {
                None => tracing::info!(tier = status.tier.as_str(), "tier available"),
                Some(reason) => {
                    tracing::info!(tier = status.tier.as_str(), "tier unavailable: {reason}")
                }
            }
        }
        let daemon = Daemon::with_tiers(config, Arc::new(Mutex::new(store)), tiers)?;
        let report = daemon.reconcile().await;
        tracing::info!(
            adopted = report.adopted.len(),
            reaped = report.reaped.len(),
            pending = report.pending.len(),
            stopped_unrecorded = report.stopped_unrecorded.len(),
            removed = report.removed.len(),
            "reconciled recorded sandboxes with the host"
        );
        tokio::spawn(daemon.clone().run_reaper());
        tokio::spawn(daemon.clone().run_collector(args.gc_interval));
        if let Some(file) = &args.pools {
            let text = std::fs::read_to_string(file)
                .with_context(|| format!("cannot read {}", file.display()))?;
            let pools: Vec<airlock_daemon::pools::NamedPoolSettings> = serde_json::from_str(&text)
                .with_context(|| format!("{} is not a list of pools", file.display()))?;
            daemon
                .set_pools_from(pools)
                .with_context(|| format!("cannot set the pools of {}", file.display()))?;
        }
        tokio::spawn(daemon.clone().run_pools());
        daemon.warm();
        let listener = airlock_api::server::listen(args.listen)
            .with_context(|| format!("cannot listen on {}", args.listen))?;
        let local = listener.local_addr()?;
        eprintln!(
            "airlock: serving on http://{local} (data in {})",
            data_dir.display()
        );
        let dialects = airlock_api::Dialects {
            aio: airlock_api::aio::Settings {
                base_dir: args.deerflow_base_dir.clone(),
                template: args.deerflow_template.clone(),
            },
        };
        airlock_api::server::serve(
            listener,
            daemon.clone(),
            limits,
            dialects,
            shutdown_signal(),
        )
        .await;
        daemon.shutdown();
        daemon.drain_pools().await;
        // The socket directory goes when no sandbox uses it any more.
        let _ = std::fs::remove_dir(
            airlock_jail::runtime::RuntimeDir::system()
                .sockets()
                .join(&tag),
        );
        tracing::info!("stopped; sandboxes keep running and are adopted at the next start");
        anyhow::Ok(())
    })
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

/// `airlock keys …`: manage API keys in the state database directly (the
/// daemon may be running or not).
#[derive(Subcommand)]
pub enum KeysCommand {
    /// Create a key and print its secret (shown once).
    Create {
        /// A label for the key.
        name: String,
        /// May manage keys and see every sandbox.
        #[arg(long)]
        admin: bool,
        #[command(flatten)]
        common: KeysCommon,
    },
    /// List keys (never their secrets).
    List {
        #[command(flatten)]
        common: KeysCommon,
    },
    /// Revoke a key by id (`key-…`).
    Revoke {
        id: String,
        #[command(flatten)]
        common: KeysCommon,
    },
}

/// Options of every `keys` command.
#[derive(Args)]
pub struct KeysCommon {
    /// State directory of the daemon.
    #[arg(long, env = "AIRLOCK_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// One JSON document instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn keys(command: KeysCommand) -> ExitCode {
    match run_keys(command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("airlock: error: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// The daemon's existing state database in `--data-dir` (or its default).
/// Keys commands never create one: a key written into a database no
/// daemon reads would be printed and then refused.
fn existing_store(data_dir: Option<PathBuf>) -> anyhow::Result<Store> {
    let (dir, chosen) = match data_dir {
        Some(dir) => (dir, "--data-dir / AIRLOCK_DATA_DIR"),
        None => (default_data_dir(), "the default"),
    };
    let path = dir.join("airlock.db");
    if !path.is_file() {
        bail!(
            "no airlock state database in {} ({chosen}); nothing was created. Point at the \
             running daemon's data directory with --data-dir DIR or AIRLOCK_DATA_DIR=DIR \
             (the one `airlock serve` was started with), or start the daemon once there first",
            dir.display()
        );
    }
    Store::open(&path).with_context(|| format!("cannot open the state database {}", path.display()))
}

fn run_keys(command: KeysCommand) -> anyhow::Result<()> {
    match command {
        KeysCommand::Create {
            name,
            admin,
            common,
        } => {
            let store = existing_store(common.data_dir)?;
            let (row, secret) = store.create_key(&name, admin)?;
            if common.json {
                println!(
                    "{}",
                    serde_json::json!({"id": row.id, "name": row.name, "admin": row.is_admin, "key": secret})
                );
            } else {
                println!("{secret}");
                eprintln!(
                    "airlock: created key {} ({name}); the secret above is shown once",
                    row.id
                );
            }
        }
        KeysCommand::List { common } => {
            let store = existing_store(common.data_dir)?;
            let keys = store.list_keys()?;
            if common.json {
                println!("{}", serde_json::to_string(&keys)?);
            } else {
                println!("{:<18} {:<6} {:<8} NAME", "ID", "ADMIN", "REVOKED");
                for key in keys {
                    println!(
                        "{:<18} {:<6} {:<8} {}",
                        key.id,
                        if key.is_admin { "yes" } else { "no" },
                        if key.revoked_at.is_some() {
                            "yes"
                        } else {
                            "no"
                        },
                        key.name
                    );
                }
            }
        }
        KeysCommand::Revoke { id, common } => {
            let store = existing_store(common.data_dir)?;
            store
                .revoke_key(&id)
                .with_context(|| format!("cannot revoke {id}"))?;
            if common.json {
                println!("{}", serde_json::json!({"revoked": id}));
            } else {
                println!("revoked {id}");
            }
        }
    }
    Ok(())
}

/// Hands back to the system the memory the allocator kept after a burst of
/// connections: glibc keeps freed heap in its arenas (about 130 MiB after
/// 20,000 connections were held), and a daemon flooded once should not hold
/// that for the rest of its life.
fn release_freed_memory() {
    // SAFETY: malloc_trim only releases free memory of the allocator's own
    // arenas, under the allocator's locks; it may be called from any thread
    // at any time and touches no memory the program holds.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// `--gvisor-pause`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum GvisorPause {
    Checkpoint,
    Freeze,
}

/// `--writable-layers`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum WritableLayers {
    Disk,
    Memory,
}

/// A tier's name (`process`, `oci`, `gvisor`).
fn parse_tier(text: &str) -> Result<airlock_policy::Tier, String> {
    text.parse()
        .map_err(|e: airlock_policy::UnknownTier| e.to_string())
}

/// A sandbox domain, made canonical.
fn parse_sandbox_domain(text: &str) -> Result<String, String> {
    airlock_api::ports::normalize_domain(text)
}

/// `TEMPLATE=TIER`.
fn parse_template_tier(text: &str) -> Result<(String, airlock_policy::Tier), String> {
    let (template, tier) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?} is not TEMPLATE=TIER"))?;
    if template.is_empty() {
        return Err(format!("{text:?} names no template"));
    }
    Ok((template.to_owned(), parse_tier(tier)?))
}
