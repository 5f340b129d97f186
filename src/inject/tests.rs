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
    let out = inject(DEPLOY, &SidecarOptions::default()).unwrap();
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
    let once = inject(DEPLOY, &SidecarOptions::default()).unwrap().yaml;
    let twice = inject(&once, &SidecarOptions::default()).unwrap().yaml;
    assert_eq!(once, twice);
}

#[test]
fn a_default_port_that_is_taken_moves_an_explicit_one_is_refused() {
    let input = DEPLOY.replace("3000", "8080");
    let out = inject(&input, &SidecarOptions::default()).unwrap();
    assert!(out.yaml.contains("0.0.0.0:8081"));
    let args = SidecarOptions {
        webhooks_port: Some(8080),
        ..SidecarOptions::default()
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
    let e = inject(&input, &SidecarOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("already declares a port named `admin`"), "{e}");
    let input =
        format!("{DEPLOY}      volumes:\n      - name: idemgate-config\n        emptyDir: {{}}\n");
    let e = inject(&input, &SidecarOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("already has a volume named `idemgate-config`"),
        "{e}"
    );
}

#[test]
fn input_that_is_not_kubernetes_is_an_error() {
    let e = inject("listen = \"0.0.0.0:8080\"\n", &SidecarOptions::default()).unwrap_err();
    assert!(matches!(e, InjectError::NotKubernetes { doc: 1 }), "{e}");
    let e = inject("a: [\n", &SidecarOptions::default()).unwrap_err();
    assert!(matches!(e, InjectError::Yaml { .. }), "{e}");
}

#[test]
fn quantities_are_positive_decimals_with_a_kubernetes_suffix() {
    for ok in ["100m", "0.5", "1", "64Mi", "1G", "2Gi", "250m"] {
        assert_eq!(parse_quantity(ok).as_deref(), Ok(ok));
    }
    for bad in [
        "", "0", "0m", "lots", "64MB", "-1", "1.2.3", "m", "1 Gi", "1e3",
    ] {
        assert!(parse_quantity(bad).is_err(), "{bad:?} was accepted");
    }
}

#[test]
fn cpu_and_memory_set_the_requests_and_memory_the_limit_too() {
    let args = SidecarOptions {
        cpu: Some("200m".into()),
        memory: Some("96Mi".into()),
        ..SidecarOptions::default()
    };
    let v: Value = serde_norway::from_str(&inject(DEPLOY, &args).unwrap().yaml).unwrap();
    let resources = &v["spec"]["template"]["spec"]["initContainers"][0]["resources"];
    assert_eq!(resources["requests"]["cpu"], Value::from("200m"));
    assert_eq!(resources["requests"]["memory"], Value::from("96Mi"));
    assert_eq!(resources["limits"]["memory"], Value::from("96Mi"));
    assert!(resources["limits"].get("cpu").is_none(), "{resources:?}");
    // Without them: the defaults, CPU limit included.
    let v: Value =
        serde_norway::from_str(&inject(DEPLOY, &SidecarOptions::default()).unwrap().yaml).unwrap();
    let resources = &v["spec"]["template"]["spec"]["initContainers"][0]["resources"];
    assert_eq!(resources["limits"]["cpu"], Value::from("500m"));
    assert_eq!(resources["limits"]["memory"], Value::from("128Mi"));
}

/// A live reload (docs/kubernetes.md, "Rotating a secret") needs the kubelet to update
/// the files in place: whole-volume mounts do, `subPath` mounts never do.
#[test]
fn the_config_and_secrets_are_whole_volume_mounts_that_update_in_place() {
    let out = inject(DEPLOY, &SidecarOptions::default()).unwrap();
    let v: Value = serde_norway::from_str(&out.yaml).unwrap();
    let mounts = v["spec"]["template"]["spec"]["initContainers"][0]["volumeMounts"]
        .as_sequence()
        .unwrap()
        .clone();
    let paths: Vec<&str> = mounts
        .iter()
        .map(|m| m["mountPath"].as_str().unwrap())
        .collect();
    assert_eq!(paths, [CONFIG_DIR, SECRETS_DIR]);
    assert!(
        mounts
            .iter()
            .all(|m| m.get("subPath").is_none() && m.get("subPathExpr").is_none())
    );
    assert!(!out.yaml.contains("subPath"));
}
