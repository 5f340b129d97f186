//! Operators' bulk jobs (docs/operating.md, "Bulk jobs"): redrive a route's dead
//! letters, or replay every delivery matching a filter, in the background, with
//! progress in the store (`store::jobs`) where every sidecar sees it.
//!
//! A job's work list is fixed when it starts. Each item's mark is taken before the
//! item is acted on, so no item is acted on twice: not when the job's sidecar dies and
//! another sidecar takes the job over (its heartbeat stopped), not when an operator
//! starts it again. An item marked but never settled (its sidecar died mid-item) is
//! counted failed, never acted on again. Replays are paced like the route's own
//! deliveries (`AsyncMode::paced`), each under the key's claim like a single replay.
//!
//! A job is created all or nothing (`Jobs::job_create`), and a start carrying an
//! idempotency key is the one job that key created: a retried start, whatever became
//! of the first try, never runs a second job.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::replay;
use crate::gate::Gate;
use crate::queue::{AsyncMode, QueueBackend};
use crate::store::jobs::{Created, JobRecord, JobState, Mark};
use crate::store::log::{Filter, ListQuery, LogSupport};
use crate::store::log_filter;
use crate::store::{DeliveryKey, Store, StoreError, unix_millis};

/// How often a runner beats; a job whose beat is `STALE` old is taken over.
const BEAT: Duration = Duration::from_secs(2);
pub const STALE: Duration = Duration::from_secs(10);
/// How often each sidecar looks for jobs to take over, among the newest `SWEPT`.
const SWEEP: Duration = Duration::from_secs(3);
const SWEPT: usize = 1000;
/// The most items one job takes on.
pub const MAX_ITEMS: usize = 100_000;
/// Page size when the work list is read from the log or the dead letters.
const PAGE: usize = 500;

/// Why a job could not start (answered 400, 404, 409 or 503).
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    #[error("{0}")]
    BadRequest(String),
    #[error("no such job")]
    NotFound,
    #[error("{0}")]
    Conflict(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A job as the API shows it: `interrupted` is a running job whose heartbeat stopped.
pub fn job_json(j: &JobRecord, now: u64) -> Value {
    // A job handed to the deployment (`owner` empty) waits for a sidecar to take it.
    let stale = !j.owner.is_empty() && now.saturating_sub(j.beat) >= ms(STALE);
    let state = if j.state == JobState::Running && stale {
        "interrupted"
    } else {
        j.state.as_str()
    };
    json!({
        "id": j.id,
        "kind": j.kind,
        "route": j.route,
        "filter": serde_json::from_str::<Value>(&j.filter).unwrap_or(Value::Null),
        "state": state,
        "total": j.total,
        "done": j.done,
        "failed": j.failed,
        "owner": j.owner,
        "created": j.created,
        "error": j.error,
    })
}

fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

/// What a job does, parsed and checked from the operator's request.
enum Work {
    Replay(ListQuery),
    Redrive(Option<String>, Option<Duration>),
}

/// What a job plan needs to know of the deployment.
pub struct Planning<'a, S> {
    /// The store whose delivery log a replay job lists.
    pub store: &'a S,
    /// Where dead letters are listed and jobs kept.
    pub backend: &'a dyn QueueBackend,
    /// Every configured route, and the async ones.
    pub routes: &'a [String],
    pub async_routes: &'a [String],
}

/// An operator's request for a job.
pub struct JobRequest<'a> {
    pub kind: &'a str,
    pub route: &'a str,
    pub filter: &'a Map<String, Value>,
    /// The request's idempotency key: every start with it is the one job it created.
    pub key: Option<&'a str>,
}

impl JobRequest<'_> {
    /// The job's ID: derived from the idempotency key, so that a retried start finds
    /// the job its first attempt created; else a fresh one.
    fn id(&self) -> String {
        match self.key {
            Some(k) => hex::encode(&Sha256::digest(format!("job:{k}"))[..16]),
            None => crate::store::Token::random().to_hex(),
        }
    }

    /// `j`, the job this request's key created, when it is this request's; a key used
    /// for another request is refused.
    fn same(&self, j: JobRecord) -> Result<JobRecord, JobError> {
        let filter = Value::Object(self.filter.clone()).to_string();
        if (j.kind.as_str(), j.route.as_str(), j.filter.as_str())
            == (self.kind, self.route, &filter)
        {
            return Ok(j);
        }
        Err(JobError::Conflict(format!(
            "the idempotency key `{}` started another job ({}: {} on `{}`, filter {})",
            self.key.unwrap_or(""),
            j.id,
            j.kind,
            j.route,
            j.filter
        )))
    }
}

/// Creates the job `req` asks for (owned by `owner`; `""` leaves it to the first
/// sidecar that looks), all or nothing, or finds the one its idempotency key created
/// before: the job, and whether this call created it. Shared by the admin API and
/// `idemgate jobs start`.
pub async fn create<S: Store>(
    p: &Planning<'_, S>,
    req: &JobRequest<'_>,
    owner: &str,
) -> Result<(JobRecord, bool), JobError> {
    let id = req.id();
    if req.key.is_some()
        && let Some(j) = p.backend.job_get(&id).await?
    {
        return req.same(j).map(|j| (j, false));
    }
    let (job, items) = plan(p, req, id, owner).await?;
    match p.backend.job_create(&job, &items).await? {
        Created::New => Ok((job, true)),
        Created::Exists(j) => req.same(j).map(|j| (j, false)),
    }
}

/// Checks a job request and reads its work list: the job as it starts and its items.
async fn plan<S: Store>(
    p: &Planning<'_, S>,
    req: &JobRequest<'_>,
    id: String,
    owner: &str,
) -> Result<(JobRecord, Vec<String>), JobError> {
    let (kind, route) = (req.kind, req.route);
    let work = parse(p, kind, route, req.filter)?;
    let items = items(p, route, work).await?;
    let now = unix_millis();
    let job = JobRecord {
        id,
        kind: kind.to_string(),
        route: route.to_string(),
        filter: Value::Object(req.filter.clone()).to_string(),
        state: JobState::Running,
        total: items.len() as u64,
        done: 0,
        failed: 0,
        owner: owner.to_string(),
        beat: if owner.is_empty() { 0 } else { now },
        created: now,
        error: String::new(),
    };
    Ok((job, items))
}

fn parse<S: Store>(
    p: &Planning<'_, S>,
    kind: &str,
    route: &str,
    filter: &Map<String, Value>,
) -> Result<Work, JobError> {
    let bad = |m: String| Err(JobError::BadRequest(m));
    if !p.routes.iter().any(|r| r == route) {
        return bad(format!("no route named `{route}`"));
    }
    let allowed: &[&str] = match kind {
        "replay" => &log_filter::WORDS,
        "redrive" => &["error_contains", "older_than"],
        _ => return bad(format!("kind `{kind}` is not one of replay, redrive")),
    };
    if let Some(k) = filter.keys().find(|k| !allowed.contains(&k.as_str())) {
        return bad(format!(
            "a {kind} filter takes {}; not `{k}`",
            allowed.join(", ")
        ));
    }
    let text = |k: &str| -> Result<Option<String>, JobError> {
        match filter.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(JobError::BadRequest(format!("filter.{k} must be a string"))),
        }
    };
    if kind == "redrive" {
        if !p.async_routes.iter().any(|r| r == route) {
            return bad(format!(
                "route `{route}` is not async: it has no dead letters"
            ));
        }
        let older = text("older_than")?
            .map(|d| {
                humantime::parse_duration(&d)
                    .map_err(|e| JobError::BadRequest(format!("filter.older_than `{d}`: {e}")))
            })
            .transpose()?;
        return Ok(Work::Redrive(text("error_contains")?, older));
    }
    if p.store.log_support() != LogSupport::Full {
        return bad("a replay job lists deliveries, and this store keeps no delivery log".into());
    }
    // The list's words, parsed as the API parses them (a number or a boolean as its
    // text).
    let mut words = Filter::default();
    for (k, v) in filter {
        let v = match v {
            Value::Null => continue,
            Value::String(s) => s.clone(),
            Value::Number(n) => n.to_string(),
            Value::Bool(b) => b.to_string(),
            _ => {
                return bad(format!(
                    "filter.{k} must be a string, a number or a boolean"
                ));
            }
        };
        words
            .set(k, &v)
            .map_err(|e| JobError::BadRequest(format!("filter.{e}")))?;
    }
    let q = ListQuery {
        routes: vec![route.to_string()],
        filter: words,
        limit: PAGE,
        cursor: None,
    };
    Ok(Work::Replay(q))
}

/// The work list: the keys to replay or the dead letters to redrive.
async fn items<S: Store>(
    p: &Planning<'_, S>,
    route: &str,
    work: Work,
) -> Result<Vec<String>, JobError> {
    let mut items = Vec::new();
    let too_many = || {
        JobError::BadRequest(format!(
            "more than {MAX_ITEMS} items match; narrow the filter"
        ))
    };
    match work {
        Work::Replay(mut q) => loop {
            let page = p.store.recent(&q).await?;
            items.extend(page.items.iter().map(|(_, e)| e.key.clone()));
            if items.len() > MAX_ITEMS {
                return Err(too_many());
            }
            match page.next {
                Some(c) => q.cursor = Some(c),
                None => break,
            }
        },
        Work::Redrive(contains, older) => {
            let before = older.map(|d| unix_millis().saturating_sub(ms(d)));
            let mut cursor: Option<String> = None;
            loop {
                let page = p
                    .backend
                    .list_dead_letters(route, PAGE, cursor.as_deref())
                    .await?;
                for d in &page.items {
                    if contains
                        .as_ref()
                        .is_none_or(|c| d.last_error.contains(c.as_str()))
                        && before.is_none_or(|b| d.dead_at <= b)
                    {
                        items.push(d.id.clone());
                    }
                }
                if items.len() > MAX_ITEMS {
                    return Err(too_many());
                }
                match page.next {
                    Some(c) => cursor = Some(c),
                    None => break,
                }
            }
        }
    }
    Ok(items)
}

/// Runs, resumes and takes over jobs for one sidecar.
pub struct JobRunner<S> {
    gate: Arc<Gate<S>>,
    backend: Arc<dyn QueueBackend>,
    queue: Option<Arc<AsyncMode>>,
    async_routes: Vec<String>,
    /// This process's runner name: its consumer name and a nonce, so a restarted
    /// process (same pod name) never mistakes an old run's job for its own.
    me: String,
    /// The jobs this process runs now (never two runners of one job here).
    running: std::sync::Mutex<std::collections::HashSet<String>>,
    stop: CancellationToken,
    tasks: TaskTracker,
}

impl<S: Store> JobRunner<S> {
    pub fn new(
        gate: Arc<Gate<S>>,
        backend: Arc<dyn QueueBackend>,
        queue: Option<Arc<AsyncMode>>,
    ) -> Arc<JobRunner<S>> {
        let async_routes = queue
            .as_ref()
            .map(|q| q.async_routes().map(str::to_string).collect())
            .unwrap_or_default();
        Arc::new(JobRunner {
            gate,
            backend,
            queue,
            async_routes,
            me: format!(
                "{}:{}",
                crate::queue::consumer_name(),
                &crate::store::Token::random().to_hex()[..8]
            ),
            running: Default::default(),
            stop: CancellationToken::new(),
            tasks: TaskTracker::new(),
        })
    }

    pub fn backend(&self) -> &dyn QueueBackend {
        &*self.backend
    }

    /// Starts a job: reads its work list, stores it, runs it in the background; or,
    /// retried with the same idempotency key, answers the job the first try created.
    pub async fn start(self: &Arc<Self>, req: &JobRequest<'_>) -> Result<JobRecord, JobError> {
        // The routes in force (a live reload may have added or removed some).
        let routes: Vec<String> = (self.gate.live().load().config().routes.iter())
            .map(|r| r.name.clone())
            .collect();
        let planning = Planning {
            store: self.gate.store(),
            backend: &*self.backend,
            routes: &routes,
            async_routes: &self.async_routes,
        };
        let (job, _) = create(&planning, req, &self.me).await?;
        // Ours (created now, or by a try whose answer was lost): run it here, once;
        // another sidecar's is run there, or taken over when its beat stops.
        if job.owner == self.me && job.state == JobState::Running {
            self.spawn(job.clone());
        }
        Ok(job)
    }

    /// Starts an interrupted or failed job again: it finishes the items not yet acted on.
    pub async fn restart(self: &Arc<Self>, id: &str) -> Result<JobRecord, JobError> {
        let job = self.backend.job_get(id).await?.ok_or(JobError::NotFound)?;
        if !self.backend.job_take(id, &self.me, STALE, true).await? {
            return Err(JobError::Conflict(match job.state {
                JobState::Done => "the job is done".into(),
                _ => "the job is running (its sidecar is alive)".into(),
            }));
        }
        let job = self.backend.job_get(id).await?.ok_or(JobError::NotFound)?;
        self.spawn(job.clone());
        Ok(job)
    }

    fn spawn(self: &Arc<Self>, job: JobRecord) {
        if !self
            .running
            .lock()
            .map(|mut r| r.insert(job.id.clone()))
            .unwrap_or(false)
        {
            return;
        }
        let this = self.clone();
        self.tasks.spawn(async move {
            let id = job.id.clone();
            this.clone().run(job).await;
            if let Ok(mut r) = this.running.lock() {
                r.remove(&id);
            }
        });
    }

    /// Looks for jobs whose sidecar died, every few seconds, and finishes them.
    pub fn start_sweeper(self: &Arc<Self>) {
        let this = self.clone();
        self.tasks.spawn(async move {
            loop {
                tokio::select! {
                    _ = this.stop.cancelled() => return,
                    _ = tokio::time::sleep(SWEEP) => {}
                }
                let Ok(jobs) = this.backend.job_list(SWEPT).await else {
                    continue;
                };
                let now = unix_millis();
                for j in jobs {
                    if j.state == JobState::Running
                        && now.saturating_sub(j.beat) >= ms(STALE)
                        && let Ok(true) = this.backend.job_take(&j.id, &this.me, STALE, false).await
                    {
                        tracing::info!(job = %j.id, from = %j.owner, "taking over a job whose sidecar stopped beating");
                        this.spawn(j);
                    }
                }
            }
        });
    }

    /// Stops the runners: their jobs stay `running` and are taken over once stale.
    pub async fn stop(&self, grace: Duration) {
        self.stop.cancel();
        self.tasks.close();
        let _ = tokio::time::timeout(grace, self.tasks.wait()).await;
    }

    /// Runs a job to its end (or until this sidecar loses it or stops).
    async fn run(self: Arc<Self>, job: JobRecord) {
        let lost = self.stop.child_token();
        let beat = {
            let (this, lost, id) = (self.clone(), lost.clone(), job.id.clone());
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        _ = lost.cancelled() => return,
                        _ = tokio::time::sleep(BEAT) => {}
                    }
                    if let Ok(false) = this.backend.job_beat(&id, &this.me, None, "").await {
                        tracing::warn!(job = %id, "this sidecar no longer runs the job");
                        lost.cancel();
                        return;
                    }
                }
            })
        };
        let end = self.work_through(&job, &lost).await;
        lost.cancel();
        let _ = beat.await;
        let (state, error) = match end {
            Ok(true) => (JobState::Done, String::new()),
            Ok(false) => return, // stopped or lost: left running, taken over when stale
            Err(e) => (JobState::Failed, e.to_string()),
        };
        match self
            .backend
            .job_beat(&job.id, &self.me, Some(state), &error)
            .await
        {
            Ok(_) => tracing::info!(job = %job.id, state = state.as_str(), "job ended"),
            Err(e) => {
                tracing::warn!(job = %job.id, error = %e, "recording the job's end failed; it is taken over when stale")
            }
        }
    }

    /// Acts on each item not yet marked; `Ok(false)` when stopped or lost first.
    async fn work_through(
        &self,
        job: &JobRecord,
        lost: &CancellationToken,
    ) -> Result<bool, StoreError> {
        let items = self.backend.job_items(&job.id).await?;
        for item in &items {
            if lost.is_cancelled() {
                return Ok(false);
            }
            // A replay is paced like the route's deliveries: the item's mark is taken
            // once the replay may start, so a job stopped while waiting leaves it free.
            let settled = match (&self.queue, job.kind.as_str()) {
                (Some(q), "replay") => q.paced(&job.route, self.item(job, item)).await,
                _ => Some(self.item(job, item).await),
            };
            match settled {
                Some(Ok(true)) => {}
                Some(Ok(false)) | None => return Ok(false),
                Some(Err(e)) => return Err(e),
            }
        }
        Ok(true)
    }

    /// Takes one item's mark and, when nobody took it before, acts on it and records
    /// the outcome; `Ok(false)` when this sidecar no longer runs the job.
    async fn item(&self, job: &JobRecord, item: &str) -> Result<bool, StoreError> {
        match self.backend.job_mark(&job.id, &self.me, item).await? {
            Mark::Fresh => {}
            Mark::Seen(m) if m == "started" => {
                let why = "interrupted: its sidecar stopped mid-item, so it is not acted on again";
                self.backend.job_settle(&job.id, item, false, why).await?;
                return Ok(true);
            }
            Mark::Seen(_) => return Ok(true),
            Mark::Lost => return Ok(false),
        }
        let outcome = match job.kind.as_str() {
            "redrive" => self.redrive(&job.route, item).await,
            _ => self.replay(&job.route, item).await,
        };
        let (ok, error) = match outcome {
            Ok(()) => (true, String::new()),
            Err(e) => (false, e),
        };
        self.backend.job_settle(&job.id, item, ok, &error).await?;
        Ok(true)
    }

    async fn redrive(&self, route: &str, id: &str) -> Result<(), String> {
        let Some(queue) = &self.queue else {
            return Err("no async routes".into());
        };
        match queue.redrive(route, id).await {
            Ok(true) => Ok(()),
            Ok(false) => Err("no such dead letter (redriven or gone)".into()),
            Err(e) => Err(e.to_string()),
        }
    }

    /// One replay under the key's claim, like a single replay.
    async fn replay(&self, route: &str, key: &str) -> Result<(), String> {
        let gate = &self.gate;
        let dkey = DeliveryKey::new(route, key);
        match replay(
            gate.store(),
            gate.upstream(),
            &dkey,
            gate.lifetimes().of(route).lease,
        )
        .await
        {
            Ok(done) if done.recorded => Ok(()),
            Ok(done) => Err(format!("{} (upstream {})", done.outcome, done.status)),
            Err(e) => Err(e.to_string()),
        }
    }
}
