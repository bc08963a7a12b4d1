//! Warm pools: sandboxes of a template started ahead, so a create that
//! fits one is handed a running sandbox instead of starting its own.
//!
//! - **A pool** (`PUT /v1/pools/{name}`, `serve --pools FILE`; kept in the
//!   store, so it outlives a restart) names a template, a tier (default:
//!   the template's), whether its members have an egress path
//!   (`networked`, for creates whose network policy is not `none`), and
//!   sizes: `min_ready` members kept ready, at most `max` at once, at most
//!   `refill` starting at once. A create that finds the pool empty (a
//!   miss) raises the pool's target by one, up to `max`; a pool without a
//!   miss for [`SHRINK_AFTER`] lowers it by one, down to `min_ready`.
//! - **A member** is a sandbox started by the tier like any other, with
//!   the template's defaults, recorded as being created and owned by
//!   [`airlock_store::POOL_KEY_ID`], a key nobody can sign in as. It is
//!   never registered, listed, given a token or reachable through the API:
//!   nothing runs in it until it is claimed.
//! - **A claim** ([`Pools::take`]): a create whose spec fits a pool's
//!   members ([`Class`]: the same template layers, tier, disk size, pids
//!   limit, layer backing, security, network or not, and no host mounts)
//!   takes the oldest ready member. Everything else of the request is
//!   applied then: its record becomes the claimer's (owner, template name,
//!   spec, metadata, a fresh access token, its times), memory and CPU
//!   limits are set on its cgroup, its deadline is the request's, its
//!   egress path is attached with the request's policy, its env, user and
//!   cwd are the request's for every process, and a template's start
//!   command runs (see [`crate::startup`]). Each member is claimed once.
//! - **Refill** starts members only while no create waits for a slot and
//!   more than [`SLOTS_KEPT_FREE`] create slots are free
//!   ([`airlock_core::Admission::try_admit_idle`]), so it never delays a
//!   create; members count against the live caps like any sandbox (and
//!   the per-key cap bounds all pools' members together). After a claim,
//!   a pool that still has ready members waits [`CLAIM_GRACE`] before it
//!   starts a replacement, so the claimer's first exec does not share the
//!   cores with a launch.
//! - **Restart:** members are recorded as being created, so a restarted
//!   daemon's reconciliation tears them down like any unfinished create;
//!   the pools then refill from their records.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use airlock_core::CreatePermit;
use airlock_policy::{LayerBacking, NetworkPolicy, SandboxSpec, Security, Template, Tier};
use airlock_store::{PoolRow, Stream, POOL_KEY_ID};
use serde::Serialize;
use serde_json::json;

use crate::sandboxes::{Launch, NewSandboxRequest};
use crate::{Daemon, DaemonError};

/// How often the pools are looked over (a claim or a change wakes them
/// sooner).
const POOL_TICK: Duration = Duration::from_millis(250);
/// How long a pool that still has ready members waits after a claim
/// before it starts a replacement: the claimer's first calls (an exec
/// follows a create within milliseconds) run without a launch beside them
/// on the same cores. A pool a claim emptied refills at once.
const CLAIM_GRACE: Duration = Duration::from_millis(30);
/// How long a pool goes without a miss before its target drops by one.
pub const SHRINK_AFTER: Duration = Duration::from_secs(30);
/// Create slots a refill leaves free for callers.
pub const SLOTS_KEPT_FREE: usize = 1;
/// How long a pool whose member failed to start waits before the next.
const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(2);
/// Most members one pool may hold.
pub const MAX_POOL_SIZE: u32 = 64;
/// Most members one pool may start at once.
pub const MAX_REFILL: u32 = 16;
/// Longest a stopping daemon waits for members being started or torn down.
const DRAIN_WAIT: Duration = Duration::from_secs(60);

/// A pool as asked for (the API's and the config file's body).
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolSettings {
    /// The template its members run.
    pub template: String,
    /// The tier they run on (default: the template's).
    #[serde(default)]
    pub tier: Option<Tier>,
    /// Whether members have an egress path (default: no).
    #[serde(default)]
    pub networked: bool,
    /// Members kept ready.
    pub min_ready: u32,
    /// Most members at once (default: `min_ready`, at least 1).
    #[serde(default)]
    pub max: Option<u32>,
    /// Most members starting at once (default: 2).
    #[serde(default)]
    pub refill: Option<u32>,
}

/// A pool as the config file lists it: its name and settings.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamedPoolSettings {
    pub name: String,
    #[serde(flatten)]
    pub settings: PoolSettings,
}

/// A pool and how it is doing.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct PoolView {
    pub name: String,
    pub template: String,
    pub tier: Option<String>,
    pub networked: bool,
    pub min_ready: u32,
    pub max: u32,
    pub refill: u32,
    /// Members ready to be claimed.
    pub ready: u32,
    /// Members being started.
    pub starting: u32,
    /// How many it keeps ready now (`min_ready` raised by misses).
    pub target: u32,
    /// Creates it served, and creates that found it empty.
    pub claims: u64,
    pub misses: u64,
    /// Members started, and members that failed to start.
    pub started: u64,
    pub failed: u64,
    /// Why the last member failed to start, or why the pool cannot fill.
    pub last_error: Option<String>,
}

/// What a create must match to be handed a pool's member: what is fixed
/// once a sandbox runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Class {
    template: Template,
    tier: Tier,
    disk_bytes: u64,
    pids: u32,
    layer: LayerBacking,
    security: Security,
    networked: bool,
}

impl Class {
    /// The class of a create's spec; `None` for one no member can serve
    /// (it binds host directories or mounts volumes, which only a start
    /// can attach).
    pub(crate) fn of(spec: &SandboxSpec) -> Option<Class> {
        if !spec.mounts.is_empty() || !spec.volumes.is_empty() {
            return None;
        }
        Some(Class {
            template: spec.template.clone(),
            tier: spec.tier,
            disk_bytes: spec.limits.disk_bytes,
            pids: spec.limits.pids,
            layer: spec.limits.layer,
            security: spec.security.clone(),
            networked: !spec.network.is_none(),
        })
    }
}

/// A started member waiting for its claim.
pub(crate) struct Member {
    pub(crate) id: String,
    /// Tears it down unless a claim hands it out.
    pub(crate) launch: Launch,
    pub(crate) instance: airlock_backend::Instance,
    /// What it was started with.
    pub(crate) spec: SandboxSpec,
    pub(crate) class: Class,
}

struct Pool {
    row: PoolRow,
    /// The class and request of new members, as the template resolves
    /// now (`None`: it does not; `last_error` says why).
    current: Option<(Class, NewSandboxRequest)>,
    ready: VecDeque<Member>,
    starting: u32,
    target: u32,
    last_miss: Instant,
    claims: u64,
    misses: u64,
    started: u64,
    failed: u64,
    last_error: Option<String>,
    retry_at: Option<Instant>,
    /// When a member was last claimed (see [`CLAIM_GRACE`]).
    last_claim: Option<Instant>,
}

impl Pool {
    fn new(row: PoolRow) -> Pool {
        Pool {
            target: row.min_ready,
            row,
            current: None,
            ready: VecDeque::new(),
            starting: 0,
            last_miss: Instant::now(),
            claims: 0,
            misses: 0,
            started: 0,
            failed: 0,
            last_error: None,
            retry_at: None,
            last_claim: None,
        }
    }

    fn view(&self) -> PoolView {
        PoolView {
            name: self.row.name.clone(),
            template: self.row.template.clone(),
            tier: self.row.tier.clone(),
            networked: self.row.networked,
            min_ready: self.row.min_ready,
            max: self.row.max,
            refill: self.row.refill,
            ready: self.ready.len() as u32,
            starting: self.starting,
            target: self.target,
            claims: self.claims,
            misses: self.misses,
            started: self.started,
            failed: self.failed,
            last_error: self.last_error.clone(),
        }
    }
}

/// The daemon's pools and their members.
#[derive(Default)]
pub(crate) struct Pools {
    pools: Mutex<BTreeMap<String, Pool>>,
    wake: tokio::sync::Notify,
    /// Set once the daemon stops: no member starts, and one that finishes
    /// starting is torn down.
    closing: std::sync::atomic::AtomicBool,
    /// Members being started or torn down, which a stopping daemon waits
    /// for (a member is never dropped to a task nobody waits for).
    busy: tokio::sync::watch::Sender<usize>,
}

/// Counts one start or teardown in [`Pools::busy`] while it lives.
struct Busy(Daemon);

impl Busy {
    fn new(daemon: &Daemon) -> Busy {
        daemon.inner.pools.busy.send_modify(|n| *n += 1);
        Busy(daemon.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0
            .inner
            .pools
            .busy
            .send_modify(|n| *n = n.saturating_sub(1));
    }
}

impl Pool {
    /// The class new members are started with, if the template resolves.
    fn class(&self) -> Option<&Class> {
        self.current.as_ref().map(|(c, _)| c)
    }
}

impl Pools {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Pool>> {
        self.pools.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A ready member for a create of `spec`, if a pool has one; a pool
    /// that would have had one counts a miss and grows.
    pub(crate) fn take(
        &self,
        spec: &SandboxSpec,
        metrics: &crate::metrics::Metrics,
    ) -> Option<Member> {
        let class = Class::of(spec)?;
        let mut pools = self.lock();
        let mut missed: Option<&mut Pool> = None;
        for pool in pools.values_mut() {
            if pool.class() != Some(&class) {
                continue;
            }
            if let Some(at) = pool.ready.iter().position(|m| m.class == class) {
                let member = pool.ready.remove(at);
                pool.claims += 1;
                pool.last_claim = Some(Instant::now());
                metrics
                    .pool_claims
                    .get_or_create(&crate::metrics::PoolLabel {
                        pool: pool.row.name.clone(),
                    })
                    .inc();
                self.wake.notify_one();
                return member;
            }
            if missed.is_none() {
                missed = Some(pool);
            }
        }
        if let Some(pool) = missed {
            pool.misses += 1;
            metrics
                .pool_misses
                .get_or_create(&crate::metrics::PoolLabel {
                    pool: pool.row.name.clone(),
                })
                .inc();
            pool.target = (pool.target + 1).min(pool.row.max);
            pool.last_miss = Instant::now();
            self.wake.notify_one();
        }
        None
    }

    /// Members ready or starting in all pools (they are counted as being
    /// created).
    pub(crate) fn held(&self) -> usize {
        self.lock()
            .values()
            .map(|p| p.ready.len() + p.starting as usize)
            .sum()
    }

    /// Takes every ready member out (the daemon is stopping).
    fn drain(&self) -> Vec<Member> {
        let mut pools = self.lock();
        pools.values_mut().flat_map(|p| p.ready.drain(..)).collect()
    }

    fn closing(&self) -> bool {
        self.closing.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Every pool, by name.
    pub(crate) fn views(&self) -> Vec<PoolView> {
        self.lock().values().map(Pool::view).collect()
    }
}

fn is_pool_name(name: &str) -> bool {
    let mut chars = name.chars();
    name.len() <= 64
        && chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

impl Daemon {
    /// Sets pool `name` (replacing one of that name; members of settings
    /// that changed are replaced as the refill goes).
    pub fn set_pool(&self, name: &str, settings: PoolSettings) -> Result<PoolView, DaemonError> {
        if !is_pool_name(name) {
            return Err(DaemonError::BadInput(format!(
                "{name:?} cannot name a pool: use 1 to 64 letters, digits and ._-, starting with a letter or digit"
            )));
        }
        let max = settings.max.unwrap_or(settings.min_ready.max(1));
        let refill = settings.refill.unwrap_or(2);
        if max == 0 || max > MAX_POOL_SIZE || settings.min_ready > max {
            return Err(DaemonError::BadInput(format!(
                "max: a pool holds 1 to {MAX_POOL_SIZE} members, and at least min_ready ({})",
                settings.min_ready
            )));
        }
        if refill == 0 || refill > MAX_REFILL {
            return Err(DaemonError::BadInput(format!(
                "refill: 1 to {MAX_REFILL} members start at once"
            )));
        }
        let row = PoolRow {
            name: name.to_owned(),
            template: settings.template,
            tier: settings.tier.map(|t| t.as_str().to_owned()),
            networked: settings.networked,
            min_ready: settings.min_ready,
            max,
            refill,
            updated_at: 0,
        };
        // What it would start must start: the template exists, the tier
        // runs here.
        let (_, request) = self.member_request(&row)?;
        self.inner.tiers.get(request.spec.tier)?;
        let row = self.with_store(|s| s.put_pool(&row))?;
        self.inner.audit.record(
            Stream::Runtime,
            "pool.set",
            None,
            None,
            json!({"pool": row.name, "template": row.template, "tier": row.tier,
                   "networked": row.networked, "min_ready": row.min_ready,
                   "max": row.max, "refill": row.refill}),
        );
        self.sync_pools()?;
        self.inner.pools.wake.notify_one();
        self.pool(name)
    }

    /// Pool `name` and how it is doing.
    pub fn pool(&self, name: &str) -> Result<PoolView, DaemonError> {
        if let Some(view) = self.inner.pools.lock().get(name).map(Pool::view) {
            return Ok(view);
        }
        Err(DaemonError::NotFound(format!(
            "there is no pool named {name:?}"
        )))
    }

    /// Every pool and how it is doing.
    pub fn pools(&self) -> Result<Vec<PoolView>, DaemonError> {
        self.sync_pools()?;
        Ok(self.inner.pools.views())
    }

    /// Removes pool `name`; its ready members are torn down.
    pub fn delete_pool(&self, name: &str) -> Result<(), DaemonError> {
        if self.with_store(|s| s.get_pool(name))?.is_none() {
            return Err(DaemonError::NotFound(format!(
                "there is no pool named {name:?}"
            )));
        }
        self.with_store(|s| s.delete_pool(name))?;
        self.inner.audit.record(
            Stream::Runtime,
            "pool.deleted",
            None,
            None,
            json!({"pool": name}),
        );
        self.sync_pools()
    }

    /// Records member `id`, which the tier could not start, dead.
    fn member_failed(&self, id: &str, request_id: &str, error: &str) {
        let _ = self.transition(
            id,
            airlock_core::State::Creating,
            airlock_core::Action::Failed,
        );
        self.forget_creating(id);
        self.record_create_failed(id, request_id, error);
    }

    /// The request a member of pool `row` is started with, and its class.
    fn member_request(&self, row: &PoolRow) -> Result<(Class, NewSandboxRequest), DaemonError> {
        let resolved = self.resolve_template(&row.template)?;
        let mut spec = SandboxSpec {
            timeout_ms: self.config().max_timeout.as_millis() as u64,
            ..SandboxSpec::default()
        };
        spec.tier = match &row.tier {
            Some(tier) => tier.parse().map_err(|e: airlock_policy::UnknownTier| {
                DaemonError::BadInput(format!("tier: {e}"))
            })?,
            None => self.default_tier_of(&row.template, &resolved),
        };
        if row.networked {
            // An egress path with nothing allowed until a claim attaches
            // the claimer's policy.
            spec.network = NetworkPolicy::Allow { rules: Vec::new() };
        }
        if self.config().disk_store.is_some() {
            spec.limits.layer = LayerBacking::Disk;
        }
        spec.template = resolved.template;
        Daemon::apply_template_config(&mut spec, &resolved.config);
        spec.validate()
            .map_err(|e| DaemonError::BadInput(e.to_string()))?;
        let class = Class::of(&spec)
            .ok_or_else(|| DaemonError::Internal("a pool member with host mounts".into()))?;
        Ok((
            class,
            NewSandboxRequest {
                spec,
                template_name: row.template.clone(),
                metadata: BTreeMap::from([("airlock.pool".to_owned(), row.name.clone())]),
                layers: resolved.layers,
            },
        ))
    }

    /// Brings the pools in memory in line with their records: new ones
    /// added, changed ones updated, removed ones dropped with their
    /// members.
    fn sync_pools(&self) -> Result<(), DaemonError> {
        let rows = self.with_store(|s| s.pools())?;
        let mut pools = self.inner.pools.lock();
        let gone: Vec<String> = pools
            .keys()
            .filter(|name| !rows.iter().any(|r| &r.name == *name))
            .cloned()
            .collect();
        let mut dropped = Vec::new();
        for name in gone {
            if let Some(mut pool) = pools.remove(&name) {
                dropped.extend(pool.ready.drain(..));
            }
        }
        self.tear_down_later(dropped);
        for row in rows {
            match pools.get_mut(&row.name) {
                Some(pool) if pool.row == row => {}
                Some(pool) => {
                    pool.target = pool.target.clamp(row.min_ready, row.max);
                    pool.row = row;
                }
                None => {
                    pools.insert(row.name.clone(), Pool::new(row));
                }
            }
        }
        Ok(())
    }

    /// Tears down every ready member (a stopping daemon's: unlike claimed
    /// sandboxes, members are not adopted at the next start).
    pub async fn drain_pools(&self) {
        let pools = &self.inner.pools;
        pools
            .closing
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.tear_down(pools.drain()).await;
        // Starts finishing now tear their member down; teardowns handed to
        // tasks finish. Bounded: a stuck one is the next start's to reap.
        let mut busy = pools.busy.subscribe();
        let _ = tokio::time::timeout(DRAIN_WAIT, busy.wait_for(|n| *n == 0)).await;
    }

    /// Tears `members` down and waits for them.
    async fn tear_down(&self, members: Vec<Member>) {
        futures_util::future::join_all(members.into_iter().map(|m| m.launch.abandon())).await;
    }

    /// Tears `members` down in a task a stopping daemon waits for.
    fn tear_down_later(&self, members: Vec<Member>) {
        if !members.is_empty() {
            let daemon = self.clone();
            self.spawn_counted(async move { daemon.tear_down(members).await });
        }
    }

    /// Runs `work` in a task a stopping daemon waits for, counted before
    /// it runs (so a drain that starts now waits for it).
    fn spawn_counted(&self, work: impl std::future::Future<Output = ()> + Send + 'static) {
        let busy = Busy::new(self);
        tokio::spawn(async move {
            work.await;
            drop(busy);
        });
    }

    /// Applies the pools of a config file (`serve --pools`): each is set as
    /// [`Daemon::set_pool`] sets it.
    pub fn set_pools_from(&self, pools: Vec<NamedPoolSettings>) -> Result<(), DaemonError> {
        for pool in pools {
            self.set_pool(&pool.name, pool.settings)
                .map_err(|e| match e {
                    DaemonError::BadInput(m) => {
                        DaemonError::BadInput(format!("pool {:?}: {m}", pool.name))
                    }
                    other => other,
                })?;
        }
        Ok(())
    }

    /// Keeps the pools filled (spawn it once, after reconciliation).
    pub async fn run_pools(self) {
        loop {
            let next = match self.tend_pools() {
                Ok(next) => next,
                Err(e) => {
                    tracing::warn!("warm pools: {e}");
                    POOL_TICK
                }
            };
            let _ = tokio::time::timeout(next, self.inner.pools.wake.notified()).await;
        }
    }

    /// One look over the pools: members of a stale class or beyond `max`
    /// and dead ones go, targets shrink after quiet spells, and members
    /// start where a pool is short. Returns when to look again (sooner
    /// than [`POOL_TICK`] when a claim's grace ends first).
    fn tend_pools(&self) -> Result<Duration, DaemonError> {
        let mut next = POOL_TICK;
        self.sync_pools()?;
        let names: Vec<(String, PoolRow)> = self
            .inner
            .pools
            .lock()
            .iter()
            .map(|(n, p)| (n.clone(), p.row.clone()))
            .collect();
        for (name, row) in names {
            let current = self.member_request(&row);
            let mut starts = Vec::new();
            {
                let mut pools = self.inner.pools.lock();
                let Some(pool) = pools.get_mut(&name) else {
                    continue;
                };
                match current {
                    Ok(current) => {
                        if pool.class() != Some(&current.0) {
                            pool.last_error = None;
                        }
                        pool.current = Some(current);
                    }
                    Err(e) => {
                        pool.last_error = Some(e.to_string());
                        pool.current = None;
                    }
                }
                let class = pool.class().cloned();
                let mut dropped = Vec::new();
                for mut member in std::mem::take(&mut pool.ready) {
                    let alive =
                        futures_util::FutureExt::now_or_never(&mut member.instance.ended).is_none();
                    if alive
                        && Some(&member.class) == class.as_ref()
                        && (pool.ready.len() as u32) < pool.row.max
                    {
                        pool.ready.push_back(member);
                    } else {
                        dropped.push(member);
                    }
                }
                self.tear_down_later(dropped);
                if pool.target > pool.row.min_ready && pool.last_miss.elapsed() >= SHRINK_AFTER {
                    pool.target -= 1;
                    pool.last_miss = Instant::now();
                }
                let Some((_, request)) = pool.current.as_ref() else {
                    continue;
                };
                if pool.retry_at.is_some_and(|at| Instant::now() < at) || self.inner.pools.closing()
                {
                    continue;
                }
                if let Some(grace) = pool
                    .last_claim
                    .and_then(|at| CLAIM_GRACE.checked_sub(at.elapsed()))
                    .filter(|_| !pool.ready.is_empty())
                {
                    next = next.min(grace);
                    continue;
                }
                let held = pool.ready.len() as u32 + pool.starting;
                let want = pool
                    .target
                    .saturating_sub(held)
                    .min(pool.row.max.saturating_sub(held))
                    .min(pool.row.refill.saturating_sub(pool.starting));
                for _ in 0..want {
                    let Some(permit) = self
                        .inner
                        .admission
                        .try_admit_idle(POOL_KEY_ID, SLOTS_KEPT_FREE)
                    else {
                        break;
                    };
                    pool.starting += 1;
                    starts.push((permit, request.clone()));
                }
            }
            for (permit, request) in starts {
                let daemon = self.clone();
                let name = name.clone();
                self.spawn_counted(async move { daemon.start_member(name, request, permit).await });
            }
        }
        Ok(next)
    }

    /// Starts one member of pool `name` and puts it with the ready ones.
    async fn start_member(&self, name: String, request: NewSandboxRequest, permit: CreatePermit) {
        let started = self.started_member(&name, request, permit).await;
        let unwanted = {
            let mut pools = self.inner.pools.lock();
            match pools.get_mut(&name) {
                // The pool went meanwhile, or the daemon is stopping.
                None => started.ok(),
                Some(_) if self.inner.pools.closing() => started.ok(),
                Some(pool) => Self::settle_start(self, &name, pool, started),
            }
        };
        if let Some(member) = unwanted {
            self.tear_down(vec![member]).await;
        }
    }

    /// Puts a started member with `pool`'s ready ones, or counts its
    /// failure; the member if it is of a class the pool no longer wants.
    fn settle_start(
        &self,
        name: &str,
        pool: &mut Pool,
        started: Result<Member, DaemonError>,
    ) -> Option<Member> {
        let name = name.to_owned();
        pool.starting = pool.starting.saturating_sub(1);
        match started {
            Ok(member) => {
                pool.started += 1;
                self.inner
                    .metrics
                    .pool_refills
                    .get_or_create(&crate::metrics::PoolLabel { pool: name.clone() })
                    .inc();
                pool.retry_at = None;
                if pool.class() == Some(&member.class) {
                    pool.ready.push_back(member);
                    None
                } else {
                    Some(member)
                }
            }
            Err(e) => {
                tracing::warn!("warm pool {name}: a member failed to start: {e}");
                pool.failed += 1;
                self.inner
                    .metrics
                    .pool_refill_failures
                    .get_or_create(&crate::metrics::PoolLabel { pool: name.clone() })
                    .inc();
                pool.last_error = Some(e.to_string());
                pool.retry_at = Some(Instant::now() + RETRY_AFTER_FAILURE);
                None
            }
        }
    }

    async fn started_member(
        &self,
        name: &str,
        request: NewSandboxRequest,
        permit: CreatePermit,
    ) -> Result<Member, DaemonError> {
        let spec = request.spec;
        let class = Class::of(&spec)
            .ok_or_else(|| DaemonError::Internal("a pool member with host mounts".into()))?;
        let backend = Arc::clone(self.inner.tiers.get(spec.tier)?);
        let (id, _token) = self
            .record_creating(
                &backend,
                POOL_KEY_ID,
                &spec,
                &request.template_name,
                &request.metadata,
                &request.layers,
            )
            .await?;
        let request_id = format!("pool-{name}");
        let instance = match backend.create(&id, &spec).await {
            Ok(instance) => instance,
            Err(e) => {
                self.member_failed(&id, &request_id, &e.to_string());
                return Err(crate::sandboxes::create_error(&id, e));
            }
        };
        let mut launch = Launch::new(self, &id, &instance.resources, permit, &request_id);
        launch.wait_for_claim();
        // What teardown must release is recorded now, for a restarted
        // daemon's reconciliation.
        let resources = serde_json::to_string(&instance.resources).ok();
        self.with_store(|s| s.set_resources(&id, resources.as_deref()))?;
        self.inner.audit.record(
            Stream::Runtime,
            "pool.member_started",
            Some(&id),
            Some(&request_id),
            json!({"pool": name, "tier": spec.tier.as_str()}),
        );
        Ok(Member {
            id,
            launch,
            instance,
            spec,
            class,
        })
    }
}
