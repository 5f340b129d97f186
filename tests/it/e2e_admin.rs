//! The admin API against the real binary and a real redis-server: auth,
//! list (filters, pagination), show, forget, replay — including a replay that reaches
//! the application exactly once while 20 provider copies arrive at the same time.

use std::time::Duration;

use crate::common::admin::*;
use crate::common::*;

#[tokio::test]
async fn the_admin_api_is_off_without_a_token_and_metrics_stay_open() {
    let redis = RedisServer::start_new();
    let upstream = Upstream::start().await;
    let sc = SidecarBuilder::new(&upstream.url(), &redis.url())
        .start()
        .await;
    assert_eq!(
        api(&sc, "GET", "/admin/deliveries", Some(TOKEN))
            .await
            .status,
        404
    );
    assert_eq!(sc.get_admin("/admin/").await.0, 404);
    assert_eq!(sc.get_admin("/metrics").await.0, 200);
    assert_eq!(sc.get_admin("/healthz").await.0, 200);
}

#[tokio::test]
async fn every_endpoint_wants_a_valid_bearer_token() {
    let redis = RedisServer::start_new();
    let upstream = Upstream::start().await;
    let sc = builder(&upstream, &redis).start().await;
    let d = Delivery::fresh();
    assert_eq!(sc.send(&d).await.status, 200);
    let show = delivery_path(ROUTE, &d.id);
    let replay = format!("{show}/replay");
    for (method, path) in [
        ("GET", "/admin/deliveries"),
        ("GET", show.as_str()),
        ("DELETE", show.as_str()),
        ("POST", replay.as_str()),
    ] {
        let none = api(&sc, method, path, None).await;
        assert_eq!(none.status, 401, "{method} {path} without a token");
        assert_eq!(none.json["error"], "unauthorized");
        assert_eq!(none.headers["www-authenticate"], "Bearer");
        let wrong = api(&sc, method, path, Some("not-the-admin-token-at-all")).await;
        assert_eq!(wrong.status, 401, "{method} {path} with a wrong token");
        // A prefix of the right token is wrong too.
        let prefix = api(&sc, method, path, Some(&TOKEN[..10])).await;
        assert_eq!(prefix.status, 401);
    }
    // Nothing was forgotten or replayed by the refused calls.
    assert_eq!(upstream.count(), 1);
    assert_eq!(
        api(&sc, "GET", "/admin/deliveries", Some(TOKEN))
            .await
            .status,
        200
    );
    assert_eq!(api(&sc, "GET", &show, Some(OPS_TOKEN)).await.status, 200);
    // /metrics and the probes need no token.
    assert_eq!(sc.get_admin("/metrics").await.0, 200);
    assert_eq!(sc.get_admin("/readyz").await.0, 200);
}

#[tokio::test]
async fn list_show_and_forget_tell_an_operator_what_a_resend_would_do() {
    let redis = RedisServer::start_new();
    let upstream = Upstream::start().await;
    let sc = builder(&upstream, &redis).start().await;

    let ok = Delivery::fresh();
    assert_eq!(sc.send(&ok).await.status, 200);
    assert!(sc.send(&ok).await.replayed());
    assert!(sc.send(&ok).await.replayed());
    upstream.push_modes(vec![Mode::Status(500)]);
    let failed = Delivery::fresh();
    assert_eq!(sc.send(&failed).await.status, 500);

    // list: newest first, both there, the released one still listed.
    let list = api(&sc, "GET", "/admin/deliveries", Some(TOKEN)).await;
    assert_eq!(list.status, 200, "{}", list.json);
    let items = list.json["deliveries"].as_array().unwrap().clone();
    assert_eq!(items.len(), 2);
    assert_eq!(items[0]["key"], failed.id.as_str());
    assert_eq!(items[0]["status"], "released");
    assert_eq!(items[0]["outcome"], "upstream_error");
    assert_eq!(items[0]["upstream_status"], 500);
    assert_eq!(items[1]["key"], ok.id.as_str());
    assert_eq!(items[1]["status"], "completed");
    assert!(list.json["next_cursor"].is_null());

    // filters
    let released = api(&sc, "GET", "/admin/deliveries?status=released", Some(TOKEN)).await;
    let keys: Vec<_> = released.json["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["key"].clone())
        .collect();
    assert_eq!(keys, vec![serde_json::json!(failed.id)]);
    let fwd = api(
        &sc,
        "GET",
        "/admin/deliveries?outcome=forwarded",
        Some(TOKEN),
    )
    .await;
    assert_eq!(fwd.json["deliveries"].as_array().unwrap().len(), 1);
    let other = api(&sc, "GET", "/admin/deliveries?route=nope", Some(TOKEN)).await;
    assert_eq!(other.json["deliveries"].as_array().unwrap().len(), 0);
    assert_eq!(
        api(&sc, "GET", "/admin/deliveries?status=weird", Some(TOKEN))
            .await
            .status,
        400
    );
    assert_eq!(
        api(&sc, "GET", "/admin/deliveries?limit=0", Some(TOKEN))
            .await
            .status,
        400
    );
    assert_eq!(
        api(&sc, "GET", "/admin/deliveries?cursor=zzz", Some(TOKEN))
            .await
            .status,
        400
    );
    // search: the words, through the API.
    let keys_of = |v: &serde_json::Value| -> Vec<String> {
        v["deliveries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["key"].as_str().unwrap().to_string())
            .collect()
    };
    let first_ok = items[1]["first_seen"].as_u64().unwrap();
    let first_failed = items[0]["first_seen"].as_u64().unwrap();
    for (query, want) in [
        ("upstream_status=5xx", vec![failed.id.clone()]),
        ("upstream_status=500", vec![failed.id.clone()]),
        ("upstream_status=2xx", vec![ok.id.clone()]),
        ("duplicates=true", vec![ok.id.clone()]),
        (
            &format!("key_prefix={}", &ok.id[..ok.id.len() - 2]) as &str,
            vec![ok.id.clone()],
        ),
        (&format!("since={first_failed}"), vec![failed.id.clone()]),
        (&format!("until={first_failed}"), vec![ok.id.clone()]),
        (
            &format!("since={first_ok}&until={}", first_failed + 1),
            vec![failed.id.clone(), ok.id.clone()],
        ),
    ] {
        let r = api(
            &sc,
            "GET",
            &format!("/admin/deliveries?{query}"),
            Some(TOKEN),
        )
        .await;
        assert_eq!(r.status, 200, "{query}: {}", r.json);
        assert_eq!(keys_of(&r.json), want, "{query}");
        assert_eq!(r.json["partial"], false, "{query}");
    }
    for (query, name) in [
        ("since=yesterday", "since"),
        ("until=-1", "until"),
        ("upstream_status=5x", "upstream_status"),
        ("duplicates=yes", "duplicates"),
        ("kept=1", "kept"),
        ("outcome=fine", "outcome"),
        ("since=20&until=10", "until"),
    ] {
        let r = api(
            &sc,
            "GET",
            &format!("/admin/deliveries?{query}"),
            Some(TOKEN),
        )
        .await;
        assert_eq!(r.status, 400, "{query}: {}", r.json);
        let message = r.json["message"].as_str().unwrap_or_default();
        assert!(
            message.starts_with(&format!("{name}:")),
            "{query}: {}",
            r.json
        );
    }

    // show
    let show = api(&sc, "GET", &delivery_path(ROUTE, &ok.id), Some(TOKEN)).await;
    assert_eq!(show.status, 200);
    let e = &show.json;
    assert_eq!(e["status"], "completed");
    assert_eq!(e["attempts"], 1);
    assert_eq!(e["duplicates"], 2);
    assert_eq!(e["outcome"], "forwarded");
    assert_eq!(e["upstream_status"], 200);
    assert_eq!(e["response_status"], 200);
    assert_eq!(e["replayable"], true);
    assert!(e["latency_ms"].as_u64().is_some());
    assert_eq!(e["fingerprint"].as_str().unwrap().len(), 64);
    assert!(e["first_seen"].as_u64().unwrap() <= e["last_seen"].as_u64().unwrap());
    assert_eq!(e["request"]["method"], "POST");
    assert_eq!(e["request"]["path"], PATH);
    assert_eq!(
        e["request"]["body"],
        String::from_utf8(ok.body.clone()).unwrap()
    );
    let missing = api(&sc, "GET", &delivery_path(ROUTE, "never-seen"), Some(TOKEN)).await;
    assert_eq!(missing.status, 404);

    // forget: the next copy is forwarded.
    let f = api(
        &sc,
        "DELETE",
        &delivery_path(ROUTE, &ok.id),
        Some(OPS_TOKEN),
    )
    .await;
    assert_eq!(f.status, 200, "{}", f.json);
    assert_eq!(f.json["result"], "forgotten");
    assert_eq!(
        api(&sc, "GET", &delivery_path(ROUTE, &ok.id), Some(TOKEN))
            .await
            .status,
        404
    );
    assert_eq!(
        api(&sc, "DELETE", &delivery_path(ROUTE, &ok.id), Some(TOKEN))
            .await
            .status,
        404
    );
    let before = upstream.count();
    let again = sc.send(&ok).await;
    assert_eq!(again.status, 200);
    assert!(!again.replayed());
    assert_eq!(upstream.count(), before + 1);

    // every action is logged with who did it
    wait_until(Duration::from_secs(5), "the audit line", || {
        sc.stderr().contains("who=\"ops\" action=\"forget\"")
    })
    .await;
    sc.assert_log_lacks(&[TOKEN, OPS_TOKEN]);
}

#[tokio::test]
async fn forget_is_refused_while_a_copy_is_in_flight() {
    let redis = RedisServer::start_new();
    let upstream = Upstream::start().await;
    let sc = builder(&upstream, &redis).start().await;
    upstream.set_mode(Mode::Stall(Duration::from_millis(1500)));
    let d = Delivery::fresh();
    let first = sc.send_spawned(&d);
    upstream.wait_for_count(1, Duration::from_secs(5)).await;
    let f = api(&sc, "DELETE", &delivery_path(ROUTE, &d.id), Some(TOKEN)).await;
    assert_eq!(f.status, 409, "{}", f.json);
    assert_eq!(first.await.unwrap().status, 200);
    let show = api(&sc, "GET", &delivery_path(ROUTE, &d.id), Some(TOKEN)).await;
    assert_eq!(show.json["status"], "completed");
}

#[tokio::test]
async fn pagination_walks_every_delivery_once_newest_first() {
    let redis = RedisServer::start_new();
    let upstream = Upstream::start().await;
    let sc = builder(&upstream, &redis).start().await;
    let mut sent = Vec::new();
    for _ in 0..7 {
        let d = Delivery::fresh();
        assert_eq!(sc.send(&d).await.status, 200);
        sent.push(d.id);
    }
    let mut seen = Vec::new();
    let mut last_seen = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let path = match &cursor {
            Some(c) => format!("/admin/deliveries?limit=3&cursor={c}"),
            None => "/admin/deliveries?limit=3".to_string(),
        };
        let page = api(&sc, "GET", &path, Some(TOKEN)).await;
        assert_eq!(page.status, 200, "{}", page.json);
        pages += 1;
        let items = page.json["deliveries"].as_array().unwrap();
        assert!(items.len() <= 3);
        for e in items {
            seen.push(e["key"].as_str().unwrap().to_string());
            last_seen.push(e["last_seen"].as_u64().unwrap());
        }
        match page.json["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
        assert!(pages < 10, "pagination does not end");
    }
    assert_eq!(pages, 3);
    assert_eq!(seen.len(), 7);
    // Each once, newest (last seen) first; deliveries within one millisecond are
    // ordered by key, so only the set and the order of timestamps are asserted.
    let mut a = seen.clone();
    a.sort();
    let mut b = sent.clone();
    b.sort();
    assert_eq!(a, b, "each delivery once");
    assert!(last_seen.windows(2).all(|w| w[0] >= w[1]), "newest first");
}

#[tokio::test]
async fn replay_sends_the_kept_request_again_and_records_the_new_answer() {
    let redis = RedisServer::start_new();
    let upstream = Upstream::start().await;
    let sc = builder(&upstream, &redis).start().await;
    let d = Delivery::fresh();
    assert_eq!(sc.send(&d).await.status, 200);
    let first = upstream.last();

    upstream.set_mode(Mode::Ok {
        status: 201,
        headers: vec![("x-second".into(), "yes".into())],
        body: b"second".to_vec(),
    });
    let r = api(
        &sc,
        "POST",
        &format!("{}/replay", delivery_path(ROUTE, &d.id)),
        Some(TOKEN),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.json);
    assert_eq!(r.json["upstream_status"], 201);
    assert_eq!(r.json["recorded"], true);
    assert_eq!(upstream.count(), 2);
    let again = upstream.last();
    assert_eq!(again.body, first.body);
    assert_eq!(again.path_and_query, first.path_and_query);
    assert_eq!(
        again.header("idempotency-key"),
        first.header("idempotency-key")
    );
    assert_eq!(again.header("webhook-id"), first.header("webhook-id"));

    let e = api(&sc, "GET", &delivery_path(ROUTE, &d.id), Some(TOKEN))
        .await
        .json;
    assert_eq!(e["status"], "completed");
    assert_eq!(e["attempts"], 2);
    assert_eq!(e["replays"], 1);
    assert_eq!(e["outcome"], "operator_replay");
    assert_eq!(e["response_status"], 201);
    // The provider's next copy gets the new answer, from the store.
    let copy = sc.send(&d).await;
    assert!(copy.replayed());
    assert_eq!(copy.status, 201);
    assert_eq!(copy.body, b"second");
    assert_eq!(upstream.count(), 2);

    // A replay the application refuses leaves the completed answer standing.
    upstream.set_mode(Mode::Status(503));
    let r = api(
        &sc,
        "POST",
        &format!("{}/replay", delivery_path(ROUTE, &d.id)),
        Some(TOKEN),
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json["upstream_status"], 503);
    assert_eq!(r.json["recorded"], false);
    let e = api(&sc, "GET", &delivery_path(ROUTE, &d.id), Some(TOKEN))
        .await
        .json;
    assert_eq!(e["status"], "completed");
    assert_eq!(e["outcome"], "operator_replay_failed");
    let copy = sc.send(&d).await;
    assert!(copy.replayed());
    assert_eq!(copy.status, 201);

    // unknown key, and a route that keeps no payload
    let r = api(
        &sc,
        "POST",
        &format!("{}/replay", delivery_path(ROUTE, "nope")),
        Some(TOKEN),
    )
    .await;
    assert_eq!(r.status, 404);
}

/// With `min_replicas_ack` and no replica to confirm it (one redis-server: `WAIT`
/// falls short), a replay's claim is given up at once and the admin API answers 503:
/// the key stays completed with its old answer, and the provider's next copy (through
/// a sidecar without replica acks) is answered from the store, not forwarded again.
#[tokio::test]
async fn an_under_replicated_replay_leaves_the_completed_answer_standing() {
    let redis = RedisServer::start_new();
    let upstream = Upstream::start().await;
    let sc = builder(&upstream, &redis).start().await;
    let acked = builder(&upstream, &redis)
        .store_raw("min_replicas_ack", "1")
        .store_opt("replicas_ack_timeout", "50ms")
        .start()
        .await;
    let d = Delivery::fresh();
    assert_eq!(sc.send(&d).await.status, 200);
    let r = api(
        &acked,
        "POST",
        &format!("{}/replay", delivery_path(ROUTE, &d.id)),
        Some(TOKEN),
    )
    .await;
    assert_eq!(r.status, 503, "{}", r.json);
    let end = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let e = api(&sc, "GET", &delivery_path(ROUTE, &d.id), Some(TOKEN)).await;
        if e.json["claimed"] == false {
            assert_eq!(e.json["status"], "completed", "{}", e.json);
            break;
        }
        assert!(std::time::Instant::now() < end, "the replay's claim stayed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let copy = sc.send(&d).await;
    assert!(copy.replayed(), "the copy was forwarded again");
    assert_eq!(upstream.count(), 1);
}

#[tokio::test]
async fn replay_needs_a_kept_request() {
    let redis = RedisServer::start_new();
    let upstream = Upstream::start().await;
    let sc = SidecarBuilder::new(&upstream.url(), &redis.url())
        .env("IDEMGATE_ADMIN_TOKEN", TOKEN)
        .start()
        .await;
    let d = Delivery::fresh();
    assert_eq!(sc.send(&d).await.status, 200);
    let e = api(&sc, "GET", &delivery_path(ROUTE, &d.id), Some(TOKEN)).await;
    assert_eq!(e.json["replayable"], false);
    assert!(e.json.get("request").is_none());
    let r = api(
        &sc,
        "POST",
        &format!("{}/replay", delivery_path(ROUTE, &d.id)),
        Some(TOKEN),
    )
    .await;
    assert_eq!(r.status, 422, "{}", r.json);
    assert_eq!(r.json["error"], "not_replayable");
    assert_eq!(upstream.count(), 1);
}

#[tokio::test]
async fn a_replay_is_forwarded_exactly_once_while_20_copies_arrive() {
    let redis = RedisServer::start_new();
    let upstream = Upstream::start().await;
    let sc = builder(&upstream, &redis).start().await;
    let d = Delivery::fresh();
    assert_eq!(sc.send(&d).await.status, 200);
    assert_eq!(upstream.count(), 1);

    // The application takes a while with the replay, so the copies land during it.
    upstream.set_mode(Mode::Stall(Duration::from_millis(800)));
    let client = sc.client.clone();
    let url = sc.admin_url(&format!("{}/replay", delivery_path(ROUTE, &d.id)));
    let replay = tokio::spawn(async move {
        client
            .post(url)
            .bearer_auth(TOKEN)
            .send()
            .await
            .map(|r| r.status().as_u16())
    });
    let copies: Vec<_> = (0..20).map(|_| sc.send_spawned(&d)).collect();
    let mut in_flight = 0;
    let mut replayed = 0;
    for c in copies {
        let a = c.await.unwrap();
        match a.status {
            409 => {
                in_flight += 1;
                assert!(a.retry_after() >= 1);
            }
            200 if a.replayed() => replayed += 1,
            other => panic!("a copy got {other}: {}", a.text()),
        }
    }
    assert_eq!(replay.await.unwrap().unwrap(), 200);
    assert_eq!(in_flight + replayed, 20);
    upstream
        .assert_count_stays(2, Duration::from_millis(300))
        .await;
    // A second replay starting while the first runs is refused, not run beside it.
    let url = sc.admin_url(&format!("{}/replay", delivery_path(ROUTE, &d.id)));
    let c2 = sc.client.clone();
    let slow = tokio::spawn(async move {
        c2.post(url)
            .bearer_auth(TOKEN)
            .send()
            .await
            .map(|r| r.status().as_u16())
    });
    upstream.wait_for_count(3, Duration::from_secs(5)).await;
    let busy = api(
        &sc,
        "POST",
        &format!("{}/replay", delivery_path(ROUTE, &d.id)),
        Some(TOKEN),
    )
    .await;
    assert_eq!(busy.status, 409, "{}", busy.json);
    assert_eq!(slow.await.unwrap().unwrap(), 200);
    upstream
        .assert_count_stays(3, Duration::from_millis(300))
        .await;
    let e = api(&sc, "GET", &delivery_path(ROUTE, &d.id), Some(TOKEN))
        .await
        .json;
    assert_eq!(e["replays"], 2);
    assert_eq!(e["attempts"], 3);
}

/// What one delivery log entry costs in Redis, by `MEMORY USAGE` (printed for
/// docs/operating.md; asserted loosely so a Redis upgrade does not break the build). A
/// first delivery's log lives in its claim record (no log hash); a kept request is a
/// hash of its own.
#[tokio::test]
async fn memory_cost_of_a_log_entry() {
    let redis = RedisServer::start_new();
    let upstream = Upstream::start().await;
    let plain = SidecarBuilder::new(&upstream.url(), &redis.url())
        .env("IDEMGATE_ADMIN_TOKEN", TOKEN)
        .start()
        .await;
    let d = Delivery::fresh();
    assert_eq!(plain.send(&d).await.status, 200);
    let key = format!("idemgate-test:{{{ROUTE}:{}}}", d.id);
    assert_eq!(
        redis.cli(&["EXISTS", &key]),
        "0",
        "a first delivery's log hash"
    );
    let record_key = format!("{key}:claim");
    let record: u64 = redis
        .cli(&["MEMORY", "USAGE", &record_key, "SAMPLES", "0"])
        .parse()
        .unwrap();
    // The log's fields in the record: first and last seen, outcome, upstream status,
    // latency (between the fingerprint and the answer's status).
    let head = redis.cli(&["GETRANGE", &record_key, "0", "191"]);
    let fields: Vec<&str> = head.split('|').collect();
    assert_eq!(fields[0], "C", "{head}");
    let log_bytes: usize = fields[2..7].iter().map(|f| f.len() + 1).sum();
    drop(plain);

    let kept_sc = builder(&upstream, &redis).start().await;
    let d2 = Delivery::fresh();
    assert_eq!(kept_sc.send(&d2).await.status, 200);
    let key2 = format!("idemgate-test:{{{ROUTE}:{}}}", d2.id);
    let kept: u64 = redis
        .cli(&["MEMORY", "USAGE", &key2, "SAMPLES", "0"])
        .parse()
        .unwrap();

    // The index: its size with 1000 more members, per member.
    let index = format!("idemgate-test:recent:{{{ROUTE}}}");
    let before: u64 = redis
        .cli(&["MEMORY", "USAGE", &index, "SAMPLES", "0"])
        .parse()
        .unwrap();
    let members: Vec<String> = (0..1000u64)
        .flat_map(|i| {
            [
                format!("{}", 1_700_000_000_000u64 + i),
                format!("msg_{i:027}"),
            ]
        })
        .collect();
    let mut args: Vec<&str> = vec!["ZADD", &index];
    args.extend(members.iter().map(String::as_str));
    redis.cli(&args);
    let after: u64 = redis
        .cli(&["MEMORY", "USAGE", &index, "SAMPLES", "0"])
        .parse()
        .unwrap();
    let per_member = (after - before) / 1000;
    println!(
        "MEMORY: claim record with its answer and the log's fields = {record} B, of which the log's fields {log_bytes} B; no log hash; a kept request's hash ({} B body) = {kept} B; recent index ≈ {per_member} B per member",
        d2.body.len()
    );
    assert!(log_bytes < 80, "the log's fields: {log_bytes} B");
    assert!(kept > 0 && record > 0);
    assert!(per_member < 200);
}

#[tokio::test]
async fn the_memory_store_keeps_the_same_log() {
    let upstream = Upstream::start().await;
    let mut route = RouteCfg::standard(ROUTE, PATH);
    route.extra = "keep_payload = true\n".into();
    let sc = SidecarBuilder::new(&upstream.url(), "memory")
        .route(route)
        .env("IDEMGATE_ADMIN_TOKEN", TOKEN)
        .start()
        .await;
    let ok = Delivery::fresh();
    assert_eq!(sc.send(&ok).await.status, 200);
    assert!(sc.send(&ok).await.replayed());
    upstream.push_modes(vec![Mode::Status(500)]);
    let failed = Delivery::fresh();
    assert_eq!(sc.send(&failed).await.status, 500);

    let list = api(&sc, "GET", "/admin/deliveries?limit=1", Some(TOKEN)).await;
    assert_eq!(list.status, 200, "{}", list.json);
    assert_eq!(list.json["deliveries"][0]["key"], failed.id.as_str());
    assert_eq!(list.json["deliveries"][0]["status"], "released");
    let cursor = list.json["next_cursor"].as_str().unwrap().to_string();
    let next = api(
        &sc,
        "GET",
        &format!("/admin/deliveries?limit=1&cursor={cursor}"),
        Some(TOKEN),
    )
    .await;
    assert_eq!(next.json["deliveries"][0]["key"], ok.id.as_str());
    assert_eq!(next.json["deliveries"][0]["duplicates"], 1);
    assert!(next.json["next_cursor"].is_null());

    let r = api(
        &sc,
        "POST",
        &format!("{}/replay", delivery_path(ROUTE, &ok.id)),
        Some(TOKEN),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.json);
    assert_eq!(upstream.count(), 3);
    let e = api(&sc, "GET", &delivery_path(ROUTE, &ok.id), Some(TOKEN))
        .await
        .json;
    assert_eq!(
        (e["replays"].as_u64(), e["attempts"].as_u64()),
        (Some(1), Some(2))
    );
    assert_eq!(e["outcome"], "operator_replay");

    upstream.set_mode(Mode::Status(503));
    let r = api(
        &sc,
        "POST",
        &format!("{}/replay", delivery_path(ROUTE, &ok.id)),
        Some(TOKEN),
    )
    .await;
    assert_eq!(r.json["recorded"], false);
    let e = api(&sc, "GET", &delivery_path(ROUTE, &ok.id), Some(TOKEN))
        .await
        .json;
    assert_eq!(
        e["status"], "completed",
        "a failed replay leaves the old answer standing"
    );
    upstream.set_mode(Mode::default_ok());

    let f = api(&sc, "DELETE", &delivery_path(ROUTE, &ok.id), Some(TOKEN)).await;
    assert_eq!(f.status, 200);
    assert!(!sc.send(&ok).await.replayed());
}

/// The dead letters of an async route through the admin API: listed with their last
/// error and attempts, redriven by an operator, then delivered; auth applies.
#[tokio::test]
async fn dead_letters_are_listed_and_redriven_through_the_api() {
    let redis = RedisServer::start_new();
    let up = Upstream::start().await;
    up.set_mode(Mode::Status(500));
    let mut route = RouteCfg::standard(ROUTE, PATH);
    route.extra = "mode = \"async\"\nmax_attempts = 2\nbackoff = \"50ms\"\n".into();
    let sc = SidecarBuilder::new(&up.url(), &redis.url())
        .route(route)
        .env("IDEMGATE_ADMIN_TOKEN", TOKEN)
        .start()
        .await;
    let d = Delivery::fresh();
    assert_eq!(sc.send(&d).await.status, 200, "the async ack");
    sc.wait_metric(
        &format!("idemgate_dead_letters_total{{route=\"{ROUTE}\"}}"),
        1.0,
    )
    .await;
    assert_eq!(up.count(), 2, "two attempts, then dead-lettered");

    let list_path = format!("/admin/dead-letters?route={ROUTE}");
    assert_eq!(api(&sc, "GET", &list_path, None).await.status, 401);
    let list = api(&sc, "GET", &list_path, Some(TOKEN)).await;
    assert_eq!(list.status, 200, "{:?}", list.json);
    let items = list.json["items"].as_array().unwrap();
    assert_eq!(items.len(), 1);
    assert_eq!(items[0]["key"], d.id.as_str());
    assert_eq!(items[0]["attempts"], 2);
    assert!(items[0]["last_error"].as_str().unwrap().contains("500"));
    let id = items[0]["id"].as_str().unwrap().to_string();

    up.set_mode(Mode::default_ok());
    let redrive = format!("/admin/dead-letters/{ROUTE}/{id}/redrive");
    assert_eq!(
        api(&sc, "POST", &redrive, Some("wrong-token-0123456789"))
            .await
            .status,
        401
    );
    let r = api(&sc, "POST", &redrive, Some(TOKEN)).await;
    assert_eq!(r.status, 200, "{:?}", r.json);
    up.wait_for_count(3, Duration::from_secs(10)).await;
    assert_eq!(
        up.last().header("webhook-id").as_deref(),
        Some(d.id.as_str())
    );
    assert_eq!(
        api(&sc, "POST", &redrive, Some(TOKEN)).await.status,
        404,
        "redriven twice"
    );
    let after = api(&sc, "GET", &list_path, Some(TOKEN)).await;
    assert_eq!(after.json["items"].as_array().unwrap().len(), 0);
    assert!(
        sc.stderr().contains("action=\"redrive\""),
        "the redrive is audited"
    );
}
