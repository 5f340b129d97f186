//! End-to-end: a reload changes the log filter (`log`, docs/reload.md); an invalid
//! one is refused naming `log`; while `IDEMGATE_LOG` holds it, the file's change is
//! said in the reload's log line and not applied.

use std::time::Duration;

use crate::common::admin::{TOKEN, api};
use crate::common::*;
use crate::e2e_reload::{eventually, rewrite};

/// The sidecar with `log` set in its file; `env_log` is `IDEMGATE_LOG` ("" for none).
fn builder(upstream: &Upstream, log: &str, env_log: &str) -> SidecarBuilder {
    SidecarBuilder::new(&upstream.url(), "memory")
        .route(RouteCfg::standard(ROUTE, PATH))
        .top("log", log)
        .env("IDEMGATE_LOG", env_log)
        .env("IDEMGATE_ADMIN_TOKEN", TOKEN)
}

fn debug_lines(sc: &Sidecar) -> usize {
    sc.stderr()
        .lines()
        .filter(|l| l.contains(" DEBUG "))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_from_info_to_debug_makes_debug_lines_appear() {
    let upstream = Upstream::start().await;
    let sc = builder(&upstream, "info", "").start().await;
    assert_eq!(sc.send(&Delivery::fresh()).await.status, 200);

    // Invalid: refused, naming `log`; the level in force stays.
    rewrite(
        &sc,
        &builder(&upstream, "idemgate=loud", "").toml(sc.listen, sc.admin),
    );
    let r = api(&sc, "POST", "/admin/reload", Some(TOKEN)).await;
    assert_eq!(r.status, 422, "{:?}", r.json);
    let why = r.json["message"].as_str().unwrap();
    assert!(why.contains("log: "), "the field is named: {why}");
    assert_eq!(debug_lines(&sc), 0, "{}", sc.stderr());

    rewrite(
        &sc,
        &builder(&upstream, "debug", "").toml(sc.listen, sc.admin),
    );
    let r = api(&sc, "POST", "/admin/reload", Some(TOKEN)).await;
    assert_eq!(r.status, 200, "{:?}", r.json);
    eventually(
        Duration::from_secs(20),
        "a debug line after the reload to debug",
        || async {
            sc.stderr()
                .lines()
                .any(|l| l.contains(" DEBUG ") && l.contains("configuration in force"))
        },
    )
    .await;
    assert!(
        sc.stderr()
            .lines()
            .any(|l| l.contains("configuration reloaded") && l.contains("log=debug")),
        "{}",
        sc.stderr()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_idemgate_log_holds_the_level_a_reload_says_so_and_keeps_it() {
    let upstream = Upstream::start().await;
    let sc = builder(&upstream, "info", "info").start().await;
    rewrite(
        &sc,
        &builder(&upstream, "debug", "info").toml(sc.listen, sc.admin),
    );
    let r = api(&sc, "POST", "/admin/reload", Some(TOKEN)).await;
    assert_eq!(r.status, 200, "{:?}", r.json);
    eventually(
        Duration::from_secs(20),
        "the reload's line saying IDEMGATE_LOG holds the level",
        || async {
            sc.stderr().lines().any(|l| {
                l.contains("configuration reloaded") && l.contains("IDEMGATE_LOG holds it")
            })
        },
    )
    .await;
    assert_eq!(debug_lines(&sc), 0, "{}", sc.stderr());
}
