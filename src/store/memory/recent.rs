//! The memory store's recent index: per route, the deliveries by when they were first
//! seen, then key (the order of the Redis index, redis/log.rs), at most the configured
//! number per route (the oldest go). Written only where an entry is created
//! ([`MemoryStore::created`]); an item whose key is gone from the map, or whose entry
//! is a later life of the key (another `first_seen`), is stale: skipped, and dropped,
//! when read. So a listing reads a bounded number of items, not the whole map.

use std::collections::{BTreeSet, HashMap};
use std::ops::Bound;
use std::sync::Arc;

use super::{Entry, MemoryStore};
use crate::store::DeliveryKey;
use crate::store::log::{Cursor, LogEntry, RECENT_PER_ROUTE};

/// Each route's items, `(first_seen, key)`, and the cap per route.
pub(super) struct Recent {
    routes: HashMap<Arc<str>, BTreeSet<(u64, String)>>,
    cap: usize,
}

impl Default for Recent {
    fn default() -> Recent {
        Recent {
            routes: HashMap::new(),
            cap: RECENT_PER_ROUTE,
        }
    }
}

/// What one route's reading found: its matching entries, and where it stopped when
/// its budget ran out first.
pub(super) struct Found {
    pub items: Vec<(u64, LogEntry)>,
    pub stopped: Option<Cursor>,
}

/// One route's reading: below `cursor`, first seen in `[since, until)`, at most
/// `budget` items read, at most `want` matches kept.
pub(super) struct Reading<'a> {
    pub route: &'a str,
    pub cursor: Option<&'a Cursor>,
    pub since: Option<u64>,
    pub until: Option<u64>,
    pub budget: usize,
    pub want: usize,
}

impl Recent {
    /// Sets the cap per route (the oldest items beyond it go at the next insertion).
    pub(super) fn set_cap(&mut self, cap: usize) {
        self.cap = cap.max(1);
    }

    fn insert(&mut self, key: &DeliveryKey, first_seen: u64) {
        let items = self.routes.entry(key.route.clone()).or_default();
        items.insert((first_seen, key.key.clone()));
        while items.len() > self.cap {
            items.pop_first();
        }
    }

    /// The items of `r.route` newest first, as `(first_seen, key)`, that `r` may read.
    fn candidates(&self, r: &Reading<'_>) -> Vec<(u64, String)> {
        let Some(items) = self.routes.get(r.route) else {
            return Vec::new();
        };
        // The range read: at most `until - 1` and the cursor's score, at least `since`
        // (a range, not a walk from the top: deep pages cost what the first does).
        let mut top = r.until.map_or(u64::MAX, |u| u.saturating_sub(1));
        if let Some(c) = r.cursor {
            top = top.min(c.score);
        }
        let bottom = r.since.unwrap_or(0);
        if top < bottom {
            return Vec::new();
        }
        let upper = match top.checked_add(1) {
            Some(t) => Bound::Excluded((t, String::new())),
            None => Bound::Unbounded,
        };
        items
            .range((Bound::Included((bottom, String::new())), upper))
            .rev()
            .filter(|(s, k)| {
                r.cursor
                    .is_none_or(|c| (*s, r.route, k.as_str()) < c.order())
            })
            .take(r.budget)
            .cloned()
            .collect()
    }

    fn drop_stale(&mut self, route: &str, stale: &[(u64, String)]) {
        if let Some(items) = self.routes.get_mut(route) {
            for s in stale {
                items.remove(s);
            }
        }
    }
}

impl MemoryStore {
    /// Indexes a delivery whose entry was just created (or loaded at start): the
    /// index's one insertion point, called after the shard's lock is released.
    pub(super) fn index_created(&self, key: &DeliveryKey, first_seen: u64) {
        if let Ok(mut recent) = self.recent.lock() {
            recent.insert(key, first_seen);
        }
    }

    /// Reads one route's index as `r` says, checking each item against its entry.
    pub(super) fn read_route(
        &self,
        r: &Reading<'_>,
        entry_of: impl Fn(&DeliveryKey, &Entry, u64) -> LogEntry,
        matches: impl Fn(&LogEntry) -> bool,
    ) -> Result<Found, crate::store::StoreError> {
        let candidates = match self.recent.lock() {
            Ok(recent) => recent.candidates(r),
            Err(_) => return Err(poisoned()),
        };
        let route: Arc<str> = Arc::from(r.route);
        let now = crate::store::unix_millis();
        let (mut items, mut stale, mut examined) = (Vec::new(), Vec::new(), 0);
        for (score, k) in &candidates {
            if items.len() >= r.want {
                break;
            }
            examined += 1;
            let key = DeliveryKey::new(route.clone(), k.as_str());
            let read = self.inner.read(&key, |e| match e {
                Some(e) if e.live(now) && e.first_seen == *score => Some(entry_of(&key, &e, now)),
                _ => None,
            })?;
            match read {
                Some(entry) if matches(&entry) => items.push((*score, entry)),
                Some(_) => {}
                None => stale.push((*score, k.clone())),
            }
        }
        if !stale.is_empty()
            && let Ok(mut recent) = self.recent.lock()
        {
            recent.drop_stale(r.route, &stale);
        }
        let cut = examined >= r.budget && items.len() < r.want;
        let last = candidates.get(examined.saturating_sub(1));
        let stopped = last.filter(|_| cut).map(|(score, k)| Cursor {
            score: *score,
            route: r.route.to_string(),
            key: k.clone(),
        });
        Ok(Found { items, stopped })
    }

    /// Sets how many deliveries each route's index holds.
    pub fn set_recent_per_route(&self, cap: usize) {
        if let Ok(mut recent) = self.recent.lock() {
            recent.set_cap(cap);
        }
    }
}

fn poisoned() -> crate::store::StoreError {
    crate::store::StoreError::Unavailable("memory store lock poisoned".into())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::store::log::{DeliveryLog, ListQuery};
    use crate::store::{DeliveryKey, Lifetimes, MemoryStore, Store};

    fn listed(s: &MemoryStore) -> Vec<String> {
        let q = ListQuery {
            routes: vec!["r".into()],
            limit: 100,
            ..Default::default()
        };
        let page = block_on(s.recent(&q)).expect("listing");
        page.items.into_iter().map(|(_, e)| e.key).collect()
    }

    /// Runs a future that never waits (the memory store's) to completion.
    fn block_on<T>(f: impl std::future::Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime")
            .block_on(f)
    }

    fn claim(s: &MemoryStore, key: &str) {
        let fp = crate::providers::fingerprint_body(key.as_bytes());
        block_on(s.claim(&DeliveryKey::new("r", key), &fp, None)).expect("claim");
    }

    #[test]
    fn the_index_keeps_the_configured_number_per_route_newest_first() {
        let s = MemoryStore::new(Lifetimes {
            lease: Duration::from_secs(30),
            retention: Duration::from_secs(60),
        });
        s.set_recent_per_route(3);
        for k in ["a", "b", "c", "d", "e"] {
            claim(&s, k);
            std::thread::sleep(Duration::from_millis(2));
        }
        assert_eq!(listed(&s), ["e", "d", "c"]);
        assert_eq!(s.len(), 5, "older ones leave the list, not the store");
    }

    #[test]
    fn a_forgotten_then_new_key_is_listed_once_at_its_new_time() {
        let s = MemoryStore::new(Lifetimes {
            lease: Duration::from_millis(1),
            retention: Duration::from_secs(60),
        });
        claim(&s, "a");
        std::thread::sleep(Duration::from_millis(3));
        claim(&s, "b");
        std::thread::sleep(Duration::from_millis(3));
        // The lease lapsed: forget works, and a new life of `a` begins.
        let forgot = block_on(s.forget(&DeliveryKey::new("r", "a"))).expect("forget");
        assert_eq!(forgot, crate::store::log::Forgot::Forgotten);
        claim(&s, "a");
        assert_eq!(listed(&s), ["a", "b"]);
    }
}
