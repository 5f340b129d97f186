//! End-to-end: idemgate's connections to the application (README, "The forwarded
//! request carries…"; docs/reliability.md, "The application closes a keep-alive
//! connection"): deliveries reuse one keep-alive connection, and an application that
//! closes each connection once it has answered still gets every delivery, once.
//! The application is a scripted raw-TCP server counting the connections it accepts.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::common::*;

#[derive(Default)]
struct Seen {
    accepts: AtomicUsize,
    requests: AtomicUsize,
}

/// Reads one request (head and `content-length` body); false at end-of-file.
fn read_request(stream: &mut TcpStream) -> bool {
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
                return true;
            }
        }
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => return false,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// An application answering 200 to `per_connection` requests on each connection, then
/// closing it (no `Connection: close`: as a keep-alive timeout does).
fn application(per_connection: usize) -> (SocketAddr, Arc<Seen>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Seen::default());
    let s = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            s.accepts.fetch_add(1, Ordering::SeqCst);
            let s = s.clone();
            std::thread::spawn(move || {
                for _ in 0..per_connection {
                    if !read_request(&mut stream) {
                        return;
                    }
                    s.requests.fetch_add(1, Ordering::SeqCst);
                    let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                    if stream.write_all(ok).is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, seen)
}

async fn sidecar(app: SocketAddr) -> Sidecar {
    // One worker thread: one idle list, so reuse is exact.
    SidecarBuilder::new(&format!("http://{app}"), "memory")
        .top("worker_threads", "1")
        .start()
        .await
}

#[tokio::test]
async fn deliveries_reuse_one_connection_to_the_application() {
    let (app, seen) = application(usize::MAX);
    let sc = sidecar(app).await;
    for _ in 0..3 {
        let a = sc.send(&Delivery::fresh()).await;
        assert_eq!(a.status, 200);
    }
    assert_eq!(seen.requests.load(Ordering::SeqCst), 3);
    assert_eq!(seen.accepts.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn an_application_closing_each_idle_connection_gets_every_delivery_once() {
    let (app, seen) = application(1);
    let sc = sidecar(app).await;
    for i in 1..=3 {
        let a = sc.send(&Delivery::fresh()).await;
        assert_eq!(a.status, 200, "delivery {i}");
        assert_eq!(seen.requests.load(Ordering::SeqCst), i);
        // Idle past the resend threshold (250 ms): whether or not idemgate noticed the
        // close before the next delivery, that delivery reaches the application once.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_eq!(seen.accepts.load(Ordering::SeqCst), 3);
}
