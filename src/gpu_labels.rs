//! The Node labels that say which GPUs a node has: GPU Feature Discovery's
//! (`nvidia.com/gpu.product`, `nvidia.com/gpu.count`; docs/sources.md#gfd-labels) and those
//! gpu-share's agent writes from what it found, for the nodes GFD never labels (a Jetson: GFD
//! needs NVML; a cluster without the GPU Operator). The agent writes them
//! (`agent::found_gpus`); advise and the autopilot read them (`advise::live`).
//!
//! | label | value |
//! |---|---|
//! | [`PLATFORM_LABEL`] | `tegra` (a Jetson/Tegra integrated GPU, found from the system's files) or `nvml` (GPUs NVML lists), go-nvlib's names for the two |
//! | [`PRODUCT_LABEL`] | the GPUs' product (NVML name, or the Tegra's device-tree model) in GFD's spelling: spaces as `-`, at most 63 characters; [`MIXED`] when the GPUs differ |
//! | [`COUNT_LABEL`] | how many GPUs (whole GPUs, whatever their MIG mode) |
//!
//! They are under `gpu-share.dev/`, the only labels the agent may write (the admission policy in
//! deploy/base); a node with no GPU found gets none of them.

use std::collections::BTreeMap;

use crate::gpu::ObservedNode;

/// GFD: the GPU product, sanitised (spaces become `-`), e.g. `NVIDIA-H100-80GB-HBM3`.
pub const GFD_PRODUCT_LABEL: &str = "nvidia.com/gpu.product";
/// GFD: how many GPUs the node has (MIG devices under the `single` strategy).
pub const GFD_COUNT_LABEL: &str = "nvidia.com/gpu.count";
/// The product label's value on a node whose GPUs are not all one product.
pub const MIXED: &str = "mixed";

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
        MIXED.to_string()
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
