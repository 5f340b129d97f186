//! End-to-end: hostile clients holding the listeners. Idle HTTP/2 connections are
//! closed on both listeners, the console's clients cannot take the probes' connections,
//! and guessing the admin token is slowed per client address. (A sibling of
//! `e2e_hostile`, which is already past the size of one file.)

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::common::admin::{OPS_TOKEN, TOKEN, builder};
use crate::common::*;
use crate::e2e_hostile::{read_until_closed, status_of};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The connection preface of HTTP/2 prior knowledge and an empty SETTINGS frame.
const H2_HELLO: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

/// Admin connections open at once before this change (`MAX_ADMIN_CONNECTIONS`).
const ADMIN_CONNECTIONS: usize = 64;

/// `n` connections to `addr` that each send `hello`, then nothing.
async fn hold(addr: SocketAddr, n: usize, hello: &[u8]) -> Vec<TcpStream> {
    let mut held = Vec::with_capacity(n);
    for _ in 0..n {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(hello).await.expect("write");
        held.push(s);
    }
    held
}

/// Every held connection is closed by the server within `within`; panics naming the
/// first still open.
async fn assert_all_closed(held: &mut [TcpStream], within: Duration, what: &str) {
    let end = Instant::now() + within;
    for (i, s) in held.iter_mut().enumerate() {
        let (_, closed) = read_until_closed(s, end.saturating_duration_since(Instant::now())).await;
        assert!(closed, "{what}: connection {i} still open after {within:?}");
    }
}

/// A probe as the kubelet sends it (a fresh HTTP/1.1 connection); its status, or None
/// when the connection is refused, closed or silent for 2 s.
async fn probe(admin: SocketAddr, path: &str) -> Option<u16> {
    let mut s = tokio::time::timeout(Duration::from_secs(2), TcpStream::connect(admin))
        .await
        .ok()?
        .ok()?;
    let head = format!("GET {path} HTTP/1.1\r\nhost: kubelet\r\nconnection: close\r\n\r\n");
    s.write_all(head.as_bytes()).await.ok()?;
    let (out, _) = read_until_closed(&mut s, Duration::from_secs(2)).await;
    status_of(&out)
}

/// The three probes answer 200, each within 2 s.
async fn assert_probes_answer(admin: SocketAddr, what: &str) {
    for path in ["/healthz", "/readyz", "/metrics"] {
        let t = Instant::now();
        let got = probe(admin, path).await;
        assert_eq!(
            got,
            Some(200),
            "{what}: {path} got {got:?} after {:?}",
            t.elapsed()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn idle_h2_connections_are_closed_and_deliveries_get_through_again() {
    let store = TestStore::new(StoreKind::Redis);
    let up = Upstream::start().await;
    let sc = SidecarBuilder::new(&up.url(), &store.url())
        .top("max_connections", "16")
        .top("header_timeout", "2s")
        .start()
        .await;
    // Every slot held by an HTTP/2 connection that said hello and nothing more.
    let mut idle = hold(sc.listen, 16, H2_HELLO).await;
    sc.wait_metric("idemgate_connections", 16.0).await;
    // The server closes them (an HTTP/1 keep-alive connection closes at header_timeout).
    let t = Instant::now();
    assert_all_closed(&mut idle, Duration::from_secs(15), "idle h2 on listen").await;
    eprintln!("16 idle h2 connections closed within {:?}", t.elapsed());
    // And a signed delivery gets through again.
    let d = Delivery::fresh();
    let a = sc.send(&d).await;
    assert_eq!(a.status, 200);
    assert_eq!(up.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stalled_console_logins_leave_the_probes_answering() {
    let redis = RedisServer::start_new();
    let up = Upstream::start().await;
    let sc = builder(&up, &redis)
        .top("header_timeout", "2s")
        .top("body_timeout", "2s")
        .start()
        .await;
    // The head of a login that promises a body and never sends it, on every slot.
    let login =
        b"POST /admin/login HTTP/1.1\r\nhost: x\r\ncontent-type: application/x-www-form-urlencoded\r\ncontent-length: 100\r\n\r\n";
    let mut stalled = hold(sc.admin, ADMIN_CONNECTIONS + 8, login).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_probes_answer(sc.admin, "with stalled logins").await;
    // The login's body is read with a deadline: each one is answered or closed.
    assert_all_closed(&mut stalled, Duration::from_secs(10), "stalled login").await;
    assert_probes_answer(sc.admin, "after the stalled logins").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn idle_h2_connections_on_the_admin_port_leave_the_probes_answering() {
    let redis = RedisServer::start_new();
    let up = Upstream::start().await;
    // No admin_token: the console is off, the variant still worked.
    let sc = SidecarBuilder::new(&up.url(), &redis.url())
        .top("header_timeout", "2s")
        .start()
        .await;
    let mut idle = hold(sc.admin, ADMIN_CONNECTIONS + 8, H2_HELLO).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_probes_answer(sc.admin, "with idle h2 connections").await;
    assert_all_closed(
        &mut idle,
        Duration::from_secs(15),
        "idle h2 on admin_listen",
    )
    .await;
}

/// Connections (more than the probes' 32 slots) that each ask for `/healthz` on a
/// keep-alive connection every 2 s for `period`, reconnecting when the server closes
/// one; how many answers they got.
async fn keep_alive_probes(admin: SocketAddr, n: usize, period: Duration) -> usize {
    let end = tokio::time::Instant::now() + period;
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            tokio::spawn(async move {
                let mut answered = 0;
                let mut conn: Option<TcpStream> = None;
                while tokio::time::Instant::now() < end {
                    if conn.is_none() {
                        conn = TcpStream::connect(admin).await.ok();
                    }
                    if let Some(s) = conn.as_mut() {
                        let asked = s
                            .write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
                            .await
                            .is_ok();
                        let mut buf = [0u8; 1024];
                        let got =
                            tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await;
                        match got {
                            Ok(Ok(n)) if asked && n > 0 => {
                                answered += 1;
                                let head = String::from_utf8_lossy(&buf[..n]).to_ascii_lowercase();
                                if head.contains("connection: close") {
                                    conn = None;
                                }
                            }
                            _ => conn = None,
                        }
                    }
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
                answered
            })
        })
        .collect();
    let mut total = 0;
    for t in tasks {
        total += t.await.expect("keep-alive probe task");
    }
    total
}

/// 40 keep-alive connections asking for `/healthz` every 2 s (issue 34 item 7) took
/// every probe slot and kept it: a fresh `/readyz` was reset. A probe connection is
/// closed after its answer, so the slots turn over and the kubelet's probe answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn keep_alive_probe_connections_leave_a_fresh_probe_answering() {
    let redis = RedisServer::start_new();
    let up = Upstream::start().await;
    let sc = SidecarBuilder::new(&up.url(), &redis.url())
        .top("header_timeout", "10s")
        .start()
        .await;
    let flood = keep_alive_probes(sc.admin, 40, Duration::from_secs(7));
    let fresh = async {
        // Once every flooding connection has asked at least once.
        tokio::time::sleep(Duration::from_millis(2500)).await;
        for round in 0..3 {
            assert_probes_answer(sc.admin, &format!("keep-alive flood, round {round}")).await;
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    };
    let (answered, ()) = tokio::join!(flood, fresh);
    // The flood itself is answered too (each of the 40 at least once).
    assert!(answered >= 40, "the flooding probes got {answered} answers");
}

/// 40 connections that send a probe's request line and stall (issue 34 item 7) held
/// every probe slot for `header_timeout`: a fresh `/readyz` was reset. A probe's head
/// must arrive within a short time, and while the probes' slots are full a probe whose
/// head is in is still answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stalled_probe_request_lines_leave_a_fresh_probe_answering() {
    let redis = RedisServer::start_new();
    let up = Upstream::start().await;
    let sc = SidecarBuilder::new(&up.url(), &redis.url())
        .top("header_timeout", "30s")
        .start()
        .await;
    let mut stalled = hold(sc.admin, 40, b"GET /healthz HTTP/1.1\r\n").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_probes_answer(sc.admin, "with stalled probe request lines").await;
    // A probe whose head comes in two writes is answered too: 503 while the slots
    // are taken, 200 once they are free again; never dropped.
    let mut split = TcpStream::connect(sc.admin).await.expect("connect");
    split
        .write_all(b"GET /readyz HTTP/1.1\r\n")
        .await
        .expect("write");
    tokio::time::sleep(Duration::from_millis(100)).await;
    split.write_all(b"host: x\r\n\r\n").await.expect("write");
    let (out, closed) = read_until_closed(&mut split, Duration::from_secs(5)).await;
    let status = status_of(&out);
    assert!(
        matches!(status, Some(200 | 503)) && closed,
        "a probe in two writes got {status:?} (closed: {closed}): {}",
        String::from_utf8_lossy(&out)
    );
    // And the stalled ones are closed well before `header_timeout`.
    assert_all_closed(&mut stalled, Duration::from_secs(10), "stalled probe line").await;
    assert_probes_answer(sc.admin, "after the stalled probe request lines").await;
}

/// Wrong bearer tokens sent by `workers` clients at once from `from` for `period`;
/// how many were answered 401 in that time.
async fn guess(sc: &Sidecar, from: &str, workers: usize, period: Duration) -> usize {
    let client = reqwest::Client::builder()
        .local_address(from.parse::<std::net::IpAddr>().ok())
        .build()
        .expect("client");
    let end = tokio::time::Instant::now() + period;
    let tasks: Vec<_> = (0..workers)
        .map(|w| {
            let client = client.clone();
            let url = sc.admin_url("/admin/deliveries");
            tokio::spawn(async move {
                let mut refused = 0;
                let run = async {
                    for i in 0.. {
                        let r = client
                            .get(&url)
                            .bearer_auth(format!("guess-{w}-{i}-0123456789abcdef"))
                            .send()
                            .await;
                        match r {
                            Ok(r) if r.status().as_u16() == 401 => refused += 1,
                            other => panic!("a wrong token got {other:?}"),
                        }
                    }
                };
                let _ = tokio::time::timeout_at(end, run).await;
                refused
            })
        })
        .collect();
    let mut total = 0;
    for t in tasks {
        total += t.await.expect("guessing task");
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn guessing_the_admin_token_is_slowed_per_address_and_a_right_token_is_not() {
    let redis = RedisServer::start_new();
    let up = Upstream::start().await;
    let sc = builder(&up, &redis).start().await;
    let guessing = {
        let sc = &sc;
        async move { guess(sc, "127.0.0.1", 8, Duration::from_secs(3)).await }
    };
    // While one address guesses, the right token (from the same address) is not slowed.
    let right = async {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let t = Instant::now();
        let a = crate::common::admin::api(&sc, "GET", "/admin/deliveries", Some(OPS_TOKEN)).await;
        (a.status, t.elapsed())
    };
    let (refused, (status, took)) = tokio::join!(guessing, right);
    eprintln!("3 s of guessing from one address: {refused} wrong tokens answered");
    assert!(
        refused <= 30,
        "{refused} wrong tokens answered in 3 s from one address"
    );
    assert_eq!(status, 200);
    assert!(
        took < Duration::from_secs(1),
        "the right token took {took:?}"
    );
    // Another address is not slowed by the first one's failures.
    let t = Instant::now();
    let other = guess(&sc, "127.0.0.2", 1, Duration::from_millis(500)).await;
    assert!(
        other >= 5,
        "{other} guesses from another address in 0.5 s ({:?})",
        t.elapsed()
    );
    // The audit log does not get a line per guess.
    let lines = sc
        .stderr()
        .lines()
        .filter(|l| l.contains("admin API request refused"))
        .count();
    assert!(
        lines <= 30,
        "{lines} refusals logged for {refused} + {other} guesses"
    );
    assert_eq!(
        crate::common::admin::api(&sc, "GET", "/admin/deliveries", Some(TOKEN))
            .await
            .status,
        200
    );
}
