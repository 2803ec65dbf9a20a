//! The apiserver's refusals of resource.k8s.io/v1 ResourceSlices that gpu-share could run
//! into, as Kubernetes 1.36 enforces them. The rules and their limits are those the v1 API
//! documents on its types (k8s.io/api resource/v1 types.go, as generated into the published
//! clients' docs: kubernetes-client/python `V1ResourceSliceSpec`, `V1Device`, `V1CounterSet`,
//! `V1DeviceCounterConsumption`); the messages keep the apiserver's field-error format
//! (`<Kind> "<name>" is invalid: <field>: <detail>`, k8s.io/apimachinery field.Error), and the
//! one for a slice with both devices and counters is the one a real 1.36.2 API server returned.
//!
//! - `spec`: only one of `devices` and `sharedCounters` may be set, where set means present and
//!   not null, even empty: the apiserver checks `spec.SharedCounters != nil && spec.Devices !=
//!   nil` (pkg/apis/resource/validation/validation.go, `validateResourceSliceSpec`), and JSON
//!   `[]` decodes to a non-nil slice. A real 1.36.2 server refused gpu-share's counter slices
//!   that carried `devices: []` (second run on the test bed);
//! - `spec.devices`: at most 128 entries, 64 if any device consumes counters or has taints;
//! - `spec.sharedCounters`: at most 8 counter sets; each at most 32 counters;
//! - `spec.devices[i].consumesCounters`: at most 2 entries, one per counter set, each at most
//!   32 counters;
//! - `spec.devices[i]`: at most 32 attributes and capacities combined.

use serde_json::Value;

use crate::kinds::KindInfo;
use crate::status::ApiError;

pub(crate) const MAX_DEVICES: usize = 128;
pub(crate) const MAX_DEVICES_WITH_COUNTERS_OR_TAINTS: usize = 64;
pub(crate) const MAX_COUNTER_SETS: usize = 8;
pub(crate) const MAX_COUNTERS_PER_SET: usize = 32;
pub(crate) const MAX_CONSUMPTIONS_PER_DEVICE: usize = 2;
pub(crate) const MAX_ATTRIBUTES_AND_CAPACITIES: usize = 32;

fn len(v: Option<&Value>) -> usize {
    match v {
        Some(Value::Array(a)) => a.len(),
        Some(Value::Object(o)) => o.len(),
        _ => 0,
    }
}

fn too_many(kind: &KindInfo, name: &str, field: &str, n: usize, max: usize) -> ApiError {
    ApiError::invalid(
        kind,
        name,
        field,
        &format!("Too many: {n}: must have at most {max} items"),
    )
}

/// The first rule `slice` breaks, as the apiserver's 422.
pub(crate) fn resource_slice(kind: &KindInfo, name: &str, slice: &Value) -> Result<(), ApiError> {
    let spec = slice.get("spec").unwrap_or(&Value::Null);
    let devices = spec
        .get("devices")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let sets = len(spec.get("sharedCounters"));
    let set = |field: &str| spec.get(field).is_some_and(|v| !v.is_null());
    if set("devices") && set("sharedCounters") {
        return Err(ApiError::invalid(
            kind,
            name,
            "spec",
            "Invalid value: \"\": only one of sharedCounters or devices is allowed",
        ));
    }
    let limited = devices
        .iter()
        .any(|d| len(d.get("consumesCounters")) > 0 || len(d.get("taints")) > 0);
    let max = if limited {
        MAX_DEVICES_WITH_COUNTERS_OR_TAINTS
    } else {
        MAX_DEVICES
    };
    if devices.len() > max {
        return Err(too_many(kind, name, "spec.devices", devices.len(), max));
    }
    if sets > MAX_COUNTER_SETS {
        return Err(too_many(
            kind,
            name,
            "spec.sharedCounters",
            sets,
            MAX_COUNTER_SETS,
        ));
    }
    for (i, set) in spec
        .get("sharedCounters")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        let n = len(set.get("counters"));
        if n > MAX_COUNTERS_PER_SET {
            let field = format!("spec.sharedCounters[{i}].counters");
            return Err(too_many(kind, name, &field, n, MAX_COUNTERS_PER_SET));
        }
    }
    for (i, device) in devices.iter().enumerate() {
        let consumptions = device
            .get("consumesCounters")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        if consumptions.len() > MAX_CONSUMPTIONS_PER_DEVICE {
            let field = format!("spec.devices[{i}].consumesCounters");
            let n = consumptions.len();
            return Err(too_many(kind, name, &field, n, MAX_CONSUMPTIONS_PER_DEVICE));
        }
        let mut seen = std::collections::BTreeSet::new();
        for (j, c) in consumptions.iter().enumerate() {
            let set = c.get("counterSet").and_then(Value::as_str).unwrap_or("");
            if !seen.insert(set.to_string()) {
                let field = format!("spec.devices[{i}].consumesCounters[{j}].counterSet");
                return Err(ApiError::invalid(
                    kind,
                    name,
                    &field,
                    &format!("Duplicate value: \"{set}\""),
                ));
            }
            let n = len(c.get("counters"));
            if n > MAX_COUNTERS_PER_SET {
                let field = format!("spec.devices[{i}].consumesCounters[{j}].counters");
                return Err(too_many(kind, name, &field, n, MAX_COUNTERS_PER_SET));
            }
        }
        let n = len(device.get("attributes")) + len(device.get("capacity"));
        if n > MAX_ATTRIBUTES_AND_CAPACITIES {
            let field = format!("spec.devices[{i}]");
            return Err(too_many(
                kind,
                name,
                &field,
                n,
                MAX_ATTRIBUTES_AND_CAPACITIES,
            ));
        }
    }
    Ok(())
}
