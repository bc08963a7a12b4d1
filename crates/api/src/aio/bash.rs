//! AIO bash sessions: `/v1/bash/exec|output|write|kill` and
//! `/v1/bash/sessions[/create|/{id}/close]`.
//!
//! Each command is a process of its own, started through the daemon:
//! `bash` (else `sh`) running a short script around the command, with
//! stdout and stderr apart and stdin a pipe that `/v1/bash/write` feeds
//! (so a command's end is its process's exit, a kill is a signal to its
//! process group and `hard_timeout` is the process's own timeout; no
//! marker is read out of its output). This is why the shell sessions'
//! machinery ([`super::shell`]: one long-lived shell, markers in its
//! output, a FIFO per command for its stdin) is not used here: a kill of
//! one command, a `hard_timeout` that spares the session and stderr apart
//! all want the command to be a process of its own, and its stdin is then
//! simply its pipe. The tables, bounds and clean-up are shared
//! ([`super::table`]). What a session keeps between its
//! commands, the exported variables and the working directory, lives in
//! a directory of its own under the sandbox's `/tmp`: the script sources
//! it before the command and writes it back when the shell exits (an
//! `exit` in the command included; a killed command saves nothing).
//! Variables a call passes in `env` are that call's only: after it they
//! are back to what the session had. Plain shell variables, functions and
//! options do not carry over; a `snapshot_path` given at creation is
//! sourced before every command.
//!
//! A session runs its commands one at a time, in the order they came (a
//! worker task per session takes them from a bounded queue; a queued one
//! is `pending`). The output of each is kept in memory, at most
//! [`STREAM_KEPT`] bytes a stream: past it the oldest bytes are dropped
//! and offsets stay absolute (a read from a dropped offset starts at the
//! oldest kept byte). A session remembers its last [`MAX_COMMANDS`]
//! commands, and a sandbox has at most [`MAX_SESSIONS`] sessions (the
//! least recently used idle one is closed for a new one); both are
//! forgotten with the sandbox, as its shell sessions are.

use super::sandbox::{
    daemon_failed_for, forget_if_gone, is_session_id, middle_cut, seconds, shell_quote, Aio,
    AioJson, Target, MAX_INPUT,
};
use super::shell::rfc3339;
use super::table::{Entry, Opened, Table, WhenFull};
use super::{failed, ok};
use crate::{Api, RequestId};
use airlock_daemon::processes::ExecRequest;
use airlock_daemon::{DaemonError, Output};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::Extension;
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};
use tokio::sync::{mpsc, watch};

/// Bash sessions one sandbox may keep.
const MAX_SESSIONS: usize = 16;
/// Commands a session remembers (queued, running and ended); no more
/// than this many may be queued or running.
const MAX_COMMANDS: usize = 4;
/// Bytes of each stream of a command kept in memory; past it the oldest
/// are dropped.
const STREAM_KEPT: usize = 2 << 20;
/// Most bytes of each stream one `/v1/bash/output` answer carries.
const READ_MOST: usize = 1 << 20;
/// `max_output_length` when a call sets none.
const MAX_OUTPUT_DEFAULT: usize = 50_000;
/// `wait_timeout` when a call sets none, and the most any waits.
const WAIT_DEFAULT: f64 = 30.0;
const WAIT_MOST: f64 = 600.0;
/// How long a call with no session that waits for its command's end lets
/// it run when it sets no `hard_timeout` (as before sessions existed).
const ONE_SHOT_LIMIT: Duration = Duration::from_secs(600);
/// How long an answer waits for a command to start (async exec) or to end
/// after a signal (kill).
const SETTLE: Duration = Duration::from_secs(5);
/// How long a write waits for the command to take its input (a full
/// pipe: it does not read).
const WRITE_PATIENCE: Duration = Duration::from_secs(10);
/// The working directory shown before anything changed it.
const HOME: &str = "/home/user";
/// The shells a script runs in: bash, started directly, where the
/// sandbox has it, else sh. Never a shell that execs bash: on gVisor a
/// signal that reaches a process while it execs is lost, so a kill in
/// that window left the command running; and the extra exec cost a start.
const BASH: [&str; 3] = ["--noprofile", "--norc", "-c"];
/// Where the names of the script's own variables start.
const OWN: &str = "__airlock_";

/// Why a bash call failed.
#[derive(Debug, thiserror::Error)]
pub enum BashError {
    #[error("Session not found")]
    NoSession,
    #[error("Command not found")]
    NoCommand,
    #[error("session_id: 1 to 128 letters, digits, '-', '_' or '.'")]
    BadSessionId,
    #[error("{0} must be an absolute path")]
    NotAbsolute(&'static str),
    #[error("{0} must not be negative")]
    Negative(&'static str),
    #[error("signal: SIGTERM, SIGKILL, SIGINT, SIGHUP or SIGQUIT, not {0:?}")]
    BadSignal(String),
    #[error("input: at most {MAX_INPUT} bytes at a time")]
    InputTooLarge,
    #[error("the sandbox has {MAX_SESSIONS} bash sessions, all running commands; close one")]
    TooManySessions,
    #[error(
        "the session has {MAX_COMMANDS} commands queued or running; wait for one to end or kill it"
    )]
    QueueFull,
    #[error("no command is running in the session")]
    NotRunning,
    #[error("the command has not started yet; try again")]
    NotStarted,
    #[error("the command's stdin is closed (a call with no session_id that waits for the end runs with empty stdin)")]
    NoInput,
    #[error("the command did not take its input within {} seconds (it is still queued for it)", WRITE_PATIENCE.as_secs())]
    NotReading,
    #[error("{}", .0.message)]
    NotStartable(Failure),
    #[error(transparent)]
    Daemon(#[from] DaemonError),
}

impl BashError {
    fn status(&self) -> StatusCode {
        match self {
            BashError::NoSession | BashError::NoCommand => StatusCode::NOT_FOUND,
            BashError::BadSessionId
            | BashError::NotAbsolute(_)
            | BashError::Negative(_)
            | BashError::BadSignal(_) => StatusCode::BAD_REQUEST,
            BashError::InputTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            BashError::TooManySessions | BashError::QueueFull => StatusCode::TOO_MANY_REQUESTS,
            BashError::NotRunning
            | BashError::NotStarted
            | BashError::NoInput
            | BashError::NotReading => StatusCode::CONFLICT,
            BashError::NotStartable(failure) => failure.status,
            BashError::Daemon(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The error as an AIO answer (a sandbox that is gone takes its
    /// sessions with it).
    fn answer(self, aio: &Aio, sandbox: &str) -> Response {
        match self {
            BashError::Daemon(e) => daemon_failed_for(aio, sandbox, e),
            BashError::NotStartable(failure) => {
                if failure.gone {
                    forget_if_gone(aio, sandbox);
                }
                failed(failure.status, failure.message)
            }
            other => failed(other.status(), other.to_string()),
        }
    }
}

/// Why a command could not be started, kept for the call waiting on it.
#[derive(Debug, Clone)]
pub struct Failure {
    status: StatusCode,
    message: String,
    /// The sandbox is gone.
    gone: bool,
}

impl From<DaemonError> for Failure {
    fn from(e: DaemonError) -> Failure {
        let gone = matches!(e, DaemonError::NotRunning(_) | DaemonError::NotFound(_));
        let e = crate::error::ApiError::from(e);
        Failure {
            status: e.status,
            message: e.message,
            gone,
        }
    }
}

/// A command's state, in the AIO API's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Queued behind another command of its session.
    Pending,
    Running,
    /// It exited (any exit code).
    Completed,
    /// `hard_timeout` killed it.
    TimedOut,
    /// A kill, the session's close or a failure ended it.
    Killed,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::Running => "running",
            Status::Completed => "completed",
            Status::TimedOut => "timed_out",
            Status::Killed => "killed",
        }
    }

    fn ended(self) -> bool {
        matches!(self, Status::Completed | Status::TimedOut | Status::Killed)
    }
}

/// The length of the longest start of `bytes` that does not end inside a
/// UTF-8 character (what may still be completed by the next bytes).
fn complete_utf8(bytes: &[u8]) -> usize {
    let len = bytes.len();
    for back in 1..=len.min(3) {
        let byte = bytes[len - back];
        if byte & 0xC0 == 0x80 {
            continue;
        }
        let needs = match byte {
            0xF0.. => 4,
            0xE0.. => 3,
            0xC0.. => 2,
            _ => 1,
        };
        return if needs > back { len - back } else { len };
    }
    len
}

/// One output stream of a command: its last [`STREAM_KEPT`] bytes, at
/// absolute offsets.
#[derive(Default)]
struct Stream {
    kept: VecDeque<u8>,
    /// The offset of the first kept byte (how many were dropped).
    start: u64,
}

impl Stream {
    fn push(&mut self, bytes: &[u8]) {
        self.kept.extend(bytes);
        let over = self.kept.len().saturating_sub(STREAM_KEPT);
        if over > 0 {
            self.kept.drain(..over);
            self.start += over as u64;
        }
    }

    fn end(&self) -> u64 {
        self.start + self.kept.len() as u64
    }

    /// At most `most` bytes from offset `from` (from the oldest kept one
    /// when `from` was dropped), and the offset after them. While more may
    /// come (`ended` false), a character cut at the end is held back.
    fn read(&self, from: u64, most: usize, ended: bool) -> (Vec<u8>, u64) {
        let from = from.clamp(self.start, self.end());
        let at = (from - self.start) as usize;
        let to = at.saturating_add(most).min(self.kept.len());
        let mut bytes: Vec<u8> = self.kept.range(at..to).copied().collect();
        if !(ended && to == self.kept.len()) {
            bytes.truncate(complete_utf8(&bytes));
        }
        let next = from + bytes.len() as u64;
        (bytes, next)
    }

    /// Whether a read from `from` would give anything.
    fn has_news(&self, from: u64, ended: bool) -> bool {
        let held = if ended {
            0
        } else {
            let tail_from = self.kept.len().saturating_sub(4);
            let tail: Vec<u8> = self.kept.range(tail_from..).copied().collect();
            tail.len() - complete_utf8(&tail)
        };
        self.end() - held as u64 > from
    }
}

/// What a command is and did so far.
struct Run {
    status: Status,
    exit_code: Option<i32>,
    /// Its process while it runs.
    pid: Option<u32>,
    /// A signal was sent to it through the API (its end is `killed`).
    signalled: bool,
    /// Why it could not be started.
    failure: Option<Failure>,
    stdout: Stream,
    stderr: Stream,
}

/// One command of a session.
pub struct Command {
    id: String,
    text: String,
    /// Whether its stdin is a pipe `/v1/bash/write` feeds.
    stdin: bool,
    run: Mutex<Run>,
    /// Bumped on every change of `run`, for the calls waiting on it.
    changed: watch::Sender<u64>,
}

impl Command {
    fn new(text: String, stdin: bool) -> Command {
        Command {
            id: uuid::Uuid::new_v4().to_string(),
            text,
            stdin,
            run: Mutex::new(Run {
                status: Status::Pending,
                exit_code: None,
                pid: None,
                signalled: false,
                failure: None,
                stdout: Stream::default(),
                stderr: Stream::default(),
            }),
            changed: watch::channel(0).0,
        }
    }

    fn run(&self) -> MutexGuard<'_, Run> {
        self.run.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn update<R>(&self, change: impl FnOnce(&mut Run) -> R) -> R {
        let result = change(&mut self.run());
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
        result
    }

    fn status(&self) -> Status {
        self.run().status
    }

    /// Waits, at most `limit` (`None`: as long as it takes), until `done`
    /// holds; whether it does.
    async fn until(&self, limit: Option<Duration>, done: impl Fn(&Run) -> bool) -> bool {
        let mut changes = self.changed.subscribe();
        let deadline = limit.map(|limit| tokio::time::Instant::now() + limit);
        loop {
            if done(&self.run()) {
                return true;
            }
            let changed = match deadline {
                Some(deadline) => {
                    match tokio::time::timeout_at(deadline, changes.changed()).await {
                        Ok(changed) => changed,
                        Err(_) => return done(&self.run()),
                    }
                }
                None => changes.changed().await,
            };
            if changed.is_err() {
                return done(&self.run());
            }
        }
    }

    /// Its process started; `false` when it was killed meanwhile (the
    /// process must go).
    fn started(&self, pid: u32) -> bool {
        self.update(|run| {
            if run.status != Status::Pending {
                return false;
            }
            run.status = Status::Running;
            run.pid = Some(pid);
            true
        })
    }

    fn exited(&self, exit: &airlock_daemon::exec::ExitInfo) {
        self.update(|run| {
            if !run.status.ended() {
                run.status = if run.signalled {
                    Status::Killed
                } else if exit.timed_out {
                    Status::TimedOut
                } else if exit.signal.is_some() {
                    Status::Killed
                } else {
                    Status::Completed
                };
            }
            run.exit_code = exit.exit_code;
            run.pid = None;
        });
    }

    /// It ended without an exit we saw (or never started): `why` is added
    /// to its stderr.
    fn lost(&self, why: &str, failure: Option<Failure>) {
        self.update(|run| {
            run.status = Status::Killed;
            run.pid = None;
            run.failure = failure;
            let fresh_line = run.stderr.kept.back().is_none_or(|b| *b == b'\n');
            let start = if fresh_line { "" } else { "\n" };
            run.stderr
                .push(format!("{start}[airlock: {why}]\n").as_bytes());
        });
    }

    /// Ends it if it is still queued; whether it was.
    fn cancel(&self) -> bool {
        self.update(|run| {
            let pending = run.status == Status::Pending;
            if pending {
                run.status = Status::Killed;
            }
            pending
        })
    }

    /// Its process, marked as signalled through the API, if it runs.
    fn signalled(&self) -> Option<u32> {
        self.update(|run| {
            let pid = run.pid.filter(|_| run.status == Status::Running);
            if pid.is_some() {
                run.signalled = true;
            }
            pid
        })
    }

    fn failure(&self) -> Option<Failure> {
        self.run().failure.clone()
    }

    /// `BashCommandInfo`.
    fn info(&self, run: &Run) -> Value {
        json!({
            "command_id": self.id,
            "command": self.text,
            "status": run.status.as_str(),
            "exit_code": run.exit_code,
        })
    }

    /// `BashExecResult` of a call that waited: the output kept so far,
    /// each stream cut in the middle past `cut` characters (0: never).
    fn waited(&self, session: &str, cut: usize) -> Value {
        let run = self.run();
        let ended = run.status.ended();
        let (stdout, offset) = run.stdout.read(0, usize::MAX, ended);
        let (stderr, stderr_offset) = run.stderr.read(0, usize::MAX, ended);
        let text = |bytes: Vec<u8>| middle_cut(String::from_utf8_lossy(&bytes).into_owned(), cut);
        // A queued command counts as running: it was accepted and will run.
        let status = match run.status {
            Status::Pending => Status::Running,
            status => status,
        };
        json!({
            "session_id": session,
            "command_id": self.id,
            "command": self.text,
            "status": status.as_str(),
            "stdout": text(stdout),
            "stderr": text(stderr),
            "exit_code": run.exit_code,
            "offset": offset,
            "stderr_offset": stderr_offset,
        })
    }

    /// `BashExecResult` of an async call: running, nothing read yet.
    fn accepted(&self, session: &str) -> Value {
        json!({
            "session_id": session,
            "command_id": self.id,
            "command": self.text,
            "status": Status::Running.as_str(),
            "stdout": "",
            "stderr": "",
            "exit_code": null,
            "offset": 0,
            "stderr_offset": 0,
        })
    }

    /// `BashOutputResult`: what came after the offsets.
    fn output(&self, session: &str, offset: u64, stderr_offset: u64) -> Value {
        let run = self.run();
        let ended = run.status.ended();
        let (stdout, offset) = run.stdout.read(offset, READ_MOST, ended);
        let (stderr, stderr_offset) = run.stderr.read(stderr_offset, READ_MOST, ended);
        json!({
            "session_id": session,
            "stdout": String::from_utf8_lossy(&stdout),
            "stderr": String::from_utf8_lossy(&stderr),
            "offset": offset,
            "stderr_offset": stderr_offset,
            "command": self.info(&run),
        })
    }
}

/// A command handed to a session's worker.
struct Job {
    command: Arc<Command>,
    request: ExecRequest,
    request_id: String,
}

impl Job {
    /// Starts the command (unless it was killed while queued) and follows
    /// it to its end.
    async fn run(self, api: &Api, sandbox: &str) {
        let command = self.command;
        if command.status() != Status::Pending {
            return;
        }
        let started = match api
            .daemon
            .exec(sandbox, self.request.clone(), &self.request_id)
            .await
        {
            // No bash in this sandbox: the script is POSIX sh too.
            Err(DaemonError::NotFound(_)) => {
                let mut request = self.request;
                let script = request.args.pop().unwrap_or_default();
                request.cmd = "/bin/sh".into();
                request.args = vec!["-c".into(), script];
                api.daemon.exec(sandbox, request, &self.request_id).await
            }
            started => started,
        };
        let (hub, mut attached) = match started {
            Ok(started) => started,
            Err(e) => {
                let why = e.to_string();
                command.lost(&why, Some(Failure::from(e)));
                return;
            }
        };
        if !command.started(hub.pid) {
            let _ = api.daemon.signal(sandbox, hub.pid, SIGKILL).await;
        }
        loop {
            match attached.next().await {
                Some(Output::Stdout(bytes)) => command.update(|run| run.stdout.push(&bytes)),
                Some(Output::Stderr(bytes)) => command.update(|run| run.stderr.push(&bytes)),
                Some(Output::Exited(exit)) => break command.exited(&exit),
                Some(Output::Error { message, .. }) => break command.lost(&message, None),
                None => break command.lost("the command's process could not be followed", None),
            }
        }
    }
}

/// Runs a session's commands, one at a time, until the session is gone.
async fn work(api: Api, sandbox: String, mut jobs: mpsc::Receiver<Job>) {
    while let Some(job) = jobs.recv().await {
        job.run(&api, &sandbox).await;
    }
}

const SIGKILL: i32 = 9;

/// A signal by its name (`SIGTERM`, `TERM`, `15`).
fn signal_number(name: &str) -> Result<i32, BashError> {
    let upper = name.trim().to_ascii_uppercase();
    let bare = upper.strip_prefix("SIG").unwrap_or(&upper);
    Ok(match bare {
        "TERM" | "15" => 15,
        "KILL" | "9" => SIGKILL,
        "INT" | "2" => 2,
        "HUP" | "1" => 1,
        "QUIT" | "3" => 3,
        _ => return Err(BashError::BadSignal(name.to_owned())),
    })
}

/// Where a command starts.
#[derive(Debug, Clone, Copy)]
enum Cwd<'a> {
    /// Here (`exec_dir`); the command fails if it cannot.
    Exactly(&'a str),
    /// Where the session's last command left, else `fallback`, else the
    /// sandbox's default.
    Kept(Option<&'a str>),
}

/// What a command's script is made of.
struct Script<'a> {
    state_dir: &'a str,
    snapshot: Option<&'a str>,
    cwd: Cwd<'a>,
    /// The names of the call's `env` that are shell names: they are the
    /// call's only.
    per_call: Vec<&'a str>,
    command: &'a str,
}

/// Whether `name` is a shell variable name the script may save and
/// restore.
fn is_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && name.len() <= 255
        && !name.starts_with(OWN)
}

/// The script around a command (see the module's documentation): the
/// session's state restored, the call's `env` over it, the working
/// directory, the state written back at the shell's exit, the command.
/// Valid for bash and for a POSIX sh (which cannot forget a variable the
/// command unset: it comes back from the sandbox's environment).
fn script(s: &Script<'_>) -> String {
    let dir = shell_quote(s.state_dir);
    let env = shell_quote(&format!("{}/env", s.state_dir));
    let env_new = shell_quote(&format!("{}/env.new", s.state_dir));
    let cwd = shell_quote(&format!("{}/cwd", s.state_dir));
    let mut out = String::new();
    let mut line = |text: String| {
        out.push_str(&text);
        out.push('\n');
    };
    line(format!("command -p mkdir -p -m 700 {dir} 2>/dev/null"));
    for name in &s.per_call {
        line(format!(
            "{OWN}c_{name}=${{{name}-}}; unset {name} 2>/dev/null"
        ));
    }
    line(format!(
        "if [ -s {env} ] && [ -n \"${{BASH_VERSION-}}\" ]; then for {OWN}n in $(compgen -e 2>/dev/null); do unset \"${OWN}n\" 2>/dev/null; done; unset {OWN}n; fi"
    ));
    if let Some(snapshot) = s.snapshot {
        let snapshot = shell_quote(snapshot);
        line(format!(
            "if [ -r {snapshot} ]; then . {snapshot} </dev/null >/dev/null 2>&1; fi"
        ));
    }
    line(format!(
        "if [ -s {env} ]; then . {env} </dev/null >/dev/null 2>&1; fi"
    ));
    for name in &s.per_call {
        line(format!(
            "{OWN}h_{name}=${{{name}+x}}; {OWN}s_{name}=${{{name}-}}; export {name}=\"${OWN}c_{name}\"; unset {OWN}c_{name}"
        ));
    }
    match s.cwd {
        Cwd::Exactly(path) => line(format!("command cd -- {} || exit 1", shell_quote(path))),
        Cwd::Kept(fallback) => {
            let otherwise = match fallback {
                Some(path) => format!("command cd -- {} 2>/dev/null", shell_quote(path)),
                None => ":".to_owned(),
            };
            line(format!(
                "if [ -r {cwd} ] && IFS= read -r {OWN}d < {cwd} && command cd -- \"${OWN}d\" 2>/dev/null; then :; else {otherwise}; fi; unset {OWN}d"
            ));
        }
    }
    let mut end = format!("{OWN}rc=$?; set +eu; ");
    for name in &s.per_call {
        let _ = write!(
            end,
            "case ${{{OWN}h_{name}-}} in x) export {name}=\"${{{OWN}s_{name}-}}\";; *) unset {name};; esac; unset {OWN}h_{name} {OWN}s_{name}; "
        );
    }
    let _ = write!(
        end,
        "command export -p > {env_new} 2>/dev/null && command -p mv -f {env_new} {env} 2>/dev/null; command printf '%s\\n' \"$PWD\" > {cwd} 2>/dev/null; exit \"${OWN}rc\""
    );
    line(format!("trap {} EXIT", shell_quote(&end)));
    line(format!("eval {}", shell_quote(s.command)));
    out
}

/// What one exec hands a session.
struct Exec {
    command: String,
    exec_dir: Option<String>,
    env: BTreeMap<String, String>,
    hard_timeout: Option<Duration>,
    stdin: bool,
}

/// What a session shows and keeps.
struct Inner {
    /// Its working directory as last known.
    working_dir: String,
    /// Whether a command ran since `working_dir` was read.
    dir_stale: bool,
    /// Where a command starts when the last one's directory is not known
    /// or gone (the last `exec_dir`).
    default_dir: Option<String>,
    last_used: SystemTime,
    command_count: u64,
    commands: VecDeque<Arc<Command>>,
    /// Its worker's queue, once it has one.
    queue: Option<mpsc::Sender<Job>>,
}

/// One bash session.
pub struct Session {
    pub id: String,
    created_at: SystemTime,
    /// Its state in the sandbox (see the module's documentation).
    state_dir: String,
    snapshot: Option<String>,
    inner: Mutex<Inner>,
}

impl Entry for Session {
    fn idle(&self) -> bool {
        self.live().is_none()
    }

    fn last_used(&self) -> SystemTime {
        self.inner().last_used
    }
}

impl Session {
    fn new(id: String, exec_dir: Option<String>, snapshot: Option<String>) -> Session {
        Session {
            state_dir: format!("/tmp/.airlock-bash-{}", uuid::Uuid::new_v4().simple()),
            id,
            created_at: SystemTime::now(),
            snapshot,
            inner: Mutex::new(Inner {
                working_dir: exec_dir.clone().unwrap_or_else(|| HOME.to_owned()),
                dir_stale: false,
                default_dir: exec_dir,
                last_used: SystemTime::now(),
                command_count: 0,
                commands: VecDeque::new(),
                queue: None,
            }),
        }
    }

    fn inner(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The command running, else the next one queued.
    fn live(&self) -> Option<Arc<Command>> {
        let inner = self.inner();
        inner.commands.iter().find(|c| !c.status().ended()).cloned()
    }

    /// The command the session's output is: the running one, else the
    /// last that started, else the next queued.
    fn current(&self) -> Option<Arc<Command>> {
        let inner = self.inner();
        let started = |c: &&Arc<Command>| c.status() != Status::Pending;
        inner
            .commands
            .iter()
            .find(|c| c.status() == Status::Running)
            .or_else(|| inner.commands.iter().rev().find(started))
            .or_else(|| inner.commands.front())
            .cloned()
    }

    fn command(&self, id: &str) -> Option<Arc<Command>> {
        self.inner().commands.iter().find(|c| c.id == id).cloned()
    }

    /// Queues `exec`; the command, and whether it is first in line.
    fn submit(
        &self,
        api: &Api,
        sandbox: &str,
        exec: Exec,
        request_id: &str,
    ) -> Result<(Arc<Command>, bool), BashError> {
        let mut inner = self.inner();
        let unfinished = inner
            .commands
            .iter()
            .filter(|c| !c.status().ended())
            .count();
        if unfinished >= MAX_COMMANDS {
            return Err(BashError::QueueFull);
        }
        let cwd = match &exec.exec_dir {
            Some(dir) => Cwd::Exactly(dir),
            None => Cwd::Kept(inner.default_dir.as_deref()),
        };
        let text = script(&Script {
            state_dir: &self.state_dir,
            snapshot: self.snapshot.as_deref(),
            cwd,
            per_call: exec
                .env
                .keys()
                .map(String::as_str)
                .filter(|k| is_name(k))
                .collect(),
            command: &exec.command,
        });
        let command = Arc::new(Command::new(exec.command, exec.stdin));
        let job = Job {
            command: Arc::clone(&command),
            request: ExecRequest {
                cmd: "bash".into(),
                args: BASH.iter().map(|a| (*a).to_owned()).chain([text]).collect(),
                env: exec.env,
                cwd: None,
                user: None,
                timeout_ms: exec
                    .hard_timeout
                    .map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)),
                stdin: exec.stdin,
                pty: None,
                tag: None,
            },
            request_id: request_id.to_owned(),
        };
        let queue = inner.queue.get_or_insert_with(|| {
            // Room for the commands that may be unfinished and for as many
            // killed while queued, which wait there to be skipped.
            let (queue, jobs) = mpsc::channel(2 * MAX_COMMANDS);
            tokio::spawn(work(api.clone(), sandbox.to_owned(), jobs));
            queue
        });
        queue.try_send(job).map_err(|_| BashError::QueueFull)?;
        if let Some(dir) = exec.exec_dir {
            inner.working_dir = dir.clone();
            inner.default_dir = Some(dir);
        }
        inner.dir_stale = true;
        inner.last_used = SystemTime::now();
        inner.command_count += 1;
        while inner.commands.len() >= MAX_COMMANDS {
            match inner.commands.iter().position(|c| c.status().ended()) {
                Some(at) => drop(inner.commands.remove(at)),
                None => break,
            }
        }
        inner.commands.push_back(Arc::clone(&command));
        Ok((command, unfinished == 0))
    }

    /// Sends `signal` to the running command (a queued one is just
    /// dropped) and waits a little for its end.
    async fn kill(&self, api: &Api, sandbox: &str, signal: i32) -> Result<Arc<Command>, BashError> {
        let command = self.live().ok_or(BashError::NotRunning)?;
        if !command.cancel() {
            let pid = command.signalled().ok_or(BashError::NotRunning)?;
            if let Err(e) = api.daemon.signal(sandbox, pid, signal).await {
                // It may have ended meanwhile.
                if !command.until(Some(SETTLE), |run| run.status.ended()).await {
                    return Err(e.into());
                }
            }
        }
        command.until(Some(SETTLE), |run| run.status.ended()).await;
        Ok(command)
    }

    /// Writes `input` to the stdin of the running command (of
    /// `command_id`'s, which must be the one running).
    async fn write(
        &self,
        api: &Api,
        sandbox: &str,
        command_id: Option<&str>,
        input: Vec<u8>,
    ) -> Result<Arc<Command>, BashError> {
        let command = match command_id {
            Some(id) => self.command(id).ok_or(BashError::NoCommand)?,
            None => self.live().ok_or(BashError::NotRunning)?,
        };
        if !command.stdin {
            return Err(BashError::NoInput);
        }
        let pid = {
            let run = command.run();
            match (run.status, run.pid) {
                (Status::Pending, _) => return Err(BashError::NotStarted),
                (Status::Running, Some(pid)) => pid,
                _ => return Err(BashError::NotRunning),
            }
        };
        let written =
            tokio::time::timeout(WRITE_PATIENCE, api.daemon.write_stdin(sandbox, pid, input));
        match written.await {
            Ok(Ok(())) => Ok(command),
            Ok(Err(_)) if command.status().ended() => Err(BashError::NotRunning),
            Ok(Err(e)) => Err(e.into()),
            Err(_) => Err(BashError::NotReading),
        }
    }

    /// Ends what runs and what is queued, and removes the session's state.
    async fn close(&self, api: &Api, sandbox: &str, request_id: &str) {
        let commands: Vec<Arc<Command>> = {
            let mut inner = self.inner();
            inner.queue = None;
            inner.commands.iter().cloned().collect()
        };
        for command in commands {
            if command.cancel() {
                continue;
            }
            if let Some(pid) = command.signalled() {
                let _ = api.daemon.signal(sandbox, pid, SIGKILL).await;
            }
        }
        let _ = api
            .daemon
            .remove(sandbox, &self.state_dir, true, request_id)
            .await;
    }

    /// Reads the working directory the last command left, if a command
    /// ran since it was read and none runs now.
    async fn refresh_dir(&self, api: &Api, sandbox: &str, request_id: &str) {
        let count = {
            let inner = self.inner();
            if !inner.dir_stale {
                return;
            }
            inner.command_count
        };
        if !self.idle() {
            return;
        }
        let path = format!("{}/cwd", self.state_dir);
        let Ok(mut reader) = api.daemon.read_file(sandbox, &path, request_id).await else {
            return;
        };
        let mut bytes = Vec::new();
        while let Some(Ok(chunk)) = reader.next_chunk().await {
            bytes.extend_from_slice(&chunk);
            if bytes.len() > 4096 {
                return;
            }
        }
        let text = String::from_utf8_lossy(&bytes);
        let dir = text.strip_suffix('\n').unwrap_or(&text);
        let mut inner = self.inner();
        if inner.command_count == count && dir.starts_with('/') && !dir.contains('\n') {
            inner.working_dir = dir.to_owned();
            inner.dir_stale = false;
        }
    }

    /// `BashSessionInfo`.
    fn info(&self) -> Value {
        let current = self
            .live()
            .filter(|c| c.status() == Status::Running)
            .map(|c| c.text.clone());
        let inner = self.inner();
        json!({
            "session_id": self.id,
            "status": "ready",
            "working_dir": inner.working_dir,
            "created_at": rfc3339(self.created_at),
            "last_used_at": rfc3339(inner.last_used),
            "current_command": current,
            "command_count": inner.command_count,
        })
    }
}

/// Every sandbox's bash sessions.
#[derive(Clone, Default)]
pub struct Sessions {
    table: Table<Session>,
}

impl Sessions {
    pub fn get(&self, sandbox: &str, session: &str) -> Option<Arc<Session>> {
        self.table.get(sandbox, session)
    }

    /// Forgets the sessions of every sandbox `live` says is gone.
    pub fn prune(&self, live: impl Fn(&str) -> bool) {
        self.table.prune(live);
    }

    /// Session `name` (a new id when `None`) of `sandbox`, made if it is
    /// new; a session closed to make room is closed in the background.
    fn open(
        &self,
        api: &Api,
        sandbox: &str,
        name: Option<String>,
        exec_dir: Option<String>,
        snapshot: Option<String>,
        request_id: &str,
    ) -> Result<Arc<Session>, BashError> {
        let name = name.unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
        if !is_session_id(&name) {
            return Err(BashError::BadSessionId);
        }
        let make = || Session::new(name.clone(), exec_dir, snapshot);
        match self
            .table
            .open(sandbox, &name, MAX_SESSIONS, WhenFull::Refuse, make)
        {
            Opened::Found(session) => Ok(session),
            Opened::Made { entry, evicted } => {
                if let Some(evicted) = evicted {
                    let (api, sandbox, request_id) =
                        (api.clone(), sandbox.to_owned(), request_id.to_owned());
                    tokio::spawn(async move { evicted.close(&api, &sandbox, &request_id).await });
                }
                Ok(entry)
            }
            Opened::Full => Err(BashError::TooManySessions),
        }
    }
}

/// `path`, which must be absolute when given.
fn absolute(path: Option<String>, what: &'static str) -> Result<Option<String>, BashError> {
    match path {
        Some(path) if !path.starts_with('/') || path.contains('\0') => {
            Err(BashError::NotAbsolute(what))
        }
        path => Ok(path),
    }
}

/// An offset from the wire.
fn offset(value: Option<i64>, what: &'static str) -> Result<u64, BashError> {
    u64::try_from(value.unwrap_or(0)).map_err(|_| BashError::Negative(what))
}

/// The session `session_id` of `sandbox`.
fn session(aio: &Aio, sandbox: &str, session_id: &str) -> Result<Arc<Session>, BashError> {
    aio.sessions
        .bash
        .get(sandbox, session_id)
        .ok_or(BashError::NoSession)
}

/// A handler's result as an AIO answer.
fn answer(aio: &Aio, sandbox: &str, result: Result<Value, BashError>) -> Response {
    match result {
        Ok(data) => ok(data),
        Err(e) => e.answer(aio, sandbox),
    }
}

#[derive(Deserialize)]
pub(super) struct ExecBody {
    command: String,
    session_id: Option<String>,
    exec_dir: Option<String>,
    env: Option<BTreeMap<String, Option<String>>>,
    async_mode: Option<bool>,
    timeout: Option<f64>,
    hard_timeout: Option<f64>,
    max_output_length: Option<usize>,
}

/// `POST /v1/bash/exec`.
pub(super) async fn exec(
    State(aio): State<Aio>,
    Extension(Target(id)): Extension<Target>,
    Extension(request_id): Extension<RequestId>,
    AioJson(request): AioJson<ExecBody>,
) -> Response {
    let result = run_exec(&aio, &id, &request_id.0, request).await;
    answer(&aio, &id, result)
}

async fn run_exec(
    aio: &Aio,
    sandbox: &str,
    request_id: &str,
    request: ExecBody,
) -> Result<Value, BashError> {
    let exec_dir = absolute(request.exec_dir, "exec_dir")?;
    let async_mode = request.async_mode.unwrap_or(false);
    let patience = seconds(request.timeout);
    let named = request.session_id.filter(|s| !s.is_empty());
    // What DeerFlow's env tool sends: no session, wait for the end. Its
    // command runs as it did before sessions: stdin empty (nothing could
    // learn where to write), 600 s at most unless it says otherwise.
    let one_shot = named.is_none() && !async_mode && patience.is_none();
    let session = match named {
        Some(name) => session(aio, sandbox, &name)?,
        None => aio
            .sessions
            .bash
            .open(&aio.api, sandbox, None, None, None, request_id)?,
    };
    let exec = Exec {
        command: request.command,
        exec_dir,
        env: request
            .env
            .unwrap_or_default()
            .into_iter()
            .filter_map(|(k, v)| v.map(|v| (k, v)))
            .collect(),
        hard_timeout: seconds(request.hard_timeout).or(one_shot.then_some(ONE_SHOT_LIMIT)),
        stdin: !one_shot,
    };
    let (command, first) = session.submit(&aio.api, sandbox, exec, request_id)?;
    if async_mode {
        if first {
            command
                .until(Some(SETTLE), |run| run.status != Status::Pending)
                .await;
        }
        if let Some(failure) = command.failure() {
            return Err(BashError::NotStartable(failure));
        }
        return Ok(command.accepted(&session.id));
    }
    command.until(patience, |run| run.status.ended()).await;
    if let Some(failure) = command.failure() {
        return Err(BashError::NotStartable(failure));
    }
    let cut = request.max_output_length.unwrap_or(MAX_OUTPUT_DEFAULT);
    Ok(command.waited(&session.id, cut))
}

#[derive(Deserialize)]
pub(super) struct OutputBody {
    session_id: String,
    command_id: Option<String>,
    offset: Option<i64>,
    stderr_offset: Option<i64>,
    wait: Option<bool>,
    wait_timeout: Option<f64>,
}

/// `POST /v1/bash/output`.
pub(super) async fn output(
    State(aio): State<Aio>,
    Extension(Target(id)): Extension<Target>,
    AioJson(request): AioJson<OutputBody>,
) -> Response {
    let result = run_output(&aio, &id, request).await;
    answer(&aio, &id, result)
}

async fn run_output(aio: &Aio, sandbox: &str, request: OutputBody) -> Result<Value, BashError> {
    let from = offset(request.offset, "offset")?;
    let stderr_from = offset(request.stderr_offset, "stderr_offset")?;
    let session = session(aio, sandbox, &request.session_id)?;
    let command = match &request.command_id {
        Some(id) => session.command(id).ok_or(BashError::NoCommand)?,
        None => match session.current() {
            Some(command) => command,
            None => {
                return Ok(json!({
                    "session_id": session.id,
                    "stdout": "",
                    "stderr": "",
                    "offset": from,
                    "stderr_offset": stderr_from,
                    "command": null,
                }))
            }
        },
    };
    if request.wait.unwrap_or(false) {
        let limit = request
            .wait_timeout
            .unwrap_or(WAIT_DEFAULT)
            .clamp(0.0, WAIT_MOST);
        let limit = Duration::try_from_secs_f64(limit).unwrap_or_default();
        command
            .until(Some(limit), |run| {
                let ended = run.status.ended();
                ended || run.stdout.has_news(from, false) || run.stderr.has_news(stderr_from, false)
            })
            .await;
    }
    Ok(command.output(&session.id, from, stderr_from))
}

#[derive(Deserialize)]
pub(super) struct WriteBody {
    session_id: String,
    command_id: Option<String>,
    input: String,
}

/// `POST /v1/bash/write`: input for the running command's stdin, as is.
pub(super) async fn write(
    State(aio): State<Aio>,
    Extension(Target(id)): Extension<Target>,
    AioJson(request): AioJson<WriteBody>,
) -> Response {
    let result = async {
        if request.input.len() > MAX_INPUT {
            return Err(BashError::InputTooLarge);
        }
        let session = session(&aio, &id, &request.session_id)?;
        let bytes = request.input.len();
        let command = session
            .write(
                &aio.api,
                &id,
                request.command_id.as_deref(),
                request.input.into_bytes(),
            )
            .await?;
        Ok(json!({"session_id": session.id, "command_id": command.id, "bytes": bytes}))
    }
    .await;
    answer(&aio, &id, result)
}

#[derive(Deserialize)]
pub(super) struct KillBody {
    session_id: String,
    signal: Option<String>,
}

/// `POST /v1/bash/kill`: a signal (SIGTERM by default) to the session's
/// running command; answers once it ended (or after a few seconds).
pub(super) async fn kill(
    State(aio): State<Aio>,
    Extension(Target(id)): Extension<Target>,
    AioJson(request): AioJson<KillBody>,
) -> Response {
    let result = async {
        let name = request.signal.unwrap_or_else(|| "SIGTERM".to_owned());
        let signal = signal_number(&name)?;
        let session = session(&aio, &id, &request.session_id)?;
        let command = session.kill(&aio.api, &id, signal).await?;
        let run = command.run();
        Ok(json!({
            "session_id": session.id,
            "command_id": command.id,
            "signal": name,
            "status": run.status.as_str(),
            "exit_code": run.exit_code,
        }))
    }
    .await;
    answer(&aio, &id, result)
}

/// `GET /v1/bash/sessions`: every session, oldest first.
pub(super) async fn list(
    State(aio): State<Aio>,
    Extension(Target(id)): Extension<Target>,
    Extension(request_id): Extension<RequestId>,
) -> Response {
    let mut sessions = aio.sessions.bash.table.of(&id);
    sessions.sort_by_key(|s| s.created_at);
    for session in &sessions {
        session.refresh_dir(&aio.api, &id, &request_id.0).await;
    }
    ok(Value::Array(sessions.iter().map(|s| s.info()).collect()))
}

#[derive(Deserialize)]
pub(super) struct CreateBody {
    session_id: Option<String>,
    exec_dir: Option<String>,
    snapshot_path: Option<String>,
}

/// `POST /v1/bash/sessions/create`: idempotent for an id that exists.
pub(super) async fn create(
    State(aio): State<Aio>,
    Extension(Target(id)): Extension<Target>,
    Extension(request_id): Extension<RequestId>,
    AioJson(request): AioJson<CreateBody>,
) -> Response {
    let result = async {
        let exec_dir = absolute(request.exec_dir, "exec_dir")?;
        let snapshot = absolute(request.snapshot_path, "snapshot_path")?;
        aio.api.daemon.running(&id)?;
        let name = request.session_id.filter(|s| !s.is_empty());
        let session =
            aio.sessions
                .bash
                .open(&aio.api, &id, name, exec_dir, snapshot, &request_id.0)?;
        Ok(session.info())
    }
    .await;
    answer(&aio, &id, result)
}

/// `POST /v1/bash/sessions/{session_id}/close`: ends what it runs and
/// forgets it.
pub(super) async fn close(
    State(aio): State<Aio>,
    Extension(Target(id)): Extension<Target>,
    Extension(request_id): Extension<RequestId>,
    Path(params): Path<BTreeMap<String, String>>,
) -> Response {
    let name = params.get("session").cloned().unwrap_or_default();
    let result = match aio.sessions.bash.table.remove(&id, &name) {
        Some(session) => {
            session.close(&aio.api, &id, &request_id.0).await;
            Ok(json!({"session_id": session.id, "status": "closed"}))
        }
        None => Err(BashError::NoSession),
    };
    answer(&aio, &id, result)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_keeps_its_tail_at_absolute_offsets() {
        let mut stream = Stream::default();
        stream.push(b"hello ");
        stream.push(b"world");
        assert_eq!(stream.read(0, 5, false), (b"hello".to_vec(), 5));
        assert_eq!(stream.read(6, 100, false), (b"world".to_vec(), 11));
        assert_eq!(stream.read(50, 100, false), (Vec::new(), 11));
        assert!(stream.has_news(10, false) && !stream.has_news(11, true));
        stream.push(&vec![b'x'; STREAM_KEPT]);
        assert_eq!(stream.start, 11);
        assert_eq!(stream.end(), 11 + STREAM_KEPT as u64);
        // A dropped offset reads from the oldest kept byte.
        let (bytes, next) = stream.read(0, 3, true);
        assert_eq!((bytes, next), (b"xxx".to_vec(), 14));
    }

    #[test]
    fn a_character_cut_at_the_end_waits_for_its_rest() {
        let euro = "€".as_bytes();
        assert_eq!(complete_utf8(b"abc"), 3);
        assert_eq!(complete_utf8(&euro[..2]), 0);
        assert_eq!(complete_utf8(&[b'a', euro[0]]), 1);
        assert_eq!(complete_utf8(euro), 3);
        assert_eq!(complete_utf8("a😀".as_bytes()), 5);
        let mut stream = Stream::default();
        stream.push(b"a");
        stream.push(&euro[..1]);
        assert_eq!(stream.read(0, 100, false), (b"a".to_vec(), 1));
        assert!(!stream.has_news(1, false));
        stream.push(&euro[1..]);
        assert_eq!(stream.read(1, 100, false), (euro.to_vec(), 4));
        // Once the command ended, what is there is given as it is.
        let mut ended = Stream::default();
        ended.push(&euro[..2]);
        assert_eq!(ended.read(0, 100, true).0.len(), 2);
    }

    #[test]
    fn signals_by_name_and_number() {
        assert_eq!(signal_number("SIGTERM").unwrap(), 15);
        assert_eq!(signal_number("kill").unwrap(), 9);
        assert_eq!(signal_number(" SIGINT ").unwrap(), 2);
        assert_eq!(signal_number("9").unwrap(), 9);
        assert!(matches!(
            signal_number("SIGSTOP"),
            Err(BashError::BadSignal(_))
        ));
    }

    #[test]
    fn only_shell_names_are_restored_after_a_call() {
        assert!(is_name("API_TOKEN") && is_name("_x1"));
        for bad in ["", "1A", "A-B", "A B", "__airlock_rc", "A=B"] {
            assert!(!is_name(bad), "{bad}");
        }
    }

    #[test]
    fn the_script_restores_runs_and_saves() {
        let text = script(&Script {
            state_dir: "/tmp/.airlock-bash-1",
            snapshot: Some("/home/user/.snap"),
            cwd: Cwd::Kept(Some("/w")),
            per_call: vec!["TOKEN"],
            command: "echo 'hi'",
        });
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("command -p mkdir -p -m 700 '/tmp/.airlock-bash-1'"));
        assert_eq!(
            lines[1],
            "__airlock_c_TOKEN=${TOKEN-}; unset TOKEN 2>/dev/null"
        );
        assert!(lines[3].contains(". '/home/user/.snap'"));
        assert!(lines[4].contains(". '/tmp/.airlock-bash-1/env'"));
        assert!(lines[5].contains("export TOKEN=\"$__airlock_c_TOKEN\""));
        assert!(lines[6].ends_with("else command cd -- '/w' 2>/dev/null; fi; unset __airlock_d"));
        assert!(lines[7].starts_with("trap '__airlock_rc=$?; set +eu; case "));
        assert!(lines[7].ends_with("' EXIT"));
        assert_eq!(lines[8], "eval 'echo '\\''hi'\\'''");
        let exact = script(&Script {
            state_dir: "/tmp/d",
            snapshot: None,
            cwd: Cwd::Exactly("/it's"),
            per_call: Vec::new(),
            command: "pwd",
        });
        assert!(exact.contains("command cd -- '/it'\\''s' || exit 1\n"));
        assert!(!exact.contains("__airlock_c_"));
    }

    #[test]
    fn statuses_read_as_the_spec_writes_them() {
        let all = [
            Status::Pending,
            Status::Running,
            Status::Completed,
            Status::TimedOut,
            Status::Killed,
        ];
        let names: Vec<&str> = all.iter().map(|s| s.as_str()).collect();
        assert_eq!(
            names,
            ["pending", "running", "completed", "timed_out", "killed"]
        );
        assert_eq!(all.iter().filter(|s| s.ended()).count(), 3);
    }

    #[test]
    fn a_session_remembers_its_last_commands() {
        let session = Session::new("s".into(), Some("/w".into()), None);
        assert!(session.idle() && session.current().is_none());
        {
            let mut inner = session.inner();
            for text in ["a", "b"] {
                inner
                    .commands
                    .push_back(Arc::new(Command::new(text.into(), true)));
            }
        }
        let first = session.live().unwrap();
        assert_eq!(first.text, "a");
        assert!(first.started(7));
        assert_eq!(session.current().unwrap().text, "a");
        assert!(!session.idle());
        assert_eq!(first.signalled(), Some(7));
        first.exited(&airlock_daemon::exec::ExitInfo {
            pid: 7,
            exit_code: None,
            signal: Some(15),
            oom: false,
            timed_out: false,
            duration_ms: 1,
            stdout_truncated: false,
            stderr_truncated: false,
        });
        assert_eq!(first.status(), Status::Killed);
        // "b" is queued: the output shown is still "a"'s until it starts.
        assert_eq!(session.current().unwrap().text, "a");
        let second = session.live().unwrap();
        assert!(second.cancel());
        assert!(!second.started(8), "a cancelled command does not run");
        assert!(session.idle());
        assert_eq!(session.info()["working_dir"], "/w");
    }
}
