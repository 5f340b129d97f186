//! A span in progress and what it becomes when it ends: the data the exporter sends.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use super::Inner;
use super::context::SpanContext;

/// OpenTelemetry's span kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Kind {
    #[default]
    Internal,
    Server,
    Client,
    Producer,
    Consumer,
}

/// An attribute's value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Str(Cow<'static, str>),
    Int(i64),
    Bool(bool),
}

impl From<&'static str> for Value {
    fn from(s: &'static str) -> Value {
        Value::Str(Cow::Borrowed(s))
    }
}
impl From<String> for Value {
    fn from(s: String) -> Value {
        Value::Str(Cow::Owned(s))
    }
}
impl From<i64> for Value {
    fn from(i: i64) -> Value {
        Value::Int(i)
    }
}
impl From<u64> for Value {
    fn from(i: u64) -> Value {
        Value::Int(i64::try_from(i).unwrap_or(i64::MAX))
    }
}
impl From<u16> for Value {
    fn from(i: u16) -> Value {
        Value::Int(i64::from(i))
    }
}
impl From<bool> for Value {
    fn from(b: bool) -> Value {
        Value::Bool(b)
    }
}

/// A finished span.
#[derive(Debug, Clone, Default)]
pub struct SpanData {
    pub context: SpanContext,
    /// The parent span's id (`None`: a root span).
    pub parent: Option<[u8; 8]>,
    /// Whether the parent is the provider's (from `traceparent`), not one of ours.
    pub parent_is_remote: bool,
    pub trace_state: Option<String>,
    pub name: Cow<'static, str>,
    pub kind: Kind,
    /// Unix nanoseconds.
    pub start: u64,
    pub end: u64,
    pub attributes: Vec<(&'static str, Value)>,
    pub links: Vec<SpanContext>,
    /// Set: the span's status is Error, with this message.
    pub error: Option<String>,
}

pub(super) fn now_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// A recording span: ends (and is handed to the exporter) when dropped.
pub struct Span {
    pub(super) inner: Arc<Inner>,
    pub(super) data: SpanData,
}

impl Span {
    /// This span's identity, for a child or for `traceparent`.
    pub fn context(&self) -> SpanContext {
        self.data.context
    }

    pub fn set(&mut self, key: &'static str, value: impl Into<Value>) {
        self.data.attributes.push((key, value.into()));
    }

    /// Marks the span failed (status Error) with a short reason.
    pub fn fail(&mut self, message: impl Into<String>) {
        self.data.error = Some(message.into());
    }

    /// Adds a link to another span (an async delivery attempt's accepting request).
    pub fn link(&mut self, to: SpanContext) {
        self.data.links.push(to);
    }

    /// A new span under this one.
    pub fn child(&self, name: impl Into<Cow<'static, str>>, kind: Kind) -> Span {
        super::child_of(
            &self.inner,
            &self.data.context,
            self.data.trace_state.clone(),
            name.into(),
            kind,
        )
    }
}

impl Drop for Span {
    fn drop(&mut self) {
        let mut data = std::mem::take(&mut self.data);
        data.end = now_nanos();
        self.inner.send(data);
    }
}

/// Recording on a span that may not exist (tracing off, or the trace not sampled).
pub trait Record {
    fn set(&mut self, key: &'static str, value: impl Into<Value>);
    fn fail(&mut self, message: impl Into<String>);
}

impl Record for Option<Span> {
    fn set(&mut self, key: &'static str, value: impl Into<Value>) {
        if let Some(s) = self {
            s.set(key, value);
        }
    }
    fn fail(&mut self, message: impl Into<String>) {
        if let Some(s) = self {
            s.fail(message);
        }
    }
}
