//! The apply journal: written before the first mutation, updated after each step, removed when
//! the node matches. A journal found at start means an apply was interrupted; it names the
//! profile `apply --resume` rolls forward to, and what had been done. Applying another profile
//! instead supersedes it (the report says which happened).

use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::atomic_file;
use crate::plan::Step;
use crate::profile::Profile;

const FILE: &str = "apply-journal.json";

/// What an apply in progress set out to do.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Journal {
    pub profile_name: String,
    pub profile: Profile,
    pub steps: Vec<Step>,
    /// How many steps, from the first, were dealt with: carried out, or skipped because their
    /// GPU waits for a reset (those GPUs are in `waiting_for_reset`).
    pub done: usize,
    /// GPUs whose MIG mode change stayed pending: their later steps were skipped, not done.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waiting_for_reset: Vec<u32>,
}

impl Journal {
    /// The steps that were carried out (a pending MIG mode change counts: it was asked for).
    pub fn carried_out(&self) -> impl Iterator<Item = &Step> {
        self.steps[..self.done.min(self.steps.len())]
            .iter()
            .filter(|s| {
                !self.waiting_for_reset.contains(&s.gpu()) || matches!(s, Step::SetMigMode { .. })
            })
    }

    fn path(state_dir: &Path) -> PathBuf {
        state_dir.join(FILE)
    }

    /// The journal left in `state_dir`, if any.
    pub fn load(state_dir: &Path) -> std::io::Result<Option<Journal>> {
        match fs::read(Self::path(state_dir)) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Write atomically (see [`write_json_atomically`]): a crash leaves either the old journal
    /// or the new one, never half of one.
    pub fn save(&self, state_dir: &Path) -> std::io::Result<()> {
        write_json_atomically(state_dir, FILE, self)
    }

    /// Remove the journal once the node matches.
    pub fn remove(state_dir: &Path) -> std::io::Result<()> {
        atomic_file::remove(&Self::path(state_dir))
    }
}

/// Write `value` as JSON to `state_dir/file` atomically and durably ([`atomic_file`]): a
/// crash leaves either the old file or the new one.
pub(crate) fn write_json_atomically(
    state_dir: &Path,
    file: &str,
    value: &impl Serialize,
) -> std::io::Result<()> {
    let bytes = serde_json::to_vec_pretty(value)?;
    atomic_file::replace(&state_dir.join(file), &bytes, atomic_file::READABLE_BY_ALL)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mig::Placement;
    use crate::profile::parse_profile;

    /// GPU 0's MIG mode change stayed pending, so its create was skipped while GPU 1's went
    /// on: only what was carried out is listed, in order.
    #[test]
    fn carried_out_leaves_out_steps_skipped_for_a_reset() {
        let create = |gpu| Step::CreateInstance {
            gpu,
            profile: "7g.80gb".into(),
            placement: Placement { start: 0, size: 8 },
        };
        let journal = Journal {
            profile_name: "p".into(),
            profile: parse_profile("p", "version: v1\nrules: []\n").unwrap(),
            steps: vec![
                Step::SetMigMode {
                    gpu: 0,
                    enable: true,
                },
                create(0),
                create(1),
                create(2),
            ],
            done: 3,
            waiting_for_reset: vec![0],
        };
        let done: Vec<&Step> = journal.carried_out().collect();
        assert_eq!(
            done,
            [
                &Step::SetMigMode {
                    gpu: 0,
                    enable: true
                },
                &create(1)
            ]
        );
    }
}
