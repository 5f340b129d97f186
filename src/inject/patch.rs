//! The JSONPatch (RFC 6902) that turns the pod the API server sent into the injected
//! one: the admission webhook answers with it, so it is all the webhook adds to what
//! `idemgate inject` does.

use serde_json::{Value, json};

/// The operations that turn `old` into `new`. Lists that only grew get `add …/-` for
/// each new element (the sidecar is appended after the pod's own containers and
/// volumes); any other change of a list replaces it whole.
pub fn diff(old: &Value, new: &Value) -> Vec<Value> {
    let mut ops = Vec::new();
    diff_at(&mut String::new(), old, new, &mut ops);
    ops
}

fn diff_at(path: &mut String, old: &Value, new: &Value, ops: &mut Vec<Value>) {
    if old == new {
        return;
    }
    match (old, new) {
        (Value::Object(a), Value::Object(b)) => {
            for key in a.keys().filter(|k| !b.contains_key(*k)) {
                ops.push(json!({"op": "remove", "path": child(path, key)}));
            }
            for (key, value) in b {
                match a.get(key) {
                    Some(before) => {
                        let len = path.len();
                        path.push_str(&child("", key));
                        diff_at(path, before, value, ops);
                        path.truncate(len);
                    }
                    None => {
                        ops.push(json!({"op": "add", "path": child(path, key), "value": value}))
                    }
                }
            }
        }
        (Value::Array(a), Value::Array(b)) if b.len() > a.len() && b[..a.len()] == a[..] => {
            for value in &b[a.len()..] {
                ops.push(json!({"op": "add", "path": format!("{path}/-"), "value": value}));
            }
        }
        _ => ops.push(json!({"op": "replace", "path": path.clone(), "value": new})),
    }
}

/// `path` followed by the JSON Pointer token for `key` (`~` and `/` escaped).
fn child(path: &str, key: &str) -> String {
    format!("{path}/{}", key.replace('~', "~0").replace('/', "~1"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Applies the three operations `diff` emits: enough to check it round-trips
    /// (the end-to-end tests apply its patches with an independent implementation).
    fn apply(doc: &mut Value, ops: &[Value]) {
        for op in ops {
            let path = op["path"].as_str().unwrap();
            let (parent, last) = path.rsplit_once('/').unwrap();
            let last = last.replace("~1", "/").replace("~0", "~");
            let target = doc.pointer_mut(parent).unwrap();
            match (op["op"].as_str().unwrap(), target) {
                ("add", Value::Array(a)) if last == "-" => a.push(op["value"].clone()),
                ("add" | "replace", Value::Object(m)) => {
                    m.insert(last, op["value"].clone());
                }
                ("replace", Value::Array(a)) => {
                    a[last.parse::<usize>().unwrap()] = op["value"].clone()
                }
                ("remove", Value::Object(m)) => {
                    m.remove(&last);
                }
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    #[test]
    fn appends_to_lists_escapes_keys_and_round_trips() {
        let old = json!({
            "metadata": {"labels": {"app": "x"}},
            "spec": {"containers": [{"name": "app"}], "gone": 1, "n": 30}
        });
        let new = json!({
            "metadata": {"labels": {"app": "x", "idemgate.io/webhooks": "true", "a~b": "2"},
                         "annotations": {"a~b": "1"}},
            "spec": {"containers": [{"name": "app"}, {"name": "idemgate"}], "n": 35,
                     "volumes": [{"name": "v"}]}
        });
        let ops = diff(&old, &new);
        assert!(ops.contains(
            &json!({"op": "add", "path": "/metadata/labels/idemgate.io~1webhooks", "value": "true"})
        ));
        assert!(ops.contains(&json!({"op": "add", "path": "/metadata/labels/a~0b", "value": "2"})));
        assert!(ops.contains(
            &json!({"op": "add", "path": "/spec/containers/-", "value": {"name": "idemgate"}})
        ));
        assert!(ops.contains(
            &json!({"op": "add", "path": "/metadata/annotations", "value": {"a~b": "1"}})
        ));
        assert!(ops.contains(&json!({"op": "remove", "path": "/spec/gone"})));
        let mut doc = old.clone();
        apply(&mut doc, &ops);
        assert_eq!(doc, new);
        assert!(diff(&new, &new).is_empty());
    }

    #[test]
    fn a_list_that_changed_in_place_is_replaced_whole() {
        let old = json!({"l": [1, 2]});
        let new = json!({"l": [3, 2, 1]});
        assert_eq!(
            diff(&old, &new),
            vec![json!({"op": "replace", "path": "/l", "value": [3, 2, 1]})]
        );
    }
}
