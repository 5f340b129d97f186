//! Bounded load with duplicates, and the invariants checked after faults:
//! - no request hangs beyond its bound;
//! - no claim stays stuck beyond `lease`;
//! - no delivery answered 2xx is forwarded again (except the documented window: its
//!   completion could not be recorded, which the sidecar logs as a lease loss);
//! - no delivery is lost: once the faults are over, every provider retry gets a 2xx.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::*;

/// One request the load sent and what it got.
#[derive(Clone, Debug)]
pub struct Sent {
    pub id: String,
    pub body: Vec<u8>,
    /// `None`: no HTTP answer (connection refused or reset, e.g. the sidecar was killed).
    pub status: Option<u16>,
    /// The request hit the client's timeout: it hung.
    pub hung: bool,
    pub elapsed: Duration,
}

/// Where the load sends (changes when the sidecar is restarted on new ports).
pub type Target = Arc<Mutex<String>>;

pub fn target(sc: &Sidecar) -> Target {
    Arc::new(Mutex::new(sc.url(PATH)))
}

/// A handle on load running in the background.
pub struct Load {
    pub sent: Arc<Mutex<Vec<Sent>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    pub fn count(&self) -> usize {
        self.sent.lock().unwrap().len()
    }

    /// Waits until at least `n` answers are in (bounded).
    pub async fn wait_for(&self, n: usize, deadline: Duration) {
        let end = Instant::now() + deadline;
        while self.count() < n && Instant::now() < end {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn finish(self) -> Vec<Sent> {
        for t in self.tasks {
            t.await.expect("load worker panicked");
        }
        Arc::try_unwrap(self.sent)
            .map(|m| m.into_inner().unwrap())
            .unwrap_or_else(|a| a.lock().unwrap().clone())
    }
}

async fn send_one(client: &reqwest::Client, url: &str, d: &Delivery) -> Sent {
    let t = Instant::now();
    let r = post(client, url, &d.headers(), d.body.clone()).await;
    let elapsed = t.elapsed();
    match r {
        Ok(a) => Sent {
            id: d.id.clone(),
            body: d.body.clone(),
            status: Some(a.status),
            hung: false,
            elapsed,
        },
        Err(e) => Sent {
            id: d.id.clone(),
            body: d.body.clone(),
            status: None,
            hung: e.is_timeout(),
            elapsed,
        },
    }
}

/// Starts `workers` workers sending for `duration`: fresh deliveries, provider
/// retries (re-signed copies of the previous one), and pairs of concurrent copies.
/// Each request has `bound` as its client timeout, so a hang shows as `hung`.
pub fn start_load(target: Target, workers: usize, duration: Duration, bound: Duration) -> Load {
    let sent = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for w in 0..workers {
        let sent = sent.clone();
        let target = target.clone();
        tasks.push(tokio::spawn(async move {
            let client = reqwest::Client::builder()
                .timeout(bound)
                .connect_timeout(Duration::from_secs(2))
                .build()
                .unwrap();
            let start = Instant::now();
            let mut prev: Option<Delivery> = None;
            let mut k = 0usize;
            while start.elapsed() < duration {
                let url = target.lock().unwrap().clone();
                let d = match (&prev, (k + w) % 4) {
                    (Some(p), 3) => p.clone().ts(now_secs()),
                    _ => Delivery::fresh(),
                };
                if (k + w) % 7 == 5 {
                    let (a, b) =
                        tokio::join!(send_one(&client, &url, &d), send_one(&client, &url, &d));
                    sent.lock().unwrap().extend([a, b]);
                } else {
                    let a = send_one(&client, &url, &d).await;
                    sent.lock().unwrap().push(a);
                }
                prev = Some(d);
                k += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }));
    }
    Load { sent, tasks }
}

/// Keys named by the sidecar's warnings that a completion could not be recorded (the
/// documented window in which a 2xx-answered delivery may be forwarded again).
pub fn completion_lost_keys(logs: &str) -> BTreeSet<String> {
    strip_ansi(logs)
        .lines()
        .filter(|l| l.contains("completion") && l.contains("lease expiry"))
        .filter_map(|l| {
            let at = l.find(" key=")?;
            let rest = &l[at + 5..];
            Some(
                rest.split_whitespace()
                    .next()?
                    .trim_matches('"')
                    .to_string(),
            )
        })
        .collect()
}

/// Removes terminal colour sequences (`ESC [ ... m`) from log text.
pub fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// What `check_invariants` found, for the test's printout.
#[derive(Debug, Default)]
pub struct Findings {
    pub answered_2xx: usize,
    pub status_counts: BTreeMap<String, usize>,
    pub unique_ids: usize,
    pub max_elapsed: Duration,
    pub lease_lost_ids: usize,
    pub forwarded_again_after_2xx: usize,
}

/// Waits until Redis holds no claim (lock key), up to `lease` + 5 s.
pub async fn assert_no_stuck_claims(redis: &RedisServer, lease: Duration) {
    let end = Instant::now() + lease + Duration::from_secs(5);
    loop {
        let locks: Vec<String> = redis
            .keys()
            .into_iter()
            .filter(|k| k.ends_with(":lock"))
            .collect();
        if locks.is_empty() {
            return;
        }
        if Instant::now() >= end {
            panic!("claims stuck beyond the lease: {locks:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The invariants after a fault run, once the faults are over. `logs` is every
/// sidecar process's stderr; `allow_no_answer` is true when the sidecar itself was
/// killed (requests in hand then get no HTTP answer). With `strict_once` (the upstream
/// always answered 2xx and the sidecar never died) every 2xx-answered delivery reached
/// the upstream exactly once, lease losses aside.
#[allow(clippy::too_many_arguments)]
pub async fn check_invariants(
    sc: &Sidecar,
    up: &Upstream,
    redis: &RedisServer,
    sent: &[Sent],
    logs: &str,
    lease: Duration,
    allow_no_answer: bool,
    strict_once: bool,
) -> Findings {
    let mut f = Findings {
        ..Default::default()
    };
    for s in sent {
        let key = match s.status {
            Some(st) => st.to_string(),
            None if s.hung => "hung".to_string(),
            None => "no answer".to_string(),
        };
        *f.status_counts.entry(key).or_default() += 1;
        f.max_elapsed = f.max_elapsed.max(s.elapsed);
    }
    // 1. nothing hung
    let hung: Vec<&Sent> = sent.iter().filter(|s| s.hung).collect();
    assert!(
        hung.is_empty(),
        "{} request(s) hung: {:?}",
        hung.len(),
        &hung[..hung.len().min(5)]
    );
    if !allow_no_answer {
        assert!(
            sent.iter().all(|s| s.status.is_some()),
            "requests without an HTTP answer: {:?}",
            f.status_counts
        );
    }
    // every answer is one the answer table allows
    for s in sent.iter().filter_map(|s| s.status) {
        assert!(
            matches!(s, 200 | 409 | 422 | 500 | 502 | 503 | 504),
            "unexpected status {s}: {:?}",
            f.status_counts
        );
    }

    // the store is back (and the breaker closed) before the retries
    sc.wait_readyz(200, Duration::from_secs(15)).await;

    // 2. no claim stuck beyond the lease
    assert_no_stuck_claims(redis, lease).await;

    // 3. the provider's retries of everything: each answered 2xx, none lost
    let mut bodies: BTreeMap<&str, &[u8]> = BTreeMap::new();
    let mut ok_ids: BTreeSet<&str> = BTreeSet::new();
    for s in sent {
        bodies.insert(&s.id, &s.body);
        if s.status.is_some_and(|st| (200..300).contains(&st)) {
            ok_ids.insert(&s.id);
        }
    }
    f.unique_ids = bodies.len();
    f.answered_2xx = ok_ids.len();
    let lost = completion_lost_keys(logs);
    f.lease_lost_ids = lost.len();
    let before = upstream_counts(up);
    let client = http_client();
    let url = sc.url(PATH);
    let all: Vec<(&str, &[u8])> = bodies.iter().map(|(k, v)| (*k, *v)).collect();
    for batch in all.chunks(16) {
        let mut set = tokio::task::JoinSet::new();
        for (id, body) in batch {
            let d = Delivery::new(id, body.to_vec());
            let (client, url) = (client.clone(), url.clone());
            // as a provider would: retry 503 and 409 after a pause (bounded)
            set.spawn(async move {
                let mut a = post(&client, &url, &d.headers(), d.body.clone()).await;
                for _ in 0..50 {
                    if !matches!(&a, Ok(x) if x.status == 503 || x.status == 409) {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    a = post(&client, &url, &d.headers(), d.body.clone()).await;
                }
                (d.id, a)
            });
        }
        while let Some(r) = set.join_next().await {
            let (id, a) = r.expect("retry task");
            let a = a.unwrap_or_else(|e| panic!("retry of {id}: {e:?}"));
            assert_eq!(a.status, 200, "the retry of {id} was not accepted: {a:?}");
            if ok_ids.contains(id.as_str()) {
                assert!(
                    a.replayed() || lost.contains(&id),
                    "{id} answered 2xx before, now forwarded again: {a:?}"
                );
            }
        }
    }

    // 4. per id, what reached the upstream: a 2xx-answered delivery is not forwarded
    //    again by its retries
    let counts = upstream_counts(up);
    for id in bodies.keys() {
        let n = counts.get(*id).copied().unwrap_or(0);
        let n0 = before.get(*id).copied().unwrap_or(0);
        assert!(n >= 1, "{id} never reached the upstream");
        if ok_ids.contains(id) && (n > n0 || (strict_once && n > 1)) {
            f.forwarded_again_after_2xx += 1;
            assert!(
                lost.contains(*id),
                "{id} was answered 2xx and then forwarded again ({n0} -> {n} times) although its completion was recorded"
            );
        }
    }
    f
}

/// How often each `webhook-id` reached the upstream.
pub fn upstream_counts(up: &Upstream) -> BTreeMap<String, usize> {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for r in up.requests() {
        if let Some(id) = r.header("webhook-id") {
            *counts.entry(id).or_default() += 1;
        }
    }
    counts
}
