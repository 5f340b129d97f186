//! The store: the atomic claim of a delivery's key, and what is remembered about it.
//!
//! One `Store` trait, two implementations with the same semantics: `RedisStore`
//! (shared by every replica) and `MemoryStore` (one process; journaled to a directory,
//! it is the `file:` store, `store::file`). The conformance suites in `tests/it/` run
//! against memory, file and Redis.
//!
//! States of a key: absent → `processing` (claimed, lease running) → `completed`
//! (answer stored for `retention`) or `released` (the claimer gave up; the next copy
//! claims again). A claim is owned by a random per-attempt token; renew, complete and
//! release succeed only for the current owner (fencing). An operator's replay re-claims
//! a `completed` key but keeps its answer: unless the replay records a new one, the
//! key is `completed` again once the replay's claim is released or lapses.

pub mod breaker;
/// The `file:` store: the memory store journaled to a directory.
pub mod file;
pub mod jobs;
pub(crate) mod lease;
pub mod log;
pub mod log_filter;
mod memory;
pub mod pacing;
pub mod queue;
pub(crate) mod redis;

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;

use crate::providers::Fingerprint;
pub use breaker::Breaker;
pub use memory::{MemoryOptions, MemoryQueue, MemoryStore};
pub use redis::{RedisQueue, RedisStore};

/// Names one delivery in the store: its route and its idempotency key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DeliveryKey {
    pub route: std::sync::Arc<str>,
    pub key: String,
}

impl DeliveryKey {
    pub fn new(route: impl Into<std::sync::Arc<str>>, key: impl Into<String>) -> Self {
        DeliveryKey {
            route: route.into(),
            key: key.into(),
        }
    }

    /// The key as a log field's value, the one way every line writes it
    /// (`key = key.logged()`): a string field, which the text format writes quoted and
    /// escaped (JSON as a string). The key is the client's text: written bare (`%`), a
    /// key such as `evt 1 forged=yes` would add fields to the line.
    pub fn logged(&self) -> &str {
        &self.key
    }
}

/// The owner token of one claim attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Token(pub [u8; 16]);

impl Token {
    pub fn random() -> Token {
        Token(rand::random())
    }

    pub fn to_hex(self) -> String {
        hex::encode(self.0)
    }
}

/// An upstream answer as stored for replay: status, end-to-end headers (encoded as
/// `name: value\r\n` lines) and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    pub status: u16,
    pub headers: Bytes,
    pub body: Bytes,
}

/// The one conversion from what the upstream answered to what is stored for replay.
impl From<&crate::upstream::UpstreamResponse> for StoredResponse {
    fn from(resp: &crate::upstream::UpstreamResponse) -> Self {
        StoredResponse {
            status: resp.status.as_u16(),
            headers: crate::upstream::encode_headers(&resp.headers),
            body: resp.body.clone(),
        }
    }
}

/// The outcome of a claim attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// This caller owns the key until it completes, releases, or its lease lapses.
    Claimed(Token),
    /// Another caller holds the key; its lease has `remaining` left.
    InFlight { remaining: Duration },
    /// The delivery was completed; here is its answer.
    Completed(StoredResponse),
    /// The key is held or completed with a different payload fingerprint.
    Mismatch,
    /// An async route's delivery is queued (or being delivered from the queue): the
    /// copy gets the route's acknowledgement again, never a second queue entry.
    Queued,
}

/// Where a delivery stands in the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Processing,
    Completed,
    Released,
    /// Acknowledged and waiting in (or being delivered from) an async route's queue.
    Queued,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Processing => "processing",
            Status::Completed => "completed",
            Status::Released => "released",
            Status::Queued => "queued",
        }
    }

    pub fn parse(s: &str) -> Option<Status> {
        match s {
            "processing" => Some(Status::Processing),
            "completed" => Some(Status::Completed),
            "released" => Some(Status::Released),
            "queued" => Some(Status::Queued),
            _ => None,
        }
    }
}

/// The store could not answer (down, timed out, or answered nonsense).
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    #[error("store timed out")]
    Timeout,
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The circuit breaker is open after repeated failures: the store was not asked.
    #[error("store circuit breaker open after repeated failures; not asked")]
    CircuitOpen,
    /// The in-process store reached `store.max_memory` and holds only deliveries being
    /// processed or queued (never evicted): a new delivery cannot be remembered.
    #[error(
        "store full: store.max_memory is reached and only deliveries being processed or \
         queued are left (they are never evicted); raise store.max_memory"
    )]
    Full,
}

/// What a bounded store reports for its metrics (`idemgate_store_evictions_total`,
/// `idemgate_store_oldest_age_seconds`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BoundStats {
    /// Deliveries forgotten to keep the bound, since start.
    pub evictions: u64,
    /// Since when the oldest remembered delivery was last settled (0 when empty).
    pub oldest_age: Duration,
    /// Bytes the entries take now, and the bound.
    pub used_bytes: u64,
    pub max_bytes: u64,
}

/// Lease and retention of one route's keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lifetimes {
    /// How long a claim holds without renewal.
    pub lease: Duration,
    /// How long a completed (or released) key is remembered.
    pub retention: Duration,
}

/// Every route's `Lifetimes`: a route's own (its `lease` and `retention` over
/// `[dedup]`'s), or the default for a route not listed. One handle, cloned into every
/// store of the process (each runtime's) and the gate, that a live reload swaps whole
/// (`set`): a claim or completion made after the switch uses the new values; what was
/// written before keeps the TTL it was given. Each use in a store is
/// `self.lifetimes.of(&key.route)`, one atomic load.
#[derive(Clone)]
pub struct RouteLifetimes(std::sync::Arc<arc_swap::ArcSwap<LifetimesTable>>);

/// The lifetimes in force: the default and the routes whose lifetimes differ from it.
#[derive(Debug, Clone, PartialEq)]
struct LifetimesTable {
    default: Lifetimes,
    routes: std::collections::HashMap<std::sync::Arc<str>, Lifetimes>,
}

impl LifetimesTable {
    /// The lifetimes of `config`'s routes, `[dedup]`'s for any other route.
    fn of_config(config: &crate::config::Config) -> LifetimesTable {
        let of = |d: &crate::config::DedupConfig| Lifetimes {
            lease: d.lease,
            retention: d.retention,
        };
        let mut table = LifetimesTable {
            default: of(&config.dedup),
            routes: Default::default(),
        };
        for r in &config.routes {
            table.set_route(&r.name, of(&r.dedup.over(&config.dedup)));
        }
        table
    }

    fn set_route(&mut self, route: &str, lifetimes: Lifetimes) {
        if lifetimes == self.default {
            self.routes.remove(route);
        } else {
            self.routes.insert(route.into(), lifetimes);
        }
    }
}

impl std::fmt::Debug for RouteLifetimes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.load().fmt(f)
    }
}

impl RouteLifetimes {
    /// The lifetimes of the configured routes, `[dedup]`'s for any other route.
    pub fn from_config(config: &crate::config::Config) -> RouteLifetimes {
        RouteLifetimes::of_table(LifetimesTable::of_config(config))
    }

    fn of_table(table: LifetimesTable) -> RouteLifetimes {
        RouteLifetimes(std::sync::Arc::new(arc_swap::ArcSwap::from_pointee(table)))
    }

    /// Puts `config`'s lifetimes in force for every holder of this handle (a reload).
    pub fn set(&self, config: &crate::config::Config) {
        self.0
            .store(std::sync::Arc::new(LifetimesTable::of_config(config)));
    }

    /// These lifetimes with `route`'s set to `lifetimes` (a builder: every clone of
    /// this handle sees it).
    pub fn with_route(self, route: &str, lifetimes: Lifetimes) -> RouteLifetimes {
        let mut table = LifetimesTable::clone(&self.0.load());
        table.set_route(route, lifetimes);
        self.0.store(std::sync::Arc::new(table));
        self
    }

    /// `[dedup]`'s lifetimes, those of any route that sets none.
    pub fn default(&self) -> Lifetimes {
        self.0.load().default
    }

    /// The shortest retention of any route (the in-process store's sweep pace).
    pub fn shortest_retention(&self) -> Duration {
        let table = self.0.load();
        table
            .routes
            .values()
            .map(|l| l.retention)
            .fold(table.default.retention, Duration::min)
    }

    /// The lifetimes of `route`'s keys.
    pub fn of(&self, route: &str) -> Lifetimes {
        let table = self.0.load();
        // Most configurations set none per route: no lookup at all then.
        if table.routes.is_empty() {
            return table.default;
        }
        table.routes.get(route).copied().unwrap_or(table.default)
    }
}

/// One set of lifetimes for every route.
impl From<Lifetimes> for RouteLifetimes {
    fn from(default: Lifetimes) -> RouteLifetimes {
        RouteLifetimes::of_table(LifetimesTable {
            default,
            routes: Default::default(),
        })
    }
}

/// The atomic claim and its settlement. Every method is one store round trip.
///
/// Claim, complete and release take the delivery log's data beside the store's own:
/// `None` writes only the claim's state (queue workers, benches, the fenced-out
/// release of an under-replicated claim), `Some` also records the delivery in the log
/// in the same round trip. The operator's reads are the `log::DeliveryLog` supertrait.
pub trait Store: log::DeliveryLog + Send + Sync + 'static {
    /// Claims `key` for a delivery whose payload has fingerprint `fp`. `None` claims
    /// without touching the log; `Some` also records the delivery (and keeps its
    /// request when `kept`), and a `replay` re-claims a completed key for an operator.
    fn claim(
        &self,
        key: &DeliveryKey,
        fp: &Fingerprint,
        log: Option<log::ClaimLog<'_>>,
    ) -> impl Future<Output = Result<Claim, StoreError>> + Send;

    /// Extends the owner's lease by another `lease`; false when `token` no longer owns it.
    fn renew(
        &self,
        key: &DeliveryKey,
        token: Token,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Marks the key completed with `response`; false when `token` no longer owns it.
    /// `Some(settled)` also records how the upstream call went; `None` records nothing
    /// beyond the answer.
    fn complete(
        &self,
        key: &DeliveryKey,
        token: Token,
        response: &StoredResponse,
        settled: Option<&log::Settled>,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Records the answer of a delivery whose claim this caller no longer owns (its
    /// lease lapsed, or a failover lost the claim record) once `complete` said false:
    /// stored when no one else holds the key, so the provider's next copy is answered
    /// rather than forwarded again. True when the key now holds a completion of this
    /// payload (with `min_replicas_ack`, one the replicas confirmed, else an error);
    /// false when another claimer, the queue or another payload holds it.
    fn complete_unowned(
        &self,
        key: &DeliveryKey,
        fp: &Fingerprint,
        response: &StoredResponse,
        settled: Option<&log::Settled>,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Gives the claim up so the next copy is forwarded; false when not the owner.
    /// `Some(settled)` also records how the upstream call went (and may put a failed
    /// replay back to `completed`); `None` records nothing beyond the release.
    fn release(
        &self,
        key: &DeliveryKey,
        token: Token,
        settled: Option<&log::Settled>,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Whether the store answers (for `/readyz`).
    fn ping(&self) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Whether a circuit breaker currently keeps calls from reaching the store (for
    /// `idemgate_store_circuit_open`); plain stores have none.
    fn circuit_open(&self) -> bool {
        false
    }

    /// A bounded store's evictions and effective dedup window (the in-process
    /// store); None for stores without a bound of their own.
    fn bound_stats(&self) -> Option<BoundStats> {
        None
    }

    /// Whether a completion counts only once replicas confirmed it (`min_replicas_ack`)
    /// or the `file:` store's journal wrote it: then a completion that could not be
    /// confirmed must not be answered 2xx.
    fn confirms_completions(&self) -> bool {
        false
    }

    /// Its routes' lease and retention: the handle a live reload swaps (the gate
    /// shares it, so that the gate and its store never disagree).
    fn lifetimes(&self) -> &RouteLifetimes;

    /// Why the store cannot work again while the process runs (the `file:` store's
    /// writer stopped on a disk error): `/healthz` fails with it, so the kubelet
    /// restarts the container and the restart replays the directory.
    fn broken(&self) -> Option<String> {
        None
    }

    /// Claims (unlogged), and while another holder has the key, polls until it
    /// completes or is released, or `deadline` passes (then the last `InFlight` is
    /// returned).
    fn wait_for(
        &self,
        key: &DeliveryKey,
        fp: &Fingerprint,
        deadline: tokio::time::Instant,
    ) -> impl Future<Output = Result<Claim, StoreError>> + Send {
        async move {
            let mut pause = Duration::from_millis(5);
            loop {
                let claim = self.claim(key, fp, None).await?;
                let now = tokio::time::Instant::now();
                if !matches!(claim, Claim::InFlight { .. }) || now >= deadline {
                    return Ok(claim);
                }
                tokio::time::sleep(pause.min(deadline - now)).await;
                pause = (pause * 2).min(Duration::from_millis(100));
            }
        }
    }
}

/// Current Unix time in milliseconds.
pub fn unix_millis() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
