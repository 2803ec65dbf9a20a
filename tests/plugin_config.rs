//! The NVIDIA device-plugin config: golden files for every example profile, the plugin's
//! refusals, writing only on change, and the SIGHUP reload of a real process.
//!
//! Regenerate the golden files after an intended change with
//! `UPDATE_GOLDEN=1 cargo test --test plugin_config`, and review the diff.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use gpu_share::nvidia_plugin::{reload, write_if_changed, SignalTarget};
use gpu_share::plan::{plan, ObservedNode};
use gpu_share::profile::read_profiles;
use nvidia_ml::{cdylib_path, Gpu, State};

/// Every example profile and the node it is rendered for (as in tests/cli.rs).
const EXAMPLES: &[(&str, &str)] = &[
    ("h100-inference", "h100x8"),
    ("h100-balanced", "h100x8"),
    ("a100-40gb-mixed", "a100-40gbx8"),
    ("a100-80gb-single", "a100-80gbx4"),
    ("h200-mig-timeslice", "h200x8"),
    ("h100-mps", "h100x4"),
    ("homelab-timeslice", "NVIDIA GeForce RTX 3090x2"),
    ("exclusive", "h100x2"),
];

fn rendered(profile: &str, gpus: &str) -> String {
    let file = format!("{}/profiles/{profile}.yaml", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&file).unwrap();
    let p = read_profiles(profile, &text).remove(0).profile.unwrap();
    let node = ObservedNode::simulated(&[gpus.to_string()]);
    let plan = plan(profile, &p, &node).unwrap_or_else(|e| panic!("{profile}: {e:?}"));
    plan.device_plugin_config
        .expect("the NVIDIA plugin's plan has its config")
        .to_file_text(profile)
}

#[test]
fn golden_configs_for_every_example_profile() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/device-plugin");
    let update = std::env::var_os("UPDATE_GOLDEN").is_some();
    for (profile, gpus) in EXAMPLES {
        let got = rendered(profile, gpus);
        let path = dir.join(format!("{profile}.yaml"));
        if update {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(&path, &got).unwrap();
        }
        let want = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (UPDATE_GOLDEN=1 creates it)", path.display()));
        assert_eq!(
            got,
            want,
            "{profile}: rendered config differs from {}",
            path.display()
        );
    }
}

#[test]
fn renders_what_the_plugin_reads() {
    // The MPS example: MPS needs flags.mpsRoot, and the plugin defaults failRequestsGreaterThanOne
    // to true for MPS itself, so we leave it unset.
    let text = rendered("h100-mps", "h100x4");
    let config: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
    assert_eq!(config["version"], "v1");
    assert_eq!(config["flags"]["migStrategy"], "none");
    assert_eq!(config["flags"]["mpsRoot"], "/run/nvidia/mps");
    let mps = &config["sharing"]["mps"];
    assert_eq!(mps["resources"][0]["name"], "nvidia.com/gpu");
    assert_eq!(mps["resources"][0]["replicas"], 8);
    assert!(mps.get("failRequestsGreaterThanOne").is_none());
    assert!(config["sharing"].get("timeSlicing").is_none());
    // Time-sliced MIG devices are replicated per profile resource under the mixed strategy.
    let text = rendered("h200-mig-timeslice", "h200x8");
    let config: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
    let names: Vec<(&str, u64)> = config["sharing"]["timeSlicing"]["resources"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|r| (r["name"].as_str().unwrap(), r["replicas"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        names,
        [
            ("nvidia.com/gpu", 4),
            ("nvidia.com/mig-2g.35gb", 2),
            ("nvidia.com/mig-3g.71gb", 2)
        ]
    );
}

#[test]
fn writes_only_when_the_content_changes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config/config.yaml");
    assert!(write_if_changed(&path, "a: 1\n").unwrap(), "first write");
    let modified = std::fs::metadata(&path).unwrap().modified().unwrap();
    assert!(
        !write_if_changed(&path, "a: 1\n").unwrap(),
        "same bytes: no write"
    );
    assert_eq!(
        std::fs::metadata(&path).unwrap().modified().unwrap(),
        modified
    );
    assert!(write_if_changed(&path, "a: 2\n").unwrap());
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "a: 2\n");
    let leftovers = std::fs::read_dir(path.parent().unwrap()).unwrap().count();
    assert_eq!(leftovers, 1, "no temp files left beside the config");
}

/// A real process that records each SIGHUP it receives, with its own name in argv[0] (tests run
/// in parallel, so each fake plugin gets a unique one).
struct FakePlugin {
    child: Child,
    name: String,
    hups: PathBuf,
    _dir: tempfile::TempDir,
}

static STARTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

impl FakePlugin {
    fn start() -> FakePlugin {
        let n = STARTED.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let name = format!("fake-device-plugin-{}-{n}", std::process::id());
        let dir = tempfile::tempdir().unwrap();
        let hups = dir.path().join("hups");
        let ready = dir.path().join("ready");
        let script = format!(
            "trap 'echo hup >> {h}' HUP; trap 'echo mark >> {h}' USR1; touch {r}; \
             while :; do sleep 0.02; done",
            h = hups.display(),
            r = ready.display()
        );
        let child = Command::new("bash")
            .arg("-c")
            .arg(format!("exec -a {name} bash -c \"{script}\""))
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        wait_for(|| ready.exists(), "the fake plugin to start");
        FakePlugin {
            child,
            name,
            hups,
            _dir: dir,
        }
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    fn hups(&self) -> usize {
        self.lines("hup")
    }

    fn lines(&self, what: &str) -> usize {
        std::fs::read_to_string(&self.hups)
            .map(|s| s.lines().filter(|l| *l == what).count())
            .unwrap_or(0)
    }

    /// Wait until the plugin has handled every signal sent to it so far: send it SIGUSR1 and
    /// wait for its mark. bash runs pending traps in signal-number order (SIGHUP 1 before
    /// SIGUSR1 10), so a SIGHUP sent before the mark is written down by the time the mark is.
    fn settle(&self) {
        let marks = self.lines("mark");
        let sent = Command::new("kill")
            .args(["-USR1", &self.pid().to_string()])
            .status()
            .unwrap();
        assert!(sent.success(), "kill -USR1 {}", self.pid());
        wait_for(|| self.lines("mark") > marks, "the fake plugin's mark");
    }
}

impl Drop for FakePlugin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn wait_for(cond: impl Fn() -> bool, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn sighup_reaches_the_plugin_by_pid_file_and_by_name() {
    let plugin = FakePlugin::start();
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("plugin.pid");
    std::fs::write(&pid_file, format!("{}\n", plugin.pid())).unwrap();
    assert_eq!(
        reload(&SignalTarget::PidFile(pid_file)).unwrap(),
        plugin.pid()
    );
    wait_for(|| plugin.hups() == 1, "the first SIGHUP");

    let by_name = SignalTarget::ProcessName {
        name: plugin.name.clone(),
        proc_root: "/proc".into(),
        pod_uid: None,
    };
    assert_eq!(reload(&by_name).unwrap(), plugin.pid());
    wait_for(|| plugin.hups() == 2, "the second SIGHUP");

    let missing = SignalTarget::ProcessName {
        name: "no-such-plugin".into(),
        proc_root: "/proc".into(),
        pod_uid: None,
    };
    let err = reload(&missing).unwrap_err().to_string();
    assert!(
        err.contains("no process named \"no-such-plugin\" under /proc"),
        "{err}"
    );
}

fn gpu_share(args: &[&str], state: &Path, state_dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gpu-share"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("GPU_SHARE_NVML_LIB", cdylib_path())
        .env("GPU_SHARE_STATE_DIR", state_dir)
        .env("FAKE_NVML_STATE", state)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap()
}

#[test]
fn apply_writes_the_config_and_reloads_once_and_an_unchanged_profile_sends_nothing() {
    let plugin = FakePlugin::start();
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("nvml.json");
    State::with_gpus([
        Gpu::mig("h100").mig_enabled(),
        Gpu::mig("h100").mig_enabled(),
    ])
    .write_to(&state)
    .unwrap();
    let config = dir.path().join("config.yaml");
    let pid_file = dir.path().join("plugin.pid");
    std::fs::write(&pid_file, plugin.pid().to_string()).unwrap();
    let args = |profile: &str| {
        vec![
            "apply".to_string(),
            "--profile".into(),
            profile.into(),
            "--plugin-config".into(),
            config.display().to_string(),
            "--plugin-pid-file".into(),
            pid_file.display().to_string(),
        ]
    };
    let run = |profile: &str| {
        let a = args(profile);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        let out = gpu_share(&a, &state, &dir.path().join("gs"));
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };

    let out = run("profiles/a100-80gb-single.yaml");
    assert!(
        out.contains(&format!(
            "device plugin (PID {}) signalled to reload",
            plugin.pid()
        )),
        "{out}"
    );
    wait_for(|| plugin.hups() == 1, "the reload");
    assert_eq!(
        std::fs::read_to_string(&config).unwrap(),
        rendered("a100-80gb-single", "h100x2")
    );

    let modified = std::fs::metadata(&config).unwrap().modified().unwrap();
    let out = run("profiles/a100-80gb-single.yaml");
    assert!(!out.contains("device-plugin config written"), "{out}");
    plugin.settle();
    assert_eq!(plugin.hups(), 1, "an unchanged profile sends no signal");
    assert_eq!(
        std::fs::metadata(&config).unwrap().modified().unwrap(),
        modified
    );

    // A different profile: new content, one more reload.
    run("profiles/h100-inference.yaml");
    wait_for(|| plugin.hups() == 2, "the second reload");

    // Fewer 1g.10gb instances: the same config bytes, but the plugin must re-enumerate the MIG
    // devices (NVIDIA DP#992), so it is signalled although the file is unchanged.
    std::fs::create_dir_all(dir.path().join("edited")).unwrap();
    let fewer = dir.path().join("edited/h100-inference.yaml");
    let text = std::fs::read_to_string("profiles/h100-inference.yaml")
        .unwrap()
        .replace("1g.10gb: 7", "1g.10gb: 5");
    std::fs::write(&fewer, text).unwrap();
    let before = std::fs::read_to_string(&config).unwrap();
    let out = run(fewer.to_str().unwrap());
    assert!(!out.contains("device-plugin config written"), "{out}");
    assert!(out.contains("signalled to reload"), "{out}");
    wait_for(|| plugin.hups() == 3, "the reload after a MIG-only change");
    assert_eq!(std::fs::read_to_string(&config).unwrap(), before);
}

/// `plan` of h100-inference on 8 × H100 against the plugin config in `config`: its stdout.
fn plan_against(config: &Path) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_gpu-share"))
        .args([
            "plan",
            "--profile",
            "profiles/h100-inference.yaml",
            "--gpu",
            "h100x8",
        ])
        .arg("--plugin-config")
        .arg(config)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn plan_shows_the_difference_from_the_current_file() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, rendered("h100-balanced", "h100x8")).unwrap();
    let text = plan_against(&config);
    assert!(text.contains(": would change"), "{text}");
    assert!(text.contains("+  timeSlicing:"), "{text}");
    assert!(
        text.contains(
            "-# NVIDIA device-plugin config written by gpu-share for profile \"h100-balanced\"."
        ),
        "{text}"
    );

    std::fs::write(&config, rendered("h100-inference", "h100x8")).unwrap();
    assert!(plan_against(&config).contains(": unchanged"));
}

#[test]
fn a_reload_that_failed_is_retried_by_the_next_apply_until_the_plugin_takes_it() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("nvml.json");
    State::with_gpus([Gpu::mig("h100").mig_enabled()])
        .write_to(&state)
        .unwrap();
    let (config, pid_file, state_dir) = (
        dir.path().join("config.yaml"),
        dir.path().join("plugin.pid"),
        dir.path().join("gs"),
    );
    let apply = || {
        let args = [
            "apply",
            "--profile",
            "profiles/a100-80gb-single.yaml",
            "--plugin-config",
            config.to_str().unwrap(),
            "--plugin-pid-file",
            pid_file.to_str().unwrap(),
        ];
        gpu_share(&args, &state, &state_dir)
    };
    let owed = state_dir.join("device-plugin-reload-owed");

    // The pid file names a plugin that is gone.
    let gone = FakePlugin::start().pid();
    std::fs::write(&pid_file, gone.to_string()).unwrap();
    for run in ["first", "second (the config is already up to date)"] {
        let out = apply();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{run} apply succeeded");
        assert!(
            stderr.contains(&format!("cannot signal the device plugin (PID {gone})")),
            "{run}: {stderr}"
        );
        assert!(owed.exists(), "{run}: the reload is not remembered");
    }
    assert_eq!(
        std::fs::read_to_string(&config).unwrap(),
        rendered("a100-80gb-single", "h100x1")
    );

    // The plugin is back: the next apply signals it once, and the one after sends nothing.
    let plugin = FakePlugin::start();
    std::fs::write(&pid_file, plugin.pid().to_string()).unwrap();
    let out = apply();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_for(|| plugin.hups() == 1, "the owed reload");
    assert!(!owed.exists());
    assert!(apply().status.success());
    plugin.settle();
    assert_eq!(plugin.hups(), 1, "nothing owed, nothing sent");
}
