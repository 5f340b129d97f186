//! The answers idemgate gives itself, and how an upstream or stored answer is passed
//! back: one place for the shape of every answer, used by the gate, the async queue's
//! acknowledgement and the operator replay. A leaf: it names no pipeline module.

use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue};
use http::{Response, StatusCode};
use http_body_util::Full;

use crate::metrics::Outcome;
use crate::providers::{IdentifyError, KeyError, Reply, SignatureError};
use crate::store::StoredResponse;
use crate::upstream::{self, UpstreamError, UpstreamResponse};

/// An HTTP answer with its whole body in memory.
pub type Answer = Response<Full<Bytes>>;

/// The header that marks an answer replayed from the store.
pub const REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// An error answer idemgate gives itself, not the upstream's: an outcome, a status and
/// a short reason, rendered as JSON by `error_answer`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorAnswer {
    pub outcome: Outcome,
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    pub retry_after: Option<u64>,
}

impl ErrorAnswer {
    pub fn new(
        outcome: Outcome,
        status: StatusCode,
        code: &'static str,
        message: impl Into<String>,
    ) -> Self {
        ErrorAnswer {
            outcome,
            status,
            code,
            message: message.into(),
            retry_after: None,
        }
    }

    pub fn retry_after(mut self, secs: u64) -> Self {
        self.retry_after = Some(secs.max(1));
        self
    }
}

/// `Retry-After` for a copy in flight: the claimer's remaining lease, rounded up to
/// whole seconds, at least 1.
pub fn retry_after_secs(remaining: Duration) -> u64 {
    remaining.as_millis().div_ceil(1000).max(1) as u64
}

/// The answer to a delivery whose signature or key check failed (400 or 401).
pub fn identify_error_answer(r: &IdentifyError) -> ErrorAnswer {
    match r {
        IdentifyError::Signature(SignatureError::Malformed(m)) => ErrorAnswer::new(
            Outcome::BadRequest,
            StatusCode::BAD_REQUEST,
            "bad_request",
            *m,
        ),
        IdentifyError::Signature(SignatureError::Invalid(m)) => ErrorAnswer::new(
            Outcome::InvalidSignature,
            StatusCode::UNAUTHORIZED,
            "invalid_signature",
            *m,
        ),
        IdentifyError::Forbidden(m) => ErrorAnswer::new(
            Outcome::InvalidSignature,
            StatusCode::FORBIDDEN,
            "forbidden",
            *m,
        ),
        IdentifyError::Key(
            k @ (KeyError::Missing(_) | KeyError::Invalid(_) | KeyError::NotJson),
        ) => ErrorAnswer::new(
            Outcome::BadRequest,
            StatusCode::BAD_REQUEST,
            "bad_request",
            k.to_string(),
        ),
    }
}

/// The answer when the upstream call failed (unreachable, too large, timed out).
pub fn upstream_error_answer(e: &UpstreamError) -> ErrorAnswer {
    match e {
        UpstreamError::Unreachable(_) => ErrorAnswer::new(
            Outcome::UpstreamError,
            StatusCode::BAD_GATEWAY,
            "upstream_unreachable",
            "the application could not be reached",
        ),
        UpstreamError::TooLarge => ErrorAnswer::new(
            Outcome::UpstreamError,
            StatusCode::BAD_GATEWAY,
            "upstream_response_too_large",
            "the application's answer exceeded max_response",
        ),
        UpstreamError::Timeout => ErrorAnswer::new(
            Outcome::UpstreamError,
            StatusCode::GATEWAY_TIMEOUT,
            "upstream_timeout",
            "the application did not answer within upstream_timeout",
        ),
    }
}

/// A short JSON error answer.
pub fn error_answer(r: &ErrorAnswer) -> Answer {
    let body = serde_json::json!({ "error": r.code, "message": r.message }).to_string();
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = r.status;
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if let Some(secs) = r.retry_after {
        h.insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    if r.status == StatusCode::PAYLOAD_TOO_LARGE || r.status == StatusCode::REQUEST_TIMEOUT {
        h.insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    resp
}

/// The upstream's answer, passed back to the provider.
pub fn upstream_answer(r: UpstreamResponse) -> Answer {
    let mut resp = Response::new(Full::new(r.body));
    *resp.status_mut() = r.status;
    *resp.headers_mut() = r.headers;
    resp
}

/// idemgate's own answer to a provider's URL check (`handshake = "answer"`).
pub fn handshake_answer(reply: Reply) -> Answer {
    let mut resp = Response::new(Full::new(reply.body));
    *resp.status_mut() = reply.status;
    if let Some(ct) = reply.content_type {
        resp.headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(ct));
    }
    resp
}

/// A stored answer, replayed and marked so; without its body unless `with_body`
/// (a route's `replay_body = false`).
pub fn replay_answer(stored: StoredResponse, with_body: bool) -> Answer {
    let body = if with_body { stored.body } else { Bytes::new() };
    let mut resp = Response::new(Full::new(body));
    *resp.status_mut() = StatusCode::from_u16(stored.status).unwrap_or(StatusCode::OK);
    upstream::decode_headers(&stored.headers, resp.headers_mut());
    resp.headers_mut().remove(header::CONTENT_LENGTH);
    resp.headers_mut()
        .insert(REPLAYED, HeaderValue::from_static("true"));
    resp
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use hyper::body::Body as _;

    /// A stored answer with a status, a header to keep and one to drop on replay.
    pub(crate) fn stored() -> StoredResponse {
        StoredResponse {
            status: 201,
            headers: Bytes::from_static(b"x-a: 1\r\ncontent-length: 2\r\n"),
            body: Bytes::from_static(b"ok"),
        }
    }

    #[test]
    fn retry_after_is_whole_seconds_at_least_one() {
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1000)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1001)), 2);
        assert_eq!(retry_after_secs(Duration::from_secs(30)), 30);
    }

    #[test]
    fn refusals_map_to_one_status_each() {
        let r = identify_error_answer(&IdentifyError::Signature(SignatureError::Malformed("m")));
        assert_eq!((r.status, r.code), (StatusCode::BAD_REQUEST, "bad_request"));
        let r = identify_error_answer(&IdentifyError::Signature(SignatureError::Invalid("i")));
        assert_eq!(
            (r.status, r.code),
            (StatusCode::UNAUTHORIZED, "invalid_signature")
        );
        let r = identify_error_answer(&IdentifyError::Key(KeyError::Missing("header x".into())));
        assert_eq!(
            (r.status, r.outcome),
            (StatusCode::BAD_REQUEST, Outcome::BadRequest)
        );
        let r = upstream_error_answer(&UpstreamError::Timeout);
        assert_eq!(r.status, StatusCode::GATEWAY_TIMEOUT);
        let r = upstream_error_answer(&UpstreamError::Unreachable("x".into()));
        assert_eq!(r.status, StatusCode::BAD_GATEWAY);
    }

    #[test]
    fn replayed_answers_are_marked_and_keep_status_headers_body() {
        let a = replay_answer(stored(), true);
        assert_eq!(a.status(), StatusCode::CREATED);
        assert_eq!(a.headers()["idempotent-replayed"], "true");
        assert_eq!(a.headers()["x-a"], "1");
        assert!(a.headers().get("content-length").is_none());
        assert_eq!(a.body().size_hint().exact(), Some(2));
    }

    #[test]
    fn without_the_body_a_replay_keeps_status_and_headers() {
        let a = replay_answer(stored(), false);
        assert_eq!(a.status(), StatusCode::CREATED);
        assert_eq!(a.headers()["idempotent-replayed"], "true");
        assert_eq!(a.headers()["x-a"], "1");
        assert_eq!(a.body().size_hint().exact(), Some(0));
    }

    #[test]
    fn error_answers_are_short_json() {
        let r = ErrorAnswer::new(
            Outcome::TooLarge,
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            "big",
        );
        let a = error_answer(&r);
        assert_eq!(a.headers()["connection"], "close");
        assert_eq!(a.headers()["content-type"], "application/json");
        let r = ErrorAnswer::new(Outcome::InFlight, StatusCode::CONFLICT, "in_flight", "x")
            .retry_after(0);
        assert_eq!(error_answer(&r).headers()["retry-after"], "1");
    }
}
