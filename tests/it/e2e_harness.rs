//! Self-checks of the test harness (no idemgate involved).
use crate::common::*;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn harness_redis_stop_start_same_port() {
    let mut r = RedisServer::start_new();
    let port = r.port();
    assert_eq!(r.cli(&["SET", "k", "v"]), "OK");
    assert_eq!(r.cli(&["GET", "k"]), "v");
    r.stop();
    assert!(!r.ping());
    r.start();
    assert_eq!(r.port(), port);
    assert!(r.ping());
    assert_eq!(r.cli(&["GET", "k"]), "", "no persistence");
    r.pause(300);
    let t = Instant::now();
    assert_eq!(r.cli(&["SET", "k", "v"]), "OK");
    assert!(
        t.elapsed() >= Duration::from_millis(200),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(r.keys(), vec!["k".to_string()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn harness_upstream_modes() {
    let up = Upstream::start().await;
    let c = http_client();
    let url = format!("{}/p/q?x=1&y=%20", up.url());
    let h = vec![
        ("host".to_string(), "hooks.example.com".to_string()),
        ("x-tenant".to_string(), "acme".to_string()),
        ("connection".to_string(), "keep-alive, x-hop".to_string()),
        ("x-hop".to_string(), "1".to_string()),
    ];
    let a = post(&c, &url, &h, vec![0xff, 0x00, 0xfe]).await.unwrap();
    assert_eq!(a.status, 200);
    assert_eq!(a.header("x-upstream").as_deref(), Some("yes"));
    assert_eq!(a.text(), r#"{"ok":true}"#);
    let r = up.last();
    assert_eq!(r.method, "POST");
    assert_eq!(r.path_and_query, "/p/q?x=1&y=%20");
    assert_eq!(r.header("host").as_deref(), Some("hooks.example.com"));
    assert_eq!(r.header("x-tenant").as_deref(), Some("acme"));
    assert_eq!(r.header("x-hop").as_deref(), Some("1"));
    assert_eq!(&r.body[..], &[0xff, 0x00, 0xfe]);
    up.set_mode(Mode::Status(503));
    let a = post(&c, &url, &[], vec![]).await.unwrap();
    assert_eq!(a.status, 503);
    up.push_modes(vec![Mode::Delayed(
        Duration::from_millis(300),
        Box::new(Mode::Status(500)),
    )]);
    let a = post(&c, &url, &[], vec![]).await.unwrap();
    assert_eq!(a.status, 500);
    assert!(a.elapsed >= Duration::from_millis(300));
    let a = post(&c, &url, &[], vec![]).await.unwrap();
    assert_eq!(a.status, 503);
    up.set_mode(Mode::Stall(Duration::from_millis(300)));
    let a = post(&c, &url, &[], vec![]).await.unwrap();
    assert_eq!(a.status, 200);
    assert!(a.elapsed >= Duration::from_millis(300));
    up.set_mode(Mode::Hang);
    let r = c
        .post(&url)
        .timeout(Duration::from_millis(300))
        .send()
        .await;
    assert!(r.is_err());
    up.wait_for_count(6, Duration::from_secs(1)).await;
    up.assert_count_stays(6, Duration::from_millis(100)).await;
    let free = Upstream::unused_addr();
    assert!(
        post(&c, &format!("http://{free}/"), &[], vec![])
            .await
            .is_err()
    );
    let up2 = Upstream::start_at(free).await;
    assert_eq!(
        post(&c, &format!("http://{free}/"), &[], vec![])
            .await
            .unwrap()
            .status,
        200
    );
    assert_eq!(up2.count(), 1);
}

#[test]
fn harness_signing_and_metrics_parse() {
    // Standard Webhooks reference vector
    let sig = sign_standard(
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        "msg_p5jXN8AQM9LWM0D4loKWxJek",
        1614265330,
        br#"{"test": 2432232314}"#,
    );
    assert_eq!(sig, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    let text = "# HELP x y\nidemgate_requests_total{outcome=\"forwarded\",route=\"wh\"} 3\nidemgate_in_flight 2\n";
    assert_eq!(
        metric_value(
            text,
            "idemgate_requests_total{route=\"wh\",outcome=\"forwarded\"}"
        ),
        Some(3.0)
    );
    assert_eq!(metric_value(text, "idemgate_in_flight"), Some(2.0));
    assert_eq!(
        metric_value(
            text,
            "idemgate_requests_total{route=\"wh\",outcome=\"replayed\"}"
        ),
        None
    );
}
