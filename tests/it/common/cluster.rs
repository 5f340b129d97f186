//! Redis Cluster and Sentinel deployments for tests, built from real `redis-server`
//! processes on free 127.0.0.1 ports and killed on drop.
//!
//! - [`RedisCluster`]: N masters with R replicas each (`redis-cli --cluster create`), a
//!   short `cluster-node-timeout` so that a killed master's replica takes over in a
//!   few seconds.
//! - [`SentinelSet`]: a master, one replica and three Sentinels (quorum 2) watching it
//!   as `mymaster`; with [`SentinelAuth`], password-protected Redis nodes and Sentinels.
//!
//! Every wait polls with a deadline.

use std::fs::File;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use super::free_port;

/// How long a cluster node may be unreachable before it counts as failed.
pub const NODE_TIMEOUT_MS: u64 = 1000;

/// The Sentinels' name for the master.
pub const MASTER_NAME: &str = "mymaster";

/// One `redis-server` process (a cluster node, a replica or a Sentinel).
pub struct Node {
    pub port: u16,
    child: Option<Child>,
    dir: TempDir,
    args: Vec<String>,
    /// The password `requirepass` asks of clients (the harness's own commands send it).
    password: Option<String>,
}

impl Node {
    fn new(args: Vec<String>) -> Node {
        Node {
            port: free_port(),
            child: None,
            dir: tempfile::tempdir().expect("tempdir"),
            args,
            password: None,
        }
    }

    /// A standalone `redis-server` (no persistence), started.
    #[allow(
        dead_code,
        reason = "used by examples/claim_latency.rs, not by the tests"
    )]
    pub fn standalone() -> Node {
        let mut n = Node::new(
            ["--save", "", "--appendonly", "no"]
                .iter()
                .map(|s| s.to_string())
                .collect(),
        );
        n.start();
        n
    }

    /// One `redis-server` in cluster mode owning every slot (a one-shard cluster, as a
    /// managed Redis exposes behind one endpoint), started and `cluster_state:ok`.
    pub fn single_shard_cluster() -> Node {
        let mut n = Node::new(
            [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--save",
                "",
                "--appendonly",
                "no",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect(),
        );
        n.start();
        assert_eq!(n.cli(&["CLUSTER", "ADDSLOTSRANGE", "0", "16383"]), "OK");
        poll(
            Duration::from_secs(10),
            "the one-shard cluster to be ok",
            || info_field(&n.cli(&["CLUSTER", "INFO"]), "cluster_state").as_deref() == Some("ok"),
        );
        n
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// Starts (or restarts, on the same port and directory) and waits for PING.
    pub fn start(&mut self) {
        assert!(self.child.is_none(), "node {} already running", self.port);
        let log = File::options()
            .create(true)
            .append(true)
            .open(self.dir.path().join("redis.log"))
            .expect("log file");
        let mut cmd = Command::new("redis-server");
        if self.args.first().map(String::as_str) == Some("sentinel") {
            let conf = self.dir.path().join("sentinel.conf");
            cmd.arg(&conf).arg("--sentinel");
        }
        cmd.args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
            .arg("--dir")
            .arg(self.dir.path())
            .args(self.args.iter().skip_while(|a| *a == "sentinel"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        self.child = Some(cmd.spawn().expect("spawn redis-server (is it installed?)"));
        let end = Instant::now() + Duration::from_secs(10);
        while Instant::now() < end {
            if let Some(Ok(Some(st))) = self.child.as_mut().map(|c| c.try_wait()) {
                self.child = None;
                panic!("redis-server on {} exited: {st}\n{}", self.port, self.log());
            }
            if self.cli(&["PING"]) == "PONG" {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("redis-server on {} did not answer PING", self.port);
    }

    /// SIGKILL: a crash, not a shutdown.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    pub fn cli(&self, args: &[&str]) -> String {
        cli_with(self.port, self.password.as_deref(), args)
    }

    /// One field of `INFO <section>`.
    pub fn info(&self, section: &str, field: &str) -> Option<String> {
        info_field(&self.cli(&["INFO", section]), field)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Runs one redis-cli command against 127.0.0.1:`port`; stdout, trimmed ("" on failure).
pub fn cli(port: u16, args: &[&str]) -> String {
    cli_with(port, None, args)
}

/// [`cli`], authenticating with `password` if there is one.
fn cli_with(port: u16, password: Option<&str>, args: &[&str]) -> String {
    let mut cmd = Command::new("redis-cli");
    cmd.args(["-h", "127.0.0.1", "-p", &port.to_string()]);
    if let Some(p) = password {
        cmd.env("REDISCLI_AUTH", p);
    }
    cmd.args(args)
        .stderr(Stdio::null())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

fn info_field(info: &str, field: &str) -> Option<String> {
    info.lines()
        .find_map(|l| l.trim().strip_prefix(&format!("{field}:")))
        .map(str::to_string)
}

/// Polls `cond` every 50 ms until true; panics with `what` after `deadline`.
pub fn poll(deadline: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + deadline;
    while !cond() {
        assert!(Instant::now() < end, "timed out after {deadline:?}: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

// ---------------------------------------------------------------------------------
// Redis Cluster
// ---------------------------------------------------------------------------------

/// A Redis Cluster of `masters` masters with `replicas` replicas each.
pub struct RedisCluster {
    pub nodes: Vec<Node>,
}

impl RedisCluster {
    /// Starts the nodes, creates the cluster and waits until every node reports
    /// `cluster_state:ok` and every replica is in sync.
    pub fn start(masters: usize, replicas: usize) -> RedisCluster {
        let n = masters * (1 + replicas);
        let mut nodes: Vec<Node> = (0..n)
            .map(|_| {
                Node::new(
                    [
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes.conf",
                        "--cluster-node-timeout",
                        &NODE_TIMEOUT_MS.to_string(),
                        "--save",
                        "",
                        "--appendonly",
                        "no",
                    ]
                    .iter()
                    .map(|s| s.to_string())
                    .collect(),
                )
            })
            .collect();
        for node in nodes.iter_mut() {
            node.start();
        }
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let cluster = RedisCluster { nodes };
        cluster.wait_healthy(Duration::from_secs(30));
        cluster
    }

    /// Seed URL naming every node (the client needs only one that answers).
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        format!("redis+cluster://{}", hosts.join(","))
    }

    fn live(&self) -> impl Iterator<Item = &Node> {
        self.nodes.iter().filter(|n| n.is_running())
    }

    /// Waits until every live node says `cluster_state:ok`, every live node knows the
    /// same masters, and every live replica's link to its master is up.
    pub fn wait_healthy(&self, deadline: Duration) {
        poll(deadline, "the cluster to be healthy", || {
            self.live().all(|n| {
                info_field(&n.cli(&["CLUSTER", "INFO"]), "cluster_state").as_deref() == Some("ok")
                    && match n.info("replication", "role").as_deref() {
                        Some("master") => true,
                        Some("slave") => {
                            n.info("replication", "master_link_status").as_deref() == Some("up")
                        }
                        _ => false,
                    }
            }) && self.live_masters().len() == self.master_count()
        });
    }

    /// How many masters own slots (as the first live node sees it).
    fn master_count(&self) -> usize {
        let Some(n) = self.live().next() else {
            return 0;
        };
        info_field(&n.cli(&["CLUSTER", "INFO"]), "cluster_size")
            .and_then(|s| s.parse().ok())
            .unwrap_or(0)
    }

    /// Live nodes that are masters owning slots.
    pub fn live_masters(&self) -> Vec<u16> {
        self.live()
            .filter(|n| {
                n.info("replication", "role").as_deref() == Some("master")
                    && n.cli(&["CLUSTER", "NODES"]).lines().any(|l| {
                        l.contains("myself") && l.contains("master") && l.split(' ').count() > 8
                    })
            })
            .map(|n| n.port)
            .collect()
    }

    pub fn node(&mut self, port: u16) -> &mut Node {
        self.nodes
            .iter_mut()
            .find(|n| n.port == port)
            .expect("a node of this cluster")
    }

    /// The port of the master that owns `key`'s slot.
    pub fn master_of(&self, key: &str) -> u16 {
        let n = self.live().next().expect("a live node");
        let slot: u16 = n
            .cli(&["CLUSTER", "KEYSLOT", key])
            .parse()
            .expect("CLUSTER KEYSLOT");
        for line in n.cli(&["CLUSTER", "NODES"]).lines() {
            let f: Vec<&str> = line.split(' ').collect();
            // Flags are comma-separated; `fail?` (suspected by this node only) still owns
            // its slots, `fail` (agreed) does not.
            if f.len() < 9 {
                continue;
            }
            let flags: Vec<&str> = f[2].split(',').collect();
            if !flags.contains(&"master") || flags.contains(&"fail") {
                continue;
            }
            for range in &f[8..] {
                let (a, b) = range.split_once('-').unwrap_or((range, range));
                if let (Ok(a), Ok(b)) = (a.parse::<u16>(), b.parse::<u16>())
                    && (a..=b).contains(&slot)
                {
                    let port = f[1].split('@').next().and_then(|hp| hp.rsplit(':').next());
                    return port.and_then(|p| p.parse().ok()).expect("node port");
                }
            }
        }
        panic!("no master owns slot {slot}");
    }

    /// The port of a live replica of the master at `master_port`.
    pub fn replica_of(&self, master_port: u16) -> u16 {
        self.live()
            .find(|n| {
                n.info("replication", "role").as_deref() == Some("slave")
                    && n.info("replication", "master_port") == Some(master_port.to_string())
            })
            .map(|n| n.port)
            .expect("a live replica of that master")
    }

    /// Keys stored on the node at `port` (SCAN).
    pub fn keys_on(&self, port: u16) -> Vec<String> {
        cli(port, &["--scan", "--pattern", "*"])
            .lines()
            .map(|l| l.trim().to_string())
            .filter(|l| !l.is_empty())
            .collect()
    }

    /// Kills a master, then waits until its replica has taken over its slots.
    pub fn kill_master_and_wait_failover(&mut self, port: u16, deadline: Duration) {
        self.node(port).kill();
        poll(deadline, "a replica to take over the killed master", || {
            self.live().all(|n| {
                info_field(&n.cli(&["CLUSTER", "INFO"]), "cluster_state").as_deref() == Some("ok")
            }) && self.live_masters().len() == self.master_count()
        });
    }
}

// ---------------------------------------------------------------------------------
// Sentinel
// ---------------------------------------------------------------------------------

/// A master, one replica, and three Sentinels watching them as [`MASTER_NAME`].
pub struct SentinelSet {
    pub master: Node,
    pub replica: Node,
    pub sentinels: Vec<Node>,
    auth: SentinelAuth,
}

/// Passwords of a [`SentinelSet`], as managed offerings run it: `redis` is the Redis
/// nodes' `requirepass` (and `masterauth`, and the Sentinels' `sentinel auth-pass`),
/// `sentinel` the Sentinels' own `requirepass` (which they also use with each other).
#[derive(Clone, Default)]
pub struct SentinelAuth {
    pub redis: Option<String>,
    pub sentinel: Option<String>,
}

impl SentinelSet {
    pub fn start() -> SentinelSet {
        SentinelSet::start_with(SentinelAuth::default())
    }

    /// [`SentinelSet::start`] with the passwords of `auth` set.
    pub fn start_with(auth: SentinelAuth) -> SentinelSet {
        let data = || {
            let mut args: Vec<String> = ["--save", "", "--appendonly", "no"]
                .iter()
                .map(|s| s.to_string())
                .collect();
            if let Some(p) = &auth.redis {
                args.extend(["--requirepass", p, "--masterauth", p].map(String::from));
            }
            args
        };
        let mut master = Node::new(data());
        master.password = auth.redis.clone();
        master.start();
        let mut replica_args = data();
        replica_args.extend([
            "--replicaof".to_string(),
            "127.0.0.1".to_string(),
            master.port.to_string(),
        ]);
        let mut replica = Node::new(replica_args);
        replica.password = auth.redis.clone();
        replica.start();
        let mut sentinels = Vec::new();
        for _ in 0..3 {
            let mut s = Node::new(vec!["sentinel".to_string()]);
            s.password = auth.sentinel.clone();
            let mut conf = format!(
                "sentinel monitor {MASTER_NAME} 127.0.0.1 {} 2\n\
                 sentinel down-after-milliseconds {MASTER_NAME} 1000\n\
                 sentinel failover-timeout {MASTER_NAME} 4000\n\
                 sentinel parallel-syncs {MASTER_NAME} 1\n",
                master.port
            );
            if let Some(p) = &auth.redis {
                conf += &format!("sentinel auth-pass {MASTER_NAME} {p}\n");
            }
            if let Some(p) = &auth.sentinel {
                conf += &format!("requirepass {p}\n");
            }
            std::fs::write(s.dir.path().join("sentinel.conf"), conf).expect("write sentinel.conf");
            sentinels.push(s);
        }
        for s in sentinels.iter_mut() {
            s.start();
        }
        let set = SentinelSet {
            master,
            replica,
            sentinels,
            auth,
        };
        set.wait_ready(Duration::from_secs(30));
        set
    }

    /// The `store.url`, with the passwords percent-encoded (the Redis one as the URL's
    /// password, the Sentinels' as `sentinel_password`).
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect();
        let enc = |p: &str| {
            percent_encoding::utf8_percent_encode(p, percent_encoding::NON_ALPHANUMERIC).to_string()
        };
        let userinfo = match &self.auth.redis {
            Some(p) => format!(":{}@", enc(p)),
            None => String::new(),
        };
        let query = match &self.auth.sentinel {
            Some(p) => format!("?sentinel_password={}", enc(p)),
            None => String::new(),
        };
        format!(
            "redis+sentinel://{userinfo}{}/{MASTER_NAME}{query}",
            hosts.join(",")
        )
    }

    /// The master's port as the first live Sentinel reports it.
    pub fn reported_master(&self) -> Option<u16> {
        let s = self.sentinels.iter().find(|s| s.is_running())?;
        let out = s.cli(&["SENTINEL", "get-master-addr-by-name", MASTER_NAME]);
        out.lines().nth(1)?.trim().parse().ok()
    }

    /// Waits until the replica is in sync and every Sentinel knows the replica and
    /// the two other Sentinels (so that a failover can be agreed on).
    pub fn wait_ready(&self, deadline: Duration) {
        poll(
            deadline,
            "sentinels to know the replica and each other",
            || {
                self.replica
                    .info("replication", "master_link_status")
                    .as_deref()
                    == Some("up")
                    && self.sentinels.iter().all(|s| {
                        let m = s.cli(&["SENTINEL", "master", MASTER_NAME]);
                        let field = |name: &str| {
                            let lines: Vec<&str> = m.lines().map(str::trim).collect();
                            lines
                                .iter()
                                .position(|l| *l == name)
                                .and_then(|i| lines.get(i + 1))
                                .and_then(|v| v.parse::<u32>().ok())
                        };
                        field("num-slaves") >= Some(1) && field("num-other-sentinels") == Some(2)
                    })
            },
        );
    }
}
