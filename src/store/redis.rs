//! The Redis store: `SET NX PX` with an owner token as the atomic claim, plus a status
//! hash, in Lua scripts loaded once and run by SHA (one round trip each).
//!
//! Keys: `{prefix}:{<route>:<key>}` (the status hash) and `…:lock` (the claim). The
//! braces are a Redis Cluster hash tag, so both keys of a delivery share one slot.
//!
//! One multiplexed, pipelined connection (`ConnectionManager`) serves every delivery
//! and reconnects by itself after Redis restarts; scripts are re-loaded on `NOSCRIPT`.
//! A connection pool would add a `PING` per checkout and nothing else here.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Script, Value};

use super::{
    Claim, DeliveryKey, Lifetimes, Record, Status, Store, StoreError, StoredResponse, Token,
    unix_millis,
};
use crate::providers::Fingerprint;

struct Scripts {
    claim: Script,
    complete: Script,
    release: Script,
    renew: Script,
}

/// See the module documentation.
#[derive(Clone)]
pub struct RedisStore {
    conn: ConnectionManager,
    prefix: std::sync::Arc<str>,
    lifetimes: Lifetimes,
    timeout: Duration,
    scripts: std::sync::Arc<Scripts>,
}

impl RedisStore {
    /// Prepares the store without waiting for Redis: the sidecar starts (and reports
    /// not ready) while Redis is down, and connects when it comes.
    pub fn new(
        url: &str,
        prefix: &str,
        lifetimes: Lifetimes,
        timeout: Duration,
    ) -> Result<Self, StoreError> {
        let client =
            redis::Client::open(url).map_err(|e| StoreError::Unavailable(e.to_string()))?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout))
            .set_number_of_retries(2)
            .set_min_delay(Duration::from_millis(20))
            .set_max_delay(Duration::from_millis(250));
        let conn = ConnectionManager::new_lazy_with_config(client, config)
            .map_err(|e| StoreError::Unavailable(e.to_string()))?;
        Ok(RedisStore {
            conn,
            prefix: prefix.into(),
            lifetimes,
            timeout,
            scripts: std::sync::Arc::new(Scripts {
                claim: Script::new(include_str!("claim.lua")),
                complete: Script::new(include_str!("complete.lua")),
                release: Script::new(include_str!("release.lua")),
                renew: Script::new(include_str!("renew.lua")),
            }),
        })
    }

    /// The status hash's key; the lock is this plus `:lock`.
    pub fn state_key(&self, key: &DeliveryKey) -> String {
        let mut s = String::with_capacity(self.prefix.len() + key.route.len() + key.key.len() + 4);
        s.push_str(&self.prefix);
        s.push_str(":{");
        s.push_str(&key.route);
        s.push(':');
        s.push_str(&key.key);
        s.push('}');
        s
    }

    fn keys(&self, key: &DeliveryKey) -> (String, String) {
        let state = self.state_key(key);
        let lock = format!("{state}:lock");
        (state, lock)
    }

    /// Runs one store operation within the store timeout.
    async fn bounded<T>(
        &self,
        op: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.timeout, op).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) if e.is_timeout() => Err(StoreError::Timeout),
            Ok(Err(e)) => Err(StoreError::Unavailable(e.to_string())),
            Err(_) => Err(StoreError::Timeout),
        }
    }
}

fn ms(d: Duration) -> u64 {
    d.as_millis().max(1) as u64
}

fn bytes_of(v: &Value) -> Option<&[u8]> {
    match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

fn int_of(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        other => std::str::from_utf8(bytes_of(other)?).ok()?.parse().ok(),
    }
}

fn bad_reply(what: &str) -> StoreError {
    StoreError::Unavailable(format!("unexpected reply to {what}"))
}

fn parse_claim(reply: Value) -> Result<Claim, StoreError> {
    let Value::Array(items) = reply else {
        return Err(bad_reply("claim"));
    };
    let tag = items
        .first()
        .and_then(bytes_of)
        .ok_or_else(|| bad_reply("claim"))?;
    match tag {
        b"claimed" => Err(bad_reply("claim")), // the caller fills in its own token
        b"completed" => {
            let status = items
                .get(1)
                .and_then(int_of)
                .and_then(|s| u16::try_from(s).ok())
                .ok_or_else(|| bad_reply("claim"))?;
            let headers = items.get(2).and_then(bytes_of).unwrap_or_default();
            let body = items.get(3).and_then(bytes_of).unwrap_or_default();
            Ok(Claim::Completed(StoredResponse {
                status,
                headers: bytes::Bytes::copy_from_slice(headers),
                body: bytes::Bytes::copy_from_slice(body),
            }))
        }
        b"in_flight" => {
            let pttl = items.get(1).and_then(int_of).unwrap_or(0).max(0) as u64;
            Ok(Claim::InFlight {
                remaining: Duration::from_millis(pttl),
            })
        }
        b"mismatch" => Ok(Claim::Mismatch),
        _ => Err(bad_reply("claim")),
    }
}

impl Store for RedisStore {
    async fn claim(&self, key: &DeliveryKey, fp: &Fingerprint) -> Result<Claim, StoreError> {
        let (state, lock) = self.keys(key);
        let token = Token::random();
        let mut conn = self.conn.clone();
        let mut inv = self.scripts.claim.prepare_invoke();
        inv.key(&state)
            .key(&lock)
            .arg(token.to_hex())
            .arg(ms(self.lifetimes.lease))
            .arg(hex::encode(fp))
            .arg(unix_millis())
            .arg(ms(self.lifetimes.retention));
        let reply: Value = self.bounded(inv.invoke_async(&mut conn)).await?;
        if let Value::Array(items) = &reply
            && items.first().and_then(bytes_of) == Some(b"claimed")
        {
            return Ok(Claim::Claimed(token));
        }
        parse_claim(reply)
    }

    async fn renew(&self, key: &DeliveryKey, token: Token) -> Result<bool, StoreError> {
        let (_, lock) = self.keys(key);
        let mut conn = self.conn.clone();
        let mut inv = self.scripts.renew.prepare_invoke();
        inv.key(&lock)
            .arg(token.to_hex())
            .arg(ms(self.lifetimes.lease));
        let n: i64 = self.bounded(inv.invoke_async(&mut conn)).await?;
        Ok(n == 1)
    }

    async fn complete(
        &self,
        key: &DeliveryKey,
        token: Token,
        response: &StoredResponse,
    ) -> Result<bool, StoreError> {
        let (state, lock) = self.keys(key);
        let mut conn = self.conn.clone();
        let mut inv = self.scripts.complete.prepare_invoke();
        inv.key(&state)
            .key(&lock)
            .arg(token.to_hex())
            .arg(response.status)
            .arg(response.headers.as_ref())
            .arg(response.body.as_ref())
            .arg(unix_millis())
            .arg(ms(self.lifetimes.retention));
        let n: i64 = self.bounded(inv.invoke_async(&mut conn)).await?;
        Ok(n == 1)
    }

    async fn release(&self, key: &DeliveryKey, token: Token) -> Result<bool, StoreError> {
        let (state, lock) = self.keys(key);
        let mut conn = self.conn.clone();
        let mut inv = self.scripts.release.prepare_invoke();
        inv.key(&state)
            .key(&lock)
            .arg(token.to_hex())
            .arg(unix_millis());
        let n: i64 = self.bounded(inv.invoke_async(&mut conn)).await?;
        Ok(n == 1)
    }

    async fn inspect(&self, key: &DeliveryKey) -> Result<Option<Record>, StoreError> {
        let (state, lock) = self.keys(key);
        let mut conn = self.conn.clone();
        let mut pipe = redis::pipe();
        pipe.cmd("HMGET")
            .arg(&state)
            .arg(&[
                "status",
                "fp",
                "attempts",
                "duplicates",
                "first_seen",
                "last_seen",
                "resp_status",
            ])
            .cmd("EXISTS")
            .arg(&lock);
        let (fields, locked): (Vec<Option<String>>, i64) =
            self.bounded(pipe.query_async(&mut conn)).await?;
        let get = |i: usize| fields.get(i).cloned().flatten();
        let Some(status) = get(0).as_deref().and_then(Status::parse) else {
            return Ok(None);
        };
        let num = |i: usize| get(i).and_then(|s| s.parse::<u64>().ok()).unwrap_or(0);
        Ok(Some(Record {
            status,
            fingerprint: get(1).unwrap_or_default(),
            attempts: num(2),
            duplicates: num(3),
            first_seen: num(4),
            last_seen: num(5),
            response_status: get(6).and_then(|s| s.parse().ok()),
            claimed: locked == 1,
        }))
    }

    async fn ping(&self) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        let pong: String = self
            .bounded(redis::cmd("PING").query_async(&mut conn))
            .await?;
        if pong == "PONG" {
            Ok(())
        } else {
            Err(bad_reply("PING"))
        }
    }
}
