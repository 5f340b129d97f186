//! The Redis store: the claim record (`record`), claimed and read by one plain
//! `SET … NX PX … GET` per first delivery or copy; the completion, release, renewal,
//! an operator's replay and the queue's transitions are Lua scripts run by SHA (one
//! round trip each; on `NOSCRIPT` the script is sent in full once, to the node that
//! owns the key, which caches it), because they must check the owner's token first.
//! A first delivery's completion is the one-key compare-and-set complete_owner.lua;
//! the full complete.lua runs only when that answers 0 (lock holders, stale owners:
//! docs/reliability.md, "Fencing").
//!
//! Keys: `{prefix}:{<route>:<key>}` (the delivery log's hash, for what the record does
//! not carry: log.rs), `…:claim` (the claim record) and `…:lock` (the lock of an
//! operator's replay or a queue worker: a claim that leaves the record in place). The braces are a Redis Cluster hash tag, so the
//! keys of a delivery share one slot and every script is single-slot: in a cluster,
//! commands and scripts are routed by their first key.
//!
//! The same commands run over every deployment `store.url` can name (one server, a
//! Redis Cluster, a Sentinel-managed master): see [`Connection`]. A connection pool
//! would add a `PING` per checkout and nothing else here.
//!
//! Replication: Redis replicates asynchronously, so a claim or completion acknowledged
//! by a master that dies a moment later can be missing on the replica that takes over.
//! With `min_replicas_ack = N`, claim and complete are pipelined with `WAIT N timeout`
//! on the same connection (so the same node, in one round trip; in a cluster the
//! pipeline is routed explicitly to the master of the script's slot), and count only
//! when N replicas confirmed them; otherwise both are a store error: the claim's lock
//! is released in the background, and the completion is answered 503, never 2xx (see
//! `Store::confirms_completions`). A copy answered from a completed record confirms it
//! on the replicas first (`confirm`).

use std::time::Duration;

use redis::{Cmd, ErrorKind, RedisResult, Script, ServerErrorKind, Value};

use connection::Connection;

/// Claims: the plain one (no Lua) and an operator's replay.
mod claim;
/// A `redis://` server in cluster mode.
mod cluster_mode;
/// Copies answered from a completed record, confirmed on the replicas first.
mod confirm;
pub mod connection;
/// Operators' bulk jobs (`store::jobs`).
mod jobs;
/// The route's pacing state (`store::pacing`).
mod pacing;
mod queue;
/// The claim record's layouts.
mod record;
pub mod sentinel;
mod tcp;
pub use queue::RedisQueue;
/// The delivery log: extra arguments to the same scripts, and the reads.
mod log;
/// The delivery log's writes for plain claims, batched off the delivery's path.
mod log_writer;
use super::log::{ClaimLog, Settled};
use super::{
    Claim, DeliveryKey, RouteLifetimes, Store, StoreError, StoredResponse, Token, unix_millis,
};
use crate::config::topology::Topology;
use crate::config::{Config, StoreUrl};
use crate::providers::Fingerprint;
use log_writer::LogWriter;

/// A Lua script: its source (sent once per node on `NOSCRIPT`) and its SHA.
pub(crate) struct ScriptDef {
    sha: String,
    source: &'static str,
}

impl ScriptDef {
    pub(crate) fn new(source: &'static str) -> ScriptDef {
        ScriptDef {
            sha: Script::new(source).get_hash().to_string(),
            source,
        }
    }
}

struct Scripts {
    replay: ScriptDef,
    /// The one-key completion of a `P` record's owner (the common case).
    complete_owner: ScriptDef,
    /// The full completion: lock holders, and what complete_owner refused.
    complete: ScriptDef,
    complete_unowned: ScriptDef,
    release: ScriptDef,
    renew: ScriptDef,
}

/// Who completes a delivery: the owner of its claim record (a first delivery, an
/// operator's replay of a released key), or a lock holder (a queue worker, whose
/// record and log hash live `keep`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Holder {
    Record,
    Lock { keep: Duration },
}

/// How many replicas must confirm a claim or completion, and how long to wait for them.
#[derive(Debug, Clone, Copy)]
pub struct ReplicaAcks {
    pub replicas: u32,
    pub timeout: Duration,
}

/// See the module documentation.
#[derive(Clone)]
pub struct RedisStore {
    conn: Connection,
    prefix: std::sync::Arc<str>,
    lifetimes: RouteLifetimes,
    timeout: Duration,
    acks: Option<ReplicaAcks>,
    scripts: std::sync::Arc<Scripts>,
    /// The one server of a `redis://` URL runs in cluster mode (see `cluster_mode`).
    cluster_mode: std::sync::Arc<std::sync::atomic::AtomicBool>,
    log_writer: std::sync::Arc<LogWriter>,
}

/// The keys of one delivery (one hash tag, so one slot).
pub(crate) struct Keys {
    /// The delivery log's hash.
    pub log: String,
    /// The claim record (`record`).
    pub record: String,
    /// The lock of a replay or a queue worker.
    pub lock: String,
}

/// One script call: `EVALSHA sha nkeys keys… args…`, built once into one buffer as it
/// is sent (no allocation per argument, no copy per call); the script's source
/// replaces the SHA only after a `NOSCRIPT`.
pub(crate) struct Call<'a> {
    script: &'a ScriptDef,
    /// The first key, which routes the call on a Redis Cluster.
    first_key: &'a str,
    cmd: Cmd,
}

impl<'a> Call<'a> {
    pub(crate) fn new(script: &'a ScriptDef, keys: &[&'a str]) -> Call<'a> {
        Call::with_last_key(script, keys, None)
    }

    /// `keys` and an optional last key (a queue script's order list), if there is one.
    pub(crate) fn with_last_key(
        script: &'a ScriptDef,
        keys: &[&'a str],
        last: Option<&'a str>,
    ) -> Call<'a> {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(&script.sha)
            .arg(keys.len() + usize::from(last.is_some()))
            .arg(keys);
        if let Some(k) = last {
            cmd.arg(k);
        }
        Call {
            script,
            first_key: keys.first().or(last.as_ref()).copied().unwrap_or_default(),
            cmd,
        }
    }

    pub(crate) fn arg(mut self, v: impl redis::ToRedisArgs) -> Self {
        self.cmd.arg(v);
        self
    }

    /// `EVALSHA sha …` as built, or `EVAL source …` after a `NOSCRIPT` (rare: once per
    /// script per node).
    fn command(&self, by_sha: bool) -> std::borrow::Cow<'_, Cmd> {
        if by_sha {
            return std::borrow::Cow::Borrowed(&self.cmd);
        }
        let mut c = redis::cmd("EVAL");
        c.arg(self.script.source);
        for a in self.cmd.args_iter().skip(2) {
            if let redis::Arg::Simple(b) = a {
                c.arg(b);
            }
        }
        std::borrow::Cow::Owned(c)
    }
}

impl RedisStore {
    /// Prepares the store without waiting for Redis: the sidecar starts (and reports
    /// not ready) while Redis is down, and connects when it comes. `url` may name one
    /// server, a Redis Cluster or a Sentinel-managed master (see `config::topology`).
    pub fn new(
        url: &str,
        prefix: &str,
        lifetimes: impl Into<RouteLifetimes>,
        timeout: Duration,
    ) -> Result<Self, StoreError> {
        let lifetimes = lifetimes.into();
        let topology =
            Topology::parse(url).map_err(|e| StoreError::Unavailable(format!("store.url {e}")))?;
        let conn = Connection::new(&topology, timeout)
            .map_err(|e| StoreError::Unavailable(e.to_string()))?;
        let cluster_mode: std::sync::Arc<std::sync::atomic::AtomicBool> = Default::default();
        let names = log_writer::Names {
            prefix: prefix.into(),
        };
        let log_writer = std::sync::Arc::new(LogWriter::new(
            conn.clone(),
            timeout,
            names.clone(),
            cluster_mode.clone(),
        ));
        Ok(RedisStore {
            log_writer,
            conn,
            prefix: names.prefix,
            lifetimes,
            timeout,
            acks: None,
            cluster_mode,
            scripts: std::sync::Arc::new(Scripts {
                replay: ScriptDef::new(include_str!("scripts/replay.lua")),
                complete_owner: ScriptDef::new(include_str!("scripts/complete_owner.lua")),
                complete: ScriptDef::new(include_str!("scripts/complete.lua")),
                complete_unowned: ScriptDef::new(include_str!("scripts/complete_unowned.lua")),
                release: ScriptDef::new(include_str!("scripts/release.lua")),
                renew: ScriptDef::new(include_str!("scripts/renew.lua")),
            }),
        })
    }

    /// The store `[store]` names, built one way for the sidecar and for the operator
    /// commands, so that an operator's action is bound by what binds a delivery
    /// (`min_replicas_ack`, the prefix, the timeout, the lifetimes).
    pub fn from_config(config: &Config) -> Result<Self, StoreError> {
        let StoreUrl::Redis(url) = &config.store.url else {
            return Err(StoreError::Unavailable(
                "store.url names the in-memory store, not Redis".to_string(),
            ));
        };
        Ok(RedisStore::new(
            url,
            &config.store.key_prefix,
            RouteLifetimes::from_config(config),
            config.store.timeout,
        )?
        .with_replica_acks(
            config.store.min_replicas_ack,
            config.store.replicas_ack_timeout,
        )
        .with_recent_per_route(config.store.recent_per_route))
    }

    /// Sets how many deliveries each route's recent index holds.
    pub fn with_recent_per_route(self, cap: usize) -> Self {
        self.log_writer.set_cap(cap);
        self
    }

    /// Makes claims and completions count only once `replicas` replicas confirmed them
    /// within `timeout` (`WAIT`); 0 replicas turns it off.
    pub fn with_replica_acks(mut self, replicas: u32, timeout: Duration) -> Self {
        self.acks = (replicas > 0).then_some(ReplicaAcks { replicas, timeout });
        self
    }

    /// The delivery log hash's key; the claim record is this plus `:claim`, the lock
    /// this plus `:lock`.
    pub fn state_key(&self, key: &DeliveryKey) -> String {
        let mut s = String::with_capacity(self.prefix.len() + key.route.len() + key.key.len() + 10);
        s.push_str(&self.prefix);
        s.push_str(":{");
        s.push_str(&key.route);
        s.push(':');
        s.push_str(&key.key);
        s.push('}');
        s
    }

    /// The claim record's key alone (one allocation: the hot paths need no other).
    pub(crate) fn record_key(&self, key: &DeliveryKey) -> String {
        let mut s = self.state_key(key);
        s.push_str(":claim");
        s
    }

    pub(crate) fn keys(&self, key: &DeliveryKey) -> Keys {
        let log = self.state_key(key);
        let with = |suffix: &str| {
            let mut s = String::with_capacity(log.len() + suffix.len());
            s.push_str(&log);
            s.push_str(suffix);
            s
        };
        Keys {
            record: with(":claim"),
            lock: with(":lock"),
            log,
        }
    }

    /// Records a completion whose record (and log hash) lives `keep`: `retention` for a
    /// provider's delivery, longer for a queued one (`QueueBackend::complete`). A
    /// claim's owner (`holder`) completes with the one-key script, which writes the
    /// `C` record; a lock holder, or an owner that script refused, with the full
    /// script (docs/reliability.md, "Fencing").
    pub(crate) async fn complete_for(
        &self,
        key: &DeliveryKey,
        token: Token,
        response: &StoredResponse,
        settled: Option<&Settled>,
        holder: Holder,
    ) -> Result<bool, StoreError> {
        let lifetimes = self.lifetimes.of(&key.route);
        if holder == Holder::Record {
            let record_key = self.record_key(key);
            let tail = record::OwnedTail {
                first_seen: record::time_of(token),
                now: unix_millis(),
                settled,
                response,
            };
            let call = Call::new(&self.scripts.complete_owner, &[&record_key])
                .arg(&record::owner_prefix(&record::token_hex(token))[..])
                .arg(tail)
                .arg(ms(lifetimes.retention));
            let (reply, acked) = self.eval(&call, true).await?;
            if int_of(&reply) == Some(1) {
                if let Some(e) = self.under_replicated("completion", acked) {
                    return Err(e);
                }
                return Ok(true);
            }
        }
        let keep = match holder {
            Holder::Lock { keep } => keep,
            Holder::Record => lifetimes.retention,
        };
        let claim = token.to_hex();
        self.run_completion(&self.scripts.complete, key, claim, response, settled, keep)
            .await
    }

    /// Runs a completion script (complete.lua, or complete_unowned.lua with the
    /// fingerprint for the owner's token), pipelined with `WAIT` when replica acks are
    /// on: whether it recorded the answer, counted only once the replicas confirmed it.
    /// The scripts leave the recent index alone (see complete.lua).
    async fn run_completion(
        &self,
        script: &ScriptDef,
        key: &DeliveryKey,
        claim: String,
        response: &StoredResponse,
        settled: Option<&Settled>,
        keep: Duration,
    ) -> Result<bool, StoreError> {
        let k = self.keys(key);
        let mut call = Call::new(script, &[&k.record, &k.lock, &k.log])
            .arg(claim)
            .arg(record::completed_tail(response))
            .arg(response.status)
            .arg(unix_millis())
            .arg(ms(keep));
        if let Some(settled) = settled {
            call = self.complete_log_args(call, settled);
        }
        let (reply, acked) = self.eval(&call, true).await?;
        // 1: recorded; 2 (complete_unowned.lua): the same completion already held.
        let recorded = matches!(int_of(&reply), Some(1 | 2));
        if recorded && let Some(e) = self.under_replicated("completion", acked) {
            return Err(e);
        }
        Ok(recorded)
    }

    /// Waits until the log writes queued before this call are written (the log's reads
    /// in this process see them).
    pub(crate) async fn flush_log(&self) {
        self.log_writer.flush().await;
    }

    /// Runs one store operation within the store timeout.
    pub(crate) async fn bounded<T>(
        &self,
        op: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.timeout, op).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) if e.is_timeout() => Err(StoreError::Timeout),
            Ok(Err(e)) => Err(StoreError::Unavailable(e.to_string())),
            Err(_) => Err(StoreError::Timeout),
        }
    }

    /// Runs one script call (one round trip), pipelined with `WAIT` when `replicated`
    /// and replica acks are on; returns the script's reply and the replicas that
    /// confirmed it.
    pub(crate) async fn eval(
        &self,
        call: &Call<'_>,
        replicated: bool,
    ) -> Result<(Value, Option<i64>), StoreError> {
        let acks = self.acks.filter(|_| replicated);
        self.bounded(async {
            let mut conn = self.conn.clone();
            let mut by_sha = true;
            loop {
                let cmd = call.command(by_sha);
                match send(&mut conn, &cmd, call.first_key, acks).await {
                    Err(e)
                        if by_sha && e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) =>
                    {
                        // This node has not seen the script (new, restarted or promoted):
                        // send it in full once; the node caches it for the next EVALSHA.
                        by_sha = false;
                    }
                    other => return other,
                }
            }
        })
        .await
    }

    /// Runs one command on the node of `key`'s slot (one round trip), pipelined with
    /// `WAIT` when replica acks are on and `replicated`; returns its reply and how
    /// many replicas confirmed it.
    pub(crate) async fn query_one(
        &self,
        cmd: &Cmd,
        key: &str,
        replicated: bool,
    ) -> Result<(Value, Option<i64>), StoreError> {
        let acks = self.acks.filter(|_| replicated);
        let mut conn = self.conn.clone();
        self.bounded(send(&mut conn, cmd, key, acks)).await
    }

    /// The error for an operation that fewer than the required replicas confirmed.
    pub(crate) fn under_replicated(&self, what: &str, acked: Option<i64>) -> Option<StoreError> {
        let want = self.acks?;
        let got = acked.unwrap_or(0);
        (got < i64::from(want.replicas)).then(|| {
            StoreError::Unavailable(format!(
                "{what} reached {got} of {} replicas within {:?}",
                want.replicas, want.timeout
            ))
        })
    }

    /// The connection, for commands that are not scripts (the async queue's streams).
    pub(crate) fn connection(&self) -> Connection {
        self.conn.clone()
    }

    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The same store on `lifetimes`: another runtime's store shares the first one's
    /// handle, so that one reload reaches them all.
    pub fn with_lifetimes(self, lifetimes: RouteLifetimes) -> Self {
        RedisStore { lifetimes, ..self }
    }
}

/// Sends `cmd`, alone or pipelined with `WAIT` on the master of `key`'s slot; returns
/// its reply and, with `acks`, how many replicas confirmed it.
async fn send(
    conn: &mut Connection,
    cmd: &Cmd,
    key: &str,
    acks: Option<ReplicaAcks>,
) -> RedisResult<(Value, Option<i64>)> {
    let Some(a) = acks else {
        return cmd.query_async(conn).await.map(|v| (v, None));
    };
    let mut p = redis::pipe();
    p.add_command(cmd.clone())
        .cmd("WAIT")
        .arg(a.replicas)
        .arg(ms(a.timeout))
        .ignore_errors();
    match conn.pipeline_on_key_master(&p, key).await {
        Ok(mut vals) if vals.len() == 2 => {
            let waited = vals.pop().unwrap_or(Value::Nil);
            let reply = vals.pop().unwrap_or(Value::Nil);
            reply.extract_error().and_then(|reply| {
                let n = waited.extract_error()?;
                Ok((reply, Some(int_of(&n).unwrap_or(0))))
            })
        }
        Ok(_) => Err((
            ErrorKind::Client,
            "unexpected reply to a command pipelined with WAIT",
        )
            .into()),
        Err(e) => Err(e),
    }
}

/// `d` in whole milliseconds for Redis (at least 1: `PX 0` is an error), saturating
/// instead of wrapping should a duration exceed `u64::MAX` ms (configured durations
/// are bounded far below that).
pub(crate) fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

pub(crate) fn bytes_of(v: &Value) -> Option<&[u8]> {
    match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

pub(crate) fn int_of(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        other => std::str::from_utf8(bytes_of(other)?).ok()?.parse().ok(),
    }
}

fn bad_reply(what: &str) -> StoreError {
    StoreError::Unavailable(format!("unexpected reply to {what}"))
}

/// The delivery log, read and forgotten by operators.
impl crate::store::log::DeliveryLog for RedisStore {
    fn log_support(&self) -> crate::store::log::LogSupport {
        self.log_support_of()
    }

    async fn log_entry(
        &self,
        key: &DeliveryKey,
    ) -> Result<Option<crate::store::log::LogEntry>, StoreError> {
        self.read_log_entry(key).await
    }

    async fn recent(
        &self,
        query: &crate::store::log::ListQuery,
    ) -> Result<crate::store::log::Page, StoreError> {
        self.read_recent(query).await
    }

    async fn forget(&self, key: &DeliveryKey) -> Result<crate::store::log::Forgot, StoreError> {
        self.forget_key(key).await
    }

    async fn flush(&self) {
        self.flush_log().await
    }
}

impl Store for RedisStore {
    fn lifetimes(&self) -> &RouteLifetimes {
        &self.lifetimes
    }

    async fn claim(
        &self,
        key: &DeliveryKey,
        fp: &Fingerprint,
        log: Option<ClaimLog<'_>>,
    ) -> Result<Claim, StoreError> {
        match log {
            Some(l) if l.replay => self.replay_claim(key, fp, l).await,
            _ => self.plain_claim(key, fp, log).await,
        }
    }

    async fn renew(&self, key: &DeliveryKey, token: Token) -> Result<bool, StoreError> {
        let k = self.keys(key);
        let call = Call::new(&self.scripts.renew, &[&k.record, &k.lock, &k.log])
            .arg(token.to_hex())
            .arg(ms(self.lifetimes.of(&key.route).lease));
        let (reply, _) = self.eval(&call, false).await?;
        Ok(int_of(&reply) == Some(1))
    }

    async fn complete(
        &self,
        key: &DeliveryKey,
        token: Token,
        response: &StoredResponse,
        settled: Option<&Settled>,
    ) -> Result<bool, StoreError> {
        self.complete_for(key, token, response, settled, Holder::Record)
            .await
    }

    async fn complete_unowned(
        &self,
        key: &DeliveryKey,
        fp: &Fingerprint,
        response: &StoredResponse,
        settled: Option<&Settled>,
    ) -> Result<bool, StoreError> {
        let (script, keep) = (
            &self.scripts.complete_unowned,
            self.lifetimes.of(&key.route).retention,
        );
        self.run_completion(script, key, hex::encode(fp), response, settled, keep)
            .await
    }

    async fn release(
        &self,
        key: &DeliveryKey,
        token: Token,
        settled: Option<&Settled>,
    ) -> Result<bool, StoreError> {
        let k = self.keys(key);
        let mut call = Call::new(&self.scripts.release, &[&k.record, &k.lock, &k.log])
            .arg(token.to_hex())
            .arg(unix_millis())
            .arg(ms(self.lifetimes.of(&key.route).retention));
        if let Some(settled) = settled {
            call = self.complete_log_args(call, settled);
        }
        let (reply, _) = self.eval(&call, false).await?;
        Ok(int_of(&reply) == Some(1))
    }

    fn confirms_completions(&self) -> bool {
        self.acks.is_some()
    }

    async fn ping(&self) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        let pong = self.bounded(conn.ping()).await?;
        if bytes_of(&pong) != Some(b"PONG") {
            return Err(bad_reply("PING"));
        }
        self.check_cluster_mode().await
    }
}
