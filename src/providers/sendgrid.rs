//! SendGrid (Twilio SendGrid Event Webhook): `X-Twilio-Email-Event-Webhook-Signature`
//! = base64 DER ECDSA P-256/SHA-256 signature of timestamp + raw body (the body's
//! trailing CRLF included), `X-Twilio-Email-Event-Webhook-Timestamp` the timestamp.
//! The secret is the verification key as SendGrid's settings show it: base64 of the
//! DER public key (a PEM block is accepted too).

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use http::HeaderMap;
use p256::ecdsa::signature::Verifier as _;
use p256::ecdsa::{Signature, VerifyingKey};
use p256::pkcs8::DecodePublicKey;

use super::common::{check_timestamp, header_str};
use super::{FieldError, SignatureError, Verifier};
use crate::config::Secret;

const SIGNATURE: &str = "x-twilio-email-event-webhook-signature";
const TIMESTAMP: &str = "x-twilio-email-event-webhook-timestamp";

/// SendGrid's verifier: the verification keys and the window.
pub struct Sendgrid {
    keys: Vec<VerifyingKey>,
    tolerance: i64,
}

impl Sendgrid {
    /// Built once per route from its secrets.
    pub fn new(secrets: &[Secret], tolerance: std::time::Duration) -> Result<Self, FieldError> {
        let mut keys = Vec::new();
        for (j, s) in secrets.iter().enumerate() {
            let bad = || {
                FieldError::new(
                    format!("secrets[{j}]"),
                    "is not a P-256 public key (SendGrid's verification key: base64 DER)",
                )
            };
            let text = std::str::from_utf8(&s.value).map_err(|_| bad())?;
            let b64: String = text
                .lines()
                .filter(|l| !l.starts_with("-----"))
                .collect::<String>()
                .split_whitespace()
                .collect();
            let der = B64.decode(b64).map_err(|_| bad())?;
            keys.push(VerifyingKey::from_public_key_der(&der).map_err(|_| bad())?);
        }
        Ok(Sendgrid {
            keys,
            tolerance: i64::try_from(tolerance.as_secs()).unwrap_or(i64::MAX),
        })
    }
}

impl Verifier for Sendgrid {
    fn headers_read(&self) -> Vec<http::HeaderName> {
        super::guard::names(&[SIGNATURE, TIMESTAMP])
    }

    fn verify(&self, headers: &HeaderMap, body: &[u8], now: i64) -> Result<(), SignatureError> {
        let sig = header_str(headers, SIGNATURE, "missing signature header")?;
        let ts = header_str(headers, TIMESTAMP, "missing timestamp header")?;
        check_timestamp(ts, now, self.tolerance)?;
        let sig = B64
            .decode(sig.trim())
            .ok()
            .and_then(|d| Signature::from_der(&d).ok())
            .ok_or(SignatureError::Invalid("no signature matches"))?;
        // Either S: SendGrid's signer need not normalise it.
        let low = sig.normalize_s();
        let mut signed = Vec::with_capacity(ts.len() + body.len());
        signed.extend_from_slice(ts.as_bytes());
        signed.extend_from_slice(body);
        let matched = self
            .keys
            .iter()
            .any(|k| k.verify(&signed, &sig).is_ok() || k.verify(&signed, &low).is_ok());
        if matched {
            Ok(())
        } else {
            Err(SignatureError::Invalid("no signature matches"))
        }
    }
}
