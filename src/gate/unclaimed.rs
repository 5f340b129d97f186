//! Forwarding a request without claiming it: a handshake (`handshake = "forward"`), a
//! signed request with no key (`keyless = "forward"`), or any delivery while the store
//! is down with `on_error = "pass"`. Nothing is stored; the answer is passed back.

use std::time::Instant;

use bytes::Bytes;
use http::header::HeaderValue;

use super::Gate;
use crate::answer::{Answer, error_answer, upstream_answer, upstream_error_answer};
use crate::metrics::{Outcome, RouteMetrics};
use crate::providers::Route;
use crate::store::Store;

/// One request to forward unclaimed, and the outcome it counts as.
pub(super) struct Unclaimed<'a> {
    pub(super) outcome: Outcome,
    pub(super) route: &'a Route,
    pub(super) rm: &'a RouteMetrics,
    pub(super) parts: &'a http::request::Parts,
    /// The headers to forward (the request's own, moved or copied).
    pub(super) headers: http::HeaderMap,
    pub(super) body: Bytes,
    /// The `idempotency-key` header, when the request has a key.
    pub(super) upstream_key: Option<HeaderValue>,
}

impl<S: Store> Gate<S> {
    /// Forwards a request that has no key to claim (a handshake, a keyless request),
    /// without any `idempotency-key`, not even one its sender set: that header always
    /// means a key idemgate claimed.
    pub(super) async fn unclaimed(
        &self,
        outcome: Outcome,
        route: &Route,
        rm: &RouteMetrics,
        parts: &http::request::Parts,
        mut headers: http::HeaderMap,
        body: Bytes,
    ) -> (Outcome, Answer) {
        headers.remove("idempotency-key");
        let u = Unclaimed {
            outcome,
            route,
            rm,
            parts,
            headers,
            body,
            upstream_key: None,
        };
        self.forward_unclaimed(u).await
    }

    /// Forwards once and passes the answer back; an unreachable or failing call is an
    /// `upstream_error` like any other.
    pub(super) async fn forward_unclaimed(&self, u: Unclaimed<'_>) -> (Outcome, Answer) {
        let pq = u
            .route
            .upstream_target(u.parts.uri.path(), u.parts.uri.query());
        let t = Instant::now();
        let out = self.outgoing(u.parts, u.headers, u.body, &pq, u.upstream_key);
        let result = crate::trace::forward(&self.upstream, out).await;
        u.rm.upstream.observe(t.elapsed().as_secs_f64());
        match result {
            Ok(resp) => (u.outcome, upstream_answer(resp)),
            Err(e) => {
                let r = upstream_error_answer(&e);
                (r.outcome, error_answer(&r))
            }
        }
    }
}
