//! `idemgate injector`, the running binary over HTTPS: real AdmissionReview requests,
//! each answer's JSONPatch applied by an independent implementation (Python's
//! `jsonpatch`) and the patched pod validated strictly against the Kubernetes schemas
//! (`kubernetes-validate`), then compared with what `idemgate inject` makes of the same
//! pod. The client and the certificates are Python's (tests/injector/); the harness is
//! tests/it/common/injector.rs.

use std::io::{BufRead, BufReader, Read};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::free_port;
use crate::common::injector::{
    Injector, admission, assert_unchanged, injected_by_cli, make_certs, peak_kib, plain_pod,
    replicaset_pod, response, script, warnings,
};

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
    // The API server's default grace period is always raised: a note for the log, not
    // a warning on every pod.
    assert!(response(&result).get("warnings").is_none(), "{result}");
    assert!(
        injector
            .log()
            .contains("terminationGracePeriodSeconds raised from 30 to 35"),
        "{}",
        injector.log()
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
        warnings(&result).contains(r#"only Pods are injected, not \"apps/v1/Deployment\""#),
        "{result}"
    );

    // An UPDATE: the containers of a running pod cannot change.
    let mut review = admission("u-3", &plain_pod());
    review["request"]["operation"] = json!("UPDATE");
    assert!(warnings(&injector.review(&review)).contains(r#"not \"UPDATE\""#));

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

    // A value with a control character is quoted: the API server drops a warning
    // that holds one.
    let mut pod = plain_pod();
    pod["metadata"]["labels"]["idemgate.dev/inject"] = json!("yes\nplease");
    let result = injector.review(&admission("u-6", &pod));
    assert_unchanged(&result);
    assert!(
        warnings(&result).contains(r#"\"yes\\nplease\""#),
        "{result}"
    );

    // More containers than any real pod: refused before it costs memory.
    let mut pod = plain_pod();
    pod["spec"]["containers"] = json!(vec![json!({"name": "c"}); 1025]);
    let result = injector.review(&admission("u-7", &pod));
    assert_unchanged(&result);
    assert!(
        warnings(&result).contains("more than 1024 elements"),
        "{result}"
    );

    // Why a pod has no sidecar is in the injector's log (a controller's pods' warnings
    // reach nobody else).
    assert!(
        injector.log().contains("admitted unchanged"),
        "{}",
        injector.log()
    );
}

#[test]
fn a_static_pods_mirror_is_left_alone() {
    let injector = Injector::start(&[]);
    let mut pod = plain_pod();
    pod["metadata"]["annotations"] = json!({"kubernetes.io/config.mirror": "3b9d8e"});
    let result = injector.review(&admission("m", &pod));
    assert_unchanged(&result);
    assert!(response(&result).get("warnings").is_none(), "{result}");
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
fn bodies_over_3_mib_and_slow_senders_are_refused_and_the_probe_answers() {
    let injector = Injector::start(&[]);
    let ca = injector.ca();
    let over = (3 * 1024 * 1024 + 1024).to_string();
    for mode in ["--length", "--chunked"] {
        let result = injector.call("/mutate", &ca, &[mode, &over]).unwrap();
        assert_eq!(result["status"], 413, "{mode}: {result}");
    }
    // Just under the bound is read and answered (not an AdmissionReview: a warning).
    let mut big = b"{\"pad\": \"".to_vec();
    big.resize(3 * 1024 * 1024 - 16, b'x');
    big.extend_from_slice(b"\"}");
    assert!(warnings(&injector.post(&big)).contains("not an admission.k8s.io/v1"));
    // A body that stops coming: answered 408 once the request's 10 s are up.
    let stalled = injector.call("/mutate", &ca, &["--stall"]).unwrap();
    assert_eq!(stalled["status"], 408, "{stalled}");
    assert!(stalled["after"].as_f64().unwrap() >= 9.0, "{stalled}");
    let probe = injector.call("/healthz", &ca, &["--get"]).unwrap();
    assert_eq!(probe["status"], 200, "{probe}");
}

#[test]
fn crafted_reviews_at_the_body_limit_stay_far_below_the_memory_limit() {
    let injector = Injector::start(&[]);
    let limit = 3 * 1024 * 1024 - 4096;
    let fill = |pod: &mut Value, path: &str, element: Value, size: usize| {
        let n = (limit - 1024) / size;
        *pod.pointer_mut(path).unwrap() = json!(vec![element; n]);
    };
    // Many small values in a field injection never reads, in lists and maps it reads.
    let mut ignored = plain_pod();
    ignored["spec"]["containers"][0]["args"] = json!([]);
    fill(&mut ignored, "/spec/containers/0/args", json!(0), 2);
    let mut containers = plain_pod();
    fill(&mut containers, "/spec/containers", json!({}), 3);
    let mut ports = plain_pod();
    fill(&mut ports, "/spec/containers/0/ports", json!({}), 3);
    let mut labels = plain_pod();
    labels["metadata"]["labels"] = (0..(limit - 1024) / 14)
        .map(|i| (format!("k{i}"), json!("")))
        .collect::<serde_json::Map<_, _>>()
        .into();
    let bodies: Vec<(&str, Vec<u8>)> = [
        ("ignored", ignored),
        ("containers", containers),
        ("ports", ports),
        ("labels", labels),
    ]
    .into_iter()
    .map(|(what, pod)| (what, serde_json::to_vec(&admission(what, &pod)).unwrap()))
    .collect();
    for (what, body) in &bodies {
        assert!(
            body.len() <= 3 * 1024 * 1024,
            "{what}: {} bytes",
            body.len()
        );
        let result = injector.post(body);
        assert_eq!(response(&result)["uid"], *what, "{result}");
    }
    let peak = peak_kib(&injector);
    // The Deployment's limit is 96Mi; docs/kubernetes.md gives the peaks measured
    // (35–56 MiB one at a time, the higher ones on a loaded machine).
    assert!(peak < 64 * 1024, "peak resident memory {peak} KiB");
    // All at once: their bodies are read together (12 MiB may be held), two are
    // reviewed at a time.
    let injector = &injector;
    std::thread::scope(|s| {
        let calls: Vec<_> = bodies
            .iter()
            .map(|(what, body)| s.spawn(move || (*what, injector.post(body))))
            .collect();
        for call in calls {
            let (what, result) = call.join().unwrap();
            assert_eq!(response(&result)["uid"], what, "{result}");
        }
    });
    let peak = peak_kib(injector);
    assert!(
        peak < 72 * 1024,
        "peak resident memory, all at once: {peak} KiB"
    );
}

#[test]
fn connections_beyond_128_are_closed() {
    let injector = Injector::start(&[]);
    // 128 connections that never start their handshake hold every slot.
    let held: Vec<TcpStream> = (0..128)
        .map(|_| TcpStream::connect(("127.0.0.1", injector.port)).unwrap())
        .collect();
    // Wait for the state, not a margin: on a busy machine the injector may not have
    // accepted all 128 yet, and a call made before then is served. Once it has, every
    // further connection is closed.
    let started = Instant::now();
    loop {
        let refused = injector.call("/healthz", &injector.ca(), &["--get"]);
        if refused.is_err() {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the 129th connection was still served after 10 s: {refused:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(held);
    let started = Instant::now();
    while injector
        .call("/healthz", &injector.ca(), &["--get"])
        .is_err()
    {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "slots were not freed"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Runs review.py with `args` in the background, once it has printed `ready` on stderr.
fn spawn_ready(injector: &Injector, path: &str, args: &[&str], ready: &str) -> Child {
    let mut child = Command::new("python3")
        .arg(script("review.py"))
        .arg(format!("https://127.0.0.1:{}{path}", injector.port))
        .arg(injector.ca())
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run review.py");
    let mut line = String::new();
    BufReader::new(child.stderr.as_mut().expect("stderr"))
        .read_line(&mut line)
        .expect("review.py's stderr");
    assert_eq!(line.trim(), ready, "review.py {args:?}");
    child
}

#[test]
fn a_review_is_not_held_up_by_two_slow_senders() {
    let injector = Injector::start(&[]);
    // Two clients that sent a head and part of a body, then nothing: each holds its
    // request for the whole 10 s.
    let mut slow: Vec<Child> = (0..2)
        .map(|_| spawn_ready(&injector, "/mutate", &["--stall"], "sent"))
        .collect();
    let result = injector.review(&admission("fast", &plain_pod()));
    assert_eq!(response(&result)["uid"], "fast", "{result}");
    // The webhook's timeoutSeconds is 5: past it, the pod is admitted without the sidecar.
    let elapsed = result["elapsed"].as_f64().unwrap();
    assert!(
        elapsed < 2.0,
        "a review behind two slow senders took {elapsed:.1} s"
    );
    for child in &mut slow {
        let _ = child.kill();
        let _ = child.wait();
    }
}

#[test]
fn connections_that_never_send_a_request_are_closed_within_10_s() {
    let injector = Injector::start(&[]);
    // Every slot held: 8 connections that never start their TLS handshake, 120 that
    // complete it and send nothing.
    let bare: Vec<TcpStream> = (0..8)
        .map(|_| TcpStream::connect(("127.0.0.1", injector.port)).unwrap())
        .collect();
    let silent = spawn_ready(&injector, "/mutate", &["--silent", "120", "15"], "open");
    let refused = injector.call("/healthz", &injector.ca(), &["--get"]);
    assert!(refused.is_err(), "a slot was free: {refused:?}");
    let out: Value = serde_json::from_slice(&silent.wait_with_output().unwrap().stdout).unwrap();
    assert_eq!(
        out["closed"], 120,
        "silent TLS connections still open after 15 s: {out}"
    );
    let after = out["last_closed_after"].as_f64().unwrap();
    assert!(
        after < 11.0,
        "the last silent connection closed after {after:.1} s"
    );
    for mut s in bare {
        s.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let mut buf = [0u8; 1];
        let closed = match s.read(&mut buf) {
            Ok(n) => n == 0,
            Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
        };
        assert!(
            closed,
            "a connection that never started its handshake is still open"
        );
    }
    let result = injector.review(&admission("after", &plain_pod()));
    assert_eq!(response(&result)["uid"], "after", "{result}");
}

#[test]
fn sigterm_closes_idle_connections_and_stops_at_once() {
    let mut injector = Injector::start(&[]);
    // An idle TLS connection (the API server keeps one open), and a bare TCP one that
    // never starts its handshake.
    let idle = Command::new("python3")
        .arg(script("review.py"))
        .arg(format!("https://127.0.0.1:{}/mutate", injector.port))
        .arg(injector.ca())
        .args(["--idle", "30"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("run review.py --idle");
    let _bare = TcpStream::connect(("127.0.0.1", injector.port)).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let pid = injector.child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let stopped = Instant::now();
    let status = loop {
        if let Some(status) = injector.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            stopped.elapsed() < Duration::from_secs(5),
            "still running 5 s after SIGTERM (the drain limit is 10 s)"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status:?}");
    let out: Value = serde_json::from_slice(&idle.wait_with_output().unwrap().stdout).unwrap();
    assert!(
        out["closed_after"].as_f64().is_some(),
        "the idle connection was not closed: {out}"
    );
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
    let mut injector = Injector::start(&[]);
    let old_ca = injector.dir.path().join("old-ca.pem");
    std::fs::copy(injector.ca(), &old_ca).unwrap();
    assert_eq!(
        injector.call("/healthz", &old_ca, &["--get"]).unwrap()["status"],
        200
    );
    // Half an update (a new certificate beside the old key): not a pair, so the old
    // one stays in service.
    let half = injector.dir.path().join("..half");
    make_certs(&half);
    let current = std::fs::read_link(injector.dir.path().join("..data")).unwrap();
    let current = injector.dir.path().join(current);
    std::fs::copy(half.join("cert.pem"), current.join("cert.pem")).unwrap();
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        injector.call("/healthz", &old_ca, &["--get"]).unwrap()["status"],
        200,
        "a mismatched pair replaced the certificate in service"
    );
    assert!(
        injector.log().contains("do not make a key pair"),
        "{}",
        injector.log()
    );
    // The kubelet's update: a new directory, then `..data` swapped to it.
    injector.rotate();
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
