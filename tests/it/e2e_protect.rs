//! End-to-end: protecting the application (docs/async.md, "Protecting the
//! application"): throttled delivery across sidecars, the application's Retry-After,
//! ordered keys. Real redis-server, real sidecar processes sharing it, and an
//! application that records when each request arrived and how many ran at once.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::probe_app::{Call, ProbeApp, Reply};
use crate::common::*;

const SEC: Duration = Duration::from_secs(1);

/// An async route on `path` with `extra` route fields.
fn async_route(name: &str, path: &str, extra: &str) -> RouteCfg {
    let mut r = RouteCfg::standard(name, path);
    r.extra = format!("mode = \"async\"\n{extra}");
    r
}

async fn sidecars(
    n: usize,
    app: &ProbeApp,
    redis: &RedisServer,
    routes: &[RouteCfg],
) -> Vec<Sidecar> {
    let mut out = Vec::new();
    for _ in 0..n {
        let mut b =
            SidecarBuilder::new(&app.url(), &redis.url()).extra("[async]\nclaim_idle = \"5s\"");
        for r in routes {
            b = b.route(r.clone());
        }
        out.push(b.start().await);
    }
    out
}

/// Sends `ds` spread over the sidecars, at most `at_once` in flight; every one must be
/// acknowledged.
async fn send_all(scs: &[Sidecar], ds: Vec<Delivery>, at_once: usize) {
    let gate = Arc::new(tokio::sync::Semaphore::new(at_once));
    let mut set = tokio::task::JoinSet::new();
    for (i, d) in ds.into_iter().enumerate() {
        let permit = gate.clone().acquire_owned().await.unwrap();
        let h = scs[i % scs.len()].send_spawned(&d);
        set.spawn(async move {
            let a = h.await.unwrap();
            drop(permit);
            a
        });
    }
    while let Some(a) = set.join_next().await {
        let a = a.unwrap();
        assert_eq!(a.status, 200, "not acknowledged: {a:?}");
    }
}

/// The most calls that arrived within any window of `w`.
fn most_in_window(calls: &[Call], w: Duration) -> usize {
    let mut t: Vec<Instant> = calls.iter().map(|c| c.arrived).collect();
    t.sort();
    let mut most = 0;
    let mut j = 0;
    for i in 0..t.len() {
        while t[i].duration_since(t[j]) >= w {
            j += 1;
        }
        most = most.max(i - j + 1);
    }
    most
}

/// 2xx answers per idempotency key.
fn ok_per_key(calls: &[Call]) -> HashMap<String, usize> {
    let mut m = HashMap::new();
    for c in calls.iter().filter(|c| c.status < 300) {
        *m.entry(c.key.clone()).or_insert(0) += 1;
    }
    m
}

/// A burst of 5,000 acknowledged deliveries through three sidecars, with
/// `max_concurrency = 4` and `rate = 200`: the application never has more than 4
/// requests at once, no 1 s window holds more than `rate + burst` (400; the tolerance
/// is 2 % of the rate for the spread between the store's admission and the arrival),
/// no 5 s window more than `rate × 5 + burst`, and each delivery arrives exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_is_throttled_across_three_sidecars_and_delivered_once() {
    let redis = RedisServer::start_new();
    let app = ProbeApp::start(|_| Reply::ok(Duration::from_millis(3))).await;
    let route = async_route(ROUTE, PATH, "max_concurrency = 4\nrate = 200\n");
    let scs = sidecars(3, &app, &redis, &[route]).await;
    const N: usize = 5_000;
    let ds: Vec<Delivery> = (0..N).map(|_| Delivery::fresh()).collect();
    let keys: Vec<String> = ds.iter().map(|d| format!("{ROUTE}:{}", d.id)).collect();
    let sent = Instant::now();
    send_all(&scs, ds, 64).await;
    let acked = sent.elapsed();
    app.wait_for_ok(N, 120 * SEC).await;
    tokio::time::sleep(SEC).await;
    let calls = app.calls();
    let first = calls.iter().map(|c| c.arrived).min().unwrap();
    let last = calls.iter().map(|c| c.arrived).max().unwrap();
    let rate = (N - 200) as f64 / last.duration_since(first).as_secs_f64();
    eprintln!(
        "5,000 acknowledged in {acked:?}; delivered over {:?} (after the burst of 200: {rate:.1}/s); most at once {}; most in 1 s {}; most in 5 s {}",
        last.duration_since(first),
        app.most_at_once(),
        most_in_window(&calls, SEC),
        most_in_window(&calls, 5 * SEC)
    );
    assert!(app.most_at_once() <= 4, "{} at once", app.most_at_once());
    assert!(
        most_in_window(&calls, SEC) <= 400 + 4,
        "{}",
        most_in_window(&calls, SEC)
    );
    assert!(
        most_in_window(&calls, 5 * SEC) <= 1200 + 4,
        "{}",
        most_in_window(&calls, 5 * SEC)
    );
    let got = ok_per_key(&calls);
    assert_eq!(calls.len(), N, "every delivery once, none retried");
    for k in &keys {
        assert_eq!(got.get(k), Some(&1), "{k}");
    }
}

/// The application answers one route `429` with `Retry-After: 2` for its first 3 s:
/// that route is held on both sidecars (nothing reaches it for the 2 s after a 429),
/// its attempts are not spent (`max_attempts = 1`, yet nothing is dead-lettered), and
/// the other route flows meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_holds_the_route_everywhere_without_spending_attempts() {
    let redis = RedisServer::start_new();
    let first_held: Arc<Mutex<Option<Instant>>> = Arc::default();
    let f = first_held.clone();
    let app = ProbeApp::start(move |seen| {
        if seen.path != "/webhooks/held" {
            return Reply::ok(Duration::from_millis(2));
        }
        let start = *f.lock().unwrap().get_or_insert_with(Instant::now);
        if start.elapsed() < 3 * SEC {
            Reply {
                status: 429,
                headers: vec![("retry-after".into(), "2".into())],
                delay: Duration::ZERO,
            }
        } else {
            Reply::ok(Duration::from_millis(2))
        }
    })
    .await;
    let routes = [
        async_route("held", "/webhooks/held", "max_attempts = 1\n"),
        async_route("free", "/webhooks/free", ""),
    ];
    let scs = sidecars(2, &app, &redis, &routes).await;
    let held: Vec<Delivery> = (0..10)
        .map(|_| Delivery::fresh().path("/webhooks/held"))
        .collect();
    let free: Vec<Delivery> = (0..10)
        .map(|_| Delivery::fresh().path("/webhooks/free"))
        .collect();
    send_all(&scs, held, 4).await;
    let free_sent = Instant::now();
    send_all(&scs, free, 4).await;

    app.wait_for_ok(20, 30 * SEC).await;
    let calls = app.calls();
    let free_calls: Vec<&Call> = calls
        .iter()
        .filter(|c| c.path == "/webhooks/free")
        .collect();
    assert_eq!(free_calls.len(), 10, "each free delivery once");
    for c in &free_calls {
        assert!(
            c.arrived.duration_since(free_sent) < 2 * SEC,
            "the free route waited for the held one: {:?}",
            c.arrived.duration_since(free_sent)
        );
    }
    let mut held_calls: Vec<&Call> = calls
        .iter()
        .filter(|c| c.path == "/webhooks/held")
        .collect();
    held_calls.sort_by_key(|c| c.arrived);
    let first_429 = held_calls
        .iter()
        .find(|c| c.status == 429)
        .expect("a 429")
        .arrived;
    // Calls already admitted when the first 429 was answered may still land just
    // after it; after that, nothing for the rest of the 2 s.
    let quiet: Vec<Duration> = held_calls
        .iter()
        .map(|c| c.arrived.duration_since(first_429))
        .filter(|d| *d > Duration::from_millis(250) && *d < Duration::from_millis(1_900))
        .collect();
    assert!(
        quiet.is_empty(),
        "held route reached during the hold: {quiet:?}"
    );
    let oks = ok_per_key(&calls);
    assert_eq!(
        held_calls.iter().filter(|c| c.status < 300).count(),
        10,
        "each held delivery completed once"
    );
    assert!(oks.values().all(|n| *n == 1), "{oks:?}");
    let dlq = redis.cli(&["XLEN", "idemgate-test:dlq:{held}"]);
    assert_eq!(dlq.trim(), "0", "an attempt was spent on a 429");
    let mut held_attempts = 0.0;
    for sc in &scs {
        held_attempts += sc
            .metric("idemgate_delivery_attempts_total{route=\"held\",result=\"held\"}")
            .await;
    }
    assert!(held_attempts >= 1.0);
}

/// 200 deliveries over 20 order values, accepted in a known order through three
/// sidecars, with the application failing a quarter of the requests at random: per
/// order value the application sees them one at a time, in the order accepted, and
/// each completes exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordered_keys_arrive_one_at_a_time_in_order_across_sidecars() {
    let redis = RedisServer::start_new();
    let seed = Arc::new(Mutex::new(0x9e37_79b9_7f4a_7c15_u64));
    let app = ProbeApp::start(move |_| {
        let mut s = seed.lock().unwrap();
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        let fail = s.is_multiple_of(4);
        Reply {
            status: if fail { 500 } else { 200 },
            headers: vec![],
            delay: Duration::from_millis(*s % 6),
        }
    })
    .await;
    let route = async_route(
        ROUTE,
        PATH,
        "order_key = \"json:/data/object/id\"\nbackoff = \"20ms\"\nmax_backoff = \"100ms\"\nmax_attempts = 100\n",
    );
    let scs = sidecars(3, &app, &redis, &[route]).await;
    // Sent one after another (each acknowledged before the next is sent), so the
    // order of acceptance is this order.
    let mut expected: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for seq in 0..200u64 {
        let obj = format!("obj-{}", seq % 20);
        let id = unique_id("ord");
        let body = format!(r#"{{"type":"x","seq":{seq},"data":{{"object":{{"id":"{obj}"}}}}}}"#);
        let a = scs[seq as usize % 3].send(&Delivery::new(&id, body)).await;
        assert_eq!(a.status, 200, "{a:?}");
        expected.entry(obj).or_default().push(seq);
    }
    app.wait_for_ok(200, 120 * SEC).await;
    tokio::time::sleep(SEC / 2).await;
    let mut calls = app.calls();
    calls.sort_by_key(|c| c.arrived);
    let mut per_obj: BTreeMap<String, Vec<&Call>> = BTreeMap::new();
    for c in &calls {
        let v: serde_json::Value = serde_json::from_slice(&c.body).unwrap();
        let obj = v["data"]["object"]["id"].as_str().unwrap().to_string();
        per_obj.entry(obj).or_default().push(c);
    }
    let failed = calls.iter().filter(|c| c.status >= 300).count();
    assert!(
        failed > 10,
        "the application failed too rarely to test anything: {failed}"
    );
    for (obj, cs) in &per_obj {
        let seqs: Vec<u64> = cs
            .iter()
            .map(|c| {
                serde_json::from_slice::<serde_json::Value>(&c.body).unwrap()["seq"]
                    .as_u64()
                    .unwrap()
            })
            .collect();
        assert!(
            seqs.windows(2).all(|w| w[0] <= w[1]),
            "{obj}: out of order: {seqs:?}"
        );
        let ok: Vec<u64> = cs
            .iter()
            .zip(&seqs)
            .filter(|(c, _)| c.status < 300)
            .map(|(_, s)| *s)
            .collect();
        assert_eq!(&ok, &expected[obj], "{obj}: each once, in order");
        for w in cs.windows(2) {
            assert!(w[1].arrived >= w[0].ended, "{obj}: two requests at once");
        }
    }
}

/// A sidecar dies holding the oldest delivery of two order values; the next sidecar's
/// hands fill with their later deliveries, which wait for those: it still takes the
/// dead sidecar's entries over (it does not wait for room), and everything arrives in
/// order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_sidecars_oldest_entries_are_taken_over_with_full_hands() {
    let redis = RedisServer::start_new();
    let app = ProbeApp::start(|_| Reply::ok(Duration::from_millis(1))).await;
    let route = async_route(ROUTE, PATH, "order_key = \"json:/data/object/id\"\n");
    let builder = || {
        SidecarBuilder::new(&app.url(), &redis.url())
            .route(route.clone())
            .extra("[async]\nclaim_idle = \"3s\"")
    };
    let body = |obj: usize, seq: usize| {
        format!(r#"{{"seq":{seq},"data":{{"object":{{"id":"obj-{obj}"}}}}}}"#)
    };
    // The first sidecar takes the two oldest entries while the route is paused, and dies.
    let mut first = builder().start().await;
    redis.cli(&[
        "HSET",
        &format!("idemgate-test:pace:{{{ROUTE}}}"),
        "paused",
        "1",
    ]);
    for obj in 0..2 {
        let a = first
            .send(&Delivery::new(&unique_id("head"), body(obj, 0)))
            .await;
        assert_eq!(a.status, 200);
    }
    let pending = || {
        redis
            .cli(&[
                "XPENDING",
                &format!("idemgate-test:queue:{{{ROUTE}}}"),
                "idemgate",
            ])
            .lines()
            .next()
            .unwrap_or("0")
            .trim()
            .parse::<u64>()
            .unwrap_or(0)
    };
    wait_until(10 * SEC, "the heads read", || pending() == 2).await;
    first.kill9();
    let second = builder().start().await;
    for seq in 1..=20 {
        for obj in 0..2 {
            let a = second
                .send(&Delivery::new(&unique_id("next"), body(obj, seq)))
                .await;
            assert_eq!(a.status, 200);
        }
    }
    redis.cli(&["HDEL", &format!("idemgate-test:pace:{{{ROUTE}}}"), "paused"]);
    app.wait_for_ok(42, 30 * SEC).await;
    let mut calls = app.calls();
    calls.sort_by_key(|c| c.arrived);
    for obj in 0..2 {
        let seqs: Vec<u64> = calls
            .iter()
            .map(|c| serde_json::from_slice::<serde_json::Value>(&c.body).unwrap())
            .filter(|v| v["data"]["object"]["id"] == format!("obj-{obj}"))
            .map(|v| v["seq"].as_u64().unwrap())
            .collect();
        assert_eq!(seqs, (0..=20).collect::<Vec<u64>>(), "obj-{obj}");
    }
}

/// A call that timed out may still run in the application: its concurrency slot stays
/// taken (until it lapses), so `max_concurrency = 1` still means one at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_call_keeps_its_slot() {
    let redis = RedisServer::start_new();
    let first = Arc::new(Mutex::new(true));
    let app = ProbeApp::start(move |_| {
        let slow = std::mem::replace(&mut *first.lock().unwrap(), false);
        Reply::ok(if slow {
            3 * SEC
        } else {
            Duration::from_millis(1)
        })
    })
    .await;
    let route = async_route(ROUTE, PATH, "max_concurrency = 1\nbackoff = \"100ms\"\n");
    let sc = SidecarBuilder::new(&app.url(), &redis.url())
        .route(route)
        .top("upstream_timeout", "1s")
        .start()
        .await;
    for _ in 0..2 {
        assert_eq!(sc.send(&Delivery::fresh()).await.status, 200);
    }
    app.wait_for_ok(2, 30 * SEC).await;
    assert_eq!(
        app.most_at_once(),
        1,
        "a request started beside a timed-out one"
    );
}

/// `Retry-After: 0` (or a date in the past) holds the route for at least `backoff`:
/// the uncounted attempts do not become a loop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_zero_is_not_a_loop() {
    let redis = RedisServer::start_new();
    let start: Arc<Mutex<Option<Instant>>> = Arc::default();
    let s = start.clone();
    let app = ProbeApp::start(move |_| {
        let t = *s.lock().unwrap().get_or_insert_with(Instant::now);
        if t.elapsed() < 2 * SEC {
            Reply {
                status: 503,
                headers: vec![("retry-after".into(), "0".into())],
                delay: Duration::ZERO,
            }
        } else {
            Reply::ok(Duration::ZERO)
        }
    })
    .await;
    let route = async_route(ROUTE, PATH, "backoff = \"500ms\"\nmax_attempts = 1\n");
    let sc = sidecars(1, &app, &redis, &[route]).await;
    for _ in 0..3 {
        assert_eq!(sc[0].send(&Delivery::fresh()).await.status, 200);
    }
    app.wait_for_ok(3, 20 * SEC).await;
    let held = app.calls().iter().filter(|c| c.status == 503).count();
    // 3 entries, a hold of 500 ms at least, 2 s of 503s: at most 3 × (2 s / 500 ms + 1).
    assert!(held <= 15, "{held} uncounted attempts in 2 s");
}
