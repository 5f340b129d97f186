//! The bound on unsigned scopes per signed body. Some presets claim a delivery under
//! its body's hash *and* unsigned headers (Shopify's `X-Shopify-Topic` and
//! `X-Shopify-Shop-Domain`, Bitbucket's `X-Event-Key`), because the provider sends one
//! body as several events. Without a bound, anyone holding one captured delivery could
//! replay it with a new header value each time: each copy forwarded to the application
//! and stored as a new record. Here each signed body may be seen under at most
//! `MAX_SCOPES_PER_BODY` distinct scopes per route for the route's retention; a further
//! one is refused (422 `scope_limit`, outcome `scope_refused`) before the store is asked.
//!
//! The memory is per process and bounded (`MAX_BODIES` bodies remembered, the oldest
//! dropped first), so with N replicas a body reaches at most N × the bound.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use http::StatusCode;

use crate::answer::ErrorAnswer;
use crate::metrics::Outcome;
use crate::providers::Fingerprint;

/// Distinct unsigned scopes one signed body may be claimed under, per route (Shopify
/// sends one order as a handful of topics).
pub const MAX_SCOPES_PER_BODY: usize = 8;
/// Signed bodies remembered at once, over all routes (about 150 bytes each).
const MAX_BODIES: usize = 65_536;

type BodyId = (Arc<str>, Fingerprint);

/// The scopes a signed body was seen under, until its route's retention ends.
struct Seen {
    scopes: Vec<u64>,
    until: Instant,
}

#[derive(Default)]
struct Bodies {
    seen: HashMap<BodyId, Seen>,
    /// The bodies in the order they were first seen, with their end.
    order: VecDeque<(BodyId, Instant)>,
}

/// See the module documentation.
#[derive(Default)]
pub struct ScopeBound {
    bodies: Mutex<Bodies>,
}

impl ScopeBound {
    /// Whether the body `body` of `route` may be claimed under `scope` (the hash of
    /// the body with its scope headers) now: yes when seen under it before or under
    /// fewer than `MAX_SCOPES_PER_BODY` others within `retention`.
    pub(crate) fn admit(
        &self,
        route: &Arc<str>,
        body: &Fingerprint,
        scope: &Fingerprint,
        retention: Duration,
        now: Instant,
    ) -> bool {
        let mut b = self.bodies.lock().unwrap_or_else(PoisonError::into_inner);
        let b = &mut *b;
        while let Some((id, until)) = b.order.front() {
            if *until > now && b.order.len() <= MAX_BODIES {
                break;
            }
            if b.seen.get(id).is_some_and(|s| s.until == *until) {
                b.seen.remove(id);
            }
            b.order.pop_front();
        }
        let scope = u64::from_le_bytes(scope[..8].try_into().unwrap_or_default());
        let id = (route.clone(), *body);
        match b.seen.get_mut(&id) {
            Some(s) if s.scopes.contains(&scope) => true,
            Some(s) if s.scopes.len() < MAX_SCOPES_PER_BODY => {
                s.scopes.push(scope);
                true
            }
            Some(_) => false,
            None => {
                let until = now + retention;
                b.seen.insert(
                    id.clone(),
                    Seen {
                        scopes: vec![scope],
                        until,
                    },
                );
                b.order.push_back((id, until));
                true
            }
        }
    }
}

/// The answer to a body seen under too many scopes.
pub(crate) fn scope_refused() -> ErrorAnswer {
    ErrorAnswer::new(
        Outcome::ScopeRefused,
        StatusCode::UNPROCESSABLE_ENTITY,
        "scope_limit",
        "this signed body was already delivered under the most unsigned scope headers allowed",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_gets_a_bounded_number_of_scopes_for_its_retention() {
        let bound = ScopeBound::default();
        let (route, other): (Arc<str>, Arc<str>) = ("shop".into(), "other".into());
        let hour = Duration::from_secs(3600);
        let t0 = Instant::now();
        let scope = |n: u8| [n; 32];
        for n in 0..MAX_SCOPES_PER_BODY as u8 {
            assert!(bound.admit(&route, &[1; 32], &scope(n), hour, t0));
        }
        // A new scope is refused; one seen before (a provider's retry) is not.
        assert!(!bound.admit(&route, &[1; 32], &scope(200), hour, t0));
        assert!(bound.admit(&route, &[1; 32], &scope(3), hour, t0));
        // Another body, or the same body on another route, has its own count.
        assert!(bound.admit(&route, &[2; 32], &scope(200), hour, t0));
        assert!(bound.admit(&other, &[1; 32], &scope(200), hour, t0));
        // After the retention the body starts over.
        let later = t0 + hour + Duration::from_secs(1);
        assert!(bound.admit(&route, &[1; 32], &scope(200), hour, later));
    }

    #[test]
    fn the_bodies_remembered_are_bounded() {
        let bound = ScopeBound::default();
        let route: Arc<str> = "shop".into();
        let t0 = Instant::now();
        for n in 0..(MAX_BODIES + 10) as u32 {
            let mut body = [0u8; 32];
            body[..4].copy_from_slice(&n.to_le_bytes());
            bound.admit(&route, &body, &[0; 32], Duration::from_secs(3600), t0);
        }
        let b = bound.bodies.lock().unwrap();
        assert!(b.seen.len() <= MAX_BODIES + 1, "{}", b.seen.len());
        assert!(b.order.len() <= MAX_BODIES + 1, "{}", b.order.len());
    }
}
