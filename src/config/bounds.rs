//! The range every configured duration must lie in, and the relations between them.
//!
//! A duration outside its range is a mistake (`retention = "300000000000y"`, a timeout
//! under a millisecond) that would otherwise overflow a deadline, truncate when sent
//! to Redis in milliseconds, or make every delivery fail; it is refused at start (and
//! by `check-config`) with the field's name. The bounds are generous for any real
//! deployment: the longest are far beyond what a webhook provider waits or retries.

use std::time::Duration;

use super::{Config, ConfigError};

const MS: Duration = Duration::from_millis(1);
const MINUTE: Duration = Duration::from_secs(60);
const HOUR: Duration = Duration::from_secs(3600);
const DAY: Duration = Duration::from_secs(24 * 3600);

/// Each duration field (route fields without their `route[i].`) and its inclusive
/// range. Every one is at least 1 ms: Redis counts lifetimes in milliseconds.
const RANGES: &[(&str, Duration, Duration)] = &[
    ("upstream_timeout", MS, HOUR),
    ("shutdown_grace", MS, HOUR),
    ("header_timeout", MS, HOUR),
    ("body_timeout", MS, HOUR),
    ("store.timeout", MS, MINUTE),
    ("store.replicas_ack_timeout", MS, MINUTE),
    ("store.breaker_cooldown", MS, HOUR),
    ("dedup.lease", MS, HOUR),
    ("dedup.retention", MS, Duration::from_secs(365 * 24 * 3600)),
    ("dedup.wait_timeout", MS, HOUR),
    ("async.claim_idle", MS, HOUR),
    (
        "tolerance",
        Duration::from_secs(1),
        Duration::from_secs(7 * 24 * 3600),
    ),
    ("max_age", MS, Duration::from_secs(365 * 24 * 3600)),
    ("backoff", MS, DAY),
    ("max_backoff", MS, DAY),
    ("retry_after_cap", Duration::from_secs(1), DAY),
];

/// A lease shorter than this many store timeouts can lapse while its holder is alive:
/// a renewal sent at a third of the lease that stalls for the whole store timeout
/// leaves the next one `lease × 2/3 − store.timeout` to land, nothing when
/// `lease < 1.5 × store.timeout`. Two store timeouts leave that renewal a sixth of the
/// lease (or a third of a store timeout) for its round trip.
const LEASE_PER_STORE_TIMEOUT: u32 = 2;

fn show(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

/// A bound as written in the docs: whole days as days (humantime would show 365 days
/// as `11months 30days 3h 50m 24s`).
fn show_bound(d: Duration) -> String {
    let day = DAY.as_secs();
    if d.subsec_nanos() == 0 && d.as_secs() >= day && d.as_secs().is_multiple_of(day) {
        format!("{}days", d.as_secs() / day)
    } else {
        show(d)
    }
}

/// Checks `d`, the value of `field` (shown as `shown`, e.g. `route[2].max_age`).
pub(super) fn within(field: &str, shown: &str, d: Duration) -> Result<Duration, ConfigError> {
    let Some((_, min, max)) = RANGES.iter().find(|(f, _, _)| *f == field) else {
        return Ok(d);
    };
    if d < *min || d > *max {
        return Err(ConfigError::new(
            shown,
            format!(
                "{} is out of range: must be between {} and {}",
                show(d),
                show_bound(*min),
                show_bound(*max)
            ),
        ));
    }
    Ok(d)
}

/// The relations between durations that keep a delivery's claim and status alive as
/// long as they are needed: `[dedup]`'s, then each route's that sets its own `lease`
/// or `retention` (named `route[i].…`; a route that sets neither is `[dedup]`'s case).
pub(super) fn relations(c: &Config) -> Result<(), ConfigError> {
    lease_outlasts_renewals("dedup.lease", c.dedup.lease, c.store.timeout)?;
    let needed = c.upstream_timeout + c.dedup.lease;
    if c.dedup.retention < needed {
        return Err(retention_too_short(
            "dedup.retention",
            c.dedup.retention,
            "dedup.lease",
            needed,
        ));
    }
    for (i, r) in c.routes.iter().enumerate() {
        let at = |f: &str| format!("route[{i}].{f}");
        let own = &r.dedup;
        let d = own.over(&c.dedup);
        if own.lease.is_some() {
            lease_outlasts_renewals(&at("lease"), d.lease, c.store.timeout)?;
        }
        let needed = c.upstream_timeout + d.lease;
        if d.retention >= needed || (own.lease.is_none() && own.retention.is_none()) {
            continue;
        }
        let lease = if own.lease.is_some() {
            at("lease")
        } else {
            "dedup.lease".to_string()
        };
        if own.retention.is_some() {
            return Err(retention_too_short(
                &at("retention"),
                d.retention,
                &lease,
                needed,
            ));
        }
        // The route's own lease is too long for the retention it inherits.
        return Err(ConfigError::new(
            at("lease"),
            format!(
                "{} needs a retention of at least upstream_timeout + lease ({}), longer \
                 than dedup.retention ({}): set {} too, or shorten the lease",
                show(d.lease),
                show(needed),
                show(d.retention),
                at("retention")
            ),
        ));
    }
    Ok(())
}

/// `lease` (the value of `field`) against the store timeout its renewals may stall for.
fn lease_outlasts_renewals(
    field: &str,
    lease: Duration,
    timeout: Duration,
) -> Result<(), ConfigError> {
    if lease < timeout * LEASE_PER_STORE_TIMEOUT {
        return Err(ConfigError::new(
            field,
            format!(
                "{} must be at least {LEASE_PER_STORE_TIMEOUT} × store.timeout ({}): a \
                 renewal that stalls for the store timeout would let the lease lapse \
                 while its upstream call still runs",
                show(lease),
                show(timeout * LEASE_PER_STORE_TIMEOUT)
            ),
        ));
    }
    Ok(())
}

/// The error of a retention (the value of `field`) shorter than `upstream_timeout` +
/// the lease named `lease`.
fn retention_too_short(
    field: &str,
    retention: Duration,
    lease: &str,
    needed: Duration,
) -> ConfigError {
    ConfigError::new(
        field,
        format!(
            "{} must be at least upstream_timeout + {lease} ({}): a delivery's status \
             must outlive its longest upstream call and the lease that fences it, or its \
             completion finds it gone",
            show(retention),
            show(needed)
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> ConfigError {
        Config::from_toml_with_env(text, |_| None).expect_err(text)
    }

    #[test]
    fn every_duration_field_has_a_range() {
        // the fields config/validate.rs parses as durations, by the name `within` is given
        for f in [
            "upstream_timeout",
            "shutdown_grace",
            "header_timeout",
            "body_timeout",
            "store.timeout",
            "store.replicas_ack_timeout",
            "store.breaker_cooldown",
            "dedup.lease",
            "dedup.retention",
            "dedup.wait_timeout",
            "async.claim_idle",
            "tolerance",
            "max_age",
            "backoff",
            "max_backoff",
            "retry_after_cap",
        ] {
            assert!(RANGES.iter().any(|(n, _, _)| *n == f), "{f}");
        }
        for (f, min, max) in RANGES {
            assert!(min <= max && *min >= MS, "{f}");
            // every bound converts to Redis milliseconds exactly, and an absurd value
            // saturates instead of wrapping
            assert_eq!(
                crate::store::redis::ms(*max),
                u64::try_from(max.as_millis()).expect("fits")
            );
        }
        assert_eq!(crate::store::redis::ms(Duration::MAX), u64::MAX);
        assert_eq!(
            crate::store::redis::ms(Duration::from_secs(u64::MAX)),
            u64::MAX
        );
        assert_eq!(crate::store::redis::ms(Duration::ZERO), 1);
    }

    #[test]
    fn out_of_range_durations_name_their_field() {
        let e = err("[dedup]\nretention = \"300000000000y\"\n");
        assert_eq!(e.field, "dedup.retention");
        assert!(
            e.message.contains("must be between 1ms and 365days"),
            "{}",
            e.message
        );
        assert_eq!(
            err("upstream_timeout = \"500us\"\n").field,
            "upstream_timeout"
        );
        assert_eq!(
            err("[store]\nurl = \"memory\"\ntimeout = \"2m\"\n").field,
            "store.timeout"
        );
        let route =
            "[[route]]\nname = \"r\"\npath = \"/r\"\nprovider = \"stripe\"\nsecrets = [\"s\"]\n";
        assert_eq!(
            err(&format!("{route}mode = \"async\"\nmax_age = \"400days\"\n")).field,
            "route[0].max_age"
        );
        assert_eq!(
            err(&format!("{route}tolerance = \"8days\"\n")).field,
            "route[0].tolerance"
        );
    }

    #[test]
    fn lease_and_retention_are_checked_against_the_timeouts() {
        let e = err("[store]\nurl = \"memory\"\ntimeout = \"1s\"\n[dedup]\nlease = \"1999ms\"\n");
        assert_eq!(e.field, "dedup.lease");
        assert!(
            Config::from_toml_with_env(
                "[store]\nurl = \"memory\"\ntimeout = \"1s\"\n[dedup]\nlease = \"2s\"\n",
                |_| None
            )
            .is_ok()
        );
        let e = err("upstream_timeout = \"10s\"\n[dedup]\nlease = \"30s\"\nretention = \"39s\"\n");
        assert_eq!(e.field, "dedup.retention");
        assert!(
            Config::from_toml_with_env(
                "upstream_timeout = \"10s\"\n[dedup]\nlease = \"30s\"\nretention = \"40s\"\n",
                |_| None
            )
            .is_ok()
        );
    }
}
