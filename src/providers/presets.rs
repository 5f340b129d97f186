//! The preset table: what each `provider = "..."` expands to (its signature scheme,
//! default key, signed headers, fingerprint and completion rule). Adding a provider is
//! one name in `PROVIDERS` and one row in `preset`.

use std::time::Duration;

use super::handshake::Kind;
use super::{
    FieldError, FingerprintRule, SuccessRule, Verifier, alipay, discord, hmac_scheme, standard,
    stripe, twilio, wechatpay,
};
use crate::config::{KeylessPolicy, RouteConfig};

/// The preset names a route's `provider` may take (all implemented below).
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
    "meta",
    "discord",
    "zoom",
    "twitter",
];

/// What a preset expands to, before the route's overrides.
pub(super) struct Preset {
    pub(super) verifier: Box<dyn Verifier>,
    pub(super) default_key: Option<&'static str>,
    /// The timestamp window, for presets that sign a timestamp.
    pub(super) tolerance: Option<Duration>,
    /// Headers the scheme signs: a key read from any other header is unsigned.
    pub(super) signed_headers: &'static [&'static str],
    pub(super) fingerprint: FingerprintRule,
    /// Headers hashed with the body when the claim key is the content.
    pub(super) content_scope: &'static [&'static str],
    /// Which answers complete a delivery.
    pub(super) success: SuccessRule,
    /// Key headers the provider also sends under another spelling (name, other).
    pub(super) key_aliases: &'static [(&'static str, &'static str)],
}

/// The provider-specific fields (`CustomFields`) each preset reads; any other one set
/// on a route is an error naming it.
pub(super) fn fields_used(provider: &str) -> &'static [&'static str] {
    match provider {
        "custom" => &[
            "signature_header",
            "hash",
            "encoding",
            "prefix",
            "timestamp_header",
            "signed",
        ],
        "twilio" => &["public_url"],
        "meta" => &["verify_token"],
        _ => &[],
    }
}

/// Which URL checks a provider sends (see `handshake`).
pub(super) fn handshake_kind(provider: &str) -> Kind {
    match provider {
        "slack" => Kind::Slack,
        "zoom" => Kind::Zoom,
        "discord" => Kind::Discord,
        "meta" => Kind::Meta,
        "twitter" => Kind::Twitter,
        _ => Kind::None,
    }
}

/// A preset's `keyless` default: Slack's slash commands and interactivity posts are
/// signed, carry no id and are never retried, so they are forwarded; elsewhere a
/// missing key is a malformed delivery.
pub(super) fn default_keyless(provider: &str) -> KeylessPolicy {
    match provider {
        "slack" => KeylessPolicy::Forward,
        _ => KeylessPolicy::Reject,
    }
}

pub(super) const DEFAULT_TOLERANCE: Duration = Duration::from_secs(300);

/// A preset's default window. Zoom retries 5, 25 and 85 minutes after the first
/// attempt and may resend the first attempt's signed timestamp: 90 minutes lets its
/// last retry through.
pub(super) fn default_tolerance(provider: &str) -> Duration {
    match provider {
        "zoom" => Duration::from_secs(90 * 60),
        _ => DEFAULT_TOLERANCE,
    }
}

pub(super) fn signs_timestamp(cfg: &RouteConfig) -> bool {
    let c = &cfg.custom;
    match cfg.provider.as_str() {
        "standard" | "stripe" | "slack" | "wechatpay" | "zoom" | "discord" => true,
        "custom" => c.timestamp_header.is_some(),
        _ => false,
    }
}

/// The preset a route names, with its secrets; `tol` is the route's timestamp window
/// (`tolerance`), for presets that sign a timestamp.
pub(super) fn preset(
    cfg: &RouteConfig,
    tol: Duration,
    tolerance: Option<Duration>,
) -> Result<Preset, FieldError> {
    let s = &cfg.secrets;
    let c = &cfg.custom;
    Ok(match cfg.provider.as_str() {
        "standard" => Preset {
            verifier: Box::new(standard::StandardWebhooks::new(s, tol)?),
            default_key: Some("header:webhook-id"),
            tolerance,
            signed_headers: &[
                "webhook-id",
                "webhook-timestamp",
                "svix-id",
                "svix-timestamp",
            ],
            fingerprint: FingerprintRule::Body,
            content_scope: &[],
            success: SuccessRule::Any2xx,
            key_aliases: &[("webhook-id", "svix-id")],
        },
        "github" => Preset {
            verifier: Box::new(hmac_scheme::HmacScheme::github(s)?),
            default_key: Some("header:X-GitHub-Delivery"),
            tolerance,
            signed_headers: &[],
            fingerprint: FingerprintRule::Body,
            content_scope: &[],
            success: SuccessRule::Any2xx,
            key_aliases: &[],
        },
        "stripe" => Preset {
            verifier: Box::new(stripe::Stripe::new(s, tol)?),
            default_key: Some("json:/id"),
            tolerance,
            signed_headers: &[],
            fingerprint: FingerprintRule::Body,
            content_scope: &[],
            success: SuccessRule::Any2xx,
            key_aliases: &[],
        },
        "shopify" => Preset {
            verifier: Box::new(hmac_scheme::HmacScheme::shopify(s)?),
            default_key: Some(
                "header:X-Shopify-Event-Id+header:X-Shopify-Topic+header:X-Shopify-Shop-Domain",
            ),
            tolerance,
            signed_headers: &[],
            fingerprint: FingerprintRule::Body,
            content_scope: &["x-shopify-topic", "x-shopify-shop-domain"],
            success: SuccessRule::Any2xx,
            key_aliases: &[],
        },
        "slack" => Preset {
            verifier: Box::new(hmac_scheme::HmacScheme::slack(s, tol)?),
            default_key: Some("json:/event_id"),
            tolerance,
            signed_headers: &["x-slack-request-timestamp"],
            fingerprint: FingerprintRule::Body,
            content_scope: &[],
            success: SuccessRule::Any2xx,
            key_aliases: &[],
        },
        "alipay" => Preset {
            verifier: Box::new(alipay::Alipay::new(s)?),
            default_key: Some("form:notify_id"),
            tolerance,
            signed_headers: &[],
            fingerprint: FingerprintRule::AlipayFields,
            content_scope: &[],
            success: SuccessRule::AlipaySuccessBody,
            key_aliases: &[],
        },
        "wechatpay" => Preset {
            verifier: Box::new(wechatpay::WechatPay::new(s, tol)?),
            default_key: Some("json:/id"),
            tolerance,
            signed_headers: &["wechatpay-timestamp", "wechatpay-nonce", "wechatpay-serial"],
            fingerprint: FingerprintRule::JsonFields(wechatpay::FINGERPRINT_FIELDS),
            content_scope: &[],
            success: SuccessRule::Any2xx,
            key_aliases: &[],
        },
        "twilio" => Preset {
            verifier: Box::new(twilio::Twilio::new(s, c.public_url.as_deref())?),
            default_key: Some("header:I-Twilio-Idempotency-Token"),
            tolerance,
            signed_headers: &[],
            fingerprint: FingerprintRule::Body,
            content_scope: &[],
            success: SuccessRule::Any2xx,
            key_aliases: &[],
        },
        "custom" => {
            let v = hmac_scheme::HmacScheme::custom(s, c, tol)?;
            let signed_headers: &'static [&'static str] = &[];
            Preset {
                verifier: Box::new(v),
                default_key: None,
                tolerance,
                signed_headers,
                fingerprint: FingerprintRule::Body,
                content_scope: &[],
                success: SuccessRule::Any2xx,
                key_aliases: &[],
            }
        }
        "meta" => Preset {
            verifier: Box::new(hmac_scheme::HmacScheme::github(s)?),
            default_key: Some("content"),
            tolerance,
            signed_headers: &[],
            fingerprint: FingerprintRule::Body,
            content_scope: &[],
            success: SuccessRule::Any2xx,
            key_aliases: &[],
        },
        "discord" => Preset {
            verifier: Box::new(discord::Discord::new(s, tol)?),
            default_key: Some("json:/id"),
            tolerance,
            signed_headers: &["x-signature-timestamp"],
            fingerprint: FingerprintRule::Body,
            content_scope: &[],
            success: SuccessRule::Any2xx,
            key_aliases: &[],
        },
        "zoom" => Preset {
            verifier: Box::new(hmac_scheme::HmacScheme::zoom(s, tol)?),
            default_key: Some("content"),
            tolerance,
            signed_headers: &["x-zm-request-timestamp"],
            fingerprint: FingerprintRule::Body,
            content_scope: &[],
            success: SuccessRule::Any2xx,
            key_aliases: &[],
        },
        "twitter" => Preset {
            verifier: Box::new(hmac_scheme::HmacScheme::twitter(s)?),
            default_key: Some("content"),
            tolerance,
            signed_headers: &[],
            fingerprint: FingerprintRule::Body,
            content_scope: &[],
            success: SuccessRule::Any2xx,
            key_aliases: &[],
        },
        other => unreachable!("`{other}` was checked against PROVIDERS above"),
    })
}
