//! One connection type for every Redis deployment, so `RedisStore` runs the same
//! scripts over all of them: a standalone server (`ConnectionManager`), a Redis Cluster
//! (`cluster_async::ClusterConnection`, which follows MOVED/ASK and re-reads the slot
//! map after a failover), or a Sentinel-managed master (`SentinelConnection`, which asks
//! the Sentinels again whenever the master it writes to goes away or is demoted).
//!
//! All are cheap to clone (handles to one multiplexed connection) and are built without
//! waiting for Redis: the sidecar starts, reports not ready, and connects when Redis
//! comes.

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};

use super::sentinel::SentinelConnection;
use super::tcp::tcp_settings;
use crate::config::topology::Topology;

/// A handle to the store's Redis, whatever its deployment.
#[derive(Clone)]
pub enum Connection {
    Standalone(ConnectionManager),
    Cluster(ClusterConnection),
    Sentinel(SentinelConnection),
}

impl Connection {
    /// Prepares the connection; `timeout` bounds each connect and each response.
    pub fn new(topology: &Topology, timeout: Duration) -> RedisResult<Connection> {
        match topology {
            Topology::Standalone(url) => {
                let info = redis::IntoConnectionInfo::into_connection_info(url.as_str())?
                    .set_tcp_settings(tcp_settings());
                let client = redis::Client::open(info)?;
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(timeout))
                    .set_response_timeout(Some(timeout))
                    .set_number_of_retries(2)
                    .set_min_delay(Duration::from_millis(20))
                    .set_max_delay(Duration::from_millis(250));
                Ok(Connection::Standalone(
                    ConnectionManager::new_lazy_with_config(client, config)?,
                ))
            }
            Topology::Cluster { nodes } => {
                // Retries (MOVED/ASK, a node that went away, a failover in progress) run
                // inside the store timeout that `RedisStore::bounded` puts around each
                // operation; the client's own overall timeout matches it.
                let client = redis::cluster::ClusterClientBuilder::new(nodes.iter().cloned())
                    .connection_timeout(timeout)
                    .response_timeout(timeout)
                    .overall_response_timeout(Some(timeout))
                    .tcp_settings(tcp_settings())
                    .retries(8)
                    .min_retry_wait(10)
                    .max_retry_wait(200)
                    .build()?;
                let config = redis::cluster::ClusterConfig::new()
                    .set_connection_timeout(timeout)
                    .set_response_timeout(timeout);
                Ok(Connection::Cluster(
                    client.get_pending_async_connection_with_config(config),
                ))
            }
            Topology::Sentinel(target) => Ok(Connection::Sentinel(SentinelConnection::new(
                target, timeout,
            )?)),
        }
    }

    /// `PING` the deployment: every master of a cluster, the current master otherwise.
    pub async fn ping(&mut self) -> RedisResult<Value> {
        match self {
            Connection::Cluster(c) => {
                use redis::cluster_routing::{
                    MultipleNodeRoutingInfo, ResponsePolicy, RoutingInfo,
                };
                c.route_command(
                    redis::cmd("PING"),
                    RoutingInfo::MultiNode((
                        MultipleNodeRoutingInfo::AllMasters,
                        Some(ResponsePolicy::AllSucceeded),
                    )),
                )
                .await
            }
            other => redis::cmd("PING").query_async(other).await,
        }
    }
}

impl Connection {
    /// Runs `pipe` (a script and the `WAIT` that must confirm it) on the node that owns
    /// `key`. In a cluster the pipeline is routed explicitly to the master of `key`'s
    /// slot, so `WAIT` (a keyless command the crate would send to every master on its
    /// own) runs on the node that ran the script and counts that node's replicas.
    pub async fn pipeline_on_key_master(
        &mut self,
        pipe: &Pipeline,
        key: &str,
    ) -> RedisResult<Vec<Value>> {
        match self {
            Connection::Cluster(c) => {
                use redis::cluster_routing::{Route, SingleNodeRoutingInfo, SlotAddr};
                let route = Route::with_key(key.as_bytes(), SlotAddr::Master);
                c.route_pipeline(
                    pipe.clone(),
                    0,
                    pipe.len(),
                    SingleNodeRoutingInfo::SpecificNode(route),
                )
                .await
            }
            other => pipe.query_async(other).await,
        }
    }
}

/// Runs `groups`, each a pipeline of commands on one slot (no command ignored), in one
/// round trip where the deployment allows: one pipeline on a single server, one per
/// group at once on a Redis Cluster (the cluster client refuses a pipeline whose keys
/// span slots). The replies come back per group, in order; a group that failed on a
/// cluster is its error, the others stand.
pub async fn query_groups(
    conn: &Connection,
    groups: Vec<Pipeline>,
) -> Vec<RedisResult<Vec<Value>>> {
    match conn {
        Connection::Cluster(_) => {
            let mut set = tokio::task::JoinSet::new();
            for (i, pipe) in groups.into_iter().enumerate() {
                let mut c = conn.clone();
                set.spawn(async move { (i, pipe.query_async::<Vec<Value>>(&mut c).await) });
            }
            let mut out: Vec<Option<RedisResult<Vec<Value>>>> = Vec::new();
            out.resize_with(set.len(), || None);
            while let Some(done) = set.join_next().await {
                if let Ok((i, r)) = done {
                    out[i] = Some(r);
                }
            }
            out.into_iter()
                .map(|r| {
                    r.unwrap_or_else(|| {
                        Err((redis::ErrorKind::Io, "a pipeline's task ended early").into())
                    })
                })
                .collect()
        }
        _ => {
            let mut all = redis::pipe();
            let lens: Vec<usize> = groups.iter().map(Pipeline::len).collect();
            for g in &groups {
                for c in g.cmd_iter() {
                    all.add_command(c.clone());
                }
            }
            let mut c = conn.clone();
            match all.query_async::<Vec<Value>>(&mut c).await {
                Ok(replies) => {
                    let mut it = replies.into_iter();
                    lens.iter()
                        .map(|n| Ok(it.by_ref().take(*n).collect()))
                        .collect()
                }
                Err(e) => {
                    let text = e.to_string();
                    lens.iter()
                        .map(
                            |_| Err((redis::ErrorKind::Io, "pipeline failed", text.clone()).into()),
                        )
                        .collect()
                }
            }
        }
    }
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Standalone(c) => c.req_packed_command(cmd),
            Connection::Cluster(c) => c.req_packed_command(cmd),
            Connection::Sentinel(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Connection::Standalone(c) => c.req_packed_commands(pipeline, offset, count),
            Connection::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
            Connection::Sentinel(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Standalone(c) => c.get_db(),
            Connection::Cluster(c) => c.get_db(),
            Connection::Sentinel(c) => c.get_db(),
        }
    }
}
