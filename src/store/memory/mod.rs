//! The in-memory store: the same semantics as Redis, inside one process. For a single
//! replica and for local use (`idemgate demo`); nothing survives a restart (unless a
//! `journal` keeps every change, as the `file:` store does).
//!
//! Entries live in a sharded table (`table`), each as one compact record (`codec`),
//! bounded by `max_memory`: the oldest settled deliveries are forgotten first.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use super::log::{ClaimLog, Settled};
use super::{
    BoundStats, Claim, DeliveryKey, Lifetimes, RouteLifetimes, Status, Store, StoreError,
    StoredResponse, Token, unix_millis,
};
use crate::providers::Fingerprint;
use journal::{Journal, Ticket};
use table::{Admit, Table, Updated};

/// One entry as bytes: the store's record and the journal's change.
pub(crate) mod codec;
/// Operators' bulk jobs in process (`store::jobs`).
mod jobs;
/// How a durable store hears of the memory store's changes (the `file:` store).
pub(crate) mod journal;
/// The delivery log (the operator's view of each delivery) in memory.
mod log;
/// The route's pacing state in process (`store::pacing`).
mod pacing;
mod queue;
/// Each route's recent deliveries, for listing (`store::log`).
mod recent;
mod shares;
/// The sharded, bounded map of entries.
mod table;
pub use queue::MemoryQueue;

#[derive(Debug)]
pub(crate) struct Entry {
    status: Status,
    /// None when a queue worker re-created an expired entry (as Redis re-creates the
    /// hash without `fp`): copies are then acknowledged, never refused.
    fp: Option<Fingerprint>,
    /// The current claim: its owner and when its lease lapses (Unix ms).
    owner: Option<(Token, u64)>,
    response: Option<StoredResponse>,
    attempts: u64,
    duplicates: u64,
    first_seen: u64,
    last_seen: u64,
    /// When the whole entry is forgotten (retention), Unix ms.
    expires_at: u64,
    /// The delivery log's extra fields: outcome, upstream status, latency, kept request.
    log: log::Extra,
    /// An operator's replay of a completed key holds (or held) the claim: unless it
    /// records a new answer, the key stays completed with its old one (the `r` record
    /// on Redis, record.rs).
    restore: bool,
}

impl Entry {
    fn fresh(fp: Option<Fingerprint>, status: Status, ms: u64, expires_at: u64) -> Entry {
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

    fn live_owner(&self, now: u64) -> Option<(Token, u64)> {
        self.owner.filter(|(_, until)| *until > now)
    }

    fn live(&self, now: u64) -> bool {
        self.expires_at > now || self.live_owner(now).is_some()
    }

    /// The status as the Redis scripts see it: a replay of a completed key whose
    /// claim lapsed without settling is completed with its old answer.
    fn status_at(&self, now: u64) -> Status {
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
    fn complete(&mut self, response: &StoredResponse, now: u64, expires_at: u64) {
        self.status = Status::Completed;
        self.owner = None;
        self.response = Some(response.clone());
        self.last_seen = now;
        self.expires_at = expires_at;
    }

    /// Gives the claim up: `released`, or back to `completed` for a replay of a
    /// completed key (or when the caller asks so).
    fn give_up(&mut self, restore: bool, now: u64) {
        self.status = if (self.restore || restore) && self.response.is_some() {
            Status::Completed
        } else {
            Status::Released
        };
        self.owner = None;
        self.last_seen = now;
    }
}

/// `now + d` in Unix ms, saturating: a huge duration never overflows under a lock.
pub(super) fn later(now: u64, d: Duration) -> u64 {
    now.saturating_add(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// How a memory store is built.
#[derive(Clone)]
pub struct MemoryOptions {
    pub lifetimes: RouteLifetimes,
    /// Bytes the entries may take (`[store] max_memory`); then the oldest settled
    /// deliveries are forgotten, and new ones refused when none are left to forget.
    pub max_memory: u64,
    /// Hears every change of an entry (the `file:` store); `None`: nothing survives.
    pub(crate) journal: Option<Arc<dyn Journal>>,
    /// How many deliveries each route's recent index (the list) holds.
    pub recent_per_route: usize,
}

impl MemoryOptions {
    /// The default bound and no journal.
    pub fn new(lifetimes: impl Into<RouteLifetimes>) -> Self {
        MemoryOptions {
            lifetimes: lifetimes.into(),
            max_memory: crate::config::DEFAULT_MAX_MEMORY,
            journal: None,
            recent_per_route: crate::store::log::RECENT_PER_ROUTE,
        }
    }

    /// The same options with another size of each route's recent index.
    pub fn recent_per_route(self, recent_per_route: usize) -> Self {
        MemoryOptions {
            recent_per_route,
            ..self
        }
    }

    /// The same options with another bound, in bytes.
    pub fn max_memory(self, max_memory: u64) -> Self {
        MemoryOptions { max_memory, ..self }
    }
}

/// See the module documentation.
#[derive(Clone)]
pub struct MemoryStore {
    inner: Arc<Table>,
    lifetimes: RouteLifetimes,
    /// Each route's deliveries by first seen, for listing (recent.rs).
    recent: Arc<Mutex<recent::Recent>>,
}

impl MemoryStore {
    /// A store with the default bound and no journal (tests, benches, `demo`).
    pub fn new(lifetimes: impl Into<RouteLifetimes>) -> Self {
        Self::with_options(MemoryOptions::new(lifetimes))
    }

    /// Creates the store; inside a tokio runtime it also starts a sweeper that drops
    /// expired entries once a second, a batch per shard lock, so memory follows
    /// retention and no delivery waits behind a sweep of the whole map: those at each
    /// shard's front, then a batch behind its first live one (a pass over every entry
    /// every `entries / 32,768` seconds).
    pub fn with_options(options: MemoryOptions) -> Self {
        let drift = later(0, options.lifetimes.default().lease);
        let inner = Arc::new(Table::new(options.max_memory, drift, options.journal));
        // With routes of different retentions, the shortest: a sweep then never waits
        // behind a longer-lived entry (each entry's own expiry decides what goes).
        // Read per pass: a reload may shorten it.
        let lifetimes = options.lifetimes.clone();
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let weak: Weak<Table> = Arc::downgrade(&inner);
            handle.spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_secs(1));
                loop {
                    tick.tick().await;
                    let Some(table) = weak.upgrade() else { return };
                    let retention = later(0, lifetimes.shortest_retention());
                    for i in 0..table.shard_count() {
                        let mut budget = table.marks(i);
                        loop {
                            let (looked, more) = table.sweep_batch(i, unix_millis(), retention);
                            budget = budget.saturating_sub(looked);
                            if !more || budget == 0 {
                                break;
                            }
                            tokio::task::yield_now().await;
                        }
                        // Behind the first live mark, a batch per second and shard.
                        table.sweep_behind(i, unix_millis());
                    }
                }
            });
        }
        let mut recent = recent::Recent::default();
        recent.set_cap(options.recent_per_route);
        MemoryStore {
            inner,
            lifetimes: options.lifetimes,
            recent: Arc::new(Mutex::new(recent)),
        }
    }

    /// Number of keys held (for tests and diagnostics).
    pub fn len(&self) -> usize {
        self.inner.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Evictions, the effective dedup window and the bytes held, for the metrics.
    pub fn bound_stats(&self) -> BoundStats {
        let now = unix_millis();
        let (used_bytes, max_bytes) = self.inner.used();
        let oldest_age = self
            .inner
            .oldest_age(now, |route| later(0, self.lifetimes.of(route).retention))
            .unwrap_or(0);
        BoundStats {
            evictions: self.inner.evictions(),
            oldest_age: Duration::from_millis(oldest_age),
            used_bytes,
            max_bytes,
        }
    }

    /// Loads one entry as a journal kept it (`codec` bytes), at start; an expired
    /// entry is skipped. Not told to the journal (it is where the entry came from).
    pub fn restore_entry(&self, key: DeliveryKey, encoded: &[u8]) -> Result<(), String> {
        let entry = codec::decode(encoded)?;
        self.restore_decoded(&key, &entry, unix_millis())
    }

    /// Loads a journal's entries at start in age order (by expiry, the order the
    /// table's marks keep: eviction and the sweeper take the oldest first, whatever
    /// order the journal read them in), and returns the keys of those that expired
    /// meanwhile (skipped: the caller forgets them on disk too).
    pub(crate) fn restore_entries(
        &self,
        encoded: Vec<(DeliveryKey, Vec<u8>)>,
    ) -> Result<Vec<DeliveryKey>, String> {
        let now = unix_millis();
        let mut entries = encoded
            .into_iter()
            .map(|(key, bytes)| Ok((codec::decode(&bytes)?, key)))
            .collect::<Result<Vec<_>, String>>()?;
        entries.sort_by_key(|(e, _)| e.expires_at);
        let mut expired = Vec::new();
        for (entry, key) in entries {
            if entry.live(now) {
                self.restore_decoded(&key, &entry, now)?;
            } else {
                expired.push(key);
            }
        }
        Ok(expired)
    }

    /// One decoded entry into the table and its route's recent index; an expired one
    /// is skipped.
    fn restore_decoded(&self, key: &DeliveryKey, entry: &Entry, now: u64) -> Result<(), String> {
        if !entry.live(now) {
            return Ok(());
        }
        self.inner
            .restore(key, entry, now)
            .map_err(|e| e.to_string())?;
        self.index_created(key, entry.first_seen);
        Ok(())
    }

    /// `Table::update`, and a delivery whose entry `f` created goes into its route's
    /// recent index (after the shard's lock is released).
    fn update_indexed<T>(
        &self,
        key: &DeliveryKey,
        now: u64,
        admit: Admit,
        f: impl FnOnce(&mut Option<Entry>, u64) -> T,
    ) -> Result<Updated<T>, StoreError> {
        // A journal that can write nothing any more: memory must not change (nor be
        // answered from) past what the disk holds.
        if let Some(e) = self.broken_journal() {
            return Err(StoreError::Unavailable(e));
        }
        let Updated { value, ticket } = self.inner.update(key, now, admit, |e| {
            let existed = e.is_some();
            let value = f(e, now);
            (value, e.as_ref().filter(|_| !existed).map(|e| e.first_seen))
        })?;
        let (value, created) = value;
        if let Some(first_seen) = created {
            self.index_created(key, first_seen);
        }
        Ok(Updated { value, ticket })
    }

    /// Changes `key`'s entry (see `Table::update`) and waits until the journal, if
    /// any, holds the change.
    async fn change<T>(
        &self,
        key: &DeliveryKey,
        admit: Admit,
        f: impl FnOnce(&mut Option<Entry>, u64) -> T,
    ) -> Result<T, StoreError> {
        let now = unix_millis();
        let value = self.update_indexed(key, now, admit, f)?;
        let Updated { value, ticket } = value;
        self.durable(ticket).await?;
        Ok(value)
    }

    /// Why the journal, if any, can write nothing any more.
    fn broken_journal(&self) -> Option<String> {
        self.inner.journal().and_then(|j| j.broken())
    }

    async fn durable(&self, ticket: Option<Ticket>) -> Result<(), StoreError> {
        match (ticket, self.inner.journal()) {
            (Some(t), Some(j)) => j.durable(t).await,
            _ => Ok(()),
        }
    }

    /// Applies `f` to the key's entry if the caller's token owns a live lease.
    async fn owned(
        &self,
        key: &DeliveryKey,
        token: Token,
        f: impl FnOnce(&mut Entry, u64),
    ) -> Result<bool, StoreError> {
        self.change(key, Admit::Always, |slot, now| match slot {
            Some(e) if e.live_owner(now).map(|(t, _)| t) == Some(token) => {
                f(e, now);
                true
            }
            _ => false,
        })
        .await
    }

    /// A provider's claim (with the request to keep, if any), inside the lock.
    fn claim_in(
        &self,
        key: &DeliveryKey,
        slot: &mut Option<Entry>,
        now: u64,
        fp: &Fingerprint,
        kept: Option<&crate::store::log::KeptRequest>,
    ) -> Claim {
        let Lifetimes { lease, retention } = self.lifetimes.of(&key.route);
        let ms = now;
        let entry = slot.get_or_insert_with(|| {
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
                remaining: Duration::from_millis(until.saturating_sub(now)),
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
        self.forget_key(key).await
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
            Some(ClaimLog { replay: true, .. }) => self.replay_claim(key, fp).await,
            _ => {
                let kept = log.and_then(|l| l.kept);
                // A journal that does not write now (failed, or a write outliving
                // `store.timeout`) hands out no claim: its completion could not be
                // written either.
                if let Some(j) = self.inner.journal() {
                    j.health()?;
                }
                let now = unix_millis();
                let Updated { value, ticket } =
                    self.update_indexed(key, now, Admit::NewDelivery, |e, now| {
                        self.claim_in(key, e, now, fp, kept)
                    })?;
                // A claim that hands the key to this caller promises the provider
                // nothing yet: the completion (or queueing) that answers it is
                // journaled after it and waited for, which covers both. Any other
                // answer (a stored answer replayed, `queued`) waits for what it read.
                if !matches!(value, Claim::Claimed(_)) {
                    self.durable(ticket).await?;
                }
                Ok(value)
            }
        }
    }

    async fn renew(&self, key: &DeliveryKey, token: Token) -> Result<bool, StoreError> {
        let lease = self.lifetimes.of(&key.route).lease;
        self.owned(key, token, |e, now| {
            let until = later(now, lease);
            e.owner = Some((token, until));
            // The record lives at least as long as the claim (renew.lua).
            e.expires_at = e.expires_at.max(until);
        })
        .await
    }

    async fn complete(
        &self,
        key: &DeliveryKey,
        token: Token,
        response: &StoredResponse,
        settled: Option<&Settled>,
    ) -> Result<bool, StoreError> {
        let retention = self.lifetimes.of(&key.route).retention;
        self.owned(key, token, |e, now| {
            e.complete(response, now, later(now, retention));
            e.note(settled);
        })
        .await
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
        let retention = self.lifetimes.of(&key.route).retention;
        let now = unix_millis();
        let Updated { value, ticket } =
            self.update_indexed(key, now, Admit::Always, |slot, now| {
                if let Some(e) = slot {
                    if e.live_owner(now).is_some() || e.differs(fp) {
                        return false;
                    }
                    match e.status_at(now) {
                        Status::Completed => return true,
                        Status::Queued => return false,
                        Status::Processing | Status::Released => {}
                    }
                }
                let e =
                    slot.get_or_insert_with(|| Entry::fresh(Some(*fp), Status::Released, now, now));
                e.fp = Some(*fp);
                e.complete(response, now, later(now, retention));
                e.note(settled);
                true
            })?;
        // A completion found, not made: another call's, whose write may still be on
        // its way; "held" is true only once the journal has written up to now.
        let ticket = match (ticket, self.inner.journal()) {
            (None, Some(j)) if value => Some(j.latest()),
            _ => ticket,
        };
        self.durable(ticket).await?;
        Ok(value)
    }

    /// One lock section with the log's fields: no copy can claim in between (nor
    /// between a failed replay and its way back to `completed`).
    async fn release(
        &self,
        key: &DeliveryKey,
        token: Token,
        settled: Option<&Settled>,
    ) -> Result<bool, StoreError> {
        self.owned(key, token, |e, now| {
            e.give_up(settled.is_some_and(|s| s.restore_completed), now);
            e.note(settled);
        })
        .await
    }

    /// Memory answers, and the journal, if any, writes (a failed or stalled writer
    /// fails `/readyz` and feeds the breaker).
    async fn ping(&self) -> Result<(), StoreError> {
        self.inner.read(&DeliveryKey::new("", ""), |_| ())?;
        match self.inner.journal() {
            Some(j) => j.health(),
            None => Ok(()),
        }
    }

    fn bound_stats(&self) -> Option<BoundStats> {
        Some(MemoryStore::bound_stats(self))
    }

    /// With a journal (the `file:` store), a completion counts once it is written: a
    /// 2xx is not passed on for one the disk refused.
    fn confirms_completions(&self) -> bool {
        self.inner.journal().is_some()
    }

    fn broken(&self) -> Option<String> {
        self.broken_journal()
    }

    fn lifetimes(&self) -> &RouteLifetimes {
        &self.lifetimes
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
    pub(crate) async fn mark_queued(
        &self,
        key: &DeliveryKey,
        token: Token,
        keep_for: Duration,
    ) -> Result<bool, StoreError> {
        let keep = self.lifetimes.of(&key.route).retention.max(keep_for);
        self.owned(key, token, |e, now| {
            e.status = Status::Queued;
            e.owner = None;
            e.last_seen = now;
            e.expires_at = later(now, keep);
        })
        .await
    }

    /// Claims a queued key for one delivery attempt (fenced like a provider's claim).
    pub(crate) async fn lock_for_delivery(
        &self,
        key: &DeliveryKey,
        keep_for: Duration,
    ) -> Result<DeliveryLock, StoreError> {
        let Lifetimes { lease, retention } = self.lifetimes.of(&key.route);
        let keep = retention.max(keep_for);
        self.change(key, Admit::Always, |slot, now| {
            // An expired record comes back without a fingerprint, as deliver_lock.lua
            // re-creates the hash: copies are acknowledged, not refused.
            let entry = slot.get_or_insert_with(|| Entry::fresh(None, Status::Queued, now, now));
            if entry.status_at(now) == Status::Completed {
                return DeliveryLock::Completed;
            }
            if entry.live_owner(now).is_some() {
                return DeliveryLock::Busy;
            }
            let token = Token::random();
            entry.status = Status::Queued;
            entry.owner = Some((token, later(now, lease)));
            entry.last_seen = now;
            entry.expires_at = later(now, keep);
            DeliveryLock::Claimed(token)
        })
        .await
    }

    /// Records a queued delivery's completion; the record lives the longer of retention
    /// and `keep_for`, as long as another entry of the key may still be attempted.
    pub(crate) async fn complete_queued(
        &self,
        key: &DeliveryKey,
        token: Token,
        response: &StoredResponse,
        keep_for: Duration,
    ) -> Result<bool, StoreError> {
        let keep = self.lifetimes.of(&key.route).retention.max(keep_for);
        self.owned(key, token, |e, now| {
            e.complete(response, now, later(now, keep))
        })
        .await
    }

    /// Gives a failed attempt's claim up; the key stays `queued` for the next attempt.
    pub(crate) async fn unlock(&self, key: &DeliveryKey, token: Token) -> Result<bool, StoreError> {
        self.owned(key, token, |e, _| e.owner = None).await
    }
}

/// The journal seam, the bound, eviction.
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_shares;
