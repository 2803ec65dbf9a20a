//! What holds the agent's resident memory: `/proc/<pid>/smaps` summed by what each mapping
//! is (the binary's own pages, the NVML library, other shared libraries, the heap, anonymous
//! mappings such as glibc malloc arenas and thread stacks), with the anonymous/file split and
//! the thread count from `/proc/<pid>/status`.

use std::collections::BTreeMap;

/// The kind [`resident_by_mapping`] gives the agent binary's own mappings.
pub const BINARY: &str = "the gpu-share binary (code, data)";

/// Resident kB per kind of mapping, largest first.
pub fn resident_by_mapping(pid: u32) -> Vec<(String, u64)> {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap_or_default();
    let mut totals: BTreeMap<String, u64> = BTreeMap::new();
    let mut kind = String::new();
    for line in smaps.lines() {
        let mut words = line.split_whitespace();
        let first = words.next().unwrap_or_default();
        if first.contains('-') && first.chars().next().is_some_and(|c| c.is_ascii_hexdigit()) {
            // A mapping header: `start-end perms offset dev inode [path]`.
            kind = mapping_kind(words.nth(4));
        } else if first == "Rss:" {
            let kb: u64 = words.next().and_then(|v| v.parse().ok()).unwrap_or(0);
            *totals.entry(kind.clone()).or_default() += kb;
        }
    }
    let mut rows: Vec<(String, u64)> = totals.into_iter().filter(|(_, kb)| *kb > 0).collect();
    rows.sort_by_key(|row| std::cmp::Reverse(row.1));
    rows
}

fn mapping_kind(path: Option<&str>) -> String {
    match path {
        None => "anonymous (malloc arenas, thread stacks)".into(),
        Some("[heap]") => "[heap] (main malloc arena)".into(),
        Some(p) if p.starts_with('[') => p.to_string(),
        Some(p) if p.ends_with("/gpu-share") => BINARY.into(),
        Some(p) if p.contains("nvidia_ml") || p.contains("nvidia-ml") => {
            "the NVML library (here the fake)".into()
        }
        Some(p) if p.contains(".so") => "other shared libraries (libc, ...)".into(),
        Some(_) => "other files".into(),
    }
}

/// `RssAnon`, `RssFile` (kB) and `Threads` from `/proc/<pid>/status`.
pub fn status_fields(pid: u32) -> (u64, u64, u64) {
    let [anon, file, threads] = node_sim::proc_status_kb(pid, ["RssAnon:", "RssFile:", "Threads:"]);
    (anon, file, threads)
}
