//! Operators' bulk jobs in process, beside the in-memory queue (see `store::jobs`):
//! the same rules as the Redis scripts, for one sidecar (lost on restart on the memory
//! store; journaled, and awaited before each answer, on the `file:` store).

use std::collections::HashMap;
use std::time::Duration;

use super::journal::{Change, Ticket};
use super::queue::{Journaled, MemoryQueue};
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
    /// Applies `f` to job `id` (`None` when there is none), journaling the record it
    /// leaves, and answers once that is durable.
    fn job<T: Send + 'static>(
        &self,
        id: &str,
        f: impl FnOnce(&mut MemJob, &Journaled) -> T,
    ) -> StoreFuture<'_, Option<T>> {
        let r = self.with_jobs(|jobs| match jobs.get_mut(id) {
            None => (None, None),
            Some(j) => {
                let v = f(j, &self.journal);
                let t = self.journal.note(Change::Job {
                    id,
                    record: Some(&j.record),
                });
                (Some(v), t)
            }
        });
        match r {
            Ok((v, Some(t))) => self.after(t, v),
            Ok((v, None)) => Self::ready(Ok(v)),
            Err(e) => Self::ready(Err(e)),
        }
    }

    /// Reads job `id` without changing it.
    fn read_job<T>(&self, id: &str, f: impl FnOnce(&MemJob) -> T) -> Option<T> {
        self.with_jobs(|jobs| jobs.get(id).map(f)).ok().flatten()
    }

    /// Puts back a job's record read from the `file:` store at start.
    pub(crate) fn restore_job(&self, record: JobRecord) {
        let _ = self.with_jobs(|jobs| {
            jobs.insert(
                record.id.clone(),
                MemJob {
                    record,
                    items: Vec::new(),
                    marks: HashMap::new(),
                },
            )
        });
    }

    /// Puts back a job's work list (after its record).
    pub(crate) fn restore_job_items(&self, id: &str, items: Vec<String>) {
        let _ = self.with_jobs(|jobs| jobs.get_mut(id).map(|j| j.items = items));
    }

    /// Puts back a job's mark on one item (after its record).
    pub(crate) fn restore_job_mark(&self, id: &str, item: String, mark: String) {
        let _ = self.with_jobs(|jobs| jobs.get_mut(id).map(|j| j.marks.insert(item, mark)));
    }
}

/// Journals that job `id` and everything of it are forgotten.
fn forget(journal: &Journaled, id: &str, job: &MemJob) -> Option<Ticket> {
    for item in job.marks.keys() {
        journal.note(Change::JobMark {
            id,
            item,
            mark: None,
        });
    }
    journal.note(Change::JobItems { id, items: None });
    journal.note(Change::Job { id, record: None })
}

impl Jobs for MemoryQueue {
    fn job_create<'a>(
        &'a self,
        job: &'a JobRecord,
        items: &'a [String],
    ) -> StoreFuture<'a, Created> {
        let r = self.with_jobs(|jobs| {
            if let Some(j) = jobs.get(&job.id) {
                return (Created::Exists(j.record.clone()), None);
            }
            // Finished jobs are forgotten JOB_TTL after their creation, as on Redis.
            let cutoff = job.created.saturating_sub(JOB_TTL.as_millis() as u64);
            jobs.retain(|id, j| {
                let keep = j.record.state == JobState::Running || j.record.created >= cutoff;
                if !keep {
                    forget(&self.journal, id, j);
                }
                keep
            });
            self.journal.note(Change::JobItems {
                id: &job.id,
                items: Some(items),
            });
            let t = self.journal.note(Change::Job {
                id: &job.id,
                record: Some(job),
            });
            jobs.insert(
                job.id.clone(),
                MemJob {
                    record: job.clone(),
                    items: items.to_vec(),
                    marks: HashMap::new(),
                },
            );
            (Created::New, t)
        });
        match r {
            Ok((v, Some(t))) => self.after(t, v),
            Ok((v, None)) => Self::ready(Ok(v)),
            Err(e) => Self::ready(Err(e)),
        }
    }

    fn job_get<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<JobRecord>> {
        Self::ready(Ok(self.read_job(id, |j| j.record.clone())))
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
        Self::ready(Ok(self
            .read_job(id, |j| j.items.clone())
            .unwrap_or_default()))
    }

    fn job_take<'a>(
        &'a self,
        id: &'a str,
        owner: &'a str,
        stale: Duration,
        restart: bool,
    ) -> StoreFuture<'a, bool> {
        let now = unix_millis();
        let taken = self.job(id, |j, _| {
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
        Box::pin(async move { Ok(taken.await?.unwrap_or(false)) })
    }

    fn job_beat<'a>(
        &'a self,
        id: &'a str,
        owner: &'a str,
        state: Option<JobState>,
        error: &'a str,
    ) -> StoreFuture<'a, bool> {
        let now = unix_millis();
        let ok = self.job(id, |j, _| {
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
        Box::pin(async move { Ok(ok.await?.unwrap_or(false)) })
    }

    fn job_mark<'a>(&'a self, id: &'a str, owner: &'a str, item: &'a str) -> StoreFuture<'a, Mark> {
        let mark = self.job(id, |j, journal| {
            if j.record.owner != owner || j.record.state != JobState::Running {
                return Mark::Lost;
            }
            match j.marks.get(item) {
                Some(v) => Mark::Seen(v.clone()),
                None => {
                    j.marks.insert(item.to_string(), "started".into());
                    journal.note(Change::JobMark {
                        id,
                        item,
                        mark: Some("started"),
                    });
                    Mark::Fresh
                }
            }
        });
        // A job that vanished has nothing to act on.
        Box::pin(async move { Ok(mark.await?.unwrap_or(Mark::Lost)) })
    }

    fn job_settle<'a>(
        &'a self,
        id: &'a str,
        item: &'a str,
        ok: bool,
        error: &'a str,
    ) -> StoreFuture<'a, ()> {
        let settled = self.job(id, |j, journal| {
            if j.marks.get(item).is_some_and(|v| v != "started") {
                return;
            }
            let mark = if ok {
                j.record.done += 1;
                "ok".to_string()
            } else {
                j.record.failed += 1;
                j.record.error = error.to_string();
                format!("failed:{error}")
            };
            journal.note(Change::JobMark {
                id,
                item,
                mark: Some(&mark),
            });
            j.marks.insert(item.to_string(), mark);
        });
        Box::pin(async move { settled.await.map(drop) })
    }
}
