//! The delivery log's writes for plain claims, off the delivery's path: a claim's one
//! awaited command is the record's `SET … NX GET` (record.rs); what it means for the
//! log (attempts, duplicates, first and last seen, the fingerprint, the kept request,
//! the recent index) is queued here and written by one background task, as one
//! pipeline per batch of concurrent deliveries (no Lua, one write and one read per
//! batch instead of per delivery).
//!
//! The log hash holds no state a claim decides on, so the order between these writes
//! and a completion's script does not matter: counters are `HINCRBY`, `first_seen` is
//! `HSETNX`. A write that lands after an operator's forget re-creates a fragment of
//! the hash: `PEXPIRE … NX` gives it a lifetime, and a hash without `first_seen` is not
//! a delivery to the log's reads. Reads in this process (`flush`) first wait for what
//! was queued before them; another process sees the writes one batch later.

use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::connection::Connection;
use crate::store::log::{KeptRequest, RECENT_PER_ROUTE};

/// How many writes the queue holds before a claim waits for the writer.
const QUEUE: usize = 8192;
/// How many writes one pipeline carries at most.
const BATCH: usize = 256;

/// One claim's writes to the log.
pub(crate) struct LogWrite {
    /// The log hash's key.
    pub hash: String,
    /// The route's recent index, when this claim is logged and the store keeps one.
    pub index: Option<String>,
    /// The delivery's key (the index's member).
    pub key: String,
    pub now: u64,
    pub kind: WriteKind,
}

pub(crate) enum WriteKind {
    /// This claim took the key: one more attempt; the request, when kept.
    Claimed {
        fp_hex: String,
        kept: Option<KeptRequest>,
    },
    /// A copy answered from the record: one more duplicate.
    Copy,
}

/// One queue slot; nearly every message is a `Write`, so boxing it to shrink the rare
/// `Flush` would cost an allocation per delivery.
#[allow(clippy::large_enum_variant)]
enum Msg {
    Write(LogWrite),
    Flush(oneshot::Sender<()>),
}

/// Lifetimes the writes give the hash and the index (ms).
#[derive(Clone, Copy)]
pub(crate) struct WriteTtls {
    /// A new hash of a claim: the longer of retention and lease.
    pub hash: u64,
    /// A copy's hash when it has none (a fragment after a forget): retention.
    pub fragment: u64,
    /// The recent index: retention + lease.
    pub index: u64,
}

/// See the module documentation. Cloned stores share one writer.
pub(crate) struct LogWriter {
    conn: Connection,
    timeout: Duration,
    ttls: WriteTtls,
    /// The writer task's queue; started by the first write, restarted when the runtime
    /// that ran it is gone (tests run one runtime each).
    tx: Mutex<Option<mpsc::Sender<Msg>>>,
}

impl LogWriter {
    pub(crate) fn new(conn: Connection, timeout: Duration, ttls: WriteTtls) -> LogWriter {
        LogWriter {
            conn,
            timeout,
            ttls,
            tx: Mutex::new(None),
        }
    }

    fn sender(&self) -> mpsc::Sender<Msg> {
        let mut tx = self.tx.lock().unwrap_or_else(|p| p.into_inner());
        match &*tx {
            Some(s) if !s.is_closed() => s.clone(),
            _ => {
                let (s, rx) = mpsc::channel(QUEUE);
                tokio::spawn(run(self.conn.clone(), self.timeout, self.ttls, rx));
                *tx = Some(s.clone());
                s
            }
        }
    }

    /// Queues one claim's writes (waits only while the queue is full).
    pub(crate) async fn write(&self, w: LogWrite) {
        if self.sender().send(Msg::Write(w)).await.is_err() {
            tracing::warn!(
                "the delivery log's writer stopped; one claim's log entry was not written"
            );
        }
    }

    /// Returns once everything queued before it is written (or failed).
    pub(crate) async fn flush(&self) {
        let (done, wait) = oneshot::channel();
        if self.sender().send(Msg::Flush(done)).await.is_ok() {
            let _ = tokio::time::timeout(self.timeout * 2, wait).await;
        }
    }
}

async fn run(
    mut conn: Connection,
    timeout: Duration,
    ttls: WriteTtls,
    mut rx: mpsc::Receiver<Msg>,
) {
    let mut batch = Vec::with_capacity(BATCH);
    let mut failed_at: Option<tokio::time::Instant> = None;
    // A transaction per delivery keeps a hash's writes and its TTL together (a batch
    // cut by a connection reset cannot leave a hash without one); a Redis Cluster
    // routes commands by key, and `MULTI` has none, so there the writes go plain.
    let atomic = !matches!(conn, Connection::Cluster(_));
    loop {
        if rx.recv_many(&mut batch, BATCH).await == 0 {
            return;
        }
        let mut pipe = redis::pipe();
        let mut waiting = Vec::new();
        for msg in batch.drain(..) {
            match msg {
                Msg::Write(w) => add(&mut pipe, &w, ttls, atomic),
                Msg::Flush(done) => waiting.push(done),
            }
        }
        if !pipe.is_empty() {
            let sent = tokio::time::timeout(timeout, pipe.query_async::<()>(&mut conn)).await;
            let error = match sent {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(e.to_string()),
                Err(_) => Some("timed out".to_string()),
            };
            // One warning per 10 s at most: a Redis outage fails every batch.
            if let Some(error) = error
                && failed_at.is_none_or(|t| t.elapsed() > Duration::from_secs(10))
            {
                failed_at = Some(tokio::time::Instant::now());
                tracing::warn!(%error, "writing the delivery log failed; those deliveries' log entries are incomplete");
            }
        }
        for done in waiting {
            let _ = done.send(());
        }
    }
}

/// One claim's commands, replies ignored: the hash's in a transaction when `atomic`,
/// then the index's (another slot; an index left without a TTL by a cut batch gets
/// one from the next claim).
fn add(pipe: &mut redis::Pipeline, w: &LogWrite, ttls: WriteTtls, atomic: bool) {
    if atomic {
        pipe.cmd("MULTI").ignore();
    }
    match &w.kind {
        WriteKind::Claimed { fp_hex, kept } => {
            let hset = pipe
                .cmd("HSET")
                .arg(&w.hash)
                .arg("fp")
                .arg(fp_hex)
                .arg("last_seen")
                .arg(w.now);
            if let Some(k) = kept {
                hset.arg("req_method")
                    .arg(&k.method)
                    .arg("req_path")
                    .arg(&k.path)
                    .arg("req_headers")
                    .arg(k.headers.as_ref())
                    .arg("req_body")
                    .arg(k.body.as_ref());
            }
            hset.ignore();
            pipe.cmd("HSETNX")
                .arg(&w.hash)
                .arg("first_seen")
                .arg(w.now)
                .ignore();
            pipe.cmd("HINCRBY")
                .arg(&w.hash)
                .arg("attempts")
                .arg(1)
                .ignore();
            // NX: a completion that got here first set `retention`, which stands; a
            // claim that outlives the hash's lifetime is kept alive by renew.lua.
            pipe.cmd("PEXPIRE")
                .arg(&w.hash)
                .arg(ttls.hash)
                .arg("NX")
                .ignore();
        }
        WriteKind::Copy => {
            pipe.cmd("HINCRBY")
                .arg(&w.hash)
                .arg("duplicates")
                .arg(1)
                .ignore();
            pipe.cmd("HSET")
                .arg(&w.hash)
                .arg("last_seen")
                .arg(w.now)
                .ignore();
            pipe.cmd("PEXPIRE")
                .arg(&w.hash)
                .arg(ttls.fragment)
                .arg("NX")
                .ignore();
        }
    }
    if atomic {
        pipe.cmd("EXEC").ignore();
    }
    if let Some(index) = &w.index {
        pipe.cmd("ZADD").arg(index).arg(w.now).arg(&w.key).ignore();
        if matches!(w.kind, WriteKind::Copy) {
            // A copy moves a member it finds (a re-added one overshoots the cap by one
            // until the next claim trims); it gives the index a lifetime only when it
            // has none (it re-created it).
            pipe.cmd("PEXPIRE")
                .arg(index)
                .arg(ttls.index)
                .arg("NX")
                .ignore();
        } else {
            pipe.cmd("ZREMRANGEBYRANK")
                .arg(index)
                .arg(0)
                .arg(-(RECENT_PER_ROUTE as i64) - 1)
                .ignore();
            pipe.cmd("PEXPIRE").arg(index).arg(ttls.index).ignore();
        }
    }
}
