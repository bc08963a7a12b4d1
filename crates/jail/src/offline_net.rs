//! The network namespace of a sandbox whose network policy is `none`:
//! loopback only, made *beside* the sandbox's setup rather than in its
//! clone.
//!
//! Making a network namespace is the dearest part of a launch (about
//! 0.45 ms here: every per-namespace subsystem of the kernel registers its
//! tables and the loopback device), and done by the clone it sits on the
//! critical path, before the sandbox init can build its root. Instead, the
//! launcher clones the init without `CLONE_NEWNET` and forks this short
//! helper, which
//!
//! 1. joins the init's user namespace, so the new namespace belongs to the
//!    sandbox exactly as one made by its clone would (its root may
//!    configure its own loopback, nothing else's),
//! 2. unshares a network namespace and brings `lo` up,
//! 3. sends the namespace to the init over a socket and exits.
//!
//! The init, once its root is built, moves into that namespace with
//! `setns` before it runs anything of the sandbox: the agent is exec'd in
//! it, so no process of the sandbox ever sees the launcher's network. If
//! the helper fails, the init gets no namespace, fails its setup and never
//! execs; the launcher reports the helper's error.

use rustix::fd::{AsFd, OwnedFd};
use rustix::thread::{LinkNameSpaceType, UnshareFlags};
use std::fs;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::net::UnixStream;

/// A helper making a sandbox's network namespace; reaped by
/// [`NamespaceMaker::finish`] (or, on an early return, when dropped).
#[derive(Debug)]
pub(crate) struct NamespaceMaker {
    pid: i32,
    reaped: bool,
}

impl NamespaceMaker {
    /// Forks the helper for the sandbox whose init is `init` (host pid,
    /// its id maps already written); the namespace goes down `channel`.
    /// Must be called from a single-threaded process.
    pub(crate) fn start(init: i32, channel: UnixStream) -> io::Result<NamespaceMaker> {
        // SAFETY: the caller is single-threaded (this function's
        // contract); the child only runs `helper`, which `_exit`s.
        let pid = unsafe { crate::launch::fork_with(0) }?;
        if pid == 0 {
            helper(init, &channel);
        }
        Ok(NamespaceMaker { pid, reaped: false })
    }

    /// Waits for the helper; an error is why it made no namespace.
    pub(crate) fn finish(mut self) -> io::Result<()> {
        let status = self.reap()?;
        if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 {
            Ok(())
        } else if libc::WIFEXITED(status) {
            Err(io::Error::from_raw_os_error(libc::WEXITSTATUS(status)))
        } else {
            Err(io::Error::other(format!(
                "the helper died of signal {}",
                libc::WTERMSIG(status)
            )))
        }
    }

    fn reap(&mut self) -> io::Result<libc::c_int> {
        let mut status = 0;
        loop {
            // SAFETY: waitpid on our own child, writing into a local.
            let rc = unsafe { libc::waitpid(self.pid, &mut status, 0) };
            if rc == self.pid {
                self.reaped = true;
                return Ok(status);
            }
            let error = io::Error::last_os_error();
            if error.kind() != io::ErrorKind::Interrupted {
                self.reaped = true;
                return Err(error);
            }
        }
    }
}

impl Drop for NamespaceMaker {
    fn drop(&mut self) {
        if !self.reaped {
            // It only makes a namespace and exits: a short wait.
            let _ = self.reap();
        }
    }
}

/// The helper process: makes the namespace, sends it, and exits with 0 or
/// the errno of the step that failed.
fn helper(init: i32, channel: &UnixStream) -> ! {
    let code = match make(init, channel) {
        Ok(()) => 0,
        Err(error) => error
            .raw_os_error()
            .filter(|errno| (1..=255).contains(errno))
            .unwrap_or(libc::EIO),
    };
    // SAFETY: _exit ends this forked copy at once, running none of the
    // launcher's destructors or atexit handlers.
    unsafe { libc::_exit(code) }
}

fn make(init: i32, channel: &UnixStream) -> io::Result<()> {
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))?;
    let userns = fs::File::open(format!("/proc/{init}/ns/user"))?;
    rustix::thread::move_into_link_name_space(userns.as_fd(), Some(LinkNameSpaceType::User))?;
    // SAFETY: unshare(2) only changes this process's namespace membership.
    unsafe { rustix::thread::unshare_unsafe(UnshareFlags::NEWNET) }?;
    loopback_up()?;
    let netns = fs::File::open("/proc/thread-self/ns/net")?;
    let fds = [netns.as_fd()];
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = rustix::net::SendAncillaryBuffer::new(&mut space);
    if !control.push(rustix::net::SendAncillaryMessage::ScmRights(&fds)) {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    match rustix::net::sendmsg(
        channel,
        &[io::IoSlice::new(b"n")],
        &mut control,
        rustix::net::SendFlags::NOSIGNAL,
    ) {
        // The init is gone (its setup failed): its own error explains.
        Ok(_) | Err(rustix::io::Errno::PIPE | rustix::io::Errno::CONNRESET) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The init's side: waits for the namespace and moves into it.
pub(crate) fn enter(channel: &OwnedFd) -> Result<(), String> {
    let what = "wait for the network namespace";
    let netns = crate::launch::receive_fds(channel, what)?
        .into_iter()
        .next()
        .ok_or_else(|| format!("{what}: none was made"))?;
    rustix::thread::move_into_link_name_space(netns.as_fd(), Some(LinkNameSpaceType::Network))
        .map_err(|e| format!("enter the network namespace: {e}"))
}

/// Sets IFF_UP on `lo`, the only interface of the namespace.
fn loopback_up() -> io::Result<()> {
    // SAFETY: socket(2) returns a new descriptor or -1; ownership is taken
    // right away so it is closed on every path.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a fresh descriptor that nothing else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut request: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in request.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS reads the flags of the interface named in
    // `request` into `request`, which is a valid, writable ifreq.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut request) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the union member `ifru_flags` was just filled by the kernel.
    unsafe {
        request.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    }
    // SAFETY: SIOCSIFFLAGS reads `request`, a valid ifreq naming `lo`.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &request) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
