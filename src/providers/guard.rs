//! One value per checked header. A signature check reads the first value of a header;
//! the application may read another one. So a header the check reads (signature,
//! timestamp, nonce, ...), a key header, or a header hashed into the claim key that
//! arrives twice with different values is refused with 400 before anything is
//! verified, whatever the order of the values: the application never reads a value
//! nobody signed. The same value repeated is one value.

use http::{HeaderMap, HeaderName};

use super::SignatureError;

/// The answer's message when a checked header arrives with two different values.
pub const TWICE: &str = "a signed, signature or key header was sent twice with different values";

/// Header names from a preset's static list (lowercase, as `HeaderName` wants).
pub fn names(list: &[&'static str]) -> Vec<HeaderName> {
    list.iter().map(|n| HeaderName::from_static(n)).collect()
}

/// The headers a route's deliveries must not carry twice with different values.
#[derive(Debug, Default)]
pub struct Guarded(Vec<HeaderName>);

impl Guarded {
    pub fn new(names: impl IntoIterator<Item = HeaderName>) -> Self {
        let mut v: Vec<HeaderName> = names.into_iter().collect();
        v.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        v.dedup();
        Guarded(v)
    }

    /// Refuses a delivery that carries one of the guarded headers with two different
    /// values (400: the request is malformed, not necessarily forged).
    pub fn check(&self, headers: &HeaderMap) -> Result<(), SignatureError> {
        for name in &self.0 {
            let mut values = headers.get_all(name).iter();
            if let Some(first) = values.next()
                && values.any(|v| v != first)
            {
                return Err(SignatureError::Malformed(TWICE));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use http::HeaderValue;

    use super::*;
    use crate::config::Config;
    use crate::providers::{IdentifyError, Route, build_route};

    fn route(lines: &str) -> Route {
        let text = format!("[[route]]\nname = \"r\"\npath = \"/r\"\n{lines}\n");
        let c = Config::from_toml_with_env(&text, |_| None).expect("valid route");
        build_route(&c.routes[0], &c).expect("route builds")
    }

    fn vectors() -> serde_json::Value {
        serde_json::from_str(include_str!("../../tests/fixtures/provider_vectors.json"))
            .expect("vectors")
    }

    /// Every preset, and the headers it must guard: its signature, timestamp and other
    /// signed headers, its key headers, and the headers hashed into its claim key.
    fn presets() -> Vec<(&'static str, String, Vec<&'static str>)> {
        let v = vectors();
        let q = |s: &str| serde_json::to_string(s).expect("quoted");
        let alipay_key = q(v["ALIPAY_TRADE_PUBLIC_KEY_B64"].as_str().expect("key"));
        let wechat_cert = q(v["WECHATPAY_CERT_PEM"].as_str().expect("cert"));
        vec![
            (
                "standard",
                "provider = \"standard\"\nsecrets = [\"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"]"
                    .into(),
                vec!["webhook-id", "webhook-timestamp", "webhook-signature"],
            ),
            (
                "github",
                "provider = \"github\"\nsecrets = [\"s\"]".into(),
                vec!["x-hub-signature-256", "x-github-delivery"],
            ),
            (
                "stripe",
                "provider = \"stripe\"\nsecrets = [\"s\"]".into(),
                vec!["stripe-signature"],
            ),
            (
                "shopify",
                "provider = \"shopify\"\nsecrets = [\"s\"]".into(),
                vec![
                    "x-shopify-hmac-sha256",
                    "x-shopify-event-id",
                    "x-shopify-topic",
                    "x-shopify-shop-domain",
                ],
            ),
            (
                "slack",
                "provider = \"slack\"\nsecrets = [\"s\"]".into(),
                vec!["x-slack-signature", "x-slack-request-timestamp"],
            ),
            (
                "alipay",
                format!("provider = \"alipay\"\nsecrets = [{alipay_key}]\nkey = \"header:X-Id\""),
                vec!["x-id"],
            ),
            (
                "wechatpay",
                format!("provider = \"wechatpay\"\nsecrets = [{wechat_cert}]"),
                vec![
                    "wechatpay-signature",
                    "wechatpay-timestamp",
                    "wechatpay-nonce",
                    "wechatpay-serial",
                    "wechatpay-signature-type",
                ],
            ),
            (
                "twilio",
                "provider = \"twilio\"\nsecrets = [\"s\"]\npublic_url = \"https://x/y\"".into(),
                vec![
                    "x-twilio-signature",
                    "content-type",
                    "i-twilio-idempotency-token",
                ],
            ),
            (
                "custom",
                "provider = \"custom\"\nsecrets = [\"s\"]\nsignature_header = \"X-Sig\"\n\
                 timestamp_header = \"X-Ts\"\nkey = \"header:X-Id+json:/id\""
                    .into(),
                vec!["x-sig", "x-ts", "x-id"],
            ),
        ]
    }

    #[test]
    fn every_checked_header_sent_twice_with_different_values_is_400_in_either_order() {
        let body = Bytes::from_static(b"{\"id\":\"evt_1\"}");
        for (preset, lines, guarded) in presets() {
            let r = route(&lines);
            for name in &guarded {
                for (first, second) in [("a", "b"), ("b", "a")] {
                    let mut h = HeaderMap::new();
                    h.append(*name, HeaderValue::from_static(first));
                    h.append(*name, HeaderValue::from_static(second));
                    assert_eq!(
                        r.identify(&h, None, &body, 0),
                        Err(IdentifyError::Signature(SignatureError::Malformed(TWICE))),
                        "{preset}: {name} sent twice"
                    );
                }
                // the same value twice is one value: refused (if at all) for another
                // reason than the repetition
                let mut h = HeaderMap::new();
                h.append(*name, HeaderValue::from_static("a"));
                h.append(*name, HeaderValue::from_static("a"));
                assert_ne!(
                    r.identify(&h, None, &body, 0),
                    Err(IdentifyError::Signature(SignatureError::Malformed(TWICE))),
                    "{preset}: {name} repeated with one value"
                );
            }
            // a header nobody reads may repeat freely
            let mut h = HeaderMap::new();
            h.append("x-unrelated", HeaderValue::from_static("a"));
            h.append("x-unrelated", HeaderValue::from_static("b"));
            assert_ne!(
                r.identify(&h, None, &body, 0),
                Err(IdentifyError::Signature(SignatureError::Malformed(TWICE))),
                "{preset}: an unrelated header"
            );
        }
    }
}
