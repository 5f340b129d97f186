//! The async queue's storage, as the store layer offers it: entries, dead letters, and
//! the key transitions async mode needs (`QueueBackend`), each one store round trip.
//! Implemented beside each store: `store/redis/queue.rs` (Redis Streams, shared by every
//! replica) and `store/memory/queue.rs` (in process). The policies that use it
//! (acknowledging, retrying, dead-lettering) live in `crate::queue`.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;

use crate::store::{DeliveryKey, StoreError, StoredResponse, Token};

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
    /// The route's `order_key` value, when the route orders its deliveries.
    pub order: Option<String>,
}

impl QueueEntry {
    /// The stream fields, in the agreed layout (`order` only on ordered routes).
    pub fn fields(&self) -> Vec<(&'static str, Bytes)> {
        let mut f = vec![
            ("key", Bytes::from(self.key.clone())),
            ("method", Bytes::from(self.method.clone())),
            ("path", Bytes::from(self.path.clone())),
            ("headers", self.headers.clone()),
            ("body", self.body.clone()),
            ("received_at", Bytes::from(self.received_at.to_string())),
        ];
        if let Some(o) = &self.order {
            f.push(("order", Bytes::from(o.clone())));
        }
        f
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
            order: text("order"),
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

/// What a worker's batch read (`QueueBackend::read_batch`) returns.
#[derive(Debug, Default)]
pub struct Batch {
    /// The entries read, now held by the consumer.
    pub reads: Vec<Read>,
    /// Whether the route was open (neither paused nor held) at the read: the first
    /// attempt of an unthrottled, unordered entry read here needs no admission of its own.
    pub open: bool,
}

pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// The queue and the key transitions async mode needs; one round trip per method. The
/// route's pacing state (`Pacing`) and the operators' bulk jobs (`Jobs`) come with it.
pub trait QueueBackend:
    crate::store::pacing::Pacing + crate::store::jobs::Jobs + Send + Sync + 'static
{
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
    /// Gives a failed attempt's claim up; the key stays `queued`. With `refund` the
    /// attempt is not counted (the application asked to wait: `Retry-After`).
    fn unlock<'a>(
        &'a self,
        key: &'a DeliveryKey,
        token: Token,
        refund: bool,
    ) -> StoreFuture<'a, bool>;
    /// Marks the key completed with the upstream's answer (owner only). The status
    /// lives at least `keep_for` (the route's `max_age`) or `retention`, like `queued`:
    /// another entry of the key (a redrive beside a provider's copy) finds it completed
    /// at every attempt it may still get.
    fn complete<'a>(
        &'a self,
        key: &'a DeliveryKey,
        token: Token,
        response: &'a StoredResponse,
        keep_for: Duration,
    ) -> StoreFuture<'a, bool>;
    /// Acknowledges (and deletes) a delivered entry; `order` is its order value, whose
    /// next entry may then start.
    fn done<'a>(
        &'a self,
        route: &'a str,
        id: &'a str,
        order: Option<&'a str>,
    ) -> StoreFuture<'a, ()>;
    /// A worker's batch: acknowledges (and deletes) the delivered unordered entries
    /// `done`, reads up to `count` new entries as `read_new` does (none when 0), and
    /// tells whether the route is open (`Batch`). One round trip on Redis, where the
    /// worker makes one per batch instead of an acknowledgement and an admission per
    /// entry; here, the same from the other methods.
    fn read_batch<'a>(
        &'a self,
        route: &'a str,
        consumer: &'a str,
        done: &'a [String],
        count: usize,
    ) -> StoreFuture<'a, Batch> {
        Box::pin(async move {
            for id in done {
                self.done(route, id, None).await?;
            }
            let reads = if count > 0 {
                self.read_new(route, consumer, count).await?
            } else {
                Vec::new()
            };
            let state = self.route_state(route).await?;
            Ok(Batch {
                reads,
                open: !state.paused && state.held_for.is_none(),
            })
        })
    }
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
