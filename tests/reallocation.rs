//! A profile change that keeps a device but advertises it otherwise (another ID, resource,
//! sharing or terms) drains the device's holders first, so the kubelet never hands it to a
//! second pod and no holder runs on terms the node no longer offers; holders of devices
//! advertised as before stay (src/agent/advertisement/).
//!
//! Each case is one a real kubelet 1.36 with NVIDIA's device plugin got wrong before this
//! (time-slicing → exclusive, MIG strategy mixed → single, replicas 4 → 2), and its reverse;
//! and the changes of terms under the same IDs (replica count, MPS limits: issue 37 item 3).
//! The real agent binary runs against the API double, the fake NVML and the simulated kubelet's
//! PodResources endpoint, which lists each pod the API still holds with the device IDs the test
//! allocated it, as the kubelet does (tests/node-sim/src/pod_resources.rs).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use kube_double::{fixtures, KubeDouble};
use node_sim::*;
use nvidia_ml::Gpu;

const GPU: &str = "nvidia.com/gpu";
const WAIT: Duration = Duration::from_secs(30);

fn time_sliced(replicas: u32) -> String {
    format!("version: v1\nrules:\n  - devices: all\n    timeSlicing: {{replicas: {replicas}}}\n")
}

fn exclusive() -> String {
    "version: v1\nrules:\n  - devices: all\n    exclusive: true\n".to_string()
}

fn mig_7x1g(strategy: &str) -> String {
    format!(
        "version: v1\nplugin:\n  migStrategy: {strategy}\nrules:\n  - devices: all\n    \
         mig: {{1g.10gb: 7}}\n"
    )
}

/// A node whose agent applied `from` (key `from`), with a simulated kubelet.
struct Bed {
    api: Arc<KubeDouble>,
    node: AgentNode,
    kubelet: PodResourcesKubelet,
}

impl Bed {
    fn new(name: &str, gpus: Vec<Gpu>, profiles: &[(&str, String)], from: &str) -> Bed {
        let api = Arc::new(KubeDouble::start());
        profiles_configmap(&api, &[], profiles);
        let mut node = AgentNode::new(&api, name, gpus);
        let kubelet = PodResourcesKubelet::serve(&api, &node.name, &node.pod_resources_socket());
        api.set_node_label(&node.name, PROFILE_LABEL, Some(from));
        node.start_agent(&[], &[]);
        let text = &profiles.iter().find(|(k, _)| *k == from).unwrap().1;
        wait_applied_text(&api, &node, text, WAIT, from);
        Bed { api, node, kubelet }
    }

    /// A pod (owned by a ReplicaSet, no process on the GPU) the kubelet handed `ids`.
    fn holder(&self, pod: &str, resource: &str, ids: &[&str]) {
        self.api.put_pod(fixtures::gpu_pod(
            "default",
            pod,
            &self.node.name,
            &[("app", pod)],
            resource,
            ids.len() as u32,
        ));
        self.kubelet.allocate("default", pod, resource, ids);
    }

    /// Relabel to `key` (whose text is `text`), wait for success, and return the pods evicted
    /// by this change.
    fn change_to(&self, key: &str, text: &str) -> BTreeSet<String> {
        let before = evicted(&self.api);
        self.api
            .set_node_label(&self.node.name, PROFILE_LABEL, Some(key));
        wait_applied_text(&self.api, &self.node, text, WAIT, key);
        evicted(&self.api).difference(&before).cloned().collect()
    }

    fn gpu_uuid(&self, gpu: usize) -> String {
        observe(&self.node.nvml_state()).gpus[gpu]
            .uuid
            .clone()
            .expect("a GPU UUID")
    }

    fn mig_uuids(&self, gpu: usize) -> Vec<String> {
        observe(&self.node.nvml_state()).gpus[gpu]
            .compute_instances
            .iter()
            .filter_map(|ci| ci.uuid.clone())
            .collect()
    }
}

/// The notes of the Events with `reason`.
fn notes(api: &KubeDouble, reason: &str) -> Vec<String> {
    api.events()
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .filter_map(|e| e.note)
        .collect()
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

/// GPU 0 time-sliced `replicas` ways, GPU 1 cut into two 3g.40gb MIG devices either way (the
/// NVIDIA plugin shares every whole GPU of a node alike, so the unchanged device beside the
/// changed one is a MIG device).
fn gpu0_time_sliced(replicas: u32) -> String {
    format!(
        "version: v1\nplugin:\n  migStrategy: mixed\nrules:\n  - devices: [\"0\"]\n    \
         timeSlicing: {{replicas: {replicas}}}\n  - devices: [\"1\"]\n    mig: {{3g.40gb: 2}}\n"
    )
}

/// Replicas 4 → 2 on GPU 0: `::3` is no longer advertised, and `::1`, which the kubelet still
/// counts as its holder's, is one of 2 shares now, not 4 (issue 37 item 3: its holder would run
/// on terms the node no longer offers). Both holders leave; the holder of a MIG device of GPU
/// 1, advertised as before, does not. Back to 4 on GPU 0: its new holder leaves too (more
/// holders per GPU), GPU 1's holder still stays. Before terms were compared, `::1` stayed and 2 → 4 drained nobody.
#[test]
fn a_change_of_replicas_drains_the_holders_of_that_gpu_only() {
    let profiles = [("ts-4", gpu0_time_sliced(4)), ("ts-2", gpu0_time_sliced(2))];
    let bed = Bed::new("gpu-replicas", h100s(2, false), &profiles, "ts-4");
    let gpu0 = bed.gpu_uuid(0);
    let mig = bed.mig_uuids(1)[0].clone();
    bed.holder("on-1", GPU, &[&format!("{gpu0}::1")]);
    bed.holder("on-3", GPU, &[&format!("{gpu0}::3")]);
    bed.holder("other-gpu", "nvidia.com/mig-3g.40gb", &[&mig]);

    let gone = bed.change_to("ts-2", &profiles[1].1);
    assert_eq!(gone, set(&["on-1", "on-3"]), "{}", bed.node.log());
    assert!(bed.api.pod("default", "other-gpu").is_some());
    assert!(
        bed.node.log().contains("is no longer advertised"),
        "the log says why: {}",
        bed.node.log()
    );
    let terms = format!(
        "{gpu0}::1 (nvidia.com/gpu) stays time-sliced but goes from 4 holders to 2 holders"
    );
    assert!(
        notes(&bed.api, "Reallocating")
            .iter()
            .any(|n| n.contains(&terms)),
        "the Event names the change of terms: {:?}",
        notes(&bed.api, "Reallocating")
    );

    bed.holder("on-0", GPU, &[&format!("{gpu0}::0")]);
    let gone = bed.change_to("ts-4", &profiles[0].1);
    assert_eq!(gone, set(&["on-0"]), "more replicas, same names: {gone:?}");
    assert!(bed.api.pod("default", "other-gpu").is_some());
    assert!(!unschedulable(&bed.api, &bed.node.name));
}

/// MPS limits that change under the same IDs and replica count: MPS fixes a client's limits
/// when it connects (reference/h200-mps-measured.md), so the holder keeps half the SMs while
/// the node now offers a quarter to each of the others: it is drained, the Event says why.
#[test]
fn mps_limits_that_change_drain_their_holders() {
    let mps = |pct: u32| {
        format!(
            "version: v1\nrules:\n  - devices: all\n    mps: {{replicas: 2, \
             activeThreadPercentage: {pct}}}\n"
        )
    };
    let profiles = [("mps-50", mps(50)), ("mps-25", mps(25))];
    let bed = Bed::new("gpu-mps-limits", h100s(1, false), &profiles, "mps-50");
    let gpu = bed.gpu_uuid(0);
    bed.holder("client", GPU, &[&format!("{gpu}::0")]);
    let gone = bed.change_to("mps-25", &profiles[1].1);
    assert_eq!(gone, set(&["client"]), "{}", bed.node.log());
    let want = "stays MPS but goes from 2 holders, 50% of the threads each to 2 holders, 25% \
                of the threads each";
    assert!(
        notes(&bed.api, "Reallocating")
            .iter()
            .any(|n| n.contains(want)),
        "{:?}",
        notes(&bed.api, "Reallocating")
    );
}

/// Time-slicing → exclusive: every replica's holder leaves before the GPU is advertised whole
/// (a 2-GPU pod was handed GPUs two time-sliced pods used). And back: the exclusive holder
/// leaves before its GPU is advertised as replicas.
#[test]
fn time_slicing_to_exclusive_and_back_drains_the_holders_of_the_gpus() {
    let profiles = [("ts-4", time_sliced(4)), ("whole", exclusive())];
    let bed = Bed::new("gpu-ts-whole", h100s(2, false), &profiles, "ts-4");
    let (gpu0, gpu1) = (bed.gpu_uuid(0), bed.gpu_uuid(1));
    bed.holder("replica-a", GPU, &[&format!("{gpu0}::0")]);
    bed.holder("replica-b", GPU, &[&format!("{gpu1}::2")]);

    let gone = bed.change_to("whole", &profiles[1].1);
    assert_eq!(gone, set(&["replica-a", "replica-b"]), "{}", bed.node.log());
    assert!(
        notes(&bed.api, "Reallocating")
            .iter()
            .any(|note| note.contains("replica-a") && note.contains("exclusive")),
        "an Event names the pod and why"
    );

    bed.holder("whole-0", GPU, &[&gpu0]);
    let gone = bed.change_to("ts-4", &profiles[0].1);
    assert_eq!(gone, set(&["whole-0"]), "{}", bed.node.log());
}

/// MIG strategy mixed → single keeps every instance but advertises it as `nvidia.com/gpu`
/// instead of `nvidia.com/mig-1g.10gb`: the holders leave (the MIG layout does not change, so
/// nothing else would evict them). Single → mixed the same.
#[test]
fn a_mig_strategy_change_drains_the_holders_of_kept_instances() {
    let profiles = [("mixed", mig_7x1g("mixed")), ("single", mig_7x1g("single"))];
    let bed = Bed::new("gpu-strategy", h100s(1, true), &profiles, "mixed");
    let migs = bed.mig_uuids(0);
    assert_eq!(migs.len(), 7);
    bed.holder("mig-a", "nvidia.com/mig-1g.10gb", &[&migs[0]]);
    let destroyed_before = bed.node.count("nvmlGpuInstanceDestroy");

    let gone = bed.change_to("single", &profiles[1].1);
    assert_eq!(gone, set(&["mig-a"]), "{}", bed.node.log());
    assert_eq!(
        bed.node.count("nvmlGpuInstanceDestroy"),
        destroyed_before,
        "no instance was destroyed: only the advertisement changed"
    );

    bed.holder("mig-b", GPU, &[&migs[1]]);
    let gone = bed.change_to("mixed", &profiles[0].1);
    assert_eq!(gone, set(&["mig-b"]), "{}", bed.node.log());
}

/// An unchanged advertisement asks nothing of the kubelet and drains nothing: a resync of the
/// same profile, or a profile text that differs only in its description.
#[test]
fn the_same_advertisement_drains_nobody() {
    let same = format!("description: same devices\n{}", time_sliced(4));
    let profiles = [("ts-4", time_sliced(4)), ("ts-4-again", same)];
    let bed = Bed::new("gpu-same", h100s(1, false), &profiles, "ts-4");
    let gpu = bed.gpu_uuid(0);
    bed.holder("on-2", GPU, &[&format!("{gpu}::2")]);
    let gone = bed.change_to("ts-4-again", &profiles[1].1);
    assert!(gone.is_empty(), "{gone:?}");
    assert!(notes(&bed.api, "Reallocating").is_empty());
}

/// Time-slicing → MPS with the same replica IDs under the same resource: the IDs stay, but the
/// GPU is now shared through an MPS daemon its time-sliced holder is no client of. The agent
/// knows how the IDs were shared from the advertisement it saved at the last apply.
#[test]
fn the_same_ids_shared_through_mps_instead_of_time_slicing_drain_their_holders() {
    let mps = "version: v1\nrules:\n  - devices: all\n    mps: {replicas: 2}\n".to_string();
    let profiles = [("ts-2", time_sliced(2)), ("mps-2", mps)];
    let bed = Bed::new("gpu-ts-mps", h100s(1, false), &profiles, "ts-2");
    let gpu = bed.gpu_uuid(0);
    bed.holder("sliced", GPU, &[&format!("{gpu}::0")]);
    let gone = bed.change_to("mps-2", &profiles[1].1);
    assert_eq!(gone, set(&["sliced"]), "{}", bed.node.log());
    assert!(
        notes(&bed.api, "Reallocating")
            .iter()
            .any(|n| n.contains("goes from time-sliced to MPS")),
        "{:?}",
        notes(&bed.api, "Reallocating")
    );
}

/// `gpu-share plan --advertised` reads the advertisement the agent saved (its state dir's
/// `advertised.json`) and says per device ID, before any label changes, whose holder a change
/// would evict and why: the same verdicts the agent then acts on (replicas 4 → 2 on GPU 0
/// above, GPU 1 unchanged).
#[test]
fn plan_says_per_device_whose_holder_a_change_evicts() {
    let profiles = [("ts-4", gpu0_time_sliced(4)), ("ts-2", gpu0_time_sliced(2))];
    let bed = Bed::new("gpu-plan", h100s(2, false), &profiles, "ts-4");
    let gpu = bed.gpu_uuid(0);
    let mut migs = bed.mig_uuids(1);
    migs.sort();
    let dir = tempfile::tempdir().unwrap();
    let (profile, current) = (dir.path().join("ts-2.yaml"), dir.path().join("node.json"));
    std::fs::write(&profile, &profiles[1].1).unwrap();
    let observed = observe(&bed.node.nvml_state());
    std::fs::write(&current, serde_json::to_string(&observed).unwrap()).unwrap();
    let advertised = bed.node.path("state/advertised.json");
    let plan = |output: &str| {
        let out = std::process::Command::new(gpu_share_bin())
            .args(["plan", "-o", output, "--profile"])
            .arg(&profile)
            .arg("--current")
            .arg(&current)
            .arg("--advertised")
            .arg(&advertised)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let json: serde_json::Value = serde_json::from_str(&plan("json")).unwrap();
    let verdicts = json["reallocation"]
        .as_array()
        .expect("a reallocation list");
    let evicts: Vec<(String, bool)> = verdicts
        .iter()
        .map(|v| {
            (
                v["id"].as_str().unwrap().to_string(),
                v["evictsHolder"].as_bool().unwrap(),
            )
        })
        .collect();
    let mut expected: Vec<(String, bool)> = (0..4).map(|r| (format!("{gpu}::{r}"), true)).collect();
    expected.extend(migs.iter().map(|m| (m.clone(), false)));
    expected.sort();
    assert_eq!(evicts, expected);
    let text = plan("text");
    assert!(
        text.contains("a pod holding one of 4 of 6 is evicted first"),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "holder evicted  {gpu}::3: {gpu}::3 (nvidia.com/gpu) is no longer advertised"
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "holder evicted  {gpu}::0: {gpu}::0 (nvidia.com/gpu) stays time-sliced but goes \
             from 4 holders to 2 holders"
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!("holder stays    {}:", migs[0])),
        "{text}"
    );
}

/// The agent keeps its connection to the kubelet's PodResources socket between label changes
/// (a dial and handshake per change were most of the 2 ms it cost; benches/README.md). A
/// kubelet that restarts closes it: the next `List` must not fail for that (a failed List
/// drains nobody), but dial again and read the new kubelet's answer.
#[test]
fn a_restarted_kubelet_is_asked_again_on_a_new_connection() {
    use gpu_share::kubelet::pod_resources::list;
    let api = Arc::new(KubeDouble::start());
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("pod-resources/kubelet.sock");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let pods = |socket: &std::path::Path| -> Vec<String> {
        let answer = runtime.block_on(list(socket, Duration::from_secs(10)));
        let answer = answer.unwrap_or_else(|e| panic!("List failed: {e}"));
        answer.pod_resources.into_iter().map(|p| p.name).collect()
    };
    let pod = |name: &str| fixtures::gpu_pod("default", name, "node-k", &[("app", name)], GPU, 1);
    api.put_pod(pod("before"));
    let kubelet = PodResourcesKubelet::serve(&api, "node-k", &socket);
    kubelet.allocate("default", "before", GPU, &["GPU-a"]);
    assert_eq!(pods(&socket), ["before"]);
    assert_eq!(
        pods(&socket),
        ["before"],
        "the kept connection answers again"
    );
    drop(kubelet);
    api.put_pod(pod("after"));
    let kubelet = PodResourcesKubelet::serve(&api, "node-k", &socket);
    kubelet.allocate("default", "after", GPU, &["GPU-b"]);
    let answer = pods(&socket);
    assert!(
        answer.contains(&"after".to_string()),
        "the restarted kubelet's answer: {answer:?}"
    );
}
