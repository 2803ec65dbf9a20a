//! A simulated GPU node running the real `gpu-share` binary, for gpu-share's integration tests
//! (`tests/*.rs`) and whole-process benchmarks (`benches/agent_figures.rs`). See README.md.
//!
//! - [`CliNode`]: `gpu-share apply` / `status` run as processes against the fake
//!   `libnvidia-ml.so` (tests/fake-nvml).
//! - [`AgentNode`]: the `gpu-share agent` process against the Kubernetes API double
//!   (tests/kube-double) and the fake NVML, with a host fixture tree and a simulated kubelet for
//!   GPU processes: each simulated pod owns NVML processes (a fixture `/proc/<pid>/cgroup` names
//!   its pod UID), and when the pod is deleted its processes leave the fake NVML state.
//!
//! The `gpu-share` binary is the one cargo built beside the running test or bench
//! ([`gpu_share_bin`]): the debug build under `cargo test`, the bench-profile (release) build
//! under `cargo bench`.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use gpu_share::plan::{plan, steps, ObservedNode, Step};
use gpu_share::profile::parse_profile;
use nvidia_ml::{cdylib_path, read_log, Gpu, LogEntry, State};

mod agent;
mod cli;
pub mod consumable_scheduler;
mod device_plugins;
mod dra_kubelet;
mod dra_node;
pub mod grpc_go;
mod nvidia_plugin;
mod pod_resources;

pub use agent::*;
pub use cli::*;
pub use device_plugins::{dial_plugin, gpu_allocatable, Advertised, DevicePluginKubelet};
pub use dra_kubelet::{claim, DraKubelet, KUBELET_DRA_SERVICES};
pub use dra_node::*;
pub use nvidia_plugin::nvidia_plugin_counts;
pub use pod_resources::PodResourcesKubelet;

pub const NS: &str = "gpu-share";
pub const CM: &str = "gpu-share-profiles";
pub const PROFILE_LABEL: &str = "gpu-share.dev/profile";
pub const STATE_LABEL: &str = "gpu-share.dev/profile.state";
pub const REASON: &str = "gpu-share.dev/profile.reason";
pub const APPLIED_HASH: &str = "gpu-share.dev/profile.applied-hash";
pub const CORDONED: &str = "gpu-share.dev/cordoned";

/// Profiles for 8 × H100 80GB; every ordered pair is a transition of the transition suite
/// (`tests/apply.rs`, `tests/reliability.rs`, `benches/agent_figures.rs`).
pub const H100_PROFILES: &[&str] = &[
    "h100-inference",
    "h100-balanced",
    "a100-80gb-single",
    "exclusive",
    "homelab-timeslice",
];

/// Every ordered pair of [`H100_PROFILES`]: 20 transitions.
pub fn transitions() -> Vec<(&'static str, &'static str)> {
    let mut out = Vec::new();
    for from in H100_PROFILES {
        for to in H100_PROFILES {
            if from != to {
                out.push((*from, *to));
            }
        }
    }
    out
}

/// Whether example profile `name` puts any GPU in MIG mode. A transition between two profiles
/// that do not (say exclusive → homelab-timeslice) makes no NVML mutation: only the
/// device-plugin config changes, so a crash-at-every-mutation run of it has no point to crash at.
pub fn profile_uses_mig(name: &str) -> bool {
    let profile = parse_profile(name, &profile_text(name)).expect("example profiles parse");
    profile.rules.iter().any(|rule| rule.mig.is_some())
}

/// The `gpu-share` binary cargo built for the running integration test or bench:
/// `target/<profile>/gpu-share` above the running executable (which lives in
/// `target/<profile>/deps/`), or `$CARGO_BIN_EXE_gpu-share` where the runner sets it at run time
/// (cargo-nextest does).
pub fn gpu_share_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let exe = std::env::current_exe().expect("current_exe");
        let built = |dir: &Path| Some(dir.join("gpu-share")).filter(|p| p.is_file());
        std::env::var_os("CARGO_BIN_EXE_gpu-share")
            .map(PathBuf::from)
            .or_else(|| exe.ancestors().skip(1).take(3).find_map(built))
            .unwrap_or_else(|| {
                panic!(
                    "gpu-share not found above {}: node-sim runs the binary cargo builds for the gpu-share package's integration tests and benches",
                    exe.display()
                )
            })
    })
}

/// The repository root (the CLI runs there, so profile paths are relative to it).
pub fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .and_then(Path::parent)
        .expect("tests/node-sim is two levels below the repository")
}

/// `profiles/<name>.yaml`, relative to the repository.
pub fn profile_path(name: &str) -> String {
    format!("profiles/{name}.yaml")
}

/// The text of example profile `name` (`builtin/h100-mps-in-mig` for a subdirectory).
pub fn profile_text(name: &str) -> String {
    std::fs::read_to_string(repo().join(profile_path(name)))
        .unwrap_or_else(|e| panic!("profile {name}: {e}"))
}

pub fn sha256(text: &str) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

static MPS_CONTROL_OPTIONAL: AtomicBool = AtomicBool::new(false);

/// For a process that runs no MPS profile and may run where the fake `nvidia-cuda-mps-control`
/// was not built (`cargo bench` does not build it): nodes are then given the fake only where it
/// exists. Tests leave it required, so a missing fake fails them with how to build it.
pub fn mps_control_optional() {
    MPS_CONTROL_OPTIONAL.store(true, Ordering::SeqCst);
}

/// The fake `nvidia-cuda-mps-control` the nodes run MPS daemons with (tests/fake-mps-control).
/// Panics where it has not been built, unless [`mps_control_optional`] was called.
pub fn mps_control() -> Option<PathBuf> {
    if MPS_CONTROL_OPTIONAL.load(Ordering::SeqCst) {
        fake_mps_control::find()
    } else {
        Some(fake_mps_control::binary_path())
    }
}

/// `n` H100s, MIG on or off.
pub fn h100s(n: usize, mig_on: bool) -> Vec<Gpu> {
    gpus("h100", n, mig_on)
}

/// `n` GPUs of a catalog model, MIG on or off.
pub fn gpus(model: &str, n: usize, mig_on: bool) -> Vec<Gpu> {
    (0..n)
        .map(|_| {
            let g = Gpu::mig(model);
            if mig_on {
                g.mig_enabled()
            } else {
                g
            }
        })
        .collect()
}

/// GPU instances without exactly one compute instance: what a crash between "create GI" and
/// "create CI" (or a half-done destroy) would leave, and no workload could use.
pub fn orphans(state: &State) -> Vec<String> {
    let mut out = Vec::new();
    for (i, gpu) in state.gpus.iter().enumerate() {
        for gi in &gpu.gpu_instances {
            if gi.compute_instances.len() != 1 {
                out.push(format!(
                    "GPU {i}: GI {} has {} compute instances",
                    gi.id,
                    gi.compute_instances.len()
                ));
            }
        }
    }
    out
}

pub fn assert_no_orphans(state: &State, what: &str) {
    let o = orphans(state);
    assert!(o.is_empty(), "{what}: orphaned GPU instances: {o:?}");
}

/// A GPU's MIG layout: (profile id, placement start, size) of every GPU instance.
pub fn layout(gpu: &Gpu) -> BTreeSet<(u32, u32, u32)> {
    gpu.gpu_instances
        .iter()
        .map(|g| (g.profile_id, g.placement.start, g.placement.size))
        .collect()
}

/// Whether a GPU's MIG layout or mode differs between two states.
pub fn gpu_changed(before: &Gpu, after: &Gpu) -> bool {
    layout(before) != layout(after) || before.mig.map(|m| m.current) != after.mig.map(|m| m.current)
}

pub fn instance_count(state: &State) -> usize {
    state.gpus.iter().map(|g| g.gpu_instances.len()).sum()
}

/// The MIG steps still needed to make `observed` match the profile `name` (none: it matches).
pub fn pending_steps(name: &str, observed: &ObservedNode) -> Vec<Step> {
    let profile = parse_profile(name, &profile_text(name)).expect("example profiles parse");
    let node_plan = plan(name, &profile, observed)
        .unwrap_or_else(|p| panic!("{name} does not plan on this node: {p:?}"));
    steps(&node_plan, observed)
}

/// Observe a fake-NVML node the way an operator does: `gpu-share status -o json`.
pub fn observe(nvml_state: &Path) -> ObservedNode {
    try_observe(nvml_state).unwrap_or_else(|e| panic!("{e}"))
}

/// [`observe`], with a failure (say, the state file caught mid-write) as an error.
pub fn try_observe(nvml_state: &Path) -> Result<ObservedNode, String> {
    let out = Command::new(gpu_share_bin())
        .args(["status", "-o", "json"])
        .env("GPU_SHARE_NVML_LIB", cdylib_path())
        .env("FAKE_NVML_STATE", nvml_state)
        .env_remove("FAKE_NVML_LOG")
        .env("RUST_LOG", "warn")
        .output()
        .map_err(|e| format!("run gpu-share status: {e}"))?;
    if !out.status.success() {
        return Err(format!("status: {}", text(&out)));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("status JSON: {e}"))
}

/// The node matches profile `name`: no MIG step left, nothing orphaned.
pub fn matches(name: &str, nvml_state: &Path) -> bool {
    let state = State::read_from(nvml_state).unwrap();
    orphans(&state).is_empty() && pending_steps(name, &observe(nvml_state)).is_empty()
}

/// A process's exit code and output, for assertion messages.
pub fn text(o: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Successful mutations in a fake-NVML log.
pub fn successful_mutations(log: &Path) -> Vec<LogEntry> {
    if !log.exists() {
        return Vec::new();
    }
    read_log(log)
        .into_iter()
        .filter(|e| e.result == "NVML_SUCCESS")
        .collect()
}

/// A free TCP port on 127.0.0.1 (bound, then released for the agent).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// GET `path` from 127.0.0.1:`port` (plain HTTP/1.1, `Connection: close`); the body.
pub fn http_get(port: u16, path: &str) -> Option<String> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    out.split_once("\r\n\r\n").map(|(_, b)| b.to_string())
}

/// The value of one Prometheus series (exact name and labels) in a /metrics text.
pub fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

/// Poll `cond` every `every` until it holds or `timeout` passes.
pub fn poll(timeout: Duration, every: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(every);
    }
}

/// The environment variable that replays a seeded test: the seed a run printed.
pub const TEST_SEED_VAR: &str = "GPU_SHARE_TEST_SEED";

/// The seed of a test that picks its cases: `GPU_SHARE_TEST_SEED` when set (to replay a run),
/// else one from the clock, so runs differ. Printed either way, with how to replay it (the
/// test harness shows it with the failure).
///
/// # Panics
/// On a `GPU_SHARE_TEST_SEED` that is not a number.
pub fn test_seed(what: &str) -> u64 {
    let seed = match std::env::var(TEST_SEED_VAR) {
        Ok(text) => text
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("{TEST_SEED_VAR}={text:?}: {e}")),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
    };
    eprintln!("{what}: seed {seed} (replay with {TEST_SEED_VAR}={seed})");
    seed
}
