//! Prose that cannot go stale: every path a Markdown document of this repository cites under
//! one of its top folders (`src/…`, `tests/…`, `docs/…`, `deploy/…`, `profiles/…`, `benches/…`,
//! `demo/…`, `fuzz/…`, `proto/…`, `.ci/…`), or as a file under any other folder
//! (`link/README.md`, a folder since removed), exists, in the repository or, for a document
//! inside a workspace crate (tests/fake-nvml/README.md), in that crate.
//!
//! Not paths of this repository, and so not checked: another repository's, written
//! `repo:path` (`k8s-device-plugin:docs/…`); globs and templates (`*`, `{…}`, `<…>`); the user's
//! own files the docs show how to write, named `my-…`; and kubectl's `deploy/NAME` (a
//! Deployment), which has no `/` after the name and stands on a `kubectl` line, not after
//! `-k` or `kustomize`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

const TOP_FOLDERS: [&str; 10] = [
    "src/",
    "tests/",
    "docs/",
    "deploy/",
    "profiles/",
    "benches/",
    "demo/",
    "fuzz/",
    "proto/",
    ".ci/",
];

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The Markdown files git tracks.
fn documents() -> Vec<PathBuf> {
    let out = Command::new("git")
        .args(["ls-files", "*.md"])
        .current_dir(repo())
        .output()
        .expect("git runs (the repository is a git checkout)");
    assert!(out.status.success(), "git ls-files failed");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(PathBuf::from)
        .collect()
}

fn is_path_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "_./-*{}<>".contains(c)
}

/// The repository paths `line` cites: tokens of path characters that begin with a top folder
/// and are not preceded by `:` (another repository's) or a path character.
fn cited(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let chars: Vec<(usize, char)> = line.char_indices().collect();
    let mut i = 0;
    while i < chars.len() {
        let (start, c) = chars[i];
        let before = i.checked_sub(1).map(|j| chars[j].1);
        if !is_path_char(c) || before.is_some_and(|b| is_path_char(b) || b == ':') {
            i += 1;
            continue;
        }
        let mut end = i;
        while end < chars.len() && is_path_char(chars[end].1) {
            end += 1;
        }
        let stop = chars.get(end).map_or(line.len(), |(at, _)| *at);
        let token = line[start..stop].trim_end_matches(['.', '/']);
        if TOP_FOLDERS.iter().any(|top| token.starts_with(top)) || names_a_file(token) {
            out.push(token.to_string());
        }
        i = end;
    }
    out
}

/// A relative path to a file outside the top folders above (`link/README.md`, a folder since
/// removed): a plain folder name (no dot, so not a domain such as `k8s.io/…`), then a file
/// with one of the extensions this repository's files have.
fn names_a_file(token: &str) -> bool {
    const EXTENSIONS: [&str; 10] = [
        ".md", ".rs", ".txt", ".sh", ".py", ".yaml", ".yml", ".toml", ".json", ".proto",
    ];
    let Some((folder, rest)) = token.split_once('/') else {
        return false;
    };
    !folder.is_empty()
        && folder
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        && !rest.is_empty()
        && EXTENSIONS.iter().any(|ext| token.ends_with(ext))
}

fn not_ours(path: &str, line: &str) -> bool {
    let templated = path.contains(['*', '{', '<']);
    let users_own = path.split('/').any(|part| part.starts_with("my-"));
    let kustomization = [format!("-k {path}"), format!("kustomize {path}")];
    let kubectl_deployment = path.starts_with("deploy/")
        && path.matches('/').count() == 1
        && line.contains("kubectl")
        && !kustomization.iter().any(|k| line.contains(k.as_str()));
    templated || users_own || kubectl_deployment
}

/// The folder of the workspace crate holding `document`, if it is not the repository root.
fn crate_of(document: &Path) -> Option<PathBuf> {
    let mut dir = document.parent()?;
    while !dir.as_os_str().is_empty() {
        if repo().join(dir).join("Cargo.toml").is_file() {
            return Some(repo().join(dir));
        }
        dir = dir.parent()?;
    }
    None
}

#[test]
fn every_path_the_docs_cite_exists() {
    let mut missing = BTreeSet::new();
    let mut checked = 0;
    for document in documents() {
        let text = std::fs::read_to_string(repo().join(&document)).unwrap();
        let roots: Vec<PathBuf> = [Some(repo()), crate_of(&document)]
            .into_iter()
            .flatten()
            .collect();
        for (n, line) in text.lines().enumerate() {
            for path in cited(line) {
                if not_ours(&path, line) {
                    continue;
                }
                checked += 1;
                if !roots.iter().any(|root| root.join(&path).exists()) {
                    missing.insert(format!("{}:{}: {path}", document.display(), n + 1));
                }
            }
        }
    }
    assert!(
        checked > 100,
        "only {checked} paths found: is the scan broken?"
    );
    assert!(
        missing.is_empty(),
        "paths cited that do not exist:\n{}",
        missing.into_iter().collect::<Vec<_>>().join("\n")
    );
}

#[test]
fn citations_are_found_as_written() {
    assert_eq!(
        cited("see `src/gpu/tegra.rs`, tests/homelab.rs. Also (docs/dra.md)"),
        ["src/gpu/tegra.rs", "tests/homelab.rs", "docs/dra.md"]
    );
    // Another repository's path, and a path inside a longer one, are not this repository's.
    assert!(cited("k8s-device-plugin:docs/gpu-feature-discovery/README.md").is_empty());
    assert!(cited("vendor/github.com/src/x.go").is_empty());
    // A file under a folder that is not one of the top folders is still this repository's;
    // a domain-led path is not.
    assert_eq!(cited("traced (`link/README.md`)"), ["link/README.md"]);
    assert!(cited("k8s.io/apiserver/pkg/endpoints/handlers/rest.go").is_empty());
    assert!(cited("the resource nvidia.com/gpu and deploy").is_empty());
    assert!(not_ours(
        "deploy/gpu-share-autopilot",
        "kubectl scale deploy/gpu-share-autopilot"
    ));
    assert!(!not_ours("deploy/base", "kubectl apply -k deploy/base"));
    assert!(not_ours("deploy/my-cluster/kustomization.yaml", ""));
}
