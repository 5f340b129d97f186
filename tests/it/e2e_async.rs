//! End-to-end: async mode (docs/async.md). Real redis-server, real sidecar processes,
//! a recording upstream. What is asserted is what a provider and the application see:
//! the acknowledgement, and every acknowledged delivery reaching the upstream with a
//! 2xx exactly once.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use crate::common::*;
use idemgate::queue::QueueBackend;
use idemgate::store::RedisQueue;
use idemgate::store::{Lifetimes, RedisStore};

const SEC: Duration = Duration::from_secs(1);
const PREFIX: &str = "idemgate-test";

/// The default route in async mode, with `extra` route fields.
fn async_route(extra: &str) -> RouteCfg {
    let mut r = RouteCfg::standard(ROUTE, PATH);
    r.extra = format!("mode = \"async\"\n{extra}");
    r
}

fn sidecar(
    upstream: &str,
    redis: &RedisServer,
    route_extra: &str,
    async_extra: &str,
) -> SidecarBuilder {
    SidecarBuilder::new(upstream, &redis.url())
        .route(async_route(route_extra))
        .extra(&format!("[async]\n{async_extra}"))
}

fn queue_len(redis: &RedisServer) -> u64 {
    redis
        .cli(&["XLEN", &format!("{PREFIX}:queue:{{{ROUTE}}}")])
        .trim()
        .parse()
        .unwrap_or(0)
}

fn dlq_len(redis: &RedisServer) -> u64 {
    redis
        .cli(&["XLEN", &format!("{PREFIX}:dlq:{{{ROUTE}}}")])
        .trim()
        .parse()
        .unwrap_or(0)
}

/// The key's status as its claim record says (src/store/redis/record.rs): `p`
/// processing, `q` queued, `c` completed; no record is released (or never seen).
fn key_status(redis: &RedisServer, id: &str) -> String {
    let tag = redis.cli(&[
        "GETRANGE",
        &format!("{PREFIX}:{{{ROUTE}:{id}}}:claim"),
        "0",
        "0",
    ]);
    match tag.trim() {
        "p" => "processing",
        "q" => "queued",
        "c" => "completed",
        "r" => "replaying",
        _ => "",
    }
    .to_string()
}

async fn wait_status(redis: &RedisServer, id: &str, want: &str, deadline: Duration) {
    let end = std::time::Instant::now() + deadline;
    loop {
        let got = key_status(redis, id);
        if got == want {
            return;
        }
        assert!(
            std::time::Instant::now() < end,
            "key {id}: status {got:?}, want {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Upstream requests per `idempotency-key`.
fn per_key(up: &Upstream) -> HashMap<String, usize> {
    let mut m = HashMap::new();
    for r in up.requests() {
        *m.entry(r.header("idempotency-key").unwrap_or_default())
            .or_insert(0) += 1;
    }
    m
}

fn queue_client(redis: &RedisServer) -> RedisQueue {
    let store = RedisStore::new(
        &redis.url(),
        PREFIX,
        Lifetimes {
            lease: 30 * SEC,
            retention: 3600 * SEC,
        },
        SEC,
    )
    .expect("store");
    RedisQueue::new(store)
}

#[tokio::test]
async fn the_ack_comes_before_the_upstream_answers_and_copies_get_it_again() {
    let redis = RedisServer::start_new();
    let up = Upstream::start().await;
    // The first attempt never gets an answer (the upstream hangs until the timeout);
    // the retry is answered.
    up.push_modes(vec![Mode::Hang]);
    let sc = sidecar(
        &up.url(),
        &redis,
        "ack_status = 202\nack_body = \"success\"\nbackoff = \"100ms\"\n",
        "",
    )
    .top("upstream_timeout", "1s")
    .start()
    .await;

    let d = Delivery::fresh();
    let a = sc.send(&d).await;
    assert_eq!((a.status, a.text().as_str()), (202, "success"), "{a:?}");
    // The upstream has not answered anything yet: the one call it may have received
    // hangs (its mode), so the ack cannot have waited for it.
    assert!(up.count() <= 1);
    up.wait_for_count(1, 10 * SEC).await;
    assert_eq!(
        up.last().header("idempotency-key"),
        Some(format!("{ROUTE}:{}", d.id))
    );
    assert_eq!(key_status(&redis, &d.id), "queued");

    // A copy while it is queued / in delivery: the ack again, no second entry.
    let copy = sc.send(&d).await;
    assert_eq!((copy.status, copy.text().as_str()), (202, "success"));
    assert!(queue_len(&redis) <= 1);

    // The retry is answered: completed, acknowledged, deleted from the queue.
    wait_status(&redis, &d.id, "completed", 15 * SEC).await;
    assert_eq!(up.count(), 2);
    let last = up.last();
    assert_eq!(last.body, d.body);
    assert_eq!(last.path_and_query, PATH);
    wait_until(10 * SEC, "queue empty", || queue_len(&redis) == 0).await;

    // A copy of the completed delivery: the ack again, nothing forwarded or queued.
    let copy = sc.send(&d).await;
    assert_eq!((copy.status, copy.text().as_str()), (202, "success"));
    up.assert_count_stays(2, SEC / 2).await;
    assert_eq!(queue_len(&redis), 0);
    let done = sc
        .metric(&format!(
            "idemgate_delivery_attempts_total{{route=\"{ROUTE}\",result=\"completed\"}}"
        ))
        .await;
    assert_eq!(done, 1.0);
}

#[tokio::test]
async fn deliveries_acknowledged_while_the_upstream_is_down_reach_it_once_it_returns() {
    let redis = RedisServer::start_new();
    let addr = Upstream::unused_addr();
    let sc = sidecar(
        &format!("http://{addr}"),
        &redis,
        "backoff = \"100ms\"\nmax_backoff = \"400ms\"\nmax_attempts = 1000\n",
        "",
    )
    .start()
    .await;

    let ds: Vec<Delivery> = (0..20).map(|_| Delivery::fresh()).collect();
    for d in &ds {
        let a = sc.send(d).await;
        assert_eq!(a.status, 200, "{a:?}");
        assert!(a.body.is_empty());
    }
    // Every one has failed at least once against the absent upstream.
    sc.wait_metric_at_least(
        &format!("idemgate_delivery_attempts_total{{route=\"{ROUTE}\",result=\"failed\"}}"),
        20.0,
    )
    .await;

    let up = Upstream::start_at(addr).await;
    up.wait_for_count(20, 20 * SEC).await;
    up.assert_count_stays(20, SEC).await;
    let got = per_key(&up);
    for d in &ds {
        assert_eq!(got.get(&format!("{ROUTE}:{}", d.id)), Some(&1), "{got:?}");
        wait_status(&redis, &d.id, "completed", 5 * SEC).await;
    }
    wait_until(10 * SEC, "queue empty", || queue_len(&redis) == 0).await;
    assert_eq!(dlq_len(&redis), 0);
}

#[tokio::test]
async fn a_killed_sidecars_entries_are_delivered_by_another() {
    let redis = RedisServer::start_new();
    let up = Upstream::start().await;
    up.set_mode(Mode::Hang);
    let builder = sidecar(
        &up.url(),
        &redis,
        "backoff = \"100ms\"\n",
        "claim_idle = \"1s\"\n",
    )
    .lease("2s")
    .top("upstream_timeout", "30s");
    let mut first = builder.clone().start().await;
    let ds: Vec<Delivery> = (0..5).map(|_| Delivery::fresh()).collect();
    for d in &ds {
        assert_eq!(first.send(d).await.status, 200);
    }
    // All five are in the first sidecar's hands (its calls hang).
    up.wait_for_count(5, 10 * SEC).await;
    first.kill9();
    up.set_mode(Mode::default_ok());

    let second = builder.start().await;
    for d in &ds {
        wait_status(&redis, &d.id, "completed", 20 * SEC).await;
    }
    wait_until(5 * SEC, "the takeover is logged", || {
        second.stderr().contains("took over entries")
    })
    .await;
    wait_until(10 * SEC, "queue empty", || queue_len(&redis) == 0).await;
    // Each was delivered again once (the killed sidecar's calls never got an answer).
    let got = per_key(&up);
    for d in &ds {
        assert_eq!(got.get(&format!("{ROUTE}:{}", d.id)), Some(&2), "{got:?}");
    }
    assert_eq!(up.count(), 10);
}

#[tokio::test]
async fn a_thousand_deliveries_with_copies_across_three_sidecars_arrive_exactly_once() {
    let redis = RedisServer::start_new();
    let up = Upstream::start().await;
    // Every 10th upstream call fails; later calls succeed.
    let modes: Vec<Mode> = (0..1500)
        .map(|i| {
            if i % 10 == 9 {
                Mode::Status(500)
            } else {
                Mode::default_ok()
            }
        })
        .collect();
    up.push_modes(modes);
    let builder = sidecar(
        &up.url(),
        &redis,
        "backoff = \"50ms\"\nmax_backoff = \"200ms\"\n",
        "claim_idle = \"5s\"\n",
    );
    let sidecars = [
        builder.clone().start().await,
        builder.clone().start().await,
        builder.start().await,
    ];
    let ds: Vec<Delivery> = (0..1000).map(|_| Delivery::fresh()).collect();
    // Firsts, then copies of every third (spread over the other sidecars), 50 at a time.
    let mut sends: Vec<(usize, Delivery)> = ds.iter().cloned().enumerate().collect();
    sends.extend(
        ds.iter()
            .cloned()
            .enumerate()
            .filter(|(i, _)| i % 3 == 0)
            .map(|(i, d)| (i + 1, d)),
    );
    for chunk in sends.chunks(50) {
        let handles: Vec<_> = chunk
            .iter()
            .map(|(i, d)| sidecars[i % 3].send_spawned(d))
            .collect();
        for h in handles {
            let a = h.await.unwrap();
            // A copy may meet its first between claim and queue (409), never a failure.
            assert!(a.status == 200 || a.status == 409, "{a:?}");
        }
    }
    for d in &ds {
        wait_status(&redis, &d.id, "completed", 60 * SEC).await;
    }
    wait_until(20 * SEC, "queue empty", || queue_len(&redis) == 0).await;
    let total = up.count();
    let failed = (0..total).filter(|i| i % 10 == 9).count();
    assert_eq!(total - failed, 1000, "2xx answers: one per delivery");
    let got = per_key(&up);
    let keys: HashSet<String> = ds.iter().map(|d| format!("{ROUTE}:{}", d.id)).collect();
    assert_eq!(got.keys().cloned().collect::<HashSet<_>>(), keys);
    assert_eq!(dlq_len(&redis), 0);
}

#[tokio::test]
async fn exhausted_entries_are_dead_lettered_and_redrive_delivers_them() {
    let redis = RedisServer::start_new();
    let up = Upstream::start().await;
    up.set_mode(Mode::Status(500));
    let sc = sidecar(
        &up.url(),
        &redis,
        "max_attempts = 3\nbackoff = \"50ms\"\n",
        "",
    )
    .start()
    .await;
    let d = Delivery::fresh();
    assert_eq!(sc.send(&d).await.status, 200);
    sc.wait_metric(
        &format!("idemgate_dead_letters_total{{route=\"{ROUTE}\"}}"),
        1.0,
    )
    .await;
    assert_eq!(up.count(), 3);
    assert_eq!(dlq_len(&redis), 1);
    assert_eq!(queue_len(&redis), 0);
    sc.wait_metric(
        &format!("idemgate_dead_letter_size{{route=\"{ROUTE}\"}}"),
        1.0,
    )
    .await;

    let q = queue_client(&redis);
    let page = q.list_dead_letters(ROUTE, 10, None).await.unwrap();
    assert_eq!(page.items.len(), 1);
    let dead = &page.items[0];
    assert_eq!(dead.entry.key, d.id);
    assert_eq!(dead.entry.body, d.body);
    assert_eq!(dead.attempts, 3);
    assert!(dead.last_error.contains("500"), "{dead:?}");

    up.set_mode(Mode::default_ok());
    assert!(q.redrive(ROUTE, &dead.id).await.unwrap());
    assert!(!q.redrive(ROUTE, &dead.id).await.unwrap(), "redriven twice");
    wait_status(&redis, &d.id, "completed", 10 * SEC).await;
    assert_eq!(up.count(), 4);
    assert_eq!(dlq_len(&redis), 0);
    wait_until(10 * SEC, "queue empty", || queue_len(&redis) == 0).await;
}

#[tokio::test]
async fn a_full_queue_answers_503_and_copies_are_acknowledged_without_a_second_entry() {
    let redis = RedisServer::start_new();
    let up = Upstream::start().await;
    up.set_mode(Mode::Hang);
    let sc = sidecar(&up.url(), &redis, "", "max_queue = 3\n")
        .top("upstream_timeout", "30s")
        .start()
        .await;
    let ds: Vec<Delivery> = (0..3).map(|_| Delivery::fresh()).collect();
    for d in &ds {
        assert_eq!(sc.send(d).await.status, 200);
    }
    let full = sc.send(&Delivery::fresh()).await;
    full.assert_error(503, "queue_full");
    assert!(full.retry_after() >= 1);
    assert_eq!(queue_len(&redis), 3);
    // Copies of queued deliveries: acknowledged, never a second entry (nor a 503).
    for d in &ds {
        assert_eq!(sc.send(d).await.status, 200);
    }
    assert_eq!(queue_len(&redis), 3);
    assert_eq!(sc.requests_total(ROUTE, "queue_full").await, 1.0);
    assert_eq!(sc.requests_total(ROUTE, "queued").await, 3.0);
    assert_eq!(sc.requests_total(ROUTE, "replayed").await, 3.0);
}

#[tokio::test]
async fn the_memory_store_runs_async_routes_in_process() {
    let up = Upstream::start().await;
    up.push_modes(vec![Mode::Status(503)]);
    let sc = SidecarBuilder::new(&up.url(), "memory")
        .route(async_route("backoff = \"50ms\"\n"))
        .start()
        .await;
    let d = Delivery::fresh();
    assert_eq!(sc.send(&d).await.status, 200);
    up.wait_for_count(2, 10 * SEC).await;
    assert_eq!(sc.send(&d).await.status, 200);
    up.assert_count_stays(2, SEC / 2).await;
    assert_eq!(per_key(&up).get(&format!("{ROUTE}:{}", d.id)), Some(&2));
}

#[tokio::test]
async fn sigterm_finishes_the_call_in_hand_and_leaves_retries_pending() {
    let redis = RedisServer::start_new();
    let up = Upstream::start().await;
    // The first delivery's call is slow but answered; the second fails and waits for
    // a retry far away.
    up.push_modes(vec![
        Mode::Stall(Duration::from_millis(1500)),
        Mode::Status(500),
    ]);
    let mut sc = sidecar(
        &up.url(),
        &redis,
        "backoff = \"1h\"\nmax_backoff = \"1h\"\n",
        "",
    )
    .start()
    .await;
    let slow = Delivery::fresh();
    assert_eq!(sc.send(&slow).await.status, 200);
    up.wait_for_count(1, 10 * SEC).await;
    let failing = Delivery::fresh();
    assert_eq!(sc.send(&failing).await.status, 200);
    up.wait_for_count(2, 10 * SEC).await;
    sc.sigterm();
    let status = sc.wait_exit(10 * SEC).await;
    assert!(status.success(), "{status:?}\n{}", sc.stderr());
    // The call in hand finished and was recorded; the one waiting for its retry is
    // still in the queue, pending, for another consumer.
    assert_eq!(key_status(&redis, &slow.id), "completed");
    assert_eq!(key_status(&redis, &failing.id), "queued");
    assert_eq!(queue_len(&redis), 1);
}

#[tokio::test]
async fn a_live_workers_slow_delivery_is_neither_taken_over_nor_forwarded_twice() {
    let redis = RedisServer::start_new();
    let up = Upstream::start().await;
    up.push_modes(vec![Mode::Stall(Duration::from_secs(3))]);
    let builder = sidecar(&up.url(), &redis, "", "claim_idle = \"1s\"\n")
        .lease("1s")
        .store_opt("timeout", "500ms")
        .top("upstream_timeout", "10s");
    let a = builder.clone().start().await;
    let b = builder.start().await;
    let d = Delivery::fresh();
    assert_eq!(a.send(&d).await.status, 200);
    wait_status(&redis, &d.id, "completed", 15 * SEC).await;
    up.assert_count_stays(1, SEC).await;
    // The holder refreshed its entry (claim_idle 1s < the 3s call): nobody took it over.
    for sc in [&a, &b] {
        assert!(
            !sc.stderr().contains("took over entries"),
            "{}",
            sc.stderr()
        );
    }
}

#[tokio::test]
async fn async_routes_work_on_a_redis_cluster() {
    let cluster = crate::common::cluster::RedisCluster::start(3, 0);
    let up = Upstream::start().await;
    up.push_modes(vec![Mode::Status(500); 3]);
    let builder = SidecarBuilder::new(&up.url(), &cluster.url())
        .route(async_route("backoff = \"50ms\"\n"))
        .extra("[async]\nclaim_idle = \"5s\"\n");
    let scs = [builder.clone().start().await, builder.start().await];
    let ds: Vec<Delivery> = (0..30).map(|_| Delivery::fresh()).collect();
    for (i, d) in ds.iter().enumerate() {
        assert_eq!(scs[i % 2].send(d).await.status, 200);
    }
    for (i, d) in ds.iter().enumerate() {
        assert_eq!(scs[(i + 1) % 2].send(d).await.status, 200, "copy");
    }
    // 3 failed calls, then one 2xx per delivery.
    up.wait_for_count(33, 20 * SEC).await;
    up.assert_count_stays(33, SEC).await;
    let got = per_key(&up);
    let keys: HashSet<String> = ds.iter().map(|d| format!("{ROUTE}:{}", d.id)).collect();
    assert_eq!(got.keys().cloned().collect::<HashSet<_>>(), keys);
    let series =
        format!("idemgate_delivery_attempts_total{{route=\"{ROUTE}\",result=\"completed\"}}");
    let completed = scs[0].metric(&series).await + scs[1].metric(&series).await;
    assert_eq!(completed, 30.0);
}

/// A worker whose completion was not recorded (its claim on the key was lost while
/// the upstream call ran) leaves the entry pending instead of acknowledging it: the
/// entry is taken over and delivered again, and the key ends `completed`, not
/// `queued` with no entry behind it.
#[tokio::test]
async fn an_entry_whose_completion_was_not_recorded_is_not_acknowledged() {
    let redis = RedisServer::start_new();
    let up = Upstream::start().await;
    up.push_modes(vec![Mode::Stall(Duration::from_secs(2))]);
    let sc = sidecar(
        &up.url(),
        &redis,
        "backoff = \"100ms\"\n",
        "claim_idle = \"1s\"\n",
    )
    .start()
    .await;
    let d = Delivery::fresh();
    assert_eq!(sc.send(&d).await.status, 200);
    up.wait_for_count(1, 10 * SEC).await;
    // While the call runs, someone else holds the key's claim: the worker's
    // completion is refused (not the owner).
    let lock = format!("{PREFIX}:{{{ROUTE}:{}}}:lock", d.id);
    redis.cli(&["SET", &lock, "someone-else", "PX", "3000"]);
    wait_status(&redis, &d.id, "completed", 20 * SEC).await;
    wait_until(10 * SEC, "queue empty", || queue_len(&redis) == 0).await;
    assert_eq!(up.count(), 2, "the unrecorded delivery is forwarded again");
}

/// A dead letter older than `max_age` is delivered when redriven: its age counts from
/// the redrive, so the worker forwards it instead of burying it again at once.
#[tokio::test]
async fn a_dead_letter_older_than_max_age_is_delivered_when_redriven() {
    let redis = RedisServer::start_new();
    let up = Upstream::start().await;
    up.set_mode(Mode::Status(500));
    let route = "max_attempts = 2\nbackoff = \"50ms\"\nmax_age = \"1s\"\n";
    let sc = sidecar(&up.url(), &redis, route, "").start().await;
    let d = Delivery::fresh();
    assert_eq!(sc.send(&d).await.status, 200);
    wait_until(10 * SEC, "dead-lettered", || dlq_len(&redis) == 1).await;
    assert_eq!(up.count(), 2);
    // Let the dead letter grow older than max_age, then redrive it.
    tokio::time::sleep(1200 * Duration::from_millis(1)).await;
    up.set_mode(Mode::default_ok());
    let q = queue_client(&redis);
    let page = q.list_dead_letters(ROUTE, 10, None).await.unwrap();
    assert!(q.redrive(ROUTE, &page.items[0].id).await.unwrap());
    wait_status(&redis, &d.id, "completed", 10 * SEC).await;
    assert_eq!(up.count(), 3);
    assert_eq!(dlq_len(&redis), 0);
    wait_until(10 * SEC, "queue empty", || queue_len(&redis) == 0).await;
}

/// A copy sent after `retention` while the first copy's entry still waits (backing off
/// against a failing application) is acknowledged, not queued and forwarded again:
/// the `queued` status lives as long as its entry may be delivered. `store` is a
/// Redis URL or "memory".
async fn a_copy_after_retention_is_not_queued_again(store: &str, redis: Option<&RedisServer>) {
    let up = Upstream::start().await;
    up.set_mode(Mode::Status(500));
    let sc = SidecarBuilder::new(&up.url(), store)
        .route(async_route("backoff = \"20s\"\n").tolerance("2s"))
        .dedup("retention", "3s")
        .lease("2s")
        .top("upstream_timeout", "1s")
        .start()
        .await;
    let d = Delivery::fresh();
    assert_eq!(sc.send(&d).await.status, 200);
    up.wait_for_count(1, 10 * SEC).await;
    // The entry now waits 10 to 20 s for its retry; let retention (3 s) pass.
    tokio::time::sleep(3500 * Duration::from_millis(1)).await;
    let copy = Delivery::new(&d.id, d.body.clone());
    assert_eq!(sc.send(&copy).await.status, 200);
    up.assert_count_stays(1, SEC).await;
    if let Some(redis) = redis {
        assert_eq!(queue_len(redis), 1, "the copy was queued a second time");
    }
}

#[tokio::test]
async fn a_copy_after_retention_is_not_queued_again_on_redis() {
    let redis = RedisServer::start_new();
    a_copy_after_retention_is_not_queued_again(&redis.url(), Some(&redis)).await;
}

#[tokio::test]
async fn a_copy_after_retention_is_not_queued_again_on_the_memory_store() {
    a_copy_after_retention_is_not_queued_again("memory", None).await;
}

/// How often Redis ran `command` (scripts' commands included).
fn calls(redis: &RedisServer, command: &str) -> u64 {
    redis
        .cli(&["INFO", "commandstats"])
        .lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:")))
        .and_then(|rest| rest.split(',').find_map(|kv| kv.strip_prefix("calls=")))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// An unpaced, unordered route's entries start on the admission of the batch read
/// that took them (it saw the route open) and are acknowledged by later batch reads:
/// every delivery arrives once and the queue empties, with no pacing admission per
/// entry (each runs `TIME`; the once-a-second sampler's route state runs one too).
#[tokio::test]
async fn an_unpaced_routes_entries_need_no_admission_of_their_own() {
    let redis = RedisServer::start_new();
    let up = Upstream::start().await;
    let sc = sidecar(&up.url(), &redis, "", "").start().await;
    assert_eq!(sc.send(&Delivery::fresh()).await.status, 200);
    up.wait_for_count(1, 10 * SEC).await;
    let (times, started) = (calls(&redis, "time"), std::time::Instant::now());
    let n = 20;
    for _ in 0..n {
        assert_eq!(sc.send(&Delivery::fresh()).await.status, 200);
    }
    up.wait_for_count(n + 1, 10 * SEC).await;
    wait_until(10 * SEC, "the queue to empty", || queue_len(&redis) == 0).await;
    let sampled = started.elapsed().as_secs() + 2;
    let ran = calls(&redis, "time") - times;
    assert!(
        ran <= sampled,
        "{ran} TIME calls for {n} deliveries in {sampled} s: an admission per entry"
    );
    assert_eq!(up.count(), n + 1, "each delivered once");
}
