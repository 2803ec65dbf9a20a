//! Every write the agent makes names field manager `gpu-share` (src/field_manager.rs): on a
//! real kube-apiserver 1.36 the agent's Node writes showed as `unknown` in `managedFields`.
//! The API double records each request's query string, where clients put `fieldManager`.

use std::sync::Arc;
use std::time::Duration;

use kube_double::{KubeDouble, Verb};
use node_sim::*;

#[test]
fn every_write_of_the_agent_names_field_manager_gpu_share() {
    let api = Arc::new(KubeDouble::start());
    profiles_configmap(&api, &["h100-balanced", "h100-inference"], &[]);
    let mut node = AgentNode::new(&api, "gpu-fm", h100s(1, true));
    api.set_node_label(&node.name, PROFILE_LABEL, Some("h100-balanced"));
    node.start_agent(&[], &[]);
    wait_applied(&api, &node, "h100-balanced", Duration::from_secs(30));
    // A change with a drain: drain-slot Lease, cordon, eviction, state, uncordon.
    let gone_gi = node.gi_at(0, 4);
    node.add_workloads(&api, &[Workload::on_mig("moves", 4100, 0, gone_gi)]);
    api.set_node_label(&node.name, PROFILE_LABEL, Some("h100-inference"));
    wait_applied(&api, &node, "h100-inference", Duration::from_secs(30));

    let writes: Vec<_> = api
        .requests()
        .into_iter()
        .filter(|r| matches!(r.verb, Verb::Create | Verb::Update | Verb::Patch))
        // The test's own label changes and fixtures go through the double's Rust API, not HTTP.
        .collect();
    // Events: kube-runtime's recorder sends no fieldManager; the user agent names the agent.
    for resource in ["nodes", "leases", "pods/eviction", "events"] {
        assert!(
            writes.iter().any(|r| r.resource == resource),
            "the scenario writes {resource}: {:?}",
            writes.iter().map(|r| &r.resource).collect::<Vec<_>>()
        );
    }
    let unnamed: Vec<String> = writes
        .iter()
        .filter(|r| r.field_manager != "gpu-share")
        .map(|r| {
            format!(
                "{:?} {} ?{} as {:?}",
                r.verb, r.path, r.query, r.field_manager
            )
        })
        .collect();
    assert!(
        unnamed.is_empty(),
        "writes not recorded as gpu-share: {unnamed:#?}"
    );
}
