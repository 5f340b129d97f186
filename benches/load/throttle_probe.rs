//! The throttled-delivery benchmark's client and application (benches/load/throttle.sh):
//! it serves as the application on `APP_PORT` (answering 200 after `DELAY_MS`, counting
//! how many requests run at once), sends `N` signed deliveries to the sidecars' async
//! route as fast as they acknowledge them (a provider's backlog arriving at once,
//! spread over the sidecars), and waits until each reached the application. Each body
//! carries the time it was sent, so the application sees how long each delivery
//! waited in the backlog.
//!
//! `cargo run --release --example throttle_probe -- APP_PORT DELAY_MS N SECRET URL...`
//! prints one `RESULT` line: what was configured is the script's to say.

use std::collections::HashSet;
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};

#[path = "sign.rs"]
mod sign;

/// Sends in flight at once.
const SENDERS: usize = 64;
/// The longest the run may take.
const DEADLINE: Duration = Duration::from_secs(600);

/// What the application saw.
#[derive(Default)]
struct Seen {
    /// (arrival, microseconds since the send, idempotency key)
    calls: Mutex<Vec<(Instant, u64, String)>>,
    now: AtomicUsize,
    most: AtomicUsize,
}

fn unix_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 6 {
        eprintln!("usage: throttle_probe APP_PORT DELAY_MS N SECRET URL...");
        std::process::exit(2);
    }
    let port: u16 = args[1].parse().expect("APP_PORT");
    let delay = Duration::from_millis(args[2].parse().expect("DELAY_MS"));
    let n: usize = args[3].parse().expect("N");
    let key = sign::key(&args[4]);
    let urls = args[5..].to_vec();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run(port, delay, n, key, urls));
}

async fn serve(port: u16, delay: Duration, seen: Arc<Seen>) {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .expect("bind");
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let seen = seen.clone();
        tokio::spawn(async move {
            let svc =
                hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let seen = seen.clone();
                    async move {
                        let arrived = Instant::now();
                        let at = unix_us();
                        let now = seen.now.fetch_add(1, Ordering::SeqCst) + 1;
                        seen.most.fetch_max(now, Ordering::SeqCst);
                        let key = req
                            .headers()
                            .get("idempotency-key")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("")
                            .to_string();
                        let body = req
                            .into_body()
                            .collect()
                            .await
                            .map(|c| c.to_bytes())
                            .unwrap_or_default();
                        let sent = serde_json::from_slice::<serde_json::Value>(&body)
                            .ok()
                            .and_then(|v| v["sent_us"].as_u64())
                            .unwrap_or(at);
                        tokio::time::sleep(delay).await;
                        seen.now.fetch_sub(1, Ordering::SeqCst);
                        seen.calls
                            .lock()
                            .unwrap()
                            .push((arrived, at.saturating_sub(sent), key));
                        Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from_static(
                            b"ok",
                        ))))
                    }
                });
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

async fn run(port: u16, delay: Duration, n: usize, key: Vec<u8>, urls: Vec<String>) {
    let seen = Arc::new(Seen::default());
    tokio::spawn(serve(port, delay, seen.clone()));
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build(connector);
    let ts = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let gate = Arc::new(tokio::sync::Semaphore::new(SENDERS));
    let refused = Arc::new(AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    let start = Instant::now();
    for i in 0..n {
        let permit = gate.clone().acquire_owned().await.unwrap();
        let id = format!("th_{ts}_{i}");
        let body = Bytes::from(format!(
            "{{\"type\":\"payment.succeeded\",\"sent_us\":{},\"pad\":\"{}\"}}",
            unix_us(),
            "x".repeat(200)
        ));
        let req = http::Request::post(&urls[i % urls.len()])
            .header("content-type", "application/json")
            .header("webhook-id", &id)
            .header("webhook-timestamp", ts.to_string())
            .header("webhook-signature", sign::signature(&key, &id, ts, &body))
            .body(Full::new(body))
            .unwrap();
        let (client, refused) = (client.clone(), refused.clone());
        tasks.spawn(async move {
            let ok = matches!(client.request(req).await, Ok(r) if r.status().is_success());
            if !ok {
                refused.fetch_add(1, Ordering::SeqCst);
            }
            drop(permit);
        });
    }
    while tasks.join_next().await.is_some() {}
    let acked = start.elapsed();
    while seen.calls.lock().unwrap().len() < n && start.elapsed() < DEADLINE {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let calls = seen.calls.lock().unwrap().clone();
    let keys: HashSet<&String> = calls.iter().map(|c| &c.2).collect();
    let mut arrivals: Vec<Instant> = calls.iter().map(|c| c.0).collect();
    arrivals.sort();
    let most_in = |w: Duration| {
        let (mut most, mut j) = (0, 0);
        for i in 0..arrivals.len() {
            while arrivals[i].duration_since(arrivals[j]) >= w {
                j += 1;
            }
            most = most.max(i - j + 1);
        }
        most
    };
    // The steady rate: over the second half of the arrivals (the burst is long spent;
    // the first second's admissions may still be arriving just after it).
    let half = &arrivals[arrivals.len() / 2..];
    let rate = match (half.first(), half.last()) {
        (Some(a), Some(b)) if b > a => (half.len() - 1) as f64 / b.duration_since(*a).as_secs_f64(),
        _ => 0.0,
    };
    let first = arrivals.first().copied().unwrap_or(start);
    let mut waited: Vec<u64> = calls.iter().map(|c| c.1).collect();
    waited.sort_unstable();
    let pct = |p: f64| {
        waited
            .get(((waited.len() as f64 * p) as usize).min(waited.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0)
    };
    println!(
        "RESULT sent={n} refused={} acked_in_s={:.2} delivered={} distinct={} span_s={:.2} steady_rate={rate:.1} most_at_once={} most_in_1s={} most_in_5s={} wait_p50_ms={:.0} wait_p99_ms={:.0} wait_max_ms={:.0}",
        refused.load(Ordering::SeqCst),
        acked.as_secs_f64(),
        calls.len(),
        keys.len(),
        arrivals
            .last()
            .map(|l| l.duration_since(first).as_secs_f64())
            .unwrap_or(0.0),
        seen.most.load(Ordering::SeqCst),
        most_in(Duration::from_secs(1)),
        most_in(Duration::from_secs(5)),
        pct(0.5) as f64 / 1000.0,
        pct(0.99) as f64 / 1000.0,
        waited.last().copied().unwrap_or(0) as f64 / 1000.0,
    );
}
