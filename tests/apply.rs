//! `gpu-share apply` and `status` on one node, run as a user runs them, against the fake
//! `libnvidia-ml.so` (tests/fake-nvml): every example profile on every model it fits,
//! transitions between profiles (counting instances destroyed), processes blocking a destroy,
//! an Ampere MIG-mode change that waits for a reset, and a crash at every mutation of a
//! transition followed by a rerun that converges with nothing orphaned.

use node_sim::{
    assert_no_orphans, crash_at_every_mutation, gpus, instance_count, layout, mps_pid_files,
    profile_path, text, CliNode,
};
use nvidia_ml::{Gpu, Process};

/// `apply -o json` of example profile `name` with `extra` arguments; the report, after checking
/// it succeeded.
fn apply_report(node: &CliNode, name: &str, extra: &[&str]) -> serde_json::Value {
    let profile = profile_path(name);
    let mut args = vec!["apply", "--profile", &profile, "-o", "json"];
    args.extend(extra);
    let out = node.gpu_share(&args, &[]);
    assert!(out.status.success(), "apply {name}: {}", text(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Apply like an operator would on any GPU family: when the driver leaves a MIG mode change
/// pending (Ampere), reset those GPUs (simulated) and resume.
fn apply_with_resets(node: &CliNode, name: &str) {
    let out = node.apply(name);
    if out.status.code() == Some(3) {
        let mut state = node.fake_state();
        for gpu in &mut state.gpus {
            if gpu.mig.is_some_and(|m| m.current != m.pending) {
                gpu.reset();
            }
        }
        node.set_fake_state(&state);
        let out = node.gpu_share(&["apply", "--resume"], &[]);
        assert!(out.status.success(), "resume {name}: {}", text(&out));
    } else {
        assert!(out.status.success(), "apply {name}: {}", text(&out));
    }
}

/// `status -o json`.
fn status_json(node: &CliNode) -> String {
    let out = node.gpu_share(&["status", "-o", "json"], &[]);
    assert!(out.status.success(), "status: {}", text(&out));
    String::from_utf8(out.stdout).unwrap()
}

/// The node matches example profile `name`: `plan --current <status>` wants no MIG step
/// anywhere, and nothing is orphaned (every GPU instance has its compute instance).
fn assert_matches(node: &CliNode, name: &str) {
    let profile = profile_path(name);
    let current = node.state.with_extension("status.json");
    std::fs::write(&current, status_json(node)).unwrap();
    let out = node.gpu_share(
        &[
            "plan",
            "--profile",
            &profile,
            "--current",
            current.to_str().unwrap(),
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
    assert_no_orphans(&node.fake_state(), &profile);
}

/// Example profiles and the catalog models (8 GPUs each) they are applied on.
const EXAMPLES: &[(&str, &[&str])] = &[
    (
        "h100-inference",
        &["h100-80gb-sxm", "h100-pcie", "a100-80gb"],
    ),
    ("h100-balanced", &["h100-80gb-sxm"]),
    ("a100-40gb-mixed", &["a100-sxm4-40gb"]),
    (
        "a100-80gb-single",
        &["a100-80gb", "h100-80gb-sxm", "h100-pcie"],
    ),
    ("h200-mig-timeslice", &["h200-141gb"]),
    ("h100-mps", &["h100-80gb-sxm"]),
    ("exclusive", &["h100-80gb-sxm", "a30-24gb"]),
];

#[test]
fn every_example_profile_applies_on_every_model_it_fits_and_twice_changes_nothing() {
    for (profile, models) in EXAMPLES {
        for model in *models {
            let node = CliNode::new(gpus(model, 8, true));
            apply_with_resets(&node, profile);
            assert_matches(&node, profile);
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
    let node = CliNode::new(gpus("h100", 2, false));
    let report = apply_report(&node, "h100-mps", &[]);
    assert_eq!(
        report["mps"]["started"],
        serde_json::json!(["nvidia.com/gpu"])
    );
    assert_eq!(mps_pid_files(&node.mps_root()).len(), 1);
    let ready = std::fs::read_to_string(node.mps_root().join(".ready")).unwrap();
    assert!(
        ready.contains("\"replicas\":8"),
        "NVIDIA's wait compares sharing.mps: {ready}"
    );

    let report = apply_report(&node, "exclusive", &[]);
    assert_eq!(
        report["mps"]["stopped"],
        serde_json::json!(["nvidia.com/gpu"])
    );
    assert!(mps_pid_files(&node.mps_root()).is_empty());
}

#[test]
fn mps_inside_mig_devices_gets_one_daemon_per_device() {
    let node = CliNode::new(gpus("h100", 2, false));
    let profile = "builtin/h100-mps-in-mig";
    let builtin = ["--plugin", "builtin"];
    let report = apply_report(&node, profile, &builtin);
    let status: serde_json::Value = serde_json::from_str(&status_json(&node)).unwrap();
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
    let mps = node.mps_root();
    assert_eq!(mps_pid_files(&mps).len(), 4);
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
    let again = apply_report(&node, profile, &builtin);
    assert_eq!(again["mps"]["unchanged"].as_array().unwrap().len(), 4);
    assert!(again["mps"]["started"].as_array().unwrap().is_empty());
    let report = apply_report(&node, "exclusive", &[]);
    assert_eq!(report["mps"]["stopped"].as_array().unwrap().len(), 4);
    assert!(mps_pid_files(&mps).is_empty());
}

#[test]
fn a_home_lab_gpu_without_mig_is_left_alone() {
    let node = CliNode::new(vec![Gpu::non_mig("NVIDIA GeForce RTX 3090", 24576)]);
    let out = node.apply_ok("homelab-timeslice");
    assert!(out.contains("0 steps"), "{out}");
    assert!(node.mutations().is_empty());
}

#[test]
fn status_shows_instances_placements_uuids_and_processes() {
    let node = CliNode::new(gpus("h100", 1, true));
    node.apply_ok("h100-balanced");
    let status: serde_json::Value = serde_json::from_str(&status_json(&node)).unwrap();
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
    let node = CliNode::new(gpus("h100", 1, true));
    node.apply_ok("h100-balanced");
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
    node.set_fake_state(&state);
    let before = node.mutations().len();

    let out = node.apply("h100-inference");
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
    let node = CliNode::new(gpus("a100-40gb", 2, false));
    let out = node.apply("a100-40gb-mixed");
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
    node.set_fake_state(&state);
    let out = node.gpu_share(&["apply", "--resume"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    assert_matches(&node, "a100-40gb-mixed");
    assert!(!node.journal().exists());
}

#[test]
fn transitions_destroy_only_what_must_go() {
    let mut total_destroyed = 0;
    let mut total_baseline = 0;
    let mut transitions = 0;
    for (from, to) in node_sim::transitions() {
        let node = CliNode::new(gpus("h100", 8, true));
        node.apply_ok(from);
        let before = node.fake_state();
        let log_before = node.count("nvmlGpuInstanceDestroy");
        node.apply_ok(to);
        assert_matches(&node, to);
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
    eprintln!("{transitions} transitions: destroyed {total_destroyed}, destroy-everything {total_baseline}");
    assert!(transitions >= 15);
    assert!(total_destroyed < total_baseline);
}

#[test]
fn a_crash_at_every_mutation_converges_on_the_next_run() {
    let to = "h100-balanced";
    let total = crash_at_every_mutation("h100-inference", to, 2, |node, resumed, what| {
        // The next run (the agent restarting, or the operator) finishes the job.
        assert!(
            String::from_utf8_lossy(&resumed.stdout)
                .contains("rolled forward an interrupted apply"),
            "{what}: {}",
            text(resumed)
        );
        assert_matches(node, to);
    });
    assert!(
        total > 10,
        "a transition worth crashing in: {total} mutations"
    );
}

#[test]
fn an_nvml_error_mid_apply_is_reported_and_a_rerun_converges() {
    let node = CliNode::new(gpus("h100", 1, true));
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
    node.apply_ok("h100-balanced");
    assert_matches(&node, "h100-balanced");
}

#[test]
fn an_invalid_profile_changes_nothing() {
    let node = CliNode::new(gpus("a100-40gb", 1, true));
    let out = node.gpu_share(&["apply", "--profile", "tests/data/impossible.yaml"], &[]);
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
    let node = CliNode::new(vec![]);
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

/// How many times `cause` is in the run's stderr: an error's message says its cause, and the
/// chain printed after it (`error: {e:#}`) must not say it again.
fn times_in_stderr(out: &std::process::Output, cause: &str) -> usize {
    String::from_utf8_lossy(&out.stderr).matches(cause).count()
}

#[test]
fn a_missing_library_is_named_once() {
    let node = CliNode::new(vec![]);
    let out = node.gpu_share(
        &["status", "--nvml-lib", "/nonexistent/libnvidia-ml.so.1"],
        &[],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert_eq!(
        times_in_stderr(&out, "cannot open shared object file"),
        1,
        "{}",
        text(&out)
    );
    assert_eq!(
        times_in_stderr(&out, "libloading"),
        0,
        "nvml-wrapper's wording is noise: {}",
        text(&out)
    );
}

#[test]
fn an_nvml_error_is_said_once() {
    let node = CliNode::new(gpus("h100", 1, true));
    node.apply_ok("h100-balanced");
    // h100-inference destroys h100-balanced's instances: its first compute-instance destroy
    // is refused with IN_USE (19), as the driver does while a process holds it.
    let out = node.gpu_share(
        &["apply", "--profile", &profile_path("h100-inference")],
        &[(
            "FAKE_NVML_FAIL",
            "nvmlComputeInstanceDestroy:1:NVML_ERROR_IN_USE".into(),
        )],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert_eq!(
        times_in_stderr(&out, "nvmlComputeInstanceDestroy failed"),
        1,
        "{}",
        text(&out)
    );
    assert_eq!(
        times_in_stderr(&out, "(NVML error 19)"),
        1,
        "{}",
        text(&out)
    );
}

#[test]
fn a_missing_file_is_said_once() {
    let node = CliNode::new(gpus("h100", 1, true));
    let config = node.state_dir.with_file_name("plugin-config.yaml");
    let out = node.gpu_share(
        &[
            "apply",
            "--profile",
            &profile_path("h100-balanced"),
            "--plugin-config",
            config.to_str().unwrap(),
            "--plugin-pid-file",
            "/nonexistent/nvidia-device-plugin.pid",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("/nonexistent/nvidia-device-plugin.pid"),
        "{}",
        text(&out)
    );
    assert_eq!(
        times_in_stderr(&out, "No such file or directory"),
        1,
        "{}",
        text(&out)
    );
}

/// `apply` says which rule's GPUs this node lacks, as `plan` does.
#[test]
fn apply_warns_about_rules_naming_gpus_the_node_lacks() {
    let node = CliNode::new(gpus("h100", 2, true));
    let out = node.apply_ok("h100-inference");
    assert!(
        out.contains("warning: profile \"h100-inference\", rule 2 \"time-sliced\" (devices [4, 5, 6, 7]): selects GPU 4-7, which this node does not have (it has GPU 0-1)"),
        "{out}"
    );
    let report = apply_report(&node, "h100-inference", &[]);
    let warnings = report["plan"]["warnings"].to_string();
    assert!(warnings.contains("selects GPU 4-7"), "{warnings}");
}

/// A failed `apply --force` leaves its journal; the next apply of another
/// profile used to print "rolled forward an interrupted apply" of the failed one, though none
/// of it was carried out. It says what became of it, and what of it had been done.
#[test]
fn a_new_profile_supersedes_an_interrupted_apply_and_says_so() {
    for (fail_at, done) in [
        (1, "none of its 7 steps had been done"),
        (
            3,
            "2 of its 7 steps had been done (GPU 0: create 1g.10gb at 0:1; GPU 0: create 1g.10gb at 1:1)",
        ),
    ] {
        let node = CliNode::new(gpus("h100", 1, true));
        let out = node.gpu_share(
            &["apply", "--force", "--profile", &profile_path("h100-inference")],
            &[(
                "FAKE_NVML_FAIL",
                format!("nvmlDeviceCreateGpuInstanceWithPlacement:{fail_at}:NVML_ERROR_UNKNOWN"),
            )],
        );
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));
        assert!(node.journal().exists(), "the failed apply leaves its journal");

        let out = node.apply_ok("h100-balanced");
        assert!(!out.contains("rolled forward"), "{out}");
        let said = format!("an interrupted apply of profile \"h100-inference\" was superseded by profile \"h100-balanced\": {done}; the GPUs went from where it left them to \"h100-balanced\"");
        assert!(out.contains(&said), "{said}\nnot in\n{out}");
        assert_matches(&node, "h100-balanced");
        assert!(!node.journal().exists());
    }
}

#[test]
fn resuming_the_same_profile_rolls_it_forward_and_says_what_was_done() {
    let node = CliNode::new(gpus("h100", 1, true));
    let out = node.gpu_share(
        &["apply", "--profile", &profile_path("h100-inference")],
        &[(
            "FAKE_NVML_FAIL",
            "nvmlDeviceCreateGpuInstanceWithPlacement:2:NVML_ERROR_UNKNOWN".into(),
        )],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let out = node.gpu_share(&["apply", "--resume", "-o", "json"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let interrupted = &report["interrupted"];
    assert_eq!(interrupted["profile"], "h100-inference");
    assert_eq!(interrupted["outcome"], "rolledForward");
    assert_eq!(interrupted["stepsPlanned"], 7);
    assert_eq!(
        interrupted["stepsDone"].as_array().map(Vec::len),
        Some(1),
        "{interrupted}"
    );
    assert_matches(&node, "h100-inference");
}
