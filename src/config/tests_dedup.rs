//! Dedup settings per route: a route's own `lease`, `retention`, `in_flight` and
//! `wait_timeout` over `[dedup]`, every check on them naming the route's field, and
//! `check-config` showing each route's effective values.

use super::*;

fn env_none(_: &str) -> Option<String> {
    None
}

/// A route named `name` at `/name`, with `extra` lines.
fn route(name: &str, extra: &str) -> String {
    format!(
        "\n[[route]]\nname = \"{name}\"\npath = \"/{name}\"\nprovider = \"github\"\nsecrets = [\"s\"]\n{extra}\n"
    )
}

/// Three routes, the third (`route[2]`) with `extra`.
fn third(extra: &str) -> String {
    format!("{}{}{}", route("a", ""), route("b", ""), route("c", extra))
}

fn err(text: &str) -> ConfigError {
    Config::from_toml_with_env(text, env_none).expect_err(text)
}

const SEC: Duration = Duration::from_secs(1);

#[test]
fn a_routes_own_keys_override_dedup_and_the_rest_inherit() {
    let text = format!(
        "[dedup]\nlease = \"20s\"\nretention = \"1h\"\nin_flight = \"wait\"\nwait_timeout = \"3s\"\n{}{}",
        route(
            "pay",
            "retention = \"7d\"\nlease = \"45s\"\nin_flight = \"reject\"\nwait_timeout = \"1s\""
        ),
        route("chat", "retention = \"10m\""),
    );
    let c = Config::from_toml_with_env(&text, env_none).unwrap();
    let pay = c.dedup_of("pay");
    assert_eq!(pay.retention, 7 * 24 * 3600 * SEC);
    assert_eq!(pay.lease, 45 * SEC);
    assert_eq!(pay.in_flight, InFlightPolicy::Reject);
    assert_eq!(pay.wait_timeout, SEC);
    let chat = c.dedup_of("chat");
    assert_eq!(chat.retention, 600 * SEC);
    assert_eq!(chat.lease, 20 * SEC);
    assert_eq!(chat.in_flight, InFlightPolicy::Wait);
    assert_eq!(chat.wait_timeout, 3 * SEC);
    // `[dedup]` stays the default, and is what a name no route has gets.
    assert_eq!(c.dedup.retention, 3600 * SEC);
    assert_eq!(c.dedup_of("gone"), c.dedup);
    assert_eq!(c.routes[1].dedup.lease, None);
}

#[test]
fn each_key_out_of_range_or_unparseable_names_the_routes_field() {
    for (line, field) in [
        ("lease = \"0s\"", "route[2].lease"),
        ("lease = \"2h\"", "route[2].lease"),
        ("lease = \"soon\"", "route[2].lease"),
        ("retention = \"0s\"", "route[2].retention"),
        ("retention = \"366days\"", "route[2].retention"),
        ("retention = \"7 parsecs\"", "route[2].retention"),
        ("wait_timeout = \"0s\"", "route[2].wait_timeout"),
        ("wait_timeout = \"61m\"", "route[2].wait_timeout"),
        ("wait_timeout = \"x\"", "route[2].wait_timeout"),
        ("in_flight = \"maybe\"", "route[2].in_flight"),
    ] {
        let e = err(&third(line));
        assert_eq!(e.field, field, "{line}: {e}");
    }
    // The same range as the `[dedup]` namesake, in the same words.
    let e = err(&third("retention = \"366days\""));
    assert!(e.message.contains("must be between 1ms and 365days"), "{e}");
    let e = err(&third("lease = \"2h\""));
    assert!(e.message.contains("must be between 1ms and 1h"), "{e}");
}

#[test]
fn a_routes_lease_is_checked_against_the_store_timeout() {
    let store = "[store]\nurl = \"memory\"\ntimeout = \"1s\"\n";
    let e = err(&format!("{store}{}", third("lease = \"1999ms\"")));
    assert_eq!(e.field, "route[2].lease");
    assert!(e.message.contains("2 × store.timeout (2s)"), "{e}");
    assert!(
        Config::from_toml_with_env(&format!("{store}{}", third("lease = \"2s\"")), env_none)
            .is_ok()
    );
    // A short route lease is this route's problem only when the store is slow.
    let slow = "[store]\nurl = \"memory\"\ntimeout = \"10s\"\n[dedup]\nlease = \"30s\"\n";
    let e = err(&format!("{slow}{}", third("lease = \"15s\"")));
    assert_eq!(e.field, "route[2].lease");
}

#[test]
fn a_routes_retention_must_outlive_its_call_and_lease() {
    let base = "upstream_timeout = \"10s\"\n[dedup]\nlease = \"30s\"\n";
    // The route's own retention against the default lease.
    let e = err(&format!("{base}{}", third("retention = \"39s\"")));
    assert_eq!(e.field, "route[2].retention");
    assert!(
        e.message.contains("upstream_timeout + dedup.lease (40s)"),
        "{e}"
    );
    assert!(
        Config::from_toml_with_env(&format!("{base}{}", third("retention = \"40s\"")), env_none)
            .is_ok()
    );
    // The route's own retention against its own lease.
    let e = err(&format!(
        "{base}{}",
        third("lease = \"1m\"\nretention = \"69s\"")
    ));
    assert_eq!(e.field, "route[2].retention");
    assert!(
        e.message
            .contains("upstream_timeout + route[2].lease (1m 10s)"),
        "{e}"
    );
    // The route's own lease, too long for the retention it inherits: the lease is named.
    let short = "upstream_timeout = \"10s\"\n[dedup]\nlease = \"30s\"\nretention = \"1m\"\n";
    let e = err(&format!("{short}{}", third("lease = \"55s\"")));
    assert_eq!(e.field, "route[2].lease");
    assert!(e.message.contains("dedup.retention (1m)"), "{e}");
    assert!(e.message.contains("route[2].retention"), "{e}");
    assert!(
        Config::from_toml_with_env(
            &format!("{short}{}", third("lease = \"55s\"\nretention = \"65s\"")),
            env_none
        )
        .is_ok()
    );
}

#[test]
fn a_bad_default_is_named_as_dedup_even_when_a_route_overrides_it() {
    // `[dedup]` is checked whatever the routes set: it is every other route's value.
    let text = format!(
        "upstream_timeout = \"10s\"\n[dedup]\nlease = \"30s\"\nretention = \"39s\"\n{}",
        third("retention = \"1h\"")
    );
    assert_eq!(err(&text).field, "dedup.retention");
}

#[test]
fn check_config_shows_every_routes_effective_values() {
    let text = format!(
        "[dedup]\nretention = \"1h\"\nin_flight = \"wait\"\n{}{}",
        route("pay", "retention = \"7d\"\nlease = \"45s\""),
        route("chat", ""),
    );
    let c = Config::from_toml_with_env(&text, env_none).unwrap();
    let shown = c.redacted_toml();
    let section = |name: &str| -> toml::Value {
        let v: toml::Value = toml::from_str(&shown).unwrap();
        v["route"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"].as_str() == Some(name))
            .cloned()
            .unwrap()
    };
    let pay = section("pay");
    assert_eq!(pay["retention"].as_str(), Some("7days"), "{shown}");
    assert_eq!(pay["lease"].as_str(), Some("45s"), "{shown}");
    assert_eq!(pay["in_flight"].as_str(), Some("wait"), "{shown}");
    assert_eq!(pay["wait_timeout"].as_str(), Some("5s"), "{shown}");
    // A route that sets nothing shows what it inherits.
    let chat = section("chat");
    assert_eq!(chat["retention"].as_str(), Some("1h"), "{shown}");
    assert_eq!(chat["lease"].as_str(), Some("30s"), "{shown}");
    // What is printed loads back to the same effective values.
    let again = Config::from_toml_with_env(&shown, env_none).unwrap();
    for name in ["pay", "chat"] {
        assert_eq!(again.dedup_of(name), c.dedup_of(name), "{name}");
    }
    assert_eq!(again.dedup, c.dedup);
}

/// `replay_body = false` (issue 34 item 11): copies get the stored status and headers
/// but no body; the default keeps the body; `check-config` shows it and it loads back.
#[test]
fn replay_body_is_per_route_defaults_to_true_and_is_shown() {
    let text = format!(
        "{}{}",
        route("quiet", "replay_body = false"),
        route("plain", "")
    );
    let c = Config::from_toml_with_env(&text, env_none).unwrap();
    let of = |name: &str| {
        c.routes
            .iter()
            .find(|r| r.name == name)
            .unwrap()
            .replay_body
    };
    assert!(!of("quiet"));
    assert!(of("plain"));
    let shown = c.redacted_toml();
    assert_eq!(shown.matches("replay_body = false").count(), 1, "{shown}");
    let again = Config::from_toml_with_env(&shown, env_none).unwrap();
    assert!(
        !again
            .routes
            .iter()
            .find(|r| r.name == "quiet")
            .unwrap()
            .replay_body
    );
    // Not a boolean: refused.
    let e = err(&third("replay_body = \"no\""));
    assert!(e.to_string().contains("expected a boolean"), "{e}");
}
