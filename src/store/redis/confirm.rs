//! Copies answered from a completed record, with `min_replicas_ack`: the answer is a
//! 2xx only once the record the copy read is held by the required replicas.
//!
//! A record read from the master is not yet one its replicas hold: the completion that
//! wrote it may have reached none of them (its own sidecar then answered 503), and a
//! failover would hand the key to a replica that lacks it, so the provider's next copy
//! would be forwarded again after this one was answered 2xx. `WAIT` counts only the
//! writes of the connection it runs on, so the copy writes the record again, unchanged
//! (confirm.lua, a compare-and-set of the value it read), pipelined with `WAIT N
//! timeout` on the master of the key's slot: one more round trip, on copies of
//! completed keys only, and only with `min_replicas_ack` (a store without it answers
//! copies as before). Too few replicas, or a record that changed meanwhile: a store
//! error, answered 503 + `Retry-After` like an unconfirmed completion.

use std::sync::LazyLock;

use super::{Call, RedisStore, ScriptDef, int_of};
use crate::store::StoreError;

/// confirm.lua, with its SHA.
static CONFIRM: LazyLock<ScriptDef> =
    LazyLock::new(|| ScriptDef::new(include_str!("scripts/confirm.lua")));

impl RedisStore {
    /// Confirms that the required replicas hold `raw`, the completed record a copy read
    /// at `record` (see the module documentation); without `min_replicas_ack`, nothing
    /// to do and no round trip.
    pub(super) async fn confirm_completed(
        &self,
        record: &str,
        raw: Option<&[u8]>,
    ) -> Result<(), StoreError> {
        if self.acks.is_none() {
            return Ok(());
        }
        let raw = raw.ok_or_else(|| super::bad_reply("claim"))?;
        let call = Call::new(&CONFIRM, &[record]).arg(raw);
        let (reply, acked) = self.eval(&call, true).await?;
        if int_of(&reply) != Some(1) {
            return Err(StoreError::Unavailable(
                "the completed record changed while a copy confirmed it".to_string(),
            ));
        }
        match self.under_replicated("a copy's completed record", acked) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}
