//! The pool's write decisions against the DRA API's pool rules (module doc of `pool`): one
//! generation per change, never backwards, nothing written when unchanged, old slices deleted,
//! and the devices a re-partition withdraws.

use std::collections::BTreeSet;

use super::*;
use crate::dra::api::{mebibytes, ResourceSlice};
use crate::dra::resource_slices;
use crate::plan::{plan_for, ObservedNode};
use crate::profile::parse_profile;
use crate::sharing::PluginKind;

fn owner() -> OwnerReference {
    node_owner("node-a", "uid-a")
}

/// 8 × 48 time-sliced shares on h100x8: a pool of three slices.
const TIME_SLICED_48: &str =
    "version: v1\nrules:\n  - devices: all\n    timeSlicing: {replicas: 48}\n";

/// The slices `profile` (a file under profiles/, or [`TIME_SLICED_48`]) publishes on
/// simulated `gpus`.
fn slices_for(profile: &str, gpus: &str) -> Vec<ResourceSlice> {
    let text = if profile == TIME_SLICED_48 {
        profile.to_string()
    } else {
        let path = format!("{}/profiles/{profile}.yaml", env!("CARGO_MANIFEST_DIR"));
        std::fs::read_to_string(path).unwrap()
    };
    let profile = parse_profile("p", &text).unwrap();
    let node = ObservedNode::simulated(&[gpus.to_string()]);
    let plan = plan_for("p", &profile, &node, PluginKind::Dra).unwrap();
    resource_slices("node-a", 0, &plan.gpus, &node)
}

/// What the API holds after `update`: every written slice with a resourceVersion, the
/// deleted ones gone.
fn stored(update: &PoolUpdate) -> Vec<ResourceSlice> {
    update
        .create
        .iter()
        .chain(&update.replace)
        .enumerate()
        .map(|(k, s)| {
            let mut s = s.clone();
            s.metadata.resource_version = Some(format!("{}", 1000 + k));
            s
        })
        .collect()
}

fn names(slices: &[ResourceSlice]) -> BTreeSet<String> {
    slices
        .iter()
        .map(|s| s.metadata.name.clone().unwrap())
        .collect()
}

#[test]
fn a_first_publish_creates_every_slice_at_generation_1_owned_by_the_node() {
    let desired = slices_for("h100-balanced", "h100x2");
    let update = pool_update(&[], desired.clone(), &owner(), 0).expect("a change");
    assert_eq!(update.generation, 1);
    assert_eq!(names(&update.create), names(&desired));
    assert!(update.replace.is_empty() && update.delete.is_empty());
    for slice in &update.create {
        assert_eq!(slice.spec.pool.generation, 1);
        assert_eq!(slice.metadata.owner_references, Some(vec![owner()]));
        let hash = &slice.metadata.annotations.as_ref().unwrap()[CONTENT_ANNOTATION];
        assert_eq!(
            *hash,
            content_hash(slice),
            "the hash ignores the generation"
        );
    }
}

#[test]
fn the_same_devices_again_write_nothing() {
    let desired = slices_for("h100-balanced", "h100x2");
    let first = pool_update(&[], desired.clone(), &owner(), 0).unwrap();
    assert_eq!(pool_update(&stored(&first), desired, &owner(), 1), None);
}

/// The API server rewrites quantities canonically (`10240Mi` → `10Gi`) and may drop
/// `sharedCounters` (feature gate off): what it reads back differs from what was written, and
/// that alone must not rewrite the pool on every pass.
#[test]
fn specs_the_server_normalized_are_not_a_change() {
    let desired = slices_for("h100-balanced", "h100x2");
    let first = pool_update(&[], desired.clone(), &owner(), 0).unwrap();
    let mut read_back = stored(&first);
    for slice in &mut read_back {
        slice.spec.shared_counters.clear();
        for device in &mut slice.spec.devices {
            device.consumes_counters.clear();
            for capacity in device.capacity.values_mut() {
                capacity.value = mebibytes(1);
            }
        }
    }
    assert_eq!(pool_update(&read_back, desired, &owner(), 1), None);
}

#[test]
fn a_change_rewrites_every_slice_at_the_next_generation_and_deletes_the_rest() {
    // 384 time-sliced shares need three slices; exclusive GPUs need one.
    let many = slices_for(TIME_SLICED_48, "h100x8");
    assert!(
        many.len() >= 2,
        "the fixture needs a pool of several slices"
    );
    let first = pool_update(&[], many, &owner(), 0).unwrap();
    let desired = slices_for("exclusive", "h100x8");
    assert_eq!(desired.len(), 1);
    let update = pool_update(&stored(&first), desired.clone(), &owner(), 1).unwrap();
    assert_eq!(update.generation, 2);
    assert!(update.create.is_empty());
    assert_eq!(names(&update.replace), names(&desired));
    let replaced = &update.replace[0];
    assert!(
        replaced.metadata.resource_version.is_some(),
        "a replace is conditional on the version read"
    );
    assert_eq!(replaced.spec.pool.generation, 2);
    let expected: Vec<String> = names(&stored(&first))
        .difference(&names(&desired))
        .cloned()
        .collect();
    assert_eq!(update.delete, expected);
    assert!(!update.delete.is_empty());
}

/// An agent restart starts from the API's generation, never below it; and a pool whose
/// slices carry different generations (a publish cut short) is rewritten even if every
/// slice's content matches.
#[test]
fn the_generation_never_goes_backwards() {
    let desired = slices_for("h100-balanced", "h100x2");
    let first = pool_update(&[], desired.clone(), &owner(), 0).unwrap();
    let mut at_7 = stored(&first);
    at_7.iter_mut().for_each(|s| s.spec.pool.generation = 7);
    let other = slices_for("exclusive", "h100x2");
    assert_eq!(
        pool_update(&at_7, other.clone(), &owner(), 0)
            .unwrap()
            .generation,
        8
    );
    assert_eq!(
        pool_update(&at_7, other, &owner(), 9).unwrap().generation,
        10
    );

    let mut torn =
        stored(&pool_update(&[], slices_for(TIME_SLICED_48, "h100x8"), &owner(), 0).unwrap());
    torn[0].spec.pool.generation = 2;
    let again: Vec<ResourceSlice> = slices_for(TIME_SLICED_48, "h100x8");
    let update = pool_update(&torn, again, &owner(), 2).expect("a torn pool is rewritten");
    assert_eq!(update.generation, 3);
}

/// h100-balanced → h100-inference on GPU 0: its 3g.40gb goes, the 1g.10gb devices stay.
#[test]
fn a_repartition_withdraws_exactly_the_devices_that_go_or_change() {
    let current = slices_for("h100-balanced", "h100x1");
    let next = slices_for("h100-inference", "h100x1");
    let gone = withdrawn(&current, &next);
    let current_names: BTreeSet<String> = current
        .iter()
        .flat_map(|s| &s.spec.devices)
        .map(|d| d.name.clone())
        .collect();
    let next_names: BTreeSet<String> = next
        .iter()
        .flat_map(|s| &s.spec.devices)
        .map(|d| d.name.clone())
        .collect();
    let expected: BTreeSet<String> = current_names.difference(&next_names).cloned().collect();
    assert!(!expected.is_empty() && expected.len() < current_names.len());
    assert_eq!(gone, expected);
    let remaining = without(&current, &gone);
    assert_eq!(
        names(&remaining),
        names(&current),
        "same slices, fewer devices"
    );
    let left: BTreeSet<String> = remaining
        .iter()
        .flat_map(|s| &s.spec.devices)
        .map(|d| d.name.clone())
        .collect();
    assert_eq!(
        left,
        current_names.intersection(&next_names).cloned().collect()
    );

    // Same name, other attributes (exclusive → time-sliced: `gpu-0` is gone, shares come):
    // and a device whose attributes change under its name is withdrawn too.
    let mut changed = current.clone();
    let device = &mut changed[0].spec.devices[0];
    device.attributes.insert(
        "productName".into(),
        crate::dra::api::DeviceAttribute::string("x"),
    );
    let name = device.name.clone();
    assert!(withdrawn(&changed, &current).contains(&name));
    assert!(withdrawn(&current, &current).is_empty());
}

/// What a server with `DRAPartitionableDevices` off stores (strategy.go,
/// `dropDisabledDRAPartitionableDevicesFields`): counter sets and `consumesCounters` gone.
/// Only that counts as dropped; canonical quantities and slices without counters do not.
#[test]
fn counters_are_found_dropped_only_when_the_stored_slice_lost_them() {
    let slices = slices_for("h100-inference", "h100x8");
    let sets = slices
        .iter()
        .find(|s| !s.spec.shared_counters.is_empty())
        .expect("a counter slice");
    let consuming = slices
        .iter()
        .find(|s| {
            s.spec
                .devices
                .iter()
                .any(|d| !d.consumes_counters.is_empty())
        })
        .expect("a slice of MIG devices");
    assert!(!counters_dropped(sets, sets));
    assert!(!counters_dropped(consuming, consuming));

    let mut stored = sets.clone();
    stored.spec.shared_counters.clear();
    assert!(counters_dropped(sets, &stored), "counter sets dropped");

    let mut stored = consuming.clone();
    for device in &mut stored.spec.devices {
        device.consumes_counters.clear();
    }
    assert!(counters_dropped(consuming, &stored), "consumption dropped");

    let mut canonical = consuming.clone();
    for device in &mut canonical.spec.devices {
        for capacity in device.capacity.values_mut() {
            capacity.value = mebibytes(0);
        }
    }
    assert!(
        !counters_dropped(consuming, &canonical),
        "other fields are no loss"
    );

    let plain = slices_for(TIME_SLICED_48, "h100x8");
    let mut stored = plain[0].clone();
    stored.spec.devices.clear();
    assert!(!counters_dropped(&plain[0], &stored), "nothing to drop");
}
