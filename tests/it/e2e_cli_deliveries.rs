//! `idemgate deliveries list|show|forget|replay` : the binary run against a
//! real redis-server that a running sidecar filled, with the sidecar's own config.

use std::process::Command;
use std::time::Duration;

use crate::common::admin::*;
use crate::common::*;

// Multi-threaded: the CLI runs as a blocking child process while the recording
// upstream (a task of this runtime) must keep answering.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_show_forget_and_replay_from_the_command_line() {
    let redis = RedisServer::start_new();
    let upstream = Upstream::start().await;
    let sc = builder(&upstream, &redis).start().await;
    let cli = Cli::new(&sc);

    let ok = Delivery::fresh();
    assert_eq!(sc.send(&ok).await.status, 200);
    assert!(sc.send(&ok).await.replayed());
    upstream.push_modes(vec![Mode::Status(502)]);
    let failed = Delivery::fresh();
    assert_eq!(sc.send(&failed).await.status, 502);

    // list: a table by default, JSON with --json
    let table = cli.ok(&["deliveries", "list"]);
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].starts_with("ROUTE"), "{table}");
    assert!(
        lines[1].contains(&failed.id) && lines[1].contains("released"),
        "{table}"
    );
    assert!(
        lines[2].contains(&ok.id) && lines[2].contains("completed"),
        "{table}"
    );
    let j = cli.json(&["deliveries", "list", "--status", "completed"]);
    let items = j["deliveries"].as_array().unwrap();
    assert_eq!(items.len(), 1);
    assert_eq!(items[0]["key"], ok.id.as_str());
    let page = cli.json(&["deliveries", "list", "--limit", "1"]);
    let cursor = page["next_cursor"].as_str().unwrap().to_string();
    let next = cli.json(&["deliveries", "list", "--limit", "1", "--cursor", &cursor]);
    assert_eq!(next["deliveries"][0]["key"], ok.id.as_str());
    assert!(next["next_cursor"].is_null());
    // The search words, as flags.
    let keys = |args: &[&str]| -> Vec<String> {
        let j = cli.json(&[&["deliveries", "list"], args].concat());
        assert_eq!(j["partial"], false, "{j}");
        j["deliveries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["key"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(keys(&["--upstream-status", "5xx"]), [failed.id.as_str()]);
    assert_eq!(keys(&["--duplicates"]), [ok.id.as_str()]);
    assert_eq!(keys(&["--key-prefix", &ok.id]), [ok.id.as_str()]);
    assert_eq!(keys(&["--kept"]).len(), 2, "this route keeps every request");
    let first = cli.json(&["deliveries", "show", ROUTE, &failed.id])["first_seen"]
        .as_u64()
        .unwrap();
    assert_eq!(keys(&["--until", &first.to_string()]), [ok.id.as_str()]);
    assert_eq!(keys(&["--since", &first.to_string()]), [failed.id.as_str()]);
    let bad = cli.run(&["deliveries", "list", "--since", "yesterday"]);
    assert!(!bad.status.success());
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(stderr.contains("--since: `yesterday`"), "{stderr}");

    // show
    let text = cli.ok(&["deliveries", "show", ROUTE, &ok.id]);
    assert!(
        text.contains("completed") && text.contains("duplicates         1"),
        "{text}"
    );
    let j = cli.json(&["deliveries", "show", ROUTE, &failed.id]);
    assert_eq!(j["status"], "released");
    assert_eq!(j["upstream_status"], 502);
    assert!(
        !cli.run(&["deliveries", "show", ROUTE, "never-seen"])
            .status
            .success()
    );

    // replay: the configured upstream receives the kept request under the claim
    let before = upstream.count();
    let j = cli.json(&["deliveries", "replay", ROUTE, &failed.id]);
    assert_eq!(j["upstream_status"], 200, "{j}");
    assert_eq!(j["recorded"], true);
    assert_eq!(upstream.count(), before + 1);
    assert_eq!(upstream.last().body, failed.body);
    let j = cli.json(&["deliveries", "show", ROUTE, &failed.id]);
    assert_eq!(j["status"], "completed");
    assert_eq!(j["outcome"], "operator_replay");
    // …so the provider's next copy is answered from the store
    let copy = sc.send(&failed).await;
    assert!(copy.replayed());
    assert_eq!(upstream.count(), before + 1);

    // forget: the next copy is forwarded
    let out = cli.run(&["deliveries", "forget", ROUTE, &ok.id]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("forgotten"));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("who=\"cli:tester\""),
        "the action is logged with who: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !cli.run(&["deliveries", "forget", ROUTE, &ok.id])
            .status
            .success()
    );
    let again = sc.send(&ok).await;
    assert!(!again.replayed());
    assert_eq!(upstream.count(), before + 2);
}

/// A replay whose CLI is killed while the application holds the request never settles:
/// once its lease lapses the key is completed again with its old answer, and the
/// provider's next copy is answered from the store, not forwarded a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_replay_leaves_the_completed_answer_standing() {
    let redis = RedisServer::start_new();
    let upstream = Upstream::start().await;
    let sc = builder(&upstream, &redis).lease("2s").start().await;
    let cli = Cli::new(&sc);
    let ok = Delivery::fresh();
    assert_eq!(sc.send(&ok).await.status, 200);
    upstream.push_modes(vec![Mode::Hang]);
    let mut replay = Command::new(env!("CARGO_BIN_EXE_idemgate"))
        .args(["deliveries", "replay", ROUTE, &ok.id, "--config"])
        .arg(cli.dir.path().join("idemgate.toml"))
        .env_remove("IDEMGATE_STORE_URL")
        .env("OPS_TOKEN", OPS_TOKEN)
        .env("USER", "tester")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    upstream.wait_for_count(2, Duration::from_secs(10)).await;
    replay.kill().unwrap();
    replay.wait().unwrap();
    let end = std::time::Instant::now() + Duration::from_secs(10);
    while cli.json(&["deliveries", "show", ROUTE, &ok.id])["claimed"] == true {
        assert!(
            std::time::Instant::now() < end,
            "the replay's claim never lapsed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let copy = sc.send(&ok).await;
    assert_eq!(copy.status, 200);
    assert!(copy.replayed(), "the copy was forwarded again");
    upstream
        .assert_count_stays(2, Duration::from_millis(300))
        .await;
    assert_eq!(
        cli.json(&["deliveries", "show", ROUTE, &ok.id])["status"],
        "completed"
    );
}

#[tokio::test]
async fn the_cli_refuses_the_memory_store() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    std::fs::write(&path, "").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_idemgate"))
        .args(["deliveries", "list", "--config"])
        .arg(&path)
        .env_remove("IDEMGATE_STORE_URL")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("in-memory store"));
}

/// `min_replicas_ack` binds an operator's replay from the command line as it binds a
/// delivery and the admin API's replay: against one redis-server (`WAIT` can never be
/// satisfied) the CLI's replay claim is given up before the command ends, the command
/// fails, the application is not called again and the key stays completed with its old
/// answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cli_replay_needs_the_replicas_a_delivery_needs() {
    let redis = RedisServer::start_new();
    let upstream = Upstream::start().await;
    let sc = builder(&upstream, &redis).start().await;
    let acked = builder(&upstream, &redis)
        .store_raw("min_replicas_ack", "1")
        .store_opt("replicas_ack_timeout", "50ms")
        .start()
        .await;
    let cli = Cli::new(&acked);
    let d = Delivery::fresh();
    assert_eq!(sc.send(&d).await.status, 200);
    let out = cli.run(&["deliveries", "replay", ROUTE, &d.id, "--json"]);
    assert!(
        !out.status.success(),
        "the replay succeeded without a replica's confirmation: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(upstream.count(), 1, "the application was called again");
    // Given up before the command ended (not by a background task that dies with
    // the command's runtime, leaving the key locked until the lease ends).
    let j = cli.json(&["deliveries", "show", ROUTE, &d.id]);
    assert_eq!(j["claimed"], false, "the replay's claim stayed: {j}");
    assert_eq!(j["status"], "completed", "{j}");
    assert_ne!(j["outcome"], "operator_replay", "{j}");
    assert!(sc.send(&d).await.replayed(), "the copy was forwarded again");
    assert_eq!(upstream.count(), 1);
}
