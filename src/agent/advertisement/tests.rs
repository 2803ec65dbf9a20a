//! The re-allocation rules case by case: each measured case on a real kubelet, the changes of
//! terms (issue 37 item 3), and the DRA side read back from the slices `crate::dra` publishes.

use super::*;

#[test]
fn verdicts_say_per_device_whose_holder_is_evicted() {
    let four = advertisement(&[
        ("GPU-a::0", GPU, Sharing::TimeSlicing),
        ("GPU-a::1", GPU, Sharing::TimeSlicing),
        ("GPU-a::2", GPU, Sharing::TimeSlicing),
        ("GPU-a::3", GPU, Sharing::TimeSlicing),
    ]);
    let two = advertisement(&[
        ("GPU-a::0", GPU, Sharing::TimeSlicing),
        ("GPU-a::1", GPU, Sharing::TimeSlicing),
    ]);
    let v = verdicts(&four, &two);
    let evicted: Vec<&str> = v
        .iter()
        .filter(|d| d.evicts_holder)
        .map(|d| d.id.as_str())
        .collect();
    assert_eq!(evicted, ["GPU-a::2", "GPU-a::3"]);
    assert!(v[0].why.contains("stays advertised"), "{}", v[0].why);
    assert!(v[2].why.contains("no longer advertised"), "{}", v[2].why);
    assert!(
        verdicts(&two, &four).iter().all(|d| !d.evicts_holder),
        "replicas grow"
    );
}

fn advertisement(entries: &[(&str, &str, Sharing)]) -> Advertisement {
    Advertisement {
        devices: entries
            .iter()
            .map(|(id, resource, sharing)| {
                (
                    id.to_string(),
                    Advertised {
                        resource: resource.to_string(),
                        sharing: *sharing,
                        terms: None,
                    },
                )
            })
            .collect(),
        dra_devices: BTreeMap::new(),
    }
}

/// `ad` with every device on `terms`.
fn on_terms(mut ad: Advertisement, terms: Terms) -> Advertisement {
    for advertised in ad.devices.values_mut() {
        advertised.terms = Some(terms);
    }
    ad
}

fn terms(replicas: u64, pct: Option<u32>, mib: Option<u64>) -> Terms {
    Terms {
        replicas,
        active_thread_percentage: pct,
        pinned_memory_limit_mib: mib,
    }
}

fn held(resource: &str, id: &str) -> Held {
    Held {
        pod: PodName {
            namespace: "default".into(),
            name: "p".into(),
        },
        resource: resource.into(),
        id: id.into(),
    }
}

fn replicas(uuid: &str, resource: &str, n: u32) -> Vec<(String, String)> {
    (0..n)
        .map(|i| (format!("{uuid}::{i}"), resource.to_string()))
        .collect()
}

fn of(ids: &[(String, String)], sharing: Sharing) -> Advertisement {
    let entries: Vec<(&str, &str, Sharing)> = ids
        .iter()
        .map(|(id, r)| (id.as_str(), r.as_str(), sharing))
        .collect();
    advertisement(&entries)
}

const GPU: &str = "nvidia.com/gpu";

/// The first measured case: a time-sliced replica's GPU becomes one exclusive device.
#[test]
fn time_slicing_to_exclusive_reallocates_every_replica() {
    let before = of(&replicas("GPU-a", GPU, 4), Sharing::TimeSlicing);
    let after = advertisement(&[("GPU-a", GPU, Sharing::Exclusive)]);
    let verdict = judge(&held(GPU, "GPU-a::1"), Some(&before), &after);
    assert_eq!(
        verdict,
        Verdict::Reallocated(
            "GPU-a::1 (nvidia.com/gpu) is no longer advertised; its device is now GPU-a of \
             nvidia.com/gpu, exclusive"
                .into()
        )
    );
}

/// The reverse: the exclusive holder would share its GPU with the new replicas.
#[test]
fn exclusive_to_time_slicing_reallocates_the_whole_gpu() {
    let after = of(&replicas("GPU-a", GPU, 4), Sharing::TimeSlicing);
    assert!(matches!(
        judge(&held(GPU, "GPU-a"), None, &after),
        Verdict::Reallocated(_)
    ));
}

/// Second measured case: MIG strategy mixed → single renames the resource of a kept MIG
/// device; the reverse does too.
#[test]
fn a_mig_device_under_another_resource_is_reallocated_both_ways() {
    let mixed = advertisement(&[("MIG-x", "nvidia.com/mig-1g.10gb", Sharing::Exclusive)]);
    let single = advertisement(&[("MIG-x", GPU, Sharing::Exclusive)]);
    assert_eq!(
        judge(
            &held("nvidia.com/mig-1g.10gb", "MIG-x"),
            Some(&mixed),
            &single
        ),
        Verdict::Reallocated(
            "MIG-x is now advertised as nvidia.com/gpu, not nvidia.com/mig-1g.10gb".into()
        )
    );
    assert!(matches!(
        judge(&held(GPU, "MIG-x"), Some(&single), &mixed),
        Verdict::Reallocated(_)
    ));
}

/// Third measured case: replicas 4 → 2 drops `::2` and `::3`; the holders of `::0` and
/// `::1` keep IDs the kubelet still counts as theirs. 2 → 4 (the reverse) keeps every
/// held ID: provably nothing is handed out twice.
#[test]
fn fewer_replicas_reallocate_only_the_dropped_ids_and_more_replicas_none() {
    let four = of(&replicas("GPU-a", GPU, 4), Sharing::TimeSlicing);
    let two = of(&replicas("GPU-a", GPU, 2), Sharing::TimeSlicing);
    let dropped = judge(&held(GPU, "GPU-a::2"), Some(&four), &two);
    assert_eq!(
        dropped,
        Verdict::Reallocated(
            "GPU-a::2 (nvidia.com/gpu) is no longer advertised; its device is now GPU-a::0 \
             and 1 more of nvidia.com/gpu, time-sliced"
                .into()
        )
    );
    assert!(matches!(
        judge(&held(GPU, "GPU-a::1"), Some(&four), &two),
        Verdict::Stays(_)
    ));
    for id in ["GPU-a::0", "GPU-a::1"] {
        assert!(matches!(
            judge(&held(GPU, id), Some(&two), &four),
            Verdict::Stays(_)
        ));
    }
}

/// Same IDs, same resource, but time-slicing becomes MPS: the MPS daemon and its clients
/// would share the GPU with a process that is not one of them.
#[test]
fn a_change_of_sharing_under_the_same_id_is_a_reallocation_when_the_old_one_is_known() {
    let ts = of(&replicas("GPU-a", GPU, 2), Sharing::TimeSlicing);
    let mps = of(&replicas("GPU-a", GPU, 2), Sharing::Mps);
    assert_eq!(
        judge(&held(GPU, "GPU-a::0"), Some(&ts), &mps),
        Verdict::Reallocated("GPU-a::0 (nvidia.com/gpu) goes from time-sliced to MPS".into())
    );
    assert!(matches!(
        judge(&held(GPU, "GPU-a::0"), Some(&mps), &ts),
        Verdict::Reallocated(_)
    ));
    // Not known (no saved advertisement): the ID and resource match, so it stays.
    assert!(matches!(
        judge(&held(GPU, "GPU-a::0"), None, &mps),
        Verdict::Stays(_)
    ));
}

/// Issue 37 item 3: a device that keeps its ID, resource and sharing mode but not its
/// terms. Replicas 2 → 4 under time-slicing keep every held ID (the kubelet still counts
/// them) but halve each holder's GPU time; MPS limits 40 GiB → 20 GiB leave a holder able
/// to take memory promised to the newcomers (MPS fixes a client's limits when it
/// connects: reference/h200-mps-measured.md). Without the terms known (an advertisement
/// saved by an older agent) only the mode is compared, as before.
#[test]
fn a_change_of_terms_under_the_same_id_is_a_reallocation() {
    let ids2 = replicas("GPU-a", GPU, 2);
    let ids4 = replicas("GPU-a", GPU, 4);
    let ts2 = on_terms(of(&ids2, Sharing::TimeSlicing), terms(2, None, None));
    let ts4 = on_terms(of(&ids4, Sharing::TimeSlicing), terms(4, None, None));
    assert_eq!(
        judge(&held(GPU, "GPU-a::0"), Some(&ts2), &ts4),
        Verdict::Reallocated(
            "GPU-a::0 (nvidia.com/gpu) stays time-sliced but goes from 2 holders to 4 \
             holders"
                .into()
        )
    );
    let mps = |mib| on_terms(of(&ids2, Sharing::Mps), terms(2, Some(50), Some(mib)));
    assert_eq!(
        judge(&held(GPU, "GPU-a::1"), Some(&mps(40960)), &mps(20480)),
        Verdict::Reallocated(
            "GPU-a::1 (nvidia.com/gpu) stays MPS but goes from 2 holders, 50% of the \
             threads each, 40960 MiB pinned memory each to 2 holders, 50% of the threads \
             each, 20480 MiB pinned memory each"
                .into()
        )
    );
    // Unchanged terms: nobody is drained.
    assert!(matches!(
        judge(&held(GPU, "GPU-a::1"), Some(&mps(20480)), &mps(20480)),
        Verdict::Stays(_)
    ));
    // Saved before terms were kept: the mode is the same, so it stays.
    let old = of(&ids2, Sharing::TimeSlicing);
    assert!(matches!(
        judge(&held(GPU, "GPU-a::0"), Some(&old), &ts4),
        Verdict::Stays(_)
    ));
}

/// An advertisement saved before terms were kept still loads (no `terms`, no
/// `draDevices`).
#[test]
fn an_advertisement_without_terms_still_loads() {
    let dir = tempfile::tempdir().unwrap();
    let old =
        r#"{"devices": {"GPU-a::0": {"resource": "nvidia.com/gpu", "sharing": "timeSlicing"}}}"#;
    std::fs::write(dir.path().join(ADVERTISEMENT_FILE), old).unwrap();
    let loaded = Advertisement::load(dir.path()).expect("loads");
    assert_eq!(loaded.devices["GPU-a::0"].terms, None);
    assert!(loaded.dra_devices.is_empty());
}

/// The DRA side reads the terms back from the slices `crate::dra` publishes, so a claim
/// holding a share is judged by the attributes the scheduler saw.
#[test]
fn a_dra_claims_device_that_changes_terms_or_goes_is_reallocated() {
    use crate::kubelet::pod_resources::api::{
        ClaimResource, ContainerResources, DynamicResource, PodResources,
    };
    let slices = |profile: &str| {
        let profile = crate::profile::parse_profile("p", profile).unwrap();
        let node = ObservedNode::simulated(&["h100x1".to_string()]);
        let plan =
            crate::plan::plan_for("p", &profile, &node, crate::sharing::PluginKind::Dra).unwrap();
        let slices = crate::dra::resource_slices("node-a", 1, &plan.gpus, &node);
        Advertisement::default().with_dra(&slices)
    };
    let rule = |mode: &str| format!("version: v1\nrules:\n  - devices: all\n    {mode}\n");
    let ts = slices(&rule("timeSlicing: {replicas: 2}"));
    let mps = slices(&rule("mps: {replicas: 2}"));
    let ts4 = slices(&rule("timeSlicing: {replicas: 4}"));
    let exclusive = slices(&rule("exclusive: true"));
    assert_eq!(
        ts.dra_devices["gpu-0-share-1"].sharing,
        Sharing::TimeSlicing
    );
    assert_eq!(mps.dra_devices["gpu-0-share-1"].sharing, Sharing::Mps);
    let holding = |device: &str| ListPodResourcesResponse {
        pod_resources: vec![PodResources {
            name: "p".into(),
            namespace: "default".into(),
            containers: vec![ContainerResources {
                name: "c".into(),
                devices: vec![],
                dynamic_resources: vec![DynamicResource {
                    claim_name: "c1".into(),
                    claim_namespace: "default".into(),
                    claim_resources: vec![ClaimResource {
                        driver_name: crate::dra::DRIVER.into(),
                        pool_name: "node-a".into(),
                        device_name: device.into(),
                        ..Default::default()
                    }],
                }],
            }],
        }],
    };
    let why = |before: &Advertisement, after: &Advertisement| -> Vec<String> {
        claims_reallocated(&holding("gpu-0-share-1"), "node-a", Some(before), after)
            .into_iter()
            .map(|(_, why)| why)
            .collect()
    };
    assert_eq!(
        why(&ts, &mps),
        ["DRA device gpu-0-share-1 (claim default/c1) goes from time-sliced to MPS"]
    );
    assert_eq!(
        why(&ts, &ts4),
        [
            "DRA device gpu-0-share-1 (claim default/c1) stays time-sliced but goes from 2 \
          holders to 4 holders"
        ]
    );
    assert_eq!(
        why(&ts, &exclusive),
        ["DRA device gpu-0-share-1 (claim default/c1) is not published by the new profile"]
    );
    assert!(
        why(&ts, &ts).is_empty(),
        "an unchanged device drains nobody"
    );
    // Another node's pool or driver is not ours.
    let other = claims_reallocated(&holding("gpu-0-share-1"), "node-b", Some(&ts), &mps);
    assert!(other.is_empty());
}

#[test]
fn a_renamed_resource_reallocates_its_devices() {
    let before = of(&replicas("GPU-a", GPU, 2), Sharing::TimeSlicing);
    let after = of(
        &replicas("GPU-a", "nvidia.com/gpu.shared", 2),
        Sharing::TimeSlicing,
    );
    assert!(matches!(
        judge(&held(GPU, "GPU-a::0"), Some(&before), &after),
        Verdict::Reallocated(_)
    ));
}

#[test]
fn only_devices_of_this_nodes_gpus_are_held_and_each_pod_device_once() {
    use crate::kubelet::pod_resources::api::{ContainerDevices, ContainerResources, PodResources};
    let observed: ObservedNode = serde_json::from_value(serde_json::json!({"gpus": [
        {"index": 0, "product": "NVIDIA H100 80GB HBM3", "uuid": "GPU-a",
         "mig": {"current": true, "pending": true},
         "instances": [{"profile": "1g.10gb", "placement": [0, 1], "giId": 9}],
         "computeInstances": [{"giId": 9, "ciId": 0, "profileId": 0, "uuid": "MIG-x"}]}
    ]}))
    .unwrap();
    let container = |resource: &str, ids: &[&str]| ContainerResources {
        name: "c".into(),
        devices: vec![ContainerDevices {
            resource_name: resource.into(),
            device_ids: ids.iter().map(|s| s.to_string()).collect(),
        }],
        dynamic_resources: vec![],
    };
    let list = ListPodResourcesResponse {
        pod_resources: vec![PodResources {
            name: "p".into(),
            namespace: "default".into(),
            containers: vec![
                container("nvidia.com/mig-1g.10gb", &["MIG-x"]),
                container("example.com/nic", &["nic-0"]),
                container(GPU, &["GPU-a::3", "GPU-gone"]),
            ],
        }],
    };
    let ids: Vec<String> = held_devices(&list, &observed)
        .into_iter()
        .map(|h| format!("{} {}", h.resource, h.id))
        .collect();
    assert_eq!(
        ids,
        ["nvidia.com/gpu GPU-a::3", "nvidia.com/mig-1g.10gb MIG-x"]
    );
}

#[test]
fn an_advertisement_is_saved_once_and_read_back() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(Advertisement::load(dir.path()), None);
    let ad = advertisement(&[("GPU-a", GPU, Sharing::Exclusive)]);
    assert!(ad.save(dir.path()).unwrap());
    assert!(!ad.save(dir.path()).unwrap(), "unchanged: not rewritten");
    assert_eq!(Advertisement::load(dir.path()), Some(ad));
}
