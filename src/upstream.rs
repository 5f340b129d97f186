//! Forwarding to the application: one pooled keep-alive hyper client, the request
//! passed on byte for byte (minus hop-by-hop headers), the answer read under a size
//! cap and the upstream timeout.

use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

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
    pub headers: &'a HeaderMap,
    pub body: Bytes,
    /// The original request's authority, sent as `Host` when it came without one (HTTP/2).
    pub authority: Option<&'a str>,
    pub idempotency_key: Option<HeaderValue>,
    /// The `traceparent` naming idemgate's span for this call (replaces the caller's).
    pub traceparent: Option<HeaderValue>,
}

pub struct Upstream {
    client: Client<HttpConnector, Full<Bytes>>,
    /// `http://host:port`
    base: String,
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
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(timeout));
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(60))
            .pool_max_idle_per_host(256)
            .build(connector);
        let base = format!(
            "{}://{}",
            base.scheme_str().unwrap_or("http"),
            base.authority().map(|a| a.as_str()).unwrap_or("127.0.0.1")
        );
        Upstream {
            client,
            base,
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
        let mut uri = String::with_capacity(self.base.len() + out.path_and_query.len());
        uri.push_str(&self.base);
        uri.push_str(out.path_and_query);
        let mut req = Request::builder()
            .method(out.method.clone())
            .uri(uri)
            .body(Full::new(out.body))
            .map_err(|e| UpstreamError::Unreachable(e.to_string()))?;
        let headers = req.headers_mut();
        *headers = end_to_end(out.headers);
        if !headers.contains_key(header::HOST)
            && let Some(authority) = out.authority.and_then(|a| HeaderValue::from_str(a).ok())
        {
            headers.insert(header::HOST, authority);
        }
        if let Some(k) = out.idempotency_key {
            headers.insert(HeaderName::from_static("idempotency-key"), k);
        }
        if let Some(t) = out.traceparent {
            headers.insert(HeaderName::from_static("traceparent"), t);
        }
        let call = async {
            let resp = self
                .client
                .request(req)
                .await
                .map_err(|e| UpstreamError::Unreachable(format!("{e}{}", source_chain(&e))))?;
            let (parts, body) = resp.into_parts();
            if let Some(len) = parts
                .headers
                .get(header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok())
                && len > self.max_response as u64
            {
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
                        UpstreamError::Unreachable(e.to_string())
                    }
                })?
                .to_bytes();
            let mut headers = parts.headers;
            strip_hop_by_hop(&mut headers);
            headers.remove(header::CONTENT_LENGTH);
            Ok(UpstreamResponse {
                status: parts.status,
                headers,
                body,
            })
        };
        match tokio::time::timeout(self.timeout, call).await {
            Ok(r) => r,
            Err(_) => Err(UpstreamError::Timeout),
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_through_storage() {
        let mut h = HeaderMap::new();
        h.insert("content-type", HeaderValue::from_static("application/json"));
        h.append("set-cookie", HeaderValue::from_static("a=1"));
        h.append("set-cookie", HeaderValue::from_static("b=2: c"));
        h.insert("x-bin", HeaderValue::from_bytes(b"caf\xe9").unwrap());
        let mut back = HeaderMap::new();
        decode_headers(&encode_headers(&h), &mut back);
        assert_eq!(back, h);
    }

    #[test]
    fn hop_by_hop_headers_are_dropped() {
        let mut h = HeaderMap::new();
        h.insert(
            "connection",
            HeaderValue::from_static("keep-alive, x-conn-only"),
        );
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("x-conn-only", HeaderValue::from_static("1"));
        h.insert("transfer-encoding", HeaderValue::from_static("chunked"));
        h.insert("te", HeaderValue::from_static("trailers"));
        h.insert("upgrade", HeaderValue::from_static("websocket"));
        h.insert("proxy-authorization", HeaderValue::from_static("Basic x"));
        h.insert("proxy-status", HeaderValue::from_static("edge"));
        h.insert("proxy-x-tenant", HeaderValue::from_static("acme"));
        h.insert("host", HeaderValue::from_static("example.com"));
        h.insert("x-end", HeaderValue::from_static("1"));
        let e = end_to_end(&h);
        assert_eq!(e.len(), 2);
        assert!(e.contains_key("host") && e.contains_key("x-end"));
    }
}
