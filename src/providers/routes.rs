//! Every configured route, built once at start from the configuration and shared by
//! the gate (sync and async routes) and the queue (async routes).
//!
//! Building a route is also its validation: a provider's own checks (secret formats,
//! tolerance rules, key sources) and the retention-vs-tolerance rule are reported here,
//! with the field's name, by every entry point that loads a configuration.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use super::{KeySource, Route, build_route};
use crate::config::{Config, ConfigError, RouteMode};

/// The built routes, by name.
pub struct Routes {
    by_name: HashMap<String, Arc<Route>>,
    /// Each ordered async route's `order_key` source.
    orders: HashMap<String, KeySource>,
}

impl Routes {
    /// Builds every route of `config`; the first problem names its field.
    pub fn build(config: &Config) -> Result<Routes, ConfigError> {
        let mut by_name = HashMap::with_capacity(config.routes.len());
        let mut orders = HashMap::new();
        for (i, r) in config.routes.iter().enumerate() {
            let route = build_route(r, config)
                .map_err(|e| ConfigError::new(format!("route[{i}].{}", e.field), e.message))?;
            // The route's own retention when it sets one, else `[dedup]`'s.
            if let Some(tol) = route.tolerance()
                && route.dedup.retention <= tol
            {
                let field = match r.dedup.retention {
                    Some(_) => format!("route[{i}].retention"),
                    None => "dedup.retention".to_string(),
                };
                return Err(ConfigError::new(
                    field,
                    format!(
                        "must be longer than route `{}`'s tolerance ({}): otherwise a replayed \
                         request inside the window could find its key forgotten",
                        r.name,
                        humantime::format_duration(tol)
                    ),
                ));
            }
            if let RouteMode::Async(a) = &r.mode
                && let Some(text) = &a.order_key
            {
                let source = KeySource::parse(text)
                    .map_err(|m| ConfigError::new(format!("route[{i}].order_key"), m))?;
                orders.insert(r.name.clone(), source);
            }
            by_name.insert(r.name.clone(), Arc::new(route));
        }
        Ok(Routes { by_name, orders })
    }

    /// Where the async route `name` reads its order value; `None`: unordered.
    pub fn order_key(&self, name: &str) -> Option<&KeySource> {
        self.orders.get(name)
    }

    /// The route configured as `config.routes[i]`, for the gate and the queue; an
    /// error when these routes were built from another configuration.
    pub fn route(&self, config: &Config, i: usize) -> Result<Arc<Route>, ConfigError> {
        let name = &config.routes[i].name;
        self.by_name.get(name).cloned().ok_or_else(|| {
            ConfigError::new(
                format!("route[{i}].name"),
                format!("`{name}` was not built"),
            )
        })
    }
}

/// Loads the configuration (file and environment) and builds its routes: what
/// `check-config`, the sidecar and the operator's CLI all do before anything else.
pub fn load(path: Option<&Path>) -> Result<(Config, Routes), ConfigError> {
    let config = Config::load(path)?;
    let routes = Routes::build(&config)?;
    Ok((config, routes))
}

/// `Config::from_toml_with_env` and `Routes::build` in one step, for tests and tools
/// that start from TOML text.
pub fn from_toml_with_env(
    text: &str,
    env: impl Fn(&str) -> Option<String>,
) -> Result<(Config, Routes), ConfigError> {
    let config = Config::from_toml_with_env(text, env)?;
    let routes = Routes::build(&config)?;
    Ok((config, routes))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROUTE: &str = r#"
[[route]]
name = "wh"
path = "/webhooks/wh"
provider = "standard"
secrets = ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]
"#;

    fn err(text: &str) -> ConfigError {
        match from_toml_with_env(text, |_| None) {
            Ok(_) => panic!("accepted: {text}"),
            Err(e) => e,
        }
    }

    #[test]
    fn route_errors_name_the_route_field() {
        let two_paths = format!(
            "{ROUTE}{}",
            ROUTE.replace("name = \"wh\"", "name = \"wh2\"")
        );
        assert_eq!(err(&two_paths).field, "route[1].path");
        let no_secret = ROUTE.replace(
            "secrets = [\"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"]",
            "secrets = []",
        );
        assert_eq!(err(&no_secret).field, "route[0].secrets");
        let env_secret = ROUTE.replace(
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            "env:IDEMGATE_TEST_UNSET",
        );
        let e = err(&env_secret);
        assert_eq!(e.field, "route[0].secrets[0]");
        assert!(e.message.contains("IDEMGATE_TEST_UNSET"));
        let file_secret = ROUTE.replace(
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            "file:/nonexistent/secret",
        );
        assert_eq!(err(&file_secret).field, "route[0].secrets[0]");
        let bad_name = ROUTE.replace("name = \"wh\"", "name = \"a b{c}\"");
        assert_eq!(err(&bad_name).field, "route[0].name");
        let bad_provider =
            ROUTE.replace("provider = \"standard\"", "provider = \"carrier-pigeon\"");
        assert_eq!(err(&bad_provider).field, "route[0].provider");
    }

    #[test]
    fn retention_must_exceed_every_tolerance() {
        let text = format!("[dedup]\nretention = \"5m\"\n{ROUTE}");
        assert_eq!(err(&text).field, "dedup.retention");
        let text = format!("[dedup]\nretention = \"5m1s\"\n{ROUTE}");
        assert!(from_toml_with_env(&text, |_| None).is_ok());
    }

    /// `ROUTE` under another name and path.
    fn named(name: &str) -> String {
        ROUTE
            .replace("name = \"wh\"", &format!("name = \"{name}\""))
            .replace("/webhooks/wh\"", &format!("/webhooks/{name}\""))
    }

    #[test]
    fn a_routes_own_retention_must_exceed_its_tolerance() {
        // The third route (`route[2]`) sets a retention inside its 5m window.
        let two = format!("{ROUTE}{}", named("wh2"));
        let text = format!("{two}{}retention = \"5m\"\n", named("wh3"));
        let e = err(&text);
        assert_eq!(e.field, "route[2].retention");
        assert!(e.message.contains("route `wh3`'s tolerance (5m)"), "{e}");
        // Its own retention, long enough, stands beside a default that is too short
        // for a route that inherits it (that one is named as `dedup.retention`).
        let own = format!("{}retention = \"1h\"\n", named("wh3"));
        let text = format!("[dedup]\nretention = \"5m\"\n{own}");
        assert!(from_toml_with_env(&text, |_| None).is_ok());
        let text = format!("[dedup]\nretention = \"5m\"\n{own}{ROUTE}");
        assert_eq!(err(&text).field, "dedup.retention");
        // A longer tolerance needs a longer retention on that route only.
        let text = format!("{}tolerance = \"2h\"\nretention = \"2h\"\n", ROUTE);
        assert_eq!(err(&text).field, "route[0].retention");
    }

    #[test]
    fn a_built_route_holds_its_effective_dedup_settings() {
        let text = format!(
            "[dedup]\nin_flight = \"wait\"\n{ROUTE}lease = \"45s\"\nretention = \"7d\"\n{}",
            named("wh2")
        );
        let (config, routes) = from_toml_with_env(&text, |_| None).unwrap();
        let own = routes.route(&config, 0).unwrap();
        assert_eq!(own.dedup.lease, std::time::Duration::from_secs(45));
        assert_eq!(
            own.dedup.retention,
            std::time::Duration::from_secs(7 * 86400)
        );
        assert_eq!(own.dedup.in_flight, crate::config::InFlightPolicy::Wait);
        let inherits = routes.route(&config, 1).unwrap();
        assert_eq!(inherits.dedup, config.dedup);
    }

    #[test]
    fn the_per_route_example_in_docs_providers_loads_as_described() {
        let doc = include_str!("../../docs/providers.md");
        let section = &doc[doc
            .find("## Dedup settings per route")
            .expect("the section")..];
        let start = section.find("```toml\n").expect("its example") + "```toml\n".len();
        let example = &section[start..start + section[start..].find("```").unwrap()];
        let env = |name: &str| {
            name.ends_with("_SECRET")
                .then(|| format!("whsec_test_{name}"))
        };
        let (config, routes) = from_toml_with_env(example, env).expect("the example loads");
        let day = std::time::Duration::from_secs(24 * 3600);
        let payments = routes.route(&config, 0).unwrap();
        assert_eq!(payments.dedup.retention, day * 4);
        assert_eq!(payments.dedup.lease, std::time::Duration::from_secs(45));
        let chat = routes.route(&config, 1).unwrap();
        assert_eq!(chat.dedup.retention, std::time::Duration::from_secs(3600));
        assert_eq!(chat.dedup.in_flight, crate::config::InFlightPolicy::Wait);
        assert_eq!(chat.dedup.wait_timeout, std::time::Duration::from_secs(2));
        assert_eq!(config.dedup.retention, day * 3);
    }

    #[test]
    fn an_order_key_must_be_a_key_source() {
        let text = format!("{ROUTE}mode = \"async\"\norder_key = \"body:/x\"\n");
        assert_eq!(err(&text).field, "route[0].order_key");
        let ok = text.replace("body:/x", "json:/data/object/id");
        let (_, routes) = from_toml_with_env(&ok, |_| None).unwrap();
        assert!(routes.order_key("wh").is_some());
    }
}
