//! The wiring, built once at start: the gate, its store, upstream and metrics, the
//! operator console and the optional async queue. The listeners serve through it.

use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;

use crate::config::{Config, ConfigError};
use crate::deliveries::jobs::JobRunner;
use crate::gate::Gate;
use crate::metrics::Metrics;
use crate::providers::Routes;
use crate::queue::{AsyncMode, QueueBackend};
use crate::reload::Reloader;
use crate::store::Store;
use crate::trace::Tracer;
use crate::web::{Console, Operator};

/// Everything the sidecar runs, built once from the configuration.
pub struct App<S> {
    pub gate: Arc<Gate<S>>,
    pub console: Console,
    /// The async queue, when a queue backend is given and some route is async.
    pub queue: Option<Arc<AsyncMode>>,
    /// Operators' bulk jobs, when a queue backend (which keeps them) is given.
    pub jobs: Option<Arc<JobRunner<S>>>,
    /// The other delivery runtimes' gates (`worker_threads` > 1), set once they run:
    /// `/readyz` asks each one's store.
    pub other_gates: OnceLock<Vec<Arc<Gate<S>>>>,
    /// Reloads the configuration into the gate's settings (src/reload).
    pub reloader: Arc<Reloader>,
}

impl<S: Store> App<S> {
    /// Builds the queue (when `queue` is given) first, then the gate that hands off to it.
    pub fn new(
        config: &Config,
        routes: &Routes,
        store: S,
        queue: Option<Arc<dyn QueueBackend>>,
    ) -> Result<Self, ConfigError> {
        let metrics = Arc::new(Metrics::new());
        let tracer = Tracer::new(&config.tracing, &metrics.trace_spans_dropped);
        let backend = queue;
        let lifetimes = store.lifetimes().clone();
        let queue = match &backend {
            Some(b) => AsyncMode::new(config, routes, b.clone(), &metrics)?.map(|q| {
                Arc::new(
                    q.with_tracer(tracer.clone())
                        .with_lifetimes(lifetimes.clone()),
                )
            }),
            None => None,
        };
        let gate = Arc::new(
            Gate::new(config, routes, store, metrics.clone(), queue.clone())?.with_tracer(tracer),
        );
        let jobs = backend.map(|b| JobRunner::new(gate.clone(), b, queue.clone()));
        let reloader = Arc::new(Reloader::new(
            gate.live().clone(),
            queue.clone(),
            gate.lifetimes().clone(),
            gate.tracer().clone(),
            metrics.clone(),
        ));
        let console = Console::new(config, metrics).with_live(gate.live().clone());
        Ok(App {
            gate,
            reloader,
            console,
            queue,
            jobs,
            other_gates: OnceLock::new(),
        })
    }

    /// What another delivery runtime's gate shares with this one's.
    pub fn shared_parts(&self) -> SharedParts {
        SharedParts {
            metrics: self.gate.metrics().clone(),
            queue: self.queue.clone(),
            tracer: self.gate.tracer().clone(),
            live: self.gate.live().clone(),
            scopes: self.gate.scopes().clone(),
        }
    }

    /// The handles an operator's action uses.
    pub fn operator(&self) -> Operator<'_, S> {
        Operator {
            store: self.gate.store(),
            upstream: self.gate.upstream(),
            lifetimes: self.gate.lifetimes(),
            queue: self.queue.as_deref(),
            jobs: self.jobs.as_ref(),
            reloader: &self.reloader,
        }
    }

    /// The `admin_listen` surface: the console under `/admin/`, the rest to `admin`.
    pub async fn admin<B>(&self, req: Request<B>) -> Response<Full<Bytes>>
    where
        B: http_body::Body<Data = Bytes>,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        // The operator console and admin API: off (404) without an admin token.
        let path = req.uri().path();
        if path == "/admin" || path.starts_with("/admin/") {
            return crate::web::handle(&self.console, self.operator(), req).await;
        }
        let mut stores = vec![self.gate.store()];
        if let Some(others) = self.other_gates.get() {
            stores.extend(others.iter().map(|g| g.store()));
        }
        crate::probes::handle(&stores, self.gate.metrics(), req).await
    }
}

/// What every delivery runtime's gate shares (one per process): the metrics registry,
/// the async queue it hands off to, the tracer, the settings in force (one swap, so
/// a reload reaches every runtime at once) and the count of unsigned scopes. Each runtime's store and upstream
/// client are its own.
#[derive(Clone)]
pub struct SharedParts {
    metrics: Arc<Metrics>,
    queue: Option<Arc<AsyncMode>>,
    tracer: Tracer,
    live: crate::gate::Live,
    scopes: Arc<crate::gate::ScopeBound>,
}

impl SharedParts {
    /// A gate for another delivery runtime, on `store`, built on that runtime.
    pub fn gate<S: Store>(
        &self,
        config: &Config,
        routes: &Routes,
        store: S,
    ) -> Result<Gate<S>, ConfigError> {
        Ok(Gate::new(
            config,
            routes,
            store,
            self.metrics.clone(),
            self.queue.clone(),
        )?
        .with_tracer(self.tracer.clone())
        .with_live(self.live.clone())
        .with_scopes(self.scopes.clone()))
    }
}
