//! The drain asks the kubelet's PodResources API which pods hold the GPU devices a MIG change
//! takes away, so a pod that holds a device but has no CUDA process on it at that moment (an
//! inference server between requests, a pod still loading its model) is evicted too, while the
//! holders of devices that stay keep running.
//!
//! The real agent binary runs against the API double, the fake NVML and a simulated kubelet
//! whose PodResources endpoint (tests/node-sim/src/pod_resources.rs) answers `List` as the
//! kubelet does: the pods bound to the node with the device IDs their containers were handed.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use kube_double::{fixtures, KubeDouble, Verb};
use node_sim::*;

/// The MIG device UUID of the GPU instance at `start` on GPU 0.
fn mig_uuid(node: &AgentNode, start: u32) -> String {
    let gi = node.gi_at(0, start);
    observe(&node.nvml_state()).gpus[0]
        .compute_instances
        .iter()
        .find(|ci| ci.gi_id == gi)
        .and_then(|ci| ci.uuid.clone())
        .expect("a MIG device UUID")
}

/// A pod in `default` on `node` that requested one `resource` and was handed `ids`; it runs
/// no process on the GPU.
fn idle_holder(
    api: &KubeDouble,
    kubelet: &PodResourcesKubelet,
    node: &str,
    pod: &str,
    resource: &str,
    ids: &[&str],
) {
    api.put_pod(fixtures::gpu_pod(
        "default",
        pod,
        node,
        &[("app", pod)],
        resource,
        1,
    ));
    kubelet.allocate("default", pod, resource, ids);
}

#[test]
fn an_idle_pod_holding_a_destroyed_mig_device_is_evicted_and_holders_of_kept_ones_stay() {
    let api = Arc::new(KubeDouble::start());
    profiles_configmap(&api, &["h100-balanced", "h100-inference"], &[]);
    let mut node = AgentNode::new(&api, "gpu-idle-mig", h100s(1, true));
    let kubelet = PodResourcesKubelet::serve(&api, &node.name, &node.pod_resources_socket());
    api.set_node_label(&node.name, PROFILE_LABEL, Some("h100-balanced"));
    node.start_agent(&[], &[]);
    wait_applied(&api, &node, "h100-balanced", Duration::from_secs(30));

    // h100-inference keeps the 1g.10gb at 0 and destroys the 3g.40gb at 4.
    let (destroyed, kept) = (mig_uuid(&node, 4), mig_uuid(&node, 0));
    idle_holder(
        &api,
        &kubelet,
        &node.name,
        "on-3g",
        "nvidia.com/mig-3g.40gb",
        &[&destroyed],
    );
    idle_holder(
        &api,
        &kubelet,
        &node.name,
        "on-1g",
        "nvidia.com/mig-1g.10gb",
        &[&kept],
    );
    api.set_node_label(&node.name, PROFILE_LABEL, Some("h100-inference"));
    wait_applied(&api, &node, "h100-inference", Duration::from_secs(30));

    assert!(kubelet.lists() >= 1, "the agent asked the kubelet");
    assert_eq!(
        evicted(&api),
        BTreeSet::from(["on-3g".to_string()]),
        "only the holder of the destroyed device is evicted\n{}",
        node.log()
    );
    assert!(api.pod("default", "on-3g").is_none());
    assert!(
        api.pod("default", "on-1g").is_some(),
        "the kept device's holder runs on"
    );
    assert!(direct_pod_deletes(&api).is_empty());
    assert!(!unschedulable(&api, &node.name));
}

#[test]
fn a_replica_of_a_gpu_that_turns_to_mig_is_evicted_and_replicas_of_the_other_gpu_stay() {
    let api = Arc::new(KubeDouble::start());
    // GPU 0 goes from time-slicing to MIG; GPU 1 stays time-sliced, advertised as before
    // (renamed `.shared`: without the rename its replicas would change resource, which
    // re-allocates them, tests/reallocation.rs).
    let split = "version: v1\nplugin: {renameByDefault: true}\nrules:\n  - devices: [0]\n    \
                 mig: {1g.10gb: 7}\n  - devices: [1]\n    timeSlicing: {replicas: 4}\n"
        .to_string();
    profiles_configmap(&api, &["homelab-timeslice"], &[("split", split.clone())]);
    let mut node = AgentNode::new(&api, "gpu-idle-replica", h100s(2, false));
    let kubelet = PodResourcesKubelet::serve(&api, &node.name, &node.pod_resources_socket());
    api.set_node_label(&node.name, PROFILE_LABEL, Some("homelab-timeslice"));
    node.start_agent(&[], &[]);
    wait_applied(&api, &node, "homelab-timeslice", Duration::from_secs(30));

    let gpu_uuids: Vec<String> = observe(&node.nvml_state())
        .gpus
        .iter()
        .map(|g| g.uuid.clone().expect("a GPU UUID"))
        .collect();
    // Replica IDs as the device plugins advertise them: `<uuid>::<n>`.
    let (on_0, on_1) = (
        format!("{}::2", gpu_uuids[0]),
        format!("{}::1", gpu_uuids[1]),
    );
    idle_holder(
        &api,
        &kubelet,
        &node.name,
        "replica-0",
        "nvidia.com/gpu.shared",
        &[&on_0],
    );
    idle_holder(
        &api,
        &kubelet,
        &node.name,
        "replica-1",
        "nvidia.com/gpu.shared",
        &[&on_1],
    );
    api.set_node_label(&node.name, PROFILE_LABEL, Some("split"));
    wait_applied_text(&api, &node, &split, Duration::from_secs(30), "split");

    assert_eq!(
        evicted(&api),
        BTreeSet::from(["replica-0".to_string()]),
        "only the replica of the GPU whose MIG mode changed is evicted\n{}",
        node.log()
    );
    assert!(api.pod("default", "replica-1").is_some());
}

#[test]
fn without_a_kubelet_to_ask_the_drain_goes_on_with_the_gpu_processes_and_says_so() {
    let api = Arc::new(KubeDouble::start());
    profiles_configmap(&api, &["h100-balanced", "h100-inference"], &[]);
    let mut node = AgentNode::new(&api, "gpu-no-kubelet", h100s(1, true));
    api.set_node_label(&node.name, PROFILE_LABEL, Some("h100-balanced"));
    node.start_agent(&[], &[]);
    wait_applied(&api, &node, "h100-balanced", Duration::from_secs(30));
    let busy = node.gi_at(0, 4);
    node.add_workloads(&api, &[Workload::on_mig("busy", 4101, 0, busy)]);
    api.set_node_label(&node.name, PROFILE_LABEL, Some("h100-inference"));
    wait_applied(&api, &node, "h100-inference", Duration::from_secs(30));

    assert_eq!(evicted(&api), BTreeSet::from(["busy".to_string()]));
    let log = node.log();
    assert!(
        log.contains("cannot ask the kubelet which pods hold the GPU devices that change"),
        "{log}"
    );
}

const DEVICES_IN_USE: &str = "gpu-share.dev/devices-in-use";

/// The node's devices-in-use annotation, read as JSON (null when absent).
fn devices_in_use(api: &KubeDouble, node: &str) -> serde_json::Value {
    annotation(api, node, DEVICES_IN_USE)
        .map(|text| serde_json::from_str(&text).expect("the annotation is JSON"))
        .unwrap_or_default()
}

/// The agent publishes which device each pod holds, as advise's demand names devices (GPU
/// index, MIG placement start and profile), from the kubelet's PodResources `List` and the
/// GPUs NVML reports; it rewrites the annotation when a pod's devices change and not otherwise.
#[test]
fn the_agent_publishes_each_pods_devices_by_gpu_and_placement_and_rewrites_only_changes() {
    let api = Arc::new(KubeDouble::start());
    profiles_configmap(&api, &["h100-balanced"], &[]);
    let mut node = AgentNode::new(&api, "gpu-in-use", h100s(1, true));
    let kubelet = PodResourcesKubelet::serve(&api, &node.name, &node.pod_resources_socket());
    api.set_node_label(&node.name, PROFILE_LABEL, Some("h100-balanced"));
    node.start_agent(&[], &[]);
    wait_applied(&api, &node, "h100-balanced", Duration::from_secs(30));

    let (on_3g, on_1g) = (mig_uuid(&node, 4), mig_uuid(&node, 0));
    idle_holder(
        &api,
        &kubelet,
        &node.name,
        "medium",
        "nvidia.com/mig-3g.40gb",
        &[&on_3g],
    );
    let want_medium = serde_json::json!({
        "default/medium": [{"gpu": 0, "migPlacementStart": 4, "migProfile": "3g.40gb"}]
    });
    // The resync (2 s in node-sim) publishes it.
    assert!(
        poll(Duration::from_secs(20), Duration::from_millis(100), || {
            devices_in_use(&api, &node.name) == want_medium
        }),
        "got {}\n{}",
        devices_in_use(&api, &node.name),
        node.log()
    );

    // Nothing changes: two more resyncs write nothing to the Node.
    api.clear_requests();
    std::thread::sleep(Duration::from_secs(5));
    let node_patches = api
        .requests()
        .iter()
        .filter(|r| r.resource == "nodes" && r.verb == Verb::Patch)
        .count();
    assert_eq!(node_patches, 0, "an unchanged annotation is not rewritten");
    assert!(
        kubelet.lists() >= 3,
        "yet the kubelet was asked on each pass"
    );

    idle_holder(
        &api,
        &kubelet,
        &node.name,
        "small",
        "nvidia.com/mig-1g.10gb",
        &[&on_1g],
    );
    let mut want_both = want_medium.clone();
    want_both["default/small"] =
        serde_json::json!([{"gpu": 0, "migPlacementStart": 0, "migProfile": "1g.10gb"}]);
    assert!(
        poll(Duration::from_secs(20), Duration::from_millis(100), || {
            devices_in_use(&api, &node.name) == want_both
        }),
        "got {}",
        devices_in_use(&api, &node.name)
    );
}

/// Without the kubelet's PodResources socket the agent still applies profiles: it logs that it
/// cannot say which pods hold which devices and publishes nothing.
#[test]
fn no_kubelet_socket_publishes_nothing_and_fails_nothing() {
    let api = Arc::new(KubeDouble::start());
    profiles_configmap(&api, &["h100-balanced"], &[]);
    let mut node = AgentNode::new(&api, "gpu-no-kubelet", h100s(1, true));
    api.set_node_label(&node.name, PROFILE_LABEL, Some("h100-balanced"));
    node.start_agent(&[], &[]);
    wait_applied(&api, &node, "h100-balanced", Duration::from_secs(30));
    assert!(
        poll(Duration::from_secs(10), Duration::from_millis(100), || {
            node.log()
                .contains("cannot read which pods hold which devices")
        }),
        "{}",
        node.log()
    );
    assert_eq!(state_of(&api, &node.name).as_deref(), Some("success"));
    assert_eq!(annotation(&api, &node.name, DEVICES_IN_USE), None);
}
