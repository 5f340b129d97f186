//! One queue conformance suite, run against both queues: Redis Streams on a private
//! `redis-server`, and the in-process queue beside the memory store. Each case is
//! written once, generic over `QueueBackend`, and instantiated for both by the
//! `conformance!` macro at the bottom, so the two cannot drift.

use std::collections::HashSet;
use std::time::Duration;

use crate::common::monitor::Monitor;
use crate::common::{REPLAY, RedisServer};
use bytes::Bytes;
use idemgate::providers::fingerprint_body;
use idemgate::queue::{Lock, QueueBackend, QueueEntry};
use idemgate::store::MemoryQueue;
use idemgate::store::RedisQueue;
use idemgate::store::{
    Claim, DeliveryKey, Lifetimes, MemoryStore, RedisStore, RouteLifetimes, Store, unix_millis,
};

const ROUTE: &str = "wh";
const DAY: Duration = Duration::from_secs(24 * 3600);

fn lifetimes(retention: Duration) -> Lifetimes {
    Lifetimes {
        lease: Duration::from_secs(30),
        retention,
    }
}

/// Claims (a worker's, an operator's replay) lapse after 1.5 s: within a case, and not
/// between the few calls a case makes with a live one on a busy machine.
const SHORT_LEASE: Lifetimes = Lifetimes {
    lease: Duration::from_millis(1500),
    retention: DAY,
};

/// An unordered entry of `key` (the pacing suite orders its own).
pub(crate) fn entry(key: &str, received_at: u64) -> QueueEntry {
    QueueEntry {
        key: key.into(),
        method: "POST".into(),
        path: "/wh".into(),
        headers: Bytes::new(),
        body: Bytes::from_static(b"{}"),
        received_at,
        order: None,
    }
}

/// A queue and the store it shares keys with.
struct Fixture<Q, S> {
    queue: Q,
    store: S,
    _redis: Option<RedisServer>,
}

fn redis_fixture(lifetimes: impl Into<RouteLifetimes>) -> Fixture<RedisQueue, RedisStore> {
    let redis = RedisServer::start_new();
    let store =
        RedisStore::new(&redis.url(), "qc", lifetimes, Duration::from_secs(2)).expect("store");
    Fixture {
        queue: RedisQueue::new(store.clone()),
        store,
        _redis: Some(redis),
    }
}

fn memory_fixture(lifetimes: impl Into<RouteLifetimes>) -> Fixture<MemoryQueue, MemoryStore> {
    let store = MemoryStore::new(lifetimes);
    Fixture {
        queue: MemoryQueue::new(store.clone()),
        store,
        _redis: None,
    }
}

/// Claims `k` as a provider's first copy would, queues its entry and marks it queued.
async fn accept<Q: QueueBackend, S: Store>(f: &Fixture<Q, S>, k: &DeliveryKey, keep: Duration) {
    let Claim::Claimed(token) = f
        .store
        .claim(k, &fingerprint_body(b"{}"), None)
        .await
        .unwrap()
    else {
        panic!("first claim of {k:?}")
    };
    let e = entry(&k.key, unix_millis());
    assert!(f.queue.enqueue(ROUTE, &e, 1000).await.unwrap().is_some());
    assert!(f.queue.mark_queued(k, token, keep).await.unwrap());
}

/// A 2xx answer, as a worker records it.
fn ok() -> idemgate::store::StoredResponse {
    idemgate::store::StoredResponse {
        status: 200,
        headers: Bytes::new(),
        body: Bytes::from_static(b"ok"),
    }
}

fn ids(reads: &[(String, Option<QueueEntry>)]) -> Vec<String> {
    reads.iter().map(|(id, _)| id.clone()).collect()
}

/// A dead letter that died of `max_age` is redriven with its age restarted: the
/// worker measures `max_age` from the redrive, so it is forwarded, not buried again.
async fn redrive_restarts_the_age_of_an_old_entry<Q: QueueBackend, S: Store>(f: Fixture<Q, S>) {
    let old = unix_millis() - 2 * DAY.as_millis() as u64;
    let q = &f.queue;
    q.enqueue(ROUTE, &entry("old", old), 10).await.unwrap();
    let read = q.read_new(ROUTE, "c1", 10).await.unwrap();
    let (id, e) = (&read[0].0, read[0].1.clone().unwrap());
    q.dead_letter(ROUTE, id, &e, 1, "max_age (1day) exceeded")
        .await
        .unwrap();
    let dead = q.list_dead_letters(ROUTE, 10, None).await.unwrap();
    let before = unix_millis();
    assert!(q.redrive(ROUTE, &dead.items[0].id).await.unwrap());
    let read = q.read_new(ROUTE, "c1", 10).await.unwrap();
    let again = read[0].1.clone().unwrap();
    assert!(
        again.received_at >= before,
        "a redriven entry keeps its old age: received_at {} < redrive {before}",
        again.received_at
    );
    assert_eq!((again.key, again.body), (e.key, e.body));
}

/// A redriven entry starts again at attempt 1, whatever its key's count was.
async fn a_redriven_entry_starts_again_at_attempt_one<Q: QueueBackend, S: Store>(f: Fixture<Q, S>) {
    let k = DeliveryKey::new(ROUTE, "k1");
    accept(&f, &k, DAY).await;
    let q = &f.queue;
    let read = q.read_new(ROUTE, "c1", 10).await.unwrap();
    let (id, e) = (read[0].0.clone(), read[0].1.clone().unwrap());
    let mut last = None;
    for n in 1..=3 {
        let Lock::Claimed { token, attempt } = q.lock(&k, &id, DAY).await.unwrap() else {
            panic!("lock {n}")
        };
        assert_eq!(attempt, n);
        last = Some(token);
        if n < 3 {
            assert!(q.unlock(&k, token, false).await.unwrap());
        }
    }
    q.dead_letter(ROUTE, &id, &e, 3, "upstream answered 500")
        .await
        .unwrap();
    assert!(q.release(&k, last.unwrap()).await.unwrap());
    let dead = q.list_dead_letters(ROUTE, 10, None).await.unwrap();
    assert!(q.redrive(ROUTE, &dead.items[0].id).await.unwrap());
    assert!(!q.redrive(ROUTE, &dead.items[0].id).await.unwrap());
    let read = q.read_new(ROUTE, "c2", 10).await.unwrap();
    let Lock::Claimed { attempt, .. } = q.lock(&k, &read[0].0, DAY).await.unwrap() else {
        panic!("lock after redrive")
    };
    assert_eq!(attempt, 1, "a redriven entry sees the old attempt count");
}

/// A dead consumer's entries behind many live entries (held and refreshed by a live
/// consumer, e.g. backing off) are taken over within a few rounds: each takeover
/// continues where the previous one stopped.
async fn takeover_reaches_a_dead_consumers_entries_behind_live_ones<Q: QueueBackend, S: Store>(
    f: Fixture<Q, S>,
) {
    let q = &f.queue;
    for i in 0..64 {
        q.enqueue(ROUTE, &entry(&format!("e{i}"), unix_millis()), 100)
            .await
            .unwrap();
    }
    let live = ids(&q.read_new(ROUTE, "live", 60).await.unwrap());
    let dead: HashSet<String> = ids(&q.read_new(ROUTE, "dead", 4).await.unwrap())
        .into_iter()
        .collect();
    assert_eq!((live.len(), dead.len()), (60, 4));
    // Long enough that the live consumer's refresh just before each round keeps its
    // entries well inside it, even on a busy machine.
    let idle = Duration::from_millis(800);
    let mut taken = HashSet::new();
    for _round in 0..5 {
        tokio::time::sleep(idle + Duration::from_millis(50)).await;
        q.keep(ROUTE, "live", &live).await.unwrap();
        for id in ids(&q.take_over(ROUTE, "third", idle, 4).await.unwrap()) {
            assert!(
                dead.contains(&id),
                "a live consumer's entry {id} was taken over"
            );
            taken.insert(id);
        }
        if taken == dead {
            return;
        }
    }
    panic!(
        "after 5 rounds only {} of the dead consumer's 4 entries were taken over",
        taken.len()
    );
}

/// A consumer refreshing its entries in hand does not refresh (or take back) one that
/// another consumer took over from it meanwhile.
async fn keep_leaves_an_entry_taken_over_by_another_alone<Q: QueueBackend, S: Store>(
    f: Fixture<Q, S>,
) {
    let q = &f.queue;
    q.enqueue(ROUTE, &entry("k", unix_millis()), 10)
        .await
        .unwrap();
    let held = ids(&q.read_new(ROUTE, "a", 10).await.unwrap());
    let idle = Duration::from_millis(400);
    tokio::time::sleep(idle + Duration::from_millis(50)).await;
    // `a` stalled: `b` takes the entry over, then stalls too.
    assert_eq!(ids(&q.take_over(ROUTE, "b", idle, 10).await.unwrap()), held);
    tokio::time::sleep(Duration::from_millis(250)).await;
    // `a` wakes up and refreshes what it thinks it holds.
    q.keep(ROUTE, "a", &held).await.unwrap();
    tokio::time::sleep(Duration::from_millis(250)).await;
    // `b`'s hold is now older than `idle`: a third consumer takes the entry over,
    // unless `a`'s refresh took it back.
    assert_eq!(
        ids(&q.take_over(ROUTE, "c", idle, 10).await.unwrap()),
        held,
        "a stale consumer's refresh took back an entry another consumer held"
    );
}

/// The key of a queued entry stays `queued` (copies are acknowledged, not queued
/// again) for as long as the entry may still be delivered, even when that is longer
/// than `retention`.
async fn a_queued_status_outlives_a_short_retention<Q: QueueBackend, S: Store>(f: Fixture<Q, S>) {
    let k = DeliveryKey::new(ROUTE, "slow");
    let fp = fingerprint_body(b"{}");
    let max_age = Duration::from_secs(30);
    accept(&f, &k, max_age).await;
    // Waiting in the queue, then backing off between attempts, each longer than
    // retention (300 ms).
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(f.store.claim(&k, &fp, None).await.unwrap(), Claim::Queued);
    let read = f.queue.read_new(ROUTE, "c1", 10).await.unwrap();
    let Lock::Claimed { token, .. } = f.queue.lock(&k, &read[0].0, max_age).await.unwrap() else {
        panic!("lock")
    };
    assert!(f.queue.unlock(&k, token, false).await.unwrap());
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(f.store.claim(&k, &fp, None).await.unwrap(), Claim::Queued);
}

/// A queued key acknowledges copies; one worker at a time holds it; once completed,
/// workers only acknowledge its entries.
async fn a_queued_key_acknowledges_copies_and_fences_workers<Q: QueueBackend, S: Store>(
    f: Fixture<Q, S>,
) {
    let k = DeliveryKey::new(ROUTE, "k1");
    let fp = fingerprint_body(b"{}");
    accept(&f, &k, DAY).await;
    assert_eq!(f.store.claim(&k, &fp, None).await.unwrap(), Claim::Queued);
    let q = &f.queue;
    let id = ids(&q.read_new(ROUTE, "c1", 10).await.unwrap()).remove(0);
    let Lock::Claimed { token, attempt } = q.lock(&k, &id, DAY).await.unwrap() else {
        panic!("worker lock")
    };
    assert_eq!(attempt, 1);
    assert_eq!(q.lock(&k, &id, DAY).await.unwrap(), Lock::Busy);
    assert_eq!(f.store.claim(&k, &fp, None).await.unwrap(), Claim::Queued);
    let resp = idemgate::store::StoredResponse {
        status: 200,
        headers: Bytes::new(),
        body: Bytes::from_static(b"ok"),
    };
    assert!(q.complete(&k, token, &resp, DAY).await.unwrap());
    assert_eq!(q.lock(&k, &id, DAY).await.unwrap(), Lock::Completed);
    assert!(matches!(
        f.store.claim(&k, &fp, None).await.unwrap(),
        Claim::Completed(_)
    ));
}

/// The moment a redriven entry is in the queue, a worker locking it starts at attempt
/// 1, before anything touched its key (which a redrive cannot do atomically on a
/// cluster: the key lives in another slot).
async fn a_new_entry_of_a_key_starts_at_attempt_one<Q: QueueBackend, S: Store>(f: Fixture<Q, S>) {
    let k = DeliveryKey::new(ROUTE, "k1");
    accept(&f, &k, DAY).await;
    let q = &f.queue;
    let first = ids(&q.read_new(ROUTE, "c1", 10).await.unwrap()).remove(0);
    for n in 1..=3 {
        let Lock::Claimed { token, attempt } = q.lock(&k, &first, DAY).await.unwrap() else {
            panic!("lock {n}")
        };
        assert_eq!(attempt, n);
        assert!(q.unlock(&k, token, false).await.unwrap());
    }
    // A second entry for the key, as a redrive appends it; the key untouched.
    let e = entry(&k.key, unix_millis());
    q.enqueue(ROUTE, &e, 10).await.unwrap();
    let second = ids(&q.read_new(ROUTE, "c2", 10).await.unwrap()).remove(0);
    let Lock::Claimed { attempt, .. } = q.lock(&k, &second, DAY).await.unwrap() else {
        panic!("lock of the new entry")
    };
    assert_eq!(attempt, 1, "a new entry inherits its key's attempt count");
}

/// An operator's replay of a completed async key whose claim lapses without settling
/// leaves the key completed for a worker too: an entry still pending for it (its
/// acknowledgement failed after the completion was recorded) is acknowledged, never
/// forwarded again.
async fn a_lapsed_replay_of_a_completed_key_stays_completed_for_workers<
    Q: QueueBackend,
    S: Store,
>(
    f: Fixture<Q, S>,
) {
    let k = DeliveryKey::new(ROUTE, "k1");
    let fp = fingerprint_body(b"{}");
    accept(&f, &k, DAY).await;
    let q = &f.queue;
    let id = ids(&q.read_new(ROUTE, "c1", 10).await.unwrap()).remove(0);
    let Lock::Claimed { token, .. } = q.lock(&k, &id, DAY).await.unwrap() else {
        panic!("worker lock")
    };
    let resp = idemgate::store::StoredResponse {
        status: 200,
        headers: Bytes::new(),
        body: Bytes::from_static(b"ok"),
    };
    assert!(q.complete(&k, token, &resp, DAY).await.unwrap());
    // The entry is not acknowledged (as when the acknowledgement failed).
    let Claim::Claimed(_) = f.store.claim(&k, &fp, REPLAY).await.unwrap() else {
        panic!("the operator's replay claim")
    };
    // The replayer dies: its claim lapses without a completion or a release.
    tokio::time::sleep(SHORT_LEASE.lease + Duration::from_millis(200)).await;
    assert_eq!(
        q.lock(&k, &id, DAY).await.unwrap(),
        Lock::Completed,
        "a worker re-claimed a completed key after a lapsed replay"
    );
    assert_eq!(
        f.store.claim(&k, &fp, None).await.unwrap(),
        Claim::Completed(resp),
        "a copy after the lapsed replay"
    );
}

/// Two entries of one key (a redriven dead letter and a provider's copy queued while
/// the key was released): once one completes, the other finds the key completed for
/// as long as it may still be attempted, even when that is longer than `retention`;
/// a provider's copy then is answered, not queued a third time.
async fn a_second_entry_finds_its_key_completed_after_retention<Q: QueueBackend, S: Store>(
    f: Fixture<Q, S>,
) {
    let k = DeliveryKey::new(ROUTE, "twice");
    let fp = fingerprint_body(b"{}");
    let max_age = Duration::from_secs(30);
    accept(&f, &k, max_age).await;
    let q = &f.queue;
    q.enqueue(ROUTE, &entry(&k.key, unix_millis()), 10)
        .await
        .unwrap();
    let read = ids(&q.read_new(ROUTE, "c1", 10).await.unwrap());
    let Lock::Claimed { token, .. } = q.lock(&k, &read[0], max_age).await.unwrap() else {
        panic!("lock of the first entry")
    };
    assert!(q.complete(&k, token, &ok(), max_age).await.unwrap());
    q.done(ROUTE, &read[0], None).await.unwrap();
    // The second entry backs off longer than retention (300 ms) before its attempt.
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(
        q.lock(&k, &read[1], max_age).await.unwrap(),
        Lock::Completed,
        "the second entry of a completed key was claimed for forwarding after retention"
    );
    assert!(matches!(
        f.store.claim(&k, &fp, None).await.unwrap(),
        Claim::Completed(_)
    ));
}

/// Two entries of one key count their attempts each for itself: taking turns does not
/// reset the other's count (backoff grows and both reach `max_attempts`), and a
/// refunded attempt is given back to its own entry only.
async fn two_entries_of_a_key_count_their_attempts_apart<Q: QueueBackend, S: Store>(
    f: Fixture<Q, S>,
) {
    let k = DeliveryKey::new(ROUTE, "two");
    accept(&f, &k, DAY).await;
    let q = &f.queue;
    q.enqueue(ROUTE, &entry(&k.key, unix_millis()), 10)
        .await
        .unwrap();
    let read = ids(&q.read_new(ROUTE, "c1", 10).await.unwrap());
    let mut seen = Vec::new();
    for _round in 0..3 {
        for id in &read {
            let Lock::Claimed { token, attempt } = q.lock(&k, id, DAY).await.unwrap() else {
                panic!("lock of {id}")
            };
            seen.push(attempt);
            assert!(q.unlock(&k, token, false).await.unwrap());
        }
    }
    assert_eq!(
        seen,
        vec![1, 1, 2, 2, 3, 3],
        "entries of one key reset each other's attempt count"
    );
    // A refund (Retry-After) gives the attempt back to the second entry alone.
    let Lock::Claimed { token, attempt } = q.lock(&k, &read[1], DAY).await.unwrap() else {
        panic!("lock of the second entry")
    };
    assert_eq!(attempt, 4);
    assert!(q.unlock(&k, token, true).await.unwrap());
    let Lock::Claimed { token, attempt } = q.lock(&k, &read[0], DAY).await.unwrap() else {
        panic!("lock of the first entry")
    };
    assert_eq!(
        attempt, 4,
        "a refund of the other entry changed this one's count"
    );
    assert!(q.unlock(&k, token, false).await.unwrap());
    let Lock::Claimed { attempt, .. } = q.lock(&k, &read[1], DAY).await.unwrap() else {
        panic!("lock of the second entry")
    };
    assert_eq!(attempt, 4, "the refunded attempt was counted");
}

/// A dead-lettered entry whose key could not be released (the release failed three
/// times) leaves the key `queued`: copies are acknowledged, not queued, and a redrive
/// still delivers it once (the dead worker's claim lapses after `lease`, then the new
/// entry starts at attempt 1 and completes; the key then answers as completed).
async fn a_redrive_delivers_a_dead_letter_whose_key_stayed_queued<Q: QueueBackend, S: Store>(
    f: Fixture<Q, S>,
) {
    let k = DeliveryKey::new(ROUTE, "stuck");
    let fp = fingerprint_body(b"{}");
    accept(&f, &k, DAY).await;
    let q = &f.queue;
    let read = q.read_new(ROUTE, "c1", 10).await.unwrap();
    let (id, e) = (read[0].0.clone(), read[0].1.clone().unwrap());
    let Lock::Claimed { .. } = q.lock(&k, &id, DAY).await.unwrap() else {
        panic!("lock")
    };
    q.dead_letter(ROUTE, &id, &e, 1, "upstream answered 500")
        .await
        .unwrap();
    // No release: the key stays `queued` beside its dead letter.
    assert_eq!(f.store.claim(&k, &fp, None).await.unwrap(), Claim::Queued);
    let dead = q.list_dead_letters(ROUTE, 10, None).await.unwrap();
    assert!(q.redrive(ROUTE, &dead.items[0].id).await.unwrap());
    let again = ids(&q.read_new(ROUTE, "c2", 10).await.unwrap());
    assert_eq!(again.len(), 1, "the redrive queued {again:?}");
    let mut claimed = None;
    for _ in 0..40 {
        match q.lock(&k, &again[0], DAY).await.unwrap() {
            Lock::Claimed { token, attempt } => {
                claimed = Some((token, attempt));
                break;
            }
            Lock::Busy => tokio::time::sleep(Duration::from_millis(50)).await,
            Lock::Completed => panic!("a dead-lettered key was found completed"),
        }
    }
    let Some((token, attempt)) = claimed else {
        panic!("the redriven entry never got its key after the dead worker's lease")
    };
    assert_eq!(attempt, 1);
    assert!(q.complete(&k, token, &ok(), DAY).await.unwrap());
    q.done(ROUTE, &again[0], None).await.unwrap();
    assert!(matches!(
        f.store.claim(&k, &fp, None).await.unwrap(),
        Claim::Completed(_)
    ));
    assert_eq!(q.stats(ROUTE).await.unwrap().depth, 0);
}

/// The async route (`ROUTE`) holds its claims 1.5 s, the sync route `sync` 30 s.
fn async_lease_short() -> RouteLifetimes {
    RouteLifetimes::from(lifetimes(DAY)).with_route(ROUTE, SHORT_LEASE)
}

/// A worker's delivery lock holds the async route's own lease (a dead worker's entry
/// is locked again once it lapses), while a sync route's claim holds its own, longer.
async fn an_async_and_a_sync_route_hold_their_own_leases<Q: QueueBackend, S: Store>(
    f: Fixture<Q, S>,
) {
    let queued = DeliveryKey::new(ROUTE, "k");
    let sync = DeliveryKey::new("sync", "k");
    let fp = fingerprint_body(b"{}");
    accept(&f, &queued, DAY).await;
    claimed_now(f.store.claim(&sync, &fp, None).await.unwrap());
    let q = &f.queue;
    let read = q.read_new(ROUTE, "c1", 10).await.unwrap();
    let id = read[0].0.clone();
    let Lock::Claimed { token, .. } = q.lock(&queued, &id, DAY).await.unwrap() else {
        panic!("lock")
    };
    assert!(q.renew(&queued, token).await.unwrap());
    assert_eq!(q.lock(&queued, &id, DAY).await.unwrap(), Lock::Busy);
    // The worker dies (no renewal): its lock lapses after the async route's 1.5 s.
    let end = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        match q.lock(&queued, &id, DAY).await.unwrap() {
            Lock::Claimed { attempt, .. } => {
                assert_eq!(attempt, 2);
                break;
            }
            Lock::Busy => {
                assert!(tokio::time::Instant::now() < end, "the lock never lapsed");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Lock::Completed => panic!("completed"),
        }
    }
    match f.store.claim(&sync, &fp, None).await.unwrap() {
        Claim::InFlight { remaining } => {
            assert!(remaining > Duration::from_secs(20), "{remaining:?}")
        }
        other => panic!("the sync route's claim did not hold: {other:?}"),
    }
}

fn claimed_now(c: Claim) {
    assert!(matches!(c, Claim::Claimed(_)), "{c:?}");
}

macro_rules! conformance {
    ($($case:ident($lifetimes:expr)),* $(,)?) => {
        mod redis_queue {
            use super::*;
            $(
                #[tokio::test]
                async fn $case() {
                    let f = redis_fixture($lifetimes);
                    f.queue.ensure_group(ROUTE).await.unwrap();
                    super::$case(f).await;
                }
            )*
        }
        mod memory_queue {
            use super::*;
            $(
                #[tokio::test]
                async fn $case() {
                    super::$case(memory_fixture($lifetimes)).await;
                }
            )*
        }
        mod file_queue {
            use super::*;
            $(
                #[tokio::test]
                async fn $case() {
                    let f = crate::common::file_store::FileStore::open($lifetimes);
                    super::$case(Fixture {
                        queue: f.queue,
                        store: f.store,
                        _redis: None,
                    })
                    .await;
                }
            )*
        }
    };
}

conformance!(
    a_queued_key_acknowledges_copies_and_fences_workers(lifetimes(DAY)),
    redrive_restarts_the_age_of_an_old_entry(lifetimes(DAY)),
    a_redriven_entry_starts_again_at_attempt_one(lifetimes(DAY)),
    a_new_entry_of_a_key_starts_at_attempt_one(lifetimes(DAY)),
    takeover_reaches_a_dead_consumers_entries_behind_live_ones(lifetimes(DAY)),
    keep_leaves_an_entry_taken_over_by_another_alone(lifetimes(DAY)),
    a_queued_status_outlives_a_short_retention(lifetimes(Duration::from_millis(300))),
    a_lapsed_replay_of_a_completed_key_stays_completed_for_workers(SHORT_LEASE),
    a_second_entry_finds_its_key_completed_after_retention(lifetimes(Duration::from_millis(300))),
    two_entries_of_a_key_count_their_attempts_apart(lifetimes(DAY)),
    a_redrive_delivers_a_dead_letter_whose_key_stayed_queued(SHORT_LEASE),
    an_async_and_a_sync_route_hold_their_own_leases(async_lease_short()),
);

/// Redrive is one round trip (one script): no step in between where a worker could
/// find the entry queued but its key not yet reset, and nothing left half done.
#[tokio::test]
async fn redis_redrive_is_one_round_trip() {
    let f = redis_fixture(lifetimes(DAY));
    let q = &f.queue;
    q.ensure_group(ROUTE).await.unwrap();
    let redis = f._redis.as_ref().unwrap();
    q.enqueue(ROUTE, &entry("k", unix_millis()), 10)
        .await
        .unwrap();
    let read = q.read_new(ROUTE, "c1", 10).await.unwrap();
    let e = read[0].1.clone().unwrap();
    q.dead_letter(ROUTE, &read[0].0, &e, 3, "upstream answered 500")
        .await
        .unwrap();
    // Load the scripts first: a first EVALSHA answered NOSCRIPT is not the point.
    q.redrive(ROUTE, "0-1").await.unwrap();
    let dead = q.list_dead_letters(ROUTE, 10, None).await.unwrap();
    assert!(q.redrive(ROUTE, &dead.items[0].id).await.unwrap());
    let d2 = q.list_dead_letters(ROUTE, 10, None).await.unwrap();
    assert!(d2.items.is_empty());
    let read = q.read_new(ROUTE, "c1", 10).await.unwrap();
    q.dead_letter(ROUTE, &read[0].0, &e, 3, "again")
        .await
        .unwrap();
    let dead = q.list_dead_letters(ROUTE, 10, None).await.unwrap();
    let monitor = Monitor::start(redis);
    monitor.client_commands_until_marker(redis, "start").await;
    assert!(q.redrive(ROUTE, &dead.items[0].id).await.unwrap());
    let sent = monitor.client_commands_until_marker(redis, "end").await;
    assert_eq!(sent, vec!["EVALSHA".to_string()], "redrive sent {sent:?}");
}

/// A redrive of an ordered dead letter moves the entry and appends it to its order
/// value's list in one step: when the bookkeeping fails, nothing moved and the error is
/// the truth (the dead letter is still there, the queue holds nothing delivered out of
/// its order); when it succeeds, only scripts ran (no write in between).
#[tokio::test]
async fn redis_an_ordered_redrive_moves_and_orders_in_one_step() {
    let f = redis_fixture(lifetimes(DAY));
    let q = &f.queue;
    q.ensure_group(ROUTE).await.unwrap();
    let redis = f._redis.as_ref().unwrap();
    let e = QueueEntry {
        order: Some("o1".into()),
        ..entry("k", unix_millis())
    };
    q.enqueue(ROUTE, &e, 10).await.unwrap();
    let read = q.read_new(ROUTE, "c1", 10).await.unwrap();
    q.dead_letter(ROUTE, &read[0].0, &e, 3, "upstream answered 500")
        .await
        .unwrap();
    let dead = q.list_dead_letters(ROUTE, 10, None).await.unwrap();
    let list = format!("qc:order:{{{ROUTE}}}:o1");
    // The order bookkeeping fails (a key of the wrong type stands in for a failure).
    redis.cli(&["SET", &list, "not a list"]);
    let failed = q.redrive(ROUTE, &dead.items[0].id).await;
    let left = q.list_dead_letters(ROUTE, 10, None).await.unwrap();
    let depth = q.stats(ROUTE).await.unwrap().depth;
    assert!(
        failed.is_err() && left.items.len() == 1 && depth == 0,
        "an ordered redrive whose bookkeeping failed answered {failed:?} with {} dead \
         letters left and {depth} entries queued",
        left.items.len()
    );
    redis.cli(&["DEL", &list]);
    let monitor = Monitor::start(redis);
    monitor.client_commands_until_marker(redis, "start").await;
    assert!(q.redrive(ROUTE, &dead.items[0].id).await.unwrap());
    let sent = monitor.client_commands_until_marker(redis, "end").await;
    assert!(
        sent.iter().all(|c| c == "EVALSHA"),
        "an ordered redrive sent {sent:?}"
    );
    let queued = ids(&q.read_new(ROUTE, "c1", 10).await.unwrap());
    assert_eq!(redis.cli(&["LRANGE", &list, "0", "-1"]).trim(), queued[0]);
}
