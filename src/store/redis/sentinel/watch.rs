//! The Sentinels' announcements about the master: one task per Sentinel subscribes to
//! its pub/sub (`PSUBSCRIBE *`) and tells the connection when a failover of the master
//! starts (hold commands back), ends (`+switch-master`: look the master up again) or is
//! aborted (resume). A task resubscribes after a lost connection (and then drops the
//! master connection, since an announcement may have been missed) and ends with the
//! store.

use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisConnectionInfo, Value};

use super::{Inner, PAUSE_BOUND, SentinelConnection};
use crate::config::topology::SentinelTarget;

/// What the watchers need from the URL, and the master the last `+switch-master` named.
pub(super) struct Watch {
    sentinels: Vec<(String, u16)>,
    master: String,
    username: Option<String>,
    password: Option<String>,
    /// The Redis servers' credentials and database, to connect to an announced master.
    redis: RedisConnectionInfo,
    announced: Mutex<Option<(String, u16)>>,
}

impl Watch {
    pub(super) fn new(target: &SentinelTarget) -> Watch {
        let mut redis = RedisConnectionInfo::default().set_db(target.db);
        if let Some(u) = &target.username {
            redis = redis.set_username(u);
        }
        if let Some(p) = &target.password {
            redis = redis.set_password(p);
        }
        Watch {
            sentinels: target.sentinels.clone(),
            master: target.master.clone(),
            username: target.sentinel_username.clone(),
            password: target.sentinel_password.clone(),
            redis,
            announced: Mutex::new(None),
        }
    }

    /// The master the last `+switch-master` named (until it proves unusable).
    pub(super) fn announced(&self) -> Option<(String, u16)> {
        self.announced
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub(super) fn announce(&self, master: Option<(String, u16)>) {
        *self.announced.lock().unwrap_or_else(|e| e.into_inner()) = master;
    }

    fn info(&self, host: &str, port: u16) -> redis::RedisResult<ConnectionInfo> {
        let mut redis = RedisConnectionInfo::default();
        if let Some(u) = &self.username {
            redis = redis.set_username(u);
        }
        if let Some(p) = &self.password {
            redis = redis.set_password(p);
        }
        Ok(ConnectionAddr::Tcp(host.to_string(), port)
            .into_connection_info()?
            .set_tcp_settings(crate::store::redis::tcp::tcp_settings())
            .set_redis_settings(redis))
    }
}

/// What an announcement means for the connection.
#[derive(Debug, PartialEq, Eq)]
enum Event {
    /// A failover of the master has started: the old master may be demoted any moment.
    Started,
    /// The replica at this address was chosen for promotion.
    Selected(String, u16),
    /// The Sentinels name a new master, at this address.
    Switched(Option<(String, u16)>),
    /// The failover was given up: the old master stays.
    Aborted,
}

/// The event of one announcement (`channel`, `payload`) about `master`, if any.
fn classify(master: &str, channel: &str, payload: &str) -> Option<Event> {
    let mut words = payload.split(' ');
    let about = match channel {
        "+switch-master" => words.next(),
        _ if payload.starts_with("master ") => words.nth(1),
        _ => payload
            .split_once(" @ ")
            .and_then(|(_, rest)| rest.split(' ').next()),
    };
    if about != Some(master) {
        return None;
    }
    match channel {
        "+try-failover"
        | "+elected-leader"
        | "+failover-state-select-slave"
        | "+failover-state-send-slaveof-noone" => Some(Event::Started),
        // `slave <ip:port> <ip> <port> @ <master> …`
        "+selected-slave" => {
            let f: Vec<&str> = payload.split(' ').collect();
            match (f.get(2), f.get(3).and_then(|p| p.parse::<u16>().ok())) {
                (Some(h), Some(p)) => Some(Event::Selected(h.to_string(), p)),
                _ => Some(Event::Started),
            }
        }
        "+switch-master" => {
            // `<name> <old-ip> <old-port> <new-ip> <new-port>`
            let f: Vec<&str> = payload.split(' ').collect();
            let new = match (f.get(3), f.get(4).and_then(|p| p.parse::<u16>().ok())) {
                (Some(h), Some(p)) => Some((h.to_string(), p)),
                _ => None,
            };
            Some(Event::Switched(new))
        }
        c if c.starts_with("-failover-abort") => Some(Event::Aborted),
        _ => None,
    }
}

/// Starts one watcher per Sentinel (called from inside the runtime, once).
pub(super) fn start(conn: &SentinelConnection) {
    for (host, port) in &conn.inner.watch.sentinels {
        let info = match conn.inner.watch.info(host, *port) {
            Ok(i) => i,
            Err(e) => {
                tracing::warn!(sentinel = %host, port, error = %e, "cannot watch this Sentinel's announcements");
                continue;
            }
        };
        tokio::spawn(watch_one(Arc::downgrade(&conn.inner), info));
    }
}

/// Applies `event` to the connection.
fn apply(inner: Arc<Inner>, event: Event) {
    let conn = SentinelConnection { inner };
    match event {
        Event::Started => {
            conn.pause(Some(Instant::now() + PAUSE_BOUND));
            conn.forget_current("Sentinel announced a failover of the master");
        }
        Event::Selected(host, port) => {
            conn.pause(Some(Instant::now() + PAUSE_BOUND));
            conn.forget_current("Sentinel announced a failover of the master");
            tokio::spawn(await_promotion(Arc::downgrade(&conn.inner), host, port));
        }
        Event::Switched(new) => {
            // The same switch is announced by every Sentinel in turn: reconnect once.
            if new.is_some() && conn.inner.watch.announced() == new {
                conn.pause(None);
                return;
            }
            conn.inner.watch.announce(new);
            conn.forget_current("Sentinel announced a new master");
            conn.pause(None);
        }
        Event::Aborted => conn.pause(None),
    }
}

async fn watch_one(inner: Weak<Inner>, info: ConnectionInfo) {
    let mut subscribed_before = false;
    loop {
        let Some(master) = inner.upgrade().map(|i| i.watch.master.clone()) else {
            return;
        };
        match subscribe(info.clone()).await {
            Ok(mut stream) => {
                if subscribed_before && let Some(i) = inner.upgrade() {
                    // Announcements may have been missed while unsubscribed.
                    SentinelConnection { inner: i }
                        .forget_current("resubscribed to Sentinel announcements");
                }
                subscribed_before = true;
                loop {
                    let next = std::future::poll_fn(|cx| {
                        futures_core::Stream::poll_next(Pin::new(&mut stream), cx)
                    });
                    let msg = match tokio::time::timeout(Duration::from_secs(1), next).await {
                        Ok(Some(m)) => m,
                        Ok(None) => break, // the Sentinel went away
                        Err(_) if inner.strong_count() == 0 => return,
                        Err(_) => continue,
                    };
                    let payload = String::from_utf8_lossy(msg.get_payload_bytes());
                    if let Some(event) = classify(&master, msg.get_channel_name(), &payload) {
                        let Some(i) = inner.upgrade() else { return };
                        tracing::info!(
                            channel = msg.get_channel_name(),
                            ?event,
                            "Sentinel announcement"
                        );
                        apply(i, event);
                    }
                }
            }
            Err(e) => {
                if let Some(i) = inner.upgrade() {
                    i.log_refusal(&e, "subscribing to a Sentinel's announcements");
                }
                tracing::debug!(error = %e, "cannot subscribe to a Sentinel's announcements");
            }
        }
        if inner.strong_count() == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Polls the replica chosen for promotion until it says master, then resumes on it
/// (`+switch-master` follows only after Sentinel's next look at it, up to a second
/// later); ends when the pause ends otherwise (switch announced, failover aborted, or
/// [`PAUSE_BOUND`]).
async fn await_promotion(inner: Weak<Inner>, host: String, port: u16) {
    loop {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let Some(inner) = inner.upgrade() else { return };
        let conn = SentinelConnection { inner };
        if conn.paused_until().is_none_or(|t| Instant::now() >= t) {
            return;
        }
        if connect_master(&conn.inner, &host, port).await.is_ok() {
            if conn.paused_until().is_some() {
                tracing::info!(host = %host, port, "the replica chosen by Sentinel was promoted; writing to it");
                conn.inner.watch.announce(Some((host, port)));
                conn.forget_current("the replica chosen by Sentinel was promoted");
                conn.pause(None);
            }
            return;
        }
    }
}

/// A connection to the announced master at `host:port`, if it says it is master.
pub(super) async fn connect_master(
    inner: &Inner,
    host: &str,
    port: u16,
) -> redis::RedisResult<MultiplexedConnection> {
    let info = ConnectionAddr::Tcp(host.to_string(), port)
        .into_connection_info()?
        .set_tcp_settings(crate::store::redis::tcp::tcp_settings())
        .set_redis_settings(inner.watch.redis.clone());
    let mut conn = redis::Client::open(info)?
        .get_multiplexed_async_connection_with_config(&inner.config)
        .await?;
    let role: Value = redis::cmd("ROLE").query_async(&mut conn).await?;
    let is_master = match &role {
        Value::Array(items) => {
            items.first().and_then(crate::store::redis::bytes_of) == Some(b"master")
        }
        _ => false,
    };
    if is_master {
        Ok(conn)
    } else {
        Err(redis::RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly),
            "the announced master says it is not master",
        )))
    }
}

async fn subscribe(info: ConnectionInfo) -> redis::RedisResult<redis::aio::PubSubStream> {
    let client = redis::Client::open(info)?;
    let mut pubsub = tokio::time::timeout(Duration::from_secs(5), client.get_async_pubsub())
        .await
        .map_err(|_| redis::RedisError::from((redis::ErrorKind::Io, "connect timed out")))??;
    pubsub.psubscribe("*").await?;
    Ok(pubsub.into_on_message())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn announcements_about_this_master_are_classified() {
        let m = "mymaster";
        assert_eq!(
            classify(m, "+try-failover", "master mymaster 127.0.0.1 6379"),
            Some(Event::Started)
        );
        assert_eq!(
            classify(
                m,
                "+selected-slave",
                "slave 127.0.0.1:6380 127.0.0.1 6380 @ mymaster 127.0.0.1 6379"
            ),
            Some(Event::Selected("127.0.0.1".to_string(), 6380))
        );
        assert_eq!(
            classify(
                m,
                "+switch-master",
                "mymaster 127.0.0.1 6379 127.0.0.1 6380"
            ),
            Some(Event::Switched(Some(("127.0.0.1".to_string(), 6380))))
        );
        assert_eq!(
            classify(
                m,
                "-failover-abort-no-good-slave",
                "master mymaster 127.0.0.1 6379"
            ),
            Some(Event::Aborted)
        );
        assert_eq!(
            classify(m, "+try-failover", "master other 127.0.0.1 1"),
            None
        );
        assert_eq!(
            classify(m, "+sdown", "master mymaster 127.0.0.1 6379"),
            None
        );
    }
}
