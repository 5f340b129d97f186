//! An application that watches how it is called: when each request arrived and ended,
//! how many ran at once (the most ever), and what it answered; its answers come from a
//! function of the request, so a test can make it slow, failing or asking to wait.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};

/// One request the application handled.
#[derive(Clone, Debug)]
pub struct Call {
    pub path: String,
    /// The sidecar's `idempotency-key`.
    pub key: String,
    pub body: Bytes,
    pub arrived: Instant,
    pub ended: Instant,
    pub status: u16,
}

/// The answer to one request: status, headers, and how long to take.
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub delay: Duration,
}

impl Reply {
    pub fn ok(delay: Duration) -> Reply {
        Reply {
            status: 200,
            headers: vec![],
            delay,
        }
    }
}

/// What the answer function sees.
pub struct Seen<'a> {
    pub path: &'a str,
}

type Answerer = dyn Fn(&Seen) -> Reply + Send + Sync;

struct State {
    answer: Box<Answerer>,
    calls: Mutex<Vec<Call>>,
    now: AtomicUsize,
    most: AtomicUsize,
}

pub struct ProbeApp {
    addr: SocketAddr,
    state: Arc<State>,
    task: tokio::task::JoinHandle<()>,
}

impl ProbeApp {
    pub async fn start(answer: impl Fn(&Seen) -> Reply + Send + Sync + 'static) -> ProbeApp {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(State {
            answer: Box::new(answer),
            calls: Mutex::new(Vec::new()),
            now: AtomicUsize::new(0),
            most: AtomicUsize::new(0),
        });
        let st = state.clone();
        let task = super::serve_each(listener, move |req| handle(st.clone(), req));
        ProbeApp { addr, state, task }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn calls(&self) -> Vec<Call> {
        self.state.calls.lock().unwrap().clone()
    }

    /// The most requests that ran at once.
    pub fn most_at_once(&self) -> usize {
        self.state.most.load(Ordering::SeqCst)
    }

    /// Waits until `n` requests answered 2xx.
    pub async fn wait_for_ok(&self, n: usize, deadline: Duration) {
        let end = Instant::now() + deadline;
        loop {
            let ok = self.calls().iter().filter(|c| c.status < 300).count();
            if ok >= n {
                return;
            }
            assert!(
                Instant::now() < end,
                "the application answered {ok} of {n} requests 2xx within {deadline:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for ProbeApp {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn handle(
    st: Arc<State>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let arrived = Instant::now();
    let now = st.now.fetch_add(1, Ordering::SeqCst) + 1;
    st.most.fetch_max(now, Ordering::SeqCst);
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    let path = parts.uri.path().to_string();
    let key = parts
        .headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let reply = (st.answer)(&Seen { path: &path });
    // The work goes on when the caller gives up (a timeout closes the connection and
    // drops this handler), as in a real application: it still counts as running.
    let (st2, status, delay) = (st.clone(), reply.status, reply.delay);
    let work = tokio::spawn(async move {
        tokio::time::sleep(delay).await;
        st2.now.fetch_sub(1, Ordering::SeqCst);
        st2.calls.lock().unwrap().push(Call {
            path,
            key,
            body,
            arrived,
            ended: Instant::now(),
            status,
        });
    });
    let _ = work.await;
    let mut b = Response::builder().status(reply.status);
    for (k, v) in &reply.headers {
        b = b.header(k, v);
    }
    Ok(b.body(Full::new(Bytes::from_static(b"{}"))).unwrap())
}
