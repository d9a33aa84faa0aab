//! The module graph of every crate points one way: no top-level module of a crate reaches,
//! through its `crate::` and `super::` paths, a module that reaches it back (issue 31: the
//! import circles of `shim-runtime` and `control` were taken apart; this keeps them so). Test
//! code (`tests.rs`, and everything from a file's `#[cfg(test)]` on) and comments (a doc link is
//! not a dependency) are left out: a test may reach anything.
//!
//! One crate is not checked: `fake-cuda`, the simulated driver, is one device model whose
//! modules all work on its shared `state` (the way the real driver's state is one), not a layered
//! program; it ships only as the stand-in for a GPU in the demo and the tests.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Top-level module → the top-level modules its code names.
type Graph = BTreeMap<String, BTreeSet<String>>;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("the workspace above crates/cli")
        .to_path_buf()
}

/// Every `.rs` file under `dir`, recursively.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The identifier at the start of `text`.
fn ident(text: &str) -> &str {
    let end = text
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(text.len());
    &text[..end]
}

/// The first segment of every path after `prefix` in `code` (`prefix::name`, and each name of a
/// `prefix::{a, b::c}` group).
fn named_after(code: &str, prefix: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find(prefix) {
        let preceded_by_path = rest[..at].ends_with("::");
        rest = &rest[at + prefix.len()..];
        if preceded_by_path {
            // `super::super::x` is matched by its own prefix, not as `super::x`.
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            names.extend(
                group[..end]
                    .split(',')
                    .map(|part| ident(part.trim()).to_string()),
            );
        } else {
            names.push(ident(rest).to_string());
        }
    }
    names
}

/// The module graph of the crate whose sources are `src`: edges from `crate::` paths everywhere,
/// and from `super::` paths that leave a top-level module (in a top-level directory's `mod.rs`,
/// and `super::super::` one level below it).
fn graph(src: &Path) -> Graph {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let top = |path: &Path| -> Option<String> {
        let rel = path.strip_prefix(src).ok()?;
        let first = rel.components().next()?.as_os_str().to_str()?;
        Some(first.trim_end_matches(".rs").to_string())
    };
    let modules: BTreeSet<String> = files
        .iter()
        .filter_map(|f| top(f))
        .filter(|m| !matches!(m.as_str(), "lib" | "main" | "tests" | "bin"))
        .collect();
    let mut graph = Graph::new();
    for file in &files {
        let Some(module) = top(file).filter(|m| modules.contains(m)) else {
            continue;
        };
        if file.file_stem().is_some_and(|s| s == "tests") {
            continue;
        }
        let text = std::fs::read_to_string(file).expect("reading a source file");
        let code: String = text
            .split("#[cfg(test)]")
            .next()
            .unwrap_or_default()
            .lines()
            .filter(|line| !line.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        let depth = file.strip_prefix(src).map_or(0, |r| r.components().count());
        let is_mod = file.file_name().is_some_and(|n| n == "mod.rs");
        let mut names = named_after(&code, "crate::");
        match (depth, is_mod) {
            (2, true) => names.extend(named_after(&code, "super::")),
            (2, false) | (3, true) => names.extend(named_after(&code, "super::super::")),
            _ => {}
        }
        let edges = graph.entry(module.clone()).or_default();
        edges.extend(
            names
                .into_iter()
                .filter(|n| *n != module && modules.contains(n)),
        );
    }
    graph
}

/// The modules of `graph` that lie on a circle, each with the circle's modules (strongly
/// connected components of more than one module).
fn circles(graph: &Graph) -> Vec<BTreeSet<String>> {
    let reaches = |from: &String| -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.clone()];
        while let Some(m) = todo.pop() {
            for next in graph.get(&m).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    todo.push(next.clone());
                }
            }
        }
        seen
    };
    let reach: BTreeMap<&String, BTreeSet<String>> =
        graph.keys().map(|m| (m, reaches(m))).collect();
    let mut found: Vec<BTreeSet<String>> = Vec::new();
    for (m, from_m) in &reach {
        let circle: BTreeSet<String> = from_m
            .iter()
            .filter(|other| reach.get(other).is_some_and(|r| r.contains(*m)))
            .cloned()
            .collect();
        if !circle.is_empty() && !found.iter().any(|c| c.contains(*m)) {
            found.push(circle);
        }
    }
    found
}

#[test]
fn no_crate_has_an_import_circle() {
    let crates = workspace().join("crates");
    let mut checked = Vec::new();
    let mut failures = Vec::new();
    for entry in std::fs::read_dir(&crates).expect("crates/").flatten() {
        let src = entry.path().join("src");
        if !src.is_dir() {
            continue;
        }
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == "fake-cuda" {
            continue;
        }
        for circle in circles(&graph(&src)) {
            failures.push(format!("{name}: {circle:?}"));
        }
        checked.push(name);
    }
    for required in ["control", "shim-runtime", "shim", "protocol", "cli", "copy"] {
        assert!(
            checked.iter().any(|c| c == required),
            "crates/{required} not found"
        );
    }
    assert!(
        failures.is_empty(),
        "modules that import each other:\n{}",
        failures.join("\n")
    );
}

/// The check finds a circle where there is one (and through `super::` of a directory module).
#[test]
fn a_circle_is_found() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path();
    std::fs::create_dir(src.join("disk")).expect("mkdir");
    std::fs::write(src.join("lib.rs"), "mod capture; mod disk; mod group;").expect("write");
    std::fs::write(
        src.join("capture.rs"),
        "use crate::{group::Group, disk};\n#[cfg(test)]\nuse crate::tests_only;",
    )
    .expect("write");
    // A doc link back to `capture` is not an edge.
    std::fs::write(
        src.join("group.rs"),
        "/// Made by [`crate::capture::Capture`].\npub struct Group;",
    )
    .expect("write");
    std::fs::write(src.join("disk/mod.rs"), "mod checkpoint;").expect("write");
    std::fs::write(
        src.join("disk/checkpoint.rs"),
        "use super::super::capture::x; use super::mod_item;",
    )
    .expect("write");
    let g = graph(src);
    assert_eq!(
        g.get("capture").cloned().unwrap_or_default(),
        BTreeSet::from(["disk".to_string(), "group".to_string()])
    );
    assert_eq!(
        circles(&g),
        vec![BTreeSet::from(["capture".to_string(), "disk".to_string()])]
    );
    std::fs::write(src.join("disk/checkpoint.rs"), "use super::item;").expect("write");
    assert!(circles(&graph(src)).is_empty());
}
