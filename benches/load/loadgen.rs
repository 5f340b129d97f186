//! A fixed-rate (open-loop) load generator for the load benchmark: sends signed
//! Standard Webhooks deliveries at a steady rate, each with a fresh id, each in its
//! own task (open loop: a slow answer never delays the next send, so a stall is not
//! hidden by the generator waiting for it). Latency runs from the moment a request is
//! handed to the client to the last byte of its answer; how late the generator's
//! timer fired (tokio's timer has 1 ms granularity) is reported apart, as `lag`.
//!
//! `cargo run --release --example loadgen -- URL RATE SECONDS SECRET`

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

#[path = "sign.rs"]
mod sign;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 5 {
        eprintln!("usage: loadgen URL RATE SECONDS SECRET");
        std::process::exit(2);
    }
    let url = args[1].clone();
    let rate: u64 = args[2].parse().expect("RATE");
    let seconds: u64 = args[3].parse().expect("SECONDS");
    let key = sign::key(&args[4]);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run(url, rate, seconds, key));
}

async fn run(url: String, rate: u64, seconds: u64, key: Vec<u8>) {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build(connector);
    let body = Bytes::from(format!(
        "{{\"type\":\"payment.succeeded\",\"pad\":\"{}\"}}",
        "x".repeat(990)
    ));
    let ts = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let samples: Arc<Mutex<Vec<(u64, bool)>>> = Arc::default();
    let total = rate * seconds;
    let mut tick = tokio::time::interval(Duration::from_nanos(1_000_000_000 / rate.max(1)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut tasks = tokio::task::JoinSet::new();
    let mut max_lag = 0u64;
    for n in 0..total {
        let scheduled = tick.tick().await;
        let id = format!("fr_{ts}_{n}");
        let sig = sign::signature(&key, &id, ts, &body);
        let req = http::Request::post(&url)
            .header("content-type", "application/json")
            .header("webhook-id", id)
            .header("webhook-timestamp", ts.to_string())
            .header("webhook-signature", sig)
            .body(Full::new(body.clone()))
            .unwrap();
        let client = client.clone();
        let samples = samples.clone();
        let lag = scheduled.elapsed().as_micros() as u64;
        max_lag = max_lag.max(lag);
        tasks.spawn(async move {
            let sent = std::time::Instant::now();
            let ok = match tokio::time::timeout(Duration::from_secs(10), client.request(req)).await
            {
                Ok(Ok(resp)) => {
                    let ok = resp.status().is_success();
                    let _ = resp.into_body().collect().await;
                    ok
                }
                _ => false,
            };
            let us = sent.elapsed().as_micros() as u64;
            samples.lock().unwrap().push((us, ok));
        });
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
    let mut s = samples.lock().unwrap().clone();
    let non2xx = s.iter().filter(|(_, ok)| !ok).count();
    s.sort_unstable();
    let pct = |p: f64| {
        s.get(((s.len() as f64 * p) as usize).min(s.len().saturating_sub(1)))
            .map(|x| x.0)
            .unwrap_or(0)
    };
    println!(
        "RESULT requests={} non2xx={} p50_us={} p99_us={} max_us={} max_lag_us={}",
        s.len(),
        non2xx,
        pct(0.50),
        pct(0.99),
        s.last().map(|x| x.0).unwrap_or(0),
        max_lag
    );
}
