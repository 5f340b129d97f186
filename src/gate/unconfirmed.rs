//! Recording the completion of a delivery the upstream answered 2xx, and the answer
//! when the store does not hold it. With `min_replicas_ack`, a 2xx is passed on only
//! for a completion the replicas confirmed: otherwise 503, so the provider retries (a
//! 2xx here could be forwarded again after a failover, where the replica that takes
//! over may hold only the claim, or nothing); the retry is replayed if the completion
//! survived. Without it, the upstream's answer is passed on whatever the store did.

use super::Gate;
use crate::answer::{Answer, ErrorAnswer, error_answer};
use crate::metrics::{Outcome, RouteMetrics, StoreOp};
use crate::providers::{Fingerprint, Route};
use crate::store::log::Settled;
use crate::store::{DeliveryKey, Store, StoredResponse, Token};
use crate::trace;
use http::StatusCode;

/// The claim a delivery was forwarded under: what recording its completion needs.
pub(super) struct Claimed<'a> {
    pub(super) route: &'a Route,
    pub(super) rm: &'a RouteMetrics,
    pub(super) key: &'a DeliveryKey,
    pub(super) fp: &'a Fingerprint,
    pub(super) token: Token,
}

/// What the store holds once the gate tried to record a completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Recorded {
    /// The completion is held (and confirmed, where the store confirms completions).
    Held,
    /// The claim was lost and another claimer, the queue or another payload holds
    /// the key now: this answer is not recorded.
    Taken,
    /// The store failed or its replicas did not confirm in time.
    Failed,
}

/// Whether the upstream's 2xx may be passed on, given what the store holds: always
/// without replica acks (the application's answer is the truth the provider needs);
/// with them, only for a completion the replicas hold.
pub(super) fn may_answer_2xx(recorded: Recorded, confirms_completions: bool) -> bool {
    recorded == Recorded::Held || !confirms_completions
}

impl<S: Store> Gate<S> {
    /// Records the completion: by the claim's owner, or, when the claim is gone (its
    /// lease lapsed, a failover lost it), for the key if no one else holds it. A
    /// completion that failed (store error, replicas short) is not tried again.
    pub(super) async fn record_completion(
        &self,
        c: &Claimed<'_>,
        stored: &StoredResponse,
        settled: &Settled,
    ) -> Recorded {
        let owned = self
            .timed(
                StoreOp::Complete,
                trace::store_op(
                    "complete",
                    self.store.complete(c.key, c.token, stored, Some(settled)),
                ),
            )
            .await;
        let (route, key) = (&*c.route.name, c.key.logged());
        match owned {
            Ok(true) => return Recorded::Held,
            // The outcome is unknown (a timeout) or unconfirmed: a second write would
            // only wait as long again.
            Err(e) => {
                c.rm.lease_lost.inc();
                tracing::warn!(route, key, error = %e, "recording the completion failed; the key frees at lease expiry");
                return Recorded::Failed;
            }
            Ok(false) => c.rm.lease_lost.inc(),
        }
        let unowned = self
            .timed(
                StoreOp::Complete,
                trace::store_op(
                    "complete",
                    self.store
                        .complete_unowned(c.key, c.fp, stored, Some(settled)),
                ),
            )
            .await;
        match unowned {
            Ok(true) => {
                tracing::warn!(
                    route,
                    key,
                    "the claim was lost before completion; the answer was recorded without it"
                );
                Recorded::Held
            }
            Ok(false) => {
                tracing::warn!(
                    route,
                    key,
                    "the claim was lost before completion and another claimer holds the key; the answer was not recorded"
                );
                Recorded::Taken
            }
            Err(e) => {
                tracing::warn!(route, key, error = %e, "the claim was lost before completion and recording the answer failed");
                Recorded::Failed
            }
        }
    }
}

/// 503 `store_unavailable` + `Retry-After: 1`, counted as a store outage.
pub(super) fn answer() -> (Outcome, Answer) {
    let r = ErrorAnswer::new(
        Outcome::StoreUnavailable,
        StatusCode::SERVICE_UNAVAILABLE,
        "store_unavailable",
        "the completion was not recorded and confirmed by the store; retry later",
    )
    .retry_after(1);
    (r.outcome, error_answer(&r))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_2xx_is_passed_on_without_acks_whatever_the_store_did() {
        for r in [Recorded::Held, Recorded::Taken, Recorded::Failed] {
            assert!(may_answer_2xx(r, false), "{r:?}");
        }
    }

    #[test]
    fn with_acks_only_a_held_completion_is_answered_2xx() {
        assert!(may_answer_2xx(Recorded::Held, true));
        assert!(!may_answer_2xx(Recorded::Taken, true));
        assert!(!may_answer_2xx(Recorded::Failed, true));
    }
}
