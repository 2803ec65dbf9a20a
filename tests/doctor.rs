//! `gpu-share doctor` run as a user runs it, against fixture trees (`--root`) holding
//! `/proc/driver/nvidia/version`, device nodes, containerd's config, CDI specs and live kubelet
//! sockets, with the fake `libnvidia-ml.so` (tests/fake-nvml) as NVML: one test per layer that
//! can fail, a healthy node and a Jetson.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use nvidia_ml::{cdylib_path, Gpu, State};
use serde_json::Value;

const PLUGINS: &str = "var/lib/kubelet/device-plugins";
const POD_RESOURCES: &str = "var/lib/kubelet/pod-resources/kubelet.sock";

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/doctor")
        .join(name)
}

fn profile(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(name)
        .display()
        .to_string()
}

/// A profile with MIG on every GPU.
fn mig_everywhere() -> String {
    profile("tests/data/doctor/mig-everywhere.yaml")
}

/// A node as files under a temporary root, plus the fake NVML's state.
struct Node {
    dir: tempfile::TempDir,
    /// Listeners behind the sockets, kept open so the sockets are live.
    listeners: Vec<UnixListener>,
}

impl Node {
    /// Nothing at all: no driver, no containerd, no kubelet.
    fn bare() -> Node {
        let node = Node {
            dir: tempfile::tempdir().unwrap(),
            listeners: Vec::new(),
        };
        std::fs::create_dir_all(node.root()).unwrap();
        node
    }

    /// Everything in order for these GPUs: driver 580.65.06 (module and NVML), their device
    /// nodes, containerd with the NVIDIA runtime as default, the kubelet (device-plugin
    /// registration and PodResources) and a plugin serving `sockets`.
    fn healthy(gpus: Vec<Gpu>, sockets: &[&str]) -> Node {
        let mut node = Node::bare();
        node.copy("proc-version-580", "proc/driver/nvidia/version");
        node.file("dev/nvidiactl", "");
        node.file("dev/nvidia-uvm", "");
        for i in 0..gpus.len() {
            node.file(&format!("dev/nvidia{i}"), "");
        }
        node.copy("containerd-v3-nvidia.toml", "etc/containerd/config.toml");
        node.executable("usr/bin/nvidia-container-runtime");
        node.listen(&format!("{PLUGINS}/kubelet.sock"));
        node.listen(POD_RESOURCES);
        for s in sockets {
            node.listen(&format!("{PLUGINS}/{s}"));
        }
        node.nvml(State::with_gpus(gpus));
        node
    }

    /// Driver `version` (built `built`) in the kernel module and NVML, with CUDA `cuda` (NVML's
    /// encoding, 12020 = 12.2), on `gpus`.
    fn driver(&self, version: &str, built: &str, cuda: i32, gpus: Vec<Gpu>) {
        self.file(
            "proc/driver/nvidia/version",
            &format!("NVRM version: NVIDIA UNIX x86_64 Kernel Module  {version}  {built}\n"),
        );
        let mut state = State::with_gpus(gpus);
        state.driver_version = version.into();
        state.cuda_version = cuda;
        self.nvml(state);
    }

    fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    fn state_file(&self) -> PathBuf {
        self.dir.path().join("nvml-state.json")
    }

    fn nvml(&self, state: State) {
        state.write_to(self.state_file()).unwrap();
    }

    fn file(&self, rel: &str, content: &str) {
        let p = self.root().join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, content).unwrap();
    }

    fn copy(&self, fixture: &str, rel: &str) {
        self.file(rel, &std::fs::read_to_string(data(fixture)).unwrap());
    }

    fn executable(&self, rel: &str) {
        self.file(rel, "#!/bin/sh\n");
        let p = self.root().join(rel);
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    fn remove(&self, rel: &str) {
        std::fs::remove_file(self.root().join(rel)).unwrap();
    }

    fn listen(&mut self, rel: &str) {
        let p = self.root().join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        self.listeners.push(UnixListener::bind(p).unwrap());
    }

    /// `gpu-share doctor --host-root <root> <args>` with the fake NVML.
    fn doctor_with(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_gpu-share"));
        cmd.arg("doctor")
            .arg("--host-root")
            .arg(self.root())
            .args(args)
            .env("GPU_SHARE_NVML_LIB", cdylib_path())
            .env("FAKE_NVML_STATE", self.state_file())
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("RUST_LOG", "warn");
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.output().expect("run gpu-share doctor")
    }

    /// The JSON report and the exit code.
    fn doctor(&self, args: &[&str]) -> (Report, i32) {
        self.doctor_env(args, &[])
    }

    /// The JSON report of a run that must fail (exit 1) at `layer`: every layer before it did
    /// not fail, every layer after it was skipped.
    fn fails_at(&self, layer: &str, args: &[&str]) -> Report {
        self.fails_at_env(layer, args, &[])
    }

    fn fails_at_env(&self, layer: &str, args: &[&str], env: &[(&str, &str)]) -> Report {
        let (r, code) = self.doctor_env(args, env);
        assert_eq!(code, 1, "{}", r.0);
        r.assert_failed_at(layer);
        r
    }

    fn doctor_env(&self, args: &[&str], env: &[(&str, &str)]) -> (Report, i32) {
        let mut all = vec!["-o", "json"];
        all.extend_from_slice(args);
        let out = self.doctor_with(&all, env);
        let json: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", text(&out)));
        (Report(json), out.status.code().unwrap())
    }
}

fn text(out: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

struct Report(Value);

impl Report {
    fn check(&self, name: &str) -> &Value {
        self.0["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("no check {name}: {}", self.0))
    }

    fn status(&self, name: &str) -> &str {
        self.check(name)["status"].as_str().unwrap()
    }

    /// Found, details and fixes of a check, as one string to search.
    fn said(&self, name: &str) -> String {
        self.check(name).to_string()
    }

    fn statuses(&self) -> Vec<(String, String)> {
        self.0["checks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                (
                    c["name"].as_str().unwrap().to_string(),
                    c["status"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    }

    /// `name` failed, everything before it is not a failure and everything after is skipped.
    fn assert_failed_at(&self, name: &str) {
        assert_eq!(self.0["status"], "fail", "{}", self.0);
        assert_eq!(self.0["failedAt"], name, "{}", self.0);
        let mut after = false;
        for (n, s) in self.statuses() {
            if n == name {
                assert_eq!(s, "fail", "{}", self.0);
                after = true;
            } else if after {
                assert_eq!(s, "skip", "{n} after {name}: {}", self.0);
            } else {
                assert_ne!(s, "fail", "{n} before {name}: {}", self.0);
            }
        }
    }
}

fn h100x2() -> Vec<Gpu> {
    vec![Gpu::mig("h100"), Gpu::mig("h100")]
}

#[test]
fn healthy_node_passes_every_layer() {
    // GPU 0 already holds the profile's seven 1g.10gb instances; GPU 1 is time-sliced.
    let mut gpu0 = Gpu::mig("h100").mig_enabled();
    for _ in 0..7 {
        let gi = gpu0.create_gpu_instance(19, None).unwrap();
        gpu0.create_compute_instance(gi, 0).unwrap();
    }
    let node = Node::healthy(
        vec![gpu0, Gpu::mig("h100")],
        &["nvidia-gpu.sock", "nvidia-mig-1g.10gb.sock"],
    );
    let args = [
        "--profile",
        &profile("tests/data/doctor/mig-and-timeslice.yaml"),
        "--cuda",
        "12.4",
    ];
    let (r, code) = node.doctor(&args);
    assert_eq!(code, 0, "{}", r.0);
    for (name, status) in r.statuses() {
        let want = if name == "allocatable" { "skip" } else { "ok" };
        assert_eq!(status, want, "{name}: {}", r.0);
    }
    assert!(r.said("driver").contains("580.65.06 (open)"), "{}", r.0);
    assert!(r.said("nvml").contains("2 GPUs readable"), "{}", r.0);
    assert!(r.said("device-plugin").contains("nvidia-mig-1g.10gb.sock"));
    // The allocatable check is said to be skipped, never passed.
    assert!(r.said("allocatable").contains("not checked"));
    // and why, truly: gpu-share has a Kubernetes client (the agent's); doctor does not use it.
    assert!(
        r.said("allocatable")
            .contains("doctor reads only this node"),
        "{}",
        r.said("allocatable")
    );
    assert!(r.said("cuda").contains("Corresponding Driver Versions"));

    // Text: one line per check, status first.
    let out = node.doctor_with(&args, &[]);
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8(out.stdout).unwrap();
    for name in [
        "driver",
        "nvml",
        "profile",
        "container-runtime",
        "device-plugin",
        "cuda",
    ] {
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with("ok") && l.contains(name)),
            "{name}:\n{stdout}"
        );
    }
    assert!(stdout.lines().any(|l| l.starts_with("skip  allocatable")));
}

#[test]
fn no_driver_fails_at_the_driver_and_checks_nothing_above() {
    let node = Node::bare();
    node.nvml(State::with_gpus(h100x2()));
    let r = node.fails_at("driver", &[]);
    assert!(
        r.said("driver").contains("no NVIDIA kernel module"),
        "{}",
        r.0
    );
    assert!(r.said("driver").contains("modprobe nvidia"));
}

#[test]
fn missing_device_nodes_fail_the_driver_layer() {
    let node = Node::healthy(h100x2(), &["nvidia-gpu.sock"]);
    node.remove("dev/nvidiactl");
    let r = node.fails_at("driver", &[]);
    assert!(r.said("driver").contains("nvidiactl"), "{}", r.0);
}

#[test]
fn driver_library_mismatch_fails_at_nvml() {
    let node = Node::healthy(h100x2(), &["nvidia-gpu.sock"]);
    let mut state = State::with_gpus(h100x2());
    state.driver_version = "575.57.08".into();
    node.nvml(state);
    let r = node.fails_at("nvml", &[]);
    let said = r.said("nvml");
    assert!(said.contains("Driver/library version mismatch"), "{said}");
    assert!(
        said.contains("580.65.06") && said.contains("575.57.08"),
        "{said}"
    );
    assert!(said.contains("reboot"), "{said}");
}

#[test]
fn missing_nvml_fails_at_nvml() {
    let node = Node::healthy(h100x2(), &["nvidia-gpu.sock"]);
    let r = node.fails_at_env(
        "nvml",
        &[],
        &[("GPU_SHARE_NVML_LIB", "/nonexistent/libnvidia-ml.so.1")],
    );
    let said = r.said("nvml");
    assert!(said.contains("NVML library not found"), "{said}");
    assert!(said.contains("libnvidia-compute-580"), "{said}");
}

#[test]
fn mig_profile_on_a_gpu_without_mig_fails_at_profile() {
    let node = Node::healthy(
        vec![Gpu::non_mig("NVIDIA GeForce RTX 3090", 24576)],
        &["nvidia-gpu.sock"],
    );
    let r = node.fails_at("profile", &["--profile", &mig_everywhere()]);
    let said = r.said("profile");
    assert!(
        said.contains("is not in the MIG catalog, so it is taken as a GPU without MIG"),
        "{said}"
    );
    assert!(
        said.contains("cannot do MIG: give it timeSlicing or mps"),
        "{said}"
    );
}

#[test]
fn a_driver_too_old_for_mig_on_the_model_fails_at_profile() {
    let node = Node::healthy(h100x2(), &["nvidia-mig-1g.10gb.sock"]);
    node.driver("520.61.05", "Thu Sep 29 05:30:25 UTC 2022", 11080, h100x2());
    let r = node.fails_at("profile", &["--profile", &mig_everywhere()]);
    let said = r.said("profile");
    assert!(said.contains("needs driver ≥ 525.85.12"), "{said}");
    assert!(said.contains("this node runs 520.61.05"), "{said}");
}

#[test]
fn mps_without_its_control_daemon_fails_at_profile() {
    let node = Node::healthy(h100x2(), &["nvidia-gpu.sock"]);
    let mps = profile("profiles/h100-mps.yaml");
    let r = node.fails_at("profile", &["--profile", &mps]);
    let said = r.said("profile");
    assert!(
        said.contains("nvidia-cuda-mps-control is not found on PATH"),
        "{said}"
    );

    // Present but not executable.
    node.file("usr/bin/nvidia-cuda-mps-control", "");
    let (r, _) = node.doctor(&["--profile", &mps]);
    assert_eq!(r.status("profile"), "fail");
    assert!(r.said("profile").contains("not executable"), "{}", r.0);

    // Executable: the layer passes and names it.
    node.executable("usr/bin/nvidia-cuda-mps-control");
    let (r, code) = node.doctor(&["--profile", &mps]);
    assert_eq!(code, 0, "{}", r.0);
    assert_eq!(r.status("profile"), "ok", "{}", r.0);
    assert!(r
        .said("profile")
        .contains("usr/bin/nvidia-cuda-mps-control"));
}

#[test]
fn containerd_without_the_nvidia_runtime_fails_at_container_runtime() {
    let node = Node::healthy(h100x2(), &["nvidia-gpu.sock"]);
    node.copy("containerd-v2-runc.toml", "etc/containerd/config.toml");
    let r = node.fails_at("container-runtime", &[]);
    let said = r.said("container-runtime");
    assert!(
        said.contains("no NVIDIA runtime (runtimes: runc)"),
        "{said}"
    );
    assert!(
        said.contains("nvidia-ctk runtime configure --runtime=containerd"),
        "{said}"
    );

    // With a CDI spec for nvidia.com/gpu it is a warning, not a failure.
    node.copy("cdi-nvidia.yaml", "var/run/cdi/nvidia.yaml");
    let (r, code) = node.doctor(&[]);
    assert_eq!(code, 0, "{}", r.0);
    assert_eq!(r.status("container-runtime"), "warn");
    assert!(r
        .said("container-runtime")
        .contains("nvidia.com/gpu: 0, all"));
}

#[test]
fn a_runtime_in_a_drop_in_counts_only_when_imported() {
    let node = Node::healthy(h100x2(), &["nvidia-gpu.sock"]);
    node.copy("containerd-v2-runc.toml", "etc/containerd/config.toml");
    node.copy(
        "conf.d-99-nvidia.toml",
        "etc/containerd/conf.d/99-nvidia.toml",
    );
    let r = node.fails_at("container-runtime", &[]);
    assert!(r.said("container-runtime").contains("imports"), "{}", r.0);

    node.copy("containerd-v2-imports.toml", "etc/containerd/config.toml");
    let (r, code) = node.doctor(&[]);
    assert_eq!(code, 0, "{}", r.0);
    assert_eq!(r.status("container-runtime"), "ok", "{}", r.0);
    assert!(r
        .said("container-runtime")
        .contains("default runtime: nvidia"));
}

#[test]
fn no_plugin_socket_fails_at_device_plugin() {
    let node = Node::healthy(h100x2(), &[]);
    let r = node.fails_at("device-plugin", &[]);
    assert!(
        r.said("device-plugin").contains("no NVIDIA device plugin"),
        "{}",
        r.0
    );
    // The allocatable check still says why it is not done.
    assert!(r.said("allocatable").contains("API server"));

    // With a profile, the missing resource's socket is named.
    let mut node = Node::healthy(h100x2(), &["nvidia-gpu.sock"]);
    node.listen(&format!("{PLUGINS}/unrelated.sock"));
    let mixed = profile("tests/data/doctor/mig-and-timeslice.yaml");
    let r = node.fails_at("device-plugin", &["--profile", &mixed]);
    let said = r.said("device-plugin");
    assert!(
        said.contains("nvidia-mig-1g.10gb.sock is missing"),
        "{said}"
    );
    // The GPUs don't match the profile yet: a warning at the profile layer.
    assert_eq!(r.status("profile"), "warn");
    assert!(r.said("profile").contains("gpu-share apply --profile"));
}

#[test]
fn a_cuda_too_new_for_the_driver_fails_at_cuda() {
    let node = Node::healthy(h100x2(), &["nvidia-gpu.sock"]);
    node.driver(
        "535.104.05",
        "Sat Aug 19 01:15:15 UTC 2023",
        12020,
        h100x2(),
    );

    let r = node.fails_at("cuda", &["--cuda", "13.0"]);
    let said = r.said("cuda");
    assert!(said.contains("needs driver ≥ 580.65.06"), "{said}");
    assert!(said.contains("CUDA Toolkit release notes"), "{said}");

    // Same major release: minor version compatibility, a warning.
    let (r, code) = node.doctor(&["--cuda", "12.4"]);
    assert_eq!(code, 0, "{}", r.0);
    assert_eq!(r.status("cuda"), "warn");
    assert!(r.said("cuda").contains("minor version compatibility"));

    // Older CUDA on a newer driver is fine.
    let (r, _) = node.doctor(&["--cuda", "11.8"]);
    assert_eq!(r.status("cuda"), "ok", "{}", r.0);

    // A malformed version is a usage error.
    let out = node.doctor_with(&["--cuda", "twelve"], &[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
}

#[test]
fn jetson_is_recognised_and_nvml_is_skipped_with_a_warning() {
    let mut node = Node::bare();
    node.copy("nv_tegra_release", "etc/nv_tegra_release");
    node.file(
        "proc/device-tree/compatible",
        "nvidia,p3768-0000+p3767-0005\0nvidia,p3767-0005\0nvidia,tegra234\0",
    );
    node.file(
        "proc/device-tree/model",
        "NVIDIA Jetson Orin Nano Developer Kit\0",
    );
    node.copy("containerd-v3-nvidia.toml", "etc/containerd/config.toml");
    node.executable("usr/bin/nvidia-container-runtime");
    node.listen(&format!("{PLUGINS}/kubelet.sock"));
    node.listen(POD_RESOURCES);
    node.listen(&format!("{PLUGINS}/nvidia-gpu.sock"));
    // No NVML at all: the doctor must not need it.
    let env = [("GPU_SHARE_NVML_LIB", "/nonexistent/libnvidia-ml.so.1")];
    let ts = profile("tests/data/doctor/timeslice-all.yaml");
    let (r, code) = node.doctor_env(&["--profile", &ts, "--cuda", "12.6"], &env);
    assert_eq!(code, 0, "{}", r.0);
    let driver = r.said("driver");
    assert_eq!(r.status("driver"), "ok");
    assert!(driver.contains("Jetson/Tegra integrated GPU"), "{driver}");
    assert!(
        driver.contains("L4T R36.4.0") && driver.contains("nvidia,tegra234"),
        "{driver}"
    );
    assert!(driver.contains("time-slicing only"), "{driver}");
    assert_eq!(r.status("nvml"), "warn", "{}", r.0);
    assert_eq!(r.status("profile"), "ok", "{}", r.0);
    assert_eq!(r.status("container-runtime"), "ok");
    assert_eq!(r.status("device-plugin"), "ok");
    assert_eq!(r.status("cuda"), "skip");

    // MIG or MPS cannot be had on a Jetson.
    node.fails_at_env("profile", &["--profile", &mig_everywhere()], &env);
    let (r, _) = node.doctor_env(&["--profile", &profile("profiles/h100-mps.yaml")], &env);
    assert_eq!(r.status("profile"), "fail", "{}", r.0);
}

#[test]
fn an_unreadable_profile_is_a_usage_error() {
    let node = Node::healthy(h100x2(), &["nvidia-gpu.sock"]);
    let out = node.doctor_with(&["--profile", "/nonexistent/profile.yaml"], &[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
}

#[test]
fn mps_inside_mig_needs_the_control_daemon_and_is_checked_against_the_driver() {
    let node = Node::healthy(h100x2(), &[]);
    let mps_in_mig = profile("profiles/builtin/h100-mps-in-mig.yaml");
    let args = ["--profile", mps_in_mig.as_str(), "--plugin", "builtin"];
    let r = node.fails_at("profile", &args);
    assert!(
        r.said("profile")
            .contains("the profile runs MPS on GPU 0, 1, but the MPS control daemon"),
        "{}",
        r.0
    );

    // With the control daemon, the healthy node's driver (R5xx) is new enough.
    node.executable("usr/bin/nvidia-cuda-mps-control");
    let (r, _) = node.doctor(&args);
    assert_ne!(r.status("profile"), "fail", "{}", r.0);
    assert!(
        r.said("profile")
            .contains("MPS inside MIG devices (GPU 0, 1): driver"),
        "{}",
        r.0
    );

    // An R460 driver (MIG-capable on A100, older than the R470 commonly cited for MPS on MIG):
    // a warning, not a failure, since NVIDIA states no minimum.
    node.driver(
        "460.106.00",
        "Tue Sep 28 12:05:58 UTC 2021",
        11020,
        vec![Gpu::mig("a100-80gb"); 2],
    );
    let a100 = node.root().join("a100-mps-in-mig.yaml");
    std::fs::write(
        &a100,
        "version: v1\nrules:\n  - devices: all\n    mig: {3g.40gb: 2}\n    mps: {replicas: 4}\n",
    )
    .unwrap();
    let a100 = a100.display().to_string();
    let (r, _) = node.doctor(&["--profile", &a100, "--plugin", "builtin"]);
    assert_eq!(r.status("profile"), "warn", "{}", r.0);
    assert!(
        r.said("profile")
            .contains("older than R470, the branch commonly cited for MPS on MIG"),
        "{}",
        r.0
    );
}

#[test]
fn the_builtin_plugin_plans_what_nvidia_refuses_and_needs_kubelet_sock_and_the_mps_tmpfs() {
    // Only the kubelet: the agent serves the built-in plugin's sockets once it runs.
    let mut node = Node::healthy(vec![Gpu::mig("h100"); 6], &[]);
    node.executable("usr/bin/nvidia-cuda-mps-control");
    let mixed = profile("profiles/builtin/h100-mixed-sharing.yaml");

    // MIG, time-slicing and MPS side by side: the NVIDIA plugin cannot advertise that.
    let r = node.fails_at("profile", &["--profile", &mixed]);
    assert!(
        r.said("profile")
            .contains("the NVIDIA device plugin refuses MPS on a node with MIG devices"),
        "{}",
        r.0
    );

    // The built-in plugin plans it. MIG is not applied yet (a warning naming the apply for this
    // plugin), its sockets are not served yet, and no mount table says where the MPS tmpfs is.
    let (r, code) = node.doctor(&["--profile", &mixed, "--plugin", "builtin"]);
    assert_eq!(code, 0, "{}", r.0);
    assert_eq!(r.status("profile"), "warn", "{}", r.0);
    assert!(
        r.said("profile").contains("gpu-share apply --profile ")
            && r.said("profile").contains(" --plugin builtin`"),
        "{}",
        r.0
    );
    assert_eq!(r.status("device-plugin"), "warn", "{}", r.0);
    let said = r.said("device-plugin");
    assert!(said.contains("kubelet.sock listening"), "{said}");
    assert!(
        said.contains("built-in plugin (served by the agent)"),
        "{said}"
    );
    assert!(!said.contains("no NVIDIA device plugin"), "{said}");
    assert!(
        said.contains("nvidia-gpu.sock is missing: the agent serves it"),
        "{said}"
    );
    assert!(
        said.contains("nvidia-mig-1g.10gb.sock is missing"),
        "{said}"
    );
    assert!(
        said.contains("cannot read") && said.contains("proc/self/mountinfo"),
        "{said}"
    );

    // The pod's GPU_SHARE_PLUGIN picks it too; a mount table without the tmpfs.
    node.file(
        "proc/self/mountinfo",
        "25 1 0:23 / /run rw,nosuid,nodev,noexec,relatime - tmpfs tmpfs rw,size=3274040k\n",
    );
    let (r, code) = node.doctor_env(&["--profile", &mixed], &[("GPU_SHARE_PLUGIN", "builtin")]);
    assert_eq!(code, 0, "{}", r.0);
    let said = r.said("device-plugin");
    let shm = node.root().join("run/nvidia/mps/shm");
    assert!(
        said.contains(&format!("{} is not a mount point", shm.display())),
        "{said}"
    );
    assert!(
        said.contains("gpu-share mps mount-shm --mps-root ")
            && said.contains("deploy/overlays/builtin"),
        "{said}"
    );

    // Everything served, the tmpfs mounted: the layer is ok and says so.
    node.file(
        "proc/self/mountinfo",
        &format!(
            "31 25 0:45 / {} rw,nosuid,nodev,noexec,relatime - tmpfs shm rw,size=16370200k\n",
            shm.display()
        ),
    );
    for s in ["nvidia-gpu.sock", "nvidia-mig-1g.10gb.sock"] {
        node.listen(&format!("{PLUGINS}/{s}"));
    }
    let (r, code) = node.doctor(&["--profile", &mixed, "--plugin", "builtin"]);
    assert_eq!(code, 0, "{}", r.0);
    assert_eq!(r.status("device-plugin"), "ok", "{}", r.0);
    let said = r.said("device-plugin");
    assert!(
        said.contains(&format!("{} is a tmpfs", shm.display())),
        "{said}"
    );
    assert!(
        said.contains("listening: nvidia-gpu.sock, nvidia-mig-1g.10gb.sock"),
        "{said}"
    );

    // A MIG-only profile needs no MPS tmpfs: it is not looked at.
    node.file("proc/self/mountinfo", "");
    let mig = mig_everywhere();
    let (r, _) = node.doctor(&["--profile", &mig, "--plugin", "builtin"]);
    assert!(!r.said("device-plugin").contains("shm"), "{}", r.0);
}

#[test]
fn the_builtin_plugin_without_the_kubelet_fails_at_device_plugin() {
    let node = Node::healthy(h100x2(), &[]);
    node.remove(&format!("{PLUGINS}/kubelet.sock"));
    let r = node.fails_at("device-plugin", &["--plugin", "builtin"]);
    assert!(
        r.said("device-plugin")
            .contains("kubelet.sock does not exist"),
        "{}",
        r.0
    );

    // Without a profile, the kubelet alone is enough: no plugin socket is asked for yet.
    let node = Node::healthy(h100x2(), &[]);
    let (r, code) = node.doctor(&["--plugin", "builtin"]);
    assert_eq!(code, 0, "{}", r.0);
    assert_eq!(r.status("device-plugin"), "ok", "{}", r.0);
    // The NVIDIA plugin, by contrast, must have registered.
    node.fails_at("device-plugin", &[]);
}

#[test]
fn a_kubelet_without_its_pod_resources_socket_is_a_warning_at_device_plugin() {
    let node = Node::healthy(h100x2(), &["nvidia-gpu.sock"]);
    node.remove(POD_RESOURCES);
    let (r, code) = node.doctor(&[]);
    assert_eq!(code, 0, "a warning, not a failure: {}", r.0);
    assert_eq!(r.status("device-plugin"), "warn", "{}", r.0);
    let said = r.said("device-plugin");
    assert!(
        said.contains("PodResources API")
            && said.contains("pod-resources/kubelet.sock) is missing"),
        "{said}"
    );
    assert!(said.contains("--pod-resources-socket"), "{said}");
    // The same with the built-in plugin.
    let (r, _) = node.doctor(&["--plugin", "builtin"]);
    assert_eq!(r.status("device-plugin"), "warn", "{}", r.0);
}

/// The kubelet's plugin registry, where gpu-share's DRA kubelet plugin registers
/// (`<driver>-reg.sock`, as k8s.io/dynamic-resource-allocation's helper names it).
const REGISTRY: &str = "var/lib/kubelet/plugins_registry";
const OUR_REGISTRATION: &str = "gpu.gpu-share.dev-reg.sock";

/// `--plugin dra`: the agent's DRA plugin registered with the kubelet, and no device plugin for
/// the same GPUs: a node cannot run both (the kubelet keeps extended resources and DRA claims
/// apart, so one GPU would go to two pods).
#[test]
fn dra_mode_warns_when_a_device_plugin_serves_the_same_gpus() {
    let mut node = Node::healthy(h100x2(), &["nvidia-gpu.sock"]);
    node.listen(&format!("{REGISTRY}/{OUR_REGISTRATION}"));
    let (r, code) = node.doctor(&["--plugin", "dra"]);
    assert_eq!(code, 0, "a warning, not a failure: {}", r.0);
    assert_eq!(r.status("device-plugin"), "warn", "{}", r.0);
    let said = r.said("device-plugin");
    assert!(
        said.contains("a node cannot run DRA and a device plugin for the same GPUs")
            && said.contains("nvidia-gpu.sock"),
        "{said}"
    );
    assert!(said.contains("devicePlugin.enabled=false"), "{said}");
    assert!(
        said.contains("gpu.gpu-share.dev registered in ") && said.contains(OUR_REGISTRATION),
        "{said}"
    );

    // Only the DRA plugin (a device plugin's stale socket file is a leftover, not a plugin).
    let mut node = Node::healthy(h100x2(), &[]);
    node.file(&format!("{PLUGINS}/nvidia-gpu.sock"), "");
    node.listen(&format!("{REGISTRY}/{OUR_REGISTRATION}"));
    let (r, code) = node.doctor(&["--plugin", "dra"]);
    assert_eq!(code, 0, "{}", r.0);
    assert_eq!(r.status("device-plugin"), "ok", "{}", r.0);

    // NVIDIA's DRA driver on the same node publishes the same GPUs too.
    node.listen(&format!("{REGISTRY}/gpu.nvidia.com-reg.sock"));
    let (r, _) = node.doctor(&["--plugin", "dra"]);
    assert_eq!(r.status("device-plugin"), "warn", "{}", r.0);
    assert!(
        r.said("device-plugin")
            .contains("NVIDIA's DRA driver is registered too"),
        "{}",
        r.0
    );
}

/// `--plugin dra` before the agent registered: a warning naming what registers it; with no
/// plugin registry at all, no kubelet registers DRA plugins here: a failure.
#[test]
fn dra_mode_reports_the_agents_registration_and_needs_the_plugin_registry() {
    let node = Node::healthy(h100x2(), &[]);
    node.file(&format!("{REGISTRY}/{OUR_REGISTRATION}"), "");
    let (r, code) = node.doctor(&["--plugin", "dra"]);
    assert_eq!(code, 0, "{}", r.0);
    assert_eq!(r.status("device-plugin"), "warn", "{}", r.0);
    let said = r.said("device-plugin");
    assert!(
        said.contains("no live registration socket of gpu.gpu-share.dev")
            && said.contains("once it runs with --plugin dra")
            && said.contains("is not a socket"),
        "{said}"
    );
    let node = Node::healthy(h100x2(), &[]);
    let r = node.fails_at("device-plugin", &["--plugin", "dra"]);
    let said = r.said("device-plugin");
    assert!(
        said.contains("plugins_registry does not exist") && said.contains("--dra-registration-dir"),
        "{said}"
    );
}

/// With a device plugin (nvidia or builtin), gpu-share's DRA plugin registered on the same node
/// is a warning; without it the same node is fine.
#[test]
fn a_device_plugin_node_warns_when_gpu_shares_dra_plugin_is_registered() {
    let mut node = Node::healthy(h100x2(), &["nvidia-gpu.sock"]);
    let (r, code) = node.doctor(&[]);
    assert_eq!((code, r.status("device-plugin")), (0, "ok"), "{}", r.0);
    node.listen(&format!("{REGISTRY}/{OUR_REGISTRATION}"));
    for args in [&[][..], &["--plugin", "builtin"][..]] {
        let (r, code) = node.doctor(args);
        assert_eq!(code, 0, "a warning, not a failure: {}", r.0);
        assert_eq!(r.status("device-plugin"), "warn", "{args:?}: {}", r.0);
        let said = r.said("device-plugin");
        assert!(
            said.contains("gpu-share's DRA plugin is registered with the kubelet")
                && said.contains(OUR_REGISTRATION)
                && said.contains("a node cannot run DRA and a device plugin for the same GPUs"),
            "{said}"
        );
    }
    // Its registry found where --dra-registration-dir says.
    let (r, _) = node.doctor(&["--dra-registration-dir", "/nonexistent"]);
    assert_eq!(r.status("device-plugin"), "ok", "{}", r.0);
}

/// A k3s node: containerd's config is the one k3s generates under /var/lib/rancher (found
/// without --containerd-config), with the `nvidia` runtime k3s added but runc the default.
/// The fixes name k3s's own ways (`--default-runtime nvidia`, a restart), never an edit of the
/// file k3s rewrites at every start.
#[test]
fn a_k3s_node_is_read_where_k3s_keeps_containerd_and_told_k3s_fixes() {
    const K3S_CONFIG: &str = "var/lib/rancher/k3s/agent/etc/containerd/config.toml";
    let node = Node::healthy(h100x2(), &["nvidia-gpu.sock"]);
    node.remove("etc/containerd/config.toml");
    node.copy("containerd-k3s-nvidia.toml", K3S_CONFIG);
    let (r, code) = node.doctor(&[]);
    assert_eq!(code, 0, "{}", r.0);
    assert_eq!(r.status("container-runtime"), "warn", "{}", r.0);
    let said = r.said("container-runtime");
    assert!(
        said.contains("rancher/k3s") && said.contains("nvidia →"),
        "{said}"
    );
    assert!(said.contains("--default-runtime nvidia"), "{said}");
    assert!(!said.contains("nvidia-ctk runtime configure"), "{said}");

    // k3s started before the toolkit was installed: no `nvidia` runtime in its config.
    node.file(
        K3S_CONFIG,
        "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n  \
         runtime_type = \"io.containerd.runc.v2\"\n",
    );
    let r = node.fails_at("container-runtime", &[]);
    let said = r.said("container-runtime");
    assert!(
        said.contains("restart k3s") && said.contains("config.toml.tmpl"),
        "{said}"
    );
    assert!(!said.contains("nvidia-ctk runtime configure"), "{said}");
}

/// Tegra files that disagree (a release file where the SoC family is not Tegra): the driver
/// layer fails naming both files, as the agent's reconcile does (src/gpu/tegra.rs).
#[test]
fn contradictory_tegra_files_fail_the_driver_layer_naming_them() {
    let node = Node::bare();
    node.copy("nv_tegra_release", "etc/nv_tegra_release");
    node.file("sys/devices/soc0/family", "jep106:0426\n");
    let env = [("GPU_SHARE_NVML_LIB", "/nonexistent/libnvidia-ml.so.1")];
    let r = node.fails_at_env("driver", &[], &env);
    let said = r.said("driver");
    assert!(
        said.contains("nv_tegra_release")
            && said.contains("soc0/family")
            && said.contains("jep106"),
        "{said}"
    );
    assert!(
        said.contains("/etc/nv_tegra_release, /sys/devices/soc0/family"),
        "{said}"
    );
}
