//! What an operator looks for in the delivery log: the words of `GET /admin/deliveries`,
//! `idemgate deliveries list`, the console's filter form and a replay job's filter,
//! parsed by one function ([`Filter::set`]) so that they cannot drift.

use crate::store::Status;
use crate::store::log::{LogEntry, LogOutcome};

/// The filter's words, in the order a URL carries them.
pub const WORDS: [&str; 8] = [
    "status",
    "outcome",
    "since",
    "until",
    "key_prefix",
    "upstream_status",
    "duplicates",
    "kept",
];

/// An upstream status to match: one (`503`) or a class (`5xx`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamStatus {
    Exact(u16),
    /// The hundreds digit: `5` for `5xx`.
    Class(u16),
}

impl UpstreamStatus {
    fn parse(s: &str) -> Option<UpstreamStatus> {
        let class = s
            .strip_suffix("xx")
            .or_else(|| s.strip_suffix("XX"))
            .and_then(|d| d.parse::<u16>().ok())
            .filter(|d| (1..=5).contains(d));
        match class {
            Some(c) => Some(UpstreamStatus::Class(c)),
            None => s
                .parse::<u16>()
                .ok()
                .filter(|n| (100..=599).contains(n))
                .map(UpstreamStatus::Exact),
        }
    }

    fn text(self) -> String {
        match self {
            UpstreamStatus::Exact(n) => n.to_string(),
            UpstreamStatus::Class(c) => format!("{c}xx"),
        }
    }

    fn matches(self, status: Option<u16>) -> bool {
        match (self, status) {
            (UpstreamStatus::Exact(n), Some(s)) => n == s,
            (UpstreamStatus::Class(c), Some(s)) => s / 100 == c,
            (_, None) => false,
        }
    }
}

/// A filter word with a value it does not take: a 400 that names the word.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadParam {
    pub name: String,
    pub message: String,
}

impl std::fmt::Display for BadParam {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.name, self.message)
    }
}

/// What a listing keeps besides its routes; empty means everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    pub status: Option<Status>,
    pub outcome: Option<LogOutcome>,
    /// First seen at or after (Unix ms).
    pub since: Option<u64>,
    /// First seen before (Unix ms).
    pub until: Option<u64>,
    pub key_prefix: Option<String>,
    pub upstream_status: Option<UpstreamStatus>,
    /// Answered at least one copy.
    pub duplicates: bool,
    /// Its request was kept (replayable).
    pub kept: bool,
}

impl Filter {
    /// Sets word `name` from its text `value` (an empty value sets nothing); `Ok(false)`
    /// when `name` is not a filter word.
    pub fn set(&mut self, name: &str, value: &str) -> Result<bool, BadParam> {
        if !WORDS.contains(&name) {
            return Ok(false);
        }
        let value = value.trim();
        if value.is_empty() {
            return Ok(true);
        }
        let bad = |message: &str| BadParam {
            name: name.to_string(),
            message: format!("`{value}` {message}"),
        };
        let millis = || {
            value
                .parse::<u64>()
                .map_err(|_| bad("is not Unix milliseconds"))
        };
        let yes = || match value {
            "true" => Ok(true),
            "false" => Ok(false),
            _ => Err(bad("is not true or false")),
        };
        match name {
            "status" => {
                self.status = Some(Status::parse(value).ok_or_else(|| {
                    bad("is not one of processing, completed, released, queued")
                })?)
            }
            "outcome" => {
                self.outcome = Some(LogOutcome::parse(value).ok_or_else(|| {
                    bad("is not one of forwarded, upstream_error, operator_replay, operator_replay_failed")
                })?)
            }
            "since" => self.since = Some(millis()?),
            "until" => self.until = Some(millis()?),
            "key_prefix" => self.key_prefix = Some(value.to_string()),
            "upstream_status" => {
                self.upstream_status = Some(
                    UpstreamStatus::parse(value)
                        .ok_or_else(|| bad("is not a status (503) or a class (5xx)"))?,
                )
            }
            "duplicates" => self.duplicates = yes()?,
            "kept" => self.kept = yes()?,
            _ => return Ok(false),
        }
        if let (Some(s), Some(u)) = (self.since, self.until)
            && s >= u
        {
            return Err(BadParam {
                name: name.to_string(),
                message: format!("since ({s}) must be before until ({u})"),
            });
        }
        Ok(true)
    }

    /// Whether `e` is one this filter keeps.
    pub fn matches(&self, e: &LogEntry) -> bool {
        self.status.is_none_or(|s| s == e.status)
            && self
                .outcome
                .is_none_or(|o| e.outcome.as_deref() == Some(o.as_str()))
            && self.since.is_none_or(|s| e.first_seen >= s)
            && self.until.is_none_or(|u| e.first_seen < u)
            && self
                .key_prefix
                .as_deref()
                .is_none_or(|p| e.key.starts_with(p))
            && self
                .upstream_status
                .is_none_or(|u| u.matches(e.upstream_status))
            && (!self.duplicates || e.duplicates > 0)
            && (!self.kept || e.has_request)
    }

    /// The words set, with their text, for a URL that keeps the filter.
    pub fn pairs(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        if let Some(s) = self.status {
            out.push(("status", s.as_str().to_string()));
        }
        if let Some(o) = self.outcome {
            out.push(("outcome", o.as_str().to_string()));
        }
        if let Some(s) = self.since {
            out.push(("since", s.to_string()));
        }
        if let Some(u) = self.until {
            out.push(("until", u.to_string()));
        }
        if let Some(p) = &self.key_prefix {
            out.push(("key_prefix", p.clone()));
        }
        if let Some(u) = self.upstream_status {
            out.push(("upstream_status", u.text()));
        }
        if self.duplicates {
            out.push(("duplicates", "true".into()));
        }
        if self.kept {
            out.push(("kept", "true".into()));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(pairs: &[(&str, &str)]) -> Result<Filter, BadParam> {
        let mut f = Filter::default();
        for (k, v) in pairs {
            assert!(f.set(k, v)?, "{k} is a filter word");
        }
        Ok(f)
    }

    #[test]
    fn every_word_parses_and_round_trips_through_its_pairs() {
        let f = parsed(&[
            ("status", "completed"),
            ("outcome", "upstream_error"),
            ("since", "1000"),
            ("until", "2000"),
            ("key_prefix", "evt_"),
            ("upstream_status", "5xx"),
            ("duplicates", "true"),
            ("kept", "true"),
        ])
        .unwrap();
        assert_eq!(f.upstream_status, Some(UpstreamStatus::Class(5)));
        let again: Vec<(&str, String)> = f.pairs();
        let back = parsed(
            &again
                .iter()
                .map(|(k, v)| (*k, v.as_str()))
                .collect::<Vec<_>>(),
        )
        .unwrap();
        assert_eq!(back, f);
        assert_eq!(again.len(), WORDS.len());
        assert_eq!(
            parsed(&[("upstream_status", "503")])
                .unwrap()
                .upstream_status,
            Some(UpstreamStatus::Exact(503))
        );
        assert_eq!(parsed(&[("since", "")]).unwrap(), Filter::default());
    }

    #[test]
    fn a_bad_value_names_its_word() {
        for (k, v) in [
            ("status", "done"),
            ("outcome", "ok"),
            ("since", "yesterday"),
            ("until", "-1"),
            ("upstream_status", "6xx"),
            ("upstream_status", "99"),
            ("upstream_status", "5x"),
            ("duplicates", "yes"),
            ("kept", "1"),
        ] {
            let e = parsed(&[(k, v)]).unwrap_err();
            assert_eq!(e.name, k, "{e}");
            assert!(e.message.contains(v), "{e}");
        }
        let e = parsed(&[("since", "2000"), ("until", "1000")]).unwrap_err();
        assert_eq!(e.name, "until");
        assert!(!Filter::default().set("route", "x").unwrap());
    }

    #[test]
    fn matches_checks_every_word() {
        let e = LogEntry {
            route: "r".into(),
            key: "evt_1".into(),
            status: Status::Completed,
            claimed: false,
            fingerprint: String::new(),
            attempts: 1,
            duplicates: 2,
            replays: 0,
            first_seen: 1500,
            last_seen: 1600,
            outcome: Some("forwarded".into()),
            upstream_status: Some(503),
            latency_ms: Some(1),
            response_status: None,
            has_request: true,
            request: None,
        };
        let yes = [
            ("since", "1500"),
            ("until", "1501"),
            ("key_prefix", "evt_"),
            ("upstream_status", "5xx"),
            ("upstream_status", "503"),
            ("duplicates", "true"),
            ("kept", "true"),
            ("outcome", "forwarded"),
            ("status", "completed"),
        ];
        for (k, v) in yes {
            assert!(parsed(&[(k, v)]).unwrap().matches(&e), "{k}={v}");
        }
        let no = [
            ("since", "1501"),
            ("until", "1500"),
            ("key_prefix", "msg_"),
            ("upstream_status", "4xx"),
            ("upstream_status", "502"),
            ("outcome", "upstream_error"),
            ("status", "released"),
        ];
        for (k, v) in no {
            assert!(!parsed(&[(k, v)]).unwrap().matches(&e), "{k}={v}");
        }
        let plain = LogEntry {
            duplicates: 0,
            has_request: false,
            ..e
        };
        assert!(!parsed(&[("duplicates", "true")]).unwrap().matches(&plain));
        assert!(!parsed(&[("kept", "true")]).unwrap().matches(&plain));
        assert!(parsed(&[("kept", "false")]).unwrap().matches(&plain));
    }
}
