//! The upstream's keep-alive connections: hyper's own HTTP/1 client connections, each
//! driven by a task on the runtime that opened it, and kept between deliveries in an
//! idle list per thread (each `current_thread` runtime has its own; on a multi-thread
//! runtime a connection goes back to the list of the thread that finished with it).
//! Nothing is spawned per request: hyper-util's pooled client spawned a task per
//! request to wait for the connection to be ready again.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use thread_local::ThreadLocal;
use tokio::net::TcpStream;

use super::io::Counted;
use super::{UpstreamError, source_chain};

/// How many connections stay idle, and for how long.
#[derive(Debug, Clone, Copy)]
pub(super) struct PoolLimits {
    /// Idle connections kept per thread; past it the oldest is closed.
    pub max_idle: usize,
    /// An idle connection older than this is closed rather than reused (hyper-util's
    /// default).
    pub idle_timeout: Duration,
    /// A reused connection idle at least this long may have been closed by the
    /// application just as the request went out (its keep-alive timeout): the request
    /// is kept to be sent once more (`Resend`). Under load connections are idle for
    /// far less, and nothing is copied.
    pub resend_after_idle: Duration,
}

impl Default for PoolLimits {
    fn default() -> Self {
        PoolLimits {
            max_idle: 64,
            idle_timeout: Duration::from_secs(90),
            resend_after_idle: Duration::from_millis(250),
        }
    }
}

/// Where connections go: an address, or a name resolved at each connect.
enum Target {
    Addr(SocketAddr),
    Name(String, u16),
}

/// The application's connections: how to open one, and those idle on each thread.
pub(super) struct Pool {
    target: Target,
    limits: PoolLimits,
    idle: ThreadLocal<RefCell<VecDeque<Idle>>>,
}

struct Idle {
    conn: Conn,
    since: Instant,
}

/// One connection to the application, ready for a request.
pub(super) struct Conn {
    sender: SendRequest<Full<Bytes>>,
    /// Bytes read from the socket so far (`io::Counted`).
    read: Arc<AtomicU64>,
    /// How long it was idle before this request; `None` for a new connection.
    idle_for: Option<Duration>,
}

/// A request that failed on its connection.
pub(super) struct Failed {
    error: hyper::Error,
    /// The request, when hyper never began writing it (the connection closed first).
    unsent: Option<Request<Full<Bytes>>>,
    /// Some of the answer had arrived.
    answer_began: bool,
}

/// Whether, and what, to send once more on a fresh connection if a request fails on a
/// reused one before any byte of its answer: the application closed the connection
/// while it was idle. Never for a new connection, never once the answer has begun.
pub(super) struct Resend {
    reused: bool,
    /// A copy of the request, for a failure after hyper wrote it.
    copy: Option<Request<Full<Bytes>>>,
}

impl Pool {
    pub(super) fn new(host: &str, port: u16, limits: PoolLimits) -> Self {
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let target = match bare.parse::<IpAddr>() {
            Ok(ip) => Target::Addr(SocketAddr::new(ip, port)),
            Err(_) => Target::Name(bare.to_string(), port),
        };
        Pool {
            target,
            limits,
            idle: ThreadLocal::new(),
        }
    }

    /// A connection ready for a request: the most recently idle one of this thread
    /// that is still open, or a new one.
    pub(super) async fn conn(&self) -> Result<Conn, UpstreamError> {
        while let Some(mut conn) = self.take_idle() {
            // Ready at once unless hyper is still finishing the previous exchange.
            if conn.sender.ready().await.is_ok() {
                return Ok(conn);
            }
        }
        self.connect().await
    }

    fn take_idle(&self) -> Option<Conn> {
        let mut list = self.idle.get()?.borrow_mut();
        let now = Instant::now();
        self.drop_expired(&mut list, now);
        while let Some(idle) = list.pop_back() {
            if idle.conn.sender.is_closed() {
                continue;
            }
            let mut conn = idle.conn;
            conn.idle_for = Some(now.saturating_duration_since(idle.since));
            return Some(conn);
        }
        None
    }

    /// Puts a connection whose exchange is over back in this thread's idle list.
    pub(super) fn idle(&self, conn: Conn) {
        if conn.sender.is_closed() {
            return;
        }
        let mut list = self
            .idle
            .get_or(|| RefCell::new(VecDeque::new()))
            .borrow_mut();
        let now = Instant::now();
        self.drop_expired(&mut list, now);
        if list.len() >= self.limits.max_idle {
            list.pop_front();
        }
        list.push_back(Idle { conn, since: now });
    }

    /// Closes the connections idle longer than the idle timeout (oldest first).
    fn drop_expired(&self, list: &mut VecDeque<Idle>, now: Instant) {
        while list
            .front()
            .is_some_and(|i| now.saturating_duration_since(i.since) > self.limits.idle_timeout)
        {
            list.pop_front();
        }
    }

    /// Opens a connection (TCP_NODELAY) and spawns the task that drives it.
    pub(super) async fn connect(&self) -> Result<Conn, UpstreamError> {
        let stream = match &self.target {
            Target::Addr(a) => TcpStream::connect(a).await,
            Target::Name(host, port) => TcpStream::connect((host.as_str(), *port)).await,
        }
        .map_err(|e| UpstreamError::Unreachable(format!("tcp connect error: {e}")))?;
        stream
            .set_nodelay(true)
            .map_err(|e| UpstreamError::Unreachable(format!("tcp connect error: {e}")))?;
        let read = Arc::new(AtomicU64::new(0));
        let io = TokioIo::new(Counted::new(stream, read.clone()));
        let (sender, connection) = http1::handshake(io)
            .await
            .map_err(|e| UpstreamError::Unreachable(e.to_string()))?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "an upstream connection ended with an error");
            }
        });
        Ok(Conn {
            sender,
            read,
            idle_for: None,
        })
    }

    /// What to keep for sending `req` once more, should it fail on `conn`.
    pub(super) fn resend(&self, conn: &Conn, req: &Request<Full<Bytes>>) -> Resend {
        let Some(idle_for) = conn.idle_for else {
            return Resend {
                reused: false,
                copy: None,
            };
        };
        Resend {
            reused: true,
            copy: (idle_for >= self.limits.resend_after_idle).then(|| copy_request(req)),
        }
    }

    /// Idle connections on this thread (tests).
    #[cfg(test)]
    pub(super) fn idle_here(&self) -> usize {
        self.idle.get().map_or(0, |l| l.borrow().len())
    }
}

impl Conn {
    /// Sends `req` and waits for the answer's head.
    pub(super) async fn send(
        &mut self,
        req: Request<Full<Bytes>>,
    ) -> Result<Response<Incoming>, Failed> {
        let before = self.read.load(Ordering::Relaxed);
        self.sender.try_send_request(req).await.map_err(|mut e| {
            let unsent = e.take_message();
            Failed {
                error: e.into_error(),
                unsent,
                answer_began: self.read.load(Ordering::Relaxed) != before,
            }
        })
    }
}

impl Failed {
    pub(super) fn into_unreachable(self) -> UpstreamError {
        UpstreamError::Unreachable(format!("{}{}", self.error, source_chain(&self.error)))
    }
}

impl Resend {
    /// The request to send once more on a fresh connection after `failed`, if any.
    pub(super) fn after(self, failed: &mut Failed) -> Option<Request<Full<Bytes>>> {
        if !self.reused {
            return None;
        }
        let again = match failed.unsent.take() {
            Some(req) => Some(req),
            None if failed.answer_began => None,
            None => self.copy,
        };
        if again.is_some() {
            tracing::debug!(error = %failed.error, "a reused upstream connection was closed before the answer: sending once more on a new one");
        }
        again
    }
}

/// A copy of a request as it goes upstream (the body is shared, not copied).
fn copy_request(req: &Request<Full<Bytes>>) -> Request<Full<Bytes>> {
    let mut copy = Request::new(req.body().clone());
    *copy.method_mut() = req.method().clone();
    *copy.uri_mut() = req.uri().clone();
    *copy.version_mut() = req.version();
    *copy.headers_mut() = req.headers().clone();
    copy
}
