//! The layering of `src/` (issue 17): imports between modules go one way, and no source file is
//! too long to read at once.
//!
//! The graph is built from the text of `src/**/*.rs`, std only: every `crate::` path outside
//! comments and outside `#[cfg(test)] mod … { … }` blocks (a test may build its fixtures with
//! an upper layer) is an edge from the room of the file to the room the path names. A room is
//! a top-level module (`src/plan/**` is `plan`), except the sub-rooms in [`SUB_ROOMS`]: a path
//! `crate::profile::validate_for` goes to `profile::validate` when `validate_for` is defined
//! in `src/profile/validate.rs`. Paths inside a top-level module (`super::`, `self::`, child
//! modules) are not `crate::` paths and stay inside its rooms.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// Files that are a room of their own inside their top-level module, with why.
/// `profile::validate` composes every sharing mode's validation (and each plugin's), so it sits
/// above the modes, while the profile's format, which the modes read, sits below them.
const SUB_ROOMS: &[(&str, &str)] = &[("profile/validate.rs", "profile::validate")];

/// A file over this many lines needs a reason in its `//!` module doc.
const MAX_LINES: usize = 800;

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("read src dir") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
}

/// `plan/mod.rs` relative to `src/`, with `/` separators.
fn relative(path: &Path) -> String {
    path.strip_prefix(src_dir())
        .expect("under src")
        .to_string_lossy()
        .replace('\\', "/")
}

/// The room a file belongs to; none for the crate root (`lib.rs`, `main.rs`), which only
/// declares the modules.
fn room_of_file(rel: &str) -> Option<String> {
    if let Some((_, room)) = SUB_ROOMS.iter().find(|(file, _)| *file == rel) {
        return Some(room.to_string());
    }
    let top = rel.split('/').next()?.trim_end_matches(".rs");
    (top != "lib" && top != "main").then(|| top.to_string())
}

/// The text without `//` comments (doc comments included) and string literals, so that
/// neither a path in prose nor a brace in a message counts.
fn code_only(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '/' if chars.peek() == Some(&'/') => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            '"' => {
                out.push('"');
                let mut escaped = false;
                for c in chars.by_ref() {
                    if c == '\n' {
                        out.push('\n');
                    }
                    if escaped {
                        escaped = false;
                    } else if c == '\\' {
                        escaped = true;
                    } else if c == '"' {
                        break;
                    }
                }
                out.push('"');
            }
            '\'' => {
                // A char literal such as '{' (a lifetime has no closing quote within 3 chars).
                let ahead: String = chars.clone().take(3).collect();
                if ahead.chars().nth(1) == Some('\'') {
                    chars.nth(1);
                    out.push_str("' '");
                } else if ahead.starts_with('\\') && ahead.chars().nth(2) == Some('\'') {
                    chars.nth(2);
                    out.push_str("' '");
                } else {
                    out.push('\'');
                }
            }
            _ => out.push(c),
        }
    }
    out
}

/// The code without its `#[cfg(test)] mod name { … }` blocks.
fn without_test_modules(code: &str) -> String {
    let mut out = String::new();
    let mut rest = code;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let after = &rest[at + "#[cfg(test)]".len()..];
        let trimmed = after.trim_start();
        let is_module = trimmed.starts_with("mod ") || trimmed.starts_with("pub mod ");
        let Some(open) = after.find('{').filter(|_| is_module) else {
            out.push_str("#[cfg(test)]");
            rest = after;
            continue;
        };
        let mut depth = 0usize;
        let mut end = after.len();
        for (i, c) in after[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = open + i + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        // Keep the line count so reported lines stay right.
        out.extend(after[..end].chars().filter(|&c| c == '\n'));
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// The first segment of each path a `crate::` reference names: `crate::plan::GpuPlan` gives
/// `["plan", "GpuPlan"]`, `crate::{mps, timeslice}` gives `["mps"]` and `["timeslice"]`.
fn crate_paths(code: &str) -> Vec<(usize, Vec<String>)> {
    let mut paths = Vec::new();
    for (start, _) in code.match_indices("crate::") {
        let before = code[..start].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue; // e.g. `$crate::` or `my_crate::`
        }
        let line = code[..start].matches('\n').count() + 1;
        let rest = &code[start + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let inner = &group[..group.find('}').unwrap_or(group.len())];
            for item in inner.split(',') {
                let segments = segments_of(item.trim());
                if !segments.is_empty() {
                    paths.push((line, segments));
                }
            }
        } else {
            paths.push((line, segments_of(rest)));
        }
    }
    paths
}

/// The leading `a::b::c` of `text`, as segments (at most two are needed).
fn segments_of(text: &str) -> Vec<String> {
    let mut segments = Vec::new();
    let mut rest = text;
    while segments.len() < 2 {
        let end = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        if end == 0 {
            break;
        }
        segments.push(rest[..end].to_string());
        match rest[end..].strip_prefix("::") {
            Some(next) => rest = next,
            None => break,
        }
    }
    segments
}

/// Names a file defines at any level (`fn`, `struct`, `enum`, `const`, `static`, `type`,
/// `trait`, `mod`), for resolving paths into sub-rooms.
fn defined_names(code: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let words: Vec<&str> = code
        .split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty())
        .collect();
    for pair in words.windows(2) {
        if matches!(
            pair[0],
            "fn" | "struct" | "enum" | "const" | "static" | "type" | "trait" | "mod"
        ) {
            names.insert(pair[1].to_string());
        }
    }
    names
}

struct Source {
    rel: String,
    text: String,
    code: String,
}

fn sources() -> Vec<Source> {
    let mut files = Vec::new();
    rust_files(&src_dir(), &mut files);
    files.sort();
    files
        .into_iter()
        .map(|path| {
            let text = fs::read_to_string(&path).expect("read source");
            let code = without_test_modules(&code_only(&text));
            Source {
                rel: relative(&path),
                text,
                code,
            }
        })
        .collect()
}

/// Room → rooms it imports, each edge with the places that make it (`file:line`).
type Graph = BTreeMap<String, BTreeMap<String, Vec<String>>>;

fn graph(sources: &[Source]) -> Graph {
    let sub_room_names: Vec<(&str, &str, BTreeSet<String>)> = SUB_ROOMS
        .iter()
        .map(|(file, room)| {
            let source = sources
                .iter()
                .find(|s| s.rel == *file)
                .unwrap_or_else(|| panic!("sub-room file src/{file} is gone: update SUB_ROOMS"));
            let top = file.split('/').next().unwrap();
            (top, *room, defined_names(&source.code))
        })
        .collect();
    let mut graph = Graph::new();
    for source in sources {
        let Some(from) = room_of_file(&source.rel) else {
            continue;
        };
        graph.entry(from.clone()).or_default();
        for (line, segments) in crate_paths(&source.code) {
            let top = segments[0].as_str();
            if top == "self" || top == "super" {
                continue;
            }
            let second = segments.get(1).map(String::as_str);
            let to = sub_room_names
                .iter()
                .find(|(t, _, names)| *t == top && second.is_some_and(|n| names.contains(n)))
                .map(|(_, room, _)| room.to_string())
                .unwrap_or_else(|| top.to_string());
            if to != from {
                graph
                    .entry(from.clone())
                    .or_default()
                    .entry(to)
                    .or_default()
                    .push(format!("src/{}:{line}", source.rel));
            }
        }
    }
    graph
}

/// One cycle of the graph, if any: rooms in order, the first repeated at the end.
fn find_cycle(graph: &Graph) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    fn visit(
        room: &str,
        graph: &Graph,
        marks: &mut BTreeMap<String, Mark>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match marks.get(room) {
            Some(Mark::Done) => return None,
            Some(Mark::Open) => {
                let at = stack.iter().position(|r| r == room).unwrap();
                let mut cycle = stack[at..].to_vec();
                cycle.push(room.to_string());
                return Some(cycle);
            }
            None => {}
        }
        marks.insert(room.to_string(), Mark::Open);
        stack.push(room.to_string());
        for next in graph.get(room).into_iter().flat_map(BTreeMap::keys) {
            if let Some(cycle) = visit(next, graph, marks, stack) {
                return Some(cycle);
            }
        }
        stack.pop();
        marks.insert(room.to_string(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    graph
        .keys()
        .find_map(|room| visit(room, graph, &mut marks, &mut Vec::new()))
}

fn describe_cycle(graph: &Graph, cycle: &[String]) -> String {
    cycle
        .windows(2)
        .map(|pair| {
            let places = &graph[&pair[0]][&pair[1]];
            format!("  {} -> {}   ({})", pair[0], pair[1], places.join(", "))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn modules_import_each_other_one_way() {
    let graph = graph(&sources());
    if let Some(cycle) = find_cycle(&graph) {
        panic!(
            "import circle among src/ modules:\n{}",
            describe_cycle(&graph, &cycle)
        );
    }
}

/// The rooms issue 17 names, in the order they may import each other (each only the ones
/// before it): the modes see the sharing vocabulary, never the plan or the plugin config.
#[test]
fn sharing_modes_sit_below_plan_and_plugin_config() {
    let graph = graph(&sources());
    let order = ["sharing", "timeslice", "mps", "device_plugin", "plan"];
    for (i, room) in order.iter().enumerate() {
        let imports = graph
            .get(*room)
            .unwrap_or_else(|| panic!("no room {room} in src/"));
        for upper in &order[i + 1..] {
            assert!(
                !imports.contains_key(*upper),
                "{room} imports {upper}, which sits above it: {}",
                imports[*upper].join(", ")
            );
        }
    }
}

#[test]
fn the_checker_sees_a_circle_and_skips_tests_comments_and_strings() {
    let a = Source {
        rel: "a/mod.rs".into(),
        text: String::new(),
        code: without_test_modules(&code_only(
            "use crate::b::Thing; // crate::c::X\nfn f() { let _ = \"crate::c::Y {\"; }\n\
             #[cfg(test)]\nmod tests { use crate::c::Z; fn g() { if true { } } }\n",
        )),
    };
    let b = Source {
        rel: "b.rs".into(),
        text: String::new(),
        code: code_only("use crate::{a::f, self as x};\n"),
    };
    let c = Source {
        rel: "c.rs".into(),
        text: String::new(),
        code: code_only("use crate::a::f;\n"),
    };
    let graph = graph_without_sub_rooms(&[a, b, c]);
    assert_eq!(
        find_cycle(&graph),
        Some(vec!["a".to_string(), "b".to_string(), "a".to_string()])
    );
    assert!(!graph["a"].contains_key("c"), "{graph:?}");
}

/// [`graph`] for made-up sources, which have no `src/profile/validate.rs`.
fn graph_without_sub_rooms(sources: &[Source]) -> Graph {
    let mut graph = Graph::new();
    for source in sources {
        let from = room_of_file(&source.rel).unwrap();
        graph.entry(from.clone()).or_default();
        for (line, segments) in crate_paths(&source.code) {
            let to = segments[0].clone();
            if to != from && to != "self" {
                graph
                    .entry(from.clone())
                    .or_default()
                    .entry(to)
                    .or_default()
                    .push(format!("{}:{line}", source.rel));
            }
        }
    }
    graph
}

/// Whether a file's `//!` doc says why it is long: a line of it mentions its length.
fn explains_its_length(text: &str) -> bool {
    text.lines()
        .take_while(|l| l.starts_with("//!") || l.trim().is_empty())
        .any(|l| {
            let l = l.to_lowercase();
            l.contains("lines") || l.contains("long")
        })
}

#[test]
fn no_source_file_is_too_long_without_a_reason() {
    let too_long: Vec<String> = sources()
        .iter()
        .filter(|s| s.text.lines().count() > MAX_LINES && !explains_its_length(&s.text))
        .map(|s| format!("src/{} ({} lines)", s.rel, s.text.lines().count()))
        .collect();
    assert!(
        too_long.is_empty(),
        "over {MAX_LINES} lines without a reason in the module doc (a `//!` line saying why it \
         is long): {}",
        too_long.join(", ")
    );
}
