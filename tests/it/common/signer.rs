//! The independent signers (tests/signers/*.py): one JSON request on stdin, one JSON
//! answer on stdout. They sign with Python's hmac/cryptography or the providers'
//! official libraries (tests/signers/requirements.txt), never with idemgate's code.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::Value;

/// Runs `tests/signers/{script}` with one JSON request; panics with its stderr if it fails.
pub fn sign_with(script: &str, req: &Value) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/signers")
        .join(script);
    let mut child = Command::new("python3")
        .arg(&path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 runs (scripts/test installs tests/signers/requirements.txt)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(req.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{script} failed for {req}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the signer answers JSON")
}

/// A JSON string's text.
pub fn text(v: &Value) -> String {
    v.as_str().expect("a string").to_string()
}
