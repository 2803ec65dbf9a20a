//! A change of how a device is advertised is a re-allocation of that device.
//!
//! The kubelet tracks allocations by device ID within a resource: a pod keeps the ID it was
//! given (`GPU-a::2` of `nvidia.com/gpu`) even when the plugin stops advertising it, and every
//! ID the plugin advertises and no running pod holds is free to hand out (kubelet
//! devicemanager: `healthyDevices − allocatedDevices`). So when a profile keeps a GPU or MIG
//! device but advertises it under another ID or resource, the kubelet hands the same hardware
//! to a second pod while the first still runs on it. Measured on a real kubelet 1.36 with
//! NVIDIA's device plugin: time-slicing → exclusive gave a 6-GPU pod two GPUs two time-sliced
//! pods were using; MIG strategy mixed → single handed kept `mig-1g.10gb` devices out again as
//! `nvidia.com/gpu`; replicas 4 → 2 left a pod on `GPU-…::2`, an ID no longer advertised.
//!
//! The rule, per device ID a pod holds (from the kubelet's PodResources `List`, the same truth
//! the MIG drain uses): the pod stays only if the new advertisement has that same ID, under the
//! same resource, shared the same way (exclusive, time-sliced, MPS) as the last advertisement
//! this node applied. Then the kubelet still counts it as allocated and cannot hand it out
//! again (replicas that grow under the same names keep every held ID). Otherwise its holder is
//! drained before the new advertisement is written. The last advertisement is kept in the
//! state dir ([`ADVERTISEMENT_FILE`]); without it (first start of this version) the sharing
//! cannot be compared, and only the ID and resource are.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::atomic_file;
use crate::builtin_plugin::inventory::{DeviceEntry, Inventory};
use crate::kubelet::pod_resources::api::ListPodResourcesResponse;
use crate::kubelet::pod_resources::{device_uuid, PodName};
use crate::plan::ObservedNode;

/// The node's last applied advertisement, in the agent's state dir.
pub const ADVERTISEMENT_FILE: &str = "advertised.json";

/// How one advertised device is shared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Sharing {
    /// One pod per device.
    Exclusive,
    /// A replica of a time-sliced device.
    TimeSlicing,
    /// A replica of a device shared through an MPS daemon.
    Mps,
}

impl fmt::Display for Sharing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Sharing::Exclusive => "exclusive",
            Sharing::TimeSlicing => "time-sliced",
            Sharing::Mps => "MPS",
        })
    }
}

/// How one device ID is advertised.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Advertised {
    pub resource: String,
    pub sharing: Sharing,
}

/// Every device ID a node advertises, with its resource and sharing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Advertisement {
    pub devices: BTreeMap<String, Advertised>,
}

impl Advertisement {
    /// What `inventory` advertises (the NVIDIA plugin's device IDs are the same: see
    /// [`crate::builtin_plugin::inventory`]).
    pub fn of(inventory: &Inventory) -> Self {
        let devices = inventory
            .resources
            .values()
            .flat_map(|r| r.devices.iter().map(move |d| (r, d)))
            .map(|(r, d)| {
                let advertised = Advertised {
                    resource: r.resource.clone(),
                    sharing: sharing_of(d),
                };
                (d.id.clone(), advertised)
            })
            .collect();
        Advertisement { devices }
    }

    /// The advertisement last saved in `state_dir`; none when there is none or it cannot be
    /// read (then only IDs and resources are compared, see the module doc).
    pub fn load(state_dir: &Path) -> Option<Self> {
        let bytes = std::fs::read(state_dir.join(ADVERTISEMENT_FILE)).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    /// Save to `state_dir` unless it holds this already.
    pub fn save(&self, state_dir: &Path) -> std::io::Result<bool> {
        let bytes = serde_json::to_vec_pretty(self)?;
        atomic_file::replace_if_changed(
            &state_dir.join(ADVERTISEMENT_FILE),
            &bytes,
            atomic_file::READABLE_BY_ALL,
        )
    }
}

fn sharing_of(device: &DeviceEntry) -> Sharing {
    match (&device.mps, device.replicas) {
        (Some(_), _) => Sharing::Mps,
        (None, 0 | 1) => Sharing::Exclusive,
        (None, _) => Sharing::TimeSlicing,
    }
}

/// One device ID a pod holds, as the kubelet lists it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Held {
    pub pod: PodName,
    pub resource: String,
    pub id: String,
}

/// Every device ID in `list` naming a GPU or MIG device of `observed` (a replica
/// `<uuid>::<n>` names its device); other plugins' devices are left out.
pub fn held_devices(list: &ListPodResourcesResponse, observed: &ObservedNode) -> Vec<Held> {
    let ours = |id: &str| {
        let uuid = device_uuid(id);
        observed.gpus.iter().any(|g| {
            g.uuid.as_deref() == Some(uuid)
                || g.compute_instances
                    .iter()
                    .any(|ci| ci.uuid.as_deref() == Some(uuid))
        })
    };
    let mut held = Vec::new();
    for pod in &list.pod_resources {
        let name = PodName {
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
        };
        for devices in pod.containers.iter().flat_map(|c| &c.devices) {
            for id in devices.device_ids.iter().filter(|id| ours(id)) {
                held.push(Held {
                    pod: name.clone(),
                    resource: devices.resource_name.clone(),
                    id: id.clone(),
                });
            }
        }
    }
    held.sort();
    held.dedup();
    held
}

/// The DRA devices of this node's pool (driver [`crate::dra::DRIVER`], pool `node`) that pods'
/// claims hold, as the kubelet lists them (`dynamic_resources`, Kubernetes 1.34+), whose name
/// the next publish (`next`) lacks: the device goes away or turns into others (a re-partition,
/// shares becoming one device), so the scheduler would allocate its hardware to another claim
/// while the holder runs. Measured on a real kubelet 1.36: a pod holding a destroyed MIG device
/// through a claim was not evicted and kept running on a device that no longer existed.
pub fn claims_losing_devices(
    list: &ListPodResourcesResponse,
    node: &str,
    next: &BTreeSet<String>,
) -> Vec<(Held, String)> {
    let mut out = Vec::new();
    for pod in &list.pod_resources {
        let name = PodName {
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
        };
        for claim in pod.containers.iter().flat_map(|c| &c.dynamic_resources) {
            for device in &claim.claim_resources {
                let ours = device.driver_name == crate::dra::DRIVER && device.pool_name == node;
                if !ours || next.contains(&device.device_name) {
                    continue;
                }
                let held = Held {
                    pod: name.clone(),
                    resource: format!("{}/{}", device.driver_name, device.pool_name),
                    id: device.device_name.clone(),
                };
                let why = format!(
                    "DRA device {} (claim {}/{}) is not published by the new profile",
                    device.device_name, claim.claim_namespace, claim.claim_name
                );
                if !out.iter().any(|(h, _)| h == &held) {
                    out.push((held, why));
                }
            }
        }
    }
    out
}

/// What becomes of one held device ID, and why (said in the log and the drain's Event).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The kubelet still counts the ID as allocated: it cannot be handed out again.
    Stays(String),
    /// The hardware behind the ID is advertised otherwise: its holder must leave first.
    Reallocated(String),
}

/// The verdict on `held` when the node goes from `before` (none: not known) to `after`.
pub fn judge(held: &Held, before: Option<&Advertisement>, after: &Advertisement) -> Verdict {
    judge_id(&held.id, &held.resource, before, after)
}

/// The verdict on device ID `id` of `resource`, held by some pod, from `before` to `after`.
fn judge_id(
    id: &str,
    resource: &str,
    before: Option<&Advertisement>,
    after: &Advertisement,
) -> Verdict {
    let Some(now) = after.devices.get(id) else {
        return Verdict::Reallocated(format!(
            "{id} ({resource}) is no longer advertised{}",
            readvertised_as(id, after)
        ));
    };
    if now.resource != resource {
        return Verdict::Reallocated(format!(
            "{id} is now advertised as {}, not {resource}",
            now.resource
        ));
    }
    match before.and_then(|b| b.devices.get(id)) {
        Some(was) if was.sharing != now.sharing => Verdict::Reallocated(format!(
            "{id} ({resource}) goes from {} to {}",
            was.sharing, now.sharing
        )),
        Some(_) => Verdict::Stays(format!(
            "{id} stays advertised as {resource}, {}",
            now.sharing
        )),
        None => Verdict::Stays(format!(
            "{id} stays advertised as {resource}, now {} (how it was shared before is not \
             known)",
            now.sharing
        )),
    }
}

/// `"; the device is now …"`: how the device behind `id` is advertised instead, if it is.
fn readvertised_as(id: &str, after: &Advertisement) -> String {
    let uuid = device_uuid(id);
    let mut same_device = after
        .devices
        .iter()
        .filter(|(other, _)| device_uuid(other) == uuid);
    let Some((first, advertised)) = same_device.next() else {
        return String::new();
    };
    let more = same_device.count();
    let others = if more > 0 {
        format!(" and {more} more")
    } else {
        String::new()
    };
    format!(
        "; its device is now {first}{others} of {}, {}",
        advertised.resource, advertised.sharing
    )
}

/// What would become of a pod holding each device ID `before` advertises, were the node to
/// advertise `after`: `gpu-share plan --advertised` prints it, so an operator sees per device
/// which holders a change evicts and why, before labelling the node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceVerdict {
    pub id: String,
    pub resource: String,
    /// True: its holder is drained before the new advertisement is written.
    pub evicts_holder: bool,
    pub why: String,
}

/// [`DeviceVerdict`]s for every device ID of `before`, in ID order.
pub fn verdicts(before: &Advertisement, after: &Advertisement) -> Vec<DeviceVerdict> {
    let each = before.devices.iter().map(|(id, was)| {
        let (evicts_holder, why) = match judge_id(id, &was.resource, Some(before), after) {
            Verdict::Stays(why) => (false, why),
            Verdict::Reallocated(why) => (true, why),
        };
        DeviceVerdict {
            id: id.clone(),
            resource: was.resource.clone(),
            evicts_holder,
            why,
        }
    });
    each.collect()
}

/// The held devices whose holders must leave before `after` is advertised, with why.
pub fn reallocated(
    held: &[Held],
    before: Option<&Advertisement>,
    after: &Advertisement,
) -> Vec<(Held, String)> {
    held.iter()
        .filter_map(|h| match judge(h, before, after) {
            Verdict::Reallocated(why) => Some((h.clone(), why)),
            Verdict::Stays(_) => None,
        })
        .collect()
}

/// The `Reallocating` Event's note: each holder and why its device is re-allocated.
pub(super) fn note(key: &str, reallocated: &[(Held, String)]) -> String {
    let each: Vec<String> = reallocated
        .iter()
        .map(|(held, why)| format!("{}: {why}", held.pod))
        .collect();
    format!(
        "profile {key} advertises devices pods hold otherwise; their holders are drained first \
         so the kubelet cannot hand the same device to a second pod: {}",
        each.join("; ")
    )
}

#[cfg(test)]
mod tests {
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
                        },
                    )
                })
                .collect(),
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
        use crate::kubelet::pod_resources::api::{
            ContainerDevices, ContainerResources, PodResources,
        };
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
}
