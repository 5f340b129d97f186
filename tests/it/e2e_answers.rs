//! End-to-end: every row of README's "What each delivery gets" table, against
//! the real binary, a recording upstream and (where the store matters) both a
//! private redis-server and the in-memory store.

use std::time::Duration;

use crate::common::*;

const SEC: Duration = Duration::from_secs(1);

/// Store + upstream + sidecar, dropped sidecar first.
struct Env {
    sc: Sidecar,
    up: Upstream,
    store: TestStore,
}

async fn env(kind: StoreKind, cfg: impl FnOnce(SidecarBuilder) -> SidecarBuilder) -> Env {
    let store = TestStore::new(kind);
    let up = Upstream::start().await;
    let sc = cfg(SidecarBuilder::new(&up.url(), &store.url()))
        .start()
        .await;
    Env { sc, up, store }
}

/// Generates `redis::NAME` and `memory::NAME` tests from `async fn NAME(StoreKind)`.
macro_rules! both_stores {
    ($($name:ident),* $(,)?) => {
        mod redis_store {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name(super::StoreKind::Redis).await
                }
            )*
        }
        mod memory_store {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name(super::StoreKind::Memory).await
                }
            )*
        }
    };
}

both_stores!(
    first_seen_2xx_is_forwarded_then_duplicates_replayed,
    non_2xx_releases_claim_and_retry_is_forwarded,
    upstream_unreachable_is_502_and_released,
    upstream_too_slow_is_504_and_released,
    copy_while_in_flight_gets_409_with_retry_after,
    in_flight_wait_copy_gets_first_answer_replayed,
    in_flight_wait_copy_is_forwarded_when_first_released,
    in_flight_wait_gives_409_after_wait_timeout,
    same_key_different_payload_is_422_in_flight_and_completed,
    retry_with_new_timestamp_same_body_is_replayed_never_422,
    non_utf8_body_is_forwarded_byte_for_byte,
    secret_rotation_accepts_either_secret,
    no_idempotency_key_is_400,
    admin_endpoints_answer,
);

fn ok_mode(status: u16, body: &str) -> Mode {
    Mode::Ok {
        status,
        headers: vec![
            ("x-upstream".into(), "yes".into()),
            ("x-custom-resp".into(), "abc-123".into()),
            ("content-type".into(), "application/json".into()),
        ],
        body: body.as_bytes().to_vec(),
    }
}

// ---------------------------------------------------------------------------
// first seen / completed / replay
// ---------------------------------------------------------------------------

async fn first_seen_2xx_is_forwarded_then_duplicates_replayed(kind: StoreKind) {
    let e = env(kind, |b| b).await;
    let answer_body = r#"{"received":true,"n":1}"#;
    e.up.set_mode(ok_mode(201, answer_body));
    let d = Delivery::fresh()
        .path("/webhooks/wh?a=1&b=two%20words")
        .header("host", "hooks.example.com")
        .header("x-tenant", "acme");

    let a = e.sc.send(&d).await;
    assert_eq!(a.status, 201, "{a:?}");
    assert_eq!(a.text(), answer_body);
    assert_eq!(a.header("x-upstream").as_deref(), Some("yes"));
    assert_eq!(a.header("x-custom-resp").as_deref(), Some("abc-123"));
    assert_eq!(
        a.header("content-type").as_deref(),
        Some("application/json")
    );
    assert!(!a.replayed(), "a first delivery is not a replay: {a:?}");

    // what the application saw
    assert_eq!(e.up.count(), 1);
    let r = e.up.last();
    assert_eq!(r.method, "POST");
    assert_eq!(r.path_and_query, "/webhooks/wh?a=1&b=two%20words");
    assert_eq!(r.header("host").as_deref(), Some("hooks.example.com"));
    assert_eq!(r.header("x-tenant").as_deref(), Some("acme"));
    assert_eq!(
        r.header("content-type").as_deref(),
        Some("application/json")
    );
    assert_eq!(r.header("webhook-id").as_deref(), Some(d.id.as_str()));
    assert_eq!(
        r.header("webhook-signature"),
        Some(sign_standard(SECRET, &d.id, d.ts, &d.body))
    );
    assert_eq!(
        r.header_all("idempotency-key"),
        vec![format!("wh:{}", d.id)],
        "exactly one idempotency-key header"
    );
    assert_eq!(&r.body[..], &d.body[..]);

    // duplicates: the stored answer, marked replayed, upstream not called
    for n in 1..=2 {
        let b = e.sc.send(&d).await;
        assert_eq!(b.status, 201, "{b:?}");
        assert!(b.replayed(), "duplicate must be marked replayed: {b:?}");
        assert_eq!(b.text(), answer_body);
        assert_eq!(b.header("x-upstream").as_deref(), Some("yes"));
        assert_eq!(b.header("x-custom-resp").as_deref(), Some("abc-123"));
        assert_eq!(
            b.header("content-type").as_deref(),
            Some("application/json")
        );
        e.sc.wait_requests_total(ROUTE, "replayed", n as f64).await;
    }
    e.up.assert_count_stays(1, Duration::from_millis(200)).await;
    e.sc.wait_requests_total(ROUTE, "forwarded", 1.0).await;
    // secrets, signatures and bodies never appear in logs
    let sig = sign_standard(SECRET, &d.id, d.ts, &d.body);
    e.sc.assert_log_lacks(&[
        SECRET,
        SECRET.trim_start_matches("whsec_"),
        sig.trim_start_matches("v1,"),
        "invoice.paid",
        answer_body,
    ]);
    assert_eq!(e.sc.requests_total(ROUTE, "upstream_error").await, 0.0);

    if kind == StoreKind::Redis {
        // keys: prefixed, hash-tagged (one slot per delivery), all expiring,
        // the completed record kept for about `retention` (1h here)
        let r = e.store.redis();
        let keys: Vec<String> = r.keys().into_iter().filter(|k| k.contains(&d.id)).collect();
        assert!(
            !keys.is_empty(),
            "no redis key names the delivery: {:?}",
            r.keys()
        );
        let mut tags = std::collections::HashSet::new();
        let mut max_ttl = 0i64;
        for k in &keys {
            assert!(
                k.starts_with("idemgate-test"),
                "key {k:?} ignores key_prefix"
            );
            let open = k
                .find('{')
                .unwrap_or_else(|| panic!("key {k:?} has no hash tag"));
            let close = k[open..].find('}').expect("closing brace") + open;
            tags.insert(k[open + 1..close].to_string());
            let ttl: i64 = r.cli(&["PTTL", k]).parse().unwrap();
            assert!(ttl > 0, "key {k:?} does not expire (PTTL {ttl})");
            max_ttl = max_ttl.max(ttl);
        }
        assert_eq!(
            tags.len(),
            1,
            "keys of one delivery in several slots: {keys:?}"
        );
        assert!(
            max_ttl > 30 * 60 * 1000 && max_ttl <= 3600 * 1000,
            "completed record should be kept ~retention (1h), PTTL {max_ttl}"
        );
    }
}

async fn retry_with_new_timestamp_same_body_is_replayed_never_422(kind: StoreKind) {
    let e = env(kind, |b| b).await;
    let d = Delivery::fresh().ts(now_secs() - 120);
    let a = e.sc.send(&d).await;
    assert_eq!(a.status, 200);
    assert!(!a.replayed());
    // the provider's retry: same id and body, new timestamp and signature
    for ts in [now_secs() - 30, now_secs()] {
        let retry = d.clone().ts(ts);
        let b = e.sc.send(&retry).await;
        assert_eq!(b.status, 200, "retry must be replayed, got {b:?}");
        assert!(b.replayed(), "{b:?}");
        assert_eq!(b.text(), a.text());
    }
    e.up.assert_count_stays(1, Duration::from_millis(100)).await;
    assert_eq!(e.sc.requests_total(ROUTE, "payload_mismatch").await, 0.0);
}

// ---------------------------------------------------------------------------
// released claims
// ---------------------------------------------------------------------------

async fn non_2xx_releases_claim_and_retry_is_forwarded(kind: StoreKind) {
    let e = env(kind, |b| b).await;
    e.up.push_modes(vec![Mode::Status(500), Mode::Status(429)]);
    let d = Delivery::fresh();

    let a = e.sc.send(&d).await;
    assert_eq!(a.status, 500);
    assert_eq!(
        a.text(),
        r#"{"upstream_status":500}"#,
        "the upstream's answer"
    );
    assert_eq!(a.header("x-upstream").as_deref(), Some("yes"));
    assert!(!a.replayed());
    assert_eq!(e.up.count(), 1);

    let a = e.sc.send(&d).await;
    assert_eq!(
        a.status, 429,
        "the retry after a 500 must be forwarded: {a:?}"
    );
    assert!(!a.replayed());
    assert_eq!(e.up.count(), 2);

    let a = e.sc.send(&d).await;
    assert_eq!(a.status, 200, "{a:?}");
    assert!(!a.replayed());
    assert_eq!(e.up.count(), 3);
    for r in e.up.requests() {
        assert_eq!(r.header("idempotency-key"), Some(format!("wh:{}", d.id)));
        assert_eq!(&r.body[..], &d.body[..]);
    }

    let a = e.sc.send(&d).await;
    assert_eq!(a.status, 200);
    assert!(a.replayed(), "{a:?}");
    e.up.assert_count_stays(3, Duration::from_millis(100)).await;

    e.sc.wait_requests_total(ROUTE, "upstream_error", 2.0).await;
    e.sc.wait_requests_total(ROUTE, "forwarded", 1.0).await;
    e.sc.wait_requests_total(ROUTE, "replayed", 1.0).await;
}

async fn upstream_unreachable_is_502_and_released(kind: StoreKind) {
    let store = TestStore::new(kind);
    let addr = Upstream::unused_addr();
    let sc = SidecarBuilder::new(&format!("http://{addr}"), &store.url())
        .start()
        .await;
    let d = Delivery::fresh();
    let a = sc.send(&d).await;
    a.assert_error(502, "upstream_unreachable");
    assert!(!a.replayed());

    // the application comes up: the provider's retry is forwarded
    let up = Upstream::start_at(addr).await;
    let a = sc.send(&d).await;
    assert_eq!(a.status, 200, "retry after 502 must be forwarded: {a:?}");
    assert!(!a.replayed());
    assert_eq!(up.count(), 1);
    assert_eq!(
        up.last().header("idempotency-key"),
        Some(format!("wh:{}", d.id))
    );
    sc.wait_requests_total(ROUTE, "upstream_error", 1.0).await;
    sc.wait_requests_total(ROUTE, "forwarded", 1.0).await;
}

async fn upstream_too_slow_is_504_and_released(kind: StoreKind) {
    let e = env(kind, |b| b.top("upstream_timeout", "1s")).await;
    e.up.push_modes(vec![Mode::Hang]);
    let d = Delivery::fresh();
    let a = e.sc.send(&d).await;
    a.assert_error(504, "upstream_timeout");
    assert!(
        a.elapsed >= Duration::from_millis(900) && a.elapsed < Duration::from_secs(4),
        "504 should come after ~upstream_timeout (1s), took {:?}",
        a.elapsed
    );
    assert_eq!(e.up.count(), 1, "the call was attempted");

    let a = e.sc.send(&d).await;
    assert_eq!(a.status, 200, "retry after 504 must be forwarded: {a:?}");
    assert!(!a.replayed());
    assert_eq!(e.up.count(), 2);
    e.sc.wait_requests_total(ROUTE, "upstream_error", 1.0).await;
    e.sc.wait_requests_total(ROUTE, "forwarded", 1.0).await;
}

// ---------------------------------------------------------------------------
// in flight
// ---------------------------------------------------------------------------

async fn copy_while_in_flight_gets_409_with_retry_after(kind: StoreKind) {
    let e = env(kind, |b| b).await;
    // The application answers once the copy was answered: in flight however slow.
    let hold = Hold::default();
    e.up.push_modes(vec![Mode::Held(
        hold.clone(),
        Box::new(ok_mode(200, r#"{"first":true}"#)),
    )]);
    let d = Delivery::fresh();
    let first = e.sc.send_spawned(&d);
    e.up.wait_for_count(1, 5 * SEC).await;
    e.sc.wait_metric("idemgate_in_flight", 1.0).await;

    let c = e.sc.send(&d).await;
    hold.release();
    c.assert_error(409, "in_flight");
    assert!(c.retry_after() >= 1);
    assert!(!c.replayed());
    assert_eq!(e.up.count(), 1);

    let a = first.await.unwrap();
    assert_eq!(a.status, 200);
    assert_eq!(a.text(), r#"{"first":true}"#);
    assert!(!a.replayed());

    let r = e.sc.send(&d).await;
    assert_eq!(r.status, 200);
    assert!(r.replayed());
    assert_eq!(r.text(), r#"{"first":true}"#);
    e.up.assert_count_stays(1, Duration::from_millis(100)).await;
    e.sc.wait_requests_total(ROUTE, "in_flight", 1.0).await;
    e.sc.wait_metric("idemgate_in_flight", 0.0).await;
}

async fn in_flight_wait_copy_gets_first_answer_replayed(kind: StoreKind) {
    let e = env(kind, |b| {
        b.dedup("in_flight", "wait").dedup("wait_timeout", "5s")
    })
    .await;
    e.up.push_modes(vec![Mode::Delayed(
        Duration::from_millis(1000),
        Box::new(ok_mode(202, r#"{"first":"answer"}"#)),
    )]);
    let d = Delivery::fresh();
    let first = e.sc.send_spawned(&d);
    e.up.wait_for_count(1, 5 * SEC).await;

    let c = e.sc.send(&d).await;
    assert_eq!(
        c.status, 202,
        "the waiting copy gets the first's answer: {c:?}"
    );
    assert!(c.replayed(), "{c:?}");
    assert_eq!(c.text(), r#"{"first":"answer"}"#);
    assert_eq!(c.header("x-custom-resp").as_deref(), Some("abc-123"));

    let a = first.await.unwrap();
    assert_eq!(a.status, 202);
    assert!(!a.replayed());
    e.up.assert_count_stays(1, Duration::from_millis(200)).await;
}

async fn in_flight_wait_copy_is_forwarded_when_first_released(kind: StoreKind) {
    let e = env(kind, |b| {
        b.dedup("in_flight", "wait").dedup("wait_timeout", "5s")
    })
    .await;
    e.up.push_modes(vec![Mode::Delayed(
        Duration::from_millis(1000),
        Box::new(Mode::Status(500)),
    )]);
    let d = Delivery::fresh();
    let first = e.sc.send_spawned(&d);
    e.up.wait_for_count(1, 5 * SEC).await;

    let c = e.sc.send(&d).await;
    assert_eq!(
        c.status, 200,
        "first was released (500): the waiting copy must claim and be forwarded: {c:?}"
    );
    assert!(!c.replayed(), "{c:?}");
    assert_eq!(c.text(), r#"{"ok":true}"#);

    let a = first.await.unwrap();
    assert_eq!(a.status, 500);
    assert_eq!(e.up.count(), 2);
    for r in e.up.requests() {
        assert_eq!(r.header("idempotency-key"), Some(format!("wh:{}", d.id)));
    }
    let r = e.sc.send(&d).await;
    assert!(r.replayed() && r.status == 200, "{r:?}");
    e.up.assert_count_stays(2, Duration::from_millis(100)).await;
}

async fn in_flight_wait_gives_409_after_wait_timeout(kind: StoreKind) {
    let e = env(kind, |b| {
        b.dedup("in_flight", "wait").dedup("wait_timeout", "1s")
    })
    .await;
    // The application answers once the copy was answered, so only `wait_timeout` can
    // end the copy's wait (else it would wait until the client gives up).
    let hold = Hold::default();
    e.up.push_modes(vec![Mode::held(&hold)]);
    let d = Delivery::fresh();
    let first = e.sc.send_spawned(&d);
    e.up.wait_for_count(1, 5 * SEC).await;

    let c = e.sc.send(&d).await;
    hold.release();
    c.assert_error(409, "in_flight");
    assert!(c.retry_after() >= 1);
    assert!(
        c.elapsed >= Duration::from_millis(900) && c.elapsed < Duration::from_secs(10),
        "the copy should be held ~wait_timeout (1s), was {:?}",
        c.elapsed
    );
    let a = first.await.unwrap();
    assert_eq!(a.status, 200);
    e.up.assert_count_stays(1, Duration::from_millis(100)).await;
}

// ---------------------------------------------------------------------------
// payload mismatch
// ---------------------------------------------------------------------------

async fn same_key_different_payload_is_422_in_flight_and_completed(kind: StoreKind) {
    let e = env(kind, |b| b).await;
    e.up.push_modes(vec![Mode::Stall(Duration::from_millis(1200))]);
    let d = Delivery::fresh();
    let other = d
        .clone()
        .body(r#"{"type":"invoice.paid","data":{"amount":1}}"#);

    let first = e.sc.send_spawned(&d);
    e.up.wait_for_count(1, 5 * SEC).await;
    let m = e.sc.send(&other).await;
    m.assert_error(422, "payload_mismatch");
    assert_eq!(e.up.count(), 1);

    let a = first.await.unwrap();
    assert_eq!(a.status, 200);

    let m = e.sc.send(&other).await;
    m.assert_error(422, "payload_mismatch");
    // unchanged: the original payload still replays
    let r = e.sc.send(&d).await;
    assert!(r.replayed() && r.status == 200, "{r:?}");
    e.up.assert_count_stays(1, Duration::from_millis(100)).await;
    e.sc.wait_requests_total(ROUTE, "payload_mismatch", 2.0)
        .await;
}

async fn non_utf8_body_is_forwarded_byte_for_byte(kind: StoreKind) {
    let e = env(kind, |b| b).await;
    let mut body: Vec<u8> = (0..=255u8).collect();
    body.extend_from_slice(&[0xc3, 0x28, 0xff, 0xfe, 0x00, b'\r', b'\n']);
    assert!(std::str::from_utf8(&body).is_err());
    let d = Delivery::fresh()
        .body(body.clone())
        .header("content-type", "application/octet-stream");
    let a = e.sc.send(&d).await;
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(e.up.count(), 1);
    assert_eq!(&e.up.last().body[..], &body[..], "body changed on the way");

    let r = e.sc.send(&d).await;
    assert!(r.replayed() && r.status == 200, "{r:?}");
    // one byte different: a different fingerprint
    let mut flipped = body.clone();
    flipped[200] ^= 0x01;
    let m = e.sc.send(&d.clone().body(flipped)).await;
    m.assert_error(422, "payload_mismatch");
    e.up.assert_count_stays(1, Duration::from_millis(100)).await;
}

// ---------------------------------------------------------------------------
// signatures and keys
// ---------------------------------------------------------------------------

async fn secret_rotation_accepts_either_secret(kind: StoreKind) {
    let e = env(kind, |b| {
        b.route(RouteCfg::standard(ROUTE, PATH).secrets(&[SECRET, SECRET_2]))
    })
    .await;
    let d1 = Delivery::fresh().secret(SECRET);
    let d2 = Delivery::fresh().secret(SECRET_2);
    let d3 = Delivery::fresh().secret(SECRET_WRONG);
    assert_eq!(e.sc.send(&d1).await.status, 200);
    assert_eq!(e.sc.send(&d2).await.status, 200);
    e.sc.send(&d3).await.assert_error(401, "invalid_signature");
    assert_eq!(e.up.count(), 2);
    let ids: Vec<_> =
        e.up.requests()
            .iter()
            .map(|r| r.header("webhook-id"))
            .collect();
    assert_eq!(ids, vec![Some(d1.id.clone()), Some(d2.id.clone())]);
}

async fn no_idempotency_key_is_400(kind: StoreKind) {
    let e = env(kind, |b| {
        b.route(RouteCfg::standard(ROUTE, PATH).key("json:/id"))
            .route(RouteCfg::standard("hdr", "/webhooks/hdr").key("header:X-Event-Id"))
    })
    .await;
    // json:/id route
    for body in [&br#"{"type":"no.id.here"}"#[..], &b"not json at all"[..]] {
        let a = e.sc.send(&Delivery::fresh().body(body)).await;
        a.assert_error(400, "bad_request");
    }
    assert_eq!(e.up.count(), 0);
    let evt = unique_id("evt");
    let body = format!(r#"{{"id":"{evt}","type":"x"}}"#);
    let a = e.sc.send(&Delivery::fresh().body(body.clone())).await;
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(
        e.up.last().header("idempotency-key"),
        Some(format!("wh:{evt}"))
    );
    // another webhook-id, same json id: a duplicate under the overridden key
    let a = e.sc.send(&Delivery::fresh().body(body)).await;
    assert!(
        a.replayed() && a.status == 200,
        "key must come from json:/id: {a:?}"
    );
    assert_eq!(e.up.count(), 1);

    // header:X-Event-Id route
    let d = Delivery::fresh().path("/webhooks/hdr");
    e.sc.send(&d).await.assert_error(400, "bad_request");
    assert_eq!(e.up.count(), 1);
    let ev = unique_id("ev");
    let a = e.sc.send(&d.clone().header("X-Event-Id", &ev)).await;
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(
        e.up.last().header("idempotency-key"),
        Some(format!("hdr:{ev}"))
    );
    assert_eq!(e.up.count(), 2);
    e.sc.wait_requests_total(ROUTE, "bad_request", 2.0).await;
    e.sc.wait_requests_total("hdr", "bad_request", 1.0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn missing_headers_or_bad_timestamp_is_400_and_touches_nothing() {
    let e = env(StoreKind::Redis, |b| b).await;
    let d = Delivery::fresh();
    let cases = vec![
        ("no webhook-id", d.clone().omit("webhook-id")),
        ("no webhook-timestamp", d.clone().omit("webhook-timestamp")),
        ("no webhook-signature", d.clone().omit("webhook-signature")),
        (
            "timestamp not an integer",
            d.clone().timestamp_raw("yesterday"),
        ),
        (
            "timestamp a decimal",
            d.clone().timestamp_raw(&format!("{}.5", d.ts)),
        ),
    ];
    for (what, c) in &cases {
        let a = e.sc.send(c).await;
        assert_eq!(a.status, 400, "{what}: {a:?}");
        a.assert_error(400, "bad_request");
    }
    assert_eq!(e.up.count(), 0);
    assert_eq!(
        e.store.redis().keys(),
        Vec::<String>::new(),
        "store touched"
    );
    e.sc.wait_requests_total(ROUTE, "bad_request", cases.len() as f64)
        .await;
    // the key was neither created nor blocked
    let a = e.sc.send(&d).await;
    assert_eq!(a.status, 200, "{a:?}");
    assert!(!a.replayed());
    assert_eq!(e.up.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_signatures_are_401_and_touch_nothing() {
    let e = env(StoreKind::Redis, |b| b).await;
    let d = Delivery::fresh();
    align_to_second_start().await;
    let now = now_secs();
    let cases = vec![
        ("wrong secret", d.clone().secret(SECRET_WRONG)),
        ("empty signature", d.clone().signature("")),
        (
            "unknown version only",
            d.clone().signature("v2,c2lnbmF0dXJlCg=="),
        ),
        ("garbage", d.clone().signature("v1,!!!not-base64!!!")),
        (
            "signed for another body",
            d.clone()
                .signature(&sign_standard(SECRET, &d.id, d.ts, b"other")),
        ),
        ("timestamp too old", d.clone().ts(now - 301)),
        ("timestamp too new", d.clone().ts(now + 301)),
    ];
    for (what, c) in &cases {
        let a = e.sc.send(c).await;
        assert_eq!(a.status, 401, "{what}: {a:?}");
        a.assert_error(401, "invalid_signature");
    }
    assert_eq!(e.up.count(), 0);
    assert_eq!(
        e.store.redis().keys(),
        Vec::<String>::new(),
        "store touched"
    );
    e.sc.wait_requests_total(ROUTE, "invalid_signature", cases.len() as f64)
        .await;
    let wrong_sig = sign_standard(SECRET_WRONG, &d.id, d.ts, &d.body);
    e.sc.assert_log_lacks(&[
        wrong_sig.trim_start_matches("v1,"),
        "c2lnbmF0dXJlCg==",
        "invoice.paid",
    ]);

    // none of them created or blocked the key
    let a = e.sc.send(&d).await;
    assert_eq!(a.status, 200, "{a:?}");
    assert!(!a.replayed());
    assert_eq!(e.up.count(), 1);

    // one matching signature among several is enough
    let m = Delivery::fresh();
    let good = sign_standard(SECRET, &m.id, m.ts, &m.body);
    let bad = sign_standard(SECRET_WRONG, &m.id, m.ts, &m.body);
    let a =
        e.sc.send(&m.clone().signature(&format!("v2,abc {bad} {good}")))
            .await;
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(e.up.count(), 2);

    // exactly `tolerance` away, both directions: accepted
    align_to_second_start().await;
    let now = now_secs();
    let old = Delivery::fresh().ts(now - 300);
    let new = Delivery::fresh().ts(now + 300);
    let a = e.sc.send(&old).await;
    assert_eq!(a.status, 200, "timestamp exactly tolerance old: {a:?}");
    let a = e.sc.send(&new).await;
    assert_eq!(a.status, 200, "timestamp exactly tolerance ahead: {a:?}");
    assert_eq!(e.up.count(), 4);
}

// ---------------------------------------------------------------------------
// size, routing, hop-by-hop
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn body_over_max_body_is_413_with_connection_close() {
    let e = env(StoreKind::Memory, |b| b.top("max_body", "2KiB")).await;

    // exactly max_body: fine
    let d = Delivery::fresh().body(vec![b'a'; 2048]);
    let a = e.sc.send(&d).await;
    assert_eq!(
        a.status, 200,
        "a body of exactly max_body is accepted: {a:?}"
    );
    assert_eq!(e.up.count(), 1);

    // one byte over
    let big = Delivery::fresh().body(vec![b'a'; 2049]);
    let a = e.sc.send(&big).await;
    a.assert_error(413, "too_large");
    assert_eq!(a.header("connection").as_deref(), Some("close"), "{a:?}");

    // 10 MiB announced, 4 KiB sent: answered without reading the rest
    let hdrs = Delivery::fresh().headers();
    let mut head = format!(
        "POST {PATH} HTTP/1.1\r\nhost: {}\r\ncontent-length: {}\r\n",
        e.sc.listen,
        10 * 1024 * 1024
    );
    for (k, v) in &hdrs {
        head += &format!("{k}: {v}\r\n");
    }
    head += "\r\n";
    let (out, closed) = raw_exchange(e.sc.listen, &head, &[b'x'; 4096], 5 * SEC).await;
    let text = String::from_utf8_lossy(&out).to_ascii_lowercase();
    assert!(
        text.starts_with("http/1.1 413"),
        "expected an early 413, got {text:?}"
    );
    assert!(text.contains("connection: close"), "{text:?}");
    assert!(text.contains("too_large"), "{text:?}");
    assert!(closed, "the connection must be closed after a 413");

    // chunked, no length: cut off once past max_body
    let mut head = format!(
        "POST {PATH} HTTP/1.1\r\nhost: {}\r\ntransfer-encoding: chunked\r\n",
        e.sc.listen
    );
    for (k, v) in &hdrs {
        head += &format!("{k}: {v}\r\n");
    }
    head += "\r\n";
    let mut chunk = b"1000\r\n".to_vec();
    chunk.extend_from_slice(&[b'y'; 4096]);
    chunk.extend_from_slice(b"\r\n");
    let (out, _) = raw_exchange(e.sc.listen, &head, &chunk, 5 * SEC).await;
    let text = String::from_utf8_lossy(&out).to_ascii_lowercase();
    assert!(text.starts_with("http/1.1 413"), "chunked: {text:?}");

    e.up.assert_count_stays(1, Duration::from_millis(100)).await;
    e.sc.wait_requests_total(ROUTE, "too_large", 3.0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unknown_path_is_404_no_route() {
    let e = env(StoreKind::Memory, |b| b).await;
    let a = e.sc.send(&Delivery::fresh().path("/webhooks/nope")).await;
    a.assert_error(404, "no_route");
    let a =
        e.sc.send(&Delivery::fresh().path("/webhooks/wh/extra"))
            .await;
    a.assert_error(404, "no_route");
    assert_eq!(e.up.count(), 0);
    e.sc.wait_metric(
        "idemgate_requests_total{route=\"-\",outcome=\"no_route\"}",
        2.0,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hop_by_hop_headers_are_not_forwarded() {
    let e = env(StoreKind::Memory, |b| b).await;
    let d = Delivery::fresh()
        .header("connection", "keep-alive, x-hop-secret")
        .header("x-hop-secret", "1")
        .header("keep-alive", "timeout=5")
        .header("x-end-to-end", "kept");
    let a = e.sc.send(&d).await;
    assert_eq!(a.status, 200, "{a:?}");
    let r = e.up.last();
    assert_eq!(r.header("x-end-to-end").as_deref(), Some("kept"));
    assert_eq!(
        r.header("x-hop-secret"),
        None,
        "a header named in Connection was forwarded"
    );
    assert_eq!(r.header("keep-alive"), None, "keep-alive was forwarded");
    assert_eq!(&r.body[..], &d.body[..]);
}

/// No `Proxy-*` header crosses the sidecar, in either direction: not to the
/// application, not back to the provider, not in a replayed answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn proxy_headers_are_not_forwarded_in_either_direction() {
    let e = env(StoreKind::Memory, |b| b).await;
    e.up.set_mode(Mode::Ok {
        status: 200,
        headers: vec![
            ("proxy-status".into(), "app; error=none".into()),
            ("proxy-x-from-app".into(), "1".into()),
            ("x-upstream".into(), "yes".into()),
        ],
        body: b"{}".to_vec(),
    });
    let d = Delivery::fresh()
        .header("proxy-authorization", "Basic c2VjcmV0")
        .header("proxy-authenticate", "Basic")
        .header("proxy-connection", "keep-alive")
        .header("proxy-status", "edge; error=none")
        .header("proxy-x-tenant", "acme")
        .header("x-end-to-end", "kept");
    let proxy = |names: Vec<String>| -> Vec<String> {
        names
            .into_iter()
            .filter(|n| n.starts_with("proxy-"))
            .collect()
    };
    let a = e.sc.send(&d).await;
    assert_eq!(a.status, 200, "{a:?}");
    let r = e.up.last();
    assert_eq!(r.header("x-end-to-end").as_deref(), Some("kept"));
    let sent = proxy(r.headers.keys().map(|k| k.to_string()).collect());
    assert!(sent.is_empty(), "forwarded to the application: {sent:?}");
    let back = proxy(a.headers.keys().map(|k| k.to_string()).collect());
    assert!(back.is_empty(), "passed back to the provider: {back:?}");
    assert_eq!(a.header("x-upstream").as_deref(), Some("yes"));
    let copy = e.sc.send(&d).await;
    assert!(copy.replayed(), "{copy:?}");
    let replayed = proxy(copy.headers.keys().map(|k| k.to_string()).collect());
    assert!(replayed.is_empty(), "in the replayed answer: {replayed:?}");
}

/// The `(route, outcome)` pairs of `idemgate_requests_total` (and of the request
/// duration histogram's `_count`) in a /metrics text.
fn outcome_series(m: &str, family: &str) -> std::collections::BTreeSet<(String, String)> {
    let label = |line: &str, name: &str| -> String {
        let at = line.find(&format!("{name}=\"")).expect(name) + name.len() + 2;
        line[at..].split('"').next().unwrap_or_default().to_string()
    };
    m.lines()
        .filter(|l| l.starts_with(&format!("{family}{{")))
        .map(|l| (label(l, "route"), label(l, "outcome")))
        .collect()
}

/// Each route exports, from start and at 0, exactly the outcomes it can produce:
/// `route="-"` only `no_route` and `overloaded`; a sync route never `no_route` or the
/// async outcomes; an async route never `forwarded`; `bypassed` only with
/// `on_error = "pass"`, which in turn never answers `store_unavailable` on a sync route.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn metrics_export_only_the_series_a_route_can_produce() {
    const COMMON: &[&str] = &[
        "replayed",
        "in_flight",
        "payload_mismatch",
        "invalid_signature",
        "bad_request",
        "too_large",
        "overloaded",
        "client_timeout",
    ];
    let expected = |on_error: &str| {
        let pass = on_error == "pass";
        let mut want = std::collections::BTreeSet::new();
        let mut add = |route: &str, outcomes: &[&str]| {
            for o in outcomes {
                want.insert((route.to_string(), o.to_string()));
            }
        };
        add("-", &["no_route", "overloaded"]);
        add(ROUTE, COMMON);
        add(ROUTE, &["forwarded", "upstream_error"]);
        add(
            ROUTE,
            if pass {
                &["bypassed"]
            } else {
                &["store_unavailable"]
            },
        );
        add("aq", COMMON);
        add("aq", &["queued", "queue_full", "store_unavailable"]);
        if pass {
            add("aq", &["bypassed", "upstream_error"]);
        }
        want
    };
    for on_error in ["reject", "pass"] {
        let mut aq = RouteCfg::standard("aq", "/webhooks/aq");
        aq.extra = "mode = \"async\"\n".into();
        let e = env(StoreKind::Memory, |b| {
            b.store_opt("on_error", on_error)
                .route(RouteCfg::standard(ROUTE, PATH))
                .route(aq)
        })
        .await;
        let m = e.sc.metrics().await;
        let want = expected(on_error);
        for family in [
            "idemgate_requests_total",
            "idemgate_request_duration_seconds_count",
        ] {
            let got = outcome_series(&m, family);
            let extra: Vec<_> = got.difference(&want).collect();
            let missing: Vec<_> = want.difference(&got).collect();
            assert!(
                extra.is_empty() && missing.is_empty(),
                "on_error = {on_error}, {family}: never-moving series {extra:?}, missing {missing:?}"
            );
        }
        for line in m
            .lines()
            .filter(|l| l.starts_with("idemgate_requests_total{"))
        {
            assert!(line.ends_with(" 0"), "not 0 at start: {line}");
        }
        // the per-route upstream and lease families exist only where they can move
        let routes_of = |family: &str| -> Vec<String> {
            m.lines()
                .filter(|l| l.starts_with(&format!("{family}{{")))
                .filter_map(|l| l.split("route=\"").nth(1))
                .filter_map(|r| r.split('"').next())
                .map(str::to_string)
                .collect()
        };
        let upstream_routes = if on_error == "pass" {
            vec![ROUTE.to_string(), "aq".to_string()]
        } else {
            vec![ROUTE.to_string()]
        };
        let mut got = routes_of("idemgate_upstream_duration_seconds_count");
        got.sort();
        let mut want_up = upstream_routes.clone();
        want_up.sort();
        assert_eq!(
            got, want_up,
            "on_error = {on_error}: upstream duration routes"
        );
        assert_eq!(
            routes_of("idemgate_lease_lost_total"),
            vec![ROUTE.to_string()],
            "on_error = {on_error}: lease lost routes"
        );
        // and a series still moves when its outcome happens
        let a = e.sc.send(&Delivery::fresh()).await;
        assert_eq!(a.status, 200, "{a:?}");
        e.sc.wait_requests_total(ROUTE, "forwarded", 1.0).await;
    }
}

// ---------------------------------------------------------------------------
// store trouble, lease loss
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn store_down_with_reject_is_503_with_retry_after() {
    let mut e = env(StoreKind::Redis, |b| {
        b.store_opt("on_error", "reject")
            .store_opt("timeout", "500ms")
    })
    .await;
    e.store.redis_mut().stop();
    let a = e.sc.send(&Delivery::fresh()).await;
    a.assert_error(503, "store_unavailable");
    assert!(a.retry_after() >= 1);
    assert!(a.elapsed < Duration::from_secs(3), "took {:?}", a.elapsed);
    assert_eq!(e.up.count(), 0);
    e.sc.wait_requests_total(ROUTE, "store_unavailable", 1.0)
        .await;
    e.sc.wait_metric_at_least("idemgate_store_errors_total{op=\"claim\"}", 1.0)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn store_hanging_is_503_within_store_timeout() {
    let e = env(StoreKind::Redis, |b| {
        b.store_opt("on_error", "reject")
            .store_opt("timeout", "500ms")
    })
    .await;
    // a working round first, so the pool has live connections
    assert_eq!(e.sc.send(&Delivery::fresh()).await.status, 200);
    e.store.redis().pause(4000);
    let a = e.sc.send(&Delivery::fresh()).await;
    a.assert_error(503, "store_unavailable");
    assert!(a.retry_after() >= 1);
    assert!(
        a.elapsed < Duration::from_millis(2000),
        "503 must come within the store timeout (500ms), took {:?}",
        a.elapsed
    );
    assert_eq!(e.up.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn store_down_with_pass_forwards_and_counts_bypassed() {
    let mut e = env(StoreKind::Redis, |b| {
        b.store_opt("on_error", "pass")
            .store_opt("timeout", "500ms")
    })
    .await;
    e.store.redis_mut().stop();
    let d = Delivery::fresh().header("x-tenant", "acme");
    for n in 1..=2 {
        let a = e.sc.send(&d).await;
        assert_eq!(a.status, 200, "{a:?}");
        assert!(!a.replayed());
        assert_eq!(e.up.count(), n, "without the store every copy is forwarded");
        let r = e.up.last();
        assert_eq!(&r.body[..], &d.body[..]);
        assert_eq!(r.header("x-tenant").as_deref(), Some("acme"));
        assert_eq!(r.header("idempotency-key"), Some(format!("wh:{}", d.id)));
    }
    e.sc.wait_requests_total(ROUTE, "bypassed", 2.0).await;
    assert_eq!(e.sc.requests_total(ROUTE, "store_unavailable").await, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lease_lost_during_call_still_answers_and_is_counted() {
    let e = env(StoreKind::Redis, |b| {
        b.lease("1s").store_opt("timeout", "500ms")
    })
    .await;
    e.up.push_modes(vec![Mode::Delayed(
        Duration::from_millis(1500),
        Box::new(ok_mode(200, r#"{"slow":true}"#)),
    )]);
    let d = Delivery::fresh();
    let first = e.sc.send_spawned(&d);
    e.up.wait_for_count(1, 5 * SEC).await;
    // the claim vanishes under the claimer's feet
    assert_eq!(e.store.redis().cli(&["FLUSHALL"]), "OK");

    let a = first.await.unwrap();
    assert_eq!(a.status, 200, "the upstream's answer: {a:?}");
    assert_eq!(a.text(), r#"{"slow":true}"#);
    assert!(!a.replayed());
    e.sc.wait_metric("idemgate_lease_lost_total{route=\"wh\"}", 1.0)
        .await;
    let log = e.sc.stderr();
    assert!(
        log.lines().any(
            |l| l.contains("WARN") && (l.contains(&d.id) || l.to_lowercase().contains("lease"))
        ),
        "no warning about the lost lease in the log:\n{log}"
    );
    // The key was free when the answer came (README's answer table): the answer was
    // recorded without the claim, so the next copy is replayed, not forwarded again.
    let b = e.sc.send(&d).await;
    assert_eq!(b.status, 200);
    assert!(b.replayed(), "{b:?}");
    assert_eq!(b.text(), r#"{"slow":true}"#);
    assert_eq!(e.up.count(), 1);
}

// ---------------------------------------------------------------------------
// admin
// ---------------------------------------------------------------------------

async fn admin_endpoints_answer(kind: StoreKind) {
    let e = env(kind, |b| b).await;
    assert_eq!(e.sc.get_admin("/healthz").await.0, 200);
    assert_eq!(e.sc.readyz().await, 200);
    assert_eq!(e.sc.send(&Delivery::fresh()).await.status, 200);
    let m = e.sc.metrics().await;
    for name in [
        "idemgate_requests_total",
        "idemgate_request_duration_seconds",
        "idemgate_upstream_duration_seconds",
        "idemgate_in_flight",
        "idemgate_build_info",
    ] {
        assert!(m.contains(name), "/metrics lacks {name}:\n{m}");
    }
    if kind == StoreKind::Redis {
        assert!(m.contains("idemgate_store_duration_seconds"), "{m}");
        for op in ["claim", "complete"] {
            assert!(
                m.lines()
                    .any(|l| l.starts_with("idemgate_store_duration_seconds_count")
                        && l.contains(&format!("op=\"{op}\""))),
                "no store duration for op {op}:\n{m}"
            );
        }
    }
    e.sc.wait_requests_total(ROUTE, "forwarded", 1.0).await;
    assert!(
        metric_value(
            &m,
            &format!(
                "idemgate_build_info{{version=\"{}\"}}",
                env!("CARGO_PKG_VERSION")
            )
        )
        .is_some(),
        "build_info should carry the crate version:\n{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn json_log_has_one_event_per_delivery() {
    let e = env(StoreKind::Memory, |b| b.env("IDEMGATE_LOG_FORMAT", "json")).await;
    let d = Delivery::fresh();
    assert_eq!(e.sc.send(&d).await.status, 200);
    assert!(e.sc.send(&d).await.replayed());
    let end = std::time::Instant::now() + 3 * SEC;
    loop {
        let log = e.sc.stderr();
        let events: Vec<serde_json::Value> = log
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v.get("outcome").is_some() && v.to_string().contains(&d.id))
            .collect();
        if events.len() < 2 && std::time::Instant::now() < end {
            tokio::time::sleep(Duration::from_millis(30)).await;
            continue;
        }
        for outcome in ["forwarded", "replayed"] {
            let matching: Vec<_> = events
                .iter()
                .filter(|v| v.get("outcome").and_then(|o| o.as_str()) == Some(outcome))
                .collect();
            assert_eq!(
                matching.len(),
                1,
                "one JSON event with outcome {outcome} for {}:\n{log}",
                d.id
            );
            let ev = matching[0];
            assert_eq!(
                ev.get("route").and_then(|r| r.as_str()),
                Some(ROUTE),
                "{ev}"
            );
            assert_eq!(
                ev.get("key").and_then(|r| r.as_str()),
                Some(d.id.as_str()),
                "{ev}"
            );
            assert_eq!(ev.get("status").and_then(|r| r.as_u64()), Some(200), "{ev}");
            let obj = ev.as_object().unwrap();
            assert!(
                obj.keys().any(|k| k.starts_with("duration")),
                "no duration in {ev}"
            );
        }
        break;
    }
    e.sc.assert_log_lacks(&[SECRET.trim_start_matches("whsec_"), "invoice.paid"]);
}
