//! The configuration parser on arbitrary text: never panics, errors always name a
//! field, and a valid configuration's `check-config` output is itself valid TOML that
//! loads again to the same limits.
#![no_main]

use idemgate::config::Config;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match idemgate::providers::from_toml_with_env(text, |_| None) {
        Err(e) => assert!(!e.field.is_empty(), "{e:?}"),
        Ok((c, _)) => {
            let shown = c.redacted_toml();
            if c.routes.is_empty() {
                let again = Config::from_toml_with_env(&shown, |_| None)
                    .unwrap_or_else(|e| panic!("check-config output does not load: {e}\n{shown}"));
                assert_eq!(again.max_body, c.max_body);
                assert_eq!(again.max_in_flight, c.max_in_flight);
                assert_eq!(again.max_connections, c.max_connections);
                assert_eq!(again.body_timeout, c.body_timeout);
                assert_eq!(again.store.breaker_threshold, c.store.breaker_threshold);
            }
        }
    }
});
