//! End-to-end: faults. Redis killed, paused and restarted under load; the circuit
//! breaker; the upstream refusing, resetting, stalling and answering endlessly; the
//! sidecar itself killed -9 and restarted. After each, the invariants of
//! `common::load::check_invariants` hold, and memory returns near its baseline.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::load::*;
use crate::common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const MIB: u64 = 1024;

/// Redis that loses nothing it acknowledged when killed (the AOF is fsynced on every
/// write), and that accepts `DEBUG SLEEP`.
fn durable_redis() -> RedisServer {
    RedisServer::start_new_with(&[
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
        "--enable-debug-command",
        "yes",
    ])
}

fn assert_no_secrets(logs: &str) {
    for n in [SECRET, "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"] {
        assert!(!logs.contains(n), "the log holds a secret");
    }
}

/// `redis-cli` without waiting on the test's runtime (DEBUG SLEEP blocks the caller).
fn redis_cli_detached(port: u16, args: &[&str]) -> std::thread::JoinHandle<()> {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    std::thread::spawn(move || {
        let _ = std::process::Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &port.to_string()])
            .args(&args)
            .output();
    })
}

/// `n` deliveries answered 200 before the faults start. With `appendfsync always` a
/// write can outlast the 500 ms store timeout while the machine's disk is busy (other
/// builds): such a delivery is answered 503, which is the right answer then, so the
/// warm-up sends another; any other answer, or no 200s within 30 s, fails.
async fn warm_up(sc: &Sidecar, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut ok = 0;
    while ok < n {
        let status = sc.send(&Delivery::fresh()).await.status;
        match status {
            200 => ok += 1,
            503 if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(50)).await,
            other => panic!("warm-up delivery {ok} of {n} answered {other}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_killed_paused_slept_and_restarted_under_load() {
    let _heavy = crate::common::exclusive().await;
    let lease = Duration::from_secs(3);
    let mut redis = durable_redis();
    let up = Upstream::start().await;
    up.set_mode(Mode::Delayed(
        Duration::from_millis(10),
        Box::new(Mode::default_ok()),
    ));
    // Two delivery runtimes, one breaker: the threshold counts both runtimes' calls
    // (each 503 closes its connection, so the deliveries spread over both).
    let sc = SidecarBuilder::new(&up.url(), &redis.url())
        .top("worker_threads", "2")
        .store_opt("timeout", "500ms")
        .store_opt("breaker_threshold", "3")
        .store_opt("breaker_cooldown", "300ms")
        .lease("3s")
        .start()
        .await;
    warm_up(&sc, 50).await;
    let baseline = sc_rss(&sc);

    // bound per request: claim + upstream + complete, each bounded, plus slack
    let bound = Duration::from_secs(15);
    let load = start_load(target(&sc), 8, Duration::from_secs(12), bound);
    let mut rss_peak = baseline;

    load.wait_for(100, Duration::from_secs(5)).await;
    let t = Instant::now();
    redis.stop();
    eprintln!(
        "[{:?}] redis killed at {} answers",
        t.elapsed(),
        load.count()
    );
    sample_for(&sc, Duration::from_millis(1500), &mut rss_peak).await;
    redis.start();
    eprintln!(
        "[{:?}] redis restarted at {} answers",
        t.elapsed(),
        load.count()
    );
    sample_for(&sc, Duration::from_millis(1500), &mut rss_peak).await;
    redis.pause(1500);
    eprintln!(
        "[{:?}] CLIENT PAUSE 1500 at {} answers",
        t.elapsed(),
        load.count()
    );
    sample_for(&sc, Duration::from_millis(2500), &mut rss_peak).await;
    let sleeper = redis_cli_detached(redis.port(), &["DEBUG", "SLEEP", "1.5"]);
    eprintln!(
        "[{:?}] DEBUG SLEEP 1.5 at {} answers",
        t.elapsed(),
        load.count()
    );
    sample_for(&sc, Duration::from_millis(2000), &mut rss_peak).await;
    let _ = sleeper.join();
    let sent = load.finish().await;

    let logs = sc.stderr();
    let f = check_invariants(&sc, &up, &redis, &sent, &logs, lease, false, true).await;
    eprintln!("redis faults: {f:#?}");
    assert!(
        f.status_counts.get("503").copied().unwrap_or(0) > 0,
        "the faults had no effect: {f:?}"
    );
    assert!(f.answered_2xx > 100, "{f:?}");
    assert!(f.max_elapsed < bound);

    let after = settle_rss(&sc, baseline).await;
    eprintln!("RSS KiB: baseline {baseline}, peak {rss_peak}, after {after}");
    assert!(
        after <= baseline * 3 / 2 + 16 * MIB,
        "RSS {after} KiB vs baseline {baseline} KiB"
    );
    assert_no_secrets(&logs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dead_store_opens_the_breaker_and_readyz_follows() {
    let _heavy = crate::common::exclusive().await;
    let mut redis = RedisServer::start_new();
    let up = Upstream::start().await;
    // Two delivery runtimes, one breaker: the threshold counts both runtimes' calls
    // (each 503 closes its connection, so the deliveries spread over both).
    let sc = SidecarBuilder::new(&up.url(), &redis.url())
        .top("worker_threads", "2")
        .store_opt("timeout", "500ms")
        .store_opt("breaker_threshold", "3")
        .store_opt("breaker_cooldown", "2s")
        .start()
        .await;
    warm_up(&sc, 3).await;
    sc.wait_readyz(200, Duration::from_secs(5)).await;
    let claim_errors = "idemgate_store_errors_total{op=\"claim\"}";
    assert_eq!(sc.metric(claim_errors).await, 0.0);

    redis.stop();
    // every delivery gets 503 + Retry-After, none reaches the upstream
    let mut answered = 0;
    let t = Instant::now();
    while answered < 60 {
        let a = sc.send(&Delivery::fresh()).await;
        a.assert_error(503, "store_unavailable");
        assert_eq!(a.retry_after(), 1);
        answered += 1;
    }
    let spent = t.elapsed();
    let errors = sc.metric(claim_errors).await;
    eprintln!("60 deliveries on a dead store in {spent:?}; {errors} claims reached it");
    // Only the first `threshold` and the occasional half-open probe asked the store.
    let probes = spent.as_secs_f64() / 2.0 + 2.0;
    assert!(
        errors <= 3.0 + probes,
        "{errors} claims asked a dead store (threshold 3, ~{probes} probes)"
    );
    assert_eq!(sc.metric("idemgate_store_circuit_open").await, 1.0);
    assert_eq!(sc.readyz().await, 503);
    assert_eq!(up.count(), 3);

    redis.start();
    // the breaker half-opens after its cooldown; a probe (readyz's ping) closes it
    sc.wait_readyz(200, Duration::from_secs(10)).await;
    assert_eq!(sc.metric("idemgate_store_circuit_open").await, 0.0);
    let a = sc.send(&Delivery::fresh()).await;
    assert_eq!(a.status, 200);
    assert_eq!(up.count(), 4);
    assert_no_secrets(&sc.stderr());
}

// ---------------------------------------------------------------------------
// a misbehaving upstream, on raw TCP
// ---------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    Ok,
    /// Reads the request, then resets the connection.
    ResetBeforeAnswer,
    /// Sends the head and part of the body, then resets.
    ResetMidResponse,
    /// Never answers.
    Stall,
    /// A chunked body that never ends.
    EndlessChunked,
    /// Announces a 10 GB body.
    HugeLength,
}

struct FaultUpstream {
    addr: SocketAddr,
    fault: Arc<Mutex<Fault>>,
    seen: Arc<Mutex<Vec<String>>>,
    /// Connections accepted so far (pool reuse keeps this low).
    conns: Arc<std::sync::atomic::AtomicUsize>,
    tasks: Arc<Mutex<tokio::task::JoinSet<()>>>,
    acceptor: Option<tokio::task::JoinHandle<()>>,
}

impl FaultUpstream {
    async fn start() -> FaultUpstream {
        let mut u = FaultUpstream {
            addr: "127.0.0.1:0".parse().unwrap(),
            fault: Arc::new(Mutex::new(Fault::Ok)),
            seen: Arc::default(),
            conns: Arc::default(),
            tasks: Arc::new(Mutex::new(tokio::task::JoinSet::new())),
            acceptor: None,
        };
        u.listen().await;
        u
    }

    async fn listen(&mut self) {
        let l = tokio::net::TcpListener::bind(self.addr).await.unwrap();
        self.addr = l.local_addr().unwrap();
        let (fault, seen, tasks) = (self.fault.clone(), self.seen.clone(), self.tasks.clone());
        let conns = self.conns.clone();
        self.acceptor = Some(tokio::spawn(async move {
            while let Ok((s, _)) = l.accept().await {
                conns.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let (fault, seen) = (fault.clone(), seen.clone());
                tasks.lock().unwrap().spawn(serve_faulty(s, fault, seen));
            }
        }));
    }

    /// Closes the listener and every connection: the upstream now refuses.
    fn stop(&mut self) {
        if let Some(a) = self.acceptor.take() {
            a.abort();
        }
        self.tasks.lock().unwrap().abort_all();
    }

    async fn restart(&mut self) {
        for _ in 0..50 {
            if tokio::net::TcpListener::bind(self.addr).await.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.listen().await;
    }

    fn set(&self, f: Fault) {
        *self.fault.lock().unwrap() = f;
    }

    fn counts(&self) -> BTreeMap<String, usize> {
        let mut m = BTreeMap::new();
        for id in self.seen.lock().unwrap().iter() {
            *m.entry(id.clone()).or_default() += 1;
        }
        m
    }
}

impl Drop for FaultUpstream {
    fn drop(&mut self) {
        self.stop();
    }
}

async fn serve_faulty(
    mut s: tokio::net::TcpStream,
    fault: Arc<Mutex<Fault>>,
    seen: Arc<Mutex<Vec<String>>>,
) {
    let started = Instant::now();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        // one request: the head, then content-length bytes
        let head_end = loop {
            if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break p + 4;
            }
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
        let header = |name: &str| {
            head.lines().find_map(|l| {
                l.strip_prefix(&format!("{name}: "))
                    .map(|v| v.trim().to_string())
            })
        };
        let len: usize = header("content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        while buf.len() < head_end + len {
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        buf.drain(..head_end + len);
        if let Some(id) = header("webhook-id") {
            seen.lock().unwrap().push(id);
        }
        let f = *fault.lock().unwrap();
        match f {
            Fault::Ok => {
                let body = br#"{"ok":true}"#;
                let resp = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                    body.len()
                );
                if s.write_all(resp.as_bytes()).await.is_err() || s.write_all(body).await.is_err() {
                    return;
                }
            }
            Fault::ResetBeforeAnswer => {
                #[allow(deprecated)]
                let _ = s.set_linger(Some(Duration::ZERO));
                return;
            }
            Fault::ResetMidResponse => {
                let _ = s
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\n{\"partial\":")
                    .await;
                let _ = s.flush().await;
                tokio::time::sleep(Duration::from_millis(50)).await;
                #[allow(deprecated)]
                let _ = s.set_linger(Some(Duration::ZERO));
                return;
            }
            Fault::Stall => {
                tokio::time::sleep(Duration::from_secs(30)).await;
                return;
            }
            Fault::EndlessChunked => {
                if s.write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
                    .await
                    .is_err()
                {
                    return;
                }
                let piece = vec![b'x'; 64 * 1024];
                let frame = [
                    format!("{:x}\r\n", piece.len()).into_bytes(),
                    piece,
                    b"\r\n".to_vec(),
                ]
                .concat();
                // until the sidecar hangs up (bounded in time)
                while started.elapsed() < Duration::from_secs(30) {
                    if s.write_all(&frame).await.is_err() {
                        return;
                    }
                }
                return;
            }
            Fault::HugeLength => {
                let _ = s
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 10000000000\r\n\r\n")
                    .await;
                let piece = vec![b'y'; 64 * 1024];
                while started.elapsed() < Duration::from_secs(30) {
                    if s.write_all(&piece).await.is_err() {
                        return;
                    }
                }
                return;
            }
        }
    }
}

fn sc_rss(sc: &Sidecar) -> u64 {
    rss_kib(sc.pid())
}

async fn sample_for(sc: &Sidecar, d: Duration, peak: &mut u64) {
    let end = Instant::now() + d;
    while Instant::now() < end {
        *peak = (*peak).max(sc_rss(sc));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The RSS once it stops falling (bounded wait), for "returns near its baseline".
async fn settle_rss(sc: &Sidecar, baseline: u64) -> u64 {
    let end = Instant::now() + Duration::from_secs(5);
    let mut last = sc_rss(sc);
    while Instant::now() < end && last > baseline * 3 / 2 + 16 * MIB {
        tokio::time::sleep(Duration::from_millis(250)).await;
        last = sc_rss(sc);
    }
    last
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn upstream_refusing_resetting_stalling_and_endless_answers() {
    let _heavy = crate::common::exclusive().await;
    let redis = RedisServer::start_new();
    let mut up = FaultUpstream::start().await;
    let sc = SidecarBuilder::new(&format!("http://{}", up.addr), &redis.url())
        .top("upstream_timeout", "1s")
        .lease("3s")
        .start()
        .await;
    for _ in 0..20 {
        assert_eq!(sc.send(&Delivery::fresh()).await.status, 200);
    }
    // one after the other, the deliveries reuse the pooled upstream connection
    let opened = up.conns.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        opened <= 2,
        "{opened} upstream connections for 20 sequential deliveries"
    );
    let baseline = sc_rss(&sc);
    let mut peak = baseline;
    let bound = Duration::from_secs(1 + 5);

    let cases = [
        (Fault::ResetBeforeAnswer, 502, "upstream_unreachable"),
        (Fault::ResetMidResponse, 502, "upstream_unreachable"),
        (Fault::Stall, 504, "upstream_timeout"),
        (Fault::EndlessChunked, 502, "upstream_response_too_large"),
        (Fault::HugeLength, 502, "upstream_response_too_large"),
    ];
    let mut faulted: Vec<Delivery> = Vec::new();
    for (fault, status, code) in cases {
        up.set(fault);
        let ds: Vec<Delivery> = (0..10).map(|_| Delivery::fresh()).collect();
        let tasks: Vec<_> = ds.iter().map(|d| sc.send_spawned(d)).collect();
        let t = Instant::now();
        for task in tasks {
            let a = task.await.unwrap();
            a.assert_error(status, code);
            assert!(
                a.elapsed < bound,
                "{fault:?}: answered after {:?}",
                a.elapsed
            );
            peak = peak.max(sc_rss(&sc));
        }
        eprintln!(
            "{fault:?}: 10 deliveries answered {status} {code} within {:?}",
            t.elapsed()
        );
        faulted.extend(ds);
    }
    // refusing: nothing listens
    up.stop();
    let ds: Vec<Delivery> = (0..10).map(|_| Delivery::fresh()).collect();
    for d in &ds {
        let a = sc.send(d).await;
        a.assert_error(502, "upstream_unreachable");
        assert!(a.elapsed < bound);
    }
    eprintln!("refusing: 10 deliveries answered 502");
    up.restart().await;
    up.set(Fault::Ok);

    // every claim was released: the provider's retries are forwarded, once each
    assert_no_stuck_claims(&redis, Duration::from_secs(3)).await;
    for d in faulted.iter().chain(ds.iter()) {
        let retry = d.clone().ts(now_secs());
        let a = sc.send(&retry).await;
        assert_eq!(a.status, 200, "{a:?}");
        assert!(!a.replayed());
        let a = sc.send(&retry).await;
        assert!(a.replayed(), "{a:?}");
    }
    let counts = up.counts();
    for d in &faulted {
        assert_eq!(
            counts.get(&d.id),
            Some(&2),
            "{}: the faulted attempt and the retry",
            d.id
        );
    }
    for d in &ds {
        assert_eq!(
            counts.get(&d.id),
            Some(&1),
            "{}: only the retry arrived",
            d.id
        );
    }
    let after = settle_rss(&sc, baseline).await;
    eprintln!("RSS KiB: baseline {baseline}, peak {peak}, after {after}");
    // 20 endless or huge answers were cut at max_response (1 MiB) each
    assert!(
        peak <= baseline + 64 * MIB,
        "RSS peak {peak} KiB vs baseline {baseline} KiB"
    );
    assert!(
        after <= baseline * 3 / 2 + 16 * MIB,
        "RSS {after} KiB vs baseline {baseline} KiB"
    );
    assert_no_secrets(&sc.stderr());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sidecar_killed_9_and_restarted_under_load() {
    let _heavy = crate::common::exclusive().await;
    let lease = Duration::from_secs(2);
    let redis = RedisServer::start_new();
    let up = Upstream::start().await;
    // slow enough that deliveries are in hand when the process dies
    up.set_mode(Mode::Delayed(
        Duration::from_millis(150),
        Box::new(Mode::default_ok()),
    ));
    let builder = SidecarBuilder::new(&up.url(), &redis.url()).lease("2s");
    let mut sc = builder.clone().start().await;
    let to = target(&sc);
    let load = start_load(
        to.clone(),
        8,
        Duration::from_secs(8),
        Duration::from_secs(10),
    );
    load.wait_for(60, Duration::from_secs(5)).await;
    sc.kill9();
    eprintln!("sidecar killed -9 at {} answers", load.count());
    let mut logs = sc.stderr();
    let sc2 = builder.start().await;
    *to.lock().unwrap() = sc2.url(PATH);
    eprintln!("sidecar restarted at {} answers", load.count());
    let sent = load.finish().await;
    drop(sc);

    logs.push_str(&sc2.stderr());
    let f = check_invariants(&sc2, &up, &redis, &sent, &logs, lease, true, false).await;
    eprintln!("kill -9: {f:#?}");
    assert!(f.answered_2xx > 30, "{f:?}");
    assert_no_secrets(&logs);
}

/// The sidecar opts out of transparent huge pages before its first allocation:
/// mimalloc's arena is advised for huge pages, and each touched 2 MiB region would be
/// resident whole (idle RSS 14.5 -> 8.5 MiB without them, BENCHMARKS.md). The kernel
/// reports the process flag and, in smaps, any huge page mapped.
#[tokio::test]
async fn the_sidecar_runs_without_transparent_huge_pages() {
    let _heavy = crate::common::exclusive().await;
    let up = Upstream::start().await;
    let sc = SidecarBuilder::new(&up.url(), "memory").start().await;
    assert_eq!(sc.send(&Delivery::fresh()).await.status, 200);
    let status = std::fs::read_to_string(format!("/proc/{}/status", sc.pid())).unwrap();
    let flag = status
        .lines()
        .find_map(|l| l.strip_prefix("THP_enabled:"))
        .map(str::trim);
    assert_eq!(flag, Some("0"), "THP_enabled line: {flag:?}");
    let smaps = std::fs::read_to_string(format!("/proc/{}/smaps_rollup", sc.pid())).unwrap();
    let huge = smaps
        .lines()
        .find_map(|l| l.strip_prefix("AnonHugePages:"))
        .map(|v| v.trim().trim_end_matches(" kB").trim().to_string());
    assert_eq!(huge.as_deref(), Some("0"), "{smaps}");
}

/// README: "A delivery whose provider hangs up keeps going": the provider gives up
/// (its client times out and closes the connection) while the application works; the
/// sidecar still records the application's answer, so the provider's retry is
/// replayed, not forwarded again.
#[tokio::test]
async fn a_delivery_whose_provider_hangs_up_is_still_completed() {
    let redis = RedisServer::start_new();
    let up = Upstream::start().await;
    up.push_modes(vec![Mode::Stall(Duration::from_millis(800))]);
    let sc = SidecarBuilder::new(&up.url(), &redis.url()).start().await;
    let d = Delivery::fresh();
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(200))
        .build()
        .expect("client");
    let gave_up = post(&impatient, &sc.url(PATH), &d.headers(), d.body.clone()).await;
    assert!(
        gave_up.is_err(),
        "the provider should have timed out: {gave_up:?}"
    );
    up.wait_for_count(1, Duration::from_secs(5)).await;
    // The application answers 0.6 s after the provider left; the retry comes later.
    let end = std::time::Instant::now() + Duration::from_secs(5);
    let retry = loop {
        let a = sc.send(&d).await;
        if a.status != 409 {
            break a;
        }
        assert!(std::time::Instant::now() < end, "still in flight: {a:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(retry.status, 200, "{}", retry.text());
    assert!(
        retry.replayed(),
        "the abandoned delivery's answer was not recorded"
    );
    assert_eq!(up.count(), 1);
}
