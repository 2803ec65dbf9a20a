//! Compute modes for MPS, through the real `gpu-share apply` binary and the fake NVML
//! (tests/fake-nvml) and MPS control daemon (tests/fake-mps-control): whole GPUs shared through
//! MPS go to EXCLUSIVE_PROCESS before their daemon starts and back to DEFAULT when they leave MPS;
//! an administrator's modes are left alone; a refused mode is reported and MPS starts anyway;
//! MPS inside MIG devices gets no compute mode.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Command, Output};

use nvidia_ml::ComputeMode::{self, Default as Dflt, ExclusiveProcess as Ep, Prohibited};
use nvidia_ml::{cdylib_path, read_log, Gpu, LogEntry, State};
use serde_json::Value;

/// One simulated node: the fake NVML's state file and mutation log, gpu-share's state dir, and
/// a wrapper around the fake MPS control binary that copies the NVML state file when a daemon
/// starts (`-d`), so a test can see the compute modes the daemon started under.
struct Node {
    dir: tempfile::TempDir,
    state: PathBuf,
    log: PathBuf,
    state_dir: PathBuf,
    control: PathBuf,
}

/// MPS daemons a test's applies started die with its node (they are detached from gpu-share,
/// as on a real node, so nothing else stops them).
impl Drop for Node {
    fn drop(&mut self) {
        node_sim::kill_mps_daemons(&self.state_dir.join("mps"));
    }
}

impl Node {
    fn new(gpus: Vec<Gpu>) -> Node {
        let dir = tempfile::tempdir().unwrap();
        let node = Node {
            state: dir.path().join("nvml-state.json"),
            log: dir.path().join("nvml.log"),
            state_dir: dir.path().join("gpu-share"),
            // The file name must be the daemon's process name (MpsSettings::control_binary).
            control: dir.path().join("bin/nvidia-cuda-mps-control"),
            dir,
        };
        State::with_gpus(gpus).write_to(&node.state).unwrap();
        fs::create_dir_all(node.control.parent().unwrap()).unwrap();
        let script = format!(
            "#!/bin/sh\nif [ \"$1\" = -d ]; then cp '{}' '{}'; fi\nexec '{}' \"$@\"\n",
            node.state.display(),
            node.at_daemon_start().display(),
            fake_mps_control::binary_path().display()
        );
        let tmp = node.control.with_extension("tmp");
        fs::write(&tmp, script).unwrap();
        fs::set_permissions(&tmp, fs::Permissions::from_mode(0o755)).unwrap();
        fs::rename(&tmp, &node.control).unwrap();
        node
    }

    /// The NVML state as it was when the last MPS daemon was started.
    fn at_daemon_start(&self) -> PathBuf {
        self.dir.path().join("nvml-state-at-daemon-start.json")
    }

    fn gpu_share(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_gpu-share"));
        cmd.args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env_remove("FAKE_NVML_FAIL")
            .env("GPU_SHARE_NVML_LIB", cdylib_path())
            .env("FAKE_NVML_STATE", &self.state)
            .env("FAKE_NVML_LOG", &self.log)
            .env("GPU_SHARE_STATE_DIR", &self.state_dir)
            .env("GPU_SHARE_MPS_CONTROL", &self.control)
            .env("GPU_SHARE_MPS_ROOT", self.state_dir.join("mps"))
            .env("RUST_LOG", "warn");
        cmd.envs(env.iter().copied());
        cmd.output().expect("run gpu-share")
    }

    /// `apply -o json`: the report, and stderr (the log), after checking it succeeded.
    fn apply(&self, profile: &str, extra: &[&str], env: &[(&str, &str)]) -> (Value, String) {
        let mut args = vec!["apply", "--profile", profile, "-o", "json"];
        args.extend(extra);
        let out = self.gpu_share(&args, env);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            out.status.success(),
            "apply {profile}: {}{stderr}",
            String::from_utf8_lossy(&out.stdout)
        );
        (serde_json::from_slice(&out.stdout).unwrap(), stderr)
    }

    fn modes(&self) -> Vec<ComputeMode> {
        modes(&State::read_from(&self.state).unwrap())
    }

    fn uuid(&self, gpu: usize) -> String {
        State::read_from(&self.state).unwrap().gpus[gpu]
            .uuid
            .clone()
    }

    /// Every `nvmlDeviceSetComputeMode` the fake saw: (GPU, mode value, result).
    fn sets(&self) -> Vec<(Option<usize>, u64, String)> {
        self.log_entries()
            .into_iter()
            .filter(|e| e.function == "nvmlDeviceSetComputeMode")
            .map(|e| (e.gpu, e.args["mode"].as_u64().unwrap_or(99), e.result))
            .collect()
    }

    fn log_entries(&self) -> Vec<LogEntry> {
        if self.log.exists() {
            read_log(&self.log)
        } else {
            Vec::new()
        }
    }

    /// The UUIDs in gpu-share's record of the GPUs it put in EXCLUSIVE_PROCESS.
    fn recorded(&self) -> Vec<String> {
        let Ok(text) = fs::read_to_string(self.state_dir.join("compute-mode.json")) else {
            return Vec::new();
        };
        let record: Value = serde_json::from_str(&text).unwrap();
        record["exclusiveProcess"]
            .as_array()
            .unwrap()
            .iter()
            .map(|u| u.as_str().unwrap().to_string())
            .collect()
    }
}

fn modes(state: &State) -> Vec<ComputeMode> {
    state.gpus.iter().map(|g| g.compute_mode).collect()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect()
}

/// (GPU, from, to) of the report's compute-mode changes.
fn changed(report: &Value) -> Vec<(u64, Value, String)> {
    report["computeMode"]["changed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["gpu"].as_u64().unwrap(),
                c.get("from").cloned().unwrap_or(Value::Null),
                c["to"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// `NVML_COMPUTEMODE_EXCLUSIVE_PROCESS` and `NVML_COMPUTEMODE_DEFAULT`, as the log has them.
const EP: u64 = 3;
const DEFAULT: u64 = 0;

#[test]
fn mps_gpus_go_exclusive_before_the_daemon_starts_and_back_to_default_after() {
    let node = Node::new(vec![Gpu::mig("h100"), Gpu::mig("h100")]);

    let (report, _) = node.apply("profiles/h100-mps.yaml", &[], &[]);
    assert_eq!(strings(&report["mps"]["started"]), ["nvidia.com/gpu"]);
    assert_eq!(
        changed(&report),
        [
            (0, "DEFAULT".into(), "EXCLUSIVE_PROCESS".into()),
            (1, "DEFAULT".into(), "EXCLUSIVE_PROCESS".into())
        ]
    );
    assert_eq!(report["computeMode"]["failed"], Value::Array(vec![]));
    let ok = || "NVML_SUCCESS".to_string();
    assert_eq!(node.sets(), [(Some(0), EP, ok()), (Some(1), EP, ok())]);
    let at_start = State::read_from(node.at_daemon_start()).expect("the daemon was started");
    assert_eq!(
        modes(&at_start),
        [Ep, Ep],
        "EXCLUSIVE_PROCESS is set before the control daemon starts"
    );
    assert_eq!(node.recorded(), [node.uuid(0), node.uuid(1)]);

    // `status` shows it, in JSON and as text.
    let out = node.gpu_share(&["status", "-o", "json"], &[]);
    let status: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(status["gpus"][0]["computeMode"], "EXCLUSIVE_PROCESS");
    let out = node.gpu_share(&["status"], &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("compute mode EXCLUSIVE_PROCESS"), "{text}");

    // A second apply changes nothing.
    let mutations = node.log_entries().len();
    let (again, _) = node.apply("profiles/h100-mps.yaml", &[], &[]);
    assert_eq!(node.log_entries().len(), mutations, "second apply mutated");
    assert!(changed(&again).is_empty());
    assert_eq!(strings(&again["mps"]["unchanged"]), ["nvidia.com/gpu"]);

    // Exclusive: the daemon stops and both GPUs go back to DEFAULT.
    let (report, _) = node.apply("profiles/exclusive.yaml", &[], &[]);
    assert_eq!(strings(&report["mps"]["stopped"]), ["nvidia.com/gpu"]);
    assert_eq!(
        changed(&report),
        [
            (0, "EXCLUSIVE_PROCESS".into(), "DEFAULT".into()),
            (1, "EXCLUSIVE_PROCESS".into(), "DEFAULT".into())
        ]
    );
    assert_eq!(node.modes(), [Dflt, Dflt]);
    assert!(node.recorded().is_empty());
    assert_eq!(
        node.sets()[2..],
        [(Some(0), DEFAULT, ok()), (Some(1), DEFAULT, ok())]
    );
    let mutations = node.log_entries().len();
    node.apply("profiles/exclusive.yaml", &[], &[]);
    assert_eq!(node.log_entries().len(), mutations);
}

#[test]
fn an_administrators_compute_modes_are_never_reset() {
    // GPU 1: set PROHIBITED by hand, and stays exclusive. GPU 2: set EXCLUSIVE_PROCESS by hand,
    // then shared through MPS (already as MPS needs it: not ours to reset afterwards).
    let node = Node::new(vec![
        Gpu::mig("h100"),
        Gpu::mig("h100").with_compute_mode(Prohibited),
        Gpu::mig("h100").with_compute_mode(Ep),
    ]);
    let profile = node.dir.path().join("mps-0-and-2.yaml");
    fs::write(
        &profile,
        "version: v1\nrules:\n  - devices: [0, 2]\n    mps: {replicas: 4}\n",
    )
    .unwrap();
    let builtin = ["--plugin", "builtin"];
    let (report, _) = node.apply(profile.to_str().unwrap(), &builtin, &[]);
    assert_eq!(strings(&report["mps"]["started"]), ["nvidia.com/gpu"]);
    assert_eq!(
        changed(&report),
        [(0, "DEFAULT".into(), "EXCLUSIVE_PROCESS".into())]
    );
    assert_eq!(node.modes(), [Ep, Prohibited, Ep]);
    assert_eq!(node.recorded(), [node.uuid(0)]);

    let (report, _) = node.apply("profiles/exclusive.yaml", &builtin, &[]);
    assert_eq!(strings(&report["mps"]["stopped"]), ["nvidia.com/gpu"]);
    assert_eq!(
        changed(&report),
        [(0, "EXCLUSIVE_PROCESS".into(), "DEFAULT".into())]
    );
    assert_eq!(node.modes(), [Dflt, Prohibited, Ep]);
    let ok = || "NVML_SUCCESS".to_string();
    assert_eq!(
        node.sets(),
        [(Some(0), EP, ok()), (Some(0), DEFAULT, ok())],
        "GPUs 1 and 2 are never touched"
    );
}

#[test]
fn a_refused_compute_mode_is_reported_and_mps_starts_anyway() {
    let node = Node::new(vec![Gpu::mig("h100"), Gpu::mig("h100")]);
    let fail = [("FAKE_NVML_FAIL", "nvmlDeviceSetComputeMode:1:NOT_SUPPORTED")];
    let (report, log) = node.apply("profiles/h100-mps.yaml", &[], &fail);
    assert_eq!(strings(&report["mps"]["started"]), ["nvidia.com/gpu"]);
    assert!(report["mps"]["ready"].as_bool().unwrap());
    let failed = report["computeMode"]["failed"].as_array().unwrap();
    assert_eq!(failed.len(), 1, "{report}");
    assert_eq!(failed[0]["gpu"], 0);
    assert_eq!(failed[0]["uuid"], node.uuid(0));
    assert_eq!(failed[0]["mode"], "EXCLUSIVE_PROCESS");
    assert_eq!(failed[0]["error"], "NVML_ERROR_NOT_SUPPORTED");
    assert!(
        log.contains("WARN")
            && log.contains("GPU 0")
            && log.contains("cannot set compute mode EXCLUSIVE_PROCESS")
            && log.contains("NVML_ERROR_NOT_SUPPORTED"),
        "{log}"
    );
    assert_eq!(
        changed(&report),
        [(1, "DEFAULT".into(), "EXCLUSIVE_PROCESS".into())]
    );
    assert_eq!(node.modes(), [Dflt, Ep]);
    assert_eq!(
        node.recorded(),
        [node.uuid(1)],
        "a refused GPU is not recorded"
    );

    // Text output names it too; the next apply (no fault) sets what was refused.
    let out = node.gpu_share(&["apply", "--profile", "profiles/h100-mps.yaml"], &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("GPU 0") && text.contains("compute mode DEFAULT -> EXCLUSIVE_PROCESS"),
        "{text}"
    );
    assert_eq!(node.modes(), [Ep, Ep]);

    let out = node.gpu_share(
        &["apply", "--profile", "profiles/exclusive.yaml"],
        &[("FAKE_NVML_FAIL", "nvmlDeviceSetComputeMode:1:NO_PERMISSION")],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("warning: GPU 0")
            && text.contains("cannot set compute mode DEFAULT: NVML_ERROR_NO_PERMISSION"),
        "{text}"
    );
    assert_eq!(node.modes(), [Ep, Dflt]);
    assert_eq!(node.recorded(), [node.uuid(0)], "kept, to retry");
    node.apply("profiles/exclusive.yaml", &[], &[]);
    assert_eq!(node.modes(), [Dflt, Dflt]);
    assert!(node.recorded().is_empty());
}

#[test]
fn mps_inside_mig_devices_gets_no_compute_mode() {
    let node = Node::new(vec![Gpu::mig("h100")]);
    node.apply("profiles/h100-mps.yaml", &[], &[]);
    assert_eq!(node.modes(), [Ep]);

    // Whole-GPU MPS → MPS inside MIG devices: MIG goes on, the GPU goes back to DEFAULT, and
    // the MIG devices' daemons start with no EXCLUSIVE_PROCESS anywhere.
    let builtin = ["--plugin", "builtin"];
    let (report, _) = node.apply("profiles/builtin/h100-mps-in-mig.yaml", &builtin, &[]);
    assert_eq!(report["mps"]["started"].as_array().unwrap().len(), 2);
    assert_eq!(
        changed(&report),
        [(0, "EXCLUSIVE_PROCESS".into(), "DEFAULT".into())]
    );
    assert_eq!(node.modes(), [Dflt]);
    assert_eq!(node.sets().len(), 2, "{:?}", node.sets());
    let mutations = node.log_entries().len();
    node.apply("profiles/builtin/h100-mps-in-mig.yaml", &builtin, &[]);
    assert_eq!(node.log_entries().len(), mutations);
}
