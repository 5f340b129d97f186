//! The memory store's own cases: the journal seam, the bound and its eviction order,
//! the oldest age. (The semantics shared with Redis are the conformance suites'.)

use super::journal::{Change, Durable, Journal, Ticket};
use super::*;
use std::sync::Mutex;

/// A journal that keeps every change in order (what the `file:` store writes).
#[derive(Default)]
struct Recorded {
    changes: Mutex<Vec<(DeliveryKey, Option<Vec<u8>>)>>,
    awaited: Mutex<Vec<Ticket>>,
}

impl Journal for Recorded {
    fn record(&self, change: Change<'_>) -> Ticket {
        let Change::Entry { key, entry } = change else {
            panic!("only entries change here: {change:?}");
        };
        let mut changes = self.changes.lock().unwrap();
        changes.push((key.clone(), entry.map(<[u8]>::to_vec)));
        changes.len() as Ticket
    }

    fn durable(&self, ticket: Ticket) -> Durable<'_> {
        self.awaited.lock().unwrap().push(ticket);
        Box::pin(async { Ok(()) })
    }

    fn latest(&self) -> Ticket {
        self.changes.lock().unwrap().len() as Ticket
    }
}

/// A journal whose changes become durable only when the test says so: what a disk
/// that has not written them yet looks like to the store (a kill then loses them).
struct Unwritten {
    next: Mutex<Ticket>,
    written: tokio::sync::watch::Sender<Ticket>,
}

impl Journal for Unwritten {
    fn record(&self, _change: Change<'_>) -> Ticket {
        let mut next = self.next.lock().unwrap();
        *next += 1;
        *next
    }

    fn durable(&self, ticket: Ticket) -> Durable<'_> {
        let mut rx = self.written.subscribe();
        Box::pin(async move {
            rx.wait_for(|w| *w >= ticket).await.unwrap();
            Ok(())
        })
    }

    fn latest(&self) -> Ticket {
        *self.next.lock().unwrap()
    }
}

/// Item 5 of issue 34: `complete_unowned` on a key another call completed answers
/// only once that completion is written; answering before, a kill in between would
/// lose both completions while the caller answered the provider 2xx.
#[tokio::test]
async fn complete_unowned_on_a_completed_key_waits_for_its_write() {
    let journal = Arc::new(Unwritten {
        next: Mutex::new(0),
        written: tokio::sync::watch::Sender::new(0),
    });
    let mut options = MemoryOptions::new(lifetimes());
    options.journal = Some(journal.clone() as Arc<dyn Journal>);
    let store = MemoryStore::with_options(options);
    let key = DeliveryKey::new("r", "k");
    let Claim::Claimed(t) = store.claim(&key, &[1; 32], None).await.unwrap() else {
        panic!("claimed")
    };
    let owner = tokio::spawn({
        let (store, key) = (store.clone(), key.clone());
        async move { store.complete(&key, t, &answer(b"ok"), None).await }
    });
    // The owner's completion is in memory, not yet on disk.
    while *journal.next.lock().unwrap() < 2 {
        tokio::task::yield_now().await;
    }
    let ok = answer(b"ok");
    let unowned = store.complete_unowned(&key, &[1; 32], &ok, None);
    tokio::pin!(unowned);
    // However long it is given, it cannot answer before the write.
    let early = tokio::time::timeout(Duration::from_millis(100), &mut unowned).await;
    assert!(
        early.is_err(),
        "answered before the completion was written: {early:?}"
    );
    journal.written.send_replace(2);
    assert!(unowned.await.unwrap());
    assert!(owner.await.unwrap().unwrap());
}

fn lifetimes() -> Lifetimes {
    Lifetimes {
        lease: Duration::from_secs(30),
        retention: Duration::from_secs(3600),
    }
}

fn answer(body: &'static [u8]) -> StoredResponse {
    StoredResponse {
        status: 200,
        headers: bytes::Bytes::new(),
        body: bytes::Bytes::from_static(body),
    }
}

fn journaled(journal: &Arc<Recorded>) -> MemoryStore {
    let mut options = MemoryOptions::new(lifetimes());
    options.journal = Some(journal.clone() as Arc<dyn Journal>);
    MemoryStore::with_options(options)
}

#[tokio::test]
async fn every_change_reaches_the_journal_and_a_new_store_loads_it_back() {
    let journal = Arc::new(Recorded::default());
    let store = journaled(&journal);
    let (a, b) = (DeliveryKey::new("r", "a"), DeliveryKey::new("r", "b"));
    let Claim::Claimed(t) = store.claim(&a, &[1; 32], None).await.unwrap() else {
        panic!("claimed")
    };
    assert!(store.complete(&a, t, &answer(b"ok"), None).await.unwrap());
    // A copy answered from the store changes the duplicates count: recorded too.
    store.claim(&a, &[1; 32], None).await.unwrap();
    let Claim::Claimed(_) = store.claim(&b, &[2; 32], None).await.unwrap() else {
        panic!("claimed")
    };
    // A call that changes nothing (not the owner) records nothing.
    assert!(!store.renew(&b, Token([0; 16])).await.unwrap());
    let changes = journal.changes.lock().unwrap().clone();
    let keys: Vec<&str> = changes.iter().map(|(k, _)| k.key.as_str()).collect();
    assert_eq!(keys, ["a", "a", "a", "b"]);
    // The completion (2) and the copy answered from the store (3) waited for their
    // change to be durable; the claims that handed a key over (1, 4) did not: the
    // completion or queueing that answers them waits, and covers them.
    assert_eq!(*journal.awaited.lock().unwrap(), [2, 3]);

    let reloaded = MemoryStore::new(lifetimes());
    for (key, entry) in &changes {
        reloaded
            .restore_entry(key.clone(), entry.as_deref().unwrap())
            .unwrap();
    }
    assert_eq!(
        reloaded.claim(&a, &[1; 32], None).await.unwrap(),
        Claim::Completed(answer(b"ok"))
    );
    assert!(matches!(
        reloaded.claim(&b, &[2; 32], None).await.unwrap(),
        Claim::InFlight { .. }
    ));
    let log = reloaded.read_log_entry(&a).unwrap().unwrap();
    assert_eq!((log.attempts, log.duplicates), (1, 2));

    assert_eq!(
        store.forget_key(&a).await.unwrap(),
        crate::store::log::Forgot::Forgotten
    );
    let last = journal.changes.lock().unwrap().last().cloned().unwrap();
    assert_eq!((last.0.key.as_str(), last.1), ("a", None));
}

#[tokio::test]
async fn an_expired_entry_is_not_loaded() {
    let store = MemoryStore::new(lifetimes());
    let mut gone = Entry::fresh(Some([1; 32]), Status::Completed, 1, 2);
    gone.response = Some(answer(b"old"));
    let mut bytes = Vec::new();
    codec::encode(&gone, &mut bytes);
    store
        .restore_entry(DeliveryKey::new("r", "old"), &bytes)
        .unwrap();
    assert!(store.is_empty());
    assert!(
        store
            .restore_entry(DeliveryKey::new("r", "x"), b"\x09")
            .is_err()
    );
}

/// Item 3 of issue 34: an entry that expired behind a live one in its shard's age
/// order (as a restart of an earlier version loaded them, or a route of a shorter
/// retention behind a longer one) is swept, not kept until the live one expires.
#[tokio::test]
async fn the_sweeper_drops_expired_entries_behind_a_live_one() {
    let store = MemoryStore::new(lifetimes());
    let now = unix_millis();
    let encoded = |expires_at: u64| {
        let mut e = Entry::fresh(Some([1; 32]), Status::Completed, now, expires_at);
        e.response = Some(answer(b"ok"));
        let mut bytes = Vec::new();
        codec::encode(&e, &mut bytes);
        bytes
    };
    // Enough live ones first that every shard's front is live (64 shards).
    let (live, short) = (600, 100);
    for n in 0..live {
        let k = DeliveryKey::new("r", format!("live{n}"));
        store.restore_entry(k, &encoded(now + 600_000)).unwrap();
    }
    for n in 0..short {
        let k = DeliveryKey::new("r", format!("short{n}"));
        store.restore_entry(k, &encoded(now + 300)).unwrap();
    }
    assert_eq!(store.len(), live + short);
    // The sweeper runs once a second; the live ones outlive the wait by far.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while store.len() > live && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(store.len(), live, "expired entries left behind live ones");
}

fn bounded(entries: u64) -> MemoryStore {
    // One small completed delivery's cost, measured on a store of its own.
    let probe = MemoryStore::new(lifetimes());
    let k = DeliveryKey::new("r", "k00000");
    probe
        .inner
        .update(&k, unix_millis(), Admit::Always, |e| {
            let mut fresh = Entry::fresh(Some([1; 32]), Status::Completed, 1, u64::MAX);
            fresh.response = Some(answer(b"ok"));
            *e = Some(fresh);
        })
        .unwrap();
    let one = probe.bound_stats().used_bytes;
    MemoryStore::with_options(MemoryOptions::new(lifetimes()).max_memory(one * entries))
}

async fn deliver(store: &MemoryStore, key: &str) -> Result<Claim, StoreError> {
    let k = DeliveryKey::new("r", key);
    let claim = store.claim(&k, &[1; 32], None).await?;
    if let Claim::Claimed(t) = claim {
        assert!(store.complete(&k, t, &answer(b"ok"), None).await?);
    }
    Ok(claim)
}

#[tokio::test]
async fn the_oldest_completed_deliveries_are_forgotten_first() {
    // Each shard forgets its own oldest: with ~100 deliveries a shard, the
    // newest half of what fits is always remembered, the oldest always gone.
    let store = bounded(6400);
    for n in 0..20_000 {
        deliver(&store, &format!("k{n:05}")).await.unwrap();
    }
    let stats = store.bound_stats();
    assert!(stats.used_bytes <= stats.max_bytes, "{stats:?}");
    assert!(stats.evictions >= 13_000, "{stats:?}");
    // The newest are remembered (a copy is answered), the oldest were forgotten
    // (a copy is claimed again: forwarded a second time).
    for n in 17_000..20_000 {
        let copy = deliver(&store, &format!("k{n:05}")).await.unwrap();
        assert!(matches!(copy, Claim::Completed(_)), "k{n:05}: {copy:?}");
    }
    for n in 0..3000 {
        let copy = deliver(&store, &format!("k{n:05}")).await.unwrap();
        assert!(matches!(copy, Claim::Claimed(_)), "k{n:05}: {copy:?}");
    }
}

/// Claims new deliveries until the store refuses one.
async fn fill(store: &MemoryStore, held: &mut Vec<(DeliveryKey, Token)>) -> StoreError {
    loop {
        let k = DeliveryKey::new("r", format!("p{:05}", held.len()));
        match store.claim(&k, &[1; 32], None).await {
            Ok(Claim::Claimed(t)) => held.push((k, t)),
            Ok(other) => panic!("{other:?}"),
            Err(e) => return e,
        }
        assert!(held.len() < 1000, "never refused");
    }
}

#[tokio::test]
async fn deliveries_in_process_or_queued_are_never_evicted() {
    let store = bounded(200);
    let mut held = Vec::new();
    let refused = fill(&store, &mut held).await;
    assert!(matches!(refused, StoreError::Full), "{refused}");
    assert!(refused.to_string().contains("store.max_memory"));
    // Half of them queued (a smaller entry: room for a few more), the others
    // still processing: all still held, and new ones refused once full again.
    let queued: Vec<_> = held.iter().step_by(2).cloned().collect();
    for (k, t) in &queued {
        assert!(store.mark_queued(k, *t, Duration::ZERO).await.unwrap());
    }
    assert!(matches!(fill(&store, &mut held).await, StoreError::Full));
    assert_eq!(store.bound_stats().evictions, 0);
    for (k, _) in &held {
        let copy = store.claim(k, &[1; 32], None).await.unwrap();
        assert!(
            matches!(copy, Claim::Queued | Claim::InFlight { .. }),
            "{copy:?}"
        );
    }
    // A completion is never refused; once settled, deliveries make room again.
    for (k, t) in held.iter().filter(|h| !queued.contains(h)) {
        assert!(store.complete(k, *t, &answer(b"ok"), None).await.unwrap());
    }
    for n in 0..20 {
        let k = DeliveryKey::new("r", format!("new{n}"));
        let claim = store.claim(&k, &[1; 32], None).await;
        assert!(matches!(claim, Ok(Claim::Claimed(_))), "{claim:?}");
    }
    assert!(store.bound_stats().evictions >= 1);
    for (k, _) in &queued {
        let copy = store.claim(k, &[1; 32], None).await.unwrap();
        assert_eq!(copy, Claim::Queued);
    }
}

#[tokio::test]
async fn the_oldest_age_is_the_effective_window() {
    let store = MemoryStore::new(lifetimes());
    assert_eq!(store.bound_stats().oldest_age, Duration::ZERO);
    let k = DeliveryKey::new("r", "old");
    // Settled ten minutes ago (as if): its mark is its expiry.
    store
        .inner
        .update(&k, unix_millis(), Admit::Always, |e| {
            let mut old = Entry::fresh(Some([1; 32]), Status::Completed, 1, 0);
            old.expires_at = later(unix_millis() - 600_000, lifetimes().retention);
            *e = Some(old);
        })
        .unwrap();
    deliver(&store, "new").await.unwrap();
    let age = store.bound_stats().oldest_age;
    assert!(
        (Duration::from_secs(599)..Duration::from_secs(605)).contains(&age),
        "{age:?}"
    );
}
