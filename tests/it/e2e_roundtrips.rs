//! What a delivery costs in Redis, counted by Redis itself: a first delivery is two
//! round trips (claim, complete), a duplicate is one (claim). A count, not a timing:
//! it fails if anyone adds a command to the hot path.
//!
//! Commands are read from `MONITOR`, which lists every command a client sent and,
//! marked `[... lua]`, the commands scripts ran inside Redis; only the former are
//! round trips. `INFO commandstats` counts both, so it is used for the script calls.

use crate::common::monitor::{Monitor, path_and_log};
use crate::common::*;

fn calls(redis: &RedisServer, command: &str) -> u64 {
    redis
        .cli(&["INFO", "commandstats"])
        .lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:")))
        .and_then(|rest| rest.split(',').find_map(|kv| kv.strip_prefix("calls=")))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// The commands a delivery waited for since the last marker; the log writer's (sent
/// off the delivery's path, possibly after the marker) are left out.
async fn path(monitor: &Monitor, redis: &RedisServer, marker: &str) -> Vec<String> {
    path_and_log(monitor.client_commands_until_marker(redis, marker).await).0
}

#[tokio::test]
async fn a_first_delivery_costs_two_round_trips_and_a_copy_one() {
    let redis = RedisServer::start_new();
    let upstream = Upstream::start().await;
    let sidecar = SidecarBuilder::new(&upstream.url(), &redis.url())
        .start()
        .await;

    // Warm up: the first call after a Redis start loads the scripts (NOSCRIPT →
    // SCRIPT LOAD) once per Redis lifetime; that is not the steady state measured.
    let warm = Delivery::fresh();
    assert_eq!(sidecar.send(&warm).await.status, 200);

    let evals_before = calls(&redis, "evalsha");
    let sets_before = calls(&redis, "set");
    let monitor = Monitor::start(&redis);
    monitor.client_commands_until_marker(&redis, "m0").await;

    let d = Delivery::fresh();
    let a = sidecar.send(&d).await;
    assert_eq!(a.status, 200);
    assert!(!a.replayed());
    assert_eq!(
        path(&monitor, &redis, "m1").await,
        vec!["SET", "EVALSHA"],
        "a first delivery is the claim (the record's SET NX GET: one round trip) + the one-key completion script, and no log hash command"
    );

    let copy = sidecar.send(&d).await;
    assert!(copy.replayed());
    assert_eq!(
        path(&monitor, &redis, "m2").await,
        vec!["SET"],
        "a copy is one claim round trip (SET NX GET), no script"
    );

    // INFO commandstats agrees: one script call in all; three SETs, the two claims'
    // and the completion script's (commandstats counts commands run by scripts too).
    assert_eq!(calls(&redis, "evalsha") - evals_before, 1);
    assert_eq!(calls(&redis, "set") - sets_before, 3);
    // The copy's count landed too, off the path; the first deliveries wrote no log
    // hash (their records carry the log: record.rs).
    wait_until(
        std::time::Duration::from_secs(5),
        "the log writer's HINCRBY",
        || calls(&redis, "hincrby") >= 1,
    )
    .await;
    assert_eq!(calls(&redis, "hincrby"), 1, "only the copy's duplicate");
    assert_eq!(
        calls(&redis, "hset"),
        1,
        "only the copy's last_seen: no log hash field per first delivery"
    );
    assert_eq!(upstream.count(), 2);
}

/// The unsigned-key guard (GitHub: claimed under the body's hash, the delivery ID sent
/// upstream) costs nothing extra: still claim + complete, and one claim for a copy,
/// even when the copy carries a fresh delivery ID.
#[tokio::test]
async fn the_unsigned_key_guard_adds_no_round_trip() {
    use hmac::{Hmac, KeyInit, Mac};
    let redis = RedisServer::start_new();
    let upstream = Upstream::start().await;
    let route = RouteCfg {
        name: "gh".into(),
        path: "/gh".into(),
        provider: "github".into(),
        secrets: vec!["gh-secret".into()],
        tolerance: None,
        key: None,
        extra: String::new(),
    };
    let sidecar = SidecarBuilder::new(&upstream.url(), &redis.url())
        .route(route)
        .start()
        .await;
    let client = sidecar.client.clone();
    let url = sidecar.url("/gh");
    let send = |id: &str, body: &str| {
        let mut mac = Hmac::<sha2::Sha256>::new_from_slice(b"gh-secret").unwrap();
        mac.update(body.as_bytes());
        let sig = format!("sha256={}", hex::encode(mac.finalize().into_bytes()));
        let headers = vec![
            ("x-github-delivery".to_string(), id.to_string()),
            ("x-hub-signature-256".to_string(), sig),
        ];
        let (client, url, body) = (client.clone(), url.clone(), body.as_bytes().to_vec());
        async move { post(&client, &url, &headers, body).await }
    };
    assert_eq!(send("warm", "{\"warm\":1}").await.unwrap().status, 200);

    let monitor = Monitor::start(&redis);
    monitor.client_commands_until_marker(&redis, "g0").await;
    let body = format!("{{\"n\":\"{}\"}}", unique_id("gh"));
    let a = send("d-1", &body).await.unwrap();
    assert_eq!((a.status, a.replayed()), (200, false));
    assert_eq!(
        path(&monitor, &redis, "g1").await,
        vec!["SET", "EVALSHA"],
        "claim + complete"
    );
    let copy = send("d-2", &body).await.unwrap();
    assert!(copy.replayed());
    assert_eq!(
        path(&monitor, &redis, "g2").await,
        vec!["SET"],
        "a copy under a new delivery ID is one claim"
    );
    assert_eq!(upstream.count(), 2);
}
