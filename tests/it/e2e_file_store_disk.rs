//! The `file:` store on a disk that fills (a real tmpfs, mounted by the test: it runs
//! as root, as the suite does here): from the first write the disk refuses, no
//! delivery is answered 2xx for a completion it did not write (503 + `Retry-After`),
//! new deliveries are refused `503`, `/readyz` and `/healthz` fail, the breaker opens,
//! `idemgate_store_journal_failed` reads 1 and the directory stays locked. A restart on
//! the same directory once the disk has room (what the liveness probe's restart does)
//! answers every delivery answered 2xx before, forwarding none of them again.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::common::*;

/// A small tmpfs, unmounted on drop.
struct SmallDisk {
    _parent: tempfile::TempDir,
    at: PathBuf,
}

impl SmallDisk {
    fn mount(size: &str) -> SmallDisk {
        let parent = tempfile::tempdir().unwrap();
        let at = parent.path().join("disk");
        std::fs::create_dir(&at).unwrap();
        let out = std::process::Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(&at)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "this test mounts a small tmpfs to fill it: it needs root (CAP_SYS_ADMIN): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        SmallDisk {
            _parent: parent,
            at,
        }
    }

    /// Writes a file until the disk refuses.
    fn fill(&self) -> PathBuf {
        let path = self.at.join("fill");
        let mut f = std::fs::File::create(&path).unwrap();
        let chunk = vec![0u8; 64 << 10];
        while f.write_all(&chunk).is_ok() {}
        let _ = f.sync_all();
        path
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.at)
            .status();
    }
}

fn sidecar(up: &Upstream, dir: &Path) -> SidecarBuilder {
    SidecarBuilder::new(&up.url(), &format!("file:{}", dir.display()))
        .route(RouteCfg::standard(ROUTE, PATH))
        .lease("2s")
}

fn forwarded(up: &Upstream, id: &str) -> usize {
    up.requests()
        .iter()
        .filter(|r| {
            r.header("idempotency-key")
                .is_some_and(|k| k.rsplit(':').next() == Some(id))
        })
        .count()
}

fn metric(metrics: &str, name: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Runs a second sidecar on the builder's directory; what it printed as it exited.
fn second_sidecar(builder: &SidecarBuilder) -> String {
    let cfg = tempfile::tempdir().unwrap();
    let listen = std::net::SocketAddr::from(([127, 0, 0, 1], free_port()));
    let admin = std::net::SocketAddr::from(([127, 0, 0, 1], free_port()));
    let path = cfg.path().join("idemgate.toml");
    std::fs::write(&path, builder.toml(listen, admin)).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_idemgate"))
        .args(["run", "--config"])
        .arg(&path)
        .env("IDEMGATE_LOG_FORMAT", "text")
        .output()
        .unwrap();
    assert!(!out.status.success());
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_answers_no_delivery_2xx_and_a_restart_forwards_none_again() {
    let disk = SmallDisk::mount("16m");
    let dir = disk.at.join("store");
    let up = Upstream::start().await;
    let builder = sidecar(&up, &dir);
    let mut sc = builder.clone().start().await;

    let mut answered_2xx = Vec::new();
    for _ in 0..3 {
        let d = Delivery::fresh();
        assert_eq!(sc.send(&d).await.status, 200);
        answered_2xx.push(d);
    }
    let fill = disk.fill();

    // Until the writer hits the full disk (the pages the journal already holds may
    // take a few more), then never a 2xx again.
    let mut refused = 0;
    let mut sent = 0;
    while refused < 20 {
        sent += 1;
        assert!(sent < 2_000, "the full disk never refused a write");
        let d = Delivery::fresh();
        let a = sc.send(&d).await;
        match a.status {
            200 if refused == 0 => answered_2xx.push(d),
            503 => {
                assert!(a.header("retry-after").is_some(), "{:?}", a.headers);
                refused += 1;
            }
            other => panic!(
                "{} answered {other} after {refused} refusals: {}",
                d.id,
                String::from_utf8_lossy(&a.body)
            ),
        }
    }
    eprintln!(
        "{} answered 2xx in all, {sent} sent after the fill",
        answered_2xx.len()
    );
    // A copy of a delivery written before is not answered from memory either.
    assert_eq!(sc.send(&answered_2xx[0]).await.status, 503);
    assert!(sc.stderr().contains("the write failed"), "{}", sc.stderr());
    assert_eq!(sc.get_admin("/readyz").await.0, 503);
    assert_eq!(sc.get_admin("/healthz").await.0, 503);
    let m = sc.metrics().await;
    assert_eq!(
        metric(&m, "idemgate_store_journal_failed"),
        Some(1.0),
        "{m}"
    );
    assert_eq!(metric(&m, "idemgate_store_circuit_open"), Some(1.0), "{m}");

    // The directory stays locked while this sidecar runs.
    let second = second_sidecar(&builder);
    assert!(
        second.contains("another process holds its lock"),
        "{second}"
    );

    // The disk has room again; the kubelet restarts the container on the same directory.
    std::fs::remove_file(fill).unwrap();
    sc.kill9();
    let sc = builder.clone().start().await;
    assert_eq!(sc.get_admin("/healthz").await.0, 200);
    for d in &answered_2xx {
        let a = sc.send(d).await;
        assert_eq!(
            a.status,
            200,
            "{}: {}",
            d.id,
            String::from_utf8_lossy(&a.body)
        );
        assert_eq!(forwarded(&up, &d.id), 1, "{} forwarded again", d.id);
    }
    let m = sc.metrics().await;
    assert_eq!(
        metric(&m, "idemgate_store_journal_failed"),
        Some(0.0),
        "{m}"
    );
}
