//! The route's pacing state in process, beside the in-memory queue: the same rules as
//! the Redis script (`store/redis/scripts/pacing_admit.lua`) for one sidecar.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::queue::{MemoryQueue, parse};
use crate::store::pacing::{Admit, Ask, Pacing, RouteState};
use crate::store::queue::StoreFuture;

/// One route's pacing state.
#[derive(Default)]
pub(super) struct Pace {
    paused: bool,
    hold_until: Option<Instant>,
    /// The token bucket: tokens left when last counted, and when (`None`: full).
    bucket: Option<(f64, Instant)>,
    /// Concurrency slots taken, and when each lapses.
    slots: HashMap<String, Instant>,
}

impl Pacing for MemoryQueue {
    fn admit<'a>(&'a self, route: &'a str, ask: Ask<'a>) -> StoreFuture<'a, Admit> {
        let now = Instant::now();
        Self::ready(self.with(|s| {
            let q = s.routes.entry(route.to_string()).or_default();
            if q.pace.paused {
                return Admit::Paused;
            }
            if let Some(until) = q.pace.hold_until.filter(|u| *u > now) {
                return Admit::Held(until - now);
            }
            if let Some((value, id)) = ask.order {
                let me = parse(id);
                if !me.is_some_and(|me| q.holds(me)) {
                    return Admit::Gone;
                }
                // An ID whose entry is gone no longer holds the others.
                while let Some(head) = q.orders.get(value).and_then(|l| l.front().copied()) {
                    if Some(head) == me {
                        break;
                    }
                    if q.holds(head) {
                        return Admit::Ordered;
                    }
                    if let Some(l) = q.orders.get_mut(value) {
                        l.pop_front();
                    }
                }
            }
            let pace = &mut q.pace;
            if ask.max_concurrency > 0 {
                pace.slots.retain(|_, lapses| *lapses > now);
                if pace.slots.len() as u64 >= u64::from(ask.max_concurrency) {
                    return Admit::Busy;
                }
            }
            if ask.rate > 0.0 {
                let (left, at) = pace.bucket.unwrap_or((ask.burst, now));
                let tokens =
                    (left + now.duration_since(at).as_secs_f64() * ask.rate).min(ask.burst);
                if tokens < 1.0 {
                    let ms = ((1.0 - tokens) * 1000.0 / ask.rate).ceil().max(1.0);
                    return Admit::Wait(Duration::from_millis(ms as u64));
                }
                pace.bucket = Some((tokens - 1.0, now));
            }
            if ask.max_concurrency > 0 {
                pace.slots.insert(ask.slot.to_string(), now + ask.slot_ttl);
            }
            Admit::Go
        }))
    }

    fn leave<'a>(&'a self, route: &'a str, slot: &'a str) -> StoreFuture<'a, ()> {
        Self::ready(self.with(|s| {
            if let Some(q) = s.routes.get_mut(route) {
                q.pace.slots.remove(slot);
            }
        }))
    }

    fn hold<'a>(&'a self, route: &'a str, d: Duration) -> StoreFuture<'a, ()> {
        let until = Instant::now() + d;
        Self::ready(self.with(|s| {
            let pace = &mut s.routes.entry(route.to_string()).or_default().pace;
            if pace.hold_until.is_none_or(|u| u < until) {
                pace.hold_until = Some(until);
            }
        }))
    }

    fn set_paused<'a>(&'a self, route: &'a str, paused: bool) -> StoreFuture<'a, ()> {
        Self::ready(self.with(|s| {
            s.routes.entry(route.to_string()).or_default().pace.paused = paused;
        }))
    }

    fn route_state<'a>(&'a self, route: &'a str) -> StoreFuture<'a, RouteState> {
        let now = Instant::now();
        Self::ready(self.with(|s| match s.routes.get(route) {
            None => RouteState::default(),
            Some(q) => RouteState {
                paused: q.pace.paused,
                held_for: q.pace.hold_until.filter(|u| *u > now).map(|u| u - now),
                in_flight: q.pace.slots.values().filter(|l| **l > now).count() as u64,
            },
        }))
    }
}
