//! The vocabulary every sharing mode, the plan and the plugin config share: what one GPU is
//! planned to be ([`GpuPlan`], [`PlannedMode`]), the names its devices are advertised under,
//! and which device plugin advertises them ([`PluginKind`]).
//!
//! This is the lowest of the sharing rooms: `timeslice` and `mps` import it and
//! return their slices in its terms; `device_plugin` renders them and `plan` composes them. It
//! imports none of those.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::mig::{catalog, Geometry};
use crate::profile::{MigStrategy, RuleRef};

/// The resource whole GPUs are advertised under.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";

/// What one GPU needs.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuPlan {
    pub index: u32,
    pub product: String,
    /// The rule that selected this GPU; none means it stays exclusive.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule: Option<RuleRef>,
    pub mode: PlannedMode,
    /// A MIG mode change, when needed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mig_mode: Option<MigModeChange>,
    /// GPU instances to keep, destroy and create.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub geometry: Option<Geometry>,
    pub resources: BTreeMap<String, u64>,
}

impl GpuPlan {
    pub fn changes_no_mig(&self) -> bool {
        self.mig_mode.is_none() && self.geometry.as_ref().is_none_or(Geometry::is_unchanged)
    }
}

/// Turn MIG mode on or off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MigModeChange {
    Enable,
    Disable,
}

/// The mode a GPU ends up in, with the numbers the executors need.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum PlannedMode {
    Exclusive,
    TimeSlicing {
        replicas: u64,
    },
    #[serde(rename_all = "camelCase")]
    Mps {
        replicas: u64,
        #[serde(skip_serializing_if = "Option::is_none")]
        active_thread_percentage: Option<u32>,
        /// Pinned device memory per client, with `auto` worked out from the GPU's memory.
        #[serde(skip_serializing_if = "Option::is_none")]
        pinned_memory_limit_mib: Option<u64>,
        /// Fractional GPU (DRA only): one device whose memory, compute and `replicas` clients
        /// claims consume, each claim's MPS limits set from its share.
        #[serde(skip_serializing_if = "Option::is_none")]
        consumable: Option<ConsumableShares>,
    },
    Mig {
        instances: BTreeMap<String, u32>,
        /// Replicas of each MIG device, time-sliced or MPS clients (1: not shared).
        replicas: u64,
        /// Set when the MIG devices are shared through MPS rather than time-sliced.
        #[serde(skip_serializing_if = "Option::is_none")]
        mps: Option<MigMps>,
    },
    /// Dynamic MIG: the GPU's instances are made and destroyed per ResourceClaim by the DRA
    /// plugin, so a plan neither changes its MIG mode nor its instances (docs/dra.md).
    DynamicMig,
}

/// MPS inside MIG devices: one control daemon per MIG device (MIG User Guide), with these
/// defaults for its clients.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MigMps {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub active_thread_percentage: Option<u32>,
    /// Pinned device memory per client, by MIG profile (`auto`: the profile's memory divided by
    /// the replicas).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub pinned_memory_limit_mib: BTreeMap<String, u64>,
    /// Fractional MIG devices (DRA only), by MIG profile: each MIG device one device whose
    /// memory, compute and clients claims consume.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub consumable: BTreeMap<String, ConsumableShares>,
}

/// An MPS GPU offered as consumable capacity: what claims consume and how the scheduler rounds
/// their asks (`crate::mps::consumable` works it out from the profile and the GPU).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ConsumableShares {
    /// The device's memory, all of which claims share.
    pub memory_mib: u64,
    /// Memory per claim, MiB.
    pub memory: RequestPolicy,
    /// Compute per claim, percent of the SMs (of 100).
    pub compute: RequestPolicy,
}

/// A capacity's request policy: `default` for a claim that asks nothing, asks rounded up to
/// `min` plus a whole number of `step`s (`requestPolicy: {default, validRange: {min, step}}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RequestPolicy {
    pub default: u64,
    pub min: u64,
    pub step: u64,
}

/// The whole compute of a device, as the `compute` capacity counts it: percent of its SMs.
pub const WHOLE_COMPUTE_PERCENT: u64 = 100;

/// Which device plugin advertises the node's GPUs to the kubelet.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, clap::ValueEnum, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum PluginKind {
    /// The stock NVIDIA k8s-device-plugin, configured through the file gpu-share writes.
    #[default]
    Nvidia,
    /// gpu-share's own plugin, run inside the agent.
    Builtin,
    /// Dynamic Resource Allocation: the agent publishes the node's devices as
    /// resource.k8s.io/v1 ResourceSlices and serves the kubelet's DRA plugin (docs/dra.md).
    Dra,
}

impl PluginKind {
    /// The name `--plugin` takes.
    pub fn name(self) -> &'static str {
        match self {
            PluginKind::Nvidia => "nvidia",
            PluginKind::Builtin => "builtin",
            PluginKind::Dra => "dra",
        }
    }
}

/// The resource a MIG device of `profile` is advertised under: `nvidia.com/mig-<profile>`, or
/// `nvidia.com/gpu` under the single strategy, `.shared` when renamed.
pub fn mig_resource(profile: &str, strategy: MigStrategy, rename: bool, replicas: u64) -> String {
    let base = match strategy {
        MigStrategy::Single => GPU_RESOURCE.to_string(),
        _ => catalog::resource_name(profile),
    };
    shared_name(&base, rename, replicas)
}

/// Shared devices get the `.shared` suffix when the profile asks for `renameByDefault`, as the
/// device plugin does.
pub fn shared_name(resource: &str, rename_by_default: bool, replicas: u64) -> String {
    if rename_by_default && replicas > 1 {
        format!("{resource}.shared")
    } else {
        resource.to_string()
    }
}
