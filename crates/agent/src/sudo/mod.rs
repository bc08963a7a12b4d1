//! `sudo` inside a sandbox, granted by the agent instead of a set-uid bit.
//!
//! Every process in a sandbox runs with `no_new_privs`, and set-id bits are
//! stripped from templates, so the real `sudo` cannot raise anything. Yet
//! the templates airlock ships (and e2b's, whose SDK examples rely on it)
//! give `user` passwordless `sudo`. So the agent grants it itself:
//!
//! - Where a sandbox's image has `/usr/bin/sudo`, the tiers bind the agent
//!   binary read-only over it (`airlock_jail::rootfs::SetupOp::CoverFile`);
//!   run as `sudo`, the binary is the [`shim`]: it parses sudo's command
//!   line and asks the agent to start the command.
//! - The agent, when it finds `/usr/bin/sudo` at start, listens on an
//!   abstract `SOCK_SEQPACKET` socket ([`SOCKET_NAME`]). Abstract names live
//!   in the network namespace, which is the sandbox's own on every tier.
//!   A request names the program, its arguments, environment, working
//!   directory, identity (root or `user`, the two every tier has) and
//!   limits, and carries the caller's stdin, stdout and stderr as
//!   descriptors; the agent starts the command on them exactly as it
//!   starts a command for the host (same limits, capabilities, seccomp
//!   filter and Landlock domain: the sandbox's root, never more), forwards
//!   the signals the shim relays (a terminal's Ctrl-C reaches the shim's
//!   process group), and answers how it ended. A shim that goes away while
//!   its command runs takes the command's process group with it.
//!
//! Why this grants nothing new: a sandbox's root is what every API client
//! already gets with `user: root`; the boundary airlock defends is the
//! sandbox's, which sudo does not cross. A template without `sudo` gets no
//! socket: there, `user` stays `user`.

pub mod shim;
mod wire;

#[cfg(feature = "fuzzing")]
pub use wire::fuzzing;

use crate::privileges::ChildSetup;
use crate::reaper::{Ended, Reaper};
use crate::{locked, AgentConfig};
use airlock_protocol::{Identity, ProcessLimits};
use std::collections::HashSet;
use std::ffi::CString;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::{Arc, Mutex};
use tokio::io::unix::AsyncFd;
use tokio::sync::Semaphore;
use wire::{Ask, Reply, Tell};

pub use wire::SOCKET_NAME;

/// Where a template keeps the program the shim covers.
pub const SUDO_PATH: &str = "/usr/bin/sudo";

/// Callers served at once (asking or running); more wait for a slot.
const MAX_RUNNING: usize = 256;

/// The agent's side: a listener and the commands it started.
pub(crate) struct Sudo {
    config: Arc<AgentConfig>,
    reaper: Arc<Reaper>,
    running: Mutex<HashSet<u32>>,
    slots: Semaphore,
}

impl Sudo {
    /// Listens on `name` (abstract). `Ok(None)` when the sandbox's image
    /// has no sudo to cover.
    pub(crate) fn listen(
        name: &str,
        config: Arc<AgentConfig>,
        reaper: Arc<Reaper>,
    ) -> std::io::Result<(Arc<Sudo>, AsyncFd<OwnedFd>)> {
        let listener = wire::listen(name)?;
        let sudo = Arc::new(Sudo {
            config,
            reaper,
            running: Mutex::new(HashSet::new()),
            slots: Semaphore::new(MAX_RUNNING),
        });
        Ok((sudo, wire::register(listener)?))
    }

    /// Accepts and serves callers until the task is dropped.
    pub(crate) async fn serve(self: Arc<Self>, listener: AsyncFd<OwnedFd>) {
        loop {
            let conn = match wire::accept(&listener).await {
                Ok(conn) => conn,
                // EMFILE and the like: wait a little rather than spin.
                Err(_) => {
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            };
            let this = Arc::clone(&self);
            tokio::spawn(async move { this.handle(conn).await });
        }
    }

    /// Kills every command still running (the session is ending).
    pub(crate) fn kill_all(&self) {
        for pid in locked(&self.running).drain() {
            let _ = crate::process::kill_group(pid, libc::SIGKILL);
        }
    }

    async fn handle(&self, conn: OwnedFd) {
        let Ok(conn) = wire::register(conn) else {
            return;
        };
        // A caller outside the sandbox's pid namespace shows as pid 0: the
        // socket is the sandbox's alone.
        match wire::peer(conn.get_ref().as_fd()) {
            Ok((pid, _uid)) if pid > 0 => {}
            _ => return,
        }
        // A slot before anything is read: callers that send nothing hold
        // no buffer, and at most MAX_RUNNING of them wait at once.
        let Ok(_slot) = self.slots.acquire().await else {
            return;
        };
        let (ask, stdio) = match wire::receive_ask(&conn).await {
            Ok(received) => received,
            Err(refusal) => {
                let _ = wire::send(&conn, &Reply::Refused { message: refusal }).await;
                return;
            }
        };
        let pid = match self.start(&ask, &stdio) {
            Ok(pid) => pid,
            Err(message) => {
                let _ = wire::send(&conn, &Reply::Refused { message }).await;
                return;
            }
        };
        drop(stdio);
        let mut ended = self.reaper.register(pid);
        locked(&self.running).insert(pid);
        let _ = wire::send(&conn, &Reply::Started).await;
        let how = loop {
            tokio::select! {
                how = &mut ended => break how.unwrap_or(Ended::Unknown),
                told = wire::receive::<Tell>(&conn) => match told {
                    Ok(Tell::Signal { signal }) if forwardable(signal) => {
                        let _ = crate::process::kill_group(pid, signal);
                    }
                    Ok(Tell::Signal { .. }) => {}
                    // The shim is gone (killed, or its group was): so is
                    // the command.
                    Err(_) => {
                        let _ = crate::process::kill_group(pid, libc::SIGKILL);
                        break ended.await.unwrap_or(Ended::Unknown);
                    }
                },
            }
        };
        locked(&self.running).remove(&pid);
        let (code, signal) = match how {
            Ended::Code(code) => (Some(code), None),
            Ended::Signal(signal) => (None, Some(signal)),
            Ended::Unknown => (None, None),
        };
        let _ = wire::send(&conn, &Reply::Exited { code, signal }).await;
    }

    /// Starts the asked command on the caller's descriptors.
    fn start(&self, ask: &Ask, stdio: &[OwnedFd; 3]) -> Result<u32, String> {
        let home = match ask.user {
            Identity::Root => &self.config.root_home,
            Identity::User => &self.config.user_home,
        };
        let cwd = if ask.cwd.starts_with('/') {
            std::path::PathBuf::from(&ask.cwd)
        } else {
            home.clone()
        };
        let cwd = CString::new(cwd.as_os_str().as_bytes())
            .map_err(|_| "sudo: the working directory contains a NUL byte".to_owned())?;
        let limits = ProcessLimits {
            nofile: ask.nofile,
            fsize_bytes: ask.fsize_bytes,
        };
        let setup = ChildSetup::new(&limits, ask.user, self.config.drop_privileges, cwd);
        let env = ask.env.iter().cloned().collect();
        let launched = {
            let _gate = self.reaper.launching();
            crate::spawn::spawn(
                &ask.program,
                &ask.args,
                &env,
                [&stdio[0], &stdio[1], &stdio[2]],
                &setup,
            )
        };
        self.reaper.reap();
        launched.map_err(|error| match error.raw_os_error() {
            Some(libc::ENOENT) => format!("sudo: {}: command not found", ask.program),
            Some(libc::EACCES) => format!("sudo: {}: permission denied", ask.program),
            _ => format!(
                "sudo: unable to run {}: {}",
                ask.program,
                crate::failure::reason(&error)
            ),
        })
    }
}

/// Signals a shim relays: those a terminal or a parent sends to stop or
/// tell a command something; never SIGKILL/SIGSTOP (the shim cannot catch
/// them) or anything out of range.
fn forwardable(signal: i32) -> bool {
    wire::RELAYED.contains(&signal)
}

#[cfg(test)]
mod tests {
    //! The agent's side and the shim's, end to end, in this process: the
    //! agent does not drop privileges here, so commands run as the test's
    //! own user.
    use super::shim::{self, Ended};
    use super::wire::Ask;
    use super::*;
    use std::io::Read;
    use std::os::fd::AsFd;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Runs an agent's sudo listener on a fresh name until `test` returns.
    fn with_sudo(test: impl FnOnce(&str)) {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            "airlock-sudo-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::SeqCst)
        );
        let home = std::env::temp_dir();
        let config = Arc::new(AgentConfig {
            keepalive: std::time::Duration::ZERO,
            drop_privileges: false,
            user_home: home.clone(),
            root_home: home,
            sudo_socket: Some(name.clone()),
        });
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let listener_name = name.clone();
        let agent = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let reaper = Arc::new(Reaper::new(false));
                let reaping = tokio::spawn(crate::reaper::run(Arc::clone(&reaper), None));
                let (sudo, listener) = Sudo::listen(&listener_name, config, reaper).unwrap();
                let serving = tokio::spawn(Arc::clone(&sudo).serve(listener));
                ready_tx.send(()).unwrap();
                let _ = stop_rx.await;
                serving.abort();
                sudo.kill_all();
                reaping.abort();
            });
        });
        ready_rx.recv().unwrap();
        test(&name);
        stop_tx.send(()).unwrap();
        agent.join().unwrap();
    }

    fn ask(program: &str, args: &[&str]) -> Ask {
        Ask {
            program: program.into(),
            args: args.iter().map(|a| a.to_string()).collect(),
            env: vec![
                ("PATH".into(), shim::SECURE_PATH.into()),
                ("GREETING".into(), "hello".into()),
            ],
            cwd: "/".into(),
            user: Identity::Root,
            nofile: 1024,
            fsize_bytes: u64::MAX,
        }
    }

    /// Runs `ask` through the shim with a pipe as stdout; returns how it
    /// ended and what it wrote.
    fn run(name: &str, ask: &Ask) -> (Result<Ended, String>, String) {
        let (mut out_read, out_write) = std::io::pipe().unwrap();
        let null = std::fs::File::open("/dev/null").unwrap();
        let stderr = std::io::stderr();
        let ended = shim::run(name, ask, [null.as_fd(), out_write.as_fd(), stderr.as_fd()]);
        drop(out_write);
        let mut out = String::new();
        out_read.read_to_string(&mut out).unwrap();
        (ended, out)
    }

    #[test]
    fn a_command_runs_with_the_asked_environment_and_directory_on_the_callers_descriptors() {
        with_sudo(|name| {
            let (ended, out) = run(name, &ask("sh", &["-c", "echo $GREETING; pwd; exit 7"]));
            assert_eq!(ended, Ok(Ended::Code(7)));
            assert_eq!(out, "hello\n/\n");
        });
    }

    #[test]
    fn a_missing_command_is_refused_as_sudo_says_it() {
        with_sudo(|name| {
            let (ended, _) = run(name, &ask("no-such-command-anywhere", &[]));
            assert_eq!(
                ended,
                Err("sudo: no-such-command-anywhere: command not found\n".to_owned())
            );
        });
    }

    #[test]
    fn a_command_killed_by_a_signal_reports_it() {
        with_sudo(|name| {
            let (ended, _) = run(name, &ask("sh", &["-c", "kill -TERM $$"]));
            assert_eq!(ended, Ok(Ended::Signal(libc::SIGTERM)));
        });
    }

    #[test]
    fn without_a_listener_the_shim_says_so() {
        let (ended, _) = run("airlock-sudo-test-nobody-listens", &ask("true", &[]));
        assert!(ended.unwrap_err().contains("grants no sudo"));
    }

    #[test]
    fn a_caller_that_goes_away_takes_its_command_with_it() {
        with_sudo(|name| {
            let marker = tempfile::NamedTempFile::new().unwrap();
            let path = marker.path().to_string_lossy().into_owned();
            let conn = wire::connect(name).unwrap();
            let null = std::fs::File::open("/dev/null").unwrap();
            let script = format!("echo $$ > {path}; sleep 30");
            wire::send_ask(
                conn.as_fd(),
                &ask("sh", &["-c", &script]),
                [null.as_fd(), null.as_fd(), null.as_fd()],
            )
            .unwrap();
            assert_eq!(wire::reply(conn.as_fd()).unwrap(), Reply::Started);
            let pid = loop {
                let text = std::fs::read_to_string(&path).unwrap();
                if let Ok(pid) = text.trim().parse::<i32>() {
                    break pid;
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            };
            drop(conn);
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            // SAFETY: kill with signal 0 only checks the pid exists.
            while unsafe { libc::kill(pid, 0) } == 0 {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the command outlived its caller"
                );
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        });
    }

    #[test]
    fn a_malformed_ask_is_refused() {
        with_sudo(|name| {
            let conn = wire::connect(name).unwrap();
            rustix::net::send(&conn, b"{\"program\":1}", rustix::net::SendFlags::empty()).unwrap();
            match wire::reply(conn.as_fd()).unwrap() {
                Reply::Refused { message } => assert!(message.starts_with("sudo: ")),
                other => panic!("{other:?}"),
            }
        });
    }
}
