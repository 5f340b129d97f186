//! The answer to a delivery whose upstream answered 2xx but whose completion the store
//! could not confirm with `min_replicas_ack`: 503, so the provider retries. A 2xx here
//! could be forwarded again after a failover (the replica that takes over may hold
//! only the claim); the retry is replayed if the completion survived.

use crate::answer::{Answer, ErrorAnswer, error_answer};
use crate::metrics::Outcome;
use http::StatusCode;

/// 503 `store_unavailable` + `Retry-After: 1`, counted as a store outage.
pub(super) fn answer() -> (Outcome, Answer) {
    let r = ErrorAnswer::new(
        Outcome::StoreUnavailable,
        StatusCode::SERVICE_UNAVAILABLE,
        "store_unavailable",
        "the completion was not confirmed by the store's replicas; retry later",
    )
    .retry_after(1);
    (r.outcome, error_answer(&r))
}
