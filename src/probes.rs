//! The probes on `admin_listen`: `/healthz`, `/readyz` and `/metrics`, for the kubelet
//! and Prometheus (the same listener serves the operator API under `/admin/`, which the
//! app sends to `web`). Kept off the provider listener so provider traffic never reaches it.

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;

use crate::metrics::Metrics;
use crate::store::Store;

fn text(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// The paths answered here.
const PATHS: [&str; 3] = ["/healthz", "/readyz", "/metrics"];

/// Whether `start`, the first bytes of an HTTP/1 connection, is a probe's request line
/// (`GET` or `HEAD` of a path above): the listener gives such connections slots of
/// their own, which the console's clients cannot take.
pub fn is_probe(start: &[u8]) -> bool {
    let Some(target) = start
        .strip_prefix(b"GET ")
        .or_else(|| start.strip_prefix(b"HEAD "))
    else {
        return false;
    };
    PATHS.iter().any(|p| {
        target
            .strip_prefix(p.as_bytes())
            .is_some_and(|rest| matches!(rest.first(), Some(b' ' | b'?')))
    })
}

/// The answer to a probe's connection while the probes' connections are all taken
/// and its head had not come in whole: an answer the kubelet sees, and a close.
pub fn probes_full() -> Response<Full<Bytes>> {
    let mut r = text(
        StatusCode::SERVICE_UNAVAILABLE,
        "too many probe connections\n",
    );
    r.headers_mut()
        .insert(http::header::RETRY_AFTER, HeaderValue::from_static("1"));
    r
}

/// Answers a probe or the metrics. `stores` are the delivery runtimes' store handles,
/// the first runtime's first: ready means every one answers (each runtime has its own
/// store connection), and the breaker and the store's bounds are read from the first.
pub async fn handle<S: Store, B>(
    stores: &[&S],
    metrics: &Metrics,
    req: Request<B>,
) -> Response<Full<Bytes>> {
    let store = stores[0];
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
    }
    match req.uri().path() {
        // Live unless the store cannot work again in this process (the `file:`
        // store's journal failed): the kubelet then restarts the container, and the
        // restart replays the directory.
        "/healthz" => match stores.iter().find_map(|s| s.broken()) {
            None => text(StatusCode::OK, "ok\n"),
            Some(e) => {
                tracing::error!(error = %e, "not live: the store needs a restart");
                text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "store broken: restart needed\n",
                )
            }
        },
        "/readyz" => match ping_all(stores).await {
            Ok(()) => text(StatusCode::OK, "ready\n"),
            Err(e) => {
                tracing::debug!(error = %e, "not ready");
                text(StatusCode::SERVICE_UNAVAILABLE, "store unavailable\n")
            }
        },
        "/metrics" => {
            metrics
                .store_circuit_open
                .set(i64::from(store.circuit_open()));
            metrics
                .store_journal_failed
                .set(i64::from(store.broken().is_some()));
            if let Some(stats) = store.bound_stats() {
                metrics.store_bound(stats.evictions, stats.oldest_age);
            }
            let mut r = Response::new(Full::new(Bytes::from(metrics.render())));
            r.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            r
        }
        _ => text(StatusCode::NOT_FOUND, "not found\n"),
    }
}

/// Pings each store in turn; the first error.
async fn ping_all<S: Store>(stores: &[&S]) -> Result<(), crate::store::StoreError> {
    for store in stores {
        store.ping().await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::is_probe;

    #[test]
    fn probes_are_told_by_their_request_line() {
        assert!(is_probe(b"GET /healthz HTTP/1.1\r\n"));
        assert!(is_probe(b"HEAD /readyz HTTP/1.1"));
        assert!(is_probe(b"GET /metrics?x=1 HTTP/1.1"));
        assert!(!is_probe(b"GET /healthzz HTTP/1.1"));
        assert!(!is_probe(b"GET /healthz"));
        assert!(!is_probe(b"POST /admin/login HTTP/1.1"));
        assert!(!is_probe(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"));
    }
}
