//! AIO shell sessions: a shell per session, kept running in the sandbox,
//! so the working directory and exported variables persist from one
//! command to the next, as the AIO API promises.
//!
//! Each session is one `bash` (or `sh`) started through the daemon with
//! its stdin a pipe and its stderr joined to its stdout. A command is
//! written to it as a group with stdin from `/dev/null`, followed by a
//! line that prints a random marker, the group's exit status and the
//! shell's working directory; the output up to that marker is the
//! command's. Calls on one session are serialized by its lock. A command's
//! stdin is a FIFO of its own (under `/tmp`, made before it starts and
//! removed after it ends; `/dev/null` where none can be made) that the
//! shell holds open for writing too, so a command that reads its input
//! waits for it, as at a terminal, and `/v1/shell/write` feeds it; input
//! for a command that has ended goes nowhere, never to the shell. The
//! output of the session's last (or running) command is kept, bounded,
//! for `/v1/shell/view` and `/v1/shell/wait`. A command
//! still running when `no_change_timeout` passes keeps running; the next
//! call on the session first waits for its end. A `hard_timeout` kills the
//! session's shell and everything it started (its process group), and the
//! session starts afresh on its next command, in the working directory
//! its last finished command left (its exported variables are lost: the
//! command ran in the shell itself, so only the shell's death stops it).

use super::table::{Entry, Opened, Table, WhenFull};
use crate::Api;
use airlock_daemon::exec::{Attached, Output};
use airlock_daemon::processes::ExecRequest;
use airlock_daemon::DaemonError;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Sessions one sandbox may keep; past it the least recently used idle
/// one is ended.
const MAX_SESSIONS: usize = 32;
/// Output of one command kept in memory; past it the middle is dropped.
const MAX_KEPT: usize = 4 << 20;
/// What a session's shell is: bash when the sandbox has it, else sh, with
/// stderr on stdout.
const SHELL: &str = "exec 2>&1; if command -v bash >/dev/null 2>&1; then exec bash --noprofile --norc; else exec sh; fi";
/// The id of the session a command naming none runs in.
pub const IMPLICIT: &str = "default";

/// Every sandbox's sessions: its shells, its bash sessions
/// ([`super::bash`]) and the editor's undo history, forgotten together.
#[derive(Clone, Default)]
pub struct Sessions {
    table: Table<Session>,
    pub history: super::editor::History,
    pub bash: super::bash::Sessions,
}

/// One shell.
pub struct Session {
    pub id: String,
    created_at: std::time::SystemTime,
    started: Instant,
    io: tokio::sync::Mutex<Io>,
    /// What the API shows while it is not running a command: its last
    /// working directory and when it was last used.
    shown: Mutex<Shown>,
}

struct Shown {
    working_dir: String,
    last_used: std::time::SystemTime,
    current_command: Option<String>,
    /// The last (or running) command and its output so far (at most
    /// [`MAX_KEPT`] bytes; past it the middle is dropped).
    last_command: Option<String>,
    output: Vec<u8>,
    output_dropped: bool,
    status: Status,
    exit_code: Option<i32>,
}

struct Io {
    /// The shell's pid; `None` once it ended (the next command starts it
    /// again).
    pid: Option<u32>,
    attached: Option<Attached>,
    /// Where a new shell starts.
    start_dir: Option<String>,
    /// The marker of a command that outlived its call.
    pending: Option<String>,
}

/// How a command ended, in the AIO API's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Completed,
    NoChangeTimeout,
    HardTimeout,
    Terminated,
    /// Still running (what a view or wait of a running command says).
    Running,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Completed => "completed",
            Status::NoChangeTimeout => "no_change_timeout",
            Status::HardTimeout => "hard_timeout",
            Status::Terminated => "terminated",
            Status::Running => "running",
        }
    }
}

/// What a command gave.
pub struct Ran {
    pub status: Status,
    pub output: String,
    pub exit_code: Option<i32>,
}

/// Why a command could not run.
#[derive(Debug, thiserror::Error)]
pub enum ShellError {
    #[error("Session not found")]
    NoSession,
    #[error(transparent)]
    Daemon(#[from] DaemonError),
}

/// Limits of one command.
pub struct Timeouts {
    /// Return (the command running on) after this long without output.
    pub no_change: Duration,
    /// Kill it after this long.
    pub hard: Option<Duration>,
    /// Return (the command running on) after this long in all.
    pub patience: Option<Duration>,
}

/// What the session shows of its last (or running) command.
pub struct Shot {
    pub command: Option<String>,
    pub output: String,
    pub status: Status,
    pub exit_code: Option<i32>,
}

/// Why input could not be written to a session's command.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("Session not found")]
    NoSession,
    #[error("the session is busy with another call; try again")]
    Busy,
    #[error("no command is running in the session")]
    NotRunning,
    #[error("the running command does not take input (it ended, or its input is not a FIFO)")]
    NoInput,
    #[error("the command did not read its input within {0} seconds")]
    NotReading(u64),
    #[error(transparent)]
    Daemon(#[from] DaemonError),
}

/// How long a write waits for the session's lock and for its input to be
/// taken.
const WRITE_PATIENCE: Duration = Duration::from_secs(10);

impl Sessions {
    /// The session `session` of `sandbox`, if it exists.
    pub fn get(&self, sandbox: &str, session: &str) -> Option<Arc<Session>> {
        self.table.get(sandbox, session)
    }

    /// The session `session` of `sandbox`, made if it is new (its shell
    /// starts with its first command, in `exec_dir`).
    pub fn open(&self, sandbox: &str, session: &str, exec_dir: Option<String>) -> Arc<Session> {
        let make = || Session {
            id: session.to_owned(),
            created_at: std::time::SystemTime::now(),
            started: Instant::now(),
            io: tokio::sync::Mutex::new(Io {
                pid: None,
                attached: None,
                start_dir: exec_dir.clone(),
                pending: None,
            }),
            shown: Mutex::new(Shown {
                working_dir: exec_dir.clone().unwrap_or_else(|| "/home/user".into()),
                last_used: std::time::SystemTime::now(),
                current_command: None,
                last_command: None,
                output: Vec::new(),
                output_dropped: false,
                status: Status::Completed,
                exit_code: None,
            }),
        };
        match self
            .table
            .open(sandbox, session, MAX_SESSIONS, WhenFull::Admit, make)
        {
            Opened::Found(session) | Opened::Made { entry: session, .. } => session,
            // Admitted even when every session is busy.
            Opened::Full => Arc::new(make()),
        }
    }

    /// Forgets session `session` of `sandbox`; whether it existed.
    pub fn remove(&self, sandbox: &str, session: &str) -> Option<Arc<Session>> {
        self.table.remove(sandbox, session)
    }

    /// The sessions of `sandbox`.
    pub fn of(&self, sandbox: &str) -> Vec<Arc<Session>> {
        self.table.of(sandbox)
    }

    /// Forgets every session of `sandbox` (it is gone).
    pub fn forget_sandbox(&self, sandbox: &str) {
        self.prune(|s| s != sandbox);
    }

    /// Forgets the sessions of every sandbox `live` says is gone.
    pub fn prune(&self, live: impl Fn(&str) -> bool) {
        self.table.prune(&live);
        self.bash.prune(&live);
        self.history.prune(live);
    }

    /// Forgets, every `period`, the sessions of sandboxes that ended
    /// without the provisioner's delete (a timeout, a crash), so they do
    /// not pile up in the daemon. Needs a tokio runtime (none: nothing is
    /// started, and the provisioner's deletes still forget theirs).
    pub fn prune_every(&self, api: &Api, period: Duration) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let sessions = self.clone();
        let daemon = api.daemon.clone();
        runtime.spawn(async move {
            let mut tick = tokio::time::interval(period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                sessions.prune(|id| daemon.running(id).is_ok() || daemon.is_paused(id));
            }
        });
    }
}

impl Entry for Session {
    fn idle(&self) -> bool {
        self.io.try_lock().is_ok()
    }

    fn last_used(&self) -> std::time::SystemTime {
        self.shown().last_used
    }
}

impl Session {
    fn shown(&self) -> std::sync::MutexGuard<'_, Shown> {
        self.shown.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What the session list shows of it.
    pub fn info(&self) -> serde_json::Value {
        let shown = self.shown();
        let busy = self.io.try_lock().is_err();
        serde_json::json!({
            "working_dir": shown.working_dir,
            "created_at": rfc3339(self.created_at),
            "last_used_at": rfc3339(shown.last_used),
            "age_seconds": self.started.elapsed().as_secs(),
            "status": if busy { "busy" } else { "idle" },
            "current_command": shown.current_command,
        })
    }

    pub fn working_dir(&self) -> String {
        self.shown().working_dir.clone()
    }

    /// Ends its shell and everything it started.
    pub async fn kill(&self, api: &Api, sandbox: &str) {
        let pid = self.io.lock().await.pid.take();
        if let Some(pid) = pid {
            let _ = api.daemon.signal(sandbox, pid, 9).await;
        }
    }

    /// Runs `command` in the session (one at a time).
    pub async fn run(
        &self,
        api: &Api,
        sandbox: &str,
        command: &str,
        timeouts: &Timeouts,
        request_id: &str,
    ) -> Result<Ran, ShellError> {
        let mut io = self.io.lock().await;
        let started = Instant::now();
        {
            let mut shown = self.shown();
            shown.last_used = std::time::SystemTime::now();
            shown.current_command = Some(command.to_owned());
        }
        let ran = self
            .run_locked(
                &mut io, api, sandbox, command, timeouts, started, request_id,
            )
            .await;
        self.shown().current_command = None;
        ran
    }

    /// What the session shows of its last (or running) command. A command
    /// that outlived its call is read first (briefly, unless a call on the
    /// session is under way: then what it has read so far is shown).
    pub async fn view(&self, api: &Api, sandbox: &str) -> Result<Shot, ShellError> {
        if let Ok(mut io) = self.io.try_lock() {
            let timeouts = Timeouts {
                no_change: Duration::from_millis(50),
                hard: None,
                patience: Some(Duration::from_millis(200)),
            };
            self.settle(&mut io, api, sandbox, &timeouts, Instant::now())
                .await?;
        }
        Ok(self.shot())
    }

    /// Waits up to `limit` for the command running in the session to end
    /// (and for a call under way on it to finish); what it shows then.
    pub async fn wait(
        &self,
        api: &Api,
        sandbox: &str,
        limit: Duration,
    ) -> Result<Shot, ShellError> {
        let started = Instant::now();
        let Ok(mut io) = tokio::time::timeout(limit, self.io.lock()).await else {
            return Ok(self.shot());
        };
        let left = limit.saturating_sub(started.elapsed());
        let timeouts = Timeouts {
            no_change: left.max(Duration::from_millis(1)),
            hard: None,
            patience: Some(left),
        };
        self.settle(&mut io, api, sandbox, &timeouts, Instant::now())
            .await?;
        Ok(self.shot())
    }

    /// Writes `input` to the stdin of the command running in the session.
    pub async fn write(
        &self,
        api: &Api,
        sandbox: &str,
        input: Vec<u8>,
        request_id: &str,
    ) -> Result<Status, WriteError> {
        let Ok(mut io) = tokio::time::timeout(WRITE_PATIENCE, self.io.lock()).await else {
            return Err(WriteError::Busy);
        };
        // Whatever it printed is read first: a command that ended is not
        // written to.
        let timeouts = Timeouts {
            no_change: Duration::from_millis(20),
            hard: None,
            patience: Some(Duration::from_millis(100)),
        };
        self.settle(&mut io, api, sandbox, &timeouts, Instant::now())
            .await
            .map_err(|e| match e {
                ShellError::NoSession => WriteError::NoSession,
                ShellError::Daemon(e) => WriteError::Daemon(e),
            })?;
        let Some(marker) = io.pending.clone() else {
            return Err(WriteError::NotRunning);
        };
        // A short process of its own writes the input to the command's
        // FIFO, if the command still has it.
        let (hub, mut attached) = api
            .daemon
            .exec(
                sandbox,
                ExecRequest {
                    cmd: "/bin/sh".into(),
                    args: vec![
                        "-c".into(),
                        "cd \"$1\" 2>/dev/null && [ -p in ] && exec cat >> in".into(),
                        "sh".into(),
                        input_dir(&marker),
                    ],
                    env: BTreeMap::new(),
                    cwd: None,
                    user: None,
                    timeout_ms: Some(WRITE_PATIENCE.as_millis() as u64),
                    stdin: true,
                    pty: None,
                    tag: None,
                },
                request_id,
            )
            .await?;
        api.daemon.write_stdin(sandbox, hub.pid, input).await?;
        api.daemon.close_stdin(sandbox, hub.pid).await?;
        let exit = loop {
            match attached.next().await {
                Some(Output::Exited(exit)) => break Some(exit),
                Some(Output::Error { .. }) | None => break None,
                Some(_) => {}
            }
        };
        match exit {
            Some(exit) if exit.timed_out => Err(WriteError::NotReading(WRITE_PATIENCE.as_secs())),
            Some(exit) if exit.exit_code == Some(0) => Ok(Status::Running),
            _ => Err(WriteError::NoInput),
        }
    }

    /// The last (or running) command as shown now.
    fn shot(&self) -> Shot {
        let shown = self.shown();
        let mut output = String::from_utf8_lossy(&shown.output).into_owned();
        if shown.status == Status::Running {
            output = without_partial_marker(output);
        }
        if shown.output_dropped {
            output.insert_str(0, "[output truncated in the middle]\n");
        }
        Shot {
            command: shown.last_command.clone(),
            output,
            status: shown.status,
            exit_code: shown.exit_code,
        }
    }

    /// Reads a command that outlived its call (if there is one) until it
    /// ends or `timeouts` say; `None` when there was none.
    async fn settle(
        &self,
        io: &mut Io,
        api: &Api,
        sandbox: &str,
        timeouts: &Timeouts,
        started: Instant,
    ) -> Result<Option<(Ended, String)>, ShellError> {
        let Some(marker) = io.pending.clone() else {
            return Ok(None);
        };
        let (ended, output) = self
            .read_until(io, api, sandbox, &marker, timeouts, started)
            .await?;
        if matches!(ended, Ended::Marker { .. } | Ended::Exited(_)) {
            io.pending = None;
        }
        Ok(Some((ended, output)))
    }

    #[allow(clippy::too_many_arguments)]
    async fn run_locked(
        &self,
        io: &mut Io,
        api: &Api,
        sandbox: &str,
        command: &str,
        timeouts: &Timeouts,
        started: Instant,
        request_id: &str,
    ) -> Result<Ran, ShellError> {
        // A command that outlived its call is waited for first.
        match self.settle(io, api, sandbox, timeouts, started).await? {
            Some((Ended::Quiet, output)) => {
                return Ok(Ran {
                    status: Status::NoChangeTimeout,
                    output,
                    exit_code: None,
                })
            }
            Some((Ended::Deadline, output)) => {
                return Ok(Ran {
                    status: Status::HardTimeout,
                    output,
                    exit_code: None,
                })
            }
            Some(_) | None => {}
        }
        if io.pid.is_none() {
            let (hub, attached) = api
                .daemon
                .exec(
                    sandbox,
                    ExecRequest {
                        cmd: "/bin/sh".into(),
                        args: vec!["-c".into(), SHELL.into()],
                        env: BTreeMap::new(),
                        cwd: io.start_dir.clone(),
                        user: None,
                        timeout_ms: None,
                        stdin: true,
                        pty: None,
                        tag: None,
                    },
                    request_id,
                )
                .await?;
            io.pid = Some(hub.pid);
            io.attached = Some(attached);
        }
        let Some(pid) = io.pid else {
            return Err(ShellError::NoSession);
        };
        let marker = format!("__AIRLOCK_AIO_{}__", uuid::Uuid::new_v4().simple());
        {
            let mut shown = self.shown();
            shown.last_command = Some(command.to_owned());
            shown.output.clear();
            shown.output_dropped = false;
            shown.status = Status::Running;
            shown.exit_code = None;
        }
        api.daemon
            .write_stdin(sandbox, pid, script(command, &marker).into_bytes())
            .await?;
        let (ended, output) = self
            .read_until(io, api, sandbox, &marker, timeouts, started)
            .await?;
        Ok(match ended {
            Ended::Marker { code, .. } => Ran {
                status: Status::Completed,
                output,
                exit_code: Some(code),
            },
            Ended::Exited(code) => Ran {
                status: if code.is_some() {
                    Status::Completed
                } else {
                    Status::Terminated
                },
                output,
                exit_code: code,
            },
            Ended::Quiet => {
                io.pending = Some(marker);
                Ran {
                    status: Status::NoChangeTimeout,
                    output,
                    exit_code: None,
                }
            }
            Ended::Deadline => Ran {
                status: Status::HardTimeout,
                output,
                exit_code: None,
            },
        })
    }

    /// Reads the shell's output up to `marker`'s line, keeping it in the
    /// session's view as it comes.
    async fn read_until(
        &self,
        io: &mut Io,
        api: &Api,
        sandbox: &str,
        marker: &str,
        timeouts: &Timeouts,
        started: Instant,
    ) -> Result<(Ended, String), ShellError> {
        let Some(attached) = io.attached.as_mut() else {
            return Err(ShellError::NoSession);
        };
        let needle = format!("\n{marker}");
        let mut kept = Vec::new();
        let mut dropped = false;
        let ended = loop {
            let mut wait = timeouts.no_change;
            if let Some(hard) = timeouts.hard {
                let left = hard.saturating_sub(started.elapsed());
                if left.is_zero() {
                    break Ended::Deadline;
                }
                wait = wait.min(left);
            }
            if let Some(patience) = timeouts.patience {
                let left = patience.saturating_sub(started.elapsed());
                if left.is_zero() {
                    break Ended::Quiet;
                }
                wait = wait.min(left);
            }
            let item = match tokio::time::timeout(wait, attached.next()).await {
                Ok(item) => item,
                Err(_) if timeouts.hard.is_some_and(|h| started.elapsed() >= h) => {
                    break Ended::Deadline
                }
                Err(_) => break Ended::Quiet,
            };
            match item {
                Some(Output::Stdout(bytes)) | Some(Output::Stderr(bytes)) => {
                    kept.extend_from_slice(&bytes);
                    self.shown().append(&bytes);
                    if let Some(at) = find(&kept, needle.as_bytes()) {
                        let rest = &kept[at + needle.len()..];
                        if let Some(end) = rest.iter().position(|b| *b == b'\n') {
                            let line = String::from_utf8_lossy(&rest[..end]).into_owned();
                            let (code, cwd) = line.split_once(' ').unwrap_or((line.as_str(), ""));
                            let code = code.parse().unwrap_or(-1);
                            // The marker's line (and what the shell wrote
                            // after it, nothing) is not the command's.
                            let tail = kept.len() - at;
                            kept.truncate(at);
                            let mut shown = self.shown();
                            let keep = shown.output.len().saturating_sub(tail);
                            shown.output.truncate(keep);
                            shown.status = Status::Completed;
                            shown.exit_code = Some(code);
                            shown.working_dir = cwd.to_owned();
                            break Ended::Marker { code };
                        }
                    }
                    if kept.len() > MAX_KEPT {
                        // Keep the start and the end (where the marker comes).
                        let cut = kept.len() - MAX_KEPT / 2;
                        kept.drain(MAX_KEPT / 4..cut);
                        dropped = true;
                    }
                }
                Some(Output::Exited(exit)) => {
                    io.pid = None;
                    io.attached = None;
                    io.pending = None;
                    let mut shown = self.shown();
                    shown.status = if exit.exit_code.is_some() {
                        Status::Completed
                    } else {
                        Status::Terminated
                    };
                    shown.exit_code = exit.exit_code;
                    break Ended::Exited(exit.exit_code);
                }
                Some(Output::Error { .. }) | None => {
                    io.pid = None;
                    io.attached = None;
                    io.pending = None;
                    self.shown().status = Status::Terminated;
                    break Ended::Exited(None);
                }
            }
        };
        if ended == Ended::Deadline {
            // Killed with what it started; the next command starts afresh,
            // in the directory the last finished command left.
            if let Some(pid) = io.pid.take() {
                let _ = api.daemon.signal(sandbox, pid, 9).await;
            }
            io.attached = None;
            io.pending = None;
            io.start_dir = Some(self.working_dir());
            self.shown().status = Status::HardTimeout;
        }
        let mut output = String::from_utf8_lossy(&kept).into_owned();
        if dropped {
            output.insert_str(0, "[output truncated in the middle]\n");
        }
        Ok((ended, output))
    }
}

impl Shown {
    /// Adds `bytes` to the running command's output, within [`MAX_KEPT`].
    fn append(&mut self, bytes: &[u8]) {
        self.output.extend_from_slice(bytes);
        if self.output.len() > MAX_KEPT {
            let cut = self.output.len() - MAX_KEPT / 2;
            self.output.drain(MAX_KEPT / 4..cut);
            self.output_dropped = true;
        }
    }
}

/// Where the FIFO that is the stdin of the command with `marker` lives.
fn input_dir(marker: &str) -> String {
    format!("/tmp/.airlock-aio-{}", marker.trim_matches('_'))
}

/// What the shell is given to run `command`: the group with its own stdin
/// (see the module's documentation), then the marker's line with its exit
/// status and the working directory, then the FIFO's removal.
fn script(command: &str, marker: &str) -> String {
    let dir = super::sandbox::shell_quote(&input_dir(marker));
    format!(
        "if mkdir -m 700 {dir} 2>/dev/null && mkfifo -m 600 {dir}/in 2>/dev/null; then exec 3<>{dir}/in; else exec 3</dev/null; fi\n\
         {{ {command}\n}} <&3 3<&-; printf '\\n{marker}%d %s\\n' \"$?\" \"$PWD\"; exec 3<&-; rm -rf {dir}\n"
    )
}

/// `output` without a last line that may be the start of a marker's (a
/// running command's output is shown as it comes).
fn without_partial_marker(mut output: String) -> String {
    const START: &str = "__AIRLOCK_AIO_";
    if let Some(at) = output.rfind('\n') {
        let last = &output[at + 1..];
        if !last.is_empty() && (START.starts_with(last) || last.starts_with(START)) {
            output.truncate(at);
        }
    }
    output
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Ended {
    /// The command's end: its exit status.
    Marker { code: i32 },
    /// The shell itself ended (an `exit`, a kill).
    Exited(Option<i32>),
    /// No output for `no_change` (the command runs on).
    Quiet,
    /// The hard timeout passed (the shell was killed).
    Deadline,
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    memchr::memmem::find(haystack, needle)
}

/// `time` as RFC 3339, UTC.
pub fn rfc3339(time: std::time::SystemTime) -> String {
    let odt = time::OffsetDateTime::from(time);
    odt.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_of_gone_sandboxes_are_pruned() {
        let sessions = Sessions::default();
        sessions.open("sbx-1", IMPLICIT, None);
        sessions.open("sbx-1", "s", None);
        sessions.open("sbx-2", IMPLICIT, None);
        assert_eq!(sessions.of("sbx-1").len(), 2);
        sessions.prune(|id| id == "sbx-2");
        assert!(sessions.of("sbx-1").is_empty());
        assert!(sessions.get("sbx-2", IMPLICIT).is_some());
        sessions.forget_sandbox("sbx-2");
        assert!(sessions.of("sbx-2").is_empty());
    }

    #[test]
    fn a_partial_marker_is_not_shown() {
        assert_eq!(without_partial_marker("out\n__AIRL".into()), "out");
        assert_eq!(
            without_partial_marker("out\n__AIRLOCK_AIO_12ab".into()),
            "out"
        );
        assert_eq!(without_partial_marker("out\nname? ".into()), "out\nname? ");
        assert_eq!(without_partial_marker("out\n".into()), "out\n");
        let script = script("echo hi", "__AIRLOCK_AIO_ab__");
        assert!(script.contains("'/tmp/.airlock-aio-AIRLOCK_AIO_ab'"));
        assert!(script.contains("{ echo hi\n} <&3 3<&-; printf '\\n__AIRLOCK_AIO_ab__%d %s\\n'"));
    }

    #[test]
    fn markers_are_found_across_chunks() {
        let needle = b"\n__M__";
        assert_eq!(find(b"out\n__M__0 /tmp\n", needle), Some(3));
        assert_eq!(find(b"no marker", needle), None);
    }
}
