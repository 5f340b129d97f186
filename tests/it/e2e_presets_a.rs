//! Real provider traffic end to end (the real binary, a private redis-server, the
//! recording upstream): Svix's header spelling, the handshakes and GET checks, keyless
//! requests, and the `meta`, `discord`, `zoom` and `twitter` presets.
//!
//! The signer is `tests/signers/sign_a.py`, per provider:
//! - Svix: the official `svix` library signs (`Webhook.sign`) and its `verify` accepts
//!   the `svix-*` headers.
//! - Slack: the official `slack_sdk` signs (`SignatureVerifier.generate_signature`).
//! - Discord: PyNaCl signs (Ed25519 over timestamp + body) and the official
//!   `discord-interactions` `verify_key` must accept each signature.
//! - Meta, Zoom, X: no official Python library signs or verifies these webhooks; the
//!   signer implements each documented algorithm with Python's `hmac`/`hashlib` (Meta:
//!   `sha256=` hex HMAC of the body; Zoom: `v0=` hex HMAC of `v0:{ts}:{body}`, and
//!   `encryptedToken` = hex HMAC of the plainToken; X: `sha256=` base64 HMAC of the
//!   body, and of the `crc_token` for the CRC answer).

use crate::common::preset_stack::*;
use crate::common::*;
use serde_json::{Value, json};

/// Runs this file's independent signer with one JSON request.
fn py(req: Value) -> Value {
    crate::common::signer::sign_with("sign_a.py", &req)
}

use crate::common::signer::text as s;

async fn stack(r: RouteCfg) -> Stack {
    Stack::start(r).await
}

#[tokio::test]
async fn svix_spelled_standard_webhooks_forwarded_once() {
    let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let st = stack(route("clerk", "standard", &[secret], "")).await;
    let path = "/hooks/clerk";
    let id = unique_id("msg");
    let body = format!(r#"{{"type":"user.created","data":{{"id":"{id}"}}}}"#).into_bytes();
    // a preset without handshakes and a rejecting `keyless` exports neither outcome
    let m = st.sidecar.metrics().await;
    assert!(!m.contains("outcome=\"handshake\"") && !m.contains("outcome=\"unkeyed\""));
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
    // both outcomes exported from start, at 0, on a Slack route
    let m = st.sidecar.metrics().await;
    for o in ["handshake", "unkeyed"] {
        let label = format!("outcome=\"{o}\"");
        assert!(
            m.lines().any(|l| l.starts_with("idemgate_requests_total{")
                && l.contains(&label)
                && l.contains("route=\"slack\"")
                && l.ends_with(" 0")),
            "{o} not exported at 0"
        );
    }
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
    // a slash command: forwarded each time, counted unkeyed, with no idempotency-key
    // (not even one the sender chose)
    let cmd = b"token=x&team_id=T1&command=%2Fdeploy&text=prod&trigger_id=1.2.3".to_vec();
    for n in 3..=4 {
        let mut sent = slack_h(now, slack_sign(secret, now, &cmd), true);
        sent.push(("idempotency-key", "slack:forged".into()));
        let a = st.post(path, &sent, &cmd).await;
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

impl Stack {
    async fn get(&self, path_and_query: &str) -> Answer {
        self.send("GET", path_and_query, &[], b"").await
    }
}

fn sha_key(route: &str, body: &[u8]) -> String {
    use sha2::Digest;
    format!("{route}:sha256:{}", hex::encode(sha2::Sha256::digest(body)))
}

/// Meta: the GET check passes only with the verify token (forwarded by default, echoed
/// with `handshake = "answer"`); a wrong or missing token is 403 and echoes nothing.
/// POSTs carry `X-Hub-Signature-256` and no id: keyed by the body.
#[tokio::test]
async fn meta_verify_token_and_signed_posts() {
    let secret = "meta-app-secret";
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("verify_token");
    std::fs::write(&token_file, "meta-verify-1\n").unwrap();
    let extra = format!(
        "verify_token = \"file:{}\"\nhandshake = \"answer\"\n",
        token_file.display()
    );
    let st = stack(route("meta", "meta", &[secret], &extra)).await;
    let path = "/hooks/meta";
    let check = |token: Option<&str>| {
        let mut q = "hub.mode=subscribe&hub.challenge=1158201444".to_string();
        if let Some(t) = token {
            q.push_str(&format!("&hub.verify_token={t}"));
        }
        format!("{path}?{q}")
    };
    let a = st.get(&check(Some("meta-verify-1"))).await;
    assert_eq!((a.status, a.text()), (200, "1158201444".to_string()));
    for bad in [Some("meta-verify-2"), None] {
        let a = st.get(&check(bad)).await;
        st.refused(&a, 403, 0);
        assert!(!a.text().contains("1158201444"), "echoed: {}", a.text());
    }
    assert_eq!(st.sidecar.requests_total("meta", "handshake").await, 1.0);
    let body = format!(
        r#"{{"object":"page","entry":[{{"id":"1","time":{},"messaging":[{{"mid":"{}"}}]}}]}}"#,
        now_secs(),
        unique_id("m")
    )
    .into_bytes();
    let sign = |secret: &str, body: &[u8]| {
        s(&py(json!({"op":"meta","secret":secret,"body_b64":b64(body)}))["signature"])
    };
    let h = |sig: String| vec![json_h(), ("x-hub-signature-256", sig)];
    let a = st.post(path, &h(sign(secret, &body)), &body).await;
    st.forwarded(&a, 1, &body, &sha_key("meta", &body));
    let a = st.post(path, &h(sign(secret, &body)), &body).await;
    st.replayed(&a, 1);
    let mut tampered = body.clone();
    tampered[3] ^= 1;
    let a = st.post(path, &h(sign(secret, &body)), &tampered).await;
    st.refused(&a, 401, 1);
    let a = st.post(path, &h(sign("other", &body)), &body).await;
    st.refused(&a, 401, 1);
    let a = st.post(path, &[json_h()], &body).await;
    st.refused(&a, 400, 1);
}

/// Meta's default `handshake = "forward"`: the right token reaches the application.
#[tokio::test]
async fn meta_verify_token_forwarded_by_default() {
    let st = stack(route("meta", "meta", &["s"], "verify_token = \"tok\"\n")).await;
    let q = "/hooks/meta?hub.mode=subscribe&hub.verify_token=tok&hub.challenge=42";
    let a = st.get(q).await;
    assert_eq!(a.status, 200);
    assert_eq!(st.upstream.count(), 1);
    assert_eq!(st.upstream.last().method, "GET");
    assert!(
        st.upstream
            .last()
            .path_and_query
            .ends_with("hub.challenge=42")
    );
    let a = st
        .get("/hooks/meta?hub.mode=subscribe&hub.verify_token=x&hub.challenge=42")
        .await;
    st.refused(&a, 403, 1);
}

/// Discord: Ed25519 over timestamp + body under the application's public key.
/// Interactions (PING answered `{"type":1}`, others keyed by `id`) and Webhook Events
/// (PING answered 204, events keyed by the body) on one route; every bad signature is
/// exactly 401.
#[tokio::test]
async fn discord_interactions_and_webhook_events() {
    let k = py(json!({"op":"discord_keygen"}));
    let other = py(json!({"op":"discord_keygen"}));
    let public = s(&k["public_hex"]);
    let st = stack(route(
        "discord",
        "discord",
        &[&public],
        "handshake = \"answer\"\n",
    ))
    .await;
    let path = "/hooks/discord";
    let sign = |key: &Value, ts: i64, body: &[u8]| {
        s(&py(json!({"op":"discord","private_hex":key["private_hex"],
            "public_hex":key["public_hex"],"ts":ts,"body_b64":b64(body)}))["signature"])
    };
    let h = |ts: i64, sig: String| {
        vec![
            json_h(),
            ("x-signature-ed25519", sig),
            ("x-signature-timestamp", ts.to_string()),
        ]
    };
    let now = now_secs();
    let ping = br#"{"id":"1","application_id":"9","type":1,"token":"t","version":1}"#;
    let a = st.post(path, &h(now, sign(&k, now, ping)), ping).await;
    assert_eq!((a.status, a.json()), (200, json!({"type":1})));
    // Discord's probes: a bad signature, a missing one, the wrong key: exactly 401
    let a = st.post(path, &h(now, "00".repeat(64)), ping).await;
    st.refused(&a, 401, 0);
    let a = st.post(path, &[json_h()], ping).await;
    st.refused(&a, 401, 0);
    let a = st.post(path, &h(now, sign(&other, now, ping)), ping).await;
    st.refused(&a, 401, 0);
    let event_ping = br#"{"version":1,"application_id":"9","type":0}"#;
    let a = st
        .post(path, &h(now, sign(&k, now, event_ping)), event_ping)
        .await;
    assert_eq!((a.status, a.body.len()), (204, 0));
    assert_eq!(st.upstream.count(), 0);
    assert_eq!(st.sidecar.requests_total("discord", "handshake").await, 2.0);
    // an interaction: keyed by its id
    let id = format!("{}", now_secs() * 1000);
    let cmd = format!(r#"{{"id":"{id}","application_id":"9","type":2,"token":"t","version":1,"data":{{"name":"ping"}}}}"#).into_bytes();
    let a = st.post(path, &h(now, sign(&k, now, &cmd)), &cmd).await;
    st.forwarded(&a, 1, &cmd, &format!("discord:{id}"));
    let a = st.post(path, &h(now, sign(&k, now, &cmd)), &cmd).await;
    st.replayed(&a, 1);
    // a webhook event: no id, keyed by the body; Discord's retry resends it
    let ev = format!(
        r#"{{"version":1,"application_id":"9","type":1,"event":{{"type":"APPLICATION_AUTHORIZED","timestamp":"{}","data":{{}}}}}}"#,
        unique_id("t")
    )
    .into_bytes();
    let a = st.post(path, &h(now, sign(&k, now, &ev)), &ev).await;
    st.forwarded(&a, 2, &ev, &sha_key("discord", &ev));
    let a = st
        .post(path, &h(now + 5, sign(&k, now + 5, &ev)), &ev)
        .await;
    st.replayed(&a, 2);
    // tampered, stale
    let mut tampered = ev.clone();
    tampered[12] ^= 1;
    let a = st.post(path, &h(now, sign(&k, now, &ev)), &tampered).await;
    st.refused(&a, 401, 2);
    let old = now - 3600;
    let a = st.post(path, &h(old, sign(&k, old, &cmd)), &cmd).await;
    st.refused(&a, 401, 2);
}

/// Zoom: `x-zm-signature` v0; the URL validation answered with the plainToken and its
/// HMAC; a retry keeping its first timestamp 85 minutes on still passes the default
/// 90-minute window.
#[tokio::test]
async fn zoom_validation_and_retries() {
    let secret = "zoom-secret-token";
    let st = stack(route("zoom", "zoom", &[secret], "handshake = \"answer\"\n")).await;
    let path = "/hooks/zoom";
    let sign = |secret: &str, ts: i64, body: &[u8]| {
        s(&py(json!({"op":"zoom","secret":secret,"ts":ts,"body_b64":b64(body)}))["signature"])
    };
    let h = |ts: i64, sig: String| {
        vec![
            json_h(),
            ("x-zm-signature", sig),
            ("x-zm-request-timestamp", ts.to_string()),
        ]
    };
    let now = now_secs();
    let plain = "qgg8vlvZRS6UYooatFL8Aw";
    let v = format!(
        r#"{{"payload":{{"plainToken":"{plain}"}},"event_ts":{},"event":"endpoint.url_validation"}}"#,
        now * 1000
    )
    .into_bytes();
    let a = st.post(path, &h(now, sign(secret, now, &v)), &v).await;
    let want = s(&py(json!({"op":"zoom","secret":secret,"plain":plain}))["encrypted"]);
    assert_eq!(
        (a.status, a.json()),
        (200, json!({"plainToken": plain, "encryptedToken": want}))
    );
    let a = st.post(path, &h(now, sign("x", now, &v)), &v).await;
    st.refused(&a, 401, 0);
    let a = st.post(path, &[json_h()], &v).await;
    st.refused(&a, 401, 0);
    let body = format!(
        r#"{{"event":"meeting.started","payload":{{"account_id":"a","object":{{"id":"{}"}}}},"event_ts":{}}}"#,
        unique_id("m"),
        now * 1000
    )
    .into_bytes();
    let sig = sign(secret, now, &body);
    let a = st.post(path, &h(now, sig.clone()), &body).await;
    st.forwarded(&a, 1, &body, &sha_key("zoom", &body));
    // Zoom's last retry, 85 minutes on, resending the first attempt's signed headers
    let first = now - 85 * 60;
    let a = st
        .post(path, &h(first, sign(secret, first, &body)), &body)
        .await;
    st.replayed(&a, 1);
    let stale = now - 100 * 60;
    let a = st
        .post(path, &h(stale, sign(secret, stale, &body)), &body)
        .await;
    st.refused(&a, 401, 1);
    let mut tampered = body.clone();
    tampered[4] ^= 1;
    let a = st.post(path, &h(now, sig.clone()), &tampered).await;
    st.refused(&a, 401, 1);
    let a = st.post(path, &h(now, sign("x", now, &body)), &body).await;
    st.refused(&a, 401, 1);
    let a = st
        .post(
            path,
            &[json_h(), ("x-zm-request-timestamp", now.to_string())],
            &body,
        )
        .await;
    st.refused(&a, 400, 1);
}

/// X (Account Activity): CRC answered for tokens of X's shape and refused for
/// body-shaped ones; POSTs signed with `x-twitter-webhooks-signature`, keyed by the body.
#[tokio::test]
async fn twitter_crc_and_signed_posts() {
    let secret = "consumer-secret";
    let st = stack(route("x", "twitter", &[secret], "handshake = \"answer\"\n")).await;
    let path = "/hooks/x";
    let token = "MjE1NDc2MjY4OTk0NTc2MTA1Mg==";
    let a = st
        .get(&format!("{path}?crc_token={}", token.replace('=', "%3D")))
        .await;
    let want = s(&py(json!({"op":"twitter","secret":secret,"crc_token":token}))["signature"]);
    assert_eq!((a.status, a.json()), (200, json!({"response_token": want})));
    // a token that could be a body (JSON), or too long: refused, nothing signed
    for bad in [
        "%7B%22a%22%3A1%7D",
        &"A".repeat(129),
        "a%20b",
        "123",
        "true",
    ] {
        let a = st.get(&format!("{path}?crc_token={bad}")).await;
        st.refused(&a, 400, 0);
        assert!(!a.text().contains("response_token"));
    }
    // the signature a CRC answer hands out verifies no POST: the token as a body is
    // not a JSON object, so it is refused, never forwarded
    let forged = "abcDEF123";
    let a = st.get(&format!("{path}?crc_token={forged}")).await;
    assert_eq!(a.status, 200);
    let crc_sig = a.json()["response_token"].as_str().unwrap().to_string();
    let a = st
        .post(
            path,
            &[json_h(), ("x-twitter-webhooks-signature", crc_sig)],
            forged.as_bytes(),
        )
        .await;
    st.refused(&a, 401, 0);
    let sign = |secret: &str, body: &[u8]| {
        s(&py(json!({"op":"twitter","secret":secret,"body_b64":b64(body)}))["signature"])
    };
    let h = |sig: String| vec![json_h(), ("x-twitter-webhooks-signature", sig)];
    let body = format!(
        r#"{{"for_user_id":"2244994945","tweet_create_events":[{{"id_str":"{}"}}]}}"#,
        unique_id("t")
    )
    .into_bytes();
    let a = st.post(path, &h(sign(secret, &body)), &body).await;
    st.forwarded(&a, 1, &body, &sha_key("x", &body));
    let a = st.post(path, &h(sign(secret, &body)), &body).await;
    st.replayed(&a, 1);
    let mut tampered = body.clone();
    tampered[5] ^= 1;
    let a = st.post(path, &h(sign(secret, &body)), &tampered).await;
    st.refused(&a, 401, 1);
    let a = st.post(path, &h(sign("other", &body)), &body).await;
    st.refused(&a, 401, 1);
    let a = st.post(path, &[json_h()], &body).await;
    st.refused(&a, 400, 1);
}

/// With the default `handshake = "forward"`, Discord's PING, Zoom's URL validation and
/// X's CRC reach the application (unclaimed, each time) and its answer goes back.
#[tokio::test]
async fn handshakes_forwarded_by_default_reach_the_application() {
    let now = now_secs();
    let k = py(json!({"op":"discord_keygen"}));
    let st = stack(route("discord", "discord", &[&s(&k["public_hex"])], "")).await;
    let ping = br#"{"id":"1","application_id":"9","type":1,"token":"t","version":1}"#;
    let sig = s(&py(json!({"op":"discord","private_hex":k["private_hex"],
        "public_hex":k["public_hex"],"ts":now,"body_b64":b64(ping)}))["signature"]);
    let h = vec![
        json_h(),
        ("x-signature-ed25519", sig),
        ("x-signature-timestamp", now.to_string()),
    ];
    for n in 1..=2 {
        let a = st.post("/hooks/discord", &h, ping).await;
        assert_eq!((a.status, a.body.as_slice()), (200, UPSTREAM_OK));
        assert_eq!(st.upstream.count(), n);
    }
    assert_eq!(st.sidecar.requests_total("discord", "handshake").await, 2.0);

    let st = stack(route("zoom", "zoom", &["zt"], "")).await;
    let v = br#"{"payload":{"plainToken":"p"},"event_ts":1,"event":"endpoint.url_validation"}"#;
    let sig = s(&py(json!({"op":"zoom","secret":"zt","ts":now,"body_b64":b64(v)}))["signature"]);
    let h = vec![
        json_h(),
        ("x-zm-signature", sig),
        ("x-zm-request-timestamp", now.to_string()),
    ];
    let a = st.post("/hooks/zoom", &h, v).await;
    assert_eq!((a.status, st.upstream.count()), (200, 1));
    assert_eq!(&st.upstream.last().body[..], &v[..]);

    let st = stack(route("x", "twitter", &["cs"], "")).await;
    let a = st.get("/hooks/x?crc_token=abcDEF123").await;
    assert_eq!((a.status, st.upstream.count()), (200, 1));
    assert!(
        st.upstream
            .last()
            .path_and_query
            .ends_with("crc_token=abcDEF123")
    );
    let a = st.get("/hooks/x?crc_token=%7B%7D").await;
    st.refused(&a, 400, 1);
}

/// On an async route a handshake and a keyless request are still answered while the
/// provider waits: the application's answer (the challenge echo) goes back, never the
/// route's acknowledgement, and nothing is queued or claimed.
#[tokio::test]
async fn async_routes_forward_handshakes_and_keyless_requests_synchronously() {
    let secret = "8f742231b10e8888abcd99yyyzzz85a5";
    let extra = "mode = \"async\"\nack_status = 202\nack_body = \"queued\"\n";
    let st = stack(route("slack", "slack", &[secret], extra)).await;
    let path = "/hooks/slack";
    let now = now_secs();
    let body = format!(
        r#"{{"token":"t","challenge":"{}","type":"url_verification"}}"#,
        unique_id("chal")
    )
    .into_bytes();
    let a = st
        .post(
            path,
            &slack_h(now, slack_sign(secret, now, &body), false),
            &body,
        )
        .await;
    assert_eq!((a.status, &a.body[..]), (200, UPSTREAM_OK), "{}", a.text());
    assert_eq!(st.upstream.count(), 1);
    assert_eq!(st.upstream.last().body, body);
    assert_eq!(st.sidecar.requests_total("slack", "handshake").await, 1.0);
    let cmd = b"token=x&team_id=T1&command=%2Fdeploy&text=prod&trigger_id=1.2.3".to_vec();
    let a = st
        .post(
            path,
            &slack_h(now, slack_sign(secret, now, &cmd), true),
            &cmd,
        )
        .await;
    assert_eq!((a.status, &a.body[..]), (200, UPSTREAM_OK), "{}", a.text());
    assert_eq!(st.upstream.count(), 2);
    assert_eq!(st.sidecar.requests_total("slack", "unkeyed").await, 1.0);
    assert_eq!(st.sidecar.requests_total("slack", "queued").await, 0.0);
    // an event on the same route is acknowledged and delivered from the queue
    let event = format!(
        r#"{{"type":"event_callback","event_id":"{}","event":{{"type":"app_mention"}}}}"#,
        unique_id("Ev")
    )
    .into_bytes();
    let a = st
        .post(
            path,
            &slack_h(now, slack_sign(secret, now, &event), false),
            &event,
        )
        .await;
    assert_eq!(
        (a.status, &a.body[..]),
        (202, &b"queued"[..]),
        "{}",
        a.text()
    );
    st.upstream
        .wait_for_count(3, std::time::Duration::from_secs(10))
        .await;
    assert_eq!(st.upstream.last().body, event);
}
