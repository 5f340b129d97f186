//! Paddle Billing: `Paddle-Signature: ts=<unix seconds>;h1=<hex HMAC-SHA256(secret,
//! "{ts}:{body}")>`, possibly with several `h1` entries while Paddle rotates a secret.
//! The timestamp is signed; Paddle's SDK allows it 5 seconds, which is this preset's
//! default window too.

use http::HeaderMap;
use subtle::ConstantTimeEq;

use super::common::{HashAlg, check_timestamp, header_str};
use super::{SignatureError, Verifier};
use crate::config::Secret;

/// At most this many `h1` entries are examined.
const MAX_ENTRIES: usize = 16;

/// Paddle's verifier: the secrets and the window.
pub struct Paddle {
    keys: Vec<Vec<u8>>,
    tolerance: i64,
}

impl Paddle {
    /// Built once per route from its secrets.
    pub fn new(secrets: &[Secret], tolerance: std::time::Duration) -> Self {
        Paddle {
            keys: secrets.iter().map(|s| s.value.clone()).collect(),
            tolerance: i64::try_from(tolerance.as_secs()).unwrap_or(i64::MAX),
        }
    }
}

impl Verifier for Paddle {
    fn headers_read(&self) -> Vec<http::HeaderName> {
        super::guard::names(&["paddle-signature"])
    }

    fn verify(&self, headers: &HeaderMap, body: &[u8], now: i64) -> Result<(), SignatureError> {
        let header = header_str(
            headers,
            "paddle-signature",
            "missing Paddle-Signature header",
        )?;
        let mut ts = None;
        let mut h1 = Vec::new();
        for part in header.split(';') {
            match part.trim().split_once('=') {
                Some(("ts", v)) => ts = Some(v),
                Some(("h1", v)) if h1.len() < MAX_ENTRIES => h1.push(v),
                _ => {}
            }
        }
        let ts = ts.ok_or(SignatureError::Malformed(
            "the Paddle-Signature header has no ts",
        ))?;
        check_timestamp(ts, now, self.tolerance)?;
        let macs: Vec<String> = self
            .keys
            .iter()
            .map(|k| hex::encode(HashAlg::Sha256.hmac(k, &[ts.as_bytes(), b":", body])))
            .collect();
        let matched = h1.iter().any(|sig| {
            macs.iter()
                .any(|m| bool::from(m.as_bytes().ct_eq(sig.to_ascii_lowercase().as_bytes())))
        });
        if matched {
            Ok(())
        } else {
            Err(SignatureError::Invalid("no signature matches"))
        }
    }
}
