//! A connection to the master that Redis Sentinel names, which follows failovers.
//!
//! The `redis` crate's `SentinelClient` resolves the master once per connect (asking
//! the Sentinels, then checking that the node itself says it is master); nothing in the
//! crate re-resolves when that master goes away. This type keeps one multiplexed
//! connection to the current master and drops it the moment it proves stale:
//!
//! - `READONLY` (the node was demoted to a replica: Sentinel failed over and the old
//!   master rejoined): the command did not run, so it is sent again to the master the
//!   Sentinels name now. A demoted master is never written to.
//! - an I/O error or a dropped connection (the master died): the command's outcome is
//!   unknown, so it is reported as an error (the caller answers 503); the next command
//!   asks the Sentinels again.
//! - no master reachable yet (failover in progress): the lookup is retried with a short
//!   backoff until the caller's store timeout gives up.
//!
//! A master demoted by a planned failover (`SENTINEL FAILOVER`) keeps accepting writes
//! until Sentinel converts it to a replica, seconds after the promotion, and every
//! write it took meanwhile is lost when it resyncs. So the connection also follows the
//! Sentinels' announcements (their pub/sub, see [`watch`]): from the moment a failover
//! of this master starts (`+try-failover`, before the replica is promoted) no command
//! is sent, until the replica Sentinel selected says it is master, or `+switch-master`
//! names the new master (or the failover is aborted, or [`PAUSE_BOUND`] passes); then
//! commands go to that node. Every connection checks the node's role (`ROLE`), so a
//! node that no longer says master is never used.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{
    AsyncConnectionConfig, Cmd, ConnectionAddr, ErrorKind, Pipeline, RedisError, RedisFuture,
    RedisResult, ServerErrorKind, Value,
};

use crate::config::topology::SentinelTarget;

/// See the module documentation.
#[derive(Clone)]
pub struct SentinelConnection {
    inner: Arc<Inner>,
}

struct Inner {
    /// Serialises lookups: one task asks the Sentinels while the others wait for it.
    client: tokio::sync::Mutex<SentinelClient>,
    /// The current master connection and its generation (to drop only a stale one).
    current: Mutex<Option<(u64, MultiplexedConnection)>>,
    next_generation: std::sync::atomic::AtomicU64,
    config: AsyncConnectionConfig,
    db: i64,
    /// Until when commands are held back: a failover of the master is under way.
    paused_until: Mutex<Option<Instant>>,
    /// The Sentinels to watch and the master's name; the watchers start with the first
    /// command (inside the runtime).
    watch: watch::Watch,
    watching: std::sync::atomic::AtomicBool,
    /// Whether refused credentials were logged since the last successful lookup (one
    /// warning, not one per command).
    refusal_logged: std::sync::atomic::AtomicBool,
}

/// The most lookups one command makes before it reports the error (the store timeout
/// usually ends it first).
const MAX_ATTEMPTS: u32 = 20;

/// The longest a failover announcement holds commands back without the `+switch-master`
/// or abort that ends it (then the master is looked up again).
pub const PAUSE_BOUND: Duration = Duration::from_secs(10);

/// Follows the Sentinels' announcements.
mod watch;

impl SentinelConnection {
    pub fn new(target: &SentinelTarget, timeout: Duration) -> RedisResult<SentinelConnection> {
        let sentinels = target
            .sentinels
            .iter()
            .map(|(h, p)| ConnectionAddr::Tcp(h.clone(), *p));
        let mut b =
            SentinelClientBuilder::new(sentinels, &target.master, SentinelServerType::Master)?
                .set_client_to_redis_db(target.db)
                .set_client_to_redis_tcp_settings(super::tcp::tcp_settings())
                .set_client_to_sentinel_tcp_settings(super::tcp::tcp_settings());
        if let Some(u) = &target.username {
            b = b.set_client_to_redis_username(u);
        }
        if let Some(p) = &target.password {
            b = b.set_client_to_redis_password(p);
        }
        if let Some(u) = &target.sentinel_username {
            b = b.set_client_to_sentinel_username(u);
        }
        if let Some(p) = &target.sentinel_password {
            b = b.set_client_to_sentinel_password(p);
        }
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout));
        Ok(SentinelConnection {
            inner: Arc::new(Inner {
                client: tokio::sync::Mutex::new(b.build()?),
                current: Mutex::new(None),
                next_generation: std::sync::atomic::AtomicU64::new(0),
                config,
                db: target.db,
                paused_until: Mutex::new(None),
                watch: watch::Watch::new(target),
                watching: std::sync::atomic::AtomicBool::new(false),
                refusal_logged: std::sync::atomic::AtomicBool::new(false),
            }),
        })
    }

    fn cached(&self) -> Option<(u64, MultiplexedConnection)> {
        self.inner
            .current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The connection to the current master, asking the Sentinels when there is none.
    async fn master(&self) -> RedisResult<(u64, MultiplexedConnection)> {
        if let Some(c) = self.cached() {
            return Ok(c);
        }
        let mut client = self.inner.client.lock().await;
        if let Some(c) = self.cached() {
            return Ok(c); // another task looked it up while this one waited
        }
        // The master `+switch-master` announced, if any: a Sentinel that has not heard
        // of the switch yet (they learn it from each other within seconds) would
        // still name the old master, which says master until it is converted.
        let announced = self.inner.watch.announced();
        let direct = match announced {
            Some((host, port)) => match watch::connect_master(&self.inner, &host, port).await {
                Ok(c) => Some(c),
                Err(e) => {
                    tracing::warn!(host = %host, port, error = %e, "the announced master is not usable; asking Sentinel");
                    self.inner.watch.announce(None);
                    None
                }
            },
            None => None,
        };
        let conn = match direct {
            Some(c) => c,
            None => {
                client
                    .get_async_connection_with_config(&self.inner.config)
                    .await?
            }
        };
        let generation = self
            .inner
            .next_generation
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        *self.inner.current.lock().unwrap_or_else(|e| e.into_inner()) =
            Some((generation, conn.clone()));
        self.inner
            .refusal_logged
            .store(false, std::sync::atomic::Ordering::Relaxed);
        tracing::info!(generation, "connected to the master Sentinel names");
        Ok((generation, conn))
    }

    /// Forgets the connection of `generation` (if it is still the current one).
    fn forget(&self, generation: u64, why: &RedisError) {
        let mut cur = self.inner.current.lock().unwrap_or_else(|e| e.into_inner());
        if cur.as_ref().is_some_and(|(g, _)| *g == generation) {
            *cur = None;
            tracing::warn!(generation, error = %why, "dropping the master connection; asking Sentinel again");
        }
    }

    /// Drops the current master connection, whatever its generation.
    fn forget_current(&self, why: &str) {
        if self
            .inner
            .current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .is_some()
        {
            tracing::warn!(
                reason = why,
                "dropping the master connection; asking Sentinel again"
            );
        }
    }

    /// Holds commands back from now until `until` (`None`: resume now).
    fn pause(&self, until: Option<Instant>) {
        *self
            .inner
            .paused_until
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = until;
    }

    /// Until when commands are held back, if they are.
    fn paused_until(&self) -> Option<Instant> {
        *self
            .inner
            .paused_until
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Waits while a failover is under way (the caller's store timeout bounds it).
    async fn wait_unpaused(&self) {
        loop {
            match self.paused_until() {
                None => return,
                Some(t) if Instant::now() >= t => {
                    self.pause(None);
                    self.forget_current("a failover was announced and never finished");
                    return;
                }
                Some(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    }

    /// Runs `op` on the current master, following the Sentinels as described above.
    async fn run<T, F, Fut>(&self, op: F) -> RedisResult<T>
    where
        F: Fn(MultiplexedConnection) -> Fut,
        Fut: std::future::Future<Output = RedisResult<T>>,
        T: Demotion,
    {
        if !self
            .inner
            .watching
            .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            watch::start(self);
        }
        let mut pause = Duration::from_millis(10);
        let mut attempt = 0;
        loop {
            attempt += 1;
            self.wait_unpaused().await;
            let (generation, conn) = match self.master().await {
                Ok(c) => c,
                Err(e) if attempt < MAX_ATTEMPTS => {
                    // No master yet (failover in progress, Sentinels unreachable), or
                    // a configuration error that only the log can tell the operator.
                    self.inner.log_refusal(&e, "looking up the master");
                    tracing::debug!(error = %e, "no master from Sentinel yet");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(200));
                    continue;
                }
                Err(e) => return Err(e),
            };
            match op(conn).await {
                Ok(v) if v.demoted() && attempt < MAX_ATTEMPTS => {
                    self.forget(generation, &readonly());
                }
                Ok(v) => return Ok(v),
                Err(e) if is_readonly(&e) && attempt < MAX_ATTEMPTS => {
                    // Demoted: the command did not run; send it to the new master.
                    self.forget(generation, &e);
                }
                Err(e) => {
                    if e.is_unrecoverable_error() || e.is_timeout() || e.is_connection_refusal() {
                        // The master went away mid-command: the outcome is unknown, so
                        // it is the caller's error; the next command looks up again.
                        self.forget(generation, &e);
                    }
                    return Err(e);
                }
            }
        }
    }
}

impl Inner {
    /// Warns (once until the next successful lookup) when `e` is a Sentinel or Redis
    /// server refusing the credentials or a command: a configuration error, which
    /// would otherwise show only as store timeouts.
    fn log_refusal(&self, e: &RedisError, doing: &str) {
        if refused(e)
            && !self
                .refusal_logged
                .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            tracing::warn!(
                error = %e,
                doing,
                "Sentinel or Redis refused idemgate's credentials: the user and password in \
                 store.url are the Redis servers'; Sentinels with a password of their own \
                 need it as ?sentinel_password=… (and sentinel_username=…); see \
                 docs/scaling.md"
            );
        }
    }
}

/// Whether `e` is a server refusing the credentials or a command (`NOAUTH`,
/// `WRONGPASS`, `NOPERM`, `AUTH` without a password configured).
fn refused(e: &RedisError) -> bool {
    let text = e.to_string();
    e.kind() == ErrorKind::AuthenticationFailed
        || e.kind() == ErrorKind::Server(ServerErrorKind::NoPerm)
        || [
            "NOAUTH",
            "WRONGPASS",
            "NOPERM",
            "without any password configured",
        ]
        .iter()
        .any(|w| text.contains(w))
}

fn readonly() -> RedisError {
    RedisError::from((
        ErrorKind::Server(ServerErrorKind::ReadOnly),
        "the master was demoted to a replica",
    ))
}

fn is_readonly(e: &RedisError) -> bool {
    e.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly) || e.to_string().contains("READONLY")
}

/// Whether a reply says the node is no longer master (a script that tried to write on
/// a replica answers `READONLY`, possibly inside a pipeline's replies).
trait Demotion {
    fn demoted(&self) -> bool;
}

impl Demotion for Value {
    fn demoted(&self) -> bool {
        match self {
            Value::ServerError(e) => {
                e.kind() == Some(ServerErrorKind::ReadOnly)
                    || e.details().is_some_and(|d| d.contains("READONLY"))
                    || e.code().contains("READONLY")
            }
            _ => false,
        }
    }
}

impl Demotion for Vec<Value> {
    fn demoted(&self) -> bool {
        self.iter().any(Demotion::demoted)
    }
}

impl ConnectionLike for SentinelConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(self.run(move |mut c| async move { c.req_packed_command(cmd).await }))
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(
            self.run(
                move |mut c| async move { c.req_packed_commands(pipeline, offset, count).await },
            ),
        )
    }

    fn get_db(&self) -> i64 {
        self.inner.db
    }
}
