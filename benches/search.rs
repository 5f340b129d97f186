//! The cost of one page of the delivery list at an index of one million deliveries
//! (`store.recent_per_route = 1_000_000`), on the memory store and on Redis: the first
//! page unfiltered, a narrow filter that matches nothing (the page reads its whole
//! budget, `SCAN_BUDGET` index entries, and answers `partial`), a filter matching 1 in
//! 100, and a `since`/`until` window in the middle of the index (read by score).
//!
//! `cargo bench --bench search`. Filling the index takes a while (a million claims and
//! completions through each store, 64 at a time, bounded by a 10-minute deadline); the
//! Redis half starts its own redis-server on a free loopback port and is skipped, with
//! a note, when redis-server is missing. `SEARCH_BENCH_ENTRIES` overrides the count.

use std::net::TcpListener as StdListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};

use idemgate::providers::fingerprint_body;
use idemgate::store::log::{Filter, ListQuery, LogOutcome, Settled};
use idemgate::store::{
    Claim, DeliveryKey, Lifetimes, MemoryStore, RedisStore, Store, StoredResponse,
};

const ROUTE: &str = "bench";

fn entries() -> usize {
    std::env::var("SEARCH_BENCH_ENTRIES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000)
}

struct RedisProcess(Child, u16);

impl Drop for RedisProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_redis() -> Option<RedisProcess> {
    let port = StdListener::bind("127.0.0.1:0")
        .ok()?
        .local_addr()
        .ok()?
        .port();
    let child = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let p = RedisProcess(child, port);
    let end = Instant::now() + Duration::from_secs(10);
    while Instant::now() < end {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Some(p);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// One delivery, claimed and settled: every 100th failed with a 503, the rest
/// forwarded with a 200.
async fn deliver<S: Store>(s: &S, i: usize) {
    let k = DeliveryKey::new(ROUTE, format!("evt_{i:07}"));
    let fp = fingerprint_body(k.key.as_bytes());
    let log = idemgate::store::log::ClaimLog::default();
    let Ok(Claim::Claimed(t)) = s.claim(&k, &fp, Some(log)).await else {
        return;
    };
    let failed = i.is_multiple_of(100);
    let settled = Settled {
        outcome: if failed {
            LogOutcome::UpstreamError
        } else {
            LogOutcome::Forwarded
        },
        upstream_status: Some(if failed { 503 } else { 200 }),
        latency_ms: 1,
        restore_completed: false,
    };
    if failed {
        let _ = s.release(&k, t, Some(&settled)).await;
    } else {
        let answer = StoredResponse {
            status: 200,
            headers: bytes::Bytes::new(),
            body: bytes::Bytes::from_static(b"ok"),
        };
        let _ = s.complete(&k, t, &answer, Some(&settled)).await;
    }
}

/// Fills `s` with `n` deliveries, 64 at a time; returns the first-seen time of the
/// middle one.
async fn fill<S: Store + Clone>(s: &S, n: usize) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut set = tokio::task::JoinSet::new();
    for w in 0..64 {
        let s = s.clone();
        set.spawn(async move {
            for i in (w..n).step_by(64) {
                if Instant::now() > deadline {
                    return;
                }
                deliver(&s, i).await;
                // The memory store never waits: without this, each task would run
                // to its end before the next, and the index would hold one task's
                // deliveries at a time (not every hundredth a failure).
                tokio::task::yield_now().await;
            }
        });
    }
    while set.join_next().await.is_some() {}
    let mid = DeliveryKey::new(ROUTE, format!("evt_{:07}", n / 2));
    s.log_entry(&mid)
        .await
        .ok()
        .flatten()
        .map_or(0, |e| e.first_seen)
}

fn query(words: &[(&str, String)]) -> ListQuery {
    let mut filter = Filter::default();
    for (w, v) in words {
        filter.set(w, v).expect("a filter word");
    }
    ListQuery {
        routes: vec![ROUTE.into()],
        filter,
        limit: 50,
        cursor: None,
    }
}

fn pages<S: Store + Clone>(c: &mut Criterion, rt: &tokio::runtime::Runtime, name: &str, s: S) {
    let n = entries();
    let started = Instant::now();
    let mid = rt.block_on(fill(&s, n));
    eprintln!("{name}: {n} deliveries filled in {:?}", started.elapsed());
    let cases = [
        ("first_page", query(&[])),
        ("no_match_partial", query(&[("key_prefix", "none_".into())])),
        ("one_in_100", query(&[("upstream_status", "5xx".into())])),
        (
            "window_mid",
            query(&[
                ("since", mid.to_string()),
                ("until", (mid + 1000).to_string()),
            ]),
        ),
    ];
    let mut g = c.benchmark_group(format!("list_page_{name}_{n}"));
    g.sample_size(20);
    for (case, q) in cases {
        let page = rt.block_on(s.recent(&q)).expect("a page");
        eprintln!(
            "{name} {case}: {} items, partial {}",
            page.items.len(),
            page.partial
        );
        g.bench_function(case, |b| {
            b.to_async(rt)
                .iter(|| async { s.recent(&q).await.expect("a page") })
        });
    }
    g.finish();
}

fn search(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let lifetimes = Lifetimes {
        lease: Duration::from_secs(30),
        retention: Duration::from_secs(3600),
    };
    {
        let mem = rt.block_on(async { MemoryStore::new(lifetimes) });
        mem.set_recent_per_route(entries());
        pages(c, &rt, "memory", mem);
    }
    match start_redis() {
        Some(redis) => {
            let _in_runtime = rt.enter();
            let store = RedisStore::new(
                &format!("redis://127.0.0.1:{}/0", redis.1),
                "bench",
                lifetimes,
                Duration::from_secs(5),
            )
            .unwrap()
            .with_recent_per_route(entries());
            pages(c, &rt, "redis", store);
            drop(redis);
        }
        None => eprintln!("redis-server not available: skipping the redis half"),
    }
}

criterion_group!(benches, search);
criterion_main!(benches);
