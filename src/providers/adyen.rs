//! Adyen standard webhooks: every `NotificationRequestItem` of `notificationItems`
//! carries `additionalData.hmacSignature` = base64 HMAC-SHA256(hex-decoded HMAC key,
//! the item's pspReference, originalReference, merchantAccountCode, merchantReference,
//! amount.value, amount.currency, eventCode and success joined by `:`). Every item of
//! a batch must match; the rest of an item (additionalData, eventDate, reason, ...) is
//! not signed, which is why the preset fingerprints whole items.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use http::HeaderMap;
use serde_json::Value;
use subtle::ConstantTimeEq;

use super::common::HashAlg;
use super::{FieldError, SignatureError, Verifier};
use crate::config::Secret;

/// At most this many items are checked; a larger batch is refused.
const MAX_ITEMS: usize = 100;

/// The signed fields, in order (pointers into one item).
const SIGNED: [&str; 8] = [
    "/pspReference",
    "/originalReference",
    "/merchantAccountCode",
    "/merchantReference",
    "/amount/value",
    "/amount/currency",
    "/eventCode",
    "/success",
];

/// Adyen's verifier: the decoded HMAC keys.
pub struct Adyen {
    keys: Vec<Vec<u8>>,
}

impl Adyen {
    /// Built once per route from its secrets.
    pub fn new(secrets: &[Secret]) -> Result<Self, FieldError> {
        let mut keys = Vec::new();
        for (j, s) in secrets.iter().enumerate() {
            let key = std::str::from_utf8(&s.value)
                .ok()
                .and_then(|t| hex::decode(t.trim()).ok())
                .filter(|k| !k.is_empty())
                .ok_or_else(|| {
                    FieldError::new(
                        format!("secrets[{j}]"),
                        "is not Adyen's HMAC key (hex, as the Customer Area shows it)",
                    )
                })?;
            keys.push(key);
        }
        Ok(Adyen { keys })
    }
}

/// The text one field contributes: strings as they are, numbers in decimal, absent or
/// null as empty.
fn field_text(item: &Value, pointer: &str) -> String {
    match item.pointer(pointer) {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    }
}

impl Adyen {
    fn check_item(&self, item: &Value) -> Result<(), SignatureError> {
        let sig = item
            .pointer("/additionalData/hmacSignature")
            .and_then(Value::as_str)
            .ok_or(SignatureError::Malformed(
                "a notification item has no additionalData.hmacSignature",
            ))?;
        let sig = B64
            .decode(sig.trim())
            .map_err(|_| SignatureError::Invalid("no signature matches"))?;
        let signed = SIGNED
            .iter()
            .map(|p| field_text(item, p))
            .collect::<Vec<_>>()
            .join(":");
        let ok = self.keys.iter().any(|k| {
            bool::from(
                HashAlg::Sha256
                    .hmac(k, &[signed.as_bytes()])
                    .as_slice()
                    .ct_eq(&sig),
            )
        });
        if ok {
            Ok(())
        } else {
            Err(SignatureError::Invalid("no signature matches"))
        }
    }
}

impl Verifier for Adyen {
    fn headers_read(&self) -> Vec<http::HeaderName> {
        Vec::new()
    }

    fn verify(&self, _: &HeaderMap, body: &[u8], _now: i64) -> Result<(), SignatureError> {
        const SHAPE: &str = "the body is not an Adyen notification (notificationItems)";
        let doc: Value =
            serde_json::from_slice(body).map_err(|_| SignatureError::Malformed(SHAPE))?;
        let items = doc
            .get("notificationItems")
            .and_then(Value::as_array)
            .filter(|a| !a.is_empty() && a.len() <= MAX_ITEMS)
            .ok_or(SignatureError::Malformed(SHAPE))?;
        for item in items {
            let item = item
                .get("NotificationRequestItem")
                .ok_or(SignatureError::Malformed(SHAPE))?;
            self.check_item(item)?;
        }
        Ok(())
    }
}
