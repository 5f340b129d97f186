//! Slowing guesses of the admin token. Refusals are counted per client address (an
//! IPv6 client by its /64) in a fixed table of buckets, so memory stays bounded however
//! many addresses there are: addresses whose keyed hashes collide share a bucket, which
//! can only slow a wrong token, never a right one (a right token is never held).
//!
//! The first `FREE` refusals of an address are answered at once; after that they are
//! answered one per `STEP`, each held for at most `MAX_WAIT`, so concurrency does not
//! buy more guesses. An address quiet for `FORGIVE` starts afresh.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::net::IpAddr;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// The client's address, which the listener puts in each admin request's extensions.
#[derive(Debug, Clone, Copy)]
pub struct ClientIp(pub IpAddr);

/// Refusals from one address answered at once.
const FREE: u32 = 10;
/// After those, one refusal answered per this long.
const STEP: Duration = Duration::from_millis(500);
/// The longest a refusal is held.
const MAX_WAIT: Duration = Duration::from_secs(10);
/// An address this long without a refusal starts afresh.
const FORGIVE: Duration = Duration::from_secs(60);
/// Buckets in the table (a few dozen KiB).
const BUCKETS: usize = 4096;

/// One bucket's refusals.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    refusals: u32,
    last: Instant,
    /// When the next held refusal may be answered.
    next: Instant,
}

/// What to do with one refusal.
#[derive(Debug, PartialEq, Eq)]
pub struct Refusal {
    /// Hold the answer this long.
    pub wait: Duration,
    /// The address's refusals so far (within `FORGIVE` of each other).
    pub refusals: u32,
    /// Log it at WARN (the first ones and then one per doubling; the rest at DEBUG),
    /// so that guessing does not flood the audit log.
    pub log: bool,
}

/// The table of refusals per client address.
pub struct Throttle {
    keys: RandomState,
    buckets: Mutex<Vec<Option<Bucket>>>,
}

impl Default for Throttle {
    fn default() -> Self {
        Throttle {
            keys: RandomState::new(),
            buckets: Mutex::new(vec![None; BUCKETS]),
        }
    }
}

impl Throttle {
    /// Counts a refused request from `ip` and says how long to hold its answer.
    pub fn refused(&self, ip: IpAddr) -> Refusal {
        let now = Instant::now();
        let i = self.index(ip);
        let mut buckets = self.buckets.lock().unwrap_or_else(PoisonError::into_inner);
        let mut b = match buckets.get(i).copied().flatten() {
            Some(b) if now.duration_since(b.last) < FORGIVE => b,
            _ => Bucket {
                refusals: 0,
                last: now,
                next: now,
            },
        };
        b.refusals = b.refusals.saturating_add(1);
        b.last = now;
        let wait = if b.refusals <= FREE {
            Duration::ZERO
        } else {
            b.next = (b.next.max(now) + STEP).min(now + MAX_WAIT);
            b.next.duration_since(now)
        };
        if let Some(slot) = buckets.get_mut(i) {
            *slot = Some(b);
        }
        Refusal {
            wait,
            refusals: b.refusals,
            log: b.refusals <= FREE || b.refusals.is_power_of_two(),
        }
    }

    fn index(&self, ip: IpAddr) -> usize {
        let key: [u8; 8] = match ip.to_canonical() {
            IpAddr::V4(v4) => {
                let [a, b, c, d] = v4.octets();
                [a, b, c, d, 0, 0, 0, 4]
            }
            IpAddr::V6(v6) => {
                let o = v6.octets();
                [o[0], o[1], o[2], o[3], o[4], o[5], o[6], o[7]]
            }
        };
        (self.keys.hash_one(key) % BUCKETS as u64) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn refusals_are_free_then_one_per_step_and_forgiven() {
        let t = Throttle::default();
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        for _ in 0..FREE {
            assert_eq!(t.refused(a).wait, Duration::ZERO);
        }
        // At once, as many guesses as one likes: each is held one step longer.
        assert_eq!(t.refused(a).wait, STEP);
        assert_eq!(t.refused(a).wait, STEP * 2);
        let logged = (0..100)
            .map(|_| t.refused(a))
            .inspect(|r| assert!(r.wait <= MAX_WAIT))
            .filter(|r| r.log)
            .count();
        assert_eq!(
            logged, 3,
            "refusals 13 to 112 are logged at 16, 32 and 64 only"
        );
        // Another address is not slowed (unless it shares the bucket: 1 in 4096).
        if t.index(a) != t.index(b) {
            assert_eq!(t.refused(b).wait, Duration::ZERO);
        }
        tokio::time::advance(FORGIVE + MAX_WAIT).await;
        assert_eq!(t.refused(a).wait, Duration::ZERO);
    }

    #[test]
    fn an_ipv6_client_is_counted_by_its_64() {
        let t = Throttle::default();
        let a: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        assert_eq!(t.index(a), t.index(b));
    }
}
