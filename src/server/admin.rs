//! The admin listener (`admin_listen`): probes, metrics and the operator console, each
//! kind of connection in slots of its own, so that neither the console's clients nor a
//! flood of probe connections can keep the kubelet's probe from an answer.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio_util::task::TaskTracker;

use super::{accepted_stream, first_bytes, stopped};
use crate::app::App;
use crate::conn::Lifetime;
use crate::store::Store;

/// Admin connections open at once that have not yet sent their first request line
/// (each for at most `header_timeout`).
const MAX_ADMIN_PENDING: usize = 64;
/// Admin connections open at once whose first request was a probe's (`probes::is_probe`).
const MAX_PROBE_CONNECTIONS: usize = 32;
/// How long a probe's connection may take to send its whole request head, once its
/// request line came (at most `header_timeout`): the kubelet sends it in one write.
pub(super) const PROBE_HEAD_TIMEOUT: Duration = Duration::from_secs(1);
/// How much of a probe's head is looked at to see whether it is all in (a kubelet's
/// or Prometheus's is a few hundred bytes).
const PROBE_HEAD_PEEK: usize = 2048;
/// Admin connections open at once for anything else: the console, HTTP/2 and unknowns.
const MAX_CONSOLE_CONNECTIONS: usize = 32;

/// How the admin listener serves its connections.
pub(super) struct AdminSettings {
    pub(super) builder: auto::Builder<TokioExecutor>,
    /// A probe's connection: one request, a short head timeout.
    pub(super) probe_builder: auto::Builder<TokioExecutor>,
    pub(super) lifetime: Lifetime,
    pub(super) header_timeout: Duration,
}

/// Accepts on the admin listener (probes, metrics, the console) until the stop
/// signal; the connections open then are served on through the drain, as before.
pub(super) async fn serve_admin<S: Store>(
    admin: TcpListener,
    app: Arc<App<S>>,
    settings: AdminSettings,
    mut stopping: watch::Receiver<bool>,
) {
    let AdminSettings {
        builder,
        probe_builder,
        lifetime,
        header_timeout,
    } = settings;
    let admin_slots = AdminSlots::new();
    let admin_conns = TaskTracker::new();
    loop {
        tokio::select! {
            accepted = admin.accept() => {
                let Some((stream, peer)) = accepted_stream(accepted).await else { continue };
                let Ok(pending) = admin_slots.pending.clone().try_acquire_owned() else {
                    drop(stream);
                    continue;
                };
                let app = app.clone();
                let builders = (builder.clone(), probe_builder.clone());
                let slots = admin_slots.clone();
                // Probes and metrics are served through shutdown's drain, as before.
                admin_conns.spawn(async move {
                    if !first_bytes(&stream, header_timeout).await {
                        return;
                    }
                    let slot = slots.classify(&stream).await;
                    let builder = match &slot {
                        AdminSlot::Console { .. } => builders.0,
                        AdminSlot::Probe { .. } | AdminSlot::ProbeOverflow { .. } => builders.1,
                        AdminSlot::Refused => {
                            tracing::debug!("admin connections full for its kind: one closed");
                            return;
                        }
                    };
                    // An overflowing probe is answered on the pending slot it holds;
                    // one whose head was not in gets 503 (the pool is full).
                    let refuse = matches!(slot, AdminSlot::ProbeOverflow { head_in: false });
                    let overflow = matches!(slot, AdminSlot::ProbeOverflow { .. });
                    let _pending = overflow.then_some(pending);
                    let svc = service_fn(move |mut req: http::Request<Incoming>| {
                        req.extensions_mut().insert(crate::web::ClientIp(peer.ip()));
                        let app = app.clone();
                        async move {
                            Ok::<_, Infallible>(if refuse {
                                crate::probes::probes_full()
                            } else {
                                app.admin(req).await
                            })
                        }
                    });
                    let stop = std::future::pending::<()>();
                    crate::conn::serve(&builder, TokioIo::new(stream), svc, lifetime, stop).await;
                });
            }
            () = stopped(&mut stopping) => break,
        }
    }
}

/// The admin listener's connection slots: one kind cannot take the other's.
#[derive(Clone)]
pub(super) struct AdminSlots {
    pub(super) pending: Arc<Semaphore>,
    pub(super) probes: Arc<Semaphore>,
    pub(super) console: Arc<Semaphore>,
}

/// What a connection that sent its first bytes gets on the admin listener.
pub(super) enum AdminSlot {
    /// Held while the connection lives.
    Console {
        _slot: OwnedSemaphorePermit,
    },
    Probe {
        _slot: OwnedSemaphorePermit,
    },
    /// A probe while the probes' slots are all taken: answered all the same (on its
    /// pending slot) when its whole head is in, else answered 503.
    ProbeOverflow {
        head_in: bool,
    },
    /// The console's slots are all taken, or the connection failed: closed.
    Refused,
}

impl AdminSlots {
    pub(super) fn new() -> AdminSlots {
        AdminSlots {
            pending: Arc::new(Semaphore::new(MAX_ADMIN_PENDING)),
            probes: Arc::new(Semaphore::new(MAX_PROBE_CONNECTIONS)),
            console: Arc::new(Semaphore::new(MAX_CONSOLE_CONNECTIONS)),
        }
    }

    /// The slot for a connection that has sent its first bytes, by what its first
    /// request is (HTTP/2 and anything but a probe count as the console's).
    pub(super) async fn classify(&self, stream: &TcpStream) -> AdminSlot {
        let mut head = [0u8; PROBE_HEAD_PEEK];
        // What `first_bytes` saw is still there: this does not wait.
        let Ok(n) = stream.peek(&mut head).await else {
            return AdminSlot::Refused;
        };
        let head = &head[..n];
        if !crate::probes::is_probe(head) {
            return match self.console.clone().try_acquire_owned() {
                Ok(_slot) => AdminSlot::Console { _slot },
                Err(_) => AdminSlot::Refused,
            };
        }
        match self.probes.clone().try_acquire_owned() {
            Ok(_slot) => AdminSlot::Probe { _slot },
            Err(_) => AdminSlot::ProbeOverflow {
                head_in: head.windows(4).any(|w| w == b"\r\n\r\n"),
            },
        }
    }
}
