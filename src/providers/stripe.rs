//! Stripe: `Stripe-Signature: t=<unix>,v1=<hex>[,v1=<hex>...][,v0=...]`, where each
//! `v1` is HMAC-SHA256 over `{t}.{body}` keyed by the endpoint secret's UTF-8 bytes,
//! `whsec_` prefix included. Several `v1` entries appear while Stripe rolls a secret;
//! `v0` (test-mode legacy) and unknown schemes are ignored. `t` must lie within the
//! tolerance in both directions.

use std::time::Duration;

use http::HeaderMap;
use subtle::ConstantTimeEq;

use super::common::HashAlg;
use super::common::{check_timestamp, header_str};
use super::{FieldError, SignatureError, Verifier};
use crate::config::Secret;

/// At most this many entries of the header are looked at.
const MAX_ENTRIES: usize = 64;

pub struct Stripe {
    keys: Vec<Vec<u8>>,
    tolerance: i64,
}

impl Stripe {
    pub fn new(secrets: &[Secret], tolerance: Duration) -> Result<Self, FieldError> {
        Ok(Stripe {
            keys: secrets.iter().map(|s| s.value.clone()).collect(),
            tolerance: i64::try_from(tolerance.as_secs()).unwrap_or(i64::MAX),
        })
    }
}

impl Verifier for Stripe {
    fn headers_read(&self) -> Vec<http::HeaderName> {
        super::guard::names(&["stripe-signature"])
    }

    fn verify(&self, headers: &HeaderMap, body: &[u8], now: i64) -> Result<(), SignatureError> {
        let header = header_str(
            headers,
            "stripe-signature",
            "missing Stripe-Signature header",
        )?;
        let mut ts: Option<&str> = None;
        let mut v1: Vec<Vec<u8>> = Vec::new();
        for item in header.split(',').take(MAX_ENTRIES) {
            let Some((k, v)) = item.trim().split_once('=') else {
                continue;
            };
            match k {
                "t" if ts.is_none() => ts = Some(v),
                "v1" => {
                    if let Ok(sig) = hex::decode(v) {
                        v1.push(sig);
                    }
                }
                _ => {}
            }
        }
        let ts = ts.ok_or(SignatureError::Malformed(
            "the Stripe-Signature header has no timestamp (t=)",
        ))?;
        check_timestamp(ts, now, self.tolerance)?;
        if v1.is_empty() {
            return Err(SignatureError::Invalid(
                "no v1 signature in Stripe-Signature",
            ));
        }
        for key in &self.keys {
            let mac = HashAlg::Sha256.hmac(key, &[ts.as_bytes(), b".", body]);
            if v1.iter().any(|s| bool::from(mac.as_slice().ct_eq(s))) {
                return Ok(());
            }
        }
        Err(SignatureError::Invalid("no signature matches"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn verifier(secrets: &[&str]) -> Stripe {
        let s: Vec<Secret> = secrets
            .iter()
            .map(|s| Secret {
                source: s.to_string(),
                value: s.as_bytes().to_vec(),
                id: None,
            })
            .collect();
        Stripe::new(&s, Duration::from_secs(300)).unwrap()
    }

    fn h(v: &str) -> HeaderMap {
        let mut m = HeaderMap::new();
        m.insert("stripe-signature", HeaderValue::from_str(v).unwrap());
        m
    }

    struct V {
        secret: String,
        ts: i64,
        body: String,
        header: String,
        v1: String,
    }

    fn vector() -> V {
        let all: serde_json::Value =
            serde_json::from_str(include_str!("../../tests/fixtures/provider_vectors.json"))
                .unwrap();
        let v = &all["STRIPE"];
        let header = v["header"].as_str().unwrap().to_string();
        let v1 = header.split_once("v1=").unwrap().1.to_string();
        V {
            secret: v["secret"].as_str().unwrap().into(),
            ts: v["timestamp"].as_i64().unwrap(),
            body: v["body"].as_str().unwrap().into(),
            header,
            v1,
        }
    }

    #[test]
    fn published_vector_verifies_within_the_window() {
        let v = vector();
        let s = verifier(&[&v.secret]);
        let b = v.body.as_bytes();
        assert_eq!(s.verify(&h(&v.header), b, v.ts), Ok(()));
        assert_eq!(s.verify(&h(&v.header), b, v.ts + 300), Ok(()));
        assert_eq!(s.verify(&h(&v.header), b, v.ts - 300), Ok(()));
        for now in [v.ts + 301, v.ts - 301] {
            assert!(matches!(
                s.verify(&h(&v.header), b, now),
                Err(SignatureError::Invalid(_))
            ));
        }
    }

    #[test]
    fn the_whsec_prefix_is_part_of_the_key() {
        let v = vector();
        let stripped = verifier(&[v.secret.strip_prefix("whsec_").unwrap()]);
        assert!(matches!(
            stripped.verify(&h(&v.header), v.body.as_bytes(), v.ts),
            Err(SignatureError::Invalid(_))
        ));
    }

    #[test]
    fn several_v1_entries_and_secrets_during_a_roll() {
        let v = vector();
        let b = v.body.as_bytes();
        let s = verifier(&["whsec_old", &v.secret]);
        let header = format!("t={},v1={},v1={},v0=deadbeef", v.ts, "00".repeat(32), v.v1);
        assert_eq!(s.verify(&h(&header), b, v.ts), Ok(()));
        // v0 alone does not count
        let header = format!("t={},v0={}", v.ts, v.v1);
        assert!(matches!(
            s.verify(&h(&header), b, v.ts),
            Err(SignatureError::Invalid(_))
        ));
    }

    #[test]
    fn negative_cases() {
        let v = vector();
        let s = verifier(&[&v.secret]);
        let b = v.body.as_bytes();
        // flipped body byte, flipped signature, wrong secret
        let mut fb = b.to_vec();
        fb[3] ^= 1;
        assert!(matches!(
            s.verify(&h(&v.header), &fb, v.ts),
            Err(SignatureError::Invalid(_))
        ));
        let mut sig = v.v1.clone();
        sig.replace_range(0..1, if sig.starts_with('0') { "1" } else { "0" });
        let bad = format!("t={},v1={sig}", v.ts);
        assert!(matches!(
            s.verify(&h(&bad), b, v.ts),
            Err(SignatureError::Invalid(_))
        ));
        assert!(
            verifier(&["whsec_other"])
                .verify(&h(&v.header), b, v.ts)
                .is_err()
        );
        // a timestamp changed under the same signature
        let moved = format!("t={},v1={}", v.ts + 1, v.v1);
        assert!(matches!(
            s.verify(&h(&moved), b, v.ts),
            Err(SignatureError::Invalid(_))
        ));
        // missing header, missing t, non-integer t
        assert!(matches!(
            s.verify(&HeaderMap::new(), b, v.ts),
            Err(SignatureError::Malformed(_))
        ));
        let no_t = format!("v1={}", v.v1);
        assert!(matches!(
            s.verify(&h(&no_t), b, v.ts),
            Err(SignatureError::Malformed(_))
        ));
        let bad_t = format!("t=abc,v1={}", v.v1);
        assert!(matches!(
            s.verify(&h(&bad_t), b, v.ts),
            Err(SignatureError::Malformed(_))
        ));
        // no v1 at all
        let none = format!("t={}", v.ts);
        assert!(matches!(
            s.verify(&h(&none), b, v.ts),
            Err(SignatureError::Invalid(_))
        ));
    }
}
