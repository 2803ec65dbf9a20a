//! The prepared claims, kept in a file beside the DRA socket (`<plugin dir>/checkpoint.json`)
//! so that a restarted plugin answers a repeated `NodePrepareResources` with what it answered
//! before, and knows which CDI specs are its live claims' and which are leftovers.
//!
//! A claim is recorded `preparing` before its CDI spec is written and `prepared` after, each
//! time with an atomic write (temp file, fsync, rename): a plugin that dies between the two
//! finds a `preparing` entry at start and removes its spec, and the kubelet, which got no
//! answer, calls Prepare again.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::api::dra::Device;

/// The file's name in the plugin directory.
pub const FILE: &str = "checkpoint.json";

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
}

impl From<&PreparedDevice> for Device {
    fn from(d: &PreparedDevice) -> Device {
        Device {
            request_names: d.request_names.clone(),
            pool_name: d.pool_name.clone(),
            device_name: d.device_name.clone(),
            cdi_device_ids: d.cdi_device_ids.clone(),
        }
    }
}

impl Checkpoint {
    /// The checkpoint in `path`; empty when there is none yet. An unreadable file is an error
    /// naming it: starting empty would forget prepared claims and delete their CDI specs.
    pub fn load(path: &Path) -> Result<Checkpoint, String> {
        match std::fs::read(path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
                format!(
                    "the DRA checkpoint {} is unreadable ({e}); move it away to start afresh (prepared claims' CDI specs are then removed)",
                    path.display()
                )
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Checkpoint::default()),
            Err(e) => Err(format!("cannot read {}: {e}", path.display())),
        }
    }

    /// Replace the file atomically.
    pub fn save(&self, path: &Path) -> Result<(), String> {
        let text = serde_json::to_string_pretty(self).expect("plain data serializes");
        crate::device_plugin::write_if_changed(path, &text)
            .map(|_| ())
            .map_err(|e| format!("cannot write the DRA checkpoint {}: {e}", path.display()))
    }

    /// The prepared claim's answer, if it is prepared.
    pub fn prepared(&self, uid: &str) -> Option<&[PreparedDevice]> {
        self.claims
            .get(uid)
            .filter(|c| c.state == ClaimState::Prepared)
            .map(|c| c.devices.as_slice())
    }
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
        assert!(e.contains("checkpoint.json is unreadable"), "{e}");
    }
}
