//! End-to-end: an HMAC secret shorter than 16 bytes is warned of (issue 34 item 10), by
//! `check-config` and in the log at start, naming the route and the secret's index and
//! never its value; it stays a warning. (Beside `e2e_providers`, already past the size
//! of one file.)

use std::time::Duration;

use crate::common::*;
use crate::e2e_providers::check_config;

/// A secret shorter than 16 bytes can be guessed offline from one captured delivery:
/// `check-config` warns naming the route and the secret's index, never its value, and
/// still passes (providers whose users chose their own secrets keep working).
#[test]
fn check_config_warns_of_a_short_hmac_secret_by_route_and_index() {
    let toml = "[store]\nurl = \"memory\"\n\n\
        [[route]]\nname = \"long\"\npath = \"/long\"\nprovider = \"github\"\nsecrets = [\"a-secret-of-24-bytes-xyz\"]\n\n\
        [[route]]\nname = \"weak\"\npath = \"/weak\"\nprovider = \"shopify\"\nsecrets = [\"a-secret-of-24-bytes-abc\", \"qz7tok\"]\n\n\
        [[route]]\nname = \"sw\"\npath = \"/sw\"\nprovider = \"standard\"\nsecrets = [\"whsec_c2hvcnRrZXk=\"]\n";
    let (code, stderr) = check_config(toml, &[]);
    assert_eq!(code, 0, "{stderr}");
    let warnings: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("warning:"))
        .collect();
    assert_eq!(warnings.len(), 2, "{stderr}");
    assert!(
        warnings[0].contains("route `weak`") && warnings[0].contains("secrets[1]"),
        "{stderr}"
    );
    // The Standard Webhooks key is counted decoded: `shortkey` is 8 bytes.
    assert!(
        warnings[1].contains("route `sw`") && warnings[1].contains("secrets[0]"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("qz7tok"),
        "the secret's value leaked: {stderr}"
    );
    assert!(
        !stderr.contains("c2hvcnRrZXk"),
        "the secret's value leaked: {stderr}"
    );
    assert!(stderr.contains("configuration is valid"), "{stderr}");
}

/// The same warning is logged when the sidecar starts, and it serves.
#[tokio::test]
async fn a_short_hmac_secret_is_warned_of_in_the_log_at_start() {
    let up = Upstream::start().await;
    let sc = SidecarBuilder::new(&up.url(), "memory")
        .route(RouteCfg::standard(ROUTE, PATH))
        .route(RouteCfg::standard("weak", "/weak").secrets(&[
            "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oX",
            "whsec_c2hvcnRrZXk=",
        ]))
        .start()
        .await;
    // The log is written by a background thread: wait for the line.
    let warned = |l: &str| l.contains("WARN") && l.contains("secrets[1]");
    wait_until(
        Duration::from_secs(10),
        "the short secret's warning",
        || sc.stderr().lines().any(warned),
    )
    .await;
    let log = sc.stderr();
    let line = log
        .lines()
        .find(|l| warned(l))
        .unwrap_or_else(|| panic!("no warning of the short secret in\n{log}"));
    assert!(line.contains("weak"), "{line}");
    assert!(
        !log.contains("c2hvcnRrZXk"),
        "the secret's value leaked: {log}"
    );
    assert_eq!(sc.send(&Delivery::fresh()).await.status, 200);
}
