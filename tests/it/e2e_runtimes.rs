//! `worker_threads = 2`: two delivery runtimes, each with its own `SO_REUSEPORT`
//! listener, gate and store handle. What must stay process-wide is tested across them:
//! de-duplication, the `max_in_flight` bound, the metrics and SIGTERM's drain. Every
//! test first checks that the kernel gave connections to both runtimes
//! (`idemgate_connections_accepted_total{runtime}`), else it would prove nothing.

use std::time::Duration;

use crate::common::*;

/// Connections per test: each delivery on a connection of its own (a client of its
/// own), so that the kernel spreads them over both listeners; with 32, one runtime
/// getting none has odds of 2^-31.
const CONNECTIONS: usize = 32;

fn two_runtimes(up: &Upstream, store_url: &str) -> SidecarBuilder {
    SidecarBuilder::new(&up.url(), store_url).top("worker_threads", "2")
}

/// Sends `d` on a new connection of its own.
fn send_alone(sc: &Sidecar, d: &Delivery) -> tokio::task::JoinHandle<Answer> {
    sc.send_spawned_on(http_client(), d)
}

/// Connections each runtime accepted.
async fn accepted(sc: &Sidecar) -> [f64; 2] {
    let text = sc.metrics().await;
    [0, 1].map(|r| {
        metric_value(
            &text,
            &format!("idemgate_connections_accepted_total{{runtime=\"{r}\"}}"),
        )
        .unwrap_or(0.0)
    })
}

async fn assert_both_runtimes_served(sc: &Sidecar) {
    let [first, second] = accepted(sc).await;
    assert!(
        first > 0.0 && second > 0.0,
        "the kernel gave connections to one runtime only: {first} and {second}"
    );
    assert_eq!(first + second, CONNECTIONS as f64, "connections accepted");
}

async fn copies_on_both_runtimes_are_forwarded_once(kind: StoreKind) {
    let store = TestStore::new(kind);
    let up = Upstream::start().await;
    // The first copy holds its claim a while, so copies meet it in flight on both
    // runtimes, and later ones find it completed.
    up.set_mode(Mode::Stall(Duration::from_millis(300)));
    let sc = two_runtimes(&up, &store.url()).start().await;
    let d = Delivery::fresh();
    let handles: Vec<_> = (0..CONNECTIONS).map(|_| send_alone(&sc, &d)).collect();
    let mut statuses = Vec::new();
    for h in handles {
        statuses.push(h.await.expect("delivery task").status);
    }
    up.assert_count_stays(1, Duration::from_millis(300)).await;
    assert!(
        statuses.iter().all(|s| *s == 200 || *s == 409),
        "answers: {statuses:?}"
    );
    assert_both_runtimes_served(&sc).await;
    // One registry counts both runtimes' deliveries: every copy is in it.
    sc.wait_requests_total(ROUTE, "forwarded", 1.0).await;
    let replayed = sc.requests_total(ROUTE, "replayed").await;
    let in_flight = sc.requests_total(ROUTE, "in_flight").await;
    assert_eq!(replayed + in_flight, (CONNECTIONS - 1) as f64);
    assert_eq!(
        statuses.iter().filter(|s| **s == 409).count() as f64,
        in_flight
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn copies_on_both_runtimes_are_forwarded_once_redis() {
    copies_on_both_runtimes_are_forwarded_once(StoreKind::Redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn copies_on_both_runtimes_are_forwarded_once_memory() {
    copies_on_both_runtimes_are_forwarded_once(StoreKind::Memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn max_in_flight_holds_across_runtimes() {
    let redis = RedisServer::start_new();
    let up = Upstream::start().await;
    // The deliveries that get a slot keep it: the upstream never answers.
    up.set_mode(Mode::Hang);
    let sc = two_runtimes(&up, &redis.url())
        .top("max_in_flight", "4")
        .top("upstream_timeout", "60s")
        .start()
        .await;
    let handles: Vec<_> = (0..CONNECTIONS)
        .map(|_| send_alone(&sc, &Delivery::fresh()))
        .collect();
    // With a bound per runtime, 8 would reach the upstream.
    up.wait_for_count(4, Duration::from_secs(10)).await;
    let refused = CONNECTIONS - 4;
    wait_until(
        Duration::from_secs(10),
        "every delivery past 4 answered",
        || handles.iter().filter(|h| h.is_finished()).count() == refused,
    )
    .await;
    up.assert_count_stays(4, Duration::from_millis(300)).await;
    let mut statuses = Vec::new();
    for h in handles {
        if h.is_finished() {
            statuses.push(h.await.expect("delivery task").status);
        }
    }
    assert_eq!(statuses, vec![503; refused], "the answers past the bound");
    sc.wait_requests_total(ROUTE, "overloaded", refused as f64)
        .await;
    assert_both_runtimes_served(&sc).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_drains_deliveries_in_flight_on_both_runtimes() {
    let redis = RedisServer::start_new();
    let up = Upstream::start().await;
    // Long enough that every delivery is still in flight when SIGTERM comes (checked).
    up.set_mode(Mode::Stall(Duration::from_secs(8)));
    let mut sc = two_runtimes(&up, &redis.url())
        .top("shutdown_grace", "40s")
        .top("upstream_timeout", "30s")
        .start()
        .await;
    let deliveries: Vec<_> = (0..CONNECTIONS).map(|_| Delivery::fresh()).collect();
    let handles: Vec<_> = deliveries.iter().map(|d| send_alone(&sc, d)).collect();
    up.wait_for_count(CONNECTIONS, Duration::from_secs(8)).await;
    assert_both_runtimes_served(&sc).await;
    assert!(
        handles.iter().all(|h| !h.is_finished()),
        "a delivery was answered before SIGTERM: the test proves nothing"
    );
    sc.sigterm();
    for h in handles {
        let answer = h.await.expect("delivery task");
        assert_eq!(answer.status, 200, "a delivery in flight at SIGTERM");
    }
    let status = sc.wait_exit(Duration::from_secs(40)).await;
    assert!(status.success(), "exit status {status:?}");
    let log = sc.stderr();
    assert!(log.contains("all deliveries drained"), "{log}");
    // The drain completed every claim: a copy of each, to a new sidecar, is replayed.
    up.set_mode(Mode::default_ok());
    let again = two_runtimes(&up, &redis.url()).start().await;
    for d in &deliveries {
        assert_eq!(again.send(d).await.status, 200);
    }
    assert_eq!(up.count(), CONNECTIONS, "a copy was forwarded again");
    again
        .wait_requests_total(ROUTE, "replayed", CONNECTIONS as f64)
        .await;
}
