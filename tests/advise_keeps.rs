//! advise changes only what demand requires (src/advise/keep.rs). Property: for any node and a
//! demand its current profile already serves, advise proposes no change at all: the current
//! profile under its current key, no pod evicted, no instance destroyed; the agent, seeing the
//! same label and text, does nothing. Measured before this on a real cluster: with no new
//! demand advise dropped an MPS rule's `activeThreadPercentage: 25`, and applying its proposal
//! restarted every MPS daemon on the node.
//!
//! "Any node": every example profile (profiles/, profiles/builtin/) on the GPUs it is written
//! for, with each plugin that accepts it. "A demand it serves": no pods, and running pods on the
//! node as its plan serves them: half of each GPU's instances or replicas.

use std::path::Path;

use gpu_share::advise::{advise, Demand, Phase, PodDemand, Supply, SupplyNode};
use gpu_share::plan::{plan_for, NodePlan, ObservedNode};
use gpu_share::profile::{parse_profile, Profile};
use gpu_share::sharing::{PlannedMode, PluginKind};
use gpu_share::validate::validate_for;

/// The GPUs an example profile is written for.
fn gpus_for(name: &str) -> &'static str {
    match name {
        "a100-40gb-mixed" => "a100-40gbx2",
        "a100-80gb-single" => "a100-80gbx2",
        "h200-mig-timeslice" => "h200x4",
        _ => "h100x8",
    }
}

fn examples() -> Vec<(String, Profile)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("profiles");
    let mut out = Vec::new();
    for dir in [root.clone(), root.join("builtin")] {
        for entry in std::fs::read_dir(&dir).expect("profiles dir") {
            let path = entry.unwrap().path();
            if path.extension().is_none_or(|e| e != "yaml") {
                continue;
            }
            let name = path.file_stem().unwrap().to_string_lossy().to_string();
            let text = std::fs::read_to_string(&path).unwrap();
            out.push((
                name.clone(),
                parse_profile(&name, &text).expect("examples parse"),
            ));
        }
    }
    assert!(out.len() >= 10, "{} example profiles", out.len());
    out
}

/// Running pods on `node` as its current plan serves them, each asking for one device: per
/// GPU, `share` of its MIG instances (by profile) or of its replicas (annotated `shared` or
/// `mps`, as such pods are), and a pod on every other whole exclusive GPU.
fn running_pods(node: &str, plan: &NodePlan, share: f64) -> Vec<PodDemand> {
    let mut pods = Vec::new();
    let mut add = |resource: &str, isolation: Option<&str>| {
        let annotations = isolation
            .map(|i| format!(", annotations: {{gpu-share.dev/isolation: {i}}}"))
            .unwrap_or_default();
        let text = format!(
            "{{namespace: t, name: p{}, node: {node}, phase: running, requests: \
             {{{resource}: 1}}{annotations}}}",
            pods.len()
        );
        pods.push(serde_yaml::from_str(&text).expect("a pod demand"));
    };
    let part = |n: u64| (n as f64 * share).floor() as u64;
    for gpu in &plan.gpus {
        let resource = gpu.resources.keys().next().cloned().unwrap_or_default();
        match &gpu.mode {
            PlannedMode::Exclusive if share > 0.0 && gpu.index % 2 == 0 => add(&resource, None),
            // Dynamic MIG is DRA only, which advise does not plan for: no demand.
            PlannedMode::Exclusive | PlannedMode::DynamicMig => {}
            PlannedMode::TimeSlicing { replicas } => {
                (0..part(*replicas)).for_each(|_| add(&resource, Some("shared")));
            }
            PlannedMode::Mps { replicas, .. } => {
                (0..part(*replicas)).for_each(|_| add(&resource, Some("mps")));
            }
            PlannedMode::Mig { instances, .. } => {
                for (profile, n) in instances {
                    let name = format!("nvidia.com/mig-{profile}");
                    (0..part(*n as u64)).for_each(|_| add(&name, None));
                }
            }
        }
    }
    pods
}

#[test]
fn a_demand_the_current_profile_serves_gets_no_change_at_all() {
    let mut checked = 0;
    for (name, profile) in examples() {
        for plugin in [PluginKind::Nvidia, PluginKind::Builtin] {
            if validate_for(&name, &profile, plugin)
                .iter()
                .any(|p| p.is_error())
            {
                continue;
            }
            let node = SupplyNode {
                name: format!("node-{name}"),
                gpus: vec![gpus_for(&name).to_string()],
                current: None,
                profile_name: Some(name.clone()),
                profile: Some(profile.clone()),
            };
            let observed = ObservedNode::from_gpu_specs(&node.gpus).unwrap();
            let Ok(plan) = plan_for(&name, &profile, &observed, plugin) else {
                continue;
            };
            let supply = Supply { nodes: vec![node] };
            for share in [0.0, 0.5] {
                let demand = Demand {
                    pods: running_pods(&format!("node-{name}"), &plan, share),
                };
                assert!(demand.pods.iter().all(|p| p.phase == Phase::Running));
                let advice = match advise(&demand, &supply, plugin) {
                    Ok(advice) => advice,
                    // A resource advise's demand does not model (e.g. a renamed `.shared` one)
                    // makes no such demand; the empty demand still runs for this profile.
                    Err(errors) if share > 0.0 => {
                        eprintln!("{name} ({plugin:?}), running pods: {errors:?}");
                        continue;
                    }
                    Err(errors) => panic!("{name} ({plugin:?}): {errors:?}"),
                };
                let proposal = &advice.nodes[0];
                let what = format!("{name} ({plugin:?}), {} running pods", demand.pods.len());
                assert_eq!(proposal.profile_key, name, "{what}: a new key is a change");
                assert_eq!(
                    proposal.profile, profile,
                    "{what}: the text must not change"
                );
                assert!(proposal.pods_evicted.is_empty(), "{what}");
                assert_eq!(proposal.instances_destroyed, 0, "{what}");
                assert_eq!(proposal.instances_created, 0, "{what}");
                checked += 1;
            }
        }
    }
    eprintln!("{checked} node/demand cases checked");
    assert!(checked >= 20, "only {checked} cases ran");
}

/// A demand that changes some GPUs: the rules it keeps carry their settings (thread
/// percentage, pinned-memory expression) and the plugin options stay.
#[test]
fn a_change_elsewhere_keeps_the_settings_of_the_rules_it_keeps() {
    let supply: Supply = serde_yaml::from_str(
        "nodes:\n  - name: n\n    gpus: [h100x4]\n    profileName: mps-half\n    profile:\n      \
         version: v1\n      plugin: {failRequestsGreaterThanOne: true}\n      rules:\n        - \
         devices: [0, 1]\n          mps: {replicas: 4, activeThreadPercentage: 25, \
         pinnedMemoryLimit: 16Gi}\n",
    )
    .unwrap();
    let demand: Demand = serde_yaml::from_str(
        "pods:\n  - {namespace: ml, name: big, phase: pending, requests: \
         {nvidia.com/mig-3g.40gb: 1}}\n",
    )
    .unwrap();
    let advice = advise(&demand, &supply, PluginKind::Builtin).unwrap();
    let proposal = &advice.nodes[0];
    assert_eq!(
        proposal.profile_key, "advised-n",
        "the MIG pod needs a change"
    );
    assert!(advice.unschedulable.is_empty());
    let mps: Vec<_> = proposal
        .profile
        .rules
        .iter()
        .filter_map(|r| r.mps.as_ref())
        .collect();
    assert!(!mps.is_empty(), "{:?}", proposal.profile);
    for rule in mps {
        assert_eq!(rule.active_thread_percentage, Some(25));
        assert_eq!(rule.pinned_memory_limit.as_deref(), Some("16Gi"));
    }
    assert_eq!(
        proposal.profile.plugin.fail_requests_greater_than_one,
        Some(true)
    );
}
