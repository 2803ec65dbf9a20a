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
//! - `spec.devices[i]`: at most 32 attributes and capacities combined;
//! - `spec.devices[i].taints` (`validateDeviceTaint`, validation.go, 1.36): at most 16
//!   (`DeviceTaintsMaxLength`); each `key` a label name (qualified name), `value` empty or a
//!   label value, `effect` required and one of `NoExecute`, `NoSchedule`, `None`. Each message
//!   below is the one the real 1.36.2 server of ../shared/testbed returned for such a taint
//!   (`kubectl create --dry-run=server`).
//! - `spec.devices[i].capacity[<name>].requestPolicy` (consumable capacity, 1.36): the rules of
//!   [`device_capacities`], with `validateRequestPolicy`'s messages.

use serde_json::Value;

use crate::kinds::KindInfo;
use crate::status::ApiError;

pub(crate) const MAX_DEVICES: usize = 128;
pub(crate) const MAX_DEVICES_WITH_COUNTERS_OR_TAINTS: usize = 64;
pub(crate) const MAX_COUNTER_SETS: usize = 8;
pub(crate) const MAX_COUNTERS_PER_SET: usize = 32;
pub(crate) const MAX_CONSUMPTIONS_PER_DEVICE: usize = 2;
pub(crate) const MAX_ATTRIBUTES_AND_CAPACITIES: usize = 32;
pub(crate) const MAX_TAINTS_PER_DEVICE: usize = 16;
const TAINT_EFFECTS: [&str; 3] = ["NoExecute", "NoSchedule", "None"];

/// apimachinery's `IsQualifiedName` name part (and `IsValidLabelValue` when not empty):
/// alphanumerics, `-`, `_`, `.`, starting and ending alphanumeric, at most 63 characters.
fn is_name_part(s: &str) -> bool {
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    s.len() <= 63
        && edge(s.chars().next())
        && edge(s.chars().last())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

/// apimachinery's `IsQualifiedName` (what a label name, a taint key and, prefixed with
/// `requests.`, an extended resource name must be): an optional DNS-subdomain prefix and `/`,
/// then a name part.
pub fn is_qualified_name(s: &str) -> bool {
    let (prefix, name) = s.rsplit_once('/').unwrap_or(("", s));
    let prefix_ok = !s.contains('/')
        || (!prefix.is_empty()
            && prefix.len() <= 253
            && prefix.split('.').all(|l| {
                !l.is_empty()
                    && l.chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            }));
    prefix_ok && is_name_part(name)
}

/// The first rule `taint` (device `i`'s `j`th) breaks.
fn device_taint(
    kind: &KindInfo,
    name: &str,
    i: usize,
    j: usize,
    taint: &Value,
) -> Result<(), ApiError> {
    let field = |f: &str| format!("spec.devices[{i}].taints[{j}].{f}");
    let text = |f: &str| taint.get(f).and_then(Value::as_str).unwrap_or("");
    let key = text("key");
    if !is_qualified_name(key) {
        let why = if key.is_empty() || key.ends_with('/') {
            "name part must be non-empty"
        } else {
            "name part must consist of alphanumeric characters, '-', '_' or '.', and must start \
             and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or \
             '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
        };
        let what = format!("Invalid value: \"{key}\": {why}");
        return Err(ApiError::invalid(kind, name, &field("key"), &what));
    }
    let value = text("value");
    if !value.is_empty() && !is_name_part(value) {
        let what = format!(
            "Invalid value: \"{value}\": a valid label must be an empty string or consist of \
             alphanumeric characters, '-', '_' or '.', and must start and end with an \
             alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used \
             for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
        );
        return Err(ApiError::invalid(kind, name, &field("value"), &what));
    }
    match text("effect") {
        "" => Err(ApiError::invalid(
            kind,
            name,
            &field("effect"),
            "Required value",
        )),
        e if !TAINT_EFFECTS.contains(&e) => {
            let what = format!(
                "Unsupported value: \"{e}\": supported values: \"NoExecute\", \"NoSchedule\", \"None\""
            );
            Err(ApiError::invalid(kind, name, &field("effect"), &what))
        }
        _ => Ok(()),
    }
}

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
        let taints = device
            .get("taints")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        if taints.len() > MAX_TAINTS_PER_DEVICE {
            let field = format!("spec.devices[{i}].taints");
            return Err(too_many(
                kind,
                name,
                &field,
                taints.len(),
                MAX_TAINTS_PER_DEVICE,
            ));
        }
        for (j, taint) in taints.iter().enumerate() {
            device_taint(kind, name, i, j, taint)?;
        }
        device_capacities(kind, name, i, device)?;
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

/// `validateMultiAllocatableDeviceCapacity` / `validateSingleAllocatableDeviceCapacity` and
/// `validateRequestPolicy` (pkg/apis/resource/validation/validation.go, Kubernetes 1.36): a
/// capacity's `requestPolicy` only on a device with `allowMultipleAllocations: true`; one of
/// `validValues` and `validRange`; `default` required with either; a range's `min` required,
/// no larger than the capacity, no larger than `default`, `min` plus one `step` within the
/// capacity and `default` (and `max`) a whole number of steps from `min`; values sorted, none
/// larger than the capacity, `default` among them. The messages are the server's field errors.
fn device_capacities(
    kind: &KindInfo,
    name: &str,
    i: usize,
    device: &Value,
) -> Result<(), ApiError> {
    let multiple = device.get("allowMultipleAllocations") == Some(&Value::Bool(true));
    let Some(capacities) = device.get("capacity").and_then(Value::as_object) else {
        return Ok(());
    };
    for (key, capacity) in capacities {
        let Some(policy) = capacity.get("requestPolicy").filter(|p| !p.is_null()) else {
            continue;
        };
        let path = format!("spec.devices[{i}].capacity[{key}].requestPolicy");
        let invalid = |field: &str, what: String| {
            Err(ApiError::invalid(
                kind,
                name,
                &format!("{path}{field}"),
                &what,
            ))
        };
        if !multiple {
            return invalid(
                "",
                "Forbidden: allowMultipleAllocations must be true".into(),
            );
        }
        let text = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_string);
        let value = text(capacity.get("value")).unwrap_or_default();
        let max = quantity(&value);
        let default = text(policy.get("default"));
        let values: Vec<String> = policy
            .get("validValues")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(|v| text(Some(v))).collect())
            .unwrap_or_default();
        let range = policy.get("validRange").filter(|r| !r.is_null());
        if !values.is_empty() && range.is_some() {
            return invalid(
                "",
                "Forbidden: exactly one policy can be specified, cannot specify \"validValues\" and \"validRange\" at the same time".into(),
            );
        }
        if !values.is_empty() {
            let Some(default) = default else {
                return invalid(
                    ".default",
                    "Required value: required when validValues is defined".into(),
                );
            };
            for k in 1..values.len() {
                if quantity(&values[k - 1]) > quantity(&values[k]) {
                    return invalid(
                        &format!(".validValues[{k}]"),
                        format!(
                            "Invalid value: \"{}\": values must be sorted in ascending order",
                            values[k]
                        ),
                    );
                }
            }
            for (k, option) in values.iter().enumerate() {
                if quantity(option) > max {
                    return invalid(
                        &format!(".validValues[{k}]"),
                        format!("Invalid value: \"{option}\": option is larger than capacity value: {value}"),
                    );
                }
            }
            if !values.iter().any(|v| quantity(v) == quantity(&default)) {
                return invalid(
                    ".validValues",
                    format!("Invalid value: \"{default}\": default value is not valid according to the requestPolicy"),
                );
            }
        } else if let Some(range) = range {
            let Some(default) = default else {
                return invalid(
                    ".default",
                    "Required value: required when validRange is defined".into(),
                );
            };
            let Some(min) = text(range.get("min")) else {
                return invalid(
                    ".validRange.min",
                    "Required value: required when validRange is defined".into(),
                );
            };
            let (d, m) = (quantity(&default), quantity(&min));
            if m > max {
                return invalid(
                    ".validRange.min",
                    format!("Invalid value: \"{min}\": min is larger than capacity value: {value}"),
                );
            }
            if d < m {
                return invalid(
                    ".validRange.min",
                    format!("Invalid value: \"{default}\": default is less than min: {min}"),
                );
            }
            let top = text(range.get("max"));
            if let Some(top) = &top {
                let t = quantity(top);
                if m > t {
                    return invalid(
                        ".validRange.max",
                        format!("Invalid value: \"{min}\": min is larger than max: {top}"),
                    );
                }
                if t > max {
                    return invalid(
                        ".validRange.max",
                        format!(
                            "Invalid value: \"{top}\": max is larger than capacity value: {value}"
                        ),
                    );
                }
                if d > t {
                    return invalid(
                        ".validRange.max",
                        format!("Invalid value: \"{default}\": default is more than max: {top}"),
                    );
                }
            }
            if let Some(step) = text(range.get("step")) {
                let s = quantity(&step);
                if m + s > max {
                    return invalid(
                        ".validRange.step",
                        format!("Invalid value: \"{step}\": one step {} is larger than capacity value: {value}", m + s),
                    );
                }
                for (shown, v) in [
                    (Some(default.clone()), d),
                    (top.clone(), top.as_deref().map_or(0, quantity)),
                ] {
                    let Some(shown) = shown else { continue };
                    if s != 0 && (v - m) % s != 0 {
                        return invalid(
                            ".validRange.step",
                            format!("Invalid value: \"{shown}\": value is not a multiple of a given step ({step}) from ({min})"),
                        );
                    }
                }
            }
        }
    }
    Ok(())
}

/// A quantity's value (`Quantity.Value()`, whole numbers only): digits, then a binary (`Ki` …
/// `Ei`) or decimal (`k` … `E`) suffix. What the double does not read counts as 0.
pub fn quantity(text: &str) -> i128 {
    let end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, suffix) = text.split_at(end);
    let Ok(n) = digits.parse::<i128>() else {
        return 0;
    };
    let scale: i128 = match suffix {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        "Ei" => 1 << 60,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "P" => 1_000_000_000_000_000,
        "E" => 1_000_000_000_000_000_000,
        _ => return 0,
    };
    n.saturating_mul(scale)
}
