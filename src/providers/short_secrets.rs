//! The warning for a short HMAC secret: one captured delivery is enough to guess a
//! short key offline, after which anyone can sign deliveries. A warning and never an
//! error: some providers let their users choose the secret, and refusing to start
//! would break those routes.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;

use crate::config::{Config, RouteConfig};

/// HMAC keys shorter than this many bytes are warned of.
pub const MIN_HMAC_SECRET_BYTES: usize = 16;

/// One route's HMAC secret shorter than `MIN_HMAC_SECRET_BYTES`; it names the route
/// and the secret's index, never the value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShortSecret {
    pub route: String,
    pub index: usize,
    pub bytes: usize,
}

impl std::fmt::Display for ShortSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "route `{}`: secrets[{}] is an HMAC key of {} bytes, shorter than {}: \
             one captured delivery is enough to guess it offline and sign anything; \
             use a longer random secret",
            self.route, self.index, self.bytes, MIN_HMAC_SECRET_BYTES
        )
    }
}

/// Every HMAC secret of `config`'s routes shorter than `MIN_HMAC_SECRET_BYTES`, in
/// route order.
pub fn short_hmac_secrets(config: &Config) -> Vec<ShortSecret> {
    config
        .routes
        .iter()
        .flat_map(|r| {
            r.secrets.iter().enumerate().filter_map(|(index, s)| {
                let bytes = hmac_key_len(r, &s.value)?;
                (bytes < MIN_HMAC_SECRET_BYTES).then(|| ShortSecret {
                    route: r.name.clone(),
                    index,
                    bytes,
                })
            })
        })
        .collect()
}

/// The length of the HMAC key `value` is on `route`, or None when it is no HMAC key
/// (a public key or certificate, GitLab's plain token).
fn hmac_key_len(route: &RouteConfig, value: &[u8]) -> Option<usize> {
    let text = std::str::from_utf8(value).ok();
    match route.provider.as_str() {
        "alipay" | "wechatpay" | "discord" | "sendgrid" => None,
        // Standard Webhooks keys are base64 after `whsec_`; `whpk_` is a public key.
        "standard" => {
            let text = text?;
            if text.starts_with("whpk_") {
                return None;
            }
            decoded_len(text.strip_prefix("whsec_").unwrap_or(text))
        }
        // A plain token compared as it is; a `whsec_` one is a signing key.
        "gitlab" => decoded_len(text?.strip_prefix("whsec_")?),
        // Adyen's key is written in hex.
        "adyen" => Some(value.len() / 2),
        _ => Some(value.len()),
    }
}

fn decoded_len(b64: &str) -> Option<usize> {
    B64.decode(b64).ok().map(|k| k.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn short(routes: &str) -> Vec<ShortSecret> {
        let (config, _) = crate::providers::from_toml_with_env(routes, |_| None).unwrap();
        short_hmac_secrets(&config)
    }

    #[test]
    fn short_hmac_keys_are_named_by_route_and_index() {
        let got = short(
            "[[route]]\nname = \"a\"\npath = \"/a\"\nprovider = \"github\"\n\
             secrets = [\"0123456789abcdef\", \"tok\"]\n\n\
             [[route]]\nname = \"b\"\npath = \"/b\"\nprovider = \"standard\"\n\
             secrets = [\"whsec_c2hvcnRrZXk=\", \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"]\n",
        );
        assert_eq!(
            got,
            vec![
                ShortSecret {
                    route: "a".into(),
                    index: 1,
                    bytes: 3
                },
                ShortSecret {
                    route: "b".into(),
                    index: 0,
                    bytes: 8
                },
            ]
        );
        let line = got[0].to_string();
        assert!(
            line.contains("route `a`") && line.contains("secrets[1]"),
            "{line}"
        );
        assert!(!line.contains("tok"), "{line}");
    }

    #[test]
    fn long_keys_and_keys_that_are_not_hmac_pass_quietly() {
        assert!(
            short(
                "[[route]]\nname = \"g\"\npath = \"/g\"\nprovider = \"gitlab\"\nsecrets = [\"tok\"]\n\n\
                 [[route]]\nname = \"s\"\npath = \"/s\"\nprovider = \"stripe\"\n\
                 secrets = [\"whsec_0123456789abcdef\"]\n"
            )
            .is_empty()
        );
    }
}
