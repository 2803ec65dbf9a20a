//! The agent's NVML session (`gpu::SharedGpus`) against the fake `libnvidia-ml.so`: it is
//! initialised once however often it is used, and opened again after an error. Its own test
//! binary, because the fault injected into `nvmlInit_v2` counts calls per process.

use gpu_share::gpu::{GpuError, Gpus, SharedGpus};
use nvidia_ml::{cdylib_path, Gpu, State};

#[derive(Debug)]
enum Failure {
    Gpu(GpuError),
    /// An error of the caller's, not NVML's: the session is dropped all the same.
    Caller,
}

impl From<GpuError> for Failure {
    fn from(e: GpuError) -> Self {
        Failure::Gpu(e)
    }
}

#[test]
fn one_init_for_many_uses_and_a_fresh_session_after_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("nvml.json");
    State::with_gpus([Gpu::mig("h100")])
        .write_to(&state)
        .unwrap();
    // Read by the fake at its first call: the third nvmlInit_v2 (what nvml-wrapper calls without flags)
    // of this process fails. The fake counts calls in the loaded library, so `_pin` (init 1)
    // keeps it loaded while the session is dropped and opened again.
    std::env::set_var("FAKE_NVML_STATE", &state);
    std::env::set_var("FAKE_NVML_FAIL", "nvmlInit_v2:3:UNKNOWN");
    let _pin = Gpus::open(Some(&cdylib_path())).unwrap();
    let session = SharedGpus::new(Some(cdylib_path()), "/".into());

    // Many uses, one init (init 2): another init would have failed.
    for _ in 0..5 {
        let node = session
            .with(Gpus::observe)
            .expect("the first session serves every use");
        assert_eq!(node.gpus.len(), 1);
    }

    // An error drops the session: the next use initialises again (init 3, the injected
    // failure), and the one after that gets a working session (init 4).
    let err = session.with(|_| Err::<(), _>(Failure::Caller)).unwrap_err();
    assert!(matches!(err, Failure::Caller));
    let err = session
        .with(|g| g.observe().map_err(Failure::from))
        .unwrap_err();
    let Failure::Gpu(err) = err else {
        panic!("the session's own error, not the caller's: {err:?}")
    };
    assert!(
        err.to_string()
            .contains("an internal driver error occurred"),
        "{err}"
    );
    let node = session
        .with(Gpus::observe)
        .expect("a fresh session after the failed one");
    assert_eq!(node.gpus[0].product, "NVIDIA H100 80GB HBM3");
}
