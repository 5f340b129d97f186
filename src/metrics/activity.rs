//! Per-route, per-minute counters of the last hour, for the console's chart. In-process
//! (each replica counts what it served): a fixed ring of 60 minutes per route, written
//! with atomic adds on the hot path, no lock and no allocation.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::metrics::Outcome;

/// The series drawn, in order.
pub const SERIES: [&str; 5] = ["forwarded", "replayed", "in_flight", "rejected", "failed"];

/// Which series an outcome counts in (`failed`: the upstream answered non-2xx or not at all).
fn series_of(o: Outcome) -> usize {
    match o {
        // handshakes and keyless requests pass through (or are answered), unclaimed
        Outcome::Forwarded | Outcome::Bypassed | Outcome::Handshake | Outcome::Unkeyed => 0,
        Outcome::Replayed => 1,
        Outcome::InFlight => 2,
        Outcome::UpstreamError => 4,
        _ => 3,
    }
}

const MINUTES: usize = 60;

/// One configured route's ring of the last hour, shared by its metrics (which write
/// it) and the console (which reads it).
pub struct RouteActivity {
    /// The minute (Unix minutes) each slot counts.
    stamps: [AtomicU64; MINUTES],
    counts: [[AtomicU64; SERIES.len()]; MINUTES],
}

fn now_minute() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() / 60)
        .unwrap_or(0)
}

impl RouteActivity {
    pub fn new() -> Self {
        RouteActivity {
            stamps: std::array::from_fn(|_| AtomicU64::new(0)),
            counts: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU64::new(0))),
        }
    }

    /// Counts one delivery.
    pub fn record(&self, outcome: Outcome) {
        let minute = now_minute();
        let slot = (minute % MINUTES as u64) as usize;
        let seen = self.stamps[slot].load(Ordering::Acquire);
        if seen != minute
            && self.stamps[slot]
                .compare_exchange(seen, minute, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            for c in &self.counts[slot] {
                c.store(0, Ordering::Release);
            }
        }
        self.counts[slot][series_of(outcome)].fetch_add(1, Ordering::Relaxed);
    }

    /// The last hour, oldest minute first.
    pub fn last_hour(&self) -> Vec<[u64; SERIES.len()]> {
        let mut out = vec![[0; SERIES.len()]; MINUTES];
        let now = now_minute();
        for (i, row) in out.iter_mut().enumerate() {
            let m = now + 1 + i as u64 - MINUTES as u64;
            let slot = (m % MINUTES as u64) as usize;
            if self.stamps[slot].load(Ordering::Acquire) == m {
                for (k, v) in row.iter_mut().enumerate() {
                    *v = self.counts[slot][k].load(Ordering::Relaxed);
                }
            }
        }
        out
    }
}

impl Default for RouteActivity {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_land_in_the_current_minute_and_series() {
        let a = RouteActivity::new();
        a.record(Outcome::Forwarded);
        a.record(Outcome::Forwarded);
        a.record(Outcome::InvalidSignature);
        let h = a.last_hour();
        assert_eq!(h.len(), 60);
        assert_eq!(h[59], [2, 0, 0, 1, 0]);
        assert_eq!(h[..59].iter().flatten().sum::<u64>(), 0);
    }
}
