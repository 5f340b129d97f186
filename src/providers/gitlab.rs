//! GitLab: `X-Gitlab-Token` carries the webhook's secret token as it is; it proves the
//! sender knows the token and authenticates nothing of the body. When the webhook also
//! has a signing token (GitLab's Standard Webhooks signing, a `whsec_` secret), the
//! `webhook-*` signature is checked as the `standard` preset does, and then it is the
//! body's authentication.

use http::HeaderMap;
use subtle::ConstantTimeEq;

use super::common::header_str;
use super::{SignatureError, Verifier};

/// GitLab's verifier: the token check, and the signature check when configured.
pub struct Gitlab {
    /// The plain secret tokens (empty when only a signing token is configured).
    tokens: Vec<Vec<u8>>,
    /// The Standard Webhooks check, when a signing token is configured.
    signed: Option<Box<dyn Verifier>>,
}

impl Gitlab {
    /// Built once per route from its secrets.
    pub fn new(tokens: Vec<Vec<u8>>, signed: Option<Box<dyn Verifier>>) -> Self {
        Gitlab { tokens, signed }
    }
}

impl Verifier for Gitlab {
    fn headers_read(&self) -> Vec<http::HeaderName> {
        let mut h = super::guard::names(&["x-gitlab-token"]);
        if let Some(s) = &self.signed {
            h.extend(s.headers_read());
        }
        h
    }

    fn verify(&self, headers: &HeaderMap, body: &[u8], now: i64) -> Result<(), SignatureError> {
        if !self.tokens.is_empty() {
            let got = header_str(headers, "x-gitlab-token", "missing X-Gitlab-Token header")?;
            let ok = self
                .tokens
                .iter()
                .any(|t| bool::from(t.as_slice().ct_eq(got.as_bytes())));
            if !ok {
                return Err(SignatureError::Invalid("the X-Gitlab-Token does not match"));
            }
        }
        match &self.signed {
            Some(s) => s.verify(headers, body, now),
            None => Ok(()),
        }
    }
}
