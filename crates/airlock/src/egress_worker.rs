//! `airlock egress-worker`: the confined process that serves every
//! sandbox's egress path (see `airlock_egress::worker`).
//!
//! The daemon (or `airlock run`) starts it as the unprivileged
//! [`EGRESS_WORKER_ID`] with its channel on stdin. Once it has read its
//! configuration and built its resolver it confines itself, before any
//! thread exists, so every thread it makes inherits it:
//!
//! 1. it refuses to go on as root or with any capability;
//! 2. it becomes non-dumpable (no ptrace or /proc peeking by its own uid);
//! 3. `no_new_privs`;
//! 4. Landlock takes every filesystem right (no file can be opened, read,
//!    written or executed);
//! 5. seccomp: the sandbox's deny table plus the worker's own
//!    (`airlock_jail::seccomp::WORKER_RULES`: no exec, no open, no kill, no
//!    sockets but TCP and UDP).
//!
//! [`EGRESS_WORKER_ID`]: airlock_jail::runtime::EGRESS_WORKER_ID

use airlock_jail::runtime::EGRESS_WORKER_ID;
use std::os::fd::AsFd;
use std::process::ExitCode;

/// How the daemon and `airlock run` start the worker: the `airlock`
/// binary (`exe`), as
/// [`EGRESS_WORKER_ID`].
pub fn spawn(exe: std::path::PathBuf) -> airlock_egress::WorkerSpawn {
    airlock_egress::WorkerSpawn {
        program: exe,
        args: vec!["egress-worker".into()],
        uid: EGRESS_WORKER_ID,
        gid: EGRESS_WORKER_ID,
    }
}

pub fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("AIRLOCK_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let channel = match std::io::stdin().as_fd().try_clone_to_owned() {
        Ok(channel) => channel,
        Err(e) => {
            eprintln!("airlock egress-worker: error: no channel on stdin: {e}");
            return ExitCode::from(crate::EXIT_BAD_INPUT);
        }
    };
    match airlock_egress::serve_worker(channel, confine) {
        Ok(()) => ExitCode::SUCCESS,
        // The daemon went away: nothing left to serve.
        Err(airlock_egress::WorkerError::Closed) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("airlock egress-worker: error: {}", crate::error_chain(&e));
            ExitCode::from(crate::EXIT_INTERNAL)
        }
    }
}

/// Steps 1–5 of the module docs.
fn confine() -> Result<(), String> {
    if rustix::process::getuid().is_root() || rustix::process::geteuid().is_root() {
        return Err("it must not run as root".into());
    }
    let caps = std::fs::read_to_string("/proc/self/status")
        .map_err(|e| format!("cannot read its own status: {e}"))?;
    let held = caps
        .lines()
        .filter(|l| {
            l.starts_with("CapEff:") || l.starts_with("CapPrm:") || l.starts_with("CapAmb:")
        })
        .any(|l| {
            l.split_whitespace()
                .nth(1)
                .is_some_and(|v| !v.trim_start_matches('0').is_empty())
        });
    if held {
        return Err("it must hold no capability".into());
    }
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
        .map_err(|e| format!("cannot become non-dumpable: {e}"))?;
    rustix::thread::set_no_new_privs(true).map_err(|e| format!("cannot set no_new_privs: {e}"))?;
    airlock_jail::landlock::forbid_filesystem()
        .map_err(|e| format!("cannot take its filesystem rights: {e}"))?;
    let filter = airlock_jail::seccomp::worker_filter()
        .map_err(|e| format!("cannot build its syscall filter: {e}"))?;
    airlock_jail::seccomp::install(&filter)
        .map_err(|e| format!("cannot install its syscall filter: {e}"))?;
    Ok(())
}
