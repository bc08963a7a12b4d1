//! `airlock supervise`: the small per-sandbox process that owns a sandbox
//! on behalf of the daemon.
//!
//! The daemon starts one supervisor per sandbox and hands it the spec on
//! stdin. The supervisor launches the sandbox (from a fresh, single-threaded
//! process, as launching requires), leaves the daemon's session, and serves
//! the agent channel on a unix socket. The daemon connects to that socket;
//! if the daemon dies or restarts, the sandbox lives on and the next daemon
//! connects again (re-adoption). Frames are relayed whole, so a connection
//! that breaks mid-frame never desynchronizes the agent stream. The sandbox
//! ends when its agent exits, the supervisor gets SIGTERM, or its deadline
//! has passed by [`deadline::GRACE`]; either way the supervisor runs the
//! jail's teardown and removes its socket.
//!
//! The deadline holds without a daemon: the supervisor starts with the
//! spec's timeout from its launch and takes every later deadline from the
//! file the daemon writes beside the socket (read again on
//! [`deadline::NUDGE`], on waking, and just before it acts; a file that is
//! missing or unreadable leaves the last deadline known in force). The
//! grace lets a running daemon's reaper act first and record the timeout.
//! Before it exits, the supervisor leaves its exit code in the ending file,
//! for a daemon that is not its parent.
//!
//! Wire contract with the daemon: one JSON line on stdout, either
//! `{"ready": {"id", "init_pid", "supervisor_pid", "socket"}}` or
//! `{"error": {"message", "bad_input"}}`, then stdout is closed. The exit
//! code says how the sandbox ended: 0 stopped on request (SIGTERM),
//! [`EXIT_SANDBOX_OOM`] its agent died with the OOM killer active,
//! [`EXIT_SANDBOX_DIED`] its agent died otherwise,
//! [`EXIT_SANDBOX_EXPIRED`] its deadline passed.

use crate::sandbox::{Prepared, Sandbox};
use airlock_backend::process::deadline;
use airlock_jail::runtime::RuntimeDir;
use airlock_policy::SandboxSpec;
use airlock_protocol::{read_frame_bytes, FrameError};
use clap::Args;
use serde_json::json;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use tokio::io::AsyncWriteExt;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, Mutex};

/// Exit code: the sandbox's agent went away and the OOM killer had struck.
pub const EXIT_SANDBOX_OOM: u8 = deadline::EXIT_SANDBOX_OOM as u8;
/// Exit code: the sandbox's agent went away on its own.
pub const EXIT_SANDBOX_DIED: u8 = deadline::EXIT_SANDBOX_DIED as u8;
/// Exit code: the sandbox's deadline passed and the supervisor ended it.
pub const EXIT_SANDBOX_EXPIRED: u8 = deadline::EXIT_SANDBOX_EXPIRED as u8;

/// Why the relay stopped.
enum RelayEnd {
    /// SIGTERM or SIGINT: the daemon asked.
    Asked,
    /// The agent closed the channel or broke the protocol.
    AgentGone,
    /// The deadline passed (and its grace).
    Expired,
}

/// Longest the supervisor sleeps without looking at its deadline again
/// (so a jump of the wall clock or a missed nudge costs at most this).
const LONGEST_NAP: std::time::Duration = std::time::Duration::from_secs(60);

/// The deadline in force, in unix milliseconds, and where later ones come
/// from.
struct Deadline {
    file: PathBuf,
    at_ms: i64,
}

impl Deadline {
    /// The deadline given at launch, then whatever the file says.
    fn new(file: PathBuf, at_ms: i64) -> Deadline {
        let mut deadline = Deadline { file, at_ms };
        deadline.reload();
        deadline
    }

    /// Takes the deadline in the file, if it holds one; otherwise the last
    /// one known stays.
    fn reload(&mut self) {
        if let Some(at_ms) = deadline::read_deadline(&self.file) {
            self.at_ms = at_ms;
        }
    }

    /// How long until the deadline and its grace have passed, at most
    /// [`LONGEST_NAP`]; `None` once they have.
    fn nap(&self) -> Option<std::time::Duration> {
        let due = self
            .at_ms
            .saturating_add(deadline::GRACE.as_millis() as i64);
        let left = due.saturating_sub(deadline::now_ms());
        (left > 0).then(|| std::time::Duration::from_millis(left as u64).min(LONGEST_NAP))
    }
}

/// Largest spec accepted on stdin.
const MAX_SPEC_BYTES: u64 = 1 << 20;

/// Options of `airlock supervise` (used by the daemon, not by people).
#[derive(Args)]
pub struct SuperviseArgs {
    /// Id of the sandbox, chosen by the daemon (`sbx-` and hex).
    #[arg(long)]
    id: String,
    /// Unix socket to serve the agent channel on.
    #[arg(long)]
    socket: PathBuf,
    /// Tag of the daemon that owns this sandbox. Unused here; it is in the
    /// command line so a daemon's reconciliation touches only its own
    /// supervisors, never another daemon's or an `airlock run`.
    #[arg(long, default_value = "")]
    owner: String,
    /// Prepare the network namespace of a sandbox with network before the
    /// spec comes (a spare started for one): the create then skips that
    /// setup.
    #[arg(long)]
    network: bool,
    /// The disk store (set up by the daemon) in which a spec's writable
    /// layer on disk is made.
    #[arg(long)]
    disk: Option<PathBuf>,
    /// The tier of the sandbox: `process` launches it here, `gvisor` and
    /// `oci` run its bundle with `--runtime`.
    #[arg(long, default_value = "process")]
    tier: String,
    /// The OCI runtime's binary (runsc, runc), for the gvisor and oci tiers.
    #[arg(long)]
    runtime: Option<PathBuf>,
    /// gVisor's platform (ptrace, kvm).
    #[arg(long, default_value = "ptrace")]
    platform: String,
}

fn answer(value: serde_json::Value) {
    let mut stdout = std::io::stdout();
    let _ = writeln!(stdout, "{value}").and_then(|()| stdout.flush());
}

fn fail(message: String, bad_input: bool) -> ExitCode {
    answer(json!({ "error": { "message": message, "bad_input": bad_input } }));
    ExitCode::from(if bad_input {
        airlock::EXIT_BAD_INPUT
    } else {
        airlock::EXIT_INTERNAL
    })
}

pub fn main(args: SuperviseArgs) -> ExitCode {
    // Everything that does not need the spec first: a supervisor may be
    // started ahead of need and wait here for its spec.
    let runtime_dir = RuntimeDir::system();
    let prepared = match Prepared::of_tier(
        &args.tier,
        args.runtime.clone(),
        &args.platform,
        &runtime_dir,
    ) {
        Ok(prepared) => prepared,
        Err((message, bad_input)) => return fail(message, bad_input),
    };
    // A sandbox with network shares a namespace prepared here while this
    // process is still single-threaded; the daemon serves its egress. (A
    // sandbox without network gets a namespace of its own from the clone,
    // whichever this process is in.)
    let network_ready = args.network;
    if network_ready {
        if let Err(e) = airlock_jail::net::enter_egress_namespace().and_then(|s| s.wait()) {
            return fail(airlock::error_chain(&e), false);
        }
    }
    let mut text = String::new();
    if let Err(e) = std::io::stdin()
        .take(MAX_SPEC_BYTES)
        .read_to_string(&mut text)
    {
        return fail(format!("cannot read the spec from stdin: {e}"), true);
    }
    let spec: SandboxSpec = match serde_json::from_str(&text) {
        Ok(spec) => spec,
        Err(e) => return fail(format!("the spec is not valid: {e}"), true),
    };
    // A spare prepared in the background; what it launches runs in the
    // foreground (every process of the sandbox inherits this policy).
    if let Err(e) = airlock_jail::priority::set_background(0, false) {
        return fail(
            format!("cannot leave the background priority it was prepared at: {e}"),
            false,
        );
    }
    // The spec's timeout from now holds until the daemon says otherwise.
    let launched_ms = deadline::now_ms();
    let first_deadline =
        launched_ms.saturating_add(i64::try_from(spec.timeout_ms).unwrap_or(i64::MAX));
    // Leave the daemon's session and process group: signals meant for the
    // daemon (a terminal's ^C, a service manager stopping it) must not take
    // its sandboxes down.
    let _ = rustix::process::setsid();
    let network_setup = if spec.network.is_none() || network_ready {
        None
    } else {
        match airlock_jail::net::enter_egress_namespace() {
            Ok(pending) => Some(pending),
            Err(e) => return fail(airlock::error_chain(&e), false),
        }
    };
    let disk = args.disk.as_ref().map(airlock_jail::disk::DiskStore::at);
    let launched = prepared.launch(&spec, &runtime_dir, args.id.clone(), disk.as_ref());
    let mut jail = match launched {
        Ok(sandbox) => sandbox,
        Err((message, bad_input)) => return fail(message, bad_input),
    };
    if let Some(pending) = network_setup {
        if let Err(e) = pending.wait() {
            jail.kill();
            return fail(airlock::error_chain(&e), false);
        }
    }
    let listener = match bind(&args.socket) {
        Ok(listener) => listener,
        Err(e) => {
            return fail(
                format!("cannot serve {}: {e}", args.socket.display()),
                false,
            )
        }
    };
    let Some(channel) = jail.take_channel() else {
        return fail("the agent channel is gone".into(), false);
    };
    answer(json!({ "ready": {
        "id": jail.id(),
        "init_pid": jail.init_pid(),
        "supervisor_pid": std::process::id(),
        "socket": args.socket,
    }}));
    // Nothing more goes to the daemon this way; /dev/null keeps stray
    // writes from failing.
    redirect_stdio_to_null();

    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(_) => return ExitCode::from(airlock::EXIT_INTERNAL),
    };
    let deadline = Deadline::new(deadline::deadline_file(&args.socket), first_deadline);
    let served = runtime.block_on(relay(listener, channel, &mut jail, deadline, &args.socket));
    // Read the OOM count before teardown removes the cgroup.
    let oom = jail.oom();
    let torn_down = jail.teardown().is_ok();
    runtime.shutdown_background();
    let code = match (served, torn_down) {
        (Ok(RelayEnd::Asked), true) => 0,
        (Ok(RelayEnd::AgentGone), true) if oom => EXIT_SANDBOX_OOM,
        (Ok(RelayEnd::AgentGone), true) => EXIT_SANDBOX_DIED,
        (Ok(RelayEnd::Expired), true) => EXIT_SANDBOX_EXPIRED,
        _ => airlock::EXIT_INTERNAL,
    };
    // Word for a daemon that is not our parent, before the socket goes
    // (whoever sees no socket may look for the ending).
    deadline::write_ending(&deadline::ending_file(&args.socket), code);
    let _ = std::fs::remove_file(deadline::deadline_file(&args.socket));
    let _ = std::fs::remove_file(&args.socket);
    ExitCode::from(code)
}

fn bind(path: &Path) -> std::io::Result<std::os::unix::net::UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = std::os::unix::net::UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

fn redirect_stdio_to_null() {
    use std::os::fd::AsRawFd;
    if let Ok(null) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
    {
        for fd in 0..2 {
            // SAFETY: dup2 onto stdin/stdout of this process; `null` is open
            // for the duration of the call. stderr stays for diagnostics.
            unsafe {
                libc::dup2(null.as_raw_fd(), fd);
            }
        }
    }
}

/// The writer to the agent, when its sandbox runs (`None` while its memory
/// is checkpointed: frames from the daemon wait).
type AgentWriter = tokio::sync::watch::Sender<Option<std::sync::Arc<Mutex<OwnedWriteHalf>>>>;

/// Reads whole frames from one agent channel (of `generation`) into
/// `frames`: reading a frame is not cancel-safe, and in the relay's
/// `select!` a connection event arriving mid-frame would drop the bytes
/// read so far and tear the agent stream.
fn read_agent(
    channel: std::os::unix::net::UnixStream,
    generation: u64,
    frames: mpsc::Sender<(u64, Result<Vec<u8>, FrameError>)>,
) -> std::io::Result<(OwnedWriteHalf, tokio::task::JoinHandle<()>)> {
    channel.set_nonblocking(true)?;
    let (mut reader, writer) = UnixStream::from_std(channel)?.into_split();
    let task = tokio::spawn(async move {
        loop {
            let frame = read_frame_bytes(&mut reader).await;
            let failed = frame.is_err();
            if frames.send((generation, frame)).await.is_err() || failed {
                break;
            }
        }
    });
    Ok((writer, task))
}

/// Relays whole frames between the agent and the current daemon connection
/// until the agent goes away, SIGTERM/SIGINT arrives or the deadline has
/// passed. A nudge also makes it look for a memory request of the daemon
/// ([`deadline::MemoryRequest`]): a checkpoint lets the sandbox's
/// processes go (the end of their channel is then no death) and a restore
/// brings them back on a fresh channel, the daemon's connection kept.
async fn relay(
    listener: std::os::unix::net::UnixListener,
    channel: std::os::unix::net::UnixStream,
    jail: &mut Sandbox,
    mut deadline: Deadline,
    socket: &Path,
) -> std::io::Result<RelayEnd> {
    use tokio::signal::unix::{signal, SignalKind};
    let listener = UnixListener::from_std(listener)?;
    let (frames_tx, mut frames) = mpsc::channel::<(u64, Result<Vec<u8>, FrameError>)>(16);
    let mut agent_generation: u64 = 0;
    let (writer, mut reader_task) = read_agent(channel, agent_generation, frames_tx.clone())?;
    let agent: AgentWriter =
        tokio::sync::watch::Sender::new(Some(std::sync::Arc::new(Mutex::new(writer))));
    let mut memory_seq: Option<u64> = None;
    // Restored, and not heard from since (see `restore_confirmed`).
    let mut unconfirmed_restore = false;
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut nudged = signal(SignalKind::from_raw(deadline::NUDGE.as_raw()))?;
    let Some(nap) = deadline.nap() else {
        return Ok(RelayEnd::Expired);
    };
    let wake = tokio::time::sleep(nap);
    tokio::pin!(wake);

    // The writer half of the current daemon connection, if any.
    let mut daemon: Option<OwnedWriteHalf> = None;
    let (lost_tx, mut lost_rx) = mpsc::channel::<u64>(4);
    let mut generation: u64 = 0;
    let current = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut inbound: Option<tokio::task::JoinHandle<()>> = None;
    let end = loop {
        tokio::select! {
            frame = frames.recv() => match frame.unwrap_or((agent_generation, Err(FrameError::Closed))) {
                (from, Ok(bytes)) => {
                    if unconfirmed_restore && from == agent_generation {
                        unconfirmed_restore = false;
                        jail.restore_confirmed();
                    }
                    if let Some(writer) = daemon.as_mut() {
                        if writer.write_all(&bytes).await.is_err() {
                            daemon = None;
                        }
                    }
                    // No daemon connected: the frame is dropped whole.
                }
                // The channel of a checkpointed sandbox closing.
                (from, Err(_)) if from != agent_generation => {}
                // The agent is gone: the sandbox has ended.
                (_, Err(FrameError::Closed)) | (_, Err(FrameError::Io(_))) => break RelayEnd::AgentGone,
                (_, Err(_)) => {
                    jail.kill();
                    break RelayEnd::AgentGone;
                }
            },
            accepted = listener.accept() => {
                let (stream, _) = accepted?;
                // A new daemon connection replaces the old one (the daemon
                // restarted). The old forwarder is not aborted, which could
                // cut a frame to the agent in half: it sees the new
                // generation and stops before its next frame.
                generation += 1;
                current.store(generation, std::sync::atomic::Ordering::SeqCst);
                let (reader, writer) = stream.into_split();
                daemon = Some(writer);
                inbound = Some(tokio::spawn(forward_to_agent(
                    reader,
                    agent.subscribe(),
                    lost_tx.clone(),
                    generation,
                    std::sync::Arc::clone(&current),
                )));
            }
            Some(lost) = lost_rx.recv() => {
                if lost == generation {
                    daemon = None;
                }
            }
            _ = terminate.recv() => break RelayEnd::Asked,
            _ = interrupt.recv() => break RelayEnd::Asked,
            // Woken for the deadline, or told it changed: read it again
            // (an extension written just before it passed still counts).
            _ = nudged.recv() => {
                if let Some(request) = deadline::read_json::<deadline::MemoryRequest>(
                    &deadline::memory_request_file(socket),
                ) {
                    if memory_seq != Some(request.seq) {
                        memory_seq = Some(request.seq);
                        let answer = match request.op {
                            deadline::MemoryOp::Checkpoint if jail.is_checkpointed() => Ok(0),
                            deadline::MemoryOp::Checkpoint => {
                                // Frames read before the channel closes are
                                // still relayed; its end is not a death.
                                let held = agent.send_replace(None);
                                match jail.checkpoint() {
                                    Ok(bytes) => {
                                        agent_generation += 1;
                                        Ok(bytes)
                                    }
                                    Err(e) => {
                                        agent.send_replace(held);
                                        Err(e)
                                    }
                                }
                            }
                            deadline::MemoryOp::Restore if !jail.is_checkpointed() => Ok(0),
                            deadline::MemoryOp::Restore => match jail.restore() {
                                Ok(channel) => {
                                    let (writer, task) =
                                        read_agent(channel, agent_generation, frames_tx.clone())?;
                                    reader_task.abort();
                                    reader_task = task;
                                    agent.send_replace(Some(std::sync::Arc::new(Mutex::new(writer))));
                                    unconfirmed_restore = true;
                                    Ok(0)
                                }
                                Err(e) => Err(e),
                            },
                        };
                        let (error, bytes) = match answer {
                            Ok(bytes) => (None, bytes),
                            Err(e) => (Some(e), 0),
                        };
                        let _ = deadline::write_json(
                            &deadline::memory_answer_file(socket),
                            &deadline::MemoryAnswer { seq: request.seq, error, bytes },
                        );
                    }
                }
                if !still_due(&mut deadline, wake.as_mut()) {
                    break RelayEnd::Expired;
                }
            },
            () = &mut wake => if !still_due(&mut deadline, wake.as_mut()) {
                break RelayEnd::Expired;
            },
        }
    };
    if let Some(task) = inbound {
        task.abort();
    }
    reader_task.abort();
    Ok(end)
}

/// Reads the deadline again and sets `wake` for it; `false` once it has
/// passed (an extension written just before it passed still counts).
fn still_due(deadline: &mut Deadline, wake: std::pin::Pin<&mut tokio::time::Sleep>) -> bool {
    deadline.reload();
    match deadline.nap() {
        Some(nap) => {
            wake.reset(tokio::time::Instant::now() + nap);
            true
        }
        None => false,
    }
}

/// Copies whole frames from a daemon connection to the agent. A frame is
/// written only once it has fully arrived, so a daemon that dies mid-frame
/// leaves the agent stream intact; while the sandbox's memory is
/// checkpointed it waits for the restore.
async fn forward_to_agent(
    mut reader: OwnedReadHalf,
    mut agent: tokio::sync::watch::Receiver<Option<std::sync::Arc<Mutex<OwnedWriteHalf>>>>,
    lost: mpsc::Sender<u64>,
    generation: u64,
    current: std::sync::Arc<std::sync::atomic::AtomicU64>,
) {
    'frames: while let Ok(bytes) = read_frame_bytes(&mut reader).await {
        loop {
            let writer = match agent.wait_for(Option::is_some).await {
                Ok(writer) => writer.clone(),
                Err(_) => break 'frames,
            };
            let Some(writer) = writer else {
                break 'frames;
            };
            let mut locked = writer.lock().await;
            if current.load(std::sync::atomic::Ordering::SeqCst) != generation {
                // A newer daemon connection took over.
                return;
            }
            if locked.write_all(&bytes).await.is_ok() {
                break;
            }
            drop(locked);
            // A channel that closed for a checkpoint: the frame goes whole
            // to the restored sandbox's (what reached the old one is gone
            // with it). Any other broken channel is the agent's end.
            let replaced = agent
                .borrow()
                .as_ref()
                .is_none_or(|now| !std::sync::Arc::ptr_eq(now, &writer));
            if !replaced {
                break 'frames;
            }
        }
    }
    let _ = lost.send(generation).await;
}
