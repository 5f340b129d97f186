//! A `redis://` URL that names a server running in cluster mode (a one-shard managed
//! Redis behind one endpoint). Such a server refuses a transaction whose keys span two
//! slots (`CROSSSLOT`), so once it is seen in cluster mode (by `/readyz`, or by the log
//! writer's first `CROSSSLOT`), the delivery log is written without transactions, as on
//! a Redis Cluster (log_writer.rs). A server whose cluster has more than one shard
//! cannot work behind `redis://` (keys of the other shards answer `MOVED`), so it is
//! reported not ready with a message naming `redis+cluster://`.

use std::sync::atomic::Ordering;

use super::connection::Connection;
use super::{RedisStore, bytes_of};
use crate::store::StoreError;

impl RedisStore {
    /// Records that the one server runs in cluster mode (logged once).
    pub(super) fn note_cluster_mode(&self, how: &str) {
        if !self.cluster_mode.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                detected_by = how,
                "store.url names a Redis server in cluster mode: the delivery log is written without transactions, as on a Redis Cluster"
            );
        }
    }

    /// For `/readyz` on a `redis://` URL: notes cluster mode, and fails when the
    /// server's cluster cannot serve every slot from this one endpoint.
    pub(super) async fn check_cluster_mode(&self) -> Result<(), StoreError> {
        if !matches!(self.conn, Connection::Standalone(_)) {
            return Ok(());
        }
        let mut conn = self.conn.clone();
        let info: redis::Value = self
            .bounded(redis::cmd("INFO").arg("cluster").query_async(&mut conn))
            .await?;
        let info = String::from_utf8_lossy(bytes_of(&info).unwrap_or_default()).into_owned();
        if field(&info, "cluster_enabled") != Some("1") {
            return Ok(());
        }
        self.note_cluster_mode("/readyz");
        let cluster: redis::Value = self
            .bounded(redis::cmd("CLUSTER").arg("INFO").query_async(&mut conn))
            .await?;
        let cluster = String::from_utf8_lossy(bytes_of(&cluster).unwrap_or_default()).into_owned();
        let shards = field(&cluster, "cluster_size").and_then(|s| s.parse::<u32>().ok());
        if field(&cluster, "cluster_state") != Some("ok") {
            return Err(StoreError::Unavailable(
                "the Redis server of store.url is in cluster mode and its cluster is not ok".into(),
            ));
        }
        if shards != Some(1) {
            let msg = format!(
                "store.url (redis://) names one node of a Redis Cluster with {} shards: deliveries whose keys live on another shard fail; use redis+cluster://",
                shards.map_or_else(|| "several".to_string(), |n| n.to_string())
            );
            tracing::error!("{msg}");
            return Err(StoreError::Unavailable(msg));
        }
        Ok(())
    }
}

/// One `name:value` line of an `INFO`-style reply.
fn field<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    text.lines()
        .find_map(|l| l.trim().strip_prefix(name)?.strip_prefix(':'))
}
