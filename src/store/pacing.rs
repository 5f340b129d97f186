//! The state that paces an async route's deliveries for the whole deployment: paused
//! or not, held until when (the application's `Retry-After`), the token bucket of its
//! `rate`, the slots of its `max_concurrency`, and the order of the deliveries that
//! share an order key. On Redis it is shared by every sidecar (`store/redis/pacing.rs`);
//! the memory store keeps it in process. The policy that uses it lives in
//! `crate::queue` (docs/async.md, "Protecting the application").

use std::time::Duration;

use super::queue::StoreFuture;

/// What one delivery attempt asks before it may start.
#[derive(Debug, Clone, Copy)]
pub struct Ask<'a> {
    /// Names this attempt's concurrency slot (unique per attempt).
    pub slot: &'a str,
    /// `Some((order value, queue entry ID))`: start only when the entry is the oldest
    /// unfinished one of its order value (and still in the queue).
    pub order: Option<(&'a str, &'a str)>,
    /// 0: no bound.
    pub max_concurrency: u32,
    /// Deliveries per second; 0.0: no bound.
    pub rate: f64,
    pub burst: f64,
    /// How long a slot is kept when its holder never gives it back (a dead sidecar).
    pub slot_ttl: Duration,
}

/// The answer to an `Ask`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Start now; give the slot back with `leave` when done.
    Go,
    /// The route is paused.
    Paused,
    /// The application asked to wait this long still (`Retry-After`).
    Held(Duration),
    /// An older delivery of the same order value is not finished.
    Ordered,
    /// The ordered entry is no longer in the queue (another worker finished it).
    Gone,
    /// Every concurrency slot is taken.
    Busy,
    /// The token bucket is empty for this long.
    Wait(Duration),
}

/// A route's pacing state as the operator sees it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RouteState {
    pub paused: bool,
    /// How long the application's `Retry-After` still holds the route.
    pub held_for: Option<Duration>,
    /// Concurrency slots taken now.
    pub in_flight: u64,
}

/// The pacing state's operations, each one store round trip.
pub trait Pacing: Send + Sync + 'static {
    /// May one more delivery of `route` start now (see `Admit`)? On `Go` the token is
    /// spent and the slot taken.
    fn admit<'a>(&'a self, route: &'a str, ask: Ask<'a>) -> StoreFuture<'a, Admit>;
    /// Gives an attempt's slot back.
    fn leave<'a>(&'a self, route: &'a str, slot: &'a str) -> StoreFuture<'a, ()>;
    /// Holds the route's deliveries for `d` from now (a longer hold in place stays).
    fn hold<'a>(&'a self, route: &'a str, d: Duration) -> StoreFuture<'a, ()>;
    /// Pauses or resumes the route.
    fn set_paused<'a>(&'a self, route: &'a str, paused: bool) -> StoreFuture<'a, ()>;
    fn route_state<'a>(&'a self, route: &'a str) -> StoreFuture<'a, RouteState>;
}
