//! What the API server does with fields whose feature gate is off: it drops them from the
//! object before validating and storing it, so the write succeeds and the fields are simply
//! gone when read back. `DRAPartitionableDevices` (on by default, as in 1.36; off by default in
//! 1.34 and 1.35, where the server drops every counter a driver publishes) and `DRADeviceTaints`
//! (beta and on in 1.36, alpha and off before) and `DRAConsumableCapacity` (beta and on in 1.36,
//! alpha and off before) are modelled.
//!
//! Ported from `dropDisabledDRAPartitionableDevicesFields` in
//! pkg/registry/resource/resourceslice/strategy.go (Kubernetes 1.36, as vendored by
//! openshift/microshift): unless the gate is on or the stored slice already uses the feature,
//! `spec.sharedCounters` and `spec.perDeviceNodeSelection` become nil, and so do each device's
//! `consumesCounters`, `nodeName`, `nodeSelector` and `allNodes`. The strategy runs before
//! validation (PrepareForCreate/PrepareForUpdate), so a slice that held only counter sets is
//! stored empty, which validation allows.

use serde_json::Value;

/// The fields DRAPartitionableDevices adds to a slice's spec.
const SPEC_FIELDS: [&str; 2] = ["sharedCounters", "perDeviceNodeSelection"];
/// The fields it adds to each device.
const DEVICE_FIELDS: [&str; 4] = ["consumesCounters", "nodeName", "nodeSelector", "allNodes"];

/// `slice` as a server with DRAPartitionableDevices off stores it, `old` being the stored slice
/// an update replaces (`draPartitionableDevicesFeatureInUse`: a slice that already holds
/// counters keeps them).
pub(crate) fn drop_partitionable_devices_fields(slice: &mut Value, old: Option<&Value>) {
    if old.is_some_and(uses_partitionable_devices) {
        return;
    }
    let Some(spec) = slice.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    for field in SPEC_FIELDS {
        spec.remove(field);
    }
    for device in spec
        .get_mut("devices")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
        .filter_map(Value::as_object_mut)
    {
        for field in DEVICE_FIELDS {
            device.remove(field);
        }
    }
}

/// `draPartitionableDevicesFeatureInUse`: counter sets, per-device node selection, or a device
/// consuming counters.
fn uses_partitionable_devices(slice: &Value) -> bool {
    let spec = slice.get("spec").unwrap_or(&Value::Null);
    let non_empty = |v: Option<&Value>| match v {
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::Null) | None => false,
        Some(_) => true,
    };
    non_empty(spec.get("sharedCounters"))
        || non_empty(spec.get("perDeviceNodeSelection"))
        || spec
            .get("devices")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .any(|d| non_empty(d.get("consumesCounters")))
}

/// `slice` as a server with `DRAConsumableCapacity` off stores it
/// (`dropDisabledDRAConsumableCapacityFields`, pkg/registry/resource/resourceslice/strategy.go,
/// 1.36): every device's `allowMultipleAllocations` and every capacity's `requestPolicy` become
/// nil, unless the stored slice `old` already uses them (`draConsumableCapacityFeatureInUse`).
/// The strategy runs before validation, so a policy on a device that is not multi-allocatable is
/// dropped rather than refused.
pub(crate) fn drop_consumable_capacity(slice: &mut Value, old: Option<&Value>) {
    let in_use = |d: &Value| {
        d.get("allowMultipleAllocations")
            .is_some_and(|v| !v.is_null())
            || d.get("capacity")
                .and_then(Value::as_object)
                .is_some_and(|c| {
                    c.values()
                        .any(|c| c.get("requestPolicy").is_some_and(|p| !p.is_null()))
                })
    };
    let used = old
        .and_then(|o| o.pointer("/spec/devices"))
        .and_then(Value::as_array)
        .is_some_and(|ds| ds.iter().any(in_use));
    if used {
        return;
    }
    for device in devices_mut(slice) {
        device.remove("allowMultipleAllocations");
        for capacity in device
            .get_mut("capacity")
            .and_then(Value::as_object_mut)
            .into_iter()
            .flat_map(|c| c.values_mut())
            .filter_map(Value::as_object_mut)
        {
            capacity.remove("requestPolicy");
        }
    }
}

/// A device taint without `timeAdded` gets the time of the write, to the second
/// (`SetDefaults_DeviceTaint`, pkg/apis/resource/v1/defaults.go, 1.36): defaulting runs when the
/// request is decoded, before any gate drops the field.
pub(crate) fn default_taint_times(slice: &mut Value, now: &str) {
    for taint in taints_mut(slice) {
        if taint.get("timeAdded").is_none_or(Value::is_null) {
            taint.insert("timeAdded".into(), Value::String(now.to_string()));
        }
    }
}

/// `slice` as a server with `DRADeviceTaints` off stores it
/// (`dropDisabledDRADeviceTaintsFields`, pkg/registry/resource/resourceslice/strategy.go, 1.36):
/// every device's `taints` become nil, unless the stored slice `old` already has a tainted
/// device (`draDeviceTaintsFeatureInUse`).
pub(crate) fn drop_device_taints(slice: &mut Value, old: Option<&Value>) {
    let in_use = old
        .and_then(|o| o.pointer("/spec/devices"))
        .and_then(Value::as_array)
        .is_some_and(|ds| {
            ds.iter().any(|d| {
                d.get("taints")
                    .and_then(Value::as_array)
                    .is_some_and(|t| !t.is_empty())
            })
        });
    if in_use {
        return;
    }
    for device in devices_mut(slice) {
        device.remove("taints");
    }
}

fn devices_mut(slice: &mut Value) -> impl Iterator<Item = &mut serde_json::Map<String, Value>> {
    slice
        .pointer_mut("/spec/devices")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
        .filter_map(Value::as_object_mut)
}

fn taints_mut(slice: &mut Value) -> impl Iterator<Item = &mut serde_json::Map<String, Value>> {
    devices_mut(slice)
        .filter_map(|d| d.get_mut("taints").and_then(Value::as_array_mut))
        .flatten()
        .filter_map(Value::as_object_mut)
}
