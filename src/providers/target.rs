//! Where a route's deliveries go upstream: the one path-and-query rule the gate and
//! the queue worker share.

use super::Route;

impl Route {
    /// The path and query to request upstream: the route's `upstream_path` in place of
    /// the provider's `path` when set, the provider's `query` kept.
    pub fn upstream_target(&self, path: &str, query: Option<&str>) -> String {
        let path = self.upstream_path.as_deref().unwrap_or(path);
        match query {
            Some(q) => format!("{path}?{q}"),
            None => path.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;
    use crate::providers::build_route;

    fn route(extra: &str) -> super::Route {
        let text = format!(
            "[[route]]\nname = \"r\"\npath = \"/r\"\nprovider = \"github\"\nsecrets = [\"s\"]\n{extra}\n"
        );
        let c = Config::from_toml_with_env(&text, |_| None).unwrap();
        build_route(&c.routes[0], &c).unwrap()
    }

    #[test]
    fn the_providers_path_and_query_unless_the_route_sets_a_path() {
        let plain = route("");
        assert_eq!(plain.upstream_target("/r", None), "/r");
        assert_eq!(plain.upstream_target("/r", Some("a=1")), "/r?a=1");
        let moved = route("upstream_path = \"/hooks/in\"");
        assert_eq!(moved.upstream_target("/r", None), "/hooks/in");
        assert_eq!(moved.upstream_target("/r", Some("a=1")), "/hooks/in?a=1");
    }
}
