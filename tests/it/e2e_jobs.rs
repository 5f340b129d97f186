//! End-to-end: pausing and resuming a route, and operators' bulk jobs (docs/operating.md
//! "Routes" and "Bulk jobs") through the admin API and the CLI, on a real Redis shared
//! by real sidecar processes — including a sidecar killed in the middle of a job.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::admin::*;
use crate::common::probe_app::{Call, ProbeApp, Reply};
use crate::common::*;

const SEC: Duration = Duration::from_secs(1);
const QUEUED: &str = "queued";
const QUEUED_PATH: &str = "/webhooks/queued";

/// The application: every request is answered `failing` (a status) while it is not 0;
/// the sync route takes `delay` ms.
pub(crate) struct App {
    pub(crate) probe: ProbeApp,
    failing: Arc<AtomicU16>,
    delay: Arc<AtomicU64>,
}

pub(crate) async fn app() -> App {
    let failing = Arc::new(AtomicU16::new(0));
    let delay = Arc::new(AtomicU64::new(0));
    let (f, d) = (failing.clone(), delay.clone());
    let probe = ProbeApp::start(move |_| match f.load(Ordering::SeqCst) {
        0 => Reply::ok(Duration::from_millis(d.load(Ordering::SeqCst))),
        status => Reply {
            status,
            headers: vec![],
            delay: Duration::ZERO,
        },
    })
    .await;
    App {
        probe,
        failing,
        delay,
    }
}

/// The admin builder's sync route (`keep_payload`) plus an async route.
pub(crate) fn builder_with_queue(app: &App, redis: &RedisServer) -> SidecarBuilder {
    let mut q = RouteCfg::standard(QUEUED, QUEUED_PATH);
    q.extra = "mode = \"async\"\nmax_attempts = 1\nkeep_payload = true\n".into();
    let mut route = RouteCfg::standard(ROUTE, PATH);
    route.extra = "keep_payload = true\n".into();
    SidecarBuilder::new(&app.probe.url(), &redis.url())
        .route(route)
        .route(q)
        .top("admin_token", "ops=env:OPS_TOKEN")
        .env("IDEMGATE_ADMIN_TOKEN", TOKEN)
        .env("OPS_TOKEN", OPS_TOKEN)
}

pub(crate) async fn call(
    sc: &Sidecar,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let m = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let mut rb = sc
        .client
        .request(m, sc.admin_url(path))
        .bearer_auth(TOKEN)
        .timeout(20 * SEC);
    if let Some(b) = body {
        rb = rb
            .header("content-type", "application/json")
            .body(b.to_string());
    }
    let r = rb.send().await.unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap_or_default();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// Polls `show` until the job reaches `state`; returns the job.
pub(crate) async fn wait_job(
    what: &str,
    deadline: Duration,
    mut show: impl AsyncFnMut() -> Value,
    state: &str,
) -> Value {
    let end = Instant::now() + deadline;
    loop {
        let j = show().await;
        if j["state"] == state {
            return j;
        }
        assert!(Instant::now() < end, "{what}: job never {state}: {j}");
        tokio::time::sleep(SEC / 4).await;
    }
}

pub(crate) fn calls_per_key(calls: &[Call], path: &str) -> HashMap<String, (usize, usize)> {
    let mut m: HashMap<String, (usize, usize)> = HashMap::new();
    for c in calls.iter().filter(|c| c.path == path) {
        let e = m.entry(c.key.clone()).or_default();
        e.0 += 1;
        if c.status < 300 {
            e.1 += 1;
        }
    }
    m
}

fn route_row(routes: &Value, name: &str) -> Value {
    routes["routes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["route"] == name)
        .cloned()
        .unwrap_or_else(|| panic!("no route {name} in {routes}"))
}

/// Waits until the async route holds `n` dead letters.
async fn wait_dead_letters(sc: &Sidecar, n: u64) {
    let end = Instant::now() + 20 * SEC;
    while route_row(&call(sc, "GET", "/admin/routes", None).await.1, QUEUED)["dead_letters"] != n {
        assert!(Instant::now() < end, "dead letters never reached {n}");
        tokio::time::sleep(SEC / 4).await;
    }
}

// Multi-threaded: the CLI runs as a blocking child process while the application (a
// task of this runtime) must keep answering.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_resume_redrive_and_replay_through_the_api_and_the_cli() {
    let redis = RedisServer::start_new();
    let app = app().await;
    let a = builder_with_queue(&app, &redis).start().await;
    let b = builder_with_queue(&app, &redis).start().await;
    let cli = Cli::new(&a);

    // Paused through one sidecar's API: every sidecar acknowledges and delivers nothing.
    let (s, v) = call(&a, "POST", &format!("/admin/routes/{QUEUED}/pause"), None).await;
    assert_eq!((s, &v["paused"]), (200, &json!(true)), "{v}");
    let (_, routes) = call(&b, "GET", "/admin/routes", None).await;
    assert_eq!(route_row(&routes, QUEUED)["paused"], true);
    let ds: Vec<Delivery> = (0..10)
        .map(|_| Delivery::fresh().path(QUEUED_PATH))
        .collect();
    for (i, d) in ds.iter().enumerate() {
        let sc = if i % 2 == 0 { &a } else { &b };
        assert_eq!(sc.send(d).await.status, 200);
    }
    tokio::time::sleep(3 * SEC / 2).await;
    assert_eq!(
        calls_per_key(&app.probe.calls(), QUEUED_PATH).len(),
        0,
        "delivered while paused"
    );
    let (_, routes) = call(&b, "GET", "/admin/routes", None).await;
    let row = route_row(&routes, QUEUED);
    assert_eq!(
        (&row["queue_depth"], &row["mode"]),
        (&json!(10), &json!("async")),
        "{row}"
    );
    assert_eq!(route_row(&routes, ROUTE)["mode"], "sync");
    b.wait_metric(&format!("idemgate_route_paused{{route=\"{QUEUED}\"}}"), 1.0)
        .await;
    let listed = cli.json(&["routes", "list"]);
    assert_eq!(route_row(&listed, QUEUED)["paused"], true);

    // Resumed from the CLI: the queue drains, each delivery once.
    let resumed = cli.json(&["routes", "resume", QUEUED]);
    assert_eq!(resumed["paused"], false);
    app.probe.wait_for_ok(10, 20 * SEC).await;
    let per = calls_per_key(&app.probe.calls(), QUEUED_PATH);
    assert_eq!(per.len(), 10);
    assert!(per.values().all(|(n, ok)| (*n, *ok) == (1, 1)), "{per:?}");
    b.wait_metric(&format!("idemgate_route_paused{{route=\"{QUEUED}\"}}"), 0.0)
        .await;

    // Refusals: a sync route cannot be paused, an unknown one is not found, bad jobs
    // are 400, an unknown job 404, no token 401.
    let (s, _) = call(&a, "POST", &format!("/admin/routes/{ROUTE}/pause"), None).await;
    assert_eq!(s, 409);
    let (s, _) = call(&a, "POST", "/admin/routes/nope/pause", None).await;
    assert_eq!(s, 404);
    for bad in [
        json!({"kind": "nope", "route": ROUTE}),
        json!({"kind": "replay", "route": "nope"}),
        json!({"kind": "replay", "route": ROUTE, "filter": {"colour": "red"}}),
        json!({"kind": "replay", "route": ROUTE, "filter": {"since": "yesterday"}}),
        json!({"kind": "redrive", "route": ROUTE}),
        json!({"kind": "redrive", "route": QUEUED, "filter": {"older_than": "soon"}}),
        json!(["not", "an", "object"]),
    ] {
        let (s, v) = call(&a, "POST", "/admin/jobs", Some(bad.clone())).await;
        assert_eq!(s, 400, "{bad} → {v}");
    }
    // The list's search words, parsed as the list parses them: a bad value names its
    // word; good ones select (here nothing).
    for (filter, word) in [
        (json!({"upstream_status": "6xx"}), "upstream_status"),
        (json!({"kept": "yes"}), "kept"),
        (json!({"since": 5, "until": 1}), "until"),
    ] {
        let job = json!({"kind": "replay", "route": ROUTE, "filter": filter});
        let (s, v) = call(&a, "POST", "/admin/jobs", Some(job)).await;
        assert_eq!(s, 400, "{v}");
        assert!(v.to_string().contains(&format!("filter.{word}:")), "{v}");
    }
    let words = json!({"upstream_status": "4xx", "kept": true, "duplicates": "true",
        "key_prefix": "none_", "since": 1, "until": 2});
    let job = json!({"kind": "replay", "route": ROUTE, "filter": words});
    let (s, v) = call(&a, "POST", "/admin/jobs", Some(job)).await;
    assert_eq!(s, 202, "{v}");
    assert_eq!(v["total"], 0, "{v}");
    let (s, _) = call(&a, "GET", "/admin/jobs/0123", None).await;
    assert_eq!(s, 404);
    assert_eq!(api(&a, "GET", "/admin/jobs", None).await.status, 401);

    // Dead letters (max_attempts = 1 against a failing application), redriven in bulk
    // from the CLI once it recovers: a sidecar takes the job, each delivered once.
    app.failing.store(500, Ordering::SeqCst);
    let dead: Vec<Delivery> = (0..5)
        .map(|_| Delivery::fresh().path(QUEUED_PATH))
        .collect();
    for d in &dead {
        assert_eq!(a.send(d).await.status, 200);
    }
    wait_dead_letters(&a, 5).await;
    app.failing.store(0, Ordering::SeqCst);
    let started = cli.json(&["jobs", "start", "--kind", "redrive", "--route", QUEUED]);
    assert_eq!(
        (&started["total"], &started["state"]),
        (&json!(5), &json!("running")),
        "{started}"
    );
    let id = started["id"].as_str().unwrap().to_string();
    let done = wait_job(
        "redrive",
        30 * SEC,
        async || cli.json(&["jobs", "show", &id]),
        "done",
    )
    .await;
    assert_eq!(
        (&done["done"], &done["failed"]),
        (&json!(5), &json!(0)),
        "{done}"
    );
    app.probe.wait_for_ok(15, 20 * SEC).await;
    let per = calls_per_key(&app.probe.calls(), QUEUED_PATH);
    for d in &dead {
        assert_eq!(
            per[&format!("{QUEUED}:{}", d.id)],
            (2, 1),
            "one failure, then once"
        );
    }

    // Replay of every completed delivery of the sync route through the API.
    let sync: Vec<Delivery> = (0..5).map(|_| Delivery::fresh()).collect();
    for d in &sync {
        assert_eq!(b.send(d).await.status, 200);
    }
    let (s, started) = call(
        &a,
        "POST",
        "/admin/jobs",
        Some(json!({"kind": "replay", "route": ROUTE, "filter": {"status": "completed"}})),
    )
    .await;
    assert_eq!((s, &started["total"]), (202, &json!(5)), "{started}");
    let id = started["id"].as_str().unwrap().to_string();
    let done = wait_job(
        "replay",
        30 * SEC,
        async || call(&b, "GET", &format!("/admin/jobs/{id}"), None).await.1,
        "done",
    )
    .await;
    assert_eq!(
        (&done["done"], &done["failed"]),
        (&json!(5), &json!(0)),
        "{done}"
    );
    let per = calls_per_key(&app.probe.calls(), PATH);
    for d in &sync {
        assert_eq!(
            per[&format!("{ROUTE}:{}", d.id)],
            (2, 2),
            "the delivery, then its replay"
        );
    }
    let (_, list) = call(&b, "GET", "/admin/jobs", None).await;
    // The redrive, the replay, and the search job that selected nothing.
    assert_eq!(list["jobs"].as_array().unwrap().len(), 3, "{list}");
    // Reading jobs is an admin action like any other: audited (the log is written in
    // batches, so wait for it).
    wait_until(5 * SEC, "job reads audited", || {
        let log = b.stderr();
        log.contains("action=\"list_jobs\"") && log.contains("action=\"show_job\"")
    })
    .await;
    assert_eq!(
        cli.json(&["jobs", "list"])["jobs"]
            .as_array()
            .unwrap()
            .len(),
        3
    );
    // Starting a finished job again is refused.
    let (s, _) = call(&a, "POST", "/admin/jobs", Some(json!({"id": id}))).await;
    assert_eq!(s, 409);
}

/// Sends `n` sync deliveries through `sc` and waits until each completed.
pub(crate) async fn completed(sc: &Sidecar, app: &App, n: usize) -> Vec<Delivery> {
    let ds: Vec<Delivery> = (0..n).map(|_| Delivery::fresh()).collect();
    for d in &ds {
        assert_eq!(sc.send(d).await.status, 200);
    }
    app.probe.wait_for_ok(n, 10 * SEC).await;
    ds
}

/// Completes `n` deliveries through `sc`, starts a replay job of them all there (each
/// replay taking 150 ms at the application) and waits until `replayed` of them reached
/// it; the deliveries and the job as started.
async fn replay_all_and_wait(
    sc: &Sidecar,
    app: &App,
    n: usize,
    replayed: usize,
) -> (Vec<Delivery>, Value) {
    let ds = completed(sc, app, n).await;
    app.delay.store(150, Ordering::SeqCst);
    let (s, started) = call(
        sc,
        "POST",
        "/admin/jobs",
        Some(json!({"kind": "replay", "route": ROUTE})),
    )
    .await;
    assert_eq!((s, &started["total"]), (202, &json!(n)), "{started}");
    let end = Instant::now() + 20 * SEC;
    while app.probe.calls().len() < n + replayed {
        assert!(Instant::now() < end, "the job never got going");
        tokio::time::sleep(SEC / 20).await;
    }
    (ds, started)
}

/// Checks that no delivery was forwarded more than twice (once, then at most one
/// replay), and that the replays forwarded match the job's count.
fn assert_no_double_replay(app: &App, ds: &[Delivery], job: &Value) {
    let per = calls_per_key(&app.probe.calls(), PATH);
    let twice = ds
        .iter()
        .filter(|d| per[&format!("{ROUTE}:{}", d.id)].0 == 2)
        .count() as u64;
    for d in ds {
        let n = per[&format!("{ROUTE}:{}", d.id)].0;
        assert!(n <= 2, "{} forwarded {n} times", d.id);
    }
    let (done, failed) = (
        job["done"].as_u64().unwrap(),
        job["failed"].as_u64().unwrap(),
    );
    assert_eq!(done + failed, ds.len() as u64, "{job}");
    assert!(
        failed <= 1,
        "only the item in hand at the kill may be lost: {job}"
    );
    assert!(
        twice >= done && twice <= done + failed,
        "{twice} replayed, {job}"
    );
}

/// A replay job's sidecar is killed mid-job: the other sidecar takes the job over
/// once its heartbeat is stale and finishes it, replaying nothing twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_whose_sidecar_dies_is_finished_by_another_without_replaying_twice() {
    let redis = RedisServer::start_new();
    let app = app().await;
    let mut a = builder_with_queue(&app, &redis).start().await;
    let b = builder_with_queue(&app, &redis).start().await;
    let (ds, started) = replay_all_and_wait(&a, &app, 30, 8).await;
    let id = started["id"].as_str().unwrap().to_string();
    a.kill9();
    let job = wait_job(
        "taken over",
        60 * SEC,
        async || call(&b, "GET", &format!("/admin/jobs/{id}"), None).await.1,
        "done",
    )
    .await;
    assert_ne!(
        job["owner"], started["owner"],
        "finished by the other sidecar: {job}"
    );
    assert_no_double_replay(&app, &ds, &job);
}

/// The only sidecar dies mid-job: the job shows `interrupted`; started again from the
/// CLI it is finished by the next sidecar that comes up, replaying nothing twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_job_finishes_when_started_again() {
    let redis = RedisServer::start_new();
    let app = app().await;
    let mut a = builder_with_queue(&app, &redis).start().await;
    let cli = Cli::new(&a);
    let (ds, started) = replay_all_and_wait(&a, &app, 20, 5).await;
    let id = started["id"].as_str().unwrap().to_string();
    a.kill9();
    wait_job(
        "stale",
        30 * SEC,
        async || cli.json(&["jobs", "show", &id]),
        "interrupted",
    )
    .await;
    let again = cli.json(&["jobs", "start", "--id", &id]);
    assert_eq!(again["state"], "running", "{again}");
    let _b = builder_with_queue(&app, &redis).start().await;
    let job = wait_job(
        "restarted",
        60 * SEC,
        async || cli.json(&["jobs", "show", &id]),
        "done",
    )
    .await;
    assert_no_double_replay(&app, &ds, &job);
}

/// Starts a job through `sc`'s API and waits until it is done; checks that it took on
/// `total` items and settled each one well.
async fn run_job(sc: &Sidecar, job: Value, total: u64) {
    let (s, started) = call(sc, "POST", "/admin/jobs", Some(job.clone())).await;
    assert_eq!(
        (s, &started["total"]),
        (202, &json!(total)),
        "{job} → {started}"
    );
    let path = format!("/admin/jobs/{}", started["id"].as_str().unwrap());
    let show = async || call(sc, "GET", &path, None).await.1;
    let done = wait_job(&job.to_string(), 30 * SEC, show, "done").await;
    let settled = (&done["done"], &done["failed"]);
    assert_eq!(settled, (&json!(total), &json!(0)), "{job} → {done}");
}

/// The application's calls per key of `route`, `(calls, 2xx)`: `want[i]` for each
/// delivery of `groups[i]`, and no call for any other key.
fn assert_calls(app: &App, route: &str, groups: &[&[Delivery]], want: &[(usize, usize)]) {
    let expected: HashMap<String, (usize, usize)> = groups
        .iter()
        .zip(want)
        .flat_map(|(ds, n)| ds.iter().map(move |d| (format!("{route}:{}", d.id), *n)))
        .collect();
    let path = if route == QUEUED { QUEUED_PATH } else { PATH };
    assert_eq!(calls_per_key(&app.probe.calls(), path), expected);
}

/// The delivery log's entries of `ds` on the sync route, and the first and last of
/// their `first_seen`.
async fn logged(sc: &Sidecar, ds: &[Delivery]) -> (Vec<Value>, u64, u64) {
    let mut entries = Vec::new();
    for d in ds {
        let (s, e) = call(sc, "GET", &delivery_path(ROUTE, &d.id), None).await;
        assert_eq!(s, 200, "{e}");
        entries.push(e);
    }
    let seen = entries.iter().map(|e| e["first_seen"].as_u64().unwrap());
    let (first, last) = (seen.clone().min().unwrap(), seen.max().unwrap());
    (entries, first, last)
}

/// A replay job acts on the deliveries its filter selects and on no other: a time
/// window (`since`, `until` on first seen), a `status`, an `outcome`, each job picking
/// one of three groups of deliveries and leaving the other two alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_job_replays_only_the_deliveries_its_filter_selects() {
    let redis = RedisServer::start_new();
    let app = app().await;
    let a = builder_with_queue(&app, &redis).start().await;
    // Three groups first seen 50 ms apart: x and y completed, z released (the
    // application answered 500).
    let x = completed(&a, &app, 3).await;
    tokio::time::sleep(SEC / 20).await;
    let y = completed(&a, &app, 3).await;
    tokio::time::sleep(SEC / 20).await;
    app.failing.store(500, Ordering::SeqCst);
    let z: Vec<Delivery> = (0..3).map(|_| Delivery::fresh()).collect();
    for d in &z {
        a.send(d).await;
    }
    app.failing.store(0, Ordering::SeqCst);
    let (lx, _, x_last) = logged(&a, &x).await;
    let (ly, y_first, y_last) = logged(&a, &y).await;
    let (lz, z_first, _) = logged(&a, &z).await;
    assert!(x_last < y_first && y_last < z_first, "{lx:?} {ly:?} {lz:?}");
    assert!(lz.iter().all(|e| e["status"] == "released"), "{lz:?}");
    let (since, until) = (x_last + 1, y_last + 1);

    // Each filter picks one group: the window y (x was first seen before `since`, z at
    // `until` or later), `released` z (x and y completed), `forwarded` x (y and z were
    // last settled by the replays). The application's calls per group after each job:
    for (filter, after) in [
        (
            json!({"since": since, "until": until}),
            [(1, 1), (2, 2), (1, 0)],
        ),
        (json!({"status": "released"}), [(1, 1), (2, 2), (2, 1)]),
        (json!({"outcome": "forwarded"}), [(2, 2), (2, 2), (2, 1)]),
    ] {
        let job = json!({"kind": "replay", "route": ROUTE, "filter": filter});
        run_job(&a, job, 3).await;
        assert_calls(&app, ROUTE, &[&x, &y, &z], &after);
    }
}

/// A redrive job puts back the dead letters its filter selects and no other: those
/// dead longer than `older_than`, those whose last error contains `error_contains`;
/// the rest stay dead letters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redrive_job_redrives_only_the_dead_letters_its_filter_selects() {
    let redis = RedisServer::start_new();
    let app = app().await;
    let a = builder_with_queue(&app, &redis).start().await;
    // Three groups of dead letters (max_attempts = 1): old ones and young ones the
    // application answered 500, young ones it answered 502.
    let mut dead = Vec::new();
    for (status, age) in [(500, 3 * SEC), (500, Duration::ZERO), (502, Duration::ZERO)] {
        app.failing.store(status, Ordering::SeqCst);
        let ds: Vec<Delivery> = (0..2)
            .map(|_| Delivery::fresh().path(QUEUED_PATH))
            .collect();
        for d in &ds {
            assert_eq!(a.send(d).await.status, 200);
        }
        dead.push(ds);
        wait_dead_letters(&a, 2 * dead.len() as u64).await;
        tokio::time::sleep(age).await;
    }
    app.failing.store(0, Ordering::SeqCst);
    let (old, young, other) = (&dead[0], &dead[1], &dead[2]);

    // Each filter picks one group: dead for 2 s or more the old ones (the young died
    // well under 2 s ago), failed with 502 `other` (the young failed with 500). The
    // application's calls per group once the redriven ones were delivered:
    for (filter, after, ok) in [
        (json!({"older_than": "2s"}), [(2, 1), (1, 0), (1, 0)], 2),
        (
            json!({"error_contains": "502"}),
            [(2, 1), (1, 0), (2, 1)],
            4,
        ),
    ] {
        let job = json!({"kind": "redrive", "route": QUEUED, "filter": filter});
        run_job(&a, job, 2).await;
        app.probe.wait_for_ok(ok, 20 * SEC).await;
        assert_calls(&app, QUEUED, &[old, young, other], &after);
    }
    let (_, left) = call(
        &a,
        "GET",
        &format!("/admin/dead-letters?route={QUEUED}"),
        None,
    )
    .await;
    let mut left: Vec<&str> = left["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["key"].as_str().unwrap())
        .collect();
    let mut want: Vec<&str> = young.iter().map(|d| d.id.as_str()).collect();
    left.sort();
    want.sort();
    assert_eq!(left, want, "the young 500s stay dead letters");
}
