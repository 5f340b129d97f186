//! `rediss://`: the store over TLS, against a real redis-server listening only on a
//! TLS port with a certificate from a CA made for the test. The sidecar trusts that CA
//! through `SSL_CERT_FILE` (read by rustls-native-certs), and refuses the server when
//! it does not: certificate verification is on.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA and a server certificate for 127.0.0.1 signed by it.
fn make_certs(dir: &Path) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=idemgate-test-ca",
        ],
    );
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=127.0.0.1",
        ],
    );
    std::fs::write(dir.join("san.ext"), "subjectAltName=IP:127.0.0.1\n").unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.pem",
            "-days",
            "2",
            "-extfile",
            "san.ext",
        ],
    );
}

struct TlsRedis {
    child: Child,
    port: u16,
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_tls_redis(dir: &Path) -> TlsRedis {
    let port = free_port();
    let p = |f: &str| dir.join(f).display().to_string();
    let child = Command::new("redis-server")
        .args([
            "--port",
            "0",
            "--tls-port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
        ])
        .args([
            "--tls-cert-file",
            &p("server.pem"),
            "--tls-key-file",
            &p("server.key"),
        ])
        .args([
            "--tls-ca-cert-file",
            &p("ca.pem"),
            "--tls-auth-clients",
            "no",
        ])
        .args([
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            &dir.display().to_string(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server");
    let end = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < end, "TLS redis-server did not listen");
        std::thread::sleep(Duration::from_millis(20));
    }
    TlsRedis { child, port }
}

fn tls_cli(dir: &Path, port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args([
            "--tls",
            "--cacert",
            &dir.join("ca.pem").display().to_string(),
        ])
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[tokio::test]
async fn deliveries_are_claimed_over_tls_and_an_untrusted_server_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path());
    let redis = start_tls_redis(dir.path());
    assert_eq!(tls_cli(dir.path(), redis.port, &["PING"]), "PONG");
    let url = format!("rediss://127.0.0.1:{}/0", redis.port);
    let upstream = Upstream::start().await;
    let ca = dir.path().join("ca.pem").display().to_string();

    let sidecar = SidecarBuilder::new(&upstream.url(), &url)
        .env("SSL_CERT_FILE", &ca)
        .start()
        .await;
    sidecar.wait_readyz(200, Duration::from_secs(10)).await;
    let d = Delivery::fresh();
    let first = sidecar.send(&d).await;
    assert_eq!(first.status, 200);
    assert!(!first.replayed());
    let copy = sidecar.send(&d).await;
    assert!(
        copy.replayed(),
        "the copy must be answered from the TLS store"
    );
    assert_eq!(upstream.count(), 1);
    let keys = tls_cli(dir.path(), redis.port, &["--scan"]);
    assert!(
        keys.contains(&d.id),
        "the claim lives in the TLS redis: {keys}"
    );

    // Without the test CA the server's certificate is not trusted: the store is
    // unreachable (503, not ready), and nothing is forwarded.
    let untrusting = SidecarBuilder::new(&upstream.url(), &url)
        .env("SSL_CERT_FILE", "/nonexistent/ca.pem")
        .start()
        .await;
    let a = untrusting.send(&Delivery::fresh()).await;
    a.assert_error(503, "store_unavailable");
    assert_eq!(untrusting.readyz().await, 503);
    assert_eq!(upstream.count(), 1);
}
