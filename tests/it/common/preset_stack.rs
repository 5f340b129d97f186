//! One provider route in front of a recording upstream, on its own redis-server, and
//! the three verdicts every provider test checks: forwarded once, replayed, refused.
//! Shared by e2e_providers, e2e_presets_a and e2e_presets_b.

use base64::Engine as _;

use super::*;

/// What the recording upstream answers a forwarded delivery.
pub const UPSTREAM_OK: &[u8] = br#"{"ok":true}"#;

/// The JSON content type every JSON-bodied provider sends.
pub fn json_h() -> (&'static str, String) {
    ("content-type", "application/json".to_string())
}

/// Standard base64, as the signers exchange bodies.
pub fn b64(b: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(b)
}

/// A route `name` at `/hooks/{name}` with `provider`'s preset; `extra` is TOML lines.
pub fn route(name: &str, provider: &str, secrets: &[&str], extra: &str) -> RouteCfg {
    RouteCfg {
        name: name.into(),
        path: format!("/hooks/{name}"),
        provider: provider.into(),
        secrets: secrets.iter().map(|s| s.to_string()).collect(),
        tolerance: None,
        key: None,
        extra: extra.into(),
    }
}

/// The sidecar, its upstream and its redis-server, kept alive together.
pub struct Stack {
    pub sidecar: Sidecar,
    pub upstream: Upstream,
    pub redis: RedisServer,
    /// The route's path.
    pub path: String,
}

impl Stack {
    /// Starts the stack with idemgate's default retention (72h): some presets' windows
    /// (Zoom 90m, SendGrid 24h) need more than the harness's 1h.
    pub async fn start(r: RouteCfg) -> Stack {
        let redis = RedisServer::start_new();
        let upstream = Upstream::start().await;
        let path = r.path.clone();
        let sidecar = SidecarBuilder::new(&upstream.url(), &redis.url())
            .dedup("retention", "72h")
            .route(r)
            .start()
            .await;
        Stack {
            sidecar,
            upstream,
            redis,
            path,
        }
    }

    /// Sends one request to the sidecar as given.
    pub async fn send(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, String)],
        body: &[u8],
    ) -> Answer {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut rb = self.sidecar.client.request(method, self.sidecar.url(path));
        for (k, v) in headers {
            rb = rb.header(*k, v.as_str());
        }
        let start = std::time::Instant::now();
        let resp = rb.body(body.to_vec()).send().await.expect("HTTP exchange");
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let body = resp.bytes().await.unwrap().to_vec();
        Answer {
            status,
            headers,
            body,
            elapsed: start.elapsed(),
        }
    }

    pub async fn post(&self, path: &str, headers: &[(&str, String)], body: &[u8]) -> Answer {
        self.send("POST", path, headers, body).await
    }

    /// A first delivery: the upstream's answer; the upstream got the body byte for byte
    /// with the route's idempotency key.
    pub fn forwarded(&self, a: &Answer, count: usize, body: &[u8], idem: &str) {
        assert_eq!(a.status, 200, "expected forwarding, got {a:?} {}", a.text());
        assert!(!a.replayed());
        assert_eq!(self.upstream.count(), count, "upstream count");
        let last = self.upstream.last();
        assert_eq!(&last.body[..], body, "forwarded body byte for byte");
        assert_eq!(last.header("idempotency-key").as_deref(), Some(idem));
    }

    /// A duplicate: the stored answer (the upstream's `UPSTREAM_OK`), marked replayed,
    /// nothing forwarded.
    pub fn replayed(&self, a: &Answer, count: usize) {
        self.replayed_with(a, count, UPSTREAM_OK);
    }

    /// A duplicate answered with `stored_body`, marked replayed, nothing forwarded.
    pub fn replayed_with(&self, a: &Answer, count: usize, stored_body: &[u8]) {
        assert_eq!(a.status, 200, "expected a replay, got {a:?} {}", a.text());
        assert!(a.replayed(), "answer not marked replayed: {a:?}");
        assert_eq!(a.body, stored_body);
        assert_eq!(self.upstream.count(), count, "a duplicate is not forwarded");
    }

    /// Refused with `status` (401 invalid_signature, 403 forbidden, else bad_request),
    /// nothing forwarded.
    pub fn refused(&self, a: &Answer, status: u16, count: usize) {
        let code = match status {
            401 => "invalid_signature",
            403 => "forbidden",
            _ => "bad_request",
        };
        a.assert_error(status, code);
        assert_eq!(self.upstream.count(), count, "a refusal is not forwarded");
    }
}
