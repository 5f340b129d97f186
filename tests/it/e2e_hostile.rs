//! End-to-end: hostile input. Every malformed, oversized, slow or replayed request
//! gets a clear 4xx (or its connection is closed within its timeout), and nothing
//! reaches the store or the upstream. Also: the limits on connections and deliveries
//! in hand, HTTP/2, and that no secret shows in logs, metrics, answers or check-config.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::common::*;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Store + upstream + sidecar, dropped sidecar first.
struct Env {
    sc: Sidecar,
    up: Upstream,
    store: TestStore,
}

/// The three route kinds a key can come from: header (default), JSON, form.
async fn hostile_env(cfg: impl FnOnce(SidecarBuilder) -> SidecarBuilder) -> Env {
    let store = TestStore::new(StoreKind::Redis);
    let up = Upstream::start().await;
    let b = SidecarBuilder::new(&up.url(), &store.url())
        .top("max_body", "256KiB")
        .top("header_timeout", "2s")
        .top("body_timeout", "2s")
        .route(RouteCfg::standard(ROUTE, PATH))
        .route(RouteCfg::standard("js", "/webhooks/js").key("json:/id"))
        .route(RouteCfg::standard("fm", "/webhooks/fm").key("form:id"));
    let sc = cfg(b).start().await;
    Env { sc, up, store }
}

/// Nothing was stored and nothing forwarded.
fn assert_untouched(e: &Env) {
    assert_eq!(
        e.store.redis().cli(&["DBSIZE"]),
        "0",
        "the store holds keys: {:?}",
        e.store.redis().keys()
    );
    assert_eq!(e.up.count(), 0, "the upstream was called");
}

/// Secrets configured in these tests never appear in what the sidecar wrote.
fn assert_no_secrets(sc: &Sidecar) {
    sc.assert_log_lacks(&[SECRET, SECRET_2, "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]);
}

/// Writes `bytes` on a fresh connection, then reads until the server closes or
/// `deadline` passes. Returns (what was read, whether the server closed).
pub(crate) async fn raw(addr: SocketAddr, bytes: &[u8], deadline: Duration) -> (Vec<u8>, bool) {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let _ = s.write_all(bytes).await;
    let _ = s.flush().await;
    read_until_closed(&mut s, deadline).await
}

pub(crate) async fn read_until_closed(
    s: &mut tokio::net::TcpStream,
    deadline: Duration,
) -> (Vec<u8>, bool) {
    let mut out = Vec::new();
    let end = Instant::now() + deadline;
    let mut buf = [0u8; 8192];
    loop {
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return (out, false);
        }
        match tokio::time::timeout(left, s.read(&mut buf)).await {
            Err(_) => return (out, false),
            Ok(Ok(0)) | Ok(Err(_)) => return (out, true),
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
        }
    }
}

/// The status of the first HTTP/1.1 answer in `bytes`.
pub(crate) fn status_of(bytes: &[u8]) -> Option<u16> {
    let text = String::from_utf8_lossy(bytes);
    let line = text.lines().next()?;
    line.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()
}

/// A request head for `d` with `content-length`, as raw bytes.
fn head_of(d: &Delivery, extra: &str) -> String {
    let mut h = format!("POST {} HTTP/1.1\r\nhost: idemgate.test\r\n", d.path);
    for (k, v) in d.headers() {
        h.push_str(&format!("{k}: {v}\r\n"));
    }
    h.push_str(extra);
    h.push_str("\r\n");
    h
}

fn json_delivery(path: &str, body: &[u8]) -> Delivery {
    Delivery::new(&unique_id("msg"), body.to_vec()).path(path)
}

// ---------------------------------------------------------------------------
// the table
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hostile_input_table_gets_4xx_and_touches_nothing() {
    let e = hostile_env(|b| b).await;
    let long_key = "k".repeat(10 * 1024);
    let many_sigs = vec!["v1,Zm9vYmFy"; 2000].join(" ");
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let wide = format!("{{\"a\":[{}{{}}]}}", "{},".repeat(60_000));
    let id_deep = format!("{{\"id\":{}1{}}}", "[".repeat(100), "]".repeat(100));

    // (what, delivery, expected status, expected error code)
    let cases: Vec<(&str, Delivery, u16, &str)> = vec![
        (
            "no webhook-id",
            Delivery::fresh().omit("webhook-id"),
            400,
            "bad_request",
        ),
        (
            "no webhook-timestamp",
            Delivery::fresh().omit("webhook-timestamp"),
            400,
            "bad_request",
        ),
        (
            "no webhook-signature",
            Delivery::fresh().omit("webhook-signature"),
            400,
            "bad_request",
        ),
        (
            "webhook-id sent twice, different values",
            Delivery::fresh().header("webhook-id", "other"),
            400,
            "bad_request",
        ),
        (
            "signature sent twice, different values",
            Delivery::fresh()
                .signature("v1,garbage")
                .header("webhook-signature", "v1,also-garbage"),
            400,
            "bad_request",
        ),
        (
            "garbage base64",
            Delivery::fresh().signature("v1,!!!not*base64%%%"),
            401,
            "invalid_signature",
        ),
        (
            "bare garbage",
            Delivery::fresh().signature(",,,,   ,v1"),
            401,
            "invalid_signature",
        ),
        (
            "2000 signature entries",
            Delivery::fresh().signature(&many_sigs),
            401,
            "invalid_signature",
        ),
        (
            "unknown versions only",
            Delivery::fresh().signature("v9,Zm9v v2,YmFy"),
            401,
            "invalid_signature",
        ),
        (
            "wrong secret",
            Delivery::fresh().secret(SECRET_WRONG),
            401,
            "invalid_signature",
        ),
        (
            "timestamp overflows i64",
            Delivery::fresh().timestamp_raw("99999999999999999999999"),
            400,
            "bad_request",
        ),
        (
            "timestamp i64::MAX",
            Delivery::fresh().timestamp_raw("9223372036854775807"),
            401,
            "invalid_signature",
        ),
        (
            "timestamp i64::MIN",
            Delivery::fresh().timestamp_raw("-9223372036854775808"),
            401,
            "invalid_signature",
        ),
        (
            "timestamp not a number",
            Delivery::fresh().timestamp_raw("1e9"),
            400,
            "bad_request",
        ),
        (
            "timestamp empty",
            Delivery::fresh().timestamp_raw(""),
            400,
            "bad_request",
        ),
        (
            "timestamp an hour old",
            Delivery::fresh().ts(now_secs() - 3600),
            401,
            "invalid_signature",
        ),
        (
            "timestamp an hour ahead",
            Delivery::fresh().ts(now_secs() + 3600),
            401,
            "invalid_signature",
        ),
        (
            "header key 10 KB long",
            Delivery::new(&long_key, "{}"),
            400,
            "bad_request",
        ),
        (
            "header key with a tab",
            Delivery::new("evt\tone", "{}"),
            400,
            "bad_request",
        ),
        (
            "json key with a control char",
            json_delivery("/webhooks/js", br#"{"id":"a\u0001b"}"#),
            400,
            "bad_request",
        ),
        (
            "json key with a newline",
            json_delivery("/webhooks/js", br#"{"id":"a\nb"}"#),
            400,
            "bad_request",
        ),
        (
            "json key 10 KB long",
            json_delivery(
                "/webhooks/js",
                format!(r#"{{"id":"{long_key}"}}"#).as_bytes(),
            ),
            400,
            "bad_request",
        ),
        (
            "json key an object",
            json_delivery("/webhooks/js", br#"{"id":{"a":1}}"#),
            400,
            "bad_request",
        ),
        (
            "json key an array",
            json_delivery("/webhooks/js", br#"{"id":[1,2]}"#),
            400,
            "bad_request",
        ),
        (
            "json key deep inside arrays",
            json_delivery("/webhooks/js", id_deep.as_bytes()),
            400,
            "bad_request",
        ),
        (
            "json nested 100 000 deep",
            json_delivery("/webhooks/js", deep.as_bytes()),
            400,
            "bad_request",
        ),
        (
            "json 60 000 objects, no key",
            json_delivery("/webhooks/js", wide.as_bytes()),
            400,
            "bad_request",
        ),
        (
            "json lone surrogate",
            json_delivery("/webhooks/js", br#"{"id":"\ud800"}"#),
            400,
            "bad_request",
        ),
        (
            "json truncated",
            json_delivery("/webhooks/js", br#"{"id":"abc"#),
            400,
            "bad_request",
        ),
        (
            "json not utf-8",
            json_delivery("/webhooks/js", b"{\"id\":\"\xff\xfe\"}"),
            400,
            "bad_request",
        ),
        (
            "form key invalid utf-8",
            json_delivery("/webhooks/fm", b"id=%FF%FE"),
            400,
            "bad_request",
        ),
        (
            "form key half a utf-8 char",
            json_delivery("/webhooks/fm", b"id=ab%C3"),
            400,
            "bad_request",
        ),
        (
            "form key a NUL",
            json_delivery("/webhooks/fm", b"id=%00"),
            400,
            "bad_request",
        ),
        (
            "form key empty",
            json_delivery("/webhooks/fm", b"id="),
            400,
            "bad_request",
        ),
        (
            "form key twice, different",
            json_delivery("/webhooks/fm", b"id=a&id=b"),
            400,
            "bad_request",
        ),
        (
            "form garbage",
            json_delivery("/webhooks/fm", b"&&&=&%%%=%zz"),
            400,
            "bad_request",
        ),
        (
            "no route",
            Delivery::fresh().path("/webhooks/nope"),
            404,
            "no_route",
        ),
    ];
    let n = cases.len();
    for (what, d, status, code) in cases {
        let a =
            e.sc.try_send(&d)
                .await
                .unwrap_or_else(|err| panic!("{what}: {err:?}"));
        assert_eq!(a.status, status, "{what}: {:?}", a.text());
        a.assert_error(status, code);
        assert!(!a.text().contains(SECRET), "{what}");
    }
    eprintln!("{n} hostile deliveries: each got its 4xx");

    assert_untouched(&e);
    assert_no_secrets(&e.sc);
}

/// A signed header (or the key, or the signature) sent twice with different values is
/// refused 400 in either order: the application must never read a value nobody signed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_signed_header_sent_twice_with_different_values_is_400() {
    let e = hostile_env(|b| b).await;
    let now = now_secs();
    let unsigned_ts = (now - 60).to_string();
    let cases: Vec<(&str, Delivery)> = vec![
        (
            "webhook-timestamp twice, the signed one first",
            Delivery::fresh().header("webhook-timestamp", &unsigned_ts),
        ),
        (
            "webhook-timestamp twice, the signed one second",
            Delivery::fresh()
                .timestamp_raw(&unsigned_ts)
                .header("webhook-timestamp", &now.to_string()),
        ),
        (
            "webhook-signature twice, the valid one first",
            Delivery::fresh().header("webhook-signature", "v1,Zm9vYmFy"),
        ),
        (
            "webhook-id twice, the signed one first",
            Delivery::fresh().header("webhook-id", "msg_unsigned"),
        ),
    ];
    for (what, d) in cases {
        let a = e.sc.send(&d.ts(now)).await;
        assert_eq!(a.status, 400, "{what}: {} {:?}", a.status, a.text());
        a.assert_error(400, "bad_request");
    }
    assert_untouched(&e);
    // the same value twice is still one value
    let d = Delivery::fresh().ts(now);
    let a =
        e.sc.send(&d.clone().header("webhook-timestamp", &now.to_string()))
            .await;
    assert_eq!(a.status, 200, "{:?}", a.text());
    assert_eq!(e.up.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hostile_raw_requests_get_4xx_or_are_closed() {
    let e = hostile_env(|b| b).await;
    let addr = e.sc.listen;
    let wait = Duration::from_secs(7);

    // a 1 GB announced body: 413 at once, connection closed, nothing read
    let d = Delivery::fresh();
    let head = head_of(&d, "content-length: 1000000000\r\n");
    let (out, closed) = raw(addr, head.as_bytes(), wait).await;
    assert_eq!(
        status_of(&out),
        Some(413),
        "{}",
        String::from_utf8_lossy(&out)
    );
    assert!(closed, "a 413 closes the connection");

    // a chunked body larger than max_body: 413 while streaming
    let d = Delivery::fresh().body(vec![b'a'; 300 * 1024]);
    let mut req = head_of(&d, "transfer-encoding: chunked\r\n").into_bytes();
    for chunk in d.body.chunks(16 * 1024) {
        req.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        req.extend_from_slice(chunk);
        req.extend_from_slice(b"\r\n");
    }
    req.extend_from_slice(b"0\r\n\r\n");
    let (out, _) = raw(addr, &req, wait).await;
    assert_eq!(
        status_of(&out),
        Some(413),
        "{}",
        String::from_utf8_lossy(&out)
    );

    // a malformed chunk size: 400 (the body cannot be read) or closed
    let d = Delivery::fresh();
    let mut req = head_of(&d, "transfer-encoding: chunked\r\n").into_bytes();
    req.extend_from_slice(b"zz\r\nhello\r\n0\r\n\r\n");
    let (out, closed) = raw(addr, &req, wait).await;
    let st = status_of(&out);
    assert!(
        st.is_some_and(|s| (400..500).contains(&s)) || (out.is_empty() && closed),
        "malformed chunk: {}",
        String::from_utf8_lossy(&out)
    );

    // both content-length and transfer-encoding (request smuggling): refused
    let d = Delivery::fresh();
    let mut req = head_of(
        &d,
        &format!(
            "content-length: {}\r\ntransfer-encoding: chunked\r\n",
            d.body.len()
        ),
    )
    .into_bytes();
    req.extend_from_slice(&d.body);
    let (out, closed) = raw(addr, &req, wait).await;
    let st = status_of(&out);
    assert!(
        st.is_some_and(|s| (400..500).contains(&s)) || (st.is_none() && closed),
        "CL+TE: {}",
        String::from_utf8_lossy(&out)
    );

    // a webhook-id that is not UTF-8 (obs-text bytes): 400
    let mut req = format!("POST {PATH} HTTP/1.1\r\nhost: x\r\nwebhook-id: ").into_bytes();
    req.extend_from_slice(b"evt\xff\xfe");
    let ts = now_secs();
    req.extend_from_slice(
        format!(
            "\r\nwebhook-timestamp: {ts}\r\nwebhook-signature: v1,Zm9v\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{{}}"
        )
        .as_bytes(),
    );
    let (out, _) = raw(addr, &req, wait).await;
    assert_eq!(
        status_of(&out),
        Some(400),
        "{}",
        String::from_utf8_lossy(&out)
    );

    // a control character in a header value: refused by the HTTP parser
    let req = format!(
        "POST {PATH} HTTP/1.1\r\nhost: x\r\nwebhook-id: a\x01b\r\ncontent-length: 0\r\n\r\n"
    );
    let (out, closed) = raw(addr, req.as_bytes(), wait).await;
    assert!(
        status_of(&out).is_some_and(|s| (400..500).contains(&s)) || (out.is_empty() && closed),
        "control char: {}",
        String::from_utf8_lossy(&out)
    );

    // a header larger than the head limit (64 KiB): 431 or closed
    let d = Delivery::fresh();
    let head = head_of(
        &d,
        &format!(
            "x-padding: {}\r\ncontent-length: 0\r\n",
            "p".repeat(100 * 1024)
        ),
    );
    let (out, closed) = raw(addr, head.as_bytes(), wait).await;
    assert!(
        status_of(&out) == Some(431) || (out.is_empty() && closed),
        "oversized header: {}",
        String::from_utf8_lossy(&out)
    );

    // 200 headers (over hyper's count limit): 431
    let mut req = format!("POST {PATH} HTTP/1.1\r\nhost: x\r\n");
    for i in 0..200 {
        req.push_str(&format!("x-h{i}: v\r\n"));
    }
    req.push_str("content-length: 0\r\n\r\n");
    let (out, closed) = raw(addr, req.as_bytes(), wait).await;
    assert!(
        status_of(&out).is_some_and(|s| (400..500).contains(&s)) || (out.is_empty() && closed),
        "200 headers: {}",
        String::from_utf8_lossy(&out)
    );

    assert_untouched(&e);
    assert_no_secrets(&e.sc);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slowloris_headers_and_bodies_are_cut_off_within_their_timeouts() {
    // header_timeout = body_timeout = 2s
    let e = hostile_env(|b| b).await;
    let addr = e.sc.listen;
    let bound = Duration::from_secs(2 + 5);

    // 1. a connection that never sends a byte
    let t = Instant::now();
    let (out, closed) = raw(addr, b"", bound).await;
    assert!(closed && out.is_empty(), "an idle connection is closed");
    eprintln!("silent connection closed after {:?}", t.elapsed());

    // 2. part of an HTTP/2 preface, then nothing
    let (_, closed) = raw(addr, b"PRI * HTTP/2.0\r\n", bound).await;
    assert!(closed, "a stalled HTTP/2 preface is closed");

    // 3. headers trickled a byte at a time
    let d = Delivery::fresh();
    let head = head_of(&d, &format!("content-length: {}\r\n", d.body.len()));
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let t = Instant::now();
    let mut cut = false;
    for b in head.as_bytes() {
        if s.write_all(&[*b]).await.is_err() {
            cut = true;
            break;
        }
        if t.elapsed() > bound {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    if !cut {
        let (_, closed) = read_until_closed(&mut s, bound.saturating_sub(t.elapsed())).await;
        cut = closed;
    }
    assert!(cut, "trickled headers: the connection was not closed");
    assert!(
        t.elapsed() < bound + Duration::from_secs(1),
        "{:?}",
        t.elapsed()
    );
    eprintln!("trickled headers cut after {:?}", t.elapsed());

    // 4. body trickled: 408 within body_timeout
    let d = Delivery::fresh().body(vec![b'z'; 2000]);
    let head = head_of(&d, &format!("content-length: {}\r\n", d.body.len()));
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(head.as_bytes()).await.unwrap();
    let t = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    for b in d.body.iter() {
        if s.write_all(&[*b]).await.is_err() {
            break;
        }
        // collect an answer as soon as one comes
        if let Ok(Ok(n)) = tokio::time::timeout(Duration::from_millis(200), s.read(&mut buf)).await
        {
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
            break;
        }
        if t.elapsed() > bound {
            break;
        }
    }
    let (rest, _) = read_until_closed(&mut s, Duration::from_secs(3)).await;
    got.extend_from_slice(&rest);
    assert_eq!(
        status_of(&got),
        Some(408),
        "{}",
        String::from_utf8_lossy(&got)
    );
    assert!(
        t.elapsed() < bound + Duration::from_secs(3),
        "{:?}",
        t.elapsed()
    );
    eprintln!("trickled body answered 408 after {:?}", t.elapsed());
    e.sc.wait_requests_total(ROUTE, "client_timeout", 1.0).await;

    // 5. a body announced but never sent
    let d = Delivery::fresh();
    let head = head_of(&d, "content-length: 500\r\n");
    let (out, _) = raw(addr, head.as_bytes(), bound).await;
    assert_eq!(
        status_of(&out),
        Some(408),
        "{}",
        String::from_utf8_lossy(&out)
    );

    // the sidecar still serves
    let a = e.sc.send(&Delivery::fresh()).await;
    assert_eq!(a.status, 200);
    assert_eq!(e.up.count(), 1);
    assert_no_secrets(&e.sc);
}

// ---------------------------------------------------------------------------
// replay of a leaked request
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_leaked_delivery_replayed_is_never_forwarded_again() {
    // tolerance 2s, retention much longer
    let store = TestStore::new(StoreKind::Redis);
    let up = Upstream::start().await;
    let sc = SidecarBuilder::new(&up.url(), &store.url())
        .route(RouteCfg::standard(ROUTE, PATH).tolerance("2s"))
        .start()
        .await;

    // the provider's delivery, captured byte for byte by an attacker
    let captured = Delivery::fresh();
    let a = sc.send(&captured).await;
    assert_eq!(a.status, 200);
    assert!(!a.replayed());
    assert_eq!(up.count(), 1);

    // re-sent inside the window: the stored answer, not forwarded
    for _ in 0..3 {
        let a = sc.send(&captured).await;
        assert_eq!(a.status, 200);
        assert!(a.replayed(), "{a:?}");
    }
    // re-sent with the body tampered: 401
    let tampered = captured.clone();
    let mut tampered_body = tampered.body.clone();
    tampered_body[1] ^= 0x20;
    let a = post(
        &sc.client,
        &sc.url(PATH),
        &captured.headers(),
        tampered_body,
    )
    .await
    .unwrap();
    a.assert_error(401, "invalid_signature");

    // re-sent after the window: 401, whatever the store remembers
    let past = captured.ts + 3;
    wait_until(
        Duration::from_secs(10),
        "the tolerance window to pass",
        || now_secs() > past,
    )
    .await;
    let a = sc.send(&captured).await;
    a.assert_error(401, "invalid_signature");

    // a never-seen delivery signed with an old timestamp: 401, nothing stored
    let keys_before = store.redis().keys().len();
    let old = Delivery::fresh().ts(now_secs() - 60);
    let a = sc.send(&old).await;
    a.assert_error(401, "invalid_signature");
    assert_eq!(store.redis().keys().len(), keys_before);
    up.assert_count_stays(1, Duration::from_millis(200)).await;
    assert_no_secrets(&sc);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn invalid_signatures_leave_the_store_empty() {
    let e = hostile_env(|b| b).await;
    let mut tasks = Vec::new();
    for i in 0..100 {
        let d = match i % 4 {
            0 => Delivery::fresh().secret(SECRET_WRONG),
            1 => Delivery::fresh().signature("v1,AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="),
            2 => Delivery::fresh().ts(now_secs() - 10_000),
            _ => json_delivery("/webhooks/js", br#"{"id":"x"}"#).secret(SECRET_WRONG),
        };
        tasks.push(e.sc.send_spawned(&d));
    }
    for t in tasks {
        let a = t.await.unwrap();
        a.assert_error(401, "invalid_signature");
    }
    assert_untouched(&e);
    e.sc.wait_requests_total(ROUTE, "invalid_signature", 75.0)
        .await;
}

// ---------------------------------------------------------------------------
// limits
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn over_max_connections_new_connections_are_closed_at_once() {
    let e = hostile_env(|b| b.top("max_connections", "3").top("header_timeout", "30s")).await;
    let addr = e.sc.listen;
    // three connections hold every slot (a request head begun, never finished)
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(b"POST /webhooks/wh HTTP/1.1\r\n")
            .await
            .unwrap();
        held.push(s);
    }
    e.sc.wait_metric("idemgate_connections", 3.0).await;
    // the fourth is closed without an answer
    let (out, closed) = raw(addr, b"", Duration::from_secs(5)).await;
    assert!(
        closed && out.is_empty(),
        "{:?}",
        String::from_utf8_lossy(&out)
    );
    assert!(e.sc.metric("idemgate_connections_refused_total").await >= 1.0);
    // a delivery attempted now fails at the connection level, never hangs
    let c = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let d = Delivery::fresh();
    assert!(
        post(&c, &e.sc.url(PATH), &d.headers(), d.body.clone())
            .await
            .is_err()
    );

    // slots come back when connections close
    drop(held);
    e.sc.wait_metric("idemgate_connections", 0.0).await;
    let a = post(&c, &e.sc.url(PATH), &d.headers(), d.body.clone())
        .await
        .unwrap();
    assert_eq!(a.status, 200);
    assert_eq!(e.up.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn over_max_in_flight_a_delivery_gets_a_fast_503_overloaded() {
    let e = hostile_env(|b| b.top("max_in_flight", "2")).await;
    e.up.set_mode(Mode::Stall(Duration::from_secs(2)));
    let first = Delivery::fresh();
    let second = Delivery::fresh();
    let t1 = e.sc.send_spawned(&first);
    let t2 = e.sc.send_spawned(&second);
    e.up.wait_for_count(2, Duration::from_secs(5)).await;

    let third = Delivery::fresh();
    let a = e.sc.send(&third).await;
    a.assert_error(503, "overloaded");
    assert_eq!(a.retry_after(), 1);
    e.sc.wait_requests_total(ROUTE, "overloaded", 1.0).await;
    // the refused delivery left no trace in the store
    assert!(
        !e.store.redis().keys().iter().any(|k| k.contains(&third.id)),
        "{:?}",
        e.store.redis().keys()
    );

    assert_eq!(t1.await.unwrap().status, 200);
    assert_eq!(t2.await.unwrap().status, 200);
    e.up.set_mode(Mode::default_ok());
    // the provider's retry goes through
    let a = e.sc.send(&third).await;
    assert_eq!(a.status, 200);
    assert!(!a.replayed());
    assert_eq!(e.up.count(), 3);
}

// ---------------------------------------------------------------------------
// HTTP/2
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_h2c_prior_knowledge_delivery_is_forwarded_and_its_copy_replayed() {
    let e = hostile_env(|b| b).await;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build_http::<Full<Bytes>>();
    let d = Delivery::fresh();
    let send = |d: &Delivery| {
        let mut rb = http::Request::builder()
            .method("POST")
            .uri(e.sc.url(&d.path));
        for (k, v) in d.headers() {
            rb = rb.header(k, v);
        }
        let req = rb.body(Full::new(Bytes::from(d.body.clone()))).unwrap();
        let client = client.clone();
        async move {
            let resp = tokio::time::timeout(Duration::from_secs(10), client.request(req))
                .await
                .expect("h2 request did not hang")
                .expect("h2 request");
            assert_eq!(resp.version(), http::Version::HTTP_2);
            let status = resp.status().as_u16();
            let replayed = resp.headers().get("idempotent-replayed").is_some();
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            (status, replayed, body)
        }
    };
    let (status, replayed, body) = send(&d).await;
    assert_eq!(status, 200, "{body:?}");
    assert!(!replayed);
    assert_eq!(&body[..], br#"{"ok":true}"#);
    let (status, replayed, _) = send(&d).await;
    assert_eq!((status, replayed), (200, true));
    assert_eq!(e.up.count(), 1);
    let r = e.up.last();
    assert_eq!(&r.body[..], &d.body[..]);
    assert_eq!(r.header("webhook-id").as_deref(), Some(d.id.as_str()));
    // hostile over h2 too: a bad signature is 401 and touches nothing
    let (status, _, _) = send(&Delivery::fresh().secret(SECRET_WRONG)).await;
    assert_eq!(status, 401);
    assert_eq!(e.up.count(), 1);
}

// ---------------------------------------------------------------------------
// secrets
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn secrets_never_show_in_logs_metrics_answers_or_check_config() {
    let dir = tempfile::tempdir().unwrap();
    let file_secret = "whsec_ZmlsZS1zZWNyZXQtZm9yLXRoZS1sZWFrLXRlc3Q=";
    let path = dir.path().join("secret");
    std::fs::write(&path, format!("{file_secret}\n")).unwrap();
    let store = TestStore::new(StoreKind::Redis);
    let up = Upstream::start().await;
    let b = SidecarBuilder::new(&up.url(), &store.url())
        .route(RouteCfg::standard(ROUTE, PATH).secrets(&[
            SECRET,
            "env:HOSTILE_TEST_SECRET",
            &format!("file:{}", path.display()),
        ]))
        .env("HOSTILE_TEST_SECRET", SECRET_2)
        .env("IDEMGATE_LOG", "debug");
    let sc = b.clone().start().await;

    let mut sent_sigs = Vec::new();
    for secret in [SECRET, SECRET_2, file_secret, SECRET_WRONG] {
        let d = Delivery::fresh().secret(secret);
        sent_sigs.push(sign_standard(secret, &d.id, d.ts, &d.body));
        let a = sc.send(&d).await;
        assert!(!a.text().contains("whsec_"), "{a:?}");
    }
    let _ = sc
        .send(&Delivery::fresh().signature("v1,c2VjcmV0LWxvb2tpbmc="))
        .await;
    let metrics = sc.metrics().await;
    let sig_b64: Vec<String> = sent_sigs
        .iter()
        .map(|s| s.trim_start_matches("v1,").to_string())
        .collect();
    let mut needles: Vec<&str> = vec![SECRET, SECRET_2, file_secret];
    needles.extend(sig_b64.iter().map(|s| s.as_str()));
    for n in &needles {
        assert!(!metrics.contains(n), "metrics hold {n}");
    }
    sc.assert_log_lacks(&needles);
    // the secrets' base64 bodies either
    sc.assert_log_lacks(&[
        "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        "c2Vjb25kLXNlY3JldC1mb3Itcm90YXRpb24tdGVzdHM",
        "ZmlsZS1zZWNyZXQtZm9yLXRoZS1sZWFrLXRlc3Q",
    ]);

    // check-config on the same file prints no secret
    let cfg_path = dir.path().join("idemgate.toml");
    std::fs::write(&cfg_path, &sc.config).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_idemgate"))
        .args(["check-config", "--config"])
        .arg(&cfg_path)
        .env("HOSTILE_TEST_SECRET", SECRET_2)
        .output()
        .unwrap();
    let shown = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{shown}");
    for n in [SECRET, SECRET_2, file_secret] {
        assert!(!shown.contains(n), "check-config shows {n}:\n{shown}");
    }
    assert!(shown.contains("env:HOSTILE_TEST_SECRET"), "{shown}");
    // and a config error about a secret names the field, not the secret
    let bad = sc.config.replace(SECRET, "whsec_not*base64*at*all");
    std::fs::write(&cfg_path, bad).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_idemgate"))
        .args(["check-config", "--config"])
        .arg(&cfg_path)
        .env("HOSTILE_TEST_SECRET", SECRET_2)
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success());
    assert!(shown.contains("route[0].secrets[0]"), "{shown}");
    assert!(!shown.contains("not*base64*at*all"), "{shown}");
    assert!(!shown.contains(SECRET_2), "{shown}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_thousand_idle_keep_alive_connections_cost_little_and_deliveries_get_through() {
    let e = hostile_env(|b| b.top("header_timeout", "60s")).await;
    let addr = e.sc.listen;
    let before = rss_kib(e.sc.pid());
    let mut idle = Vec::new();
    for i in 0..1000 {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /nope HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        // read the 404 (kept alive: the connection then sits idle)
        let mut buf = [0u8; 1024];
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
            .await
            .unwrap_or_else(|_| panic!("connection {i}: no answer"))
            .unwrap();
        assert_eq!(status_of(&buf[..n]), Some(404), "connection {i}");
        idle.push(s);
    }
    e.sc.wait_metric("idemgate_connections", 1000.0).await;
    let after = rss_kib(e.sc.pid());
    let per_conn = (after.saturating_sub(before) as f64) / 1000.0;
    eprintln!(
        "1000 idle keep-alive connections: RSS {before} -> {after} KiB ({per_conn:.1} KiB each)"
    );
    assert!(per_conn < 64.0, "{per_conn} KiB per idle connection");
    let a = e.sc.send(&Delivery::fresh()).await;
    assert_eq!(a.status, 200);
    assert_eq!(e.up.count(), 1);
    drop(idle);
    // all closed but the test client's own pooled connection
    let end = Instant::now() + Duration::from_secs(5);
    while e.sc.metric("idemgate_connections").await > 1.0 {
        assert!(Instant::now() < end, "idle connections not released");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
