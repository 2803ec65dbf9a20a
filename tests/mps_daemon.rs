//! The MPS daemon manager (`gpu_share::mps::daemon`) against the fake `nvidia-cuda-mps-control`
//! (tests/fake-mps-control). Each test has its own root in a temp dir, never /run.
//!
//! The fake is a binary of another workspace package: `cargo test --workspace` builds it into
//! `target/<profile>/` before any test runs (its own integration tests ask for it). A plain
//! `cargo test` of this package does not: run `cargo build -p fake-mps-control` first, or point
//! `FAKE_MPS_CONTROL_BIN` at it.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gpu_share::mps::daemon::{
    health, reconcile, specs_from_plan, DaemonSpec, MpsError, MpsGpu, MpsSettings, PID_FILE,
};
use gpu_share::plan::{plan, ObservedNode};
use gpu_share::profile::parse_profile;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tempfile::TempDir;

const RESOURCE: &str = "nvidia.com/gpu";

use fake_mps_control::{binary_path as fake_binary, BIN_NAME};

/// A root for daemons, and a wrapper named like the real binary that runs the fake with this
/// test's recording file and faults (env vars of the test process would leak between tests).
struct Node {
    dir: TempDir,
    settings: MpsSettings,
}

impl Node {
    fn new() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("mps")
            .tempdir()
            .expect("temp dir");
        let settings = MpsSettings {
            control_binary: dir.path().join("bin").join(BIN_NAME),
            root: dir.path().join("mps"),
            timeout: Duration::from_secs(5),
            ..MpsSettings::default()
        };
        let node = Node { dir, settings };
        node.set_faults(None);
        node
    }

    /// (Re)write the wrapper; `die_after` sets `FAKE_MPS_DIE_AFTER` for daemons started next.
    fn set_faults(&self, die_after: Option<u32>) {
        let bin = self.settings.control_binary.parent().unwrap();
        fs::create_dir_all(bin).unwrap();
        let die = die_after.map_or(String::new(), |n| {
            format!("export FAKE_MPS_DIE_AFTER={n}\n")
        });
        let script = format!(
            "#!/bin/sh\nexport FAKE_MPS_RECORD='{}'\nunset FAKE_MPS_DIE_AFTER\n{die}exec '{}' \"$@\"\n",
            self.record_file().display(),
            fake_binary().display()
        );
        let path = &self.settings.control_binary;
        let tmp = path.with_extension("tmp");
        fs::write(&tmp, script).unwrap();
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&tmp, fs::Permissions::from_mode(0o755)).unwrap();
        fs::rename(&tmp, path).unwrap();
    }

    fn record_file(&self) -> PathBuf {
        self.dir.path().join("commands")
    }

    /// Every command the daemons received so far.
    fn recorded(&self) -> Vec<String> {
        fs::read_to_string(self.record_file())
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    fn root(&self) -> &Path {
        &self.settings.root
    }

    fn pid(&self, resource: &str) -> Option<i32> {
        fs::read_to_string(self.settings.pipe_dir(resource).join(PID_FILE))
            .ok()
            .and_then(|s| s.trim().parse().ok())
    }

    fn control_log(&self, resource: &str) -> String {
        fs::read_to_string(self.settings.log_dir(resource).join("control.log")).unwrap_or_default()
    }
}

impl Drop for Node {
    /// Leave no daemon behind, whatever the test did.
    fn drop(&mut self) {
        for resource in [RESOURCE, "nvidia.com/gpu.shared", "example.com/other"] {
            if let Some(pid) = self.pid(resource) {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
    }
}

fn gpu(index: u32, pinned: Option<u64>) -> MpsGpu {
    MpsGpu {
        nvml_index: index,
        uuid: Some(format!("GPU-{index:08x}-0000-0000-0000-000000000000")),
        index_in_daemon: index,
        pinned_memory_limit_mib: pinned,
    }
}

fn spec(atp: Option<u32>, pinned: Option<u64>) -> DaemonSpec {
    DaemonSpec {
        resource: RESOURCE.into(),
        gpus: vec![gpu(0, pinned), gpu(1, pinned)],
        active_thread_percentage: atp,
    }
}

/// Alive and not a zombie (a killed daemon's parent, `-d`, is gone; nobody may reap it).
fn alive(pid: i32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, r)| !r.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

fn wait_dead(pid: i32) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while alive(pid) {
        assert!(Instant::now() < deadline, "pid {pid} still alive");
        std::thread::sleep(Duration::from_millis(20));
    }
}

const HEALTH: &str = "get_default_active_thread_percentage";

fn configure_commands(atp: u32, pinned: u64) -> Vec<String> {
    vec![
        format!("set_default_device_pinned_mem_limit 0 {pinned}M"),
        format!("set_default_device_pinned_mem_limit 1 {pinned}M"),
        format!("set_default_active_thread_percentage {atp}"),
        HEALTH.to_string(),
    ]
}

#[test]
fn starts_and_configures_a_daemon() {
    let node = Node::new();
    let report = reconcile(&node.settings, &[spec(Some(25), Some(20389))]).unwrap();
    assert_eq!(report.started, [RESOURCE]);
    assert!(report.restarted.is_empty() && report.stopped.is_empty());
    assert!(report.ready);

    assert_eq!(node.recorded(), configure_commands(25, 20389));
    let dir = node.root().join(RESOURCE);
    assert!(dir.join(".started").is_file());
    assert!(node.root().join(".ready").is_file());
    assert!(dir.join("pipe").join(PID_FILE).is_file());
    assert!(alive(node.pid(RESOURCE).unwrap()));
    // The daemon got the GPUs' UUIDs, in daemon order.
    let log = node.control_log(RESOURCE);
    assert!(
        log.contains(
            "CUDA_VISIBLE_DEVICES=GPU-00000000-0000-0000-0000-000000000000,GPU-00000001-0000-0000-0000-000000000000"
        ),
        "{log}"
    );
    assert!(log.contains(&format!(
        "set env CUDA_MPS_PIPE_DIRECTORY={}",
        dir.join("pipe").display()
    )));

    health(&node.settings, RESOURCE).unwrap();
    assert_eq!(node.recorded().last().unwrap(), HEALTH);
}

#[test]
fn reconcile_is_idempotent() {
    let node = Node::new();
    let wanted = [spec(Some(50), None)];
    reconcile(&node.settings, &wanted).unwrap();
    let pid = node.pid(RESOURCE).unwrap();
    let before = node.recorded();
    assert_eq!(
        before,
        ["set_default_active_thread_percentage 50", HEALTH],
        "only the settings the spec has"
    );

    for _ in 0..2 {
        let report = reconcile(&node.settings, &wanted).unwrap();
        assert!(report.is_unchanged(), "{report:?}");
        assert_eq!(report.unchanged, [RESOURCE]);
        assert!(report.ready);
    }
    assert_eq!(node.pid(RESOURCE), Some(pid), "same daemon");
    // Nothing but a health check each time.
    assert_eq!(node.recorded()[before.len()..], [HEALTH, HEALTH]);

    // A lost marker is put back without touching the daemon.
    fs::remove_file(node.root().join(RESOURCE).join(".started")).unwrap();
    let report = reconcile(&node.settings, &wanted).unwrap();
    assert!(report.is_unchanged());
    assert!(node.root().join(RESOURCE).join(".started").is_file());
}

#[test]
fn a_settings_change_restarts_the_daemon() {
    let node = Node::new();
    reconcile(&node.settings, &[spec(Some(25), Some(1024))]).unwrap();
    let old = node.pid(RESOURCE).unwrap();
    let before = node.recorded().len();

    let report = reconcile(&node.settings, &[spec(Some(50), Some(2048))]).unwrap();
    assert!(report.started.is_empty());
    assert_eq!(report.restarted.len(), 1);
    let reason = &report.restarted[0].reason;
    assert!(
        reason.contains("active thread percentage 25 → 50")
            && reason.contains("pinned memory limits 1024M,1024M → 2048M,2048M"),
        "{reason}"
    );
    assert!(report.ready);
    wait_dead(old);
    let new = node.pid(RESOURCE).unwrap();
    assert_ne!(old, new);
    assert!(alive(new));
    let mut expected = vec![HEALTH.to_string(), "quit".to_string()];
    expected.extend(configure_commands(50, 2048));
    assert_eq!(node.recorded()[before..], expected);

    // A different GPU set restarts it too (CUDA_VISIBLE_DEVICES changes).
    let mut one_gpu = spec(Some(50), Some(2048));
    one_gpu.gpus.truncate(1);
    let report = reconcile(&node.settings, &[one_gpu]).unwrap();
    assert!(
        report.restarted[0].reason.contains("GPUs GPU-00000000"),
        "{report:?}"
    );
}

#[test]
fn a_killed_daemon_is_restarted() {
    let node = Node::new();
    let wanted = [spec(Some(25), Some(4096))];
    reconcile(&node.settings, &wanted).unwrap();
    let pid = node.pid(RESOURCE).unwrap();
    kill(Pid::from_raw(pid), Signal::SIGKILL).unwrap();
    wait_dead(pid);
    assert!(health(&node.settings, RESOURCE).is_err());
    let before = node.recorded().len();

    let report = reconcile(&node.settings, &wanted).unwrap();
    assert_eq!(report.restarted.len(), 1, "{report:?}");
    assert!(
        report.restarted[0]
            .reason
            .contains(&format!("(pid {pid}) is not running")),
        "{report:?}"
    );
    assert!(report.ready);
    let new = node.pid(RESOURCE).unwrap();
    assert_ne!(new, pid);
    assert!(alive(new));
    // The dead daemon got nothing; the new one its settings.
    assert_eq!(node.recorded()[before..], configure_commands(25, 4096));
    health(&node.settings, RESOURCE).unwrap();
}

#[test]
fn a_crash_during_configuration_fails_then_recovers() {
    let node = Node::new();
    let wanted = [spec(Some(25), Some(4096))];
    // The daemon answers its first command, then dies.
    node.set_faults(Some(1));
    let err = reconcile(&node.settings, &wanted).unwrap_err();
    let text = err.to_string();
    let pipe = node.settings.pipe_dir(RESOURCE);
    assert!(text.contains("MPS resource \"nvidia.com/gpu\""), "{text}");
    assert!(text.contains(&pipe.display().to_string()), "{text}");
    assert!(
        text.contains("`set_default_device_pinned_mem_limit 1 4096M` failed"),
        "{text}"
    );
    assert!(
        text.contains("Cannot find MPS control daemon process"),
        "{text}"
    );
    let MpsError::Incomplete { report, errors } = err else {
        panic!("{text}")
    };
    assert_eq!(errors.len(), 1);
    assert!(!report.ready);
    assert!(!node.root().join(".ready").exists());
    assert!(!node.root().join(RESOURCE).join(".started").exists());

    // The crash left its pid file and socket; the next reconcile cleans up and starts over.
    node.set_faults(None);
    let report = reconcile(&node.settings, &wanted).unwrap();
    assert_eq!(report.restarted.len(), 1, "{report:?}");
    assert!(report.ready);
    assert!(node.root().join(".ready").is_file());
    assert_eq!(
        node.recorded(),
        [
            "set_default_device_pinned_mem_limit 0 4096M".to_string(),
            "set_default_device_pinned_mem_limit 0 4096M".to_string(),
            "set_default_device_pinned_mem_limit 1 4096M".to_string(),
            "set_default_active_thread_percentage 25".to_string(),
            HEALTH.to_string(),
        ]
    );
}

#[test]
fn a_daemon_that_dies_later_is_restarted() {
    let node = Node::new();
    let wanted = [spec(None, Some(512))];
    // Configuration takes 3 commands (2 limits, the read-back); the next one kills it.
    node.set_faults(Some(4));
    reconcile(&node.settings, &wanted).unwrap();
    let pid = node.pid(RESOURCE).unwrap();
    node.set_faults(None);
    assert!(
        health(&node.settings, RESOURCE).is_ok(),
        "the 4th command is answered"
    );
    wait_dead(pid);
    let report = reconcile(&node.settings, &wanted).unwrap();
    assert_eq!(report.restarted.len(), 1, "{report:?}");
    assert!(alive(node.pid(RESOURCE).unwrap()));
}

#[test]
fn no_longer_wanted_daemons_are_quit_and_removed() {
    let node = Node::new();
    let other = DaemonSpec {
        resource: "example.com/other".into(),
        gpus: vec![gpu(0, None)],
        active_thread_percentage: Some(10),
    };
    reconcile(&node.settings, &[spec(Some(25), None), other.clone()]).unwrap();
    let gpu_pid = node.pid(RESOURCE).unwrap();
    let other_pid = node.pid("example.com/other").unwrap();
    assert!(node.root().join(".ready").is_file());

    // One goes: only it is quit, and .ready is written again once the rest is up.
    let report = reconcile(&node.settings, std::slice::from_ref(&other)).unwrap();
    assert_eq!(report.stopped, [RESOURCE]);
    assert_eq!(report.unchanged, ["example.com/other"]);
    assert!(report.ready);
    wait_dead(gpu_pid);
    assert!(alive(other_pid));
    assert!(
        !node.root().join("nvidia.com").exists(),
        "directory removed"
    );
    assert!(node.root().join(".ready").is_file());
    assert!(node.recorded().contains(&"quit".to_string()));

    // The profile asks for no MPS at all.
    let before = node.recorded().len();
    let report = reconcile(&node.settings, &[]).unwrap();
    assert_eq!(report.stopped, ["example.com/other"]);
    assert!(!report.ready);
    wait_dead(other_pid);
    assert_eq!(node.recorded()[before..], [HEALTH, "quit"]);
    assert!(!node.root().join(".ready").exists());
    assert!(!node.root().join("example.com").exists());

    // And again: nothing left to do.
    let report = reconcile(&node.settings, &[]).unwrap();
    assert!(report.is_unchanged() && report.unchanged.is_empty());
}

#[test]
fn a_stale_directory_of_a_dead_daemon_is_cleaned_up() {
    let node = Node::new();
    reconcile(&node.settings, &[spec(Some(25), None)]).unwrap();
    let pid = node.pid(RESOURCE).unwrap();
    kill(Pid::from_raw(pid), Signal::SIGKILL).unwrap();
    wait_dead(pid);
    let report = reconcile(&node.settings, &[]).unwrap();
    assert_eq!(report.stopped, [RESOURCE]);
    assert!(!node.root().join(RESOURCE).exists());
}

#[test]
fn a_daemon_started_by_someone_else_is_taken_over() {
    let node = Node::new();
    let pipe = node.settings.pipe_dir(RESOURCE);
    fs::create_dir_all(&pipe).unwrap();
    let out = std::process::Command::new(&node.settings.control_binary)
        .arg("-d")
        .env("CUDA_MPS_PIPE_DIRECTORY", &pipe)
        .env("CUDA_MPS_LOG_DIRECTORY", node.settings.log_dir(RESOURCE))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let foreign = node.pid(RESOURCE).unwrap();

    let report = reconcile(&node.settings, &[spec(Some(25), None)]).unwrap();
    assert_eq!(report.restarted.len(), 1, "{report:?}");
    assert!(
        report.restarted[0]
            .reason
            .contains("without a record of its settings"),
        "{report:?}"
    );
    wait_dead(foreign);
    assert_ne!(node.pid(RESOURCE), Some(foreign));
}

#[test]
fn a_missing_control_binary_is_named() {
    let mut node = Node::new();
    node.settings.control_binary = node.dir.path().join("nowhere").join(BIN_NAME);
    let text = reconcile(&node.settings, &[spec(Some(25), None)])
        .unwrap_err()
        .to_string();
    assert!(text.contains("nvidia.com/gpu"), "{text}");
    assert!(
        text.contains("nowhere/nvidia-cuda-mps-control -d` failed"),
        "{text}"
    );
    assert!(!node.root().join(".ready").exists());
    let text = health(&node.settings, RESOURCE).unwrap_err().to_string();
    assert!(text.contains(HEALTH), "{text}");
}

#[test]
fn plan_to_running_daemon() {
    let node = Node::new();
    let mut observed = ObservedNode::simulated(&["h100x2".into()]);
    for g in &mut observed.gpus {
        g.uuid = Some(format!("GPU-{}", g.index));
    }
    let profile = parse_profile(
        "mps",
        "version: v1\nrules:\n  - devices: all\n    mps: {replicas: 4, activeThreadPercentage: 25, pinnedMemoryLimit: auto}\n",
    )
    .unwrap();
    let planned = plan("mps", &profile, &observed).unwrap();
    let specs = specs_from_plan(&planned.gpus, planned.mig_strategy, &observed).unwrap();
    let report = reconcile(&node.settings, &specs).unwrap();
    assert_eq!(report.started, [RESOURCE]);
    let limit = observed.gpus[0].memory_mib.unwrap() / 4;
    assert_eq!(node.recorded(), configure_commands(25, limit));
    assert!(node
        .control_log(RESOURCE)
        .contains("CUDA_VISIBLE_DEVICES=GPU-0,GPU-1"));
}

#[test]
fn a_daemon_that_stops_answering_is_killed_and_replaced() {
    let node = Node::new();
    let wanted = [spec(Some(25), None)];
    reconcile(&node.settings, &wanted).unwrap();
    let pid = node.pid(RESOURCE).unwrap();
    // Alive, but nothing reaches it any more.
    fs::remove_file(node.settings.pipe_dir(RESOURCE).join("control")).unwrap();

    let report = reconcile(&node.settings, &wanted).unwrap();
    assert_eq!(report.restarted.len(), 1, "{report:?}");
    let reason = &report.restarted[0].reason;
    assert!(
        reason.contains(&format!("(pid {pid}) did not answer"))
            && reason.contains("Cannot find MPS control daemon process"),
        "{reason}"
    );
    wait_dead(pid);
    let new = node.pid(RESOURCE).unwrap();
    assert_ne!(new, pid);
    health(&node.settings, RESOURCE).unwrap();
}

#[test]
fn a_missing_client_binary_leaves_a_running_daemon_alone() {
    let mut node = Node::new();
    let wanted = [spec(Some(25), None)];
    reconcile(&node.settings, &wanted).unwrap();
    let pid = node.pid(RESOURCE).unwrap();
    let good = node.settings.control_binary.clone();

    node.settings.control_binary = node.dir.path().join("gone").join(BIN_NAME);
    let text = reconcile(&node.settings, &wanted).unwrap_err().to_string();
    assert!(text.contains("cannot run"), "{text}");
    assert!(alive(pid), "the daemon was not touched");
    assert!(!node.root().join(".ready").exists());

    node.settings.control_binary = good;
    let report = reconcile(&node.settings, &wanted).unwrap();
    assert_eq!(report.unchanged, [RESOURCE]);
    assert!(report.ready);
    assert_eq!(node.pid(RESOURCE), Some(pid));
}
