//! What publishing a node's pool changes, decided without the API (pure): which slices to
//! create, replace and delete, the pool's next generation, and which devices a re-partition
//! withdraws first. [`super::publish`] carries the decisions out.
//!
//! The DRA API's rules (ResourcePool in the resource.k8s.io/v1 reference): "Whenever a driver
//! wants to update a pool, it increments the pool.Spec.Pool.Generation number and updates all
//! ResourceSlices with that new number and new resource definitions. A consumer must only use
//! ResourceSlices with the highest generation number and ignore all others." So every change
//! rewrites every slice of the pool at one new generation, and the generation only grows: it
//! starts above the highest one the API holds (an agent restart never goes backwards).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use sha2::{Digest, Sha256};

use super::api::{DeviceAttribute, ResourceSlice};

/// The annotation each published slice carries: the hash of what gpu-share wrote into it (its
/// spec without the generation). "Unchanged" compares these rather than the specs read back,
/// because the API server writes quantities in canonical form (`10240Mi` reads back as `10Gi`)
/// and drops fields whose feature gate is off (`sharedCounters` without
/// DRAPartitionableDevices): a comparison of specs would see a change on every pass.
pub const CONTENT_ANNOTATION: &str = "gpu-share.dev/slice-content";

/// The writes that make the API's pool equal to the desired one.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolUpdate {
    /// The pool generation every written slice carries.
    pub generation: i64,
    /// New slices (names the API lacks).
    pub create: Vec<ResourceSlice>,
    /// Slices the API has, with their `resourceVersion` (a replace is conditional on it).
    pub replace: Vec<ResourceSlice>,
    /// Names of slices of the pool that are no longer needed.
    pub delete: Vec<String>,
}

/// What the API's pool (`existing`: this node's slices of gpu-share's driver) must become to
/// publish `desired` (as [`super::resource_slices`] makes them; their generation is ignored),
/// owned by `owner`; `None` when it already is that, so nothing is written. `floor` is the
/// highest generation this agent wrote before: the next one is above it and above every
/// existing slice's.
pub fn pool_update(
    existing: &[ResourceSlice],
    desired: Vec<ResourceSlice>,
    owner: &OwnerReference,
    floor: i64,
) -> Option<PoolUpdate> {
    if unchanged(existing, &desired) {
        return None;
    }
    let generation = existing
        .iter()
        .map(|s| s.spec.pool.generation)
        .chain([floor])
        .max()
        .unwrap_or(0)
        + 1;
    let versions: BTreeMap<&str, Option<&String>> = existing
        .iter()
        .map(|s| (name(s), s.metadata.resource_version.as_ref()))
        .collect();
    let mut update = PoolUpdate {
        generation,
        create: Vec::new(),
        replace: Vec::new(),
        delete: Vec::new(),
    };
    let mut wanted = BTreeSet::new();
    for slice in desired {
        let slice = stamped(slice, generation, owner);
        wanted.insert(name(&slice).to_string());
        match versions.get(name(&slice)) {
            Some(version) => {
                let mut slice = slice;
                slice.metadata.resource_version = version.cloned();
                update.replace.push(slice);
            }
            None => update.create.push(slice),
        }
    }
    update.delete = versions
        .keys()
        .filter(|n| !wanted.contains(**n))
        .map(|n| n.to_string())
        .collect();
    Some(update)
}

/// The same slice names, each holding what `desired` would write, all at one generation.
fn unchanged(existing: &[ResourceSlice], desired: &[ResourceSlice]) -> bool {
    if existing.is_empty() {
        return desired.is_empty();
    }
    let generations: BTreeSet<i64> = existing.iter().map(|s| s.spec.pool.generation).collect();
    let held: BTreeMap<&str, Option<&str>> =
        existing.iter().map(|s| (name(s), held_hash(s))).collect();
    generations.len() == 1
        && held.len() == desired.len()
        && desired
            .iter()
            .all(|d| held.get(name(d)) == Some(&Some(content_hash(d).as_str())))
}

/// The content hash an existing slice carries, if gpu-share wrote it.
fn held_hash(slice: &ResourceSlice) -> Option<&str> {
    let annotations = slice.metadata.annotations.as_ref()?;
    annotations.get(CONTENT_ANNOTATION).map(String::as_str)
}

/// `slice` as written: at `generation`, owned by the Node, with its content hash.
fn stamped(mut slice: ResourceSlice, generation: i64, owner: &OwnerReference) -> ResourceSlice {
    let hash = content_hash(&slice);
    slice.spec.pool.generation = generation;
    slice.metadata = ObjectMeta {
        name: slice.metadata.name.take(),
        annotations: Some(BTreeMap::from([(CONTENT_ANNOTATION.to_string(), hash)])),
        owner_references: Some(vec![owner.clone()]),
        ..ObjectMeta::default()
    };
    slice
}

/// The sha256 of the slice's spec with generation 0 (what gpu-share decides; the generation
/// only follows from it).
pub fn content_hash(slice: &ResourceSlice) -> String {
    let mut spec = slice.spec.clone();
    spec.pool.generation = 0;
    let json = serde_json::to_vec(&spec).expect("a slice spec serializes");
    Sha256::digest(&json)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The devices of `current` that `next` does not publish alike: gone, or with other
/// attributes (a MIG device at the same place with another profile is another name already;
/// a share whose GPU changes mode gets other attributes). Attributes, not capacity, decide:
/// capacity read back from the API is in canonical form (`10Gi` for `10240Mi`), and follows
/// from the attributes anyway.
pub fn withdrawn(current: &[ResourceSlice], next: &[ResourceSlice]) -> BTreeSet<String> {
    let kept: BTreeMap<&str, &BTreeMap<String, DeviceAttribute>> = next
        .iter()
        .flat_map(|s| &s.spec.devices)
        .map(|d| (d.name.as_str(), &d.attributes))
        .collect();
    current
        .iter()
        .flat_map(|s| &s.spec.devices)
        .filter(|d| kept.get(d.name.as_str()) != Some(&&d.attributes))
        .map(|d| d.name.clone())
        .collect()
}

/// `current` without the devices named in `gone`: same slice names, counter sets and pool
/// size, fresh metadata (for [`pool_update`]).
pub fn without(current: &[ResourceSlice], gone: &BTreeSet<String>) -> Vec<ResourceSlice> {
    current
        .iter()
        .map(|s| {
            let mut slice = s.clone();
            slice.metadata = ObjectMeta {
                name: s.metadata.name.clone(),
                ..ObjectMeta::default()
            };
            slice.spec.devices.retain(|d| !gone.contains(&d.name));
            slice
        })
        .collect()
}

/// Whether the API server stored `sent` without the counters it carried: counter sets gone, or
/// a device that consumed counters stored without them. That is what a server with
/// `DRAPartitionableDevices` off does (the 1.34 and 1.35 default): it drops those fields and
/// accepts the write (`dropDisabledDRAPartitionableDevicesFields`,
/// pkg/registry/resource/resourceslice/strategy.go), so only the stored object tells.
pub fn counters_dropped(sent: &ResourceSlice, stored: &ResourceSlice) -> bool {
    let sets_dropped =
        !sent.spec.shared_counters.is_empty() && stored.spec.shared_counters.is_empty();
    sets_dropped || device_field_dropped(sent, stored, |d| !d.consumes_counters.is_empty())
}

/// Whether a device of `sent` that `has` a field was stored without it (or not at all).
fn device_field_dropped(
    sent: &ResourceSlice,
    stored: &ResourceSlice,
    has: impl Fn(&super::api::Device) -> bool,
) -> bool {
    sent.spec.devices.iter().filter(|d| has(d)).any(|d| {
        !stored
            .spec
            .devices
            .iter()
            .find(|s| s.name == d.name)
            .is_some_and(&has)
    })
}

/// Whether the API server stored `sent` without the taints of one of its devices: what a
/// server with `DRADeviceTaints` off does (`dropDisabledDRADeviceTaintsFields`,
/// pkg/registry/resource/resourceslice/strategy.go, 1.36) and, as with counters, only the stored
/// object tells.
pub fn taints_dropped(sent: &ResourceSlice, stored: &ResourceSlice) -> bool {
    device_field_dropped(sent, stored, |d| !d.taints.is_empty())
}

/// Whether the API server stored `sent` with a consumable device no longer shareable: what a
/// server with `DRAConsumableCapacity` off does (`dropDisabledDRAConsumableCapacityFields`,
/// pkg/registry/resource/resourceslice/strategy.go, 1.36: `allowMultipleAllocations` and every
/// capacity's `requestPolicy` dropped, the write accepted). Only the stored object tells.
pub fn consumable_dropped(sent: &ResourceSlice, stored: &ResourceSlice) -> bool {
    device_field_dropped(sent, stored, super::api::Device::is_consumable)
}

/// The Node as the owner of its slices: they go when the Node object goes (garbage
/// collection), as the kubelet's DRA helper does for node-local pools.
pub fn node_owner(node_name: &str, node_uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: "v1".into(),
        kind: "Node".into(),
        name: node_name.into(),
        uid: node_uid.into(),
        controller: Some(true),
        block_owner_deletion: None,
    }
}

fn name(slice: &ResourceSlice) -> &str {
    slice.metadata.name.as_deref().unwrap_or_default()
}

#[cfg(test)]
mod tests;
