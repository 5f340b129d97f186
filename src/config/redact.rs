//! How the configuration is shown (`check-config`, logs, the console): secret
//! literals and Redis passwords never appear, `env:`/`file:` names do.

use std::fmt;
use std::time::Duration;

use super::{
    Config, DedupConfig, FsyncPolicy, HandshakeMode, InFlightPolicy, KeylessPolicy, OnStoreError,
    RouteMode, Secret, StoreUrl,
};

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

/// The dedup keys as TOML lines, for `[dedup]` and for each route's effective values.
fn dedup_lines(out: &mut String, dedup: &DedupConfig) {
    use std::fmt::Write;
    let d = |d: Duration| q(&humantime::format_duration(d).to_string());
    let in_flight = match dedup.in_flight {
        InFlightPolicy::Reject => "reject",
        InFlightPolicy::Wait => "wait",
    };
    let _ = writeln!(out, "lease = {}", d(dedup.lease));
    let _ = writeln!(out, "retention = {}", d(dedup.retention));
    let _ = writeln!(out, "in_flight = {}", q(in_flight));
    let _ = writeln!(out, "wait_timeout = {}", d(dedup.wait_timeout));
}

/// A TOML string.
fn q(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

/// How a secret source is shown: `env:` and `file:` names are not secret, literals are.
pub fn redact_source(source: &str) -> String {
    if source.starts_with("env:") || source.starts_with("file:") {
        source.to_string()
    } else {
        "<redacted literal>".to_string()
    }
}

impl Config {
    /// The effective configuration as TOML, with every secret redacted.
    pub fn redacted_toml(&self) -> String {
        use std::fmt::Write;
        let d = |d: Duration| humantime::format_duration(d).to_string();
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
        let _ = writeln!(out, "log = {}", q(&self.log.filter));
        if self.worker_threads_from_quota {
            // Commented out, so that this output read again still follows the quota.
            let _ = writeln!(
                out,
                "# worker_threads = {}  (left out: one runtime per CPU of the cgroup's quota)",
                self.worker_threads
            );
        } else {
            let _ = writeln!(out, "worker_threads = {}", self.worker_threads);
        }
        if !self.operator_tokens.is_empty() {
            let tokens: Vec<String> = self
                .operator_tokens
                .iter()
                .map(|t| q(&format!("{}={}", t.name, redact_source(&t.secret.source))))
                .collect();
            let _ = writeln!(out, "admin_token = [{}]", tokens.join(", "));
        }
        let _ = writeln!(out, "\n[store]");
        let url = match &self.store.url {
            StoreUrl::Memory => "memory".to_string(),
            StoreUrl::File(p) => format!("file:{}", p.display()),
            StoreUrl::Redis(u) => redact_url(u),
        };
        let _ = writeln!(out, "url = {}", q(&url));
        match self.store.fsync {
            FsyncPolicy::Always if !matches!(self.store.url, StoreUrl::File(_)) => {}
            FsyncPolicy::Always => {
                let _ = writeln!(out, "fsync = \"always\"");
            }
            FsyncPolicy::Every(p) => {
                let _ = writeln!(out, "fsync = {}", q(&d(p)));
            }
        }
        let _ = writeln!(out, "key_prefix = {}", q(&self.store.key_prefix));
        if self.store.url == StoreUrl::Memory {
            let _ = writeln!(
                out,
                "max_memory = {}",
                q(&self.store.max_memory.to_string())
            );
        }
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
        let _ = writeln!(out, "recent_per_route = {}", self.store.recent_per_route);
        let _ = writeln!(out, "\n[dedup]");
        dedup_lines(&mut out, &self.dedup);
        let _ = writeln!(out, "\n[async]");
        let _ = writeln!(out, "claim_idle = {}", q(&d(self.async_queue.claim_idle)));
        let _ = writeln!(out, "max_queue = {}", self.async_queue.max_queue);
        for r in &self.routes {
            let _ = writeln!(out, "\n[[route]]");
            let _ = writeln!(out, "name = {}", q(&r.name));
            if r.keep_payload {
                let _ = writeln!(out, "keep_payload = true");
            }
            if !r.replay_body {
                let _ = writeln!(out, "replay_body = false");
            }
            let _ = writeln!(out, "path = {}", q(&r.path));
            let _ = writeln!(out, "provider = {}", q(&r.provider));
            let secrets: Vec<String> = r.secrets.iter().map(|s| q(&s.display())).collect();
            let _ = writeln!(out, "secrets = [{}]", secrets.join(", "));
            // Every route's effective values, its own or `[dedup]`'s.
            dedup_lines(&mut out, &r.dedup.over(&self.dedup));
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
                let t = &a.throttle;
                if let Some(n) = t.max_concurrency {
                    let _ = writeln!(out, "max_concurrency = {n}");
                }
                if let Some(r) = t.rate {
                    let _ = writeln!(out, "rate = {r:?}");
                    let _ = writeln!(out, "burst = {:?}", t.burst);
                }
                let _ = writeln!(out, "retry_after_cap = {}", q(&d(t.retry_after_cap)));
                if let Some(k) = &a.order_key {
                    let _ = writeln!(out, "order_key = {}", q(k));
                }
            }
            if let Some(k) = r.keyless {
                let v = if k == KeylessPolicy::Forward {
                    "forward"
                } else {
                    "reject"
                };
                let _ = writeln!(out, "keyless = {}", q(v));
            }
            let c = &r.custom;
            if let Some(h) = c.handshake {
                let v = if h == HandshakeMode::Answer {
                    "answer"
                } else {
                    "forward"
                };
                let _ = writeln!(out, "handshake = {}", q(v));
            }
            if let Some(t) = &c.verify_token {
                let _ = writeln!(out, "verify_token = {}", q(&t.display()));
            }
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

/// The query options of a Redis URL that are shown (with their `=`): any other text
/// after a password option is taken for more of the password.
const PLAIN_OPTIONS: &[&str] = &["sentinel_username=", "db=", "protocol=", "user="];

/// Hides the passwords in a Redis URL (`redis://user:pw@host` → `redis://user:***@host`),
/// including query options such as a Sentinel URL's `sentinel_password=` or a Unix
/// socket URL's `pass=`. The userinfo is found before anything is split on `/`, `?` or
/// `#` (from the scheme to the last `@`), so a password holding them unencoded, as
/// generated ones do, is hidden whole too, in a URL that is refused as in one accepted.
/// Where the text is ambiguous, more is hidden, never less.
pub fn redact_url(url: &str) -> String {
    let start = url.find("://").map_or(0, |i| i + 3);
    let mut hidden: Vec<(usize, usize)> = Vec::new();
    // The password: from the userinfo's first `:` to the last `@`.
    let rest = &url[start..];
    if let Some(at) = rest.rfind('@')
        && let Some(colon) = rest[..at].find(':')
    {
        hidden.push((start + colon + 1, start + at));
    }
    // Query options naming a password: the value up to the next option known not to
    // be secret (an `&` inside the password does not end it).
    for (i, c) in url.char_indices() {
        if c != '?' && c != '&' {
            continue;
        }
        let option = &url[i + 1..];
        let name_end = option.find(['&', '=']).unwrap_or(option.len());
        let name = &option[..name_end];
        if option[name_end..].starts_with('=') && name.to_ascii_lowercase().contains("pass") {
            let value = name_end + 1;
            let end = option[value..]
                .match_indices('&')
                .map(|(j, _)| value + j)
                .find(|&j| PLAIN_OPTIONS.iter().any(|o| option[j + 1..].starts_with(o)))
                .unwrap_or(option.len());
            hidden.push((i + 1 + value, i + 1 + end));
        }
    }
    let secret = |i: usize| hidden.iter().any(|&(a, b)| a <= i && i < b);
    let mut out = String::with_capacity(url.len());
    let mut in_secret = false;
    for (i, c) in url.char_indices() {
        if secret(i) {
            if !in_secret {
                out.push_str("***");
            }
            in_secret = true;
        } else {
            in_secret = false;
            out.push(c);
        }
    }
    out
}
