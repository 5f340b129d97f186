//! The `file:` store across a SIGKILL: nothing answered 2xx before the kill is
//! forwarded again after a restart on the same directory, no acknowledged async
//! delivery is lost, and the directory opens cleanly (also when the kill lands while
//! the writer commits, as it does under a storm: every commit is in progress most of
//! the time). One sidecar per directory; `check-config` refuses a directory it cannot
//! lock or write. (The memory store's documented opposite, a restart forgets:
//! `e2e_memory_store.rs`.)

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::*;

const SEC: Duration = Duration::from_secs(1);
const ASYNC_ROUTE: &str = "wha";
const ASYNC_PATH: &str = "/webhooks/wha";
/// Senders in the storm, and how many answers it waits for before the kill.
const SENDERS: usize = 8;
const ANSWERED_BEFORE_KILL: usize = 150;

fn file_sidecar(up: &Upstream, dir: &Path) -> SidecarBuilder {
    let mut async_route = RouteCfg::standard(ASYNC_ROUTE, ASYNC_PATH);
    // Paced, so acknowledged deliveries wait in the queue when the kill comes.
    async_route.extra = "mode = \"async\"\nbackoff = \"50ms\"\nrate = 40.0\n".into();
    SidecarBuilder::new(&up.url(), &format!("file:{}", dir.display()))
        .route(RouteCfg::standard(ROUTE, PATH))
        .route(async_route)
        // A claim in hand at the kill lapses soon, so its copy is forwarded then.
        .lease("2s")
}

/// How often the upstream saw each delivery ID.
fn forwarded(up: &Upstream) -> HashMap<String, usize> {
    let mut m = HashMap::new();
    for r in up.requests() {
        let key = r.header("idempotency-key").unwrap_or_default();
        let id = key.rsplit(':').next().unwrap_or_default().to_string();
        *m.entry(id).or_insert(0) += 1;
    }
    m
}

/// A delivery of the storm and its answer before the kill (`None`: none came).
#[derive(Clone)]
struct Sent {
    delivery: Delivery,
    asynchronous: bool,
    status: Option<u16>,
}

/// Sends fresh deliveries (every other one async) from `SENDERS` tasks until `stop`,
/// recording each and its answer; a send cut by the kill records no answer.
fn storm(
    sc: &Sidecar,
    log: Arc<Mutex<Vec<Sent>>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..SENDERS)
        .map(|n| {
            let (client, base) = (sc.client.clone(), sc.url(""));
            let (log, stop) = (log.clone(), stop.clone());
            tokio::spawn(async move {
                // Bounded: the kill comes long before.
                for i in 0..2_000 {
                    if stop.load(std::sync::atomic::Ordering::Relaxed) {
                        return;
                    }
                    let asynchronous = (n + i) % 2 == 0;
                    let path = if asynchronous { ASYNC_PATH } else { PATH };
                    let d = Delivery::fresh().path(path);
                    let idx = {
                        let mut l = log.lock().unwrap();
                        l.push(Sent {
                            delivery: d.clone(),
                            asynchronous,
                            status: None,
                        });
                        l.len() - 1
                    };
                    let answer = post(
                        &client,
                        &format!("{base}{path}"),
                        &d.headers(),
                        d.body.clone(),
                    )
                    .await;
                    match answer {
                        Ok(a) => log.lock().unwrap()[idx].status = Some(a.status),
                        Err(_) => return,
                    }
                }
            })
        })
        .collect()
}

fn answered(log: &[Sent]) -> usize {
    log.iter().filter(|s| s.status.is_some()).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkill_mid_storm_loses_no_answered_or_acknowledged_delivery() {
    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start().await;
    let builder = file_sidecar(&up, dir.path());
    let mut all: Vec<Sent> = Vec::new();
    // Twice: each kill lands mid-storm, with the writer committing.
    for round in 0..2 {
        let mut sc = builder.clone().start().await;
        assert!(sc.stderr().contains("file store opened"), "{}", sc.stderr());
        let log = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let senders = storm(&sc, log.clone(), stop.clone());
        wait_until(30 * SEC, "the storm's first answers", || {
            answered(&log.lock().unwrap()) >= ANSWERED_BEFORE_KILL
        })
        .await;
        sc.kill9();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for s in senders {
            s.await.unwrap();
        }
        let log = log.lock().unwrap().clone();
        eprintln!(
            "round {round}: {} sent, {} answered before the kill",
            log.len(),
            answered(&log)
        );
        all.extend(log);
    }
    let at_kill = forwarded(&up);

    // Restarted on the same directory: it opens, and every delivery is sent again.
    let sc = builder.clone().start().await;
    assert!(sc.stderr().contains("file store opened"), "{}", sc.stderr());
    for s in &all {
        let again = sc.send(&s.delivery).await;
        if s.status.is_some_and(|st| (200..300).contains(&st)) {
            assert!(
                (200..300).contains(&again.status),
                "{} answered {:?} before the kill, {} after",
                s.delivery.id,
                s.status,
                again.status
            );
        }
    }
    // Every async delivery acknowledged before the kill reaches the upstream.
    let acked: Vec<&Sent> = all
        .iter()
        .filter(|s| s.asynchronous && s.status == Some(200))
        .collect();
    assert!(!acked.is_empty());
    wait_until(
        60 * SEC,
        "every acknowledged async delivery forwarded",
        || {
            let seen = forwarded(&up);
            acked.iter().all(|s| seen.contains_key(&s.delivery.id))
        },
    )
    .await;
    // No sync delivery answered 2xx before the kill was forwarded again.
    let after = forwarded(&up);
    let mut answered_sync = 0;
    for s in all.iter().filter(|s| !s.asynchronous) {
        if s.status.is_some_and(|st| (200..300).contains(&st)) {
            answered_sync += 1;
            let id = &s.delivery.id;
            assert_eq!(
                after.get(id),
                at_kill.get(id),
                "{id} was answered {:?} before the kill and forwarded again after it",
                s.status
            );
            assert_eq!(at_kill.get(id), Some(&1), "{id}");
        }
    }
    assert!(answered_sync > 0);
}

#[tokio::test]
async fn a_second_sidecar_on_the_same_directory_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start().await;
    let builder = file_sidecar(&up, dir.path());
    let first = builder.clone().start().await;
    let cfg = tempfile::tempdir().unwrap();
    let listen = std::net::SocketAddr::from(([127, 0, 0, 1], free_port()));
    let admin = std::net::SocketAddr::from(([127, 0, 0, 1], free_port()));
    let path = cfg.path().join("idemgate.toml");
    std::fs::write(&path, builder.toml(listen, admin)).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_idemgate"))
        .args(["run", "--config"])
        .arg(&path)
        .env("IDEMGATE_LOG_FORMAT", "text")
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{shown}");
    assert!(
        shown.contains("another process holds its lock")
            && shown.contains(&dir.path().display().to_string()),
        "{shown}"
    );
    // The first one is untouched by the attempt.
    assert_eq!(first.send(&Delivery::fresh()).await.status, 200);
}

fn check_config(toml: &str) -> (bool, String) {
    let cfg = tempfile::tempdir().unwrap();
    let path = cfg.path().join("idemgate.toml");
    std::fs::write(&path, toml).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_idemgate"))
        .args(["check-config", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn check_config_refuses_a_directory_it_cannot_lock_or_write() {
    let up = Upstream::start().await;
    let (l, a) = (free_port(), free_port());
    let any = std::net::SocketAddr::from(([127, 0, 0, 1], l));
    let admin = std::net::SocketAddr::from(([127, 0, 0, 1], a));
    let free = tempfile::tempdir().unwrap();
    let (ok, shown) = check_config(&file_sidecar(&up, free.path()).toml(any, admin));
    assert!(ok, "{shown}");

    // Under a regular file, nothing can be created (even as root).
    let plain = free.path().join("plain");
    std::fs::write(&plain, b"x").unwrap();
    let (ok, shown) = check_config(&file_sidecar(&up, &plain.join("store")).toml(any, admin));
    assert!(!ok, "{shown}");
    assert!(
        shown.contains("store.url") && shown.contains("cannot create it"),
        "{shown}"
    );

    // Writable by others (issue 34 item 9): refused, with the reason.
    let shared = free.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    let open_to_all: std::fs::Permissions = std::os::unix::fs::PermissionsExt::from_mode(0o777);
    std::fs::set_permissions(&shared, open_to_all).unwrap();
    let (ok, shown) = check_config(&file_sidecar(&up, &shared).toml(any, admin));
    assert!(!ok, "{shown}");
    assert!(shown.contains("writable by group or others"), "{shown}");

    // Held by a running sidecar.
    let held = tempfile::tempdir().unwrap();
    let _sc = file_sidecar(&up, held.path()).start().await;
    let (ok, shown) = check_config(&file_sidecar(&up, held.path()).toml(any, admin));
    assert!(!ok, "{shown}");
    assert!(shown.contains("another process holds its lock"), "{shown}");
}
