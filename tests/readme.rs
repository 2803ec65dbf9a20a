//! The README is a tested document: every shell block says whether CI runs it (and why not),
//! and CI runs the first block before anything else. `.ci/readme.py` runs the blocks; these
//! tests keep the markers and `.ci/run` honest under `cargo test`.

use std::path::Path;

fn read(path: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(path)).unwrap()
}

/// (line, marker kind, first command) of each ```sh block.
fn shell_blocks(readme: &str) -> Vec<(usize, Option<String>, String)> {
    let lines: Vec<&str> = readme.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if *line != "```sh" {
            continue;
        }
        let marker = i
            .checked_sub(1)
            .and_then(|above| lines[above].strip_prefix("<!-- ci: "))
            .and_then(|m| m.strip_suffix(" -->"))
            .and_then(|m| m.split_once(": "))
            .filter(|(_, why)| !why.trim().is_empty())
            .map(|(kind, _)| kind.to_string());
        let first = lines.get(i + 1).unwrap_or(&"").to_string();
        out.push((i + 1, marker, first));
    }
    out
}

#[test]
fn every_readme_shell_block_says_whether_ci_runs_it() {
    let blocks = shell_blocks(&read("README.md"));
    assert!(blocks.len() >= 5, "{blocks:?}");
    for (line, marker, first) in &blocks {
        let kind = marker.as_deref().unwrap_or_else(|| {
            panic!("README.md:{line} ({first}): no `<!-- ci: run|not run: why -->` above it")
        });
        assert!(
            ["run first", "run", "not run"].contains(&kind),
            "README.md:{line}: unknown marker {kind:?}"
        );
    }
    let kinds: Vec<_> = blocks.iter().map(|(_, k, _)| k.as_deref()).collect();
    assert_eq!(kinds[0], Some("run first"), "the first block runs first");
    assert_eq!(
        kinds.iter().filter(|k| **k == Some("run first")).count(),
        1,
        "one block runs first"
    );
    // The new user's commands: the demo and the tests, in the first block.
    let readme = read("README.md");
    let first_block = &readme[readme.find("```sh\n").unwrap() + 6..];
    let first_block = &first_block[..first_block.find("```").unwrap()];
    assert!(first_block.starts_with("cargo run --release -p gpu-share-demo "));
    assert!(first_block.contains("\ncargo test --workspace "));
}

/// Quick start and the simulated node are run by CI: they need no GPU and no cluster.
#[test]
fn the_readme_blocks_that_need_no_gpu_are_run() {
    let blocks = shell_blocks(&read("README.md"));
    let run: Vec<&str> = blocks
        .iter()
        .filter(|(_, k, _)| k.as_deref() == Some("run"))
        .map(|(_, _, first)| first.as_str())
        .collect();
    assert_eq!(
        run,
        ["cargo build --release", "cargo build -p fake-nvml"],
        "{blocks:?}"
    );
}

/// `.ci/run` runs the README's first block before any other cargo command, and the rest after.
#[test]
fn ci_runs_the_readme_first_block_before_any_other_cargo_command() {
    let ci = read(".ci/run");
    let commands: Vec<&str> = ci
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with("cargo ") || l.contains(".ci/readme.py"))
        .collect();
    assert_eq!(
        commands.first(),
        Some(&"python3 .ci/readme.py first"),
        "{commands:?}"
    );
    assert!(
        commands.contains(&"python3 .ci/readme.py rest"),
        "{commands:?}"
    );
    assert!(
        !ci.lines().any(|l| l.trim_start().starts_with("cargo test")),
        "the test command comes from the README, not from a second copy in .ci/run"
    );
}
