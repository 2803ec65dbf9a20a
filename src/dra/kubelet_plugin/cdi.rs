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

/// The name a device's entry has in the claim's spec: the device's, or for a share of a
/// consumable device, the device's and its `shareID` (one claim may hold two shares of one
/// device, each with its own limits). Characters CDI does not allow in a name become `-`.
pub fn entry_name(device: &str, share_id: Option<&str>) -> String {
    match share_id {
        None => device.to_string(),
        Some(id) => {
            let id: String = id
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || "_-.:".contains(c) {
                        c
                    } else {
                        '-'
                    }
                })
                .collect();
            format!("{device}-{id}")
        }
    }
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

const VISIBLE: &str = "NVIDIA_VISIBLE_DEVICES";
const PIPE: &str = "CUDA_MPS_PIPE_DIRECTORY";
const PINNED: &str = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT";

/// Devices of one claim that cannot serve one container together.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MergeError {
    #[error(
        "device {share} is a share of a consumable GPU with MPS limits of its own, and this claim \
         holds {others} other device(s): a container given them all would keep only one \
         device's limits; give the share a claim of its own (one request, one device)"
    )]
    ShareBesideOthers { share: String, others: usize },
    #[error(
        "devices {with} (shared through MPS) and {other} (not) cannot serve one container: \
         claim them separately"
    )]
    MpsBesideOthers { with: String, other: String },
    #[error(
        "devices {with} and {other} are shared through different MPS daemons ({pipes}), and a \
         container reaches only one: claim them separately"
    )]
    SeveralMpsDaemons {
        with: String,
        other: String,
        pipes: String,
    },
}

/// One claim's device edits made into edits a container can take together. The runtime merges
/// the edits of every CDI device a container gets, and for an env var the last one wins: with
/// one `NVIDIA_VISIBLE_DEVICES` per device, a container with several devices saw one (as
/// read from the specs on the test bed). So every device of the claim carries the same edits:
/// one `NVIDIA_VISIBLE_DEVICES` list of all of them, the mounts of all, and for MPS the one
/// daemon they share (`CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` re-indexed to the list). Refused, as
/// the built-in plugin refuses such a request: MPS shares beside devices that are not, or
/// shares of different daemons (a CUDA process reaches only the daemon of its
/// `CUDA_MPS_PIPE_DIRECTORY`). Containers combining several claims are not merged here (each
/// claim is prepared alone): give such a container one claim, or use `--device-list-strategy
/// cdi-cri`, whose NVIDIA CDI devices add up.
pub fn merge_claim_edits(
    devices: Vec<(String, ContainerEdits)>,
) -> Result<Vec<(String, ContainerEdits)>, MergeError> {
    if devices.len() < 2 {
        return Ok(devices);
    }
    let var = |e: &ContainerEdits, key: &str| -> Option<String> {
        let prefix = format!("{key}=");
        e.env
            .iter()
            .find_map(|v| v.strip_prefix(&prefix).map(str::to_string))
    };
    let mut visible: Vec<String> = Vec::new();
    for (_, e) in &devices {
        for uuid in var(e, VISIBLE).iter().flat_map(|v| v.split(',')) {
            if !visible.iter().any(|u| u == uuid) {
                visible.push(uuid.to_string());
            }
        }
    }
    let pipes: Vec<(&str, Option<String>)> = devices
        .iter()
        .map(|(d, e)| (d.as_str(), var(e, PIPE)))
        .collect();
    if let Some((with, Some(pipe))) = pipes.iter().find(|(_, p)| p.is_some()) {
        if let Some((other, other_pipe)) = pipes.iter().find(|(_, p)| p.as_ref() != Some(pipe)) {
            return Err(match other_pipe {
                None => MergeError::MpsBesideOthers {
                    with: with.to_string(),
                    other: other.to_string(),
                },
                Some(p) => MergeError::SeveralMpsDaemons {
                    with: with.to_string(),
                    other: other.to_string(),
                    pipes: format!("{pipe}, {p}"),
                },
            });
        }
    }
    let mut env: Vec<String> = Vec::new();
    let mut mounts: Vec<Mount> = Vec::new();
    let mut pinned: Vec<String> = Vec::new();
    for (_, e) in &devices {
        for v in &e.env {
            let key = v.split('=').next().unwrap_or_default();
            if key != VISIBLE
                && key != PINNED
                && !env.iter().any(|x| x.starts_with(&format!("{key}=")))
            {
                env.push(v.clone());
            }
        }
        for m in &e.mounts {
            if !mounts.contains(m) {
                mounts.push(m.clone());
            }
        }
        // `0=10240M` names the device's own position; in the merged list it is its UUID's.
        let own = var(e, VISIBLE);
        let limit = var(e, PINNED).and_then(|l| l.split_once('=').map(|(_, v)| v.to_string()));
        if let (Some(uuid), Some(limit)) = (own, limit) {
            if let Some(i) = visible.iter().position(|u| *u == uuid) {
                pinned.push(format!("{i}={limit}"));
            }
        }
    }
    if !visible.is_empty() {
        env.push(format!("{VISIBLE}={}", visible.join(",")));
    }
    if !pinned.is_empty() {
        env.push(format!("{PINNED}={}", pinned.join(",")));
    }
    env.sort();
    let merged = ContainerEdits { env, mounts };
    Ok(devices
        .into_iter()
        .map(|(d, _)| (d, merged.clone()))
        .collect())
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

    fn env(vars: &[&str]) -> ContainerEdits {
        ContainerEdits {
            env: vars.iter().map(|v| v.to_string()).collect(),
            mounts: Vec::new(),
        }
    }

    #[test]
    fn a_claims_devices_share_one_visible_list_and_mps_daemon() {
        let merged = merge_claim_edits(vec![
            ("gpu-0".into(), env(&["NVIDIA_VISIBLE_DEVICES=GPU-a"])),
            ("gpu-1-mig-0".into(), env(&["NVIDIA_VISIBLE_DEVICES=MIG-b"])),
        ])
        .unwrap();
        assert!(merged
            .iter()
            .all(|(_, e)| e.env == ["NVIDIA_VISIBLE_DEVICES=GPU-a,MIG-b"]));

        let share = |uuid: &str, pipe: &str| {
            env(&[
                &format!("CUDA_MPS_PIPE_DIRECTORY={pipe}"),
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4096M",
                &format!("NVIDIA_VISIBLE_DEVICES={uuid}"),
            ])
        };
        let merged = merge_claim_edits(vec![
            ("a".into(), share("GPU-a", "/mps/a")),
            ("b".into(), share("GPU-b", "/mps/a")),
        ])
        .unwrap();
        assert_eq!(
            merged[1].1.env,
            [
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4096M,1=4096M",
                "CUDA_MPS_PIPE_DIRECTORY=/mps/a",
                "NVIDIA_VISIBLE_DEVICES=GPU-a,GPU-b"
            ]
        );
        let two_daemons = merge_claim_edits(vec![
            ("a".into(), share("GPU-a", "/mps/a")),
            ("b".into(), share("GPU-b", "/mps/b")),
        ]);
        let two_daemons = two_daemons.unwrap_err();
        assert!(matches!(two_daemons, MergeError::SeveralMpsDaemons { .. }));
        assert!(two_daemons.to_string().contains("different MPS daemons"));
        let mixed = merge_claim_edits(vec![
            ("a".into(), share("GPU-a", "/mps/a")),
            ("b".into(), env(&["NVIDIA_VISIBLE_DEVICES=GPU-b"])),
        ]);
        assert!(mixed.unwrap_err().to_string().contains("(not)"));
    }

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
