//! The directory's own promises: what is recorded and awaited reads back after a
//! reopen, the last change of a key wins, one process per directory.

use std::time::Duration;

use bytes::Bytes;

use super::*;
use crate::store::DeliveryKey;
use crate::store::jobs::{JobRecord, JobState};
use crate::store::memory::journal::{Change, Journal};
use crate::store::queue::{DeadLetter, QueueEntry};

fn entry(key: &str) -> QueueEntry {
    QueueEntry {
        key: key.into(),
        method: "POST".into(),
        path: "/wh?x=1".into(),
        headers: Bytes::from_static(b"idempotency-key: a\r\n"),
        body: Bytes::from(vec![0u8, 255, 10]),
        received_at: 42,
        order: Some("cust-1".into()),
    }
}

fn load(dir: &Path) -> Vec<Restored> {
    let d = FileDir::open(dir).unwrap();
    let mut all = Vec::new();
    d.load(|r| all.push(r)).unwrap();
    all
}

#[tokio::test]
async fn what_is_awaited_reads_back_after_a_reopen_for_both_policies() {
    for fsync in [
        FsyncPolicy::Always,
        FsyncPolicy::Every(Duration::from_secs(30)),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let k1 = DeliveryKey::new("wh", "a\0b key");
        let k2 = DeliveryKey::new("wh", "gone");
        let job = JobRecord {
            id: "j1".into(),
            kind: "replay".into(),
            route: "wh".into(),
            filter: "{}".into(),
            state: JobState::Running,
            total: 2,
            done: 1,
            failed: 0,
            owner: "me".into(),
            beat: 5,
            created: 6,
            error: String::new(),
        };
        let dead = DeadLetter {
            id: "9-1".into(),
            entry: entry("d"),
            attempts: 3,
            last_error: "upstream answered 500".into(),
            dead_at: 7,
        };
        {
            let j = FileDir::open(tmp.path())
                .unwrap()
                .start_journal(fsync, Duration::from_secs(5))
                .unwrap();
            j.record(Change::Entry {
                key: &k1,
                entry: Some(b"first"),
            });
            j.record(Change::Entry {
                key: &k2,
                entry: Some(b"x"),
            });
            j.record(Change::Entry {
                key: &k1,
                entry: Some(b"second"),
            });
            j.record(Change::Entry {
                key: &k2,
                entry: None,
            });
            let e = entry("q");
            j.record(Change::Queued {
                route: "wh",
                id: (5, 2),
                entry: Some(&e),
            });
            j.record(Change::Dead {
                route: "wh",
                id: (9, 1),
                dead: Some(&dead),
            });
            j.record(Change::Attempts {
                key: &k1,
                id: (5, 2),
                count: Some(2),
            });
            j.record(Change::Job {
                id: "j1",
                record: Some(&job),
            });
            let items = vec!["a".to_string(), "b".to_string()];
            j.record(Change::JobItems {
                id: "j1",
                items: Some(&items),
            });
            let t = j.record(Change::JobMark {
                id: "j1",
                item: "a",
                mark: Some("ok"),
            });
            j.durable(t).await.unwrap();
            // Dropped: the writer stops and releases the directory (what a SIGKILL
            // leaves behind is the crash test's, tests/it/file_store_crash.rs).
        }
        let all = load(tmp.path());
        assert_eq!(
            all,
            vec![
                Restored::Entry(k1.clone(), b"second".to_vec()),
                Restored::Queued("wh".into(), (5, 2), entry("q")),
                Restored::Dead("wh".into(), (9, 1), dead.clone()),
                Restored::Attempts(k1.clone(), (5, 2), 2),
                Restored::Job(job.clone()),
                Restored::JobItems("j1".into(), vec!["a".into(), "b".into()]),
                Restored::JobMark("j1".into(), "a".into(), "ok".into()),
            ],
            "{fsync:?}"
        );
    }
}

#[test]
fn one_process_per_directory_and_check_says_why() {
    let tmp = tempfile::tempdir().unwrap();
    let held = FileDir::open(tmp.path()).unwrap();
    let e = FileDir::open(tmp.path()).err().unwrap().to_string();
    assert!(
        e.contains("another process holds its lock") && e.contains(LOCK_FILE),
        "{e}"
    );
    let e = check_dir(tmp.path()).unwrap_err();
    assert!(e.contains("another process holds its lock"), "{e}");
    drop(held);
    check_dir(tmp.path()).unwrap();
    // A path under a regular file can be neither created nor written.
    let file = tmp.path().join("plain");
    std::fs::write(&file, b"x").unwrap();
    let e = check_dir(&file.join("sub")).unwrap_err();
    assert!(e.contains("cannot create it"), "{e}");
}

/// The disk holds what memory holds: an eviction under `max_memory` is a change the
/// journal writes too, so the directory never outgrows the bound.
#[tokio::test]
async fn evictions_under_the_memory_bound_leave_the_disk_too() {
    use crate::store::{Claim, Lifetimes, MemoryOptions, Store, StoredResponse};
    let tmp = tempfile::tempdir().unwrap();
    let options = || {
        MemoryOptions::new(Lifetimes {
            lease: Duration::from_secs(30),
            retention: Duration::from_secs(3600),
        })
        .max_memory(256 << 10)
    };
    let answer = StoredResponse {
        status: 200,
        headers: Bytes::new(),
        body: Bytes::from_static(b"ok"),
    };
    let held = {
        let (store, _queue) = open(
            tmp.path(),
            FsyncPolicy::Always,
            Duration::from_secs(5),
            options(),
        )
        .unwrap();
        for n in 0..6_000 {
            let k = DeliveryKey::new("wh", format!("k{n:05}"));
            if let Claim::Claimed(t) = store.claim(&k, &[1; 32], None).await.unwrap() {
                assert!(store.complete(&k, t, &answer, None).await.unwrap());
            }
        }
        let stats = store.bound_stats();
        assert!(stats.evictions > 0, "{stats:?}");
        store.len()
    };
    let on_disk = load(tmp.path())
        .iter()
        .filter(|r| matches!(r, Restored::Entry(..)))
        .count();
    assert_eq!(on_disk, held);
    let (store, _queue) = open(
        tmp.path(),
        FsyncPolicy::Always,
        Duration::from_secs(5),
        options(),
    )
    .unwrap();
    assert_eq!(store.len(), held);
}

/// A change not written within `wait` (a stalled disk) answers a timeout, not a hang.
#[tokio::test]
async fn a_change_not_written_in_time_answers_a_timeout() {
    let tmp = tempfile::tempdir().unwrap();
    let j = FileDir::open(tmp.path())
        .unwrap()
        .start_journal(FsyncPolicy::Always, Duration::from_millis(100))
        .unwrap();
    // A ticket the writer never reaches stands for a write that never ends.
    let e = j.durable(1_000).await.unwrap_err();
    assert!(matches!(e, crate::store::StoreError::Timeout), "{e}");
}

/// A reopened directory lists what it kept: its deliveries go back into their routes'
/// recent index as they load, newest first as before the restart.
#[tokio::test]
async fn a_reopened_directory_lists_the_deliveries_it_kept() {
    use crate::store::log::{ClaimLog, DeliveryLog, ListQuery};
    use crate::store::{Claim, Lifetimes, MemoryOptions, Store, StoredResponse};
    let tmp = tempfile::tempdir().unwrap();
    let options = || {
        MemoryOptions::new(Lifetimes {
            lease: Duration::from_secs(30),
            retention: Duration::from_secs(3600),
        })
    };
    let reopen = || {
        open(
            tmp.path(),
            FsyncPolicy::Always,
            Duration::from_secs(5),
            options(),
        )
    };
    let answer = StoredResponse {
        status: 200,
        headers: Bytes::new(),
        body: Bytes::from_static(b"ok"),
    };
    {
        let (store, _queue) = reopen().unwrap();
        for k in ["a", "b", "c"] {
            let k = DeliveryKey::new("wh", k);
            let Claim::Claimed(t) = store
                .claim(&k, &[1; 32], Some(ClaimLog::default()))
                .await
                .unwrap()
            else {
                panic!("a new key is claimed");
            };
            assert!(store.complete(&k, t, &answer, None).await.unwrap());
            // Distinct first-seen times, so the order is the keys' order.
            tokio::time::sleep(Duration::from_millis(3)).await;
        }
    }
    let (store, _queue) = reopen().unwrap();
    let page = store
        .recent(&ListQuery {
            routes: vec!["wh".into()],
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    let keys: Vec<_> = page.items.iter().map(|(_, e)| e.key.as_str()).collect();
    assert_eq!(keys, ["c", "b", "a"]);
}
