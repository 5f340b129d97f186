//! The storm the failover tests run: distinct deliveries from 12 senders over the
//! sidecars, a provider's retries of what was answered 503 (or 409), and the re-send of
//! every delivery answered 2xx once the deployment has healed, counting those the
//! application received again after their 2xx.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::common::cluster::cli;
use crate::common::*;

/// What a storm with a failover in the middle saw.
#[derive(Debug, Default)]
pub(crate) struct StormReport {
    pub(crate) sent: usize,
    pub(crate) answered_2xx: usize,
    pub(crate) answered_503: usize,
    /// Provider retries of a delivery answered 503 (or 409), each to the next sidecar.
    pub(crate) retried: usize,
    /// Of those, the ones answered `200 replayed` (from a completion another sidecar
    /// answered 503).
    pub(crate) retried_replayed: usize,
    /// Re-sends of 2xx-answered deliveries after the failover that were replayed.
    pub(crate) resent_replayed: usize,
    /// 409s met on the way (a claim left on the promoted node: retried after it).
    pub(crate) resent_409: usize,
    /// 2xx-answered deliveries the upstream received more than once.
    pub(crate) slipped: usize,
    /// 2xx-answered deliveries sent after the new master took over (the ones a write
    /// to the old master would lose).
    pub(crate) after_switch: usize,
}

/// At most this many fresh deliveries per sender (12 senders: at most 1,440).
const PER_SENDER: usize = 120;

/// Sidecars for a storm: `store.timeout` 1 s, a 3 s lease (so a claim left without
/// its completion frees within the test, and a copy could then be forwarded again).
async fn storm_sidecars(up: &Upstream, url: &str, n: usize, min_replicas_ack: u32) -> Vec<Sidecar> {
    let mut scs = Vec::new();
    for _ in 0..n {
        let mut b = SidecarBuilder::new(&up.url(), url)
            .store_opt("timeout", "1s")
            .lease("3s");
        if min_replicas_ack > 0 {
            b = b
                .store_raw("min_replicas_ack", &min_replicas_ack.to_string())
                .store_opt("replicas_ack_timeout", "100ms");
        }
        scs.push(b.start().await);
    }
    for sc in &scs {
        sc.wait_readyz(200, Duration::from_secs(10)).await;
    }
    scs
}

type Targets = Arc<Vec<(reqwest::Client, String)>>;

fn targets_of(scs: &[Sidecar]) -> Targets {
    Arc::new(
        scs.iter()
            .map(|sc| (sc.client.clone(), sc.url(PATH)))
            .collect(),
    )
}

/// One delivery as its sender last saw it.
struct SentDelivery {
    d: Delivery,
    /// The last answer's status.
    status: u16,
    /// When the answer was asked for.
    at: Instant,
    /// Retries sent after a 503 or 409, and how many of them were answered replayed.
    retries: usize,
    replayed_retry: bool,
    /// How many times the upstream had received it when it was answered 2xx: a later
    /// receipt is a copy forwarded after a 2xx (one forwarded before, whose answer was
    /// a 503, is the provider's retry doing its job).
    receipts_at_answer: usize,
}

/// What one sender sent.
type Sent = Vec<SentDelivery>;

/// Provider retries of a delivery answered 503 or 409, before the sender moves on.
const RETRIES: usize = 3;

/// How many times the upstream received delivery `id`.
fn receipts(up: &Upstream, id: &str) -> usize {
    up.requests()
        .iter()
        .filter(|r| r.header("webhook-id").as_deref() == Some(id))
        .count()
}

/// 12 senders of distinct deliveries over the sidecars, until `stop` (or their cap);
/// each pauses between deliveries (20 ms, 250 ms after a 503) so that the storm spans
/// the failover. A delivery answered 503 (or 409, on a retry) is retried like a
/// provider would, up to [`RETRIES`] times, each time on the next sidecar: a retry
/// between an unconfirmed completion's 503 and a failover is what may find the
/// completion on a master that is about to die.
fn start_senders(
    targets: &Targets,
    stop: &Arc<AtomicBool>,
    up: &Arc<Upstream>,
) -> Vec<tokio::task::JoinHandle<Sent>> {
    (0..12)
        .map(|w| {
            let targets = targets.clone();
            let stop = stop.clone();
            let up = up.clone();
            tokio::spawn(async move {
                let mut seen: Sent = Vec::new();
                let deadline = Instant::now() + Duration::from_secs(60);
                let mut i = w;
                let mut retry: Option<(Delivery, usize)> = None;
                while !stop.load(Ordering::Relaxed)
                    && seen.len() < PER_SENDER
                    && Instant::now() < deadline
                {
                    let (d, retries) = retry.take().unwrap_or_else(|| (Delivery::fresh(), 0));
                    let (client, url) = &targets[i % targets.len()];
                    i += 1;
                    let at = Instant::now();
                    let a = post(client, url, &d.headers(), d.body.clone())
                        .await
                        .unwrap_or_else(|e| panic!("a sidecar did not answer: {e:?}"));
                    // A provider backs off after a 503; this also keeps the storm
                    // going until the deployment has healed.
                    let pause = if a.status == 200 { 20 } else { 250 };
                    let refused = a.status == 503 || (a.status == 409 && retries > 0);
                    if refused && retries < RETRIES {
                        retry = Some((d, retries + 1));
                    } else {
                        let receipts_at_answer = match (a.status, retries) {
                            (200, 0) => 1,
                            (200, _) => receipts(&up, &d.id),
                            _ => 0,
                        };
                        seen.push(SentDelivery {
                            d,
                            status: a.status,
                            at,
                            retries,
                            replayed_retry: retries > 0 && a.replayed(),
                            receipts_at_answer,
                        });
                    }
                    tokio::time::sleep(Duration::from_millis(pause)).await;
                }
                seen
            })
        })
        .collect()
}

/// The storm's application: a plain 200 after `delay`.
pub(super) fn upstream_mode(delay: Duration) -> Mode {
    Mode::Delayed(delay, Box::new(Mode::default_ok()))
}

/// A running storm: its upstream, sidecars and senders.
pub(super) struct Storm {
    pub(super) up: Arc<Upstream>,
    scs: Vec<Sidecar>,
    targets: Targets,
    stop: Arc<AtomicBool>,
    senders: Vec<tokio::task::JoinHandle<Sent>>,
}

impl Storm {
    /// `n` sidecars on `url` with a slightly slow upstream, senders running for a second.
    pub(super) async fn start(url: &str, n: usize, min_replicas_ack: u32) -> Storm {
        let up = Arc::new(Upstream::start().await);
        up.set_mode(upstream_mode(Duration::from_millis(5)));
        let scs = storm_sidecars(&up, url, n, min_replicas_ack).await;
        let targets = targets_of(&scs);
        let stop = Arc::new(AtomicBool::new(false));
        let senders = start_senders(&targets, &stop, &up);
        tokio::time::sleep(Duration::from_secs(1)).await;
        Storm {
            up,
            scs,
            targets,
            stop,
            senders,
        }
    }

    /// Keeps sending for `more`, stops the senders and settles (see `settle_storm`).
    pub(super) async fn finish(self, more: Duration, switched: Instant) -> StormReport {
        tokio::time::sleep(more).await;
        self.stop.store(true, Ordering::Relaxed);
        let report = settle_storm(self.senders, &self.targets, &self.up, switched).await;
        drop(self.scs);
        report
    }
}

/// Collects the senders' answers, then sends every 2xx-answered delivery again
/// (retrying 503 and 409 like a provider, so a claim left behind by the failover has
/// expired when the copy is finally answered) and counts those forwarded twice.
async fn settle_storm(
    senders: Vec<tokio::task::JoinHandle<Sent>>,
    targets: &Targets,
    up: &Upstream,
    switched: Instant,
) -> StormReport {
    let mut report = StormReport::default();
    let mut answered: Vec<Delivery> = Vec::new();
    let mut receipts_at_answer: HashMap<String, usize> = HashMap::new();
    for s in senders {
        for sent in s.await.expect("sender") {
            report.sent += 1;
            report.retried += sent.retries;
            report.retried_replayed += usize::from(sent.replayed_retry);
            match sent.status {
                200 => {
                    report.answered_2xx += 1;
                    report.after_switch += usize::from(sent.at > switched);
                    receipts_at_answer.insert(sent.d.id.clone(), sent.receipts_at_answer);
                    answered.push(sent.d);
                }
                503 => report.answered_503 += 1,
                409 if sent.retries > 0 => report.answered_503 += 1,
                other => panic!("unexpected answer {other} to a delivery: {}", sent.d.id),
            }
        }
    }
    assert!(
        report.answered_2xx > 0,
        "nothing was answered 2xx: {report:?}"
    );

    let queue = Arc::new(std::sync::Mutex::new(answered.clone()));
    let mut resenders = Vec::new();
    for _ in 0..12 {
        let queue = queue.clone();
        let targets = targets.clone();
        resenders.push(tokio::spawn(async move {
            let (mut replayed, mut conflicts, mut i) = (0, 0, 0);
            let deadline = Instant::now() + Duration::from_secs(40);
            loop {
                let Some(d) = queue.lock().unwrap().pop() else {
                    break;
                };
                loop {
                    let (client, url) = &targets[i % targets.len()];
                    i += 1;
                    let a = post(client, url, &d.headers(), d.body.clone())
                        .await
                        .expect("a sidecar did not answer a re-send");
                    match a.status {
                        200 if a.replayed() => replayed += 1,
                        200 => {} // forwarded again: counted at the upstream below
                        409 | 503 => {
                            if a.status == 409 {
                                conflicts += 1;
                            }
                            assert!(
                                Instant::now() < deadline,
                                "a re-send still gets {} after the failover",
                                a.status
                            );
                            tokio::time::sleep(Duration::from_millis(200)).await;
                            continue;
                        }
                        other => panic!("unexpected answer {other} to a re-send: {a:?}"),
                    }
                    break;
                }
            }
            (replayed, conflicts)
        }));
    }
    for r in resenders {
        let (replayed, conflicts) = r.await.expect("re-sender");
        report.resent_replayed += replayed;
        report.resent_409 += conflicts;
    }

    let mut receipts: HashMap<String, usize> = HashMap::new();
    for r in up.requests() {
        if let Some(id) = r.header("webhook-id") {
            *receipts.entry(id).or_default() += 1;
        }
    }
    for d in &answered {
        let n = receipts.get(&d.id).copied().unwrap_or(0);
        assert!(n >= 1, "{} was answered 2xx but never forwarded", d.id);
        if n > receipts_at_answer[&d.id] {
            report.slipped += 1;
        }
    }
    report
}

/// The process id of the redis-server listening on `port` (asked while it answers:
/// a frozen node cannot say).
pub(super) fn pid_of_node(port: u16) -> String {
    cli(port, &["INFO", "server"])
        .lines()
        .find_map(|l| l.trim().strip_prefix("process_id:").map(str::to_string))
        .expect("the node's process_id")
}

/// Sends `sig` (`-STOP`, `-CONT`) to process `pid`.
pub(super) fn signal(pid: &str, sig: &str) {
    let ok = std::process::Command::new("kill")
        .args([sig, pid])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "kill {sig} {pid} failed");
}
