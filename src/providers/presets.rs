//! The preset table: what each `provider = "..."` expands to (its signature scheme,
//! default key, signed headers, fingerprint and completion rule). Adding a provider is
//! one name in `PROVIDERS` and one row in `preset`.

use std::time::Duration;

use super::common::HashAlg;
use super::handshake::Kind;
use super::hmac_scheme::{Encoding, HmacRow, HmacScheme};
use super::{
    FieldError, FingerprintRule, SuccessRule, Verifier, adyen, alipay, discord, gitlab,
    hmac_scheme, hubspot, mailgun, paddle, sendgrid, standard, stripe, twilio, wechatpay,
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
    "razorpay",
    "bitbucket",
    "intercom",
    "square",
    "linear",
    "gitlab",
    "paddle",
    "hubspot",
    "mailgun",
    "sendgrid",
    "adyen",
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
    /// Claim the content even though the key is signed (a batch body, whose first id
    /// does not name the whole batch).
    pub(super) claim_content: bool,
    /// Claim this signed value instead of the key, when the key is unsigned but a
    /// signed one-time value is not (Mailgun's token).
    pub(super) claim_source: Option<&'static str>,
    /// Key headers the provider also sends under another spelling (name, other).
    pub(super) key_aliases: &'static [(&'static str, &'static str)],
}

/// Razorpay: `X-Razorpay-Signature: <hex HMAC-SHA256(webhook secret, body)>`.
const RAZORPAY: HmacRow = HmacRow {
    name: "razorpay",
    header: "x-razorpay-signature",
    alg: HashAlg::Sha256,
    encoding: Encoding::Hex,
    prefix: None,
    signs_url: false,
    body_clock: None,
};

/// Bitbucket Cloud: `X-Hub-Signature: sha256=<hex HMAC-SHA256(secret, body)>`.
const BITBUCKET: HmacRow = HmacRow {
    name: "bitbucket",
    header: "x-hub-signature",
    alg: HashAlg::Sha256,
    encoding: Encoding::Hex,
    prefix: Some("sha256="),
    signs_url: false,
    body_clock: None,
};

/// Intercom: `X-Hub-Signature: sha1=<hex HMAC-SHA1(client secret, body)>`.
const INTERCOM: HmacRow = HmacRow {
    name: "intercom",
    header: "x-hub-signature",
    alg: HashAlg::Sha1,
    encoding: Encoding::Hex,
    prefix: Some("sha1="),
    signs_url: false,
    body_clock: None,
};

/// Square: `X-Square-HmacSha256-Signature: <base64 HMAC-SHA256(signature key,
/// notification URL + body)>`.
const SQUARE: HmacRow = HmacRow {
    name: "square",
    header: "x-square-hmacsha256-signature",
    alg: HashAlg::Sha256,
    encoding: Encoding::Base64,
    prefix: None,
    signs_url: true,
    body_clock: None,
};

/// Linear: `Linear-Signature: <hex HMAC-SHA256(secret, body)>`; the window is checked
/// on the body's signed `webhookTimestamp` (milliseconds), never on the unsigned
/// `Linear-Timestamp` header.
const LINEAR: HmacRow = HmacRow {
    name: "linear",
    header: "linear-signature",
    alg: HashAlg::Sha256,
    encoding: Encoding::Hex,
    prefix: None,
    signs_url: false,
    body_clock: Some("/webhookTimestamp"),
};

/// The signed fields that name an Adyen notification item (of the first item: Adyen
/// sends one per request unless batching was asked for).
const ADYEN_KEY: &str = "json:/notificationItems/0/NotificationRequestItem/pspReference\
+json:/notificationItems/0/NotificationRequestItem/eventCode\
+json:/notificationItems/0/NotificationRequestItem/success";

/// Intercom rewrites these members of a notification when it re-sends it.
const INTERCOM_RETRY_FIELDS: &[&str] = &[
    "delivery_attempts",
    "delivery_status",
    "delivered_at",
    "first_sent_at",
];

impl Preset {
    /// A preset with the common rest: no signed headers, the body fingerprinted and
    /// claimed under the key, any 2xx completes. Rows override what differs.
    fn new(
        verifier: Box<dyn Verifier>,
        default_key: Option<&'static str>,
        tolerance: Option<Duration>,
    ) -> Preset {
        Preset {
            verifier,
            default_key,
            tolerance,
            signed_headers: &[],
            fingerprint: FingerprintRule::Body,
            content_scope: &[],
            success: SuccessRule::Any2xx,
            claim_content: false,
            claim_source: None,
            key_aliases: &[],
        }
    }
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
        "twilio" | "square" | "hubspot" => &["public_url"],
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

/// A preset's window when the route sets no `tolerance`: the official library's where
/// it has one (Linear's SDK: 60 s). Zoom retries 5, 25 and 85 minutes after the first
/// attempt and may resend the first attempt's signed timestamp: 90 minutes lets its
/// last retry through.
pub(super) fn default_tolerance(provider: &str) -> Duration {
    match provider {
        "linear" => Duration::from_secs(60),
        "paddle" => Duration::from_secs(5),
        "mailgun" => Duration::from_secs(900),
        // SendGrid retries a batch for 24 hours; its library checks no window.
        "sendgrid" => Duration::from_secs(86_400),
        "zoom" => Duration::from_secs(90 * 60),
        _ => DEFAULT_TOLERANCE,
    }
}

pub(super) fn signs_timestamp(cfg: &RouteConfig) -> bool {
    let c = &cfg.custom;
    match cfg.provider.as_str() {
        "standard" | "stripe" | "slack" | "wechatpay" | "linear" | "paddle" | "hubspot"
        | "mailgun" | "sendgrid" | "zoom" | "discord" => true,
        "gitlab" => cfg.secrets.iter().any(|s| s.value.starts_with(b"whsec_")),
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
            signed_headers: &[
                "webhook-id",
                "webhook-timestamp",
                "svix-id",
                "svix-timestamp",
            ],
            key_aliases: &[("webhook-id", "svix-id")],
            ..Preset::new(
                Box::new(standard::StandardWebhooks::new(s, tol)?),
                Some("header:webhook-id"),
                tolerance,
            )
        },
        "github" => Preset::new(
            Box::new(hmac_scheme::HmacScheme::github(s)?),
            Some("header:X-GitHub-Delivery"),
            tolerance,
        ),
        "stripe" => Preset::new(
            Box::new(stripe::Stripe::new(s, tol)?),
            Some("json:/id"),
            tolerance,
        ),
        "shopify" => Preset {
            content_scope: &["x-shopify-topic", "x-shopify-shop-domain"],
            ..Preset::new(
                Box::new(hmac_scheme::HmacScheme::shopify(s)?),
                Some(
                    "header:X-Shopify-Event-Id+header:X-Shopify-Topic+header:X-Shopify-Shop-Domain",
                ),
                tolerance,
            )
        },
        "slack" => Preset {
            signed_headers: &["x-slack-request-timestamp"],
            ..Preset::new(
                Box::new(hmac_scheme::HmacScheme::slack(s, tol)?),
                Some("json:/event_id"),
                tolerance,
            )
        },
        "alipay" => Preset {
            fingerprint: FingerprintRule::AlipayFields,
            success: SuccessRule::AlipaySuccessBody,
            ..Preset::new(
                Box::new(alipay::Alipay::new(s)?),
                Some("form:notify_id"),
                tolerance,
            )
        },
        "wechatpay" => Preset {
            signed_headers: &["wechatpay-timestamp", "wechatpay-nonce", "wechatpay-serial"],
            fingerprint: FingerprintRule::JsonFields(wechatpay::FINGERPRINT_FIELDS),
            ..Preset::new(
                Box::new(wechatpay::WechatPay::new(s, tol)?),
                Some("json:/id"),
                tolerance,
            )
        },
        "twilio" => Preset::new(
            Box::new(twilio::Twilio::new(s, c.public_url.as_deref())?),
            Some("header:I-Twilio-Idempotency-Token"),
            tolerance,
        ),
        "custom" => Preset::new(
            Box::new(hmac_scheme::HmacScheme::custom(s, c, tol)?),
            None,
            tolerance,
        ),
        "razorpay" => Preset::new(
            Box::new(HmacScheme::from_row(&RAZORPAY, s, None, tol)?),
            Some("header:x-razorpay-event-id"),
            tolerance,
        ),
        "bitbucket" => Preset {
            content_scope: &["x-event-key"],
            ..Preset::new(
                Box::new(HmacScheme::from_row(&BITBUCKET, s, None, tol)?),
                Some("header:X-Request-UUID"),
                tolerance,
            )
        },
        "intercom" => Preset {
            fingerprint: FingerprintRule::JsonWithout(INTERCOM_RETRY_FIELDS),
            ..Preset::new(
                Box::new(HmacScheme::from_row(&INTERCOM, s, None, tol)?),
                Some("json:/id"),
                tolerance,
            )
        },
        "square" => Preset::new(
            Box::new(HmacScheme::from_row(
                &SQUARE,
                s,
                c.public_url.as_deref(),
                tol,
            )?),
            Some("json:/event_id"),
            tolerance,
        ),
        "linear" => Preset {
            fingerprint: FingerprintRule::JsonWithout(&["webhookTimestamp"]),
            ..Preset::new(
                Box::new(HmacScheme::from_row(&LINEAR, s, None, tol)?),
                Some("header:Linear-Delivery"),
                tolerance,
            )
        },
        "gitlab" => {
            let (signing, tokens): (Vec<_>, Vec<_>) = s
                .iter()
                .cloned()
                .partition(|s| s.value.starts_with(b"whsec_"));
            // each signing token alone first, so an error names its own index
            for (j, one) in s.iter().enumerate() {
                if one.value.starts_with(b"whsec_") {
                    standard::StandardWebhooks::new(std::slice::from_ref(one), tol)
                        .map_err(|e| FieldError::new(format!("secrets[{j}]"), e.message))?;
                }
            }
            let signed: Option<Box<dyn Verifier>> = if signing.is_empty() {
                None
            } else {
                Some(Box::new(standard::StandardWebhooks::new(&signing, tol)?))
            };
            let tokens = tokens.into_iter().map(|s| s.value).collect();
            Preset::new(
                Box::new(gitlab::Gitlab::new(tokens, signed)),
                Some("header:Idempotency-Key"),
                tolerance,
            )
        }
        "paddle" => Preset::new(
            Box::new(paddle::Paddle::new(s, tol)),
            Some("json:/event_id"),
            tolerance,
        ),
        "hubspot" => Preset {
            fingerprint: FingerprintRule::JsonWithout(&["attemptNumber"]),
            claim_content: true,
            ..Preset::new(
                Box::new(hubspot::Hubspot::new(s, c.public_url.as_deref(), tol)?),
                Some("json:/0/eventId"),
                tolerance,
            )
        },
        "mailgun" => Preset {
            claim_source: Some("json:/signature/token"),
            ..Preset::new(
                Box::new(mailgun::Mailgun::new(s, tol)),
                Some("json:/event-data/id"),
                tolerance,
            )
        },
        "sendgrid" => Preset {
            claim_content: true,
            ..Preset::new(
                Box::new(sendgrid::Sendgrid::new(s, tol)?),
                Some("json:/0/sg_event_id"),
                tolerance,
            )
        },
        "adyen" => Preset {
            fingerprint: FingerprintRule::JsonFields(&["/notificationItems"]),
            ..Preset::new(Box::new(adyen::Adyen::new(s)?), Some(ADYEN_KEY), tolerance)
        },
        "meta" => Preset::new(
            Box::new(hmac_scheme::HmacScheme::github(s)?),
            Some("content"),
            tolerance,
        ),
        "discord" => Preset {
            signed_headers: &["x-signature-timestamp"],
            ..Preset::new(
                Box::new(discord::Discord::new(s, tol)?),
                Some("json:/id"),
                tolerance,
            )
        },
        "zoom" => Preset {
            signed_headers: &["x-zm-request-timestamp"],
            ..Preset::new(
                Box::new(hmac_scheme::HmacScheme::zoom(s, tol)?),
                Some("content"),
                tolerance,
            )
        },
        "twitter" => Preset::new(
            Box::new(hmac_scheme::HmacScheme::twitter(s)?),
            Some("content"),
            tolerance,
        ),
        other => unreachable!("`{other}` was checked against PROVIDERS above"),
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::{ClaimKey, build_route, routes};

    fn built(lines: &str) -> Result<super::super::Route, String> {
        let text = format!("[[route]]\nname = \"r\"\npath = \"/r\"\n{lines}\n");
        let (c, _) = routes::from_toml_with_env(&text, |_| None).map_err(|e| e.field)?;
        build_route(&c.routes[0], &c).map_err(|e| e.field)
    }

    #[test]
    fn url_signing_presets_require_public_url() {
        for p in ["square", "hubspot"] {
            let e = built(&format!("provider = \"{p}\"\nsecrets = [\"s\"]")).err();
            assert_eq!(e.as_deref(), Some("route[0].public_url"), "{p}");
            let e = built(&format!(
                "provider = \"{p}\"\nsecrets = [\"s\"]\npublic_url = \"/relative\""
            ))
            .err();
            assert_eq!(e.as_deref(), Some("route[0].public_url"), "{p}");
            built(&format!(
                "provider = \"{p}\"\nsecrets = [\"s\"]\npublic_url = \"https://x/y\""
            ))
            .unwrap();
        }
        let e = built("provider = \"razorpay\"\nsecrets = [\"s\"]\npublic_url = \"https://x/\"");
        assert_eq!(e.err().as_deref(), Some("route[0].public_url"));
    }

    #[test]
    fn windows_only_where_signed_with_the_libraries_defaults() {
        for p in [
            "razorpay",
            "bitbucket",
            "intercom",
            "square",
            "adyen",
            "gitlab",
        ] {
            let extra = if p == "square" {
                "\npublic_url = \"https://x/y\""
            } else {
                ""
            };
            let e = built(&format!(
                "provider = \"{p}\"\nsecrets = [\"00aa\"]\ntolerance = \"1m\"{extra}"
            ));
            assert_eq!(e.err().as_deref(), Some("route[0].tolerance"), "{p}");
        }
        for (p, secs) in [
            ("linear", 60),
            ("paddle", 5),
            ("mailgun", 900),
            ("sendgrid", 86_400),
        ] {
            let secret = if p == "sendgrid" {
                "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEbjkG//TtOnU6ERf0XFaIGuuEwW66pdr8hm+DlVPKV8cDNjALJQ8swYrD18qnoOs6GV8s7PunRFYlxijCcXbwZg=="
            } else {
                "s"
            };
            let r = built(&format!("provider = \"{p}\"\nsecrets = [\"{secret}\"]")).unwrap();
            assert_eq!(r.tolerance(), Some(Duration::from_secs(secs)), "{p}");
        }
        // GitLab signs a timestamp only with a signing token
        let r = built("provider = \"gitlab\"\nsecrets = [\"tok\", \"whsec_dGVzdA==\"]").unwrap();
        assert_eq!(r.tolerance(), Some(Duration::from_secs(300)));
        let e = built("provider = \"gitlab\"\nsecrets = [\"tok\", \"whsec_!!\"]").err();
        assert_eq!(e.as_deref(), Some("route[0].secrets[1]"));
    }

    #[test]
    fn claims_follow_what_each_provider_signs() {
        let claim = |lines: &str| built(lines).unwrap().claim_key;
        for p in ["razorpay", "bitbucket", "linear", "gitlab"] {
            assert_eq!(
                claim(&format!("provider = \"{p}\"\nsecrets = [\"s\"]")),
                ClaimKey::Content,
                "{p}"
            );
        }
        for p in ["intercom", "paddle"] {
            assert_eq!(
                claim(&format!("provider = \"{p}\"\nsecrets = [\"s\"]")),
                ClaimKey::Delivery,
                "{p}"
            );
        }
        assert_eq!(
            claim("provider = \"mailgun\"\nsecrets = [\"s\"]"),
            ClaimKey::Source
        );
        assert_eq!(
            claim("provider = \"hubspot\"\nsecrets = [\"s\"]\npublic_url = \"https://x/\""),
            ClaimKey::Content
        );
        assert_eq!(
            claim("provider = \"adyen\"\nsecrets = [\"0A0B\"]"),
            ClaimKey::Delivery
        );
        let e = built("provider = \"adyen\"\nsecrets = [\"not hex\"]").err();
        assert_eq!(e.as_deref(), Some("route[0].secrets[0]"));
        let e = built("provider = \"sendgrid\"\nsecrets = [\"bm90IGEga2V5\"]").err();
        assert_eq!(e.as_deref(), Some("route[0].secrets[0]"));
    }
}
