//! The TCP settings every connection to Redis uses (standalone, Cluster, Sentinel and
//! its watchers): one place, so the connection kinds cannot drift.

/// TCP settings for every connection to Redis. `TCP_NODELAY` is on: redis-rs leaves it
/// off by default, and on one multiplexed connection a claim written while the previous
/// command's bytes are unacknowledged would wait for the ACK (Nagle), adding up to a
/// delayed-ACK timeout to a delivery (BENCHMARKS.md, "What holds the figures").
pub fn tcp_settings() -> redis::io::tcp::TcpSettings {
    redis::io::tcp::TcpSettings::default().set_nodelay(true)
}
