//! The forwarded request's shape, and the client's connections against scripted
//! applications (raw TCP on loopback, one thread per connection): reuse, a connection
//! closed while idle, sending once more and when not, the idle list's bounds.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use super::*;

#[test]
fn headers_round_trip_through_storage() {
    let mut h = HeaderMap::new();
    h.insert("content-type", HeaderValue::from_static("application/json"));
    h.append("set-cookie", HeaderValue::from_static("a=1"));
    h.append("set-cookie", HeaderValue::from_static("b=2: c"));
    h.insert("x-bin", HeaderValue::from_bytes(b"caf\xe9").unwrap());
    let mut back = HeaderMap::new();
    decode_headers(&encode_headers(&h), &mut back);
    assert_eq!(back, h);
}

#[test]
fn hop_by_hop_headers_are_dropped() {
    let mut h = HeaderMap::new();
    h.insert(
        "connection",
        HeaderValue::from_static("keep-alive, x-conn-only"),
    );
    h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
    h.insert("x-conn-only", HeaderValue::from_static("1"));
    h.insert("transfer-encoding", HeaderValue::from_static("chunked"));
    h.insert("te", HeaderValue::from_static("trailers"));
    h.insert("upgrade", HeaderValue::from_static("websocket"));
    h.insert("proxy-authorization", HeaderValue::from_static("Basic x"));
    h.insert("proxy-status", HeaderValue::from_static("edge"));
    h.insert("proxy-x-tenant", HeaderValue::from_static("acme"));
    h.insert("host", HeaderValue::from_static("example.com"));
    h.insert("x-end", HeaderValue::from_static("1"));
    let e = end_to_end(&h);
    assert_eq!(e.len(), 2);
    assert!(e.contains_key("host") && e.contains_key("x-end"));
}

/// What a scripted application saw.
#[derive(Default)]
struct Seen {
    accepts: AtomicUsize,
    /// (connection number, request head and body) in arrival order.
    requests: Mutex<Vec<(usize, String)>>,
    /// Connections on which the application read end-of-file from idemgate.
    closed_by_client: AtomicUsize,
}

impl Seen {
    fn requests_on(&self, conn: usize) -> usize {
        self.requests
            .lock()
            .unwrap()
            .iter()
            .filter(|(c, _)| *c == conn)
            .count()
    }
}

/// An application on loopback whose every connection runs `script(n, stream, seen)`.
fn application(
    script: impl Fn(usize, TcpStream, &Seen) + Send + Sync + 'static,
) -> (SocketAddr, Arc<Seen>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Seen::default());
    let script = Arc::new(script);
    let s = seen.clone();
    std::thread::spawn(move || {
        for (n, stream) in listener.incoming().enumerate() {
            let Ok(stream) = stream else { return };
            s.accepts.fetch_add(1, Ordering::SeqCst);
            let (script, s) = (script.clone(), s.clone());
            std::thread::spawn(move || script(n, stream, &s));
        }
    });
    (addr, seen)
}

/// Reads one request (head and `content-length` body); `None` at end-of-file.
fn read_request(stream: &mut TcpStream, conn: usize, seen: &Seen) -> Option<String> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
            let len = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map_or(0, |v| v.trim().parse::<usize>().unwrap());
            if buf.len() >= end + 4 + len {
                let text = String::from_utf8_lossy(&buf).into_owned();
                seen.requests.lock().unwrap().push((conn, text.clone()));
                return Some(text);
            }
        }
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => {
                if buf.is_empty() {
                    seen.closed_by_client.fetch_add(1, Ordering::SeqCst);
                }
                return None;
            }
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

const OK: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";

/// Answers every request on the connection until idemgate closes it.
fn answer_all(conn: usize, mut stream: TcpStream, seen: &Seen) {
    while read_request(&mut stream, conn, seen).is_some() {
        stream.write_all(OK).unwrap();
    }
}

fn upstream_at(addr: SocketAddr, limits: PoolLimits) -> Upstream {
    let uri: Uri = format!("http://{addr}").parse().unwrap();
    Upstream::with_limits(&uri, Duration::from_secs(10), 1024, limits)
}

async fn deliver(up: &Upstream) -> Result<UpstreamResponse, UpstreamError> {
    let mut headers = HeaderMap::new();
    headers.insert("content-type", HeaderValue::from_static("application/json"));
    headers.insert("connection", HeaderValue::from_static("x-hop"));
    headers.insert("x-hop", HeaderValue::from_static("1"));
    up.forward(Outgoing {
        method: &Method::POST,
        path_and_query: "/hook?q=1",
        headers,
        body: Bytes::from_static(b"{\"id\":1}"),
        authority: None,
        idempotency_key: Some(HeaderValue::from_static("github:42")),
        traceparent: None,
    })
    .await
}

/// Waits (bounded, letting the runtime run) until `cond` holds.
async fn eventually(what: &str, cond: impl Fn() -> bool) {
    for _ in 0..500 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("never happened: {what}");
}

#[tokio::test]
async fn two_deliveries_share_one_connection_and_go_out_as_sent() {
    let (addr, seen) = application(answer_all);
    let up = upstream_at(addr, PoolLimits::default());
    for _ in 0..2 {
        let r = deliver(&up).await.unwrap();
        assert_eq!((r.status, &r.body[..]), (StatusCode::OK, &b"ok"[..]));
    }
    assert_eq!(seen.accepts.load(Ordering::SeqCst), 1);
    assert_eq!(seen.requests_on(0), 2);
    assert_eq!(up.pool.idle_here(), 1);
    let first = seen.requests.lock().unwrap()[0].1.clone();
    assert!(first.starts_with("POST /hook?q=1 HTTP/1.1\r\n"), "{first}");
    // No Host and no authority: the upstream's own, as hyper-util's client sent it.
    assert!(first.contains(&format!("host: {addr}\r\n")), "{first}");
    assert!(first.contains("idempotency-key: github:42\r\n"), "{first}");
    assert!(
        !first.contains("x-hop") && !first.contains("connection:"),
        "{first}"
    );
    assert!(first.ends_with("\r\n\r\n{\"id\":1}"), "{first}");
}

#[tokio::test]
async fn a_connection_the_application_closed_while_idle_is_replaced() {
    let (addr, seen) = application(|conn, mut stream, seen| {
        if conn == 0 {
            read_request(&mut stream, conn, seen).unwrap();
            stream.write_all(OK).unwrap();
            // Closed once idle, as an application's keep-alive timeout does.
        } else {
            answer_all(conn, stream, seen)
        }
    });
    let up = upstream_at(addr, PoolLimits::default());
    deliver(&up).await.unwrap();
    // Let idemgate's connection task see the end-of-file.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let r = deliver(&up).await.unwrap();
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(seen.accepts.load(Ordering::SeqCst), 2);
    assert_eq!((seen.requests_on(0), seen.requests_on(1)), (1, 1));
}

/// The application closed the idle connection, and idemgate had not noticed yet when
/// the next delivery took it (the test's runtime is blocked while the application
/// closes): hyper writes the request and reads end-of-file, no byte of an answer; the
/// request goes out once more, on a new connection, and is answered once.
#[tokio::test]
async fn a_connection_closed_while_idle_but_not_yet_noticed_gets_the_request_once_more() {
    let (close_tx, close_rx) = mpsc::channel::<()>();
    let (closed_tx, closed_rx) = mpsc::channel::<()>();
    let close_rx = Mutex::new(Some(close_rx));
    let (addr, seen) = application(move |conn, mut stream, seen| {
        if conn == 0 {
            read_request(&mut stream, conn, seen).unwrap();
            stream.write_all(OK).unwrap();
            let rx = close_rx.lock().unwrap().take().unwrap();
            rx.recv_timeout(Duration::from_secs(10)).unwrap();
            drop(stream);
            closed_tx.send(()).unwrap();
        } else {
            answer_all(conn, stream, seen)
        }
    });
    let limits = PoolLimits {
        resend_after_idle: Duration::ZERO,
        ..PoolLimits::default()
    };
    let up = upstream_at(addr, limits);
    deliver(&up).await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    close_tx.send(()).unwrap();
    closed_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let r = deliver(&up).await.unwrap();
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(seen.accepts.load(Ordering::SeqCst), 2);
    assert_eq!((seen.requests_on(0), seen.requests_on(1)), (1, 1));
}

/// The application reads the next request on a connection idle for a while and closes
/// without a byte of answer (its keep-alive timeout fired as the request came): it is
/// sent once more on a new connection and answered there, once.
#[tokio::test]
async fn a_request_dropped_unanswered_by_a_long_idle_connection_is_sent_once_more() {
    let (addr, seen) = application(|conn, mut stream, seen| {
        if conn == 0 {
            read_request(&mut stream, conn, seen).unwrap();
            stream.write_all(OK).unwrap();
            read_request(&mut stream, conn, seen).unwrap();
        } else {
            answer_all(conn, stream, seen)
        }
    });
    let limits = PoolLimits {
        resend_after_idle: Duration::ZERO,
        ..PoolLimits::default()
    };
    let up = upstream_at(addr, limits);
    deliver(&up).await.unwrap();
    let r = deliver(&up).await.unwrap();
    assert_eq!((r.status, &r.body[..]), (StatusCode::OK, &b"ok"[..]));
    assert_eq!(seen.accepts.load(Ordering::SeqCst), 2);
    // The dropped copy was read but never answered; the answered one came once.
    assert_eq!((seen.requests_on(0), seen.requests_on(1)), (2, 1));
}

/// Under load connections are idle for far less than `resend_after_idle`: no copy is
/// kept, and a request the application dropped unanswered fails (502) as it did with
/// hyper-util's client.
#[tokio::test]
async fn a_briefly_idle_connection_dropping_the_request_is_not_resent() {
    let (addr, seen) = application(|conn, mut stream, seen| {
        read_request(&mut stream, conn, seen).unwrap();
        stream.write_all(OK).unwrap();
        read_request(&mut stream, conn, seen).unwrap();
    });
    let up = upstream_at(addr, PoolLimits::default());
    deliver(&up).await.unwrap();
    let r = deliver(&up).await;
    assert!(matches!(r, Err(UpstreamError::Unreachable(_))), "{r:?}");
    assert_eq!(seen.accepts.load(Ordering::SeqCst), 1);
}

/// Part of an answer arrived (a head cut short, or a body): the application acted on
/// the request, and it is never sent again.
#[tokio::test]
async fn no_resend_after_part_of_the_answer() {
    for partial in [
        &b"HTTP/1.1 200 OK\r\ncontent-le"[..],
        &b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc"[..],
    ] {
        let (addr, seen) = application(move |conn, mut stream, seen| {
            read_request(&mut stream, conn, seen).unwrap();
            stream.write_all(OK).unwrap();
            read_request(&mut stream, conn, seen).unwrap();
            stream.write_all(partial).unwrap();
        });
        let limits = PoolLimits {
            resend_after_idle: Duration::ZERO,
            ..PoolLimits::default()
        };
        let up = upstream_at(addr, limits);
        deliver(&up).await.unwrap();
        let r = deliver(&up).await;
        assert!(matches!(r, Err(UpstreamError::Unreachable(_))), "{r:?}");
        assert_eq!(seen.accepts.load(Ordering::SeqCst), 1);
        assert_eq!(seen.requests.lock().unwrap().len(), 2);
    }
}

#[tokio::test]
async fn no_resend_on_a_new_connection() {
    let (addr, seen) = application(|conn, mut stream, seen| {
        read_request(&mut stream, conn, seen).unwrap();
    });
    let limits = PoolLimits {
        resend_after_idle: Duration::ZERO,
        ..PoolLimits::default()
    };
    let up = upstream_at(addr, limits);
    let r = deliver(&up).await;
    assert!(matches!(r, Err(UpstreamError::Unreachable(_))), "{r:?}");
    assert_eq!(seen.accepts.load(Ordering::SeqCst), 1);
    assert_eq!(seen.requests.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn the_idle_list_keeps_at_most_max_idle_and_closes_the_rest() {
    // Each connection answers its first request only once four have arrived, so the
    // four deliveries need four connections.
    let (addr, seen) = application(|conn, mut stream, seen| {
        read_request(&mut stream, conn, seen).unwrap();
        for _ in 0..1000 {
            if seen.requests.lock().unwrap().len() >= 4 {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        stream.write_all(OK).unwrap();
        answer_all(conn, stream, seen)
    });
    let limits = PoolLimits {
        max_idle: 2,
        ..PoolLimits::default()
    };
    let up = upstream_at(addr, limits);
    let (a, b, c, d) = tokio::join!(deliver(&up), deliver(&up), deliver(&up), deliver(&up));
    for r in [a, b, c, d] {
        assert_eq!(r.unwrap().status, StatusCode::OK);
    }
    assert_eq!(seen.accepts.load(Ordering::SeqCst), 4);
    assert_eq!(up.pool.idle_here(), 2);
    eventually("two connections closed", || {
        seen.closed_by_client.load(Ordering::SeqCst) == 2
    })
    .await;
    // The two kept serve the next deliveries.
    deliver(&up).await.unwrap();
    deliver(&up).await.unwrap();
    assert_eq!(seen.accepts.load(Ordering::SeqCst), 4);
}

#[tokio::test]
async fn a_connection_idle_past_the_idle_timeout_is_closed_not_reused() {
    let (addr, seen) = application(answer_all);
    let limits = PoolLimits {
        idle_timeout: Duration::from_millis(50),
        ..PoolLimits::default()
    };
    let up = upstream_at(addr, limits);
    deliver(&up).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    deliver(&up).await.unwrap();
    assert_eq!(seen.accepts.load(Ordering::SeqCst), 2);
    eventually("the expired connection closed", || {
        seen.closed_by_client.load(Ordering::SeqCst) == 1
    })
    .await;
}

#[tokio::test]
async fn an_answer_over_max_response_drops_its_connection() {
    let (addr, seen) = application(|conn, mut stream, seen| {
        while read_request(&mut stream, conn, seen).is_some() {
            let big = format!(
                "HTTP/1.1 200 OK\r\ncontent-length: 2000\r\n\r\n{}",
                "x".repeat(2000)
            );
            if stream.write_all(big.as_bytes()).is_err() {
                return;
            }
        }
    });
    let up = upstream_at(addr, PoolLimits::default());
    let r = deliver(&up).await;
    assert!(matches!(r, Err(UpstreamError::TooLarge)), "{r:?}");
    assert_eq!(up.pool.idle_here(), 0);
    eventually("the connection closed", || {
        seen.closed_by_client.load(Ordering::SeqCst) == 1
    })
    .await;
}
