//! Which pods must leave before a MIG change: the pods whose CUDA processes run on the GPU
//! instances that will be destroyed, or on GPUs whose MIG mode changes, and the pods the
//! kubelet lists as holding those devices ([`disturbed_devices`], asked through
//! [`crate::kubelet::pod_resources`]). Pods on untouched GPUs and instances keep running. Pure,
//! apart from reading `/proc/<pid>/cgroup`.
//!
//! NVML reports host PIDs (the agent runs with hostPID); a PID's cgroup path names its pod:
//! `.../kubepods/burstable/pod<uid>/<container>` (cgroupfs driver) or
//! `.../kubepods-burstable-pod<uid_with_underscores>.slice/...` (systemd driver).

use std::collections::BTreeSet;
use std::path::Path;

use crate::plan::{ObservedNode, Step};

/// The processes a set of steps would disturb: (GPU index, PID).
pub fn disturbed_processes(steps: &[Step], observed: &ObservedNode) -> Vec<(u32, u32)> {
    let mut out = BTreeSet::new();
    for step in steps {
        let Some(gpu) = observed.gpus.iter().find(|g| g.index == step.gpu()) else {
            continue;
        };
        for p in &gpu.processes {
            let hit = match step {
                Step::DestroyInstance { gi_id, .. } => p.gi_id == Some(*gi_id),
                Step::SetMigMode { .. } => true,
                Step::CreateInstance { .. } | Step::CompleteInstance { .. } => false,
            };
            if hit {
                out.insert((gpu.index, p.pid));
            }
        }
    }
    out.into_iter().collect()
}

/// The devices a set of steps takes away, by the UUIDs device plugins advertise them under: the
/// MIG devices of each GPU instance destroyed and, where the MIG mode changes, the GPU itself
/// and all its MIG devices.
pub fn disturbed_devices(steps: &[Step], observed: &ObservedNode) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for step in steps {
        let Some(gpu) = observed.gpus.iter().find(|g| g.index == step.gpu()) else {
            continue;
        };
        let destroyed_gi = match step {
            Step::DestroyInstance { gi_id, .. } => Some(*gi_id),
            Step::SetMigMode { .. } => {
                out.extend(gpu.uuid.clone());
                None
            }
            Step::CreateInstance { .. } | Step::CompleteInstance { .. } => continue,
        };
        out.extend(
            gpu.compute_instances
                .iter()
                .filter(|ci| destroyed_gi.is_none_or(|gi| ci.gi_id == gi))
                .filter_map(|ci| ci.uuid.clone()),
        );
    }
    out
}

/// The pod UID a host PID belongs to, from `<proc_root>/<pid>/cgroup`.
pub fn pod_uid_of(proc_root: &Path, pid: u32) -> Option<String> {
    let text = std::fs::read_to_string(proc_root.join(pid.to_string()).join("cgroup")).ok()?;
    text.lines().find_map(pod_uid_in_cgroup_line)
}

fn pod_uid_in_cgroup_line(line: &str) -> Option<String> {
    let path = line.splitn(3, ':').nth(2)?;
    path.split('/').find_map(|segment| {
        let start = segment.rfind("pod")? + 3;
        let rest = &segment[start..];
        let uid: String = rest
            .chars()
            .take_while(|c| c.is_ascii_hexdigit() || *c == '-' || *c == '_')
            .collect();
        let uid = uid.replace('_', "-");
        (uid.len() == 36 && uid.matches('-').count() == 4).then_some(uid)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::ObservedComputeInstance;
    use crate::mig::Placement;
    use crate::plan::ObservedGpu;

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

    #[test]
    fn cgroup_paths_of_both_drivers_name_the_pod() {
        let uid = "0f6c8b0e-5d1a-4c1e-9a57-2b8e3c9d4f10";
        assert_eq!(
            pod_uid_in_cgroup_line(&format!("0::/kubepods/burstable/pod{uid}/8c1d2f")),
            Some(uid.to_string())
        );
        assert_eq!(
            pod_uid_in_cgroup_line(&format!(
                "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice/cri-containerd-ab.scope",
                uid.replace('-', "_")
            )),
            Some(uid.to_string())
        );
        assert_eq!(
            pod_uid_in_cgroup_line("0::/user.slice/session-2.scope"),
            None
        );
    }
}
