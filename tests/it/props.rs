//! Property tests (proptest) for the pure decision logic and the parsers of untrusted
//! input: what the answer table decides, `Retry-After`, key validation, the circuit
//! breaker's state machine, the signature verifier, the key extractors, the stored
//! header codec, and the config parser never panicking. They run in every
//! `cargo test`; the coverage-guided fuzzing of the same parsers is scripts/fuzz-smoke.

use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use bytes::Bytes;
use hmac::{KeyInit, Mac};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use proptest::prelude::*;

use idemgate::config::{InFlightPolicy, Secret};
use idemgate::gate::{Step, decide};
use idemgate::metrics::Outcome;
use idemgate::providers::StandardWebhooks;
use idemgate::providers::Verifier;
use idemgate::providers::{KeySource, MAX_KEY_LEN, validate_key};
use idemgate::retry_after_secs;
use idemgate::store::breaker::{Admission, BreakerState, Circuit};
use idemgate::store::{Claim, StoredResponse, Token};
use idemgate::upstream::{decode_headers, encode_headers};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

fn claim_strategy() -> impl Strategy<Value = Claim> {
    prop_oneof![
        any::<[u8; 16]>().prop_map(|t| Claim::Claimed(Token(t))),
        (100u16..600, any::<Vec<u8>>(), any::<Vec<u8>>()).prop_map(|(status, h, b)| {
            Claim::Completed(StoredResponse {
                status,
                headers: Bytes::from(h),
                body: Bytes::from(b),
            })
        }),
        (0u64..10_000_000).prop_map(|ms| Claim::InFlight {
            remaining: Duration::from_millis(ms)
        }),
        Just(Claim::Mismatch),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn decide_follows_the_answer_table(
        claim in claim_strategy(),
        wait in any::<bool>(),
        waited in any::<bool>(),
    ) {
        let policy = if wait { InFlightPolicy::Wait } else { InFlightPolicy::Reject };
        match (claim.clone(), decide(claim, policy, waited)) {
            (Claim::Claimed(t), Step::Forward(u)) => prop_assert_eq!(t, u),
            (Claim::Completed(r), Step::Replay(s)) => prop_assert_eq!(r, s),
            (Claim::Mismatch, Step::Refuse(r)) => {
                prop_assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
                prop_assert_eq!(r.outcome, Outcome::PayloadMismatch);
                prop_assert_eq!(r.retry_after, None);
            }
            (Claim::InFlight { .. }, Step::Wait) => prop_assert!(wait && !waited),
            (Claim::InFlight { remaining }, Step::Refuse(r)) => {
                prop_assert!(!wait || waited);
                prop_assert_eq!(r.status, StatusCode::CONFLICT);
                prop_assert_eq!(r.outcome, Outcome::InFlight);
                prop_assert_eq!(r.retry_after, Some(retry_after_secs(remaining)));
            }
            (c, s) => prop_assert!(false, "{c:?} decided {s:?}"),
        }
    }

    #[test]
    fn retry_after_is_the_ceiling_in_whole_seconds_at_least_one(
        a in 0u64..(1 << 50),
        b in 0u64..(1 << 50),
    ) {
        let (da, db) = (Duration::from_millis(a), Duration::from_millis(b));
        let ra = retry_after_secs(da);
        prop_assert!(ra >= 1);
        prop_assert!(ra * 1000 >= a, "never tells a copy to come back before the lease ends");
        prop_assert!(ra * 1000 < a.max(1) + 1000, "no more than a second late");
        if a <= b {
            prop_assert!(ra <= retry_after_secs(db));
        }
    }

    #[test]
    fn validate_key_accepts_exactly_short_printable_keys(key in ".{0,300}|[\\x00-\\x1f\\x7f a-z]{0,20}") {
        let ok = !key.is_empty() && key.len() <= MAX_KEY_LEN && !key.chars().any(char::is_control);
        prop_assert_eq!(validate_key(&key).is_ok(), ok, "{:?}", key);
    }

    #[test]
    fn extracted_keys_are_always_valid(
        kind in 0u8..3,
        arg in "[a-z/~01_-]{1,12}",
        header_values in proptest::collection::vec(any::<Vec<u8>>(), 0..3),
        body in prop_oneof![
            any::<Vec<u8>>(),
            "\\{\"[a-z]{1,3}\":(\"[^\"]{0,300}\"|[0-9]{1,5}|true|null|\\[\\]|\\{\\})\\}".prop_map(String::into_bytes),
            "([a-z]{1,3}=[%A-Fa-f0-9+a-z]{0,12}&?){0,4}".prop_map(String::into_bytes),
        ],
    ) {
        let text = match kind {
            0 => format!("header:x-{}", arg.replace(['/', '~'], "")),
            1 => format!("json:/{arg}"),
            _ => format!("form:{arg}"),
        };
        let Ok(source) = KeySource::parse(&text) else { return Ok(()) };
        let mut h = HeaderMap::new();
        if let KeySource::Header(name) = &source {
            for v in &header_values {
                if let Ok(v) = HeaderValue::from_bytes(v) {
                    h.append(name.clone(), v);
                }
            }
        }
        if let Ok(key) = source.extract(&h, &body) {
            prop_assert!(validate_key(&key).is_ok(), "{:?}", key);
        }
    }

    #[test]
    fn the_verifier_never_panics_and_a_correct_signature_passes_in_the_window(
        id in "[ -~]{0,40}",
        skew in -600i64..600,
        now in 0i64..4_000_000_000,
        junk in "[ -~]{0,200}",
        body in any::<Vec<u8>>(),
    ) {
        let v = StandardWebhooks::new(
            &[Secret { source: SECRET.into(), value: SECRET.as_bytes().to_vec(), id: None }],
            Duration::from_secs(300),
        ).unwrap();
        let ts = (now + skew).to_string();
        let key = B64.decode(&SECRET[6..]).unwrap();
        let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(&key).unwrap();
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(ts.as_bytes());
        mac.update(b".");
        mac.update(&body);
        let good = format!("v1,{}", B64.encode(mac.finalize().into_bytes()));
        let mut h = HeaderMap::new();
        h.insert("webhook-id", HeaderValue::from_str(&id).unwrap());
        h.insert("webhook-timestamp", HeaderValue::from_str(&ts).unwrap());
        h.insert("webhook-signature", HeaderValue::from_str(&junk).unwrap());
        // junk alone: never a panic, never a pass (a 2^-256 chance aside)
        prop_assert!(v.verify(&h, &body, now).is_err());
        h.insert("webhook-signature", HeaderValue::from_str(&format!("{good} {junk}")).unwrap());
        prop_assert_eq!(v.verify(&h, &body, now).is_ok(), skew.abs() <= 300);
    }

    #[test]
    fn stored_headers_round_trip(data in any::<Vec<u8>>(), pairs in proptest::collection::vec(("[a-z-]{1,10}", "[ -~]{0,20}"), 0..6)) {
        let mut h = HeaderMap::new();
        decode_headers(&data, &mut h);
        let mut again = HeaderMap::new();
        decode_headers(&encode_headers(&h), &mut again);
        prop_assert_eq!(&h, &again);
        let mut built = HeaderMap::new();
        for (n, v) in &pairs {
            if let (Ok(n), Ok(v)) = (HeaderName::from_bytes(n.as_bytes()), HeaderValue::from_str(v.trim())) {
                built.append(n, v);
            }
        }
        let mut back = HeaderMap::new();
        decode_headers(&encode_headers(&built), &mut back);
        prop_assert_eq!(built, back);
    }

    #[test]
    fn config_parsing_never_panics_and_errors_name_a_field(
        lines in proptest::collection::vec(
            (
                prop_oneof![
                    Just("max_in_flight"), Just("max_connections"), Just("body_timeout"),
                    Just("header_timeout"), Just("max_body"), Just("max_response"),
                    Just("upstream"), Just("listen"), Just("upstream_timeout"),
                    Just("[store]\nbreaker_threshold"), Just("[store]\nbreaker_cooldown"),
                    Just("[store]\nurl"), Just("[dedup]\nlease"), Just("[dedup]\nretention"),
                    Just("bogus"),
                ],
                prop_oneof![
                    "-?[0-9]{1,25}".boxed(),
                    "\"[0-9]{0,12}(ms|s|h|m|KiB|MiB|GiB|x)?\"".boxed(),
                    "\"[ -~]{0,20}\"".boxed(),
                    Just("1.5".to_string()).boxed(),
                    Just("[1]".to_string()).boxed(),
                ],
            ),
            0..5,
        ),
        raw in "[ -~\n]{0,200}",
    ) {
        let text: String = lines.iter().map(|(k, v)| format!("{k} = {v}\n")).collect();
        for t in [text.as_str(), raw.as_str()] {
            match idemgate::providers::from_toml_with_env(t, |_| None) {
                Err(e) => prop_assert!(!e.field.is_empty()),
                Ok((c, _)) => {
                    prop_assert!(c.max_in_flight >= 1 && c.max_connections >= 1);
                    prop_assert!(!c.body_timeout.is_zero() && !c.header_timeout.is_zero());
                    prop_assert!(c.store.breaker_threshold >= 1);
                }
            }
        }
    }

    #[test]
    fn the_breaker_state_machine_holds_its_invariants(
        threshold in 1u32..6,
        ops in proptest::collection::vec(0u8..5, 1..200),
    ) {
        let cooldown = Duration::from_millis(100);
        let t0 = Instant::now();
        let mut now = t0;
        let mut c = Circuit::new(threshold, cooldown);
        let mut consecutive = 0u32;
        let mut probe_out = false;
        for op in ops {
            match op {
                0 => {
                    let before = c.state();
                    let a = c.admit(now);
                    match before {
                        BreakerState::Closed { .. } => prop_assert_eq!(a, Admission::Pass),
                        BreakerState::Open { until } if now >= until => {
                            prop_assert_eq!(a, Admission::Probe);
                            probe_out = true;
                        }
                        _ => prop_assert_eq!(a, Admission::Refuse),
                    }
                }
                1 => {
                    c.record(true, now);
                    consecutive = 0;
                    probe_out = false;
                    prop_assert_eq!(c.state(), BreakerState::Closed { failures: 0 });
                }
                2 => {
                    let was_closed = matches!(c.state(), BreakerState::Closed { .. });
                    c.record(false, now);
                    consecutive += 1;
                    probe_out = false;
                    if was_closed {
                        prop_assert_eq!(c.is_open(), consecutive >= threshold);
                    } else {
                        prop_assert!(c.is_open(), "a failure never closes the breaker");
                    }
                }
                3 => now += cooldown / 3,
                _ => {
                    c.probe_abandoned(now);
                    probe_out = false;
                }
            }
            // at most one probe out: while half-open, everything else is refused
            if probe_out {
                prop_assert_eq!(c.state(), BreakerState::HalfOpen);
                prop_assert_eq!(c.admit(now), Admission::Refuse);
            }
            if let BreakerState::Open { until } = c.state() {
                prop_assert!(until <= now + cooldown, "an open breaker never waits past one cooldown");
            }
        }
    }
}
