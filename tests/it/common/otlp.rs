//! A real OTLP/HTTP receiver for the tracing tests: it decodes each export with the
//! official opentelemetry-proto definitions (not idemgate's own), and can answer 500
//! or never answer, as a failing collector does.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;

/// How the receiver answers an export.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Answering {
    Ok,
    Fail,
    /// Never answers (the exporter's timeout must end the request).
    Hang,
}

/// One received span with the resource's `service.name`.
#[derive(Clone, Debug)]
pub struct Received {
    pub service: String,
    pub span: Span,
}

impl Received {
    pub fn attr(&self, key: &str) -> Option<any_value::Value> {
        attr(&self.span, key)
    }
    pub fn str(&self, key: &str) -> Option<String> {
        match self.attr(key)? {
            any_value::Value::StringValue(s) => Some(s),
            _ => None,
        }
    }
    pub fn int(&self, key: &str) -> Option<i64> {
        match self.attr(key)? {
            any_value::Value::IntValue(i) => Some(i),
            _ => None,
        }
    }
    pub fn bool(&self, key: &str) -> Option<bool> {
        match self.attr(key)? {
            any_value::Value::BoolValue(b) => Some(b),
            _ => None,
        }
    }
    pub fn trace_hex(&self) -> String {
        hex::encode(&self.span.trace_id)
    }
    pub fn id_hex(&self) -> String {
        hex::encode(&self.span.span_id)
    }
    pub fn parent_hex(&self) -> String {
        hex::encode(&self.span.parent_span_id)
    }
    /// Every attribute value as text (to check that nothing secret is in one).
    pub fn values(&self) -> Vec<String> {
        self.span
            .attributes
            .iter()
            .map(|kv| format!("{:?}", kv.value))
            .collect()
    }
}

fn attr(span: &Span, key: &str) -> Option<any_value::Value> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.clone())
        .and_then(|AnyValue { value }| value)
}

#[derive(Default)]
struct State {
    spans: Vec<Received>,
    content_types: Vec<String>,
}

pub struct Collector {
    addr: std::net::SocketAddr,
    state: Arc<Mutex<State>>,
    task: tokio::task::JoinHandle<()>,
}

impl Collector {
    pub async fn start(answering: Answering) -> Collector {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(State::default()));
        let st = state.clone();
        let task = super::serve_each(listener, move |req: Request<Incoming>| {
            let st = st.clone();
            async move { Ok::<_, Infallible>(receive(st, answering, req).await) }
        });
        Collector { addr, state, task }
    }

    /// The base URL, as `otlp_endpoint` takes it.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn spans(&self) -> Vec<Received> {
        self.state.lock().unwrap().spans.clone()
    }

    pub fn content_types(&self) -> Vec<String> {
        self.state.lock().unwrap().content_types.clone()
    }

    /// The spans of one trace (hex id), once `n` of them have arrived.
    pub async fn wait_trace(&self, trace: &str, n: usize, deadline: Duration) -> Vec<Received> {
        let mut got = Vec::new();
        super::wait_until(deadline, &format!("{n} spans of trace {trace}"), || {
            got = self
                .spans()
                .into_iter()
                .filter(|r| r.trace_hex() == trace)
                .collect();
            got.len() >= n
        })
        .await;
        got
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn receive(
    state: Arc<Mutex<State>>,
    mode: Answering,
    req: Request<Incoming>,
) -> Response<Full<Bytes>> {
    if mode == Answering::Hang {
        tokio::time::sleep(Duration::from_secs(3600)).await;
    }
    let path_ok = req.uri().path() == "/v1/traces";
    let ct = req
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let body = req.into_body().collect().await.unwrap().to_bytes();
    let decoded = ExportTraceServiceRequest::decode(body).expect("a valid OTLP protobuf export");
    {
        let mut st = state.lock().unwrap();
        st.content_types.push(ct);
        if path_ok && mode == Answering::Ok {
            for rs in decoded.resource_spans {
                let service = rs
                    .resource
                    .as_ref()
                    .and_then(|r| r.attributes.iter().find(|kv| kv.key == "service.name"))
                    .and_then(|kv| kv.value.clone())
                    .and_then(|v| match v.value {
                        Some(any_value::Value::StringValue(s)) => Some(s),
                        _ => None,
                    })
                    .unwrap_or_default();
                for ss in rs.scope_spans {
                    for span in ss.spans {
                        st.spans.push(Received {
                            service: service.clone(),
                            span,
                        });
                    }
                }
            }
        }
    }
    let status = if path_ok && mode == Answering::Ok {
        200
    } else {
        500
    };
    Response::builder()
        .status(status)
        .body(Full::new(Bytes::new()))
        .unwrap()
}
