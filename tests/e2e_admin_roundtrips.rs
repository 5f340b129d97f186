//! The delivery log adds no round trip (issue 8): with the admin API on and
//! `keep_payload = true`, a first delivery is still claim + complete, a copy one claim,
//! and a failed one claim + release — counted with `MONITOR`, as in e2e_roundtrips.rs
//! (whose `Monitor` is repeated here so that file stays untouched).

#[path = "common/admin.rs"]
mod admin;
mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;

/// A `MONITOR` connection read in the background (raw RESP: one `+line` per command).
struct Monitor {
    conn: TcpStream,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Monitor {
    fn start(redis: &RedisServer) -> Monitor {
        let mut conn = TcpStream::connect(("127.0.0.1", redis.port())).expect("connect to redis");
        conn.write_all(b"MONITOR\r\n").unwrap();
        let reader = conn.try_clone().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(reader).lines().map_while(Result::ok) {
                let line = line.strip_prefix('+').unwrap_or(&line).to_string();
                sink.lock().unwrap().push(line);
            }
        });
        Monitor { conn, lines }
    }

    /// Sends a marker through another connection and waits until MONITOR shows it:
    /// everything before it has been logged. Returns the client commands (not those
    /// run inside scripts) since the previous marker.
    async fn client_commands_until_marker(&self, redis: &RedisServer, marker: &str) -> Vec<String> {
        redis.cli(&["ECHO", marker]);
        let lines = self.lines.clone();
        let marker_q = format!("\"{marker}\"");
        wait_until(Duration::from_secs(10), "MONITOR shows the marker", || {
            lines.lock().unwrap().iter().any(|l| l.contains(&marker_q))
        })
        .await;
        let mut all = self.lines.lock().unwrap();
        let upto = all.iter().position(|l| l.contains(&marker_q)).unwrap();
        let taken: Vec<String> = all.drain(..=upto).collect();
        taken
            .into_iter()
            .filter(|l| !l.contains(" lua]") && !l.to_uppercase().contains("\"ECHO\"") && l != "OK")
            .map(|l| {
                // `1700000000.123456 [0 127.0.0.1:5555] "EVALSHA" "abc..." ...` → EVALSHA
                l.split("] ")
                    .nth(1)
                    .and_then(|c| c.split('"').nth(1))
                    .unwrap_or("?")
                    .to_uppercase()
            })
            .collect()
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        let _ = self.conn.shutdown(std::net::Shutdown::Both);
    }
}

#[tokio::test]
async fn the_log_and_a_kept_request_ride_in_the_same_scripts() {
    let redis = RedisServer::start_new();
    let upstream = Upstream::start().await;
    let sidecar = admin::builder(&upstream, &redis).start().await;
    // Warm up: each script is loaded once per Redis lifetime (NOSCRIPT → EVAL).
    assert_eq!(sidecar.send(&Delivery::fresh()).await.status, 200);
    upstream.push_modes(vec![Mode::Status(500)]);
    assert_eq!(sidecar.send(&Delivery::fresh()).await.status, 500);

    let monitor = Monitor::start(&redis);
    monitor.client_commands_until_marker(&redis, "m0").await;
    let d = Delivery::fresh();
    assert_eq!(sidecar.send(&d).await.status, 200);
    let first = monitor.client_commands_until_marker(&redis, "m1").await;
    assert_eq!(first, vec!["EVALSHA", "EVALSHA"], "claim + complete");
    assert!(sidecar.send(&d).await.replayed());
    let dup = monitor.client_commands_until_marker(&redis, "m2").await;
    assert_eq!(dup, vec!["EVALSHA"], "a copy is one claim");
    upstream.push_modes(vec![Mode::Status(500)]);
    assert_eq!(sidecar.send(&Delivery::fresh()).await.status, 500);
    let failed = monitor.client_commands_until_marker(&redis, "m3").await;
    assert_eq!(failed, vec!["EVALSHA", "EVALSHA"], "claim + release");

    // …and the log and the index were written by them.
    let list = admin::api(&sidecar, "GET", "/admin/deliveries", Some(admin::TOKEN)).await;
    assert_eq!(list.json["deliveries"].as_array().unwrap().len(), 4);
    let e = admin::api(
        &sidecar,
        "GET",
        &admin::delivery_path(ROUTE, &d.id),
        Some(admin::TOKEN),
    )
    .await;
    assert_eq!(e.json["duplicates"], 1);
    assert_eq!(e.json["replayable"], true);
}
