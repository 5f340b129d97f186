//! The admin JSON API (bearer tokens): list, show, forget and replay deliveries.

use http::header::{self, HeaderValue};
use http::{Method, StatusCode};

use super::{Answer, Caller, Console, Operator, json, json_error, query_pairs};
use crate::deliveries::audit::audit;
use crate::deliveries::{self, ReplayError};
use crate::store::log::{Cursor, Filter, Forgot, ListQuery, LogSupport};
use crate::store::log_filter;
use crate::store::{DeliveryKey, Store, StoreError};

/// Page size when the caller gives none, and the largest accepted.
pub const DEFAULT_LIMIT: usize = 50;
pub const MAX_LIMIT: usize = 500;

fn store_error(e: &StoreError) -> Answer {
    json_error(
        StatusCode::SERVICE_UNAVAILABLE,
        "store_unavailable",
        &e.to_string(),
    )
}

fn no_log() -> Answer {
    json_error(
        StatusCode::NOT_IMPLEMENTED,
        "no_delivery_log",
        "this store keeps no delivery log",
    )
}

/// Parses the list query (`route`, the filter's words, `limit`, `cursor`).
pub(crate) fn list_query(routes: &[String], query: Option<&str>) -> Result<ListQuery, String> {
    let q = query_pairs(query);
    let routes = match q.get("route").filter(|r| !r.is_empty()) {
        Some(r) => vec![r.clone()],
        None => routes.to_vec(),
    };
    let mut filter = Filter::default();
    for word in log_filter::WORDS {
        if let Some(v) = q.get(word) {
            filter.set(word, v).map_err(|e| e.to_string())?;
        }
    }
    let limit = match q.get("limit").filter(|s| !s.is_empty()) {
        Some(l) => l
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=MAX_LIMIT).contains(n))
            .ok_or_else(|| format!("limit must be 1 to {MAX_LIMIT}"))?,
        None => DEFAULT_LIMIT,
    };
    let cursor = match q.get("cursor").filter(|s| !s.is_empty()) {
        Some(c) => Some(Cursor::decode(c).ok_or("cursor is not one this API gave out")?),
        None => None,
    };
    Ok(ListQuery {
        routes,
        filter,
        limit,
        cursor,
    })
}

pub(crate) async fn handle<S: Store>(
    console: &Console,
    op: &Operator<'_, S>,
    caller: &Caller,
    method: &Method,
    segs: &[&str],
    query: Option<&str>,
) -> Answer {
    let store = op.store;
    if segs.first() == Some(&"dead-letters") {
        return dead_letters(op, caller, method, &segs[1..], query).await;
    }
    if store.log_support() == LogSupport::None {
        return no_log();
    }
    match (method, &segs[1..]) {
        (&Method::GET, []) => {
            let q = match list_query(&console.routes(), query) {
                Ok(q) => q,
                Err(m) => return json_error(StatusCode::BAD_REQUEST, "bad_request", &m),
            };
            audit(&caller.who, "list", q.routes.join(",").as_str(), "-", "ok");
            match store.recent(&q).await {
                Ok(page) => json(StatusCode::OK, &page.to_json()),
                Err(e) => store_error(&e),
            }
        }
        (&Method::GET, [route, key]) => {
            audit(&caller.who, "show", route, key, "ok");
            match store.log_entry(&DeliveryKey::new(*route, *key)).await {
                Ok(Some(e)) => json(StatusCode::OK, &e.to_json()),
                Ok(None) => json_error(StatusCode::NOT_FOUND, "not_found", "no such delivery"),
                Err(e) => store_error(&e),
            }
        }
        (&Method::DELETE, [route, key]) => {
            let r = store.forget(&DeliveryKey::new(*route, *key)).await;
            let (status, result) = match &r {
                Ok(Forgot::Forgotten) => (StatusCode::OK, "forgotten"),
                Ok(Forgot::NotFound) => (StatusCode::NOT_FOUND, "not_found"),
                Ok(Forgot::InFlight) => (StatusCode::CONFLICT, "in_flight"),
                Err(_) => (StatusCode::SERVICE_UNAVAILABLE, "store_unavailable"),
            };
            audit(&caller.who, "forget", route, key, result);
            match r {
                Ok(Forgot::Forgotten) => json(
                    status,
                    &serde_json::json!({"route": route, "key": key, "result": result}),
                ),
                Ok(Forgot::NotFound) => json_error(status, result, "no such delivery"),
                Ok(Forgot::InFlight) => json_error(
                    status,
                    result,
                    "a copy of this delivery is being processed; forget it once it settles",
                ),
                Err(e) => store_error(&e),
            }
        }
        (&Method::POST, [route, key, "replay"]) => {
            let dkey = DeliveryKey::new(*route, *key);
            let r =
                deliveries::replay(store, op.upstream, &dkey, op.lifetimes.of(route).lease).await;
            replay_answer(caller, route, key, r)
        }
        _ => json_error(StatusCode::NOT_FOUND, "not_found", "no such admin endpoint"),
    }
}

/// The API answer for a replay, and its audit line.
fn replay_answer(
    caller: &Caller,
    route: &str,
    key: &str,
    r: Result<deliveries::Replayed, ReplayError>,
) -> Answer {
    match r {
        Ok(done) => {
            audit(
                &caller.who,
                "replay",
                route,
                key,
                &format!("{} (upstream {})", done.outcome, done.status),
            );
            json(
                StatusCode::OK,
                &serde_json::json!({
                    "route": route,
                    "key": key,
                    "outcome": done.outcome,
                    "upstream_status": done.status,
                    "recorded": done.recorded,
                    "latency_ms": done.latency_ms,
                }),
            )
        }
        Err(e) => {
            let (status, code) = match &e {
                ReplayError::NotFound => (StatusCode::NOT_FOUND, "not_found"),
                ReplayError::NotKept => (StatusCode::UNPROCESSABLE_ENTITY, "not_replayable"),
                ReplayError::InFlight(_) => (StatusCode::CONFLICT, "in_flight"),
                ReplayError::Changed => (StatusCode::CONFLICT, "changed"),
                ReplayError::Store(_) => (StatusCode::SERVICE_UNAVAILABLE, "store_unavailable"),
            };
            audit(&caller.who, "replay", route, key, code);
            let mut a = json_error(status, code, &e.to_string());
            if let ReplayError::InFlight(secs) = e {
                a.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from(secs));
            }
            a
        }
    }
}

/// Async routes' dead letters (docs/async.md): `GET /admin/dead-letters?route=&limit=&cursor=`
/// lists a route's dead-letter stream, oldest first; `POST
/// /admin/dead-letters/{route}/{id}/redrive` puts one back in the route's queue.
async fn dead_letters<S: Store>(
    op: &Operator<'_, S>,
    caller: &Caller,
    method: &Method,
    segs: &[&str],
    query: Option<&str>,
) -> Answer {
    let Some(queue) = op.queue else {
        return json_error(
            StatusCode::NOT_FOUND,
            "no_async_routes",
            "no route has mode = \"async\": there are no dead letters",
        );
    };
    let q: std::collections::HashMap<String, String> = query
        .map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
        .unwrap_or_default();
    match (method, segs) {
        (&Method::GET, []) => {
            let Some(route) = q.get("route").filter(|r| !r.is_empty()) else {
                return json_error(StatusCode::BAD_REQUEST, "bad_request", "route is required");
            };
            let limit = match q.get("limit").map(|l| l.parse::<usize>()) {
                None => DEFAULT_LIMIT,
                Some(Ok(n)) if (1..=MAX_LIMIT).contains(&n) => n,
                Some(_) => {
                    return json_error(
                        StatusCode::BAD_REQUEST,
                        "bad_request",
                        &format!("limit must be 1 to {MAX_LIMIT}"),
                    );
                }
            };
            let cursor = q
                .get("cursor")
                .filter(|c| !c.is_empty())
                .map(String::as_str);
            audit(&caller.who, "list_dead_letters", route, "-", "ok");
            match queue.list_dead_letters(route, limit, cursor).await {
                Ok(page) => {
                    let items: Vec<serde_json::Value> = page
                        .items
                        .iter()
                        .map(|d| {
                            serde_json::json!({
                                "id": d.id,
                                "key": d.entry.key,
                                "method": d.entry.method,
                                "path": d.entry.path,
                                "received_at": d.entry.received_at,
                                "attempts": d.attempts,
                                "last_error": d.last_error,
                                "dead_at": d.dead_at,
                            })
                        })
                        .collect();
                    json(
                        StatusCode::OK,
                        &serde_json::json!({ "items": items, "next": page.next }),
                    )
                }
                Err(e) => store_error(&e),
            }
        }
        (&Method::POST, [route, id, "redrive"]) => match queue.redrive(route, id).await {
            Ok(true) => {
                audit(&caller.who, "redrive", route, id, "ok");
                json(StatusCode::OK, &serde_json::json!({ "redriven": id }))
            }
            Ok(false) => {
                audit(&caller.who, "redrive", route, id, "not_found");
                json_error(StatusCode::NOT_FOUND, "not_found", "no such dead letter")
            }
            Err(e) => {
                audit(&caller.who, "redrive", route, id, "store_error");
                store_error(&e)
            }
        },
        _ => json_error(StatusCode::NOT_FOUND, "not_found", "no such endpoint"),
    }
}
