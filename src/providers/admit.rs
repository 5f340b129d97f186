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
        if !self.handshakes.body_may_be_delivery(body) {
            return Err(SignatureError::Invalid("an X event is a JSON object").into());
        }
        if self.handshakes.content_keyed(body) {
            let fingerprint = fingerprint_body(body);
            let key = format!("sha256:{}", hex::encode(fingerprint));
            return Ok(Admission::Delivery(Identity {
                claim_key: key.clone(),
                delivery_key: key,
                fingerprint,
                scoped_body: None,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::{build_route, routes};

    fn built(lines: &str) -> Result<Route, String> {
        let text = format!("[[route]]\nname = \"r\"\npath = \"/r\"\n{lines}\n");
        let (c, _) = routes::from_toml_with_env(&text, |_| None).map_err(|e| e.field)?;
        build_route(&c.routes[0], &c).map_err(|e| e.field)
    }

    #[test]
    fn handshake_and_verify_token_only_where_the_provider_sends_them() {
        assert_eq!(
            built("provider = \"github\"\nsecrets = [\"s\"]\nhandshake = \"answer\"").err(),
            Some("route[0].handshake".into())
        );
        assert_eq!(
            built("provider = \"slack\"\nsecrets = [\"s\"]\nverify_token = \"t\"").err(),
            Some("route[0].verify_token".into())
        );
        assert_eq!(
            built("provider = \"slack\"\nsecrets = [\"s\"]\nhandshake = \"echo\"").err(),
            Some("route[0].handshake".into())
        );
        assert_eq!(
            built("provider = \"slack\"\nsecrets = [\"s\"]\nkeyless = \"drop\"").err(),
            Some("route[0].keyless".into())
        );
        for p in ["slack", "zoom", "twitter", "meta"] {
            let r = built(&format!(
                "provider = \"{p}\"\nsecrets = [\"s\"]\nhandshake = \"answer\""
            ));
            assert!(r.is_ok_and(|r| r.has_handshakes()), "{p}");
        }
    }

    #[test]
    fn keyless_defaults_per_preset_and_overrides() {
        let slack = built("provider = \"slack\"\nsecrets = [\"s\"]").unwrap();
        assert!(slack.forwards_keyless());
        let gh = built("provider = \"github\"\nsecrets = [\"s\"]").unwrap();
        assert!(!gh.forwards_keyless() && !gh.has_handshakes());
        let slack = built("provider = \"slack\"\nsecrets = [\"s\"]\nkeyless = \"reject\"").unwrap();
        assert!(!slack.forwards_keyless());
        let st =
            built("provider = \"standard\"\nsecrets = [\"whsec_c2VjcmV0\"]\nkeyless = \"forward\"")
                .unwrap();
        assert!(st.forwards_keyless());
    }

    #[test]
    fn zoom_defaults_to_a_window_its_retries_fit() {
        let z = built("provider = \"zoom\"\nsecrets = [\"s\"]").unwrap();
        assert_eq!(z.tolerance(), Some(std::time::Duration::from_secs(5400)));
    }
}
