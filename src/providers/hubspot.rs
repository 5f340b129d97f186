//! HubSpot, signature v3 only: `X-HubSpot-Signature-v3` = base64 HMAC-SHA256(client
//! secret, method + URI + body + timestamp), with `X-HubSpot-Request-Timestamp` in
//! milliseconds. The URI is the one HubSpot posted to (`public_url`, with the request's
//! query), with the characters HubSpot decodes before signing decoded. The v1 and v2
//! headers sign no timestamp (v1 not even the URL) and are never accepted.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use http::HeaderMap;
use subtle::ConstantTimeEq;

use super::common::{HashAlg, PublicUrl, check_timestamp, header_str};
use super::{FieldError, SignatureError, Verifier};
use crate::config::Secret;

/// The percent-escapes HubSpot decodes in the URI it signs.
const DECODED: &[(&str, &str)] = &[
    ("%3A", ":"),
    ("%2F", "/"),
    ("%3F", "?"),
    ("%40", "@"),
    ("%21", "!"),
    ("%24", "$"),
    ("%27", "'"),
    ("%28", "("),
    ("%29", ")"),
    ("%2A", "*"),
    ("%2C", ","),
    ("%3B", ";"),
];

/// HubSpot's v3 verifier: the client secrets, the signed URL and the window.
pub struct Hubspot {
    keys: Vec<Vec<u8>>,
    url: PublicUrl,
    tolerance: i64,
}

impl Hubspot {
    /// Built once per route from its secrets.
    pub fn new(
        secrets: &[Secret],
        public_url: Option<&str>,
        tolerance: std::time::Duration,
    ) -> Result<Self, FieldError> {
        Ok(Hubspot {
            keys: secrets.iter().map(|s| s.value.clone()).collect(),
            url: PublicUrl::parse(public_url, "hubspot")?,
            tolerance: i64::try_from(tolerance.as_secs()).unwrap_or(i64::MAX),
        })
    }
}

impl Verifier for Hubspot {
    fn headers_read(&self) -> Vec<http::HeaderName> {
        super::guard::names(&["x-hubspot-signature-v3", "x-hubspot-request-timestamp"])
    }

    fn verify(&self, headers: &HeaderMap, body: &[u8], now: i64) -> Result<(), SignatureError> {
        self.verify_request(headers, None, body, now)
    }

    fn verify_request(
        &self,
        headers: &HeaderMap,
        query: Option<&str>,
        body: &[u8],
        now: i64,
    ) -> Result<(), SignatureError> {
        let sig = header_str(
            headers,
            "x-hubspot-signature-v3",
            "missing X-HubSpot-Signature-v3 header (v1 and v2 are not accepted)",
        )?;
        let ts = header_str(
            headers,
            "x-hubspot-request-timestamp",
            "missing X-HubSpot-Request-Timestamp header",
        )?
        .trim();
        let ms: i64 = ts
            .parse()
            .map_err(|_| SignatureError::Malformed("the timestamp is not an integer"))?;
        check_timestamp(&ms.div_euclid(1000).to_string(), now, self.tolerance)?;
        let mut uri = self.url.for_request(query);
        for (from, to) in DECODED {
            uri = uri
                .replace(from, to)
                .replace(&from.to_ascii_lowercase(), to);
        }
        let sig = B64
            .decode(sig.trim())
            .map_err(|_| SignatureError::Invalid("no signature matches"))?;
        let parts: [&[u8]; 4] = [b"POST", uri.as_bytes(), body, ts.as_bytes()];
        let matched = self
            .keys
            .iter()
            .any(|k| bool::from(HashAlg::Sha256.hmac(k, &parts).as_slice().ct_eq(&sig)));
        if matched {
            Ok(())
        } else {
            Err(SignatureError::Invalid("no signature matches"))
        }
    }
}
