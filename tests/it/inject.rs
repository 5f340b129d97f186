//! Golden tests for `idemgate inject`: the real binary, fed the inputs under
//! tests/fixtures/inject/, must print exactly the expected outputs beside them.
//!
//! After an intended change to the output, regenerate the expected files with
//! `IDEMGATE_UPDATE_GOLDEN=1 cargo test --test it inject::` and review the diff: every
//! output there is also validated against the Kubernetes schemas by scripts/k8s-checks.

use std::path::PathBuf;

// IMAGE: the image the golden outputs name, so that they do not change with the version.
use crate::common::injector::{IMAGE, InjectRun, inject};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/inject")
        .join(name)
}

/// Injects the fixture `input` with `args` and compares stdout with the fixture
/// `expected` (written instead when IDEMGATE_UPDATE_GOLDEN is set). Returns the run.
fn golden(input: &str, args: &[&str], expected: &str) -> InjectRun {
    let path = fixture(input);
    let path = path.to_str().expect("UTF-8 path");
    let mut all = vec!["--image", IMAGE];
    all.extend_from_slice(args);
    all.push(path);
    let run = inject(&all, "");
    assert_eq!(run.code, 0, "inject {input} failed: {}", run.stderr);
    let expected_path = fixture(expected);
    if std::env::var_os("IDEMGATE_UPDATE_GOLDEN").is_some() {
        std::fs::write(&expected_path, &run.stdout).expect("write golden file");
    }
    let want = std::fs::read_to_string(&expected_path)
        .unwrap_or_else(|e| panic!("{}: {e}", expected_path.display()));
    assert!(
        run.stdout == want,
        "output of inject {input} differs from {expected}\n--- got ---\n{}\n--- stderr ---\n{}",
        run.stdout,
        run.stderr
    );
    run
}

fn assert_fails(run: &InjectRun, message: &str) {
    assert_eq!(run.code, 1, "expected exit 1; stderr: {}", run.stderr);
    assert!(run.stdout.is_empty(), "nothing on stdout on error");
    assert!(
        run.stderr.contains(message),
        "stderr should say `{message}`, it says: {}",
        run.stderr
    );
}

#[test]
fn native_sidecar_is_an_init_container_with_restart_policy_always() {
    let run = golden("deployment.in.yaml", &[], "deployment.native.out.yaml");
    assert!(run.stderr.is_empty(), "no notes expected: {}", run.stderr);
}

#[test]
fn standard_input_gives_the_same_output_as_a_file() {
    let input = std::fs::read_to_string(fixture("deployment.in.yaml")).unwrap();
    let want = std::fs::read_to_string(fixture("deployment.native.out.yaml")).unwrap();
    for args in [vec!["--image", IMAGE, "-"], vec!["--image", IMAGE]] {
        let run = inject(&args, &input);
        assert_eq!(run.code, 0, "{}", run.stderr);
        assert_eq!(run.stdout, want, "args {args:?}");
    }
}

#[test]
fn classic_sidecar_is_a_second_container() {
    golden(
        "deployment.in.yaml",
        &["--classic"],
        "deployment.classic.out.yaml",
    );
}

#[test]
fn multi_document_input_injects_workloads_and_passes_other_kinds_through() {
    golden("multi.in.yaml", &[], "multi.out.yaml");
}

#[test]
fn classic_is_refused_for_jobs_which_would_never_complete() {
    let run = inject(
        &["--classic", fixture("multi.in.yaml").to_str().unwrap()],
        "",
    );
    assert_fails(
        &run,
        "document 4 (CronJob/replay): a classic sidecar never exits",
    );
}

#[test]
fn injecting_twice_changes_nothing() {
    for out in [
        "deployment.native.out.yaml",
        "deployment.classic.out.yaml",
        "multi.out.yaml",
        "pod-init.out.yaml",
    ] {
        let run = golden(out, &[], out);
        assert!(
            run.stderr
                .contains("already has an `idemgate` container; left unchanged"),
            "{out}: {}",
            run.stderr
        );
    }
}

#[test]
fn pod_with_init_containers_gets_idemgate_last_and_a_longer_grace_period() {
    let run = golden(
        "pod-init.in.yaml",
        &["--upstream-port", "web"],
        "pod-init.out.yaml",
    );
    assert!(
        run.stderr
            .contains("terminationGracePeriodSeconds raised from 10 to 35"),
        "{}",
        run.stderr
    );
}

#[test]
fn several_app_ports_need_upstream_port() {
    let run = inject(&[fixture("pod-init.in.yaml").to_str().unwrap()], "");
    assert_fails(
        &run,
        "the app declares several ports (web=4000 (container `receiver`), debug=4001 (container `receiver`)): pass --upstream-port",
    );
}

#[test]
fn default_ports_that_clash_move_to_free_ones() {
    let run = golden(
        "port-clash.in.yaml",
        &["--upstream-port", "http"],
        "port-clash.out.yaml",
    );
    assert!(
        run.stderr
            .contains("port 8080 is taken by http=8080 (container `app`); idemgate uses 8082"),
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains("idemgate uses 9091"), "{}", run.stderr);
    assert!(
        run.stderr
            .contains("prometheus.io annotations point at the app; left as they are"),
        "{}",
        run.stderr
    );
}

#[test]
fn explicit_ports_that_clash_are_refused() {
    let input = fixture("port-clash.in.yaml");
    let input = input.to_str().unwrap();
    let run = inject(
        &["--upstream-port", "http", "--webhooks-port", "8081", input],
        "",
    );
    assert_fails(
        &run,
        "document 1 (Deployment/busy): --webhooks-port 8081 clashes with port http-alt=8081 (container `app`) that the pod already uses; choose another",
    );
    let run = inject(
        &["--upstream-port", "http", "--admin-port", "8080", input],
        "",
    );
    assert_fails(&run, "--admin-port 8080 clashes with port http=8080");
}

#[test]
fn input_that_is_not_kubernetes_yaml_is_an_error() {
    let run = inject(&[fixture("not-kubernetes.in.toml").to_str().unwrap()], "");
    assert_fails(
        &run,
        "idemgate inject: document 1: not a Kubernetes object (a mapping with apiVersion and kind)",
    );
    let run = inject(&["-"], "kind: Deployment\nspec: [unclosed\n");
    assert_fails(&run, "idemgate inject: document 1: not valid YAML:");
    let run = inject(&["-"], "# nothing but a comment\n");
    assert_fails(&run, "idemgate inject: no Kubernetes object in the input");
    let run = inject(&["/nonexistent/input.yaml"], "");
    assert_fails(
        &run,
        "idemgate inject: cannot read /nonexistent/input.yaml:",
    );
}

#[test]
fn the_default_image_is_this_version() {
    let input = std::fs::read_to_string(fixture("deployment.in.yaml")).unwrap();
    let run = inject(&[], &input);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let image = format!(
        "image: ghcr.io/idemgate/idemgate:{}\n",
        env!("CARGO_PKG_VERSION")
    );
    assert!(run.stdout.contains(&image), "{}", run.stdout);
}
