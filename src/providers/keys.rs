//! Key sources: where a delivery's stable idempotency key is read from
//! (`header:NAME`, `json:/pointer`, `form:FIELD`, or several of them joined with `+`),
//! and the checks a key passes before it may become part of a Redis key name.
//!
//! A composite source (`header:A+header:B`) joins its parts' values with `:`, each part
//! with `%` and `:` percent-escaped first, so two different tuples never make one key.
//! The source text is split at every `+` that starts another `header:`, `json:` or
//! `form:` part, so a `+` inside a name or pointer is kept.

use http::{HeaderMap, HeaderName};

/// Longest key accepted, in bytes.
pub const MAX_KEY_LEN: usize = 256;

/// Where a route reads its idempotency key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    Header(HeaderName),
    /// A header under either of two spellings (`webhook-id` or Svix's `svix-id`):
    /// both present with different values is refused.
    Aliased(HeaderName, HeaderName),
    /// A JSON Pointer (RFC 6901) into the body.
    Json(String),
    /// A field of an `application/x-www-form-urlencoded` body.
    Form(String),
    /// `content`: `sha256:<hex of the body>`, for providers whose deliveries carry no
    /// id and whose retries resend the same body.
    Content,
    /// Several sources, all required, joined (see the module doc).
    Composite(Vec<KeySource>),
}

/// Why no usable key came out of a delivery (all answered 400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("the delivery holds no idempotency key ({0})")]
    Missing(String),
    #[error("the idempotency key is unusable: {0}")]
    Invalid(&'static str),
    /// A JSON key source on a body that is not JSON (Slack's form-encoded posts).
    #[error("the idempotency key is unusable: the body is not valid JSON")]
    NotJson,
}

impl KeyError {
    /// Whether the request simply holds no key (as opposed to a malformed one): such a
    /// signed request follows the route's `keyless` policy.
    pub fn is_keyless(&self) -> bool {
        matches!(self, KeyError::Missing(_) | KeyError::NotJson)
    }
}

impl KeySource {
    /// The same source with each header named in `aliases` (name, other spelling) read
    /// under either spelling.
    pub fn with_aliases(self, aliases: &[(&str, &'static str)]) -> KeySource {
        match self {
            KeySource::Header(h) => match aliases.iter().find(|(a, _)| *a == h.as_str()) {
                Some((_, b)) => KeySource::Aliased(h, HeaderName::from_static(b)),
                None => KeySource::Header(h),
            },
            KeySource::Composite(parts) => {
                KeySource::Composite(parts.into_iter().map(|p| p.with_aliases(aliases)).collect())
            }
            other => other,
        }
    }

    pub fn parse(text: &str) -> Result<KeySource, String> {
        let parts = split_composite(text);
        if parts.len() == 1 {
            return Self::parse_one(text);
        }
        let parts = parts
            .into_iter()
            .map(Self::parse_one)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(KeySource::Composite(parts))
    }

    fn parse_one(text: &str) -> Result<KeySource, String> {
        if text == "content" {
            return Ok(KeySource::Content);
        }
        let (kind, arg) = text
            .split_once(':')
            .ok_or_else(|| format!("`{text}` is not header:NAME, json:/pointer or form:FIELD"))?;
        match kind {
            "header" => HeaderName::from_bytes(arg.trim().as_bytes())
                .map(KeySource::Header)
                .map_err(|_| format!("`{arg}` is not a header name")),
            "json" if arg.is_empty() || arg.starts_with('/') => {
                Ok(KeySource::Json(arg.to_string()))
            }
            "json" => Err(format!("`{arg}` is not a JSON pointer (it starts with /)")),
            "form" if !arg.is_empty() => Ok(KeySource::Form(arg.to_string())),
            _ => Err(format!(
                "`{text}` is not header:NAME, json:/pointer or form:FIELD"
            )),
        }
    }

    /// Describes the source for messages (`header webhook-id`, `json /id`).
    pub fn describe(&self) -> String {
        match self {
            KeySource::Header(h) => format!("header {h}"),
            KeySource::Aliased(a, b) => format!("header {a} or {b}"),
            KeySource::Content => "the body's SHA-256".to_string(),
            KeySource::Json(p) => format!("JSON {p}"),
            KeySource::Form(f) => format!("form field {f}"),
            KeySource::Composite(parts) => parts
                .iter()
                .map(KeySource::describe)
                .collect::<Vec<_>>()
                .join(" + "),
        }
    }

    /// The headers this source reads: a key read from a header the provider does not
    /// sign can be changed by whoever replays a captured request.
    pub fn headers(&self) -> Vec<&HeaderName> {
        match self {
            KeySource::Header(h) => vec![h],
            KeySource::Aliased(a, b) => vec![a, b],
            KeySource::Json(_) | KeySource::Form(_) | KeySource::Content => vec![],
            KeySource::Composite(parts) => parts.iter().flat_map(KeySource::headers).collect(),
        }
    }

    pub fn extract(&self, headers: &HeaderMap, body: &[u8]) -> Result<String, KeyError> {
        let key = self.extract_unchecked(headers, body)?;
        validate_key(&key)?;
        Ok(key)
    }

    fn extract_unchecked(&self, headers: &HeaderMap, body: &[u8]) -> Result<String, KeyError> {
        let missing = || KeyError::Missing(self.describe());
        let key = match self {
            KeySource::Composite(parts) => {
                let mut joined = String::new();
                for (i, part) in parts.iter().enumerate() {
                    let value = part.extract_unchecked(headers, body)?;
                    if value.is_empty() {
                        return Err(KeyError::Invalid("a part of the composite key is empty"));
                    }
                    if i > 0 {
                        joined.push(':');
                    }
                    joined.push_str(&value.replace('%', "%25").replace(':', "%3A"));
                }
                joined
            }
            KeySource::Content => {
                format!("sha256:{}", hex::encode(super::fingerprint_body(body)))
            }
            KeySource::Aliased(a, b) => {
                let one = KeySource::Header(a.clone()).extract_unchecked(headers, body);
                let other = KeySource::Header(b.clone()).extract_unchecked(headers, body);
                match (one, other) {
                    (Ok(x), Ok(y)) if x != y => {
                        return Err(KeyError::Invalid(
                            "the key is sent under both header spellings with different values",
                        ));
                    }
                    (Ok(x), Ok(_) | Err(KeyError::Missing(_)))
                    | (Err(KeyError::Missing(_)), Ok(x)) => x,
                    (Err(KeyError::Missing(_)), Err(KeyError::Missing(_))) => {
                        return Err(missing());
                    }
                    (Err(e), _) | (_, Err(e)) => return Err(e),
                }
            }
            KeySource::Header(name) => {
                let mut values = headers.get_all(name).iter();
                let first = values.next().ok_or_else(missing)?;
                if values.any(|v| v != first) {
                    return Err(KeyError::Invalid(
                        "the key header was sent twice with different values",
                    ));
                }
                first
                    .to_str()
                    .map_err(|_| KeyError::Invalid("the key is not printable ASCII"))?
                    .to_string()
            }
            KeySource::Json(pointer) => {
                let doc: serde_json::Value =
                    serde_json::from_slice(body).map_err(|_| KeyError::NotJson)?;
                match doc.pointer(pointer) {
                    None | Some(serde_json::Value::Null) => return Err(missing()),
                    Some(serde_json::Value::String(s)) => s.clone(),
                    Some(v @ (serde_json::Value::Number(_) | serde_json::Value::Bool(_))) => {
                        v.to_string()
                    }
                    Some(_) => return Err(KeyError::Invalid("the key is a JSON object or array")),
                }
            }
            KeySource::Form(field) => {
                let mut found: Option<String> = None;
                for (k, v) in form_urlencoded::parse(body) {
                    if k == field.as_str() {
                        // form_urlencoded decodes invalid UTF-8 lossily: distinct raw
                        // keys would collapse into one, so refuse them instead.
                        if v.contains('\u{FFFD}') {
                            return Err(KeyError::Invalid(
                                "the key field is not valid UTF-8 once decoded",
                            ));
                        }
                        if found.as_deref().is_some_and(|f| f != v) {
                            return Err(KeyError::Invalid(
                                "the key field appears twice with different values",
                            ));
                        }
                        found = Some(v.into_owned());
                    }
                }
                found.ok_or_else(missing)?
            }
        };
        Ok(key)
    }
}

/// Splits `header:A+header:B` at each `+` that starts a new part.
fn split_composite(text: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut start = 0;
    for (i, _) in text.match_indices('+') {
        let rest = &text[i + 1..];
        if i > start
            && ["header:", "json:", "form:"]
                .iter()
                .any(|k| rest.starts_with(k))
        {
            parts.push(&text[start..i]);
            start = i + 1;
        }
    }
    parts.push(&text[start..]);
    parts
}

/// A key becomes part of a Redis key name and of log lines: bound it and keep
/// control characters out.
pub fn validate_key(key: &str) -> Result<(), KeyError> {
    if key.is_empty() {
        return Err(KeyError::Invalid("the key is empty"));
    }
    if key.len() > MAX_KEY_LEN {
        return Err(KeyError::Invalid("the key is longer than 256 bytes"));
    }
    if key.chars().any(char::is_control) {
        return Err(KeyError::Invalid("the key holds control characters"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn h(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        m
    }

    #[test]
    fn parses_sources() {
        assert_eq!(
            KeySource::parse("header:X-Event-Id").unwrap(),
            KeySource::Header(HeaderName::from_static("x-event-id"))
        );
        assert_eq!(
            KeySource::parse("json:/data/id").unwrap(),
            KeySource::Json("/data/id".into())
        );
        assert_eq!(
            KeySource::parse("form:notify_id").unwrap(),
            KeySource::Form("notify_id".into())
        );
        assert_eq!(
            KeySource::parse("header:A+header:B+json:/a+b").unwrap(),
            KeySource::Composite(vec![
                KeySource::Header(HeaderName::from_static("a")),
                KeySource::Header(HeaderName::from_static("b")),
                KeySource::Json("/a+b".into()),
            ])
        );
        for bad in [
            "nope",
            "json:id",
            "header:bad header",
            "form:",
            "xml:/a",
            "header:a+json:id",
        ] {
            assert!(KeySource::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn header_keys() {
        let s = KeySource::parse("header:x-id").unwrap();
        assert_eq!(s.extract(&h(&[("x-id", "evt_1")]), b"").unwrap(), "evt_1");
        assert_eq!(
            s.extract(&h(&[("x-id", "a"), ("x-id", "a")]), b"").unwrap(),
            "a"
        );
        assert!(matches!(
            s.extract(&h(&[("x-id", "a"), ("x-id", "b")]), b""),
            Err(KeyError::Invalid(_))
        ));
        assert!(matches!(s.extract(&h(&[]), b""), Err(KeyError::Missing(_))));
        assert!(matches!(
            s.extract(&h(&[("x-id", "")]), b""),
            Err(KeyError::Invalid(_))
        ));
        let long = "k".repeat(257);
        assert!(matches!(
            s.extract(&h(&[("x-id", &long)]), b""),
            Err(KeyError::Invalid(_))
        ));
        assert_eq!(
            s.extract(&h(&[("x-id", &long[..256])]), b"").unwrap().len(),
            256
        );
        let mut m = HeaderMap::new();
        m.insert("x-id", HeaderValue::from_bytes(b"caf\xc3\xa9").unwrap());
        assert!(matches!(s.extract(&m, b""), Err(KeyError::Invalid(_))));
    }

    #[test]
    fn json_keys() {
        let s = KeySource::parse("json:/id").unwrap();
        let e = HeaderMap::new();
        assert_eq!(s.extract(&e, br#"{"id":"evt_1"}"#).unwrap(), "evt_1");
        assert_eq!(s.extract(&e, br#"{"id":42}"#).unwrap(), "42");
        assert!(matches!(
            s.extract(&e, br#"{"id":null}"#),
            Err(KeyError::Missing(_))
        ));
        assert!(matches!(
            s.extract(&e, br#"{"other":1}"#),
            Err(KeyError::Missing(_))
        ));
        assert!(matches!(
            s.extract(&e, br#"{"id":{"a":1}}"#),
            Err(KeyError::Invalid(_))
        ));
        assert!(matches!(
            s.extract(&e, br#"{"id":[1]}"#),
            Err(KeyError::Invalid(_))
        ));
        assert!(matches!(
            s.extract(&e, br#"{"id":"a\u0000b"}"#),
            Err(KeyError::Invalid(_))
        ));
        assert!(matches!(s.extract(&e, b"not json"), Err(KeyError::NotJson)));
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert!(matches!(
            s.extract(&e, deep.as_bytes()),
            Err(KeyError::NotJson)
        ));
    }

    #[test]
    fn composite_keys_join_escaped_parts() {
        let s = KeySource::parse("header:x-a+header:x-b+json:/id").unwrap();
        let m = h(&[("x-a", "e:1"), ("x-b", "100%")]);
        assert_eq!(s.extract(&m, br#"{"id":7}"#).unwrap(), "e%3A1:100%25:7");
        // a different split of the same characters is a different key
        let m2 = h(&[("x-a", "e"), ("x-b", "1:100%")]);
        assert_ne!(
            s.extract(&m2, br#"{"id":7}"#).unwrap(),
            s.extract(&m, br#"{"id":7}"#).unwrap()
        );
        // every part is required
        assert!(matches!(
            s.extract(&h(&[("x-a", "e")]), br#"{"id":7}"#),
            Err(KeyError::Missing(_))
        ));
        assert_eq!(s.headers().len(), 2);
        let long = "k".repeat(200);
        assert!(matches!(
            s.extract(&h(&[("x-a", &long), ("x-b", &long)]), br#"{"id":7}"#),
            Err(KeyError::Invalid(_))
        ));
    }

    #[test]
    fn form_keys() {
        let s = KeySource::parse("form:notify_id").unwrap();
        let e = HeaderMap::new();
        assert_eq!(s.extract(&e, b"a=1&notify_id=n%201&b=2").unwrap(), "n 1");
        assert!(matches!(s.extract(&e, b"a=1"), Err(KeyError::Missing(_))));
        assert!(matches!(
            s.extract(&e, b"notify_id=1&notify_id=2"),
            Err(KeyError::Invalid(_))
        ));
        for bad in [
            &b"notify_id=%FF%FE"[..],
            b"notify_id=a%C3",
            b"notify_id=%00",
        ] {
            assert!(
                matches!(s.extract(&e, bad), Err(KeyError::Invalid(_))),
                "{bad:?}"
            );
        }
    }
}
