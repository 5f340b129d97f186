//! Criterion benches of the per-delivery hot path: signature verification, key
//! extraction, fingerprinting, the claim/complete round trip on both stores, and the
//! whole in-process delivery (gate → memory store → loopback upstream).
//!
//! `cargo bench --bench hot_path`. The Redis bench starts its own redis-server on a
//! free loopback port (it is skipped, with a note, when redis-server is missing).

use std::net::TcpListener as StdListener;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use bytes::Bytes;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use hmac::{KeyInit, Mac};
use http::{HeaderMap, HeaderValue, Request};
use http_body_util::Full;

use idemgate::config::Secret;
use idemgate::gate::Gate;
use idemgate::metrics::Metrics;
use idemgate::providers::StandardWebhooks;
use idemgate::providers::{KeySource, Verifier, fingerprint_body};
use idemgate::store::{
    Claim, DeliveryKey, Lifetimes, MemoryStore, RedisStore, Store, StoredResponse,
};
use idemgate::trace::Tracer;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

fn body_of(len: usize) -> Vec<u8> {
    let mut s =
        String::from("{\"id\":\"evt_0123456789\",\"type\":\"payment.succeeded\",\"data\":\"");
    while s.len() + 2 < len {
        s.push('x');
    }
    s.push_str("\"}");
    s.into_bytes()
}

fn sign(id: &str, ts: i64, body: &[u8]) -> String {
    let key = B64.decode(&SECRET[6..]).unwrap();
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(&key).unwrap();
    mac.update(format!("{id}.{ts}.").as_bytes());
    mac.update(body);
    format!("v1,{}", B64.encode(mac.finalize().into_bytes()))
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

fn headers(id: &str, ts: i64, body: &[u8]) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert("webhook-id", HeaderValue::from_str(id).unwrap());
    h.insert("webhook-timestamp", HeaderValue::from(ts));
    h.insert(
        "webhook-signature",
        HeaderValue::from_str(&sign(id, ts, body)).unwrap(),
    );
    h
}

fn verification(c: &mut Criterion) {
    let v = StandardWebhooks::new(
        &[Secret {
            source: SECRET.into(),
            value: SECRET.as_bytes().to_vec(),
            id: None,
        }],
        Duration::from_secs(300),
    )
    .unwrap();
    let mut g = c.benchmark_group("verify_standard_v1");
    for size in [1024usize, 64 * 1024] {
        let body = body_of(size);
        let ts = now();
        let h = headers("msg_1", ts, &body);
        g.throughput(Throughput::Bytes(size as u64));
        g.bench_with_input(BenchmarkId::from_parameter(size), &body, |b, body| {
            b.iter(|| v.verify(&h, body, ts).unwrap())
        });
    }
    g.finish();

    let mut g = c.benchmark_group("fingerprint_sha256");
    for size in [1024usize, 64 * 1024] {
        let body = body_of(size);
        g.throughput(Throughput::Bytes(size as u64));
        g.bench_with_input(BenchmarkId::from_parameter(size), &body, |b, body| {
            b.iter(|| fingerprint_body(body))
        });
    }
    g.finish();

    let mut g = c.benchmark_group("key_json_pointer");
    let src = KeySource::parse("json:/id").unwrap();
    let empty = HeaderMap::new();
    for size in [1024usize, 64 * 1024] {
        let body = body_of(size);
        g.throughput(Throughput::Bytes(size as u64));
        g.bench_with_input(BenchmarkId::from_parameter(size), &body, |b, body| {
            b.iter(|| src.extract(&empty, body).unwrap())
        });
    }
    g.finish();

    let mut g = c.benchmark_group("key_header");
    let src = KeySource::parse("header:webhook-id").unwrap();
    let h = headers("msg_1", now(), b"{}");
    g.bench_function("webhook-id", |b| b.iter(|| src.extract(&h, b"{}").unwrap()));
    g.finish();
}

fn response() -> StoredResponse {
    StoredResponse {
        status: 200,
        headers: Bytes::from_static(b"content-type: application/json\r\n"),
        body: Bytes::from_static(b"{\"ok\":true}"),
    }
}

/// claim + complete of a fresh key, then one duplicate claim: a delivery's store cost.
async fn store_cycle<S: Store>(s: &S, n: u64) {
    let key = DeliveryKey::new("bench", format!("evt_{n}"));
    let fp = fingerprint_body(b"payload");
    let Claim::Claimed(t) = s.claim(&key, &fp, None).await.unwrap() else {
        panic!("not claimed")
    };
    assert!(s.complete(&key, t, &response(), None).await.unwrap());
    assert!(matches!(
        s.claim(&key, &fp, None).await.unwrap(),
        Claim::Completed(_)
    ));
}

struct RedisProcess(Child, u16);

impl Drop for RedisProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    StdListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn start_redis() -> Option<RedisProcess> {
    let port = free_port();
    let child = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let p = RedisProcess(child, port);
    let end = Instant::now() + Duration::from_secs(10);
    while Instant::now() < end {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Some(p);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

fn stores(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let lifetimes = Lifetimes {
        lease: Duration::from_secs(30),
        retention: Duration::from_secs(3600),
    };
    let mut g = c.benchmark_group("store_claim_complete_duplicate");
    let mem = rt.block_on(async { MemoryStore::new(lifetimes) });
    let mut n = 0u64;
    g.bench_function("memory", |b| {
        b.to_async(&rt).iter(|| {
            n += 1;
            store_cycle(&mem, n)
        })
    });
    match start_redis() {
        Some(redis) => {
            // The connection manager spawns its connection task on the current runtime.
            let _in_runtime = rt.enter();
            let store = RedisStore::new(
                &format!("redis://127.0.0.1:{}/0", redis.1),
                "bench",
                lifetimes,
                Duration::from_secs(1),
            )
            .unwrap();
            let mut n = 0u64;
            g.bench_function("redis", |b| {
                b.to_async(&rt).iter(|| {
                    n += 1;
                    store_cycle(&store, n)
                })
            });
            drop(redis);
        }
        None => eprintln!("redis-server not available: skipping the redis store bench"),
    }
    g.finish();
}

/// An upstream on loopback answering `200 ok` (hyper, keep-alive).
async fn start_upstream() -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let _ = s.set_nodelay(true);
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(|_req| async {
                    Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(
                        Bytes::from_static(b"ok"),
                    )))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    addr
}

fn whole_delivery(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let upstream = rt.block_on(start_upstream());
    // The same gate twice: tracing off, and every delivery traced (start_traces) with
    // its spans exported to a sink answering any POST 200.
    let gate_with = |tracing: &str| {
        let text = format!(
            "upstream = \"http://{upstream}\"\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n\
             [[route]]\nname = \"b\"\npath = \"/wh\"\nprovider = \"standard\"\nsecrets = [\"{SECRET}\"]\n{tracing}"
        );
        let (config, routes) = idemgate::providers::from_toml_with_env(&text, |_| None).unwrap();
        let lifetimes = Lifetimes {
            lease: config.dedup.lease,
            retention: config.dedup.retention,
        };
        rt.block_on(async {
            let metrics = Arc::new(Metrics::new());
            let tracer = Tracer::new(&config.tracing, &metrics.trace_spans_dropped);
            let gate = Gate::new(&config, &routes, MemoryStore::new(lifetimes), metrics, None);
            Arc::new(gate.unwrap().with_tracer(tracer))
        })
    };
    let gate = gate_with("");
    // The collector runs on a thread of its own: its reading of the exports is not
    // the sidecar's cost.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let sink_rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        sink_rt.block_on(async {
            tx.send(start_upstream().await).unwrap();
            std::future::pending::<()>().await
        })
    });
    let sink = rx.recv().unwrap();
    let traced = gate_with(&format!(
        "[tracing]\notlp_endpoint = \"http://{sink}\"\nstart_traces = true\n"
    ));
    let body = Bytes::from(body_of(1024));
    let ts = now();
    let request = |id: &str| {
        let h = headers(id, ts, &body);
        let mut r = Request::post("/wh").body(Full::new(body.clone())).unwrap();
        *r.headers_mut() = h;
        r.headers_mut()
            .insert("host", HeaderValue::from_static("bench.local"));
        r
    };
    let mut g = c.benchmark_group("delivery_in_process_1KiB");
    let mut n = 0u64;
    g.bench_function("first_delivery_forwarded", |b| {
        b.to_async(&rt).iter_batched(
            || {
                n += 1;
                request(&format!("msg_{n}"))
            },
            |req| {
                let gate = gate.clone();
                async move {
                    let a = gate.handle(req).await;
                    assert_eq!(a.status(), 200);
                }
            },
            criterion::BatchSize::SmallInput,
        )
    });
    rt.block_on(async { assert_eq!(gate.handle(request("dup")).await.status(), 200) });
    g.bench_function("duplicate_replayed", |b| {
        b.to_async(&rt).iter_batched(
            || request("dup"),
            |req| {
                let gate = gate.clone();
                async move {
                    let a = gate.handle(req).await;
                    assert!(a.headers().contains_key("idempotent-replayed"));
                }
            },
            criterion::BatchSize::SmallInput,
        )
    });
    g.bench_function("first_delivery_forwarded_traced", |b| {
        b.to_async(&rt).iter_batched(
            || {
                n += 1;
                request(&format!("msg_{n}"))
            },
            |req| {
                let gate = traced.clone();
                async move {
                    let a = gate.handle(req).await;
                    assert_eq!(a.status(), 200);
                }
            },
            criterion::BatchSize::SmallInput,
        )
    });
    rt.block_on(async { assert_eq!(traced.handle(request("dup")).await.status(), 200) });
    g.bench_function("duplicate_replayed_traced", |b| {
        b.to_async(&rt).iter_batched(
            || request("dup"),
            |req| {
                let gate = traced.clone();
                async move {
                    let a = gate.handle(req).await;
                    assert!(a.headers().contains_key("idempotent-replayed"));
                }
            },
            criterion::BatchSize::SmallInput,
        )
    });
    g.finish();
    // Spans the exporter dropped would make the traced figures look cheaper than they are.
    let dropped = &traced.metrics().trace_spans_dropped;
    eprintln!(
        "traced deliveries: spans dropped queue_full={} export_failed={}",
        dropped.with_label_values(&["queue_full"]).get(),
        dropped.with_label_values(&["export_failed"]).get()
    );
}

/// What exporting costs per span: a batch of 512 delivery-like spans encoded as OTLP.
fn trace_encoding(c: &mut Criterion) {
    use idemgate::trace::{Kind, SpanContext, SpanData, Value};
    let span = |i: u8| SpanData {
        context: SpanContext {
            trace_id: [i; 16],
            span_id: [i; 8],
            flags: 1,
        },
        parent: Some([7; 8]),
        name: "POST /webhooks/orders".into(),
        kind: Kind::Server,
        start: 1,
        end: 2,
        attributes: vec![
            ("http.request.method", Value::from("POST")),
            ("http.route", Value::from("/webhooks/orders".to_string())),
            ("url.path", Value::from("/webhooks/orders".to_string())),
            ("idemgate.route", Value::from("orders".to_string())),
            ("idemgate.outcome", Value::from("forwarded")),
            ("idemgate.replayed", Value::from(false)),
            ("http.response.status_code", Value::from(200u16)),
        ],
        ..SpanData::default()
    };
    let mut g = c.benchmark_group("trace_export");
    g.throughput(Throughput::Elements(512));
    g.bench_function("encode_512_spans", |b| {
        b.iter_batched(
            || (0..512).map(|i| span(i as u8)).collect::<Vec<_>>(),
            |batch| idemgate::trace::encode("idemgate", batch),
            criterion::BatchSize::SmallInput,
        )
    });
    g.finish();
}

fn secret(value: &str) -> Secret {
    Secret {
        source: "bench".into(),
        value: value.as_bytes().to_vec(),
        id: None,
    }
}

fn header_map(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.insert(
            http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            HeaderValue::from_str(v).unwrap(),
        );
    }
    h
}

/// Each provider scheme on its published vector (tests/fixtures/provider_vectors.json).
fn provider_schemes(c: &mut Criterion) {
    use idemgate::providers::{Alipay, HmacScheme, Stripe, WechatPay};
    let v: serde_json::Value =
        serde_json::from_str(include_str!("../tests/fixtures/provider_vectors.json")).unwrap();
    let s = |p: &str| v.pointer(p).and_then(|x| x.as_str()).unwrap().to_string();
    let n = |p: &str| v.pointer(p).and_then(|x| x.as_i64()).unwrap();
    let tol = Duration::from_secs(300);
    let mut g = c.benchmark_group("verify_provider_vector");

    let gh = HmacScheme::github(&[secret(&s("/GITHUB/secret"))]).unwrap();
    let h = header_map(&[("x-hub-signature-256", &s("/GITHUB/signature"))]);
    let body = s("/GITHUB/body");
    g.bench_function("github", |b| {
        b.iter(|| gh.verify(&h, body.as_bytes(), 0).unwrap())
    });

    let st = Stripe::new(&[secret(&s("/STRIPE/secret"))], tol).unwrap();
    let h = header_map(&[("stripe-signature", &s("/STRIPE/header"))]);
    let body = s("/STRIPE/body");
    let ts = n("/STRIPE/timestamp");
    g.bench_function("stripe", |b| {
        b.iter(|| st.verify(&h, body.as_bytes(), ts).unwrap())
    });

    let sh = HmacScheme::shopify(&[secret(&s("/SHOPIFY/secret"))]).unwrap();
    let h = header_map(&[("x-shopify-hmac-sha256", &s("/SHOPIFY/signature"))]);
    let body = s("/SHOPIFY/body");
    g.bench_function("shopify", |b| {
        b.iter(|| sh.verify(&h, body.as_bytes(), 0).unwrap())
    });

    let sl = HmacScheme::slack(&[secret(&s("/SLACK/secret"))], tol).unwrap();
    let ts = n("/SLACK/timestamp");
    let h = header_map(&[
        ("x-slack-signature", &s("/SLACK/signature")),
        ("x-slack-request-timestamp", &ts.to_string()),
    ]);
    let body = s("/SLACK/body");
    g.bench_function("slack", |b| {
        b.iter(|| sl.verify(&h, body.as_bytes(), ts).unwrap())
    });

    let al = Alipay::new(&[secret(&s("/ALIPAY_TRADE_PUBLIC_KEY_B64"))]).unwrap();
    let mut form = form_urlencoded::Serializer::new(String::new());
    for pair in v["ALIPAY_TRADE_NOTIFY"].as_array().unwrap() {
        form.append_pair(pair[0].as_str().unwrap(), pair[1].as_str().unwrap());
    }
    let body = form.finish();
    let empty = HeaderMap::new();
    g.bench_function("alipay_rsa2", |b| {
        b.iter(|| al.verify(&empty, body.as_bytes(), 0).unwrap())
    });

    let wx = WechatPay::new(&[secret(&s("/WECHATPAY_CERT_PEM"))], tol).unwrap();
    let ts: i64 = s("/WECHATPAY_NOTIFY/timestamp").parse().unwrap();
    let h = header_map(&[
        ("wechatpay-serial", &s("/WECHATPAY_NOTIFY/serial")),
        ("wechatpay-timestamp", &ts.to_string()),
        ("wechatpay-nonce", &s("/WECHATPAY_NOTIFY/nonce")),
        ("wechatpay-signature", &s("/WECHATPAY_NOTIFY/signature")),
    ]);
    let body = s("/WECHATPAY_NOTIFY/body");
    g.bench_function("wechatpay_rsa", |b| {
        b.iter(|| wx.verify(&h, body.as_bytes(), ts).unwrap())
    });
    g.finish();
}

criterion_group!(
    benches,
    verification,
    provider_schemes,
    stores,
    whole_delivery,
    trace_encoding
);
criterion_main!(benches);
