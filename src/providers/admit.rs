//! What a request to a route is, before anything touches the store: a delivery to
//! claim, a handshake (answered or forwarded, never claimed), or a signed request with
//! no key (forwarded undeduplicated or refused, per `keyless`).

use bytes::Bytes;
use http::{HeaderMap, Method};

use super::handshake::Reply;
use super::{IdentifyError, Identity, Route, SignatureError, fingerprint_body};
use crate::config::KeylessPolicy;

/// The pure half's verdict on an authentic request.
#[derive(Debug, PartialEq, Eq)]
pub enum Admission {
    /// A delivery: claim its key.
    Delivery(Identity),
    /// A provider's URL check: answer it with the reply (`handshake = "answer"`), or
    /// forward it unclaimed (`None`).
    Handshake(Option<Reply>),
    /// Signed but holding no key, with `keyless = "forward"`: forward it unclaimed.
    Unkeyed,
}

impl Route {
    /// Checks a request (unsigned GET checks, then the signature, then the key) and
    /// says what it is.
    pub fn admit(
        &self,
        method: &Method,
        headers: &HeaderMap,
        query: Option<&str>,
        body: &Bytes,
        now: i64,
    ) -> Result<Admission, IdentifyError> {
        self.guarded.check(headers)?;
        if let Some(check) = self.handshakes.unsigned(method, query) {
            return check.map(Admission::Handshake);
        }
        let shape = self.handshakes.signed_shape(body);
        if let Err(e) = self.verifier.verify_request(headers, query, body, now) {
            // A handshake is a 401 however its signature failed: providers probe with
            // unsigned and badly signed ones and expect exactly that.
            return Err(match (e, &shape) {
                (SignatureError::Malformed(m), Some(_)) => SignatureError::Invalid(m),
                (e, _) => e,
            }
            .into());
        }
        if let Some(shape) = shape {
            return Ok(Admission::Handshake(self.handshakes.signed_reply(&shape)));
        }
        if self.handshakes.content_keyed(body) {
            let fingerprint = fingerprint_body(body);
            let key = format!("sha256:{}", hex::encode(fingerprint));
            return Ok(Admission::Delivery(Identity {
                claim_key: key.clone(),
                delivery_key: key,
                fingerprint,
            }));
        }
        match self.identify_verified(headers, body) {
            Err(IdentifyError::Key(k)) if k.is_keyless() => match self.keyless {
                KeylessPolicy::Forward => Ok(Admission::Unkeyed),
                KeylessPolicy::Reject => Err(k.into()),
            },
            other => other.map(Admission::Delivery),
        }
    }

    /// Whether the route can see a handshake (its `handshake` outcome is exported).
    pub fn has_handshakes(&self) -> bool {
        self.handshakes.any()
    }

    /// Whether the route forwards keyless requests (its `unkeyed` outcome is exported).
    pub fn forwards_keyless(&self) -> bool {
        self.keyless == KeylessPolicy::Forward
    }
}
