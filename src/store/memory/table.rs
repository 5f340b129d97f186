//! The memory store's entries: sharded, so no lock covers the whole map; each entry one
//! exact-size record (key + encoded entry, `codec`); bounded by bytes, the oldest
//! settled deliveries forgotten first; swept of expired entries a batch at a time.
//!
//! Each shard keeps one *mark* (hash, expiry) per entry, in the order the entries
//! arrived: the front is the oldest. Eviction and the sweeper look at the front: a
//! mark whose entry is gone is dropped; one whose entry's expiry moved later by more
//! than the lease (a re-claim, a long-kept queued delivery) goes to the back; a
//! delivery being processed or queued goes to the back too (never evicted). So a
//! completion within its lease costs no second mark.

use std::collections::VecDeque;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use hashbrown::HashTable;

use super::codec;
use super::journal::{Change, Journal, Ticket};
use super::shares::Shares;
use crate::store::{DeliveryKey, StoreError};

/// Shards of the map: enough that 2 × cores of concurrent deliveries seldom meet.
const SHARDS: usize = 64;
/// Marks one eviction looks at, at most, under a shard's lock.
const EVICT_LOOK: usize = 256;
/// Marks the sweeper handles per lock hold.
const SWEEP_BATCH: usize = 512;
/// Marks looked at in each other shard when a new delivery's own shard has nothing
/// settled left (a small bound, or large entries, spread over few shards).
const OTHER_LOOK: usize = 32;
/// Bytes one entry costs beyond its record: its table slot and control byte, its mark,
/// and the allocator's header.
pub(super) const ENTRY_OVERHEAD: u64 = 48;

/// One entry's place in its shard's age order.
#[derive(Clone, Copy)]
struct Mark {
    hash: u64,
    /// The entry's expiry when the mark was made: a different one now means stale.
    expires: u64,
}

#[derive(Default)]
struct Shard {
    records: HashTable<Box<[u8]>>,
    marks: VecDeque<Mark>,
    /// Where `sweep_behind` looks next in `marks`.
    behind_at: usize,
}

/// Whether a new entry may push older ones out or be refused when the bound is reached.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Admit {
    /// A new delivery: evict settled ones for it, or refuse it (`StoreError::Full`).
    NewDelivery,
    /// A change the caller was promised (a completion, the queue's record): evict
    /// what can be evicted, never refuse.
    Always,
}

/// What an update did, for the caller to wait on the journal.
pub(super) struct Updated<T> {
    pub value: T,
    pub ticket: Option<Ticket>,
}

/// The store's entries; see the module documentation.
pub(super) struct Table {
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
    /// Bytes the entries cost (records + `ENTRY_OVERHEAD` each).
    used: AtomicU64,
    /// The same per route: eviction keeps to each route's share (`shares`).
    shares: Shares,
    max: u64,
    evictions: AtomicU64,
    /// How much later than its mark an entry's expiry may be and the mark still
    /// stand for it (the lease: a claim's completion moves it by about that).
    drift: u64,
    /// Where the next search of other shards for room starts (spreads them).
    next_victim: AtomicU64,
    journal: Option<Arc<dyn Journal>>,
}

fn cost(record: &[u8]) -> u64 {
    record.len() as u64 + ENTRY_OVERHEAD
}

fn entry_part(record: &[u8]) -> &[u8] {
    codec::split_record(record).map_or(&[][..], |(_, _, e)| e)
}

fn head_of(record: &[u8]) -> Option<codec::Head> {
    codec::head(entry_part(record)).ok()
}

fn corrupt(e: String) -> StoreError {
    StoreError::Unavailable(format!("memory store entry unreadable: {e}"))
}

impl Table {
    pub(super) fn new(max: u64, drift: u64, journal: Option<Arc<dyn Journal>>) -> Table {
        Table {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            hasher: RandomState::new(),
            used: AtomicU64::new(0),
            shares: Shares::default(),
            max,
            evictions: AtomicU64::new(0),
            drift,
            next_victim: AtomicU64::new(0),
            journal,
        }
    }

    fn hash(&self, route: &[u8], key: &[u8]) -> u64 {
        self.hasher.hash_one((route, key))
    }

    fn hash_record(&self, record: &[u8]) -> u64 {
        match codec::split_record(record) {
            Ok((route, key, _)) => self.hash(route, key),
            Err(_) => 0,
        }
    }

    /// The shard of a hash, from mixed bits: the table's own bucket and tag bits
    /// stay spread within each shard.
    fn shard(&self, hash: u64) -> Result<MutexGuard<'_, Shard>, StoreError> {
        self.shards[shard_of(hash)]
            .lock()
            .map_err(|_| StoreError::Unavailable("memory store lock poisoned".into()))
    }

    fn record(&self, route: &[u8], key: &[u8], entry: Option<&[u8]>) -> Option<Ticket> {
        let journal = self.journal.as_ref()?;
        let key = DeliveryKey::new(
            String::from_utf8_lossy(route).as_ref(),
            String::from_utf8_lossy(key).into_owned(),
        );
        Some(journal.record(Change::Entry { key: &key, entry }))
    }

    pub(super) fn journal(&self) -> Option<&dyn Journal> {
        self.journal.as_deref()
    }

    /// Whether `record` is the entry mark `m` was made for: the same hash (the table
    /// compares only a few of its bits) and an expiry not before the mark's.
    fn marked(&self, record: &[u8], m: Mark) -> bool {
        head_of(record).is_some_and(|h| h.expires_at >= m.expires)
            && self.hash_record(record) == m.hash
    }

    /// Counts a record in the bound, and in its route's share.
    fn charge(&self, record: &[u8]) {
        self.used.fetch_add(cost(record), Ordering::Relaxed);
        self.shares.add(route_part(record), cost(record));
    }

    /// Counts a record out of the bound, and of its route's share.
    fn credit(&self, record: &[u8]) {
        self.used.fetch_sub(cost(record), Ordering::Relaxed);
        self.shares.sub(route_part(record), cost(record));
    }

    /// Bytes the entries cost now, and the bound.
    pub(super) fn used(&self) -> (u64, u64) {
        (self.used.load(Ordering::Relaxed), self.max)
    }

    /// Deliveries forgotten to keep the bound, since start.
    pub(super) fn evictions(&self) -> u64 {
        self.evictions.load(Ordering::Relaxed)
    }

    /// Reads `key`'s entry (live or not) without changing it.
    pub(super) fn read<T>(
        &self,
        key: &DeliveryKey,
        f: impl FnOnce(Option<super::Entry>) -> T,
    ) -> Result<T, StoreError> {
        let (route, k) = (key.route.as_bytes(), key.key.as_bytes());
        let hash = self.hash(route, k);
        let shard = self.shard(hash)?;
        let entry = shard
            .records
            .find(hash, |r| matches_key(r, route, k))
            .map(|r| codec::decode(entry_part(r)))
            .transpose()
            .map_err(corrupt)?;
        Ok(f(entry))
    }

    /// Changes `key`'s entry under its shard's lock: `f` sees the entry if it is
    /// live (an expired one as `None`) and leaves it as it should be (`None`:
    /// forgotten). A real change is written back as a new exact-size record, gets a
    /// mark when its expiry moved, and is told to the journal under the same lock.
    pub(super) fn update<T>(
        &self,
        key: &DeliveryKey,
        now: u64,
        admit: Admit,
        f: impl FnOnce(&mut Option<super::Entry>) -> T,
    ) -> Result<Updated<T>, StoreError> {
        let (route, k) = (key.route.as_bytes(), key.key.as_bytes());
        let hash = self.hash(route, k);
        let mut guard = self.shard(hash)?;
        let shard = &mut *guard;
        let mut ticket = None;
        // The live entry's expiry before `f` (None: no live entry).
        let mut before: Option<u64> = None;
        let mut entry = None;
        if let Ok(found) = shard.records.find_entry(hash, |r| matches_key(r, route, k)) {
            let e = codec::decode(entry_part(found.get())).map_err(corrupt)?;
            if e.live(now) {
                before = Some(e.expires_at);
                entry = Some(e);
            } else {
                let (old, _) = found.remove();
                self.credit(&old);
                ticket = self.record(route, k, None);
            }
        }
        let value = f(&mut entry);
        let found = shard.records.find_entry(hash, |r| matches_key(r, route, k));
        let Some(e) = entry else {
            if let Ok(found) = found {
                let (old, _) = found.remove();
                self.credit(&old);
                ticket = self.record(route, k, None);
            }
            return Ok(Updated { value, ticket });
        };
        let (record, at) = encoded(key, &e);
        if let Ok(mut found) = found {
            if entry_part(found.get()) == &record[at..] {
                return Ok(Updated { value, ticket });
            }
            ticket = self.record(route, k, Some(&record[at..]));
            self.charge(&record);
            let old = std::mem::replace(found.get_mut(), record);
            self.credit(&old);
            // A later expiry keeps the entry's mark (`front` moves it when due).
            if before.is_some_and(|b| e.expires_at < b) {
                shard.marks.push_back(Mark {
                    hash,
                    expires: e.expires_at,
                });
            }
            self.make_room(shard, (hash, route), now, 0);
            return Ok(Updated { value, ticket });
        }
        if !self.make_room(shard, (hash, route), now, cost(&record)) && admit == Admit::NewDelivery
        {
            return Err(StoreError::Full);
        }
        ticket = self.record(route, k, Some(&record[at..]));
        self.insert_new(shard, hash, record, e.expires_at);
        Ok(Updated { value, ticket })
    }

    /// Loads one entry at start (`MemoryStore::restore_entry`): no journal, no refusal.
    pub(super) fn restore(
        &self,
        key: &DeliveryKey,
        e: &super::Entry,
        now: u64,
    ) -> Result<(), StoreError> {
        let (route, k) = (key.route.as_bytes(), key.key.as_bytes());
        let hash = self.hash(route, k);
        let mut guard = self.shard(hash)?;
        let shard = &mut *guard;
        if let Ok(found) = shard.records.find_entry(hash, |r| matches_key(r, route, k)) {
            let (old, _) = found.remove();
            self.credit(&old);
        }
        let (record, _) = encoded(key, e);
        self.make_room(shard, (hash, route), now, cost(&record));
        self.insert_new(shard, hash, record, e.expires_at);
        Ok(())
    }

    /// Adds a record the shard does not hold, counted against the bound, with its mark.
    fn insert_new(&self, shard: &mut Shard, hash: u64, record: Box<[u8]>, expires: u64) {
        self.charge(&record);
        shard
            .records
            .insert_unique(hash, record, |r| self.hash_record(r));
        shard.marks.push_back(Mark { hash, expires });
    }

    /// Evicts the oldest settled entries of `keep`'s shard (held by the caller) until
    /// `need` more bytes fit under the bound; when that shard has none left, of the
    /// other shards whose lock is free (never waiting for one: no lock order to keep).
    /// `keep` is the entry being written: its hash and route, whose share decides
    /// which entries may go (`Shares::may_evict`). False when they still do not fit.
    fn make_room(&self, shard: &mut Shard, keep: (u64, &[u8]), now: u64, need: u64) -> bool {
        if self.evict(shard, keep, now, need, EVICT_LOOK) {
            return true;
        }
        // The other shards, their oldest first (by the expiry of each one's front
        // mark), so a small store with few entries per shard still forgets its oldest.
        let own = shard_of(keep.0);
        let start = self.next_victim.fetch_add(1, Ordering::Relaxed) as usize;
        let mut others: Vec<(u64, usize)> = (0..SHARDS)
            .map(|n| (start + n) % SHARDS)
            .filter(|j| *j != own)
            .filter_map(|j| {
                let mut other = self.shards[j].try_lock().ok()?;
                let (m, _) = self.front(&mut other, &mut 0, OTHER_LOOK)?;
                Some((m.expires, j))
            })
            .collect();
        others.sort_unstable();
        for (_, j) in others {
            if let Ok(mut other) = self.shards[j].try_lock()
                && self.evict(&mut other, keep, now, need, OTHER_LOOK)
            {
                return true;
            }
        }
        false
    }

    /// Evicts `shard`'s oldest settled entries until `need` more bytes fit under the
    /// bound (looking at `limit` marks at most), of `keep`'s route or a route over its
    /// share. False when they do not.
    fn evict(
        &self,
        shard: &mut Shard,
        keep: (u64, &[u8]),
        now: u64,
        need: u64,
        limit: usize,
    ) -> bool {
        let mut looked = 0;
        while self.used.load(Ordering::Relaxed) + need > self.max {
            let Some((m, h)) = self.front(shard, &mut looked, limit) else {
                return false;
            };
            shard.marks.pop_front();
            if h.protected(now) || (m.hash == keep.0 && h.live(now)) {
                shard.marks.push_back(m);
                continue;
            }
            let Ok(found) = shard.records.find_entry(m.hash, |r| self.marked(r, m)) else {
                continue;
            };
            if h.live(now)
                && !self
                    .shares
                    .may_evict(route_part(found.get()), keep.1, self.max)
            {
                shard.marks.push_back(m);
                continue;
            }
            let (old, _) = found.remove();
            self.credit(&old);
            if h.live(now) {
                self.evictions.fetch_add(1, Ordering::Relaxed);
            }
            if let Ok((route, key, _)) = codec::split_record(&old) {
                self.record(route, key, None);
            }
        }
        true
    }

    /// The shard's front mark that still stands for its entry, and that entry's head,
    /// left at the front. On the way (counted in `looked`, up to `limit`), a mark
    /// whose entry is gone is dropped, and one whose entry's expiry moved more than
    /// `drift` later (a re-claim, a queued delivery kept longer) goes to the back
    /// with the new expiry: an entry gets a new mark only when it needs one.
    fn front(
        &self,
        shard: &mut Shard,
        looked: &mut usize,
        limit: usize,
    ) -> Option<(Mark, codec::Head)> {
        while *looked < limit {
            *looked += 1;
            let m = *shard.marks.front()?;
            let head = shard
                .records
                .find(m.hash, |r| self.marked(r, m))
                .and_then(|r| head_of(r));
            shard.marks.pop_front();
            match head {
                None => {}
                Some(h) if h.expires_at > m.expires.saturating_add(self.drift) => {
                    shard.marks.push_back(Mark {
                        hash: m.hash,
                        expires: h.expires_at,
                    });
                }
                Some(h) => {
                    shard.marks.push_front(m);
                    return Some((m, h));
                }
            }
        }
        None
    }

    /// Drops the expired entries at the front of shard `i` (a batch per lock hold)
    /// and returns how many marks it looked at. A live mark stops it, unless its
    /// expiry lies beyond `now + retention` (a queued delivery kept longer): that one
    /// goes to the back so it does not hold the others.
    pub(super) fn sweep_batch(&self, i: usize, now: u64, retention: u64) -> (usize, bool) {
        let Ok(mut guard) = self.shards[i].lock() else {
            return (0, false);
        };
        let shard = &mut *guard;
        let mut looked = 0;
        while let Some((m, h)) = self.front(shard, &mut looked, SWEEP_BATCH) {
            if !h.live(now) {
                shard.marks.pop_front();
                if let Ok(found) = shard.records.find_entry(m.hash, |r| self.marked(r, m)) {
                    let (old, _) = found.remove();
                    self.credit(&old);
                    if let Ok((route, key, _)) = codec::split_record(&old) {
                        self.record(route, key, None);
                    }
                }
            } else if m.expires > now.saturating_add(retention) || h.protected(now) {
                shard.marks.pop_front();
                shard.marks.push_back(m);
            } else {
                return (looked, false);
            }
        }
        (looked, looked >= SWEEP_BATCH)
    }

    /// Drops expired entries behind shard `i`'s front, where `sweep_batch` stops at
    /// the first live mark (a route of a shorter retention behind a longer one): the
    /// next `SWEEP_BATCH` marks from where the last call stopped, wrapping around. Only
    /// their records go; each mark, stale then, is dropped when it reaches the front.
    pub(super) fn sweep_behind(&self, i: usize, now: u64) {
        let Ok(mut guard) = self.shards[i].lock() else {
            return;
        };
        let shard = &mut *guard;
        let len = shard.marks.len();
        let start = if shard.behind_at < len {
            shard.behind_at
        } else {
            0
        };
        let end = len.min(start + SWEEP_BATCH);
        for j in start..end {
            let m = shard.marks[j];
            let expired = |r: &[u8]| self.marked(r, m) && head_of(r).is_some_and(|h| !h.live(now));
            if let Ok(found) = shard.records.find_entry(m.hash, |r| expired(r)) {
                let (old, _) = found.remove();
                self.used.fetch_sub(cost(&old), Ordering::Relaxed);
                if let Ok((route, key, _)) = codec::split_record(&old) {
                    self.record(route, key, None);
                }
            }
        }
        shard.behind_at = end;
    }

    pub(super) fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// Marks shard `i` holds (the sweeper's budget per round).
    pub(super) fn marks(&self, i: usize) -> usize {
        self.shards[i].lock().map(|s| s.marks.len()).unwrap_or(0)
    }

    /// The age of the oldest remembered entry's last settlement over all shards (its
    /// expiry less its route's retention, `retention_of` in ms); stale marks at a
    /// front are dropped on the way.
    pub(super) fn oldest_age(&self, now: u64, retention_of: impl Fn(&str) -> u64) -> Option<u64> {
        let mut oldest: Option<u64> = None;
        for shard in self.shards.iter() {
            let Ok(mut guard) = shard.lock() else {
                continue;
            };
            let shard = &mut *guard;
            let Some((m, _)) = self.front(shard, &mut 0, EVICT_LOOK) else {
                continue;
            };
            let route = shard
                .records
                .find(m.hash, |r| self.marked(r, m))
                .and_then(|r| codec::split_record(r).ok())
                .map(|(route, _, _)| String::from_utf8_lossy(route).into_owned());
            let settled = m
                .expires
                .saturating_sub(retention_of(route.as_deref().unwrap_or("")));
            let age = now.saturating_sub(settled);
            oldest = Some(oldest.map_or(age, |o| o.max(age)));
        }
        oldest
    }

    /// Number of entries held (expired ones not yet swept included).
    pub(super) fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().map(|s| s.records.len()).unwrap_or(0))
            .sum()
    }
}

fn shard_of(hash: u64) -> usize {
    (hash.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58) as usize % SHARDS
}

/// `key` and `e` as one record in an allocation of its exact size (encoded in a
/// reused buffer: no shrinking copy that would leave the heap fragmented), and where
/// the entry starts in it.
fn encoded(key: &DeliveryKey, e: &super::Entry) -> (Box<[u8]>, usize) {
    thread_local! {
        static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    SCRATCH.with_borrow_mut(|buf| {
        buf.clear();
        codec::encode_key(&key.route, &key.key, buf);
        let at = buf.len();
        codec::encode(e, buf);
        (Box::from(&buf[..]), at)
    })
}

fn route_part(record: &[u8]) -> &[u8] {
    codec::split_record(record).map_or(&[][..], |(route, _, _)| route)
}

fn matches_key(record: &[u8], route: &[u8], key: &[u8]) -> bool {
    codec::split_record(record).is_ok_and(|(r, k, _)| r == route && k == key)
}
