//! The configuration: the TOML schema (README's Configuration section), environment
//! overrides, and the validation that turns a file into a `Config` the rest of the
//! program can trust.
//!
//! Everything that can be wrong with a configuration is found at start (or by
//! `check-config`), here or, for what a provider checks, when `providers::Routes` builds
//! the routes, and reported with the name of the field: nothing downstream parses or
//! resolves configuration per request.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use http::Uri;

mod bounds;
pub mod cpus;
mod overrides;
mod parse;
mod raw;
mod redact;
mod store_url;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_dedup;
#[cfg(test)]
mod tests_redact;
pub mod topology;
mod tracing;
mod validate;

pub use overrides::resolve_secret;
pub use parse::{parse_duration, parse_size};
pub use redact::{redact_source, redact_url};
pub use tracing::{Root, Sampler, TracingConfig};

use raw::RawConfig;
use validate::validate;

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
// The validated configuration.
// ---------------------------------------------------------------------------------

/// The log filter in force and where it came from: `IDEMGATE_LOG`, when set, wins over
/// the file's `log` (as every `IDEMGATE_*` override does).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogFilter {
    /// A `tracing` filter (`info`, `warn,idemgate=debug`), validated.
    pub filter: String,
    /// `log`, or `IDEMGATE_LOG` when the variable holds it.
    pub field: String,
    /// What the file says (what a reload changes while the variable holds it).
    pub in_file: Option<String>,
}

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
    /// Delivery runtimes: each its own thread running tokio's `current_thread`
    /// scheduler with its own webhook listener (`SO_REUSEPORT` on `listen`), store
    /// connection and upstream client; 1 = today's one thread, no extra one. Absent =
    /// one per CPU of the cgroup's quota (`cpus::default_worker_threads`).
    pub worker_threads: usize,
    /// Whether `worker_threads` was left out and came from the CPU quota.
    pub worker_threads_from_quota: bool,
    pub store: StoreConfig,
    pub dedup: DedupConfig,
    pub routes: Vec<RouteConfig>,
    /// `admin_token`: the tokens that open the operator API (`/admin/`); none = it is off.
    pub operator_tokens: Vec<OperatorToken>,
    /// `[async]`: the delivery queue shared by the async routes.
    pub async_queue: AsyncConfig,
    /// `[tracing]`: OpenTelemetry export (off unless an endpoint is set).
    pub tracing: TracingConfig,
    /// `log`: the filter of the process's log lines, changed by a live reload.
    pub log: LogFilter,
    /// The file it was read from (`None`: defaults and environment only): what a live
    /// reload reads again (src/reload).
    pub source: Option<std::path::PathBuf>,
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
#[derive(Debug, Clone, PartialEq)]
pub enum RouteMode {
    Sync,
    Async(AsyncRoute),
}

/// A `mode = "async"` route's acknowledgement and delivery policy.
#[derive(Debug, Clone, PartialEq)]
pub struct AsyncRoute {
    pub ack_status: u16,
    pub ack_body: String,
    pub max_attempts: u32,
    pub max_age: Duration,
    pub backoff: Duration,
    pub max_backoff: Duration,
    /// How the route's deliveries reach the application (docs/async.md, "Protecting
    /// the application").
    pub throttle: Throttle,
    /// The key source whose value orders deliveries (`order_key`): one at a time per
    /// value, in the order accepted. `None`: unordered.
    pub order_key: Option<String>,
}

/// A route's delivery limits, shared by every sidecar on the same store.
#[derive(Debug, Clone, PartialEq)]
pub struct Throttle {
    /// Deliveries to the application at once (`max_concurrency`); `None`: no bound.
    pub max_concurrency: Option<u32>,
    /// Deliveries started per second (`rate`); `None`: no bound.
    pub rate: Option<f64>,
    /// The token bucket's size (`burst`, default `max(1, rate)`).
    pub burst: f64,
    /// The longest hold an application's `Retry-After` may ask for (`retry_after_cap`).
    pub retry_after_cap: Duration,
}

impl Throttle {
    /// Whether any bound applies (otherwise the worker asks the store nothing).
    pub fn limits(&self) -> bool {
        self.max_concurrency.is_some() || self.rate.is_some()
    }
}

/// One operator's token (`admin_token`): the name their actions are audited under, and its secret.
#[derive(Debug, Clone)]
pub struct OperatorToken {
    pub name: String,
    pub secret: Secret,
}

/// The shortest `admin_token` accepted: a guessable token would open the operator API.
pub const OPERATOR_TOKEN_MIN_LEN: usize = 16;

/// Default `store.max_memory`: 128 MiB, within a sidecar's usual memory limit.
pub const DEFAULT_MAX_MEMORY: u64 = 128 * 1024 * 1024;

#[derive(Clone, PartialEq, Eq)]
pub enum StoreUrl {
    Memory,
    /// The `file:` store's directory (`store::file`).
    File(std::path::PathBuf),
    Redis(String),
}

/// When the `file:` store fsyncs its journal (`store.fsync`). Either way a change is
/// written to the OS before the answer that promises it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsyncPolicy {
    /// Every group commit is fsynced before the answers waiting on it.
    Always,
    /// At most this long after a commit (a machine crash may lose that window).
    Every(Duration),
}

impl std::fmt::Debug for StoreUrl {
    // Never prints a password (the configuration's Debug goes through here).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreUrl::Memory => f.write_str("Memory"),
            StoreUrl::File(p) => f.debug_tuple("File").field(p).finish(),
            StoreUrl::Redis(u) => f.debug_tuple("Redis").field(&redact_url(u)).finish(),
        }
    }
}

/// How many deliveries each route's recent index holds unless `store.recent_per_route`
/// says otherwise (older ones drop off the list, not out of the store).
pub const RECENT_PER_ROUTE: usize = 10_000;

#[derive(Debug, Clone)]
pub struct StoreConfig {
    pub url: StoreUrl,
    /// The `file:` store's fsync policy (`store.fsync`).
    pub fsync: FsyncPolicy,
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
    /// Bytes the in-process store's entries may take before the oldest settled ones
    /// are forgotten (`store.max_memory`).
    pub max_memory: u64,
    /// How many deliveries each route's recent index (the list) holds.
    pub recent_per_route: usize,
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

/// What a route does with a verified handshake (a provider's URL check).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandshakeMode {
    /// Forward it to the application, unclaimed.
    Forward,
    /// Answer it from the route's secret, without the application.
    Answer,
}

/// What a route does with a signed request that holds no idempotency key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeylessPolicy {
    /// Forward it without de-duplication.
    Forward,
    /// Refuse it (400).
    Reject,
}

/// `[dedup]`, the default of every route, or one route's effective settings (its own
/// keys over `[dedup]`'s).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DedupConfig {
    pub lease: Duration,
    pub retention: Duration,
    pub in_flight: InFlightPolicy,
    pub wait_timeout: Duration,
}

/// A route's own `lease`, `retention`, `in_flight` and `wait_timeout`: each one set
/// overrides `[dedup]`'s for that route only.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DedupOverrides {
    pub lease: Option<Duration>,
    pub retention: Option<Duration>,
    pub in_flight: Option<InFlightPolicy>,
    pub wait_timeout: Option<Duration>,
}

impl DedupOverrides {
    /// The route's effective settings: its own keys over `default` (`[dedup]`).
    pub fn over(&self, default: &DedupConfig) -> DedupConfig {
        DedupConfig {
            lease: self.lease.unwrap_or(default.lease),
            retention: self.retention.unwrap_or(default.retention),
            in_flight: self.in_flight.unwrap_or(default.in_flight),
            wait_timeout: self.wait_timeout.unwrap_or(default.wait_timeout),
        }
    }
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

#[derive(Debug, Clone)]
pub struct RouteConfig {
    pub name: String,
    pub path: String,
    pub provider: String,
    pub secrets: Vec<Secret>,
    pub tolerance: Option<Duration>,
    pub key: Option<String>,
    pub upstream_path: Option<String>,
    /// `keyless`, when set; otherwise the preset's default.
    pub keyless: Option<KeylessPolicy>,
    pub custom: CustomFields,
    /// Keep the request (size-capped, for `retention`) for an operator's replay.
    pub keep_payload: bool,
    /// Whether a copy gets the stored answer's body (`replay_body`, default true); when
    /// false, only its status and headers (SECURITY.md: what answers replay).
    pub replay_body: bool,
    pub mode: RouteMode,
    /// The route's own dedup keys; `Config::dedup_of` gives its effective settings.
    pub dedup: DedupOverrides,
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
    /// Presets with handshakes: forward (default) or answer them.
    pub handshake: Option<HandshakeMode>,
    /// `meta`: the token its GET verification must carry.
    pub verify_token: Option<Secret>,
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
        let mut config = Self::from_toml_with_env(&text, |name| std::env::var(name).ok())?;
        config.source = path.map(Path::to_path_buf);
        Ok(config)
    }

    /// The files whose change may change this configuration: the file itself and each
    /// `file:` secret (a live reload watches their directories).
    pub fn watched_files(&self) -> Vec<std::path::PathBuf> {
        let route_secrets = self.routes.iter().flat_map(|r| {
            r.secrets
                .iter()
                .chain(r.custom.verify_token.as_ref())
                .map(|s| s.source.as_str())
        });
        let tokens = self
            .operator_tokens
            .iter()
            .map(|t| t.secret.source.as_str());
        let mut files: Vec<std::path::PathBuf> = route_secrets
            .chain(tokens)
            .filter_map(|s| s.strip_prefix("file:"))
            .map(std::path::PathBuf::from)
            .chain(self.source.clone())
            .collect();
        files.sort();
        files.dedup();
        files
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
                // The span may be a store URL given the wrong type: never its password.
                .map(|s| redact_url(s.trim()))
                .filter(|s| !s.is_empty() && s.len() < 80)
                .unwrap_or_else(|| "config".to_string());
            ConfigError::new(field, msg)
        })?;
        validate(raw, &env)
    }

    /// The effective dedup settings of the route named `route` (its own keys over
    /// `[dedup]`); `[dedup]` itself for a name no route has.
    pub fn dedup_of(&self, route: &str) -> DedupConfig {
        match self.routes.iter().find(|r| r.name == route) {
            Some(r) => r.dedup.over(&self.dedup),
            None => self.dedup,
        }
    }

    /// Whether duplicates are only caught within this process.
    pub fn memory_store_warning(&self) -> Option<&'static str> {
        (self.store.url == StoreUrl::Memory).then_some(
            "the store is the in-memory store: duplicates are only caught per replica; \
             configure [store] url = \"redis://...\" to share claims across replicas",
        )
    }
}
