//! The CDI spec written for a prepared claim: one file per claim in the CDI spec directory
//! (`--cdi-root`, default `/var/run/cdi`), kind `gpu.gpu-share.dev/claim`, one CDI device per
//! allocated device named `<claim UID>-<device>`. The kubelet hands the CDI device IDs to the
//! container runtime, which applies each device's container edits (CDI specification:
//! github.com/cncf-tags/container-device-interface, SPEC.md; names: vendor and class as
//! `src/builtin_plugin/cdi.rs` checks them, a device name of letters, digits, `_`, `-`, `.`,
//! `:`).
//!
//! The edits are the built-in plugin's `Allocate` answer for the same device (env as `KEY=VALUE`,
//! mounts as bind mounts): `NVIDIA_VISIBLE_DEVICES` for the NVIDIA container runtime, which adds
//! the device nodes and driver libraries, and for MPS the pipe directory and `/dev/shm`.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::builtin_plugin::api::ContainerAllocateResponse;

/// The CDI kind (`vendor/class`) of the claim devices.
pub const KIND: &str = "gpu.gpu-share.dev/claim";
/// The CDI spec version written: env and mounts need 0.3.0; 0.5.0 is what runtimes shipping
/// DRA (containerd 1.7+, CRI-O 1.28+) read.
pub const CDI_VERSION: &str = "0.5.0";
/// Spec files this plugin owns start with this (then the claim UID, then `.json`).
const FILE_PREFIX: &str = "gpu.gpu-share.dev-claim_";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    pub cdi_version: String,
    pub kind: String,
    pub devices: Vec<SpecDevice>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SpecDevice {
    pub name: String,
    pub container_edits: ContainerEdits,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerEdits {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
}

impl ContainerEdits {
    /// Nothing to do: such a device must not be in a spec (the CDI library refuses the whole
    /// spec: "invalid device, empty device edits").
    pub fn is_empty(&self) -> bool {
        self.env.is_empty() && self.mounts.is_empty()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Mount {
    pub host_path: String,
    pub container_path: String,
    pub options: Vec<String>,
}

/// The claim's spec file: `<cdi root>/gpu.gpu-share.dev-claim_<uid>.json`.
pub fn spec_path(cdi_root: &Path, claim_uid: &str) -> PathBuf {
    cdi_root.join(format!("{FILE_PREFIX}{claim_uid}.json"))
}

/// The claim UID a spec file of this plugin was written for; `None` for anyone else's file.
pub fn claim_of_spec_file(file_name: &str) -> Option<&str> {
    file_name.strip_prefix(FILE_PREFIX)?.strip_suffix(".json")
}

/// The CDI device name of `device` in the claim's spec.
pub fn device_name(claim_uid: &str, device: &str) -> String {
    format!("{claim_uid}-{device}")
}

/// The fully qualified CDI device ID the kubelet passes on: `gpu.gpu-share.dev/claim=<name>`.
pub fn device_id(claim_uid: &str, device: &str) -> String {
    format!("{KIND}={}", device_name(claim_uid, device))
}

/// The edits for one device, from the built-in plugin's answer for it (env sorted by name, so
/// a spec written twice is byte-for-byte the same).
pub fn edits(allocation: &ContainerAllocateResponse) -> ContainerEdits {
    let mut env: Vec<String> = allocation
        .envs
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    env.sort();
    let mounts = allocation
        .mounts
        .iter()
        .map(|m| Mount {
            host_path: m.host_path.clone(),
            container_path: m.container_path.clone(),
            options: vec![
                if m.read_only { "ro" } else { "rw" }.into(),
                "nosuid".into(),
                "nodev".into(),
                "bind".into(),
            ],
        })
        .collect();
    ContainerEdits { env, mounts }
}

/// The spec for a claim's devices, `(device name, edits)`.
pub fn spec(claim_uid: &str, devices: Vec<(String, ContainerEdits)>) -> Spec {
    Spec {
        cdi_version: CDI_VERSION.into(),
        kind: KIND.into(),
        devices: devices
            .into_iter()
            .map(|(device, container_edits)| SpecDevice {
                name: device_name(claim_uid, &device),
                container_edits,
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builtin_plugin::api;
    use crate::dra::DRIVER;

    #[test]
    fn the_kind_is_a_valid_cdi_kind_under_the_driver_name() {
        assert_eq!(crate::builtin_plugin::cdi::check_kind(KIND), Ok(()));
        assert!(KIND.starts_with(&format!("{DRIVER}/")));
    }

    #[test]
    fn spec_files_are_recognised_by_name_only_when_ours() {
        let path = spec_path(Path::new("/var/run/cdi"), "1234-abcd");
        assert_eq!(
            path,
            Path::new("/var/run/cdi/gpu.gpu-share.dev-claim_1234-abcd.json")
        );
        let name = path.file_name().unwrap().to_str().unwrap();
        assert_eq!(claim_of_spec_file(name), Some("1234-abcd"));
        assert_eq!(claim_of_spec_file("nvidia.yaml"), None);
        assert_eq!(claim_of_spec_file("gpu.gpu-share.dev-claim_x.yaml"), None);
    }

    #[test]
    fn edits_carry_env_sorted_and_bind_mounts() {
        let mut r = api::ContainerAllocateResponse::default();
        r.envs
            .insert("NVIDIA_VISIBLE_DEVICES".into(), "GPU-a".into());
        r.envs
            .insert("CUDA_MPS_PIPE_DIRECTORY".into(), "/mps/x/pipe".into());
        r.mounts.push(api::Mount {
            container_path: "/mps/x/pipe".into(),
            host_path: "/run/nvidia/mps/x/pipe".into(),
            read_only: false,
        });
        let e = edits(&r);
        assert_eq!(
            e.env,
            [
                "CUDA_MPS_PIPE_DIRECTORY=/mps/x/pipe",
                "NVIDIA_VISIBLE_DEVICES=GPU-a"
            ]
        );
        assert_eq!(e.mounts[0].options, ["rw", "nosuid", "nodev", "bind"]);
        assert_eq!(
            device_id("u-1", "gpu-0"),
            "gpu.gpu-share.dev/claim=u-1-gpu-0"
        );
    }
}
