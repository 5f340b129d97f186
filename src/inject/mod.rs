//! `idemgate inject`: adds the idemgate sidecar to Kubernetes workloads, in the spirit
//! of `linkerd inject`. It reads YAML (one or many documents), adds the sidecar to every
//! pod template it finds, and writes the result; every other field and document passes
//! through unchanged.
//!
//! The YAML is handled as an order-preserving tree (`serde_norway::Value`, whose
//! mappings keep insertion order), never as typed Kubernetes structs: a typed round trip
//! would drop fields this code does not know, and reorder the ones it does. Comments and
//! quoting styles are not kept (no maintained Rust YAML crate round-trips them); keys,
//! their order and every value are.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

mod emit;

use serde::Deserialize;
use serde_norway::{Mapping, Value};

/// The container name that marks a pod as injected: a pod that has it is left alone.
pub const CONTAINER: &str = "idemgate";
/// The image used when `--image` is not given.
pub const DEFAULT_IMAGE: &str = concat!("ghcr.io/idemgate/idemgate:", env!("CARGO_PKG_VERSION"));
/// Where the ConfigMap is mounted; `IDEMGATE_CONFIG` names the file in it.
pub const CONFIG_DIR: &str = "/etc/idemgate";
pub const CONFIG_FILE: &str = "/etc/idemgate/idemgate.toml";
/// Where the Secret is mounted: routes name its keys as `file:` secrets, e.g.
/// `file:/var/run/secrets/idemgate/stripe`.
pub const SECRETS_DIR: &str = "/var/run/secrets/idemgate";
/// The pod label of injected pods (selected by k8s/base's Services and PodMonitor).
pub const POD_LABEL: &str = "idemgate.io/webhooks";
const CONFIG_VOLUME: &str = "idemgate-config";
const SECRETS_VOLUME: &str = "idemgate-secrets";
const WEBHOOKS_PORT_NAME: &str = "webhooks";
const ADMIN_PORT_NAME: &str = "admin";
const DEFAULT_WEBHOOKS_PORT: u16 = 8080;
const DEFAULT_ADMIN_PORT: u16 = 9090;
/// The preStop sleep: long enough for the pod's endpoints to be withdrawn from the
/// Service before idemgate stops accepting deliveries.
const PRE_STOP_SECONDS: u64 = 5;
/// Slack on top of preStop + shutdown_grace before the kubelet sends SIGKILL.
const GRACE_MARGIN_SECONDS: u64 = 5;

/// The command line of `idemgate inject`.
#[derive(Debug, Clone, clap::Args)]
pub struct InjectArgs {
    /// Kubernetes YAML to inject (`-` or nothing: standard input). The result goes to
    /// standard output; notes go to standard error.
    pub file: Option<PathBuf>,
    /// The idemgate image.
    #[arg(long, default_value = DEFAULT_IMAGE)]
    pub image: String,
    /// The ConfigMap holding `idemgate.toml`, mounted at /etc/idemgate.
    #[arg(long, default_value = "idemgate")]
    pub config_map: String,
    /// The Secret holding the signing secrets, mounted at /var/run/secrets/idemgate
    /// (route secrets read them as `file:/var/run/secrets/idemgate/KEY`). An optional
    /// key `store-url` becomes IDEMGATE_STORE_URL (for a Redis URL with a password).
    #[arg(long, default_value = "idemgate-secrets")]
    pub secret: String,
    /// The application's port (number, or the name of a declared container port) that
    /// idemgate forwards to on 127.0.0.1. Default: the only port the app declares.
    #[arg(long)]
    pub upstream_port: Option<String>,
    /// The port providers post to (named `webhooks`). Default 8080, or the next free
    /// port when the pod already declares 8080.
    #[arg(long)]
    pub webhooks_port: Option<u16>,
    /// The admin port: /metrics, /healthz, /readyz (named `admin`). Default 9090, or
    /// the next free port when the pod already declares 9090.
    #[arg(long)]
    pub admin_port: Option<u16>,
    /// Add idemgate as a plain second container instead of a native sidecar (an init
    /// container with `restartPolicy: Always`, Kubernetes 1.29+).
    #[arg(long)]
    pub classic: bool,
    /// idemgate's `shutdown_grace` (how long it drains on SIGTERM); the pod's
    /// terminationGracePeriodSeconds is raised to cover it.
    #[arg(long, default_value = "25s", value_parser = parse_duration)]
    pub shutdown_grace: Duration,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("`{s}`: {e}"))
}

impl Default for InjectArgs {
    fn default() -> Self {
        InjectArgs {
            file: None,
            image: DEFAULT_IMAGE.to_string(),
            config_map: "idemgate".to_string(),
            secret: "idemgate-secrets".to_string(),
            upstream_port: None,
            webhooks_port: None,
            admin_port: None,
            classic: false,
            shutdown_grace: Duration::from_secs(25),
        }
    }
}

/// Why the input could not be injected; the message is for the person at the terminal.
#[derive(Debug, thiserror::Error)]
pub enum InjectError {
    #[error("cannot read {0}: {1}")]
    Read(String, std::io::Error),
    #[error("document {doc}: not valid YAML: {message}")]
    Yaml { doc: usize, message: String },
    #[error("document {doc}: not a Kubernetes object (a mapping with apiVersion and kind)")]
    NotKubernetes { doc: usize },
    #[error("no Kubernetes object in the input")]
    Empty,
    #[error("{object}: {message}")]
    Workload { object: String, message: String },
}

/// The injected YAML, and the notes worth telling the user (on standard error).
#[derive(Debug, Default)]
pub struct Injected {
    pub yaml: String,
    pub notes: Vec<String>,
}

/// `idemgate inject`: reads, injects, writes; exit 1 with a message on any error.
pub fn main(args: InjectArgs) -> ExitCode {
    let input = match read_input(&args) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("idemgate inject: {e}");
            return ExitCode::from(1);
        }
    };
    match inject(&input, &args) {
        Ok(out) => {
            for n in &out.notes {
                eprintln!("idemgate inject: note: {n}");
            }
            print!("{}", out.yaml);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("idemgate inject: {e}");
            ExitCode::from(1)
        }
    }
}

fn read_input(args: &InjectArgs) -> Result<String, InjectError> {
    match args.file.as_deref() {
        None => read_stdin(),
        Some(p) if p.as_os_str() == "-" => read_stdin(),
        Some(p) => {
            std::fs::read_to_string(p).map_err(|e| InjectError::Read(p.display().to_string(), e))
        }
    }
}

fn read_stdin() -> Result<String, InjectError> {
    let mut s = String::new();
    std::io::stdin()
        .read_to_string(&mut s)
        .map_err(|e| InjectError::Read("standard input".into(), e))?;
    Ok(s)
}

/// Injects every workload of a (multi-document) YAML text.
pub fn inject(input: &str, args: &InjectArgs) -> Result<Injected, InjectError> {
    let mut out = Injected::default();
    let mut docs = Vec::new();
    for (i, de) in serde_norway::Deserializer::from_str(input).enumerate() {
        let doc = i + 1;
        let value = Value::deserialize(de).map_err(|e| InjectError::Yaml {
            doc,
            message: e.to_string(),
        })?;
        // An empty document (a stray `---`, or only comments) carries nothing: drop it.
        if value.is_null() {
            continue;
        }
        docs.push((doc, value));
    }
    if docs.is_empty() {
        return Err(InjectError::Empty);
    }
    let mut injected = 0;
    for (doc, value) in &mut docs {
        if !is_object(value) {
            return Err(InjectError::NotKubernetes { doc: *doc });
        }
        injected += inject_object(value, args, &format!("document {doc}"), &mut out.notes)?;
    }
    if injected == 0 {
        out.notes
            .push("no workload to inject (Pod, Deployment, StatefulSet, DaemonSet, ReplicaSet, Job, CronJob)".into());
    }
    let mut yaml = String::new();
    for (i, (doc, value)) in docs.iter().enumerate() {
        if i > 0 {
            yaml.push_str("---\n");
        }
        let text =
            emit::document(value).map_err(|message| InjectError::Yaml { doc: *doc, message })?;
        yaml.push_str(&text);
    }
    Ok(out.with_yaml(yaml))
}

impl Injected {
    fn with_yaml(mut self, yaml: String) -> Self {
        self.yaml = yaml;
        self
    }
}

fn is_object(v: &Value) -> bool {
    matches!(v.get("apiVersion"), Some(Value::String(_)))
        && matches!(v.get("kind"), Some(Value::String(_)))
}

fn str_of<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

/// Injects one object (recursing into `kind: List`); returns how many pods it injected.
fn inject_object(
    obj: &mut Value,
    args: &InjectArgs,
    place: &str,
    notes: &mut Vec<String>,
) -> Result<usize, InjectError> {
    let kind = str_of(obj, "kind").unwrap_or_default().to_string();
    let name = obj
        .get("metadata")
        .and_then(|m| str_of(m, "name"))
        .unwrap_or("<unnamed>")
        .to_string();
    let object = format!("{place} ({kind}/{name})");
    let fail = |message: String| InjectError::Workload {
        object: object.clone(),
        message,
    };

    // Where the pod template lives, by kind.
    let template_path: &[&str] = match kind.as_str() {
        "Pod" => &[],
        "Deployment"
        | "StatefulSet"
        | "DaemonSet"
        | "ReplicaSet"
        | "ReplicationController"
        | "Job" => &["spec", "template"],
        "CronJob" => &["spec", "jobTemplate", "spec", "template"],
        "List" => {
            let mut n = 0;
            if let Some(Value::Sequence(items)) = obj.get_mut("items") {
                for (i, item) in items.iter_mut().enumerate() {
                    if is_object(item) {
                        n += inject_object(item, args, &format!("{place}, item {}", i + 1), notes)?;
                    }
                }
            }
            return Ok(n);
        }
        _ => return Ok(0),
    };
    if args.classic && matches!(kind.as_str(), "Job" | "CronJob") {
        return Err(fail(
            "a classic sidecar never exits, so the Job would never complete; \
             inject it without --classic (the native sidecar needs Kubernetes 1.29+)"
                .into(),
        ));
    }
    let mut template = &mut *obj;
    for key in template_path {
        template = template
            .get_mut(*key)
            .filter(|v| v.is_mapping())
            .ok_or_else(|| fail(format!("no {} in the object", template_path.join("."))))?;
    }
    let template = template
        .as_mapping_mut()
        .ok_or_else(|| fail("the pod template is not a mapping".into()))?;
    if !matches!(template.get("spec"), Some(Value::Mapping(_))) {
        return Err(fail("the pod has no spec".into()));
    }
    if has_idemgate(template) {
        notes.push(format!(
            "{object}: already has an `{CONTAINER}` container; left unchanged"
        ));
        return Ok(0);
    }
    inject_pod(template, args, notes, &object).map_err(fail)?;
    Ok(1)
}

fn containers_of<'a>(spec: &'a Mapping, key: &str) -> impl Iterator<Item = &'a Value> {
    spec.get(key)
        .and_then(Value::as_sequence)
        .into_iter()
        .flatten()
}

fn has_idemgate(template: &Mapping) -> bool {
    let Some(Value::Mapping(spec)) = template.get("spec") else {
        return false;
    };
    containers_of(spec, "containers")
        .chain(containers_of(spec, "initContainers"))
        .any(|c| str_of(c, "name") == Some(CONTAINER))
}

/// A port the pod already declares, and who declares it (for messages).
struct Declared {
    port: u16,
    name: Option<String>,
    container: String,
}

fn declared_ports(spec: &Mapping, keys: &[&str]) -> Vec<Declared> {
    let mut out = Vec::new();
    for key in keys {
        for c in containers_of(spec, key) {
            let container = str_of(c, "name").unwrap_or("<unnamed>").to_string();
            for p in c
                .get("ports")
                .and_then(Value::as_sequence)
                .into_iter()
                .flatten()
            {
                if let Some(port) = p
                    .get("containerPort")
                    .and_then(Value::as_u64)
                    .and_then(|n| u16::try_from(n).ok())
                {
                    out.push(Declared {
                        port,
                        name: str_of(p, "name").map(str::to_string),
                        container: container.clone(),
                    });
                }
            }
        }
    }
    out
}

fn describe(d: &Declared) -> String {
    match &d.name {
        Some(n) => format!("{n}={} (container `{}`)", d.port, d.container),
        None => format!("{} (container `{}`)", d.port, d.container),
    }
}

/// The app's port: `--upstream-port` (a number or a declared port name), or else the
/// only port the app containers declare.
fn upstream_port(args: &InjectArgs, app_ports: &[Declared]) -> Result<u16, String> {
    match args.upstream_port.as_deref() {
        Some(s) => {
            if let Ok(n) = s.parse::<u16>() {
                if n == 0 {
                    return Err("--upstream-port must be 1-65535".into());
                }
                return Ok(n);
            }
            app_ports
                .iter()
                .find(|d| d.name.as_deref() == Some(s))
                .map(|d| d.port)
                .ok_or_else(|| format!("--upstream-port `{s}` is neither a port number nor a port name the app declares"))
        }
        None => match app_ports {
            [only] => Ok(only.port),
            [] => Err(
                "the app declares no containerPort, so idemgate cannot tell where to \
                       forward: pass --upstream-port"
                    .into(),
            ),
            many => Err(format!(
                "the app declares several ports ({}): pass --upstream-port to say which one \
                 receives the webhooks",
                many.iter().map(describe).collect::<Vec<_>>().join(", ")
            )),
        },
    }
}

/// A sidecar port: the explicit one (refused if taken) or the default, moved to the
/// next free port if taken.
fn pick_port(
    flag: &str,
    explicit: Option<u16>,
    default: u16,
    taken: &BTreeMap<u16, String>,
    notes: &mut Vec<String>,
    object: &str,
) -> Result<u16, String> {
    if let Some(p) = explicit {
        if p == 0 {
            return Err(format!("{flag} must be 1-65535"));
        }
        if let Some(who) = taken.get(&p) {
            return Err(format!(
                "{flag} {p} clashes with port {who} that the pod already uses; choose another"
            ));
        }
        return Ok(p);
    }
    let Some(owner) = taken.get(&default) else {
        return Ok(default);
    };
    let p = (default..=u16::MAX)
        .find(|p| !taken.contains_key(p))
        .ok_or_else(|| format!("no free port above {default}: pass {flag}"))?;
    notes.push(format!(
        "{object}: port {default} is taken by {owner}; idemgate uses {p} (set {flag} to choose)"
    ));
    Ok(p)
}

fn yaml_str(s: &str) -> String {
    // A JSON string is a valid YAML double-quoted scalar.
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// The sidecar container, from a YAML template so it reads like the manifest it is.
fn sidecar(args: &InjectArgs, webhooks: u16, admin: u16, upstream: u16) -> Value {
    let restart = if args.classic {
        String::new()
    } else {
        "restartPolicy: Always\n".to_string()
    };
    let text = format!(
        r#"name: {CONTAINER}
image: {image}
imagePullPolicy: IfNotPresent
args: ["run"]
{restart}ports:
- name: {WEBHOOKS_PORT_NAME}
  containerPort: {webhooks}
  protocol: TCP
- name: {ADMIN_PORT_NAME}
  containerPort: {admin}
  protocol: TCP
env:
- name: IDEMGATE_CONFIG
  value: "{CONFIG_FILE}"
- name: IDEMGATE_LISTEN
  value: "0.0.0.0:{webhooks}"
- name: IDEMGATE_ADMIN_LISTEN
  value: "0.0.0.0:{admin}"
- name: IDEMGATE_UPSTREAM
  value: "http://127.0.0.1:{upstream}"
- name: IDEMGATE_LOG_FORMAT
  value: json
- name: IDEMGATE_STORE_URL
  valueFrom:
    secretKeyRef:
      name: {secret}
      key: store-url
      optional: true
volumeMounts:
- name: {CONFIG_VOLUME}
  mountPath: {CONFIG_DIR}
  readOnly: true
- name: {SECRETS_VOLUME}
  mountPath: {SECRETS_DIR}
  readOnly: true
startupProbe:
  httpGet:
    path: /healthz
    port: {ADMIN_PORT_NAME}
  periodSeconds: 1
  failureThreshold: 30
livenessProbe:
  httpGet:
    path: /healthz
    port: {ADMIN_PORT_NAME}
  periodSeconds: 10
  failureThreshold: 3
readinessProbe:
  httpGet:
    path: /readyz
    port: {ADMIN_PORT_NAME}
  periodSeconds: 5
  failureThreshold: 2
lifecycle:
  preStop:
    sleep:
      seconds: {PRE_STOP_SECONDS}
resources:
  requests:
    cpu: 50m
    memory: 32Mi
  limits:
    cpu: 500m
    memory: 128Mi
securityContext:
  runAsNonRoot: true
  runAsUser: 65532
  runAsGroup: 65532
  readOnlyRootFilesystem: true
  allowPrivilegeEscalation: false
  capabilities:
    drop: ["ALL"]
  seccompProfile:
    type: RuntimeDefault
"#,
        image = yaml_str(&args.image),
        secret = yaml_str(&args.secret),
    );
    serde_norway::from_str(&text).expect("the sidecar template is valid YAML")
}

fn volumes(args: &InjectArgs) -> Vec<Value> {
    let text = format!(
        r#"- name: {CONFIG_VOLUME}
  configMap:
    name: {config_map}
- name: {SECRETS_VOLUME}
  secret:
    secretName: {secret}
"#,
        config_map = yaml_str(&args.config_map),
        secret = yaml_str(&args.secret),
    );
    serde_norway::from_str(&text).expect("the volumes template is valid YAML")
}

/// The mapping under `key`, created (at the end) when absent.
fn map_entry<'a>(map: &'a mut Mapping, key: &str) -> Result<&'a mut Mapping, String> {
    let k = Value::from(key);
    if !map.contains_key(&k) || map.get(&k).is_some_and(Value::is_null) {
        map.insert(k.clone(), Value::Mapping(Mapping::new()));
    }
    map.get_mut(&k)
        .and_then(Value::as_mapping_mut)
        .ok_or_else(|| format!("`{key}` is not a mapping"))
}

/// The sequence under `key`, created (at the end) when absent.
fn seq_entry<'a>(map: &'a mut Mapping, key: &str) -> Result<&'a mut Vec<Value>, String> {
    let k = Value::from(key);
    if !map.contains_key(&k) || map.get(&k).is_some_and(Value::is_null) {
        map.insert(k.clone(), Value::Sequence(Vec::new()));
    }
    map.get_mut(&k)
        .and_then(Value::as_sequence_mut)
        .ok_or_else(|| format!("`{key}` is not a list"))
}

fn inject_pod(
    template: &mut Mapping,
    args: &InjectArgs,
    notes: &mut Vec<String>,
    object: &str,
) -> Result<(), String> {
    let spec = map_entry(template, "spec")?;
    if containers_of(spec, "containers").next().is_none() {
        return Err("the pod has no containers".into());
    }

    // Ports: the app's, then the sidecar's two, none clashing with a declared one.
    let app_ports = declared_ports(spec, &["containers"]);
    let upstream = upstream_port(args, &app_ports)?;
    let mut taken: BTreeMap<u16, String> = declared_ports(spec, &["containers", "initContainers"])
        .iter()
        .map(|d| (d.port, describe(d)))
        .collect();
    taken
        .entry(upstream)
        .or_insert_with(|| format!("{upstream} (the upstream port)"));
    for d in declared_ports(spec, &["containers", "initContainers"]) {
        if let Some(n) = &d.name
            && (n == WEBHOOKS_PORT_NAME || n == ADMIN_PORT_NAME)
        {
            return Err(format!(
                "the pod already declares a port named `{n}` ({}); idemgate's ports are named \
                 `{WEBHOOKS_PORT_NAME}` and `{ADMIN_PORT_NAME}`: rename that port",
                describe(&d)
            ));
        }
    }
    let webhooks = pick_port(
        "--webhooks-port",
        args.webhooks_port,
        DEFAULT_WEBHOOKS_PORT,
        &taken,
        notes,
        object,
    )?;
    taken.insert(webhooks, format!("{webhooks} (idemgate's webhooks port)"));
    let admin = pick_port(
        "--admin-port",
        args.admin_port,
        DEFAULT_ADMIN_PORT,
        &taken,
        notes,
        object,
    )?;

    // Volumes: refuse to shadow a volume of the same name that is not ours.
    for v in containers_of(spec, "volumes") {
        if let Some(n) = str_of(v, "name")
            && (n == CONFIG_VOLUME || n == SECRETS_VOLUME)
        {
            return Err(format!(
                "the pod already has a volume named `{n}` but no idemgate container"
            ));
        }
    }

    let container = sidecar(args, webhooks, admin, upstream);
    if args.classic {
        seq_entry(spec, "containers")?.push(container);
    } else {
        // Last among the init containers: the app's own init containers run first, and
        // idemgate stops before any native sidecar declared earlier (a mesh proxy, say).
        seq_entry(spec, "initContainers")?.push(container);
    }
    seq_entry(spec, "volumes")?.extend(volumes(args));

    // Long enough for preStop, then idemgate's drain, before the kubelet's SIGKILL.
    let needed = PRE_STOP_SECONDS + args.shutdown_grace.as_secs() + GRACE_MARGIN_SECONDS;
    let key = Value::from("terminationGracePeriodSeconds");
    match spec.get(&key).and_then(Value::as_u64) {
        Some(current) if current >= needed => {}
        Some(current) => {
            notes.push(format!(
                "{object}: terminationGracePeriodSeconds raised from {current} to {needed} so \
                 that deliveries in flight can drain"
            ));
            spec.insert(key, Value::from(needed));
        }
        None => {
            spec.insert(key, Value::from(needed));
        }
    }

    // The label that the Services, the PodDisruptionBudget and the PodMonitor of k8s/
    // select injected pods by.
    let metadata = map_entry(template, "metadata")?;
    map_entry(metadata, "labels")?.insert(Value::from(POD_LABEL), Value::from("true"));

    // Prometheus' conventional scrape annotations, unless the app already uses them.
    let annotations = map_entry(metadata, "annotations")?;
    let wanted = [
        ("prometheus.io/scrape", "true".to_string()),
        ("prometheus.io/port", admin.to_string()),
        ("prometheus.io/path", "/metrics".to_string()),
    ];
    let clash = wanted.iter().any(|(k, v)| {
        annotations
            .get(*k)
            .is_some_and(|cur| cur.as_str() != Some(v.as_str()))
    });
    if clash {
        notes.push(format!(
            "{object}: the pod's prometheus.io annotations point at the app; left as they are. \
             Scrape idemgate's `{ADMIN_PORT_NAME}` port with the PodMonitor of k8s/monitoring"
        ));
    } else {
        for (k, v) in wanted {
            annotations.insert(Value::from(k), Value::from(v));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
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
        let input = format!(
            "{DEPLOY}      volumes:\n      - name: idemgate-config\n        emptyDir: {{}}\n"
        );
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
}
