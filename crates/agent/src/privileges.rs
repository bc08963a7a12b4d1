//! What a child does between `fork` and `exec`.
//!
//! Everything is computed before the fork into a [`ChildSetup`]; its
//! [`ChildSetup::apply`] runs in the forked child and only makes raw system
//! calls on those precomputed values (no allocation, no locks), so it is
//! async-signal-safe. The order is:
//!
//! 1. `setsid()`: the child leads a new session and process group, so the
//!    agent can signal or kill the whole group as `-pid`. A child started on
//!    a terminal then makes it its controlling terminal (`TIOCSCTTY` on
//!    stdin, the terminal's slave side), which only a session leader without
//!    one may do: so it comes right after `setsid`.
//! 2. rlimits: `NOFILE` and `FSIZE` (soft = hard), `CORE` = 0.
//! 3. identity (only when dropping privileges): first the bounding set
//!    loses what the identity must not keep (this needs `CAP_SETPCAP`, so
//!    it comes before the uid switch; once the agent has narrowed its own
//!    set to [`ROOT_KEEP`], [`narrow_bounding_set`], a `Root` child drops
//!    nothing more and a `User` child only those), then:
//!    - `User`: `setgroups([1000])`, `setresgid(1000 x3)`,
//!      `setresuid(1000 x3)`, clear the ambient set, `capset` all zero.
//!    - `Root`: `setgroups([0])`, `setresgid/setresuid(0 x3)`, `capset`
//!      effective = permitted = [`ROOT_KEEP`], inheritable = 0, clear the
//!      ambient set.
//! 4. `chdir` to the working directory, as the new identity (so a user cannot
//!    start inside a directory it could not enter).
//! 5. `close_range(3, ~0, CLOSE_RANGE_CLOEXEC)`: every inherited descriptor
//!    past stdio closes at exec. Marked close-on-exec rather than closed:
//!    the descriptors stay the agent's (the child shares nothing but its
//!    table's copy, yet marking is as cheap and leaves nothing to order).
//!
//! The child runs this between `clone(CLONE_VM | CLONE_VFORK)` and `execve`
//! (see `crate::spawn`): only raw system calls, the thread-local
//! credential calls (never glibc's process-wide `setuid`), no allocation.

use airlock_protocol::{Identity, ProcessLimits};
use rustix::io::Errno;
use rustix::process::{Gid, Resource, Rlimit, Uid};
use rustix::thread::{CapabilitySet, CapabilitySets};
use std::ffi::CString;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

/// uid and gid of `Identity::User`.
pub(crate) const USER_ID: u32 = 1000;

/// Capabilities a process started as `Identity::Root` keeps.
pub(crate) const ROOT_KEEP: CapabilitySet = CapabilitySet::CHOWN
    .union(CapabilitySet::DAC_OVERRIDE)
    .union(CapabilitySet::FOWNER)
    .union(CapabilitySet::FSETID)
    .union(CapabilitySet::KILL)
    .union(CapabilitySet::SETGID)
    .union(CapabilitySet::SETUID)
    .union(CapabilitySet::NET_BIND_SERVICE);

/// Which identity switch the child makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Switch {
    /// Run as the agent's own user (tests).
    Keep,
    /// uid/gid 1000, no capabilities.
    User,
    /// uid 0 of the namespace with [`ROOT_KEEP`].
    Root,
}

/// Everything a child needs between `fork` and `exec`, computed beforehand.
#[derive(Debug)]
pub(crate) struct ChildSetup {
    nofile: Option<u64>,
    fsize: Option<u64>,
    switch: Switch,
    cwd: CString,
    /// Stdin is a terminal to make the controlling terminal of the session.
    controlling_terminal: bool,
    /// Upper bound of descriptors to mark by hand when `close_range` is
    /// missing (kernels before 5.11).
    fd_scan_end: i32,
    /// What the switch removes from the bounding set (less, once the agent
    /// has narrowed its own: [`narrow_bounding_set`]).
    bounding_drop: CapabilitySet,
    /// The signals whose disposition is not the default in the agent.
    signals: &'static [i32],
}

/// Set once the agent's bounding set holds no more than [`ROOT_KEEP`], in
/// every thread it has (it was narrowed before the first one started).
static BOUNDING_NARROWED: AtomicBool = AtomicBool::new(false);

/// Narrows the agent's capability bounding set to [`ROOT_KEEP`]: no
/// process it starts, as root or not, can ever hold another capability,
/// and a child then drops only what its identity must not keep (the
/// bounding set is per thread: a few `prctl`s per command instead of one
/// per capability, each tens of microseconds under gVisor's ptrace
/// platform). The agent's own capabilities stay as they are. Call it
/// before any thread is started: with another thread running, it changes
/// nothing and says so.
pub fn narrow_bounding_set() -> io::Result<()> {
    let threads = std::fs::read_dir("/proc/self/task")?.count();
    if threads != 1 {
        return Err(io::Error::other(format!(
            "the agent runs {threads} threads; the bounding set is per thread, so it is narrowed only before the first starts"
        )));
    }
    drop_bounding_set(all_but(ROOT_KEEP))?;
    BOUNDING_NARROWED.store(true, Ordering::SeqCst);
    Ok(())
}

/// Every capability but `keep`.
fn all_but(keep: CapabilitySet) -> CapabilitySet {
    CapabilitySet::from_bits_retain(!keep.bits())
}

/// The signals a child resets to their default before it execs: those the
/// agent catches or ignores, read once (at its first command, after it
/// set up its own). A handler installed after that would be reset by
/// `execve` anyway; these are reset before the child unblocks signals, so
/// none of the agent's handlers runs in a child, and an ignored signal (a
/// daemon started under `nohup` ignores SIGHUP, and its sandboxes' init
/// inherited that) does not stay ignored in the command.
fn signals_to_reset() -> &'static [i32] {
    static SIGNALS: OnceLock<Vec<i32>> = OnceLock::new();
    SIGNALS.get_or_init(not_at_default)
}

/// The agent's own signals, whatever their state, and every other signal
/// whose disposition is not the default now.
fn not_at_default() -> Vec<i32> {
    let mut signals = vec![libc::SIGPIPE, libc::SIGCHLD, libc::SIGTERM, libc::SIGINT];
    for signal in 1..libc::SIGRTMIN() {
        if signal == libc::SIGKILL || signal == libc::SIGSTOP || signals.contains(&signal) {
            continue;
        }
        let mut old = std::mem::MaybeUninit::<libc::sigaction>::zeroed();
        // SAFETY: with a null new action, sigaction only writes the
        // current one into `old`, which lives across the call.
        let read = unsafe { libc::sigaction(signal, std::ptr::null(), old.as_mut_ptr()) };
        // SAFETY: zeroed is a valid sigaction, and on success it was
        // filled in.
        let handler = unsafe { old.assume_init() }.sa_sigaction;
        // A signal whose disposition cannot be read is reset.
        if read != 0 || handler != libc::SIG_DFL {
            signals.push(signal);
        }
    }
    signals
}

/// What a child of `switch` removes from its bounding set, given whether
/// the agent's own was narrowed to [`ROOT_KEEP`].
fn bounding_drop(switch: Switch, narrowed: bool) -> CapabilitySet {
    match (switch, narrowed) {
        (Switch::Keep, _) | (Switch::Root, true) => CapabilitySet::empty(),
        (Switch::Root, false) => all_but(ROOT_KEEP),
        (Switch::User, true) => ROOT_KEEP,
        (Switch::User, false) => all_but(CapabilitySet::empty()),
    }
}

impl ChildSetup {
    /// Plans the setup of a child. Limits above the agent's own hard limits
    /// are lowered to them: raising a hard limit needs `CAP_SYS_RESOURCE` in
    /// the initial user namespace, which the agent never has in a sandbox, and
    /// a lower limit is only stricter.
    pub(crate) fn new(
        limits: &ProcessLimits,
        identity: Identity,
        drop_privileges: bool,
        cwd: CString,
    ) -> ChildSetup {
        let switch = match (drop_privileges, identity) {
            (false, _) => Switch::Keep,
            (true, Identity::User) => Switch::User,
            (true, Identity::Root) => Switch::Root,
        };
        let open_limit = rustix::process::getrlimit(Resource::Nofile)
            .current
            .unwrap_or(u64::MAX);
        ChildSetup {
            nofile: clamp(Resource::Nofile, limits.nofile),
            fsize: clamp(Resource::Fsize, limits.fsize_bytes),
            switch,
            cwd,
            controlling_terminal: false,
            fd_scan_end: i32::try_from(open_limit.min(1 << 16)).unwrap_or(1 << 16),
            bounding_drop: bounding_drop(switch, BOUNDING_NARROWED.load(Ordering::SeqCst)),
            signals: signals_to_reset(),
        }
    }

    /// The same setup for a child whose stdin is the slave side of a
    /// terminal, which becomes its controlling terminal.
    pub(crate) fn on_terminal(mut self) -> ChildSetup {
        self.controlling_terminal = true;
        self
    }

    /// Runs in the forked child, before `exec`. Async-signal-safe: only raw
    /// system calls on values computed before the fork.
    pub(crate) fn apply(&self) -> io::Result<()> {
        // A command starts with every signal at its default, as from a
        // login, so a terminal's hangup ends it (see `signals_to_reset`).
        for &signal in self.signals {
            // SAFETY: signal(2) with SIG_DFL installs no handler and reads
            // no memory of ours; a number it does not take gives EINVAL,
            // which is ignored.
            unsafe {
                libc::signal(signal, libc::SIG_DFL);
            }
        }
        // Not rustix's `setsid`: it takes the result for a non-zero pid, and
        // gVisor's kernel (2022 releases) answers 0 for success.
        // SAFETY: setsid takes no arguments and touches no memory of ours.
        if unsafe { libc::setsid() } < 0 {
            return Err(io::Error::last_os_error());
        }
        if self.controlling_terminal {
            // std has already put the slave on descriptors 0, 1 and 2.
            rustix::process::ioctl_tiocsctty(rustix::stdio::stdin())?;
        }
        rustix::process::setrlimit(
            Resource::Nofile,
            Rlimit {
                current: self.nofile,
                maximum: self.nofile,
            },
        )?;
        rustix::process::setrlimit(
            Resource::Fsize,
            Rlimit {
                current: self.fsize,
                maximum: self.fsize,
            },
        )?;
        rustix::process::setrlimit(
            Resource::Core,
            Rlimit {
                current: Some(0),
                maximum: Some(0),
            },
        )?;
        drop_bounding_set(self.bounding_drop)?;
        match self.switch {
            Switch::Keep => {}
            Switch::User => become_user()?,
            Switch::Root => become_root()?,
        }
        rustix::process::chdir(self.cwd.as_c_str())?;
        mark_inherited_cloexec(self.fd_scan_end);
        Ok(())
    }
}

/// `requested`, lowered to the agent's hard limit; `None` means unlimited.
fn clamp(resource: Resource, requested: u64) -> Option<u64> {
    let value = match rustix::process::getrlimit(resource).maximum {
        Some(hard) => requested.min(hard),
        None => requested,
    };
    (value != u64::MAX).then_some(value)
}

/// Drops the capabilities in `drop` from the bounding set (this needs
/// `CAP_SETPCAP`, so it comes before a uid switch).
fn drop_bounding_set(drop: CapabilitySet) -> io::Result<()> {
    for bit in 0..64u32 {
        let capability = CapabilitySet::from_bits_retain(1u64 << bit);
        if !drop.contains(capability) {
            continue;
        }
        match rustix::thread::remove_capability_from_bounding_set(capability) {
            Ok(()) => {}
            // EINVAL: past the last capability this kernel knows; the
            // numbers are dense, so none after it is known either.
            Err(Errno::INVAL) => break,
            Err(errno) => return Err(errno.into()),
        }
    }
    Ok(())
}

/// Clears the ambient set; kernels without ambient capabilities say EINVAL.
fn clear_ambient() -> io::Result<()> {
    match rustix::thread::clear_ambient_capability_set() {
        Ok(()) | Err(Errno::INVAL) => Ok(()),
        Err(errno) => Err(errno.into()),
    }
}

fn become_user() -> io::Result<()> {
    let gid = Gid::from_raw_unchecked(USER_ID);
    let uid = Uid::from_raw_unchecked(USER_ID);
    rustix::thread::set_thread_groups(&[gid])?;
    rustix::thread::set_thread_res_gid(gid, gid, gid)?;
    rustix::thread::set_thread_res_uid(uid, uid, uid)?;
    clear_ambient()?;
    rustix::thread::set_capabilities(
        None,
        CapabilitySets {
            effective: CapabilitySet::empty(),
            permitted: CapabilitySet::empty(),
            inheritable: CapabilitySet::empty(),
        },
    )?;
    Ok(())
}

fn become_root() -> io::Result<()> {
    rustix::thread::set_thread_groups(&[Gid::ROOT])?;
    rustix::thread::set_thread_res_gid(Gid::ROOT, Gid::ROOT, Gid::ROOT)?;
    rustix::thread::set_thread_res_uid(Uid::ROOT, Uid::ROOT, Uid::ROOT)?;
    rustix::thread::set_capabilities(
        None,
        CapabilitySets {
            effective: ROOT_KEEP,
            permitted: ROOT_KEEP,
            inheritable: CapabilitySet::empty(),
        },
    )?;
    clear_ambient()?;
    Ok(())
}

/// Marks every descriptor from 3 up close-on-exec.
fn mark_inherited_cloexec(fd_scan_end: i32) {
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC only sets the close-on-exec
    // flag on descriptors of this process; it reads and writes no memory of
    // ours, and a raw system call is async-signal-safe.
    let marked = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            libc::c_long::from(3u32),
            libc::c_long::from(u32::MAX),
            libc::c_long::from(libc::CLOSE_RANGE_CLOEXEC),
        )
    } == 0;
    if marked || mark_listed_cloexec() {
        return;
    }
    for fd in 3..fd_scan_end {
        // SAFETY: F_SETFD takes an integer argument and touches no memory;
        // a descriptor number that is not open just gives EBADF.
        unsafe {
            libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
        }
    }
}

/// Marks close-on-exec every descriptor from 3 up that `/proc/self/fd`
/// lists (where `close_range` is missing: gVisor's 2022 kernel). One pass
/// over the open descriptors instead of one call per possible descriptor:
/// under gVisor's ptrace platform each call costs tens of microseconds, so
/// a scan up to a limit of 20,000 cost 0.7 s per process started.
/// Async-signal-safe: raw system calls and a buffer on the stack. False
/// when the listing cannot be read.
fn mark_listed_cloexec() -> bool {
    // SAFETY: a NUL-terminated literal path; the result is checked.
    let dir = unsafe {
        libc::open(
            c"/proc/self/fd".as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if dir < 0 {
        return false;
    }
    let mut buf = [0u8; 4096];
    let complete = loop {
        // SAFETY: getdents64 writes at most `buf.len()` bytes into `buf`,
        // which lives across the call.
        let read = unsafe {
            libc::syscall(
                libc::SYS_getdents64,
                libc::c_long::from(dir),
                buf.as_mut_ptr(),
                buf.len(),
            )
        };
        let Ok(read) = usize::try_from(read) else {
            break false;
        };
        if read == 0 {
            break true;
        }
        for fd in listed_descriptors(&buf[..read.min(buf.len())]) {
            if fd >= 3 && fd != dir {
                // SAFETY: as in `mark_inherited_cloexec`.
                unsafe {
                    libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
                }
            }
        }
    };
    // SAFETY: `dir` is ours and closed once.
    unsafe {
        libc::close(dir);
    }
    complete
}

/// The descriptor numbers named by the `linux_dirent64` records in `buf`
/// (`d_reclen` at byte 16, the NUL-terminated name from byte 19); names
/// that are not numbers (`.`, `..`) are skipped. Allocates nothing.
fn listed_descriptors(buf: &[u8]) -> impl Iterator<Item = i32> + '_ {
    let mut at = 0usize;
    std::iter::from_fn(move || loop {
        let record = buf.get(at..)?;
        let reclen = usize::from(u16::from_ne_bytes([*record.get(16)?, *record.get(17)?]));
        if reclen == 0 {
            return None;
        }
        at += reclen;
        let name = record.get(19..reclen.min(record.len()))?;
        let mut fd: i32 = 0;
        let mut digits = 0;
        for &b in name.iter().take_while(|b| **b != 0) {
            if !b.is_ascii_digit() {
                digits = 0;
                break;
            }
            fd = fd.saturating_mul(10).saturating_add(i32::from(b - b'0'));
            digits += 1;
        }
        if digits > 0 {
            return Some(fd);
        }
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn the_descriptor_listing_is_read_whole() {
        use std::os::fd::AsRawFd;
        let file = std::fs::File::open("/proc/self/status").unwrap();
        let dir = std::fs::File::open("/proc/self/fd").unwrap();
        let mut buf = [0u8; 4096];
        // SAFETY: as in `mark_listed_cloexec`.
        let read = unsafe {
            libc::syscall(
                libc::SYS_getdents64,
                libc::c_long::from(dir.as_raw_fd()),
                buf.as_mut_ptr(),
                buf.len(),
            )
        };
        let listed: Vec<i32> = listed_descriptors(&buf[..usize::try_from(read).unwrap()]).collect();
        for fd in [0, 1, 2, file.as_raw_fd(), dir.as_raw_fd()] {
            assert!(listed.contains(&fd), "{fd} missing from {listed:?}");
        }
        assert!(listed.iter().all(|fd| *fd >= 0));
        assert_eq!(listed_descriptors(&[]).count(), 0);
        assert_eq!(
            listed_descriptors(&[0u8; 40]).count(),
            0,
            "a zero record length ends it"
        );
    }

    #[test]
    fn root_keeps_exactly_eight_capabilities() {
        assert_eq!(ROOT_KEEP.bits().count_ones(), 8);
        assert!(ROOT_KEEP.contains(CapabilitySet::NET_BIND_SERVICE));
        assert!(!ROOT_KEEP.contains(CapabilitySet::SYS_ADMIN));
        assert!(!ROOT_KEEP.contains(CapabilitySet::SETPCAP));
    }

    #[test]
    fn a_child_ends_with_its_identitys_bounding_set_narrowed_or_not() {
        // What the child keeps: the agent's set (all, or ROOT_KEEP once
        // narrowed) less what it drops.
        for narrowed in [false, true] {
            let agent = if narrowed {
                ROOT_KEEP
            } else {
                all_but(CapabilitySet::empty())
            };
            let kept = |switch| agent.difference(bounding_drop(switch, narrowed));
            assert_eq!(kept(Switch::Root), ROOT_KEEP, "narrowed: {narrowed}");
            assert_eq!(
                kept(Switch::User),
                CapabilitySet::empty(),
                "narrowed: {narrowed}"
            );
            assert_eq!(kept(Switch::Keep), agent, "narrowed: {narrowed}");
        }
    }

    #[test]
    fn every_signal_off_its_default_is_reset() {
        let set = |handler| {
            // SAFETY: SIGUSR2 is no one's in this test binary; SIG_IGN and
            // SIG_DFL install no handler.
            unsafe { libc::signal(libc::SIGUSR2, handler) };
        };
        set(libc::SIG_IGN);
        let ignored = not_at_default();
        set(libc::SIG_DFL);
        let default = not_at_default();
        assert!(ignored.contains(&libc::SIGUSR2), "{ignored:?}");
        assert!(!default.contains(&libc::SIGUSR2), "{default:?}");
        for own in [libc::SIGPIPE, libc::SIGCHLD, libc::SIGTERM, libc::SIGINT] {
            assert!(default.contains(&own), "{own} missing from {default:?}");
        }
        assert!(!default.contains(&libc::SIGKILL) && !default.contains(&libc::SIGSTOP));
    }

    #[test]
    fn limits_are_clamped_to_the_hard_limit() {
        let limits = ProcessLimits {
            nofile: u64::MAX - 1,
            fsize_bytes: 4096,
        };
        let setup = ChildSetup::new(&limits, Identity::User, false, CString::new("/").unwrap());
        let hard = rustix::process::getrlimit(Resource::Nofile).maximum;
        match hard {
            Some(hard) => assert_eq!(setup.nofile, Some(hard.min(u64::MAX - 1))),
            None => assert_eq!(setup.nofile, Some(u64::MAX - 1)),
        }
        assert_eq!(setup.fsize, Some(4096));
        assert_eq!(setup.switch, Switch::Keep);
    }
}
