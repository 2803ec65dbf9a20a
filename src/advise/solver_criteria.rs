//! Each test pins one of the solver's criteria or their order (module doc of `solver`), and
//! plans every proposal: a proposal that does not plan would fail `validate`/`plan` on the node.

use super::*;
use crate::plan::plan_for;

fn run(supply: &str, demand: &str, plugin: PluginKind) -> Advice {
    let supply: Supply = parse("supply", supply).unwrap();
    let demand: Demand = parse("demand", demand).unwrap();
    let advice = advise(&demand, &supply, plugin).unwrap();
    for (node, advice_node) in supply.nodes.iter().zip(&advice.nodes) {
        assert!(
            advice_node.problems.is_empty(),
            "{:?}",
            advice_node.problems
        );
        let now = node.now(plugin).unwrap();
        plan_for(
            &advice_node.profile_key,
            &advice_node.profile,
            &now.observed,
            plugin,
        )
        .unwrap_or_else(|p| panic!("proposal for {} does not plan: {p:?}", node.name));
    }
    advice
}

/// One H100 cut into seven 1g.10gb instances, as its current profile says.
const SEVEN_SMALL: &str = "
nodes:
  - name: n1
    gpus: [h100]
    profileName: small
    profile: {version: v1, rules: [{devices: all, mig: {1g.10gb: 7}}]}
";

const ONE_SMALL_RUNNING: &str =
    "  - {name: run-0, node: n1, phase: running, requests: {nvidia.com/mig-1g.10gb: 1}}\n";

fn pending(name: &str, resource: &str) -> String {
    format!("  - {{name: {name}, phase: pending, requests: {{{resource}: 1}}}}\n")
}

#[test]
fn unschedulable_demand_outranks_destroying_free_instances() {
    let demand = format!("pods:\n{}", pending("big", "nvidia.com/mig-3g.40gb"));
    let advice = run(SEVEN_SMALL, &demand, PluginKind::Nvidia);
    assert!(
        advice.unschedulable.is_empty(),
        "{:?}",
        advice.unschedulable
    );
    assert_eq!(
        advice.nodes[0].profile.rules[0].mig.as_ref().unwrap()["3g.40gb"],
        1
    );
    assert!(advice.totals.instances_destroyed > 0);
}

/// Evicting run-0 would let the 7g.80gb fit, but run-0 would then wait instead: the same
/// unschedulable count, one eviction more. The running pod keeps its instance.
#[test]
fn running_pods_outrank_a_pending_pod_that_fits_only_by_evicting() {
    let demand = format!(
        "pods:\n{ONE_SMALL_RUNNING}{}",
        pending("whole-mig", "nvidia.com/mig-7g.80gb")
    );
    let advice = run(SEVEN_SMALL, &demand, PluginKind::Nvidia);
    assert_eq!(advice.totals.pods_evicted, 0);
    assert_eq!(advice.nodes[0].pods, ["default/run-0"]);
    assert_eq!(advice.unschedulable.len(), 1);
    assert_eq!(advice.unschedulable[0].pod, "default/whole-mig");
    assert!(advice.unschedulable[0]
        .reason
        .contains("without moving running pods"));
    assert_eq!(advice.totals.instances_destroyed, 0);
}

/// GPU 0 holds a 3g.40gb (a running pod's) and two free 2g.20gb. It could take a second
/// 3g.40gb by destroying the two free instances and leave GPU 1 idle; destroying ranks above
/// GPUs used, so GPU 1 is taken. (With the two criteria swapped in `Cost`, this fails.)
#[test]
fn destroying_instances_outranks_using_another_gpu() {
    let supply = "
nodes:
  - name: n1
    gpus: [h100x2]
    profileName: mixed
    profile: {version: v1, rules: [{devices: [0], mig: {3g.40gb: 1, 2g.20gb: 2}}, {devices: [1], exclusive: true}]}
";
    let demand = "pods:
  - {name: run-0, node: n1, phase: running, requests: {nvidia.com/mig-3g.40gb: 1}}
  - {name: big, phase: pending, requests: {nvidia.com/mig-3g.40gb: 1}}
";
    let advice = run(supply, demand, PluginKind::Nvidia);
    let node = &advice.nodes[0];
    assert!(advice.unschedulable.is_empty());
    assert_eq!(node.instances_destroyed, 0);
    assert_eq!(node.gpus_used, [0, 1]);
    let rules = &node.profile.rules;
    assert_eq!(
        rules[0].mig.as_ref().unwrap().len(),
        2,
        "GPU 0 keeps its layout"
    );
    assert_eq!(
        rules[1].devices,
        crate::profile::DeviceSelector::Indices(vec![1])
    );
    assert_eq!(rules[1].mig.as_ref().unwrap()["3g.40gb"], 1);
}

/// The same node without GPU 1: destroying the free instances is now the only way to serve
/// the pending pod, and unschedulable demand ranks first.
#[test]
fn free_instances_of_other_profiles_are_destroyed_to_serve_a_pod() {
    let supply = "
nodes:
  - name: n1
    gpus: [h100]
    profileName: mixed
    profile: {version: v1, rules: [{devices: all, mig: {3g.40gb: 1, 2g.20gb: 2}}]}
";
    let demand = "pods:
  - {name: run-0, node: n1, phase: running, requests: {nvidia.com/mig-3g.40gb: 1}}
  - {name: big, phase: pending, requests: {nvidia.com/mig-3g.40gb: 1}}
";
    let advice = run(supply, demand, PluginKind::Nvidia);
    assert!(advice.unschedulable.is_empty());
    assert_eq!(advice.totals.instances_destroyed, 2);
    assert_eq!(advice.totals.pods_evicted, 0);
    assert_eq!(
        advice.nodes[0].profile.rules[0].mig.as_ref().unwrap()["3g.40gb"],
        2
    );
}

/// With nothing to destroy either way, pending pods fill a GPU before the next one is used.
#[test]
fn gpus_used_are_minimised_last_by_best_fit() {
    let supply = "nodes:\n  - {name: n1, gpus: [h100x2]}\n  - {name: n2, gpus: [h100x2]}\n";
    let demand = format!(
        "pods:\n{}{}{}",
        pending("a", "nvidia.com/mig-3g.40gb"),
        pending("b", "nvidia.com/mig-1g.10gb"),
        pending("c", "nvidia.com/mig-2g.20gb")
    );
    let advice = run(supply, &demand, PluginKind::Nvidia);
    assert!(advice.unschedulable.is_empty());
    assert_eq!(advice.totals.gpus_used, 1);
    assert_eq!(advice.totals.gpus_idle, 3);
    assert_eq!(advice.nodes[0].pods.len(), 3);
}

/// A running pod's resource the node does not have now: evicted, and placed again.
#[test]
fn a_running_pod_without_its_device_is_evicted_and_placed_again() {
    let demand = "pods:\n  - {name: lost, node: n1, phase: running, requests: {nvidia.com/mig-2g.20gb: 1}}\n";
    let advice = run(SEVEN_SMALL, demand, PluginKind::Nvidia);
    assert_eq!(advice.nodes[0].pods_evicted, ["default/lost"]);
    assert_eq!(advice.totals.pods_evicted, 1);
    assert!(advice.unschedulable.is_empty());
    assert_eq!(advice.nodes[0].pods, ["default/lost"]);
}

/// The NVIDIA plugin refuses MPS on a node with MIG devices; the built-in plugin does not.
#[test]
fn the_plugin_decides_whether_mps_may_sit_beside_mig() {
    let supply = "
nodes:
  - name: n1
    gpus: [h100x2]
    profileName: small
    profile: {version: v1, rules: [{devices: [0], mig: {1g.10gb: 7}}, {devices: [1], exclusive: true}]}
";
    let demand = format!(
        "pods:\n{ONE_SMALL_RUNNING}  - {{name: m, phase: pending, requests: {{nvidia.com/gpu: 1}}, annotations: {{gpu-share.dev/isolation: mps, gpu-share.dev/memory-gib: '20'}}}}\n"
    );
    let nvidia = run(supply, &demand, PluginKind::Nvidia);
    assert_eq!(nvidia.unschedulable.len(), 1);
    let builtin = run(supply, &demand, PluginKind::Builtin);
    assert!(builtin.unschedulable.is_empty());
    let mps = builtin.nodes[0]
        .profile
        .rules
        .iter()
        .find_map(|r| r.mps.as_ref())
        .unwrap();
    assert_eq!(mps.pinned_memory_limit.as_deref(), Some("20480Mi"));
    assert_eq!(mps.replicas, 2);
}

/// Three shared pods: one GPU time-sliced, replicas rounded up to the step (4), the other idle.
#[test]
fn shared_pods_size_time_slicing_replicas_in_steps() {
    let supply = "nodes:\n  - {name: n1, gpus: [h100x2]}\n";
    let shared = |n: &str| {
        format!("  - {{name: {n}, phase: pending, requests: {{nvidia.com/gpu: 1}}, annotations: {{gpu-share.dev/isolation: shared}}}}\n")
    };
    let demand = format!("pods:\n{}{}{}", shared("a"), shared("b"), shared("c"));
    let advice = run(supply, &demand, PluginKind::Nvidia);
    let node = &advice.nodes[0];
    assert_eq!(node.gpus_used, [0]);
    // The NVIDIA plugin time-slices every whole GPU of the node alike: the idle one too.
    assert_eq!(node.profile.rules.len(), 1);
    assert_eq!(
        node.profile.rules[0]
            .time_slicing
            .as_ref()
            .unwrap()
            .replicas,
        4
    );
    assert_eq!(node.resources["nvidia.com/gpu"], 8);
}

/// A memory need picks the smallest profile holding it on the GPU it lands on (fewest slices
/// on a tie: the H100 1g.20gb, 19.62 GiB, before the 2g.20gb).
#[test]
fn a_memory_need_picks_the_smallest_profile_per_model() {
    let sized = "pods:\n  - {name: s, phase: pending, requests: {nvidia.com/gpu: 1}, annotations: {gpu-share.dev/isolation: mig, gpu-share.dev/memory-gib: '15'}}\n";
    let h100 = run(
        "nodes:\n  - {name: n1, gpus: [h100]}\n",
        sized,
        PluginKind::Nvidia,
    );
    assert!(h100.nodes[0].profile.rules[0]
        .mig
        .as_ref()
        .unwrap()
        .contains_key("1g.20gb"));
    let h200 = run(
        "nodes:\n  - {name: n1, gpus: [h200]}\n",
        sized,
        PluginKind::Nvidia,
    );
    assert!(h200.nodes[0].profile.rules[0]
        .mig
        .as_ref()
        .unwrap()
        .contains_key("1g.18gb"));
}

#[test]
fn input_errors_name_the_pod_or_node() {
    let supply: Supply = parse(
        "supply",
        "nodes:\n  - {name: n1, gpus: [h100]}\n  - {name: n1, gpus: [h100]}\n",
    )
    .unwrap();
    let demand: Demand = parse(
        "demand",
        "pods:\n  - {name: r, phase: running, requests: {nvidia.com/gpu: 1}}\n",
    )
    .unwrap();
    let errors = advise(&demand, &supply, PluginKind::Nvidia).unwrap_err();
    assert!(
        errors
            .iter()
            .any(|e| e == "node n1: listed twice in the supply"),
        "{errors:?}"
    );
    assert!(
        errors
            .iter()
            .any(|e| e == "pod default/r: running, but no node given"),
        "{errors:?}"
    );
}

/// Offline, which 1g.10gb instance run-0 holds is unknown, so none of that profile is
/// destroyed on its GPU: the 3g.40gb (which fits only by destroying four of them) waits.
#[test]
fn instances_of_a_profile_running_pods_use_are_never_destroyed() {
    let demand = format!(
        "pods:\n{ONE_SMALL_RUNNING}{}",
        pending("big", "nvidia.com/mig-3g.40gb")
    );
    let advice = run(SEVEN_SMALL, &demand, PluginKind::Nvidia);
    assert_eq!(advice.totals.instances_destroyed, 0);
    assert_eq!(advice.unschedulable.len(), 1);
    assert_eq!(advice.nodes[0].pods, ["default/run-0"]);
}
