//! The slices' shape against the API's rules (k8s-openapi 0.29 `v1_34::api::resource::v1`
//! docs: DNS-label names, at most 128 devices and 32 shared counters per slice, at most 32
//! attributes and capacities per device, string attributes of at most 64 characters) and
//! against what `plan` advertises.

use std::collections::{BTreeMap, BTreeSet};

use super::api::{ResourceSlice, MAX_ATTRIBUTES_AND_CAPACITIES, MAX_DEVICES_PER_SLICE};
use super::*;
use crate::plan::{plan_for, NodePlan};
use crate::profile::parse_profile;
use crate::sharing::PluginKind;

/// Every example profile with a node it plans on: all on 8 × H100 but the H200 one (its MIG
/// profiles exist only on the H200), and each on the node it is written for (tests/cli.rs).
const CASES: &[(&str, &str)] = &[
    ("profiles/h100-inference.yaml", "h100x8"),
    ("profiles/h100-balanced.yaml", "h100x8"),
    ("profiles/h100-mps.yaml", "h100x8"),
    ("profiles/exclusive.yaml", "h100x8"),
    ("profiles/homelab-timeslice.yaml", "h100x8"),
    ("profiles/a100-40gb-mixed.yaml", "h100x8"),
    ("profiles/a100-80gb-single.yaml", "h100x8"),
    ("profiles/builtin/h100-mixed-sharing.yaml", "h100x8"),
    ("profiles/builtin/h100-mps-in-mig.yaml", "h100x8"),
    ("profiles/a100-40gb-mixed.yaml", "a100-40gbx8"),
    ("profiles/a100-80gb-single.yaml", "a100-80gbx4"),
    ("profiles/h200-mig-timeslice.yaml", "h200x8"),
    ("profiles/dra/h200-dynamic-mig.yaml", "h200x8"),
    ("profiles/dra/h100-fractional.yaml", "h100x8"),
    (
        "profiles/homelab-timeslice.yaml",
        "NVIDIA GeForce RTX 3090x2",
    ),
];

fn planned(profile_text: &str, gpus: &str) -> (NodePlan, ObservedNode) {
    let profile = parse_profile("p", profile_text).unwrap();
    let node = ObservedNode::simulated(&[gpus.to_string()]);
    let plan =
        plan_for("p", &profile, &node, PluginKind::Dra).unwrap_or_else(|e| panic!("{gpus}: {e:?}"));
    (plan, node)
}

fn example(file: &str, gpus: &str) -> (NodePlan, Vec<ResourceSlice>) {
    let path = format!("{}/{file}", env!("CARGO_MANIFEST_DIR"));
    let (plan, node) = planned(&std::fs::read_to_string(&path).unwrap(), gpus);
    let slices = resource_slices("node-a", 7, &plan.gpus, &node);
    (plan, slices)
}

fn devices(slices: &[ResourceSlice]) -> impl Iterator<Item = &Device> {
    slices.iter().flat_map(|s| &s.spec.devices)
}

fn sharing(device: &Device) -> &str {
    device.attributes["sharing"].string.as_deref().unwrap()
}

/// RFC 1123 label, as the API checks device and counter names.
fn is_dns_label(name: &str) -> bool {
    let bytes = name.as_bytes();
    !name.is_empty()
        && name.len() <= 63
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes[0].is_ascii_alphanumeric()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric()
}

/// Attribute and capacity names without a domain are C identifiers (API reference).
fn is_c_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[test]
fn device_counts_match_the_plans_resources_for_every_example_profile() {
    for (file, gpus) in CASES {
        let (plan, slices) = example(file, gpus);
        let advertised: u64 = plan.resources.values().sum();
        // Dynamic MIG devices are every placement a GPU could hold, advertised nowhere else.
        // A consumable device stands for as many claims as its `clients` capacity.
        let claimable = |d: &Device| match d.capacity.get(consumable::CLIENTS) {
            Some(c) if d.is_consumable() => c.value.0.parse::<u64>().unwrap(),
            _ => 1,
        };
        assert_eq!(
            devices(&slices)
                .filter(|d| dynamic::DynamicDevice::of(d).is_none())
                .map(claimable)
                .sum::<u64>(),
            advertised,
            "{file} on {gpus}: {:?}",
            plan.resources
        );
        let mig_resources: u64 = (plan.resources.iter())
            .filter(|(r, _)| r.starts_with("nvidia.com/mig-"))
            .map(|(_, n)| n)
            .sum();
        let mig_devices = devices(&slices)
            .filter(|d| d.attributes.contains_key("migProfile"))
            .count() as u64;
        if plan.mig_strategy == crate::profile::MigStrategy::Mixed {
            assert_eq!(mig_devices, mig_resources, "{file} on {gpus}");
        }
    }
}

#[test]
fn names_are_dns_labels_unique_in_the_pool_and_attributes_fit_the_api() {
    for (file, gpus) in CASES {
        let (_, slices) = example(file, gpus);
        let mut names = BTreeSet::new();
        for device in devices(&slices) {
            assert!(is_dns_label(&device.name), "{file}: {}", device.name);
            assert!(names.insert(&device.name), "{file}: {} twice", device.name);
            assert!(
                device.attributes.len() + device.capacity.len() <= MAX_ATTRIBUTES_AND_CAPACITIES
            );
            for (name, value) in &device.attributes {
                assert!(is_c_identifier(name), "{file}: attribute {name}");
                let set = [
                    value.int.is_some(),
                    value.string.is_some(),
                    value.bool.is_some(),
                ];
                assert_eq!(set.iter().filter(|s| **s).count(), 1, "{name}: {value:?}");
                assert!(
                    value.string.as_ref().is_none_or(|s| s.len() <= 64),
                    "{name}"
                );
            }
            for name in device.capacity.keys() {
                assert!(is_c_identifier(name), "{file}: capacity {name}");
            }
        }
        for slice in &slices {
            for set in &slice.spec.shared_counters {
                assert!(is_dns_label(&set.name), "{}", set.name);
                assert!(set.counters.keys().all(|c| is_dns_label(c)));
            }
        }
    }
}

/// `1g.10gb+me` (a profile with a `+`) still gives a DNS label.
#[test]
fn a_mig_profile_becomes_part_of_a_dns_label() {
    assert_eq!(dns_label_part("1g.10gb+me"), "1g-10gb-me");
    assert!(is_dns_label(&format!(
        "gpu-15-mig-6-{}-share-1023",
        dns_label_part("1g.10gb+me")
    )));
}

fn counter_value(counter: &Counter) -> u64 {
    counter.value.0.parse().expect("counters are plain counts")
}

/// Every slice is one the v1 API accepts (devices or counter sets, never both; at most 64
/// devices once one consumes counters; at most 8 counter sets); no device consumes a counter the
/// pool does not declare, and the consumption of each counter, summed over the pool's devices,
/// stays within it.
fn assert_counters_consistent(context: &str, slices: &[ResourceSlice]) {
    let mut declared: BTreeMap<(&str, &str), u64> = BTreeMap::new();
    for slice in slices {
        let spec = &slice.spec;
        assert!(
            spec.devices.is_empty() || spec.shared_counters.is_empty(),
            "{context}: a slice holds devices and counter sets"
        );
        assert!(
            spec.shared_counters.len() <= api::MAX_COUNTER_SETS_PER_SLICE,
            "{context}"
        );
        if spec.devices.iter().any(|d| !d.consumes_counters.is_empty()) {
            assert!(
                spec.devices.len() <= api::MAX_DEVICES_PER_SLICE_CONSUMING_COUNTERS,
                "{context}: {} devices",
                spec.devices.len()
            );
        }
        for set in &spec.shared_counters {
            assert!(set.counters.len() <= api::MAX_COUNTERS_PER_SET, "{context}");
            for (c, v) in &set.counters {
                declared.insert((set.name.as_str(), c.as_str()), counter_value(v));
            }
        }
    }
    let mut used: BTreeMap<(&str, &str), u64> = BTreeMap::new();
    for device in slices.iter().flat_map(|s| &s.spec.devices) {
        // Dynamic devices are alternatives: their sum is meant to exceed the counters, which
        // is what lets the scheduler choose (tested in dynamic/tests.rs).
        let alternative = dynamic::DynamicDevice::of(device).is_some();
        for consumption in &device.consumes_counters {
            for (c, v) in &consumption.counters {
                let key = (consumption.counter_set.as_str(), c.as_str());
                assert!(
                    declared.contains_key(&key),
                    "{context}: {} uses {key:?}",
                    device.name
                );
                if !alternative {
                    *used.entry(key).or_default() += counter_value(v);
                }
            }
        }
    }
    for (key, sum) in used {
        assert!(
            sum <= declared[&key],
            "{context}: {key:?} {sum} > {}",
            declared[&key]
        );
    }
}

#[test]
fn counters_are_declared_where_consumed_and_never_oversubscribed() {
    for (file, gpus) in CASES {
        let (_, slices) = example(file, gpus);
        assert_counters_consistent(&format!("{file} on {gpus}"), &slices);
    }
    // Unshared MIG devices consume their GPU's slices; shares of any kind consume none.
    let (_, slices) = example("profiles/builtin/h100-mixed-sharing.yaml", "h100x8");
    for device in devices(&slices) {
        assert_eq!(
            !device.consumes_counters.is_empty(),
            sharing(device) == "mig",
            "{}",
            device.name
        );
    }
    let sets: Vec<&str> = (slices.iter().flat_map(|s| &s.spec.shared_counters))
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(sets, ["gpu-0", "gpu-1"]);
}

const TIME_SLICED_48: &str =
    "version: v1\nrules:\n  - devices: all\n    timeSlicing: {replicas: 48}\n";

#[test]
fn more_than_128_devices_split_into_several_slices_of_one_pool() {
    let (plan, node) = planned(TIME_SLICED_48, "h100x8");
    let slices = resource_slices("node-a", 3, &plan.gpus, &node);
    // 8 × 48 = 384 shares: three full slices.
    assert_eq!(slices.len(), 3);
    for slice in &slices {
        assert_eq!(slice.spec.devices.len(), MAX_DEVICES_PER_SLICE);
        assert_eq!(slice.spec.pool.name, "node-a");
        assert_eq!(slice.spec.pool.generation, 3);
        assert_eq!(slice.spec.pool.resource_slice_count, 3);
        assert_eq!(slice.spec.node_name, "node-a");
        assert_eq!(slice.spec.driver, DRIVER);
    }
    let names: BTreeSet<_> = slices
        .iter()
        .filter_map(|s| s.metadata.name.clone())
        .collect();
    assert_eq!(names.len(), 3, "slice names are distinct: {names:?}");
    let devices: BTreeSet<_> = devices(&slices).map(|d| d.name.clone()).collect();
    assert_eq!(devices.len(), 384);
}

/// resource.k8s.io/v1 (1.36): a slice holds devices or counter sets, not both (a real API
/// server refused the old layout with "only one of sharedCounters or devices is allowed"), and
/// at most 64 devices once one consumes counters.
#[test]
fn counter_sets_get_slices_of_their_own_and_consuming_devices_go_64_to_a_slice() {
    // GPUs 0-7: 120 time-sliced shares; GPUs 8-15: 7 MIG devices each, 56 in all.
    let profile = "version: v1\nplugin: {migStrategy: mixed}\nrules:\n  - devices: [\"0-7\"]\n    timeSlicing: {replicas: 15}\n  - devices: [\"8-15\"]\n    mig: {1g.10gb: 7}\n";
    let (plan, node) = planned(profile, "h100x16");
    let slices = resource_slices("node-a", 1, &plan.gpus, &node);
    assert_counters_consistent("16 GPUs", &slices);
    let shape: Vec<(usize, usize)> = slices
        .iter()
        .map(|s| (s.spec.devices.len(), s.spec.shared_counters.len()))
        .collect();
    // The shares fill a slice of their own (the 121st device consumes counters: that slice
    // would then hold at most 64); the MIG devices the next; the 8 counter sets the last.
    assert_eq!(shape, [(120, 0), (56, 0), (0, 8)]);
    assert!(slices.iter().all(|s| s.spec.pool.resource_slice_count == 3));

    // 16 MIG GPUs × 7 = 112 consuming devices: 64 + 48, then 16 sets in two slices of 8.
    let all_mig = "version: v1\nrules:\n  - devices: all\n    mig: {1g.10gb: 7}\n";
    let (plan, node) = planned(all_mig, "h100x16");
    let slices = resource_slices("node-a", 1, &plan.gpus, &node);
    assert_counters_consistent("16 MIG GPUs", &slices);
    let shape: Vec<(usize, usize)> = slices
        .iter()
        .map(|s| (s.spec.devices.len(), s.spec.shared_counters.len()))
        .collect();
    assert_eq!(shape, [(64, 0), (48, 0), (0, 8), (0, 8)]);
}

#[test]
fn uuids_name_each_device_or_the_gpu_its_shares_come_from() {
    let profile = "version: v1\nrules:\n  - devices: [0]\n    timeSlicing: {replicas: 2}\n";
    let (plan, mut node) = planned(profile, "h100x2");
    for gpu in &mut node.gpus {
        gpu.uuid = Some(format!("GPU-{}", gpu.index));
    }
    let slices = resource_slices("n", 1, &plan.gpus, &node);
    let by_name: BTreeMap<&str, &Device> = devices(&slices).map(|d| (d.name.as_str(), d)).collect();
    let attr = |device: &str, name: &str| {
        by_name[device]
            .attributes
            .get(name)
            .and_then(|a| a.string.clone())
    };
    assert_eq!(
        attr("gpu-0-share-1", "parentUUID").as_deref(),
        Some("GPU-0")
    );
    assert_eq!(attr("gpu-0-share-1", "uuid"), None);
    assert_eq!(
        attr("gpu-0-share-1", "sharing").as_deref(),
        Some("timeSlicing")
    );
    assert_eq!(attr("gpu-1", "uuid").as_deref(), Some("GPU-1"));
    assert_eq!(attr("gpu-1", "sharing").as_deref(), Some("exclusive"));
}

#[test]
fn a_kept_mig_device_carries_its_uuid_and_a_new_one_only_its_parents() {
    use crate::gpu::ObservedComputeInstance;
    use crate::mig::{ExistingInstance, Placement};
    let text = "version: v1\nplugin: {migStrategy: mixed}\nrules:\n  - devices: all\n    mig: {3g.40gb: 2}\n";
    let profile = parse_profile("p", text).unwrap();
    let mut node = ObservedNode::simulated(&["h100x1".to_string()]);
    let gpu = &mut node.gpus[0];
    gpu.uuid = Some("GPU-0".into());
    gpu.mig = Some(crate::gpu::MigMode {
        current: true,
        pending: true,
    });
    gpu.instances = vec![ExistingInstance {
        profile: "3g.40gb".into(),
        placement: Placement { start: 4, size: 4 },
        gi_id: Some(2),
    }];
    gpu.compute_instances = vec![ObservedComputeInstance {
        gi_id: 2,
        ci_id: 0,
        profile_id: 2,
        uuid: Some("MIG-kept".into()),
    }];
    let plan = plan_for("p", &profile, &node, PluginKind::Dra).unwrap();
    let slices = resource_slices("n", 1, &plan.gpus, &node);
    let attr = |device: &str, name: &str| {
        let d = devices(&slices).find(|d| d.name == device).unwrap();
        d.attributes.get(name).and_then(|a| a.string.clone())
    };
    assert_eq!(
        attr("gpu-0-mig-4-3g-40gb", "uuid").as_deref(),
        Some("MIG-kept")
    );
    assert_eq!(attr("gpu-0-mig-0-3g-40gb", "uuid"), None);
    for device in ["gpu-0-mig-0-3g-40gb", "gpu-0-mig-4-3g-40gb"] {
        assert_eq!(attr(device, "parentUUID").as_deref(), Some("GPU-0"));
        assert_eq!(attr(device, "sharing").as_deref(), Some("mig"));
    }
}

/// DRA lifts the plugins' resource-name limits, not the MPS daemons': whole MPS GPUs share one
/// control daemon with one default thread percentage (`crate::mps::daemon`), so two MPS rules
/// that differ in it are still refused; whole GPUs shared differently are fine (their devices
/// say which is which), with no warning.
#[test]
fn validate_for_dra_keeps_the_mps_daemon_rule_and_drops_the_resource_name_warning() {
    let differing = "version: v1\nrules:\n  - devices: [0]\n    mps: {replicas: 2, activeThreadPercentage: 50}\n  - devices: [1]\n    mps: {replicas: 2, activeThreadPercentage: 25}\n";
    let profile = parse_profile("p", differing).unwrap();
    let problems = crate::validate::validate_for("p", &profile, PluginKind::Dra);
    assert!(
        problems
            .iter()
            .any(|p| p.is_error() && p.to_string().contains("activeThreadPercentage")),
        "{problems:?}"
    );
    let mixed = "version: v1\nrules:\n  - devices: [0]\n    mps: {replicas: 2}\n  - devices: [1]\n    timeSlicing: {replicas: 2}\n";
    let profile = parse_profile("p", mixed).unwrap();
    let problems = crate::validate::validate_for("p", &profile, PluginKind::Dra);
    assert!(problems.is_empty(), "{problems:?}");
    // The built-in plugin warns about the same profile: one resource name for both kinds.
    let builtin = crate::validate::validate_for("p", &profile, PluginKind::Builtin);
    assert!(builtin
        .iter()
        .any(|p| p.to_string().contains("one resource name")));
}

/// For an API server that drops counters (`DRAPartitionableDevices` off): every example's
/// pool keeps all its devices but the dynamic MIG placements, with no counter anywhere, in
/// slices numbered and counted afresh; a dynamic GPU stays offered whole.
#[test]
fn without_counters_keeps_every_device_but_dynamic_placements_and_no_counter() {
    for (file, gpus) in CASES {
        let (_, slices) = example(file, gpus);
        let kept = without_counters(&slices);
        let context = format!("{file} on {gpus}");
        let expected: Vec<&str> = devices(&slices)
            .filter(|d| {
                !matches!(
                    dynamic::DynamicDevice::of(d),
                    Some(dynamic::DynamicDevice::Mig { .. })
                )
            })
            .map(|d| d.name.as_str())
            .collect();
        let names: Vec<&str> = devices(&kept).map(|d| d.name.as_str()).collect();
        assert_eq!(names, expected, "{context}");
        assert!(
            kept.iter().all(|s| s.spec.shared_counters.is_empty()),
            "{context}"
        );
        assert!(
            devices(&kept).all(|d| d.consumes_counters.is_empty()),
            "{context}"
        );
        for (k, slice) in kept.iter().enumerate() {
            assert_eq!(
                slice.metadata.name.as_deref(),
                Some(format!("node-a-gpu-share-{k}").as_str())
            );
            assert_eq!(slice.spec.pool.resource_slice_count, kept.len() as i64);
            assert_eq!(slice.spec.pool.generation, 7);
            assert!(
                slice.spec.devices.len() <= MAX_DEVICES_PER_SLICE,
                "{context}"
            );
            assert!(!slice.spec.devices.is_empty(), "{context}: no empty slice");
        }
    }
    let (_, slices) = example("profiles/dra/h200-dynamic-mig.yaml", "h200x8");
    let whole: Vec<String> = devices(&without_counters(&slices))
        .filter(|d| {
            matches!(
                dynamic::DynamicDevice::of(d),
                Some(dynamic::DynamicDevice::WholeGpu { .. })
            )
        })
        .map(|d| d.name.clone())
        .collect();
    assert!(
        whole.len() >= 6,
        "the dynamic GPUs are offered whole: {whole:?}"
    );
}
