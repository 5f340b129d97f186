//! `idemgate deliveries list|show|forget|replay`: the admin operations from a shell,
//! talking to Redis directly (the store URL and prefix come from `--config`). Human
//! tables by default, `--json` for scripts. Exit status 0 on success, 1 otherwise.

use std::path::Path;
use std::process::ExitCode;

use crate::config::Config;
use crate::deliveries::{self, audit::audit};
use crate::store::log::{Cursor, DeliveryLog, Filter, Forgot, ListQuery, LogEntry};
use crate::store::{DeliveryKey, RedisStore};
use crate::upstream::Upstream;

#[derive(clap::Args, Debug)]
pub struct DeliveriesArgs {
    #[command(subcommand)]
    command: Command,
    /// Print JSON instead of a table.
    #[arg(long, global = true)]
    json: bool,
}

#[derive(clap::Subcommand, Debug)]
enum Command {
    /// Recent deliveries, newest (first seen) first.
    List {
        #[arg(long)]
        route: Option<String>,
        /// processing | completed | released
        #[arg(long)]
        status: Option<String>,
        /// forwarded | upstream_error | operator_replay | operator_replay_failed
        #[arg(long)]
        outcome: Option<String>,
        /// First seen at or after (Unix ms).
        #[arg(long)]
        since: Option<String>,
        /// First seen before (Unix ms).
        #[arg(long)]
        until: Option<String>,
        #[arg(long)]
        key_prefix: Option<String>,
        /// The upstream's status (503) or class (5xx).
        #[arg(long)]
        upstream_status: Option<String>,
        /// Only deliveries that answered at least one copy.
        #[arg(long)]
        duplicates: bool,
        /// Only deliveries whose request was kept.
        #[arg(long)]
        kept: bool,
        #[arg(long, default_value_t = 50)]
        limit: usize,
        /// The `next_cursor` of the previous page.
        #[arg(long)]
        cursor: Option<String>,
    },
    /// One delivery's log entry (and its kept request).
    Show { route: String, key: String },
    /// Forget a delivery: the provider's next copy is forwarded.
    Forget { route: String, key: String },
    /// Send the kept request to the configured upstream again, under the key's claim.
    Replay { route: String, key: String },
}

fn who() -> String {
    format!(
        "cli:{}",
        std::env::var("USER").unwrap_or_else(|_| "unknown".into())
    )
}

fn fail(msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("idemgate deliveries: {msg}");
    ExitCode::from(1)
}

fn print_json(v: &serde_json::Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string())
    );
}

fn ms_text(ms: u64) -> String {
    if ms == 0 {
        return "-".into();
    }
    humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms))
        .to_string()
}

fn table(entries: &[(u64, LogEntry)]) -> String {
    let header = [
        "ROUTE",
        "KEY",
        "STATUS",
        "OUTCOME",
        "UPSTREAM",
        "ATTEMPTS",
        "DUPS",
        "LATENCY",
        "LAST SEEN",
    ];
    let rows: Vec<[String; 9]> = entries
        .iter()
        .map(|(_, e)| {
            [
                e.route.clone(),
                e.key.clone(),
                format!("{}{}", e.status.as_str(), if e.claimed { "*" } else { "" }),
                e.outcome.clone().unwrap_or("-".into()),
                e.upstream_status
                    .map(|s| s.to_string())
                    .unwrap_or("-".into()),
                e.attempts.to_string(),
                e.duplicates.to_string(),
                e.latency_ms.map(|l| format!("{l}ms")).unwrap_or("-".into()),
                ms_text(e.last_seen),
            ]
        })
        .collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<w$}", w = widths[i]))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string()
    };
    let mut out = line(header.to_vec());
    out.push('\n');
    for r in &rows {
        out.push_str(&line(r.iter().map(String::as_str).collect()));
        out.push('\n');
    }
    out
}

fn show_text(e: &LogEntry) -> String {
    let mut s = String::new();
    let mut kv = |k: &str, v: String| s.push_str(&format!("{k:<18} {v}\n"));
    kv("route", e.route.clone());
    kv("key", e.key.clone());
    kv(
        "status",
        format!(
            "{}{}",
            e.status.as_str(),
            if e.claimed { " (claimed now)" } else { "" }
        ),
    );
    kv("last outcome", e.outcome.clone().unwrap_or("-".into()));
    kv(
        "upstream status",
        e.upstream_status
            .map(|s| s.to_string())
            .unwrap_or("-".into()),
    );
    kv(
        "upstream latency",
        e.latency_ms
            .map(|l| format!("{l} ms"))
            .unwrap_or("-".into()),
    );
    kv("attempts", e.attempts.to_string());
    kv("duplicates", e.duplicates.to_string());
    kv("operator replays", e.replays.to_string());
    kv("first seen", ms_text(e.first_seen));
    kv("last seen", ms_text(e.last_seen));
    kv(
        "stored answer",
        e.response_status
            .map(|s| s.to_string())
            .unwrap_or("-".into()),
    );
    kv("fingerprint", e.fingerprint.clone());
    match &e.request {
        Some(r) => kv(
            "request kept",
            format!("{} {} ({} bytes)", r.method, r.path, r.body.len()),
        ),
        None => kv("request kept", "no".into()),
    }
    s
}

/// Runs `idemgate deliveries …`.
pub fn main(config: Option<&Path>, args: DeliveriesArgs) -> ExitCode {
    super::ops_cli::with_redis("deliveries", config, async |config, store, _queue| {
        run(config, store, args).await
    })
}

async fn run(config: &Config, store: &RedisStore, args: DeliveriesArgs) -> ExitCode {
    let json = args.json;
    match args.command {
        Command::List {
            route,
            status,
            outcome,
            since,
            until,
            key_prefix,
            upstream_status,
            duplicates,
            kept,
            limit,
            cursor,
        } => {
            let mut filter = Filter::default();
            let words = [
                ("status", status),
                ("outcome", outcome),
                ("since", since),
                ("until", until),
                ("key_prefix", key_prefix),
                ("upstream_status", upstream_status),
                ("duplicates", duplicates.then(|| "true".to_string())),
                ("kept", kept.then(|| "true".to_string())),
            ];
            for (word, value) in words {
                if let Some(v) = value
                    && let Err(e) = filter.set(word, &v)
                {
                    return fail(format!("--{}: {}", e.name.replace('_', "-"), e.message));
                }
            }
            let cursor = match cursor.as_deref().map(|c| (c, Cursor::decode(c))) {
                Some((_, None)) => {
                    return fail("--cursor is not a next_cursor this command printed");
                }
                Some((_, c)) => c,
                None => None,
            };
            let q = ListQuery {
                routes: match route {
                    Some(r) => vec![r],
                    None => config.routes.iter().map(|r| r.name.clone()).collect(),
                },
                filter,
                limit: limit.clamp(1, 10_000),
                cursor,
            };
            match store.recent(&q).await {
                Ok(page) if json => {
                    print_json(&page.to_json());
                    ExitCode::SUCCESS
                }
                Ok(page) => {
                    print!("{}", table(&page.items));
                    if let Some(n) = &page.next {
                        let partial = if page.partial {
                            "partial page: the reading stopped early; "
                        } else {
                            ""
                        };
                        println!("({partial}more: --cursor {})", n.encode());
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => fail(e),
            }
        }
        Command::Show { route, key } => {
            match store.log_entry(&DeliveryKey::new(route, key)).await {
                Ok(Some(e)) if json => {
                    print_json(&e.to_json());
                    ExitCode::SUCCESS
                }
                Ok(Some(e)) => {
                    print!("{}", show_text(&e));
                    ExitCode::SUCCESS
                }
                Ok(None) => fail("no such delivery"),
                Err(e) => fail(e),
            }
        }
        Command::Forget { route, key } => {
            let r = store
                .forget(&DeliveryKey::new(route.as_str(), key.as_str()))
                .await;
            let result = match &r {
                Ok(Forgot::Forgotten) => "forgotten",
                Ok(Forgot::NotFound) => "not_found",
                Ok(Forgot::InFlight) => "in_flight",
                Err(_) => "store_unavailable",
            };
            audit(&who(), "forget", &route, &key, result);
            if json {
                print_json(&serde_json::json!({"route": route, "key": key, "result": result}));
            } else {
                println!("{route} {key}: {result}");
            }
            match r {
                Ok(Forgot::Forgotten) => ExitCode::SUCCESS,
                Ok(_) => ExitCode::from(1),
                Err(e) => fail(e),
            }
        }
        Command::Replay { route, key } => {
            let upstream = Upstream::new(
                &config.upstream,
                config.upstream_timeout,
                config.max_response,
            );
            let dkey = DeliveryKey::new(route.as_str(), key.as_str());
            match deliveries::replay(store, &upstream, &dkey, config.dedup_of(&route).lease).await {
                Ok(d) => {
                    audit(
                        &who(),
                        "replay",
                        &route,
                        &key,
                        &format!("{} (upstream {})", d.outcome, d.status),
                    );
                    if json {
                        print_json(&serde_json::json!({
                            "route": route, "key": key, "outcome": d.outcome,
                            "upstream_status": d.status, "recorded": d.recorded,
                            "latency_ms": d.latency_ms,
                        }));
                    } else {
                        println!(
                            "{route} {key}: {} (upstream answered {} in {} ms{})",
                            d.outcome,
                            d.status,
                            d.latency_ms,
                            if d.recorded { ", recorded" } else { "" }
                        );
                    }
                    if d.recorded {
                        ExitCode::SUCCESS
                    } else {
                        ExitCode::from(1)
                    }
                }
                Err(e) => {
                    audit(&who(), "replay", &route, &key, &e.to_string());
                    fail(e)
                }
            }
        }
    }
}
