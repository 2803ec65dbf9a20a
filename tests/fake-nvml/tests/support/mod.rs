//! What the fake-nvml client tests share: run a scenario in a child process (the library keeps
//! per-process state and reads its environment at `nvmlInit`), open the built library through
//! nvml-wrapper, and look up symbols it does not bind.
#![allow(dead_code, unused_macros, unused_imports)]

use std::process::{Command, ExitStatus};

use nvidia_ml::{cdylib_path, read_log, LogEntry, State};
use nvml_wrapper::Nvml;

const CHILD: &str = "FAKE_NVML_TEST_CHILD";

pub struct Run {
    pub status: ExitStatus,
    pub output: String,
    pub state: State,
    pub log: Vec<LogEntry>,
}

impl Run {
    pub fn assert_passed(&self) {
        assert!(
            self.status.success() && self.output.contains("1 passed"),
            "child failed:\n{}",
            self.output
        );
    }

    pub fn logged(&self, function: &str) -> Vec<&LogEntry> {
        self.log.iter().filter(|e| e.function == function).collect()
    }
}

/// Run `body` in a child process against `state` (None inside the child).
pub fn scenario(
    name: &str,
    state: State,
    env: &[(&str, &str)],
    body: impl FnOnce(),
) -> Option<Run> {
    if std::env::var_os(CHILD).is_some() {
        body();
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let (state_path, log_path) = (dir.path().join("state.json"), dir.path().join("log.jsonl"));
    state.write_to(&state_path).unwrap();
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([name, "--exact", "--nocapture", "--test-threads=1"]);
    for var in [
        "FAKE_NVML_FAIL",
        "FAKE_NVML_ABORT_AT_MUTATION",
        "FAKE_NVML_LIB",
    ] {
        cmd.env_remove(var);
    }
    cmd.env(CHILD, "1")
        .env("FAKE_NVML_STATE", &state_path)
        .env("FAKE_NVML_LOG", &log_path);
    let out = cmd.envs(env.iter().copied()).output().unwrap();
    Some(Run {
        status: out.status,
        output: String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr),
        state: State::read_from(&state_path).unwrap(),
        log: read_log(&log_path),
    })
}

pub fn open() -> Nvml {
    let path = cdylib_path();
    Nvml::builder().lib_path(path.as_os_str()).init().unwrap()
}

/// A symbol of the loaded library, as gpu-share resolves the calls nvml-wrapper doesn't wrap.
#[macro_export]
macro_rules! sym {
    ($nvml:expr, $name:ident) => {
        *nvml_wrapper::error::nvml_sym($nvml.lib().$name.as_ref()).unwrap()
    };
}

/// A symbol of the built library that nvml-wrapper does not bind (its legacy v1 names sit
/// behind a feature gpu-share does not enable), looked up as go-nvml's dlsym does.
pub fn raw<T: Copy>(name: &str) -> T {
    // SAFETY: the library stays loaded for the whole child process (nvml-wrapper holds it too).
    let lib = Box::leak(Box::new(
        unsafe { libloading::Library::new(cdylib_path()) }.unwrap(),
    ));
    // SAFETY: `T` is the fn type nvml.h declares for `name`.
    *unsafe { lib.get::<T>(name.as_bytes()) }.unwrap()
}
