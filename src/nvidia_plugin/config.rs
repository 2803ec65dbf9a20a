//! The NVIDIA k8s-device-plugin config file (`api/config/v1`), the fields we render, named and
//! shaped as the plugin reads them (docs/sources.md#device-plugin-config).

use serde::{Deserialize, Serialize};

use crate::profile::MigStrategy;

/// The whole file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PluginConfig {
    /// Always `v1` (the plugin fails on anything else: "unknown version").
    pub version: String,
    pub flags: Flags,
    #[serde(default, skip_serializing_if = "Sharing::is_empty")]
    pub sharing: Sharing,
}

/// `flags:` (the plugin's CommandLineFlags). Note that CLI flags and env vars on the plugin's
/// DaemonSet override these (§1.1), which the agent reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Flags {
    /// `none`, `single` or `mixed`.
    pub mig_strategy: MigStrategy,
    /// Where MPS pipes live; the plugin refuses MPS without it ("using MPS requires
    /// --mps-root to be specified").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mps_root: Option<String>,
}

/// `sharing:`. If both blocks were present MPS would win and time-slicing be silently
/// ignored, so we never render both.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Sharing {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_slicing: Option<ReplicatedResources>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mps: Option<ReplicatedResources>,
}

impl Sharing {
    pub fn is_empty(&self) -> bool {
        self.time_slicing.is_none() && self.mps.is_none()
    }
}

/// `sharing.timeSlicing` / `sharing.mps`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplicatedResources {
    /// Advertise every shared resource as `<name>.shared`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rename_by_default: bool,
    /// Unset means the plugin's default: false for time-slicing, true for MPS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fail_requests_greater_than_one: Option<bool>,
    pub resources: Vec<ReplicatedResource>,
}

/// One `resources[]` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicatedResource {
    /// `nvidia.com/gpu` or `nvidia.com/mig-<profile>`.
    pub name: String,
    /// `all`: the stock plugin forces it anyway (it drops per-resource device lists).
    pub devices: String,
    /// At least 2.
    pub replicas: u64,
}

impl ReplicatedResource {
    pub fn all_devices(name: &str, replicas: u64) -> Self {
        ReplicatedResource {
            name: name.to_string(),
            devices: "all".to_string(),
            replicas,
        }
    }
}

impl PluginConfig {
    /// The file's text: a header naming the profile (no timestamp, so an unchanged profile
    /// renders the same bytes) and the YAML.
    pub fn to_file_text(&self, profile: &str) -> String {
        format!(
            "# NVIDIA device-plugin config written by gpu-share for profile {profile:?}.\n# Edit the profile, not this file: gpu-share rewrites it.\n{}",
            serde_yaml::to_string(self).expect("the config always serialises")
        )
    }
}
