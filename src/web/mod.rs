//! The operator console on `admin_listen`, everything under `/admin/`:
//!
//! - the JSON API, `Authorization: Bearer <token>`: `GET /admin/deliveries`,
//!   `GET|DELETE /admin/deliveries/{route}/{key}`, `POST …/{route}/{key}/replay`;
//! - the web page (`/admin/`, server-rendered, no JavaScript): a login form sets an
//!   HttpOnly, SameSite=Strict session cookie; every form that changes something
//!   carries the session's CSRF token and is reached through a confirmation page;
//!   `/admin/routes-page` pauses and resumes async routes and starts bulk jobs.
//!
//! Without any admin token configured the whole of `/admin/` answers 404; `/metrics`
//! and the probes stay open either way. Every action is logged (target
//! `idemgate::audit`) with the token's name and what was done. Refused requests are
//! slowed per client address (`throttle`); every body is read within `body_timeout`.

mod api;
mod config_api;
mod control;
mod pages;
mod pages_ops;
mod throttle;

pub use throttle::ClientIp;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Request, Response, StatusCode};
use http_body::Body;
use http_body_util::{BodyExt, Full, Limited};
use subtle::ConstantTimeEq;

use crate::config::Config;
use crate::deliveries::audit::audit;
use crate::metrics::Metrics;
use crate::queue::AsyncMode;
use crate::store::Store;

pub use crate::answer::Answer;

/// The borrowed handles an operator's action uses (not the whole gate).
pub struct Operator<'a, S> {
    pub store: &'a S,
    pub upstream: &'a crate::upstream::Upstream,
    /// Every route's lease and retention: a replay's claim holds its route's lease.
    pub lifetimes: &'a crate::store::RouteLifetimes,
    pub queue: Option<&'a AsyncMode>,
    /// Operators' bulk jobs (none without a queue backend).
    pub jobs: Option<&'a std::sync::Arc<crate::deliveries::jobs::JobRunner<S>>>,
    /// `POST /admin/reload` and `GET /admin/config`.
    pub reloader: &'a crate::reload::Reloader,
}

/// The session cookie's name.
const COOKIE: &str = "idemgate_session";
/// How long a console login lasts.
const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
/// Sessions kept at most (the oldest go first).
const MAX_SESSIONS: usize = 1024;
/// Largest form body read.
const MAX_FORM: usize = 16 * 1024;

struct Session {
    who: String,
    csrf: String,
    expires: Instant,
}

/// The console's state, built once from the configuration.
pub struct Console {
    /// The configuration whose admin tokens and routes the console serves.
    config: ConfigSource,
    /// Where the per-minute activity of each route is read from.
    metrics: std::sync::Arc<Metrics>,
    sessions: Mutex<HashMap<String, Session>>,
    /// Refused requests per client address.
    throttle: throttle::Throttle,
    /// A request body (a form, a control request) arrives within this, or is refused.
    body_timeout: Duration,
}

/// Where the console reads its configuration: fixed at start, or the settings in force.
enum ConfigSource {
    Fixed(std::sync::Arc<Config>),
    Live(crate::gate::Live),
}

impl ConfigSource {
    fn get(&self) -> std::sync::Arc<Config> {
        match self {
            ConfigSource::Fixed(c) => c.clone(),
            ConfigSource::Live(l) => l.load().config().clone(),
        }
    }
}

/// Who is asking, once authenticated.
pub(crate) struct Caller {
    pub who: String,
    /// The session's CSRF token (console callers only).
    pub csrf: Option<String>,
}

impl Console {
    pub fn new(config: &Config, metrics: std::sync::Arc<Metrics>) -> Console {
        Console {
            config: ConfigSource::Fixed(std::sync::Arc::new(config.clone())),
            metrics,
            sessions: Mutex::new(HashMap::new()),
            throttle: throttle::Throttle::default(),
            body_timeout: config.body_timeout,
        }
    }

    /// The console reading its admin tokens and routes from the settings in force, so
    /// that a live reload (src/reload) changes them.
    pub fn with_live(mut self, live: crate::gate::Live) -> Console {
        self.config = ConfigSource::Live(live);
        self
    }

    /// Whether `/admin/` is on (at least one token is configured).
    pub fn enabled(&self) -> bool {
        !self.config.get().operator_tokens.is_empty()
    }

    /// The last hour of `route`'s activity, for the chart.
    fn last_hour(&self, route: &str) -> Vec<[u64; crate::metrics::SERIES.len()]> {
        self.metrics.last_hour(route)
    }

    /// The names of the routes in force.
    pub fn routes(&self) -> Vec<String> {
        self.config
            .get()
            .routes
            .iter()
            .map(|r| r.name.clone())
            .collect()
    }

    /// The name of the token `presented` is, compared in constant time against every
    /// configured token (no early exit). Both sides are hashed first, so that neither
    /// the comparison's time nor its early length check tells a token's length.
    fn token_name(&self, presented: &[u8]) -> Option<String> {
        use sha2::Digest as _;
        let presented = sha2::Sha256::digest(presented);
        let mut found = None;
        for t in &self.config.get().operator_tokens {
            let secret = sha2::Sha256::digest(&t.secret.value);
            if bool::from(secret.as_slice().ct_eq(presented.as_slice())) {
                found = Some(t.name.clone());
            }
        }
        found
    }

    fn bearer(&self, headers: &HeaderMap) -> Option<Caller> {
        let v = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
        let token = v
            .strip_prefix("Bearer ")
            .or_else(|| v.strip_prefix("bearer "))?;
        self.token_name(token.trim().as_bytes())
            .map(|who| Caller { who, csrf: None })
    }

    fn session(&self, headers: &HeaderMap) -> Option<Caller> {
        let sid = cookie(headers, COOKIE)?;
        let mut sessions = self.sessions.lock().ok()?;
        let now = Instant::now();
        match sessions.get(&sid) {
            Some(s) if s.expires > now => Some(Caller {
                who: s.who.clone(),
                csrf: Some(s.csrf.clone()),
            }),
            Some(_) => {
                sessions.remove(&sid);
                None
            }
            None => None,
        }
    }

    /// Starts a console session for the token's owner; returns the session id.
    fn login(&self, who: String) -> String {
        let sid = hex::encode(rand::random::<[u8; 32]>());
        let csrf = hex::encode(rand::random::<[u8; 16]>());
        if let Ok(mut sessions) = self.sessions.lock() {
            let now = Instant::now();
            sessions.retain(|_, s| s.expires > now);
            if sessions.len() >= MAX_SESSIONS
                && let Some(oldest) = sessions
                    .iter()
                    .min_by_key(|(_, s)| s.expires)
                    .map(|(k, _)| k.clone())
            {
                sessions.remove(&oldest);
            }
            sessions.insert(
                sid.clone(),
                Session {
                    who,
                    csrf,
                    expires: now + SESSION_TTL,
                },
            );
        }
        sid
    }

    /// Holds a refused request's answer as `throttle` says, and logs the refusal
    /// (`what`) at WARN while the address's refusals are few, then at DEBUG.
    async fn refuse(&self, client: IpAddr, what: &str) {
        let r = self.throttle.refused(client);
        if r.log {
            tracing::warn!(target: "idemgate::audit", %client, refusals = r.refusals, "{what}");
        } else {
            tracing::debug!(target: "idemgate::audit", %client, refusals = r.refusals, "{what}");
        }
        tokio::time::sleep(r.wait).await;
    }

    /// Reads a small form body, within `body_timeout`.
    async fn read_form<B>(&self, body: B) -> Option<HashMap<String, String>>
    where
        B: Body<Data = Bytes>,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let bytes = self.read_body(body, MAX_FORM).await.ok()?;
        Some(form_urlencoded::parse(&bytes).into_owned().collect())
    }

    /// Reads a body of at most `limit` bytes within `body_timeout`; Err(true) when it
    /// is too large, Err(false) when it is late or broken.
    async fn read_body<B>(&self, body: B, limit: usize) -> Result<Bytes, bool>
    where
        B: Body<Data = Bytes>,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        match tokio::time::timeout(self.body_timeout, Limited::new(body, limit).collect()).await {
            Ok(Ok(b)) => Ok(b.to_bytes()),
            Ok(Err(e)) => Err(e
                .downcast_ref::<http_body_util::LengthLimitError>()
                .is_some()),
            Err(_) => Err(false),
        }
    }

    fn logout(&self, headers: &HeaderMap) {
        if let (Some(sid), Ok(mut sessions)) = (cookie(headers, COOKIE), self.sessions.lock()) {
            sessions.remove(&sid);
        }
    }
}

/// The login form's double-submit CSRF cookie.
const LOGIN_COOKIE: &str = "idemgate_login";

/// The login form, with a fresh CSRF token in the form and in a cookie.
fn login_page(error: Option<&str>) -> Answer {
    let csrf = hex::encode(rand::random::<[u8; 16]>());
    let mut r = pages::login(error, &csrf);
    if let Ok(v) = HeaderValue::from_str(&format!(
        "{LOGIN_COOKIE}={csrf}; HttpOnly; SameSite=Strict; Path=/admin; Max-Age=3600"
    )) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    r
}

/// One cookie's value from the `Cookie` headers.
fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.to_string())
}

pub(crate) fn json(status: StatusCode, v: &serde_json::Value) -> Answer {
    let mut r = Response::new(Full::new(Bytes::from(v.to_string())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

pub(crate) fn json_error(status: StatusCode, code: &str, message: &str) -> Answer {
    json(
        status,
        &serde_json::json!({ "error": code, "message": message }),
    )
}

pub(crate) fn not_found() -> Answer {
    let mut r = Response::new(Full::new(Bytes::from_static(b"not found\n")));
    *r.status_mut() = StatusCode::NOT_FOUND;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

pub(crate) fn redirect(to: &str) -> Answer {
    let mut r = Response::new(Full::new(Bytes::new()));
    *r.status_mut() = StatusCode::SEE_OTHER;
    if let Ok(v) = HeaderValue::from_str(to) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    r
}

/// Percent-encodes one path segment.
pub(crate) fn seg(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
}

/// The query string's pairs.
pub(crate) fn query_pairs(q: Option<&str>) -> HashMap<String, String> {
    form_urlencoded::parse(q.unwrap_or("").as_bytes())
        .into_owned()
        .collect()
}

/// The 403 page when a console form's CSRF token is not the session's (compared in
/// constant time), so that no state-changing form is accepted from another site.
fn csrf_refused(caller: &Caller, form: &HashMap<String, String>) -> Option<Answer> {
    let sent = form.get("csrf").map(String::as_bytes).unwrap_or(b"");
    let want = caller.csrf.as_deref().unwrap_or("").as_bytes();
    if want.is_empty() || !bool::from(want.ct_eq(sent)) {
        tracing::warn!(target: "idemgate::audit", who = %caller.who, "console form refused: bad CSRF token");
        return Some(pages::message(
            StatusCode::FORBIDDEN,
            "Refused",
            "This form is out of date (CSRF check failed). Go back, reload and try again.",
        ));
    }
    None
}

/// Everything under `/admin` (see the module documentation).
pub async fn handle<S: Store, B>(console: &Console, op: Operator<'_, S>, req: Request<B>) -> Answer
where
    B: Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    if !console.enabled() {
        return not_found();
    }
    let (parts, body) = req.into_parts();
    let segments: Vec<String> = parts
        .uri
        .path()
        .trim_start_matches('/')
        .split('/')
        .map(|s| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8_lossy()
                .into_owned()
        })
        .collect();
    let segs: Vec<&str> = segments.iter().map(String::as_str).collect();
    let method = parts.method.clone();
    let query = parts.uri.query();
    let client = parts
        .extensions
        .get::<ClientIp>()
        .map_or(IpAddr::from([0, 0, 0, 0]), |c| c.0);

    // The JSON API: bearer tokens only.
    let api = [
        "deliveries",
        "dead-letters",
        "routes",
        "jobs",
        "reload",
        "config",
    ];
    if segs.get(1).is_some_and(|s| api.contains(s)) {
        let Some(caller) = console.bearer(&parts.headers) else {
            let presented = parts.headers.contains_key(header::AUTHORIZATION);
            let what = format!(
                "admin API request refused: no valid token (path {}, token presented: {presented})",
                parts.uri.path()
            );
            console.refuse(client, &what).await;
            let mut r = json_error(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "send Authorization: Bearer <admin token>",
            );
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            return r;
        };
        if matches!(segs.get(1), Some(&"reload") | Some(&"config")) {
            return config_api::handle(op.reloader, &caller, &method, &segs[1..]).await;
        }
        if matches!(segs.get(1), Some(&"routes") | Some(&"jobs")) {
            let body = match console.read_body(body, control::MAX_BODY).await {
                Ok(body) => body,
                Err(true) => {
                    return json_error(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        "too_large",
                        "the request body is larger than 64 KiB",
                    );
                }
                Err(false) => {
                    return json_error(
                        StatusCode::REQUEST_TIMEOUT,
                        "body_timeout",
                        "the request body did not arrive in time",
                    );
                }
            };
            let req = (&parts.headers, body);
            return control::handle(&op, &caller, &console.routes(), &method, &segs[1..], req)
                .await;
        }
        return api::handle(console, &op, &caller, &method, &segs[1..], query).await;
    }

    // The web page: a session cookie, CSRF tokens on every form that changes something.
    match (method.as_str(), &segs[1..]) {
        ("GET", ["login"]) => return login_page(None),
        ("POST", ["login"]) => {
            let want = cookie(&parts.headers, LOGIN_COOKIE).unwrap_or_default();
            let form = console.read_form(body).await.unwrap_or_default();
            let sent = form.get("csrf").map(String::as_bytes).unwrap_or(b"");
            if want.is_empty() || !bool::from(want.as_bytes().ct_eq(sent)) {
                tracing::warn!(target: "idemgate::audit", "console login refused: bad CSRF token");
                return login_page(Some("The form was out of date; please sign in again."));
            }
            let token = form.get("token").map(String::as_str).unwrap_or("");
            return match console.token_name(token.trim().as_bytes()) {
                Some(who) => {
                    audit(&who, "login", "-", "-", "ok");
                    let sid = console.login(who);
                    let mut r = redirect("/admin/");
                    if let Ok(v) = HeaderValue::from_str(&format!(
                        "{COOKIE}={sid}; HttpOnly; SameSite=Strict; Path=/admin; Max-Age={}",
                        SESSION_TTL.as_secs()
                    )) {
                        r.headers_mut().insert(header::SET_COOKIE, v);
                    }
                    r
                }
                None => {
                    console
                        .refuse(client, "console login refused: wrong token")
                        .await;
                    login_page(Some("That token is not valid."))
                }
            };
        }
        _ => {}
    }
    let Some(caller) = console.session(&parts.headers) else {
        return redirect("/admin/login");
    };
    match (method.as_str(), &segs[1..]) {
        ("GET", [] | [""]) => pages::list(console, &op, &caller, query).await,
        ("POST", ["logout"]) => {
            let form = console.read_form(body).await.unwrap_or_default();
            let sent = form.get("csrf").map(String::as_bytes).unwrap_or(b"");
            let want = caller.csrf.as_deref().unwrap_or("").as_bytes();
            if want.is_empty() || !bool::from(want.ct_eq(sent)) {
                return pages::message(
                    StatusCode::FORBIDDEN,
                    "Refused",
                    "This form is out of date (CSRF check failed). Go back, reload and try again.",
                );
            }
            console.logout(&parts.headers);
            audit(&caller.who, "logout", "-", "-", "ok");
            let mut r = redirect("/admin/login");
            r.headers_mut().insert(
                header::SET_COOKIE,
                HeaderValue::from_static(
                    "idemgate_session=; HttpOnly; SameSite=Strict; Path=/admin; Max-Age=0",
                ),
            );
            r
        }
        ("GET", ["view", route, key]) => pages::detail(&op, &caller, route, key, query).await,
        ("GET", ["view", route, key, "confirm"]) => {
            let action = query_pairs(query)
                .get("action")
                .cloned()
                .unwrap_or_default();
            pages::confirm(&caller, route, key, &action)
        }
        ("POST", ["view", route, key, action @ ("replay" | "forget")]) => {
            let form = console.read_form(body).await.unwrap_or_default();
            let sent = form.get("csrf").map(String::as_bytes).unwrap_or(b"");
            let want = caller.csrf.as_deref().unwrap_or("").as_bytes();
            if want.is_empty() || !bool::from(want.ct_eq(sent)) {
                tracing::warn!(target: "idemgate::audit", who = %caller.who, "console form refused: bad CSRF token");
                return pages::message(
                    StatusCode::FORBIDDEN,
                    "Refused",
                    "This form is out of date (CSRF check failed). Go back, reload and try again.",
                );
            }
            pages::act(&op, &caller, route, key, action).await
        }
        // Protecting the application: routes (pause/resume) and bulk jobs.
        ("GET", ["routes-page"]) => pages_ops::overview(console, &op, &caller).await,
        ("GET", ["jobs-page"]) => redirect("/admin/routes-page#jobs"),
        ("GET", ["routes-page", route, "confirm"]) => {
            let action = query_pairs(query)
                .get("action")
                .cloned()
                .unwrap_or_default();
            pages_ops::confirm_pause(console, &caller, route, &action)
        }
        ("POST", ["routes-page", route, action @ ("pause" | "resume")]) => {
            let form = console.read_form(body).await.unwrap_or_default();
            if let Some(refused) = csrf_refused(&caller, &form) {
                return refused;
            }
            pages_ops::set_paused(console, &op, &caller, route, *action == "pause").await
        }
        ("GET", ["jobs-page", "confirm"]) => {
            pages_ops::confirm_job(console, &caller, &query_pairs(query))
        }
        ("POST", ["jobs-page", "start"]) => {
            let form = console.read_form(body).await.unwrap_or_default();
            if let Some(refused) = csrf_refused(&caller, &form) {
                return refused;
            }
            pages_ops::start_job(&op, &caller, &form).await
        }
        ("GET", ["job", id]) => pages_ops::job(&op, &caller, id).await,
        ("GET", ["job", id, "confirm"]) => pages_ops::confirm_restart(&caller, id),
        ("POST", ["job", id, "restart"]) => {
            let form = console.read_form(body).await.unwrap_or_default();
            if let Some(refused) = csrf_refused(&caller, &form) {
                return refused;
            }
            pages_ops::restart_job(&op, &caller, id).await
        }
        _ => not_found(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "IDEMGATE_ADMIN_TOKEN" => Some("env-admin-token-0123456789".into()),
            "OPS" => Some("ops-token-0123456789abcdef".into()),
            "SHORT" => Some("short".into()),
            _ => None,
        }
    }

    fn console(toml: &str) -> Result<Console, crate::config::ConfigError> {
        Config::from_toml_with_env(toml, env).map(|c| Console::new(&c, Default::default()))
    }

    #[test]
    fn tokens_come_from_the_environment_and_named_entries() {
        let c = console(r#"admin_token = ["ops=env:OPS"]"#).unwrap();
        assert!(c.enabled());
        assert_eq!(
            c.token_name(b"env-admin-token-0123456789").as_deref(),
            Some("admin")
        );
        assert_eq!(
            c.token_name(b"ops-token-0123456789abcdef").as_deref(),
            Some("ops")
        );
        assert_eq!(c.token_name(b"ops-token-0123456789abcde"), None);
        assert_eq!(c.token_name(b""), None);
    }

    #[test]
    fn short_or_missing_tokens_are_configuration_errors() {
        let e = console(r#"admin_token = "x=env:SHORT""#).err().unwrap();
        assert_eq!(e.field, "admin_token[0]");
        let e = console(r#"admin_token = "x=env:MISSING""#).err().unwrap();
        assert!(e.message.contains("MISSING"));
        let e = console(r#"admin_token = ["env:OPS", "env:OPS"]"#)
            .err()
            .unwrap();
        assert!(e.message.contains("named `admin`"), "{e}");
    }

    #[test]
    fn without_a_token_the_console_is_off_and_check_config_redacts_tokens() {
        let c = Config::from_toml_with_env("", |_| None).unwrap();
        assert!(!Console::new(&c, Default::default()).enabled());
        let c = Config::from_toml_with_env(r#"admin_token = "ops=env:OPS""#, env).unwrap();
        let shown = c.redacted_toml();
        assert!(shown.contains("ops=env:OPS"), "{shown}");
        assert!(!shown.contains("ops-token-0123456789abcdef"));
        let c = Config::from_toml_with_env(r#"admin_token = "a-literal-token-123456""#, |_| None)
            .unwrap();
        assert!(!c.redacted_toml().contains("a-literal-token-123456"));
    }

    #[test]
    fn cookies_are_found_among_others() {
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; idemgate_session=abc; b=2"),
        );
        assert_eq!(cookie(&h, COOKIE).as_deref(), Some("abc"));
        assert_eq!(cookie(&h, "zzz"), None);
    }
}
