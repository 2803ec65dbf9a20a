//! What the agent found on its node, published as Node labels (`crate::gpu_labels`) so pods,
//! people and the autopilot can pick a node by its GPUs without GPU Feature Discovery: a home
//! lab mixing a Jetson and a GeForce PC has no GFD on the Jetson (GFD needs NVML), yet a pod
//! may want one or the other.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use kube::api::Patch;
use kube::Api;
use serde_json::json;
use tracing::{debug, warn};

use super::node;
use super::reconcile::Reconciler;
use crate::gpu::{Gpus, SharedGpus};
use crate::gpu_labels::labels;
use crate::plan::ObservedNode;

impl Reconciler {
    /// Label the Node with what the GPUs last read hold (read them if none are remembered),
    /// when that differs from `seen` (or a fresh read of the Node). In the background: a Node
    /// write that hangs (until `--api-timeout`) must never hold up the reconcile of the next
    /// change. Never fails the reconcile: a failed read or write is logged and tried again on
    /// the next pass.
    pub(super) fn publish_found_gpus(&self, seen: Option<&Node>) {
        let job = FoundGpus {
            remembered: self.remembered_inventory(),
            seen: seen.and_then(|n| n.metadata.labels.clone()),
            gpus: self.gpus.clone(),
            nodes: Api::all(self.client.clone()),
            node_name: self.node_name.clone(),
            plugin: self.apply.plugin,
        };
        tokio::spawn(job.publish());
    }
}

/// What one publication of the found-GPU labels needs, owned by its task.
struct FoundGpus {
    remembered: Option<ObservedNode>,
    /// The Node's labels as the watch last delivered them, if it did.
    seen: Option<BTreeMap<String, String>>,
    gpus: SharedGpus,
    nodes: Api<Node>,
    node_name: String,
    /// Published beside the GPUs ([`crate::published::PLUGIN_LABEL`]).
    plugin: crate::sharing::PluginKind,
}

impl FoundGpus {
    async fn publish(self) {
        // A read made here is not remembered: after a failure the next plan must read afresh.
        let observed = match self.remembered {
            Some(observed) => observed,
            None => {
                let gpus = self.gpus;
                match tokio::task::spawn_blocking(move || gpus.with(Gpus::observe)).await {
                    Ok(Ok(observed)) => observed,
                    Ok(Err(e)) => {
                        debug!(error = %e, "cannot read the GPUs; the found-GPU labels wait");
                        return;
                    }
                    Err(e) => {
                        debug!(error = %e, "the GPU read stopped; the found-GPU labels wait");
                        return;
                    }
                }
            }
        };
        let mut wanted = labels(&observed);
        if wanted.is_empty() {
            return;
        }
        wanted.insert(
            crate::published::PLUGIN_LABEL,
            self.plugin.name().to_string(),
        );
        let current = match self.seen {
            Some(labels) => Some(labels),
            None => (self.nodes.get(&self.node_name).await.ok())
                .map(|n| n.metadata.labels.unwrap_or_default()),
        };
        let up_to_date = current.is_some_and(|have| {
            wanted
                .iter()
                .all(|(key, value)| have.get(*key) == Some(value))
        });
        if up_to_date {
            return;
        }
        let patch = json!({ "metadata": { "labels": wanted } });
        let params = crate::field_manager::patch(crate::field_manager::AGENT);
        if let Err(e) = self
            .nodes
            .patch(&self.node_name, &params, &Patch::Merge(&patch))
            .await
        {
            warn!(error = %node::describe(&e), "could not label the node with the GPUs found");
        }
    }
}
