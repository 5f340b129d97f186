//! Key extraction (`header:`, `json:/pointer`, `form:`) on arbitrary headers and
//! bodies: never panics, and every key it returns passed validation (1..=256 bytes,
//! no control characters) — so it is safe inside a Redis key name and a log line.
#![no_main]

use arbitrary::Arbitrary;
use http::{HeaderMap, HeaderName, HeaderValue};
use idemgate::providers::{KeySource, MAX_KEY_LEN, validate_key};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Input {
    source: u8,
    arg: String,
    headers: Vec<(Vec<u8>, Vec<u8>)>,
    body: Vec<u8>,
}

fuzz_target!(|input: Input| {
    let text = match input.source % 4 {
        0 => format!("header:{}", input.arg),
        1 => format!("json:{}", input.arg),
        2 => format!("form:{}", input.arg),
        _ => input.arg.clone(),
    };
    let Ok(source) = KeySource::parse(&text) else {
        return;
    };
    let mut h = HeaderMap::new();
    for (n, v) in input.headers.iter().take(16) {
        if let (Ok(n), Ok(v)) = (HeaderName::from_bytes(n), HeaderValue::from_bytes(v)) {
            h.append(n, v);
        }
    }
    // the configured header, so header sources get exercised
    if let KeySource::Header(name) = &source
        && let Some((_, v)) = input.headers.first()
        && let Ok(v) = HeaderValue::from_bytes(v)
    {
        h.append(name.clone(), v);
    }
    if let Ok(key) = source.extract(&h, &input.body) {
        assert!(validate_key(&key).is_ok(), "{key:?}");
        assert!(!key.is_empty() && key.len() <= MAX_KEY_LEN);
        assert!(!key.chars().any(char::is_control));
    }
});
