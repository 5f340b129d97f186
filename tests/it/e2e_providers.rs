//! Every provider preset end to end: the real binary, a private redis-server and the
//! recording upstream, with deliveries signed by an independent implementation
//! (`tests/signers/sign.py`: Python's hmac/hashlib and the `cryptography` package).
//!
//! For each preset: a signed delivery is forwarded byte for byte with
//! `idempotency-key: <route>:<key>`; its copy gets the stored answer, marked replayed;
//! a tampered copy gets 401 and is not forwarded; and a delivery signed with the second
//! configured secret or key (rotation) passes too.

use std::process::Command;

use crate::common::preset_stack::*;
use crate::common::*;
use base64::Engine as _;
use serde_json::{Value, json};

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// Runs this file's independent signer with one JSON request.
fn py(req: Value) -> Value {
    crate::common::signer::sign_with("sign.py", &req)
}

use crate::common::signer::text as s;

async fn stack(r: RouteCfg) -> Stack {
    Stack::start(r).await
}

#[tokio::test]
async fn github_signed_forwarded_replayed_and_guarded_by_content() {
    let (s1, s2) = ("gh-secret-one", "gh-secret-two");
    let st = stack(route("gh", "github", &[s1, s2], "")).await;
    let path = "/hooks/gh";
    let body = format!(r#"{{"action":"opened","n":"{}"}}"#, unique_id("gh")).into_bytes();
    let sign = |secret: &str, body: &[u8]| {
        s(&py(json!({"op":"github","secret":secret,"body_b64":b64(body)}))["signature"])
    };
    let sig = sign(s1, &body);
    let h = |id: &str, sig: &str| {
        vec![
            json_h(),
            ("x-github-delivery", id.to_string()),
            ("x-hub-signature-256", sig.to_string()),
        ]
    };
    let a = st.post(path, &h("d-1", &sig), &body).await;
    st.forwarded(&a, 1, &body, "gh:d-1");
    let a = st.post(path, &h("d-1", &sig), &body).await;
    st.replayed_with(&a, 1, UPSTREAM_OK);
    // Claimed under the body's hash, in one Redis Cluster slot: {prefix}:{route:key}.
    let keys = st.redis.keys();
    assert!(
        keys.iter()
            .any(|k| k.starts_with("idemgate-test:{gh:sha256:") && k.ends_with('}')),
        "{keys:?}"
    );
    // The unsigned-key guard: the captured request under a fresh delivery ID.
    let a = st.post(path, &h("d-2-forged", &sig), &body).await;
    st.replayed_with(&a, 1, UPSTREAM_OK);
    // Tampered: one byte of the body changed under the same signature.
    let mut tampered = body.clone();
    tampered[3] ^= 1;
    let a = st.post(path, &h("d-3", &sig), &tampered).await;
    st.refused(&a, 401, 1);
    // Wrong secret; missing signature; missing delivery ID.
    let a = st.post(path, &h("d-4", &sign("nope", &body)), &body).await;
    st.refused(&a, 401, 1);
    let a = st
        .post(
            path,
            &[json_h(), ("x-github-delivery", "d-5".into())],
            &body,
        )
        .await;
    st.refused(&a, 400, 1);
    let a = st
        .post(
            path,
            &[json_h(), ("x-hub-signature-256", sig.clone())],
            &body,
        )
        .await;
    st.refused(&a, 400, 1);
    // Rotation: another event signed with the second secret.
    let body2 = format!(r#"{{"action":"closed","n":"{}"}}"#, unique_id("gh")).into_bytes();
    let a = st.post(path, &h("d-6", &sign(s2, &body2)), &body2).await;
    st.forwarded(&a, 2, &body2, "gh:d-6");
}

#[tokio::test]
async fn stripe_signed_forwarded_replayed_rotated() {
    let (s1, s2) = ("whsec_stripe_one", "whsec_stripe_two");
    let st = stack(route("stripe", "stripe", &[s1, s2], "")).await;
    let path = "/hooks/stripe";
    let evt = unique_id("evt");
    let body =
        format!(r#"{{"id":"{evt}","object":"event","type":"charge.succeeded"}}"#).into_bytes();
    let sign = |secrets: &[&str], ts: i64, body: &[u8]| {
        s(&py(json!({"op":"stripe","secrets":secrets,"ts":ts,"body_b64":b64(body)}))["header"])
    };
    let h = |v: String| vec![json_h(), ("stripe-signature", v)];
    let now = now_secs();
    let a = st.post(path, &h(sign(&[s1], now, &body)), &body).await;
    st.forwarded(&a, 1, &body, &format!("stripe:{evt}"));
    // Stripe's retry: the same body, re-signed with a later timestamp.
    let a = st.post(path, &h(sign(&[s1], now + 1, &body)), &body).await;
    st.replayed_with(&a, 1, UPSTREAM_OK);
    let mut tampered = body.clone();
    tampered[10] ^= 1;
    let a = st.post(path, &h(sign(&[s1], now, &body)), &tampered).await;
    st.refused(&a, 401, 1);
    // Outside the window; the wrong secret; no header.
    let a = st
        .post(path, &h(sign(&[s1], now - 3600, &body)), &body)
        .await;
    st.refused(&a, 401, 1);
    let a = st
        .post(path, &h(sign(&["whsec_x"], now, &body)), &body)
        .await;
    st.refused(&a, 401, 1);
    let a = st.post(path, &[json_h()], &body).await;
    st.refused(&a, 400, 1);
    // Rotation: signed with the second secret only, and during a roll two v1 entries.
    let evt2 = unique_id("evt");
    let body2 = format!(r#"{{"id":"{evt2}","object":"event"}}"#).into_bytes();
    let a = st.post(path, &h(sign(&[s2], now, &body2)), &body2).await;
    st.forwarded(&a, 2, &body2, &format!("stripe:{evt2}"));
    let evt3 = unique_id("evt");
    let body3 = format!(r#"{{"id":"{evt3}","object":"event"}}"#).into_bytes();
    let a = st
        .post(
            path,
            &h(sign(&["whsec_new_unknown", s1], now, &body3)),
            &body3,
        )
        .await;
    st.forwarded(&a, 3, &body3, &format!("stripe:{evt3}"));
}

#[tokio::test]
async fn shopify_composite_key_and_content_guard() {
    let (s1, s2) = ("shpss_one", "shpss_two");
    let st = stack(route("shop", "shopify", &[s1, s2], "")).await;
    let path = "/hooks/shop";
    let body = format!(r#"{{"id":{},"total":"1.00"}}"#, now_secs()).into_bytes();
    let sign = |secret: &str, body: &[u8]| {
        s(&py(json!({"op":"shopify","secret":secret,"body_b64":b64(body)}))["signature"])
    };
    let h = |event: &str, sig: String| {
        vec![
            json_h(),
            ("x-shopify-hmac-sha256", sig),
            ("x-shopify-event-id", event.to_string()),
            ("x-shopify-topic", "orders/create".to_string()),
            ("x-shopify-shop-domain", "s.myshopify.com".to_string()),
        ]
    };
    let a = st.post(path, &h("e-1", sign(s1, &body)), &body).await;
    st.forwarded(&a, 1, &body, "shop:e-1:orders/create:s.myshopify.com");
    let a = st.post(path, &h("e-1", sign(s1, &body)), &body).await;
    st.replayed_with(&a, 1, UPSTREAM_OK);
    let a = st.post(path, &h("e-forged", sign(s1, &body)), &body).await;
    st.replayed_with(&a, 1, UPSTREAM_OK);
    // Shopify sends one order JSON under several topics: each is its own event.
    let mut paid = h("e-paid", sign(s1, &body));
    paid.iter_mut()
        .filter(|(k, _)| *k == "x-shopify-topic")
        .for_each(|(_, v)| *v = "orders/paid".into());
    let a = st.post(path, &paid, &body).await;
    st.forwarded(&a, 2, &body, "shop:e-paid:orders/paid:s.myshopify.com");
    let mut tampered = body.clone();
    tampered[2] ^= 1;
    let a = st.post(path, &h("e-2", sign(s1, &body)), &tampered).await;
    st.refused(&a, 401, 2);
    // every part of the composite key is required
    let mut partial = h("e-3", sign(s1, &body));
    partial.retain(|(k, _)| *k != "x-shopify-topic");
    let a = st.post(path, &partial, &body).await;
    st.refused(&a, 400, 2);
    let body2 = br#"{"id":2,"total":"2.00"}"#.to_vec();
    let a = st.post(path, &h("e-4", sign(s2, &body2)), &body2).await;
    st.forwarded(&a, 3, &body2, "shop:e-4:orders/create:s.myshopify.com");
}

#[tokio::test]
async fn slack_events_and_slash_commands() {
    let (s1, s2) = ("slack-signing-one", "slack-signing-two");
    let st = stack(route("slack", "slack", &[s1, s2], "")).await;
    let path = "/hooks/slack";
    let ev = unique_id("Ev");
    let body = format!(r#"{{"type":"event_callback","event_id":"{ev}"}}"#).into_bytes();
    let sign = |secret: &str, ts: i64, body: &[u8]| {
        s(&py(json!({"op":"slack","secret":secret,"ts":ts,"body_b64":b64(body)}))["signature"])
    };
    let h = |ts: i64, sig: String| {
        vec![
            json_h(),
            ("x-slack-request-timestamp", ts.to_string()),
            ("x-slack-signature", sig),
        ]
    };
    let now = now_secs();
    let a = st.post(path, &h(now, sign(s1, now, &body)), &body).await;
    st.forwarded(&a, 1, &body, &format!("slack:{ev}"));
    // Slack's retry (X-Slack-Retry-Num) re-signs the same body
    let mut retry = h(now + 2, sign(s1, now + 2, &body));
    retry.push(("x-slack-retry-num", "1".into()));
    let a = st.post(path, &retry, &body).await;
    st.replayed_with(&a, 1, UPSTREAM_OK);
    let mut tampered = body.clone();
    tampered[4] ^= 1;
    let a = st
        .post(path, &h(now, sign(s1, now, &body)), &tampered)
        .await;
    st.refused(&a, 401, 1);
    let old = now - 600;
    let a = st.post(path, &h(old, sign(s1, old, &body)), &body).await;
    st.refused(&a, 401, 1);
    // A slash command is form-encoded and has no event_id: forwarded undeduplicated
    // (`keyless = "forward"`, Slack's default; e2e_presets_a covers it in full).
    let cmd = b"token=x&team_id=T1&command=%2Fdeploy&text=&trigger_id=1.2.3".to_vec();
    let mut ch = h(now, sign(s1, now, &cmd));
    ch[0] = ("content-type", "application/x-www-form-urlencoded".into());
    let a = st.post(path, &ch, &cmd).await;
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(st.upstream.count(), 2);
    let ev2 = unique_id("Ev");
    let body2 = format!(r#"{{"type":"event_callback","event_id":"{ev2}"}}"#).into_bytes();
    let a = st.post(path, &h(now, sign(s2, now, &body2)), &body2).await;
    st.forwarded(&a, 3, &body2, &format!("slack:{ev2}"));
}

#[tokio::test]
async fn alipay_rsa2_notifications_get_the_stored_success() {
    let k1 = py(json!({"op":"rsa_keygen"}));
    let k2 = py(json!({"op":"rsa_keygen"}));
    // The first key as Alipay's console shows it (bare base64), the second as PEM.
    let dir = tempfile::tempdir().unwrap();
    let pem_path = dir.path().join("alipay_public.pem");
    std::fs::write(&pem_path, s(&k2["public_pem"])).unwrap();
    let file_src = format!("file:{}", pem_path.display());
    let st = stack(route(
        "alipay",
        "alipay",
        &[&s(&k1["public_b64"]), &file_src],
        "",
    ))
    .await;
    st.upstream.set_mode(Mode::Ok {
        status: 200,
        headers: vec![("content-type".into(), "text/plain".into())],
        body: b"success".to_vec(),
    });
    let path = "/hooks/alipay";
    let notify = |notify_id: &str, amount: &str, subject: &str| {
        json!([
            ["notify_type", "trade_status_sync"],
            ["notify_id", notify_id],
            ["notify_time", "2026-01-01 10:00:00"],
            ["charset", "utf-8"],
            ["sign_type", "RSA2"],
            ["out_trade_no", "order-1"],
            ["subject", subject],
            ["total_amount", amount],
            ["trade_status", "TRADE_SUCCESS"],
            ["passback_params", ""],
        ])
    };
    let sign = |key: &Value, fields: Value, keep: bool, charset: &str| {
        let mut f = fields;
        for pair in f.as_array_mut().unwrap() {
            if pair[0] == "charset" {
                pair[1] = json!(charset);
            }
        }
        let out = py(
            json!({"op":"alipay","private_pem":key["private_pem"],"fields":f,
            "keep_sign_type":keep,"charset":charset}),
        );
        B64.decode(s(&out["body_b64"])).unwrap()
    };
    let form = || {
        vec![(
            "content-type",
            "application/x-www-form-urlencoded".to_string(),
        )]
    };
    let id1 = unique_id("n");
    let body = sign(&k1, notify(&id1, "9.90", "语雀空间"), false, "utf-8");
    // The application is not ready and answers 200 `fail`: to Alipay that is a failure,
    // so nothing is stored and Alipay's retry reaches the application again.
    st.upstream.push_modes(vec![Mode::Ok {
        status: 200,
        headers: vec![],
        body: b"fail".to_vec(),
    }]);
    let a = st.post(path, &form(), &body).await;
    assert_eq!(
        (a.status, a.body.as_slice(), a.replayed()),
        (200, &b"fail"[..], false)
    );
    assert_eq!(st.upstream.count(), 1);
    let a = st.post(path, &form(), &body).await;
    st.forwarded(&a, 2, &body, &format!("alipay:{id1}"));
    assert_eq!(a.body, b"success");
    // Alipay retries until it sees `success`: the duplicate gets it from the store.
    let a = st.post(path, &form(), &body).await;
    st.replayed_with(&a, 2, b"success");
    // A resend with another notify_time (signed anew) is still the same notification.
    let mut resend_fields = notify(&id1, "9.90", "语雀空间");
    resend_fields[2][1] = json!("2026-01-01 10:02:00");
    let resend = sign(&k1, resend_fields, false, "utf-8");
    let a = st.post(path, &form(), &resend).await;
    st.replayed_with(&a, 2, b"success");
    // Tampered: the amount changed after signing.
    let tampered = String::from_utf8(body.clone())
        .unwrap()
        .replace("total_amount=9.90", "total_amount=0.01")
        .into_bytes();
    assert_ne!(tampered, body);
    let a = st.post(path, &form(), &tampered).await;
    st.refused(&a, 401, 2);
    // A key nobody configured.
    let k3 = py(json!({"op":"rsa_keygen"}));
    let stranger = sign(&k3, notify(&unique_id("n"), "1.00", "x"), false, "utf-8");
    let a = st.post(path, &form(), &stranger).await;
    st.refused(&a, 401, 2);
    // Rotation: the second key, signed with sign_type kept in.
    let id2 = unique_id("n");
    let body2 = sign(&k2, notify(&id2, "1.00", "服务市场"), true, "utf-8");
    let a = st.post(path, &form(), &body2).await;
    st.forwarded(&a, 3, &body2, &format!("alipay:{id2}"));
    // GBK: the body is form-encoded GBK, signed over GBK bytes.
    let id3 = unique_id("n");
    let body3 = sign(&k1, notify(&id3, "2.00", "中文商品"), false, "gbk");
    assert!(String::from_utf8(body3.clone()).unwrap().contains("%D6%D0"));
    let a = st.post(path, &form(), &body3).await;
    st.forwarded(&a, 4, &body3, &format!("alipay:{id3}"));
}

#[tokio::test]
async fn wechatpay_certificates_and_public_key_ids() {
    let k1 = py(json!({"op":"rsa_keygen","serial":"5A1B2C3D4E5F6071"}));
    let k2 = py(json!({"op":"rsa_keygen"}));
    let dir = tempfile::tempdir().unwrap();
    let cert_path = dir.path().join("platform.pem");
    std::fs::write(&cert_path, s(&k1["cert_pem"])).unwrap();
    let cert_src = format!("file:{}", cert_path.display());
    let pub_src = format!("PUB_KEY_ID_0114TEST={}", s(&k2["public_pem"]));
    let st = stack(route("wx", "wechatpay", &[&cert_src, &pub_src], "")).await;
    st.upstream.set_mode(Mode::Ok {
        status: 204,
        headers: vec![],
        body: vec![],
    });
    let path = "/hooks/wx";
    let id = unique_id("wx");
    let body = format!(
        r#"{{"id":"{id}","create_time":"2026-01-01T10:00:00+08:00","event_type":"TRANSACTION.SUCCESS","resource_type":"encrypt-resource","resource":{{"algorithm":"AEAD_AES_256_GCM","ciphertext":"abc","nonce":"n1","associated_data":"transaction"}}}}"#
    )
    .into_bytes();
    let signed = |key: &Value, serial: &str, ts: i64, nonce: &str, body: &[u8]| {
        let sig = py(
            json!({"op":"wechatpay","private_pem":key["private_pem"],"ts":ts,
            "nonce":nonce,"body_b64":b64(body)}),
        );
        vec![
            json_h(),
            ("wechatpay-signature", s(&sig["signature"])),
            ("wechatpay-timestamp", ts.to_string()),
            ("wechatpay-nonce", nonce.to_string()),
            ("wechatpay-serial", serial.to_string()),
            (
                "wechatpay-signature-type",
                "WECHATPAY2-SHA256-RSA2048".into(),
            ),
        ]
    };
    let now = now_secs();
    let a = st
        .post(
            path,
            &signed(&k1, "5A1B2C3D4E5F6071", now, "n-a", &body),
            &body,
        )
        .await;
    assert_eq!(a.status, 204, "{a:?}");
    assert_eq!(st.upstream.count(), 1);
    assert_eq!(
        st.upstream.last().header("idempotency-key"),
        Some(format!("wx:{id}"))
    );
    // WeChat's retry: the same body, a new timestamp and nonce.
    let a = st
        .post(
            path,
            &signed(&k1, "5A1B2C3D4E5F6071", now + 3, "n-b", &body),
            &body,
        )
        .await;
    assert_eq!((a.status, a.replayed()), (204, true), "{a:?}");
    assert_eq!(st.upstream.count(), 1);
    let mut tampered = body.clone();
    tampered[8] ^= 1;
    let a = st
        .post(
            path,
            &signed(&k1, "5A1B2C3D4E5F6071", now, "n-c", &body),
            &tampered,
        )
        .await;
    st.refused(&a, 401, 1);
    // An unknown serial; the right serial with the wrong key; outside the window.
    let a = st
        .post(path, &signed(&k1, "0BADBADBAD", now, "n-d", &body), &body)
        .await;
    st.refused(&a, 401, 1);
    let a = st
        .post(
            path,
            &signed(&k2, "5A1B2C3D4E5F6071", now, "n-e", &body),
            &body,
        )
        .await;
    st.refused(&a, 401, 1);
    let a = st
        .post(
            path,
            &signed(&k1, "5A1B2C3D4E5F6071", now - 900, "n-f", &body),
            &body,
        )
        .await;
    st.refused(&a, 401, 1);
    // Rotation to a WeChat Pay public key named by its ID.
    let id2 = unique_id("wx");
    let body2 = format!(r#"{{"id":"{id2}","event_type":"REFUND.SUCCESS"}}"#).into_bytes();
    let a = st
        .post(
            path,
            &signed(&k2, "PUB_KEY_ID_0114TEST", now, "n-g", &body2),
            &body2,
        )
        .await;
    assert_eq!(a.status, 204, "{a:?}");
    assert_eq!(st.upstream.count(), 2);
    assert_eq!(&st.upstream.last().body[..], &body2[..]);
}

#[tokio::test]
async fn twilio_form_and_json_with_the_content_guard() {
    let public_url = "https://voice.example.test/twilio/status";
    let st = stack(route(
        "twilio",
        "twilio",
        &["auth-token-one", "auth-token-two"],
        &format!("public_url = \"{public_url}\"\n"),
    ))
    .await;
    let path = "/hooks/twilio";
    let sid = unique_id("CA");
    let params = json!([
        ["CallSid", sid],
        ["CallStatus", "completed"],
        ["From", "+14158675309"],
        ["To", "+18005551212"]
    ]);
    let signed =
        py(json!({"op":"twilio","token":"auth-token-one","url":public_url,"params":params}));
    let body = B64.decode(s(&signed["body_b64"])).unwrap();
    let h = |token: &str, sig: String| {
        vec![
            (
                "content-type",
                "application/x-www-form-urlencoded".to_string(),
            ),
            ("x-twilio-signature", sig),
            ("i-twilio-idempotency-token", token.to_string()),
        ]
    };
    let sig = s(&signed["signature"]);
    let a = st.post(path, &h("tok-1", sig.clone()), &body).await;
    st.forwarded(&a, 1, &body, "twilio:tok-1");
    let a = st.post(path, &h("tok-1", sig.clone()), &body).await;
    st.replayed_with(&a, 1, UPSTREAM_OK);
    let a = st.post(path, &h("tok-forged", sig.clone()), &body).await;
    st.replayed_with(&a, 1, UPSTREAM_OK);
    let tampered = String::from_utf8(body.clone())
        .unwrap()
        .replace("completed", "completes")
        .into_bytes();
    let a = st.post(path, &h("tok-2", sig.clone()), &tampered).await;
    st.refused(&a, 401, 1);
    // A JSON body: the signature covers the URL with bodySHA256, with the second token.
    let jbody = format!(r#"{{"CallSid":"{}"}}"#, unique_id("CA")).into_bytes();
    let js =
        py(json!({"op":"twilio","token":"auth-token-two","url":public_url,"body_b64":b64(&jbody)}));
    let jpath = format!("{path}?{}", s(&js["query"]));
    let mut jh = h("tok-3", s(&js["signature"]));
    jh[0] = json_h();
    let a = st.post(&jpath, &jh, &jbody).await;
    st.forwarded(&a, 2, &jbody, "twilio:tok-3");
    // the same signature over another JSON body fails bodySHA256
    let other = br#"{"CallSid":"CAother"}"#;
    let mut jh2 = jh.clone();
    jh2[2] = ("i-twilio-idempotency-token", "tok-4".into());
    let a = st.post(&jpath, &jh2, other).await;
    st.refused(&a, 401, 2);
}

#[tokio::test]
async fn custom_hmac_with_timestamp_prefix_and_base64() {
    let extra = "signature_header = \"X-Acme-Signature\"\nhash = \"sha512\"\nencoding = \"base64\"\nprefix = \"v1=\"\ntimestamp_header = \"X-Acme-Timestamp\"\n";
    let mut r = route("acme", "custom", &["acme-one", "acme-two"], extra);
    r.key = Some("header:X-Acme-Event".into());
    let st = stack(r).await;
    let path = "/hooks/acme";
    let sign = |secret: &str, ts: i64, body: &[u8]| {
        s(&py(
            json!({"op":"custom","secret":secret,"hash":"sha512","encoding":"base64",
            "prefix":"v1=","ts":ts,"body_b64":b64(body)}),
        )["signature"])
    };
    let h = |event: &str, ts: i64, sig: String| {
        vec![
            json_h(),
            ("x-acme-event", event.to_string()),
            ("x-acme-timestamp", ts.to_string()),
            ("x-acme-signature", sig),
        ]
    };
    let now = now_secs();
    let body = format!(r#"{{"n":"{}"}}"#, unique_id("acme")).into_bytes();
    let a = st
        .post(path, &h("ev-1", now, sign("acme-one", now, &body)), &body)
        .await;
    st.forwarded(&a, 1, &body, "acme:ev-1");
    let a = st
        .post(
            path,
            &h("ev-1", now + 1, sign("acme-one", now + 1, &body)),
            &body,
        )
        .await;
    st.replayed_with(&a, 1, UPSTREAM_OK);
    let mut tampered = body.clone();
    tampered[1] ^= 1;
    let a = st
        .post(
            path,
            &h("ev-2", now, sign("acme-one", now, &body)),
            &tampered,
        )
        .await;
    st.refused(&a, 401, 1);
    let old = now - 301 - 60;
    let a = st
        .post(path, &h("ev-3", old, sign("acme-one", old, &body)), &body)
        .await;
    st.refused(&a, 401, 1);
    let body2 = br#"{"n":"second"}"#.to_vec();
    let a = st
        .post(path, &h("ev-4", now, sign("acme-two", now, &body2)), &body2)
        .await;
    st.forwarded(&a, 2, &body2, "acme:ev-4");
}

#[tokio::test]
async fn standard_v1a_ed25519_from_an_independent_signer() {
    let k = py(json!({"op":"ed25519_keygen"}));
    let whpk = s(&k["whpk"]);
    let st = stack(route("std", "standard", &[SECRET, &whpk], "")).await;
    let path = "/hooks/std";
    let id = unique_id("msg");
    let body = format!(r#"{{"type":"ping","id":"{id}"}}"#).into_bytes();
    let sign = |ts: i64, body: &[u8]| {
        s(&py(
            json!({"op":"standard_v1a","private_b64":k["private_b64"],"id":id,"ts":ts,
            "body_b64":b64(body)}),
        )["signature"])
    };
    let h = |ts: i64, sig: String| {
        vec![
            json_h(),
            ("webhook-id", id.clone()),
            ("webhook-timestamp", ts.to_string()),
            ("webhook-signature", sig),
        ]
    };
    let now = now_secs();
    let a = st.post(path, &h(now, sign(now, &body)), &body).await;
    st.forwarded(&a, 1, &body, &format!("std:{id}"));
    let a = st
        .post(path, &h(now + 1, sign(now + 1, &body)), &body)
        .await;
    st.replayed_with(&a, 1, UPSTREAM_OK);
    let mut tampered = body.clone();
    tampered[2] ^= 1;
    let a = st.post(path, &h(now, sign(now, &body)), &tampered).await;
    st.refused(&a, 401, 1);
    // the other configured entry, a whsec_ secret, passes too (mixed rotation)
    let id2 = unique_id("msg");
    let body2 = format!(r#"{{"type":"ping","id":"{id2}"}}"#).into_bytes();
    let d = Delivery::new(&id2, body2.clone()).path(path);
    let a = st.sidecar.send(&d).await;
    st.forwarded(&a, 2, &body2, &format!("std:{id2}"));
}

/// The signers above are only independent evidence if they are right: each one
/// reproduces its provider's published vector.
#[test]
fn the_independent_signers_reproduce_the_published_vectors() {
    let v: Value = serde_json::from_str(include_str!("../fixtures/provider_vectors.json")).unwrap();
    let body = |v: &Value| b64(v["body"].as_str().unwrap().as_bytes());
    let g = &v["GITHUB"];
    let out = py(json!({"op":"github","secret":g["secret"],"body_b64":body(g)}));
    assert_eq!(out["signature"], g["signature"]);
    let st = &v["STRIPE"];
    let out = py(
        json!({"op":"stripe","secrets":[st["secret"]],"ts":st["timestamp"],"body_b64":body(st)}),
    );
    assert_eq!(out["header"], st["header"]);
    let sh = &v["SHOPIFY"];
    let out = py(json!({"op":"shopify","secret":sh["secret"],"body_b64":body(sh)}));
    assert_eq!(out["signature"], sh["signature"]);
    let sl = &v["SLACK"];
    let out =
        py(json!({"op":"slack","secret":sl["secret"],"ts":sl["timestamp"],"body_b64":body(sl)}));
    assert_eq!(out["signature"], sl["signature"]);
    let tw = &v["TWILIO"];
    let out = py(json!({"op":"twilio","token":tw["token"],"url":tw["url"],"params":tw["params"]}));
    assert_eq!(out["signature"], tw["signature"]);
}

/// `idemgate check-config --config FILE`: exit code and stderr.
pub(crate) fn check_config(toml: &str, env: &[(&str, &str)]) -> (i32, String) {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("idemgate.toml");
    std::fs::write(&p, toml).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_idemgate"));
    cmd.arg("check-config").arg("--config").arg(&p);
    for (k, _) in std::env::vars() {
        if k.starts_with("IDEMGATE_") {
            cmd.env_remove(k);
        }
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run idemgate check-config");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn check_config_names_the_broken_secret_key_or_certificate() {
    let head = "[store]\nurl = \"memory\"\n\n[[route]]\nname = \"ok\"\npath = \"/ok\"\nprovider = \"github\"\nsecrets = [\"s\"]\n\n[[route]]\nname = \"r\"\npath = \"/r\"\n";
    let cases: &[(&str, &str)] = &[
        (
            "provider = \"alipay\"\nsecrets = [\"this is not a key\"]",
            "route[1].secrets[0]",
        ),
        (
            "provider = \"alipay\"\nsecrets = [\"MIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEA\"]",
            "route[1].secrets[0]",
        ),
        (
            "provider = \"wechatpay\"\nsecrets = [\"file:/nonexistent/platform.pem\"]",
            "route[1].secrets[0]",
        ),
        (
            "provider = \"wechatpay\"\nsecrets = [\"-----BEGIN CERTIFICATE-----\\nMIIBroken\\n-----END CERTIFICATE-----\"]",
            "route[1].secrets[0]",
        ),
        (
            "provider = \"stripe\"\nsecrets = [\"whsec_ok\", \"env:IDEMGATE_TEST_NO_SUCH_VAR\"]",
            "route[1].secrets[1]",
        ),
        (
            "provider = \"twilio\"\nsecrets = [\"token\"]",
            "route[1].public_url",
        ),
        (
            "provider = \"custom\"\nsecrets = [\"k\"]\nsignature_header = \"X-Sig\"",
            "route[1].key",
        ),
        (
            "provider = \"github\"\nsecrets = [\"k\"]\ntolerance = \"5m\"",
            "route[1].tolerance",
        ),
        (
            "provider = \"shopify\"\nsecrets = [\"k\"]\nhash = \"sha1\"",
            "route[1].hash",
        ),
    ];
    for (route, field) in cases {
        let (code, stderr) = check_config(&format!("{head}{route}\n"), &[]);
        assert_eq!(code, 1, "{route}: {stderr}");
        assert!(
            stderr.contains(field),
            "{route}: expected {field} in {stderr}"
        );
    }
    // and a valid file passes, the secret from the environment resolved
    let (code, stderr) = check_config(
        &format!("{head}provider = \"stripe\"\nsecrets = [\"env:IDEMGATE_TEST_STRIPE\"]\n"),
        &[("IDEMGATE_TEST_STRIPE", "whsec_from_env")],
    );
    assert_eq!(code, 0, "{stderr}");
}

/// Every duration is bounded: nonsense (a retention of 300 billion years, a timeout
/// under a millisecond, a lease a stalled renewal would lose, a retention shorter than
/// an upstream call) is refused by `check-config`, the error naming the field.
#[test]
fn check_config_refuses_durations_out_of_bounds() {
    let route = "\n[[route]]\nname = \"r\"\npath = \"/r\"\nprovider = \"stripe\"\nsecrets = [\"whsec_x\"]\n";
    let cases: &[(&str, &str, &str)] = &[
        (
            "[dedup]\nretention = \"300000000000y\"\n",
            "",
            "dedup.retention",
        ),
        ("[dedup]\nretention = \"400days\"\n", "", "dedup.retention"),
        ("upstream_timeout = \"200000y\"\n", "", "upstream_timeout"),
        ("header_timeout = \"500us\"\n", "", "header_timeout"),
        ("body_timeout = \"2h\"\n", "", "body_timeout"),
        ("shutdown_grace = \"2h\"\n", "", "shutdown_grace"),
        (
            "[store]\nurl = \"memory\"\ntimeout = \"10m\"\n",
            "",
            "store.timeout",
        ),
        (
            "[store]\nurl = \"memory\"\nbreaker_cooldown = \"1000y\"\n",
            "",
            "store.breaker_cooldown",
        ),
        (
            "[dedup]\nwait_timeout = \"1000y\"\n",
            "",
            "dedup.wait_timeout",
        ),
        ("[dedup]\nlease = \"1000y\"\n", "", "dedup.lease"),
        (
            "[store]\nurl = \"memory\"\ntimeout = \"1s\"\n[dedup]\nlease = \"1s\"\n",
            "",
            "dedup.lease",
        ),
        (
            "upstream_timeout = \"10s\"\n[dedup]\nlease = \"15s\"\nretention = \"20s\"\n",
            "",
            "dedup.retention",
        ),
        ("[async]\nclaim_idle = \"1000y\"\n", "", "async.claim_idle"),
        ("", "tolerance = \"1000days\"\n", "route[0].tolerance"),
        (
            "",
            "mode = \"async\"\nmax_age = \"100000days\"\n",
            "route[0].max_age",
        ),
        (
            "",
            "mode = \"async\"\nbackoff = \"1000y\"\n",
            "route[0].backoff",
        ),
        (
            "",
            "mode = \"async\"\nmax_backoff = \"1000y\"\n",
            "route[0].max_backoff",
        ),
    ];
    for (top, route_extra, field) in cases {
        let text = format!("{top}{route}{route_extra}");
        let (code, stderr) = check_config(&text, &[]);
        assert_eq!(code, 1, "{text}\nexpected {field} refused: {stderr}");
        assert!(
            stderr.contains(field),
            "{text}\nexpected {field} in {stderr}"
        );
    }
    // the bounds themselves pass: a lease of 2 × store.timeout, a retention of exactly
    // upstream_timeout + lease, the longest timeouts, the shortest, the longest windows
    let edge = "upstream_timeout = \"1h\"\nheader_timeout = \"1ms\"\n\
                [store]\nurl = \"memory\"\ntimeout = \"1m\"\n\
                [dedup]\nlease = \"2m\"\nretention = \"1h 2m\"\n";
    let (code, stderr) = check_config(&format!("{edge}{route}tolerance = \"1m\"\n"), &[]);
    assert_eq!(code, 0, "{stderr}");
    let longest = "body_timeout = \"1h\"\nshutdown_grace = \"1h\"\n\
                   [dedup]\nretention = \"365days\"\nwait_timeout = \"1h\"\n\
                   [async]\nclaim_idle = \"1h\"\n";
    let (code, stderr) = check_config(
        &format!(
            "{longest}{route}tolerance = \"7days\"\nmode = \"async\"\n\
             max_age = \"365days\"\nbackoff = \"1day\"\nmax_backoff = \"1day\"\n"
        ),
        &[],
    );
    assert_eq!(code, 0, "{stderr}");
}
