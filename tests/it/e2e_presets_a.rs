//! Real provider traffic end to end (the real binary, a private redis-server, the
//! recording upstream): Svix's header spelling, the handshakes and GET checks, keyless
//! requests, and the `meta`, `discord`, `zoom` and `twitter` presets.
//!
//! The signer is `tests/signers/sign_a.py`, per provider:
//! - Svix: the official `svix` library signs (`Webhook.sign`) and its `verify` accepts
//!   the `svix-*` headers.
//! - Slack: the official `slack_sdk` signs (`SignatureVerifier.generate_signature`).

use std::path::Path;
use std::process::{Command, Stdio};

use crate::common::*;
use base64::Engine as _;
use serde_json::{Value, json};

/// Runs the signer with one JSON request.
fn py(req: Value) -> Value {
    use std::io::Write;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/signers/sign_a.py");
    let mut child = Command::new("python3")
        .arg(&script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 runs (see tests/signers/requirements-a.txt)");
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

fn route(name: &str, provider: &str, secrets: &[&str], extra: &str) -> RouteCfg {
    RouteCfg {
        name: name.into(),
        path: format!("/hooks/{name}"),
        provider: provider.into(),
        secrets: secrets.iter().map(|s| s.to_string()).collect(),
        tolerance: None,
        key: None,
        extra: extra.into(),
    }
}

struct Stack {
    sidecar: Sidecar,
    upstream: Upstream,
    _redis: RedisServer,
}

async fn stack(r: RouteCfg) -> Stack {
    let redis = RedisServer::start_new();
    let upstream = Upstream::start().await;
    let sidecar = SidecarBuilder::new(&upstream.url(), &redis.url())
        .route(r)
        .start()
        .await;
    Stack {
        sidecar,
        upstream,
        _redis: redis,
    }
}

impl Stack {
    async fn send(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, String)],
        body: &[u8],
    ) -> Answer {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut rb = self.sidecar.client.request(method, self.sidecar.url(path));
        for (k, v) in headers {
            rb = rb.header(*k, v.as_str());
        }
        let start = std::time::Instant::now();
        let resp = rb.body(body.to_vec()).send().await.expect("HTTP exchange");
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let body = resp.bytes().await.unwrap().to_vec();
        Answer {
            status,
            headers,
            body,
            elapsed: start.elapsed(),
        }
    }

    async fn post(&self, path: &str, headers: &[(&str, String)], body: &[u8]) -> Answer {
        self.send("POST", path, headers, body).await
    }

    /// A first delivery: the upstream's answer; the upstream got the body byte for byte
    /// with the route's idempotency key.
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
        let code = match status {
            401 => "invalid_signature",
            403 => "forbidden",
            _ => "bad_request",
        };
        a.assert_error(status, code);
        assert_eq!(
            self.upstream.count(),
            count,
            "a refused request is not forwarded"
        );
    }
}

const UPSTREAM_OK: &[u8] = br#"{"ok":true}"#;

fn json_h() -> (&'static str, String) {
    ("content-type", "application/json".to_string())
}

#[tokio::test]
async fn svix_spelled_standard_webhooks_forwarded_once() {
    let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let st = stack(route("clerk", "standard", &[secret], "")).await;
    let path = "/hooks/clerk";
    let id = unique_id("msg");
    let body = format!(r#"{{"type":"user.created","data":{{"id":"{id}"}}}}"#).into_bytes();
    let sign = |secret: &str, id: &str, ts: i64, body: &[u8], check: bool| {
        s(&py(
            json!({"op":"svix","secret":secret,"id":id,"ts":ts,"body_b64":b64(body),"check":check}),
        )["signature"])
    };
    let h = |id: &str, ts: i64, sig: String| {
        vec![
            json_h(),
            ("svix-id", id.to_string()),
            ("svix-timestamp", ts.to_string()),
            ("svix-signature", sig),
        ]
    };
    let now = now_secs();
    let sig = sign(secret, &id, now, &body, true);
    let a = st.post(path, &h(&id, now, sig.clone()), &body).await;
    st.forwarded(&a, 1, &body, &format!("clerk:{id}"));
    let a = st.post(path, &h(&id, now, sig.clone()), &body).await;
    st.replayed(&a, 1);
    // The same delivery under the webhook-* spelling is the same key.
    let webhook = vec![
        json_h(),
        ("webhook-id", id.clone()),
        ("webhook-timestamp", now.to_string()),
        ("webhook-signature", sig.clone()),
    ];
    let a = st.post(path, &webhook, &body).await;
    st.replayed(&a, 1);
    // Both spellings, disagreeing: refused.
    let mut both = h(&id, now, sig.clone());
    both.push(("webhook-id", "msg_other".into()));
    let a = st.post(path, &both, &body).await;
    st.refused(&a, 400, 1);
    // Tampered body; wrong secret; stale timestamp; missing signature.
    let mut tampered = body.clone();
    tampered[5] ^= 1;
    let id2 = unique_id("msg");
    let a = st
        .post(
            path,
            &h(&id2, now, sign(secret, &id2, now, &body, true)),
            &tampered,
        )
        .await;
    st.refused(&a, 401, 1);
    let other = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
    let a = st
        .post(
            path,
            &h(&id2, now, sign(other, &id2, now, &body, true)),
            &body,
        )
        .await;
    st.refused(&a, 401, 1);
    let old = now - 3600;
    let a = st
        .post(
            path,
            &h(&id2, old, sign(secret, &id2, old, &body, false)),
            &body,
        )
        .await;
    st.refused(&a, 401, 1);
    let mut unsigned = h(&id2, now, String::new());
    unsigned.retain(|(k, _)| *k != "svix-signature");
    let a = st.post(path, &unsigned, &body).await;
    st.refused(&a, 400, 1);
    let a = st
        .post(
            path,
            &h(&id2, now, sign(secret, &id2, now, &body, true)),
            &body,
        )
        .await;
    st.forwarded(&a, 2, &body, &format!("clerk:{id2}"));
}

fn slack_sign(secret: &str, ts: i64, body: &[u8]) -> String {
    s(&py(json!({"op":"slack","secret":secret,"ts":ts,"body_b64":b64(body)}))["signature"])
}

fn slack_h(ts: i64, sig: String, form: bool) -> Vec<(&'static str, String)> {
    let ct = if form {
        "application/x-www-form-urlencoded"
    } else {
        "application/json"
    };
    vec![
        ("content-type", ct.to_string()),
        ("x-slack-request-timestamp", ts.to_string()),
        ("x-slack-signature", sig),
    ]
}

/// Slack's Request URL check: verified, then forwarded unclaimed (default) so the
/// application answers the challenge; unsigned or badly signed, 401 and nothing
/// forwarded. Slash commands (signed, form-encoded, no event_id) reach the application
/// undeduplicated, each time.
#[tokio::test]
async fn slack_url_verification_forwarded_and_slash_commands_reach_the_app() {
    let secret = "8f742231b10e8888abcd99yyyzzz85a5";
    let st = stack(route("slack", "slack", &[secret], "")).await;
    let path = "/hooks/slack";
    let now = now_secs();
    let challenge = unique_id("chal");
    let body = format!(
        r#"{{"token":"Jhj5dZrVaK7ZwHHjRyZWjbDl","challenge":"{challenge}","type":"url_verification"}}"#
    )
    .into_bytes();
    // unsigned, badly signed, stale: 401, nothing forwarded
    let a = st.post(path, &[json_h()], &body).await;
    st.refused(&a, 401, 0);
    let a = st
        .post(
            path,
            &slack_h(now, slack_sign("wrong", now, &body), false),
            &body,
        )
        .await;
    st.refused(&a, 401, 0);
    let old = now - 900;
    let a = st
        .post(
            path,
            &slack_h(old, slack_sign(secret, old, &body), false),
            &body,
        )
        .await;
    st.refused(&a, 401, 0);
    // signed: forwarded (no claim, no idempotency-key), twice if sent twice
    let sig = slack_sign(secret, now, &body);
    for n in 1..=2 {
        let a = st
            .post(path, &slack_h(now, sig.clone(), false), &body)
            .await;
        assert_eq!(a.status, 200, "{}", a.text());
        assert!(!a.replayed());
        assert_eq!(st.upstream.count(), n);
        assert_eq!(st.upstream.last().body, body);
        assert_eq!(st.upstream.last().header("idempotency-key"), None);
    }
    assert_eq!(st.sidecar.requests_total("slack", "handshake").await, 2.0);
    // a slash command: forwarded each time, counted unkeyed
    let cmd = b"token=x&team_id=T1&command=%2Fdeploy&text=prod&trigger_id=1.2.3".to_vec();
    for n in 3..=4 {
        let a = st
            .post(
                path,
                &slack_h(now, slack_sign(secret, now, &cmd), true),
                &cmd,
            )
            .await;
        assert_eq!(a.status, 200, "{}", a.text());
        assert_eq!(st.upstream.count(), n);
        assert_eq!(st.upstream.last().header("idempotency-key"), None);
    }
    assert_eq!(st.sidecar.requests_total("slack", "unkeyed").await, 2.0);
    // a tampered or unsigned slash command still never reaches it
    let mut tampered = cmd.clone();
    tampered[7] ^= 1;
    let a = st
        .post(
            path,
            &slack_h(now, slack_sign(secret, now, &cmd), true),
            &tampered,
        )
        .await;
    st.refused(&a, 401, 4);
    let a = st
        .post(
            path,
            &[("content-type", "application/x-www-form-urlencoded".into())],
            &cmd,
        )
        .await;
    st.refused(&a, 400, 4);
    // events keep their de-duplication
    let ev = unique_id("Ev");
    let evb = format!(r#"{{"type":"event_callback","event_id":"{ev}"}}"#).into_bytes();
    let a = st
        .post(
            path,
            &slack_h(now, slack_sign(secret, now, &evb), false),
            &evb,
        )
        .await;
    st.forwarded(&a, 5, &evb, &format!("slack:{ev}"));
    let a = st
        .post(
            path,
            &slack_h(now + 1, slack_sign(secret, now + 1, &evb), false),
            &evb,
        )
        .await;
    st.replayed(&a, 5);
}

/// `handshake = "answer"`: idemgate echoes the challenge itself; `keyless = "reject"`:
/// a slash command is refused.
#[tokio::test]
async fn slack_url_verification_answered_and_keyless_rejected() {
    let secret = "slack-signing-secret";
    let extra = "handshake = \"answer\"\nkeyless = \"reject\"\n";
    let st = stack(route("slack", "slack", &[secret], extra)).await;
    let path = "/hooks/slack";
    let now = now_secs();
    let challenge = unique_id("3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P");
    let body = format!(r#"{{"token":"t","challenge":"{challenge}","type":"url_verification"}}"#)
        .into_bytes();
    let a = st
        .post(
            path,
            &slack_h(now, slack_sign(secret, now, &body), false),
            &body,
        )
        .await;
    assert_eq!((a.status, a.text()), (200, challenge.clone()));
    assert_eq!(st.upstream.count(), 0, "answered by idemgate");
    let a = st
        .post(
            path,
            &slack_h(now, slack_sign("x", now, &body), false),
            &body,
        )
        .await;
    st.refused(&a, 401, 0);
    assert_eq!(st.sidecar.requests_total("slack", "handshake").await, 1.0);
    let cmd = b"command=%2Fdeploy&trigger_id=1.2.3".to_vec();
    let a = st
        .post(
            path,
            &slack_h(now, slack_sign(secret, now, &cmd), true),
            &cmd,
        )
        .await;
    st.refused(&a, 400, 0);
}
