//! Forwarding to the application: hyper's own HTTP/1 client over keep-alive
//! connections kept idle per thread (`pool`), the request passed on byte for byte
//! (minus hop-by-hop headers), the answer read under a size cap and the upstream timeout.

mod io;
mod pool;
#[cfg(test)]
mod tests;

use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full, Limited};

use pool::{Pool, PoolLimits};

/// The upstream's answer, read whole.
#[derive(Debug, Clone)]
pub struct UpstreamResponse {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("upstream unreachable: {0}")]
    Unreachable(String),
    #[error("upstream did not answer within the upstream timeout")]
    Timeout,
    #[error("upstream answer larger than max_response")]
    TooLarge,
}

/// What is forwarded: the parts of the provider's request that travel upstream.
pub struct Outgoing<'a> {
    pub method: &'a Method,
    /// The path (and query) to request on the upstream.
    pub path_and_query: &'a str,
    /// The request's headers, moved into the forwarded request (hop-by-hop ones are
    /// dropped in place): no copy per delivery.
    pub headers: HeaderMap,
    pub body: Bytes,
    /// The original request's authority, sent as `Host` when it came without one (HTTP/2).
    pub authority: Option<&'a str>,
    pub idempotency_key: Option<HeaderValue>,
    /// The `traceparent` naming idemgate's span for this call (replaces the caller's).
    pub traceparent: Option<HeaderValue>,
}

/// The application's address and its keep-alive connections.
pub struct Upstream {
    pool: Pool,
    /// `http://host:port`
    base: String,
    /// `Host` for a request that has none and no authority: the upstream's own.
    host: HeaderValue,
    timeout: Duration,
    max_response: usize,
}

/// Hop-by-hop headers (RFC 9110 §7.6.1): they describe one connection and are never
/// forwarded. Headers named in `Connection`, and every `Proxy-*` header (meant for a
/// proxy on the way, never for the application or the provider), are dropped too.
const HOP_BY_HOP: [HeaderName; 5] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
];

/// Copies the end-to-end headers of `from` (drops hop-by-hop ones and any named by
/// `Connection`, and `Upgrade`).
pub fn end_to_end(from: &HeaderMap) -> HeaderMap {
    let mut out = from.clone();
    strip_hop_by_hop(&mut out);
    out
}

pub fn strip_hop_by_hop(h: &mut HeaderMap) {
    let named: Vec<HeaderName> = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for n in named {
        h.remove(n);
    }
    for n in HOP_BY_HOP.iter() {
        h.remove(n);
    }
    h.remove(header::UPGRADE);
    let proxy: Vec<HeaderName> = h
        .keys()
        .filter(|n| n.as_str().starts_with("proxy-"))
        .cloned()
        .collect();
    for n in proxy {
        h.remove(n);
    }
}

impl Upstream {
    pub fn new(base: &Uri, timeout: Duration, max_response: usize) -> Self {
        Self::with_limits(base, timeout, max_response, PoolLimits::default())
    }

    fn with_limits(base: &Uri, timeout: Duration, max_response: usize, limits: PoolLimits) -> Self {
        let authority = base.authority().map(|a| a.as_str()).unwrap_or("127.0.0.1");
        let host = base.host().unwrap_or("127.0.0.1");
        let port = base.port_u16().unwrap_or(80);
        // What hyper-util's client sent: the host, and the port unless it is 80.
        let host_header = if port == 80 {
            host.to_string()
        } else {
            format!("{host}:{port}")
        };
        Upstream {
            pool: Pool::new(host, port, limits),
            base: format!("{}://{authority}", base.scheme_str().unwrap_or("http")),
            host: HeaderValue::from_str(&host_header)
                .unwrap_or_else(|_| HeaderValue::from_static("127.0.0.1")),
            timeout,
            max_response,
        }
    }

    /// `http://host:port`: where deliveries go.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// Sends the delivery and reads the answer, all within the upstream timeout.
    pub async fn forward(&self, out: Outgoing<'_>) -> Result<UpstreamResponse, UpstreamError> {
        let req = self.request(out)?;
        match tokio::time::timeout(self.timeout, self.exchange(req)).await {
            Ok(r) => r,
            Err(_) => Err(UpstreamError::Timeout),
        }
    }

    /// The request as it goes on the wire: origin-form target, end-to-end headers, `Host`.
    fn request(&self, out: Outgoing<'_>) -> Result<Request<Full<Bytes>>, UpstreamError> {
        let target = if out.path_and_query.is_empty() {
            Uri::from_static("/")
        } else {
            Uri::try_from(out.path_and_query)
                .map_err(|e| UpstreamError::Unreachable(format!("invalid target: {e}")))?
        };
        let mut req = Request::new(Full::new(out.body));
        *req.method_mut() = out.method.clone();
        *req.uri_mut() = target;
        let headers = req.headers_mut();
        *headers = out.headers;
        strip_hop_by_hop(headers);
        if !headers.contains_key(header::HOST) {
            let authority = out.authority.and_then(|a| HeaderValue::from_str(a).ok());
            headers.insert(header::HOST, authority.unwrap_or_else(|| self.host.clone()));
        }
        if let Some(k) = out.idempotency_key {
            headers.insert(HeaderName::from_static("idempotency-key"), k);
        }
        if let Some(t) = out.traceparent {
            headers.insert(HeaderName::from_static("traceparent"), t);
        }
        Ok(req)
    }

    /// One exchange: a connection (idle or new), the request (once more on a fresh
    /// connection when a reused one turned out closed, see `pool::Resend`), the answer
    /// read whole, the connection kept for the next delivery.
    async fn exchange(&self, req: Request<Full<Bytes>>) -> Result<UpstreamResponse, UpstreamError> {
        let mut conn = self.pool.conn().await?;
        let resend = self.pool.resend(&conn, &req);
        let resp = match conn.send(req).await {
            Ok(resp) => resp,
            Err(mut failed) => {
                let Some(req) = resend.after(&mut failed) else {
                    return Err(failed.into_unreachable());
                };
                conn = self.pool.connect().await?;
                match conn.send(req).await {
                    Ok(resp) => resp,
                    Err(failed) => return Err(failed.into_unreachable()),
                }
            }
        };
        let (parts, body) = resp.into_parts();
        if let Some(len) = parts
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
            && len > self.max_response as u64
        {
            // The connection goes with the unread answer: hyper closes it.
            return Err(UpstreamError::TooLarge);
        }
        let body = Limited::new(body, self.max_response)
            .collect()
            .await
            .map_err(|e| {
                if e.downcast_ref::<http_body_util::LengthLimitError>()
                    .is_some()
                {
                    UpstreamError::TooLarge
                } else {
                    UpstreamError::Unreachable(format!("{e}{}", source_chain(&*e)))
                }
            })?
            .to_bytes();
        self.pool.idle(conn);
        let mut headers = parts.headers;
        strip_hop_by_hop(&mut headers);
        headers.remove(header::CONTENT_LENGTH);
        Ok(UpstreamResponse {
            status: parts.status,
            headers,
            body,
        })
    }
}

fn source_chain(e: &dyn std::error::Error) -> String {
    let mut s = String::new();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// Encodes headers for storage as `name: value\r\n` lines (values cannot hold CR/LF).
pub fn encode_headers(h: &HeaderMap) -> Bytes {
    let mut out = Vec::with_capacity(h.len() * 32);
    for (name, value) in h {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    Bytes::from(out)
}

/// Decodes what `encode_headers` wrote; malformed lines are skipped.
pub fn decode_headers(bytes: &[u8], into: &mut HeaderMap) {
    for line in bytes.split(|b| *b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(colon) = line.iter().position(|b| *b == b':') else {
            continue;
        };
        let (name, value) = line.split_at(colon);
        let value = value[1..].strip_prefix(b" ").unwrap_or(&value[1..]);
        if let (Ok(n), Ok(v)) = (HeaderName::from_bytes(name), HeaderValue::from_bytes(value)) {
            into.append(n, v);
        }
    }
}
