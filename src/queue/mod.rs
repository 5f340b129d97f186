//! Async mode (docs/async.md): a `mode = "async"` route acknowledges a delivery as
//! soon as it is durably queued, and a delivery worker forwards it from the queue.
//!
//! This module owns the queue's life: the gate's hand-off (`AsyncMode::accept`: queue
//! append, then the claim → `queued` transition, then the acknowledgement), the
//! workers (one per async route, a consumer in the `idemgate` group, with retries,
//! dead letters and the takeover of a dead consumer's entries), and the small API the
//! operator surface calls (`list_dead_letters`, `redrive`). The hand-off lives in
//! `accept.rs`, the workers in `worker.rs`; this file holds the types, the backend
//! trait and the life cycle.
//!
//! The queue itself is a `QueueBackend`: Redis Streams (`redis.rs`; durable, shared by
//! every replica) or an in-process queue (`memory.rs`; one replica, lost on restart).
//!
//! Delivery is fenced per key like a provider's claim: before forwarding, a worker
//! takes the key's claim (`lock`), so two workers racing over one taken-over entry
//! never forward it concurrently, and an entry whose key completed meanwhile is only
//! acknowledged.

mod accept;
pub mod memory;
pub mod redis;
mod worker;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Response, StatusCode};
use http_body_util::Full;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::answer::Answer;
use crate::config::{AsyncRoute, Config, RouteMode};
use crate::metrics::{Metrics, QueueMetrics};
use crate::providers::Route;
use crate::store::{DeliveryKey, StoreError, StoredResponse, Token};
use crate::upstream::Upstream;

/// The consumer group every sidecar's workers join.
pub const GROUP: &str = "idemgate";

/// One queued delivery: what the worker forwards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueEntry {
    /// The delivery's key in the store (`DeliveryKey::key`; the route is the queue's).
    pub key: String,
    pub method: String,
    /// The provider's path and query (the route's `upstream_path` applies on delivery).
    pub path: String,
    /// End-to-end headers, `idempotency-key` included, encoded as `name: value\r\n`
    /// lines (`upstream::encode_headers`).
    pub headers: Bytes,
    pub body: Bytes,
    /// When the provider's copy was received, Unix milliseconds.
    pub received_at: u64,
}

impl QueueEntry {
    /// The stream fields, in the agreed layout.
    pub fn fields(&self) -> [(&'static str, Bytes); 6] {
        [
            ("key", Bytes::from(self.key.clone())),
            ("method", Bytes::from(self.method.clone())),
            ("path", Bytes::from(self.path.clone())),
            ("headers", self.headers.clone()),
            ("body", self.body.clone()),
            ("received_at", Bytes::from(self.received_at.to_string())),
        ]
    }

    /// Reads an entry from its stream fields; `None` when one is missing.
    pub fn from_fields(fields: &HashMap<String, Bytes>) -> Option<QueueEntry> {
        let text = |name: &str| {
            fields
                .get(name)
                .map(|b| String::from_utf8_lossy(b).into_owned())
        };
        Some(QueueEntry {
            key: text("key")?,
            method: text("method")?,
            path: text("path")?,
            headers: fields.get("headers")?.clone(),
            body: fields.get("body")?.clone(),
            received_at: text("received_at")?.parse().ok()?,
        })
    }
}

/// An entry of the dead-letter stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    /// Its ID in the dead-letter stream (what `redrive` takes).
    pub id: String,
    pub entry: QueueEntry,
    pub attempts: u64,
    pub last_error: String,
    /// Unix milliseconds.
    pub dead_at: u64,
}

/// One page of dead letters, oldest first; `next` continues after the last one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeadLetterPage {
    pub items: Vec<DeadLetter>,
    pub next: Option<String>,
}

/// What a worker finds when it asks to deliver a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lock {
    /// The key completed already (a copy's entry, or a takeover race): only acknowledge.
    Completed,
    /// Someone else holds the key's claim now; try again shortly.
    Busy,
    /// This worker owns the key for one attempt, the `attempt`-th delivery attempt.
    Claimed { token: Token, attempt: u64 },
}

/// A route's queue, as the metrics show it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueStats {
    pub depth: u64,
    pub pending: u64,
    /// When the oldest unacknowledged entry was queued (Unix ms).
    pub oldest_ms: Option<u64>,
    pub dead_letters: u64,
}

/// A queue entry as read: its ID and the entry (`None`: malformed fields).
pub type Read = (String, Option<QueueEntry>);

pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// The queue and the key transitions async mode needs; one round trip per method.
pub trait QueueBackend: Send + Sync + 'static {
    /// Appends `entry` to `route`'s queue unless it holds `max_queue` entries
    /// (`Ok(None)`); the entry's ID otherwise.
    fn enqueue<'a>(
        &'a self,
        route: &'a str,
        entry: &'a QueueEntry,
        max_queue: u64,
    ) -> StoreFuture<'a, Option<String>>;
    /// The claim → `queued` transition (owner only); frees the claim for the worker.
    /// The status lives at least `keep_for` (the route's `max_age`) or `retention`.
    fn mark_queued<'a>(
        &'a self,
        key: &'a DeliveryKey,
        token: Token,
        keep_for: Duration,
    ) -> StoreFuture<'a, bool>;
    /// Gives a claim up (owner only): the key is `released`.
    fn release<'a>(&'a self, key: &'a DeliveryKey, token: Token) -> StoreFuture<'a, bool>;
    /// Creates the consumer group (and the stream) if missing.
    fn ensure_group<'a>(&'a self, route: &'a str) -> StoreFuture<'a, ()>;
    /// Up to `count` entries nobody has read yet, now held by `consumer`.
    fn read_new<'a>(
        &'a self,
        route: &'a str,
        consumer: &'a str,
        count: usize,
    ) -> StoreFuture<'a, Vec<Read>>;
    /// Up to `count` entries held unrefreshed for `min_idle` (their consumer is
    /// presumed dead), now held by `consumer`.
    fn take_over<'a>(
        &'a self,
        route: &'a str,
        consumer: &'a str,
        min_idle: Duration,
        count: usize,
    ) -> StoreFuture<'a, Vec<Read>>;
    /// Refreshes `consumer`'s hold on `ids` (so a live worker's entries never move).
    fn keep<'a>(
        &'a self,
        route: &'a str,
        consumer: &'a str,
        ids: &'a [String],
    ) -> StoreFuture<'a, ()>;
    /// Takes the key's claim for one attempt at entry `id` (see `Lock`); attempts are
    /// counted per entry, and the status lives at least `keep_for` or `retention`.
    fn lock<'a>(
        &'a self,
        key: &'a DeliveryKey,
        id: &'a str,
        keep_for: Duration,
    ) -> StoreFuture<'a, Lock>;
    /// Extends the attempt's claim while the upstream call runs.
    fn renew<'a>(&'a self, key: &'a DeliveryKey, token: Token) -> StoreFuture<'a, bool>;
    /// Gives a failed attempt's claim up; the key stays `queued`.
    fn unlock<'a>(&'a self, key: &'a DeliveryKey, token: Token) -> StoreFuture<'a, bool>;
    /// Marks the key completed with the upstream's answer (owner only).
    fn complete<'a>(
        &'a self,
        key: &'a DeliveryKey,
        token: Token,
        response: &'a StoredResponse,
    ) -> StoreFuture<'a, bool>;
    /// Acknowledges (and deletes) a delivered entry.
    fn done<'a>(&'a self, route: &'a str, id: &'a str) -> StoreFuture<'a, ()>;
    /// Moves an exhausted entry to the dead-letter stream, atomically.
    fn dead_letter<'a>(
        &'a self,
        route: &'a str,
        id: &'a str,
        entry: &'a QueueEntry,
        attempts: u64,
        last_error: &'a str,
    ) -> StoreFuture<'a, ()>;
    fn stats<'a>(&'a self, route: &'a str) -> StoreFuture<'a, QueueStats>;
    /// Dead letters after `cursor` (an ID; from the oldest without one).
    fn list_dead_letters<'a>(
        &'a self,
        route: &'a str,
        count: usize,
        cursor: Option<&'a str>,
    ) -> StoreFuture<'a, DeadLetterPage>;
    /// Puts a dead letter back in the queue and its key back to `queued`; false when
    /// there is no such dead letter.
    fn redrive<'a>(&'a self, route: &'a str, dead_letter_id: &'a str) -> StoreFuture<'a, bool>;
}

/// This process's consumer name: `POD_NAME`, else hostname and process ID.
pub fn consumer_name() -> String {
    if let Ok(pod) = std::env::var("POD_NAME")
        && !pod.is_empty()
    {
        return pod;
    }
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_string())
        })
        .unwrap_or_else(|| "idemgate".to_string());
    format!("{host}-{}", std::process::id())
}

/// The wait before attempt `attempt + 1`: `backoff · 2^(attempt-1)`, capped at
/// `max_backoff`, with equal jitter (half fixed, half random) so that entries failing
/// together do not retry together.
pub fn backoff_delay(cfg: &AsyncRoute, attempt: u64, jitter: f64) -> Duration {
    let exp = attempt.saturating_sub(1).min(32) as u32;
    let base = cfg
        .backoff
        .checked_mul(2u32.saturating_pow(exp))
        .unwrap_or(cfg.max_backoff)
        .min(cfg.max_backoff);
    base / 2 + base.mul_f64(jitter.clamp(0.0, 1.0) / 2.0)
}

/// The route's acknowledgement: `ack_status` with `ack_body`.
pub fn ack_answer(cfg: &AsyncRoute) -> Answer {
    let mut resp = Response::new(Full::new(Bytes::from(cfg.ack_body.clone())));
    *resp.status_mut() = StatusCode::from_u16(cfg.ack_status).unwrap_or(StatusCode::OK);
    if !cfg.ack_body.is_empty() {
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
    }
    resp
}

/// One async route: its built route (success rule, upstream path), policy and metrics.
struct AsyncRouteState {
    route: Arc<Route>,
    cfg: AsyncRoute,
    metrics: QueueMetrics,
}

/// Async mode for every async route of one sidecar: see the module documentation.
pub struct AsyncMode {
    backend: Arc<dyn QueueBackend>,
    routes: HashMap<String, Arc<AsyncRouteState>>,
    claim_idle: Duration,
    max_queue: u64,
    lease: Duration,
    consumer: String,
    upstream: Upstream,
    stop: CancellationToken,
    tasks: TaskTracker,
}

impl AsyncMode {
    /// Async mode for the configuration's async routes; `None` when it has none.
    pub fn new(
        config: &Config,
        built: &crate::providers::Routes,
        backend: Arc<dyn QueueBackend>,
        metrics: &Metrics,
    ) -> Result<Option<AsyncMode>, crate::config::ConfigError> {
        let mut routes = HashMap::new();
        for (i, rc) in config.routes.iter().enumerate() {
            let RouteMode::Async(cfg) = &rc.mode else {
                continue;
            };
            let route = built.route(config, i)?;
            routes.insert(
                rc.name.clone(),
                Arc::new(AsyncRouteState {
                    route,
                    cfg: cfg.clone(),
                    metrics: metrics.queue(&rc.name),
                }),
            );
        }
        if routes.is_empty() {
            return Ok(None);
        }
        Ok(Some(AsyncMode {
            backend,
            routes,
            claim_idle: config.async_queue.claim_idle,
            max_queue: config.async_queue.max_queue,
            lease: config.dedup.lease,
            consumer: consumer_name(),
            upstream: Upstream::new(
                &config.upstream,
                config.upstream_timeout,
                config.max_response,
            ),
            stop: CancellationToken::new(),
            tasks: TaskTracker::new(),
        }))
    }

    /// The async policy of `route`, if it is an async route.
    pub fn route(&self, route: &str) -> Option<&AsyncRoute> {
        self.routes.get(route).map(|r| &r.cfg)
    }

    pub fn consumer(&self) -> &str {
        &self.consumer
    }

    /// Starts one worker (and one metrics sampler) per async route.
    pub fn start(self: &Arc<Self>) {
        for state in self.routes.values() {
            let (this, worker) = (self.clone(), state.clone());
            self.tasks.spawn(async move { this.work(worker).await });
            let (this, sampler) = (self.clone(), state.clone());
            self.tasks.spawn(async move { this.sample(sampler).await });
        }
        tracing::info!(consumer = %self.consumer, routes = self.routes.len(), "async delivery workers started");
    }

    /// Stops taking new entries; entries in hand finish their current upstream call.
    pub fn stop(&self) {
        self.stop.cancel();
        self.tasks.close();
    }

    /// Waits up to `grace` for the entries in hand. Those still waiting for a retry are
    /// left pending: another consumer takes them over after `claim_idle`.
    pub async fn wait(&self, grace: Duration) {
        if tokio::time::timeout(grace, self.tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                "shutdown grace elapsed with queue entries in hand; another consumer takes them over after claim_idle"
            );
        }
    }

    /// Dead letters of `route`, oldest first, after `cursor`.
    pub async fn list_dead_letters(
        &self,
        route: &str,
        count: usize,
        cursor: Option<&str>,
    ) -> Result<DeadLetterPage, StoreError> {
        self.backend.list_dead_letters(route, count, cursor).await
    }

    /// Puts a dead letter back in `route`'s queue; false when there is no such entry.
    pub async fn redrive(&self, route: &str, dead_letter_id: &str) -> Result<bool, StoreError> {
        self.backend.redrive(route, dead_letter_id).await
    }
}

#[cfg(test)]
mod tests;
