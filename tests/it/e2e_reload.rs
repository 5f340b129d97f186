//! End-to-end: live configuration reload (docs/configuration.md, "Reloading without a
//! restart"). A real sidecar process, its config file rewritten under it: SIGHUP, the
//! admin API, `idemgate reload`, and a kubelet-style volume update with no signal.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::admin::{TOKEN, api};
use crate::common::*;

/// Polls `cond` (async) every 50 ms until true; panics with `what` after `within`.
pub(crate) async fn eventually<F, Fut>(within: Duration, what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let end = Instant::now() + within;
    while !cond().await {
        assert!(Instant::now() < end, "not within {within:?}: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The status of a fresh delivery signed with `secret`.
async fn status_with(sc: &Sidecar, secret: &str) -> u16 {
    let d = Delivery::fresh().secret(secret);
    post(&sc.client, &sc.url(&d.path), &d.headers(), d.body.clone())
        .await
        .expect("post")
        .status
}

fn builder(upstream: &Upstream, secrets: &[&str]) -> SidecarBuilder {
    SidecarBuilder::new(&upstream.url(), "memory")
        .route(RouteCfg::standard(ROUTE, PATH).secrets(secrets))
        .env("IDEMGATE_ADMIN_TOKEN", TOKEN)
}

/// Rewrites the sidecar's config file whole (write, then rename: never half-read).
pub(crate) fn rewrite(sc: &Sidecar, text: &str) {
    let tmp = sc.dir().join("idemgate.toml.new");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, sc.config_path()).unwrap();
}

async fn reloads(sc: &Sidecar, result: &str) -> f64 {
    sc.metric(&format!(
        "idemgate_config_reloads_total{{result=\"{result}\"}}"
    ))
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_puts_a_new_secret_in_force_from_the_first_request_after_the_switch() {
    let upstream = Upstream::start().await;
    let mut sc = builder(&upstream, &[SECRET]).start().await;
    assert_eq!(status_with(&sc, SECRET).await, 200);
    assert_eq!(status_with(&sc, SECRET_2).await, 401);
    let before = sc
        .metric("idemgate_config_last_reload_success_timestamp_seconds")
        .await;
    assert!(before > 0.0);

    let next = builder(&upstream, &[SECRET_2]).toml(sc.listen, sc.admin);
    rewrite(&sc, &next);
    sc.signal("HUP");
    // The watcher sees the rewrite too; the SIGHUP's own reload is told by its log line.
    eventually(
        Duration::from_secs(20),
        "the SIGHUP reload logged",
        || async {
            sc.stderr()
                .lines()
                .any(|l| l.contains("configuration reloaded") && l.contains("trigger=\"SIGHUP\""))
        },
    )
    .await;
    assert!(reloads(&sc, "ok").await >= 1.0);
    // The switch is done when the metric counts it: the first delivery after it is
    // verified with the new secret, and the removed one is refused.
    assert_eq!(status_with(&sc, SECRET_2).await, 200);
    assert_eq!(status_with(&sc, SECRET).await, 401);
    assert_eq!(
        sc.metric("idemgate_config_last_reload_successful").await,
        1.0
    );
    assert!(
        sc.metric("idemgate_config_last_reload_success_timestamp_seconds")
            .await
            >= before
    );
    assert!(sc.is_running(), "SIGHUP must not end the sidecar");
    let log = sc.stderr();
    assert!(
        log.contains("configuration reloaded")
            && log.contains("route wh secrets added #0 removed #0"),
        "{log}"
    );
    assert!(!log.contains(SECRET_2), "a secret's value was logged");

    // GET /admin/config: the configuration in force, redacted, and when it was loaded.
    let shown = api(&sc, "GET", "/admin/config", Some(TOKEN)).await;
    assert_eq!(shown.status, 200, "{:?}", shown.json);
    let text = shown.json["config"].as_str().unwrap();
    assert!(
        text.contains("[[route]]") && text.contains("/webhooks/wh"),
        "{text}"
    );
    assert!(!text.contains(SECRET_2) && !text.contains(SECRET), "{text}");
    assert!(shown.json["loaded_at"].as_str().unwrap().starts_with("20"));
    assert_eq!(api(&sc, "GET", "/admin/config", None).await.status, 401);

    // `idemgate check-config --running`: the same, from the command line.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_idemgate"))
        .args(["check-config", "--running", "--config"])
        .arg(sc.config_path())
        .env("IDEMGATE_ADMIN_TOKEN", TOKEN)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), text);
    let note = String::from_utf8_lossy(&out.stderr);
    assert!(note.contains("in force since 20"), "{note}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_file_or_a_restart_only_change_leaves_the_configuration_in_force_whole() {
    let upstream = Upstream::start().await;
    let sc = builder(&upstream, &[SECRET]).start().await;
    let good = sc.config.clone();

    // Invalid: a second route with a bad duration; the first route's new secret must
    // not be applied either.
    let mut bad = builder(&upstream, &[SECRET_2]).toml(sc.listen, sc.admin);
    bad += "\n[[route]]\nname = \"b\"\npath = \"/webhooks/b\"\nprovider = \"standard\"\nsecrets = [\"x\"]\ntolerance = \"soon\"\n";
    rewrite(&sc, &bad);
    let a = api(&sc, "POST", "/admin/reload", Some(TOKEN)).await;
    assert_eq!(a.status, 422, "{:?}", a.json);
    assert_eq!(a.json["error"], "invalid_config");
    let why = a.json["message"].as_str().unwrap();
    assert!(why.contains("tolerance"), "the field is named: {why}");
    assert_eq!(status_with(&sc, SECRET).await, 200);
    assert_eq!(status_with(&sc, SECRET_2).await, 401);
    assert_eq!(
        sc.metric("idemgate_config_last_reload_successful").await,
        0.0
    );
    // (The watcher may have reloaded the same file too: at least this one failed.)
    assert!(reloads(&sc, "failed").await >= 1.0);
    // Log lines are written in batches: wait for it.
    eventually(
        Duration::from_secs(10),
        "the failure logged, naming the field",
        || async {
            sc.stderr().lines().any(|l| {
                l.contains("configuration reload failed") && l.contains("route[1].tolerance")
            })
        },
    )
    .await;

    // What only a restart changes: refused, naming it, nothing else applied.
    let moved = builder(&upstream, &[SECRET_2])
        .top("max_connections", "7")
        .toml(sc.listen, sc.admin);
    rewrite(&sc, &moved);
    let cli = idemgate_reload(&sc);
    assert_eq!(cli.status.code(), Some(1), "{cli:?}");
    let out = String::from_utf8_lossy(&cli.stdout);
    assert!(
        out.contains("restart_needed") && out.contains("max_connections"),
        "{out}"
    );
    assert_eq!(status_with(&sc, SECRET_2).await, 401);

    // Valid again: applied, through the CLI.
    rewrite(&sc, &good);
    let cli = idemgate_reload(&sc);
    assert_eq!(cli.status.code(), Some(0), "{cli:?}");
    assert!(String::from_utf8_lossy(&cli.stdout).contains("\"result\":\"ok\""));
    assert_eq!(
        sc.metric("idemgate_config_last_reload_successful").await,
        1.0
    );
    assert!(reloads(&sc, "ok").await >= 1.0);
}

/// `idemgate reload --config FILE` with the admin token in the environment.
fn idemgate_reload(sc: &Sidecar) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_idemgate"))
        .arg("reload")
        .arg("--config")
        .arg(sc.config_path())
        .env("IDEMGATE_ADMIN_TOKEN", TOKEN)
        .output()
        .expect("run idemgate reload")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_removed_by_a_reload_answers_404_and_one_added_is_served() {
    let upstream = Upstream::start().await;
    let sc = builder(&upstream, &[SECRET]).start().await;
    let mut other = RouteCfg::standard("b", "/webhooks/b");
    other.secrets = vec![SECRET.into()];
    // A rotated admin token too (kept in a file, as a Secret volume would).
    const ROTATED: &str = "ops-token-rotated-0123456789";
    std::fs::write(sc.dir().join("ops-token"), ROTATED).unwrap();
    let token_file = format!("ops=file:{}", sc.dir().join("ops-token").display());
    let next = SidecarBuilder::new(&upstream.url(), "memory")
        .route(other)
        .top("admin_token", &token_file)
        .env("IDEMGATE_ADMIN_TOKEN", TOKEN)
        .toml(sc.listen, sc.admin);
    assert_eq!(
        api(&sc, "GET", "/admin/config", Some(ROTATED)).await.status,
        401
    );
    rewrite(&sc, &next);
    let a = api(&sc, "POST", "/admin/reload", Some(TOKEN)).await;
    assert_eq!(a.status, 200, "{:?}", a.json);
    assert_eq!(
        a.json["changes"],
        "routes added: b; routes removed: wh; changed: admin_token"
    );
    assert_eq!(
        api(&sc, "GET", "/admin/config", Some(ROTATED)).await.status,
        200
    );
    // The console lists the routes in force: the new one is searchable.
    let listed = api(&sc, "GET", "/admin/deliveries?route=b", Some(ROTATED)).await;
    assert_eq!(listed.status, 200, "{:?}", listed.json);
    // Bulk jobs know the routes in force too.
    let job = |route: &str| {
        let body = serde_json::json!({"kind": "replay", "route": route, "filter": {}});
        sc.client
            .post(sc.admin_url("/admin/jobs"))
            .bearer_auth(ROTATED)
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
    };
    assert_eq!(job("b").await.unwrap().status().as_u16(), 202);
    assert_eq!(job(ROUTE).await.unwrap().status().as_u16(), 400);
    let gone = Delivery::fresh();
    let r = post(
        &sc.client,
        &sc.url(PATH),
        &gone.headers(),
        gone.body.clone(),
    )
    .await
    .unwrap();
    r.assert_error(404, "no_route");
    let d = Delivery::fresh().path("/webhooks/b");
    let r = post(
        &sc.client,
        &sc.url("/webhooks/b"),
        &d.headers(),
        d.body.clone(),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
}

/// Writes `files` the way the kubelet updates a Secret or ConfigMap volume: a new
/// timestamped directory, a `..data_tmp` symlink to it renamed over `..data`, and each
/// key a symlink to `..data/<key>` (made once).
fn kubelet_write(dir: &Path, generation: u32, files: &[(&str, &str)]) {
    let ts = format!("..2026_12_07_00_00_{generation:02}.{generation}");
    std::fs::create_dir(dir.join(&ts)).unwrap();
    for (name, text) in files {
        std::fs::write(dir.join(&ts).join(name), text).unwrap();
    }
    let tmp = dir.join("..data_tmp");
    std::os::unix::fs::symlink(&ts, &tmp).unwrap();
    std::fs::rename(&tmp, dir.join("..data")).unwrap();
    for (name, _) in files {
        let link = dir.join(name);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(Path::new("..data").join(name), &link).unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubelet_style_rotation_is_picked_up_without_a_signal() {
    let upstream = Upstream::start().await;
    let secrets = tempfile::tempdir().unwrap();
    let old = secrets.path().join("old");
    let new = secrets.path().join("new");
    kubelet_write(secrets.path(), 1, &[("old", SECRET)]);
    let with = |files: &[&Path]| {
        let f: Vec<String> = files
            .iter()
            .map(|p| format!("file:{}", p.display()))
            .collect();
        let f: Vec<&str> = f.iter().map(String::as_str).collect();
        builder(&upstream, &f)
    };
    let sc = with(&[&old]).start().await;
    // The config itself becomes a ConfigMap-style volume: `idemgate.toml` a symlink
    // to `..data/idemgate.toml`.
    let cdir = sc.dir();
    kubelet_write(cdir, 1, &[("idemgate.toml", &sc.config)]);
    let link = cdir.join("idemgate.toml.link");
    std::os::unix::fs::symlink("..data/idemgate.toml", &link).unwrap();
    std::fs::rename(&link, sc.config_path()).unwrap();
    assert_eq!(status_with(&sc, SECRET).await, 200);

    // 1. The Secret gets a second key, then the config names both: both verify.
    kubelet_write(secrets.path(), 2, &[("old", SECRET), ("new", SECRET_2)]);
    let both = with(&[&new, &old]).toml(sc.listen, sc.admin);
    kubelet_write(cdir, 2, &[("idemgate.toml", &both)]);
    eventually(
        Duration::from_secs(30),
        "the new secret verifies",
        || async { status_with(&sc, SECRET_2).await == 200 },
    )
    .await;
    assert_eq!(status_with(&sc, SECRET).await, 200);

    // 2. The provider has switched; the old key goes (config first, then the Secret).
    let only_new = with(&[&new]).toml(sc.listen, sc.admin);
    kubelet_write(cdir, 3, &[("idemgate.toml", &only_new)]);
    kubelet_write(secrets.path(), 3, &[("new", SECRET_2)]);
    eventually(
        Duration::from_secs(30),
        "the old secret is refused",
        || async { status_with(&sc, SECRET).await == 401 },
    )
    .await;
    assert_eq!(status_with(&sc, SECRET_2).await, 200);
    // 3. The Secret's value itself rotated in place (same key, new value).
    kubelet_write(secrets.path(), 4, &[("new", SECRET_WRONG)]);
    eventually(
        Duration::from_secs(30),
        "the rotated value verifies",
        || async { status_with(&sc, SECRET_WRONG).await == 200 },
    )
    .await;
    assert_eq!(status_with(&sc, SECRET_2).await, 401);
    assert_eq!(reloads(&sc, "failed").await, 0.0, "{}", sc.stderr());
    assert!(!sc.stderr().contains("SIGHUP"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_async_route_answers_404_and_its_queued_entry_is_delivered_once() {
    let upstream = Upstream::start().await;
    upstream.set_mode(Mode::Status(503));
    let mut queued = RouteCfg::standard("q", "/webhooks/q");
    queued.extra =
        "mode = \"async\"\nbackoff = \"100ms\"\nmax_backoff = \"200ms\"\nmax_attempts = 1000\n"
            .into();
    let with_q = SidecarBuilder::new(&upstream.url(), "memory")
        .route(RouteCfg::standard(ROUTE, PATH))
        .route(queued)
        .env("IDEMGATE_ADMIN_TOKEN", TOKEN);
    let sc = with_q.clone().start().await;
    let d = Delivery::fresh().path("/webhooks/q");
    let r = post(
        &sc.client,
        &sc.url("/webhooks/q"),
        &d.headers(),
        d.body.clone(),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200, "acknowledged: {}", r.text());
    upstream.wait_for_count(1, Duration::from_secs(10)).await; // the first attempt failed

    let without_q = SidecarBuilder::new(&upstream.url(), "memory")
        .route(RouteCfg::standard(ROUTE, PATH))
        .env("IDEMGATE_ADMIN_TOKEN", TOKEN)
        .toml(sc.listen, sc.admin);
    rewrite(&sc, &without_q);
    let a = api(&sc, "POST", "/admin/reload", Some(TOKEN)).await;
    assert_eq!(a.status, 200, "{:?}", a.json);
    assert_eq!(a.json["changes"], "routes removed: q");
    let copy = post(
        &sc.client,
        &sc.url("/webhooks/q"),
        &d.headers(),
        d.body.clone(),
    )
    .await
    .unwrap();
    copy.assert_error(404, "no_route");

    // The entry queued before the switch is delivered by the route's worker, once.
    upstream.set_mode(Mode::default_ok());
    let completed = "idemgate_delivery_attempts_total{route=\"q\",result=\"completed\"}";
    eventually(
        Duration::from_secs(30),
        "the queued entry delivered",
        || async { sc.metric(completed).await >= 1.0 },
    )
    .await;
    let n = upstream.count();
    upstream
        .assert_count_stays(n, Duration::from_millis(800))
        .await;
    assert_eq!(sc.metric(completed).await, 1.0);
    let key = format!("q:{}", d.id);
    let attempts = upstream.requests();
    assert!(
        attempts
            .iter()
            .all(|r| r.header("idempotency-key").as_deref() == Some(key.as_str()))
    );
    eventually(Duration::from_secs(20), "the queue drained", || async {
        sc.metric("idemgate_queue_depth{route=\"q\"}").await == 0.0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_in_flight_at_the_switch_finishes_under_the_settings_it_started_with() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let upstream = Upstream::start().await;
    let sc = builder(&upstream, &[SECRET]).start().await;
    // Headers and half the body, signed with the secret the reload will remove.
    let d = Delivery::fresh();
    let mut head = format!(
        "POST {PATH} HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n",
        d.body.len()
    );
    for (k, v) in d.headers() {
        head += &format!("{k}: {v}\r\n");
    }
    head += "connection: close\r\n\r\n";
    let mut conn = tokio::net::TcpStream::connect(sc.listen).await.unwrap();
    let (first, rest) = d.body.split_at(d.body.len() / 2);
    conn.write_all(head.as_bytes()).await.unwrap();
    conn.write_all(first).await.unwrap();
    eventually(Duration::from_secs(10), "the delivery in hand", || async {
        sc.metric("idemgate_in_flight").await == 1.0
    })
    .await;

    let next = builder(&upstream, &[SECRET_2]).toml(sc.listen, sc.admin);
    rewrite(&sc, &next);
    let a = api(&sc, "POST", "/admin/reload", Some(TOKEN)).await;
    assert_eq!(a.status, 200, "{:?}", a.json);
    assert_eq!(
        status_with(&sc, SECRET).await,
        401,
        "new deliveries: the new secret only"
    );

    conn.write_all(rest).await.unwrap();
    let mut answer = String::new();
    conn.read_to_string(&mut answer).await.unwrap();
    assert!(
        answer.starts_with("HTTP/1.1 200"),
        "verified with the secret it started with: {answer}"
    );
    assert_eq!(upstream.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_route_s_acknowledgement_and_retry_policy_change_live() {
    let upstream = Upstream::start().await;
    upstream.set_mode(Mode::Status(503));
    let queued = |policy: &str| {
        let mut q = RouteCfg::standard("q", "/webhooks/q");
        q.extra =
            format!("mode = \"async\"\nbackoff = \"50ms\"\nmax_backoff = \"100ms\"\n{policy}");
        SidecarBuilder::new(&upstream.url(), "memory")
            .route(q)
            .env("IDEMGATE_ADMIN_TOKEN", TOKEN)
    };
    let sc = queued("ack_body = \"first\"\nmax_attempts = 1000\n")
        .start()
        .await;
    let send = || async {
        let d = Delivery::fresh().path("/webhooks/q");
        post(
            &sc.client,
            &sc.url("/webhooks/q"),
            &d.headers(),
            d.body.clone(),
        )
        .await
        .unwrap()
    };
    assert_eq!(send().await.text(), "first");
    upstream.wait_for_count(2, Duration::from_secs(10)).await; // retrying

    let next = queued("ack_body = \"second\"\nmax_attempts = 3\n").toml(sc.listen, sc.admin);
    rewrite(&sc, &next);
    let a = api(&sc, "POST", "/admin/reload", Some(TOKEN)).await;
    assert_eq!(a.status, 200, "{:?}", a.json);
    assert_eq!(a.json["changes"], "routes edited: q");
    assert_eq!(
        send().await.text(),
        "second",
        "the new acknowledgement at once"
    );
    // The entry queued before, retrying under max_attempts = 1000, now stops at 3:
    // both entries end as dead letters.
    eventually(
        Duration::from_secs(30),
        "both entries dead-lettered",
        || async { sc.metric("idemgate_dead_letters_total{route=\"q\"}").await == 2.0 },
    )
    .await;
}

/// An async route's `max_concurrency` changes live: under 1, one attempt at a time;
/// reloaded to 3, three run at once (the attempt in flight at the switch counts), and
/// never more. Redis: its slot admission takes the bound per call too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_route_s_max_concurrency_changes_live() {
    use crate::common::probe_app::{ProbeApp, Reply};
    let redis = RedisServer::start_new();
    let app = ProbeApp::start(|_| Reply::ok(Duration::from_secs(3))).await;
    let bounded = |n: u32| {
        let mut q = RouteCfg::standard("q", "/webhooks/q");
        q.extra = format!("mode = \"async\"\nmax_concurrency = {n}\n");
        SidecarBuilder::new(&app.url(), &redis.url())
            .route(q)
            .env("IDEMGATE_ADMIN_TOKEN", TOKEN)
    };
    let sc = bounded(1).start().await;
    const N: usize = 8;
    for _ in 0..N {
        let a = sc.send(&Delivery::fresh().path("/webhooks/q")).await;
        assert_eq!(a.status, 200, "{a:?}");
    }
    app.wait_for_ok(2, Duration::from_secs(60)).await;
    assert_eq!(
        app.most_at_once(),
        1,
        "one at a time under max_concurrency = 1"
    );

    rewrite(&sc, &bounded(3).toml(sc.listen, sc.admin));
    let a = api(&sc, "POST", "/admin/reload", Some(TOKEN)).await;
    assert_eq!(a.status, 200, "{:?}", a.json);
    assert_eq!(a.json["changes"], "routes edited: q");
    eventually(
        Duration::from_secs(60),
        "three attempts at once",
        || async { app.most_at_once() >= 3 },
    )
    .await;
    app.wait_for_ok(N, Duration::from_secs(60)).await;
    assert_eq!(app.most_at_once(), 3, "never more than the new bound");
    assert_eq!(app.calls().len(), N, "each delivered once");
}
