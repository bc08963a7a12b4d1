//! Processes: spawning, output pumps, stdin queues, signals and waits.
//!
//! # Lifecycle of a `spawn`
//!
//! 1. [`crate::spawn`] (a vfork-style clone) with exactly the requested
//!    environment, stdin piped or `/dev/null`, stdout/stderr piped, and
//!    [`ChildSetup`] in the child for session, rlimits, identity, cwd and
//!    descriptors. Failure: one final `error`, no `started`.
//! 2. `started{pid}`, then one pump task per output stream forwards chunks of
//!    at most 64 KiB. At `output_limit` bytes the pump forwards exactly up to
//!    the cap, marks the stream truncated and drops its read end, so the
//!    writer gets `SIGPIPE`/`EPIPE` and a `yes` ends instead of spinning.
//! 3. The reaper reports the exit; `timeout_ms` SIGKILLs the process group
//!    first if it expires. After the exit, each pump keeps forwarding while
//!    data comes and stops once its pipe reaches EOF or stays silent for
//!    [`DRAIN_GRACE`] (a backgrounded grandchild may hold the pipe forever).
//! 4. The final `exited` goes out after every output chunk. The status stays
//!    in a ring of the last [`RECENT`] statuses for `wait`.
//!
//! # Terminals
//!
//! A `spawn` with `pty` runs the process on a new pseudo-terminal instead of
//! pipes. The agent opens the master (`/dev/ptmx`) and its slave, sets the
//! size, and the child gets the slave as stdin, stdout and stderr and, right
//! after `setsid`, as its controlling terminal; everything else (identity,
//! cwd, environment, rlimits, timeout) is the same child setup as for
//! pipes. The agent holds no slave descriptor after the start, so the master
//! reads EIO once the child and everything it left holding the slave are
//! gone: that is the end of the output. The master is read like stdout
//! (`pty` events, counted against `output_limit` as stdout) and written by
//! the stdin task (`write_stdin` is typed into the terminal). At the output
//! limit every master descriptor is closed: the terminal hangs up, its
//! processes get SIGHUP, as a pipe's writer gets SIGPIPE. (A write to the
//! terminal blocked at that moment, its input full and unread, keeps the
//! writer's descriptor until it completes or the process ends, at the
//! latest at its timeout.) A terminal's input
//! is never closed (as in e2b's envd): `^D` written to it ends the input of
//! a program reading the terminal. Where the kernel's terminals turn no
//! `^C`, `^\` or `^Z` into a signal (gVisor's), the stdin task does
//! ([`crate::line_signals`]).
//!
//! # Stdin
//!
//! Each process with a stdin pipe has its own queue and writer task, so a
//! process that never reads stdin stalls nobody else. `write_stdin` is
//! answered with `done` only once its bytes are in the pipe: a host that
//! waits for `done` before sending more gets backpressure on that process
//! alone. A queue holding more than [`STDIN_QUEUE_BYTES`] refuses further
//! writes instead of growing.

use crate::failure::Failure;
use crate::line_signals::{LineSignals, Piece};
use crate::outbox::Outbox;
use crate::privileges::ChildSetup;
use crate::reaper::{Ended, Reaper};
use crate::{locked, AgentConfig};
use airlock_protocol::{
    ErrorKind, Event, ExitStatus, Identity, ProcessInfo, PtySize, SpawnRequest,
};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;
use tokio::sync::{mpsc, oneshot, watch};

/// Largest output chunk forwarded in one frame.
pub(crate) const OUTPUT_CHUNK: usize = 64 * 1024;
/// After the process exits, a pump whose pipe stays silent this long stops.
pub(crate) const DRAIN_GRACE: Duration = Duration::from_millis(100);
/// Exit statuses kept for `wait` after a process ended.
pub(crate) const RECENT: usize = 64;
/// Bytes that may wait in one process's stdin queue.
pub(crate) const STDIN_QUEUE_BYTES: usize = 16 << 20;
/// How long shutdown waits for spawns in flight and for reaping.
const SPAWN_SETTLE: Duration = Duration::from_secs(2);
const REAP_SETTLE: Duration = Duration::from_secs(5);
/// Grace between SIGTERM and SIGKILL on a graceful stop.
const TERM_GRACE: Duration = Duration::from_secs(2);
/// `TERM` of a process on a terminal whose environment names none: what
/// e2b's SDKs set, and what terminal emulators speaking to it expect.
const DEFAULT_TERM: &str = "xterm-256color";

/// The processes the agent started, and how to reach them.
#[derive(Debug)]
pub(crate) struct Processes {
    config: Arc<AgentConfig>,
    outbox: Outbox,
    reaper: Arc<Reaper>,
    table: Mutex<Table>,
    /// Spawns between the request and the table entry.
    spawning: AtomicUsize,
    /// Set once shutdown began: late spawns are killed at once.
    closing: AtomicBool,
}

#[derive(Debug, Default)]
struct Table {
    running: HashMap<u32, Entry>,
    recent: VecDeque<ExitStatus>,
}

#[derive(Debug)]
struct Entry {
    info: ProcessInfo,
    /// The process was reaped; its pumps may still be draining.
    reaped: bool,
    stdin: Stdin,
    terminal: Terminal,
    waiters: Vec<oneshot::Sender<ExitStatus>>,
}

/// The terminal of a process, seen from the table.
#[derive(Debug)]
enum Terminal {
    /// Started with pipes.
    Absent,
    /// A descriptor of the master, kept to resize the terminal.
    Open(OwnedFd),
    /// Its output passed the limit and every master descriptor was closed.
    HungUp,
}

#[derive(Debug)]
enum Stdin {
    /// Started with /dev/null.
    Absent,
    Open {
        tx: mpsc::UnboundedSender<StdinOp>,
        queued: Arc<AtomicUsize>,
    },
    Closed,
}

#[derive(Debug)]
struct StdinOp {
    id: u64,
    /// Bytes to write; `None` closes the pipe.
    data: Option<Vec<u8>>,
}

/// What `wait` found.
pub(crate) enum WaitOutcome {
    /// The process ended recently.
    Ended(ExitStatus),
    /// The process runs; the receiver gets its status.
    Pending(oneshot::Receiver<ExitStatus>),
}

/// Everything the blocking thread needs to start a process.
struct Launch {
    cmd: String,
    args: Vec<String>,
    env: BTreeMap<String, String>,
    cwd: PathBuf,
    stdin: bool,
    /// Run on a new terminal of this size instead of pipes.
    pty: Option<PtySize>,
    /// Owner to give the terminal's slave (the uid the child switches to),
    /// so the process can reopen its own terminal as a login's could.
    terminal_owner: Option<u32>,
    setup: ChildSetup,
}

/// A started process and our ends of its pipes, or of its terminal.
struct Launched {
    pid: u32,
    stdin: Option<OwnedFd>,
    stdout: Option<OwnedFd>,
    stderr: Option<OwnedFd>,
    /// The terminal's master (non-blocking), for a process started on one.
    terminal: Option<OwnedFd>,
}

/// Which output stream a pump forwards.
#[derive(Debug, Clone, Copy)]
enum Stream {
    Stdout,
    Stderr,
    /// The master of the process's terminal.
    Pty,
}

impl Stream {
    fn event(self) -> Event {
        match self {
            Stream::Stdout => Event::Stdout,
            Stream::Stderr => Event::Stderr,
            Stream::Pty => Event::Pty,
        }
    }
}

/// Opens a new terminal of `size`: its master (non-blocking, for the
/// runtime) and its slave (for the child), both close-on-exec.
pub(crate) fn open_terminal(size: PtySize, owner: Option<u32>) -> io::Result<(OwnedFd, OwnedFd)> {
    use rustix::pty::OpenptFlags;
    let flags = OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC;
    let master = rustix::pty::openpt(flags)?;
    rustix::pty::grantpt(&master)?;
    rustix::pty::unlockpt(&master)?;
    // TIOCGPTPEER opens the slave through the master, never by a path
    // another process could have changed; kernels before 4.13 name it.
    let slave = match rustix::pty::ioctl_tiocgptpeer(&master, flags) {
        Ok(slave) => slave,
        Err(rustix::io::Errno::INVAL | rustix::io::Errno::NOTTY) => {
            let path = rustix::pty::ptsname(&master, Vec::new())?;
            rustix::fs::open(
                path.as_c_str(),
                rustix::fs::OFlags::RDWR | rustix::fs::OFlags::NOCTTY | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )?
        }
        Err(errno) => return Err(errno.into()),
    };
    if let Some(uid) = owner {
        rustix::fs::fchown(&slave, Some(rustix::fs::Uid::from_raw_unchecked(uid)), None)?;
    }
    set_size(&master, size)?;
    rustix::io::ioctl_fionbio(&master, true)?;
    Ok((master, slave))
}

/// Sets the size of a terminal (`TIOCSWINSZ`); the kernel sends SIGWINCH
/// to its foreground process group when the size changes.
fn set_size(terminal: impl AsFd, size: PtySize) -> io::Result<()> {
    rustix::termios::tcsetwinsize(
        terminal,
        rustix::termios::Winsize {
            ws_row: size.rows,
            ws_col: size.cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        },
    )?;
    Ok(())
}

/// Checks a terminal size: programs divide by it and draw nothing in zero.
fn validate_size(size: PtySize) -> Result<(), Failure> {
    if size.cols == 0 || size.rows == 0 {
        return Err(Failure::invalid(format!(
            "a terminal of {} columns and {} rows has no room; both must be at least 1",
            size.cols, size.rows
        )));
    }
    Ok(())
}

/// Sends `signal` to the process group `pgid`.
pub(crate) fn kill_group(pgid: u32, signal: i32) -> io::Result<()> {
    let pgid = i32::try_from(pgid)
        .ok()
        .filter(|p| *p > 1)
        .ok_or_else(|| io::Error::from_raw_os_error(libc::ESRCH))?;
    // SAFETY: kill takes two integers and touches no memory. pgid > 1, so
    // -pgid names exactly one process group (never 0 = our own group or -1
    // = every process).
    let rc = unsafe { libc::kill(-pgid, signal) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Sends `signal` to every process the agent may signal (`kill(-1)`); only
/// ever called when the agent is PID 1, where that is the whole sandbox.
fn kill_everything(signal: i32) {
    // SAFETY: kill takes two integers and touches no memory. The caller
    // checked the agent is PID 1 of its namespace, so -1 means every other
    // process of the sandbox and nothing outside it.
    unsafe {
        libc::kill(-1, signal);
    }
}

/// A resolved path inside the sandbox: relative ones are joined to `base`.
pub(crate) fn join_path(base: &Path, path: &str) -> PathBuf {
    let joined = if Path::new(path).is_absolute() {
        PathBuf::from(path)
    } else {
        base.join(path)
    };
    // Drops "." components and doubled or trailing slashes (not "..").
    joined.components().collect()
}

/// Checks the request for values `exec` cannot take.
fn validate(req: &SpawnRequest) -> Result<(), Failure> {
    if req.cmd.is_empty() {
        return Err(Failure::invalid("the command is empty"));
    }
    if req.cmd.contains('\0') || req.args.iter().any(|a| a.contains('\0')) {
        return Err(Failure::invalid(
            "the command or an argument contains a NUL byte",
        ));
    }
    for (key, value) in &req.env {
        if key.is_empty() || key.contains('=') || key.contains('\0') || value.contains('\0') {
            return Err(Failure::invalid(format!(
                "the environment variable {key:?} has an invalid name or value"
            )));
        }
    }
    if req.cwd.as_deref().is_some_and(|c| c.contains('\0')) {
        return Err(Failure::invalid(
            "the working directory contains a NUL byte",
        ));
    }
    if let Some(size) = req.pty {
        validate_size(size)?;
    }
    Ok(())
}

/// Why a spawn failed, in protocol terms.
fn spawn_failure(cmd: &str, error: &io::Error) -> Failure {
    match error.raw_os_error() {
        Some(libc::ENOENT) => Failure::new(
            ErrorKind::NotFound,
            format!("the command {cmd} was not found"),
        ),
        Some(libc::EACCES) | Some(libc::ENOEXEC) => Failure::new(
            ErrorKind::NotExecutable,
            format!(
                "the command {cmd} could not be executed: {}",
                crate::failure::reason(error)
            ),
        ),
        _ => Failure::new(
            crate::failure::kind_of(error),
            format!(
                "the command {cmd} could not be started: {}",
                crate::failure::reason(error)
            ),
        ),
    }
}

/// Checks the cwd, starts the command ([`crate::spawn`]); returns once
/// the exec succeeded.
fn launch(plan: Launch) -> Result<Launched, Failure> {
    match std::fs::metadata(&plan.cwd) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => {
            return Err(Failure::new(
                ErrorKind::NotADirectory,
                format!(
                    "the working directory {} is not a directory",
                    plan.cwd.display()
                ),
            ))
        }
        Err(error) => {
            return Err(Failure::io(
                format!(
                    "the working directory {} cannot be used",
                    plan.cwd.display()
                ),
                &error,
            ))
        }
    }
    let null = || {
        rustix::fs::open(
            "/dev/null",
            rustix::fs::OFlags::RDWR | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(io::Error::from)
    };
    let pipe =
        || rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(io::Error::from);
    // The child's ends (closed here once it runs) and ours.
    let (theirs, ours): ([OwnedFd; 3], Ours) = match plan.pty {
        Some(size) => {
            let opened = open_terminal(size, plan.terminal_owner).and_then(|(master, slave)| {
                Ok((
                    [slave.try_clone()?, slave.try_clone()?, slave],
                    Ours {
                        stdin: None,
                        stdout: None,
                        stderr: None,
                        terminal: Some(master),
                    },
                ))
            });
            opened.map_err(|error| Failure::io("a terminal could not be opened", &error))?
        }
        None => {
            let opened = (|| {
                let (stdin_theirs, stdin_ours) = if plan.stdin {
                    let (read, write) = pipe()?;
                    (read, Some(write))
                } else {
                    (null()?, None)
                };
                let (stdout_ours, stdout_theirs) = pipe()?;
                let (stderr_ours, stderr_theirs) = pipe()?;
                Ok::<_, io::Error>((
                    [stdin_theirs, stdout_theirs, stderr_theirs],
                    Ours {
                        stdin: stdin_ours,
                        stdout: Some(stdout_ours),
                        stderr: Some(stderr_ours),
                        terminal: None,
                    },
                ))
            })();
            opened.map_err(|error| Failure::io("the pipes could not be made", &error))?
        }
    };
    let pid = crate::spawn::spawn(
        &plan.cmd,
        &plan.args,
        &plan.env,
        [&theirs[0], &theirs[1], &theirs[2]],
        &plan.setup,
    )
    .map_err(|error| spawn_failure(&plan.cmd, &error))?;
    drop(theirs);
    // The reaper owns the pid.
    Ok(Launched {
        pid,
        stdin: ours.stdin,
        stdout: ours.stdout,
        stderr: ours.stderr,
        terminal: ours.terminal,
    })
}

/// Our ends of a child's standard descriptors.
struct Ours {
    stdin: Option<OwnedFd>,
    stdout: Option<OwnedFd>,
    stderr: Option<OwnedFd>,
    terminal: Option<OwnedFd>,
}

impl Processes {
    /// An empty process table.
    pub(crate) fn new(config: Arc<AgentConfig>, outbox: Outbox, reaper: Arc<Reaper>) -> Self {
        Processes {
            config,
            outbox,
            reaper,
            table: Mutex::new(Table::default()),
            spawning: AtomicUsize::new(0),
            closing: AtomicBool::new(false),
        }
    }

    fn home(&self, identity: Identity) -> &Path {
        match identity {
            Identity::User => &self.config.user_home,
            Identity::Root => &self.config.root_home,
        }
    }

    /// Handles `spawn`: answers on `id` from a task of its own.
    pub(crate) fn spawn(self: &Arc<Self>, id: u64, req: SpawnRequest) {
        self.spawning.fetch_add(1, Ordering::SeqCst);
        let this = Arc::clone(self);
        tokio::spawn(async move {
            let started = this.start(req).await;
            this.spawning.fetch_sub(1, Ordering::SeqCst);
            match started {
                Ok(running) => this.supervise(id, running).await,
                Err(failure) => {
                    this.outbox.fail(id, failure).await;
                }
            }
        });
    }

    /// Starts the process and enters it in the table.
    async fn start(self: &Arc<Self>, req: SpawnRequest) -> Result<Running, Failure> {
        validate(&req)?;
        let home = self.home(req.user);
        let cwd = match &req.cwd {
            Some(cwd) => join_path(home, cwd),
            None => home.to_path_buf(),
        };
        let cwd_c = CString::new(cwd.as_os_str().as_bytes())
            .map_err(|_| Failure::invalid("the working directory contains a NUL byte"))?;
        let mut env = req.env.clone();
        let mut setup = ChildSetup::new(&req.limits, req.user, self.config.drop_privileges, cwd_c);
        if req.pty.is_some() {
            env.entry("TERM".to_owned())
                .or_insert_with(|| DEFAULT_TERM.to_owned());
            setup = setup.on_terminal();
        }
        let terminal_owner =
            (req.pty.is_some() && self.config.drop_privileges && req.user == Identity::User)
                .then_some(crate::privileges::USER_ID);
        let plan = Launch {
            cmd: req.cmd.clone(),
            args: req.args.clone(),
            env,
            cwd,
            stdin: req.stdin,
            pty: req.pty,
            terminal_owner,
            setup,
        };
        // Launched on the runtime thread: the start and exec take a fraction of a
        // millisecond, less than handing the work to a blocking-pool thread
        // (a thread to create in a pids-limited sandbox, two wake-ups).
        let launched = {
            let _gate = self.reaper.launching();
            launch(plan)
        };
        // Reaps skipped while the launch held the gate happen now.
        self.reaper.reap();
        let launched = launched?;
        let pid = launched.pid;
        let ended = self.reaper.register(pid);

        let stdout = launched
            .stdout
            .map(pipe::Receiver::from_owned_fd)
            .transpose();
        let stderr = launched
            .stderr
            .map(pipe::Receiver::from_owned_fd)
            .transpose();
        let stdin = launched.stdin.map(pipe::Sender::from_owned_fd).transpose();
        let terminal = launched.terminal.map(terminal_ends).transpose();
        let (stdout, stderr, stdin, terminal) = match (stdout, stderr, stdin, terminal) {
            (Ok(stdout), Ok(stderr), Ok(stdin), Ok(terminal)) => (stdout, stderr, stdin, terminal),
            (Err(error), _, _, _)
            | (_, Err(error), _, _)
            | (_, _, Err(error), _)
            | (_, _, _, Err(error)) => {
                let _ = kill_group(pid, libc::SIGKILL);
                let _ = ended.await;
                return Err(Failure::new(
                    ErrorKind::Io,
                    format!(
                        "the pipes of {} could not be set up: {}",
                        req.cmd,
                        crate::failure::reason(&error)
                    ),
                ));
            }
        };

        // A terminal's master is read as the output and written as stdin,
        // its signal keys cut out where the kernel would ignore them.
        let (stdout, stdin, terminal, signals) = match terminal {
            Some(ends) => {
                let signals = ends
                    .control
                    .try_clone()
                    .ok()
                    .map(|master| LineSignals::new(master, pid, Arc::clone(&self.reaper)));
                (
                    Some(ends.reader),
                    Some(ends.writer),
                    Terminal::Open(ends.control),
                    signals,
                )
            }
            None => (stdout, stdin, Terminal::Absent, None),
        };
        let on_terminal = matches!(terminal, Terminal::Open(_));
        let (exited_tx, exited_rx) = watch::channel(false);
        let stdin_state = match stdin {
            Some(pipe) => {
                let (tx, rx) = mpsc::unbounded_channel();
                let queued = Arc::new(AtomicUsize::new(0));
                tokio::spawn(feed_stdin(
                    self.outbox.clone(),
                    pid,
                    pipe,
                    signals,
                    rx,
                    Arc::clone(&queued),
                    exited_rx.clone(),
                ));
                Stdin::Open { tx, queued }
            }
            None => Stdin::Absent,
        };
        {
            let mut table = locked(&self.table);
            table.running.insert(
                pid,
                Entry {
                    info: ProcessInfo {
                        pid,
                        cmd: req.cmd.clone(),
                        args: req.args.clone(),
                        user: req.user,
                    },
                    reaped: false,
                    stdin: stdin_state,
                    terminal,
                    waiters: Vec::new(),
                },
            );
        }
        if self.closing.load(Ordering::SeqCst) {
            let _ = kill_group(pid, libc::SIGKILL);
        }
        Ok(Running {
            pid,
            ended,
            stdout,
            stderr,
            on_terminal,
            exited_tx,
            exited_rx,
            timeout: req.timeout_ms.map(Duration::from_millis),
            output_limit: req.output_limit,
        })
    }

    /// Streams a started process to its end and sends the final `exited`.
    async fn supervise(self: Arc<Self>, id: u64, running: Running) {
        let Running {
            pid,
            mut ended,
            stdout,
            stderr,
            on_terminal,
            exited_tx,
            exited_rx,
            timeout,
            output_limit,
        } = running;
        // If the host is gone, shutdown kills and reaps the process.
        let _ = self.outbox.send(id, Event::Started { pid }).await;
        let out_pump = if on_terminal {
            let this = Arc::clone(&self);
            tokio::spawn(pump(
                self.outbox.clone(),
                id,
                Stream::Pty,
                stdout,
                output_limit,
                exited_rx.clone(),
                Some(Box::new(move || this.hang_up(pid))),
            ))
        } else {
            tokio::spawn(pump(
                self.outbox.clone(),
                id,
                Stream::Stdout,
                stdout,
                output_limit,
                exited_rx.clone(),
                None,
            ))
        };
        let err_pump = tokio::spawn(pump(
            self.outbox.clone(),
            id,
            Stream::Stderr,
            stderr,
            output_limit,
            exited_rx,
            None,
        ));

        let mut timed_out = false;
        let how = match timeout {
            Some(limit) => {
                tokio::select! {
                    how = &mut ended => how,
                    _ = tokio::time::sleep(limit) => {
                        timed_out = true;
                        let _ = kill_group(pid, libc::SIGKILL);
                        ended.await
                    }
                }
            }
            None => ended.await,
        }
        .unwrap_or(Ended::Unknown);

        if let Some(entry) = locked(&self.table).running.get_mut(&pid) {
            entry.reaped = true;
        }
        let _ = exited_tx.send(true);
        let stdout_truncated = out_pump.await.unwrap_or(false);
        let stderr_truncated = err_pump.await.unwrap_or(false);

        let (code, signal) = match how {
            Ended::Code(code) => (Some(code), None),
            Ended::Signal(signal) => (None, Some(signal)),
            Ended::Unknown => (None, None),
        };
        let status = ExitStatus {
            pid,
            code,
            signal,
            oom: false,
            timed_out,
            stdout_truncated,
            stderr_truncated,
        };
        let waiters = {
            let mut table = locked(&self.table);
            let waiters = table
                .running
                .remove(&pid)
                .map(|entry| entry.waiters)
                .unwrap_or_default();
            if table.recent.len() == RECENT {
                table.recent.pop_front();
            }
            table.recent.push_back(status.clone());
            waiters
        };
        for waiter in waiters {
            let _ = waiter.send(status.clone());
        }
        drop(exited_tx);
        self.outbox.send(id, Event::Exited(status)).await;
    }

    /// Handles `write_stdin`. `Ok` means queued: the stdin task answers.
    pub(crate) fn write_stdin(&self, id: u64, pid: u32, data: Vec<u8>) -> Result<(), Failure> {
        let table = locked(&self.table);
        let entry = live_entry(&table, pid)?;
        if matches!(entry.terminal, Terminal::HungUp) {
            return Err(hung_up(pid));
        }
        match &entry.stdin {
            Stdin::Absent => Err(Failure::invalid(format!(
                "process {pid} was started without a stdin pipe"
            ))),
            Stdin::Closed => Err(Failure::invalid(format!(
                "the stdin of process {pid} is already closed"
            ))),
            Stdin::Open { tx, queued } => {
                let waiting = queued.load(Ordering::SeqCst);
                if waiting.saturating_add(data.len()) > STDIN_QUEUE_BYTES && waiting > 0 {
                    return Err(Failure::new(
                        ErrorKind::Busy,
                        format!(
                            "the stdin of process {pid} already has {waiting} bytes waiting; \
                             wait for their done before sending more"
                        ),
                    ));
                }
                queued.fetch_add(data.len(), Ordering::SeqCst);
                let len = data.len();
                tx.send(StdinOp {
                    id,
                    data: Some(data),
                })
                .map_err(|_| {
                    queued.fetch_sub(len, Ordering::SeqCst);
                    Failure::invalid(format!("the stdin of process {pid} is already closed"))
                })
            }
        }
    }

    /// Handles `close_stdin`. `Ok` means queued behind earlier writes.
    pub(crate) fn close_stdin(&self, id: u64, pid: u32) -> Result<(), Failure> {
        let mut table = locked(&self.table);
        let entry = table
            .running
            .get_mut(&pid)
            .filter(|entry| !entry.reaped)
            .ok_or_else(|| not_running(pid))?;
        if !matches!(entry.terminal, Terminal::Absent) {
            return Err(Failure::invalid(format!(
                "process {pid} reads from a terminal, whose input cannot be closed; \
                 write ^D (0x04) to it to end the input of a program reading it"
            )));
        }
        match std::mem::replace(&mut entry.stdin, Stdin::Closed) {
            Stdin::Absent => {
                entry.stdin = Stdin::Absent;
                Err(Failure::invalid(format!(
                    "process {pid} was started without a stdin pipe"
                )))
            }
            Stdin::Closed => Err(Failure::invalid(format!(
                "the stdin of process {pid} is already closed"
            ))),
            Stdin::Open { tx, .. } => tx.send(StdinOp { id, data: None }).map_err(|_| {
                Failure::invalid(format!("the stdin of process {pid} is already closed"))
            }),
        }
    }

    /// Handles `resize`: sets the size of the terminal of `pid`.
    pub(crate) fn resize(&self, pid: u32, size: PtySize) -> Result<Event, Failure> {
        validate_size(size)?;
        let table = locked(&self.table);
        match &live_entry(&table, pid)?.terminal {
            Terminal::Absent => Err(Failure::invalid(format!(
                "process {pid} was started without a terminal"
            ))),
            Terminal::HungUp => Err(hung_up(pid)),
            Terminal::Open(master) => {
                set_size(master, size)
                    .map(|()| Event::Done)
                    .map_err(|error| {
                        Failure::io(
                            format!("cannot resize the terminal of process {pid}"),
                            &error,
                        )
                    })
            }
        }
    }

    /// Closes the descriptors of the terminal of `pid` that the table holds
    /// (the one to resize and, by ending its stdin task, the writer); once
    /// the pump that calls this drops the reader, the master is closed and
    /// the terminal hangs up. Its process group gets the SIGHUP of the
    /// hangup first, while the master is still open, so a process blocked
    /// writing to the full terminal dies of it, as it would of a hangup,
    /// rather than of the write error (EIO) a closed master makes race the
    /// signal (one that ignores SIGHUP still gets the error).
    fn hang_up(&self, pid: u32) {
        let mut table = locked(&self.table);
        if let Some(entry) = table.running.get_mut(&pid) {
            // As `signal` does: an entry not reaped has its own pid.
            if !entry.reaped {
                let _ = kill_group(pid, libc::SIGHUP);
            }
            entry.terminal = Terminal::HungUp;
            entry.stdin = Stdin::Closed;
        }
    }

    /// Handles `signal`: signals the process group of `pid`.
    pub(crate) fn signal(&self, pid: u32, signal: i32) -> Result<Event, Failure> {
        if !(0..=64).contains(&signal) {
            return Err(Failure::invalid(format!("{signal} is not a signal number")));
        }
        let table = locked(&self.table);
        live_entry(&table, pid)?;
        match kill_group(pid, signal) {
            Ok(()) => Ok(Event::Done),
            Err(error) if error.raw_os_error() == Some(libc::ESRCH) => Err(not_running(pid)),
            Err(error) => Err(Failure::io(format!("cannot signal process {pid}"), &error)),
        }
    }

    /// Handles `list_processes`: the started processes not yet ended.
    pub(crate) fn list(&self) -> Event {
        let table = locked(&self.table);
        let mut processes: Vec<ProcessInfo> = table
            .running
            .values()
            .filter(|entry| !entry.reaped)
            .map(|entry| entry.info.clone())
            .collect();
        processes.sort_by_key(|info| info.pid);
        Event::Processes { processes }
    }

    /// Handles `wait`.
    pub(crate) fn wait(&self, pid: u32) -> Result<WaitOutcome, Failure> {
        let mut table = locked(&self.table);
        if let Some(entry) = table.running.get_mut(&pid) {
            let (tx, rx) = oneshot::channel();
            entry.waiters.push(tx);
            return Ok(WaitOutcome::Pending(rx));
        }
        table
            .recent
            .iter()
            .rev()
            .find(|status| status.pid == pid)
            .map(|status| WaitOutcome::Ended(status.clone()))
            .ok_or_else(|| {
                Failure::new(
                    ErrorKind::NotFound,
                    format!("no process {pid} was started recently"),
                )
            })
    }

    /// Kills every process group the agent started and waits until every
    /// started process is reaped (a killed process leaves no zombie).
    pub(crate) async fn kill_all(&self) {
        self.settle_spawns().await;
        self.signal_all(libc::SIGKILL);
        self.settle_reaped(REAP_SETTLE).await;
    }

    /// The graceful stop of PID 1: SIGTERM to every group, up to
    /// [`TERM_GRACE`] to exit, then SIGKILL for the rest.
    pub(crate) async fn terminate_all(&self) {
        self.settle_spawns().await;
        self.signal_all(libc::SIGTERM);
        if !self.settle_reaped(TERM_GRACE).await {
            self.signal_all(libc::SIGKILL);
            self.settle_reaped(REAP_SETTLE).await;
        }
    }

    /// Stops new spawns and waits (bounded) for those in flight.
    async fn settle_spawns(&self) {
        self.closing.store(true, Ordering::SeqCst);
        let deadline = tokio::time::Instant::now() + SPAWN_SETTLE;
        while self.spawning.load(Ordering::SeqCst) > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Signals the group of every process started (running, draining or
    /// recently ended: a background grandchild keeps its group). As PID 1
    /// also every other process of the sandbox (orphans that left the group).
    fn signal_all(&self, signal: i32) {
        let groups: Vec<u32> = {
            let table = locked(&self.table);
            table
                .running
                .keys()
                .copied()
                .chain(table.recent.iter().map(|status| status.pid))
                .collect()
        };
        for pgid in groups {
            let _ = kill_group(pgid, signal);
        }
        if self.reaper.reaps_all() {
            kill_everything(signal);
        }
    }

    /// Waits until every started process is reaped, at most `limit`.
    /// Returns whether they all were.
    async fn settle_reaped(&self, limit: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let all_reaped = locked(&self.table)
                .running
                .values()
                .all(|entry| entry.reaped);
            if all_reaped {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            self.reaper.reap();
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// A started process on its way to [`Processes::supervise`].
struct Running {
    pid: u32,
    ended: oneshot::Receiver<Ended>,
    /// The pipe of stdout, or the master of the terminal.
    stdout: Option<pipe::Receiver>,
    stderr: Option<pipe::Receiver>,
    /// `stdout` is the master of the process's terminal.
    on_terminal: bool,
    exited_tx: watch::Sender<bool>,
    exited_rx: watch::Receiver<bool>,
    timeout: Option<Duration>,
    output_limit: u64,
}

fn not_running(pid: u32) -> Failure {
    Failure::new(
        ErrorKind::NotFound,
        format!("no process {pid} started by the agent is running"),
    )
}

fn hung_up(pid: u32) -> Failure {
    Failure::new(
        ErrorKind::Closed,
        format!("the terminal of process {pid} hung up when its output passed the limit"),
    )
}

/// The agent's three descriptors of a terminal's master.
struct TerminalEnds {
    /// Read by the output pump.
    reader: pipe::Receiver,
    /// Written by the stdin task.
    writer: pipe::Sender,
    /// Kept in the table to resize the terminal.
    control: OwnedFd,
}

/// Splits a (non-blocking) master into the ends the tasks use. tokio's
/// pipe types only wait for readiness and call `read`/`write` on the
/// descriptor, which is all a master needs too; the unchecked constructors
/// skip their check that the descriptor is a FIFO.
fn terminal_ends(master: OwnedFd) -> io::Result<TerminalEnds> {
    let reader = master.try_clone()?;
    let control = master.try_clone()?;
    Ok(TerminalEnds {
        reader: pipe::Receiver::from_owned_fd_unchecked(reader)?,
        writer: pipe::Sender::from_owned_fd_unchecked(master)?,
        control,
    })
}

fn live_entry(table: &Table, pid: u32) -> Result<&Entry, Failure> {
    table
        .running
        .get(&pid)
        .filter(|entry| !entry.reaped)
        .ok_or_else(|| not_running(pid))
}

/// What a pump does when it cuts its stream, before it lets go of it.
type OnCut = Box<dyn FnOnce() + Send>;

/// Forwards one output stream; returns whether it was cut at the cap
/// (after `on_cut`, while its read end is still open).
async fn pump(
    outbox: Outbox,
    id: u64,
    stream: Stream,
    pipe: Option<pipe::Receiver>,
    limit: u64,
    mut exited: watch::Receiver<bool>,
    on_cut: Option<OnCut>,
) -> bool {
    let Some(mut pipe) = pipe else { return false };
    // Read into spare capacity: no page of the buffer is touched before
    // output fills it (a `true` costs no zeroed 64 KiB per stream).
    let mut buf = Vec::with_capacity(OUTPUT_CHUNK);
    let mut forwarded: u64 = 0;
    let mut draining = *exited.borrow();
    loop {
        buf.clear();
        let read = if draining {
            match tokio::time::timeout(DRAIN_GRACE, pipe.read_buf(&mut buf)).await {
                Ok(read) => read,
                // Silent since the exit: a background process holds the pipe.
                Err(_) => return false,
            }
        } else {
            tokio::select! {
                read = pipe.read_buf(&mut buf) => read,
                _ = exited.wait_for(|exited| *exited) => {
                    draining = true;
                    continue;
                }
            }
        };
        let n = match read {
            Ok(0) | Err(_) => return false,
            Ok(n) => n,
        };
        let room = usize::try_from(limit.saturating_sub(forwarded)).unwrap_or(usize::MAX);
        let take = n.min(room);
        if take > 0 {
            forwarded += take as u64;
            if !outbox
                .send_payload(id, stream.event(), buf[..take].to_vec())
                .await
            {
                return false;
            }
        }
        if take < n {
            // Past the cap: dropping the read end makes further writes fail
            // with SIGPIPE/EPIPE, so the writer stops instead of spinning.
            if let Some(on_cut) = on_cut {
                on_cut();
            }
            return true;
        }
    }
}

/// Writes queued stdin chunks to one process, answering each request.
async fn feed_stdin(
    outbox: Outbox,
    pid: u32,
    pipe: pipe::Sender,
    signals: Option<LineSignals>,
    mut rx: mpsc::UnboundedReceiver<StdinOp>,
    queued: Arc<AtomicUsize>,
    mut exited: watch::Receiver<bool>,
) {
    let mut pipe = Some(pipe);
    loop {
        let op = tokio::select! {
            op = rx.recv() => op,
            _ = exited.wait_for(|exited| *exited) => break,
        };
        let Some(op) = op else { return };
        match op.data {
            Some(data) => {
                let len = data.len();
                let pieces = match &signals {
                    Some(signals) => signals.plan(&data).await,
                    None => vec![Piece::Bytes(0..len)],
                };
                let mut result = Ok(());
                for piece in pieces {
                    result = match (piece, pipe.as_mut()) {
                        (Piece::Signal(signal), _) => {
                            if let Some(signals) = &signals {
                                signals.deliver(signal);
                            }
                            Ok(())
                        }
                        (Piece::Bytes(range), Some(pipe)) => tokio::select! {
                            result = pipe.write_all(&data[range]) => result,
                            _ = exited.wait_for(|exited| *exited) => {
                                Err(io::Error::from_raw_os_error(libc::EPIPE))
                            }
                        },
                        (Piece::Bytes(_), None) => Err(io::Error::from_raw_os_error(libc::EPIPE)),
                    };
                    if result.is_err() {
                        break;
                    }
                }
                queued.fetch_sub(len, Ordering::SeqCst);
                let answer = result.map(|()| Event::Done).map_err(|error| {
                    Failure::new(
                        crate::failure::kind_of(&error),
                        format!(
                            "cannot write to the stdin of process {pid}: {}",
                            crate::failure::reason(&error)
                        ),
                    )
                });
                outbox.answer(op.id, answer).await;
            }
            None => {
                pipe = None;
                outbox.send(op.id, Event::Done).await;
            }
        }
    }
    // The process ended: whatever is still queued cannot be delivered.
    drop(pipe);
    rx.close();
    while let Some(op) = rx.recv().await {
        if let Some(data) = &op.data {
            queued.fetch_sub(data.len(), Ordering::SeqCst);
        }
        let answer = match op.data {
            Some(_) => Err(Failure::new(
                ErrorKind::Closed,
                format!("cannot write to the stdin of process {pid}: it has exited"),
            )),
            None => Ok(Event::Done),
        };
        outbox.answer(op.id, answer).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_join_the_base_and_drop_dots() {
        let base = Path::new("/home/user");
        assert_eq!(join_path(base, "a/./b/"), PathBuf::from("/home/user/a/b"));
        assert_eq!(join_path(base, "/tmp//x"), PathBuf::from("/tmp/x"));
        assert_eq!(join_path(base, "."), PathBuf::from("/home/user"));
    }

    #[test]
    fn spawn_errors_map_to_kinds() {
        let kind = |errno| spawn_failure("x", &io::Error::from_raw_os_error(errno)).kind;
        assert_eq!(kind(libc::ENOENT), ErrorKind::NotFound);
        assert_eq!(kind(libc::EACCES), ErrorKind::NotExecutable);
        assert_eq!(kind(libc::ENOEXEC), ErrorKind::NotExecutable);
        assert_eq!(kind(libc::EPERM), ErrorKind::PermissionDenied);
        assert_eq!(kind(libc::ENOTDIR), ErrorKind::NotADirectory);
        assert_eq!(kind(libc::ENAMETOOLONG), ErrorKind::InvalidArgument);
        assert_eq!(kind(libc::ELOOP), ErrorKind::InvalidArgument);
        assert_eq!(kind(libc::E2BIG), ErrorKind::InvalidArgument);
        assert_eq!(kind(libc::EIO), ErrorKind::Io);
    }
}
