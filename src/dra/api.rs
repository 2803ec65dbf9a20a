//! The resource.k8s.io/v1 ResourceSlice as serde structs, with the v1 API's field names.
//!
//! k8s-openapi 0.29 has these types only under its `v1_34` feature, and the workspace pins one
//! version feature for every crate (`v1_33`, the oldest API server the agent supports; kube,
//! kube-double and node-sim must agree). Moving the whole workspace to `v1_34` would drop 1.33
//! clusters for every plugin mode, so this module carries the few fields gpu-share publishes.
//! Field names and limits follow the API reference (k8s-openapi 0.29 `v1_34::api::resource::v1`
//! docs of `ResourceSliceSpec`, `Device`, `CounterSet`, `DeviceCounterConsumption`).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

// The limits of resource.k8s.io/v1 as Kubernetes 1.36 documents them on its types (k8s.io/api
// resource/v1 types.go; the same text in the published clients' docs, e.g.
// kubernetes-client/python V1ResourceSliceSpec, V1Device, V1CounterSet). A real 1.36.2 API
// server refused a slice holding both devices and counter sets: "only one of sharedCounters or
// devices is allowed".

/// `ResourceSliceSpec.devices`: "Must not have more than 128 entries."
pub const MAX_DEVICES_PER_SLICE: usize = 128;
/// `ResourceSliceSpec.devices`: "If any device uses taints or consumes counters the limit is
/// 64."
pub const MAX_DEVICES_PER_SLICE_CONSUMING_COUNTERS: usize = 64;
/// `ResourceSliceSpec.sharedCounters`: "The maximum number of counter sets is 8." Only one of
/// `devices` and `sharedCounters` can be set in a slice.
pub const MAX_COUNTER_SETS_PER_SLICE: usize = 8;
/// `CounterSet.counters` (and `DeviceCounterConsumption.counters`): "The maximum number of
/// counters is 32."
pub const MAX_COUNTERS_PER_SET: usize = 32;
/// `Device`: "The maximum number of attributes and capacities combined is 32."
pub const MAX_ATTRIBUTES_AND_CAPACITIES: usize = 32;
/// `Device.taints`: at most 16 (`DeviceTaintsMaxLength`, Kubernetes 1.36).
pub const MAX_TAINTS_PER_DEVICE: usize = 16;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceSlice {
    /// Always `resource.k8s.io/v1` (what a read returns is this module's version too).
    #[serde(skip_deserializing, default = "api_version")]
    pub api_version: &'static str,
    #[serde(skip_deserializing, default = "kind")]
    pub kind: &'static str,
    pub metadata: ObjectMeta,
    pub spec: ResourceSliceSpec,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceSliceSpec {
    pub driver: String,
    pub pool: ResourcePool,
    pub node_name: String,
    /// Left out when empty: the apiserver refuses a slice where both `devices` and
    /// `sharedCounters` are non-nil, and `devices: []` decodes to a non-nil slice (measured on
    /// a real 1.36.2 server: a counter slice with `devices: []` was refused).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<Device>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shared_counters: Vec<CounterSet>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourcePool {
    pub name: String,
    pub generation: i64,
    pub resource_slice_count: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    /// A DNS label, unique in the pool.
    pub name: String,
    #[serde(default)]
    pub attributes: BTreeMap<String, DeviceAttribute>,
    #[serde(default)]
    pub capacity: BTreeMap<String, DeviceCapacity>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub consumes_counters: Vec<DeviceCounterConsumption>,
    /// Claims that do not tolerate a taint are not allocated the device (`DRADeviceTaints`,
    /// beta and on by default in Kubernetes 1.36; a server with the gate off drops the field).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub taints: Vec<DeviceTaint>,
    /// Several claims may be allocated the device at once, each consuming part of its
    /// capacities (`DRAConsumableCapacity`, beta and on by default in Kubernetes 1.36; a server
    /// with the gate off drops the field and every `requestPolicy`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_multiple_allocations: Option<bool>,
}

impl Device {
    /// Whether several claims may share the device by its capacities.
    pub fn is_consumable(&self) -> bool {
        self.allow_multiple_allocations == Some(true)
    }
}

/// `DeviceTaint` of resource.k8s.io/v1: the key a label name, the value a label value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceTaint {
    pub key: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub value: String,
    /// `NoSchedule`, `NoExecute` or `None`.
    pub effect: String,
    /// RFC 3339, to the second; the server sets it when left out, so gpu-share sends it (the
    /// fault's time) to keep what it sends equal to what the server stores.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_added: Option<String>,
}

/// Exactly one of the value fields set, as the API wants (`{int: 3}`, `{string: mig}`). A
/// struct rather than an enum: serde_yaml would write an enum as a YAML tag (`!int 3`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceAttribute {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub int: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub string: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bool: Option<bool>,
}

impl DeviceAttribute {
    pub fn int(value: i64) -> Self {
        DeviceAttribute {
            int: Some(value),
            ..Self::default()
        }
    }

    pub fn string(value: impl Into<String>) -> Self {
        DeviceAttribute {
            string: Some(value.into()),
            ..Self::default()
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceCapacity {
    pub value: Quantity,
    /// How claims of a device with `allowMultipleAllocations` consume this capacity; the
    /// server refuses it on any other device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_policy: Option<CapacityRequestPolicy>,
}

/// `CapacityRequestPolicy`: what a claim that asks nothing consumes (`default`), and the
/// amounts a claim's ask is rounded up to (`validRange`: `min` plus whole `step`s, up to
/// `max`). gpu-share publishes ranges only (the API also has `validValues`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CapacityRequestPolicy {
    pub default: Quantity,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub valid_range: Option<CapacityRequestPolicyRange>,
    /// Sorted ascending, at most 10; `default` among them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub valid_values: Vec<Quantity>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CapacityRequestPolicyRange {
    pub min: Quantity,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<Quantity>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<Quantity>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CounterSet {
    /// A DNS label, unique in the slice.
    pub name: String,
    pub counters: BTreeMap<String, Counter>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Counter {
    pub value: Quantity,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceCounterConsumption {
    pub counter_set: String,
    pub counters: BTreeMap<String, Counter>,
}

/// A plain count as a quantity (`7`).
pub fn count(n: u64) -> Quantity {
    Quantity(n.to_string())
}

/// Mebibytes as a quantity (`81559Mi`).
pub fn mebibytes(mib: u64) -> Quantity {
    Quantity(format!("{mib}Mi"))
}

/// The apiVersion every [`ResourceSlice`] carries.
pub const API_VERSION: &str = "resource.k8s.io/v1";

fn api_version() -> &'static str {
    API_VERSION
}

fn kind() -> &'static str {
    "ResourceSlice"
}

/// What `kube::Api` needs to serve [`ResourceSlice`]s: cluster-scoped, resource.k8s.io/v1.
impl kube::Resource for ResourceSlice {
    type DynamicType = ();
    type Scope = kube::core::ClusterResourceScope;

    fn kind(_: &()) -> std::borrow::Cow<'_, str> {
        "ResourceSlice".into()
    }

    fn group(_: &()) -> std::borrow::Cow<'_, str> {
        "resource.k8s.io".into()
    }

    fn version(_: &()) -> std::borrow::Cow<'_, str> {
        "v1".into()
    }

    fn plural(_: &()) -> std::borrow::Cow<'_, str> {
        "resourceslices".into()
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}
