//! What a reload may not change, and what it did change: pure functions of the
//! configurations, so that the refusal and the log line are tested without a process.

use std::fmt;

use std::time::Duration;

use crate::config::{AsyncRoute, Config, RouteConfig, RouteMode, Secret, Throttle};

/// The fields whose change needs a restart, named as `check-config` names them: the
/// listeners, the upstream client, the store, the `[async]` queue, `[tracing]`'s exporter, and
/// every async route's worker settings (not its lease nor retention: the stores read
/// them per write, the worker the lease per attempt). `started` is
/// the configuration the process started with (its store and async workers were built
/// from it), `new` the one read now; empty: the reload may apply.
pub fn restart_needed(started: &Config, new: &Config) -> Vec<String> {
    let mut fields = Vec::new();
    let mut check = |field: &str, same: bool| {
        if !same {
            fields.push(field.to_string());
        }
    };
    let (a, b) = (started, new);
    check("listen", a.listen == b.listen);
    check("admin_listen", a.admin_listen == b.admin_listen);
    check("upstream", a.upstream == b.upstream);
    check("upstream_timeout", a.upstream_timeout == b.upstream_timeout);
    check("max_response", a.max_response == b.max_response);
    check("shutdown_grace", a.shutdown_grace == b.shutdown_grace);
    check("header_timeout", a.header_timeout == b.header_timeout);
    check("max_in_flight", a.max_in_flight == b.max_in_flight);
    check("max_connections", a.max_connections == b.max_connections);
    check("worker_threads", a.worker_threads == b.worker_threads);
    let (s, t) = (&a.store, &b.store);
    check("store.url", s.url == t.url);
    check("store.fsync", s.fsync == t.fsync);
    check("store.key_prefix", s.key_prefix == t.key_prefix);
    check("store.timeout", s.timeout == t.timeout);
    check("store.on_error", s.on_error == t.on_error);
    check(
        "store.min_replicas_ack",
        s.min_replicas_ack == t.min_replicas_ack,
    );
    check(
        "store.replicas_ack_timeout",
        s.replicas_ack_timeout == t.replicas_ack_timeout,
    );
    check(
        "store.breaker_threshold",
        s.breaker_threshold == t.breaker_threshold,
    );
    check(
        "store.breaker_cooldown",
        s.breaker_cooldown == t.breaker_cooldown,
    );
    check("store.max_memory", s.max_memory == t.max_memory);
    check(
        "store.recent_per_route",
        s.recent_per_route == t.recent_per_route,
    );
    check(
        "async.claim_idle",
        a.async_queue.claim_idle == b.async_queue.claim_idle,
    );
    check(
        "async.max_queue",
        a.async_queue.max_queue == b.async_queue.max_queue,
    );
    // The sampler and `start_traces` change live (`Tracer::update`); the exporter,
    // built at start (or not, without an endpoint), stays.
    check(
        "tracing.otlp_endpoint",
        a.tracing.traces_url == b.tracing.traces_url,
    );
    check(
        "tracing.service_name",
        a.tracing.service_name == b.tracing.service_name,
    );
    for r in &b.routes {
        // An async route's worker and queue were built at start: neither added,
        // nor turned sync, nor changed by a reload (a removed one keeps draining).
        let worker = a.routes.iter().find(|w| w.name == r.name);
        let is_async = |m: &RouteMode| matches!(m, RouteMode::Async(_));
        if is_async(&r.mode) || worker.is_some_and(|w| is_async(&w.mode)) {
            let same = worker.is_some_and(|w| worker_settings(w) == worker_settings(r));
            check(&format!("route {}: async route settings", r.name), same);
        }
    }
    fields
}

/// An async route's settings that its worker holds from start: all but its secrets,
/// timestamp tolerance and copy handling (the gate reads them per delivery) and its
/// async policy (acknowledgement, attempts, backoff, rate: the worker loads it per
/// attempt, and `max_concurrency` at each admission), except `order_key`.
fn worker_settings(r: &RouteConfig) -> String {
    let mut r = r.clone();
    if let RouteMode::Async(a) = &mut r.mode {
        let fixed = AsyncRoute {
            ack_status: 0,
            ack_body: String::new(),
            max_attempts: 0,
            max_age: Duration::ZERO,
            backoff: Duration::ZERO,
            max_backoff: Duration::ZERO,
            throttle: Throttle {
                max_concurrency: None,
                rate: None,
                burst: 0.0,
                retry_after_cap: Duration::ZERO,
            },
            order_key: a.order_key.take(),
        };
        *a = fixed;
    }
    r.secrets.clear();
    r.tolerance = None;
    r.custom.verify_token = None;
    r.dedup.in_flight = None;
    r.dedup.wait_timeout = None;
    // The stores read the lease and retention per write (`RouteLifetimes`), the
    // worker the lease per attempt.
    r.dedup.retention = None;
    r.dedup.lease = None;
    format!("{r:?}")
}

/// A route's settings but its secrets: what makes it "edited".
fn settings(r: &RouteConfig) -> (String, Option<Vec<u8>>) {
    let token = r.custom.verify_token.as_ref().map(|t| t.value.clone());
    let mut r = r.clone();
    r.secrets.clear();
    (format!("{r:?}"), token)
}

/// One route's secrets that a reload added or removed, by index (never by value).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretChange {
    pub route: String,
    /// Indexes in the new list of the secrets the old one did not have.
    pub added: Vec<usize>,
    /// Indexes in the old list of the secrets the new one does not have.
    pub removed: Vec<usize>,
}

/// What a reload changed, for its log line and its answer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    pub added: Vec<String>,
    pub removed: Vec<String>,
    /// Routes whose settings (other than their secrets) changed.
    pub edited: Vec<String>,
    pub secrets: Vec<SecretChange>,
    /// Other fields that changed: `max_body`, `body_timeout`, `dedup.in_flight`...
    pub other: Vec<&'static str>,
}

impl Changes {
    pub fn is_empty(&self) -> bool {
        *self == Changes::default()
    }
}

/// What changed from `old` to `new` (both valid, `restart_needed` empty).
pub fn changes(old: &Config, new: &Config) -> Changes {
    let mut c = Changes::default();
    for r in &new.routes {
        match old.routes.iter().find(|o| o.name == r.name) {
            None => c.added.push(r.name.clone()),
            Some(o) => {
                if settings(o) != settings(r) {
                    c.edited.push(r.name.clone());
                }
                let added = new_indexes(&r.secrets, &o.secrets);
                let removed = new_indexes(&o.secrets, &r.secrets);
                if !added.is_empty() || !removed.is_empty() {
                    c.secrets.push(SecretChange {
                        route: r.name.clone(),
                        added,
                        removed,
                    });
                }
            }
        }
    }
    for o in &old.routes {
        if !new.routes.iter().any(|r| r.name == o.name) {
            c.removed.push(o.name.clone());
        }
    }
    let mut other = |field: &'static str, same: bool| {
        if !same {
            c.other.push(field);
        }
    };
    other("max_body", old.max_body == new.max_body);
    let tokens = |c: &Config| -> Vec<(String, Vec<u8>)> {
        let t = c.operator_tokens.iter();
        t.map(|t| (t.name.clone(), t.secret.value.clone()))
            .collect()
    };
    other("admin_token", tokens(old) == tokens(new));
    other("body_timeout", old.body_timeout == new.body_timeout);
    other(
        "dedup.in_flight",
        old.dedup.in_flight == new.dedup.in_flight,
    );
    other(
        "dedup.wait_timeout",
        old.dedup.wait_timeout == new.dedup.wait_timeout,
    );
    c
}

/// The indexes in `list` of the secrets that `other` does not hold.
fn new_indexes(list: &[Secret], other: &[Secret]) -> Vec<usize> {
    let held = |s: &Secret| other.iter().any(|o| o.value == s.value && o.id == s.id);
    list.iter()
        .enumerate()
        .filter(|(_, s)| !held(s))
        .map(|(i, _)| i)
        .collect()
}

impl fmt::Display for Changes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return f.write_str("no change");
        }
        let mut parts = Vec::new();
        for (what, names) in [
            ("routes added", &self.added),
            ("routes removed", &self.removed),
            ("routes edited", &self.edited),
        ] {
            if !names.is_empty() {
                parts.push(format!("{what}: {}", names.join(", ")));
            }
        }
        for s in &self.secrets {
            let list = |v: &[usize]| {
                let v: Vec<String> = v.iter().map(|i| format!("#{i}")).collect();
                v.join(" ")
            };
            let mut p = format!("route {} secrets", s.route);
            if !s.added.is_empty() {
                p += &format!(" added {}", list(&s.added));
            }
            if !s.removed.is_empty() {
                p += &format!(" removed {}", list(&s.removed));
            }
            parts.push(p);
        }
        if !self.other.is_empty() {
            parts.push(format!("changed: {}", self.other.join(", ")));
        }
        f.write_str(&parts.join("; "))
    }
}

#[cfg(test)]
mod tests;
