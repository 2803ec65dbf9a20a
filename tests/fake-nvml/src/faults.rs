//! Fault injection and the mutation log, both driven by environment variables so a test can
//! steer a real binary it runs as a child process:
//!
//! * `FAKE_NVML_FAIL="nvmlFunctionName:N:CODE[,…]"`: the Nth call (1-based, per process) of that
//!   function returns CODE (a number or a name such as `NVML_ERROR_UNKNOWN` / `IN_USE`) and does
//!   nothing else.
//! * `FAKE_NVML_ABORT_AT_MUTATION=N`: `abort()` right before the Nth mutation that would succeed
//!   (after N-1 mutations were persisted), to test crash recovery.
//! * `FAKE_NVML_LOG=path`: one JSON line per attempted mutation (see [`LogEntry`]).

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex};

use serde::{Deserialize, Serialize};

use crate::codes::{self, Ret};

struct Fail {
    function: String,
    nth: u64,
    code: Ret,
}

/// A malformed spec panics (the C layer turns that into NVML_ERROR_UNKNOWN and the panic message
/// reaches stderr): a typo in a test must not silently disable the fault it meant to inject.
static FAILS: LazyLock<Vec<Fail>> = LazyLock::new(|| {
    let spec = std::env::var("FAKE_NVML_FAIL").unwrap_or_default();
    spec.split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|item| parse_fail(item).unwrap_or_else(|| panic!("FAKE_NVML_FAIL: bad item {item:?}")))
        .collect()
});

fn parse_fail(item: &str) -> Option<Fail> {
    let mut parts = item.trim().splitn(3, ':');
    let function = parts.next()?.to_string();
    let nth = parts.next()?.trim().parse().ok()?;
    let code = codes::parse(parts.next()?)?;
    Some(Fail {
        function,
        nth,
        code,
    })
}

static CALLS: LazyLock<Mutex<HashMap<&'static str, u64>>> = LazyLock::new(Default::default);

/// Count this call of `function`; the code to return instead if a fault is scheduled for it.
pub fn injected(function: &'static str) -> Option<Ret> {
    if FAILS.is_empty() {
        return None;
    }
    let mut calls = CALLS.lock().unwrap_or_else(|e| e.into_inner());
    let n = calls.entry(function).or_insert(0);
    *n += 1;
    let nth = *n;
    FAILS
        .iter()
        .find(|f| f.function == function && f.nth == nth)
        .map(|f| f.code)
}

static MUTATIONS: AtomicU64 = AtomicU64::new(0);

/// Called once a mutation has passed every check and is about to be applied and persisted.
pub fn before_mutation() {
    let n = MUTATIONS.fetch_add(1, Ordering::SeqCst) + 1;
    let abort_at = std::env::var("FAKE_NVML_ABORT_AT_MUTATION").ok();
    if abort_at.and_then(|v| v.trim().parse::<u64>().ok()) == Some(n) {
        eprintln!("fake-nvml: FAKE_NVML_ABORT_AT_MUTATION={n}: aborting");
        std::process::abort();
    }
}

/// One line of the `FAKE_NVML_LOG` file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LogEntry {
    pub pid: u32,
    /// The NVML function, e.g. `nvmlGpuInstanceDestroy`.
    pub function: String,
    /// Index of the physical GPU (absent for injected faults: no argument is looked at).
    pub gpu: Option<usize>,
    /// The call's arguments that matter (`profile_id`, `placement`, `mode`, …).
    pub args: serde_json::Value,
    /// `NVML_SUCCESS` or the error name; `injected` says the error came from `FAKE_NVML_FAIL`.
    pub result: String,
    #[serde(default)]
    pub injected: bool,
    /// The GPU instance created or destroyed (or that holds the CI), when known.
    #[serde(default)]
    pub gi: Option<u32>,
    /// The compute instance created or destroyed, when known.
    #[serde(default)]
    pub ci: Option<u32>,
}

/// Append an entry to `FAKE_NVML_LOG`, if set. O_APPEND keeps lines from concurrent processes
/// whole.
pub fn log(entry: &LogEntry) {
    let Some(path) = std::env::var_os("FAKE_NVML_LOG") else {
        return;
    };
    let line = serde_json::to_string(entry).expect("log entries serialise");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path);
    if let Err(e) = file.and_then(|mut f| f.write_all(format!("{line}\n").as_bytes())) {
        eprintln!("fake-nvml: FAKE_NVML_LOG: {e}");
    }
}

/// Read a `FAKE_NVML_LOG` file (empty if it does not exist).
pub fn read_log(path: impl AsRef<Path>) -> Vec<LogEntry> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .map(|l| serde_json::from_str(l).expect("fake-nvml log line"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fail_items_take_numbers_and_names() {
        let f = parse_fail("nvmlDeviceCreateGpuInstance:2:NVML_ERROR_UNKNOWN").unwrap();
        assert_eq!(
            (f.function.as_str(), f.nth, f.code),
            ("nvmlDeviceCreateGpuInstance", 2, 999)
        );
        assert_eq!(parse_fail("nvmlShutdown:1:IN_USE").unwrap().code, 19);
        assert_eq!(parse_fail("nvmlShutdown:1:23").unwrap().code, 23);
        assert!(parse_fail("nvmlShutdown:x:23").is_none());
        assert!(parse_fail("nvmlShutdown:1:NOPE").is_none());
    }
}
