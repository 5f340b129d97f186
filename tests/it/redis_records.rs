//! The Redis claim record as the scripts and the log read it: its layouts (the
//! previous release's included), the keys and lifetimes of a delivery, and the fencing
//! of the one-key completion under a race of owners (docs/reliability.md, "Fencing").

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::RedisServer;
use crate::store_conformance::{claimed, fp, key, response};
use bytes::Bytes;
use idemgate::store::log::DeliveryLog;
use idemgate::store::{Claim, Lifetimes, RedisStore, Status, Store, StoredResponse, Token};

const LONG: Lifetimes = Lifetimes {
    lease: Duration::from_secs(30),
    retention: Duration::from_secs(3600),
};

/// A key's remaining lifetime in ms (-2: gone, -1: no TTL).
fn pttl(server: &RedisServer, key: &str) -> i64 {
    server.cli(&["PTTL", key]).parse().unwrap()
}

/// The keys of a delivery carry the same `{route:key}` hash tag, and carry TTLs: the
/// claim record lives for the lease while processing and `retention` once completed,
/// and holds the owner's token, the payload's fingerprint and the log's fields; a
/// first delivery writes no log hash at all, a copy's count creates it with a TTL.
#[tokio::test]
async fn redis_keys_share_a_hash_tag_and_expire() {
    let server = RedisServer::start_new();
    let s = RedisStore::new(&server.url(), "pfx", LONG, Duration::from_secs(1)).unwrap();
    let k = key("evt_tag");
    let t = claimed(s.claim(&k, &fp("a"), None).await.unwrap());
    let e = s
        .log_entry(&k)
        .await
        .unwrap()
        .expect("logged off the record");
    assert_eq!((e.status, e.attempts), (Status::Processing, 1));
    assert_eq!(server.keys(), vec!["pfx:{route:evt_tag}:claim".to_string()]);
    let record_ttl = pttl(&server, "pfx:{route:evt_tag}:claim");
    assert!(record_ttl > 0 && record_ttl <= 30_000, "{record_ttl}");
    assert_eq!(
        server.cli(&["GET", "pfx:{route:evt_tag}:claim"]),
        format!("P|{}|{}", t.to_hex(), hex::encode(fp("a")))
    );
    // Completed: the record holds the log's fields and the answer for `retention`.
    assert!(s.complete(&k, t, &response(b"ok"), None).await.unwrap());
    let record_ttl = pttl(&server, "pfx:{route:evt_tag}:claim");
    assert!(
        record_ttl > 30_000 && record_ttl <= 3_600_000,
        "{record_ttl}"
    );
    let record = server.cli(&["GET", "pfx:{route:evt_tag}:claim"]);
    assert!(
        record.starts_with(&format!("C|{}|", hex::encode(fp("a")))),
        "{record}"
    );
    assert_eq!(server.keys().len(), 1, "the completion wrote no log hash");
    // A copy: its count lands in the log hash, beside the record, with a TTL.
    assert_eq!(
        s.claim(&k, &fp("a"), None).await.unwrap(),
        Claim::Completed(response(b"ok"))
    );
    let e = s.log_entry(&k).await.unwrap().unwrap();
    assert_eq!(
        (e.status, e.attempts, e.duplicates),
        (Status::Completed, 1, 1)
    );
    assert_eq!(e.response_status, Some(201));
    assert!(e.first_seen > 0 && e.last_seen >= e.first_seen, "{e:?}");
    let log_ttl = pttl(&server, "pfx:{route:evt_tag}");
    assert!(log_ttl > 30_000 && log_ttl <= 3_600_000, "{log_ttl}");
}

/// Records the previous release wrote (`p|token|fp` under its claim, `c|fp|…` with the
/// log's fields in the hash) are read for their remaining lifetime: copies are
/// answered, the old owner still completes (the full script) and the log counts the
/// hash's attempts once. Hashes of the layout before the claim record (state in
/// `status`, no record) are no longer read: the upgrade path passes through the
/// previous release (docs/reliability.md, "Upgrades").
#[tokio::test]
async fn redis_records_of_the_previous_layout_are_read() {
    let server = RedisServer::start_new();
    let s = RedisStore::new(&server.url(), "pfx", LONG, Duration::from_secs(1)).unwrap();
    let a = hex::encode(fp("a"));
    let old_hash = |id: &str| {
        let hash = format!("pfx:{{route:{id}}}");
        server.cli(&[
            "HSET",
            &hash,
            "fp",
            &a,
            "first_seen",
            "1000",
            "last_seen",
            "1000",
            "attempts",
            "1",
        ]);
        server.cli(&["PEXPIRE", &hash, "60000"]);
        key(id)
    };
    // In flight under the previous layout's claim.
    let old = Token([7; 16]);
    let held = old_hash("prev_held");
    server.cli(&[
        "SET",
        "pfx:{route:prev_held}:claim",
        &format!("p|{}|{a}", old.to_hex()),
        "PX",
        "30000",
    ]);
    assert!(matches!(
        s.claim(&held, &fp("a"), None).await.unwrap(),
        Claim::InFlight { .. }
    ));
    assert_eq!(
        s.claim(&held, &fp("b"), None).await.unwrap(),
        Claim::Mismatch
    );
    let e = s.log_entry(&held).await.unwrap().unwrap();
    assert_eq!(
        (e.status, e.attempts, e.first_seen),
        (Status::Processing, 1, 1000)
    );
    assert!(s.renew(&held, old).await.unwrap());
    assert!(
        s.complete(&held, old, &response(b"old"), None)
            .await
            .unwrap()
    );
    assert_eq!(
        s.claim(&held, &fp("a"), None).await.unwrap(),
        Claim::Completed(response(b"old"))
    );
    let e = s.log_entry(&held).await.unwrap().unwrap();
    assert_eq!(
        (e.status, e.attempts, e.duplicates, e.response_status),
        (Status::Completed, 1, 1, Some(201))
    );

    // Completed under the previous layout.
    let done = old_hash("prev_done");
    let mut record = format!("c|{a}|201|{}|", response(b"").headers.len()).into_bytes();
    record.extend_from_slice(&response(b"").headers);
    record.extend_from_slice(b"kept");
    let record = String::from_utf8(record).unwrap();
    server.cli(&["SET", "pfx:{route:prev_done}:claim", &record, "PX", "60000"]);
    assert_eq!(
        s.claim(&done, &fp("a"), None).await.unwrap(),
        Claim::Completed(response(b"kept"))
    );
    let e = s.log_entry(&done).await.unwrap().unwrap();
    assert_eq!(
        (e.status, e.attempts, e.first_seen),
        (Status::Completed, 1, 1000)
    );
    // An operator's replay of it keeps the old answer when it fails.
    let op = claimed(
        s.claim(&done, &fp("a"), crate::common::REPLAY)
            .await
            .unwrap(),
    );
    assert!(s.release(&done, op, None).await.unwrap());
    assert_eq!(
        s.claim(&done, &fp("a"), None).await.unwrap(),
        Claim::Completed(response(b"kept"))
    );

    // The layout before the claim record: not read any more.
    let hash = "pfx:{route:pre_record}";
    server.cli(&[
        "HSET",
        hash,
        "fp",
        &a,
        "status",
        "completed",
        "resp_status",
        "201",
    ]);
    claimed(s.claim(&key("pre_record"), &fp("a"), None).await.unwrap());
}

/// Many owners race over one key: claims, renewals, releases, completions, each
/// owner sometimes sleeping past its lease so that a later owner takes the key. The
/// one-key completion's compare-and-set lets exactly one owner's completion win, and
/// only while it owned the key: no claim came after the winner's (a claim's token
/// carries its time, and a later owner claims at least a lease after an earlier one
/// that slept past its lease); every stale owner's
/// completion, renewal and release answers false and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_one_keys_completion_has_exactly_one_winner_under_a_race_of_owners() {
    let lifetimes = Lifetimes {
        lease: Duration::from_millis(150),
        retention: Duration::from_secs(3600),
    };
    let server = RedisServer::start_new();
    let s = Arc::new(
        RedisStore::new(&server.url(), "race", lifetimes, Duration::from_secs(2)).unwrap(),
    );
    let k = key("evt_race");
    let answer = |t: Token| StoredResponse {
        status: 200,
        headers: Bytes::new(),
        body: Bytes::from(t.to_hex()),
    };
    // Every token a claim handed out, and every completion that answered true.
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let wins = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for _ in 0..12 {
        let (s, k, tokens, wins) = (s.clone(), k.clone(), tokens.clone(), wins.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..400 {
                let t = match s.claim(&k, &fp("a"), None).await.unwrap() {
                    Claim::Claimed(t) => t,
                    Claim::Completed(_) => return,
                    _ => {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        continue;
                    }
                };
                let n = {
                    let mut tokens = tokens.lock().unwrap();
                    tokens.push(t);
                    tokens.len()
                };
                // The first ten owners never win: each sleeps past its lease or
                // releases, so that later owners take the key while they act.
                let roll = match n {
                    ..=10 => [0, 1, 2, 4][n % 4],
                    _ => rand::random::<u32>() % 6,
                };
                // Half the owners outlive their lease before acting: stale by then,
                // unless no one else claimed meanwhile (then the record is gone).
                if roll % 2 == 0 {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                let _ = s.renew(&k, t).await.unwrap();
                match roll {
                    0 | 1 => {
                        let _ = s.release(&k, t, None).await.unwrap();
                    }
                    _ => {
                        if s.complete(&k, t, &answer(t), None).await.unwrap() {
                            wins.lock().unwrap().push(t);
                        }
                    }
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let wins = wins.lock().unwrap().clone();
    assert_eq!(wins.len(), 1, "completions that won: {wins:?}");
    let winner = wins[0];
    let tokens = tokens.lock().unwrap().clone();
    assert!(tokens.len() > 1, "no race: {} owners", tokens.len());
    // A stale owner slept 200 ms past its claim; a later owner claimed at least a
    // lease (150 ms) after it. Half a lease of slack covers a task paused between
    // taking its claim's time and sending the claim.
    let claimed_at = |t: &Token| u64::from_be_bytes(t.0[..8].try_into().unwrap());
    let last = tokens.iter().map(claimed_at).max().unwrap();
    assert!(
        claimed_at(&winner) + 75 >= last,
        "a stale owner's completion (claimed at {}) won over a later owner's claim (at {last})",
        claimed_at(&winner)
    );
    // Every owner, the winner included, is stale now: nothing it does changes the key.
    for t in tokens {
        assert!(!s.complete(&k, t, &answer(t), None).await.unwrap());
        assert!(!s.renew(&k, t).await.unwrap());
        assert!(!s.release(&k, t, None).await.unwrap());
    }
    assert_eq!(
        s.claim(&k, &fp("a"), None).await.unwrap(),
        Claim::Completed(answer(winner))
    );
}
