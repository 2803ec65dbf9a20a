//! The fleet's state during the advise search: each node's GPUs with their role, instances,
//! clients and what running pods pin, and one device's worth of a pod's need ([`Unit`]). The
//! solver (`super::solver`) changes it; `super::running` builds where it starts from and
//! `super::proposal` reads where it ends.

use std::cell::RefCell;
use std::collections::BTreeMap;

use super::demand::Need;
use crate::mig::{ExistingInstance, GpuModel};
use crate::sharing::PlannedMode;

/// The most pods advise time-slices one GPU between: time-slicing isolates no memory, and past
/// this each pod's share of the GPU is too small to serve with.
pub const MAX_TIME_SLICES: u32 = 16;
/// The MPS server's client limit on Volta and later.
pub const MAX_MPS_CLIENTS: u32 = crate::profile::MAX_MPS_REPLICAS as u32;

/// How a GPU is shared in the proposal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Mig,
    TimeSliced,
    Mps,
    Exclusive,
}

/// One GPU during the search.
#[derive(Debug, Clone)]
pub struct GpuState {
    pub index: u32,
    pub model: Option<&'static GpuModel>,
    pub memory_mib: Option<u64>,
    /// Its GPU instances now (MIG on).
    pub existing: Vec<ExistingInstance>,
    /// Its mode now.
    pub current: PlannedMode,
    pub role: Role,
    /// Proposed MIG instances, profile → count.
    pub instances: BTreeMap<String, u32>,
    /// Instances pods hold, profile → count.
    pub used: BTreeMap<String, u32>,
    /// Of those, the ones running pods that name no device hold, by profile: no instance of
    /// such a profile is destroyed (which one they hold is unknown).
    pub running: BTreeMap<String, u32>,
    /// Instances running pods name as theirs, by placement start → pods holding it: these very
    /// instances are never destroyed (others of their profile may be).
    pub pinned: BTreeMap<u32, u32>,
    /// Existing instances the proposal destroys.
    pub destroyed: u32,
    /// Pods (replicas) on a whole GPU: time-sliced, MPS clients or the exclusive owner.
    pub clients: u32,
    /// Memory those pods said they need, summed.
    pub client_memory_mib: u64,
    /// The largest memory need of one MPS client on it.
    pub max_client_mib: u64,
    /// Relayout answers for one more instance of a profile: (instances destroyed in all, compute
    /// slices left), none when it does not fit. Every pending pod asks every GPU; the GPU only
    /// changes when a pod is placed on it, which clears this.
    pub relayout_memo: RefCell<Vec<RelayoutAnswer>>,
}

impl GpuState {
    pub fn in_use(&self) -> bool {
        // Counts in `used` only grow from 1.
        self.clients > 0 || !self.used.is_empty()
    }

    pub(super) fn mig_capable(&self) -> bool {
        self.model.is_some()
    }

    pub(super) fn free_slices(&self, instances: &BTreeMap<String, u32>) -> u32 {
        let Some(model) = self.model else { return 0 };
        let taken: u32 = instances
            .iter()
            .filter_map(|(p, n)| model.profile(p).map(|p| p.slice_count * n))
            .sum();
        model.compute_slices.saturating_sub(taken)
    }
}

/// A profile, and what one more instance of it costs on a GPU: (instances destroyed in all,
/// compute slices left), none when it does not fit.
pub type RelayoutAnswer = (&'static str, Option<(u32, u32)>);

/// One node during the search.
#[derive(Debug, Clone)]
pub struct NodeState {
    pub name: String,
    pub gpus: Vec<GpuState>,
    /// Pods placed here, by index into the demand.
    pub pods: Vec<usize>,
}

/// One device's worth of a pod's need.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Unit {
    Mig {
        profile: Option<String>,
        memory_mib: Option<u64>,
    },
    Shared {
        memory_mib: Option<u64>,
    },
    Mps {
        memory_mib: Option<u64>,
    },
    Whole,
}

pub(super) fn units(need: &Need) -> (Unit, u32) {
    match need {
        Need::Mig {
            profile,
            memory_mib,
            count,
        } => (
            Unit::Mig {
                profile: profile.clone(),
                memory_mib: *memory_mib,
            },
            *count,
        ),
        Need::Shared { count, memory_mib } => (
            Unit::Shared {
                memory_mib: *memory_mib,
            },
            *count,
        ),
        Need::Mps { count, memory_mib } => (
            Unit::Mps {
                memory_mib: *memory_mib,
            },
            *count,
        ),
        Need::Whole { count } => (Unit::Whole, *count),
    }
}

/// One more pod on a whole GPU, with the memory it said it needs.
pub(super) fn add_client(gpu: &mut GpuState, memory_mib: Option<u64>) {
    gpu.clients += 1;
    gpu.client_memory_mib += memory_mib.unwrap_or(0);
    gpu.max_client_mib = gpu.max_client_mib.max(memory_mib.unwrap_or(0));
}
