//! A delivery whose claim is lost while the application works on it (the sidecar
//! stalled past its lease, or a failover lost the claim record): README's table row
//! "lease lost / completion not recorded" and docs/scaling.md's `min_replicas_ack`
//! promise that a 2xx always means a completion the store (and its replicas) hold.
//! The sidecar is stopped with SIGSTOP for longer than its lease while the
//! application's answer is on its way, so the claim record lapses under it.

use std::process::Command;
use std::time::Duration;

use crate::common::*;

/// One Redis master with one replica, so `WAIT 1` can be satisfied.
fn replicated() -> (RedisServer, RedisServer) {
    let master = RedisServer::start_new();
    let port = master.port().to_string();
    let replica = RedisServer::start_new_with(&["--replicaof", "127.0.0.1", &port]);
    wait_replica_online(&master);
    (master, replica)
}

fn wait_replica_online(master: &RedisServer) {
    let end = std::time::Instant::now() + Duration::from_secs(10);
    while !master
        .cli(&["INFO", "replication"])
        .contains("state=online")
    {
        assert!(std::time::Instant::now() < end, "replica never came online");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .expect("run kill")
        .success();
    assert!(ok, "kill {sig} {pid} failed");
}

/// Stops the sidecar for `d` once the application has the delivery (SIGSTOP, then
/// SIGCONT): its lease (2 s) lapses while the application's answer (4 s) is pending.
async fn stall_while_upstream_works(up: &Upstream, sc: &Sidecar, d: Duration) {
    up.wait_for_count(1, Duration::from_secs(5)).await;
    signal(sc.pid(), "-STOP");
    tokio::time::sleep(d).await;
    signal(sc.pid(), "-CONT");
}

fn sidecar(up: &Upstream, store_url: &str) -> SidecarBuilder {
    SidecarBuilder::new(&up.url(), store_url)
        .lease("2s")
        .top("upstream_timeout", "10s")
}

/// The lapsed claim's key is free when the application's 2xx arrives: the sidecar
/// records the answer anyway, so the provider's next copy is replayed, not
/// forwarded again (before, the 2xx was answered and the copy reached the
/// application a second time).
async fn a_lapsed_claims_answer_is_recorded(store_url: &str, acks: bool) {
    let up = Upstream::start().await;
    up.push_modes(vec![Mode::Stall(Duration::from_secs(4))]);
    let mut b = sidecar(&up, store_url);
    if acks {
        b = b
            .store_raw("min_replicas_ack", "1")
            .store_opt("replicas_ack_timeout", "500ms");
    }
    let sc = b.start().await;
    let d = Delivery::fresh();
    let first = sc.send_spawned(&d);
    stall_while_upstream_works(&up, &sc, Duration::from_secs(3)).await;
    let first = first.await.expect("first delivery");
    assert_eq!(first.status, 200, "{}", first.text());
    let copy = sc.send(&d).await;
    assert_eq!(copy.status, 200, "{}", copy.text());
    assert!(
        copy.replayed(),
        "the provider's copy of a delivery answered 2xx was forwarded again"
    );
    assert_eq!(up.count(), 1, "the application saw the delivery twice");
    assert!(sc.metric("idemgate_lease_lost_total{route=\"wh\"}").await >= 1.0);
}

#[tokio::test]
async fn a_lapsed_claims_answer_is_recorded_with_replica_acks() {
    let (master, _replica) = replicated();
    a_lapsed_claims_answer_is_recorded(&master.url(), true).await;
}

#[tokio::test]
async fn a_lapsed_claims_answer_is_recorded_on_redis() {
    let redis = RedisServer::start_new();
    a_lapsed_claims_answer_is_recorded(&redis.url(), false).await;
}

#[tokio::test]
async fn a_lapsed_claims_answer_is_recorded_in_memory() {
    a_lapsed_claims_answer_is_recorded("memory", false).await;
}

/// While the first sidecar stalled, a copy reached a second sidecar, which claimed
/// the lapsed key and forwards it. The first sidecar's answer can no longer be
/// recorded (the key is the second claimer's): with `min_replicas_ack` it answers
/// 503 + Retry-After, never a 2xx the store does not hold; the provider's retry is
/// then answered from the second claimer's completion.
#[tokio::test]
async fn a_lost_claim_taken_by_another_is_answered_503_with_replica_acks() {
    let (master, _replica) = replicated();
    let up = Upstream::start().await;
    up.push_modes(vec![
        Mode::Stall(Duration::from_secs(4)),
        Mode::Stall(Duration::from_secs(4)),
    ]);
    // As long an ack timeout as the 2 s lease allows (under the store timeout, itself at
    // most half the lease): on a busy machine the replica's acknowledgement can take
    // longer than half a second, and nothing here depends on it being short.
    let acked = |b: SidecarBuilder| {
        b.store_raw("min_replicas_ack", "1")
            .store_opt("timeout", "1s")
            .store_opt("replicas_ack_timeout", "900ms")
    };
    let a = acked(sidecar(&up, &master.url())).start().await;
    let b = acked(sidecar(&up, &master.url())).start().await;
    let d = Delivery::fresh();
    let first = a.send_spawned(&d);
    up.wait_for_count(1, Duration::from_secs(20)).await;
    signal(a.pid(), "-STOP");
    // The claim lapses 2 s after its last renewal (made before the stop); then the
    // copy claims it on `b`.
    tokio::time::sleep(Duration::from_millis(2600)).await;
    let second = b.send_spawned(&d);
    up.wait_for_count(2, Duration::from_secs(20)).await;
    signal(a.pid(), "-CONT");
    let first = first.await.expect("first delivery");
    first.assert_error(503, "store_unavailable");
    assert!(first.retry_after() >= 1);
    let second = second.await.expect("second delivery");
    assert_eq!(second.status, 200, "{}", second.text());
    let retry = a.send(&d).await;
    assert!(retry.replayed(), "the provider's retry was forwarded again");
    assert_eq!(up.count(), 2);
}

/// The process id of a redis-server (asked while it answers: a frozen one cannot say).
fn pid_of(server: &RedisServer) -> u32 {
    server
        .cli(&["INFO", "server"])
        .lines()
        .find_map(|l| l.trim().strip_prefix("process_id:")?.parse().ok())
        .expect("the server's process_id")
}

/// A completion no replica confirmed (the replica frozen: SIGSTOP) is answered 503 by
/// its sidecar; the provider's retry to a second sidecar finds the completed record on
/// the master, and must get 503 too while the replica lacks it (a failover now would
/// forget it, and the next copy would be forwarded after a 2xx). Once the replica
/// has caught up, copies are replayed. Before confirm.rs the retry got `200 replayed`.
#[tokio::test]
async fn a_copy_of_a_completion_no_replica_holds_is_answered_503() {
    let (master, replica) = replicated();
    let up = Upstream::start().await;
    up.push_modes(vec![Mode::Stall(Duration::from_secs(1))]);
    let acked = |b: SidecarBuilder| {
        b.store_raw("min_replicas_ack", "1")
            .store_opt("replicas_ack_timeout", "200ms")
    };
    let a = acked(sidecar(&up, &master.url())).start().await;
    let b = acked(sidecar(&up, &master.url())).start().await;
    let d = Delivery::fresh();
    let first = a.send_spawned(&d);
    up.wait_for_count(1, Duration::from_secs(5)).await;
    // The claim was confirmed; the completion will not be.
    let replica_pid = pid_of(&replica);
    signal(replica_pid, "-STOP");
    let first = first.await.expect("first delivery");
    first.assert_error(503, "store_unavailable");
    let retry = b.send(&d).await;
    signal(replica_pid, "-CONT");
    retry.assert_error(503, "store_unavailable");
    assert!(retry.retry_after() >= 1, "{retry:?}");
    assert!(!retry.replayed());
    // Thawed, the replica receives the record: a copy is then replayed (the copy's own
    // rewrite of the record is what `WAIT` counts).
    let end = std::time::Instant::now() + Duration::from_secs(10);
    let copy = loop {
        let copy = b.send(&d).await;
        if copy.status != 503 || std::time::Instant::now() > end {
            break copy;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(copy.status, 200, "{}", copy.text());
    assert!(copy.replayed(), "{copy:?}");
    assert_eq!(up.count(), 1, "the application saw the delivery twice");
}

/// confirm.lua, the copy's rewrite that `WAIT` then counts: it writes the record only
/// if it still holds the value the copy read (a replay or a forget since is not
/// overwritten), and a replica that lacked the record gets it with the master's
/// expiry, not as a key that never expires (`KEEPTTL` would give it none).
#[tokio::test]
async fn a_copys_confirmation_rewrites_only_the_record_it_read_with_its_expiry() {
    let (master, replica) = replicated();
    let script = include_str!("../../src/store/redis/scripts/confirm.lua");
    let (key, value) = ("confirm:{k}:claim", "c|ab|200|0|ok");
    // Written on the master alone (not replicated), as a completion no replica got.
    master.cli(&[
        "EVAL",
        "redis.set_repl(redis.REPL_NONE) redis.call('SET', KEYS[1], ARGV[1], 'PX', 60000)",
        "1",
        key,
        value,
    ]);
    assert_eq!(replica.cli(&["EXISTS", key]), "0");
    // Another value than the one read: nothing written.
    assert_eq!(
        master.cli(&["EVAL", script, "1", key, "c|ab|200|0|other"]),
        "0"
    );
    assert_eq!(master.cli(&["GET", key]), value);
    assert_eq!(replica.cli(&["EXISTS", key]), "0");
    // The value read: written again, and the replica gets it with an expiry.
    assert_eq!(master.cli(&["EVAL", script, "1", key, value]), "1");
    let end = std::time::Instant::now() + Duration::from_secs(10);
    while replica.cli(&["EXISTS", key]) != "1" {
        assert!(
            std::time::Instant::now() < end,
            "the replica never got the record"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(replica.cli(&["GET", key]), value);
    let ttl: i64 = replica.cli(&["PTTL", key]).parse().unwrap();
    assert!(
        ttl > 0 && ttl <= 60_000,
        "the replica's copy expires: PTTL {ttl}"
    );
    // A record gone meanwhile is not re-created.
    master.cli(&["DEL", key]);
    assert_eq!(master.cli(&["EVAL", script, "1", key, value]), "0");
    assert_eq!(master.cli(&["EXISTS", key]), "0");
}
