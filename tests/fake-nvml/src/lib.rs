//! A fake `libnvidia-ml.so` that simulates MIG-capable NVIDIA GPUs, so gpu-share's real binary
//! (through nvml-wrapper) can be tested on machines without a GPU.
//!
//! The `cdylib` (`libnvidia_ml.so`) exports the NVML functions listed in README.md with the
//! real C signatures and return codes. The `rlib` side is the test API: build a [`State`], write
//! it to the file named by `FAKE_NVML_STATE`, point the client at [`cdylib_path`], run it, then
//! read the state (and the `FAKE_NVML_LOG`, see [`faults`]) back.
//!
//! Behaviour follows NVML's header and the MIG User Guide (docs/sources.md#nvml); profile tables come from the same embedded
//! catalog (`data/mig-catalog.yaml`) the planner uses.
#![deny(unsafe_op_in_unsafe_fn)]

use std::path::PathBuf;

pub mod board;
pub mod codes;
pub mod events;
pub mod faults;
mod ffi;
pub mod model;
pub mod procfs;
pub mod sim;
pub mod state;
pub mod symbols;

pub use events::Event;
pub use faults::{read_log, LogEntry};
pub use sim::Change;
pub use state::{
    ComputeInstance, ComputeMode, Gpu, GpuInstance, MigActivation, MigMode, Place, Process, State,
};

/// File name of the built library.
pub const LIB_FILE: &str = "libnvidia_ml.so";

/// Absolute path of the built `libnvidia_ml.so`: `$FAKE_NVML_LIB` if set, else the first one in
/// the directories above the running executable. A test binary lives in `target/<profile>/deps/`,
/// and that is where `cargo test` (re)builds the library when this crate is a dependency of the
/// test; `target/<profile>/libnvidia_ml.so` is only refreshed by `cargo build -p fake-nvml`, so
/// `deps/` is searched first. A binary (the demo) lives in `target/<profile>/`, its dependency's
/// library in the `deps/` beside it, which comes first for it. Panics if none is found: every
/// caller is a test or the demo, which need it.
pub fn cdylib_path() -> PathBuf {
    if let Some(p) = std::env::var_os("FAKE_NVML_LIB") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("current_exe");
    let beside_a_binary = exe.parent().map(|d| d.join("deps").join(LIB_FILE));
    beside_a_binary
        .into_iter()
        .chain(exe.ancestors().skip(1).take(3).map(|d| d.join(LIB_FILE)))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "{LIB_FILE} not found above {}: build it with `cargo build -p fake-nvml`",
                exe.display()
            )
        })
}
