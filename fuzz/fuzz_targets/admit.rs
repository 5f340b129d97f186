//! Every preset's front half (`Route::admit`: GET checks, handshake shapes, the
//! signature, the key, the fingerprint) on arbitrary methods, headers, queries and
//! bodies: never panics, and never admits a POST without its signature.
#![no_main]

use std::sync::OnceLock;

use arbitrary::Arbitrary;
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method};
use idemgate::config::Config;
use idemgate::providers::{Route, Routes};
use libfuzzer_sys::fuzz_target;

/// One route per preset that takes a plain secret (the RSA presets need key files).
const PRESETS: &[(&str, &str, &str)] = &[
    ("standard", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", ""),
    ("github", "s3cret", ""),
    ("stripe", "whsec_s3cret", ""),
    ("shopify", "s3cret", ""),
    (
        "slack",
        "s3cret",
        "handshake = \"answer\"\nkeyless = \"forward\"\n",
    ),
    (
        "twilio",
        "s3cret",
        "public_url = \"https://h.example/t?a=1\"\n",
    ),
    ("razorpay", "s3cret", ""),
    ("bitbucket", "s3cret", ""),
    ("intercom", "s3cret", ""),
    (
        "square",
        "s3cret",
        "public_url = \"https://h.example/sq\"\n",
    ),
    ("linear", "s3cret", ""),
    ("gitlab", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", ""),
    ("paddle", "pdl_s3cret", ""),
    (
        "hubspot",
        "s3cret",
        "public_url = \"https://h.example/hs\"\n",
    ),
    ("mailgun", "s3cret", ""),
    (
        "adyen",
        "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056",
        "",
    ),
    (
        "meta",
        "s3cret",
        "handshake = \"answer\"\nverify_token = \"tok\"\n",
    ),
    ("zoom", "s3cret", "handshake = \"answer\"\n"),
    ("twitter", "s3cret", "handshake = \"answer\"\n"),
    (
        "discord",
        "9bbc32a79c3815ae5140d43b77a7c7ec4f9f06296c13c88bcfc8b125596640a1",
        "handshake = \"answer\"\n",
    ),
    (
        "sendgrid",
        "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEeLEVuihaQf6YcUiMYDEtGsw5O+Eb0a3GbSdH9JZuVzu9APYt+YqBxMoXI/3jinDYdjj+IReFcq+BIzgTmQ7MkA==",
        "",
    ),
];

fn routes() -> Vec<std::sync::Arc<Route>> {
    let mut text = String::from("[dedup]\nretention = \"72h\"\n");
    for (p, secret, extra) in PRESETS {
        text.push_str(&format!(
            "[[route]]\nname = \"{p}\"\npath = \"/{p}\"\nprovider = \"{p}\"\nsecrets = [\"{secret}\"]\n{extra}"
        ));
    }
    let config = Config::from_toml_with_env(&text, |_| None).expect("the fuzz config loads");
    let routes = Routes::build(&config).expect("every preset builds");
    (0..config.routes.len())
        .map(|i| routes.route(&config, i).unwrap())
        .collect()
}

#[derive(Arbitrary, Debug)]
struct Input {
    route: u8,
    get: bool,
    headers: Vec<(u8, Vec<u8>)>,
    query: Option<String>,
    body: Vec<u8>,
    now: i64,
}

/// Header names the presets read, so the fuzzer reaches past "missing header".
const NAMES: &[&str] = &[
    "webhook-id",
    "webhook-timestamp",
    "webhook-signature",
    "svix-id",
    "svix-timestamp",
    "svix-signature",
    "x-hub-signature-256",
    "x-hub-signature",
    "stripe-signature",
    "x-shopify-hmac-sha256",
    "x-slack-signature",
    "x-slack-request-timestamp",
    "x-twilio-signature",
    "x-razorpay-signature",
    "x-square-hmacsha256-signature",
    "linear-signature",
    "x-gitlab-token",
    "paddle-signature",
    "x-hubspot-signature-v3",
    "x-hubspot-request-timestamp",
    "x-zm-signature",
    "x-zm-request-timestamp",
    "x-twitter-webhooks-signature",
    "x-signature-ed25519",
    "x-signature-timestamp",
    "x-twilio-email-event-webhook-signature",
    "x-twilio-email-event-webhook-timestamp",
    "content-type",
    "idempotency-key",
    "x-request-uuid",
    "x-event-key",
];

fuzz_target!(|input: Input| {
    static ROUTES: OnceLock<Vec<std::sync::Arc<Route>>> = OnceLock::new();
    let routes = ROUTES.get_or_init(routes);
    let route = &routes[usize::from(input.route) % routes.len()];
    let mut headers = HeaderMap::new();
    for (n, v) in &input.headers {
        let name = HeaderName::from_static(NAMES[usize::from(*n) % NAMES.len()]);
        if let Ok(v) = HeaderValue::from_bytes(v) {
            headers.append(name, v);
        }
    }
    let method = if input.get { Method::GET } else { Method::POST };
    let body = Bytes::from(input.body);
    let admitted = route.admit(&method, &headers, input.query.as_deref(), &body, input.now);
    // A POST with no signature header at all is never admitted (keyless or not),
    // whatever its body.
    let unsigned = !headers
        .keys()
        .any(|k| k.as_str().contains("signature") || k == "x-gitlab-token");
    if method == Method::POST && unsigned {
        assert!(
            admitted.is_err(),
            "an unsigned POST was admitted on {}",
            route.name
        );
    }
});
