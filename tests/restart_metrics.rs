//! A restarted agent's `/metrics` says the node's state from the first scrape: measured on a
//! real cluster, `gpu_share_state` read 0 for every state after a restart, until the next
//! change, while the node's label said `success`.

use std::sync::Arc;
use std::time::Duration;

use kube_double::KubeDouble;
use node_sim::*;

#[test]
fn a_restarted_agent_reports_the_nodes_state_before_any_change() {
    let api = Arc::new(KubeDouble::start());
    profiles_configmap(&api, &["exclusive"], &[]);
    let mut node = AgentNode::new(&api, "gpu-restart", h100s(1, false));
    api.set_node_label(&node.name, PROFILE_LABEL, Some("exclusive"));
    node.start_agent(&[], &[]);
    wait_applied(&api, &node, "exclusive", Duration::from_secs(30));

    node.kill_agent();
    // A long resync: nothing but the start-up reconcile runs before the scrape.
    node.start_agent(&["--resync-period", "300s"], &[]);
    let mut text = String::new();
    let reported = poll(Duration::from_secs(20), Duration::from_millis(50), || {
        text = http_port_of(&node)
            .and_then(|port| http_get(port, "/metrics"))
            .unwrap_or_default();
        metric(&text, "gpu_share_state{state=\"success\"}") == Some(1.0)
    });
    assert!(reported, "{text}\n{}", node.log());
    for other in ["pending", "draining", "applying", "failed", "blocked"] {
        let series = format!("gpu_share_state{{state=\"{other}\"}}");
        assert_ne!(metric(&text, &series), Some(1.0), "{series}");
    }
    assert_eq!(state_of(&api, &node.name).as_deref(), Some("success"));
}

/// The restarted agent's port once its first log line is out (the log holds both runs').
fn http_port_of(node: &AgentNode) -> Option<u16> {
    (node.log().matches("addr=").count() >= 2).then(|| node.http_port())
}
