//! A circuit breaker around any `Store`: after `threshold` consecutive failures the
//! store is not asked for `cooldown`, so a dead Redis costs a delivery microseconds (a
//! fast 503) instead of a full store timeout each; then one probe is let through
//! (half-open), and its outcome closes the breaker or opens it for another cooldown.
//!
//! Only the calls that *start* work are refused while open: `claim` (and `wait_for`,
//! which claims) and `ping` (so `/readyz` follows the breaker, and its probe can close
//! it). `renew`, `complete` and `release` settle a delivery that already holds a
//! claim, and recording that settlement is what keeps a retry from being forwarded
//! twice, so they are always attempted (each still bounded by the store timeout);
//! their outcomes feed the breaker like any other.
//!
//! Generic over the store, so the Redis store, the memory store and any future store
//! share it.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::log::{ClaimLog, Settled};
use super::{Claim, DeliveryKey, RouteLifetimes, Store, StoreError, StoredResponse, Token};
use crate::providers::Fingerprint;

/// Where the breaker stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    /// The store is asked; `failures` consecutive failures so far.
    Closed { failures: u32 },
    /// The store is not asked until `until`.
    Open { until: Instant },
    /// One probe is on its way; everything else is refused until it returns.
    HalfOpen,
}

/// The decision logic, free of I/O and of the clock (callers pass `now`), so that it
/// is tested exhaustively on its own.
#[derive(Debug)]
pub struct Circuit {
    state: BreakerState,
    threshold: u32,
    cooldown: Duration,
}

/// What `Circuit::admit` allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Ask the store (the breaker is closed).
    Pass,
    /// Ask the store as the one probe of a half-open breaker.
    Probe,
    /// Don't ask: the breaker is open (or a probe is already out).
    Refuse,
}

impl Circuit {
    pub fn new(threshold: u32, cooldown: Duration) -> Circuit {
        Circuit {
            state: BreakerState::Closed { failures: 0 },
            threshold: threshold.max(1),
            cooldown,
        }
    }

    pub fn state(&self) -> BreakerState {
        self.state
    }

    /// Whether a call that starts work may ask the store now.
    pub fn admit(&mut self, now: Instant) -> Admission {
        match self.state {
            BreakerState::Closed { .. } => Admission::Pass,
            BreakerState::Open { until } if now >= until => {
                self.state = BreakerState::HalfOpen;
                Admission::Probe
            }
            BreakerState::Open { .. } | BreakerState::HalfOpen => Admission::Refuse,
        }
    }

    /// Records the outcome of a store call. Returns the new state when it changed
    /// between closed and open (for a log line), `None` otherwise.
    pub fn record(&mut self, ok: bool, now: Instant) -> Option<BreakerState> {
        let before_open = !matches!(self.state, BreakerState::Closed { .. });
        self.state = match (self.state, ok) {
            (_, true) => BreakerState::Closed { failures: 0 },
            (BreakerState::Closed { failures }, false) if failures + 1 < self.threshold => {
                BreakerState::Closed {
                    failures: failures + 1,
                }
            }
            // An open breaker stays open until its cooldown ends: a settlement call
            // failing meanwhile must not extend it forever.
            (BreakerState::Open { until }, false) => BreakerState::Open { until },
            (_, false) => BreakerState::Open {
                until: now + self.cooldown,
            },
        };
        let after_open = !matches!(self.state, BreakerState::Closed { .. });
        (before_open != after_open).then_some(self.state)
    }

    /// A probe that never reported (its future was dropped): let the next call probe.
    pub fn probe_abandoned(&mut self, now: Instant) {
        if self.state == BreakerState::HalfOpen {
            self.state = BreakerState::Open { until: now };
        }
    }

    pub fn is_open(&self) -> bool {
        !matches!(self.state, BreakerState::Closed { .. })
    }
}

/// See the module documentation.
pub struct Breaker<S> {
    inner: S,
    /// Shared by the breakers of every delivery runtime (`Breaker::sharing`).
    circuit: Arc<Mutex<Circuit>>,
}

/// Puts a half-open breaker back to "probe again" if the probe is dropped unfinished.
struct ProbeGuard<'a> {
    circuit: Option<&'a Mutex<Circuit>>,
}

impl Drop for ProbeGuard<'_> {
    fn drop(&mut self) {
        if let Some(c) = self.circuit
            && let Ok(mut c) = c.lock()
        {
            c.probe_abandoned(Instant::now());
        }
    }
}

impl<S: Store> Breaker<S> {
    pub fn new(inner: S, threshold: u32, cooldown: Duration) -> Breaker<S> {
        Breaker {
            inner,
            circuit: Arc::new(Mutex::new(Circuit::new(threshold, cooldown))),
        }
    }

    /// A breaker on `inner` (another delivery runtime's handle on the same store) that
    /// shares `other`'s circuit: a dead store is asked `threshold` times in all, not
    /// that many per runtime, and `/readyz` follows every runtime's calls.
    pub fn sharing(inner: S, other: &Breaker<S>) -> Breaker<S> {
        Breaker {
            inner,
            circuit: other.circuit.clone(),
        }
    }

    pub fn inner(&self) -> &S {
        &self.inner
    }

    pub fn state(&self) -> BreakerState {
        self.lock().state()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Circuit> {
        // The lock only guards plain data updated without panicking paths; a poisoned
        // lock still holds a consistent state.
        self.circuit.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn record<T>(&self, r: &Result<T, StoreError>) {
        let ok = match r {
            Ok(_) => true,
            // A full store answers; it is not failing (and opening the circuit would
            // refuse the copies it could still answer from what it remembers).
            Err(StoreError::CircuitOpen) | Err(StoreError::Full) => return,
            Err(_) => false,
        };
        let changed = self.lock().record(ok, Instant::now());
        match changed {
            Some(BreakerState::Closed { .. }) => {
                tracing::info!("store answered again: circuit breaker closed")
            }
            Some(_) => tracing::warn!(
                "store failing: circuit breaker open, deliveries get 503 without asking it"
            ),
            None => {}
        }
    }

    /// Runs a call that starts work, if the breaker admits it.
    async fn gated<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let admission = self.lock().admit(Instant::now());
        let mut guard = ProbeGuard { circuit: None };
        match admission {
            Admission::Refuse => return Err(StoreError::CircuitOpen),
            Admission::Probe => guard.circuit = Some(&self.circuit),
            Admission::Pass => {}
        }
        let r = call.await;
        guard.circuit = None;
        self.record(&r);
        r
    }

    /// Runs a settlement call: always attempted, its outcome recorded.
    async fn observed<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let r = call.await;
        self.record(&r);
        r
    }
}

/// The delivery log, read and forgotten by operators: straight to the store, never
/// held back by the breaker (the log's writes ride on claim, complete and release).
impl<S: Store> crate::store::log::DeliveryLog for Breaker<S> {
    fn log_support(&self) -> crate::store::log::LogSupport {
        self.inner.log_support()
    }

    async fn log_entry(
        &self,
        key: &DeliveryKey,
    ) -> Result<Option<crate::store::log::LogEntry>, StoreError> {
        self.inner.log_entry(key).await
    }

    async fn recent(
        &self,
        query: &crate::store::log::ListQuery,
    ) -> Result<crate::store::log::Page, StoreError> {
        self.inner.recent(query).await
    }

    async fn forget(&self, key: &DeliveryKey) -> Result<crate::store::log::Forgot, StoreError> {
        self.inner.forget(key).await
    }

    async fn flush(&self) {
        self.inner.flush().await
    }
}

impl<S: Store> Store for Breaker<S> {
    async fn claim(
        &self,
        key: &DeliveryKey,
        fp: &Fingerprint,
        log: Option<ClaimLog<'_>>,
    ) -> Result<Claim, StoreError> {
        self.gated(self.inner.claim(key, fp, log)).await
    }

    async fn renew(&self, key: &DeliveryKey, token: Token) -> Result<bool, StoreError> {
        self.observed(self.inner.renew(key, token)).await
    }

    async fn complete(
        &self,
        key: &DeliveryKey,
        token: Token,
        response: &StoredResponse,
        settled: Option<&Settled>,
    ) -> Result<bool, StoreError> {
        self.observed(self.inner.complete(key, token, response, settled))
            .await
    }

    async fn release(
        &self,
        key: &DeliveryKey,
        token: Token,
        settled: Option<&Settled>,
    ) -> Result<bool, StoreError> {
        self.observed(self.inner.release(key, token, settled)).await
    }

    async fn complete_unowned(
        &self,
        key: &DeliveryKey,
        fp: &Fingerprint,
        response: &StoredResponse,
        settled: Option<&Settled>,
    ) -> Result<bool, StoreError> {
        self.observed(self.inner.complete_unowned(key, fp, response, settled))
            .await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.gated(self.inner.ping()).await
    }

    fn circuit_open(&self) -> bool {
        self.lock().is_open()
    }

    fn broken(&self) -> Option<String> {
        self.inner.broken()
    }

    fn lifetimes(&self) -> &RouteLifetimes {
        self.inner.lifetimes()
    }

    fn confirms_completions(&self) -> bool {
        self.inner.confirms_completions()
    }

    fn bound_stats(&self) -> Option<crate::store::BoundStats> {
        self.inner.bound_stats()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const COOL: Duration = Duration::from_millis(500);

    #[test]
    fn opens_after_threshold_consecutive_failures() {
        let t0 = Instant::now();
        let mut c = Circuit::new(3, COOL);
        assert_eq!(c.record(false, t0), None);
        assert_eq!(c.record(true, t0), None); // a success resets the count
        assert_eq!(c.record(false, t0), None);
        assert_eq!(c.record(false, t0), None);
        assert_eq!(c.admit(t0), Admission::Pass);
        assert_eq!(
            c.record(false, t0),
            Some(BreakerState::Open { until: t0 + COOL })
        );
        assert_eq!(c.admit(t0), Admission::Refuse);
        assert_eq!(c.admit(t0 + COOL / 2), Admission::Refuse);
    }

    #[test]
    fn half_open_lets_one_probe_through() {
        let t0 = Instant::now();
        let mut c = Circuit::new(1, COOL);
        c.record(false, t0);
        let t1 = t0 + COOL;
        assert_eq!(c.admit(t1), Admission::Probe);
        assert_eq!(c.admit(t1), Admission::Refuse, "only one probe at a time");
        // the probe fails: open for another cooldown
        assert_eq!(c.record(false, t1), None);
        assert_eq!(c.state(), BreakerState::Open { until: t1 + COOL });
        let t2 = t1 + COOL;
        assert_eq!(c.admit(t2), Admission::Probe);
        assert_eq!(
            c.record(true, t2),
            Some(BreakerState::Closed { failures: 0 })
        );
        assert_eq!(c.admit(t2), Admission::Pass);
    }

    #[test]
    fn failures_while_open_do_not_extend_the_cooldown() {
        let t0 = Instant::now();
        let mut c = Circuit::new(1, COOL);
        c.record(false, t0);
        c.record(false, t0 + COOL / 2);
        assert_eq!(c.state(), BreakerState::Open { until: t0 + COOL });
    }

    #[test]
    fn an_abandoned_probe_lets_the_next_call_probe() {
        let t0 = Instant::now();
        let mut c = Circuit::new(1, COOL);
        c.record(false, t0);
        assert_eq!(c.admit(t0 + COOL), Admission::Probe);
        c.probe_abandoned(t0 + COOL);
        assert_eq!(c.admit(t0 + COOL), Admission::Probe);
    }

    #[test]
    fn a_threshold_of_zero_means_one() {
        let t0 = Instant::now();
        let mut c = Circuit::new(0, COOL);
        assert!(c.record(false, t0).is_some());
    }
}
