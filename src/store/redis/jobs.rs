//! Operators' bulk jobs on Redis, shared by every sidecar (see `store::jobs`).
//!
//! Keys: `{prefix}:job:{<id>}` (a hash: the record), `…:work` (a list: the items, fixed
//! when the job starts), `…:marks` (a hash: item → `started`, `ok` or
//! `failed:<why>`), all under the job's hash tag, and `{prefix}:jobs` (a sorted set
//! of job IDs by creation, for the listing; entries whose job expired are dropped when
//! listed). Every key lives `JOB_TTL` after the job's last change.
//!
//! A job is created in steps that no sidecar acts on until the last: its work list is
//! staged (`…:stage:<nonce>`, expiring), its ID listed (the listing skips an ID without
//! a record), and then one script makes the staged list the job's and writes the
//! record. A failure at any step leaves no job; a retried start under the same ID (an
//! idempotency key's) finds the job the first attempt created, if it did.

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::Duration;

use redis::Value;

use super::queue::RedisQueue;
use super::{Call, ScriptDef, bytes_of, int_of, ms};
use crate::store::jobs::{Created, JOB_TTL, JobRecord, JobState, Jobs, Mark};
use crate::store::queue::StoreFuture;
use crate::store::{StoreError, Token, unix_millis};

struct JobScripts {
    stage: ScriptDef,
    list_add: ScriptDef,
    create: ScriptDef,
    take: ScriptDef,
    beat: ScriptDef,
    mark: ScriptDef,
    settle: ScriptDef,
}

fn scripts() -> &'static JobScripts {
    static S: OnceLock<JobScripts> = OnceLock::new();
    S.get_or_init(|| JobScripts {
        stage: ScriptDef::new(include_str!("scripts/job_stage.lua")),
        list_add: ScriptDef::new(include_str!("scripts/job_list_add.lua")),
        create: ScriptDef::new(include_str!("scripts/job_create.lua")),
        take: ScriptDef::new(include_str!("scripts/job_take.lua")),
        beat: ScriptDef::new(include_str!("scripts/job_beat.lua")),
        mark: ScriptDef::new(include_str!("scripts/job_mark.lua")),
        settle: ScriptDef::new(include_str!("scripts/job_settle.lua")),
    })
}

/// Items sent per `RPUSH` when a job's work list is written.
const CHUNK: usize = 1000;
/// How long a staged work list lives unless its job's creation makes it the job's.
const STAGE_TTL: Duration = Duration::from_secs(3600);
/// How long a listed job ID without a record is taken for a start under way (its
/// creation time is set before its work list is read and written), not a failed one.
const UNBORN: Duration = Duration::from_secs(600);

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
    fn job_create<'a>(
        &'a self,
        job: &'a JobRecord,
        items: &'a [String],
    ) -> StoreFuture<'a, Created> {
        Box::pin(async move {
            let k = self.job_keys(&job.id);
            // The work list is staged under a name of this attempt's, expiring; only the
            // last step below makes it the job's.
            let stage = format!("{}:stage:{}", k.meta, Token::random().to_hex());
            for chunk in items.chunks(CHUNK) {
                let call = Call::new(&scripts().stage, &[&stage])
                    .arg(ms(STAGE_TTL))
                    .arg(chunk);
                self.script(call).await?;
            }
            let index = self.jobs_index();
            let list = Call::new(&scripts().list_add, &[&index])
                .arg(job.created)
                .arg(&job.id)
                .arg(job.created.saturating_sub(ms(JOB_TTL)))
                .arg(ms(JOB_TTL));
            self.script(list).await?;
            let mut create =
                Call::new(&scripts().create, &[&k.meta, &k.work, &stage]).arg(ms(JOB_TTL));
            for (field, value) in [
                ("kind", job.kind.clone()),
                ("route", job.route.clone()),
                ("filter", job.filter.clone()),
                ("state", job.state.as_str().to_string()),
                ("total", job.total.to_string()),
                ("done", job.done.to_string()),
                ("failed", job.failed.to_string()),
                ("owner", job.owner.clone()),
                ("beat", job.beat.to_string()),
                ("created", job.created.to_string()),
                ("error", job.error.clone()),
            ] {
                create = create.arg(field).arg(value);
            }
            let reply = self.script(create).await?;
            if int_of(&reply) == Some(1) {
                return Ok(Created::New);
            }
            record_of(&job.id, &reply)
                .map(Created::Exists)
                .ok_or_else(|| {
                    StoreError::Unavailable("unexpected reply to a job's creation".into())
                })
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
                .arg(limit.saturating_sub(1))
                .arg("WITHSCORES");
            let ids: Vec<(String, u64)> = self.query(range).await?;
            let mut out = Vec::with_capacity(ids.len());
            let unborn = unix_millis().saturating_sub(ms(UNBORN));
            for (id, created) in ids {
                match self.job_get(&id).await? {
                    Some(j) => out.push(j),
                    // Listed, not yet created (or never: its start failed): skipped.
                    None if created >= unborn => {}
                    None => {
                        // Expired, or its start failed: drop it from the listing.
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
