//! `idemgate reload`: asks the running sidecar to reload (`POST /admin/reload` on
//! `admin_listen`, with an admin token) and prints its answer: what changed, or why
//! nothing was applied. Exit status 0 only when the reload applied.
//! `idemgate check-config --running` prints the configuration in force
//! (`GET /admin/config`) and when it was loaded.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

/// Which running sidecar to ask, and with which token (`idemgate reload`,
/// `idemgate check-config --running`; with `--config`, its `admin_listen` is asked).
#[derive(clap::Args)]
pub struct ReloadArgs {
    /// The admin listener to ask (default: `admin_listen` of the configuration, with
    /// 0.0.0.0 asked on 127.0.0.1).
    #[arg(long)]
    admin: Option<SocketAddr>,
    /// An admin token.
    #[arg(long, env = "IDEMGATE_ADMIN_TOKEN", hide_env_values = true)]
    token: Option<String>,
}

/// How long the sidecar may take to answer (a reload reads and builds the whole file).
const TIMEOUT: Duration = Duration::from_secs(30);

pub fn main(config: Option<&Path>, args: ReloadArgs) -> ExitCode {
    let Some(token) = args.token.filter(|t| !t.is_empty()) else {
        eprintln!("idemgate reload: give an admin token (--token or IDEMGATE_ADMIN_TOKEN)");
        return ExitCode::from(2);
    };
    let addr = match args.admin.map_or_else(|| admin_listen(config), Ok) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("idemgate reload: {e}");
            return ExitCode::from(2);
        }
    };
    match request(addr, "POST", "/admin/reload", &token) {
        Ok((status, body)) => {
            println!("{body}");
            if status == 200 {
                ExitCode::SUCCESS
            } else {
                eprintln!("idemgate reload: not applied (HTTP {status})");
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("idemgate reload: cannot ask {addr}: {e}");
            ExitCode::from(1)
        }
    }
}

/// `admin_listen` as the sidecar reads it (`IDEMGATE_ADMIN_LISTEN`, else the file's,
/// else the default), without validating the rest of a file that may be the invalid
/// one being reloaded.
fn admin_listen(config: Option<&Path>) -> Result<SocketAddr, String> {
    let from_file = match config {
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .map_err(|e| format!("cannot read {}: {e}", p.display()))?;
            text.parse::<toml::Table>().ok().and_then(|t| {
                t.get("admin_listen")
                    .and_then(|v| v.as_str())
                    .map(str::to_string)
            })
        }
        None => None,
    };
    let text = std::env::var("IDEMGATE_ADMIN_LISTEN")
        .ok()
        .or(from_file)
        .unwrap_or_else(|| "0.0.0.0:9090".to_string());
    let mut addr: SocketAddr = text
        .parse()
        .map_err(|e| format!("admin_listen `{text}`: {e}; give --admin"))?;
    if addr.ip().is_unspecified() {
        addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    Ok(addr)
}

/// `idemgate check-config --running`: the running sidecar's configuration in force
/// (redacted) on stdout, its file and load time on stderr.
pub fn show_running(config: Option<&Path>, args: ReloadArgs) -> ExitCode {
    let Some(token) = args.token.filter(|t| !t.is_empty()) else {
        eprintln!(
            "idemgate check-config --running: give an admin token (--token or IDEMGATE_ADMIN_TOKEN)"
        );
        return ExitCode::from(2);
    };
    let addr = match args.admin.map_or_else(|| admin_listen(config), Ok) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("idemgate check-config: {e}");
            return ExitCode::from(2);
        }
    };
    let shown = request(addr, "GET", "/admin/config", &token).map(|(status, body)| {
        let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        (status, v)
    });
    match shown {
        Ok((200, v)) => {
            print!("{}", v["config"].as_str().unwrap_or_default());
            eprintln!(
                "in force since {} (from {})",
                v["loaded_at"].as_str().unwrap_or("?"),
                v["source"].as_str().unwrap_or("defaults and environment")
            );
            ExitCode::SUCCESS
        }
        Ok((status, v)) => {
            eprintln!("idemgate check-config: HTTP {status}: {v}");
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("idemgate check-config: cannot ask {addr}: {e}");
            ExitCode::from(1)
        }
    }
}

/// The status and body of one request without a body (HTTP/1.1, one connection).
fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: &str,
) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, TIMEOUT)?;
    s.set_read_timeout(Some(TIMEOUT))?;
    s.set_write_timeout(Some(TIMEOUT))?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\n\
         Content-Length: 0\r\nConnection: close\r\n\r\n"
    )?;
    let mut answer = Vec::new();
    s.read_to_end(&mut answer)?;
    let answer = String::from_utf8_lossy(&answer);
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other("not an HTTP answer"))?;
    Ok((status, body.trim().to_string()))
}
