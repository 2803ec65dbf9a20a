//! One policy over one trace: the round loop and what it counts.
//!
//! Each round (every `round_minutes` of simulated time), in this order: pods whose time is up
//! leave; new pods arrive pending (running ones name the device they hold, as the node agent
//! would publish it: only advise reads that); the policy proposes profiles and [`Fleet::apply`] makes them
//! so (evicted pods go back to pending); [`Fleet::schedule`] places pending pods. The fleet
//! then stays as it is until the next round: every alive pod counts one round of demand,
//! every running pod one round served.

use std::time::Duration;

use gpu_share::advise::{Need, PodDemand};
use gpu_share::mig::catalog;

use crate::fleet::{need_of, Fleet, MODELS};
use crate::policy::{propose, Policy};
use crate::trace::{Class, TracePod};

/// What one policy did over the trace.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Outcome {
    /// Pod-rounds alive, and of those, running.
    pub pod_rounds_requested: u64,
    pub pod_rounds_served: u64,
    /// Summed over rounds: GPUs holding a pod, and the lower bound.
    pub gpu_rounds_used: u64,
    pub gpu_rounds_lower_bound: u64,
    /// The lower bound of the pods that ran (what the policy's packing is measured against).
    pub gpu_rounds_running_bound: u64,
    pub evictions: u64,
    pub instances_destroyed: u64,
    /// Profile changes made (nodes relabelled, summed over rounds).
    pub profile_changes: u64,
    /// Summed over rounds: pods the policy's packer reported unschedulable, and pods the
    /// simulation left pending after scheduling.
    pub reported_unschedulable: u64,
    pub left_pending: u64,
    /// How long the policy took to decide, per round, and of that the solver's own time.
    pub decide_times: Vec<Duration>,
    pub solve_times: Vec<Duration>,
    pub rounds: u32,
    /// Pod-rounds requested and served by tenant class, in [`Class::ALL`] order.
    pub by_class: [(u64, u64); 6],
}

impl Outcome {
    pub fn served_percent(&self) -> f64 {
        100.0 * self.pod_rounds_served as f64 / self.pod_rounds_requested.max(1) as f64
    }
}

/// The least compute slices (of 7) a pod of `class` can take on any model of the fleet: the
/// smallest MIG instance holding it; for an MPS client its memory cap's share of the largest
/// GPU (at least 1/48: the MPS client limit), for a time-sliced pod 1/16 of a GPU (advise's
/// most time-slices per GPU). Every GPU of the fleet has 7 compute slices.
pub fn lower_bound_slices(class: Class) -> f64 {
    let models: Vec<_> = MODELS
        .iter()
        .map(|m| catalog().model(m).expect("fleet models are in the catalog"))
        .collect();
    let most_memory = models.iter().map(|m| m.total_memory_mib).max().unwrap_or(1) as f64;
    match need_of(&class.demand("lower-bound".into(), None)) {
        Need::Mig {
            profile: Some(p), ..
        } => models
            .iter()
            .filter_map(|m| m.profile(&p))
            .map(|p| f64::from(p.slice_count))
            .fold(f64::INFINITY, f64::min),
        Need::Mig {
            memory_mib: Some(mem),
            ..
        } => models
            .iter()
            .filter_map(|m| {
                gpu_share::advise::solver::smallest_profile(m, mem).and_then(|p| m.profile(p))
            })
            .map(|p| f64::from(p.slice_count))
            .fold(f64::INFINITY, f64::min),
        Need::Mps { memory_mib, .. } => {
            7.0 * (memory_mib.unwrap_or(0) as f64 / most_memory).max(1.0 / 48.0)
        }
        Need::Shared { .. } => 7.0 / 16.0,
        Need::Whole { .. } | Need::Mig { .. } => 7.0,
    }
}

/// GPUs the alive pods need at least: their slices ([`lower_bound_slices`]) over 7, rounded up.
pub fn lower_bound_gpus(alive_slices: impl Iterator<Item = f64>) -> u64 {
    let slices: f64 = alive_slices.sum();
    // A hair under an integer is that integer (the shares are sums of fractions).
    ((slices / 7.0) - 1e-9).ceil().max(0.0) as u64
}

/// Run `policy` on `trace` over a fleet of `nodes` nodes for `rounds` rounds.
pub fn run(policy: Policy, trace: &[TracePod], nodes: usize, rounds: u32) -> Outcome {
    let mut fleet = Fleet::new(nodes, trace.len());
    let needs: Vec<Need> = trace
        .iter()
        .enumerate()
        .map(|(i, p)| need_of(&p.class.demand(pod_name(i), None)))
        .collect();
    let slices: Vec<f64> = Class::ALL.iter().map(|&c| lower_bound_slices(c)).collect();
    let slices_of = |class: Class| {
        slices[Class::ALL
            .iter()
            .position(|&c| c == class)
            .expect("a class")]
    };
    let mut out = Outcome {
        rounds,
        ..Outcome::default()
    };
    let mut alive: Vec<usize> = Vec::new();
    for round in 0..rounds {
        for &i in alive.iter().filter(|&&i| trace[i].depart <= round) {
            fleet.remove(i);
        }
        alive.retain(|&i| trace[i].depart > round);
        alive.extend((0..trace.len()).filter(|&i| trace[i].arrive == round));
        let demand: Vec<PodDemand> = alive
            .iter()
            .map(|&i| {
                let node = fleet.placed[i].map(|(n, _, _)| fleet.nodes[n].name.as_str());
                let mut pod = trace[i].class.demand(pod_name(i), node);
                // Only advise reads where a running pod is; the baselines ignore it.
                if policy == Policy::Advise {
                    pod.devices = fleet.held_devices(i);
                }
                pod
            })
            .collect();
        let decision = propose(policy, round, &fleet.nodes, &demand);
        out.decide_times.push(decision.took);
        out.solve_times.extend(decision.solve);
        out.reported_unschedulable += decision.unschedulable as u64;
        for (n, proposal) in decision.proposals.into_iter().enumerate() {
            let Some((name, profile)) = proposal else {
                continue;
            };
            if fleet.nodes[n]
                .profile
                .as_ref()
                .is_some_and(|(_, p)| *p == profile)
            {
                continue;
            }
            let applied = fleet.apply(n, &name, &profile);
            out.profile_changes += 1;
            out.instances_destroyed += applied.instances_destroyed as u64;
            out.evictions += applied.evicted.len() as u64;
        }
        let pending: Vec<(usize, Need)> = alive
            .iter()
            .filter(|&&i| fleet.placed[i].is_none())
            .map(|&i| (i, needs[i].clone()))
            .collect();
        out.left_pending += (pending.len() - fleet.schedule(&pending).len()) as u64;
        for &i in &alive {
            let class = Class::ALL
                .iter()
                .position(|&c| c == trace[i].class)
                .expect("a class");
            out.by_class[class].0 += 1;
            out.by_class[class].1 += u64::from(fleet.placed[i].is_some());
        }
        out.pod_rounds_requested += alive.len() as u64;
        out.pod_rounds_served +=
            alive.iter().filter(|&&i| fleet.placed[i].is_some()).count() as u64;
        out.gpu_rounds_used += fleet.gpus_used() as u64;
        out.gpu_rounds_lower_bound +=
            lower_bound_gpus(alive.iter().map(|&i| slices_of(trace[i].class)));
        out.gpu_rounds_running_bound += lower_bound_gpus(
            alive
                .iter()
                .filter(|&&i| fleet.placed[i].is_some())
                .map(|&i| slices_of(trace[i].class)),
        );
    }
    out
}

fn pod_name(i: usize) -> String {
    format!("pod-{i}")
}
