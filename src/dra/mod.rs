//! Dynamic Resource Allocation: the resource.k8s.io/v1 ResourceSlices a node
//! publishes for its planned GPUs. This module is pure: it turns the plan's GPUs into API
//! objects; [`pool`] decides (also purely) what a publish writes and which devices a
//! re-partition withdraws first, and [`publish`] writes it through the API for
//! `agent --plugin dra` (docs/dra.md).
//!
//! One device per thing a pod can be given, exactly the units `plan` advertises as extended
//! resources: a whole exclusive GPU, a MIG device, or one share of a time-sliced or MPS GPU (or
//! MIG device). All devices of a node are one pool named after the node, split into several
//! slices when the API's per-slice limits ([`api::MAX_DEVICES_PER_SLICE`] and the counter limits)
//! require it; counter sets go in slices of their own (the v1 API allows a slice devices or
//! counter sets, not both).
//!
//! Shared counters (KEP-4815) describe what is physically partitioned: a MIG GPU declares its
//! compute and memory slices, and each unshared MIG device consumes its profile's slices, so the
//! sums can never exceed the GPU. Shares (time-sliced or MPS, of a GPU or of a MIG device)
//! consume no counter: time-slicing partitions nothing (each share sees the whole memory and
//! every SM in turn), and MPS's thread percentage and pinned-memory limit are per-client caps
//! the driver lets clients oversubscribe; a counter the scheduler enforces would refuse
//! allocations the hardware allows. The shares are distinct devices, so none is handed out
//! twice without counters.

pub mod api;
pub mod consumable;
pub mod dynamic;
pub mod kubelet_plugin;
pub mod pool;
pub mod publish;
pub mod quantity;
pub mod taints;

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::gpu::{ObservedGpu, ObservedNode};
use crate::mig::{catalog, GpuModel, PlacedInstance};
use crate::sharing::{GpuPlan, PlannedMode};
use api::{
    count, mebibytes, Counter, CounterSet, Device, DeviceAttribute, DeviceCapacity,
    DeviceCounterConsumption, ResourcePool, ResourceSlice, ResourceSliceSpec,
};

/// The DRA driver name gpu-share publishes under (a DNS subdomain, as the API requires).
pub const DRIVER: &str = "gpu.gpu-share.dev";

/// Why `apply --plugin dra` refuses: it is node-local and has no Kubernetes API to publish
/// through, and re-partitioning with nothing publishing the result would leave the node's GPUs
/// unusable by claims (the slices of the old layout would still be allocated).
pub const APPLY_NEEDS_AGENT: &str = "--plugin dra: the node's ResourceSlices are published \
through the Kubernetes API by `gpu-share agent --plugin dra`, which `apply` (node-local) does not \
use; run the agent with --plugin dra, or see what it would publish with `gpu-share plan \
--plugin dra`";

/// Counter names (DNS labels) in a MIG GPU's counter set.
pub const COMPUTE_SLICES: &str = "compute-slices";
pub const MEMORY_SLICES: &str = "memory-slices";

/// The sharing mode a device is published with, as its `sharing` attribute.
const EXCLUSIVE: &str = "exclusive";
const MIG: &str = "mig";
const MPS: &str = "mps";
const TIME_SLICING: &str = "timeSlicing";

/// The node's ResourceSlices for the planned `gpus`: one pool named `node_name`, at
/// `generation` (the caller bumps it on every change), as many slices as the API limits need.
/// `node` supplies what NVML knows (UUIDs, memory). Every instance on a dynamic-MIG GPU counts
/// as made out of band (no journal is read): the most cautious publish, for a plan without the
/// node's journal; the agent and `plan` on the node call [`resource_slices_with`].
pub fn resource_slices(
    node_name: &str,
    generation: i64,
    gpus: &[GpuPlan],
    node: &ObservedNode,
) -> Vec<ResourceSlice> {
    resource_slices_with(
        node_name,
        generation,
        gpus,
        node,
        &dynamic::ClaimedInstances::default(),
    )
}

/// [`resource_slices`], knowing which instances on dynamic-MIG GPUs claims made (the others
/// are out of band: what they overlap is left out).
pub fn resource_slices_with(
    node_name: &str,
    generation: i64,
    gpus: &[GpuPlan],
    node: &ObservedNode,
    claimed: &dynamic::ClaimedInstances,
) -> Vec<ResourceSlice> {
    let groups: Vec<GpuDevices> = gpus
        .iter()
        .map(|plan| {
            gpu_devices(
                plan,
                node.gpus.iter().find(|g| g.index == plan.index),
                claimed,
            )
        })
        .collect();
    numbered(node_name, generation, pack(groups))
}

/// The pool `slices` (as [`resource_slices_with`] makes them) in the form that stays safe on
/// an API server without `DRAPartitionableDevices` (off by default before Kubernetes 1.36).
/// That server drops every counter set and `consumesCounters` it is sent, so a dynamic-MIG
/// GPU's placements and its whole device would stand as independent devices and the scheduler
/// could allocate overlapping ones. So: no counters, and no dynamic MIG placement (a dynamic
/// GPU is offered whole only). Every other device stays: a static MIG device is one existing
/// instance and a share one share, so none overlaps another without counters either.
pub fn without_counters(slices: &[ResourceSlice]) -> Vec<ResourceSlice> {
    let Some(first) = slices.first() else {
        return Vec::new();
    };
    let devices = slices
        .iter()
        .flat_map(|s| &s.spec.devices)
        .filter(|d| {
            !matches!(
                dynamic::DynamicDevice::of(d),
                Some(dynamic::DynamicDevice::Mig { .. })
            )
        })
        .map(|d| Device {
            consumes_counters: Vec::new(),
            ..d.clone()
        })
        .collect();
    let group = GpuDevices {
        devices,
        counters: None,
    };
    numbered(
        &first.spec.node_name,
        first.spec.pool.generation,
        pack(vec![group]),
    )
}

/// The packed slices as pool `node_name`'s, named `<node>-gpu-share-<k>`.
fn numbered(
    node_name: &str,
    generation: i64,
    packed: Vec<(Vec<Device>, Vec<CounterSet>)>,
) -> Vec<ResourceSlice> {
    let total = packed.len() as i64;
    packed
        .into_iter()
        .enumerate()
        .map(|(k, (devices, shared_counters))| ResourceSlice {
            api_version: api::API_VERSION,
            kind: "ResourceSlice",
            metadata: ObjectMeta {
                name: Some(format!("{node_name}-gpu-share-{k}")),
                ..ObjectMeta::default()
            },
            spec: ResourceSliceSpec {
                driver: DRIVER.to_string(),
                pool: ResourcePool {
                    name: node_name.to_string(),
                    generation,
                    resource_slice_count: total,
                },
                node_name: node_name.to_string(),
                devices,
                shared_counters,
            },
        })
        .collect()
}

/// One GPU's devices, with the counter set they consume from (MIG GPUs only).
struct GpuDevices {
    devices: Vec<Device>,
    counters: Option<CounterSet>,
}

/// Slices as (devices, counter sets). resource.k8s.io/v1 lets a slice hold devices or
/// counter sets, never both, and resolves a device's `consumesCounters` by counter-set name
/// within the pool: the devices go first, GPUs in order, a new slice started before 128 devices
/// (64 once one of them consumes counters or is tainted); then the counter sets, 8 to a slice. A node without
/// MIG GPUs has device slices only, so their names stay as before.
fn pack(groups: Vec<GpuDevices>) -> Vec<(Vec<Device>, Vec<CounterSet>)> {
    let mut slices: Vec<(Vec<Device>, Vec<CounterSet>)> = Vec::new();
    let mut sets = Vec::new();
    let mut current: Vec<Device> = Vec::new();
    for group in groups {
        sets.extend(group.counters);
        for device in group.devices {
            let consuming = current
                .iter()
                .chain([&device])
                .any(|d| !d.consumes_counters.is_empty() || !d.taints.is_empty());
            let limit = if consuming {
                api::MAX_DEVICES_PER_SLICE_CONSUMING_COUNTERS
            } else {
                api::MAX_DEVICES_PER_SLICE
            };
            if current.len() + 1 > limit {
                slices.push((std::mem::take(&mut current), Vec::new()));
            }
            current.push(device);
        }
    }
    if !current.is_empty() || slices.is_empty() {
        slices.push((current, Vec::new()));
    }
    for chunk in sets.chunks(api::MAX_COUNTER_SETS_PER_SLICE) {
        slices.push((Vec::new(), chunk.to_vec()));
    }
    slices
}

/// The instances on GPU `observed` that no claim made, by placement.
pub fn out_of_band(
    observed: &ObservedGpu,
    claimed: &dynamic::ClaimedInstances,
) -> Vec<crate::mig::ExistingInstance> {
    if !observed.mig.is_some_and(|m| m.current) {
        return Vec::new();
    }
    observed
        .instances
        .iter()
        .filter(|i| !claimed.contains(observed.index, i.placement))
        .cloned()
        .collect()
}

/// The devices of one planned GPU.
fn gpu_devices(
    plan: &GpuPlan,
    observed: Option<&ObservedGpu>,
    claimed: &dynamic::ClaimedInstances,
) -> GpuDevices {
    let parent = Parent::new(plan, observed);
    match &plan.mode {
        PlannedMode::DynamicMig => match parent.model {
            Some(model) => {
                let foreign: Vec<crate::mig::Placement> = observed
                    .map(|o| out_of_band(o, claimed))
                    .unwrap_or_default()
                    .iter()
                    .map(|i| i.placement)
                    .collect();
                dynamic::gpu_devices(&parent, model, &foreign)
            }
            // The plan makes a GPU dynamic only when the catalog knows it.
            None => GpuDevices {
                devices: vec![parent.whole_gpu()],
                counters: None,
            },
        },
        PlannedMode::Exclusive => GpuDevices {
            devices: vec![parent.whole_gpu()],
            counters: None,
        },
        PlannedMode::TimeSlicing { replicas } => GpuDevices {
            devices: parent.shares(&parent.whole_gpu(), TIME_SLICING, *replicas),
            counters: None,
        },
        PlannedMode::Mps {
            replicas,
            consumable: Some(shares),
            ..
        } => GpuDevices {
            devices: vec![consumable::device(parent.whole_gpu(), shares, *replicas)],
            counters: None,
        },
        PlannedMode::Mps {
            replicas,
            active_thread_percentage,
            pinned_memory_limit_mib,
            consumable: None,
        } => {
            let mut gpu = parent.whole_gpu();
            mps_limits(
                &mut gpu,
                *active_thread_percentage,
                *pinned_memory_limit_mib,
            );
            GpuDevices {
                devices: parent.shares(&gpu, MPS, *replicas),
                counters: None,
            }
        }
        PlannedMode::Mig { replicas, mps, .. } => {
            let instances = plan
                .geometry
                .as_ref()
                .map(|g| g.target())
                .unwrap_or_default();
            let mut devices = Vec::new();
            for instance in &instances {
                let mut mig = parent.mig_device(instance);
                if *replicas <= 1 {
                    devices.push(mig);
                    continue;
                }
                mig.consumes_counters.clear();
                if let Some(shares) = mps
                    .as_ref()
                    .and_then(|m| m.consumable.get(&instance.profile))
                {
                    devices.push(consumable::device(mig, shares, *replicas));
                    continue;
                }
                let sharing = match mps {
                    Some(m) => {
                        let pinned = m.pinned_memory_limit_mib.get(&instance.profile).copied();
                        mps_limits(&mut mig, m.active_thread_percentage, pinned);
                        MPS
                    }
                    None => TIME_SLICING,
                };
                devices.extend(parent.shares(&mig, sharing, *replicas));
            }
            let consumes = devices.iter().any(|d| !d.consumes_counters.is_empty());
            GpuDevices {
                devices,
                counters: parent
                    .model
                    .filter(|_| consumes)
                    .map(|m| mig_counter_set(plan.index, m)),
            }
        }
    }
}

/// What a GPU's devices inherit from it.
struct Parent<'a> {
    index: u32,
    product: &'a str,
    model: Option<&'static GpuModel>,
    observed: Option<&'a ObservedGpu>,
}

impl<'a> Parent<'a> {
    fn new(plan: &'a GpuPlan, observed: Option<&'a ObservedGpu>) -> Self {
        Parent {
            index: plan.index,
            product: &plan.product,
            model: catalog().model_by_product(&plan.product),
            observed,
        }
    }

    /// The whole GPU, exclusive: `gpu-<index>`.
    fn whole_gpu(&self) -> Device {
        let mut device = self.device(format!("gpu-{}", self.index), EXCLUSIVE);
        if let Some(uuid) = self.observed.and_then(|o| o.uuid.as_deref()) {
            string(&mut device, "uuid", uuid);
        }
        if let Some(mib) = self.observed.and_then(|o| o.memory_mib) {
            capacity(&mut device, "memory", mebibytes(mib));
        }
        device
    }

    /// A MIG device: `gpu-<index>-mig-<start>-<profile>`, consuming its slices of the GPU,
    /// with its UUID when the instance exists.
    fn mig_device(&self, instance: &PlacedInstance) -> Device {
        let mut device = self.mig_device_without_uuid(instance);
        if let Some(uuid) = self.mig_uuid(instance) {
            string(&mut device, "uuid", uuid);
        }
        device
    }

    fn mig_device_without_uuid(&self, instance: &PlacedInstance) -> Device {
        let name = format!(
            "gpu-{}-mig-{}-{}",
            self.index,
            instance.placement.start,
            dns_label_part(&instance.profile)
        );
        let mut device = self.device(name, MIG);
        string(&mut device, "migProfile", &instance.profile);
        int(
            &mut device,
            "migPlacementStart",
            instance.placement.start.into(),
        );
        int(
            &mut device,
            "migPlacementSize",
            instance.placement.size.into(),
        );
        let profile = self.model.and_then(|m| m.profile(&instance.profile));
        if let Some(mib) = profile.and_then(|p| p.memory_mib) {
            capacity(&mut device, "memory", mebibytes(mib));
        }
        if let Some(p) = profile {
            capacity(&mut device, "computeSlices", count(p.slice_count.into()));
            device.consumes_counters.push(DeviceCounterConsumption {
                counter_set: counter_set_name(self.index),
                counters: BTreeMap::from([
                    (COMPUTE_SLICES.to_string(), counter(p.slice_count.into())),
                    (
                        MEMORY_SLICES.to_string(),
                        counter(instance.placement.size.into()),
                    ),
                ]),
            });
        }
        device
    }

    /// The UUID of the MIG device at this placement, when it exists already (a kept instance).
    fn mig_uuid(&self, instance: &PlacedInstance) -> Option<&'a str> {
        let observed = self.observed?;
        let gi = observed.instances.iter().find(|i| {
            i.profile == instance.profile && i.placement == instance.placement && i.gi_id.is_some()
        })?;
        let devices = observed.mig_devices();
        let found = devices.iter().find(|d| Some(d.gi_id) == gi.gi_id)?;
        found.uuid
    }

    /// `replicas` shares of `base` (a whole GPU or a MIG device): [`shares_of`].
    fn shares(&self, base: &Device, sharing: &str, replicas: u64) -> Vec<Device> {
        shares_of(base, sharing, replicas)
    }

    /// A device with the attributes every device of this GPU carries.
    fn device(&self, name: String, sharing: &str) -> Device {
        let mut device = Device {
            name,
            attributes: BTreeMap::new(),
            capacity: BTreeMap::new(),
            consumes_counters: Vec::new(),
            taints: Vec::new(),
            allow_multiple_allocations: None,
        };
        string(&mut device, "sharing", sharing);
        string(&mut device, "productName", self.product);
        int(&mut device, "parentIndex", self.index.into());
        if let Some(model) = self.model {
            string(&mut device, "model", &model.key);
        }
        if sharing != EXCLUSIVE {
            if let Some(uuid) = self.observed.and_then(|o| o.uuid.as_deref()) {
                string(&mut device, "parentUUID", uuid);
            }
        }
        device
    }
}

/// `replicas` shares of `base` (a whole GPU or a MIG device): `<base>-share-<k>`, each with
/// `base`'s attributes and capacity, `sharing` set and no counters consumed (module doc).
fn shares_of(base: &Device, sharing: &str, replicas: u64) -> Vec<Device> {
    (0..replicas)
        .map(|k| {
            let mut share = base.clone();
            share.name = format!("{}-share-{k}", base.name);
            share.consumes_counters.clear();
            string(&mut share, "sharing", sharing);
            int(&mut share, "shareIndex", k as i64);
            int(&mut share, "replicas", replicas as i64);
            // The shared device's UUID names the parent of every share: the GPU's, or the
            // MIG device's (`migUUID`) beside the GPU's `parentUUID`.
            if let Some(uuid) = share.attributes.remove("uuid") {
                let key = if share.attributes.contains_key("parentUUID") {
                    "migUUID"
                } else {
                    "parentUUID"
                };
                share.attributes.insert(key.into(), uuid);
            }
            share
        })
        .collect()
}

/// `devices` and `counter_sets` packed again as the pool `like` belongs to (node, generation):
/// for a publish that swaps some devices for others.
fn repacked(
    like: &ResourceSlice,
    devices: Vec<Device>,
    counter_sets: Vec<CounterSet>,
) -> Vec<ResourceSlice> {
    let mut groups = vec![GpuDevices {
        devices,
        counters: None,
    }];
    groups.extend(counter_sets.into_iter().map(|set| GpuDevices {
        devices: Vec::new(),
        counters: Some(set),
    }));
    numbered(
        &like.spec.node_name,
        like.spec.pool.generation,
        pack(groups),
    )
}

/// MPS limits on a device about to be shared: attributes a selector can match on, and the
/// pinned-memory limit as the share's memory capacity.
fn mps_limits(device: &mut Device, active_thread_percentage: Option<u32>, pinned_mib: Option<u64>) {
    if let Some(pct) = active_thread_percentage {
        int(device, "mpsActiveThreadPercentage", pct.into());
    }
    if let Some(mib) = pinned_mib {
        int(device, "mpsPinnedMemoryLimitMiB", mib as i64);
        capacity(device, "memory", mebibytes(mib));
    }
}

/// A MIG GPU's counters: every compute and memory slice the model has.
fn mig_counter_set(index: u32, model: &GpuModel) -> CounterSet {
    CounterSet {
        name: counter_set_name(index),
        counters: BTreeMap::from([
            (
                COMPUTE_SLICES.to_string(),
                counter(model.compute_slices.into()),
            ),
            (
                MEMORY_SLICES.to_string(),
                counter(model.memory_slots.into()),
            ),
        ]),
    }
}

fn counter_set_name(index: u32) -> String {
    format!("gpu-{index}")
}

fn counter(n: u64) -> Counter {
    Counter { value: count(n) }
}

fn string(device: &mut Device, name: &str, value: &str) {
    device
        .attributes
        .insert(name.into(), DeviceAttribute::string(value));
}

fn int(device: &mut Device, name: &str, value: i64) {
    device
        .attributes
        .insert(name.into(), DeviceAttribute::int(value));
}

fn capacity(
    device: &mut Device,
    name: &str,
    value: k8s_openapi::apimachinery::pkg::api::resource::Quantity,
) {
    device.capacity.insert(
        name.into(),
        DeviceCapacity {
            value,
            request_policy: None,
        },
    );
}

/// A MIG profile as part of a DNS label: `1g.10gb+me` → `1g-10gb-me`, `1g.24gb-me` (no media
/// engines) → `1g-24gb-no-me`, so that a model with both (RTX PRO 6000) names them apart.
fn dns_label_part(profile: &str) -> String {
    let profile = match profile.strip_suffix("-me") {
        Some(base) => format!("{base}-no-me"),
        None => profile.to_string(),
    };
    profile
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect()
}

#[cfg(test)]
mod tests;
