//! Providers: how a route verifies, identifies and fingerprints a delivery.
//!
//! A route's `provider = "..."` selects a preset (a signature scheme, where the stable
//! idempotency key lives, what the payload fingerprint covers, whether a timestamp is
//! signed). `build_route` expands the preset once, at start, into a `Route` whose
//! pieces are small pure values: nothing here does I/O or parses config per request.

mod admit;
mod adyen;
mod alipay;
mod common;
mod content_scope;
mod discord;
mod gitlab;
mod guard;
mod handshake;
mod hmac_scheme;
mod hubspot;
mod keys;
mod mailgun;
mod paddle;
mod presets;
mod routes;
mod rsa_key;
mod sendgrid;
mod short_secrets;
mod standard;
mod stripe;
mod target;
mod twilio;
mod wechatpay;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue};
use sha2::{Digest, Sha256};

use crate::config::{Config, DedupConfig, HandshakeMode, KeylessPolicy, RouteConfig};
pub use admit::Admission;
pub use handshake::Reply;
pub use keys::{KeyError, KeySource, MAX_KEY_LEN, validate_key};
pub use presets::PROVIDERS;
pub use routes::{Routes, from_toml_with_env, load};
pub use short_secrets::{MIN_HMAC_SECRET_BYTES, ShortSecret, short_hmac_secrets};
// Each scheme's verifier, for the benches and fuzz targets that drive one directly.
pub use alipay::Alipay;
pub use hmac_scheme::HmacScheme;
pub use standard::StandardWebhooks;
pub use stripe::Stripe;
pub use wechatpay::WechatPay;

/// Why a delivery's signature check failed, mapped to exactly one HTTP answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// A required header is missing or unparseable (400).
    #[error("{0}")]
    Malformed(&'static str),
    /// Present but not authentic, or outside the timestamp window (401).
    #[error("{0}")]
    Invalid(&'static str),
}

/// A provider's signature scheme: pure and synchronous.
pub trait Verifier: Send + Sync {
    /// `now` is the current Unix time in seconds.
    fn verify(&self, headers: &HeaderMap, body: &[u8], now: i64) -> Result<(), SignatureError>;

    /// Every header the check reads (signature, timestamp, other signed headers): each
    /// must arrive once, or repeated with one value (see `guard`).
    fn headers_read(&self) -> Vec<http::HeaderName>;

    /// Like `verify`, for schemes that also sign the request's query (Twilio signs
    /// the URL it posted to). `query` is the request's query string, if any.
    fn verify_request(
        &self,
        headers: &HeaderMap,
        query: Option<&str>,
        body: &[u8],
        now: i64,
    ) -> Result<(), SignatureError> {
        let _ = query;
        self.verify(headers, body, now)
    }
}

/// A configuration problem found while building a route, relative to the route.
#[derive(Debug)]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

impl FieldError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        FieldError {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// The payload fingerprint: it tells a provider's retry (same event) from a different
/// event reusing a key. SHA-256 over the raw body bytes.
pub type Fingerprint = [u8; 32];

pub fn fingerprint_body(body: &[u8]) -> Fingerprint {
    Sha256::digest(body).into()
}

/// What a preset's payload fingerprint covers. The body by default; presets whose
/// retries may legitimately change bytes of a signed body fingerprint the fields that
/// identify the event instead (a provider's retry must never be answered 422).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FingerprintRule {
    Body,
    /// Alipay: the form fields except `sign`, `sign_type` and `notify_time`, which a
    /// re-sent notification may change.
    AlipayFields,
    /// WeChat Pay: these JSON fields (the encrypted resource may be re-encrypted).
    JsonFields(&'static [&'static str]),
    /// The JSON body without these members (of the top-level object, or of each object
    /// of a top-level array): fields a provider's retry rewrites inside a signed body
    /// (HubSpot's `attemptNumber`, Intercom's `delivery_attempts`).
    JsonWithout(&'static [&'static str]),
}

impl FingerprintRule {
    pub fn fingerprint(self, body: &[u8]) -> Fingerprint {
        match self {
            FingerprintRule::Body => fingerprint_body(body),
            FingerprintRule::AlipayFields => alipay::stable_fingerprint(body),
            FingerprintRule::JsonFields(pointers) => {
                let Ok(doc) = serde_json::from_slice::<serde_json::Value>(body) else {
                    return fingerprint_body(body);
                };
                let mut h = Sha256::new();
                for p in pointers {
                    let v = doc.pointer(p).cloned().unwrap_or(serde_json::Value::Null);
                    h.update(p.as_bytes());
                    h.update(b"=");
                    h.update(v.to_string().as_bytes());
                    h.update(b"\n");
                }
                h.finalize().into()
            }
            FingerprintRule::JsonWithout(names) => {
                let Ok(mut doc) = serde_json::from_slice::<serde_json::Value>(body) else {
                    return fingerprint_body(body);
                };
                let strip = |v: &mut serde_json::Value| {
                    if let Some(o) = v.as_object_mut() {
                        for n in names {
                            o.remove(*n);
                        }
                    }
                };
                match &mut doc {
                    serde_json::Value::Array(items) => items.iter_mut().for_each(strip),
                    other => strip(other),
                }
                fingerprint_body(doc.to_string().as_bytes())
            }
        }
    }
}

/// Which of the application's answers completes a delivery (and is replayed to every
/// copy); any other answer releases the claim so the provider's retry is forwarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SuccessRule {
    /// Any 2xx.
    Any2xx,
    /// Alipay: a 2xx whose body is literally `success`. Alipay retries anything else,
    /// so storing a 200 `fail` would answer every retry with `fail`, forever, while the
    /// application never saw them.
    AlipaySuccessBody,
}

impl SuccessRule {
    pub fn completes(self, status: http::StatusCode, body: &[u8]) -> bool {
        match self {
            SuccessRule::Any2xx => status.is_success(),
            SuccessRule::AlipaySuccessBody => {
                status.is_success() && body.trim_ascii() == b"success"
            }
        }
    }
}

/// Which key a delivery is claimed under in the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimKey {
    /// The delivery's idempotency key (it is signed, or the route chose so).
    Delivery,
    /// `sha256:<hex of the body>`: the key source reads a header the provider does not
    /// sign, so a captured request replayed under a fresh key must still be caught.
    /// The delivery key is still required, logged and sent upstream.
    Content,
    /// A signed one-time value read by `Route::claim_source` (Mailgun's token): its
    /// reuse is caught even though the delivery key is unsigned.
    Source,
}

/// What the pure half found out about an authentic delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The key the store claims (see `ClaimKey`).
    pub claim_key: String,
    /// The delivery's own idempotency key, as its key source read it.
    pub delivery_key: String,
    pub fingerprint: Fingerprint,
    /// The body's own hash when the claim also covers unsigned scope headers.
    pub scoped_body: Option<Fingerprint>,
}

/// A route, built once from its configuration.
pub struct Route {
    pub name: Arc<str>,
    pub path: String,
    pub upstream_path: Option<String>,
    pub verifier: Box<dyn Verifier>,
    pub key: KeySource,
    pub fingerprint: FingerprintRule,
    pub claim_key: ClaimKey,
    /// Where a `ClaimKey::Source` claim is read.
    claim_source: Option<KeySource>,
    pub success: SuccessRule,
    /// Whether the delivery log keeps this route's requests for an operator's replay.
    pub keep_payload: bool,
    /// Whether a copy is answered with the stored body, or its status and headers only.
    pub replay_body: bool,
    /// The route's effective lease, retention, in-flight policy and wait (its own keys
    /// over `[dedup]`).
    pub dedup: DedupConfig,
    /// For `ClaimKey::Content`: headers hashed with the body, because one body may
    /// legitimately arrive as several events (Shopify sends one order JSON as
    /// `orders/create` and `orders/paid`).
    content_scope: &'static [&'static str],
    tolerance: Option<Duration>,
    /// The headers a delivery must not carry twice with different values.
    guarded: guard::Guarded,
    /// `"{name}:"`, the prefix of the `idempotency-key` header sent upstream.
    key_header_prefix: String,
    /// The provider's URL checks, and what the route does with them.
    handshakes: handshake::Handshakes,
    /// What a signed request holding no key gets.
    keyless: KeylessPolicy,
}

impl Route {
    /// The timestamp window, for presets that sign a timestamp.
    pub fn tolerance(&self) -> Option<Duration> {
        self.tolerance
    }

    /// The `idempotency-key` header value for the upstream: `<route>:<key>`.
    pub fn idempotency_header(&self, key: &str) -> Option<HeaderValue> {
        let mut v = String::with_capacity(self.key_header_prefix.len() + key.len());
        v.push_str(&self.key_header_prefix);
        v.push_str(key);
        HeaderValue::from_str(&v).ok()
    }

    /// Verifies, then extracts the key and fingerprint: the pure front half of the
    /// pipeline, before anything touches the store.
    pub fn identify(
        &self,
        headers: &HeaderMap,
        query: Option<&str>,
        body: &Bytes,
        now: i64,
    ) -> Result<Identity, IdentifyError> {
        self.guarded.check(headers)?;
        self.verifier.verify_request(headers, query, body, now)?;
        self.identify_verified(headers, body)
    }

    /// The key and fingerprint of a delivery whose signature verified.
    fn identify_verified(
        &self,
        headers: &HeaderMap,
        body: &Bytes,
    ) -> Result<Identity, IdentifyError> {
        let delivery_key = self.key.extract(headers, body)?;
        Ok(match self.claim_key {
            ClaimKey::Delivery => Identity {
                claim_key: delivery_key.clone(),
                delivery_key,
                fingerprint: self.fingerprint.fingerprint(body),
                scoped_body: None,
            },
            ClaimKey::Source => {
                let src = self.claim_source.as_ref().unwrap_or(&self.key);
                Identity {
                    claim_key: format!("once:{}", src.extract(headers, body)?),
                    delivery_key,
                    fingerprint: self.fingerprint.fingerprint(body),
                    scoped_body: None,
                }
            }
            ClaimKey::Content => {
                let fingerprint = self.content_hash(headers, body);
                Identity {
                    claim_key: format!("sha256:{}", hex::encode(fingerprint)),
                    delivery_key,
                    fingerprint,
                    scoped_body: self.has_scope().then(|| fingerprint_body(body)),
                }
            }
        })
    }
}

/// Why `Route::identify`, the pure half, refused a delivery: its signature or its key.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum IdentifyError {
    #[error(transparent)]
    Signature(#[from] SignatureError),
    #[error(transparent)]
    Key(#[from] KeyError),
    /// An unsigned check with the wrong credential (Meta's verify token): 403.
    #[error("{0}")]
    Forbidden(&'static str),
}

/// Expands a route's preset into a `Route`. Errors name the field within the route.
pub fn build_route(cfg: &RouteConfig, config: &Config) -> Result<Route, FieldError> {
    if !PROVIDERS.contains(&cfg.provider.as_str()) {
        return Err(FieldError::new(
            "provider",
            format!("`{}` is not one of: {}", cfg.provider, PROVIDERS.join(", ")),
        ));
    }
    let c = &cfg.custom;
    let used = presets::fields_used(&cfg.provider);
    for (field, set) in [
        ("signature_header", c.signature_header.is_some()),
        ("hash", c.hash.is_some()),
        ("encoding", c.encoding.is_some()),
        ("prefix", c.prefix.is_some()),
        ("timestamp_header", c.timestamp_header.is_some()),
        ("signed", c.signed.is_some()),
        ("public_url", c.public_url.is_some()),
        ("verify_token", c.verify_token.is_some()),
        (
            "handshake",
            c.handshake.is_some()
                && presets::handshake_kind(&cfg.provider) == handshake::Kind::None,
        ),
    ] {
        if set && !used.contains(&field) {
            return Err(FieldError::new(
                field,
                format!("is not used by the `{}` provider", cfg.provider),
            ));
        }
    }
    // Presets that sign a timestamp take `tolerance` (default 5m); the others refuse
    // it, since a window they cannot check would only pretend to protect.
    let signs_timestamp = presets::signs_timestamp(cfg);
    let tolerance = match (signs_timestamp, cfg.tolerance) {
        (true, t) => Some(t.unwrap_or(presets::default_tolerance(&cfg.provider))),
        (false, None) => None,
        (false, Some(_)) => {
            let why = if cfg.provider == "custom" {
                "is only used with timestamp_header: without it nothing signs a timestamp"
                    .to_string()
            } else {
                format!(
                    "the `{}` provider signs no timestamp, so there is no window to check",
                    cfg.provider
                )
            };
            return Err(FieldError::new("tolerance", why));
        }
    };
    let tol = tolerance.unwrap_or(presets::DEFAULT_TOLERANCE);
    let preset = presets::preset(cfg, tol, tolerance)?;
    let key_text = match (&cfg.key, preset.default_key) {
        (Some(k), _) => k.as_str(),
        (None, Some(k)) => k,
        (None, None) => {
            return Err(FieldError::new(
                "key",
                format!(
                    "is required for `{}` routes (header:NAME, json:/pointer, form:FIELD, or several joined with +)",
                    cfg.provider
                ),
            ));
        }
    };
    let key = KeySource::parse(key_text)
        .map_err(|m| FieldError::new("key", m))?
        .with_aliases(preset.key_aliases);
    let claim_source = preset
        .claim_source
        .map(|t| KeySource::parse(t).expect("a preset's claim source parses"));
    let custom_ts = c.timestamp_header.as_deref().map(str::to_ascii_lowercase);
    let unsigned_header = preset.claim_content
        || key.headers().into_iter().any(|h| {
            !preset.signed_headers.contains(&h.as_str()) && custom_ts.as_deref() != Some(h.as_str())
        });
    let guarded = guard::Guarded::new(
        preset
            .verifier
            .headers_read()
            .into_iter()
            .chain(key.headers().into_iter().cloned())
            .chain(guard::names(preset.content_scope)),
    );
    Ok(Route {
        guarded,
        name: Arc::from(cfg.name.as_str()),
        path: cfg.path.clone(),
        upstream_path: cfg.upstream_path.clone(),
        verifier: preset.verifier,
        key,
        fingerprint: preset.fingerprint,
        claim_key: if claim_source.is_some() {
            ClaimKey::Source
        } else if unsigned_header {
            ClaimKey::Content
        } else {
            ClaimKey::Delivery
        },
        claim_source,
        content_scope: preset.content_scope,
        success: preset.success,
        tolerance: preset.tolerance,
        keep_payload: cfg.keep_payload,
        replay_body: cfg.replay_body,
        dedup: cfg.dedup.over(&config.dedup),
        key_header_prefix: format!("{}:", cfg.name),
        handshakes: handshake::Handshakes {
            kind: presets::handshake_kind(&cfg.provider),
            mode: c.handshake.unwrap_or(HandshakeMode::Forward),
            verify_token: c.verify_token.as_ref().map(|t| t.value.clone()),
            answer_key: cfg
                .secrets
                .first()
                .map(|s| s.value.clone())
                .unwrap_or_default(),
        },
        keyless: cfg
            .keyless
            .unwrap_or_else(|| presets::default_keyless(&cfg.provider)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn route(provider_lines: &str) -> Result<Config, crate::config::ConfigError> {
        let text = format!("[[route]]\nname = \"r\"\npath = \"/r\"\n{provider_lines}\n");
        routes::from_toml_with_env(&text, |_| None).map(|(c, _)| c)
    }

    fn field(provider_lines: &str) -> String {
        route(provider_lines).unwrap_err().field
    }

    fn built(provider_lines: &str) -> Route {
        let c = route(provider_lines).unwrap();
        build_route(&c.routes[0], &c).unwrap()
    }

    #[test]
    fn tolerance_only_where_a_timestamp_is_signed() {
        for p in ["github", "shopify"] {
            assert_eq!(
                field(&format!(
                    "provider = \"{p}\"\nsecrets = [\"s\"]\ntolerance = \"1m\""
                )),
                "route[0].tolerance"
            );
        }
        assert_eq!(
            field(
                "provider = \"twilio\"\nsecrets = [\"s\"]\npublic_url = \"https://x/y\"\ntolerance = \"1m\""
            ),
            "route[0].tolerance"
        );
        assert_eq!(
            field(
                "provider = \"custom\"\nsecrets = [\"s\"]\nsignature_header = \"X-Sig\"\nkey = \"header:X-Id\"\ntolerance = \"1m\""
            ),
            "route[0].tolerance"
        );
        for p in ["stripe", "slack"] {
            let r = built(&format!("provider = \"{p}\"\nsecrets = [\"s\"]"));
            assert_eq!(r.tolerance(), Some(Duration::from_secs(300)));
            let r = built(&format!(
                "provider = \"{p}\"\nsecrets = [\"s\"]\ntolerance = \"1m\""
            ));
            assert_eq!(r.tolerance(), Some(Duration::from_secs(60)));
        }
        let r = built(
            "provider = \"custom\"\nsecrets = [\"s\"]\nsignature_header = \"X-Sig\"\ntimestamp_header = \"X-Ts\"\nkey = \"header:X-Id\"",
        );
        assert_eq!(r.tolerance(), Some(Duration::from_secs(300)));
        assert_eq!(r.claim_key, ClaimKey::Content);
    }

    #[test]
    fn fields_a_provider_does_not_use_are_errors() {
        assert_eq!(
            field("provider = \"github\"\nsecrets = [\"s\"]\nsignature_header = \"X\""),
            "route[0].signature_header"
        );
        assert_eq!(
            field("provider = \"stripe\"\nsecrets = [\"s\"]\npublic_url = \"https://x/\""),
            "route[0].public_url"
        );
        assert_eq!(
            field(
                "provider = \"twilio\"\nsecrets = [\"s\"]\npublic_url = \"https://x/\"\nhash = \"sha1\""
            ),
            "route[0].hash"
        );
        assert_eq!(
            field(
                "provider = \"custom\"\nsecrets = [\"s\"]\nsignature_header = \"X\"\nkey = \"header:X-Id\"\npublic_url = \"https://x/\""
            ),
            "route[0].public_url"
        );
        // required fields
        assert_eq!(
            field("provider = \"twilio\"\nsecrets = [\"s\"]"),
            "route[0].public_url"
        );
        assert_eq!(
            field("provider = \"custom\"\nsecrets = [\"s\"]\nkey = \"header:X-Id\""),
            "route[0].signature_header"
        );
        assert_eq!(
            field("provider = \"custom\"\nsecrets = [\"s\"]\nsignature_header = \"X\""),
            "route[0].key"
        );
        assert_eq!(
            field("provider = \"alipay\"\nsecrets = [\"not a key\"]"),
            "route[0].secrets[0]"
        );
        assert_eq!(
            field("provider = \"wechatpay\"\nsecrets = [\"PUB_KEY_ID_1=nonsense\"]"),
            "route[0].secrets[0]"
        );
    }

    #[test]
    fn unsigned_keys_claim_the_content() {
        let gh = built("provider = \"github\"\nsecrets = [\"s\"]");
        assert_eq!(gh.claim_key, ClaimKey::Content);
        let shop = built("provider = \"shopify\"\nsecrets = [\"s\"]");
        assert_eq!(shop.claim_key, ClaimKey::Content);
        let tw = built("provider = \"twilio\"\nsecrets = [\"s\"]\npublic_url = \"https://x/y\"");
        assert_eq!(tw.claim_key, ClaimKey::Content);
        for p in ["stripe", "slack"] {
            let r = built(&format!("provider = \"{p}\"\nsecrets = [\"s\"]"));
            assert_eq!(r.claim_key, ClaimKey::Delivery, "{p}");
        }
        // a signed key chosen for GitHub: the delivery key is claimed
        let gh_json = built("provider = \"github\"\nsecrets = [\"s\"]\nkey = \"json:/hook_id\"");
        assert_eq!(gh_json.claim_key, ClaimKey::Delivery);
        // an unsigned header chosen for Stripe: the content is claimed
        let st = built("provider = \"stripe\"\nsecrets = [\"s\"]\nkey = \"header:X-Request-Id\"");
        assert_eq!(st.claim_key, ClaimKey::Content);
    }

    #[test]
    fn a_github_delivery_is_claimed_by_its_body_and_forwarded_with_its_id() {
        let v: serde_json::Value =
            serde_json::from_str(include_str!("../../tests/fixtures/provider_vectors.json"))
                .unwrap();
        let g = &v["GITHUB"];
        let secret = g["secret"].as_str().unwrap();
        let r = built(&format!("provider = \"github\"\nsecrets = [\"{secret}\"]"));
        let mut h = HeaderMap::new();
        h.insert(
            "x-hub-signature-256",
            HeaderValue::from_str(g["signature"].as_str().unwrap()).unwrap(),
        );
        let body = Bytes::from(g["body"].as_str().unwrap().to_string());
        // the delivery ID is still required
        assert!(matches!(
            r.identify(&h, None, &body, 0),
            Err(IdentifyError::Key(KeyError::Missing(_)))
        ));
        h.insert("x-github-delivery", HeaderValue::from_static("d-1"));
        let a = r.identify(&h, None, &body, 0).unwrap();
        h.insert("x-github-delivery", HeaderValue::from_static("d-2"));
        let b = r.identify(&h, None, &body, 0).unwrap();
        assert_eq!(a.claim_key, b.claim_key);
        assert_eq!(
            a.claim_key,
            format!("sha256:{}", hex::encode(fingerprint_body(&body)))
        );
        assert_eq!(
            (a.delivery_key.as_str(), b.delivery_key.as_str()),
            ("d-1", "d-2")
        );
    }

    #[test]
    fn alipay_completes_only_on_the_literal_success() {
        use http::StatusCode;
        let a = SuccessRule::AlipaySuccessBody;
        assert!(a.completes(StatusCode::OK, b"success"));
        assert!(a.completes(StatusCode::OK, b"success\n"));
        assert!(!a.completes(StatusCode::OK, b"fail"));
        assert!(!a.completes(StatusCode::OK, b""));
        assert!(!a.completes(StatusCode::INTERNAL_SERVER_ERROR, b"success"));
        assert!(SuccessRule::Any2xx.completes(StatusCode::NO_CONTENT, b""));
        assert!(!SuccessRule::Any2xx.completes(StatusCode::BAD_GATEWAY, b""));
    }

    #[test]
    fn shopify_keys_are_composite() {
        let r = built("provider = \"shopify\"\nsecrets = [\"s\"]");
        let mut h = HeaderMap::new();
        h.insert("x-shopify-event-id", HeaderValue::from_static("e1"));
        h.insert("x-shopify-topic", HeaderValue::from_static("orders/create"));
        h.insert(
            "x-shopify-shop-domain",
            HeaderValue::from_static("s.myshopify.com"),
        );
        assert_eq!(
            r.key.extract(&h, b"{}").unwrap(),
            "e1:orders/create:s.myshopify.com"
        );
    }

    #[test]
    fn shopify_content_keys_are_scoped_by_topic_and_shop() {
        let sig = "plW8VGqq0nDMIEhDqaNNW99asdUCy7EIqLZVcQwtAZ0=";
        let r = built("provider = \"shopify\"\nsecrets = [\"shop-secret\"]");
        let body = Bytes::from_static(b"{\"id\":1}");
        let claim = |event: &'static str, topic: &'static str, shop: &'static str| {
            let mut h = HeaderMap::new();
            h.insert("x-shopify-hmac-sha256", HeaderValue::from_static(sig));
            h.insert("x-shopify-event-id", HeaderValue::from_static(event));
            h.insert("x-shopify-topic", HeaderValue::from_static(topic));
            h.insert("x-shopify-shop-domain", HeaderValue::from_static(shop));
            r.identify(&h, None, &body, 0).unwrap().claim_key
        };
        let first = claim("e1", "orders/create", "a.myshopify.com");
        // a replay under a new event ID is the same claim
        assert_eq!(first, claim("e2", "orders/create", "a.myshopify.com"));
        // the same order JSON as another topic, or from another shop, is another event
        assert_ne!(first, claim("e3", "orders/paid", "a.myshopify.com"));
        assert_ne!(first, claim("e4", "orders/create", "b.myshopify.com"));
    }

    #[test]
    fn json_without_ignores_only_the_named_members() {
        let f = FingerprintRule::JsonWithout(&["attemptNumber"]);
        let a =
            f.fingerprint(br#"[{"eventId":1,"attemptNumber":0},{"eventId":2,"attemptNumber":0}]"#);
        let b =
            f.fingerprint(br#"[{"eventId":1,"attemptNumber":3},{"eventId":2,"attemptNumber":1}]"#);
        let c =
            f.fingerprint(br#"[{"eventId":1,"attemptNumber":0},{"eventId":3,"attemptNumber":0}]"#);
        assert_eq!(a, b);
        assert_ne!(a, c);
        let o = FingerprintRule::JsonWithout(&["delivery_attempts"]);
        assert_eq!(
            o.fingerprint(br#"{"id":"n1","delivery_attempts":1}"#),
            o.fingerprint(br#"{"id":"n1","delivery_attempts":2}"#)
        );
        // not JSON: the body's hash, as the Body rule
        assert_eq!(o.fingerprint(b"x=1"), fingerprint_body(b"x=1"));
    }
}
