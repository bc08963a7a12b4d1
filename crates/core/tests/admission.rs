//! Admission: caps, queue bound, FIFO order, cancellation, release on drop,
//! and a 200-caller stress test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use airlock_core::admission::{
    LIVE_CAP_RETRY_AFTER, QUEUE_FULL_RETRY_AFTER, SHUTTING_DOWN_RETRY_AFTER,
};
use airlock_core::{
    Admission, AdmissionLimits, AdmissionStats, LimitsError, LiveCapScope, RejectReason, Rejected,
};

fn admission(total: usize, per_key: usize, creates: usize, queue: usize) -> Admission {
    Admission::new(AdmissionLimits {
        max_live_total: total,
        max_live_per_key: per_key,
        max_concurrent_creates: creates,
        max_queue: queue,
    })
    .unwrap()
}

/// Lets spawned tasks run until `cond` holds (current-thread runtime).
async fn until(mut cond: impl FnMut() -> bool) {
    for _ in 0..10_000 {
        if cond() {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("condition never held");
}

/// An admission expected to be refused at once; fails instead of hanging if
/// the caller is queued.
async fn reject_now(adm: &Admission, key: &str) -> Rejected {
    tokio::time::timeout(Duration::from_secs(10), adm.admit(key))
        .await
        .expect("admit queued the caller instead of rejecting it")
        .expect_err("admit admitted the caller instead of rejecting it")
}

fn stats(live_total: usize, creating: usize, queued: usize, rejected_total: u64) -> AdmissionStats {
    AdmissionStats {
        live_total,
        creating,
        queued,
        rejected_total,
    }
}

const PER_KEY: RejectReason = RejectReason::LiveCapReached {
    scope: LiveCapScope::PerKey,
};
const GLOBAL: RejectReason = RejectReason::LiveCapReached {
    scope: LiveCapScope::Global,
};

#[tokio::test]
async fn per_key_cap() {
    let adm = admission(10, 2, 5, 5);
    let a1 = adm.admit("a").await.unwrap().succeeded();
    let a2 = adm.admit("a").await.unwrap();
    assert_eq!(a2.key_id(), "a");
    let err = reject_now(&adm, "a").await;
    assert_eq!(
        err,
        Rejected {
            reason: PER_KEY,
            retry_after: LIVE_CAP_RETRY_AFTER
        }
    );
    // Another key is unaffected.
    let _b = adm.admit("b").await.unwrap();
    assert_eq!(adm.reserved_for_key("a"), 2);
    assert_eq!(adm.snapshot(), stats(1, 2, 0, 1));
    drop(a1);
    let _a3 = adm.admit("a").await.unwrap();
    drop(a2);
    assert_eq!(adm.reserved_for_key("a"), 1);
}

#[tokio::test]
async fn global_cap() {
    let adm = admission(3, 10, 10, 10);
    let _a = adm.admit("a").await.unwrap().succeeded();
    let _b = adm.admit("b").await.unwrap().succeeded();
    let c = adm.admit("c").await.unwrap();
    let err = reject_now(&adm, "d").await;
    assert_eq!(err.reason, GLOBAL);
    assert_eq!(err.retry_after, LIVE_CAP_RETRY_AFTER);
    drop(c);
    let _d = adm.admit("d").await.unwrap();
    assert_eq!(adm.snapshot(), stats(2, 1, 0, 1));
}

#[tokio::test]
async fn queued_callers_hold_live_reservations() {
    // One create slot, room for 5 in the queue, but only 2 live in all: the
    // third caller cannot become live, so it is told so instead of queuing.
    let adm = admission(2, 10, 1, 5);
    let _p = adm.admit("a").await.unwrap();
    let waiter = tokio::spawn({
        let adm = adm.clone();
        async move { adm.admit("b").await.map(|_| ()) }
    });
    until(|| adm.snapshot().queued == 1).await;
    assert_eq!(reject_now(&adm, "c").await.reason, GLOBAL);
    assert_eq!(adm.reserved_for_key("b"), 1);
    waiter.abort();
}

#[tokio::test]
async fn queue_bound() {
    let adm = admission(100, 100, 1, 2);
    let p = adm.admit("a").await.unwrap();
    let mut waiters = Vec::new();
    for _ in 0..2 {
        let adm = adm.clone();
        waiters.push(tokio::spawn(async move { adm.admit("a").await.map(drop) }));
    }
    until(|| adm.snapshot().queued == 2).await;
    let err = reject_now(&adm, "b").await;
    assert_eq!(
        err,
        Rejected {
            reason: RejectReason::QueueFull,
            retry_after: QUEUE_FULL_RETRY_AFTER
        }
    );
    assert_eq!(adm.snapshot(), stats(0, 1, 2, 1));
    drop(p);
    for w in waiters {
        w.await.unwrap().unwrap();
    }
    assert_eq!(adm.snapshot(), stats(0, 0, 0, 1));
}

#[tokio::test]
async fn zero_queue_rejects_when_slots_are_busy() {
    let adm = admission(100, 100, 1, 0);
    let _p = adm.admit("a").await.unwrap();
    assert_eq!(reject_now(&adm, "a").await.reason, RejectReason::QueueFull);
}

#[tokio::test]
async fn waiters_are_served_in_fifo_order() {
    let adm = admission(100, 100, 1, 10);
    let p = adm.admit("first").await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut handles = Vec::new();
    for i in 0..6 {
        let adm2 = adm.clone();
        let order = Arc::clone(&order);
        handles.push(tokio::spawn(async move {
            let permit = adm2.admit(&format!("k{}", i % 2)).await.unwrap();
            order.lock().unwrap().push(i);
            // Hold the slot across a yield so the next waiter really waits.
            tokio::task::yield_now().await;
            drop(permit);
        }));
        // Queue them one after the other.
        until(|| adm.snapshot().queued == i + 1).await;
    }
    drop(p);
    for h in handles {
        h.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3, 4, 5]);
    assert_eq!(adm.snapshot(), stats(0, 0, 0, 0));
}

#[tokio::test(start_paused = true)]
async fn a_dropped_waiter_leaves_the_queue() {
    let adm = admission(100, 100, 1, 1);
    let p = adm.admit("a").await.unwrap();
    // The client gives up after a second: its future is dropped.
    let gave_up = tokio::time::timeout(Duration::from_secs(1), adm.admit("b")).await;
    assert!(gave_up.is_err());
    assert_eq!(adm.snapshot(), stats(0, 1, 0, 0));
    assert_eq!(adm.reserved_for_key("b"), 0);

    // An aborted task leaves it too, and its place is free again.
    let waiter = tokio::spawn({
        let adm = adm.clone();
        async move { adm.admit("c").await.map(drop) }
    });
    until(|| adm.snapshot().queued == 1).await;
    assert_eq!(reject_now(&adm, "d").await.reason, RejectReason::QueueFull);
    waiter.abort();
    assert!(waiter.await.unwrap_err().is_cancelled());
    assert_eq!(adm.snapshot().queued, 0);
    assert_eq!(adm.reserved_for_key("c"), 0);

    // The slot released later goes to a live waiter, not the dropped ones.
    let waiter = tokio::spawn({
        let adm = adm.clone();
        async move { adm.admit("e").await.map(|p| p.key_id().to_owned()) }
    });
    until(|| adm.snapshot().queued == 1).await;
    drop(p);
    assert_eq!(waiter.await.unwrap().unwrap(), "e");
    assert_eq!(adm.snapshot(), stats(0, 0, 0, 1));
}

#[tokio::test]
async fn dropping_a_permit_releases_both_slots() {
    let adm = admission(1, 1, 1, 0);
    let p = adm.admit("a").await.unwrap();
    assert_eq!(adm.snapshot(), stats(0, 1, 0, 0));
    assert_eq!(reject_now(&adm, "a").await.reason, GLOBAL);
    drop(p); // creation failed
    assert_eq!(adm.snapshot(), stats(0, 0, 0, 1));
    assert_eq!(adm.reserved_for_key("a"), 0);
    let _p = adm.admit("a").await.unwrap();
}

#[tokio::test]
async fn succeeding_frees_the_create_slot_and_keeps_the_live_slot() {
    let adm = admission(10, 10, 1, 5);
    let p = adm.admit("a").await.unwrap();
    let waiter = tokio::spawn({
        let adm = adm.clone();
        async move { adm.admit("b").await.map(|p| p.succeeded()) }
    });
    until(|| adm.snapshot().queued == 1).await;
    let lease = p.succeeded();
    assert_eq!(lease.key_id(), "a");
    let lease_b = waiter.await.unwrap().unwrap();
    assert_eq!(adm.snapshot(), stats(2, 0, 0, 0));
    drop(lease);
    drop(lease_b);
    assert_eq!(adm.snapshot(), stats(0, 0, 0, 0));
}

#[tokio::test]
async fn dropping_a_lease_releases_its_live_slot() {
    let adm = admission(1, 1, 1, 1);
    let lease = adm.admit("a").await.unwrap().succeeded();
    assert_eq!(adm.snapshot(), stats(1, 0, 0, 0));
    assert_eq!(reject_now(&adm, "b").await.reason, GLOBAL);
    drop(lease); // sandbox destroyed
    assert_eq!(adm.snapshot(), stats(0, 0, 0, 1));
    let _lease = adm.admit("b").await.unwrap().succeeded();
}

#[tokio::test]
async fn adopted_sandboxes_count_against_the_caps() {
    let adm = admission(2, 1, 1, 1);
    let adopted: Vec<_> = (0..3).map(|_| adm.adopt("old")).collect();
    assert_eq!(adm.snapshot(), stats(3, 0, 0, 0));
    assert_eq!(reject_now(&adm, "new").await.reason, GLOBAL);
    drop(adopted);
    let _p = adm.admit("new").await.unwrap();
}

#[tokio::test]
async fn close_rejects_waiters_and_later_callers() {
    let adm = admission(10, 10, 1, 5);
    let p = adm.admit("a").await.unwrap();
    let waiter = tokio::spawn({
        let adm = adm.clone();
        async move { adm.admit("b").await.map(drop) }
    });
    until(|| adm.snapshot().queued == 1).await;
    adm.close();
    let err = waiter.await.unwrap().unwrap_err();
    assert_eq!(
        err,
        Rejected {
            reason: RejectReason::ShuttingDown,
            retry_after: SHUTTING_DOWN_RETRY_AFTER
        }
    );
    assert_eq!(
        reject_now(&adm, "c").await.reason,
        RejectReason::ShuttingDown
    );
    // What was given stays valid.
    let lease = p.succeeded();
    assert_eq!(adm.snapshot(), stats(1, 0, 0, 2));
    drop(lease);
    assert_eq!(adm.snapshot(), stats(0, 0, 0, 2));
}

#[test]
fn limits_are_validated() {
    assert!(Admission::new(AdmissionLimits::default()).is_ok());
    let base = AdmissionLimits {
        max_live_total: 1,
        max_live_per_key: 1,
        max_concurrent_creates: 1,
        max_queue: 0,
    };
    assert!(Admission::new(base).is_ok());
    let zero_creates = AdmissionLimits {
        max_concurrent_creates: 0,
        ..base
    };
    let err = Admission::new(zero_creates).unwrap_err();
    assert_eq!(err, LimitsError::Zero("max_concurrent_creates"));
    assert_eq!(
        err.to_string(),
        "the admission limit `max_concurrent_creates` must be at least 1"
    );
    let zero_total = AdmissionLimits {
        max_live_total: 0,
        ..base
    };
    assert_eq!(
        Admission::new(zero_total).unwrap_err(),
        LimitsError::Zero("max_live_total")
    );
    let huge = AdmissionLimits {
        max_concurrent_creates: usize::MAX,
        ..base
    };
    assert!(matches!(
        Admission::new(huge).unwrap_err(),
        LimitsError::TooManyCreates(_)
    ));
}

#[test]
fn rejection_messages_and_retry_after_header() {
    let r = Rejected {
        reason: RejectReason::QueueFull,
        retry_after: QUEUE_FULL_RETRY_AFTER,
    };
    assert_eq!(
        r.to_string(),
        "too many sandbox creations are waiting; retry after 1 s"
    );
    let r = Rejected {
        reason: PER_KEY,
        retry_after: Duration::from_millis(2500),
    };
    assert_eq!(r.retry_after_secs(), 3);
    assert_eq!(
        r.to_string(),
        "this API key is at its limit of live sandboxes; retry after 3 s"
    );
    let r = Rejected {
        reason: GLOBAL,
        retry_after: Duration::ZERO,
    };
    assert_eq!(r.retry_after_secs(), 1);
    assert_eq!(
        serde_json::to_string(&GLOBAL).unwrap(),
        r#"{"reason":"live_cap_reached","scope":"global"}"#
    );
}

/// What the stress callers observed, from the outside.
#[derive(Default)]
struct Observed {
    creating: AtomicUsize,
    max_creating: AtomicUsize,
    reserved: AtomicUsize,
    max_reserved: AtomicUsize,
    per_key: Mutex<HashMap<String, usize>>,
    max_per_key: AtomicUsize,
}

fn raise(max: &AtomicUsize, value: usize) {
    max.fetch_max(value, Ordering::SeqCst);
}

impl Observed {
    fn enter(&self, key: &str) {
        raise(
            &self.max_reserved,
            self.reserved.fetch_add(1, Ordering::SeqCst) + 1,
        );
        raise(
            &self.max_creating,
            self.creating.fetch_add(1, Ordering::SeqCst) + 1,
        );
        let mut per_key = self.per_key.lock().unwrap();
        let n = per_key.entry(key.to_owned()).or_insert(0);
        *n += 1;
        raise(&self.max_per_key, *n);
    }
    fn created(&self) {
        self.creating.fetch_sub(1, Ordering::SeqCst);
    }
    fn leave(&self, key: &str) {
        self.reserved.fetch_sub(1, Ordering::SeqCst);
        *self.per_key.lock().unwrap().get_mut(key).unwrap() -= 1;
    }
}

/// 200 concurrent callers over 7 keys against small caps. Each admitted
/// caller "creates" for a while, fails one time in four, else holds its lease
/// a while. The test counts, around every permit and lease, what is in
/// flight, and a monitor samples `snapshot()` throughout.
async fn stress() {
    const CALLERS: usize = 200;
    let limits = AdmissionLimits {
        max_live_total: 12,
        max_live_per_key: 5,
        max_concurrent_creates: 3,
        max_queue: 20,
    };
    let adm = Admission::new(limits).unwrap();
    let seen = Arc::new(Observed::default());
    let done = Arc::new(AtomicUsize::new(0));

    let monitor = tokio::spawn({
        let adm = adm.clone();
        let done = Arc::clone(&done);
        async move {
            let mut samples = 0;
            while done.load(Ordering::SeqCst) < CALLERS {
                let s = adm.snapshot();
                assert!(s.creating <= limits.max_concurrent_creates, "{s:?}");
                assert!(s.queued <= limits.max_queue, "{s:?}");
                assert!(
                    s.live_total + s.creating + s.queued <= limits.max_live_total,
                    "{s:?}"
                );
                samples += 1;
                tokio::time::sleep(Duration::from_micros(200)).await;
            }
            samples
        }
    });

    let mut tasks = Vec::new();
    for i in 0..CALLERS {
        let adm = adm.clone();
        let seen = Arc::clone(&seen);
        let done = Arc::clone(&done);
        tasks.push(tokio::spawn(async move {
            let key = format!("key{}", i % 7);
            let outcome = match adm.admit(&key).await {
                Ok(permit) => {
                    seen.enter(&key);
                    tokio::time::sleep(Duration::from_millis(1 + (i % 3) as u64)).await;
                    seen.created();
                    if i % 4 == 0 {
                        seen.leave(&key);
                        drop(permit);
                    } else {
                        let lease = permit.succeeded();
                        tokio::time::sleep(Duration::from_millis(2 + (i % 5) as u64)).await;
                        seen.leave(&key);
                        drop(lease);
                    }
                    Ok(())
                }
                Err(rejected) => Err(rejected.reason),
            };
            done.fetch_add(1, Ordering::SeqCst);
            outcome
        }));
    }

    let mut admitted = 0;
    let mut rejected: HashMap<RejectReason, usize> = HashMap::new();
    for t in tasks {
        match t.await.unwrap() {
            Ok(()) => admitted += 1,
            Err(reason) => *rejected.entry(reason).or_default() += 1,
        }
    }
    let samples = monitor.await.unwrap();
    let rejected_total: usize = rejected.values().sum();

    assert_eq!(admitted + rejected_total, CALLERS);
    assert!(admitted >= limits.max_live_total, "admitted {admitted}");
    assert!(rejected_total > 0, "nobody was rejected");
    assert!(
        !rejected.contains_key(&RejectReason::ShuttingDown),
        "{rejected:?}"
    );
    assert!(samples > 0);
    assert!(seen.max_creating.load(Ordering::SeqCst) <= limits.max_concurrent_creates);
    assert!(seen.max_reserved.load(Ordering::SeqCst) <= limits.max_live_total);
    assert!(seen.max_per_key.load(Ordering::SeqCst) <= limits.max_live_per_key);
    assert_eq!(
        adm.snapshot(),
        stats(0, 0, 0, u64::try_from(rejected_total).unwrap())
    );
    for k in 0..7 {
        assert_eq!(adm.reserved_for_key(&format!("key{k}")), 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stress_200_concurrent_admits_threads() {
    stress().await;
}

#[tokio::test(start_paused = true)]
async fn stress_200_concurrent_admits_paused_clock() {
    stress().await;
}

#[tokio::test]
async fn idle_admission_takes_a_slot_only_when_no_caller_waits_and_room_stays() {
    let adm = admission(3, 2, 2, 4);
    // One slot must stay free: with two, one may be taken.
    let first = adm.try_admit_idle("pool", 1).unwrap();
    assert!(adm.try_admit_idle("pool", 1).is_none());
    // A caller takes the last slot; the next one waits, and while it does
    // background work gets nothing, even once a slot frees.
    let caller = adm.admit("a").await.unwrap();
    let waiting = tokio::spawn({
        let adm = adm.clone();
        async move { adm.admit("b").await.map(|p| p.succeeded()) }
    });
    until(|| adm.snapshot().queued == 1).await;
    assert!(adm.try_admit_idle("pool", 0).is_none());
    drop(first);
    let lease = waiting.await.unwrap().unwrap();
    // Per-key and total caps bind it as they bind callers.
    let pool_live = adm.try_admit_idle("pool", 0).unwrap().succeeded();
    assert!(adm.try_admit_idle("pool", 0).is_none(), "total cap of 3");
    drop(caller);
    drop(lease);
    let second = adm.try_admit_idle("pool", 0).unwrap().succeeded();
    assert!(adm.try_admit_idle("pool", 0).is_none(), "per-key cap of 2");
    drop((pool_live, second));
    assert_eq!(adm.snapshot(), stats(0, 0, 0, 0));
}
