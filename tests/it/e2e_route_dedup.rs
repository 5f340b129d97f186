//! End-to-end: dedup settings per route (README's Configuration, docs/providers.md's
//! "Dedup settings per route"). In one sidecar, routes with different retentions each
//! keep and forget their keys (answers and delivery log entries) on their own schedule;
//! a sync and an async route each hold their claims for their own lease, renewed at
//! their own pace; an operator's replay holds its route's lease; each route answers a
//! copy in flight by its own `in_flight` and `wait_timeout`. On the memory store
//! and on Redis, with real sidecar processes and a recording upstream.

use std::time::{Duration, Instant};

use crate::common::admin::{TOKEN, api, delivery_path};
use crate::common::*;

/// A standard route named `name` at `/webhooks/{name}` with `extra` route lines.
fn route(name: &str, extra: &str) -> RouteCfg {
    let mut r = RouteCfg::standard(name, &format!("/webhooks/{name}"));
    r.extra = format!("{extra}\n");
    r
}

/// A delivery to route `name`.
fn to(name: &str) -> Delivery {
    Delivery::fresh().path(&format!("/webhooks/{name}"))
}

/// `d` sent again now, as a provider's retry is: the same delivery, freshly signed
/// (`brief` and `mid` take a 1 s timestamp window, shorter than their retention).
async fn resend(sc: &Sidecar, d: &Delivery) -> Answer {
    sc.send(&d.clone().ts(now_secs())).await
}

/// A sidecar on `store` with the admin API on and `routes`.
fn sidecar(up: &Upstream, store: &str, routes: Vec<RouteCfg>) -> SidecarBuilder {
    let mut b = SidecarBuilder::new(&up.url(), store)
        .top("admin_token", "ops=env:OPS_TOKEN")
        .env("OPS_TOKEN", crate::common::admin::OPS_TOKEN)
        .env("IDEMGATE_ADMIN_TOKEN", TOKEN);
    for r in routes {
        b = b.route(r);
    }
    b
}

/// The delivery log's entry of `d` on route `name`: its HTTP status and JSON.
async fn shown(sc: &Sidecar, name: &str, d: &Delivery) -> (u16, serde_json::Value) {
    let a = api(sc, "GET", &delivery_path(name, &d.id), Some(TOKEN)).await;
    (a.status, a.json)
}

/// Waits until the delivery log no longer has `d` on route `name` (its retention ran
/// out), or panics after `deadline`.
async fn wait_forgotten(sc: &Sidecar, name: &str, d: &Delivery, deadline: Duration) {
    let end = Instant::now() + deadline;
    loop {
        let (status, json) = shown(sc, name, d).await;
        if status == 404 {
            return;
        }
        assert_eq!(status, 200, "{json}");
        assert!(
            Instant::now() < end,
            "route {name}'s delivery still in the log: {json}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Three routes in one sidecar: `brief` keeps its keys 2 s, `mid` 6 s, `kept` the
/// `[dedup]` default (1 h). Each is answered from the store and listed in the delivery
/// log until its own retention runs out, then forgotten (the next copy is forwarded),
/// while the others still hold theirs.
async fn routes_keep_and_forget_on_their_own_schedules(kind: StoreKind) {
    let store = TestStore::new(kind);
    let up = Upstream::start().await;
    let sc = sidecar(
        &up,
        &store.url(),
        vec![
            route("brief", "lease = \"1s\"\nretention = \"2s\"").tolerance("1s"),
            route("mid", "lease = \"1s\"\nretention = \"6s\"").tolerance("1s"),
            route("kept", ""),
        ],
    )
    .top("upstream_timeout", "1s")
    .store_opt("timeout", "500ms")
    .start()
    .await;
    let (brief, mid, kept) = (to("brief"), to("mid"), to("kept"));
    for (name, d) in [("brief", &brief), ("mid", &mid), ("kept", &kept)] {
        let a = resend(&sc, d).await;
        assert_eq!(a.status, 200, "{name}: {}", a.text());
        assert!(!a.replayed(), "{name}");
        assert!(
            resend(&sc, d).await.replayed(),
            "{name}'s copy was forwarded"
        );
        assert_eq!(shown(&sc, name, d).await.0, 200, "{name}");
    }
    assert_eq!(up.count(), 3);

    // `brief` forgets first; `mid` and `kept` still answer from the store.
    wait_forgotten(&sc, "brief", &brief, Duration::from_secs(10)).await;
    for (name, d) in [("mid", &mid), ("kept", &kept)] {
        assert_eq!(
            shown(&sc, name, d).await.0,
            200,
            "{name} forgotten with brief"
        );
        assert!(
            resend(&sc, d).await.replayed(),
            "{name} forgotten with brief"
        );
    }
    assert_eq!(up.count(), 3);
    let again = resend(&sc, &brief).await;
    assert_eq!(again.status, 200, "{}", again.text());
    assert!(!again.replayed(), "brief's key outlived its retention");
    assert_eq!(up.count(), 4);

    // Then `mid`; `kept` still holds its key.
    wait_forgotten(&sc, "mid", &mid, Duration::from_secs(15)).await;
    assert_eq!(shown(&sc, "kept", &kept).await.0, 200);
    assert!(
        resend(&sc, &kept).await.replayed(),
        "kept forgotten with mid"
    );
    let again = resend(&sc, &mid).await;
    assert!(!again.replayed(), "mid's key outlived its retention");
    assert_eq!(up.count(), 5);
}

#[tokio::test]
async fn routes_keep_and_forget_on_their_own_schedules_on_memory() {
    routes_keep_and_forget_on_their_own_schedules(StoreKind::Memory).await;
}

#[tokio::test]
async fn routes_keep_and_forget_on_their_own_schedules_on_redis() {
    routes_keep_and_forget_on_their_own_schedules(StoreKind::Redis).await;
}

/// Once the application has its `calls`-th call (one of `sync`'s, held by `hold`) and
/// `sync`'s 1 s lease has passed, a copy of `d` is still refused (the claim was renewed
/// at the route's pace, not the default's every 10 s) and told to come back within
/// that lease; then the application answers.
async fn copy_held_past_the_short_lease(
    sc: &Sidecar,
    up: &Upstream,
    d: &Delivery,
    calls: usize,
    hold: &Hold,
) {
    up.wait_for_count(calls, Duration::from_secs(5)).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let copy = sc.send(d).await;
    hold.release();
    copy.assert_error(409, "in_flight");
    assert!(copy.retry_after() <= 1, "{copy:?}");
}

/// Once the application has its `calls`-th call (one of `long`'s, held by `hold`), a
/// copy of `d` is refused and told to come back after most of `long`'s 60 s lease (the
/// `[dedup]` lease, 30 s, could never say more than 30); then the application answers.
async fn copy_waits_for_the_long_lease(
    sc: &Sidecar,
    up: &Upstream,
    d: &Delivery,
    calls: usize,
    hold: &Hold,
) {
    up.wait_for_count(calls, Duration::from_secs(5)).await;
    let copy = sc.send(d).await;
    hold.release();
    copy.assert_error(409, "in_flight");
    assert!(copy.retry_after() >= 40, "{copy:?}");
}

/// An admin POST of `body` (JSON) to `path`, spawned: its status and JSON.
fn post_admin(
    sc: &Sidecar,
    path: &str,
    body: Option<serde_json::Value>,
) -> tokio::task::JoinHandle<Result<(u16, serde_json::Value), reqwest::Error>> {
    let mut rb = sc
        .client
        .post(sc.admin_url(path))
        .bearer_auth(TOKEN)
        .timeout(Duration::from_secs(20));
    if let Some(b) = body {
        rb = rb
            .header("content-type", "application/json")
            .body(b.to_string());
    }
    tokio::spawn(async move {
        let r = rb.send().await?;
        let status = r.status().as_u16();
        let text = r.text().await?;
        Ok((status, serde_json::from_str(&text).unwrap_or_default()))
    })
}

/// A replay of `key` on route `route` from the console page, as an operator signs in,
/// confirms and posts it (spawned): the post's status.
async fn page_replay(sc: &Sidecar, route: &str, key: &str) -> tokio::task::JoinHandle<u16> {
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let csrf_of = |html: &str| {
        html.split("name=csrf value=\"")
            .nth(1)
            .and_then(|s| s.split('"').next())
            .expect("a CSRF token in the form")
            .to_string()
    };
    let form = client
        .get(sc.admin_url("/admin/login"))
        .send()
        .await
        .unwrap();
    let login_cookie = form.headers()["set-cookie"].to_str().unwrap();
    let login_cookie = login_cookie.split(';').next().unwrap().to_string();
    let csrf = csrf_of(&form.text().await.unwrap());
    let ops = crate::common::admin::OPS_TOKEN;
    let ok = client
        .post(sc.admin_url("/admin/login"))
        .header("cookie", &login_cookie)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("csrf={csrf}&token={ops}"))
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status().as_u16(), 303, "sign-in");
    let session = ok.headers()["set-cookie"].to_str().unwrap();
    let session = session.split(';').next().unwrap().to_string();
    let view = format!(
        "/admin/view/{route}/{}",
        percent_encoding::utf8_percent_encode(key, percent_encoding::NON_ALPHANUMERIC)
    );
    let confirm = client
        .get(sc.admin_url(&format!("{view}/confirm?action=replay")))
        .header("cookie", &session)
        .send()
        .await
        .unwrap();
    let csrf = csrf_of(&confirm.text().await.unwrap());
    let post = client
        .post(sc.admin_url(&format!("{view}/replay")))
        .header("cookie", &session)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("csrf={csrf}"));
    tokio::spawn(async move { post.send().await.unwrap().status().as_u16() })
}

/// `sync` and `queued` (async) hold their claims 1 s, `long` 60 s, `[dedup]` says 30 s;
/// the application answers each call only once the test has seen what it needs while
/// the call is in flight (the copies after 1.5 s, the queued call after 3 s). A claim renewed at the default's
/// pace (every 10 s) would lapse under a 1 s lease and let a copy through (sync) or
/// lose the worker's delivery (async), and an operator's replay (API, console page,
/// bulk job, CLI) holds and renews the route's lease the same way; `long`'s copies are
/// told to come back in about its own lease.
async fn sync_and_async_routes_hold_their_own_leases(kind: StoreKind) {
    let store = TestStore::new(kind);
    let up = Upstream::start().await;
    let hold = Hold::default();
    up.set_mode(Mode::held(&hold));
    let sc = sidecar(
        &up,
        &store.url(),
        vec![
            route("sync", "lease = \"1s\"\nkeep_payload = true"),
            route(
                "queued",
                "mode = \"async\"\nlease = \"1s\"\nbackoff = \"100ms\"",
            ),
            route("long", "lease = \"60s\""),
        ],
    )
    .top("upstream_timeout", "10s")
    .store_opt("timeout", "500ms")
    .start()
    .await;

    // sync: a copy after the lease's length is still refused, and told to come back
    // within it.
    let synced = to("sync");
    let first = sc.send_spawned(&synced);
    copy_held_past_the_short_lease(&sc, &up, &synced, 1, &hold).await;
    let first = first.await.unwrap();
    assert_eq!(first.status, 200, "{}", first.text());
    assert!(sc.send(&synced).await.replayed());
    assert_eq!(up.count(), 1);

    // long: a copy is told to come back after most of its 60 s lease.
    let d = to("long");
    let first = sc.send_spawned(&d);
    copy_waits_for_the_long_lease(&sc, &up, &d, 2, &hold).await;
    assert_eq!(first.await.unwrap().status, 200);

    // An operator's replay of the sync delivery holds (and renews) the route's 1 s
    // lease: through the API, ...
    let path = format!("{}/replay", delivery_path("sync", &synced.id));
    let replay = post_admin(&sc, &path, None);
    copy_held_past_the_short_lease(&sc, &up, &synced, 3, &hold).await;
    assert_eq!(replay.await.unwrap().unwrap().0, 200);
    // ... from the console page, ...
    let replay = page_replay(&sc, "sync", &synced.id).await;
    copy_held_past_the_short_lease(&sc, &up, &synced, 4, &hold).await;
    let status = replay.await.unwrap();
    assert!(status < 400, "the page's replay answered {status}");
    // ... in a bulk job, ...
    let job =
        serde_json::json!({"kind": "replay", "route": "sync", "filter": {"status": "completed"}});
    let (status, started) = post_admin(&sc, "/admin/jobs", Some(job))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status, 202, "{started}");
    copy_held_past_the_short_lease(&sc, &up, &synced, 5, &hold).await;
    let id = started["id"].as_str().unwrap().to_string();
    let end = Instant::now() + Duration::from_secs(15);
    loop {
        let j = api(&sc, "GET", &format!("/admin/jobs/{id}"), Some(TOKEN))
            .await
            .json;
        if j["state"] == "done" {
            assert_eq!((&j["done"], &j["failed"]), (&1.into(), &0.into()), "{j}");
            break;
        }
        assert!(Instant::now() < end, "job never done: {j}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // ... and from the CLI, which reads the route's lease from the same file (on
    // Redis: the CLI is another process).
    let mut calls = 5;
    if kind == StoreKind::Redis {
        let cli = crate::common::admin::Cli::new(&sc);
        let key = synced.id.clone();
        let replay = tokio::task::spawn_blocking(move || {
            cli.run(&["deliveries", "replay", "sync", &key])
                .status
                .success()
        });
        calls += 1;
        copy_held_past_the_short_lease(&sc, &up, &synced, calls, &hold).await;
        assert!(replay.await.unwrap(), "the CLI's replay failed");
    }
    // No copy got through: every call was the delivery or a replay.
    assert!(sc.send(&synced).await.replayed());
    assert_eq!(up.count(), calls);

    // queued: the worker's 3 s call under a 1 s lease is delivered once and recorded.
    let d = to("queued");
    let ack = sc.send(&d).await;
    assert_eq!(ack.status, 200, "{}", ack.text());
    calls += 1;
    up.wait_for_count(calls, Duration::from_secs(5)).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    hold.release();
    let end = Instant::now() + Duration::from_secs(15);
    loop {
        let (status, json) = shown(&sc, "queued", &d).await;
        if status == 200 && json["status"] == "completed" {
            break;
        }
        assert!(Instant::now() < end, "not completed: {status} {json}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    up.assert_count_stays(calls, Duration::from_millis(1500))
        .await;
    sc.assert_log_lacks(&["claim lost", "lease lost"]);
}

#[tokio::test]
async fn sync_and_async_routes_hold_their_own_leases_on_memory() {
    sync_and_async_routes_hold_their_own_leases(StoreKind::Memory).await;
}

#[tokio::test]
async fn sync_and_async_routes_hold_their_own_leases_on_redis() {
    sync_and_async_routes_hold_their_own_leases(StoreKind::Redis).await;
}

/// `[dedup]` says `in_flight = "wait"` for 5 s; `refuses` sets `reject`, `brief` waits
/// only 200 ms; the application takes 2 s. A copy sent while the first is in flight:
/// on `waits` it waits and gets the first one's answer, on `refuses` it gets 409 at
/// once, on `brief` 409 after its own short wait.
async fn each_route_answers_copies_in_flight_by_its_own_policy(kind: StoreKind) {
    let store = TestStore::new(kind);
    let up = Upstream::start().await;
    // `waits`'s call takes 2 s (its copy waits for it, or finds it done: 200 either
    // way); the others' calls are held until their copy was answered, so the copy
    // finds them in flight however slow the machine.
    let holds = [Hold::default(), Hold::default()];
    up.push_modes(vec![
        Mode::Stall(Duration::from_secs(2)),
        Mode::held(&holds[0]),
        Mode::held(&holds[1]),
    ]);
    let sc = sidecar(
        &up,
        &store.url(),
        vec![
            route("waits", ""),
            route("refuses", "in_flight = \"reject\""),
            route("brief", "wait_timeout = \"200ms\""),
        ],
    )
    .dedup("in_flight", "wait")
    .dedup("wait_timeout", "5s")
    .start()
    .await;
    for (n, (name, waits)) in [("waits", true), ("refuses", false), ("brief", false)]
        .into_iter()
        .enumerate()
    {
        let d = to(name);
        let first = sc.send_spawned(&d);
        up.wait_for_count(n + 1, Duration::from_secs(5)).await;
        let copy = sc.send(&d).await;
        if waits {
            assert_eq!(copy.status, 200, "{name}: {}", copy.text());
            assert!(copy.replayed(), "{name}: the copy was forwarded");
        } else {
            holds[n - 1].release();
            copy.assert_error(409, "in_flight");
        }
        assert_eq!(first.await.unwrap().status, 200, "{name}");
    }
    assert_eq!(up.count(), 3);
    // Each copy is counted on its own route.
    sc.wait_requests_total("waits", "replayed", 1.0).await;
    sc.wait_requests_total("refuses", "in_flight", 1.0).await;
    sc.wait_requests_total("brief", "in_flight", 1.0).await;
}

#[tokio::test]
async fn each_route_answers_copies_in_flight_by_its_own_policy_on_memory() {
    each_route_answers_copies_in_flight_by_its_own_policy(StoreKind::Memory).await;
}

#[tokio::test]
async fn each_route_answers_copies_in_flight_by_its_own_policy_on_redis() {
    each_route_answers_copies_in_flight_by_its_own_policy(StoreKind::Redis).await;
}

/// `replay_body = false` (issue 34 item 11): a copy gets the stored status and headers
/// but no body (anyone holding a captured request would otherwise get the whole answer
/// for the retention); the other route's copies keep the body. On both stores.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_route_with_replay_body_off_answers_copies_without_the_body() {
    for kind in [StoreKind::Memory, StoreKind::Redis] {
        let store = TestStore::new(kind);
        let up = Upstream::start().await;
        up.set_mode(Mode::Ok {
            status: 201,
            headers: vec![
                ("x-order".into(), "o-17".into()),
                ("content-type".into(), "application/json".into()),
            ],
            body: br#"{"card":"4242"}"#.to_vec(),
        });
        let sc = sidecar(
            &up,
            &store.url(),
            vec![route("quiet", "replay_body = false"), route("plain", "")],
        )
        .start()
        .await;
        for (name, body) in [("quiet", ""), ("plain", r#"{"card":"4242"}"#)] {
            let d = to(name);
            let first = sc.send(&d).await;
            assert_eq!(first.status, 201, "{name} {kind:?}");
            assert_eq!(first.text(), r#"{"card":"4242"}"#, "{name} {kind:?}");
            let copy = resend(&sc, &d).await;
            assert!(copy.replayed(), "{name} {kind:?}: {copy:?}");
            assert_eq!(copy.status, 201, "{name} {kind:?}");
            assert_eq!(
                copy.header("x-order").as_deref(),
                Some("o-17"),
                "{name} {kind:?}"
            );
            assert_eq!(copy.text(), body, "{name} {kind:?}");
        }
        assert_eq!(up.count(), 2, "{kind:?}");
    }
}
