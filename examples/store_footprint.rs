//! Measures the resident memory the in-process store keeps per completed delivery,
//! for docs/scaling.md and BENCHMARKS.md: a small delivery (a 28-byte key, a 92-byte
//! answer, the log's fields, no kept payload), N at a time, RSS read from
//! /proc/self/statm before and after.
//!
//! ```sh
//! cargo run --release --example store_footprint [-- DELIVERIES]   # default 100000
//! ```
//!
//! The answer's bytes are slices of a 16 KiB buffer, as hyper hands a body over: a
//! store that kept the slice would keep the whole buffer alive.

use std::time::Duration;

use bytes::Bytes;
use idemgate::store::log::{ClaimLog, LogOutcome, Settled};
use idemgate::store::{
    Claim, DeliveryKey, Lifetimes, MemoryOptions, MemoryStore, Store, StoredResponse,
};

/// Resident bytes of this process now.
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("resident pages");
    pages * 4096
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(100_000);
    let lifetimes = Lifetimes {
        lease: Duration::from_secs(30),
        retention: Duration::from_secs(72 * 3600),
    };
    let store = MemoryStore::with_options(MemoryOptions::new(lifetimes).max_memory(u64::MAX));
    let settled = Settled {
        outcome: LogOutcome::Forwarded,
        upstream_status: Some(200),
        latency_ms: 3,
        restore_completed: false,
    };
    let log = ClaimLog {
        kept: None,
        replay: false,
    };
    let before = rss();
    for i in 0..n {
        let buffer = Bytes::from(vec![b'x'; 16 * 1024]);
        let response = StoredResponse {
            status: 200,
            headers: buffer.slice(0..32),
            body: buffer.slice(100..160),
        };
        let key = DeliveryKey::new("stripe", format!("evt_1NqY2ZJ2eZvKYlo2C{i:09}"));
        let Ok(Claim::Claimed(token)) = store.claim(&key, &[7; 32], Some(log)).await else {
            panic!("delivery {i} was not claimed");
        };
        let done = store.complete(&key, token, &response, Some(&settled)).await;
        assert_eq!(done.ok(), Some(true));
    }
    let after = rss();
    let stats = store.bound_stats();
    println!(
        "{n} deliveries: RSS +{:.1} MiB = {} bytes per delivery (counted against max_memory: {} bytes each)",
        (after - before) as f64 / (1 << 20) as f64,
        (after - before) / n,
        stats.used_bytes / n,
    );
}
