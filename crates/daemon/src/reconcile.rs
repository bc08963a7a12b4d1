//! What a starting daemon does with what it finds.
//!
//! Sandboxes outlive the daemon (each has its own supervisor), so after a
//! crash or an upgrade the store says which sandboxes should exist and the
//! host says which do. Reconciliation makes them agree:
//!
//! 1. Every sandbox the store records as running or paused is **adopted**
//!    if its supervisor is alive and its agent answers: it counts against
//!    admission again, the API serves it as before, and its supervisor is
//!    handed the recorded deadline again. Processes started before the
//!    restart keep running, but their output streams are not re-attached
//!    (the old daemon held them).
//! 2. One whose supervisor runs but does not answer (a refused or
//!    timed-out connection: it may be stopped, or busy) is **not** reaped:
//!    it stays recorded running, counts against admission, and a task
//!    retries its adoption with backoff until it answers, ends, is stopped
//!    through the API, or its deadline passes (its supervisor enforces that
//!    deadline too). Until then calls into it answer "not running".
//! 3. Every other recorded sandbox that is not dead (creating or stopping
//!    when the daemon died, its supervisor gone, or its record unusable) is
//!    torn down and recorded dead: with reason `timeout` when its
//!    supervisor left word that it ended it at its deadline, `oom` when it
//!    died of the OOM killer, else `daemon_restart` (a stop in progress
//!    keeps its own reason).
//! 4. A sandbox paused keeping only its files holds nothing on the host:
//!    it stays paused (see [`crate::files_only`]).
//! 5. Whatever runs or lingers on the host without a live record
//!    (supervisors, cgroups, slot records, sockets) is removed.

use crate::audit::now_ms;
use crate::sandboxes::state_of;
use crate::{Daemon, LiveSandbox};
use airlock_backend::{AdoptError, Ending, Resources};
use airlock_core::{Action, DeadReason, LiveLease, State};
use airlock_policy::SandboxSpec;
use airlock_store::Stream;
use serde::Serialize;
use serde_json::json;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

/// What reconciliation did.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Report {
    /// Sandboxes taken over again.
    pub adopted: Vec<String>,
    /// Recorded sandboxes that could not be taken over and were reaped.
    pub reaped: Vec<String>,
    /// Recorded sandboxes whose supervisor runs but did not answer: kept,
    /// and their adoption retried in the background.
    pub pending: Vec<String>,
    /// Sandboxes found running without a record, stopped.
    pub stopped_unrecorded: Vec<String>,
    /// Leftovers removed.
    pub removed: Vec<String>,
}

/// The first wait before an adoption is tried again.
const ADOPT_RETRY_FIRST: Duration = Duration::from_millis(250);
/// The longest wait between two tries.
const ADOPT_RETRY_MAX: Duration = Duration::from_secs(10);

/// A recorded sandbox to adopt.
struct Recorded {
    id: String,
    owner: String,
    state: State,
    spec: SandboxSpec,
    resources: Resources,
    expires_at: i64,
}

/// Why a recorded sandbox that ended on its own is recorded dead, given
/// what its owner said (if anything) and the state it was recorded in.
fn reason_of(state: State, ending: Option<Ending>) -> DeadReason {
    match (state, ending) {
        (State::Stopping(reason), _) => reason,
        (_, Some(Ending::Expired)) => DeadReason::Timeout,
        (_, Some(Ending::Oom)) => DeadReason::Oom,
        _ => DeadReason::DaemonRestart,
    }
}

impl Daemon {
    /// Adopts or reaps every recorded sandbox, then removes what is not
    /// recorded. Run once at start, before serving.
    pub async fn reconcile(&self) -> Report {
        let mut report = Report::default();
        let rows = match self.with_store(|s| s.live_sandboxes()) {
            Ok(rows) => rows,
            Err(e) => {
                tracing::error!("cannot read the recorded sandboxes: {e}");
                Vec::new()
            }
        };
        let mut keep = HashSet::new();
        for row in rows {
            if row.is_paused_files_only() {
                // Nothing of it runs: it stays paused, to be booted again
                // on its files (see `files_only`).
                continue;
            }
            let state = state_of(&row);
            let resources: Option<Resources> = row
                .resources_json
                .as_deref()
                .and_then(|j| serde_json::from_str(j).ok());
            let spec = serde_json::from_str(&row.spec_json).ok();
            let mut ending = None;
            if let (State::Running | State::Paused, Some(resources), Some(spec)) =
                (state, resources.clone(), spec)
            {
                let recorded = Recorded {
                    id: row.id.clone(),
                    owner: row.owner_key_id.clone(),
                    state,
                    spec,
                    resources,
                    expires_at: row.expires_at,
                };
                match self
                    .adopt_recorded(&row.id, &recorded.resources, state == State::Paused)
                    .await
                {
                    Ok(instance) => {
                        let lease = self.inner.admission.adopt(&recorded.owner);
                        self.install_adopted(recorded, instance, lease);
                        keep.insert(row.id.clone());
                        report.adopted.push(row.id);
                        continue;
                    }
                    Err(e) if e.is_transient() => {
                        tracing::warn!(
                            "{} did not answer ({e}); its adoption is retried in the background",
                            row.id
                        );
                        self.adopt_later(recorded);
                        keep.insert(row.id.clone());
                        report.pending.push(row.id);
                        continue;
                    }
                    Err(e) => {
                        tracing::warn!("{} cannot be adopted: {e}", row.id);
                        if let AdoptError::Gone { ending: said } = e {
                            ending = said;
                        }
                    }
                }
            }
            let reason = reason_of(state, ending);
            self.reap_recorded(&row.id, state, resources.as_ref(), reason)
                .await;
            report.reaped.push(row.id);
        }
        for backend in self.inner.tiers.all() {
            let found = backend.reconcile(&keep).await;
            report.stopped_unrecorded.extend(found.stopped);
            report.removed.extend(found.removed);
        }
        self.sweep_volumes();
        report
    }

    /// Connects again to the recorded sandbox `id` through the backend of
    /// its tier; a tier this daemon cannot run now is a reason to try again
    /// later, not to reap the sandbox. A `paused` one is resumed for the
    /// handshake with its agent and paused again.
    async fn adopt_recorded(
        &self,
        id: &str,
        resources: &Resources,
        paused: bool,
    ) -> Result<airlock_backend::Instance, airlock_backend::AdoptError> {
        let backend = match self.inner.tiers.of(resources) {
            Ok(backend) => Arc::clone(backend),
            Err(e) => return Err(airlock_backend::AdoptError::Unreachable(e.to_string())),
        };
        if !paused {
            return backend.adopt(id, resources).await;
        }
        if let Err(e) = backend.resume(id, resources).await {
            tracing::warn!("{id} was recorded paused and cannot be resumed to adopt it: {e}");
        }
        let adopted = backend.adopt(id, resources).await;
        if adopted.is_ok() {
            if let Err(e) = backend
                .pause(id, resources, airlock_backend::PauseMode::Memory)
                .await
            {
                tracing::error!("{id} is adopted but cannot be paused again: {e}");
            }
        }
        adopted
    }

    /// Serves an adopted sandbox again.
    fn install_adopted(
        &self,
        recorded: Recorded,
        instance: airlock_backend::Instance,
        lease: LiveLease,
    ) {
        let Recorded {
            id,
            owner,
            state,
            spec,
            resources,
            expires_at,
        } = recorded;
        // The recorded deadline is the one in force (a supervisor may have
        // missed the last change if the daemon died in between).
        match self.inner.tiers.of(&resources) {
            Ok(backend) => {
                if let Err(e) = backend.set_deadline(&id, &resources, expires_at) {
                    tracing::error!("re-adopting {id}: {e}: {}", e.source);
                }
            }
            Err(e) => tracing::error!("re-adopting {id}: {e}"),
        }
        let egress_point = instance.egress.clone();
        let (sandbox, ended) =
            LiveSandbox::new(id.clone(), owner, spec, instance, state, Some(lease));
        self.inner
            .live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id.clone(), Arc::clone(&sandbox));
        self.watch_for_death(&sandbox, ended);
        if let Err(e) = self.attach_egress(&sandbox, egress_point.as_ref()) {
            tracing::error!("re-adopting {id}: {e}");
        }
        self.inner.audit.record(
            Stream::Runtime,
            "sandbox.adopted",
            Some(&id),
            None,
            json!({}),
        );
    }

    /// Tears down whatever is left of a recorded sandbox and records it
    /// dead for `reason`.
    async fn reap_recorded(
        &self,
        id: &str,
        state: State,
        resources: Option<&Resources>,
        reason: DeadReason,
    ) {
        if let Err(e) = self.release_resources(id, resources).await {
            self.inner.metrics.teardown_failures.inc();
            tracing::error!("{e}");
        }
        let mut from = state;
        if matches!(from, State::Creating | State::Running | State::Paused) {
            if let Ok(Some(stopping)) = self.transition(id, from, Action::Stop(reason)) {
                from = stopping;
            }
        }
        let _ = self.transition(id, from, Action::Exited(reason));
        self.inner.audit.record(
            Stream::Runtime,
            "sandbox.reaped",
            Some(id),
            None,
            json!({"reason": reason.as_str(), "was": state.as_str()}),
        );
    }

    /// Retries the adoption of a sandbox that did not answer, in a task of
    /// its own, until it answers or is known to be over.
    fn adopt_later(&self, recorded: Recorded) {
        let wake = Arc::new(tokio::sync::Notify::new());
        self.inner
            .adopting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(recorded.id.clone(), Arc::clone(&wake));
        // It runs: it counts against the caps meanwhile.
        let lease = self.inner.admission.adopt(&recorded.owner);
        let daemon = self.clone();
        tokio::spawn(async move {
            let id = recorded.id.clone();
            daemon.keep_adopting(recorded, lease, wake).await;
            daemon
                .inner
                .adopting
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&id);
        });
    }

    async fn keep_adopting(
        &self,
        mut recorded: Recorded,
        lease: LiveLease,
        wake: Arc<tokio::sync::Notify>,
    ) {
        let id = recorded.id.clone();
        let mut backoff = ADOPT_RETRY_FIRST;
        loop {
            tokio::select! {
                () = tokio::time::sleep(backoff) => {}
                () = wake.notified() => {}
            }
            let row = match self.with_store(|s| s.get_sandbox(&id)) {
                Ok(Some(row)) => row,
                Ok(None) => return,
                Err(e) => {
                    tracing::error!("retrying the adoption of {id}: {e}");
                    backoff = (backoff * 2).min(ADOPT_RETRY_MAX);
                    continue;
                }
            };
            let state = state_of(&row);
            let stop = match state {
                State::Dead(_) => return,
                State::Stopping(reason) => Some(reason),
                _ if row.expires_at <= now_ms() => Some(DeadReason::Timeout),
                _ => None,
            };
            if let Some(reason) = stop {
                if reason == DeadReason::Timeout {
                    self.inner.audit.record(
                        Stream::Security,
                        "sandbox.timeout_kill",
                        Some(&id),
                        None,
                        json!({"timeout_ms": recorded.spec.timeout_ms}),
                    );
                }
                self.reap_recorded(&id, state, Some(&recorded.resources), reason)
                    .await;
                return;
            }
            match self
                .adopt_recorded(&id, &recorded.resources, state == State::Paused)
                .await
            {
                Ok(instance) => {
                    recorded.state = state;
                    recorded.expires_at = row.expires_at;
                    self.install_adopted(recorded, instance, lease);
                    tracing::info!("{id} answered and is adopted");
                    return;
                }
                Err(e) if e.is_transient() => {
                    tracing::debug!("{id} still does not answer: {e}");
                    backoff = (backoff * 2).min(ADOPT_RETRY_MAX);
                }
                Err(e) => {
                    tracing::warn!("{id} cannot be adopted: {e}");
                    let ending = match e {
                        AdoptError::Gone { ending } => ending,
                        _ => None,
                    };
                    self.reap_recorded(
                        &id,
                        state,
                        Some(&recorded.resources),
                        reason_of(state, ending),
                    )
                    .await;
                    return;
                }
            }
        }
    }
}
