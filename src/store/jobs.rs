//! Operators' bulk jobs as the store keeps them (a replay or a redrive of many
//! deliveries, docs/operating.md "Bulk jobs"): the job's record, its work list (fixed
//! when it starts), and one mark per item, taken before the item is acted on, so that
//! no item is acted on twice — also when the job's sidecar dies and another one, or a
//! restart, finishes the rest. On Redis the job is shared by every sidecar
//! (`store/redis/jobs.rs`); the memory store keeps it in process. The runner lives in
//! `crate::deliveries::jobs`.

use std::time::Duration;

use super::queue::StoreFuture;

/// A job's state as stored (`interrupted` is a `running` job whose heartbeat stopped).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobState {
    Running,
    Done,
    Failed,
}

impl JobState {
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Running => "running",
            JobState::Done => "done",
            JobState::Failed => "failed",
        }
    }

    pub fn parse(s: &str) -> Option<JobState> {
        match s {
            "running" => Some(JobState::Running),
            "done" => Some(JobState::Done),
            "failed" => Some(JobState::Failed),
            _ => None,
        }
    }
}

/// One job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobRecord {
    pub id: String,
    /// `replay` or `redrive`.
    pub kind: String,
    pub route: String,
    /// The filter as the operator gave it (JSON text).
    pub filter: String,
    pub state: JobState,
    pub total: u64,
    pub done: u64,
    pub failed: u64,
    /// The sidecar running it (its consumer name).
    pub owner: String,
    /// The owner's last heartbeat, Unix ms.
    pub beat: u64,
    /// Unix ms.
    pub created: u64,
    /// Why the job failed, or the last item's error.
    pub error: String,
}

/// What an item's mark says when taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mark {
    /// Nobody acted on the item before: act now.
    Fresh,
    /// An earlier run marked it: `started` (its outcome was never recorded: it may
    /// have been acted on) or its recorded outcome.
    Seen(String),
    /// The asker no longer runs the job (another sidecar took it over): stop.
    Lost,
}

/// How long a job's keys are kept after its last change.
pub const JOB_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

/// What `job_create` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Created {
    /// The job is stored, all of it.
    New,
    /// A job with this ID was stored before (a retried start): left as it is.
    Exists(JobRecord),
}

/// The jobs' storage; each method one store round trip (a script where it must be
/// atomic) but `job_create`. Every write but `job_create` is fenced by the owner's name.
pub trait Jobs: Send + Sync + 'static {
    /// Stores a new job (state `running`, owned by `job.owner`) and its work list, all
    /// or nothing: no part of it is listed, taken over or run until its record is
    /// stored, in one step with the work list, and a part written before a failure
    /// expires. When a job with `job.id` exists, changes nothing and returns it.
    fn job_create<'a>(
        &'a self,
        job: &'a JobRecord,
        items: &'a [String],
    ) -> StoreFuture<'a, Created>;
    fn job_get<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<JobRecord>>;
    /// The newest `limit` jobs, newest first.
    fn job_list<'a>(&'a self, limit: usize) -> StoreFuture<'a, Vec<JobRecord>>;
    /// The job's work list.
    fn job_items<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Vec<String>>;
    /// Makes `owner` the job's runner when it is `running` with a heartbeat older
    /// than `stale` (its sidecar died), or, with `restart`, also when it is `failed`:
    /// the job is `running` again with a fresh heartbeat. False when not taken.
    fn job_take<'a>(
        &'a self,
        id: &'a str,
        owner: &'a str,
        stale: Duration,
        restart: bool,
    ) -> StoreFuture<'a, bool>;
    /// The owner's heartbeat, and its state change when `state` is given (with
    /// `error`); false when `owner` no longer runs the job.
    fn job_beat<'a>(
        &'a self,
        id: &'a str,
        owner: &'a str,
        state: Option<JobState>,
        error: &'a str,
    ) -> StoreFuture<'a, bool>;
    /// Takes the mark of `item` before acting on it (see `Mark`); only the job's
    /// runner `owner` may.
    fn job_mark<'a>(&'a self, id: &'a str, owner: &'a str, item: &'a str) -> StoreFuture<'a, Mark>;
    /// Records an item's outcome and counts it (`done` when `ok`, else `failed`, with
    /// `error` as the job's last error); once per item.
    fn job_settle<'a>(
        &'a self,
        id: &'a str,
        item: &'a str,
        ok: bool,
        error: &'a str,
    ) -> StoreFuture<'a, ()>;
}
