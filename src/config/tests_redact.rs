//! Redis passwords never shown: whatever the password holds (`/`, `?`, `#`, `@`, `:`,
//! `&` unencoded), no configuration error, `Debug` or redacted TOML repeats it, nor
//! any piece of it, whether the URL is accepted or refused.

use proptest::prelude::*;

use super::*;

/// Every text that loading `url` shows: the error (Display and Debug) or the
/// configuration (Debug and redacted TOML), from the file and from the environment.
fn shown(url: &str) -> Vec<String> {
    let file = format!("[store]\nurl = {}\n", toml::Value::String(url.to_string()));
    let from_env = |name: &str| (name == "IDEMGATE_STORE_URL").then(|| url.to_string());
    let mut out = Vec::new();
    for r in [
        Config::from_toml_with_env(&file, |_| None),
        Config::from_toml_with_env("", from_env),
    ] {
        match r {
            Ok(c) => {
                out.push(format!("{c:?}"));
                out.push(c.redacted_toml());
            }
            Err(e) => {
                out.push(e.to_string());
                out.push(format!("{e:?}"));
            }
        }
    }
    out.push(redact_url(url));
    out
}

/// Fails when a text shows the password or a piece of it (a run of 4 or more of its
/// letters: the letters are chosen so no other text holds such a run).
fn assert_hidden(url: &str, password: &str) {
    let pieces: Vec<&str> = password
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|p| p.len() >= 4)
        .collect();
    for text in shown(url) {
        assert!(
            !text.contains(password),
            "`{url}`: the password shows in: {text}"
        );
        for p in &pieces {
            assert!(
                !text.contains(p),
                "`{url}`: a piece of the password ({p}) shows in: {text}"
            );
        }
    }
}

/// The shapes a Redis URL takes, each with the password `P` somewhere.
const SHAPES: &[&str] = &[
    "redis://:P@127.0.0.1:6379/0",
    "redis://alice:P@127.0.0.1:6379",
    "redis://alice:P@127.0.0.1:6379/2?protocol=resp3",
    "rediss://alice:P@cache.example:6380/1",
    "redis+cluster://alice:P@10.0.0.1:7000,10.0.0.2:7001",
    "rediss+cluster://:P@10.0.0.1:7000",
    "redis+sentinel://:P@s1:26379,s2:26380/mymaster/1",
    "redis+sentinel://alice:P@s1:26379/mymaster?sentinel_password=P",
    "redis+sentinel://s1:26379,s2:26380/mymaster?sentinel_username=bob&sentinel_password=P",
    "redis+unix:///run/redis.sock?db=1&pass=P",
    "redis+cluster://alice:P@10.0.0.1",
    "redis+sentinel://:P@s1/mymaster",
    "redis+sentinel://:P@s1:26379,s2:x/mymaster",
    "mysql://alice:P@db:3306",
];

#[test]
fn passwords_with_url_delimiters_never_show() {
    for pw in [
        "QXZJ/KVQX",
        "QXZJ?KVQX",
        "QXZJ#KVQX",
        "QXZJ@KVQX",
        "QXZJ:KVQX",
        "QXZJ&KVQX=JJZQ",
        "QXZJ/KV?QX#ZZ@JJQK",
        "/QXZJKVQX",
        "QXZJKVQX/",
        "QXZJ/0",
        "QXZJ%2FKVQX",
        "QXZJ/KVQX@h:1,QJJZ",
    ] {
        for shape in SHAPES {
            assert_hidden(&shape.replace('P', pw), pw);
        }
    }
}

#[test]
fn a_refused_url_is_named_redacted_with_a_hint() {
    let e = Config::from_toml_with_env(
        "[store]\nurl = \"redis://:hunter2/Zq9@127.0.0.1:6379\"\n",
        |_| None,
    )
    .unwrap_err();
    assert_eq!(e.field, "store.url");
    assert!(
        !e.message.contains("hunter2") && !e.message.contains("Zq9"),
        "{e}"
    );
    assert!(e.message.contains("redis://:***@127.0.0.1:6379"), "{e}");
    assert!(e.message.contains("percent-encode"), "{e}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// A random password, in any shape of URL, never shows in what loading it shows.
    #[test]
    fn a_random_password_never_shows(
        pw in "[QXZJKV/?#@:&=%,.]{0,4}[QXZJKV]{4}[QXZJKV/?#@:&=%,.]{0,12}",
        shape in 0..SHAPES.len(),
    ) {
        assert_hidden(&SHAPES[shape].replace('P', &pw), &pw);
    }
}
