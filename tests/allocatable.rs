//! `success` waits for the node to advertise the plan: the Node's `status.allocatable` must
//! show each planned resource with its planned count (src/agent/allocatable.rs). Measured on a
//! real kubelet with NVIDIA's plugin: the plugin exited on a new config, the agent said
//! `success`, the node advertised `nvidia.com/gpu: 0`.
//!
//! The NVIDIA plugin here is node-sim's double (tests/node-sim/src/nvidia_plugin.rs: NVIDIA's
//! counting rules over the config the agent wrote and the fake NVML's GPUs, published on the
//! Node as the kubelet's status update does); a test stops it as a plugin that dies on reload.
//! For the built-in plugin, node-sim's device-plugin kubelet turns its `ListAndWatch` lists into
//! the Node's allocatable.

use std::sync::Arc;
use std::time::Duration;

use kube_double::KubeDouble;
use node_sim::*;

fn time_sliced(replicas: u32) -> String {
    format!("version: v1\nrules:\n  - devices: all\n    timeSlicing: {{replicas: {replicas}}}\n")
}

fn event_notes(api: &KubeDouble, reason: &str) -> Vec<String> {
    api.events()
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .filter_map(|e| e.note)
        .collect()
}

/// With the plugin up, `success` comes once the node advertises what `gpu-share plan` says.
#[test]
fn success_comes_with_the_planned_allocatable() {
    let api = Arc::new(KubeDouble::start());
    profiles_configmap(&api, &["h100-inference"], &[]);
    let mut node = AgentNode::new(&api, "gpu-alloc-ok", h100s(8, true));
    api.set_node_label(&node.name, PROFILE_LABEL, Some("h100-inference"));
    node.start_agent(&[], &[]);
    wait_applied(&api, &node, "h100-inference", Duration::from_secs(60));
    let seen = gpu_allocatable(&api, &node.name);
    assert_eq!(seen.get("nvidia.com/gpu"), Some(&16), "{seen:?}");
    assert_eq!(seen.get("nvidia.com/mig-1g.10gb"), Some(&28), "{seen:?}");
}

/// A plugin that dies on the new config: the change fails, naming the resource with its
/// expected and seen counts (state, Event, metric); once the plugin is back the retry
/// publishes `success` without a label change.
#[test]
fn a_plugin_that_dies_on_reload_fails_the_change_until_it_is_back() {
    let api = Arc::new(KubeDouble::start());
    let profiles = [("ts-4", time_sliced(4)), ("ts-2", time_sliced(2))];
    profiles_configmap(&api, &[], &profiles);
    let mut node = AgentNode::new(&api, "gpu-alloc-dies", h100s(2, false));
    api.set_node_label(&node.name, PROFILE_LABEL, Some("ts-4"));
    node.start_agent(&["--allocatable-timeout", "1s"], &[]);
    wait_applied_text(&api, &node, &profiles[0].1, Duration::from_secs(30), "ts-4");

    node.stop_nvidia_plugin();
    api.set_node_label(&node.name, PROFILE_LABEL, Some("ts-2"));
    wait_state(&api, &node, "failed", Duration::from_secs(30));
    let reason = annotation(&api, &node.name, REASON).unwrap_or_default();
    assert!(
        reason.contains("nvidia.com/gpu: expected 4, seen 0"),
        "the reason names the resource and both counts: {reason}"
    );
    assert!(
        api.wait_until(Duration::from_secs(10), |a| {
            a.events()
                .iter()
                .any(|e| e.reason.as_deref() == Some("AllocatableMismatch"))
        }),
        "an AllocatableMismatch Event"
    );
    let metrics = http_get(node.http_port(), "/metrics").unwrap_or_default();
    assert!(
        metric(
            &metrics,
            "gpu_share_reconcile_failures_total{reason=\"AllocatableMismatch\"}"
        )
        .is_some_and(|n| n >= 1.0),
        "{metrics}"
    );
    assert!(metric(&metrics, "gpu_share_state{state=\"failed\"}") == Some(1.0));

    node.start_nvidia_plugin();
    // The first retry comes 5 s after the failure.
    wait_applied_text(&api, &node, &profiles[1].1, Duration::from_secs(30), "ts-2");
    assert!(event_notes(&api, "AllocatableMismatch")
        .iter()
        .all(|n| n.contains("expected 4, seen 0")));
}

/// The built-in plugin with no kubelet to register with advertises nothing: the apply fails
/// as above; once the kubelet is there the plugin registers and the retry succeeds.
#[test]
fn the_builtin_plugin_without_a_kubelet_fails_until_one_is_there() {
    let api = Arc::new(KubeDouble::start());
    profiles_configmap(&api, &["exclusive"], &[]);
    let mut node = AgentNode::new(&api, "gpu-alloc-builtin", h100s(2, false));
    let dp_dir = node.path("device-plugins");
    api.set_node_label(&node.name, PROFILE_LABEL, Some("exclusive"));
    node.start_agent(
        &[
            "--plugin",
            "builtin",
            "--device-plugin-dir",
            dp_dir.to_str().unwrap(),
            "--allocatable-timeout",
            "1s",
        ],
        &[],
    );
    wait_state(&api, &node, "failed", Duration::from_secs(30));
    let reason = annotation(&api, &node.name, REASON).unwrap_or_default();
    assert!(
        reason.contains("nvidia.com/gpu: expected 2, seen 0"),
        "{reason}\n{}",
        node.log()
    );
    let _kubelet = DevicePluginKubelet::serve(&api, &node.name, &dp_dir);
    wait_applied(&api, &node, "exclusive", Duration::from_secs(30));
    assert_eq!(
        gpu_allocatable(&api, &node.name).get("nvidia.com/gpu"),
        Some(&2)
    );
}

/// A change that cordons the node (here a MIG change) uncordons it only once the node
/// advertises the plan. Uncordoned while the device plugin restarts on its new config, the
/// scheduler still sees the old allocatable and binds pods that the kubelet then rejects: seen
/// on the real kubelet 1.36 with NVIDIA's plugin v0.20.0 (docs/testbed/in-cluster.sh,
/// time-slicing to exclusive with three holders: the Deployment's new pods failed with
/// UnexpectedAdmissionError "Allocate failed due to requested number of devices unavailable",
/// some twenty of them, until the plugin was back).
#[test]
fn a_cordoned_change_stays_cordoned_until_the_node_advertises_the_plan() {
    let api = Arc::new(KubeDouble::start());
    let mig =
        |layout: &str| format!("version: v1\nrules:\n  - devices: all\n    mig: {{{layout}}}\n");
    let profiles = [("mig-3g", mig("3g.40gb: 2")), ("mig-1g", mig("1g.10gb: 7"))];
    profiles_configmap(&api, &[], &profiles);
    let mut node = AgentNode::new(&api, "gpu-alloc-cordon", h100s(2, true));
    api.set_node_label(&node.name, PROFILE_LABEL, Some("mig-3g"));
    node.start_agent(&["--allocatable-timeout", "60s"], &[]);
    wait_applied_text(
        &api,
        &node,
        &profiles[0].1,
        Duration::from_secs(30),
        "mig-3g",
    );

    node.stop_nvidia_plugin();
    api.set_node_label(&node.name, PROFILE_LABEL, Some("mig-1g"));
    // The sign that the MIG change is applied and the agent waits for the plugin.
    let waiting = "waiting for the node to advertise what profile mig-1g plans";
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !node.log().contains(waiting) {
        assert!(std::time::Instant::now() < deadline, "{}", node.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    let cordoned = |api: &KubeDouble| {
        api.node(&node.name)
            .and_then(|n| n.spec?.unschedulable)
            .unwrap_or(false)
    };
    assert!(
        cordoned(&api),
        "the node is cordoned while its plugin does not advertise the plan"
    );
    assert_ne!(state_of(&api, &node.name).as_deref(), Some("success"));

    node.start_nvidia_plugin();
    wait_applied_text(
        &api,
        &node,
        &profiles[1].1,
        Duration::from_secs(30),
        "mig-1g",
    );
    assert!(!cordoned(&api), "uncordoned once the plan is advertised");
    // Every GPU the same MIG layout: the derived strategy is `single`, instances as nvidia.com/gpu.
    let seen = gpu_allocatable(&api, &node.name);
    assert_eq!(seen.get("nvidia.com/gpu"), Some(&14), "{seen:?}");
}
