//! The console's page for protecting the application: every route's mode, pause,
//! queue, dead letters and Retry-After hold, with Pause/Resume on async routes, and
//! the operators' bulk jobs (redrive, replay) with a form to start one. Like every
//! console action: page → confirmation page → POST with the session's CSRF token →
//! a result page. The work itself is `control`'s, shared with the JSON API.

use std::collections::HashMap;
use std::fmt::Write;

use http::StatusCode;
use http_body_util::BodyExt;
use serde_json::{Map, Value, json};

use super::pages::{esc, page, when};
use super::{Answer, Caller, Console, Operator, control, seg};
use crate::deliveries::jobs::job_json;
use crate::store::{Store, unix_millis};

/// Where the routes and jobs are shown.
const HOME: &str = "/admin/routes-page";
/// How many jobs the page lists (newest first).
const JOBS_SHOWN: usize = 50;
/// The filter fields each job kind takes (`deliveries::jobs` checks them again).
const REPLAY_FIELDS: [&str; 4] = ["status", "outcome", "since", "until"];
/// The same for a redrive.
const REDRIVE_FIELDS: [&str; 2] = ["error_contains", "older_than"];
/// The filter fields given in Unix milliseconds (sent as JSON numbers).
const MILLIS_FIELDS: [&str; 2] = ["since", "until"];

/// A `control` answer's status and JSON body, to be shown as HTML.
async fn read_answer(a: Answer) -> (StatusCode, Value) {
    let status = a.status();
    let bytes = a
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

/// The message of an error answer (`json_error`'s `{"error", "message"}`).
fn error_text(v: &Value) -> String {
    let code = v.get("error").and_then(Value::as_str).unwrap_or("error");
    let message = v.get("message").and_then(Value::as_str).unwrap_or("");
    format!("{message} ({code})")
}

/// A result page: what happened, and the way back.
fn result(status: StatusCode, caller: &Caller, title: &str, text_html: &str) -> Answer {
    let class = if status.is_success() { "note" } else { "warn" };
    let body = format!(
        "<h1>{}</h1><p class={class} id=done>{text_html}</p>\
         <p><a class=\"button plain\" id=back href=\"{HOME}\">Back to routes and jobs</a> \
         <a class=\"button plain\" href=\"/admin/\">Back to the list</a></p>",
        esc(title)
    );
    page(status, title, Some(caller), &body)
}

/// The CSRF token as a hidden form field.
fn csrf_field(caller: &Caller) -> String {
    format!(
        "<input type=hidden name=csrf value=\"{}\">",
        esc(caller.csrf.as_deref().unwrap_or(""))
    )
}

/// A job state as a badge, coloured like the delivery states.
fn state_badge(state: &str) -> String {
    let class = match state {
        "done" => "completed",
        "running" => "processing",
        _ => "released",
    };
    format!("<span class=\"badge {class}\">{}</span>", esc(state))
}

/// A JSON field as text (`-` when missing).
fn text(v: &Value, k: &str) -> String {
    match v.get(k) {
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        Some(Value::String(_)) | Some(Value::Null) | None => "-".into(),
        Some(other) => other.to_string(),
    }
}

/// A JSON count (0 when missing).
fn num(v: &Value, k: &str) -> u64 {
    v.get(k).and_then(Value::as_u64).unwrap_or(0)
}

/// The routes section: one row per configured route, Pause/Resume on async ones.
async fn routes_section<S: Store>(console: &Console, op: &Operator<'_, S>, body: &mut String) {
    body.push_str("<h2 id=routes>Routes</h2>");
    let v = match control::routes_json(op, &console.routes()).await {
        Ok(v) => v,
        Err(e) => {
            let _ = write!(body, "<p class=warn>store: {}</p>", esc(&e.to_string()));
            return;
        }
    };
    body.push_str(
        "<table><thead><tr><th>Route</th><th>Mode</th><th>Paused</th><th>Queue depth</th>\
         <th>Dead letters</th><th>Held</th><th>Action</th></tr></thead><tbody>",
    );
    let empty = Vec::new();
    for r in v["routes"].as_array().unwrap_or(&empty) {
        let name = r["route"].as_str().unwrap_or("");
        let is_async = r["mode"] == "async";
        let paused = r["paused"] == true;
        let held = match r.get("held_for_ms").and_then(Value::as_u64) {
            Some(ms) if ms > 0 => format!("held for {} s", ms.div_ceil(1000)),
            _ => "-".into(),
        };
        let action = if is_async {
            let (a, label) = if paused {
                ("resume", "Resume…")
            } else {
                ("pause", "Pause…")
            };
            format!(
                "<a class=\"button{}\" id=\"{a}-{}\" href=\"{HOME}/{}/confirm?action={a}\">{label}</a>",
                if paused { "" } else { " danger" },
                esc(name),
                seg(name)
            )
        } else {
            "<small>sync routes are not paused</small>".into()
        };
        let _ = write!(
            body,
            "<tr class=route data-route=\"{}\"><td>{}</td><td>{}</td><td>{}</td><td class=num>{}</td>\
             <td class=num>{}</td><td>{}</td><td>{action}</td></tr>",
            esc(name),
            esc(name),
            if is_async { "async" } else { "sync" },
            if paused { "yes" } else { "no" },
            num(r, "queue_depth"),
            num(r, "dead_letters"),
            esc(&held),
        );
    }
    body.push_str("</tbody></table>");
}

/// The jobs section: the newest jobs, and the form that starts one.
async fn jobs_section<S: Store>(console: &Console, op: &Operator<'_, S>, body: &mut String) {
    body.push_str("<h2 id=jobs>Jobs</h2>");
    let Some(jobs) = op.jobs else {
        body.push_str(
            "<p class=warn>This sidecar runs no bulk jobs (its store keeps no queue).</p>",
        );
        return;
    };
    let mut routes = String::new();
    for r in &console.routes() {
        let _ = write!(routes, "<option>{}</option>", esc(r));
    }
    let mut statuses = String::from("<option value=\"\">any</option>");
    for s in ["processing", "completed", "released"] {
        let _ = write!(statuses, "<option>{s}</option>");
    }
    let mut outcomes = String::from("<option value=\"\">any</option>");
    for o in [
        "forwarded",
        "upstream_error",
        "operator_replay",
        "operator_replay_failed",
    ] {
        let _ = write!(outcomes, "<option>{o}</option>");
    }
    let _ = write!(
        body,
        "<form class=filters style=\"flex-wrap:wrap\" method=get action=\"/admin/jobs-page/confirm\">\
         <label>Kind<select name=kind><option>redrive</option><option>replay</option></select></label>\
         <label>Route<select name=route>{routes}</select></label>\
         <label>Error contains (redrive)<input name=error_contains size=16></label>\
         <label>Older than (redrive)<input name=older_than size=6 placeholder=1h></label>\
         <label>Status (replay)<select name=status>{statuses}</select></label>\
         <label>Last outcome (replay)<select name=outcome>{outcomes}</select></label>\
         <label>Since (replay, Unix ms)<input name=since size=14 inputmode=numeric></label>\
         <label>Until (replay, Unix ms)<input name=until size=14 inputmode=numeric></label>\
         <button type=submit id=start-job>Start a job…</button></form>\
         <p><small>Empty fields are left out of the filter; the fields of the other kind are ignored.</small></p>"
    );
    let list = match jobs.backend().job_list(JOBS_SHOWN).await {
        Ok(l) => l,
        Err(e) => {
            let _ = write!(body, "<p class=warn>store: {}</p>", esc(&e.to_string()));
            return;
        }
    };
    body.push_str(
        "<table><thead><tr><th>Job</th><th>Kind</th><th>Route</th><th>State</th><th>Done / total</th>\
         <th>Failed</th><th>Last error</th><th>Created</th></tr></thead><tbody>",
    );
    if list.is_empty() {
        body.push_str("<tr><td colspan=8>No jobs.</td></tr>");
    }
    let now = unix_millis();
    for j in &list {
        let v = job_json(j, now);
        let _ = write!(
            body,
            "<tr class=job data-job=\"{0}\"><td><a href=\"/admin/job/{1}\"><code>{0}</code></a></td>\
             <td>{2}</td><td>{3}</td><td>{4}</td><td class=num>{5} / {6}</td><td class=num>{7}</td>\
             <td>{8}</td><td>{9}</td></tr>",
            esc(&j.id),
            seg(&j.id),
            esc(&j.kind),
            esc(&j.route),
            state_badge(&text(&v, "state")),
            j.done,
            j.total,
            j.failed,
            esc(&text(&v, "error")),
            when(j.created),
        );
    }
    body.push_str("</tbody></table>");
}

/// `GET /admin/routes-page`: the routes and the jobs.
pub(crate) async fn overview<S: Store>(
    console: &Console,
    op: &Operator<'_, S>,
    caller: &Caller,
) -> Answer {
    let mut body = String::from(
        "<h1>Routes and jobs</h1><p><a href=\"/admin/\">← Deliveries</a></p>\
         <p class=note>Pausing an async route stops its workers in every sidecar: providers are \
         still acknowledged and deliveries wait in the queue until it is resumed.</p>",
    );
    routes_section(console, op, &mut body).await;
    jobs_section(console, op, &mut body).await;
    page(StatusCode::OK, "Routes and jobs", Some(caller), &body)
}

/// `GET /admin/routes-page/{route}/confirm?action=pause|resume`.
pub(crate) fn confirm_pause(
    console: &Console,
    caller: &Caller,
    route: &str,
    action: &str,
) -> Answer {
    let explain = match action {
        "pause" => {
            "Every sidecar's workers stop taking this route's deliveries: the provider is still acknowledged, and deliveries wait in the queue until the route is resumed."
        }
        "resume" => {
            "Every sidecar's workers deliver this route's queue again, paced as configured."
        }
        _ => return super::not_found(),
    };
    if !console.routes().iter().any(|r| r == route) {
        return super::not_found();
    }
    let body = format!(
        "<h1>{} route <code>{}</code>?</h1><p class=warn>{}</p>\
         <form method=post action=\"{HOME}/{}/{action}\">{}\
         <button type=submit id=confirm class=\"{}\">Yes, {action}</button> \
         <a class=\"button plain\" href=\"{HOME}\">Cancel</a></form>",
        if action == "pause" { "Pause" } else { "Resume" },
        esc(route),
        esc(explain),
        seg(route),
        csrf_field(caller),
        if action == "pause" { "danger" } else { "" },
    );
    page(StatusCode::OK, "Confirm", Some(caller), &body)
}

/// `POST /admin/routes-page/{route}/pause|resume` (CSRF checked by the caller).
pub(crate) async fn set_paused<S: Store>(
    console: &Console,
    op: &Operator<'_, S>,
    caller: &Caller,
    route: &str,
    paused: bool,
) -> Answer {
    let a = control::set_paused(op, caller, &console.routes(), route, paused).await;
    let (status, v) = read_answer(a).await;
    if status.is_success() {
        let text = format!(
            "Route <code>{}</code> is {} now.",
            esc(route),
            if paused { "paused" } else { "resumed" }
        );
        result(StatusCode::OK, caller, "Done", &text)
    } else {
        result(status, caller, "Refused", &esc(&error_text(&v)))
    }
}

/// The confirm form's idempotency key for the job it starts.
const KEY_FIELD: &str = "idempotency_key";

/// The job request `control::start_job` takes, from the start form's fields: only the
/// kind's own filter fields, empty ones left out, `since`/`until` as numbers.
fn job_request(fields: &HashMap<String, String>) -> Map<String, Value> {
    let get = |k: &str| fields.get(k).map(|v| v.trim()).unwrap_or("");
    let kind = get("kind");
    let keys: &[&str] = match kind {
        "replay" => &REPLAY_FIELDS,
        "redrive" => &REDRIVE_FIELDS,
        _ => &[],
    };
    let mut filter = Map::new();
    for k in keys {
        let v = get(k);
        if v.is_empty() {
            continue;
        }
        let v = match v.parse::<u64>() {
            Ok(n) if MILLIS_FIELDS.contains(k) => Value::from(n),
            _ => Value::from(v),
        };
        filter.insert(k.to_string(), v);
    }
    let mut req = Map::new();
    req.insert("kind".into(), Value::from(kind));
    req.insert("route".into(), Value::from(get("route")));
    req.insert("filter".into(), Value::Object(filter));
    req
}

/// `GET /admin/jobs-page/confirm?kind=…&route=…&…`: what the job will do, and the
/// form (with the CSRF token) that starts it.
pub(crate) fn confirm_job(
    console: &Console,
    caller: &Caller,
    fields: &HashMap<String, String>,
) -> Answer {
    let req = job_request(fields);
    let kind = req["kind"].as_str().unwrap_or("");
    let route = req["route"].as_str().unwrap_or("");
    let explain = match kind {
        "redrive" => {
            "Every dead letter of the route matching the filter is queued again, for the workers to deliver."
        }
        "replay" => {
            "Every delivery of the route matching the filter is sent to the application again, one at a time, paced like the route's deliveries, each under its key's claim."
        }
        _ => {
            return result(
                StatusCode::BAD_REQUEST,
                caller,
                "Refused",
                "A job's kind is redrive or replay.",
            );
        }
    };
    if !console.routes().iter().any(|r| r == route) {
        return result(
            StatusCode::BAD_REQUEST,
            caller,
            "Refused",
            &format!("There is no route named <code>{}</code>.", esc(route)),
        );
    }
    let mut hidden = csrf_field(caller);
    let _ = write!(
        hidden,
        "<input type=hidden name={KEY_FIELD} value=\"{}\">",
        crate::store::Token::random().to_hex()
    );
    let mut shown = String::new();
    for (k, v) in [("kind", kind), ("route", route)] {
        let _ = write!(hidden, "<input type=hidden name={k} value=\"{}\">", esc(v));
    }
    let filter = req["filter"].as_object().cloned().unwrap_or_default();
    for (k, v) in &filter {
        let v = v
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| v.to_string());
        let _ = write!(
            hidden,
            "<input type=hidden name=\"{}\" value=\"{}\">",
            esc(k),
            esc(&v)
        );
        let _ = write!(
            shown,
            "<tr><th>{}</th><td><code>{}</code></td></tr>",
            esc(k),
            esc(&v)
        );
    }
    if shown.is_empty() {
        shown.push_str("<tr><td colspan=2>No filter: every item of the route.</td></tr>");
    }
    let body = format!(
        "<h1>Start a {kind} job on <code>{}</code>?</h1><p class=warn>{}</p>\
         <h2>Filter</h2><table>{shown}</table>\
         <form method=post action=\"/admin/jobs-page/start\">{hidden}\
         <p><button type=submit id=confirm>Yes, start the job</button> \
         <a class=\"button plain\" href=\"{HOME}\">Cancel</a></p></form>",
        esc(route),
        esc(explain),
    );
    page(StatusCode::OK, "Confirm", Some(caller), &body)
}

/// A started (or refused) job as a result page.
async fn job_result(caller: &Caller, a: Answer) -> Answer {
    let (status, v) = read_answer(a).await;
    if status != StatusCode::ACCEPTED {
        return result(status, caller, "Refused", &esc(&error_text(&v)));
    }
    let id = text(&v, "id");
    let text = format!(
        "Job <code>{}</code> started ({} items). <a href=\"/admin/job/{}\">Follow its progress</a>.",
        esc(&id),
        num(&v, "total"),
        seg(&id)
    );
    result(StatusCode::OK, caller, "Job started", &text)
}

/// `POST /admin/jobs-page/start` (CSRF checked by the caller).
pub(crate) async fn start_job<S: Store>(
    op: &Operator<'_, S>,
    caller: &Caller,
    fields: &HashMap<String, String>,
) -> Answer {
    let req = job_request(fields);
    // The confirm page's key: its form sent twice is one job.
    let key = fields.get(KEY_FIELD).map(String::as_str);
    job_result(caller, control::start_job(op, caller, &req, key).await).await
}

/// `POST /admin/job/{id}/restart` (CSRF checked by the caller): an interrupted or
/// failed job finishes the items not yet acted on.
pub(crate) async fn restart_job<S: Store>(
    op: &Operator<'_, S>,
    caller: &Caller,
    id: &str,
) -> Answer {
    let mut req = Map::new();
    req.insert("id".into(), Value::from(id));
    job_result(caller, control::start_job(op, caller, &req, None).await).await
}

/// `GET /admin/job/{id}`: one job's progress; "Start again" when it stopped short.
pub(crate) async fn job<S: Store>(op: &Operator<'_, S>, caller: &Caller, id: &str) -> Answer {
    let found = match op.jobs {
        Some(jobs) => jobs.backend().job_get(id).await,
        None => Ok(None),
    };
    let j = match found {
        Ok(Some(j)) => j,
        Ok(None) => {
            return result(StatusCode::NOT_FOUND, caller, "Not found", "No such job.");
        }
        Err(e) => {
            return result(
                StatusCode::SERVICE_UNAVAILABLE,
                caller,
                "Store unavailable",
                &esc(&e.to_string()),
            );
        }
    };
    let v = job_json(&j, unix_millis());
    let state = text(&v, "state");
    let filter = v.get("filter").cloned().unwrap_or(json!(null));
    let mut body = format!(
        "<h1>Job <code>{}</code></h1><p><progress max=\"{}\" value=\"{}\"></progress> \
         {} of {} items acted on ({} failed). Reload the page for its progress.</p><table>",
        esc(&j.id),
        j.total.max(1),
        if j.total == 0 { 1 } else { j.done + j.failed },
        j.done + j.failed,
        j.total,
        j.failed,
    );
    let fields: [(&str, String); 9] = [
        ("Kind", esc(&j.kind)),
        ("Route", esc(&j.route)),
        (
            "Filter",
            format!("<code>{}</code>", esc(&filter.to_string())),
        ),
        ("State", state_badge(&state)),
        ("Done / total", format!("{} / {}", j.done, j.total)),
        ("Failed", j.failed.to_string()),
        ("Last error", esc(&text(&v, "error"))),
        ("Runner", esc(&text(&v, "owner"))),
        ("Created", when(j.created)),
    ];
    for (k, v) in fields {
        let _ = write!(body, "<tr><th>{k}</th><td>{v}</td></tr>");
    }
    body.push_str("</table><p>");
    if state == "interrupted" || state == "failed" {
        let _ = write!(
            body,
            "<a class=button id=restart href=\"/admin/job/{}/confirm\">Start again…</a> ",
            seg(&j.id)
        );
    }
    let _ = write!(
        body,
        "<a class=\"button plain\" href=\"{HOME}#jobs\">Back</a></p>"
    );
    page(StatusCode::OK, "Job", Some(caller), &body)
}

/// `GET /admin/job/{id}/confirm`: starting an interrupted or failed job again.
pub(crate) fn confirm_restart(caller: &Caller, id: &str) -> Answer {
    let body = format!(
        "<h1>Start job <code>{}</code> again?</h1><p class=warn>This sidecar takes the job \
         over and finishes the items not yet acted on; an item whose runner stopped in the \
         middle of it is counted failed, never acted on twice.</p>\
         <form method=post action=\"/admin/job/{1}/restart\">{2}\
         <button type=submit id=confirm>Yes, start again</button> \
         <a class=\"button plain\" href=\"/admin/job/{1}\">Cancel</a></form>",
        esc(id),
        seg(id),
        csrf_field(caller),
    );
    page(StatusCode::OK, "Confirm", Some(caller), &body)
}
