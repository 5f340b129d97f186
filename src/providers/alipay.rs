//! Alipay asynchronous notifications: a form-encoded body whose `sign` field is an RSA2
//! signature (SHA256withRSA, PKCS#1 v1.5) by Alipay's key, verified with the Alipay
//! public key(s) configured as the route's secrets.
//!
//! The signed string: every field except `sign` and `sign_type`, decoded once (percent
//! decoding, then the body's `charset`, UTF-8 by default; GBK and GB2312 through
//! `encoding_rs`), sorted by name, written `name=value` and joined with `&`, empty
//! values kept; its bytes are the string in that charset (as Alipay's Java SDK signs).
//! Some notifications (e.g. `servicemarket_order_notify`) are signed with `sign_type`
//! kept in: when the first form does not verify, the second is tried.

use std::borrow::Cow;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use encoding_rs::Encoding;
use http::HeaderMap;
use rsa::PublicKey;
use sha2::{Digest, Sha256};

use super::{FieldError, Fingerprint, SignatureError, Verifier, rsa_key};
use crate::config::Secret;

/// At most this many fields are read: a body of a million `&`s buys nothing.
const MAX_FIELDS: usize = 512;

pub struct Alipay {
    keys: Vec<PublicKey>,
}

impl Alipay {
    pub fn new(secrets: &[Secret]) -> Result<Self, FieldError> {
        let mut keys = Vec::with_capacity(secrets.len());
        for (j, s) in secrets.iter().enumerate() {
            let parsed = rsa_key::parse(&s.value).map_err(|m| {
                FieldError::new(
                    format!("secrets[{j}]"),
                    format!("the Alipay public key {m}"),
                )
            })?;
            keys.push(parsed.key);
        }
        Ok(Alipay { keys })
    }
}

/// The body's fields, percent-decoded to bytes (not yet to text).
fn raw_fields(body: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
    body.split(|b| *b == b'&')
        .filter(|p| !p.is_empty())
        .take(MAX_FIELDS)
        .map(|pair| {
            let (k, v) = match pair.iter().position(|b| *b == b'=') {
                Some(i) => (&pair[..i], &pair[i + 1..]),
                None => (pair, &[][..]),
            };
            (decode_component(k), decode_component(v))
        })
        .collect()
}

fn decode_component(raw: &[u8]) -> Vec<u8> {
    let plus: Vec<u8> = raw
        .iter()
        .map(|b| if *b == b'+' { b' ' } else { *b })
        .collect();
    percent_encoding::percent_decode(&plus).collect()
}

/// A notification's fields as text, in the order they came.
type Fields = Vec<(String, String)>;

/// The notification decoded once with its charset: the fields as text, and the
/// charset to write the signed string in.
fn decode(body: &[u8]) -> Result<(Fields, &'static Encoding), SignatureError> {
    let raw = raw_fields(body);
    let charset = raw
        .iter()
        .find(|(k, _)| k == b"charset")
        .map(|(_, v)| v.as_slice())
        .filter(|v| !v.is_empty());
    let enc = match charset {
        None => encoding_rs::UTF_8,
        Some(label) => Encoding::for_label(label)
            .filter(|e| e.output_encoding() == *e)
            .ok_or(SignatureError::Malformed(
                "the notification's charset is not supported",
            ))?,
    };
    let text = |b: &[u8]| -> Result<String, SignatureError> {
        enc.decode_without_bom_handling_and_without_replacement(b)
            .map(Cow::into_owned)
            .ok_or(SignatureError::Malformed(
                "a field of the notification is not valid in its charset",
            ))
    };
    let fields = raw
        .iter()
        .map(|(k, v)| Ok((text(k)?, text(v)?)))
        .collect::<Result<Vec<_>, SignatureError>>()?;
    Ok((fields, enc))
}

/// The signed string in its charset's bytes, with or without `sign_type`.
fn signed_bytes(
    fields: &[(String, String)],
    keep_sign_type: bool,
    enc: &'static Encoding,
) -> Vec<u8> {
    let mut kept: Vec<&(String, String)> = fields
        .iter()
        .filter(|(k, _)| k != "sign" && (keep_sign_type || k != "sign_type"))
        .collect();
    kept.sort_by(|a, b| a.0.cmp(&b.0));
    let joined = kept
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&");
    enc.encode(&joined).0.into_owned()
}

/// Which form of the signed string a key verified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Form {
    WithoutSignType,
    WithSignType,
}

impl Alipay {
    fn check(&self, body: &[u8]) -> Result<Form, SignatureError> {
        let (fields, enc) = decode(body)?;
        let mut signs = fields.iter().filter(|(k, _)| k == "sign");
        let sign = signs
            .next()
            .ok_or(SignatureError::Malformed("missing sign field"))?;
        if signs.next().is_some() {
            return Err(SignatureError::Malformed("the sign field appears twice"));
        }
        if let Some((_, t)) = fields.iter().find(|(k, _)| k == "sign_type")
            && t != "RSA2"
        {
            return Err(SignatureError::Invalid("only sign_type RSA2 is accepted"));
        }
        let compact: String = sign.1.chars().filter(|c| !c.is_whitespace()).collect();
        let sig = B64
            .decode(compact)
            .map_err(|_| SignatureError::Invalid("no signature matches"))?;
        let without = signed_bytes(&fields, false, enc);
        if self
            .keys
            .iter()
            .any(|k| rsa_key::verify_sha256(k, &[&without], &sig))
        {
            return Ok(Form::WithoutSignType);
        }
        let with = signed_bytes(&fields, true, enc);
        if self
            .keys
            .iter()
            .any(|k| rsa_key::verify_sha256(k, &[&with], &sig))
        {
            return Ok(Form::WithSignType);
        }
        Err(SignatureError::Invalid("no signature matches"))
    }
}

impl Verifier for Alipay {
    fn headers_read(&self) -> Vec<http::HeaderName> {
        // Alipay signs form fields of the body: no header takes part.
        Vec::new()
    }

    fn verify(&self, _headers: &HeaderMap, body: &[u8], _now: i64) -> Result<(), SignatureError> {
        self.check(body).map(|_| ())
    }
}

/// The payload fingerprint of a notification: its fields without `sign`, `sign_type`
/// and `notify_time`, which Alipay may change when it sends the same notification
/// again (a re-sent notification must be a replay, never a 422).
pub fn stable_fingerprint(body: &[u8]) -> Fingerprint {
    let mut fields: Vec<(Vec<u8>, Vec<u8>)> = raw_fields(body)
        .into_iter()
        .filter(|(k, _)| !matches!(k.as_slice(), b"sign" | b"sign_type" | b"notify_time"))
        .collect();
    fields.sort();
    let mut h = Sha256::new();
    for (k, v) in fields {
        h.update((k.len() as u64).to_be_bytes());
        h.update(&k);
        h.update((v.len() as u64).to_be_bytes());
        h.update(&v);
    }
    h.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all() -> serde_json::Value {
        serde_json::from_str(include_str!("../../tests/fixtures/provider_vectors.json")).unwrap()
    }

    fn secret(s: &str) -> Secret {
        Secret {
            source: "literal".into(),
            value: s.as_bytes().to_vec(),
            id: None,
        }
    }

    fn form(fields: &serde_json::Value, replace: Option<(&str, &str)>) -> Vec<u8> {
        let mut s = form_urlencoded::Serializer::new(String::new());
        for f in fields.as_array().unwrap() {
            let (k, mut v) = (f[0].as_str().unwrap(), f[1].as_str().unwrap());
            if let Some((rk, rv)) = replace
                && rk == k
            {
                v = rv;
            }
            s.append_pair(k, v);
        }
        s.finish().into_bytes()
    }

    fn trade() -> (Alipay, Vec<u8>) {
        let a = all();
        let key = a["ALIPAY_TRADE_PUBLIC_KEY_B64"].as_str().unwrap();
        (
            Alipay::new(&[secret(key)]).unwrap(),
            form(&a["ALIPAY_TRADE_NOTIFY"], None),
        )
    }

    fn market() -> (Alipay, Vec<u8>) {
        let a = all();
        let key = a["ALIPAY_MARKET_PUBLIC_KEY_PEM"].as_str().unwrap();
        (
            Alipay::new(&[secret(key)]).unwrap(),
            form(&a["ALIPAY_MARKET_NOTIFY"], None),
        )
    }

    #[test]
    fn the_trade_notification_verifies_only_without_sign_type() {
        let (v, body) = trade();
        assert_eq!(v.check(&body), Ok(Form::WithoutSignType));
        assert_eq!(v.verify(&HeaderMap::new(), &body, 0), Ok(()));
    }

    #[test]
    fn the_market_notification_verifies_only_with_sign_type() {
        let (v, body) = market();
        assert_eq!(v.check(&body), Ok(Form::WithSignType));
    }

    #[test]
    fn both_keys_configured_either_notification_passes() {
        let a = all();
        let v = Alipay::new(&[
            secret(a["ALIPAY_MARKET_PUBLIC_KEY_PEM"].as_str().unwrap()),
            secret(a["ALIPAY_TRADE_PUBLIC_KEY_B64"].as_str().unwrap()),
        ])
        .unwrap();
        assert!(v.check(&trade().1).is_ok());
        assert!(v.check(&market().1).is_ok());
    }

    #[test]
    fn negative_cases() {
        let a = all();
        let (trade_v, trade_body) = trade();
        let (market_v, _) = market();
        // the published tamper: one field changed
        let t = a["ALIPAY_MARKET_TAMPER"].as_array().unwrap();
        let tampered = form(
            &a["ALIPAY_MARKET_NOTIFY"],
            Some((t[0].as_str().unwrap(), t[1].as_str().unwrap())),
        );
        assert_eq!(
            market_v.check(&tampered),
            Err(SignatureError::Invalid("no signature matches"))
        );
        // the wrong key
        assert!(matches!(
            market_v.check(&trade_body),
            Err(SignatureError::Invalid(_))
        ));
        // one flipped byte of the body (a field value)
        let flipped = String::from_utf8(trade_body.clone())
            .unwrap()
            .replace("invoice_amount=0.10", "invoice_amount=0.11");
        assert!(matches!(
            trade_v.check(flipped.as_bytes()),
            Err(SignatureError::Invalid(_))
        ));
        // one flipped byte of the signature
        let a2 = &a["ALIPAY_TRADE_NOTIFY"];
        let sign = a2
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f[0] == "sign")
            .unwrap()[1]
            .as_str()
            .unwrap()
            .to_string();
        let mut bad = sign.clone();
        bad.replace_range(5..6, if &sign[5..6] == "A" { "B" } else { "A" });
        let body = form(a2, Some(("sign", &bad)));
        assert!(matches!(
            trade_v.check(&body),
            Err(SignatureError::Invalid(_))
        ));
        // no sign at all; sign twice; another sign_type
        let no_sign: Vec<u8> = String::from_utf8(trade_body.clone())
            .unwrap()
            .split('&')
            .filter(|p| !p.starts_with("sign="))
            .collect::<Vec<_>>()
            .join("&")
            .into_bytes();
        assert_eq!(
            trade_v.check(&no_sign),
            Err(SignatureError::Malformed("missing sign field"))
        );
        let mut twice = trade_body.clone();
        twice.extend_from_slice(b"&sign=AAAA");
        assert!(matches!(
            trade_v.check(&twice),
            Err(SignatureError::Malformed(_))
        ));
        let rsa1 = form(a2, Some(("sign_type", "RSA")));
        assert!(matches!(
            trade_v.check(&rsa1),
            Err(SignatureError::Invalid(_))
        ));
        // an unknown charset
        let odd = form(a2, Some(("charset", "klingon")));
        assert!(matches!(
            trade_v.check(&odd),
            Err(SignatureError::Malformed(_))
        ));
        assert!(matches!(
            trade_v.check(b""),
            Err(SignatureError::Malformed(_))
        ));
    }

    #[test]
    fn charsets_decode_once() {
        // GBK bytes for 中文 are D6 D0 CE C4
        let body = b"charset=gbk&subject=%D6%D0%CE%C4&empty=&sign=x";
        let (fields, enc) = decode(body).unwrap();
        assert_eq!(enc, encoding_rs::GBK);
        assert!(fields.contains(&("subject".into(), "中文".into())));
        assert_eq!(
            signed_bytes(&fields, false, enc),
            b"charset=gbk&empty=&subject=\xD6\xD0\xCE\xC4".to_vec()
        );
        // gb2312 is read as GBK; a literal %25 stays "%" (decoded once, not twice)
        let (fields, enc) = decode(b"charset=GB2312&a=%2541").unwrap();
        assert_eq!(enc, encoding_rs::GBK);
        assert!(fields.contains(&("a".into(), "%41".into())));
        // invalid UTF-8 under the default charset is refused
        assert!(matches!(
            decode(b"a=%FF"),
            Err(SignatureError::Malformed(_))
        ));
    }

    #[test]
    fn the_fingerprint_ignores_what_a_resend_changes() {
        let a = all();
        let body = form(&a["ALIPAY_TRADE_NOTIFY"], None);
        let resent = form(
            &a["ALIPAY_TRADE_NOTIFY"],
            Some(("notify_time", "2019-08-15 15:58:25")),
        );
        assert_eq!(stable_fingerprint(&body), stable_fingerprint(&resent));
        let other = form(&a["ALIPAY_TRADE_NOTIFY"], Some(("total_amount", "9.99")));
        assert_ne!(stable_fingerprint(&body), stable_fingerprint(&other));
    }

    #[test]
    fn bad_keys_are_config_errors() {
        for bad in [
            "not a key",
            "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----",
            "QUJD",
        ] {
            let e = Alipay::new(&[secret(bad)]).err().unwrap();
            assert_eq!(e.field, "secrets[0]");
        }
    }
}
