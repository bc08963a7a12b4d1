//! What a starting daemon does with what it finds.
//!
//! Sandboxes outlive the daemon (each has its own supervisor), so after a
//! crash or an upgrade the store says which sandboxes should exist and the
//! host says which do. Reconciliation makes them agree:
//!
//! 1. Every sandbox the store records as running or paused is **adopted**
//!    if its supervisor is alive and its agent answers: it counts against
//!    admission again and the API serves it as before. Processes started
//!    before the restart keep running, but their output streams are not
//!    re-attached (the old daemon held them).
//! 2. Every other recorded sandbox that is not dead (creating or stopping
//!    when the daemon died, or running but unreachable) is torn down and
//!    recorded dead with reason `daemon_restart` (a stop in progress keeps
//!    its own reason).
//! 3. Whatever runs or lingers on the host without a live record
//!    (supervisors, cgroups, slot records, sockets) is removed.

use crate::sandboxes::state_of;
use crate::{Daemon, LiveSandbox};
use airlock_backend::Resources;
use airlock_core::{Action, DeadReason, State};
use airlock_store::Stream;
use serde::Serialize;
use serde_json::json;
use std::collections::HashSet;
use std::sync::Arc;

/// What reconciliation did.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Report {
    /// Sandboxes taken over again.
    pub adopted: Vec<String>,
    /// Recorded sandboxes that could not be taken over and were reaped.
    pub reaped: Vec<String>,
    /// Sandboxes found running without a record, stopped.
    pub stopped_unrecorded: Vec<String>,
    /// Leftovers removed.
    pub removed: Vec<String>,
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
            let state = state_of(&row);
            let resources: Option<Resources> = row
                .resources_json
                .as_deref()
                .and_then(|j| serde_json::from_str(j).ok());
            let spec = serde_json::from_str(&row.spec_json).ok();
            if let (State::Running | State::Paused, Some(resources), Some(spec)) =
                (state, resources.as_ref(), spec)
            {
                if let Ok(instance) = self.inner.backend.adopt(&row.id, resources).await {
                    let lease = self.inner.admission.adopt(&row.owner_key_id);
                    let (sandbox, ended) = LiveSandbox::new(
                        row.id.clone(),
                        row.owner_key_id.clone(),
                        spec,
                        instance,
                        state,
                        Some(lease),
                    );
                    self.inner
                        .live
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(row.id.clone(), Arc::clone(&sandbox));
                    self.watch_for_death(&sandbox, ended);
                    let supervisor = match resources {
                        Resources::Process { supervisor_pid, .. } => *supervisor_pid,
                    };
                    if let Err(e) = self.attach_egress(&sandbox, supervisor) {
                        tracing::error!("re-adopting {}: {e}", row.id);
                    }
                    keep.insert(row.id.clone());
                    self.inner.audit.record(
                        Stream::Runtime,
                        "sandbox.adopted",
                        Some(&row.id),
                        None,
                        json!({}),
                    );
                    report.adopted.push(row.id);
                    continue;
                }
            }
            // Not adoptable: tear down whatever is left and record it dead.
            if let Err(e) = self
                .inner
                .backend
                .destroy(&row.id, resources.as_ref())
                .await
            {
                self.inner.metrics.teardown_failures.inc();
                tracing::error!("{e}");
            }
            let reason = match state {
                State::Stopping(reason) => reason,
                _ => DeadReason::DaemonRestart,
            };
            let mut from = state;
            if matches!(from, State::Creating | State::Running | State::Paused) {
                if let Ok(Some(stopping)) = self.transition(&row.id, from, Action::Stop(reason)) {
                    from = stopping;
                }
            }
            let _ = self.transition(&row.id, from, Action::Exited(reason));
            self.inner.audit.record(
                Stream::Runtime,
                "sandbox.reaped",
                Some(&row.id),
                None,
                json!({"reason": reason.as_str(), "was": state.as_str()}),
            );
            report.reaped.push(row.id);
        }
        let found = self.inner.backend.reconcile(&keep).await;
        report.stopped_unrecorded = found.stopped;
        report.removed = found.removed;
        report
    }
}
