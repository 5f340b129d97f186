//! `MONITOR` for counting the commands a client sent: commands run inside scripts are
//! marked `[... lua]` by Redis and are not round trips.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{RedisServer, wait_until};

/// A `MONITOR` connection read in the background (raw RESP: one `+line` per command).
pub struct Monitor {
    conn: TcpStream,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Monitor {
    pub fn start(redis: &RedisServer) -> Monitor {
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
    pub async fn client_commands_until_marker(
        &self,
        redis: &RedisServer,
        marker: &str,
    ) -> Vec<String> {
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

/// The commands the store's log writer sends (the recent index's members, copies'
/// counts, kept requests: one pipeline per batch, not awaited by the delivery;
/// `src/store/redis/log_writer.rs`).
pub const LOG_WRITES: [&str; 10] = [
    "MULTI",
    "EXEC",
    "HSET",
    "HSETNX",
    "HINCRBY",
    "HEXISTS",
    "PEXPIRE",
    "ZMSCORE",
    "ZADD",
    "ZREMRANGEBYRANK",
];

/// Splits commands into those a delivery waits for (its round trips) and the log
/// writer's.
pub fn path_and_log(cmds: Vec<String>) -> (Vec<String>, Vec<String>) {
    cmds.into_iter()
        .partition(|c| !LOG_WRITES.contains(&c.as_str()))
}

impl Drop for Monitor {
    fn drop(&mut self) {
        let _ = self.conn.shutdown(std::net::Shutdown::Both);
    }
}
