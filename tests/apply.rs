//! `gpu-share apply` and `status` on one node, run as a user runs them, against the fake
//! `libnvidia-ml.so` (tests/fake-nvml): every example profile on every model it fits,
//! transitions between profiles (counting instances destroyed), processes blocking a destroy,
//! an Ampere MIG-mode change that waits for a reset, and a crash at every mutation of a
//! transition followed by a rerun that converges with nothing orphaned.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use nvidia_ml::{cdylib_path, read_log, Gpu, LogEntry, Process, State};

/// One simulated node: a fake-NVML state file, its mutation log and gpu-share's state dir.
struct Node {
    _dir: tempfile::TempDir,
    state: PathBuf,
    log: PathBuf,
    state_dir: PathBuf,
}

impl Node {
    fn new(gpus: Vec<Gpu>) -> Node {
        let dir = tempfile::tempdir().unwrap();
        let node = Node {
            state: dir.path().join("nvml-state.json"),
            log: dir.path().join("nvml.log"),
            state_dir: dir.path().join("gpu-share"),
            _dir: dir,
        };
        State::with_gpus(gpus).write_to(&node.state).unwrap();
        node
    }

    fn gpu_share(&self, args: &[&str], env: &[(&str, String)]) -> Output {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_gpu-share"));
        cmd.args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env("GPU_SHARE_NVML_LIB", cdylib_path())
            .env("GPU_SHARE_STATE_DIR", &self.state_dir)
            .env("FAKE_NVML_STATE", &self.state)
            .env("FAKE_NVML_LOG", &self.log)
            .env("GPU_SHARE_MPS_CONTROL", fake_mps_control::binary_path())
            .env("GPU_SHARE_MPS_ROOT", self.state_dir.join("mps"))
            .env("RUST_LOG", "warn");
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.output().expect("run gpu-share")
    }

    fn apply(&self, profile: &str) -> Output {
        self.gpu_share(&["apply", "--profile", profile], &[])
    }

    /// `apply -o json` with `extra` arguments; the report, after checking it succeeded.
    fn apply_report(&self, profile: &str, extra: &[&str]) -> serde_json::Value {
        let mut args = vec!["apply", "--profile", profile, "-o", "json"];
        args.extend(extra);
        let out = self.gpu_share(&args, &[]);
        assert!(out.status.success(), "apply {profile}: {}", text(&out));
        serde_json::from_slice(&out.stdout).unwrap()
    }

    fn apply_ok(&self, profile: &str) -> String {
        let out = self.apply(profile);
        assert!(out.status.success(), "apply {profile}: {}", text(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Apply like an operator would on any GPU family: when the driver leaves a MIG mode
    /// change pending (Ampere), reset those GPUs (simulated) and resume.
    fn apply_with_resets(&self, profile: &str) {
        let out = self.apply(profile);
        if out.status.code() == Some(3) {
            let mut state = self.fake_state();
            for gpu in &mut state.gpus {
                if gpu.mig.is_some_and(|m| m.current != m.pending) {
                    gpu.reset();
                }
            }
            state.write_to(&self.state).unwrap();
            let out = self.gpu_share(&["apply", "--resume"], &[]);
            assert!(out.status.success(), "resume {profile}: {}", text(&out));
        } else {
            assert!(out.status.success(), "apply {profile}: {}", text(&out));
        }
    }

    fn fake_state(&self) -> State {
        State::read_from(&self.state).unwrap()
    }

    fn status_json(&self) -> String {
        let out = self.gpu_share(&["status", "-o", "json"], &[]);
        assert!(out.status.success(), "status: {}", text(&out));
        String::from_utf8(out.stdout).unwrap()
    }

    /// Successful mutations the fake logged so far.
    fn mutations(&self) -> Vec<LogEntry> {
        if !self.log.exists() {
            return Vec::new();
        }
        read_log(&self.log)
            .into_iter()
            .filter(|e| e.result == "NVML_SUCCESS")
            .collect()
    }

    fn count(&self, function: &str) -> usize {
        self.mutations()
            .iter()
            .filter(|e| e.function == function)
            .count()
    }

    /// The node matches `profile`: `plan --current <status>` wants no MIG step anywhere, and
    /// nothing is orphaned (every GPU instance has its compute instance).
    fn assert_matches(&self, profile: &str) {
        let current = self.state.with_extension("status.json");
        std::fs::write(&current, self.status_json()).unwrap();
        let out = self.gpu_share(
            &[
                "plan",
                "--profile",
                profile,
                "--current",
                path(&current),
                "-o",
                "json",
            ],
            &[],
        );
        assert!(out.status.success(), "plan: {}", text(&out));
        let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        for gpu in plan["gpus"].as_array().unwrap() {
            assert!(
                gpu.get("migMode").is_none(),
                "{profile}: MIG mode still to change: {gpu}"
            );
            if let Some(g) = gpu.get("geometry") {
                assert_eq!(g["create"], serde_json::json!([]), "{profile}: {gpu}");
                assert_eq!(g["destroy"], serde_json::json!([]), "{profile}: {gpu}");
            }
        }
        assert_no_orphans(&self.fake_state());
    }
}

/// MPS daemons a test started die with it (a failed assertion must not leak processes).
impl Drop for Node {
    fn drop(&mut self) {
        for pid_file in pid_files(&self.state_dir.join("mps")) {
            if let Ok(pid) = std::fs::read_to_string(&pid_file)
                .unwrap_or_default()
                .trim()
                .parse()
            {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }
}

fn pid_files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .flat_map(|e| {
            let p = e.path();
            if p.is_dir() {
                pid_files(&p)
            } else if p
                .file_name()
                .is_some_and(|n| n == "nvidia-cuda-mps-control.pid")
            {
                vec![p]
            } else {
                Vec::new()
            }
        })
        .collect()
}

fn assert_no_orphans(state: &State) {
    for (i, gpu) in state.gpus.iter().enumerate() {
        for gi in &gpu.gpu_instances {
            assert_eq!(
                gi.compute_instances.len(),
                1,
                "GPU {i}: GI {} has {} compute instances",
                gi.id,
                gi.compute_instances.len()
            );
        }
    }
}

fn instance_count(state: &State) -> usize {
    state.gpus.iter().map(|g| g.gpu_instances.len()).sum()
}

fn text(o: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn gpus(model: &str, n: usize, mig_on: bool) -> Vec<Gpu> {
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

/// Example profiles and the catalog models (8 GPUs each) they are applied on.
const EXAMPLES: &[(&str, &[&str])] = &[
    (
        "profiles/h100-inference.yaml",
        &["h100-80gb-sxm", "h100-pcie", "a100-80gb"],
    ),
    ("profiles/h100-balanced.yaml", &["h100-80gb-sxm"]),
    ("profiles/a100-40gb-mixed.yaml", &["a100-sxm4-40gb"]),
    (
        "profiles/a100-80gb-single.yaml",
        &["a100-80gb", "h100-80gb-sxm", "h100-pcie"],
    ),
    ("profiles/h200-mig-timeslice.yaml", &["h200-141gb"]),
    ("profiles/h100-mps.yaml", &["h100-80gb-sxm"]),
    ("profiles/exclusive.yaml", &["h100-80gb-sxm", "a30-24gb"]),
];

#[test]
fn every_example_profile_applies_on_every_model_it_fits_and_twice_changes_nothing() {
    for (profile, models) in EXAMPLES {
        for model in *models {
            let node = Node::new(gpus(model, 8, true));
            node.apply_with_resets(profile);
            node.assert_matches(profile);
            let before = node.mutations().len();
            let out = node.apply_ok(profile);
            assert!(out.contains("0 steps"), "{profile} on {model}: {out}");
            assert_eq!(
                node.mutations().len(),
                before,
                "{profile} on {model}: second apply mutated"
            );
        }
    }
}

#[test]
fn mps_daemons_start_with_the_profile_and_stop_when_it_changes() {
    let node = Node::new(gpus("h100", 2, false));
    let report = node.apply_report("profiles/h100-mps.yaml", &[]);
    assert_eq!(
        report["mps"]["started"],
        serde_json::json!(["nvidia.com/gpu"])
    );
    assert_eq!(pid_files(&node.state_dir.join("mps")).len(), 1);
    let ready = std::fs::read_to_string(node.state_dir.join("mps/.ready")).unwrap();
    assert!(
        ready.contains("\"replicas\":8"),
        "NVIDIA's wait compares sharing.mps: {ready}"
    );

    let report = node.apply_report("profiles/exclusive.yaml", &[]);
    assert_eq!(
        report["mps"]["stopped"],
        serde_json::json!(["nvidia.com/gpu"])
    );
    assert!(pid_files(&node.state_dir.join("mps")).is_empty());
}

#[test]
fn mps_inside_mig_devices_gets_one_daemon_per_device() {
    let node = Node::new(gpus("h100", 2, false));
    let profile = "profiles/builtin/h100-mps-in-mig.yaml";
    let builtin = ["--plugin", "builtin"];
    let report = node.apply_report(profile, &builtin);
    let status: serde_json::Value = serde_json::from_str(&node.status_json()).unwrap();
    let mut mig_uuids: Vec<String> = status["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["computeInstances"].as_array().unwrap().clone())
        .map(|ci| ci["uuid"].as_str().unwrap().to_string())
        .collect();
    mig_uuids.sort();
    assert_eq!(mig_uuids.len(), 4, "2 GPUs × 2 × 3g.40gb");
    let mut started: Vec<String> = report["mps"]["started"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect();
    started.sort();
    let expected: Vec<String> = mig_uuids
        .iter()
        .map(|u| format!("nvidia.com/mig-3g.40gb/{u}"))
        .collect();
    assert_eq!(started, expected);
    let mps = node.state_dir.join("mps");
    assert_eq!(pid_files(&mps).len(), 4);
    // Each daemon sees only its MIG device and got the per-client defaults (the fake logs its
    // CUDA_VISIBLE_DEVICES and every command it received). 40448 MiB: the catalog's H100 3g.40gb.
    for uuid in &mig_uuids {
        let log = std::fs::read_to_string(
            mps.join("nvidia.com/mig-3g.40gb")
                .join(uuid)
                .join("log/control.log"),
        )
        .unwrap();
        assert!(
            log.contains(&format!("CUDA_VISIBLE_DEVICES={uuid}\n")),
            "{log}"
        );
        assert!(
            log.contains(&format!(
                "Cmd:set_default_device_pinned_mem_limit 0 {}M",
                40448 / 4
            )),
            "{log}"
        );
        assert!(
            log.contains("Cmd:set_default_active_thread_percentage 50"),
            "{log}"
        );
    }
    // A second apply changes nothing; back to exclusive quits every daemon.
    let again = node.apply_report(profile, &builtin);
    assert_eq!(again["mps"]["unchanged"].as_array().unwrap().len(), 4);
    assert!(again["mps"]["started"].as_array().unwrap().is_empty());
    let report = node.apply_report("profiles/exclusive.yaml", &[]);
    assert_eq!(report["mps"]["stopped"].as_array().unwrap().len(), 4);
    assert!(pid_files(&mps).is_empty());
}

#[test]
fn a_home_lab_gpu_without_mig_is_left_alone() {
    let node = Node::new(vec![Gpu::non_mig("NVIDIA GeForce RTX 3090", 24576)]);
    let out = node.apply_ok("profiles/homelab-timeslice.yaml");
    assert!(out.contains("0 steps"), "{out}");
    assert!(node.mutations().is_empty());
}

#[test]
fn status_shows_instances_placements_uuids_and_processes() {
    let node = Node::new(gpus("h100", 1, true));
    node.apply_ok("profiles/h100-balanced.yaml");
    let status: serde_json::Value = serde_json::from_str(&node.status_json()).unwrap();
    let gpu = &status["gpus"][0];
    assert_eq!(gpu["product"], "NVIDIA H100 80GB HBM3");
    assert_eq!(
        gpu["mig"],
        serde_json::json!({"current": true, "pending": true})
    );
    let placements: Vec<String> = gpu["instances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            format!(
                "{}@{}",
                i["profile"].as_str().unwrap(),
                i["placement"]["start"]
            )
        })
        .collect();
    assert_eq!(
        placements,
        [
            "1g.10gb@0",
            "1g.10gb@1",
            "1g.10gb@2",
            "1g.10gb@3",
            "3g.40gb@4"
        ]
    );
    for ci in gpu["computeInstances"].as_array().unwrap() {
        assert!(ci["uuid"].as_str().unwrap().starts_with("MIG-"), "{ci}");
    }
    let text = String::from_utf8(node.gpu_share(&["status"], &[]).stdout).unwrap();
    assert!(text.contains("3g.40gb      at 4:4  CI 0 MIG-"), "{text}");
}

#[test]
fn processes_block_a_destroy_and_the_pids_are_named() {
    let node = Node::new(gpus("h100", 1, true));
    node.apply_ok("profiles/h100-balanced.yaml");
    // A CUDA process on the 3g.40gb instance, which h100-inference does not keep.
    let mut state = node.fake_state();
    let gi = state.gpus[0]
        .gpu_instances
        .iter()
        .find(|g| g.placement.start == 4)
        .unwrap()
        .id;
    state.gpus[0]
        .processes
        .push(Process::on_mig(4242, 2048, gi, 0));
    state.write_to(&node.state).unwrap();
    let before = node.mutations().len();

    let out = node.apply("profiles/h100-inference.yaml");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "GPU 0: destroy 3g.40gb at 4:4 (GI {gi}) is in use by PID 4242"
        )),
        "{stderr}"
    );
    assert_eq!(node.mutations().len(), before, "nothing may change");

    // --force skips our check; the driver still refuses while the process runs (IN_USE).
    let out = node.gpu_share(
        &[
            "apply",
            "--profile",
            "profiles/h100-inference.yaml",
            "--force",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("In use by another client"),
        "{}",
        text(&out)
    );
}

#[test]
fn ampere_mig_mode_waits_for_a_reset_then_resume_completes() {
    let node = Node::new(gpus("a100-40gb", 2, false));
    let out = node.apply("profiles/a100-40gb-mixed.yaml");
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("GPU 0: the MIG mode change is pending: reset the GPU"),
        "{stdout}"
    );
    assert_eq!(
        instance_count(&node.fake_state()),
        0,
        "no instance before the reset"
    );

    // The operator resets the GPUs (simulated), then resumes from the journal.
    let mut state = node.fake_state();
    state.gpus.iter_mut().for_each(Gpu::reset);
    state.write_to(&node.state).unwrap();
    let out = node.gpu_share(&["apply", "--resume"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    node.assert_matches("profiles/a100-40gb-mixed.yaml");
    assert!(!node.state_dir.join("apply-journal.json").exists());
}

/// Profiles for 8 × H100 80GB; every ordered pair is a transition.
const H100_PROFILES: &[&str] = &[
    "profiles/h100-inference.yaml",
    "profiles/h100-balanced.yaml",
    "profiles/a100-80gb-single.yaml",
    "profiles/exclusive.yaml",
    "profiles/homelab-timeslice.yaml",
];

#[test]
fn transitions_destroy_only_what_must_go() {
    let mut total_destroyed = 0;
    let mut total_baseline = 0;
    let mut transitions = 0;
    for from in H100_PROFILES {
        for to in H100_PROFILES.iter().filter(|t| *t != from) {
            let node = Node::new(gpus("h100", 8, true));
            node.apply_ok(from);
            let before = node.fake_state();
            let log_before = node.count("nvmlGpuInstanceDestroy");
            node.apply_ok(to);
            node.assert_matches(to);
            let destroyed = node.count("nvmlGpuInstanceDestroy") - log_before;
            // Destroy-everything baseline: every instance on every GPU whose layout changes
            // is destroyed and recreated (what a clear-and-recreate tool does).
            let after = node.fake_state();
            let baseline: usize = before
                .gpus
                .iter()
                .zip(&after.gpus)
                .filter(|(b, a)| layout(b) != layout(a))
                .map(|(b, _)| b.gpu_instances.len())
                .sum();
            let kept: usize = before
                .gpus
                .iter()
                .zip(&after.gpus)
                .map(|(b, a)| layout(b).intersection(&layout(a)).count())
                .sum();
            assert_eq!(
                destroyed + kept,
                instance_count(&before),
                "{from} → {to}: an instance was destroyed although the target keeps it in place"
            );
            assert!(destroyed <= baseline, "{from} → {to}");
            eprintln!("{from} → {to}: destroyed {destroyed}, destroy-everything {baseline}");
            total_destroyed += destroyed;
            total_baseline += baseline;
            transitions += 1;
        }
    }
    eprintln!("{transitions} transitions: destroyed {total_destroyed}, destroy-everything {total_baseline}");
    assert!(transitions >= 15);
    assert!(total_destroyed < total_baseline);
}

fn layout(gpu: &Gpu) -> std::collections::BTreeSet<(u32, u32, u32)> {
    gpu.gpu_instances
        .iter()
        .map(|g| (g.profile_id, g.placement.start, g.placement.size))
        .collect()
}

#[test]
fn a_crash_at_every_mutation_converges_on_the_next_run() {
    let (from, to) = (
        "profiles/h100-inference.yaml",
        "profiles/h100-balanced.yaml",
    );
    // A clean run to count the transition's mutations.
    let clean = Node::new(gpus("h100", 2, true));
    clean.apply_ok(from);
    let start = clean.fake_state();
    let before = clean.mutations().len();
    clean.apply_ok(to);
    let total = clean.mutations().len() - before;
    assert!(
        total > 10,
        "a transition worth crashing in: {total} mutations"
    );

    for k in 1..=total {
        let node = Node::new(vec![]);
        start.write_to(&node.state).unwrap();
        let out = node.gpu_share(
            &["apply", "--profile", to],
            &[("FAKE_NVML_ABORT_AT_MUTATION", k.to_string())],
        );
        assert!(
            !out.status.success(),
            "crash {k}: the run should have aborted"
        );
        assert_eq!(
            node.mutations().len(),
            k - 1,
            "crash {k}: mutations persisted before the abort"
        );
        assert!(
            node.state_dir.join("apply-journal.json").exists(),
            "crash {k}: journal left"
        );
        // The next run (the agent restarting, or the operator) finishes the job.
        let out = node.gpu_share(&["apply", "--resume"], &[]);
        assert!(out.status.success(), "crash {k}: {}", text(&out));
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("rolled forward an interrupted apply")
        );
        node.assert_matches(to);
        assert!(
            !node.state_dir.join("apply-journal.json").exists(),
            "crash {k}"
        );
    }
}

#[test]
fn an_nvml_error_mid_apply_is_reported_and_a_rerun_converges() {
    let node = Node::new(gpus("h100", 1, true));
    let out = node.gpu_share(
        &["apply", "--profile", "profiles/h100-balanced.yaml"],
        &[(
            "FAKE_NVML_FAIL",
            "nvmlDeviceCreateGpuInstanceWithPlacement:3:NVML_ERROR_UNKNOWN".into(),
        )],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("nvmlDeviceCreateGpuInstanceWithPlacement failed"),
        "{}",
        text(&out)
    );
    node.apply_ok("profiles/h100-balanced.yaml");
    node.assert_matches("profiles/h100-balanced.yaml");
}

#[test]
fn an_invalid_profile_changes_nothing() {
    let node = Node::new(gpus("a100-40gb", 1, true));
    let out = node.apply("tests/data/impossible.yaml");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("too many compute slices"));
    assert!(node.mutations().is_empty());
    assert!(
        !node.state_dir.exists(),
        "no journal for an apply that never started"
    );
}

#[test]
fn a_missing_library_says_which_layer_is_broken() {
    let node = Node::new(vec![]);
    let out = node.gpu_share(
        &["status", "--nvml-lib", "/nonexistent/libnvidia-ml.so.1"],
        &[],
    );
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("cannot load NVML from /nonexistent/libnvidia-ml.so.1"),
        "{stderr}"
    );
}
