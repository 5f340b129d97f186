//! The file as written: every field optional, unknown fields refused. `validate`
//! turns it into a `Config`.

use serde::Deserialize;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    pub(super) listen: Option<String>,
    pub(super) admin_listen: Option<String>,
    pub(super) upstream: Option<String>,
    pub(super) upstream_timeout: Option<String>,
    pub(super) max_body: Option<String>,
    pub(super) max_response: Option<String>,
    pub(super) shutdown_grace: Option<String>,
    pub(super) header_timeout: Option<String>,
    pub(super) body_timeout: Option<String>,
    pub(super) max_in_flight: Option<toml::Value>,
    pub(super) max_connections: Option<toml::Value>,
    pub(super) worker_threads: Option<toml::Value>,
    /// The log filter (`IDEMGATE_LOG` over it).
    pub(super) log: Option<String>,
    pub(super) store: Option<RawStore>,
    pub(super) dedup: Option<RawDedup>,
    /// Admin API tokens (they open `/admin/`): one source or several, each `[name=]env:X|file:/p`.
    pub(super) admin_token: Option<OneOrMany>,
    #[serde(rename = "async")]
    pub(super) async_queue: Option<RawAsync>,
    pub(super) tracing: Option<super::tracing::RawTracing>,
    #[serde(default, rename = "route")]
    pub(super) routes: Vec<RawRoute>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawStore {
    pub(super) url: Option<String>,
    pub(super) key_prefix: Option<String>,
    pub(super) timeout: Option<String>,
    pub(super) on_error: Option<String>,
    pub(super) min_replicas_ack: Option<u32>,
    pub(super) replicas_ack_timeout: Option<String>,
    pub(super) breaker_threshold: Option<toml::Value>,
    pub(super) breaker_cooldown: Option<String>,
    pub(super) fsync: Option<String>,
    pub(super) max_memory: Option<String>,
    pub(super) recent_per_route: Option<toml::Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDedup {
    pub(super) lease: Option<String>,
    pub(super) retention: Option<String>,
    pub(super) in_flight: Option<String>,
    pub(super) wait_timeout: Option<String>,
}

/// `[async]`: settings shared by every `mode = "async"` route (docs/async.md).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAsync {
    pub(super) claim_idle: Option<String>,
    pub(super) max_queue: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRoute {
    pub(super) name: Option<String>,
    pub(super) path: Option<String>,
    pub(super) provider: Option<String>,
    #[serde(default)]
    pub(super) secrets: Vec<String>,
    pub(super) tolerance: Option<String>,
    pub(super) key: Option<String>,
    pub(super) upstream_path: Option<String>,
    // `custom` provider fields
    pub(super) signature_header: Option<String>,
    pub(super) hash: Option<String>,
    pub(super) encoding: Option<String>,
    pub(super) prefix: Option<String>,
    pub(super) timestamp_header: Option<String>,
    pub(super) signed: Option<String>,
    // `twilio`
    pub(super) public_url: Option<String>,
    /// Presets with handshakes: `forward` (default) or `answer` (docs/providers.md).
    pub(super) handshake: Option<String>,
    /// A signed request holding no key: `forward` undeduplicated or `reject`.
    pub(super) keyless: Option<String>,
    /// `meta`: the token Meta's GET verification request must carry.
    pub(super) verify_token: Option<String>,
    // `mode = "async"` (docs/async.md)
    pub(super) mode: Option<String>,
    pub(super) ack_status: Option<u16>,
    pub(super) ack_body: Option<String>,
    pub(super) max_attempts: Option<u32>,
    pub(super) max_age: Option<String>,
    pub(super) backoff: Option<String>,
    pub(super) max_backoff: Option<String>,
    pub(super) max_concurrency: Option<u32>,
    pub(super) rate: Option<f64>,
    pub(super) burst: Option<f64>,
    pub(super) order_key: Option<String>,
    pub(super) retry_after_cap: Option<String>,
    /// Keep the request in the delivery log for an operator's replay.
    pub(super) keep_payload: Option<bool>,
    /// Copies get the stored answer's status and headers, without its body, when false.
    pub(super) replay_body: Option<bool>,
    // The route's own `[dedup]` keys (docs/providers.md, "Dedup settings per route")
    pub(super) lease: Option<String>,
    pub(super) retention: Option<String>,
    pub(super) in_flight: Option<String>,
    pub(super) wait_timeout: Option<String>,
}

/// A field written as one string or a list of them.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum OneOrMany {
    One(String),
    Many(Vec<String>),
}
