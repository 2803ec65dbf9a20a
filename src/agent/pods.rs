//! Which pods must leave before a MIG change: the pods whose CUDA processes run on the GPU
//! instances that will be destroyed, or on GPUs whose MIG mode changes, and the pods the
//! kubelet lists as holding those devices ([`disturbed_devices`], asked through
//! [`crate::kubelet::pod_resources`]). Pods on untouched GPUs and instances keep running. Pure;
//! NVML's host PIDs are tied to their pods by [`crate::kubelet::cgroup`].

use std::collections::BTreeSet;

use crate::plan::{ObservedGpu, ObservedNode, Step};

/// What one step takes away from its GPU.
#[derive(Debug, Clone, Copy)]
enum Loss {
    /// The MIG mode changes: the whole GPU and every MIG device on it.
    WholeGpu,
    /// GPU instance `gi_id` is destroyed, with its MIG devices.
    Instance(u32),
}

impl Loss {
    /// Whether something on GPU instance `gi` (`None`: the GPU itself, MIG off) goes with it.
    fn covers(self, gi: Option<u32>) -> bool {
        match self {
            Loss::WholeGpu => true,
            Loss::Instance(lost) => gi == Some(lost),
        }
    }
}

/// Each step that takes something away, with its GPU as observed; the one rule both
/// [`disturbed_processes`] and [`disturbed_devices`] follow.
fn losses<'a>(
    steps: &'a [Step],
    observed: &'a ObservedNode,
) -> impl Iterator<Item = (&'a ObservedGpu, Loss)> + 'a {
    steps.iter().filter_map(|step| {
        let loss = match step {
            Step::DestroyInstance { gi_id, .. } => Loss::Instance(*gi_id),
            Step::SetMigMode { .. } => Loss::WholeGpu,
            Step::CreateInstance { .. } | Step::CompleteInstance { .. } => return None,
        };
        let gpu = observed.gpus.iter().find(|g| g.index == step.gpu())?;
        Some((gpu, loss))
    })
}

/// The processes a set of steps would disturb: (GPU index, PID).
pub fn disturbed_processes(steps: &[Step], observed: &ObservedNode) -> Vec<(u32, u32)> {
    let mut out = BTreeSet::new();
    for (gpu, loss) in losses(steps, observed) {
        for p in gpu.processes.iter().filter(|p| loss.covers(p.gi_id)) {
            out.insert((gpu.index, p.pid));
        }
    }
    out.into_iter().collect()
}

/// The devices a set of steps takes away, by the UUIDs device plugins advertise them under: the
/// MIG devices of each GPU instance destroyed and, where the MIG mode changes, the GPU itself
/// and all its MIG devices.
pub fn disturbed_devices(steps: &[Step], observed: &ObservedNode) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (gpu, loss) in losses(steps, observed) {
        if matches!(loss, Loss::WholeGpu) {
            out.extend(gpu.uuid.clone());
        }
        out.extend(
            gpu.compute_instances
                .iter()
                .filter(|ci| loss.covers(Some(ci.gi_id)))
                .filter_map(|ci| ci.uuid.clone()),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::ObservedComputeInstance;
    use crate::mig::Placement;

    /// GPU `index` with MIG on and one MIG device per GPU instance id in `gis`.
    fn mig_gpu(index: u32, gis: &[u32]) -> ObservedGpu {
        let mut gpu = ObservedGpu::simulated(index, "h100");
        gpu.uuid = Some(format!("GPU-{index}"));
        gpu.compute_instances = gis
            .iter()
            .map(|&gi_id| ObservedComputeInstance {
                gi_id,
                ci_id: 0,
                profile_id: 0,
                uuid: Some(format!("MIG-{index}-{gi_id}")),
            })
            .collect();
        gpu
    }

    #[test]
    fn destroyed_instances_and_gpus_changing_mig_mode_are_the_disturbed_devices() {
        let observed = ObservedNode {
            gpus: vec![mig_gpu(0, &[1, 2]), mig_gpu(1, &[]), mig_gpu(2, &[7])],
        };
        let placement = Placement { start: 0, size: 1 };
        let steps = [
            Step::DestroyInstance {
                gpu: 0,
                gi_id: 2,
                profile: "1g.10gb".into(),
                placement,
            },
            // GPU 1 goes from whole (time-sliced replicas of GPU-1) to MIG.
            Step::SetMigMode {
                gpu: 1,
                enable: true,
            },
            // Creating takes nothing away.
            Step::CreateInstance {
                gpu: 2,
                profile: "1g.10gb".into(),
                placement,
            },
        ];
        let devices: Vec<String> = disturbed_devices(&steps, &observed).into_iter().collect();
        assert_eq!(devices, ["GPU-1", "MIG-0-2"]);
    }
}
