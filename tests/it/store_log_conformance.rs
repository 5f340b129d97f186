//! The delivery log's store semantics, written once and run against the
//! Redis store on a private redis-server, on a private three-master Redis Cluster, and
//! the in-memory store: what claim, complete
//! and release record, the operator's forced claim (and every way its claim can end),
//! forget, the recent list, and the queue's transitions as claims see them. Every case
//! is listed once in `both!` at the bottom, so the stores cannot drift.

use std::time::Duration;

use crate::common::{LOGGED, REPLAY, RedisServer};
use bytes::Bytes;
use idemgate::providers::{Fingerprint, fingerprint_body};
use idemgate::queue::QueueBackend;
use idemgate::store::MemoryQueue;
use idemgate::store::RedisQueue;
use idemgate::store::log::{
    ClaimLog, DeliveryLog, Filter, Forgot, KeptRequest, ListQuery, LogOutcome, LogSupport,
    SCAN_BUDGET, Settled,
};
use idemgate::store::{
    Claim, DeliveryKey, Lifetimes, MemoryStore, RedisStore, Status, Store, StoredResponse, Token,
};

const LIFETIMES: Lifetimes = Lifetimes {
    lease: Duration::from_secs(30),
    retention: Duration::from_secs(3600),
};

fn fp(s: &str) -> Fingerprint {
    fingerprint_body(s.as_bytes())
}

fn key(k: &str) -> DeliveryKey {
    DeliveryKey::new("route", k)
}

fn response(body: &[u8]) -> StoredResponse {
    StoredResponse {
        status: 200,
        headers: Bytes::from_static(b"content-type: text/plain\r\n"),
        body: Bytes::copy_from_slice(body),
    }
}

fn settled(outcome: &'static str, status: Option<u16>, restore: bool) -> Settled {
    Settled {
        outcome: LogOutcome::parse(outcome).expect("a log outcome"),
        upstream_status: status,
        latency_ms: 7,
        restore_completed: restore,
    }
}

fn kept() -> KeptRequest {
    KeptRequest {
        method: "POST".into(),
        path: "/hook?a=1".into(),
        headers: Bytes::from_static(b"x-a: 1\r\n"),
        body: Bytes::from_static(b"\xff\x00 not utf-8"),
    }
}

fn claimed(c: Claim) -> Token {
    match c {
        Claim::Claimed(t) => t,
        other => panic!("expected Claimed, got {other:?}"),
    }
}

async fn claim_complete_release_are_recorded<S: Store>(s: S) {
    assert_eq!(s.log_support(), LogSupport::Full);
    let k = key("evt_log");
    let t = claimed(
        s.claim(
            &k,
            &fp("a"),
            Some(ClaimLog {
                kept: Some(&kept()),
                replay: false,
            }),
        )
        .await
        .unwrap(),
    );
    let e = s.log_entry(&k).await.unwrap().unwrap();
    assert_eq!(
        (e.status, e.claimed, e.attempts),
        (Status::Processing, true, 1)
    );
    assert_eq!(e.request, Some(kept()));
    assert!(
        s.release(&k, t, Some(&settled("upstream_error", None, false)))
            .await
            .unwrap()
    );
    let e = s.log_entry(&k).await.unwrap().unwrap();
    assert_eq!(e.status, Status::Released);
    assert_eq!(e.outcome.as_deref(), Some("upstream_error"));
    assert_eq!(e.upstream_status, None);
    assert_eq!(e.latency_ms, Some(7));

    let t = claimed(s.claim(&k, &fp("a"), LOGGED).await.unwrap());
    assert!(
        s.complete(
            &k,
            t,
            &response(b"ok"),
            Some(&settled("forwarded", Some(200), false))
        )
        .await
        .unwrap()
    );
    assert!(matches!(
        s.claim(&k, &fp("a"), LOGGED).await.unwrap(),
        Claim::Completed(_)
    ));
    let e = s.log_entry(&k).await.unwrap().unwrap();
    assert_eq!(
        (e.status, e.attempts, e.duplicates),
        (Status::Completed, 2, 1)
    );
    assert_eq!(e.outcome.as_deref(), Some("forwarded"));
    assert_eq!(
        (e.upstream_status, e.response_status),
        (Some(200), Some(200))
    );
    assert_eq!(e.request, Some(kept()), "the first claim's request is kept");
    assert!(e.has_request);
    assert!(s.log_entry(&key("never")).await.unwrap().is_none());
}

async fn a_forced_claim_reclaims_completed_but_never_a_live_claim<S: Store>(s: S) {
    let k = key("evt_force");
    let t = claimed(s.claim(&k, &fp("a"), None).await.unwrap());
    // A live claim: the operator's replay is refused too.
    assert!(matches!(
        s.claim(&k, &fp("a"), REPLAY).await.unwrap(),
        Claim::InFlight { .. }
    ));
    assert!(s.complete(&k, t, &response(b"one"), None).await.unwrap());
    let op = claimed(s.claim(&k, &fp("a"), REPLAY).await.unwrap());
    // Copies meanwhile see a claim in flight, not the old answer.
    assert!(matches!(
        s.claim(&k, &fp("a"), None).await.unwrap(),
        Claim::InFlight { .. }
    ));
    // A failed replay puts the key back to its old answer.
    assert!(
        s.release(
            &k,
            op,
            Some(&settled("operator_replay_failed", Some(500), true))
        )
        .await
        .unwrap()
    );
    assert_eq!(
        s.claim(&k, &fp("a"), None).await.unwrap(),
        Claim::Completed(response(b"one"))
    );
    let op = claimed(s.claim(&k, &fp("a"), REPLAY).await.unwrap());
    assert!(
        s.complete(
            &k,
            op,
            &response(b"two"),
            Some(&settled("operator_replay", Some(200), false))
        )
        .await
        .unwrap()
    );
    assert_eq!(
        s.claim(&k, &fp("a"), None).await.unwrap(),
        Claim::Completed(response(b"two"))
    );
    let e = s.log_entry(&k).await.unwrap().unwrap();
    assert_eq!((e.replays, e.attempts), (2, 3));
    assert_eq!(e.outcome.as_deref(), Some("operator_replay"));
}

async fn forget_frees_a_key_but_not_a_live_claim<S: Store>(s: S) {
    let k = key("evt_forget");
    let t = claimed(s.claim(&k, &fp("a"), None).await.unwrap());
    assert_eq!(s.forget(&k).await.unwrap(), Forgot::InFlight);
    assert!(s.complete(&k, t, &response(b"ok"), None).await.unwrap());
    assert_eq!(s.forget(&k).await.unwrap(), Forgot::Forgotten);
    assert_eq!(s.forget(&k).await.unwrap(), Forgot::NotFound);
    assert!(s.log_entry(&k).await.unwrap().is_none());
    claimed(s.claim(&k, &fp("b"), None).await.unwrap());
}

async fn the_recent_list_pages_newest_first_and_filters<S: Store>(s: S) {
    let mut keys = Vec::new();
    for i in 0..5 {
        let k = DeliveryKey::new("listed", format!("evt_{i}"));
        let t = claimed(s.claim(&k, &fp("x"), LOGGED).await.unwrap());
        if i == 2 {
            s.release(&k, t, Some(&settled("upstream_error", Some(500), false)))
                .await
                .unwrap();
        } else {
            s.complete(
                &k,
                t,
                &response(b"ok"),
                Some(&settled("forwarded", Some(200), false)),
            )
            .await
            .unwrap();
        }
        keys.push(k.key);
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    let mut q = ListQuery {
        routes: vec!["listed".into(), "other".into()],
        limit: 2,
        ..Default::default()
    };
    let mut seen = Vec::new();
    loop {
        let page = s.recent(&q).await.unwrap();
        seen.extend(page.items.iter().map(|(_, e)| e.key.clone()));
        match page.next {
            Some(c) => q.cursor = Some(c),
            None => break,
        }
    }
    keys.reverse();
    assert_eq!(seen, keys);
    let released = s
        .recent(&ListQuery {
            routes: vec!["listed".into()],
            filter: Filter {
                status: Some(Status::Released),
                ..Default::default()
            },
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(released.items.len(), 1);
    assert_eq!(released.items[0].1.key, "evt_2");
    let fwd = s
        .recent(&ListQuery {
            routes: vec!["listed".into()],
            filter: Filter {
                outcome: Some(LogOutcome::Forwarded),
                ..Default::default()
            },
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(fwd.items.len(), 4);
    // A forgotten key leaves the list.
    s.forget(&DeliveryKey::new("listed", "evt_4"))
        .await
        .unwrap();
    let all = s
        .recent(&ListQuery {
            routes: vec!["listed".into()],
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(all.items.len(), 4);
    assert_eq!(all.items[0].1.key, "evt_3");
}

/// A delivery claimed again after its record expired, while its index entry was kept
/// alive by a newer delivery, stays listed for as long as its new record lives: the
/// index's lifetime follows the newest claim, not only the newest index member.
/// `s` keeps deliveries for 2 s.
async fn a_reclaimed_delivery_stays_listed_while_it_lives<S: Store>(s: S) {
    let done = settled("forwarded", Some(200), false);
    let deliver = |k: DeliveryKey| {
        let s = &s;
        let done = &done;
        async move {
            let t = claimed(s.claim(&k, &fp("x"), LOGGED).await.unwrap());
            assert!(
                s.complete(&k, t, &response(b"ok"), Some(done))
                    .await
                    .unwrap()
            );
        }
    };
    let a = DeliveryKey::new("relisted", "evt_a");
    deliver(a.clone()).await; // t = 0: a lives until 2.0 s
    tokio::time::sleep(Duration::from_millis(500)).await;
    deliver(DeliveryKey::new("relisted", "evt_b")).await; // b (and the index) until 2.5 s
    tokio::time::sleep(Duration::from_millis(1700)).await;
    assert!(
        s.log_entry(&a).await.unwrap().is_none(),
        "a's first record expired"
    );
    deliver(a.clone()).await; // t = 2.2 s: a again, until 4.2 s
    tokio::time::sleep(Duration::from_millis(600)).await; // t = 2.8 s: b has expired
    let q = ListQuery {
        routes: vec!["relisted".into()],
        limit: 10,
        ..Default::default()
    };
    let page = s.recent(&q).await.unwrap();
    let listed: Vec<&str> = page.items.iter().map(|(_, e)| e.key.as_str()).collect();
    assert_eq!(listed, ["evt_a"]);
    // Listed where its second life began, not where its first did.
    let (score, e) = &page.items[0];
    assert_eq!(*score, e.first_seen, "{e:?}");
}

const RETAIN_4S: Lifetimes = Lifetimes {
    lease: Duration::from_secs(30),
    retention: Duration::from_secs(4),
};

/// Stale index members (records expired since; copies in between did not move them)
/// are skipped without skipping live ones: one listing as long as a job's page (500)
/// and a walk of 50-item pages each return every live delivery.
/// `s` keeps deliveries for 4 s.
async fn stale_members_on_top_hide_no_live_delivery<S: Store>(s: S) {
    const LIVE: usize = 250;
    let start = tokio::time::Instant::now();
    let deliver = |k: DeliveryKey| {
        let s = &s;
        async move {
            let t = claimed(s.claim(&k, &fp("x"), LOGGED).await.unwrap());
            let done = settled("forwarded", Some(200), false);
            assert!(
                s.complete(&k, t, &response(b"ok"), Some(&done))
                    .await
                    .unwrap()
            );
        }
    };
    let old: Vec<DeliveryKey> = (0..10)
        .map(|i| DeliveryKey::new("stale", format!("old_{i:02}")))
        .collect();
    for k in &old {
        deliver(k.clone()).await; // lives until 4 s
    }
    tokio::time::sleep_until(start + Duration::from_millis(1000)).await;
    let mut live = Vec::new();
    for i in 0..LIVE {
        let k = DeliveryKey::new("stale", format!("live_{i:03}"));
        deliver(k.clone()).await; // lives until 5 s or later
        live.push(k.key);
    }
    // Copies of the old deliveries lengthen neither their lifetimes nor move them.
    for k in &old {
        assert!(
            matches!(
                s.claim(k, &fp("x"), LOGGED).await.unwrap(),
                Claim::Completed(_)
            ),
            "the old delivery expired before its copy: too slow a machine for this test"
        );
    }
    tokio::time::sleep_until(start + Duration::from_millis(4300)).await;
    assert!(s.log_entry(&old[0]).await.unwrap().is_none(), "still lives");
    let q = ListQuery {
        routes: vec!["stale".into()],
        limit: 500,
        ..Default::default()
    };
    let one = s.recent(&q).await.unwrap();
    let mut listed: Vec<String> = one.items.iter().map(|(_, e)| e.key.clone()).collect();
    listed.sort();
    assert_eq!(
        (listed.len(), one.next.is_none()),
        (LIVE, true),
        "a 500-item listing skipped live deliveries"
    );
    assert_eq!(listed, live);
    let mut q = ListQuery { limit: 50, ..q };
    let mut paged = Vec::new();
    loop {
        let page = s.recent(&q).await.unwrap();
        paged.extend(page.items.iter().map(|(_, e)| e.key.clone()));
        match page.next {
            Some(c) => q.cursor = Some(c),
            None => break,
        }
    }
    paged.sort();
    assert_eq!(paged, live, "50-item pages skipped live deliveries");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "the live deliveries may have expired: too slow a machine for this test"
    );
}

/// A walk of the list, page by page, while new deliveries keep arriving (from another
/// task), copies of listed and not yet listed ones are answered, and older ones expire
/// (`s` keeps deliveries for [`WALK_RETENTION`]): every delivery that lived when the
/// walk began and still lives is listed exactly once, newest first, and none twice.
/// The old ones are made 4 s before the live ones; the walk lists a few pages, waits
/// until the old ones are gone (their state, not a guess of the walk's speed), then
/// goes on: the live ones then have 4 s left for about 20 pages.
async fn a_cursor_neither_skips_nor_repeats_while_deliveries_arrive_copy_and_expire<
    S: Store + Clone,
>(
    s: S,
) {
    let deliver = |s: S, k: DeliveryKey| async move {
        let t = claimed(s.claim(&k, &fp("x"), LOGGED).await.unwrap());
        let done = settled("forwarded", Some(200), false);
        assert!(
            s.complete(&k, t, &response(b"ok"), Some(&done))
                .await
                .unwrap()
        );
    };
    // Concurrent batches (so one log write batch spans many slots on a cluster).
    let batch = |prefix: &'static str, n: usize| {
        let s = s.clone();
        async move {
            let mut set = tokio::task::JoinSet::new();
            for i in 0..n {
                set.spawn(deliver(
                    s.clone(),
                    DeliveryKey::new("walk", format!("{prefix}_{i:03}")),
                ));
            }
            while let Some(r) = set.join_next().await {
                r.unwrap();
            }
        }
    };
    batch("old", 40).await; // expire during the walk (awaited below)
    let old_done = tokio::time::Instant::now();
    tokio::time::sleep_until(old_done + Duration::from_secs(4)).await;
    let live_start = tokio::time::Instant::now();
    batch("live", 120).await; // live until `live_start + WALK_RETENTION` at least
    let live: Vec<String> = (0..120).map(|i| format!("live_{i:03}")).collect();
    // Arrivals during the walk: at most 300, until the walk ends.
    let walking = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let arriving = {
        let s = s.clone();
        let walking = walking.clone();
        tokio::spawn(async move {
            for i in 0..300 {
                if !walking.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                deliver(s.clone(), DeliveryKey::new("walk", format!("new_{i:03}"))).await;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut q = ListQuery {
        routes: vec!["walk".into()],
        limit: 6,
        ..Default::default()
    };
    let mut seen: Vec<(u64, String)> = Vec::new();
    let mut page_no = 0usize;
    loop {
        let page = s.recent(&q).await.unwrap();
        seen.extend(page.items.iter().map(|(sc, e)| (*sc, e.key.clone())));
        // Copies of a delivery further down and of one already listed.
        for k in [
            &live[(page_no * 7) % live.len()],
            &live[(page_no * 13 + 5) % live.len()],
        ] {
            let c = s
                .claim(&DeliveryKey::new("walk", k.as_str()), &fp("x"), LOGGED)
                .await;
            assert!(matches!(c, Ok(Claim::Completed(_))), "{c:?}");
        }
        page_no += 1;
        match page.next {
            Some(c) => q.cursor = Some(c),
            None => break,
        }
        if page_no == 3 {
            // The old ones expire now, mid-walk, behind the cursor's next pages.
            tokio::time::sleep_until(old_done + WALK_RETENTION).await;
            for i in 0..40 {
                let k = DeliveryKey::new("walk", format!("old_{i:03}"));
                let end = tokio::time::Instant::now() + Duration::from_secs(5);
                while s.log_entry(&k).await.unwrap().is_some() {
                    assert!(tokio::time::Instant::now() < end, "{k:?} never expired");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    walking.store(false, std::sync::atomic::Ordering::Relaxed);
    arriving.await.unwrap();
    // The case's premise: the live ones outlived the walk (it ended within their
    // retention). Checked on their state, which a slower walk would change.
    let oldest_live = DeliveryKey::new("walk", "live_000");
    assert!(
        s.log_entry(&oldest_live).await.unwrap().is_some(),
        "the live deliveries expired before the walk ended ({:?} after they were made)",
        live_start.elapsed()
    );
    assert!(
        page_no > 3,
        "the walk ended before the old ones expired ({page_no} pages)"
    );
    let keys: Vec<&str> = seen.iter().map(|(_, k)| k.as_str()).collect();
    let mut unique = keys.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), keys.len(), "listed twice: {keys:?}");
    for k in &live {
        assert!(keys.contains(&k.as_str()), "{k} was skipped: {keys:?}");
    }
    assert!(
        seen.windows(2).all(|w| w[0].0 >= w[1].0),
        "not newest first: {seen:?}"
    );
    assert!(page_no > 10, "the walk took {page_no} pages");
}

/// Every filter word keeps what it says, on the store's own list (the words' parsing
/// is unit-tested in `store::log_filter`).
async fn filters_find_what_the_words_say<S: Store>(s: S) {
    let k = |name: &str| DeliveryKey::new("found", name);
    // a: forwarded 200, a copy answered; b: failed 503, request kept; c: failed 502.
    let t = claimed(s.claim(&k("a_1"), &fp("a"), LOGGED).await.unwrap());
    s.complete(
        &k("a_1"),
        t,
        &response(b"ok"),
        Some(&settled("forwarded", Some(200), false)),
    )
    .await
    .unwrap();
    assert!(matches!(
        s.claim(&k("a_1"), &fp("a"), LOGGED).await.unwrap(),
        Claim::Completed(_)
    ));
    tokio::time::sleep(Duration::from_millis(5)).await;
    let kept_log = ClaimLog {
        kept: Some(&kept()),
        replay: false,
    };
    let t = claimed(s.claim(&k("b_1"), &fp("b"), Some(kept_log)).await.unwrap());
    s.release(
        &k("b_1"),
        t,
        Some(&settled("upstream_error", Some(503), false)),
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
    let t = claimed(s.claim(&k("b_2"), &fp("c"), LOGGED).await.unwrap());
    s.release(
        &k("b_2"),
        t,
        Some(&settled("upstream_error", Some(502), false)),
    )
    .await
    .unwrap();
    let all = s
        .recent(&ListQuery {
            routes: vec!["found".into()],
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    let seen: Vec<u64> = all.items.iter().map(|(_, e)| e.first_seen).collect();
    assert_eq!(seen.len(), 3);
    let (t_a, t_b1) = (seen[2], seen[1]);
    let listed = |words: &[(&str, String)]| {
        let mut filter = Filter::default();
        for (w, v) in words {
            assert!(filter.set(w, v).unwrap());
        }
        let q = ListQuery {
            routes: vec!["found".into()],
            filter,
            limit: 10,
            ..Default::default()
        };
        let s = &s;
        async move {
            let page = s.recent(&q).await.unwrap();
            assert!(!page.partial);
            page.items
                .iter()
                .map(|(_, e)| e.key.clone())
                .collect::<Vec<_>>()
        }
    };
    let w = |k: &str, v: &str| (k.to_string(), v.to_string());
    for (words, want) in [
        (vec![w("key_prefix", "b_")], vec!["b_2", "b_1"]),
        (vec![w("upstream_status", "5xx")], vec!["b_2", "b_1"]),
        (vec![w("upstream_status", "503")], vec!["b_1"]),
        (vec![w("upstream_status", "2xx")], vec!["a_1"]),
        (vec![w("duplicates", "true")], vec!["a_1"]),
        (vec![w("kept", "true")], vec!["b_1"]),
        (vec![w("since", &t_b1.to_string())], vec!["b_2", "b_1"]),
        (vec![w("until", &t_b1.to_string())], vec!["a_1"]),
        (
            vec![
                w("since", &t_a.to_string()),
                w("until", &(t_b1 + 1).to_string()),
            ],
            vec!["b_1", "a_1"],
        ),
        (
            vec![w("outcome", "upstream_error"), w("key_prefix", "b_1")],
            vec!["b_1"],
        ),
    ] {
        let words: Vec<(&str, String)> =
            words.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
        assert_eq!(listed(&words).await, want, "{words:?}");
    }
}

/// A filter that matches little over an index longer than a listing's reading budget:
/// each page reads at most [`SCAN_BUDGET`] entries and says `partial` with a cursor,
/// and walking the cursor finds every match once.
async fn a_narrow_filter_over_a_long_index_answers_partial_pages<S: Store + Clone>(s: S) {
    let deliver = |s: S, key: String| async move {
        let k = DeliveryKey::new("long", key);
        let t = claimed(s.claim(&k, &fp("x"), LOGGED).await.unwrap());
        s.complete(
            &k,
            t,
            &response(b"ok"),
            Some(&settled("forwarded", Some(200), false)),
        )
        .await
        .unwrap();
    };
    for i in 0..3 {
        deliver(s.clone(), format!("needle_{i}")).await;
    }
    tokio::time::sleep(Duration::from_millis(5)).await;
    let total = SCAN_BUDGET + SCAN_BUDGET / 2;
    let mut set = tokio::task::JoinSet::new();
    for w in 0..8 {
        let s = s.clone();
        set.spawn(async move {
            for i in (w..total).step_by(8) {
                deliver(s.clone(), format!("hay_{i:05}")).await;
            }
        });
    }
    while let Some(r) = set.join_next().await {
        r.unwrap();
    }
    let mut filter = Filter::default();
    filter.set("key_prefix", "needle_").unwrap();
    let mut q = ListQuery {
        routes: vec!["long".into()],
        filter,
        limit: 10,
        ..Default::default()
    };
    let first = s.recent(&q).await.unwrap();
    assert!(first.partial, "the first page read the whole index");
    assert!(first.items.is_empty(), "{:?}", first.items);
    assert!(first.next.is_some());
    let mut found = Vec::new();
    let mut pages = 0;
    loop {
        let page = s.recent(&q).await.unwrap();
        found.extend(page.items.iter().map(|(_, e)| e.key.clone()));
        pages += 1;
        assert!(pages < 10, "the walk does not end");
        match page.next {
            Some(c) => q.cursor = Some(c),
            None => break,
        }
    }
    assert_eq!(found, ["needle_2", "needle_1", "needle_0"]);
    assert!(pages >= 2, "{pages} pages");
}

/// The cursor walk's retention: the old deliveries' expiry is awaited mid-walk, and
/// the live ones, made 4 s later, must outlive the rest of the walk.
const WALK_RETENTION: Duration = Duration::from_secs(8);
const RETAIN_WALK: Lifetimes = Lifetimes {
    lease: Duration::from_secs(30),
    retention: WALK_RETENTION,
};

const SHORT: Lifetimes = Lifetimes {
    lease: Duration::from_secs(30),
    retention: Duration::from_secs(2),
};

/// Waits until no live claim holds `k` (its lease lapsed), or panics after 5 s.
async fn until_unclaimed<S: Store>(s: &S, k: &DeliveryKey) {
    let end = tokio::time::Instant::now() + Duration::from_secs(5);
    while s.log_entry(k).await.unwrap().is_some_and(|e| e.claimed) {
        assert!(tokio::time::Instant::now() < end, "the claim never lapsed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A replayer that never settles (killed, its reply lost, its release failing): once
/// its lease lapses the key is completed again with its old answer, for copies and
/// for the log. `s` has a 300 ms lease.
async fn a_replay_that_never_settles_leaves_the_old_answer<S: Store>(s: S) {
    let k = key("evt_unsettled");
    let t = claimed(s.claim(&k, &fp("a"), None).await.unwrap());
    assert!(s.complete(&k, t, &response(b"one"), None).await.unwrap());
    let op = claimed(s.claim(&k, &fp("a"), REPLAY).await.unwrap());
    until_unclaimed(&s, &k).await;
    let e = s.log_entry(&k).await.unwrap().unwrap();
    assert_eq!(e.status, Status::Completed, "the log after a lapsed replay");
    assert_eq!(
        s.claim(&k, &fp("a"), None).await.unwrap(),
        Claim::Completed(response(b"one")),
        "a copy after a lapsed replay"
    );
    // The lapsed replayer can no longer record anything.
    assert!(!s.complete(&k, op, &response(b"late"), None).await.unwrap());
    assert!(!s.release(&k, op, None).await.unwrap());
    // A second replay that lapses too: still the old answer.
    claimed(s.claim(&k, &fp("a"), REPLAY).await.unwrap());
    until_unclaimed(&s, &k).await;
    assert_eq!(
        s.claim(&k, &fp("a"), None).await.unwrap(),
        Claim::Completed(response(b"one"))
    );
    assert_eq!(
        s.log_entry(&k).await.unwrap().unwrap().status,
        Status::Completed
    );
}

/// Any release of a replay's claim of a completed key, the plain one (an
/// under-replicated claim is given up with it) as the logged one without the restore
/// flag, leaves the key completed with its old answer.
async fn any_release_of_a_replay_keeps_the_old_answer<S: Store>(s: S) {
    let k = key("evt_release_replay");
    let t = claimed(s.claim(&k, &fp("a"), None).await.unwrap());
    assert!(s.complete(&k, t, &response(b"one"), None).await.unwrap());
    let op = claimed(s.claim(&k, &fp("a"), REPLAY).await.unwrap());
    assert!(s.release(&k, op, None).await.unwrap());
    assert_eq!(
        s.claim(&k, &fp("a"), None).await.unwrap(),
        Claim::Completed(response(b"one"))
    );
    let op = claimed(s.claim(&k, &fp("a"), REPLAY).await.unwrap());
    assert!(
        s.release(
            &k,
            op,
            Some(&settled("operator_replay_failed", Some(500), false))
        )
        .await
        .unwrap()
    );
    assert_eq!(
        s.claim(&k, &fp("a"), None).await.unwrap(),
        Claim::Completed(response(b"one"))
    );
    let e = s.log_entry(&k).await.unwrap().unwrap();
    assert_eq!(e.status, Status::Completed);
    assert_eq!(e.outcome.as_deref(), Some("operator_replay_failed"));
    // A replay of a released key that fails leaves it released: the next copy is
    // forwarded.
    let r = key("evt_release_released");
    let t = claimed(s.claim(&r, &fp("a"), None).await.unwrap());
    assert!(s.release(&r, t, None).await.unwrap());
    let op = claimed(s.claim(&r, &fp("a"), REPLAY).await.unwrap());
    assert!(s.release(&r, op, None).await.unwrap());
    claimed(s.claim(&r, &fp("a"), None).await.unwrap());
}

/// An operator's forced claim only ever re-claims the delivery it read: a key that is
/// gone or now holds another payload is `Mismatch` (the replay answers "changed").
async fn a_forced_claim_of_a_gone_or_changed_key_is_a_mismatch<S: Store>(s: S) {
    assert_eq!(
        s.claim(&key("evt_gone"), &fp("a"), REPLAY).await.unwrap(),
        Claim::Mismatch
    );
    assert!(s.log_entry(&key("evt_gone")).await.unwrap().is_none());
    let k = key("evt_changed");
    let t = claimed(s.claim(&k, &fp("a"), None).await.unwrap());
    assert!(s.complete(&k, t, &response(b"one"), None).await.unwrap());
    assert_eq!(
        s.claim(&k, &fp("b"), REPLAY).await.unwrap(),
        Claim::Mismatch
    );
    assert_eq!(
        s.claim(&k, &fp("a"), None).await.unwrap(),
        Claim::Completed(response(b"one"))
    );
}

/// The queue's transitions seen by claims, on both stores: an operator's forced claim
/// of a queued key answers `Queued` like a copy's, and a worker that locks a key whose
/// record expired re-creates it without a payload fingerprint, so copies are
/// acknowledged (never 422). `s` keeps deliveries for 300 ms.
async fn queued_keys_answer_queued<S: Store, Q: QueueBackend>(s: S, q: Q) {
    let k = key("evt_queued");
    let t = claimed(s.claim(&k, &fp("a"), None).await.unwrap());
    // keep_for zero: the record lives `retention` (300 ms) and expires below.
    assert!(q.mark_queued(&k, t, Duration::ZERO).await.unwrap());
    assert_eq!(s.claim(&k, &fp("a"), REPLAY).await.unwrap(), Claim::Queued);
    assert_eq!(s.claim(&k, &fp("a"), None).await.unwrap(), Claim::Queued);
    let end = tokio::time::Instant::now() + Duration::from_secs(5);
    while s.log_entry(&k).await.unwrap().is_some() {
        assert!(
            tokio::time::Instant::now() < end,
            "the record never expired"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let token = match q.lock(&k, "1-0", Duration::ZERO).await.unwrap() {
        idemgate::queue::Lock::Claimed { token, .. } => token,
        other => panic!("expected the worker's lock, got {other:?}"),
    };
    assert!(q.unlock(&k, token, false).await.unwrap());
    assert_eq!(
        s.claim(&k, &fp("a"), None).await.unwrap(),
        Claim::Queued,
        "a copy of a queued delivery whose record expired"
    );
}

const SHORT_LEASE: Lifetimes = Lifetimes {
    lease: Duration::from_millis(300),
    retention: Duration::from_secs(3600),
};

const SHORT_RETENTION: Lifetimes = Lifetimes {
    lease: Duration::from_secs(30),
    retention: Duration::from_millis(300),
};

/// With `min_replicas_ack`, a replay's claim that no replica confirmed is given up in
/// the background with the plain release: the key stays completed with its old answer
/// (one redis-server, no replica: `WAIT` falls short).
#[tokio::test]
async fn an_under_replicated_replay_claim_keeps_the_old_answer() {
    let server = RedisServer::start_new();
    let plain = RedisStore::new(&server.url(), "log", LIFETIMES, Duration::from_secs(1)).unwrap();
    let acked = plain
        .clone()
        .with_replica_acks(1, Duration::from_millis(50));
    let k = key("evt_acked_replay");
    let t = claimed(plain.claim(&k, &fp("a"), None).await.unwrap());
    assert!(
        plain
            .complete(&k, t, &response(b"one"), None)
            .await
            .unwrap()
    );
    let e = acked.claim(&k, &fp("a"), REPLAY).await.unwrap_err();
    assert!(e.to_string().contains("0 of 1 replicas"), "{e}");
    let lock = format!("{}:lock", plain.state_key(&k));
    crate::common::wait_until(Duration::from_secs(5), "the background release", || {
        server.cli(&["EXISTS", &lock]) == "0"
    })
    .await;
    assert_eq!(
        plain.claim(&k, &fp("a"), None).await.unwrap(),
        Claim::Completed(response(b"one"))
    );
}

/// Instantiates every case for both stores: `stores:` cases take the store, `queued:`
/// cases the store and its queue; each with the lifetimes it names.
macro_rules! both {
    (
        stores: $($case:ident => $lifetimes:expr),* ;
        queued: $($qcase:ident => $qlifetimes:expr),* $(,)?
    ) => {
        mod memory {
            use super::*;
            $(
                #[tokio::test]
                async fn $case() {
                    super::$case(MemoryStore::new($lifetimes)).await;
                }
            )*
            $(
                #[tokio::test]
                async fn $qcase() {
                    let s = MemoryStore::new($qlifetimes);
                    super::$qcase(s.clone(), MemoryQueue::new(s)).await;
                }
            )*
        }
        mod file {
            use super::*;
            $(
                #[tokio::test]
                async fn $case() {
                    let f = crate::common::file_store::FileStore::open($lifetimes);
                    super::$case(f.store.clone()).await;
                }
            )*
            $(
                #[tokio::test]
                async fn $qcase() {
                    let f = crate::common::file_store::FileStore::open($qlifetimes);
                    super::$qcase(f.store.clone(), f.queue).await;
                }
            )*
        }
        mod redis {
            use super::*;
            $(
                #[tokio::test]
                async fn $case() {
                    let server = RedisServer::start_new();
                    let s = RedisStore::new(&server.url(), "log", $lifetimes, Duration::from_secs(1)).unwrap();
                    super::$case(s).await;
                }
            )*
            $(
                #[tokio::test]
                async fn $qcase() {
                    let server = RedisServer::start_new();
                    let s = RedisStore::new(&server.url(), "log", $qlifetimes, Duration::from_secs(1)).unwrap();
                    super::$qcase(s.clone(), RedisQueue::new(s)).await;
                }
            )*
        }
        /// The same cases through Sentinels: the store follows the master they name
        /// (one set for every case, each case under its own prefix).
        mod sentinel {
            use super::*;
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn every_case() {
                let set = crate::common::cluster::SentinelSet::start();
                $(
                    eprintln!("redis sentinel: {}", stringify!($case));
                    let s = RedisStore::new(&set.url(), stringify!($case), $lifetimes, Duration::from_secs(2)).unwrap();
                    super::$case(s).await;
                )*
                drop(set);
            }
        }
        /// The same cases on a Redis Cluster: the recent index lives in its route's
        /// slot, the deliveries in theirs.
        mod cluster {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let cluster = crate::common::cluster::RedisCluster::start(3, 0);
                    let s = RedisStore::new(&cluster.url(), "log", $lifetimes, Duration::from_secs(1)).unwrap();
                    super::$case(s).await;
                }
            )*
        }
    };
}

/// A delivery that fails at once (the upstream refused within a millisecond) is
/// recorded with its outcome, whether or not the claim's own log entry was written
/// before the release (Redis writes it off the claim's path).
async fn a_release_right_after_the_claim_keeps_its_outcome<S: Store>(s: S) {
    let k = key("evt_fast_failure");
    let t = claimed(s.claim(&k, &fp("a"), LOGGED).await.unwrap());
    assert!(
        s.release(&k, t, Some(&settled("upstream_error", Some(502), false)))
            .await
            .unwrap()
    );
    let e = s.log_entry(&k).await.unwrap().expect("logged");
    assert_eq!(e.status, Status::Released);
    assert_eq!(e.outcome.as_deref(), Some("upstream_error"));
    assert_eq!((e.upstream_status, e.attempts), (Some(502), 1));
}

/// A replay of a completed key near the end of its retention that fails keeps the old
/// answer for a whole retention from the replay: copies are not forwarded again when
/// the original retention ends. `s`: 1.5 s lease, 3 s retention.
async fn a_failed_replay_near_expiry_keeps_the_answer_a_retention<S: Store>(s: S) {
    let k = key("evt_replay_near_expiry");
    let t = claimed(s.claim(&k, &fp("a"), LOGGED).await.unwrap());
    assert!(s.complete(&k, t, &response(b"one"), None).await.unwrap());
    let done = tokio::time::Instant::now();
    let retention = LEASE_1500MS_RETENTION_3S.retention;
    tokio::time::sleep_until(done + retention * 2 / 3).await; // 1 s of retention left
    let op = claimed(s.claim(&k, &fp("a"), REPLAY).await.unwrap());
    assert!(
        s.release(
            &k,
            op,
            Some(&settled("operator_replay_failed", Some(500), true))
        )
        .await
        .unwrap()
    );
    // Past the original retention, well within one from the replay.
    tokio::time::sleep_until(done + retention + Duration::from_millis(300)).await;
    assert_eq!(
        s.claim(&k, &fp("a"), None).await.unwrap(),
        Claim::Completed(response(b"one"))
    );
}

/// On Redis the claim's own log write is queued off the claim's path, so a fast
/// release can land first: it still records its outcome, in a hash with a TTL.
#[tokio::test]
async fn redis_a_release_before_the_claims_log_write_keeps_its_outcome() {
    let server = RedisServer::start_new();
    let s = RedisStore::new(&server.url(), "log", LIFETIMES, Duration::from_secs(1)).unwrap();
    let k = key("evt_release_first");
    let t = claimed(s.claim(&k, &fp("a"), LOGGED).await.unwrap());
    // The claim's log write lands (the read waits for it), and is undone: as if the
    // release had come first.
    assert!(s.log_entry(&k).await.unwrap().is_some());
    server.cli(&["DEL", &s.state_key(&k)]);
    assert!(
        s.release(&k, t, Some(&settled("upstream_error", Some(502), false)))
            .await
            .unwrap()
    );
    assert_eq!(
        server.cli(&["HGET", &s.state_key(&k), "outcome"]),
        "upstream_error"
    );
    let ttl: i64 = server.cli(&["PTTL", &s.state_key(&k)]).parse().unwrap();
    assert!(
        ttl > 0,
        "the release left the log hash without a TTL: {ttl}"
    );
}

/// Margins of a second or more around the retention's end, for a busy machine.
const LEASE_1500MS_RETENTION_3S: Lifetimes = Lifetimes {
    lease: Duration::from_millis(1500),
    retention: Duration::from_secs(3),
};

both!(
    stores:
    a_release_right_after_the_claim_keeps_its_outcome => LIFETIMES,
    a_failed_replay_near_expiry_keeps_the_answer_a_retention => LEASE_1500MS_RETENTION_3S,
    claim_complete_release_are_recorded => LIFETIMES,
    a_forced_claim_reclaims_completed_but_never_a_live_claim => LIFETIMES,
    forget_frees_a_key_but_not_a_live_claim => LIFETIMES,
    the_recent_list_pages_newest_first_and_filters => LIFETIMES,
    a_reclaimed_delivery_stays_listed_while_it_lives => SHORT,
    stale_members_on_top_hide_no_live_delivery => RETAIN_4S,
    a_cursor_neither_skips_nor_repeats_while_deliveries_arrive_copy_and_expire => RETAIN_WALK,
    filters_find_what_the_words_say => LIFETIMES,
    a_narrow_filter_over_a_long_index_answers_partial_pages => LIFETIMES,
    a_replay_that_never_settles_leaves_the_old_answer => SHORT_LEASE,
    any_release_of_a_replay_keeps_the_old_answer => LIFETIMES,
    a_forced_claim_of_a_gone_or_changed_key_is_a_mismatch => LIFETIMES;
    queued:
    queued_keys_answer_queued => SHORT_RETENTION,
);
