//! AIO shell sessions: a shell per session, kept running in the sandbox,
//! so the working directory and exported variables persist from one
//! command to the next, as the AIO API promises.
//!
//! Each session is one `bash` (or `sh`) started through the daemon with
//! its stdin a pipe and its stderr joined to its stdout. A command is
//! written to it as a group with stdin from `/dev/null`, followed by a
//! line that prints a random marker, the group's exit status and the
//! shell's working directory; the output up to that marker is the
//! command's. Calls on one session are serialized by its lock. A command
//! still running when `no_change_timeout` passes keeps running; the next
//! call on the session first waits for its end. A `hard_timeout` kills the
//! session's shell and everything it started (its process group), and the
//! session starts afresh on its next command, in the working directory
//! its last finished command left (its exported variables are lost: the
//! command ran in the shell itself, so only the shell's death stops it).

use crate::Api;
use airlock_daemon::exec::{Attached, Output};
use airlock_daemon::processes::ExecRequest;
use airlock_daemon::DaemonError;
use std::collections::{BTreeMap, HashMap};
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

/// Sessions by sandbox id and session id.
type Table = HashMap<(String, String), Arc<Session>>;

/// Every sandbox's sessions.
#[derive(Clone, Default)]
pub struct Sessions {
    inner: Arc<Mutex<Table>>,
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
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Completed => "completed",
            Status::NoChangeTimeout => "no_change_timeout",
            Status::HardTimeout => "hard_timeout",
            Status::Terminated => "terminated",
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
}

impl Sessions {
    fn key(sandbox: &str, session: &str) -> (String, String) {
        (sandbox.to_owned(), session.to_owned())
    }

    /// The session `session` of `sandbox`, if it exists.
    pub fn get(&self, sandbox: &str, session: &str) -> Option<Arc<Session>> {
        self.lock().get(&Self::key(sandbox, session)).cloned()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The session `session` of `sandbox`, made if it is new (its shell
    /// starts with its first command, in `exec_dir`).
    pub fn open(&self, sandbox: &str, session: &str, exec_dir: Option<String>) -> Arc<Session> {
        let mut all = self.lock();
        if let Some(found) = all.get(&Self::key(sandbox, session)) {
            return Arc::clone(found);
        }
        let mine: Vec<(String, String)> =
            all.keys().filter(|(s, _)| s == sandbox).cloned().collect();
        if mine.len() >= MAX_SESSIONS {
            // The least recently used one that is not running a command.
            let oldest = mine
                .iter()
                .filter_map(|k| all.get(k).map(|s| (k.clone(), Arc::clone(s))))
                .filter(|(_, s)| s.io.try_lock().is_ok())
                .min_by_key(|(_, s)| s.shown().last_used);
            if let Some((key, _)) = oldest {
                all.remove(&key);
            }
        }
        let session = Arc::new(Session {
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
                working_dir: exec_dir.unwrap_or_else(|| "/home/user".into()),
                last_used: std::time::SystemTime::now(),
                current_command: None,
            }),
        });
        all.insert(Self::key(sandbox, &session.id), Arc::clone(&session));
        session
    }

    /// Forgets session `session` of `sandbox`; whether it existed.
    pub fn remove(&self, sandbox: &str, session: &str) -> Option<Arc<Session>> {
        self.lock().remove(&Self::key(sandbox, session))
    }

    /// The sessions of `sandbox`.
    pub fn of(&self, sandbox: &str) -> Vec<Arc<Session>> {
        self.lock()
            .iter()
            .filter(|((s, _), _)| s == sandbox)
            .map(|(_, session)| Arc::clone(session))
            .collect()
    }

    /// Forgets every session of `sandbox` (it is gone).
    pub fn forget_sandbox(&self, sandbox: &str) {
        self.lock().retain(|(s, _), _| s != sandbox);
    }

    /// Forgets the sessions of every sandbox `live` says is gone.
    pub fn prune(&self, live: impl Fn(&str) -> bool) {
        self.lock().retain(|(s, _), _| live(s));
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
        if let Some(marker) = io.pending.clone() {
            let (ended, output) = self
                .read_until(io, api, sandbox, &marker, timeouts, started)
                .await?;
            match ended {
                Ended::Marker { .. } | Ended::Exited(_) => io.pending = None,
                Ended::Quiet => {
                    return Ok(Ran {
                        status: Status::NoChangeTimeout,
                        output,
                        exit_code: None,
                    })
                }
                Ended::Deadline => {
                    return Ok(Ran {
                        status: Status::HardTimeout,
                        output,
                        exit_code: None,
                    })
                }
            }
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
        let script =
            format!("{{ {command}\n}} </dev/null; printf '\\n{marker}%d %s\\n' \"$?\" \"$PWD\"\n");
        api.daemon
            .write_stdin(sandbox, pid, script.into_bytes())
            .await?;
        let (ended, output) = self
            .read_until(io, api, sandbox, &marker, timeouts, started)
            .await?;
        Ok(match ended {
            Ended::Marker { code, cwd } => {
                self.shown().working_dir = cwd;
                Ran {
                    status: Status::Completed,
                    output,
                    exit_code: Some(code),
                }
            }
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

    /// Reads the shell's output up to `marker`'s line.
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
            let wait = match timeouts.hard {
                Some(hard) => {
                    let left = hard.saturating_sub(started.elapsed());
                    if left.is_zero() {
                        break Ended::Deadline;
                    }
                    left.min(timeouts.no_change)
                }
                None => timeouts.no_change,
            };
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
                    if let Some(at) = find(&kept, needle.as_bytes()) {
                        let rest = &kept[at + needle.len()..];
                        if let Some(end) = rest.iter().position(|b| *b == b'\n') {
                            let line = String::from_utf8_lossy(&rest[..end]).into_owned();
                            let (code, cwd) = line.split_once(' ').unwrap_or((line.as_str(), ""));
                            let code = code.parse().unwrap_or(-1);
                            let cwd = cwd.to_owned();
                            kept.truncate(at);
                            break Ended::Marker { code, cwd };
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
                    break Ended::Exited(exit.exit_code);
                }
                Some(Output::Error { .. }) | None => {
                    io.pid = None;
                    io.attached = None;
                    io.pending = None;
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
        }
        let mut output = String::from_utf8_lossy(&kept).into_owned();
        if dropped {
            output.insert_str(0, "[output truncated in the middle]\n");
        }
        Ok((ended, output))
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Ended {
    /// The command's end: its exit status and the shell's directory.
    Marker { code: i32, cwd: String },
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
    fn markers_are_found_across_chunks() {
        let needle = b"\n__M__";
        assert_eq!(find(b"out\n__M__0 /tmp\n", needle), Some(3));
        assert_eq!(find(b"no marker", needle), None);
    }
}
