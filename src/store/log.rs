//! The delivery log's types: what the store keeps about a delivery for an operator
//! (its entry, the kept request, how a claim settled) and how it is listed and forgotten.
//! They live beside the `Store` trait that reads and writes them.

use std::future::Future;

use bytes::Bytes;
use http::{HeaderMap, Method};

pub use crate::store::log_filter::Filter;
use crate::store::{DeliveryKey, Status, StoreError};
use crate::upstream;

/// Largest request kept for replay (headers + body); larger ones are logged without it.
pub const KEEP_PAYLOAD_MAX: usize = 256 * 1024;

/// How many deliveries each route's recent index holds by default (older ones drop off
/// the list, not out of the store: `show`, `forget` and `replay` still find them by key).
pub const RECENT_PER_ROUTE: usize = crate::config::RECENT_PER_ROUTE;

/// What of the delivery log a store keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogSupport {
    /// No log: the admin API answers 501.
    None,
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

/// What a logged claim also records, in the same round trip as the claim: the request
/// to keep (for a later replay) and whether this claim is an operator's replay.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClaimLog<'a> {
    /// The request as forwarded, kept when the route keeps payloads.
    pub kept: Option<&'a KeptRequest>,
    /// An operator's replay: it re-claims a completed key (still exclusive: a live
    /// claim answers `InFlight`), and the key keeps its old answer unless the replay
    /// records a new one.
    pub replay: bool,
}

/// The last outcome a log entry records: a closed set, stored as its text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogOutcome {
    /// The gate forwarded it and the upstream answered 2xx (the answer is stored).
    Forwarded,
    /// The gate forwarded it and the upstream failed (the key is released).
    UpstreamError,
    /// An operator's replay reached the upstream and got a 2xx.
    OperatorReplay,
    /// An operator's replay failed.
    OperatorReplayFailed,
}

impl LogOutcome {
    /// The text the stores keep (entries written by earlier versions read the same).
    pub fn as_str(self) -> &'static str {
        match self {
            LogOutcome::Forwarded => "forwarded",
            LogOutcome::UpstreamError => "upstream_error",
            LogOutcome::OperatorReplay => "operator_replay",
            LogOutcome::OperatorReplayFailed => "operator_replay_failed",
        }
    }

    /// The outcome a stored text names, if any.
    pub fn parse(s: &str) -> Option<LogOutcome> {
        [
            LogOutcome::Forwarded,
            LogOutcome::UpstreamError,
            LogOutcome::OperatorReplay,
            LogOutcome::OperatorReplayFailed,
        ]
        .into_iter()
        .find(|o| o.as_str() == s)
    }
}

/// How a claim ended, recorded by complete/release.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settled {
    pub outcome: LogOutcome,
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
    pub filter: Filter,
    pub limit: usize,
    pub cursor: Option<Cursor>,
}

impl ListQuery {
    pub fn matches(&self, e: &LogEntry) -> bool {
        self.filter.matches(e)
    }
}

/// How many index entries one listing reads at most, whatever its filter: past it, the
/// page is `partial` and its cursor goes on from where the reading stopped.
pub const SCAN_BUDGET: usize = 5_000;

/// One page of the list; `next` continues it.
#[derive(Debug, Clone, Default)]
pub struct Page {
    pub items: Vec<(u64, LogEntry)>,
    pub next: Option<Cursor>,
    /// The reading stopped at [`SCAN_BUDGET`] before the page was full: `next` goes on
    /// (there may be nothing more to find).
    pub partial: bool,
}

impl Page {
    /// Merges per-route candidates (each sorted or not) into one page of `limit`.
    /// `stopped`: the lowest position a route whose reading was cut read to, if any:
    /// candidates below it are left for the next page (another route may hold
    /// entries above them not read yet), and the page goes on from there.
    pub fn from_candidates(
        mut all: Vec<(u64, LogEntry)>,
        limit: usize,
        stopped: Option<Cursor>,
    ) -> Page {
        all.sort_by(|a, b| (b.0, &b.1.route, &b.1.key).cmp(&(a.0, &a.1.route, &a.1.key)));
        if let Some(stop) = &stopped {
            all.retain(|(score, e)| (*score, e.route.as_str(), e.key.as_str()) >= stop.order());
        }
        let more = all.len() > limit;
        all.truncate(limit);
        let at = |(score, e): &(u64, LogEntry)| Cursor {
            score: *score,
            route: e.route.clone(),
            key: e.key.clone(),
        };
        match stopped {
            Some(stop) if !more => Page {
                next: Some(stop),
                items: all,
                partial: true,
            },
            _ => Page {
                next: if more { all.last().map(at) } else { None },
                items: all,
                partial: false,
            },
        }
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "deliveries": self.items.iter().map(|(_, e)| e.to_json()).collect::<Vec<_>>(),
            "next_cursor": self.next.as_ref().map(Cursor::encode),
            "partial": self.partial,
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

/// The operator's reads of the delivery log, apart from the claim path the gate uses.
pub trait DeliveryLog: Send + Sync + 'static {
    /// What of the delivery log this store keeps.
    fn log_support(&self) -> LogSupport;

    /// The delivery log entry of `key`, with the kept request if any.
    fn log_entry(
        &self,
        key: &DeliveryKey,
    ) -> impl Future<Output = Result<Option<LogEntry>, StoreError>> + Send;

    /// A page of recent deliveries, newest (first seen) first: copies do not move a delivery.
    fn recent(&self, query: &ListQuery) -> impl Future<Output = Result<Page, StoreError>> + Send;

    /// Forgets `key` so the provider's next copy is forwarded.
    fn forget(&self, key: &DeliveryKey) -> impl Future<Output = Result<Forgot, StoreError>> + Send;

    /// Waits until log writes queued off the claim path are written (a store that
    /// writes its log with each claim has none): at shutdown, so none is lost.
    fn flush(&self) -> impl Future<Output = ()> + Send {
        async {}
    }
}

#[cfg(test)]
mod tests {
    use super::LogOutcome;

    #[test]
    fn outcomes_keep_the_text_stored_before_they_were_an_enum() {
        for (o, s) in [
            (LogOutcome::Forwarded, "forwarded"),
            (LogOutcome::UpstreamError, "upstream_error"),
            (LogOutcome::OperatorReplay, "operator_replay"),
            (LogOutcome::OperatorReplayFailed, "operator_replay_failed"),
        ] {
            assert_eq!(o.as_str(), s);
            assert_eq!(LogOutcome::parse(s), Some(o));
        }
        assert_eq!(LogOutcome::parse("queued"), None);
    }
}
