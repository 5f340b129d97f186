//! The stored-answer header codec: decoding arbitrary bytes (what Redis hands back)
//! never panics, and whatever decodes re-encodes and decodes to the same headers.
#![no_main]

use http::HeaderMap;
use idemgate::upstream::{decode_headers, encode_headers};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut h = HeaderMap::new();
    decode_headers(data, &mut h);
    let mut again = HeaderMap::new();
    decode_headers(&encode_headers(&h), &mut again);
    assert_eq!(h, again);
});
