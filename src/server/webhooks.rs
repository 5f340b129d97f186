//! One delivery runtime's webhook listener: its accept loop, its connections, its
//! delivery tasks and their drain at shutdown. Every runtime runs one; the bounds and
//! the stop signal they obey are process-wide (`Shared`).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::{Semaphore, watch};
use tokio_util::task::TaskTracker;

use super::{OpenConnection, ServeError, accepted_stream, first_bytes, internal_error};
use crate::conn::Lifetime;
use crate::gate::Gate;
use crate::store::Store;

/// What every delivery runtime shares: the process-wide bounds (`max_connections`,
/// `max_in_flight`), the connection settings, and the stop signal.
#[derive(Clone)]
pub(super) struct Shared {
    pub connections: Arc<Semaphore>,
    pub in_flight: Arc<Semaphore>,
    pub stopping: watch::Receiver<bool>,
    pub builder: auto::Builder<TokioExecutor>,
    pub lifetime: Lifetime,
    pub header_timeout: Duration,
    pub grace: Duration,
}

/// How one runtime's drain ended.
pub(super) struct Drained {
    /// Deliveries still in hand when the shutdown grace ran out (0: all drained).
    pub remaining: usize,
}

/// Binds `listen` for one of several delivery runtimes: with `SO_REUSEPORT`, so that
/// each runtime has its own listener on the same address and the kernel spreads new
/// connections across them. Must run on the runtime that will accept on it.
pub(super) fn bind_shared(addr: SocketAddr) -> Result<TcpListener, ServeError> {
    let bind = || -> std::io::Result<TcpListener> {
        let socket = match addr {
            SocketAddr::V4(_) => TcpSocket::new_v4()?,
            SocketAddr::V6(_) => TcpSocket::new_v6()?,
        };
        socket.set_reuseaddr(true)?;
        socket.set_reuseport(true)?;
        socket.bind(addr)?;
        socket.listen(1024)
    };
    bind().map_err(|source| ServeError::Bind { addr, source })
}

/// Refuses an address another process already listens on with `SO_REUSEPORT` (a
/// second sidecar started on the same port by mistake), which the kernel would
/// otherwise let the runtimes join, splitting the traffic silently: a plain bind of
/// the address must succeed first. Port 0 (any free port) needs no check.
pub(super) fn check_free(addr: SocketAddr) -> Result<(), ServeError> {
    if addr.port() == 0 {
        return Ok(());
    }
    std::net::TcpListener::bind(addr)
        .map(drop)
        .map_err(|source| ServeError::Bind { addr, source })
}

/// Serves webhook connections from `listener` through `gate` until the stop signal,
/// then stops accepting and drains this runtime's deliveries in flight for up to the
/// shutdown grace. `runtime` names the runtime in the metrics.
pub(super) async fn serve<S: Store>(
    listener: TcpListener,
    gate: Arc<Gate<S>>,
    shared: Shared,
    runtime: usize,
) -> Drained {
    let Shared {
        connections,
        in_flight,
        stopping,
        builder,
        lifetime,
        header_timeout,
        grace,
    } = shared;
    let accepted = gate
        .metrics()
        .connections_accepted
        .with_label_values(&[&runtime.to_string()]);
    let deliveries = TaskTracker::new();
    let conns = TaskTracker::new();
    let mut stop = stopping.clone();
    loop {
        tokio::select! {
            accepted_conn = listener.accept() => {
                let Some((stream, _)) = accepted_stream(accepted_conn).await else { continue };
                // Over the limit: close at once (the client sees the connection
                // end) rather than queue it.
                let Ok(slot) = connections.clone().try_acquire_owned() else {
                    gate.metrics().connections_refused.inc();
                    tracing::debug!("max_connections reached: connection closed");
                    drop(stream);
                    continue;
                };
                accepted.inc();
                let open = OpenConnection::new(&gate.metrics().connections);
                let gate = gate.clone();
                let deliveries = deliveries.clone();
                let in_flight = in_flight.clone();
                let svc = service_fn(move |req: http::Request<Incoming>| {
                    // Spawned at once, so a provider hanging up cannot cancel it.
                    let pending = match in_flight.clone().try_acquire_owned() {
                        Ok(permit) => {
                            let gate = gate.clone();
                            Ok(deliveries.spawn(async move {
                                let _permit = permit;
                                gate.handle(req).await
                            }))
                        }
                        Err(_) => Err(gate.overloaded(req.uri().path())),
                    };
                    async move {
                        Ok::<_, Infallible>(match pending {
                            Ok(task) => task.await.unwrap_or_else(|_| internal_error()),
                            Err(answer) => answer,
                        })
                    }
                });
                let builder = builder.clone();
                let mut stopping = stopping.clone();
                conns.spawn(async move {
                    let _slot = slot;
                    let _open = open;
                    let started = tokio::select! {
                        started = first_bytes(&stream, header_timeout) => started,
                        _ = stopping.wait_for(|s| *s) => false,
                    };
                    if !started {
                        return;
                    }
                    let stop = async move {
                        let _ = stopping.wait_for(|s| *s).await;
                    };
                    crate::conn::serve(&builder, TokioIo::new(stream), svc, lifetime, stop).await;
                });
            }
            // The stop signal, or its sender gone (the sidecar dropped unserved).
            () = super::stopped(&mut stop) => break,
        }
    }
    drop(listener);
    deliveries.close();
    conns.close();
    let drained = tokio::time::timeout(grace, async {
        conns.wait().await;
        deliveries.wait().await;
    })
    .await;
    Drained {
        remaining: if drained.is_ok() { 0 } else { deliveries.len() },
    }
}

#[cfg(test)]
mod tests {
    use super::{bind_shared, check_free};

    /// The runtimes share `listen` with each other, but a sidecar already listening
    /// there (with `SO_REUSEPORT` too) is refused, not joined.
    #[tokio::test]
    async fn runtimes_share_the_port_but_refuse_one_already_taken() {
        let first = bind_shared("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = first.local_addr().unwrap();
        let second = bind_shared(addr).expect("a second runtime joins the port");
        assert_eq!(second.local_addr().unwrap(), addr);
        assert!(check_free(addr).is_err(), "a taken port passed the check");
        drop((first, second));
        check_free(addr).expect("the port is free again");
    }
}
