//! From the solver's decision to what advise reports per node: the proposed profile (in the
//! existing format, one rule per group of GPUs shared alike), checked by planning it on the
//! node, with the plan's diff, the pods evicted, the GPUs left idle and the memory stranded.

use std::collections::BTreeMap;

use serde::Serialize;

use super::demand::PodDemand;
use super::keep::{carry_settings, serves_all, Current};
use super::solver::{gib, Solution};
use super::state::{GpuState, NodeState, Role, MAX_MPS_CLIENTS, MAX_TIME_SLICES};
use super::supply::NodeNow;
use crate::plan::plan_for;
use crate::profile::{
    check_key, DeviceSelector, Mps, Problem, Profile, Rule, TimeSlicing, VERSION,
};
use crate::sharing::{PlannedMode, PluginKind};

/// Replicas are sized to the pods in steps of this many, so one more pod does not change the
/// profile (and restart the device plugin) each time.
pub const REPLICA_STEP: u32 = 2;

/// advise's answer for the fleet.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Advice {
    pub plugin: PluginKind,
    pub nodes: Vec<NodeAdvice>,
    /// Pending pods that fit nowhere, with why.
    pub unschedulable: Vec<Unschedulable>,
    pub totals: Totals,
}

#[derive(Debug, Clone, Serialize)]
pub struct Unschedulable {
    pub pod: String,
    pub reason: String,
}

/// Sums over the fleet, in the order the solver minimises them.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Totals {
    pub unschedulable_pods: usize,
    pub pods_evicted: usize,
    pub instances_destroyed: usize,
    pub gpus_used: usize,
    pub gpus_idle: usize,
}

/// One node's proposal.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeAdvice {
    pub node: String,
    /// The ConfigMap key of the proposed profile, and so the `gpu-share.dev/profile` value.
    pub profile_key: String,
    pub profile: Profile,
    /// Pods the proposal serves here (running ones kept, pending ones placed).
    pub pods: Vec<String>,
    /// Running pods whose device the node does not have (they restart elsewhere or here).
    pub pods_evicted: Vec<String>,
    pub instances_kept: usize,
    pub instances_destroyed: usize,
    pub instances_created: usize,
    /// GPUs whose MIG mode the proposal turns on or off.
    pub mig_mode_changes: usize,
    pub gpus_used: Vec<u32>,
    pub gpus_idle: Vec<u32>,
    /// Memory on GPUs in use that no pod asked for: MIG memory outside the instances pods
    /// hold, and a whole GPU's memory beyond its pods' stated needs (when they state one).
    pub stranded_memory_gib: f64,
    /// What the node advertises once the proposal is applied, resource → count.
    pub resources: BTreeMap<String, u64>,
    /// Planning problems: none unless advise has a bug (the tests plan every proposal).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<Problem>,
}

/// The per-node reports for a solution.
pub fn propose(
    solution: &Solution,
    nows: &[NodeNow],
    pods: &[PodDemand],
    plugin: PluginKind,
) -> Advice {
    let mut nodes = Vec::new();
    let mut totals = Totals::default();
    for (state, now) in solution.nodes.iter().zip(nows) {
        let advice = node_advice(state, now, solution, pods, plugin);
        totals.pods_evicted += advice.pods_evicted.len();
        totals.instances_destroyed += advice.instances_destroyed;
        totals.gpus_used += advice.gpus_used.len();
        totals.gpus_idle += advice.gpus_idle.len();
        nodes.push(advice);
    }
    let unschedulable: Vec<Unschedulable> = solution
        .unschedulable
        .iter()
        .map(|(i, reason)| Unschedulable {
            pod: pods[*i].id(),
            reason: reason.clone(),
        })
        .collect();
    totals.unschedulable_pods = unschedulable.len();
    Advice {
        plugin,
        nodes,
        unschedulable,
        totals,
    }
}

/// `advised-<node>`: the ConfigMap key (and label value) of a node's proposal.
pub fn profile_key(node: &str) -> String {
    format!("advised-{node}")
}

fn node_advice(
    state: &NodeState,
    now: &NodeNow,
    solution: &Solution,
    pods: &[PodDemand],
    plugin: PluginKind,
) -> NodeAdvice {
    let (key, profile) = keep_what_serves(state, now, plugin);
    let mut problems: Vec<Problem> = check_key(&key).err().into_iter().collect();
    let mut advice = NodeAdvice {
        node: state.name.clone(),
        profile_key: key.clone(),
        profile: profile.clone(),
        pods: state.pods.iter().map(|&i| pods[i].id()).collect(),
        pods_evicted: solution
            .evicted
            .iter()
            .filter(|&&i| pods[i].node.as_deref() == Some(state.name.as_str()))
            .map(|&i| pods[i].id())
            .collect(),
        instances_kept: 0,
        instances_destroyed: 0,
        instances_created: 0,
        mig_mode_changes: 0,
        gpus_used: state
            .gpus
            .iter()
            .filter(|g| g.in_use())
            .map(|g| g.index)
            .collect(),
        gpus_idle: state
            .gpus
            .iter()
            .filter(|g| !g.in_use())
            .map(|g| g.index)
            .collect(),
        stranded_memory_gib: stranded_mib(state) as f64 / 1024.0,
        resources: BTreeMap::new(),
        problems: Vec::new(),
    };
    match plan_for(&key, &profile, &now.observed, plugin) {
        Ok(plan) => {
            for gpu in &plan.gpus {
                advice.mig_mode_changes += usize::from(gpu.mig_mode.is_some());
                if let Some(g) = &gpu.geometry {
                    advice.instances_kept += g.keep.len();
                    advice.instances_destroyed += g.destroy.len();
                    advice.instances_created += g.create.len();
                }
            }
            advice.resources = plan.resources;
        }
        Err(found) => problems.extend(found),
    }
    advice.problems = problems;
    advice
}

/// The node's proposal key and profile: the solver's, unless the current profile serves it
/// (then the current one, unchanged), with the current settings on what it keeps
/// ([`super::keep`]).
fn keep_what_serves(state: &NodeState, now: &NodeNow, plugin: PluginKind) -> (String, Profile) {
    let key = profile_key(&state.name);
    let proposal = profile_for(state, plugin);
    let Some(running) = &now.current else {
        return (key, proposal);
    };
    let current = Current {
        name: &running.name,
        profile: &running.profile,
        gpus: &running.gpus,
    };
    let Ok(plan) = plan_for(&key, &proposal, &now.observed, plugin) else {
        return (key, proposal);
    };
    let client_mib = |index: u32| {
        state
            .gpus
            .iter()
            .find(|g| g.index == index)
            .map_or(0, |g| g.max_client_mib)
    };
    if serves_all(&plan.gpus, &current, client_mib) {
        return (current.name.to_string(), current.profile.clone());
    }
    let carried = carry_settings(proposal, &key, &current, &now.observed, plugin);
    (key, carried)
}

/// What one GPU's rule gives it; GPUs with equal specs share a rule.
#[derive(Debug, Clone, PartialEq)]
enum Spec {
    Mig(BTreeMap<String, i64>),
    TimeSliced(i64),
    Mps {
        replicas: i64,
        pinned_mib: Option<u64>,
    },
    Exclusive,
}

/// The proposed profile of a node.
pub fn profile_for(node: &NodeState, plugin: PluginKind) -> Profile {
    let specs = gpu_specs(node, plugin);
    let mut groups: Vec<(Spec, Vec<u32>)> = Vec::new();
    for (gpu, spec) in node.gpus.iter().zip(specs) {
        match groups.iter_mut().find(|(s, _)| *s == spec) {
            Some((_, devices)) => devices.push(gpu.index),
            None => groups.push((spec, vec![gpu.index])),
        }
    }
    let rules = groups
        .into_iter()
        .enumerate()
        .map(|(i, (spec, devices))| rule(i, spec, devices))
        .collect();
    Profile {
        version: VERSION.into(),
        description: Some(format!(
            "Proposed by gpu-share advise for node {}",
            node.name
        )),
        plugin: Default::default(),
        rules,
    }
}

fn rule(i: usize, spec: Spec, devices: Vec<u32>) -> Rule {
    let mut rule = Rule {
        name: None,
        devices: DeviceSelector::Indices(devices),
        exclusive: None,
        time_slicing: None,
        mps: None,
        mig: None,
        dynamic_mig: None,
    };
    let kind = match spec {
        Spec::Mig(instances) => {
            rule.mig = Some(instances);
            "mig"
        }
        Spec::TimeSliced(replicas) => {
            rule.time_slicing = Some(TimeSlicing { replicas });
            "time-sliced"
        }
        Spec::Mps {
            replicas,
            pinned_mib,
        } => {
            rule.mps = Some(Mps {
                replicas,
                active_thread_percentage: None,
                pinned_memory_limit: Some(
                    pinned_mib.map_or_else(|| "auto".into(), |m| format!("{m}Mi")),
                ),
                consumable: None,
            });
            "mps"
        }
        Spec::Exclusive => {
            rule.exclusive = Some(true);
            "exclusive"
        }
    };
    rule.name = Some(format!("{kind}-{}", i + 1));
    rule
}

/// Each GPU's spec. With the NVIDIA plugin every whole GPU of the node gets the one whole mode
/// the node's pods need (idle ones too: the plugin shares all whole GPUs alike); the built-in
/// plugin and DRA take each GPU as it is.
fn gpu_specs(node: &NodeState, plugin: PluginKind) -> Vec<Spec> {
    let has_mig = node
        .gpus
        .iter()
        .any(|g| g.role == Role::Mig && !g.instances.is_empty());
    let own: Vec<Spec> = node
        .gpus
        .iter()
        .map(|g| own_spec(g, node, has_mig, plugin))
        .collect();
    if plugin != PluginKind::Nvidia {
        return own;
    }
    let whole_in_use = node
        .gpus
        .iter()
        .zip(&own)
        .filter(|(g, s)| g.in_use() && !matches!(s, Spec::Mig(_)));
    let node_whole = whole_in_use.map(|(_, s)| s.clone()).reduce(widest);
    let node_whole = node_whole.or_else(|| {
        // No whole GPU in use: the idle ones keep their mode now (one mode already, since the
        // current profile passed the NVIDIA plugin's checks).
        own.iter()
            .filter(|s| !matches!(s, Spec::Mig(_)))
            .cloned()
            .reduce(widest)
    });
    own.into_iter()
        .map(|s| match (&s, &node_whole) {
            (Spec::Mig(_), _) | (_, None) => s,
            (_, Some(whole)) => whole.clone(),
        })
        .collect()
}

/// The one setting that serves both: more replicas, a larger memory cap.
fn widest(a: Spec, b: Spec) -> Spec {
    match (a, b) {
        (Spec::TimeSliced(x), Spec::TimeSliced(y)) => Spec::TimeSliced(x.max(y)),
        (
            Spec::Mps {
                replicas: x,
                pinned_mib: p,
            },
            Spec::Mps {
                replicas: y,
                pinned_mib: q,
            },
        ) => Spec::Mps {
            replicas: x.max(y),
            pinned_mib: p.max(q),
        },
        (a, _) => a,
    }
}

fn own_spec(gpu: &GpuState, node: &NodeState, has_mig: bool, plugin: PluginKind) -> Spec {
    match gpu.role {
        Role::Mig if !gpu.instances.is_empty() => Spec::Mig(
            gpu.instances
                .iter()
                .map(|(p, n)| (p.clone(), i64::from(*n)))
                .collect(),
        ),
        Role::Mig | Role::Exclusive => Spec::Exclusive,
        Role::TimeSliced if gpu.in_use() => Spec::TimeSliced(sized(gpu.clients, MAX_TIME_SLICES)),
        Role::Mps if gpu.in_use() => mps_spec(gpu, node),
        Role::TimeSliced => match gpu.current {
            PlannedMode::TimeSlicing { replicas } => Spec::TimeSliced(replicas as i64),
            _ => Spec::Exclusive,
        },
        Role::Mps => match gpu.current {
            _ if plugin == PluginKind::Nvidia && has_mig => Spec::Exclusive,
            PlannedMode::Mps {
                replicas,
                pinned_memory_limit_mib,
                ..
            } => Spec::Mps {
                replicas: replicas as i64,
                pinned_mib: pinned_memory_limit_mib,
            },
            _ => Spec::Exclusive,
        },
    }
}

/// MPS replicas sized to the clients, and the node's per-client cap when pods stated memory;
/// replicas times the cap stay within every MPS GPU's memory (the solver checked the clients).
fn mps_spec(gpu: &GpuState, node: &NodeState) -> Spec {
    let cap = node
        .gpus
        .iter()
        .filter(|g| g.role == Role::Mps && g.in_use())
        .map(|g| g.max_client_mib)
        .max()
        .unwrap_or(0);
    let mut replicas = sized(gpu.clients, MAX_MPS_CLIENTS);
    let smallest = node
        .gpus
        .iter()
        .filter(|g| g.role == Role::Mps && g.in_use())
        .filter_map(|g| g.memory_mib)
        .min();
    if let Some(fit) = smallest.and_then(|mem| mem.checked_div(cap)) {
        replicas = replicas.min(fit as i64).max(gpu.clients as i64);
    }
    Spec::Mps {
        replicas: replicas.max(2),
        pinned_mib: (cap > 0).then_some(cap),
    }
}

/// `clients` rounded up to a multiple of [`REPLICA_STEP`], at least 2, at most `max`.
pub fn sized(clients: u32, max: u32) -> i64 {
    let stepped = clients.div_ceil(REPLICA_STEP) * REPLICA_STEP;
    i64::from(stepped.clamp(2, max.max(clients)))
}

/// Memory on GPUs in use that no pod asked for.
fn stranded_mib(node: &NodeState) -> u64 {
    node.gpus
        .iter()
        .filter(|g| g.in_use())
        .map(|g| {
            let total = g.memory_mib.unwrap_or(0);
            match (g.role, g.model) {
                (Role::Mig, Some(model)) => {
                    let held: u64 = g
                        .used
                        .iter()
                        .filter_map(|(p, n)| {
                            model
                                .profile(p)
                                .and_then(|p| p.memory_mib)
                                .map(|m| m * u64::from(*n))
                        })
                        .sum();
                    total.saturating_sub(held)
                }
                _ if g.client_memory_mib > 0 => total.saturating_sub(g.client_memory_mib),
                _ => 0,
            }
        })
        .sum()
}

/// `12.5 GiB`, for the text report.
pub fn gib_text(gib_value: f64) -> String {
    format!("{} GiB", gib((gib_value * 1024.0).round() as u64))
}
