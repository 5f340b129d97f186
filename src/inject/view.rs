//! What the injector reads of an AdmissionReview, and of its Pod only what
//! `inject_pod` reads or changes: the rest (a container's args, env, …) is skipped
//! while parsing, so a large pod costs the injector no memory beyond its body.
//!
//! The view serializes back to the same paths it came from, so the patch that turns
//! the view into the injected view applies to the whole pod: injection only appends to
//! lists and adds or raises fields, and the view keeps every element of the lists it
//! appends to (with only the fields injection reads: it never changes an element).
//! Its lists and maps are capped, so what a crafted review costs is bounded too.

use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;

/// The review's envelope; `request.object` stays raw until the request is a Pod's.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Review {
    pub api_version: Option<String>,
    pub kind: Option<String>,
    pub request: Option<Request>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Request {
    pub uid: Option<String>,
    pub kind: Option<Kind>,
    pub sub_resource: Option<String>,
    pub operation: Option<String>,
    pub namespace: Option<String>,
    pub object: Option<Box<RawValue>>,
}

/// The object's group, version and kind.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct Kind {
    pub group: String,
    pub version: String,
    pub kind: String,
}

/// Just the uid, read on its own so that an answer echoes it even when the rest of
/// the request does not parse.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct UidOnly {
    request: Option<UidRequest>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct UidRequest {
    uid: Option<Value>,
}

impl UidOnly {
    /// The request's uid, or "" when there is none to echo.
    pub fn read(body: &[u8]) -> String {
        serde_json::from_slice::<UidOnly>(body)
            .ok()
            .and_then(|u| u.request?.uid)
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default()
    }
}

/// The most elements a list or map of the view may hold: far above any real pod
/// (the API server caps a pod near 1.5 MiB), and what bounds a crafted review's cost.
pub const MAX_ELEMENTS: usize = 1024;

/// The parts of a Pod that injection reads or writes, typed: a field of another type
/// than Kubernetes gives it fails the parse (and the pod is admitted unchanged).
#[derive(Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodView {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<MetaView>,
    pub spec: SpecView,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct MetaView {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub generate_name: Option<String>,
    #[serde(
        skip_serializing_if = "Option::is_none",
        deserialize_with = "capped_map"
    )]
    pub labels: Option<BTreeMap<String, String>>,
    #[serde(
        skip_serializing_if = "Option::is_none",
        deserialize_with = "capped_map"
    )]
    pub annotations: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct SpecView {
    #[serde(
        skip_serializing_if = "Option::is_none",
        deserialize_with = "capped_list"
    )]
    containers: Option<Vec<ContainerView>>,
    #[serde(
        skip_serializing_if = "Option::is_none",
        deserialize_with = "capped_list"
    )]
    init_containers: Option<Vec<ContainerView>>,
    #[serde(
        skip_serializing_if = "Option::is_none",
        deserialize_with = "capped_list"
    )]
    volumes: Option<Vec<Named>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    termination_grace_period_seconds: Option<i64>,
}

/// A container's name (to find `idemgate`) and ports (to pick free ones). Its other
/// fields are not needed: injection never changes an existing container.
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(default)]
struct ContainerView {
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    #[serde(
        skip_serializing_if = "Option::is_none",
        deserialize_with = "capped_list"
    )]
    ports: Option<Vec<PortView>>,
}

/// What injection reads of a declared port.
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
struct PortView {
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    container_port: Option<i64>,
}

/// A volume, by its name (to refuse shadowing one).
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(default)]
struct Named {
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<String>,
}

impl MetaView {
    /// A label's value.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels.as_ref()?.get(key).map(String::as_str)
    }

    /// An annotation's value.
    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations.as_ref()?.get(key).map(String::as_str)
    }

    pub fn has_annotation(&self, key: &str) -> bool {
        self.annotation(key).is_some()
    }
}

/// A list of at most [`MAX_ELEMENTS`]; `null` is none.
fn capped_list<'de, D, T>(d: D) -> Result<Option<Vec<T>>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct Capped<T>(PhantomData<T>);
    impl<'de, T: Deserialize<'de>> Visitor<'de> for Capped<T> {
        type Value = Option<Vec<T>>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            write!(f, "a list of at most {MAX_ELEMENTS} elements")
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some(item) = seq.next_element()? {
                if out.len() == MAX_ELEMENTS {
                    return Err(de::Error::custom(format!(
                        "more than {MAX_ELEMENTS} elements in a list"
                    )));
                }
                out.push(item);
            }
            Ok(Some(out))
        }
    }
    d.deserialize_any(Capped(PhantomData))
}

/// A string map of at most [`MAX_ELEMENTS`] entries; `null` is none.
fn capped_map<'de, D>(d: D) -> Result<Option<BTreeMap<String, String>>, D::Error>
where
    D: Deserializer<'de>,
{
    struct Capped;
    impl<'de> Visitor<'de> for Capped {
        type Value = Option<BTreeMap<String, String>>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            write!(f, "a map of at most {MAX_ELEMENTS} strings")
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut out = BTreeMap::new();
            while let Some((k, v)) = map.next_entry::<String, String>()? {
                if out.len() == MAX_ELEMENTS {
                    return Err(de::Error::custom(format!(
                        "more than {MAX_ELEMENTS} entries in a map"
                    )));
                }
                out.insert(k, v);
            }
            Ok(Some(out))
        }
    }
    d.deserialize_any(Capped)
}
