//! A bounded soak: mixed traffic (fresh deliveries, provider retries, concurrent
//! copies, hostile requests, upstream errors) with Redis paused and restarted every
//! few seconds, the sidecar's RSS sampled throughout. Memory shows no growth trend, and
//! the fault invariants hold at the end.
//!
//! `IDEMGATE_SOAK_SECS` sets the length (default 60 s).

use std::time::{Duration, Instant};

use crate::common::load::*;
use crate::common::*;

const MIB: u64 = 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn soak_mixed_traffic_with_faults_has_no_memory_growth() {
    let _heavy = crate::common::exclusive().await;
    let secs: u64 = std::env::var("IDEMGATE_SOAK_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60)
        .clamp(10, 3600);
    let run = Duration::from_secs(secs);
    let lease = Duration::from_secs(3);
    let mut redis =
        RedisServer::start_new_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let up = Upstream::start().await;
    up.set_mode(Mode::Delayed(
        Duration::from_millis(5),
        Box::new(Mode::default_ok()),
    ));
    let sc = SidecarBuilder::new(&up.url(), &redis.url())
        .store_opt("timeout", "500ms")
        .store_opt("breaker_threshold", "3")
        .store_opt("breaker_cooldown", "300ms")
        .top("max_body", "64KiB")
        .lease("3s")
        .start()
        .await;
    for _ in 0..50 {
        assert_eq!(sc.send(&Delivery::fresh()).await.status, 200);
    }

    let bound = Duration::from_secs(15);
    let load = start_load(target(&sc), 4, run, bound);

    // hostile traffic beside it: each must get its 4xx
    let hostile = {
        let url = sc.url(PATH);
        tokio::spawn(async move {
            let client = http_client();
            let start = Instant::now();
            let mut n = 0u64;
            while start.elapsed() < run {
                let (d, want) = match n % 4 {
                    0 => (Delivery::fresh().secret(SECRET_WRONG), 401),
                    1 => (Delivery::fresh().omit("webhook-signature"), 400),
                    2 => (Delivery::fresh().ts(now_secs() - 3600), 401),
                    _ => (Delivery::new(&"k".repeat(300), "{}"), 400),
                };
                let a = post(&client, &url, &d.headers(), d.body.clone())
                    .await
                    .unwrap();
                assert_eq!(a.status, want, "hostile #{n}: {}", a.text());
                n += 1;
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            n
        })
    };

    // faults and RSS samples
    let start = Instant::now();
    let mut samples: Vec<(u64, u64)> = Vec::new();
    let mut tick = 0u64;
    while start.elapsed() < run {
        samples.push((start.elapsed().as_secs(), rss_kib(sc.pid())));
        match tick % 10 {
            3 => redis.pause(800),
            6 => up.set_mode(Mode::Status(500)),
            7 => up.set_mode(Mode::Delayed(
                Duration::from_millis(5),
                Box::new(Mode::default_ok()),
            )),
            9 if tick % 20 == 9 => {
                redis.stop();
                tokio::time::sleep(Duration::from_millis(500)).await;
                redis.start();
            }
            _ => {}
        }
        tick += 1;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    up.set_mode(Mode::default_ok());
    let sent = load.finish().await;
    let hostile_sent = hostile.await.unwrap();
    samples.push((start.elapsed().as_secs(), rss_kib(sc.pid())));

    eprintln!("RSS samples (s, KiB): {samples:?}");
    let third = samples.len() / 3;
    let first_max = samples[..third].iter().map(|s| s.1).max().unwrap();
    let last_max = samples[samples.len() - third..]
        .iter()
        .map(|s| s.1)
        .max()
        .unwrap();
    eprintln!("first third max {first_max} KiB, last third max {last_max} KiB");
    assert!(
        last_max <= first_max * 3 / 2 + 8 * MIB,
        "RSS grew: first third max {first_max} KiB, last third max {last_max} KiB"
    );

    let logs = sc.stderr();
    let f = check_invariants(&sc, &up, &redis, &sent, &logs, lease, false, false).await;
    eprintln!("soak {secs}s: {f:#?}; {hostile_sent} hostile requests refused");
    assert!(f.answered_2xx > 100, "{f:?}");
    for n in [SECRET, "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"] {
        assert!(!logs.contains(n), "the log holds a secret");
    }
}
