//! Operators' bulk jobs in process, beside the in-memory queue (see `store::jobs`):
//! the same rules as the Redis scripts, for one sidecar (lost on restart).

use std::collections::HashMap;
use std::time::Duration;

use super::queue::MemoryQueue;
use crate::store::jobs::{Created, JOB_TTL, JobRecord, JobState, Jobs, Mark};
use crate::store::queue::StoreFuture;
use crate::store::unix_millis;

/// One job: its record, work list and item marks.
pub(super) struct MemJob {
    record: JobRecord,
    items: Vec<String>,
    marks: HashMap<String, String>,
}

impl MemoryQueue {
    fn job<T>(&self, id: &str, f: impl FnOnce(&mut MemJob) -> T) -> Option<T> {
        self.with_jobs(|jobs| jobs.get_mut(id).map(f))
            .ok()
            .flatten()
    }
}

impl Jobs for MemoryQueue {
    fn job_create<'a>(
        &'a self,
        job: &'a JobRecord,
        items: &'a [String],
    ) -> StoreFuture<'a, Created> {
        Self::ready(self.with_jobs(|jobs| {
            if let Some(j) = jobs.get(&job.id) {
                return Created::Exists(j.record.clone());
            }
            // Finished jobs are forgotten JOB_TTL after their creation, as on Redis.
            let cutoff = job.created.saturating_sub(JOB_TTL.as_millis() as u64);
            jobs.retain(|_, j| j.record.state == JobState::Running || j.record.created >= cutoff);
            jobs.insert(
                job.id.clone(),
                MemJob {
                    record: job.clone(),
                    items: items.to_vec(),
                    marks: HashMap::new(),
                },
            );
            Created::New
        }))
    }

    fn job_get<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<JobRecord>> {
        Self::ready(Ok(self.job(id, |j| j.record.clone())))
    }

    fn job_list<'a>(&'a self, limit: usize) -> StoreFuture<'a, Vec<JobRecord>> {
        Self::ready(self.with_jobs(|jobs| {
            let mut all: Vec<JobRecord> = jobs.values().map(|j| j.record.clone()).collect();
            all.sort_by(|a, b| b.created.cmp(&a.created).then(b.id.cmp(&a.id)));
            all.truncate(limit);
            all
        }))
    }

    fn job_items<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Vec<String>> {
        Self::ready(Ok(self.job(id, |j| j.items.clone()).unwrap_or_default()))
    }

    fn job_take<'a>(
        &'a self,
        id: &'a str,
        owner: &'a str,
        stale: Duration,
        restart: bool,
    ) -> StoreFuture<'a, bool> {
        let now = unix_millis();
        let taken = self.job(id, |j| {
            let r = &mut j.record;
            let stale = now.saturating_sub(r.beat) >= stale.as_millis() as u64;
            if (r.state == JobState::Running && stale) || (restart && r.state == JobState::Failed) {
                r.state = JobState::Running;
                r.owner = owner.to_string();
                // An empty owner hands the job to the first sidecar that looks.
                r.beat = if owner.is_empty() { 0 } else { now };
                r.error.clear();
                true
            } else {
                false
            }
        });
        Self::ready(Ok(taken.unwrap_or(false)))
    }

    fn job_beat<'a>(
        &'a self,
        id: &'a str,
        owner: &'a str,
        state: Option<JobState>,
        error: &'a str,
    ) -> StoreFuture<'a, bool> {
        let now = unix_millis();
        let ok = self.job(id, |j| {
            let r = &mut j.record;
            if r.owner != owner || r.state != JobState::Running {
                return false;
            }
            r.beat = now;
            if let Some(s) = state {
                r.state = s;
                r.error = error.to_string();
            }
            true
        });
        Self::ready(Ok(ok.unwrap_or(false)))
    }

    fn job_mark<'a>(&'a self, id: &'a str, owner: &'a str, item: &'a str) -> StoreFuture<'a, Mark> {
        let mark = self.job(id, |j| {
            if j.record.owner != owner || j.record.state != JobState::Running {
                return Mark::Lost;
            }
            match j.marks.get(item) {
                Some(v) => Mark::Seen(v.clone()),
                None => {
                    j.marks.insert(item.to_string(), "started".into());
                    Mark::Fresh
                }
            }
        });
        // A job that vanished has nothing to act on.
        Self::ready(Ok(mark.unwrap_or(Mark::Lost)))
    }

    fn job_settle<'a>(
        &'a self,
        id: &'a str,
        item: &'a str,
        ok: bool,
        error: &'a str,
    ) -> StoreFuture<'a, ()> {
        self.job(id, |j| {
            if j.marks.get(item).is_some_and(|v| v != "started") {
                return;
            }
            if ok {
                j.marks.insert(item.to_string(), "ok".into());
                j.record.done += 1;
            } else {
                j.marks.insert(item.to_string(), format!("failed:{error}"));
                j.record.failed += 1;
                j.record.error = error.to_string();
            }
        });
        Self::ready(Ok(()))
    }
}
