//! The fleet as the solver starts from it: each GPU's mode and instances now, and running pods
//! matched to the devices their node has now (step 1 of the solver's module doc).

use std::collections::BTreeMap;

use super::demand::Need;
use super::solver::{add_client, units, GpuState, NodeState, Role, Unit};
use super::supply::NodeNow;
use crate::mig;
use crate::sharing::PlannedMode;

pub(super) fn start_state(now: &NodeNow) -> NodeState {
    let gpus = now
        .observed
        .gpus
        .iter()
        .zip(&now.modes)
        .map(|(gpu, mode)| {
            let model = gpu.mig.and(mig::catalog().model_by_product(&gpu.product));
            let mig_on = gpu.mig.is_some_and(|m| m.current);
            let role = match mode {
                PlannedMode::Mig { .. } => Role::Mig,
                PlannedMode::TimeSlicing { .. } => Role::TimeSliced,
                PlannedMode::Mps { .. } => Role::Mps,
                PlannedMode::Exclusive => Role::Exclusive,
            };
            let existing = if mig_on && role == Role::Mig {
                gpu.instances.clone()
            } else {
                Vec::new()
            };
            let mut instances = BTreeMap::new();
            for e in &existing {
                *instances.entry(e.profile.clone()).or_insert(0) += 1;
            }
            GpuState {
                index: gpu.index,
                model,
                memory_mib: gpu.memory_mib.or(model.map(|m| m.total_memory_mib)),
                existing,
                current: mode.clone(),
                role,
                instances,
                used: BTreeMap::new(),
                running: BTreeMap::new(),
                destroyed: 0,
                clients: 0,
                client_memory_mib: 0,
                max_client_mib: 0,
                relayout_memo: Default::default(),
            }
        })
        .collect();
    NodeState {
        name: now.name.clone(),
        gpus,
        pods: Vec::new(),
    }
}

/// Match a running pod to devices its node has now; false (and nothing changed) when they are
/// not there.
pub(super) fn keep_running(node: &mut NodeState, need: &Need) -> bool {
    let (unit, count) = units(need);
    let mut trial = node.gpus.clone();
    for _ in 0..count {
        let Some(g) = trial.iter().position(|g| holds_now(g, &unit)) else {
            return false;
        };
        let gpu = &mut trial[g];
        match &unit {
            Unit::Mig { .. } => {
                let p = free_instance_now(gpu, &unit).expect("holds_now checked");
                *gpu.used.entry(p.clone()).or_insert(0) += 1;
                *gpu.running.entry(p).or_insert(0) += 1;
            }
            Unit::Shared { memory_mib } | Unit::Mps { memory_mib } => add_client(gpu, *memory_mib),
            Unit::Whole => add_client(gpu, None),
        }
    }
    node.gpus = trial;
    true
}

/// Whether `gpu`, as it is now, has a free device for a running `unit`.
fn holds_now(gpu: &GpuState, unit: &Unit) -> bool {
    match (unit, &gpu.current) {
        (Unit::Mig { .. }, PlannedMode::Mig { .. }) => free_instance_now(gpu, unit).is_some(),
        (Unit::Shared { .. }, PlannedMode::TimeSlicing { replicas }) => {
            u64::from(gpu.clients) < *replicas
        }
        (Unit::Mps { .. }, PlannedMode::Mps { replicas, .. }) => u64::from(gpu.clients) < *replicas,
        (Unit::Whole, PlannedMode::Exclusive) => gpu.role == Role::Exclusive && gpu.clients == 0,
        _ => false,
    }
}

/// A free instance now for a MIG unit: of its profile, or the smallest holding its memory.
fn free_instance_now(gpu: &GpuState, unit: &Unit) -> Option<String> {
    let Unit::Mig {
        profile,
        memory_mib,
    } = unit
    else {
        return None;
    };
    let free = |p: &str| {
        gpu.instances.get(p).copied().unwrap_or(0) > gpu.used.get(p).copied().unwrap_or(0)
    };
    match profile {
        Some(p) => free(p).then(|| p.clone()),
        None => {
            let model = gpu.model?;
            gpu.instances
                .keys()
                .filter(|p| free(p))
                .filter_map(|p| model.profile(p))
                .filter(|p| p.memory_mib.is_some_and(|m| m >= memory_mib.unwrap_or(0)))
                .min_by_key(|p| p.memory_mib)
                .map(|p| p.name.clone())
        }
    }
}

/// Which nodes are still as they started, and which of those started alike. Two such nodes
/// cost the same for any pod, and the solver keeps the first of equal costs, so only the first
/// of each class needs evaluating: placing a pod then looks at the nodes in use plus one node
/// per kind of idle node, not at every node (a fleet of 5,000 alike nodes is one class).
pub(super) struct Pristine {
    /// Per node, its class: nodes whose GPUs started the same share one.
    class: Vec<usize>,
    touched: Vec<bool>,
}

impl Pristine {
    pub(super) fn of(nodes: &[NodeState]) -> Self {
        let mut classes: std::collections::HashMap<String, usize> = Default::default();
        let class = nodes
            .iter()
            .map(|n| {
                // Everything a GPU's cost depends on (memo empty at the start); not the name.
                let next = classes.len();
                *classes.entry(format!("{:?}", n.gpus)).or_insert(next)
            })
            .collect();
        Pristine {
            class,
            touched: vec![false; nodes.len()],
        }
    }

    /// A pod was placed on node `n`: it is no longer like the others of its class.
    pub(super) fn touch(&mut self, n: usize) {
        self.touched[n] = true;
    }

    /// Whether node `n` can be skipped: untouched, and its class was evaluated already in this
    /// placement (`seen`: classes evaluated so far).
    pub(super) fn same_as_seen(&self, n: usize, seen: &mut Vec<bool>) -> bool {
        if self.touched[n] {
            return false;
        }
        let c = self.class[n];
        if seen.len() <= c {
            seen.resize(c + 1, false);
        }
        std::mem::replace(&mut seen[c], true)
    }
}
