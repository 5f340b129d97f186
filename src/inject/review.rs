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
use super::view::{MetaView, PodView, Review, UidOnly};
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
/// The annotation of a static pod's mirror in the API.
const MIRROR: &str = "kubernetes.io/config.mirror";

/// What to answer: the patch (none: the pod is admitted as it is), the warnings, and
/// the injection's notes.
#[derive(Debug, Default)]
struct Answer {
    patch: Option<Vec<Value>>,
    warnings: Vec<String>,
    notes: Vec<String>,
}

impl Answer {
    fn unchanged(why: impl Into<String>) -> Answer {
        Answer {
            warnings: vec![format!(
                "idemgate: {}; the pod is admitted unchanged",
                why.into()
            )],
            ..Answer::default()
        }
    }
}

/// The AdmissionReview answering a request, and the notes of an injection (a moved
/// port, a raised grace period) for the injector's log: as warnings they would be
/// noise on every pod (the API server's default grace period is always raised).
pub struct Reviewed {
    pub answer: Value,
    pub notes: Vec<String>,
}

/// The AdmissionReview answering `body`, with the request's uid when it has one.
pub fn review(body: &[u8], defaults: &SidecarOptions) -> Reviewed {
    let uid = UidOnly::read(body);
    let answer = match serde_json::from_slice::<Review>(body) {
        Err(e) if e.is_syntax() || e.is_eof() => {
            Answer::unchanged(format!("the request is not JSON ({e})"))
        }
        Err(e) => Answer::unchanged(format!(
            "the request is not an {API_VERSION} AdmissionReview ({e})"
        )),
        Ok(review) => decide(review, defaults),
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
    Reviewed {
        answer: json!({"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response}),
        notes: answer.notes,
    }
}

fn decide(review: Review, defaults: &SidecarOptions) -> Answer {
    if review.api_version.as_deref() != Some(API_VERSION)
        || review.kind.as_deref() != Some("AdmissionReview")
    {
        return Answer::unchanged(format!(
            "the request is not an {API_VERSION} AdmissionReview"
        ));
    }
    let Some(req) = review.request else {
        return Answer::unchanged("the AdmissionReview has no request");
    };
    if req.uid.as_deref().is_none_or(str::is_empty) {
        return Answer::unchanged("the AdmissionReview's request has no uid");
    }
    let kind = req.kind.unwrap_or_default();
    if (
        kind.group.as_str(),
        kind.version.as_str(),
        kind.kind.as_str(),
    ) != ("", "v1", "Pod")
        || req.sub_resource.as_deref().is_some_and(|s| !s.is_empty())
    {
        let what = [&kind.group, &kind.version, &kind.kind]
            .into_iter()
            .filter(|s| !s.is_empty())
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join("/");
        return Answer::unchanged(format!("only Pods are injected, not {what:?}"));
    }
    let operation = req.operation.unwrap_or_default();
    if operation != "CREATE" {
        return Answer::unchanged(format!(
            "only a Pod's CREATE is injected, not {operation:?}"
        ));
    }
    let pod = match req
        .object
        .map(|raw| serde_json::from_str::<PodView>(raw.get()))
    {
        Some(Ok(pod)) => pod,
        Some(Err(e)) => {
            return Answer::unchanged(format!("the request's object is not a Pod ({e})"));
        }
        None => return Answer::unchanged("the request has no object"),
    };
    let no_metadata = MetaView::default();
    let metadata = pod.metadata.as_ref().unwrap_or(&no_metadata);
    let pod_name = name_of(metadata, req.namespace.as_deref().unwrap_or_default());
    // A static pod's mirror: the kubelet runs the pod from its own manifest, and the
    // API server refuses a mirror that names ConfigMaps or Secrets.
    if metadata.has_annotation(MIRROR) {
        return Answer::default();
    }
    let opt_in = [
        ("label", metadata.label(INJECT)),
        ("annotation", metadata.annotation(INJECT)),
    ];
    for (source, value) in opt_in {
        match value {
            None | Some("enabled") => {}
            Some("disabled") => return Answer::default(),
            Some(other) => {
                return Answer::unchanged(format!(
                    "pod {pod_name}: the {source} {INJECT}={other:?} is neither `enabled` nor `disabled`"
                ));
            }
        }
    }
    let options = match overrides(metadata, defaults) {
        Ok(o) => o,
        Err(e) => return Answer::unchanged(format!("pod {pod_name}: {e}")),
    };
    // The view as JSON is what the patch is computed against.
    let (before, mut injected) = match serde_json::to_value(&pod)
        .map_err(|e| e.to_string())
        .and_then(|v| Ok((serde_norway::to_value(&v).map_err(|e| e.to_string())?, v)))
    {
        Ok((yaml, json)) => (json, yaml),
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
        patch: Some(diff(&before, &injected)),
        warnings: Vec::new(),
        notes,
    }
}

/// The pod's name for messages: a ReplicaSet's pods have only a `generateName`.
fn name_of(metadata: &MetaView, namespace: &str) -> String {
    let name = match (&metadata.name, &metadata.generate_name) {
        (Some(n), _) => format!("{n:?}"),
        (None, Some(g)) => format!("{:?}", format!("{g}*")),
        (None, None) => "<unnamed>".to_string(),
    };
    if namespace.is_empty() {
        name
    } else {
        format!("{namespace:?}/{name}")
    }
}

/// The injector's defaults with the pod's annotations applied; a value it cannot use is
/// an error that names the annotation.
fn overrides(metadata: &MetaView, defaults: &SidecarOptions) -> Result<SidecarOptions, String> {
    let mut options = defaults.clone();
    if let Some(v) = metadata.annotation(CONFIG_MAP) {
        if !is_dns_subdomain(v) {
            return Err(format!(
                "the annotation {CONFIG_MAP}={v:?} is not a ConfigMap name"
            ));
        }
        options.config_map = v.to_string();
    }
    if let Some(v) = metadata.annotation(UPSTREAM_PORT) {
        options.upstream_port = Some(v.to_string());
    }
    if let Some(v) = metadata.annotation(CPU) {
        options.cpu = Some(parse_quantity(v).map_err(|e| format!("the annotation {CPU}: {e}"))?);
    }
    if let Some(v) = metadata.annotation(MEMORY) {
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
