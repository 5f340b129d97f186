//! WeChat Pay APIv3 notifications: `Wechatpay-Signature` is the base64 of an RSA
//! SHA256withRSA (PKCS#1 v1.5) signature over `{timestamp}\n{nonce}\n{body}\n`, made
//! with the key named by `Wechatpay-Serial`: a platform certificate (its serial number)
//! or a WeChat Pay public key (its `PUB_KEY_ID_...`). Several can be configured at once,
//! for rotation; an unknown serial is a 401.
//!
//! The window: WeChat's SDKs accept |now - timestamp| < 300 s (strict). idemgate keeps
//! one window rule for every preset (exactly `tolerance` away is still accepted), so with
//! the default 5m a delivery exactly 300 s old passes here and not in WeChat's SDKs; a
//! route that wants WeChat's rule to the second sets `tolerance = "4m59s"`.
//!
//! The AES-GCM `resource` is left encrypted: the application decrypts it.

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use http::HeaderMap;
use rsa::PublicKey;

use super::common::{check_timestamp, header_str};
use super::{FieldError, SignatureError, Verifier, rsa_key};
use crate::config::Secret;

/// The fields a notification's fingerprint covers: its identity, not the encrypted
/// resource, which a re-sent notification might carry re-encrypted.
pub const FINGERPRINT_FIELDS: &[&str] = &[
    "/id",
    "/create_time",
    "/event_type",
    "/resource_type",
    "/resource/original_type",
    "/resource/associated_data",
];

/// The only signature type APIv3 defines.
const SIGNATURE_TYPE: &str = "WECHATPAY2-SHA256-RSA2048";

pub struct WechatPay {
    /// (serial or public key ID, upper-case; key)
    keys: Vec<(String, PublicKey)>,
    tolerance: i64,
}

impl WechatPay {
    pub fn new(secrets: &[Secret], tolerance: Duration) -> Result<Self, FieldError> {
        let mut keys: Vec<(String, PublicKey)> = Vec::with_capacity(secrets.len());
        for (j, s) in secrets.iter().enumerate() {
            let field = || format!("secrets[{j}]");
            let parsed = rsa_key::parse(&s.value).map_err(|m| {
                FieldError::new(field(), format!("the WeChat Pay certificate or key {m}"))
            })?;
            let id = match (&s.id, parsed.serial) {
                (Some(id), _) => id.clone(),
                (None, Some(serial)) => serial,
                (None, None) => {
                    return Err(FieldError::new(
                        field(),
                        "a WeChat Pay public key needs its ID: write it PUB_KEY_ID_...=source \
                         (a certificate names its serial itself)",
                    ));
                }
            };
            let id = id.to_ascii_uppercase();
            if keys.iter().any(|(k, _)| *k == id) {
                return Err(FieldError::new(
                    field(),
                    format!("the key ID {id} is configured twice"),
                ));
            }
            keys.push((id, parsed.key));
        }
        Ok(WechatPay {
            keys,
            tolerance: i64::try_from(tolerance.as_secs()).unwrap_or(i64::MAX),
        })
    }
}

impl Verifier for WechatPay {
    fn headers_read(&self) -> Vec<http::HeaderName> {
        super::guard::names(&[
            "wechatpay-signature",
            "wechatpay-timestamp",
            "wechatpay-nonce",
            "wechatpay-serial",
            "wechatpay-signature-type",
        ])
    }

    fn verify(&self, headers: &HeaderMap, body: &[u8], now: i64) -> Result<(), SignatureError> {
        let sig = header_str(
            headers,
            "wechatpay-signature",
            "missing Wechatpay-Signature header",
        )?;
        let ts = header_str(
            headers,
            "wechatpay-timestamp",
            "missing Wechatpay-Timestamp header",
        )?;
        let nonce = header_str(headers, "wechatpay-nonce", "missing Wechatpay-Nonce header")?;
        let serial = header_str(
            headers,
            "wechatpay-serial",
            "missing Wechatpay-Serial header",
        )?;
        if let Some(t) = headers.get("wechatpay-signature-type")
            && t.as_bytes() != SIGNATURE_TYPE.as_bytes()
        {
            return Err(SignatureError::Invalid(
                "unsupported Wechatpay-Signature-Type",
            ));
        }
        check_timestamp(ts, now, self.tolerance)?;
        let serial = serial.trim().to_ascii_uppercase();
        let key = self
            .keys
            .iter()
            .find(|(id, _)| *id == serial)
            .map(|(_, k)| k)
            .ok_or(SignatureError::Invalid("unknown Wechatpay-Serial"))?;
        let sig = B64
            .decode(sig.trim())
            .map_err(|_| SignatureError::Invalid("no signature matches"))?;
        let ok = rsa_key::verify_sha256(
            key,
            &[ts.as_bytes(), b"\n", nonce.as_bytes(), b"\n", body, b"\n"],
            &sig,
        );
        if ok {
            Ok(())
        } else {
            Err(SignatureError::Invalid("no signature matches"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    struct V {
        cert: String,
        serial: String,
        ts: i64,
        nonce: String,
        sig: String,
        body: String,
    }

    fn vector() -> V {
        let all: serde_json::Value =
            serde_json::from_str(include_str!("../../tests/fixtures/provider_vectors.json"))
                .unwrap();
        let n = &all["WECHATPAY_NOTIFY"];
        V {
            cert: all["WECHATPAY_CERT_PEM"].as_str().unwrap().into(),
            serial: n["serial"].as_str().unwrap().into(),
            ts: n["timestamp"].as_str().unwrap().parse().unwrap(),
            nonce: n["nonce"].as_str().unwrap().into(),
            sig: n["signature"].as_str().unwrap().into(),
            body: n["body"].as_str().unwrap().into(),
        }
    }

    fn secret(id: Option<&str>, value: &str) -> Secret {
        Secret {
            source: "literal".into(),
            value: value.as_bytes().to_vec(),
            id: id.map(str::to_string),
        }
    }

    fn headers(v: &V) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, val) in [
            ("wechatpay-signature", v.sig.clone()),
            ("wechatpay-timestamp", v.ts.to_string()),
            ("wechatpay-nonce", v.nonce.clone()),
            ("wechatpay-serial", v.serial.clone()),
            ("wechatpay-signature-type", SIGNATURE_TYPE.to_string()),
        ] {
            h.insert(k, HeaderValue::from_str(&val).unwrap());
        }
        h
    }

    fn verifier(secrets: &[Secret]) -> WechatPay {
        WechatPay::new(secrets, Duration::from_secs(300)).unwrap()
    }

    #[test]
    fn the_sdk_notification_verifies_with_its_certificate() {
        let v = vector();
        let w = verifier(&[secret(None, &v.cert)]);
        assert_eq!(w.keys[0].0, "D7CE59D1F522D701");
        let b = v.body.as_bytes();
        assert_eq!(w.verify(&headers(&v), b, v.ts), Ok(()));
        assert_eq!(w.verify(&headers(&v), b, v.ts + 300), Ok(()));
        assert_eq!(w.verify(&headers(&v), b, v.ts - 300), Ok(()));
        let mut lower = headers(&v);
        lower.insert(
            "wechatpay-serial",
            HeaderValue::from_str(&v.serial.to_lowercase()).unwrap(),
        );
        assert_eq!(w.verify(&lower, b, v.ts), Ok(()));
    }

    #[test]
    fn a_public_key_named_by_its_id_verifies_too() {
        let v = vector();
        // the same key, configured as a PUB_KEY_ID_ entry: only its ID is asked for
        let w = verifier(&[secret(Some("PUB_KEY_ID_0114"), &v.cert)]);
        let mut h = headers(&v);
        assert!(matches!(
            w.verify(&h, v.body.as_bytes(), v.ts),
            Err(SignatureError::Invalid("unknown Wechatpay-Serial"))
        ));
        h.insert(
            "wechatpay-serial",
            HeaderValue::from_static("PUB_KEY_ID_0114"),
        );
        assert_eq!(w.verify(&h, v.body.as_bytes(), v.ts), Ok(()));
    }

    #[test]
    fn negative_cases() {
        let v = vector();
        let w = verifier(&[secret(None, &v.cert)]);
        let b = v.body.as_bytes();
        let inv = |r: Result<(), SignatureError>| matches!(r, Err(SignatureError::Invalid(_)));
        let mal = |r: Result<(), SignatureError>| matches!(r, Err(SignatureError::Malformed(_)));
        // outside the window
        assert!(inv(w.verify(&headers(&v), b, v.ts + 301)));
        assert!(inv(w.verify(&headers(&v), b, v.ts - 301)));
        // one flipped byte of the body
        let mut fb = b.to_vec();
        fb[10] ^= 1;
        assert!(inv(w.verify(&headers(&v), &fb, v.ts)));
        // a flipped signature byte
        let mut h = headers(&v);
        let mut sig = B64.decode(&v.sig).unwrap();
        sig[0] ^= 1;
        h.insert(
            "wechatpay-signature",
            HeaderValue::from_str(&B64.encode(&sig)).unwrap(),
        );
        assert!(inv(w.verify(&h, b, v.ts)));
        // another nonce
        let mut h = headers(&v);
        h.insert("wechatpay-nonce", HeaderValue::from_static("other"));
        assert!(inv(w.verify(&h, b, v.ts)));
        // unknown serial; wrong signature type
        let mut h = headers(&v);
        h.insert("wechatpay-serial", HeaderValue::from_static("ABCDEF"));
        assert!(inv(w.verify(&h, b, v.ts)));
        let mut h = headers(&v);
        h.insert(
            "wechatpay-signature-type",
            HeaderValue::from_static("WECHATPAY2-SM2-WITH-SM3"),
        );
        assert!(inv(w.verify(&h, b, v.ts)));
        // the wrong key under the right serial (an Alipay key named D7CE...)
        let all: serde_json::Value =
            serde_json::from_str(include_str!("../../tests/fixtures/provider_vectors.json"))
                .unwrap();
        let other = all["ALIPAY_MARKET_PUBLIC_KEY_PEM"].as_str().unwrap();
        let wrong = verifier(&[secret(Some("D7CE59D1F522D701"), other)]);
        assert!(inv(wrong.verify(&headers(&v), b, v.ts)));
        // rotation: both configured, the right one second
        let both = verifier(&[secret(Some("PUB_KEY_ID_NEW"), other), secret(None, &v.cert)]);
        assert_eq!(both.verify(&headers(&v), b, v.ts), Ok(()));
        // each header missing; a non-integer timestamp
        for name in [
            "wechatpay-signature",
            "wechatpay-timestamp",
            "wechatpay-nonce",
            "wechatpay-serial",
        ] {
            let mut h = headers(&v);
            h.remove(name);
            assert!(mal(w.verify(&h, b, v.ts)), "{name}");
        }
        let mut h = headers(&v);
        h.insert("wechatpay-timestamp", HeaderValue::from_static("noon"));
        assert!(mal(w.verify(&h, b, v.ts)));
    }

    #[test]
    fn config_errors() {
        let all: serde_json::Value =
            serde_json::from_str(include_str!("../../tests/fixtures/provider_vectors.json"))
                .unwrap();
        let pk = all["ALIPAY_MARKET_PUBLIC_KEY_PEM"].as_str().unwrap();
        let err = |s: Vec<Secret>| WechatPay::new(&s, Duration::from_secs(300)).err().unwrap();
        // a bare public key without its ID
        assert_eq!(err(vec![secret(None, pk)]).field, "secrets[0]");
        // a broken certificate
        let cert = vector().cert.replace("MIID", "MIIX");
        assert_eq!(
            err(vec![secret(Some("A"), pk), secret(None, &cert)]).field,
            "secrets[1]"
        );
        // one ID twice
        assert_eq!(
            err(vec![secret(Some("A"), pk), secret(Some("a"), pk)]).field,
            "secrets[1]"
        );
    }
}
