//! `idemgate routes pause|resume|list` and `idemgate jobs start|show|list`: a route as
//! a whole and operators' bulk jobs from a shell, talking to Redis directly like
//! `idemgate deliveries` (`--config` names the store; `--json` for scripts). A job
//! started here is handed to the deployment: the first sidecar that looks (within a
//! few seconds) runs it.

use std::path::Path;
use std::process::ExitCode;

use serde_json::{Map, Value, json};

use crate::config::{Config, RouteMode, StoreUrl};
use crate::deliveries::audit::audit;
use crate::deliveries::jobs::{self, JobError, JobRequest, Planning, job_json};
use crate::store::jobs::Jobs;
use crate::store::pacing::Pacing;
use crate::store::queue::QueueBackend;
use crate::store::{RedisQueue, RedisStore, unix_millis};

#[derive(clap::Args, Debug)]
pub struct RoutesArgs {
    #[command(subcommand)]
    command: RoutesCommand,
    /// Print JSON instead of text.
    #[arg(long, global = true)]
    json: bool,
}

#[derive(clap::Subcommand, Debug)]
enum RoutesCommand {
    /// Every route: mode, paused, queue depth, dead letters.
    List,
    /// Pause an async route for every sidecar: deliveries are acknowledged and queued,
    /// none is delivered.
    Pause { route: String },
    /// Resume a paused route: its queue drains at the route's throttled pace.
    Resume { route: String },
}

#[derive(clap::Args, Debug)]
pub struct JobsArgs {
    #[command(subcommand)]
    command: JobsCommand,
    /// Print JSON instead of text.
    #[arg(long, global = true)]
    json: bool,
}

#[derive(clap::Subcommand, Debug)]
enum JobsCommand {
    /// Start a bulk job (or, with --id, start an interrupted or failed one again).
    Start {
        /// redrive | replay
        #[arg(long, required_unless_present = "id")]
        kind: Option<String>,
        #[arg(long, required_unless_present = "id")]
        route: Option<String>,
        /// The filter as JSON, e.g. '{"status": "completed"}' (replay: status, outcome,
        /// since, until; redrive: error_contains, older_than). Empty: everything.
        #[arg(long)]
        filter: Option<String>,
        /// An existing job to start again: it finishes the items not yet acted on.
        #[arg(long, conflicts_with_all = ["kind", "route", "filter", "idempotency_key"])]
        id: Option<String>,
        /// The start's idempotency key: every start with it is the one job it created.
        /// Default: a new one per invocation, reused on this invocation's retries (and
        /// printed when they all fail, to run the same start again).
        #[arg(long)]
        idempotency_key: Option<String>,
    },
    /// One job's state and progress.
    Show { id: String },
    /// The newest jobs.
    List,
}

/// How many times `jobs start` tries when the store fails, with the same idempotency
/// key, pausing `RETRY_PAUSE` times the tries so far in between.
const START_TRIES: u32 = 3;
const RETRY_PAUSE: std::time::Duration = std::time::Duration::from_millis(500);

fn who() -> String {
    format!(
        "cli:{}",
        std::env::var("USER").unwrap_or_else(|_| "unknown".into())
    )
}

fn fail(cmd: &str, msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("idemgate {cmd}: {msg}");
    ExitCode::from(1)
}

fn print_json(v: &Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string())
    );
}

/// Runs `f` on the configured Redis store and its queue: the setup every operator
/// command shares (`idemgate deliveries`, `routes`, `jobs`).
pub(super) fn with_redis<F>(cmd: &str, config: Option<&Path>, f: F) -> ExitCode
where
    F: AsyncFnOnce(&Config, &RedisStore, &RedisQueue) -> ExitCode,
{
    let config = match crate::providers::load(config) {
        Ok((c, _routes)) => c,
        Err(e) => return fail(cmd, format!("invalid configuration: {e}")),
    };
    match config.store.url {
        StoreUrl::Redis(_) => {}
        StoreUrl::Memory => {
            return fail(
                cmd,
                "the store is the in-memory store: it lives inside one sidecar, with nothing shared to read or change from here (use that sidecar's admin API, or configure [store] url = \"redis://…\")",
            );
        }
        StoreUrl::File(_) => {
            return fail(
                cmd,
                "the store is a file store: one sidecar owns its directory, with nothing shared to read or change from here (use that sidecar's admin API)",
            );
        }
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return fail(cmd, e),
    };
    runtime.block_on(async {
        // The connection is prepared inside the runtime (it spawns its driver there).
        let store = match RedisStore::from_config(&config) {
            Ok(s) => s,
            Err(e) => return fail(cmd, e),
        };
        let queue = RedisQueue::new(store.clone());
        f(&config, &store, &queue).await
    })
}

fn async_routes(config: &Config) -> Vec<String> {
    config
        .routes
        .iter()
        .filter(|r| matches!(r.mode, RouteMode::Async(_)))
        .map(|r| r.name.clone())
        .collect()
}

/// Runs `idemgate routes …`.
pub fn routes_main(config: Option<&Path>, args: RoutesArgs) -> ExitCode {
    with_redis("routes", config, async |config, _store, queue| {
        let asyncs = async_routes(config);
        match args.command {
            RoutesCommand::List => {
                let mut rows = Vec::new();
                for r in &config.routes {
                    let is_async = asyncs.contains(&r.name);
                    let (state, stats) = if is_async {
                        match (queue.route_state(&r.name).await, queue.stats(&r.name).await) {
                            (Ok(s), Ok(q)) => (s, q),
                            (Err(e), _) | (_, Err(e)) => return fail("routes", e),
                        }
                    } else {
                        Default::default()
                    };
                    rows.push(json!({
                        "route": r.name,
                        "mode": if is_async { "async" } else { "sync" },
                        "paused": state.paused,
                        "queue_depth": stats.depth,
                        "dead_letters": stats.dead_letters,
                        "held_for_ms": state.held_for.map(|d| d.as_millis() as u64),
                    }));
                }
                if args.json {
                    print_json(&json!({ "routes": rows }));
                } else {
                    println!(
                        "{:<24} {:<6} {:<7} {:>11} {:>12}",
                        "ROUTE", "MODE", "PAUSED", "QUEUE DEPTH", "DEAD LETTERS"
                    );
                    for r in &rows {
                        println!(
                            "{:<24} {:<6} {:<7} {:>11} {:>12}",
                            r["route"].as_str().unwrap_or(""),
                            r["mode"].as_str().unwrap_or(""),
                            if r["paused"] == true { "yes" } else { "no" },
                            r["queue_depth"],
                            r["dead_letters"],
                        );
                    }
                }
                ExitCode::SUCCESS
            }
            RoutesCommand::Pause { route } | RoutesCommand::Resume { route }
                if !asyncs.contains(&route) =>
            {
                fail(
                    "routes",
                    format!(
                        "`{route}` is not an async route of this configuration: only a mode = \"async\" route can be paused"
                    ),
                )
            }
            RoutesCommand::Pause { route } => set_paused(queue, &route, true, args.json).await,
            RoutesCommand::Resume { route } => set_paused(queue, &route, false, args.json).await,
        }
    })
}

async fn set_paused(queue: &RedisQueue, route: &str, paused: bool, as_json: bool) -> ExitCode {
    let action = if paused { "pause" } else { "resume" };
    match queue.set_paused(route, paused).await {
        Ok(()) => {
            audit(&who(), action, route, "-", "ok");
            if as_json {
                print_json(&json!({ "route": route, "paused": paused }));
            } else {
                println!("{route}: {}", if paused { "paused" } else { "resumed" });
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            audit(&who(), action, route, "-", "store_error");
            fail("routes", e)
        }
    }
}

fn job_text(j: &Value) -> String {
    format!(
        "{}  {:<7} {:<16} {:<11} {}/{} done, {} failed{}",
        j["id"].as_str().unwrap_or(""),
        j["kind"].as_str().unwrap_or(""),
        j["route"].as_str().unwrap_or(""),
        j["state"].as_str().unwrap_or(""),
        j["done"],
        j["total"],
        j["failed"],
        match j["error"].as_str() {
            Some(e) if !e.is_empty() => format!(" (last error: {e})"),
            _ => String::new(),
        }
    )
}

/// Runs `idemgate jobs …`.
pub fn jobs_main(config: Option<&Path>, args: JobsArgs) -> ExitCode {
    with_redis("jobs", config, async |config, store, queue| {
        let now = unix_millis();
        let show = |v: &Value| {
            if args.json {
                print_json(v)
            } else {
                println!("{}", job_text(v))
            }
        };
        match args.command {
            JobsCommand::Start { id: Some(id), .. } => {
                match queue.job_take(&id, "", jobs::STALE, true).await {
                    Ok(true) => {}
                    Ok(false) => {
                        return fail(
                            "jobs",
                            "the job is done, running (its sidecar is alive), or gone",
                        );
                    }
                    Err(e) => return fail("jobs", e),
                }
                audit(&who(), "job", "-", &id, "started again");
                match queue.job_get(&id).await {
                    Ok(Some(j)) => show(&job_json(&j, now)),
                    Ok(None) => return fail("jobs", "no such job"),
                    Err(e) => return fail("jobs", e),
                }
                ExitCode::SUCCESS
            }
            JobsCommand::Start {
                kind,
                route,
                filter,
                idempotency_key,
                ..
            } => {
                let filter: Map<String, Value> =
                    match filter.as_deref().map(serde_json::from_str::<Value>) {
                        None => Map::new(),
                        Some(Ok(Value::Object(m))) => m,
                        Some(_) => return fail("jobs", "--filter must be a JSON object"),
                    };
                let names: Vec<String> = config.routes.iter().map(|r| r.name.clone()).collect();
                let asyncs = async_routes(config);
                let planning = Planning {
                    store,
                    backend: queue as &dyn QueueBackend,
                    routes: &names,
                    async_routes: &asyncs,
                };
                let (kind, route) = (kind.unwrap_or_default(), route.unwrap_or_default());
                let key = idempotency_key.unwrap_or_else(|| crate::store::Token::random().to_hex());
                let req = JobRequest {
                    kind: &kind,
                    route: &route,
                    filter: &filter,
                    key: Some(&key),
                };
                let mut tries = 0;
                let (job, new) = loop {
                    tries += 1;
                    match jobs::create(&planning, &req, "").await {
                        Ok(created) => break created,
                        Err(JobError::Store(e)) if tries < START_TRIES => {
                            eprintln!("idemgate jobs: {e}; trying again");
                            tokio::time::sleep(RETRY_PAUSE * tries).await;
                        }
                        Err(JobError::Store(e)) => {
                            return fail(
                                "jobs",
                                format!(
                                    "{e} (run the same start with --idempotency-key {key}: it is the job this one may have created, never a second)"
                                ),
                            );
                        }
                        Err(e) => return fail("jobs", e),
                    }
                };
                let what = if new { "started" } else { "already started" };
                audit(
                    &who(),
                    "job",
                    &route,
                    &job.id,
                    &format!("{kind} {what} ({} items)", job.total),
                );
                show(&job_json(&job, now));
                ExitCode::SUCCESS
            }
            JobsCommand::Show { id } => match queue.job_get(&id).await {
                Ok(Some(j)) => {
                    show(&job_json(&j, now));
                    ExitCode::SUCCESS
                }
                Ok(None) => fail("jobs", "no such job"),
                Err(e) => fail("jobs", e),
            },
            JobsCommand::List => match queue.job_list(100).await {
                Ok(list) => {
                    let list: Vec<Value> = list.iter().map(|j| job_json(j, now)).collect();
                    if args.json {
                        print_json(&json!({ "jobs": list }));
                    } else {
                        for j in &list {
                            println!("{}", job_text(j));
                        }
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => fail("jobs", e),
            },
        }
    })
}
