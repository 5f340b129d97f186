//! The async queue on Redis Streams: durable, shared by every replica.
//!
//! Keys (agreed with the operator API): the queue `{prefix}:queue:{<route>}` and the
//! dead letters `{prefix}:dlq:{<route>}` share the route's hash tag, so moving an entry
//! between them is one atomic script even on a cluster; the consumer group is
//! `idemgate`. Acknowledged entries are deleted, so the queue's length is the number of
//! unacknowledged entries, which `max_queue` bounds (nothing is ever trimmed).
//!
//! The key transitions (`queued`, the worker's per-attempt claim) are scripts on the
//! delivery's own keys, next to claim/complete/release.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use redis::Value;

use super::{Call, ScriptDef, bytes_of, int_of, ms};
use crate::store::queue::{
    Batch, DeadLetter, DeadLetterPage, GROUP, Lock, QueueBackend, QueueEntry, QueueStats, Read,
    StoreFuture,
};
use crate::store::{
    DeliveryKey, RedisStore, Store, StoreError, StoredResponse, Token, unix_millis,
};

pub(super) struct Scripts {
    add: ScriptDef,
    mark: ScriptDef,
    lock: ScriptDef,
    unlock: ScriptDef,
    done: ScriptDef,
    dead: ScriptDef,
    redrive: ScriptDef,
    keep: ScriptDef,
    read: ScriptDef,
    pub(super) admit: ScriptDef,
    pub(super) hold: ScriptDef,
    pub(super) state: ScriptDef,
}

/// See the module documentation.
#[derive(Clone)]
pub struct RedisQueue {
    store: RedisStore,
    scripts: Arc<Scripts>,
    /// Per route, where the last `XAUTOCLAIM` stopped: each takeover continues there, so
    /// entries behind many live ones are reached (it examines at most COUNT×10 per call).
    cursors: Arc<Mutex<HashMap<String, String>>>,
}

impl RedisQueue {
    /// The queue on `store`'s Redis (same connection, prefix and lifetimes).
    pub fn new(store: RedisStore) -> RedisQueue {
        RedisQueue {
            store,
            scripts: Arc::new(Scripts {
                add: ScriptDef::new(include_str!("scripts/queue_add.lua")),
                mark: ScriptDef::new(include_str!("scripts/queue_mark.lua")),
                lock: ScriptDef::new(include_str!("scripts/deliver_lock.lua")),
                unlock: ScriptDef::new(include_str!("scripts/deliver_unlock.lua")),
                done: ScriptDef::new(include_str!("scripts/queue_done.lua")),
                dead: ScriptDef::new(include_str!("scripts/queue_dead.lua")),
                redrive: ScriptDef::new(include_str!("scripts/queue_redrive.lua")),
                keep: ScriptDef::new(include_str!("scripts/queue_keep.lua")),
                read: ScriptDef::new(include_str!("scripts/queue_read.lua")),
                admit: ScriptDef::new(include_str!("scripts/pacing_admit.lua")),
                hold: ScriptDef::new(include_str!("scripts/pacing_hold.lua")),
                state: ScriptDef::new(include_str!("scripts/pacing_state.lua")),
            }),
            cursors: Arc::default(),
        }
    }

    /// `{prefix}:queue:{<route>}`
    pub fn queue_key(&self, route: &str) -> String {
        format!("{}:queue:{{{route}}}", self.store.prefix())
    }

    /// `{prefix}:dlq:{<route>}`
    pub fn dlq_key(&self, route: &str) -> String {
        format!("{}:dlq:{{{route}}}", self.store.prefix())
    }

    pub(super) fn prefix(&self) -> &str {
        self.store.prefix()
    }

    pub(super) fn scripts(&self) -> &Scripts {
        &self.scripts
    }

    pub(super) async fn query<T: redis::FromRedisValue>(
        &self,
        cmd: redis::Cmd,
    ) -> Result<T, StoreError> {
        let mut conn = self.store.connection();
        self.store.bounded(cmd.query_async(&mut conn)).await
    }

    pub(super) async fn script(&self, call: Call<'_>) -> Result<Value, StoreError> {
        Ok(self.store.eval(&call, false).await?.0)
    }

    /// The order list of `entry`, when its route orders deliveries.
    fn order_list(&self, route: &str, order: Option<&str>) -> Option<String> {
        order.map(|o| self.order_key(route, o))
    }
}

fn text(v: &Value) -> Option<String> {
    bytes_of(v).map(|b| String::from_utf8_lossy(b).into_owned())
}

fn items(v: &Value) -> &[Value] {
    match v {
        Value::Array(a) => a,
        _ => &[],
    }
}

/// `[id, [field, value, ...]]` → the ID and the fields.
fn parse_entry(v: &Value) -> Option<(String, HashMap<String, Bytes>)> {
    let parts = items(v);
    let id = text(parts.first()?)?;
    let mut fields = HashMap::new();
    match parts.get(1)? {
        Value::Array(kv) => {
            for pair in kv.chunks(2) {
                if let [k, v] = pair {
                    fields.insert(text(k)?, Bytes::copy_from_slice(bytes_of(v)?));
                }
            }
        }
        Value::Map(kv) => {
            for (k, v) in kv {
                fields.insert(text(k)?, Bytes::copy_from_slice(bytes_of(v)?));
            }
        }
        _ => return None,
    }
    Some((id, fields))
}

fn parse_reads(entries: &[Value]) -> Vec<Read> {
    entries
        .iter()
        .filter_map(parse_entry)
        .map(|(id, fields)| {
            let entry = QueueEntry::from_fields(&fields);
            (id, entry)
        })
        .collect()
}

/// The entries of an `XREADGROUP` reply (RESP2 array or RESP3 map of streams).
fn parse_read_group(v: &Value) -> Vec<Read> {
    match v {
        Value::Array(streams) => streams
            .iter()
            .flat_map(|s| parse_reads(items(items(s).get(1).unwrap_or(&Value::Nil))))
            .collect(),
        Value::Map(streams) => streams
            .iter()
            .flat_map(|(_, entries)| parse_reads(items(entries)))
            .collect(),
        _ => Vec::new(),
    }
}

fn dead_letter_of(id: String, fields: &HashMap<String, Bytes>) -> Option<DeadLetter> {
    let num = |n: &str| {
        fields
            .get(n)
            .and_then(|b| std::str::from_utf8(b).ok())
            .and_then(|s| s.parse().ok())
            .unwrap_or(0)
    };
    Some(DeadLetter {
        entry: QueueEntry::from_fields(fields)?,
        attempts: num("attempts"),
        last_error: fields
            .get("last_error")
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .unwrap_or_default(),
        dead_at: num("dead_at"),
        id,
    })
}

/// The Unix milliseconds part of a stream ID.
fn id_millis(id: &str) -> Option<u64> {
    id.split('-').next()?.parse().ok()
}

impl QueueBackend for RedisQueue {
    fn enqueue<'a>(
        &'a self,
        route: &'a str,
        entry: &'a QueueEntry,
        max_queue: u64,
    ) -> StoreFuture<'a, Option<String>> {
        Box::pin(async move {
            let queue = self.queue_key(route);
            let order = self.order_list(route, entry.order.as_deref());
            let mut call =
                Call::with_last_key(&self.scripts.add, &[&queue], order.as_deref()).arg(max_queue);
            for (name, value) in entry.fields() {
                call = call.arg(name).arg(value.as_ref());
            }
            // Replicated like a completion: with min_replicas_ack, an acknowledged
            // delivery is on that many replicas before the provider hears of it.
            let (reply, acked) = self.store.eval(&call, true).await?;
            let Some(id) = text(&reply) else {
                return Ok(None);
            };
            if let Some(e) = self.store.under_replicated("queue append", acked) {
                return Err(e);
            }
            Ok(Some(id))
        })
    }

    fn mark_queued<'a>(
        &'a self,
        key: &'a DeliveryKey,
        token: Token,
        keep_for: Duration,
    ) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let k = self.store.keys(key);
            let call = Call::new(&self.scripts.mark, &[&k.record, &k.log])
                .arg(token.to_hex())
                .arg(unix_millis())
                .arg(ms(self
                    .store
                    .lifetimes()
                    .of(&key.route)
                    .retention
                    .max(keep_for)));
            Ok(int_of(&self.script(call).await?) == Some(1))
        })
    }

    fn release<'a>(&'a self, key: &'a DeliveryKey, token: Token) -> StoreFuture<'a, bool> {
        Box::pin(self.store.release(key, token, None))
    }

    fn ensure_group<'a>(&'a self, route: &'a str) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let mut cmd = redis::cmd("XGROUP");
            cmd.arg("CREATE")
                .arg(self.queue_key(route))
                .arg(GROUP)
                .arg("0")
                .arg("MKSTREAM");
            match self.query::<Value>(cmd).await {
                Ok(_) => Ok(()),
                Err(e) if e.to_string().contains("BUSYGROUP") => Ok(()),
                Err(e) => Err(e),
            }
        })
    }

    fn read_new<'a>(
        &'a self,
        route: &'a str,
        consumer: &'a str,
        count: usize,
    ) -> StoreFuture<'a, Vec<Read>> {
        Box::pin(async move {
            let mut cmd = redis::cmd("XREADGROUP");
            cmd.arg("GROUP")
                .arg(GROUP)
                .arg(consumer)
                .arg("COUNT")
                .arg(count)
                .arg("STREAMS")
                .arg(self.queue_key(route))
                .arg(">");
            let reply: Value = self.query(cmd).await?;
            Ok(parse_read_group(&reply))
        })
    }

    fn take_over<'a>(
        &'a self,
        route: &'a str,
        consumer: &'a str,
        min_idle: Duration,
        count: usize,
    ) -> StoreFuture<'a, Vec<Read>> {
        Box::pin(async move {
            let start = self
                .cursors
                .lock()
                .ok()
                .and_then(|c| c.get(route).cloned())
                .unwrap_or_else(|| "0-0".into());
            let mut cmd = redis::cmd("XAUTOCLAIM");
            cmd.arg(self.queue_key(route))
                .arg(GROUP)
                .arg(consumer)
                .arg(ms(min_idle))
                .arg(start)
                .arg("COUNT")
                .arg(count);
            let reply: Value = self.query(cmd).await?;
            // The next start ("0-0" once the scan went round the whole pending list).
            if let (Some(next), Ok(mut c)) =
                (items(&reply).first().and_then(text), self.cursors.lock())
            {
                c.insert(route.to_string(), next);
            }
            Ok(parse_reads(items(
                items(&reply).get(1).unwrap_or(&Value::Nil),
            )))
        })
    }

    fn keep<'a>(
        &'a self,
        route: &'a str,
        consumer: &'a str,
        ids: &'a [String],
    ) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let queue = self.queue_key(route);
            let mut call = Call::new(&self.scripts.keep, &[&queue])
                .arg(GROUP)
                .arg(consumer);
            for id in ids {
                call = call.arg(id.as_str());
            }
            self.script(call).await.map(|_| ())
        })
    }

    fn lock<'a>(
        &'a self,
        key: &'a DeliveryKey,
        id: &'a str,
        keep_for: Duration,
    ) -> StoreFuture<'a, Lock> {
        Box::pin(async move {
            let k = self.store.keys(key);
            let token = Token::random();
            let lifetimes = self.store.lifetimes().of(&key.route);
            let call = Call::new(&self.scripts.lock, &[&k.record, &k.lock, &k.log])
                .arg(token.to_hex())
                .arg(ms(lifetimes.lease))
                .arg(unix_millis())
                .arg(ms(lifetimes.retention.max(keep_for)))
                .arg(id);
            let reply = self.script(call).await?;
            let parts = items(&reply);
            match parts.first().and_then(bytes_of) {
                Some(b"completed") => Ok(Lock::Completed),
                Some(b"busy") => Ok(Lock::Busy),
                Some(b"claimed") => Ok(Lock::Claimed {
                    token,
                    attempt: parts.get(1).and_then(int_of).unwrap_or(1).max(1) as u64,
                }),
                _ => Err(StoreError::Unavailable(
                    "unexpected reply to the delivery lock".into(),
                )),
            }
        })
    }

    fn renew<'a>(&'a self, key: &'a DeliveryKey, token: Token) -> StoreFuture<'a, bool> {
        Box::pin(self.store.renew(key, token))
    }

    fn unlock<'a>(
        &'a self,
        key: &'a DeliveryKey,
        token: Token,
        refund: bool,
    ) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let k = self.store.keys(key);
            let call = Call::new(&self.scripts.unlock, &[&k.lock, &k.log])
                .arg(token.to_hex())
                .arg(u8::from(refund));
            Ok(int_of(&self.script(call).await?) == Some(1))
        })
    }

    fn complete<'a>(
        &'a self,
        key: &'a DeliveryKey,
        token: Token,
        response: &'a StoredResponse,
        keep_for: Duration,
    ) -> StoreFuture<'a, bool> {
        let keep = self
            .store
            .lifetimes()
            .of(&key.route)
            .retention
            .max(keep_for);
        // A worker holds the lock, never the record: straight to the full script.
        let holder = super::Holder::Lock { keep };
        Box::pin(self.store.complete_for(key, token, response, None, holder))
    }

    fn done<'a>(
        &'a self,
        route: &'a str,
        id: &'a str,
        order: Option<&'a str>,
    ) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let queue = self.queue_key(route);
            let order = self.order_list(route, order);
            let call = Call::with_last_key(&self.scripts.done, &[&queue], order.as_deref())
                .arg(GROUP)
                .arg(id);
            self.script(call).await.map(|_| ())
        })
    }

    fn read_batch<'a>(
        &'a self,
        route: &'a str,
        consumer: &'a str,
        done: &'a [String],
        count: usize,
    ) -> StoreFuture<'a, Batch> {
        Box::pin(async move {
            let (queue, pace) = (self.queue_key(route), self.pace_key(route));
            let mut call = Call::new(&self.scripts.read, &[&queue, &pace])
                .arg(GROUP)
                .arg(consumer)
                .arg(count);
            for id in done {
                call = call.arg(id.as_str());
            }
            let reply = self.script(call).await?;
            let parts = items(&reply);
            Ok(Batch {
                open: parts.first().and_then(int_of) == Some(1),
                reads: parse_read_group(parts.get(1).unwrap_or(&Value::Nil)),
            })
        })
    }

    fn dead_letter<'a>(
        &'a self,
        route: &'a str,
        id: &'a str,
        entry: &'a QueueEntry,
        attempts: u64,
        last_error: &'a str,
    ) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let (queue, dlq) = (self.queue_key(route), self.dlq_key(route));
            let order = self.order_list(route, entry.order.as_deref());
            let mut call =
                Call::with_last_key(&self.scripts.dead, &[&queue, &dlq], order.as_deref())
                    .arg(GROUP)
                    .arg(id);
            for (name, value) in entry.fields() {
                call = call.arg(name).arg(value.as_ref());
            }
            let call = call
                .arg("attempts")
                .arg(attempts)
                .arg("last_error")
                .arg(last_error)
                .arg("dead_at")
                .arg(unix_millis());
            self.script(call).await.map(|_| ())
        })
    }

    fn stats<'a>(&'a self, route: &'a str) -> StoreFuture<'a, QueueStats> {
        Box::pin(async move {
            let (queue, dlq) = (self.queue_key(route), self.dlq_key(route));
            let mut xlen = redis::cmd("XLEN");
            xlen.arg(&queue);
            let depth: u64 = self.query(xlen).await?;
            let mut pending = redis::cmd("XPENDING");
            pending.arg(&queue).arg(GROUP);
            let pending = self
                .query::<Value>(pending)
                .await
                .ok()
                .and_then(|v| items(&v).first().and_then(int_of))
                .unwrap_or(0)
                .max(0) as u64;
            let mut first = redis::cmd("XRANGE");
            first.arg(&queue).arg("-").arg("+").arg("COUNT").arg(1);
            let first: Value = self.query(first).await?;
            let oldest_ms = items(&first)
                .first()
                .and_then(|e| items(e).first())
                .and_then(text)
                .and_then(|id| id_millis(&id));
            let mut dlen = redis::cmd("XLEN");
            dlen.arg(&dlq);
            let dead_letters: u64 = self.query(dlen).await?;
            Ok(QueueStats {
                depth,
                pending,
                oldest_ms,
                dead_letters,
            })
        })
    }

    fn list_dead_letters<'a>(
        &'a self,
        route: &'a str,
        count: usize,
        cursor: Option<&'a str>,
    ) -> StoreFuture<'a, DeadLetterPage> {
        Box::pin(async move {
            let mut cmd = redis::cmd("XRANGE");
            let start = cursor
                .map(|c| format!("({c}"))
                .unwrap_or_else(|| "-".into());
            cmd.arg(self.dlq_key(route))
                .arg(start)
                .arg("+")
                .arg("COUNT")
                .arg(count.max(1));
            let reply: Value = self.query(cmd).await?;
            let items: Vec<DeadLetter> = items(&reply)
                .iter()
                .filter_map(parse_entry)
                .filter_map(|(id, fields)| dead_letter_of(id, &fields))
                .collect();
            let next = (items.len() >= count.max(1))
                .then(|| items.last().map(|d| d.id.clone()))
                .flatten();
            Ok(DeadLetterPage { items, next })
        })
    }

    fn redrive<'a>(&'a self, route: &'a str, dead_letter_id: &'a str) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let (queue, dlq) = (self.queue_key(route), self.dlq_key(route));
            // An ordered dead letter is moved by a second call naming its order list
            // (see the script); each call moves all or nothing.
            let mut order: Option<String> = None;
            for _ in 0..2 {
                let list = self.order_list(route, order.as_deref());
                let mut call =
                    Call::with_last_key(&self.scripts.redrive, &[&queue, &dlq], list.as_deref())
                        .arg(dead_letter_id)
                        .arg(unix_millis());
                if let Some(o) = &order {
                    call = call.arg(o.as_str());
                }
                let reply = self.script(call).await?;
                let parts = items(&reply);
                match parts.first().and_then(bytes_of) {
                    Some(b"moved") => return Ok(true),
                    Some(b"order") => order = parts.get(1).and_then(text),
                    _ => return Ok(false),
                }
            }
            Err(StoreError::Unavailable(
                "redrive: the dead letter's order value did not settle".into(),
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_resp2_and_resp3_stream_replies() {
        let entry = |id: &str| {
            Value::Array(vec![
                Value::BulkString(id.as_bytes().to_vec()),
                Value::Array(
                    [
                        ("key", "k"),
                        ("method", "POST"),
                        ("path", "/p"),
                        ("headers", ""),
                        ("body", "b"),
                        ("received_at", "1"),
                    ]
                    .iter()
                    .flat_map(|(k, v)| {
                        [
                            Value::BulkString(k.as_bytes().to_vec()),
                            Value::BulkString(v.as_bytes().to_vec()),
                        ]
                    })
                    .collect(),
                ),
            ])
        };
        let resp2 = Value::Array(vec![Value::Array(vec![
            Value::BulkString(b"q".to_vec()),
            Value::Array(vec![entry("1-0"), entry("2-0")]),
        ])]);
        let reads = parse_read_group(&resp2);
        assert_eq!(reads.len(), 2);
        assert_eq!(reads[1].0, "2-0");
        assert_eq!(reads[0].1.as_ref().map(|e| e.key.as_str()), Some("k"));
        let resp3 = Value::Map(vec![(
            Value::BulkString(b"q".to_vec()),
            Value::Array(vec![entry("3-0")]),
        )]);
        assert_eq!(parse_read_group(&resp3)[0].0, "3-0");
        assert!(parse_read_group(&Value::Nil).is_empty());
        assert_eq!(id_millis("1700000000123-4"), Some(1_700_000_000_123));
    }
}
