//! The three policies, each deciding per round which profile every node should run. They see
//! the same fleet and trace; [`crate::fleet`] applies their profiles and places the pods.
//!
//! - **advise**: `gpu-share advise` with the fleet as it is (each node's observed GPUs and
//!   current profile) and every alive pod, running ones on their node and naming the device
//!   they hold: the solver's "running pods stay" start point.
//! - **static**: each node keeps a hand-written example profile from `profiles/` for its model,
//!   set once at the start.
//! - **greedy from scratch**: what a per-batch partitioner does: every round, all alive pods
//!   (pending and running alike) are packed onto fresh GPUs, ignoring where they run, by the
//!   same packer advise uses (largest first, best fit) started from empty nodes; the profiles it
//!   finds are then applied to the nodes as they are (the planner still keeps every instance the
//!   new layout has room for, so its destroys are a lower bound for a clear-and-recreate tool).

use std::time::{Duration, Instant};

use gpu_share::advise::proposal::propose as propose_profiles;
use gpu_share::advise::solver::Solver;
use gpu_share::advise::supply::NodeNow;
use gpu_share::advise::{Demand, Need, Phase, PodDemand, Supply, SupplyNode};
use gpu_share::profile::{parse_profile, Profile};
use gpu_share::sharing::PluginKind;

use crate::fleet::SimNode;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    Advise,
    Static,
    Greedy,
}

impl Policy {
    pub const ALL: [Policy; 3] = [Policy::Advise, Policy::Static, Policy::Greedy];

    pub fn label(self) -> &'static str {
        match self {
            Policy::Advise => "gpu-share advise",
            Policy::Static => "static examples",
            Policy::Greedy => "greedy from scratch",
        }
    }
}

/// A profile for a node: its label value and the profile.
pub type Proposal = (String, Profile);

/// A policy's decision for one round.
pub struct Decision {
    /// Per node, the profile it should run (none: leave it as it is).
    pub proposals: Vec<Option<Proposal>>,
    /// How long the policy took to decide.
    pub took: Duration,
    /// Pods advise itself reported unschedulable (0 for the static policy).
    pub unschedulable: usize,
    /// Of `took`, the solver's own time (`Solver::solve`), for the advise-based policies.
    pub solve: Option<Duration>,
}

/// What `policy` wants the nodes to run this round.
pub fn propose(policy: Policy, round: u32, nodes: &[SimNode], alive: &[PodDemand]) -> Decision {
    let started = Instant::now();
    let answer = match policy {
        Policy::Advise => advise_nodes(nodes, alive, false),
        Policy::Greedy => advise_nodes(nodes, alive, true),
        Policy::Static => Answer {
            proposals: nodes
                .iter()
                .enumerate()
                .map(|(n, node)| (round == 0).then(|| static_profile(n, node.model)))
                .collect(),
            unschedulable: 0,
            solve: None,
        },
    };
    Decision {
        proposals: answer.proposals,
        took: started.elapsed(),
        unschedulable: answer.unschedulable,
        solve: answer.solve,
    }
}

/// The fleet and its alive pods as advise's input. `from_scratch`: every node fresh (its
/// model only), every pod pending.
pub fn supply_and_demand(
    nodes: &[SimNode],
    alive: &[PodDemand],
    from_scratch: bool,
) -> (Supply, Demand) {
    let supply = Supply {
        nodes: nodes
            .iter()
            .map(|node| {
                if from_scratch {
                    SupplyNode {
                        name: node.name.clone(),
                        gpus: vec![format!("{}x{}", node.model, node.observed.gpus.len())],
                        current: None,
                        profile_name: None,
                        profile: None,
                    }
                } else {
                    SupplyNode {
                        name: node.name.clone(),
                        gpus: Vec::new(),
                        current: Some(node.observed.clone()),
                        profile_name: node.profile.as_ref().map(|(k, _)| k.clone()),
                        profile: node.profile.as_ref().map(|(_, p)| p.clone()),
                    }
                }
            })
            .collect(),
    };
    let pods = alive
        .iter()
        .map(|p| match from_scratch {
            true => PodDemand {
                node: None,
                phase: Phase::Pending,
                devices: Vec::new(),
                ..p.clone()
            },
            false => p.clone(),
        })
        .collect();
    (supply, Demand { pods })
}

/// What [`gpu_share::advise::advise`] does, step by step so the solver's own time can be
/// told apart from reading the nodes and planning the proposals (the bench fleet is valid
/// input, so advise's input checks are left out; tests/advise_trace_sim.rs checks that the
/// answer is advise's).
fn advise_nodes(nodes: &[SimNode], alive: &[PodDemand], from_scratch: bool) -> Answer {
    let (supply, demand) = supply_and_demand(nodes, alive, from_scratch);
    let nows: Vec<NodeNow> = supply
        .nodes
        .iter()
        .map(|n| n.now(PluginKind::Nvidia).expect("simulated nodes read"))
        .collect();
    let needs: Vec<Option<Need>> = demand
        .pods
        .iter()
        .map(|p| p.need().expect("trace pods are valid demand"))
        .collect();
    let started = Instant::now();
    let solution = Solver::new(PluginKind::Nvidia).solve(&nows, &demand.pods, &needs);
    let solve = started.elapsed();
    let advice = propose_profiles(&solution, &nows, &demand.pods, PluginKind::Nvidia);
    let proposals = advice
        .nodes
        .into_iter()
        .map(|a| {
            assert!(
                a.problems.is_empty(),
                "advise proposed a profile that does not plan: {:?}",
                a.problems
            );
            Some((a.profile_key, a.profile))
        })
        .collect();
    Answer {
        proposals,
        unschedulable: advice.unschedulable.len(),
        solve: Some(solve),
    }
}

/// A decision before it is timed.
struct Answer {
    proposals: Vec<Option<Proposal>>,
    unschedulable: usize,
    solve: Option<Duration>,
}

/// The hand-written example each node keeps in the static policy: H100 nodes take turns
/// between `h100-inference` (MIG 1g + time-slicing), `h100-balanced` (3g + 4×1g) and
/// `h100-mps`; H200 nodes run `h200-mig-timeslice`; A100 80GB nodes `a100-80gb-single`
/// (7×1g). The examples have no 7g layout and no MIG profile that holds 79 GiB but
/// `h200-mig-timeslice`'s 3g.71gb (which does not), so 7g-sized pods find no place: a
/// hand-written fleet sized for one mix, which is what the baseline stands for.
pub fn static_profile(n: usize, model: &str) -> Proposal {
    let (name, text) = match model {
        "h100" => [
            (
                "h100-inference",
                include_str!("../../profiles/h100-inference.yaml"),
            ),
            (
                "h100-balanced",
                include_str!("../../profiles/h100-balanced.yaml"),
            ),
            ("h100-mps", include_str!("../../profiles/h100-mps.yaml")),
        ][(n / 3) % 3],
        "h200" => (
            "h200-mig-timeslice",
            include_str!("../../profiles/h200-mig-timeslice.yaml"),
        ),
        _ => (
            "a100-80gb-single",
            include_str!("../../profiles/a100-80gb-single.yaml"),
        ),
    };
    let profile = parse_profile(name, text).expect("example profiles parse");
    (name.to_string(), profile)
}
