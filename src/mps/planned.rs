//! MPS's slice of the plan: the limits a GPU (or each MIG device) planned for MPS gets, with
//! `pinnedMemoryLimit: auto` worked out from the device's memory. `plan` composes it.

use std::collections::BTreeMap;

use super::{parse_pinned_memory_limit, MpsError, PinnedMemoryLimit};
use crate::mig::GpuModel;
use crate::profile::Mps;
use crate::sharing::MigMps;

/// The pinned device memory per MPS client of a device with `memory_mib` (`whose` names it in
/// the error when `auto` meets an unknown size).
pub fn pinned_per_client(
    mps: &Mps,
    memory_mib: Option<u64>,
    whose: &str,
) -> Result<Option<u64>, MpsError> {
    let limit = mps
        .pinned_memory_limit
        .as_deref()
        .map(parse_pinned_memory_limit)
        .transpose()?;
    match (limit, memory_mib) {
        (Some(PinnedMemoryLimit::Auto), None) => Err(MpsError::AutoWithoutMemory {
            whose: whose.to_string(),
        }),
        (Some(l), mem) => Ok(Some(
            l.per_client_mib(mem.unwrap_or(0), mps.replicas as u64),
        )),
        (None, _) => Ok(None),
    }
}

/// MPS inside the MIG devices of `model`: the client limit of each wanted profile (exact for
/// this model), the pinned memory per client from each profile's memory, and for a consumable
/// rule each profile's consumable shares (the policy checked against its memory).
pub fn mig_mps(
    mps: &Mps,
    model: &GpuModel,
    wanted: &BTreeMap<String, u32>,
) -> Result<MigMps, MpsError> {
    let mut pinned = BTreeMap::new();
    let mut consumable = BTreeMap::new();
    for name in wanted.keys() {
        let profile = model
            .profile(name)
            .expect("plan_mig only places the model's profiles");
        if let Some(why) = super::too_many_clients_on_mig(mps.replicas, profile, model) {
            return Err(MpsError::TooManyClientsOnMig(why));
        }
        let whose = format!("the {name} MIG profile's");
        if let Some(mib) = pinned_per_client(mps, profile.memory_mib, &whose)? {
            pinned.insert(name.clone(), mib);
        }
        if let Some(shares) = super::consumable::shares(mps, profile.memory_mib, &whose)? {
            consumable.insert(name.clone(), shares);
        }
    }
    Ok(MigMps {
        active_thread_percentage: mps.active_thread_percentage.map(|p| p as u32),
        pinned_memory_limit_mib: pinned,
        consumable,
    })
}
