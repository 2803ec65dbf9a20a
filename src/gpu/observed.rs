//! The node as observed: its GPUs, their MIG mode and the GPU instances on them. NVML produces
//! it on a real node; `plan --gpu` simulates one; `plan --current FILE` reads one.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{ComputeMode, GpuProcess, ObservedComputeInstance};
use crate::mig::{catalog, ExistingInstance};

/// Every GPU on one node.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ObservedNode {
    pub gpus: Vec<ObservedGpu>,
}

/// One GPU as NVML reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ObservedGpu {
    /// NVML index.
    pub index: u32,
    /// `nvmlDeviceGetName()`, e.g. `NVIDIA H100 80GB HBM3`.
    pub product: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mib: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_bus_id: Option<String>,
    /// MIG mode; absent when the GPU cannot do MIG.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig: Option<MigMode>,
    /// `nvmlDeviceGetComputeMode`; absent when NVML could not say (or in files written before
    /// gpu-share read it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_mode: Option<ComputeMode>,
    /// GPU instances that exist now.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(with = "Vec<serde_json::Value>")]
    pub instances: Vec<ExistingInstance>,
    /// Compute instances (MIG devices) inside those GPU instances.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub compute_instances: Vec<ObservedComputeInstance>,
    /// Processes with a CUDA context, with their GPU/compute instance under MIG.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub processes: Vec<GpuProcess>,
}

/// A MIG device as NVML shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MigDevice<'a> {
    /// Its GPU instance's profile, e.g. `1g.10gb`.
    pub profile: &'a str,
    /// `MIG-…`, what `NVIDIA_VISIBLE_DEVICES` and `CUDA_VISIBLE_DEVICES` name.
    pub uuid: Option<&'a str>,
    pub gi_id: u32,
    pub ci_id: u32,
}

/// MIG mode now and after the next GPU reset (they differ while a change is pending).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MigMode {
    pub current: bool,
    pub pending: bool,
}

impl ObservedGpu {
    /// A fresh GPU of this model: MIG off, no instances; MIG-capable when the catalog knows it.
    pub fn simulated(index: u32, name: &str) -> Self {
        let model = catalog().model(name);
        ObservedGpu {
            index,
            product: model.map_or_else(|| name.to_string(), |m| m.nvml_name.clone()),
            uuid: None,
            memory_mib: model.map(|m| m.total_memory_mib),
            pci_bus_id: None,
            mig: model.map(|_| MigMode::default()),
            compute_mode: None,
            instances: Vec::new(),
            compute_instances: Vec::new(),
            processes: Vec::new(),
        }
    }

    /// The MIG devices (compute instances) with their GPU instance's profile, in GI/CI id
    /// order: the order the device plugins advertise them in.
    pub fn mig_devices(&self) -> Vec<MigDevice<'_>> {
        let mut devices: Vec<MigDevice<'_>> = self
            .compute_instances
            .iter()
            .filter_map(|ci| {
                let gi = self.instances.iter().find(|i| i.gi_id == Some(ci.gi_id))?;
                Some(MigDevice {
                    profile: &gi.profile,
                    uuid: ci.uuid.as_deref(),
                    gi_id: ci.gi_id,
                    ci_id: ci.ci_id,
                })
            })
            .collect();
        devices.sort_by_key(|d| (d.gi_id, d.ci_id));
        devices
    }

    /// `GPU 3 (NVIDIA H100 80GB HBM3)`, for messages.
    pub fn describe(&self) -> String {
        format!("{} ({})", self.index, self.product)
    }
}

impl ObservedNode {
    /// A simulated node from `--gpu` specs such as `h100x4`, `H200`, `"NVIDIA GeForce RTX 3090x2"`.
    pub fn simulated(specs: &[String]) -> Self {
        let mut gpus = Vec::new();
        for spec in specs {
            let (name, count) = split_count(spec);
            for _ in 0..count {
                gpus.push(ObservedGpu::simulated(gpus.len() as u32, name));
            }
        }
        ObservedNode { gpus }
    }
}

/// `MODEL[xN]`: a trailing `x<N>` is a count when N is 1–16 (so `rtx4090` stays a name).
fn split_count(spec: &str) -> (&str, u32) {
    if catalog().model(spec).is_none() {
        if let Some((name, n)) = spec.rsplit_once(['x', 'X']) {
            if let Ok(n) = n.parse::<u32>() {
                if (1..=16).contains(&n) && !name.is_empty() {
                    return (name.trim(), n);
                }
            }
        }
    }
    (spec.trim(), 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_specs() {
        assert_eq!(split_count("h100x4"), ("h100", 4));
        assert_eq!(split_count("rtx4090"), ("rtx4090", 1));
        assert_eq!(
            split_count("NVIDIA GeForce RTX 3090x2"),
            ("NVIDIA GeForce RTX 3090", 2)
        );
        let node = ObservedNode::simulated(&["h100x2".into(), "NVIDIA GeForce RTX 3090".into()]);
        assert_eq!(node.gpus.len(), 3);
        assert_eq!(node.gpus[1].product, "NVIDIA H100 80GB HBM3");
        assert!(node.gpus[1].mig.is_some());
        assert_eq!(node.gpus[2].index, 2);
        assert!(node.gpus[2].mig.is_none());
    }
}
