//! The delivery runtimes past the first (`worker_threads` > 1): each an OS thread
//! running tokio's `current_thread` scheduler with its own webhook listener on
//! `listen` (`SO_REUSEPORT`), its own gate, store handle (for Redis its own connection
//! and log writer, since the store is built on that runtime) and upstream client. A
//! delivery never leaves the thread that accepted it: no cross-thread wake-ups, no
//! work stealing. What is process-wide stays on the first runtime (the admin listener,
//! the async queue's workers, jobs) or is shared (`webhooks::Shared`, the metrics).

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::sync::oneshot;

use super::ServeError;
use super::webhooks::{self, Drained, Shared};
use crate::app::SharedParts;
use crate::config::Config;
use crate::gate::Gate;
use crate::providers::Routes;
use crate::store::{Store, StoreError};

/// Builds the store of one more delivery runtime, on that runtime. The memory and
/// `file:` stores hand out the one shared instance; Redis opens a connection per call.
pub type StoreFactory<S> = Arc<dyn Fn() -> Result<S, StoreError> + Send + Sync>;

/// What the extra runtimes are built from.
pub(super) struct Plan<S> {
    pub config: Arc<Config>,
    pub routes: Arc<Routes>,
    pub store: StoreFactory<S>,
    pub parts: SharedParts,
}

/// The extra runtimes, serving; each reports once it has drained.
pub(super) struct Runtimes {
    drained: Vec<oneshot::Receiver<Drained>>,
}

impl Runtimes {
    /// No extra runtime (`worker_threads = 1`).
    pub fn none() -> Runtimes {
        Runtimes {
            drained: Vec::new(),
        }
    }

    /// How many extra runtimes run.
    pub fn count(&self) -> usize {
        self.drained.len()
    }

    /// Starts runtimes 1 to `count` on `addr` (the first runtime's bound address, so
    /// that port 0 means one port for all); returns once each is listening, with their
    /// gates, or with the first one's error to start.
    pub async fn start<S: Store>(
        count: usize,
        addr: SocketAddr,
        plan: Plan<S>,
        shared: &Shared,
    ) -> Result<(Runtimes, Vec<Arc<Gate<S>>>), ServeError> {
        let plan = Arc::new(plan);
        let mut drained = Vec::with_capacity(count);
        let mut gates = Vec::with_capacity(count);
        for runtime in 1..=count {
            let (ready_tx, ready) = oneshot::channel();
            let (drained_tx, drained_rx) = oneshot::channel();
            let plan = plan.clone();
            let shared = shared.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("idemgate-rt-{runtime}"))
                .spawn(move || run(runtime, addr, &plan, shared, ready_tx, drained_tx));
            if let Err(e) = spawned {
                return Err(ServeError::Runtime(format!("cannot start a thread: {e}")));
            }
            match ready.await {
                Ok(Ok(gate)) => {
                    drained.push(drained_rx);
                    gates.push(gate);
                }
                Ok(Err(e)) => return Err(e),
                Err(_) => {
                    return Err(ServeError::Runtime(format!(
                        "delivery runtime {runtime} stopped while starting"
                    )));
                }
            }
        }
        Ok((Runtimes { drained }, gates))
    }

    /// Waits for every extra runtime to drain (each within the shutdown grace);
    /// returns the deliveries they still had in hand.
    pub async fn wait(self) -> usize {
        let mut remaining = 0;
        for (i, rx) in self.drained.into_iter().enumerate() {
            match rx.await {
                Ok(d) => remaining += d.remaining,
                Err(_) => tracing::error!(runtime = i + 1, "a delivery runtime ended abnormally"),
            }
        }
        remaining
    }
}

/// One extra runtime's thread: builds its runtime, store, gate and listener, reports
/// ready (or why not), serves until the stop signal, drains, flushes its store's
/// delivery log and reports how the drain ended.
fn run<S: Store>(
    runtime: usize,
    addr: SocketAddr,
    plan: &Plan<S>,
    shared: Shared,
    ready: oneshot::Sender<Result<Arc<Gate<S>>, ServeError>>,
    drained: oneshot::Sender<Drained>,
) {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            let _ = ready.send(Err(ServeError::Runtime(e.to_string())));
            return;
        }
    };
    rt.block_on(async move {
        let started = (|| {
            let store = (plan.store)()?;
            let gate = plan.parts.gate(&plan.config, &plan.routes, store)?;
            let listener = webhooks::bind_shared(addr)?;
            Ok::<_, ServeError>((Arc::new(gate), listener))
        })();
        let (gate, listener) = match started {
            Ok(s) => s,
            Err(e) => {
                let _ = ready.send(Err(e));
                return;
            }
        };
        if ready.send(Ok(gate.clone())).is_err() {
            return; // the sidecar gave up starting
        }
        let report = webhooks::serve(listener, gate.clone(), shared, runtime).await;
        // This runtime's delivery log writes still queued off the claim path.
        crate::store::log::DeliveryLog::flush(gate.store()).await;
        tracing::debug!(
            runtime,
            remaining = report.remaining,
            "delivery runtime drained"
        );
        let _ = drained.send(report);
    });
}
