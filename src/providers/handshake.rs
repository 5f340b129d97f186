//! Handshakes: the requests a provider sends to check a URL before (or besides) its
//! deliveries, which hold no idempotency key and must never be claimed. Signed ones
//! (Slack's `url_verification`, Zoom's `endpoint.url_validation`, Discord's PINGs) are
//! recognised only after the signature verified; unsigned GET checks (Meta's
//! `hub.verify_token`, X's CRC) are checked here by what they carry. Pure: the route
//! decides, the gate answers or forwards.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use bytes::Bytes;
use http::{Method, StatusCode};
use subtle::ConstantTimeEq;

use super::common::HashAlg;
use super::{IdentifyError, SignatureError};
use crate::config::HandshakeMode;

/// Which handshakes a preset's provider sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    None,
    Slack,
    Zoom,
    Discord,
    Meta,
    Twitter,
}

/// The answer idemgate gives a handshake itself (`handshake = "answer"`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub status: StatusCode,
    pub content_type: Option<&'static str>,
    pub body: Bytes,
}

impl Reply {
    /// A 200 JSON reply (Zoom's tokens, Discord's PONG, X's response token).
    fn json(v: serde_json::Value) -> Reply {
        Reply {
            status: StatusCode::OK,
            content_type: Some("application/json"),
            body: Bytes::from(v.to_string()),
        }
    }

    /// A 200 `text/plain` reply (Slack's and Meta's challenge echo).
    fn text(t: &str) -> Reply {
        Reply {
            status: StatusCode::OK,
            content_type: Some("text/plain"),
            body: Bytes::copy_from_slice(t.as_bytes()),
        }
    }
}

/// A route's handshake settings, built once.
pub(super) struct Handshakes {
    pub(super) kind: Kind,
    pub(super) mode: HandshakeMode,
    /// Meta's `verify_token`; without one every GET check is refused.
    pub(super) verify_token: Option<Vec<u8>>,
    /// The first configured secret: Zoom's and X's answers are HMACs under it.
    pub(super) answer_key: Vec<u8>,
}

/// The longest `hub.challenge` echoed (Meta sends a short number).
const MAX_CHALLENGE: usize = 256;

/// The longest `crc_token` answered.
const MAX_CRC_TOKEN: usize = 128;

/// Whether `token` has the shape of the CRC tokens X sends: 1 to `MAX_CRC_TOKEN`
/// characters of the base64 and base64url alphabets (`A-Z a-z 0-9 + / = - _`), and not
/// a JSON text. That alphabet excludes objects, arrays and strings; the JSON check
/// excludes the rest (`123`, `-5`, `1e5`, `true`, `null`), so answering a token never
/// signs a body that parses as JSON.
fn crc_token_shape(token: &str) -> bool {
    !token.is_empty()
        && token.len() <= MAX_CRC_TOKEN
        && token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"+/=-_".contains(&b))
        && serde_json::from_str::<serde::de::IgnoredAny>(token).is_err()
}

/// One decoded query parameter (the first of that name).
fn query_param(query: Option<&str>, name: &str) -> Option<String> {
    form_urlencoded::parse(query?.as_bytes())
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
}

impl Handshakes {
    /// Whether the route can see a handshake at all.
    pub(super) fn any(&self) -> bool {
        self.kind != Kind::None
    }

    /// Whether a verified body may be a delivery. X's events are JSON objects, and its
    /// CRC answer signs a token with the POSTs' own construction: refusing every other
    /// body means a signature obtained from a CRC answer verifies nothing idemgate passes.
    pub(super) fn body_may_be_delivery(&self, body: &[u8]) -> bool {
        self.kind != Kind::Twitter || body.trim_ascii_start().first() == Some(&b'{')
    }

    /// An unsigned GET check: `None` when the request is not one (it is then verified
    /// as a delivery); otherwise the reply (`Some` with `handshake = "answer"`) or the
    /// refusal.
    pub(super) fn unsigned(
        &self,
        method: &Method,
        query: Option<&str>,
    ) -> Option<Result<Option<Reply>, IdentifyError>> {
        if method != Method::GET {
            return None;
        }
        match self.kind {
            Kind::Meta => {
                let mode = query_param(query, "hub.mode")?;
                let token = query_param(query, "hub.verify_token").unwrap_or_default();
                let challenge = query_param(query, "hub.challenge").unwrap_or_default();
                let right = self
                    .verify_token
                    .as_ref()
                    .is_some_and(|t| bool::from(t.as_slice().ct_eq(token.as_bytes())));
                if mode != "subscribe" || !right {
                    return Some(Err(IdentifyError::Forbidden(
                        "the verify token is missing or wrong",
                    )));
                }
                if challenge.is_empty()
                    || challenge.len() > MAX_CHALLENGE
                    || challenge.chars().any(|c| c.is_control())
                {
                    return Some(Err(SignatureError::Malformed(
                        "hub.challenge is missing or not a short printable string",
                    )
                    .into()));
                }
                Some(Ok(self.answering(|| Reply::text(&challenge))))
            }
            Kind::Twitter => {
                let token = query_param(query, "crc_token")?;
                if !crc_token_shape(&token) {
                    return Some(Err(SignatureError::Malformed(
                        "the crc_token is not of the shape X sends (1-128 base64 characters)",
                    )
                    .into()));
                }
                Some(Ok(self.answering(|| {
                    let mac = HashAlg::Sha256.hmac(&self.answer_key, &[token.as_bytes()]);
                    Reply::json(serde_json::json!({
                        "response_token": format!("sha256={}", B64.encode(mac))
                    }))
                })))
            }
            _ => None,
        }
    }

    /// Whether a body is shaped like one of the route's signed handshakes (checked
    /// before the signature too: an unsigned or badly signed handshake is a 401).
    pub(super) fn signed_shape(&self, body: &[u8]) -> Option<Shape> {
        if !matches!(self.kind, Kind::Slack | Kind::Zoom | Kind::Discord) {
            return None;
        }
        let doc: serde_json::Value = serde_json::from_slice(body).ok()?;
        let str_at = |p: &str| doc.pointer(p).and_then(|v| v.as_str()).map(str::to_string);
        match self.kind {
            Kind::Slack if str_at("/type").as_deref() == Some("url_verification") => Some(
                Shape::SlackChallenge(str_at("/challenge").unwrap_or_default()),
            ),
            Kind::Zoom if str_at("/event").as_deref() == Some("endpoint.url_validation") => Some(
                Shape::ZoomValidation(str_at("/payload/plainToken").unwrap_or_default()),
            ),
            Kind::Discord => match (discord_event(&doc), doc.get("type")?.as_i64()?) {
                (true, 0) => Some(Shape::DiscordEventPing),
                (false, 1) => Some(Shape::DiscordInteractionPing),
                _ => None,
            },
            _ => None,
        }
    }

    /// The reply to a verified signed handshake (`None` with `handshake = "forward"`).
    pub(super) fn signed_reply(&self, shape: &Shape) -> Option<Reply> {
        self.answering(|| match shape {
            Shape::SlackChallenge(c) => Reply::text(c),
            Shape::ZoomValidation(plain) => {
                let mac = HashAlg::Sha256.hmac(&self.answer_key, &[plain.as_bytes()]);
                Reply::json(serde_json::json!({
                    "plainToken": plain,
                    "encryptedToken": hex::encode(mac),
                }))
            }
            Shape::DiscordInteractionPing => Reply::json(serde_json::json!({"type": 1})),
            Shape::DiscordEventPing => Reply {
                status: StatusCode::NO_CONTENT,
                content_type: None,
                body: Bytes::new(),
            },
        })
    }

    /// Whether a verified body is a Discord Webhook Event (no id: keyed by content).
    pub(super) fn content_keyed(&self, body: &[u8]) -> bool {
        self.kind == Kind::Discord
            && serde_json::from_slice::<serde_json::Value>(body).is_ok_and(|d| discord_event(&d))
    }

    /// The reply, built only when the route answers handshakes itself.
    fn answering(&self, reply: impl FnOnce() -> Reply) -> Option<Reply> {
        (self.mode == HandshakeMode::Answer).then(reply)
    }
}

/// Discord serves Webhook Events and Interactions on one kind of endpoint: an
/// Interaction always carries its continuation `token`, a Webhook Event never does.
fn discord_event(doc: &serde_json::Value) -> bool {
    doc.is_object() && doc.get("token").is_none() && doc.get("version").is_some()
}

/// A signed handshake, recognised by its body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Shape {
    SlackChallenge(String),
    ZoomValidation(String),
    DiscordInteractionPing,
    DiscordEventPing,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hs(kind: Kind, mode: HandshakeMode) -> Handshakes {
        Handshakes {
            kind,
            mode,
            verify_token: Some(b"tok".to_vec()),
            answer_key: b"key".to_vec(),
        }
    }

    #[test]
    fn crc_tokens_of_x_shape_only() {
        assert!(crc_token_shape("MjE1NDc2MjY4OTk0NTc2MTA1Mg=="));
        assert!(crc_token_shape("abc-_"));
        let long = "x".repeat(129);
        for bad in [
            "",
            "{\"a\":1}",
            "a b",
            &long,
            "é",
            "123",
            "-5",
            "1e5",
            "true",
            "null",
            "false",
        ] {
            assert!(!crc_token_shape(bad), "{bad}");
        }
    }

    #[test]
    fn meta_checks_the_verify_token() {
        let h = hs(Kind::Meta, HandshakeMode::Answer);
        let get = |q: &str| h.unsigned(&Method::GET, Some(q));
        let ok = get("hub.mode=subscribe&hub.verify_token=tok&hub.challenge=1158201444");
        assert_eq!(ok, Some(Ok(Some(Reply::text("1158201444")))));
        for q in [
            "hub.mode=subscribe&hub.verify_token=tak&hub.challenge=1",
            "hub.mode=subscribe&hub.challenge=1",
            "hub.mode=unsubscribe&hub.verify_token=tok&hub.challenge=1",
        ] {
            assert!(
                matches!(get(q), Some(Err(IdentifyError::Forbidden(_)))),
                "{q}"
            );
        }
        assert_eq!(get("a=1"), None);
        assert_eq!(h.unsigned(&Method::POST, Some("hub.mode=subscribe")), None);
        let fwd = hs(Kind::Meta, HandshakeMode::Forward);
        assert_eq!(
            fwd.unsigned(
                &Method::GET,
                Some("hub.mode=subscribe&hub.verify_token=tok&hub.challenge=1")
            ),
            Some(Ok(None))
        );
    }

    #[test]
    fn discord_shapes() {
        let h = hs(Kind::Discord, HandshakeMode::Answer);
        let shape = |b: &str| h.signed_shape(b.as_bytes());
        assert_eq!(
            shape(r#"{"id":"1","token":"t","type":1,"version":1}"#),
            Some(Shape::DiscordInteractionPing)
        );
        assert_eq!(
            shape(r#"{"version":1,"application_id":"1","type":0}"#),
            Some(Shape::DiscordEventPing)
        );
        assert_eq!(
            shape(r#"{"id":"1","token":"t","type":2,"version":1}"#),
            None
        );
        assert_eq!(shape(r#"{"version":1,"type":1,"event":{}}"#), None);
        assert!(h.content_keyed(br#"{"version":1,"type":1,"event":{}}"#));
        assert!(!h.content_keyed(br#"{"id":"1","token":"t","type":2,"version":1}"#));
    }
}
