//! The route's pacing state on Redis, shared by every sidecar (see `store::pacing`).
//!
//! Keys, all under the route's hash tag (one slot with its queue, so the admission
//! script can look at the queue): `{prefix}:pace:{<route>}` (a hash: `paused`,
//! `hold_until`, and the token bucket's `tokens`, `tokens_at`), `…:slots` (a sorted set
//! of the concurrency slots taken, scored by when each lapses) and
//! `{prefix}:order:{<route>}:<order value>` (a list of the queue entry IDs of one order
//! value, oldest first: appended by the queue's append script, removed when an entry
//! is acknowledged or dead-lettered).

use std::time::Duration;

use redis::Value;

use super::queue::RedisQueue;
use super::{Call, bytes_of, int_of, ms};
use crate::store::pacing::{Admit, Ask, Pacing, RouteState};
use crate::store::queue::StoreFuture;

impl RedisQueue {
    /// `{prefix}:pace:{<route>}`
    pub(super) fn pace_key(&self, route: &str) -> String {
        format!("{}:pace:{{{route}}}", self.prefix())
    }

    /// `{prefix}:order:{<route>}:<value>`
    pub(super) fn order_key(&self, route: &str, value: &str) -> String {
        format!("{}:order:{{{route}}}:{value}", self.prefix())
    }
}

impl Pacing for RedisQueue {
    fn admit<'a>(&'a self, route: &'a str, ask: Ask<'a>) -> StoreFuture<'a, Admit> {
        Box::pin(async move {
            let pace = self.pace_key(route);
            let slots = format!("{pace}:slots");
            let queue = self.queue_key(route);
            let (order, entry) = match ask.order {
                Some((value, id)) => (self.order_key(route, value), id),
                None => (pace.clone(), ""),
            };
            let call = Call::new(&self.scripts().admit, &[&pace, &slots, &queue, &order])
                .arg(ask.slot)
                .arg(entry)
                .arg(ask.max_concurrency)
                .arg(ask.rate.to_string())
                .arg(ask.burst.to_string())
                .arg(ms(ask.slot_ttl));
            let reply = self.script(call).await?;
            let parts = match &reply {
                Value::Array(a) => a.as_slice(),
                _ => &[],
            };
            let wait =
                Duration::from_millis(parts.get(1).and_then(int_of).unwrap_or(0).max(0) as u64);
            Ok(match parts.first().and_then(bytes_of) {
                Some(b"go") => Admit::Go,
                Some(b"paused") => Admit::Paused,
                Some(b"held") => Admit::Held(wait),
                Some(b"ordered") => Admit::Ordered,
                Some(b"gone") => Admit::Gone,
                Some(b"busy") => Admit::Busy,
                Some(b"wait") => Admit::Wait(wait),
                _ => {
                    return Err(crate::store::StoreError::Unavailable(
                        "unexpected reply to the delivery admission".into(),
                    ));
                }
            })
        })
    }

    fn leave<'a>(&'a self, route: &'a str, slot: &'a str) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let mut cmd = redis::cmd("ZREM");
            cmd.arg(format!("{}:slots", self.pace_key(route))).arg(slot);
            self.query::<Value>(cmd).await.map(|_| ())
        })
    }

    fn hold<'a>(&'a self, route: &'a str, d: Duration) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let pace = self.pace_key(route);
            let call = Call::new(&self.scripts().hold, &[&pace]).arg(ms(d));
            self.script(call).await.map(|_| ())
        })
    }

    fn set_paused<'a>(&'a self, route: &'a str, paused: bool) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let mut cmd = redis::cmd(if paused { "HSET" } else { "HDEL" });
            cmd.arg(self.pace_key(route)).arg("paused");
            if paused {
                cmd.arg(1);
            }
            self.query::<Value>(cmd).await.map(|_| ())
        })
    }

    fn route_state<'a>(&'a self, route: &'a str) -> StoreFuture<'a, RouteState> {
        Box::pin(async move {
            let pace = self.pace_key(route);
            let slots = format!("{pace}:slots");
            let call = Call::new(&self.scripts().state, &[&pace, &slots]);
            let reply = self.script(call).await?;
            let n = |i: usize| match &reply {
                Value::Array(a) => a.get(i).and_then(int_of).unwrap_or(0).max(0) as u64,
                _ => 0,
            };
            Ok(RouteState {
                paused: n(0) == 1,
                held_for: (n(1) > 0).then(|| Duration::from_millis(n(1))),
                in_flight: n(2),
            })
        })
    }
}
