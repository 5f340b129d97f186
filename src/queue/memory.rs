//! The async queue in process, beside the in-memory store: for a single replica and
//! local use. Not durable: an acknowledged delivery still in the queue is lost when the
//! process stops (docs/async.md says so; use Redis for the guarantee).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::{
    DeadLetter, DeadLetterPage, Lock, QueueBackend, QueueEntry, QueueStats, Read, StoreFuture,
};
use crate::store::memory::DeliveryLock;
use crate::store::{
    DeliveryKey, MemoryStore, Store, StoreError, StoredResponse, Token, unix_millis,
};

/// A stream-like ID: (Unix ms, sequence), shown as `ms-seq`.
type Id = (u64, u64);

fn show(id: Id) -> String {
    format!("{}-{}", id.0, id.1)
}

fn parse(id: &str) -> Option<Id> {
    let (a, b) = id.split_once('-')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

struct Slot {
    entry: QueueEntry,
    /// The consumer holding it and when it last refreshed its hold.
    holder: Option<(String, Instant)>,
}

#[derive(Default)]
struct RouteQueue {
    entries: BTreeMap<Id, Slot>,
    dead: BTreeMap<Id, DeadLetter>,
}

#[derive(Default)]
struct State {
    routes: HashMap<String, RouteQueue>,
    attempts: HashMap<DeliveryKey, u64>,
}

/// See the module documentation.
pub struct MemoryQueue {
    store: MemoryStore,
    state: Mutex<State>,
    seq: AtomicU64,
}

impl MemoryQueue {
    pub fn new(store: MemoryStore) -> MemoryQueue {
        MemoryQueue {
            store,
            state: Mutex::default(),
            seq: AtomicU64::new(0),
        }
    }

    fn next_id(&self) -> Id {
        (unix_millis(), self.seq.fetch_add(1, Ordering::Relaxed))
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> Result<T, StoreError> {
        let mut s = self
            .state
            .lock()
            .map_err(|_| StoreError::Unavailable("memory queue lock poisoned".into()))?;
        Ok(f(&mut s))
    }

    fn ready<T: Send + 'static>(v: Result<T, StoreError>) -> StoreFuture<'static, T> {
        Box::pin(std::future::ready(v))
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
        Self::ready(self.with(|s| {
            let q = s.routes.entry(route.to_string()).or_default();
            if q.entries.len() as u64 >= max_queue {
                return None;
            }
            q.entries.insert(
                id,
                Slot {
                    entry: entry.clone(),
                    holder: None,
                },
            );
            Some(show(id))
        }))
    }

    fn mark_queued<'a>(&'a self, key: &'a DeliveryKey, token: Token) -> StoreFuture<'a, bool> {
        let r = self.store.mark_queued(key, token);
        if let Ok(true) = r {
            let _ = self.with(|s| s.attempts.remove(key));
        }
        Self::ready(r)
    }

    fn release<'a>(&'a self, key: &'a DeliveryKey, token: Token) -> StoreFuture<'a, bool> {
        Box::pin(self.store.release(key, token))
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
                    if let Some(slot) = q.entries.get_mut(&id) {
                        slot.holder = Some((consumer.to_string(), now));
                    }
                }
            }
        }))
    }

    fn lock<'a>(&'a self, key: &'a DeliveryKey) -> StoreFuture<'a, Lock> {
        let r = self.store.lock_for_delivery(key).and_then(|l| match l {
            DeliveryLock::Completed => Ok(Lock::Completed),
            DeliveryLock::Busy => Ok(Lock::Busy),
            DeliveryLock::Claimed(token) => self.with(|s| {
                let n = s.attempts.entry(key.clone()).or_insert(0);
                *n += 1;
                Lock::Claimed { token, attempt: *n }
            }),
        });
        Self::ready(r)
    }

    fn renew<'a>(&'a self, key: &'a DeliveryKey, token: Token) -> StoreFuture<'a, bool> {
        Box::pin(self.store.renew(key, token))
    }

    fn unlock<'a>(&'a self, key: &'a DeliveryKey, token: Token) -> StoreFuture<'a, bool> {
        Self::ready(self.store.unlock(key, token))
    }

    fn complete<'a>(
        &'a self,
        key: &'a DeliveryKey,
        token: Token,
        response: &'a StoredResponse,
    ) -> StoreFuture<'a, bool> {
        let _ = self.with(|s| s.attempts.remove(key));
        Box::pin(self.store.complete(key, token, response))
    }

    fn done<'a>(&'a self, route: &'a str, id: &'a str) -> StoreFuture<'a, ()> {
        Self::ready(self.with(|s| {
            if let (Some(q), Some(id)) = (s.routes.get_mut(route), parse(id)) {
                q.entries.remove(&id);
            }
        }))
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
        Self::ready(self.with(|s| {
            let q = s.routes.entry(route.to_string()).or_default();
            if let Some(id) = parse(id) {
                q.entries.remove(&id);
            }
            q.dead.insert(
                dead_id,
                DeadLetter {
                    id: show(dead_id),
                    entry: entry.clone(),
                    attempts,
                    last_error: last_error.to_string(),
                    dead_at: unix_millis(),
                },
            );
        }))
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
        let new_id = self.next_id();
        let moved = self.with(|s| {
            let q = s.routes.get_mut(route)?;
            let dead = q.dead.remove(&parse(dead_letter_id)?)?;
            let key = DeliveryKey::new(route, dead.entry.key.clone());
            q.entries.insert(
                new_id,
                Slot {
                    entry: dead.entry,
                    holder: None,
                },
            );
            s.attempts.remove(&key);
            Some(key)
        });
        let r = match moved {
            Ok(Some(key)) => self.store.reset_queued(&key).map(|_| true),
            Ok(None) => Ok(false),
            Err(e) => Err(e),
        };
        Self::ready(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Claim, Lifetimes};
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
        }
    }

    #[tokio::test]
    async fn a_queued_key_acknowledges_copies_and_fences_workers() {
        let q = queue();
        let key = DeliveryKey::new("wh", "k1");
        let fp = [7u8; 32];
        let Claim::Claimed(token) = q.store.claim(&key, &fp).await.unwrap() else {
            panic!("first claim")
        };
        assert!(q.enqueue("wh", &entry("k1"), 10).await.unwrap().is_some());
        assert!(q.mark_queued(&key, token).await.unwrap());
        assert_eq!(q.store.claim(&key, &fp).await.unwrap(), Claim::Queued);
        assert_eq!(
            q.store.claim(&key, &[8u8; 32]).await.unwrap(),
            Claim::Mismatch
        );

        // Two workers race over one entry: one holds the key, the other waits.
        let Lock::Claimed { token, attempt } = q.lock(&key).await.unwrap() else {
            panic!("worker lock")
        };
        assert_eq!(attempt, 1);
        assert_eq!(q.lock(&key).await.unwrap(), Lock::Busy);
        assert_eq!(q.store.claim(&key, &fp).await.unwrap(), Claim::Queued);
        let resp = StoredResponse {
            status: 200,
            headers: Bytes::new(),
            body: Bytes::new(),
        };
        assert!(q.complete(&key, token, &resp).await.unwrap());
        assert_eq!(q.lock(&key).await.unwrap(), Lock::Completed);
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
        q.done("wh", &read[1].0).await.unwrap();
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
        assert_eq!(q.read_new("wh", "c1", 10).await.unwrap()[0].1, Some(a));
    }
}
