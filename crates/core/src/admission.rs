//! Admission control in front of sandbox creation.
//!
//! [`Admission::admit`] decides, for one create request of one API key:
//!
//! 1. If the live sandboxes (globally, or of this key) are at their cap, the
//!    caller is [`Rejected`] at once with [`RejectReason::LiveCapReached`].
//! 2. Else, if a create slot is free, it gets a [`CreatePermit`] at once.
//! 3. Else, if fewer than `max_queue` callers are waiting, it waits in FIFO
//!    order for a slot (a caller dropped while waiting leaves the queue);
//!    otherwise it is rejected at once with [`RejectReason::QueueFull`].
//!
//! Every admitted caller, queued or not, holds a *reservation* of one live
//! slot (globally and for its key) from the moment it passes step 1, so
//! live sandboxes can never outnumber the caps, however many callers race.
//! The reservation travels: [`CreatePermit::succeeded`] releases the create
//! slot and turns it into a [`LiveLease`]; dropping the permit (creation
//! failed) or the lease (sandbox destroyed) gives the slot back.
//!
//! The one exception is [`Admission::adopt`], for sandboxes that already
//! exist when the daemon starts: they are counted whatever the caps say.
//!
//! ## Retry-After
//!
//! Each rejection carries a `retry_after` hint for the `Retry-After` header:
//!
//! - [`QUEUE_FULL_RETRY_AFTER`] (1 s) for a full queue: creations take
//!   milliseconds to a few hundred, so the queue drains within a second.
//! - [`LIVE_CAP_RETRY_AFTER`] (5 s) for a live cap: a slot frees only when
//!   someone deletes a sandbox or one times out, which is slower and not
//!   predictable, so clients should back off further.
//! - [`SHUTTING_DOWN_RETRY_AFTER`] (5 s) after [`Admission::close`]: a
//!   restarting daemon needs a few seconds before it admits again.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, TryAcquireError};

/// `retry_after` of a [`RejectReason::QueueFull`] rejection.
pub const QUEUE_FULL_RETRY_AFTER: Duration = Duration::from_secs(1);
/// `retry_after` of a [`RejectReason::LiveCapReached`] rejection.
pub const LIVE_CAP_RETRY_AFTER: Duration = Duration::from_secs(5);
/// `retry_after` of a [`RejectReason::ShuttingDown`] rejection.
pub const SHUTTING_DOWN_RETRY_AFTER: Duration = Duration::from_secs(5);

/// The limits admission enforces. All must be at least 1 (see
/// [`AdmissionLimits::validate`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdmissionLimits {
    /// Live sandboxes (being created, running, paused or stopping) in all.
    pub max_live_total: usize,
    /// Live sandboxes of one API key.
    pub max_live_per_key: usize,
    /// Creations running at the same time.
    pub max_concurrent_creates: usize,
    /// Callers waiting for a create slot; one more is rejected.
    pub max_queue: usize,
}

impl Default for AdmissionLimits {
    /// 256 live in all, 64 per key, 16 concurrent creations, 128 queued.
    fn default() -> Self {
        AdmissionLimits {
            max_live_total: 256,
            max_live_per_key: 64,
            max_concurrent_creates: 16,
            max_queue: 128,
        }
    }
}

impl AdmissionLimits {
    /// Checks the limits are usable: every cap at least 1 (a zero create
    /// limit would queue callers forever) and the create limit within what
    /// a semaphore holds.
    pub fn validate(&self) -> Result<(), LimitsError> {
        let fields = [
            ("max_live_total", self.max_live_total),
            ("max_live_per_key", self.max_live_per_key),
            ("max_concurrent_creates", self.max_concurrent_creates),
        ];
        if let Some((name, _)) = fields.into_iter().find(|(_, v)| *v == 0) {
            return Err(LimitsError::Zero(name));
        }
        if self.max_concurrent_creates > Semaphore::MAX_PERMITS {
            return Err(LimitsError::TooManyCreates(self.max_concurrent_creates));
        }
        Ok(())
    }
}

/// Limits that [`Admission::new`] refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitsError {
    /// A cap is zero.
    #[error("the admission limit `{0}` must be at least 1")]
    Zero(&'static str),
    /// `max_concurrent_creates` is beyond what the semaphore supports.
    #[error("the admission limit `max_concurrent_creates` is {0}, which is too large")]
    TooManyCreates(usize),
}

/// Which live cap was reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LiveCapScope {
    /// `max_live_total`.
    Global,
    /// `max_live_per_key`, for the caller's key.
    PerKey,
}

/// Why a caller was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum RejectReason {
    /// The live sandboxes (in this scope) are at their cap.
    LiveCapReached {
        /// Which cap.
        scope: LiveCapScope,
    },
    /// Every create slot is busy and the queue is full.
    QueueFull,
    /// [`Admission::close`] was called: the daemon is shutting down.
    ShuttingDown,
}

impl fmt::Display for RejectReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RejectReason::LiveCapReached {
                scope: LiveCapScope::Global,
            } => "the daemon is at its limit of live sandboxes",
            RejectReason::LiveCapReached {
                scope: LiveCapScope::PerKey,
            } => "this API key is at its limit of live sandboxes",
            RejectReason::QueueFull => "too many sandbox creations are waiting",
            RejectReason::ShuttingDown => "the daemon is shutting down",
        })
    }
}

/// A caller refused by admission; the API answers `429` (`503` for
/// [`RejectReason::ShuttingDown`]) with `Retry-After`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{reason}; retry after {} s", self.retry_after_secs())]
pub struct Rejected {
    /// Why.
    pub reason: RejectReason,
    /// How long the client should wait before trying again (a hint; see the
    /// module docs).
    pub retry_after: Duration,
}

impl Rejected {
    fn new(reason: RejectReason) -> Rejected {
        let retry_after = match reason {
            RejectReason::LiveCapReached { .. } => LIVE_CAP_RETRY_AFTER,
            RejectReason::QueueFull => QUEUE_FULL_RETRY_AFTER,
            RejectReason::ShuttingDown => SHUTTING_DOWN_RETRY_AFTER,
        };
        Rejected {
            reason,
            retry_after,
        }
    }

    /// `retry_after` in whole seconds, rounded up and at least 1, as the
    /// `Retry-After` header wants it.
    pub fn retry_after_secs(&self) -> u64 {
        let secs = self.retry_after.as_secs();
        let secs = if self.retry_after.subsec_nanos() > 0 {
            secs.saturating_add(1)
        } else {
            secs
        };
        secs.max(1)
    }
}

/// Counts for metrics, taken at one instant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdmissionStats {
    /// Live leases: sandboxes created and not yet destroyed.
    pub live_total: usize,
    /// Callers holding a create slot.
    pub creating: usize,
    /// Callers waiting for a create slot.
    pub queued: usize,
    /// Callers rejected since start, for any reason.
    pub rejected_total: u64,
}

/// Admission control; cheap to clone (clones share the same counts).
#[derive(Debug, Clone)]
pub struct Admission {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    limits: AdmissionLimits,
    /// One permit per concurrent creation. Tokio's semaphore is fair: a
    /// released permit goes to the longest waiter, and `try_acquire` never
    /// jumps ahead of waiters.
    create_slots: Arc<Semaphore>,
    counts: Mutex<Counts>,
    rejected_total: AtomicU64,
}

#[derive(Debug, Default)]
struct Counts {
    /// Reservations of live slots: queued + creating + live.
    reserved_total: usize,
    /// Reservations per key; keys at zero are removed.
    reserved_per_key: HashMap<Arc<str>, usize>,
    queued: usize,
    creating: usize,
    live: usize,
}

/// The stage a reservation is at; each stage has its counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Queued,
    Creating,
    Live,
}

impl Counts {
    fn phase_mut(&mut self, phase: Phase) -> &mut usize {
        match phase {
            Phase::Queued => &mut self.queued,
            Phase::Creating => &mut self.creating,
            Phase::Live => &mut self.live,
        }
    }
}

impl Inner {
    /// The counts, even if a thread panicked while holding them (every
    /// update leaves them consistent, so poisoning carries no meaning here).
    fn counts(&self) -> MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn reject(&self, reason: RejectReason) -> Rejected {
        self.rejected_total.fetch_add(1, Ordering::Relaxed);
        Rejected::new(reason)
    }
}

/// One reserved live slot. Dropping it gives the slot back and takes it off
/// its phase's counter.
#[derive(Debug)]
struct Reservation {
    inner: Arc<Inner>,
    key: Arc<str>,
    phase: Phase,
}

impl Reservation {
    /// Takes a live slot for `key`, in `phase`. The caller holds the lock
    /// and has checked the caps (or means to ignore them).
    fn take(inner: &Arc<Inner>, counts: &mut Counts, key: &str, phase: Phase) -> Reservation {
        let key = match counts.reserved_per_key.get_key_value(key) {
            Some((k, _)) => Arc::clone(k),
            None => Arc::from(key),
        };
        counts.reserved_total += 1;
        *counts.reserved_per_key.entry(Arc::clone(&key)).or_insert(0) += 1;
        *counts.phase_mut(phase) += 1;
        Reservation {
            inner: Arc::clone(inner),
            key,
            phase,
        }
    }

    fn advance(&mut self, to: Phase) {
        let mut counts = self.inner.counts();
        let from = counts.phase_mut(self.phase);
        *from = from.saturating_sub(1);
        *counts.phase_mut(to) += 1;
        self.phase = to;
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut counts = self.inner.counts();
        let phase = counts.phase_mut(self.phase);
        *phase = phase.saturating_sub(1);
        counts.reserved_total = counts.reserved_total.saturating_sub(1);
        if let Some(n) = counts.reserved_per_key.get_mut(&self.key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                counts.reserved_per_key.remove(&self.key);
            }
        }
    }
}

/// Leave to create one sandbox: a create slot plus a reserved live slot.
///
/// Call [`CreatePermit::succeeded`] once the sandbox runs; drop the permit if
/// creation failed, which releases both slots.
#[derive(Debug)]
#[must_use = "dropping a permit releases its slots at once"]
pub struct CreatePermit {
    // Field order is drop order: the reservation leaves the `creating`
    // counter before the slot lets the next caller in, so `creating` never
    // exceeds `max_concurrent_creates`.
    reservation: Reservation,
    slot: OwnedSemaphorePermit,
}

impl CreatePermit {
    /// The API key the permit was admitted for.
    pub fn key_id(&self) -> &str {
        &self.reservation.key
    }

    /// Creation succeeded: releases the create slot and keeps the live slot
    /// as a lease, to be dropped when the sandbox is destroyed.
    pub fn succeeded(self) -> LiveLease {
        let CreatePermit {
            mut reservation,
            slot,
        } = self;
        reservation.advance(Phase::Live);
        drop(slot);
        LiveLease { reservation }
    }
}

/// One live sandbox counted against the caps. Drop it when the sandbox is
/// destroyed (after teardown) to free its slot.
#[derive(Debug)]
#[must_use = "dropping a lease frees its live slot at once"]
pub struct LiveLease {
    reservation: Reservation,
}

impl LiveLease {
    /// The API key the sandbox counts against.
    pub fn key_id(&self) -> &str {
        &self.reservation.key
    }
}

impl Admission {
    /// Admission with these limits; refuses limits that fail
    /// [`AdmissionLimits::validate`].
    pub fn new(limits: AdmissionLimits) -> Result<Admission, LimitsError> {
        limits.validate()?;
        Ok(Admission {
            inner: Arc::new(Inner {
                limits,
                create_slots: Arc::new(Semaphore::new(limits.max_concurrent_creates)),
                counts: Mutex::new(Counts::default()),
                rejected_total: AtomicU64::new(0),
            }),
        })
    }

    /// The limits in force.
    pub fn limits(&self) -> AdmissionLimits {
        self.inner.limits
    }

    /// Admits one creation for `key_id`, waiting in the queue if every create
    /// slot is busy; see the module docs. Cancel-safe: dropping the future
    /// while it waits leaves the queue and releases the reservation.
    pub async fn admit(&self, key_id: &str) -> Result<CreatePermit, Rejected> {
        let inner = &self.inner;
        let mut reservation = {
            let mut counts = inner.counts();
            let limits = &inner.limits;
            if inner.create_slots.is_closed() {
                return Err(inner.reject(RejectReason::ShuttingDown));
            }
            if counts.reserved_total >= limits.max_live_total {
                return Err(inner.reject(RejectReason::LiveCapReached {
                    scope: LiveCapScope::Global,
                }));
            }
            let of_key = counts.reserved_per_key.get(key_id).copied().unwrap_or(0);
            if of_key >= limits.max_live_per_key {
                return Err(inner.reject(RejectReason::LiveCapReached {
                    scope: LiveCapScope::PerKey,
                }));
            }
            match Arc::clone(&inner.create_slots).try_acquire_owned() {
                Ok(slot) => {
                    let reservation =
                        Reservation::take(inner, &mut counts, key_id, Phase::Creating);
                    return Ok(CreatePermit { reservation, slot });
                }
                Err(TryAcquireError::Closed) => {
                    return Err(inner.reject(RejectReason::ShuttingDown));
                }
                Err(TryAcquireError::NoPermits) => {}
            }
            if counts.queued >= limits.max_queue {
                return Err(inner.reject(RejectReason::QueueFull));
            }
            Reservation::take(inner, &mut counts, key_id, Phase::Queued)
        };
        // Waiting: if this future is dropped here, `reservation` drops too
        // and takes the caller off the queue.
        match Arc::clone(&inner.create_slots).acquire_owned().await {
            Ok(slot) => {
                reservation.advance(Phase::Creating);
                Ok(CreatePermit { reservation, slot })
            }
            Err(_closed) => {
                drop(reservation);
                Err(inner.reject(RejectReason::ShuttingDown))
            }
        }
    }

    /// Admits one creation for `key_id` only if it takes nothing from a
    /// caller: nobody waits, the caps have room, and more than
    /// `keep_free` create slots are free after it. Background work (warm
    /// pool refills) asks this way, so it never delays or starves creates.
    pub fn try_admit_idle(&self, key_id: &str, keep_free: usize) -> Option<CreatePermit> {
        let inner = &self.inner;
        let mut counts = inner.counts();
        let limits = &inner.limits;
        let of_key = counts.reserved_per_key.get(key_id).copied().unwrap_or(0);
        if counts.queued > 0
            || counts.reserved_total >= limits.max_live_total
            || of_key >= limits.max_live_per_key
            || inner.create_slots.available_permits() <= keep_free
        {
            return None;
        }
        let slot = Arc::clone(&inner.create_slots).try_acquire_owned().ok()?;
        let reservation = Reservation::take(inner, &mut counts, key_id, Phase::Creating);
        Some(CreatePermit { reservation, slot })
    }

    /// Counts a sandbox that already exists (re-adopted at reconciliation)
    /// as live for `key_id`, bypassing caps and queue: it is there whether
    /// the caps like it or not, and counting it keeps new admissions honest.
    pub fn adopt(&self, key_id: &str) -> LiveLease {
        let mut counts = self.inner.counts();
        let reservation = Reservation::take(&self.inner, &mut counts, key_id, Phase::Live);
        LiveLease { reservation }
    }

    /// Stops admitting: queued callers and every later caller are rejected
    /// with [`RejectReason::ShuttingDown`]. Permits and leases already given
    /// stay valid.
    pub fn close(&self) {
        self.inner.create_slots.close();
    }

    /// Live sandboxes (including reservations still queued or creating)
    /// counted for `key_id`.
    pub fn reserved_for_key(&self, key_id: &str) -> usize {
        self.inner
            .counts()
            .reserved_per_key
            .get(key_id)
            .copied()
            .unwrap_or(0)
    }

    /// The current counts.
    pub fn snapshot(&self) -> AdmissionStats {
        let counts = self.inner.counts();
        AdmissionStats {
            live_total: counts.live,
            creating: counts.creating,
            queued: counts.queued,
            rejected_total: self.inner.rejected_total.load(Ordering::Relaxed),
        }
    }
}
