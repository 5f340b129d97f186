//! One conformance suite, run against both stores: the Redis store on a private
//! `redis-server`, and the in-memory store. Each case is written once, generic over
//! `Store`, and instantiated for both by the `conformance!` macro at the bottom.
//!
//! The same cases also run against the Redis store on a Redis Cluster (3 masters with
//! a replica each) and on a Sentinel-managed master with a replica: one deployment per
//! topology, every case in turn with its own key prefix (a deployment takes seconds to
//! start, a case well under one).

use std::sync::Arc;
use std::time::Duration;

use crate::common::cluster::{RedisCluster, SentinelSet};
use crate::common::{REPLAY, RedisServer};
use bytes::Bytes;
use idemgate::providers::{Fingerprint, fingerprint_body};
use idemgate::store::log::ClaimLog;
use idemgate::store::log::DeliveryLog;
use idemgate::store::{
    Claim, DeliveryKey, Lifetimes, MemoryStore, RedisStore, RouteLifetimes, Status, Store,
    StoredResponse,
};

const LONG: Lifetimes = Lifetimes {
    lease: Duration::from_secs(30),
    retention: Duration::from_secs(3600),
};
const SHORT_LEASE: Lifetimes = Lifetimes {
    lease: Duration::from_millis(300),
    retention: Duration::from_secs(3600),
};
/// For cases that need a claim held across several calls or renewals: long enough that
/// a busy machine's scheduling delays (hundreds of ms) never lapse it, short enough to
/// lapse within a case.
const RENEWED_LEASE: Lifetimes = Lifetimes {
    lease: Duration::from_millis(1500),
    retention: Duration::from_secs(3600),
};
/// How often the renewal cases renew a [`RENEWED_LEASE`] claim.
const RENEW_EVERY: Duration = Duration::from_millis(100);

pub(crate) fn fp(s: &str) -> Fingerprint {
    fingerprint_body(s.as_bytes())
}

pub(crate) fn key(k: &str) -> DeliveryKey {
    DeliveryKey::new("route", k)
}

pub(crate) fn response(body: &[u8]) -> StoredResponse {
    StoredResponse {
        status: 201,
        headers: Bytes::from_static(b"content-type: text/plain\r\nx-app: 1\r\n"),
        body: Bytes::copy_from_slice(body),
    }
}

pub(crate) fn claimed(c: Claim) -> idemgate::store::Token {
    match c {
        Claim::Claimed(t) => t,
        other => panic!("expected Claimed, got {other:?}"),
    }
}

/// Polls `claim` until it is `Claimed`, or panics after `deadline`.
async fn claim_eventually<S: Store>(
    s: &S,
    k: &DeliveryKey,
    f: &Fingerprint,
    deadline: Duration,
) -> idemgate::store::Token {
    let end = tokio::time::Instant::now() + deadline;
    loop {
        match s.claim(k, f, None).await.unwrap() {
            Claim::Claimed(t) => return t,
            other => {
                assert!(
                    tokio::time::Instant::now() < end,
                    "still not claimable: {other:?}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

async fn first_claim_wins_and_copies_see_in_flight<S: Store>(s: S) {
    let k = key("evt_1");
    claimed(s.claim(&k, &fp("a"), None).await.unwrap());
    match s.claim(&k, &fp("a"), None).await.unwrap() {
        Claim::InFlight { remaining } => {
            assert!(
                remaining > Duration::ZERO && remaining <= LONG.lease,
                "{remaining:?}"
            )
        }
        other => panic!("expected InFlight, got {other:?}"),
    }
    assert_eq!(s.claim(&k, &fp("b"), None).await.unwrap(), Claim::Mismatch);
    let r = s.log_entry(&k).await.unwrap().expect("record");
    assert_eq!(r.status, Status::Processing);
    assert!(r.claimed);
    assert_eq!(r.attempts, 1);
    assert_eq!(r.fingerprint, hex::encode(fp("a")));
}

async fn completion_is_replayed_and_counted<S: Store>(s: S) {
    let k = key("evt_2");
    let t = claimed(s.claim(&k, &fp("a"), None).await.unwrap());
    let resp = response(b"\xff\x00not utf-8");
    assert!(s.complete(&k, t, &resp, None).await.unwrap());
    assert_eq!(
        s.claim(&k, &fp("a"), None).await.unwrap(),
        Claim::Completed(resp.clone())
    );
    assert_eq!(
        s.claim(&k, &fp("a"), None).await.unwrap(),
        Claim::Completed(resp)
    );
    // A different payload under a completed key is refused, and not counted.
    assert_eq!(s.claim(&k, &fp("b"), None).await.unwrap(), Claim::Mismatch);
    let r = s.log_entry(&k).await.unwrap().expect("record");
    assert_eq!(r.status, Status::Completed);
    assert_eq!(r.duplicates, 2);
    assert_eq!(r.attempts, 1);
    assert_eq!(r.response_status, Some(201));
    assert!(!r.claimed);
    assert!(r.first_seen > 0 && r.last_seen >= r.first_seen);
}

async fn release_lets_the_next_copy_claim<S: Store>(s: S) {
    let k = key("evt_3");
    let t = claimed(s.claim(&k, &fp("a"), None).await.unwrap());
    assert!(s.release(&k, t, None).await.unwrap());
    assert_eq!(
        s.log_entry(&k).await.unwrap().unwrap().status,
        Status::Released
    );
    // After a release a different payload is simply a new first delivery.
    let t2 = claimed(s.claim(&k, &fp("b"), None).await.unwrap());
    assert_ne!(t, t2);
    let r = s.log_entry(&k).await.unwrap().unwrap();
    assert_eq!(r.attempts, 2);
    assert_eq!(r.fingerprint, hex::encode(fp("b")));
    // The released token no longer owns anything.
    assert!(!s.release(&k, t, None).await.unwrap());
    assert!(!s.complete(&k, t, &response(b"x"), None).await.unwrap());
    assert!(s.complete(&k, t2, &response(b"y"), None).await.unwrap());
}

async fn an_expired_owner_cannot_touch_the_next_owners_claim<S: Store>(s: S) {
    let k = key("evt_4");
    let old = claimed(s.claim(&k, &fp("a"), None).await.unwrap());
    // The old owner stops renewing (crashed, or paused); its lease lapses.
    let new = claim_eventually(&s, &k, &fp("a"), Duration::from_secs(5)).await;
    assert_ne!(old, new);
    assert!(!s.renew(&k, old).await.unwrap(), "expired owner renewed");
    assert!(
        !s.complete(&k, old, &response(b"old"), None).await.unwrap(),
        "expired owner completed"
    );
    assert!(
        !s.release(&k, old, None).await.unwrap(),
        "expired owner released"
    );
    // The new owner's claim is intact.
    assert!(matches!(
        s.claim(&k, &fp("a"), None).await.unwrap(),
        Claim::InFlight { .. }
    ));
    assert!(s.complete(&k, new, &response(b"new"), None).await.unwrap());
    assert_eq!(
        s.claim(&k, &fp("a"), None).await.unwrap(),
        Claim::Completed(response(b"new"))
    );
}

async fn renewal_keeps_a_live_claim_past_its_lease<S: Store>(s: S) {
    let k = key("evt_5");
    let started = tokio::time::Instant::now();
    let t = claimed(s.claim(&k, &fp("a"), None).await.unwrap());
    // Renew every 100 ms (of a 1.5 s lease) until two leases have passed; no copy may
    // claim meanwhile.
    while started.elapsed() < 2 * RENEWED_LEASE.lease {
        tokio::time::sleep(RENEW_EVERY).await;
        assert!(s.renew(&k, t).await.unwrap());
        assert!(matches!(
            s.claim(&k, &fp("a"), None).await.unwrap(),
            Claim::InFlight { .. }
        ));
    }
    assert!(s.complete(&k, t, &response(b"ok"), None).await.unwrap());
}

async fn a_crashed_claimers_key_frees_after_the_lease<S: Store>(s: S) {
    let k = key("evt_6");
    let started = tokio::time::Instant::now();
    claimed(s.claim(&k, &fp("a"), None).await.unwrap());
    claim_eventually(&s, &k, &fp("a"), Duration::from_secs(5)).await;
    assert!(
        started.elapsed() >= Duration::from_millis(250),
        "freed before the lease: {:?}",
        started.elapsed()
    );
}

async fn wait_for_returns_the_first_ones_answer<S: Store + Clone>(s: S) {
    let k = key("evt_7");
    let t = claimed(s.claim(&k, &fp("a"), None).await.unwrap());
    let s2 = s.clone();
    let k2 = k.clone();
    let waiter = tokio::spawn(async move {
        s2.wait_for(
            &k2,
            &fp("a"),
            tokio::time::Instant::now() + Duration::from_secs(5),
        )
        .await
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(s.complete(&k, t, &response(b"first"), None).await.unwrap());
    assert_eq!(
        waiter.await.unwrap().unwrap(),
        Claim::Completed(response(b"first"))
    );

    // A holder that releases: the waiter claims for itself.
    let k = key("evt_7b");
    let t = claimed(s.claim(&k, &fp("a"), None).await.unwrap());
    let s2 = s.clone();
    let k2 = k.clone();
    let waiter = tokio::spawn(async move {
        s2.wait_for(
            &k2,
            &fp("a"),
            tokio::time::Instant::now() + Duration::from_secs(5),
        )
        .await
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(s.release(&k, t, None).await.unwrap());
    assert!(matches!(waiter.await.unwrap().unwrap(), Claim::Claimed(_)));

    // A holder that does neither: the waiter gives up at its deadline.
    let k = key("evt_7c");
    claimed(s.claim(&k, &fp("a"), None).await.unwrap());
    let r = s
        .wait_for(
            &k,
            &fp("a"),
            tokio::time::Instant::now() + Duration::from_millis(200),
        )
        .await;
    assert!(matches!(r.unwrap(), Claim::InFlight { .. }));
}

async fn concurrent_claims_have_exactly_one_winner<S: Store + Clone>(s: S) {
    let k = key("evt_8");
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..200 {
        let s = s.clone();
        let k = k.clone();
        set.spawn(async move { s.claim(&k, &fp("a"), None).await.unwrap() });
    }
    let mut winners = 0;
    while let Some(c) = set.join_next().await {
        match c.unwrap() {
            Claim::Claimed(_) => winners += 1,
            Claim::InFlight { .. } => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(winners, 1);
}

async fn retention_forgets_completed_keys<S: Store>(s: S) {
    let k = key("evt_9");
    let t = claimed(s.claim(&k, &fp("a"), None).await.unwrap());
    assert!(s.complete(&k, t, &response(b"ok"), None).await.unwrap());
    assert!(matches!(
        s.claim(&k, &fp("a"), None).await.unwrap(),
        Claim::Completed(_)
    ));
    // retention is 400 ms in this case's store
    claim_eventually(&s, &k, &fp("a"), Duration::from_secs(5)).await;
}

async fn keys_with_braces_and_unicode_are_separate<S: Store>(s: S) {
    let a = DeliveryKey::new("r", "a}b{c");
    let b = DeliveryKey::new("r", "a}b{d");
    let c = DeliveryKey::new("r2", "a}b{c");
    let d = DeliveryKey::new("r", "évènement-✓");
    for k in [&a, &b, &c, &d] {
        claimed(s.claim(k, &fp("x"), None).await.unwrap());
    }
}

/// An upstream call that outlives `retention` (renewed all along): the record lives
/// as long as the claim, so the completion keeps the payload fingerprint (copies get
/// the answer, not a mismatch) and a release keeps a record that expires. `s` keeps
/// deliveries for 1 s with a 1.5 s lease, renewed every 100 ms for 1.5 retentions.
async fn a_call_outliving_retention_keeps_its_record<S: Store>(s: S) {
    for (name, completes) in [("evt_long_done", true), ("evt_long_released", false)] {
        let k = key(name);
        let started = tokio::time::Instant::now();
        let t = claimed(s.claim(&k, &fp("a"), None).await.unwrap());
        while started.elapsed() < Duration::from_millis(1500) {
            tokio::time::sleep(RENEW_EVERY).await;
            assert!(s.renew(&k, t).await.unwrap());
        }
        let r = s
            .log_entry(&k)
            .await
            .unwrap()
            .expect("the record of a live claim");
        assert_eq!(r.fingerprint, hex::encode(fp("a")));
        assert!(r.claimed);
        assert!(matches!(
            s.claim(&k, &fp("a"), None).await.unwrap(),
            Claim::InFlight { .. }
        ));
        if completes {
            assert!(s.complete(&k, t, &response(b"late"), None).await.unwrap());
            assert_eq!(
                s.claim(&k, &fp("a"), None).await.unwrap(),
                Claim::Completed(response(b"late"))
            );
        } else {
            assert!(s.release(&k, t, None).await.unwrap());
            claimed(s.claim(&k, &fp("a"), None).await.unwrap());
        }
    }
}

/// Route `brief` keeps its keys 300 ms, `mid` 2.5 s, every other route `LONG`'s hour;
/// `quick` holds its claims 1.5 s, every other route `LONG`'s 30 s.
fn per_route() -> RouteLifetimes {
    let keep = |retention| Lifetimes {
        lease: Duration::from_secs(30),
        retention,
    };
    RouteLifetimes::from(LONG)
        .with_route("brief", keep(Duration::from_millis(300)))
        .with_route("mid", keep(Duration::from_millis(2500)))
        .with_route("quick", RENEWED_LEASE)
}

/// Claims (logged, as the gate does) and completes `k`.
async fn settle<S: Store>(s: &S, k: &DeliveryKey) {
    let log = ClaimLog {
        kept: None,
        replay: false,
    };
    let t = claimed(s.claim(k, &fp("a"), Some(log)).await.unwrap());
    assert!(s.complete(k, t, &response(b"ok"), None).await.unwrap());
}

/// Waits until `k`'s log entry is gone (its retention ran out), or panics.
async fn wait_forgotten<S: Store>(s: &S, k: &DeliveryKey, deadline: Duration) {
    let end = tokio::time::Instant::now() + deadline;
    while s.log_entry(k).await.unwrap().is_some() {
        assert!(tokio::time::Instant::now() < end, "{k:?} still remembered");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Each route's key and log entry live that route's retention (`per_route`): `brief`
/// forgets first while `mid` and a default route still answer, then `mid`, while the
/// default route still answers.
async fn each_route_keeps_its_keys_for_its_own_retention<S: Store>(s: S) {
    let (brief, mid, other) = (
        DeliveryKey::new("brief", "evt"),
        DeliveryKey::new("mid", "evt"),
        DeliveryKey::new("other", "evt"),
    );
    for k in [&brief, &mid, &other] {
        settle(&s, k).await;
        assert!(s.log_entry(k).await.unwrap().is_some(), "{k:?}");
    }
    wait_forgotten(&s, &brief, Duration::from_secs(5)).await;
    for k in [&mid, &other] {
        assert!(
            s.log_entry(k).await.unwrap().is_some(),
            "{k:?} forgotten with brief"
        );
        assert_eq!(
            s.claim(k, &fp("a"), None).await.unwrap(),
            Claim::Completed(response(b"ok")),
            "{k:?}"
        );
    }
    claimed(s.claim(&brief, &fp("a"), None).await.unwrap());
    wait_forgotten(&s, &mid, Duration::from_secs(10)).await;
    assert!(s.log_entry(&other).await.unwrap().is_some());
    assert_eq!(
        s.claim(&other, &fp("a"), None).await.unwrap(),
        Claim::Completed(response(b"ok"))
    );
    claimed(s.claim(&mid, &fp("a"), None).await.unwrap());
}

/// Each route's claims hold (and renew for) that route's lease (`per_route`): a
/// crashed claimer's `quick` key frees after 1.5 s, another route's stays held.
async fn each_route_holds_its_claims_for_its_own_lease<S: Store>(s: S) {
    let (quick, other) = (
        DeliveryKey::new("quick", "evt"),
        DeliveryKey::new("other", "evt"),
    );
    let tq = claimed(s.claim(&quick, &fp("a"), None).await.unwrap());
    let to = claimed(s.claim(&other, &fp("a"), None).await.unwrap());
    let remaining = |c: Claim| match c {
        Claim::InFlight { remaining } => remaining,
        other => panic!("expected InFlight, got {other:?}"),
    };
    assert!(s.renew(&quick, tq).await.unwrap());
    assert!(s.renew(&other, to).await.unwrap());
    let r = remaining(s.claim(&quick, &fp("a"), None).await.unwrap());
    assert!(r <= RENEWED_LEASE.lease, "{r:?}");
    let r = remaining(s.claim(&other, &fp("a"), None).await.unwrap());
    assert!(r > Duration::from_secs(20), "{r:?}");
    // Neither is renewed again: `quick`'s claim lapses, `other`'s holds.
    claim_eventually(&s, &quick, &fp("a"), Duration::from_secs(5)).await;
    let r = remaining(s.claim(&other, &fp("a"), None).await.unwrap());
    assert!(r > Duration::from_secs(20), "{r:?}");
}

macro_rules! conformance {
    ($($case:ident => $lifetimes:expr),* $(,)?) => {
        mod memory {
            use super::*;
            $(
                #[tokio::test]
                async fn $case() {
                    super::$case(MemoryStore::new($lifetimes)).await;
                }
            )*
        }
        mod file {
            use super::*;
            $(
                #[tokio::test]
                async fn $case() {
                    let f = crate::common::file_store::FileStore::open($lifetimes);
                    super::$case(f.store.clone()).await;
                }
            )*
        }
        mod redis {
            use super::*;
            $(
                #[tokio::test]
                async fn $case() {
                    let server = RedisServer::start_new();
                    let store = RedisStore::new(&server.url(), "idemgate", $lifetimes, Duration::from_secs(1)).unwrap();
                    super::$case(store).await;
                    drop(server);
                }
            )*
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn redis_cluster_passes_every_case() {
            let cluster = RedisCluster::start(3, 1);
            $(
                eprintln!("redis cluster: {}", stringify!($case));
                let store = RedisStore::new(&cluster.url(), stringify!($case), $lifetimes, Duration::from_secs(2)).unwrap();
                $case(store).await;
            )*
            drop(cluster);
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn redis_sentinel_passes_every_case() {
            let set = SentinelSet::start();
            $(
                eprintln!("redis sentinel: {}", stringify!($case));
                let store = RedisStore::new(&set.url(), stringify!($case), $lifetimes, Duration::from_secs(2)).unwrap();
                $case(store).await;
            )*
            drop(set);
        }
    };
}

conformance! {
    first_claim_wins_and_copies_see_in_flight => LONG,
    completion_is_replayed_and_counted => LONG,
    release_lets_the_next_copy_claim => LONG,
    an_expired_owner_cannot_touch_the_next_owners_claim => RENEWED_LEASE,
    renewal_keeps_a_live_claim_past_its_lease => RENEWED_LEASE,
    a_crashed_claimers_key_frees_after_the_lease => SHORT_LEASE,
    wait_for_returns_the_first_ones_answer => LONG,
    concurrent_claims_have_exactly_one_winner => LONG,
    retention_forgets_completed_keys => Lifetimes { lease: Duration::from_secs(30), retention: Duration::from_millis(400) },
    keys_with_braces_and_unicode_are_separate => LONG,
    a_call_outliving_retention_keeps_its_record => Lifetimes { lease: Duration::from_millis(1500), retention: Duration::from_millis(1000) },
    each_route_keeps_its_keys_for_its_own_retention => per_route(),
    each_route_holds_its_claims_for_its_own_lease => per_route(),
}

// ---- Redis-only properties -------------------------------------------------------

/// A restarted Redis has no scripts loaded and no connection: both come back by
/// themselves, and an unreachable Redis answers an error within the store timeout.
#[tokio::test]
async fn redis_restart_is_survived_and_outage_is_bounded() {
    let mut server = RedisServer::start_new();
    let s = RedisStore::new(&server.url(), "idemgate", LONG, Duration::from_millis(500)).unwrap();
    claimed(s.claim(&key("before"), &fp("a"), None).await.unwrap());
    server.stop();
    let t = std::time::Instant::now();
    assert!(s.claim(&key("during"), &fp("a"), None).await.is_err());
    assert!(s.ping().await.is_err());
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "outage not bounded: {:?}",
        t.elapsed()
    );
    server.start();
    let end = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match s.claim(&key("after"), &fp("a"), None).await {
            Ok(c) => {
                claimed(c);
                break;
            }
            Err(e) => {
                assert!(
                    std::time::Instant::now() < end,
                    "store did not recover: {e}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    s.ping().await.unwrap();
}

/// This process's TCP sockets connected to `port`, with their `TCP_NODELAY` setting
/// (read off the live file descriptors in /proc/self/fd).
fn sockets_to(port: u16) -> Vec<bool> {
    use ::redis::io::tcp::socket2::Socket;
    use std::os::fd::FromRawFd;
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        let Ok(fd) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let is_socket = std::fs::read_link(entry.path())
            .map(|l| l.to_string_lossy().starts_with("socket:"))
            .unwrap_or(false);
        if !is_socket {
            continue;
        }
        // Borrowed, never closed: the Socket is forgotten below.
        let sock = unsafe { Socket::from_raw_fd(fd) };
        let peer = sock.peer_addr().ok().and_then(|a| a.as_socket());
        if peer.map(|a| a.port()) == Some(port) {
            found.push(sock.tcp_nodelay().unwrap());
        }
        std::mem::forget(sock);
    }
    found
}

/// redis-rs leaves Nagle on by default; on one multiplexed connection a claim written
/// behind an unacknowledged command would wait for the ACK. The store's connections
/// turn it off (BENCHMARKS.md, "What holds the figures").
#[tokio::test]
async fn the_store_connection_to_redis_has_nagle_off() {
    let server = RedisServer::start_new();
    assert!(sockets_to(server.port()).is_empty());
    let s = RedisStore::new(&server.url(), "idemgate", LONG, Duration::from_secs(1)).unwrap();
    s.ping().await.unwrap();
    claimed(s.claim(&key("nagle"), &fp("a"), None).await.unwrap());
    let sockets = sockets_to(server.port());
    assert!(!sockets.is_empty(), "no connection to Redis found");
    assert!(sockets.iter().all(|nodelay| *nodelay), "{sockets:?}");
}

/// A Redis that does not answer (paused) costs at most the store timeout.
#[tokio::test]
async fn a_paused_redis_times_out() {
    let server = RedisServer::start_new();
    let s = Arc::new(
        RedisStore::new(&server.url(), "idemgate", LONG, Duration::from_millis(300)).unwrap(),
    );
    s.ping().await.unwrap();
    server.pause(2000);
    let t = std::time::Instant::now();
    let r = s.claim(&key("paused"), &fp("a"), None).await;
    assert!(r.is_err(), "{r:?}");
    assert!(
        t.elapsed() < Duration::from_millis(1500),
        "{:?}",
        t.elapsed()
    );
}

/// In a cluster, `EVALSHA` goes to the master owning its first key's slot: both keys
/// of every delivery land on one node, and deliveries spread over all masters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_routes_each_delivery_to_its_slot() {
    // No replicas: with the tests' 1 s node timeout, a replica of a master starved of
    // CPU on a loaded machine may take over mid-test and move the slot under the check.
    let cluster = RedisCluster::start(3, 0);
    let s = RedisStore::new(&cluster.url(), "pfx", LONG, Duration::from_secs(2)).unwrap();
    let mut used = std::collections::BTreeSet::new();
    for i in 0..30 {
        let k = key(&format!("evt_{i}"));
        let t = claimed(s.claim(&k, &fp("a"), None).await.unwrap());
        assert!(s.complete(&k, t, &response(b"ok"), None).await.unwrap());
        assert_eq!(
            s.claim(&k, &fp("a"), None).await.unwrap(),
            Claim::Completed(response(b"ok"))
        );
        // The copy's count is written off the claim's path: reading the log waits for it.
        assert_eq!(s.log_entry(&k).await.unwrap().unwrap().duplicates, 1);
        let state = s.state_key(&k);
        let port = cluster.master_of(&state);
        let keys = cluster.keys_on(port);
        assert!(
            keys.contains(&state),
            "{state} not on its slot's master {port}"
        );
        assert!(
            keys.contains(&format!("{state}:claim")),
            "claim record not beside {state}"
        );
        used.insert(port);
    }
    assert_eq!(used.len(), 3, "30 deliveries all on {used:?}");
}

/// With `min_replicas_ack`, a claim that no replica confirmed is a store error (the
/// sidecar answers 503) and its lock is released so the provider's retry is forwarded;
/// a completion no replica confirmed is an error too (counted as lease lost), and so
/// is a copy answered from it.
#[tokio::test]
async fn redis_min_replicas_ack_refuses_what_no_replica_confirmed() {
    let server = RedisServer::start_new(); // no replicas at all
    let plain = RedisStore::new(&server.url(), "acks", LONG, Duration::from_secs(1)).unwrap();
    let acked = plain
        .clone()
        .with_replica_acks(1, Duration::from_millis(50));
    let k = key("evt_acks");
    let e = acked.claim(&k, &fp("a"), None).await.unwrap_err();
    assert!(e.to_string().contains("0 of 1 replicas"), "{e}");
    // the background release frees the key for the provider's retry
    let t = claim_eventually(&plain, &k, &fp("a"), Duration::from_secs(5)).await;
    let e = acked
        .complete(&k, t, &response(b"ok"), None)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("completion reached 0 of 1"), "{e}");
    // A copy of that completion is not answered from it either while no replica
    // holds it (confirm.rs); a store without replica acks answers it.
    let e = acked.claim(&k, &fp("a"), None).await.unwrap_err();
    assert!(
        e.to_string().contains("completed record reached 0 of 1"),
        "{e}"
    );
    assert_eq!(
        plain.claim(&k, &fp("a"), None).await.unwrap(),
        Claim::Completed(response(b"ok"))
    );
}

/// No script leaves a key without a TTL, and a completion whose log hash vanished
/// (evicted, deleted by hand) still answers copies of the same payload: a call that
/// outlives `retention` keeps its hash alive, and a hash that is gone anyway is not
/// re-created without a TTL.
#[tokio::test]
async fn redis_no_script_leaves_a_key_without_a_ttl() {
    // A lease long enough that no claim lapses between the calls below on a busy
    // machine; renewals carry the first claim past the retention.
    let lifetimes = Lifetimes {
        lease: Duration::from_millis(1500),
        retention: Duration::from_millis(1000),
    };
    let server = RedisServer::start_new();
    let s = RedisStore::new(&server.url(), "ttl", lifetimes, Duration::from_secs(1)).unwrap();
    let pttl = |k: &DeliveryKey| -> i64 { server.cli(&["PTTL", &s.state_key(k)]).parse().unwrap() };
    // Renewed past retention, then released: the hash lives and still expires.
    let k = key("evt_ttl_release");
    let started = tokio::time::Instant::now();
    let t = claimed(s.claim(&k, &fp("a"), None).await.unwrap());
    while started.elapsed() < Duration::from_millis(1500) {
        tokio::time::sleep(RENEW_EVERY).await;
        assert!(s.renew(&k, t).await.unwrap());
    }
    // A first delivery writes no log hash (its record carries the log: record.rs).
    assert_eq!(pttl(&k), -2, "the hash of a renewed claim: {}", pttl(&k));
    assert!(s.release(&k, t, None).await.unwrap());
    assert!(pttl(&k) > 0, "after the release: {}", pttl(&k));
    // The hash is gone while the claim lives: the release leaves no key without TTL.
    let k = key("evt_ttl_gone_release");
    let t = claimed(s.claim(&k, &fp("a"), None).await.unwrap());
    server.cli(&["DEL", &s.state_key(&k)]);
    assert!(s.release(&k, t, None).await.unwrap());
    assert_ne!(pttl(&k), -1, "the release re-created a hash without a TTL");
    claimed(s.claim(&k, &fp("a"), None).await.unwrap());
    // The same for a completion: it expires, and copies get its answer.
    let k = key("evt_ttl_gone_complete");
    let t = claimed(s.claim(&k, &fp("a"), None).await.unwrap());
    server.cli(&["DEL", &s.state_key(&k)]);
    assert!(s.complete(&k, t, &response(b"ok"), None).await.unwrap());
    assert_ne!(pttl(&k), -1, "after the completion: {}", pttl(&k));
    assert_eq!(
        s.claim(&k, &fp("a"), None).await.unwrap(),
        Claim::Completed(response(b"ok"))
    );
    // A copy's log write that re-creates a vanished hash (a forget racing it) gives it
    // a TTL, and such a fragment is no delivery to the log once the record is gone.
    server.cli(&["DEL", &s.state_key(&k)]);
    assert!(matches!(
        s.claim(&k, &fp("a"), None).await.unwrap(),
        Claim::Completed(_)
    ));
    assert_eq!(
        s.log_entry(&k).await.unwrap().unwrap().status,
        Status::Completed
    );
    assert!(pttl(&k) > 0, "a copy's log write left no TTL: {}", pttl(&k));
    server.cli(&["DEL", &format!("{}:claim", s.state_key(&k))]);
    assert!(
        s.log_entry(&k).await.unwrap().is_none(),
        "a fragment listed"
    );
}

// ---- Memory-only properties ------------------------------------------------------

/// Durations that overflow the clock (`now + retention`) never panic under the memory
/// store's lock, which would poison it and fail every later delivery.
#[tokio::test]
async fn memory_store_survives_durations_past_the_clock() {
    let s = MemoryStore::new(Lifetimes {
        lease: Duration::MAX,
        retention: Duration::MAX,
    });
    let k = key("evt_huge");
    let t = claimed(s.claim(&k, &fp("a"), None).await.unwrap());
    assert!(matches!(
        s.claim(&k, &fp("a"), None).await.unwrap(),
        Claim::InFlight { .. }
    ));
    assert!(s.renew(&k, t).await.unwrap());
    assert!(s.complete(&k, t, &response(b"ok"), None).await.unwrap());
    assert_eq!(
        s.claim(&k, &fp("a"), None).await.unwrap(),
        Claim::Completed(response(b"ok"))
    );
    let op = claimed(s.claim(&k, &fp("a"), REPLAY).await.unwrap());
    assert!(s.release(&k, op, None).await.unwrap());
    s.ping().await.unwrap();
    assert_eq!(
        s.log_entry(&k).await.unwrap().unwrap().status,
        Status::Completed
    );
}
