//! End-to-end: a reload changes a route's retention live (docs/reload.md), on the
//! memory store and on Redis: a delivery completed after the switch is forgotten after
//! the new retention, one completed before keeps the retention it was given.

use std::time::{Duration, Instant};

use crate::common::admin::{TOKEN, api};
use crate::common::*;
use crate::e2e_reload::{eventually, rewrite};

/// The sidecar with route `wh` keeping its completed deliveries for `retention`.
fn builder(upstream: &Upstream, store: &TestStore, retention: &str) -> SidecarBuilder {
    // A retention is longer than the tolerance: a copy is re-signed (`again`).
    let mut route = RouteCfg::standard(ROUTE, PATH).tolerance("2s");
    route.extra = format!("retention = \"{retention}\"\n");
    SidecarBuilder::new(&upstream.url(), &store.url())
        .route(route)
        // A retention is at least upstream_timeout + lease.
        .top("upstream_timeout", "1s")
        .lease("2s")
        .env("IDEMGATE_ADMIN_TOKEN", TOKEN)
}

/// The PTTL (ms) of `d`'s claim record.
fn record_pttl(store: &TestStore, d: &Delivery) -> i64 {
    let redis = store.redis();
    let keys: Vec<String> = redis
        .keys()
        .into_iter()
        .filter(|k| k.ends_with(":claim") && k.contains(&d.id))
        .collect();
    assert_eq!(
        keys.len(),
        1,
        "one claim record of {}: {:?}",
        d.id,
        redis.keys()
    );
    redis.cli(&["PTTL", &keys[0]]).parse().unwrap()
}

/// A copy of `d` signed now: same id and body, a fresh timestamp.
fn again(d: &Delivery) -> Delivery {
    Delivery::new(&d.id, d.body.clone())
}

async fn a_reload_shortens_a_route_s_retention(kind: StoreKind) {
    let store = TestStore::new(kind);
    let upstream = Upstream::start().await;
    let sc = builder(&upstream, &store, "1h").start().await;

    let before = Delivery::fresh();
    assert_eq!(sc.send(&before).await.status, 200);
    upstream.wait_for_count(1, Duration::from_secs(10)).await;

    let shorter = builder(&upstream, &store, "3s").toml(sc.listen, sc.admin);
    rewrite(&sc, &shorter);
    let r = api(&sc, "POST", "/admin/reload", Some(TOKEN)).await;
    assert_eq!(
        r.status, 200,
        "a retention change is applied live: {:?}",
        r.json
    );

    let after = Delivery::fresh();
    assert_eq!(sc.send(&after).await.status, 200);
    let completed = Instant::now();
    upstream.wait_for_count(2, Duration::from_secs(10)).await;
    if kind == StoreKind::Redis {
        let ttl = record_pttl(&store, &after);
        assert!(
            ttl > 0 && ttl <= 3_000,
            "completed under the new retention: PTTL {ttl}"
        );
    }
    // Remembered until the new retention passes, then forgotten: a copy is forwarded.
    eventually(
        Duration::from_secs(30),
        "the delivery completed after the switch forgotten",
        || async { sc.send(&again(&after)).await.status == 200 && upstream.count() == 3 },
    )
    .await;
    assert!(
        completed.elapsed() >= Duration::from_secs(2),
        "forgotten before the new retention: {:?}",
        completed.elapsed()
    );

    // The one completed before the switch keeps the retention it was given.
    let copy = sc.send(&again(&before)).await;
    assert_eq!(copy.status, 200);
    assert!(
        copy.replayed(),
        "the delivery completed before the switch was forgotten"
    );
    assert_eq!(upstream.count(), 3, "a copy of it was forwarded");
    if kind == StoreKind::Redis {
        let ttl = record_pttl(&store, &before);
        assert!(
            ttl > 30 * 60 * 1000,
            "its record keeps its 1h retention: PTTL {ttl}"
        );
    }
}

mod memory_store {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_reload_shortens_a_route_s_retention() {
        super::a_reload_shortens_a_route_s_retention(crate::common::StoreKind::Memory).await
    }
}

mod redis_store {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_reload_shortens_a_route_s_retention() {
        super::a_reload_shortens_a_route_s_retention(crate::common::StoreKind::Redis).await
    }
}
