//! MPS's slice of the plan: the daemons the GPU plans ask for, one per resource name of whole
//! GPUs and one per MIG device shared through MPS.

use super::*;

/// The daemon directory of MIG device `uuid` advertised as `resource`.
pub fn mig_daemon_name(resource: &str, uuid: &str) -> String {
    format!("{resource}/{uuid}")
}

/// One daemon per resource name that MPS GPUs are advertised under, with the GPUs in NVML
/// order, and one per MIG device shared through MPS. Fails when GPUs of one resource want
/// different active thread percentages: a daemon has one default. Pinned memory limits are per
/// GPU, so they may differ.
pub fn specs_from_plan(
    gpus: &[GpuPlan],
    mig_strategy: MigStrategy,
    observed: &ObservedNode,
) -> Result<Vec<DaemonSpec>, MpsError> {
    let mut specs = whole_gpu_specs(gpus, observed)?;
    specs.extend(mig_device_specs(gpus, mig_strategy, observed)?);
    Ok(specs)
}

/// A daemon for each MIG device of a GPU whose plan shares its MIG devices through MPS, seeing
/// only that device (`CUDA_VISIBLE_DEVICES=<MIG UUID>`, so its device index is 0).
pub(super) fn mig_device_specs(
    gpus: &[GpuPlan],
    mig_strategy: MigStrategy,
    observed: &ObservedNode,
) -> Result<Vec<DaemonSpec>, MpsError> {
    let mut specs = Vec::new();
    for gpu in gpus {
        let PlannedMode::Mig {
            replicas,
            mps: Some(mps),
            ..
        } = &gpu.mode
        else {
            continue;
        };
        let Some(seen) = observed.gpus.iter().find(|o| o.index == gpu.index) else {
            continue;
        };
        for device in seen.mig_devices() {
            let resource =
                crate::sharing::mig_resource(device.profile, mig_strategy, renamed(gpu), *replicas);
            let Some(uuid) = device.uuid else {
                return Err(MpsError::Spec {
                    resource,
                    message: format!(
                        "the {} MIG device (GPU {}, GPU instance {}, compute instance {}) has no UUID, which its MPS daemon's CUDA_VISIBLE_DEVICES needs",
                        device.profile, gpu.index, device.gi_id, device.ci_id
                    ),
                });
            };
            specs.push(DaemonSpec {
                resource: mig_daemon_name(&resource, uuid),
                gpus: vec![MpsGpu {
                    nvml_index: gpu.index,
                    uuid: Some(uuid.to_string()),
                    index_in_daemon: 0,
                    pinned_memory_limit_mib: mps
                        .pinned_memory_limit_mib
                        .get(device.profile)
                        .copied(),
                }],
                active_thread_percentage: mps.active_thread_percentage,
            });
        }
    }
    Ok(specs)
}

/// Whether `gpu`'s shared devices are advertised renamed (`renameByDefault`, `….shared`): read
/// back from the resource names the planner gave them.
pub(super) fn renamed(gpu: &GpuPlan) -> bool {
    gpu.resources.keys().any(|r| r.ends_with(".shared"))
}

/// The daemons for whole GPUs: one per resource name.
pub(super) fn whole_gpu_specs(
    gpus: &[GpuPlan],
    observed: &ObservedNode,
) -> Result<Vec<DaemonSpec>, MpsError> {
    /// The MPS settings of a GPU planned for MPS.
    pub(super) fn mps(gpu: &GpuPlan) -> Option<(Option<u32>, Option<u64>)> {
        match gpu.mode {
            PlannedMode::Mps {
                active_thread_percentage,
                pinned_memory_limit_mib,
                ..
            } => Some((active_thread_percentage, pinned_memory_limit_mib)),
            _ => None,
        }
    }
    let mut groups: BTreeMap<String, Vec<&GpuPlan>> = BTreeMap::new();
    for gpu in gpus.iter().filter(|g| mps(g).is_some()) {
        // An MPS GPU advertises one resource: nvidia.com/gpu, or nvidia.com/gpu.shared.
        let resource = gpu
            .resources
            .keys()
            .next()
            .cloned()
            .unwrap_or_else(|| "nvidia.com/gpu".to_string());
        groups.entry(resource).or_default().push(gpu);
    }
    let mut specs = Vec::new();
    for (resource, mut gpus) in groups {
        gpus.sort_by_key(|g| g.index);
        let percentages: BTreeSet<Option<u32>> =
            gpus.iter().filter_map(|g| mps(g)).map(|m| m.0).collect();
        if percentages.len() > 1 {
            let list: Vec<String> = gpus
                .iter()
                .map(|g| match mps(g).and_then(|m| m.0) {
                    Some(p) => format!("GPU {}: {p}", g.index),
                    None => format!("GPU {}: unset", g.index),
                })
                .collect();
            return Err(MpsError::Spec {
                resource,
                message: format!(
                    "its GPUs want different activeThreadPercentage values ({}), but one MPS \
                     daemon per resource has one default; give them the same value",
                    list.join(", ")
                ),
            });
        }
        let gpus: Vec<MpsGpu> = gpus
            .iter()
            .enumerate()
            .map(|(position, g)| MpsGpu {
                nvml_index: g.index,
                uuid: observed
                    .gpus
                    .iter()
                    .find(|o| o.index == g.index)
                    .and_then(|o| o.uuid.clone()),
                index_in_daemon: position as u32,
                pinned_memory_limit_mib: mps(g).and_then(|m| m.1),
            })
            .collect();
        specs.push(DaemonSpec {
            active_thread_percentage: percentages.into_iter().next().flatten(),
            resource,
            gpus,
        });
    }
    Ok(specs)
}
