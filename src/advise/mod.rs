//! `gpu-share advise`: from the GPU demand of a cluster's pods and its GPU nodes to a profile
//! per node that serves the demand (issue 15, offline part). Pure: it reads two files' worth of
//! data and plans; nothing here touches a GPU or the API server.
//!
//! [`demand`] owns the pods and what they need, [`supply`] the nodes as they are, [`solver`]
//! the placement (`running` its starting point) (its module doc says how it minimises), [`proposal`] the per-node profiles and
//! their diff, [`render`] the text and ConfigMap outputs. It sits above `plan`, which checks
//! every proposal. [`live`] reads the same demand and supply from the API server.

pub mod demand;
pub mod live;
pub mod proposal;
pub mod render;
mod running;
pub mod solver;
pub mod supply;

pub use demand::{from_pod, Demand, HeldDevice, Need, Phase, PodDemand};
pub use proposal::{profile_key, Advice, NodeAdvice};
pub use supply::{Supply, SupplyNode};

use crate::sharing::PluginKind;

/// Advise for `demand` on `supply`, or every reason the input cannot be used (each names the
/// pod or node).
pub fn advise(demand: &Demand, supply: &Supply, plugin: PluginKind) -> Result<Advice, Vec<String>> {
    let mut errors = Vec::new();
    let mut nows = Vec::new();
    for (i, node) in supply.nodes.iter().enumerate() {
        if supply.nodes[..i].iter().any(|n| n.name == node.name) {
            errors.push(format!("node {}: listed twice in the supply", node.name));
            continue;
        }
        match node.now(plugin) {
            Ok(now) => nows.push(now),
            Err(e) => errors.push(e),
        }
    }
    let mut needs = Vec::new();
    for pod in &demand.pods {
        match pod.need() {
            Ok(need) => needs.push(need),
            Err(e) => {
                errors.push(e);
                needs.push(None);
            }
        }
        if pod.phase == Phase::Running && pod.node.is_none() {
            errors.push(format!("pod {}: running, but no node given", pod.id()));
        }
    }
    errors.extend(running::check_held_devices(&demand.pods, &needs, &nows));
    if !errors.is_empty() {
        return Err(errors);
    }
    let solution = solver::Solver::new(plugin).solve(&nows, &demand.pods, &needs);
    Ok(proposal::propose(&solution, &nows, &demand.pods, plugin))
}

/// Read a demand or supply file: YAML or JSON (JSON is YAML).
pub fn parse<T: serde::de::DeserializeOwned>(what: &str, text: &str) -> Result<T, String> {
    serde_yaml::from_str(text).map_err(|e| format!("cannot read the {what}: {e}"))
}

/// The solver's criteria and their order, end to end through [`advise`].
#[cfg(test)]
mod solver_criteria;
