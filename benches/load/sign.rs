//! Standard Webhooks signing for the load tools (`loadgen`, `throttle_probe`): the
//! `webhook-signature` of a delivery, `v1,<base64 HMAC-SHA256 of "id.ts.body">`.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use hmac::{KeyInit, Mac};

/// The secret's key bytes (`whsec_<base64>`).
pub fn key(secret: &str) -> Vec<u8> {
    B64.decode(secret.trim_start_matches("whsec_"))
        .expect("whsec_ secret")
}

/// The `webhook-signature` header value.
pub fn signature(key: &[u8], id: &str, ts: u64, body: &[u8]) -> String {
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(key).unwrap();
    mac.update(format!("{id}.{ts}.").as_bytes());
    mac.update(body);
    format!("v1,{}", B64.encode(mac.finalize().into_bytes()))
}
