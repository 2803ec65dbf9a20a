//! The prepared claims, kept in a file beside the DRA socket (`<plugin dir>/checkpoint.json`)
//! so that a restarted plugin answers a repeated `NodePrepareResources` with what it answered
//! before, and knows which CDI specs are its live claims' and which are leftovers.
//!
//! A claim is recorded `preparing` before its CDI spec is written and `prepared` after, each
//! time with an atomic write (temp file, fsync, rename): a plugin that dies between the two
//! finds a `preparing` entry at start and removes its spec, and the kubelet, which got no
//! answer, calls Prepare again.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::api::dra::Device;

/// The file's name in the plugin directory.
pub const FILE: &str = "checkpoint.json";

/// The most bytes a checkpoint may hold. Each prepared claim takes one entry of at most
/// [`super::claim::MAX_ALLOCATION_RESULTS`] devices (well under 16 KiB), and a node publishes
/// at most 64 GPUs × 1,024 time-slicing replicas = 65,536 devices, each allocatable to one
/// claim: 64 MiB holds that many single-device claims. A larger file (corrupt, or not ours) is
/// refused unread rather than loaded into memory.
pub const MAX_CHECKPOINT_BYTES: u64 = 64 * 1024 * 1024;

/// Every claim this plugin has prepared or started preparing, by claim UID.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Checkpoint {
    pub claims: BTreeMap<String, ClaimEntry>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ClaimEntry {
    pub namespace: String,
    pub name: String,
    pub state: ClaimState,
    /// What Prepare answered (empty while `preparing`).
    #[serde(default)]
    pub devices: Vec<PreparedDevice>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ClaimState {
    /// The CDI spec may be partly written; not answered yet.
    Preparing,
    /// The CDI spec is written and the devices below were answered.
    Prepared,
}

/// One device of a Prepare answer, as the API's `Device` message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PreparedDevice {
    pub request_names: Vec<String>,
    pub pool_name: String,
    pub device_name: String,
    pub cdi_device_ids: Vec<String>,
    /// The allocation's `shareID`, for a share of a consumable device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
    /// What that share was given, as its MPS limits: a later Prepare of the same device checks
    /// the sum of the shares against the device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share: Option<crate::dra::consumable::Share>,
}

impl From<&PreparedDevice> for Device {
    fn from(d: &PreparedDevice) -> Device {
        Device {
            request_names: d.request_names.clone(),
            pool_name: d.pool_name.clone(),
            device_name: d.device_name.clone(),
            cdi_device_ids: d.cdi_device_ids.clone(),
            share_id: d.share_id.clone(),
        }
    }
}

/// Why the DRA checkpoint cannot be used, naming the file and what to do; each variant says its
/// cause in its message (a cause is said once).
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error(
        "the DRA checkpoint {} is over {MAX_CHECKPOINT_BYTES} bytes, more than the claims a node \
         can hold; move it away to start afresh (prepared claims' CDI specs are then removed)",
        path.display()
    )]
    TooLarge { path: PathBuf },
    #[error(
        "the DRA checkpoint {} is unreadable ({cause}); move it away to start afresh (prepared \
         claims' CDI specs are then removed)",
        path.display()
    )]
    Corrupt {
        path: PathBuf,
        cause: serde_json::Error,
    },
    #[error("cannot read {}: {cause}", path.display())]
    Read {
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error("cannot write the DRA checkpoint {}: {cause}", path.display())]
    Write {
        path: PathBuf,
        cause: std::io::Error,
    },
}

impl Checkpoint {
    /// The checkpoint in `path`; empty when there is none yet. An unreadable file is an error
    /// naming it: starting empty would forget prepared claims and delete their CDI specs.
    pub fn load(path: &Path) -> Result<Checkpoint, CheckpointError> {
        let path_buf = || path.to_path_buf();
        match read_bounded(path) {
            Ok(bytes) if bytes.len() as u64 > MAX_CHECKPOINT_BYTES => {
                Err(CheckpointError::TooLarge { path: path_buf() })
            }
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|cause| CheckpointError::Corrupt {
                path: path_buf(),
                cause,
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Checkpoint::default()),
            Err(cause) => Err(CheckpointError::Read {
                path: path_buf(),
                cause,
            }),
        }
    }

    /// Replace the file atomically.
    pub fn save(&self, path: &Path) -> Result<(), CheckpointError> {
        let text = serde_json::to_string_pretty(self).expect("plain data serializes");
        crate::atomic_file::replace_if_changed(
            path,
            text.as_bytes(),
            crate::atomic_file::READABLE_BY_ALL,
        )
        .map(|_| ())
        .map_err(|cause| CheckpointError::Write {
            path: path.to_path_buf(),
            cause,
        })
    }

    /// The prepared claim's answer, if it is prepared.
    pub fn prepared(&self, uid: &str) -> Option<&[PreparedDevice]> {
        self.claims
            .get(uid)
            .filter(|c| c.state == ClaimState::Prepared)
            .map(|c| c.devices.as_slice())
    }
}

/// The file's bytes, reading at most one byte past [`MAX_CHECKPOINT_BYTES`] (the file may be
/// growing, or a device: its reported size is not trusted).
fn read_bounded(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(MAX_CHECKPOINT_BYTES + 1)
        .read_to_end(&mut bytes)?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_round_trips_and_a_corrupt_one_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE);
        assert_eq!(Checkpoint::load(&path).unwrap(), Checkpoint::default());
        let mut c = Checkpoint::default();
        c.claims.insert(
            "uid-1".into(),
            ClaimEntry {
                namespace: "ns".into(),
                name: "claim".into(),
                state: ClaimState::Prepared,
                devices: vec![PreparedDevice {
                    request_names: vec!["gpu".into()],
                    pool_name: "node-a".into(),
                    device_name: "gpu-0".into(),
                    cdi_device_ids: vec!["gpu.gpu-share.dev/claim=uid-1-gpu-0".into()],
                    share_id: None,
                    share: None,
                }],
            },
        );
        c.save(&path).unwrap();
        let back = Checkpoint::load(&path).unwrap();
        assert_eq!(back, c);
        assert_eq!(back.prepared("uid-1").unwrap()[0].device_name, "gpu-0");
        assert!(back.prepared("uid-2").is_none());
        std::fs::write(&path, "{not json").unwrap();
        let e = Checkpoint::load(&path).unwrap_err();
        assert!(matches!(e, CheckpointError::Corrupt { .. }), "{e:?}");
        let e = e.to_string();
        assert!(e.contains("checkpoint.json is unreadable"), "{e}");
        // Over the bound: refused by size, with at most the bound (and a byte) read.
        let file = std::fs::File::create(&path).unwrap();
        file.set_len(MAX_CHECKPOINT_BYTES + 4096).unwrap();
        let e = Checkpoint::load(&path).unwrap_err().to_string();
        assert!(e.contains("checkpoint.json is over 67108864 bytes"), "{e}");
        // A device that never ends is read to the bound, not for ever.
        let e = Checkpoint::load(Path::new("/dev/zero"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("is over 67108864 bytes"), "{e}");
        std::fs::write(&path, "{not json").unwrap();
        let e = Checkpoint::load(&path).unwrap_err();
        assert!(matches!(e, CheckpointError::Corrupt { .. }), "{e:?}");
        let e = e.to_string();
        assert!(e.contains("checkpoint.json is unreadable"), "{e}");
    }
}
