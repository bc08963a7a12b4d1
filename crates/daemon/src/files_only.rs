//! A pause that keeps only a sandbox's files, and the resume that boots
//! it again on them (e2b's filesystem-only pause, `keep_memory=False`,
//! and its `connect(on_resume="reboot")`).
//!
//! # Pausing
//!
//! The sandbox is frozen, its writable layer is frozen into a new
//! content-addressed layer of the layer store (as a snapshot's is, see
//! [`crate::snapshots`]), and one store transaction records it paused on
//! its template's layers plus that one, holding nothing on the host (no
//! resources). Only then is everything it ran torn down: processes,
//! cgroups, mounts, its writable layer, its network namespace and egress
//! path, and its live slot (a paused sandbox of this kind counts against
//! no cap). A daemon that dies half-way leaves either the sandbox as it
//! was (the record still names its resources) or the record paused
//! files-only and an instance nothing records, which the restart's
//! reconciliation removes. Its outputs, when it collects them, are
//! collected before the teardown.
//!
//! It keeps its id, owner, metadata, access token, limits, network policy,
//! env and deadline rules; it is kept for the paused TTL, like any paused
//! sandbox. One key keeps at most [`crate::Config::max_files_only_paused`]
//! of them (403 `quota_exceeded` past it). Each such pause adds a layer (only what changed since the last
//! resume), at most [`airlock_policy::MAX_LAYERS`] in all.
//!
//! # Resuming
//!
//! A resume is a create of the same id on the recorded layers: admitted
//! like a create (it takes a live slot again, or is refused with 429),
//! started by its tier, its egress path attached with its policy, then
//! recorded running with its own timeout from now; the template's start
//! command runs again. A resume that fails leaves it paused files-only, to
//! be resumed again or deleted. A sandbox paused with its memory can be
//! resumed this way too (a reboot): it is first paused files-only.
//!
//! Only sandboxes of a stack of layers (templates imported, pulled, built
//! or bootstrapped, and snapshots) can be paused this way; others keep
//! their memory or nothing.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use airlock_core::{Action, DeadReason, State};
use airlock_policy::{SandboxSpec, Template};
use airlock_store::{SandboxRow, Stream};
use serde_json::json;

use crate::sandboxes::{create_error, state_error};
use crate::{Daemon, DaemonError, LiveSandbox};

/// Locks of sandboxes being resumed, one per id while someone holds it.
#[derive(Default)]
pub(crate) struct Resuming(Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>);

/// Held while one sandbox is resumed; the last holder forgets the lock.
pub(crate) struct ResumeGuard<'a> {
    resuming: &'a Resuming,
    id: String,
    lock: Arc<tokio::sync::Mutex<()>>,
    _held: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Resuming {
    /// Waits until no other resume of `id` runs, and holds it off.
    pub(crate) async fn lock(&self, id: &str) -> ResumeGuard<'_> {
        let lock = Arc::clone(
            self.0
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .entry(id.to_owned())
                .or_default(),
        );
        let held = Arc::clone(&lock).lock_owned().await;
        ResumeGuard {
            resuming: self,
            id: id.to_owned(),
            lock,
            _held: Some(held),
        }
    }

    /// Whether a resume of `id` runs now.
    pub(crate) fn busy(&self, id: &str) -> bool {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .is_some_and(|lock| lock.try_lock().is_err())
    }
}

impl Drop for ResumeGuard<'_> {
    fn drop(&mut self) {
        self._held = None;
        let mut locks = self.resuming.0.lock().unwrap_or_else(|p| p.into_inner());
        // Ours and the map's: nobody else waits for it.
        if Arc::strong_count(&self.lock) == 2 {
            locks.remove(&self.id);
        }
    }
}

/// How long a resume's start command may run before the resume answers.
const START_BOUND: Duration = Duration::from_secs(60);

impl Daemon {
    /// Pauses live sandbox `id` (running, or paused with its memory)
    /// keeping only its files (see the module doc).
    pub(crate) async fn pause_files_only(&self, id: &str) -> Result<(), DaemonError> {
        // No resume boots it again while what it ran is still being torn
        // down (the same id would be started beside it).
        let _resuming = self.inner.resuming.lock(id).await;
        let Some(sandbox) = self.live_sandbox(id) else {
            let row = self.recorded(id)?;
            return Err(if row.is_paused_files_only() {
                DaemonError::Conflict(format!("sandbox {id} is paused already"))
            } else {
                DaemonError::NotRunning(id.to_owned())
            });
        };
        let Some(layers) = crate::snapshots::spec_layers(&sandbox.spec) else {
            return Err(DaemonError::Unsupported(format!(
                "sandbox {id} runs on a template that is not a stack of layers, so its files cannot be kept apart from its memory (pause keeping its memory)"
            )));
        };
        if layers.len() + 1 >= airlock_policy::MAX_LAYERS {
            return Err(DaemonError::Conflict(format!(
                "sandbox {id} runs on {} layers already: pausing it keeping only its files would add one more than {} (pause keeping its memory)",
                layers.len(),
                airlock_policy::MAX_LAYERS - 1
            )));
        }
        let most = self.config().max_files_only_paused;
        let kept = self.with_store(|s| s.count_files_only_paused(&sandbox.owner))?;
        if kept >= most {
            return Err(DaemonError::QuotaExceeded(format!(
                "this key keeps {kept} sandboxes paused with only their files, its most ({most}); resume or delete one, or pause keeping its memory"
            )));
        }
        let started = Instant::now();
        if sandbox.spec.collect_outputs && sandbox.state() == State::Running {
            // Its processes end with the pause: what they wrote is kept.
            let _ = self.collect_outputs_of(&sandbox, "paused", "pause").await;
        }
        let backend = Arc::clone(self.inner.tiers.get(sandbox.spec.tier)?);
        let _teardown = sandbox.teardown.lock().await;
        let from = sandbox.state();
        let froze = match from {
            State::Running => match backend
                .pause(id, &sandbox.resources, crate::PauseMode::Freeze)
                .await
            {
                Ok(()) => true,
                // Read live: a file changing under the walk fails it.
                Err(airlock_backend::StateError::Unsupported { .. }) => false,
                Err(e) => return Err(state_error(e)),
            },
            State::Paused => false,
            _ => return Err(DaemonError::NotRunning(id.to_owned())),
        };
        let thaw = || async {
            if froze {
                if let Err(e) = backend.resume(id, &sandbox.resources).await {
                    tracing::error!("cannot thaw {id} after a failed pause: {e}");
                }
            }
        };
        let frozen = match self.freeze_layer(&sandbox, None).await {
            Ok(frozen) => frozen,
            Err(e) => {
                thaw().await;
                return Err(e);
            }
        };
        let mut stack = layers;
        let (added, bytes) = match &frozen.layer {
            Some(diff) => {
                stack.push(diff.diff_id.clone());
                (vec![diff.diff_id.clone()], diff.bytes)
            }
            None => (Vec::new(), 0),
        };
        let recorded = self
            .layer_paths(&format!("the pause of {id}"), &stack)
            .and_then(|paths| {
                let mut spec = sandbox.spec.clone();
                spec.template = Template::Layers { layers: paths };
                serde_json::to_string(&spec)
                    .map_err(|e| DaemonError::Internal(format!("cannot encode the spec: {e}")))
            })
            .and_then(|spec_json| {
                let (from_column, _) = crate::sandboxes::columns(from);
                Ok(self.with_store(|s| s.pause_files_only(id, from_column, &spec_json, &added))?)
            });
        // Recorded (or not): the collector may look at the layer again.
        drop(frozen);
        match recorded {
            Ok(true) => {}
            Ok(false) => {
                // Stopped meanwhile: that stop tears it down.
                thaw().await;
                return Err(DaemonError::NotRunning(id.to_owned()));
            }
            Err(e) => {
                thaw().await;
                return Err(e);
            }
        }
        // Recorded paused with nothing on the host: only now does what it
        // ran go.
        self.let_go(&sandbox).await;
        self.expire_in_from_now(id, self.config().paused_ttl)?;
        self.inner.audit.record(
            Stream::Runtime,
            "sandbox.paused",
            Some(id),
            None,
            json!({
                "mode": crate::PauseMode::Filesystem.as_str(),
                "layers": stack.len(),
                "bytes": bytes,
                "took_ms": started.elapsed().as_millis() as u64,
            }),
        );
        Ok(())
    }

    /// Boots sandbox `row`, paused keeping only its files, again on them
    /// (see the module doc). The caller holds its resume lock.
    pub(crate) async fn boot_files_only(&self, row: SandboxRow) -> Result<(), DaemonError> {
        let id = row.id.as_str();
        let started = Instant::now();
        let spec: SandboxSpec = serde_json::from_str(&row.spec_json).map_err(|e| {
            DaemonError::Internal(format!("the recorded spec of {id} is unreadable: {e}"))
        })?;
        let backend = Arc::clone(self.inner.tiers.get(spec.tier)?);
        let permit = match self.inner.admission.admit(&row.owner_key_id).await {
            Ok(permit) => permit,
            Err(rejected) => {
                self.inner.metrics.rejected.inc();
                return Err(DaemonError::Rejected(rejected));
            }
        };
        let instance = backend
            .create(id, &spec)
            .await
            .map_err(|e| create_error(id, e))?;
        let resources = instance.resources.clone();
        let egress_point = instance.egress.clone();
        let recorded = serde_json::to_string(&resources)
            .map_err(|e| DaemonError::Internal(format!("cannot encode the resources: {e}")))
            .and_then(|json| Ok(self.with_store(|s| s.set_resources(id, Some(&json)))?));
        if let Err(e) = recorded {
            if let Err(e) = self.release_resources(id, Some(&resources)).await {
                tracing::error!("{e}");
            }
            return Err(e);
        }
        let startup = self.start_of(&row, &spec);
        let (sandbox, ended) = LiveSandbox::new(
            id.to_owned(),
            row.owner_key_id.clone(),
            spec,
            instance,
            State::Paused,
            Some(permit.succeeded()),
        );
        self.inner
            .live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id.to_owned(), Arc::clone(&sandbox));
        self.watch_for_death(&sandbox, ended);
        let running = match self.attach_egress(&sandbox, egress_point.as_ref()) {
            Ok(()) => {
                let _teardown = sandbox.teardown.lock().await;
                match sandbox.state() {
                    State::Paused => {
                        self.transition(id, State::Paused, Action::Resume)
                            .map(|moved| {
                                if let Some(state) = moved {
                                    sandbox.set_state(state);
                                }
                                moved.is_some()
                            })
                    }
                    // It died, or a stop came: that is in charge.
                    _ => return Err(DaemonError::NotRunning(id.to_owned())),
                }
            }
            Err(e) => Err(e),
        };
        match running {
            Ok(true) => {}
            // A stop moved the record first: the new instance goes (a
            // stop that finds it live meanwhile does the same; the second
            // finds it dead).
            Ok(false) => {
                if let Err(e) = self.stop(id, DeadReason::Deleted, None).await {
                    tracing::error!("tearing down {id}, stopped while it resumed: {e}");
                }
                return Err(DaemonError::NotRunning(id.to_owned()));
            }
            Err(e) => {
                self.unboot(&sandbox).await;
                return Err(e);
            }
        }
        self.expire_in_from_now(id, Duration::from_millis(sandbox.spec.timeout_ms))?;
        if let Some(startup) = startup {
            if let Err(e) = self.run_startup(id, &startup, START_BOUND, "resume").await {
                tracing::warn!("the start command of {id} failed on its resume: {e}");
            }
        }
        self.inner.audit.record(
            Stream::Runtime,
            "sandbox.resumed",
            Some(id),
            None,
            json!({
                "mode": crate::PauseMode::Filesystem.as_str(),
                "took_ms": started.elapsed().as_millis() as u64,
            }),
        );
        Ok(())
    }

    /// Undoes a boot that failed before it was recorded running: the new
    /// instance goes, the record stays paused files-only.
    async fn unboot(&self, sandbox: &Arc<LiveSandbox>) {
        let _teardown = sandbox.teardown.lock().await;
        if sandbox.state() != State::Paused {
            return; // a stop or its death is in charge
        }
        self.let_go(sandbox).await;
        if let Err(e) = self.with_store(|s| s.set_resources(&sandbox.id, None)) {
            tracing::error!("recording {} paused again: {e}", sandbox.id);
        }
    }

    /// Tears down everything live `sandbox` runs, leaving its record as it
    /// is (the caller holds its teardown lock): off the registry, its
    /// egress path, its host resources, then its live slot. Its death is
    /// no death (`on_death` leaves a stopping sandbox alone).
    async fn let_go(&self, sandbox: &Arc<LiveSandbox>) {
        sandbox.set_state(State::Stopping(DeadReason::Deleted));
        self.inner
            .live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&sandbox.id);
        drop(
            sandbox
                .egress
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take(),
        );
        if let Err(e) = self
            .release_resources(&sandbox.id, Some(&sandbox.resources))
            .await
        {
            self.inner.metrics.teardown_failures.inc();
            tracing::error!("{e}");
        }
        drop(
            sandbox
                .lease
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take(),
        );
    }

    /// The start command a sandbox booted again on `spec` runs: its
    /// template's, when the template still has the layers it runs on
    /// beneath the ones its pauses added.
    fn start_of(&self, row: &SandboxRow, spec: &SandboxSpec) -> Option<crate::startup::Startup> {
        let layers = crate::snapshots::spec_layers(spec)?;
        let owner = self
            .with_store(|s| s.get_key(&row.owner_key_id))
            .ok()
            .flatten()?;
        crate::startup::Startup::of(&self.start_config_of(&owner, row, &layers))
    }

    /// Ends sandbox `row`, paused keeping only its files and not being
    /// resumed: nothing runs, so it is recorded stopping and dead.
    pub(crate) fn stop_files_only(
        &self,
        row: &SandboxRow,
        reason: DeadReason,
        request_id: Option<&str>,
    ) -> Result<(), DaemonError> {
        let id = row.id.as_str();
        let Some(stopping) = self.transition(id, State::Paused, Action::Stop(reason))? else {
            return Ok(()); // moved meanwhile: whoever moved it is in charge
        };
        let reason = stopping.reason().unwrap_or(reason);
        if reason == DeadReason::Timeout {
            self.inner.audit.record(
                Stream::Security,
                "sandbox.timeout_kill",
                Some(id),
                request_id,
                json!({"paused": crate::PauseMode::Filesystem.as_str()}),
            );
        }
        self.transition(id, stopping, Action::Exited(reason))?;
        self.inner
            .metrics
            .deaths
            .get_or_create(&crate::metrics::ReasonLabel {
                reason: reason.as_str(),
            })
            .inc();
        self.inner.audit.record(
            Stream::Runtime,
            "sandbox.stopped",
            Some(id),
            request_id,
            json!({"reason": reason.as_str()}),
        );
        Ok(())
    }
}
