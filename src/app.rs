//! The wiring, built once at start: the gate, its store, upstream and metrics, the
//! operator console and the optional async queue. The listeners serve through it.

use std::sync::Arc;

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
        let queue = match &backend {
            Some(b) => AsyncMode::new(config, routes, b.clone(), &metrics)?
                .map(|q| Arc::new(q.with_tracer(tracer.clone()))),
            None => None,
        };
        let gate = Arc::new(
            Gate::new(config, routes, store, metrics.clone(), queue.clone())?.with_tracer(tracer),
        );
        let jobs = backend.map(|b| JobRunner::new(gate.clone(), b, queue.clone()));
        let reloader = Arc::new(Reloader::new(
            gate.live().clone(),
            queue.clone(),
            metrics.clone(),
        ));
        let console = Console::new(config, metrics).with_live(gate.live().clone());
        Ok(App {
            gate,
            reloader,
            console,
            queue,
            jobs,
        })
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
        crate::probes::handle(self.gate.store(), self.gate.metrics(), req).await
    }
}
