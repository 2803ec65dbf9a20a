//! The default `gpu-share` binary starts on the glibc of the GPU nodes users have: 2.34 and
//! newer (Ubuntu 22.04, RHEL 9). `readelf -V` lists every glibc symbol version it needs; none
//! may be newer than 2.34, and `GLIBC_ABI_DT_RELR` (packed relocations, glibc 2.36) must not
//! be among them. The image opts in to DT_RELR in the Dockerfile, where the runtime has 2.36.
//! `.ci/run` checks the release binary the same way.

use std::process::Command;

/// The `GLIBC_*` version needs of an ELF file, as `readelf -V` prints them (`Name: GLIBC_2.34`).
fn glibc_needs(path: &str) -> Vec<String> {
    let out = Command::new("readelf")
        .args(["-V", "--wide", path])
        .output()
        .expect("readelf (binutils) runs: it comes with the C toolchain the build needs");
    assert!(out.status.success(), "readelf -V {path} failed");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let needs: Vec<String> = text
        .split_whitespace()
        .filter(|w| w.starts_with("GLIBC_"))
        .map(str::to_string)
        .collect();
    assert!(
        !needs.is_empty(),
        "no glibc version needs read from {path}:\n{text}"
    );
    needs
}

/// `GLIBC_2.34` → (2, 34); `GLIBC_ABI_DT_RELR` and `GLIBC_PRIVATE` → None.
fn version(need: &str) -> Option<(u32, u32)> {
    let rest = need.strip_prefix("GLIBC_")?;
    let mut parts = rest.split('.').map(|p| p.parse::<u32>().ok());
    Some((parts.next()??, parts.next().flatten().unwrap_or(0)))
}

#[test]
fn the_default_binary_needs_no_glibc_newer_than_2_34() {
    let needs = glibc_needs(env!("CARGO_BIN_EXE_gpu-share"));
    assert!(
        !needs.iter().any(|n| n == "GLIBC_ABI_DT_RELR"),
        "the binary needs GLIBC_ABI_DT_RELR (glibc 2.36): {needs:?}"
    );
    let newest = needs.iter().filter_map(|n| version(n)).max().unwrap();
    assert!(newest <= (2, 34), "needs glibc {newest:?}: {needs:?}");
}

#[test]
fn versions_read_as_readelf_prints_them() {
    assert_eq!(version("GLIBC_2.34"), Some((2, 34)));
    assert_eq!(version("GLIBC_2.2.5"), Some((2, 2)));
    assert_eq!(version("GLIBC_ABI_DT_RELR"), None);
}
