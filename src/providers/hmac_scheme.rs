//! Single-header HMAC schemes: one signature header holding one HMAC of a signed
//! string built from the body (and, optionally, a timestamp header). GitHub, Shopify and
//! Slack are fixed settings of this scheme; `custom` routes set it from their fields.
//! Every configured secret is tried (rotation); any match passes.

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use http::{HeaderMap, HeaderName};
use subtle::ConstantTimeEq;

use super::common::{HashAlg, PublicUrl, check_timestamp, header_str};
use super::{FieldError, SignatureError, Verifier};
use crate::config::{CustomFields, Secret};

/// How the signature is written in its header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Hex,
    Base64,
}

impl Encoding {
    fn decode(self, text: &str) -> Option<Vec<u8>> {
        match self {
            Encoding::Hex => hex::decode(text.trim()).ok(),
            Encoding::Base64 => B64.decode(text.trim()).ok(),
        }
    }
}

/// One piece of the signed-string template.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Literal(Vec<u8>),
    Body,
    Timestamp,
}

/// Parses a `signed` template: `{body}` and `{timestamp}` are placeholders, every other
/// character is literal; any other `{name}` is refused (most likely a typo).
fn parse_template(t: &str, has_timestamp: bool) -> Result<Vec<Part>, String> {
    let mut parts = Vec::new();
    let mut lit = String::new();
    let mut rest = t;
    let mut saw_body = false;
    while let Some(open) = rest.find('{') {
        lit.push_str(&rest[..open]);
        let after = &rest[open..];
        let close = after.find('}');
        let name = close.map(|c| &after[1..c]);
        match name {
            Some("body") | Some("timestamp") => {
                if !lit.is_empty() {
                    parts.push(Part::Literal(std::mem::take(&mut lit).into_bytes()));
                }
                if name == Some("body") {
                    saw_body = true;
                    parts.push(Part::Body);
                } else if has_timestamp {
                    parts.push(Part::Timestamp);
                } else {
                    return Err("uses {timestamp} but the route has no timestamp_header".into());
                }
                rest = &after[close.unwrap_or(0) + 1..];
            }
            Some(n)
                if !n.is_empty() && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') =>
            {
                return Err(format!(
                    "`{{{n}}}` is not a placeholder (use {{body}} and {{timestamp}})"
                ));
            }
            _ => {
                lit.push('{');
                rest = &after[1..];
            }
        }
    }
    lit.push_str(rest);
    if !lit.is_empty() {
        parts.push(Part::Literal(lit.into_bytes()));
    }
    if !saw_body {
        return Err("must contain {body}: otherwise the body is not authenticated".into());
    }
    Ok(parts)
}

/// A fixed single-header HMAC scheme written as data, so a provider whose signature is
/// one HMAC in one header is one row in the preset table.
pub struct HmacRow {
    /// The preset's name, for configuration errors.
    pub name: &'static str,
    /// The header holding the signature (lowercase).
    pub header: &'static str,
    /// The hash under the HMAC.
    pub alg: HashAlg,
    /// How the MAC is written in the header.
    pub encoding: Encoding,
    /// Text before the MAC (`sha256=`), stripped before decoding.
    pub prefix: Option<&'static str>,
    /// The route's `public_url` is signed in front of the body (Square).
    pub signs_url: bool,
    /// A JSON pointer to a signed Unix-milliseconds timestamp inside the body, checked
    /// against the window once the signature matches (Linear's `webhookTimestamp`).
    pub body_clock: Option<&'static str>,
}

/// A single-header HMAC scheme.
pub struct HmacScheme {
    header: HeaderName,
    alg: HashAlg,
    encoding: Encoding,
    prefix: Option<String>,
    /// The timestamp header and window (seconds), when a timestamp is signed.
    timestamp: Option<(HeaderName, i64)>,
    template: Vec<Part>,
    keys: Vec<Vec<u8>>,
    /// A row's `body_clock` and the window (seconds).
    body_clock: Option<(&'static str, i64)>,
}

/// The secrets as HMAC keys: the configured strings' bytes, used as they are.
fn hmac_keys(secrets: &[Secret]) -> Vec<Vec<u8>> {
    secrets.iter().map(|s| s.value.clone()).collect()
}

fn secs(d: Duration) -> i64 {
    i64::try_from(d.as_secs()).unwrap_or(i64::MAX)
}

impl HmacScheme {
    /// A row of the preset table; `public_url` is required when the row signs it.
    pub fn from_row(
        row: &HmacRow,
        secrets: &[Secret],
        public_url: Option<&str>,
        tolerance: Duration,
    ) -> Result<Self, FieldError> {
        let mut template = Vec::new();
        if row.signs_url {
            let url = PublicUrl::parse(public_url, row.name)?;
            template.push(Part::Literal(url.for_request(None).into_bytes()));
        }
        template.push(Part::Body);
        Ok(HmacScheme {
            header: HeaderName::from_static(row.header),
            alg: row.alg,
            encoding: row.encoding,
            prefix: row.prefix.map(str::to_string),
            timestamp: None,
            template,
            keys: hmac_keys(secrets),
            body_clock: row.body_clock.map(|p| (p, secs(tolerance))),
        })
    }

    /// GitHub: `X-Hub-Signature-256: sha256=<hex HMAC-SHA256(secret, body)>`.
    pub fn github(secrets: &[Secret]) -> Result<Self, FieldError> {
        Ok(HmacScheme {
            header: HeaderName::from_static("x-hub-signature-256"),
            alg: HashAlg::Sha256,
            encoding: Encoding::Hex,
            prefix: Some("sha256=".into()),
            timestamp: None,
            template: vec![Part::Body],
            keys: hmac_keys(secrets),
            body_clock: None,
        })
    }

    /// Shopify: `X-Shopify-Hmac-Sha256: <base64 HMAC-SHA256(secret, body)>`.
    pub fn shopify(secrets: &[Secret]) -> Result<Self, FieldError> {
        Ok(HmacScheme {
            header: HeaderName::from_static("x-shopify-hmac-sha256"),
            alg: HashAlg::Sha256,
            encoding: Encoding::Base64,
            prefix: None,
            timestamp: None,
            template: vec![Part::Body],
            keys: hmac_keys(secrets),
            body_clock: None,
        })
    }

    /// Slack: `X-Slack-Signature: v0=<hex HMAC-SHA256(secret, "v0:{ts}:{body}")>` with
    /// `X-Slack-Request-Timestamp` inside the window.
    pub fn slack(secrets: &[Secret], tolerance: Duration) -> Result<Self, FieldError> {
        Ok(HmacScheme {
            header: HeaderName::from_static("x-slack-signature"),
            alg: HashAlg::Sha256,
            encoding: Encoding::Hex,
            prefix: Some("v0=".into()),
            timestamp: Some((
                HeaderName::from_static("x-slack-request-timestamp"),
                secs(tolerance),
            )),
            template: vec![
                Part::Literal(b"v0:".to_vec()),
                Part::Timestamp,
                Part::Literal(b":".to_vec()),
                Part::Body,
            ],
            keys: hmac_keys(secrets),
            body_clock: None,
        })
    }

    /// Zoom: `x-zm-signature: v0=<hex HMAC-SHA256(secret token, "v0:{ts}:{body}")>` with
    /// `x-zm-request-timestamp` inside the window.
    pub fn zoom(secrets: &[Secret], tolerance: Duration) -> Result<Self, FieldError> {
        Ok(HmacScheme {
            header: HeaderName::from_static("x-zm-signature"),
            timestamp: Some((
                HeaderName::from_static("x-zm-request-timestamp"),
                secs(tolerance),
            )),
            ..Self::slack(secrets, tolerance)?
        })
    }

    /// X (Account Activity): `x-twitter-webhooks-signature: sha256=<base64
    /// HMAC-SHA256(consumer secret, body)>`.
    pub fn twitter(secrets: &[Secret]) -> Result<Self, FieldError> {
        Ok(HmacScheme {
            header: HeaderName::from_static("x-twitter-webhooks-signature"),
            encoding: Encoding::Base64,
            ..Self::github(secrets)?
        })
    }

    /// A `custom` route: every setting from its fields.
    pub fn custom(
        secrets: &[Secret],
        c: &CustomFields,
        tolerance: Duration,
    ) -> Result<Self, FieldError> {
        let header_name = |field: &str, v: &str| {
            HeaderName::from_bytes(v.trim().as_bytes())
                .map_err(|_| FieldError::new(field, format!("`{v}` is not a header name")))
        };
        let header = match &c.signature_header {
            Some(h) => header_name("signature_header", h)?,
            None => {
                return Err(FieldError::new(
                    "signature_header",
                    "is required for `custom` routes",
                ));
            }
        };
        let alg = match c.hash.as_deref().unwrap_or("sha256") {
            "sha1" => HashAlg::Sha1,
            "sha256" => HashAlg::Sha256,
            "sha512" => HashAlg::Sha512,
            other => {
                return Err(FieldError::new(
                    "hash",
                    format!("`{other}` is not one of: sha1, sha256, sha512"),
                ));
            }
        };
        let encoding = match c.encoding.as_deref().unwrap_or("hex") {
            "hex" => Encoding::Hex,
            "base64" => Encoding::Base64,
            other => {
                return Err(FieldError::new(
                    "encoding",
                    format!("`{other}` is not one of: hex, base64"),
                ));
            }
        };
        let timestamp = match &c.timestamp_header {
            Some(h) => Some((header_name("timestamp_header", h)?, secs(tolerance))),
            None => None,
        };
        let default_template = if timestamp.is_some() {
            "{timestamp}.{body}"
        } else {
            "{body}"
        };
        let template = parse_template(
            c.signed.as_deref().unwrap_or(default_template),
            timestamp.is_some(),
        )
        .map_err(|m| FieldError::new("signed", m))?;
        if let Some(p) = &c.prefix
            && p.is_empty()
        {
            return Err(FieldError::new("prefix", "is empty: leave it out instead"));
        }
        Ok(HmacScheme {
            header,
            alg,
            encoding,
            prefix: c.prefix.clone(),
            timestamp,
            template,
            keys: hmac_keys(secrets),
            body_clock: None,
        })
    }
}

impl Verifier for HmacScheme {
    fn headers_read(&self) -> Vec<HeaderName> {
        let mut h = vec![self.header.clone()];
        h.extend(self.timestamp.iter().map(|(name, _)| name.clone()));
        h
    }

    fn verify(&self, headers: &HeaderMap, body: &[u8], now: i64) -> Result<(), SignatureError> {
        let sig = header_str(headers, self.header.as_str(), "missing signature header")?;
        let ts = match &self.timestamp {
            Some((name, tolerance)) => {
                let ts = header_str(headers, name.as_str(), "missing timestamp header")?;
                check_timestamp(ts, now, *tolerance)?;
                Some(ts.trim())
            }
            None => None,
        };
        let sig = match &self.prefix {
            Some(p) => sig
                .trim()
                .strip_prefix(p.as_str())
                .ok_or(SignatureError::Invalid(
                    "the signature lacks its expected prefix",
                ))?,
            None => sig,
        };
        let sig = self
            .encoding
            .decode(sig)
            .ok_or(SignatureError::Invalid("no signature matches"))?;
        let parts: Vec<&[u8]> = self
            .template
            .iter()
            .map(|p| match p {
                Part::Literal(l) => l.as_slice(),
                Part::Body => body,
                Part::Timestamp => ts.unwrap_or_default().as_bytes(),
            })
            .collect();
        let matched = self
            .keys
            .iter()
            .any(|k| bool::from(self.alg.hmac(k, &parts).as_slice().ct_eq(&sig)));
        if !matched {
            return Err(SignatureError::Invalid("no signature matches"));
        }
        match self.body_clock {
            Some((pointer, tolerance)) => body_clock(body, pointer, now, tolerance),
            None => Ok(()),
        }
    }
}

/// Checks a signed Unix-milliseconds timestamp inside a JSON body against the window.
fn body_clock(body: &[u8], pointer: &str, now: i64, tolerance: i64) -> Result<(), SignatureError> {
    const MISSING: &str = "the body holds no signed timestamp";
    let doc: serde_json::Value =
        serde_json::from_slice(body).map_err(|_| SignatureError::Malformed(MISSING))?;
    let ms = doc
        .pointer(pointer)
        .and_then(serde_json::Value::as_i64)
        .ok_or(SignatureError::Malformed(MISSING))?;
    check_timestamp(&ms.div_euclid(1000).to_string(), now, tolerance).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn secrets(s: &[&str]) -> Vec<Secret> {
        s.iter()
            .map(|s| Secret {
                source: s.to_string(),
                value: s.as_bytes().to_vec(),
                id: None,
            })
            .collect()
    }

    fn h(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        m
    }

    fn vectors() -> serde_json::Value {
        serde_json::from_str(include_str!("../../tests/fixtures/provider_vectors.json")).unwrap()
    }

    fn flip(s: &str) -> String {
        let mut b = s.as_bytes().to_vec();
        let i = b.len() - 3;
        b[i] = if b[i] == b'0' { b'1' } else { b'0' };
        String::from_utf8(b).unwrap()
    }

    #[test]
    fn github_published_vector() {
        let v = &vectors()["GITHUB"];
        let (secret, body, sig) = (
            v["secret"].as_str().unwrap(),
            v["body"].as_str().unwrap().as_bytes(),
            v["signature"].as_str().unwrap(),
        );
        let g = HmacScheme::github(&secrets(&[secret])).unwrap();
        let hs = h(&[("x-hub-signature-256", sig)]);
        assert_eq!(g.verify(&hs, body, 0), Ok(()));
        // rotation: the right secret second
        let g2 = HmacScheme::github(&secrets(&["old", secret])).unwrap();
        assert_eq!(g2.verify(&hs, body, 0), Ok(()));
        // wrong secret, flipped body byte, flipped signature, missing header, no prefix
        let wrong = HmacScheme::github(&secrets(&["It's a Secret to Everybody!"])).unwrap();
        assert!(matches!(
            wrong.verify(&hs, body, 0),
            Err(SignatureError::Invalid(_))
        ));
        let mut b = body.to_vec();
        b[0] ^= 1;
        assert!(matches!(
            g.verify(&hs, &b, 0),
            Err(SignatureError::Invalid(_))
        ));
        let bad = h(&[("x-hub-signature-256", &flip(sig))]);
        assert!(matches!(
            g.verify(&bad, body, 0),
            Err(SignatureError::Invalid(_))
        ));
        assert!(matches!(
            g.verify(&h(&[]), body, 0),
            Err(SignatureError::Malformed(_))
        ));
        let bare = h(&[("x-hub-signature-256", &sig["sha256=".len()..])]);
        assert!(matches!(
            g.verify(&bare, body, 0),
            Err(SignatureError::Invalid(_))
        ));
        let empty = h(&[("x-hub-signature-256", "")]);
        assert!(matches!(
            g.verify(&empty, body, 0),
            Err(SignatureError::Invalid(_))
        ));
    }

    #[test]
    fn shopify_published_vector() {
        let v = &vectors()["SHOPIFY"];
        let (secret, body, sig) = (
            v["secret"].as_str().unwrap(),
            v["body"].as_str().unwrap().as_bytes(),
            v["signature"].as_str().unwrap(),
        );
        let s = HmacScheme::shopify(&secrets(&[secret])).unwrap();
        let hs = h(&[("x-shopify-hmac-sha256", sig)]);
        assert_eq!(s.verify(&hs, body, 0), Ok(()));
        let wrong = HmacScheme::shopify(&secrets(&["shop-secreT"])).unwrap();
        assert!(wrong.verify(&hs, body, 0).is_err());
        assert!(matches!(
            s.verify(&hs, b"{\"id\":2}", 0),
            Err(SignatureError::Invalid(_))
        ));
        assert!(matches!(
            s.verify(&h(&[]), body, 0),
            Err(SignatureError::Malformed(_))
        ));
        let mut bad = sig.to_string();
        bad.replace_range(0..1, if sig.starts_with('A') { "B" } else { "A" });
        let hb = h(&[("x-shopify-hmac-sha256", &bad)]);
        assert!(matches!(
            s.verify(&hb, body, 0),
            Err(SignatureError::Invalid(_))
        ));
    }

    #[test]
    fn slack_published_vector_and_window() {
        let v = &vectors()["SLACK"];
        let (secret, ts, body, sig) = (
            v["secret"].as_str().unwrap(),
            v["timestamp"].as_i64().unwrap(),
            v["body"].as_str().unwrap().as_bytes(),
            v["signature"].as_str().unwrap(),
        );
        let s = HmacScheme::slack(&secrets(&[secret]), Duration::from_secs(300)).unwrap();
        let tss = ts.to_string();
        let hs = h(&[
            ("x-slack-signature", sig),
            ("x-slack-request-timestamp", &tss),
        ]);
        assert_eq!(s.verify(&hs, body, ts), Ok(()));
        assert_eq!(s.verify(&hs, body, ts + 300), Ok(()));
        assert_eq!(s.verify(&hs, body, ts - 300), Ok(()));
        for now in [ts + 301, ts - 301] {
            assert!(matches!(
                s.verify(&hs, body, now),
                Err(SignatureError::Invalid(_))
            ));
        }
        let wrong = HmacScheme::slack(&secrets(&["x"]), Duration::from_secs(300)).unwrap();
        assert!(wrong.verify(&hs, body, ts).is_err());
        let mut b = body.to_vec();
        b[5] ^= 1;
        assert!(s.verify(&hs, &b, ts).is_err());
        // a different timestamp inside the window breaks the signature
        let other = (ts + 1).to_string();
        let ho = h(&[
            ("x-slack-signature", sig),
            ("x-slack-request-timestamp", &other),
        ]);
        assert!(matches!(
            s.verify(&ho, body, ts),
            Err(SignatureError::Invalid(_))
        ));
        for missing in ["x-slack-signature", "x-slack-request-timestamp"] {
            let mut m = hs.clone();
            m.remove(missing);
            assert!(matches!(
                s.verify(&m, body, ts),
                Err(SignatureError::Malformed(_))
            ));
        }
        let hn = h(&[
            ("x-slack-signature", sig),
            ("x-slack-request-timestamp", "soon"),
        ]);
        assert!(matches!(
            s.verify(&hn, body, ts),
            Err(SignatureError::Malformed(_))
        ));
        let hv = h(&[
            ("x-slack-signature", &sig.replace("v0=", "v1=")),
            ("x-slack-request-timestamp", &tss),
        ]);
        assert!(matches!(
            s.verify(&hv, body, ts),
            Err(SignatureError::Invalid(_))
        ));
    }

    fn custom(fields: CustomFields, s: &[&str]) -> Result<HmacScheme, FieldError> {
        HmacScheme::custom(&secrets(s), &fields, Duration::from_secs(300))
    }

    #[test]
    fn custom_reproduces_the_github_vector() {
        let v = &vectors()["GITHUB"];
        let c = CustomFields {
            signature_header: Some("X-Hub-Signature-256".into()),
            prefix: Some("sha256=".into()),
            ..Default::default()
        };
        let s = custom(c, &[v["secret"].as_str().unwrap()]).unwrap();
        let hs = h(&[("x-hub-signature-256", v["signature"].as_str().unwrap())]);
        assert_eq!(
            s.verify(&hs, v["body"].as_str().unwrap().as_bytes(), 0),
            Ok(())
        );
    }

    #[test]
    fn custom_hashes_encodings_and_templates() {
        let body = b"{\"a\":1}";
        for (hash, alg) in [
            ("sha1", HashAlg::Sha1),
            ("sha256", HashAlg::Sha256),
            ("sha512", HashAlg::Sha512),
        ] {
            for enc in ["hex", "base64"] {
                let c = CustomFields {
                    signature_header: Some("X-Sig".into()),
                    hash: Some(hash.into()),
                    encoding: Some(enc.into()),
                    timestamp_header: Some("X-Ts".into()),
                    ..Default::default()
                };
                let s = custom(c, &["k1", "k2"]).unwrap();
                let mac = alg.hmac(b"k2", &[b"1700000000.", body]);
                let text = if enc == "hex" {
                    hex::encode(&mac)
                } else {
                    B64.encode(&mac)
                };
                let hs = h(&[("x-sig", &text), ("x-ts", "1700000000")]);
                assert_eq!(s.verify(&hs, body, 1_700_000_000), Ok(()), "{hash} {enc}");
                assert!(matches!(
                    s.verify(&hs, body, 1_700_000_301),
                    Err(SignatureError::Invalid(_))
                ));
                let mut m = hs.clone();
                m.remove("x-ts");
                assert!(matches!(
                    s.verify(&m, body, 1_700_000_000),
                    Err(SignatureError::Malformed(_))
                ));
            }
        }
        // an explicit template
        let c = CustomFields {
            signature_header: Some("X-Sig".into()),
            timestamp_header: Some("X-Ts".into()),
            signed: Some("v1:{timestamp}:{body}".into()),
            ..Default::default()
        };
        let s = custom(c, &["k"]).unwrap();
        let mac = HashAlg::Sha256.hmac(b"k", &[b"v1:5:", body]);
        let hs = h(&[("x-sig", &hex::encode(mac)), ("x-ts", "5")]);
        assert_eq!(s.verify(&hs, body, 5), Ok(()));
    }

    #[test]
    fn custom_config_errors_name_their_field() {
        let field = |c: CustomFields| custom(c, &["k"]).err().unwrap().field;
        let base = || CustomFields {
            signature_header: Some("X-Sig".into()),
            ..Default::default()
        };
        assert_eq!(field(CustomFields::default()), "signature_header");
        assert_eq!(
            field(CustomFields {
                hash: Some("md5".into()),
                ..base()
            }),
            "hash"
        );
        assert_eq!(
            field(CustomFields {
                encoding: Some("base32".into()),
                ..base()
            }),
            "encoding"
        );
        assert_eq!(
            field(CustomFields {
                signed: Some("{timestamp}.{body}".into()),
                ..base()
            }),
            "signed"
        );
        assert_eq!(
            field(CustomFields {
                signed: Some("{timestamp}".into()),
                timestamp_header: Some("X-Ts".into()),
                ..base()
            }),
            "signed"
        );
        assert_eq!(
            field(CustomFields {
                signed: Some("{bdy}".into()),
                ..base()
            }),
            "signed"
        );
        assert_eq!(
            field(CustomFields {
                signature_header: Some("bad header".into()),
                ..Default::default()
            }),
            "signature_header"
        );
    }

    #[test]
    fn templates_keep_literal_braces() {
        let p = parse_template("{\"x\":{body}}", false).unwrap();
        assert_eq!(
            p,
            vec![
                Part::Literal(b"{\"x\":".to_vec()),
                Part::Body,
                Part::Literal(b"}".to_vec())
            ]
        );
    }
}
