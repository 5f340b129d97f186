//! RSA public keys as providers hand them out: a PEM public key (`BEGIN PUBLIC KEY` or
//! `BEGIN RSA PUBLIC KEY`), an X.509 certificate (`BEGIN CERTIFICATE`, whose serial is
//! the key's ID at WeChat Pay), or the bare base64 DER that Alipay's console shows.
//! Verification is RSASSA-PKCS1-v1_5 with SHA-256 (Alipay RSA2, WeChat Pay APIv3).

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use rsa::pkcs1::DecodeRsaPublicKey;
use rsa::pkcs8::DecodePublicKey;
use rsa::{Pkcs1v15Sign, PublicKey};
use sha2::{Digest, Sha256};
use x509_cert::Certificate;
use x509_cert::der::{DecodePem, Encode};

/// A parsed key, and the certificate serial when it came from a certificate.
pub struct ParsedKey {
    pub key: PublicKey,
    /// Upper-case hex, leading zero bytes dropped (as WeChat Pay writes it).
    pub serial: Option<String>,
}

/// Parses one configured key; the error says what was wrong, for the route's field.
pub fn parse(text: &[u8]) -> Result<ParsedKey, String> {
    let text = std::str::from_utf8(text).map_err(|_| "is not text (PEM or base64)".to_string())?;
    let t = text.trim();
    if t.contains("-----BEGIN CERTIFICATE-----") {
        let cert = Certificate::from_pem(t.as_bytes())
            .map_err(|e| format!("is not a readable X.509 certificate ({e})"))?;
        let tbs = cert.tbs_certificate();
        let der = tbs
            .subject_public_key_info()
            .to_der()
            .map_err(|e| format!("the certificate's public key cannot be read ({e})"))?;
        let key = PublicKey::from_public_key_der(&der)
            .map_err(|e| format!("the certificate does not hold an RSA public key ({e})"))?;
        let bytes = tbs.serial_number().as_bytes();
        let first = bytes.iter().position(|b| *b != 0).unwrap_or(bytes.len());
        let serial = hex::encode_upper(&bytes[first..]);
        return Ok(ParsedKey {
            key,
            serial: Some(serial),
        });
    }
    let key = if t.contains("-----BEGIN PUBLIC KEY-----") {
        PublicKey::from_public_key_pem(t).map_err(|e| format!("is not an RSA public key ({e})"))?
    } else if t.contains("-----BEGIN RSA PUBLIC KEY-----") {
        PublicKey::from_pkcs1_pem(t).map_err(|e| format!("is not an RSA public key ({e})"))?
    } else if t.contains("-----BEGIN") {
        return Err(
            "is a PEM block of another kind: give the public key or certificate, never a private key"
                .into(),
        );
    } else {
        let compact: String = t.chars().filter(|c| !c.is_whitespace()).collect();
        let der = B64
            .decode(compact)
            .map_err(|_| "is neither PEM nor the bare base64 of a public key".to_string())?;
        PublicKey::from_public_key_der(&der)
            .or_else(|_| PublicKey::from_pkcs1_der(&der))
            .map_err(|e| format!("is not an RSA public key ({e})"))?
    };
    Ok(ParsedKey { key, serial: None })
}

/// SHA256withRSA (PKCS#1 v1.5) verification of `message` against `sig`.
pub fn verify_sha256(key: &PublicKey, message: &[&[u8]], sig: &[u8]) -> bool {
    let mut h = Sha256::new();
    for m in message {
        h.update(m);
    }
    key.verify(Pkcs1v15Sign::new::<Sha256>(), &h.finalize(), sig)
        .is_ok()
}
