//! The gate's hand-off to the queue: append a claimed delivery, mark its key
//! `queued`, acknowledge the provider.

use bytes::Bytes;
use http::StatusCode;
use http::header::{self, HeaderName, HeaderValue};

use super::{AsyncMode, QueueEntry, ack_answer};
use crate::answer::{Answer, ErrorAnswer, error_answer};
use crate::metrics::Outcome;
use crate::store::{DeliveryKey, Token, unix_millis};
use crate::trace::{self, Kind, Record};
use crate::upstream;

fn unavailable(code: &'static str, message: &str, outcome: Outcome) -> Answer {
    let r = ErrorAnswer {
        outcome,
        status: StatusCode::SERVICE_UNAVAILABLE,
        code,
        message: message.to_string(),
        retry_after: Some(1),
    };
    error_answer(&r)
}

impl AsyncMode {
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
        // The append's span: the parent (and link) of every delivery attempt, which
        // finds it in the entry's `traceparent`.
        let mut span = trace::child_named(|| format!("send {}", key.route).into(), Kind::Producer);
        if let Some(s) = &mut span {
            headers.insert(trace::TRACEPARENT, s.context().header());
            s.set("messaging.system", "idemgate");
            s.set("messaging.operation.type", "send");
            s.set("messaging.operation.name", "send");
            s.set("messaging.destination.name", key.route.to_string());
            s.set("messaging.message.id", key.key.clone());
        }
        let order = state.order.as_ref().and_then(|source| {
            match source
                .extract(&parts.headers, &body)
                .and_then(|v| crate::providers::validate_key(&v).map(|()| v))
            {
                Ok(v) => Some(v),
                Err(e) => {
                    // Acknowledged all the same: refusing it would only make the
                    // provider retry a delivery that can never carry the value.
                    tracing::warn!(route = &*key.route, key = key.logged(), error = %e, "no usable order_key value; the delivery is queued unordered");
                    None
                }
            }
        });
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
            order,
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
                tracing::warn!(route = &*key.route, key = key.logged(), error = %e, "queue append failed");
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
            span.set("error.type", refused.0.as_str());
            span.fail(refused.0.as_str());
            if let Err(e) = self.backend.release(key, token).await {
                tracing::warn!(route = &*key.route, key = key.logged(), error = %e, "release failed; the key frees at lease expiry");
            }
            return refused;
        }
        // The entry is durable: acknowledge whatever happens next. Should the `queued`
        // mark fail, copies get 409 until the lease lapses, then a copy queues a second
        // entry, which the worker only acknowledges (its key completed).
        if let Err(e) = self
            .backend
            .mark_queued(key, token, state.cfg.load().max_age)
            .await
        {
            tracing::warn!(route = &*key.route, key = key.logged(), error = %e, "marking the key queued failed; the claim frees at lease expiry");
        }
        (Outcome::Queued, ack_answer(&state.cfg.load()))
    }
}
