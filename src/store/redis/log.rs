//! The delivery log on Redis: the log's arguments to the claim, complete and release
//! scripts, and the operator's reads of each delivery's status hash.
//!
//! The log is the status hash itself, plus a few fields written by the same claim,
//! complete and release scripts (extra ARGV, so no extra round trip): `outcome`,
//! `up_status`, `latency_ms`, `replays` and, with `keep_payload`, `req_method`,
//! `req_path`, `req_headers`, `req_body`.
//!
//! The recent index is a sorted set per route, `{prefix}:recent:{<route>}`, scored by
//! the last claim or copy (Unix ms; the complete script leaves it alone), trimmed to
//! [`RECENT_PER_ROUTE`] inside the scripts and living `retention + lease`. Its hash
//! tag differs from the delivery's, so on a standalone server or a Sentinel-managed
//! master the scripts take it as `KEYS[3]`; on a Redis Cluster it would be a second
//! slot, which a script may not touch, and the index is not written at all: listing
//! answers "not available on Redis Cluster", while show, forget and replay (by key)
//! work everywhere. (A pipelined `ZADD` would be one round trip on one node, but the
//! cluster client splits a pipeline per node, and on one node it would show as a
//! second command to the round-trip count.)

use redis::Value;

use super::connection::Connection;
use super::{Call, RedisStore, ScriptDef, bytes_of, int_of, ms, status_of};
use crate::store::log::{
    ClaimLog, Forgot, KeptRequest, ListQuery, LogEntry, LogSupport, Page, RECENT_PER_ROUTE, Settled,
};
use crate::store::{DeliveryKey, StoreError};

/// The hash fields a listing reads, in order.
const FIELDS: [&str; 13] = [
    "status",
    "fp",
    "attempts",
    "duplicates",
    "first_seen",
    "last_seen",
    "resp_status",
    "outcome",
    "up_status",
    "latency_ms",
    "replays",
    "req_method",
    "restore",
];

/// How many index entries one listing reads per round trip.
const BATCH: usize = 200;

type Fields = Vec<Option<Vec<u8>>>;

fn text(f: &Fields, i: usize) -> Option<String> {
    f.get(i)
        .cloned()
        .flatten()
        .and_then(|b| String::from_utf8(b).ok())
        .filter(|s| !s.is_empty())
}

fn num(f: &Fields, i: usize) -> Option<u64> {
    text(f, i).and_then(|s| s.parse().ok())
}

fn entry_of(route: &str, key: &str, f: &Fields, claimed: bool) -> Option<LogEntry> {
    let restores = text(f, 12).as_deref() == Some("1") && text(f, 6).is_some();
    let status = status_of(text(f, 0).as_deref(), restores, claimed)?;
    Some(LogEntry {
        route: route.to_string(),
        key: key.to_string(),
        status,
        claimed,
        fingerprint: text(f, 1).unwrap_or_default(),
        attempts: num(f, 2).unwrap_or(0),
        duplicates: num(f, 3).unwrap_or(0),
        first_seen: num(f, 4).unwrap_or(0),
        last_seen: num(f, 5).unwrap_or(0),
        response_status: num(f, 6).and_then(|s| u16::try_from(s).ok()),
        outcome: text(f, 7),
        upstream_status: num(f, 8).and_then(|s| u16::try_from(s).ok()),
        latency_ms: num(f, 9),
        replays: num(f, 10).unwrap_or(0),
        has_request: text(f, 11).is_some(),
        request: None,
    })
}

impl RedisStore {
    pub(super) fn log_support_of(&self) -> LogSupport {
        if self.is_cluster() {
            LogSupport::ByKey
        } else {
            LogSupport::Full
        }
    }

    fn is_cluster(&self) -> bool {
        matches!(self.conn, Connection::Cluster(_)) || self.in_cluster_mode()
    }

    /// The route's recent index, or None on a Redis Cluster (see the module docs): the
    /// optional last key of a logged claim or release.
    pub(super) fn index_key(&self, route: &str) -> Option<String> {
        (!self.is_cluster()).then(|| self.index_key_always(route))
    }

    fn index_key_always(&self, route: &str) -> String {
        format!("{}:recent:{{{route}}}", self.prefix)
    }

    /// A logged claim's arguments after the claim's own (see claim.lua): the index's
    /// trim, the delivery's key, whether it is a replay, and the kept request.
    pub(super) fn claim_log_args<'a>(
        &self,
        call: Call<'a>,
        key: &DeliveryKey,
        log: ClaimLog<'_>,
    ) -> Call<'a> {
        let mut call = call
            .arg(RECENT_PER_ROUTE)
            .arg(key.key.as_str())
            .arg(if log.replay { "1" } else { "0" });
        if let Some(k) = log.kept {
            call = call
                .arg(k.method.as_str())
                .arg(k.path.as_str())
                .arg(k.headers.as_ref())
                .arg(k.body.as_ref());
        }
        call
    }

    /// A logged completion's arguments after the completion's own: how the upstream
    /// call went.
    pub(super) fn complete_log_args<'a>(&self, call: Call<'a>, settled: &Settled) -> Call<'a> {
        call.arg(settled.outcome.as_str())
            .arg(
                settled
                    .upstream_status
                    .map(|s| s.to_string())
                    .unwrap_or_default(),
            )
            .arg(settled.latency_ms)
    }

    /// A logged release's arguments after the release's own (see release.lua): how the
    /// upstream call went, whether to go back to `completed`, and the index's upkeep.
    pub(super) fn release_log_args<'a>(
        &self,
        call: Call<'a>,
        key: &DeliveryKey,
        settled: &Settled,
    ) -> Call<'a> {
        self.complete_log_args(call, settled)
            .arg(if settled.restore_completed { "1" } else { "0" })
            .arg(key.key.as_str())
            .arg(RECENT_PER_ROUTE)
            // The index's lifetime, as the claim script sets it (see claim.lua).
            .arg(ms(self
                .lifetimes
                .retention
                .saturating_add(self.lifetimes.lease)))
    }

    pub(super) async fn read_log_entry(
        &self,
        key: &DeliveryKey,
    ) -> Result<Option<LogEntry>, StoreError> {
        let (state, lock) = self.keys(key);
        let mut conn = self.conn.clone();
        let mut pipe = redis::pipe();
        pipe.cmd("HMGET")
            .arg(&state)
            .arg(&FIELDS[..])
            .cmd("EXISTS")
            .arg(&lock)
            .cmd("HMGET")
            .arg(&state)
            .arg(&["req_method", "req_path", "req_headers", "req_body"]);
        let (fields, locked, req): (Fields, i64, Fields) =
            self.bounded(pipe.query_async(&mut conn)).await?;
        let Some(mut entry) = entry_of(&key.route, &key.key, &fields, locked == 1) else {
            return Ok(None);
        };
        if let Some(method) = text(&req, 0) {
            let part = |i: usize| req.get(i).cloned().flatten().unwrap_or_default();
            entry.request = Some(KeptRequest {
                method,
                path: text(&req, 1).unwrap_or_else(|| "/".into()),
                headers: part(2).into(),
                body: part(3).into(),
            });
        }
        Ok(Some(entry))
    }

    pub(super) async fn read_recent(&self, q: &ListQuery) -> Result<Page, StoreError> {
        if self.is_cluster() {
            return Err(StoreError::Unavailable(
                "the recent-deliveries list is not kept on Redis Cluster (see docs/operating.md); show, forget and replay by key work".into(),
            ));
        }
        let limit = q.limit.max(1);
        let mut all = Vec::new();
        for route in &q.routes {
            let index = self.index_key_always(route);
            let max = q
                .cursor
                .as_ref()
                .map(|c| c.score.to_string())
                .unwrap_or_else(|| "+inf".into());
            let mut offset = 0usize;
            let mut found = 0usize;
            loop {
                let mut conn = self.conn.clone();
                let members: Vec<(String, u64)> = self
                    .bounded(
                        redis::cmd("ZREVRANGEBYSCORE")
                            .arg(&index)
                            .arg(&max)
                            .arg("-inf")
                            .arg("WITHSCORES")
                            .arg("LIMIT")
                            .arg(offset)
                            .arg(BATCH)
                            .query_async(&mut conn),
                    )
                    .await?;
                let n = members.len();
                offset += n;
                let candidates: Vec<(String, u64)> = members
                    .into_iter()
                    .filter(|(k, score)| {
                        q.cursor
                            .as_ref()
                            .is_none_or(|c| (*score, route.as_str(), k.as_str()) < c.order())
                    })
                    .collect();
                if !candidates.is_empty() {
                    let mut pipe = redis::pipe();
                    for (k, _) in &candidates {
                        let (state, lock) =
                            self.keys(&DeliveryKey::new(route.as_str(), k.as_str()));
                        pipe.cmd("HMGET").arg(state).arg(&FIELDS[..]);
                        pipe.cmd("EXISTS").arg(lock);
                    }
                    let replies: Vec<Value> = self.bounded(pipe.query_async(&mut conn)).await?;
                    let mut stale = Vec::new();
                    for (i, (k, score)) in candidates.iter().enumerate() {
                        let fields: Fields = replies
                            .get(2 * i)
                            .and_then(|v| redis::from_redis_value(v.clone()).ok())
                            .unwrap_or_default();
                        let locked = replies.get(2 * i + 1).and_then(int_of) == Some(1);
                        match entry_of(route, k, &fields, locked) {
                            Some(e) => {
                                if q.matches(&e) && found <= limit {
                                    found += 1;
                                    all.push((*score, e));
                                }
                            }
                            None => stale.push(k.clone()),
                        }
                    }
                    if !stale.is_empty() {
                        // Expired or forgotten: drop it from the index (best effort).
                        let _: Result<i64, _> = self
                            .bounded(
                                redis::cmd("ZREM")
                                    .arg(&index)
                                    .arg(&stale)
                                    .query_async(&mut conn),
                            )
                            .await;
                    }
                }
                if found > limit || n < BATCH {
                    break;
                }
            }
        }
        Ok(Page::from_candidates(all, limit))
    }

    pub(super) async fn forget_key(&self, key: &DeliveryKey) -> Result<Forgot, StoreError> {
        let (state, lock) = self.keys(key);
        let script = ScriptDef::new(include_str!("scripts/forget.lua"));
        let call = Call::new(&script, &[&state, &lock]);
        let (reply, _) = self.eval(&call, false).await?;
        let forgot = match bytes_of(&reply) {
            Some(b"forgotten") => Forgot::Forgotten,
            Some(b"in_flight") => Forgot::InFlight,
            _ => Forgot::NotFound,
        };
        if forgot == Forgot::Forgotten
            && let Some(index) = self.index_key(&key.route)
        {
            let mut conn = self.conn.clone();
            let _: Result<i64, _> = self
                .bounded(
                    redis::cmd("ZREM")
                        .arg(index)
                        .arg(key.key.as_str())
                        .query_async(&mut conn),
                )
                .await;
        }
        Ok(forgot)
    }
}
