//! The seam between the control plane and the isolation tiers.
//!
//! A [`Backend`] turns a validated [`SandboxSpec`] into a running sandbox
//! whose agent the daemon can talk to, finds its sandboxes again after a
//! daemon restart, and releases everything one of them holds. The daemon
//! knows nothing else about a tier: every process and file operation goes
//! through the agent protocol ([`AgentClient`]), the same on every tier.
//!
//! Each backend says whether it can run here with [`Backend::probe`], and
//! why not when it cannot (as cloud-hypervisor's hypervisor probes do).
//! The tiers of this host's kernel and of gVisor's (`process`, `oci`,
//! `gvisor`) are one backend, [`process::ProcessBackend`], with a
//! supervisor per sandbox that launches it one way or another
//! ([`process::Runner`]); the `microvm` and Kubernetes tiers plug in beside
//! it.

pub mod process;
pub mod volumes;

use airlock_policy::{SandboxSpec, Tier};
use airlock_protocol::AgentClient;
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;

/// What a sandbox holds on the host that teardown must release, recorded in
/// the store before the sandbox is created and updated once it runs, so a
/// daemon that crashed can still find and release it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Resources {
    /// A process-tier sandbox owned by an `airlock supervise` process.
    Process(Supervised),
    /// An oci-tier sandbox (runc) owned by an `airlock supervise` process.
    Oci(Supervised),
    /// A gvisor-tier sandbox (runsc) owned by an `airlock supervise` process.
    Gvisor(Supervised),
}

/// What the tiers whose sandboxes have a supervisor each record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Supervised {
    /// The supervisor's pid; `None` until it has started.
    pub supervisor_pid: Option<u32>,
    /// The unix socket the supervisor serves the agent channel on.
    pub socket: String,
}

impl Resources {
    /// The tier whose records these are.
    pub fn tier(&self) -> Tier {
        match self {
            Resources::Process(_) => Tier::Process,
            Resources::Oci(_) => Tier::Oci,
            Resources::Gvisor(_) => Tier::Gvisor,
        }
    }
}

/// How a sandbox ended, as far as the backend could tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Ending {
    /// It was stopped on request and released cleanly.
    Stopped,
    /// The kernel's OOM killer took its agent down.
    Oom,
    /// It died on its own (the agent exited or was killed).
    Crashed,
    /// Its owner ended it at its deadline (see [`Backend::set_deadline`]):
    /// the daemon's reaper did not act first, e.g. because no daemon ran.
    Expired,
    /// Its owner is gone and how it ended is unknown (e.g. adopted after a
    /// restart and then lost).
    Unknown,
}

/// Resolves once the sandbox is gone, with how it ended.
pub type Ended = Pin<Box<dyn Future<Output = Ending> + Send + 'static>>;

/// Where a sandbox's network traffic can be met, for the egress path to
/// serve it: the tier says, not the daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EgressPoint {
    /// A network namespace of the host's kernel, by a path that opens it
    /// (`/proc/PID/ns/net` of a process in it). The process tier's; a VM's
    /// tap device or a remote tier's address will sit beside it.
    Netns(std::path::PathBuf),
}

/// Where the ports a sandbox's processes listen on on its loopback can be
/// dialled from the host directly, without its agent (which every tier can
/// do, more slowly: its `connect`). The tier says; `None` in [`Instance`]
/// when its loopback is not the host kernel's (gVisor's netstack).
#[derive(Debug)]
pub enum PortsPoint {
    /// A network namespace of the host's kernel, opened while the sandbox
    /// was known to be alive. A VM's vsock will sit beside it.
    Netns(airlock_jail::loopback::LoopbackNamespace),
}

pub use airlock_jail::loopback::DialError;

impl PortsPoint {
    /// Connects to `port` on the sandbox's loopback within `timeout`
    /// (blocking).
    pub fn dial(
        &self,
        port: u16,
        timeout: std::time::Duration,
    ) -> Result<std::net::TcpStream, DialError> {
        match self {
            PortsPoint::Netns(namespace) => namespace.dial(port, timeout),
        }
    }
}

/// A running sandbox, as [`Backend::create`] or [`Backend::adopt`] hand it over.
pub struct Instance {
    /// The multiplexed connection to its agent.
    pub agent: AgentClient,
    /// What to record for teardown.
    pub resources: Resources,
    /// Resolves when the sandbox is gone.
    pub ended: Ended,
    /// Where its traffic leaves it; `None` when the tier cannot say (it
    /// then gets no egress path, so no network).
    pub egress: Option<EgressPoint>,
    /// Where its ports can be dialled directly; `None`: through the agent.
    pub ports: Option<PortsPoint>,
}

/// Usage figures of a live sandbox.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    /// Times the OOM killer killed one of its processes so far.
    pub oom_kills: u64,
    /// Times a fork failed at its pids limit so far.
    pub pids_limit_hits: u64,
    /// Peak memory in bytes, when the kernel reports it.
    pub peak_memory_bytes: Option<u64>,
    /// CPU time so far, nanoseconds.
    pub cpu_time_ns: u64,
}

/// What [`Backend::reconcile`] found and removed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Reconciled {
    /// Sandboxes that were running without a record, now stopped.
    pub stopped: Vec<String>,
    /// Leftovers (cgroups, slot records, sockets) of dead sandboxes, now removed.
    pub removed: Vec<String>,
}

/// Why a backend cannot run sandboxes on this machine.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the {tier} tier is not available here: {reason}")]
pub struct Unavailable {
    /// The tier's name.
    pub tier: &'static str,
    /// What is missing, in a sentence.
    pub reason: String,
}

/// A sandbox could not be created.
#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    /// The spec cannot run here (a limit, a template, a mount); the message
    /// is safe to show to the API client.
    #[error("{0}")]
    BadInput(String),
    /// The backend failed; the message is for the operator's log.
    #[error("{0}")]
    Failed(String),
}

/// A recorded sandbox could not be taken over again.
#[derive(Debug, thiserror::Error)]
pub enum AdoptError {
    /// Its owner process is gone: the sandbox has ended, and `ending` says
    /// how when it left word.
    #[error("its supervisor is gone")]
    Gone {
        /// How it ended, if known.
        ending: Option<Ending>,
    },
    /// The recorded resources are not this backend's.
    #[error("the recorded resources belong to another tier")]
    WrongTier,
    /// The record names no owner process (it never finished starting).
    #[error("the record names no supervisor")]
    NotStarted,
    /// Its agent answered but cannot be used (it speaks none of our
    /// protocol versions).
    #[error("its agent cannot be used")]
    Incompatible(#[source] airlock_protocol::ClientError),
    /// Its owner process runs but did not answer (a refused or timed-out
    /// connection, a greeting cut short): it may well answer later.
    #[error("its supervisor runs but did not answer: {0}")]
    Unreachable(String),
}

impl AdoptError {
    /// Whether trying again later may succeed: the sandbox is alive and
    /// must not be reaped for this failure.
    pub fn is_transient(&self) -> bool {
        matches!(self, AdoptError::Unreachable(_))
    }
}

/// A sandbox's deadline could not be handed to its owner.
#[derive(Debug, thiserror::Error)]
#[error("cannot hand the deadline of {id} to its supervisor")]
pub struct DeadlineError {
    /// The sandbox.
    pub id: String,
    /// Why.
    #[source]
    pub source: std::io::Error,
}

/// A sandbox could not be released completely.
#[derive(Debug, thiserror::Error)]
#[error("teardown of {id} left {what} behind")]
pub struct DestroyError {
    /// The sandbox.
    pub id: String,
    /// What was left.
    pub what: String,
}

/// A sandbox's writable layer could not be exported.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// The tier keeps no writable layer it can read.
    #[error("the {tier} tier cannot export a sandbox's writable layer")]
    Unsupported { tier: &'static str },
    /// The daemon keeps writable layers in memory.
    #[error("writable layers are kept in memory here; exporting one needs them on disk (airlock serve --writable-layers disk)")]
    NotOnDisk,
    /// The sandbox runs no template of layers (its writable layer is its
    /// whole root, not changes over one).
    #[error("sandbox {0} runs no template of layers, so it has no changes to export")]
    NoLayers(String),
    /// No writable layer of that sandbox is here.
    #[error("sandbox {0} has no writable layer here")]
    NotFound(String),
    /// Reading the layer failed.
    #[error(transparent)]
    Snapshot(#[from] airlock_layers::snapshot::SnapshotError),
    /// The blocking task that read it was lost.
    #[error("the export was interrupted")]
    Interrupted,
}

/// What a pause keeps of a sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PauseMode {
    /// Its processes and their memory, as they are: frozen in place, or
    /// checkpointed to disk by a tier that can (so the pause holds no
    /// RAM), so a resume continues them.
    Memory,
    /// Its files only: its processes end, and a resume starts fresh ones
    /// on the same files.
    Filesystem,
    /// Its processes stopped where they are, in place, for a moment (what
    /// the daemon needs while it reads a sandbox's files): never a
    /// checkpoint.
    Freeze,
}

impl PauseMode {
    /// The mode's name, as the API spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            PauseMode::Memory => "memory",
            PauseMode::Filesystem => "filesystem",
            PauseMode::Freeze => "freeze",
        }
    }
}

/// A sandbox's state could not be paused, resumed or snapshotted.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The tier cannot do it (yet).
    #[error("the {tier} tier cannot {what} a sandbox yet")]
    Unsupported {
        tier: &'static str,
        what: &'static str,
    },
    /// The sandbox is not a live one of this backend.
    #[error("sandbox {0} is not running here")]
    NotRunning(String),
    /// The tier tried and failed.
    #[error("cannot {what} sandbox {id}: {reason}")]
    Failed {
        id: String,
        what: &'static str,
        reason: String,
    },
}

/// One isolation tier.
#[async_trait::async_trait]
pub trait Backend: Send + Sync + 'static {
    /// The tier this backend runs.
    fn tier(&self) -> Tier;

    /// Whether the tier can run on this machine, and why not.
    fn probe(&self) -> Result<(), Unavailable>;

    /// A fresh sandbox id for the next `create`, of `spec`. A backend may
    /// have prepared work for that id ahead (a started supervisor, with a
    /// network namespace if the spec needs one); the daemon records the
    /// sandbox under it, then calls `create` with it, or `unreserve` if it
    /// will not.
    fn reserve_id(&self, spec: &SandboxSpec) -> String;

    /// Gives back an id from `reserve_id` that will not be created.
    fn unreserve(&self, id: &str);

    /// Prepares ahead what the next `create` can use (called once serving
    /// starts).
    fn warm(&self) {}

    /// Releases what was prepared ahead (at daemon shutdown). Sandboxes keep
    /// running.
    fn shutdown(&self) {}

    /// Starts a sandbox named `id` for `spec` and connects to its agent.
    async fn create(&self, id: &str, spec: &SandboxSpec) -> Result<Instance, CreateError>;

    /// Connects again to a sandbox this backend started before the daemon
    /// restarted.
    async fn adopt(&self, id: &str, resources: &Resources) -> Result<Instance, AdoptError>;

    /// Tells the owner of a live sandbox to end it on its own at
    /// `at_ms` (unix milliseconds) plus a short grace, whether or not a
    /// daemon still runs then. The daemon calls it with every change of
    /// the deadline in force (an extension of a running sandbox's timeout;
    /// later a paused sandbox's TTL), each call replacing the last; until
    /// the first, the owner enforces the spec's timeout from its launch.
    /// The channel is the host's: nothing inside the sandbox can reach it.
    fn set_deadline(
        &self,
        id: &str,
        resources: &Resources,
        at_ms: i64,
    ) -> Result<(), DeadlineError>;

    /// Stops the sandbox and releases everything it holds. Idempotent: a
    /// sandbox already gone is a success. `resources` is what was recorded,
    /// if anything.
    async fn destroy(&self, id: &str, resources: Option<&Resources>) -> Result<(), DestroyError>;

    /// Writes what sandbox `id` changed of its template (its overlay's
    /// writable layer) to `out` as an uncompressed OCI layer tar stream,
    /// owners as the sandbox sees them (see
    /// `airlock_layers::snapshot`). For template builds and, later,
    /// snapshots; the sandbox should be idle while it runs (a node that
    /// changes while it is read fails the export). Tiers that keep no such
    /// layer say so.
    async fn export_writable_layer(
        &self,
        id: &str,
        out: Box<dyn std::io::Write + Send>,
    ) -> Result<airlock_layers::snapshot::Snapshotted, ExportError> {
        let _ = (id, out);
        Err(ExportError::Unsupported {
            tier: self.tier().as_str(),
        })
    }

    /// Pauses sandbox `id`, keeping what `mode` says, so it uses no CPU
    /// (and, for a tier that checkpoints, no memory) until
    /// [`Backend::resume`]. Tiers that cannot say so.
    async fn pause(
        &self,
        id: &str,
        resources: &Resources,
        mode: PauseMode,
    ) -> Result<(), StateError> {
        let _ = (id, resources, mode);
        Err(StateError::Unsupported {
            tier: self.tier().as_str(),
            what: "pause",
        })
    }

    /// Sets the memory and CPU limits of the running sandbox `id` (a warm
    /// pool's member, claimed with limits of its own); everything else
    /// stays as it was created. Tiers that cannot say so.
    async fn resize(
        &self,
        id: &str,
        resources: &Resources,
        memory_bytes: u64,
        cpu_millis: u32,
    ) -> Result<(), StateError> {
        let _ = (id, resources, memory_bytes, cpu_millis);
        Err(StateError::Unsupported {
            tier: self.tier().as_str(),
            what: "changing limits",
        })
    }

    /// Resumes a sandbox [`Backend::pause`] paused with its memory kept:
    /// its processes continue where they were. Tiers that cannot say so.
    async fn resume(&self, id: &str, resources: &Resources) -> Result<(), StateError> {
        let _ = (id, resources);
        Err(StateError::Unsupported {
            tier: self.tier().as_str(),
            what: "resume",
        })
    }

    /// Writes the memory state of sandbox `id` (its processes, for a new
    /// sandbox to continue) under `dir`, for snapshots and forks. Its files
    /// are [`Backend::export_writable_layer`]'s. Tiers that cannot say so.
    async fn snapshot_memory(
        &self,
        id: &str,
        resources: &Resources,
        dir: &std::path::Path,
    ) -> Result<(), StateError> {
        let _ = (id, resources, dir);
        Err(StateError::Unsupported {
            tier: self.tier().as_str(),
            what: "snapshot the memory of",
        })
    }

    /// Current usage of a live sandbox; `None` if it is not running.
    async fn usage(&self, id: &str) -> Option<Usage>;

    /// Stops every sandbox of this tier that is not in `keep` and removes
    /// the leftovers of dead ones. Run at daemon start, after adoption.
    async fn reconcile(&self, keep: &HashSet<String>) -> Reconciled;

    /// Host resources of this tier that belong to no sandbox in `keep`
    /// (for the leaked-resource gauge; must stay 0).
    async fn leaked(&self, keep: &HashSet<String>) -> usize;
}

/// The error and its causes in one line (`a: b: c`), for logs and for
/// messages that carry a failure on.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn records_keep_their_wire_form_and_name_their_tier() {
        // What a daemon of before the OCI tiers wrote reads back the same.
        let old = r#"{"kind":"process","supervisor_pid":7,"socket":"/run/x.sock"}"#;
        let resources: Resources = serde_json::from_str(old).unwrap();
        assert_eq!(resources.tier(), Tier::Process);
        assert_eq!(serde_json::to_string(&resources).unwrap(), old);
        for (kind, tier) in [("gvisor", Tier::Gvisor), ("oci", Tier::Oci)] {
            let text = format!(r#"{{"kind":"{kind}","supervisor_pid":null,"socket":"/s"}}"#);
            let resources: Resources = serde_json::from_str(&text).unwrap();
            assert_eq!(resources.tier(), tier);
        }
        assert!(serde_json::from_str::<Resources>(
            r#"{"kind":"gvisor","supervisor_pid":1,"socket":"/s","extra":1}"#
        )
        .is_err());
    }
}
