//! The payment, developer-tool and email presets end to end (razorpay, bitbucket,
//! intercom, square, linear, ...): the real binary, a private redis-server and the
//! recording upstream, with deliveries signed by `tests/signers/sign_b.py`.
//!
//! Which independent signer proves each preset (see the signer's doc too):
//! - razorpay, square, paddle, mailgun, sendgrid: the documented algorithm in Python,
//!   asserted accepted by the official library's verify function (`razorpay`,
//!   `squareup`, `paddle-python-sdk`, `mailgun`, `sendgrid` on PyPI);
//! - hubspot, adyen: the official library's own signing function
//!   (`hubspot-api-client`'s `Signature.get_signature`, `Adyen`'s
//!   `generate_notification_sig`);
//! - bitbucket, intercom, linear, gitlab: no official Python library; the documented
//!   algorithm with Python's hmac/hashlib.
//!
//! For each preset: a signed delivery is forwarded once with `idempotency-key:
//! <route>:<key>`; its copy (or the provider's retry) gets the stored answer, marked
//! replayed; a flipped byte, the wrong secret, a stale timestamp (where one is signed)
//! and a missing signature are refused and never forwarded; where the delivery id is
//! unsigned, a captured request under a fresh id is replayed, not forwarded.

use std::path::Path;
use std::process::{Command, Stdio};

use crate::common::*;
use base64::Engine as _;
use serde_json::{Value, json};

/// Runs the independent signer with one JSON request.
fn py(req: Value) -> Value {
    use std::io::Write;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/signers/sign_b.py");
    let mut child = Command::new("python3")
        .arg(&script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 runs (tests/signers/requirements-b.txt)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(req.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "signer failed for {req}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("signer answers JSON")
}

fn b64(b: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(b)
}

fn s(v: &Value) -> String {
    v.as_str().expect("a string").to_string()
}

/// Signs `body` with `op` and returns the signer's `field`.
fn sig(op: &str, secret: &str, body: &[u8], extra: Value) -> String {
    let mut req = json!({"op": op, "secret": secret, "body_b64": b64(body)});
    if let (Some(r), Some(e)) = (req.as_object_mut(), extra.as_object()) {
        r.extend(e.clone());
    }
    s(&py(req)["signature"])
}

struct Stack {
    sidecar: Sidecar,
    upstream: Upstream,
    _redis: RedisServer,
    path: String,
}

async fn stack(name: &str, provider: &str, secrets: &[&str], extra: &str) -> Stack {
    let redis = RedisServer::start_new();
    let upstream = Upstream::start().await;
    let r = RouteCfg {
        name: name.into(),
        path: format!("/hooks/{name}"),
        provider: provider.into(),
        secrets: secrets.iter().map(|s| s.to_string()).collect(),
        tolerance: None,
        key: None,
        extra: extra.into(),
    };
    let sidecar = SidecarBuilder::new(&upstream.url(), &redis.url())
        .route(r)
        .start()
        .await;
    Stack {
        sidecar,
        upstream,
        _redis: redis,
        path: format!("/hooks/{name}"),
    }
}

const UPSTREAM_OK: &[u8] = br#"{"ok":true}"#;

impl Stack {
    async fn post(&self, headers: &[(&str, String)], body: &[u8]) -> Answer {
        let mut h: Vec<(String, String)> = vec![("content-type".into(), "application/json".into())];
        h.extend(headers.iter().map(|(k, v)| (k.to_string(), v.clone())));
        post(
            &self.sidecar.client,
            &self.sidecar.url(&self.path),
            &h,
            body.to_vec(),
        )
        .await
        .expect("HTTP exchange")
    }

    /// A first delivery: forwarded byte for byte with exactly one `idempotency-key`.
    fn forwarded(&self, a: &Answer, count: usize, body: &[u8], idem: &str) {
        assert_eq!(a.status, 200, "expected forwarding, got {a:?} {}", a.text());
        assert!(!a.replayed());
        assert_eq!(self.upstream.count(), count, "upstream count");
        let last = self.upstream.last();
        assert_eq!(&last.body[..], body, "forwarded body byte for byte");
        assert_eq!(last.header("idempotency-key").as_deref(), Some(idem));
    }

    /// A duplicate: the stored answer, marked replayed, nothing forwarded.
    fn replayed(&self, a: &Answer, count: usize) {
        assert_eq!(a.status, 200, "expected a replay, got {a:?} {}", a.text());
        assert!(a.replayed(), "answer not marked replayed: {a:?}");
        assert_eq!(a.body, UPSTREAM_OK);
        assert_eq!(self.upstream.count(), count, "a duplicate is not forwarded");
    }

    fn refused(&self, a: &Answer, status: u16, count: usize) {
        let code = if status == 401 {
            "invalid_signature"
        } else {
            "bad_request"
        };
        a.assert_error(status, code);
        assert_eq!(self.upstream.count(), count, "a refusal is not forwarded");
    }
}

fn flipped(body: &[u8], at: usize) -> Vec<u8> {
    let mut b = body.to_vec();
    b[at] ^= 1;
    b
}

/// A preset whose signature is one HMAC of the body in one header and whose delivery id
/// is an unsigned header: forwarded, replayed, guarded by content, tampering refused.
async fn body_hmac_with_unsigned_id(
    provider: &str,
    op: &str,
    sig_header: &'static str,
    id_header: &'static str,
    fixed: &[(&'static str, &str)],
) {
    let (s1, s2) = ("first-secret", "second-secret");
    let st = stack(provider, provider, &[s1, s2], "").await;
    let body = format!(r#"{{"event":"x","n":"{}"}}"#, unique_id(provider)).into_bytes();
    let h = |id: &str, sig: String| {
        let mut v = vec![(id_header, id.to_string()), (sig_header, sig)];
        v.extend(fixed.iter().map(|(k, val)| (*k, val.to_string())));
        v
    };
    let good = sig(op, s1, &body, json!({}));
    let a = st.post(&h("id-1", good.clone()), &body).await;
    st.forwarded(&a, 1, &body, &format!("{provider}:id-1"));
    let a = st.post(&h("id-1", good.clone()), &body).await;
    st.replayed(&a, 1);
    // The unsigned-key guard: the captured request under a fresh id.
    let a = st.post(&h("id-2-forged", good.clone()), &body).await;
    st.replayed(&a, 1);
    let a = st.post(&h("id-3", good.clone()), &flipped(&body, 3)).await;
    st.refused(&a, 401, 1);
    let a = st
        .post(&h("id-4", sig(op, "wrong", &body, json!({}))), &body)
        .await;
    st.refused(&a, 401, 1);
    let mut missing = h("id-5", good);
    missing.retain(|(k, _)| *k != sig_header);
    let a = st.post(&missing, &body).await;
    st.refused(&a, 400, 1);
    // Rotation: another event signed with the second secret.
    let body2 = format!(r#"{{"event":"y","n":"{}"}}"#, unique_id(provider)).into_bytes();
    let a = st
        .post(&h("id-6", sig(op, s2, &body2, json!({}))), &body2)
        .await;
    st.forwarded(&a, 2, &body2, &format!("{provider}:id-6"));
}

#[tokio::test]
async fn razorpay_forwarded_once_and_guarded_by_content() {
    body_hmac_with_unsigned_id(
        "razorpay",
        "razorpay",
        "x-razorpay-signature",
        "x-razorpay-event-id",
        &[],
    )
    .await;
}

#[tokio::test]
async fn bitbucket_forwarded_once_and_guarded_by_content() {
    body_hmac_with_unsigned_id(
        "bitbucket",
        "bitbucket",
        "x-hub-signature",
        "x-request-uuid",
        &[("x-event-key", "repo:push")],
    )
    .await;
}

#[tokio::test]
async fn intercom_retries_with_new_attempt_counts_are_replayed() {
    let (s1, s2) = ("intercom-one", "intercom-two");
    let st = stack("intercom", "intercom", &[s1, s2], "").await;
    let id = unique_id("notif");
    let body_at = |attempt: u32, first_sent: i64| {
        format!(
            r#"{{"type":"notification_event","id":"{id}","topic":"conversation.user.created","data":{{"item":{{"id":"1"}}}},"delivery_status":"pending","delivery_attempts":{attempt},"delivered_at":0,"first_sent_at":{first_sent},"created_at":1700000000}}"#
        )
        .into_bytes()
    };
    let h = |sig: String| vec![("x-hub-signature", sig)];
    let body = body_at(1, 1_700_000_001);
    let a = st
        .post(&h(sig("intercom", s1, &body, json!({}))), &body)
        .await;
    st.forwarded(&a, 1, &body, &format!("intercom:{id}"));
    let a = st
        .post(&h(sig("intercom", s1, &body, json!({}))), &body)
        .await;
    st.replayed(&a, 1);
    // Intercom's retry rewrites its delivery fields inside the signed body.
    let retry = body_at(2, 1_700_000_061);
    let a = st
        .post(&h(sig("intercom", s1, &retry, json!({}))), &retry)
        .await;
    st.replayed(&a, 1);
    let good = sig("intercom", s1, &body, json!({}));
    let a = st.post(&h(good.clone()), &flipped(&body, 20)).await;
    st.refused(&a, 401, 1);
    let a = st
        .post(&h(sig("intercom", "x", &body, json!({}))), &body)
        .await;
    st.refused(&a, 401, 1);
    let a = st.post(&[], &body).await;
    st.refused(&a, 400, 1);
    // a SHA-256 signature under Intercom's header is not Intercom's scheme
    let a = st.post(&h(good.replace("sha1=", "sha256=")), &body).await;
    st.refused(&a, 401, 1);
    let id2 = unique_id("notif");
    let body2 = format!(r#"{{"type":"notification_event","id":"{id2}"}}"#).into_bytes();
    let a = st
        .post(&h(sig("intercom", s2, &body2, json!({}))), &body2)
        .await;
    st.forwarded(&a, 2, &body2, &format!("intercom:{id2}"));
}

#[tokio::test]
async fn square_signs_the_notification_url() {
    let url = "https://hooks.example.com/square/notify";
    let (s1, s2) = ("sq-key-one", "sq-key-two");
    let st = stack(
        "square",
        "square",
        &[s1, s2],
        &format!("public_url = \"{url}\"\n"),
    )
    .await;
    let ev = unique_id("sq");
    let body =
        format!(r#"{{"merchant_id":"M1","type":"payment.updated","event_id":"{ev}","data":{{}}}}"#)
            .into_bytes();
    let sign = |secret: &str, url: &str, body: &[u8]| {
        vec![(
            "x-square-hmacsha256-signature",
            sig("square", secret, body, json!({"url": url})),
        )]
    };
    let a = st.post(&sign(s1, url, &body), &body).await;
    st.forwarded(&a, 1, &body, &format!("square:{ev}"));
    let a = st.post(&sign(s1, url, &body), &body).await;
    st.replayed(&a, 1);
    let a = st.post(&sign(s1, url, &body), &flipped(&body, 5)).await;
    st.refused(&a, 401, 1);
    let a = st.post(&sign("nope", url, &body), &body).await;
    st.refused(&a, 401, 1);
    // signed for another notification URL
    let a = st
        .post(&sign(s1, "https://hooks.example.com/other", &body), &body)
        .await;
    st.refused(&a, 401, 1);
    let a = st.post(&[], &body).await;
    st.refused(&a, 400, 1);
    let ev2 = unique_id("sq");
    let body2 = format!(r#"{{"event_id":"{ev2}"}}"#).into_bytes();
    let a = st.post(&sign(s2, url, &body2), &body2).await;
    st.forwarded(&a, 2, &body2, &format!("square:{ev2}"));
}

#[tokio::test]
async fn linear_windows_on_the_signed_body_timestamp() {
    let (s1, s2) = ("lin_wh_one", "lin_wh_two");
    let st = stack("linear", "linear", &[s1, s2], "").await;
    let issue = unique_id("iss");
    let body_at = |ms: i64| {
        format!(
            r#"{{"action":"create","type":"Issue","data":{{"id":"{issue}"}},"webhookId":"wh1","webhookTimestamp":{ms}}}"#
        )
        .into_bytes()
    };
    let h = |delivery: &str, sig: String, header_ts: i64| {
        vec![
            ("linear-delivery", delivery.to_string()),
            ("linear-signature", sig),
            ("linear-timestamp", header_ts.to_string()),
        ]
    };
    let now_ms = now_secs() * 1000;
    let body = body_at(now_ms);
    let good = sig("linear", s1, &body, json!({}));
    let a = st.post(&h("d-1", good.clone(), now_ms), &body).await;
    st.forwarded(&a, 1, &body, "linear:d-1");
    let a = st.post(&h("d-1", good.clone(), now_ms), &body).await;
    st.replayed(&a, 1);
    // Linear's retry: a new delivery id and a fresh signed webhookTimestamp.
    let retry = body_at(now_ms + 20_000);
    let a = st
        .post(
            &h("d-2", sig("linear", s1, &retry, json!({})), now_ms),
            &retry,
        )
        .await;
    st.replayed(&a, 1);
    // Stale inside the body: refused, whatever the unsigned header says.
    let stale = body_at(now_ms - 120_000);
    let a = st
        .post(
            &h("d-3", sig("linear", s1, &stale, json!({})), now_ms),
            &stale,
        )
        .await;
    st.refused(&a, 401, 1);
    let a = st
        .post(&h("d-4", good.clone(), now_ms), &flipped(&body, 12))
        .await;
    st.refused(&a, 401, 1);
    let a = st
        .post(
            &h("d-5", sig("linear", "x", &body, json!({})), now_ms),
            &body,
        )
        .await;
    st.refused(&a, 401, 1);
    let a = st.post(&[("linear-delivery", "d-6".into())], &body).await;
    st.refused(&a, 400, 1);
    let other = format!(
        r#"{{"action":"update","type":"Issue","data":{{"id":"{}"}},"webhookTimestamp":{now_ms}}}"#,
        unique_id("iss")
    )
    .into_bytes();
    let a = st
        .post(
            &h("d-7", sig("linear", s2, &other, json!({})), now_ms),
            &other,
        )
        .await;
    st.forwarded(&a, 2, &other, "linear:d-7");
}
