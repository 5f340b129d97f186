//! The store: the atomic claim of a delivery's key, and what is remembered about it.
//!
//! One `Store` trait, two implementations with the same semantics: `RedisStore`
//! (shared by every replica) and `MemoryStore` (one process). The conformance suite in
//! `tests/it/store_conformance.rs` runs against both.
//!
//! States of a key: absent → `processing` (claimed, lease running) → `completed`
//! (answer stored for `retention`) or `released` (the claimer gave up; the next copy
//! claims again). A claim is owned by a random per-attempt token; renew, complete and
//! release succeed only for the current owner (fencing). An operator's replay re-claims
//! a `completed` key but keeps its answer: unless the replay records a new one, the
//! key is `completed` again once the replay's claim is released or lapses.

pub mod breaker;
pub mod connection;
pub mod lease;
pub mod log;
pub mod memory;
pub mod redis;
pub mod sentinel;
pub mod tcp;

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;

use crate::providers::Fingerprint;
pub use breaker::Breaker;
pub use memory::MemoryStore;
pub use redis::RedisStore;

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
}

/// Lease and retention, fixed per store at start.
#[derive(Debug, Clone, Copy)]
pub struct Lifetimes {
    /// How long a claim holds without renewal.
    pub lease: Duration,
    /// How long a completed (or released) key is remembered.
    pub retention: Duration,
}

/// The atomic claim and its settlement. Every method is one store round trip.
pub trait Store: log::DeliveryLog + Send + Sync + 'static {
    /// Claims `key` for a delivery whose payload has fingerprint `fp`.
    fn claim(
        &self,
        key: &DeliveryKey,
        fp: &Fingerprint,
    ) -> impl Future<Output = Result<Claim, StoreError>> + Send;

    /// Extends the owner's lease by another `lease`; false when `token` no longer owns it.
    fn renew(
        &self,
        key: &DeliveryKey,
        token: Token,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Marks the key completed with `response`; false when `token` no longer owns it.
    fn complete(
        &self,
        key: &DeliveryKey,
        token: Token,
        response: &StoredResponse,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Gives the claim up so the next copy is forwarded; false when not the owner.
    fn release(
        &self,
        key: &DeliveryKey,
        token: Token,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Whether the store answers (for `/readyz`).
    fn ping(&self) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Whether a circuit breaker currently keeps calls from reaching the store (for
    /// `idemgate_store_circuit_open`); plain stores have none.
    fn circuit_open(&self) -> bool {
        false
    }

    /// Whether a completion counts only once replicas confirmed it (`min_replicas_ack`):
    /// then a completion that could not be confirmed must not be answered 2xx.
    fn confirms_completions(&self) -> bool {
        false
    }

    // --- The delivery log's writes, beside the claim. Every method has a default so
    // that a store (or a wrapper around one) without a log keeps working; the defaults
    // write nothing extra. The operator's reads are the `log::DeliveryLog` supertrait.

    /// `claim`, also recording the delivery in the log (and the request itself when
    /// `kept`), in the same round trip. `force` is an operator's replay: it re-claims a
    /// completed key (the claim is still exclusive: a live claim answers `InFlight`).
    fn claim_logged(
        &self,
        key: &DeliveryKey,
        fp: &Fingerprint,
        kept: Option<&crate::store::log::KeptRequest>,
        force: bool,
    ) -> impl Future<Output = Result<Claim, StoreError>> + Send {
        let _ = kept;
        async move {
            if force {
                return Err(StoreError::Unavailable(
                    "this store keeps no delivery log".into(),
                ));
            }
            self.claim(key, fp).await
        }
    }

    /// `complete`, also recording how the upstream call went, in the same round trip.
    fn complete_logged(
        &self,
        key: &DeliveryKey,
        token: Token,
        response: &StoredResponse,
        settled: &crate::store::log::Settled,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        let _ = settled;
        self.complete(key, token, response)
    }

    /// `release`, also recording how the upstream call went, in the same round trip.
    fn release_logged(
        &self,
        key: &DeliveryKey,
        token: Token,
        settled: &crate::store::log::Settled,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        let _ = settled;
        self.release(key, token)
    }

    /// Claims, and while another holder has the key, polls until it completes or is
    /// released, or `deadline` passes (then the last `InFlight` is returned).
    fn wait_for(
        &self,
        key: &DeliveryKey,
        fp: &Fingerprint,
        deadline: tokio::time::Instant,
    ) -> impl Future<Output = Result<Claim, StoreError>> + Send {
        async move {
            let mut pause = Duration::from_millis(5);
            loop {
                let claim = self.claim(key, fp).await?;
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
