//! Fractional GPUs as DRA devices (consumable capacity, KEP-5075; `DRAConsumableCapacity`, beta
//! and on by default in Kubernetes 1.36): an MPS GPU planned `consumable` is one device
//! `gpu-<i>-mps` (a MIG device shared so, `gpu-<i>-mig-<start>-<profile>-mps`) with
//! `allowMultipleAllocations: true` and three capacities every claim consumes part of:
//!
//! - `memory`: the GPU's memory; a claim's share becomes its `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`;
//! - `compute`: 100 (percent of the SMs); a claim's share becomes its
//!   `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`;
//! - `clients`: the rule's `replicas`, one per claim (`validValues: [1]`), so the scheduler
//!   never places more claims than the MPS server takes clients.
//!
//! Each capacity's `requestPolicy` is the profile's (`default`, `validRange: {min, step}`): the
//! scheduler fills in the default for a claim that asks nothing, rounds an ask up to the next
//! step, and allocates while the sums fit (`CmpRequestOverCapacity`,
//! k8s.io/dynamic-resource-allocation/structured/internal/incubating/consumable_capacity.go).
//!
//! A server without the feature (the 1.34 and 1.35 default) drops `allowMultipleAllocations`
//! and every `requestPolicy` and stores the rest: the device would then go to one claim whole,
//! while the node believes it shared. The publisher finds that in the stored answer and
//! publishes [`fixed_shares`] instead: `replicas` shares of the GPU, each with an even split of
//! its memory, as `mps: {replicas: N, pinnedMemoryLimit: auto}` would.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::api::{
    count, mebibytes, CapacityRequestPolicy, CapacityRequestPolicyRange, Device, DeviceAttribute,
    DeviceCapacity, ResourceSlice,
};
use super::quantity;
use crate::sharing::{ConsumableShares, RequestPolicy, WHOLE_COMPUTE_PERCENT};

/// The capacity claims' memory shares come out of (MiB quantities).
pub const MEMORY: &str = "memory";
/// The capacity claims' compute shares come out of, in percent of the device's SMs.
pub const COMPUTE: &str = "compute";
/// The capacity that counts MPS clients: one per claim.
pub const CLIENTS: &str = "clients";
/// The boolean attribute a consumable device carries, for selectors (`device.attributes[
/// "gpu.gpu-share.dev"].consumable`).
pub const ATTRIBUTE: &str = "consumable";
/// What a consumable device's name adds to its GPU's.
const SUFFIX: &str = "-mps";

/// `gpu` (the whole GPU's device) as one consumable MPS device shared by up to `replicas`
/// claims.
pub fn device(gpu: Device, shares: &ConsumableShares, replicas: u64) -> Device {
    let mut device = gpu;
    device.name = format!("{}{SUFFIX}", device.name);
    // Only capacities with a request policy: the scheduler charges a claim that asks nothing of
    // a capacity without one its whole value (`fillEmptyRequest`), so a MIG device's
    // `computeSlices` would let one claim take the device (seen on the real 1.36.2 scheduler:
    // each claim consumed all 3 slices of a 3g.40gb device and a second claim stayed Pending).
    device.capacity.clear();
    device.allow_multiple_allocations = Some(true);
    device
        .attributes
        .insert("sharing".into(), DeviceAttribute::string(super::MPS));
    device.attributes.insert(
        ATTRIBUTE.into(),
        DeviceAttribute {
            bool: Some(true),
            ..DeviceAttribute::default()
        },
    );
    device.capacity.insert(
        MEMORY.into(),
        consumable(mebibytes(shares.memory_mib), shares.memory, mebibytes),
    );
    device.capacity.insert(
        COMPUTE.into(),
        consumable(count(WHOLE_COMPUTE_PERCENT), shares.compute, count),
    );
    device.capacity.insert(
        CLIENTS.into(),
        DeviceCapacity {
            value: count(replicas),
            request_policy: Some(CapacityRequestPolicy {
                default: count(1),
                valid_range: None,
                valid_values: vec![count(1)],
            }),
        },
    );
    device
}

fn consumable(value: Quantity, policy: RequestPolicy, unit: fn(u64) -> Quantity) -> DeviceCapacity {
    DeviceCapacity {
        value,
        request_policy: Some(CapacityRequestPolicy {
            default: unit(policy.default),
            valid_range: Some(CapacityRequestPolicyRange {
                min: unit(policy.min),
                max: None,
                step: Some(unit(policy.step)),
            }),
            valid_values: Vec::new(),
        }),
    }
}

/// What one claim was given of a consumable device: its MPS limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Share {
    pub memory_mib: u64,
    pub compute_percent: u64,
}

/// Why an allocation result's `consumedCapacity` cannot be enforced on `device`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShareError {
    #[error(
        "device {device} is shared by capacity, but the allocation gives no consumedCapacity \
         {capacity:?} (was it allocated by a scheduler without DRAConsumableCapacity?)"
    )]
    Missing {
        device: String,
        capacity: &'static str,
    },
    #[error("device {device}: consumedCapacity {capacity:?}: {source}")]
    Unreadable {
        device: String,
        capacity: &'static str,
        source: quantity::QuantityError,
    },
    #[error(
        "device {device}: consumedCapacity {capacity:?} is {amount}, more than the {published} \
         the device publishes"
    )]
    OverPublished {
        device: String,
        capacity: &'static str,
        amount: String,
        published: String,
    },
    #[error(
        "device {device}: consumedCapacity {capacity:?} is {amount}, which limits nothing to 0"
    )]
    Zero {
        device: String,
        capacity: &'static str,
        amount: String,
    },
}

/// The share a claim's result with `consumed` (its `consumedCapacity`) was given of the
/// published consumable `device`: memory in whole MiB (rounded down, so never looser than
/// given) and compute in whole percent (rounded down likewise). Missing, unreadable, zero, or
/// more than the device publishes is refused by name.
pub fn share_of(
    device: &Device,
    consumed: &std::collections::BTreeMap<String, String>,
) -> Result<Share, ShareError> {
    let read = |capacity: &'static str,
                parse: fn(&str) -> Result<u128, quantity::QuantityError>| {
        let text = consumed.get(capacity).ok_or_else(|| ShareError::Missing {
            device: device.name.clone(),
            capacity,
        })?;
        let unreadable = |source| ShareError::Unreadable {
            device: device.name.clone(),
            capacity,
            source,
        };
        let amount = parse(text).map_err(unreadable)?;
        let published = device
            .capacity
            .get(capacity)
            .map(|c| c.value.0.clone())
            .unwrap_or_default();
        let limit = parse(&published).map_err(unreadable)?;
        if amount > limit {
            return Err(ShareError::OverPublished {
                device: device.name.clone(),
                capacity,
                amount: text.clone(),
                published,
            });
        }
        if amount == 0 {
            return Err(ShareError::Zero {
                device: device.name.clone(),
                capacity,
                amount: text.clone(),
            });
        }
        Ok(u64::try_from(amount).unwrap_or(u64::MAX))
    };
    let memory_mib = read(MEMORY, |t| {
        quantity::parse_mebibytes_floor(t).map(u128::from)
    })?;
    let compute_percent = read(COMPUTE, |t| Ok(quantity::parse_milli(t)? / 1000))?;
    Ok(Share {
        memory_mib,
        compute_percent,
    })
}

/// Why the shares `held` of consumable `device` (every prepared claim's, the new one's
/// included) exceed what it publishes, if they do: memory, compute or clients.
pub fn over_capacity(device: &Device, held: &[Share]) -> Option<String> {
    let memory = published_mib(device, MEMORY).unwrap_or(0);
    let compute = published_count(device, COMPUTE).unwrap_or(0);
    let clients = published_count(device, CLIENTS).unwrap_or(0);
    let memory_held: u64 = held.iter().map(|s| s.memory_mib).sum();
    let compute_held: u64 = held.iter().map(|s| s.compute_percent).sum();
    let over = |what: &str, sum: u64, of: u64, unit: &str| {
        format!(
            "device {}: the prepared shares would hold {sum}{unit} of its {of}{unit} {what}, \
             more than it has (not an allocation the scheduler makes)",
            device.name
        )
    };
    if memory_held > memory {
        Some(over("memory", memory_held, memory, " MiB"))
    } else if compute_held > compute {
        Some(over("compute", compute_held, compute, "%"))
    } else if held.len() as u64 > clients {
        Some(over("MPS clients", held.len() as u64, clients, ""))
    } else {
        None
    }
}

/// `slices` with every consumable device replaced by its fixed shares, for an API server that
/// dropped `allowMultipleAllocations` (module doc): `gpu-<i>-share-<k>`, `k` below the device's
/// `clients`, each with the GPU's memory split evenly as its pinned limit, named and
/// attributed as a `mps: {replicas: N, pinnedMemoryLimit: auto}` GPU's shares are.
pub fn fixed_shares(slices: &[ResourceSlice]) -> Vec<ResourceSlice> {
    let Some(first) = slices.first() else {
        return Vec::new();
    };
    let devices = slices
        .iter()
        .flat_map(|s| &s.spec.devices)
        .flat_map(|d| {
            if d.is_consumable() {
                shares_of_consumable(d)
            } else {
                vec![d.clone()]
            }
        })
        .collect();
    let counters = slices
        .iter()
        .flat_map(|s| s.spec.shared_counters.clone())
        .collect();
    super::repacked(first, devices, counters)
}

fn shares_of_consumable(device: &Device) -> Vec<Device> {
    let replicas = published_count(device, CLIENTS).unwrap_or(1).max(1);
    let memory_mib = published_mib(device, MEMORY);
    let mut base = device.clone();
    base.name = device
        .name
        .strip_suffix(SUFFIX)
        .unwrap_or(&device.name)
        .to_string();
    base.allow_multiple_allocations = None;
    base.attributes.remove(ATTRIBUTE);
    base.capacity.clear();
    super::mps_limits(&mut base, None, memory_mib.map(|m| m / replicas));
    super::shares_of(&base, super::MPS, replicas)
}

/// A capacity `device` publishes, in whole MiB (rounded down); `None` when absent or unreadable.
fn published_mib(device: &Device, name: &str) -> Option<u64> {
    quantity::parse_mebibytes_floor(&device.capacity.get(name)?.value.0).ok()
}

/// A capacity `device` publishes, as a whole number; `None` when absent or unreadable.
fn published_count(device: &Device, name: &str) -> Option<u64> {
    let value = quantity::parse_value(&device.capacity.get(name)?.value.0).ok()?;
    u64::try_from(value).ok()
}

#[cfg(test)]
mod tests;
