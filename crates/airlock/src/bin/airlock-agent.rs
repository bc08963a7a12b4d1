//! `airlock-agent`: the in-sandbox agent, PID 1 of every sandbox on every
//! tier. A binary of its own, apart from `airlock`, so that what runs inside
//! a guest holds no HTTP server, no SQLite and no CLI: it links only
//! `airlock-agent` and the protocol. The tiers find it beside the `airlock`
//! binary (or at `AIRLOCK_AGENT`), as they find a template.
//!
//! Usage (by a tier, not by people): `airlock-agent --fd N [--seccomp FILE]`,
//! where N is the descriptor of the channel to the host: 3 or above (the
//! process tier and runc place it there), or 0 (runsc hands a sandbox's
//! init only its stdio, so the gvisor tier makes its stdin the channel,
//! which survives a checkpoint and restore only through blocking threads:
//! `airlock_agent::restorable`).
//! With `--seccomp`, the agent installs the sandbox's seccomp filter (a
//! BPF program its supervisor compiled, `airlock_jail::seccomp::to_bytes`)
//! on itself before anything else, with no_new_privs, so it and every
//! process it starts run under it: the OCI tiers' way to the filter the
//! process tier's launcher installs before it execs the agent.
//!
//! Called as `sudo` (the tiers bind it over an image's `/usr/bin/sudo`),
//! the binary is that sandbox's sudo instead: `airlock_agent::sudo::shim`.

use std::mem::ManuallyDrop;
use std::os::fd::{FromRawFd, IntoRawFd, RawFd};
use std::process::ExitCode;

/// Exit code for a bad command line.
const EXIT_BAD_INPUT: u8 = 2;
/// Exit code when the agent failed.
const EXIT_INTERNAL: u8 = 125;

fn main() -> ExitCode {
    let mut args = std::env::args_os();
    // Bound over a sandbox's `/usr/bin/sudo`, this binary is its sudo.
    let called = args.next().unwrap_or_default();
    if std::path::Path::new(&called).file_name() == Some(std::ffi::OsStr::new("sudo")) {
        return airlock_agent::sudo::shim::main(args.collect());
    }
    let args: Vec<String> = args.map(|a| a.to_string_lossy().into_owned()).collect();
    let (fd, seccomp) = match args.as_slice() {
        [flag, fd] if flag == "--fd" => (fd.parse::<RawFd>().ok(), None),
        [flag, fd, filter, path] if flag == "--fd" && filter == "--seccomp" => {
            (fd.parse::<RawFd>().ok(), Some(path))
        }
        _ => (None, None),
    };
    let Some(fd) = fd.filter(|fd| *fd == 0 || *fd >= 3) else {
        eprintln!("airlock-agent: usage: airlock-agent --fd N [--seccomp FILE] (N = 0, or a descriptor above stdio)");
        return ExitCode::from(EXIT_BAD_INPUT);
    };
    if let Some(path) = seccomp {
        if let Err(e) = confine(path) {
            eprintln!("airlock-agent: cannot install the seccomp filter from {path}: {e}");
            return ExitCode::from(EXIT_INTERNAL);
        }
    }
    // Before any thread starts (the bounding set is per thread). Where it
    // cannot be narrowed, each command drops the whole set itself.
    let _ = airlock_agent::narrow_bounding_set();
    let on_stdin = fd == 0;
    let fd = if on_stdin {
        match channel_off_stdin() {
            Ok(fd) => fd,
            Err(e) => {
                eprintln!("airlock-agent: cannot take the channel off stdin: {e}");
                return ExitCode::from(EXIT_INTERNAL);
            }
        }
    } else {
        fd
    };
    // SAFETY: the tier placed the host channel on `fd` (or it was moved
    // there from stdin above) and nothing else in this process owns it.
    let channel = unsafe { std::os::unix::net::UnixStream::from_raw_fd(fd) };
    // On stdin, the channel is gVisor's, whose sandboxes may be
    // checkpointed and restored: it is served through blocking threads
    // (see `airlock_agent::restorable`).
    let channel = if on_stdin {
        match airlock_agent::restorable::through_threads(channel) {
            Ok(threaded) => airlock_agent::Channel::from(threaded),
            Err(e) => {
                eprintln!("airlock-agent: cannot set up the channel's threads: {e}");
                return ExitCode::from(EXIT_INTERNAL);
            }
        }
    } else {
        airlock_agent::Channel::from(channel)
    };
    let config = airlock_agent::AgentConfig {
        keepalive: std::time::Duration::from_secs(10),
        drop_privileges: true,
        user_home: "/home/user".into(),
        root_home: "/root".into(),
        // Granted where the sandbox's image ships sudo (the tiers bind this
        // binary over it); see `airlock_agent::sudo`.
        sudo_socket: std::path::Path::new(airlock_agent::sudo::SUDO_PATH)
            .is_file()
            .then(|| airlock_agent::sudo::SOCKET_NAME.to_owned()),
    };
    match airlock_agent::serve(config, channel) {
        Ok(()) => ExitCode::SUCCESS,
        Err(_) => ExitCode::from(EXIT_INTERNAL),
    }
}

/// Sets no_new_privs and installs the filter in `path` on this (still
/// single-threaded) process.
fn confine(path: &str) -> Result<(), String> {
    let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
    let program = airlock_jail::seccomp::from_bytes(&bytes).map_err(|e| e.to_string())?;
    rustix::thread::set_no_new_privs(true).map_err(|e| e.to_string())?;
    airlock_jail::seccomp::install(&program).map_err(|e| e.to_string())
}

/// Moves the channel from stdin to a descriptor above stdio (close-on-exec,
/// so no process the agent starts inherits it) and puts `/dev/null` on
/// stdin and stdout, so nothing written there can reach the channel.
fn channel_off_stdin() -> std::io::Result<RawFd> {
    use rustix::io::{dup2, fcntl_dupfd_cloexec};
    // SAFETY: fd 0 is open for the whole life of this process (the runtime
    // gave it to us); the borrow ends before it is replaced below.
    let stdin = unsafe { rustix::fd::BorrowedFd::borrow_raw(0) };
    let moved = fcntl_dupfd_cloexec(stdin, 3)?;
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")?;
    for target in [0, 1] {
        // SAFETY: fds 0 and 1 are this process's stdio; replacing them with
        // /dev/null leaves no other owner of the old descriptions here.
        let mut target = ManuallyDrop::new(unsafe { rustix::fd::OwnedFd::from_raw_fd(target) });
        dup2(&null, &mut target)?;
    }
    Ok(moved.into_raw_fd())
}
