//! A simulated GPU node, shared by the whole-process figures (`benches/agent_figures.rs`) and the
//! reliability suite (`tests/reliability.rs`, which includes this file with `#[path]`).
//!
//! - [`CliNode`]: `gpu-share apply` / `status` run as processes against the fake
//!   `libnvidia-ml.so` (tests/fake-nvml), as `tests/apply.rs` does.
//! - [`AgentNode`]: the `gpu-share agent` process against the Kubernetes API double
//!   (tests/kube-double) and the fake NVML, with a simulated kubelet for GPU processes: each
//!   simulated pod owns NVML processes (a fixture `/proc/<pid>/cgroup` names its pod UID), and
//!   when the pod is deleted its processes leave the fake NVML state, as `tests/agent.rs` does.
//!
//! The `gpu-share` binary is `CARGO_BIN_EXE_gpu-share` of whoever includes this file: the debug
//! build under `cargo test`, the bench-profile (release) build under `cargo bench`.

#![allow(dead_code)] // each includer uses a different part

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gpu_share::plan::{plan, steps, ObservedNode, Step};
use gpu_share::profile::parse_profile;
use kube_double::{fixtures, EvictionOutcome, KubeDouble, Verb};
use nvidia_ml::{cdylib_path, read_log, Gpu, LogEntry, Process, State};

pub const NS: &str = "gpu-share";
pub const CM: &str = "gpu-share-profiles";
pub const PROFILE_LABEL: &str = "gpu-share.dev/profile";
pub const STATE_LABEL: &str = "gpu-share.dev/profile.state";
pub const REASON: &str = "gpu-share.dev/profile.reason";
pub const APPLIED_HASH: &str = "gpu-share.dev/profile.applied-hash";
pub const CORDONED: &str = "gpu-share.dev/cordoned";

/// Profiles for 8 × H100 80GB; every ordered pair is a transition of the transition suite
/// (the same list as `tests/apply.rs`).
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

pub fn gpu_share_bin() -> &'static str {
    env!("CARGO_BIN_EXE_gpu-share")
}

pub fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// `profiles/<name>.yaml`, relative to the repository (the CLI runs there).
pub fn profile_path(name: &str) -> String {
    format!("profiles/{name}.yaml")
}

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

/// The fake `nvidia-cuda-mps-control`, when it has been built (`cargo test --workspace` builds
/// it; `cargo bench` does not, and the figures need no MPS).
pub fn mps_control() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("FAKE_MPS_CONTROL_BIN") {
        return Some(PathBuf::from(p));
    }
    let exe = std::env::current_exe().ok()?;
    exe.ancestors()
        .skip(1)
        .take(3)
        .map(|d| d.join("nvidia-cuda-mps-control"))
        .find(|p| p.is_file())
}

/// `n` H100s, MIG on or off.
pub fn h100s(n: usize, mig_on: bool) -> Vec<Gpu> {
    (0..n)
        .map(|_| {
            let g = Gpu::mig("h100");
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
    let out = Command::new(gpu_share_bin())
        .args(["status", "-o", "json"])
        .env("GPU_SHARE_NVML_LIB", cdylib_path())
        .env("FAKE_NVML_STATE", nvml_state)
        .env_remove("FAKE_NVML_LOG")
        .env("RUST_LOG", "warn")
        .output()
        .expect("run gpu-share status");
    assert!(out.status.success(), "status: {}", text(&out));
    serde_json::from_slice(&out.stdout).expect("status JSON is an observed node")
}

/// The node matches profile `name`: no MIG step left, nothing orphaned.
pub fn matches(name: &str, nvml_state: &Path) -> bool {
    let state = State::read_from(nvml_state).unwrap();
    orphans(&state).is_empty() && pending_steps(name, &observe(nvml_state)).is_empty()
}

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

// -------------------------------------------------------------------------------------------
// `gpu-share apply` as a process
// -------------------------------------------------------------------------------------------

/// One simulated node for the CLI: a fake-NVML state file, its mutation log, gpu-share's state
/// dir and MPS root.
pub struct CliNode {
    pub dir: tempfile::TempDir,
    pub state: PathBuf,
    pub log: PathBuf,
    pub state_dir: PathBuf,
}

impl CliNode {
    pub fn new(gpus: Vec<Gpu>) -> CliNode {
        Self::with_state(State::with_gpus(gpus))
    }

    pub fn with_state(state: State) -> CliNode {
        let dir = tempfile::tempdir().unwrap();
        let node = CliNode {
            state: dir.path().join("nvml-state.json"),
            log: dir.path().join("nvml.log"),
            state_dir: dir.path().join("gpu-share"),
            dir,
        };
        state.write_to(&node.state).unwrap();
        node
    }

    pub fn gpu_share(&self, args: &[&str], env: &[(&str, String)]) -> Output {
        let mut cmd = Command::new(gpu_share_bin());
        cmd.args(args)
            .current_dir(repo())
            .env("GPU_SHARE_NVML_LIB", cdylib_path())
            .env("GPU_SHARE_STATE_DIR", &self.state_dir)
            .env("FAKE_NVML_STATE", &self.state)
            .env("FAKE_NVML_LOG", &self.log)
            .env("GPU_SHARE_MPS_ROOT", self.dir.path().join("mps"))
            .env("RUST_LOG", "warn");
        if let Some(mps) = mps_control() {
            cmd.env("GPU_SHARE_MPS_CONTROL", mps);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.output().expect("run gpu-share")
    }

    /// `apply --profile profiles/<name>.yaml`.
    pub fn apply(&self, name: &str) -> Output {
        self.gpu_share(&["apply", "--profile", &profile_path(name)], &[])
    }

    pub fn apply_ok(&self, name: &str) {
        let out = self.apply(name);
        assert!(out.status.success(), "apply {name}: {}", text(&out));
    }

    pub fn fake_state(&self) -> State {
        State::read_from(&self.state).unwrap()
    }

    pub fn mutations(&self) -> Vec<LogEntry> {
        successful_mutations(&self.log)
    }

    pub fn journal(&self) -> PathBuf {
        self.state_dir.join("apply-journal.json")
    }

    /// Panics unless the node matches profile `name` with nothing orphaned.
    pub fn assert_matches(&self, name: &str, what: &str) {
        assert_no_orphans(&self.fake_state(), what);
        let left = pending_steps(name, &observe(&self.state));
        assert!(left.is_empty(), "{what}: {name} still needs {left:?}");
    }
}

impl Drop for CliNode {
    fn drop(&mut self) {
        kill_mps_daemons(&self.dir.path().join("mps"));
    }
}

/// MPS daemons a node started die with it (a failed assertion must not leak processes).
pub fn kill_mps_daemons(root: &Path) {
    for pid_file in mps_pid_files(root) {
        if let Some(pid) = read_pid(&pid_file) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

pub fn read_pid(path: &Path) -> Option<i32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

pub fn mps_pid_files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .flat_map(|e| {
            let p = e.path();
            if p.is_dir() {
                mps_pid_files(&p)
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

// -------------------------------------------------------------------------------------------
// `gpu-share agent` against the API double
// -------------------------------------------------------------------------------------------

/// The profiles ConfigMap: the given example profiles under their file names, plus `extra`
/// (key, text) pairs.
pub fn profiles_configmap(api: &KubeDouble, names: &[&str], extra: &[(&str, String)]) {
    let mut texts: Vec<(String, String)> = names
        .iter()
        .map(|n| (n.to_string(), profile_text(n)))
        .collect();
    texts.extend(extra.iter().map(|(k, v)| (k.to_string(), v.clone())));
    let data: Vec<(&str, &str)> = texts
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    api.put_configmap(fixtures::configmap(NS, CM, &data));
}

/// A simulated workload: a pod and the NVML process it owns.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Workload {
    pub pod: String,
    pub pid: u32,
    pub gpu: usize,
    /// The GPU instance it runs on; `None` for a whole GPU (MIG off).
    pub gi: Option<u32>,
}

/// One GPU node: its fake NVML state, host fixture tree, and the agent process.
pub struct AgentNode {
    pub name: String,
    pub dir: tempfile::TempDir,
    pub agent: Option<Child>,
    kubelet: Arc<AtomicBool>,
    /// PID → pod UID of the simulated workloads.
    workloads: Arc<Mutex<BTreeMap<u32, String>>>,
    logs: AtomicUsize,
}

impl AgentNode {
    pub fn new(api: &Arc<KubeDouble>, name: &str, gpus: Vec<Gpu>) -> AgentNode {
        let dir = tempfile::tempdir().unwrap();
        State::with_gpus(gpus)
            .write_to(dir.path().join("nvml.json"))
            .unwrap();
        // What the start-up check reads on the host.
        let host = dir.path().join("host");
        std::fs::create_dir_all(host.join("proc/driver/nvidia")).unwrap();
        std::fs::write(
            host.join("proc/driver/nvidia/version"),
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  Sun Jul 27 06:54:38 UTC 2025\n",
        )
        .unwrap();
        std::fs::create_dir_all(host.join("dev")).unwrap();
        for dev in ["nvidiactl", "nvidia0", "nvidia-uvm"] {
            std::fs::write(host.join("dev").join(dev), "").unwrap();
        }
        std::fs::create_dir_all(dir.path().join("proc")).unwrap();
        api.write_kubeconfig(&dir.path().join("kubeconfig"))
            .unwrap();
        api.put_node(fixtures::node(name, &[]));
        let node = AgentNode {
            name: name.to_string(),
            dir,
            agent: None,
            kubelet: Arc::new(AtomicBool::new(true)),
            workloads: Arc::default(),
            logs: AtomicUsize::new(0),
        };
        node.run_kubelet(api);
        node
    }

    pub fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    pub fn nvml_state(&self) -> PathBuf {
        self.path("nvml.json")
    }

    pub fn plugin_config(&self) -> PathBuf {
        self.path("plugin/config.yaml")
    }

    /// Start the agent. `extra` flags override the defaults set here through the environment
    /// (a flag wins over its environment variable).
    pub fn start_agent(&mut self, extra: &[&str], env: &[(&str, String)]) {
        let n = self.logs.fetch_add(1, Ordering::SeqCst);
        let log = std::fs::File::create(self.path(&format!("agent-{n}.log"))).unwrap();
        let mut cmd = Command::new(gpu_share_bin());
        cmd.arg("agent");
        // Short leases, backoffs and resyncs, unless `extra` sets them (a flag may be given
        // only once).
        for (flag, value) in [
            ("--lease-duration-secs", "2"),
            ("--eviction-backoff-ms", "100"),
            ("--resync-secs", "2"),
        ] {
            if !extra.contains(&flag) {
                cmd.args([flag, value]);
            }
        }
        cmd.args(extra)
            .env("KUBECONFIG", self.path("kubeconfig"))
            .env("NODE_NAME", &self.name)
            .env("POD_NAMESPACE", NS)
            .env("GPU_SHARE_NVML_LIB", cdylib_path())
            .env("FAKE_NVML_STATE", self.nvml_state())
            .env("FAKE_NVML_LOG", self.path("nvml.log"))
            .env("GPU_SHARE_STATE_DIR", self.path("state"))
            .env("GPU_SHARE_PLUGIN_CONFIG", self.plugin_config())
            .env("GPU_SHARE_PLUGIN_RELOAD", "none")
            .env("GPU_SHARE_PROC_ROOT", self.path("proc"))
            .env("GPU_SHARE_HOST_ROOT", self.path("host"))
            .env("GPU_SHARE_MPS_ROOT", self.path("mps"))
            .env("GPU_SHARE_LISTEN", "127.0.0.1:0")
            .env("GPU_SHARE_DRAIN_TIMEOUT", "20")
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log);
        if let Some(mps) = mps_control() {
            cmd.env("GPU_SHARE_MPS_CONTROL", mps);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        self.agent = Some(cmd.spawn().expect("start gpu-share agent"));
    }

    pub fn kill_agent(&mut self) {
        if let Some(mut child) = self.agent.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn agent_pid(&self) -> u32 {
        self.agent.as_ref().expect("agent started").id()
    }

    /// Whether the agent process is still running.
    pub fn agent_running(&mut self) -> bool {
        self.agent
            .as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }

    /// Pods with NVML processes: `(pod name, pid, gpu, gi)`, each pod in namespace `default`
    /// with label `app=<pod name>`. The NVML state is written once for all of them.
    pub fn add_workloads(&self, api: &KubeDouble, list: &[Workload]) {
        // Held throughout, so the simulated kubelet never sees a pod half set up.
        let mut workloads = self.workloads.lock().unwrap();
        let mut state = self.nvml();
        for w in list {
            let resource = if w.gi.is_some() {
                "nvidia.com/mig-1g.10gb"
            } else {
                "nvidia.com/gpu"
            };
            let p = api.put_pod(fixtures::gpu_pod(
                "default",
                &w.pod,
                &self.name,
                &[("app", &w.pod)],
                resource,
                1,
            ));
            let uid = p.metadata.uid.clone().expect("the double assigns UIDs");
            let cgroup = self.path(&format!("proc/{}", w.pid));
            std::fs::create_dir_all(&cgroup).unwrap();
            std::fs::write(
                cgroup.join("cgroup"),
                format!("0::/kubepods/besteffort/pod{uid}/c0ffee\n"),
            )
            .unwrap();
            let process = match w.gi {
                Some(gi) => Process::on_mig(w.pid, 1024, gi, 0),
                None => Process::on_gpu(w.pid, 1024),
            };
            state.gpus[w.gpu].processes.push(process);
            workloads.insert(w.pid, uid);
        }
        state.write_to(self.nvml_state()).unwrap();
    }

    /// One workload on every GPU instance, and one on every GPU with MIG off; pod names start
    /// with `prefix`, PIDs at `first_pid`.
    pub fn workloads_everywhere(&self, prefix: &str, first_pid: u32) -> Vec<Workload> {
        let state = self.nvml();
        let mut out = Vec::new();
        let mut pid = first_pid;
        for (i, gpu) in state.gpus.iter().enumerate() {
            let mig_on = gpu.mig.is_some_and(|m| m.current);
            if mig_on {
                for gi in &gpu.gpu_instances {
                    out.push(Workload {
                        pod: format!("{prefix}-{i}-gi{}", gi.id),
                        pid,
                        gpu: i,
                        gi: Some(gi.id),
                    });
                    pid += 1;
                }
            } else {
                out.push(Workload {
                    pod: format!("{prefix}-{i}"),
                    pid,
                    gpu: i,
                    gi: None,
                });
                pid += 1;
            }
        }
        out
    }

    /// The kubelet's part: processes of deleted pods exit.
    fn run_kubelet(&self, api: &Arc<KubeDouble>) {
        let (alive, workloads, state, api) = (
            self.kubelet.clone(),
            self.workloads.clone(),
            self.nvml_state(),
            Arc::clone(api),
        );
        let node = self.name.clone();
        std::thread::spawn(move || {
            while alive.load(Ordering::SeqCst) {
                {
                    let mut workloads = workloads.lock().unwrap();
                    let uids: Vec<String> = api
                        .pods_on(&node)
                        .iter()
                        .filter_map(|p| p.metadata.uid.clone())
                        .collect();
                    let gone: Vec<u32> = workloads
                        .iter()
                        .filter(|(_, uid)| !uids.contains(uid))
                        .map(|(pid, _)| *pid)
                        .collect();
                    if !gone.is_empty() {
                        let mut s = State::read_from(&state).unwrap();
                        for g in &mut s.gpus {
                            g.processes.retain(|p| !gone.contains(&p.pid));
                        }
                        s.write_to(&state).unwrap();
                        workloads.retain(|pid, _| !gone.contains(pid));
                    }
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
    }

    pub fn nvml(&self) -> State {
        State::read_from(self.nvml_state()).unwrap()
    }

    pub fn gi_at(&self, gpu: usize, start: u32) -> u32 {
        self.nvml().gpus[gpu]
            .gpu_instances
            .iter()
            .find(|g| g.placement.start == start)
            .unwrap_or_else(|| panic!("no GI at {start} on GPU {gpu}"))
            .id
    }

    pub fn mutations(&self) -> Vec<LogEntry> {
        successful_mutations(&self.path("nvml.log"))
    }

    pub fn count(&self, function: &str) -> usize {
        self.mutations()
            .iter()
            .filter(|e| e.function == function)
            .count()
    }

    /// Every agent log so far.
    pub fn log(&self) -> String {
        let mut all = String::new();
        for n in 0..self.logs.load(Ordering::SeqCst) {
            if let Ok(mut f) = std::fs::File::open(self.path(&format!("agent-{n}.log"))) {
                let _ = f.read_to_string(&mut all);
            }
        }
        all
    }

    /// `/proc/<agent pid>/status` fields in kB: (VmRSS, VmHWM).
    pub fn agent_memory_kb(&self) -> (u64, u64) {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.agent_pid()))
            .expect("agent /proc status");
        let field = |name: &str| {
            status
                .lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        (field("VmRSS:"), field("VmHWM:"))
    }
}

impl Drop for AgentNode {
    fn drop(&mut self) {
        self.kill_agent();
        self.kubelet.store(false, Ordering::SeqCst);
        kill_mps_daemons(&self.path("mps"));
    }
}

pub fn state_of(api: &KubeDouble, node: &str) -> Option<String> {
    api.node(node)?.metadata.labels?.get(STATE_LABEL).cloned()
}

pub fn annotation(api: &KubeDouble, node: &str, key: &str) -> Option<String> {
    api.node(node)?.metadata.annotations?.get(key).cloned()
}

pub fn unschedulable(api: &KubeDouble, node: &str) -> bool {
    api.node(node)
        .and_then(|n| n.spec?.unschedulable)
        .unwrap_or(false)
}

pub fn wait_state(api: &KubeDouble, node: &AgentNode, want: &str, timeout: Duration) {
    let ok = api.wait_until(timeout, |a| {
        state_of(a, &node.name).as_deref() == Some(want)
    });
    assert!(
        ok,
        "{}: state {:?}, wanted {want}; reason {:?}\nagent log:\n{}",
        node.name,
        state_of(api, &node.name),
        annotation(api, &node.name, REASON),
        node.log()
    );
}

/// Whether the profile with this text is the applied one (state success, its hash published).
pub fn is_applied(api: &KubeDouble, node: &str, text: &str) -> bool {
    let hash = sha256(text);
    state_of(api, node).as_deref() == Some("success")
        && annotation(api, node, APPLIED_HASH).as_deref() == Some(hash.as_str())
}

/// Wait until example profile `name` is the applied one.
pub fn wait_applied(api: &KubeDouble, node: &AgentNode, name: &str, timeout: Duration) {
    wait_applied_text(api, node, &profile_text(name), timeout, name);
}

pub fn wait_applied_text(
    api: &KubeDouble,
    node: &AgentNode,
    text: &str,
    timeout: Duration,
    what: &str,
) {
    let ok = api.wait_until(timeout, |a| is_applied(a, &node.name, text));
    assert!(
        ok,
        "{}: {what} not applied; state {:?}, reason {:?}\n{}",
        node.name,
        state_of(api, &node.name),
        annotation(api, &node.name, REASON),
        node.log()
    );
}

/// Pods the double evicted (outcome `Evicted`), by name.
pub fn evicted(api: &KubeDouble) -> BTreeSet<String> {
    api.evictions()
        .into_iter()
        .filter(|e| e.outcome == EvictionOutcome::Evicted)
        .map(|e| e.pod)
        .collect()
}

/// Pods deleted other than through the Eviction API (which would bypass their budgets).
pub fn direct_pod_deletes(api: &KubeDouble) -> Vec<String> {
    api.requests()
        .into_iter()
        .filter(|r| r.resource == "pods" && matches!(r.verb, Verb::Delete | Verb::DeleteCollection))
        .map(|r| r.path)
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
