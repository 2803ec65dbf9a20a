//! Test helper: where the fake `nvidia-cuda-mps-control` binary was built.

use std::path::PathBuf;

/// The binary's file name, the real one's.
pub const BIN_NAME: &str = "nvidia-cuda-mps-control";

/// `$FAKE_MPS_CONTROL_BIN`, else `target/<profile>/nvidia-cuda-mps-control` found above the
/// running test executable (tests run from `target/<profile>/deps/`). `cargo test --workspace`
/// builds it before any test runs; a plain `cargo test -p gpu-share` does not.
pub fn binary_path() -> PathBuf {
    find().unwrap_or_else(|| {
        panic!(
            "{BIN_NAME} not found above {}: run `cargo test --workspace`, or `cargo build -p fake-mps-control` first",
            std::env::current_exe().expect("current_exe").display()
        )
    })
}

/// [`binary_path`], or `None` where it has not been built (`cargo bench` does not build it).
pub fn find() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("FAKE_MPS_CONTROL_BIN") {
        return Some(PathBuf::from(p));
    }
    let exe = std::env::current_exe().expect("current_exe");
    exe.ancestors()
        .skip(1)
        .take(3)
        .map(|d| d.join(BIN_NAME))
        .find(|p| p.is_file())
}
