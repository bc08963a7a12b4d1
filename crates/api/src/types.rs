//! The JSON shapes of the native API, and their translation to the spec.

use crate::error::ApiError;
use airlock_daemon::sandboxes::NewSandboxRequest;
use airlock_daemon::Daemon;
use airlock_policy::{
    network::{TooManyRules, MAX_RULES},
    parse_cpus, parse_size, BindMount, Limits, NetworkPolicy, RunAs, SandboxSpec,
};
use airlock_store::SandboxRow;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use utoipa::{IntoParams, ToSchema};

/// Keys and values of metadata: at most this many pairs, this long each.
const METADATA_PAIRS: usize = 64;
const METADATA_LEN: usize = 256;

/// A size: bytes as a number, or a string such as `512M`, `1G`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum Size {
    Bytes(u64),
    Text(String),
}

impl Size {
    pub(crate) fn bytes(&self, field: &str) -> Result<u64, String> {
        match self {
            Size::Bytes(n) => Ok(*n),
            Size::Text(text) => parse_size(text).map_err(|e| format!("{field}: {e}")),
        }
    }
}

/// A CPU count: a number such as `0.5`, or a string.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum Cpus {
    Number(f64),
    Text(String),
}

/// Resource limits; every field optional.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LimitsInput {
    /// Memory limit (default 512M).
    pub memory: Option<Size>,
    /// CPU quota (default 1).
    pub cpus: Option<Cpus>,
    /// Processes and threads (default 256).
    pub pids: Option<u32>,
    /// Private writable space (default 1G; counts against memory).
    pub disk: Option<Size>,
}

/// A named volume to mount into the sandbox.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct VolumeInput {
    /// The volume's id or name.
    pub name: String,
    /// Absolute path inside the sandbox.
    pub path: String,
    /// Mounted read-only (default false).
    #[serde(default)]
    pub read_only: bool,
}

impl VolumeInput {
    /// The daemon's form of it.
    pub fn request(&self) -> airlock_daemon::volumes::VolumeRequest {
        airlock_daemon::volumes::VolumeRequest {
            volume: self.name.clone(),
            target: self.path.clone(),
            read_only: self.read_only,
        }
    }
}

/// A host directory to bind into the sandbox (only under the roots the
/// daemon allows with `--allow-mount`).
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MountInput {
    /// Absolute, canonical host path.
    pub source: String,
    /// Absolute path inside the sandbox.
    pub target: String,
    /// Read-only (default true).
    #[serde(default = "yes")]
    pub read_only: bool,
}

fn yes() -> bool {
    true
}

/// Network policy: `none` (loopback only, the default), `open` (the public
/// internet), `allow` with `rules` (only those), or `deny` with `rules`
/// (the public internet but those, unless one of `except` allows it).
/// Private, loopback and link-local (metadata) addresses are never
/// reachable.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NetworkInput {
    /// `none`, `open`, `allow` or `deny`.
    pub mode: String,
    /// With `allow` (what is allowed) or `deny` (what is denied) only:
    /// `domain`, `*.domain` (subdomains, not the domain itself), `IP` or
    /// `CIDR`, each with an optional `:PORT` (`[v6]:PORT` for IPv6).
    pub rules: Option<Vec<String>>,
    /// With `deny` only: rules of the same form that allow what `rules`
    /// would deny.
    pub except: Option<Vec<String>>,
}

impl NetworkInput {
    /// The policy this input asks for, or a 400 message naming the field.
    pub fn policy(&self) -> Result<NetworkPolicy, String> {
        let rules = self.rules.as_deref();
        if self.mode == "deny" {
            let Some(rules) = rules else {
                return Err("network.rules: mode \"deny\" needs the list of what is denied".into());
            };
            let except = self.except.as_deref().unwrap_or_default();
            // Counted before any is parsed.
            if rules.len() + except.len() > MAX_RULES {
                return Err(format!(
                    "network.rules: {}",
                    TooManyRules(rules.len() + except.len())
                ));
            }
            return NetworkPolicy::deny(rules, except).map_err(|e| format!("network.rules: {e}"));
        }
        if self.except.is_some() {
            return Err("network.except: only mode \"deny\" takes exceptions".into());
        }
        match (self.mode.as_str(), rules) {
            ("none", None) => Ok(NetworkPolicy::None),
            ("open", None) => Ok(NetworkPolicy::Open),
            ("allow", Some(rules)) => {
                // Counted before any is parsed.
                if rules.len() > MAX_RULES {
                    return Err(format!("network.rules: {}", TooManyRules(rules.len())));
                }
                NetworkPolicy::allow(rules).map_err(|e| format!("network.rules: {e}"))
            }
            ("allow", None) => Err(
                "network.rules: mode \"allow\" needs a list of rules (an empty list denies everything)"
                    .into(),
            ),
            ("none" | "open", Some(_)) => Err(format!(
                "network.rules: only modes \"allow\" and \"deny\" take rules, not {:?}",
                self.mode
            )),
            (other, _) => Err(format!(
                "network.mode: {other:?} is not a mode; use \"none\", \"open\", \"allow\" or \"deny\""
            )),
        }
    }
}

/// A sandbox's network policy as the API shows it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct NetworkView {
    /// `none`, `open`, `allow` or `deny`.
    pub mode: String,
    /// With `allow` and `deny`: the rules, in their canonical text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rules: Option<Vec<String>>,
    /// With `deny`: the exceptions, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub except: Option<Vec<String>>,
}

impl NetworkView {
    pub fn of(policy: &NetworkPolicy) -> NetworkView {
        let texts = |rules: &[airlock_policy::Rule]| -> Vec<String> {
            rules.iter().map(ToString::to_string).collect()
        };
        NetworkView {
            mode: policy.mode().to_owned(),
            rules: match policy {
                NetworkPolicy::Allow { rules } | NetworkPolicy::Deny { rules, .. } => {
                    Some(texts(rules))
                }
                _ => None,
            },
            except: match policy {
                NetworkPolicy::Deny { except, .. } if !except.is_empty() => Some(texts(except)),
                _ => None,
            },
        }
    }
}

/// Who processes run as.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum UserInput {
    User,
    Root,
}

impl From<UserInput> for RunAs {
    fn from(u: UserInput) -> RunAs {
        match u {
            UserInput::User => RunAs::User,
            UserInput::Root => RunAs::Root,
        }
    }
}

/// `POST /v1/sandboxes`.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSandbox {
    /// Template name; `host` (also `base`) is the default.
    pub template: Option<String>,
    /// Isolation tier (`process`, `oci`, `gvisor`; see `GET /v1/tiers`);
    /// by default the template's own (`PATCH /v1/templates/{name}`), else
    /// the operator's for it (`serve --template-tier`), else the daemon's
    /// (`serve --default-tier`, `process` unless set).
    pub tier: Option<String>,
    /// Lifetime in seconds (default 300).
    pub timeout_s: Option<u64>,
    pub limits: Option<LimitsInput>,
    /// Environment of every process.
    pub env: Option<BTreeMap<String, String>>,
    /// Free-form labels, for filtering.
    pub metadata: Option<BTreeMap<String, String>>,
    pub mounts: Option<Vec<MountInput>>,
    /// Named volumes to mount (`POST /v1/volumes`), by id or name.
    pub volumes: Option<Vec<VolumeInput>>,
    pub network: Option<NetworkInput>,
    /// Default working directory.
    pub cwd: Option<String>,
    /// Default identity of processes (`user`).
    pub user: Option<UserInput>,
    /// What its timeout does: `{"on_timeout": "kill" | "pause",
    /// "auto_resume": bool}` (a call into a sandbox paused at its timeout
    /// resumes it; only with `pause`).
    #[schema(value_type = Option<Object>)]
    pub lifecycle: Option<airlock_policy::Lifecycle>,
    /// Copy `/mnt/user-data/outputs` to the daemon's object store when
    /// the sandbox is torn down, whatever ends it (default: false).
    pub collect_outputs: Option<bool>,
    /// Let its ports answer requests from outside without a token
    /// (default: false; see `/v1/sandboxes/{id}/ports/{port}/`).
    pub public_ports: Option<bool>,
    /// The `Host` requests to its ports go in with, `${PORT}` standing
    /// for the port (e.g. `localhost:${PORT}`); default: the client's.
    pub port_host_mask: Option<String>,
}

impl CreateSandbox {
    /// The create request: the spec with its template resolved, and the
    /// template's start and ready commands; or what is wrong (400, or 404
    /// for a template that does not exist). The template may be one of
    /// `owner`'s snapshots.
    pub fn into_request(
        self,
        daemon: &Daemon,
        owner: &airlock_store::KeyRow,
    ) -> Result<(NewSandboxRequest, Option<airlock_daemon::startup::Startup>), ApiError> {
        let template = self.template.clone().unwrap_or_else(|| "host".into());
        let resolved = daemon.resolve_template_for(owner, &template)?;
        let user_given = self.user.is_some();
        let tier_given = self.tier.is_some();
        let volumes: Vec<_> = self
            .volumes
            .iter()
            .flatten()
            .map(VolumeInput::request)
            .collect();
        let (mut spec, metadata) = self.into_spec(daemon).map_err(ApiError::bad_request)?;
        spec.volumes = daemon.volume_mounts(owner, &volumes)?;
        if !tier_given {
            spec.tier = daemon.default_tier_of(&template, &resolved);
        }
        spec.template = resolved.template;
        Daemon::apply_template_config(&mut spec, &resolved.config);
        // The template's USER, when the request names none and it is one
        // of the two identities a sandbox's processes run as.
        if !user_given {
            match resolved
                .config
                .user
                .as_deref()
                .map(|u| u.split(':').next().unwrap_or(u))
            {
                Some("root" | "0") => spec.user = RunAs::Root,
                Some("user" | "1000") => spec.user = RunAs::User,
                _ => {}
            }
        }
        spec.validate()
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        let startup = airlock_daemon::startup::Startup::of(&resolved.config);
        Ok((
            NewSandboxRequest {
                spec,
                template_name: template,
                metadata,
                layers: resolved.layers,
            },
            startup,
        ))
    }

    /// The spec (its template left to [`CreateSandbox::into_request`]) and
    /// metadata, or what is wrong (a 400 message).
    fn into_spec(self, daemon: &Daemon) -> Result<(SandboxSpec, BTreeMap<String, String>), String> {
        let mut spec = SandboxSpec::default();
        if let Some(tier) = self.tier.as_deref() {
            // Which tier; whether it runs here is the daemon's to say.
            spec.tier = tier.parse().map_err(|e: airlock_policy::UnknownTier| {
                format!("tier: {e} (see GET /v1/tiers)")
            })?;
        }
        if let Some(lifecycle) = self.lifecycle {
            spec.lifecycle = lifecycle;
        }
        spec.collect_outputs = self.collect_outputs.unwrap_or(false);
        spec.public_ports = self.public_ports.unwrap_or(false);
        if let Some(mask) = self.port_host_mask {
            crate::ports::check_host_mask(&mask).map_err(|e| format!("port_host_mask: {e}"))?;
            spec.port_host_mask = Some(mask);
        }
        let timeout_s = self
            .timeout_s
            .unwrap_or(daemon.config().default_timeout.as_secs());
        let max = daemon.config().max_timeout.as_secs();
        if timeout_s == 0 || timeout_s > max {
            return Err(format!("timeout_s: must be between 1 and {max}"));
        }
        spec.timeout_ms = timeout_s * 1000;
        let limits = self.limits.unwrap_or_default();
        let mut spec_limits = Limits::default();
        if let Some(memory) = &limits.memory {
            spec_limits.memory_bytes = memory.bytes("limits.memory")?;
        }
        if let Some(disk) = &limits.disk {
            spec_limits.disk_bytes = disk.bytes("limits.disk")?;
        }
        if let Some(cpus) = &limits.cpus {
            spec_limits.cpu_millis = match cpus {
                Cpus::Number(n) if n.is_finite() && *n > 0.0 && *n <= 1024.0 => {
                    (n * 1000.0).round() as u32
                }
                Cpus::Number(_) => return Err("limits.cpus: must be between 0.01 and 1024".into()),
                Cpus::Text(text) => parse_cpus(text).map_err(|e| format!("limits.cpus: {e}"))?,
            };
        }
        if let Some(pids) = limits.pids {
            spec_limits.pids = pids;
        }
        spec.limits = spec_limits;
        spec.env = self.env.unwrap_or_default();
        if let Some(mounts) = self.mounts {
            for mount in mounts {
                spec.mounts.push(BindMount {
                    source: mount.source.into(),
                    target: mount.target,
                    read_only: mount.read_only,
                });
            }
        }
        if let Some(network) = &self.network {
            spec.network = network.policy()?;
        }
        spec.cwd = self.cwd;
        if let Some(user) = self.user {
            spec.user = user.into();
        }
        let metadata = self.metadata.unwrap_or_default();
        if metadata.len() > METADATA_PAIRS {
            return Err(format!("metadata: at most {METADATA_PAIRS} pairs"));
        }
        if metadata
            .iter()
            .any(|(k, v)| k.is_empty() || k.len() > METADATA_LEN || v.len() > METADATA_LEN)
        {
            return Err(format!(
                "metadata: keys must be 1 to {METADATA_LEN} bytes and values at most {METADATA_LEN}"
            ));
        }
        spec.validate().map_err(|e| e.to_string())?;
        Ok((spec, metadata))
    }
}

/// Limits in force, in base units.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct LimitsView {
    pub memory_bytes: u64,
    pub cpu_millis: u32,
    pub pids: u32,
    /// The writable layer's size: the disk limit asked for, at most three
    /// quarters of the memory limit.
    pub disk_bytes: u64,
}

/// A sandbox as the API shows it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SandboxView {
    /// `sbx-` and 16 hex digits.
    pub id: String,
    /// Only in the answer to create: the token that opens this sandbox's
    /// data plane. Shown once.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub access_token: Option<String>,
    /// `creating`, `running`, `paused`, `stopping` or `dead`.
    pub state: String,
    /// Why it is stopping or dead.
    pub reason: Option<String>,
    pub template: String,
    pub tier: String,
    pub metadata: BTreeMap<String, String>,
    pub limits: LimitsView,
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339; the reaper kills it then.
    pub expires_at: String,
}

/// Unix milliseconds as RFC 3339 (UTC); empty if out of range.
pub fn rfc3339(ms: i64) -> String {
    rfc3339_ns(i128::from(ms) * 1_000_000).unwrap_or_default()
}

/// Unix nanoseconds as RFC 3339 (UTC), keeping the fraction.
pub fn rfc3339_ns(ns: i128) -> Option<String> {
    time::OffsetDateTime::from_unix_timestamp_nanos(ns)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
}

impl SandboxView {
    pub fn of(row: &SandboxRow, access_token: Option<String>) -> SandboxView {
        let limits = serde_json::from_str::<SandboxSpec>(&row.spec_json)
            .map(|s| s.limits)
            .unwrap_or_default();
        SandboxView {
            id: row.id.clone(),
            access_token,
            state: row.state.as_str().to_owned(),
            reason: row.state_reason.clone(),
            template: row.template.clone(),
            tier: row.tier.clone(),
            metadata: row.metadata.clone(),
            limits: LimitsView {
                memory_bytes: limits.memory_bytes,
                cpu_millis: limits.cpu_millis,
                pids: limits.pids,
                disk_bytes: limits.writable_layer_bytes(),
            },
            created_at: rfc3339(row.created_at),
            expires_at: rfc3339(row.expires_at),
        }
    }
}

/// One page of sandboxes.
#[derive(Debug, Serialize, ToSchema)]
pub struct SandboxPage {
    pub items: Vec<SandboxView>,
    /// Pass as `cursor` for the next page; `null` on the last.
    pub next_cursor: Option<String>,
}

/// Query of `GET /v1/sandboxes`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListParams {
    /// Comma-separated states, e.g. `running,paused`.
    pub state: Option<String>,
    /// URL-encoded `k=v&k2=v2`; every pair must match.
    pub metadata: Option<String>,
    /// Page size, 1 to 1000 (default 100).
    pub limit: Option<u32>,
    /// `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

/// `POST /v1/sandboxes/{id}/timeout`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetTimeout {
    /// Seconds from now.
    pub timeout_s: u64,
}

/// `POST /v1/sandboxes/{id}/exec`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecBody {
    /// The program; looked up in PATH when it has no `/`.
    pub cmd: String,
    #[serde(default)]
    pub args: Vec<String>,
    /// Added to the sandbox's environment.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    pub cwd: Option<String>,
    pub user: Option<UserInput>,
    /// Kill the process after this many seconds.
    pub timeout_s: Option<f64>,
    /// Feed stdin through `…/processes/{pid}/stdin`.
    #[serde(default)]
    pub stdin: bool,
    /// Answer `201 {pid}` at once instead of streaming.
    #[serde(default)]
    pub background: bool,
}

/// One line of an exec or output stream (NDJSON).
#[derive(Debug, Serialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum StreamEvent {
    Started {
        pid: u32,
    },
    Stdout {
        #[serde(skip_serializing_if = "Option::is_none")]
        data: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        data_b64: Option<String>,
    },
    Stderr {
        #[serde(skip_serializing_if = "Option::is_none")]
        data: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        data_b64: Option<String>,
    },
    Exited {
        pid: u32,
        exit_code: Option<i32>,
        signal: Option<i32>,
        oom: bool,
        timed_out: bool,
        duration_ms: u64,
        stdout_truncated: bool,
        stderr_truncated: bool,
    },
    Error {
        code: String,
        message: String,
    },
}

/// Answer of a background exec.
#[derive(Debug, Serialize, ToSchema)]
pub struct Pid {
    pub pid: u32,
}

/// A process as the API shows it.
#[derive(Debug, Serialize, ToSchema)]
pub struct ProcessItem {
    pub pid: u32,
    pub cmd: String,
    pub args: Vec<String>,
    /// `user` or `root`.
    pub user: String,
    pub running: bool,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
}

/// `GET …/processes`.
#[derive(Debug, Serialize, ToSchema)]
pub struct ProcessList {
    pub processes: Vec<ProcessItem>,
}

/// `POST …/signal`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SignalBody {
    /// A name (`SIGTERM`, `TERM`) or a number.
    pub signal: SignalValue,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum SignalValue {
    Number(i32),
    Name(String),
}

impl SignalValue {
    pub fn number(&self) -> Option<i32> {
        const NAMES: &[(&str, i32)] = &[
            ("HUP", 1),
            ("INT", 2),
            ("QUIT", 3),
            ("KILL", 9),
            ("USR1", 10),
            ("USR2", 12),
            ("TERM", 15),
            ("CONT", 18),
            ("STOP", 19),
            ("TSTP", 20),
            ("WINCH", 28),
        ];
        match self {
            SignalValue::Number(n) if (1..=64).contains(n) => Some(*n),
            SignalValue::Number(_) => None,
            SignalValue::Name(name) => {
                let upper = name.to_ascii_uppercase();
                let bare = upper.strip_prefix("SIG").unwrap_or(&upper);
                NAMES.iter().find(|(n, _)| *n == bare).map(|(_, v)| *v)
            }
        }
    }
}

/// Query naming a path.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct PathParams {
    /// Absolute path inside the sandbox.
    #[param(pattern = "^/")]
    pub path: String,
}

/// Query of a file upload.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct WriteParams {
    /// Absolute path inside the sandbox.
    #[param(pattern = "^/")]
    pub path: String,
    /// Octal permission bits, e.g. `644`.
    pub mode: Option<String>,
    /// Owner of the new file: `user` (default) or `root`.
    pub user: Option<UserInput>,
}

/// Query of a removal.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct RemoveParams {
    #[param(pattern = "^/")]
    pub path: String,
    /// Remove a directory with everything in it.
    #[serde(default)]
    pub recursive: bool,
}

/// Query of a listing.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListDirParams {
    #[param(pattern = "^/")]
    pub path: String,
    /// Levels to descend, 1 to 32 (default 1).
    pub depth: Option<u32>,
    /// Most entries in the page, 1 to 10000 (default 1000); a page may
    /// hold fewer (when its entries' metadata is large).
    #[param(minimum = 1, maximum = 10000)]
    pub limit: Option<u32>,
    /// The `next_cursor` of the previous page; absent for the first.
    pub cursor: Option<String>,
}

/// Metadata of a path.
#[derive(Debug, Serialize, ToSchema)]
pub struct FileView {
    pub path: String,
    pub name: String,
    /// `file`, `dir`, `symlink` or `other`.
    pub kind: String,
    pub size: u64,
    /// Permission bits as octal text, e.g. `644`.
    pub mode: String,
    pub uid: u32,
    pub gid: u32,
    /// RFC 3339.
    pub mtime: String,
    pub symlink_target: Option<String>,
}

impl From<airlock_protocol::FileInfo> for FileView {
    fn from(info: airlock_protocol::FileInfo) -> FileView {
        FileView {
            kind: serde_json::to_value(info.kind)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default(),
            path: info.path,
            name: info.name,
            size: info.size,
            mode: format!("{:o}", info.mode),
            uid: info.uid,
            gid: info.gid,
            mtime: rfc3339(info.mtime_ns / 1_000_000),
            symlink_target: info.symlink_target,
        }
    }
}

/// `GET …/files/list`: one page, sorted by path.
#[derive(Debug, Serialize, ToSchema)]
pub struct Entries {
    pub entries: Vec<FileView>,
    /// Pass as `cursor` for the next page; `null` on the last.
    pub next_cursor: Option<String>,
}

/// Answer of an upload.
#[derive(Debug, Serialize, ToSchema)]
pub struct Written {
    pub path: String,
    pub bytes: u64,
}

/// `POST …/files/mkdir`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MakeDirBody {
    #[schema(pattern = "^/")]
    pub path: String,
    /// Create missing parents too (and succeed if it exists).
    #[serde(default)]
    pub parents: bool,
    pub user: Option<UserInput>,
}

/// `POST …/files/move`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MoveBody {
    pub from: String,
    pub to: String,
}

/// Query of `GET …/events`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct EventParams {
    /// `access`, `security` or `runtime`; all when absent.
    pub stream: Option<String>,
    /// Only events after this sequence number (the previous `next_cursor`).
    pub after: Option<i64>,
    /// Page size, 1 to 1000 (default 100).
    pub limit: Option<u32>,
}

/// One audit event.
#[derive(Debug, Serialize, ToSchema)]
pub struct EventView {
    pub seq: i64,
    pub stream: String,
    pub kind: String,
    /// RFC 3339.
    pub at: String,
    pub request_id: Option<String>,
    #[schema(value_type = Object)]
    pub detail: serde_json::Value,
}

/// A page of audit events.
#[derive(Debug, Serialize, ToSchema)]
pub struct EventPage {
    pub items: Vec<EventView>,
    /// Pass as `after` for the next page.
    pub next_cursor: Option<i64>,
}

/// `GET /healthz`.
#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    pub status: String,
}

/// Decodes `%XX` escapes and, with `plus`, `+` (a space, as form encoding
/// writes it).
pub fn percent_decode(s: &str, plus: bool) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = s.get(i + 1..i + 3)?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' if plus => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(mode: &str, rules: Option<&[&str]>) -> NetworkInput {
        NetworkInput {
            mode: mode.into(),
            rules: rules.map(|r| r.iter().map(|s| s.to_string()).collect()),
            except: None,
        }
    }

    #[test]
    fn network_inputs_map_to_policies() {
        assert_eq!(input("none", None).policy(), Ok(NetworkPolicy::None));
        assert_eq!(input("open", None).policy(), Ok(NetworkPolicy::Open));
        assert_eq!(
            input("allow", Some(&["pypi.org", "*.pythonhosted.org:443"])).policy(),
            NetworkPolicy::allow(&["pypi.org", "*.pythonhosted.org:443"])
                .map_err(|e| e.to_string())
        );
        assert_eq!(
            input("allow", Some(&[])).policy(),
            Ok(NetworkPolicy::Allow { rules: vec![] })
        );
    }

    #[test]
    fn bad_network_inputs_name_the_field_and_the_rule() {
        let error = |mode: &str, rules: Option<&[&str]>| input(mode, rules).policy().unwrap_err();
        assert_eq!(
            error("allow", Some(&["pypi.org", "pypi.org:0"])),
            "network.rules: rule \"pypi.org:0\" has an invalid port; a port is a number from 1 to 65535 without leading zeros"
        );
        assert!(error("allow", Some(&["a.*.org"])).contains("\"a.*.org\""));
        assert!(error("allow", None).starts_with("network.rules:"));
        assert!(error("none", Some(&["pypi.org"])).starts_with("network.rules:"));
        assert!(error("open", Some(&[])).starts_with("network.rules:"));
        assert!(error("wide", None).starts_with("network.mode:"));
        let many: Vec<&str> = vec!["pypi.org"; MAX_RULES + 1];
        assert!(error("allow", Some(&many)).contains("at most"));
    }
}
