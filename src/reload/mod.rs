//! Live configuration reload (docs/reload.md).
//!
//! A reload reads the configuration file again, resolves and validates it exactly as
//! at start (every error `check-config` gives), refuses what only a restart can change
//! (`diff::restart_needed`), builds the new routes whole and swaps them in as one
//! pointer (`gate::Live`): a delivery that started before keeps the settings it loaded,
//! every one that starts after uses the new ones. Anything wrong: the configuration in
//! force stays whole. Triggers: SIGHUP and the watched directories (`watch`), and
//! `POST /admin/reload` (web) with `idemgate reload` (`cli`).
//!
//! A route removed by a reload answers 404 like an unknown path from the switch on.
//! Its async entries already queued are neither lost nor dropped: the route's worker,
//! built at start, keeps delivering them under the route's last settings (an async
//! route cannot be added or its worker's settings changed without a restart; its
//! policy, acknowledgement to rate, is swapped with the routes), and its dead letters
//! stay listed and redrivable.

pub mod cli;
mod diff;
mod watch;

pub use diff::{Changes, restart_needed};
pub use watch::spawn_triggers;

use std::sync::Arc;
use std::time::SystemTime;

use crate::config::{Config, ConfigError};
use crate::gate::{Live, Settings};
use crate::metrics::Metrics;
use crate::queue::AsyncMode;
use crate::store::RouteLifetimes;
use crate::trace::Tracer;

/// Why a reload applied nothing.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// The file is not a valid configuration (the field is named as by `check-config`).
    #[error("invalid configuration: {0}")]
    Invalid(ConfigError),
    /// It changes what only a restart can.
    #[error(
        "a restart is needed to change {}; nothing of this reload was applied",
        .0.join(", ")
    )]
    RestartNeeded(Vec<String>),
}

impl ReloadError {
    /// The machine-readable reason, for the admin API.
    pub fn code(&self) -> &'static str {
        match self {
            ReloadError::Invalid(_) => "invalid_config",
            ReloadError::RestartNeeded(_) => "restart_needed",
        }
    }
}

/// What a reload put in force.
pub struct Applied {
    pub changes: Changes,
    /// What became of the log filter: `unchanged`, the new filter, or why the file's
    /// new `log` is not in force (`IDEMGATE_LOG` holds it).
    pub log: String,
    pub loaded_at: SystemTime,
}

/// Reloads the configuration into the settings every gate reads.
pub struct Reloader {
    live: Live,
    /// The async routes' policies, swapped with the routes (none without async routes).
    queue: Option<Arc<AsyncMode>>,
    /// Every route's lease and retention, shared by the gates and every runtime's store.
    lifetimes: RouteLifetimes,
    /// The tracer every gate shares: its sampler and `start_traces` follow a reload.
    tracer: Tracer,
    metrics: Arc<Metrics>,
    /// The configuration the process started with: its listeners, store and async
    /// workers were built from it, and stay.
    started: Arc<Config>,
    /// One reload at a time: triggers that arrive together apply one after the other.
    busy: tokio::sync::Mutex<()>,
}

impl Reloader {
    /// The reloader of the settings in `live`, which were built from the configuration
    /// the process started with.
    pub fn new(
        live: Live,
        queue: Option<Arc<AsyncMode>>,
        lifetimes: RouteLifetimes,
        tracer: Tracer,
        metrics: Arc<Metrics>,
    ) -> Reloader {
        let started = live.load().config().clone();
        Reloader {
            live,
            queue,
            lifetimes,
            tracer,
            metrics,
            started,
            busy: tokio::sync::Mutex::new(()),
        }
    }

    /// The settings in force.
    pub fn live(&self) -> &Live {
        &self.live
    }

    /// Reads the file again and puts it in force, or keeps the configuration in force
    /// whole and says why; counted in `idemgate_config_*` and logged with what changed
    /// (route names, secrets by index, never a value). `trigger` says what asked.
    pub async fn reload(&self, trigger: &str) -> Result<Applied, ReloadError> {
        let _one = self.busy.lock().await;
        let path = self.started.source.clone();
        // Reading files and building keys: off the runtime's threads.
        let loaded = tokio::task::spawn_blocking(move || crate::providers::load(path.as_deref()))
            .await
            .unwrap_or_else(|e| {
                Err(ConfigError::new(
                    "config",
                    format!("reading it failed: {e}"),
                ))
            });
        let result = match loaded {
            Ok((config, routes)) => self.apply(config, &routes),
            Err(e) => Err(ReloadError::Invalid(e)),
        };
        self.metrics.reload.record(result.is_ok());
        match &result {
            Ok(applied) => {
                tracing::info!(trigger, changes = %applied.changes, log = %applied.log, "configuration reloaded");
                tracing::debug!(trigger, "configuration in force");
            }
            Err(e) => tracing::error!(
                trigger,
                error = %e,
                "configuration reload failed: the configuration in force is unchanged"
            ),
        }
        result
    }

    fn apply(
        &self,
        config: Config,
        routes: &crate::providers::Routes,
    ) -> Result<Applied, ReloadError> {
        let refused = restart_needed(&self.started, &config);
        if !refused.is_empty() {
            return Err(ReloadError::RestartNeeded(refused));
        }
        let changes = diff::changes(self.live.load().config(), &config);
        let settings =
            Settings::build(config, routes, &self.metrics).map_err(ReloadError::Invalid)?;
        let loaded_at = settings.loaded_at();
        let log = self.log_level(settings.config())?;
        if let Some(queue) = &self.queue {
            queue.update(settings.config());
        }
        // Before the routes: a delivery that sees the new routes claims with their
        // lifetimes.
        self.lifetimes.set(settings.config());
        self.tracer.update(&settings.config().tracing);
        self.live.store(settings);
        Ok(Applied {
            changes,
            log,
            loaded_at,
        })
    }

    /// Puts `new`'s log filter in force when it changed; says what became of it.
    fn log_level(&self, new: &Config) -> Result<String, ReloadError> {
        let settings = self.live.load();
        let old = &settings.config().log;
        let new = &new.log;
        if new.field == "IDEMGATE_LOG" {
            return Ok(if new.in_file != old.in_file {
                format!(
                    "`log` changed in the file, but IDEMGATE_LOG holds it ({})",
                    new.filter
                )
            } else {
                "unchanged".to_string()
            });
        }
        if new.filter == old.filter {
            return Ok("unchanged".to_string());
        }
        crate::logging::set_level(&new.filter)
            .map_err(|e| ReloadError::Invalid(ConfigError::new("log", e)))?;
        Ok(new.filter.clone())
    }
}
