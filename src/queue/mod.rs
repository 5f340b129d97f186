//! Async mode (docs/async.md): a `mode = "async"` route acknowledges a delivery as
//! soon as it is durably queued, and a delivery worker forwards it from the queue.
//!
//! This module owns the queue's life: the gate's hand-off (`AsyncMode::accept`: queue
//! append, then the claim → `queued` transition, then the acknowledgement), the
//! workers (one per async route, a consumer in the `idemgate` group, with retries,
//! dead letters and the takeover of a dead consumer's entries), and the small API the
//! operator surface calls (`list_dead_letters`, `redrive`). The hand-off lives in
//! `accept.rs`, the workers in `worker.rs`; this file holds the life cycle.
//!
//! The queue itself is a `QueueBackend` (`store::queue`): Redis Streams
//! (`store/redis/queue.rs`; durable, shared by every replica) or an in-process queue
//! (`store/memory/queue.rs`; one replica, lost on restart).
//!
//! Delivery is fenced per key like a provider's claim: before forwarding, a worker
//! takes the key's claim (`lock`), so two workers racing over one taken-over entry
//! never forward it concurrently, and an entry whose key completed meanwhile is only
//! acknowledged.

mod accept;
mod control;
mod pace;
mod worker;

pub use control::RouteOverview;
pub use pace::retry_after;

// The queue's storage (its entries, dead letters and the key transitions) lives in
// the store layer, beside each store; re-exported here for the queue's users.
pub use crate::store::queue::{
    DeadLetter, DeadLetterPage, GROUP, Lock, QueueBackend, QueueEntry, QueueStats, Read,
    StoreFuture,
};
pub use crate::store::{MemoryQueue, RedisQueue};

use std::collections::HashMap;
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
use crate::providers::{KeySource, Route};
use crate::store::StoreError;
use crate::upstream::Upstream;

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
    /// Its policy in force: a live reload (src/reload) swaps it; each acknowledgement
    /// and each delivery attempt loads it once.
    cfg: arc_swap::ArcSwap<AsyncRoute>,
    metrics: QueueMetrics,
    /// Where the order value is read from (`order_key`); `None`: unordered.
    order: Option<KeySource>,
    pace: pace::Pace,
    /// Delivered entries the worker's next batch read acknowledges.
    acks: worker::Acks,
}

/// Async mode for every async route of one sidecar: see the module documentation.
pub struct AsyncMode {
    backend: Arc<dyn QueueBackend>,
    routes: HashMap<String, Arc<AsyncRouteState>>,
    claim_idle: Duration,
    max_queue: u64,
    consumer: String,
    upstream: Upstream,
    stop: CancellationToken,
    tasks: TaskTracker,
    /// Spans for each append and delivery attempt (docs/tracing.md); off by default.
    tracer: crate::trace::Tracer,
    /// The routes' leases in force (the store's handle, that a reload swaps): each
    /// attempt renews its claim at the pace of its route's lease then.
    lifetimes: crate::store::RouteLifetimes,
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
            let order = built.order_key(&rc.name).cloned();
            routes.insert(
                rc.name.clone(),
                Arc::new(AsyncRouteState {
                    route,
                    cfg: arc_swap::ArcSwap::from_pointee(cfg.clone()),
                    metrics: metrics.queue(&rc.name),
                    order,
                    pace: pace::Pace::new(config.upstream_timeout, config.store.timeout),
                    acks: worker::Acks::default(),
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
            consumer: consumer_name(),
            upstream: Upstream::new(
                &config.upstream,
                config.upstream_timeout,
                config.max_response,
            ),
            stop: CancellationToken::new(),
            tasks: TaskTracker::new(),
            tracer: crate::trace::Tracer::default(),
            lifetimes: crate::store::RouteLifetimes::from_config(config),
        }))
    }

    /// Async mode with its appends and attempts traced by `tracer`.
    pub fn with_tracer(mut self, tracer: crate::trace::Tracer) -> Self {
        self.tracer = tracer;
        self
    }

    /// Async mode reading its routes' leases from `lifetimes` (the store's handle).
    pub fn with_lifetimes(mut self, lifetimes: crate::store::RouteLifetimes) -> Self {
        self.lifetimes = lifetimes;
        self
    }

    /// The async policy in force of `route`, if it is an async route.
    pub fn route(&self, route: &str) -> Option<Arc<AsyncRoute>> {
        self.routes.get(route).map(|r| r.cfg.load_full())
    }

    /// Puts in force the policies of `config`'s async routes (a live reload, once the
    /// configuration is valid and may apply: the routes are this mode's own, and their
    /// `order_key` unchanged). A route `config` no longer has
    /// keeps its last policy: its worker delivers what is queued.
    pub fn update(&self, config: &Config) {
        for rc in &config.routes {
            if let (RouteMode::Async(cfg), Some(state)) = (&rc.mode, self.routes.get(&rc.name)) {
                state.cfg.store(Arc::new(cfg.clone()));
                state.pace.bound_changed();
            }
        }
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
