//! The harness of the injector's tests (tests/it/e2e_injector.rs): a running
//! `idemgate injector` with certificates in a Secret volume's layout, the Python client
//! that calls it (tests/injector/review.py), the pods, and `idemgate inject` to compare.

use std::io::Write;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::free_port;

pub const IMAGE: &str = "registry.example.com/idemgate:test";

pub fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/injector")
        .join(name)
}

/// Writes a fresh CA and serving certificate into `dir` (replacing what is there).
pub fn make_certs(dir: &Path) {
    let out = Command::new("python3")
        .arg(script("certs.py"))
        .arg(dir)
        .output()
        .expect("run certs.py");
    assert!(
        out.status.success(),
        "certs.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A running `idemgate injector` with its own certificates; killed on drop. The
/// certificates sit in a Secret volume's layout as the kubelet writes it: the files are
/// symlinks through `..data`, itself a symlink swapped to a new directory at each
/// update.
pub struct Injector {
    pub child: Child,
    pub port: u16,
    pub dir: tempfile::TempDir,
    versions: usize,
}

impl Injector {
    pub fn start(extra: &[&str]) -> Injector {
        let dir = tempfile::tempdir().expect("tempdir");
        for f in ["ca.pem", "cert.pem", "key.pem"] {
            std::os::unix::fs::symlink(format!("..data/{f}"), dir.path().join(f)).unwrap();
        }
        let port = free_port();
        let log = std::fs::File::create(dir.path().join("injector.log")).unwrap();
        let mut injector = Injector {
            child: Command::new("true").spawn().unwrap(),
            port,
            dir,
            versions: 0,
        };
        injector.rotate();
        injector.child = Command::new(env!("CARGO_BIN_EXE_idemgate"))
            .arg("injector")
            .arg("--tls-cert")
            .arg(injector.dir.path().join("cert.pem"))
            .arg("--tls-key")
            .arg(injector.dir.path().join("key.pem"))
            .args(["--listen", &format!("127.0.0.1:{port}"), "--image", IMAGE])
            .args(extra)
            .env("IDEMGATE_LOG_FORMAT", "text")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn idemgate injector");
        let started = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "the injector did not listen"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        injector
    }

    /// A new CA and certificate, put in place as the kubelet updates a Secret volume:
    /// written into a new directory, then `..data` swapped to it in one rename.
    pub fn rotate(&mut self) {
        self.versions += 1;
        let version = format!("..v{}", self.versions);
        make_certs(&self.dir.path().join(&version));
        let tmp = self.dir.path().join("..data_tmp");
        std::os::unix::fs::symlink(&version, &tmp).unwrap();
        std::fs::rename(&tmp, self.dir.path().join("..data")).unwrap();
    }

    /// What the injector has logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("injector.log")).unwrap_or_default()
    }

    pub fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// Runs tests/injector/review.py against `path` with `args` after the CA.
    pub fn call(&self, path: &str, ca: &Path, args: &[&str]) -> Result<Value, String> {
        let out = Command::new("python3")
            .arg(script("review.py"))
            .arg(format!("https://127.0.0.1:{}{path}", self.port))
            .arg(ca)
            .args(args)
            .output()
            .expect("run review.py");
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        Ok(serde_json::from_slice(&out.stdout).expect("review.py prints JSON"))
    }

    /// POSTs `body` to /mutate; the result as review.py reports it.
    pub fn post(&self, body: &[u8]) -> Value {
        let mut f = tempfile::NamedTempFile::new().expect("temp file");
        f.write_all(body).expect("write body");
        let path = f.path().to_str().expect("UTF-8 path").to_string();
        self.call("/mutate", &self.ca(), &[&path])
            .expect("review.py")
    }

    pub fn review(&self, review: &Value) -> Value {
        self.post(&serde_json::to_vec(review).unwrap())
    }
}

impl Drop for Injector {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The AdmissionReview the API server sends for creating `pod` in `shop`.
pub fn admission(uid: &str, pod: &Value) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "shop",
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
            "object": pod,
            "oldObject": null,
            "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}
        }
    })
}

/// A Pod created by hand: a name, one container, one port.
pub fn plain_pod() -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "orders", "namespace": "shop", "labels": {"app": "orders"}},
        "spec": {"containers": [{"name": "orders", "image": "orders:1",
                                 "ports": [{"containerPort": 3000}]}]}
    })
}

/// A Pod as a Deployment's ReplicaSet creates it: no name, a generateName, an owner,
/// the API server's defaults filled in, two ports (so the annotation must pick one)
/// and the per-pod overrides.
pub fn replicaset_pod() -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "payments-7d9c5b8f6-",
            "namespace": "shop",
            "labels": {"app": "payments", "pod-template-hash": "7d9c5b8f6"},
            "annotations": {
                "idemgate.dev/inject": "enabled",
                "idemgate.dev/config-map": "payments-idemgate",
                "idemgate.dev/upstream-port": "http",
                "idemgate.dev/cpu": "100m",
                "idemgate.dev/memory": "64Mi"
            },
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                 "name": "payments-7d9c5b8f6", "uid": "3f1c7a52-5d8e-4c1b-9a55-0e2b8f1d7c11",
                                 "controller": true, "blockOwnerDeletion": true}]
        },
        "spec": {
            "containers": [{
                "name": "payments", "image": "payments:2.1",
                "ports": [{"name": "http", "containerPort": 3000, "protocol": "TCP"},
                          {"name": "debug", "containerPort": 6060, "protocol": "TCP"}],
                "resources": {},
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File",
                "imagePullPolicy": "IfNotPresent",
                "volumeMounts": [{"name": "kube-api-access-x2x9q", "readOnly": true,
                                  "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}]
            }],
            "volumes": [{"name": "kube-api-access-x2x9q", "projected": {"defaultMode": 420, "sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}}]}}],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "securityContext": {},
            "schedulerName": "default-scheduler",
            "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                             "effect": "NoExecute", "tolerationSeconds": 300}],
            "priority": 0,
            "enableServiceLinks": true,
            "preemptionPolicy": "PreemptLowerPriority"
        }
    })
}

/// What a run of `idemgate inject` printed and how it ended.
pub struct InjectRun {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `idemgate inject ARGS`, with `stdin` as standard input.
pub fn inject(args: &[&str], stdin: &str) -> InjectRun {
    let mut child = Command::new(env!("CARGO_BIN_EXE_idemgate"))
        .arg("inject")
        .args(args)
        .env_remove("IDEMGATE_CONFIG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn idemgate");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes())
        .expect("write stdin");
    let out = child.wait_with_output().expect("idemgate inject finishes");
    InjectRun {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8(out.stdout).expect("UTF-8 stdout"),
        stderr: String::from_utf8(out.stderr).expect("UTF-8 stderr"),
    }
}

/// What `idemgate inject ARGS` makes of `pod`, as JSON (JSON is YAML: inject reads
/// the pod as it is).
pub fn injected_by_cli(pod: &Value, args: &[&str]) -> Value {
    let mut all = vec!["--image", IMAGE];
    all.extend_from_slice(args);
    let run = inject(&all, &pod.to_string());
    assert_eq!(run.code, 0, "inject: {}", run.stderr);
    let yaml: serde_norway::Value =
        serde_norway::from_str(&run.stdout).expect("inject prints YAML");
    serde_json::to_value(yaml).expect("YAML to JSON")
}

pub fn response(result: &Value) -> &Value {
    assert_eq!(result["status"], 200, "{result}");
    assert_eq!(
        result["body"]["apiVersion"], "admission.k8s.io/v1",
        "{result}"
    );
    assert_eq!(result["body"]["kind"], "AdmissionReview", "{result}");
    assert_eq!(result["body"]["response"]["allowed"], true, "{result}");
    &result["body"]["response"]
}

pub fn warnings(result: &Value) -> String {
    response(result)["warnings"].to_string()
}

/// Admitted unchanged: allowed, no patch.
pub fn assert_unchanged(result: &Value) {
    let r = response(result);
    assert!(
        r.get("patch").is_none() && r.get("patchType").is_none(),
        "{result}"
    );
}

/// The injector's peak resident memory (VmHWM), in KiB.
pub fn peak_kib(injector: &Injector) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", injector.child.id())).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/PID/status")
}
