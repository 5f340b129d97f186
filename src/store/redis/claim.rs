//! Claims on Redis: the plain claim of a first delivery or a copy (one `SET … NX PX …
//! GET` on the claim record, no Lua: record.rs) and an operator's replay (replay.lua).
//!
//! The claim's log fields are in the record it writes (`P`: the claim's time in its
//! token, one attempt); a logged claim queues only its member of the recent index
//! (and the kept request), a copy its count (log_writer.rs).
//!
//! Keys of the layout before the claim record (state in the log hash's `status`) are
//! no longer read: an upgrade from a version before the claim record passes through
//! the previous release and waits `retention` (docs/reliability.md, "Upgrades").

use std::time::Duration;

use redis::Value;

use super::log_writer::{LogWrite, WriteKind, WriteTtls};
use super::record::{self, Found};
use super::{Call, RedisStore, bad_reply, bytes_of, int_of, ms};
use crate::providers::Fingerprint;
use crate::store::log::ClaimLog;
use crate::store::{Claim, DeliveryKey, Store, StoreError, Token, unix_millis};

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

    /// A plain claim (a first delivery or a copy): `SET record P|token|fp NX PX lease
    /// GET`, one command and one round trip; the old record, if any, says what to
    /// answer (record.rs). Only the rare answers take a second round trip: "in flight"
    /// (the lease's remaining time) and a replayed key (whether the replay still holds
    /// its lock). The log's part is queued for the log writer.
    pub(super) async fn plain_claim(
        &self,
        key: &DeliveryKey,
        fp: &Fingerprint,
        log: Option<ClaimLog<'_>>,
    ) -> Result<Claim, StoreError> {
        let record_key = self.record_key(key);
        let now = unix_millis();
        let token = record::claim_token(now);
        let token_hex = record::token_hex(token);
        let fp_hex = record::fp_hex(fp);
        let mut set = redis::cmd("SET");
        set.arg(&record_key)
            .arg(&record::processing(&token_hex, &fp_hex)[..])
            .arg("NX")
            .arg("PX")
            .arg(ms(self.lifetimes.of(&key.route).lease))
            .arg("GET");
        let (reply, acked) = self.query_one(&set, &record_key, true).await?;
        let found = match &reply {
            Value::Nil => Found::Absent,
            v => bytes_of(v)
                .and_then(record::parse)
                .ok_or_else(|| bad_reply("claim"))?,
        };
        if found.differs(&fp_hex) {
            return Ok(Claim::Mismatch);
        }
        let claim = match found {
            Found::Absent => {
                let claim = self.won(key, token, acked, GiveUp::Background).await?;
                if let Some(log) = log {
                    let kept = log.kept.map(|k| Box::new((hex::encode(fp), k.clone())));
                    self.log_write(key, now, WriteKind::Claimed(kept)).await;
                }
                return Ok(claim);
            }
            // A retried claim (the first reply lost: a dropped connection, a cluster
            // client resending after a failover) finds its own token: it owns the key.
            Found::Processing { token: t, .. } if t == token_hex => {
                return self.won(key, token, acked, GiveUp::Background).await;
            }
            Found::Processing { .. } => return self.in_flight(&record_key).await,
            Found::Queued { .. } => Claim::Queued,
            Found::Completed { response, .. } => {
                self.confirm_completed(&record_key, bytes_of(&reply))
                    .await?;
                Claim::Completed(response)
            }
            Found::Replaying { response, .. } => {
                // One read says both whether the replay holds the key and for how long.
                let remaining = self.pttl(&self.keys(key).lock).await?;
                if remaining > 0 {
                    return Ok(in_flight(remaining));
                }
                self.confirm_completed(&record_key, bytes_of(&reply))
                    .await?;
                Claim::Completed(response)
            }
        };
        self.log_write(key, now, WriteKind::Copy).await;
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

    /// Queues this claim's log write.
    async fn log_write(&self, key: &DeliveryKey, now: u64, kind: WriteKind) {
        let write = LogWrite {
            route: key.route.clone(),
            key: key.key.clone(),
            now,
            ttls: WriteTtls::of(self.lifetimes.of(&key.route)),
            kind,
        };
        self.log_writer.write(write).await;
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
