//! The delivery log: what an operator may know about a delivery — its
//! status, attempts, duplicates answered, last outcome, upstream status and latency,
//! and (with `keep_payload = true` on its route) the request itself — and the three
//! operator actions on it: show, forget, replay.
//!
//! The log lives in the store, beside the claim: it is written by the claim, complete
//! and release scripts themselves (extra arguments, no extra round trip). The admin API,
//! the web console and `idemgate deliveries …` all go through the functions here.

pub mod audit;
pub mod cli;
pub mod jobs;
pub mod ops_cli;

use std::time::{Duration, Instant};

use http::{HeaderMap, Method};

use crate::providers::Fingerprint;
use crate::store::lease::{self, LeaseEvent};
use crate::store::log::{ClaimLog, LogOutcome, Settled};
use crate::store::{Claim, DeliveryKey, Status, Store, StoreError, StoredResponse};
use crate::upstream::{self, Outgoing, Upstream, UpstreamError};

/// Why a replay did not reach the upstream.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("no such delivery")]
    NotFound,
    #[error(
        "the request of this delivery was not kept (keep_payload is off for its route, or it was larger than the cap)"
    )]
    NotKept,
    #[error("a copy of this delivery is being processed; retry in {0} s")]
    InFlight(u64),
    #[error("the delivery changed while the replay started (its payload is now different)")]
    Changed,
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What an operator's replay got.
#[derive(Debug, Clone)]
pub struct Replayed {
    /// The upstream's status, or 502/504 when it could not be reached in time.
    pub status: u16,
    pub outcome: &'static str,
    /// Whether the new answer was recorded (2xx and the claim still owned).
    pub recorded: bool,
    pub latency_ms: u64,
}

/// An operator's replay of `key`'s kept request: it takes the key's claim like a
/// first delivery (a forced re-claim when the key is completed), so it never runs
/// beside a provider's copy — copies meanwhile get 409 — forwards the request with
/// its lease renewed, and records the new answer (or, when the upstream fails,
/// releases the key; a key that was completed goes back to its old answer, also when
/// this replay never settles: the store keeps the old answer until a new one is
/// recorded).
pub async fn replay<S: Store>(
    store: &S,
    upstream: &Upstream,
    key: &DeliveryKey,
    lease: Duration,
) -> Result<Replayed, ReplayError> {
    let entry = store.log_entry(key).await?.ok_or(ReplayError::NotFound)?;
    let req = entry.request.clone().ok_or(ReplayError::NotKept)?;
    let mut fp: Fingerprint = [0; 32];
    hex::decode_to_slice(&entry.fingerprint, &mut fp)
        .map_err(|_| StoreError::Unavailable("stored fingerprint is not hex".into()))?;
    let was_completed = entry.status == Status::Completed;
    let token = match store
        .claim(
            key,
            &fp,
            Some(ClaimLog {
                kept: None,
                replay: true,
            }),
        )
        .await?
    {
        Claim::Claimed(t) => t,
        Claim::InFlight { remaining } => {
            return Err(ReplayError::InFlight(crate::answer::retry_after_secs(
                remaining,
            )));
        }
        // An async route's delivery in its queue: the queue's worker is delivering it.
        Claim::Queued => return Err(ReplayError::InFlight(1)),
        Claim::Mismatch | Claim::Completed(_) => return Err(ReplayError::Changed),
    };
    let method = Method::from_bytes(req.method.as_bytes()).unwrap_or(Method::POST);
    let mut headers = HeaderMap::new();
    upstream::decode_headers(&req.headers, &mut headers);
    let started = Instant::now();
    let call = upstream.forward(Outgoing {
        method: &method,
        path_and_query: &req.path,
        headers,
        body: req.body.clone(),
        authority: None,
        idempotency_key: None,
        traceparent: None,
    });
    let result = lease::renewing(lease, || store.renew(key, token), call, |event| match event {
        LeaseEvent::Lost => tracing::warn!(route = &*key.route, key = key.logged(), "lease lost while a replay ran"),
        LeaseEvent::Failed(e) => tracing::warn!(route = &*key.route, key = key.logged(), error = %e, "lease renewal failed while a replay ran"),
    })
    .await;
    let latency_ms = started.elapsed().as_millis() as u64;
    match result {
        Ok(resp) if resp.status.is_success() => {
            let stored = StoredResponse::from(&resp);
            let settled = Settled {
                outcome: LogOutcome::OperatorReplay,
                upstream_status: Some(stored.status),
                latency_ms,
                restore_completed: false,
            };
            let recorded = store
                .complete(key, token, &stored, Some(&settled))
                .await
                .unwrap_or(false);
            Ok(Replayed {
                status: stored.status,
                outcome: settled.outcome.as_str(),
                recorded,
                latency_ms,
            })
        }
        other => {
            let status = match &other {
                Ok(r) => r.status.as_u16(),
                Err(UpstreamError::Timeout) => 504,
                Err(_) => 502,
            };
            let settled = Settled {
                outcome: LogOutcome::OperatorReplayFailed,
                upstream_status: other.as_ref().ok().map(|r| r.status.as_u16()),
                latency_ms,
                restore_completed: was_completed,
            };
            if let Err(e) = store.release(key, token, Some(&settled)).await {
                tracing::warn!(route = &*key.route, key = key.logged(), error = %e, "releasing after a failed replay failed; the key frees at lease expiry");
            }
            Ok(Replayed {
                status,
                outcome: settled.outcome.as_str(),
                recorded: false,
                latency_ms,
            })
        }
    }
}
