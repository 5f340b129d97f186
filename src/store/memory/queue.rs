//! The async queue in process, beside the in-memory store: for a single replica and
//! local use. On the memory store an acknowledged delivery still in the queue is lost
//! when the process stops (docs/async.md says so); on the `file:` store every entry,
//! dead letter and attempt count is journaled and awaited before the method answers,
//! so it survives a restart (who holds an entry does not: all are free again).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::DeliveryLock;
use super::journal::{Change, Journal, Ticket};
use crate::store::queue::{
    DeadLetter, DeadLetterPage, Lock, QueueBackend, QueueEntry, QueueStats, Read, StoreFuture,
};
use crate::store::{
    DeliveryKey, MemoryStore, Store, StoreError, StoredResponse, Token, unix_millis,
};

/// A stream-like ID: (Unix ms, sequence), shown as `ms-seq`.
pub(super) type Id = (u64, u64);

fn show(id: Id) -> String {
    format!("{}-{}", id.0, id.1)
}

pub(super) fn parse(id: &str) -> Option<Id> {
    let (a, b) = id.split_once('-')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

struct Slot {
    entry: QueueEntry,
    /// The consumer holding it and when it last refreshed its hold.
    holder: Option<(String, Instant)>,
}

#[derive(Default)]
pub(super) struct RouteQueue {
    entries: BTreeMap<Id, Slot>,
    dead: BTreeMap<Id, DeadLetter>,
    /// Per order value, its entries' IDs, oldest first.
    pub(super) orders: HashMap<String, VecDeque<Id>>,
    pub(super) pace: super::pacing::Pace,
}

impl RouteQueue {
    pub(super) fn holds(&self, id: Id) -> bool {
        self.entries.contains_key(&id)
    }

    fn order_push(&mut self, order: Option<&str>, id: Id) {
        if let Some(o) = order {
            self.orders.entry(o.to_string()).or_default().push_back(id);
        }
    }

    fn order_remove(&mut self, order: Option<&str>, id: Id) {
        if let Some(o) = order
            && let Some(list) = self.orders.get_mut(o)
        {
            list.retain(|i| *i != id);
            if list.is_empty() {
                self.orders.remove(o);
            }
        }
    }
}

#[derive(Default)]
pub(super) struct State {
    pub(super) routes: HashMap<String, RouteQueue>,
    /// Per key, its entries' attempt counts (a redriven entry starts at 1; entries of
    /// one key taking turns never reset each other's).
    attempts: HashMap<DeliveryKey, Attempts>,
}

/// One key's attempt counts, per queue entry, as deliver_lock.lua keeps them.
#[derive(Default)]
pub(super) struct Attempts {
    /// The entry that took the key's lock last: a refund is its.
    last: Id,
    counts: HashMap<Id, u64>,
}

impl State {
    /// Forgets `id`'s count (the entry left the queue), and the key's once none is left.
    fn forget_attempts(&mut self, key: &DeliveryKey, id: Id, journal: &Journaled) {
        if let Some(a) = self.attempts.get_mut(key)
            && a.counts.remove(&id).is_some()
        {
            journal.note(Change::Attempts {
                key,
                id,
                count: None,
            });
            if a.counts.is_empty() {
                self.attempts.remove(key);
            }
        }
    }
}

/// The `file:` store's journal, when there is one; the tickets of the changes one
/// method made, to await before it answers.
#[derive(Default)]
pub(super) struct Journaled {
    journal: Option<Arc<dyn Journal>>,
}

impl Journaled {
    /// Records `change` (nothing on the memory store). Called under the queue's lock,
    /// so changes reach the journal in the order they were made.
    pub(super) fn note(&self, change: Change<'_>) -> Option<Ticket> {
        self.journal.as_ref().map(|j| j.record(change))
    }
}

/// See the module documentation.
pub struct MemoryQueue {
    store: MemoryStore,
    pub(super) journal: Journaled,
    state: Mutex<State>,
    jobs: Mutex<HashMap<String, super::jobs::MemJob>>,
    seq: AtomicU64,
}

impl MemoryQueue {
    pub fn new(store: MemoryStore) -> MemoryQueue {
        Self::with_journal(store, None)
    }

    /// The queue of a `file:` store: its changes go to the store's journal.
    pub(crate) fn with_journal(
        store: MemoryStore,
        journal: Option<Arc<dyn Journal>>,
    ) -> MemoryQueue {
        MemoryQueue {
            journal: Journaled { journal },
            store,
            state: Mutex::default(),
            jobs: Mutex::default(),
            seq: AtomicU64::new(0),
        }
    }

    fn next_id(&self) -> Id {
        (unix_millis(), self.seq.fetch_add(1, Ordering::Relaxed))
    }

    pub(super) fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> Result<T, StoreError> {
        let mut s = self
            .state
            .lock()
            .map_err(|_| StoreError::Unavailable("memory queue lock poisoned".into()))?;
        Ok(f(&mut s))
    }

    pub(super) fn with_jobs<T>(
        &self,
        f: impl FnOnce(&mut HashMap<String, super::jobs::MemJob>) -> T,
    ) -> Result<T, StoreError> {
        let mut j = self
            .jobs
            .lock()
            .map_err(|_| StoreError::Unavailable("memory jobs lock poisoned".into()))?;
        Ok(f(&mut j))
    }

    pub(super) fn ready<T: Send + 'static>(v: Result<T, StoreError>) -> StoreFuture<'static, T> {
        Box::pin(std::future::ready(v))
    }

    /// `with`, then answers once every change `f` journaled is durable (at once on the
    /// memory store): an acknowledged delivery's entry is on disk before the 202.
    pub(super) fn durably<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut State, &Journaled) -> (T, Option<Ticket>),
    ) -> StoreFuture<'_, T> {
        match self.with(|s| f(s, &self.journal)) {
            Ok((v, Some(t))) => self.after(t, v),
            Ok((v, None)) => Self::ready(Ok(v)),
            Err(e) => Self::ready(Err(e)),
        }
    }

    /// Answers `v` once ticket `t` is durable.
    pub(super) fn after<T: Send + 'static>(&self, t: Ticket, v: T) -> StoreFuture<'_, T> {
        match &self.journal.journal {
            Some(j) => {
                let durable = j.durable(t);
                Box::pin(async move {
                    durable.await?;
                    Ok(v)
                })
            }
            None => Self::ready(Ok(v)),
        }
    }

    /// Puts back an entry read from the `file:` store at start.
    pub(crate) fn restore_queued(&self, route: &str, id: Id, entry: QueueEntry) {
        self.bump_seq(id);
        let _ = self.with(|s| {
            let q = s.routes.entry(route.to_string()).or_default();
            q.order_push(entry.order.as_deref(), id);
            q.entries.insert(
                id,
                Slot {
                    entry,
                    holder: None,
                },
            );
        });
    }

    /// Puts back a dead letter read from the `file:` store at start.
    pub(crate) fn restore_dead(&self, route: &str, id: Id, dead: DeadLetter) {
        self.bump_seq(id);
        let _ = self.with(|s| {
            s.routes
                .entry(route.to_string())
                .or_default()
                .dead
                .insert(id, dead);
        });
    }

    /// Puts back an attempt count read from the `file:` store at start.
    pub(crate) fn restore_attempts(&self, key: DeliveryKey, id: Id, count: u64) {
        let _ = self.with(|s| {
            s.attempts.entry(key).or_default().counts.insert(id, count);
        });
    }

    /// New IDs sort after every restored one, whatever the clock did meanwhile.
    fn bump_seq(&self, id: Id) {
        self.seq.fetch_max(id.1 + 1, Ordering::Relaxed);
    }
}

impl QueueBackend for MemoryQueue {
    fn enqueue<'a>(
        &'a self,
        route: &'a str,
        entry: &'a QueueEntry,
        max_queue: u64,
    ) -> StoreFuture<'a, Option<String>> {
        let id = self.next_id();
        self.durably(|s, j| {
            let q = s.routes.entry(route.to_string()).or_default();
            if q.entries.len() as u64 >= max_queue {
                return (None, None);
            }
            q.entries.insert(
                id,
                Slot {
                    entry: entry.clone(),
                    holder: None,
                },
            );
            q.order_push(entry.order.as_deref(), id);
            let t = j.note(Change::Queued {
                route,
                id,
                entry: Some(entry),
            });
            (Some(show(id)), t)
        })
    }

    fn mark_queued<'a>(
        &'a self,
        key: &'a DeliveryKey,
        token: Token,
        keep_for: Duration,
    ) -> StoreFuture<'a, bool> {
        // A new entry has no count yet: nothing to reset.
        Box::pin(self.store.mark_queued(key, token, keep_for))
    }

    fn release<'a>(&'a self, key: &'a DeliveryKey, token: Token) -> StoreFuture<'a, bool> {
        Box::pin(self.store.release(key, token, None))
    }

    fn ensure_group<'a>(&'a self, _route: &'a str) -> StoreFuture<'a, ()> {
        Self::ready(Ok(()))
    }

    fn read_new<'a>(
        &'a self,
        route: &'a str,
        consumer: &'a str,
        count: usize,
    ) -> StoreFuture<'a, Vec<Read>> {
        Self::ready(self.with(|s| {
            let Some(q) = s.routes.get_mut(route) else {
                return Vec::new();
            };
            q.entries
                .iter_mut()
                .filter(|(_, slot)| slot.holder.is_none())
                .take(count)
                .map(|(id, slot)| {
                    slot.holder = Some((consumer.to_string(), Instant::now()));
                    (show(*id), Some(slot.entry.clone()))
                })
                .collect()
        }))
    }

    fn take_over<'a>(
        &'a self,
        route: &'a str,
        consumer: &'a str,
        min_idle: Duration,
        count: usize,
    ) -> StoreFuture<'a, Vec<Read>> {
        Self::ready(self.with(|s| {
            let Some(q) = s.routes.get_mut(route) else {
                return Vec::new();
            };
            let now = Instant::now();
            q.entries
                .iter_mut()
                .filter(|(_, slot)| {
                    slot.holder
                        .as_ref()
                        .is_some_and(|(_, t)| now.duration_since(*t) >= min_idle)
                })
                .take(count)
                .map(|(id, slot)| {
                    slot.holder = Some((consumer.to_string(), now));
                    (show(*id), Some(slot.entry.clone()))
                })
                .collect()
        }))
    }

    fn keep<'a>(
        &'a self,
        route: &'a str,
        consumer: &'a str,
        ids: &'a [String],
    ) -> StoreFuture<'a, ()> {
        Self::ready(self.with(|s| {
            if let Some(q) = s.routes.get_mut(route) {
                let now = Instant::now();
                for id in ids.iter().filter_map(|i| parse(i)) {
                    // Only entries it still holds: not one another consumer took over.
                    if let Some(slot) = q.entries.get_mut(&id)
                        && let Some((holder, at)) = &mut slot.holder
                        && holder == consumer
                    {
                        *at = now;
                    }
                }
            }
        }))
    }

    fn lock<'a>(
        &'a self,
        key: &'a DeliveryKey,
        id: &'a str,
        keep_for: Duration,
    ) -> StoreFuture<'a, Lock> {
        let entry_id = parse(id).unwrap_or_default();
        Box::pin(async move {
            match self.store.lock_for_delivery(key, keep_for).await? {
                DeliveryLock::Completed => Ok(Lock::Completed),
                DeliveryLock::Busy => Ok(Lock::Busy),
                DeliveryLock::Claimed(token) => {
                    self.durably(|s, j| {
                        let a = s.attempts.entry(key.clone()).or_default();
                        a.last = entry_id;
                        let n = a.counts.entry(entry_id).or_default();
                        *n += 1;
                        let t = j.note(Change::Attempts {
                            key,
                            id: entry_id,
                            count: Some(*n),
                        });
                        (Lock::Claimed { token, attempt: *n }, t)
                    })
                    .await
                }
            }
        })
    }

    fn renew<'a>(&'a self, key: &'a DeliveryKey, token: Token) -> StoreFuture<'a, bool> {
        Box::pin(self.store.renew(key, token))
    }

    fn unlock<'a>(
        &'a self,
        key: &'a DeliveryKey,
        token: Token,
        refund: bool,
    ) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let r = self.store.unlock(key, token).await;
            if refund && matches!(r, Ok(true)) {
                self.durably(|s, j| {
                    let mut t = None;
                    if let Some(a) = s.attempts.get_mut(key)
                        && let Some(n) = a.counts.get_mut(&a.last)
                    {
                        *n = n.saturating_sub(1);
                        t = j.note(Change::Attempts {
                            key,
                            id: a.last,
                            count: Some(*n),
                        });
                    }
                    ((), t)
                })
                .await?;
            }
            r
        })
    }

    fn complete<'a>(
        &'a self,
        key: &'a DeliveryKey,
        token: Token,
        response: &'a StoredResponse,
        keep_for: Duration,
    ) -> StoreFuture<'a, bool> {
        // The store's completion is journaled after these and awaited: that awaits them.
        let _ = self.with(|s| {
            let counts = s.attempts.remove(key).map(|a| a.counts).unwrap_or_default();
            for id in counts.into_keys() {
                self.journal.note(Change::Attempts {
                    key,
                    id,
                    count: None,
                });
            }
        });
        Box::pin(self.store.complete_queued(key, token, response, keep_for))
    }

    fn done<'a>(
        &'a self,
        route: &'a str,
        id: &'a str,
        order: Option<&'a str>,
    ) -> StoreFuture<'a, ()> {
        self.durably(|s, j| {
            let mut t = None;
            if let (Some(q), Some(id)) = (s.routes.get_mut(route), parse(id)) {
                let gone = q.entries.remove(&id);
                q.order_remove(order, id);
                if let Some(slot) = gone {
                    t = j.note(Change::Queued {
                        route,
                        id,
                        entry: None,
                    });
                    s.forget_attempts(&DeliveryKey::new(route, slot.entry.key), id, j);
                }
            }
            ((), t)
        })
    }

    fn dead_letter<'a>(
        &'a self,
        route: &'a str,
        id: &'a str,
        entry: &'a QueueEntry,
        attempts: u64,
        last_error: &'a str,
    ) -> StoreFuture<'a, ()> {
        let dead_id = self.next_id();
        self.durably(|s, j| {
            let q = s.routes.entry(route.to_string()).or_default();
            if let Some(id) = parse(id) {
                if q.entries.remove(&id).is_some() {
                    j.note(Change::Queued {
                        route,
                        id,
                        entry: None,
                    });
                }
                q.order_remove(entry.order.as_deref(), id);
                s.forget_attempts(&DeliveryKey::new(route, entry.key.clone()), id, j);
            }
            let q = s.routes.entry(route.to_string()).or_default();
            let dead = DeadLetter {
                id: show(dead_id),
                entry: entry.clone(),
                attempts,
                last_error: last_error.to_string(),
                dead_at: unix_millis(),
            };
            let t = j.note(Change::Dead {
                route,
                id: dead_id,
                dead: Some(&dead),
            });
            q.dead.insert(dead_id, dead);
            ((), t)
        })
    }

    fn stats<'a>(&'a self, route: &'a str) -> StoreFuture<'a, QueueStats> {
        Self::ready(self.with(|s| match s.routes.get(route) {
            None => QueueStats::default(),
            Some(q) => QueueStats {
                depth: q.entries.len() as u64,
                pending: q.entries.values().filter(|s| s.holder.is_some()).count() as u64,
                oldest_ms: q.entries.keys().next().map(|id| id.0),
                dead_letters: q.dead.len() as u64,
            },
        }))
    }

    fn list_dead_letters<'a>(
        &'a self,
        route: &'a str,
        count: usize,
        cursor: Option<&'a str>,
    ) -> StoreFuture<'a, DeadLetterPage> {
        let count = count.max(1);
        Self::ready(self.with(|s| {
            let Some(q) = s.routes.get(route) else {
                return DeadLetterPage::default();
            };
            let after = cursor.and_then(parse);
            let items: Vec<DeadLetter> = q
                .dead
                .iter()
                .filter(|(id, _)| after.is_none_or(|a| **id > a))
                .take(count)
                .map(|(_, d)| d.clone())
                .collect();
            let next = (items.len() >= count)
                .then(|| items.last().map(|d| d.id.clone()))
                .flatten();
            DeadLetterPage { items, next }
        }))
    }

    fn redrive<'a>(&'a self, route: &'a str, dead_letter_id: &'a str) -> StoreFuture<'a, bool> {
        // Like the Redis script: a new entry (its attempts start again at 1) received
        // now, so `max_age` counts from the redrive.
        let new_id = self.next_id();
        self.durably(|s, j| {
            let Some(q) = s.routes.get_mut(route) else {
                return (false, None);
            };
            let Some((dead_id, dead)) =
                parse(dead_letter_id).and_then(|id| Some((id, q.dead.remove(&id)?)))
            else {
                return (false, None);
            };
            j.note(Change::Dead {
                route,
                id: dead_id,
                dead: None,
            });
            let entry = QueueEntry {
                received_at: unix_millis(),
                ..dead.entry
            };
            let t = j.note(Change::Queued {
                route,
                id: new_id,
                entry: Some(&entry),
            });
            q.order_push(entry.order.as_deref(), new_id);
            q.entries.insert(
                new_id,
                Slot {
                    entry,
                    holder: None,
                },
            );
            (true, t)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Lifetimes;
    use bytes::Bytes;

    fn queue() -> MemoryQueue {
        MemoryQueue::new(MemoryStore::new(Lifetimes {
            lease: Duration::from_secs(30),
            retention: Duration::from_secs(3600),
        }))
    }

    fn entry(key: &str) -> QueueEntry {
        QueueEntry {
            key: key.into(),
            method: "POST".into(),
            path: "/wh".into(),
            headers: Bytes::new(),
            body: Bytes::from_static(b"{}"),
            received_at: unix_millis(),
            order: None,
        }
    }

    #[tokio::test]
    async fn the_bound_takeover_dead_letters_and_redrive() {
        let q = queue();
        assert!(q.enqueue("wh", &entry("a"), 2).await.unwrap().is_some());
        assert!(q.enqueue("wh", &entry("b"), 2).await.unwrap().is_some());
        assert_eq!(q.enqueue("wh", &entry("c"), 2).await.unwrap(), None);

        let read = q.read_new("wh", "c1", 10).await.unwrap();
        assert_eq!(read.len(), 2);
        assert!(q.read_new("wh", "c2", 10).await.unwrap().is_empty());
        // c1 keeps its entries fresh: nothing moves; once idle, c2 takes them over.
        let ids: Vec<String> = read.iter().map(|(id, _)| id.clone()).collect();
        q.keep("wh", "c1", &ids).await.unwrap();
        let idle = Duration::from_millis(50);
        assert!(q.take_over("wh", "c2", idle, 10).await.unwrap().is_empty());
        tokio::time::sleep(idle).await;
        assert_eq!(q.take_over("wh", "c2", idle, 10).await.unwrap().len(), 2);

        let (id_a, a) = (&read[0].0, read[0].1.clone().unwrap());
        q.dead_letter("wh", id_a, &a, 3, "upstream answered 500")
            .await
            .unwrap();
        q.done("wh", &read[1].0, None).await.unwrap();
        let s = q.stats("wh").await.unwrap();
        assert_eq!((s.depth, s.dead_letters), (0, 1));

        let page = q.list_dead_letters("wh", 1, None).await.unwrap();
        assert_eq!(page.items.len(), 1);
        assert_eq!(page.items[0].entry, a);
        assert_eq!(page.items[0].attempts, 3);
        let after = q
            .list_dead_letters("wh", 1, page.next.as_deref())
            .await
            .unwrap();
        assert!(after.items.is_empty());

        assert!(q.redrive("wh", &page.items[0].id).await.unwrap());
        assert!(!q.redrive("wh", &page.items[0].id).await.unwrap());
        let s = q.stats("wh").await.unwrap();
        assert_eq!((s.depth, s.dead_letters), (1, 0));
        let again = q.read_new("wh", "c1", 10).await.unwrap()[0].1.clone();
        // Redriven as received now: `max_age` counts from the redrive.
        assert!(
            again
                .as_ref()
                .is_some_and(|e| e.received_at >= a.received_at)
        );
        let a = QueueEntry {
            received_at: again.as_ref().map_or(0, |e| e.received_at),
            ..a
        };
        assert_eq!(again, Some(a));
    }
}
