//! Bounds on what one sandbox can make the daemon do through its egress
//! path: how many DNS queries a second it gets answered and how many at
//! once, how many connections it may have open through the proxy and how
//! fast it may open them.
//!
//! Past a bound the work is not done (the query is dropped, the connection
//! closed at once), and the sandbox's being limited is reported as one
//! `rate_limited` refusal at most once per [`REPORT_EVERY`], not once per
//! dropped query: a flood must cost the daemon neither disk nor memory in
//! proportion to its size.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// A limited sandbox is reported at most this often.
pub const REPORT_EVERY: Duration = Duration::from_secs(1);

/// The bounds of one sandbox's egress path.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct EgressLimits {
    /// DNS queries answered per second, sustained.
    pub dns_per_second: f64,
    /// DNS queries answered in a burst above the sustained rate.
    pub dns_burst: f64,
    /// DNS queries being answered at once (each may wait on a host lookup).
    pub dns_in_flight: usize,
    /// Connections through the proxy opened per second, sustained.
    pub connections_per_second: f64,
    /// Connections opened in a burst above the sustained rate.
    pub connections_burst: f64,
    /// Connections through the proxy open at once.
    pub connections_open: usize,
}

impl Default for EgressLimits {
    /// Far above what package managers, browsers and crawlers need (pip
    /// opens a handful of connections; a resolver sees tens of queries a
    /// second at most), far below what would load the daemon.
    fn default() -> Self {
        EgressLimits {
            dns_per_second: 100.0,
            dns_burst: 200.0,
            dns_in_flight: 32,
            connections_per_second: 200.0,
            connections_burst: 400.0,
            connections_open: 512,
        }
    }
}

/// A token bucket: `rate` tokens a second, at most `burst` saved up.
#[derive(Debug)]
pub struct Bucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl Bucket {
    /// A full bucket.
    pub fn new(rate: f64, burst: f64, now: Instant) -> Bucket {
        let burst = burst.max(1.0);
        Bucket {
            rate: rate.max(0.0),
            burst,
            tokens: burst,
            last: now,
        }
    }

    /// Takes a token if there is one at `now`.
    pub fn take(&mut self, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now.max(self.last);
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// One kind of work of one sandbox, bounded in rate and in concurrency.
pub(crate) struct Gate {
    bucket: Mutex<Bucket>,
    slots: Arc<Semaphore>,
    /// Work refused since the start (what the metric of the path counts).
    refused: AtomicU64,
    /// When the last refusal was reported.
    reported: Mutex<Option<Instant>>,
}

/// Why a gate refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// Over the rate; `report` says whether this refusal should be reported.
    Rate { report: bool },
    /// Too much at once.
    Busy { report: bool },
}

impl Refused {
    pub(crate) fn report(self) -> bool {
        match self {
            Refused::Rate { report } | Refused::Busy { report } => report,
        }
    }
}

impl Gate {
    pub(crate) fn new(rate: f64, burst: f64, at_once: usize) -> Gate {
        Gate {
            bucket: Mutex::new(Bucket::new(rate, burst, Instant::now())),
            slots: Arc::new(Semaphore::new(at_once.max(1))),
            refused: AtomicU64::new(0),
            reported: Mutex::new(None),
        }
    }

    /// A slot for one piece of work, held until the permit drops, or why not.
    pub(crate) fn enter(&self) -> Result<OwnedSemaphorePermit, Refused> {
        let now = Instant::now();
        let admitted = self
            .bucket
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take(now);
        if !admitted {
            return Err(Refused::Rate {
                report: self.refusal(now),
            });
        }
        Arc::clone(&self.slots)
            .try_acquire_owned()
            .map_err(|_| Refused::Busy {
                report: self.refusal(now),
            })
    }

    /// Counts a refusal; true when it is the first for [`REPORT_EVERY`].
    fn refusal(&self, now: Instant) -> bool {
        self.refused.fetch_add(1, Ordering::Relaxed);
        let mut reported = self.reported.lock().unwrap_or_else(|p| p.into_inner());
        match *reported {
            Some(at) if now.saturating_duration_since(at) < REPORT_EVERY => false,
            _ => {
                *reported = Some(now);
                true
            }
        }
    }

    /// Work refused since the start.
    #[cfg(test)]
    pub(crate) fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_gives_its_burst_then_its_rate() {
        let start = Instant::now();
        let mut bucket = Bucket::new(10.0, 5.0, start);
        let burst = (0..100).filter(|_| bucket.take(start)).count();
        assert_eq!(burst, 5);
        // Half a second at 10/s refills five.
        let later = start + Duration::from_millis(500);
        let refilled = (0..100).filter(|_| bucket.take(later)).count();
        assert_eq!(refilled, 5);
        // Never more than the burst, however long it waited.
        let much_later = later + Duration::from_secs(3600);
        let capped = (0..100).filter(|_| bucket.take(much_later)).count();
        assert_eq!(capped, 5);
    }

    #[test]
    fn a_gate_bounds_work_at_once_and_reports_once_a_second() {
        let gate = Gate::new(0.0, 1e9, 2);
        let first = gate.enter().unwrap();
        let _second = gate.enter().unwrap();
        let third = gate.enter().unwrap_err();
        assert_eq!(third, Refused::Busy { report: true });
        // A flood of refusals is reported once.
        let reported = (0..1000)
            .filter(|_| gate.enter().unwrap_err().report())
            .count();
        assert_eq!(reported, 0);
        assert_eq!(gate.refused(), 1001);
        drop(first);
        assert!(gate.enter().is_ok(), "a slot comes back with its permit");
    }

    #[test]
    fn a_gate_refuses_past_its_rate() {
        let gate = Gate::new(0.0, 3.0, 100);
        let permits: Vec<_> = (0..3).map(|_| gate.enter().unwrap()).collect();
        drop(permits);
        assert_eq!(gate.enter().unwrap_err(), Refused::Rate { report: true });
    }
}
