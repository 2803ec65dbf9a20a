//! Faulted devices in the published pool: a device a critical XID touched (its GPU, or the MIG
//! device it is or shares) carries a taint `gpu.gpu-share.dev/xid=<xid>`, so the scheduler
//! allocates it only to claims that tolerate the taint (`DRADeviceTaints`, beta and on by
//! default in Kubernetes 1.36). The taint goes when the fault heals ([`crate::gpu::xid`]).
//!
//! On a server that drops taints (the gate off: the default before 1.36) the publisher finds the
//! loss in the stored answer and publishes [`without_tainted`] instead: the faulted devices
//! withdrawn, so none is allocated while unhealthy (docs/dra.md, "Unhealthy devices").
//!
//! Pure: the slices in, the slices out. A tainted device counts against the 64-devices-per-slice
//! limit as one consuming counters does, so the pool is packed again around the taints.

use std::time::{SystemTime, UNIX_EPOCH};

use super::api::{Device, DeviceTaint, ResourceSlice};
use super::{numbered, pack, GpuDevices};
use crate::gpu::xid::Fault;

/// The key of gpu-share's fault taint; its value is the XID.
pub const XID_TAINT_KEY: &str = "gpu.gpu-share.dev/xid";

/// The attributes naming the NVML devices a published device stands on (see
/// [`super::resource_slices_with`]): its own UUID, the MIG device a share uses, the GPU it is
/// part of.
const UUID_ATTRIBUTES: [&str; 3] = ["uuid", "migUUID", "parentUUID"];

/// What the fault taint does to claims that do not tolerate it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TaintEffect {
    /// Not allocated to new claims; claims already allocated keep running.
    #[value(name = "NoSchedule")]
    NoSchedule,
    /// Also evicts the pods whose claims hold the device (the eviction controller of
    /// kube-controller-manager), so only behind an explicit choice.
    #[value(name = "NoExecute")]
    NoExecute,
}

impl TaintEffect {
    pub fn as_str(self) -> &'static str {
        match self {
            TaintEffect::NoSchedule => "NoSchedule",
            TaintEffect::NoExecute => "NoExecute",
        }
    }
}

/// The fault that touches `device`, if any: one on the device itself, on the MIG device it
/// shares, or on its GPU.
pub fn fault_of<'f>(
    device: &Device,
    faults: &'f [(Fault, SystemTime)],
) -> Option<&'f (Fault, SystemTime)> {
    let uuids: Vec<&str> = UUID_ATTRIBUTES
        .iter()
        .filter_map(|k| device.attributes.get(*k)?.string.as_deref())
        .collect();
    faults.iter().find(|(f, _)| uuids.contains(&f.device()))
}

/// `slices` with every device a fault touches tainted; unchanged when none is.
pub fn tainted(
    slices: &[ResourceSlice],
    faults: &[(Fault, SystemTime)],
    effect: TaintEffect,
) -> Vec<ResourceSlice> {
    let touched = |d: &Device| fault_of(d, faults).is_some();
    if !slices.iter().flat_map(|s| &s.spec.devices).any(touched) {
        return slices.to_vec();
    }
    repacked(slices, |device| {
        let mut device = device.clone();
        if let Some((fault, since)) = fault_of(&device, faults) {
            device.taints.push(DeviceTaint {
                key: XID_TAINT_KEY.to_string(),
                value: fault.xid.to_string(),
                effect: effect.as_str().to_string(),
                time_added: Some(rfc3339_seconds(*since)),
            });
        }
        Some(device)
    })
}

/// `slices` without their tainted devices: what a server that drops taints is sent.
pub fn without_tainted(slices: &[ResourceSlice]) -> Vec<ResourceSlice> {
    if !slices
        .iter()
        .flat_map(|s| &s.spec.devices)
        .any(|d| !d.taints.is_empty())
    {
        return slices.to_vec();
    }
    repacked(slices, |d| d.taints.is_empty().then(|| d.clone()))
}

/// The names of the tainted devices of `slices`.
pub fn tainted_devices(slices: &[ResourceSlice]) -> Vec<String> {
    slices
        .iter()
        .flat_map(|s| &s.spec.devices)
        .filter(|d| !d.taints.is_empty())
        .map(|d| d.name.clone())
        .collect()
}

/// The pool of `slices` again, each device passed through `keep` (dropped on `None`), its
/// counter sets kept, packed within the API's per-slice limits.
fn repacked(
    slices: &[ResourceSlice],
    keep: impl Fn(&Device) -> Option<Device>,
) -> Vec<ResourceSlice> {
    let Some(first) = slices.first() else {
        return Vec::new();
    };
    let devices = slices
        .iter()
        .flat_map(|s| &s.spec.devices)
        .filter_map(keep)
        .collect();
    let counters = slices
        .iter()
        .flat_map(|s| &s.spec.shared_counters)
        .map(|set| GpuDevices {
            devices: Vec::new(),
            counters: Some(set.clone()),
        });
    let groups = std::iter::once(GpuDevices {
        devices,
        counters: None,
    })
    .chain(counters)
    .collect();
    numbered(
        &first.spec.node_name,
        first.spec.pool.generation,
        pack(groups),
    )
}

/// `t` as the API server writes a `metav1.Time`: RFC 3339 in UTC, to the second.
fn rfc3339_seconds(t: SystemTime) -> String {
    let secs = t
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    k8s_openapi::jiff::Timestamp::from_second(secs)
        .map(|ts| ts.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::ObservedNode;
    use crate::plan::plan_for;
    use crate::profile::parse_profile;
    use crate::sharing::PluginKind;

    fn fault(device_uuid: &str) -> (Fault, SystemTime) {
        let fault = Fault {
            gpu_uuid: device_uuid.into(),
            mig_uuid: None,
            xid: 79,
        };
        (
            fault,
            UNIX_EPOCH + std::time::Duration::from_secs(1_800_000_000),
        )
    }

    /// 8 H100s time-sliced 16 ways: 128 shares, one slice while none is tainted.
    fn shares() -> (ObservedNode, Vec<ResourceSlice>) {
        let profile = parse_profile(
            "ts",
            "version: v1\nrules:\n- devices: all\n  timeSlicing: {replicas: 16}\n",
        )
        .unwrap();
        let mut node = ObservedNode::simulated(&["h100x8".to_string()]);
        for gpu in &mut node.gpus {
            gpu.uuid = Some(format!("GPU-{}", gpu.index));
        }
        let plan = plan_for("ts", &profile, &node, PluginKind::Dra).unwrap();
        let slices = super::super::resource_slices("node-a", 1, &plan.gpus, &node);
        (node, slices)
    }

    #[test]
    fn a_faulted_gpus_shares_are_tainted_and_the_pool_packed_to_64_a_slice() {
        let (node, slices) = shares();
        assert_eq!(slices.len(), 1);
        assert_eq!(slices[0].spec.devices.len(), 128);
        let gpu3 = node.gpus[3].uuid.clone().unwrap();
        let out = tainted(&slices, &[fault(&gpu3)], TaintEffect::NoSchedule);
        let devices: Vec<&Device> = out.iter().flat_map(|s| &s.spec.devices).collect();
        assert_eq!(devices.len(), 128, "every device still published");
        assert!(out.iter().all(|s| s.spec.devices.len() <= 64));
        assert!(out
            .iter()
            .all(|s| s.spec.pool.resource_slice_count == out.len() as i64));
        let tainted: Vec<&str> = devices
            .iter()
            .filter(|d| !d.taints.is_empty())
            .map(|d| d.name.as_str())
            .collect();
        assert_eq!(tainted.len(), 16);
        assert!(
            tainted.iter().all(|n| n.starts_with("gpu-3-")),
            "{tainted:?}"
        );
        let taint = &devices
            .iter()
            .find(|d| !d.taints.is_empty())
            .unwrap()
            .taints[0];
        assert_eq!(
            taint,
            &DeviceTaint {
                key: "gpu.gpu-share.dev/xid".into(),
                value: "79".into(),
                effect: "NoSchedule".into(),
                time_added: Some("2027-01-15T08:00:00Z".into()),
            }
        );
        // The fallback leaves them out, and nothing else.
        let without = without_tainted(&out);
        let left: Vec<&Device> = without.iter().flat_map(|s| &s.spec.devices).collect();
        assert_eq!(left.len(), 112);
        assert!(left.iter().all(|d| !d.name.starts_with("gpu-3-")));
        assert_eq!(without.len(), 1, "112 untainted devices fit one slice");
    }

    #[test]
    fn no_fault_on_the_pool_leaves_it_as_it_was() {
        let (_, slices) = shares();
        assert_eq!(tainted(&slices, &[], TaintEffect::NoExecute), slices);
        assert_eq!(
            tainted(&slices, &[fault("GPU-elsewhere")], TaintEffect::NoSchedule),
            slices
        );
        assert_eq!(without_tainted(&slices), slices);
    }

    #[test]
    fn the_no_execute_option_is_the_taints_effect() {
        let (node, slices) = shares();
        let gpu0 = node.gpus[0].uuid.clone().unwrap();
        let out = tainted(&slices, &[fault(&gpu0)], TaintEffect::NoExecute);
        let names = tainted_devices(&out);
        assert_eq!(names.len(), 16);
        let d = out
            .iter()
            .flat_map(|s| &s.spec.devices)
            .find(|d| d.name == names[0])
            .unwrap();
        assert_eq!(d.taints[0].effect, "NoExecute");
    }
}
