//! The layering of src/: each top-level module names (`crate::x`, `use crate::{x, ..}`)
//! only modules of a lower layer, so the import graph has no loop. The layers are data
//! below; today's known exceptions are listed with the step that removes each, and the
//! test fails both on a new exception and on a listed one that no longer exists.
//!
//! Reading rules, as `module-cycles` reads src/: `src/x.rs` and `src/x/**` are module `x`
//! (lib.rs and main.rs are the crate root, not modules); a file is read up to its first
//! `#[cfg(test)]`; `//` comments are skipped.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Bottom to top: a module may name modules of lower layers only. Names that do not
/// exist yet (app, console, ops) are where the console, ops and wiring modules go.
const LAYERS: &[&[&str]] = &[
    // Leaves and the config: upstream, logging and inject name no other module today
    // but conn (how every listener serves a connection), which names none.
    &["conn"],
    &["config", "upstream", "logging", "inject"],
    // Each needs only config: metrics its route settings, providers the parsed routes,
    // trace its `[tracing]` section.
    &["providers", "metrics", "trace"],
    &["store"],
    &["answer"],
    &["queue"],
    &["gate"],
    // The operator's side: delivery log and replay, the web console, health/metrics.
    &["deliveries", "web", "console", "probes", "ops", "reload"],
    // The wiring: may name each other (server starts the app, demo starts the server),
    // never in a loop.
    &["app", "server", "demo"],
];

/// Edges inside one layer that are allowed (from, to, why).
const SIBLINGS: &[(&str, &str, &str)] = &[
    (
        "web",
        "deliveries",
        "the console runs the operator's replay",
    ),
    (
        "console",
        "deliveries",
        "the console runs the operator's replay",
    ),
    ("web", "reload", "POST /admin/reload and GET /admin/config"),
];

/// Today's violations (from, to, why, the step that removes it). Shrinks as they go.
const KNOWN: &[(&str, &str, &str, &str)] = &[];

/// The guard itself: fails on a new upward or sideways edge and on a stale KNOWN entry.
#[test]
fn every_module_names_only_lower_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let edges = module_edges(&src);
    let layer: BTreeMap<&str, usize> = LAYERS
        .iter()
        .enumerate()
        .flat_map(|(i, mods)| mods.iter().map(move |m| (*m, i)))
        .collect();
    let top = LAYERS.len() - 1;
    let mut problems = Vec::new();

    for m in top_level_modules(&src) {
        if !layer.contains_key(m.as_str()) {
            problems.push(format!("module `{m}` has no layer: add it to LAYERS"));
        }
    }

    let mut violations = BTreeSet::new();
    let mut wiring = Vec::new();
    for ((from, to), sites) in &edges {
        let (Some(&lf), Some(&lt)) = (layer.get(from.as_str()), layer.get(to.as_str())) else {
            continue; // reported above
        };
        let inside_wiring = lt == lf && lf == top;
        if inside_wiring {
            wiring.push((from.clone(), to.clone()));
        }
        if lt < lf || inside_wiring || SIBLINGS.iter().any(|(a, b, _)| a == from && b == to) {
            continue;
        }
        violations.insert((from.clone(), to.clone()));
        if !KNOWN.iter().any(|(a, b, _, _)| a == from && b == to) {
            problems.push(format!(
                "new: `{from}` (layer {lf}) names `{to}` (layer {lt}) at {}: name a lower \
                 layer instead",
                sites.join(", ")
            ));
        }
    }
    for (from, to, why, step) in KNOWN {
        if !violations.contains(&(from.to_string(), to.to_string())) {
            problems.push(format!(
                "gone: `{from}` no longer names `{to}` ({why}; removed by: {step}): \
                 delete it from KNOWN"
            ));
        }
    }
    if let Some(lp) = wiring_loop(&wiring) {
        problems.push(format!("loop in the wiring layer: {}", lp.join(" -> ")));
    }
    assert!(
        problems.is_empty(),
        "the layering of src/ changed:\n  {}",
        problems.join("\n  ")
    );
}

/// The guard is only as good as its reader: paths, nested groups, comments, tests.
#[test]
fn the_reader_finds_paths_and_groups_and_skips_comments_and_tests() {
    let text = "use crate::config::Config;\n\
                use crate::{store::{Store, memory}, answer};\n\
                // crate::web::audit in a comment\n\
                fn f() { crate::metrics::Outcome::Ok; x::crate::not; }\n\
                #[cfg(test)]\nmod tests { use crate::gate::Gate; }\n";
    let names: Vec<String> = named_modules(text).into_iter().map(|(m, _)| m).collect();
    assert_eq!(names, ["config", "store", "answer", "metrics"]);
}

/// (from, to) → the `file:line`s where `from` names `to`.
fn module_edges(src: &Path) -> BTreeMap<(String, String), Vec<String>> {
    let modules = top_level_modules(src);
    let mut edges: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    let mut files = Vec::new();
    rust_files(src, &mut files);
    for path in files {
        let rel = path
            .strip_prefix(src)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let first = rel.split('/').next().unwrap();
        let from = first.strip_suffix(".rs").unwrap_or(first).to_string();
        if !modules.contains(&from) {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for (to, line) in named_modules(&text) {
            if to != from && modules.contains(&to) {
                let sites = edges.entry((from.clone(), to)).or_default();
                sites.push(format!("src/{rel}:{line}"));
            }
        }
    }
    edges
}

/// `src/x.rs` and `src/x/` are module `x`.
fn top_level_modules(src: &Path) -> BTreeSet<String> {
    std::fs::read_dir(src)
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            if e.path().is_dir() {
                Some(name)
            } else {
                let m = name.strip_suffix(".rs")?;
                (m != "lib" && m != "main").then(|| m.to_string())
            }
        })
        .collect()
}

/// Every `.rs` file under `dir`, recursively.
fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The first path segment after each `crate::` (each item of a `crate::{..}` group),
/// with its line, in a file's text before `#[cfg(test)]`, outside `//` comments.
fn named_modules(text: &str) -> Vec<(String, usize)> {
    let text = &text[..text.find("#[cfg(test)]").unwrap_or(text.len())];
    let code: String = text
        .lines()
        .map(|l| l.find("//").map_or(l, |i| &l[..i]))
        .collect::<Vec<_>>()
        .join("\n");
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut found = Vec::new();
    let mut at = 0;
    while let Some(i) = code[at..].find("crate::") {
        let start = at + i;
        at = start + "crate::".len();
        let before = code[..start].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        let line = code[..start].matches('\n').count() + 1;
        let rest = &code[at..];
        if let Some(group) = rest.strip_prefix('{') {
            // Split the group at its own commas only: `{a::{X, Y}, b}` names a and b.
            let (mut depth, mut item_start) = (0, true);
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => item_start = true,
                    c if item_start && !c.is_whitespace() => {
                        item_start = false;
                        let name = ident(&group[j..]);
                        if !name.is_empty() {
                            found.push((name, line));
                        }
                    }
                    _ => {}
                }
            }
        } else {
            let name = ident(rest);
            if !name.is_empty() {
                found.push((name, line));
            }
        }
    }
    found
}

/// A loop among the wiring layer's own edges, if any.
fn wiring_loop(edges: &[(String, String)]) -> Option<Vec<String>> {
    fn walk(at: &str, edges: &[(String, String)], path: &mut Vec<String>) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == at) {
            let mut lp = path[i..].to_vec();
            lp.push(at.to_string());
            return Some(lp);
        }
        path.push(at.to_string());
        for (a, b) in edges {
            if a == at
                && let Some(lp) = walk(b, edges, path)
            {
                return Some(lp);
            }
        }
        path.pop();
        None
    }
    edges
        .iter()
        .find_map(|(a, _)| walk(a, edges, &mut Vec::new()))
}
