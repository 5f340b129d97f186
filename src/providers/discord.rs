//! Discord (Interactions and Webhook Events endpoints): `X-Signature-Ed25519` is the hex
//! Ed25519 signature of `X-Signature-Timestamp` followed by the raw body, under the
//! application's public key (hex, as the developer portal shows it). Every failure is a
//! 401: Discord probes an endpoint with bad signatures and requires exactly that.

use std::time::Duration;

use ed25519_dalek::{Signature, VerifyingKey};
use http::HeaderMap;

use super::common::check_timestamp;
use super::{FieldError, SignatureError, Verifier};
use crate::config::Secret;

/// Discord's Ed25519 check, with every configured application public key (rotation).
pub struct Discord {
    keys: Vec<VerifyingKey>,
    tolerance: i64,
}

impl Discord {
    /// Parses each secret as a hex Ed25519 public key; `tolerance` bounds the signed
    /// timestamp.
    pub fn new(secrets: &[Secret], tolerance: Duration) -> Result<Self, FieldError> {
        let mut keys = Vec::new();
        for (j, s) in secrets.iter().enumerate() {
            let bad = || {
                FieldError::new(
                    format!("secrets[{j}]"),
                    "a Discord public key is 64 hex characters (the application's PUBLIC KEY)",
                )
            };
            let text = std::str::from_utf8(&s.value).map_err(|_| bad())?;
            let bytes: [u8; 32] = hex::decode(text.trim())
                .map_err(|_| bad())?
                .try_into()
                .map_err(|_| bad())?;
            keys.push(VerifyingKey::from_bytes(&bytes).map_err(|_| bad())?);
        }
        Ok(Discord {
            keys,
            tolerance: i64::try_from(tolerance.as_secs()).unwrap_or(i64::MAX),
        })
    }
}

/// Any failure as a 401 (see the module doc).
fn invalid(e: SignatureError) -> SignatureError {
    match e {
        SignatureError::Malformed(m) | SignatureError::Invalid(m) => SignatureError::Invalid(m),
    }
}

impl Verifier for Discord {
    fn headers_read(&self) -> Vec<http::HeaderName> {
        super::guard::names(&["x-signature-ed25519", "x-signature-timestamp"])
    }

    fn verify(&self, headers: &HeaderMap, body: &[u8], now: i64) -> Result<(), SignatureError> {
        let text = |name: &str, missing: &'static str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .ok_or(SignatureError::Invalid(missing))
        };
        let sig = text("x-signature-ed25519", "missing X-Signature-Ed25519 header")?;
        let ts = text(
            "x-signature-timestamp",
            "missing X-Signature-Timestamp header",
        )?;
        check_timestamp(ts, now, self.tolerance).map_err(invalid)?;
        let sig = hex::decode(sig.trim())
            .ok()
            .and_then(|b| Signature::from_slice(&b).ok())
            .ok_or(SignatureError::Invalid("the signature is not 64 hex bytes"))?;
        let mut msg = Vec::with_capacity(ts.len() + body.len());
        msg.extend_from_slice(ts.as_bytes());
        msg.extend_from_slice(body);
        if self
            .keys
            .iter()
            .any(|k| k.verify_strict(&msg, &sig).is_ok())
        {
            Ok(())
        } else {
            Err(SignatureError::Invalid("no signature matches"))
        }
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

    #[test]
    fn signs_timestamp_then_body_and_every_failure_is_401() {
        let sk = SigningKey::from_bytes(&[9u8; 32]);
        let pk = hex::encode(sk.verifying_key().as_bytes());
        let d = Discord::new(&[secret(&pk)], Duration::from_secs(300)).unwrap();
        let body = br#"{"type":1}"#;
        let sig = hex::encode(sk.sign(b"1700000000{\"type\":1}").to_bytes());
        let mut h = HeaderMap::new();
        h.insert("x-signature-ed25519", HeaderValue::from_str(&sig).unwrap());
        h.insert(
            "x-signature-timestamp",
            HeaderValue::from_static("1700000000"),
        );
        assert_eq!(d.verify(&h, body, 1_700_000_000), Ok(()));
        assert!(matches!(
            d.verify(&h, b"{\"type\":2}", 1_700_000_000),
            Err(SignatureError::Invalid(_))
        ));
        assert!(matches!(
            d.verify(&h, body, 1_700_000_301),
            Err(SignatureError::Invalid(_))
        ));
        let mut m = h.clone();
        m.remove("x-signature-ed25519");
        assert!(matches!(
            d.verify(&m, body, 1_700_000_000),
            Err(SignatureError::Invalid(_))
        ));
        m.insert("x-signature-ed25519", HeaderValue::from_static("zz"));
        assert!(matches!(
            d.verify(&m, body, 1_700_000_000),
            Err(SignatureError::Invalid(_))
        ));
        assert!(Discord::new(&[secret("nothex")], Duration::from_secs(1)).is_err());
    }
}
