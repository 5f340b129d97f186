//! The value parsers: durations, sizes, addresses, the upstream URL, counts and
//! enumerations, each reporting the field it reads.

use std::net::SocketAddr;
use std::time::Duration;

use http::Uri;

use super::ConfigError;

/// Splits a WeChat Pay entry `ID=source` (ID of letters, digits and `_`) into its
/// parts. A PEM literal or `env:`/`file:` source never matches.
pub(super) fn split_key_id(entry: &str) -> (Option<&str>, &str) {
    match entry.split_once('=') {
        Some((id, rest))
            if !id.is_empty()
                && !rest.is_empty()
                && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') =>
        {
            (Some(id), rest)
        }
        _ => (None, entry),
    }
}

pub fn parse_duration(field: &str, s: &str) -> Result<Duration, ConfigError> {
    humantime::parse_duration(s.trim()).map_err(|e| {
        ConfigError::new(
            field,
            format!("`{s}` is not a duration like 30s or 72h ({e})"),
        )
    })
}

/// Parses `1MiB`, `512KiB`, `64KB`, `1000` (bytes).
pub fn parse_size(field: &str, s: &str) -> Result<usize, ConfigError> {
    let t = s.trim();
    let split = t
        .find(|c: char| !c.is_ascii_digit() && c != '_')
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .replace('_', "")
        .parse()
        .map_err(|_| ConfigError::new(field, format!("`{s}` is not a size like 1MiB or 64KiB")))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1000,
        "kib" => 1024,
        "m" | "mb" => 1000 * 1000,
        "mib" => 1024 * 1024,
        "g" | "gb" => 1000 * 1000 * 1000,
        "gib" => 1024 * 1024 * 1024,
        other => {
            return Err(ConfigError::new(
                field,
                format!("unknown size unit `{other}` (use B, KiB, MiB, GiB, KB, MB, GB)"),
            ));
        }
    };
    let bytes = n
        .checked_mul(mult)
        .filter(|b| *b > 0)
        .ok_or_else(|| ConfigError::new(field, format!("`{s}` must be a positive size")))?;
    usize::try_from(bytes).map_err(|_| ConfigError::new(field, "size too large"))
}

pub(super) fn parse_addr(field: &str, s: &str) -> Result<SocketAddr, ConfigError> {
    s.trim().parse().map_err(|_| {
        ConfigError::new(
            field,
            format!("`{s}` is not an address like 0.0.0.0:8080 or 127.0.0.1:9090"),
        )
    })
}

pub(super) fn parse_upstream(field: &str, s: &str) -> Result<Uri, ConfigError> {
    let uri: Uri = s
        .trim()
        .parse()
        .map_err(|e| ConfigError::new(field, format!("`{s}` is not a URL ({e})")))?;
    if uri.scheme_str() != Some("http") {
        return Err(ConfigError::new(
            field,
            "the upstream must be an http:// URL (the application beside the sidecar)",
        ));
    }
    if uri.authority().is_none() {
        return Err(ConfigError::new(
            field,
            "the upstream URL needs a host and port",
        ));
    }
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
        return Err(ConfigError::new(
            field,
            "the upstream URL is scheme://host:port only; use a route's upstream_path for paths",
        ));
    }
    Ok(uri)
}

/// A positive whole number, written as a TOML integer or a string of digits.
pub(super) fn parse_count(
    field: &str,
    v: Option<toml::Value>,
    default: u64,
) -> Result<u64, ConfigError> {
    let n = match v {
        None => default,
        Some(toml::Value::Integer(i)) => u64::try_from(i)
            .map_err(|_| ConfigError::new(field, format!("`{i}` must be a positive number")))?,
        Some(toml::Value::String(s)) => s.trim().replace('_', "").parse().map_err(|_| {
            ConfigError::new(field, format!("`{s}` is not a whole number like 1024"))
        })?,
        Some(other) => {
            return Err(ConfigError::new(
                field,
                format!("`{other}` is not a whole number like 1024"),
            ));
        }
    };
    if n == 0 {
        return Err(ConfigError::new(field, "must be at least 1"));
    }
    Ok(n)
}

pub(super) fn one_of<T: Copy>(
    field: &str,
    s: &str,
    options: &[(&str, T)],
) -> Result<T, ConfigError> {
    options
        .iter()
        .find(|(name, _)| *name == s)
        .map(|(_, v)| *v)
        .ok_or_else(|| {
            let names: Vec<&str> = options.iter().map(|(n, _)| *n).collect();
            ConfigError::new(field, format!("`{s}` is not one of: {}", names.join(", ")))
        })
}
