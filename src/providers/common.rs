//! Helpers every signature scheme shares: reading a header, checking a signed
//! timestamp's window, computing an HMAC. Providers take these from here rather than
//! from each other, so no preset depends on another.

use hmac::{KeyInit, Mac};
use http::HeaderMap;

use super::SignatureError;

/// The hash under an HMAC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HashAlg {
    Sha1,
    Sha256,
    Sha512,
}

impl HashAlg {
    /// HMAC of the concatenated `parts` under `key`.
    pub fn hmac(self, key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
        fn run<M: Mac + KeyInit>(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
            let mut mac =
                <M as KeyInit>::new_from_slice(key).expect("HMAC takes keys of any length");
            for p in parts {
                mac.update(p);
            }
            mac.finalize().into_bytes().to_vec()
        }
        match self {
            HashAlg::Sha1 => run::<hmac::Hmac<sha1::Sha1>>(key, parts),
            HashAlg::Sha256 => run::<hmac::Hmac<sha2::Sha256>>(key, parts),
            HashAlg::Sha512 => run::<hmac::Hmac<sha2::Sha512>>(key, parts),
        }
    }
}

/// One header's value as text, or the rejection for its absence.
pub fn header_str<'a>(
    headers: &'a HeaderMap,
    name: &str,
    missing: &'static str,
) -> Result<&'a str, SignatureError> {
    headers
        .get(name)
        .ok_or(SignatureError::Malformed(missing))?
        .to_str()
        .map_err(|_| SignatureError::Malformed(missing))
}

/// Parses a Unix-seconds timestamp and checks it lies within `tolerance` of `now`,
/// in both directions; exactly `tolerance` away is still accepted.
pub fn check_timestamp(text: &str, now: i64, tolerance: i64) -> Result<i64, SignatureError> {
    let ts: i64 = text
        .trim()
        .parse()
        .map_err(|_| SignatureError::Malformed("the timestamp is not an integer"))?;
    match now.checked_sub(ts) {
        Some(delta) if delta.unsigned_abs() <= tolerance.unsigned_abs() => Ok(ts),
        _ => Err(SignatureError::Invalid(
            "the timestamp is outside the tolerance window",
        )),
    }
}

/// A route's `public_url`, for providers that sign the URL they post to: the URL as
/// configured, with the request's own query when it has one.
pub struct PublicUrl {
    /// Up to (not including) the `?`.
    base: String,
    /// `public_url`'s own query, if any.
    query: Option<String>,
}

impl PublicUrl {
    /// Checks `public_url` is set and absolute; `provider` names the preset in the error.
    pub fn parse(url: Option<&str>, provider: &str) -> Result<Self, super::FieldError> {
        use super::FieldError;
        let url = url.ok_or_else(|| {
            FieldError::new(
                "public_url",
                format!(
                    "is required for `{provider}` routes: the full URL the provider posts to, \
                     which it signs"
                ),
            )
        })?;
        let uri: http::Uri = url
            .parse()
            .map_err(|_| FieldError::new("public_url", format!("`{url}` is not a URL")))?;
        if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.authority().is_none() {
            return Err(FieldError::new(
                "public_url",
                "must be an absolute http:// or https:// URL, as configured at the provider",
            ));
        }
        let (base, query) = match url.split_once('?') {
            Some((b, q)) => (b.to_string(), Some(q.to_string())),
            None => (url.to_string(), None),
        };
        Ok(PublicUrl { base, query })
    }

    /// The query the provider signed: the request's own, else `public_url`'s.
    pub fn query_for<'a>(&'a self, query: Option<&'a str>) -> Option<&'a str> {
        query.filter(|q| !q.is_empty()).or(self.query.as_deref())
    }

    /// The URL the provider requested: the request's query, else `public_url`'s own.
    pub fn for_request(&self, query: Option<&str>) -> String {
        match self.query_for(query) {
            Some(q) => format!("{}?{q}", self.base),
            None => self.base.clone(),
        }
    }
}
