//! Serving one accepted connection with hyper, for every listener (the webhook and admin
//! listeners, the injector): what ends a connection a client keeps open. hyper bounds a
//! request's head (HTTP/1) but not an HTTP/2 connection's life: without this, a client
//! that sends the preface and then nothing holds its slot for ever.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use http::{Request, Response};
use hyper::body::{Body, Incoming};
use hyper::service::Service;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::time::Instant;

mod first_bytes;
pub use first_bytes::FirstBytes;

/// How long a connection may live, idle and take to close.
#[derive(Debug, Clone, Copy)]
pub struct Lifetime {
    /// An HTTP/2 PING goes out after this long without a frame from the client; no
    /// answer within it again closes the connection (a peer that vanished or never reads).
    pub keep_alive: Duration,
    /// Closed gracefully once no request has been in hand for this long (HTTP/1's
    /// header timeout does the same for a keep-alive connection).
    pub idle: Duration,
    /// Closed gracefully at this age, so that no client holds a slot for ever.
    pub max_age: Duration,
    /// Once closing gracefully, the requests in hand get this long to finish.
    pub drain: Duration,
}

impl Lifetime {
    /// Sets hyper's HTTP/2 keep-alive PING on `builder` (the part hyper does itself).
    pub fn configure(&self, builder: &mut auto::Builder<TokioExecutor>) {
        builder
            .http2()
            .timer(TokioTimer::new())
            .keep_alive_interval(Some(self.keep_alive))
            .keep_alive_timeout(self.keep_alive);
    }
}

/// Serves `io` until the client closes it; or, gracefully (the requests in hand are
/// answered, for up to `drain`), once it idles for `idle`, reaches `max_age`, or `stop`
/// resolves. `builder` must have been through `Lifetime::configure`.
pub async fn serve<I, S, B>(
    builder: &auto::Builder<TokioExecutor>,
    io: I,
    service: S,
    lifetime: Lifetime,
    stop: impl Future<Output = ()>,
) where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    S: Service<Request<Incoming>, Response = Response<B>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let activity = Arc::new(Activity::new());
    let conn = builder.serve_connection(
        io,
        Tracked {
            inner: service,
            activity: activity.clone(),
        },
    );
    tokio::pin!(conn);
    tokio::pin!(stop);
    tokio::select! {
        _ = conn.as_mut() => return,
        _ = &mut stop => {}
        _ = tokio::time::sleep(lifetime.max_age) => {}
        _ = activity.quiet_for(lifetime.idle) => {}
    }
    conn.as_mut().graceful_shutdown();
    let _ = tokio::time::timeout(lifetime.drain, conn).await;
}

/// The requests in hand on one connection, and when that count last changed.
struct Activity {
    state: Mutex<(usize, Instant)>,
}

impl Activity {
    fn new() -> Activity {
        Activity {
            state: Mutex::new((0, Instant::now())),
        }
    }

    fn begin(self: &Arc<Self>) -> InHand {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        s.0 += 1;
        s.1 = Instant::now();
        InHand(self.clone())
    }

    /// Resolves once no request has been in hand for `idle`.
    async fn quiet_for(&self, idle: Duration) {
        loop {
            let (in_hand, since) = *self.state.lock().unwrap_or_else(PoisonError::into_inner);
            let quiet = since.elapsed();
            if in_hand == 0 && quiet >= idle {
                return;
            }
            let wait = if in_hand == 0 { idle - quiet } else { idle };
            tokio::time::sleep(wait).await;
        }
    }
}

/// One request in hand; counted out when dropped.
struct InHand(Arc<Activity>);

impl Drop for InHand {
    fn drop(&mut self) {
        let mut s = self.0.state.lock().unwrap_or_else(PoisonError::into_inner);
        s.0 = s.0.saturating_sub(1);
        s.1 = Instant::now();
    }
}

/// A service whose requests are counted in `activity` while in hand.
struct Tracked<S> {
    inner: S,
    activity: Arc<Activity>,
}

impl<S, R> Service<R> for Tracked<S>
where
    S: Service<R>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Counted<S::Future>;

    fn call(&self, req: R) -> Self::Future {
        let in_hand = self.activity.begin();
        Counted {
            inner: self.inner.call(req),
            _in_hand: in_hand,
        }
    }
}

pin_project_lite::pin_project! {
    /// A request's answer, counted in hand until it is ready or dropped (no box per
    /// request: this runs for every delivery).
    pub struct Counted<F> {
        #[pin]
        inner: F,
        _in_hand: InHand,
    }
}

impl<F: Future> Future for Counted<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<F::Output> {
        self.project().inner.poll(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn quiet_waits_for_the_last_request_to_end() {
        let a = Arc::new(Activity::new());
        let held = a.begin();
        let idle = Duration::from_secs(2);
        let start = Instant::now();
        let ends = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(5)).await;
            drop(held);
        });
        a.quiet_for(idle).await;
        assert!(
            start.elapsed() >= Duration::from_secs(7),
            "{:?}",
            start.elapsed()
        );
        ends.await.unwrap();
    }
}
