//! Dynamic MIG devices against the catalog (data/mig-catalog.yaml: placements, engines) and
//! the scheduler's first-fit allocation ([`first_fit`]).

use std::collections::BTreeSet;

use super::first_fit::{mig_profile, Pool};
use super::*;
use crate::dra::api::ResourceSlice;
use crate::gpu::ObservedNode;
use crate::mig::{catalog, ExistingInstance};
use crate::plan::plan_for;
use crate::profile::parse_profile;
use crate::sharing::PluginKind;

const DYNAMIC: &str = "version: v1\nrules:\n  - devices: all\n    dynamicMig: true\n";

fn slices(
    gpus: &[&str],
    node_edit: impl Fn(&mut ObservedNode),
    claimed: &ClaimedInstances,
) -> Vec<ResourceSlice> {
    let profile = parse_profile("dyn", DYNAMIC).unwrap();
    let mut node = ObservedNode::simulated(&gpus.iter().map(|g| g.to_string()).collect::<Vec<_>>());
    node_edit(&mut node);
    let plan = plan_for("dyn", &profile, &node, PluginKind::Dra).unwrap();
    crate::dra::resource_slices_with("node-a", 1, &plan.gpus, &node, claimed)
}

fn names(slices: &[ResourceSlice]) -> Vec<String> {
    slices
        .iter()
        .flat_map(|s| &s.spec.devices)
        .map(|d| d.name.clone())
        .collect()
}

fn h200() -> &'static GpuModel {
    catalog().model("h200-141gb").unwrap()
}

#[test]
fn a_dynamic_gpu_publishes_every_placement_and_the_whole_gpu_with_one_counter_per_memory_slot() {
    let slices = slices(&["h200"], |_| {}, &ClaimedInstances::default());
    let model = h200();
    let placements: usize = model
        .gpu_instance_profiles
        .iter()
        .map(|p| p.placements.len())
        .sum();
    let devices: Vec<&Device> = slices.iter().flat_map(|s| &s.spec.devices).collect();
    assert_eq!(devices.len(), placements + 1, "{:?}", names(&slices));
    let unique: BTreeSet<&str> = devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(unique.len(), devices.len(), "device names are unique");
    let sets: Vec<&CounterSet> = slices
        .iter()
        .flat_map(|s| &s.spec.shared_counters)
        .collect();
    assert_eq!(sets.len(), 1);
    let counters: BTreeSet<&str> = sets[0].counters.keys().map(String::as_str).collect();
    let expected: BTreeSet<String> = (0..8)
        .map(memory_slice)
        .chain([COMPUTE_SLICES, OFA, MEDIA_ENGINES].map(String::from))
        .collect();
    assert_eq!(counters, expected.iter().map(String::as_str).collect());
    // Each MIG device consumes exactly the slots of its placement, its compute slices, and
    // reads back as the dynamic device it is.
    for device in &devices {
        let consumed = &device.consumes_counters[0].counters;
        match DynamicDevice::of(device).unwrap() {
            DynamicDevice::Mig {
                gpu,
                profile,
                placement,
            } => {
                assert_eq!(gpu, 0);
                let slots: BTreeSet<String> = consumed
                    .keys()
                    .filter(|k| k.starts_with("memory-slice-"))
                    .cloned()
                    .collect();
                let want: BTreeSet<String> = (placement.start..=placement.end())
                    .map(memory_slice)
                    .collect();
                assert_eq!(slots, want, "{}", device.name);
                let p = model.profile(&profile).unwrap();
                assert_eq!(consumed[COMPUTE_SLICES].value.0, p.slice_count.to_string());
                assert_eq!(
                    consumed.contains_key(OFA),
                    profile.contains("+me") || p.slice_count == 7,
                    "{}",
                    device.name
                );
                assert!(!device.attributes.contains_key("uuid"), "no instance yet");
            }
            DynamicDevice::WholeGpu { gpu } => {
                assert_eq!((gpu, device.name.as_str()), (0, "gpu-0"));
                assert_eq!(
                    consumed, &sets[0].counters,
                    "the whole GPU takes every counter"
                );
            }
        }
    }
}

#[test]
fn first_fit_order_lists_small_profiles_first_and_their_placements_where_large_ones_need_least() {
    let order: Vec<(String, Placement)> = placements(h200(), Order::FirstFit)
        .into_iter()
        .map(|(p, placement)| (p.name.clone(), placement))
        .collect();
    let ones: Vec<u32> = order
        .iter()
        .filter(|(p, _)| p == "1g.18gb")
        .map(|(_, pl)| pl.start)
        .collect();
    // Slot 6 strands slot 7 (no 1g there), so it comes last; then slots 4-5, which fewer
    // larger placements need than slots 0-3 (the 4g and the first 3g).
    assert_eq!(ones, [5, 4, 3, 2, 1, 0, 6]);
    let threes: Vec<u32> = order
        .iter()
        .filter(|(p, _)| p == "3g.71gb")
        .map(|(_, pl)| pl.start)
        .collect();
    assert_eq!(threes, [4, 0], "the 3g leaves 0:4 to the 4g");
    let sizes: Vec<u32> = order
        .iter()
        .map(|(p, _)| h200().profile(p).unwrap().slice_count)
        .collect();
    assert!(sizes.windows(2).all(|w| w[0] <= w[1]), "{order:?}");
    assert_eq!(order.len(), placements(h200(), Order::Catalog).len());
}

#[test]
fn out_of_band_instances_withdraw_the_devices_they_overlap_and_claimed_ones_do_not() {
    let with_instance = |node: &mut ObservedNode| {
        let gpu = &mut node.gpus[0];
        gpu.mig = Some(crate::gpu::MigMode {
            current: true,
            pending: false,
        });
        gpu.instances.push(ExistingInstance {
            profile: "1g.18gb".into(),
            placement: Placement { start: 0, size: 1 },
            gi_id: Some(9),
        });
    };
    let all = names(&slices(&["h200"], |_| {}, &ClaimedInstances::default()));
    let foreign = names(&slices(
        &["h200"],
        with_instance,
        &ClaimedInstances::default(),
    ));
    let gone: Vec<&String> = all.iter().filter(|n| !foreign.contains(n)).collect();
    assert!(gone.contains(&&"gpu-0".to_string()), "{gone:?}");
    assert!(
        gone.contains(&&"gpu-0-mig-0-1g-18gb".to_string()),
        "{gone:?}"
    );
    assert!(
        gone.contains(&&"gpu-0-mig-0-7g-141gb".to_string()),
        "{gone:?}"
    );
    assert!(!gone.iter().any(|n| n.contains("-mig-6-")), "{gone:?}");
    let claimed = ClaimedInstances([(0, Placement { start: 0, size: 1 })].into());
    assert_eq!(names(&slices(&["h200"], with_instance, &claimed)), all);
}

#[test]
fn gpus_without_mig_under_a_dynamic_rule_are_published_whole() {
    let slices = slices(&["h200", "NVIDIA L4"], |_| {}, &ClaimedInstances::default());
    let names = names(&slices);
    assert!(names.contains(&"gpu-1".to_string()), "{names:?}");
    assert!(
        !names.iter().any(|n| n.starts_with("gpu-1-mig")),
        "{names:?}"
    );
}

/// The scheduler can never allocate two devices whose instances NVML would refuse together:
/// random claims and releases, first fit, and every set allocated at once is a valid geometry
/// (no two placements overlap, at most one `+me`, within the GPU's compute slices).
#[test]
fn whatever_first_fit_allocates_together_is_a_geometry_the_gpu_accepts() {
    let slices = slices(&["h200"], |_| {}, &ClaimedInstances::default());
    let model = h200();
    let mut pool = Pool::new(&slices);
    let mut held: Vec<String> = Vec::new();
    let mut seed = 7u64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let profiles = model.profile_names();
    for _ in 0..5000 {
        if !held.is_empty() && next() % 3 == 0 {
            let k = (next() % held.len() as u64) as usize;
            pool.release(&held.swap_remove(k));
            continue;
        }
        let profile = profiles[(next() % profiles.len() as u64) as usize];
        if let Some(name) = pool.allocate(mig_profile(profile)) {
            held.push(name);
        }
        let devices: Vec<(String, Placement)> = held
            .iter()
            .map(|n| {
                let d = slices
                    .iter()
                    .flat_map(|s| &s.spec.devices)
                    .find(|d| &d.name == n)
                    .unwrap();
                match DynamicDevice::of(d).unwrap() {
                    DynamicDevice::Mig {
                        profile, placement, ..
                    } => (profile, placement),
                    DynamicDevice::WholeGpu { .. } => unreachable!("only MIG profiles asked"),
                }
            })
            .collect();
        let mut used = 0u32;
        for (_, p) in &devices {
            assert_eq!(used & p.mask(), 0, "overlap in {devices:?}");
            used |= p.mask();
        }
        let me = devices.iter().filter(|(p, _)| p.contains("+me")).count();
        assert!(me <= 1, "{devices:?}");
        let slices_used: u32 = devices
            .iter()
            .map(|(p, _)| model.profile(p).unwrap().slice_count)
            .sum();
        assert!(slices_used <= model.compute_slices, "{devices:?}");
    }
}

#[test]
fn every_models_dynamic_devices_have_unique_names() {
    for model in &catalog().models {
        let slices = slices(&[model.key.as_str()], |_| {}, &ClaimedInstances::default());
        let all = names(&slices);
        let unique: BTreeSet<&String> = all.iter().collect();
        assert_eq!(unique.len(), all.len(), "{}: {all:?}", model.key);
    }
}
