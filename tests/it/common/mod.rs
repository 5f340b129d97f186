//! Shared harness for idemgate's end-to-end tests.
//!
//! Everything here runs real processes and real sockets on 127.0.0.1:
//! - [`RedisServer`]: a private `redis-server` per test (stop / start again on the same port).
//! - [`Upstream`]: a recording HTTP server standing in for the application.
//! - [`Sidecar`]: the real `idemgate` binary, configured through a TOML file.
//! - [`Delivery`]: a Standard Webhooks delivery, signed like a provider signs it.
//!
//! Waiting is always done by polling with a deadline, never by a bare sleep.

pub mod admin;
pub mod browser;
pub mod cluster;
pub mod file_store;
pub mod injector;
pub mod load;
pub mod monitor;
pub mod otlp;
pub mod preset_stack;
pub mod probe_app;
pub mod signer;

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::convert::Infallible;
use std::fs::File;
use std::io::Read;
use std::net::{SocketAddr, TcpListener as StdTcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use bytes::Bytes;
use hmac::{Hmac, KeyInit, Mac};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use sha2::Sha256;
use tempfile::TempDir;

/// The default Standard Webhooks secret of the default route.
pub const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
/// A second valid secret (for rotation tests).
pub const SECRET_2: &str = "whsec_c2Vjb25kLXNlY3JldC1mb3Itcm90YXRpb24tdGVzdHM=";
/// A secret idemgate is never configured with.
pub const SECRET_WRONG: &str = "whsec_d3Jvbmctc2VjcmV0LW5vYm9keS1jb25maWd1cmVkLWl0";

/// The default route.
pub const ROUTE: &str = "wh";
pub const PATH: &str = "/webhooks/wh";

/// A provider's logged claim that keeps no request (the store's log, as the gate writes it).
pub const LOGGED: Option<idemgate::store::log::ClaimLog<'static>> =
    Some(idemgate::store::log::ClaimLog {
        kept: None,
        replay: false,
    });
/// An operator's replay claim (as the admin API's replay takes it).
pub const REPLAY: Option<idemgate::store::log::ClaimLog<'static>> =
    Some(idemgate::store::log::ClaimLog {
        kept: None,
        replay: true,
    });

// ---------------------------------------------------------------------------
// small utilities
// ---------------------------------------------------------------------------

/// A 127.0.0.1 port that was free a moment ago. Ports handed out in this
/// process are never handed out twice, so parallel tests don't collide.
pub fn free_port() -> u16 {
    static GIVEN: OnceLock<Mutex<HashSet<u16>>> = OnceLock::new();
    let given = GIVEN.get_or_init(|| Mutex::new(HashSet::new()));
    for _ in 0..100 {
        let l = StdTcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let port = l.local_addr().unwrap().port();
        drop(l);
        if given.lock().unwrap().insert(port) {
            return port;
        }
    }
    panic!("could not find a free port");
}

pub fn now_secs() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// Runs the heavy, timing-sensitive tests (fault injection under load, the soak, the
/// failover storms) one at a time. All integration tests share one process, and two of
/// these at once on a 2-core machine would starve each other's store round trips past
/// the store timeouts they assert on; light tests still run beside them.
pub async fn exclusive() -> tokio::sync::MutexGuard<'static, ()> {
    static HEAVY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    HEAVY.lock().await
}

/// Sleeps until just after the start of the next wall-clock second, so a
/// timestamp computed now is still "now" for the sidecar a few ms later.
/// Used only by the tests at the exact edge of the tolerance window.
pub async fn align_to_second_start() {
    let sub = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_millis() as u64;
    tokio::time::sleep(Duration::from_millis(1000 - sub + 20)).await;
}

/// Polls `cond` every 20 ms until it returns true or `deadline` passes.
pub async fn wait_until<F: FnMut() -> bool>(deadline: Duration, what: &str, mut cond: F) {
    let end = Instant::now() + deadline;
    loop {
        if cond() {
            return;
        }
        if Instant::now() >= end {
            panic!("timed out after {deadline:?} waiting for: {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub fn unique_id(prefix: &str) -> String {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{prefix}_{}_{n}_{nanos}", std::process::id())
}

/// VmRSS of a process, in KiB (0 when unreadable).
pub fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn read_file_lossy(path: &PathBuf) -> String {
    let mut s = Vec::new();
    if let Ok(mut f) = File::open(path) {
        let _ = f.read_to_end(&mut s);
    }
    String::from_utf8_lossy(&s).into_owned()
}

// ---------------------------------------------------------------------------
// Standard Webhooks signing
// ---------------------------------------------------------------------------

/// `v1,<base64(HMAC-SHA256(key, "{id}.{ts}.{body}"))>` where key is the
/// base64-decoded part of `whsec_...`.
pub fn sign_standard(secret: &str, id: &str, ts: i64, body: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD;
    let key = b64
        .decode(secret.strip_prefix("whsec_").unwrap_or(secret))
        .expect("secret is base64");
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).expect("hmac key");
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(ts.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("v1,{}", b64.encode(mac.finalize().into_bytes()))
}

/// The three Standard Webhooks headers for a delivery.
pub fn standard_headers(secret: &str, id: &str, ts: i64, body: &[u8]) -> Vec<(String, String)> {
    vec![
        ("webhook-id".into(), id.into()),
        ("webhook-timestamp".into(), ts.to_string()),
        (
            "webhook-signature".into(),
            sign_standard(secret, id, ts, body),
        ),
    ]
}

/// One signed delivery as a provider would post it.
#[derive(Clone, Debug)]
pub struct Delivery {
    pub id: String,
    pub ts: i64,
    pub body: Vec<u8>,
    pub secret: String,
    /// path plus optional query, e.g. `/webhooks/wh?a=1`
    pub path: String,
    pub extra_headers: Vec<(String, String)>,
    /// header names to leave out
    pub omit: Vec<String>,
    pub signature_override: Option<String>,
    pub timestamp_override: Option<String>,
}

impl Delivery {
    pub fn new(id: &str, body: impl Into<Vec<u8>>) -> Self {
        Delivery {
            id: id.to_string(),
            ts: now_secs(),
            body: body.into(),
            secret: SECRET.to_string(),
            path: PATH.to_string(),
            extra_headers: vec![("content-type".into(), "application/json".into())],
            omit: vec![],
            signature_override: None,
            timestamp_override: None,
        }
    }
    /// A delivery with a fresh id and a small JSON body.
    pub fn fresh() -> Self {
        let id = unique_id("msg");
        let body = format!(r#"{{"type":"invoice.paid","data":{{"id":"{id}","amount":4200}}}}"#);
        Self::new(&id, body)
    }
    pub fn ts(mut self, ts: i64) -> Self {
        self.ts = ts;
        self
    }
    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Self {
        self.body = body.into();
        self
    }
    pub fn secret(mut self, s: &str) -> Self {
        self.secret = s.to_string();
        self
    }
    pub fn path(mut self, p: &str) -> Self {
        self.path = p.to_string();
        self
    }
    pub fn header(mut self, k: &str, v: &str) -> Self {
        self.extra_headers.push((k.to_string(), v.to_string()));
        self
    }
    pub fn omit(mut self, name: &str) -> Self {
        self.omit.push(name.to_ascii_lowercase());
        self
    }
    pub fn signature(mut self, sig: &str) -> Self {
        self.signature_override = Some(sig.to_string());
        self
    }
    pub fn timestamp_raw(mut self, ts: &str) -> Self {
        self.timestamp_override = Some(ts.to_string());
        self
    }
    pub fn headers(&self) -> Vec<(String, String)> {
        let mut h = standard_headers(&self.secret, &self.id, self.ts, &self.body);
        for (k, v) in h.iter_mut() {
            if k == "webhook-signature"
                && let Some(s) = &self.signature_override
            {
                *v = s.clone();
            }
            if k == "webhook-timestamp"
                && let Some(t) = &self.timestamp_override
            {
                *v = t.clone();
            }
        }
        h.extend(self.extra_headers.iter().cloned());
        h.retain(|(k, _)| !self.omit.contains(&k.to_ascii_lowercase()));
        h
    }
}

/// What the provider got back.
#[derive(Clone, Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub body: Vec<u8>,
    pub elapsed: Duration,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
    }
    pub fn replayed(&self) -> bool {
        self.header("idempotent-replayed").as_deref() == Some("true")
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("answer body is not JSON ({e}): {:?}", self.text()))
    }
    /// Retry-After as whole seconds; panics if absent or not an integer.
    pub fn retry_after(&self) -> u64 {
        let v = self
            .header("retry-after")
            .unwrap_or_else(|| panic!("no retry-after header in {self:?}"));
        v.trim()
            .parse::<u64>()
            .unwrap_or_else(|_| panic!("retry-after {v:?} is not a whole number of seconds"))
    }
    /// Asserts an error answer: status, JSON `error` code and a `message` string.
    pub fn assert_error(&self, status: u16, code: &str) {
        assert_eq!(
            self.status,
            status,
            "expected {status} {code}, got {} {:?}",
            self.status,
            self.text()
        );
        let j = self.json();
        assert_eq!(
            j["error"].as_str(),
            Some(code),
            "error body {:?}",
            self.text()
        );
        assert!(
            j["message"].as_str().is_some_and(|m| !m.is_empty()),
            "error body has no message: {:?}",
            self.text()
        );
    }
}

pub fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .connect_timeout(Duration::from_secs(5))
        .build()
        .expect("reqwest client")
}

/// POSTs `body` with `headers` to `url`.
pub async fn post(
    client: &reqwest::Client,
    url: &str,
    headers: &[(String, String)],
    body: Vec<u8>,
) -> Result<Answer, reqwest::Error> {
    let start = Instant::now();
    let mut rb = client.post(url);
    for (k, v) in headers {
        rb = rb.header(k.as_str(), v.as_str());
    }
    let resp = rb.body(body).send().await?;
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp.bytes().await?.to_vec();
    Ok(Answer {
        status,
        headers,
        body,
        elapsed: start.elapsed(),
    })
}

// ---------------------------------------------------------------------------
// redis-server
// ---------------------------------------------------------------------------

/// A private `redis-server` on a free 127.0.0.1 port, killed on drop.
pub struct RedisServer {
    port: u16,
    child: Option<Child>,
    dir: TempDir,
    /// extra redis-server arguments (e.g. durable AOF for crash tests)
    extra: Vec<String>,
}

impl RedisServer {
    /// Starts a new server on a fresh port and waits until it answers PING.
    pub fn start_new() -> RedisServer {
        Self::start_new_with(&[])
    }

    /// Like [`start_new`](Self::start_new), with extra `redis-server` arguments that
    /// also apply on every restart (e.g. `--appendonly yes --appendfsync always`, so
    /// that a SIGKILL loses nothing Redis acknowledged).
    pub fn start_new_with(extra: &[&str]) -> RedisServer {
        let dir = tempfile::tempdir().expect("tempdir");
        for _ in 0..5 {
            let mut r = RedisServer {
                port: free_port(),
                child: None,
                dir: tempfile::tempdir().expect("tempdir"),
                extra: extra.iter().map(|s| s.to_string()).collect(),
            };
            if r.try_start() {
                return r;
            }
        }
        drop(dir);
        panic!("could not start redis-server");
    }

    /// Starts the server again on the SAME port (after [`stop`](Self::stop)).
    pub fn start(&mut self) {
        assert!(self.child.is_none(), "redis-server already running");
        for _ in 0..50 {
            if self.try_start() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "could not restart redis-server on port {}: {}",
            self.port,
            self.log()
        );
    }

    fn try_start(&mut self) -> bool {
        let log = File::create(self.dir.path().join("redis.log")).expect("log file");
        let child = Command::new("redis-server")
            .args(["--save", "", "--appendonly", "no", "--bind", "127.0.0.1"])
            .args(["--port", &self.port.to_string()])
            .arg("--dir")
            .arg(self.dir.path())
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn redis-server (is it installed?)");
        self.child = Some(child);
        let end = Instant::now() + Duration::from_secs(10);
        while Instant::now() < end {
            if let Some(Ok(Some(_))) = self.child.as_mut().map(|c| c.try_wait()) {
                // exited: port taken or similar
                self.child = None;
                return false;
            }
            if self.ping() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.stop();
        false
    }

    /// Kills the server (SIGKILL) and waits for it to be gone.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    pub fn ping(&self) -> bool {
        Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "PING"])
            .stderr(Stdio::null())
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "PONG")
            .unwrap_or(false)
    }

    /// Runs one redis-cli command; returns its stdout (trimmed).
    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("run redis-cli");
        assert!(out.status.success(), "redis-cli {args:?} failed: {out:?}");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// `CLIENT PAUSE ms`: every client's commands block for `ms`.
    pub fn pause(&self, ms: u64) {
        let r = self.cli(&["CLIENT", "PAUSE", &ms.to_string(), "ALL"]);
        assert_eq!(r, "OK", "CLIENT PAUSE answered {r:?}");
    }

    /// All keys (SCAN), for inspecting what idemgate stored.
    pub fn keys(&self) -> Vec<String> {
        let out = self.cli(&["--scan", "--pattern", "*"]);
        out.lines()
            .map(|l| l.trim().to_string())
            .filter(|l| !l.is_empty())
            .collect()
    }

    pub fn log(&self) -> String {
        read_file_lossy(&self.dir.path().join("redis.log"))
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

// ---------------------------------------------------------------------------
// the upstream application
// ---------------------------------------------------------------------------

/// How the upstream answers.
#[derive(Clone, Debug)]
pub enum Mode {
    /// Answer at once with this status, headers and body.
    Ok {
        status: u16,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
    },
    /// Answer at once with this status, `x-upstream: yes` and a small JSON body.
    Status(u16),
    /// Answer the default 200 after the delay.
    Stall(Duration),
    /// Answer with the inner mode after the delay.
    Delayed(Duration, Box<Mode>),
    /// Answer with the inner mode once the test releases the hold (see [`Hold`]).
    Held(Hold, Box<Mode>),
    /// Never answer.
    Hang,
}

/// Holds the upstream's answers to the requests that arrived before its next
/// [`release`](Hold::release), so a test that needs a call still in flight waits for
/// nothing but its own step, not a wall-clock margin.
#[derive(Clone, Debug)]
pub struct Hold(Arc<tokio::sync::watch::Sender<u64>>);

impl Default for Hold {
    fn default() -> Self {
        Hold(Arc::new(tokio::sync::watch::Sender::new(0)))
    }
}

impl Hold {
    /// Answers every request held so far; later ones are held again.
    pub fn release(&self) {
        self.0.send_modify(|g| *g += 1);
    }

    /// The current generation, taken when a request arrives.
    fn generation(&self) -> u64 {
        *self.0.borrow()
    }

    /// Waits until the generation passes `g`.
    async fn released_after(&self, g: u64) {
        let mut rx = self.0.subscribe();
        let _ = rx.wait_for(|v| *v > g).await;
    }
}

impl Mode {
    /// The default 200, once `hold` is released.
    pub fn held(hold: &Hold) -> Mode {
        Mode::Held(hold.clone(), Box::new(Mode::default_ok()))
    }

    pub fn default_ok() -> Mode {
        Mode::Ok {
            status: 200,
            headers: vec![
                ("x-upstream".into(), "yes".into()),
                ("content-type".into(), "application/json".into()),
            ],
            body: br#"{"ok":true}"#.to_vec(),
        }
    }
}

/// One request the upstream received.
#[derive(Clone, Debug)]
pub struct Recorded {
    pub method: String,
    /// path plus query, e.g. `/webhooks/wh?a=1`
    pub path_and_query: String,
    pub headers: http::HeaderMap,
    pub body: Bytes,
}

impl Recorded {
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
    }
    pub fn header_all(&self, name: &str) -> Vec<String> {
        self.headers
            .get_all(name)
            .iter()
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .collect()
    }
}

struct UpState {
    mode: Mutex<Mode>,
    queue: Mutex<VecDeque<Mode>>,
    reqs: Mutex<Vec<Recorded>>,
}

/// A recording HTTP/1.1 + h2c server on 127.0.0.1.
pub struct Upstream {
    addr: SocketAddr,
    state: Arc<UpState>,
    task: tokio::task::JoinHandle<()>,
}

impl Upstream {
    pub async fn start() -> Upstream {
        Self::start_at("127.0.0.1:0".parse().unwrap()).await
    }

    /// Listens on a given address (e.g. one from [`unused_addr`](Self::unused_addr)).
    pub async fn start_at(addr: SocketAddr) -> Upstream {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .unwrap_or_else(|e| panic!("upstream bind {addr}: {e}"));
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(UpState {
            mode: Mutex::new(Mode::default_ok()),
            queue: Mutex::new(VecDeque::new()),
            reqs: Mutex::new(Vec::new()),
        });
        let st = state.clone();
        let task = serve_each(listener, move |req| handle(st.clone(), req));
        Upstream { addr, state, task }
    }

    /// An address where nothing listens.
    pub fn unused_addr() -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], free_port()))
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Sets the mode for all following requests (the queue goes first).
    pub fn set_mode(&self, m: Mode) {
        *self.state.mode.lock().unwrap() = m;
    }

    /// Queues modes used one per request, before falling back to the mode.
    pub fn push_modes(&self, ms: Vec<Mode>) {
        self.state.queue.lock().unwrap().extend(ms);
    }

    pub fn count(&self) -> usize {
        self.state.reqs.lock().unwrap().len()
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.state.reqs.lock().unwrap().clone()
    }

    pub fn last(&self) -> Recorded {
        self.requests()
            .last()
            .cloned()
            .expect("upstream got no request")
    }

    /// Waits until at least `n` requests arrived.
    pub async fn wait_for_count(&self, n: usize, deadline: Duration) {
        let end = Instant::now() + deadline;
        while self.count() < n {
            if Instant::now() >= end {
                panic!(
                    "upstream: expected {n} request(s) within {deadline:?}, got {}",
                    self.count()
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Asserts that the count is `n` now and stays `n` for `period`.
    pub async fn assert_count_stays(&self, n: usize, period: Duration) {
        let end = Instant::now() + period;
        loop {
            assert_eq!(
                self.count(),
                n,
                "upstream request count changed: {:#?}",
                self.requests()
                    .iter()
                    .map(|r| (
                        r.method.clone(),
                        r.path_and_query.clone(),
                        r.header("idempotency-key")
                    ))
                    .collect::<Vec<_>>()
            );
            if Instant::now() >= end {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Serves `handle` (HTTP/1 and 2) on every connection `listener` accepts, until the
/// returned task is aborted: the test applications' accept loop.
pub fn serve_each<F, Fut>(
    listener: tokio::net::TcpListener,
    handle: F,
) -> tokio::task::JoinHandle<()>
where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<Response<Full<Bytes>>, Infallible>> + Send + 'static,
{
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let handle = handle.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(handle);
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    })
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn handle(
    st: Arc<UpState>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (parts, body) = req.into_parts();
    let body = match body.collect().await {
        Ok(c) => c.to_bytes(),
        Err(_) => Bytes::new(),
    };
    let path_and_query = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| parts.uri.path().to_string());
    let queued = st.queue.lock().unwrap().pop_front();
    let mut mode = queued.unwrap_or_else(|| st.mode.lock().unwrap().clone());
    // Taken before the request is counted, so a test that saw it counted and then
    // releases the hold releases this request.
    let held_at = match &mode {
        Mode::Held(h, _) => h.generation(),
        _ => 0,
    };
    st.reqs.lock().unwrap().push(Recorded {
        method: parts.method.to_string(),
        path_and_query,
        headers: parts.headers,
        body,
    });
    loop {
        match mode {
            Mode::Delayed(d, inner) => {
                tokio::time::sleep(d).await;
                mode = *inner;
            }
            Mode::Stall(d) => {
                tokio::time::sleep(d).await;
                mode = Mode::default_ok();
            }
            Mode::Held(h, inner) => {
                h.released_after(held_at).await;
                mode = *inner;
            }
            Mode::Hang => std::future::pending::<()>().await,
            Mode::Status(n) => {
                let resp = Response::builder()
                    .status(n)
                    .header("x-upstream", "yes")
                    .header("content-type", "application/json")
                    .body(Full::new(Bytes::from(format!(
                        r#"{{"upstream_status":{n}}}"#
                    ))))
                    .unwrap();
                return Ok(resp);
            }
            Mode::Ok {
                status,
                headers,
                body,
            } => {
                let mut b = Response::builder().status(status);
                for (k, v) in headers {
                    b = b.header(k, v);
                }
                return Ok(b.body(Full::new(Bytes::from(body))).unwrap());
            }
        }
    }
}

// ---------------------------------------------------------------------------
// the sidecar
// ---------------------------------------------------------------------------

/// One `[[route]]`.
#[derive(Clone, Debug)]
pub struct RouteCfg {
    pub name: String,
    pub path: String,
    pub provider: String,
    pub secrets: Vec<String>,
    pub tolerance: Option<String>,
    pub key: Option<String>,
    pub extra: String,
}

impl RouteCfg {
    pub fn standard(name: &str, path: &str) -> Self {
        RouteCfg {
            name: name.into(),
            path: path.into(),
            provider: "standard".into(),
            secrets: vec![SECRET.into()],
            tolerance: Some("5m".into()),
            key: None,
            extra: String::new(),
        }
    }
    pub fn secrets(mut self, s: &[&str]) -> Self {
        self.secrets = s.iter().map(|s| s.to_string()).collect();
        self
    }
    pub fn key(mut self, k: &str) -> Self {
        self.key = Some(k.into());
        self
    }
    pub fn tolerance(mut self, t: &str) -> Self {
        self.tolerance = Some(t.into());
        self
    }
    fn toml(&self) -> String {
        let mut s = String::from("[[route]]\n");
        s += &format!("name = {}\n", q(&self.name));
        s += &format!("path = {}\n", q(&self.path));
        s += &format!("provider = {}\n", q(&self.provider));
        let secrets: Vec<String> = self.secrets.iter().map(|x| q(x)).collect();
        s += &format!("secrets = [{}]\n", secrets.join(", "));
        if let Some(t) = &self.tolerance {
            s += &format!("tolerance = {}\n", q(t));
        }
        if let Some(k) = &self.key {
            s += &format!("key = {}\n", q(k));
        }
        s += &self.extra;
        s
    }
}

/// A TOML basic string (JSON string escaping is valid TOML for our values).
fn q(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}

/// Builds a config file and starts `idemgate run --config FILE`.
#[derive(Clone, Debug)]
pub struct SidecarBuilder {
    pub top: BTreeMap<String, String>,
    pub store: BTreeMap<String, String>,
    /// `[store]` entries written as given (numbers): `min_replicas_ack = 1`
    pub store_raw: BTreeMap<String, String>,
    pub dedup: BTreeMap<String, String>,
    pub routes: Vec<RouteCfg>,
    /// raw TOML appended at the end of the file
    pub extra: String,
    /// extra environment for the process (after the IDEMGATE_LOG defaults)
    pub env: Vec<(String, String)>,
}

impl SidecarBuilder {
    pub fn new(upstream_url: &str, store_url: &str) -> Self {
        let mut top = BTreeMap::new();
        top.insert("upstream".to_string(), upstream_url.to_string());
        top.insert("upstream_timeout".to_string(), "5s".to_string());
        top.insert("max_body".to_string(), "1MiB".to_string());
        top.insert("shutdown_grace".to_string(), "5s".to_string());
        let mut store = BTreeMap::new();
        store.insert("url".to_string(), store_url.to_string());
        store.insert("key_prefix".to_string(), "idemgate-test".to_string());
        store.insert("timeout".to_string(), "1s".to_string());
        store.insert("on_error".to_string(), "reject".to_string());
        let mut dedup = BTreeMap::new();
        dedup.insert("lease".to_string(), "30s".to_string());
        dedup.insert("retention".to_string(), "1h".to_string());
        dedup.insert("in_flight".to_string(), "reject".to_string());
        dedup.insert("wait_timeout".to_string(), "5s".to_string());
        SidecarBuilder {
            top,
            store,
            store_raw: BTreeMap::new(),
            dedup,
            routes: vec![],
            extra: String::new(),
            env: vec![],
        }
    }
    pub fn top(mut self, k: &str, v: &str) -> Self {
        self.top.insert(k.into(), v.into());
        self
    }
    pub fn store_opt(mut self, k: &str, v: &str) -> Self {
        self.store.insert(k.into(), v.into());
        self
    }
    /// A `[store]` entry written unquoted, e.g. `("min_replicas_ack", "1")`.
    pub fn store_raw(mut self, k: &str, v: &str) -> Self {
        self.store_raw.insert(k.into(), v.into());
        self
    }
    pub fn dedup(mut self, k: &str, v: &str) -> Self {
        self.dedup.insert(k.into(), v.into());
        self
    }
    pub fn lease(self, v: &str) -> Self {
        self.dedup("lease", v)
    }
    pub fn route(mut self, r: RouteCfg) -> Self {
        self.routes.push(r);
        self
    }
    pub fn env(mut self, k: &str, v: &str) -> Self {
        self.env.push((k.into(), v.into()));
        self
    }
    pub fn extra(mut self, raw: &str) -> Self {
        self.extra.push_str(raw);
        self.extra.push('\n');
        self
    }

    pub fn toml(&self, listen: SocketAddr, admin: SocketAddr) -> String {
        let mut s = String::new();
        s += &format!("listen = {}\n", q(&listen.to_string()));
        s += &format!("admin_listen = {}\n", q(&admin.to_string()));
        for (k, v) in &self.top {
            s += &format!("{k} = {}\n", q(v));
        }
        s += "\n[store]\n";
        for (k, v) in &self.store {
            s += &format!("{k} = {}\n", q(v));
        }
        for (k, v) in &self.store_raw {
            s += &format!("{k} = {v}\n");
        }
        s += "\n[dedup]\n";
        for (k, v) in &self.dedup {
            s += &format!("{k} = {}\n", q(v));
        }
        let routes = if self.routes.is_empty() {
            vec![RouteCfg::standard(ROUTE, PATH)]
        } else {
            self.routes.clone()
        };
        for r in routes {
            s += "\n";
            s += &r.toml();
        }
        if !self.extra.is_empty() {
            s += "\n";
            s += &self.extra;
        }
        s
    }

    /// Writes the config, spawns the binary and waits for `/healthz` 200.
    /// Retries with fresh ports if the process dies before it is healthy
    /// (a port taken by a parallel test); panics with its stderr otherwise.
    pub async fn start(self) -> Sidecar {
        let mut last_err = String::new();
        for _attempt in 0..3 {
            let dir = tempfile::tempdir().expect("tempdir");
            let listen = SocketAddr::from(([127, 0, 0, 1], free_port()));
            let admin = SocketAddr::from(([127, 0, 0, 1], free_port()));
            let cfg = self.toml(listen, admin);
            let cfg_path = dir.path().join("idemgate.toml");
            std::fs::write(&cfg_path, &cfg).unwrap();
            let stderr_path = dir.path().join("stderr.log");
            let mut cmd = Command::new(env!("CARGO_BIN_EXE_idemgate"));
            cmd.arg("run").arg("--config").arg(&cfg_path);
            for (k, _) in std::env::vars() {
                // OTEL_*: a developer's own collector settings must not trace the tests.
                if k.starts_with("IDEMGATE_") || k.starts_with("OTEL_") {
                    cmd.env_remove(k);
                }
            }
            cmd.env("IDEMGATE_LOG", "info")
                .env("IDEMGATE_LOG_FORMAT", "text")
                .env("NO_COLOR", "1")
                .stdin(Stdio::null())
                .stdout(File::create(dir.path().join("stdout.log")).unwrap())
                .stderr(File::create(&stderr_path).unwrap());
            for (k, v) in &self.env {
                cmd.env(k, v);
            }
            let child = cmd.spawn().expect("spawn idemgate");
            let mut sc = Sidecar {
                child: Some(child),
                listen,
                admin,
                _dir: dir,
                stderr_path,
                config: cfg,
                client: http_client(),
                exit: None,
            };
            match sc.wait_healthy(Duration::from_secs(10)).await {
                Ok(()) => {
                    sc.wait_log_written().await;
                    return sc;
                }
                Err(e) => {
                    last_err = format!(
                        "{e}\n--- config ---\n{}\n--- stderr ---\n{}",
                        sc.config,
                        sc.stderr()
                    );
                    let exited = sc.exit.is_some();
                    sc.kill9();
                    if !exited {
                        break; // alive but never healthy: don't retry
                    }
                }
            }
        }
        panic!("idemgate did not become healthy: {last_err}");
    }
}

/// A running idemgate process.
pub struct Sidecar {
    child: Option<Child>,
    pub listen: SocketAddr,
    pub admin: SocketAddr,
    /// The config and the logs live here; removed when the sidecar is dropped.
    _dir: TempDir,
    stderr_path: PathBuf,
    pub config: String,
    pub client: reqwest::Client,
    exit: Option<ExitStatus>,
}

impl Sidecar {
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.listen, path)
    }
    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{}", self.admin, path)
    }
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("process").id()
    }
    /// The directory of the config file and the logs.
    pub fn dir(&self) -> &Path {
        self._dir.path()
    }
    /// The config file the process was started with (`--config`).
    pub fn config_path(&self) -> PathBuf {
        self._dir.path().join("idemgate.toml")
    }
    /// Sends the process a signal (`HUP`, `TERM`...).
    pub fn signal(&self, name: &str) {
        let st = Command::new("kill")
            .args([&format!("-{name}"), &self.pid().to_string()])
            .status()
            .expect("run kill");
        assert!(st.success(), "kill -{name} failed");
    }

    async fn wait_healthy(&mut self, deadline: Duration) -> Result<(), String> {
        let end = Instant::now() + deadline;
        let client = http_client();
        loop {
            if let Some(st) = self.try_exit() {
                return Err(format!("idemgate exited before it was healthy: {st}"));
            }
            if let Ok(r) = client
                .get(self.admin_url("/healthz"))
                .timeout(Duration::from_millis(500))
                .send()
                .await
                && r.status().as_u16() == 200
            {
                return Ok(());
            }
            if Instant::now() >= end {
                return Err(format!("/healthz not 200 within {deadline:?}"));
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Waits until the start's log lines are in the stderr file: they are written in
    /// batches (`idemgate::logging`), and "idemgate serving", logged before `/healthz`
    /// can answer, is the last of them; a test reading the log at once finds them all.
    async fn wait_log_written(&self) {
        wait_until(
            Duration::from_secs(10),
            "the start's log lines written",
            || self.stderr().contains("idemgate serving"),
        )
        .await;
    }

    /// The exit status if the process has exited.
    pub fn try_exit(&mut self) -> Option<ExitStatus> {
        if self.exit.is_none()
            && let Some(c) = self.child.as_mut()
            && let Ok(Some(st)) = c.try_wait()
        {
            self.exit = Some(st);
        }
        self.exit
    }

    pub fn is_running(&mut self) -> bool {
        self.try_exit().is_none()
    }

    pub fn stderr(&self) -> String {
        read_file_lossy(&self.stderr_path)
    }
    pub fn kill9(&mut self) {
        if let Some(c) = self.child.as_mut()
            && self.exit.is_none()
        {
            let _ = c.kill();
            if let Ok(st) = c.wait() {
                self.exit = Some(st);
            }
        }
    }

    pub fn sigterm(&self) {
        let st = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status()
            .expect("run kill");
        assert!(st.success(), "kill -TERM failed");
    }

    /// Waits (polling) for the process to exit; panics at the deadline.
    pub async fn wait_exit(&mut self, deadline: Duration) -> ExitStatus {
        let end = Instant::now() + deadline;
        loop {
            if let Some(st) = self.try_exit() {
                return st;
            }
            if Instant::now() >= end {
                panic!("idemgate did not exit within {deadline:?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Sends a delivery (to its own path) and returns the answer.
    pub async fn send(&self, d: &Delivery) -> Answer {
        self.try_send(d)
            .await
            .unwrap_or_else(|e| panic!("delivery {} failed at the HTTP level: {e:?}", d.id))
    }

    pub async fn try_send(&self, d: &Delivery) -> Result<Answer, reqwest::Error> {
        post(
            &self.client,
            &self.url(&d.path),
            &d.headers(),
            d.body.clone(),
        )
        .await
    }

    /// A future sending the delivery, independent of `self` (for spawning).
    pub fn send_spawned(&self, d: &Delivery) -> tokio::task::JoinHandle<Answer> {
        self.send_spawned_on(self.client.clone(), d)
    }

    /// As `send_spawned`, through `client` (a new one: a connection of its own).
    pub fn send_spawned_on(
        &self,
        client: reqwest::Client,
        d: &Delivery,
    ) -> tokio::task::JoinHandle<Answer> {
        let url = self.url(&d.path);
        let headers = d.headers();
        let body = d.body.clone();
        let id = d.id.clone();
        tokio::spawn(async move {
            post(&client, &url, &headers, body)
                .await
                .unwrap_or_else(|e| panic!("delivery {id} failed at the HTTP level: {e:?}"))
        })
    }

    pub async fn get_admin(&self, path: &str) -> (u16, String) {
        let r = self
            .client
            .get(self.admin_url(path))
            .timeout(Duration::from_secs(10))
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET {path}: {e:?}"));
        let s = r.status().as_u16();
        (s, r.text().await.unwrap_or_default())
    }

    pub async fn readyz(&self) -> u16 {
        self.get_admin("/readyz").await.0
    }

    /// Polls `/readyz` until it answers `status`.
    pub async fn wait_readyz(&self, status: u16, deadline: Duration) {
        let end = Instant::now() + deadline;
        let mut last = 0;
        while Instant::now() < end {
            last = self.readyz().await;
            if last == status {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("/readyz did not become {status} within {deadline:?} (last {last})");
    }

    pub async fn metrics(&self) -> String {
        let (s, body) = self.get_admin("/metrics").await;
        assert_eq!(s, 200, "/metrics answered {s}");
        body
    }

    /// The value of one series, e.g.
    /// `idemgate_requests_total{route="wh",outcome="forwarded"}` (label order
    /// doesn't matter); 0.0 when the series is absent.
    pub async fn metric(&self, series: &str) -> f64 {
        metric_value(&self.metrics().await, series).unwrap_or(0.0)
    }

    /// `idemgate_requests_total{route,outcome}`.
    pub async fn requests_total(&self, route: &str, outcome: &str) -> f64 {
        self.metric(&format!(
            "idemgate_requests_total{{route=\"{route}\",outcome=\"{outcome}\"}}"
        ))
        .await
    }

    /// Polls until `series` equals `want` (metrics may be recorded just after
    /// the answer is sent); panics with the metrics text at the deadline.
    pub async fn wait_metric(&self, series: &str, want: f64) {
        let end = Instant::now() + Duration::from_secs(3);
        loop {
            let text = self.metrics().await;
            let v = metric_value(&text, series).unwrap_or(0.0);
            if (v - want).abs() < 1e-9 {
                return;
            }
            if Instant::now() >= end {
                let relevant: Vec<&str> = text
                    .lines()
                    .filter(|l| {
                        l.starts_with("idemgate_requests_total")
                            || l.contains(series.split('{').next().unwrap())
                    })
                    .collect();
                panic!(
                    "metric {series} is {v}, expected {want}; metrics:\n{}",
                    relevant.join("\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
    }

    /// Polls until `series` is at least `min`.
    pub async fn wait_metric_at_least(&self, series: &str, min: f64) -> f64 {
        let end = Instant::now() + Duration::from_secs(3);
        loop {
            let text = self.metrics().await;
            let v = metric_value(&text, series).unwrap_or(0.0);
            if v >= min {
                return v;
            }
            if Instant::now() >= end {
                panic!("metric {series} is {v}, expected at least {min}; metrics:\n{text}");
            }
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
    }

    /// Asserts that none of `needles` appears in the process's stderr.
    pub fn assert_log_lacks(&self, needles: &[&str]) {
        let log = self.stderr();
        for n in needles {
            assert!(!n.is_empty());
            assert!(!log.contains(n), "the log contains {n:?}:\n{log}");
        }
    }

    pub async fn wait_requests_total(&self, route: &str, outcome: &str, want: f64) {
        self.wait_metric(
            &format!("idemgate_requests_total{{route=\"{route}\",outcome=\"{outcome}\"}}"),
            want,
        )
        .await
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "===== idemgate (listen {}, admin {}) config =====\n{}\n===== idemgate stderr =====\n{}\n===== end idemgate stderr =====",
                self.listen,
                self.admin,
                self.config,
                self.stderr()
            );
        }
        self.kill9();
    }
}

// ---------------------------------------------------------------------------
// Prometheus text parsing
// ---------------------------------------------------------------------------

/// Splits `name{a="b",c="d"}` into the name and its sorted label pairs.
pub fn parse_series(s: &str) -> (String, Vec<(String, String)>) {
    let s = s.trim();
    let Some(open) = s.find('{') else {
        return (s.to_string(), vec![]);
    };
    let name = s[..open].to_string();
    let close = s.rfind('}').expect("unbalanced braces in series");
    let inner = &s[open + 1..close];
    let mut labels = vec![];
    let mut chars = inner.chars().peekable();
    loop {
        while matches!(chars.peek(), Some(',') | Some(' ')) {
            chars.next();
        }
        let mut key = String::new();
        for c in chars.by_ref() {
            if c == '=' {
                break;
            }
            key.push(c);
        }
        if key.is_empty() {
            break;
        }
        assert_eq!(chars.next(), Some('"'), "label value must be quoted in {s}");
        let mut val = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => {
                    if let Some(n) = chars.next() {
                        val.push(match n {
                            'n' => '\n',
                            other => other,
                        });
                    }
                }
                '"' => break,
                c => val.push(c),
            }
        }
        labels.push((key.trim().to_string(), val));
    }
    labels.sort();
    (name, labels)
}

/// Finds `series` in a Prometheus text exposition.
pub fn metric_value(text: &str, series: &str) -> Option<f64> {
    let want = parse_series(series);
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        // the series ends at the closing brace, or at the first space without labels
        let (series_part, rest) = match line.find('{') {
            Some(_) => {
                let close = line.rfind('}')?;
                (&line[..=close], &line[close + 1..])
            }
            None => match line.find(' ') {
                Some(sp) => (&line[..sp], &line[sp..]),
                None => continue,
            },
        };
        if parse_series(series_part) == want {
            let v = rest.split_whitespace().next()?;
            return match v {
                "+Inf" => Some(f64::INFINITY),
                "-Inf" => Some(f64::NEG_INFINITY),
                v => v.parse().ok(),
            };
        }
    }
    None
}

// ---------------------------------------------------------------------------
// store selection
// ---------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreKind {
    Redis,
    Memory,
}

/// The store for a test: a private redis-server, or `memory`.
pub struct TestStore {
    pub redis: Option<RedisServer>,
}

impl TestStore {
    pub fn new(kind: StoreKind) -> TestStore {
        match kind {
            StoreKind::Redis => TestStore {
                redis: Some(RedisServer::start_new()),
            },
            StoreKind::Memory => TestStore { redis: None },
        }
    }
    pub fn url(&self) -> String {
        match &self.redis {
            Some(r) => r.url(),
            None => "memory".to_string(),
        }
    }
    pub fn redis(&self) -> &RedisServer {
        self.redis.as_ref().expect("a redis test")
    }
    pub fn redis_mut(&mut self) -> &mut RedisServer {
        self.redis.as_mut().expect("a redis test")
    }
}

/// A raw HTTP/1.1 exchange over TCP: writes `head` and `body_part` (which may
/// be shorter than the Content-Length the head announces), then reads the
/// answer until the server closes the connection or `deadline` passes.
/// Returns (bytes read, whether the server closed the connection).
pub async fn raw_exchange(
    addr: SocketAddr,
    head: &str,
    body_part: &[u8],
    deadline: Duration,
) -> (Vec<u8>, bool) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(head.as_bytes()).await.expect("write head");
    // the server may answer and close before taking everything: ignore write errors
    let _ = s.write_all(body_part).await;
    let _ = s.flush().await;
    let mut out = Vec::new();
    let end = Instant::now() + deadline;
    let mut buf = [0u8; 8192];
    loop {
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return (out, false);
        }
        match tokio::time::timeout(left, s.read(&mut buf)).await {
            Err(_) => return (out, false),
            Ok(Ok(0)) => return (out, true),
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
            Ok(Err(_)) => return (out, true), // reset: closed
        }
    }
}
