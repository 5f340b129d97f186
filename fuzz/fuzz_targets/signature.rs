//! Standard Webhooks verification on arbitrary headers and bodies: never panics, and
//! a correctly signed delivery inside the window always verifies, whatever junk
//! entries follow its signature.
#![no_main]

use std::time::Duration;

use arbitrary::Arbitrary;
use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use hmac::{KeyInit, Mac};
use http::{HeaderMap, HeaderValue};
use idemgate::config::Secret;
use idemgate::providers::StandardWebhooks;
use idemgate::providers::Verifier;
use libfuzzer_sys::fuzz_target;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const TOLERANCE: i64 = 300;

#[derive(Arbitrary, Debug)]
struct Input {
    id: Vec<u8>,
    ts: Vec<u8>,
    signatures: Vec<u8>,
    body: Vec<u8>,
    now: i64,
    /// Also send the correct signature first.
    sign: bool,
    /// Send the timestamp as `now + skew` instead of `ts`.
    skew: Option<i16>,
}

fn verifier() -> StandardWebhooks {
    let s = Secret {
        source: SECRET.into(),
        value: SECRET.as_bytes().to_vec(),
        id: None,
    };
    StandardWebhooks::new(&[s], Duration::from_secs(TOLERANCE as u64)).expect("valid secret")
}

fn sign(id: &str, ts: &str, body: &[u8]) -> String {
    let key = B64.decode(&SECRET[6..]).unwrap();
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(&key).unwrap();
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(ts.as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("v1,{}", B64.encode(mac.finalize().into_bytes()))
}

fuzz_target!(|input: Input| {
    thread_local!(static V: StandardWebhooks = verifier());
    let ts_bytes = match input.skew {
        Some(s) => (input.now.saturating_add(i64::from(s)))
            .to_string()
            .into_bytes(),
        None => input.ts.clone(),
    };
    let (Ok(id), Ok(ts), Ok(sigs)) = (
        HeaderValue::from_bytes(&input.id),
        HeaderValue::from_bytes(&ts_bytes),
        HeaderValue::from_bytes(&input.signatures),
    ) else {
        return;
    };
    let mut h = HeaderMap::new();
    h.insert("webhook-id", id.clone());
    h.insert("webhook-timestamp", ts.clone());
    h.insert("webhook-signature", sigs.clone());
    let plain = V.with(|v| v.verify(&h, &input.body, input.now));

    // The oracle: the correct signature first passes inside the window.
    if input.sign
        && let (Ok(id_s), Ok(ts_s), Ok(rest)) = (id.to_str(), ts.to_str(), sigs.to_str())
    {
        let good = sign(id_s, ts_s, &input.body);
        let Ok(v) = HeaderValue::from_str(&format!("{good} {rest}")) else {
            return;
        };
        h.insert("webhook-signature", v);
        let r = V.with(|v| v.verify(&h, &input.body, input.now));
        let in_window = ts_s
            .trim()
            .parse::<i64>()
            .ok()
            .and_then(|t| input.now.checked_sub(t))
            .is_some_and(|d| d.unsigned_abs() <= TOLERANCE as u64);
        assert_eq!(r.is_ok(), in_window, "{r:?} for {input:?}");
    } else {
        let _ = plain;
    }
});
