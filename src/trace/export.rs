//! The exporter task: takes finished spans off the bounded queue, batches them and
//! posts each batch as OTLP/HTTP protobuf. A slow or dead collector costs spans
//! (counted in `idemgate_trace_spans_dropped_total`), never a delivery's time.

use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Uri, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use std::sync::Mutex;

use prometheus::IntCounter;
use tokio::sync::{Notify, oneshot};

use super::SpanData;

/// Spans waiting for export; one more is dropped (OpenTelemetry SDKs' default size).
const QUEUE: usize = 2048;
/// The most spans in one request.
const BATCH: usize = 512;
/// How often a batch that is not full is sent.
const EVERY: Duration = Duration::from_secs(1);
/// One export request's bound.
const TIMEOUT: Duration = Duration::from_secs(5);
/// At shutdown, how long the last spans may take to leave.
pub const FLUSH: Duration = Duration::from_secs(2);
/// A collector's answer is read (and dropped) up to this size.
const MAX_ANSWER: usize = 64 * 1024;

/// The finished spans waiting for the exporter. A span costs its delivery a lock and
/// a push; the exporter is woken only when a batch is full (or by its own timer), not
/// once per span.
#[derive(Default)]
pub struct Queue {
    spans: Mutex<Vec<SpanData>>,
    batch_ready: Notify,
}

impl Queue {
    /// Adds a span; false (dropped) when `QUEUE` spans already wait.
    pub fn push(&self, span: SpanData) -> bool {
        let mut spans = self.spans.lock().expect("not poisoned");
        if spans.len() >= QUEUE {
            return false;
        }
        spans.push(span);
        if spans.len() == BATCH {
            self.batch_ready.notify_one();
        }
        true
    }

    /// Takes up to `BATCH` spans, oldest first.
    fn take(&self) -> Vec<SpanData> {
        let mut spans = self.spans.lock().expect("not poisoned");
        if spans.len() <= BATCH {
            return std::mem::take(&mut *spans);
        }
        let rest = spans.split_off(BATCH);
        std::mem::replace(&mut *spans, rest)
    }
}

pub struct Exporter {
    client: Client<HttpConnector, Full<Bytes>>,
    url: Uri,
    service_name: String,
    failed: IntCounter,
    /// Whether the last export failed (a failure is logged once, until one succeeds).
    failing: bool,
}

impl Exporter {
    pub fn new(url: Uri, service_name: String, failed: IntCounter) -> Exporter {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(TIMEOUT));
        Exporter {
            client: Client::builder(TokioExecutor::new())
                .pool_idle_timeout(Duration::from_secs(30))
                .pool_max_idle_per_host(2)
                .build(connector),
            url,
            service_name,
            failed,
            failing: false,
        }
    }

    /// Exports a batch whenever one is full or a second has passed, until told to stop
    /// (then flushes what is queued).
    pub async fn run(
        mut self,
        queue: std::sync::Arc<Queue>,
        mut stop: oneshot::Receiver<oneshot::Sender<()>>,
    ) {
        loop {
            tokio::select! {
                _ = queue.batch_ready.notified() => {}
                _ = tokio::time::sleep(EVERY) => {}
                Ok(done) = &mut stop => return self.flush(&queue, done).await,
            }
            loop {
                let batch = queue.take();
                if batch.is_empty() {
                    break;
                }
                let full = batch.len() == BATCH;
                self.post(batch, TIMEOUT).await;
                if !full {
                    break;
                }
            }
        }
    }

    /// Sends whatever is queued, within `FLUSH`, then says so.
    async fn flush(mut self, queue: &Queue, done: oneshot::Sender<()>) {
        let deadline = tokio::time::Instant::now() + FLUSH;
        loop {
            let batch = queue.take();
            if batch.is_empty() {
                break;
            }
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                self.failed.inc_by(batch.len() as u64);
                continue;
            }
            self.post(batch, left).await;
        }
        let _ = done.send(());
    }

    /// Posts one batch; on any failure its spans are counted dropped.
    async fn post(&mut self, batch: Vec<SpanData>, within: Duration) {
        let n = batch.len() as u64;
        let body = super::otlp::encode(&self.service_name, batch);
        let req = Request::builder()
            .method(Method::POST)
            .uri(self.url.clone())
            .header(header::CONTENT_TYPE, "application/x-protobuf")
            .body(Full::new(Bytes::from(body)))
            .expect("a valid request");
        let call = async {
            let resp = self.client.request(req).await.map_err(|e| e.to_string())?;
            let status = resp.status();
            // Read to the end so the connection is reused.
            let _ = Limited::new(resp.into_body(), MAX_ANSWER).collect().await;
            if status.is_success() {
                Ok(())
            } else {
                Err(format!("the collector answered {status}"))
            }
        };
        let result = match tokio::time::timeout(within, call).await {
            Ok(r) => r,
            Err(_) => Err(format!("no answer within {within:?}")),
        };
        match result {
            Ok(()) => {
                if self.failing {
                    tracing::info!(url = %self.url, "trace export works again");
                }
                self.failing = false;
            }
            Err(e) => {
                self.failed.inc_by(n);
                if !self.failing {
                    tracing::warn!(url = %self.url, error = %e, spans = n, "trace export failed; spans are dropped until it works (idemgate_trace_spans_dropped_total)");
                }
                self.failing = true;
            }
        }
    }
}
