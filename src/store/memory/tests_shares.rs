//! Each route's share of `max_memory` (issue 34 item 8): one route's flood evicts its
//! own oldest deliveries, never those of a route within its share.

use super::*;

fn lifetimes() -> Lifetimes {
    Lifetimes {
        lease: Duration::from_secs(30),
        retention: Duration::from_secs(3600),
    }
}

fn answer() -> StoredResponse {
    StoredResponse {
        status: 200,
        headers: bytes::Bytes::new(),
        body: bytes::Bytes::from_static(b"ok"),
    }
}

/// A store bounded to about `entries` small completed deliveries.
fn bounded(entries: u64) -> MemoryStore {
    let probe = MemoryStore::new(lifetimes());
    let k = DeliveryKey::new("a", "k00000");
    probe
        .inner
        .update(&k, unix_millis(), Admit::Always, |e| {
            let mut fresh = Entry::fresh(Some([1; 32]), Status::Completed, 1, u64::MAX);
            fresh.response = Some(answer());
            *e = Some(fresh);
        })
        .unwrap();
    let one = probe.bound_stats().used_bytes;
    MemoryStore::with_options(MemoryOptions::new(lifetimes()).max_memory(one * entries))
}

async fn deliver(store: &MemoryStore, route: &str, key: &str) -> Result<Claim, StoreError> {
    let k = DeliveryKey::new(route, key);
    let claim = store.claim(&k, &[1; 32], None).await?;
    if let Claim::Claimed(t) = claim {
        assert!(store.complete(&k, t, &answer(), None).await?);
    }
    Ok(claim)
}

#[tokio::test]
async fn one_routes_flood_does_not_evict_another_routes_deliveries() {
    let store = bounded(6400);
    for n in 0..200 {
        deliver(&store, "b", &format!("b{n:03}")).await.unwrap();
    }
    // Route `a` sends far more than the whole bound holds.
    for n in 0..20_000 {
        deliver(&store, "a", &format!("a{n:05}")).await.unwrap();
    }
    let stats = store.bound_stats();
    assert!(stats.used_bytes <= stats.max_bytes, "{stats:?}");
    assert!(stats.evictions >= 13_000, "{stats:?}");
    // Every one of `b`'s is remembered: a copy is answered, not forwarded again.
    for n in 0..200 {
        let copy = deliver(&store, "b", &format!("b{n:03}")).await.unwrap();
        assert!(matches!(copy, Claim::Completed(_)), "b{n:03}: {copy:?}");
    }
    // `a` forgot its own oldest and keeps its newest (each shard forgets its own
    // oldest: the newest half of what fits is remembered).
    for n in 17_000..20_000 {
        let copy = deliver(&store, "a", &format!("a{n:05}")).await.unwrap();
        assert!(matches!(copy, Claim::Completed(_)), "a{n:05}: {copy:?}");
    }
}

#[tokio::test]
async fn a_route_over_its_share_gives_way_to_one_under_it() {
    let store = bounded(6400);
    for n in 0..20_000 {
        deliver(&store, "a", &format!("a{n:05}")).await.unwrap();
    }
    // `a` holds the whole bound; `b` (under its half) still gets room, from `a`'s oldest.
    for n in 0..100 {
        let first = deliver(&store, "b", &format!("b{n:03}")).await.unwrap();
        assert!(matches!(first, Claim::Claimed(_)), "b{n:03}: {first:?}");
    }
    for n in 0..20_000 {
        deliver(&store, "a", &format!("x{n:05}")).await.unwrap();
    }
    for n in 0..100 {
        let copy = deliver(&store, "b", &format!("b{n:03}")).await.unwrap();
        assert!(matches!(copy, Claim::Completed(_)), "b{n:03}: {copy:?}");
    }
}
