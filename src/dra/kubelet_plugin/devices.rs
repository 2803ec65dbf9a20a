//! From a published device to what a container given it needs. The built-in plugin already
//! answers that for every device it advertises (`ResourceDevices::allocate`: the device's UUID
//! in `NVIDIA_VISIBLE_DEVICES`; for MPS the daemon's pipe directory, `/dev/shm` and the
//! per-client limits), so a DRA device is mapped to the built-in device it is and asked the
//! same question, not answered a second way:
//!
//! - `gpu-<i>` (exclusive) and `gpu-<i>-mig-…` (an unshared MIG device): the device's `uuid`;
//! - `<device>-share-<k>` (time-sliced or MPS): replica `k` of the shared GPU or MIG device,
//!   `<uuid>::<k>` where the UUID is `migUUID` (a share of a MIG device) or `parentUUID`.
//!
//! The attributes are the ones `dra::resource_slices` publishes (docs/dra.md).

use crate::builtin_plugin::api::ContainerAllocateResponse;
use crate::builtin_plugin::{DeviceListing, Inventory};
use crate::dra::api::{Device, ResourceSlice};
use crate::dra::consumable::Share;

/// The published device `name` in `pool`, if the latest slices have it.
pub fn find_published<'a>(
    slices: &'a [ResourceSlice],
    pool: &str,
    name: &str,
) -> Option<&'a Device> {
    slices
        .iter()
        .filter(|s| s.spec.pool.name == pool)
        .flat_map(|s| &s.spec.devices)
        .find(|d| d.name == name)
}

/// Why a published device cannot be given to a container.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    #[error("device {device} has no UUID yet (its MIG device does not exist on the GPU)")]
    NoUuid { device: String },
    #[error("device {device} ({id}) is published but not among the node's applied devices")]
    NotApplied { device: String, id: String },
    #[error("device {device}: {source}")]
    Allocate {
        device: String,
        source: crate::builtin_plugin::inventory::AllocateError,
    },
}

/// What a container given `device` gets: the built-in plugin's `Allocate` answer for the same
/// device, rewritten for `listing` as the built-in plugin rewrites it (`cdi-cri`: the device's
/// CDI name in `cdi_devices`, e.g. `nvidia.com/gpu=<uuid>` from `nvidia-ctk cdi generate`'s
/// spec, which brings the device nodes; without `envvar`, no `NVIDIA_VISIBLE_DEVICES`). The
/// `cdi-annotations` strategy has no DRA counterpart: the answer's annotation is dropped.
pub fn container_edits(
    device: &Device,
    inventory: &Inventory,
    listing: &DeviceListing,
) -> Result<ContainerAllocateResponse, DeviceError> {
    let id = builtin_id(device)?;
    let resource = inventory
        .resources
        .values()
        .find(|r| r.devices.iter().any(|d| d.id == id))
        .ok_or_else(|| DeviceError::NotApplied {
            device: device.name.clone(),
            id: id.clone(),
        })?;
    builtin_answer(device, resource, &id, listing)
}

/// The built-in plugin's `Allocate` answer of `resource` for its device `id`, rewritten for
/// `listing` (the `cdi-annotations` strategy's annotation dropped: DRA has no counterpart).
fn builtin_answer(
    device: &Device,
    resource: &crate::builtin_plugin::inventory::ResourceDevices,
    id: &str,
    listing: &DeviceListing,
) -> Result<ContainerAllocateResponse, DeviceError> {
    let ids = [id.to_string()];
    let mut allocation = resource
        .allocate(&ids)
        .map_err(|source| DeviceError::Allocate {
            device: device.name.clone(),
            source,
        })?;
    listing.apply(&ids, "", &mut allocation);
    allocation.annotations.clear();
    Ok(allocation)
}

/// What a container given `share` of the consumable MPS GPU `device` gets: the answer for one
/// of the GPU's MPS entries (its UUID, the daemon's pipe directory and `/dev/shm`), with the
/// share's own limits in place of the fixed ones: `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` and
/// `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` from what the scheduler gave the claim. The daemon has
/// no defaults of its own (`crate::mps::consumable`), so these are what holds the client.
pub fn consumable_edits(
    device: &Device,
    share: Share,
    inventory: &Inventory,
    listing: &DeviceListing,
) -> Result<ContainerAllocateResponse, DeviceError> {
    let uuid = device
        .attributes
        .get("uuid")
        .and_then(|a| a.string.as_deref())
        .ok_or_else(|| DeviceError::NoUuid {
            device: device.name.clone(),
        })?;
    let (resource, entry) = inventory
        .resources
        .values()
        .flat_map(|r| r.devices.iter().map(move |d| (r, d)))
        .find(|(_, d)| d.uuid == uuid && d.mps.is_some())
        .ok_or_else(|| DeviceError::NotApplied {
            device: device.name.clone(),
            id: format!("{uuid} (shared through MPS)"),
        })?;
    let mut allocation = builtin_answer(device, resource, &entry.id, listing)?;
    // The container sees this one GPU, as device 0.
    allocation.envs.insert(
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".into(),
        format!("0={}M", share.memory_mib),
    );
    allocation.envs.insert(
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".into(),
        share.compute_percent.to_string(),
    );
    Ok(allocation)
}

/// The built-in plugin's ID for `device`: `<uuid>` or `<uuid>::<share>`.
fn builtin_id(device: &Device) -> Result<String, DeviceError> {
    let text = |key: &str| device.attributes.get(key).and_then(|a| a.string.as_deref());
    let int = |key: &str| device.attributes.get(key).and_then(|a| a.int);
    let no_uuid = || DeviceError::NoUuid {
        device: device.name.clone(),
    };
    match int("shareIndex") {
        None => text("uuid").map(str::to_string).ok_or_else(no_uuid),
        Some(k) => {
            let uuid = text("migUUID")
                .or_else(|| text("parentUUID"))
                .ok_or_else(no_uuid)?;
            Ok(if int("replicas").unwrap_or(1) > 1 {
                format!("{uuid}::{k}")
            } else {
                uuid.to_string()
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::dra::api::DeviceAttribute;

    fn device(name: &str, attrs: &[(&str, DeviceAttribute)]) -> Device {
        Device {
            name: name.into(),
            attributes: attrs
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
            capacity: BTreeMap::new(),
            consumes_counters: Vec::new(),
            taints: Vec::new(),
            allow_multiple_allocations: None,
        }
    }

    #[test]
    fn shares_are_replicas_of_their_mig_device_or_gpu() {
        let s = DeviceAttribute::string;
        let i = DeviceAttribute::int;
        let whole = device("gpu-0", &[("uuid", s("GPU-a"))]);
        assert_eq!(builtin_id(&whole).unwrap(), "GPU-a");
        let share = device(
            "gpu-1-share-3",
            &[
                ("parentUUID", s("GPU-b")),
                ("shareIndex", i(3)),
                ("replicas", i(4)),
            ],
        );
        assert_eq!(builtin_id(&share).unwrap(), "GPU-b::3");
        let mig_share = device(
            "gpu-2-mig-0-3g-40gb-share-1",
            &[
                ("parentUUID", s("GPU-c")),
                ("migUUID", s("MIG-c0")),
                ("shareIndex", i(1)),
                ("replicas", i(2)),
            ],
        );
        assert_eq!(builtin_id(&mig_share).unwrap(), "MIG-c0::1");
        let e = builtin_id(&device("gpu-3-mig-0-7g-80gb", &[])).unwrap_err();
        assert!(matches!(e, DeviceError::NoUuid { .. }), "{e:?}");
        assert!(
            e.to_string().contains("gpu-3-mig-0-7g-80gb has no UUID"),
            "{e}"
        );
    }
}
