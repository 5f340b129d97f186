//! Where a value comes from besides the file: the `IDEMGATE_*` environment overrides,
//! `env:`/`file:` secret sources, and the admin tokens (`IDEMGATE_ADMIN_TOKEN` and the
//! `admin_token` entries).

use super::parse::split_key_id;
use super::raw::OneOrMany;
use super::{ConfigError, OPERATOR_TOKEN_MIN_LEN, OperatorToken, Secret, redact_source};

/// A top-level setting from its `IDEMGATE_*` variable (when set and non-empty), else
/// the file's value or the default; with the field an error names (the variable, when
/// the value came from it).
pub(super) fn overridden(
    env: &impl Fn(&str) -> Option<String>,
    env_name: &str,
    name: &str,
    file: Option<String>,
    default: &str,
) -> (String, String) {
    match env(env_name).filter(|v| !v.is_empty()) {
        Some(v) => (env_name.to_string(), v),
        None => (
            name.to_string(),
            file.unwrap_or_else(|| default.to_string()),
        ),
    }
}

/// `log` (`IDEMGATE_LOG` over it, default `info`), validated as a `tracing` filter.
pub(super) fn log_filter(
    env: &impl Fn(&str) -> Option<String>,
    file: Option<String>,
) -> Result<super::LogFilter, ConfigError> {
    let (field, filter) = overridden(env, "IDEMGATE_LOG", "log", file.clone(), "info");
    if filter.trim().is_empty() {
        return Err(ConfigError::new(&field, "must name a level, e.g. \"info\""));
    }
    tracing_subscriber::EnvFilter::try_new(&filter)
        .map_err(|e| ConfigError::new(&field, format!("`{filter}` is not a log filter: {e}")))?;
    Ok(super::LogFilter {
        filter,
        field,
        in_file: file,
    })
}

/// Resolves `env:NAME`, `file:/path` or a literal into the secret's bytes.
pub fn resolve_secret(
    field: &str,
    source: &str,
    env: &impl Fn(&str) -> Option<String>,
) -> Result<Secret, ConfigError> {
    let value = if let Some(name) = source.strip_prefix("env:") {
        env(name).ok_or_else(|| {
            ConfigError::new(field, format!("environment variable {name} is not set"))
        })?
    } else if let Some(path) = source.strip_prefix("file:") {
        std::fs::read_to_string(path)
            .map_err(|e| ConfigError::new(field, format!("cannot read secret file {path}: {e}")))?
            .trim()
            .to_string()
    } else {
        source.to_string()
    };
    if value.is_empty() {
        return Err(ConfigError::new(
            field,
            format!("the secret from {} is empty", redact_source(source)),
        ));
    }
    Ok(Secret {
        source: source.to_string(),
        value: value.into_bytes(),
        id: None,
    })
}

/// The admin tokens: `IDEMGATE_ADMIN_TOKEN` (named `admin`) and the `admin_token`
/// entries, each `[name=]source` with source `env:X`, `file:/path` or a literal.
pub(super) fn operator_tokens(
    raw: Option<OneOrMany>,
    env: &impl Fn(&str) -> Option<String>,
) -> Result<Vec<OperatorToken>, ConfigError> {
    let entries = match raw {
        None => vec![],
        Some(OneOrMany::One(s)) => vec![s],
        Some(OneOrMany::Many(v)) => v,
    };
    let mut out = Vec::new();
    if env("IDEMGATE_ADMIN_TOKEN").is_some_and(|v| !v.is_empty()) {
        entries_push(
            &mut out,
            "IDEMGATE_ADMIN_TOKEN",
            "admin",
            "env:IDEMGATE_ADMIN_TOKEN",
            env,
        )?;
    }
    for (i, e) in entries.iter().enumerate() {
        let field = format!("admin_token[{i}]");
        let (name, source) = match split_key_id(e) {
            (Some(n), s) => (n, s),
            _ => ("admin", e.as_str()),
        };
        if out.iter().any(|t: &OperatorToken| t.name == name) {
            return Err(ConfigError::new(
                field,
                format!("two admin tokens are named `{name}`: write them `name=source`"),
            ));
        }
        entries_push(&mut out, &field, name, source, env)?;
    }
    Ok(out)
}

fn entries_push(
    out: &mut Vec<OperatorToken>,
    field: &str,
    name: &str,
    source: &str,
    env: &impl Fn(&str) -> Option<String>,
) -> Result<(), ConfigError> {
    let secret = resolve_secret(field, source, env)?;
    if secret.value.len() < OPERATOR_TOKEN_MIN_LEN {
        return Err(ConfigError::new(
            field,
            format!("an admin token must be at least {OPERATOR_TOKEN_MIN_LEN} characters"),
        ));
    }
    out.push(OperatorToken {
        name: name.to_string(),
        secret,
    });
    Ok(())
}
