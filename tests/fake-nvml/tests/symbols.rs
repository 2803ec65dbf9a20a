//! The exported symbols: every name in `nvidia_ml::symbols` resolves in the built library,
//! README.md lists exactly those names, and `src/ffi` exports nothing else.
//!
//! A go-nvml client died with "symbol lookup error" on
//! `nvmlDeviceGetHandleByPciBusId_v2`; item 13: every versioned/unversioned name of the calls
//! we implement (nvml.h `#define nvmlX nvmlX_vN`, go-nvml `updateVersionedSymbols`) is exported.

use std::collections::BTreeSet;
use std::path::Path;

use nvidia_ml::cdylib_path;
use nvidia_ml::symbols::{exported_names, readme_section, VERSIONED_FAMILIES};

const BEGIN: &str =
    "<!-- symbols:begin (generated from src/symbols.rs; tests/symbols.rs checks it) -->\n";
const END: &str = "<!-- symbols:end -->";

fn crate_file(path: &str) -> String {
    let full = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display()))
}

#[test]
fn every_listed_symbol_resolves_in_the_built_library() {
    // SAFETY: loading our own test library; its initialisers only set up Rust statics.
    let lib = unsafe { libloading::Library::new(cdylib_path()) }.unwrap();
    let missing: Vec<&str> = exported_names()
        .filter(|name| {
            // SAFETY: the symbol is only looked up, never called.
            let sym = unsafe { lib.get::<unsafe extern "C" fn()>(name.as_bytes()) };
            sym.is_err()
        })
        .collect();
    assert!(missing.is_empty(), "not exported: {missing:?}");
}

#[test]
fn every_name_of_an_implemented_call_is_exported() {
    let exported: BTreeSet<&str> = exported_names().collect();
    for f in VERSIONED_FAMILIES {
        for name in f.names {
            assert!(exported.contains(name), "{}: {name} not exported", f.call);
        }
    }
    // The names go-nvml v0.13 looks up in updateVersionedSymbols for calls the fake implements,
    // and the PCI-bus-id lookup go-nvml makes.
    for name in [
        "nvmlInit_v2",
        "nvmlDeviceGetPciInfo_v2",
        "nvmlDeviceGetPciInfo_v3",
        "nvmlDeviceGetCount_v2",
        "nvmlDeviceGetHandleByIndex_v2",
        "nvmlDeviceGetHandleByPciBusId_v2",
        "nvmlComputeInstanceGetInfo_v2",
        "nvmlDeviceGetComputeRunningProcesses_v2",
        "nvmlDeviceGetComputeRunningProcesses_v3",
        "nvmlDeviceGetGpuInstancePossiblePlacements_v2",
    ] {
        assert!(exported.contains(name), "{name} not exported");
    }
}

#[test]
fn readme_lists_exactly_the_exported_symbols() {
    let readme = crate_file("README.md");
    let start = readme
        .find(BEGIN)
        .expect("README.md lacks the symbols:begin marker")
        + BEGIN.len();
    let len = readme[start..]
        .find(END)
        .expect("README.md lacks the symbols:end marker");
    let section = &readme[start..start + len];
    assert_eq!(
        section,
        readme_section(),
        "README.md's symbol list is stale; replace the section with:\n{}",
        readme_section()
    );
}

/// `#[no_mangle]` functions in `src/ffi` (the `exports!` macro's `fn nvmlX(` and the plain
/// `extern "C" fn nvmlX(`), so an export added without listing it fails here.
#[test]
fn the_list_matches_the_exports_in_the_source() {
    let mut in_source = BTreeSet::new();
    for file in [
        "src/ffi/mod.rs",
        "src/ffi/exports.rs",
        "src/ffi/board.rs",
        "src/ffi/events.rs",
    ] {
        for line in crate_file(file).lines() {
            let t = line.trim_start();
            let rest = t
                .strip_prefix("fn ")
                .filter(|_| line.starts_with("    fn nvml"))
                .or_else(|| t.split_once("extern \"C\" fn ").map(|(_, r)| r));
            if let Some(name) = rest.and_then(|r| r.split('(').next()) {
                if name.starts_with("nvml") {
                    in_source.insert(name.to_string());
                }
            }
        }
    }
    let listed: BTreeSet<String> = exported_names().map(String::from).collect();
    assert_eq!(in_source, listed);
}
