//! Pacing an async route's deliveries (docs/async.md, "Protecting the application"):
//! before each attempt a worker asks the route's shared pacing state (`store::pacing`)
//! whether it may start, and waits while the route is paused, held by the
//! application's `Retry-After`, out of concurrency slots or tokens, or while an older
//! delivery of the same order value is unfinished. The application's `429`/`503` with
//! `Retry-After` holds the whole route (on every sidecar sharing the store).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime};

use http::StatusCode;
use tokio::sync::Notify;

use super::{AsyncMode, AsyncRouteState};
use crate::store::pacing::{Admit, Ask};
use crate::upstream::UpstreamResponse;

/// How often a paused route's waiting entries look again.
const PAUSED_POLL: Duration = Duration::from_millis(500);
/// How often an entry waiting for a concurrency slot looks again (with jitter, so
/// waiters spread out; at most `max_concurrency` of a sidecar's entries wait so).
const BUSY_POLL: Duration = Duration::from_millis(20);
/// How often an entry waiting for an older one of its order value looks again (every
/// entry in hand may wait so: a longer poll keeps their load on the store small).
const ORDER_POLL: Duration = Duration::from_millis(50);
/// A slot lapses this long after the upstream timeout plus two store timeouts (the
/// key's lock, and a renewal that stalls the call's timeout), so it outlives every
/// call its holder makes; a dead sidecar's slot frees then.
const SLOT_SLACK: Duration = Duration::from_secs(5);

/// How long a batch read's "the route is open" stands for the first attempts of the
/// entries it read (they start at once; this only bounds a stalled task's).
const READ_ADMITS: Duration = Duration::from_millis(50);

/// A started attempt's hold on the route: its concurrency slot, and the sidecar-local
/// permit that keeps a sidecar's waiters from asking the store all at once.
pub(super) struct Admitted {
    slot: String,
    _local: Option<LocalPermit>,
}

/// What a route's pacing needs beyond its configuration.
pub(super) struct Pace {
    /// This sidecar's entries asking or delivering under a `max_concurrency` (bounded
    /// by the value in force at each admission, so that a reload moves the bound).
    local: Arc<LocalCount>,
    pub(super) slot_ttl: Duration,
}

/// How many local permits are out, and the waiters to wake when one returns or a
/// reload raises the bound.
#[derive(Default)]
struct LocalCount {
    taken: AtomicUsize,
    freed: Notify,
}

/// One of `LocalCount`'s permits; returned on drop.
struct LocalPermit(Arc<LocalCount>);

impl Drop for LocalPermit {
    fn drop(&mut self) {
        self.0.taken.fetch_sub(1, Ordering::AcqRel);
        self.0.freed.notify_waiters();
    }
}

impl Pace {
    pub(super) fn new(upstream_timeout: Duration, store_timeout: Duration) -> Pace {
        Pace {
            local: Arc::default(),
            slot_ttl: upstream_timeout + store_timeout * 2 + SLOT_SLACK,
        }
    }

    /// Takes a local permit if fewer than `bound` are out; `None` otherwise.
    fn try_take(&self, bound: u32) -> Option<LocalPermit> {
        let c = &self.local.taken;
        let mut n = c.load(Ordering::Acquire);
        while n < bound as usize {
            match c.compare_exchange(n, n + 1, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Some(LocalPermit(self.local.clone())),
                Err(now) => n = now,
            }
        }
        None
    }

    /// Wakes the waiters for a local permit (a reload may have raised the bound).
    pub(super) fn bound_changed(&self) {
        self.local.freed.notify_waiters();
    }
}

/// How long a `429`/`503` answer asks the route to wait: its `Retry-After` (seconds or
/// an HTTP date, read against `now`), at most `cap`. `None` for any other answer, or
/// one without a readable `Retry-After` (a plain failed attempt).
pub fn retry_after(resp: &UpstreamResponse, now: SystemTime, cap: Duration) -> Option<Duration> {
    if resp.status != StatusCode::TOO_MANY_REQUESTS
        && resp.status != StatusCode::SERVICE_UNAVAILABLE
    {
        return None;
    }
    let v = resp
        .headers
        .get(http::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim();
    let d = match v.parse::<u64>() {
        Ok(secs) => Duration::from_secs(secs),
        Err(_) => httpdate::parse_http_date(v)
            .ok()?
            .duration_since(now)
            .unwrap_or(Duration::ZERO),
    };
    Some(d.min(cap))
}

impl AsyncMode {
    /// Waits until the route lets this attempt start; `None` when shutting down, or
    /// when the ordered entry is gone from the queue (nothing left to deliver).
    /// `order`: the entry's order value and queue ID, on an ordered route.
    pub(super) async fn admitted(
        &self,
        state: &AsyncRouteState,
        order: Option<(&str, &str)>,
    ) -> Option<Admitted> {
        let route: &str = &state.route.name;
        let mut slot = String::new();
        loop {
            // The policy in force at each try: a reload moves the bounds of the next.
            let cfg = state.cfg.load();
            let t = &cfg.throttle;
            // The slot's name matters only where there are slots to take.
            if t.max_concurrency.is_some() && slot.is_empty() {
                slot = format!(
                    "{}:{}",
                    self.consumer,
                    crate::store::Token::random().to_hex()
                );
            }
            let slotted = t.max_concurrency.is_some();
            let ask = Ask {
                slot: if slotted { &slot } else { "" },
                order,
                max_concurrency: t.max_concurrency.unwrap_or(0),
                rate: t.rate.unwrap_or(0.0),
                burst: t.burst,
                slot_ttl: state.pace.slot_ttl,
            };
            let local = match t.max_concurrency {
                Some(bound) => {
                    let freed = state.pace.local.freed.notified();
                    tokio::pin!(freed);
                    freed.as_mut().enable();
                    match state.pace.try_take(bound) {
                        Some(p) => Some(p),
                        None => {
                            tokio::select! {
                                _ = self.stop.cancelled() => return None,
                                _ = freed => {}
                                _ = tokio::time::sleep(BUSY_POLL) => {}
                            }
                            continue;
                        }
                    }
                }
                None => None,
            };
            let wait = match self.backend.admit(route, ask).await {
                Ok(Admit::Go) => {
                    return Some(Admitted {
                        slot: if slotted {
                            std::mem::take(&mut slot)
                        } else {
                            String::new()
                        },
                        _local: local,
                    });
                }
                Ok(Admit::Gone) => {
                    tracing::info!(
                        route,
                        "queue: an ordered entry in hand was finished by another worker; dropped"
                    );
                    return None;
                }
                Ok(Admit::Paused) => PAUSED_POLL,
                Ok(Admit::Held(d)) | Ok(Admit::Wait(d)) => d,
                Ok(Admit::Busy) => BUSY_POLL.mul_f64(1.0 + rand::random::<f64>()),
                Ok(Admit::Ordered) => ORDER_POLL.mul_f64(1.0 + rand::random::<f64>()),
                Err(e) => {
                    tracing::warn!(route, error = %e, "queue: asking the route's pacing failed");
                    Duration::from_secs(1)
                }
            };
            drop(local);
            if !self.pause(wait.max(Duration::from_millis(1))).await {
                return None;
            }
        }
    }

    /// The admission a batch read gave (`QueueBackend::read_batch`): the route was open
    /// at `open_at`, at most `READ_ADMITS` ago, and this entry needs nothing else (no
    /// slot, no token, no order). `None`: the attempt asks `admitted`.
    pub(super) fn admitted_by_read(
        &self,
        state: &AsyncRouteState,
        order: Option<(&str, &str)>,
        open_at: Option<Instant>,
    ) -> Option<Admitted> {
        let cfg = state.cfg.load();
        let t = &cfg.throttle;
        let unpaced = t.max_concurrency.is_none() && t.rate.is_none() && order.is_none();
        (unpaced && open_at?.elapsed() < READ_ADMITS).then(|| Admitted {
            slot: String::new(),
            _local: None,
        })
    }

    /// Gives an attempt's concurrency slot back (its local permit goes with it).
    pub(super) async fn leave(&self, state: &AsyncRouteState, admitted: Admitted) {
        // A slot taken under the bound in force then (a reload may have lifted it).
        if admitted.slot.is_empty() {
            return;
        }
        if let Err(e) = self.backend.leave(&state.route.name, &admitted.slot).await {
            tracing::warn!(route = &*state.route.name, error = %e, "giving a concurrency slot back failed; it lapses after the upstream timeout");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http::HeaderMap;

    fn resp(status: u16, retry_after: Option<&str>) -> UpstreamResponse {
        let mut headers = HeaderMap::new();
        if let Some(v) = retry_after {
            headers.insert(http::header::RETRY_AFTER, v.parse().unwrap());
        }
        UpstreamResponse {
            status: StatusCode::from_u16(status).unwrap(),
            headers,
            body: Bytes::new(),
        }
    }

    #[test]
    fn retry_after_reads_seconds_and_dates_and_is_capped() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_784_000_000);
        let cap = Duration::from_secs(3600);
        assert_eq!(
            retry_after(&resp(429, Some("2")), now, cap),
            Some(Duration::from_secs(2))
        );
        assert_eq!(
            retry_after(&resp(503, Some(" 120 ")), now, cap),
            Some(Duration::from_secs(120))
        );
        let later = httpdate::fmt_http_date(now + Duration::from_secs(90));
        assert_eq!(
            retry_after(&resp(503, Some(&later)), now, cap),
            Some(Duration::from_secs(90))
        );
        let past = httpdate::fmt_http_date(now - Duration::from_secs(90));
        assert_eq!(
            retry_after(&resp(429, Some(&past)), now, cap),
            Some(Duration::ZERO)
        );
        assert_eq!(
            retry_after(&resp(429, Some("86400")), now, cap),
            Some(cap),
            "capped"
        );
        assert_eq!(retry_after(&resp(429, None), now, cap), None);
        assert_eq!(retry_after(&resp(429, Some("soon")), now, cap), None);
        assert_eq!(retry_after(&resp(500, Some("2")), now, cap), None);
        assert_eq!(retry_after(&resp(200, Some("2")), now, cap), None);
    }
}
