//! The tiers whose sandboxes each have a supervisor process on this host:
//! `process` (namespaces, seccomp, Landlock and cgroups around a process
//! tree on this kernel, `airlock-jail`), and `oci` and `gvisor`, whose
//! supervisor runs the sandbox's OCI bundle with runc or runsc
//! (`airlock-oci`). Everything below is the same for the three but what
//! the supervisor is told to launch ([`Runner`]).
//!
//! Launching needs a single-threaded process (the child runs Rust between
//! clone and exec), and the daemon is multi-threaded, so each sandbox gets
//! a fresh `airlock supervise` process. It takes the spec on stdin, launches,
//! answers one JSON line, then serves the agent channel on
//! `/run/airlock/sockets/<id>.sock`, relaying whole frames. It also leaves
//! the daemon's session, so a daemon that dies or restarts leaves its
//! sandboxes running; the next daemon [`adopts`](Backend::adopt) them by
//! connecting to the socket again.
//!
//! The daemon watches each supervisor through a pidfd, which works for its
//! own children and for adopted supervisors alike and cannot be fooled by a
//! recycled pid once open. The supervisor's exit code says how the sandbox
//! ended (see `crates/airlock/src/supervise.rs`).

pub mod deadline;

use crate::{
    AdoptError, Backend, CreateError, DeadlineError, DestroyError, EgressPoint, Ended, Ending,
    ExportError, Instance, PauseMode, PortsPoint, Reconciled, Resources, StateError, Supervised,
    Unavailable, Usage,
};
use airlock_jail::cgroup::{CgroupLayout, SandboxCgroup};
use airlock_jail::disk::DiskStore;
use airlock_jail::runtime::RuntimeDir;
use airlock_policy::{SandboxSpec, Tier};
use airlock_protocol::AgentClient;
use airlock_protocol::ClientError;
use rustix::process::{Pid, PidfdFlags, Signal, WaitId, WaitIdOptions};
use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::io::unix::AsyncFd;
use tokio::net::UnixStream;
use tokio::sync::watch;

/// How long a stopped supervisor gets for its teardown before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(10);
/// How long the agent gets to answer the greeting.
const GREETING_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a checkpoint or a restore of a sandbox's memory may take.
const MEMORY_OP_WITHIN: Duration = Duration::from_secs(120);

/// How long a pause waits for every process of a sandbox to freeze.
const FREEZE_WITHIN: Duration = Duration::from_secs(5);

/// One supervisor the daemon watches.
struct Supervisor {
    pidfd: OwnedFd,
    /// `None` while it runs; how it ended afterwards.
    ended: watch::Receiver<Option<Ending>>,
}

/// What this backend's supervisors launch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Runner {
    /// The sandbox itself, with `airlock-jail`: the `process` tier.
    Jail,
    /// The sandbox's OCI bundle, with an OCI runtime: the `oci` (runc) and
    /// `gvisor` (runsc) tiers.
    Oci(airlock_oci::Runtime),
}

/// The supervised tiers (one backend per tier).
pub struct ProcessBackend {
    /// What the supervisors launch, and so the tier.
    runner: Runner,
    /// The `airlock` binary that has the `supervise` command.
    exe: PathBuf,
    /// Tag of this daemon (hex), on every supervisor's command line and in
    /// its socket directory, so reconciliation sees only its own.
    owner: String,
    runtime: RuntimeDir,
    cgroups: Option<CgroupLayout>,
    supervisors: Mutex<HashMap<String, Arc<Supervisor>>>,
    /// The next supervisors, started ahead so a create skips their work.
    spares: Arc<Mutex<Spares>>,
    /// Spares handed out by `reserve_id`, waiting for their `create`.
    reserved: Mutex<HashMap<String, Spare>>,
    /// The disk store of writable layers on disk, if the daemon has one.
    disk: Option<DiskStore>,
    /// Whether a pause keeping memory saves it to disk (gVisor's
    /// checkpoint) rather than freezing it in place.
    checkpoints: bool,
    /// The last memory request's number (see [`deadline::MemoryRequest`]).
    memory_seq: std::sync::atomic::AtomicU64,
}

impl ProcessBackend {
    /// A backend that starts supervisors from `exe`, tags them with `owner`
    /// (1 to 32 hex digits, unique per daemon data directory) and keeps its
    /// runtime state under the system runtime directory.
    pub fn new(exe: PathBuf, owner: String) -> ProcessBackend {
        ProcessBackend {
            runner: Runner::Jail,
            exe,
            owner,
            runtime: RuntimeDir::system(),
            cgroups: CgroupLayout::detect().ok(),
            supervisors: Mutex::new(HashMap::new()),
            spares: Arc::new(Mutex::new(Spares::default())),
            reserved: Mutex::new(HashMap::new()),
            disk: None,
            checkpoints: false,
            memory_seq: std::sync::atomic::AtomicU64::new(deadline::now_ms().unsigned_abs()),
        }
    }

    /// A backend of the tier `runtime` serves (`oci` for runc, `gvisor` for
    /// runsc), otherwise as [`ProcessBackend::new`].
    pub fn oci(exe: PathBuf, owner: String, runtime: airlock_oci::Runtime) -> ProcessBackend {
        ProcessBackend {
            runner: Runner::Oci(runtime),
            ..ProcessBackend::new(exe, owner)
        }
    }

    /// What a record of this tier holds.
    fn resources(&self, supervised: Supervised) -> Resources {
        match &self.runner {
            Runner::Jail => Resources::Process(supervised),
            Runner::Oci(runtime) => match runtime.kind {
                airlock_oci::Kind::Gvisor => Resources::Gvisor(supervised),
                airlock_oci::Kind::Runc => Resources::Oci(supervised),
            },
        }
    }

    /// The record of `resources` if it is this tier's.
    fn supervised<'r>(&self, resources: &'r Resources) -> Option<&'r Supervised> {
        let (Resources::Process(supervised)
        | Resources::Oci(supervised)
        | Resources::Gvisor(supervised)) = resources;
        (resources.tier() == self.tier()).then_some(supervised)
    }

    /// Pauses that keep memory save it to disk, on a tier whose runtime
    /// can (gVisor's `runsc checkpoint`): a paused sandbox then holds no
    /// RAM, and a resume restores it. Elsewhere they freeze in place.
    pub fn with_checkpoints(mut self, on: bool) -> ProcessBackend {
        self.checkpoints = on;
        self
    }

    /// Whether this tier's pauses keeping memory save it to disk.
    fn checkpoints(&self) -> bool {
        self.checkpoints
            && self.disk.is_some()
            && matches!(&self.runner, Runner::Oci(runtime) if runtime.kind == airlock_oci::Kind::Gvisor)
    }

    /// Asks the supervisor of `id` to save or restore its sandbox's memory
    /// and waits for its answer.
    async fn memory_op(
        &self,
        id: &str,
        resources: &Resources,
        op: deadline::MemoryOp,
    ) -> Result<u64, StateError> {
        let what = match op {
            deadline::MemoryOp::Checkpoint => "pause (saving its memory)",
            deadline::MemoryOp::Restore => "resume (restoring its memory)",
        };
        let failed = |reason: String| StateError::Failed {
            id: id.to_owned(),
            what,
            reason,
        };
        let Some(Supervised {
            socket,
            supervisor_pid,
        }) = self.supervised(resources)
        else {
            return Err(failed(
                "the recorded resources belong to another tier".into(),
            ));
        };
        let socket = PathBuf::from(socket);
        // Watched by this daemon, or (a sandbox paused before a restart,
        // which is restored before its agent can be adopted) found by its
        // recorded pid.
        let pidfd = match self.supervisor(id) {
            Some(supervisor) => supervisor.pidfd.try_clone().ok(),
            None => supervisor_pid.and_then(|pid| open_supervisor(pid, id)),
        };
        let Some(pidfd) = pidfd else {
            return Err(failed("its supervisor is gone".into()));
        };
        let seq = self
            .memory_seq
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
            + 1;
        deadline::write_json(
            &deadline::memory_request_file(&socket),
            &deadline::MemoryRequest { seq, op },
        )
        .map_err(|e| failed(format!("cannot ask its supervisor: {e}")))?;
        let answers = deadline::memory_answer_file(&socket);
        let started = std::time::Instant::now();
        let mut nudged = None::<std::time::Instant>;
        loop {
            // Nudged again now and then: a supervisor busy with an earlier
            // request reads it once it is done (the same number is one
            // request).
            if nudged.is_none_or(|at| at.elapsed() > Duration::from_millis(500)) {
                signal(&pidfd, deadline::NUDGE);
                nudged = Some(std::time::Instant::now());
            }
            if let Some(answer) = deadline::read_json::<deadline::MemoryAnswer>(&answers) {
                if answer.seq == seq {
                    return match answer.error {
                        None => Ok(answer.bytes),
                        Some(reason) => Err(failed(reason)),
                    };
                }
            }
            if has_exited(&pidfd) {
                return Err(failed("its supervisor ended".into()));
            }
            if started.elapsed() > MEMORY_OP_WITHIN {
                return Err(failed(format!(
                    "its supervisor did not answer within {} s",
                    MEMORY_OP_WITHIN.as_secs()
                )));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Makes writable layers on disk in `disk` (the supervisors are told
    /// where it is); without one, specs asking for that fail to launch.
    pub fn with_disk(mut self, disk: DiskStore) -> ProcessBackend {
        self.disk = Some(disk);
        self
    }

    /// Starts the next spare supervisor of `kind` in the background, if
    /// none waits.
    fn refill(&self, kind: SpareKind) {
        let (exe, owner, spares) = (
            self.exe.clone(),
            self.owner.clone(),
            Arc::clone(&self.spares),
        );
        let disk = self.disk.as_ref().map(|d| d.root().to_owned());
        let runner = self.runner.clone();
        let id = airlock_jail::launch::new_sandbox_id();
        let socket = self.socket_of(&id);
        // Outside a runtime (a backend a synchronous test or tool built) no
        // spare is started: nothing there would claim or stop it.
        if tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        // The lock is not held while the spare starts: a create must not
        // wait for the spare of the other kind. The spare starts from a
        // thread of its own under `SCHED_IDLE`, which the child inherits
        // from its first instruction; no code runs between fork and exec,
        // so the spawn is a vfork-style one: a fork would copy the
        // daemon's page tables and hold its memory map locked while the
        // create that asked for the refill runs (0.8 ms of each create
        // measured on two cores), and leave every page the daemon writes
        // next to be copied until the exec.
        let started = std::thread::Builder::new()
            .name("spare-start".into())
            .spawn(move || {
                if lock(&spares).slot(kind).is_some() {
                    return;
                }
                if airlock_jail::priority::set_background(0, true).is_err() {
                    return;
                }
                let Ok(child) =
                    spawn_supervisor(&exe, &owner, &runner, &id, &socket, kind, disk.as_deref())
                else {
                    return;
                };
                // Back to the normal policy before the lock a create takes
                // too (it must not wait on a thread at the background's
                // pace); the thread ends here anyway.
                let _ = airlock_jail::priority::set_background(0, false);
                let spare = Spare { id, child };
                let surplus = match lock(&spares).slot(kind) {
                    slot @ None => {
                        *slot = Some(spare);
                        None
                    }
                    // Another refill was quicker.
                    Some(_) => Some(spare),
                };
                if let Some(surplus) = surplus {
                    ProcessBackend::discard(surplus);
                }
            });
        // Without a thread there is no spare: the create that finds none
        // starts its supervisor itself.
        drop(started);
    }

    /// Stops a spare that will not be used (its stdin closes: it exits).
    fn discard(mut spare: Spare) {
        drop(spare.child.stdin.take());
        let _ = spare.child.kill();
        let _ = spare.child.wait();
    }

    fn sockets(&self) -> PathBuf {
        self.runtime.sockets().join(&self.owner)
    }

    /// The ids of sandboxes whose launcher is alive (it holds its slot).
    fn live_ids(&self) -> HashSet<String> {
        self.runtime
            .live_records()
            .into_iter()
            .map(|r| r.id)
            .collect()
    }

    /// The sandbox ids with a bundle directory (OCI tiers).
    fn container_dirs(&self) -> Vec<String> {
        std::fs::read_dir(self.runtime.containers())
            .map(|entries| {
                entries
                    .flatten()
                    .filter_map(|e| e.file_name().to_str().map(str::to_owned))
                    .filter(|name| airlock_jail::launch::is_sandbox_id(name))
                    .collect()
            })
            .unwrap_or_default()
    }

    fn socket_of(&self, id: &str) -> PathBuf {
        self.sockets().join(format!("{id}.sock"))
    }

    /// Whether `pid` is a supervisor of this daemon and this tier (one
    /// started without `--tier` is of the process tier).
    fn is_ours(&self, pid: u32) -> bool {
        std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmdline| {
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            let value = |flag: &[u8]| args.windows(2).find(|w| w[0] == flag).map(|w| w[1]);
            args.contains(&b"supervise".as_slice())
                && value(b"--owner") == Some(self.owner.as_bytes())
                && value(b"--tier").unwrap_or(b"process") == self.tier().as_str().as_bytes()
        })
    }

    fn supervisor(&self, id: &str) -> Option<Arc<Supervisor>> {
        self.supervisors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned()
    }

    fn forget(&self, id: &str) {
        self.supervisors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
    }

    /// Starts watching the supervisor behind `pidfd` and returns the future
    /// that resolves when it ends.
    fn watch(&self, id: &str, pidfd: OwnedFd) -> Result<Ended, std::io::Error> {
        let ending_file = deadline::ending_file(&self.socket_of(id));
        let watched = pidfd.try_clone()?;
        let (tell, ended) = watch::channel(None);
        let supervisor = Arc::new(Supervisor { pidfd, ended });
        self.supervisors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id.to_owned(), Arc::clone(&supervisor));
        // SAFETY: `watched` is an OwnedFd moved into the AsyncFd, which owns
        // it from here on; nothing else can close or replace that descriptor
        // while it is registered, which is all `register` asks.
        let readable = unsafe { AsyncFd::register(watched)? };
        tokio::spawn(async move {
            // A pidfd becomes readable when its process exits.
            let _ = readable.readable().await;
            let ending = reap(readable.get_ref(), &ending_file);
            let _ = tell.send(Some(ending));
        });
        let mut ended = supervisor.ended.clone();
        Ok(Box::pin(async move {
            loop {
                let ending = *ended.borrow_and_update();
                if let Some(ending) = ending {
                    return ending;
                }
                if ended.changed().await.is_err() {
                    return Ending::Unknown;
                }
            }
        }))
    }

    fn stats(&self, id: &str) -> Option<Usage> {
        let stats = self.cgroup_of(id).ok()?.stats();
        Some(Usage {
            oom_kills: stats.oom_kills,
            pids_limit_hits: stats.pids_limit_hits,
            peak_memory_bytes: stats.peak_memory_bytes,
            cpu_time_ns: stats.cpu_time_ns,
        })
    }

    /// The cgroup of live sandbox `id`.
    fn cgroup_of(&self, id: &str) -> Result<SandboxCgroup, StateError> {
        let layout = self
            .cgroups
            .clone()
            .ok_or_else(|| StateError::NotRunning(id.to_owned()))?;
        let cgroup = SandboxCgroup::existing(layout, id);
        if cgroup.dirs().iter().all(|d| !d.exists()) {
            return Err(StateError::NotRunning(id.to_owned()));
        }
        Ok(cgroup)
    }

    /// Where the ports of live sandbox `id` can be dialled: the network
    /// namespace of its init (the process of its cgroup whose parent is
    /// outside it: no process inside can become that, so a namespace one
    /// made for itself is never taken), still in the cgroup once the
    /// namespace is open (so a pid used again meanwhile is never taken),
    /// on the tiers whose loopback is the host kernel's: `process` and
    /// `oci`, not `gvisor` (whose netstack holds its loopback).
    fn ports_point(&self, id: &str) -> Option<PortsPoint> {
        if let Runner::Oci(runtime) = &self.runner {
            if runtime.kind == airlock_oci::Kind::Gvisor {
                return None;
            }
        }
        let cgroup = self.cgroup_of(id).ok()?;
        let pids = cgroup.pids();
        let init = pids
            .iter()
            .copied()
            .find(|pid| parent_of(*pid).is_some_and(|parent| !pids.contains(&parent)))?;
        let namespace =
            airlock_jail::loopback::LoopbackNamespace::of_process(u32::try_from(init).ok()?)?;
        cgroup
            .pids()
            .contains(&init)
            .then_some(PortsPoint::Netns(namespace))
    }

    /// Removes what a dead sandbox may have left: its cgroup and its socket.
    fn remove_leftovers(&self, id: &str) -> Result<(), String> {
        let mut left = Vec::new();
        if let Some(layout) = self.cgroups.clone() {
            let cgroup = SandboxCgroup::existing(layout, id);
            if cgroup.dirs().iter().any(|d| d.exists()) {
                let _ = cgroup.kill_all(Duration::from_secs(5));
                if cgroup.remove().is_err() {
                    left.push("its cgroup");
                }
            }
        }
        if let Some(disk) = &self.disk {
            if disk.remove(id).is_err() {
                left.push("its writable layer");
            }
        }
        if matches!(self.runner, Runner::Oci(_)) {
            match std::fs::remove_dir_all(airlock_oci::container::dir_of(&self.runtime, id)) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(_) => left.push("its bundle directory"),
            }
        }
        for file in deadline::files_of(&self.socket_of(id)) {
            match std::fs::remove_file(file) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(_) => {
                    left.push("its socket files");
                    break;
                }
            }
        }
        if left.is_empty() {
            Ok(())
        } else {
            Err(left.join(" and "))
        }
    }
}

/// Reaps the supervisor if it is our child and maps its exit code. An
/// adopted supervisor is not our child (ECHILD): how it ended is what it
/// left in its ending file, if anything.
fn reap(pidfd: &OwnedFd, ending_file: &Path) -> Ending {
    match rustix::process::waitid(
        WaitId::PidFd(pidfd.as_fd()),
        WaitIdOptions::EXITED | WaitIdOptions::NOHANG,
    ) {
        Ok(Some(status)) => status
            .exit_status()
            .map_or(Ending::Crashed, deadline::ending_of),
        Ok(None) | Err(_) => deadline::read_ending(ending_file).unwrap_or(Ending::Unknown),
    }
}

/// A pidfd for `pid` if it is the supervisor of `id` (checked by its
/// command line, so a recycled pid is never signalled).
fn open_supervisor(pid: u32, id: &str) -> Option<OwnedFd> {
    let pidfd =
        rustix::process::pidfd_open(Pid::from_raw(pid as i32)?, PidfdFlags::empty()).ok()?;
    // Checked after the pidfd is open: from here on the pid cannot be reused.
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    let is_ours = args.contains(&b"supervise".as_slice()) && args.contains(&id.as_bytes());
    is_ours.then_some(pidfd)
}

/// The first request id on a connection: above any id an earlier daemon
/// could have used on the same agent (those started at 1 and grew by one
/// per request), so late events of old requests are never mistaken for new.
fn first_request_id() -> u64 {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    ms.saturating_mul(1 << 12)
}

/// What the supervisor answered on stdout.
#[derive(serde::Deserialize)]
#[serde(rename_all = "snake_case")]
enum Answer {
    Ready { supervisor_pid: u32 },
    Error { message: String, bad_input: bool },
}

/// A supervisor started ahead of need: exec'd, its id chosen, waiting for
/// a spec on stdin. If the daemon goes away, its stdin closes and it exits
/// without having created anything.
struct Spare {
    id: String,
    child: std::process::Child,
}

/// What a spare prepared before its spec came.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum SpareKind {
    /// Nothing beyond its own start: for sandboxes without network, whose
    /// namespace comes with the clone.
    Plain,
    /// Also the network namespace a sandbox with network shares (its
    /// interfaces and filter rules, see `airlock_jail::net`): that setup
    /// runs two programs, which would cost the create several ms.
    Networked,
}

impl SpareKind {
    fn of(spec: &SandboxSpec) -> SpareKind {
        if spec.network.is_none() {
            SpareKind::Plain
        } else {
            SpareKind::Networked
        }
    }
}

/// One waiting spare of each kind at most. The networked one is started
/// only once a sandbox with network has been asked for, so a daemon whose
/// sandboxes never reach the network holds no namespace for them.
#[derive(Default)]
struct Spares {
    plain: Option<Spare>,
    networked: Option<Spare>,
}

impl Spares {
    fn slot(&mut self, kind: SpareKind) -> &mut Option<Spare> {
        match kind {
            SpareKind::Plain => &mut self.plain,
            SpareKind::Networked => &mut self.networked,
        }
    }
}

/// The spares, whatever a panicking holder left (every change to them is
/// a single assignment).
fn lock(spares: &Mutex<Spares>) -> std::sync::MutexGuard<'_, Spares> {
    spares.lock().unwrap_or_else(|p| p.into_inner())
}

/// Starts `airlock supervise` for sandbox `id`; it prepares what `kind`
/// says, then waits for its spec. It runs under the calling thread's
/// policy: a spare's is `SCHED_IDLE` (see `refill`), so it prepares
/// yielding to the creates running meanwhile; the spec puts it back under
/// the normal policy before it launches anything. Nothing runs between
/// fork and exec, so std starts it vfork-style (posix_spawn).
fn spawn_supervisor(
    exe: &Path,
    owner: &str,
    runner: &Runner,
    id: &str,
    socket: &Path,
    kind: SpareKind,
    disk: Option<&Path>,
) -> Result<std::process::Child, CreateError> {
    let mut command = Command::new(exe);
    if kind == SpareKind::Networked {
        command.arg("supervise").arg("--network");
    } else {
        command.arg("supervise");
    }
    if let Runner::Oci(runtime) = runner {
        command
            .arg("--tier")
            .arg(runtime.tier_name())
            .arg("--runtime")
            .arg(&runtime.binary);
        if runtime.kind == airlock_oci::Kind::Gvisor {
            command.arg("--platform").arg(&runtime.platform);
        }
    }
    if let Some(disk) = disk {
        command.arg("--disk").arg(disk);
    }
    command
        .arg("--id")
        .arg(id)
        .arg("--socket")
        .arg(socket)
        .arg("--owner")
        .arg(owner)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| CreateError::Failed(format!("cannot start the supervisor: {e}")))
}

/// Hands a started supervisor its spec and waits for its one-line answer
/// (blocking).
/// The parent of process `pid` (`/proc/PID/stat`'s fourth field).
fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (second field) may hold spaces and parentheses:
    // the fields after it start after its last ')'.
    let rest = stat.get(stat.rfind(')')? + 1..)?;
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// The network namespace of a sandbox: its supervisor's (see
/// `airlock_jail::net`).
fn netns_of(supervisor_pid: u32) -> EgressPoint {
    EgressPoint::Netns(PathBuf::from(format!("/proc/{supervisor_pid}/ns/net")))
}

/// Why a supervisor did not launch its sandbox.
#[derive(Debug)]
enum LaunchFailure {
    /// It answered with an error: the launch itself failed (or the spec
    /// cannot run here, when `bad_input`). Trying again would fail again.
    Refused { message: String, bad_input: bool },
    /// It ended (or stopped reading) without an answer: a spare that died
    /// while it waited, or a supervisor that crashed.
    Silent(String),
}

impl From<LaunchFailure> for CreateError {
    fn from(failure: LaunchFailure) -> CreateError {
        match failure {
            LaunchFailure::Refused {
                message,
                bad_input: true,
            } => CreateError::BadInput(message),
            LaunchFailure::Refused { message, .. } | LaunchFailure::Silent(message) => {
                CreateError::Failed(message)
            }
        }
    }
}

fn launch_with(
    mut child: std::process::Child,
    spec_json: &[u8],
) -> Result<(u32, OwnedFd), LaunchFailure> {
    let pid = child.id();
    let pidfd = Pid::from_raw(pid as i32)
        .and_then(|p| rustix::process::pidfd_open(p, PidfdFlags::empty()).ok());
    // A spare still preparing in the background finishes at the create's
    // priority, with the setup programs it waits for (it puts itself back
    // too, once it has the spec; a failure here is that one's to report).
    let _ = airlock_jail::priority::set_tree_foreground(pid);
    let fed = child
        .stdin
        .take()
        .map(|mut stdin| stdin.write_all(spec_json))
        .transpose();
    let mut line = String::new();
    if let Some(stdout) = child.stdout.take() {
        let _ = BufReader::new(stdout).read_line(&mut line);
    }
    let answer: Option<Answer> = serde_json::from_str(line.trim()).ok();
    match (answer, pidfd) {
        (Some(Answer::Ready { supervisor_pid }), Some(pidfd)) if supervisor_pid == pid => {
            // The child stays unreaped until the watcher's waitid.
            std::mem::forget(child);
            Ok((pid, pidfd))
        }
        (answer, _) => {
            let _ = child.kill();
            let _ = child.wait();
            match answer {
                Some(Answer::Error { message, bad_input }) => {
                    Err(LaunchFailure::Refused { message, bad_input })
                }
                _ => Err(LaunchFailure::Silent(match fed {
                    Err(e) => format!("the supervisor did not take the spec: {e}"),
                    Ok(_) => "the supervisor ended without answering".to_owned(),
                })),
            }
        }
    }
}

/// Why the agent behind a supervisor's socket could not be reached.
#[derive(Debug, thiserror::Error)]
enum ConnectError {
    #[error("cannot connect to the supervisor")]
    Socket(#[source] std::io::Error),
    #[error("the agent did not answer the greeting in time")]
    Timeout,
    #[error("the greeting failed")]
    Greeting(#[source] ClientError),
}

async fn connect(socket: &Path) -> Result<AgentClient, ConnectError> {
    let stream = UnixStream::connect(socket)
        .await
        .map_err(ConnectError::Socket)?;
    match tokio::time::timeout(
        GREETING_TIMEOUT,
        AgentClient::connect(stream, first_request_id()),
    )
    .await
    {
        Ok(Ok(client)) => Ok(client),
        Ok(Err(e)) => Err(ConnectError::Greeting(e)),
        Err(_) => Err(ConnectError::Timeout),
    }
}

/// Whether the process behind `pidfd` has exited (a pidfd polls readable
/// once it has).
fn has_exited(pidfd: &OwnedFd) -> bool {
    let mut fds = [rustix::event::PollFd::new(
        pidfd,
        rustix::event::PollFlags::IN,
    )];
    // A zero timeout: look, do not wait.
    let now = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    matches!(rustix::event::poll(&mut fds, Some(&now)), Ok(n) if n > 0)
}

fn signal(pidfd: &OwnedFd, signal: Signal) {
    let _ = rustix::process::pidfd_send_signal(pidfd, signal);
}

#[async_trait::async_trait]
impl Backend for ProcessBackend {
    fn tier(&self) -> Tier {
        match &self.runner {
            Runner::Jail => Tier::Process,
            Runner::Oci(runtime) => match runtime.kind {
                airlock_oci::Kind::Gvisor => Tier::Gvisor,
                airlock_oci::Kind::Runc => Tier::Oci,
            },
        }
    }

    fn probe(&self) -> Result<(), Unavailable> {
        let tier = self.tier().as_str();
        let unavailable = |reason: &str| Unavailable {
            tier,
            reason: reason.to_owned(),
        };
        if !rustix::process::geteuid().is_root() {
            return Err(unavailable(
                "the daemon must run as root to create namespaces, cgroups and uid ranges",
            ));
        }
        if self.cgroups.is_none() {
            return Err(unavailable(
                "no usable cgroup hierarchy (memory, cpu and pids controllers) is mounted",
            ));
        }
        if !self.exe.exists() {
            return Err(unavailable(
                "the airlock binary to supervise sandboxes is missing",
            ));
        }
        let agent = airlock_jail::launch::agent_binary();
        if !agent.is_file() {
            return Err(unavailable(&format!(
                "the agent binary {} is missing; build it beside airlock (cargo build --bins) or name it in AIRLOCK_AGENT",
                agent.display()
            )));
        }
        if let Runner::Oci(runtime) = &self.runner {
            let scratch = self.runtime.containers();
            std::fs::create_dir_all(&scratch)
                .map_err(|e| unavailable(&format!("cannot make {}: {e}", scratch.display())))?;
            runtime
                .probe(&agent, &scratch)
                .map_err(|reason| unavailable(&reason))?;
        }
        Ok(())
    }

    fn reserve_id(&self, spec: &SandboxSpec) -> String {
        let kind = SpareKind::of(spec);
        let spare = lock(&self.spares).slot(kind).take();
        match spare {
            Some(spare) => {
                let id = spare.id.clone();
                self.reserved
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(id.clone(), spare);
                self.refill(kind);
                id
            }
            None => {
                self.refill(kind);
                airlock_jail::launch::new_sandbox_id()
            }
        }
    }

    fn unreserve(&self, id: &str) {
        let spare = self
            .reserved
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
        if let Some(spare) = spare {
            ProcessBackend::discard(spare);
        }
    }

    fn warm(&self) {
        // The process tier's spare waits from the start; another tier's
        // first spare is started by its first create, so a daemon whose
        // sandboxes never use a tier keeps no supervisor waiting for it.
        if self.runner == Runner::Jail {
            self.refill(SpareKind::Plain);
        }
    }

    fn shutdown(&self) {
        let spare = {
            let mut spares = lock(&self.spares);
            [spares.plain.take(), spares.networked.take()]
        };
        let reserved: Vec<Spare> = self
            .reserved
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain()
            .map(|(_, spare)| spare)
            .collect();
        for spare in spare.into_iter().flatten().chain(reserved) {
            ProcessBackend::discard(spare);
        }
        // The sockets directory of this daemon, unless sandboxes live on in
        // it (rmdir leaves a directory that is not empty).
        let _ = std::fs::remove_dir(self.sockets());
    }

    async fn create(&self, id: &str, spec: &SandboxSpec) -> Result<Instance, CreateError> {
        let spec_json = serde_json::to_vec(spec)
            .map_err(|e| CreateError::Failed(format!("cannot encode the spec: {e}")))?;
        let socket = self.socket_of(id);
        let spare = self
            .reserved
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
        let (exe, owner, runner, owned_id, owned_socket) = (
            self.exe.clone(),
            self.owner.clone(),
            self.runner.clone(),
            id.to_owned(),
            socket.clone(),
        );
        let disk = self.disk.as_ref().map(|d| d.root().to_owned());
        // A supervisor started now is a plain one: with network, it sets up
        // the namespace while the sandbox launches, which beats doing that
        // first.
        let (pid, pidfd) = tokio::task::spawn_blocking(move || {
            let fresh = || {
                spawn_supervisor(
                    &exe,
                    &owner,
                    &runner,
                    &owned_id,
                    &owned_socket,
                    SpareKind::Plain,
                    disk.as_deref(),
                )
            };
            let launched = match spare {
                Some(spare) => match launch_with(spare.child, &spec_json) {
                    // A spare that died while it waited: start a fresh one
                    // (a launch that failed is not tried again).
                    Err(LaunchFailure::Silent(_)) => launch_with(fresh()?, &spec_json),
                    other => other,
                },
                None => launch_with(fresh()?, &spec_json),
            };
            launched.map_err(CreateError::from)
        })
        .await
        .map_err(|e| CreateError::Failed(format!("the supervisor start was cancelled: {e}")))??;
        let ended = self
            .watch(id, pidfd)
            .map_err(|e| CreateError::Failed(format!("cannot watch the supervisor: {e}")))?;
        let resources = self.resources(Supervised {
            supervisor_pid: Some(pid),
            socket: socket.display().to_string(),
        });
        match connect(&socket).await {
            Ok(agent) => Ok(Instance {
                agent,
                resources,
                ended,
                egress: Some(netns_of(pid)),
                ports: self.ports_point(id),
            }),
            Err(e) => {
                let _ = self.destroy(id, Some(&resources)).await;
                Err(CreateError::Failed(crate::error_chain(&e)))
            }
        }
    }

    async fn adopt(&self, id: &str, resources: &Resources) -> Result<Instance, AdoptError> {
        let Supervised {
            supervisor_pid,
            socket,
        } = self.supervised(resources).ok_or(AdoptError::WrongTier)?;
        let pid = supervisor_pid.ok_or(AdoptError::NotStarted)?;
        let socket = Path::new(socket);
        let gone = || AdoptError::Gone {
            ending: deadline::read_ending(&deadline::ending_file(socket)),
        };
        let pidfd = open_supervisor(pid, id).ok_or_else(gone)?;
        // Watched only once connected: a failed attempt leaves nothing
        // behind, however often it is retried.
        match connect(socket).await {
            Ok(agent) => {
                let ended = self
                    .watch(id, pidfd)
                    .map_err(|e| AdoptError::Unreachable(format!("cannot watch it: {e}")))?;
                Ok(Instance {
                    agent,
                    resources: resources.clone(),
                    ended,
                    egress: Some(netns_of(pid)),
                    ports: self.ports_point(id),
                })
            }
            // It ended meanwhile (or was ending: its socket is the last
            // thing it removes).
            Err(_) if has_exited(&pidfd) => Err(gone()),
            // It answered, with nothing this daemon can use.
            Err(ConnectError::Greeting(
                e @ (ClientError::NoCommonVersion
                | ClientError::Version(_)
                | ClientError::Greeting(_)),
            )) => Err(AdoptError::Incompatible(e)),
            Err(e) => Err(AdoptError::Unreachable(crate::error_chain(&e))),
        }
    }

    fn set_deadline(
        &self,
        id: &str,
        resources: &Resources,
        at_ms: i64,
    ) -> Result<(), DeadlineError> {
        let Some(Supervised { socket, .. }) = self.supervised(resources) else {
            return Err(DeadlineError {
                id: id.to_owned(),
                source: std::io::Error::other("the recorded resources belong to another tier"),
            });
        };
        deadline::write_deadline(&deadline::deadline_file(Path::new(socket)), at_ms).map_err(
            |source| DeadlineError {
                id: id.to_owned(),
                source,
            },
        )?;
        if let Some(supervisor) = self.supervisor(id) {
            signal(&supervisor.pidfd, deadline::NUDGE);
        }
        Ok(())
    }

    async fn destroy(&self, id: &str, resources: Option<&Resources>) -> Result<(), DestroyError> {
        // A paused sandbox is thawed, so its supervisor's teardown (which
        // asks the agent to end first) is answered.
        if let Some(layout) = self.cgroups.clone() {
            let _ = SandboxCgroup::existing(layout, id).thaw();
        }
        let supervisor = match self.supervisor(id) {
            Some(supervisor) => Some(supervisor),
            None => match resources.and_then(|r| self.supervised(r)) {
                Some(Supervised {
                    supervisor_pid: Some(pid),
                    ..
                }) => open_supervisor(*pid, id).and_then(|pidfd| {
                    drop(self.watch(id, pidfd).ok()?);
                    self.supervisor(id)
                }),
                _ => None,
            },
        };
        if let Some(supervisor) = supervisor {
            let mut ended = supervisor.ended.clone();
            let running = ended.borrow().is_none();
            if running {
                signal(&supervisor.pidfd, Signal::TERM);
                let gone = tokio::time::timeout(STOP_GRACE, ended.wait_for(Option::is_some))
                    .await
                    .is_ok();
                if !gone {
                    signal(&supervisor.pidfd, Signal::KILL);
                    let _ = ended.wait_for(Option::is_some).await.map(|_| ());
                }
            }
            self.forget(id);
        }
        self.remove_leftovers(id).map_err(|what| DestroyError {
            id: id.to_owned(),
            what,
        })
    }

    async fn export_writable_layer(
        &self,
        id: &str,
        out: Box<dyn std::io::Write + Send>,
    ) -> Result<airlock_layers::snapshot::Snapshotted, ExportError> {
        let Some(disk) = self.disk.clone() else {
            return Err(ExportError::NotOnDisk);
        };
        if !airlock_jail::launch::is_sandbox_id(id) {
            return Err(ExportError::NotFound(id.to_owned()));
        }
        let id = id.to_owned();
        tokio::task::spawn_blocking(move || export_upper(&disk, &id, out))
            .await
            .unwrap_or(Err(ExportError::Interrupted))
    }

    async fn usage(&self, id: &str) -> Option<Usage> {
        self.stats(id)
    }

    /// Freezes the sandbox's cgroup: every process it holds (the agent,
    /// what it started; an OCI runtime's container, gVisor's sentry and
    /// gofer) stops where it is, memory kept.
    async fn pause(
        &self,
        id: &str,
        resources: &Resources,
        mode: PauseMode,
    ) -> Result<(), StateError> {
        if mode == PauseMode::Filesystem {
            return Err(StateError::Unsupported {
                tier: self.tier().as_str(),
                what: "pause (keeping only its files)",
            });
        }
        if mode == PauseMode::Memory && self.checkpoints() {
            return self
                .memory_op(id, resources, deadline::MemoryOp::Checkpoint)
                .await
                .map(drop);
        }
        let cgroup = self.cgroup_of(id)?;
        let frozen = tokio::task::spawn_blocking(move || cgroup.freeze(FREEZE_WITHIN)).await;
        match frozen {
            Ok(Ok(())) => Ok(()),
            Ok(Err(airlock_jail::cgroup::CgroupError::NoFreezer)) => Err(StateError::Unsupported {
                tier: self.tier().as_str(),
                what: "pause (this host mounts no cgroup freezer)",
            }),
            Ok(Err(e)) => Err(StateError::Failed {
                id: id.to_owned(),
                what: "pause",
                reason: crate::error_chain(&e),
            }),
            Err(_) => Err(StateError::Failed {
                id: id.to_owned(),
                what: "pause",
                reason: "the freezing task was lost".into(),
            }),
        }
    }

    /// Rewrites the sandbox cgroup's memory and CPU limits: every process
    /// of the sandbox (an OCI runtime's container, gVisor's sentry) is in
    /// it.
    async fn resize(
        &self,
        id: &str,
        _resources: &Resources,
        memory_bytes: u64,
        cpu_millis: u32,
    ) -> Result<(), StateError> {
        let cgroup = self.cgroup_of(id)?;
        cgroup
            .resize(memory_bytes, cpu_millis)
            .map_err(|e| StateError::Failed {
                id: id.to_owned(),
                what: "changing limits",
                reason: crate::error_chain(&e),
            })
    }

    /// Thaws the sandbox's cgroup; on a tier whose pauses save memory to
    /// disk, also restores it (a sandbox that was only frozen is left as
    /// the thaw made it).
    async fn resume(&self, id: &str, resources: &Resources) -> Result<(), StateError> {
        let cgroup = self.cgroup_of(id)?;
        cgroup.thaw().map_err(|e| StateError::Failed {
            id: id.to_owned(),
            what: "resume",
            reason: crate::error_chain(&e),
        })?;
        if self.checkpoints() {
            self.memory_op(id, resources, deadline::MemoryOp::Restore)
                .await?;
        }
        Ok(())
    }

    async fn reconcile(&self, keep: &HashSet<String>) -> Reconciled {
        let mut reconciled = Reconciled::default();
        // Supervisors alive without a record: stop them.
        for record in self.runtime.live_records() {
            // Another daemon's sandbox, or an `airlock run`: not ours to stop.
            if keep.contains(&record.id) || !self.is_ours(record.launcher_pid) {
                continue;
            }
            let resources = self.resources(Supervised {
                supervisor_pid: Some(record.launcher_pid),
                socket: self.socket_of(&record.id).display().to_string(),
            });
            if self.destroy(&record.id, Some(&resources)).await.is_ok() {
                reconciled.stopped.push(record.id);
            }
        }
        if let Runner::Oci(_) = self.runner {
            // Bundles and runtime state of sandboxes neither kept nor
            // running (a supervisor killed before its teardown).
            let live = self.live_ids();
            for id in self.container_dirs() {
                if !keep.contains(&id)
                    && !live.contains(&id)
                    && std::fs::remove_dir_all(airlock_oci::container::dir_of(&self.runtime, &id))
                        .is_ok()
                {
                    reconciled.removed.push(id);
                }
            }
        } else {
            // What every supervised tier shares (slot records, cgroups,
            // sockets, writable layers) is swept once, by the process tier.
            // Leftovers of dead launchers: slot records and cgroups.
            let layout = self.cgroups.clone();
            let runtime = self.runtime.clone();
            if let Ok(removed) =
                tokio::task::spawn_blocking(move || runtime.sweep(layout.as_ref())).await
            {
                reconciled.removed.extend(removed);
            }
            // Sockets (and deadline and ending files) of sandboxes that are not
            // kept.
            if let Ok(entries) = std::fs::read_dir(self.sockets()) {
                for entry in entries.flatten() {
                    let name = entry.file_name().to_string_lossy().into_owned();
                    let Some(id) = deadline::id_of_file(&name) else {
                        continue;
                    };
                    if !keep.contains(id) && std::fs::remove_file(entry.path()).is_ok() {
                        reconciled.removed.push(id.to_owned());
                    }
                }
            }
            // Writable layers on disk of sandboxes that are neither kept nor
            // running (a supervisor killed before its teardown).
            if let Some(disk) = self.disk.clone() {
                let live = self.live_ids();
                for id in disk.ids() {
                    if !keep.contains(&id) && !live.contains(&id) && disk.remove(&id).is_ok() {
                        reconciled.removed.push(id);
                    }
                }
                // Memory images of sandboxes gone the same way.
                for id in disk.checkpoint_ids() {
                    if !keep.contains(&id)
                        && !live.contains(&id)
                        && disk.remove_checkpoint(&id).is_ok()
                    {
                        reconciled.removed.push(id);
                    }
                }
            }
        }
        reconciled.removed.sort();
        reconciled.removed.dedup();
        reconciled
    }

    async fn leaked(&self, keep: &HashSet<String>) -> usize {
        let live = self.runtime.live_records();
        let unaccounted = |id: &String| !keep.contains(id) && !live.iter().any(|r| &r.id == id);
        // Our supervisors running a sandbox we do not account for.
        let ours = live
            .iter()
            .filter(|r| !keep.contains(&r.id) && self.is_ours(r.launcher_pid))
            .count();
        if let Runner::Oci(_) = self.runner {
            // Bundle directories nobody holds a slot for.
            return ours
                + self
                    .container_dirs()
                    .iter()
                    .filter(|id| unaccounted(id))
                    .count();
        }
        // What every supervised tier shares is counted once, here.
        // Cgroups nobody holds a slot for (any launcher's): orphans.
        let orphans = self
            .cgroups
            .as_ref()
            .map(airlock_jail::cgroup::list_sandbox_cgroups)
            .unwrap_or_default()
            .into_iter()
            .filter(unaccounted)
            .count();
        // Writable layers nobody holds a slot for.
        let layers = self.disk.as_ref().map_or(0, |disk| {
            disk.ids().iter().filter(|id| unaccounted(id)).count()
                + disk
                    .checkpoint_ids()
                    .iter()
                    .filter(|id| unaccounted(id))
                    .count()
        });
        ours + orphans + layers
    }
}

/// The overlay upper of sandbox `id`'s writable layer on `disk` as a layer
/// tar stream, without what the sandbox's setup put there (see
/// `template_setup_paths`). The layer's root is owned by the first host id of the
/// sandbox's range (see `DiskStore::create`), which maps the owners back.
fn export_upper(
    disk: &DiskStore,
    id: &str,
    out: Box<dyn std::io::Write + Send>,
) -> Result<airlock_layers::snapshot::Snapshotted, ExportError> {
    use std::os::unix::fs::MetadataExt;
    let layer = disk.path(id);
    let root =
        std::fs::symlink_metadata(&layer).map_err(|_| ExportError::NotFound(id.to_owned()))?;
    let upper = layer.join("upper");
    if !std::fs::symlink_metadata(&upper).is_ok_and(|m| m.is_dir()) {
        return Err(ExportError::NoLayers(id.to_owned()));
    }
    let ids = airlock_layers::snapshot::IdMap {
        host_base_uid: root.uid(),
        host_base_gid: root.gid(),
        count: airlock_jail::runtime::UIDS_PER_SANDBOX,
    };
    let (files, dirs) = airlock_jail::rootfs::template_setup_paths();
    let elide = airlock_layers::snapshot::Elide {
        nodes: files.into_iter().map(String::into_bytes).collect(),
        dirs: dirs.into_iter().map(String::into_bytes).collect(),
    };
    Ok(airlock_layers::snapshot::write_layer_eliding(
        &upper,
        &ids,
        out,
        &airlock_layers::snapshot::SnapshotLimits::default(),
        &elide,
    )?)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use std::process::{Command, Stdio};

    /// A child standing for a supervisor: `script` answers on stdout.
    fn child(script: &str) -> std::process::Child {
        Command::new("sh")
            .args(["-c", script])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap()
    }

    #[test]
    fn a_supervisor_that_answers_an_error_refused_the_launch_and_one_that_ends_was_silent() {
        let refused = launch_with(
            child(
                r#"cat >/dev/null; echo '{"error": {"message": "no room", "bad_input": false}}'"#,
            ),
            b"{}",
        );
        match refused {
            Err(LaunchFailure::Refused { message, bad_input }) => {
                assert_eq!((message.as_str(), bad_input), ("no room", false));
            }
            other => panic!("{other:?}"),
        }
        let bad = launch_with(
            child(
                r#"cat >/dev/null; echo '{"error": {"message": "bad limit", "bad_input": true}}'"#,
            ),
            b"{}",
        );
        assert!(matches!(
            CreateError::from(bad.unwrap_err()),
            CreateError::BadInput(m) if m == "bad limit"
        ));
        // A spare that died while it waited: nothing answered.
        let silent = launch_with(child("exit 0"), b"{}");
        assert!(
            matches!(silent, Err(LaunchFailure::Silent(_))),
            "{silent:?}"
        );
    }
}
