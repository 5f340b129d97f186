//! The admin API for routes as a whole and bulk jobs (docs/operating.md):
//! `GET /admin/routes`, `POST /admin/routes/{route}/pause|resume`, `POST /admin/jobs`,
//! `GET /admin/jobs`, `GET /admin/jobs/{id}`. The web page calls the same functions.

use bytes::Bytes;
use http::{HeaderMap, Method, StatusCode};
use serde_json::{Map, Value, json};

use super::{Answer, Caller, Operator, json, json_error};
use crate::deliveries::audit::audit;
use crate::deliveries::jobs::{JobError, JobRequest, job_json};
use crate::store::{Store, StoreError, unix_millis};

/// The largest job request read.
pub const MAX_BODY: usize = 64 * 1024;

fn store_error(e: &StoreError) -> Answer {
    json_error(
        StatusCode::SERVICE_UNAVAILABLE,
        "store_unavailable",
        &e.to_string(),
    )
}

/// Every configured route: its mode, paused state, queue depth and dead letters.
pub(crate) async fn routes_json<S: Store>(
    op: &Operator<'_, S>,
    routes: &[String],
) -> Result<Value, StoreError> {
    let mut out = Vec::with_capacity(routes.len());
    for r in routes {
        let view = match op.queue {
            Some(q) => q.overview(r).await?,
            None => None,
        };
        out.push(match view {
            Some(v) => json!({
                "route": r,
                "mode": "async",
                "paused": v.state.paused,
                "queue_depth": v.queue_depth,
                "dead_letters": v.dead_letters,
                "held_for_ms": v.state.held_for.map(|d| d.as_millis() as u64),
                "in_flight": v.state.in_flight,
            }),
            None => json!({
                "route": r,
                "mode": "sync",
                "paused": false,
                "queue_depth": 0,
                "dead_letters": 0,
            }),
        });
    }
    Ok(json!({ "routes": out }))
}

/// Pauses or resumes an async route; the answer and the audit line.
pub(crate) async fn set_paused<S: Store>(
    op: &Operator<'_, S>,
    caller: &Caller,
    routes: &[String],
    route: &str,
    paused: bool,
) -> Answer {
    let action = if paused { "pause" } else { "resume" };
    if !routes.iter().any(|r| r == route) {
        audit(&caller.who, action, route, "-", "not_found");
        return json_error(StatusCode::NOT_FOUND, "not_found", "no such route");
    }
    let r = match op.queue {
        Some(q) => q.set_paused(route, paused).await,
        None => Ok(false),
    };
    match r {
        Ok(true) => {
            audit(&caller.who, action, route, "-", "ok");
            json(StatusCode::OK, &json!({ "route": route, "paused": paused }))
        }
        Ok(false) => {
            audit(&caller.who, action, route, "-", "not_async");
            json_error(
                StatusCode::CONFLICT,
                "not_async",
                "only a mode = \"async\" route can be paused: a sync route's provider waits for the answer",
            )
        }
        Err(e) => {
            audit(&caller.who, action, route, "-", "store_error");
            store_error(&e)
        }
    }
}

fn job_error(e: &JobError) -> Answer {
    let (status, code) = match e {
        JobError::BadRequest(_) => (StatusCode::BAD_REQUEST, "bad_request"),
        JobError::NotFound => (StatusCode::NOT_FOUND, "not_found"),
        JobError::Conflict(_) => (StatusCode::CONFLICT, "conflict"),
        JobError::Store(_) => (StatusCode::SERVICE_UNAVAILABLE, "store_unavailable"),
    };
    json_error(status, code, &e.to_string())
}

/// The longest idempotency key taken.
const MAX_KEY: usize = 200;

/// Starts a job from the request `{"kind", "route", "filter"}` (the same job for every
/// request with its idempotency `key`), or starts an existing one again from `{"id"}`;
/// answers 202 with the job.
pub(crate) async fn start_job<S: Store>(
    op: &Operator<'_, S>,
    caller: &Caller,
    req: &Map<String, Value>,
    key: Option<&str>,
) -> Answer {
    if key.is_some_and(|k| {
        k.is_empty() || k.len() > MAX_KEY || !k.bytes().all(|b| b.is_ascii_graphic())
    }) {
        return json_error(
            StatusCode::BAD_REQUEST,
            "bad_request",
            &format!("Idempotency-Key must be 1 to {MAX_KEY} visible ASCII characters"),
        );
    }
    let Some(jobs) = op.jobs else {
        return json_error(
            StatusCode::NOT_IMPLEMENTED,
            "no_jobs",
            "this sidecar runs no bulk jobs",
        );
    };
    let r = if let Some(id) = req.get("id") {
        let Some(id) = id.as_str() else {
            return json_error(
                StatusCode::BAD_REQUEST,
                "bad_request",
                "id must be a string",
            );
        };
        jobs.restart(id).await
    } else {
        let text = |k: &str| req.get(k).and_then(Value::as_str).unwrap_or("");
        let filter = match req.get("filter") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(m)) => m.clone(),
            Some(_) => {
                return json_error(
                    StatusCode::BAD_REQUEST,
                    "bad_request",
                    "filter must be an object",
                );
            }
        };
        if let Some(k) = req
            .keys()
            .find(|k| !["kind", "route", "filter"].contains(&k.as_str()))
        {
            return json_error(
                StatusCode::BAD_REQUEST,
                "bad_request",
                &format!("a job takes kind, route and filter (or id); not `{k}`"),
            );
        }
        let req = JobRequest {
            kind: text("kind"),
            route: text("route"),
            filter: &filter,
            key,
        };
        jobs.start(&req).await
    };
    match r {
        Ok(job) => {
            audit(
                &caller.who,
                "job",
                &job.route,
                &job.id,
                &format!("{} started ({} items)", job.kind, job.total),
            );
            json(StatusCode::ACCEPTED, &job_json(&job, unix_millis()))
        }
        Err(e) => {
            audit(&caller.who, "job", "-", "-", &format!("refused: {e}"));
            job_error(&e)
        }
    }
}

/// The JSON API's `routes` and `jobs` endpoints (`segs` after `/admin/`).
pub(crate) async fn handle<S: Store>(
    op: &Operator<'_, S>,
    caller: &Caller,
    routes: &[String],
    method: &Method,
    segs: &[&str],
    req: (&HeaderMap, Bytes),
) -> Answer {
    let (headers, body) = req;
    match (method, segs) {
        (&Method::GET, ["routes"]) => {
            audit(&caller.who, "list_routes", "-", "-", "ok");
            match routes_json(op, routes).await {
                Ok(v) => json(StatusCode::OK, &v),
                Err(e) => store_error(&e),
            }
        }
        (&Method::POST, ["routes", route, action @ ("pause" | "resume")]) => {
            set_paused(op, caller, routes, route, *action == "pause").await
        }
        (&Method::POST, ["jobs"]) => match serde_json::from_slice::<Value>(&body) {
            Ok(Value::Object(req)) => match headers.get("idempotency-key").map(|v| v.to_str()) {
                Some(Err(_)) => json_error(
                    StatusCode::BAD_REQUEST,
                    "bad_request",
                    "Idempotency-Key must be visible ASCII",
                ),
                Some(Ok(key)) => start_job(op, caller, &req, Some(key)).await,
                None => start_job(op, caller, &req, None).await,
            },
            _ => json_error(
                StatusCode::BAD_REQUEST,
                "bad_request",
                "the body must be a JSON object: {\"kind\": \"redrive\" | \"replay\", \"route\": …, \"filter\": {…}} or {\"id\": …}",
            ),
        },
        (&Method::GET, ["jobs", rest @ ..]) if rest.len() <= 1 => {
            let Some(jobs) = op.jobs else {
                return json_error(
                    StatusCode::NOT_IMPLEMENTED,
                    "no_jobs",
                    "this sidecar runs no bulk jobs",
                );
            };
            let now = unix_millis();
            match rest.first() {
                None => audit(&caller.who, "list_jobs", "-", "-", "ok"),
                Some(id) => audit(&caller.who, "show_job", "-", id, "ok"),
            }
            match rest {
                [] => match jobs.backend().job_list(100).await {
                    Ok(list) => json(
                        StatusCode::OK,
                        &json!({ "jobs": list.iter().map(|j| job_json(j, now)).collect::<Vec<_>>() }),
                    ),
                    Err(e) => store_error(&e),
                },
                [id, ..] => match jobs.backend().job_get(id).await {
                    Ok(Some(j)) => json(StatusCode::OK, &job_json(&j, now)),
                    Ok(None) => json_error(StatusCode::NOT_FOUND, "not_found", "no such job"),
                    Err(e) => store_error(&e),
                },
            }
        }
        _ => json_error(StatusCode::NOT_FOUND, "not_found", "no such admin endpoint"),
    }
}
