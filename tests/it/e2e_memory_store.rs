//! End-to-end: the in-process store as README and docs/reliability.md describe it:
//! nothing survives a restart, `store.max_memory` bounds it (the oldest settled
//! deliveries forgotten first, a 503 + Retry-After when only deliveries in progress
//! are left), its metrics, and what a small delivery costs in resident memory.

use std::time::Duration;

use crate::common::*;

/// A body of `n` bytes of JSON (kept payloads make a few deliveries fill a small bound).
fn body(n: usize) -> Vec<u8> {
    let mut b = b"{\"pad\":\"".to_vec();
    b.resize(n - 2, b'x');
    b.extend_from_slice(b"\"}");
    b
}

/// A route keeping each request, so a delivery costs about its body in the store.
fn keeping() -> RouteCfg {
    let mut r = RouteCfg::standard(ROUTE, PATH);
    r.extra.push_str("keep_payload = true\n");
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_forgets_every_delivery_the_memory_store_held() {
    let up = Upstream::start().await;
    let builder = SidecarBuilder::new(&up.url(), "memory");
    let mut sc = builder.clone().start().await;
    let d = Delivery::fresh();
    assert_eq!(sc.send(&d).await.status, 200);
    let copy = sc.send(&d).await;
    assert!(copy.replayed(), "the copy is answered from the store");
    assert_eq!(up.count(), 1);

    sc.kill9();
    let sc = builder.start().await;
    // The documented opposite of the file store: a copy after a restart is forwarded
    // again, because the memory store kept nothing.
    let again = sc.send(&d).await;
    assert_eq!(again.status, 200);
    assert!(!again.replayed());
    assert_eq!(up.count(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bounded_memory_store_forgets_the_oldest_and_counts_it() {
    let up = Upstream::start().await;
    let sc = SidecarBuilder::new(&up.url(), "memory")
        .store_opt("max_memory", "1MiB")
        .route(keeping())
        .start()
        .await;
    // 40 deliveries of 64 KiB kept: the bound holds about 15 of them.
    let sent: Vec<Delivery> = (0..40)
        .map(|i| Delivery::new(&unique_id(&format!("big{i}")), body(64 * 1024)))
        .collect();
    for d in &sent {
        assert_eq!(sc.send(d).await.status, 200);
    }
    assert_eq!(up.count(), 40);
    let evicted = sc.metric("idemgate_store_evictions_total").await;
    assert!(evicted >= 20.0, "evictions {evicted}");
    assert!(
        sc.metrics()
            .await
            .contains("idemgate_store_oldest_age_seconds "),
        "the effective window is exported"
    );
    // The newest copy is answered from the store; the oldest's is forwarded again
    // (what eviction means, docs/reliability.md).
    assert!(sc.send(&sent[39]).await.replayed());
    assert_eq!(up.count(), 40);
    let oldest = sc.send(&sent[0]).await;
    assert_eq!(oldest.status, 200);
    assert!(!oldest.replayed());
    assert_eq!(up.count(), 41);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_store_holding_only_deliveries_in_progress_answers_503() {
    let up = Upstream::start().await;
    up.set_mode(Mode::Hang);
    let sc = SidecarBuilder::new(&up.url(), "memory")
        .store_opt("max_memory", "1MiB")
        .top("upstream_timeout", "30s")
        .route(keeping())
        .start()
        .await;
    // Each claim keeps 200 KiB; the upstream never answers, so every one stays
    // processing: the sixth cannot be remembered.
    let mut held = Vec::new();
    for i in 0..5 {
        let d = Delivery::new(&unique_id(&format!("held{i}")), body(200 * 1024));
        held.push(sc.send_spawned(&d));
    }
    up.wait_for_count(5, Duration::from_secs(10)).await;
    let refused = sc
        .send(&Delivery::new(&unique_id("late"), body(200 * 1024)))
        .await;
    refused.assert_error(503, "store_unavailable");
    assert!(refused.retry_after() >= 1);
    assert_eq!(up.count(), 5, "a refused delivery is not forwarded");
    wait_until(Duration::from_secs(5), "the log says why", || {
        sc.stderr().contains("store full")
    })
    .await;
    assert!(sc.stderr().contains("store.max_memory"));
    for h in held {
        h.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_delivery_costs_the_memory_store_little_resident_memory() {
    // Today's figure is in BENCHMARKS.md (examples/store_footprint.rs); this bound is
    // generous (RSS of a debug build, with its buffers) but fails at the 6 KB a
    // delivery cost when the store kept slices of hyper's buffers.
    let up = Upstream::start().await;
    let sc = SidecarBuilder::new(&up.url(), "memory").start().await;
    let warm: Vec<Delivery> = (0..500).map(|_| Delivery::fresh()).collect();
    for d in &warm {
        sc.send(d).await;
    }
    let before = rss_kib(sc.pid());
    let n = 8_000u64;
    let mut tasks = tokio::task::JoinSet::new();
    for worker in 0..8u64 {
        let client = http_client();
        let url = sc.url(PATH);
        tasks.spawn(async move {
            for i in 0..n / 8 {
                let d = Delivery::new(&format!("evt_{worker}_{i:08}"), &b"{\"a\":1}"[..]);
                let a = post(&client, &url, &d.headers(), d.body.clone()).await;
                assert_eq!(a.map(|a| a.status).ok(), Some(200));
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap();
    }
    let per_delivery = (rss_kib(sc.pid()).saturating_sub(before)) * 1024 / n;
    eprintln!("RSS per delivery: {per_delivery} bytes");
    assert!(per_delivery < 1500, "{per_delivery} bytes per delivery");
}

const SHOP_SECRET: &str = "shopify-secret-of-28-bytes!!";

/// A Shopify delivery of `body` for shop `shop`, signed as Shopify signs (the body
/// only: the shop domain and topic headers are not signed).
fn shopify(body: &[u8], event: &str, shop: &str) -> Vec<(String, String)> {
    use base64::Engine as _;
    use hmac::{KeyInit, Mac};
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(SHOP_SECRET.as_bytes()).unwrap();
    mac.update(body);
    let sig = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
    [
        ("content-type", "application/json"),
        ("x-shopify-hmac-sha256", sig.as_str()),
        ("x-shopify-event-id", event),
        ("x-shopify-topic", "orders/create"),
        ("x-shopify-shop-domain", shop),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// Issue 34 item 8, as reproduced: on a 1 MiB memory store a captured Shopify delivery
/// replayed with only `X-Shopify-Shop-Domain` changed was forwarded each time and
/// stored as a new record, and eviction then forgot a delivery of another route inside
/// its retention. Now a signed body takes at most 8 unsigned scopes (the rest: 422
/// `scope_limit`, counted as `scope_refused`), and a route flooded with real, distinct
/// deliveries past its share of `max_memory` forgets its own, never the other route's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_route_cannot_make_the_memory_store_forget_another_routes_delivery() {
    let up = Upstream::start().await;
    let mut shop = RouteCfg::standard("shop", "/webhooks/shop");
    shop.provider = "shopify".into();
    shop.secrets = vec![SHOP_SECRET.into()];
    shop.tolerance = None;
    shop.extra.push_str("keep_payload = true\n");
    let sc = SidecarBuilder::new(&up.url(), "memory")
        .store_opt("max_memory", "1MiB")
        .route(RouteCfg::standard(ROUTE, PATH))
        .route(shop)
        .start()
        .await;
    let d = Delivery::fresh();
    assert_eq!(sc.send(&d).await.status, 200);
    let client = http_client();
    let url = sc.url("/webhooks/shop");
    // One captured body replayed under 300 shop domains: 8 forwarded, 292 refused.
    let captured = body(4096);
    let mut statuses = std::collections::BTreeMap::new();
    for n in 0..300 {
        let h = shopify(&captured, "e-captured", &format!("shop-{n}.myshopify.com"));
        let a = post(&client, &url, &h, captured.clone()).await.unwrap();
        *statuses.entry(a.status).or_insert(0) += 1;
        if a.status == 422 {
            a.assert_error(422, "scope_limit");
        }
    }
    assert_eq!(statuses.get(&200), Some(&8), "{statuses:?}");
    assert_eq!(statuses.get(&422), Some(&292), "{statuses:?}");
    assert_eq!(sc.requests_total("shop", "scope_refused").await, 292.0);
    // Distinct signed deliveries, four times what the bound holds.
    for n in 0..1000 {
        let mut b = body(4096);
        b[8..16].copy_from_slice(format!("{n:08}").as_bytes());
        let h = shopify(&b, &format!("e-{n}"), "one.myshopify.com");
        assert_eq!(post(&client, &url, &h, b).await.unwrap().status, 200);
    }
    assert!(sc.metric("idemgate_store_evictions_total").await >= 500.0);
    // The other route's delivery, inside its retention, is still remembered.
    let copy = sc.send(&d.clone().ts(now_secs())).await;
    assert_eq!(copy.status, 200, "{copy:?}");
    assert!(copy.replayed(), "forwarded again: {copy:?}");
    assert_eq!(up.count(), 1 + 8 + 1000);
}
