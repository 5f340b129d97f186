//! `idemgate injector`, the running binary over HTTPS: real AdmissionReview requests,
//! each answer's JSONPatch applied by an independent implementation (Python's
//! `jsonpatch`) and the patched pod validated strictly against the Kubernetes schemas
//! (`kubernetes-validate`), then compared with what `idemgate inject` makes of the same
//! pod. The client and the certificates are Python's (tests/injector/).

use std::io::Write;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::free_port;

const IMAGE: &str = "registry.example.com/idemgate:test";

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/injector")
        .join(name)
}

/// Writes a fresh CA and serving certificate into `dir` (replacing what is there).
fn make_certs(dir: &Path) {
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

/// A running `idemgate injector` with its own certificates; killed on drop.
struct Injector {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl Injector {
    fn start(extra: &[&str]) -> Injector {
        let dir = tempfile::tempdir().expect("tempdir");
        make_certs(dir.path());
        let port = free_port();
        let child = Command::new(env!("CARGO_BIN_EXE_idemgate"))
            .arg("injector")
            .arg("--tls-cert")
            .arg(dir.path().join("cert.pem"))
            .arg("--tls-key")
            .arg(dir.path().join("key.pem"))
            .args(["--listen", &format!("127.0.0.1:{port}"), "--image", IMAGE])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
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
        Injector { child, port, dir }
    }

    fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// Runs tests/injector/review.py against `path` with `args` after the CA.
    fn call(&self, path: &str, ca: &Path, args: &[&str]) -> Result<Value, String> {
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
    fn post(&self, body: &[u8]) -> Value {
        let mut f = tempfile::NamedTempFile::new().expect("temp file");
        f.write_all(body).expect("write body");
        let path = f.path().to_str().expect("UTF-8 path").to_string();
        self.call("/mutate", &self.ca(), &[&path])
            .expect("review.py")
    }

    fn review(&self, review: &Value) -> Value {
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
fn admission(uid: &str, pod: &Value) -> Value {
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
fn plain_pod() -> Value {
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
fn replicaset_pod() -> Value {
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

/// What `idemgate inject ARGS` makes of `pod`, as JSON.
fn injected_by_cli(pod: &Value, args: &[&str]) -> Value {
    let mut child = Command::new(env!("CARGO_BIN_EXE_idemgate"))
        .args(["inject", "--image", IMAGE])
        .args(args)
        .env_remove("IDEMGATE_CONFIG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn idemgate inject");
    // JSON is YAML: inject reads the pod as it is.
    child
        .stdin
        .take()
        .unwrap()
        .write_all(pod.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().expect("idemgate inject");
    assert!(
        out.status.success(),
        "inject: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let yaml: serde_norway::Value =
        serde_norway::from_slice(&out.stdout).expect("inject prints YAML");
    serde_json::to_value(yaml).expect("YAML to JSON")
}

fn response(result: &Value) -> &Value {
    assert_eq!(result["status"], 200, "{result}");
    assert_eq!(
        result["body"]["apiVersion"], "admission.k8s.io/v1",
        "{result}"
    );
    assert_eq!(result["body"]["kind"], "AdmissionReview", "{result}");
    assert_eq!(result["body"]["response"]["allowed"], true, "{result}");
    &result["body"]["response"]
}

fn warnings(result: &Value) -> String {
    response(result)["warnings"].to_string()
}

/// Admitted unchanged: allowed, no patch.
fn assert_unchanged(result: &Value) {
    let r = response(result);
    assert!(
        r.get("patch").is_none() && r.get("patchType").is_none(),
        "{result}"
    );
}

#[test]
fn a_pod_and_a_replicasets_pod_get_exactly_the_sidecar_inject_adds() {
    let injector = Injector::start(&[]);
    let cases: [(Value, &[&str]); 2] = [
        (plain_pod(), &[]),
        (
            replicaset_pod(),
            &[
                "--config-map",
                "payments-idemgate",
                "--upstream-port",
                "http",
                "--cpu",
                "100m",
                "--memory",
                "64Mi",
            ],
        ),
    ];
    for (i, (pod, cli_args)) in cases.iter().enumerate() {
        let uid = format!("705ab4f5-6393-11e8-b7cc-42010a80000{i}");
        let result = injector.review(&admission(&uid, pod));
        let r = response(&result);
        assert_eq!(r["uid"], uid.as_str());
        assert_eq!(r["patchType"], "JSONPatch", "{result}");
        assert!(
            result["invalid"].is_null(),
            "the patched pod is not valid: {}",
            result["invalid"]
        );
        let patched = &result["patched"];
        assert_eq!(
            patched,
            &injected_by_cli(pod, cli_args),
            "webhook and `inject` disagree"
        );
        // Every patch operation adds or raises: nothing of the pod's own is removed.
        for op in result["patch"].as_array().unwrap() {
            assert!(
                ["add", "replace"].contains(&op["op"].as_str().unwrap()),
                "{op}"
            );
        }
        // Sent again (a reinvocation, or a pod that already has it): left alone.
        let again = injector.review(&admission(&uid, patched));
        assert_unchanged(&again);
        assert!(response(&again).get("warnings").is_none(), "{again}");
    }

    // The overrides, read back from the patched ReplicaSet pod.
    let result = injector.review(&admission("rs", &replicaset_pod()));
    let patched = &result["patched"];
    let sidecar = &patched["spec"]["initContainers"][0];
    assert_eq!(sidecar["name"], "idemgate");
    assert_eq!(sidecar["restartPolicy"], "Always");
    assert_eq!(
        sidecar["resources"],
        json!({"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"memory": "64Mi"}})
    );
    assert!(
        sidecar["env"]
            .as_array()
            .unwrap()
            .contains(&json!({"name": "IDEMGATE_UPSTREAM", "value": "http://127.0.0.1:3000"}))
    );
    let volumes = patched["spec"]["volumes"].as_array().unwrap();
    assert!(
        volumes.contains(
            &json!({"name": "idemgate-config", "configMap": {"name": "payments-idemgate"}})
        )
    );
    assert_eq!(
        volumes[0]["name"], "kube-api-access-x2x9q",
        "the pod's own volume stays first"
    );
    assert_eq!(patched["spec"]["terminationGracePeriodSeconds"], 35);
    assert!(
        warnings(&result).contains("terminationGracePeriodSeconds raised from 30 to 35"),
        "{result}"
    );
}

#[test]
fn a_pod_that_opts_out_is_admitted_unchanged() {
    let injector = Injector::start(&[]);
    for (place, map) in [("label", "labels"), ("annotation", "annotations")] {
        let mut pod = plain_pod();
        pod["metadata"][map]["idemgate.dev/inject"] = json!("disabled");
        let result = injector.review(&admission(place, &pod));
        assert_unchanged(&result);
        assert_eq!(response(&result)["uid"], place);
        assert!(response(&result).get("warnings").is_none(), "{result}");
    }
    // A value that is neither: not injected, and said so.
    let mut pod = plain_pod();
    pod["metadata"]["labels"]["idemgate.dev/inject"] = json!("false");
    let result = injector.review(&admission("other", &pod));
    assert_unchanged(&result);
    assert!(
        warnings(&result).contains("neither `enabled` nor `disabled`"),
        "{result}"
    );
}

#[test]
fn what_cannot_be_injected_is_admitted_unchanged_with_a_warning() {
    let injector = Injector::start(&[]);

    // Not JSON: no uid to echo.
    let result = injector.post(b"{\"apiVersion\": \"admission.k8s.io/v1\", ");
    assert_unchanged(&result);
    assert_eq!(response(&result)["uid"], "");
    assert!(warnings(&result).contains("not JSON"), "{result}");

    // JSON, but not an AdmissionReview: the uid is echoed all the same.
    let result = injector.review(&json!({"kind": "Pod", "request": {"uid": "u-1"}}));
    assert_unchanged(&result);
    assert_eq!(response(&result)["uid"], "u-1");
    assert!(
        warnings(&result).contains("not an admission.k8s.io/v1 AdmissionReview"),
        "{result}"
    );

    // The wrong kind of object.
    let mut review = admission(
        "u-2",
        &json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "d"}, "spec": {"template": {"spec": {"containers": []}}}}),
    );
    review["request"]["kind"] = json!({"group": "apps", "version": "v1", "kind": "Deployment"});
    let result = injector.review(&review);
    assert_unchanged(&result);
    assert_eq!(response(&result)["uid"], "u-2");
    assert!(
        warnings(&result).contains("only Pods are injected, not `apps/v1/Deployment`"),
        "{result}"
    );

    // An UPDATE: the containers of a running pod cannot change.
    let mut review = admission("u-3", &plain_pod());
    review["request"]["operation"] = json!("UPDATE");
    assert!(warnings(&injector.review(&review)).contains("not `UPDATE`"));

    // Annotations it cannot use name themselves.
    for (key, value, says) in [
        ("idemgate.dev/cpu", "lots", "idemgate.dev/cpu"),
        ("idemgate.dev/memory", "0", "idemgate.dev/memory"),
        (
            "idemgate.dev/config-map",
            "Not_A_Name",
            "idemgate.dev/config-map",
        ),
        (
            "idemgate.dev/upstream-port",
            "grpc",
            "idemgate.dev/upstream-port",
        ),
    ] {
        let mut pod = plain_pod();
        pod["metadata"]["annotations"] = json!({key: value});
        let result = injector.review(&admission("u-4", &pod));
        assert_unchanged(&result);
        assert!(warnings(&result).contains(says), "{key}={value}: {result}");
    }

    // Two ports and no annotation saying which: the warning says how to choose.
    let mut pod = plain_pod();
    pod["spec"]["containers"][0]["ports"] =
        json!([{"containerPort": 3000}, {"containerPort": 4000}]);
    let result = injector.review(&admission("u-5", &pod));
    assert_unchanged(&result);
    assert!(
        warnings(&result).contains("the annotation idemgate.dev/upstream-port"),
        "{result}"
    );
}

#[test]
fn a_dry_run_gets_the_same_patch() {
    let injector = Injector::start(&[]);
    let real = injector.review(&admission("d", &replicaset_pod()));
    let mut review = admission("d", &replicaset_pod());
    review["request"]["dryRun"] = json!(true);
    let dry = injector.review(&review);
    assert_eq!(response(&dry)["patch"], response(&real)["patch"]);
    assert!(response(&dry)["patch"].is_string());
}

#[test]
fn bodies_over_8_mib_are_refused_and_the_probe_answers() {
    let injector = Injector::start(&[]);
    let ca = injector.ca();
    let over = (8 * 1024 * 1024 + 1024).to_string();
    for mode in ["--length", "--chunked"] {
        let result = injector.call("/mutate", &ca, &[mode, &over]).unwrap();
        assert_eq!(result["status"], 413, "{mode}: {result}");
    }
    // Just under the bound is read and answered (not an AdmissionReview: a warning).
    let mut big = b"{\"pad\": \"".to_vec();
    big.resize(8 * 1024 * 1024 - 16, b'x');
    big.extend_from_slice(b"\"}");
    assert!(warnings(&injector.post(&big)).contains("not an admission.k8s.io/v1"));
    let probe = injector.call("/healthz", &ca, &["--get"]).unwrap();
    assert_eq!(probe["status"], 200, "{probe}");
}

#[test]
fn the_strict_validation_is_live() {
    // A pod with a field Kubernetes does not know: the patch applies, the validator
    // must refuse the result (else the other tests' `invalid: null` proves nothing).
    let injector = Injector::start(&[]);
    let mut pod = plain_pod();
    pod["spec"]["containerz"] = json!([]);
    let result = injector.review(&admission("v", &pod));
    assert!(
        result["invalid"]
            .as_str()
            .is_some_and(|e| e.contains("containerz")),
        "{result}"
    );
}

#[test]
fn a_rotated_certificate_is_served_without_a_restart() {
    let injector = Injector::start(&[]);
    let old_ca = injector.dir.path().join("old-ca.pem");
    std::fs::copy(injector.ca(), &old_ca).unwrap();
    assert_eq!(
        injector.call("/healthz", &old_ca, &["--get"]).unwrap()["status"],
        200
    );
    // A new CA and certificate, written over the files as cert-manager rotates them.
    make_certs(injector.dir.path());
    let started = Instant::now();
    loop {
        if let Ok(r) = injector.call("/healthz", &injector.ca(), &["--get"]) {
            assert_eq!(r["status"], 200);
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "the new certificate was not served"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let e = injector.call("/healthz", &old_ca, &["--get"]).unwrap_err();
    assert!(e.contains("CERTIFICATE_VERIFY_FAILED"), "{e}");
}

#[test]
fn unusable_certificate_files_stop_it_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path());
    std::fs::write(dir.path().join("bad.pem"), "not a certificate\n").unwrap();
    let other = tempfile::tempdir().unwrap();
    make_certs(other.path());
    for (cert, key, says) in [
        ("missing.pem", "key.pem", "--tls-cert"),
        ("bad.pem", "key.pem", "no certificate"),
        ("cert.pem", "other-key", "do not make a key pair"),
    ] {
        let key = if key == "other-key" {
            other.path().join("key.pem")
        } else {
            dir.path().join(key)
        };
        let out = Command::new(env!("CARGO_BIN_EXE_idemgate"))
            .arg("injector")
            .arg("--tls-cert")
            .arg(dir.path().join(cert))
            .arg("--tls-key")
            .arg(key)
            .args(["--listen", &format!("127.0.0.1:{}", free_port())])
            .output()
            .expect("run idemgate injector");
        assert_eq!(out.status.code(), Some(1));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(says), "{cert}/{says}: {stderr}");
    }
}
