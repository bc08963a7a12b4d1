//! [`SandboxSpec`] and its parts.

use crate::network::{NetworkPolicy, TooManyRules};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

/// Default memory limit: 512 MiB.
pub const DEFAULT_MEMORY_BYTES: u64 = 512 << 20;
/// Default CPU quota: one CPU.
pub const DEFAULT_CPU_MILLIS: u32 = 1000;
/// Default cap on processes and threads.
pub const DEFAULT_PIDS: u32 = 256;
/// Default size of the private writable layer (root upper, /tmp, /home/user).
pub const DEFAULT_DISK_BYTES: u64 = 1 << 30;
/// The writable layer may fill at most this share of the memory limit
/// (numerator over 4): it is a tmpfs whose pages count against the memory
/// cgroup, and the remaining quarter is headroom for the agent and the
/// sandbox's processes, so a full layer answers ENOSPC instead of an OOM
/// kill of the whole sandbox.
pub const LAYER_MEMORY_QUARTERS: u64 = 3;
/// Default open-file limit of every process in the sandbox.
pub const DEFAULT_NOFILE: u64 = 1024;
/// Default cap on what one exec may print, per stream.
pub const DEFAULT_OUTPUT_BYTES: u64 = 16 << 20;
/// Default wall-clock lifetime of a sandbox.
pub const DEFAULT_TIMEOUT_MS: u64 = 300_000;

/// Paths a user mount may not cover: the kernel interfaces and the generated
/// system directories the jail relies on.
const RESERVED_TARGETS: &[&str] = &[
    "/proc", "/dev", "/sys", "/etc", "/usr", "/bin", "/sbin", "/lib", "/lib64",
];

/// Everything a sandbox is and may do. Missing fields take the safe default
/// (no network, the limits above); unknown fields are refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SandboxSpec {
    /// The root filesystem.
    pub template: Template,
    /// Which isolation tier runs the sandbox.
    pub tier: Tier,
    /// Resource limits.
    pub limits: Limits,
    /// Host directories or files made visible inside.
    pub mounts: Vec<BindMount>,
    /// Named volumes mounted inside (see [`VolumeMount`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<VolumeMount>,
    /// What the sandbox may reach on the network.
    pub network: NetworkPolicy,
    /// The environment of every process; nothing is inherited from the host.
    pub env: BTreeMap<String, String>,
    /// The identity processes run as unless a call says otherwise.
    pub user: RunAs,
    /// Working directory inside the sandbox; `/home/user` when absent.
    pub cwd: Option<String>,
    /// Wall-clock lifetime in milliseconds.
    pub timeout_ms: u64,
    /// Switches for the enforcement layers.
    pub security: Security,
    /// What its timeout does, and whether traffic wakes it when paused.
    pub lifecycle: Lifecycle,
    /// Whether `/mnt/user-data/outputs` is copied to the daemon's object
    /// store when the sandbox is torn down (for any reason).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub collect_outputs: bool,
    /// Whether the ports its processes listen on answer requests from
    /// outside without a token (e2b's `allowPublicTraffic`); otherwise a
    /// forwarded request needs the sandbox's traffic or access token or an
    /// API key that may use it.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub public_ports: bool,
    /// The `Host` requests to its ports go in with, `${PORT}` standing for
    /// the port (e2b's `maskRequestHost`, e.g. `localhost:${PORT}` for a
    /// dev server that answers only its own name); absent, the `Host` the
    /// client sent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port_host_mask: Option<String>,
}

/// What happens to a sandbox at its timeout.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnTimeout {
    /// It is killed and everything it held released.
    #[default]
    Kill,
    /// It is paused, memory kept, for the daemon's paused TTL.
    Pause,
}

/// A sandbox's lifecycle beyond its timeout.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Lifecycle {
    /// What its timeout does.
    pub on_timeout: OnTimeout,
    /// Whether a call into it while paused resumes it first (only with
    /// `on_timeout: pause`, as e2b has it).
    pub auto_resume: bool,
    /// Whether the pause at its timeout keeps only its files: its
    /// processes end, and a resume starts fresh ones on the same files
    /// (e2b's filesystem-only pause). Only with `on_timeout: pause`.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub files_only: bool,
}

impl Default for SandboxSpec {
    fn default() -> Self {
        SandboxSpec {
            template: Template::Host,
            tier: Tier::Process,
            limits: Limits::default(),
            mounts: Vec::new(),
            volumes: Vec::new(),
            network: NetworkPolicy::None,
            env: BTreeMap::new(),
            user: RunAs::User,
            cwd: None,
            timeout_ms: DEFAULT_TIMEOUT_MS,
            security: Security::default(),
            lifecycle: Lifecycle::default(),
            collect_outputs: false,
            public_ports: false,
            port_host_mask: None,
        }
    }
}

/// Where the sandbox's root filesystem comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Template {
    /// Read-only binds of the host's /usr, /bin, /lib*, and a generated /etc
    /// that holds no secrets.
    Host,
    /// A directory holding a root filesystem, used as the read-only lower
    /// layer under a private writable upper.
    Dir { path: PathBuf },
    /// Directories of the layer store stacked read-only, bottom first, under
    /// a private writable upper: an imported, pulled or built template.
    /// Their files keep their owners (root-owned files are root inside).
    Layers { layers: Vec<PathBuf> },
}

/// Most layers one template may stack (Docker's own limit is 127).
pub const MAX_LAYERS: usize = 128;

/// Isolation tiers, weakest boundary first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Tier {
    /// Namespaces, seccomp, landlock, cgroups and rlimits around a process tree.
    Process,
    /// A standard OCI runtime (`runc`) running the sandbox's bundle: the
    /// host's kernel, confined by the runtime's namespaces and cgroups.
    Oci,
    /// gVisor (`runsc`) running the same bundle: a kernel of its own, in
    /// user space, between the sandbox and the host's.
    Gvisor,
}

/// A name that is not one of [`Tier::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a tier of airlock's (process, oci, gvisor)")]
pub struct UnknownTier(pub String);

impl std::str::FromStr for Tier {
    type Err = UnknownTier;

    fn from_str(name: &str) -> Result<Tier, UnknownTier> {
        Tier::ALL
            .into_iter()
            .find(|tier| tier.as_str() == name)
            .ok_or_else(|| UnknownTier(name.to_owned()))
    }
}

impl Tier {
    /// Every tier, weakest boundary first.
    pub const ALL: [Tier; 3] = [Tier::Process, Tier::Oci, Tier::Gvisor];

    /// The tier's name, as the API spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Process => "process",
            Tier::Gvisor => "gvisor",
            Tier::Oci => "oci",
        }
    }
}

/// Resource limits of one sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Memory cgroup limit, bytes. A writable layer in memory counts
    /// against it.
    pub memory_bytes: u64,
    /// CPU quota in thousandths of a CPU.
    pub cpu_millis: u32,
    /// Maximum number of tasks (processes and threads).
    pub pids: u32,
    /// Size of the private writable layer, bytes, as asked for; the layer
    /// gets [`Limits::writable_layer_bytes`].
    pub disk_bytes: u64,
    /// RLIMIT_NOFILE of every process.
    pub nofile: u64,
    /// Per-exec output cap per stream, bytes.
    pub output_bytes: u64,
    /// Where the writable layer lives.
    pub layer: LayerBacking,
}

/// Where a sandbox's writable layer lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerBacking {
    /// A tmpfs: memory, counted against the sandbox's memory limit (what
    /// `airlock run` and a daemon without a disk store use).
    #[default]
    Memory,
    /// A subvolume of the daemon's disk store under a quota of
    /// `disk_bytes` (`airlock_jail::disk`).
    Disk,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            memory_bytes: DEFAULT_MEMORY_BYTES,
            cpu_millis: DEFAULT_CPU_MILLIS,
            pids: DEFAULT_PIDS,
            disk_bytes: DEFAULT_DISK_BYTES,
            nofile: DEFAULT_NOFILE,
            output_bytes: DEFAULT_OUTPUT_BYTES,
            layer: LayerBacking::Memory,
        }
    }
}

/// A host path bound into the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BindMount {
    /// Absolute host path; must exist when the sandbox starts.
    pub source: PathBuf,
    /// Absolute path inside the sandbox.
    pub target: String,
    /// Mounted read-only. The CLI default is read-write, as `docker -v` is.
    pub read_only: bool,
}

/// A named volume mounted into the sandbox: a directory of the daemon's
/// disk store that outlives sandboxes. Its files keep the owners the
/// sandbox gives them (uid 1000 is `user` in every sandbox it is mounted
/// in, whatever host ids the tier maps), and it holds at most its quota.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VolumeMount {
    /// The volume's id.
    pub volume: String,
    /// Where its files are on the host (the daemon fills it in).
    pub source: PathBuf,
    /// Absolute path inside the sandbox.
    pub target: String,
    /// Mounted read-only.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub read_only: bool,
}

impl BindMount {
    /// Parses the CLI form `HOST:SANDBOX[:ro|:rw]`.
    pub fn parse(text: &str) -> Result<BindMount, SpecError> {
        let bad = || SpecError::MountSyntax(text.to_owned());
        let mut parts = text.split(':');
        let source = parts.next().filter(|s| !s.is_empty()).ok_or_else(bad)?;
        let target = parts.next().filter(|s| !s.is_empty()).ok_or_else(bad)?;
        let read_only = match parts.next() {
            None | Some("rw") => false,
            Some("ro") => true,
            Some(_) => return Err(bad()),
        };
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(BindMount {
            source: PathBuf::from(source),
            target: target.to_owned(),
            read_only,
        })
    }
}

/// The identity a process runs as inside the sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunAs {
    /// uid/gid 1000, home /home/user, no capabilities.
    User,
    /// uid 0 inside the sandbox's user namespace only; on the host it is an
    /// unprivileged uid. Keeps a small set of capabilities valid only there.
    Root,
}

impl RunAs {
    /// The identity's home directory inside the sandbox.
    pub fn home(self) -> &'static str {
        match self {
            RunAs::User => "/home/user",
            RunAs::Root => "/root",
        }
    }

    /// The identity's user name inside the sandbox.
    pub fn name(self) -> &'static str {
        match self {
            RunAs::User => "user",
            RunAs::Root => "root",
        }
    }
}

/// Switches for enforcement layers. Turning one off is named as the danger it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct Security {
    /// Run without Landlock when the kernel lacks it, instead of refusing to start.
    pub unsafe_allow_no_landlock: bool,
}

/// A spec that cannot be run as written.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SpecError {
    #[error("memory limit must be at least 8M, got {0} bytes")]
    MemoryTooSmall(u64),
    #[error("cpu limit must be between 0.01 and 1024 CPUs")]
    CpusOutOfRange,
    #[error("pids limit must be between 2 and 4194304, got {0}")]
    PidsOutOfRange(u32),
    #[error("disk limit must be at least 1M, got {0} bytes")]
    DiskTooSmall(u64),
    #[error("nofile limit must be between 16 and 1048576, got {0}")]
    NofileOutOfRange(u64),
    #[error("output limit must be at least 1K, got {0} bytes")]
    OutputTooSmall(u64),
    #[error("timeout must be between 1ms and 24h")]
    TimeoutOutOfRange,
    #[error("auto_resume needs on_timeout: pause (a killed sandbox has nothing to resume)")]
    AutoResumeWithoutPause,
    #[error("lifecycle.files_only needs on_timeout: pause (it says what the pause at the timeout keeps)")]
    FilesOnlyWithoutPause,
    #[error("template directory `{0}` must be an absolute path")]
    TemplateNotAbsolute(PathBuf),
    #[error("a template stacks 1 to {MAX_LAYERS} layers, not {0}")]
    LayerCount(usize),
    #[error("mount `{0}` is not HOST:SANDBOX[:ro|:rw]")]
    MountSyntax(String),
    #[error("mount source `{0}` must be an absolute host path")]
    MountSourceNotAbsolute(PathBuf),
    #[error("mount target `{0}` must be an absolute, normalized path without `.` or `..`")]
    MountTargetInvalid(String),
    #[error("mount target `{0}` covers a path the sandbox needs ({1})")]
    MountTargetReserved(String, &'static str),
    #[error("mount target `{0}` is given twice")]
    MountTargetDuplicate(String),
    #[error("{0} volumes are mounted; a sandbox may mount at most 16")]
    TooManyVolumes(usize),
    #[error("environment variable name `{0}` is empty or contains `=` or NUL")]
    EnvName(String),
    #[error("environment variable `{0}` has a NUL byte in its value")]
    EnvValue(String),
    #[error("working directory `{0}` must be an absolute path without NUL")]
    Cwd(String),
    #[error(transparent)]
    TooManyRules(#[from] TooManyRules),
}

/// `PATH` of every process unless the spec's environment sets another.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

impl SandboxSpec {
    /// The whole environment of a process run as `user`: a small login-like
    /// base (PATH, HOME, USER, LOGNAME, SHELL, LANG; with network, the
    /// proxy variables naming the egress proxy, for tools that prefer an
    /// explicit proxy — the same enforcement as without them) overlaid with
    /// the spec's `env`. Nothing comes from the host.
    pub fn process_env(&self, user: RunAs) -> BTreeMap<String, String> {
        let (home, name) = (user.home(), user.name());
        let mut env = BTreeMap::from([
            ("PATH".to_owned(), DEFAULT_PATH.to_owned()),
            ("HOME".to_owned(), home.to_owned()),
            ("USER".to_owned(), name.to_owned()),
            ("LOGNAME".to_owned(), name.to_owned()),
            ("SHELL".to_owned(), "/bin/bash".to_owned()),
            ("LANG".to_owned(), "C.UTF-8".to_owned()),
        ]);
        if !self.network.is_none() {
            let proxy = format!(
                "http://{}:{}",
                crate::network::PROXY_HOST_V4,
                crate::network::PROXY_PORT
            );
            for name in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
                env.insert(name.to_owned(), proxy.clone());
            }
            for name in ["NO_PROXY", "no_proxy"] {
                env.insert(name.to_owned(), "localhost,127.0.0.1,::1".to_owned());
            }
        }
        env.extend(self.env.clone());
        env
    }

    /// Checks every field; the first problem found is returned.
    pub fn validate(&self) -> Result<(), SpecError> {
        self.limits.validate()?;
        if self.timeout_ms == 0 || self.timeout_ms > 24 * 3_600_000 {
            return Err(SpecError::TimeoutOutOfRange);
        }
        if self.lifecycle.auto_resume && self.lifecycle.on_timeout != OnTimeout::Pause {
            return Err(SpecError::AutoResumeWithoutPause);
        }
        if self.lifecycle.files_only && self.lifecycle.on_timeout != OnTimeout::Pause {
            return Err(SpecError::FilesOnlyWithoutPause);
        }
        match &self.template {
            Template::Host => {}
            Template::Dir { path } => {
                if !path.is_absolute() {
                    return Err(SpecError::TemplateNotAbsolute(path.clone()));
                }
            }
            Template::Layers { layers } => {
                if layers.is_empty() || layers.len() > MAX_LAYERS {
                    return Err(SpecError::LayerCount(layers.len()));
                }
                if let Some(path) = layers.iter().find(|p| !p.is_absolute()) {
                    return Err(SpecError::TemplateNotAbsolute(path.clone()));
                }
            }
        }
        let mut seen = Vec::new();
        for mount in &self.mounts {
            mount.validate()?;
            if seen.contains(&mount.target.as_str()) {
                return Err(SpecError::MountTargetDuplicate(mount.target.clone()));
            }
            seen.push(mount.target.as_str());
        }
        if self.volumes.len() > MAX_VOLUMES {
            return Err(SpecError::TooManyVolumes(self.volumes.len()));
        }
        for volume in &self.volumes {
            if !volume.source.is_absolute() {
                return Err(SpecError::MountSourceNotAbsolute(volume.source.clone()));
            }
            check_target(&volume.target)?;
            if seen.contains(&volume.target.as_str()) {
                return Err(SpecError::MountTargetDuplicate(volume.target.clone()));
            }
            seen.push(volume.target.as_str());
        }
        for (name, value) in &self.env {
            if name.is_empty() || name.contains('=') || name.contains('\0') {
                return Err(SpecError::EnvName(name.clone()));
            }
            if value.contains('\0') {
                return Err(SpecError::EnvValue(name.clone()));
            }
        }
        if let Some(cwd) = &self.cwd {
            if !cwd.starts_with('/') || cwd.contains('\0') {
                return Err(SpecError::Cwd(cwd.clone()));
            }
        }
        self.network.validate()?;
        Ok(())
    }
}

impl Limits {
    /// The size the writable layer gets: `disk_bytes` on disk; in memory
    /// at most three quarters of `memory_bytes` ([`LAYER_MEMORY_QUARTERS`]),
    /// because the layer is memory counted against the sandbox's own limit.
    /// Writes past it fail (ENOSPC, EDQUOT on disk) and the sandbox lives
    /// on.
    pub fn writable_layer_bytes(&self) -> u64 {
        match self.layer {
            LayerBacking::Disk => self.disk_bytes,
            LayerBacking::Memory => {
                let cap = self.memory_bytes / 4 * LAYER_MEMORY_QUARTERS;
                self.disk_bytes.min(cap)
            }
        }
    }

    /// Checks each limit against its sane range.
    pub fn validate(&self) -> Result<(), SpecError> {
        if self.memory_bytes < 8 << 20 {
            return Err(SpecError::MemoryTooSmall(self.memory_bytes));
        }
        if !(10..=1_024_000).contains(&self.cpu_millis) {
            return Err(SpecError::CpusOutOfRange);
        }
        if !(2..=4_194_304).contains(&self.pids) {
            return Err(SpecError::PidsOutOfRange(self.pids));
        }
        if self.disk_bytes < 1 << 20 {
            return Err(SpecError::DiskTooSmall(self.disk_bytes));
        }
        if !(16..=1_048_576).contains(&self.nofile) {
            return Err(SpecError::NofileOutOfRange(self.nofile));
        }
        if self.output_bytes < 1024 {
            return Err(SpecError::OutputTooSmall(self.output_bytes));
        }
        Ok(())
    }
}

impl BindMount {
    fn validate(&self) -> Result<(), SpecError> {
        if !self.source.is_absolute() {
            return Err(SpecError::MountSourceNotAbsolute(self.source.clone()));
        }
        check_target(&self.target)
    }
}

/// Most volumes one sandbox may mount.
pub const MAX_VOLUMES: usize = 16;

/// Whether `target` is a place a mount may go: a normalized absolute path
/// other than `/`, neither under nor above a reserved directory.
pub fn check_target(target: &str) -> Result<(), SpecError> {
    if !is_normalized_absolute(target) || target == "/" {
        return Err(SpecError::MountTargetInvalid(target.to_owned()));
    }
    for reserved in RESERVED_TARGETS {
        let under = target
            .strip_prefix(reserved)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'));
        if under || reserved.starts_with(&format!("{target}/")) {
            return Err(SpecError::MountTargetReserved(target.to_owned(), reserved));
        }
    }
    Ok(())
}

/// True for `/a/b` forms: absolute, no `.`/`..`, no empty components, no NUL.
pub fn is_normalized_absolute(path: &str) -> bool {
    if !path.starts_with('/') || path.contains('\0') || path.contains("//") {
        return false;
    }
    if path.len() > 1 && path.ends_with('/') {
        return false;
    }
    Path::new(path)
        .components()
        .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
        && !path.split('/').any(|part| part == "." || part == "..")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::network::MAX_RULES;

    #[test]
    fn a_lifecycle_defaults_to_kill_and_auto_resume_needs_pause() {
        let spec: SandboxSpec = serde_json::from_str("{}").unwrap();
        assert_eq!(spec.lifecycle, Lifecycle::default());
        assert_eq!(spec.lifecycle.on_timeout, OnTimeout::Kill);
        let mut spec = SandboxSpec::default();
        spec.lifecycle.auto_resume = true;
        assert_eq!(spec.validate(), Err(SpecError::AutoResumeWithoutPause));
        spec.lifecycle.on_timeout = OnTimeout::Pause;
        assert_eq!(spec.validate(), Ok(()));
        let text = serde_json::to_string(&spec.lifecycle).unwrap();
        assert_eq!(text, r#"{"on_timeout":"pause","auto_resume":true}"#);
        spec.lifecycle.files_only = true;
        assert_eq!(spec.validate(), Ok(()));
        spec.lifecycle.on_timeout = OnTimeout::Kill;
        spec.lifecycle.auto_resume = false;
        assert_eq!(spec.validate(), Err(SpecError::FilesOnlyWithoutPause));
    }

    #[test]
    fn tier_names_round_trip_and_match_serde() {
        for tier in Tier::ALL {
            assert_eq!(tier.as_str().parse::<Tier>(), Ok(tier));
            assert_eq!(
                serde_json::to_value(tier).unwrap(),
                serde_json::Value::String(tier.as_str().into())
            );
        }
        let err = "vm9".parse::<Tier>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "\"vm9\" is not a tier of airlock's (process, oci, gvisor)"
        );
        assert!("Process".parse::<Tier>().is_err());
    }

    #[test]
    fn defaults_are_valid_and_closed() {
        let spec = SandboxSpec::default();
        assert_eq!(spec.validate(), Ok(()));
        assert_eq!(spec.network, NetworkPolicy::None);
        assert_eq!(spec.user, RunAs::User);
        assert!(!spec.security.unsafe_allow_no_landlock);
    }

    #[test]
    fn missing_fields_take_safe_defaults_and_unknown_fields_fail() {
        let spec: SandboxSpec = serde_json::from_str("{}").unwrap();
        assert_eq!(spec, SandboxSpec::default());
        assert!(serde_json::from_str::<SandboxSpec>(r#"{"netwrok": {"mode": "open"}}"#).is_err());
        assert!(serde_json::from_str::<SandboxSpec>(r#"{"network": {"mode": "wide"}}"#).is_err());
        assert!(serde_json::from_str::<SandboxSpec>(r#"{"limits": {"memory": 1}}"#).is_err());
    }

    #[test]
    fn the_writable_layer_leaves_a_quarter_of_memory_free() {
        let layer = |memory_bytes: u64, disk_bytes: u64| {
            Limits {
                memory_bytes,
                disk_bytes,
                ..Limits::default()
            }
            .writable_layer_bytes()
        };
        // The defaults (1G disk, 512M memory): the layer gets 384M.
        assert_eq!(Limits::default().writable_layer_bytes(), 384 << 20);
        assert_eq!(layer(256 << 20, 1 << 30), 192 << 20);
        // A disk limit under the cap is kept as asked.
        assert_eq!(layer(256 << 20, 64 << 20), 64 << 20);
        assert_eq!(layer(8 << 20, 1 << 20), 1 << 20);
    }

    #[test]
    fn limit_ranges() {
        let with = |f: &dyn Fn(&mut Limits)| {
            let mut spec = SandboxSpec::default();
            f(&mut spec.limits);
            spec.validate()
        };
        assert_eq!(
            with(&|l| l.memory_bytes = 0),
            Err(SpecError::MemoryTooSmall(0))
        );
        assert_eq!(with(&|l| l.cpu_millis = 0), Err(SpecError::CpusOutOfRange));
        assert_eq!(with(&|l| l.pids = 1), Err(SpecError::PidsOutOfRange(1)));
        assert_eq!(
            with(&|l| l.disk_bytes = 10),
            Err(SpecError::DiskTooSmall(10))
        );
        assert_eq!(with(&|l| l.nofile = 3), Err(SpecError::NofileOutOfRange(3)));
        assert_eq!(
            with(&|l| l.output_bytes = 3),
            Err(SpecError::OutputTooSmall(3))
        );
    }

    #[test]
    fn mount_parsing() {
        let m = BindMount::parse("/data:/mnt/data:ro").unwrap();
        assert_eq!(m.source, PathBuf::from("/data"));
        assert_eq!(m.target, "/mnt/data");
        assert!(m.read_only);
        assert!(!BindMount::parse("/a:/b").unwrap().read_only);
        assert!(!BindMount::parse("/a:/b:rw").unwrap().read_only);
        for bad in ["", "/a", ":/b", "/a:", "/a:/b:rx", "/a:/b:ro:x"] {
            assert!(BindMount::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn mount_targets() {
        let check = |target: &str| {
            let mut spec = SandboxSpec::default();
            spec.mounts.push(BindMount {
                source: "/srv".into(),
                target: target.into(),
                read_only: true,
            });
            spec.validate()
        };
        assert_eq!(check("/mnt/data"), Ok(()));
        assert_eq!(check("/home/user/data"), Ok(()));
        assert_eq!(check("/usrdata"), Ok(()));
        for bad in [
            "relative",
            "/",
            "/a/../etc",
            "/a/./b",
            "/a//b",
            "/a/",
            "/a\0b",
        ] {
            assert!(
                matches!(check(bad), Err(SpecError::MountTargetInvalid(_))),
                "{bad:?}"
            );
        }
        for reserved in ["/proc", "/proc/sys", "/dev/shm", "/etc", "/usr/lib"] {
            assert!(
                matches!(check(reserved), Err(SpecError::MountTargetReserved(..))),
                "{reserved}"
            );
        }
        let mut spec = SandboxSpec::default();
        let m = BindMount::parse("/srv:/mnt/x").unwrap();
        spec.mounts = vec![m.clone(), m];
        assert!(matches!(
            spec.validate(),
            Err(SpecError::MountTargetDuplicate(_))
        ));
        spec.mounts = vec![BindMount::parse("srv:/mnt/x").unwrap()];
        assert!(matches!(
            spec.validate(),
            Err(SpecError::MountSourceNotAbsolute(_))
        ));
    }

    #[test]
    fn network_modes_parse_and_validate() {
        for json in [
            r#"{"network": {"mode": "open"}}"#,
            r#"{"network": {"mode": "allow", "rules": ["pypi.org"]}}"#,
            r#"{"network": {"mode": "allow", "rules": []}}"#,
        ] {
            let spec: SandboxSpec = serde_json::from_str(json).unwrap();
            assert_eq!(spec.validate(), Ok(()), "{json}");
        }
        let spec = SandboxSpec {
            network: NetworkPolicy::allow(&vec!["pypi.org"; MAX_RULES + 1]).unwrap(),
            ..SandboxSpec::default()
        };
        assert_eq!(
            spec.validate(),
            Err(SpecError::TooManyRules(TooManyRules(MAX_RULES + 1)))
        );
    }

    #[test]
    fn env_and_cwd() {
        let mut spec = SandboxSpec::default();
        spec.env.insert("A=B".into(), "x".into());
        assert!(matches!(spec.validate(), Err(SpecError::EnvName(_))));
        spec.env.clear();
        spec.env.insert("A".into(), "x\0".into());
        assert!(matches!(spec.validate(), Err(SpecError::EnvValue(_))));
        spec.env.clear();
        spec.cwd = Some("tmp".into());
        assert!(matches!(spec.validate(), Err(SpecError::Cwd(_))));
    }
}
