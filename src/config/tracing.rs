//! `[tracing]`: OpenTelemetry export (docs/tracing.md), with the standard `OTEL_*`
//! variables overriding the file, as every OpenTelemetry SDK reads them.

use http::Uri;
use serde::Deserialize;

use super::ConfigError;

/// `[tracing]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTracing {
    pub(super) otlp_endpoint: Option<String>,
    pub(super) service_name: Option<String>,
    pub(super) sample_ratio: Option<f64>,
    pub(super) start_traces: Option<bool>,
}

/// Which traces are recorded (`OTEL_TRACES_SAMPLER`'s vocabulary).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Sampler {
    AlwaysOn,
    AlwaysOff,
    /// This fraction of trace ids, whatever the caller decided.
    Ratio(f64),
    /// The caller's `sampled` flag when the request has a parent; the root sampler
    /// (never itself parent-based) otherwise.
    ParentBased(Root),
}

/// A parent-based sampler's decision for a trace idemgate starts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Root {
    AlwaysOn,
    AlwaysOff,
    Ratio(f64),
}

/// The validated `[tracing]`: off unless an endpoint is set.
#[derive(Debug, Clone, PartialEq)]
pub struct TracingConfig {
    /// Where spans are posted (the base URL with `/v1/traces` appended, or
    /// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` as given); `None`: tracing is off.
    pub traces_url: Option<Uri>,
    pub service_name: String,
    pub sampler: Sampler,
    /// Whether a request without `traceparent` starts a trace.
    pub start_traces: bool,
}

impl Default for TracingConfig {
    fn default() -> Self {
        TracingConfig {
            traces_url: None,
            service_name: "idemgate".to_string(),
            sampler: Sampler::ParentBased(Root::AlwaysOn),
            start_traces: false,
        }
    }
}

/// Reads `[tracing]` and the `OTEL_*` variables (set and non-empty ones win).
pub(super) fn tracing(
    raw: Option<RawTracing>,
    env: &impl Fn(&str) -> Option<String>,
) -> Result<TracingConfig, ConfigError> {
    let raw = raw.unwrap_or_default();
    let var = |name: &str| {
        env(name)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    };
    let defaults = TracingConfig::default();

    let ratio = match raw.sample_ratio {
        Some(r) if !(0.0..=1.0).contains(&r) => {
            return Err(ConfigError::new(
                "tracing.sample_ratio",
                format!("must be between 0.0 and 1.0, not {r}"),
            ));
        }
        Some(r) => r,
        None => 1.0,
    };
    let sampler = match var("OTEL_TRACES_SAMPLER") {
        Some(name) => parse_sampler(&name, var("OTEL_TRACES_SAMPLER_ARG"))?,
        None => Sampler::ParentBased(Root::Ratio(ratio)),
    };

    let traces_url = match var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") {
        Some(url) => Some(endpoint("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", &url, false)?),
        None => match var("OTEL_EXPORTER_OTLP_ENDPOINT") {
            Some(url) => Some(endpoint("OTEL_EXPORTER_OTLP_ENDPOINT", &url, true)?),
            None => match raw.otlp_endpoint.filter(|v| !v.trim().is_empty()) {
                Some(url) => Some(endpoint("tracing.otlp_endpoint", url.trim(), true)?),
                None => None,
            },
        },
    };
    for name in [
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
    ] {
        if let Some(p) = var(name) {
            if p != "http/protobuf" {
                return Err(ConfigError::new(
                    name,
                    format!("{p:?} is not supported: idemgate exports OTLP over http/protobuf"),
                ));
            }
            break;
        }
    }
    let off = var("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"))
        || var("OTEL_TRACES_EXPORTER").is_some_and(|v| v == "none");

    let service_name = match var("OTEL_SERVICE_NAME").or(raw.service_name) {
        Some(n) if n.trim().is_empty() => {
            return Err(ConfigError::new(
                "tracing.service_name",
                "must not be empty",
            ));
        }
        Some(n) => n,
        None => defaults.service_name,
    };
    Ok(TracingConfig {
        traces_url: if off { None } else { traces_url },
        service_name,
        sampler,
        start_traces: raw.start_traces.unwrap_or(defaults.start_traces),
    })
}

/// An OTLP/HTTP endpoint: `http://host:port[/path]`; with `base`, `/v1/traces` is
/// appended to its path (the signal path the OTLP spec defines).
fn endpoint(field: &str, url: &str, base: bool) -> Result<Uri, ConfigError> {
    let uri: Uri = url
        .parse()
        .map_err(|e| ConfigError::new(field, format!("{url:?} is not a URL: {e}")))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => {
            return Err(ConfigError::new(
                field,
                "https is not supported: send to a collector over http (on the node or in the pod)",
            ));
        }
        _ => {
            return Err(ConfigError::new(
                field,
                format!("{url:?} must be an http:// URL"),
            ));
        }
    }
    if uri.authority().is_none() || uri.query().is_some() {
        return Err(ConfigError::new(
            field,
            format!("{url:?} must be http://host:port[/path], without a query"),
        ));
    }
    if !base {
        return Ok(uri);
    }
    let full = format!("{}/v1/traces", url.trim_end_matches('/'));
    full.parse()
        .map_err(|e| ConfigError::new(field, format!("{full:?} is not a URL: {e}")))
}

/// `OTEL_TRACES_SAMPLER` (+ `OTEL_TRACES_SAMPLER_ARG` for the ratio ones).
fn parse_sampler(name: &str, arg: Option<String>) -> Result<Sampler, ConfigError> {
    let ratio = || -> Result<f64, ConfigError> {
        match arg.as_deref() {
            None => Ok(1.0),
            Some(a) => match a.parse::<f64>() {
                Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
                _ => Err(ConfigError::new(
                    "OTEL_TRACES_SAMPLER_ARG",
                    format!("{a:?} is not a ratio between 0.0 and 1.0"),
                )),
            },
        }
    };
    Ok(match name {
        "always_on" => Sampler::AlwaysOn,
        "always_off" => Sampler::AlwaysOff,
        "traceidratio" => Sampler::Ratio(ratio()?),
        "parentbased_always_on" => Sampler::ParentBased(Root::AlwaysOn),
        "parentbased_always_off" => Sampler::ParentBased(Root::AlwaysOff),
        "parentbased_traceidratio" => Sampler::ParentBased(Root::Ratio(ratio()?)),
        other => {
            return Err(ConfigError::new(
                "OTEL_TRACES_SAMPLER",
                format!(
                    "{other:?} is not one of always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off, parentbased_traceidratio"
                ),
            ));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(raw: RawTracing, vars: &[(&str, &str)]) -> Result<TracingConfig, ConfigError> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        tracing(Some(raw), &|n: &str| {
            vars.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone())
        })
    }

    #[test]
    fn off_by_default() {
        let c = read(RawTracing::default(), &[]).unwrap();
        assert_eq!(
            c,
            TracingConfig {
                sampler: Sampler::ParentBased(Root::Ratio(1.0)),
                ..TracingConfig::default()
            }
        );
    }

    #[test]
    fn the_endpoint_is_a_base_url_unless_it_is_the_traces_one() {
        let raw = || RawTracing {
            otlp_endpoint: Some("http://127.0.0.1:4318/".into()),
            ..Default::default()
        };
        let c = read(raw(), &[]).unwrap();
        assert_eq!(c.traces_url.unwrap(), "http://127.0.0.1:4318/v1/traces");
        let c = read(
            raw(),
            &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318/otlp")],
        )
        .unwrap();
        assert_eq!(c.traces_url.unwrap(), "http://c:4318/otlp/v1/traces");
        let c = read(
            raw(),
            &[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://c:9/x")],
        )
        .unwrap();
        assert_eq!(c.traces_url.unwrap(), "http://c:9/x");
        let c = read(raw(), &[("OTEL_SDK_DISABLED", "true")]).unwrap();
        assert_eq!(c.traces_url, None);
        let c = read(raw(), &[("OTEL_TRACES_EXPORTER", "none")]).unwrap();
        assert_eq!(c.traces_url, None);
    }

    #[test]
    fn each_mistake_names_its_field() {
        type Vars = Vec<(&'static str, &'static str)>;
        let cases: Vec<(RawTracing, Vars, &str)> = vec![
            (
                RawTracing {
                    sample_ratio: Some(1.5),
                    ..Default::default()
                },
                vec![],
                "tracing.sample_ratio",
            ),
            (
                RawTracing {
                    otlp_endpoint: Some("https://collector:4318".into()),
                    ..Default::default()
                },
                vec![],
                "tracing.otlp_endpoint",
            ),
            (
                RawTracing {
                    otlp_endpoint: Some("collector:4318".into()),
                    ..Default::default()
                },
                vec![],
                "tracing.otlp_endpoint",
            ),
            (
                RawTracing::default(),
                vec![("OTEL_TRACES_SAMPLER", "sometimes")],
                "OTEL_TRACES_SAMPLER",
            ),
            (
                RawTracing::default(),
                vec![
                    ("OTEL_TRACES_SAMPLER", "traceidratio"),
                    ("OTEL_TRACES_SAMPLER_ARG", "2"),
                ],
                "OTEL_TRACES_SAMPLER_ARG",
            ),
            (
                RawTracing::default(),
                vec![("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")],
                "OTEL_EXPORTER_OTLP_PROTOCOL",
            ),
            (
                RawTracing {
                    service_name: Some(" ".into()),
                    ..Default::default()
                },
                vec![],
                "tracing.service_name",
            ),
        ];
        for (raw, vars, field) in cases {
            let e = read(raw, &vars).unwrap_err();
            assert_eq!(e.field, field, "{e}");
        }
    }

    #[test]
    fn otel_variables_override_the_file() {
        let raw = RawTracing {
            service_name: Some("file".into()),
            sample_ratio: Some(0.5),
            start_traces: Some(true),
            ..Default::default()
        };
        let c = read(
            raw,
            &[
                ("OTEL_SERVICE_NAME", "env"),
                ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
                ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
            ],
        )
        .unwrap();
        assert_eq!(c.service_name, "env");
        assert_eq!(c.sampler, Sampler::ParentBased(Root::Ratio(0.25)));
        assert!(c.start_traces);
    }
}
