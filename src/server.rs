//! Listeners, connection handling and graceful shutdown.
//!
//! Each delivery runs in its own task, tracked for shutdown: a provider that hangs up
//! mid-delivery cannot cancel a claimed delivery half-way (it still completes or
//! releases its claim), and SIGTERM waits for every delivery in hand.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio_util::task::TaskTracker;

use crate::admin;
use crate::config::{Config, StoreUrl};
use crate::gate::Gate;
use crate::metrics::Metrics;
use crate::store::{Lifetimes, MemoryStore, RedisStore, Store};

/// How long a client may take to send a request's headers.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error("store: {0}")]
    Store(#[from] crate::store::StoreError),
}

/// Runs the sidecar on the store the configuration names until `shutdown` resolves.
pub async fn run(
    config: Config,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    let lifetimes = Lifetimes {
        lease: config.dedup.lease,
        retention: config.dedup.retention,
    };
    match &config.store.url {
        StoreUrl::Memory => {
            let store = MemoryStore::new(lifetimes);
            let queue = Arc::new(crate::queue::memory::MemoryQueue::new(store.clone()));
            Bound::bind(&config, store)
                .await?
                .with_queue(&config, queue)?
                .serve(shutdown)
                .await
        }
        StoreUrl::Redis(url) => {
            let store = RedisStore::new(
                url,
                &config.store.key_prefix,
                lifetimes,
                config.store.timeout,
            )?
            .with_replica_acks(
                config.store.min_replicas_ack,
                config.store.replicas_ack_timeout,
            );
            let queue = Arc::new(crate::queue::redis::RedisQueue::new(store.clone()));
            Bound::bind(&config, store)
                .await?
                .with_queue(&config, queue)?
                .serve(shutdown)
                .await
        }
    }
}

/// A sidecar whose listeners are bound but not yet serving.
pub struct Bound<S> {
    listener: TcpListener,
    admin: TcpListener,
    gate: Arc<Gate<S>>,
    grace: Duration,
}

impl<S: Store> Bound<S> {
    pub async fn bind(config: &Config, store: S) -> Result<Self, ServeError> {
        let metrics = Arc::new(Metrics::new());
        let gate = Arc::new(Gate::new(config, store, metrics)?);
        let listener =
            TcpListener::bind(config.listen)
                .await
                .map_err(|source| ServeError::Bind {
                    addr: config.listen,
                    source,
                })?;
        let admin = TcpListener::bind(config.admin_listen)
            .await
            .map_err(|source| ServeError::Bind {
                addr: config.admin_listen,
                source,
            })?;
        Ok(Bound {
            listener,
            admin,
            gate,
            grace: config.shutdown_grace,
        })
    }

    /// Turns on async mode (docs/async.md) for the configuration's async routes, on
    /// `queue`; nothing happens when no route is async.
    pub fn with_queue(
        self,
        config: &Config,
        queue: Arc<dyn crate::queue::QueueBackend>,
    ) -> Result<Self, ServeError> {
        if let Some(mode) = crate::queue::AsyncMode::new(config, queue, self.gate.metrics())? {
            self.gate.set_async_mode(Arc::new(mode));
        }
        Ok(self)
    }

    pub fn addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("bound listener has an address")
    }

    pub fn admin_addr(&self) -> SocketAddr {
        self.admin
            .local_addr()
            .expect("bound listener has an address")
    }

    pub fn gate(&self) -> &Arc<Gate<S>> {
        &self.gate
    }

    /// Serves until `shutdown` resolves, then stops accepting and drains the
    /// deliveries in flight for up to the shutdown grace.
    pub async fn serve(self, shutdown: impl Future<Output = ()> + Send) -> Result<(), ServeError> {
        let Bound {
            listener,
            admin,
            gate,
            grace,
        } = self;
        tracing::info!(
            listen = %listener.local_addr().map(|a| a.to_string()).unwrap_or_default(),
            admin = %admin.local_addr().map(|a| a.to_string()).unwrap_or_default(),
            "idemgate serving"
        );
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(HEADER_READ_TIMEOUT)
            .keep_alive(true);
        if let Some(queue) = gate.async_mode() {
            queue.start();
        }
        let graceful = GracefulShutdown::new();
        let deliveries = TaskTracker::new();
        let admin_conns = TaskTracker::new();
        tokio::pin!(shutdown);

        loop {
            tokio::select! {
                accepted = listener.accept() => {
                    let Some(io) = accepted_io(accepted).await else { continue };
                    let gate = gate.clone();
                    let deliveries = deliveries.clone();
                    let svc = service_fn(move |req: http::Request<Incoming>| {
                        let gate = gate.clone();
                        let task = deliveries.spawn(async move { gate.handle(req).await });
                        async move {
                            Ok::<_, Infallible>(task.await.unwrap_or_else(|_| internal_error()))
                        }
                    });
                    let conn = graceful.watch(builder.serve_connection(io, svc).into_owned());
                    tokio::spawn(async move {
                        let _ = conn.await;
                    });
                }
                accepted = admin.accept() => {
                    let Some(io) = accepted_io(accepted).await else { continue };
                    let gate = gate.clone();
                    let svc = service_fn(move |req| {
                        let gate = gate.clone();
                        async move { Ok::<_, Infallible>(admin::handle(&gate, req).await) }
                    });
                    let conn = builder.serve_connection(io, svc).into_owned();
                    admin_conns.spawn(async move {
                        let _ = conn.await;
                    });
                }
                _ = &mut shutdown => break,
            }
        }

        drop(listener);
        drop(admin);
        // Queue workers stop taking entries now and finish the calls in hand below.
        if let Some(queue) = gate.async_mode() {
            queue.stop();
        }
        tracing::info!(
            in_flight = gate.metrics().in_flight.get(),
            "shutting down: draining deliveries in flight"
        );
        deliveries.close();
        let draining_since = tokio::time::Instant::now();
        let drained = tokio::time::timeout(grace, async {
            graceful.shutdown().await;
            deliveries.wait().await;
        })
        .await;
        if let Some(queue) = gate.async_mode() {
            queue
                .wait(grace.saturating_sub(draining_since.elapsed()))
                .await;
        }
        match drained {
            Ok(()) => tracing::info!("all deliveries drained"),
            Err(_) => tracing::warn!(
                remaining = deliveries.len(),
                "shutdown grace elapsed with deliveries still in flight; their claims free at lease expiry"
            ),
        }
        Ok(())
    }
}

async fn accepted_io(
    accepted: std::io::Result<(tokio::net::TcpStream, SocketAddr)>,
) -> Option<TokioIo<tokio::net::TcpStream>> {
    match accepted {
        Ok((stream, _)) => {
            let _ = stream.set_nodelay(true);
            Some(TokioIo::new(stream))
        }
        Err(e) => {
            // Out of file descriptors and the like: back off instead of spinning.
            tracing::warn!(error = %e, "accept failed");
            tokio::time::sleep(Duration::from_millis(50)).await;
            None
        }
    }
}

fn internal_error() -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from_static(
        br#"{"error":"internal","message":"the delivery task failed"}"#,
    )));
    *r.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
    r
}

/// Resolves on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = term => tracing::info!("SIGTERM received"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received"),
    }
}
