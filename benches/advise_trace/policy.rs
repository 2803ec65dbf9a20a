//! The three policies, each deciding per round which profile every node should run. They see
//! the same fleet and trace; [`crate::fleet`] applies their profiles and places the pods.
//!
//! - **advise**: `gpu-share advise` with the fleet as it is (each node's observed GPUs and
//!   current profile) and every alive pod, running ones on their node: the solver's "running
//!   pods stay" start point.
//! - **static**: each node keeps a hand-written example profile from `profiles/` for its model,
//!   set once at the start.
//! - **greedy from scratch**: what a per-batch partitioner does: every round, all alive pods
//!   (pending and running alike) are packed onto fresh GPUs, ignoring where they run, by the
//!   same packer advise uses (largest first, best fit) started from empty nodes; the profiles it
//!   finds are then applied to the nodes as they are (the planner still keeps every instance the
//!   new layout has room for, so its destroys are a lower bound for a clear-and-recreate tool).

use std::time::{Duration, Instant};

use gpu_share::advise::{advise, Demand, PodDemand, Supply, SupplyNode};
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
}

/// What `policy` wants the nodes to run this round.
pub fn propose(policy: Policy, round: u32, nodes: &[SimNode], alive: &[PodDemand]) -> Decision {
    let started = Instant::now();
    let (proposals, unschedulable) = match policy {
        Policy::Advise => advise_nodes(nodes, alive, false),
        Policy::Greedy => advise_nodes(nodes, alive, true),
        Policy::Static if round == 0 => (
            nodes
                .iter()
                .enumerate()
                .map(|(n, node)| Some(static_profile(n, node.model)))
                .collect(),
            0,
        ),
        Policy::Static => (vec![None; nodes.len()], 0),
    };
    Decision {
        proposals,
        took: started.elapsed(),
        unschedulable,
    }
}

/// advise's profile for every node, and how many pods it found no place for. `from_scratch`:
/// every node fresh, every pod pending.
fn advise_nodes(
    nodes: &[SimNode],
    alive: &[PodDemand],
    from_scratch: bool,
) -> (Vec<Option<Proposal>>, usize) {
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
    let pods = if from_scratch {
        alive
            .iter()
            .map(|p| PodDemand {
                node: None,
                phase: gpu_share::advise::Phase::Pending,
                ..p.clone()
            })
            .collect()
    } else {
        alive.to_vec()
    };
    let advice = advise(&Demand { pods }, &supply, PluginKind::Nvidia)
        .unwrap_or_else(|errors| panic!("the simulated fleet is valid input: {errors:?}"));
    let unschedulable = advice.unschedulable.len();
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
    (proposals, unschedulable)
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
