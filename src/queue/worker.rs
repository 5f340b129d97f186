//! The delivery loop: one worker per async route takes entries (taken-over ones
//! first), forwards each under its key's claim, retries with backoff, and moves the
//! exhausted ones to the dead-letter stream.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use http::{HeaderMap, Method};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::{AsyncMode, AsyncRouteState, Lock, QueueEntry, backoff_delay};
use crate::store::lease::{self, LeaseEvent};
use crate::store::{DeliveryKey, StoredResponse, Token, unix_millis};
use crate::trace::{self, Kind, Record, Span};
use crate::upstream::{self, Outgoing};

/// How many entries one route's worker holds at once (in delivery or backing off).
const IN_HAND: usize = 32;

/// How often an idle worker looks for new entries.
const POLL: Duration = Duration::from_millis(50);

/// At most this many acknowledgements go in one batch read.
const ACK_BATCH: usize = 256;

/// Delivered unordered entries waiting for the worker's next batch read, which
/// acknowledges them in the same script that reads new ones (`read_batch`): one
/// script per batch instead of one per entry. An entry acknowledged a little later
/// is only pending a little longer (were the sidecar to die first, it is taken over
/// after `claim_idle` and found completed).
#[derive(Default)]
pub(super) struct Acks {
    waiting: Mutex<AcksWaiting>,
    /// Wakes an idle worker's loop to send them.
    ready: tokio::sync::Notify,
}

#[derive(Default)]
struct AcksWaiting {
    ids: Vec<String>,
    /// The worker's loop ended: entries are acknowledged one by one again.
    closed: bool,
}

impl Acks {
    /// Leaves `id` for the next batch read; false once the loop ended.
    fn offer(&self, id: &str) -> bool {
        let Ok(mut w) = self.waiting.lock() else {
            return false;
        };
        if w.closed {
            return false;
        }
        w.ids.push(id.to_string());
        drop(w);
        self.ready.notify_one();
        true
    }

    /// Up to `ACK_BATCH` waiting acknowledgements, for a batch read.
    fn take(&self) -> Vec<String> {
        let Ok(mut w) = self.waiting.lock() else {
            return Vec::new();
        };
        let n = w.ids.len().min(ACK_BATCH);
        w.ids.drain(..n).collect()
    }

    /// Puts back the acknowledgements of a batch read that failed.
    fn put_back(&self, ids: Vec<String>) {
        if let Ok(mut w) = self.waiting.lock() {
            w.ids.extend(ids);
        }
    }

    /// Ends batching: every waiting acknowledgement, for the last batch.
    fn close(&self) -> Vec<String> {
        let Ok(mut w) = self.waiting.lock() else {
            return Vec::new();
        };
        w.closed = true;
        std::mem::take(&mut w.ids)
    }
}

/// One attempt's hold on a queued delivery: the entry and the key's claim it works under.
#[derive(Clone, Copy)]
struct Held<'a> {
    state: &'a AsyncRouteState,
    id: &'a str,
    entry: &'a QueueEntry,
    key: &'a DeliveryKey,
    token: Token,
}

impl AsyncMode {
    /// Samples the queue into the metrics, once a second.
    pub(super) async fn sample(&self, state: Arc<AsyncRouteState>) {
        let m = &state.metrics;
        loop {
            match self.backend.stats(&state.route.name).await {
                Ok(s) => {
                    m.depth.set(s.depth as i64);
                    m.pending.set(s.pending as i64);
                    m.dead_letter_size.set(s.dead_letters as i64);
                    let age = s
                        .oldest_ms
                        .map(|t| unix_millis().saturating_sub(t) as f64 / 1000.0)
                        .unwrap_or(0.0);
                    m.oldest_age.set(age);
                }
                Err(e) => {
                    tracing::debug!(route = &*state.route.name, error = %e, "queue stats failed")
                }
            }
            match self.backend.route_state(&state.route.name).await {
                Ok(r) => m.paused.set(i64::from(r.paused)),
                Err(e) => {
                    tracing::debug!(route = &*state.route.name, error = %e, "reading the route's paused state failed")
                }
            }
            tokio::select! {
                _ = self.stop.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }

    /// One route's worker: takes entries (taken-over ones first, then new ones) while
    /// it has room, and delivers each in its own task. When it stops, it sends the
    /// acknowledgements still waiting for a batch.
    pub(super) async fn work(self: Arc<Self>, state: Arc<AsyncRouteState>) {
        let route: &str = &state.route.name;
        while let Err(e) = self.backend.ensure_group(route).await {
            tracing::warn!(route, error = %e, "cannot create the queue's consumer group; retrying");
            tokio::select! {
                _ = self.stop.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
        let in_hand: Arc<Mutex<HashSet<String>>> = Arc::default();
        self.tasks
            .spawn(self.clone().keep_alive(state.clone(), in_hand.clone()));
        self.clone().take_entries(&state, in_hand).await;
        let last = state.acks.close();
        for chunk in last.chunks(ACK_BATCH) {
            for _ in 0..3 {
                match self
                    .backend
                    .read_batch(route, &self.consumer, chunk, 0)
                    .await
                {
                    Ok(_) => break,
                    Err(e) => {
                        tracing::warn!(route, error = %e, "acknowledging queue entries failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
        }
    }

    /// The worker's loop (`work`), until the sidecar stops.
    async fn take_entries(
        self: Arc<Self>,
        state: &Arc<AsyncRouteState>,
        in_hand: Arc<Mutex<HashSet<String>>>,
    ) {
        let route: &str = &state.route.name;
        let room = Arc::new(Semaphore::new(IN_HAND));
        let mut last_takeover: Option<Instant> = None;
        let every = self.claim_idle / 2;
        loop {
            // Entries of a dead consumer are taken over even when this worker has no
            // room: they may be the oldest of their order values, which the entries in
            // hand wait for (docs/async.md, ordering).
            let due = last_takeover.map_or(Duration::ZERO, |t| every.saturating_sub(t.elapsed()));
            let full = room.available_permits() == 0;
            let first = tokio::select! {
                biased;
                _ = self.stop.cancelled() => return,
                p = room.clone().acquire_owned() => match p { Ok(p) => Some(p), Err(_) => return },
                _ = tokio::time::sleep(due), if full => None,
            };
            let mut permits: Vec<Option<OwnedSemaphorePermit>> = match first {
                Some(p) => {
                    let mut v = vec![Some(p)];
                    while let Ok(p) = room.clone().try_acquire_owned() {
                        v.push(Some(p));
                    }
                    v
                }
                None => (0..IN_HAND).map(|_| None).collect(),
            };
            let mut read = Vec::new();
            let mut failed = None;
            if last_takeover.is_none_or(|t| t.elapsed() >= every) {
                match self
                    .backend
                    .take_over(route, &self.consumer, self.claim_idle, permits.len())
                    .await
                {
                    Ok(r) => {
                        last_takeover = Some(Instant::now());
                        if !r.is_empty() {
                            tracing::info!(
                                route,
                                entries = r.len(),
                                "took over entries of a consumer presumed dead"
                            );
                        }
                        read = r;
                    }
                    Err(e) => failed = Some(e),
                }
            }
            // One script: the waiting acknowledgements, new entries while there is
            // room, and whether the route is open (their first attempts need no
            // admission of their own when the route is unpaced).
            let want = if read.is_empty() && failed.is_none() && permits[0].is_some() {
                permits.len()
            } else {
                0
            };
            let acks = state.acks.take();
            let mut open_at = None;
            if want > 0 || !acks.is_empty() {
                let asked = Instant::now();
                match self
                    .backend
                    .read_batch(route, &self.consumer, &acks, want)
                    .await
                {
                    Ok(b) => {
                        read.extend(b.reads);
                        open_at = b.open.then_some(asked);
                    }
                    Err(e) => {
                        state.acks.put_back(acks);
                        failed.get_or_insert(e);
                    }
                }
            }
            if let Some(e) = failed {
                tracing::warn!(route, error = %e, "reading the queue failed");
                if e.to_string().contains("NOGROUP") {
                    let _ = self.backend.ensure_group(route).await;
                }
            }
            // Entries this worker already holds (an XAUTOCLAIM racing its own refresh).
            read.retain(|(id, _)| !in_hand.lock().map(|h| h.contains(id)).unwrap_or(true));
            if read.is_empty() {
                drop(permits);
                tokio::select! {
                    _ = self.stop.cancelled() => return,
                    _ = tokio::time::sleep(POLL) => {}
                    _ = state.acks.ready.notified() => {}
                }
                continue;
            }
            for (id, entry) in read {
                let Some(permit) = permits.pop() else { break };
                if let Ok(mut h) = in_hand.lock() {
                    h.insert(id.clone());
                }
                let this = self.clone();
                let state = state.clone();
                let in_hand = in_hand.clone();
                self.tasks.spawn(async move {
                    match entry {
                        Some(entry) => this.deliver(&state, &id, entry, open_at).await,
                        None => {
                            tracing::error!(
                                route = &*state.route.name,
                                id,
                                "malformed queue entry dropped"
                            );
                            let _ = this.backend.done(&state.route.name, &id, None).await;
                        }
                    }
                    if let Ok(mut h) = in_hand.lock() {
                        h.remove(&id);
                    }
                    drop(permit);
                });
            }
        }
    }

    /// Refreshes this consumer's hold on its entries in hand every `claim_idle / 3`, so
    /// that only a dead consumer's entries are taken over.
    async fn keep_alive(
        self: Arc<Self>,
        state: Arc<AsyncRouteState>,
        in_hand: Arc<Mutex<HashSet<String>>>,
    ) {
        let period = (self.claim_idle / 3).max(Duration::from_millis(10));
        loop {
            tokio::select! {
                _ = self.stop.cancelled() => return,
                _ = tokio::time::sleep(period) => {}
            }
            let ids: Vec<String> = in_hand
                .lock()
                .map(|h| h.iter().cloned().collect())
                .unwrap_or_default();
            if ids.is_empty() {
                continue;
            }
            if let Err(e) = self
                .backend
                .keep(&state.route.name, &self.consumer, &ids)
                .await
            {
                tracing::warn!(route = &*state.route.name, error = %e, "refreshing entries in hand failed");
            }
        }
    }

    /// Sleeps `d`, or less when shutting down; false when shutting down.
    pub(super) async fn pause(&self, d: Duration) -> bool {
        tokio::select! {
            _ = self.stop.cancelled() => false,
            _ = tokio::time::sleep(d) => true,
        }
    }

    /// Delivers one entry: attempts until the upstream completes it, or it is dead.
    /// Each attempt first waits for the route's pacing (`pace.rs`), then takes the
    /// key's claim.
    /// `open_at`: when a batch read found the route open (`pace.rs`, `admitted_by_read`).
    async fn deliver(
        &self,
        state: &AsyncRouteState,
        id: &str,
        entry: QueueEntry,
        mut open_at: Option<Instant>,
    ) {
        let route: &str = &state.route.name;
        let key = DeliveryKey::new(state.route.name.clone(), entry.key.clone());
        let order = entry.order.as_deref();
        let mut last_error = String::new();
        loop {
            if self.stop.is_cancelled() {
                return; // left pending: taken over by another consumer
            }
            // Each attempt under the route's settings in force (a reload may change them).
            let cfg = state.cfg.load_full();
            let ordered = state.order.as_ref().and(order).map(|o| (o, id));
            let by_read = self.admitted_by_read(state, ordered, open_at.take());
            let admitted = match by_read {
                Some(a) => a,
                None => match self.admitted(state, ordered).await {
                    Some(a) => a,
                    None => return,
                },
            };
            let (token, attempt) = match self.backend.lock(&key, id, cfg.max_age).await {
                Ok(Lock::Claimed { token, attempt }) => (token, attempt),
                Ok(Lock::Completed) => {
                    self.leave(state, admitted).await;
                    self.finish(state, id, order).await;
                    return;
                }
                Ok(Lock::Busy) => {
                    self.leave(state, admitted).await;
                    if !self
                        .pause(cfg.backoff.min(Duration::from_millis(500)))
                        .await
                    {
                        return;
                    }
                    continue;
                }
                Err(e) => {
                    self.leave(state, admitted).await;
                    tracing::warn!(route, key = key.logged(), error = %e, "queue: taking the key failed");
                    if !self.pause(Duration::from_secs(1)).await {
                        return;
                    }
                    continue;
                }
            };
            let held = Held {
                state,
                id,
                entry: &entry,
                key: &key,
                token,
            };
            let age = Duration::from_millis(unix_millis().saturating_sub(entry.received_at));
            if attempt > u64::from(cfg.max_attempts) || age > cfg.max_age {
                self.leave(state, admitted).await;
                if last_error.is_empty() {
                    last_error = if age > cfg.max_age {
                        format!(
                            "max_age ({}) exceeded",
                            humantime::format_duration(cfg.max_age)
                        )
                    } else {
                        "max_attempts exhausted".to_string()
                    };
                }
                self.bury(&held, attempt - 1, &last_error).await;
                return;
            }
            let started = Instant::now();
            let mut span = self.attempt_span(&held, attempt);
            let result = trace::within(span.as_ref(), self.forward(&held)).await;
            let took = started.elapsed();
            if span.is_some() {
                let completed =
                    matches!(&result, Ok(r) if state.route.success.completes(r.status, &r.body));
                span.set(
                    "idemgate.outcome",
                    if completed { "completed" } else { "failed" },
                );
                if let Ok(r) = &result {
                    span.set("http.response.status_code", r.status.as_u16());
                }
                if !completed {
                    span.fail("the attempt did not complete");
                }
                drop(span);
            }
            if matches!(result, Err(upstream::UpstreamError::Timeout)) {
                // The application may still be working on it: the slot stays taken
                // until it lapses (`pace.rs`), so the bound holds for what it runs.
                drop(admitted);
            } else {
                self.leave(state, admitted).await;
            }
            state.metrics.delivery_duration.observe(took.as_secs_f64());
            match result {
                Ok(resp) if state.route.success.completes(resp.status, &resp.body) => {
                    state.metrics.attempts_ok.inc();
                    let stored = StoredResponse::from(&resp);
                    let mut recorded = false;
                    for _ in 0..3 {
                        match self
                            .backend
                            .complete(&key, token, &stored, cfg.max_age)
                            .await
                        {
                            Ok(owned) => {
                                recorded = owned;
                                break;
                            }
                            Err(e) => {
                                tracing::warn!(route, key = key.logged(), error = %e, "recording completion failed; retrying");
                                tokio::time::sleep(Duration::from_millis(100)).await;
                            }
                        }
                    }
                    if !recorded {
                        // Not acknowledged: left pending, taken over after claim_idle
                        // and found completed, or delivered again (at least once).
                        tracing::warn!(
                            route,
                            key = key.logged(),
                            "completion not recorded (claim lost or store failing); the entry stays pending"
                        );
                        return;
                    }
                    self.finish(state, id, order).await;
                    tracing::info!(
                        route,
                        key = key.logged(),
                        attempt,
                        status = stored.status,
                        duration_ms = took.as_secs_f64() * 1000.0,
                        "queued delivery completed"
                    );
                    return;
                }
                Ok(resp)
                    if let Some(hold) = super::retry_after(
                        &resp,
                        SystemTime::now(),
                        cfg.throttle.retry_after_cap,
                    ) =>
                {
                    // The application asks the route to slow down: give the attempt
                    // back and hold the route (every sidecar). At least `backoff`: a
                    // `Retry-After: 0` must not turn into a loop of uncounted attempts.
                    let hold = hold.max(cfg.backoff);
                    state.metrics.attempts_held.inc();
                    tracing::info!(
                        route,
                        key = key.logged(),
                        status = resp.status.as_u16(),
                        hold_ms = hold.as_millis() as u64,
                        "the application asked to wait (Retry-After); the route is held and the attempt not counted"
                    );
                    if let Err(e) = self.backend.unlock(&key, token, true).await {
                        tracing::warn!(route, key = key.logged(), error = %e, "unlock failed; the key frees at lease expiry");
                    }
                    if let Err(e) = self.backend.hold(route, hold).await {
                        tracing::warn!(route, error = %e, "holding the route failed; this entry waits alone");
                        if !self.pause(hold).await {
                            return;
                        }
                    }
                }
                other => {
                    state.metrics.attempts_failed.inc();
                    last_error = match other {
                        Ok(resp) => format!("upstream answered {}", resp.status.as_u16()),
                        Err(e) => e.to_string(),
                    };
                    tracing::info!(route, key = key.logged(), attempt, error = %last_error, "queued delivery attempt failed");
                    if attempt >= u64::from(cfg.max_attempts) {
                        self.bury(&held, attempt, &last_error).await;
                        return;
                    }
                    if let Err(e) = self.backend.unlock(&key, token, false).await {
                        tracing::warn!(route, key = key.logged(), error = %e, "unlock failed; the key frees at lease expiry");
                    }
                    let wait = backoff_delay(&cfg, attempt, rand::random::<f64>());
                    if !self.pause(wait).await {
                        return;
                    }
                }
            }
        }
    }

    /// Forwards an entry while renewing the key's claim.
    async fn forward(
        &self,
        held: &Held<'_>,
    ) -> Result<upstream::UpstreamResponse, upstream::UpstreamError> {
        let Held {
            state,
            entry,
            key,
            token,
            ..
        } = *held;
        let method = Method::from_bytes(entry.method.as_bytes()).unwrap_or(Method::POST);
        let mut headers = HeaderMap::new();
        upstream::decode_headers(&entry.headers, &mut headers);
        let (path, query) = match entry.path.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (entry.path.as_str(), None),
        };
        let pq = state.route.upstream_target(path, query);
        let call = trace::forward(
            &self.upstream,
            Outgoing {
                method: &method,
                path_and_query: &pq,
                headers,
                body: entry.body.clone(),
                authority: None,
                idempotency_key: None,
                traceparent: None,
            },
        );
        let route = &*state.route.name;
        // The lease in force at this attempt (a reload may have changed it).
        let pace = self.lifetimes.of(route).lease;
        lease::renewing(pace, || self.backend.renew(key, token), call, |event| match event {
            LeaseEvent::Lost => tracing::warn!(route, key = key.logged(), "delivery claim lost while the upstream call ran"),
            LeaseEvent::Failed(e) => tracing::warn!(route, key = key.logged(), error = %e, "renewing the delivery claim failed"),
        })
        .await
    }

    /// An attempt's span: a consumer span under the append's span (the entry's
    /// `traceparent`), linked to it as OpenTelemetry's messaging conventions ask.
    fn attempt_span(&self, held: &Held<'_>, attempt: u64) -> Option<Span> {
        if !self.tracer.is_on() {
            return None;
        }
        let mut headers = HeaderMap::new();
        upstream::decode_headers(&held.entry.headers, &mut headers);
        let from = trace::Incoming::from_headers(&headers);
        let route = &*held.state.route.name;
        let mut span = self.tracer.start(
            from.parent,
            from.state.as_ref(),
            format!("process {route}"),
            Kind::Consumer,
        )?;
        if let Some(p) = from.parent {
            span.link(p);
        }
        span.set("messaging.system", "idemgate");
        span.set("messaging.operation.type", "process");
        span.set("messaging.operation.name", "deliver");
        span.set("messaging.destination.name", route.to_string());
        span.set("messaging.message.id", held.key.key.clone());
        span.set("idemgate.route", route.to_string());
        span.set("idemgate.attempt", attempt);
        Some(span)
    }

    /// Acknowledges a delivered entry: an unordered one in the worker's next batch read
    /// (`Acks`), an ordered one (whose next entry waits for it) at once, retrying
    /// briefly (an unacknowledged one would be taken over and found completed:
    /// harmless, but slower).
    async fn finish(&self, state: &AsyncRouteState, id: &str, order: Option<&str>) {
        if order.is_none() && state.acks.offer(id) {
            return;
        }
        let route: &str = &state.route.name;
        for _ in 0..3 {
            match self.backend.done(route, id, order).await {
                Ok(()) => return,
                Err(e) => {
                    tracing::warn!(route, id, error = %e, "acknowledging a queue entry failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    /// Moves an exhausted entry to the dead-letter stream and releases its key, so a
    /// later copy from the provider is queued again.
    async fn bury(&self, held: &Held<'_>, attempts: u64, last_error: &str) {
        let Held {
            state,
            id,
            entry,
            key,
            token,
        } = *held;
        let route: &str = &state.route.name;
        match self
            .backend
            .dead_letter(route, id, entry, attempts, last_error)
            .await
        {
            Ok(()) => {
                state.metrics.dead_letters.inc();
                tracing::warn!(
                    route,
                    key = key.logged(),
                    attempts,
                    error = last_error,
                    "queued delivery moved to the dead-letter stream"
                );
            }
            Err(e) => {
                // Left pending: retried after a takeover.
                tracing::warn!(route, key = key.logged(), error = %e, "moving an entry to the dead-letter stream failed");
                let _ = self.backend.unlock(key, token, false).await;
                return;
            }
        }
        // Retried: a key left `queued` with its entry in the dead letters acknowledges
        // the provider's copies without queueing them (until a redrive).
        for _ in 0..3 {
            match self.backend.release(key, token).await {
                Ok(_) => return,
                Err(e) => {
                    tracing::warn!(route, key = key.logged(), error = %e, "releasing a dead-lettered key failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }
}
