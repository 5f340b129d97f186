//! End-to-end: 20 live reloads, alternating two valid files and an invalid one, while
//! signed deliveries and their copies (sync and async routes) keep arriving, on the
//! memory store and on Redis: every delivery answered, none 5xx, none forwarded twice,
//! and a secret only the new file has verifies from the first request after the switch.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::common::admin::{TOKEN, api};
use crate::common::*;

const QUEUED: &str = "/webhooks/q";

/// The sync route `wh` and the async route `q`, both with `secrets`, and `top` fields.
fn builder(
    upstream: &Upstream,
    store: &str,
    secrets: &[&str],
    top: &[(&str, &str)],
) -> SidecarBuilder {
    let mut queued = RouteCfg::standard("q", QUEUED).secrets(&[SECRET]);
    queued.extra = "mode = \"async\"\n".into();
    let mut b = SidecarBuilder::new(&upstream.url(), store)
        .route(RouteCfg::standard(ROUTE, PATH).secrets(secrets))
        .route(queued)
        .env("IDEMGATE_ADMIN_TOKEN", TOKEN);
    for (k, v) in top {
        b = b.top(k, v);
    }
    b
}

/// One delivery and a copy of it, sent at once: their statuses.
async fn with_copy(sc: &Sidecar, path: &str) -> (String, [u16; 2]) {
    let d = Delivery::fresh().path(path);
    let (url, headers) = (sc.url(path), d.headers());
    let send = || post(&sc.client, &url, &headers, d.body.clone());
    let (a, b) = tokio::join!(send(), send());
    let status = |r: Result<Answer, reqwest::Error>| r.map_or(0, |a| a.status);
    (d.id.clone(), [status(a), status(b)])
}

async fn storm(store: &str) {
    let upstream = Upstream::start().await;
    let sc = builder(&upstream, store, &[SECRET], &[]).start().await;
    let a = builder(&upstream, store, &[SECRET], &[]).toml(sc.listen, sc.admin);
    let b = builder(
        &upstream,
        store,
        &[SECRET_2, SECRET],
        &[("max_body", "2MiB")],
    )
    .toml(sc.listen, sc.admin);
    let invalid =
        builder(&upstream, store, &[SECRET], &[("max_body", "lots")]).toml(sc.listen, sc.admin);

    let done = Arc::new(AtomicBool::new(false));
    let sc = Arc::new(sc);
    let mut senders = Vec::new();
    for worker in 0..6 {
        let (sc, done) = (sc.clone(), done.clone());
        senders.push(tokio::spawn(async move {
            let path = if worker % 2 == 0 { PATH } else { QUEUED };
            let mut sent = Vec::new();
            while !done.load(Ordering::Relaxed) {
                sent.push((path, with_copy(&sc, path).await));
            }
            sent
        }));
    }
    let mut applied = 0;
    for i in 0..20 {
        let (text, valid, new_secret) = match i % 3 {
            0 => (&b, true, true),
            1 => (&invalid, false, false),
            _ => (&a, true, false),
        };
        let tmp = sc.dir().join("idemgate.toml.new");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, sc.config_path()).unwrap();
        let r = api(&sc, "POST", "/admin/reload", Some(TOKEN)).await;
        if valid {
            assert_eq!(r.status, 200, "reload {i}: {:?}", r.json);
            applied += 1;
            // The first request after the switch: SECRET_2 is only in file B.
            let d = Delivery::fresh().secret(SECRET_2);
            let s = post(&sc.client, &sc.url(PATH), &d.headers(), d.body.clone())
                .await
                .unwrap();
            assert_eq!(
                s.status,
                if new_secret { 200 } else { 401 },
                "after reload {i}: {}",
                s.text()
            );
        } else {
            assert_eq!(r.status, 422, "reload {i}: {:?}", r.json);
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    done.store(true, Ordering::Relaxed);
    let mut sent = Vec::new();
    for s in senders {
        sent.extend(s.await.unwrap());
    }
    assert!(
        sent.len() >= 20,
        "only {} deliveries during the reloads",
        sent.len()
    );
    for (path, (id, statuses)) in &sent {
        assert!(
            statuses.iter().all(|s| (200..500).contains(s)),
            "{path} {id}: {statuses:?}"
        );
        assert!(
            statuses.iter().any(|s| (200..300).contains(s)),
            "{path} {id}: {statuses:?}"
        );
    }
    // Every delivery reaches the application once: the async ones once the queue drains.
    let signed_with_secret_2 = (0..20).filter(|i| i % 3 == 0).count();
    let want = sent.len() + signed_with_secret_2;
    let end = Instant::now() + Duration::from_secs(60);
    while upstream.count() < want && Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut seen: HashMap<String, usize> = HashMap::new();
    for r in upstream.requests() {
        let key = r.header("idempotency-key").unwrap_or_default();
        *seen.entry(key).or_default() += 1;
    }
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "forwarded twice: {twice:?}");
    for (path, (id, _)) in &sent {
        let route = if *path == PATH { ROUTE } else { "q" };
        assert_eq!(
            seen.get(&format!("{route}:{id}")),
            Some(&1),
            "{route}:{id} not forwarded once"
        );
    }
    let ok = sc
        .metric("idemgate_config_reloads_total{result=\"ok\"}")
        .await;
    let failed = sc
        .metric("idemgate_config_reloads_total{result=\"failed\"}")
        .await;
    // The watcher sees the rewrites too and may reload besides the API's 20.
    assert!(
        ok >= applied as f64 && failed >= (20 - applied) as f64,
        "ok {ok}, failed {failed}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_reloads_under_load_on_the_memory_store() {
    storm("memory").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_reloads_under_load_on_redis() {
    let redis = RedisServer::start_new();
    storm(&redis.url()).await;
}
