//! The delivery log on a Redis Cluster: the recent index lives in its route's own
//! slot and is written by the log writer (no script touches it), so listing, show,
//! replay and forget work as on one server, and the hot path keeps its single-slot
//! scripts.

use crate::common::admin::*;
use crate::common::cluster::RedisCluster;
use crate::common::*;

#[tokio::test]
async fn on_a_cluster_listing_show_replay_and_forget_work() {
    let cluster = RedisCluster::start(3, 0);
    let upstream = Upstream::start().await;
    let sc = builder_on(&upstream, &cluster.url()).start().await;

    let d = Delivery::fresh();
    assert_eq!(sc.send(&d).await.status, 200);
    assert!(sc.send(&d).await.replayed());

    // Deliveries at once, so one log write batch spans many slots.
    let more: Vec<Delivery> = (0..20).map(|_| Delivery::fresh()).collect();
    let mut sends = tokio::task::JoinSet::new();
    for m in more.clone() {
        let url = sc.url(PATH);
        let client = sc.client.clone();
        sends.spawn(async move { post(&client, &url, &m.headers(), m.body.clone()).await });
    }
    while let Some(a) = sends.join_next().await {
        assert_eq!(a.unwrap().unwrap().status, 200);
    }
    let list = api(&sc, "GET", "/admin/deliveries?limit=100", Some(TOKEN)).await;
    assert_eq!(list.status, 200, "{}", list.json);
    let listed: Vec<&str> = list.json["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["key"].as_str())
        .collect();
    assert_eq!(listed.len(), 21, "{listed:?}");
    for id in more.iter().map(|m| m.id.as_str()).chain([d.id.as_str()]) {
        assert!(listed.contains(&id), "{id} not listed: {listed:?}");
    }
    // The first delivery is the oldest, whatever its copy did.
    assert_eq!(listed.last(), Some(&d.id.as_str()));
    // One index, on the master of its route's slot.
    let index: Vec<(u16, String)> = cluster
        .live_masters()
        .into_iter()
        .flat_map(|port| {
            cluster
                .keys_on(port)
                .into_iter()
                .filter(|k| k.contains(":recent:"))
                .map(move |k| (port, k))
        })
        .collect();
    assert_eq!(index.len(), 1, "{index:?}");
    assert_eq!(cluster.master_of(&index[0].1), index[0].0);

    let show = api(&sc, "GET", &delivery_path(ROUTE, &d.id), Some(TOKEN)).await;
    assert_eq!(show.status, 200, "{}", show.json);
    assert_eq!(show.json["duplicates"], 1);
    assert_eq!(show.json["outcome"], "forwarded");
    assert_eq!(show.json["replayable"], true);

    let r = api(
        &sc,
        "POST",
        &format!("{}/replay", delivery_path(ROUTE, &d.id)),
        Some(TOKEN),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.json);
    assert_eq!(r.json["recorded"], true);
    assert_eq!(upstream.count(), 22);

    let f = api(&sc, "DELETE", &delivery_path(ROUTE, &d.id), Some(TOKEN)).await;
    assert_eq!(f.status, 200, "{}", f.json);
    let list = api(&sc, "GET", "/admin/deliveries?limit=100", Some(TOKEN)).await;
    assert_eq!(
        list.json["deliveries"].as_array().unwrap().len(),
        20,
        "forgotten: unlisted"
    );
    assert!(!sc.send(&d).await.replayed());
    assert_eq!(upstream.count(), 23);
}
