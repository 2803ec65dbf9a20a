//! kube-scheduler's arithmetic for devices with `allowMultipleAllocations` (consumable
//! capacity), ported for the tests and benches that play the scheduler: what a request
//! consumes of each capacity and whether it still fits beside the shares already allocated.
//! Ported from k8s.io/dynamic-resource-allocation/structured/internal/incubating/
//! consumable_capacity.go (Kubernetes 1.36, as vendored by openshift/microshift):
//!
//! - `calculateConsumedCapacity`: no ask → the policy's `default` (the whole capacity when the
//!   capacity has no policy); an ask below `validRange.min` → `min`; otherwise rounded up to
//!   `min` plus a whole number of `step`s; with `validValues`, the first value not below it;
//! - `violatesPolicy`: the consumed amount above `validRange.max`, off the step, or not one of
//!   `validValues` (the default always passes) → the device is not allocated;
//! - `requestsContainNonExistCapacity`: an ask for a capacity the device lacks → not allocated;
//! - `CmpRequestOverCapacity`: the sum of every allocated share and this one must not exceed
//!   any capacity.
//!
//! Consumed amounts are written as the scheduler writes them: `resource.NewQuantity(v,
//! BinarySI)` in canonical form (`10Gi`, `1536Mi`, `25`).

use std::collections::BTreeMap;

use gpu_share::dra::api::{CapacityRequestPolicy, Device, DeviceCapacity};
use kube_double::quantity;

/// A claim's consumed capacity, name → quantity.
pub type Consumed = BTreeMap<String, String>;

/// Why the scheduler does not allocate a share of the device to the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotAllocated {
    /// The request asks for a capacity the device does not have.
    UnknownCapacity(String),
    /// The amount (after rounding) breaks the capacity's policy: above `max`, off the step.
    ViolatesPolicy { capacity: String, amount: String },
    /// The shares allocated already leave too little of this capacity.
    Full { capacity: String },
}

/// What a request asking `requests` (capacity → quantity) consumes of `device`.
pub fn consumed_capacity(
    device: &Device,
    requests: &BTreeMap<String, String>,
) -> Result<Consumed, NotAllocated> {
    if let Some(unknown) = requests.keys().find(|k| !device.capacity.contains_key(*k)) {
        return Err(NotAllocated::UnknownCapacity(unknown.clone()));
    }
    let mut consumed = Consumed::new();
    for (name, capacity) in &device.capacity {
        let amount = calculate(requests.get(name).map(|q| quantity(q)), capacity);
        if let Some(policy) = &capacity.request_policy {
            if violates(amount, policy) {
                return Err(NotAllocated::ViolatesPolicy {
                    capacity: name.clone(),
                    amount: binary_si(amount),
                });
            }
        }
        consumed.insert(name.clone(), binary_si(amount));
    }
    Ok(consumed)
}

/// Whether `new` fits on `device` beside the shares `allocated` (CmpRequestOverCapacity).
pub fn fits(device: &Device, allocated: &[Consumed], new: &Consumed) -> Result<(), NotAllocated> {
    for (name, capacity) in &device.capacity {
        let sum: i128 = allocated
            .iter()
            .chain([new])
            .filter_map(|c| c.get(name))
            .map(|q| quantity(q))
            .sum();
        if sum > quantity(&capacity.value.0) {
            return Err(NotAllocated::Full {
                capacity: name.clone(),
            });
        }
    }
    Ok(())
}

fn calculate(requested: Option<i128>, capacity: &DeviceCapacity) -> i128 {
    let policy = capacity.request_policy.as_ref();
    let Some(requested) = requested else {
        return policy.map_or(quantity(&capacity.value.0), |p| quantity(&p.default.0));
    };
    let Some(policy) = policy else {
        return requested;
    };
    if let Some(range) = &policy.valid_range {
        let min = quantity(&range.min.0);
        if requested < min {
            return min;
        }
        let Some(step) = range.step.as_ref().map(|s| quantity(&s.0)) else {
            return requested;
        };
        let steps = (requested - min + step - 1) / step;
        return min + step * steps;
    }
    policy
        .valid_values
        .iter()
        .map(|v| quantity(&v.0))
        .find(|v| requested <= *v)
        .unwrap_or(requested)
}

fn violates(amount: i128, policy: &CapacityRequestPolicy) -> bool {
    if amount == quantity(&policy.default.0) {
        return false;
    }
    if let Some(range) = &policy.valid_range {
        let min = quantity(&range.min.0);
        if range.max.as_ref().is_some_and(|m| amount > quantity(&m.0)) {
            return true;
        }
        return range
            .step
            .as_ref()
            .is_some_and(|s| (amount - min) % quantity(&s.0) != 0);
    }
    !policy.valid_values.is_empty() && !policy.valid_values.iter().any(|v| quantity(&v.0) == amount)
}

/// `v` as apimachinery writes a BinarySI quantity: the largest of Ki … Ei that divides it.
pub fn binary_si(v: i128) -> String {
    for (shift, suffix) in [
        (60, "Ei"),
        (50, "Pi"),
        (40, "Ti"),
        (30, "Gi"),
        (20, "Mi"),
        (10, "Ki"),
    ] {
        let unit = 1i128 << shift;
        if v != 0 && v % unit == 0 {
            return format!("{}{suffix}", v / unit);
        }
    }
    v.to_string()
}
