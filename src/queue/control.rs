//! What operators do to an async route as a whole (docs/operating.md): pause and
//! resume it for every sidecar sharing the store, read its state, and pace their own
//! bulk replays like the route's deliveries.

use std::future::Future;

use super::AsyncMode;
use crate::store::StoreError;
use crate::store::pacing::RouteState;

/// An async route as the operator sees it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RouteOverview {
    pub state: RouteState,
    pub queue_depth: u64,
    pub dead_letters: u64,
}

impl AsyncMode {
    /// The names of the async routes.
    pub fn async_routes(&self) -> impl Iterator<Item = &str> {
        self.routes.keys().map(String::as_str)
    }

    /// Pauses (or resumes) `route` for every sidecar sharing the store; `Ok(false)`
    /// when it is not an async route.
    pub async fn set_paused(&self, route: &str, paused: bool) -> Result<bool, StoreError> {
        let Some(state) = self.routes.get(route) else {
            return Ok(false);
        };
        self.backend.set_paused(route, paused).await?;
        state.metrics.paused.set(i64::from(paused));
        Ok(true)
    }

    /// `route`'s pacing state and queue; `None` when it is not an async route.
    pub async fn overview(&self, route: &str) -> Result<Option<RouteOverview>, StoreError> {
        if !self.routes.contains_key(route) {
            return Ok(None);
        }
        let state = self.backend.route_state(route).await?;
        let stats = self.backend.stats(route).await?;
        Ok(Some(RouteOverview {
            state,
            queue_depth: stats.depth,
            dead_letters: stats.dead_letters,
        }))
    }

    /// Runs `f` (an operator's replay) once `route`'s pacing lets a delivery start, so
    /// a bulk replay is throttled, paused and held like the route's own deliveries;
    /// `f` runs unpaced on a route that is not async. `None` when shutting down.
    pub async fn paced<F: Future>(&self, route: &str, f: F) -> Option<F::Output> {
        let Some(state) = self.routes.get(route) else {
            return Some(f.await);
        };
        let admitted = self.admitted(state, None).await?;
        let out = f.await;
        self.leave(state, admitted).await;
        Some(out)
    }
}
