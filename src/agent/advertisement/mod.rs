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
//! same resource, shared the same way (exclusive, time-sliced, MPS) and on the same terms
//! ([`Terms`]: replica count, MPS limits) as the last advertisement this node applied. Then
//! the kubelet still counts it as allocated and cannot hand it out again, and its holder runs
//! on the terms the node still offers. Otherwise its holder is drained before the new
//! advertisement is written. The terms count because a holder started under them: MPS applies
//! a client's limits when it connects, so a holder of a 40 GiB share keeps 40 GiB after the
//! device is cut into 20 GiB shares, and the new tenants beside it are promised memory it can
//! take; a time-sliced GPU cut into more replicas gives each holder less of it. The same rule
//! holds for DRA devices held through claims ([`claims_reallocated`]): a device the next
//! publish lacks, or publishes with another `sharing`, `replicas` or MPS limit attribute.
//!
//! The last advertisement is kept in the state dir ([`ADVERTISEMENT_FILE`]); without it (first
//! start of this version) the sharing cannot be compared, and only the ID and resource are;
//! one saved before terms were kept compares the sharing mode only.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::atomic_file;
use crate::builtin_plugin::inventory::{DeviceEntry, Inventory};
use crate::dra::api::ResourceSlice;
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

/// The terms one device is handed out on, beyond its sharing mode: a holder started under
/// them (module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Terms {
    /// How many holders share the device (1: not shared).
    pub replicas: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_thread_percentage: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pinned_memory_limit_mib: Option<u64>,
}

impl fmt::Display for Terms {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let holders = if self.replicas == 1 {
            "holder"
        } else {
            "holders"
        };
        write!(f, "{} {holders}", self.replicas)?;
        if let Some(pct) = self.active_thread_percentage {
            write!(f, ", {pct}% of the threads each")?;
        }
        if let Some(mib) = self.pinned_memory_limit_mib {
            write!(f, ", {mib} MiB pinned memory each")?;
        }
        Ok(())
    }
}

/// How one device ID is advertised.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Advertised {
    pub resource: String,
    pub sharing: Sharing,
    /// None in an advertisement saved before terms were kept: the sharing mode is compared,
    /// the terms are not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terms: Option<Terms>,
}

/// Every device ID a node advertises, with its resource and sharing; with `--plugin dra`,
/// also every device its ResourceSlices publish, by device name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Advertisement {
    pub devices: BTreeMap<String, Advertised>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub dra_devices: BTreeMap<String, Advertised>,
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
                    terms: Some(terms_of(d)),
                };
                (d.id.clone(), advertised)
            })
            .collect();
        Advertisement {
            devices,
            dra_devices: BTreeMap::new(),
        }
    }

    /// This advertisement with the devices `slices` publish (`--plugin dra`).
    pub fn with_dra(mut self, slices: &[ResourceSlice]) -> Self {
        self.dra_devices = dra_advertised(slices);
        self
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

fn terms_of(device: &DeviceEntry) -> Terms {
    Terms {
        replicas: device.replicas.max(1),
        active_thread_percentage: device.mps.as_ref().and_then(|m| m.active_thread_percentage),
        pinned_memory_limit_mib: device.mps.as_ref().and_then(|m| m.pinned_memory_limit_mib),
    }
}

/// The devices `slices` publish, read back from their attributes (`sharing`, `replicas`,
/// `mpsActiveThreadPercentage`, `mpsPinnedMemoryLimitMiB`: [`crate::dra`]), under the
/// resource `<driver>/<pool>`.
fn dra_advertised(slices: &[ResourceSlice]) -> BTreeMap<String, Advertised> {
    let mut out = BTreeMap::new();
    for slice in slices {
        let resource = format!("{}/{}", slice.spec.driver, slice.spec.pool.name);
        for device in &slice.spec.devices {
            let int = |name: &str| device.attributes.get(name).and_then(|a| a.int);
            let sharing = match device
                .attributes
                .get("sharing")
                .and_then(|a| a.string.as_deref())
            {
                Some("mps") => Sharing::Mps,
                Some("timeSlicing") => Sharing::TimeSlicing,
                _ => Sharing::Exclusive,
            };
            let terms = Terms {
                replicas: int("replicas")
                    .and_then(|n| u64::try_from(n).ok())
                    .unwrap_or(1),
                active_thread_percentage: int("mpsActiveThreadPercentage")
                    .and_then(|n| u32::try_from(n).ok()),
                pinned_memory_limit_mib: int("mpsPinnedMemoryLimitMiB")
                    .and_then(|n| u64::try_from(n).ok()),
            };
            let advertised = Advertised {
                resource: resource.clone(),
                sharing,
                terms: Some(terms),
            };
            out.insert(device.name.clone(), advertised);
        }
    }
    out
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
/// claims hold, as the kubelet lists them (`dynamic_resources`, Kubernetes 1.34+), that the
/// next publish (`after`'s DRA devices) lacks or publishes otherwise than `before` did. A
/// device that goes away or turns into others (a re-partition, shares becoming one device)
/// would have its hardware allocated to another claim while the holder runs: measured on a
/// real kubelet 1.36, a pod holding a destroyed MIG device through a claim was not evicted
/// and kept running on a device that no longer existed. A device that keeps its name but not
/// its sharing or terms would leave its holder on terms the node no longer offers (module doc).
pub fn claims_reallocated(
    list: &ListPodResourcesResponse,
    node: &str,
    before: Option<&Advertisement>,
    after: &Advertisement,
) -> Vec<(Held, String)> {
    let mut out = Vec::new();
    for pod in &list.pod_resources {
        let name = PodName {
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
        };
        for claim in pod.containers.iter().flat_map(|c| &c.dynamic_resources) {
            for device in &claim.claim_resources {
                if device.driver_name != crate::dra::DRIVER || device.pool_name != node {
                    continue;
                }
                let held = Held {
                    pod: name.clone(),
                    resource: format!("{}/{}", device.driver_name, device.pool_name),
                    id: device.device_name.clone(),
                };
                let was = before.and_then(|b| b.dra_devices.get(&held.id));
                let change = match after.dra_devices.get(&held.id) {
                    None => "is not published by the new profile".to_string(),
                    Some(now) => match was.and_then(|was| change_of_terms(was, now)) {
                        Some(change) => change,
                        None => continue,
                    },
                };
                let why = format!(
                    "DRA device {} (claim {}/{}) {change}",
                    held.id, claim.claim_namespace, claim.claim_name
                );
                if !out.iter().any(|(h, _)| h == &held) {
                    out.push((held, why));
                }
            }
        }
    }
    out
}

/// How a device kept under its name changes its sharing or terms (`"goes from … to …"`), if
/// it does; terms are compared only when both sides know them.
fn change_of_terms(was: &Advertised, now: &Advertised) -> Option<String> {
    if was.sharing != now.sharing {
        return Some(format!("goes from {} to {}", was.sharing, now.sharing));
    }
    match (was.terms, now.terms) {
        (Some(a), Some(b)) if a != b => {
            Some(format!("stays {} but goes from {a} to {b}", now.sharing))
        }
        _ => None,
    }
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
        Some(was) => match change_of_terms(was, now) {
            Some(change) => Verdict::Reallocated(format!("{id} ({resource}) {change}")),
            None => Verdict::Stays(format!(
                "{id} stays advertised as {resource}, {}",
                now.sharing
            )),
        },
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
mod tests;
