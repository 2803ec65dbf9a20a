//! What the built-in plugin advertises, and its answers to `Allocate` and
//! `GetPreferredAllocation`: pure functions of the applied plan and the GPUs NVML shows.
//!
//! Device IDs follow the NVIDIA plugin (docs/sources.md#resource-naming, #allocation): a GPU or
//! MIG device UUID, or `<uuid>::<n>` for replica `n` of a shared one. `Allocate` strips replica
//! IDs back to unique UUIDs for `NVIDIA_VISIBLE_DEVICES`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::api;
use crate::mps::daemon::{mig_daemon_name, SHM_DIR};
use crate::plan::{mig_resource, NodePlan, ObservedNode, PlannedMode};
use crate::profile::PluginOptions;

/// Every advertised resource, by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inventory {
    pub resources: BTreeMap<String, ResourceDevices>,
}

/// One resource's devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceDevices {
    pub resource: String,
    /// In advertising order: by GPU, device UUID, replica.
    pub devices: Vec<DeviceEntry>,
    /// The profile's `failRequestsGreaterThanOne`; unset means the NVIDIA plugin's default:
    /// true for MPS devices, false for time-sliced ones.
    pub fail_requests_greater_than_one: Option<bool>,
}

/// Why the kubelet's `Allocate` of some device IDs is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocateError {
    #[error("unknown device {id:?} for {resource}")]
    UnknownDevice { id: String, resource: String },
    /// More than one replica of a shared device for one container: the NVIDIA plugin's
    /// wording (internal/rm/rm.go: ValidateRequest).
    #[error(
        "invalid allocation request for {resource:?}: invalid request: maximum request size \
         for shared resources is 1; found {found}"
    )]
    SharedOverOne { resource: String, found: usize },
    #[error(
        "the request for {resource} mixes GPUs shared by MPS with GPUs that are not: request \
         one device"
    )]
    MpsBesideOthers { resource: String },
    /// A client process reaches one MPS daemon: the one in `CUDA_MPS_PIPE_DIRECTORY`.
    #[error(
        "the request for {resource} spans {devices} MIG devices, each shared through its own \
         MPS daemon, but a container can reach only one: request one device"
    )]
    SeveralMpsDaemons { resource: String, devices: usize },
}

/// One schedulable device (a whole GPU, a MIG device, or one replica of either).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceEntry {
    /// What the kubelet sees: `<uuid>` or `<uuid>::<n>`.
    pub id: String,
    /// `GPU-…` or `MIG-…`: what `NVIDIA_VISIBLE_DEVICES` names.
    pub uuid: String,
    /// NVML index of the (parent) GPU.
    pub gpu: u32,
    /// How many replicas the UUID is advertised as (1: not shared).
    pub replicas: u64,
    pub healthy: bool,
    /// Set when the device is shared through MPS.
    pub mps: Option<MpsClient>,
}

/// What an MPS client container needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpsClient {
    /// The daemon's pipe directory on the host (`<mps root>/<daemon>/pipe`, where the daemon is
    /// named by its resource, plus `/<MIG UUID>` for a daemon per MIG device).
    pub host_pipe_dir: PathBuf,
    /// Where it is mounted in the container (`/mps/<daemon>/pipe`, as NVIDIA's plugin does).
    pub container_pipe_dir: String,
    /// The tmpfs the daemons use as `/dev/shm` (`<mps root>/shm`): clients talk to the MPS
    /// server through shared memory, so theirs must be the same (nvidia-stack.md §1.7).
    pub host_shm_dir: PathBuf,
    pub active_thread_percentage: Option<u32>,
    pub pinned_memory_limit_mib: Option<u64>,
}

impl MpsClient {
    /// The client side of the daemon `daemon` (a directory under `mps_root`).
    pub fn new(
        mps_root: &Path,
        daemon: &str,
        active_thread_percentage: Option<u32>,
        pinned_memory_limit_mib: Option<u64>,
    ) -> Self {
        MpsClient {
            host_pipe_dir: mps_root.join(daemon).join("pipe"),
            container_pipe_dir: format!("{}/{daemon}/pipe", super::CONTAINER_MPS_ROOT),
            host_shm_dir: mps_root.join(SHM_DIR),
            active_thread_percentage,
            pinned_memory_limit_mib,
        }
    }
}

impl Inventory {
    /// The devices of `plan`'s resources on the node as `observed` after the apply. Every
    /// resource of the plan is present, even when NVML shows none of its devices (then empty).
    pub fn from_plan(
        plan: &NodePlan,
        observed: &ObservedNode,
        options: &PluginOptions,
        mps_root: &Path,
    ) -> Inventory {
        let mut resources: BTreeMap<String, ResourceDevices> = plan
            .resources
            .keys()
            .map(|r| {
                (
                    r.clone(),
                    ResourceDevices {
                        resource: r.clone(),
                        devices: Vec::new(),
                        fail_requests_greater_than_one: options.fail_requests_greater_than_one,
                    },
                )
            })
            .collect();
        let rename = options.rename_by_default;
        for gpu in &plan.gpus {
            let Some(seen) = observed.gpus.iter().find(|o| o.index == gpu.index) else {
                continue;
            };
            let mut add = |resource: &str, uuid: &str, replicas: u64, mps: Option<MpsClient>| {
                if let Some(r) = resources.get_mut(resource) {
                    r.devices.extend(entries(uuid, gpu.index, replicas, mps));
                }
            };
            match &gpu.mode {
                PlannedMode::Mig { replicas, mps, .. } => {
                    for device in seen.mig_devices() {
                        let Some(uuid) = device.uuid else {
                            continue;
                        };
                        let resource =
                            mig_resource(device.profile, plan.mig_strategy, rename, *replicas);
                        // MPS inside a MIG device: its own daemon (MIG User Guide).
                        let client = mps.as_ref().map(|m| {
                            MpsClient::new(
                                mps_root,
                                &mig_daemon_name(&resource, uuid),
                                m.active_thread_percentage,
                                // A fractional MIG device's fixed shares split its memory
                                // evenly (as for a whole GPU, below).
                                match m.consumable.get(device.profile) {
                                    Some(c) => {
                                        Some(crate::mps::consumable::fixed_share_mib(c, *replicas))
                                    }
                                    None => m.pinned_memory_limit_mib.get(device.profile).copied(),
                                },
                            )
                        });
                        add(&resource, uuid, *replicas, client);
                    }
                }
                mode => {
                    let Some(uuid) = seen.uuid.as_deref() else {
                        continue;
                    };
                    let Some(resource) = gpu.resources.keys().next() else {
                        continue;
                    };
                    let (replicas, mps) = match mode {
                        PlannedMode::TimeSlicing { replicas } => (*replicas, None),
                        PlannedMode::Mps {
                            replicas,
                            active_thread_percentage,
                            pinned_memory_limit_mib,
                            consumable,
                        } => (
                            *replicas,
                            Some(MpsClient::new(
                                mps_root,
                                resource,
                                *active_thread_percentage,
                                // A consumable GPU's fixed shares (what a server without
                                // consumable capacity is given) split its memory evenly; a
                                // consumable device's claims get their own limits at Prepare.
                                match consumable {
                                    Some(c) => {
                                        Some(crate::mps::consumable::fixed_share_mib(c, *replicas))
                                    }
                                    None => *pinned_memory_limit_mib,
                                },
                            )),
                        ),
                        _ => (1, None),
                    };
                    add(resource, uuid, replicas, mps);
                }
            }
        }
        Inventory { resources }
    }

    /// Advertised device count per resource.
    pub fn counts(&self) -> BTreeMap<String, usize> {
        self.resources
            .iter()
            .map(|(r, d)| (r.clone(), d.devices.len()))
            .collect()
    }
}

fn entries(uuid: &str, gpu: u32, replicas: u64, mps: Option<MpsClient>) -> Vec<DeviceEntry> {
    let entry = |id: String| DeviceEntry {
        id,
        uuid: uuid.to_string(),
        gpu,
        replicas,
        healthy: true,
        mps: mps.clone(),
    };
    if replicas > 1 {
        (0..replicas)
            .map(|n| entry(format!("{uuid}::{n}")))
            .collect()
    } else {
        vec![entry(uuid.to_string())]
    }
}

impl ResourceDevices {
    /// An empty list: what a resource the profile no longer has is advertised as before its
    /// endpoint goes away.
    pub fn empty(resource: &str) -> Self {
        ResourceDevices {
            resource: resource.to_string(),
            devices: Vec::new(),
            fail_requests_greater_than_one: None,
        }
    }

    /// The pipe directories of the MPS daemons this resource's devices reach.
    pub fn mps_pipe_dirs(&self) -> BTreeSet<&Path> {
        self.devices
            .iter()
            .filter_map(|d| d.mps.as_ref())
            .map(|m| m.host_pipe_dir.as_path())
            .collect()
    }

    /// Mark devices Unhealthy whose UUID NVML no longer lists, or whose MPS daemon (by pipe
    /// directory) is not in `live_mps` (and back). True if any changed.
    pub fn set_health(&mut self, present: &BTreeSet<String>, live_mps: &BTreeSet<&Path>) -> bool {
        let mut changed = false;
        for d in &mut self.devices {
            let daemon_up = d
                .mps
                .as_ref()
                .is_none_or(|m| live_mps.contains(m.host_pipe_dir.as_path()));
            let healthy = present.contains(&d.uuid) && daemon_up;
            changed |= d.healthy != healthy;
            d.healthy = healthy;
        }
        changed
    }

    /// What ListAndWatch sends.
    pub fn list(&self) -> api::ListAndWatchResponse {
        api::ListAndWatchResponse {
            devices: self
                .devices
                .iter()
                .map(|d| api::Device {
                    id: d.id.clone(),
                    health: if d.healthy {
                        api::HEALTHY
                    } else {
                        api::UNHEALTHY
                    }
                    .to_string(),
                    topology: None,
                })
                .collect(),
        }
    }

    fn find(&self, id: &str) -> Option<&DeviceEntry> {
        self.devices.iter().find(|d| d.id == id)
    }

    /// One container's allocation: `NVIDIA_VISIBLE_DEVICES` with the unique UUIDs; for MPS
    /// devices the pipe directory (env and mount) and the per-client limits.
    pub fn allocate(
        &self,
        ids: &[String],
    ) -> Result<api::ContainerAllocateResponse, AllocateError> {
        let mut entries = Vec::new();
        for id in ids {
            entries.push(self.find(id).ok_or_else(|| AllocateError::UnknownDevice {
                id: id.clone(),
                resource: self.resource.clone(),
            })?);
        }
        let replicated = entries.iter().any(|e| e.replicas > 1);
        let fail = self
            .fail_requests_greater_than_one
            .unwrap_or_else(|| entries.iter().any(|e| e.mps.is_some()));
        if replicated && ids.len() > 1 && fail {
            return Err(AllocateError::SharedOverOne {
                resource: self.resource.clone(),
                found: ids.len(),
            });
        }
        let mut unique: Vec<&DeviceEntry> = Vec::new();
        for e in entries {
            if !unique.iter().any(|u| u.uuid == e.uuid) {
                unique.push(e);
            }
        }
        let uuids: Vec<&str> = unique.iter().map(|e| e.uuid.as_str()).collect();
        let mut response = api::ContainerAllocateResponse::default();
        response
            .envs
            .insert("NVIDIA_VISIBLE_DEVICES".into(), uuids.join(","));
        let mps: Vec<&MpsClient> = unique.iter().filter_map(|e| e.mps.as_ref()).collect();
        if mps.is_empty() {
            return Ok(response);
        }
        if mps.len() != unique.len() {
            return Err(AllocateError::MpsBesideOthers {
                resource: self.resource.clone(),
            });
        }
        let first = mps[0];
        if mps.iter().any(|m| m.host_pipe_dir != first.host_pipe_dir) {
            // A client process reaches one MPS daemon: the one in CUDA_MPS_PIPE_DIRECTORY.
            return Err(AllocateError::SeveralMpsDaemons {
                resource: self.resource.clone(),
                devices: mps.len(),
            });
        }
        response.envs.insert(
            "CUDA_MPS_PIPE_DIRECTORY".into(),
            first.container_pipe_dir.clone(),
        );
        response.mounts.push(api::Mount {
            container_path: first.container_pipe_dir.clone(),
            host_path: first.host_pipe_dir.display().to_string(),
            read_only: false,
        });
        response.mounts.push(api::Mount {
            container_path: "/dev/shm".into(),
            host_path: first.host_shm_dir.display().to_string(),
            read_only: false,
        });
        if let Some(p) = first.active_thread_percentage {
            response
                .envs
                .insert("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".into(), p.to_string());
        }
        // Device indices as the container sees them: positions in NVIDIA_VISIBLE_DEVICES.
        let limits: Vec<String> = mps
            .iter()
            .enumerate()
            .filter_map(|(i, m)| m.pinned_memory_limit_mib.map(|mib| format!("{i}={mib}M")))
            .collect();
        if !limits.is_empty() {
            response
                .envs
                .insert("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".into(), limits.join(","));
        }
        Ok(response)
    }

    /// `size` devices from `available`, with every `must_include`: replicas packed onto the
    /// least-loaded device (fewest of its replicas handed out), a multi-device request kept on
    /// one device, then on one physical GPU, where the available IDs allow.
    pub fn preferred(
        &self,
        available: &[String],
        must_include: &[String],
        size: usize,
    ) -> Vec<String> {
        let mut chosen: Vec<String> = Vec::new();
        for id in must_include {
            if !chosen.contains(id) {
                chosen.push(id.clone());
            }
        }
        let available: BTreeSet<&str> = available.iter().map(String::as_str).collect();
        // Free devices in advertising order, grouped by UUID (the unit replicas share).
        let mut free: BTreeMap<&str, Vec<&DeviceEntry>> = BTreeMap::new();
        for d in &self.devices {
            if available.contains(d.id.as_str()) && !chosen.contains(&d.id) {
                free.entry(d.uuid.as_str()).or_default().push(d);
            }
        }
        let total = |uuid: &str| self.devices.iter().filter(|d| d.uuid == uuid).count();
        let parent = |uuid: &str| self.devices.iter().find(|d| d.uuid == uuid).map(|d| d.gpu);
        while chosen.len() < size {
            let need = size - chosen.len();
            let used_units: BTreeSet<&str> = chosen
                .iter()
                .filter_map(|id| self.find(id))
                .map(|d| d.uuid.as_str())
                .collect();
            let used_gpus: BTreeSet<u32> = chosen
                .iter()
                .filter_map(|id| self.find(id))
                .map(|d| d.gpu)
                .collect();
            let best = free
                .iter()
                .filter(|(_, devices)| !devices.is_empty())
                .min_by_key(|(uuid, devices)| {
                    let load = total(uuid) - devices.len();
                    (
                        !used_units.contains(*uuid),
                        !parent(uuid).is_some_and(|g| used_gpus.contains(&g)),
                        devices.len() < need,
                        load,
                        parent(uuid),
                        **uuid,
                    )
                })
                .map(|(uuid, _)| *uuid);
            let Some(uuid) = best else {
                break;
            };
            let devices = free.get_mut(uuid).expect("picked from the map");
            let take = need.min(devices.len());
            chosen.extend(devices.drain(..take).map(|d| d.id.clone()));
        }
        chosen.truncate(size.max(must_include.len()));
        chosen
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shared(resource: &str, gpus: &[(&str, u32)], replicas: u64, mps: bool) -> ResourceDevices {
        let client = mps.then(|| {
            MpsClient::new(
                Path::new("/run/nvidia/mps"),
                resource,
                Some(25),
                Some(10240),
            )
        });
        ResourceDevices {
            resource: resource.into(),
            devices: gpus
                .iter()
                .flat_map(|(u, g)| entries(u, *g, replicas, client.clone()))
                .collect(),
            fail_requests_greater_than_one: None,
        }
    }

    fn ids(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn replicas_are_stripped_to_unique_uuids() {
        let r = shared("nvidia.com/gpu", &[("GPU-a", 0), ("GPU-b", 1)], 4, false);
        let a = r.allocate(&ids(&["GPU-a::0", "GPU-a::3"])).unwrap();
        assert_eq!(a.envs["NVIDIA_VISIBLE_DEVICES"], "GPU-a");
        let a = r.allocate(&ids(&["GPU-a::0", "GPU-b::1"])).unwrap();
        assert_eq!(a.envs["NVIDIA_VISIBLE_DEVICES"], "GPU-a,GPU-b");
        assert!(a.mounts.is_empty());
        assert!(r
            .allocate(&ids(&["GPU-c"]))
            .unwrap_err()
            .to_string()
            .contains("unknown"));
    }

    #[test]
    fn mps_clients_get_the_pipe_and_limits_and_one_device() {
        let r = shared("nvidia.com/gpu", &[("GPU-a", 4)], 8, true);
        let a = r.allocate(&ids(&["GPU-a::5"])).unwrap();
        assert_eq!(
            a.envs["CUDA_MPS_PIPE_DIRECTORY"],
            "/mps/nvidia.com/gpu/pipe"
        );
        assert_eq!(a.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "25");
        assert_eq!(a.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], "0=10240M");
        assert_eq!(a.mounts[0].host_path, "/run/nvidia/mps/nvidia.com/gpu/pipe");
        assert_eq!(a.mounts[1].host_path, "/run/nvidia/mps/shm");
        assert_eq!(a.mounts[1].container_path, "/dev/shm");
        let e = r.allocate(&ids(&["GPU-a::0", "GPU-a::1"])).unwrap_err();
        assert!(matches!(e, AllocateError::SharedOverOne { found: 2, .. }));
        assert_eq!(
            e.to_string(),
            "invalid allocation request for \"nvidia.com/gpu\": invalid request: maximum request size for shared resources is 1; found 2"
        );
        let mut allowed = r.clone();
        allowed.fail_requests_greater_than_one = Some(false);
        assert!(allowed.allocate(&ids(&["GPU-a::0", "GPU-a::1"])).is_ok());
    }

    #[test]
    fn mps_on_mig_devices_reaches_each_devices_own_daemon() {
        let resource = "nvidia.com/mig-3g.40gb";
        let root = Path::new("/run/nvidia/mps");
        let mut r = ResourceDevices::empty(resource);
        for uuid in ["MIG-a", "MIG-b"] {
            let client = MpsClient::new(
                root,
                &mig_daemon_name(resource, uuid),
                Some(50),
                Some(10048),
            );
            r.devices.extend(entries(uuid, 0, 4, Some(client)));
        }
        let a = r.allocate(&ids(&["MIG-b::2"])).unwrap();
        assert_eq!(a.envs["NVIDIA_VISIBLE_DEVICES"], "MIG-b");
        assert_eq!(
            a.envs["CUDA_MPS_PIPE_DIRECTORY"],
            "/mps/nvidia.com/mig-3g.40gb/MIG-b/pipe"
        );
        assert_eq!(
            a.mounts[0].host_path,
            "/run/nvidia/mps/nvidia.com/mig-3g.40gb/MIG-b/pipe"
        );
        assert_eq!(a.mounts[1].container_path, "/dev/shm");
        assert_eq!(a.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "50");
        assert_eq!(a.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], "0=10048M");
        // Two replicas of one MIG device share its daemon; two MIG devices can't.
        r.fail_requests_greater_than_one = Some(false);
        assert!(r.allocate(&ids(&["MIG-a::0", "MIG-a::1"])).is_ok());
        let e = r.allocate(&ids(&["MIG-a::0", "MIG-b::0"])).unwrap_err();
        assert!(matches!(
            e,
            AllocateError::SeveralMpsDaemons { devices: 2, .. }
        ));
        assert!(e.to_string().contains("spans 2 MIG devices"), "{e}");

        // A device is healthy while NVML lists it and its own daemon runs.
        let present: BTreeSet<String> = ["MIG-a".to_string(), "MIG-b".to_string()].into();
        let pipes = r.mps_pipe_dirs();
        assert_eq!(pipes.len(), 2);
        let live: BTreeSet<&Path> = pipes
            .iter()
            .copied()
            .filter(|p| p.ends_with("MIG-b/pipe"))
            .collect();
        let mut checked = r.clone();
        assert!(checked.set_health(&present, &live));
        let unhealthy: Vec<&str> = checked
            .devices
            .iter()
            .filter(|d| !d.healthy)
            .map(|d| d.uuid.as_str())
            .collect();
        assert_eq!(unhealthy, ["MIG-a"; 4]);
        let all: BTreeSet<&Path> = r.mps_pipe_dirs();
        assert!(checked.set_health(&present, &all));
        assert!(checked.devices.iter().all(|d| d.healthy));
    }

    #[test]
    fn preferred_packs_onto_the_least_loaded_gpu_and_keeps_requests_together() {
        let r = shared("nvidia.com/gpu", &[("GPU-a", 0), ("GPU-b", 1)], 4, false);
        // GPU-a has two replicas handed out, GPU-b one: GPU-b is least loaded.
        let available = ids(&["GPU-a::2", "GPU-a::3", "GPU-b::1", "GPU-b::2", "GPU-b::3"]);
        assert_eq!(r.preferred(&available, &[], 1), ["GPU-b::1"]);
        assert_eq!(
            r.preferred(&available, &[], 3),
            ["GPU-b::1", "GPU-b::2", "GPU-b::3"]
        );
        // Four fit on no single GPU: the fewest GPUs, starting from the least loaded.
        assert_eq!(
            r.preferred(&available, &[], 4),
            ["GPU-b::1", "GPU-b::2", "GPU-b::3", "GPU-a::2"]
        );
        // A must-include device pulls the rest onto its GPU.
        assert_eq!(
            r.preferred(&available, &ids(&["GPU-a::2"]), 2),
            ["GPU-a::2", "GPU-a::3"]
        );
    }
}
