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

use crate::common::preset_stack::*;
use crate::common::*;
use base64::Engine as _;
use serde_json::{Value, json};

/// Runs this file's independent signer with one JSON request.
fn py(req: Value) -> Value {
    crate::common::signer::sign_with("sign_b.py", &req)
}

use crate::common::signer::text as s;

/// Signs `body` with `op` and returns the signer's `field`.
fn sig(op: &str, secret: &str, body: &[u8], extra: Value) -> String {
    let mut req = json!({"op": op, "secret": secret, "body_b64": b64(body)});
    if let (Some(r), Some(e)) = (req.as_object_mut(), extra.as_object()) {
        r.extend(e.clone());
    }
    s(&py(req)["signature"])
}

async fn stack(name: &str, provider: &str, secrets: &[&str], extra: &str) -> Stack {
    Stack::start(route(name, provider, secrets, extra)).await
}

impl Stack {
    /// A JSON POST to the route's own path.
    async fn post_json(&self, headers: &[(&str, String)], body: &[u8]) -> Answer {
        let mut h = vec![json_h()];
        h.extend(headers.iter().cloned());
        self.post(&self.path, &h, body).await
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
    let a = st.post_json(&h("id-1", good.clone()), &body).await;
    st.forwarded(&a, 1, &body, &format!("{provider}:id-1"));
    let a = st.post_json(&h("id-1", good.clone()), &body).await;
    st.replayed(&a, 1);
    // The unsigned-key guard: the captured request under a fresh id.
    let a = st.post_json(&h("id-2-forged", good.clone()), &body).await;
    st.replayed(&a, 1);
    let a = st
        .post_json(&h("id-3", good.clone()), &flipped(&body, 3))
        .await;
    st.refused(&a, 401, 1);
    let a = st
        .post_json(&h("id-4", sig(op, "wrong", &body, json!({}))), &body)
        .await;
    st.refused(&a, 401, 1);
    let mut missing = h("id-5", good);
    missing.retain(|(k, _)| *k != sig_header);
    let a = st.post_json(&missing, &body).await;
    st.refused(&a, 400, 1);
    // Rotation: another event signed with the second secret.
    let body2 = format!(r#"{{"event":"y","n":"{}"}}"#, unique_id(provider)).into_bytes();
    let a = st
        .post_json(&h("id-6", sig(op, s2, &body2, json!({}))), &body2)
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
        .post_json(&h(sig("intercom", s1, &body, json!({}))), &body)
        .await;
    st.forwarded(&a, 1, &body, &format!("intercom:{id}"));
    let a = st
        .post_json(&h(sig("intercom", s1, &body, json!({}))), &body)
        .await;
    st.replayed(&a, 1);
    // Intercom's retry rewrites its delivery fields inside the signed body.
    let retry = body_at(2, 1_700_000_061);
    let a = st
        .post_json(&h(sig("intercom", s1, &retry, json!({}))), &retry)
        .await;
    st.replayed(&a, 1);
    let good = sig("intercom", s1, &body, json!({}));
    let a = st.post_json(&h(good.clone()), &flipped(&body, 20)).await;
    st.refused(&a, 401, 1);
    let a = st
        .post_json(&h(sig("intercom", "x", &body, json!({}))), &body)
        .await;
    st.refused(&a, 401, 1);
    let a = st.post_json(&[], &body).await;
    st.refused(&a, 400, 1);
    // a SHA-256 signature under Intercom's header is not Intercom's scheme
    let a = st
        .post_json(&h(good.replace("sha1=", "sha256=")), &body)
        .await;
    st.refused(&a, 401, 1);
    let id2 = unique_id("notif");
    let body2 = format!(r#"{{"type":"notification_event","id":"{id2}"}}"#).into_bytes();
    let a = st
        .post_json(&h(sig("intercom", s2, &body2, json!({}))), &body2)
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
    let a = st.post_json(&sign(s1, url, &body), &body).await;
    st.forwarded(&a, 1, &body, &format!("square:{ev}"));
    let a = st.post_json(&sign(s1, url, &body), &body).await;
    st.replayed(&a, 1);
    let a = st
        .post_json(&sign(s1, url, &body), &flipped(&body, 5))
        .await;
    st.refused(&a, 401, 1);
    let a = st.post_json(&sign("nope", url, &body), &body).await;
    st.refused(&a, 401, 1);
    // signed for another notification URL
    let a = st
        .post_json(&sign(s1, "https://hooks.example.com/other", &body), &body)
        .await;
    st.refused(&a, 401, 1);
    let a = st.post_json(&[], &body).await;
    st.refused(&a, 400, 1);
    let ev2 = unique_id("sq");
    let body2 = format!(r#"{{"event_id":"{ev2}"}}"#).into_bytes();
    let a = st.post_json(&sign(s2, url, &body2), &body2).await;
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
    let a = st.post_json(&h("d-1", good.clone(), now_ms), &body).await;
    st.forwarded(&a, 1, &body, "linear:d-1");
    let a = st.post_json(&h("d-1", good.clone(), now_ms), &body).await;
    st.replayed(&a, 1);
    // Linear's retry: a new delivery id and a fresh signed webhookTimestamp.
    let retry = body_at(now_ms + 20_000);
    let a = st
        .post_json(
            &h("d-2", sig("linear", s1, &retry, json!({})), now_ms),
            &retry,
        )
        .await;
    st.replayed(&a, 1);
    // Stale inside the body: refused, whatever the unsigned header says.
    let stale = body_at(now_ms - 120_000);
    let a = st
        .post_json(
            &h("d-3", sig("linear", s1, &stale, json!({})), now_ms),
            &stale,
        )
        .await;
    st.refused(&a, 401, 1);
    let a = st
        .post_json(&h("d-4", good.clone(), now_ms), &flipped(&body, 12))
        .await;
    st.refused(&a, 401, 1);
    let a = st
        .post_json(
            &h("d-5", sig("linear", "x", &body, json!({})), now_ms),
            &body,
        )
        .await;
    st.refused(&a, 401, 1);
    let a = st
        .post_json(&[("linear-delivery", "d-6".into())], &body)
        .await;
    st.refused(&a, 400, 1);
    let other = format!(
        r#"{{"action":"update","type":"Issue","data":{{"id":"{}"}},"webhookTimestamp":{now_ms}}}"#,
        unique_id("iss")
    )
    .into_bytes();
    let a = st
        .post_json(
            &h("d-7", sig("linear", s2, &other, json!({})), now_ms),
            &other,
        )
        .await;
    st.forwarded(&a, 2, &other, "linear:d-7");
}

#[tokio::test]
async fn gitlab_token_routes_claim_the_content_and_send_one_idempotency_key() {
    let st = stack(
        "gitlab",
        "gitlab",
        &["glpat-hook-token", "second-token"],
        "",
    )
    .await;
    let body = format!(r#"{{"object_kind":"push","ref":"{}"}}"#, unique_id("refs")).into_bytes();
    let h = |key: &str, token: &str| {
        vec![
            ("x-gitlab-event", "Push Hook".to_string()),
            ("idempotency-key", key.to_string()),
            ("x-gitlab-token", token.to_string()),
        ]
    };
    let a = st.post_json(&h("k-1", "glpat-hook-token"), &body).await;
    st.forwarded(&a, 1, &body, "gitlab:k-1");
    // GitLab's own Idempotency-Key is replaced: the application sees exactly one.
    assert_eq!(
        st.upstream.last().header_all("idempotency-key"),
        vec!["gitlab:k-1".to_string()]
    );
    let a = st.post_json(&h("k-1", "glpat-hook-token"), &body).await;
    st.replayed(&a, 1);
    // The token authenticates no body: the same body under a fresh key is the same
    // content, so it is replayed, not forwarded.
    let a = st
        .post_json(&h("k-2-forged", "glpat-hook-token"), &body)
        .await;
    st.replayed(&a, 1);
    let a = st.post_json(&h("k-3", "wrong-token"), &body).await;
    st.refused(&a, 401, 1);
    let a = st
        .post_json(&[("idempotency-key", "k-4".to_string())], &body)
        .await;
    st.refused(&a, 400, 1);
    let body2 = format!(r#"{{"object_kind":"tag_push","ref":"{}"}}"#, unique_id("t")).into_bytes();
    let a = st.post_json(&h("k-5", "second-token"), &body2).await;
    st.forwarded(&a, 2, &body2, "gitlab:k-5");
}

#[tokio::test]
async fn gitlab_signing_token_verifies_standard_webhooks() {
    let signing = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let st = stack("glsigned", "gitlab", &["plain-token", signing], "").await;
    let body = format!(
        r#"{{"object_kind":"merge_request","n":"{}"}}"#,
        unique_id("mr")
    )
    .into_bytes();
    let sign = |secret: &str, id: &str, ts: i64, body: &[u8]| {
        s(
            &py(
                json!({"op":"gitlab_standard","secret":secret,"id":id,"ts":ts,"body_b64":b64(body)}),
            )["signature"],
        )
    };
    let h = |id: &str, ts: i64, sig: String| {
        vec![
            ("idempotency-key", id.to_string()),
            ("x-gitlab-token", "plain-token".to_string()),
            ("webhook-id", id.to_string()),
            ("webhook-timestamp", ts.to_string()),
            ("webhook-signature", sig),
        ]
    };
    let now = now_secs();
    let a = st
        .post_json(&h("m-1", now, sign(signing, "m-1", now, &body)), &body)
        .await;
    st.forwarded(&a, 1, &body, "glsigned:m-1");
    let a = st
        .post_json(&h("m-1", now, sign(signing, "m-1", now, &body)), &body)
        .await;
    st.replayed(&a, 1);
    let good = sign(signing, "m-2", now, &body);
    let a = st
        .post_json(&h("m-2", now, good.clone()), &flipped(&body, 4))
        .await;
    st.refused(&a, 401, 1);
    let stale = now - 3600;
    let a = st
        .post_json(&h("m-3", stale, sign(signing, "m-3", stale, &body)), &body)
        .await;
    st.refused(&a, 401, 1);
    let other = "whsec_dGhpcyBpcyBub3QgdGhlIGtleQ==";
    let a = st
        .post_json(&h("m-4", now, sign(other, "m-4", now, &body)), &body)
        .await;
    st.refused(&a, 401, 1);
    let mut missing = h("m-5", now, good);
    missing.retain(|(k, _)| *k != "webhook-signature");
    let a = st.post_json(&missing, &body).await;
    st.refused(&a, 400, 1);
}

#[tokio::test]
async fn paddle_signature_rotation_and_window() {
    let (s1, s2) = ("pdl_ntfset_one", "pdl_ntfset_two");
    // The preset's default window is the SDK's 5 s (a unit test pins it); signing in a
    // Python process can take longer than that on a loaded machine.
    let st = stack("paddle", "paddle", &[s1, s2], "tolerance = \"1m\"\n").await;
    let ev = unique_id("evt");
    let body = format!(r#"{{"event_id":"{ev}","event_type":"transaction.completed","data":{{}}}}"#)
        .into_bytes();
    let sign = |secrets: &[&str], ts: i64, body: &[u8]| {
        vec![(
            "paddle-signature",
            s(&py(json!({"op":"paddle","secrets":secrets,"ts":ts,"body_b64":b64(body)}))["header"]),
        )]
    };
    let now = now_secs();
    let a = st.post_json(&sign(&[s1], now, &body), &body).await;
    st.forwarded(&a, 1, &body, &format!("paddle:{ev}"));
    // Paddle's retry: re-signed, same event.
    let a = st.post_json(&sign(&[s1], now_secs(), &body), &body).await;
    st.replayed(&a, 1);
    let a = st
        .post_json(&sign(&[s1], now, &body), &flipped(&body, 6))
        .await;
    st.refused(&a, 401, 1);
    let a = st.post_json(&sign(&[s1], now - 600, &body), &body).await;
    st.refused(&a, 401, 1);
    let a = st.post_json(&sign(&["pdl_other"], now, &body), &body).await;
    st.refused(&a, 401, 1);
    let a = st.post_json(&[], &body).await;
    st.refused(&a, 400, 1);
    let ev2 = unique_id("evt");
    let body2 = format!(r#"{{"event_id":"{ev2}"}}"#).into_bytes();
    let a = st
        .post_json(&sign(&["pdl_unknown", s2], now_secs(), &body2), &body2)
        .await;
    st.forwarded(&a, 2, &body2, &format!("paddle:{ev2}"));
}

#[tokio::test]
async fn hubspot_v3_only_and_attempt_numbers_ignored() {
    let url = "https://hooks.example.com/hubspot";
    let (s1, s2) = ("hs-client-secret-1", "hs-client-secret-2");
    let st = stack(
        "hubspot",
        "hubspot",
        &[s1, s2],
        &format!("public_url = \"{url}\"\n"),
    )
    .await;
    let ev = now_secs() * 1000 + 7;
    let body_at = |attempt: u32| {
        format!(
            r#"[{{"eventId":{ev},"subscriptionId":12,"portalId":34,"occurredAt":1700000000000,"subscriptionType":"contact.creation","attemptNumber":{attempt},"objectId":56}}]"#
        )
        .into_bytes()
    };
    let sign = |secret: &str, ts_ms: i64, body: &[u8]| {
        vec![
            (
                "x-hubspot-signature-v3",
                sig("hubspot", secret, body, json!({"url": url, "ts_ms": ts_ms})),
            ),
            ("x-hubspot-request-timestamp", ts_ms.to_string()),
        ]
    };
    let now_ms = now_secs() * 1000;
    let body = body_at(0);
    let a = st.post_json(&sign(s1, now_ms, &body), &body).await;
    st.forwarded(&a, 1, &body, &format!("hubspot:{ev}"));
    let a = st.post_json(&sign(s1, now_ms, &body), &body).await;
    st.replayed(&a, 1);
    // HubSpot's retry bumps attemptNumber inside the signed body.
    let retry = body_at(1);
    let a = st.post_json(&sign(s1, now_ms + 1000, &retry), &retry).await;
    st.replayed(&a, 1);
    let a = st
        .post_json(&sign(s1, now_ms, &body), &flipped(&body, 15))
        .await;
    st.refused(&a, 401, 1);
    let a = st.post_json(&sign("nope", now_ms, &body), &body).await;
    st.refused(&a, 401, 1);
    let old = now_ms - 600_000;
    let a = st.post_json(&sign(s1, old, &body), &body).await;
    st.refused(&a, 401, 1);
    // A v1 signature alone (SHA-256 of secret + body) is never accepted.
    let v1 = {
        use sha2::Digest;
        let mut m = s1.as_bytes().to_vec();
        m.extend_from_slice(&body);
        hex::encode(sha2::Sha256::digest(&m))
    };
    let a = st
        .post_json(
            &[
                ("x-hubspot-signature", v1),
                ("x-hubspot-signature-version", "v1".into()),
            ],
            &body,
        )
        .await;
    st.refused(&a, 400, 1);
    let ev2 = ev + 1;
    let body2 = format!(r#"[{{"eventId":{ev2},"attemptNumber":0}}]"#).into_bytes();
    let a = st.post_json(&sign(s2, now_ms, &body2), &body2).await;
    st.forwarded(&a, 2, &body2, &format!("hubspot:{ev2}"));
}

#[tokio::test]
async fn mailgun_claims_the_signed_token() {
    let (k1, k2) = ("mg-signing-key-1", "mg-signing-key-2");
    let st = stack("mailgun", "mailgun", &[k1, k2], "").await;
    let body_for = |key: &str, ts: i64, token: &str, event_id: &str, recipient: &str| {
        let signature = sig("mailgun", key, b"", json!({"ts": ts, "token": token}));
        format!(
            r#"{{"signature":{{"timestamp":"{ts}","token":"{token}","signature":"{signature}"}},"event-data":{{"id":"{event_id}","event":"delivered","recipient":"{recipient}"}}}}"#
        )
        .into_bytes()
    };
    let now = now_secs();
    let token = unique_id("tok");
    let body = body_for(k1, now, &token, "ev-1", "a@example.com");
    let a = st.post_json(&[], &body).await;
    st.forwarded(&a, 1, &body, "mailgun:ev-1");
    let a = st.post_json(&[], &body).await;
    st.replayed(&a, 1);
    // The event data is unsigned: the captured token under other event data (a fresh
    // id, another recipient) is refused, never forwarded.
    let forged = body_for(k1, now, &token, "ev-2-forged", "b@example.com");
    let a = st.post_json(&[], &forged).await;
    assert_eq!(a.status, 422, "a reused token: {} {}", a.status, a.text());
    assert_eq!(st.upstream.count(), 1);
    // A flipped byte of the signed token; the wrong key; a stale timestamp; no signature.
    let t2 = unique_id("tok");
    let good = body_for(k1, now, &t2, "ev-3", "a@example.com");
    let pos = good
        .windows(t2.len())
        .position(|w| w == t2.as_bytes())
        .unwrap();
    let a = st.post_json(&[], &flipped(&good, pos + 2)).await;
    st.refused(&a, 401, 1);
    let a = st
        .post_json(
            &[],
            &body_for("wrong", now, &unique_id("tok"), "ev-4", "a@x"),
        )
        .await;
    st.refused(&a, 401, 1);
    let a = st
        .post_json(
            &[],
            &body_for(k1, now - 3600, &unique_id("tok"), "ev-5", "a@x"),
        )
        .await;
    st.refused(&a, 401, 1);
    let a = st
        .post_json(&[], br#"{"event-data":{"id":"ev-6","event":"delivered"}}"#)
        .await;
    st.refused(&a, 400, 1);
    let body2 = body_for(k2, now, &unique_id("tok"), "ev-7", "c@example.com");
    let a = st.post_json(&[], &body2).await;
    st.forwarded(&a, 2, &body2, "mailgun:ev-7");
}

#[tokio::test]
async fn sendgrid_ecdsa_batches_claimed_by_content() {
    let k1 = py(json!({"op":"ec_keygen"}));
    let k2 = py(json!({"op":"ec_keygen"}));
    let st = stack(
        "sendgrid",
        "sendgrid",
        &[&s(&k1["public_b64"]), &s(&k2["public_b64"])],
        // the harness keeps keys 1h: a window inside it (the preset's default is 24h)
        "tolerance = \"30m\"\n",
    )
    .await;
    let sign = |k: &Value, ts: i64, body: &[u8]| {
        let sig = s(&py(json!({
            "op": "sendgrid", "private_pem": k["private_pem"], "public_b64": k["public_b64"],
            "ts": ts, "body_b64": b64(body),
        }))["signature"]);
        vec![
            ("x-twilio-email-event-webhook-signature", sig),
            ("x-twilio-email-event-webhook-timestamp", ts.to_string()),
        ]
    };
    let e1 = unique_id("sg");
    // A batch, with the trailing CRLF SendGrid sends (it is signed too).
    let body = format!(
        "[{{\"email\":\"a@example.com\",\"event\":\"delivered\",\"sg_event_id\":\"{e1}\"}},{{\"email\":\"b@example.com\",\"event\":\"open\",\"sg_event_id\":\"{e1}-b\"}}]\r\n"
    )
    .into_bytes();
    let now = now_secs();
    let a = st.post_json(&sign(&k1, now, &body), &body).await;
    st.forwarded(&a, 1, &body, &format!("sendgrid:{e1}"));
    // SendGrid's retry of the batch, re-signed later.
    let a = st.post_json(&sign(&k1, now + 60, &body), &body).await;
    st.replayed(&a, 1);
    // The trailing CRLF is signed: dropping it breaks the signature.
    let a = st
        .post_json(&sign(&k1, now, &body), &body[..body.len() - 2])
        .await;
    st.refused(&a, 401, 1);
    let a = st
        .post_json(&sign(&k1, now, &body), &flipped(&body, 10))
        .await;
    st.refused(&a, 401, 1);
    let k3 = py(json!({"op":"ec_keygen"}));
    let a = st.post_json(&sign(&k3, now, &body), &body).await;
    st.refused(&a, 401, 1);
    let stale = now - 2 * 86_400;
    let a = st.post_json(&sign(&k1, stale, &body), &body).await;
    st.refused(&a, 401, 1);
    let a = st.post_json(&[], &body).await;
    st.refused(&a, 400, 1);
    let e2 = unique_id("sg");
    let body2 = format!("[{{\"event\":\"bounce\",\"sg_event_id\":\"{e2}\"}}]\r\n").into_bytes();
    let a = st.post_json(&sign(&k2, now, &body2), &body2).await;
    st.forwarded(&a, 2, &body2, &format!("sendgrid:{e2}"));
}

#[tokio::test]
async fn adyen_checks_every_item_and_fingerprints_whole_items() {
    let (k1, k2) = (
        "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056",
        "0123456789ABCDEF0123456789ABCDEF0123456789ABCDEF0123456789ABCDEF",
    );
    let st = stack("adyen", "adyen", &[k1, k2], "").await;
    let item = |psp: &str, reason: &str| {
        json!({"NotificationRequestItem": {
            "pspReference": psp, "originalReference": "", "merchantAccountCode": "TestMerchant",
            "merchantReference": "order-1", "amount": {"value": 1130, "currency": "EUR"},
            "eventCode": "AUTHORISATION", "success": "true", "reason": reason,
            "eventDate": "2026-01-01T00:00:00+01:00",
            "additionalData": {"authCode": "1234"}
        }})
    };
    let signed = |key: &str, items: Vec<Value>| -> Vec<u8> {
        let doc = json!({"live": "false", "notificationItems": items});
        let out =
            py(json!({"op":"adyen","hex_key":key,"body_b64":b64(doc.to_string().as_bytes())}));
        base64::engine::general_purpose::STANDARD
            .decode(s(&out["body_b64"]))
            .unwrap()
    };
    let psp = unique_id("PSP");
    let body = signed(k1, vec![item(&psp, "ok")]);
    let key = format!("adyen:{psp}:AUTHORISATION:true");
    let a = st.post_json(&[], &body).await;
    st.forwarded(&a, 1, &body, &key);
    let a = st.post_json(&[], &body).await;
    st.replayed(&a, 1);
    // An unsigned field changed under the same signature: the same key, another
    // fingerprint: refused with 422, never forwarded.
    let altered = String::from_utf8(body.clone())
        .unwrap()
        .replace("\"ok\"", "\"ko\"");
    let a = st.post_json(&[], altered.as_bytes()).await;
    assert_eq!(a.status, 422, "{} {}", a.status, a.text());
    assert_eq!(st.upstream.count(), 1);
    // A signed field changed: 401.
    let tampered = String::from_utf8(body.clone())
        .unwrap()
        .replace("1130", "1131");
    let a = st.post_json(&[], tampered.as_bytes()).await;
    st.refused(&a, 401, 1);
    let a = st
        .post_json(&[], &signed("00FF", vec![item(&unique_id("PSP"), "ok")]))
        .await;
    st.refused(&a, 401, 1);
    // A batch: every item is checked; one unsigned item refuses the whole request.
    let mut batch: Value = serde_json::from_slice(&signed(
        k1,
        vec![item(&unique_id("PSP"), "ok"), item(&unique_id("PSP"), "ok")],
    ))
    .unwrap();
    batch["notificationItems"][1]["NotificationRequestItem"]["additionalData"]
        .as_object_mut()
        .unwrap()
        .remove("hmacSignature");
    let a = st.post_json(&[], batch.to_string().as_bytes()).await;
    st.refused(&a, 400, 1);
    let psp2 = unique_id("PSP");
    let body2 = signed(k2, vec![item(&psp2, "ok"), item(&unique_id("PSP"), "ok")]);
    let a = st.post_json(&[], &body2).await;
    st.forwarded(&a, 2, &body2, &format!("adyen:{psp2}:AUTHORISATION:true"));
}
