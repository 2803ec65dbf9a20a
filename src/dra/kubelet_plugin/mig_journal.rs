//! The dynamic-MIG journal (`<plugin dir>/dynamic-mig.json`): every GPU instance the plugin
//! makes or destroys for a claim, written (atomically, durably) before the NVML call and again
//! after it. After a crash, [`super::dynamic_mig::recover`] reads it beside the claim checkpoint
//! and NVML, so that no instance is leaked, none a prepared claim holds is lost, and an
//! instance half made (a GPU instance without its compute instance) is completed or removed.
//!
//! The journal also says which instances on a dynamic GPU are claims' ([`ClaimedInstances`]):
//! any other is out of band, and the devices it overlaps are withdrawn from the slices.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};

use crate::atomic_file;
use crate::dra::dynamic::ClaimedInstances;
use crate::mig::Placement;

/// The file's name in the plugin directory.
pub const FILE: &str = "dynamic-mig.json";

/// Every instance made (or being made or destroyed) for a claim.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigJournal {
    pub entries: Vec<Entry>,
}

/// One claim's device on a dynamic GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Entry {
    /// The claim's UID.
    pub claim: String,
    /// `namespace/name`, for messages.
    pub claim_name: String,
    /// The published device, e.g. `gpu-0-mig-4-2g-35gb`.
    pub device: String,
    pub gpu: u32,
    /// The MIG instance; none when the claim holds the whole GPU (MIG off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<Instance>,
    pub state: State,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Instance {
    pub profile: String,
    pub placement: Placement,
    /// NVML's GPU-instance id, once the GPU instance exists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gi_id: Option<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum State {
    /// Written before the create: the instance may exist, in part or not at all.
    Creating,
    /// The GPU instance and its compute instance exist (or the GPU's MIG is off, for a whole
    /// GPU).
    Made,
    /// Written before the destroy: the instance may be gone, in part or entirely.
    Destroying,
}

/// The journal file cannot be read or written.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// Its text is not a journal: starting empty would take the claims' instances for
    /// out-of-band ones, so a person decides.
    #[error(
        "the dynamic-MIG journal {} is unreadable ({source}); the instances it lists cannot be \
         told from out-of-band ones: move it away and destroy them by hand (nvidia-smi mig -dci \
         / -dgi) to start afresh",
        path.display()
    )]
    Unreadable {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write the dynamic-MIG journal {}: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl MigJournal {
    /// The journal in `path`; empty when there is none. An unreadable one is an error naming
    /// it: starting empty would take the claims' instances for out-of-band ones.
    pub fn load(path: &Path) -> Result<MigJournal, JournalError> {
        match std::fs::read(path) {
            Ok(bytes) => {
                serde_json::from_slice(&bytes).map_err(|source| JournalError::Unreadable {
                    path: path.to_path_buf(),
                    source,
                })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(MigJournal::default()),
            Err(source) => Err(JournalError::Read {
                path: path.to_path_buf(),
                source,
            }),
        }
    }

    /// Replace the file atomically and durably.
    pub fn save(&self, path: &Path) -> Result<(), JournalError> {
        let bytes = serde_json::to_vec_pretty(self).expect("plain data serializes");
        atomic_file::replace(path, &bytes, atomic_file::READABLE_BY_ALL).map_err(|source| {
            JournalError::Write {
                path: path.to_path_buf(),
                source,
            }
        })
    }

    /// The instances claims hold or are being made for, by GPU and placement.
    pub fn claimed(&self) -> ClaimedInstances {
        ClaimedInstances(
            self.entries
                .iter()
                .filter_map(|e| e.instance.as_ref().map(|i| (e.gpu, i.placement)))
                .collect(),
        )
    }

    /// The entry of `claim`'s `device`.
    pub fn entry(&self, claim: &str, device: &str) -> Option<&Entry> {
        self.entries
            .iter()
            .find(|e| e.claim == claim && e.device == device)
    }

    /// Replace (or add) the entry of its claim's device.
    pub fn put(&mut self, entry: Entry) {
        self.remove(&entry.claim, &entry.device);
        self.entries.push(entry);
    }

    pub fn remove(&mut self, claim: &str, device: &str) {
        self.entries
            .retain(|e| !(e.claim == claim && e.device == device));
    }
}

/// The journal shared by the kubelet plugin (which writes it) and the reconcile (which reads
/// the claimed instances when it publishes), with the file it is kept in.
#[derive(Debug, Clone)]
pub struct SharedMigJournal {
    path: PathBuf,
    journal: Arc<Mutex<MigJournal>>,
}

impl SharedMigJournal {
    /// An empty journal to be kept in `plugin_dir`; the plugin loads the file at start.
    pub fn new(plugin_dir: &Path) -> SharedMigJournal {
        SharedMigJournal {
            path: plugin_dir.join(FILE),
            journal: Arc::default(),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The journal, for reading or for a change followed by [`SharedMigJournal::save`].
    pub fn lock(&self) -> MutexGuard<'_, MigJournal> {
        // A panic while holding the lock leaves a journal that was saved before each change.
        self.journal.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn claimed(&self) -> ClaimedInstances {
        self.lock().claimed()
    }

    /// Write `journal` (the locked one) to the file.
    pub fn save(&self, journal: &MigJournal) -> Result<(), JournalError> {
        journal.save(&self.path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_journal_round_trips_and_says_which_placements_claims_hold() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE);
        assert_eq!(MigJournal::load(&path).unwrap(), MigJournal::default());
        let mut j = MigJournal::default();
        let placement = Placement { start: 4, size: 2 };
        j.put(Entry {
            claim: "uid-1".into(),
            claim_name: "ns/one".into(),
            device: "gpu-1-mig-4-2g-35gb".into(),
            gpu: 1,
            instance: Some(Instance {
                profile: "2g.35gb".into(),
                placement,
                gi_id: None,
            }),
            state: State::Creating,
        });
        j.put(Entry {
            claim: "uid-2".into(),
            claim_name: "ns/two".into(),
            device: "gpu-2".into(),
            gpu: 2,
            instance: None,
            state: State::Made,
        });
        j.save(&path).unwrap();
        let back = MigJournal::load(&path).unwrap();
        assert_eq!(back, j);
        assert!(back.claimed().contains(1, placement));
        assert_eq!(back.claimed().0.len(), 1, "a whole GPU holds no placement");
        std::fs::write(&path, "{").unwrap();
        let e = MigJournal::load(&path).unwrap_err();
        assert!(matches!(e, JournalError::Unreadable { .. }), "{e:?}");
        assert!(
            e.to_string().contains("dynamic-mig.json is unreadable"),
            "{e}"
        );
    }
}
