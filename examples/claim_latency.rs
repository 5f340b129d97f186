//! Measures what a delivery costs in the store on each Redis deployment, for
//! docs/scaling.md: the claim and completion round trips (sequential, one in flight,
//! so each sample is one round trip), with and without `min_replicas_ack`, and the
//! memory a completed delivery keeps for its retention.
//!
//! ```sh
//! cargo run --release --example claim_latency [-- ITERATIONS]
//! ```
//!
//! It starts its own redis-server processes (a standalone server, a 3-master cluster
//! with a replica each, a Sentinel-managed master with a replica) on free 127.0.0.1
//! ports and kills them at the end.

/// A 127.0.0.1 port that was free a moment ago (for the test harness below).
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

/// The test harness's Redis deployments.
#[path = "../tests/it/common/cluster.rs"]
#[allow(
    dead_code,
    reason = "the example uses a few of the test harness's deployments"
)]
mod cluster;

use std::time::{Duration, Instant};

use bytes::Bytes;
use cluster::{Node, RedisCluster, SentinelSet, cli};
use idemgate::providers::fingerprint_body;
use idemgate::store::log::DeliveryLog;
use idemgate::store::{Claim, DeliveryKey, Lifetimes, RedisStore, Store, StoredResponse};

const LIFETIMES: Lifetimes = Lifetimes {
    lease: Duration::from_secs(30),
    retention: Duration::from_secs(72 * 3600),
};

/// A typical small answer: 200, a content type, a short JSON body.
fn small_answer() -> StoredResponse {
    StoredResponse {
        status: 200,
        headers: Bytes::from_static(b"content-type: application/json\r\n"),
        body: Bytes::from_static(br#"{"received":true}"#),
    }
}

/// A Stripe-like event id.
fn event_id(run: &str, i: usize) -> String {
    format!("evt_{run}{i:0>22}")
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn summary(mut samples: Vec<Duration>) -> String {
    samples.sort();
    let mean = samples.iter().sum::<Duration>() / samples.len() as u32;
    format!(
        "p50 {:>6.0} µs  p99 {:>6.0} µs  mean {:>6.0} µs",
        percentile(&samples, 0.5).as_secs_f64() * 1e6,
        percentile(&samples, 0.99).as_secs_f64() * 1e6,
        mean.as_secs_f64() * 1e6
    )
}

/// Claims and completes `n` fresh deliveries on every store, one after the other and
/// interleaved (delivery i on each store in turn, so that a busy moment of a shared
/// machine weighs on all deployments alike); prints the timings per store.
async fn measure(stores: &[(&str, RedisStore)], n: usize) {
    let fp = fingerprint_body(b"{}");
    let answer = small_answer();
    // warm up: connections, slot map, script cache
    for (label, store) in stores {
        for i in 0..200 {
            let k = DeliveryKey::new("stripe", event_id(&format!("w{label}"), i));
            if let Claim::Claimed(t) = store.claim(&k, &fp, None).await.expect("claim") {
                store
                    .complete(&k, t, &answer, None)
                    .await
                    .expect("complete");
            }
        }
    }
    let mut samples = vec![(Vec::new(), Vec::new(), Vec::new()); stores.len()];
    for i in 0..n {
        for ((label, store), (claims, completes, replays)) in stores.iter().zip(&mut samples) {
            let k = DeliveryKey::new("stripe", event_id(label, i));
            let t0 = Instant::now();
            let c = store.claim(&k, &fp, None).await.expect("claim");
            claims.push(t0.elapsed());
            let Claim::Claimed(token) = c else {
                panic!("fresh key not claimed: {c:?}")
            };
            let t1 = Instant::now();
            assert!(
                store
                    .complete(&k, token, &answer, None)
                    .await
                    .expect("complete")
            );
            completes.push(t1.elapsed());
            let t2 = Instant::now();
            store.claim(&k, &fp, None).await.expect("replay");
            replays.push(t2.elapsed());
        }
    }
    for ((label, _), (claims, completes, replays)) in stores.iter().zip(samples) {
        println!("{label:<36} claim    {}", summary(claims));
        println!("{:<36} complete {}", "", summary(completes));
        println!("{:<36} copy     {}", "", summary(replays));
    }
}

/// Memory one completed delivery keeps: `MEMORY USAGE` of its keys, and the growth of
/// `used_memory` over many (which adds the keyspace and expiry entries).
async fn memory(server: &Node, label: &str, answer: StoredResponse) {
    let store =
        RedisStore::new(&server.url(), label, LIFETIMES, Duration::from_secs(2)).expect("store");
    let fp = fingerprint_body(b"{}");
    let k = DeliveryKey::new("stripe", event_id("mem", 0));
    let Claim::Claimed(t) = store.claim(&k, &fp, None).await.expect("claim") else {
        panic!("not claimed")
    };
    // The log writer's writes are off the claim's path: reading the log waits for them.
    let _ = store.log_entry(&k).await;
    let state = store.state_key(&k);
    let record = format!("{state}:claim");
    // A first delivery's log rides in its record: no log hash ("none").
    let usage = |key: &str| {
        let b = server.cli(&["MEMORY", "USAGE", key, "SAMPLES", "0"]);
        if b.is_empty() {
            "none".to_string()
        } else {
            format!("{b} B")
        }
    };
    println!(
        "{label}: answer = status {}, {} B headers, {} B body",
        answer.status,
        answer.headers.len(),
        answer.body.len()
    );
    println!(
        "  in flight:  log hash {}, claim record {} (key {state:?})",
        usage(&state),
        usage(&record)
    );
    store
        .complete(&k, t, &answer, None)
        .await
        .expect("complete");
    println!(
        "  completed:  log hash {}, claim record {}",
        usage(&state),
        usage(&record)
    );

    let used = || -> i64 {
        server
            .cli(&["INFO", "memory"])
            .lines()
            .find_map(|l| l.trim().strip_prefix("used_memory:"))
            .and_then(|v| v.parse().ok())
            .expect("used_memory")
    };
    let n = 100_000;
    let before = used();
    let mut set = tokio::task::JoinSet::new();
    for w in 0..16 {
        let store = store.clone();
        let answer = answer.clone();
        set.spawn(async move {
            let fp = fingerprint_body(b"{}");
            for i in (w..n).step_by(16) {
                let k = DeliveryKey::new("stripe", event_id("bulk", i));
                if let Claim::Claimed(t) = store.claim(&k, &fp, None).await.expect("claim") {
                    store
                        .complete(&k, t, &answer, None)
                        .await
                        .expect("complete");
                }
            }
        });
    }
    while set.join_next().await.is_some() {}
    let after = used();
    println!(
        "  {n} completed deliveries: used_memory +{} B = {:.0} B per delivery",
        after - before,
        (after - before) as f64 / n as f64
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2000);
    println!("{n} sequential deliveries per deployment (claim, complete, then a copy's claim)\n");

    let server = Node::standalone();
    let set = tokio::task::spawn_blocking(SentinelSet::start)
        .await
        .expect("sentinel");
    let cluster = tokio::task::spawn_blocking(|| RedisCluster::start(3, 1))
        .await
        .expect("cluster");
    let store = |url: &str| {
        RedisStore::new(url, "idemgate", LIFETIMES, Duration::from_secs(2)).expect("store")
    };
    let acks = |s: RedisStore| s.with_replica_acks(1, Duration::from_millis(100));
    let stores = [
        ("standalone", store(&server.url())),
        ("sentinel (master + 1 replica)", store(&set.url())),
        ("sentinel, min_replicas_ack = 1", acks(store(&set.url()))),
        ("cluster (3 masters, 1 replica each)", store(&cluster.url())),
        ("cluster, min_replicas_ack = 1", acks(store(&cluster.url()))),
    ];
    measure(&stores, n).await;
    drop(stores);
    drop(set);
    drop(cluster);

    println!();
    memory(&server, "small", small_answer()).await;
    let mut larger = small_answer();
    larger.body = Bytes::from(format!(r#"{{"received":true,"id":"{}"}}"#, "x".repeat(170)));
    memory(&server, "larger", larger).await;
    println!(
        "\nredis-server: {}",
        cli(server.port, &["INFO", "server"])
            .lines()
            .find(|l| l.starts_with("redis_version"))
            .unwrap_or("?")
    );
}
