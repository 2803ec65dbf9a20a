//! What the agent found on its node, published as Node labels so pods (and people) can pick a
//! node by its GPUs without GPU Feature Discovery: a home lab mixing a Jetson and a GeForce PC
//! has no GFD on the Jetson (GFD needs NVML), yet a pod may want one or the other.
//!
//! | label | value |
//! |---|---|
//! | [`PLATFORM_LABEL`] | `tegra` (a Jetson/Tegra integrated GPU, found from the system's files) or `nvml` (GPUs NVML lists), go-nvlib's names for the two |
//! | [`PRODUCT_LABEL`] | the GPUs' product (NVML name, or the Tegra's device-tree model) in GFD's spelling: spaces as `-`, at most 63 characters; `mixed` when the GPUs differ |
//! | [`COUNT_LABEL`] | how many GPUs |
//!
//! Labels under `gpu-share.dev/` are the only ones the agent may write (the admission policy in
//! deploy/base); a node with no GPU found gets none of them.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use kube::api::Patch;
use kube::Api;
use serde_json::json;
use tracing::{debug, warn};

use super::node;
use super::reconcile::Reconciler;
use crate::gpu::Gpus;
use crate::plan::ObservedNode;

/// `tegra` or `nvml`: how the GPUs were found.
pub const PLATFORM_LABEL: &str = "gpu-share.dev/gpu.platform";
/// The GPUs' product name, as a label value.
pub const PRODUCT_LABEL: &str = "gpu-share.dev/gpu.product";
/// How many GPUs.
pub const COUNT_LABEL: &str = "gpu-share.dev/gpu.count";

/// The labels that say what `observed` holds; none when it holds no GPU.
pub fn labels(observed: &ObservedNode) -> BTreeMap<&'static str, String> {
    let Some(first) = observed.gpus.first() else {
        return BTreeMap::new();
    };
    let platform = if observed.gpus.iter().any(|g| g.tegra.is_some()) {
        "tegra"
    } else {
        "nvml"
    };
    let product = if observed.gpus.iter().all(|g| g.product == first.product) {
        label_value(&first.product)
    } else {
        "mixed".to_string()
    };
    BTreeMap::from([
        (PLATFORM_LABEL, platform.to_string()),
        (PRODUCT_LABEL, product),
        (COUNT_LABEL, observed.gpus.len().to_string()),
    ])
}

/// `text` as a label value, as GFD spells `nvidia.com/gpu.product`: spaces become `-`, other
/// characters a label value cannot hold are dropped, at most 63 characters, starting and
/// ending with a letter or digit.
pub fn label_value(text: &str) -> String {
    let kept: String = text
        .chars()
        .map(|c| if c == ' ' { '-' } else { c })
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        .collect();
    let trimmed = kept.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    let mut value: String = trimmed.chars().take(63).collect();
    while value.ends_with(|c: char| !c.is_ascii_alphanumeric()) {
        value.pop();
    }
    value
}

impl Reconciler {
    /// Label the Node with what the GPUs last read hold (read them if none are remembered),
    /// when that differs from `seen` (or a fresh read of the Node). Never fails the reconcile:
    /// a failed read or write is logged and tried again on the next pass.
    pub(super) async fn publish_found_gpus(&self, seen: Option<&Node>) {
        // A read made here is not remembered: after a failure the next plan must read afresh.
        let observed = match self.remembered_inventory() {
            Some(observed) => observed,
            None => {
                let gpus = self.gpus.clone();
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
        let wanted = labels(&observed);
        let nodes: Api<Node> = Api::all(self.client.clone());
        let fetched;
        let current = match seen {
            Some(node) => Some(node),
            None => {
                fetched = nodes.get(&self.node_name).await.ok();
                fetched.as_ref()
            }
        };
        let up_to_date = current.is_some_and(|n| {
            wanted
                .iter()
                .all(|(key, value)| node::label(n, key) == Some(value.as_str()))
        });
        if wanted.is_empty() || up_to_date {
            return;
        }
        let patch = json!({ "metadata": { "labels": wanted } });
        let params = crate::field_manager::patch(crate::field_manager::AGENT);
        if let Err(e) = nodes
            .patch(&self.node_name, &params, &Patch::Merge(&patch))
            .await
        {
            warn!(error = %node::describe(&e), "could not label the node with the GPUs found");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::{ObservedGpu, Tegra};

    #[test]
    fn product_names_become_label_values_as_gfd_spells_them() {
        assert_eq!(
            label_value("NVIDIA GeForce RTX 3090"),
            "NVIDIA-GeForce-RTX-3090"
        );
        assert_eq!(label_value("Orin (nvgpu)"), "Orin-nvgpu");
        let long = "NVIDIA Jetson AGX Orin Developer Kit with a carrier board whose name is long";
        let value = label_value(long);
        assert!(value.len() <= 63, "{value}");
        assert!(
            value.ends_with(|c: char| c.is_ascii_alphanumeric()),
            "{value}"
        );
    }

    #[test]
    fn a_jetson_and_a_geforce_pc_are_labelled_apart() {
        let jetson = ObservedNode {
            gpus: vec![ObservedGpu::tegra(&Tegra {
                release: Some("L4T R36.4.0".into()),
                soc: Some("nvidia,tegra234".into()),
                model: Some("NVIDIA Jetson Orin Nano Developer Kit".into()),
            })],
        };
        let labels_of_jetson = labels(&jetson);
        assert_eq!(labels_of_jetson[PLATFORM_LABEL], "tegra");
        assert_eq!(
            labels_of_jetson[PRODUCT_LABEL],
            "NVIDIA-Jetson-Orin-Nano-Developer-Kit"
        );
        assert_eq!(labels_of_jetson[COUNT_LABEL], "1");

        let pc = ObservedNode::simulated(&["NVIDIA GeForce RTX 3090x2".into()]);
        let labels_of_pc = labels(&pc);
        assert_eq!(labels_of_pc[PLATFORM_LABEL], "nvml");
        assert_eq!(labels_of_pc[PRODUCT_LABEL], "NVIDIA-GeForce-RTX-3090");
        assert_eq!(labels_of_pc[COUNT_LABEL], "2");

        let mixed = ObservedNode::simulated(&["h100".into(), "NVIDIA GeForce RTX 3090".into()]);
        assert_eq!(labels(&mixed)[PRODUCT_LABEL], "mixed");
        assert!(labels(&ObservedNode::default()).is_empty());
    }
}
