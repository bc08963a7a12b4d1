//! The JSON shapes of the e2b control plane and their pure translations:
//! an e2b create request into the native [`CreateSandbox`], a stored row
//! into e2b's `Sandbox` / `SandboxDetail` / `ListedSandbox`, usage into a
//! `SandboxMetric`, and the list query into a [`ListQuery`].
//!
//! Field names are e2b's (camelCase, `templateID`, `sandboxID`, and the one
//! snake_case `allow_internet_access`), taken from the public OpenAPI
//! document and from what the SDKs parse; the definitions are our own.

use super::E2bError;
use crate::types::{rfc3339, CreateSandbox, NetworkInput};
use airlock_policy::SandboxSpec;
use airlock_store::{ListQuery, SandboxRow, State as StoredState};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// The envd version every airlock sandbox reports. The SDKs gate features
/// on it, and each one they unlock up to here is served: they send no
/// explicit `username` (0.4.0: the default user is envd's), may close
/// stdin (0.5.2), upload files as `application/octet-stream` (0.5.7),
/// attach file metadata to uploads as `X-Metadata-*` headers (0.6.2),
/// ask watches for the entry of each event (`includeEntry`, 0.6.3) and
/// allow watches on network mounts (`allowNetworkMounts`, 0.6.4). The SDKs
/// (Python 2.63, JS 2.51) gate nothing past 0.6.4.
pub const ENVD_VERSION: &str = "0.6.4";

/// `clientID` of every sandbox (e2b's legacy field; one node here).
pub const CLIENT_ID: &str = "airlock";

/// Template names that mean airlock's `base` template: e2b's default
/// (`base`, what the SDKs send when none is named) and the code
/// interpreter's, whose kernel the in-sandbox routes provide. Until a
/// `base` template is built (`airlock template bootstrap`), the daemon
/// resolves `base` to the host's system.
const BASE_ALIASES: &[&str] = &[
    "base",
    "code-interpreter-v1",
    "code-interpreter",
    "code-interpreter-beta",
];

/// Largest page of `GET /v2/sandboxes`.
pub const MAX_PAGE: u32 = 100;

/// The message of a refused request for an egress proxy or rewrite rules.
pub const NO_EGRESS_PROXY: &str =
    "network.egressProxy and network.rules are not available on this airlock daemon";

/// e2b's network settings of a sandbox (`network` of a create, and the
/// body of `PUT /sandboxes/{id}/network`, which also carries
/// `allow_internet_access`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkConfig {
    /// Destinations allowed out (domains, `*.domains`, IPs, CIDRs); they
    /// win over `denyOut`.
    pub allow_out: Option<Vec<String>>,
    /// Destinations denied (IPs and CIDRs).
    pub deny_out: Option<Vec<String>>,
    /// An egress proxy: not available.
    pub egress_proxy: Option<Value>,
    /// Per-domain rewrite rules: not available.
    pub rules: Option<Value>,
    /// Update bodies only: the same as the create field.
    #[serde(rename = "allow_internet_access")]
    pub allow_internet_access: Option<bool>,
    /// Whether its ports answer without the traffic token. When absent,
    /// airlock's default applies: they do not (e2b's cloud defaults to
    /// public; a self-hosted daemon opens nothing unasked).
    pub allow_public_traffic: Option<bool>,
    /// The `Host` requests to its ports go in with (`${PORT}`: the port).
    pub mask_request_host: Option<String>,
}

/// e2b's egress model onto airlock's policy. In e2b, internet access is on
/// unless `allow_internet_access` is false; `denyOut` takes destinations
/// away and `allowOut` gives them back. airlock's policies cannot take
/// single destinations away from `open`, so:
///
/// - everything denied (`allow_internet_access: false`, or `denyOut`
///   holding `0.0.0.0/0` or `::/0`): mode `allow` with the `allowOut`
///   rules (`none` when there are none);
/// - internet on, where the daemon lets e2b sandboxes have the internet by
///   default (`serve --e2b-internet open`): `open` (`allowOut` adds
///   nothing to it);
/// - internet on, where it does not (airlock denies by default): the
///   `allowOut` rules as an allowlist (`none` when there are none), never
///   more than the client named;
/// - any other `denyOut`: refused (400), saying how to write it.
pub fn network_input(
    allow_internet_access: Option<bool>,
    network: Option<&NetworkConfig>,
    internet_by_default: bool,
) -> Result<NetworkInput, E2bError> {
    let empty = NetworkConfig::default();
    let network = network.unwrap_or(&empty);
    if network.egress_proxy.as_ref().is_some_and(|p| !p.is_null())
        || network.rules.as_ref().is_some_and(|r| !r.is_null())
    {
        return Err(E2bError::bad_request(NO_EGRESS_PROXY));
    }
    let deny = network.deny_out.as_deref().unwrap_or_default();
    let deny_all = deny.iter().any(|d| {
        let d = d.trim();
        d == "0.0.0.0/0" || d == "::/0"
    });
    let allow = network.allow_out.clone().unwrap_or_default();
    let internet = allow_internet_access.unwrap_or(true) && !deny_all;
    // Open internet but the destinations of `denyOut` (with `allowOut`
    // winning over them, as e2b says); where the internet is not open, an
    // allowlist of `allowOut` already denies the rest.
    let (mode, rules, except) = match (internet && internet_by_default, allow.is_empty()) {
        (true, _) if !deny.is_empty() => ("deny", Some(deny.to_vec()), Some(allow)),
        (true, _) => ("open", None, None),
        (false, true) => ("none", None, None),
        (false, false) => ("allow", Some(allow), None),
    };
    Ok(NetworkInput {
        mode: mode.into(),
        rules,
        except,
    })
}

/// The metadata key an e2b create names its sandbox's tier with
/// (`Sandbox.create(metadata={"airlock.tier": "gvisor"})`).
pub const TIER_METADATA: &str = "airlock.tier";

/// `POST /sandboxes` (NewSandbox) and `POST /v2/sandboxes` (NewSandboxV2).
/// Unknown fields are ignored, so newer SDKs keep working.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NewSandbox {
    /// The template (required by e2b).
    #[serde(rename = "templateID")]
    pub template_id: Option<String>,
    /// Lifetime in seconds.
    pub timeout: Option<i64>,
    /// Pause instead of kill at the timeout.
    pub auto_pause: Option<bool>,
    /// How an auto-pause snapshots (`false`: the filesystem only, not
    /// available here yet); meaningless without one.
    pub auto_pause_memory: Option<bool>,
    /// `{"enabled": bool}`: resume a paused sandbox on traffic.
    pub auto_resume: Option<Value>,
    /// Always true here: every sandbox has an access token.
    pub secure: Option<bool>,
    /// Internet access (the SDKs send `true` by default); see
    /// [`network_input`] for how it and `network` map onto a policy.
    #[serde(rename = "allow_internet_access")]
    pub allow_internet_access: Option<bool>,
    pub network: Option<NetworkConfig>,
    pub metadata: Option<BTreeMap<String, String>>,
    pub env_vars: Option<BTreeMap<String, String>>,
    /// An MCP gateway: not available.
    pub mcp: Option<Value>,
    /// Workload identity: not available.
    pub iam: Option<Value>,
    /// Named volumes (`POST /volumes`) to mount, by name.
    pub volume_mounts: Option<Vec<VolumeMountWire>>,
}

/// `SandboxVolumeMount`: a volume by name, and where it is mounted.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
pub struct VolumeMountWire {
    pub name: String,
    pub path: String,
}

/// Whether an optional JSON value asks for something (not null, `{}`, `[]`).
fn is_set(value: &Option<Value>) -> bool {
    match value {
        None | Some(Value::Null) => false,
        Some(Value::Object(map)) => !map.is_empty(),
        Some(Value::Array(items)) => !items.is_empty(),
        Some(_) => true,
    }
}

/// Which template a create names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TemplateChoice {
    /// airlock's `host` template.
    Host,
    /// A template registered with the daemon under this name.
    Registered(String),
}

/// What an e2b template name means here, before looking at the disk.
pub fn template_choice(name: &str) -> TemplateChoice {
    if name == "host" {
        TemplateChoice::Host
    } else if BASE_ALIASES.contains(&name) {
        TemplateChoice::Registered("base".to_owned())
    } else {
        TemplateChoice::Registered(name.to_owned())
    }
}

impl NewSandbox {
    /// The template name as the client gave it.
    pub fn template_name(&self) -> Result<&str, E2bError> {
        match self.template_id.as_deref() {
            Some(name) if !name.is_empty() => Ok(name),
            _ => Err(E2bError::bad_request("templateID is required")),
        }
    }

    /// The native create request: what airlock can do, or a 400 naming
    /// what it cannot. `native_template` is `host` or a registered name.
    pub fn to_native(
        &self,
        native_template: &str,
        default_timeout_s: u64,
        max_timeout_s: u64,
        internet_by_default: bool,
    ) -> Result<CreateSandbox, E2bError> {
        let timeout_s = match self.timeout {
            None => default_timeout_s,
            Some(t) if t >= 1 && (t as u64) <= max_timeout_s => t as u64,
            Some(_) => {
                return Err(E2bError::bad_request(format!(
                    "timeout must be between 1 and {max_timeout_s} seconds"
                )))
            }
        };
        let auto_pause = self.auto_pause == Some(true);
        let auto_resume = self
            .auto_resume_enabled()
            .is_some_and(|v| v.as_bool() == Some(true));
        let files_only = auto_pause && self.auto_pause_memory == Some(false);
        if files_only && auto_resume {
            return Err(E2bError::bad_request(
                "autoResume cannot be combined with autoPauseMemory: false: a sandbox paused keeping only its filesystem is resumed with connect",
            ));
        }
        if auto_resume && !auto_pause {
            return Err(E2bError::bad_request(
                "autoResume needs autoPause: a sandbox killed at its timeout has nothing to resume",
            ));
        }
        let lifecycle = airlock_policy::Lifecycle {
            on_timeout: if auto_pause {
                airlock_policy::OnTimeout::Pause
            } else {
                airlock_policy::OnTimeout::Kill
            },
            auto_resume,
            files_only,
        };
        if is_set(&self.mcp) {
            return Err(E2bError::bad_request(
                "mcp: an MCP gateway is not available on this airlock daemon",
            ));
        }
        if is_set(&self.iam) {
            return Err(E2bError::bad_request(
                "iam: workload identity is not available on this airlock daemon",
            ));
        }
        let network = network_input(
            self.allow_internet_access,
            self.network.as_ref(),
            internet_by_default,
        )?;
        Ok(CreateSandbox {
            template: Some(native_template.to_owned()),
            // The e2b API has no tier: a metadata entry names one, else the
            // template's or the daemon's default applies.
            tier: self
                .metadata
                .as_ref()
                .and_then(|m| m.get(TIER_METADATA))
                .cloned(),
            timeout_s: Some(timeout_s),
            env: self.env_vars.clone(),
            metadata: self.metadata.clone(),
            network: Some(network),
            public_ports: self.network.as_ref().and_then(|n| n.allow_public_traffic),
            port_host_mask: self
                .network
                .as_ref()
                .and_then(|n| n.mask_request_host.clone()),
            lifecycle: Some(lifecycle),
            volumes: self.volume_mounts.as_ref().map(|mounts| {
                mounts
                    .iter()
                    .map(|m| crate::types::VolumeInput {
                        name: m.name.clone(),
                        path: m.path.clone(),
                        read_only: false,
                    })
                    .collect()
            }),
            ..CreateSandbox::default()
        })
    }

    /// `autoResume` when it asks to be enabled.
    fn auto_resume_enabled(&self) -> Option<Value> {
        self.auto_resume
            .as_ref()
            .and_then(|v| v.get("enabled"))
            .filter(|v| v.as_bool() == Some(true))
            .cloned()
    }
}

/// `POST /sandboxes/{id}/connect` (ConnectSandbox), `…/resume`
/// (ResumedSandbox) and `…/timeout` (SandboxTimeoutRequest): a timeout in
/// seconds, and for connect whether a paused sandbox's memory is restored
/// (`memory: false` is the SDK's `on_resume="reboot"`); the rest is
/// accepted and ignored.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct TimeoutBody {
    pub timeout: Option<i64>,
    pub memory: Option<bool>,
}

/// e2b's answer to create, connect and resume (`Sandbox`).
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SandboxWire {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(rename = "clientID")]
    pub client_id: &'static str,
    pub alias: String,
    pub envd_version: &'static str,
    /// The sandbox's access token: the SDK sends it as `X-Access-Token`.
    pub envd_access_token: Option<String>,
    /// Sent by the SDKs as `E2B-Traffic-Access-Token` to ports other than
    /// envd's (the code interpreter's), which accept it in place of the
    /// access token.
    pub traffic_access_token: Option<String>,
    /// The daemon's sandbox domain (`serve --sandbox-domain`), under which
    /// `get_host(port)` gives `PORT-ID.DOMAIN`; `null` without one (the
    /// SDK then falls back on its own `E2B_DOMAIN`). With
    /// `E2B_SANDBOX_URL` set the SDK reaches envd there either way.
    pub domain: Option<String>,
}

impl SandboxWire {
    pub fn of(
        row: &SandboxRow,
        access_token: Option<String>,
        traffic_token: Option<String>,
    ) -> SandboxWire {
        SandboxWire {
            template_id: row.template.clone(),
            sandbox_id: row.id.clone(),
            client_id: CLIENT_ID,
            alias: row.template.clone(),
            envd_version: ENVD_VERSION,
            envd_access_token: access_token,
            traffic_access_token: traffic_token,
            domain: None,
        }
    }

    /// The same, on the daemon's sandbox domain.
    pub fn on_domain(mut self, domain: Option<&str>) -> SandboxWire {
        self.domain = domain.map(str::to_owned);
        self
    }
}

/// e2b's state of a sandbox it lists: `running` or `paused`; `None` for
/// one that is gone (stopping or dead), which e2b no longer shows.
pub fn e2b_state(state: StoredState) -> Option<&'static str> {
    match state {
        StoredState::Creating | StoredState::Running => Some("running"),
        StoredState::Paused => Some("paused"),
        StoredState::Stopping | StoredState::Dead => None,
    }
}

/// Size of a sandbox as e2b reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size {
    /// Whole CPUs, rounded up (a quota of 0.5 CPU reports 1).
    pub cpu_count: u32,
    pub memory_mb: u64,
    pub disk_size_mb: u64,
    pub memory_bytes: u64,
    pub disk_bytes: u64,
    pub cpu_millis: u32,
}

/// The size recorded in a row's spec.
pub fn size_of(row: &SandboxRow) -> Size {
    let limits = serde_json::from_str::<SandboxSpec>(&row.spec_json)
        .map(|s| s.limits)
        .unwrap_or_default();
    Size {
        cpu_count: limits.cpu_millis.div_ceil(1000).max(1),
        memory_mb: limits.memory_bytes >> 20,
        disk_size_mb: limits.writable_layer_bytes() >> 20,
        memory_bytes: limits.memory_bytes,
        disk_bytes: limits.writable_layer_bytes(),
        cpu_millis: limits.cpu_millis,
    }
}

/// One sandbox in e2b's list (`ListedSandbox`) and, with the detail-only
/// fields set, `GET /sandboxes/{id}` (`SandboxDetail`).
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ListedWire {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(rename = "clientID")]
    pub client_id: &'static str,
    pub alias: String,
    /// RFC 3339.
    pub started_at: String,
    /// RFC 3339: when it will be killed.
    pub end_at: String,
    pub cpu_count: u32,
    #[serde(rename = "memoryMB")]
    pub memory_mb: u64,
    #[serde(rename = "diskSizeMB")]
    pub disk_size_mb: u64,
    pub state: &'static str,
    pub envd_version: &'static str,
    pub metadata: BTreeMap<String, String>,
    /// Detail only: the access token.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub envd_access_token: Option<String>,
    /// Detail only: always false, there is no egress yet.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow_internet_access: Option<bool>,
    /// Detail only: the daemon's sandbox domain, or `null`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub domain: Option<Option<String>>,
}

impl ListedWire {
    /// The listed form; `None` for a sandbox e2b would not show.
    pub fn of(row: &SandboxRow) -> Option<ListedWire> {
        let state = e2b_state(row.state)?;
        let size = size_of(row);
        Some(ListedWire {
            template_id: row.template.clone(),
            sandbox_id: row.id.clone(),
            client_id: CLIENT_ID,
            alias: row.template.clone(),
            started_at: rfc3339(row.created_at),
            end_at: rfc3339(row.expires_at),
            cpu_count: size.cpu_count,
            memory_mb: size.memory_mb,
            disk_size_mb: size.disk_size_mb,
            state,
            envd_version: ENVD_VERSION,
            metadata: row.metadata.clone(),
            envd_access_token: None,
            allow_internet_access: None,
            domain: None,
        })
    }

    /// The detail form (`GET /sandboxes/{id}`).
    pub fn detail(row: &SandboxRow, access_token: Option<String>) -> Option<ListedWire> {
        let mut wire = ListedWire::of(row)?;
        wire.envd_access_token = access_token;
        wire.allow_internet_access = Some(false);
        wire.domain = Some(None);
        Some(wire)
    }
}

/// One sample of a sandbox's use (`SandboxMetric`).
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MetricWire {
    /// RFC 3339.
    pub timestamp: String,
    /// Unix seconds.
    pub timestamp_unix: i64,
    pub cpu_count: u32,
    /// Average over the sandbox's life so far, percent of its CPU quota.
    pub cpu_used_pct: f64,
    /// Peak memory so far (the cgroup's high-water mark), bytes.
    pub mem_used: u64,
    pub mem_total: u64,
    /// Not measured: 0.
    pub mem_cache: u64,
    /// Not measured (the writable layer counts against memory): 0.
    pub disk_used: u64,
    pub disk_total: u64,
}

/// What the backend measured, in the units [`metric_of`] needs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Measured {
    pub cpu_time_ns: u64,
    pub peak_memory_bytes: Option<u64>,
}

/// A metric sample of `row` at `now_ms` from what was measured.
pub fn metric_of(row: &SandboxRow, measured: Measured, now_ms: i64) -> MetricWire {
    let size = size_of(row);
    let lived_ns = (now_ms.saturating_sub(row.created_at).max(1) as f64) * 1e6;
    let quota = f64::from(size.cpu_millis.max(1)) / 1000.0;
    let pct = (measured.cpu_time_ns as f64 / (lived_ns * quota) * 100.0).clamp(0.0, 100.0);
    MetricWire {
        timestamp: rfc3339(now_ms),
        timestamp_unix: now_ms.div_euclid(1000),
        cpu_count: size.cpu_count,
        cpu_used_pct: (pct * 100.0).round() / 100.0,
        mem_used: measured.peak_memory_bytes.unwrap_or(0),
        mem_total: size.memory_bytes,
        mem_cache: 0,
        disk_used: 0,
        disk_total: size.disk_bytes,
    }
}

/// The query of `GET /v2/sandboxes` (and `GET /sandboxes`, which takes
/// only `metadata`). Unknown parameters are ignored.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListParams {
    /// `k=v&k2=v2`, keys and values percent-encoded once more.
    pub metadata: Option<String>,
    /// Comma-separated `running`, `paused`.
    pub state: Option<String>,
    /// `asc` or `desc`; accepted, the order is always oldest first.
    pub order: Option<String>,
    /// RFC 3339: only sandboxes started at or after it.
    pub started_after: Option<String>,
    /// Only sandboxes of this template.
    pub template: Option<String>,
    /// The `x-next-token` of the previous page.
    pub next_token: Option<String>,
    /// Page size, 1 to 100 (default 100).
    pub limit: Option<String>,
}

/// A parsed list query: what the store filters, and what is filtered here.
#[derive(Debug, Clone, PartialEq)]
pub struct ListPlan {
    pub query: ListQuery,
    /// Unix milliseconds.
    pub started_after: Option<i64>,
    pub template: Option<String>,
}

impl ListPlan {
    /// Whether a row of the store's page belongs in the answer.
    pub fn keeps(&self, row: &SandboxRow) -> bool {
        self.started_after.is_none_or(|t| row.created_at >= t)
            && self.template.as_ref().is_none_or(|t| *t == row.template)
    }
}

/// Parses e2b's list query. Without `state`, running and paused sandboxes
/// are listed (e2b's default).
pub fn list_plan(params: &ListParams) -> Result<ListPlan, E2bError> {
    let mut states = BTreeSet::new();
    match params.state.as_deref().map(str::trim) {
        None | Some("") => {
            states.insert(StoredState::Running);
            states.insert(StoredState::Creating);
            states.insert(StoredState::Paused);
        }
        Some(text) => {
            for name in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                match name {
                    "running" => {
                        states.insert(StoredState::Running);
                        states.insert(StoredState::Creating);
                    }
                    "paused" => {
                        states.insert(StoredState::Paused);
                    }
                    other => {
                        return Err(E2bError::bad_request(format!(
                            "state: unknown state {other:?} (expected running or paused)"
                        )))
                    }
                }
            }
        }
    }
    match params.order.as_deref() {
        None | Some("asc") | Some("desc") => {}
        Some(other) => {
            return Err(E2bError::bad_request(format!(
                "order: {other:?} is neither asc nor desc"
            )))
        }
    }
    let limit = match params.limit.as_deref() {
        None => MAX_PAGE,
        Some(text) => match text.trim().parse::<u32>() {
            Ok(n) if (1..=MAX_PAGE).contains(&n) => n,
            _ => {
                return Err(E2bError::bad_request(format!(
                    "limit: must be between 1 and {MAX_PAGE}"
                )))
            }
        },
    };
    let metadata = match params.metadata.as_deref() {
        Some(text) => parse_metadata(text)?,
        None => BTreeMap::new(),
    };
    let started_after = match params.started_after.as_deref() {
        None => None,
        Some(text) => Some(parse_rfc3339_ms(text).ok_or_else(|| {
            E2bError::bad_request("startedAfter: expected an RFC 3339 date-time")
        })?),
    };
    Ok(ListPlan {
        query: ListQuery {
            states: Some(states),
            metadata,
            owner_key_id: None,
            except_owner_key_id: None,
            limit: Some(limit),
            cursor: params.next_token.clone().filter(|t| !t.is_empty()),
        },
        started_after,
        template: params.template.clone().filter(|t| !t.is_empty()),
    })
}

/// RFC 3339 to unix milliseconds.
fn parse_rfc3339_ms(text: &str) -> Option<i64> {
    let t =
        time::OffsetDateTime::parse(text.trim(), &time::format_description::well_known::Rfc3339)
            .ok()?;
    i64::try_from(t.unix_timestamp_nanos() / 1_000_000).ok()
}

/// e2b's metadata filter: `k=v&k2=v2`. Both SDKs percent-encode each key
/// and value, then form-encode the pairs (encoding the `%`s again), then
/// the whole string is encoded as the query value, which the extractor
/// undid. So each key and value is form-decoded, then percent-decoded (a
/// value encoded only once decodes the same, unless it holds a `%`).
pub fn parse_metadata(text: &str) -> Result<BTreeMap<String, String>, E2bError> {
    let mut pairs = BTreeMap::new();
    for pair in text.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').ok_or_else(|| {
            E2bError::bad_request("metadata: expected URL-encoded key=value pairs")
        })?;
        let decode = |s: &str| {
            crate::types::percent_decode(s, true)
                .and_then(|once| crate::types::percent_decode(&once, false))
                .ok_or_else(|| E2bError::bad_request("metadata: bad percent-encoding"))
        };
        pairs.insert(decode(k)?, decode(v)?);
    }
    Ok(pairs)
}

/// `GET /sandboxes/metrics`: `sandbox_ids` is a comma-separated list.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct MetricsParams {
    pub sandbox_ids: Option<String>,
}

/// The ids of a batch metrics query: 1 to 100 distinct ids.
pub fn metric_ids(params: &MetricsParams) -> Result<Vec<String>, E2bError> {
    let mut ids: Vec<String> = Vec::new();
    for id in params
        .sandbox_ids
        .as_deref()
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        if !ids.iter().any(|known| known == id) {
            ids.push(id.to_owned());
        }
    }
    if ids.is_empty() || ids.len() > 100 {
        return Err(E2bError::bad_request(
            "sandbox_ids: between 1 and 100 comma-separated sandbox ids are required",
        ));
    }
    Ok(ids)
}

/// `{"sandboxes": {id: metric}}`.
#[derive(Debug, Clone, Serialize)]
pub struct MetricsBatchWire {
    pub sandboxes: BTreeMap<String, MetricWire>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_policy::Limits;

    fn row(state: StoredState) -> SandboxRow {
        let spec = SandboxSpec {
            limits: Limits {
                memory_bytes: 512 << 20,
                cpu_millis: 1500,
                disk_bytes: 1 << 30,
                ..Limits::default()
            },
            ..SandboxSpec::default()
        };
        SandboxRow {
            id: "sbx-0123456789abcdef".into(),
            state,
            state_reason: None,
            tier: "process".into(),
            template: "base".into(),
            spec_json: serde_json::to_string(&spec).unwrap(),
            metadata: BTreeMap::from([("owner".to_owned(), "me".to_owned())]),
            owner_key_id: "key-1".into(),
            created_at: 1_700_000_000_000,
            updated_at: 1_700_000_000_000,
            expires_at: 1_700_000_300_000,
            resources_json: None,
        }
    }

    #[test]
    fn the_sandbox_answer_has_every_field_the_sdks_read() {
        let wire = SandboxWire::of(
            &row(StoredState::Running),
            Some("at_x".into()),
            Some("tt_x".into()),
        );
        let json = serde_json::to_value(&wire).unwrap();
        assert_eq!(json["templateID"], "base");
        assert_eq!(json["sandboxID"], "sbx-0123456789abcdef");
        assert_eq!(json["clientID"], "airlock");
        assert_eq!(json["envdVersion"], ENVD_VERSION);
        assert_eq!(json["envdAccessToken"], "at_x");
        assert_eq!(json["alias"], "base");
        // Present and null: the SDK falls back to E2B_SANDBOX_URL.
        assert!(json["domain"].is_null() && json.get("domain").is_some());
        assert_eq!(json["trafficAccessToken"], "tt_x");
    }

    #[test]
    fn listed_and_detail_forms() {
        let listed = ListedWire::of(&row(StoredState::Running)).unwrap();
        let json = serde_json::to_value(&listed).unwrap();
        assert_eq!(json["state"], "running");
        assert_eq!(json["startedAt"], "2023-11-14T22:13:20Z");
        assert_eq!(json["endAt"], "2023-11-14T22:18:20Z");
        assert_eq!(json["cpuCount"], 2);
        assert_eq!(json["memoryMB"], 512);
        assert_eq!(json["diskSizeMB"], 384, "the layer: at most 3/4 of memory");
        assert_eq!(json["metadata"]["owner"], "me");
        assert!(json.get("envdAccessToken").is_none());
        assert!(json.get("domain").is_none());

        let detail = ListedWire::detail(&row(StoredState::Running), Some("at_y".into())).unwrap();
        let json = serde_json::to_value(&detail).unwrap();
        assert_eq!(json["envdAccessToken"], "at_y");
        assert_eq!(json["allowInternetAccess"], false);
        assert!(json["domain"].is_null() && json.get("domain").is_some());

        assert!(ListedWire::of(&row(StoredState::Dead)).is_none());
        assert!(ListedWire::of(&row(StoredState::Stopping)).is_none());
        assert_eq!(
            ListedWire::of(&row(StoredState::Paused)).unwrap().state,
            "paused"
        );
    }

    #[test]
    fn create_requests_translate_or_say_what_is_missing() {
        let body: NewSandbox = serde_json::from_value(serde_json::json!({
            "templateID": "base", "timeout": 60, "metadata": {"a": "b"},
            "envVars": {"K": "V"}, "secure": true, "allow_internet_access": true,
            "autoPause": false, "mcp": null, "someFutureField": 1
        }))
        .unwrap();
        assert_eq!(body.template_name().unwrap(), "base");
        assert_eq!(
            template_choice("base"),
            TemplateChoice::Registered("base".into())
        );
        assert_eq!(
            template_choice("code-interpreter-v1"),
            TemplateChoice::Registered("base".into())
        );
        assert_eq!(template_choice("host"), TemplateChoice::Host);
        assert_eq!(
            template_choice("mine"),
            TemplateChoice::Registered("mine".into())
        );
        let native = body.to_native("host", 300, 86_400, false).unwrap();
        assert_eq!(native.template.as_deref(), Some("host"));
        assert_eq!(native.timeout_s, Some(60));
        assert_eq!(native.env.unwrap()["K"], "V");
        assert_eq!(native.metadata.unwrap()["a"], "b");
        assert_eq!(native.tier, None);
        let tiered: NewSandbox = serde_json::from_value(serde_json::json!({
            "templateID": "base", "metadata": {"airlock.tier": "gvisor"},
        }))
        .unwrap();
        let native = tiered.to_native("base", 300, 3600, false).unwrap();
        assert_eq!(native.tier.as_deref(), Some("gvisor"));
        assert_eq!(native.network.unwrap().mode, "none");

        let default = NewSandbox {
            template_id: Some("base".into()),
            ..NewSandbox::default()
        };
        assert_eq!(
            default
                .to_native("host", 300, 86_400, false)
                .unwrap()
                .timeout_s,
            Some(300)
        );

        let refused = |value: serde_json::Value| {
            let body: NewSandbox = serde_json::from_value(value).unwrap();
            body.to_native("host", 300, 86_400, false).unwrap_err()
        };
        let e = refused(
            serde_json::json!({"templateID": "base", "network": {"egressProxy": {"url": "x"}}}),
        );
        assert_eq!(e.message, NO_EGRESS_PROXY);
        assert_eq!(
            refused(serde_json::json!({"templateID": "base", "timeout": 0}))
                .status
                .as_u16(),
            400
        );
        assert_eq!(
            refused(serde_json::json!({"templateID": "base", "timeout": 100000}))
                .status
                .as_u16(),
            400
        );
        assert!(
            refused(serde_json::json!({"templateID": "base", "autoPause": true,
            "autoPauseMemory": false, "autoResume": {"enabled": true}}))
            .message
            .contains("autoPauseMemory")
        );
        assert!(refused(
            serde_json::json!({"templateID": "base", "autoResume": {"enabled": true}})
        )
        .message
        .contains("autoResume needs autoPause"));
        let lifecycle = |value: serde_json::Value| {
            let body: NewSandbox = serde_json::from_value(value).unwrap();
            body.to_native("host", 300, 86_400, false)
                .unwrap()
                .lifecycle
                .unwrap()
        };
        let paused = lifecycle(serde_json::json!({"templateID": "base", "autoPause": true,
            "autoResume": {"enabled": true}}));
        assert_eq!(paused.on_timeout, airlock_policy::OnTimeout::Pause);
        assert!(paused.auto_resume);
        let files = lifecycle(serde_json::json!({"templateID": "base", "autoPause": true,
            "autoPauseMemory": false}));
        assert!(files.files_only && !files.auto_resume, "{files:?}");
        let plain = lifecycle(serde_json::json!({"templateID": "base", "autoPause": false}));
        assert_eq!(plain, airlock_policy::Lifecycle::default());
        assert!(
            refused(serde_json::json!({"templateID": "base", "mcp": {"x": {}}}))
                .message
                .contains("MCP")
        );
        let body: NewSandbox = serde_json::from_value(
            serde_json::json!({"templateID": "base", "volumeMounts": [{"name": "v", "path": "/v"}]}),
        )
        .unwrap();
        let volumes = body.to_native("host", 300, 86_400, false).unwrap().volumes;
        assert_eq!(volumes.unwrap()[0].name, "v");
        // Denying egress is what happens anyway.
        let body: NewSandbox = serde_json::from_value(serde_json::json!({
            "templateID": "base", "allow_internet_access": false,
            "network": {"denyOut": ["0.0.0.0/0"]}
        }))
        .unwrap();
        assert!(body.to_native("host", 300, 86_400, false).is_ok());
        assert!(NewSandbox::default().template_name().is_err());
    }

    #[test]
    fn e2b_egress_maps_onto_policies() {
        let mode = |internet: Option<bool>, network: serde_json::Value, default: bool| {
            let network: NetworkConfig = serde_json::from_value(network).unwrap();
            let input = network_input(internet, Some(&network), default).unwrap();
            (input.mode, input.rules)
        };
        // Internet on, nothing else: the daemon's default.
        assert_eq!(
            mode(Some(true), serde_json::json!({}), false),
            ("none".into(), None)
        );
        assert_eq!(
            mode(None, serde_json::json!({}), true),
            ("open".into(), None)
        );
        // Off: none, or exactly what allowOut gives back.
        assert_eq!(
            mode(Some(false), serde_json::json!({}), true),
            ("none".into(), None)
        );
        assert_eq!(
            mode(
                Some(false),
                serde_json::json!({"allowOut": ["pypi.org"]}),
                false
            ),
            ("allow".into(), Some(vec!["pypi.org".to_owned()]))
        );
        // denyOut everything + allowOut: an allowlist.
        assert_eq!(
            mode(
                Some(true),
                serde_json::json!({"denyOut": ["0.0.0.0/0"], "allowOut": ["1.1.1.1", "*.example.com"]}),
                false
            ),
            (
                "allow".into(),
                Some(vec!["1.1.1.1".to_owned(), "*.example.com".to_owned()])
            )
        );
        // allowOut with the internet on adds nothing to open; where the
        // daemon denies by default, it is all the sandbox gets.
        assert_eq!(
            mode(
                Some(true),
                serde_json::json!({"allowOut": ["pypi.org"]}),
                true
            ),
            ("open".into(), None)
        );
        assert_eq!(
            mode(
                Some(true),
                serde_json::json!({"allowOut": ["pypi.org"]}),
                false
            ),
            ("allow".into(), Some(vec!["pypi.org".to_owned()]))
        );
        let refused = |network: serde_json::Value| {
            let network: NetworkConfig = serde_json::from_value(network).unwrap();
            network_input(Some(true), Some(&network), true).unwrap_err()
        };
        // Single destinations denied: open but those, allowOut winning;
        // where the internet is not open, the allowlist denies them anyway.
        assert_eq!(
            mode(
                Some(true),
                serde_json::json!({"denyOut": ["8.8.8.8/32"], "allowOut": ["8.8.8.8"]}),
                true
            ),
            ("deny".into(), Some(vec!["8.8.8.8/32".to_owned()]))
        );
        assert_eq!(
            mode(
                Some(true),
                serde_json::json!({"denyOut": ["8.8.8.8/32"], "allowOut": ["1.1.1.1"]}),
                false
            ),
            ("allow".into(), Some(vec!["1.1.1.1".to_owned()]))
        );
        assert_eq!(
            refused(serde_json::json!({"rules": {"a.com": []}})).message,
            NO_EGRESS_PROXY
        );
    }

    #[test]
    fn list_queries_parse() {
        let plan = list_plan(&ListParams::default()).unwrap();
        let states = plan.query.states.clone().unwrap();
        assert!(states.contains(&StoredState::Running) && states.contains(&StoredState::Paused));
        assert!(!states.contains(&StoredState::Dead));
        assert_eq!(plan.query.limit, Some(100));

        let plan = list_plan(&ListParams {
            // What the SDKs send for {"user": "a b", "k&": "v=", "p": "1+1%"}
            // after the query string's own decoding.
            metadata: Some("user=a%2520b&k%2526=v%253D&p=1%252B1%2525".into()),
            state: Some("paused".into()),
            limit: Some("2".into()),
            next_token: Some("tok".into()),
            started_after: Some("2023-11-14T22:13:20Z".into()),
            template: Some("base".into()),
            order: Some("desc".into()),
        })
        .unwrap();
        assert_eq!(plan.query.metadata["user"], "a b");
        assert_eq!(plan.query.metadata["k&"], "v=");
        assert_eq!(plan.query.metadata["p"], "1+1%");
        // Encoded once (curl, by hand) works too.
        assert_eq!(parse_metadata("user=a%20b").unwrap()["user"], "a b");
        assert_eq!(
            plan.query.states,
            Some(BTreeSet::from([StoredState::Paused]))
        );
        assert_eq!(plan.query.limit, Some(2));
        assert_eq!(plan.query.cursor.as_deref(), Some("tok"));
        assert_eq!(plan.started_after, Some(1_700_000_000_000));
        assert!(plan.keeps(&row(StoredState::Running)));
        let mut other = row(StoredState::Running);
        other.template = "mine".into();
        assert!(!plan.keeps(&other));
        other.template = "base".into();
        other.created_at -= 1;
        assert!(!plan.keeps(&other));

        for bad in [
            ListParams {
                state: Some("dead".into()),
                ..ListParams::default()
            },
            ListParams {
                limit: Some("0".into()),
                ..ListParams::default()
            },
            ListParams {
                limit: Some("101".into()),
                ..ListParams::default()
            },
            ListParams {
                metadata: Some("novalue".into()),
                ..ListParams::default()
            },
            ListParams {
                started_after: Some("yesterday".into()),
                ..ListParams::default()
            },
            ListParams {
                order: Some("random".into()),
                ..ListParams::default()
            },
        ] {
            assert_eq!(list_plan(&bad).unwrap_err().status.as_u16(), 400);
        }
    }

    #[test]
    fn metrics_are_averages_over_the_life_so_far() {
        let r = row(StoredState::Running);
        // 1.5 CPUs for 10 s is 15 CPU-seconds; 3 s used is 20 %.
        let m = metric_of(
            &r,
            Measured {
                cpu_time_ns: 3_000_000_000,
                peak_memory_bytes: Some(1 << 20),
            },
            r.created_at + 10_000,
        );
        assert_eq!(m.cpu_used_pct, 20.0);
        assert_eq!(m.mem_used, 1 << 20);
        assert_eq!(m.mem_total, 512 << 20);
        assert_eq!(m.disk_total, 384 << 20);
        assert_eq!(m.cpu_count, 2);
        assert_eq!(m.timestamp_unix, 1_700_000_010);
        let json = serde_json::to_value(&m).unwrap();
        for field in [
            "timestamp",
            "timestampUnix",
            "cpuCount",
            "cpuUsedPct",
            "memUsed",
            "memTotal",
            "memCache",
            "diskUsed",
            "diskTotal",
        ] {
            assert!(json.get(field).is_some(), "{field}");
        }
        let idle = metric_of(&r, Measured::default(), r.created_at);
        assert_eq!(idle.cpu_used_pct, 0.0);
        assert_eq!(idle.mem_used, 0);
    }

    #[test]
    fn metric_ids_are_checked() {
        let ids = metric_ids(&MetricsParams {
            sandbox_ids: Some("a, b,a".into()),
        })
        .unwrap();
        assert_eq!(ids, ["a", "b"]);
        assert!(metric_ids(&MetricsParams::default()).is_err());
        let many = (0..101)
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(",");
        assert!(metric_ids(&MetricsParams {
            sandbox_ids: Some(many)
        })
        .is_err());
    }
}
