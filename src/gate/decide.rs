//! The answer table as a pure function: what a claim's outcome leads to.

use http::StatusCode;

use crate::answer::{ErrorAnswer, retry_after_secs};
use crate::config::InFlightPolicy;
use crate::metrics::Outcome;
use crate::store::{Claim, StoredResponse, Token};

/// What to do after a claim attempt: the pure decision of the answer table.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// First seen (or released before): forward, owning `Token`.
    Forward(Token),
    /// Completed with the same payload: replay the stored answer.
    Replay(StoredResponse),
    /// Held by another claimer: wait for it (policy `wait`, not yet waited).
    Wait,
    /// Answer without forwarding.
    Refuse(ErrorAnswer),
    /// Queued on an async route (or being delivered from its queue): acknowledge again.
    Acknowledge,
}

/// The decision for each claim outcome (README's "What each delivery gets" table).
pub fn decide(claim: Claim, policy: InFlightPolicy, waited: bool) -> Step {
    match claim {
        Claim::Claimed(token) => Step::Forward(token),
        Claim::Completed(resp) => Step::Replay(resp),
        Claim::Queued => Step::Acknowledge,
        Claim::Mismatch => Step::Refuse(ErrorAnswer::new(
            Outcome::PayloadMismatch,
            StatusCode::UNPROCESSABLE_ENTITY,
            "payload_mismatch",
            "this idempotency key was already used with a different payload",
        )),
        Claim::InFlight { .. } if policy == InFlightPolicy::Wait && !waited => Step::Wait,
        Claim::InFlight { remaining } => Step::Refuse(
            ErrorAnswer::new(
                Outcome::InFlight,
                StatusCode::CONFLICT,
                "in_flight",
                "a copy of this delivery is being processed; retry later",
            )
            .retry_after(retry_after_secs(remaining)),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::answer::tests::stored;
    use std::time::Duration;

    #[test]
    fn each_claim_outcome_gets_its_answer() {
        let t = Token([1; 16]);
        assert_eq!(
            decide(Claim::Claimed(t), InFlightPolicy::Reject, false),
            Step::Forward(t)
        );
        assert_eq!(
            decide(Claim::Completed(stored()), InFlightPolicy::Reject, false),
            Step::Replay(stored())
        );
        let Step::Refuse(r) = decide(Claim::Mismatch, InFlightPolicy::Wait, false) else {
            panic!()
        };
        assert_eq!(
            (r.status, r.outcome),
            (StatusCode::UNPROCESSABLE_ENTITY, Outcome::PayloadMismatch)
        );
        let inflight = Claim::InFlight {
            remaining: Duration::from_millis(2100),
        };
        let Step::Refuse(r) = decide(inflight.clone(), InFlightPolicy::Reject, false) else {
            panic!()
        };
        assert_eq!((r.status, r.retry_after), (StatusCode::CONFLICT, Some(3)));
        assert_eq!(
            decide(inflight.clone(), InFlightPolicy::Wait, false),
            Step::Wait
        );
        let Step::Refuse(r) = decide(inflight, InFlightPolicy::Wait, true) else {
            panic!()
        };
        assert_eq!(r.outcome, Outcome::InFlight);
    }

    #[test]
    fn a_queued_key_is_acknowledged_under_either_in_flight_policy() {
        for policy in [InFlightPolicy::Reject, InFlightPolicy::Wait] {
            assert_eq!(decide(Claim::Queued, policy, false), Step::Acknowledge);
        }
    }
}
