//! Unit tests of `inject`: the native sidecar, idempotence, port and volume clashes.

use super::*;

const DEPLOY: &str = "apiVersion: apps/v1
kind: Deployment
metadata:
  name: app
spec:
  template:
    spec:
      containers:
      - name: app
        image: app
        ports:
        - containerPort: 3000
";

#[test]
fn injects_a_native_sidecar_that_forwards_to_the_only_app_port() {
    let out = inject(DEPLOY, &InjectArgs::default()).unwrap();
    let v: Value = serde_norway::from_str(&out.yaml).unwrap();
    let spec = &v["spec"]["template"]["spec"];
    let c = &spec["initContainers"][0];
    assert_eq!(c["name"], Value::from("idemgate"));
    assert_eq!(c["restartPolicy"], Value::from("Always"));
    assert!(out.yaml.contains("http://127.0.0.1:3000"));
    assert_eq!(spec["terminationGracePeriodSeconds"], Value::from(35u64));
}

#[test]
fn injecting_twice_changes_nothing() {
    let once = inject(DEPLOY, &InjectArgs::default()).unwrap().yaml;
    let twice = inject(&once, &InjectArgs::default()).unwrap().yaml;
    assert_eq!(once, twice);
}

#[test]
fn a_default_port_that_is_taken_moves_an_explicit_one_is_refused() {
    let input = DEPLOY.replace("3000", "8080");
    let out = inject(&input, &InjectArgs::default()).unwrap();
    assert!(out.yaml.contains("0.0.0.0:8081"));
    let args = InjectArgs {
        webhooks_port: Some(8080),
        ..InjectArgs::default()
    };
    let e = inject(&input, &args).unwrap_err().to_string();
    assert!(e.contains("--webhooks-port 8080 clashes"), "{e}");
}

#[test]
fn a_port_or_volume_named_like_idemgate_s_is_refused() {
    let input = DEPLOY.replace(
        "- containerPort: 3000",
        "- containerPort: 3000\n          name: admin",
    );
    let e = inject(&input, &InjectArgs::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("already declares a port named `admin`"), "{e}");
    let input =
        format!("{DEPLOY}      volumes:\n      - name: idemgate-config\n        emptyDir: {{}}\n");
    let e = inject(&input, &InjectArgs::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("already has a volume named `idemgate-config`"),
        "{e}"
    );
}

#[test]
fn input_that_is_not_kubernetes_is_an_error() {
    let e = inject("listen = \"0.0.0.0:8080\"\n", &InjectArgs::default()).unwrap_err();
    assert!(matches!(e, InjectError::NotKubernetes { doc: 1 }), "{e}");
    let e = inject("a: [\n", &InjectArgs::default()).unwrap_err();
    assert!(matches!(e, InjectError::Yaml { .. }), "{e}");
}
