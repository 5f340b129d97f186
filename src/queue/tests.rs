//! Unit tests of the queue's policy helpers (backoff, acknowledgement, entry fields).

use super::*;

fn cfg() -> AsyncRoute {
    AsyncRoute {
        ack_status: 202,
        ack_body: "success".into(),
        max_attempts: 5,
        max_age: Duration::from_secs(3600),
        backoff: Duration::from_secs(1),
        max_backoff: Duration::from_secs(10),
        throttle: crate::config::Throttle {
            max_concurrency: None,
            rate: None,
            burst: 1.0,
            retry_after_cap: Duration::from_secs(3600),
        },
        order_key: None,
    }
}

#[test]
fn backoff_doubles_with_jitter_and_caps() {
    let c = cfg();
    assert_eq!(backoff_delay(&c, 1, 0.0), Duration::from_millis(500));
    assert_eq!(backoff_delay(&c, 1, 1.0), Duration::from_secs(1));
    assert_eq!(backoff_delay(&c, 3, 1.0), Duration::from_secs(4));
    assert_eq!(backoff_delay(&c, 3, 0.0), Duration::from_secs(2));
    assert_eq!(backoff_delay(&c, 10, 1.0), Duration::from_secs(10));
    assert_eq!(backoff_delay(&c, 1000, 0.5), Duration::from_millis(7500));
}

#[test]
fn the_ack_is_the_routes_status_and_body() {
    let a = ack_answer(&cfg());
    assert_eq!(a.status(), StatusCode::ACCEPTED);
    let mut c = cfg();
    c.ack_body.clear();
    c.ack_status = 200;
    let a = ack_answer(&c);
    assert_eq!(a.status(), StatusCode::OK);
    assert!(a.headers().get(header::CONTENT_TYPE).is_none());
}

#[test]
fn entries_round_trip_through_their_fields() {
    let e = QueueEntry {
        key: "evt_1".into(),
        method: "POST".into(),
        path: "/webhooks/wh?a=1".into(),
        headers: Bytes::from_static(b"host: x\r\nidempotency-key: wh:evt_1\r\n"),
        body: Bytes::from_static(b"\xff\x00body"),
        received_at: 1_700_000_000_123,
        order: None,
    };
    let map: HashMap<String, Bytes> = e
        .fields()
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    assert_eq!(QueueEntry::from_fields(&map), Some(e));
    let mut partial = map.clone();
    partial.remove("body");
    assert_eq!(QueueEntry::from_fields(&partial), None);
}

#[test]
fn consumer_names_prefer_the_pod_name() {
    let name = consumer_name();
    assert!(!name.is_empty());
}
