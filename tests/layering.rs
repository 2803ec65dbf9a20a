//! The layering of `src/`: imports between modules go one way, so do imports between the files
//! of one module, and no source file is too long to read at once.
//!
//! The module graph is built from the text of `src/**/*.rs`, std only: every `crate::` path
//! outside comments and outside `#[cfg(test)] mod … { … }` blocks (a test may build its
//! fixtures with an upper layer) is an edge from the room of the file to the room the path
//! names. A room is a top-level module (`src/plan/**` is `plan`).
//!
//! Inside a module, the files beside each other (`src/doctor/dra.rs`, `src/doctor/plugin.rs`)
//! are rooms too: a `super::x` or `crate::doctor::x` path from one names its sibling `x`, or the
//! sibling whose item the module file (`mod.rs`) imports or re-exports as `x`. The module file
//! itself declares and composes its children, and they share its types, so edges to and from it
//! are not counted; a circle among siblings is.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

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

/// The first segments of each path a `crate::` reference names: `crate::plan::GpuPlan` gives
/// `["plan", "GpuPlan"]`, `crate::{mps, timeslice::X}` gives `["mps"]` and `["timeslice", "X"]`.
fn crate_paths(code: &str) -> Vec<(usize, Vec<String>)> {
    paths_after(code, "crate::")
}

/// The paths after each `prefix` (`crate::` or `super::`) in `code`, with their line: a group
/// `prefix{a, b::{c, d}}` gives one path per top-level item (`a`, `b`).
fn paths_after(code: &str, prefix: &str) -> Vec<(usize, Vec<String>)> {
    let mut paths = Vec::new();
    for (start, _) in code.match_indices(prefix) {
        let before = code[..start].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue; // e.g. `$crate::`, `my_crate::` or `super::super::`
        }
        let line = code[..start].matches('\n').count() + 1;
        let rest = &code[start + prefix.len()..];
        match rest.strip_prefix('{') {
            Some(group) => {
                for item in top_level_items(group) {
                    let segments = segments_of(item.trim());
                    if !segments.is_empty() {
                        paths.push((line, segments));
                    }
                }
            }
            None => {
                let segments = segments_of(rest);
                if !segments.is_empty() {
                    paths.push((line, segments));
                }
            }
        }
    }
    paths
}

/// The comma-separated items of a `{…}` group up to its closing brace, nested groups whole.
fn top_level_items(group: &str) -> Vec<&str> {
    let mut items = Vec::new();
    let (mut depth, mut from) = (0usize, 0usize);
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                items.push(&group[from..i]);
                return items;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&group[from..i]);
                from = i + 1;
            }
            _ => {}
        }
    }
    items.push(&group[from..]);
    items
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
    let mut graph = Graph::new();
    for source in sources {
        let Some(from) = room_of_file(&source.rel) else {
            continue;
        };
        graph.entry(from.clone()).or_default();
        for (line, segments) in crate_paths(&source.code) {
            let to = segments[0].clone();
            if to != from && to != "self" && to != "super" {
                add_edge(&mut graph, &from, to, format!("src/{}:{line}", source.rel));
            }
        }
    }
    graph
}

/// An edge `from` -> `to`, made at `place` (`file:line`).
fn add_edge(graph: &mut Graph, from: &str, to: String, place: String) {
    graph
        .entry(from.to_string())
        .or_default()
        .entry(to)
        .or_default()
        .push(place);
}

/// The module a file is a child of, as a `src/`-relative directory (`doctor` for
/// `doctor/dra.rs` and for `doctor/x/mod.rs`), and its name there; none for module files
/// (`mod.rs`), the crate root and top-level files.
fn sibling_of(rel: &str) -> Option<(String, String)> {
    let path = Path::new(rel);
    let stem = path.file_stem()?.to_str()?;
    let parent = path.parent()?.to_str()?;
    if stem == "mod" {
        let module = Path::new(parent);
        let grand = module.parent()?.to_str()?;
        let name = module.file_name()?.to_str()?;
        return (!grand.is_empty()).then(|| (grand.to_string(), name.to_string()));
    }
    (!parent.is_empty()).then(|| (parent.to_string(), stem.to_string()))
}

/// The module file of a `src/`-relative directory: `doctor/mod.rs`, else `doctor.rs`.
fn module_file<'a>(sources: &'a [Source], dir: &str) -> Option<&'a Source> {
    let with_mod = format!("{dir}/mod.rs");
    let beside = format!("{dir}.rs");
    sources
        .iter()
        .find(|s| s.rel == with_mod)
        .or_else(|| sources.iter().find(|s| s.rel == beside))
}

/// Names the module file brings in from a child, `use child::{A, B}` or `pub use child::A`:
/// a sibling's `super::A` then names that child.
fn imported_from_children(module: &str, children: &BTreeSet<String>) -> BTreeMap<String, String> {
    let mut names = BTreeMap::new();
    for (start, _) in module.match_indices("use ") {
        let before = module[..start].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let rest = module[start + 4..].trim_start();
        let rest = rest.strip_prefix("self::").unwrap_or(rest);
        let end = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(0);
        let child = &rest[..end];
        if !children.contains(child) {
            continue;
        }
        let Some(after) = rest[end..].strip_prefix("::") else {
            continue;
        };
        let items = match after.strip_prefix('{') {
            Some(group) => top_level_items(group),
            None => vec![&after[..after.find(';').unwrap_or(after.len())]],
        };
        for item in items {
            let item = item.trim();
            let name = item.rsplit(" as ").next().unwrap_or(item);
            let name = name.rsplit("::").next().unwrap_or(name).trim();
            if !name.is_empty() && name != "*" {
                names.insert(name.to_string(), child.to_string());
            }
        }
    }
    names
}

/// For every module, its children's imports of each other (`file:line` per edge), keyed by
/// the module's directory.
fn sibling_graphs(sources: &[Source]) -> BTreeMap<String, Graph> {
    let mut children: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for source in sources {
        if let Some((dir, name)) = sibling_of(&source.rel) {
            children.entry(dir).or_default().insert(name);
        }
    }
    let mut graphs = BTreeMap::new();
    for (dir, names) in &children {
        let via_module = module_file(sources, dir)
            .map(|m| imported_from_children(&m.code, names))
            .unwrap_or_default();
        let crate_prefix = format!("crate::{}::", dir.replace('/', "::"));
        let mut graph = Graph::new();
        for source in sources {
            let Some((d, from)) = sibling_of(&source.rel) else {
                continue;
            };
            if d != *dir {
                continue;
            }
            graph.entry(from.clone()).or_default();
            let mut paths = paths_after(&source.code, "super::");
            paths.extend(paths_after(&source.code, &crate_prefix));
            for (line, segments) in paths {
                let first = segments[0].as_str();
                let to = if names.contains(first) {
                    first.to_string()
                } else if let Some(child) = via_module.get(first) {
                    child.clone()
                } else {
                    continue;
                };
                if to != from {
                    add_edge(&mut graph, &from, to, format!("src/{}:{line}", source.rel));
                }
            }
        }
        graphs.insert(dir.clone(), graph);
    }
    graphs
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

#[test]
fn files_of_one_module_import_each_other_one_way() {
    let mut circles = Vec::new();
    for (dir, graph) in sibling_graphs(&sources()) {
        if let Some(cycle) = find_cycle(&graph) {
            circles.push(format!(
                "in src/{dir}/:\n{}",
                describe_cycle(&graph, &cycle)
            ));
        }
    }
    assert!(
        circles.is_empty(),
        "import circle among the files of one module (move what both need into a file of its \
         own, or up into the module file):\n{}",
        circles.join("\n")
    );
}

/// The floors of the sharing rooms, bottom up: a room imports only rooms on floors below its
/// own, never a room beside it. The profile format; the MIG catalog and solver (every mode
/// reads the catalog: MPS inside a MIG device needs the profile's memory, time-sliced MIG
/// devices their resource names, so it is vocabulary, as the brief's architecture has it); the
/// NVML door and the sharing vocabulary (resource names, what a GPU is planned to be); the
/// modes side by side; the NVIDIA plugin's rules; validation, which composes them; the plan.
const SHARING_FLOORS: &[&[&str]] = &[
    &["profile"],
    &["mig"],
    &["gpu", "sharing"],
    &["timeslice", "mps"],
    &["nvidia_plugin"],
    &["validate"],
    &["plan"],
];

/// What of `floors` a `graph` breaks: a room importing a room on its own floor or above.
fn floor_breaks(graph: &Graph, floors: &[&[&str]]) -> Vec<String> {
    let mut breaks = Vec::new();
    for (level, floor) in floors.iter().enumerate() {
        for room in *floor {
            let Some(imports) = graph.get(*room) else {
                breaks.push(format!("no room {room} in src/"));
                continue;
            };
            let same_or_above = floors[level..].iter().flat_map(|f| f.iter());
            for other in same_or_above.filter(|other| *other != room) {
                if let Some(places) = imports.get(*other) {
                    breaks.push(format!(
                        "{room} imports {other}, which is not below it: {}",
                        places.join(", ")
                    ));
                }
            }
        }
    }
    breaks
}

/// The sharing modes stand side by side on one floor, above the vocabulary they share and
/// below the plugin config, the validation and the plan that compose them (issue 39 item 2).
#[test]
fn sharing_modes_stand_side_by_side_below_plan_and_plugin_config() {
    let breaks = floor_breaks(&graph(&sources()), SHARING_FLOORS);
    assert!(breaks.is_empty(), "{}", breaks.join("\n"));
}

/// advise plans offline and reads what agents publish; it stands beside the agent, so what
/// both need (the Node's labels and annotations) lives below them in `published`.
#[test]
fn advise_imports_nothing_from_the_agent() {
    let graph = graph(&sources());
    let advise = graph.get("advise").expect("a room advise");
    assert!(
        !advise.contains_key("agent"),
        "advise imports agent: {}",
        advise
            .get("agent")
            .map(|p| p.join(", "))
            .unwrap_or_default()
    );
}

/// The floor check sees a mode importing its sibling, and an import from above.
#[test]
fn the_floor_check_sees_a_mode_importing_another() {
    let mut graph = Graph::new();
    for room in ["profile", "sharing", "timeslice", "mps", "plan"] {
        graph.insert(room.to_string(), BTreeMap::new());
    }
    add_edge(
        &mut graph,
        "mps",
        "timeslice".into(),
        "src/mps/mod.rs:1".into(),
    );
    add_edge(
        &mut graph,
        "sharing",
        "plan".into(),
        "src/sharing.rs:2".into(),
    );
    add_edge(
        &mut graph,
        "timeslice",
        "sharing".into(),
        "src/timeslice/mod.rs:3".into(),
    );
    let floors: &[&[&str]] = &[&["profile"], &["sharing"], &["timeslice", "mps"], &["plan"]];
    assert_eq!(
        floor_breaks(&graph, floors),
        [
            "sharing imports plan, which is not below it: src/sharing.rs:2",
            "mps imports timeslice, which is not below it: src/mps/mod.rs:1",
        ]
    );
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
    let graph = graph(&[a, b, c]);
    assert_eq!(
        find_cycle(&graph),
        Some(vec!["a".to_string(), "b".to_string(), "a".to_string()])
    );
    assert!(!graph["a"].contains_key("c"), "{graph:?}");
}

#[test]
fn the_checker_sees_a_circle_between_files_of_one_module() {
    let file = |rel: &str, code: &str| Source {
        rel: rel.into(),
        text: String::new(),
        code: without_test_modules(&code_only(code)),
    };
    let sources = [
        file(
            "m/mod.rs",
            "mod a;\nmod b;\nmod c;\nuse c::Shared;\npub use a::run;\n",
        ),
        file("m/a.rs", "use super::{b::helper, Ctx};\n"),
        file("m/b.rs", "use super::Shared;\n"),
        file("m/c.rs", "use crate::m::run;\n"),
    ];
    let graphs = sibling_graphs(&sources);
    let graph = &graphs["m"];
    assert_eq!(
        find_cycle(graph),
        Some(
            vec!["a", "b", "c", "a"]
                .into_iter()
                .map(String::from)
                .collect()
        ),
        "{graph:?}"
    );
    // `Ctx` is the module file's own: no edge.
    assert_eq!(graph["a"].keys().collect::<Vec<_>>(), ["b"]);
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

/// Whether `code` (comments and strings already out) declares a `Result` whose error is a bare
/// `String`: `Result<T, String>`, generics in `T` included.
fn returns_a_string_error(code: &str) -> bool {
    code.match_indices("Result<").any(|(start, _)| {
        let mut depth = 0usize;
        let mut last_comma = None;
        for (i, c) in code[start..].char_indices() {
            match c {
                '<' => depth += 1,
                '>' => {
                    depth -= 1;
                    if depth == 0 {
                        let error = last_comma.map(|at| code[start + at + 1..start + i].trim());
                        return error == Some("String");
                    }
                }
                ',' if depth == 1 => last_comma = Some(i),
                _ => {}
            }
        }
        false
    })
}

/// Errors are typed, so callers decide by kind (issue 39 item 3): no function in src/,
/// tests included, returns `Result<_, String>`. clap takes any error type for a value parser.
#[test]
fn no_result_carries_a_bare_string_error() {
    let offenders: Vec<String> = sources()
        .iter()
        .flat_map(|s| {
            code_only(&s.text)
                .lines()
                .enumerate()
                .filter(|(_, line)| returns_a_string_error(line))
                .map(|(i, _)| format!("src/{}:{}", s.rel, i + 1))
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(
        offenders.is_empty(),
        "give these a thiserror enum naming what went wrong: {}",
        offenders.join(", ")
    );
}

#[test]
fn the_string_error_check_sees_nested_generics() {
    assert!(returns_a_string_error(
        "fn f() -> Result<Vec<u32>, String> {"
    ));
    assert!(returns_a_string_error(
        "fn f() -> Option<Result<(), String>> {"
    ));
    assert!(returns_a_string_error(
        "fn f() -> Result<(Vec<Device>, Option<Spec>), String> {"
    ));
    assert!(!returns_a_string_error("fn f() -> Result<String, Error> {"));
    assert!(!returns_a_string_error("fn f() -> kube::Result<String> {"));
    assert!(!returns_a_string_error(
        "fn f() -> Result<(), Vec<String>> {"
    ));
}
