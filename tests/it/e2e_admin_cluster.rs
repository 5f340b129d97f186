//! The delivery log on a Redis Cluster. The recent index would be a second
//! slot, which a script may not touch, so on a cluster it is not written: listing
//! answers 501 and says why, while show, replay and forget (by key) work, and the
//! hot path keeps its single-slot scripts.

use crate::common::admin::*;
use crate::common::cluster::RedisCluster;
use crate::common::*;

#[tokio::test]
async fn on_a_cluster_show_replay_and_forget_work_and_listing_says_why_not() {
    let cluster = RedisCluster::start(3, 0);
    let upstream = Upstream::start().await;
    let sc = builder_on(&upstream, &cluster.url()).start().await;

    let d = Delivery::fresh();
    assert_eq!(sc.send(&d).await.status, 200);
    assert!(sc.send(&d).await.replayed());

    let list = api(&sc, "GET", "/admin/deliveries", Some(TOKEN)).await;
    assert_eq!(list.status, 501, "{}", list.json);
    assert_eq!(list.json["error"], "no_recent_index");
    // No index key anywhere in the cluster.
    for port in cluster.live_masters() {
        assert!(
            cluster
                .keys_on(port)
                .iter()
                .all(|k| !k.contains(":recent:")),
            "no recent index on a cluster"
        );
    }

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
    assert_eq!(upstream.count(), 2);

    let f = api(&sc, "DELETE", &delivery_path(ROUTE, &d.id), Some(TOKEN)).await;
    assert_eq!(f.status, 200, "{}", f.json);
    assert!(!sc.send(&d).await.replayed());
    assert_eq!(upstream.count(), 3);
}
