//! The configuration: the TOML schema of SPEC.md, environment overrides, and the
//! validation that turns a file into a `Config` the rest of the program can trust.
//!
//! Everything that can be wrong with a configuration is found here, at start (or by
//! `check-config`), and reported with the name of the field: nothing downstream parses
//! or resolves configuration per request.

use std::collections::HashSet;
use std::fmt;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use http::Uri;
use serde::Deserialize;

mod bounds;
pub mod topology;

/// A configuration problem, always naming the field it is about.
#[derive(Debug, thiserror::Error)]
#[error("{field}: {message}")]
pub struct ConfigError {
    pub field: String,
    pub message: String,
}

impl ConfigError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError {
            field: field.into(),
            message: message.into(),
        }
    }
}

// ---------------------------------------------------------------------------------
// The file as written (every field optional, unknown fields refused).
// ---------------------------------------------------------------------------------

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    listen: Option<String>,
    admin_listen: Option<String>,
    upstream: Option<String>,
    upstream_timeout: Option<String>,
    max_body: Option<String>,
    max_response: Option<String>,
    shutdown_grace: Option<String>,
    header_timeout: Option<String>,
    body_timeout: Option<String>,
    max_in_flight: Option<toml::Value>,
    max_connections: Option<toml::Value>,
    worker_threads: Option<toml::Value>,
    store: Option<RawStore>,
    dedup: Option<RawDedup>,
    /// Admin API tokens (issue 8): one source or several, each `[name=]env:X|file:/p`.
    admin_token: Option<OneOrMany>,
    #[serde(rename = "async")]
    async_queue: Option<RawAsync>,
    #[serde(default, rename = "route")]
    routes: Vec<RawRoute>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStore {
    url: Option<String>,
    key_prefix: Option<String>,
    timeout: Option<String>,
    on_error: Option<String>,
    min_replicas_ack: Option<u32>,
    replicas_ack_timeout: Option<String>,
    breaker_threshold: Option<toml::Value>,
    breaker_cooldown: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDedup {
    lease: Option<String>,
    retention: Option<String>,
    in_flight: Option<String>,
    wait_timeout: Option<String>,
}

/// `[async]`: settings shared by every `mode = "async"` route (docs/async.md).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAsync {
    claim_idle: Option<String>,
    max_queue: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRoute {
    name: Option<String>,
    path: Option<String>,
    provider: Option<String>,
    #[serde(default)]
    secrets: Vec<String>,
    tolerance: Option<String>,
    key: Option<String>,
    upstream_path: Option<String>,
    // `custom` provider fields
    signature_header: Option<String>,
    hash: Option<String>,
    encoding: Option<String>,
    prefix: Option<String>,
    timestamp_header: Option<String>,
    signed: Option<String>,
    // `twilio`
    public_url: Option<String>,
    // `mode = "async"` (docs/async.md)
    mode: Option<String>,
    ack_status: Option<u16>,
    ack_body: Option<String>,
    max_attempts: Option<u32>,
    max_age: Option<String>,
    backoff: Option<String>,
    max_backoff: Option<String>,
    /// Keep the request for an operator's replay (issue 8).
    keep_payload: Option<bool>,
}

/// A field written as one string or a list of them.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

// ---------------------------------------------------------------------------------
// The validated configuration.
// ---------------------------------------------------------------------------------

#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    pub upstream: Uri,
    pub upstream_timeout: Duration,
    pub max_body: usize,
    /// Cap on an upstream answer's body: larger answers are not buffered or stored
    /// (the delivery gets 502 and its claim is released).
    pub max_response: usize,
    pub shutdown_grace: Duration,
    /// How long a connection may take to send a request's headers (and, on a fresh
    /// connection, its first bytes); past it the connection is closed.
    pub header_timeout: Duration,
    /// How long a request's body may take to arrive once its headers are in; past it
    /// the delivery gets 408 and the connection is closed.
    pub body_timeout: Duration,
    /// Deliveries handled at once; one more gets a fast 503 `overloaded`.
    pub max_in_flight: usize,
    /// Open webhook connections; a new one past it is closed at once.
    pub max_connections: usize,
    /// Threads that run deliveries: 1 (the default) = one thread, tokio's
    /// `current_thread` scheduler; more = the multi-thread scheduler with that many
    /// workers. One thread costs ~20% less CPU per delivery and halves the p99 added at a
    /// moderate rate (no cross-thread wake-ups; BENCHMARKS.md) and still serves more than
    /// 10,000 deliveries/s; raise it only when one core is not enough.
    pub worker_threads: usize,
    pub store: StoreConfig,
    pub dedup: DedupConfig,
    pub routes: Vec<RouteConfig>,
    /// Tokens that open the admin API (`/admin/`); none = the admin API is off.
    pub admin_tokens: Vec<AdminToken>,
    /// `[async]`: the delivery queue shared by the async routes.
    pub async_queue: AsyncConfig,
}

/// `[async]`: how the async routes' queues are worked (see docs/async.md).
#[derive(Debug, Clone)]
pub struct AsyncConfig {
    /// How long an entry may sit unrefreshed in a consumer's hands before a live
    /// consumer takes it over (the holder is presumed dead).
    pub claim_idle: Duration,
    /// How many unacknowledged entries a route's queue holds before new deliveries get
    /// 503 + Retry-After.
    pub max_queue: u64,
}

/// Whether a route forwards while the provider waits (`sync`) or acknowledges at once
/// and delivers from a durable queue (`async`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteMode {
    Sync,
    Async(AsyncRoute),
}

/// A `mode = "async"` route's acknowledgement and delivery policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AsyncRoute {
    pub ack_status: u16,
    pub ack_body: String,
    pub max_attempts: u32,
    pub max_age: Duration,
    pub backoff: Duration,
    pub max_backoff: Duration,
}

/// One admin token: the name its actions are logged under, and its secret.
#[derive(Debug, Clone)]
pub struct AdminToken {
    pub name: String,
    pub secret: Secret,
}

/// The shortest admin token accepted: a guessable token would open the admin API.
pub const ADMIN_TOKEN_MIN_LEN: usize = 16;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreUrl {
    Memory,
    Redis(String),
}

#[derive(Debug, Clone)]
pub struct StoreConfig {
    pub url: StoreUrl,
    /// False when neither a `[store]` section nor `IDEMGATE_STORE_URL` chose the store.
    pub explicit: bool,
    pub key_prefix: String,
    pub timeout: Duration,
    pub on_error: OnStoreError,
    /// Replicas that must confirm a claim or completion (`WAIT`) before it counts;
    /// 0 = off (Redis's asynchronous replication as it is).
    pub min_replicas_ack: u32,
    /// How long a claim or completion waits for those replicas.
    pub replicas_ack_timeout: Duration,
    /// Consecutive store failures that open the circuit breaker.
    pub breaker_threshold: u32,
    /// How long an open breaker answers without asking the store before it lets one
    /// probe through.
    pub breaker_cooldown: Duration,
}

/// What a delivery gets when the store cannot be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnStoreError {
    /// 503 + Retry-After: the provider keeps the delivery and retries.
    Reject,
    /// Forward without de-duplication (availability over exactly-once).
    Pass,
}

/// What a copy gets while the first copy of its delivery is still being processed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InFlightPolicy {
    Reject,
    Wait,
}

#[derive(Debug, Clone)]
pub struct DedupConfig {
    pub lease: Duration,
    pub retention: Duration,
    pub in_flight: InFlightPolicy,
    pub wait_timeout: Duration,
}

/// One secret as configured: where it comes from (kept for redacted display), its
/// resolved value (never displayed), and the key ID it answers for when the entry was
/// written `ID=source` (WeChat Pay's `PUB_KEY_ID_...`).
#[derive(Clone)]
pub struct Secret {
    pub source: String,
    pub value: Vec<u8>,
    pub id: Option<String>,
}

impl Secret {
    /// How the entry is shown: its ID (not secret) and its redacted source.
    pub fn display(&self) -> String {
        match &self.id {
            Some(id) => format!("{id}={}", redact_source(&self.source)),
            None => redact_source(&self.source),
        }
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret({})", self.display())
    }
}

/// Splits a WeChat Pay entry `ID=source` (ID of letters, digits and `_`) into its
/// parts. A PEM literal or `env:`/`file:` source never matches.
fn split_key_id(entry: &str) -> (Option<&str>, &str) {
    match entry.split_once('=') {
        Some((id, rest))
            if !id.is_empty()
                && !rest.is_empty()
                && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') =>
        {
            (Some(id), rest)
        }
        _ => (None, entry),
    }
}

/// How a secret source is shown: `env:` and `file:` names are not secret, literals are.
pub fn redact_source(source: &str) -> String {
    if source.starts_with("env:") || source.starts_with("file:") {
        source.to_string()
    } else {
        "<redacted literal>".to_string()
    }
}

#[derive(Debug, Clone)]
pub struct RouteConfig {
    pub name: String,
    pub path: String,
    pub provider: String,
    pub secrets: Vec<Secret>,
    pub tolerance: Option<Duration>,
    pub key: Option<String>,
    pub upstream_path: Option<String>,
    pub custom: CustomFields,
    /// Keep the request (size-capped, for `retention`) for an operator's replay.
    pub keep_payload: bool,
    pub mode: RouteMode,
}

/// The fields that only some providers read.
#[derive(Debug, Clone, Default)]
pub struct CustomFields {
    pub signature_header: Option<String>,
    pub hash: Option<String>,
    pub encoding: Option<String>,
    pub prefix: Option<String>,
    pub timestamp_header: Option<String>,
    pub signed: Option<String>,
    pub public_url: Option<String>,
}

impl Config {
    /// Loads the file (if any), applies the environment overrides and validates.
    pub fn load(path: Option<&Path>) -> Result<Config, ConfigError> {
        let text = match path {
            Some(p) => std::fs::read_to_string(p).map_err(|e| {
                ConfigError::new("config", format!("cannot read {}: {e}", p.display()))
            })?,
            None => String::new(),
        };
        Self::from_toml_with_env(&text, |name| std::env::var(name).ok())
    }

    /// Parses and validates TOML text; `env` looks up environment variables (for the
    /// `IDEMGATE_*` overrides and `env:` secrets), so tests need not touch the process
    /// environment.
    pub fn from_toml_with_env(
        text: &str,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        let raw: RawConfig = toml::from_str(text).map_err(|e| {
            let msg = e.message().to_string();
            // toml names unknown fields in the message; point at the section too.
            let field = e
                .span()
                .and_then(|s| text.get(s))
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty() && s.len() < 80)
                .unwrap_or_else(|| "config".to_string());
            ConfigError::new(field, msg)
        })?;
        validate(raw, &env)
    }

    /// Whether duplicates are only caught within this process.
    pub fn memory_store_warning(&self) -> Option<&'static str> {
        (self.store.url == StoreUrl::Memory).then_some(
            "the store is the in-memory store: duplicates are only caught per replica; \
             configure [store] url = \"redis://...\" to share claims across replicas",
        )
    }

    /// The effective configuration as TOML, with every secret redacted.
    pub fn redacted_toml(&self) -> String {
        use std::fmt::Write;
        let d = |d: Duration| humantime::format_duration(d).to_string();
        let q = |s: &str| toml::Value::String(s.to_string()).to_string();
        let mut out = String::new();
        let _ = writeln!(out, "listen = {}", q(&self.listen.to_string()));
        let _ = writeln!(out, "admin_listen = {}", q(&self.admin_listen.to_string()));
        let _ = writeln!(out, "upstream = {}", q(&self.upstream.to_string()));
        let _ = writeln!(out, "upstream_timeout = {}", q(&d(self.upstream_timeout)));
        let _ = writeln!(out, "max_body = {}", q(&self.max_body.to_string()));
        let _ = writeln!(out, "max_response = {}", q(&self.max_response.to_string()));
        let _ = writeln!(out, "shutdown_grace = {}", q(&d(self.shutdown_grace)));
        let _ = writeln!(out, "header_timeout = {}", q(&d(self.header_timeout)));
        let _ = writeln!(out, "body_timeout = {}", q(&d(self.body_timeout)));
        let _ = writeln!(out, "max_in_flight = {}", self.max_in_flight);
        let _ = writeln!(out, "max_connections = {}", self.max_connections);
        let _ = writeln!(out, "worker_threads = {}", self.worker_threads);
        if !self.admin_tokens.is_empty() {
            let tokens: Vec<String> = self
                .admin_tokens
                .iter()
                .map(|t| q(&format!("{}={}", t.name, redact_source(&t.secret.source))))
                .collect();
            let _ = writeln!(out, "admin_token = [{}]", tokens.join(", "));
        }
        let _ = writeln!(out, "\n[store]");
        let url = match &self.store.url {
            StoreUrl::Memory => "memory".to_string(),
            StoreUrl::Redis(u) => redact_url(u),
        };
        let _ = writeln!(out, "url = {}", q(&url));
        let _ = writeln!(out, "key_prefix = {}", q(&self.store.key_prefix));
        let _ = writeln!(out, "timeout = {}", q(&d(self.store.timeout)));
        let on_error = match self.store.on_error {
            OnStoreError::Reject => "reject",
            OnStoreError::Pass => "pass",
        };
        let _ = writeln!(out, "on_error = {}", q(on_error));
        let _ = writeln!(out, "min_replicas_ack = {}", self.store.min_replicas_ack);
        let _ = writeln!(
            out,
            "replicas_ack_timeout = {}",
            q(&d(self.store.replicas_ack_timeout))
        );
        let _ = writeln!(out, "breaker_threshold = {}", self.store.breaker_threshold);
        let _ = writeln!(
            out,
            "breaker_cooldown = {}",
            q(&d(self.store.breaker_cooldown))
        );
        let _ = writeln!(out, "\n[dedup]");
        let _ = writeln!(out, "lease = {}", q(&d(self.dedup.lease)));
        let _ = writeln!(out, "retention = {}", q(&d(self.dedup.retention)));
        let in_flight = match self.dedup.in_flight {
            InFlightPolicy::Reject => "reject",
            InFlightPolicy::Wait => "wait",
        };
        let _ = writeln!(out, "in_flight = {}", q(in_flight));
        let _ = writeln!(out, "wait_timeout = {}", q(&d(self.dedup.wait_timeout)));
        let _ = writeln!(out, "\n[async]");
        let _ = writeln!(out, "claim_idle = {}", q(&d(self.async_queue.claim_idle)));
        let _ = writeln!(out, "max_queue = {}", self.async_queue.max_queue);
        for r in &self.routes {
            let _ = writeln!(out, "\n[[route]]");
            let _ = writeln!(out, "name = {}", q(&r.name));
            if r.keep_payload {
                let _ = writeln!(out, "keep_payload = true");
            }
            let _ = writeln!(out, "path = {}", q(&r.path));
            let _ = writeln!(out, "provider = {}", q(&r.provider));
            let secrets: Vec<String> = r.secrets.iter().map(|s| q(&s.display())).collect();
            let _ = writeln!(out, "secrets = [{}]", secrets.join(", "));
            if let Some(t) = r.tolerance {
                let _ = writeln!(out, "tolerance = {}", q(&d(t)));
            }
            if let Some(k) = &r.key {
                let _ = writeln!(out, "key = {}", q(k));
            }
            if let Some(p) = &r.upstream_path {
                let _ = writeln!(out, "upstream_path = {}", q(p));
            }
            if let RouteMode::Async(a) = &r.mode {
                let _ = writeln!(out, "mode = \"async\"");
                let _ = writeln!(out, "ack_status = {}", a.ack_status);
                let _ = writeln!(out, "ack_body = {}", q(&a.ack_body));
                let _ = writeln!(out, "max_attempts = {}", a.max_attempts);
                let _ = writeln!(out, "max_age = {}", q(&d(a.max_age)));
                let _ = writeln!(out, "backoff = {}", q(&d(a.backoff)));
                let _ = writeln!(out, "max_backoff = {}", q(&d(a.max_backoff)));
            }
            let c = &r.custom;
            for (name, v) in [
                ("signature_header", &c.signature_header),
                ("hash", &c.hash),
                ("encoding", &c.encoding),
                ("prefix", &c.prefix),
                ("timestamp_header", &c.timestamp_header),
                ("signed", &c.signed),
                ("public_url", &c.public_url),
            ] {
                if let Some(v) = v {
                    let _ = writeln!(out, "{name} = {}", q(v));
                }
            }
        }
        out
    }
}

/// Hides a password in a Redis URL (`redis://user:pw@host` → `redis://user:***@host`),
/// including a Sentinel URL's `sentinel_password=` option.
pub fn redact_url(url: &str) -> String {
    match url.split_once('?') {
        Some((base, query)) => {
            let query: Vec<String> = query
                .split('&')
                .map(|kv| match kv.split_once('=') {
                    Some((k, _)) if k.contains("password") => format!("{k}=***"),
                    _ => kv.to_string(),
                })
                .collect();
            format!("{}?{}", redact_authority(base), query.join("&"))
        }
        None => redact_authority(url),
    }
}

fn redact_authority(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_string();
    };
    let rest = &url[scheme_end + 3..];
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    match authority.rfind('@') {
        Some(at) => {
            let userinfo = &authority[..at];
            let user = userinfo.split(':').next().unwrap_or("");
            format!("{}://{}:***@{}", &url[..scheme_end], user, &rest[at + 1..])
        }
        None => url.to_string(),
    }
}

pub fn parse_duration(field: &str, s: &str) -> Result<Duration, ConfigError> {
    humantime::parse_duration(s.trim()).map_err(|e| {
        ConfigError::new(
            field,
            format!("`{s}` is not a duration like 30s or 72h ({e})"),
        )
    })
}

/// Parses `1MiB`, `512KiB`, `64KB`, `1000` (bytes).
pub fn parse_size(field: &str, s: &str) -> Result<usize, ConfigError> {
    let t = s.trim();
    let split = t
        .find(|c: char| !c.is_ascii_digit() && c != '_')
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .replace('_', "")
        .parse()
        .map_err(|_| ConfigError::new(field, format!("`{s}` is not a size like 1MiB or 64KiB")))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1000,
        "kib" => 1024,
        "m" | "mb" => 1000 * 1000,
        "mib" => 1024 * 1024,
        "g" | "gb" => 1000 * 1000 * 1000,
        "gib" => 1024 * 1024 * 1024,
        other => {
            return Err(ConfigError::new(
                field,
                format!("unknown size unit `{other}` (use B, KiB, MiB, GiB, KB, MB, GB)"),
            ));
        }
    };
    let bytes = n
        .checked_mul(mult)
        .filter(|b| *b > 0)
        .ok_or_else(|| ConfigError::new(field, format!("`{s}` must be a positive size")))?;
    usize::try_from(bytes).map_err(|_| ConfigError::new(field, "size too large"))
}

fn parse_addr(field: &str, s: &str) -> Result<SocketAddr, ConfigError> {
    s.trim().parse().map_err(|_| {
        ConfigError::new(
            field,
            format!("`{s}` is not an address like 0.0.0.0:8080 or 127.0.0.1:9090"),
        )
    })
}

fn parse_upstream(field: &str, s: &str) -> Result<Uri, ConfigError> {
    let uri: Uri = s
        .trim()
        .parse()
        .map_err(|e| ConfigError::new(field, format!("`{s}` is not a URL ({e})")))?;
    if uri.scheme_str() != Some("http") {
        return Err(ConfigError::new(
            field,
            "the upstream must be an http:// URL (the application beside the sidecar)",
        ));
    }
    if uri.authority().is_none() {
        return Err(ConfigError::new(
            field,
            "the upstream URL needs a host and port",
        ));
    }
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
        return Err(ConfigError::new(
            field,
            "the upstream URL is scheme://host:port only; use a route's upstream_path for paths",
        ));
    }
    Ok(uri)
}

/// Resolves `env:NAME`, `file:/path` or a literal into the secret's bytes.
pub fn resolve_secret(
    field: &str,
    source: &str,
    env: &impl Fn(&str) -> Option<String>,
) -> Result<Secret, ConfigError> {
    let value = if let Some(name) = source.strip_prefix("env:") {
        env(name).ok_or_else(|| {
            ConfigError::new(field, format!("environment variable {name} is not set"))
        })?
    } else if let Some(path) = source.strip_prefix("file:") {
        std::fs::read_to_string(path)
            .map_err(|e| ConfigError::new(field, format!("cannot read secret file {path}: {e}")))?
            .trim()
            .to_string()
    } else {
        source.to_string()
    };
    if value.is_empty() {
        return Err(ConfigError::new(
            field,
            format!("the secret from {} is empty", redact_source(source)),
        ));
    }
    Ok(Secret {
        source: source.to_string(),
        value: value.into_bytes(),
        id: None,
    })
}

/// A positive whole number, written as a TOML integer or a string of digits.
fn parse_count(field: &str, v: Option<toml::Value>, default: u64) -> Result<u64, ConfigError> {
    let n = match v {
        None => default,
        Some(toml::Value::Integer(i)) => u64::try_from(i)
            .map_err(|_| ConfigError::new(field, format!("`{i}` must be a positive number")))?,
        Some(toml::Value::String(s)) => s.trim().replace('_', "").parse().map_err(|_| {
            ConfigError::new(field, format!("`{s}` is not a whole number like 1024"))
        })?,
        Some(other) => {
            return Err(ConfigError::new(
                field,
                format!("`{other}` is not a whole number like 1024"),
            ));
        }
    };
    if n == 0 {
        return Err(ConfigError::new(field, "must be at least 1"));
    }
    Ok(n)
}

fn one_of<T: Copy>(field: &str, s: &str, options: &[(&str, T)]) -> Result<T, ConfigError> {
    options
        .iter()
        .find(|(name, _)| *name == s)
        .map(|(_, v)| *v)
        .ok_or_else(|| {
            let names: Vec<&str> = options.iter().map(|(n, _)| *n).collect();
            ConfigError::new(field, format!("`{s}` is not one of: {}", names.join(", ")))
        })
}

/// The admin tokens: `IDEMGATE_ADMIN_TOKEN` (named `admin`) and the `admin_token`
/// entries, each `[name=]source` with source `env:X`, `file:/path` or a literal.
fn admin_tokens(
    raw: Option<OneOrMany>,
    env: &impl Fn(&str) -> Option<String>,
) -> Result<Vec<AdminToken>, ConfigError> {
    let entries = match raw {
        None => vec![],
        Some(OneOrMany::One(s)) => vec![s],
        Some(OneOrMany::Many(v)) => v,
    };
    let mut out = Vec::new();
    if env("IDEMGATE_ADMIN_TOKEN").is_some_and(|v| !v.is_empty()) {
        entries_push(
            &mut out,
            "IDEMGATE_ADMIN_TOKEN",
            "admin",
            "env:IDEMGATE_ADMIN_TOKEN",
            env,
        )?;
    }
    for (i, e) in entries.iter().enumerate() {
        let field = format!("admin_token[{i}]");
        let (name, source) = match split_key_id(e) {
            (Some(n), s) => (n, s),
            _ => ("admin", e.as_str()),
        };
        if out.iter().any(|t: &AdminToken| t.name == name) {
            return Err(ConfigError::new(
                field,
                format!("two admin tokens are named `{name}`: write them `name=source`"),
            ));
        }
        entries_push(&mut out, &field, name, source, env)?;
    }
    Ok(out)
}

fn entries_push(
    out: &mut Vec<AdminToken>,
    field: &str,
    name: &str,
    source: &str,
    env: &impl Fn(&str) -> Option<String>,
) -> Result<(), ConfigError> {
    let secret = resolve_secret(field, source, env)?;
    if secret.value.len() < ADMIN_TOKEN_MIN_LEN {
        return Err(ConfigError::new(
            field,
            format!("an admin token must be at least {ADMIN_TOKEN_MIN_LEN} characters"),
        ));
    }
    out.push(AdminToken {
        name: name.to_string(),
        secret,
    });
    Ok(())
}

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
    Ok(RouteMode::Async(AsyncRoute {
        ack_status,
        ack_body: r.ack_body.clone().unwrap_or_default(),
        max_attempts,
        max_age: dur("max_age", &r.max_age, "24h")?,
        backoff,
        max_backoff,
    }))
}

fn validate(raw: RawConfig, env: &impl Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
    let pick = |env_name: &str, file: Option<String>, default: &str| -> (String, &'static str) {
        match env(env_name).filter(|v| !v.is_empty()) {
            Some(v) => (v, "env"),
            None => (file.unwrap_or_else(|| default.to_string()), "file"),
        }
    };
    let field_name = |name: &str, env_name: &str, from: &str| -> String {
        if from == "env" {
            env_name.to_string()
        } else {
            name.to_string()
        }
    };

    let (listen, from) = pick("IDEMGATE_LISTEN", raw.listen, "0.0.0.0:8080");
    let listen = parse_addr(&field_name("listen", "IDEMGATE_LISTEN", from), &listen)?;
    let (admin, from) = pick("IDEMGATE_ADMIN_LISTEN", raw.admin_listen, "0.0.0.0:9090");
    let admin_listen = parse_addr(
        &field_name("admin_listen", "IDEMGATE_ADMIN_LISTEN", from),
        &admin,
    )?;
    if listen == admin_listen && listen.port() != 0 {
        return Err(ConfigError::new(
            "admin_listen",
            "must differ from listen: the admin surface is kept off the webhook port",
        ));
    }
    let (upstream, from) = pick("IDEMGATE_UPSTREAM", raw.upstream, "http://127.0.0.1:3000");
    let upstream = parse_upstream(
        &field_name("upstream", "IDEMGATE_UPSTREAM", from),
        &upstream,
    )?;

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
    let worker_threads = parse_count("worker_threads", raw.worker_threads, 1)?;
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
    let url = if url_text == "memory" {
        StoreUrl::Memory
    } else {
        // One server, a Redis Cluster or a Sentinel-managed master: see config::topology.
        topology::Topology::parse(&url_text)
            .map_err(|e| ConfigError::new(url_field, format!("`{}` {e}", redact_url(&url_text))))?;
        StoreUrl::Redis(url_text)
    };
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
    if min_replicas_ack > 0 && url == StoreUrl::Memory {
        return Err(ConfigError::new(
            "store.min_replicas_ack",
            "needs a Redis store: the in-memory store has no replicas",
        ));
    }
    if min_replicas_ack > 0 && replicas_ack_timeout >= timeout {
        return Err(ConfigError::new(
            "store.replicas_ack_timeout",
            "must be shorter than store.timeout: the wait for replicas is part of one store round trip",
        ));
    }
    let store = StoreConfig {
        url,
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
    };

    let rd = raw.dedup.unwrap_or_default();
    let dedup = DedupConfig {
        lease: dur("dedup.lease", rd.lease, "30s")?,
        retention: dur("dedup.retention", rd.retention, "72h")?,
        in_flight: one_of(
            "dedup.in_flight",
            rd.in_flight.as_deref().unwrap_or("reject"),
            &[
                ("reject", InFlightPolicy::Reject),
                ("wait", InFlightPolicy::Wait),
            ],
        )?,
        wait_timeout: dur("dedup.wait_timeout", rd.wait_timeout, "5s")?,
    };

    let mut routes = Vec::with_capacity(raw.routes.len());
    let mut names = HashSet::new();
    let mut paths = HashSet::new();
    for (i, r) in raw.routes.into_iter().enumerate() {
        let at = |f: &str| format!("route[{i}].{f}");
        let mode = route_mode(&r, &at)?;
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
        routes.push(RouteConfig {
            mode,
            name,
            path,
            provider,
            secrets,
            tolerance,
            key: r.key,
            upstream_path: r.upstream_path,
            keep_payload: r.keep_payload.unwrap_or(false),
            custom: CustomFields {
                signature_header: r.signature_header,
                hash: r.hash,
                encoding: r.encoding,
                prefix: r.prefix,
                timestamp_header: r.timestamp_header,
                signed: r.signed,
                public_url: r.public_url,
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
        store,
        dedup,
        routes,
        admin_tokens: admin_tokens(raw.admin_token, env)?,
    };
    bounds::relations(&config)?;
    // Provider-specific checks (secret formats, tolerance rules, key sources) belong to
    // the providers; building every route once here reports them at start.
    for (i, r) in config.routes.iter().enumerate() {
        let route = crate::providers::build_route(r, &config)
            .map_err(|e| ConfigError::new(format!("route[{i}].{}", e.field), e.message))?;
        if let Some(tol) = route.tolerance()
            && config.dedup.retention <= tol
        {
            return Err(ConfigError::new(
                "dedup.retention",
                format!(
                    "must be longer than route `{}`'s tolerance ({}): otherwise a replayed \
                     request inside the window could find its key forgotten",
                    r.name,
                    humantime::format_duration(tol)
                ),
            ));
        }
    }
    Ok(config)
}

#[cfg(test)]
mod tests {
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
        assert_eq!(c.worker_threads, 1);
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
        assert_eq!(err("worker_threads = 0").field, "worker_threads");
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
        let c =
            Config::from_toml_with_env("listen = \"0.0.0.0:1\"\n[store]\nurl = \"memory\"\n", env)
                .unwrap();
        assert_eq!(c.listen.port(), 1111);
        assert_eq!(c.admin_listen.port(), 2222);
        assert_eq!(c.upstream.port_u16(), Some(3333));
        assert_eq!(
            c.store.url,
            StoreUrl::Redis("redis://127.0.0.1:4444/1".into())
        );
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
    fn route_errors_name_the_route_field() {
        let two_paths = format!(
            "{ROUTE}{}",
            ROUTE.replace("name = \"wh\"", "name = \"wh2\"")
        );
        assert_eq!(err(&two_paths).field, "route[1].path");
        let no_secret = ROUTE.replace(
            "secrets = [\"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"]",
            "secrets = []",
        );
        assert_eq!(err(&no_secret).field, "route[0].secrets");
        let env_secret = ROUTE.replace(
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            "env:IDEMGATE_TEST_UNSET",
        );
        let e = err(&env_secret);
        assert_eq!(e.field, "route[0].secrets[0]");
        assert!(e.message.contains("IDEMGATE_TEST_UNSET"));
        let file_secret = ROUTE.replace(
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            "file:/nonexistent/secret",
        );
        assert_eq!(err(&file_secret).field, "route[0].secrets[0]");
        let bad_name = ROUTE.replace("name = \"wh\"", "name = \"a b{c}\"");
        assert_eq!(err(&bad_name).field, "route[0].name");
        let bad_provider =
            ROUTE.replace("provider = \"standard\"", "provider = \"carrier-pigeon\"");
        assert_eq!(err(&bad_provider).field, "route[0].provider");
    }

    #[test]
    fn retention_must_exceed_every_tolerance() {
        let text = format!("[dedup]\nretention = \"5m\"\n{ROUTE}");
        assert_eq!(err(&text).field, "dedup.retention");
        let text = format!("[dedup]\nretention = \"5m1s\"\n{ROUTE}");
        assert!(Config::from_toml_with_env(&text, env_none).is_ok());
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
}
