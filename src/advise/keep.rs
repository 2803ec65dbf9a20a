//! advise changes only what demand requires. The solver builds each node's proposal from the
//! shapes it needs (MIG instances, replicas, a per-client memory cap); everything else a
//! profile says (MPS thread percentage, a pinned-memory expression, the MIG strategy, renamed
//! resources, `failRequestsGreaterThanOne`, replicas of MIG instances) is not its to decide.
//! Measured on a real cluster: with no new demand, advise proposed an MPS rule without its
//! `activeThreadPercentage: 25`, and applying it restarted every MPS daemon of the node.
//!
//! So, per node with a current profile:
//! - when every GPU's proposed shape fits within its current mode ([`serves`]), the proposal
//!   is the current profile itself, under its current key: nothing changes, not even the label;
//! - otherwise the current profile's settings carry over to the rules and plugin options the
//!   proposal keeps ([`carry_settings`]), where the result still plans on the node.

use crate::plan::{plan_for, GpuPlan, ObservedNode};
use crate::profile::{Profile, Rule};
use crate::sharing::{PlannedMode, PluginKind};

/// The profile a node runs now: its ConfigMap key, its text as parsed, its plan's GPUs.
pub struct Current<'a> {
    pub name: &'a str,
    pub profile: &'a Profile,
    pub gpus: &'a [GpuPlan],
}

/// Whether a GPU in mode `current` already serves what `proposed` asks of it: the same MIG
/// instances; as many replicas or more, shared the same way; for MPS a per-client memory cap of
/// at least `client_mib`, the most memory one of its clients said it needs (or no cap).
pub fn serves(proposed: &PlannedMode, current: &PlannedMode, client_mib: u64) -> bool {
    match (proposed, current) {
        (PlannedMode::Exclusive, PlannedMode::Exclusive) => true,
        (PlannedMode::TimeSlicing { replicas: want }, PlannedMode::TimeSlicing { replicas }) => {
            want <= replicas
        }
        (
            PlannedMode::Mps { replicas: want, .. },
            PlannedMode::Mps {
                replicas,
                pinned_memory_limit_mib: cap,
                ..
            },
        ) => want <= replicas && cap.is_none_or(|cap| client_mib <= cap),
        (
            PlannedMode::Mig {
                instances: want, ..
            },
            PlannedMode::Mig { instances, .. },
        ) => want == instances,
        _ => false,
    }
}

/// Whether the current profile serves the whole proposal, GPU by GPU; `client_mib`: each
/// GPU's largest client memory need, by GPU index.
pub fn serves_all(
    proposed: &[GpuPlan],
    current: &Current<'_>,
    client_mib: impl Fn(u32) -> u64,
) -> bool {
    proposed.len() == current.gpus.len()
        && proposed
            .iter()
            .zip(current.gpus)
            .all(|(p, c)| p.index == c.index && serves(&p.mode, &c.mode, client_mib(p.index)))
}

/// `proposal` with the current profile's settings on what it keeps: plugin options (where the
/// result still plans), and for each MPS rule whose GPUs were all MPS under one current rule,
/// that rule's thread percentage, and its pinned-memory expression unless the proposal sized
/// a cap from the pods' stated memory.
pub fn carry_settings(
    mut proposal: Profile,
    key: &str,
    current: &Current<'_>,
    observed: &ObservedNode,
    plugin: PluginKind,
) -> Profile {
    for rule in &mut proposal.rules {
        carry_mps(rule, current);
    }
    let mut with_options = proposal.clone();
    with_options.plugin = current.profile.plugin.clone();
    if plan_for(key, &with_options, observed, plugin).is_ok() {
        with_options
    } else {
        proposal
    }
}

fn carry_mps(rule: &mut Rule, current: &Current<'_>) {
    let Some(mps) = rule.mps.as_mut() else {
        return;
    };
    let gpus: Vec<&GpuPlan> = current
        .gpus
        .iter()
        .filter(|g| rule.devices.selects(g.index, &g.product))
        .collect();
    let mut numbers = gpus.iter().map(|g| match (&g.mode, &g.rule) {
        (PlannedMode::Mps { .. }, Some(r)) => Some(r.number),
        _ => None,
    });
    let Some(Some(number)) = numbers.next() else {
        return;
    };
    if numbers.any(|n| n != Some(number)) {
        return;
    }
    let Some(was) = current
        .profile
        .rules
        .get(number - 1)
        .and_then(|r| r.mps.as_ref())
    else {
        return;
    };
    mps.active_thread_percentage = was.active_thread_percentage;
    let resolved = gpus.iter().find_map(|g| match g.mode {
        PlannedMode::Mps {
            pinned_memory_limit_mib,
            ..
        } => pinned_memory_limit_mib,
        _ => None,
    });
    let from_demand = mps
        .pinned_memory_limit
        .as_deref()
        .is_some_and(|p| p != "auto" && Some(p.to_string()) != resolved.map(|m| format!("{m}Mi")));
    if !from_demand {
        mps.pinned_memory_limit = was.pinned_memory_limit.clone();
    }
}
