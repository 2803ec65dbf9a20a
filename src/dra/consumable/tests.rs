use std::collections::BTreeMap;

use super::*;
use crate::gpu::ObservedNode;
use crate::plan::plan_for;
use crate::profile::parse_profile;
use crate::sharing::PluginKind;

fn fractional_slices(gpus: &str) -> Vec<ResourceSlice> {
    let path = format!(
        "{}/profiles/dra/h100-fractional.yaml",
        env!("CARGO_MANIFEST_DIR")
    );
    let profile = parse_profile("f", &std::fs::read_to_string(path).unwrap()).unwrap();
    let node = ObservedNode::simulated(&[gpus.to_string()]);
    let plan = plan_for("f", &profile, &node, PluginKind::Dra).unwrap();
    super::super::resource_slices("node-a", 1, &plan.gpus, &node)
}

fn devices(slices: &[ResourceSlice]) -> Vec<&Device> {
    slices.iter().flat_map(|s| &s.spec.devices).collect()
}

fn policy(device: &Device, name: &str) -> CapacityRequestPolicy {
    device.capacity[name].request_policy.clone().unwrap()
}

#[test]
fn each_gpu_is_one_device_shared_by_memory_compute_and_clients() {
    let slices = fractional_slices("h100x2");
    let all = devices(&slices);
    assert_eq!(all.len(), 2);
    let gpu = all[0];
    assert_eq!(gpu.name, "gpu-0-mps");
    assert!(gpu.is_consumable());
    assert_eq!(gpu.attributes["sharing"].string.as_deref(), Some("mps"));
    assert_eq!(gpu.attributes[ATTRIBUTE].bool, Some(true));
    assert_eq!(gpu.capacity[MEMORY].value.0, "81559Mi");
    let memory = policy(gpu, MEMORY);
    assert_eq!(memory.default.0, "4096Mi");
    let range = memory.valid_range.unwrap();
    assert_eq!(
        (range.min.0.as_str(), range.step.unwrap().0.as_str()),
        ("1024Mi", "1024Mi")
    );
    assert_eq!(gpu.capacity[COMPUTE].value.0, "100");
    assert_eq!(policy(gpu, COMPUTE).default.0, "10");
    assert_eq!(gpu.capacity[CLIENTS].value.0, "16");
    let clients = policy(gpu, CLIENTS);
    assert_eq!(clients.default.0, "1");
    assert_eq!(clients.valid_values, [count(1)]);
}

#[test]
fn the_fallback_is_fixed_shares_with_an_even_memory_split() {
    let slices = fractional_slices("h100x2");
    let fixed = fixed_shares(&slices);
    let all = devices(&fixed);
    assert_eq!(all.len(), 32, "16 shares of each GPU");
    assert!(all.iter().all(|d| !d.is_consumable()));
    let first = all[0];
    assert_eq!(first.name, "gpu-0-share-0");
    assert_eq!(first.attributes["sharing"].string.as_deref(), Some("mps"));
    assert_eq!(first.attributes["replicas"].int, Some(16));
    assert!(!first.attributes.contains_key(ATTRIBUTE));
    assert_eq!(first.capacity[MEMORY].value.0, "5097Mi", "81559 / 16");
    assert!(first.capacity[MEMORY].request_policy.is_none());
    assert!(!first.capacity.contains_key(COMPUTE));
    assert_eq!(
        first.attributes["mpsPinnedMemoryLimitMiB"].int,
        Some(5097),
        "the limit each share's client gets"
    );
    assert_eq!(all[31].name, "gpu-1-share-15");
}

fn consumed(memory: &str, compute: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (MEMORY.to_string(), memory.to_string()),
        (COMPUTE.to_string(), compute.to_string()),
        (CLIENTS.to_string(), "1".to_string()),
    ])
}

#[test]
fn a_share_is_read_from_consumed_capacity_in_the_forms_the_scheduler_writes() {
    let slices = fractional_slices("h100x1");
    let gpu = devices(&slices)[0];
    assert_eq!(
        share_of(gpu, &consumed("10Gi", "25")).unwrap(),
        Share {
            memory_mib: 10240,
            compute_percent: 25
        }
    );
    // roundUpRange writes NewQuantity(val, BinarySI): plain bytes when not a whole Ki.
    assert_eq!(
        share_of(gpu, &consumed("10737418240", "25"))
            .unwrap()
            .memory_mib,
        10240
    );
}

#[test]
fn a_share_missing_unreadable_zero_or_over_the_device_is_refused_by_name() {
    let slices = fractional_slices("h100x1");
    let gpu = devices(&slices)[0];
    let e = share_of(gpu, &BTreeMap::new()).unwrap_err();
    assert!(matches!(e, ShareError::Missing { .. }));
    assert!(
        e.to_string()
            .contains("device gpu-0-mps is shared by capacity, but the allocation gives no consumedCapacity \"memory\""),
        "{e}"
    );
    let e = share_of(gpu, &consumed("90Gi", "25")).unwrap_err();
    assert_eq!(
        e.to_string(),
        "device gpu-0-mps: consumedCapacity \"memory\" is 90Gi, more than the 81559Mi the device publishes"
    );
    let e = share_of(gpu, &consumed("1Gi", "150")).unwrap_err();
    assert!(e.to_string().contains("\"compute\" is 150"), "{e}");
    let e = share_of(gpu, &consumed("lots", "10")).unwrap_err();
    assert!(matches!(e, ShareError::Unreadable { .. }), "{e}");
    let e = share_of(gpu, &consumed("0", "10")).unwrap_err();
    assert!(matches!(e, ShareError::Zero { .. }), "{e}");
}

#[test]
fn shares_over_the_device_are_named() {
    let slices = fractional_slices("h100x1");
    let gpu = devices(&slices)[0];
    let share = |memory_mib, compute_percent| Share {
        memory_mib,
        compute_percent,
    };
    assert_eq!(
        over_capacity(gpu, &[share(40960, 50), share(40599, 50)]),
        None
    );
    let why = over_capacity(gpu, &[share(40960, 50), share(40960, 10)]).unwrap();
    assert!(why.contains("81920 MiB of its 81559 MiB memory"), "{why}");
    let why = over_capacity(gpu, &[share(1024, 60), share(1024, 60)]).unwrap();
    assert!(why.contains("120% of its 100% compute"), "{why}");
    let why = over_capacity(gpu, &vec![share(1024, 5); 17]).unwrap();
    assert!(why.contains("17 of its 16 MPS clients"), "{why}");
}

const MIG_FRACTIONAL: &str = "version: v1\nrules:\n  - devices: all\n    mig: {3g.40gb: 2}\n    mps:\n      replicas: 8\n      consumable:\n        memory: {default: 4Gi, min: 1Gi, step: 1Gi}\n        compute: {default: 10, min: 5, step: 5}\n";

#[test]
fn a_fractional_mig_device_is_one_consumable_device_and_falls_back_to_its_shares() {
    let profile = parse_profile("f", MIG_FRACTIONAL).unwrap();
    let node = ObservedNode::simulated(&["h100x1".to_string()]);
    let plan = plan_for("f", &profile, &node, PluginKind::Dra).unwrap();
    let slices = super::super::resource_slices("node-a", 1, &plan.gpus, &node);
    assert!(
        slices.iter().all(|s| s.spec.shared_counters.is_empty()),
        "no counters: nothing consumes them"
    );
    let all = devices(&slices);
    assert_eq!(all.len(), 2);
    let mig = all[0];
    assert_eq!(mig.name, "gpu-0-mig-0-3g-40gb-mps");
    assert!(mig.is_consumable() && mig.consumes_counters.is_empty());
    assert_eq!(
        mig.attributes["migProfile"].string.as_deref(),
        Some("3g.40gb")
    );
    let memory = crate::mig::catalog()
        .model("h100")
        .unwrap()
        .profile("3g.40gb")
        .unwrap()
        .memory_mib
        .unwrap();
    assert_eq!(mig.capacity[MEMORY].value.0, format!("{memory}Mi"));
    assert_eq!(mig.capacity[CLIENTS].value.0, "8");
    assert!(
        mig.capacity.values().all(|c| c.request_policy.is_some()),
        "a capacity without a policy is charged whole to every claim: {:?}",
        mig.capacity.keys()
    );

    let fixed = fixed_shares(&slices);
    let shares = devices(&fixed);
    assert_eq!(shares.len(), 16);
    assert_eq!(shares[0].name, "gpu-0-mig-0-3g-40gb-share-0");
    assert_eq!(
        shares[0].capacity[MEMORY].value.0,
        format!("{}Mi", memory / 8)
    );
}

#[test]
fn a_policy_larger_than_a_mig_profile_is_refused_by_the_plan() {
    let text = MIG_FRACTIONAL
        .replace("3g.40gb: 2", "1g.10gb: 7")
        .replace("replicas: 8", "replicas: 4")
        .replace(
            "{default: 4Gi, min: 1Gi, step: 1Gi}",
            "{default: 8Gi, min: 8Gi, step: 4Gi}",
        );
    let profile = parse_profile("f", &text).unwrap();
    let node = ObservedNode::simulated(&["h100x1".to_string()]);
    let e = plan_for("f", &profile, &node, PluginKind::Dra).unwrap_err();
    let e = format!("{e:?}");
    assert!(
        e.contains("mps.consumable.memory.min plus one mps.consumable.memory.step is 12288 MiB")
            && e.contains("the 1g.10gb MIG profile's"),
        "{e}"
    );
}
