//! Mailgun: the JSON body's `signature` object holds `timestamp`, `token` and
//! `signature` = hex HMAC-SHA256(webhook signing key, timestamp + token). Only those two
//! values are signed: the event data, its id included, is not. So the preset claims the
//! signed token (a reused token is never forwarded again: the same body is replayed, any
//! other body refused with 422), and checks the timestamp's window (Mailgun's SDK:
//! 15 minutes).

use http::HeaderMap;
use subtle::ConstantTimeEq;

use super::common::{HashAlg, check_timestamp};
use super::{SignatureError, Verifier};
use crate::config::Secret;

/// Mailgun's verifier: the signing keys and the window.
pub struct Mailgun {
    keys: Vec<Vec<u8>>,
    tolerance: i64,
}

impl Mailgun {
    /// Built once per route from its secrets.
    pub fn new(secrets: &[Secret], tolerance: std::time::Duration) -> Self {
        Mailgun {
            keys: secrets.iter().map(|s| s.value.clone()).collect(),
            tolerance: i64::try_from(tolerance.as_secs()).unwrap_or(i64::MAX),
        }
    }
}

/// A member of the body's `signature` object as text (Mailgun sends the timestamp as
/// a string; a number is read as its decimal text).
fn member(doc: &serde_json::Value, name: &str) -> Option<String> {
    match doc.pointer(&format!("/signature/{name}"))? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

impl Verifier for Mailgun {
    fn headers_read(&self) -> Vec<http::HeaderName> {
        Vec::new()
    }

    fn verify(&self, _: &HeaderMap, body: &[u8], now: i64) -> Result<(), SignatureError> {
        const MISSING: &str = "the body holds no signature object (timestamp, token, signature)";
        let doc: serde_json::Value =
            serde_json::from_slice(body).map_err(|_| SignatureError::Malformed(MISSING))?;
        let (Some(ts), Some(token), Some(sig)) = (
            member(&doc, "timestamp"),
            member(&doc, "token"),
            member(&doc, "signature"),
        ) else {
            return Err(SignatureError::Malformed(MISSING));
        };
        check_timestamp(&ts, now, self.tolerance)?;
        let matched = self.keys.iter().any(|k| {
            let mac = hex::encode(HashAlg::Sha256.hmac(k, &[ts.as_bytes(), token.as_bytes()]));
            bool::from(mac.as_bytes().ct_eq(sig.to_ascii_lowercase().as_bytes()))
        });
        if matched {
            Ok(())
        } else {
            Err(SignatureError::Invalid("no signature matches"))
        }
    }
}
