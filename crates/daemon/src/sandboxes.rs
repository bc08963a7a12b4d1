//! Sandbox lifecycle: create, read, list, stop, expire.
//!
//! Every state change goes through [`airlock_core::next`] and is written to
//! the store with compare-and-set on the state it came from. A stop (API
//! delete, timeout) and a sandbox's own death take the sandbox's teardown
//! lock, so they run one after the other and the second finds it dead.

use crate::audit::now_ms;
use crate::{not_found, Daemon, DaemonError, LiveSandbox};
use airlock_backend::{CreateError, Ending, Resources};
use airlock_core::{next, Action, CreatePermit, DeadReason, LiveLease, State};
use airlock_policy::{SandboxSpec, Template};
use airlock_store::{KeyRow, ListQuery, NewSandbox, Page, SandboxRow, Stream};
use serde_json::json;
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot::error::TryRecvError;

/// How often the reaper looks for expired sandboxes.
const REAPER_TICK: Duration = Duration::from_millis(100);
/// How long a stop of a sandbox still being created waits for it.
const CREATING_WAIT: Duration = Duration::from_secs(30);

/// What [`Daemon::launch`] is given by the admitted create it finishes.
struct Launching {
    owner: KeyRow,
    template_name: String,
    tier: String,
    spec: SandboxSpec,
    permit: CreatePermit,
    started: Instant,
    access_token: String,
    request_id: String,
    /// The template's start and ready commands, run before it is handed out.
    startup: Option<crate::startup::Startup>,
    /// Closed when the create's requester went away.
    requester_gone: tokio::sync::oneshot::Receiver<()>,
}

/// What a new sandbox is.
#[derive(Debug, Clone)]
pub struct NewSandboxRequest {
    /// The validated spec (its `timeout_ms` is the lifetime).
    pub spec: SandboxSpec,
    /// The template's name as the client gave it.
    pub template_name: String,
    /// User metadata.
    pub metadata: BTreeMap<String, String>,
    /// The layers of the layer store it runs on (by diff_id), recorded
    /// with it so they stay while it lives.
    pub layers: Vec<String>,
}

/// A sandbox just created.
#[derive(Debug, Clone)]
pub struct Created {
    /// Its record.
    pub row: SandboxRow,
    /// The access token, shown this once.
    pub access_token: String,
}

/// How a claim of a warm pool member went.
enum Claim {
    /// The member is the create's sandbox (or the create failed after it
    /// was handed the member).
    HandedOut(Result<Created, DaemonError>),
    /// The member could not be used: the create starts its own sandbox.
    Unusable(CreatePermit),
}

/// The store's state column and reason for a lifecycle state.
pub(crate) fn columns(state: State) -> (airlock_store::State, Option<&'static str>) {
    use airlock_store::State as S;
    let column = match state {
        State::Creating => S::Creating,
        State::Running => S::Running,
        State::Paused => S::Paused,
        State::Stopping(_) => S::Stopping,
        State::Dead(_) => S::Dead,
    };
    (column, state.reason().map(DeadReason::as_str))
}

/// The lifecycle state of a stored row.
pub fn state_of(row: &SandboxRow) -> State {
    State::from_parts(row.state.as_str(), row.state_reason.as_deref())
        .unwrap_or(State::Dead(DeadReason::Crashed))
}

impl Daemon {
    /// Moves `id` from `from` by `action` in the store (compare-and-set).
    /// `Ok(None)` when the stored state was no longer `from`.
    pub(crate) fn transition(
        &self,
        id: &str,
        from: State,
        action: Action,
    ) -> Result<Option<State>, DaemonError> {
        let to = next(from, action).map_err(|e| DaemonError::Conflict(e.to_string()))?;
        let (from_column, _) = columns(from);
        let (to_column, reason) = columns(to);
        let changed = self.with_store(|s| s.set_state(id, Some(from_column), to_column, reason))?;
        Ok(changed.then_some(to))
    }

    /// Refuses what this machine or this daemon's policy cannot give.
    fn check_request(&self, spec: &SandboxSpec) -> Result<(), DaemonError> {
        spec.validate()
            .map_err(|e| DaemonError::BadInput(e.to_string()))?;
        // A tier that cannot run here says why (its probe's sentence).
        self.inner.tiers.get(spec.tier)?;
        let capacity = self.config().capacity;
        if spec.limits.memory_bytes > capacity.memory_bytes {
            return Err(DaemonError::BadInput(format!(
                "memory limit {} bytes is more than this machine has ({} bytes)",
                spec.limits.memory_bytes, capacity.memory_bytes
            )));
        }
        if spec.limits.disk_bytes > capacity.memory_bytes {
            return Err(DaemonError::BadInput(format!(
                "disk limit {} bytes is more than this machine can hold in memory ({} bytes)",
                spec.limits.disk_bytes, capacity.memory_bytes
            )));
        }
        if spec.limits.cpu_millis > capacity.cpu_millis {
            return Err(DaemonError::BadInput(format!(
                "cpu limit {} is more than this machine's {} CPUs",
                f64::from(spec.limits.cpu_millis) / 1000.0,
                capacity.cpu_millis / 1000
            )));
        }
        if spec.timeout_ms > self.config().max_timeout.as_millis() as u64 {
            return Err(DaemonError::BadInput(format!(
                "timeout must be at most {} s",
                self.config().max_timeout.as_secs()
            )));
        }
        for mount in &spec.mounts {
            let allowed = mount
                .source
                .canonicalize()
                .ok()
                .filter(|real| *real == mount.source)
                .is_some_and(|real| {
                    self.config()
                        .mount_roots
                        .iter()
                        .any(|root| real.starts_with(root))
                });
            if !allowed {
                return Err(DaemonError::BadInput(format!(
                    "host path {} may not be mounted: it must be a canonical path under a directory the daemon allows (--allow-mount)",
                    mount.source.display()
                )));
            }
        }
        if let (airlock_policy::LayerBacking::Disk, Some(store)) =
            (spec.limits.layer, &self.config().disk_store)
        {
            let size = rustix::fs::statvfs(store.as_path())
                .map(|s| s.f_blocks.saturating_mul(s.f_frsize))
                .unwrap_or(u64::MAX);
            if spec.limits.disk_bytes > size {
                return Err(DaemonError::BadInput(format!(
                    "limits.disk: {} bytes is more than the disk store holds ({size} bytes)",
                    spec.limits.disk_bytes
                )));
            }
        }
        let registered = match &spec.template {
            Template::Host => true,
            Template::Dir { path } => path.starts_with(self.config().data_dir.join("templates")),
            Template::Layers { layers } => {
                let store = self.config().data_dir.join("layers").join("sha256");
                layers.iter().all(|l| l.parent() == Some(store.as_path()))
            }
        };
        if !registered {
            return Err(DaemonError::BadInput(
                "templates must be registered with the daemon".into(),
            ));
        }
        Ok(())
    }

    /// Creates and starts a sandbox for `owner`. Waits in the admission
    /// queue when every create slot is busy.
    pub async fn create(
        &self,
        owner: &KeyRow,
        request: NewSandboxRequest,
        request_id: &str,
    ) -> Result<Created, DaemonError> {
        self.create_started(owner, request, None, request_id).await
    }

    /// [`Daemon::create`], then `startup` (the template's start and ready
    /// commands, see [`crate::startup`]) before the sandbox is handed out.
    pub async fn create_started(
        &self,
        owner: &KeyRow,
        request: NewSandboxRequest,
        startup: Option<crate::startup::Startup>,
        request_id: &str,
    ) -> Result<Created, DaemonError> {
        let mut request = request;
        if self.config().disk_store.is_some() {
            request.spec.limits.layer = airlock_policy::LayerBacking::Disk;
        }
        if let Err(e) = self
            .check_request(&request.spec)
            .and_then(|()| self.check_volumes(owner, &request.spec.volumes))
        {
            self.inner.audit.record(
                Stream::Security,
                "sandbox.refused",
                None,
                Some(request_id),
                json!({"key_id": owner.id, "reason": e.to_string()}),
            );
            return Err(e);
        }
        let permit = match self.inner.admission.admit(&owner.id).await {
            Ok(permit) => permit,
            Err(rejected) => {
                self.inner.metrics.rejected.inc();
                self.inner.audit.record(
                    Stream::Security,
                    "sandbox.rejected",
                    None,
                    Some(request_id),
                    json!({"key_id": owner.id, "reason": rejected.reason.to_string()}),
                );
                return Err(DaemonError::Rejected(rejected));
            }
        };
        let started = Instant::now();
        // A warm pool's member, if one fits: claimed, it is handed out as
        // this create's sandbox.
        let permit = match self.inner.pools.take(&request.spec, &self.inner.metrics) {
            Some(member) => match self
                .claim(
                    member,
                    owner,
                    &request,
                    permit,
                    startup.as_ref(),
                    started,
                    request_id,
                )
                .await
            {
                Claim::HandedOut(created) => return created,
                Claim::Unusable(permit) => permit,
            },
            None => permit,
        };
        let spec = request.spec;
        let backend = Arc::clone(self.inner.tiers.get(spec.tier)?);
        let (id, access_token) = self
            .record_creating(
                &backend,
                &owner.id,
                &spec,
                &request.template_name,
                &request.metadata,
                &request.layers,
            )
            .await?;
        let tier = spec.tier.as_str().to_owned();
        // The launch runs in a task of its own: a client that goes away
        // (its request future dropped) must not cancel a backend half-way
        // through starting a sandbox, which would leave what it started
        // running and recorded as creating. The task sees the requester is
        // gone once the sandbox is up, and tears it down.
        let (requester, requester_gone) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn({
            let daemon = self.clone();
            let owner = owner.clone();
            let request_id = request_id.to_owned();
            let started_at = Launching {
                owner,
                template_name: request.template_name,
                tier,
                spec,
                permit,
                started,
                access_token,
                request_id,
                startup,
                requester_gone,
            };
            async move { daemon.launch(id, started_at).await }
        });
        let created = task.await;
        drop(requester);
        created.unwrap_or_else(|e| {
            Err(DaemonError::Internal(format!(
                "the create task ended without an answer: {e}"
            )))
        })
    }

    /// Records a sandbox being created for `owner_id` and counts it as
    /// recorded; its id and access token.
    pub(crate) async fn record_creating(
        &self,
        backend: &Arc<dyn airlock_backend::Backend>,
        owner_id: &str,
        spec: &SandboxSpec,
        template_name: &str,
        metadata: &BTreeMap<String, String>,
        layers: &[String],
    ) -> Result<(String, String), DaemonError> {
        let id = backend.reserve_id(spec);
        // Derived, not drawn, so dialects can hand it out again (see tokens).
        let access_token = self.inner.token_key.token_for(&id);
        let now = now_ms();
        let spec_json = serde_json::to_string(spec)
            .map_err(|e| DaemonError::Internal(format!("cannot encode the spec: {e}")))?;
        // The layers are recorded with the row, before a collection could
        // take them (the template may be removed while this one runs).
        let inserted = {
            let _layers = self.inner.layers_lock.read().await;
            self.with_store(|s| {
                s.insert_sandbox(&NewSandbox {
                    id: id.clone(),
                    tier: spec.tier.as_str().to_owned(),
                    template: template_name.to_owned(),
                    spec_json,
                    metadata: metadata.clone(),
                    owner_key_id: owner_id.to_owned(),
                    access_token_hash: airlock_store::hash_secret(&access_token),
                    created_at: now,
                    expires_at: now.saturating_add(spec.timeout_ms as i64),
                    resources_json: None,
                    layers: layers.to_vec(),
                })
            })
        };
        if let Err(e) = inserted {
            backend.unreserve(&id);
            return Err(e.into());
        }
        self.inner
            .creating
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id.clone());
        Ok((id, access_token))
    }

    /// Hands warm pool member `member` out as `owner`'s create `request`:
    /// the record becomes the claimer's (owner, template name, spec,
    /// metadata, token, times), its limits and deadline are the request's,
    /// and the rest of a create (registration, egress path with the
    /// request's policy, startup) runs as for a sandbox just started. A
    /// member that died or cannot take the request's limits is torn down
    /// and the permit given back for a create of its own.
    #[allow(clippy::too_many_arguments)]
    async fn claim(
        &self,
        member: crate::pools::Member,
        owner: &KeyRow,
        request: &NewSandboxRequest,
        permit: CreatePermit,
        startup: Option<&crate::startup::Startup>,
        started: Instant,
        request_id: &str,
    ) -> Claim {
        let crate::pools::Member {
            id,
            mut launch,
            mut instance,
            spec: member_spec,
            ..
        } = member;
        let spec = request.spec.clone();
        let unusable = |why: String| {
            tracing::warn!("warm pool member {id} cannot be claimed: {why}");
        };
        if futures_util::FutureExt::now_or_never(&mut instance.ended).is_some() {
            unusable("it ended".into());
            launch.abandon().await;
            return Claim::Unusable(permit);
        }
        let limits = (spec.limits.memory_bytes, spec.limits.cpu_millis);
        if limits
            != (
                member_spec.limits.memory_bytes,
                member_spec.limits.cpu_millis,
            )
        {
            let resized = match self.inner.tiers.get(spec.tier) {
                Ok(backend) => backend
                    .resize(&id, &instance.resources, limits.0, limits.1)
                    .await
                    .map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            if let Err(e) = resized {
                unusable(e);
                launch.abandon().await;
                return Claim::Unusable(permit);
            }
        }
        let access_token = self.inner.token_key.token_for(&id);
        let now = now_ms();
        let expires_at = now.saturating_add(spec.timeout_ms as i64);
        let claimed = serde_json::to_string(&spec)
            .map_err(|e| DaemonError::Internal(format!("cannot encode the spec: {e}")))
            .and_then(|spec_json| {
                self.with_store(|s| {
                    s.claim_sandbox(&NewSandbox {
                        id: id.clone(),
                        tier: spec.tier.as_str().to_owned(),
                        template: request.template_name.clone(),
                        spec_json,
                        metadata: request.metadata.clone(),
                        owner_key_id: owner.id.clone(),
                        access_token_hash: airlock_store::hash_secret(&access_token),
                        created_at: now,
                        expires_at,
                        resources_json: None,
                        layers: Vec::new(),
                    })
                })
                .map_err(DaemonError::from)
            })
            .and_then(|()| {
                self.with_store(|s| s.get_sandbox(&id))
                    .map_err(DaemonError::from)
            })
            .and_then(|row| match row {
                Some(row) => self.hand_deadline(&row, expires_at).map(|_| ()),
                None => Err(not_found(&id)),
            });
        if let Err(e) = claimed {
            unusable(e.to_string());
            launch.abandon().await;
            return Claim::Unusable(permit);
        }
        launch.claimed(permit, request_id);
        self.inner.audit.record(
            Stream::Runtime,
            "pool.claimed",
            Some(&id),
            Some(request_id),
            json!({"key_id": owner.id, "template": request.template_name}),
        );
        let tier = spec.tier.as_str().to_owned();
        let handed = self
            .hand_out(
                &mut launch,
                owner,
                &request.template_name,
                &tier,
                spec,
                instance,
                started,
                startup,
            )
            .await;
        Claim::HandedOut(launch.settle(handed, access_token).await)
    }

    /// The part of a create from the backend's launch on (see
    /// [`Daemon::create`], which runs it as a task of its own).
    async fn launch(&self, id: String, launching: Launching) -> Result<Created, DaemonError> {
        let Launching {
            owner,
            template_name,
            tier,
            spec,
            permit,
            started,
            access_token,
            request_id,
            startup,
            mut requester_gone,
        } = launching;
        let owner = &owner;
        let request_id = request_id.as_str();
        let created = match self.inner.tiers.get(spec.tier) {
            Ok(backend) => backend.create(&id, &spec).await,
            Err(e) => Err(CreateError::BadInput(e.to_string())),
        };
        let instance = match created {
            Ok(instance) => instance,
            Err(e) => {
                // The backend released what the launch took.
                let _ = self.transition(&id, State::Creating, Action::Failed);
                self.forget_creating(&id);
                self.record_create_failed(&id, request_id, &e.to_string());
                return Err(create_error(&id, e));
            }
        };
        // From here on the sandbox runs: whatever fails before it is handed
        // out, the launch guard destroys it and only then gives the permit
        // back (also when this future is dropped, e.g. by a client that
        // went away).
        let mut launch = Launch::new(self, &id, &instance.resources, permit, request_id);
        match self
            .hand_out(
                &mut launch,
                owner,
                &template_name,
                &tier,
                spec,
                instance,
                started,
                startup.as_ref(),
            )
            .await
        {
            Ok(_)
                if requester_gone
                    .try_recv()
                    .is_err_and(|e| e == TryRecvError::Closed) =>
            {
                // Nobody is waiting for it: it would run unknown to anyone
                // until its timeout.
                launch.set_reason(DeadReason::CreateFailed);
                launch.abandon().await;
                Err(DaemonError::NotRunning(id))
            }
            handed => launch.settle(handed, access_token).await,
        }
    }

    /// The part of a create after the backend started the sandbox: records
    /// what it holds, registers it, attaches its egress path and records it
    /// running. Any error leaves `launch` armed: its owner tears the
    /// sandbox down.
    #[allow(clippy::too_many_arguments)]
    async fn hand_out(
        &self,
        launch: &mut Launch,
        owner: &KeyRow,
        template_name: &str,
        tier: &str,
        spec: SandboxSpec,
        instance: airlock_backend::Instance,
        started: Instant,
        startup: Option<&crate::startup::Startup>,
    ) -> Result<SandboxRow, DaemonError> {
        let id = launch.id().to_owned();
        let request_id = launch.request_id().to_owned();
        let resources_json = serde_json::to_string(&instance.resources).ok();
        let egress_point = instance.egress.clone();
        self.with_store(|s| s.set_resources(&id, resources_json.as_deref()))?;
        // A timeout set while it was starting is handed on now (see
        // `set_timeout`): the backend was started with the spec's.
        if let Some(row) = self.with_store(|s| s.get_sandbox(&id))? {
            if row.expires_at != row.created_at.saturating_add(spec.timeout_ms as i64) {
                self.hand_deadline(&row, row.expires_at)?;
            }
        }
        let (sandbox, ended) = LiveSandbox::new(
            id.clone(),
            owner.id.clone(),
            spec,
            instance,
            State::Creating,
            None,
        );
        launch.registered(&sandbox);
        self.watch_for_death(&sandbox, ended);
        // Without its egress path the sandbox could not reach what its
        // policy allows: it is not handed out.
        self.attach_egress(&sandbox, egress_point.as_ref())?;
        match self.transition(&id, State::Creating, Action::Started)? {
            Some(state) => sandbox.set_state(state),
            None => {
                // Stopped while it was being created: the guard finishes
                // that stop, with its reason.
                let stored = self
                    .with_store(|s| s.get_sandbox(&id))?
                    .map(|row| state_of(&row));
                launch.set_reason(
                    stored
                        .and_then(State::reason)
                        .unwrap_or(DeadReason::Deleted),
                );
                return Err(DaemonError::NotRunning(id));
            }
        }
        if let Some(startup) = startup {
            let bound = Duration::from_millis(sandbox.spec.timeout_ms);
            self.run_startup(&id, startup, bound, &request_id).await?;
        }
        let row = self
            .with_store(|s| s.get_sandbox(&id))?
            .ok_or_else(|| not_found(&id))?;
        let elapsed = started.elapsed();
        self.inner
            .metrics
            .create_seconds
            .observe(elapsed.as_secs_f64());
        self.inner.audit.record(
            Stream::Runtime,
            "sandbox.created",
            Some(&id),
            Some(&request_id),
            json!({
                "key_id": owner.id,
                "template": template_name,
                "tier": tier,
                "limits": sandbox.spec.limits,
                "timeout_ms": sandbox.spec.timeout_ms,
                "duration_ms": elapsed.as_millis() as u64,
            }),
        );
        Ok(row)
    }

    /// Tears down a sandbox whose create failed after the backend started
    /// it (see [`Launch`]), and records it dead.
    async fn unwind_create(&self, unwind: &Unwind) {
        match &unwind.live {
            // Registered: stopped the way a stop does, which releases its
            // lease once the teardown returned.
            Some(sandbox) => {
                let _teardown = sandbox.teardown.lock().await;
                let reason =
                    match self.mark_stopping(sandbox, unwind.reason, Some(&unwind.request_id)) {
                        Ok(Some(reason)) => reason,
                        // Dead already: a stop or its own death came first.
                        Ok(None) => return,
                        // The store fails: stopped all the same; the record is
                        // finished by the next start's reconciliation.
                        Err(e) => {
                            tracing::error!("stopping {} after its create failed: {e}", unwind.id);
                            sandbox.set_state(State::Stopping(unwind.reason));
                            unwind.reason
                        }
                    };
                self.finish_stop(sandbox, reason, Some(&unwind.request_id))
                    .await;
            }
            None => {
                if let Err(e) = self
                    .release_resources(&unwind.id, Some(&unwind.resources))
                    .await
                {
                    self.inner.metrics.teardown_failures.inc();
                    tracing::error!("{e}");
                }
                if let Err(e) = self.transition(&unwind.id, State::Creating, Action::Failed) {
                    tracing::error!("recording {} dead after its create failed: {e}", unwind.id);
                }
                self.forget_creating(&unwind.id);
                self.record_create_failed(
                    &unwind.id,
                    &unwind.request_id,
                    "the sandbox started but could not be recorded",
                );
            }
        }
    }

    /// Takes `id` off the set of sandboxes being created.
    /// Counts a death by `create_failed` and audits it with `error`.
    pub(crate) fn record_create_failed(&self, id: &str, request_id: &str, error: &str) {
        self.inner
            .metrics
            .deaths
            .get_or_create(&crate::metrics::ReasonLabel {
                reason: DeadReason::CreateFailed.as_str(),
            })
            .inc();
        self.inner.audit.record(
            Stream::Runtime,
            "sandbox.create_failed",
            Some(id),
            Some(request_id),
            json!({ "error": error }),
        );
    }

    pub(crate) fn forget_creating(&self, id: &str) {
        self.inner
            .creating
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
    }

    /// Puts a sandbox being created into the live registry.
    fn register_live(&self, sandbox: &Arc<LiveSandbox>) {
        self.inner
            .live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(sandbox.id.clone(), Arc::clone(sandbox));
        self.forget_creating(&sandbox.id);
    }

    /// Waits for the sandbox to end on its own and records how.
    pub(crate) fn watch_for_death(
        &self,
        sandbox: &Arc<LiveSandbox>,
        ended: airlock_backend::Ended,
    ) {
        let daemon = self.clone();
        let sandbox = Arc::clone(sandbox);
        tokio::spawn(async move {
            let ending = ended.await;
            daemon.on_death(&sandbox, ending).await;
        });
    }

    async fn on_death(&self, sandbox: &Arc<LiveSandbox>, ending: Ending) {
        let _teardown = sandbox.teardown.lock().await;
        let state = sandbox.state();
        if matches!(state, State::Stopping(_) | State::Dead(_)) {
            return; // a stop is (or was) in charge
        }
        if ending == Ending::Expired {
            // Its supervisor ended it at its deadline before the reaper did:
            // a timeout all the same.
            let reason = match self.mark_stopping(sandbox, DeadReason::Timeout, None) {
                Ok(Some(reason)) => reason,
                Ok(None) => return,
                Err(e) => {
                    tracing::error!("recording the timeout of {}: {e}", sandbox.id);
                    sandbox.set_state(State::Stopping(DeadReason::Timeout));
                    DeadReason::Timeout
                }
            };
            self.finish_stop(sandbox, reason, None).await;
            return;
        }
        let reason = match ending {
            Ending::Oom => DeadReason::Oom,
            _ => DeadReason::Crashed,
        };
        // Creating is not a death the state machine allows; the creator
        // finds out when its `Started` fails.
        let mut from = state;
        if from == State::Creating {
            if let Ok(Some(stopping)) =
                self.transition(&sandbox.id, from, Action::Stop(DeadReason::Crashed))
            {
                from = stopping;
            }
        }
        if reason == DeadReason::Oom {
            self.inner.metrics.oom_kills.inc();
            self.inner.audit.record(
                Stream::Security,
                "sandbox.oom",
                Some(&sandbox.id),
                None,
                json!({"memory_bytes": sandbox.spec.limits.memory_bytes}),
            );
        }
        self.release(sandbox, from, reason, None).await;
    }

    /// Stops a sandbox for `reason` and waits until everything it held is
    /// released. A sandbox that is already dead is a success.
    pub async fn stop(
        &self,
        id: &str,
        reason: DeadReason,
        request_id: Option<&str>,
    ) -> Result<(), DaemonError> {
        let Some(sandbox) = self.live_sandbox(id) else {
            return self.stop_unconnected(id, reason).await;
        };
        let _teardown = sandbox.teardown.lock().await;
        let Some(reason) = self.mark_stopping(&sandbox, reason, request_id)? else {
            return Ok(());
        };
        self.finish_stop(&sandbox, reason, request_id).await;
        Ok(())
    }

    /// Like [`Daemon::stop`], but returns once the sandbox is recorded
    /// `stopping` (hidden from listings, refusing calls into it) and
    /// leaves the teardown to a task: the caller does not wait for the
    /// processes to die and the mounts and cgroups to go. The sandbox keeps
    /// counting against the caps until its resources are released. A daemon
    /// that stops before the task ends leaves the row `stopping`, which the
    /// next start's reconciliation finishes.
    pub async fn stop_in_background(
        &self,
        id: &str,
        reason: DeadReason,
        request_id: Option<&str>,
    ) -> Result<(), DaemonError> {
        let Some(sandbox) = self.live_sandbox(id) else {
            return self.stop_unconnected(id, reason).await;
        };
        let reason = {
            let _teardown = sandbox.teardown.lock().await;
            match self.mark_stopping(&sandbox, reason, request_id)? {
                Some(reason) => reason,
                None => return Ok(()),
            }
        };
        let daemon = self.clone();
        let request_id = request_id.map(str::to_owned);
        tokio::spawn(async move {
            let _teardown = sandbox.teardown.lock().await;
            // A stop that got the lock first finished the job.
            if !sandbox.state().is_dead() {
                daemon
                    .finish_stop(&sandbox, reason, request_id.as_deref())
                    .await;
            }
        });
        Ok(())
    }

    /// Records a live sandbox `stopping` for `reason` (the caller holds its
    /// teardown lock). `None` when it is dead already; else the reason the
    /// stop carries (a concurrent stop's, if one came first).
    fn mark_stopping(
        &self,
        sandbox: &LiveSandbox,
        reason: DeadReason,
        request_id: Option<&str>,
    ) -> Result<Option<DeadReason>, DaemonError> {
        let id = sandbox.id.as_str();
        let state = sandbox.state();
        if state.is_dead() {
            return Ok(None);
        }
        let stopping = match self.transition(id, state, Action::Stop(reason))? {
            Some(stopping) => stopping,
            // The row moved under us (a concurrent creator); take what it says.
            None => State::Stopping(reason),
        };
        sandbox.set_state(stopping);
        if reason == DeadReason::Timeout {
            self.inner.audit.record(
                Stream::Security,
                "sandbox.timeout_kill",
                Some(id),
                request_id,
                json!({"timeout_ms": sandbox.spec.timeout_ms}),
            );
        }
        Ok(Some(stopping.reason().unwrap_or(reason)))
    }

    /// Teardown and the final transition of a sandbox in `Stopping`.
    async fn finish_stop(
        &self,
        sandbox: &Arc<LiveSandbox>,
        reason: DeadReason,
        request_id: Option<&str>,
    ) {
        if sandbox.spec.collect_outputs {
            self.collect_at_teardown(sandbox, reason, request_id).await;
        }
        self.release(sandbox, State::Stopping(reason), reason, request_id)
            .await;
    }

    /// Copies a stopping sandbox's outputs (see [`crate::outputs`]), thawed
    /// first if it was paused, within [`crate::outputs::TEARDOWN_BOUND`].
    async fn collect_at_teardown(
        &self,
        sandbox: &Arc<LiveSandbox>,
        reason: DeadReason,
        request_id: Option<&str>,
    ) {
        if let Ok(backend) = self.inner.tiers.of(&sandbox.resources) {
            // Not paused: nothing to thaw, and the answer says so.
            let _ = backend.resume(&sandbox.id, &sandbox.resources).await;
        }
        let request_id = request_id.unwrap_or("teardown");
        let collecting = self.collect_outputs_of(sandbox, reason.as_str(), request_id);
        if tokio::time::timeout(crate::outputs::TEARDOWN_BOUND, collecting)
            .await
            .is_err()
        {
            self.inner.audit.record(
                Stream::Runtime,
                "outputs.failed",
                Some(&sandbox.id),
                Some(request_id),
                json!({"why": reason.as_str(), "error": format!(
                    "not done within {} s of the teardown",
                    crate::outputs::TEARDOWN_BOUND.as_secs()
                )}),
            );
        }
    }

    /// Releases every host resource of a sandbox, then records it dead
    /// (from `from`, by `Exited(reason)`) and forgets it. The record says
    /// dead only once nothing is left; a teardown that fails is counted and
    /// logged, and the next start's reconciliation retries it.
    async fn release(
        &self,
        sandbox: &Arc<LiveSandbox>,
        from: State,
        reason: DeadReason,
        request_id: Option<&str>,
    ) {
        if let Err(e) = self
            .release_resources(&sandbox.id, Some(&sandbox.resources))
            .await
        {
            self.inner.metrics.teardown_failures.inc();
            tracing::error!("{e}");
        }
        let dead = match self.transition(&sandbox.id, from, Action::Exited(reason)) {
            Ok(Some(dead)) => dead,
            _ => State::Dead(reason),
        };
        sandbox.set_state(dead);
        self.inner
            .live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&sandbox.id);
        drop(
            sandbox
                .lease
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take(),
        );
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
            Some(&sandbox.id),
            request_id,
            json!({"reason": reason.as_str()}),
        );
    }

    /// Stop of a sandbox with no live connection: one being created (wait
    /// for its creator to finish the stop), one whose adoption is retried
    /// (its task finishes the stop), or one already dead.
    async fn stop_unconnected(&self, id: &str, reason: DeadReason) -> Result<(), DaemonError> {
        let Some(row) = self.with_store(|s| s.get_sandbox(id))? else {
            return Err(not_found(id));
        };
        let state = state_of(&row);
        if state.is_dead() {
            return Ok(());
        }
        if state == State::Creating {
            let _ = self.transition(id, State::Creating, Action::Stop(reason))?;
        }
        if row.is_paused_files_only() && !self.inner.resuming.busy(id) {
            return self.stop_files_only(&row, reason, None);
        }
        if let Some(adopting) = self.adopting(id) {
            // Recorded but not adopted yet: its adoption task finishes the
            // stop.
            if matches!(state, State::Running | State::Paused) {
                let _ = self.transition(id, state, Action::Stop(reason))?;
            }
            adopting.notify_one();
        }
        let deadline = Instant::now() + CREATING_WAIT;
        while Instant::now() < deadline {
            if self.live_sandbox(id).is_some() {
                // The creator registered it meanwhile; a normal stop follows.
                return Box::pin(self.stop(id, reason, None)).await;
            }
            let row = self.with_store(|s| s.get_sandbox(id))?;
            match row {
                None => return Ok(()),
                Some(row) if state_of(&row).is_dead() => return Ok(()),
                // A resume that failed left it paused files-only again.
                Some(row) if row.is_paused_files_only() && !self.inner.resuming.busy(id) => {
                    return self.stop_files_only(&row, reason, None);
                }
                Some(_) => {}
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Err(DaemonError::Internal(format!(
            "{id} did not finish stopping"
        )))
    }

    /// The record of `id` if `key` may see it (its owner, or an admin).
    pub fn get(&self, key: &KeyRow, id: &str) -> Result<SandboxRow, DaemonError> {
        match self.with_store(|s| s.get_sandbox(id))? {
            Some(row) if row.owner_key_id == airlock_store::POOL_KEY_ID => Err(not_found(id)),
            Some(row) if key.is_admin || row.owner_key_id == key.id => Ok(row),
            _ => Err(not_found(id)),
        }
    }

    /// Whether `key` may see sandbox `id` (its owner, or an admin): from
    /// the live registry when it is connected, so the data-plane hot path
    /// reads no row; from the store otherwise.
    pub fn visible(&self, key: &KeyRow, id: &str) -> Result<(), DaemonError> {
        match self.live_sandbox(id) {
            Some(sandbox) if key.is_admin || sandbox.owner == key.id => Ok(()),
            Some(_) => Err(not_found(id)),
            None => self.get(key, id).map(drop),
        }
    }

    /// Whether `token` is the access token of `id`.
    pub fn access_token_matches(&self, id: &str, token: &str) -> bool {
        self.with_store(|s| s.verify_access_token(id, token))
            .unwrap_or(false)
    }

    /// The live sandbox whose access token is `token`, if any.
    pub fn sandbox_with_token(&self, token: &str) -> Option<String> {
        if !token.starts_with("at_") {
            return None;
        }
        self.with_store(|s| s.live_sandbox_with_token(token))
            .ok()
            .flatten()
    }

    /// The access token of `id`, given out again (e2b's `connect` answers
    /// with it). `None` for a sandbox whose token was not derived from this
    /// daemon's token key (one created before tokens were derived).
    pub fn access_token(&self, id: &str) -> Option<String> {
        let token = self.inner.token_key.token_for(id);
        self.access_token_matches(id, &token).then_some(token)
    }

    /// Serves the egress path of `sandbox` if its policy lets anything
    /// out, where its tier says its traffic leaves it.
    pub(crate) fn attach_egress(
        &self,
        sandbox: &Arc<LiveSandbox>,
        point: Option<&airlock_backend::EgressPoint>,
    ) -> Result<(), DaemonError> {
        if sandbox.spec.network.is_none() {
            return Ok(());
        }
        let Some(airlock_backend::EgressPoint::Netns(netns)) = point else {
            return Err(DaemonError::Internal(format!(
                "{}'s tier gave no point to serve its network at",
                sandbox.id
            )));
        };
        let attachment = self
            .inner
            .egress
            .attach(&sandbox.id, netns, sandbox.spec.network.clone())
            .map_err(|e| DaemonError::Internal(format!("egress of {}: {e}", sandbox.id)))?;
        *sandbox.egress.lock().unwrap_or_else(|p| p.into_inner()) = Some(attachment);
        Ok(())
    }

    /// Ids of the running sandboxes.
    pub fn running_ids(&self) -> Vec<String> {
        self.inner
            .live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter(|s| s.state() == State::Running)
            .map(|s| s.id.clone())
            .collect()
    }

    /// The access token `id` has if it was derived from this daemon's
    /// token key (no store lookup: for matching signatures, where a
    /// sandbox with another token simply does not match).
    pub fn derived_access_token(&self, id: &str) -> String {
        self.inner.token_key.token_for(id)
    }

    /// The traffic token of `id` (see [`crate::tokens::TokenKey::traffic_token_for`]).
    pub fn traffic_token(&self, id: &str) -> String {
        self.inner.token_key.traffic_token_for(id)
    }

    /// Whether `token` is the traffic token of `id`.
    pub fn traffic_token_matches(&self, id: &str, token: &str) -> bool {
        crate::tokens::same_secret(&self.traffic_token(id), token)
    }

    /// Pauses sandbox `id` (one `key` may see), keeping what `mode` says;
    /// its tier does it or says it cannot (501). A paused sandbox refuses
    /// calls into it (409) until [`Daemon::resume`], and is kept for the
    /// paused TTL rather than its timeout.
    pub async fn pause(
        &self,
        key: &KeyRow,
        id: &str,
        mode: crate::PauseMode,
    ) -> Result<(), DaemonError> {
        self.visible(key, id)?;
        self.pause_live(id, mode).await
    }

    async fn pause_live(&self, id: &str, mode: crate::PauseMode) -> Result<(), DaemonError> {
        if mode == crate::PauseMode::Filesystem {
            return self.pause_files_only(id).await;
        }
        let sandbox = self.running(id)?;
        let backend = Arc::clone(self.inner.tiers.get(sandbox.spec.tier)?);
        let _teardown = sandbox.teardown.lock().await;
        if sandbox.state() != State::Running {
            return Err(DaemonError::NotRunning(id.to_owned()));
        }
        // No connection from outside stays open across a pause: a
        // checkpoint cannot save one the agent holds, and its client would
        // wait on a frozen sandbox.
        sandbox.tunnels.close_all().await;
        backend
            .pause(id, &sandbox.resources, mode)
            .await
            .map_err(state_error)?;
        self.move_state(&sandbox, State::Running, State::Paused)?;
        self.expire_in_from_now(id, self.config().paused_ttl)?;
        self.inner.audit.record(
            Stream::Runtime,
            "sandbox.paused",
            Some(id),
            None,
            json!({"mode": mode.as_str()}),
        );
        Ok(())
    }

    /// Resumes sandbox `id` (one `key` may see) that [`Daemon::pause`]
    /// paused; 409 for one that is not paused. It has its own timeout
    /// again, from now.
    pub async fn resume(&self, key: &KeyRow, id: &str) -> Result<(), DaemonError> {
        self.visible(key, id)?;
        self.resume_live(id).await
    }

    async fn resume_live(&self, id: &str) -> Result<(), DaemonError> {
        let _resuming = self.inner.resuming.lock(id).await;
        let Some(sandbox) = self.live_sandbox(id) else {
            let row = self.recorded(id)?;
            if row.is_paused_files_only() {
                return self.boot_files_only(row).await;
            }
            return Err(DaemonError::NotRunning(id.to_owned()));
        };
        let backend = Arc::clone(self.inner.tiers.get(sandbox.spec.tier)?);
        let _teardown = sandbox.teardown.lock().await;
        if sandbox.state() != State::Paused {
            return Err(DaemonError::Conflict(format!("sandbox {id} is not paused")));
        }
        backend
            .resume(id, &sandbox.resources)
            .await
            .map_err(state_error)?;
        // Running means answering: a tier may call a restore done before
        // its runtime has finished it (runsc reports the container made,
        // then reads the memory image), and a restore that fails after
        // that would otherwise be found by the next call, as a sandbox
        // that is not running.
        answers(id, sandbox.agent()).await.map_err(state_error)?;
        self.move_state(&sandbox, State::Paused, State::Running)?;
        self.expire_in_from_now(id, Duration::from_millis(sandbox.spec.timeout_ms))?;
        self.inner.audit.record(
            Stream::Runtime,
            "sandbox.resumed",
            Some(id),
            None,
            json!({}),
        );
        Ok(())
    }

    /// Resumes sandbox `id` (one `key` may see) on its files with fresh
    /// processes, whatever its pause kept (e2b's `on_resume="reboot"`): one
    /// paused with its memory is paused keeping only its files first (see
    /// [`crate::files_only`]). 409 for one that is not paused.
    pub async fn reboot(&self, key: &KeyRow, id: &str) -> Result<(), DaemonError> {
        self.visible(key, id)?;
        if self.is_paused_with_memory(id) {
            match self.pause_files_only(id).await {
                // Resumed meanwhile, or paused files-only by another call.
                Ok(()) | Err(DaemonError::Conflict(_)) => {}
                Err(e) => return Err(e),
            }
        }
        self.resume_live(id).await
    }

    /// Whether live sandbox `id` is paused with its memory kept.
    fn is_paused_with_memory(&self, id: &str) -> bool {
        self.live_sandbox(id)
            .is_some_and(|s| s.state() == State::Paused)
    }

    /// Whether sandbox `id` is paused, with its memory or only its files
    /// (a cheap look at the registry for a live one).
    pub fn is_paused(&self, id: &str) -> bool {
        match self.live_sandbox(id) {
            Some(sandbox) => sandbox.state() == State::Paused,
            None => self
                .with_store(|s| s.get_sandbox(id))
                .ok()
                .flatten()
                .is_some_and(|row| row.is_paused_files_only()),
        }
    }

    /// Resumes sandbox `id` when it is paused and its lifecycle lets a call
    /// wake it (`auto_resume`); whether it is running now.
    pub async fn wake(&self, id: &str) -> bool {
        let Some(sandbox) = self.live_sandbox(id) else {
            let wakes = self
                .with_store(|s| s.get_sandbox(id))
                .ok()
                .flatten()
                .filter(SandboxRow::is_paused_files_only)
                .and_then(|row| serde_json::from_str::<SandboxSpec>(&row.spec_json).ok())
                .is_some_and(|spec| spec.lifecycle.auto_resume);
            return wakes
                && match self.resume_live(id).await {
                    Ok(()) => true,
                    Err(e) => {
                        tracing::warn!("cannot wake {id}: {e}");
                        self.live_sandbox(id)
                            .is_some_and(|s| s.state() == State::Running)
                    }
                };
        };
        match sandbox.state() {
            State::Running => true,
            State::Paused if sandbox.spec.lifecycle.auto_resume => match self.resume_live(id).await
            {
                Ok(()) => true,
                // Resumed by another call meanwhile.
                Err(DaemonError::Conflict(_)) => sandbox.state() == State::Running,
                Err(e) => {
                    tracing::warn!("cannot wake {id}: {e}");
                    false
                }
            },
            _ => false,
        }
    }

    /// Records that the live `sandbox` went from `from` to `to` (neither
    /// dead nor stopping), in the store and the registry.
    fn move_state(&self, sandbox: &LiveSandbox, from: State, to: State) -> Result<(), DaemonError> {
        let (from, _) = columns(from);
        let (column, _) = columns(to);
        self.with_store(|s| s.set_state(&sandbox.id, Some(from), column, None))?;
        sandbox.set_state(to);
        Ok(())
    }

    /// Resource usage of the running sandbox `id` so far, when its backend
    /// can tell.
    pub async fn usage(&self, id: &str) -> Option<airlock_backend::Usage> {
        let sandbox = self.live_sandbox(id)?;
        let backend = std::sync::Arc::clone(self.inner.tiers.get(sandbox.spec.tier).ok()?);
        backend.usage(id).await
    }

    /// One page of the sandboxes `key` may see.
    pub fn list(
        &self,
        key: &KeyRow,
        mut query: ListQuery,
    ) -> Result<Page<SandboxRow>, DaemonError> {
        if key.is_admin {
            // Warm pool members are nobody's until claimed.
            query.except_owner_key_id = Some(airlock_store::POOL_KEY_ID.to_owned());
        } else {
            query.owner_key_id = Some(key.id.clone());
        }
        Ok(self.with_store(|s| s.list_sandboxes(&query))?)
    }

    /// Makes `id` expire `timeout` from now.
    pub fn set_timeout(
        &self,
        key: &KeyRow,
        id: &str,
        timeout: Duration,
    ) -> Result<SandboxRow, DaemonError> {
        let row = self.get(key, id)?;
        if state_of(&row).is_dead() {
            return Err(DaemonError::NotRunning(id.to_owned()));
        }
        if timeout.is_zero() || timeout > self.config().max_timeout {
            return Err(DaemonError::BadInput(format!(
                "timeout must be between 1 s and {} s",
                self.config().max_timeout.as_secs()
            )));
        }
        self.expire_in(&row, timeout)
    }

    /// Makes live sandbox `id` expire `after` from now, whatever its
    /// limits.
    pub(crate) fn expire_in_from_now(&self, id: &str, after: Duration) -> Result<(), DaemonError> {
        let row = self.recorded(id)?;
        self.expire_in(&row, after).map(drop)
    }

    /// The record of `id`, whoever may see it.
    pub(crate) fn recorded(&self, id: &str) -> Result<SandboxRow, DaemonError> {
        self.with_store(|s| s.get_sandbox(id))?
            .ok_or_else(|| not_found(id))
    }

    /// Makes the sandbox of `row` expire `after` from now, whatever its
    /// limits.
    fn expire_in(&self, row: &SandboxRow, after: Duration) -> Result<SandboxRow, DaemonError> {
        let id = row.id.as_str();
        let expires_at =
            now_ms().saturating_add(i64::try_from(after.as_millis()).unwrap_or(i64::MAX));
        // The supervisor learns the deadline first: if the store write
        // fails after it, the sandbox lives no shorter than its record says.
        let handed = self.hand_deadline(row, expires_at)?;
        self.with_store(|s| s.set_expiry(id, expires_at))?;
        let row = self.recorded(id)?;
        if !handed {
            // It was still starting. Either the create records its
            // resources before reading this expiry (then they are in `row`
            // now) or it reads the expiry written above and hands it on.
            self.hand_deadline(&row, expires_at)?;
        }
        Ok(row)
    }

    /// Hands the deadline `at_ms` of the sandbox recorded in `row` to its
    /// owner, which enforces it even without a daemon. A sandbox that
    /// records no resources yet is still starting, with the spec's timeout:
    /// then nothing is handed and the answer is `false`.
    pub(crate) fn hand_deadline(&self, row: &SandboxRow, at_ms: i64) -> Result<bool, DaemonError> {
        let resources = match self.live_sandbox(&row.id) {
            Some(sandbox) => Some(sandbox.resources.clone()),
            None => row
                .resources_json
                .as_deref()
                .and_then(|j| serde_json::from_str::<Resources>(j).ok()),
        };
        let Some(resources) = resources else {
            return Ok(false);
        };
        self.inner
            .tiers
            .of(&resources)?
            .set_deadline(&row.id, &resources, at_ms)
            .map_err(|e| DaemonError::Internal(format!("{e}: {}", e.source)))?;
        Ok(true)
    }

    /// Releases everything sandbox `id` holds through the backend of the
    /// tier that recorded `resources`; with nothing recorded, every tier
    /// is asked (each removes what it finds of `id`, and nothing else).
    pub(crate) async fn release_resources(
        &self,
        id: &str,
        resources: Option<&Resources>,
    ) -> Result<(), airlock_backend::DestroyError> {
        match resources {
            Some(resources) => match self.inner.tiers.of(resources) {
                Ok(backend) => backend.destroy(id, Some(resources)).await,
                Err(e) => Err(airlock_backend::DestroyError {
                    id: id.to_owned(),
                    what: format!("everything: {e}"),
                }),
            },
            None => {
                for backend in self.inner.tiers.all() {
                    backend.destroy(id, None).await?;
                }
                Ok(())
            }
        }
    }

    /// The network policy in force in `id`.
    pub fn network_policy(
        &self,
        key: &KeyRow,
        id: &str,
    ) -> Result<airlock_policy::NetworkPolicy, DaemonError> {
        self.get(key, id)?;
        let sandbox = self.running(id)?;
        let attached = sandbox
            .egress
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(airlock_egress::Attachment::policy);
        Ok(attached.unwrap_or_else(|| sandbox.spec.network.clone()))
    }

    /// Replaces the network policy of the running sandbox `id`: new
    /// connections and lookups follow it at once (open connections keep
    /// going). A sandbox created with `none` has no egress path to give a
    /// policy to.
    pub fn set_network_policy(
        &self,
        key: &KeyRow,
        id: &str,
        policy: airlock_policy::NetworkPolicy,
        request_id: &str,
    ) -> Result<airlock_policy::NetworkPolicy, DaemonError> {
        self.get(key, id)?;
        let sandbox = self.running(id)?;
        policy
            .validate()
            .map_err(|e| DaemonError::BadInput(e.to_string()))?;
        let before =
            {
                let egress = sandbox.egress.lock().unwrap_or_else(|p| p.into_inner());
                match egress.as_ref() {
                    Some(attachment) => {
                        let before = attachment.policy();
                        attachment.set_policy(policy.clone());
                        before
                    }
                    None if policy.is_none() => return Ok(policy),
                    None => return Err(DaemonError::Conflict(
                        "this sandbox was created with network mode none and has no egress path; \
                         create a sandbox with the policy it needs"
                            .into(),
                    )),
                }
            };
        // Recorded, so a restarted daemon re-attaches with it.
        let spec = airlock_policy::SandboxSpec {
            network: policy.clone(),
            ..sandbox.spec.clone()
        };
        let json = serde_json::to_string(&spec)
            .map_err(|e| DaemonError::Internal(format!("cannot encode the spec: {e}")))?;
        self.with_store(|s| s.set_spec(id, &json))?;
        self.inner.audit.record(
            Stream::Security,
            "egress.policy_changed",
            Some(id),
            Some(request_id),
            json!({"from": before, "to": policy}),
        );
        Ok(policy)
    }

    /// Kills sandboxes whose time is up, forever (spawn it once).
    pub async fn run_reaper(self) {
        let mut tick = tokio::time::interval(REAPER_TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Sandboxes a task of the reaper is pausing or stopping: a pause
        // that saves memory to disk outlasts a tick, and a second task
        // finding the sandbox no longer running would stop what the first
        // just paused.
        let acting: Arc<std::sync::Mutex<HashSet<String>>> = Arc::default();
        loop {
            tick.tick().await;
            let expired = match self.with_store(|s| s.expired(now_ms())) {
                Ok(ids) => ids,
                Err(e) => {
                    tracing::error!("the reaper cannot read the store: {e}");
                    continue;
                }
            };
            for id in expired {
                if let Some(adopting) = self.adopting(&id) {
                    // Its adoption task stops it.
                    adopting.notify_one();
                    continue;
                }
                let stopping = self
                    .live_sandbox(&id)
                    .is_some_and(|s| matches!(s.state(), State::Stopping(_) | State::Dead(_)));
                if stopping {
                    continue;
                }
                // One that pauses at its timeout is paused (then kept for the
                // paused TTL, at whose end it is stopped), unless it cannot be.
                let pauses = self
                    .live_sandbox(&id)
                    .filter(|s| {
                        s.state() == State::Running
                            && s.spec.lifecycle.on_timeout == airlock_policy::OnTimeout::Pause
                    })
                    .map(|s| match s.spec.lifecycle.files_only {
                        true => crate::PauseMode::Filesystem,
                        false => crate::PauseMode::Memory,
                    });
                if !acting
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(id.clone())
                {
                    continue;
                }
                let daemon = self.clone();
                let acting = Arc::clone(&acting);
                tokio::spawn(async move {
                    let paused = match pauses {
                        Some(mode) => match daemon.pause_live(&id, mode).await {
                            Ok(()) => true,
                            Err(e) => {
                                tracing::warn!("{id} cannot be paused at its timeout: {e}");
                                false
                            }
                        },
                        None => false,
                    };
                    if !paused {
                        if let Err(e) = daemon.stop(&id, DeadReason::Timeout, None).await {
                            tracing::warn!("the reaper could not stop {id}: {e}");
                        }
                    }
                    acting.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
                });
            }
        }
    }
}

/// What a failed create must undo (see [`Launch`]).
struct Unwind {
    daemon: Daemon,
    id: String,
    resources: Resources,
    request_id: String,
    /// Why it is recorded dead: `create_failed`, or the reason of a stop
    /// that came while it was being created.
    reason: DeadReason,
    /// The live entry, once registered (it then holds the lease).
    live: Option<Arc<LiveSandbox>>,
    /// The admission permit (a warm pool member's: the lease it became),
    /// until the sandbox is registered.
    held: Option<Held>,
}

/// What a sandbox being created counts against admission with.
enum Held {
    /// A create's: its create slot and reserved live slot.
    Permit(CreatePermit),
    /// A warm pool member's, started and waiting for a claim: a live slot
    /// of the pools' key.
    Lease(LiveLease),
}

impl Unwind {
    async fn run(mut self) {
        self.daemon.unwind_create(&self).await;
        // Only now is the slot free again: the sandbox is gone.
        drop(self.held.take());
    }
}

/// A sandbox the backend started whose create has not finished. Unless
/// [`Launch::commit`]ted, it is torn down and recorded dead, and its
/// admission permit (or the lease it became) is given back only after
/// the teardown: by [`Launch::abandon`] on an error, or by a task when the
/// guard is dropped (the create's future was cancelled).
pub(crate) struct Launch(Option<Unwind>);

impl Launch {
    pub(crate) fn new(
        daemon: &Daemon,
        id: &str,
        resources: &Resources,
        permit: CreatePermit,
        request_id: &str,
    ) -> Launch {
        Launch(Some(Unwind {
            daemon: daemon.clone(),
            id: id.to_owned(),
            resources: resources.clone(),
            request_id: request_id.to_owned(),
            reason: DeadReason::CreateFailed,
            live: None,
            held: Some(Held::Permit(permit)),
        }))
    }

    /// A warm pool member waits for its claim: its create slot is given
    /// back, its live slot kept.
    pub(crate) fn wait_for_claim(&mut self) {
        if let Some(unwind) = self.0.as_mut() {
            if let Some(Held::Permit(permit)) = unwind.held.take() {
                unwind.held = Some(Held::Lease(permit.succeeded()));
            }
        }
    }

    /// A create claimed this warm pool member: from now on it counts
    /// against the claimer's `permit`, and its teardown is recorded under
    /// `request_id`.
    fn claimed(&mut self, permit: CreatePermit, request_id: &str) {
        if let Some(unwind) = self.0.as_mut() {
            unwind.held = Some(Held::Permit(permit));
            unwind.request_id = request_id.to_owned();
        }
    }

    fn id(&self) -> &str {
        self.0.as_ref().map_or("", |u| u.id.as_str())
    }

    fn request_id(&self) -> &str {
        self.0.as_ref().map_or("", |u| u.request_id.as_str())
    }

    /// Records `sandbox` live: from now on it holds the lease the permit
    /// becomes, and a stop releases both.
    fn registered(&mut self, sandbox: &Arc<LiveSandbox>) {
        let Some(unwind) = self.0.as_mut() else {
            return;
        };
        let lease = match unwind.held.take() {
            Some(Held::Permit(permit)) => Some(permit.succeeded()),
            Some(Held::Lease(lease)) => Some(lease),
            None => None,
        };
        if let Some(lease) = lease {
            *sandbox.lease.lock().unwrap_or_else(|p| p.into_inner()) = Some(lease);
        }
        unwind.daemon.register_live(sandbox);
        unwind.live = Some(Arc::clone(sandbox));
    }

    /// Sets why the sandbox is recorded dead if the create fails.
    fn set_reason(&mut self, reason: DeadReason) {
        if let Some(unwind) = self.0.as_mut() {
            unwind.reason = reason;
        }
    }

    /// The sandbox is handed out: nothing to undo.
    fn commit(mut self) {
        self.0 = None;
    }

    /// Ends a create by how handing the sandbox out went: committed with
    /// its record, or torn down.
    async fn settle(
        self,
        handed: Result<SandboxRow, DaemonError>,
        access_token: String,
    ) -> Result<Created, DaemonError> {
        match handed {
            Ok(row) => {
                self.commit();
                Ok(Created { row, access_token })
            }
            Err(e) => {
                self.abandon().await;
                Err(e)
            }
        }
    }

    /// Tears the sandbox down now and waits for it.
    pub(crate) async fn abandon(mut self) {
        if let Some(unwind) = self.0.take() {
            unwind.run().await;
        }
    }
}

impl Drop for Launch {
    fn drop(&mut self) {
        let Some(unwind) = self.0.take() else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(unwind.run());
            }
            Err(_) => tracing::error!(
                "{} was left running by a create cancelled outside the runtime",
                unwind.id
            ),
        }
    }
}

/// A tier's refusal to start sandbox `id`, as the daemon's.
pub(crate) fn create_error(id: &str, e: CreateError) -> DaemonError {
    match e {
        CreateError::BadInput(message) => DaemonError::BadInput(message),
        CreateError::Failed(message) => {
            DaemonError::Internal(format!("creating {id} failed: {message}"))
        }
    }
}

/// How long a resumed sandbox's agent may take to answer (a restore reads
/// back the whole memory image first).
const RESUMED_ANSWER_WITHIN: Duration = Duration::from_secs(60);

/// Whether the agent of resumed sandbox `id` answers a ping within
/// [`RESUMED_ANSWER_WITHIN`]; why not, as a failed resume.
async fn answers(
    id: &str,
    agent: &airlock_protocol::AgentClient,
) -> Result<(), airlock_backend::StateError> {
    let failed = |reason: String| airlock_backend::StateError::Failed {
        id: id.to_owned(),
        what: "resume",
        reason,
    };
    let ping = async {
        agent
            .request(airlock_protocol::Request::Ping)
            .await?
            .finish()
            .await
    };
    match tokio::time::timeout(RESUMED_ANSWER_WITHIN, ping).await {
        Ok(Ok(airlock_protocol::Event::Pong)) => Ok(()),
        Ok(Ok(other)) => Err(failed(format!("its agent answered {other:?} to a ping"))),
        Ok(Err(e)) => {
            tracing::warn!("sandbox {id} did not come back from its resume: {e}");
            Err(failed("it did not come back: its agent is gone".into()))
        }
        Err(_) => Err(failed(format!(
            "its agent did not answer within {} s",
            RESUMED_ANSWER_WITHIN.as_secs()
        ))),
    }
}

/// A tier's answer to a pause or resume, as the daemon's.
pub(crate) fn state_error(e: airlock_backend::StateError) -> DaemonError {
    use airlock_backend::StateError;
    match e {
        StateError::Unsupported { .. } => DaemonError::Unsupported(e.to_string()),
        StateError::NotRunning(id) => DaemonError::NotRunning(id),
        StateError::Failed { .. } => DaemonError::Internal(e.to_string()),
    }
}
