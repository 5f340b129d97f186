//! Spans around the calls a delivery makes: the store's operations and the request to
//! the application (whose `traceparent` names the call's span).

use std::future::Future;

use crate::upstream::{Outgoing, Upstream, UpstreamError, UpstreamResponse};

use super::{Kind, Record, child, child_named};

/// Runs a store operation in a client span named `op` (`db.operation.name`).
pub async fn store_op<T, E>(
    op: &'static str,
    f: impl Future<Output = Result<T, E>>,
) -> Result<T, E> {
    let mut span = child(op, Kind::Client);
    span.set("db.operation.name", op);
    let r = f.await;
    if r.is_err() {
        span.set("error.type", "store_error");
        span.fail("the store call failed");
    }
    r
}

/// Forwards to the application in a client span (OpenTelemetry's HTTP client
/// conventions) that is the parent of the application's work.
pub async fn forward(
    upstream: &Upstream,
    mut out: Outgoing<'_>,
) -> Result<UpstreamResponse, UpstreamError> {
    let mut span = child_named(|| out.method.as_str().to_string().into(), Kind::Client);
    if let Some(s) = &span {
        out.traceparent = Some(s.context().header());
        let base = upstream.base();
        span.set("http.request.method", out.method.as_str().to_string());
        span.set(
            "url.full",
            format!("{base}{}", without_query(out.path_and_query)),
        );
        if let Some((host, port)) = base
            .rsplit_once("://")
            .map(|(_, a)| a)
            .and_then(|a| a.rsplit_once(':'))
        {
            span.set("server.address", host.to_string());
            if let Ok(p) = port.parse::<u16>() {
                span.set("server.port", p);
            }
        }
    }
    let r = upstream.forward(out).await;
    match &r {
        Ok(resp) => {
            span.set("http.response.status_code", resp.status.as_u16());
            if resp.status.is_client_error() || resp.status.is_server_error() {
                span.set("error.type", resp.status.as_u16().to_string());
                span.fail(format!("the application answered {}", resp.status.as_u16()));
            }
        }
        Err(e) => {
            let kind = match e {
                UpstreamError::Unreachable(_) => "unreachable",
                UpstreamError::Timeout => "timeout",
                UpstreamError::TooLarge => "too_large",
            };
            span.set("error.type", kind);
            span.fail(kind);
        }
    }
    r
}

/// The path without its query: a query can carry a token (some providers sign or key
/// by it), and nothing secret goes into an attribute.
fn without_query(pq: &str) -> &str {
    pq.split_once('?').map_or(pq, |(p, _)| p)
}
