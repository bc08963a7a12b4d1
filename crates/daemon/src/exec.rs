//! Processes started through the API and their output.
//!
//! Each process gets a [`ProcessHub`]: one pump task reads the agent's
//! events for it and hands every chunk to the clients attached at that
//! moment, and keeps the last [`REPLAY_BYTES`] of each stream so a client
//! can attach later (`GET …/processes/{pid}/output`) and still see the
//! recent output, then follow it live, then the exit.
//!
//! A process on a terminal has one output, what the terminal shows (stdout
//! and stderr merged, the echo of its input included). The hub carries it as
//! [`Output::Stdout`] and says so in [`ProcessHub::pty`]: a client that
//! knows terminals (e2b's envd dialect) labels it as terminal output, and
//! every other one (the native NDJSON stream) shows it as the stdout it
//! mostly is, with no third stream kind to learn.
//!
//! Delivery to attached clients is lossless with backpressure: the pump
//! waits for each client's bounded queue, so a slow client slows the
//! process's output (through the agent protocol's own backpressure) rather
//! than growing memory. A client that takes nothing for [`STALL_LIMIT`] is
//! detached, so one stuck client cannot hold a process forever.

use airlock_protocol::{ErrorKind, Event, Events, ExitStatus, Identity};
use serde::Serialize;
use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Output kept per stream of a running process for clients that attach
/// later. Bounded because every process of every sandbox has one.
pub const REPLAY_BYTES: usize = 256 << 10;
/// Output kept per stream once the process ended (the tail), so the
/// [`ENDED_KEPT`] ended processes of a sandbox cost at most 8 MiB.
pub const ENDED_REPLAY_BYTES: usize = 64 << 10;
/// Items queued per attached client before the pump waits for it.
const CLIENT_QUEUE: usize = 256;
/// A client that accepts nothing for this long is detached.
const STALL_LIMIT: Duration = Duration::from_secs(30);
/// Ended processes remembered per sandbox (for status and late attach).
pub const ENDED_KEPT: usize = 64;

/// How a process ended, as the API reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ExitInfo {
    pub pid: u32,
    /// The exit code when it exited by itself.
    pub exit_code: Option<i32>,
    /// The signal number when a signal ended it.
    pub signal: Option<i32>,
    /// The sandbox's memory limit killed it.
    pub oom: bool,
    /// Its timeout killed it.
    pub timed_out: bool,
    /// Wall-clock time from the request to the exit.
    pub duration_ms: u64,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
}

/// One item of a process's output stream.
#[derive(Debug, Clone)]
pub enum Output {
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    Exited(ExitInfo),
    /// The stream ended without an exit (the process could not be followed
    /// any more, e.g. the sandbox went away).
    Error {
        code: &'static str,
        message: String,
    },
}

impl Output {
    fn len(&self) -> usize {
        match self {
            Output::Stdout(b) | Output::Stderr(b) => b.len(),
            _ => 0,
        }
    }
}

/// What the API shows about a process.
#[derive(Debug, Clone, Serialize)]
pub struct ProcessView {
    pub pid: u32,
    pub cmd: String,
    pub args: Vec<String>,
    pub user: Identity,
    pub running: bool,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    /// Unix milliseconds.
    pub started_at: i64,
    /// The name the client gave it, if any.
    pub tag: Option<String>,
    /// The environment the request added (not the sandbox's own).
    pub env: BTreeMap<String, String>,
    /// The working directory the request named.
    pub cwd: Option<String>,
}

#[derive(Default)]
struct HubState {
    replay: VecDeque<Output>,
    replay_bytes: [usize; 2],
    exit: Option<Output>,
    clients: Vec<mpsc::Sender<Output>>,
}

/// One process and its output; see the module docs.
pub struct ProcessHub {
    pub pid: u32,
    pub cmd: String,
    pub args: Vec<String>,
    pub user: Identity,
    pub started_at: i64,
    /// The name the client gave it (unique among running processes).
    pub tag: Option<String>,
    /// The environment the request added.
    pub env: BTreeMap<String, String>,
    /// The working directory the request named.
    pub cwd: Option<String>,
    /// It runs on a terminal: its `Stdout` items are the terminal's output.
    pub pty: bool,
    state: Mutex<HubState>,
}

/// A client attached to a process: what was kept, then what comes.
pub struct Attached {
    /// Output kept from before the client attached (and the end, if it has
    /// ended already).
    pub replay: VecDeque<Output>,
    /// Output from now on; closes after the final item.
    pub live: mpsc::Receiver<Output>,
}

impl Attached {
    /// The next item: first the replay, then live output; `None` at the end.
    pub async fn next(&mut self) -> Option<Output> {
        match self.replay.pop_front() {
            Some(item) => Some(item),
            None => self.live.recv().await,
        }
    }
}

impl ProcessHub {
    /// A hub for a process that just started.
    pub fn new(pid: u32, cmd: String, args: Vec<String>, user: Identity, started_at: i64) -> Self {
        ProcessHub {
            pid,
            cmd,
            args,
            user,
            started_at,
            tag: None,
            env: BTreeMap::new(),
            cwd: None,
            pty: false,
            state: Mutex::new(HubState::default()),
        }
    }

    /// The same hub with the request's tag, environment and working
    /// directory recorded (for listing and lookup by tag).
    pub fn described(
        mut self,
        tag: Option<String>,
        env: BTreeMap<String, String>,
        cwd: Option<String>,
    ) -> Self {
        self.tag = tag;
        self.env = env;
        self.cwd = cwd;
        self
    }

    /// The same hub, marked as a process on a terminal when `pty`.
    pub fn on_terminal(mut self, pty: bool) -> Self {
        self.pty = pty;
        self
    }

    fn state(&self) -> std::sync::MutexGuard<'_, HubState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Attaches a client. It sees the kept output, then everything after.
    pub fn attach(&self) -> Attached {
        let mut state = self.state();
        let mut replay = state.replay.clone();
        let (tx, live) = mpsc::channel(CLIENT_QUEUE);
        match &state.exit {
            Some(end) => replay.push_back(end.clone()),
            None => state.clients.push(tx),
        }
        Attached { replay, live }
    }

    /// A client attached to output from now on, without the kept output;
    /// `None` when the process has ended.
    pub fn attach_from_now(&self) -> Option<Attached> {
        let mut state = self.state();
        if state.exit.is_some() {
            return None;
        }
        let (tx, live) = mpsc::channel(CLIENT_QUEUE);
        state.clients.push(tx);
        Some(Attached {
            replay: VecDeque::new(),
            live,
        })
    }

    /// Whether the process is still running (as far as its output shows).
    pub fn running(&self) -> bool {
        self.state().exit.is_none()
    }

    /// The API's view of the process.
    pub fn view(&self) -> ProcessView {
        let state = self.state();
        let (exit_code, signal) = match &state.exit {
            Some(Output::Exited(info)) => (info.exit_code, info.signal),
            _ => (None, None),
        };
        ProcessView {
            pid: self.pid,
            cmd: self.cmd.clone(),
            args: self.args.clone(),
            user: self.user,
            running: state.exit.is_none(),
            exit_code,
            signal,
            started_at: self.started_at,
            tag: self.tag.clone(),
            env: self.env.clone(),
            cwd: self.cwd.clone(),
        }
    }

    /// Hands one item to every attached client and keeps it for later ones.
    async fn publish(&self, item: Output) {
        let clients = {
            let mut state = self.state();
            match &item {
                Output::Stdout(_) | Output::Stderr(_) => {
                    let index = usize::from(matches!(item, Output::Stderr(_)));
                    state.replay_bytes[index] += item.len();
                    state.replay.push_back(item.clone());
                    trim_to(&mut state, index, REPLAY_BYTES);
                }
                Output::Exited(_) | Output::Error { .. } => {
                    state.exit = Some(item.clone());
                    trim_to(&mut state, 0, ENDED_REPLAY_BYTES);
                    trim_to(&mut state, 1, ENDED_REPLAY_BYTES);
                }
            }
            state.clients.clone()
        };
        let mut stalled = Vec::new();
        for client in &clients {
            match tokio::time::timeout(STALL_LIMIT, client.send(item.clone())).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => stalled.push(client.clone()),
            }
        }
        let mut state = self.state();
        if !stalled.is_empty() {
            state
                .clients
                .retain(|c| !stalled.iter().any(|s| s.same_channel(c)));
        }
        if state.exit.is_some() {
            // Dropping the senders ends every client's stream after the final item.
            state.clients.clear();
        }
    }
}

/// Drops the oldest chunks of stream `index` until it fits `limit` bytes.
fn trim_to(state: &mut HubState, index: usize, limit: usize) {
    while state.replay_bytes[index] > limit {
        let Some(position) = state
            .replay
            .iter()
            .position(|o| usize::from(matches!(o, Output::Stderr(_))) == index && o.len() > 0)
        else {
            break;
        };
        if let Some(old) = state.replay.remove(position) {
            state.replay_bytes[index] -= old.len();
        }
    }
}

/// What the pump reports when the process ends, for audit and metrics.
pub struct Finished {
    pub exit: Option<ExitInfo>,
    pub error: Option<String>,
}

/// Reads a process's events from the agent until its end and publishes
/// them. `oom_check` is asked, when the process ends, whether the sandbox's
/// memory limit killed something meanwhile (the agent cannot always tell).
pub async fn pump<Checked: std::future::Future<Output = bool>>(
    hub: &ProcessHub,
    mut events: Events,
    requested_at: Instant,
    oom_check: impl FnOnce() -> Checked,
) -> Finished {
    loop {
        match events.next().await {
            Ok(Some(frame)) => match frame.msg {
                // A terminal's output is carried as stdout; see the module docs.
                Event::Stdout | Event::Pty => hub.publish(Output::Stdout(frame.payload)).await,
                Event::Stderr => hub.publish(Output::Stderr(frame.payload)).await,
                Event::Exited(status) => {
                    // A kill by the sandbox's OOM killer while this
                    // process ran; a shell whose child was killed exits 137
                    // rather than by signal, so the cgroup's counter is
                    // asked whatever the exit looked like.
                    let oom = status.oom || (!status.timed_out && oom_check().await);
                    let info = exit_info(&status, requested_at, oom);
                    hub.publish(Output::Exited(info.clone())).await;
                    return Finished {
                        exit: Some(info),
                        error: None,
                    };
                }
                Event::Error { kind, message } => {
                    hub.publish(Output::Error {
                        code: error_code(kind),
                        message: message.clone(),
                    })
                    .await;
                    return Finished {
                        exit: None,
                        error: Some(message),
                    };
                }
                _ => {}
            },
            Ok(None) | Err(_) => {
                let message = "the sandbox went away while the process ran".to_owned();
                hub.publish(Output::Error {
                    code: "sandbox_not_running",
                    message: message.clone(),
                })
                .await;
                return Finished {
                    exit: None,
                    error: Some(message),
                };
            }
        }
    }
}

fn exit_info(status: &ExitStatus, requested_at: Instant, oom: bool) -> ExitInfo {
    ExitInfo {
        pid: status.pid,
        exit_code: status.code,
        signal: status.signal,
        oom,
        timed_out: status.timed_out,
        duration_ms: requested_at.elapsed().as_millis() as u64,
        stdout_truncated: status.stdout_truncated,
        stderr_truncated: status.stderr_truncated,
    }
}

/// The API error code of an agent error kind.
pub fn error_code(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::NotFound => "not_found",
        ErrorKind::AlreadyExists | ErrorKind::Busy | ErrorKind::Closed => "conflict",
        ErrorKind::PermissionDenied => "forbidden",
        ErrorKind::InvalidArgument
        | ErrorKind::NotADirectory
        | ErrorKind::IsADirectory
        | ErrorKind::DirectoryNotEmpty
        | ErrorKind::NotExecutable => "bad_request",
        ErrorKind::NoSpace => "insufficient_storage",
        ErrorKind::Io => "sandbox_io_error",
        ErrorKind::UnsupportedVersion => "internal",
        ErrorKind::Unsupported => "not_implemented",
        ErrorKind::Refused => "port_closed",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exit(pid: u32) -> Output {
        Output::Exited(ExitInfo {
            pid,
            exit_code: Some(0),
            signal: None,
            oom: false,
            timed_out: false,
            duration_ms: 1,
            stdout_truncated: false,
            stderr_truncated: false,
        })
    }

    fn kept(attached: &Attached, stderr: bool) -> usize {
        attached
            .replay
            .iter()
            .filter(|o| matches!(o, Output::Stderr(_)) == stderr)
            .map(Output::len)
            .sum()
    }

    #[tokio::test]
    async fn replay_keeps_a_bounded_tail_and_late_clients_see_the_end() {
        let hub = ProcessHub::new(7, "x".into(), vec![], Identity::User, 0);
        let mut early = hub.attach();
        for i in 0..40u8 {
            hub.publish(Output::Stdout(vec![i; 16 << 10])).await;
            hub.publish(Output::Stderr(vec![i; 1 << 10])).await;
            // The early client reads along, so nobody stalls.
            assert!(matches!(early.next().await, Some(Output::Stdout(_))));
            assert!(matches!(early.next().await, Some(Output::Stderr(_))));
        }
        let running = hub.attach();
        assert_eq!(kept(&running, false), REPLAY_BYTES);
        assert_eq!(
            kept(&running, true),
            40 << 10,
            "stderr is under its own cap"
        );
        // The newest chunk is kept, the oldest dropped.
        assert!(matches!(running.replay.back(), Some(Output::Stderr(b)) if b[0] == 39));

        hub.publish(exit(7)).await;
        assert!(matches!(early.next().await, Some(Output::Exited(_))));
        assert!(
            early.next().await.is_none(),
            "the stream ends after the exit"
        );
        let late = hub.attach();
        assert_eq!(kept(&late, false), ENDED_REPLAY_BYTES);
        assert!(kept(&late, true) <= ENDED_REPLAY_BYTES);
        assert!(matches!(late.replay.back(), Some(Output::Exited(_))));
        assert!(!hub.running());
    }
}
