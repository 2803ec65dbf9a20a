//! Dynamic MIG devices (`dynamicMig: true`): every placement a GPU could hold, published so that
//! the scheduler picks one per ResourceClaim and the kubelet plugin makes the instance at
//! Prepare (docs/dra.md, "Dynamic MIG"). Pure, like the rest of [`crate::dra`].
//!
//! A dynamic GPU's counter set (KEP-4815 partitionable devices; the layout is gpu-share's):
//!
//! | counter | value | consumed by |
//! |---|---|---|
//! | `memory-slice-<k>`, one per memory slot | 1 | each placement, the slots it covers |
//! | `compute-slices` | the GPU's compute slices | each profile, its slice count |
//! | `ofa` | 1 | `+me` / `+me.all` profiles and the whole GPU (the GPU has one OFA) |
//! | `media-engines` | the most instances the GPU holds | 1 per profile with media engines; a `+me.all` profile takes all; `-me` none |
//!
//! Per-slot counters make overlap impossible to allocate, whichever placements are chosen; the
//! OFA counter is what keeps a second `+me` instance from being allocated (NVML's instance
//! count 1 for `+me`), and the media counter what keeps a `+me.all` instance alone with `-me`
//! ones (nvml.h: such an instance "prevents allocation of all but _NO_ME profiles"). Copy
//! engines, decoders and JPEG engines follow the slices (the catalog's figures show no packing
//! over the whole GPU's), so they are capacities a selector can read, not counters: a counter
//! would add no refusal the slots don't make, and models whose figures are unknown would get
//! wrong ones.
//!
//! The whole GPU is a device too (`gpu-<i>`), consuming every counter: preparing it turns MIG
//! off, so a claim can have the GPU without MIG when nothing else is allocated on it.
//!
//! Instances on a dynamic GPU that no claim made (out of band: `nvidia-smi mig -cgi`, another
//! tool, a previous static geometry) take slots the counters do not know about, so every device
//! overlapping one is left out of the slices, and the whole GPU with them.

use std::collections::BTreeSet;

use super::api::{count, mebibytes, Device, DeviceAttribute, DeviceCounterConsumption};
use super::{capacity, counter, counter_set_name, GpuDevices, Parent};
use crate::dra::api::CounterSet;
use crate::mig::{GpuInstanceProfile, GpuModel, Placement};

pub const COMPUTE_SLICES: &str = super::COMPUTE_SLICES;
pub const OFA: &str = "ofa";
pub const MEDIA_ENGINES: &str = "media-engines";

/// The counter of memory slot `k`.
pub fn memory_slice(k: u32) -> String {
    format!("memory-slice-{k}")
}

/// The instances on the node that claims made, by GPU and placement: written to the plugin's
/// journal before each create, so an instance found on a dynamic GPU and not here was made out
/// of band.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClaimedInstances(pub BTreeSet<(u32, Placement)>);

impl ClaimedInstances {
    pub fn contains(&self, gpu: u32, placement: Placement) -> bool {
        self.0.contains(&(gpu, placement))
    }
}

/// Whether devices are listed in first-fit order ([`first_fit_order`]) or in catalog order
/// (for the packing benchmark's comparison).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    FirstFit,
    Catalog,
}

/// A dynamic GPU's devices and counter set, leaving out what overlaps `foreign` placements.
pub(super) fn gpu_devices(parent: &Parent, model: &GpuModel, foreign: &[Placement]) -> GpuDevices {
    let overlaps_foreign = |p: Placement| foreign.iter().any(|f| f.mask() & p.mask() != 0);
    let mut devices: Vec<Device> = placements(model, Order::FirstFit)
        .into_iter()
        .filter(|(_, placement)| !overlaps_foreign(*placement))
        .map(|(profile, placement)| mig_device(parent, model, profile, placement))
        .collect();
    if foreign.is_empty() {
        devices.push(whole_gpu(parent, model));
    }
    GpuDevices {
        devices,
        counters: Some(counter_set(parent.index, model)),
    }
}

/// Every (profile, placement) of the model, in `order`.
///
/// The scheduler allocates first fit: for a request it takes the first listed device whose
/// counters are free, knowing nothing of MIG fragmentation. So small profiles come first and,
/// within a profile:
/// 1. placements that keep the rest of their aligned block usable by the same profile first: a
///    1g at slot 6 of an H100 strands slot 7, which no 1g can use (only a 1g.20gb at 6:2, the
///    second 3g or the 7g), so slot 6 comes last for the 1g;
/// 2. then those that the fewest larger placements overlap: slots 4-5 (the second 3g, a 2g,
///    the 7g) before slots 0-3 (also the 4g and the first 3g);
/// 3. then the higher start.
///
/// On an H100 that lists the 1g at 5, 4, 3, 2, 1, 0, 6 and the 3g at 4 before 0. Measured with
/// `cargo bench --bench dynamic_mig` against the catalog's order (benches/README.md).
pub fn placements(model: &GpuModel, order: Order) -> Vec<(&GpuInstanceProfile, Placement)> {
    let mut all: Vec<(&GpuInstanceProfile, Placement)> = model
        .gpu_instance_profiles
        .iter()
        .flat_map(|p| p.placements.iter().map(move |&placement| (p, placement)))
        .collect();
    if order == Order::FirstFit {
        all.sort_by_key(|(profile, placement)| {
            (
                profile.slots(),
                profile.slice_count,
                strands_its_block(profile, *placement),
                blocked_by(model, profile, *placement),
                std::cmp::Reverse(placement.start),
            )
        });
    }
    all
}

/// Whether an instance at `placement` leaves part of its aligned block (twice its size) that no
/// placement of its own profile can use.
fn strands_its_block(profile: &GpuInstanceProfile, placement: Placement) -> bool {
    let block = 2 * placement.size;
    let first = placement.start / block * block;
    (first..first + block)
        .step_by(placement.size as usize)
        .filter(|&start| start != placement.start)
        .any(|start| {
            !profile.placements.contains(&Placement {
                start,
                size: placement.size,
            })
        })
}

/// How many placements of larger profiles (more slots or more compute slices) `placement`
/// overlaps: what an instance there keeps from being allocated.
fn blocked_by(model: &GpuModel, profile: &GpuInstanceProfile, placement: Placement) -> usize {
    model
        .gpu_instance_profiles
        .iter()
        .filter(|other| (other.slots(), other.slice_count) > (profile.slots(), profile.slice_count))
        .flat_map(|other| &other.placements)
        .filter(|other| other.mask() & placement.mask() != 0)
        .count()
}

/// The counter set of a dynamic GPU (module doc).
fn counter_set(index: u32, model: &GpuModel) -> CounterSet {
    let mut counters: std::collections::BTreeMap<String, _> = (0..model.memory_slots)
        .map(|k| (memory_slice(k), counter(1)))
        .collect();
    counters.insert(COMPUTE_SLICES.into(), counter(model.compute_slices.into()));
    counters.insert(OFA.into(), counter(1));
    counters.insert(MEDIA_ENGINES.into(), counter(model.max_mig_devices.into()));
    CounterSet {
        name: counter_set_name(index),
        counters,
    }
}

/// The OFA and media-engine share of a profile (module doc).
fn engines(model: &GpuModel, profile: &GpuInstanceProfile) -> (u64, u64) {
    let ofa = u64::from(profile.engines.ofa.unwrap_or(0) > 0 || profile.name.contains("+me"));
    let media = if profile.takes_all_media_engines() {
        model.max_mig_devices.into()
    } else if profile.has_no_media_engines() {
        0
    } else {
        1
    };
    (ofa, media)
}

/// `gpu-<i>-mig-<start>-<profile>`, as a static MIG device of the same placement is named, with
/// `dynamic: true` and no UUID (the instance does not exist until a claim is prepared).
fn mig_device(
    parent: &Parent,
    model: &GpuModel,
    profile: &GpuInstanceProfile,
    placement: Placement,
) -> Device {
    let instance = crate::mig::PlacedInstance {
        profile: profile.name.clone(),
        placement,
    };
    let mut device = parent.mig_device_without_uuid(&instance);
    dynamic(&mut device);
    for (name, value) in [
        ("multiprocessors", profile.engines.sm_count),
        ("copyEngines", profile.engines.copy_engines),
        ("decoders", profile.engines.decoders),
        ("encoders", profile.engines.encoders),
        ("jpegEngines", profile.engines.jpeg),
        ("ofa", profile.engines.ofa),
    ] {
        if let Some(n) = value {
            capacity(&mut device, name, count(n.into()));
        }
    }
    let (ofa, media) = engines(model, profile);
    let mut consumed: std::collections::BTreeMap<String, _> = (placement.start
        ..placement.start + placement.size)
        .map(|k| (memory_slice(k), counter(1)))
        .collect();
    consumed.insert(COMPUTE_SLICES.into(), counter(profile.slice_count.into()));
    if ofa > 0 {
        consumed.insert(OFA.into(), counter(ofa));
    }
    if media > 0 {
        consumed.insert(MEDIA_ENGINES.into(), counter(media));
    }
    device.consumes_counters = vec![DeviceCounterConsumption {
        counter_set: counter_set_name(parent.index),
        counters: consumed,
    }];
    device
}

/// The whole GPU, consuming every counter of its set.
fn whole_gpu(parent: &Parent, model: &GpuModel) -> Device {
    let mut device = parent.whole_gpu();
    dynamic(&mut device);
    if !device.capacity.contains_key("memory") {
        capacity(&mut device, "memory", mebibytes(model.total_memory_mib));
    }
    device.consumes_counters = vec![DeviceCounterConsumption {
        counter_set: counter_set_name(parent.index),
        counters: counter_set(parent.index, model).counters,
    }];
    device
}

fn dynamic(device: &mut Device) {
    device.attributes.insert(
        "dynamic".into(),
        DeviceAttribute {
            bool: Some(true),
            ..DeviceAttribute::default()
        },
    );
}

/// What the kubelet plugin needs to make a dynamic device: read back from its attributes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DynamicDevice {
    /// A MIG instance of `profile` at `placement` on GPU `gpu`.
    Mig {
        gpu: u32,
        profile: String,
        placement: Placement,
    },
    /// The whole GPU `gpu`, MIG off.
    WholeGpu { gpu: u32 },
}

impl DynamicDevice {
    /// The dynamic device `device` describes, or `None` for a device that exists already
    /// (static MIG, a whole GPU, a share).
    pub fn of(device: &Device) -> Option<DynamicDevice> {
        let attrs = &device.attributes;
        if attrs.get("dynamic").and_then(|a| a.bool) != Some(true) {
            return None;
        }
        let int = |key: &str| attrs.get(key).and_then(|a| a.int);
        let gpu = u32::try_from(int("parentIndex")?).ok()?;
        match attrs.get("migProfile").and_then(|a| a.string.clone()) {
            Some(profile) => Some(DynamicDevice::Mig {
                gpu,
                profile,
                placement: Placement {
                    start: u32::try_from(int("migPlacementStart")?).ok()?,
                    size: u32::try_from(int("migPlacementSize")?).ok()?,
                },
            }),
            None => Some(DynamicDevice::WholeGpu { gpu }),
        }
    }
}

pub mod first_fit;

#[cfg(test)]
mod tests;
