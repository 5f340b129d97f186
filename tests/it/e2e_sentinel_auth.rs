//! End-to-end on a Sentinel-managed master with passwords, as managed offerings run it:
//! `requirepass` (and `masterauth`) on the Redis nodes, a different `requirepass` on the
//! Sentinels, the URL carrying both (`redis+sentinel://:<redis>@…?sentinel_password=…`).
//!
//! - deliveries are forwarded once and replayed, and `/readyz` is green;
//! - a planned failover (`SENTINEL FAILOVER`) is followed through the Sentinels'
//!   announcements (the subscription authenticates), and deliveries keep working;
//! - the storm across a planned failover forwards no 2xx-answered delivery twice;
//! - a `+` in `sentinel_password` is a `+`, as in the URL's own password (generated
//!   base64 passwords hold them);
//! - Sentinels that refuse the credentials are named in the log, with the fix.

use std::time::{Duration, Instant};

use crate::common::cluster::{MASTER_NAME, SentinelAuth, SentinelSet, poll};
use crate::common::*;
use crate::e2e_cluster::storm_across_a_planned_failover_of;

/// Distinct passwords for the Redis nodes and the Sentinels, with characters a URL
/// must percent-encode (managed offerings generate such passwords).
fn auth() -> SentinelAuth {
    SentinelAuth {
        redis: Some("r3d!s/p@ss:w#rd".to_string()),
        sentinel: Some("s3nt&n=l+p@ss".to_string()),
    }
}

/// The log line the store writes for each announcement it received from a Sentinel.
const ANNOUNCEMENT: &str = "Sentinel announcement";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_with_passwords_delivers_and_follows_a_planned_failover() {
    let set = SentinelSet::start_with(auth());
    // Without the password nothing answers: the passwords are really required.
    assert!(
        crate::common::cluster::cli(set.master.port, &["SET", "k", "v"]).contains("NOAUTH"),
        "the master accepts commands without its password"
    );
    assert!(
        crate::common::cluster::cli(set.sentinels[0].port, &["SENTINEL", "masters"])
            .contains("NOAUTH"),
        "the Sentinel accepts commands without its password"
    );
    let up = Upstream::start().await;
    let sc = SidecarBuilder::new(&up.url(), &set.url()).start().await;
    sc.wait_readyz(200, Duration::from_secs(10)).await;
    let before = Delivery::fresh();
    let a = sc.send(&before).await;
    assert!(a.status == 200 && !a.replayed(), "{a:?}");
    let a = sc.send(&before).await;
    assert!(a.status == 200 && a.replayed(), "{a:?}");
    poll(Duration::from_secs(10), "the replica to catch up", || {
        let off = |n: &crate::common::cluster::Node| n.info("replication", "master_repl_offset");
        off(&set.master).is_some() && off(&set.master) == off(&set.replica)
    });

    let (old, new) = (set.master.port, set.replica.port);
    assert_eq!(
        set.sentinels[0].cli(&["SENTINEL", "FAILOVER", MASTER_NAME]),
        "OK"
    );
    // Deliveries go on through the switch (they wait while it is under way).
    let t = Instant::now();
    let mut unavailable = 0;
    while set.reported_master() != Some(new) || !set.master.cli(&["ROLE"]).starts_with("slave") {
        let a = sc.send(&Delivery::fresh()).await;
        match a.status {
            200 => {}
            503 => unavailable += 1,
            other => panic!("unexpected answer during the failover: {other} {a:?}"),
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the failover did not complete within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The store heard of the failover from the Sentinels themselves: its subscription
    // authenticated (without it, only a READONLY answer would tell it, after writes to
    // the demoted master were lost).
    poll(
        Duration::from_secs(10),
        "the sidecar to log a Sentinel announcement",
        || sc.stderr().contains(ANNOUNCEMENT),
    );
    assert!(!sc.stderr().contains("cannot subscribe"), "{}", sc.stderr());
    let after = Delivery::fresh();
    let a = sc.send(&after).await;
    assert!(a.status == 200 && !a.replayed(), "{a:?}");
    let a = sc.send(&before).await;
    assert!(a.status == 200 && a.replayed(), "{a:?}");
    up.assert_count_stays(up.requests().len(), Duration::from_millis(200))
        .await;
    for d in [&before, &after] {
        let forwarded = up
            .requests()
            .iter()
            .filter(|r| r.header("webhook-id").as_deref() == Some(d.id.as_str()))
            .count();
        assert_eq!(forwarded, 1, "{} forwarded {forwarded} times", d.id);
    }
    sc.wait_readyz(200, Duration::from_secs(5)).await;
    let (log, pw) = (sc.stderr(), auth());
    for p in [pw.redis, pw.sentinel].into_iter().flatten() {
        assert!(!log.contains(&p), "a password is in the log:\n{log}");
    }
    eprintln!(
        "sentinel with passwords: {old} demoted, {new} promoted, followed after {:?} ({unavailable} x 503)",
        t.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn planned_sentinel_failover_with_passwords_lets_no_copy_through() {
    let _heavy = crate::common::exclusive().await;
    let r = storm_across_a_planned_failover_of(SentinelSet::start_with(auth()), 0).await;
    assert_eq!(r.slipped, 0, "copies forwarded again: {r:?}");
    assert!(
        r.after_switch > 0,
        "the storm ended before the switch: {r:?}"
    );
    assert_eq!(r.resent_replayed, r.answered_2xx, "{r:?}");
}

/// Generated passwords (base64) hold `+`, and operators paste them as they are: the
/// URL's password keeps it as `+`, and so must `sentinel_password` (a query option,
/// but not a form: `+` is not a space there).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plus_in_the_sentinel_password_is_a_plus() {
    let set = SentinelSet::start_with(SentinelAuth {
        redis: Some("r3d+s/base64=".to_string()),
        sentinel: Some("s3nt+nel+base64==".to_string()),
    });
    let url = set.url().replace("%2B", "+").replace("%3D", "=");
    assert!(url.contains("sentinel_password=s3nt+nel+base64=="), "{url}");
    let up = Upstream::start().await;
    let sc = SidecarBuilder::new(&up.url(), &url).start().await;
    let d = Delivery::fresh();
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let a = sc.send(&d).await;
        if a.status == 200 {
            break;
        }
        assert_eq!(a.status, 503, "{a:?}");
        assert!(
            Instant::now() < end,
            "deliveries still get 503 with `+` in sentinel_password:\n{}",
            sc.stderr()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    sc.wait_readyz(200, Duration::from_secs(5)).await;
}

/// The Redis servers' password alone, to Sentinels that have one of their own: every
/// delivery gets 503, and the log must say why and how to fix it (not stay silent).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinels_refusing_the_credentials_are_named_in_the_log() {
    let set = SentinelSet::start_with(auth());
    let url = set.url();
    let (without, _) = url.split_once('?').expect("a sentinel_password option");
    let up = Upstream::start().await;
    let sc = SidecarBuilder::new(&up.url(), without).start().await;
    let a = sc.send(&Delivery::fresh()).await;
    assert_eq!(a.status, 503, "{a:?}");
    poll(
        Duration::from_secs(10),
        "a log line naming sentinel_password",
        || {
            sc.stderr()
                .lines()
                .any(|l| l.contains("WARN") && l.contains("sentinel_password"))
        },
    );
    let log = sc.stderr();
    let hints: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("sentinel_password"))
        .collect();
    assert!(hints.len() <= 2, "the hint is repeated:\n{log}");
    eprintln!("the hint: {}", hints[0]);
    for p in [auth().redis, auth().sentinel].into_iter().flatten() {
        assert!(!log.contains(&p), "a password is in the log:\n{log}");
    }
    assert_eq!(up.requests().len(), 0);
}
