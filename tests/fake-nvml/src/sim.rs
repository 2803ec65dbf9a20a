//! The MIG rules, on plain Rust data: every mutation is first *planned* (all checks, no effect)
//! and then *applied*, so the C layer can abort between the two (`FAKE_NVML_ABORT_AT_MUTATION`)
//! and log exactly what happened. Tests may call the same functions to build states.

use gpu_share::mig::catalog::{catalog, ComputeInstanceProfile, GpuInstanceProfile, GpuModel};

use crate::codes::*;
use crate::model::{default_placement_order, gi_id_for, is_ampere, uuid_from};
use crate::state::{ComputeInstance, ComputeMode, Gpu, GpuInstance, MigActivation, MigMode, Place};

/// `NVML_GPU_INSTANCE_PROFILE_COUNT` of nvml.h 13.3 (18); nvml-wrapper-sys 0.10 says 17.
pub const GI_PROFILE_COUNT: u32 = 18;
/// `NVML_COMPUTE_INSTANCE_PROFILE_COUNT` of nvml.h 13.3 (9); nvml-wrapper-sys 0.10 says 8.
pub const CI_PROFILE_COUNT: u32 = 9;
/// CI ids are 0..7 within a GPU instance (`/proc/driver/nvidia-caps/mig-minors`).
const MAX_CI_ID: u32 = 8;

/// One planned mutation of a GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    SetMig(MigMode),
    AddGi(GpuInstance),
    RemoveGi(u32),
    AddCi(u32, ComputeInstance),
    RemoveCi(u32, u32),
    SetComputeMode(ComputeMode),
}

/// A GI's profile together with its model, as most lookups need both.
pub type GiProfile = (&'static GpuModel, &'static GpuInstanceProfile);

impl Gpu {
    /// The catalog model of a MIG-capable GPU; NOT_SUPPORTED otherwise (what mig-parted reads
    /// as "not MIG capable").
    pub fn mig_model(&self) -> Result<&'static GpuModel, Ret> {
        match (self.mig, self.catalog_model()) {
            (Some(_), Some(m)) => Ok(m),
            _ => Err(NOT_SUPPORTED),
        }
    }

    /// As [`Gpu::mig_model`], but MIG must also be enabled (GI/CI calls need it).
    pub fn mig_enabled_model(&self) -> Result<&'static GpuModel, Ret> {
        let m = self.mig_model()?;
        if self.mig.is_some_and(|mode| mode.current) {
            Ok(m)
        } else {
            Err(NOT_SUPPORTED)
        }
    }

    /// Profile by `NVML_GPU_INSTANCE_PROFILE_*` index: INVALID_ARGUMENT beyond the header's
    /// range, NOT_SUPPORTED for an index this GPU lacks (mig-nvml.md 1.1).
    pub fn gi_profile_by_index(&self, index: u32) -> Result<GiProfile, Ret> {
        let m = self.mig_model()?;
        if index >= GI_PROFILE_COUNT {
            return Err(INVALID_ARGUMENT);
        }
        let p = m.gpu_instance_profiles.iter();
        let mut p = p.filter(|p| p.nvml_profile_index == index);
        p.next().map(|p| (m, p)).ok_or(NOT_SUPPORTED)
    }

    /// Profile by profile *id* (`info.id`); an id the GPU lacks is an invalid argument.
    pub fn gi_profile_by_id(&self, id: u32) -> Result<GiProfile, Ret> {
        let m = self.mig_model()?;
        m.profile_by_id(id).map(|p| (m, p)).ok_or(INVALID_ARGUMENT)
    }

    fn gi_profiles_in_use(&self) -> impl Iterator<Item = &'static GpuInstanceProfile> + '_ {
        let m = self.catalog_model();
        let by_id = move |gi: &GpuInstance| m.and_then(|m| m.profile_by_id(gi.profile_id));
        self.gpu_instances.iter().filter_map(by_id)
    }

    fn occupied_slots(&self) -> u32 {
        self.gpu_instances
            .iter()
            .fold(0, |m, g| m | g.placement.mask())
    }

    /// nvml.h: an ALL_ME (`+me.all`) instance "prevents allocation of all but _NO_ME profiles";
    /// conversely it cannot take every media engine while another instance holds one.
    fn media_engine_conflict(&self, p: &GpuInstanceProfile) -> bool {
        let mut used = self.gi_profiles_in_use();
        if p.takes_all_media_engines() {
            used.any(|u| !u.has_no_media_engines())
        } else if !p.has_no_media_engines() {
            used.any(|u| u.takes_all_media_engines())
        } else {
            false
        }
    }

    fn gi_count(&self, profile_id: u32) -> u32 {
        let n = self
            .gpu_instances
            .iter()
            .filter(|g| g.profile_id == profile_id);
        n.count() as u32
    }

    /// `nvmlDeviceGetGpuInstanceRemainingCapacity`: free placements, capped by what is left of
    /// `instanceCount`.
    pub fn gi_remaining_capacity(&self, profile_id: u32) -> Result<u32, Ret> {
        self.mig_enabled_model()?;
        let (_, p) = self.gi_profile_by_id(profile_id)?;
        if self.media_engine_conflict(p) {
            return Ok(0);
        }
        let occupied = self.occupied_slots();
        let free = p.placements.iter().filter(|pl| pl.mask() & occupied == 0);
        let left = p.instance_count.saturating_sub(self.gi_count(profile_id));
        Ok((free.count() as u32).min(left))
    }

    /// `nvmlDeviceSetComputeMode` with a raw `nvmlComputeMode_t`: a value beyond the enum →
    /// INVALID_ARGUMENT (nvml.h); EXCLUSIVE_THREAD ("support removed" in nvml.h) → NOT_SUPPORTED
    /// (inferred); EXCLUSIVE_PROCESS while MIG mode is on → NOT_SUPPORTED (MIG User Guide:
    /// "not supported when the GPU is in MIG mode", mig-nvml.md §5; the return code is inferred).
    pub fn plan_set_compute_mode(&self, value: u32) -> Result<Change, Ret> {
        let mode = ComputeMode::from_value(value).ok_or(INVALID_ARGUMENT)?;
        let in_mig = self.mig.is_some_and(|m| m.current);
        match mode {
            ComputeMode::ExclusiveThread => Err(NOT_SUPPORTED),
            ComputeMode::ExclusiveProcess if in_mig => Err(NOT_SUPPORTED),
            _ => Ok(Change::SetComputeMode(mode)),
        }
    }

    /// `nvmlDeviceSetMigMode`: the call succeeds and returns the activation status. Pending takes
    /// the new mode; it becomes current at once unless processes or GPU instances are present
    /// (IN_USE) or the GPU needs a reset (Ampere: RESET_REQUIRED), mig-nvml.md 1.6.
    pub fn plan_set_mig_mode(&self, enable: bool) -> Result<(Change, Ret), Ret> {
        let model = self.mig_model()?;
        let mode = self.mig.ok_or(NOT_SUPPORTED)?;
        let mut next = MigMode {
            current: mode.current,
            pending: enable,
        };
        let default_activation = match is_ampere(model) {
            true => MigActivation::ResetRequired,
            false => MigActivation::Immediate,
        };
        let status = if enable == mode.current {
            SUCCESS
        } else if !self.processes.is_empty() || !self.gpu_instances.is_empty() {
            IN_USE
        } else if self.mig_activation.unwrap_or(default_activation) == MigActivation::ResetRequired
        {
            RESET_REQUIRED
        } else {
            next.current = enable;
            SUCCESS
        };
        Ok((Change::SetMig(next), status))
    }

    /// `nvmlDeviceCreateGpuInstance[WithPlacement]`.
    pub fn plan_create_gpu_instance(
        &self,
        profile_id: u32,
        placement: Option<Place>,
    ) -> Result<Change, Ret> {
        self.mig_enabled_model()?;
        let (model, p) = self.gi_profile_by_id(profile_id)?;
        let occupied = self.occupied_slots();
        let placement = match placement {
            Some(pl) if !p.placements.contains(&pl.into()) => return Err(INVALID_ARGUMENT),
            Some(pl) => pl.into(),
            None => default_placement_order(model, p)
                .into_iter()
                .find(|pl| pl.mask() & occupied == 0)
                .ok_or(INSUFFICIENT_RESOURCES)?,
        };
        if placement.mask() & occupied != 0
            || self.gi_count(profile_id) >= p.instance_count
            || self.media_engine_conflict(p)
        {
            return Err(INSUFFICIENT_RESOURCES);
        }
        Ok(Change::AddGi(GpuInstance {
            id: gi_id_for(model, placement),
            profile_id,
            placement: placement.into(),
            compute_instances: Vec::new(),
        }))
    }

    /// `nvmlGpuInstanceDestroy`: IN_USE while compute instances or processes remain.
    pub fn plan_destroy_gpu_instance(&self, gi: u32) -> Result<Change, Ret> {
        let g = self.gpu_instance(gi).ok_or(INVALID_ARGUMENT)?;
        if !g.compute_instances.is_empty() || self.processes.iter().any(|p| p.in_gi(gi)) {
            return Err(IN_USE);
        }
        Ok(Change::RemoveGi(gi))
    }

    /// The GI's profile and the CI profiles available inside it.
    pub fn ci_profiles(
        &self,
        gi: u32,
    ) -> Result<(GiProfile, &'static [ComputeInstanceProfile]), Ret> {
        let g = self.gpu_instance(gi).ok_or(INVALID_ARGUMENT)?;
        let (m, p) = self.gi_profile_by_id(g.profile_id)?;
        Ok(((m, p), catalog().ci_profiles(p)))
    }

    /// CI profile by id (== its `NVML_COMPUTE_INSTANCE_PROFILE_*` index, mig-nvml.md 1.1).
    pub fn ci_profile(&self, gi: u32, id: u32) -> Result<&'static ComputeInstanceProfile, Ret> {
        let (_, cis) = self.ci_profiles(gi)?;
        if id >= CI_PROFILE_COUNT {
            return Err(INVALID_ARGUMENT);
        }
        cis.iter().find(|c| c.profile_id == id).ok_or(NOT_SUPPORTED)
    }

    fn ci_occupancy(&self, gi: u32, profile_id: u32) -> (u32, u32) {
        let cis = self
            .gpu_instance(gi)
            .map_or(&[][..], |g| &g.compute_instances);
        let mask = cis.iter().fold(0, |m, c| m | c.placement.mask());
        let same = cis.iter().filter(|c| c.profile_id == profile_id).count();
        (mask, same as u32)
    }

    /// `nvmlGpuInstanceGetComputeInstanceRemainingCapacity`.
    pub fn ci_remaining_capacity(&self, gi: u32, profile_id: u32) -> Result<u32, Ret> {
        let c = self.ci_profile(gi, profile_id)?;
        let (mask, same) = self.ci_occupancy(gi, profile_id);
        let free = c.placements.iter().filter(|p| p.mask() & mask == 0);
        Ok((free.count() as u32).min(c.instance_count.saturating_sub(same)))
    }

    /// `nvmlGpuInstanceCreateComputeInstance[WithPlacement]`: first free placement in catalog
    /// order, lowest free CI id (the first CI is always 0, mig-nvml.md 1.4).
    pub fn plan_create_compute_instance(
        &self,
        gi: u32,
        profile_id: u32,
        placement: Option<Place>,
    ) -> Result<Change, Ret> {
        let c = self.ci_profile(gi, profile_id)?;
        let (mask, same) = self.ci_occupancy(gi, profile_id);
        let placement = match placement {
            Some(pl) if !c.placements.contains(&pl.into()) => return Err(INVALID_ARGUMENT),
            Some(pl) => pl.into(),
            None => *c
                .placements
                .iter()
                .find(|p| p.mask() & mask == 0)
                .ok_or(INSUFFICIENT_RESOURCES)?,
        };
        if placement.mask() & mask != 0 || same >= c.instance_count {
            return Err(INSUFFICIENT_RESOURCES);
        }
        let taken = |id: &u32| self.compute_instance(gi, *id).is_some();
        let id = (0..MAX_CI_ID)
            .find(|id| !taken(id))
            .ok_or(INSUFFICIENT_RESOURCES)?;
        let seed = format!("{} gi{gi} ci{id} #{}", self.uuid, self.mig_uuids_issued);
        Ok(Change::AddCi(
            gi,
            ComputeInstance {
                id,
                profile_id,
                placement: placement.into(),
                uuid: uuid_from("MIG-", &seed),
            },
        ))
    }

    /// `nvmlComputeInstanceDestroy`: IN_USE while processes run on it.
    pub fn plan_destroy_compute_instance(&self, gi: u32, ci: u32) -> Result<Change, Ret> {
        self.compute_instance(gi, ci).ok_or(INVALID_ARGUMENT)?;
        if self.processes.iter().any(|p| p.in_ci(gi, ci)) {
            return Err(IN_USE);
        }
        Ok(Change::RemoveCi(gi, ci))
    }

    /// Carry out a planned change (unchecked: plan first).
    pub fn apply(&mut self, change: Change) {
        match change {
            Change::SetMig(mode) => self.mig = Some(mode),
            Change::AddGi(g) => self.gpu_instances.push(g),
            Change::RemoveGi(id) => self.gpu_instances.retain(|g| g.id != id),
            Change::AddCi(gi, c) => {
                self.mig_uuids_issued += 1;
                let g = self.gpu_instances.iter_mut().find(|g| g.id == gi);
                g.expect("planned").compute_instances.push(c);
            }
            Change::RemoveCi(gi, ci) => {
                for g in self.gpu_instances.iter_mut().filter(|g| g.id == gi) {
                    g.compute_instances.retain(|c| c.id != ci);
                }
            }
            Change::SetComputeMode(m) => self.compute_mode = m,
        }
    }

    /// Create a GPU instance; returns its id.
    pub fn create_gpu_instance(&mut self, profile_id: u32, at: Option<Place>) -> Result<u32, Ret> {
        let change = self.plan_create_gpu_instance(profile_id, at)?;
        let Change::AddGi(g) = &change else {
            unreachable!()
        };
        let id = g.id;
        self.apply(change);
        Ok(id)
    }

    /// Create a compute instance in GI `gi`; returns its id.
    pub fn create_compute_instance(&mut self, gi: u32, profile_id: u32) -> Result<u32, Ret> {
        let change = self.plan_create_compute_instance(gi, profile_id, None)?;
        let Change::AddCi(_, c) = &change else {
            unreachable!()
        };
        let id = c.id;
        self.apply(change);
        Ok(id)
    }

    /// The MIG devices (one per compute instance) in NVML's index order: by (GI id, CI id).
    pub fn mig_devices(&self) -> Vec<(u32, u32)> {
        if self.mig_enabled_model().is_err() {
            return Vec::new();
        }
        let mut v: Vec<(u32, u32)> = self
            .gpu_instances
            .iter()
            .flat_map(|g| g.compute_instances.iter().map(|c| (g.id, c.id)))
            .collect();
        v.sort_unstable();
        v
    }

    /// The GI and CI profiles of a MIG device.
    pub fn mig_device_profiles(
        &self,
        gi: u32,
        ci: u32,
    ) -> Option<(GiProfile, &'static ComputeInstanceProfile)> {
        let c = self.compute_instance(gi, ci)?;
        let (gp, cis) = self.ci_profiles(gi).ok()?;
        Some((gp, cis.iter().find(|p| p.profile_id == c.profile_id)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h100() -> Gpu {
        Gpu::mig("h100").mig_enabled()
    }

    fn starts(g: &Gpu) -> Vec<(u32, u32)> {
        let v = g.gpu_instances.iter();
        v.map(|g| (g.placement.start, g.placement.size)).collect()
    }

    #[test]
    fn default_placements_reproduce_the_mig_guide_sequences() {
        let mut g = h100();
        for id in [19, 14, 5] {
            g.create_gpu_instance(id, None).unwrap();
        }
        assert_eq!(starts(&g), [(6, 1), (4, 2), (0, 4)]);
        let mut g = h100();
        for id in [19, 19, 14] {
            g.create_gpu_instance(id, None).unwrap();
        }
        assert_eq!(g.create_gpu_instance(9, None), Err(INSUFFICIENT_RESOURCES));
        assert_eq!(starts(&g), [(6, 1), (4, 1), (0, 2)]);
        let mut g = h100();
        let ids: Vec<u32> = (0..7)
            .map(|_| g.create_gpu_instance(19, None).unwrap())
            .collect();
        assert_eq!(ids, [13, 11, 12, 7, 8, 9, 10]);
    }

    #[test]
    fn instance_count_and_media_engines_cap_creation() {
        let mut g = h100();
        g.create_gpu_instance(20, None).unwrap();
        assert_eq!(g.create_gpu_instance(20, None), Err(INSUFFICIENT_RESOURCES));
        assert_eq!(g.gi_remaining_capacity(20), Ok(0));
        let mut rtx = Gpu::mig("rtx-pro-6000").mig_enabled();
        rtx.create_gpu_instance(65, Some(Place::new(0, 3))).unwrap();
        assert_eq!(
            rtx.create_gpu_instance(14, None),
            Err(INSUFFICIENT_RESOURCES)
        );
        assert_eq!(rtx.create_gpu_instance(67, None), Ok(4));
    }

    #[test]
    fn mig_mode_is_immediate_on_hopper_and_pending_on_ampere() {
        let mut h = Gpu::mig("h100");
        let (c, st) = h.plan_set_mig_mode(true).unwrap();
        h.apply(c);
        assert_eq!((h.mig.unwrap().current, st), (true, SUCCESS));
        let mut a = Gpu::mig("a100");
        let (c, st) = a.plan_set_mig_mode(true).unwrap();
        a.apply(c);
        assert_eq!(
            (a.mig.unwrap().current, a.mig.unwrap().pending),
            (false, true)
        );
        assert_eq!(st, RESET_REQUIRED);
        a.reset();
        assert!(a.mig.unwrap().current);
    }
}
