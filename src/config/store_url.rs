//! Which store `store.url` names, and the `file:` store's own key (`store.fsync`):
//! `memory`, `file:<dir>` or one of the Redis forms (`config::topology`). A malformed
//! value is a start-up error naming its field.

use std::path::PathBuf;
use std::time::Duration;

use super::parse::parse_duration;
use super::redact::redact_url;
use super::{ConfigError, FsyncPolicy, StoreUrl};

/// The longest `store.fsync` period: past it a machine crash could lose more than a
/// minute of answered deliveries, which no deployment should choose by accident.
const MAX_FSYNC_PERIOD: Duration = Duration::from_secs(60);

/// Parses `text`, read from `field` (`store.url` or `IDEMGATE_STORE_URL`).
pub(super) fn parse_store_url(field: &str, text: &str) -> Result<StoreUrl, ConfigError> {
    if text == "memory" {
        return Ok(StoreUrl::Memory);
    }
    if let Some(rest) = text.strip_prefix("file:") {
        return file_path(rest)
            .map(StoreUrl::File)
            .map_err(|e| ConfigError::new(field, format!("`{text}` {e}")));
    }
    // One server, a Redis Cluster or a Sentinel-managed master: see config::topology.
    super::topology::Topology::parse(text)
        .map_err(|e| ConfigError::new(field, format!("`{}` {e}", redact_url(text))))?;
    Ok(StoreUrl::Redis(text.to_string()))
}

/// The directory of `file:<dir>` (`file:///abs` too); a relative path is taken from
/// the working directory.
fn file_path(rest: &str) -> Result<PathBuf, &'static str> {
    let path = match rest.strip_prefix("//") {
        Some(abs) if abs.starts_with('/') => abs,
        Some(_) => {
            return Err("names a host: write file:/path/to/dir (or file:///path/to/dir)");
        }
        None => rest,
    };
    if path.is_empty() {
        return Err("names no directory: write file:/path/to/dir");
    }
    if path.contains('\0') {
        return Err("is not a valid path");
    }
    Ok(PathBuf::from(path))
}

/// `store.fsync`: `"always"` (the default) or a period (`"100ms"` … `"60s"`); only a
/// `file:` store has it.
pub(super) fn parse_fsync(url: &StoreUrl, raw: Option<&str>) -> Result<FsyncPolicy, ConfigError> {
    const FIELD: &str = "store.fsync";
    let Some(raw) = raw else {
        return Ok(FsyncPolicy::Always);
    };
    if !matches!(url, StoreUrl::File(_)) {
        return Err(ConfigError::new(
            FIELD,
            "applies only to a file: store (store.url = \"file:/path\")",
        ));
    }
    if raw == "always" {
        return Ok(FsyncPolicy::Always);
    }
    let period = parse_duration(FIELD, raw).map_err(|_| {
        ConfigError::new(
            FIELD,
            format!("`{raw}` must be \"always\" or a period such as \"1s\""),
        )
    })?;
    if period.is_zero() || period > MAX_FSYNC_PERIOD {
        return Err(ConfigError::new(
            FIELD,
            "must be \"always\" or a period from 1ms to 60s",
        ));
    }
    Ok(FsyncPolicy::Every(period))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_urls_and_their_errors() {
        let url = |t| parse_store_url("store.url", t);
        assert_eq!(
            url("file:/var/lib/idemgate").unwrap(),
            StoreUrl::File("/var/lib/idemgate".into())
        );
        assert_eq!(
            url("file:///var/lib/idemgate").unwrap(),
            StoreUrl::File("/var/lib/idemgate".into())
        );
        assert_eq!(url("file:data").unwrap(), StoreUrl::File("data".into()));
        for bad in ["file:", "file://host/x", "file://"] {
            let e = url(bad).unwrap_err().to_string();
            assert!(e.contains("store.url") && e.contains(bad), "{bad}: {e}");
        }
        let e = url("bogus://x").unwrap_err().to_string();
        assert!(e.contains("file:"), "{e}");
    }

    #[test]
    fn fsync_is_always_or_a_bounded_period_on_a_file_store_only() {
        let file = StoreUrl::File("/d".into());
        assert_eq!(parse_fsync(&file, None).unwrap(), FsyncPolicy::Always);
        assert_eq!(
            parse_fsync(&file, Some("always")).unwrap(),
            FsyncPolicy::Always
        );
        assert_eq!(
            parse_fsync(&file, Some("250ms")).unwrap(),
            FsyncPolicy::Every(Duration::from_millis(250))
        );
        for bad in ["never", "0s", "2m"] {
            let e = parse_fsync(&file, Some(bad)).unwrap_err().to_string();
            assert!(e.contains("store.fsync"), "{bad}: {e}");
        }
        let e = parse_fsync(&StoreUrl::Memory, Some("1s"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("only to a file: store"), "{e}");
    }

    #[test]
    fn a_file_store_config_is_bounded_and_shown_as_it_is_read() {
        use crate::config::Config;
        let text =
            "[store]\nurl = \"file:/var/lib/idemgate\"\nfsync = \"1s\"\nmax_memory = \"64MiB\"";
        let c = Config::from_toml_with_env(text, |_| None).unwrap();
        assert_eq!(c.store.url, StoreUrl::File("/var/lib/idemgate".into()));
        assert_eq!(c.store.fsync, FsyncPolicy::Every(Duration::from_secs(1)));
        assert_eq!(c.store.max_memory, 64 << 20);
        let shown = c.redacted_toml();
        assert!(
            shown.contains("url = \"file:/var/lib/idemgate\"\nfsync = \"1s\""),
            "{shown}"
        );
        let again = Config::from_toml_with_env(&shown, |_| None).unwrap();
        assert_eq!(again.store.fsync, c.store.fsync);
        assert_eq!(again.store.url, c.store.url);
    }
}
