//! The delivery log's writes for plain claims, off the delivery's path. A first
//! delivery's log fields live in its claim record (record.rs: the claim's time and
//! attempt in `P`, the outcome, latency and statuses in `C`), so what is left here is
//! what no record carries: the route's recent index, the copies' counts, and the kept
//! request (`keep_payload`). They are queued here and written by one background task,
//! per batch of concurrent deliveries (no Lua): each delivery's copies summed into one
//! `HINCRBY duplicates n` and one `last_seen`, each route's new members in one
//! multi-member `ZADD NX`; on a Redis Cluster one small pipeline per slot, sent at
//! once. The recent index is written here only, the same on every deployment.
//!
//! The log hash holds no state a claim decides on, so the order between these writes
//! and the scripts does not matter: counters are `HINCRBY`, and the fields a script
//! moves from a record into the hash are `HSETNX`. A write that lands after an
//! operator's forget re-creates a fragment of the hash: `PEXPIRE … NX` gives it a
//! lifetime, and a hash without `first_seen` and without a record is not a delivery
//! to the log's reads. Reads in this process (`flush`) first wait for what was queued
//! before them; another process sees the writes one batch later.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use redis::{ErrorKind, Pipeline, ServerErrorKind, Value};

use super::connection::{Connection, query_groups};
use super::{bytes_of, int_of, ms};
use crate::store::Lifetimes;
use crate::store::log::{KeptRequest, RECENT_PER_ROUTE};

/// How many writes the queue holds before a claim waits for the writer.
const QUEUE: usize = 8192;
/// How many writes one batch carries at most (so the sums' map stays small).
const BATCH: usize = 256;

/// One claim's writes to the log.
pub(crate) struct LogWrite {
    pub route: Arc<str>,
    /// The delivery's key (the index's member).
    pub key: String,
    /// The claim's time (Unix ms): the member's score, a copy's `last_seen`.
    pub now: u64,
    /// The lifetimes of its route's keys.
    pub ttls: WriteTtls,
    pub kind: WriteKind,
}

pub(crate) enum WriteKind {
    /// A logged claim took the key: its member in the recent index; the request, when
    /// kept (with the fingerprint, hex).
    Claimed(Option<Box<(String, KeptRequest)>>),
    /// A copy answered from the record: one more duplicate.
    Copy,
}

/// One queue slot.
enum Msg {
    Write(LogWrite),
    Flush(oneshot::Sender<()>),
}

/// Lifetimes the writes give the hash and the index (ms), from the route's lifetimes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct WriteTtls {
    /// A hash a kept request creates: the longer of retention and lease.
    pub hash: u64,
    /// A copy's hash when it has none: retention.
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

/// The store's key names the writer needs (mod.rs builds the same).
#[derive(Clone)]
pub(crate) struct Names {
    pub prefix: Arc<str>,
}

impl Names {
    /// A delivery's log hash, `{prefix}:{<route>:<key>}`.
    pub(crate) fn hash(&self, route: &str, key: &str) -> String {
        let mut s = String::with_capacity(self.prefix.len() + route.len() + key.len() + 4);
        s.push_str(&self.prefix);
        s.push_str(":{");
        s.push_str(route);
        s.push(':');
        s.push_str(key);
        s.push('}');
        s
    }

    /// A route's recent index, `{prefix}:recent:{<route>}` (its own hash tag).
    pub(crate) fn index(&self, route: &str) -> String {
        let mut s = String::with_capacity(self.prefix.len() + route.len() + 11);
        s.push_str(&self.prefix);
        s.push_str(":recent:{");
        s.push_str(route);
        s.push('}');
        s
    }
}

/// See the module documentation. Cloned stores share one writer.
pub(crate) struct LogWriter {
    conn: Connection,
    timeout: Duration,
    names: Names,
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
        names: Names,
        cluster_mode: Arc<AtomicBool>,
    ) -> LogWriter {
        LogWriter {
            conn,
            timeout,
            names,
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
                let writer = Writer {
                    conn: self.conn.clone(),
                    timeout: self.timeout,
                    names: self.names.clone(),
                    cluster_mode: self.cluster_mode.clone(),
                    cap: self.cap.clone(),
                };
                tokio::spawn(writer.run(rx));
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

/// The writer task's state.
struct Writer {
    conn: Connection,
    timeout: Duration,
    names: Names,
    cluster_mode: Arc<AtomicBool>,
    cap: Arc<AtomicUsize>,
}

impl Writer {
    async fn run(self, mut rx: mpsc::Receiver<Msg>) {
        let mut batch = Vec::with_capacity(BATCH);
        let mut failed_at: Option<tokio::time::Instant> = None;
        loop {
            if rx.recv_many(&mut batch, BATCH).await == 0 {
                return;
            }
            let mut waiting = Vec::new();
            let mut sums = Sums::default();
            for msg in batch.drain(..) {
                match msg {
                    Msg::Write(w) => sums.add(w),
                    Msg::Flush(done) => waiting.push(done),
                }
            }
            if !sums.is_empty() {
                let written = tokio::time::timeout(self.timeout, self.write(&sums))
                    .await
                    .unwrap_or_else(|_| Err("timed out".to_string()));
                // One warning per 10 s at most: a Redis outage fails every batch.
                if let Err(error) = written
                    && failed_at.is_none_or(|t| t.elapsed() > Duration::from_secs(10))
                {
                    failed_at = Some(tokio::time::Instant::now());
                    tracing::warn!(%error, "writing the delivery log failed; those deliveries' copy counts or index entries are missing");
                }
            }
            for done in waiting {
                let _ = done.send(());
            }
        }
    }

    /// Writes one batch (see [`Sums::plan`]), then the rare fix-ups. One transaction
    /// per batch keeps each hash's writes and its TTL together (a batch cut by a
    /// connection reset cannot leave a hash without one); keys of many slots cannot
    /// share one on a Redis Cluster or a server in cluster mode (`CROSSSLOT`, noted on
    /// the way), so there each hash and each index is its own pipeline.
    async fn write(&self, sums: &Sums) -> Result<(), String> {
        let cap = self.cap.load(Ordering::Relaxed);
        let conn = &self.conn;
        let mut scores = None;
        if !matches!(conn, Connection::Cluster(_)) && !self.cluster_mode.load(Ordering::Relaxed) {
            let plan = sums.plan(&self.names, cap, true);
            let Some(one) = plan.groups.first() else {
                return Ok(());
            };
            match one.query_async::<Vec<Value>>(&mut conn.clone()).await {
                // [EXEC (with hash writes), then each route's ZMSCORE, ZADD, trim, PEXPIRE]
                Ok(r) => {
                    let exec = usize::from(sums.has_hash_writes());
                    scores = Some(r.into_iter().skip(exec).step_by(4).collect());
                }
                Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::CrossSlot) => {
                    if !self.cluster_mode.swap(true, Ordering::Relaxed) {
                        tracing::warn!(
                            "store.url names a Redis server in cluster mode: the delivery log is written without transactions"
                        );
                    }
                }
                Err(e) => return Err(e.to_string()),
            }
        }
        let scores: Vec<Value> = match scores {
            Some(s) => s,
            None => {
                let plan = sums.plan(&self.names, cap, false);
                let replies = query_groups(conn, plan.groups)
                    .await
                    .into_iter()
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| e.to_string())?;
                let indexes = replies.len() - sums.routes.len();
                replies
                    .into_iter()
                    .skip(indexes)
                    .map(|mut r| {
                        if r.is_empty() {
                            Value::Nil
                        } else {
                            r.swap_remove(0)
                        }
                    })
                    .collect()
            }
        };
        self.fix_earlier_lives(sums, &scores).await
    }

    /// The index is scored by when a delivery was first seen; a member left by an
    /// earlier life of the same key (expired, its member not yet dropped) would keep
    /// the old score under `NX`. A claim whose member was already there (`ZMSCORE`,
    /// read before the `ZADD`) is a re-claim after a release, whose hash holds
    /// `first_seen` (release.lua moves it there), or a new life, whose member is moved
    /// to its time: a second, rare step.
    async fn fix_earlier_lives(&self, sums: &Sums, scores: &[Value]) -> Result<(), String> {
        let mut seen = Vec::new();
        for (route, scores) in sums.routes.iter().zip(scores) {
            let Value::Array(scores) = scores else {
                continue;
            };
            for ((key, now), score) in route.members.iter().zip(scores) {
                if !matches!(score, Value::Nil) && score_of(score) != Some(*now) {
                    seen.push((route, key, *now));
                }
            }
        }
        if seen.is_empty() {
            return Ok(());
        }
        let checks = seen
            .iter()
            .map(|(route, key, _)| {
                let mut p = redis::pipe();
                p.cmd("HEXISTS")
                    .arg(self.names.hash(&route.route, key))
                    .arg("first_seen");
                p
            })
            .collect();
        let mut moves: Vec<Pipeline> = Vec::new();
        let mut at: Vec<&str> = Vec::new();
        for ((route, key, now), r) in seen.iter().zip(query_groups(&self.conn, checks).await) {
            let r = r.map_err(|e| e.to_string())?;
            if r.first().and_then(int_of) != Some(0) {
                continue;
            }
            let i = at
                .iter()
                .position(|r| *r == &*route.route)
                .unwrap_or_else(|| {
                    at.push(&route.route);
                    moves.push(redis::pipe());
                    at.len() - 1
                });
            moves[i]
                .cmd("ZADD")
                .arg(self.names.index(&route.route))
                .arg("XX")
                .arg(*now)
                .arg(*key);
        }
        for r in query_groups(&self.conn, moves).await {
            r.map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

fn score_of(v: &Value) -> Option<u64> {
    match v {
        Value::Double(d) => Some(*d as u64),
        other => std::str::from_utf8(bytes_of(other)?)
            .ok()?
            .parse::<f64>()
            .ok()
            .map(|d| d as u64),
    }
}

/// One route's new members in a batch.
struct RouteMembers {
    route: Arc<str>,
    index_ttl: u64,
    /// (key, first seen), in arrival order; a key once (its first claim).
    members: Vec<(String, u64)>,
}

/// A delivery's copies in a batch, summed.
struct Copies {
    n: u64,
    last_seen: u64,
    fragment_ttl: u64,
}

/// A kept request to write: route, key, the hash's lifetime, fingerprint and request.
type Kept = (Arc<str>, String, u64, Box<(String, KeptRequest)>);

/// One batch, summed: what each delivery and each route gets.
#[derive(Default)]
struct Sums {
    copies: HashMap<(Arc<str>, String), Copies>,
    kept: Vec<Kept>,
    routes: Vec<RouteMembers>,
}

impl Sums {
    fn add(&mut self, w: LogWrite) {
        match w.kind {
            WriteKind::Copy => {
                let c = self.copies.entry((w.route, w.key)).or_insert(Copies {
                    n: 0,
                    last_seen: 0,
                    fragment_ttl: w.ttls.fragment,
                });
                c.n += 1;
                c.last_seen = c.last_seen.max(w.now);
            }
            WriteKind::Claimed(kept) => {
                let at = match self.routes.iter().position(|r| r.route == w.route) {
                    Some(at) => at,
                    None => {
                        self.routes.push(RouteMembers {
                            route: w.route.clone(),
                            index_ttl: w.ttls.index,
                            members: Vec::new(),
                        });
                        self.routes.len() - 1
                    }
                };
                if let Some(k) = kept {
                    self.kept
                        .push((w.route.clone(), w.key.clone(), w.ttls.hash, k));
                }
                let members = &mut self.routes[at].members;
                if !members.iter().any(|(k, _)| *k == w.key) {
                    members.push((w.key, w.now));
                }
            }
        }
    }

    /// Whether the batch writes any log hash (copies, kept requests).
    fn has_hash_writes(&self) -> bool {
        !(self.copies.is_empty() && self.kept.is_empty())
    }

    fn is_empty(&self) -> bool {
        self.copies.is_empty() && self.kept.is_empty() && self.routes.is_empty()
    }

    /// The batch's commands, built once. `atomic`: one pipeline, the hashes in one
    /// `MULTI`/`EXEC`, then each index; otherwise one pipeline per slot: each hash,
    /// then each index. Each index: `ZMSCORE` of its new members (for
    /// [`Writer::fix_earlier_lives`]), one `ZADD NX` of them all (scored by each
    /// claim's time; an earlier claim of the same delivery keeps its place), trimmed
    /// and given its lifetime. Copies do not touch the index: a delivery keeps its
    /// place, so a listing's cursor neither skips nor repeats it.
    fn plan(&self, names: &Names, cap: usize, atomic: bool) -> Plan {
        let mut groups = Vec::new();
        let mut one = redis::pipe();
        if atomic && self.has_hash_writes() {
            one.cmd("MULTI").ignore();
        }
        let mut hashes: Vec<Pipeline> = Vec::new();
        for ((route, key), c) in &self.copies {
            let p = slot(atomic, &mut one, &mut hashes);
            let hash = names.hash(route, key);
            p.cmd("HINCRBY").arg(&hash).arg("duplicates").arg(c.n);
            quiet(atomic, p);
            p.cmd("HSET").arg(&hash).arg("last_seen").arg(c.last_seen);
            quiet(atomic, p);
            p.cmd("PEXPIRE").arg(&hash).arg(c.fragment_ttl).arg("NX");
            quiet(atomic, p);
        }
        for (route, key, ttl, kept) in &self.kept {
            let p = slot(atomic, &mut one, &mut hashes);
            let (fp_hex, k) = &**kept;
            let hash = names.hash(route, key);
            p.cmd("HSET")
                .arg(&hash)
                .arg("fp")
                .arg(fp_hex)
                .arg("req_method")
                .arg(&k.method)
                .arg("req_path")
                .arg(&k.path)
                .arg("req_headers")
                .arg(k.headers.as_ref())
                .arg("req_body")
                .arg(k.body.as_ref());
            quiet(atomic, p);
            // NX: a script that got here first set its own lifetime, which stands.
            p.cmd("PEXPIRE").arg(&hash).arg(*ttl).arg("NX");
            quiet(atomic, p);
        }
        if atomic && self.has_hash_writes() {
            one.cmd("EXEC");
        }
        groups.extend(hashes);
        for r in &self.routes {
            let p = slot(atomic, &mut one, &mut groups);
            let index = names.index(&r.route);
            p.cmd("ZMSCORE").arg(&index);
            for (key, _) in &r.members {
                p.arg(key);
            }
            p.cmd("ZADD").arg(&index).arg("NX");
            for (key, now) in &r.members {
                p.arg(*now).arg(key);
            }
            p.cmd("ZREMRANGEBYRANK")
                .arg(&index)
                .arg(0)
                .arg(-i64::try_from(cap).unwrap_or(i64::MAX - 1) - 1);
            p.cmd("PEXPIRE").arg(&index).arg(r.index_ttl);
        }
        if atomic {
            groups.insert(0, one);
        }
        Plan { groups }
    }
}

/// Inside the one pipeline's `MULTI`, a command's reply (`QUEUED`) is dropped: EXEC's
/// array stands for them all.
fn quiet(atomic: bool, p: &mut Pipeline) {
    if atomic {
        p.ignore();
    }
}

/// Where a group's commands go: the one pipeline, or a new one of its own.
fn slot<'a>(
    atomic: bool,
    one: &'a mut Pipeline,
    groups: &'a mut Vec<Pipeline>,
) -> &'a mut Pipeline {
    if atomic {
        return one;
    }
    groups.push(redis::pipe());
    let last = groups.len() - 1;
    &mut groups[last]
}

/// One batch's pipelines (see [`Sums::plan`]).
struct Plan {
    groups: Vec<Pipeline>,
}

#[cfg(test)]
mod tests;
