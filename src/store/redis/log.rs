//! The delivery log on Redis: the log's arguments to the replay, complete and release
//! scripts, and the operator's reads of each delivery's claim record and log hash.
//!
//! A delivery's log is its claim record's head plus its log hash. A first delivery's
//! fields live in its record (record.rs): the claim's time and one attempt in `P`;
//! with `C` also the outcome, the upstream's status, the latency, the answer's status
//! and when it completed: no log hash is written for it at all. The hash (`fp`,
//! `attempts`, `duplicates`, `first_seen`, `last_seen`, `resp_status`, `outcome`,
//! `up_status`, `latency_ms`, `replays` and, with `keep_payload`, `req_method`,
//! `req_path`, `req_headers`, `req_body`) holds what no record carries: the copies'
//! counts (summed by the log writer, log_writer.rs), the kept request, and what the
//! rare paths write (release, replay, the queue, a lock holder's completion), which
//! move a `P` or `C` record's fields into the hash when they replace it. A read adds
//! the two: attempts are the hash's plus the record's own, and the record's outcome
//! stands over the hash's. A delivery's status is read off its record, never off the
//! hash.
//!
//! The recent index is a sorted set per route, `{prefix}:recent:{<route>}` (its own
//! hash tag, so one slot per route on a Redis Cluster), scored by when the delivery
//! was first seen (Unix ms) and written by the log writer only (log_writer.rs): a
//! copy, a release, a completion or a replay leaves a delivery where it is, so a
//! listing's cursor neither skips nor repeats it. Trimmed to [`RECENT_PER_ROUTE`]
//! (the oldest go) and living `retention + lease` after the newest claim. It is kept
//! the same on a standalone server, under Sentinel and on a Redis Cluster.

use redis::Value;

use super::connection::query_groups;
use super::record::{Head, head_of};
use super::{Call, Keys, RedisStore, ScriptDef, bytes_of, int_of};
use crate::store::log::{
    ClaimLog, Cursor, Forgot, KeptRequest, ListQuery, LogEntry, LogSupport, Page, SCAN_BUDGET,
    Settled,
};
use crate::store::{DeliveryKey, Status, StoreError};

/// The hash fields a listing reads, in order.
const FIELDS: [&str; 11] = [
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
];

/// How much of a record the log reads: its tag, the fingerprint and the log's fields
/// (`C|<64>|<13>|<13>|<22>|<3>|<20>|<3>|` is the longest head), not the stored answer.
const RECORD_HEAD: i64 = 191;

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

/// A delivery's status and whether a claim holds it, from its record's head and
/// whether its lock is held (record.rs); without a record, a released (or lapsed)
/// claim. Neither a record nor a hash with `first_seen`: no delivery (expired, or a
/// fragment a late log write re-created after a forget).
fn status_of(head: &Head, locked: bool, f: &Fields) -> Option<(Status, bool)> {
    Some(match head.tag {
        b'p' | b'P' => (Status::Processing, true),
        b'q' => (Status::Queued, locked),
        b'r' if locked => (Status::Processing, true),
        b'c' | b'C' | b'r' => (Status::Completed, locked),
        _ if text(f, 3).is_none() => return None,
        _ => (Status::Released, locked),
    })
}

fn entry_of(route: &str, key: &str, f: &Fields, head: &[u8], locked: bool) -> Option<LogEntry> {
    let h = head_of(head);
    let (status, claimed) = status_of(&h, locked, f)?;
    // The record's outcome (a `C` completion) stands over the hash's (an earlier
    // release's), all three fields together.
    let (outcome, upstream_status, latency_ms) = match h.outcome.clone() {
        Some(o) => (Some(o), h.upstream_status, h.latency_ms),
        None => (
            text(f, 6),
            num(f, 7).and_then(|s| u16::try_from(s).ok()),
            num(f, 8),
        ),
    };
    Some(LogEntry {
        route: route.to_string(),
        key: key.to_string(),
        status,
        claimed,
        fingerprint: h.fp.clone().or_else(|| text(f, 0)).unwrap_or_default(),
        attempts: num(f, 1).unwrap_or(0) + u64::from(h.attempt),
        duplicates: num(f, 2).unwrap_or(0),
        first_seen: num(f, 3).or(h.first_seen).unwrap_or(0),
        last_seen: num(f, 4).max(h.last_seen).unwrap_or(0),
        response_status: h
            .response_status
            .or_else(|| num(f, 5).and_then(|s| u16::try_from(s).ok())),
        outcome,
        upstream_status,
        latency_ms,
        replays: num(f, 9).unwrap_or(0),
        has_request: text(f, 10).is_some(),
        request: None,
    })
}

/// One delivery's reads in a pipeline: its hash's fields, its record's head, its lock.
fn read_entry(pipe: &mut redis::Pipeline, keys: &Keys) {
    pipe.cmd("HMGET").arg(&keys.log).arg(&FIELDS[..]);
    pipe.cmd("GETRANGE")
        .arg(&keys.record)
        .arg(0)
        .arg(RECORD_HEAD);
    pipe.cmd("EXISTS").arg(&keys.lock);
}

impl RedisStore {
    pub(super) fn log_support_of(&self) -> LogSupport {
        LogSupport::Full
    }

    /// The route's recent index (see the module docs).
    pub(super) fn index_key(&self, route: &str) -> String {
        super::log_writer::Names {
            prefix: self.prefix.clone(),
        }
        .index(route)
    }

    /// A replay's arguments after the claim's own (see replay.lua): the kept request.
    pub(super) fn claim_log_args<'a>(&self, mut call: Call<'a>, log: ClaimLog<'_>) -> Call<'a> {
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

    pub(super) async fn read_log_entry(
        &self,
        key: &DeliveryKey,
    ) -> Result<Option<LogEntry>, StoreError> {
        self.flush_log().await;
        let keys = self.keys(key);
        let mut conn = self.conn.clone();
        let mut pipe = redis::pipe();
        read_entry(&mut pipe, &keys);
        pipe.cmd("HMGET").arg(&keys.log).arg(&[
            "req_method",
            "req_path",
            "req_headers",
            "req_body",
        ]);
        let (fields, head, locked, req): (Fields, Vec<u8>, i64, Fields) =
            self.bounded(pipe.query_async(&mut conn)).await?;
        let Some(mut entry) = entry_of(&key.route, &key.key, &fields, &head, locked == 1) else {
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
        self.flush_log().await;
        let limit = q.limit.max(1);
        let budget = (SCAN_BUDGET / q.routes.len().max(1)).max(BATCH);
        // The index is scored by first seen: `since` and `until` bound the range read.
        let top = match (q.cursor.as_ref(), q.filter.until) {
            (Some(c), Some(u)) => Some(c.score.min(u.saturating_sub(1))),
            (Some(c), None) => Some(c.score),
            (None, u) => u.map(|u| u.saturating_sub(1)),
        };
        let bottom = q
            .filter
            .since
            .map_or_else(|| "-inf".to_string(), |s| s.to_string());
        let mut all = Vec::new();
        let mut stopped: Option<Cursor> = None;
        for route in &q.routes {
            let index = self.index_key(route);
            // Paged by score, not by a running offset: stale members removed on the
            // way would shift every later member up past an offset. Each batch starts
            // at the last score read, past the members at that score still indexed.
            let mut max = top.map_or_else(|| "+inf".to_string(), |t| t.to_string());
            let mut offset = 0usize;
            let mut found = 0usize;
            let mut read = 0usize;
            loop {
                let mut conn = self.conn.clone();
                let members: Vec<(String, u64)> = self
                    .bounded(
                        redis::cmd("ZREVRANGEBYSCORE")
                            .arg(&index)
                            .arg(&max)
                            .arg(&bottom)
                            .arg("WITHSCORES")
                            .arg("LIMIT")
                            .arg(offset)
                            .arg(BATCH)
                            .query_async(&mut conn),
                    )
                    .await?;
                let n = members.len();
                read += n;
                let last = members.last().map(|(_, score)| *score);
                let lowest = members.last().map(|(k, score)| Cursor {
                    score: *score,
                    route: route.clone(),
                    key: k.clone(),
                });
                let mut removed = std::collections::HashSet::new();
                let candidates: Vec<(String, u64)> = members
                    .iter()
                    .filter(|(k, score)| {
                        q.cursor
                            .as_ref()
                            .is_none_or(|c| (*score, route.as_str(), k.as_str()) < c.order())
                    })
                    .cloned()
                    .collect();
                if !candidates.is_empty() {
                    let replies = self.read_entries(route, &candidates).await?;
                    let mut stale = Vec::new();
                    for ((k, score), replies) in candidates.iter().zip(&replies) {
                        let fields: Fields = replies
                            .first()
                            .and_then(|v| redis::from_redis_value(v.clone()).ok())
                            .unwrap_or_default();
                        let head = replies.get(1).and_then(bytes_of).unwrap_or_default();
                        let locked = replies.get(2).and_then(int_of) == Some(1);
                        match entry_of(route, k, &fields, head, locked) {
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
                        let dropped: Result<i64, _> = self
                            .bounded(
                                redis::cmd("ZREM")
                                    .arg(&index)
                                    .arg(&stale)
                                    .query_async(&mut conn),
                            )
                            .await;
                        if dropped.is_ok() {
                            removed.extend(stale);
                        }
                    }
                }
                if let Some(last) = last {
                    let kept_at_last = members
                        .iter()
                        .filter(|(k, score)| *score == last && !removed.contains(k))
                        .count();
                    let last = last.to_string();
                    if last != max {
                        max = last;
                        offset = 0;
                    }
                    offset += kept_at_last;
                }
                if found > limit || n < BATCH {
                    break;
                }
                if read >= budget {
                    // Cut here: the page goes on from the lowest entry read.
                    if let Some(low) = lowest
                        && stopped.as_ref().is_none_or(|s| low.order() > s.order())
                    {
                        stopped = Some(low);
                    }
                    break;
                }
            }
        }
        Ok(Page::from_candidates(all, limit, stopped))
    }

    /// Each candidate's reads ([`read_entry`]), one pipeline per delivery (one slot
    /// each), in one round trip where the deployment allows (`query_groups`).
    async fn read_entries(
        &self,
        route: &str,
        candidates: &[(String, u64)],
    ) -> Result<Vec<Vec<Value>>, StoreError> {
        let groups = candidates
            .iter()
            .map(|(k, _)| {
                let mut pipe = redis::pipe();
                read_entry(&mut pipe, &self.keys(&DeliveryKey::new(route, k.as_str())));
                pipe
            })
            .collect();
        let replies = self.bounded(async {
            query_groups(&self.conn, groups)
                .await
                .into_iter()
                .collect::<Result<Vec<_>, _>>()
        });
        replies.await
    }

    pub(super) async fn forget_key(&self, key: &DeliveryKey) -> Result<Forgot, StoreError> {
        self.flush_log().await;
        let k = self.keys(key);
        let script = ScriptDef::new(include_str!("scripts/forget.lua"));
        let call = Call::new(&script, &[&k.record, &k.lock, &k.log]);
        let (reply, _) = self.eval(&call, false).await?;
        let forgot = match bytes_of(&reply) {
            Some(b"forgotten") => Forgot::Forgotten,
            Some(b"in_flight") => Forgot::InFlight,
            _ => Forgot::NotFound,
        };
        if forgot == Forgot::Forgotten {
            let index = self.index_key(&key.route);
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
