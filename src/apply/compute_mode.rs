//! Compute modes for MPS, as NVIDIA's mps-control-daemon sets them
//! (docs/sources.md#mps, #cuda-mps): a whole GPU shared through MPS is put in
//! `EXCLUSIVE_PROCESS` before its control daemon starts, so that only the MPS server opens a
//! context on it and no other process runs beside the server; once the GPU no longer runs MPS it
//! goes back to `DEFAULT`.
//!
//! Unlike NVIDIA's daemon, gpu-share resets only what it set itself: the UUIDs of the GPUs it put
//! in `EXCLUSIVE_PROCESS` are recorded in the state dir ([`RECORD_FILE`]), so a GPU an
//! administrator put in `EXCLUSIVE_PROCESS` or `PROHIBITED` by hand is never set back to
//! `DEFAULT`. A UUID is recorded *before* its mode is set and dropped *after* `DEFAULT` is back,
//! so a crash in between leaves at worst a record of a GPU not in `EXCLUSIVE_PROCESS`, which the
//! next run drops. The mode does not survive a reboot or driver reload; a recorded GPU found in
//! any other mode is dropped from the record the same way.
//!
//! MPS inside MIG devices gets no compute mode: `EXCLUSIVE_PROCESS` "is not supported when the
//! GPU is in MIG mode" (MIG User Guide, mig-nvml.md §5). A GPU still in MIG mode (its disable
//! waits for a reset) is left alone until it is out of it.
//!
//! A mode NVML refuses (NOT_SUPPORTED on a GeForce, NO_PERMISSION without root) does not stop MPS:
//! it is reported and logged as a warning, and tried again by the next apply.

use std::collections::BTreeSet;
use std::path::Path;

use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use super::journal::write_json_atomically;
use crate::gpu::{nvml_error_name, ComputeMode, GpuError, Gpus};
use crate::plan::{NodePlan, ObservedGpu, PlannedMode};

/// In the state dir: the GPUs gpu-share put in `EXCLUSIVE_PROCESS`.
pub const RECORD_FILE: &str = "compute-mode.json";

/// What [`RECORD_FILE`] holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    /// UUIDs of the GPUs gpu-share put in `EXCLUSIVE_PROCESS`, to be set back to `DEFAULT` when
    /// they no longer run MPS.
    #[serde(default)]
    pub exclusive_process: BTreeSet<String>,
}

impl Record {
    /// The record in `state_dir`; empty when there is none.
    pub fn load(state_dir: &Path) -> std::io::Result<Record> {
        match std::fs::read(state_dir.join(RECORD_FILE)) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Record::default()),
            Err(e) => Err(e),
        }
    }

    /// Write atomically (temp file, fsync, rename, fsync of the directory).
    pub fn save(&self, state_dir: &Path) -> std::io::Result<()> {
        write_json_atomically(state_dir, RECORD_FILE, self)
    }
}

/// One compute-mode change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ModeChange {
    /// NVML index.
    pub gpu: u32,
    pub uuid: String,
    /// The mode observed before; absent when NVML could not read it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from: Option<ComputeMode>,
    pub to: ComputeMode,
}

/// A change NVML refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ModeFailure {
    pub gpu: u32,
    pub uuid: String,
    /// The mode asked for.
    pub mode: ComputeMode,
    /// The NVML error, e.g. `NVML_ERROR_NOT_SUPPORTED`.
    pub error: String,
    /// What it means for the node.
    pub message: String,
}

/// What an apply did to compute modes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ComputeModeReport {
    /// Changes made, in order.
    pub changed: Vec<ModeChange>,
    /// Changes NVML refused (warnings: MPS runs regardless).
    pub failed: Vec<ModeFailure>,
}

/// The compute-mode work of one apply.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Decision {
    /// `EXCLUSIVE_PROCESS`, before the MPS daemons are reconciled.
    pub before: Vec<ModeChange>,
    /// `DEFAULT`, after: GPUs gpu-share put in `EXCLUSIVE_PROCESS` that no longer run MPS.
    pub after: Vec<ModeChange>,
    /// The record without stale entries (GPUs gone, or no longer in `EXCLUSIVE_PROCESS`), before
    /// any change is made.
    pub record: Record,
}

/// The whole GPUs a plan shares through MPS (not MPS inside MIG devices).
pub fn whole_mps_gpus(plan: &NodePlan) -> BTreeSet<u32> {
    plan.gpus
        .iter()
        .filter(|g| matches!(g.mode, PlannedMode::Mps { .. }))
        .map(|g| g.index)
        .collect()
}

/// Which GPUs to set to what, from the whole GPUs planned for MPS, the GPUs as observed, and the
/// record of those gpu-share put in `EXCLUSIVE_PROCESS`. Pure: see the module doc for the rules.
pub fn decide(mps: &BTreeSet<u32>, observed: &[ObservedGpu], record: &Record) -> Decision {
    let mut decision = Decision::default();
    for gpu in observed {
        let Some(uuid) = gpu.uuid.clone() else {
            continue; // a simulated GPU: nothing to set, nothing to record
        };
        let recorded = record.exclusive_process.contains(&uuid);
        let exclusive = gpu.compute_mode == Some(ComputeMode::ExclusiveProcess);
        let in_mig = gpu.mig.is_some_and(|m| m.current);
        let change = |to| ModeChange {
            gpu: gpu.index,
            uuid: uuid.clone(),
            from: gpu.compute_mode,
            to,
        };
        let keep = if mps.contains(&gpu.index) {
            // Still in MIG mode (its disable waits for a reset): nothing until it is off. Already
            // in EXCLUSIVE_PROCESS: ours stays ours, and one not recorded is the administrator's.
            if !in_mig && !exclusive {
                decision.before.push(change(ComputeMode::ExclusiveProcess));
            }
            recorded
        } else if recorded && (exclusive || gpu.compute_mode.is_none()) {
            decision.after.push(change(ComputeMode::Default));
            true
        } else {
            // Not recorded, or recorded but DEFAULT/PROHIBITED now (reboot, or someone else).
            false
        };
        if keep {
            decision.record.exclusive_process.insert(uuid);
        }
    }
    decision
}

/// Why the record could not be read or written.
#[derive(Debug, thiserror::Error)]
#[error("cannot {action} the compute-mode record {path}: {cause}")]
pub struct RecordError {
    pub action: &'static str,
    pub path: String,
    /// Said in the message, so not a `source()` too (the chain would repeat it).
    pub cause: std::io::Error,
}

/// Carries out a [`Decision`] in two halves around the MPS reconcile, keeping the record.
pub struct Executor<'a> {
    gpus: &'a Gpus,
    state_dir: &'a Path,
    saved: Record,
    record: Record,
    decision: Decision,
}

impl<'a> Executor<'a> {
    /// Load the record and decide.
    pub fn new(
        gpus: &'a Gpus,
        state_dir: &'a Path,
        plan: &NodePlan,
        observed: &[ObservedGpu],
    ) -> Result<Self, RecordError> {
        let saved =
            Record::load(state_dir).map_err(|source| record_error(state_dir, "read", source))?;
        let decision = decide(&whole_mps_gpus(plan), observed, &saved);
        Ok(Executor {
            gpus,
            state_dir,
            record: decision.record.clone(),
            saved,
            decision,
        })
    }

    /// `EXCLUSIVE_PROCESS` on the MPS GPUs not in it, each recorded before it is set.
    pub fn before_mps(&mut self, report: &mut ComputeModeReport) -> Result<(), RecordError> {
        let changes = std::mem::take(&mut self.decision.before);
        for c in &changes {
            self.record.exclusive_process.insert(c.uuid.clone());
        }
        self.save()?;
        for c in changes {
            if let Err(failure) = self.set(&c, report) {
                self.record.exclusive_process.remove(&c.uuid);
                report.failed.push(failure);
            }
        }
        self.save()
    }

    /// `DEFAULT` on the GPUs gpu-share put in `EXCLUSIVE_PROCESS` that no longer run MPS; each
    /// leaves the record once it is back (a refused one stays, for the next apply).
    pub fn after_mps(&mut self, report: &mut ComputeModeReport) -> Result<(), RecordError> {
        for c in std::mem::take(&mut self.decision.after) {
            match self.set(&c, report) {
                Ok(()) => {
                    self.record.exclusive_process.remove(&c.uuid);
                }
                Err(failure) => report.failed.push(failure),
            }
        }
        self.save()
    }

    fn set(&self, c: &ModeChange, report: &mut ComputeModeReport) -> Result<(), ModeFailure> {
        match self.gpus.set_compute_mode(c.gpu, c.to) {
            Ok(()) => {
                info!(gpu = c.gpu, uuid = %c.uuid, mode = %c.to, "compute mode set");
                report.changed.push(c.clone());
                Ok(())
            }
            Err(e) => {
                let failure = failure(c, &e);
                warn!(
                    gpu = c.gpu,
                    uuid = %c.uuid,
                    mode = %c.to,
                    error = %failure.error,
                    "{}",
                    failure.message
                );
                Err(failure)
            }
        }
    }

    fn save(&mut self) -> Result<(), RecordError> {
        if self.record == self.saved {
            return Ok(());
        }
        self.record
            .save(self.state_dir)
            .map_err(|source| record_error(self.state_dir, "write", source))?;
        self.saved = self.record.clone();
        Ok(())
    }
}

fn record_error(state_dir: &Path, action: &'static str, cause: std::io::Error) -> RecordError {
    RecordError {
        action,
        path: state_dir.join(RECORD_FILE).display().to_string(),
        cause,
    }
}

fn failure(c: &ModeChange, e: &GpuError) -> ModeFailure {
    let (error, detail) = match e {
        GpuError::Wrapper { cause, .. } => (nvml_error_name(cause), cause.to_string()),
        other => (other.to_string(), other.to_string()),
    };
    let consequence = match c.to {
        ComputeMode::ExclusiveProcess => {
            "MPS runs without it, so other processes can still open CUDA contexts on this GPU beside the MPS server"
        }
        _ => "the GPU stays in EXCLUSIVE_PROCESS; the next apply tries again",
    };
    ModeFailure {
        gpu: c.gpu,
        uuid: c.uuid.clone(),
        mode: c.to,
        message: format!(
            "GPU {} ({}): cannot set compute mode {}: {error} ({detail}); {consequence}",
            c.gpu, c.uuid, c.to
        ),
        error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::MigMode;
    use ComputeMode::{Default as Dflt, ExclusiveProcess as Ep, Prohibited};

    fn gpu(index: u32, mode: Option<ComputeMode>) -> ObservedGpu {
        ObservedGpu {
            uuid: Some(format!("GPU-{index}")),
            compute_mode: mode,
            ..ObservedGpu::simulated(index, "h100")
        }
    }

    fn set(items: &[u32]) -> BTreeSet<u32> {
        items.iter().copied().collect()
    }

    fn record(uuids: &[&str]) -> Record {
        Record {
            exclusive_process: uuids.iter().map(|u| u.to_string()).collect(),
        }
    }

    fn changes(list: &[ModeChange]) -> Vec<(u32, Option<ComputeMode>, ComputeMode)> {
        list.iter().map(|c| (c.gpu, c.from, c.to)).collect()
    }

    #[test]
    fn mps_gpus_not_in_exclusive_process_are_set_before_the_daemons() {
        let observed = [
            gpu(0, Some(Dflt)),
            gpu(1, Some(Prohibited)),
            gpu(2, None),
            gpu(3, Some(Dflt)),
        ];
        let d = decide(&set(&[0, 1, 2]), &observed, &Record::default());
        assert_eq!(
            changes(&d.before),
            [
                (0, Some(Dflt), Ep),
                (1, Some(Prohibited), Ep),
                (2, None, Ep)
            ]
        );
        assert!(d.after.is_empty());
        assert_eq!(
            d.record,
            Record::default(),
            "recorded only as each set is made"
        );
    }

    #[test]
    fn a_second_apply_changes_nothing() {
        let observed = [gpu(0, Some(Ep)), gpu(1, Some(Ep))];
        let d = decide(&set(&[0, 1]), &observed, &record(&["GPU-0", "GPU-1"]));
        assert!(d.before.is_empty() && d.after.is_empty());
        assert_eq!(d.record, record(&["GPU-0", "GPU-1"]));
    }

    #[test]
    fn only_recorded_gpus_go_back_to_default() {
        // GPU 0: ours, leaves MPS. GPU 1: the administrator's EXCLUSIVE_PROCESS. GPU 2: the
        // administrator's PROHIBITED. GPU 3: ours and still MPS.
        let observed = [
            gpu(0, Some(Ep)),
            gpu(1, Some(Ep)),
            gpu(2, Some(Prohibited)),
            gpu(3, Some(Ep)),
        ];
        let d = decide(&set(&[3]), &observed, &record(&["GPU-0", "GPU-3"]));
        assert!(d.before.is_empty());
        assert_eq!(changes(&d.after), [(0, Some(Ep), Dflt)]);
        assert_eq!(d.record, record(&["GPU-0", "GPU-3"]));
    }

    #[test]
    fn an_administrators_exclusive_process_on_an_mps_gpu_is_not_taken_over() {
        let d = decide(&set(&[0]), &[gpu(0, Some(Ep))], &Record::default());
        assert!(d.before.is_empty());
        assert_eq!(d.record, Record::default());
        // …so it is still left alone when the GPU leaves MPS.
        let d = decide(&set(&[]), &[gpu(0, Some(Ep))], &d.record);
        assert!(d.after.is_empty());
    }

    #[test]
    fn stale_entries_are_dropped() {
        // GPU 0 came back DEFAULT (reboot), GPU 1 was set PROHIBITED by hand, GPU-9 is gone.
        let observed = [gpu(0, Some(Dflt)), gpu(1, Some(Prohibited))];
        let d = decide(&set(&[]), &observed, &record(&["GPU-0", "GPU-1", "GPU-9"]));
        assert!(d.before.is_empty() && d.after.is_empty());
        assert_eq!(d.record, Record::default());
    }

    #[test]
    fn after_a_reboot_an_mps_gpu_is_set_again() {
        let d = decide(&set(&[0]), &[gpu(0, Some(Dflt))], &record(&["GPU-0"]));
        assert_eq!(changes(&d.before), [(0, Some(Dflt), Ep)]);
        assert_eq!(d.record, record(&["GPU-0"]));
    }

    #[test]
    fn an_unreadable_mode_of_a_recorded_gpu_is_still_restored() {
        let d = decide(&set(&[]), &[gpu(0, None)], &record(&["GPU-0"]));
        assert_eq!(changes(&d.after), [(0, None, Dflt)]);
    }

    #[test]
    fn gpus_in_mig_mode_get_no_compute_mode() {
        let mut mig = gpu(0, Some(Dflt));
        mig.mig = Some(MigMode {
            current: true,
            pending: false,
        });
        let d = decide(&set(&[0]), std::slice::from_ref(&mig), &record(&["GPU-0"]));
        assert!(d.before.is_empty() && d.after.is_empty());
        assert_eq!(d.record, record(&["GPU-0"]), "kept until MIG is off");
        let d = decide(&set(&[]), &[mig], &Record::default());
        assert!(d.before.is_empty() && d.after.is_empty());
    }

    #[test]
    fn mps_inside_mig_devices_is_not_a_whole_mps_gpu() {
        use crate::sharing::PluginKind;
        let node = crate::plan::ObservedNode::simulated(&["h100x6".into()]);
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/profiles/builtin/h100-mixed-sharing.yaml"
        ))
        .unwrap();
        let profile = crate::profile::parse_profile("mixed", &text).unwrap();
        let plan = crate::plan::plan_for("mixed", &profile, &node, PluginKind::Builtin).unwrap();
        assert_eq!(whole_mps_gpus(&plan), set(&[4, 5]));
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/profiles/builtin/h100-mps-in-mig.yaml"
        ))
        .unwrap();
        let profile = crate::profile::parse_profile("mig", &text).unwrap();
        let node = crate::plan::ObservedNode::simulated(&["h100x8".into()]);
        let plan = crate::plan::plan_for("mig", &profile, &node, PluginKind::Builtin).unwrap();
        assert!(whole_mps_gpus(&plan).is_empty());
    }

    #[test]
    fn observed_files_with_and_without_a_compute_mode_parse() {
        let old: crate::plan::ObservedNode =
            serde_yaml::from_str("gpus:\n  - index: 0\n    product: NVIDIA H100 80GB HBM3\n")
                .unwrap();
        assert_eq!(old.gpus[0].compute_mode, None);
        let new: crate::plan::ObservedNode = serde_json::from_str(
            r#"{"gpus": [{"index": 0, "product": "x", "computeMode": "EXCLUSIVE_PROCESS"}]}"#,
        )
        .unwrap();
        assert_eq!(new.gpus[0].compute_mode, Some(Ep));
        let text = serde_json::to_string(&new).unwrap();
        assert!(
            text.contains(r#""computeMode":"EXCLUSIVE_PROCESS""#),
            "{text}"
        );
    }

    #[test]
    fn record_round_trips_and_starts_empty() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(Record::load(dir.path()).unwrap(), Record::default());
        let r = record(&["GPU-a", "GPU-b"]);
        r.save(dir.path()).unwrap();
        assert_eq!(Record::load(dir.path()).unwrap(), r);
        let text = std::fs::read_to_string(dir.path().join(RECORD_FILE)).unwrap();
        assert!(text.contains("exclusiveProcess"), "{text}");
    }
}
