//! The configuration's unit tests: parsing, validation, overrides and redaction.

use super::parse::split_key_id;
use super::*;

fn env_none(_: &str) -> Option<String> {
    None
}

const ROUTE: &str = r#"
[[route]]
name = "wh"
path = "/webhooks/wh"
provider = "standard"
secrets = ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]
"#;

#[test]
fn defaults_without_a_file_use_the_memory_store() {
    let c = Config::from_toml_with_env("", env_none).unwrap();
    assert_eq!(c.listen.to_string(), "0.0.0.0:8080");
    assert_eq!(c.admin_listen.to_string(), "0.0.0.0:9090");
    assert_eq!(c.upstream.to_string(), "http://127.0.0.1:3000/");
    assert_eq!(c.upstream_timeout, Duration::from_secs(10));
    assert_eq!(c.max_body, 1024 * 1024);
    assert_eq!(c.shutdown_grace, Duration::from_secs(25));
    assert_eq!(c.store.url, StoreUrl::Memory);
    assert!(!c.store.explicit);
    assert!(c.memory_store_warning().is_some());
    assert_eq!(c.store.timeout, Duration::from_secs(1));
    assert_eq!(c.store.on_error, OnStoreError::Reject);
    assert_eq!(c.dedup.lease, Duration::from_secs(30));
    assert_eq!(c.dedup.retention, Duration::from_secs(72 * 3600));
    assert_eq!(c.dedup.in_flight, InFlightPolicy::Reject);
    assert_eq!(c.dedup.wait_timeout, Duration::from_secs(5));
    assert_eq!(c.header_timeout, Duration::from_secs(10));
    assert_eq!(c.body_timeout, Duration::from_secs(10));
    assert_eq!(c.max_in_flight, 1024);
    assert_eq!(c.max_connections, 4096);
    assert_eq!(c.worker_threads, super::cpus::default_worker_threads());
    assert!(c.worker_threads_from_quota);
    // check-config shows the number, commented out so the output still follows the quota
    let shown = format!("# worker_threads = {}  (left out", c.worker_threads);
    assert!(c.redacted_toml().contains(&shown), "{}", c.redacted_toml());
    let again = Config::from_toml_with_env(&c.redacted_toml(), env_none).unwrap();
    assert!(again.worker_threads_from_quota);
    assert_eq!(c.store.breaker_threshold, 5);
    assert_eq!(c.store.breaker_cooldown, Duration::from_secs(1));
}

#[test]
fn limits_and_breaker_fields_are_validated() {
    let c = Config::from_toml_with_env(
        r#"
max_in_flight = 8
max_connections = "16"
worker_threads = 3
body_timeout = "2s"
header_timeout = "3s"
[store]
url = "memory"
breaker_threshold = 2
breaker_cooldown = "250ms"
"#,
        env_none,
    )
    .unwrap();
    assert_eq!((c.max_in_flight, c.max_connections), (8, 16));
    assert_eq!(c.worker_threads, 3);
    assert!(!c.worker_threads_from_quota);
    assert_eq!(err("worker_threads = 0").field, "worker_threads");
    assert!(err("worker_threads = 0").message.contains("leave it out"));
    assert_eq!(err("worker_threads = 257").field, "worker_threads");
    assert_eq!(err("worker_threads = \"all\"").field, "worker_threads");
    assert_eq!(c.body_timeout, Duration::from_secs(2));
    assert_eq!(c.header_timeout, Duration::from_secs(3));
    assert_eq!(c.store.breaker_threshold, 2);
    assert_eq!(c.store.breaker_cooldown, Duration::from_millis(250));
    assert_eq!(err("max_in_flight = 0").field, "max_in_flight");
    assert_eq!(err("max_in_flight = -3").field, "max_in_flight");
    assert_eq!(err("max_connections = \"many\"").field, "max_connections");
    assert_eq!(err("max_connections = 1.5").field, "max_connections");
    assert_eq!(
        err("max_connections = 99999999999").field,
        "max_connections"
    );
    assert_eq!(err("body_timeout = \"0s\"").field, "body_timeout");
    assert_eq!(err("header_timeout = \"soon\"").field, "header_timeout");
    assert_eq!(
        err("[store]\nbreaker_threshold = 0").field,
        "store.breaker_threshold"
    );
    assert_eq!(
        err("[store]\nbreaker_cooldown = \"0s\"").field,
        "store.breaker_cooldown"
    );
    // what check-config prints is itself accepted again
    let again = Config::from_toml_with_env(&c.redacted_toml(), env_none).unwrap();
    assert_eq!(again.max_connections, 16);
    assert_eq!(again.worker_threads, 3);
    assert_eq!(again.store.breaker_cooldown, Duration::from_millis(250));
}

#[test]
fn recent_per_route_defaults_to_ten_thousand_and_is_bounded() {
    let c = Config::from_toml_with_env("", env_none).unwrap();
    assert_eq!(c.store.recent_per_route, 10_000);
    let c =
        Config::from_toml_with_env("[store]\nrecent_per_route = 1_000_000\n", env_none).unwrap();
    assert_eq!(c.store.recent_per_route, 1_000_000);
    let again = Config::from_toml_with_env(&c.redacted_toml(), env_none).unwrap();
    assert_eq!(again.store.recent_per_route, 1_000_000);
    for bad in ["0", "10_000_001", "-5", "\"many\""] {
        assert_eq!(
            err(&format!("[store]\nrecent_per_route = {bad}")).field,
            "store.recent_per_route",
            "{bad}"
        );
    }
}

#[test]
fn a_store_section_defaults_to_local_redis() {
    let c = Config::from_toml_with_env("[store]\n", env_none).unwrap();
    assert_eq!(
        c.store.url,
        StoreUrl::Redis("redis://127.0.0.1:6379/0".into())
    );
    assert!(c.memory_store_warning().is_none());
}

#[test]
fn environment_overrides_the_file() {
    let env = |n: &str| match n {
        "IDEMGATE_LISTEN" => Some("127.0.0.1:1111".to_string()),
        "IDEMGATE_ADMIN_LISTEN" => Some("127.0.0.1:2222".to_string()),
        "IDEMGATE_UPSTREAM" => Some("http://127.0.0.1:3333".to_string()),
        "IDEMGATE_STORE_URL" => Some("redis://127.0.0.1:4444/1".to_string()),
        _ => None,
    };
    let c = Config::from_toml_with_env("listen = \"0.0.0.0:1\"\n[store]\nurl = \"memory\"\n", env)
        .unwrap();
    assert_eq!(c.listen.port(), 1111);
    assert_eq!(c.admin_listen.port(), 2222);
    assert_eq!(c.upstream.port_u16(), Some(3333));
    assert_eq!(
        c.store.url,
        StoreUrl::Redis("redis://127.0.0.1:4444/1".into())
    );
}

#[test]
fn the_memory_store_is_bounded_by_max_memory() {
    let c = Config::from_toml_with_env("", env_none).unwrap();
    assert_eq!(c.store.max_memory, 128 * 1024 * 1024);
    let c = Config::from_toml_with_env(
        "[store]\nurl = \"memory\"\nmax_memory = \"64MiB\"",
        env_none,
    )
    .unwrap();
    assert_eq!(c.store.max_memory, 64 * 1024 * 1024);
    assert!(c.redacted_toml().contains("max_memory = \"67108864\""));
    for bad in ["\"lots\"", "\"0\"", "\"512KiB\"", "\"1TB\"", "\"1\""] {
        let e = err(&format!("[store]\nurl = \"memory\"\nmax_memory = {bad}"));
        assert_eq!(e.field, "store.max_memory", "{bad}: {e}");
    }
    let e = err("[store]\nurl = \"redis://127.0.0.1/0\"\nmax_memory = \"64MiB\"");
    assert_eq!(e.field, "store.max_memory");
    assert!(e.to_string().contains("maxmemory"), "{e}");
}

fn err(text: &str) -> ConfigError {
    Config::from_toml_with_env(text, env_none).unwrap_err()
}

#[test]
fn errors_name_the_field() {
    assert!(err("bogus = 1").to_string().contains("bogus"));
    assert!(err("[store]\nbogus = 1").to_string().contains("bogus"));
    assert_eq!(err("upstream_timeout = \"ten\"").field, "upstream_timeout");
    assert_eq!(err("max_body = \"1 lightyear\"").field, "max_body");
    assert_eq!(
        err("[dedup]\nin_flight = \"maybe\"").field,
        "dedup.in_flight"
    );
    assert_eq!(
        err("[store]\non_error = \"ignore\"").field,
        "store.on_error"
    );
    assert_eq!(err("[store]\nurl = \"mysql://x\"").field, "store.url");
    assert_eq!(err("listen = \"nowhere\"").field, "listen");
    assert_eq!(err("upstream = \"https://x:1\"").field, "upstream");
    assert_eq!(err("[dedup]\nlease = \"0s\"").field, "dedup.lease");
}

#[test]
fn file_secrets_are_trimmed_and_empty_ones_refused() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("s");
    std::fs::write(&p, "  whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n").unwrap();
    let text = ROUTE.replace(
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        &format!("file:{}", p.display()),
    );
    let c = Config::from_toml_with_env(&text, env_none).unwrap();
    assert_eq!(
        c.routes[0].secrets[0].value,
        b"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    );
    std::fs::write(&p, " \n").unwrap();
    assert_eq!(err(&text).field, "route[0].secrets[0]");
}

#[test]
fn redacted_output_hides_secrets_and_passwords() {
    let text = format!("[store]\nurl = \"redis://u:hunter2@127.0.0.1:6379/0\"\n{ROUTE}");
    let c = Config::from_toml_with_env(&text, env_none).unwrap();
    let shown = c.redacted_toml();
    assert!(!shown.contains("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"));
    assert!(!shown.contains("hunter2"));
    assert!(shown.contains("<redacted literal>"));
    assert!(shown.contains("redis://u:***@127.0.0.1:6379/0"));
    // What is printed is itself a valid configuration of the same shape.
    assert!(toml::from_str::<toml::Value>(&shown).is_ok());
}

#[test]
fn wechatpay_entries_may_name_their_key_id() {
    assert_eq!(
        split_key_id("PUB_KEY_ID_0114=file:/k.pem"),
        (Some("PUB_KEY_ID_0114"), "file:/k.pem")
    );
    assert_eq!(split_key_id("file:/cert.pem"), (None, "file:/cert.pem"));
    assert_eq!(
        split_key_id("-----BEGIN PUBLIC KEY-----\nAB==\n"),
        (None, "-----BEGIN PUBLIC KEY-----\nAB==\n")
    );
    assert_eq!(split_key_id("ID="), (None, "ID="));
    // only wechatpay routes split: a base64 HMAC secret keeps its `=`
    let text = ROUTE.replace(
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw=",
    );
    if let Ok(c) = Config::from_toml_with_env(&text, env_none) {
        assert!(c.routes[0].secrets[0].id.is_none());
    }
    let s = Secret {
        source: "env:WX_KEY".into(),
        value: b"pem".to_vec(),
        id: Some("PUB_KEY_ID_1".into()),
    };
    assert_eq!(s.display(), "PUB_KEY_ID_1=env:WX_KEY");
    let lit = Secret {
        source: "-----BEGIN".into(),
        value: b"pem".to_vec(),
        id: Some("PUB_KEY_ID_1".into()),
    };
    assert_eq!(lit.display(), "PUB_KEY_ID_1=<redacted literal>");
}

#[test]
fn cluster_and_sentinel_urls_and_replica_acks() {
    let c = Config::from_toml_with_env(
        "[store]\nurl = \"redis+cluster://u:pw@127.0.0.1:7000,127.0.0.1:7001\"\nmin_replicas_ack = 1\n",
        env_none,
    )
    .unwrap();
    assert_eq!(c.store.min_replicas_ack, 1);
    assert_eq!(c.store.replicas_ack_timeout, Duration::from_millis(100));
    let shown = c.redacted_toml();
    assert!(!shown.contains(":pw@"), "{shown}");
    assert!(shown.contains("min_replicas_ack = 1"));
    let c = Config::from_toml_with_env(
        "[store]\nurl = \"redis+sentinel://:pw@127.0.0.1:26379/mymaster/1?sentinel_password=spw\"\n",
        env_none,
    )
    .unwrap();
    assert_eq!(c.store.min_replicas_ack, 0);
    let shown = c.redacted_toml();
    assert!(!shown.contains("spw") && !shown.contains(":pw@"), "{shown}");
    assert_eq!(
        err("[store]\nurl = \"redis+sentinel://127.0.0.1:26379\"").field,
        "store.url"
    );
    assert_eq!(
        err("[store]\nurl = \"redis+cluster://127.0.0.1:7000/2\"").field,
        "store.url"
    );
    assert_eq!(
        err("[store]\nurl = \"memory\"\nmin_replicas_ack = 1").field,
        "store.min_replicas_ack"
    );
    assert_eq!(
        err("[store]\nmin_replicas_ack = 1\nreplicas_ack_timeout = \"2s\"").field,
        "store.replicas_ack_timeout"
    );
}

#[test]
fn async_routes_and_their_fields() {
    let text = format!("{ROUTE}mode = \"async\"\nack_body = \"success\"\n");
    let c = Config::from_toml_with_env(&text, env_none).unwrap();
    let RouteMode::Async(a) = &c.routes[0].mode else {
        panic!("async route expected")
    };
    assert_eq!(a.ack_status, 200);
    assert_eq!(a.ack_body, "success");
    assert_eq!(a.max_attempts, 10);
    assert_eq!(a.max_age, Duration::from_secs(24 * 3600));
    assert_eq!(a.backoff, Duration::from_secs(1));
    assert_eq!(a.max_backoff, Duration::from_secs(300));
    assert_eq!(c.async_queue.claim_idle, Duration::from_secs(30));
    assert_eq!(c.async_queue.max_queue, 100_000);
    let shown = c.redacted_toml();
    assert!(shown.contains("mode = \"async\""), "{shown}");
    assert!(shown.contains("ack_body = \"success\""), "{shown}");
    assert!(shown.contains("[async]\nclaim_idle = \"30s\""), "{shown}");
    assert!(toml::from_str::<toml::Value>(&shown).is_ok());

    assert_eq!(c.routes.len(), 1);
    let sync = Config::from_toml_with_env(ROUTE, env_none).unwrap();
    assert_eq!(sync.routes[0].mode, RouteMode::Sync);
    assert_eq!(
        err(&format!("{ROUTE}ack_body = \"ok\"\n")).field,
        "route[0].ack_body"
    );
    assert_eq!(
        err(&format!("{ROUTE}max_attempts = 3\n")).field,
        "route[0].max_attempts"
    );
    assert_eq!(
        err(&format!("{ROUTE}mode = \"later\"\n")).field,
        "route[0].mode"
    );
    let a = format!("{ROUTE}mode = \"async\"\n");
    assert_eq!(
        err(&format!("{a}ack_status = 500\n")).field,
        "route[0].ack_status"
    );
    assert_eq!(
        err(&format!("{a}max_attempts = 0\n")).field,
        "route[0].max_attempts"
    );
    assert_eq!(
        err(&format!("{a}backoff = \"soon\"\n")).field,
        "route[0].backoff"
    );
    assert_eq!(
        err(&format!("{a}backoff = \"10s\"\nmax_backoff = \"1s\"\n")).field,
        "route[0].max_backoff"
    );
    assert_eq!(
        err("[async]\nclaim_idle = \"0s\"").field,
        "async.claim_idle"
    );
    assert_eq!(err("[async]\nmax_queue = 0").field, "async.max_queue");
    assert!(err("[async]\nbogus = 1").to_string().contains("bogus"));
}

#[test]
fn sizes_and_durations() {
    assert_eq!(parse_size("f", "1MiB").unwrap(), 1 << 20);
    assert_eq!(parse_size("f", "64KiB").unwrap(), 64 << 10);
    assert_eq!(parse_size("f", "1000").unwrap(), 1000);
    assert!(parse_size("f", "0").is_err());
    assert_eq!(
        parse_duration("f", "72h").unwrap(),
        Duration::from_secs(72 * 3600)
    );
}

#[test]
fn async_routes_take_throttling_and_ordering() {
    let a = format!("{ROUTE}mode = \"async\"\n");
    let route = |extra: &str| {
        let c = Config::from_toml_with_env(&format!("{a}{extra}"), env_none).unwrap();
        let RouteMode::Async(r) = &c.routes[0].mode else {
            panic!("async route expected")
        };
        (r.clone(), c.redacted_toml())
    };
    // Defaults: no bound, a cap of 1 h, unordered.
    let (r, _) = route("");
    assert_eq!(r.throttle.max_concurrency, None);
    assert_eq!(r.throttle.rate, None);
    assert!(!r.throttle.limits());
    assert_eq!(r.throttle.retry_after_cap, Duration::from_secs(3600));
    assert_eq!(r.order_key, None);
    // burst defaults to max(1, rate).
    let (r, shown) =
        route("max_concurrency = 4\nrate = 200\norder_key = \"json:/data/object/id\"\n");
    assert_eq!(r.throttle.max_concurrency, Some(4));
    assert_eq!((r.throttle.rate, r.throttle.burst), (Some(200.0), 200.0));
    assert_eq!(r.order_key.as_deref(), Some("json:/data/object/id"));
    assert!(
        shown.contains("max_concurrency = 4") && shown.contains("burst = 200.0"),
        "{shown}"
    );
    assert!(toml::from_str::<toml::Value>(&shown).is_ok());
    assert_eq!(route("rate = 0.5\n").0.throttle.burst, 1.0);
    let (r, _) = route("rate = 2.5\nburst = 10\nretry_after_cap = \"10m\"\n");
    assert_eq!(
        (r.throttle.burst, r.throttle.retry_after_cap),
        (10.0, Duration::from_secs(600))
    );
    // Each mistake names its field.
    for (extra, field) in [
        ("max_concurrency = 0\n", "route[0].max_concurrency"),
        ("rate = 0\n", "route[0].rate"),
        ("rate = -3\n", "route[0].rate"),
        ("rate = 2000000\n", "route[0].rate"),
        ("burst = 5\n", "route[0].burst"),
        ("rate = 5\nburst = 0.5\n", "route[0].burst"),
        ("retry_after_cap = \"0s\"\n", "route[0].retry_after_cap"),
        ("retry_after_cap = \"2days\"\n", "route[0].retry_after_cap"),
        ("order_key = \" \"\n", "route[0].order_key"),
    ] {
        assert_eq!(err(&format!("{a}{extra}")).field, field, "{extra}");
    }
    // Async-only fields on a sync route are errors, not silently ignored.
    for name in [
        "max_concurrency = 1",
        "rate = 1",
        "burst = 1",
        "order_key = \"header:x\"",
        "retry_after_cap = \"1m\"",
    ] {
        let field = format!("route[0].{}", name.split(' ').next().unwrap());
        assert_eq!(err(&format!("{ROUTE}{name}\n")).field, field);
    }
}

#[test]
fn log_is_a_tracing_filter_that_idemgate_log_overrides() {
    assert_eq!(
        Config::from_toml_with_env("", env_none).unwrap().log.filter,
        "info"
    );
    let c = Config::from_toml_with_env("log = \"warn,idemgate=debug\"", env_none).unwrap();
    assert_eq!(
        (c.log.filter.as_str(), c.log.field.as_str()),
        ("warn,idemgate=debug", "log")
    );
    for bad in ["idemgate=loud", ""] {
        let e = Config::from_toml_with_env(&format!("log = \"{bad}\""), env_none).unwrap_err();
        assert!(e.to_string().starts_with("log: "), "{e}");
    }
    let env = |n: &str| (n == "IDEMGATE_LOG").then(|| "debug".to_string());
    let c = Config::from_toml_with_env("log = \"warn\"", env).unwrap();
    assert_eq!(c.log.filter, "debug");
    assert_eq!(c.log.field, "IDEMGATE_LOG");
    assert_eq!(c.log.in_file.as_deref(), Some("warn"));
    let bad = |n: &str| (n == "IDEMGATE_LOG").then(|| "x=loud".to_string());
    let e = Config::from_toml_with_env("", bad).unwrap_err();
    assert!(e.to_string().starts_with("IDEMGATE_LOG: "), "{e}");
}
