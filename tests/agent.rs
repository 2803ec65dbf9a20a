//! `gpu-share agent` as a process, with the real kube client talking HTTP to the Kubernetes API
//! double (tests/kube-double) and NVML served by the fake library (tests/fake-nvml).
//!
//! The test plays the kubelet's part for GPU processes: each simulated pod owns NVML processes
//! (with a `/proc/<pid>/cgroup` naming its pod UID in a fixture proc tree); when the pod is
//! deleted, its processes leave the fake NVML state, as they would when the container stops.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube_double::{fixtures, KubeDouble};
use nvidia_ml::{cdylib_path, read_log, Gpu, Process, State};

const NS: &str = "gpu-share";
const CM: &str = "gpu-share-profiles";
const PROFILE_LABEL: &str = "gpu-share.dev/profile";
const STATE_LABEL: &str = "gpu-share.dev/profile.state";

fn profile_text(name: &str) -> String {
    std::fs::read_to_string(format!(
        "{}/profiles/{name}.yaml",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
}

/// The profiles ConfigMap with a few example profiles, under their file names.
fn profiles_configmap(api: &KubeDouble) {
    let names = [
        "h100-balanced",
        "h100-inference",
        "exclusive",
        "homelab-timeslice",
    ];
    let texts: Vec<(String, String)> = names
        .iter()
        .map(|n| (n.to_string(), profile_text(n)))
        .collect();
    let data: Vec<(&str, &str)> = texts
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    api.put_configmap(fixtures::configmap(NS, CM, &data));
}

/// One GPU node: its fake NVML state, host fixture tree, and the agent process.
struct Node {
    name: String,
    dir: tempfile::TempDir,
    agent: Option<Child>,
    kubelet: Arc<AtomicBool>,
    /// PID → pod UID of the simulated workloads.
    workloads: Arc<Mutex<BTreeMap<u32, String>>>,
}

impl Node {
    fn new(api: &Arc<KubeDouble>, name: &str, gpus: Vec<Gpu>) -> Node {
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
        let node = Node {
            name: name.to_string(),
            dir,
            agent: None,
            kubelet: Arc::new(AtomicBool::new(true)),
            workloads: Arc::default(),
        };
        node.run_kubelet(api);
        node
    }

    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    fn start_agent(&mut self, extra: &[&str]) {
        let log = std::fs::File::create(self.path(&format!(
            "agent-{}.log",
            Instant::now().elapsed().as_nanos()
        )))
        .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_gpu-share"))
            .arg("agent")
            .args([
                "--lease-duration-secs",
                "2",
                "--eviction-backoff-ms",
                "100",
                "--resync-secs",
                "2",
            ])
            .args(extra)
            .env("KUBECONFIG", self.path("kubeconfig"))
            .env("NODE_NAME", &self.name)
            .env("POD_NAMESPACE", NS)
            .env("GPU_SHARE_NVML_LIB", cdylib_path())
            .env("FAKE_NVML_STATE", self.path("nvml.json"))
            .env("FAKE_NVML_LOG", self.path("nvml.log"))
            .env("GPU_SHARE_STATE_DIR", self.path("state"))
            .env("GPU_SHARE_PLUGIN_CONFIG", self.path("plugin/config.yaml"))
            .env("GPU_SHARE_PLUGIN_RELOAD", "none")
            .env("GPU_SHARE_PROC_ROOT", self.path("proc"))
            .env("GPU_SHARE_HOST_ROOT", self.path("host"))
            .env("GPU_SHARE_MPS_CONTROL", fake_mps_control::binary_path())
            .env("GPU_SHARE_MPS_ROOT", self.path("mps"))
            .env("GPU_SHARE_LISTEN", "127.0.0.1:0")
            .env("GPU_SHARE_DRAIN_TIMEOUT", "20")
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.agent = Some(child);
    }

    fn kill_agent(&mut self) {
        if let Some(mut child) = self.agent.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn agent_pid(&self) -> u32 {
        self.agent.as_ref().unwrap().id()
    }

    /// A pod on this node whose process `pid` runs on GPU instance `gi` of GPU `gpu`.
    fn workload(&self, api: &KubeDouble, pod: &str, pid: u32, gpu: usize, gi: u32) -> String {
        let p = api.put_pod(fixtures::gpu_pod(
            "default",
            pod,
            &self.name,
            &[("app", pod)],
            "nvidia.com/mig-1g.10gb",
            1,
        ));
        let uid = p.metadata.uid.clone().expect("the double assigns UIDs");
        let cgroup = self.path(&format!("proc/{pid}"));
        std::fs::create_dir_all(&cgroup).unwrap();
        std::fs::write(
            cgroup.join("cgroup"),
            format!("0::/kubepods/besteffort/pod{uid}/c0ffee\n"),
        )
        .unwrap();
        // Under the kubelet's lock: it must not see the process before it knows the pod.
        let mut workloads = self.workloads.lock().unwrap();
        let mut state = self.nvml();
        state.gpus[gpu]
            .processes
            .push(Process::on_mig(pid, 1024, gi, 0));
        state.write_to(self.path("nvml.json")).unwrap();
        workloads.insert(pid, uid.clone());
        uid
    }

    /// The kubelet's part: processes of deleted pods exit.
    fn run_kubelet(&self, api: &Arc<KubeDouble>) {
        let (alive, workloads, state, api) = (
            self.kubelet.clone(),
            self.workloads.clone(),
            self.path("nvml.json"),
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

    fn nvml(&self) -> State {
        State::read_from(self.path("nvml.json")).unwrap()
    }

    fn gi_at(&self, gpu: usize, start: u32) -> u32 {
        self.nvml().gpus[gpu]
            .gpu_instances
            .iter()
            .find(|g| g.placement.start == start)
            .unwrap_or_else(|| panic!("no GI at {start} on GPU {gpu}"))
            .id
    }

    fn destroyed(&self) -> usize {
        if !self.path("nvml.log").exists() {
            return 0;
        }
        read_log(self.path("nvml.log"))
            .iter()
            .filter(|e| e.function == "nvmlGpuInstanceDestroy" && e.result == "NVML_SUCCESS")
            .count()
    }

    fn mutations(&self) -> usize {
        if !self.path("nvml.log").exists() {
            return 0;
        }
        read_log(self.path("nvml.log"))
            .iter()
            .filter(|e| e.result == "NVML_SUCCESS")
            .count()
    }

    fn log(&self) -> String {
        let mut all = String::new();
        for e in std::fs::read_dir(self.dir.path()).unwrap().flatten() {
            if e.file_name().to_string_lossy().starts_with("agent-") {
                let mut s = String::new();
                std::fs::File::open(e.path())
                    .unwrap()
                    .read_to_string(&mut s)
                    .unwrap();
                all.push_str(&s);
            }
        }
        all
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill_agent();
        self.kubelet.store(false, Ordering::SeqCst);
    }
}

/// GET `path` from the agent's HTTP endpoint (its address is in its first log line).
fn http_get(node: &Node, path: &str) -> String {
    use std::io::Write;
    let log = node.log();
    let addr = log
        .lines()
        .find_map(|l| l.split("addr=").nth(1))
        .map(|a| a.split_whitespace().next().unwrap().to_string())
        .expect("the agent logs its address");
    let mut stream = std::net::TcpStream::connect(&addr).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
}

fn state_of(api: &KubeDouble, node: &str) -> Option<String> {
    api.node(node)?.metadata.labels?.get(STATE_LABEL).cloned()
}

fn annotation(api: &KubeDouble, node: &str, key: &str) -> Option<String> {
    api.node(node)?.metadata.annotations?.get(key).cloned()
}

fn unschedulable(api: &KubeDouble, node: &str) -> bool {
    api.node(node)
        .and_then(|n| n.spec?.unschedulable)
        .unwrap_or(false)
}

fn wait_state(api: &KubeDouble, node: &Node, want: &str, timeout: Duration) {
    let ok = api.wait_until(timeout, |a| {
        state_of(a, &node.name).as_deref() == Some(want)
    });
    assert!(
        ok,
        "{}: state {:?}, wanted {want}; reason {:?}\nagent log:\n{}",
        node.name,
        state_of(api, &node.name),
        annotation(api, &node.name, "gpu-share.dev/profile.reason"),
        node.log()
    );
}

/// Wait until `profile` is the applied one (state success and its hash published).
fn wait_applied(api: &KubeDouble, node: &Node, profile: &str) {
    let hash = sha256(&profile_text(profile));
    let ok = api.wait_until(Duration::from_secs(30), |a| {
        state_of(a, &node.name).as_deref() == Some("success")
            && annotation(a, &node.name, "gpu-share.dev/profile.applied-hash").as_deref()
                == Some(hash.as_str())
    });
    assert!(
        ok,
        "{}: {profile} not applied; state {:?}, reason {:?}\n{}",
        node.name,
        state_of(api, &node.name),
        annotation(api, &node.name, "gpu-share.dev/profile.reason"),
        node.log()
    );
}

fn h100s(n: usize) -> Vec<Gpu> {
    (0..n).map(|_| Gpu::mig("h100").mig_enabled()).collect()
}

fn sha256(text: &str) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[test]
fn label_set_changed_and_removed() {
    let api = Arc::new(KubeDouble::start());
    profiles_configmap(&api);
    let mut node = Node::new(&api, "gpu-1", h100s(2));
    node.start_agent(&[]);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(node.mutations(), 0, "no label: the GPUs are left alone");

    let t0 = Instant::now();
    api.set_node_label("gpu-1", PROFILE_LABEL, Some("h100-balanced"));
    let config = node.path("plugin/config.yaml");
    assert!(
        api.wait_until(Duration::from_secs(20), |_| config.exists()),
        "{}",
        node.log()
    );
    eprintln!(
        "label set → device-plugin config written: {:?}",
        t0.elapsed()
    );
    wait_state(&api, &node, "success", Duration::from_secs(20));
    assert_eq!(
        annotation(&api, "gpu-1", "gpu-share.dev/profile.applied-hash"),
        Some(sha256(&profile_text("h100-balanced")))
    );
    assert_eq!(node.nvml().gpus[0].gpu_instances.len(), 5);
    assert!(!unschedulable(&api, "gpu-1"), "uncordoned after the change");
    // The Event follows the state label.
    assert!(
        api.wait_until(Duration::from_secs(10), |a| a
            .events()
            .iter()
            .any(|e| e.reason.as_deref() == Some("Applied"))),
        "no Applied event"
    );

    // A workload on a 1g.10gb that h100-inference keeps, and one on the 3g.40gb it destroys.
    let keep_gi = node.gi_at(0, 0);
    let gone_gi = node.gi_at(0, 4);
    node.workload(&api, "stays", 4001, 0, keep_gi);
    node.workload(&api, "moves", 4002, 0, gone_gi);
    let destroyed_before = node.destroyed();
    api.set_node_label("gpu-1", PROFILE_LABEL, Some("h100-inference"));
    wait_applied(&api, &node, "h100-inference");
    let evicted: Vec<String> = api.evictions().iter().map(|e| e.pod.clone()).collect();
    assert_eq!(
        evicted,
        ["moves"],
        "only the pod on the destroyed instance is evicted"
    );
    assert!(api.pod("default", "stays").is_some());
    // h100-balanced → h100-inference on 2 GPUs (both in its "0-3" MIG rule): only the two
    // 3g.40gb go; the eight 1g.10gb stay where they are.
    assert_eq!(node.destroyed() - destroyed_before, 2);
    assert!(!unschedulable(&api, "gpu-1"));
    assert!(annotation(&api, "gpu-1", "gpu-share.dev/cordoned").is_none());

    // Removing the label leaves the GPUs alone and drops the state.
    let before = node.mutations();
    api.set_node_label("gpu-1", PROFILE_LABEL, None);
    assert!(api.wait_until(Duration::from_secs(10), |a| state_of(a, "gpu-1").is_none()));
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(node.mutations(), before);

    // The agent's own endpoints.
    let metrics = http_get(&node, "/metrics");
    assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
    assert!(
        metrics.contains("gpu_share_reconciles_total{result=\"success\"}"),
        "{metrics}"
    );
    assert!(
        metrics.contains("gpu_share_evictions_total{outcome=\"evicted\"} 1"),
        "{metrics}"
    );
    assert!(http_get(&node, "/readyz").starts_with("HTTP/1.1 200"));
    assert!(http_get(&node, "/healthz").starts_with("HTTP/1.1 200"));

    // Idle resident memory, for the note.
    let status = std::fs::read_to_string(format!("/proc/{}/status", node.agent_pid())).unwrap();
    let rss = status
        .lines()
        .find(|l| l.starts_with("VmRSS"))
        .unwrap_or("")
        .to_string();
    eprintln!("agent idle {rss}");
}

#[test]
fn an_edited_configmap_key_is_applied_and_an_invalid_one_changes_nothing() {
    let api = Arc::new(KubeDouble::start());
    profiles_configmap(&api);
    let mut node = Node::new(&api, "gpu-2", h100s(1));
    api.set_node_label("gpu-2", PROFILE_LABEL, Some("h100-balanced"));
    node.start_agent(&[]);
    wait_state(&api, &node, "success", Duration::from_secs(20));

    let edited = profile_text("h100-balanced").replace("1g.10gb: 4", "1g.10gb: 3");
    api.update_configmap_key(NS, CM, "h100-balanced", Some(&edited));
    assert!(
        api.wait_until(Duration::from_secs(20), |a| {
            annotation(a, "gpu-2", "gpu-share.dev/profile.applied-hash") == Some(sha256(&edited))
        }),
        "{}",
        node.log()
    );
    assert_eq!(node.nvml().gpus[0].gpu_instances.len(), 4);

    let before = node.mutations();
    let broken = edited.replace("1g.10gb: 3", "1g.10gb: 9");
    api.update_configmap_key(NS, CM, "h100-balanced", Some(&broken));
    wait_state(&api, &node, "failed", Duration::from_secs(20));
    let reason = annotation(&api, "gpu-2", "gpu-share.dev/profile.reason").unwrap();
    assert!(
        reason.contains("nothing was changed") && reason.contains("rule 1"),
        "{reason}"
    );
    assert!(
        reason.contains("9 × 1g.10gb asked, but at most 7"),
        "{reason}"
    );
    assert_eq!(
        node.mutations(),
        before,
        "an invalid profile changes nothing on the GPUs"
    );
    assert!(!unschedulable(&api, "gpu-2"));
}

#[test]
fn a_pdb_blocks_the_drain_then_allows_it_and_a_restarted_agent_finishes() {
    let api = Arc::new(KubeDouble::start());
    profiles_configmap(&api);
    let mut node = Node::new(&api, "gpu-3", h100s(1));
    api.set_node_label("gpu-3", PROFILE_LABEL, Some("h100-balanced"));
    node.start_agent(&[]);
    wait_state(&api, &node, "success", Duration::from_secs(20));
    let gi = node.gi_at(0, 4);
    node.workload(&api, "guarded", 5001, 0, gi);
    api.put_pdb(fixtures::pdb_min_available(
        "default",
        "guard",
        &[("app", "guarded")],
        1,
    ));

    api.set_node_label("gpu-3", PROFILE_LABEL, Some("h100-inference"));
    wait_state(&api, &node, "draining", Duration::from_secs(20));
    assert!(api.wait_until(Duration::from_secs(10), |a| a
        .evictions()
        .iter()
        .any(|e| e.code == 429)));
    assert!(unschedulable(&api, "gpu-3"), "cordoned while draining");
    let cordon_reason = annotation(&api, "gpu-3", "gpu-share.dev/cordoned").unwrap();
    assert!(cordon_reason.contains("h100-inference"), "{cordon_reason}");

    // The agent dies mid-drain; the node stays cordoned with its reason on it.
    node.kill_agent();
    assert!(unschedulable(&api, "gpu-3"));
    node.start_agent(&[]);
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(
        state_of(&api, "gpu-3").as_deref(),
        Some("draining"),
        "{}",
        node.log()
    );

    // The budget allows it now: the restarted agent finishes and uncordons.
    api.remove::<k8s_openapi::api::policy::v1::PodDisruptionBudget>(Some("default"), "guard");
    wait_applied(&api, &node, "h100-inference");
    assert!(!unschedulable(&api, "gpu-3"));
    assert!(api.pod("default", "guarded").is_none());
    assert!(
        node.log().contains("draining"),
        "progress lines while waiting"
    );
}

#[test]
fn a_drain_that_never_ends_fails_clearly_and_uncordons() {
    let api = Arc::new(KubeDouble::start());
    profiles_configmap(&api);
    let mut node = Node::new(&api, "gpu-4", h100s(1));
    api.set_node_label("gpu-4", PROFILE_LABEL, Some("h100-balanced"));
    node.start_agent(&["--drain-timeout-secs", "2"]);
    wait_state(&api, &node, "success", Duration::from_secs(20));
    let gi = node.gi_at(0, 4);
    node.workload(&api, "pinned", 6001, 0, gi);
    api.put_pdb(fixtures::pdb_min_available(
        "default",
        "pin",
        &[("app", "pinned")],
        1,
    ));
    let before = node.mutations();

    api.set_node_label("gpu-4", PROFILE_LABEL, Some("h100-inference"));
    wait_state(&api, &node, "failed", Duration::from_secs(20));
    let reason = annotation(&api, "gpu-4", "gpu-share.dev/profile.reason").unwrap();
    assert!(
        reason.contains("drain timed out") && reason.contains("default/pinned"),
        "{reason}"
    );
    assert!(!unschedulable(&api, "gpu-4"), "uncordoned after giving up");
    assert_eq!(node.mutations(), before, "nothing changed on the GPUs");
    assert!(api.pod("default", "pinned").is_some());
}

#[test]
fn two_nodes_share_one_drain_slot() {
    let api = Arc::new(KubeDouble::start());
    profiles_configmap(&api);
    let mut a = Node::new(&api, "gpu-a", h100s(1));
    let mut b = Node::new(&api, "gpu-b", h100s(1));
    for n in [&a, &b] {
        api.set_node_label(&n.name, PROFILE_LABEL, Some("h100-balanced"));
    }
    a.start_agent(&[]);
    b.start_agent(&[]);
    wait_state(&api, &a, "success", Duration::from_secs(20));
    wait_state(&api, &b, "success", Duration::from_secs(20));
    // Both get a workload that must be evicted, each held by a budget for a while.
    for (n, pid) in [(&a, 7001), (&b, 7002)] {
        let gi = n.gi_at(0, 4);
        n.workload(&api, &format!("w-{}", n.name), pid, 0, gi);
        api.put_pdb(fixtures::pdb_min_available(
            "default",
            &format!("pdb-{}", n.name),
            &[("app", &format!("w-{}", n.name))],
            1,
        ));
    }
    api.set_node_label("gpu-a", PROFILE_LABEL, Some("h100-inference"));
    api.set_node_label("gpu-b", PROFILE_LABEL, Some("h100-inference"));
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut max_cordoned = 0;
    while Instant::now() < deadline {
        let cordoned = ["gpu-a", "gpu-b"]
            .iter()
            .filter(|n| unschedulable(&api, n))
            .count();
        max_cordoned = max_cordoned.max(cordoned);
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(max_cordoned, 1, "one node drains at a time");
    let waiting = [&a, &b]
        .iter()
        .filter(|n| state_of(&api, &n.name).as_deref() == Some("pending"))
        .count();
    assert_eq!(waiting, 1, "the other waits for the slot");
    for n in ["gpu-a", "gpu-b"] {
        api.remove::<k8s_openapi::api::policy::v1::PodDisruptionBudget>(
            Some("default"),
            &format!("pdb-{n}"),
        );
    }
    let mut max_cordoned = 0;
    let done = api.wait_until(Duration::from_secs(40), |api| {
        let cordoned = ["gpu-a", "gpu-b"]
            .iter()
            .filter(|n| unschedulable(api, n))
            .count();
        max_cordoned = max_cordoned.max(cordoned);
        state_of(api, "gpu-a").as_deref() == Some("success")
            && state_of(api, "gpu-b").as_deref() == Some("success")
    });
    assert!(done, "a: {}\nb: {}", a.log(), b.log());
    assert!(max_cordoned <= 1, "never two nodes cordoned at once");
    a.kill_agent();
    b.kill_agent();
}

#[test]
fn api_errors_and_dropped_watches_are_survived() {
    use kube_double::{Fault, Verb};
    let api = Arc::new(KubeDouble::start());
    profiles_configmap(&api);
    let mut node = Node::new(&api, "gpu-5", h100s(1));
    node.start_agent(&[]);
    std::thread::sleep(Duration::from_millis(500));
    api.fail_next(Verb::Patch, "nodes", 3, Fault::Status(500));
    api.drop_watches();
    api.compact();
    api.set_node_label("gpu-5", PROFILE_LABEL, Some("h100-balanced"));
    wait_state(&api, &node, "success", Duration::from_secs(30));
    assert_eq!(node.nvml().gpus[0].gpu_instances.len(), 5);
}
