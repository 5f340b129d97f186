//! Async mode (docs/async.md): a `mode = "async"` route acknowledges a delivery as
//! soon as it is durably queued, and a delivery worker forwards it from the queue.
//!
//! This module owns the queue's life: the gate's hand-off (`AsyncMode::accept`: queue
//! append, then the claim → `queued` transition, then the acknowledgement), the
//! workers (one per async route, a consumer in the `idemgate` group, with retries,
//! dead letters and the takeover of a dead consumer's entries), and the small API the
//! operator surface calls (`list_dead_letters`, `redrive`).
//!
//! The queue itself is a `QueueBackend`: Redis Streams (`redis.rs`; durable, shared by
//! every replica) or an in-process queue (`memory.rs`; one replica, lost on restart).
//!
//! Delivery is fenced per key like a provider's claim: before forwarding, a worker
//! takes the key's claim (`lock`), so two workers racing over one taken-over entry
//! never forward it concurrently, and an entry whose key completed meanwhile is only
//! acknowledged.

pub mod memory;
pub mod redis;

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Response, StatusCode};
use http_body_util::Full;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::answer::{Answer, Refused, error_answer};
use crate::config::{AsyncRoute, Config, RouteMode};
use crate::metrics::{Metrics, Outcome, QueueMetrics};
use crate::providers::Route;
use crate::store::{DeliveryKey, StoreError, StoredResponse, Token, unix_millis};
use crate::upstream::{self, Outgoing, Upstream};

/// The consumer group every sidecar's workers join.
pub const GROUP: &str = "idemgate";

/// How many entries one route's worker holds at once (in delivery or backing off).
const IN_HAND: usize = 32;

/// How often an idle worker looks for new entries.
const POLL: Duration = Duration::from_millis(50);

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

fn unavailable(code: &'static str, message: &str, outcome: Outcome) -> Answer {
    let r = Refused {
        outcome,
        status: StatusCode::SERVICE_UNAVAILABLE,
        code,
        message: message.to_string(),
        retry_after: Some(1),
    };
    error_answer(&r)
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

    /// The gate's hand-off of a freshly claimed delivery: append it to the queue, turn
    /// the claim into `queued`, acknowledge. The provider is answered only after the
    /// append succeeded; when it did not (store down, queue full) the claim is released
    /// and the provider gets 503 + Retry-After, so it keeps the delivery and retries.
    pub async fn accept(
        &self,
        key: &DeliveryKey,
        token: Token,
        parts: &http::request::Parts,
        body: Bytes,
        idempotency_key: Option<HeaderValue>,
    ) -> (Outcome, Answer) {
        let Some(state) = self.routes.get(&*key.route) else {
            // Not reachable: the gate asks only for async routes.
            let _ = self.backend.release(key, token).await;
            return (
                Outcome::StoreUnavailable,
                unavailable(
                    "internal",
                    "no queue for this route",
                    Outcome::StoreUnavailable,
                ),
            );
        };
        let mut headers = upstream::end_to_end(&parts.headers);
        if !headers.contains_key(header::HOST)
            && let Some(a) = parts
                .uri
                .authority()
                .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
        {
            headers.insert(header::HOST, a);
        }
        if let Some(k) = idempotency_key {
            headers.insert(HeaderName::from_static("idempotency-key"), k);
        }
        let entry = QueueEntry {
            key: key.key.clone(),
            method: parts.method.to_string(),
            path: parts
                .uri
                .path_and_query()
                .map(|p| p.as_str().to_string())
                .unwrap_or_else(|| parts.uri.path().to_string()),
            headers: upstream::encode_headers(&headers),
            body,
            received_at: unix_millis(),
        };
        let added = self
            .backend
            .enqueue(&key.route, &entry, self.max_queue)
            .await;
        let refused = match added {
            Ok(Some(_)) => None,
            Ok(None) => Some((
                Outcome::QueueFull,
                unavailable(
                    "queue_full",
                    "the delivery queue is full; retry later",
                    Outcome::QueueFull,
                ),
            )),
            Err(e) => {
                tracing::warn!(route = &*key.route, key = %key.key, error = %e, "queue append failed");
                Some((
                    Outcome::StoreUnavailable,
                    unavailable(
                        "store_unavailable",
                        "the delivery queue is unavailable; retry later",
                        Outcome::StoreUnavailable,
                    ),
                ))
            }
        };
        if let Some(refused) = refused {
            if let Err(e) = self.backend.release(key, token).await {
                tracing::warn!(route = &*key.route, key = %key.key, error = %e, "release failed; the key frees at lease expiry");
            }
            return refused;
        }
        // The entry is durable: acknowledge whatever happens next. Should the `queued`
        // mark fail, copies get 409 until the lease lapses, then a copy queues a second
        // entry, which the worker only acknowledges (its key completed).
        if let Err(e) = self
            .backend
            .mark_queued(key, token, state.cfg.max_age)
            .await
        {
            tracing::warn!(route = &*key.route, key = %key.key, error = %e, "marking the key queued failed; the claim frees at lease expiry");
        }
        (Outcome::Queued, ack_answer(&state.cfg))
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

    /// Samples the queue into the metrics, once a second.
    async fn sample(&self, state: Arc<AsyncRouteState>) {
        let m = &state.metrics;
        loop {
            match self.backend.stats(&state.route.name).await {
                Ok(s) => {
                    m.depth.set(s.depth as i64);
                    m.pending.set(s.pending as i64);
                    m.dead_letter_size.set(s.dead_letters as i64);
                    let age = s
                        .oldest_ms
                        .map(|t| unix_millis().saturating_sub(t) as f64 / 1000.0)
                        .unwrap_or(0.0);
                    m.oldest_age.set(age);
                }
                Err(e) => {
                    tracing::debug!(route = &*state.route.name, error = %e, "queue stats failed")
                }
            }
            tokio::select! {
                _ = self.stop.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }

    /// One route's worker: takes entries (taken-over ones first, then new ones) while
    /// it has room, and delivers each in its own task.
    async fn work(self: Arc<Self>, state: Arc<AsyncRouteState>) {
        let route: &str = &state.route.name;
        while let Err(e) = self.backend.ensure_group(route).await {
            tracing::warn!(route, error = %e, "cannot create the queue's consumer group; retrying");
            tokio::select! {
                _ = self.stop.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
        let in_hand: Arc<Mutex<HashSet<String>>> = Arc::default();
        self.tasks
            .spawn(self.clone().keep_alive(state.clone(), in_hand.clone()));
        let room = Arc::new(Semaphore::new(IN_HAND));
        let mut last_takeover: Option<Instant> = None;
        loop {
            let first = tokio::select! {
                _ = self.stop.cancelled() => return,
                p = room.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => return },
            };
            let mut permits = vec![first];
            while let Ok(p) = room.clone().try_acquire_owned() {
                permits.push(p);
            }
            let mut read = Vec::new();
            let mut failed = None;
            if last_takeover.is_none_or(|t| t.elapsed() >= self.claim_idle / 2) {
                match self
                    .backend
                    .take_over(route, &self.consumer, self.claim_idle, permits.len())
                    .await
                {
                    Ok(r) => {
                        last_takeover = Some(Instant::now());
                        if !r.is_empty() {
                            tracing::info!(
                                route,
                                entries = r.len(),
                                "took over entries of a consumer presumed dead"
                            );
                        }
                        read = r;
                    }
                    Err(e) => failed = Some(e),
                }
            }
            if read.is_empty() && failed.is_none() {
                match self
                    .backend
                    .read_new(route, &self.consumer, permits.len())
                    .await
                {
                    Ok(r) => read = r,
                    Err(e) => failed = Some(e),
                }
            }
            if let Some(e) = failed {
                tracing::warn!(route, error = %e, "reading the queue failed");
                if e.to_string().contains("NOGROUP") {
                    let _ = self.backend.ensure_group(route).await;
                }
            }
            // Entries this worker already holds (an XAUTOCLAIM racing its own refresh).
            read.retain(|(id, _)| !in_hand.lock().map(|h| h.contains(id)).unwrap_or(true));
            if read.is_empty() {
                drop(permits);
                tokio::select! {
                    _ = self.stop.cancelled() => return,
                    _ = tokio::time::sleep(POLL) => {}
                }
                continue;
            }
            for (id, entry) in read {
                let Some(permit) = permits.pop() else { break };
                if let Ok(mut h) = in_hand.lock() {
                    h.insert(id.clone());
                }
                let this = self.clone();
                let state = state.clone();
                let in_hand = in_hand.clone();
                self.tasks.spawn(async move {
                    match entry {
                        Some(entry) => this.deliver(&state, &id, entry).await,
                        None => {
                            tracing::error!(
                                route = &*state.route.name,
                                id,
                                "malformed queue entry dropped"
                            );
                            let _ = this.backend.done(&state.route.name, &id).await;
                        }
                    }
                    if let Ok(mut h) = in_hand.lock() {
                        h.remove(&id);
                    }
                    drop(permit);
                });
            }
        }
    }

    /// Refreshes this consumer's hold on its entries in hand every `claim_idle / 3`, so
    /// that only a dead consumer's entries are taken over.
    async fn keep_alive(
        self: Arc<Self>,
        state: Arc<AsyncRouteState>,
        in_hand: Arc<Mutex<HashSet<String>>>,
    ) {
        let period = (self.claim_idle / 3).max(Duration::from_millis(10));
        loop {
            tokio::select! {
                _ = self.stop.cancelled() => return,
                _ = tokio::time::sleep(period) => {}
            }
            let ids: Vec<String> = in_hand
                .lock()
                .map(|h| h.iter().cloned().collect())
                .unwrap_or_default();
            if ids.is_empty() {
                continue;
            }
            if let Err(e) = self
                .backend
                .keep(&state.route.name, &self.consumer, &ids)
                .await
            {
                tracing::warn!(route = &*state.route.name, error = %e, "refreshing entries in hand failed");
            }
        }
    }

    /// Sleeps `d`, or less when shutting down; false when shutting down.
    async fn pause(&self, d: Duration) -> bool {
        tokio::select! {
            _ = self.stop.cancelled() => false,
            _ = tokio::time::sleep(d) => true,
        }
    }

    /// Delivers one entry: attempts until the upstream completes it, or it is dead.
    async fn deliver(&self, state: &AsyncRouteState, id: &str, entry: QueueEntry) {
        let route: &str = &state.route.name;
        let cfg = &state.cfg;
        let key = DeliveryKey::new(state.route.name.clone(), entry.key.clone());
        let mut last_error = String::new();
        loop {
            if self.stop.is_cancelled() {
                return; // left pending: taken over by another consumer
            }
            let (token, attempt) = match self.backend.lock(&key, id, cfg.max_age).await {
                Ok(Lock::Claimed { token, attempt }) => (token, attempt),
                Ok(Lock::Completed) => {
                    self.finish(route, id).await;
                    return;
                }
                Ok(Lock::Busy) => {
                    if !self
                        .pause(cfg.backoff.min(Duration::from_millis(500)))
                        .await
                    {
                        return;
                    }
                    continue;
                }
                Err(e) => {
                    tracing::warn!(route, key = %key.key, error = %e, "queue: taking the key failed");
                    if !self.pause(Duration::from_secs(1)).await {
                        return;
                    }
                    continue;
                }
            };
            let age = Duration::from_millis(unix_millis().saturating_sub(entry.received_at));
            if attempt > u64::from(cfg.max_attempts) || age > cfg.max_age {
                if last_error.is_empty() {
                    last_error = if age > cfg.max_age {
                        format!(
                            "max_age ({}) exceeded",
                            humantime::format_duration(cfg.max_age)
                        )
                    } else {
                        "max_attempts exhausted".to_string()
                    };
                }
                self.bury(state, id, &entry, &key, token, attempt - 1, &last_error)
                    .await;
                return;
            }
            let started = Instant::now();
            let result = self.forward(state, &entry, &key, token).await;
            let took = started.elapsed();
            state.metrics.delivery_duration.observe(took.as_secs_f64());
            match result {
                Ok(resp) if state.route.success.completes(resp.status, &resp.body) => {
                    state.metrics.attempts_ok.inc();
                    let stored = StoredResponse {
                        status: resp.status.as_u16(),
                        headers: upstream::encode_headers(&resp.headers),
                        body: resp.body,
                    };
                    let mut recorded = false;
                    for _ in 0..3 {
                        match self.backend.complete(&key, token, &stored).await {
                            Ok(owned) => {
                                recorded = owned;
                                break;
                            }
                            Err(e) => {
                                tracing::warn!(route, key = %key.key, error = %e, "recording completion failed; retrying");
                                tokio::time::sleep(Duration::from_millis(100)).await;
                            }
                        }
                    }
                    if !recorded {
                        // Not acknowledged: left pending, taken over after claim_idle
                        // and found completed, or delivered again (at least once).
                        tracing::warn!(route, key = %key.key, "completion not recorded (claim lost or store failing); the entry stays pending");
                        return;
                    }
                    self.finish(route, id).await;
                    tracing::info!(route, key = %key.key, attempt, status = stored.status, duration_ms = took.as_secs_f64() * 1000.0, "queued delivery completed");
                    return;
                }
                other => {
                    state.metrics.attempts_failed.inc();
                    last_error = match other {
                        Ok(resp) => format!("upstream answered {}", resp.status.as_u16()),
                        Err(e) => e.to_string(),
                    };
                    tracing::info!(route, key = %key.key, attempt, error = %last_error, "queued delivery attempt failed");
                    if attempt >= u64::from(cfg.max_attempts) {
                        self.bury(state, id, &entry, &key, token, attempt, &last_error)
                            .await;
                        return;
                    }
                    if let Err(e) = self.backend.unlock(&key, token).await {
                        tracing::warn!(route, key = %key.key, error = %e, "unlock failed; the key frees at lease expiry");
                    }
                    let wait = backoff_delay(cfg, attempt, rand::random::<f64>());
                    if !self.pause(wait).await {
                        return;
                    }
                }
            }
        }
    }

    /// Forwards an entry while renewing the key's claim.
    async fn forward(
        &self,
        state: &AsyncRouteState,
        entry: &QueueEntry,
        key: &DeliveryKey,
        token: Token,
    ) -> Result<upstream::UpstreamResponse, upstream::UpstreamError> {
        let method = Method::from_bytes(entry.method.as_bytes()).unwrap_or(Method::POST);
        let mut headers = HeaderMap::new();
        upstream::decode_headers(&entry.headers, &mut headers);
        let pq = upstream_target(&state.route, &entry.path);
        let call = self.upstream.forward(Outgoing {
            method: &method,
            path_and_query: &pq,
            headers: &headers,
            body: entry.body.clone(),
            authority: None,
            idempotency_key: None,
        });
        tokio::pin!(call);
        let period = (self.lease / 3).max(Duration::from_millis(10));
        let mut renew = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        renew.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                r = &mut call => return r,
                _ = renew.tick() => {
                    if let Ok(false) = self.backend.renew(key, token).await {
                        tracing::warn!(route = &*state.route.name, key = %key.key, "delivery claim lost while the upstream call ran");
                    }
                }
            }
        }
    }

    /// Acknowledges a delivered entry, retrying briefly (an unacknowledged one would be
    /// taken over and found completed: harmless, but slower).
    async fn finish(&self, route: &str, id: &str) {
        for _ in 0..3 {
            match self.backend.done(route, id).await {
                Ok(()) => return,
                Err(e) => {
                    tracing::warn!(route, id, error = %e, "acknowledging a queue entry failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    /// Moves an exhausted entry to the dead-letter stream and releases its key, so a
    /// later copy from the provider is queued again.
    #[allow(clippy::too_many_arguments)]
    async fn bury(
        &self,
        state: &AsyncRouteState,
        id: &str,
        entry: &QueueEntry,
        key: &DeliveryKey,
        token: Token,
        attempts: u64,
        last_error: &str,
    ) {
        let route: &str = &state.route.name;
        match self
            .backend
            .dead_letter(route, id, entry, attempts, last_error)
            .await
        {
            Ok(()) => {
                state.metrics.dead_letters.inc();
                tracing::warn!(route, key = %key.key, attempts, error = last_error, "queued delivery moved to the dead-letter stream");
            }
            Err(e) => {
                // Left pending: retried after a takeover.
                tracing::warn!(route, key = %key.key, error = %e, "moving an entry to the dead-letter stream failed");
                let _ = self.backend.unlock(key, token).await;
                return;
            }
        }
        // Retried: a key left `queued` with its entry in the dead letters acknowledges
        // the provider's copies without queueing them (until a redrive).
        for _ in 0..3 {
            match self.backend.release(key, token).await {
                Ok(_) => return,
                Err(e) => {
                    tracing::warn!(route, key = %key.key, error = %e, "releasing a dead-lettered key failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }
}

/// The path and query to request upstream for a queued delivery: the provider's, or
/// the route's `upstream_path` with the provider's query.
fn upstream_target(route: &Route, path_and_query: &str) -> String {
    let (path, query) = match path_and_query.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (path_and_query, None),
    };
    let path = route.upstream_path.as_deref().unwrap_or(path);
    match query {
        Some(q) => format!("{path}?{q}"),
        None => path.to_string(),
    }
}

#[cfg(test)]
mod tests;
