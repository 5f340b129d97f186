//! End-to-end: starting a bulk job is all or nothing, and a retried start is the same
//! job (docs/operating.md "Bulk jobs", `Idempotency-Key`): a start answered 503 leaves
//! nothing a sidecar would run, and its retry replays each delivery once more, not twice.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::admin::*;
use crate::common::*;
use crate::e2e_jobs::{app, builder_with_queue, call, calls_per_key, completed, wait_job};

const SEC: Duration = Duration::from_secs(1);

/// `POST /admin/jobs` with `Idempotency-Key: key`.
async fn start(sc: &Sidecar, body: &Value, key: &str) -> (u16, Value) {
    let r = sc
        .client
        .post(sc.admin_url("/admin/jobs"))
        .bearer_auth(TOKEN)
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(body.to_string())
        .timeout(20 * SEC)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap_or_default();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// Every job key in Redis, and whether it expires.
fn job_keys_without_ttl(redis: &RedisServer) -> Vec<String> {
    redis
        .keys()
        .into_iter()
        .filter(|k| k.contains(":job"))
        .filter(|k| redis.cli(&["PTTL", k]).parse::<i64>().unwrap_or(-1) < 0)
        .collect()
}

/// The store refuses the last step of a job's creation once (a Redis ACL): the start
/// answers 503 and leaves no job; the operator's retry with the same key starts one,
/// retried again it is the same job. After a sweeper had every chance to take over a
/// job left behind, each delivery reached the application twice: once, and one replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_answered_503_runs_nothing_and_its_retry_is_one_job() {
    let redis = RedisServer::start_new();
    let app = app().await;
    let a = builder_with_queue(&app, &redis).start().await;
    let ds = completed(&a, &app, 5).await;
    let replay = json!({"kind": "replay", "route": ROUTE});

    // Refused once each: the listing's trim (the last of the six round trips a start
    // took), and the rename that makes a staged work list the job's (the last step now).
    for command in ["zremrangebyscore", "rename"] {
        redis.cli(&["ACL", "SETUSER", "default", &format!("-{command}")]);
        let (s, v) = start(&a, &replay, "op-retry-1").await;
        redis.cli(&["ACL", "SETUSER", "default", &format!("+{command}")]);
        assert_eq!(s, 503, "{command} refused: {v}");
        let (_, list) = call(&a, "GET", "/admin/jobs", None).await;
        assert_eq!(
            list["jobs"],
            json!([]),
            "{command} refused: a start answered 503 left a job a sweeper runs"
        );
        assert_eq!(job_keys_without_ttl(&redis), Vec::<String>::new());
    }
    let refused_at = Instant::now();

    let (s, job) = start(&a, &replay, "op-retry-1").await;
    assert_eq!((s, &job["total"]), (202, &json!(5)), "{job}");
    let id = job["id"].as_str().unwrap().to_string();
    let (s, again) = start(&a, &replay, "op-retry-1").await;
    assert_eq!(
        (s, &again["id"]),
        (202, &json!(id)),
        "a retry is the same job"
    );
    let other = json!({"kind": "replay", "route": ROUTE, "filter": {"status": "released"}});
    let (s, v) = start(&a, &other, "op-retry-1").await;
    assert_eq!(s, 409, "one key, another request: {v}");
    let (s, v) = start(&a, &other, &"k".repeat(201)).await;
    assert_eq!(s, 400, "a key too long: {v}");
    let done = wait_job(
        "replay",
        20 * SEC,
        async || call(&a, "GET", &format!("/admin/jobs/{id}"), None).await.1,
        "done",
    )
    .await;
    assert_eq!((&done["done"], &done["failed"]), (&json!(5), &json!(0)));

    // The CLI: one key per invocation, reused on its own retries; a given key is one job.
    let cli = Cli::new(&a);
    let none = ["jobs", "start", "--kind", "replay", "--route", ROUTE];
    let none = [&none[..], &["--filter", r#"{"status": "released"}"#]].concat();
    let keyed = [&none[..], &["--idempotency-key", "cli-1"]].concat();
    let (x, y) = (cli.json(&keyed), cli.json(&keyed));
    assert_eq!(x["id"], y["id"], "one key, one job");
    assert_ne!(cli.json(&none)["id"], cli.json(&none)["id"]);

    // Any job the refused start left would be taken over by now (10 s stale + 3 s sweep).
    tokio::time::sleep_until((refused_at + 14 * SEC).into()).await;
    let per = calls_per_key(&app.probe.calls(), PATH);
    for d in &ds {
        assert_eq!(
            per[&format!("{ROUTE}:{}", d.id)],
            (2, 2),
            "the delivery, then one replay"
        );
    }
    assert_eq!(job_keys_without_ttl(&redis), Vec::<String>::new());
}
