//! Providers: how a route verifies, identifies and fingerprints a delivery.
//!
//! A route's `provider = "..."` selects a preset (a signature scheme, where the stable
//! idempotency key lives, what the payload fingerprint covers, whether a timestamp is
//! signed). `build_route` expands the preset once, at start, into a `Route` whose
//! pieces are small pure values: nothing here does I/O or parses config per request.

pub mod keys;
pub mod standard;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue};
use sha2::{Digest, Sha256};

use crate::config::{Config, RouteConfig};
pub use keys::{KeyError, KeySource};

/// Why a delivery's signature check failed, mapped to exactly one HTTP answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
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
    fn verify(&self, headers: &HeaderMap, body: &[u8], now: i64) -> Result<(), Rejection>;
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

/// A route, built once from its configuration.
pub struct Route {
    pub name: Arc<str>,
    pub path: String,
    pub upstream_path: Option<String>,
    pub verifier: Box<dyn Verifier>,
    pub key: KeySource,
    tolerance: Option<Duration>,
    /// `"{name}:"`, the prefix of the `idempotency-key` header sent upstream.
    key_header_prefix: String,
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
        body: &Bytes,
        now: i64,
    ) -> Result<(String, Fingerprint), Refusal> {
        self.verifier
            .verify(headers, body, now)
            .map_err(Refusal::Signature)?;
        let key = self.key.extract(headers, body).map_err(Refusal::Key)?;
        Ok((key, fingerprint_body(body)))
    }
}

/// Why the pure half refused a delivery.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    Signature(Rejection),
    Key(KeyError),
}

/// The preset names SPEC.md lists, whether implemented here or not.
pub const PROVIDERS: &[&str] = &[
    "standard",
    "github",
    "stripe",
    "shopify",
    "slack",
    "alipay",
    "wechatpay",
    "twilio",
    "custom",
];

/// Expands a route's preset into a `Route`. Errors name the field within the route.
pub fn build_route(cfg: &RouteConfig, config: &Config) -> Result<Route, FieldError> {
    let _ = config;
    let default_tolerance = Duration::from_secs(300);
    let (verifier, default_key, tolerance): (Box<dyn Verifier>, &str, Option<Duration>) =
        match cfg.provider.as_str() {
            "standard" => {
                let tolerance = cfg.tolerance.unwrap_or(default_tolerance);
                let v = standard::StandardWebhooks::new(&cfg.secrets, tolerance)?;
                (Box::new(v), "header:webhook-id", Some(tolerance))
            }
            other if PROVIDERS.contains(&other) => {
                return Err(FieldError::new(
                    "provider",
                    format!("the `{other}` preset is not available in this build yet"),
                ));
            }
            other => {
                return Err(FieldError::new(
                    "provider",
                    format!("`{other}` is not one of: {}", PROVIDERS.join(", ")),
                ));
            }
        };
    for (field, set) in [
        ("signature_header", cfg.custom.signature_header.is_some()),
        ("hash", cfg.custom.hash.is_some()),
        ("encoding", cfg.custom.encoding.is_some()),
        ("prefix", cfg.custom.prefix.is_some()),
        ("timestamp_header", cfg.custom.timestamp_header.is_some()),
        ("signed", cfg.custom.signed.is_some()),
        ("public_url", cfg.custom.public_url.is_some()),
    ] {
        if set {
            return Err(FieldError::new(
                field,
                format!("is not used by the `{}` provider", cfg.provider),
            ));
        }
    }
    let key_text = cfg.key.as_deref().unwrap_or(default_key);
    let key = KeySource::parse(key_text).map_err(|m| FieldError::new("key", m))?;
    Ok(Route {
        name: Arc::from(cfg.name.as_str()),
        path: cfg.path.clone(),
        upstream_path: cfg.upstream_path.clone(),
        verifier,
        key,
        tolerance,
        key_header_prefix: format!("{}:", cfg.name),
    })
}
