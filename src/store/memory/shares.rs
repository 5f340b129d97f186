//! Each route's share of the memory store's bound (`max_memory`), so that one route's
//! traffic cannot make another route forget a delivery inside its retention: the bytes
//! each route's entries cost, and whether an entry may be evicted for another's room.
//!
//! A route's share is `max_memory` divided by the routes holding entries. Below the
//! bound any route may use more than its share; once eviction is needed, an entry is
//! evicted only for its own route's room or when its route is over its share. So a
//! flooding route forgets its own oldest deliveries, and a route within its share
//! keeps every delivery until its retention ends.

use std::collections::HashMap;
use std::sync::RwLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes per route (by its name's bytes, as records begin with it).
#[derive(Default)]
pub(super) struct Shares {
    used: RwLock<HashMap<Box<[u8]>, AtomicU64>>,
}

impl Shares {
    /// Counts `bytes` more for `route`.
    pub(super) fn add(&self, route: &[u8], bytes: u64) {
        if let Ok(map) = self.used.read()
            && let Some(n) = map.get(route)
        {
            n.fetch_add(bytes, Ordering::Relaxed);
            return;
        }
        if let Ok(mut map) = self.used.write() {
            map.entry(Box::from(route))
                .or_default()
                .fetch_add(bytes, Ordering::Relaxed);
        }
    }

    /// Counts `bytes` fewer for `route`.
    pub(super) fn sub(&self, route: &[u8], bytes: u64) {
        if let Ok(map) = self.used.read()
            && let Some(n) = map.get(route)
        {
            let _ = n.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some(v.saturating_sub(bytes))
            });
        }
    }

    /// Whether an entry of `victim`'s may be evicted to make room for one of `for_route`'s
    /// under the bound `max`: its own route's, or a route over its share.
    pub(super) fn may_evict(&self, victim: &[u8], for_route: &[u8], max: u64) -> bool {
        if victim == for_route {
            return true;
        }
        let Ok(map) = self.used.read() else {
            return true;
        };
        // The routes holding entries, and the one asking for room (maybe its first).
        let asking_holds = map
            .get(for_route)
            .is_some_and(|n| n.load(Ordering::Relaxed) > 0);
        let holding = map
            .values()
            .filter(|n| n.load(Ordering::Relaxed) > 0)
            .count() as u64
            + u64::from(!asking_holds);
        map.get(victim)
            .is_none_or(|n| n.load(Ordering::Relaxed) > max / holding)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_route_over_its_share_gives_way_to_another() {
        let s = Shares::default();
        s.add(b"a", 900);
        s.add(b"b", 100);
        // Bound 1000, two routes: a share is 500.
        assert!(s.may_evict(b"a", b"b", 1000));
        assert!(!s.may_evict(b"b", b"a", 1000));
        assert!(s.may_evict(b"b", b"b", 1000));
        s.sub(b"a", 500);
        assert!(!s.may_evict(b"a", b"b", 1000));
        s.sub(b"a", 10_000);
        // A route holding nothing no longer divides the bound; one asking for its
        // first room does: `b` alone holds 100 of 150, over its half.
        assert!(s.may_evict(b"b", b"c", 150));
        assert!(!s.may_evict(b"b", b"c", 250));
    }
}
