//! OpenTelemetry tracing through the sidecar (docs/tracing.md): the provider's
//! `traceparent` continues through idemgate's spans to the application, and finished
//! spans are exported over OTLP/HTTP from a bounded queue that drops rather than waits.
//!
//! Off (no endpoint) every call here is a `None` check. The spans of one delivery find
//! their parent through a task-local set by `within`, as OpenTelemetry's `Context` does,
//! so the pipeline's functions need no extra parameter.

use std::borrow::Cow;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::HeaderValue;
use prometheus::{IntCounter, IntCounterVec};
use tokio::sync::oneshot;

use crate::config::{Root, Sampler, TracingConfig};

mod call;
mod context;
mod export;
mod otlp;
mod span;

pub use call::{forward, store_op};
pub use context::{Incoming, SpanContext, TRACEPARENT, TRACESTATE};
pub use otlp::encode;
pub use span::{Kind, Record, Span, SpanData, Value};

/// The exporter's side of a tracer: where finished spans go.
pub(crate) struct Inner {
    /// The sampler and `start_traces`, swapped whole by a live reload (`update`).
    policy: arc_swap::ArcSwap<Policy>,
    queue: Arc<export::Queue>,
    queue_full: IntCounter,
    /// Asks the exporter to flush and stop; it answers on the enclosed sender.
    stop: Mutex<Option<oneshot::Sender<oneshot::Sender<()>>>>,
}

impl Inner {
    /// Queues a finished span, or counts it dropped when the queue is full: a delivery
    /// never waits for tracing.
    fn send(&self, span: SpanData) {
        if !self.queue.push(span) {
            self.queue_full.inc();
        }
    }
}

/// Which traces are recorded: what a reload may change (the exporter's endpoint and
/// service name need a restart).
#[derive(Debug, Clone, Copy)]
struct Policy {
    sampler: Sampler,
    /// Whether a request without `traceparent` starts a trace.
    start_traces: bool,
}

impl Policy {
    fn of(config: &TracingConfig) -> Policy {
        Policy {
            sampler: config.sampler,
            start_traces: config.start_traces,
        }
    }
}

/// Starts and exports spans; cheap to clone. `Tracer::default()` is off.
#[derive(Clone, Default)]
pub struct Tracer(Option<Arc<Inner>>);

impl Tracer {
    /// A tracer for `config`, spawning its exporter (on the current tokio runtime)
    /// when an endpoint is set; off otherwise.
    pub fn new(config: &TracingConfig, dropped: &IntCounterVec) -> Tracer {
        let Some(url) = config.traces_url.clone() else {
            return Tracer(None);
        };
        let queue = Arc::new(export::Queue::default());
        let (stop, stopped) = oneshot::channel();
        let exporter = export::Exporter::new(
            url,
            config.service_name.clone(),
            dropped.with_label_values(&["export_failed"]),
        );
        tokio::spawn(exporter.run(queue.clone(), stopped));
        Tracer(Some(Arc::new(Inner {
            policy: arc_swap::ArcSwap::from_pointee(Policy::of(config)),
            queue,
            queue_full: dropped.with_label_values(&["queue_full"]),
            stop: Mutex::new(Some(stop)),
        })))
    }

    /// Puts `config`'s sampler and `start_traces` in force for every trace started
    /// from now on (a live reload); nothing when tracing is off.
    pub fn update(&self, config: &TracingConfig) {
        if let Some(inner) = &self.0 {
            inner.policy.store(Arc::new(Policy::of(config)));
        }
    }

    /// Whether spans are recorded at all.
    pub fn is_on(&self) -> bool {
        self.0.is_some()
    }

    /// The first span of a unit of work: a child of `parent` (the caller's span, from
    /// `traceparent`) when there is one, else a new trace when `start_traces` is set;
    /// `None` when the sampler says no (or tracing is off).
    pub fn start(
        &self,
        parent: Option<SpanContext>,
        state: Option<&HeaderValue>,
        name: impl Into<Cow<'static, str>>,
        kind: Kind,
    ) -> Option<Span> {
        let inner = self.0.as_ref()?;
        let policy = **inner.policy.load();
        if parent.is_none() && !policy.start_traces {
            return None;
        }
        let trace_id = match parent {
            Some(p) => p.trace_id,
            None => random_trace_id(),
        };
        if !sampled(policy.sampler, parent.as_ref(), &trace_id) {
            return None;
        }
        Some(Span {
            inner: inner.clone(),
            data: SpanData {
                context: SpanContext {
                    trace_id,
                    span_id: random_span_id(),
                    flags: parent.map_or(0, |p| p.flags) | 0x01,
                },
                parent: parent.map(|p| p.span_id),
                parent_is_remote: parent.is_some(),
                trace_state: state.and_then(|s| s.to_str().ok()).map(str::to_string),
                name: name.into(),
                kind,
                start: span::now_nanos(),
                ..SpanData::default()
            },
        })
    }

    /// The span of a request that may carry its caller's `traceparent`; the headers are
    /// read (and the name built) only when tracing is on.
    pub fn continue_from(
        &self,
        headers: &http::HeaderMap,
        name: impl FnOnce() -> String,
        kind: Kind,
    ) -> Option<Span> {
        if !self.is_on() {
            return None;
        }
        let incoming = Incoming::from_headers(headers);
        self.start(incoming.parent, incoming.state.as_ref(), name(), kind)
    }

    /// Flushes the spans still queued (at most 2 s) and stops the exporter.
    pub async fn shutdown(&self) {
        let Some(inner) = &self.0 else { return };
        let stop = inner.stop.lock().expect("not poisoned").take();
        if let Some(stop) = stop {
            let (done, flushed) = oneshot::channel();
            if stop.send(done).is_ok() {
                let _ =
                    tokio::time::timeout(export::FLUSH + Duration::from_millis(500), flushed).await;
            }
        }
    }
}

/// A new span with `parent` as its parent (same trace).
fn child_of(
    inner: &Arc<Inner>,
    parent: &SpanContext,
    trace_state: Option<String>,
    name: Cow<'static, str>,
    kind: Kind,
) -> Span {
    Span {
        inner: inner.clone(),
        data: SpanData {
            context: SpanContext {
                span_id: random_span_id(),
                ..*parent
            },
            parent: Some(parent.span_id),
            trace_state,
            name,
            kind,
            start: span::now_nanos(),
            ..SpanData::default()
        },
    }
}

/// The span the current task's work belongs to (set by `within`).
#[derive(Clone)]
struct Current {
    inner: Arc<Inner>,
    context: SpanContext,
    trace_state: Option<String>,
}

tokio::task_local! {
    static CURRENT: Current;
}

/// Runs `work` with `span` as the parent of the spans `child` starts in it.
pub async fn within<F: Future>(span: Option<&Span>, work: F) -> F::Output {
    match span {
        Some(s) => {
            let current = Current {
                inner: s.inner.clone(),
                context: s.data.context,
                trace_state: s.data.trace_state.clone(),
            };
            CURRENT.scope(current, work).await
        }
        None => work.await,
    }
}

/// A span under the current task's span (`within`); `None` outside one.
pub fn child(name: impl Into<Cow<'static, str>>, kind: Kind) -> Option<Span> {
    child_named(|| name.into(), kind)
}

/// `child` with a name that is built (allocated) only when there is a span to name.
pub fn child_named(name: impl FnOnce() -> Cow<'static, str>, kind: Kind) -> Option<Span> {
    CURRENT
        .try_with(|c| child_of(&c.inner, &c.context, c.trace_state.clone(), name(), kind))
        .ok()
}

/// The sampler's decision for a span of `trace_id` under `parent` (pure).
pub fn sampled(sampler: Sampler, parent: Option<&SpanContext>, trace_id: &[u8; 16]) -> bool {
    let root = |r: Root| match r {
        Root::AlwaysOn => true,
        Root::AlwaysOff => false,
        Root::Ratio(ratio) => by_ratio(ratio, trace_id),
    };
    match sampler {
        Sampler::AlwaysOn => true,
        Sampler::AlwaysOff => false,
        Sampler::Ratio(ratio) => by_ratio(ratio, trace_id),
        Sampler::ParentBased(r) => match parent {
            Some(p) => p.sampled(),
            None => root(r),
        },
    }
}

/// Keeps `ratio` of trace ids, by their last 8 bytes (the random part in W3C ids), so
/// every sidecar decides the same for one trace.
fn by_ratio(ratio: f64, trace_id: &[u8; 16]) -> bool {
    if ratio >= 1.0 {
        return true;
    }
    if ratio <= 0.0 {
        return false;
    }
    let mut low = [0u8; 8];
    low.copy_from_slice(&trace_id[8..]);
    let x = u64::from_be_bytes(low) >> 1;
    x < (ratio * (1u64 << 63) as f64) as u64
}

fn random_trace_id() -> [u8; 16] {
    loop {
        let id: [u8; 16] = rand::random();
        if id != [0; 16] {
            return id;
        }
    }
}

fn random_span_id() -> [u8; 8] {
    loop {
        let id: [u8; 8] = rand::random();
        if id != [0; 8] {
            return id;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(sampled: bool) -> SpanContext {
        SpanContext {
            trace_id: [7; 16],
            span_id: [9; 8],
            flags: u8::from(sampled),
        }
    }

    #[test]
    fn parent_based_follows_the_callers_flag_and_roots_follow_the_ratio() {
        let s = Sampler::ParentBased(Root::Ratio(0.0));
        assert!(sampled(s, Some(&ctx(true)), &[1; 16]));
        assert!(!sampled(s, Some(&ctx(false)), &[1; 16]));
        assert!(!sampled(s, None, &[1; 16]));
        assert!(sampled(
            Sampler::ParentBased(Root::AlwaysOn),
            None,
            &[1; 16]
        ));
        assert!(sampled(Sampler::AlwaysOn, Some(&ctx(false)), &[1; 16]));
        assert!(!sampled(Sampler::AlwaysOff, Some(&ctx(true)), &[1; 16]));
    }

    #[test]
    fn a_ratio_keeps_about_that_share_of_random_ids() {
        let kept = (0..20_000)
            .filter(|_| sampled(Sampler::Ratio(0.25), None, &random_trace_id()))
            .count();
        assert!(
            (4_000..6_000).contains(&kept),
            "{kept} of 20000 kept at 0.25"
        );
        assert!(by_ratio(1.0, &[0xff; 16]));
        assert!(!by_ratio(0.0, &[0; 16]));
    }
}
