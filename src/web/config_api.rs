//! `POST /admin/reload` (reload the configuration now: what changed, or why nothing
//! was applied) and `GET /admin/config` (the configuration in force, secrets redacted,
//! and when it was loaded). Both need an admin token; a reload is audited.

use http::{Method, StatusCode};

use super::{Answer, Caller, json, json_error};
use crate::deliveries::audit::audit;
use crate::reload::Reloader;

pub(super) async fn handle(
    reloader: &Reloader,
    caller: &Caller,
    method: &Method,
    segs: &[&str],
) -> Answer {
    match (method, segs) {
        (&Method::POST, ["reload"]) => match reloader.reload("POST /admin/reload").await {
            Ok(applied) => {
                audit(&caller.who, "reload", "-", "-", "ok");
                json(
                    StatusCode::OK,
                    &serde_json::json!({
                        "result": "ok",
                        "changes": applied.changes.to_string(),
                        "loaded_at": rfc3339(applied.loaded_at),
                    }),
                )
            }
            Err(e) => {
                audit(&caller.who, "reload", "-", "-", e.code());
                json_error(StatusCode::UNPROCESSABLE_ENTITY, e.code(), &e.to_string())
            }
        },
        (&Method::GET, ["config"]) => {
            let live = reloader.live().load();
            let config = live.config();
            json(
                StatusCode::OK,
                &serde_json::json!({
                    "loaded_at": rfc3339(live.loaded_at()),
                    "source": config.source.as_ref().map(|p| p.display().to_string()),
                    "config": config.redacted_toml(),
                }),
            )
        }
        (_, ["reload"]) | (_, ["config"]) => json_error(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            "POST /admin/reload, GET /admin/config",
        ),
        _ => json_error(StatusCode::NOT_FOUND, "not_found", "no such admin endpoint"),
    }
}

fn rfc3339(t: std::time::SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}
