//! Which Redis deployment `store.url` names: one server, a Redis Cluster, or a
//! Sentinel-managed master. Parsed once (by the configuration check and again when the
//! store is built), so a malformed URL is a start-up error naming `store.url`.
//!
//! | URL | deployment |
//! |---|---|
//! | `redis://[user:pw@]host:port[/db]`, `rediss://…`, `redis+unix://…`, `unix://…` | one server (or a proxy in front of many) |
//! | `redis+cluster://[user:pw@]host:port,host:port,…` (`rediss+cluster://` for TLS) | Redis Cluster; the nodes are seeds, the rest is discovered |
//! | `redis+sentinel://[user:pw@]host:port,host:port/<master-name>[/db][?sentinel_username=…&sentinel_password=…]` | the master that the Sentinels name |
//!
//! In a Sentinel URL the user and password are those of the Redis servers; Sentinels
//! that require a password of their own get it from `sentinel_password` (and
//! `sentinel_username`). Both are percent-decoded the same way (a `+` stays a `+`).

use percent_encoding::percent_decode_str;

/// A parsed `store.url` for Redis.
#[derive(Clone, PartialEq, Eq)]
pub enum Topology {
    /// One server; the URL is handed to the `redis` crate as it is.
    Standalone(String),
    /// Seed nodes of a Redis Cluster, each as a `redis://` (or `rediss://`) URL with
    /// the credentials.
    Cluster { nodes: Vec<String> },
    /// The master named `master` by the Sentinels at `sentinels`.
    Sentinel(SentinelTarget),
}

#[derive(Clone, PartialEq, Eq)]
pub struct SentinelTarget {
    pub sentinels: Vec<(String, u16)>,
    pub master: String,
    pub db: i64,
    pub username: Option<String>,
    pub password: Option<String>,
    pub sentinel_username: Option<String>,
    pub sentinel_password: Option<String>,
}

impl std::fmt::Debug for Topology {
    // Never prints credentials.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Topology::Standalone(_) => f.write_str("Standalone"),
            Topology::Cluster { nodes } => write!(f, "Cluster({} seed nodes)", nodes.len()),
            Topology::Sentinel(s) => write!(
                f,
                "Sentinel(master {:?}, db {}, {} sentinels)",
                s.master,
                s.db,
                s.sentinels.len()
            ),
        }
    }
}

impl Topology {
    /// Parses a Redis `store.url`; the error is a sentence for the configuration error,
    /// which never repeats a piece of the URL (a node, an option, a path): with a
    /// password holding `/` or `?` unencoded, any piece may be part of the password.
    pub fn parse(url: &str) -> Result<Topology, String> {
        if let Some(e) = at_after_the_host(url) {
            return Err(e);
        }
        if let Some(rest) = url.strip_prefix("redis+cluster://") {
            return parse_cluster("redis", rest);
        }
        if let Some(rest) = url.strip_prefix("rediss+cluster://") {
            return parse_cluster("rediss", rest);
        }
        if let Some(rest) = url.strip_prefix("redis+sentinel://") {
            return parse_sentinel(rest).map(Topology::Sentinel);
        }
        if url.starts_with("redis://")
            || url.starts_with("rediss://")
            || url.starts_with("redis+unix://")
            || url.starts_with("unix://")
        {
            return match redis::parse_redis_url(url) {
                Some(_) => Ok(Topology::Standalone(url.to_string())),
                None => Err("is not a valid Redis URL".to_string()),
            };
        }
        Err("must be \"memory\", file:/path, redis://, rediss://, redis+cluster://, rediss+cluster:// or redis+sentinel://".to_string())
    }

    /// A word for logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Topology::Standalone(_) => "standalone",
            Topology::Cluster { .. } => "cluster",
            Topology::Sentinel(_) => "sentinel",
        }
    }
}

/// The hint for a user or password holding `/`, `?` or `#` unencoded.
const ENCODE: &str =
    "percent-encode `/`, `?`, `#` and `@` in a user or password (%2F, %3F, %23, %40)";

/// Refuses a URL with an `@` after its host: a password holding `/`, `?` or `#`
/// unencoded, which would otherwise be read as a host, a path or options (the port,
/// the master name: a piece of the password in logs). Only the Sentinel options and a
/// Unix socket's options may hold an `@`.
fn at_after_the_host(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    if matches!(scheme, "redis+unix" | "unix") {
        return None;
    }
    let end = rest.find(['/', '?', '#'])?;
    let after = &rest[end..];
    let checked = if scheme == "redis+sentinel" {
        after.split('?').next().unwrap_or("")
    } else {
        after
    };
    checked
        .contains('@')
        .then(|| format!("has an `@` after the host: {ENCODE}"))
}

/// Splits `user:pw@hosts` into the (still percent-encoded) userinfo and the hosts.
fn split_userinfo(authority: &str) -> (Option<&str>, &str) {
    match authority.rfind('@') {
        Some(at) => (Some(&authority[..at]), &authority[at + 1..]),
        None => (None, authority),
    }
}

fn decode(s: &str) -> Result<String, String> {
    percent_decode_str(s)
        .decode_utf8()
        .map(|c| c.into_owned())
        .map_err(|_| "holds a user or password that is not UTF-8".to_string())
}

/// `user:pw` → (user, password), both optional and percent-decoded.
fn credentials(userinfo: Option<&str>) -> Result<(Option<String>, Option<String>), String> {
    let Some(ui) = userinfo else {
        return Ok((None, None));
    };
    let (user, pw) = match ui.split_once(':') {
        Some((u, p)) => (u, Some(p)),
        None => (ui, None),
    };
    let user = (!user.is_empty()).then(|| decode(user)).transpose()?;
    let pw = pw.filter(|p| !p.is_empty()).map(decode).transpose()?;
    Ok((user, pw))
}

/// `host:port,host:port` → the list; every entry needs an explicit port.
fn host_ports(hosts: &str) -> Result<Vec<(String, u16)>, String> {
    let mut out = Vec::new();
    for (i, h) in hosts.split(',').enumerate() {
        // Named by position, not text: see `Topology::parse`.
        let n = i + 1;
        let h = h.trim();
        let (host, port) = h
            .rsplit_once(':')
            .ok_or_else(|| format!("node {n} of the list needs host:port"))?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let port: u16 = port
            .parse()
            .map_err(|_| format!("node {n} of the list has no valid port"))?;
        if host.is_empty() || port == 0 {
            return Err(format!("node {n} of the list needs host:port"));
        }
        out.push((host.to_string(), port));
    }
    if out.is_empty() {
        return Err("names no node".to_string());
    }
    Ok(out)
}

fn parse_cluster(scheme: &str, rest: &str) -> Result<Topology, String> {
    let (authority, tail) = match rest.find(['/', '?']) {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    if !matches!(tail, "" | "/" | "/0") {
        return Err(
            "a Redis Cluster has only database 0 and takes no options after the nodes".to_string(),
        );
    }
    let (userinfo, hosts) = split_userinfo(authority);
    let nodes = host_ports(hosts)?;
    let auth = userinfo.map(|u| format!("{u}@")).unwrap_or_default();
    let nodes = nodes
        .into_iter()
        .map(|(h, p)| {
            let host = if h.contains(':') { format!("[{h}]") } else { h };
            format!("{scheme}://{auth}{host}:{p}")
        })
        .collect::<Vec<_>>();
    // The crate must accept each node URL (credentials, TLS) the same way at start.
    for n in &nodes {
        if redis::parse_redis_url(n).is_none() {
            return Err("is not a valid Redis Cluster URL".to_string());
        }
    }
    Ok(Topology::Cluster { nodes })
}

fn parse_sentinel(rest: &str) -> Result<SentinelTarget, String> {
    let (before_query, query) = match rest.split_once('?') {
        Some((a, q)) => (a, Some(q)),
        None => (rest, None),
    };
    let (authority, path) = match before_query.find('/') {
        Some(i) => (&before_query[..i], &before_query[i + 1..]),
        None => (before_query, ""),
    };
    let (userinfo, hosts) = split_userinfo(authority);
    let sentinels = host_ports(hosts)?;
    let (username, password) = credentials(userinfo)?;
    let mut parts = path.split('/').filter(|s| !s.is_empty());
    let master = parts
        .next()
        .ok_or("names no master: redis+sentinel://host:port,host:port/<master-name>[/db]")?;
    let master = decode(master)?;
    let db = match parts.next() {
        Some(d) => d
            .parse::<i64>()
            .ok()
            .filter(|d| *d >= 0)
            .ok_or("the database after the master name is not a number")?,
        None => 0,
    };
    if parts.next().is_some() {
        return Err("has more than /<master-name>/<db> in its path".to_string());
    }
    let mut sentinel_username = None;
    let mut sentinel_password = None;
    // Percent-decoded like the user and password before the `@`, not as a form: a `+`
    // (common in generated base64 passwords) stays a `+`.
    for (i, kv) in query
        .into_iter()
        .flat_map(|q| q.split('&'))
        .filter(|kv| !kv.is_empty())
        .enumerate()
    {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        let v = decode(v)?;
        match &*decode(k)? {
            "sentinel_username" => sentinel_username = Some(v),
            "sentinel_password" => sentinel_password = Some(v),
            // Named by position, not text: see `Topology::parse`.
            _ => {
                return Err(format!(
                    "has an unknown option (option {}; known: sentinel_username, sentinel_password)",
                    i + 1
                ));
            }
        }
    }
    Ok(SentinelTarget {
        sentinels,
        master,
        db,
        username,
        password,
        sentinel_username,
        sentinel_password,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standalone_urls_pass_through() {
        assert_eq!(
            Topology::parse("redis://127.0.0.1:6379/0").unwrap(),
            Topology::Standalone("redis://127.0.0.1:6379/0".into())
        );
        assert!(Topology::parse("mysql://x").is_err());
    }

    #[test]
    fn cluster_urls_list_seed_nodes_with_credentials() {
        let t = Topology::parse("redis+cluster://u:p%40ss@10.0.0.1:7000,10.0.0.2:7001").unwrap();
        assert_eq!(
            t,
            Topology::Cluster {
                nodes: vec![
                    "redis://u:p%40ss@10.0.0.1:7000".into(),
                    "redis://u:p%40ss@10.0.0.2:7001".into()
                ]
            }
        );
        let t = Topology::parse("rediss+cluster://h:7000/").unwrap();
        assert_eq!(
            t,
            Topology::Cluster {
                nodes: vec!["rediss://h:7000".into()]
            }
        );
        assert!(Topology::parse("redis+cluster://h:7000/3").is_err());
        assert!(Topology::parse("redis+cluster://h").is_err());
        assert!(Topology::parse("redis+cluster://").is_err());
    }

    #[test]
    fn sentinel_urls_name_master_db_and_credentials() {
        let t = Topology::parse(
            "redis+sentinel://:pw@s1:26379,s2:26380/mymaster/2?sentinel_password=spw",
        )
        .unwrap();
        let Topology::Sentinel(s) = t else {
            panic!("not sentinel")
        };
        assert_eq!(
            s.sentinels,
            vec![("s1".to_string(), 26379), ("s2".to_string(), 26380)]
        );
        assert_eq!(s.master, "mymaster");
        assert_eq!(s.db, 2);
        assert_eq!(s.username, None);
        assert_eq!(s.password.as_deref(), Some("pw"));
        assert_eq!(s.sentinel_password.as_deref(), Some("spw"));
        let Topology::Sentinel(s) = Topology::parse("redis+sentinel://s1:26379/m").unwrap() else {
            panic!("not sentinel")
        };
        assert_eq!((s.db, s.password), (0, None));
        assert!(Topology::parse("redis+sentinel://s1:26379").is_err());
        assert!(Topology::parse("redis+sentinel://s1:26379/m/x").is_err());
        assert!(Topology::parse("redis+sentinel://s1:26379/m?bogus=1").is_err());
        // `+` is a `+` in both passwords (not a form's space); `%xx` is decoded in both.
        let Topology::Sentinel(s) =
            Topology::parse("redis+sentinel://:a+b%2F@s1:1/m?sentinel_password=c+d%3D%26=")
                .unwrap()
        else {
            panic!("not sentinel")
        };
        assert_eq!(s.password.as_deref(), Some("a+b/"));
        assert_eq!(s.sentinel_password.as_deref(), Some("c+d=&="));
    }

    #[test]
    fn debug_never_shows_credentials() {
        let t = Topology::parse("redis+cluster://u:hunter2@h:7000").unwrap();
        assert!(!format!("{t:?}").contains("hunter2"));
        let t = Topology::parse("redis+sentinel://u:hunter2@h:1/m?sentinel_password=x").unwrap();
        assert!(!format!("{t:?}").contains("hunter2"));
    }
}
