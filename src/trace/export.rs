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
use prometheus::IntCounter;
use tokio::sync::{mpsc, oneshot};

use super::SpanData;

/// Spans waiting for export; one more is dropped (OpenTelemetry SDKs' default size).
pub const QUEUE: usize = 2048;
/// The most spans in one request.
const BATCH: usize = 512;
/// How long the first span of a batch waits for others.
const EVERY: Duration = Duration::from_secs(1);
/// One export request's bound.
const TIMEOUT: Duration = Duration::from_secs(5);
/// At shutdown, how long the last spans may take to leave.
pub const FLUSH: Duration = Duration::from_secs(2);
/// A collector's answer is read (and dropped) up to this size.
const MAX_ANSWER: usize = 64 * 1024;

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

    /// Exports until told to stop (then flushes what is queued) or until every tracer
    /// is gone.
    pub async fn run(
        mut self,
        mut spans: mpsc::Receiver<SpanData>,
        mut stop: oneshot::Receiver<oneshot::Sender<()>>,
    ) {
        loop {
            let first = tokio::select! {
                s = spans.recv() => match s {
                    Some(s) => s,
                    None => return,
                },
                Ok(done) = &mut stop => return self.flush(spans, Vec::new(), done).await,
            };
            let mut batch = vec![first];
            let deadline = tokio::time::Instant::now() + EVERY;
            while batch.len() < BATCH {
                tokio::select! {
                    s = spans.recv() => match s {
                        Some(s) => batch.push(s),
                        None => break,
                    },
                    _ = tokio::time::sleep_until(deadline) => break,
                    Ok(done) = &mut stop => return self.flush(spans, batch, done).await,
                }
            }
            self.post(batch, TIMEOUT).await;
        }
    }

    /// Sends `batch` and whatever is still queued, within `FLUSH`, then says so.
    async fn flush(
        mut self,
        mut spans: mpsc::Receiver<SpanData>,
        mut batch: Vec<SpanData>,
        done: oneshot::Sender<()>,
    ) {
        spans.close();
        let deadline = tokio::time::Instant::now() + FLUSH;
        loop {
            while batch.len() < BATCH {
                match spans.try_recv() {
                    Ok(s) => batch.push(s),
                    Err(_) => break,
                }
            }
            if batch.is_empty() {
                break;
            }
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                self.failed.inc_by(batch.len() as u64);
                break;
            }
            self.post(std::mem::take(&mut batch), left).await;
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
