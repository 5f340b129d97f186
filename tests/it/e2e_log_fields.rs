//! A delivery key is client-controlled text: every log line writes it one way
//! (`DeliveryKey::logged`, a string field), which the text format quotes and escapes, so
//! a signed delivery id such as `evt 1 forged=yes` cannot add a `forged` field to a
//! line of a queue worker or of an operator's action, as it cannot to the gate's.

use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::admin::*;
use crate::common::*;

/// A key that would forge a `forged=yes` field if written bare.
const FORGING: &str = "evt 1 forged=yes";

/// The log lines of `log` holding `needle`, ANSI colours removed.
fn lines_with(log: &str, needle: &str) -> Vec<String> {
    crate::common::load::strip_ansi(log)
        .lines()
        .filter(|l| l.contains(needle))
        .map(str::to_string)
        .collect()
}

/// Fails unless the line writes the key quoted and holds no field the key forged.
fn assert_key_quoted(line: &str) {
    let quoted = format!("key={FORGING:?}");
    assert!(line.contains(&quoted), "the key is not quoted: {line}");
    assert!(
        !line.replace(&quoted, "").contains("forged="),
        "the key forged a field: {line}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_worker_writes_the_key_quoted() {
    let redis = RedisServer::start_new();
    let upstream = Upstream::start().await;
    let mut route = RouteCfg::standard(ROUTE, PATH);
    route.extra = "mode = \"async\"\n".to_string();
    let sc = SidecarBuilder::new(&upstream.url(), &redis.url())
        .route(route)
        .start()
        .await;
    let d = Delivery::new(FORGING, br#"{"type":"t"}"#.to_vec());
    assert_eq!(sc.send(&d).await.status, 200);
    upstream.wait_for_count(1, Duration::from_secs(10)).await;
    let end = std::time::Instant::now() + Duration::from_secs(10);
    let line = loop {
        if let Some(l) = lines_with(&sc.stderr(), "queued delivery completed").pop() {
            break l;
        }
        assert!(std::time::Instant::now() < end, "{}", sc.stderr());
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_key_quoted(&line);
}

/// An operator's replay from the command line whose claim is lost while the
/// application holds the request (its lock deleted): the warning names the key quoted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_action_writes_the_key_quoted() {
    let redis = RedisServer::start_new();
    let upstream = Upstream::start().await;
    let sc = builder(&upstream, &redis)
        .lease("2s")
        .top("upstream_timeout", "3s")
        .start()
        .await;
    let cli = Cli::new(&sc);
    let d = Delivery::new(FORGING, br#"{"type":"t"}"#.to_vec());
    assert_eq!(sc.send(&d).await.status, 200);
    upstream.push_modes(vec![Mode::Hang]);
    let replay = Command::new(env!("CARGO_BIN_EXE_idemgate"))
        .args(["deliveries", "replay", ROUTE, FORGING, "--config"])
        .arg(cli.dir.path().join("idemgate.toml"))
        .env_remove("IDEMGATE_STORE_URL")
        .env("OPS_TOKEN", OPS_TOKEN)
        .env("USER", "tester")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    upstream.wait_for_count(2, Duration::from_secs(10)).await;
    let locks: Vec<String> = redis
        .keys()
        .into_iter()
        .filter(|k| k.ends_with(":lock"))
        .collect();
    assert_eq!(locks.len(), 1, "{locks:?}");
    redis.cli(&["DEL", &locks[0]]);
    let out = tokio::task::spawn_blocking(move || replay.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    let lost = lines_with(&log, "lease lost while a replay ran");
    assert!(!lost.is_empty(), "no lease-lost line: {log}");
    assert_key_quoted(&lost[0]);
    let audit = lines_with(&log, "admin action");
    assert!(!audit.is_empty(), "no audit line: {log}");
    assert_key_quoted(&audit[0]);
}

/// The one way, held in the source: no tracing field `key` is written with `%` or `?`
/// (Display or Debug of the raw key), which is how a bare key got into a line.
#[test]
fn no_log_line_writes_a_key_bare() {
    fn walk(dir: &std::path::Path, found: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, found);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let text = std::fs::read_to_string(&p).unwrap();
                for (n, l) in text.lines().enumerate() {
                    if l.contains("key = %") || l.contains("key = ?") {
                        found.push(format!("{}:{}: {}", p.display(), n + 1, l.trim()));
                    }
                }
            }
        }
    }
    let mut found = Vec::new();
    walk(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut found,
    );
    assert!(
        found.is_empty(),
        "write a key as `key = key.logged()`:\n{}",
        found.join("\n")
    );
}
