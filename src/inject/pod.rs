//! One pod template: the ports already declared, the sidecar container, its volumes,
//! and the patch that adds them (native sidecar or classic container).

use std::collections::BTreeMap;

use serde_norway::{Mapping, Value};

use super::{CONFIG_DIR, CONFIG_FILE, CONTAINER, POD_LABEL, SECRETS_DIR, SidecarOptions, str_of};

const CONFIG_VOLUME: &str = "idemgate-config";
const SECRETS_VOLUME: &str = "idemgate-secrets";
const WEBHOOKS_PORT_NAME: &str = "webhooks";
const ADMIN_PORT_NAME: &str = "admin";
const DEFAULT_WEBHOOKS_PORT: u16 = 8080;
const DEFAULT_ADMIN_PORT: u16 = 9090;
/// The preStop sleep: long enough for the pod's endpoints to be withdrawn from the
/// Service before idemgate stops accepting deliveries.
const PRE_STOP_SECONDS: u64 = 5;
/// The sidecar's resources unless `--cpu`/`--memory` (or the pod's annotations) say.
const DEFAULT_CPU_REQUEST: &str = "50m";
const DEFAULT_CPU_LIMIT: &str = "500m";
const DEFAULT_MEMORY_REQUEST: &str = "32Mi";
const DEFAULT_MEMORY_LIMIT: &str = "128Mi";
/// Slack on top of preStop + shutdown_grace before the kubelet sends SIGKILL.
const GRACE_MARGIN_SECONDS: u64 = 5;

fn containers_of<'a>(spec: &'a Mapping, key: &str) -> impl Iterator<Item = &'a Value> {
    spec.get(key)
        .and_then(Value::as_sequence)
        .into_iter()
        .flatten()
}

pub(super) fn has_idemgate(template: &Mapping) -> bool {
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
fn upstream_port(args: &SidecarOptions, app_ports: &[Declared]) -> Result<u16, String> {
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
                .ok_or_else(|| format!("--upstream-port {s:?} is neither a port number nor a port name the app declares"))
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
fn sidecar(args: &SidecarOptions, webhooks: u16, admin: u16, upstream: u16) -> Value {
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
    cpu: {cpu_request}
    memory: {memory_request}
  limits:
{cpu_limit}    memory: {memory_limit}
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
        cpu_request = yaml_str(args.cpu.as_deref().unwrap_or(DEFAULT_CPU_REQUEST)),
        // A CPU request of the user's own drops the limit: a limit must stay above its
        // request, and a throttled proxy adds latency to every delivery.
        cpu_limit = match args.cpu {
            Some(_) => String::new(),
            None => format!("    cpu: {DEFAULT_CPU_LIMIT}\n"),
        },
        memory_request = yaml_str(args.memory.as_deref().unwrap_or(DEFAULT_MEMORY_REQUEST)),
        memory_limit = yaml_str(args.memory.as_deref().unwrap_or(DEFAULT_MEMORY_LIMIT)),
    );
    serde_norway::from_str(&text).expect("the sidecar template is valid YAML")
}

fn volumes(args: &SidecarOptions) -> Vec<Value> {
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

pub(super) fn inject_pod(
    template: &mut Mapping,
    args: &SidecarOptions,
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
