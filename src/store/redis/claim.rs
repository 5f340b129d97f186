//! Claims on Redis: the plain claim of a first delivery or a copy (one `SET … NX PX …
//! GET` on the claim record, no Lua: record.rs) and an operator's replay (replay.lua).
//!
//! Keys written before the claim record existed keep their state in the log hash's
//! `status` field (`completed` with `resp_*`, `queued`, `processing` under the old
//! claim's `…:lock`): left by an earlier version for up to `retention` after an
//! upgrade. The plain claim reads that field in the same round trip and honours it
//! (`earlier_layout`), so an upgrade forwards no completed delivery again.

use std::time::Duration;

use redis::Value;

use super::log_writer::{LogWrite, WriteKind, WriteTtls};
use super::record::{self, Found};
use super::{Call, Keys, RedisStore, bad_reply, bytes_of, int_of, ms};
use crate::providers::Fingerprint;
use crate::store::log::ClaimLog;
use crate::store::{Claim, DeliveryKey, Store, StoreError, StoredResponse, Token, unix_millis};

impl RedisStore {
    /// A claim this caller won, once enough replicas confirmed it. A claim that too
    /// few replicas confirmed is not safe to forward — a failover now could hand the
    /// key to a copy — so it is given up (with the unlogged release; the provider's
    /// retry is then forwarded) and reported as a store error (503), the release run
    /// as `give_up` says. An operator's replay of a completed key given up so goes back
    /// to `completed` with its old answer: release.lua decides that from the record,
    /// not the caller.
    async fn won(
        &self,
        key: &DeliveryKey,
        token: Token,
        acked: Option<i64>,
        give_up: GiveUp,
    ) -> Result<Claim, StoreError> {
        if let Some(e) = self.under_replicated("claim", acked) {
            let store = self.clone();
            let key = key.clone();
            let release = async move {
                if let Err(e) = store.release(&key, token, None).await {
                    tracing::warn!(key = key.logged(), error = %e, "releasing an under-replicated claim failed; the key frees at lease expiry");
                }
            };
            match give_up {
                GiveUp::Background => drop(tokio::spawn(release)),
                GiveUp::Awaited => release.await,
            }
            return Err(e);
        }
        Ok(Claim::Claimed(token))
    }

    /// A plain claim (a first delivery or a copy): `SET record p|token|fp NX PX lease
    /// GET`, one command and one round trip (with the log hash's `status`, for keys of
    /// the earlier layout); the old record, if any, says what to answer (record.rs).
    /// Only the rare answers take a second round trip: "in flight" (the lease's
    /// remaining time), a replayed key (whether the replay still holds its lock) and a
    /// key of the earlier layout. The log's part is queued for the log writer.
    pub(super) async fn plain_claim(
        &self,
        key: &DeliveryKey,
        fp: &Fingerprint,
        log: Option<ClaimLog<'_>>,
    ) -> Result<Claim, StoreError> {
        let keys = self.keys(key);
        let token = Token::random();
        let token_hex = token.to_hex();
        let fp_hex = hex::encode(fp);
        let mut set = redis::cmd("SET");
        set.arg(&keys.record)
            .arg(record::processing(&token_hex, &fp_hex))
            .arg("NX")
            .arg("PX")
            .arg(ms(self.lifetimes.of(&key.route).lease))
            .arg("GET");
        let mut status = redis::cmd("HGET");
        status.arg(&keys.log).arg("status");
        let (replies, acked) = self.query_all(&[set, status], &keys.record, true).await?;
        let found = match replies.first() {
            Some(Value::Nil) => Found::Absent,
            v => v
                .and_then(bytes_of)
                .and_then(record::parse)
                .ok_or_else(|| bad_reply("claim"))?,
        };
        if found.differs(fp_hex.as_bytes()) {
            return Ok(Claim::Mismatch);
        }
        let claim = match found {
            Found::Absent => {
                let earlier = replies.get(1).and_then(bytes_of).unwrap_or_default();
                if !earlier.is_empty() && earlier != b"released" {
                    let answer = self.earlier_layout(key, &keys, &fp_hex, earlier).await?;
                    if let Some(claim) = answer {
                        if matches!(claim, Claim::Completed(_) | Claim::Queued) {
                            self.log_write(keys.log, key, log, WriteKind::Copy).await;
                        }
                        return Ok(claim);
                    }
                }
                let claim = self.won(key, token, acked, GiveUp::Background).await?;
                let kept = log.and_then(|l| l.kept.cloned());
                let kind = WriteKind::Claimed { fp_hex, kept };
                self.log_write(keys.log, key, log, kind).await;
                return Ok(claim);
            }
            // A retried claim (the first reply lost: a dropped connection, a cluster
            // client resending after a failover) finds its own token: it owns the key.
            Found::Processing { token: t, .. } if t == token_hex.as_bytes() => {
                return self.won(key, token, acked, GiveUp::Background).await;
            }
            Found::Processing { .. } => return self.in_flight(&keys.record).await,
            Found::Queued { .. } => Claim::Queued,
            Found::Completed { response, .. } => {
                let raw = replies.first().and_then(bytes_of);
                self.confirm_completed(&keys.record, raw).await?;
                Claim::Completed(response)
            }
            Found::Replaying { response, .. } => {
                // One read says both whether the replay holds the key and for how long.
                let remaining = self.pttl(&keys.lock).await?;
                if remaining > 0 {
                    return Ok(in_flight(remaining));
                }
                let raw = replies.first().and_then(bytes_of);
                self.confirm_completed(&keys.record, raw).await?;
                Claim::Completed(response)
            }
        };
        self.log_write(keys.log, key, log, WriteKind::Copy).await;
        Ok(claim)
    }

    /// "In flight", with the remaining lease of the key that holds it.
    async fn in_flight(&self, holder: &str) -> Result<Claim, StoreError> {
        Ok(in_flight(self.pttl(holder).await?))
    }

    async fn pttl(&self, key: &str) -> Result<i64, StoreError> {
        let mut conn = self.conn.clone();
        self.bounded(redis::cmd("PTTL").arg(key).query_async(&mut conn))
            .await
    }

    /// Queues this claim's log write (the recent index only for a logged claim).
    async fn log_write(
        &self,
        hash: String,
        key: &DeliveryKey,
        log: Option<ClaimLog<'_>>,
        kind: WriteKind,
    ) {
        let index = log.map(|_| self.index_key(&key.route));
        let ttls = WriteTtls::of(self.lifetimes.of(&key.route));
        let (key, now) = (key.key.clone(), unix_millis());
        let write = LogWrite {
            ttls,
            hash,
            index,
            key,
            now,
            kind,
        };
        self.log_writer.write(write).await;
    }

    /// This call just took a free record (`p|token|fp`, so no one else can change it
    /// until it lapses) of a key whose log hash says `status` in the earlier layout.
    /// A completed key gets its record (`c`, for the hash's remaining lifetime) and its
    /// answer; a queued one `q`; one an earlier sidecar holds (its `…:lock` alive) is
    /// given back and answered "in flight". `None`: the earlier state does not hold the
    /// key (released, lapsed): the claim stands.
    async fn earlier_layout(
        &self,
        key: &DeliveryKey,
        keys: &Keys,
        fp_hex: &str,
        status: &[u8],
    ) -> Result<Option<Claim>, StoreError> {
        let mut pipe = redis::pipe();
        pipe.cmd("HMGET")
            .arg(&keys.log)
            .arg(&["fp", "resp_status", "resp_headers", "resp_body", "restore"])
            .cmd("PTTL")
            .arg(&keys.log)
            .cmd("PTTL")
            .arg(&keys.lock);
        let mut conn = self.conn.clone();
        type Old = (Vec<Option<Vec<u8>>>, i64, i64);
        let (f, hash_ttl, lock_ttl): Old = self.bounded(pipe.query_async(&mut conn)).await?;
        let field = |i: usize| f.get(i).cloned().flatten();
        let old_fp = field(0).unwrap_or_default();
        let answer = field(1)
            .and_then(|s| String::from_utf8(s).ok()?.parse::<u16>().ok())
            .map(|status| StoredResponse {
                status,
                headers: field(2).unwrap_or_default().into(),
                body: field(3).unwrap_or_default().into(),
            });
        let lapsed_replay = status == b"processing" && field(4).as_deref() == Some(b"1");
        let held = lock_ttl > 0 || status == b"completed" || status == b"queued" || lapsed_replay;
        let mut write = redis::cmd("SET");
        write.arg(&keys.record);
        let claim = if held && !old_fp.is_empty() && old_fp != fp_hex.as_bytes() {
            write = redis::cmd("DEL");
            write.arg(&keys.record);
            Claim::Mismatch
        } else if lock_ttl > 0 {
            // An earlier sidecar's claim (or replay) holds the key: this one gives its
            // record back.
            write = redis::cmd("DEL");
            write.arg(&keys.record);
            in_flight(lock_ttl)
        } else if let Some(a) = answer.filter(|_| status == b"completed" || lapsed_replay) {
            let mut rec = b"c|".to_vec();
            rec.extend(&old_fp);
            rec.extend(record::completed_tail(&a));
            write.arg(rec).arg("XX").arg("PX").arg(hash_ttl.max(1));
            Claim::Completed(a)
        } else if status == b"queued" {
            let mut rec = b"q|".to_vec();
            rec.extend(if old_fp.is_empty() {
                fp_hex.as_bytes()
            } else {
                &old_fp
            });
            let keep = hash_ttl.max(ms(self.lifetimes.of(&key.route).retention) as i64);
            write.arg(rec).arg("XX").arg("PX").arg(keep);
            Claim::Queued
        } else {
            return Ok(None);
        };
        let mut conn = self.conn.clone();
        let _: Value = self.bounded(write.query_async(&mut conn)).await?;
        Ok(Some(claim))
    }

    /// An operator's replay: the forced claim, a script (replay.lua).
    pub(super) async fn replay_claim(
        &self,
        key: &DeliveryKey,
        fp: &Fingerprint,
        log: ClaimLog<'_>,
    ) -> Result<Claim, StoreError> {
        let keys = self.keys(key);
        let token = Token::random();
        let mut call = Call::new(&self.scripts.replay, &[&keys.record, &keys.lock, &keys.log])
            .arg(token.to_hex())
            .arg(ms(self.lifetimes.of(&key.route).lease))
            .arg(hex::encode(fp))
            .arg(unix_millis())
            .arg(ms(self.lifetimes.of(&key.route).retention));
        call = self.claim_log_args(call, log);
        let (reply, acked) = self.eval(&call, true).await?;
        if let Value::Array(items) = &reply
            && items.first().and_then(bytes_of) == Some(b"claimed")
        {
            // Awaited: `idemgate deliveries replay` ends its runtime with the command,
            // and a release in the background would die with it, leaving the key
            // locked until the lease ends.
            return self.won(key, token, acked, GiveUp::Awaited).await;
        }
        parse_claim(reply)
    }
}

/// How a claim too few replicas confirmed is given up: a delivery's answer (503) does
/// not wait for it; an operator's replay does.
#[derive(Clone, Copy)]
enum GiveUp {
    Background,
    Awaited,
}

/// "In flight" for `pttl` ms more (a negative PTTL, gone meanwhile: none).
fn in_flight(pttl: i64) -> Claim {
    Claim::InFlight {
        remaining: Duration::from_millis(pttl.max(0) as u64),
    }
}

/// A replay script's reply other than `claimed`.
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
        b"in_flight" => Ok(in_flight(items.get(1).and_then(int_of).unwrap_or(0))),
        b"mismatch" => Ok(Claim::Mismatch),
        b"queued" => Ok(Claim::Queued),
        _ => Err(bad_reply("claim")),
    }
}
