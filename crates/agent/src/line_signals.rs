//! Terminal signals where the sandbox's kernel sends none.
//!
//! On Linux a terminal's line discipline turns a typed `^C`, `^\` or `^Z`
//! (the termios `VINTR`, `VQUIT` and `VSUSP` keys, while `ISIG` is on) into
//! SIGINT, SIGQUIT or SIGTSTP for the terminal's foreground process group,
//! and drops the key from the input. gVisor's terminals (the runsc of 2022
//! Debian ships) pass the key through as data and signal nobody, so an
//! e2b user's `send_stdin(b"\x03")` stopped nothing there.
//!
//! The agent does not guess from the tier: the first time such a key is
//! typed into a terminal it asks the kernel ([`kernel_sends`], once per
//! agent): a child leading a session on a fresh terminal blocks SIGINT,
//! the agent types `^C` and then a line, and the child, once it has read
//! that line, looks whether a SIGINT is pending. A kernel that signals
//! does so while it takes the key, before the line behind it is readable,
//! so the answer needs no timeout. Where the kernel signals, input is
//! written unchanged; where it does not, [`split`] cuts the keys out and
//! the agent signals the foreground group itself.
//!
//! The foreground group is the kernel's answer (`tcgetpgrp` on the master)
//! where it gives one. gVisor's answers only inside the session, so there
//! the agent takes [`guess_foreground`]: the newest process group of the
//! terminal's session that is not stopped, else the session leader's. A
//! shell's foreground job is always newer than its background jobs
//! (nothing starts while it runs), so that is the job a `^C` is for; the
//! guess is wrong in one case, documented: at an idle prompt with a
//! background job still running, the key reaches that job rather than the
//! shell. Unlike Linux, the emulation neither echoes `^C` nor flushes
//! input typed ahead.

use crate::reaper::Reaper;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::OnceCell;

/// How long the probe may take before the kernel is taken to send the
/// signals itself (the answer that changes nothing).
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// The keys that signal, from a terminal's termios; `None` for a key that
/// is disabled (`_POSIX_VDISABLE`, 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Keys {
    pub(crate) interrupt: Option<u8>,
    pub(crate) quit: Option<u8>,
    pub(crate) suspend: Option<u8>,
}

impl Keys {
    /// The keys of `termios`, or `None` when it has `ISIG` off (no key
    /// signals).
    pub(crate) fn of(termios: &rustix::termios::Termios) -> Option<Keys> {
        use rustix::termios::{LocalModes, SpecialCodeIndex};
        if !termios.local_modes.contains(LocalModes::ISIG) {
            return None;
        }
        let key = |index| Some(termios.special_codes[index]).filter(|k| *k != 0);
        Some(Keys {
            interrupt: key(SpecialCodeIndex::VINTR),
            quit: key(SpecialCodeIndex::VQUIT),
            suspend: key(SpecialCodeIndex::VSUSP),
        })
    }

    fn signal_of(&self, byte: u8) -> Option<i32> {
        if self.interrupt == Some(byte) {
            Some(libc::SIGINT)
        } else if self.quit == Some(byte) {
            Some(libc::SIGQUIT)
        } else if self.suspend == Some(byte) {
            Some(libc::SIGTSTP)
        } else {
            None
        }
    }

    /// Whether any byte of `data` is one of the keys.
    pub(crate) fn any_in(&self, data: &[u8]) -> bool {
        data.iter().any(|b| self.signal_of(*b).is_some())
    }
}

/// A part of what was typed: bytes to write, or a key's signal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Piece {
    /// `data[range]` goes to the terminal as is.
    Bytes(std::ops::Range<usize>),
    /// A key: this signal goes to the foreground group.
    Signal(i32),
}

/// Cuts the keys out of `data`, in order.
pub(crate) fn split(data: &[u8], keys: &Keys) -> Vec<Piece> {
    let mut pieces = Vec::new();
    let mut start = 0;
    for (at, byte) in data.iter().enumerate() {
        if let Some(signal) = keys.signal_of(*byte) {
            if start < at {
                pieces.push(Piece::Bytes(start..at));
            }
            pieces.push(Piece::Signal(signal));
            start = at + 1;
        }
    }
    if start < data.len() {
        pieces.push(Piece::Bytes(start..data.len()));
    }
    pieces
}

/// What `/proc/PID/stat` says of one process, as far as the guess needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Member {
    pub(crate) pid: i32,
    pub(crate) group: i32,
    pub(crate) session: i32,
    /// Stopped, traced or a zombie: not running in the foreground.
    pub(crate) halted: bool,
    /// Clock ticks after boot at which it started.
    pub(crate) started: u64,
}

impl Member {
    /// Parses one `/proc/PID/stat` line (the name in parentheses may hold
    /// anything, so the fields are read after its last `)`).
    pub(crate) fn parse(line: &str) -> Option<Member> {
        let (head, rest) = line.rsplit_once(')')?;
        let pid = head.split_once('(')?.0.trim().parse().ok()?;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // After the name: state (3), ppid, pgrp, session, ..., starttime (22).
        let state = fields.first()?;
        Some(Member {
            pid,
            group: fields.get(2)?.parse().ok()?,
            session: fields.get(3)?.parse().ok()?,
            halted: matches!(*state, "T" | "t" | "Z" | "X"),
            started: fields.get(19)?.parse().ok()?,
        })
    }
}

/// The process group a key typed into the terminal of session `session`
/// is most likely for (see the module doc): the newest group of the
/// session with a process that is not halted, else the session's own.
pub(crate) fn guess_foreground(session: i32, members: &[Member]) -> i32 {
    members
        .iter()
        .filter(|m| m.session == session && !m.halted && m.group > 1)
        .max_by_key(|m| (m.started, m.pid))
        .map_or(session, |m| m.group)
}

fn members_of(proc_root: &Path) -> Vec<Member> {
    let Ok(entries) = std::fs::read_dir(proc_root) else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter_map(|line| Member::parse(&line))
        .collect()
}

/// Signals of one terminal, for the task that types into it.
pub(crate) struct LineSignals {
    /// A descriptor of the terminal's master.
    master: OwnedFd,
    /// The session the terminal leads (the pid of the process started on
    /// it, which called `setsid`).
    session: i32,
    reaper: Arc<Reaper>,
}

impl LineSignals {
    pub(crate) fn new(master: OwnedFd, session: u32, reaper: Arc<Reaper>) -> LineSignals {
        LineSignals {
            master,
            session: i32::try_from(session).unwrap_or(0),
            reaper,
        }
    }

    /// How to type `data`: whole, or with its keys cut out where this
    /// agent must send their signals itself.
    pub(crate) async fn plan(&self, data: &[u8]) -> Vec<Piece> {
        let whole = || vec![Piece::Bytes(0..data.len())];
        let Some(keys) = rustix::termios::tcgetattr(&self.master)
            .ok()
            .and_then(|t| Keys::of(&t))
        else {
            return whole();
        };
        if !keys.any_in(data) || kernel_sends(&self.reaper).await {
            return whole();
        }
        split(data, &keys)
    }

    /// Sends a key's `signal` to the terminal's foreground group.
    pub(crate) fn deliver(&self, signal: i32) {
        let group = match rustix::termios::tcgetpgrp(&self.master) {
            Ok(group) => group.as_raw_nonzero().get(),
            Err(_) => guess_foreground(self.session, &members_of(Path::new("/proc"))),
        };
        if let Ok(group) = u32::try_from(group) {
            let _ = crate::process::kill_group(group, signal);
        }
    }
}

/// Whether this kernel's terminals send the keys' signals themselves
/// (asked once, see the module doc). A probe that cannot run says yes:
/// then input is typed as it was, never signalled twice.
pub(crate) async fn kernel_sends(reaper: &Arc<Reaper>) -> bool {
    static ANSWER: OnceCell<bool> = OnceCell::const_new();
    *ANSWER
        .get_or_init(|| async {
            let reaper = Arc::clone(reaper);
            tokio::task::spawn_blocking(move || !matches!(probe(&reaper), Ok(Some(false))))
                .await
                .unwrap_or(true)
        })
        .await
}

/// The probe: `Some(true)` when a `^C` typed into a fresh terminal left a
/// SIGINT pending in the session leading it, `Some(false)` when it did
/// not, `None` when the child gave no answer in time.
fn probe(reaper: &Reaper) -> io::Result<Option<bool>> {
    // The same kind of terminal a process is started on (its master
    // non-blocking: the few bytes typed into it fit at once).
    let (master, slave) =
        crate::process::open_terminal(airlock_protocol::PtySize { cols: 80, rows: 24 }, None)?;
    let (answer_read, answer_write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
    let (slave_fd, answer_fd) = (slave.as_raw_fd(), answer_write.as_raw_fd());
    let (pid, mut ended) = {
        // No waitpid(-1) between the fork and the registration.
        let _gate = reaper.launching();
        // SAFETY: the child runs only async-signal-safe calls on memory it
        // owns (its stack) and on descriptors that stay open in it, then
        // `_exit`s: nothing of the parent's threads or locks is touched.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(io::Error::last_os_error());
        }
        if pid == 0 {
            // SAFETY: in the forked child; see `probe_child`.
            unsafe { probe_child(slave_fd, answer_fd) }
        }
        let pid = pid.unsigned_abs();
        (pid, reaper.register(pid))
    };
    drop(slave);
    drop(answer_write);
    let answer = probe_talk(&master, &answer_read);
    if !matches!(answer, Ok(Some(_))) {
        if let Some(pid) = i32::try_from(pid)
            .ok()
            .and_then(rustix::process::Pid::from_raw)
        {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        }
    }
    // The child ends at once (or was killed): reaped before this returns.
    let deadline = std::time::Instant::now() + PROBE_TIMEOUT;
    while matches!(
        ended.try_recv(),
        Err(tokio::sync::oneshot::error::TryRecvError::Empty)
    ) && std::time::Instant::now() < deadline
    {
        reaper.reap();
        std::thread::sleep(Duration::from_millis(1));
    }
    answer
}

/// The parent's side: waits for the child's `r`eady, types `^C` and a
/// line, and reads its `y`es or `n`o.
fn probe_talk(master: &OwnedFd, answer: &OwnedFd) -> io::Result<Option<bool>> {
    let read_byte = || -> io::Result<Option<u8>> {
        let mut fds = [rustix::event::PollFd::new(
            answer,
            rustix::event::PollFlags::IN,
        )];
        let timeout = rustix::event::Timespec::try_from(PROBE_TIMEOUT)
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        if rustix::event::poll(&mut fds, Some(&timeout))? == 0 {
            return Ok(None);
        }
        let mut byte = [0u8; 1];
        match rustix::io::read(answer, &mut byte)? {
            1 => Ok(Some(byte[0])),
            _ => Ok(None),
        }
    };
    if read_byte()? != Some(b'r') {
        return Ok(None);
    }
    rustix::io::write(master.as_fd(), b"\x03probe\n")?;
    Ok(match read_byte()? {
        Some(b'y') => Some(true),
        Some(b'n') => Some(false),
        _ => None,
    })
}

/// The probe's child: leads a session on the terminal `slave`, blocks
/// SIGINT, says `r` on `answer`, reads the terminal up to a newline and
/// says whether a SIGINT is pending (`y`) or not (`n`).
///
/// # Safety
/// Only in a child just forked from a multithreaded process: it calls
/// nothing but async-signal-safe functions and never returns.
unsafe fn probe_child(slave: i32, answer: i32) -> ! {
    // SAFETY: sigset_t is plain data; sigemptyset/sigaddset/sigprocmask/
    // sigpending, setsid, ioctl, read, write and _exit are async-signal-safe
    // and get pointers to this stack frame only.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        if libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0
            || libc::setsid() < 0
            || libc::ioctl(slave, libc::TIOCSCTTY, 0) != 0
        {
            libc::_exit(1);
        }
        if libc::write(answer, b"r".as_ptr().cast(), 1) != 1 {
            libc::_exit(1);
        }
        let mut buf = [0u8; 64];
        loop {
            let n = libc::read(slave, buf.as_mut_ptr().cast(), buf.len());
            if n <= 0 {
                libc::_exit(1);
            }
            if buf[..n.unsigned_abs()].contains(&b'\n') {
                break;
            }
        }
        let mut pending: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut pending);
        let word: &[u8] = if libc::sigpending(&mut pending) == 0
            && libc::sigismember(&pending, libc::SIGINT) == 1
        {
            b"y"
        } else {
            b"n"
        };
        libc::write(answer, word.as_ptr().cast(), 1);
        libc::_exit(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEYS: Keys = Keys {
        interrupt: Some(3),
        quit: Some(0x1c),
        suspend: Some(0x1a),
    };

    #[test]
    fn keys_are_cut_out_in_order() {
        assert_eq!(split(b"ls\n", &KEYS), vec![Piece::Bytes(0..3)]);
        assert_eq!(
            split(b"ab\x03cd\x1a", &KEYS),
            vec![
                Piece::Bytes(0..2),
                Piece::Signal(libc::SIGINT),
                Piece::Bytes(3..5),
                Piece::Signal(libc::SIGTSTP),
            ]
        );
        assert_eq!(
            split(b"\x03\x1c", &KEYS),
            vec![Piece::Signal(libc::SIGINT), Piece::Signal(libc::SIGQUIT)]
        );
        assert!(split(b"", &KEYS).is_empty());
        let no_intr = Keys {
            interrupt: None,
            ..KEYS
        };
        assert_eq!(split(b"\x03", &no_intr), vec![Piece::Bytes(0..1)]);
        assert!(!no_intr.any_in(b"\x03x") && KEYS.any_in(b"x\x03"));
    }

    #[test]
    fn keys_follow_isig_and_disabled_keys() {
        use rustix::termios::{LocalModes, SpecialCodeIndex};
        let Ok(master) = rustix::pty::openpt(rustix::pty::OpenptFlags::RDWR) else {
            panic!("this test needs /dev/ptmx");
        };
        let mut termios = rustix::termios::tcgetattr(&master).expect("termios of a master");
        termios.local_modes.insert(LocalModes::ISIG);
        termios.special_codes[SpecialCodeIndex::VINTR] = 3;
        termios.special_codes[SpecialCodeIndex::VQUIT] = 0;
        let keys = Keys::of(&termios).expect("ISIG is on");
        assert_eq!((keys.interrupt, keys.quit), (Some(3), None));
        termios.local_modes.remove(LocalModes::ISIG);
        assert_eq!(Keys::of(&termios), None);
    }

    #[test]
    fn stat_lines_parse_whatever_the_name() {
        let line = "42 (a) b (c)) S 1 40 7 34816 40 4194304 0 0 0 0 1 2 0 0 20 0 1 0 9001 100 5";
        assert_eq!(
            Member::parse(line),
            Some(Member {
                pid: 42,
                group: 40,
                session: 7,
                halted: false,
                started: 9001,
            })
        );
        assert!(
            Member::parse("43 (x) T 1 43 7 0 0 0 0 0 0 0 0 0 0 0 20 0 1 0 5 1 1")
                .is_some_and(|m| m.halted)
        );
        assert_eq!(Member::parse("garbage"), None);
        assert_eq!(Member::parse("1 (x) S 1"), None);
    }

    #[test]
    fn the_guess_is_the_newest_running_group_of_the_session() {
        let member = |pid, group, session, halted, started| Member {
            pid,
            group,
            session,
            halted,
            started,
        };
        // A shell (5) alone: its own group.
        assert_eq!(guess_foreground(5, &[member(5, 5, 5, false, 10)]), 5);
        // Its foreground job (a pipeline in group 8), an older background
        // job (6) and a newer process of another session (9).
        let members = [
            member(5, 5, 5, false, 10),
            member(6, 6, 5, false, 11),
            member(8, 8, 5, false, 20),
            member(10, 8, 5, false, 21),
            member(9, 9, 9, false, 30),
        ];
        assert_eq!(guess_foreground(5, &members), 8);
        // The job stopped (^Z): the shell has the terminal again.
        let stopped = [member(5, 5, 5, false, 10), member(8, 8, 5, true, 20)];
        assert_eq!(guess_foreground(5, &stopped), 5);
        // Nothing of the session is left: its own id.
        assert_eq!(guess_foreground(5, &[]), 5);
    }

    #[test]
    fn this_kernel_sends_terminal_signals_itself() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let reaper = Arc::new(Reaper::new(false));
        // Linux's line discipline signals: the probe must see it (a probe
        // that failed would answer yes too, so ask it directly as well).
        let answer = probe(&reaper);
        assert!(matches!(answer, Ok(Some(true))), "{answer:?}");
        assert!(runtime.block_on(kernel_sends(&reaper)));
    }
}
