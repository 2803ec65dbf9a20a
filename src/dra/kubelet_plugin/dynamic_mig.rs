//! Making and destroying dynamic-MIG devices for claims (docs/dra.md, "Dynamic MIG").
//!
//! Prepare of a dynamic MIG device: check the allocated placement against the GPU as NVML
//! shows it and against the journal (the scheduler is trusted but checked: an overlap fails the
//! claim, naming both, and touches nothing), turn MIG on if it is off and the GPU runs nothing,
//! journal the instance, create the GPU instance at exactly that placement and its default
//! compute instance, journal its id; a create that fails half way is rolled back (the GPU
//! instance destroyed), never left behind. Prepare of a dynamic whole GPU turns MIG off (the
//! counters keep every MIG device of that GPU unallocated meanwhile). Unprepare destroys the
//! instance once no process runs on it, and refuses (the kubelet retries) while one does.
//!
//! At start, [`recover`] reconciles journal, claim checkpoint and NVML.

use tracing::{info, warn};

use super::mig_journal::{Entry, Instance, JournalError, MigJournal, SharedMigJournal, State};
use crate::dra::dynamic::DynamicDevice;
use crate::gpu::{GpuError, Gpus, MigModeOutcome, ObservedGpu, SharedGpus};
use crate::mig::{catalog, Placement};

/// Why a dynamic-MIG Prepare, Unprepare or recovery did not do its work. Only
/// [`DynamicMigError::Refused`] promises that nothing was changed; [`DynamicMigError::Busy`]
/// is the one the kubelet's retry mends by itself.
#[derive(Debug, thiserror::Error)]
pub enum DynamicMigError {
    /// The allocation cannot be made as asked (`device` says which, `why` what stands in the
    /// way); nothing was changed.
    #[error("device {device}: {why}; nothing was changed")]
    Refused { device: String, why: String },
    /// Processes still run on the claim's instance: Unprepare is refused until they are gone.
    #[error(
        "device {device} of ResourceClaim {claim}: process(es) {pids} still run on its MIG \
         instance; it is destroyed once they are gone (the kubelet retries)"
    )]
    Busy {
        device: String,
        claim: String,
        pids: String,
    },
    /// Making the GPU instance failed; it was rolled back (`after` says what of that failed).
    #[error(
        "device {device}: creating {profile} at {placement} on GPU {gpu} failed: {source}{after}"
    )]
    CreateFailed {
        device: String,
        profile: String,
        placement: Placement,
        gpu: u32,
        source: Box<GpuError>,
        after: String,
    },
    #[error("cannot destroy GPU instance {gi_id} at {placement} on GPU {gpu}: {source}")]
    DestroyFailed {
        gi_id: u32,
        placement: Placement,
        gpu: u32,
        source: Box<GpuError>,
    },
    #[error("cannot read the GPUs: {0}")]
    Read(Box<GpuError>),
    #[error("GPU {0} is not on this node")]
    NoSuchGpu(u32),
    /// A made entry's device is not on the GPU any more.
    #[error("device {device} on GPU {gpu}: {what} (was it destroyed out of band?)")]
    Gone {
        device: String,
        gpu: u32,
        what: String,
    },
    #[error(transparent)]
    Journal(#[from] JournalError),
}

/// Why MIG mode could not be switched for a claim.
#[derive(Debug, thiserror::Error)]
enum MigSwitchError {
    #[error(
        "MIG must be turned {word} first, but {count} process(es) run on the GPU (pid {pids})"
    )]
    Busy {
        word: &'static str,
        count: usize,
        pids: String,
    },
    #[error("turning MIG {word} failed: {source}")]
    Failed {
        word: &'static str,
        source: GpuError,
    },
    #[error("the driver left turning MIG {word} pending (status {status}): the GPU needs a reset")]
    Pending { word: &'static str, status: String },
}

/// What dynamic MIG needs: NVML, the journal, and the reconcile to tell when a Prepare meets
/// an instance made out of band.
#[derive(Debug, Clone)]
pub struct DynamicMig {
    pub gpus: SharedGpus,
    pub journal: SharedMigJournal,
    pub republish: super::RepublishRequests,
}

/// A claim as messages name it.
pub struct ClaimName<'a> {
    pub uid: &'a str,
    /// `namespace/name`.
    pub shown: &'a str,
}

impl DynamicMig {
    /// Make `device` (published as `name`) for `claim`; the UUID its container is given (the
    /// new MIG device's, or the GPU's). Idempotent: a device made already answers its UUID.
    pub fn prepare(
        &self,
        claim: &ClaimName,
        name: &str,
        device: &DynamicDevice,
    ) -> Result<String, DynamicMigError> {
        let mut journal = self.journal.lock();
        let made = journal
            .entry(claim.uid, name)
            .filter(|e| e.state == State::Made)
            .cloned();
        let gpu = match device {
            DynamicDevice::Mig { gpu, .. } | DynamicDevice::WholeGpu { gpu } => *gpu,
        };
        let observed = self.observe(gpu)?;
        if let Some(entry) = made {
            return uuid_of(&observed, &entry);
        }
        let entry = match device {
            DynamicDevice::Mig {
                profile, placement, ..
            } => self.make_instance(&mut journal, claim, name, &observed, profile, *placement)?,
            DynamicDevice::WholeGpu { .. } => {
                self.make_whole_gpu(&mut journal, claim, name, &observed)?
            }
        };
        uuid_of(&self.observe(gpu)?, &entry)
    }

    fn make_instance(
        &self,
        journal: &mut MigJournal,
        claim: &ClaimName,
        name: &str,
        observed: &ObservedGpu,
        profile: &str,
        placement: Placement,
    ) -> Result<Entry, DynamicMigError> {
        let gpu = observed.index;
        let refuse = |why: String| DynamicMigError::Refused {
            device: format!("{name} ({profile} at {placement} on GPU {gpu})"),
            why,
        };
        let model = catalog()
            .model_by_product(&observed.product)
            .ok_or_else(|| refuse(format!("{:?} is not in the MIG catalog", observed.product)))?;
        let gi_profile = model
            .profile(profile)
            .filter(|p| p.placements.contains(&placement))
            .ok_or_else(|| refuse(format!("{} has no such placement", model.nvml_name)))?;
        if let Some(other) = journal.entries.iter().find(|e| {
            e.gpu == gpu
                && e.claim != claim.uid
                && e.instance
                    .as_ref()
                    .is_none_or(|i| i.placement.mask() & placement.mask() != 0)
        }) {
            return Err(refuse(format!(
                "ResourceClaim {} holds {}{} there",
                other.claim_name,
                other.device,
                other
                    .instance
                    .as_ref()
                    .map(|i| format!(" ({} at {})", i.profile, i.placement))
                    .unwrap_or_default()
            )));
        }
        let mig_on = observed.mig.is_some_and(|m| m.current);
        if mig_on {
            if let Some(i) = observed
                .instances
                .iter()
                .find(|i| i.placement.mask() & placement.mask() != 0)
            {
                self.out_of_band_met(gpu);
                return Err(refuse(format!(
                    "it overlaps GPU instance {} ({} at {}), which the scheduler did not know of",
                    i.gi_id.map_or_else(|| "?".into(), |id| id.to_string()),
                    i.profile,
                    i.placement
                )));
            }
        } else {
            self.set_mig_mode(observed, true)
                .map_err(|e| refuse(e.to_string()))?;
        }
        let mut entry = Entry {
            claim: claim.uid.to_string(),
            claim_name: claim.shown.to_string(),
            device: name.to_string(),
            gpu,
            instance: Some(Instance {
                profile: profile.to_string(),
                placement,
                gi_id: None,
            }),
            state: State::Creating,
        };
        journal.put(entry.clone());
        self.journal.save(journal)?;
        let created = self
            .gpus
            .with(|g| g.create_instance(gpu, gi_profile, placement));
        let gi_id = match created {
            Ok(id) => id,
            Err(e) => {
                // A GPU instance made without its compute instance is destroyed: half an
                // instance is never left on the GPU (NVIDIA's DRA driver leaves it, #1452).
                let rollback = self.destroy_at(gpu, placement, None);
                journal.remove(claim.uid, name);
                let saved = self.journal.save(journal);
                let after = format!(
                    "{}{}",
                    rollback
                        .err()
                        .map(|r| format!("; rolling back failed too: {r}"))
                        .unwrap_or_default(),
                    saved.err().map(|s| format!("; {s}")).unwrap_or_default()
                );
                return Err(DynamicMigError::CreateFailed {
                    device: name.to_string(),
                    profile: profile.to_string(),
                    placement,
                    gpu,
                    source: Box::new(e),
                    after,
                });
            }
        };
        entry.instance.as_mut().expect("set above").gi_id = Some(gi_id);
        entry.state = State::Made;
        journal.put(entry.clone());
        self.journal.save(journal)?;
        info!(claim = claim.shown, device = name, gpu, gi_id, %placement, profile,
              "made the claim's MIG instance");
        Ok(entry)
    }

    fn make_whole_gpu(
        &self,
        journal: &mut MigJournal,
        claim: &ClaimName,
        name: &str,
        observed: &ObservedGpu,
    ) -> Result<Entry, DynamicMigError> {
        let gpu = observed.index;
        let refuse = |why: String| DynamicMigError::Refused {
            device: format!("{name} (GPU {gpu}, whole)"),
            why,
        };
        if let Some(other) = journal
            .entries
            .iter()
            .find(|e| e.gpu == gpu && e.claim != claim.uid)
        {
            return Err(refuse(format!(
                "ResourceClaim {} holds {} on it",
                other.claim_name, other.device
            )));
        }
        if observed.mig.is_some_and(|m| m.current) {
            if let Some(i) = observed.instances.first() {
                self.out_of_band_met(gpu);
                return Err(refuse(format!(
                    "GPU instance {} ({} at {}) is on it",
                    i.gi_id.map_or_else(|| "?".into(), |id| id.to_string()),
                    i.profile,
                    i.placement
                )));
            }
            self.set_mig_mode(observed, false)
                .map_err(|e| refuse(e.to_string()))?;
        }
        let entry = Entry {
            claim: claim.uid.to_string(),
            claim_name: claim.shown.to_string(),
            device: name.to_string(),
            gpu,
            instance: None,
            state: State::Made,
        };
        journal.put(entry.clone());
        self.journal.save(journal)?;
        info!(
            claim = claim.shown,
            device = name,
            gpu,
            "gave the claim the whole GPU, MIG off"
        );
        Ok(entry)
    }

    /// An instance no claim made is on dynamic GPU `gpu`: have the reconcile withdraw what it
    /// overlaps now (Event `OutOfBandMig`), not at its next resync.
    fn out_of_band_met(&self, gpu: u32) {
        warn!(gpu, "a MIG instance no claim made is on a dynamic GPU; republishing without what it overlaps");
        self.republish.request();
    }

    /// Turn MIG on or off, only while the GPU runs nothing; a change the driver leaves pending
    /// (a reset needed) is an error.
    fn set_mig_mode(&self, observed: &ObservedGpu, enable: bool) -> Result<(), MigSwitchError> {
        let word = if enable { "on" } else { "off" };
        if !observed.processes.is_empty() {
            return Err(MigSwitchError::Busy {
                word,
                count: observed.processes.len(),
                pids: observed
                    .processes
                    .iter()
                    .map(|p| p.pid.to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
        match self
            .gpus
            .with(|g| g.set_mig_mode(observed.index, enable))
            .map_err(|source| MigSwitchError::Failed { word, source })?
        {
            MigModeOutcome::Applied => {
                info!(gpu = observed.index, "MIG turned {word} for a claim");
                Ok(())
            }
            MigModeOutcome::Pending { activation_status } => Err(MigSwitchError::Pending {
                word,
                status: activation_status.to_string(),
            }),
        }
    }

    /// Destroy the instances made for `claim`; refused while a process runs on one (the kubelet
    /// retries Unprepare). A claim with none succeeds.
    pub fn unprepare(&self, claim: &ClaimName) -> Result<(), DynamicMigError> {
        let mut journal = self.journal.lock();
        let entries: Vec<Entry> = journal
            .entries
            .iter()
            .filter(|e| e.claim == claim.uid)
            .cloned()
            .collect();
        for mut entry in entries {
            if let Some(instance) = &entry.instance {
                let observed = self.observe(entry.gpu)?;
                let gi_id = instance
                    .gi_id
                    .or_else(|| gi_at(&observed, instance.placement));
                let busy: Vec<String> = observed
                    .processes
                    .iter()
                    .filter(|p| gi_id.is_some() && p.gi_id == gi_id)
                    .map(|p| p.pid.to_string())
                    .collect();
                if !busy.is_empty() {
                    return Err(DynamicMigError::Busy {
                        device: entry.device.clone(),
                        claim: claim.shown.to_string(),
                        pids: busy.join(", "),
                    });
                }
                entry.state = State::Destroying;
                journal.put(entry.clone());
                self.journal.save(&journal)?;
                self.destroy_at(entry.gpu, instance.placement, instance.gi_id)?;
                info!(claim = claim.shown, device = %entry.device, gpu = entry.gpu,
                      placement = %instance.placement, "destroyed the claim's MIG instance");
            }
            journal.remove(&entry.claim, &entry.device);
            self.journal.save(&journal)?;
        }
        Ok(())
    }

    /// Destroy the GPU instance at `placement` (compute instances first), if there is one and
    /// it is the one journaled (`expected`, when its id is known): an instance made there since
    /// by someone else is not the claim's to destroy.
    fn destroy_at(
        &self,
        gpu: u32,
        placement: Placement,
        expected: Option<u32>,
    ) -> Result<(), DynamicMigError> {
        let observed = self.observe(gpu)?;
        let Some(gi_id) = gi_at(&observed, placement) else {
            return Ok(());
        };
        if expected.is_some_and(|id| id != gi_id) {
            warn!(gpu, %placement, gi_id, "the GPU instance there is not the one made for the claim; left alone");
            return Ok(());
        }
        match self.gpus.with(|g: &Gpus| g.destroy_instance(gpu, gi_id)) {
            Ok(()) | Err(GpuError::NoSuchInstance { .. }) => Ok(()),
            Err(source) => Err(DynamicMigError::DestroyFailed {
                gi_id,
                placement,
                gpu,
                source: Box::new(source),
            }),
        }
    }

    fn observe(&self, gpu: u32) -> Result<ObservedGpu, DynamicMigError> {
        let node = self
            .gpus
            .with(|g| g.observe())
            .map_err(|e| DynamicMigError::Read(Box::new(e)))?;
        node.gpus
            .into_iter()
            .find(|g| g.index == gpu)
            .ok_or(DynamicMigError::NoSuchGpu(gpu))
    }
}

/// The GPU instance at `placement`, if MIG is on and one is there.
fn gi_at(observed: &ObservedGpu, placement: Placement) -> Option<u32> {
    if !observed.mig.is_some_and(|m| m.current) {
        return None;
    }
    observed
        .instances
        .iter()
        .find(|i| i.placement == placement)
        .and_then(|i| i.gi_id)
}

/// The UUID a made entry gives its container.
fn uuid_of(observed: &ObservedGpu, entry: &Entry) -> Result<String, DynamicMigError> {
    let missing = |what: &str| DynamicMigError::Gone {
        device: entry.device.clone(),
        gpu: observed.index,
        what: what.to_string(),
    };
    match &entry.instance {
        None => observed
            .uuid
            .clone()
            .ok_or_else(|| missing("NVML gives the GPU no UUID")),
        Some(instance) => {
            let gi_id = instance
                .gi_id
                .ok_or_else(|| missing("its GPU instance was never made"))?;
            observed
                .mig_devices()
                .iter()
                .find(|d| d.gi_id == gi_id)
                .and_then(|d| d.uuid)
                .map(str::to_string)
                .ok_or_else(|| missing(&format!("GPU instance {gi_id} has no MIG device")))
        }
    }
}

/// After a crash (or any start): make journal, checkpoint and NVML agree. For each entry:
/// a claim still prepared keeps its instance (a GPU instance left without its compute instance
/// gets it); any other entry's instance (a claim whose prepare was interrupted, or whose
/// unprepare was) is destroyed and the entry dropped. `prepared` says whether a claim UID is
/// prepared in the checkpoint. What cannot be done now (a process still on the instance) is
/// logged and kept, to be done by the claim's next Unprepare or the next start.
pub fn recover(mig: &DynamicMig, prepared: impl Fn(&str) -> bool) -> Result<(), DynamicMigError> {
    let loaded = MigJournal::load(mig.journal.path())?;
    let mut journal = mig.journal.lock();
    *journal = loaded;
    let entries = journal.entries.clone();
    for entry in entries {
        let keep = prepared(&entry.claim) && entry.state == State::Made;
        let Some(instance) = &entry.instance else {
            if !keep {
                journal.remove(&entry.claim, &entry.device);
            }
            continue;
        };
        let observed = mig.observe(entry.gpu)?;
        if keep {
            complete(mig, &observed, &entry, instance);
            continue;
        }
        match mig.destroy_at(entry.gpu, instance.placement, instance.gi_id) {
            Ok(()) => {
                info!(claim = %entry.claim, device = %entry.device, gpu = entry.gpu,
                      placement = %instance.placement,
                      "no prepared claim holds this dynamic MIG instance: destroyed");
                journal.remove(&entry.claim, &entry.device);
            }
            Err(e) => warn!(claim = %entry.claim, device = %entry.device, error = %e,
                            "cannot destroy a dynamic MIG instance no claim holds; kept for now"),
        }
    }
    Ok(mig.journal.save(&journal)?)
}

/// A prepared claim's instance whose GPU instance lost (or never got) its compute instance
/// gets its default one again.
fn complete(mig: &DynamicMig, observed: &ObservedGpu, entry: &Entry, instance: &Instance) {
    let Some(gi_id) = gi_at(observed, instance.placement) else {
        warn!(claim = %entry.claim, device = %entry.device, gpu = entry.gpu,
              "a prepared claim's dynamic MIG instance is gone from the GPU");
        return;
    };
    if observed.compute_instances.iter().any(|c| c.gi_id == gi_id) {
        return;
    }
    let profile = catalog()
        .model_by_product(&observed.product)
        .and_then(|m| m.profile(&instance.profile));
    let done = match profile {
        Some(p) => mig
            .gpus
            .with(|g| g.complete_instance(entry.gpu, gi_id, p))
            .map_err(|e| e.to_string()),
        None => Err(format!("{} is not in the catalog", instance.profile)),
    };
    match done {
        Ok(()) => info!(claim = %entry.claim, device = %entry.device, gi_id,
                        "gave a prepared claim's GPU instance its compute instance back"),
        Err(e) => warn!(claim = %entry.claim, device = %entry.device, gi_id, error = %e,
                        "cannot complete a prepared claim's GPU instance"),
    }
}
