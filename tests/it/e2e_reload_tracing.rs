//! End-to-end: a reload changes `[tracing]`'s `start_traces` and `sample_ratio` live
//! (docs/reload.md); the exporter stays as it started.

use std::time::Duration;

use crate::common::admin::{TOKEN, api};
use crate::common::otlp::{Answering, Collector};
use crate::common::*;
use crate::e2e_reload::rewrite;

fn builder(up: &Upstream, collector: &Collector, tracing: &str) -> SidecarBuilder {
    SidecarBuilder::new(&up.url(), "memory")
        .route(RouteCfg::standard(ROUTE, PATH))
        .env("IDEMGATE_ADMIN_TOKEN", TOKEN)
        .extra(&format!(
            "[tracing]\notlp_endpoint = \"{}\"\n{tracing}",
            collector.base_url()
        ))
}

/// Reloads `tracing` into the sidecar; the reload must apply.
async fn reload(sc: &Sidecar, up: &Upstream, collector: &Collector, tracing: &str) {
    rewrite(
        sc,
        &builder(up, collector, tracing).toml(sc.listen, sc.admin),
    );
    let r = api(sc, "POST", "/admin/reload", Some(TOKEN)).await;
    assert_eq!(r.status, 200, "{tracing}: {:?}", r.json);
}

/// The `traceparent` the application got for a fresh delivery without one.
async fn traceparent_of_a_fresh_delivery(sc: &Sidecar, up: &Upstream) -> Option<String> {
    assert_eq!(sc.send(&Delivery::fresh()).await.status, 200);
    up.last().header("traceparent")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_traces_and_sample_ratio_change_with_a_reload() {
    let up = Upstream::start().await;
    let collector = Collector::start(Answering::Ok).await;
    let sc = builder(&up, &collector, "").start().await;
    assert_eq!(traceparent_of_a_fresh_delivery(&sc, &up).await, None);

    reload(
        &sc,
        &up,
        &collector,
        "start_traces = true\nsample_ratio = 1.0",
    )
    .await;
    let started = traceparent_of_a_fresh_delivery(&sc, &up)
        .await
        .expect("a trace started after the reload");
    let trace = started.split('-').nth(1).unwrap().to_string();
    assert!(started.ends_with("-01"), "{started}");
    // Exported by the exporter built at start.
    collector
        .wait_trace(&trace, 1, Duration::from_secs(10))
        .await;

    reload(
        &sc,
        &up,
        &collector,
        "start_traces = true\nsample_ratio = 0.0",
    )
    .await;
    for _ in 0..5 {
        assert_eq!(
            traceparent_of_a_fresh_delivery(&sc, &up).await,
            None,
            "sample_ratio 0 samples no new trace"
        );
    }

    // The exporter is not a reload's to change.
    rewrite(
        &sc,
        &SidecarBuilder::new(&up.url(), "memory")
            .route(RouteCfg::standard(ROUTE, PATH))
            .toml(sc.listen, sc.admin),
    );
    let r = api(&sc, "POST", "/admin/reload", Some(TOKEN)).await;
    assert_eq!(r.status, 422, "{:?}", r.json);
    assert_eq!(r.json["error"], "restart_needed");
    let why = r.json["message"].as_str().unwrap();
    assert!(why.contains("tracing.otlp_endpoint"), "{why}");
}
