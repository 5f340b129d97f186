//! Operators' bulk jobs on Redis, shared by every sidecar (see `store::jobs`).
//!
//! Keys: `{prefix}:job:{<id>}` (a hash: the record), `…:work` (a list: the items, fixed
//! when the job starts), `…:marks` (a hash: item → `started`, `ok` or
//! `failed:<why>`), all under the job's hash tag, and `{prefix}:jobs` (a sorted set
//! of job IDs by creation, for the listing; entries whose job expired are dropped when
//! listed). Every key lives `JOB_TTL` after the job's last change.

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::Duration;

use redis::Value;

use super::queue::RedisQueue;
use super::{Call, ScriptDef, bytes_of, int_of, ms};
use crate::store::StoreError;
use crate::store::jobs::{JOB_TTL, JobRecord, JobState, Jobs, Mark};
use crate::store::queue::StoreFuture;

struct JobScripts {
    take: ScriptDef,
    beat: ScriptDef,
    mark: ScriptDef,
    settle: ScriptDef,
}

fn scripts() -> &'static JobScripts {
    static S: OnceLock<JobScripts> = OnceLock::new();
    S.get_or_init(|| JobScripts {
        take: ScriptDef::new(include_str!("scripts/job_take.lua")),
        beat: ScriptDef::new(include_str!("scripts/job_beat.lua")),
        mark: ScriptDef::new(include_str!("scripts/job_mark.lua")),
        settle: ScriptDef::new(include_str!("scripts/job_settle.lua")),
    })
}

/// Items sent per `RPUSH` when a job's work list is written.
const CHUNK: usize = 1000;

/// A job's keys: its record, work list and item marks.
struct JobKeys {
    meta: String,
    work: String,
    marks: String,
}

impl RedisQueue {
    fn job_keys(&self, id: &str) -> JobKeys {
        let meta = format!("{}:job:{{{id}}}", self.prefix());
        JobKeys {
            work: format!("{meta}:work"),
            marks: format!("{meta}:marks"),
            meta,
        }
    }

    fn jobs_index(&self) -> String {
        format!("{}:jobs", self.prefix())
    }
}

fn record_of(id: &str, v: &Value) -> Option<JobRecord> {
    let mut f: HashMap<String, String> = HashMap::new();
    match v {
        Value::Array(kv) => {
            for pair in kv.chunks(2) {
                if let [k, v] = pair {
                    f.insert(
                        String::from_utf8_lossy(bytes_of(k)?).into_owned(),
                        String::from_utf8_lossy(bytes_of(v)?).into_owned(),
                    );
                }
            }
        }
        Value::Map(kv) => {
            for (k, v) in kv {
                f.insert(
                    String::from_utf8_lossy(bytes_of(k)?).into_owned(),
                    String::from_utf8_lossy(bytes_of(v)?).into_owned(),
                );
            }
        }
        _ => return None,
    }
    let num = |n: &str| f.get(n).and_then(|v| v.parse().ok()).unwrap_or(0);
    let text = |n: &str| f.get(n).cloned().unwrap_or_default();
    Some(JobRecord {
        id: id.to_string(),
        kind: text("kind"),
        route: text("route"),
        filter: text("filter"),
        state: JobState::parse(f.get("state")?)?,
        total: num("total"),
        done: num("done"),
        failed: num("failed"),
        owner: text("owner"),
        beat: num("beat"),
        created: num("created"),
        error: text("error"),
    })
}

impl Jobs for RedisQueue {
    fn job_create<'a>(&'a self, job: &'a JobRecord, items: &'a [String]) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let k = self.job_keys(&job.id);
            // The work list first, the record last: a job is visible only whole.
            for chunk in items.chunks(CHUNK) {
                let mut push = redis::cmd("RPUSH");
                push.arg(&k.work).arg(chunk);
                self.query::<Value>(push).await?;
            }
            let mut hset = redis::cmd("HSET");
            hset.arg(&k.meta)
                .arg("kind")
                .arg(&job.kind)
                .arg("route")
                .arg(&job.route)
                .arg("filter")
                .arg(&job.filter)
                .arg("state")
                .arg(job.state.as_str())
                .arg("total")
                .arg(job.total)
                .arg("done")
                .arg(job.done)
                .arg("failed")
                .arg(job.failed)
                .arg("owner")
                .arg(&job.owner)
                .arg("beat")
                .arg(job.beat)
                .arg("created")
                .arg(job.created)
                .arg("error")
                .arg(&job.error);
            self.query::<Value>(hset).await?;
            for key in [&k.meta, &k.work] {
                let mut exp = redis::cmd("PEXPIRE");
                exp.arg(key).arg(ms(JOB_TTL));
                self.query::<Value>(exp).await?;
            }
            let mut add = redis::cmd("ZADD");
            add.arg(self.jobs_index()).arg(job.created).arg(&job.id);
            self.query::<Value>(add).await?;
            // The index forgets jobs created more than JOB_TTL ago (their keys are gone
            // by then, or soon), so it does not grow with every job ever run.
            let mut trim = redis::cmd("ZREMRANGEBYSCORE");
            trim.arg(self.jobs_index())
                .arg("-inf")
                .arg(format!("({}", job.created.saturating_sub(ms(JOB_TTL))));
            self.query::<Value>(trim).await.map(|_| ())
        })
    }

    fn job_get<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<JobRecord>> {
        Box::pin(async move {
            let mut get = redis::cmd("HGETALL");
            get.arg(self.job_keys(id).meta);
            let v: Value = self.query(get).await?;
            Ok(record_of(id, &v))
        })
    }

    fn job_list<'a>(&'a self, limit: usize) -> StoreFuture<'a, Vec<JobRecord>> {
        Box::pin(async move {
            let mut range = redis::cmd("ZREVRANGE");
            range
                .arg(self.jobs_index())
                .arg(0)
                .arg(limit.saturating_sub(1));
            let ids: Vec<String> = self.query(range).await?;
            let mut out = Vec::with_capacity(ids.len());
            for id in ids {
                match self.job_get(&id).await? {
                    Some(j) => out.push(j),
                    None => {
                        // Expired: drop it from the listing.
                        let mut rem = redis::cmd("ZREM");
                        rem.arg(self.jobs_index()).arg(&id);
                        self.query::<Value>(rem).await?;
                    }
                }
            }
            Ok(out)
        })
    }

    fn job_items<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Vec<String>> {
        Box::pin(async move {
            let mut range = redis::cmd("LRANGE");
            range.arg(self.job_keys(id).work).arg(0).arg(-1);
            self.query(range).await
        })
    }

    fn job_take<'a>(
        &'a self,
        id: &'a str,
        owner: &'a str,
        stale: Duration,
        restart: bool,
    ) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let k = self.job_keys(id);
            let call = Call::new(&scripts().take, &[&k.meta, &k.work, &k.marks])
                .arg(owner)
                .arg(ms(stale))
                .arg("")
                .arg(u8::from(restart))
                .arg(ms(JOB_TTL));
            Ok(int_of(&self.script(call).await?) == Some(1))
        })
    }

    fn job_beat<'a>(
        &'a self,
        id: &'a str,
        owner: &'a str,
        state: Option<JobState>,
        error: &'a str,
    ) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let k = self.job_keys(id);
            let call = Call::new(&scripts().beat, &[&k.meta, &k.work, &k.marks])
                .arg(owner)
                .arg("")
                .arg(state.map(JobState::as_str).unwrap_or(""))
                .arg(error)
                .arg(ms(JOB_TTL));
            Ok(int_of(&self.script(call).await?) == Some(1))
        })
    }

    fn job_mark<'a>(&'a self, id: &'a str, owner: &'a str, item: &'a str) -> StoreFuture<'a, Mark> {
        Box::pin(async move {
            let k = self.job_keys(id);
            let call = Call::new(&scripts().mark, &[&k.meta, &k.marks])
                .arg(owner)
                .arg(item)
                .arg(ms(JOB_TTL));
            let reply = self.script(call).await?;
            let parts = match &reply {
                Value::Array(a) => a.as_slice(),
                _ => &[],
            };
            match parts.first().and_then(int_of) {
                Some(1) => Ok(Mark::Fresh),
                Some(2) => Ok(Mark::Lost),
                Some(0) => Ok(Mark::Seen(
                    parts
                        .get(1)
                        .and_then(bytes_of)
                        .map(|b| String::from_utf8_lossy(b).into_owned())
                        .unwrap_or_default(),
                )),
                _ => Err(StoreError::Unavailable(
                    "unexpected reply to a job item's mark".into(),
                )),
            }
        })
    }

    fn job_settle<'a>(
        &'a self,
        id: &'a str,
        item: &'a str,
        ok: bool,
        error: &'a str,
    ) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let k = self.job_keys(id);
            let call = Call::new(&scripts().settle, &[&k.meta, &k.marks])
                .arg(item)
                .arg(u8::from(ok))
                .arg(error);
            self.script(call).await.map(|_| ())
        })
    }
}
