//! End-to-end: OpenTelemetry tracing (docs/tracing.md). Real sidecar processes on a
//! real redis-server, a recording application and a real OTLP/HTTP receiver that
//! decodes with the official protobuf definitions. What is asserted is what the
//! application and the collector see: the provider's trace continued, the sidecar's
//! spans between, and nothing changed for the provider when the collector fails.

use std::time::Duration;

use crate::common::otlp::{Answering, Collector, Received};
use crate::common::*;

const SEC: Duration = Duration::from_secs(1);
/// The provider's trace and span (W3C's example ids).
const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER: &str = "00f067aa0ba902b7";

fn traceparent(trace: &str, span: &str, flags: &str) -> String {
    format!("00-{trace}-{span}-{flags}")
}

/// (trace id, parent span id, flags) of a `traceparent`.
fn parts(tp: &str) -> (String, String, String) {
    let f: Vec<&str> = tp.split('-').collect();
    assert_eq!(f.len(), 4, "{tp}");
    (f[1].to_string(), f[2].to_string(), f[3].to_string())
}

fn traced(
    up: &Upstream,
    redis: &RedisServer,
    collector: &Collector,
    extra: &str,
) -> SidecarBuilder {
    SidecarBuilder::new(&up.url(), &redis.url()).extra(&format!(
        "[tracing]\notlp_endpoint = \"{}\"\nservice_name = \"payments-idemgate\"\n{extra}",
        collector.base_url()
    ))
}

fn named<'a>(spans: &'a [Received], name: &str) -> Vec<&'a Received> {
    spans.iter().filter(|s| s.span.name == name).collect()
}

fn one<'a>(spans: &'a [Received], name: &str) -> &'a Received {
    let found = named(spans, name);
    assert_eq!(found.len(), 1, "one span {name:?} in {spans:#?}");
    found[0]
}

/// Span kinds as OTLP numbers them.
const SERVER: i32 = 2;
const CLIENT: i32 = 3;
const PRODUCER: i32 = 4;
const CONSUMER: i32 = 5;

#[tokio::test]
async fn a_providers_trace_continues_through_the_sidecar_to_the_application() {
    let redis = RedisServer::start_new();
    let up = Upstream::start().await;
    let collector = Collector::start(Answering::Ok).await;
    let sc = traced(&up, &redis, &collector, "").start().await;

    let body = r#"{"id":"evt_secret_body_marker","type":"payment.succeeded"}"#;
    let d = Delivery::fresh()
        .body(body)
        .header("traceparent", &traceparent(TRACE, CALLER, "01"))
        .header("tracestate", "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE");
    let a = sc.send(&d).await;
    assert_eq!(a.status, 200, "{a:?}");

    // The application's request: same trace, a new parent (the sidecar's forward span),
    // sampled, and tracestate passed on unchanged.
    let seen = up.last();
    let (trace, parent, flags) = parts(&seen.header("traceparent").expect("traceparent"));
    assert_eq!((trace.as_str(), flags.as_str()), (TRACE, "01"));
    assert_ne!(
        parent, CALLER,
        "the application's parent is the sidecar's span"
    );
    assert_eq!(
        seen.header("tracestate").as_deref(),
        Some("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE")
    );

    let spans = collector.wait_trace(TRACE, 5, 10 * SEC).await;
    assert!(spans.iter().all(|s| s.service == "payments-idemgate"));
    let server = one(&spans, "POST /webhooks/wh");
    assert_eq!(server.span.kind, SERVER);
    assert_eq!(
        server.parent_hex(),
        CALLER,
        "the provider's span is the parent"
    );
    assert_eq!(server.str("http.route").as_deref(), Some(PATH));
    assert_eq!(server.str("http.request.method").as_deref(), Some("POST"));
    assert_eq!(server.int("http.response.status_code"), Some(200));
    assert_eq!(server.str("idemgate.route").as_deref(), Some(ROUTE));
    assert_eq!(server.str("idemgate.outcome").as_deref(), Some("forwarded"));
    assert_eq!(server.bool("idemgate.replayed"), Some(false));
    assert_eq!(
        server.span.trace_state,
        "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"
    );
    for step in ["verify", "claim", "POST", "complete"] {
        let s = one(&spans, step);
        assert_eq!(
            s.parent_hex(),
            server.id_hex(),
            "{step} is the delivery's child"
        );
        assert!(s.span.start_time_unix_nano >= server.span.start_time_unix_nano);
        assert!(s.span.end_time_unix_nano <= server.span.end_time_unix_nano);
    }
    let forward = one(&spans, "POST");
    assert_eq!(forward.span.kind, CLIENT);
    assert_eq!(
        forward.id_hex(),
        parent,
        "the forward span is the application's parent"
    );
    assert_eq!(forward.int("http.response.status_code"), Some(200));
    assert_eq!(
        forward.str("url.full"),
        Some(format!("{}{PATH}", up.url().trim_end_matches('/')))
    );
    assert_eq!(one(&spans, "claim").span.kind, CLIENT);
    assert_eq!(
        one(&spans, "claim").str("db.operation.name").as_deref(),
        Some("claim")
    );
    assert!(
        server.span.status.as_ref().is_none_or(|s| s.code != 2),
        "not an error"
    );
    let verify = one(&spans, "verify");
    let claim = one(&spans, "claim");
    assert!(verify.span.end_time_unix_nano <= claim.span.start_time_unix_nano);
    assert!(claim.span.end_time_unix_nano <= forward.span.start_time_unix_nano);

    // A copy with its own trace: answered from the store, marked replayed, not forwarded.
    let copy_trace = "0af7651916cd43dd8448eb211c80319c";
    let copy = Delivery::new(&d.id, body).ts(d.ts).header(
        "traceparent",
        &traceparent(copy_trace, "b7ad6b7169203331", "01"),
    );
    let a = sc.send(&copy).await;
    assert!(a.replayed(), "{a:?}");
    let copy_spans = collector.wait_trace(copy_trace, 3, 10 * SEC).await;
    let server = one(&copy_spans, "POST /webhooks/wh");
    assert_eq!(server.bool("idemgate.replayed"), Some(true));
    assert_eq!(server.str("idemgate.outcome").as_deref(), Some("replayed"));
    assert!(
        named(&copy_spans, "POST").is_empty(),
        "a replay forwards nothing"
    );
    assert_eq!(up.count(), 1);

    // Nothing secret in any attribute: no secret, signature, or body.
    let sig = d
        .headers()
        .into_iter()
        .find(|(k, _)| k == "webhook-signature")
        .map(|(_, v)| v)
        .unwrap();
    let sig_b64 = sig.split_once(',').unwrap().1.to_string();
    for s in collector.spans() {
        for v in s.values() {
            for secret in [SECRET, &SECRET[6..], &sig_b64, "evt_secret_body_marker"] {
                assert!(
                    !v.contains(secret),
                    "{:?} carries {secret:?}: {v}",
                    s.span.name
                );
            }
        }
    }
    let types = collector.content_types();
    assert!(
        types.iter().all(|t| t == "application/x-protobuf"),
        "{types:?}"
    );
}

/// A delivery the application fails: the forward and the delivery carry the error,
/// and the claim is released in a span of its own.
#[tokio::test]
async fn a_failed_delivery_is_marked_and_its_release_traced() {
    let redis = RedisServer::start_new();
    let up = Upstream::start().await;
    up.push_modes(vec![Mode::Status(503)]);
    let collector = Collector::start(Answering::Ok).await;
    let sc = traced(&up, &redis, &collector, "").start().await;
    // A query can carry a token: it reaches the application, never an attribute.
    let d = Delivery::fresh()
        .path(&format!("{PATH}?token=query_secret_marker"))
        .header("traceparent", &traceparent(TRACE, CALLER, "01"));
    assert_eq!(sc.send(&d).await.status, 503);
    assert!(up.last().path_and_query.contains("query_secret_marker"));
    let spans = collector.wait_trace(TRACE, 5, 10 * SEC).await;
    let server = one(&spans, "POST /webhooks/wh");
    assert_eq!(
        server.str("idemgate.outcome").as_deref(),
        Some("upstream_error")
    );
    assert_eq!(
        server.span.status.as_ref().map(|s| s.code),
        Some(2),
        "status Error"
    );
    let forward = one(&spans, "POST");
    assert_eq!(forward.str("error.type").as_deref(), Some("503"));
    assert_eq!(forward.span.status.as_ref().map(|s| s.code), Some(2));
    let release = one(&spans, "release");
    assert_eq!(release.parent_hex(), server.id_hex());
    assert!(named(&spans, "complete").is_empty());
    for s in &spans {
        for v in s.values() {
            assert!(!v.contains("query_secret_marker"), "{:?}: {v}", s.span.name);
        }
    }
}

#[tokio::test]
async fn no_trace_starts_without_traceparent_unless_start_traces_and_unsampled_ones_pass_unchanged()
{
    let redis = RedisServer::start_new();
    let up = Upstream::start().await;
    let collector = Collector::start(Answering::Ok).await;
    let sc = traced(&up, &redis, &collector, "").start().await;

    // No traceparent, start_traces off: none is invented.
    assert_eq!(sc.send(&Delivery::fresh()).await.status, 200);
    assert_eq!(up.last().header("traceparent"), None);
    // An unsampled caller (flags 00): not recorded, its traceparent passed on as it is.
    let unsampled = traceparent("11111111111111111111111111111111", CALLER, "00");
    let d = Delivery::fresh().header("traceparent", &unsampled);
    assert_eq!(sc.send(&d).await.status, 200);
    assert_eq!(up.last().header("traceparent"), Some(unsampled));
    // An invalid traceparent is ignored (and passed on: it is the caller's header).
    let d = Delivery::fresh().header("traceparent", "00-zz-00f067aa0ba902b7-01");
    assert_eq!(sc.send(&d).await.status, 200);
    // A sampled one after them: once its spans are in, nothing else arrived.
    let d = Delivery::fresh().header("traceparent", &traceparent(TRACE, CALLER, "01"));
    assert_eq!(sc.send(&d).await.status, 200);
    collector.wait_trace(TRACE, 5, 10 * SEC).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let others: Vec<_> = collector
        .spans()
        .into_iter()
        .filter(|s| s.trace_hex() != TRACE)
        .collect();
    assert!(
        others.is_empty(),
        "spans of unstarted or unsampled traces: {others:#?}"
    );

    // start_traces = true: a request without one starts a trace the application joins.
    let sc2 = traced(
        &up,
        &redis,
        &collector,
        "start_traces = true\nsample_ratio = 1.0",
    )
    .start()
    .await;
    assert_eq!(sc2.send(&Delivery::fresh()).await.status, 200);
    let (trace, parent, flags) = parts(&up.last().header("traceparent").expect("a new trace"));
    assert_eq!(flags, "01");
    let spans = collector.wait_trace(&trace, 5, 10 * SEC).await;
    let root = one(&spans, "POST /webhooks/wh");
    assert!(root.span.parent_span_id.is_empty(), "a root span");
    assert_eq!(one(&spans, "POST").id_hex(), parent);
}

#[tokio::test]
async fn async_attempts_are_linked_to_the_accepting_request() {
    let redis = RedisServer::start_new();
    let up = Upstream::start().await;
    up.push_modes(vec![Mode::Status(500)]);
    let collector = Collector::start(Answering::Ok).await;
    let mut route = RouteCfg::standard(ROUTE, PATH);
    route.extra = "mode = \"async\"\nbackoff = \"100ms\"\n".into();
    // The standard variables, not the file, configure this one.
    let sc = SidecarBuilder::new(&up.url(), &redis.url())
        .route(route)
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &collector.base_url())
        .env("OTEL_SERVICE_NAME", "from-env")
        .start()
        .await;

    let d = Delivery::fresh().header("traceparent", &traceparent(TRACE, CALLER, "01"));
    let a = sc.send(&d).await;
    assert_eq!(a.status, 200, "the acknowledgement: {a:?}");
    up.wait_for_count(2, 10 * SEC).await;

    // server + verify + claim + send, then per attempt: process + its POST.
    let spans = collector.wait_trace(TRACE, 8, 10 * SEC).await;
    assert!(spans.iter().all(|s| s.service == "from-env"));
    let server = one(&spans, "POST /webhooks/wh");
    assert_eq!(server.str("idemgate.outcome").as_deref(), Some("queued"));
    let send = one(&spans, "send wh");
    assert_eq!(send.span.kind, PRODUCER);
    assert_eq!(send.parent_hex(), server.id_hex());
    assert_eq!(
        send.str("messaging.operation.type").as_deref(),
        Some("send")
    );
    assert_eq!(
        send.str("messaging.destination.name").as_deref(),
        Some(ROUTE)
    );

    let attempts = named(&spans, "process wh");
    assert_eq!(attempts.len(), 2, "{spans:#?}");
    let forwards = named(&spans, "POST");
    let seen: Vec<String> = up
        .requests()
        .iter()
        .map(|r| parts(&r.header("traceparent").unwrap()).1)
        .collect();
    for p in &attempts {
        assert_eq!(p.span.kind, CONSUMER);
        assert_eq!(
            p.parent_hex(),
            send.id_hex(),
            "an attempt follows the append"
        );
        assert_eq!(p.span.links.len(), 1, "a link to the accepting request");
        assert_eq!(hex::encode(&p.span.links[0].trace_id), TRACE);
        assert_eq!(hex::encode(&p.span.links[0].span_id), send.id_hex());
        assert_eq!(
            p.str("messaging.operation.type").as_deref(),
            Some("process")
        );
        let fwd: Vec<_> = forwards
            .iter()
            .filter(|f| f.parent_hex() == p.id_hex())
            .collect();
        assert_eq!(fwd.len(), 1, "one forward per attempt");
        assert!(
            seen.contains(&fwd[0].id_hex()),
            "the application's parent is the attempt's call"
        );
    }
    let mut numbers: Vec<i64> = attempts
        .iter()
        .map(|p| p.int("idemgate.attempt").unwrap())
        .collect();
    numbers.sort();
    assert_eq!(numbers, vec![1, 2]);
    let outcomes: Vec<_> = attempts
        .iter()
        .map(|p| p.str("idemgate.outcome").unwrap())
        .collect();
    assert!(
        outcomes.contains(&"failed".to_string()) && outcomes.contains(&"completed".to_string())
    );
}

/// Deliveries answered while the collector refuses, answers 500 or hangs: all 200 and
/// forwarded once, with the spans counted dropped.
#[tokio::test]
async fn a_dead_collector_or_a_full_queue_changes_nothing_for_the_provider() {
    let redis = RedisServer::start_new();
    let up = Upstream::start().await;
    // Nothing listens on the first; the second never answers an export.
    let refused = format!("http://127.0.0.1:{}", free_port());
    let hanging = Collector::start(Answering::Hang).await;
    let failing = Collector::start(Answering::Fail).await;
    // A refused export fails at once (export_failed); a hanging one holds the exporter
    // while the queue fills (queue_full).
    for (endpoint, reason) in [
        (refused, "export_failed"),
        (failing.base_url(), "export_failed"),
        (hanging.base_url(), "queue_full"),
    ] {
        let sc = SidecarBuilder::new(&up.url(), &redis.url())
            .extra(&format!("[tracing]\notlp_endpoint = \"{endpoint}\""))
            .start()
            .await;
        let before = up.count();
        // ~5 spans each: 600 deliveries overflow the 2,048-span queue while the first
        // export hangs (it waits 5 s) or fails.
        let n = 600;
        let mut sent = Vec::new();
        for chunk in 0..(n / 50) {
            let mut tasks = Vec::new();
            for i in 0..50 {
                let id = format!("{}-{chunk}-{i}", unique_id("dead"));
                let d = Delivery::new(&id, "{}")
                    .header("traceparent", &traceparent(TRACE, CALLER, "01"));
                tasks.push(sc.send_spawned(&d));
                sent.push(id);
            }
            for t in tasks {
                let a = t.await.unwrap();
                assert_eq!(a.status, 200, "{endpoint}: {a:?}");
            }
        }
        assert_eq!(up.count() - before, n, "{endpoint}: each forwarded once");
        let series = format!("idemgate_trace_spans_dropped_total{{reason=\"{reason}\"}}");
        let end = std::time::Instant::now() + 15 * SEC;
        let dropped = loop {
            let dropped = metric_in(&sc.metrics().await, &series);
            if dropped > 0.0 {
                break dropped;
            }
            assert!(
                std::time::Instant::now() < end,
                "{endpoint}: nothing in {series}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        assert!(
            dropped <= (n * 5) as f64,
            "{series} {dropped}: more than were made"
        );
    }
}

/// A sidecar stopped right after a delivery still sends its spans (the exporter
/// flushes at shutdown instead of waiting for the batch's second).
#[tokio::test]
async fn spans_queued_at_shutdown_are_flushed() {
    let redis = RedisServer::start_new();
    let up = Upstream::start().await;
    let collector = Collector::start(Answering::Ok).await;
    let mut sc = traced(&up, &redis, &collector, "").start().await;
    let d = Delivery::fresh().header("traceparent", &traceparent(TRACE, CALLER, "01"));
    assert_eq!(sc.send(&d).await.status, 200);
    sc.sigterm();
    sc.wait_exit(10 * SEC).await;
    let spans: Vec<_> = collector
        .spans()
        .into_iter()
        .filter(|s| s.trace_hex() == TRACE)
        .collect();
    assert_eq!(spans.len(), 5, "every span of the delivery: {spans:#?}");
}

/// The value of one series in a metrics page (0 when absent).
fn metric_in(page: &str, series: &str) -> f64 {
    page.lines()
        .find_map(|l| {
            l.strip_prefix(series)
                .map(|v| v.trim().parse().unwrap_or(0.0))
        })
        .unwrap_or(0.0)
}
