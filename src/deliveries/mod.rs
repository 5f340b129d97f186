//! The delivery log (issue 8): what an operator may know about a delivery — its
//! status, attempts, duplicates answered, last outcome, upstream status and latency,
//! and (with `keep_payload = true` on its route) the request itself — and the three
//! operator actions on it: show, forget, replay.
//!
//! The log lives in the store, beside the claim: it is written by the claim, complete
//! and release scripts themselves (extra arguments, no extra round trip). The admin API,
//! the web console and `idemgate deliveries …` all go through the functions here.

pub mod cli;

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Method};

use crate::providers::Fingerprint;
use crate::store::lease::{self, LeaseEvent};
use crate::store::{Claim, DeliveryKey, Status, Store, StoreError, StoredResponse};
use crate::upstream::{self, Outgoing, Upstream, UpstreamError};

/// Largest request kept for replay (headers + body); larger ones are logged without it.
pub const KEEP_PAYLOAD_MAX: usize = 256 * 1024;

/// How many deliveries each route's recent index holds (older ones drop off the list,
/// not out of the store: `show`, `forget` and `replay` still find them by key).
pub const RECENT_PER_ROUTE: usize = 10_000;

/// What of the delivery log a store keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogSupport {
    /// No log: the admin API answers 501.
    None,
    /// Entries by key (show, forget, replay), without the recent index (Redis Cluster:
    /// the index would be a second slot, which a script may not touch).
    ByKey,
    /// Entries by key and the recent index (list).
    Full,
}

/// The error a store without a log answers.
pub fn no_log() -> StoreError {
    StoreError::Unavailable("this store keeps no delivery log".into())
}

/// The request as it was forwarded, kept for an operator's replay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptRequest {
    pub method: String,
    /// The upstream path and query it was forwarded to.
    pub path: String,
    /// End-to-end headers as `name: value\r\n` lines (with `idempotency-key`).
    pub headers: Bytes,
    pub body: Bytes,
}

impl KeptRequest {
    /// The request as forwarded, or None when it is larger than [`KEEP_PAYLOAD_MAX`].
    pub fn capture(
        method: &Method,
        path: &str,
        headers: &HeaderMap,
        idempotency_key: Option<&http::HeaderValue>,
        body: &Bytes,
    ) -> Option<KeptRequest> {
        let mut h = upstream::end_to_end(headers);
        if let Some(k) = idempotency_key {
            h.insert(http::HeaderName::from_static("idempotency-key"), k.clone());
        }
        let headers = upstream::encode_headers(&h);
        (headers.len() + body.len() <= KEEP_PAYLOAD_MAX).then(|| KeptRequest {
            method: method.to_string(),
            path: path.to_string(),
            headers,
            body: body.clone(),
        })
    }
}

/// How a claim ended, recorded by complete/release.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settled {
    /// `forwarded`, `upstream_error`, `operator_replay`, `operator_replay_failed`.
    pub outcome: &'static str,
    /// The upstream's status; None when it could not be reached or timed out.
    pub upstream_status: Option<u16>,
    pub latency_ms: u64,
    /// A failed operator replay of a completed key: put it back to `completed` (the
    /// original answer stands) instead of releasing it. The stores also do so by
    /// themselves, for any release or lapse of such a replay's claim.
    pub restore_completed: bool,
}

/// One delivery as the log knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogEntry {
    pub route: String,
    pub key: String,
    pub status: Status,
    /// Whether a live claim holds the key now.
    pub claimed: bool,
    pub fingerprint: String,
    /// Forwards to the upstream, across releases (operator replays included).
    pub attempts: u64,
    /// Copies answered from the store.
    pub duplicates: u64,
    /// Operator replays.
    pub replays: u64,
    /// Unix milliseconds.
    pub first_seen: u64,
    pub last_seen: u64,
    pub outcome: Option<String>,
    pub upstream_status: Option<u16>,
    pub latency_ms: Option<u64>,
    /// The stored answer's status (completed keys).
    pub response_status: Option<u16>,
    /// Whether the request is kept (replayable).
    pub has_request: bool,
    /// The kept request (only filled by `log_entry`, not by listings).
    pub request: Option<KeptRequest>,
}

impl LogEntry {
    /// The entry as JSON (the request body as UTF-8 text when it is, else base64).
    pub fn to_json(&self) -> serde_json::Value {
        let mut v = serde_json::json!({
            "route": self.route,
            "key": self.key,
            "status": self.status.as_str(),
            "claimed": self.claimed,
            "fingerprint": self.fingerprint,
            "attempts": self.attempts,
            "duplicates": self.duplicates,
            "replays": self.replays,
            "first_seen": self.first_seen,
            "last_seen": self.last_seen,
            "outcome": self.outcome,
            "upstream_status": self.upstream_status,
            "latency_ms": self.latency_ms,
            "response_status": self.response_status,
            "replayable": self.has_request,
        });
        if let Some(r) = &self.request {
            let mut req = serde_json::json!({
                "method": r.method,
                "path": r.path,
                "headers": String::from_utf8_lossy(&r.headers).lines().collect::<Vec<_>>(),
                "body_bytes": r.body.len(),
            });
            match std::str::from_utf8(&r.body) {
                Ok(s) => req["body"] = s.into(),
                Err(_) => {
                    use base64::Engine as _;
                    req["body_base64"] = base64::engine::general_purpose::STANDARD
                        .encode(&r.body)
                        .into();
                }
            }
            v["request"] = req;
        }
        v
    }
}

/// A position in the recent list: the entry after which the next page starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    pub score: u64,
    pub route: String,
    pub key: String,
}

impl Cursor {
    /// `score.route.hex(key)`: opaque to clients, safe in a URL.
    pub fn encode(&self) -> String {
        format!("{}.{}.{}", self.score, self.route, hex::encode(&self.key))
    }

    pub fn decode(s: &str) -> Option<Cursor> {
        let (score, rest) = s.split_once('.')?;
        let (route, key) = rest.rsplit_once('.')?;
        Some(Cursor {
            score: score.parse().ok()?,
            route: route.to_string(),
            key: String::from_utf8(hex::decode(key).ok()?).ok()?,
        })
    }

    /// The list's order: newest first, then route and key descending.
    pub fn order(&self) -> (u64, &str, &str) {
        (self.score, &self.route, &self.key)
    }
}

/// What to list.
#[derive(Debug, Clone, Default)]
pub struct ListQuery {
    /// The routes to list (all configured routes when the caller did not filter).
    pub routes: Vec<String>,
    pub status: Option<Status>,
    pub outcome: Option<String>,
    pub limit: usize,
    pub cursor: Option<Cursor>,
}

impl ListQuery {
    pub fn matches(&self, e: &LogEntry) -> bool {
        self.status.is_none_or(|s| s == e.status)
            && self
                .outcome
                .as_deref()
                .is_none_or(|o| e.outcome.as_deref() == Some(o))
    }
}

/// One page of the list; `next` continues it.
#[derive(Debug, Clone, Default)]
pub struct Page {
    pub items: Vec<(u64, LogEntry)>,
    pub next: Option<Cursor>,
}

impl Page {
    /// Merges per-route candidates (each sorted or not) into one page of `limit`.
    pub fn from_candidates(mut all: Vec<(u64, LogEntry)>, limit: usize) -> Page {
        all.sort_by(|a, b| (b.0, &b.1.route, &b.1.key).cmp(&(a.0, &a.1.route, &a.1.key)));
        let more = all.len() > limit;
        all.truncate(limit);
        let next = if more {
            all.last().map(|(score, e)| Cursor {
                score: *score,
                route: e.route.clone(),
                key: e.key.clone(),
            })
        } else {
            None
        };
        Page { items: all, next }
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "deliveries": self.items.iter().map(|(_, e)| e.to_json()).collect::<Vec<_>>(),
            "next_cursor": self.next.as_ref().map(Cursor::encode),
        })
    }
}

/// What `forget` found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forgot {
    Forgotten,
    NotFound,
    /// A live claim holds the key: forgetting it now would let a copy run beside it.
    InFlight,
}

/// Why a replay did not reach the upstream.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("no such delivery")]
    NotFound,
    #[error(
        "the request of this delivery was not kept (keep_payload is off for its route, or it was larger than the cap)"
    )]
    NotKept,
    #[error("a copy of this delivery is being processed; retry in {0} s")]
    InFlight(u64),
    #[error("the delivery changed while the replay started (its payload is now different)")]
    Changed,
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What an operator's replay got.
#[derive(Debug, Clone)]
pub struct Replayed {
    /// The upstream's status, or 502/504 when it could not be reached in time.
    pub status: u16,
    pub outcome: &'static str,
    /// Whether the new answer was recorded (2xx and the claim still owned).
    pub recorded: bool,
    pub latency_ms: u64,
}

/// An operator's replay of `key`'s kept request: it takes the key's claim like a
/// first delivery (a forced re-claim when the key is completed), so it never runs
/// beside a provider's copy — copies meanwhile get 409 — forwards the request with
/// its lease renewed, and records the new answer (or, when the upstream fails,
/// releases the key; a key that was completed goes back to its old answer, also when
/// this replay never settles: the store keeps the old answer until a new one is
/// recorded).
pub async fn replay<S: Store>(
    store: &S,
    upstream: &Upstream,
    key: &DeliveryKey,
    lease: Duration,
) -> Result<Replayed, ReplayError> {
    let entry = store.log_entry(key).await?.ok_or(ReplayError::NotFound)?;
    let req = entry.request.clone().ok_or(ReplayError::NotKept)?;
    let mut fp: Fingerprint = [0; 32];
    hex::decode_to_slice(&entry.fingerprint, &mut fp)
        .map_err(|_| StoreError::Unavailable("stored fingerprint is not hex".into()))?;
    let was_completed = entry.status == Status::Completed;
    let token = match store.claim_logged(key, &fp, None, true).await? {
        Claim::Claimed(t) => t,
        Claim::InFlight { remaining } => {
            return Err(ReplayError::InFlight(crate::answer::retry_after_secs(
                remaining,
            )));
        }
        // An async route's delivery in its queue: the queue's worker is delivering it.
        Claim::Queued => return Err(ReplayError::InFlight(1)),
        Claim::Mismatch | Claim::Completed(_) => return Err(ReplayError::Changed),
    };
    let method = Method::from_bytes(req.method.as_bytes()).unwrap_or(Method::POST);
    let mut headers = HeaderMap::new();
    upstream::decode_headers(&req.headers, &mut headers);
    let started = Instant::now();
    let call = upstream.forward(Outgoing {
        method: &method,
        path_and_query: &req.path,
        headers: &headers,
        body: req.body.clone(),
        authority: None,
        idempotency_key: None,
    });
    let result = lease::renewing(lease, || store.renew(key, token), call, |event| match event {
        LeaseEvent::Lost => tracing::warn!(route = &*key.route, key = %key.key, "lease lost while a replay ran"),
        LeaseEvent::Failed(e) => tracing::warn!(route = &*key.route, key = %key.key, error = %e, "lease renewal failed while a replay ran"),
    })
    .await;
    let latency_ms = started.elapsed().as_millis() as u64;
    match result {
        Ok(resp) if resp.status.is_success() => {
            let stored = StoredResponse::from(&resp);
            let settled = Settled {
                outcome: "operator_replay",
                upstream_status: Some(stored.status),
                latency_ms,
                restore_completed: false,
            };
            let recorded = store
                .complete_logged(key, token, &stored, &settled)
                .await
                .unwrap_or(false);
            Ok(Replayed {
                status: stored.status,
                outcome: settled.outcome,
                recorded,
                latency_ms,
            })
        }
        other => {
            let status = match &other {
                Ok(r) => r.status.as_u16(),
                Err(UpstreamError::Timeout) => 504,
                Err(_) => 502,
            };
            let settled = Settled {
                outcome: "operator_replay_failed",
                upstream_status: other.as_ref().ok().map(|r| r.status.as_u16()),
                latency_ms,
                restore_completed: was_completed,
            };
            if let Err(e) = store.release_logged(key, token, &settled).await {
                tracing::warn!(route = &*key.route, key = %key.key, error = %e, "releasing after a failed replay failed; the key frees at lease expiry");
            }
            Ok(Replayed {
                status,
                outcome: settled.outcome,
                recorded: false,
                latency_ms,
            })
        }
    }
}
