//! `idemgate demo`: a self-contained tour on the in-memory store. It starts the
//! sidecar and a built-in upstream on loopback ports, sends signed Standard Webhooks
//! deliveries (retries, a burst of concurrent copies, a tampered one, a reused key,
//! an unsigned one) and prints what each got and what reached the upstream.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use bytes::Bytes;
use hmac::{KeyInit, Mac};
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

use crate::server::Bound;
use crate::store::{MemoryStore, RouteLifetimes};

/// What the built-in upstream saw: the `webhook-id` of every request, in order.
type Seen = Arc<Mutex<Vec<String>>>;

/// The built-in upstream: answers 200 after a short pause (the pause is what lets
/// concurrent copies overlap the first one, as they do in production).
async fn start_upstream() -> std::io::Result<(SocketAddr, Seen)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let seen: Seen = Arc::default();
    let seen2 = seen.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let seen = seen2.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                    let seen = seen.clone();
                    async move {
                        let id = req
                            .headers()
                            .get("webhook-id")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("-")
                            .to_string();
                        let _ = req.into_body().collect().await;
                        if let Ok(mut s) = seen.lock() {
                            s.push(id.clone());
                        }
                        tokio::time::sleep(Duration::from_millis(150)).await;
                        let body = format!("{{\"processed\":\"{id}\"}}");
                        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(body))))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    Ok((addr, seen))
}

struct Sender {
    client: Client<HttpConnector, Full<Bytes>>,
    url: String,
    key: Vec<u8>,
}

/// One answer as the demo reports it.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Got {
    status: u16,
    replayed: bool,
}

impl Sender {
    fn signed(&self, id: &str, ts: i64, body: &[u8]) -> String {
        let mut mac =
            hmac::Hmac::<sha2::Sha256>::new_from_slice(&self.key).expect("any key length");
        mac.update(format!("{id}.{ts}.").as_bytes());
        mac.update(body);
        format!("v1,{}", B64.encode(mac.finalize().into_bytes()))
    }

    async fn send(
        &self,
        id: &str,
        body: &'static str,
        tamper: bool,
        sign: bool,
    ) -> Result<Got, String> {
        let ts = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0);
        let sig = self.signed(id, ts, body.as_bytes());
        let sent_body = if tamper {
            body.replace("100", "999")
        } else {
            body.to_string()
        };
        let mut b = Request::post(&self.url)
            .header("content-type", "application/json")
            .header("webhook-id", id)
            .header("webhook-timestamp", ts.to_string());
        if sign {
            b = b.header("webhook-signature", sig);
        }
        let req = b
            .body(Full::new(Bytes::from(sent_body)))
            .map_err(|e| e.to_string())?;
        let resp = self.client.request(req).await.map_err(|e| e.to_string())?;
        let status = resp.status().as_u16();
        let replayed = resp.headers().contains_key("idempotent-replayed");
        let _ = resp.into_body().collect().await;
        Ok(Got { status, replayed })
    }
}

fn summarize(answers: &[Got]) -> String {
    let mut counts: BTreeMap<Got, usize> = BTreeMap::new();
    for a in answers {
        *counts.entry(a.clone()).or_default() += 1;
    }
    counts
        .iter()
        .map(|(g, n)| {
            let label = match (g.status, g.replayed) {
                (s, true) => format!("{s} replayed"),
                (200, false) => "200 forwarded".to_string(),
                (400, _) => "400 bad request".to_string(),
                (401, _) => "401 bad signature".to_string(),
                (409, _) => "409 in flight".to_string(),
                (422, _) => "422 payload mismatch".to_string(),
                (s, _) => s.to_string(),
            };
            format!("{label} ×{n}")
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Runs the tour and prints its table; returns an error if the sidecar let a
/// duplicate through (so the demo doubles as a smoke check).
pub async fn run() -> Result<(), String> {
    let (upstream, seen) = start_upstream().await.map_err(|e| e.to_string())?;
    let key: [u8; 24] = rand::random();
    let secret = format!("whsec_{}", B64.encode(key));
    let text = format!(
        r#"
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
upstream = "http://{upstream}"

[[route]]
name = "demo"
path = "/webhooks/demo"
provider = "standard"
secrets = ["{secret}"]
"#
    );
    let (config, routes) =
        crate::providers::from_toml_with_env(&text, |_| None).map_err(|e| e.to_string())?;
    let lifetimes = RouteLifetimes::from_config(&config);
    let bound = Bound::bind(&config, &routes, MemoryStore::new(lifetimes))
        .await
        .map_err(|e| e.to_string())?;
    let addr = bound.addr();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(bound.serve(async {
        let _ = stopped.await;
    }));

    let sender = Arc::new(Sender {
        client: Client::builder(TokioExecutor::new()).build(HttpConnector::new()),
        url: format!("http://{addr}/webhooks/demo"),
        key: key.to_vec(),
    });

    println!(
        "idemgate demo: sidecar on http://{addr} (in-memory store), upstream on http://{upstream}"
    );
    println!("route /webhooks/demo, provider standard (Standard Webhooks, HMAC-SHA256)\n");
    let body1 = r#"{"type":"payment.succeeded","order":"A-1","amount":100}"#;
    let body2 = r#"{"type":"payment.succeeded","order":"B-2","amount":100}"#;
    let body3 = r#"{"type":"payment.succeeded","order":"C-3","amount":100}"#;

    let mut rows: Vec<(String, usize, String, usize)> = Vec::new();
    let upstream_count = || seen.lock().map(|s| s.len()).unwrap_or(0);

    // A scenario: sends `copies` of a delivery at once and notes what reached the upstream.
    macro_rules! scenario {
        ($label:expr, $copies:expr, $id:expr, $body:expr, $tamper:expr, $sign:expr) => {{
            let before = upstream_count();
            let mut set = tokio::task::JoinSet::new();
            for _ in 0..$copies {
                let s = sender.clone();
                set.spawn(async move { s.send($id, $body, $tamper, $sign).await });
            }
            let mut answers = Vec::new();
            while let Some(r) = set.join_next().await {
                answers.push(r.map_err(|e| e.to_string())??);
            }
            rows.push((
                $label.to_string(),
                $copies,
                summarize(&answers),
                upstream_count() - before,
            ));
        }};
    }

    scenario!("evt_1: first delivery", 1, "evt_1", body1, false, true);
    scenario!(
        "evt_1: provider retry (re-signed)",
        1,
        "evt_1",
        body1,
        false,
        true
    );
    scenario!("evt_1: another retry", 1, "evt_1", body1, false, true);
    scenario!(
        "evt_2: 50 concurrent copies",
        50,
        "evt_2",
        body2,
        false,
        true
    );
    scenario!("evt_2: a late copy", 1, "evt_2", body2, false, true);
    scenario!("evt_3: tampered body", 1, "evt_3", body3, true, true);
    scenario!("evt_3: unsigned", 1, "evt_3", body3, false, false);
    scenario!(
        "evt_1: id reused, other payload",
        1,
        "evt_1",
        body3,
        false,
        true
    );

    let w = rows.iter().map(|r| r.0.len()).max().unwrap_or(10).max(8);
    println!(
        "{:<w$}  {:>4}  {:>8}  answers",
        "delivery", "sent", "upstream"
    );
    println!("{}", "-".repeat(w + 60));
    for (label, sent, answers, reached) in &rows {
        println!("{label:<w$}  {sent:>4}  {reached:>8}  {answers}");
    }
    let ids = seen.lock().map(|s| s.clone()).unwrap_or_default();
    let mut per_id: BTreeMap<&str, usize> = BTreeMap::new();
    for id in &ids {
        *per_id.entry(id.as_str()).or_default() += 1;
    }
    let sent: usize = rows.iter().map(|r| r.1).sum();
    println!(
        "\n{sent} requests sent; the upstream received {} ({}).",
        ids.len(),
        per_id
            .iter()
            .map(|(k, v)| format!("{k} ×{v}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let _ = stop.send(());
    let _ = server.await;
    if per_id.values().any(|n| *n != 1)
        || !per_id.contains_key("evt_1")
        || !per_id.contains_key("evt_2")
    {
        return Err("an event did not reach the upstream exactly once".to_string());
    }
    println!(
        "Each signed event reached the upstream exactly once; the tampered and unsigned ones never did."
    );
    Ok(())
}
