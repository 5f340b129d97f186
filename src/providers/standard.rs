//! Standard Webhooks (<https://www.standardwebhooks.com>): `webhook-id`,
//! `webhook-timestamp` and `webhook-signature` headers; the signed content is
//! `{id}.{timestamp}.{body}`; `v1` is HMAC-SHA256 with a `whsec_` secret, `v1a` is
//! Ed25519 with a `whpk_` public key. Any one matching entry passes. Svix-powered
//! senders (Clerk, Resend, ...) name the same headers `svix-id`, `svix-timestamp` and
//! `svix-signature`: either spelling is read, as Svix's own libraries do.

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use ed25519_dalek::{Signature, VerifyingKey};
use hmac::{KeyInit, Mac};
use http::HeaderMap;
use subtle::ConstantTimeEq;

use super::common::check_timestamp;
use super::{FieldError, SignatureError, Verifier};
use crate::config::Secret;

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

/// At most this many signature entries are examined: a header with thousands of
/// entries must not buy thousands of signature checks.
const MAX_ENTRIES: usize = 64;

/// One signed header under its two spellings, and the answers for its absence and for
/// both spellings disagreeing.
struct Alias {
    name: &'static str,
    svix: &'static str,
    missing: &'static str,
    conflict: &'static str,
}

const ID: Alias = Alias {
    name: "webhook-id",
    svix: "svix-id",
    missing: "missing webhook-id header",
    conflict: "webhook-id and svix-id are both set and differ",
};
const TIMESTAMP: Alias = Alias {
    name: "webhook-timestamp",
    svix: "svix-timestamp",
    missing: "missing webhook-timestamp header",
    conflict: "webhook-timestamp and svix-timestamp are both set and differ",
};
const SIGNATURE: Alias = Alias {
    name: "webhook-signature",
    svix: "svix-signature",
    missing: "missing webhook-signature header",
    conflict: "webhook-signature and svix-signature are both set and differ",
};

/// The header under either spelling; both present with different values is refused,
/// since which one a reader trusts would decide what is checked.
fn aliased(headers: &HeaderMap, a: Alias) -> Result<&str, SignatureError> {
    let text = |n: &str| {
        headers
            .get(n)
            .map(|v| v.to_str().map_err(|_| SignatureError::Malformed(a.missing)))
            .transpose()
    };
    match (text(a.name)?, text(a.svix)?) {
        (Some(w), Some(s)) if w != s => Err(SignatureError::Malformed(a.conflict)),
        (Some(v), _) | (None, Some(v)) => Ok(v),
        (None, None) => Err(SignatureError::Malformed(a.missing)),
    }
}

pub struct StandardWebhooks {
    /// Decoded `whsec_` secrets (HMAC keys for `v1`).
    hmac_keys: Vec<Vec<u8>>,
    /// `whpk_` public keys (for `v1a`).
    public_keys: Vec<VerifyingKey>,
    tolerance: i64,
}

impl StandardWebhooks {
    pub fn new(secrets: &[Secret], tolerance: Duration) -> Result<Self, FieldError> {
        let mut hmac_keys = Vec::new();
        let mut public_keys = Vec::new();
        for (j, s) in secrets.iter().enumerate() {
            let field = || format!("secrets[{j}]");
            let text = std::str::from_utf8(&s.value)
                .map_err(|_| FieldError::new(field(), "is not text"))?;
            if let Some(pk) = text.strip_prefix("whpk_") {
                let bytes = B64.decode(pk).map_err(|_| {
                    FieldError::new(field(), "a whpk_ key must be base64 after the prefix")
                })?;
                let arr: [u8; 32] = bytes.as_slice().try_into().map_err(|_| {
                    FieldError::new(
                        field(),
                        "a whpk_ key must hold 32 bytes (an Ed25519 public key)",
                    )
                })?;
                let key = VerifyingKey::from_bytes(&arr)
                    .map_err(|_| FieldError::new(field(), "is not a valid Ed25519 public key"))?;
                public_keys.push(key);
            } else {
                let b64 = text.strip_prefix("whsec_").unwrap_or(text);
                let key = B64.decode(b64).map_err(|_| {
                    FieldError::new(
                        field(),
                        "a Standard Webhooks secret is whsec_ followed by base64",
                    )
                })?;
                if key.is_empty() {
                    return Err(FieldError::new(field(), "the decoded secret is empty"));
                }
                hmac_keys.push(key);
            }
        }
        Ok(StandardWebhooks {
            hmac_keys,
            public_keys,
            tolerance: i64::try_from(tolerance.as_secs()).unwrap_or(i64::MAX),
        })
    }
}

impl Verifier for StandardWebhooks {
    fn headers_read(&self) -> Vec<http::HeaderName> {
        super::guard::names(&[
            "webhook-id",
            "webhook-timestamp",
            "webhook-signature",
            "svix-id",
            "svix-timestamp",
            "svix-signature",
        ])
    }

    fn verify(&self, headers: &HeaderMap, body: &[u8], now: i64) -> Result<(), SignatureError> {
        let id = aliased(headers, ID)?;
        let ts = aliased(headers, TIMESTAMP)?;
        let sigs = aliased(headers, SIGNATURE)?;
        check_timestamp(ts, now, self.tolerance)?;

        // The HMACs are computed lazily, once per secret, only if a v1 entry exists.
        let mut macs: Option<Vec<[u8; 32]>> = None;
        let mut signed: Option<Vec<u8>> = None;
        for entry in sigs.split(' ').filter(|e| !e.is_empty()).take(MAX_ENTRIES) {
            let Some((version, sig)) = entry.split_once(',') else {
                continue;
            };
            match version {
                "v1" => {
                    let Ok(sig) = B64.decode(sig) else { continue };
                    let macs = macs.get_or_insert_with(|| {
                        self.hmac_keys
                            .iter()
                            .map(|k| {
                                let mut mac = HmacSha256::new_from_slice(k)
                                    .expect("HMAC takes keys of any length");
                                mac.update(id.as_bytes());
                                mac.update(b".");
                                mac.update(ts.as_bytes());
                                mac.update(b".");
                                mac.update(body);
                                mac.finalize().into_bytes().into()
                            })
                            .collect()
                    });
                    if macs.iter().any(|m| bool::from(m.as_slice().ct_eq(&sig))) {
                        return Ok(());
                    }
                }
                "v1a" if !self.public_keys.is_empty() => {
                    let Ok(sig) = B64.decode(sig) else { continue };
                    let Ok(sig) = Signature::from_slice(&sig) else {
                        continue;
                    };
                    let content = signed.get_or_insert_with(|| {
                        let mut v = Vec::with_capacity(id.len() + ts.len() + body.len() + 2);
                        v.extend_from_slice(id.as_bytes());
                        v.push(b'.');
                        v.extend_from_slice(ts.as_bytes());
                        v.push(b'.');
                        v.extend_from_slice(body);
                        v
                    });
                    if self
                        .public_keys
                        .iter()
                        .any(|k| k.verify_strict(content, &sig).is_ok())
                    {
                        return Ok(());
                    }
                }
                _ => {}
            }
        }
        Err(SignatureError::Invalid("no signature matches"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ed25519_dalek::{Signer, SigningKey};
    use http::HeaderValue;

    fn secret(s: &str) -> Secret {
        Secret {
            source: s.to_string(),
            value: s.as_bytes().to_vec(),
            id: None,
        }
    }

    fn headers(id: &str, ts: &str, sig: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("webhook-id", HeaderValue::from_str(id).unwrap());
        h.insert("webhook-timestamp", HeaderValue::from_str(ts).unwrap());
        h.insert("webhook-signature", HeaderValue::from_str(sig).unwrap());
        h
    }

    struct Vector {
        secret: String,
        msg_id: String,
        timestamp: i64,
        payload: String,
        signature: String,
    }

    /// The published vectors of the Standard Webhooks reference libraries, from the
    /// fixture copied out of shared/vectors.
    fn vectors() -> Vec<Vector> {
        let all: serde_json::Value =
            serde_json::from_str(include_str!("../../tests/fixtures/provider_vectors.json"))
                .unwrap();
        all["STANDARD_V1"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| Vector {
                secret: v["secret"].as_str().unwrap().to_string(),
                msg_id: v["msg_id"].as_str().unwrap().to_string(),
                timestamp: v["timestamp"].as_i64().unwrap(),
                payload: v["payload"].as_str().unwrap().to_string(),
                signature: v["signature"].as_str().unwrap().to_string(),
            })
            .collect()
    }

    fn verifier(secrets: &[&str]) -> StandardWebhooks {
        let s: Vec<Secret> = secrets.iter().map(|s| secret(s)).collect();
        StandardWebhooks::new(&s, Duration::from_secs(300)).unwrap()
    }

    #[test]
    fn published_vectors_verify() {
        let vs = vectors();
        assert_eq!(vs.len(), 2);
        for v in vs {
            let h = headers(&v.msg_id, &v.timestamp.to_string(), &v.signature);
            let w = verifier(&[&v.secret]);
            assert_eq!(w.verify(&h, v.payload.as_bytes(), v.timestamp), Ok(()));
        }
    }

    #[test]
    fn published_negative_cases() {
        for v in vectors() {
            let w = verifier(&[&v.secret]);
            let ts = v.timestamp.to_string();
            let body = v.payload.as_bytes();
            // last character of the signature changed
            let mut bad = v.signature.clone();
            let last = bad.pop().unwrap();
            bad.push(if last == 'A' { 'B' } else { 'A' });
            assert_eq!(
                w.verify(&headers(&v.msg_id, &ts, &bad), body, v.timestamp),
                Err(SignatureError::Invalid("no signature matches"))
            );
            // partial header
            assert!(matches!(
                w.verify(&headers(&v.msg_id, &ts, "v1,"), body, v.timestamp),
                Err(SignatureError::Invalid(_))
            ));
            // non-numeric timestamp
            assert!(matches!(
                w.verify(
                    &headers(&v.msg_id, "notanumber", &v.signature),
                    body,
                    v.timestamp
                ),
                Err(SignatureError::Malformed(_))
            ));
            // each header missing
            for name in ["webhook-id", "webhook-timestamp", "webhook-signature"] {
                let mut h = headers(&v.msg_id, &ts, &v.signature);
                h.remove(name);
                assert!(matches!(
                    w.verify(&h, body, v.timestamp),
                    Err(SignatureError::Malformed(_))
                ));
            }
            // ±(300 + 1) s rejected, ±300 s accepted
            let h = headers(&v.msg_id, &ts, &v.signature);
            for now in [v.timestamp + 301, v.timestamp - 301] {
                assert!(matches!(
                    w.verify(&h, body, now),
                    Err(SignatureError::Invalid(_))
                ));
            }
            for now in [v.timestamp + 300, v.timestamp - 300] {
                assert_eq!(w.verify(&h, body, now), Ok(()));
            }
            // a wrong secret
            let other = verifier(&["whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oX"]);
            assert!(other.verify(&h, body, v.timestamp).is_err());
            // a body with one byte flipped
            let mut flipped = body.to_vec();
            flipped[0] ^= 1;
            assert!(w.verify(&h, &flipped, v.timestamp).is_err());
        }
    }

    #[test]
    fn any_matching_entry_and_any_secret_pass() {
        let v = &vectors()[0];
        let ts = v.timestamp.to_string();
        // rotation: the right secret second among two
        let w = verifier(&["whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD", &v.secret]);
        let sig = format!("v2,abc v1,Zm9v {}", v.signature);
        assert_eq!(
            w.verify(
                &headers(&v.msg_id, &ts, &sig),
                v.payload.as_bytes(),
                v.timestamp
            ),
            Ok(())
        );
        // unknown versions only
        let sig = v.signature.replace("v1,", "v2,");
        assert!(matches!(
            w.verify(
                &headers(&v.msg_id, &ts, &sig),
                v.payload.as_bytes(),
                v.timestamp
            ),
            Err(SignatureError::Invalid(_))
        ));
        // empty signature header
        assert!(matches!(
            w.verify(
                &headers(&v.msg_id, &ts, ""),
                v.payload.as_bytes(),
                v.timestamp
            ),
            Err(SignatureError::Invalid(_))
        ));
    }

    #[test]
    fn overflowing_timestamps_are_rejected_not_panicking() {
        let v = &vectors()[0];
        let w = verifier(&[&v.secret]);
        for ts in ["9223372036854775807", "-9223372036854775808"] {
            assert!(
                w.verify(&headers(&v.msg_id, ts, &v.signature), b"x", 0)
                    .is_err()
            );
        }
        assert!(matches!(
            w.verify(
                &headers(&v.msg_id, "99999999999999999999999", &v.signature),
                b"x",
                0
            ),
            Err(SignatureError::Malformed(_))
        ));
    }

    #[test]
    fn v1a_ed25519_with_whpk_keys() {
        // Signed with ed25519-dalek's signer from a fixed seed; the RFC 8032 vector
        // below checks the verifier against an independent implementation's output.
        let sk = SigningKey::from_bytes(&[7u8; 32]);
        let pk = format!("whpk_{}", B64.encode(sk.verifying_key().as_bytes()));
        let w = verifier(&[&pk, "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]);
        let content = b"msg_1.1700000000.{\"a\":1}";
        let sig = format!("v1a,{}", B64.encode(sk.sign(content).to_bytes()));
        let h = headers("msg_1", "1700000000", &sig);
        assert_eq!(w.verify(&h, b"{\"a\":1}", 1_700_000_000), Ok(()));
        assert!(w.verify(&h, b"{\"a\":2}", 1_700_000_000).is_err());
    }

    #[test]
    fn rfc8032_vectors_through_the_v1a_path() {
        let all: serde_json::Value =
            serde_json::from_str(include_str!("../../tests/fixtures/provider_vectors.json"))
                .unwrap();
        for v in all["RFC8032"].as_array().unwrap() {
            let public = hex::decode(v["public"].as_str().unwrap()).unwrap();
            let sig = hex::decode(v["signature"].as_str().unwrap()).unwrap();
            let msg = hex::decode(v["message"].as_str().unwrap()).unwrap();
            let key = VerifyingKey::from_bytes(&public.try_into().unwrap()).unwrap();
            let sig = Signature::from_slice(&sig).unwrap();
            assert!(key.verify_strict(&msg, &sig).is_ok());
        }
    }

    #[test]
    fn svix_spellings_verify_and_must_agree() {
        let v = &vectors()[0];
        let w = verifier(&[&v.secret]);
        let ts = v.timestamp.to_string();
        let svix = |h: HeaderMap| {
            let mut m = HeaderMap::new();
            for (k, val) in &h {
                let name = k.as_str().replace("webhook-", "svix-");
                m.insert(
                    http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                    val.clone(),
                );
            }
            m
        };
        let body = v.payload.as_bytes();
        let h = svix(headers(&v.msg_id, &ts, &v.signature));
        assert_eq!(w.verify(&h, body, v.timestamp), Ok(()));
        // both spellings, same values: fine; different values: refused
        let mut both = h.clone();
        both.extend(headers(&v.msg_id, &ts, &v.signature));
        assert_eq!(w.verify(&both, body, v.timestamp), Ok(()));
        both.insert("webhook-id", HeaderValue::from_static("msg_other"));
        assert!(matches!(
            w.verify(&both, body, v.timestamp),
            Err(SignatureError::Malformed(_))
        ));
        let mut missing = h.clone();
        missing.remove("svix-signature");
        assert!(matches!(
            w.verify(&missing, body, v.timestamp),
            Err(SignatureError::Malformed(_))
        ));
    }

    #[test]
    fn bad_secrets_are_config_errors() {
        let bad = |s: &str| StandardWebhooks::new(&[secret(s)], Duration::from_secs(300)).err();
        assert_eq!(bad("whsec_***").unwrap().field, "secrets[0]");
        assert!(bad("whpk_AAAA").is_some());
        assert!(bad("whsec_").is_some());
    }
}
