//! Reaping children.
//!
//! As PID 1 of a sandbox the agent is the parent of every orphan there, so it
//! reaps with `waitpid(-1, WNOHANG)` on every `SIGCHLD`: the exit status of a
//! process it started goes to whoever registered that pid; others (orphans, or
//! a child that ended before its pid was registered) are kept as unclaimed
//! for a while. When the agent is not PID 1 (tests run it inside the test
//! process) it only ever waits for the pids it registered, never for `-1`,
//! so it cannot steal the exit status of someone else's child.
//!
//! A slow fallback tick repeats the reaping in case a `SIGCHLD` is coalesced
//! or lost; the `waitpid` calls are cheap and never block.
//!
//! # The launch gate
//!
//! When `exec` fails, std's `Command::spawn` reaps the failed child itself
//! with a blocking `waitpid(pid)` and panics if that child is already gone
//! (and the release profile aborts on panic). A `waitpid(-1)` running at
//! that moment could steal it. So every launch holds the gate shared, and
//! `waitpid(-1)` only runs when it can take the gate exclusively; otherwise
//! it is skipped and the launch triggers a reap once it is done.

use crate::locked;
use rustix::io::Errno;
use rustix::process::{Pid, WaitOptions, WaitStatus};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, TryLockError};
use std::time::Duration;
use tokio::signal::unix::Signal;
use tokio::sync::oneshot;

/// Unclaimed exit statuses kept (orphans mostly).
const UNCLAIMED: usize = 1024;
/// Reaping repeats at least this often, whatever the signals say.
const FALLBACK_TICK: Duration = Duration::from_millis(200);

/// How a child ended, as `waitpid` saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// It exited with this code.
    Code(i32),
    /// This signal killed it.
    Signal(i32),
    /// Its status was lost (reaped elsewhere or evicted); reported as
    /// neither code nor signal.
    Unknown,
}

impl Ended {
    fn from_status(status: WaitStatus) -> Ended {
        if let Some(code) = status.exit_status() {
            Ended::Code(code)
        } else if let Some(signal) = status.terminating_signal() {
            Ended::Signal(signal)
        } else {
            Ended::Unknown
        }
    }
}

/// The registry of children the agent waits for.
#[derive(Debug)]
pub(crate) struct Reaper {
    /// Whether to reap every child (`waitpid(-1)`): true when PID 1.
    all_children: bool,
    state: Mutex<State>,
    /// Held shared by every launch, exclusively by `waitpid(-1)`.
    launch_gate: RwLock<()>,
}

#[derive(Debug, Default)]
struct State {
    waiting: HashMap<u32, oneshot::Sender<Ended>>,
    unclaimed: VecDeque<(u32, Ended)>,
}

impl State {
    fn deliver(&mut self, pid: u32, ended: Ended) {
        match self.waiting.remove(&pid) {
            Some(tx) => {
                let _ = tx.send(ended);
            }
            None => {
                if self.unclaimed.len() == UNCLAIMED {
                    self.unclaimed.pop_front();
                }
                self.unclaimed.push_back((pid, ended));
            }
        }
    }
}

fn to_pid(pid: u32) -> Option<Pid> {
    i32::try_from(pid).ok().and_then(Pid::from_raw)
}

impl Reaper {
    /// A reaper; `all_children` when the agent is PID 1.
    pub(crate) fn new(all_children: bool) -> Reaper {
        Reaper {
            all_children,
            state: Mutex::new(State::default()),
            launch_gate: RwLock::new(()),
        }
    }

    /// Held while a process is launched (fork to exec or exec failure), so
    /// no `waitpid(-1)` reaps a child std still has to wait for.
    pub(crate) fn launching(&self) -> RwLockReadGuard<'_, ()> {
        self.launch_gate
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether this reaper reaps every child (the agent is PID 1).
    pub(crate) fn reaps_all(&self) -> bool {
        self.all_children
    }

    /// Registers a child the agent started; the receiver gets how it ended.
    /// Safe against the child having ended (and even been reaped) already.
    pub(crate) fn register(&self, pid: u32) -> oneshot::Receiver<Ended> {
        let (tx, rx) = oneshot::channel();
        let mut state = locked(&self.state);
        if let Some(at) = state.unclaimed.iter().position(|(p, _)| *p == pid) {
            let ended = state
                .unclaimed
                .remove(at)
                .map_or(Ended::Unknown, |(_, e)| e);
            let _ = tx.send(ended);
            return rx;
        }
        let Some(target) = to_pid(pid) else {
            let _ = tx.send(Ended::Unknown);
            return rx;
        };
        match rustix::process::waitpid(Some(target), WaitOptions::NOHANG) {
            Ok(Some((_, status))) => {
                let _ = tx.send(Ended::from_status(status));
            }
            // Reaped by someone else and not kept: report it as lost rather
            // than wait forever.
            Err(Errno::CHILD) => {
                let _ = tx.send(Ended::Unknown);
            }
            Ok(None) | Err(_) => {
                state.waiting.insert(pid, tx);
            }
        }
        rx
    }

    /// Collects every child that has ended, without blocking.
    pub(crate) fn reap(&self) {
        if self.all_children {
            // A launch is under way: skip; it reaps again when it is done.
            let _gate = match self.launch_gate.try_write() {
                Ok(gate) => gate,
                Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
                Err(TryLockError::WouldBlock) => return,
            };
            let mut state = locked(&self.state);
            while let Ok(Some((pid, status))) = rustix::process::wait(WaitOptions::NOHANG) {
                let pid = u32::try_from(pid.as_raw_nonzero().get()).unwrap_or(0);
                state.deliver(pid, Ended::from_status(status));
            }
        } else {
            let mut state = locked(&self.state);
            let pids: Vec<u32> = state.waiting.keys().copied().collect();
            for pid in pids {
                let Some(target) = to_pid(pid) else { continue };
                match rustix::process::waitpid(Some(target), WaitOptions::NOHANG) {
                    Ok(Some((_, status))) => state.deliver(pid, Ended::from_status(status)),
                    Ok(None) => {}
                    Err(Errno::CHILD) => state.deliver(pid, Ended::Unknown),
                    Err(_) => {}
                }
            }
        }
    }
}

/// Reaps on every `SIGCHLD` and on a slow fallback tick, forever.
pub(crate) async fn run(reaper: Arc<Reaper>, mut sigchld: Option<Signal>) {
    let mut tick = tokio::time::interval(FALLBACK_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        match sigchld.as_mut() {
            Some(signal) => {
                tokio::select! {
                    got = signal.recv() => {
                        if got.is_none() {
                            sigchld = None;
                        }
                    }
                    _ = tick.tick() => {}
                }
            }
            None => {
                tick.tick().await;
            }
        }
        reaper.reap();
    }
}
