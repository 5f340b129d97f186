//! The console's HTML pages: server-rendered, their own small CSS, no JavaScript and
//! no external assets. Actions go detail page → confirmation page → POST (with the
//! session's CSRF token) → back to the detail page with what happened.

use std::fmt::Write;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Response, StatusCode};
use http_body_util::Full;

use super::api::list_query;
use super::{Answer, Caller, Console, Operator, query_pairs, redirect, seg};
use crate::deliveries::audit::audit;
use crate::deliveries::{self, ReplayError};
use crate::metrics::SERIES;
use crate::store::log::{Forgot, LogEntry, LogSupport};
use crate::store::{DeliveryKey, Store};

const CSS: &str = r#"
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;color:#1d2330;background:#f5f6f8}
header{background:#1d2330;color:#fff;padding:10px 24px;display:flex;align-items:center;gap:16px}
header a{color:#fff;text-decoration:none;font-weight:600}
header form{margin-left:auto}
main{padding:16px 24px;max-width:1200px}
h1{font-size:20px;margin:8px 0 12px}h2{font-size:16px;margin:20px 0 8px}
table{border-collapse:collapse;width:100%;background:#fff;border:1px solid #dde1e7}
th,td{text-align:left;padding:6px 10px;border-bottom:1px solid #eceff3;vertical-align:top}
th{background:#f0f2f5;font-weight:600;font-size:12px;text-transform:uppercase;color:#555}
td.num{text-align:right;font-variant-numeric:tabular-nums}
code,pre{font:12px ui-monospace,Menlo,Consolas,monospace}
pre{background:#fff;border:1px solid #dde1e7;padding:8px;overflow:auto;max-height:320px}
.badge{display:inline-block;padding:1px 8px;border-radius:10px;font-size:12px;font-weight:600}
.completed{background:#dff5e3;color:#17692a}.released{background:#fde8e8;color:#9b1c1c}
.processing{background:#fff4d6;color:#8a5a00}
.charts{display:flex;flex-wrap:wrap;gap:12px}
.chart{background:#fff;border:1px solid #dde1e7;padding:8px}
.legend span{margin-right:10px;font-size:12px}.legend i{display:inline-block;width:10px;height:10px;margin-right:4px}
form.filters{display:flex;gap:8px;align-items:end;margin:8px 0}
label{font-size:12px;color:#555;display:flex;flex-direction:column}
input,select,button{font:inherit;padding:4px 8px}
button,.button{background:#2456c9;color:#fff;border:0;border-radius:4px;padding:6px 14px;cursor:pointer;text-decoration:none;display:inline-block}
.button.danger,button.danger{background:#b42318}.button.plain{background:#e4e7ec;color:#1d2330}
.note{background:#eef4ff;border:1px solid #c7d7fe;padding:8px 12px;margin:8px 0}
.warn{background:#fff4e5;border:1px solid #f5c27a;padding:8px 12px;margin:8px 0}
"#;

const COLORS: [&str; 5] = ["#2456c9", "#17a34a", "#d97706", "#6b7280", "#b42318"];

/// Escapes text for HTML.
pub(crate) fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The page around a body: the header with the caller's sign-out form, the CSS and
/// the security headers every console page carries.
pub(super) fn page(status: StatusCode, title: &str, caller: Option<&Caller>, body: &str) -> Answer {
    let nav = match caller {
        Some(c) => format!(
            "<span>signed in as <b>{}</b></span><form method=post action=\"/admin/logout\">\
             <input type=hidden name=csrf value=\"{}\"><button class=\"button plain\">Sign out</button></form>",
            esc(&c.who),
            esc(c.csrf.as_deref().unwrap_or(""))
        ),
        None => String::new(),
    };
    let html = format!(
        "<!doctype html><html lang=en><head><meta charset=utf-8><title>{} · idemgate</title>\
         <meta name=viewport content=\"width=device-width,initial-scale=1\"><style>{CSS}</style></head>\
         <body><header><a href=\"/admin/\">idemgate</a>{nav}</header><main>{body}</main></body></html>",
        esc(title)
    );
    let mut r = Response::new(Full::new(Bytes::from(html)));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::HeaderName::from_static("content-security-policy"),
        HeaderValue::from_static(
            "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'",
        ),
    );
    h.insert(
        header::HeaderName::from_static("x-frame-options"),
        HeaderValue::from_static("DENY"),
    );
    r
}

pub(crate) fn message(status: StatusCode, title: &str, text: &str) -> Answer {
    page(
        status,
        title,
        None,
        &format!(
            "<h1>{}</h1><p>{}</p><p><a href=\"/admin/\">Back to the list</a></p>",
            esc(title),
            esc(text)
        ),
    )
}

/// The login form; `csrf` is also set as the `idemgate_login` cookie by the caller
/// (double submit: a cross-site page can neither read the cookie nor send it).
pub(crate) fn login(error: Option<&str>, csrf: &str) -> Answer {
    let err = error
        .map(|e| format!("<p class=warn>{}</p>", esc(e)))
        .unwrap_or_default();
    page(
        if error.is_some() {
            StatusCode::UNAUTHORIZED
        } else {
            StatusCode::OK
        },
        "Sign in",
        None,
        &format!(
            "<h1>Sign in</h1>{err}<form method=post action=\"/admin/login\"><input type=hidden name=csrf value=\"{}\">\
             <label>Admin token<input type=password name=token autocomplete=current-password autofocus required size=48></label>\
             <p><button type=submit>Sign in</button></p></form>",
            esc(csrf)
        ),
    )
}

/// A Unix-ms instant as RFC 3339 (`-` for none).
pub(super) fn when(ms: u64) -> String {
    if ms == 0 {
        return "-".into();
    }
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
    humantime::format_rfc3339_seconds(t).to_string()
}

fn badge(status: &str) -> String {
    format!("<span class=\"badge {0}\">{0}</span>", esc(status))
}

fn detail_url(route: &str, key: &str) -> String {
    format!("/admin/view/{}/{}", seg(route), seg(key))
}

/// One route's last hour as a small SVG line chart.
fn chart(route: &str, rows: &[[u64; SERIES.len()]]) -> String {
    let (w, h, pad) = (360.0f64, 110.0f64, 22.0f64);
    let max = rows.iter().flatten().copied().max().unwrap_or(0).max(1) as f64;
    let mut svg = format!(
        "<div class=chart><b>{}</b> <small>last hour, per minute</small><br>\
         <svg width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" role=img aria-label=\"{} activity\">\
         <line x1=\"{pad}\" y1=\"{}\" x2=\"{w}\" y2=\"{}\" stroke=\"#ccc\"/>\
         <text x=\"0\" y=\"10\" font-size=\"10\">{}</text><text x=\"0\" y=\"{}\" font-size=\"10\">0</text>",
        esc(route),
        esc(route),
        h - 12.0,
        h - 12.0,
        max as u64,
        h - 12.0
    );
    for (k, color) in COLORS.iter().enumerate() {
        let pts: Vec<String> = rows
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let x = pad + (w - pad) * i as f64 / (rows.len().max(2) - 1) as f64;
                let y = (h - 12.0) - (h - 22.0) * r[k] as f64 / max;
                format!("{x:.1},{y:.1}")
            })
            .collect();
        let _ = write!(
            svg,
            "<polyline fill=none stroke=\"{color}\" stroke-width=\"1.5\" points=\"{}\"/>",
            pts.join(" ")
        );
    }
    let totals: Vec<u64> = (0..SERIES.len())
        .map(|k| rows.iter().map(|r| r[k]).sum())
        .collect();
    svg.push_str("</svg><div class=legend>");
    for (k, name) in SERIES.iter().enumerate() {
        let _ = write!(
            svg,
            "<span><i style=\"background:{}\"></i>{} {}</span>",
            COLORS[k], name, totals[k]
        );
    }
    svg.push_str("</div></div>");
    svg
}

fn row(e: &LogEntry) -> String {
    format!(
        "<tr><td>{}</td><td><a href=\"{}\"><code>{}</code></a></td><td>{}{}</td><td>{}</td>\
         <td class=num>{}</td><td class=num>{}</td><td class=num>{}</td><td class=num>{}</td><td>{}</td></tr>",
        esc(&e.route),
        detail_url(&e.route, &e.key),
        esc(&e.key),
        badge(e.status.as_str()),
        if e.claimed {
            " <small>(claimed)</small>"
        } else {
            ""
        },
        esc(e.outcome.as_deref().unwrap_or("-")),
        e.upstream_status
            .map(|s| s.to_string())
            .unwrap_or("-".into()),
        e.attempts,
        e.duplicates,
        e.latency_ms
            .map(|l| format!("{l} ms"))
            .unwrap_or("-".into()),
        when(e.last_seen),
    )
}

pub(crate) async fn list<S: Store>(
    console: &Console,
    op: &Operator<'_, S>,
    caller: &Caller,
    query: Option<&str>,
) -> Answer {
    let mut body = String::from(
        "<h1>Deliveries</h1><p><a id=routes-page href=\"/admin/routes-page\">Routes and jobs →</a></p><div class=charts>",
    );
    for r in &console.routes() {
        body.push_str(&chart(r, &console.last_hour(r)));
    }
    body.push_str("</div>");
    let q = query_pairs(query);
    let sel = |name: &str, v: &str| {
        if q.get(name).map(String::as_str) == Some(v) {
            " selected"
        } else {
            ""
        }
    };
    let text = |name: &str| esc(q.get(name).map(String::as_str).unwrap_or(""));
    let checked = |name: &str| {
        if q.get(name).map(String::as_str) == Some("true") {
            " checked"
        } else {
            ""
        }
    };
    let mut routes = String::from("<option value=\"\">all</option>");
    for r in &console.routes() {
        let _ = write!(routes, "<option{}>{}</option>", sel("route", r), esc(r));
    }
    let mut statuses = String::from("<option value=\"\">any</option>");
    for s in ["processing", "completed", "released"] {
        let _ = write!(statuses, "<option{}>{s}</option>", sel("status", s));
    }
    let mut outcomes = String::from("<option value=\"\">any</option>");
    for o in [
        "forwarded",
        "upstream_error",
        "operator_replay",
        "operator_replay_failed",
    ] {
        let _ = write!(outcomes, "<option{}>{o}</option>", sel("outcome", o));
    }
    let _ = write!(
        body,
        "<h2>Recent deliveries</h2><form class=filters method=get action=\"/admin/\">\
         <label>Route<select name=route>{routes}</select></label>\
         <label>Status<select name=status>{statuses}</select></label>\
         <label>Last outcome<select name=outcome>{outcomes}</select></label>\
         <label>Key prefix<input name=key_prefix value=\"{}\"></label>\
         <label>Upstream status<input name=upstream_status size=4 placeholder=5xx value=\"{}\"></label>\
         <label>First seen since<input name=since size=14 placeholder=\"Unix ms\" value=\"{}\"></label>\
         <label>until<input name=until size=14 placeholder=\"Unix ms\" value=\"{}\"></label>\
         <label><input type=checkbox name=duplicates value=true{}>Copied</label>\
         <label><input type=checkbox name=kept value=true{}>Replayable</label>\
         <button type=submit>Filter</button></form>",
        text("key_prefix"),
        text("upstream_status"),
        text("since"),
        text("until"),
        checked("duplicates"),
        checked("kept"),
    );
    let store = op.store;
    match store.log_support() {
        LogSupport::None => body.push_str("<p class=warn>This store keeps no delivery log.</p>"),
        LogSupport::Full => match list_query(&console.routes(), query) {
            Err(m) => {
                let _ = write!(body, "<p class=warn>{}</p>", esc(&m));
            }
            Ok(lq) => match store.recent(&lq).await {
                Err(e) => {
                    let _ = write!(body, "<p class=warn>store: {}</p>", esc(&e.to_string()));
                }
                Ok(page) => {
                    body.push_str(
                        "<table><thead><tr><th>Route</th><th>Key</th><th>Status</th><th>Last outcome</th>\
                         <th>Upstream</th><th>Attempts</th><th>Duplicates</th><th>Latency</th><th>Last seen</th></tr></thead><tbody>",
                    );
                    if page.items.is_empty() {
                        body.push_str("<tr><td colspan=9>No deliveries.</td></tr>");
                    }
                    for (_, e) in &page.items {
                        body.push_str(&row(e));
                    }
                    body.push_str("</tbody></table>");
                    if page.partial {
                        body.push_str("<p class=note id=partial>This page stopped reading early (a narrow filter over a long list); the next one goes on.</p>");
                    }
                    if let Some(next) = &page.next {
                        let mut params = form_urlencoded::Serializer::new(String::new());
                        for k in ["route", "limit"] {
                            if let Some(v) = q.get(k) {
                                params.append_pair(k, v);
                            }
                        }
                        for (k, v) in lq.filter.pairs() {
                            params.append_pair(k, &v);
                        }
                        params.append_pair("cursor", &next.encode());
                        let _ = write!(
                            body,
                            "<p><a class=\"button plain\" href=\"/admin/?{}\">Older →</a></p>",
                            esc(&params.finish())
                        );
                    }
                }
            },
        },
    }
    page(StatusCode::OK, "Deliveries", Some(caller), &body)
}

pub(crate) async fn detail<S: Store>(
    op: &Operator<'_, S>,
    caller: &Caller,
    route: &str,
    key: &str,
    query: Option<&str>,
) -> Answer {
    let entry = match op.store.log_entry(&DeliveryKey::new(route, key)).await {
        Ok(Some(e)) => e,
        Ok(None) => {
            return page(
                StatusCode::NOT_FOUND,
                "Not found",
                Some(caller),
                "<h1>No such delivery</h1><p>It was never seen, was forgotten, or its retention ran out.</p><p><a href=\"/admin/\">Back to the list</a></p>",
            );
        }
        Err(e) => {
            return page(
                StatusCode::SERVICE_UNAVAILABLE,
                "Store unavailable",
                Some(caller),
                &format!("<h1>Store unavailable</h1><p>{}</p>", esc(&e.to_string())),
            );
        }
    };
    let mut body = String::new();
    if let Some(done) = query_pairs(query).get("done") {
        let _ = write!(body, "<p class=note id=done>{}</p>", esc(done));
    }
    let _ = write!(
        body,
        "<h1>Delivery <code>{}</code> on <code>{}</code></h1>",
        esc(key),
        esc(route)
    );
    let safety = match (entry.status.as_str(), entry.claimed) {
        (_, true) => {
            "A copy is being processed right now; a resend is answered 409 until it settles."
        }
        ("completed", _) => {
            "Completed: the application answered 2xx. A provider's resend is answered from the store and NOT forwarded again — resending is safe."
        }
        _ => {
            "Released: the last attempt failed. A provider's resend WILL be forwarded to the application."
        }
    };
    let _ = write!(body, "<p class=note>{}</p><table>", esc(safety));
    let fields: [(&str, String); 12] = [
        ("Status", badge(entry.status.as_str())),
        ("Last outcome", esc(entry.outcome.as_deref().unwrap_or("-"))),
        (
            "Upstream status",
            entry
                .upstream_status
                .map(|s| s.to_string())
                .unwrap_or("-".into()),
        ),
        (
            "Upstream latency",
            entry
                .latency_ms
                .map(|l| format!("{l} ms"))
                .unwrap_or("-".into()),
        ),
        ("Attempts (forwards)", entry.attempts.to_string()),
        ("Duplicates answered", entry.duplicates.to_string()),
        ("Operator replays", entry.replays.to_string()),
        ("First seen", when(entry.first_seen)),
        ("Last seen", when(entry.last_seen)),
        (
            "Stored answer",
            entry
                .response_status
                .map(|s| s.to_string())
                .unwrap_or("-".into()),
        ),
        (
            "Fingerprint",
            format!("<code>{}</code>", esc(&entry.fingerprint)),
        ),
        (
            "Request kept",
            if entry.has_request {
                "yes"
            } else {
                "no (keep_payload is off for this route)"
            }
            .into(),
        ),
    ];
    for (k, v) in fields {
        let _ = write!(body, "<tr><th>{k}</th><td>{v}</td></tr>");
    }
    body.push_str("</table>");
    if let Some(r) = &entry.request {
        let text = String::from_utf8_lossy(&r.body);
        let shown: String = text.chars().take(4096).collect();
        let _ = write!(
            body,
            "<h2>Request</h2><p><code>{} {}</code> · {} bytes</p><pre>{}</pre><pre>{}</pre>",
            esc(&r.method),
            esc(&r.path),
            r.body.len(),
            esc(&String::from_utf8_lossy(&r.headers)),
            esc(&shown)
        );
    }
    let base = detail_url(route, key);
    body.push_str("<h2>Actions</h2><p>");
    if entry.has_request {
        let _ = write!(
            body,
            "<a class=button id=replay href=\"{base}/confirm?action=replay\">Replay to the application…</a> "
        );
    }
    let _ = write!(
        body,
        "<a class=\"button danger\" id=forget href=\"{base}/confirm?action=forget\">Forget…</a> \
         <a class=\"button plain\" href=\"/admin/\">Back</a></p>"
    );
    page(StatusCode::OK, "Delivery", Some(caller), &body)
}

pub(crate) fn confirm(caller: &Caller, route: &str, key: &str, action: &str) -> Answer {
    let explain = match action {
        "replay" => {
            "The kept request is sent to the application again, under this delivery's claim: copies from the provider arriving meanwhile get 409, and the new answer is recorded."
        }
        "forget" => {
            "idemgate forgets this delivery: the provider's next copy is forwarded to the application as if it were new."
        }
        _ => return super::not_found(),
    };
    let csrf = caller.csrf.as_deref().unwrap_or("");
    let base = detail_url(route, key);
    let body = format!(
        "<h1>{} <code>{}</code>?</h1><p class=warn>{}</p>\
         <form method=post action=\"{base}/{action}\"><input type=hidden name=csrf value=\"{}\">\
         <button type=submit id=confirm class=\"{}\">Yes, {action}</button> \
         <a class=\"button plain\" href=\"{base}\">Cancel</a></form>",
        if action == "replay" {
            "Replay"
        } else {
            "Forget"
        },
        esc(key),
        esc(explain),
        esc(csrf),
        if action == "forget" { "danger" } else { "" },
    );
    page(StatusCode::OK, "Confirm", Some(caller), &body)
}

pub(crate) async fn act<S: Store>(
    op: &Operator<'_, S>,
    caller: &Caller,
    route: &str,
    key: &str,
    action: &str,
) -> Answer {
    let dkey = DeliveryKey::new(route, key);
    let done = if action == "forget" {
        let r = op.store.forget(&dkey).await;
        let text = match &r {
            Ok(Forgot::Forgotten) => "forgotten".to_string(),
            Ok(Forgot::NotFound) => "not_found".to_string(),
            Ok(Forgot::InFlight) => "in_flight".to_string(),
            Err(e) => format!("store error: {e}"),
        };
        audit(&caller.who, "forget", route, key, &text);
        if matches!(r, Ok(Forgot::Forgotten | Forgot::NotFound)) {
            return redirect("/admin/");
        }
        format!("Forget refused: {text}")
    } else {
        let r = deliveries::replay(
            op.store,
            op.upstream,
            &dkey,
            op.lifetimes.of(&dkey.route).lease,
        )
        .await;
        match r {
            Ok(d) => {
                audit(
                    &caller.who,
                    "replay",
                    route,
                    key,
                    &format!("{} (upstream {})", d.outcome, d.status),
                );
                format!(
                    "Replayed: the application answered {} in {} ms{}.",
                    d.status,
                    d.latency_ms,
                    if d.recorded { " (recorded)" } else { "" }
                )
            }
            Err(e) => {
                let code = match &e {
                    ReplayError::InFlight(_) => "in_flight",
                    ReplayError::NotFound => "not_found",
                    ReplayError::NotKept => "not_replayable",
                    ReplayError::Changed => "changed",
                    ReplayError::Store(_) => "store_unavailable",
                };
                audit(&caller.who, "replay", route, key, code);
                format!("Replay refused: {e}")
            }
        }
    };
    let mut q = form_urlencoded::Serializer::new(String::new());
    q.append_pair("done", &done);
    redirect(&format!("{}?{}", detail_url(route, key), q.finish()))
}
