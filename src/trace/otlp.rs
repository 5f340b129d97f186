//! The OTLP/HTTP protobuf messages idemgate sends (opentelemetry-proto's
//! `collector/trace/v1` and `trace/v1`, only the fields it fills), and the encoding of
//! a batch of finished spans. Tests decode what is sent with the official definitions.

use prost::Message;

use super::span::{Kind, SpanData, Value};

#[derive(Clone, PartialEq, Message)]
pub struct ExportTraceServiceRequest {
    #[prost(message, repeated, tag = "1")]
    pub resource_spans: Vec<ResourceSpans>,
}

#[derive(Clone, PartialEq, Message)]
pub struct ResourceSpans {
    #[prost(message, optional, tag = "1")]
    pub resource: Option<Resource>,
    #[prost(message, repeated, tag = "2")]
    pub scope_spans: Vec<ScopeSpans>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Resource {
    #[prost(message, repeated, tag = "1")]
    pub attributes: Vec<KeyValue>,
}

#[derive(Clone, PartialEq, Message)]
pub struct ScopeSpans {
    #[prost(message, optional, tag = "1")]
    pub scope: Option<InstrumentationScope>,
    #[prost(message, repeated, tag = "2")]
    pub spans: Vec<Span>,
}

#[derive(Clone, PartialEq, Message)]
pub struct InstrumentationScope {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub version: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct Span {
    #[prost(bytes = "vec", tag = "1")]
    pub trace_id: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub span_id: Vec<u8>,
    #[prost(string, tag = "3")]
    pub trace_state: String,
    #[prost(bytes = "vec", tag = "4")]
    pub parent_span_id: Vec<u8>,
    #[prost(string, tag = "5")]
    pub name: String,
    #[prost(int32, tag = "6")]
    pub kind: i32,
    #[prost(fixed64, tag = "7")]
    pub start_time_unix_nano: u64,
    #[prost(fixed64, tag = "8")]
    pub end_time_unix_nano: u64,
    #[prost(message, repeated, tag = "9")]
    pub attributes: Vec<KeyValue>,
    #[prost(message, repeated, tag = "13")]
    pub links: Vec<Link>,
    #[prost(message, optional, tag = "15")]
    pub status: Option<Status>,
    #[prost(fixed32, tag = "16")]
    pub flags: u32,
}

#[derive(Clone, PartialEq, Message)]
pub struct Link {
    #[prost(bytes = "vec", tag = "1")]
    pub trace_id: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub span_id: Vec<u8>,
    #[prost(fixed32, tag = "6")]
    pub flags: u32,
}

#[derive(Clone, PartialEq, Message)]
pub struct Status {
    #[prost(string, tag = "2")]
    pub message: String,
    /// 0 unset, 1 ok, 2 error.
    #[prost(int32, tag = "3")]
    pub code: i32,
}

#[derive(Clone, PartialEq, Message)]
pub struct KeyValue {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(message, optional, tag = "2")]
    pub value: Option<AnyValue>,
}

#[derive(Clone, PartialEq, Message)]
pub struct AnyValue {
    #[prost(oneof = "any_value::Value", tags = "1, 2, 3")]
    pub value: Option<any_value::Value>,
}

pub mod any_value {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Value {
        #[prost(string, tag = "1")]
        String(String),
        #[prost(bool, tag = "2")]
        Bool(bool),
        #[prost(int64, tag = "3")]
        Int(i64),
    }
}

/// `SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK`: the flags field says whether a parent is remote.
const HAS_IS_REMOTE: u32 = 0x100;
/// `SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK`.
const IS_REMOTE: u32 = 0x200;

fn kv(key: &str, v: Value) -> KeyValue {
    let value = match v {
        Value::Str(s) => any_value::Value::String(s.into_owned()),
        Value::Int(i) => any_value::Value::Int(i),
        Value::Bool(b) => any_value::Value::Bool(b),
    };
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue { value: Some(value) }),
    }
}

fn span(d: SpanData) -> Span {
    let remote = if d.parent_is_remote { IS_REMOTE } else { 0 };
    Span {
        trace_id: d.context.trace_id.to_vec(),
        span_id: d.context.span_id.to_vec(),
        trace_state: d.trace_state.unwrap_or_default(),
        parent_span_id: d.parent.map(|p| p.to_vec()).unwrap_or_default(),
        name: d.name.into_owned(),
        kind: match d.kind {
            Kind::Internal => 1,
            Kind::Server => 2,
            Kind::Client => 3,
            Kind::Producer => 4,
            Kind::Consumer => 5,
        },
        start_time_unix_nano: d.start,
        end_time_unix_nano: d.end,
        attributes: d.attributes.into_iter().map(|(k, v)| kv(k, v)).collect(),
        links: d
            .links
            .into_iter()
            .map(|l| Link {
                trace_id: l.trace_id.to_vec(),
                span_id: l.span_id.to_vec(),
                flags: u32::from(l.flags) | HAS_IS_REMOTE,
            })
            .collect(),
        status: d.error.map(|message| Status { message, code: 2 }),
        flags: u32::from(d.context.flags) | HAS_IS_REMOTE | remote,
    }
}

/// One export request: the batch under the service's resource and idemgate's scope.
pub fn encode(service_name: &str, batch: Vec<SpanData>) -> Vec<u8> {
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![
                    kv("service.name", Value::from(service_name.to_string())),
                    kv("telemetry.sdk.name", Value::from("idemgate")),
                    kv("telemetry.sdk.language", Value::from("rust")),
                    kv(
                        "telemetry.sdk.version",
                        Value::from(env!("CARGO_PKG_VERSION")),
                    ),
                ],
            }),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: "idemgate".to_string(),
                    version: env!("CARGO_PKG_VERSION").to_string(),
                }),
                spans: batch.into_iter().map(span).collect(),
            }],
        }],
    }
    .encode_to_vec()
}
