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

pub async fn handle<S: Store, B>(
    store: &S,
    metrics: &Metrics,
    req: Request<B>,
) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
    }
    match req.uri().path() {
        "/healthz" => text(StatusCode::OK, "ok\n"),
        "/readyz" => match store.ping().await {
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
