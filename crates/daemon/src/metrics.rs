//! Prometheus metrics of the daemon (`GET /metrics`).
//!
//! Counters and histograms are updated where things happen; gauges of
//! current state (sandboxes by state, queue depth, leaked resources) are
//! set from the live registry right before each scrape, so they cannot drift.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Label of a sandbox state.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabel {
    /// `creating|running|paused|stopping`.
    pub state: &'static str,
}

/// Label of a warm pool.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabel {
    /// Its name.
    pub pool: String,
}

/// Label of why a sandbox died.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// A `DeadReason` string.
    pub reason: &'static str,
}

/// How an exec ended.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)] // the variant names are the label values
pub enum ExecOutcome {
    /// It exited with code 0.
    ok,
    /// It exited with another code or a signal.
    failed,
    /// It could not start.
    error,
    /// Its timeout killed it.
    timeout,
}

/// Label of an exec outcome.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    /// How it ended.
    pub outcome: ExecOutcome,
}

/// Label of an egress decision.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EgressLabel {
    /// `tcp` or `dns`.
    pub protocol: &'static str,
    /// The decision's stable code (`allowed`, `not_allowlisted`, …).
    pub reason: &'static str,
}

/// Label of an HTTP answer class.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StatusLabel {
    /// The status code.
    pub code: u16,
}

/// Every metric of the daemon.
pub struct Metrics {
    registry: Registry,
    /// Live sandboxes by state (set before each scrape).
    pub sandboxes: Family<StateLabel, Gauge>,
    /// Sandboxes that died, by reason.
    pub deaths: Family<ReasonLabel, Counter>,
    /// Seconds from create request to a running sandbox.
    pub create_seconds: Histogram,
    /// Execs by outcome.
    pub execs: Family<OutcomeLabel, Counter>,
    /// Seconds from exec request to exit.
    pub exec_seconds: Histogram,
    /// Callers waiting for a create slot (set before each scrape).
    pub queue_depth: Gauge,
    /// Creates refused with 429 (or 503 while shutting down).
    pub rejected: Counter,
    /// OOM kills seen in sandboxes.
    pub oom_kills: Counter,
    /// Teardowns that left something behind.
    pub teardown_failures: Counter,
    /// Host resources that belong to no live sandbox (set before each
    /// scrape; must stay 0).
    pub leaked_resources: Gauge,
    pub unowned_layers: Gauge,
    /// API answers by status code.
    pub http_responses: Family<StatusLabel, Counter>,
    /// Audit events dropped because the writer fell behind (set before each scrape).
    pub audit_dropped: Gauge,
    /// Security events summed into `audit.suppressed` instead of written
    /// in full (set before each scrape).
    pub audit_suppressed: Gauge,
    /// HTTP connections open.
    pub http_connections: Gauge,
    /// HTTP connections closed to make room for a new one under a cap.
    pub http_connections_evicted: Counter,
    /// HTTP connections turned away because nothing could make room.
    pub http_connections_refused: Counter,
    /// Egress connections and lookups, by protocol and decision.
    pub egress: Family<EgressLabel, Counter>,
    /// Warm pool members ready, starting, and the number kept ready (set
    /// before each scrape).
    pub pool_ready: Family<PoolLabel, Gauge>,
    pub pool_starting: Family<PoolLabel, Gauge>,
    pub pool_target: Family<PoolLabel, Gauge>,
    /// Creates a pool served, creates that found it empty, members started
    /// and members that failed to start.
    pub pool_claims: Family<PoolLabel, Counter>,
    pub pool_misses: Family<PoolLabel, Counter>,
    pub pool_refills: Family<PoolLabel, Counter>,
    pub pool_refill_failures: Family<PoolLabel, Counter>,
}

/// Latency buckets from 1 ms to about 16 s.
fn latency_buckets() -> impl Iterator<Item = f64> {
    prometheus_client::metrics::histogram::exponential_buckets(0.001, 2.0, 15)
}

impl Metrics {
    /// All metrics, registered under the `airlock_` prefix.
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("airlock");
        let sandboxes = Family::<StateLabel, Gauge>::default();
        let deaths = Family::<ReasonLabel, Counter>::default();
        let create_seconds = Histogram::new(latency_buckets());
        let execs = Family::<OutcomeLabel, Counter>::default();
        let exec_seconds = Histogram::new(latency_buckets());
        let queue_depth = Gauge::default();
        let rejected = Counter::default();
        let oom_kills = Counter::default();
        let teardown_failures = Counter::default();
        let leaked_resources = Gauge::default();
        let unowned_layers = Gauge::default();
        let http_responses = Family::<StatusLabel, Counter>::default();
        let audit_dropped = Gauge::default();
        let audit_suppressed = Gauge::default();
        let http_connections = Gauge::default();
        let http_connections_evicted = Counter::default();
        let http_connections_refused = Counter::default();
        registry.register(
            "http_connections",
            "HTTP connections open",
            http_connections.clone(),
        );
        registry.register(
            "http_connections_evicted",
            "HTTP connections closed to make room for a new one under a cap",
            http_connections_evicted.clone(),
        );
        registry.register(
            "http_connections_refused",
            "HTTP connections turned away because no open one could make room",
            http_connections_refused.clone(),
        );
        registry.register("sandboxes", "Live sandboxes by state", sandboxes.clone());
        registry.register(
            "sandbox_deaths",
            "Sandboxes that ended, by reason",
            deaths.clone(),
        );
        registry.register(
            "sandbox_create_seconds",
            "Time from a create request to a running sandbox",
            create_seconds.clone(),
        );
        registry.register(
            "execs",
            "Processes started through the API, by outcome",
            execs.clone(),
        );
        registry.register(
            "exec_seconds",
            "Time from an exec request to the process's exit",
            exec_seconds.clone(),
        );
        registry.register(
            "admission_queue_depth",
            "Create requests waiting for a slot",
            queue_depth.clone(),
        );
        registry.register(
            "admission_rejected",
            "Create requests refused with 429 or 503",
            rejected.clone(),
        );
        registry.register(
            "oom_kills",
            "Processes killed by a sandbox's memory limit",
            oom_kills.clone(),
        );
        registry.register(
            "teardown_failures",
            "Sandbox teardowns that left a resource behind",
            teardown_failures.clone(),
        );
        registry.register(
            "leaked_resources",
            "Host resources (cgroups, slots) that belong to no live sandbox; must be 0",
            leaked_resources.clone(),
        );
        registry.register(
            "layer_store_unowned_entries",
            "Entries of the layer store that no record names (half-done imports included); must be 0 once the collector ran",
            unowned_layers.clone(),
        );
        registry.register(
            "http_responses",
            "API answers by status code",
            http_responses.clone(),
        );
        registry.register(
            "audit_dropped_events",
            "Audit events dropped because the writer fell behind",
            audit_dropped.clone(),
        );
        registry.register(
            "audit_suppressed_events",
            "Security events summed into an audit.suppressed summary instead of written in full",
            audit_suppressed.clone(),
        );
        let egress = Family::<EgressLabel, Counter>::default();
        registry.register(
            "egress",
            "Egress connections and DNS lookups by protocol and decision",
            egress.clone(),
        );
        let pool_ready = Family::<PoolLabel, Gauge>::default();
        let pool_starting = Family::<PoolLabel, Gauge>::default();
        let pool_target = Family::<PoolLabel, Gauge>::default();
        let pool_claims = Family::<PoolLabel, Counter>::default();
        let pool_misses = Family::<PoolLabel, Counter>::default();
        let pool_refills = Family::<PoolLabel, Counter>::default();
        let pool_refill_failures = Family::<PoolLabel, Counter>::default();
        registry.register(
            "pool_ready",
            "Warm pool members ready to be claimed",
            pool_ready.clone(),
        );
        registry.register(
            "pool_starting",
            "Warm pool members being started",
            pool_starting.clone(),
        );
        registry.register(
            "pool_target",
            "Warm pool members a pool keeps ready now",
            pool_target.clone(),
        );
        registry.register(
            "pool_claims",
            "Creates a warm pool served with a ready member",
            pool_claims.clone(),
        );
        registry.register(
            "pool_misses",
            "Creates that fit a warm pool that had no member ready",
            pool_misses.clone(),
        );
        registry.register(
            "pool_refills",
            "Warm pool members started",
            pool_refills.clone(),
        );
        registry.register(
            "pool_refill_failures",
            "Warm pool members that failed to start",
            pool_refill_failures.clone(),
        );
        Metrics {
            registry,
            pool_ready,
            pool_starting,
            pool_target,
            pool_claims,
            pool_misses,
            pool_refills,
            pool_refill_failures,
            sandboxes,
            deaths,
            create_seconds,
            execs,
            exec_seconds,
            queue_depth,
            rejected,
            oom_kills,
            teardown_failures,
            leaked_resources,
            unowned_layers,
            http_responses,
            audit_dropped,
            audit_suppressed,
            http_connections,
            http_connections_evicted,
            http_connections_refused,
            egress,
        }
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}
