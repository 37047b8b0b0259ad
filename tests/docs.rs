//! The docs name the tree as it is: every source path README.md and docs/*.md put in
//! backticks exists. A file moved without its docs is how a reader ends up in a file
//! that is not there (BENCHMARKS.md is a dated record, and keeps the paths of its day).

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "a test: a failed step fails it, with the panic's message")]

use std::path::{Path, PathBuf};

/// Top-level directories: a path starting with one is named from the repository root;
/// any other (`reconcile/place.rs`, `events/rows.rs`) may end a path anywhere in the tree.
const ROOTS: &[&str] =
    &["crates/", "src/", "tests/", "docs/", "examples/", "deploy/", "agent/", "loadtest/", "fuzz/", ".ci/"];
/// Named in the docs, made when the tools run (`fuzz/run.sh`, a Python venv): not in git.
const MADE_AT_RUN_TIME: &[&str] = &["fuzz/scratch/", "fuzz/corpus/", "fuzz/artifacts/"];
const SOURCE_EXTENSIONS: &[&str] = &["rs", "toml", "md", "py", "sh", "proto", "html", "js", "css", "yaml", "yml"];

#[test]
fn every_path_the_docs_name_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut tree = Vec::new();
    walk(root, root, &mut tree);
    let mut docs = vec![root.join("README.md")];
    docs.extend(
        std::fs::read_dir(root.join("docs"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "md")),
    );
    let mut missing = Vec::new();
    for doc in &docs {
        let text = std::fs::read_to_string(doc).unwrap();
        for (line, named) in named_paths(&text) {
            if !exists(&named, &tree) {
                missing.push(format!("{}:{line}: {named}", doc.strip_prefix(root).unwrap().display()));
            }
        }
    }
    assert!(missing.is_empty(), "paths the docs name that are not in the tree:\n{}", missing.join("\n"));
}

#[test]
fn the_path_check_reads_what_it_should() {
    let found: Vec<String> = named_paths(
        "`crates/pool/src/{model,policy}.rs`, `reconcile/*.rs`, `GET /v1/nodes`, `https://x/a.rs`, \
         `DATA/pools/NAME.json`, `--flag`, `ui/`, `fuzz/corpus/TARGET/`",
    )
    .into_iter()
    .map(|(_, p)| p)
    .collect();
    assert_eq!(found, ["crates/pool/src/model.rs", "crates/pool/src/policy.rs", "reconcile/*.rs"]);
    let tree = ["crates/pool/src/model.rs", "crates/scheduler/src/reconcile/", "crates/scheduler/src/reconcile/mod.rs"]
        .map(String::from);
    assert!(exists("crates/pool/src/model.rs", &tree));
    assert!(exists("reconcile/*.rs", &tree));
    assert!(exists("reconcile/", &tree));
    assert!(!exists("src/model.rs", &tree), "a path from the root is matched from the root");
    assert!(exists("pool/src/model.rs", &tree));
    assert!(!exists("crates/pool/src/events.rs", &tree));
}

/// Every file and directory (with a trailing `/`) under `dir`, relative to `root`.
fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path: PathBuf = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if matches!(name.as_str(), "target" | ".git" | "node_modules" | ".venv") {
            continue;
        }
        let rel = path.strip_prefix(root).unwrap().to_string_lossy().to_string();
        if path.is_dir() {
            out.push(format!("{rel}/"));
            walk(root, &path, out);
        } else {
            out.push(rel);
        }
    }
}

/// The source paths in backticks, by line, with `{a,b}` expanded. Not paths: URLs, HTTP
/// routes (`/v1/…`), flags, and placeholders (an all-capitals segment such as `DATA/`).
fn named_paths(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        for (i, token) in line.split('`').enumerate() {
            if i % 2 == 0 || token.is_empty() || token.contains(char::is_whitespace) {
                continue;
            }
            if token.contains("://") || token.starts_with(['/', '$', '-', '.']) && !token.starts_with(".ci/") {
                continue;
            }
            let placeholder = token.split('/').any(|s| {
                let word = s.split('.').next().unwrap_or_default();
                word.len() > 1 && word.chars().all(|c| c.is_ascii_uppercase() || c == '_' || c == '-')
            });
            if placeholder || MADE_AT_RUN_TIME.iter().any(|m| token.starts_with(m)) {
                continue;
            }
            let from_root = ROOTS.iter().any(|r| token.starts_with(r));
            let source = token.rsplit_once('.').is_some_and(|(_, ext)| SOURCE_EXTENSIONS.contains(&ext));
            if !(from_root || source) {
                continue;
            }
            for path in expand(token) {
                out.push((n + 1, path));
            }
        }
    }
    out
}

fn expand(token: &str) -> Vec<String> {
    match (token.find('{'), token.find('}')) {
        (Some(a), Some(b)) if a < b => {
            token[a + 1..b].split(',').map(|alt| format!("{}{alt}{}", &token[..a], &token[b + 1..])).collect()
        }
        _ => vec![token.to_string()],
    }
}

/// Whether `named` is in `tree`: from the root when it starts at a top-level directory,
/// else as the end of some path; `*` stands for any part of one name. A name ending in
/// `/` is a directory.
fn exists(named: &str, tree: &[String]) -> bool {
    let from_root = ROOTS.iter().any(|r| named.starts_with(r));
    let dir = named.ends_with('/');
    let named = named.trim_end_matches('/');
    let parts = named.split('/').count();
    tree.iter().filter(|t| !dir || t.ends_with('/')).any(|t| {
        let t = t.trim_end_matches('/');
        if from_root {
            return glob(named, t);
        }
        let segments: Vec<&str> = t.split('/').collect();
        segments.len() >= parts && glob(named, &segments[segments.len() - parts..].join("/"))
    })
}

/// `pattern` matches `text` whole, `*` matching any run of characters but `/`.
fn glob(pattern: &str, text: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == text,
        Some((head, rest)) => {
            let Some(after) = text.strip_prefix(head) else { return false };
            (0..=after.len())
                .filter(|&i| after.is_char_boundary(i))
                .take_while(|&i| !after[..i].contains('/'))
                .any(|i| glob(rest, &after[i..]))
        }
    }
}
