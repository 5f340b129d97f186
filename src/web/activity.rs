//! Per-route, per-minute counters of the last hour, for the console's chart. In-process
//! (each replica counts what it served): a fixed ring of 60 minutes per route, written
//! with atomic adds on the hot path, no lock and no allocation.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::metrics::Outcome;

/// The series drawn, in order.
pub const SERIES: [&str; 5] = ["forwarded", "replayed", "in_flight", "rejected", "failed"];

/// Which series an outcome counts in (`failed`: the upstream answered non-2xx or not at all).
fn series_of(o: Outcome) -> usize {
    match o {
        Outcome::Forwarded | Outcome::Bypassed => 0,
        Outcome::Replayed => 1,
        Outcome::InFlight => 2,
        Outcome::UpstreamError => 4,
        _ => 3,
    }
}

const MINUTES: usize = 60;

struct RouteActivity {
    /// The minute (Unix minutes) each slot counts.
    stamps: [AtomicU64; MINUTES],
    counts: [[AtomicU64; SERIES.len()]; MINUTES],
}

impl RouteActivity {
    fn new() -> Self {
        RouteActivity {
            stamps: std::array::from_fn(|_| AtomicU64::new(0)),
            counts: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU64::new(0))),
        }
    }
}

/// See the module documentation.
pub struct Activity {
    routes: HashMap<String, RouteActivity>,
}

fn now_minute() -> u64 {
    crate::store::unix_millis() / 60_000
}

impl Activity {
    pub fn new<'a>(routes: impl IntoIterator<Item = &'a str>) -> Self {
        Activity {
            routes: routes
                .into_iter()
                .map(|r| (r.to_string(), RouteActivity::new()))
                .collect(),
        }
    }

    /// Counts one delivery of `route`.
    pub fn record(&self, route: &str, outcome: Outcome) {
        let Some(r) = self.routes.get(route) else {
            return;
        };
        let minute = now_minute();
        let slot = (minute % MINUTES as u64) as usize;
        let seen = r.stamps[slot].load(Ordering::Acquire);
        if seen != minute
            && r.stamps[slot]
                .compare_exchange(seen, minute, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            for c in &r.counts[slot] {
                c.store(0, Ordering::Release);
            }
        }
        r.counts[slot][series_of(outcome)].fetch_add(1, Ordering::Relaxed);
    }

    /// The last hour of `route`, oldest minute first.
    pub fn last_hour(&self, route: &str) -> Vec<[u64; SERIES.len()]> {
        let mut out = vec![[0; SERIES.len()]; MINUTES];
        let Some(r) = self.routes.get(route) else {
            return out;
        };
        let now = now_minute();
        for (i, row) in out.iter_mut().enumerate() {
            let m = now + 1 + i as u64 - MINUTES as u64;
            let slot = (m % MINUTES as u64) as usize;
            if r.stamps[slot].load(Ordering::Acquire) == m {
                for (k, v) in row.iter_mut().enumerate() {
                    *v = r.counts[slot][k].load(Ordering::Relaxed);
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_land_in_the_current_minute_and_series() {
        let a = Activity::new(["r"]);
        a.record("r", Outcome::Forwarded);
        a.record("r", Outcome::Forwarded);
        a.record("r", Outcome::InvalidSignature);
        a.record("other", Outcome::Forwarded);
        let h = a.last_hour("r");
        assert_eq!(h.len(), 60);
        assert_eq!(h[59], [2, 0, 0, 1, 0]);
        assert_eq!(h[..59].iter().flatten().sum::<u64>(), 0);
    }
}
