//! Helpers for the admin API, CLI and console tests.

use std::time::Duration;

use super::*;

/// The admin token the tests configure (through `IDEMGATE_ADMIN_TOKEN`).
pub const TOKEN: &str = "test-admin-token-0123456789";
/// A second, named token (through `admin_token = "ops=env:OPS_TOKEN"`).
pub const OPS_TOKEN: &str = "ops-token-abcdefghijklmnop";

/// A sidecar on `redis` with the admin API on and `keep_payload = true` on the route.
pub fn builder(upstream: &Upstream, redis: &RedisServer) -> SidecarBuilder {
    builder_on(upstream, &redis.url())
}

/// The same, on any store URL (a cluster, Sentinel).
pub fn builder_on(upstream: &Upstream, store_url: &str) -> SidecarBuilder {
    let mut route = RouteCfg::standard(ROUTE, PATH);
    route.extra = "keep_payload = true\n".into();
    SidecarBuilder::new(&upstream.url(), store_url)
        .route(route)
        .top("admin_token", "ops=env:OPS_TOKEN")
        .env("IDEMGATE_ADMIN_TOKEN", TOKEN)
        .env("OPS_TOKEN", OPS_TOKEN)
}

/// An admin API answer: status and JSON body (Null when not JSON).
pub struct ApiAnswer {
    pub status: u16,
    pub json: serde_json::Value,
    pub headers: reqwest::header::HeaderMap,
}

pub async fn api(sc: &Sidecar, method: &str, path: &str, token: Option<&str>) -> ApiAnswer {
    let m = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let mut rb = sc
        .client
        .request(m, sc.admin_url(path))
        .timeout(Duration::from_secs(20));
    if let Some(t) = token {
        rb = rb.bearer_auth(t);
    }
    let r = rb
        .send()
        .await
        .unwrap_or_else(|e| panic!("{method} {path}: {e:?}"));
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    let text = r.text().await.unwrap_or_default();
    ApiAnswer {
        status,
        json: serde_json::from_str(&text).unwrap_or(serde_json::Value::Null),
        headers,
    }
}

/// `/admin/deliveries/{route}/{key}` (the key percent-encoded).
pub fn delivery_path(route: &str, key: &str) -> String {
    format!(
        "/admin/deliveries/{}/{}",
        route,
        percent_encoding::utf8_percent_encode(key, percent_encoding::NON_ALPHANUMERIC)
    )
}

/// `idemgate <args> --config <the sidecar's config>`, as an operator runs it from a
/// shell next to a running sidecar (same Redis, same prefix).
pub struct Cli {
    pub dir: tempfile::TempDir,
}

impl Cli {
    pub fn new(sc: &Sidecar) -> Cli {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("idemgate.toml"), &sc.config).unwrap();
        Cli { dir }
    }

    pub fn run(&self, args: &[&str]) -> std::process::Output {
        std::process::Command::new(env!("CARGO_BIN_EXE_idemgate"))
            .args(args)
            .arg("--config")
            .arg(self.dir.path().join("idemgate.toml"))
            .env_remove("IDEMGATE_STORE_URL")
            .env("OPS_TOKEN", OPS_TOKEN)
            .env("USER", "tester")
            .output()
            .expect("run idemgate")
    }

    /// Runs `args`, which must succeed; its standard output.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "idemgate {args:?} failed: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// Runs `args` with `--json`, which must succeed; its output.
    pub fn json(&self, args: &[&str]) -> serde_json::Value {
        let mut a = args.to_vec();
        a.push("--json");
        serde_json::from_str(&self.ok(&a)).expect("JSON output")
    }
}
