//! The in-memory store: the same semantics as Redis, inside one process. For a single
//! replica and for local use (`idemgate demo`); nothing survives a restart.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use super::log::{ClaimLog, Settled};
use super::{
    Claim, DeliveryKey, Lifetimes, Status, Store, StoreError, StoredResponse, Token, unix_millis,
};
use crate::providers::Fingerprint;

/// The delivery log (the operator's view of each delivery) in memory.
/// Operators' bulk jobs in process (`store::jobs`).
mod jobs;
mod log;
/// The route's pacing state in process (`store::pacing`).
mod pacing;
mod queue;
/// Each route's recent deliveries, for listing (`store::log`).
mod recent;
pub use queue::MemoryQueue;

struct Entry {
    status: Status,
    /// None when a queue worker re-created an expired entry (as Redis re-creates the
    /// hash without `fp`): copies are then acknowledged, never refused.
    fp: Option<Fingerprint>,
    /// The current claim: its owner and when its lease lapses.
    owner: Option<(Token, Instant)>,
    response: Option<StoredResponse>,
    attempts: u64,
    duplicates: u64,
    first_seen: u64,
    last_seen: u64,
    /// When the whole entry is forgotten (retention).
    expires_at: Instant,
    /// The delivery log's extra fields: outcome, upstream status, latency, kept request.
    log: log::Extra,
    /// An operator's replay of a completed key holds (or held) the claim: unless it
    /// records a new answer, the key stays completed with its old one (the `r` record
    /// on Redis, record.rs).
    restore: bool,
}

impl Entry {
    fn fresh(fp: Option<Fingerprint>, status: Status, ms: u64, expires_at: Instant) -> Entry {
        Entry {
            status,
            fp,
            owner: None,
            response: None,
            attempts: 0,
            duplicates: 0,
            first_seen: ms,
            last_seen: ms,
            expires_at,
            log: log::Extra::default(),
            restore: false,
        }
    }

    fn live_owner(&self, now: Instant) -> Option<(Token, Instant)> {
        self.owner.filter(|(_, until)| *until > now)
    }

    fn live(&self, now: Instant) -> bool {
        self.expires_at > now || self.live_owner(now).is_some()
    }

    /// The status as the Redis scripts see it: a replay of a completed key whose
    /// claim lapsed without settling is completed with its old answer.
    fn status_at(&self, now: Instant) -> Status {
        if self.status == Status::Processing
            && self.restore
            && self.response.is_some()
            && self.live_owner(now).is_none()
        {
            Status::Completed
        } else {
            self.status
        }
    }

    /// Whether `fp` differs from the entry's fingerprint (none known: no mismatch).
    fn differs(&self, fp: &Fingerprint) -> bool {
        self.fp.is_some_and(|f| f != *fp)
    }

    /// Records the owner's answer: completed, remembered until `expires_at`.
    fn complete(&mut self, response: &StoredResponse, expires_at: Instant) {
        self.status = Status::Completed;
        self.owner = None;
        self.response = Some(response.clone());
        self.last_seen = unix_millis();
        self.expires_at = expires_at;
    }

    /// Gives the claim up: `released`, or back to `completed` for a replay of a
    /// completed key (or when the caller asks so).
    fn give_up(&mut self, restore: bool) {
        self.status = if (self.restore || restore) && self.response.is_some() {
            Status::Completed
        } else {
            Status::Released
        };
        self.owner = None;
        self.last_seen = unix_millis();
    }
}

/// `now + d`, capped at a century: a huge duration never panics under the store's
/// lock (which would poison it for every later call).
pub(super) fn later(now: Instant, d: Duration) -> Instant {
    const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
    now.checked_add(d)
        .or_else(|| now.checked_add(CENTURY))
        .unwrap_or(now)
}

#[derive(Default)]
struct Inner {
    entries: Mutex<HashMap<DeliveryKey, Entry>>,
    recent: Mutex<recent::Recent>,
}

/// See the module documentation.
#[derive(Clone)]
pub struct MemoryStore {
    inner: Arc<Inner>,
    lifetimes: Lifetimes,
}

impl MemoryStore {
    /// Creates the store; inside a tokio runtime it also starts a sweeper that drops
    /// expired entries once a second, so memory follows retention.
    pub fn new(lifetimes: Lifetimes) -> Self {
        let inner = Arc::new(Inner::default());
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let weak: Weak<Inner> = Arc::downgrade(&inner);
            handle.spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_secs(1));
                loop {
                    tick.tick().await;
                    let Some(inner) = weak.upgrade() else { return };
                    let now = Instant::now();
                    if let Ok(mut map) = inner.entries.lock() {
                        map.retain(|_, e| e.expires_at > now || e.live_owner(now).is_some());
                    }
                }
            });
        }
        MemoryStore { inner, lifetimes }
    }

    /// Number of keys held (for tests and diagnostics).
    pub fn len(&self) -> usize {
        self.inner.entries.lock().map(|m| m.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn with_entries<T>(
        &self,
        f: impl FnOnce(&mut HashMap<DeliveryKey, Entry>, Instant) -> T,
    ) -> Result<T, StoreError> {
        let mut map = self
            .inner
            .entries
            .lock()
            .map_err(|_| StoreError::Unavailable("memory store lock poisoned".into()))?;
        Ok(f(&mut map, Instant::now()))
    }

    /// Applies `f` to the key's entry if the caller's token owns a live lease.
    fn owned(
        &self,
        key: &DeliveryKey,
        token: Token,
        f: impl FnOnce(&mut Entry, Instant),
    ) -> Result<bool, StoreError> {
        self.with_entries(|map, now| match map.get_mut(key) {
            Some(e) if e.live_owner(now).map(|(t, _)| t) == Some(token) => {
                f(e, now);
                true
            }
            _ => false,
        })
    }

    /// A provider's claim (with the request to keep, if any), inside the lock.
    fn claim_in(
        &self,
        map: &mut HashMap<DeliveryKey, Entry>,
        now: Instant,
        key: &DeliveryKey,
        fp: &Fingerprint,
        kept: Option<&crate::store::log::KeptRequest>,
    ) -> Claim {
        let Lifetimes { lease, retention } = self.lifetimes;
        let ms = unix_millis();
        if map.get(key).is_some_and(|e| !e.live(now)) {
            map.remove(key);
        }
        let entry = self.created(map, key, || {
            Entry::fresh(Some(*fp), Status::Released, ms, later(now, retention))
        });
        let status = entry.status_at(now);
        if status == Status::Completed {
            if entry.differs(fp) {
                return Claim::Mismatch;
            }
            entry.status = status;
            entry.duplicates += 1;
            entry.last_seen = ms;
            return match &entry.response {
                Some(r) => Claim::Completed(r.clone()),
                None => Claim::Mismatch,
            };
        }
        if status == Status::Queued {
            if entry.differs(fp) {
                return Claim::Mismatch;
            }
            entry.duplicates += 1;
            entry.last_seen = ms;
            return Claim::Queued;
        }
        match entry.live_owner(now) {
            None => {
                let token = Token::random();
                entry.status = Status::Processing;
                entry.fp = Some(*fp);
                entry.owner = Some((token, later(now, lease)));
                entry.attempts += 1;
                entry.last_seen = ms;
                entry.restore = false;
                // The record outlives the claim (as the log hash on Redis).
                entry.expires_at = later(now, retention.max(lease));
                if let Some(k) = kept {
                    entry.log.request = Some(k.clone());
                }
                Claim::Claimed(token)
            }
            Some(_) if entry.differs(fp) => Claim::Mismatch,
            Some((_, until)) => Claim::InFlight {
                remaining: until.saturating_duration_since(now),
            },
        }
    }
}

/// The delivery log, read and forgotten by operators.
impl crate::store::log::DeliveryLog for MemoryStore {
    fn log_support(&self) -> crate::store::log::LogSupport {
        crate::store::log::LogSupport::Full
    }

    async fn log_entry(
        &self,
        key: &DeliveryKey,
    ) -> Result<Option<crate::store::log::LogEntry>, StoreError> {
        self.read_log_entry(key)
    }

    async fn recent(
        &self,
        query: &crate::store::log::ListQuery,
    ) -> Result<crate::store::log::Page, StoreError> {
        self.read_recent(query)
    }

    async fn forget(&self, key: &DeliveryKey) -> Result<crate::store::log::Forgot, StoreError> {
        self.forget_key(key)
    }
}

impl Store for MemoryStore {
    async fn claim(
        &self,
        key: &DeliveryKey,
        fp: &Fingerprint,
        log: Option<ClaimLog<'_>>,
    ) -> Result<Claim, StoreError> {
        match log {
            Some(ClaimLog { replay: true, .. }) => self.replay_claim(key, fp),
            _ => self.with_entries(|map, now| {
                self.claim_in(map, now, key, fp, log.and_then(|l| l.kept))
            }),
        }
    }

    async fn renew(&self, key: &DeliveryKey, token: Token) -> Result<bool, StoreError> {
        let lease = self.lifetimes.lease;
        self.owned(key, token, |e, now| {
            let until = later(now, lease);
            e.owner = Some((token, until));
            // The record lives at least as long as the claim (renew.lua).
            e.expires_at = e.expires_at.max(until);
        })
    }

    async fn complete(
        &self,
        key: &DeliveryKey,
        token: Token,
        response: &StoredResponse,
        settled: Option<&Settled>,
    ) -> Result<bool, StoreError> {
        let retention = self.lifetimes.retention;
        self.owned(key, token, |e, now| {
            e.complete(response, later(now, retention));
            e.note(settled);
        })
    }

    /// Recorded when the key is free (absent, released, or a lapsed claim); a live
    /// claim of anyone, a queued key or another payload's completion is left alone.
    async fn complete_unowned(
        &self,
        key: &DeliveryKey,
        fp: &Fingerprint,
        response: &StoredResponse,
        settled: Option<&Settled>,
    ) -> Result<bool, StoreError> {
        let retention = self.lifetimes.retention;
        self.with_entries(|map, now| {
            if let Some(e) = map.get(key).filter(|e| e.live(now)) {
                if e.live_owner(now).is_some() || e.differs(fp) {
                    return false;
                }
                match e.status_at(now) {
                    Status::Completed => return true,
                    Status::Queued => return false,
                    Status::Processing | Status::Released => {}
                }
            } else {
                map.remove(key);
            }
            let e = self.created(map, key, || {
                Entry::fresh(Some(*fp), Status::Released, unix_millis(), now)
            });
            e.fp = Some(*fp);
            e.complete(response, later(now, retention));
            e.note(settled);
            true
        })
    }

    /// One lock section with the log's fields: no copy can claim in between (nor
    /// between a failed replay and its way back to `completed`).
    async fn release(
        &self,
        key: &DeliveryKey,
        token: Token,
        settled: Option<&Settled>,
    ) -> Result<bool, StoreError> {
        self.owned(key, token, |e, _| {
            e.give_up(settled.is_some_and(|s| s.restore_completed));
            e.note(settled);
        })
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.with_entries(|_, _| ())
    }
}

/// What a queue worker finds when it asks to deliver a key (see `crate::queue`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DeliveryLock {
    /// Already completed: nothing to deliver.
    Completed,
    /// Someone holds the key's claim now (a gate mid-enqueue, another worker).
    Busy,
    /// This worker owns the key's claim for one delivery attempt.
    Claimed(Token),
}

/// The async queue's transitions of a key, with the same semantics as the Redis scripts
/// in `store/redis/queue.rs`.
impl MemoryStore {
    /// Turns the owner's claim into `queued` (the delivery is in the queue) and frees
    /// the claim for the worker; the entry lives the longer of retention and `keep_for`.
    pub(crate) fn mark_queued(
        &self,
        key: &DeliveryKey,
        token: Token,
        keep_for: Duration,
    ) -> Result<bool, StoreError> {
        let keep = self.lifetimes.retention.max(keep_for);
        self.owned(key, token, |e, now| {
            e.status = Status::Queued;
            e.owner = None;
            e.last_seen = unix_millis();
            e.expires_at = later(now, keep);
        })
    }

    /// Claims a queued key for one delivery attempt (fenced like a provider's claim).
    pub(crate) fn lock_for_delivery(
        &self,
        key: &DeliveryKey,
        keep_for: Duration,
    ) -> Result<DeliveryLock, StoreError> {
        let Lifetimes { lease, retention } = self.lifetimes;
        let keep = retention.max(keep_for);
        self.with_entries(|map, now| {
            let ms = unix_millis();
            if map.get(key).is_some_and(|e| !e.live(now)) {
                map.remove(key);
            }
            // An expired record comes back without a fingerprint, as deliver_lock.lua
            // re-creates the hash: copies are acknowledged, not refused.
            let entry = self.created(map, key, || Entry::fresh(None, Status::Queued, ms, now));
            if entry.status_at(now) == Status::Completed {
                return DeliveryLock::Completed;
            }
            if entry.live_owner(now).is_some() {
                return DeliveryLock::Busy;
            }
            let token = Token::random();
            entry.status = Status::Queued;
            entry.owner = Some((token, later(now, lease)));
            entry.last_seen = ms;
            entry.expires_at = later(now, keep);
            DeliveryLock::Claimed(token)
        })
    }

    /// Records a queued delivery's completion; the record lives the longer of retention
    /// and `keep_for`, as long as another entry of the key may still be attempted.
    pub(crate) fn complete_queued(
        &self,
        key: &DeliveryKey,
        token: Token,
        response: &StoredResponse,
        keep_for: Duration,
    ) -> Result<bool, StoreError> {
        let keep = self.lifetimes.retention.max(keep_for);
        self.owned(key, token, |e, now| e.complete(response, later(now, keep)))
    }

    /// Gives a failed attempt's claim up; the key stays `queued` for the next attempt.
    pub(crate) fn unlock(&self, key: &DeliveryKey, token: Token) -> Result<bool, StoreError> {
        self.owned(key, token, |e, _| e.owner = None)
    }
}
