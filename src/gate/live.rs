//! The routes and per-delivery limits in force: one pointer that a delivery loads once
//! and keeps to its end, and that a live reload (src/reload) swaps whole. Every gate of
//! the process may share one handle; no delivery takes a lock to read it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;

use crate::config::{Config, ConfigError};
use crate::metrics::{Metrics, Outcome, RouteKind, RouteMetrics};
use crate::providers::{self, Route};

/// One route as the gate serves it: the built route and its metric handles.
pub(super) struct RouteEntry {
    pub(super) route: Arc<Route>,
    pub(super) metrics: RouteMetrics,
}

/// Everything a delivery reads from the configuration, built whole before it is put in
/// force: the routes by path, the body limits, and the configuration itself.
pub struct Settings {
    pub(super) routes: HashMap<String, RouteEntry>,
    pub(super) max_body: usize,
    pub(super) body_timeout: Duration,
    /// The configuration these were built from (shown redacted by `GET /admin/config`).
    config: Arc<Config>,
    /// When it came into force.
    loaded_at: SystemTime,
}

impl Settings {
    /// The settings of `config`, whose routes `built` holds; every route's metric
    /// handles are resolved here, not per delivery.
    pub fn build(
        config: Config,
        built: &providers::Routes,
        metrics: &Metrics,
    ) -> Result<Settings, ConfigError> {
        let mut routes = HashMap::with_capacity(config.routes.len());
        for (i, rc) in config.routes.iter().enumerate() {
            let route = built.route(&config, i)?;
            let mut also = Vec::new();
            if route.has_handshakes() {
                also.push(Outcome::Handshake);
            }
            if route.forwards_keyless() {
                also.push(Outcome::Unkeyed);
            }
            if route.has_scope() {
                also.push(Outcome::ScopeRefused);
            }
            let kind = RouteKind::of(rc, config.store.on_error);
            let metrics = metrics.route(&rc.name, kind, &also);
            routes.insert(rc.path.clone(), RouteEntry { route, metrics });
        }
        Ok(Settings {
            routes,
            max_body: config.max_body,
            body_timeout: config.body_timeout,
            config: Arc::new(config),
            loaded_at: SystemTime::now(),
        })
    }

    /// The configuration in force.
    pub fn config(&self) -> &Arc<Config> {
        &self.config
    }

    /// When it came into force.
    pub fn loaded_at(&self) -> SystemTime {
        self.loaded_at
    }
}

/// The handle to the settings in force, shared by every gate of the process and the
/// reload that swaps them.
#[derive(Clone)]
pub struct Live(Arc<ArcSwap<Settings>>);

impl Live {
    pub fn new(settings: Settings) -> Live {
        Live(Arc::new(ArcSwap::from_pointee(settings)))
    }

    /// The settings in force now, kept by the caller for as long as it needs them (a
    /// delivery keeps the ones it started with, whatever a reload does meanwhile).
    pub fn load(&self) -> Arc<Settings> {
        self.0.load_full()
    }

    /// Puts `settings` in force for every delivery that starts from now on.
    pub fn store(&self, settings: Settings) {
        self.0.store(Arc::new(settings));
    }
}
