//! Every metric idemgate exports, registered in one place. Per-route handles are
//! resolved once at start, so recording an outcome on the hot path is an atomic add,
//! with no label lookup or allocation.

mod activity;
mod reload;
pub use activity::SERIES;
pub use reload::ReloadMetrics;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use activity::RouteActivity;
use prometheus::{
    Encoder, Gauge, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

/// What became of a delivery; the `outcome` label of `idemgate_requests_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Forwarded,
    Replayed,
    InFlight,
    PayloadMismatch,
    InvalidSignature,
    BadRequest,
    TooLarge,
    UpstreamError,
    StoreUnavailable,
    Bypassed,
    NoRoute,
    /// Over `max_in_flight`: refused with a fast 503 before anything was read.
    Overloaded,
    /// The body did not arrive within `body_timeout` (408).
    ClientTimeout,
    /// An async route's first copy: appended to the queue and acknowledged.
    Queued,
    /// An async route's queue held `max_queue` entries: 503 + Retry-After.
    QueueFull,
    /// A provider's URL check (Slack's challenge, Meta's GET, ...): answered or
    /// forwarded, never claimed.
    Handshake,
    /// A signed request holding no key, forwarded without de-duplication (`keyless`).
    Unkeyed,
    /// A signed body already seen under the most unsigned scopes allowed (422).
    ScopeRefused,
}

impl Outcome {
    pub const ALL: [Outcome; 18] = [
        Outcome::Forwarded,
        Outcome::Replayed,
        Outcome::InFlight,
        Outcome::PayloadMismatch,
        Outcome::InvalidSignature,
        Outcome::BadRequest,
        Outcome::TooLarge,
        Outcome::UpstreamError,
        Outcome::StoreUnavailable,
        Outcome::Bypassed,
        Outcome::NoRoute,
        Outcome::Overloaded,
        Outcome::ClientTimeout,
        Outcome::Queued,
        Outcome::QueueFull,
        Outcome::Handshake,
        Outcome::Unkeyed,
        Outcome::ScopeRefused,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Forwarded => "forwarded",
            Outcome::Replayed => "replayed",
            Outcome::InFlight => "in_flight",
            Outcome::PayloadMismatch => "payload_mismatch",
            Outcome::InvalidSignature => "invalid_signature",
            Outcome::BadRequest => "bad_request",
            Outcome::TooLarge => "too_large",
            Outcome::UpstreamError => "upstream_error",
            Outcome::StoreUnavailable => "store_unavailable",
            Outcome::Bypassed => "bypassed",
            Outcome::NoRoute => "no_route",
            Outcome::Overloaded => "overloaded",
            Outcome::ClientTimeout => "client_timeout",
            Outcome::Queued => "queued",
            Outcome::QueueFull => "queue_full",
            Outcome::Handshake => "handshake",
            Outcome::Unkeyed => "unkeyed",
            Outcome::ScopeRefused => "scope_refused",
        }
    }

    fn index(self) -> usize {
        self as usize
    }

    /// Whether a route of `kind` can end a delivery with this outcome: only those
    /// series are exported, so none sits at 0 forever. `handshake` and `unkeyed` depend
    /// on the route's provider: `Metrics::route` takes them in `also`.
    pub fn possible(self, kind: RouteKind) -> bool {
        use Outcome::*;
        if matches!(self, Handshake | Unkeyed | ScopeRefused) {
            return false;
        }
        match kind {
            RouteKind::Unmatched => matches!(self, NoRoute | Overloaded),
            RouteKind::Sync { pass } => match self {
                NoRoute | Queued | QueueFull => false,
                // with "pass" a store failure forwards (bypassed or upstream_error)
                Bypassed => pass,
                StoreUnavailable => !pass,
                _ => true,
            },
            RouteKind::Async { pass } => match self {
                NoRoute | Forwarded => false,
                // an async route calls the upstream itself only to bypass the store
                Bypassed | UpstreamError => pass,
                _ => true,
            },
        }
    }
}

/// What kind of route a set of handles is for: it decides which series exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteKind {
    /// `route="-"`: requests that match no route.
    Unmatched,
    /// A sync route; `pass` = `on_error = "pass"`.
    Sync { pass: bool },
    /// An async route; `pass` = `on_error = "pass"`.
    Async { pass: bool },
}

impl RouteKind {
    /// The kind of a configured route.
    pub fn of(route: &crate::config::RouteConfig, on_error: crate::config::OnStoreError) -> Self {
        let pass = on_error == crate::config::OnStoreError::Pass;
        match route.mode {
            crate::config::RouteMode::Sync => RouteKind::Sync { pass },
            crate::config::RouteMode::Async(_) => RouteKind::Async { pass },
        }
    }

    /// Whether the route calls the upstream while the provider waits (sync forwards,
    /// or any route's bypass): only then has it upstream latencies.
    fn calls_upstream(self) -> bool {
        match self {
            RouteKind::Unmatched => false,
            RouteKind::Sync { .. } => true,
            RouteKind::Async { pass } => pass,
        }
    }
}

/// Store operations timed in `idemgate_store_duration_seconds{op}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreOp {
    Claim,
    Complete,
    Release,
    Renew,
}

impl StoreOp {
    const ALL: [StoreOp; 4] = [
        StoreOp::Claim,
        StoreOp::Complete,
        StoreOp::Release,
        StoreOp::Renew,
    ];

    fn as_str(self) -> &'static str {
        match self {
            StoreOp::Claim => "claim",
            StoreOp::Complete => "complete",
            StoreOp::Release => "release",
            StoreOp::Renew => "renew",
        }
    }
}

/// The registry and the metric families.
pub struct Metrics {
    registry: Registry,
    requests: IntCounterVec,
    request_duration: HistogramVec,
    upstream_duration: HistogramVec,
    lease_lost: IntCounterVec,
    store_duration: [Histogram; 4],
    store_errors: [IntCounter; 4],
    pub in_flight: IntGauge,
    /// 1 while the store's circuit breaker is open (or half-open), else 0.
    pub store_circuit_open: IntGauge,
    /// 1 once the `file:` store's journal can write nothing any more (a full disk, an
    /// I/O error): every delivery gets 503 and `/healthz` fails until a restart.
    pub store_journal_failed: IntGauge,
    /// Deliveries the in-process store forgot to stay under `store.max_memory`.
    pub store_evictions: IntCounter,
    /// Since when the in-process store's oldest remembered delivery was settled: the
    /// dedup window it really gives (retention, or less once it evicts).
    pub store_oldest_age: Gauge,
    /// Webhook connections open now.
    pub connections: IntGauge,
    /// Webhook connections closed at once because `max_connections` were open.
    pub connections_refused: IntCounter,
    /// Webhook connections accepted, by the delivery runtime whose listener the kernel
    /// gave them to (`runtime`: 0 to `worker_threads` - 1): how evenly it spreads them.
    pub connections_accepted: IntCounterVec,
    /// Spans the trace exporter gave up (`reason`: `queue_full`, `export_failed`).
    pub trace_spans_dropped: IntCounterVec,
    queue: QueueFamilies,
    /// `idemgate_config_*`: live configuration reloads.
    pub reload: ReloadMetrics,
    /// The per-minute activity ring of each configured route, read by the console.
    activity: Mutex<HashMap<String, Arc<RouteActivity>>>,
}

/// The async queues' metric families (docs/async.md).
struct QueueFamilies {
    depth: IntGaugeVec,
    pending: IntGaugeVec,
    oldest: prometheus::GaugeVec,
    attempts: IntCounterVec,
    dead_letters: IntCounterVec,
    dead_letter_size: IntGaugeVec,
    delivery_duration: HistogramVec,
    paused: IntGaugeVec,
}

/// One async route's queue handles, resolved at start.
#[derive(Clone)]
pub struct QueueMetrics {
    /// Unacknowledged entries in the queue (waiting or in a consumer's hands).
    pub depth: IntGauge,
    /// Entries read by a consumer and not yet acknowledged.
    pub pending: IntGauge,
    /// Age of the oldest unacknowledged entry, in seconds (0 when empty).
    pub oldest_age: prometheus::Gauge,
    /// Delivery attempts that the upstream completed.
    pub attempts_ok: IntCounter,
    /// Delivery attempts that failed (non-2xx, unreachable, timeout).
    pub attempts_failed: IntCounter,
    /// Delivery attempts the application answered 429/503 with `Retry-After`: the
    /// route was held and the attempt not counted.
    pub attempts_held: IntCounter,
    /// 1 while the route is paused (for every sidecar sharing the store).
    pub paused: IntGauge,
    /// Entries moved to the dead-letter stream.
    pub dead_letters: IntCounter,
    /// Entries in the dead-letter stream now.
    pub dead_letter_size: IntGauge,
    /// Time an upstream call from the queue took.
    pub delivery_duration: Histogram,
}

/// One route's handles, resolved at start. An outcome the route cannot produce has no
/// handle; the upstream and lease-lost handles of a route that cannot move them are
/// never exported.
pub struct RouteMetrics {
    requests: Vec<Option<(IntCounter, Histogram)>>,
    pub upstream: Histogram,
    pub lease_lost: IntCounter,
    /// The route's per-minute ring (none for the no-route `-` metrics, never charted).
    activity: Option<Arc<RouteActivity>>,
}

impl RouteMetrics {
    pub fn record(&self, outcome: Outcome, seconds: f64) {
        if let Some((count, duration)) = &self.requests[outcome.index()] {
            count.inc();
            duration.observe(seconds);
        }
    }

    /// Records a delivery the route handled (not one refused before it was read, which
    /// `record` counts): the metric, and a count in the console's per-minute chart.
    pub fn record_handled(&self, outcome: Outcome, seconds: f64) {
        self.record(outcome, seconds);
        if let Some(a) = &self.activity {
            a.record(outcome);
        }
    }
}

/// A histogram that is never registered: the handle of a series a route cannot move.
fn unexported_histogram() -> Histogram {
    Histogram::with_opts(HistogramOpts::new("unexported", "never exported")).expect("valid metric")
}

const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
const STORE_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

impl Metrics {
    /// Copies a bounded store's figures into `idemgate_store_evictions_total` and
    /// `idemgate_store_oldest_age_seconds` (at each scrape).
    pub fn store_bound(&self, evictions: u64, oldest_age: std::time::Duration) {
        let seen = self.store_evictions.get();
        self.store_evictions.inc_by(evictions.saturating_sub(seen));
        self.store_oldest_age.set(oldest_age.as_secs_f64());
    }

    pub fn new() -> Metrics {
        let registry = Registry::new();
        let requests = IntCounterVec::new(
            Opts::new(
                "idemgate_requests_total",
                "Deliveries by route and outcome.",
            ),
            &["route", "outcome"],
        )
        .expect("valid metric");
        let request_duration = HistogramVec::new(
            HistogramOpts::new(
                "idemgate_request_duration_seconds",
                "Time from receipt to answer, by route and outcome.",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
            &["route", "outcome"],
        )
        .expect("valid metric");
        let upstream_duration = HistogramVec::new(
            HistogramOpts::new(
                "idemgate_upstream_duration_seconds",
                "Time the upstream took to answer a forwarded delivery.",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
            &["route"],
        )
        .expect("valid metric");
        let store_duration_vec = HistogramVec::new(
            HistogramOpts::new(
                "idemgate_store_duration_seconds",
                "Store round trips by operation.",
            )
            .buckets(STORE_BUCKETS.to_vec()),
            &["op"],
        )
        .expect("valid metric");
        let store_errors_vec = IntCounterVec::new(
            Opts::new(
                "idemgate_store_errors_total",
                "Store operations that failed or timed out.",
            ),
            &["op"],
        )
        .expect("valid metric");
        let in_flight = IntGauge::new("idemgate_in_flight", "Deliveries being processed now.")
            .expect("valid metric");
        let store_circuit_open = IntGauge::new(
            "idemgate_store_circuit_open",
            "1 while the store circuit breaker is open and deliveries get 503 without asking the store.",
        )
        .expect("valid metric");
        let store_journal_failed = IntGauge::new(
            "idemgate_store_journal_failed",
            "1 once the file: store cannot write its directory (disk full, I/O error): deliveries get 503 and /healthz fails until a restart.",
        )
        .expect("valid metric");
        let store_evictions = IntCounter::new(
            "idemgate_store_evictions_total",
            "Settled deliveries the in-process store forgot before their retention to stay under store.max_memory (a copy of one is forwarded again).",
        )
        .expect("valid metric");
        let store_oldest_age = Gauge::new(
            "idemgate_store_oldest_age_seconds",
            "Age of the oldest delivery the in-process store remembers (since it was settled): the effective dedup window.",
        )
        .expect("valid metric");
        let connections = IntGauge::new(
            "idemgate_connections",
            "Webhook connections open now (at most max_connections).",
        )
        .expect("valid metric");
        let connections_refused = IntCounter::new(
            "idemgate_connections_refused_total",
            "Webhook connections closed on accept because max_connections were open.",
        )
        .expect("valid metric");
        let connections_accepted = IntCounterVec::new(
            Opts::new(
                "idemgate_connections_accepted_total",
                "Webhook connections accepted, by the delivery runtime (worker thread) that took them.",
            ),
            &["runtime"],
        )
        .expect("valid metric");
        let lease_lost = IntCounterVec::new(
            Opts::new(
                "idemgate_lease_lost_total",
                "Deliveries whose claim was lost, or whose completion could not be recorded, after the upstream answered.",
            ),
            &["route"],
        )
        .expect("valid metric");
        let build_info = IntGaugeVec::new(
            Opts::new(
                "idemgate_build_info",
                "Build information; the value is always 1.",
            ),
            &["version"],
        )
        .expect("valid metric");
        build_info
            .with_label_values(&[env!("CARGO_PKG_VERSION")])
            .set(1);

        let trace_spans_dropped = IntCounterVec::new(
            Opts::new(
                "idemgate_trace_spans_dropped_total",
                "Spans not exported: the export queue was full (queue_full) or the collector failed (export_failed).",
            ),
            &["reason"],
        )
        .expect("valid metric");
        for reason in ["queue_full", "export_failed"] {
            trace_spans_dropped.with_label_values(&[reason]);
        }

        let queue = QueueFamilies::new();
        for c in [
            Box::new(requests.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(request_duration.clone()),
            Box::new(upstream_duration.clone()),
            Box::new(store_duration_vec.clone()),
            Box::new(store_errors_vec.clone()),
            Box::new(in_flight.clone()),
            Box::new(store_circuit_open.clone()),
            Box::new(store_journal_failed.clone()),
            Box::new(store_evictions.clone()),
            Box::new(store_oldest_age.clone()),
            Box::new(connections.clone()),
            Box::new(connections_refused.clone()),
            Box::new(connections_accepted.clone()),
            Box::new(trace_spans_dropped.clone()),
            Box::new(lease_lost.clone()),
            Box::new(build_info),
            Box::new(queue.depth.clone()),
            Box::new(queue.pending.clone()),
            Box::new(queue.oldest.clone()),
            Box::new(queue.attempts.clone()),
            Box::new(queue.dead_letters.clone()),
            Box::new(queue.dead_letter_size.clone()),
            Box::new(queue.paused.clone()),
            Box::new(queue.delivery_duration.clone()),
        ] {
            registry.register(c).expect("metric registered once");
        }
        let reload = ReloadMetrics::register(&registry);
        let store_duration =
            StoreOp::ALL.map(|op| store_duration_vec.with_label_values(&[op.as_str()]));
        let store_errors =
            StoreOp::ALL.map(|op| store_errors_vec.with_label_values(&[op.as_str()]));
        Metrics {
            registry,
            requests,
            request_duration,
            upstream_duration,
            lease_lost,
            store_duration,
            store_errors,
            in_flight,
            store_circuit_open,
            store_journal_failed,
            store_evictions,
            store_oldest_age,
            connections,
            connections_refused,
            connections_accepted,
            trace_spans_dropped,
            queue,
            reload,
            activity: Mutex::new(HashMap::new()),
        }
    }

    /// Resolves an async route's queue handles.
    pub fn queue(&self, route: &str) -> QueueMetrics {
        let q = &self.queue;
        QueueMetrics {
            depth: q.depth.with_label_values(&[route]),
            pending: q.pending.with_label_values(&[route]),
            oldest_age: q.oldest.with_label_values(&[route]),
            attempts_ok: q.attempts.with_label_values(&[route, "completed"]),
            attempts_failed: q.attempts.with_label_values(&[route, "failed"]),
            attempts_held: q.attempts.with_label_values(&[route, "held"]),
            paused: q.paused.with_label_values(&[route]),
            dead_letters: q.dead_letters.with_label_values(&[route]),
            dead_letter_size: q.dead_letter_size.with_label_values(&[route]),
            delivery_duration: q.delivery_duration.with_label_values(&[route]),
        }
    }

    /// Resolves a route's handles (route `-` for requests that match no route),
    /// creating at 0 exactly the series a route of `kind` can move, plus those in
    /// `also` (the provider-dependent `handshake` and `unkeyed`).
    pub fn route(&self, name: &str, kind: RouteKind, also: &[Outcome]) -> RouteMetrics {
        let sync = matches!(kind, RouteKind::Sync { .. });
        RouteMetrics {
            requests: Outcome::ALL
                .iter()
                .map(|o| {
                    (o.possible(kind) || also.contains(o)).then(|| {
                        (
                            self.requests.with_label_values(&[name, o.as_str()]),
                            self.request_duration.with_label_values(&[name, o.as_str()]),
                        )
                    })
                })
                .collect(),
            upstream: if kind.calls_upstream() {
                self.upstream_duration.with_label_values(&[name])
            } else {
                unexported_histogram()
            },
            // only a sync forward can lose its lease after the upstream answered
            lease_lost: if sync {
                self.lease_lost.with_label_values(&[name])
            } else {
                IntCounter::new("unexported", "never exported").expect("valid metric")
            },
            activity: (!matches!(kind, RouteKind::Unmatched)).then(|| {
                self.activity
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .entry(name.to_string())
                    .or_default()
                    .clone()
            }),
        }
    }

    /// The last hour of `route`'s activity, oldest minute first (all zero for a route
    /// that has no ring).
    pub fn last_hour(&self, route: &str) -> Vec<[u64; activity::SERIES.len()]> {
        let ring = self
            .activity
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(route)
            .cloned();
        ring.map(|r| r.last_hour())
            .unwrap_or_else(|| RouteActivity::new().last_hour())
    }

    pub fn store_op(&self, op: StoreOp, seconds: f64, failed: bool) {
        self.store_duration[op as usize].observe(seconds);
        if failed {
            self.store_errors[op as usize].inc();
        }
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 * 1024);
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl QueueFamilies {
    fn new() -> QueueFamilies {
        let gauge = |name: &str, help: &str| {
            IntGaugeVec::new(Opts::new(name, help), &["route"]).expect("valid metric")
        };
        QueueFamilies {
            depth: gauge(
                "idemgate_queue_depth",
                "Unacknowledged entries in an async route's queue.",
            ),
            pending: gauge(
                "idemgate_queue_pending",
                "Queue entries held by a consumer and not yet acknowledged.",
            ),
            oldest: prometheus::GaugeVec::new(
                Opts::new(
                    "idemgate_queue_oldest_age_seconds",
                    "Age of the oldest unacknowledged queue entry.",
                ),
                &["route"],
            )
            .expect("valid metric"),
            attempts: IntCounterVec::new(
                Opts::new(
                    "idemgate_delivery_attempts_total",
                    "Upstream calls made from the queue, by result (completed, failed, held: the application's 429/503 with Retry-After).",
                ),
                &["route", "result"],
            )
            .expect("valid metric"),
            dead_letters: IntCounterVec::new(
                Opts::new(
                    "idemgate_dead_letters_total",
                    "Queue entries that exhausted max_attempts or max_age.",
                ),
                &["route"],
            )
            .expect("valid metric"),
            dead_letter_size: gauge(
                "idemgate_dead_letter_size",
                "Entries in an async route's dead-letter stream.",
            ),
            paused: gauge(
                "idemgate_route_paused",
                "1 while an async route is paused (it queues and delivers nothing).",
            ),
            delivery_duration: HistogramVec::new(
                HistogramOpts::new(
                    "idemgate_delivery_duration_seconds",
                    "Time an upstream call from the queue took.",
                )
                .buckets(LATENCY_BUCKETS.to_vec()),
                &["route"],
            )
            .expect("valid metric"),
        }
    }
}
