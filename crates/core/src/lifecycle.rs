//! The sandbox state machine.
//!
//! A sandbox is in one [`State`]; things that happen to it are [`Action`]s;
//! [`next`] says where an action takes a state, or refuses it with an
//! [`IllegalTransition`]. The function is pure and its `match` has no
//! wildcard arm, so adding a state or an action does not compile until every
//! new pair has been decided (and the table test in `tests/lifecycle.rs`
//! fails until the new pairs are written down there too).
//!
//! ```text
//!              Started              Pause
//!   Creating ─────────▶ Running ◀═════════▶ Paused
//!      │  │               │        Resume     │
//!      │  │ Stop(r)       │ Stop(r)           │ Stop(r)
//!      │  └─────────▶ Stopping(r) ◀───────────┘
//!      │ Failed           │ Exited(e)
//!      ▼                  ▼
//!   Dead(create_failed)  Dead(e if e is oom/crashed, else r)
//! ```
//!
//! The complete table (`-` is illegal):
//!
//! | state \ action | `Started` | `Pause` | `Resume` | `Stop(r)` | `Exited(e)` | `Failed` |
//! |---|---|---|---|---|---|---|
//! | `Creating`  | `Running` | - | - | `Stopping(r)` | `Dead(e)` if `e` is unplanned, else - | `Dead(CreateFailed)` |
//! | `Running`   | - | `Paused` | - | `Stopping(r)` | `Dead(e)` if `e` is unplanned, else - | - |
//! | `Paused`    | - | - | `Running` | `Stopping(r)` | `Dead(e)` if `e` is unplanned, else - | - |
//! | `Stopping(s)` | - | - | - | `Stopping(s)` (no-op) | `Dead(e)` if `e` is `Oom`/`Crashed`, else `Dead(s)` | - |
//! | `Dead(d)`   | - | - | - | `Dead(d)` (no-op) | `Dead(d)` (no-op) | `Dead(d)` (no-op) |
//!
//! "Unplanned" reasons ([`DeadReason::is_unplanned`]) are `Oom`, `Crashed`
//! and `DaemonRestart`: a live sandbox may die of those on its own (or be
//! found dead at reconciliation) without a `Stop` first. `Deleted` and
//! `Timeout` are decisions of the daemon and always go through `Stop`, and
//! `CreateFailed` only through `Failed`.
//!
//! Two rules make retries harmless: once `Stopping`, further `Stop`s keep the
//! first reason; once `Dead`, every `Stop`, `Exited` and `Failed` is a no-op
//! that keeps the first reason (a double `DELETE` or a teardown reported
//! twice changes nothing).
//!
//! A `Stop` while `Creating` (a `DELETE` or timeout mid-creation) moves to
//! `Stopping`; the creator's own `Started` or `Failed` is then refused, which
//! tells it to finish the teardown and report `Exited`. The only way out of
//! `Stopping` is `Exited`: teardown finished.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Why a sandbox is dead (or stopping). The string forms are the store's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeadReason {
    /// Deleted through the API.
    Deleted,
    /// Its timeout expired and the reaper killed it.
    Timeout,
    /// The agent (or the whole sandbox) was killed for running out of memory.
    Oom,
    /// The sandbox init died unexpectedly.
    Crashed,
    /// Creation failed; the sandbox never ran.
    CreateFailed,
    /// Found dead when the daemon reconciled its records after a restart.
    DaemonRestart,
}

impl DeadReason {
    /// Every reason, in declaration order (for metrics labels and tests).
    pub const ALL: [DeadReason; 6] = [
        DeadReason::Deleted,
        DeadReason::Timeout,
        DeadReason::Oom,
        DeadReason::Crashed,
        DeadReason::CreateFailed,
        DeadReason::DaemonRestart,
    ];

    /// The store's string: `deleted|timeout|oom|crashed|create_failed|daemon_restart`.
    pub const fn as_str(self) -> &'static str {
        match self {
            DeadReason::Deleted => "deleted",
            DeadReason::Timeout => "timeout",
            DeadReason::Oom => "oom",
            DeadReason::Crashed => "crashed",
            DeadReason::CreateFailed => "create_failed",
            DeadReason::DaemonRestart => "daemon_restart",
        }
    }

    /// The sandbox itself died (`Oom`, `Crashed`). Such an exit overrides the
    /// reason a `Stop` gave: a sandbox being deleted that dies of OOM is
    /// recorded as `oom`.
    pub const fn is_sandbox_fault(self) -> bool {
        matches!(self, DeadReason::Oom | DeadReason::Crashed)
    }

    /// The sandbox can end this way without the daemon deciding it (`Oom`,
    /// `Crashed`, `DaemonRestart`), so a live sandbox may go straight to
    /// `Dead` with it via `Exited`.
    pub const fn is_unplanned(self) -> bool {
        matches!(
            self,
            DeadReason::Oom | DeadReason::Crashed | DeadReason::DaemonRestart
        )
    }
}

impl fmt::Display for DeadReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for DeadReason {
    type Err = ParseStateError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        DeadReason::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| ParseStateError::UnknownReason(s.to_owned()))
    }
}

/// Where a sandbox is in its life.
///
/// Serialized adjacently tagged: `{"state": "running"}`,
/// `{"state": "dead", "reason": "timeout"}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "state", content = "reason", rename_all = "snake_case")]
pub enum State {
    /// Resources are being set up; not usable yet.
    Creating,
    /// Up and serving.
    Running,
    /// Frozen; comes back with `Resume`.
    Paused,
    /// Teardown in progress, for the reason the `Stop` gave.
    Stopping(DeadReason),
    /// Gone, every resource released. Terminal.
    Dead(DeadReason),
}

impl State {
    /// The store's state string: `creating|running|paused|stopping|dead`.
    pub const fn as_str(self) -> &'static str {
        match self {
            State::Creating => "creating",
            State::Running => "running",
            State::Paused => "paused",
            State::Stopping(_) => "stopping",
            State::Dead(_) => "dead",
        }
    }

    /// The reason carried by `Stopping` and `Dead`, `None` otherwise.
    pub const fn reason(self) -> Option<DeadReason> {
        match self {
            State::Stopping(r) | State::Dead(r) => Some(r),
            State::Creating | State::Running | State::Paused => None,
        }
    }

    /// Whether the sandbox is dead (terminal).
    pub const fn is_dead(self) -> bool {
        matches!(self, State::Dead(_))
    }

    /// Rebuilds a state from the store's two columns, the inverse of
    /// [`State::as_str`] and [`State::reason`]. `stopping` and `dead` need a
    /// reason; the others refuse one.
    pub fn from_parts(state: &str, reason: Option<&str>) -> Result<State, ParseStateError> {
        let reason = reason.map(DeadReason::from_str).transpose()?;
        let unexpected = |r: DeadReason| ParseStateError::UnexpectedReason {
            state: state.to_owned(),
            reason: r,
        };
        let missing = || ParseStateError::MissingReason(state.to_owned());
        match (state, reason) {
            ("creating", None) => Ok(State::Creating),
            ("running", None) => Ok(State::Running),
            ("paused", None) => Ok(State::Paused),
            ("creating" | "running" | "paused", Some(r)) => Err(unexpected(r)),
            ("stopping", Some(r)) => Ok(State::Stopping(r)),
            ("dead", Some(r)) => Ok(State::Dead(r)),
            ("stopping" | "dead", None) => Err(missing()),
            _ => Err(ParseStateError::UnknownState(state.to_owned())),
        }
    }
}

impl fmt::Display for State {
    /// `running`, or `dead (timeout)` for states with a reason.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.reason() {
            Some(r) => write!(f, "{} ({r})", self.as_str()),
            None => f.write_str(self.as_str()),
        }
    }
}

/// Something that happens to a sandbox: a request of the daemon or an event
/// it observed.
///
/// Serialized adjacently tagged: `{"action": "pause"}`,
/// `{"action": "stop", "reason": "deleted"}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "action", content = "reason", rename_all = "snake_case")]
pub enum Action {
    /// Creation finished; the agent answered.
    Started,
    /// Freeze the sandbox.
    Pause,
    /// Thaw a paused sandbox.
    Resume,
    /// Begin teardown, for this reason.
    Stop(DeadReason),
    /// Teardown finished (or the sandbox was found gone); the reason is what
    /// the exit itself showed, e.g. `Oom` if the agent was OOM-killed.
    Exited(DeadReason),
    /// Creation failed (and its partial resources were released).
    Failed,
}

impl Action {
    /// A short name for logs and audit: `started|pause|resume|stop|exited|failed`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Action::Started => "started",
            Action::Pause => "pause",
            Action::Resume => "resume",
            Action::Stop(_) => "stop",
            Action::Exited(_) => "exited",
            Action::Failed => "failed",
        }
    }

    /// The reason carried by `Stop` and `Exited`, `None` otherwise.
    pub const fn reason(self) -> Option<DeadReason> {
        match self {
            Action::Stop(r) | Action::Exited(r) => Some(r),
            Action::Started | Action::Pause | Action::Resume | Action::Failed => None,
        }
    }

    /// The action as a verb phrase completing "a sandbox that is X cannot …".
    fn phrase(self) -> String {
        match self {
            Action::Started => "finish starting".to_owned(),
            Action::Pause => "be paused".to_owned(),
            Action::Resume => "be resumed".to_owned(),
            Action::Stop(r) => format!("be stopped ({r})"),
            Action::Exited(r) => format!("exit ({r})"),
            Action::Failed => "fail creation".to_owned(),
        }
    }
}

impl fmt::Display for Action {
    /// `pause`, or `stop (deleted)` for actions with a reason.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.reason() {
            Some(r) => write!(f, "{} ({r})", self.as_str()),
            None => f.write_str(self.as_str()),
        }
    }
}

/// An action the state machine refuses in the current state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a sandbox that is {from} cannot {}", action.phrase())]
pub struct IllegalTransition {
    /// The state the sandbox was in (and stays in).
    pub from: State,
    /// The refused action.
    pub action: Action,
}

/// A state or reason string from the store that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseStateError {
    /// The state string is none of `creating|running|paused|stopping|dead`.
    #[error("unknown sandbox state `{0}`; expected creating, running, paused, stopping or dead")]
    UnknownState(String),
    /// The reason string is not one of the known reasons.
    #[error("unknown dead reason `{0}`; expected deleted, timeout, oom, crashed, create_failed or daemon_restart")]
    UnknownReason(String),
    /// `stopping` or `dead` came without a reason.
    #[error("the sandbox state `{0}` needs a reason")]
    MissingReason(String),
    /// A state that carries no reason came with one.
    #[error("the sandbox state `{state}` takes no reason, but `{reason}` was given")]
    UnexpectedReason {
        /// The state string.
        state: String,
        /// The reason that came with it.
        reason: DeadReason,
    },
}

/// Where `action` takes a sandbox in `state`; see the module docs for the
/// table. On error the sandbox stays in `state`.
pub const fn next(state: State, action: Action) -> Result<State, IllegalTransition> {
    use Action as A;
    use State as S;
    let to = match (state, action) {
        (S::Creating, A::Started) => S::Running,
        (S::Creating, A::Failed) => S::Dead(DeadReason::CreateFailed),
        (S::Running, A::Pause) => S::Paused,
        (S::Paused, A::Resume) => S::Running,
        (S::Creating | S::Running | S::Paused, A::Stop(r)) => S::Stopping(r),
        (S::Creating | S::Running | S::Paused, A::Exited(e)) if e.is_unplanned() => S::Dead(e),
        (S::Stopping(s), A::Stop(_)) => S::Stopping(s),
        (S::Stopping(s), A::Exited(e)) => S::Dead(if e.is_sandbox_fault() { e } else { s }),
        (S::Dead(d), A::Stop(_) | A::Exited(_) | A::Failed) => S::Dead(d),
        // Everything else is refused. Listed, not wildcarded, so a new state
        // or action must be decided here before this compiles.
        (S::Creating | S::Running | S::Paused, A::Exited(_))
        | (S::Creating, A::Pause | A::Resume)
        | (S::Running, A::Started | A::Resume | A::Failed)
        | (S::Paused, A::Started | A::Pause | A::Failed)
        | (S::Stopping(_), A::Started | A::Pause | A::Resume | A::Failed)
        | (S::Dead(_), A::Started | A::Pause | A::Resume) => {
            return Err(IllegalTransition {
                from: state,
                action,
            })
        }
    };
    Ok(to)
}

impl State {
    /// Method form of [`next`].
    pub const fn next(self, action: Action) -> Result<State, IllegalTransition> {
        next(self, action)
    }
}
