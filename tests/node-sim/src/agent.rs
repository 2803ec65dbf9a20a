//! `gpu-share agent` as a process on one simulated node, against the Kubernetes API double.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube_double::{fixtures, EvictionOutcome, KubeDouble, Verb};
use nvidia_ml::{cdylib_path, Gpu, LogEntry, Process, State};

use crate::{
    gpu_share_bin, mps_control, profile_text, sha256, successful_mutations, APPLIED_HASH, CM, NS,
    REASON, STATE_LABEL,
};

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

/// A PodDisruptionBudget `pdb` in `default` that lets no eviction of pod `pod` (selected by its
/// label `app=<pod>`) through until it is removed.
pub fn guard(api: &KubeDouble, pod: &str, pdb: &str) {
    api.put_pdb(fixtures::pdb_min_available(
        "default",
        pdb,
        &[("app", pod)],
        1,
    ));
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

impl Workload {
    /// Pod `pod` whose process `pid` runs on GPU instance `gi` of GPU `gpu`.
    pub fn on_mig(pod: &str, pid: u32, gpu: usize, gi: u32) -> Workload {
        Workload {
            pod: pod.to_string(),
            pid,
            gpu,
            gi: Some(gi),
        }
    }
}

/// What `GPU_SHARE_NVML_LIB` names on a Jetson: no library at all.
pub const NO_NVML: &str = "/nonexistent/libnvidia-ml.so.1";

/// `/etc/nv_tegra_release` of L4T R36.4.0 (JetPack 6.1), as a Jetson Orin has it.
pub const TEGRA_RELEASE: &str = "# R36 (release), REVISION: 4.0, GCID: 37537400, BOARD: generic, EABI: aarch64, DATE: Fri Sep 13 04:36:44 UTC 2024\n";

/// One GPU node: its fake NVML state, host fixture tree, simulated kubelet and agent process,
/// all in one temp dir. The agent is killed, and its MPS daemons with it, when the node drops.
pub struct AgentNode {
    pub name: String,
    pub dir: tempfile::TempDir,
    pub agent: Option<Child>,
    kubelet: Arc<AtomicBool>,
    /// Whether the NVIDIA device-plugin double serves (crate::nvidia_plugin).
    nvidia_plugin_up: Arc<AtomicBool>,
    /// PID → pod UID of the simulated workloads.
    workloads: Arc<Mutex<BTreeMap<u32, String>>>,
    logs: AtomicUsize,
}

impl AgentNode {
    /// A node `name` with `gpus`, put at the API double as a plain Node.
    pub fn new(api: &Arc<KubeDouble>, name: &str, gpus: Vec<Gpu>) -> AgentNode {
        api.put_node(fixtures::node(name, &[]));
        Self::for_node(api, name, gpus)
    }

    /// The fixtures of node `name` with `gpus`, for a Node the caller put at the API double.
    pub fn for_node(api: &Arc<KubeDouble>, name: &str, gpus: Vec<Gpu>) -> AgentNode {
        Self::for_node_in(api, name, gpus, tempfile::tempdir().unwrap())
    }

    /// [`Self::for_node`] with its fixtures in `dir`: for a process that runs the agent
    /// in-process and so must point the fake NVML (`FAKE_NVML_STATE`, read from the
    /// environment) at `dir/nvml.json` before it starts any thread.
    pub fn for_node_in(
        api: &Arc<KubeDouble>,
        name: &str,
        gpus: Vec<Gpu>,
        dir: tempfile::TempDir,
    ) -> AgentNode {
        let gpu_count = gpus.len();
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
        let per_gpu = (0..gpu_count.max(1)).map(|i| format!("nvidia{i}"));
        for dev in ["nvidiactl".to_string(), "nvidia-uvm".to_string()]
            .into_iter()
            .chain(per_gpu)
        {
            std::fs::write(host.join("dev").join(dev), "").unwrap();
        }
        std::fs::create_dir_all(dir.path().join("proc")).unwrap();
        api.write_kubeconfig(&dir.path().join("kubeconfig"))
            .unwrap();
        let node = AgentNode {
            name: name.to_string(),
            dir,
            agent: None,
            kubelet: Arc::new(AtomicBool::new(true)),
            nvidia_plugin_up: Arc::new(AtomicBool::new(true)),
            workloads: Arc::default(),
            logs: AtomicUsize::new(0),
        };
        node.run_kubelet(api);
        crate::nvidia_plugin::run(
            Arc::clone(api),
            node.name.clone(),
            node.plugin_config(),
            node.nvml_state(),
            node.path("host"),
            node.kubelet.clone(),
            node.nvidia_plugin_up.clone(),
        );
        node
    }

    /// Make this node a Jetson whose device tree calls it `model`, as L4T R36.4 (JetPack 6.1)
    /// lays a Jetson Orin out: `/etc/nv_tegra_release`, `/sys/devices/soc0/family` `Tegra`, the
    /// device tree's `compatible` and `model`; no NVIDIA kernel module (`/proc/driver/nvidia`),
    /// no `/dev/nvidia*` and no NVML (its fake state is removed; start the agent with
    /// `GPU_SHARE_NVML_LIB` set to [`NO_NVML`]).
    pub fn make_jetson(&self, model: &str) {
        let host = self.path("host");
        std::fs::remove_dir_all(host.join("proc/driver")).unwrap();
        std::fs::remove_dir_all(host.join("dev")).unwrap();
        std::fs::create_dir_all(host.join("dev")).unwrap();
        std::fs::remove_file(self.nvml_state()).unwrap();
        let files = [
            ("etc/nv_tegra_release", TEGRA_RELEASE.as_bytes().to_vec()),
            ("sys/devices/soc0/family", b"Tegra\n".to_vec()),
            (
                "proc/device-tree/compatible",
                b"nvidia,p3768-0000+p3767-0005\0nvidia,p3767-0005\0nvidia,tegra234\0".to_vec(),
            ),
            ("proc/device-tree/model", format!("{model}\0").into_bytes()),
        ];
        for (path, bytes) in files {
            let path = host.join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, bytes).unwrap();
        }
    }

    pub fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    pub fn nvml_state(&self) -> PathBuf {
        self.path("nvml.json")
    }

    /// Where the agent asks the kubelet's PodResources API (served by a test that starts a
    /// [`crate::PodResourcesKubelet`] there; absent otherwise).
    pub fn pod_resources_socket(&self) -> PathBuf {
        self.path("pod-resources/kubelet.sock")
    }

    pub fn plugin_config(&self) -> PathBuf {
        self.path("plugin/config.yaml")
    }

    /// What points a `gpu-share` process into this node's fixtures: the API double's
    /// kubeconfig, the fake NVML (state, log, and the host's MIG procfs files it keeps) and MPS
    /// control, the host root; logs at info.
    pub fn fixture_env<'c>(&self, cmd: &'c mut Command) -> &'c mut Command {
        cmd.env("KUBECONFIG", self.path("kubeconfig"))
            .env("GPU_SHARE_NVML_LIB", cdylib_path())
            .env("FAKE_NVML_STATE", self.nvml_state())
            .env("FAKE_NVML_LOG", self.path("nvml.log"))
            .env("FAKE_NVML_PROC_ROOT", self.path("host/proc"))
            .env("GPU_SHARE_HOST_ROOT", self.path("host"))
            .env("RUST_LOG", "info");
        if let Some(mps) = mps_control() {
            cmd.env("GPU_SHARE_MPS_CONTROL", mps);
        }
        cmd
    }

    /// `gpu-share`, without arguments, in the environment of this node's agent: the
    /// [`Self::fixture_env`], the downward-API values, state dir, plugin config (not reloaded),
    /// proc and MPS roots, the PodResources socket and the DRA plugin's directories in the temp
    /// dir, any free port, drains of 20 s.
    pub fn agent_command(&self) -> Command {
        let mut cmd = Command::new(gpu_share_bin());
        cmd.env("NODE_NAME", &self.name)
            .env("POD_NAMESPACE", NS)
            .env("GPU_SHARE_STATE_DIR", self.path("state"))
            .env("GPU_SHARE_PLUGIN_CONFIG", self.plugin_config())
            .env("GPU_SHARE_PLUGIN_RELOAD", "none")
            .env("GPU_SHARE_PROC_ROOT", self.path("proc"))
            .env(
                "GPU_SHARE_POD_RESOURCES_SOCKET",
                self.pod_resources_socket(),
            )
            .env("GPU_SHARE_MPS_ROOT", self.path("mps"))
            // --plugin dra: the kubelet plugin's sockets, checkpoint and CDI specs in the temp
            // dir too, never the host's /var/lib/kubelet or /var/run/cdi (parallel tests' agents
            // would take each other's sockets).
            .env(
                "GPU_SHARE_DRA_REGISTRATION_DIR",
                self.path("plugins_registry"),
            )
            .env(
                "GPU_SHARE_DRA_PLUGIN_DIR",
                self.path("plugins/gpu.gpu-share.dev"),
            )
            .env("GPU_SHARE_CDI_ROOT", self.path("cdi"))
            .env("GPU_SHARE_LISTEN", "127.0.0.1:0")
            .env("GPU_SHARE_DRAIN_TIMEOUT", "20s");
        self.fixture_env(&mut cmd);
        cmd
    }

    /// Start `cmd` as this node's agent: stdout discarded, stderr to a new log ([`Self::log`]).
    pub fn spawn(&mut self, mut cmd: Command) {
        let n = self.logs.fetch_add(1, Ordering::SeqCst);
        let log = std::fs::File::create(self.path(&format!("agent-{n}.log"))).unwrap();
        cmd.stdout(Stdio::null()).stderr(log);
        self.agent = Some(cmd.spawn().expect("start gpu-share agent"));
    }

    /// Start `gpu-share agent` ([`Self::agent_command`]) with `extra` flags and `env` set last.
    /// Leases, eviction backoffs and resyncs are short unless `extra` sets them (a flag may be
    /// given only once).
    pub fn start_agent(&mut self, extra: &[&str], env: &[(&str, String)]) {
        let mut cmd = self.agent_command();
        cmd.arg("agent");
        for (flag, value) in [
            ("--lease-duration", "2s"),
            ("--eviction-backoff", "100ms"),
            ("--resync-period", "2s"),
        ] {
            if !extra.contains(&flag) {
                cmd.args([flag, value]);
            }
        }
        cmd.args(extra);
        for (k, v) in env {
            cmd.env(k, v);
        }
        self.spawn(cmd);
    }

    /// How many reconciles the latest agent finished with `result` (`noop`, `success`,
    /// `failed`), from its /metrics; 0 before the first (or while /metrics does not answer).
    pub fn reconciles(&self, result: &str) -> f64 {
        let series = format!(r#"gpu_share_reconciles_total{{result="{result}"}}"#);
        self.logged_http_port()
            .and_then(|port| crate::http_get(port, "/metrics"))
            .and_then(|text| crate::metric(&text, &series))
            .unwrap_or(0.0)
    }

    /// Wait until the agent finished more than `before` reconciles with `result`: the sign
    /// that it handled an event, which a test waits for before it asserts that nothing
    /// happened. Panics with the agent's log after `timeout`.
    pub fn wait_reconciled(&self, result: &str, before: f64, timeout: Duration) {
        let handled = crate::poll(timeout, Duration::from_millis(20), || {
            self.reconciles(result) > before
        });
        assert!(
            handled,
            "{}: no {result} reconcile after {before} within {timeout:?}\nagent log:\n{}",
            self.name,
            self.log()
        );
    }

    /// The port of the latest agent's HTTP endpoint (/metrics, /healthz), from its log.
    pub fn http_port(&self) -> u16 {
        self.logged_http_port().expect("the agent logs its address")
    }

    /// [`Self::http_port`], or none while the agent has not logged it yet.
    fn logged_http_port(&self) -> Option<u16> {
        self.log().lines().rev().find_map(|l| {
            let addr = l.split("addr=").nth(1)?.split_whitespace().next()?;
            addr.rsplit(':').next()?.parse().ok()
        })
    }

    /// NVIDIA's device plugin exits (say, on a config it refuses): its resources drop to 0
    /// on the Node until [`Self::start_nvidia_plugin`].
    pub fn stop_nvidia_plugin(&self) {
        self.nvidia_plugin_up.store(false, Ordering::SeqCst);
    }

    /// NVIDIA's device plugin runs again, on the current config.
    pub fn start_nvidia_plugin(&self) {
        self.nvidia_plugin_up.store(true, Ordering::SeqCst);
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

    /// Pods with NVML processes, each pod in namespace `default` with label `app=<pod name>`.
    pub fn add_workloads(&self, api: &KubeDouble, list: &[Workload]) {
        self.add_workloads_in(api, "default", list);
    }

    /// Pods with NVML processes in `namespace`, each with label `app=<pod name>`. The NVML
    /// state is written once for all of them.
    pub fn add_workloads_in(&self, api: &KubeDouble, namespace: &str, list: &[Workload]) {
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
                namespace,
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
                    out.push(Workload::on_mig(
                        &format!("{prefix}-{i}-gi{}", gi.id),
                        pid,
                        i,
                        gi.id,
                    ));
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
                // Pods are listed under the lock, so a workload added meanwhile is never taken
                // for one whose pod is gone.
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

    /// The ID of the GPU instance placed at `start` on GPU `gpu`.
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

    /// Successful calls of one NVML function so far.
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
        let [rss, hwm] = proc_status_kb(self.agent_pid(), ["VmRSS:", "VmHWM:"]);
        (rss, hwm)
    }
}

impl Drop for AgentNode {
    fn drop(&mut self) {
        self.kill_agent();
        self.kubelet.store(false, Ordering::SeqCst);
        crate::kill_mps_daemons(&self.path("mps"));
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

/// Wait until `cond` holds at the API double; else panic with `what`, the node's state and
/// reason, and the agent's log.
fn wait_node(
    api: &KubeDouble,
    node: &AgentNode,
    timeout: Duration,
    what: &str,
    cond: impl FnMut(&KubeDouble) -> bool,
) {
    let ok = api.wait_until(timeout, cond);
    assert!(
        ok,
        "{}: {what}; state {:?}, reason {:?}\nagent log:\n{}",
        node.name,
        state_of(api, &node.name),
        annotation(api, &node.name, REASON),
        node.log()
    );
}

/// Wait until the agent labelled the node with the GPUs it found (`gpu-share.dev/gpu.count`):
/// the last Node write of a reconcile, sent in the background after its state. A test that
/// arms a fault on the next Node write waits for it, so that write does not take the fault.
pub fn wait_gpus_labelled(api: &KubeDouble, node: &AgentNode) {
    wait_node(
        api,
        node,
        Duration::from_secs(20),
        "no gpu-share.dev/gpu.count label",
        |a| {
            a.node(&node.name)
                .and_then(|n| n.metadata.labels)
                .is_some_and(|l| l.contains_key("gpu-share.dev/gpu.count"))
        },
    );
}

pub fn wait_state(api: &KubeDouble, node: &AgentNode, want: &str, timeout: Duration) {
    wait_node(api, node, timeout, &format!("wanted state {want}"), |a| {
        state_of(a, &node.name).as_deref() == Some(want)
    });
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

/// Wait until the profile with this text (`what`, in the failure) is the applied one.
pub fn wait_applied_text(
    api: &KubeDouble,
    node: &AgentNode,
    text: &str,
    timeout: Duration,
    what: &str,
) {
    wait_node(api, node, timeout, &format!("{what} not applied"), |a| {
        is_applied(a, &node.name, text)
    });
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

/// Fields of `/proc/<pid>/status` in kB (or counts, for `Threads:`), 0 where absent.
pub fn proc_status_kb<const N: usize>(pid: u32, names: [&str; N]) -> [u64; N] {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    names.map(|name| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    })
}

/// What profile `text` advertises on the GPUs in `nvml_state`: device ID → (resource,
/// sharing), by the library's own expansion (the one the agent and the built-in plugin use).
pub fn advertisement(
    text: &str,
    nvml_state: &std::path::Path,
) -> gpu_share::agent::advertisement::Advertisement {
    let profile = gpu_share::profile::parse_profile("bench", text).expect("a valid profile");
    let observed = crate::observe(nvml_state);
    let plan = gpu_share::plan::plan("bench", &profile, &observed).expect("a plan");
    let inventory = gpu_share::builtin_plugin::Inventory::from_plan(
        &plan,
        &observed,
        &profile.plugin,
        std::path::Path::new("/run/nvidia/mps"),
    );
    gpu_share::agent::advertisement::Advertisement::of(&inventory)
}

/// The device ID and resource a workload's device is first advertised under in `ad`: its GPU's
/// UUID (or replica `::0`) with MIG off, its GPU instance's MIG device otherwise.
pub fn advertised_id(
    ad: &gpu_share::agent::advertisement::Advertisement,
    observed: &gpu_share::plan::ObservedNode,
    w: &Workload,
) -> Option<(String, String)> {
    let gpu = observed.gpus.get(w.gpu)?;
    let uuid = match w.gi {
        None => gpu.uuid.clone()?,
        Some(gi) => gpu
            .compute_instances
            .iter()
            .find(|ci| ci.gi_id == gi)?
            .uuid
            .clone()?,
    };
    ad.devices
        .iter()
        .find(|(id, _)| gpu_share::kubelet::pod_resources::device_uuid(id) == uuid)
        .map(|(id, a)| (a.resource.clone(), id.clone()))
}
