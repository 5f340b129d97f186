//! The delivery pipeline, in the order a delivery flows through it:
//!
//! route → read body → verify → identify → claim → forward → settle → answer.
//!
//! The pure parts (what to do with each claim outcome, the shape of every answer) are
//! plain functions; the I/O parts (store, upstream) are thin calls around them.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::header::HeaderValue;
use http::{Request, StatusCode};
use http_body::Body;

use crate::config::{Config, OnStoreError};
use crate::metrics::{Metrics, Outcome, RouteKind, RouteMetrics, StoreOp};
use crate::providers::{self, Admission, Route};
use crate::store::{DeliveryKey, RouteLifetimes, Store, StoreError, StoredResponse, Token};
use crate::trace::{self, Kind, Record, Tracer};
use crate::upstream::{Outgoing, Upstream};

/// Reading a delivery's body under `max_body` and `body_timeout`.
mod body;
/// The answer table as a pure function.
mod decide;
/// The routes and limits in force, swapped whole by a live reload.
mod live;
/// How many unsigned scopes one signed body may be claimed under.
mod scopes;
/// Forwarding without a claim: handshakes, keyless requests, a bypassed store.
mod unclaimed;
/// Recording a 2xx's completion, and the answer when the store does not hold it.
mod unconfirmed;

use body::{BodyError, BodyLimits, read_body};
pub use decide::{Step, decide};
pub use live::{Live, Settings};
pub use scopes::ScopeBound;

use crate::answer::{
    Answer, ErrorAnswer, error_answer, handshake_answer, identify_error_answer, replay_answer,
    upstream_answer, upstream_error_answer,
};
use crate::store::lease::{self, LeaseEvent};
use crate::store::log::ClaimLog;

/// A delivery whose key this gate has claimed: what forwarding and settling it needs.
struct Delivery<'a> {
    route: &'a Route,
    rm: &'a RouteMetrics,
    parts: &'a http::request::Parts,
    /// The request's headers, moved out of `parts`: forwarded without a copy.
    headers: http::HeaderMap,
    body: Bytes,
    key: &'a DeliveryKey,
    fp: &'a providers::Fingerprint,
    upstream_key: Option<HeaderValue>,
    token: Token,
}

/// Everything a delivery needs, built once at start and shared by all connections.
pub struct Gate<S> {
    /// The routes, their metrics and the body limits in force (`live.rs`).
    live: Live,
    no_route: RouteMetrics,
    store: S,
    upstream: Upstream,
    metrics: Arc<Metrics>,
    on_error: OnStoreError,
    /// The async routes' queue hand-off (docs/async.md), built before the gate.
    async_mode: Option<Arc<crate::queue::AsyncMode>>,
    /// Spans for each delivery (docs/tracing.md); off by default.
    tracer: Tracer,
    /// Distinct unsigned scopes per signed body (`scopes`), one count per process
    /// (every delivery runtime's gate shares it).
    scopes: Arc<ScopeBound>,
}

/// Counts a delivery in `idemgate_in_flight` for as long as it lives.
struct InFlightGuard<'a>(&'a prometheus::IntGauge);

impl<'a> InFlightGuard<'a> {
    fn new(g: &'a prometheus::IntGauge) -> Self {
        g.inc();
        InFlightGuard(g)
    }
}

impl Drop for InFlightGuard<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

impl<S: Store> Gate<S> {
    pub fn new(
        config: &Config,
        built: &providers::Routes,
        store: S,
        metrics: Arc<Metrics>,
        async_mode: Option<Arc<crate::queue::AsyncMode>>,
    ) -> Result<Self, crate::config::ConfigError> {
        let live = Live::new(live::Settings::build(config.clone(), built, &metrics)?);
        Ok(Gate {
            live,
            no_route: metrics.route("-", RouteKind::Unmatched, &[]),
            store,
            upstream: Upstream::new(
                &config.upstream,
                config.upstream_timeout,
                config.max_response,
            ),
            metrics,
            on_error: config.store.on_error,
            async_mode,
            tracer: Tracer::default(),
            scopes: Arc::default(),
        })
    }

    /// The gate with its deliveries traced by `tracer`.
    pub fn with_tracer(mut self, tracer: Tracer) -> Self {
        self.tracer = tracer;
        self
    }

    /// The gate reading its routes from `live` (shared with the other gates of the
    /// process and the reload) instead of its own.
    pub fn with_live(mut self, live: Live) -> Self {
        self.live = live;
        self
    }

    /// The gate counting unsigned scopes in `scopes` (shared with the other runtimes'
    /// gates, so the bound holds per process).
    pub fn with_scopes(mut self, scopes: Arc<ScopeBound>) -> Self {
        self.scopes = scopes;
        self
    }

    /// The count of unsigned scopes per signed body.
    pub fn scopes(&self) -> &Arc<ScopeBound> {
        &self.scopes
    }

    /// The handle to the routes and limits in force.
    pub fn live(&self) -> &Live {
        &self.live
    }

    pub fn tracer(&self) -> &Tracer {
        &self.tracer
    }

    /// The queue hand-off and policy of `route`, when it is an async route.
    fn async_route(
        &self,
        route: &Route,
    ) -> Option<(
        &Arc<crate::queue::AsyncMode>,
        Arc<crate::config::AsyncRoute>,
    )> {
        let mode = self.async_mode.as_ref()?;
        Some((mode, mode.route(&route.name)?))
    }

    pub fn store(&self) -> &S {
        &self.store
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The answer to a delivery refused because `max_in_flight` deliveries are in hand:
    /// a fast 503 before anything is read, counted `overloaded`.
    pub fn overloaded(&self, path: &str) -> Answer {
        let live = self.live.load();
        let (route, rm) = match live.routes.get(path) {
            Some(e) => (&*e.route.name, &e.metrics),
            None => ("-", &self.no_route),
        };
        rm.record(Outcome::Overloaded, 0.0);
        tracing::info!(
            route,
            key = "-",
            outcome = "overloaded",
            status = 503u16,
            duration_ms = 0.0,
            "delivery"
        );
        error_answer(
            &ErrorAnswer::new(
                Outcome::Overloaded,
                StatusCode::SERVICE_UNAVAILABLE,
                "overloaded",
                "too many deliveries in progress; retry later",
            )
            .retry_after(1),
        )
    }

    /// The forwarding client (for an operator's replay).
    pub fn upstream(&self) -> &Upstream {
        &self.upstream
    }

    /// Every route's lease and retention (`[dedup]`'s for a route not configured).
    pub fn lifetimes(&self) -> &RouteLifetimes {
        self.store.lifetimes()
    }

    /// Handles one delivery from receipt to answer, and records it (metric + log line).
    pub async fn handle<B>(&self, req: Request<B>) -> Answer
    where
        B: Body<Data = Bytes>,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let started = Instant::now();
        // Loaded once: the delivery finishes under these settings whatever a reload does.
        let live = self.live.load();
        let Some(entry) = live.routes.get(req.uri().path()) else {
            let r = ErrorAnswer::new(
                Outcome::NoRoute,
                StatusCode::NOT_FOUND,
                "no_route",
                "no route for this path",
            );
            self.no_route
                .record(Outcome::NoRoute, started.elapsed().as_secs_f64());
            tracing::info!(
                route = "-",
                key = "-",
                outcome = "no_route",
                status = 404u16,
                duration_ms = 0.0,
                "delivery"
            );
            return error_answer(&r);
        };
        let _guard = InFlightGuard::new(&self.metrics.in_flight);
        let mut key_for_log: Option<String> = None;
        let path = req.uri().path();
        let mut span = self.tracer.continue_from(
            req.headers(),
            || format!("{} {path}", req.method()),
            Kind::Server,
        );
        if let Some(s) = &mut span {
            s.set("http.request.method", req.method().as_str().to_string());
            s.set("http.route", path.to_string());
            s.set("url.path", path.to_string());
            s.set("url.scheme", "http");
            s.set("idemgate.route", entry.route.name.to_string());
        }
        // Boxed: the delivery's state machine is several KiB (store and upstream calls
        // nested), and unboxed it would be copied whole each time the future moves
        // (into the task, into the tracker): 8% of the CPU in `memmove` before.
        let limits = BodyLimits {
            max_body: live.max_body,
            body_timeout: live.body_timeout,
        };
        let delivery =
            Box::pin(self.deliver(&entry.route, &entry.metrics, limits, req, &mut key_for_log));
        let (outcome, answer) = trace::within(span.as_ref(), delivery).await;
        if let Some(s) = &mut span {
            s.set("http.response.status_code", answer.status().as_u16());
            s.set("idemgate.outcome", outcome.as_str());
            s.set("idemgate.replayed", outcome == Outcome::Replayed);
            if let Some(k) = &key_for_log {
                s.set("idemgate.delivery_key", k.clone());
            }
            if answer.status().is_server_error() {
                s.set("error.type", outcome.as_str());
                s.fail(outcome.as_str());
            }
        }
        let elapsed = started.elapsed();
        entry.metrics.record_handled(outcome, elapsed.as_secs_f64());
        tracing::info!(
            route = &*entry.route.name,
            key = key_for_log.as_deref().unwrap_or("-"),
            outcome = outcome.as_str(),
            status = answer.status().as_u16(),
            duration_ms = elapsed.as_secs_f64() * 1000.0,
            "delivery"
        );
        answer
    }

    async fn deliver<B>(
        &self,
        route: &Route,
        rm: &RouteMetrics,
        limits: BodyLimits,
        req: Request<B>,
        key_for_log: &mut Option<String>,
    ) -> (Outcome, Answer)
    where
        B: Body<Data = Bytes>,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let (mut parts, body) = req.into_parts();
        let body = match read_body(limits, &parts.headers, body).await {
            Ok(b) => b,
            Err(BodyError::TooLarge) => {
                let r = ErrorAnswer::new(
                    Outcome::TooLarge,
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "too_large",
                    format!("the body exceeds max_body ({} bytes)", limits.max_body),
                );
                return (r.outcome, error_answer(&r));
            }
            Err(BodyError::Slow) => {
                let r = ErrorAnswer::new(
                    Outcome::ClientTimeout,
                    StatusCode::REQUEST_TIMEOUT,
                    "body_timeout",
                    "the request body did not arrive within body_timeout",
                );
                return (r.outcome, error_answer(&r));
            }
            Err(BodyError::Broken) => {
                let r = ErrorAnswer::new(
                    Outcome::BadRequest,
                    StatusCode::BAD_REQUEST,
                    "bad_request",
                    "the request body could not be read",
                );
                return (r.outcome, error_answer(&r));
            }
        };

        // verify + identify: pure, before anything touches the store.
        let h = &parts.headers;
        let mut verify = trace::child("verify", Kind::Internal);
        let admitted = route.admit(&parts.method, h, parts.uri.query(), &body, unix_now());
        if admitted.is_err() {
            verify.fail("refused");
        }
        drop(verify);
        let identity = match admitted {
            Ok(Admission::Delivery(v)) => v,
            Ok(Admission::Handshake(Some(reply))) => {
                return (Outcome::Handshake, handshake_answer(reply));
            }
            Ok(Admission::Handshake(None)) => {
                let headers = std::mem::take(&mut parts.headers);
                return self
                    .unclaimed(Outcome::Handshake, route, rm, &parts, headers, body)
                    .await;
            }
            Ok(Admission::Unkeyed) => {
                let headers = std::mem::take(&mut parts.headers);
                return self
                    .unclaimed(Outcome::Unkeyed, route, rm, &parts, headers, body)
                    .await;
            }
            Err(refused) => {
                let r = identify_error_answer(&refused);
                return (r.outcome, error_answer(&r));
            }
        };
        // The store claims `claim_key` (for unsigned-key presets, the body's hash); the
        // delivery's own key is what the log and the application see.
        let fp = identity.fingerprint;
        if let Some(body) = &identity.scoped_body
            && !self.scopes.admit(
                &route.name,
                body,
                &fp,
                route.dedup.retention,
                Instant::now(),
            )
        {
            let r = scopes::scope_refused();
            return (r.outcome, error_answer(&r));
        }
        let dkey = DeliveryKey::new(route.name.clone(), identity.claim_key);
        let upstream_key = route.idempotency_header(&identity.delivery_key);
        *key_for_log = Some(identity.delivery_key);
        // The delivery log keeps the request for an operator's replay (opt-in per route).
        let kept = if route.keep_payload {
            crate::store::log::KeptRequest::capture(
                &parts.method,
                &route.upstream_target(parts.uri.path(), parts.uri.query()),
                &parts.headers,
                upstream_key.as_ref(),
                &body,
            )
        } else {
            None
        };

        // claim (and, with in_flight = "wait", wait for the holder)
        let mut waited = false;
        let mut claim = self
            .timed(
                StoreOp::Claim,
                trace::store_op(
                    "claim",
                    self.store.claim(
                        &dkey,
                        &fp,
                        Some(ClaimLog {
                            kept: kept.as_ref(),
                            replay: false,
                        }),
                    ),
                ),
            )
            .await;
        loop {
            let c = match claim {
                Ok(c) => c,
                Err(e) => {
                    return self
                        .store_down(route, rm, &parts, body, upstream_key, e)
                        .await;
                }
            };
            match decide(c, route.dedup.in_flight, waited) {
                Step::Forward(token) if let Some((queue, _)) = self.async_route(route) => {
                    return queue.accept(&dkey, token, &parts, body, upstream_key).await;
                }
                Step::Replay(_) | Step::Acknowledge
                    if let Some((_, a)) = self.async_route(route) =>
                {
                    return (Outcome::Replayed, crate::queue::ack_answer(&a));
                }
                Step::Acknowledge => {
                    // A sync route finding a queued key (its mode was changed while
                    // entries were queued): the queue delivers it; the copy waits.
                    let r = ErrorAnswer::new(
                        Outcome::InFlight,
                        StatusCode::CONFLICT,
                        "in_flight",
                        "a copy of this delivery is queued for delivery; retry later",
                    )
                    .retry_after(1);
                    return (r.outcome, error_answer(&r));
                }
                Step::Forward(token) => {
                    let headers = std::mem::take(&mut parts.headers);
                    let delivery = Delivery {
                        route,
                        rm,
                        parts: &parts,
                        headers,
                        body,
                        key: &dkey,
                        fp: &fp,
                        upstream_key,
                        token,
                    };
                    return self.forward_and_settle(delivery).await;
                }
                Step::Replay(stored) => {
                    return (Outcome::Replayed, replay_answer(stored, route.replay_body));
                }
                Step::Refuse(r) => return (r.outcome, error_answer(&r)),
                Step::Wait => {
                    waited = true;
                    let deadline = tokio::time::Instant::now() + route.dedup.wait_timeout;
                    let wait = self.store.wait_for(&dkey, &fp, deadline);
                    claim = self
                        .timed(StoreOp::Claim, trace::store_op("wait", wait))
                        .await;
                }
            }
        }
    }

    /// Times a store operation into `idemgate_store_duration_seconds`.
    async fn timed<T>(
        &self,
        op: StoreOp,
        f: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let t = Instant::now();
        let r = f.await;
        // A call the circuit breaker refused never reached the store: it shows as
        // idemgate_store_circuit_open, not as a store error or latency.
        if !matches!(r, Err(StoreError::CircuitOpen)) {
            self.metrics
                .store_op(op, t.elapsed().as_secs_f64(), r.is_err());
        }
        r
    }

    fn outgoing<'a>(
        &self,
        parts: &'a http::request::Parts,
        headers: http::HeaderMap,
        body: Bytes,
        path_and_query: &'a str,
        idempotency_key: Option<HeaderValue>,
    ) -> Outgoing<'a> {
        Outgoing {
            method: &parts.method,
            path_and_query,
            headers,
            body,
            authority: parts.uri.authority().map(|a| a.as_str()),
            idempotency_key,
            traceparent: None,
        }
    }

    /// The store could not be asked: refuse (503) or forward undeduplicated.
    async fn store_down(
        &self,
        route: &Route,
        rm: &RouteMetrics,
        parts: &http::request::Parts,
        body: Bytes,
        upstream_key: Option<HeaderValue>,
        err: StoreError,
    ) -> (Outcome, Answer) {
        match err {
            // The breaker logged its opening once; a line per refused delivery would
            // flood the log at the moment it matters.
            StoreError::CircuitOpen => {
                tracing::debug!(route = &*route.name, error = %err, "store unavailable")
            }
            // One line a second says why; the refusals themselves are counted
            // (`outcome="store_unavailable"`).
            StoreError::Full if full_logged_now() => tracing::warn!(
                route = &*route.name,
                error = %err,
                "store full: new deliveries refused with 503 until settled ones can be forgotten"
            ),
            StoreError::Full => tracing::debug!(route = &*route.name, error = %err, "store full"),
            _ => tracing::warn!(route = &*route.name, error = %err, "store unavailable"),
        }
        // A full store answers: forwarding past it (`on_error = "pass"`) would drop the
        // very de-duplication that is short of room, so a new delivery waits instead.
        let on_error = match err {
            StoreError::Full => OnStoreError::Reject,
            _ => self.on_error,
        };
        match on_error {
            OnStoreError::Reject => {
                let r = ErrorAnswer::new(
                    Outcome::StoreUnavailable,
                    StatusCode::SERVICE_UNAVAILABLE,
                    "store_unavailable",
                    "the idempotency store is unavailable; retry later",
                )
                .retry_after(1);
                (r.outcome, error_answer(&r))
            }
            OnStoreError::Pass => {
                let pass = unclaimed::Unclaimed {
                    outcome: Outcome::Bypassed,
                    route,
                    rm,
                    parts,
                    headers: parts.headers.clone(),
                    body,
                    upstream_key,
                };
                self.forward_unclaimed(pass).await
            }
        }
    }

    /// Forwards a claimed delivery while renewing its lease, then completes (2xx) or
    /// releases (anything else) the claim.
    async fn forward_and_settle(&self, delivery: Delivery<'_>) -> (Outcome, Answer) {
        let Delivery {
            route,
            rm,
            parts,
            headers,
            body,
            key,
            fp,
            upstream_key,
            token,
        } = delivery;
        let pq = route.upstream_target(parts.uri.path(), parts.uri.query());
        let t = Instant::now();
        // The shorter of the lease this delivery started with and the store's now: a
        // reload between the two cannot leave the claim renewed too slowly.
        let lease = route
            .dedup
            .lease
            .min(self.lifetimes().of(&route.name).lease);
        let result = lease::renewing(
            lease,
            || self.timed(StoreOp::Renew, self.store.renew(key, token)),
            trace::forward(&self.upstream, self.outgoing(parts, headers, body, &pq, upstream_key)),
            |event| match event {
                LeaseEvent::Lost => tracing::warn!(route = &*route.name, key = key.logged(), "lease lost while the upstream call ran"),
                LeaseEvent::Failed(e) => tracing::warn!(route = &*route.name, key = key.logged(), error = %e, "lease renewal failed"),
            },
        )
        .await;
        rm.upstream.observe(t.elapsed().as_secs_f64());
        let settled = crate::store::log::Settled {
            outcome: crate::store::log::LogOutcome::Forwarded,
            upstream_status: result.as_ref().ok().map(|r| r.status.as_u16()),
            latency_ms: t.elapsed().as_millis() as u64,
            restore_completed: false,
        };

        match result {
            Ok(resp) if route.success.completes(resp.status, &resp.body) => {
                let stored = StoredResponse::from(&resp);
                let claimed = unconfirmed::Claimed {
                    route,
                    rm,
                    key,
                    fp,
                    token,
                };
                let recorded = self.record_completion(&claimed, &stored, &settled).await;
                if !unconfirmed::may_answer_2xx(recorded, self.store.confirms_completions()) {
                    return unconfirmed::answer();
                }
                (Outcome::Forwarded, upstream_answer(resp))
            }
            other => {
                if let Err(e) = self
                    .timed(
                        StoreOp::Release,
                        trace::store_op(
                            "release",
                            self.store.release(
                                key,
                                token,
                                Some(&crate::store::log::Settled {
                                    outcome: crate::store::log::LogOutcome::UpstreamError,
                                    ..settled
                                }),
                            ),
                        ),
                    )
                    .await
                {
                    tracing::warn!(route = &*route.name, key = key.logged(), error = %e, "release failed; the key frees at lease expiry");
                }
                match other {
                    Ok(resp) => (Outcome::UpstreamError, upstream_answer(resp)),
                    Err(e) => {
                        tracing::warn!(route = &*route.name, key = key.logged(), error = %e, "upstream call failed");
                        let r = upstream_error_answer(&e);
                        (r.outcome, error_answer(&r))
                    }
                }
            }
        }
    }
}

/// Whether this "store full" refusal is the first of its second (the others are
/// logged at debug level, so a full store does not flood the log).
fn full_logged_now() -> bool {
    static LAST: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let now = crate::store::unix_millis() / 1000;
    LAST.swap(now, std::sync::atomic::Ordering::Relaxed) != now
}
