//! The delivery log adds no round trip a delivery waits for: with the admin API on and
//! `keep_payload = true`, a first delivery is still claim + complete, a copy one claim,
//! and a failed one claim + release — counted with `MONITOR`, as in e2e_roundtrips.rs
//! (both use `common::monitor::Monitor`). The log's own writes are the log writer's
//! pipeline, off the delivery's path.

use crate::common::admin;
use crate::common::monitor::{Monitor, path_and_log};
use crate::common::*;

#[tokio::test]
async fn the_log_and_a_kept_request_ride_in_the_same_scripts() {
    let redis = RedisServer::start_new();
    let upstream = Upstream::start().await;
    let sidecar = admin::builder(&upstream, &redis).start().await;
    // Warm up: each script is loaded once per Redis lifetime (NOSCRIPT → EVAL).
    assert_eq!(sidecar.send(&Delivery::fresh()).await.status, 200);
    upstream.push_modes(vec![Mode::Status(500)]);
    assert_eq!(sidecar.send(&Delivery::fresh()).await.status, 500);

    let monitor = Monitor::start(&redis);
    monitor.client_commands_until_marker(&redis, "m0").await;
    let d = Delivery::fresh();
    assert_eq!(sidecar.send(&d).await.status, 200);
    let path = |cmds| path_and_log(cmds).0;
    let first = path(monitor.client_commands_until_marker(&redis, "m1").await);
    assert_eq!(first, vec!["SET", "EVALSHA"], "claim + complete");
    assert!(sidecar.send(&d).await.replayed());
    let dup = path(monitor.client_commands_until_marker(&redis, "m2").await);
    assert_eq!(dup, vec!["SET"], "a copy is one claim");
    upstream.push_modes(vec![Mode::Status(500)]);
    assert_eq!(sidecar.send(&Delivery::fresh()).await.status, 500);
    let failed = path(monitor.client_commands_until_marker(&redis, "m3").await);
    assert_eq!(failed, vec!["SET", "EVALSHA"], "claim + release");

    // …and the log and the index were written, by the log writer and the scripts.
    let list = admin::api(&sidecar, "GET", "/admin/deliveries", Some(admin::TOKEN)).await;
    assert_eq!(list.json["deliveries"].as_array().unwrap().len(), 4);
    let e = admin::api(
        &sidecar,
        "GET",
        &admin::delivery_path(ROUTE, &d.id),
        Some(admin::TOKEN),
    )
    .await;
    assert_eq!(e.json["duplicates"], 1);
    assert_eq!(e.json["replayable"], true);
}
