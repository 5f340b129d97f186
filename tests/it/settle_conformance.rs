//! `Store::complete_unowned` on every store: a delivery whose claim was lost before
//! its completion (the lease lapsed, a failover lost the record) still has its answer
//! recorded when the key is free, and never over another claimer, the queue or
//! another payload (fencing). The gate's side is tests/it/e2e_lease_lost.rs.

use std::time::Duration;

use crate::common::RedisServer;
use crate::common::cluster::RedisCluster;
use crate::store_conformance::{claimed, fp, key, response};
use idemgate::providers::Fingerprint;
use idemgate::store::{Claim, DeliveryKey, Lifetimes, MemoryStore, RedisStore, Store, Token};

/// Short enough to lapse within a case, long enough that a claim taken after a lapse
/// outlives the few calls a case makes with it on a busy machine.
const SHORT_LEASE: Lifetimes = Lifetimes {
    lease: Duration::from_millis(1500),
    retention: Duration::from_secs(3600),
};

/// Claims `k` and lets the claim lapse (no renewal).
async fn lapsed<S: Store>(s: &S, k: &DeliveryKey, f: &Fingerprint) -> Token {
    let t = claimed(s.claim(k, f, None).await.unwrap());
    tokio::time::sleep(SHORT_LEASE.lease + Duration::from_millis(150)).await;
    t
}

async fn a_lapsed_claims_answer_is_recorded<S: Store>(s: S) {
    let k = key("lapsed");
    let t = lapsed(&s, &k, &fp("a")).await;
    assert!(!s.complete(&k, t, &response(b"one"), None).await.unwrap());
    assert!(
        s.complete_unowned(&k, &fp("a"), &response(b"one"), None)
            .await
            .unwrap()
    );
    assert_eq!(
        s.claim(&k, &fp("a"), None).await.unwrap(),
        Claim::Completed(response(b"one"))
    );
    // Recorded again (a retried call): it still holds, and the first answer stays.
    assert!(
        s.complete_unowned(&k, &fp("a"), &response(b"two"), None)
            .await
            .unwrap()
    );
    assert_eq!(
        s.claim(&k, &fp("a"), None).await.unwrap(),
        Claim::Completed(response(b"one"))
    );
}

async fn another_claimers_key_is_left_alone<S: Store>(s: S) {
    let k = key("taken");
    let old = lapsed(&s, &k, &fp("a")).await;
    let new = claimed(s.claim(&k, &fp("a"), None).await.unwrap());
    assert!(!s.complete(&k, old, &response(b"old"), None).await.unwrap());
    assert!(
        !s.complete_unowned(&k, &fp("a"), &response(b"old"), None)
            .await
            .unwrap(),
        "recorded over a live claim"
    );
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

async fn another_payloads_completion_is_left_alone<S: Store>(s: S) {
    let k = key("other_payload");
    let t = claimed(s.claim(&k, &fp("a"), None).await.unwrap());
    assert!(s.complete(&k, t, &response(b"a"), None).await.unwrap());
    assert!(
        !s.complete_unowned(&k, &fp("b"), &response(b"b"), None)
            .await
            .unwrap()
    );
    assert_eq!(
        s.claim(&k, &fp("a"), None).await.unwrap(),
        Claim::Completed(response(b"a"))
    );
}

async fn a_released_key_takes_the_answer<S: Store>(s: S) {
    let k = key("released");
    let t = claimed(s.claim(&k, &fp("a"), None).await.unwrap());
    assert!(s.release(&k, t, None).await.unwrap());
    assert!(
        s.complete_unowned(&k, &fp("a"), &response(b"late"), None)
            .await
            .unwrap()
    );
    assert_eq!(
        s.claim(&k, &fp("a"), None).await.unwrap(),
        Claim::Completed(response(b"late"))
    );
}

macro_rules! settle_conformance {
    ($($case:ident),* $(,)?) => {
        mod memory {
            use super::*;
            $(
                #[tokio::test]
                async fn $case() {
                    super::$case(MemoryStore::new(SHORT_LEASE)).await;
                }
            )*
        }
        mod file {
            use super::*;
            $(
                #[tokio::test]
                async fn $case() {
                    let f = crate::common::file_store::FileStore::open(SHORT_LEASE);
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
                    let store = RedisStore::new(&server.url(), "idemgate", SHORT_LEASE, Duration::from_secs(1)).unwrap();
                    super::$case(store).await;
                }
            )*
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn redis_cluster_with_replica_acks_passes_every_case() {
            let cluster = RedisCluster::start(3, 1);
            $(
                let store = RedisStore::new(&cluster.url(), stringify!($case), SHORT_LEASE, Duration::from_secs(2))
                    .unwrap()
                    .with_replica_acks(1, Duration::from_secs(1));
                $case(store).await;
            )*
        }
    };
}

settle_conformance! {
    a_lapsed_claims_answer_is_recorded,
    another_claimers_key_is_left_alone,
    another_payloads_completion_is_left_alone,
    a_released_key_takes_the_answer,
}

/// With `min_replicas_ack`, an answer recorded without its claim that no replica
/// confirmed is an error (the gate answers 503), as `complete`'s own.
#[tokio::test]
async fn redis_an_unconfirmed_unowned_completion_is_an_error() {
    let server = RedisServer::start_new(); // no replicas at all
    let plain =
        RedisStore::new(&server.url(), "acks", SHORT_LEASE, Duration::from_secs(1)).unwrap();
    let acked = plain
        .clone()
        .with_replica_acks(1, Duration::from_millis(50));
    let k = key("unconfirmed");
    let e = acked
        .complete_unowned(&k, &fp("a"), &response(b"ok"), None)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("completion reached 0 of 1"), "{e}");
}
