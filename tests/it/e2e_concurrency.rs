//! End-to-end: concurrent copies, several replicas on one Redis, crashed and
//! slow claimers, Redis outages and graceful shutdown.

use std::time::{Duration, Instant};

use crate::common::*;

const SEC: Duration = Duration::from_secs(1);

fn answer_mode(body: &str, delay: Duration) -> Mode {
    Mode::Delayed(
        delay,
        Box::new(Mode::Ok {
            status: 201,
            headers: vec![
                ("x-upstream".into(), "yes".into()),
                ("content-type".into(), "application/json".into()),
            ],
            body: body.as_bytes().to_vec(),
        }),
    )
}

/// Every answer must be the first's answer (exactly one, not replayed), a
/// replay of it, or a 409 in_flight with Retry-After.
fn classify(answers: &[Answer], first_body: &str) -> (usize, usize, usize) {
    let (mut originals, mut replays, mut conflicts) = (0, 0, 0);
    for a in answers {
        match a.status {
            201 if !a.replayed() => {
                assert_eq!(a.text(), first_body, "{a:?}");
                originals += 1;
            }
            201 => {
                assert_eq!(
                    a.text(),
                    first_body,
                    "a replay must carry the stored body: {a:?}"
                );
                assert_eq!(a.header("x-upstream").as_deref(), Some("yes"), "{a:?}");
                replays += 1;
            }
            409 => {
                a.assert_error(409, "in_flight");
                assert!(a.retry_after() >= 1, "{a:?}");
                conflicts += 1;
            }
            _ => panic!("unexpected answer to a concurrent copy: {a:?}"),
        }
    }
    assert_eq!(
        originals, 1,
        "exactly one copy must get the upstream's own answer"
    );
    assert_eq!(originals + replays + conflicts, answers.len());
    (originals, replays, conflicts)
}

async fn concurrent_copies(kind: StoreKind) {
    let store = TestStore::new(kind);
    let up = Upstream::start().await;
    up.set_mode(answer_mode(
        r#"{"only":"once"}"#,
        Duration::from_millis(200),
    ));
    let sc = SidecarBuilder::new(&up.url(), &store.url()).start().await;
    let d = Delivery::fresh();
    let handles: Vec<_> = (0..200).map(|_| sc.send_spawned(&d)).collect();
    let mut answers = Vec::new();
    for h in handles {
        answers.push(h.await.expect("delivery task"));
    }
    up.assert_count_stays(1, Duration::from_millis(300)).await;
    let (_, replays, conflicts) = classify(&answers, r#"{"only":"once"}"#);
    eprintln!("{kind:?}: 200 copies -> 1 forwarded, {replays} replayed, {conflicts} x 409");
    assert_eq!(
        up.last().header("idempotency-key"),
        Some(format!("wh:{}", d.id))
    );
    sc.wait_requests_total(ROUTE, "forwarded", 1.0).await;
    sc.wait_requests_total(ROUTE, "replayed", replays as f64)
        .await;
    sc.wait_requests_total(ROUTE, "in_flight", conflicts as f64)
        .await;

    // an upstream that answers at once: copies race the completion itself
    up.set_mode(answer_mode(r#"{"fast":"once"}"#, Duration::ZERO));
    let d = Delivery::fresh();
    let handles: Vec<_> = (0..200).map(|_| sc.send_spawned(&d)).collect();
    let mut answers = Vec::new();
    for h in handles {
        answers.push(h.await.expect("delivery task"));
    }
    up.assert_count_stays(2, Duration::from_millis(300)).await;
    let (_, replays, conflicts) = classify(&answers, r#"{"fast":"once"}"#);
    eprintln!(
        "{kind:?}: 200 copies, fast upstream -> 1 forwarded, {replays} replayed, {conflicts} x 409"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hundred_concurrent_copies_reach_upstream_once_redis() {
    concurrent_copies(StoreKind::Redis).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hundred_concurrent_copies_reach_upstream_once_memory() {
    concurrent_copies(StoreKind::Memory).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_sidecars_on_one_redis_forward_300_copies_once() {
    let redis = RedisServer::start_new();
    let up = Upstream::start().await;
    up.set_mode(answer_mode(
        r#"{"replica":"answer"}"#,
        Duration::from_millis(300),
    ));
    // The replicas run one delivery runtime, 2 and 4 (each its own listener and store
    // connection).
    let mut scs = Vec::new();
    for threads in ["1", "2", "4"] {
        scs.push(
            SidecarBuilder::new(&up.url(), &redis.url())
                .top("worker_threads", threads)
                .start()
                .await,
        );
    }
    let d = Delivery::fresh();
    let handles: Vec<_> = (0..300).map(|i| scs[i % 3].send_spawned(&d)).collect();
    let mut answers = Vec::new();
    for h in handles {
        answers.push(h.await.expect("delivery task"));
    }
    up.assert_count_stays(1, Duration::from_millis(300)).await;
    let (_, replays, conflicts) = classify(&answers, r#"{"replica":"answer"}"#);
    eprintln!("3 replicas: 300 copies -> 1 forwarded, {replays} replayed, {conflicts} x 409");
    // every replica now replays it
    for sc in &scs {
        let a = sc.send(&d).await;
        assert!(a.replayed() && a.status == 201, "{a:?}");
        assert_eq!(a.text(), r#"{"replica":"answer"}"#);
    }
    let mut forwarded = 0.0;
    for sc in &scs {
        forwarded += sc.requests_total(ROUTE, "forwarded").await;
    }
    assert_eq!(forwarded, 1.0, "forwarded summed over replicas");
    assert_eq!(up.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killed_claimer_frees_key_after_lease() {
    let redis = RedisServer::start_new();
    let up = Upstream::start().await;
    up.push_modes(vec![Mode::Hang]);
    // A 3 s lease: renewed every second, so at least 2 s remain at the crash, time
    // enough for the copy right after it on a busy machine.
    let builder = SidecarBuilder::new(&up.url(), &redis.url())
        .lease("3s")
        .store_opt("timeout", "500ms")
        .top("upstream_timeout", "30s");
    let mut a = builder.clone().start().await;
    let b = builder.start().await;
    let d = Delivery::fresh();

    // A claims and calls the (hanging) upstream
    let client = a.client.clone();
    let (url, headers, body) = (a.url(PATH), d.headers(), d.body.clone());
    let _lost = tokio::spawn(async move { post(&client, &url, &headers, body).await });
    up.wait_for_count(1, 5 * SEC).await;
    // A is alive and renewing: B sees the claim
    let c = b.send(&d).await;
    c.assert_error(409, "in_flight");

    a.kill9();
    let killed = Instant::now();
    let c = b.send(&d).await;
    c.assert_error(409, "in_flight"); // the lease still holds right after the crash

    // within `lease` (+ slack) the provider's retry is forwarded by B
    let answer = loop {
        let c = b.send(&d).await;
        if c.status != 409 {
            break c;
        }
        assert!(
            killed.elapsed() < Duration::from_millis(6000),
            "the crashed claimer's key was not freed within lease (3s) + slack"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        answer.status, 200,
        "the retry must be forwarded: {answer:?}"
    );
    assert!(!answer.replayed(), "{answer:?}");
    assert_eq!(up.count(), 2);
    assert_eq!(
        up.last().header("idempotency-key"),
        Some(format!("wh:{}", d.id))
    );
    let r = b.send(&d).await;
    assert!(r.replayed() && r.status == 200, "{r:?}");
    up.assert_count_stays(2, Duration::from_millis(100)).await;
}

async fn slow_upstream_keeps_claim(kind: StoreKind) {
    let store = TestStore::new(kind);
    let up = Upstream::start().await;
    up.push_modes(vec![answer_mode(
        r#"{"slow":"ok"}"#,
        Duration::from_millis(2500),
    )]);
    let builder = SidecarBuilder::new(&up.url(), &store.url())
        .lease("1s")
        .store_opt("timeout", "500ms")
        .top("upstream_timeout", "10s");
    let a = builder.clone().start().await;
    // with Redis, copies go through a second replica: the claim must live in Redis
    let b = match kind {
        StoreKind::Redis => Some(builder.start().await),
        StoreKind::Memory => None,
    };
    let copier = b.as_ref().unwrap_or(&a);
    let d = Delivery::fresh();
    let first = a.send_spawned(&d);
    up.wait_for_count(1, 5 * SEC).await;
    let started = Instant::now();
    let mut conflicts = 0;
    while !first.is_finished() && started.elapsed() < Duration::from_secs(8) {
        let c = copier.send(&d).await;
        if c.status == 409 {
            c.assert_error(409, "in_flight");
            assert!(c.retry_after() >= 1);
            conflicts += 1;
        } else {
            // only possible in the instant the first completes
            assert!(
                c.replayed() && c.status == 201,
                "copy during the call: {c:?}"
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let answer = first.await.unwrap();
    assert_eq!(answer.status, 201, "{answer:?}");
    assert!(!answer.replayed());
    assert!(
        conflicts >= 6,
        "copies during the 2.5 s call (past 2 leases) should all get 409, got {conflicts}"
    );
    up.assert_count_stays(1, Duration::from_millis(200)).await;
    let r = copier.send(&d).await;
    assert!(r.replayed() && r.status == 201, "{r:?}");
    assert_eq!(
        a.metric("idemgate_lease_lost_total{route=\"wh\"}").await,
        0.0,
        "a live claim was lost"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slow_upstream_keeps_claim_through_renewal_redis() {
    slow_upstream_keeps_claim(StoreKind::Redis).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slow_upstream_keeps_claim_through_renewal_memory() {
    slow_upstream_keeps_claim(StoreKind::Memory).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_outage_503_then_recovery_without_restart() {
    let mut redis = RedisServer::start_new();
    let up = Upstream::start().await;
    let mut sc = SidecarBuilder::new(&up.url(), &redis.url())
        .store_opt("timeout", "500ms")
        .start()
        .await;
    sc.wait_readyz(200, 5 * SEC).await;
    assert_eq!(sc.send(&Delivery::fresh()).await.status, 200);
    let pid = sc.pid();

    redis.stop();
    let a = sc.send(&Delivery::fresh()).await;
    a.assert_error(503, "store_unavailable");
    assert!(a.retry_after() >= 1);
    sc.wait_readyz(503, 5 * SEC).await;
    assert_eq!(up.count(), 1);

    redis.start();
    sc.wait_readyz(200, 10 * SEC).await;
    let d = Delivery::fresh();
    // the pool may need a moment to reconnect; poll with a bound
    let end = Instant::now() + 10 * SEC;
    let a = loop {
        let a = sc.send(&d).await;
        if a.status != 503 || Instant::now() >= end {
            break a;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(a.status, 200, "delivery after Redis came back: {a:?}");
    assert!(!a.replayed());
    let r = sc.send(&d).await;
    assert!(r.replayed(), "dedup works again: {r:?}");
    assert_eq!(up.count(), 2);
    assert!(sc.is_running());
    assert_eq!(sc.pid(), pid, "same process");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_finishes_in_flight_delivery_and_exits_0() {
    let up = Upstream::start().await;
    up.push_modes(vec![answer_mode(
        r#"{"finished":true}"#,
        Duration::from_millis(1500),
    )]);
    let mut sc = SidecarBuilder::new(&up.url(), "memory")
        .top("shutdown_grace", "10s")
        .start()
        .await;
    let d = Delivery::fresh();
    let first = sc.send_spawned(&d);
    up.wait_for_count(1, 5 * SEC).await;
    sc.sigterm();
    let termed = Instant::now();

    // it stops accepting: new connections are refused (polled, bounded)
    let end = Instant::now() + 3 * SEC;
    while tokio::net::TcpStream::connect(sc.listen).await.is_ok() {
        assert!(
            Instant::now() < end,
            "still accepting connections 3 s after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let late = Delivery::fresh();
    if let Ok(a) = post(
        &http_client(),
        &sc.url(PATH),
        &late.headers(),
        late.body.clone(),
    )
    .await
    {
        panic!("a delivery after SIGTERM got an answer: {a:?}");
    }
    assert!(
        !first.is_finished(),
        "the in-flight delivery should still be running"
    );

    let a = first.await.unwrap();
    assert_eq!(a.status, 201, "the in-flight delivery completes: {a:?}");
    assert_eq!(a.text(), r#"{"finished":true}"#);
    let st = sc.wait_exit(8 * SEC).await;
    assert_eq!(st.code(), Some(0), "exit status {st:?}\n{}", sc.stderr());
    assert!(
        termed.elapsed() < Duration::from_secs(8),
        "exited well before the grace period ran out"
    );
    assert_eq!(up.count(), 1, "the late delivery must not be forwarded");
}
