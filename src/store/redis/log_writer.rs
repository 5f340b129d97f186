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
use super::ms;
use crate::store::Lifetimes;
use crate::store::log::{KeptRequest, RECENT_PER_ROUTE};

/// How many writes the queue holds before a claim waits for the writer.
const QUEUE: usize = 8192;
/// How many writes one pipeline carries at most.
const BATCH: usize = 256;

/// One claim's writes to the log.
pub(crate) struct LogWrite {
    /// The lifetimes of its route's keys.
    pub ttls: WriteTtls,
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

/// Lifetimes the writes give the hash and the index (ms), from the route's lifetimes.
#[derive(Clone, Copy)]
pub(crate) struct WriteTtls {
    /// A new hash of a claim: the longer of retention and lease.
    pub hash: u64,
    /// A copy's hash when it has none (a fragment after a forget): retention.
    pub fragment: u64,
    /// The recent index: retention + lease.
    pub index: u64,
}

impl WriteTtls {
    /// The lifetimes the writes of a route with lifetimes `l` give.
    pub(crate) fn of(l: Lifetimes) -> WriteTtls {
        WriteTtls {
            hash: ms(l.retention.max(l.lease)),
            fragment: ms(l.retention),
            index: ms(l.retention.saturating_add(l.lease)),
        }
    }
}

/// See the module documentation. Cloned stores share one writer.
pub(crate) struct LogWriter {
    conn: Connection,
    timeout: Duration,
    /// The writer task's queue; started by the first write, restarted when the runtime
    /// that ran it is gone (tests run one runtime each).
    tx: Mutex<Option<mpsc::Sender<Msg>>>,
}

impl LogWriter {
    pub(crate) fn new(conn: Connection, timeout: Duration) -> LogWriter {
        LogWriter {
            conn,
            timeout,
            tx: Mutex::new(None),
        }
    }

    fn sender(&self) -> mpsc::Sender<Msg> {
        let mut tx = self.tx.lock().unwrap_or_else(|p| p.into_inner());
        match &*tx {
            Some(s) if !s.is_closed() => s.clone(),
            _ => {
                let (s, rx) = mpsc::channel(QUEUE);
                tokio::spawn(run(self.conn.clone(), self.timeout, rx));
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

async fn run(mut conn: Connection, timeout: Duration, mut rx: mpsc::Receiver<Msg>) {
    let mut batch = Vec::with_capacity(BATCH);
    let mut failed_at: Option<tokio::time::Instant> = None;
    // One transaction per batch keeps each hash's writes and its TTL together (a batch
    // cut by a connection reset cannot leave a hash without one); a Redis Cluster
    // routes commands by key, and `MULTI` has none, so there the writes go plain.
    let atomic = !matches!(conn, Connection::Cluster(_));
    loop {
        if rx.recv_many(&mut batch, BATCH).await == 0 {
            return;
        }
        let mut waiting = Vec::new();
        let mut writes = Vec::with_capacity(batch.len());
        for msg in batch.drain(..) {
            match msg {
                Msg::Write(w) => writes.push(w),
                Msg::Flush(done) => waiting.push(done),
            }
        }
        let pipe = batch_pipeline(&writes, atomic);
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

/// One batch's commands, replies ignored: every hash's writes in one transaction when
/// `atomic` (one `MULTI`/`EXEC` per batch, not per delivery), then one `ZADD` of all
/// the batch's members per recent index, trimmed and given its lifetime once (an
/// index left without a TTL by a cut batch gets one from the next claim). The index's
/// final state is the same as with a `ZADD` per delivery: a member named twice keeps
/// its later score, and the cap is applied after the last one.
fn batch_pipeline(writes: &[LogWrite], atomic: bool) -> redis::Pipeline {
    let mut pipe = redis::pipe();
    if writes.is_empty() {
        return pipe;
    }
    if atomic {
        pipe.cmd("MULTI").ignore();
    }
    for w in writes {
        add_hash(&mut pipe, w);
    }
    if atomic {
        pipe.cmd("EXEC").ignore();
    }
    // Indexes in the order their routes first appear in the batch.
    let mut indexes: Vec<(&str, redis::Cmd, bool, u64)> = Vec::new();
    for w in writes {
        let Some(index) = w.index.as_deref() else {
            continue;
        };
        let at = match indexes.iter().position(|(i, _, _, _)| *i == index) {
            Some(at) => at,
            None => {
                let mut zadd = redis::cmd("ZADD");
                zadd.arg(index);
                // One index per route, so its writes share the route's lifetimes.
                indexes.push((index, zadd, false, w.ttls.index));
                indexes.len() - 1
            }
        };
        let (_, zadd, claimed, _) = &mut indexes[at];
        zadd.arg(w.now).arg(&w.key);
        *claimed |= matches!(w.kind, WriteKind::Claimed { .. });
    }
    for (index, zadd, claimed, ttl) in indexes {
        pipe.add_command(zadd).ignore();
        if claimed {
            pipe.cmd("ZREMRANGEBYRANK")
                .arg(index)
                .arg(0)
                .arg(-(RECENT_PER_ROUTE as i64) - 1)
                .ignore();
            pipe.cmd("PEXPIRE").arg(index).arg(ttl).ignore();
        } else {
            // Only copies: they move members they find (a re-added one overshoots the
            // cap by one until the next claim trims), and give the index a lifetime
            // only when it has none (they re-created it).
            pipe.cmd("PEXPIRE").arg(index).arg(ttl).arg("NX").ignore();
        }
    }
    pipe
}

/// One claim's writes to its log hash.
fn add_hash(pipe: &mut redis::Pipeline, w: &LogWrite) {
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
                .arg(w.ttls.hash)
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
                .arg(w.ttls.fragment)
                .arg("NX")
                .ignore();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTLS: WriteTtls = WriteTtls {
        hash: 1000,
        fragment: 900,
        index: 1100,
    };
    /// Route `b`'s: a longer retention than the others'.
    const TTLS_B: WriteTtls = WriteTtls {
        hash: 2000,
        fragment: 1900,
        index: 2200,
    };

    fn write(route: &str, key: &str, now: u64, claimed: bool) -> LogWrite {
        LogWrite {
            ttls: if route == "b" { TTLS_B } else { TTLS },
            hash: format!("h:{route}:{key}"),
            index: Some(format!("i:{route}")),
            key: key.to_string(),
            now,
            kind: if claimed {
                WriteKind::Claimed {
                    fp_hex: "ab".into(),
                    kept: None,
                }
            } else {
                WriteKind::Copy
            },
        }
    }

    /// Each command as its words, for comparing.
    fn words(pipe: &redis::Pipeline) -> Vec<String> {
        pipe.cmd_iter()
            .map(|c| {
                c.args_iter()
                    .map(|a| match a {
                        redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
                        _ => "<other>".into(),
                    })
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect()
    }

    #[test]
    fn a_batch_is_one_transaction_and_one_zadd_per_index_with_its_routes_lifetime() {
        let batch = [
            write("a", "k1", 10, true),
            write("b", "k2", 11, false),
            write("a", "k3", 12, true),
        ];
        let w = words(&batch_pipeline(&batch, true));
        assert_eq!(w.iter().filter(|c| *c == "MULTI").count(), 1, "{w:#?}");
        assert_eq!(w.iter().filter(|c| *c == "EXEC").count(), 1, "{w:#?}");
        let exec = w.iter().position(|c| c == "EXEC").unwrap();
        // Every hash write sits inside the one transaction.
        assert!(
            w[..exec]
                .iter()
                .any(|c| c.starts_with("HINCRBY h:b:k2 duplicates"))
        );
        // Each hash lives its own route's retention.
        assert!(
            w[..exec].iter().any(|c| c == "PEXPIRE h:a:k1 1000 NX"),
            "{w:#?}"
        );
        assert!(
            w[..exec].iter().any(|c| c == "PEXPIRE h:b:k2 1900 NX"),
            "{w:#?}"
        );
        assert_eq!(
            w[exec + 1..],
            [
                "ZADD i:a 10 k1 12 k3",
                "ZREMRANGEBYRANK i:a 0 -10001",
                "PEXPIRE i:a 1100",
                "ZADD i:b 11 k2",
                "PEXPIRE i:b 2200 NX",
            ]
        );
    }

    #[test]
    fn on_a_cluster_there_is_no_transaction() {
        let w = words(&batch_pipeline(&[write("a", "k1", 10, true)], false));
        assert!(!w.iter().any(|c| c == "MULTI" || c == "EXEC"), "{w:#?}");
        assert!(batch_pipeline(&[], true).is_empty());
    }
}
