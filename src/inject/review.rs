//! The admission webhook's decision: an AdmissionReview (admission.k8s.io/v1) in, the
//! AdmissionReview to answer out. No I/O here, so every case is a unit test; the server
//! around it is `injector`.
//!
//! It never refuses a pod: whatever goes wrong (a body that is not an AdmissionReview,
//! an object that is not a Pod, an annotation it cannot use, a pod `inject` cannot
//! inject) is answered "allowed, unchanged" with a warning, which kubectl prints.

use base64::Engine;
use serde_json::{Value, json};

use super::patch::diff;
use super::pod::{has_idemgate, inject_pod};
use super::{SidecarOptions, parse_quantity};

/// The label or annotation that opts a pod out (`disabled`); `enabled` on a namespace
/// or pod label is what the webhook's selectors send here.
pub const INJECT: &str = "idemgate.dev/inject";
/// Per-pod overrides of the injector's defaults.
pub const CONFIG_MAP: &str = "idemgate.dev/config-map";
pub const UPSTREAM_PORT: &str = "idemgate.dev/upstream-port";
pub const CPU: &str = "idemgate.dev/cpu";
pub const MEMORY: &str = "idemgate.dev/memory";

const API_VERSION: &str = "admission.k8s.io/v1";

/// What to answer: the patch (none: the pod is admitted as it is) and the warnings.
#[derive(Debug, Default)]
struct Answer {
    patch: Option<Vec<Value>>,
    warnings: Vec<String>,
}

impl Answer {
    fn unchanged(why: impl Into<String>) -> Answer {
        Answer {
            patch: None,
            warnings: vec![format!(
                "idemgate: {}; the pod is admitted unchanged",
                why.into()
            )],
        }
    }
}

/// The AdmissionReview answering `body`, with the request's uid when it has one.
pub fn review(body: &[u8], defaults: &SidecarOptions) -> Value {
    let (uid, answer) = match serde_json::from_slice::<Value>(body) {
        Err(e) => (
            String::new(),
            Answer::unchanged(format!("the request is not JSON ({e})")),
        ),
        Ok(v) => {
            let uid = v
                .pointer("/request/uid")
                .and_then(Value::as_str)
                .unwrap_or_default();
            (uid.to_string(), decide(&v, defaults))
        }
    };
    let mut response = json!({"uid": uid, "allowed": true});
    if let Some(ops) = answer.patch.filter(|ops| !ops.is_empty()) {
        let patch = serde_json::to_vec(&ops).unwrap_or_default();
        response["patchType"] = json!("JSONPatch");
        response["patch"] = json!(base64::engine::general_purpose::STANDARD.encode(patch));
    }
    if !answer.warnings.is_empty() {
        response["warnings"] = json!(answer.warnings);
    }
    json!({"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response})
}

fn decide(review: &Value, defaults: &SidecarOptions) -> Answer {
    if review.get("apiVersion").and_then(Value::as_str) != Some(API_VERSION)
        || review.get("kind").and_then(Value::as_str) != Some("AdmissionReview")
    {
        return Answer::unchanged(format!(
            "the request is not an {API_VERSION} AdmissionReview"
        ));
    }
    let Some(req) = review.get("request").filter(|r| r.is_object()) else {
        return Answer::unchanged("the AdmissionReview has no request");
    };
    if req
        .get("uid")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        return Answer::unchanged("the AdmissionReview's request has no uid");
    }
    let field = |p: &str| req.pointer(p).and_then(Value::as_str).unwrap_or_default();
    let (group, version, kind) = (
        field("/kind/group"),
        field("/kind/version"),
        field("/kind/kind"),
    );
    if (group, version, kind) != ("", "v1", "Pod") || !field("/subResource").is_empty() {
        let what = [group, version, kind]
            .iter()
            .filter(|s| !s.is_empty())
            .copied()
            .collect::<Vec<_>>()
            .join("/");
        return Answer::unchanged(format!("only Pods are injected, not `{what}`"));
    }
    if field("/operation") != "CREATE" {
        return Answer::unchanged(format!(
            "only a Pod's CREATE is injected, not `{}`",
            field("/operation")
        ));
    }
    let Some(pod) = req
        .get("object")
        .filter(|o| o.get("spec").is_some_and(Value::is_object))
    else {
        return Answer::unchanged("the request's object is not a Pod with a spec");
    };
    let pod_name = name_of(pod, field("/namespace"));
    let metadata = pod.get("metadata").unwrap_or(&Value::Null);
    let label = metadata
        .pointer(&pointer("labels", INJECT))
        .and_then(Value::as_str);
    let annotation = metadata
        .pointer(&pointer("annotations", INJECT))
        .and_then(Value::as_str);
    for (source, value) in [("label", label), ("annotation", annotation)] {
        match value {
            None | Some("enabled") => {}
            Some("disabled") => return Answer::default(),
            Some(other) => {
                return Answer::unchanged(format!(
                    "pod {pod_name}: the {source} {INJECT}=`{other}` is neither `enabled` nor `disabled`"
                ));
            }
        }
    }
    let options = match overrides(metadata, defaults) {
        Ok(o) => o,
        Err(e) => return Answer::unchanged(format!("pod {pod_name}: {e}")),
    };
    let mut injected = match serde_norway::to_value(pod) {
        Ok(v) => v,
        Err(e) => return Answer::unchanged(format!("pod {pod_name}: {e}")),
    };
    let Some(template) = injected.as_mapping_mut() else {
        return Answer::unchanged("the request's object is not a mapping");
    };
    if has_idemgate(template) {
        return Answer::default();
    }
    let mut notes = Vec::new();
    if let Err(e) = inject_pod(template, &options, &mut notes, &format!("pod {pod_name}")) {
        let e = e.replace(
            "--upstream-port",
            &format!("the annotation {UPSTREAM_PORT}"),
        );
        return Answer::unchanged(format!("pod {pod_name}: {e}"));
    }
    let injected = match serde_json::to_value(&injected) {
        Ok(v) => v,
        Err(e) => return Answer::unchanged(format!("pod {pod_name}: {e}")),
    };
    Answer {
        patch: Some(diff(pod, &injected)),
        warnings: notes
            .into_iter()
            .map(|n| format!("idemgate: {n}"))
            .collect(),
    }
}

/// The pod's name for messages: a ReplicaSet's pods have only a `generateName`.
fn name_of(pod: &Value, namespace: &str) -> String {
    let meta = |k: &str| {
        pod.pointer(&format!("/metadata/{k}"))
            .and_then(Value::as_str)
    };
    let name = match (meta("name"), meta("generateName")) {
        (Some(n), _) => n.to_string(),
        (None, Some(g)) => format!("{g}*"),
        (None, None) => "<unnamed>".to_string(),
    };
    if namespace.is_empty() {
        name
    } else {
        format!("{namespace}/{name}")
    }
}

/// The JSON Pointer to `metadata.<map>[key]` relative to metadata.
fn pointer(map: &str, key: &str) -> String {
    format!("/{map}/{}", key.replace('~', "~0").replace('/', "~1"))
}

/// The injector's defaults with the pod's annotations applied; a value it cannot use is
/// an error that names the annotation.
fn overrides(metadata: &Value, defaults: &SidecarOptions) -> Result<SidecarOptions, String> {
    let mut options = defaults.clone();
    let get = |key: &str| {
        metadata
            .pointer(&pointer("annotations", key))
            .and_then(Value::as_str)
    };
    if let Some(v) = get(CONFIG_MAP) {
        if !is_dns_subdomain(v) {
            return Err(format!(
                "the annotation {CONFIG_MAP}=`{v}` is not a ConfigMap name"
            ));
        }
        options.config_map = v.to_string();
    }
    if let Some(v) = get(UPSTREAM_PORT) {
        options.upstream_port = Some(v.to_string());
    }
    if let Some(v) = get(CPU) {
        options.cpu = Some(parse_quantity(v).map_err(|e| format!("the annotation {CPU}: {e}"))?);
    }
    if let Some(v) = get(MEMORY) {
        options.memory =
            Some(parse_quantity(v).map_err(|e| format!("the annotation {MEMORY}: {e}"))?);
    }
    Ok(options)
}

/// A Kubernetes object name (RFC 1123 subdomain): what a ConfigMap may be called.
fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|part| {
            !part.is_empty()
                && part
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !part.starts_with('-')
                && !part.ends_with('-')
        })
}
