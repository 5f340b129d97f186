//! Writes a YAML tree in block style that means the same to every YAML reader that
//! Kubernetes users meet: YAML 1.2 (serde_norway) and YAML 1.1 (kubectl's go-yaml,
//! PyYAML). serde_norway's own emitter writes `yes`, `on` or `0755`-like strings
//! plain only when YAML 1.2 reads them back as strings; kubectl would then read
//! `yes` as a boolean and reject a ConfigMap. Here a string is written plain only when
//! no resolver of either version can take it for anything but a string, and quoted
//! otherwise.

use serde_norway::Value;

/// The whole document, ending in a newline.
pub fn document(v: &Value) -> Result<String, String> {
    let mut out = String::new();
    for line in node(v)? {
        out.push_str(&line);
        out.push('\n');
    }
    Ok(out)
}

/// A node as lines, at indentation 0.
fn node(v: &Value) -> Result<Vec<String>, String> {
    match v {
        Value::Mapping(m) if !m.is_empty() => {
            let mut lines = Vec::new();
            for (k, val) in m {
                let key = scalar(k).ok_or("a mapping key that is not a scalar")?;
                match val {
                    Value::Mapping(c) if !c.is_empty() => {
                        lines.push(format!("{key}:"));
                        lines.extend(node(val)?.into_iter().map(|l| indent(&l, "  ")));
                    }
                    // Kubernetes style: a list under a key sits at the key's indentation.
                    Value::Sequence(c) if !c.is_empty() => {
                        lines.push(format!("{key}:"));
                        lines.extend(node(val)?);
                    }
                    _ => {
                        let mut inner = node(val)?.into_iter();
                        let first = inner.next().unwrap_or_default();
                        lines.push(format!("{key}: {first}"));
                        lines.extend(inner.map(|l| indent(&l, "  ")));
                    }
                }
            }
            Ok(lines)
        }
        Value::Sequence(s) if !s.is_empty() => {
            let mut lines = Vec::new();
            for item in s {
                let mut inner = node(item)?.into_iter();
                let first = inner.next().unwrap_or_default();
                lines.push(format!("- {first}"));
                lines.extend(inner.map(|l| indent(&l, "  ")));
            }
            Ok(lines)
        }
        Value::String(s) => Ok(match literal_block(s) {
            Some(lines) => lines,
            None => vec![quote_if_needed(s)],
        }),
        Value::Tagged(t) => Err(format!("the YAML tag {} is not supported", t.tag)),
        other => Ok(vec![scalar(other).ok_or("an unsupported YAML node")?]),
    }
}

fn indent(line: &str, by: &str) -> String {
    if line.is_empty() {
        String::new()
    } else {
        format!("{by}{line}")
    }
}

/// A scalar (or empty collection) on one line; None for anything else.
fn scalar(v: &Value) -> Option<String> {
    match v {
        Value::Null => Some("null".into()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Number(_) => serde_norway::to_string(v)
            .ok()
            .map(|s| s.trim_end().to_string()),
        Value::String(s) => Some(quote_if_needed(s)),
        Value::Mapping(m) if m.is_empty() => Some("{}".into()),
        Value::Sequence(s) if s.is_empty() => Some("[]".into()),
        _ => None,
    }
}

/// `|` (or `|-`) block for multi-line text whose lines need no escaping.
fn literal_block(s: &str) -> Option<Vec<String>> {
    let body = s.strip_suffix('\n');
    let (text, header) = match body {
        Some(b) => (b, "|"),
        None => (s, "|-"),
    };
    let simple = text.contains('\n')
        && !text.ends_with('\n')
        && text
            .lines()
            .find(|l| !l.is_empty())
            .is_some_and(|l| !l.starts_with([' ', '\t']))
        && text
            .chars()
            .all(|c| c == '\n' || (!c.is_control() && c != '\u{feff}'))
        && text.lines().all(|l| l == l.trim_end());
    if !simple {
        return None;
    }
    let mut lines = vec![header.to_string()];
    // The caller indents the content under its key or dash.
    lines.extend(text.split('\n').map(str::to_string));
    Some(lines)
}

/// The string plain when that is unambiguous, else double-quoted (JSON string syntax is
/// valid YAML double-quoted syntax).
pub fn quote_if_needed(s: &str) -> String {
    if plain_is_safe(s) {
        s.to_string()
    } else {
        serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
    }
}

fn plain_is_safe(s: &str) -> bool {
    let Some(first) = s.chars().next() else {
        return false;
    };
    if !(first.is_ascii_alphanumeric() || first == '/' || first == '_') {
        return false;
    }
    if s.ends_with([' ', ':']) || s.contains(": ") {
        return false;
    }
    if !s
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || " -_./:@+=,~()".contains(c))
    {
        return false;
    }
    const WORDS: [&str; 9] = ["y", "yes", "n", "no", "true", "false", "on", "off", "null"];
    if WORDS.iter().any(|w| s.eq_ignore_ascii_case(w)) {
        return false;
    }
    !looks_numeric_or_timestamp(s)
}

/// Anything a YAML 1.1 or 1.2 resolver could read as an int, float or timestamp:
/// digits with `._:` (octal, sexagesimal, floats), exponents, 0x/0o/0b, dates.
fn looks_numeric_or_timestamp(s: &str) -> bool {
    let b = s.as_bytes();
    if !b[0].is_ascii_digit() {
        return false;
    }
    let lower = s.to_ascii_lowercase();
    if lower.starts_with("0x") || lower.starts_with("0o") || lower.starts_with("0b") {
        return true;
    }
    // A date or timestamp: yyyy-m-d...
    if b.len() >= 8 && b[..4].iter().all(u8::is_ascii_digit) && b[4] == b'-' {
        return true;
    }
    let mantissa = match lower.find('e') {
        Some(i) => {
            let exp = lower[i + 1..].trim_start_matches(['+', '-']);
            if exp.is_empty() || !exp.bytes().all(|c| c.is_ascii_digit()) {
                return false;
            }
            &lower[..i]
        }
        None => &lower[..],
    };
    mantissa
        .bytes()
        .all(|c| c.is_ascii_digit() || c == b'.' || c == b'_' || c == b':')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ambiguous_strings_are_quoted_for_yaml_1_1_readers() {
        for s in [
            "yes",
            "No",
            "on",
            "OFF",
            "y",
            "null",
            "0755",
            "3000",
            "1e3",
            "1_000",
            "1:20",
            "0x1f",
            "2024-01-01",
            "",
            " lead",
            "trail ",
            "-x",
            "a: b",
            "a #b",
            "*ref",
            "~",
        ] {
            assert!(quote_if_needed(s).starts_with('"'), "{s:?} must be quoted");
        }
        for s in [
            "100m",
            "128Mi",
            "payments",
            "registry.example.com/app:1.4.2",
            "/metrics",
            "http://127.0.0.1:3000",
            "keeps its place",
        ] {
            assert_eq!(quote_if_needed(s), s, "{s:?} can stay plain");
        }
    }

    #[test]
    fn round_trips_through_serde_norway() {
        let text = "a:\n  b: [1, 2.5, true, null, 'yes', \"x\\ny\\n\", {}, []]\n  c: {d: '0755'}\n";
        let v: Value = serde_norway::from_str(text).unwrap();
        let out = document(&v).unwrap();
        let back: Value = serde_norway::from_str(&out).unwrap();
        assert_eq!(v, back, "{out}");
    }
}
