//! The delivery log's writes for plain claims, off the delivery's path: a claim's one
//! awaited command is the record's `SET … NX GET` (record.rs); what it means for the
//! log (attempts, duplicates, first and last seen, the fingerprint, the kept request,
//! the recent index) is queued here and written by one background task, as one
//! pipeline per batch of concurrent deliveries (no Lua, one write and one read per
//! batch instead of per delivery; on a Redis Cluster one small pipeline per slot, sent
//! at once). The recent index is written here only, the same on every deployment.
//!
//! The log hash holds no state a claim decides on, so the order between these writes
//! and a completion's script does not matter: counters are `HINCRBY`, `first_seen` is
//! `HSETNX`. A write that lands after an operator's forget re-creates a fragment of
//! the hash: `PEXPIRE … NX` gives it a lifetime, and a hash without `first_seen` is not
//! a delivery to the log's reads. Reads in this process (`flush`) first wait for what
//! was queued before them; another process sees the writes one batch later.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use redis::{ErrorKind, ServerErrorKind, Value};

use super::connection::{Connection, query_groups};
use super::{int_of, ms};
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
    /// The store's "a `redis://` server in cluster mode" flag (cluster_mode.rs).
    cluster_mode: Arc<AtomicBool>,
    /// How many members each recent index keeps (`store.recent_per_route`).
    cap: Arc<AtomicUsize>,
    /// The writer task's queue; started by the first write, restarted when the runtime
    /// that ran it is gone (tests run one runtime each).
    tx: Mutex<Option<mpsc::Sender<Msg>>>,
}

impl LogWriter {
    pub(crate) fn new(
        conn: Connection,
        timeout: Duration,
        cluster_mode: Arc<AtomicBool>,
    ) -> LogWriter {
        LogWriter {
            conn,
            timeout,
            cluster_mode,
            cap: Arc::new(AtomicUsize::new(RECENT_PER_ROUTE)),
            tx: Mutex::new(None),
        }
    }

    fn sender(&self) -> mpsc::Sender<Msg> {
        let mut tx = self.tx.lock().unwrap_or_else(|p| p.into_inner());
        match &*tx {
            Some(s) if !s.is_closed() => s.clone(),
            _ => {
                let (s, rx) = mpsc::channel(QUEUE);
                tokio::spawn(run(
                    self.conn.clone(),
                    self.timeout,
                    self.cluster_mode.clone(),
                    self.cap.clone(),
                    rx,
                ));
                *tx = Some(s.clone());
                s
            }
        }
    }

    /// Sets how many members each recent index keeps.
    pub(crate) fn set_cap(&self, cap: usize) {
        self.cap.store(cap.max(1), Ordering::Relaxed);
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
    conn: Connection,
    timeout: Duration,
    cluster_mode: Arc<AtomicBool>,
    cap: Arc<AtomicUsize>,
    mut rx: mpsc::Receiver<Msg>,
) {
    let mut batch = Vec::with_capacity(BATCH);
    let mut failed_at: Option<tokio::time::Instant> = None;
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
        if !writes.is_empty() {
            let written = tokio::time::timeout(
                timeout,
                write_batch(&conn, &writes, cap.load(Ordering::Relaxed), &cluster_mode),
            )
            .await
            .unwrap_or_else(|_| Err("timed out".to_string()));
            // One warning per 10 s at most: a Redis outage fails every batch.
            if let Err(error) = written
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

/// Writes one batch (see [`Plan`]): the hashes and indexes, then the rare fix-ups.
/// One transaction per batch keeps each hash's writes and its TTL together (a batch
/// cut by a connection reset cannot leave a hash without one); keys of many slots
/// cannot share one on a Redis Cluster or a server in cluster mode (`CROSSSLOT`,
/// noted on the way), so there each hash and each index is its own pipeline.
async fn write_batch(
    conn: &Connection,
    writes: &[LogWrite],
    cap: usize,
    cluster_mode: &AtomicBool,
) -> Result<(), String> {
    let plan = Plan::of(writes, cap);
    let mut replies = None;
    if !matches!(conn, Connection::Cluster(_)) && !cluster_mode.load(Ordering::Relaxed) {
        match plan
            .atomic()
            .query_async::<Vec<Value>>(&mut conn.clone())
            .await
        {
            Ok(r) => replies = Some(plan.split_atomic(r)),
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::CrossSlot) => {
                if !cluster_mode.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        "store.url names a Redis server in cluster mode: the delivery log is written without transactions"
                    );
                }
            }
            Err(e) => return Err(e.to_string()),
        }
    }
    let replies = match replies {
        Some(r) => r,
        None => query_groups(conn, plan.groups())
            .await
            .into_iter()
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.to_string())?,
    };
    let fixups = plan.fixups(writes, &replies);
    if fixups.is_empty() {
        return Ok(());
    }
    for r in query_groups(conn, fixups).await {
        r.map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// One batch's commands, in groups of one slot: each write's hash commands, then one
/// group per recent index: a `ZADD NX` per logged claim (scored by the claim's time;
/// an earlier claim of the same delivery keeps its place), trimmed and given its
/// lifetime once per batch (an index left without a TTL by a cut batch gets one from
/// the next claim). Copies do not touch the index: a delivery keeps its place, so a
/// listing's cursor neither skips nor repeats it.
///
/// The index is scored by when the delivery was first seen; a member left by an
/// earlier life of the same key (expired, its member not yet dropped) would keep the
/// old score under `NX`, so a claim that set the hash's `first_seen` (its `HSETNX`
/// answered 1) while its `ZADD NX` added nothing moves the member to its time in a
/// second, rare step ([`Plan::fixups`]).
struct Plan {
    /// Each write's hash commands (its `HSETNX first_seen` second, for a claim).
    hashes: Vec<redis::Pipeline>,
    /// Each index's commands: its members' `ZADD NX` first, then its upkeep.
    indexes: Vec<redis::Pipeline>,
    /// For each logged claim: its write, its index and its `ZADD`'s place there.
    members: Vec<(usize, usize, usize)>,
}

impl Plan {
    /// `cap`: how many members each index keeps.
    fn of(writes: &[LogWrite], cap: usize) -> Plan {
        let hashes = writes.iter().map(hash_commands).collect();
        // Each index's name and lifetime: one index per route, so its writes share
        // the route's lifetimes.
        let mut names: Vec<(&str, u64)> = Vec::new();
        let mut indexes: Vec<redis::Pipeline> = Vec::new();
        let mut members = Vec::new();
        for (i, w) in writes.iter().enumerate() {
            let (Some(index), WriteKind::Claimed { .. }) = (w.index.as_deref(), &w.kind) else {
                continue;
            };
            let at = names
                .iter()
                .position(|(n, _)| *n == index)
                .unwrap_or_else(|| {
                    names.push((index, w.ttls.index));
                    indexes.push(redis::pipe());
                    names.len() - 1
                });
            members.push((i, at, indexes[at].len()));
            indexes[at]
                .cmd("ZADD")
                .arg(index)
                .arg("NX")
                .arg(w.now)
                .arg(&w.key);
        }
        for ((name, ttl), pipe) in names.iter().zip(&mut indexes) {
            pipe.cmd("ZREMRANGEBYRANK")
                .arg(*name)
                .arg(0)
                .arg(-i64::try_from(cap).unwrap_or(i64::MAX - 1) - 1);
            pipe.cmd("PEXPIRE").arg(*name).arg(*ttl);
        }
        Plan {
            hashes,
            indexes,
            members,
        }
    }

    /// Every group as one pipeline: the hashes in one `MULTI`/`EXEC`, then the indexes.
    fn atomic(&self) -> redis::Pipeline {
        let mut pipe = redis::pipe();
        pipe.cmd("MULTI").ignore();
        for h in &self.hashes {
            for c in h.cmd_iter() {
                pipe.add_command(c.clone()).ignore();
            }
        }
        pipe.cmd("EXEC");
        for i in &self.indexes {
            for c in i.cmd_iter() {
                pipe.add_command(c.clone());
            }
        }
        pipe
    }

    /// The replies of [`Plan::atomic`] per group, as [`Plan::groups`] would give them.
    fn split_atomic(&self, replies: Vec<Value>) -> Vec<Vec<Value>> {
        let mut it = replies.into_iter();
        let mut exec = match it.next() {
            Some(Value::Array(v)) => v.into_iter(),
            _ => Vec::new().into_iter(),
        };
        let mut out: Vec<Vec<Value>> = self
            .hashes
            .iter()
            .map(|h| exec.by_ref().take(h.len()).collect())
            .collect();
        out.extend(
            self.indexes
                .iter()
                .map(|i| it.by_ref().take(i.len()).collect()),
        );
        out
    }

    /// The groups, one slot each: the hashes, then the indexes.
    fn groups(&self) -> Vec<redis::Pipeline> {
        self.hashes.iter().chain(&self.indexes).cloned().collect()
    }

    /// The `ZADD XX` moving each member an earlier life left behind to its claim's
    /// time, per index, from the batch's replies (per group, as [`Plan::groups`]).
    fn fixups(&self, writes: &[LogWrite], replies: &[Vec<Value>]) -> Vec<redis::Pipeline> {
        let mut out: Vec<(usize, redis::Pipeline)> = Vec::new();
        for &(w, at, place) in &self.members {
            let first = replies.get(w).and_then(|r| r.get(1)).and_then(int_of);
            let added = replies
                .get(self.hashes.len() + at)
                .and_then(|r| r.get(place))
                .and_then(int_of);
            if first != Some(1) || added != Some(0) {
                continue;
            }
            let (write, mut cmd) = (&writes[w], redis::cmd("ZADD"));
            cmd.arg(write.index.as_deref())
                .arg("XX")
                .arg(write.now)
                .arg(&write.key);
            match out.iter_mut().find(|(i, _)| *i == at) {
                Some((_, p)) => {
                    p.add_command(cmd);
                }
                None => {
                    let mut p = redis::pipe();
                    p.add_command(cmd);
                    out.push((at, p));
                }
            }
        }
        out.into_iter().map(|(_, p)| p).collect()
    }
}

/// One claim's writes to its log hash, in one slot (a claim's `HSETNX first_seen`
/// second: [`Plan::fixups`] reads its reply).
fn hash_commands(w: &LogWrite) -> redis::Pipeline {
    let ttls = w.ttls;
    let mut pipe = redis::pipe();
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
            pipe.cmd("HSETNX").arg(&w.hash).arg("first_seen").arg(w.now);
            pipe.cmd("HINCRBY").arg(&w.hash).arg("attempts").arg(1);
            // NX: a completion that got here first set `retention`, which stands; a
            // claim that outlives the hash's lifetime is kept alive by renew.lua.
            pipe.cmd("PEXPIRE").arg(&w.hash).arg(ttls.hash).arg("NX");
        }
        WriteKind::Copy => {
            pipe.cmd("HINCRBY").arg(&w.hash).arg("duplicates").arg(1);
            pipe.cmd("HSET").arg(&w.hash).arg("last_seen").arg(w.now);
            pipe.cmd("PEXPIRE")
                .arg(&w.hash)
                .arg(ttls.fragment)
                .arg("NX");
        }
    }
    pipe
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
    fn a_batch_is_one_transaction_then_each_index_and_copies_leave_it_alone() {
        let batch = [
            write("a", "k1", 10, true),
            write("b", "k2", 11, false),
            write("a", "k3", 12, true),
            write("b", "k4", 13, true),
        ];
        let plan = Plan::of(&batch, RECENT_PER_ROUTE);
        let w = words(&plan.atomic());
        assert_eq!(w.iter().filter(|c| *c == "MULTI").count(), 1, "{w:#?}");
        assert_eq!(w.iter().filter(|c| *c == "EXEC").count(), 1, "{w:#?}");
        let exec = w.iter().position(|c| c == "EXEC").unwrap();
        // Every hash write sits inside the one transaction.
        assert!(
            w[..exec]
                .iter()
                .any(|c| c.starts_with("HINCRBY h:b:k2 duplicates"))
        );
        // Only claims place members, each `NX` at its time; a copy moves none.
        assert_eq!(
            w[exec + 1..],
            [
                "ZADD i:a NX 10 k1",
                "ZADD i:a NX 12 k3",
                "ZREMRANGEBYRANK i:a 0 -10001",
                "PEXPIRE i:a 1100",
                // Each index lives as long as its own route's lifetimes say.
                "ZADD i:b NX 13 k4",
                "ZREMRANGEBYRANK i:b 0 -10001",
                "PEXPIRE i:b 2200",
            ]
        );
        // Per slot: four hashes, two indexes.
        assert_eq!(plan.groups().len(), 6);
    }

    #[test]
    fn a_member_an_earlier_life_left_is_moved_to_the_new_claim_only() {
        let batch = [write("a", "k1", 10, true), write("a", "k2", 12, true)];
        let plan = Plan::of(&batch, RECENT_PER_ROUTE);
        let hash = |first: i64| {
            vec![
                Value::Int(0),
                Value::Int(first),
                Value::Int(1),
                Value::Int(1),
            ]
        };
        // k1: a new hash (`HSETNX` 1) whose member was there (`ZADD NX` 0): moved.
        // k2: the hash was there (a claim after a release): it keeps its place.
        let replies = vec![
            hash(1),
            hash(0),
            vec![Value::Int(0), Value::Int(0), Value::Int(0), Value::Int(1)],
        ];
        let fix: Vec<String> = plan
            .fixups(&batch, &replies)
            .iter()
            .flat_map(words)
            .collect();
        assert_eq!(fix, ["ZADD i:a XX 10 k1"]);
        // The atomic pipeline's replies split the same way as the groups'.
        let exec = Value::Array(hash(1).into_iter().chain(hash(0)).collect());
        let split = plan.split_atomic(vec![
            exec,
            Value::Int(0),
            Value::Int(0),
            Value::Int(0),
            Value::Int(1),
        ]);
        assert_eq!(split, replies);
    }
}
