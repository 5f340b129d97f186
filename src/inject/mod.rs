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

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

mod emit;
pub mod injector;
mod patch;
mod pod;
mod review;
#[cfg(test)]
mod tests;
mod view;

use serde::Deserialize;
use serde_norway::Value;

use pod::{has_idemgate, inject_pod};

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

/// The command line of `idemgate inject`: the input, and the sidecar's options.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct InjectArgs {
    /// Kubernetes YAML to inject (`-` or nothing: standard input). The result goes to
    /// standard output; notes go to standard error.
    pub file: Option<PathBuf>,
    #[command(flatten)]
    pub sidecar: SidecarOptions,
}

/// What the added sidecar looks like: shared by `idemgate inject` (flags) and the
/// admission webhook (its flags are the defaults, pod annotations override a few).
#[derive(Debug, Clone, clap::Args)]
pub struct SidecarOptions {
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
    /// The sidecar's CPU request (a Kubernetes quantity, e.g. `100m`); it also drops
    /// the CPU limit, which would otherwise have to stay above it. Default: request
    /// 50m, limit 500m.
    #[arg(long, value_parser = parse_quantity)]
    pub cpu: Option<String>,
    /// The sidecar's memory request and limit (a quantity, e.g. `64Mi`). Default:
    /// request 32Mi, limit 128Mi.
    #[arg(long, value_parser = parse_quantity)]
    pub memory: Option<String>,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("`{s}`: {e}"))
}

/// A Kubernetes resource quantity as the sidecar's requests take it: a positive
/// decimal with an optional SI or binary suffix (`250m`, `0.5`, `64Mi`, `1G`).
pub fn parse_quantity(s: &str) -> Result<String, String> {
    const SUFFIXES: &[&str] = &[
        "", "m", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei",
    ];
    let digits = s.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let suffix = &s[digits.len()..];
    let number_ok = !digits.is_empty()
        && digits.chars().all(|c| c.is_ascii_digit() || c == '.')
        && digits.matches('.').count() <= 1
        && digits.chars().any(|c| c.is_ascii_digit() && c != '0');
    if number_ok && SUFFIXES.contains(&suffix) {
        Ok(s.to_string())
    } else {
        Err(format!(
            "{s:?} is not a positive Kubernetes quantity (e.g. 100m, 0.5, 64Mi)"
        ))
    }
}

impl Default for SidecarOptions {
    fn default() -> Self {
        SidecarOptions {
            image: DEFAULT_IMAGE.to_string(),
            config_map: "idemgate".to_string(),
            secret: "idemgate-secrets".to_string(),
            upstream_port: None,
            webhooks_port: None,
            admin_port: None,
            classic: false,
            shutdown_grace: Duration::from_secs(25),
            cpu: None,
            memory: None,
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
    match inject(&input, &args.sidecar) {
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
pub fn inject(input: &str, args: &SidecarOptions) -> Result<Injected, InjectError> {
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

pub(super) fn str_of<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

/// Injects one object (recursing into `kind: List`); returns how many pods it injected.
fn inject_object(
    obj: &mut Value,
    args: &SidecarOptions,
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
