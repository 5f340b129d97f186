//! Twilio: `X-Twilio-Signature` = base64 HMAC-SHA1(auth token, URL + params), where
//! the URL is the one Twilio requested and params are the form-encoded POST fields
//! sorted by name (then value), each written `name` + `value`. For JSON (and any
//! non-form) bodies Twilio adds `bodySHA256=<hex SHA-256 of the body>` to the URL's
//! query and signs the URL alone.
//!
//! The sidecar cannot know the public URL (TLS terminates in front of it, hosts are
//! rewritten), so the route names it in `public_url`. The signed URL is `public_url`
//! with the query of the request as received (or `public_url`'s own query when the
//! request has none): that is what Twilio requested when it posted to `public_url`.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use http::HeaderMap;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::common::HashAlg;
use super::common::{PublicUrl, header_str};
use super::{FieldError, SignatureError, Verifier};
use crate::config::Secret;

pub struct Twilio {
    tokens: Vec<Vec<u8>>,
    /// The URL Twilio posts to, which it signs.
    url: PublicUrl,
}

impl Twilio {
    pub fn new(secrets: &[Secret], public_url: Option<&str>) -> Result<Self, FieldError> {
        Ok(Twilio {
            tokens: secrets.iter().map(|s| s.value.clone()).collect(),
            url: PublicUrl::parse(public_url, "twilio")?,
        })
    }

    /// The string Twilio signed for this request.
    fn signed(
        &self,
        headers: &HeaderMap,
        query: Option<&str>,
        body: &[u8],
    ) -> Result<Vec<u8>, SignatureError> {
        let query = self.url.query_for(query);
        let mut out = self.url.for_request(query).into_bytes();
        let body_sha = query.and_then(|q| {
            form_urlencoded::parse(q.as_bytes())
                .find(|(k, _)| k == "bodySHA256")
                .map(|(_, v)| v.into_owned())
        });
        if let Some(want) = body_sha {
            let got = hex::encode(Sha256::digest(body));
            if !bool::from(got.as_bytes().ct_eq(want.to_ascii_lowercase().as_bytes())) {
                return Err(SignatureError::Invalid(
                    "bodySHA256 does not match the body",
                ));
            }
            return Ok(out);
        }
        let is_form = headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| {
                ct.trim()
                    .to_ascii_lowercase()
                    .starts_with("application/x-www-form-urlencoded")
            });
        if is_form {
            let mut params: Vec<(String, String)> = form_urlencoded::parse(body)
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect();
            params.sort();
            params.dedup();
            for (k, v) in params {
                out.extend_from_slice(k.as_bytes());
                out.extend_from_slice(v.as_bytes());
            }
        }
        Ok(out)
    }
}

impl Verifier for Twilio {
    /// The signature, and `Content-Type`, which decides how the body is signed.
    fn headers_read(&self) -> Vec<http::HeaderName> {
        super::guard::names(&["x-twilio-signature", "content-type"])
    }

    fn verify(&self, headers: &HeaderMap, body: &[u8], now: i64) -> Result<(), SignatureError> {
        self.verify_request(headers, None, body, now)
    }

    fn verify_request(
        &self,
        headers: &HeaderMap,
        query: Option<&str>,
        body: &[u8],
        _now: i64,
    ) -> Result<(), SignatureError> {
        let sig = header_str(
            headers,
            "x-twilio-signature",
            "missing X-Twilio-Signature header",
        )?;
        let sig = B64
            .decode(sig.trim())
            .map_err(|_| SignatureError::Invalid("no signature matches"))?;
        let signed = self.signed(headers, query, body)?;
        let matched = self
            .tokens
            .iter()
            .any(|t| bool::from(HashAlg::Sha1.hmac(t, &[&signed]).as_slice().ct_eq(&sig)));
        if matched {
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

    fn twilio(tokens: &[&str], url: &str) -> Twilio {
        let s: Vec<Secret> = tokens
            .iter()
            .map(|s| Secret {
                source: s.to_string(),
                value: s.as_bytes().to_vec(),
                id: None,
            })
            .collect();
        Twilio::new(&s, Some(url)).unwrap()
    }

    fn form_headers(sig: &str) -> HeaderMap {
        let mut m = HeaderMap::new();
        m.insert("x-twilio-signature", HeaderValue::from_str(sig).unwrap());
        m.insert(
            "content-type",
            HeaderValue::from_static("application/x-www-form-urlencoded"),
        );
        m
    }

    struct V {
        token: String,
        url: String,
        body: String,
        sig: String,
    }

    fn vector() -> V {
        let all: serde_json::Value =
            serde_json::from_str(include_str!("../../tests/fixtures/provider_vectors.json"))
                .unwrap();
        let v = &all["TWILIO"];
        let mut body = form_urlencoded::Serializer::new(String::new());
        for p in v["params"].as_array().unwrap() {
            body.append_pair(p[0].as_str().unwrap(), p[1].as_str().unwrap());
        }
        V {
            token: v["token"].as_str().unwrap().into(),
            url: v["url"].as_str().unwrap().into(),
            body: body.finish(),
            sig: v["signature"].as_str().unwrap().into(),
        }
    }

    #[test]
    fn published_vector_verifies() {
        let v = vector();
        let t = twilio(&[&v.token], &v.url);
        let b = v.body.as_bytes();
        // the query of the request as received, or none (public_url's own is used)
        assert_eq!(t.verify_request(&form_headers(&v.sig), None, b, 0), Ok(()));
        assert_eq!(
            t.verify_request(&form_headers(&v.sig), Some("foo=1&bar=2"), b, 0),
            Ok(())
        );
        // rotation
        let t2 = twilio(&["other", &v.token], &v.url);
        assert_eq!(t2.verify_request(&form_headers(&v.sig), None, b, 0), Ok(()));
        // parameter order in the body does not matter
        let reordered = "To=%2B18005551212&CallSid=CA1234567890ABCDE&Caller=%2B14158675309&Digits=1234&From=%2B14158675309";
        assert_eq!(
            t.verify_request(&form_headers(&v.sig), None, reordered.as_bytes(), 0),
            Ok(())
        );
    }

    #[test]
    fn negative_cases() {
        let v = vector();
        let t = twilio(&[&v.token], &v.url);
        let b = v.body.as_bytes();
        let is_invalid = |r| matches!(r, Err(SignatureError::Invalid(_)));
        assert!(is_invalid(twilio(&["54321"], &v.url).verify_request(
            &form_headers(&v.sig),
            None,
            b,
            0
        )));
        let tampered = v.body.replace("Digits=1234", "Digits=1235");
        assert!(is_invalid(t.verify_request(
            &form_headers(&v.sig),
            None,
            tampered.as_bytes(),
            0
        )));
        assert!(is_invalid(t.verify_request(
            &form_headers(&v.sig),
            Some("foo=2&bar=2"),
            b,
            0
        )));
        let other_url = twilio(&[&v.token], "https://mycompany.com/other.php?foo=1&bar=2");
        assert!(is_invalid(other_url.verify_request(
            &form_headers(&v.sig),
            None,
            b,
            0
        )));
        let mut flipped = v.sig.clone();
        flipped.replace_range(0..1, "X");
        assert!(is_invalid(t.verify_request(
            &form_headers(&flipped),
            None,
            b,
            0
        )));
        let mut none = form_headers(&v.sig);
        none.remove("x-twilio-signature");
        assert!(matches!(
            t.verify_request(&none, None, b, 0),
            Err(SignatureError::Malformed(_))
        ));
    }

    #[test]
    fn json_bodies_sign_the_url_with_body_sha256() {
        let body = br#"{"CallSid":"CA1"}"#;
        let hash = hex::encode(Sha256::digest(body));
        let query = format!("bodySHA256={hash}");
        let url = format!("https://example.com/hook?{query}");
        let sig = B64.encode(HashAlg::Sha1.hmac(b"tok", &[url.as_bytes()]));
        let t = twilio(&["tok"], "https://example.com/hook");
        let mut h = HeaderMap::new();
        h.insert("x-twilio-signature", HeaderValue::from_str(&sig).unwrap());
        h.insert("content-type", HeaderValue::from_static("application/json"));
        assert_eq!(t.verify_request(&h, Some(&query), body, 0), Ok(()));
        assert!(matches!(
            t.verify_request(&h, Some(&query), br#"{"CallSid":"CA2"}"#, 0),
            Err(SignatureError::Invalid(_))
        ));
    }

    #[test]
    fn public_url_is_required_and_absolute() {
        let s = [Secret {
            source: "t".into(),
            value: b"t".to_vec(),
            id: None,
        }];
        assert_eq!(Twilio::new(&s, None).err().unwrap().field, "public_url");
        assert_eq!(
            Twilio::new(&s, Some("/relative")).err().unwrap().field,
            "public_url"
        );
    }
}
