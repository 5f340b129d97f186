//! The validation that turns the file as written (and the environment) into a
//! `Config`: defaults, ranges and relations between fields (each provider's own checks
//! run when the routes are built, in `providers::Routes::build`).

use std::collections::HashSet;
use std::time::Duration;

use super::overrides::{operator_tokens, overridden, resolve_secret};
use super::parse::{
    one_of, parse_addr, parse_count, parse_duration, parse_size, parse_upstream, split_key_id,
};
use super::raw::{RawConfig, RawRoute};
use super::{
    AsyncConfig, AsyncRoute, Config, ConfigError, CustomFields, DedupConfig, DedupOverrides,
    HandshakeMode, InFlightPolicy, KeylessPolicy, OnStoreError, RouteConfig, RouteMode,
    StoreConfig, StoreUrl, Throttle, bounds,
};

/// A route's `mode` and, for `async`, its acknowledgement and delivery policy; the
/// async-only fields on a sync route are errors (they would silently do nothing).
fn route_mode(r: &RawRoute, at: &impl Fn(&str) -> String) -> Result<RouteMode, ConfigError> {
    let mode = r.mode.as_deref().unwrap_or("sync");
    let is_async = one_of(&at("mode"), mode, &[("sync", false), ("async", true)])?;
    if !is_async {
        for (name, set) in [
            ("ack_status", r.ack_status.is_some()),
            ("ack_body", r.ack_body.is_some()),
            ("max_attempts", r.max_attempts.is_some()),
            ("max_age", r.max_age.is_some()),
            ("backoff", r.backoff.is_some()),
            ("max_backoff", r.max_backoff.is_some()),
            ("max_concurrency", r.max_concurrency.is_some()),
            ("rate", r.rate.is_some()),
            ("burst", r.burst.is_some()),
            ("order_key", r.order_key.is_some()),
            ("retry_after_cap", r.retry_after_cap.is_some()),
        ] {
            if set {
                return Err(ConfigError::new(
                    at(name),
                    "only applies to mode = \"async\" routes",
                ));
            }
        }
        return Ok(RouteMode::Sync);
    }
    let dur = |field: &str, v: &Option<String>, default: &str| -> Result<Duration, ConfigError> {
        let d = parse_duration(&at(field), v.as_deref().unwrap_or(default))?;
        if d.is_zero() {
            return Err(ConfigError::new(at(field), "must be greater than zero"));
        }
        bounds::within(field, &at(field), d)
    };
    let ack_status = r.ack_status.unwrap_or(200);
    if !(200..300).contains(&ack_status) {
        return Err(ConfigError::new(
            at("ack_status"),
            "must be a 2xx status: anything else tells the provider the delivery failed",
        ));
    }
    let max_attempts = r.max_attempts.unwrap_or(10);
    if max_attempts == 0 {
        return Err(ConfigError::new(at("max_attempts"), "must be at least 1"));
    }
    let backoff = dur("backoff", &r.backoff, "1s")?;
    let max_backoff = dur("max_backoff", &r.max_backoff, "5m")?;
    if max_backoff < backoff {
        return Err(ConfigError::new(
            at("max_backoff"),
            "must not be shorter than backoff",
        ));
    }
    let order_key = match r.order_key.as_deref().map(str::trim) {
        Some("") => return Err(ConfigError::new(at("order_key"), "must not be empty")),
        other => other.map(str::to_string),
    };
    Ok(RouteMode::Async(AsyncRoute {
        ack_status,
        ack_body: r.ack_body.clone().unwrap_or_default(),
        max_attempts,
        max_age: dur("max_age", &r.max_age, "24h")?,
        backoff,
        max_backoff,
        throttle: throttle(r, at, &dur)?,
        order_key,
    }))
}

/// `in_flight` as written (`[dedup]`'s or a route's).
fn in_flight(field: &str, text: &str) -> Result<InFlightPolicy, ConfigError> {
    one_of(
        field,
        text,
        &[
            ("reject", InFlightPolicy::Reject),
            ("wait", InFlightPolicy::Wait),
        ],
    )
}

/// A route's own `lease`, `retention`, `in_flight` and `wait_timeout`, each in the
/// range of its `[dedup]` namesake (their relations: `bounds::relations`).
fn route_dedup(r: &RawRoute, at: &impl Fn(&str) -> String) -> Result<DedupOverrides, ConfigError> {
    let dur = |field: &str, v: &Option<String>| -> Result<Option<Duration>, ConfigError> {
        let Some(text) = v else { return Ok(None) };
        let d = parse_duration(&at(field), text)?;
        if d.is_zero() {
            return Err(ConfigError::new(at(field), "must be greater than zero"));
        }
        bounds::within(&format!("dedup.{field}"), &at(field), d).map(Some)
    };
    Ok(DedupOverrides {
        lease: dur("lease", &r.lease)?,
        retention: dur("retention", &r.retention)?,
        in_flight: match &r.in_flight {
            Some(text) => Some(in_flight(&at("in_flight"), text)?),
            None => None,
        },
        wait_timeout: dur("wait_timeout", &r.wait_timeout)?,
    })
}

/// The most deliveries per second `rate` (and `burst`) accept.
const MAX_RATE: f64 = 1_000_000.0;
/// The smallest `store.max_memory`: a few thousand deliveries.
const MIN_MAX_MEMORY: u64 = 1024 * 1024;

/// An async route's delivery limits: `max_concurrency`, `rate`, `burst`, `retry_after_cap`.
fn throttle(
    r: &RawRoute,
    at: &impl Fn(&str) -> String,
    dur: &impl Fn(&str, &Option<String>, &str) -> Result<Duration, ConfigError>,
) -> Result<Throttle, ConfigError> {
    if r.max_concurrency == Some(0) {
        return Err(ConfigError::new(
            at("max_concurrency"),
            "must be at least 1",
        ));
    }
    let positive = |field: &str, v: f64| {
        if v.is_finite() && v > 0.0 && v <= MAX_RATE {
            Ok(v)
        } else {
            Err(ConfigError::new(
                at(field),
                format!("`{v}` must be a number above 0 and at most {MAX_RATE}"),
            ))
        }
    };
    let rate = r.rate.map(|v| positive("rate", v)).transpose()?;
    let burst = match (r.burst, rate) {
        (Some(_), None) => {
            return Err(ConfigError::new(
                at("burst"),
                "only applies with a rate (it is the rate's token bucket)",
            ));
        }
        (Some(b), Some(_)) => {
            let b = positive("burst", b)?;
            if b < 1.0 {
                return Err(ConfigError::new(
                    at("burst"),
                    "must be at least 1: a smaller bucket never holds a whole delivery",
                ));
            }
            b
        }
        (None, rate) => rate.unwrap_or(1.0).max(1.0),
    };
    Ok(Throttle {
        max_concurrency: r.max_concurrency,
        rate,
        burst,
        retry_after_cap: dur("retry_after_cap", &r.retry_after_cap, "1h")?,
    })
}

pub(super) fn validate(
    raw: RawConfig,
    env: &impl Fn(&str) -> Option<String>,
) -> Result<Config, ConfigError> {
    let (field, listen) = overridden(env, "IDEMGATE_LISTEN", "listen", raw.listen, "0.0.0.0:8080");
    let listen = parse_addr(&field, &listen)?;
    let (field, admin) = overridden(
        env,
        "IDEMGATE_ADMIN_LISTEN",
        "admin_listen",
        raw.admin_listen,
        "0.0.0.0:9090",
    );
    let admin_listen = parse_addr(&field, &admin)?;
    if listen == admin_listen && listen.port() != 0 {
        return Err(ConfigError::new(
            "admin_listen",
            "must differ from listen: the admin surface is kept off the webhook port",
        ));
    }
    let (field, upstream) = overridden(
        env,
        "IDEMGATE_UPSTREAM",
        "upstream",
        raw.upstream,
        "http://127.0.0.1:3000",
    );
    let upstream = parse_upstream(&field, &upstream)?;

    let dur = |field: &str, v: Option<String>, default: &str| -> Result<Duration, ConfigError> {
        let d = parse_duration(field, v.as_deref().unwrap_or(default))?;
        if d.is_zero() {
            return Err(ConfigError::new(field, "must be greater than zero"));
        }
        bounds::within(field, field, d)
    };
    let upstream_timeout = dur("upstream_timeout", raw.upstream_timeout, "10s")?;
    let max_body = parse_size("max_body", raw.max_body.as_deref().unwrap_or("1MiB"))?;
    let max_response = parse_size(
        "max_response",
        raw.max_response.as_deref().unwrap_or("1MiB"),
    )?;
    let shutdown_grace = dur("shutdown_grace", raw.shutdown_grace, "25s")?;
    let header_timeout = dur("header_timeout", raw.header_timeout, "10s")?;
    let body_timeout = dur("body_timeout", raw.body_timeout, "10s")?;
    let max_in_flight = parse_count("max_in_flight", raw.max_in_flight, 1024)?;
    let max_connections = parse_count("max_connections", raw.max_connections, 4096)?;
    // A semaphore holds at most usize::MAX >> 3 permits; anything near is "unbounded".
    let cap = |field: &str, n: u64| -> Result<usize, ConfigError> {
        usize::try_from(n)
            .ok()
            .filter(|n| *n <= 1 << 30)
            .ok_or_else(|| ConfigError::new(field, "must be at most 1073741824"))
    };
    let max_in_flight = cap("max_in_flight", max_in_flight)?;
    let max_connections = cap("max_connections", max_connections)?;
    // Absent: one runtime per CPU of the quota; an explicit number wins.
    let worker_threads_from_quota = raw.worker_threads.is_none();
    let worker_threads = match raw.worker_threads {
        None => super::cpus::default_worker_threads() as u64,
        given => parse_count("worker_threads", given, 1).map_err(|e| {
            ConfigError::new(
                "worker_threads",
                format!("{} (leave it out for one per CPU of the quota)", e.message),
            )
        })?,
    };
    let worker_threads = usize::try_from(worker_threads)
        .ok()
        .filter(|n| *n <= 256)
        .ok_or_else(|| ConfigError::new("worker_threads", "must be at most 256"))?;

    let store_section = raw.store.is_some();
    let rs = raw.store.unwrap_or_default();
    let env_url = env("IDEMGATE_STORE_URL").filter(|v| !v.is_empty());
    let explicit = store_section || env_url.is_some();
    let (url_field, url_text) = match env_url {
        Some(u) => ("IDEMGATE_STORE_URL", u),
        None if store_section => (
            "store.url",
            rs.url
                .unwrap_or_else(|| "redis://127.0.0.1:6379/0".to_string()),
        ),
        None => ("store.url", "memory".to_string()),
    };
    let url = super::store_url::parse_store_url(url_field, &url_text)?;
    let fsync = super::store_url::parse_fsync(&url, rs.fsync.as_deref())?;
    let key_prefix = rs.key_prefix.unwrap_or_else(|| "idemgate".to_string());
    if key_prefix.is_empty()
        || key_prefix.contains(['{', '}'])
        || key_prefix.contains(char::is_whitespace)
    {
        return Err(ConfigError::new(
            "store.key_prefix",
            "must be non-empty, without braces or spaces (braces are the Redis Cluster hash tag)",
        ));
    }
    let timeout = dur("store.timeout", rs.timeout, "1s")?;
    let min_replicas_ack = rs.min_replicas_ack.unwrap_or(0);
    let replicas_ack_timeout = dur(
        "store.replicas_ack_timeout",
        rs.replicas_ack_timeout,
        "100ms",
    )?;
    if min_replicas_ack > 0 && !matches!(url, StoreUrl::Redis(_)) {
        return Err(ConfigError::new(
            "store.min_replicas_ack",
            "needs a Redis store: the in-memory and file stores have no replicas",
        ));
    }
    if min_replicas_ack > 0 && replicas_ack_timeout >= timeout {
        return Err(ConfigError::new(
            "store.replicas_ack_timeout",
            "must be shorter than store.timeout: the wait for replicas is part of one store round trip",
        ));
    }
    let max_memory = match rs.max_memory.as_deref() {
        Some(_) if matches!(url, StoreUrl::Redis(_)) => {
            return Err(ConfigError::new(
                "store.max_memory",
                "bounds the in-process and file stores only: a Redis store is bounded by its own maxmemory",
            ));
        }
        Some(s) => parse_size("store.max_memory", s)? as u64,
        None => super::DEFAULT_MAX_MEMORY,
    };
    if max_memory < MIN_MAX_MEMORY {
        return Err(ConfigError::new(
            "store.max_memory",
            "must be at least 1MiB: a smaller store would forget deliveries within seconds",
        ));
    }
    let store = StoreConfig {
        url,
        fsync,
        max_memory,
        explicit,
        key_prefix,
        timeout,
        min_replicas_ack,
        replicas_ack_timeout,
        on_error: one_of(
            "store.on_error",
            rs.on_error.as_deref().unwrap_or("reject"),
            &[
                ("reject", OnStoreError::Reject),
                ("pass", OnStoreError::Pass),
            ],
        )?,
        breaker_threshold: u32::try_from(parse_count(
            "store.breaker_threshold",
            rs.breaker_threshold,
            5,
        )?)
        .map_err(|_| ConfigError::new("store.breaker_threshold", "is too large"))?,
        breaker_cooldown: dur("store.breaker_cooldown", rs.breaker_cooldown, "1s")?,
        recent_per_route: recent_per_route(rs.recent_per_route)?,
    };

    let rd = raw.dedup.unwrap_or_default();
    let dedup = DedupConfig {
        lease: dur("dedup.lease", rd.lease, "30s")?,
        retention: dur("dedup.retention", rd.retention, "72h")?,
        in_flight: in_flight(
            "dedup.in_flight",
            rd.in_flight.as_deref().unwrap_or("reject"),
        )?,
        wait_timeout: dur("dedup.wait_timeout", rd.wait_timeout, "5s")?,
    };

    let mut routes = Vec::with_capacity(raw.routes.len());
    let mut names = HashSet::new();
    let mut paths = HashSet::new();
    for (i, r) in raw.routes.into_iter().enumerate() {
        let at = |f: &str| format!("route[{i}].{f}");
        let mode = route_mode(&r, &at)?;
        let route_dedup = route_dedup(&r, &at)?;
        let name = r
            .name
            .ok_or_else(|| ConfigError::new(at("name"), "is required"))?;
        if name.is_empty()
            || name == "-"
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.')
        {
            return Err(ConfigError::new(
                at("name"),
                format!(
                    "`{name}` must be letters, digits, `_`, `-` or `.` (it is used in Redis keys and metric labels)"
                ),
            ));
        }
        if !names.insert(name.clone()) {
            return Err(ConfigError::new(
                at("name"),
                format!("`{name}` is used by two routes"),
            ));
        }
        let path = r
            .path
            .ok_or_else(|| ConfigError::new(at("path"), "is required"))?;
        if !path.starts_with('/') || path.contains('?') {
            return Err(ConfigError::new(
                at("path"),
                "must start with / and hold no query",
            ));
        }
        if !paths.insert(path.clone()) {
            return Err(ConfigError::new(
                at("path"),
                format!("`{path}` is used by two routes"),
            ));
        }
        let provider = r
            .provider
            .ok_or_else(|| ConfigError::new(at("provider"), "is required"))?;
        if r.secrets.is_empty() {
            return Err(ConfigError::new(
                at("secrets"),
                "at least one secret is required",
            ));
        }
        let mut secrets = Vec::with_capacity(r.secrets.len());
        for (j, s) in r.secrets.iter().enumerate() {
            let (id, source) = if provider == "wechatpay" {
                split_key_id(s)
            } else {
                (None, s.as_str())
            };
            let mut secret = resolve_secret(&format!("route[{i}].secrets[{j}]"), source, env)?;
            secret.id = id.map(str::to_string);
            secrets.push(secret);
        }
        let tolerance = match r.tolerance {
            Some(t) => Some(bounds::within(
                "tolerance",
                &at("tolerance"),
                parse_duration(&at("tolerance"), &t)?,
            )?),
            None => None,
        };
        if let Some(p) = &r.upstream_path
            && (!p.starts_with('/') || p.contains('?'))
        {
            return Err(ConfigError::new(
                at("upstream_path"),
                "must start with / and hold no query",
            ));
        }
        let handshake = match &r.handshake {
            Some(h) => Some(one_of(
                &at("handshake"),
                h,
                &[
                    ("forward", HandshakeMode::Forward),
                    ("answer", HandshakeMode::Answer),
                ],
            )?),
            None => None,
        };
        let keyless = match &r.keyless {
            Some(k) => Some(one_of(
                &at("keyless"),
                k,
                &[
                    ("forward", KeylessPolicy::Forward),
                    ("reject", KeylessPolicy::Reject),
                ],
            )?),
            None => None,
        };
        let verify_token = match &r.verify_token {
            Some(t) => Some(resolve_secret(&at("verify_token"), t, env)?),
            None => None,
        };
        routes.push(RouteConfig {
            mode,
            dedup: route_dedup,
            keyless,
            name,
            path,
            provider,
            secrets,
            tolerance,
            key: r.key,
            upstream_path: r.upstream_path,
            keep_payload: r.keep_payload.unwrap_or(false),
            replay_body: r.replay_body.unwrap_or(true),
            custom: CustomFields {
                signature_header: r.signature_header,
                hash: r.hash,
                encoding: r.encoding,
                prefix: r.prefix,
                timestamp_header: r.timestamp_header,
                signed: r.signed,
                public_url: r.public_url,
                handshake,
                verify_token,
            },
        });
    }

    let ra = raw.async_queue.unwrap_or_default();
    let async_queue = AsyncConfig {
        claim_idle: dur("async.claim_idle", ra.claim_idle, "30s")?,
        max_queue: match ra.max_queue.unwrap_or(100_000) {
            0 => return Err(ConfigError::new("async.max_queue", "must be at least 1")),
            n => n,
        },
    };
    let config = Config {
        async_queue,
        listen,
        admin_listen,
        upstream,
        upstream_timeout,
        max_body,
        max_response,
        shutdown_grace,
        header_timeout,
        body_timeout,
        max_in_flight,
        max_connections,
        worker_threads,
        worker_threads_from_quota,
        store,
        dedup,
        routes,
        operator_tokens: operator_tokens(raw.admin_token, env)?,
        tracing: super::tracing::tracing(raw.tracing, env)?,
        log: super::overrides::log_filter(env, raw.log)?,
        source: None,
    };
    bounds::relations(&config)?;
    Ok(config)
}

/// `store.recent_per_route`: 1 to 10,000,000 (default [`super::RECENT_PER_ROUTE`]).
fn recent_per_route(v: Option<toml::Value>) -> Result<usize, ConfigError> {
    const MAX: u64 = 10_000_000;
    let n = parse_count("store.recent_per_route", v, super::RECENT_PER_ROUTE as u64)?;
    if n > MAX {
        return Err(ConfigError::new(
            "store.recent_per_route",
            format!("`{n}` is more than {MAX}"),
        ));
    }
    usize::try_from(n).map_err(|_| ConfigError::new("store.recent_per_route", "is too large"))
}
