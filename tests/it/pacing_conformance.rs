//! The pacing state (pause, Retry-After holds, the token bucket, concurrency slots,
//! per-order-value order) and the bulk jobs' storage, one suite run against every
//! store: Redis on a private `redis-server` (where two handles stand for two sidecars
//! sharing it), a three-master Redis Cluster, and the in-process queue. Each case is written once, generic over
//! `QueueBackend`, and instantiated for both by the macro at the bottom.

use std::time::{Duration, Instant};

use crate::common::RedisServer;
use idemgate::queue::{QueueBackend, QueueEntry};
use idemgate::store::jobs::{Created, JobRecord, JobState, Mark};
use idemgate::store::pacing::{Admit, Ask, Pacing};
use idemgate::store::{Lifetimes, MemoryQueue, MemoryStore, RedisQueue, RedisStore, unix_millis};

const ROUTE: &str = "wh";
const SLOT_TTL: Duration = Duration::from_secs(30);

fn lifetimes() -> Lifetimes {
    Lifetimes {
        lease: Duration::from_secs(30),
        retention: Duration::from_secs(3600),
    }
}

fn redis_queue() -> (RedisQueue, Option<RedisServer>) {
    let redis = RedisServer::start_new();
    let store =
        RedisStore::new(&redis.url(), "pc", lifetimes(), Duration::from_secs(2)).expect("store");
    (RedisQueue::new(store), Some(redis))
}

/// A three-master Redis Cluster: a route's keys (queue, pacing, order lists) and a
/// job's keys each share one slot, the jobs' index lives elsewhere.
fn cluster_queue() -> (RedisQueue, crate::common::cluster::RedisCluster) {
    let cluster = crate::common::cluster::RedisCluster::start(3, 0);
    let store =
        RedisStore::new(&cluster.url(), "pc", lifetimes(), Duration::from_secs(2)).expect("store");
    (RedisQueue::new(store), cluster)
}

fn memory_queue() -> (MemoryQueue, Option<RedisServer>) {
    (MemoryQueue::new(MemoryStore::new(lifetimes())), None)
}

fn ask<'a>(slot: &'a str) -> Ask<'a> {
    Ask {
        slot,
        order: None,
        max_concurrency: 0,
        rate: 0.0,
        burst: 1.0,
        slot_ttl: SLOT_TTL,
    }
}

/// An ordered entry's ask.
fn ordered<'a>(order: &'a str, id: &'a str) -> Ask<'a> {
    Ask {
        order: Some((order, id)),
        ..ask("o")
    }
}

fn entry(key: &str, order: Option<&str>) -> QueueEntry {
    QueueEntry {
        order: order.map(str::to_string),
        ..crate::queue_conformance::entry(key, unix_millis())
    }
}

/// Paused: nothing starts; resumed: it does. A hold answers how long it still lasts,
/// a shorter hold does not cut a longer one, and the hold ends on its own.
async fn pause_and_hold_stop_every_start<Q: QueueBackend>(q: Q) {
    assert_eq!(q.admit(ROUTE, ask("a")).await.unwrap(), Admit::Go);
    q.set_paused(ROUTE, true).await.unwrap();
    assert_eq!(q.admit(ROUTE, ask("a")).await.unwrap(), Admit::Paused);
    assert!(q.route_state(ROUTE).await.unwrap().paused);
    // Another route is not paused.
    assert_eq!(q.admit("other", ask("a")).await.unwrap(), Admit::Go);
    q.set_paused(ROUTE, false).await.unwrap();
    assert!(!q.route_state(ROUTE).await.unwrap().paused);
    assert_eq!(q.admit(ROUTE, ask("a")).await.unwrap(), Admit::Go);

    q.hold(ROUTE, Duration::from_millis(600)).await.unwrap();
    q.hold(ROUTE, Duration::from_millis(100)).await.unwrap();
    match q.admit(ROUTE, ask("a")).await.unwrap() {
        Admit::Held(d) => assert!(
            d > Duration::from_millis(300) && d <= Duration::from_millis(600),
            "{d:?}"
        ),
        other => panic!("held expected, got {other:?}"),
    }
    let held = q.route_state(ROUTE).await.unwrap().held_for;
    assert!(
        held.is_some_and(|d| d > Duration::from_millis(300)),
        "{held:?}"
    );
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(q.admit(ROUTE, ask("a")).await.unwrap(), Admit::Go);
    assert_eq!(q.route_state(ROUTE).await.unwrap().held_for, None);
}

/// At most `max_concurrency` slots at once; a slot given back frees one, and a slot
/// its holder never gives back lapses.
async fn concurrency_slots_bound_starts<Q: QueueBackend>(q: Q) {
    let bounded = |slot| Ask {
        max_concurrency: 2,
        slot_ttl: Duration::from_millis(400),
        ..ask(slot)
    };
    assert_eq!(q.admit(ROUTE, bounded("s1")).await.unwrap(), Admit::Go);
    assert_eq!(q.admit(ROUTE, bounded("s2")).await.unwrap(), Admit::Go);
    assert_eq!(q.admit(ROUTE, bounded("s3")).await.unwrap(), Admit::Busy);
    assert_eq!(q.route_state(ROUTE).await.unwrap().in_flight, 2);
    q.leave(ROUTE, "s1").await.unwrap();
    assert_eq!(q.admit(ROUTE, bounded("s3")).await.unwrap(), Admit::Go);
    assert_eq!(q.admit(ROUTE, bounded("s4")).await.unwrap(), Admit::Busy);
    // s2 and s3 are never given back (their sidecar died): they lapse.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(q.admit(ROUTE, bounded("s4")).await.unwrap(), Admit::Go);
}

/// The token bucket: `burst` starts at once, then one per `1/rate`; the wait it
/// answers is how long until the next token.
async fn the_bucket_holds_rate_and_burst<Q: QueueBackend>(q: Q) {
    let paced = |slot| Ask {
        rate: 10.0,
        burst: 3.0,
        ..ask(slot)
    };
    let start = Instant::now();
    for _ in 0..3 {
        assert_eq!(q.admit(ROUTE, paced("x")).await.unwrap(), Admit::Go);
    }
    let wait = match q.admit(ROUTE, paced("x")).await.unwrap() {
        Admit::Wait(d) => d,
        other => panic!("an empty bucket answers wait, got {other:?}"),
    };
    assert!(wait <= Duration::from_millis(100), "{wait:?}");
    // Over 1 s from the first start, at most rate × 1 + burst = 13 start.
    let mut started = 3;
    while start.elapsed() < Duration::from_secs(1) {
        match q.admit(ROUTE, paced("x")).await.unwrap() {
            Admit::Go => started += 1,
            Admit::Wait(d) => tokio::time::sleep(d.min(Duration::from_millis(20))).await,
            other => panic!("{other:?}"),
        }
    }
    assert!((10..=13).contains(&started), "{started} starts in 1 s");
}

/// An ordered entry starts only when every older entry of its order value is done or
/// dead; other order values are not held; a redriven entry goes to the end.
async fn order_values_go_one_at_a_time_in_queue_order<Q: QueueBackend>(q: Q) {
    q.ensure_group(ROUTE).await.unwrap();
    let mut ids = Vec::new();
    for (key, order) in [("a1", "A"), ("b1", "B"), ("a2", "A"), ("a3", "A")] {
        ids.push(
            q.enqueue(ROUTE, &entry(key, Some(order)), 100)
                .await
                .unwrap()
                .unwrap(),
        );
    }
    assert_eq!(
        q.admit(ROUTE, ordered("A", &ids[2])).await.unwrap(),
        Admit::Ordered
    );
    assert_eq!(
        q.admit(ROUTE, ordered("A", &ids[3])).await.unwrap(),
        Admit::Ordered
    );
    assert_eq!(
        q.admit(ROUTE, ordered("B", &ids[1])).await.unwrap(),
        Admit::Go
    );
    assert_eq!(
        q.admit(ROUTE, ordered("A", &ids[0])).await.unwrap(),
        Admit::Go
    );
    // a1 delivered: a2 is next, a3 still waits; a1 itself is gone (another worker's
    // copy of it must not start again).
    q.done(ROUTE, &ids[0], Some("A")).await.unwrap();
    assert_eq!(
        q.admit(ROUTE, ordered("A", &ids[0])).await.unwrap(),
        Admit::Gone
    );
    assert_eq!(
        q.admit(ROUTE, ordered("A", &ids[3])).await.unwrap(),
        Admit::Ordered
    );
    assert_eq!(
        q.admit(ROUTE, ordered("A", &ids[2])).await.unwrap(),
        Admit::Go
    );
    // a2 dead-lettered: a3 proceeds; a2 redriven: it goes after a3.
    let read = q.read_new(ROUTE, "c", 10).await.unwrap();
    let a2 = read.iter().find(|(id, _)| *id == ids[2]).unwrap();
    q.dead_letter(
        ROUTE,
        &ids[2],
        a2.1.as_ref().unwrap(),
        3,
        "upstream answered 500",
    )
    .await
    .unwrap();
    assert_eq!(
        q.admit(ROUTE, ordered("A", &ids[3])).await.unwrap(),
        Admit::Go
    );
    let dead = q.list_dead_letters(ROUTE, 10, None).await.unwrap();
    assert_eq!(dead.items[0].entry.order.as_deref(), Some("A"));
    assert!(q.redrive(ROUTE, &dead.items[0].id).await.unwrap());
    let read = q.read_new(ROUTE, "c", 10).await.unwrap();
    let again = read
        .iter()
        .find(|(_, e)| e.as_ref().unwrap().key == "a2")
        .unwrap();
    assert_eq!(
        q.admit(ROUTE, ordered("A", &again.0)).await.unwrap(),
        Admit::Ordered
    );
    q.done(ROUTE, &ids[3], Some("A")).await.unwrap();
    assert_eq!(
        q.admit(ROUTE, ordered("A", &again.0)).await.unwrap(),
        Admit::Go
    );
}

fn job(id: &str, owner: &str, created: u64) -> JobRecord {
    JobRecord {
        id: id.into(),
        kind: "replay".into(),
        route: ROUTE.into(),
        filter: "{}".into(),
        state: JobState::Running,
        total: 3,
        done: 0,
        failed: 0,
        owner: owner.into(),
        beat: unix_millis(),
        created,
        error: String::new(),
    }
}

/// A job's record, work list, marks and counters; only its owner beats; a stale job is
/// taken over, a live one is not; a failed one only by a restart; each item is marked
/// once and settled once.
async fn jobs_are_marked_once_and_taken_over_when_stale<Q: QueueBackend>(q: Q) {
    let items: Vec<String> = vec!["k1".into(), "k2".into(), "k3".into()];
    q.job_create(&job("j1", "a", 1), &items).await.unwrap();
    q.job_create(&job("j2", "a", 2), &[]).await.unwrap();
    assert_eq!(q.job_items("j1").await.unwrap(), items);
    let list = q.job_list(10).await.unwrap();
    assert_eq!(
        list.iter().map(|j| j.id.as_str()).collect::<Vec<_>>(),
        ["j2", "j1"]
    );
    assert_eq!(q.job_get("nope").await.unwrap(), None);

    assert_eq!(q.job_mark("j1", "a", "k1").await.unwrap(), Mark::Fresh);
    assert_eq!(
        q.job_mark("j1", "a", "k1").await.unwrap(),
        Mark::Seen("started".into())
    );
    q.job_settle("j1", "k1", true, "").await.unwrap();
    q.job_settle("j1", "k1", false, "twice").await.unwrap();
    assert_eq!(
        q.job_mark("j1", "a", "k1").await.unwrap(),
        Mark::Seen("ok".into())
    );
    assert_eq!(q.job_mark("j1", "a", "k2").await.unwrap(), Mark::Fresh);
    q.job_settle("j1", "k2", false, "upstream answered 500")
        .await
        .unwrap();
    let j = q.job_get("j1").await.unwrap().unwrap();
    assert_eq!(
        (j.done, j.failed, j.error.as_str()),
        (1, 1, "upstream answered 500")
    );

    // Only the runner marks.
    assert_eq!(q.job_mark("j1", "b", "k3").await.unwrap(), Mark::Lost);
    // Live: not taken over; only the owner beats.
    let stale = Duration::from_millis(300);
    assert!(!q.job_take("j1", "b", stale, false).await.unwrap());
    assert!(!q.job_beat("j1", "b", None, "").await.unwrap());
    assert!(q.job_beat("j1", "a", None, "").await.unwrap());
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(q.job_take("j1", "b", stale, false).await.unwrap());
    assert!(
        !q.job_take("j1", "c", stale, false).await.unwrap(),
        "b beats now"
    );
    assert!(!q.job_beat("j1", "a", None, "").await.unwrap(), "a lost it");
    assert_eq!(q.job_mark("j1", "a", "k3").await.unwrap(), Mark::Lost);
    assert_eq!(q.job_mark("j1", "b", "k3").await.unwrap(), Mark::Fresh);
    assert!(
        q.job_beat("j1", "b", Some(JobState::Failed), "store down")
            .await
            .unwrap()
    );
    let j = q.job_get("j1").await.unwrap().unwrap();
    assert_eq!(
        (j.state, j.owner.as_str(), j.error.as_str()),
        (JobState::Failed, "b", "store down")
    );
    // Failed: a sweep leaves it, a restart takes it; handed to "" it is stale at once.
    assert!(!q.job_take("j1", "c", stale, false).await.unwrap());
    assert!(q.job_take("j1", "", stale, true).await.unwrap());
    let j = q.job_get("j1").await.unwrap().unwrap();
    assert_eq!((j.state, j.beat), (JobState::Running, 0));
    assert!(q.job_take("j1", "c", stale, false).await.unwrap());
    assert!(
        q.job_beat("j1", "c", Some(JobState::Done), "")
            .await
            .unwrap()
    );
    assert!(
        !q.job_take("j1", "d", stale, true).await.unwrap(),
        "done is done"
    );
}

async fn lock_once<Q: QueueBackend>(
    q: &Q,
    k: &idemgate::store::DeliveryKey,
    id: &str,
) -> (idemgate::store::Token, u64) {
    match q.lock(k, id, Duration::from_secs(60)).await.unwrap() {
        idemgate::queue::Lock::Claimed { token, attempt } => (token, attempt),
        other => panic!("{other:?}"),
    }
}

/// A finished job is listed for `JOB_TTL` after its creation, then forgotten when a new
/// job is created: the listing does not grow with every job ever run.
async fn old_jobs_leave_the_listing<Q: QueueBackend>(q: Q) {
    let eight_days = 8 * 24 * 3600 * 1000;
    let old = JobRecord {
        state: JobState::Done,
        ..job("old", "a", unix_millis() - eight_days)
    };
    q.job_create(&old, &[]).await.unwrap();
    q.job_create(&job("new", "a", unix_millis()), &[])
        .await
        .unwrap();
    let ids: Vec<String> = q
        .job_list(10)
        .await
        .unwrap()
        .into_iter()
        .map(|j| j.id)
        .collect();
    assert_eq!(ids, ["new"]);
}

/// A job created again under its ID (a retried start whose first reply was lost) is
/// the one job: listed once, its work list as first written, not doubled or replaced.
async fn a_job_created_twice_under_one_id_is_one_job<Q: QueueBackend>(q: Q) {
    let items: Vec<String> = vec!["k1".into(), "k2".into()];
    let first = job("twice", "a", unix_millis());
    assert_eq!(q.job_create(&first, &items).await.unwrap(), Created::New);
    let more: Vec<String> = vec!["k1".into(), "k2".into(), "k3".into()];
    assert_eq!(
        q.job_create(&job("twice", "b", unix_millis()), &more)
            .await
            .unwrap(),
        Created::Exists(first.clone())
    );
    assert_eq!(q.job_items("twice").await.unwrap(), items);
    let list = q.job_list(10).await.unwrap();
    assert_eq!(list, [first]);
}

/// A worker's batch read acknowledges (and deletes) the entries it names, reads new
/// ones (none when asked for none), and tells whether the route is open: not while
/// paused, not while held.
async fn a_batch_read_acknowledges_reads_and_tells_if_open<Q: QueueBackend>(q: Q) {
    q.ensure_group(ROUTE).await.unwrap();
    for k in ["a", "b", "c"] {
        q.enqueue(ROUTE, &entry(k, None), 100)
            .await
            .unwrap()
            .unwrap();
    }
    let first = q.read_batch(ROUTE, "w", &[], 2).await.unwrap();
    assert!(first.open, "a route nobody paused or held is open");
    let ids: Vec<String> = first.reads.iter().map(|(id, _)| id.clone()).collect();
    assert_eq!(ids.len(), 2);
    assert_eq!(q.stats(ROUTE).await.unwrap().depth, 3);
    q.set_paused(ROUTE, true).await.unwrap();
    let second = q.read_batch(ROUTE, "w", &ids, 5).await.unwrap();
    assert!(!second.open, "paused");
    assert_eq!(second.reads.len(), 1, "only the entry nobody read");
    assert_eq!(second.reads[0].1.as_ref().unwrap().key, "c");
    let stats = q.stats(ROUTE).await.unwrap();
    assert_eq!(
        (stats.depth, stats.pending),
        (1, 1),
        "the two named are gone"
    );
    q.set_paused(ROUTE, false).await.unwrap();
    assert!(q.read_batch(ROUTE, "w", &[], 0).await.unwrap().open);
    q.enqueue(ROUTE, &entry("d", None), 100)
        .await
        .unwrap()
        .unwrap();
    q.hold(ROUTE, Duration::from_secs(60)).await.unwrap();
    let held = q.read_batch(ROUTE, "w", &[], 0).await.unwrap();
    assert!(!held.open, "held");
    assert!(held.reads.is_empty(), "asked for none");
    assert_eq!(q.stats(ROUTE).await.unwrap().pending, 1);
}

/// An attempt given back with a refund is not counted: the next lock is the same
/// attempt number.
async fn a_refunded_attempt_is_not_counted<Q: QueueBackend>(q: Q) {
    use idemgate::store::DeliveryKey;
    q.ensure_group(ROUTE).await.unwrap();
    let k = DeliveryKey::new(ROUTE, "r1");
    let id = q
        .enqueue(ROUTE, &entry("r1", None), 10)
        .await
        .unwrap()
        .unwrap();
    let (t, n) = lock_once(&q, &k, &id).await;
    assert_eq!(n, 1);
    assert!(q.unlock(&k, t, true).await.unwrap());
    let (t, n) = lock_once(&q, &k, &id).await;
    assert_eq!(n, 1, "the refunded attempt was counted");
    assert!(q.unlock(&k, t, false).await.unwrap());
    let (_, n) = lock_once(&q, &k, &id).await;
    assert_eq!(n, 2);
}

macro_rules! conformance {
    ($($case:ident),* $(,)?) => {
        mod redis_pacing {
            $(
                #[tokio::test]
                async fn $case() {
                    let (q, _redis) = super::redis_queue();
                    super::$case(q).await;
                }
            )*
        }
        mod cluster_pacing {
            $(
                #[tokio::test]
                async fn $case() {
                    let (q, _cluster) = super::cluster_queue();
                    super::$case(q).await;
                }
            )*
        }
        mod memory_pacing {
            $(
                #[tokio::test]
                async fn $case() {
                    let (q, _none) = super::memory_queue();
                    super::$case(q).await;
                }
            )*
        }
        mod file_pacing {
            $(
                #[tokio::test]
                async fn $case() {
                    let f = crate::common::file_store::FileStore::open(super::lifetimes());
                    super::$case(f.queue).await;
                }
            )*
        }
    };
}

conformance!(
    pause_and_hold_stop_every_start,
    concurrency_slots_bound_starts,
    the_bucket_holds_rate_and_burst,
    order_values_go_one_at_a_time_in_queue_order,
    jobs_are_marked_once_and_taken_over_when_stale,
    old_jobs_leave_the_listing,
    a_job_created_twice_under_one_id_is_one_job,
    a_refunded_attempt_is_not_counted,
    a_batch_read_acknowledges_reads_and_tells_if_open,
);

/// Two handles on one Redis stand for two sidecars: a pause, a hold and the slots of
/// one are the other's.
#[tokio::test]
async fn redis_pacing_is_shared_between_sidecars() {
    let redis = RedisServer::start_new();
    let handle = || {
        RedisQueue::new(
            RedisStore::new(&redis.url(), "pc", lifetimes(), Duration::from_secs(2))
                .expect("store"),
        )
    };
    let (a, b) = (handle(), handle());
    a.set_paused(ROUTE, true).await.unwrap();
    assert_eq!(b.admit(ROUTE, ask("x")).await.unwrap(), Admit::Paused);
    b.set_paused(ROUTE, false).await.unwrap();
    a.hold(ROUTE, Duration::from_secs(5)).await.unwrap();
    assert!(matches!(
        b.admit(ROUTE, ask("x")).await.unwrap(),
        Admit::Held(_)
    ));
    redis.cli(&["HDEL", "pc:pace:{wh}", "hold_until"]);
    let one = |slot| Ask {
        max_concurrency: 1,
        ..ask(slot)
    };
    assert_eq!(a.admit(ROUTE, one("a")).await.unwrap(), Admit::Go);
    assert_eq!(b.admit(ROUTE, one("b")).await.unwrap(), Admit::Busy);
}

/// Every key of a job lives a bounded time from its first write, also the item marks
/// of a runner that died before its first heartbeat.
#[tokio::test]
async fn redis_a_jobs_keys_all_expire() {
    use idemgate::store::jobs::Jobs;
    let (q, redis) = redis_queue();
    let redis = redis.unwrap();
    q.job_create(&job("j", "a", unix_millis()), &["k".to_string()])
        .await
        .unwrap();
    assert_eq!(q.job_mark("j", "a", "k").await.unwrap(), Mark::Fresh);
    for key in ["pc:job:{j}", "pc:job:{j}:work", "pc:job:{j}:marks"] {
        let ttl: i64 = redis.cli(&["PTTL", key]).trim().parse().unwrap();
        assert!(ttl > 0, "{key} has no TTL ({ttl})");
    }
}
