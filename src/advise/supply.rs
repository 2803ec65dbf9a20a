//! Supply: the GPU nodes, their GPUs and how they are shared now.
//!
//! A node gives its GPUs either as `plan --gpu` specs (`h100x8`, a product name) or as the
//! observed state `plan --current` reads (MIG mode and instances, as `gpu-share status
//! --output json` prints it), plus the profile it runs now, if any. Without an observed state
//! the current profile's layout is taken as applied.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::gpu::{MigMode, ObservedNode};
use crate::mig::ExistingInstance;
use crate::plan::plan_for;
use crate::profile::{Profile, MAX_GPU_INDEX};
use crate::sharing::{PlannedMode, PluginKind};

/// The most GPUs a node's `current` may list: a profile selects GPU indices 0 to
/// [`MAX_GPU_INDEX`], so more could not be configured (`gpus` specs stop at 16).
pub const MAX_GPUS_PER_NODE: usize = MAX_GPU_INDEX as usize + 1;

/// Every GPU node.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Supply {
    pub nodes: Vec<SupplyNode>,
}

/// One node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SupplyNode {
    pub name: String,
    /// `plan --gpu` specs: a catalog model with an optional count (`h100x8`) or a product name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<String>,
    /// The observed node (`plan --current` format); takes the place of `gpus`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current: Option<ObservedNode>,
    /// The value of its `gpu-share.dev/profile` label now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile_name: Option<String>,
    /// The profile that label names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<Profile>,
}

/// A node as the solver starts from it: its GPUs as they are, and each GPU's mode now.
#[derive(Debug, Clone)]
pub struct NodeNow {
    pub name: String,
    pub observed: ObservedNode,
    /// Per GPU, in `observed.gpus` order.
    pub modes: Vec<PlannedMode>,
    /// The profile it runs now, if the supply names one.
    pub current: Option<CurrentProfile>,
}

/// A node's current profile: its key, its content and its plan's GPUs on the node.
#[derive(Debug, Clone)]
pub struct CurrentProfile {
    pub name: String,
    pub profile: Profile,
    pub gpus: Vec<crate::sharing::GpuPlan>,
}

/// A supply node advise cannot read, named.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("node {node}: {problem}")]
pub struct NodeError {
    pub node: String,
    pub problem: NodeProblem,
}

/// What in a supply node advise cannot read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeProblem {
    #[error(
        "current lists {0} GPUs; a node has at most {MAX_GPUS_PER_NODE} (GPU indices 0 to \
         {MAX_GPU_INDEX} in a profile)"
    )]
    TooManyGpus(usize),
    #[error(transparent)]
    GpuSpec(#[from] crate::gpu::GpuSpecError),
    #[error("give its GPUs as `gpus` or `current`, not both")]
    GpusAndCurrent,
    #[error("no GPUs: give `gpus` (e.g. [h100x8]) or `current`")]
    NoGpus,
    /// Its current profile's problems on its GPUs, as `plan` says them.
    #[error("its current profile does not plan on its GPUs: {0}")]
    CurrentDoesNotPlan(String),
}

impl SupplyNode {
    /// The node as it is now, or why it cannot be read (a bad spec, a current profile that does
    /// not plan on these GPUs).
    pub fn now(&self, plugin: PluginKind) -> Result<NodeNow, NodeError> {
        let at = |problem: NodeProblem| NodeError {
            node: self.name.clone(),
            problem,
        };
        let mut observed = match (&self.current, self.gpus.is_empty()) {
            (Some(current), true) if current.gpus.len() > MAX_GPUS_PER_NODE => {
                return Err(at(NodeProblem::TooManyGpus(current.gpus.len())))
            }
            (Some(current), true) => current.clone(),
            (None, false) => {
                ObservedNode::from_gpu_specs(&self.gpus).map_err(|e| at(NodeProblem::from(e)))?
            }
            (Some(_), false) => return Err(at(NodeProblem::GpusAndCurrent)),
            (None, true) => return Err(at(NodeProblem::NoGpus)),
        };
        let name = self.profile_name.as_deref().unwrap_or("current");
        let mut current = None;
        let modes = match &self.profile {
            Some(profile) => {
                let plan = plan_for(name, profile, &observed, plugin).map_err(|problems| {
                    at(NodeProblem::CurrentDoesNotPlan(
                        problems
                            .iter()
                            .map(ToString::to_string)
                            .collect::<Vec<_>>()
                            .join("; "),
                    ))
                })?;
                if self.current.is_none() {
                    take_as_applied(&mut observed, &plan.gpus);
                }
                let modes = plan.gpus.iter().map(|g| g.mode.clone()).collect();
                current = Some(CurrentProfile {
                    name: name.to_string(),
                    profile: profile.clone(),
                    gpus: plan.gpus,
                });
                modes
            }
            None => observed.gpus.iter().map(mode_from_observed).collect(),
        };
        Ok(NodeNow {
            name: self.name.clone(),
            observed,
            modes,
            current,
        })
    }
}

/// A GPU without a profile: MIG on with its instances, or exclusive.
fn mode_from_observed(gpu: &crate::gpu::ObservedGpu) -> PlannedMode {
    if gpu.mig.is_some_and(|m| m.current) && !gpu.instances.is_empty() {
        let mut instances = std::collections::BTreeMap::new();
        for i in &gpu.instances {
            *instances.entry(i.profile.clone()).or_insert(0) += 1;
        }
        PlannedMode::Mig {
            instances,
            replicas: 1,
            mps: None,
        }
    } else {
        PlannedMode::Exclusive
    }
}

/// The node once the current profile's plan is applied: MIG on with the target instances.
fn take_as_applied(observed: &mut ObservedNode, plans: &[crate::sharing::GpuPlan]) {
    for (gpu, plan) in observed.gpus.iter_mut().zip(plans) {
        if let Some(geometry) = &plan.geometry {
            if matches!(plan.mode, PlannedMode::Mig { .. }) {
                gpu.mig = Some(MigMode {
                    current: true,
                    pending: true,
                });
                gpu.instances = geometry
                    .target()
                    .into_iter()
                    .map(|t| ExistingInstance {
                        profile: t.profile,
                        placement: t.placement,
                        gi_id: None,
                    })
                    .collect();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_current_profile_is_taken_as_applied() {
        let node: SupplyNode = serde_yaml::from_str(
            "name: n1\ngpus: [h100x2]\nprofileName: p\nprofile:\n  version: v1\n  rules:\n  - devices: [0]\n    mig: {3g.40gb: 2}\n  - devices: [1]\n    exclusive: true\n",
        )
        .unwrap();
        let now = node.now(PluginKind::Nvidia).unwrap();
        assert_eq!(now.observed.gpus[0].instances.len(), 2);
        assert!(matches!(now.modes[0], PlannedMode::Mig { .. }));
        assert_eq!(now.modes[1], PlannedMode::Exclusive);
    }

    #[test]
    fn a_current_state_with_more_gpus_than_a_profile_can_name_is_refused() {
        let gpu = serde_json::json!({"index": 0, "product": "NVIDIA H100 80GB HBM3"});
        let many: Vec<_> = (0..65)
            .map(|i| {
                let mut g = gpu.clone();
                g["index"] = i.into();
                g
            })
            .collect();
        let node: SupplyNode =
            serde_json::from_value(serde_json::json!({"name": "big", "current": {"gpus": many}}))
                .unwrap();
        let e = node.now(PluginKind::Nvidia).unwrap_err();
        assert_eq!(e.problem, NodeProblem::TooManyGpus(65));
        let e = e.to_string();
        assert!(
            e.starts_with("node big: current lists 65 GPUs; a node has at most 64"),
            "{e}"
        );
    }

    #[test]
    fn a_node_without_gpus_is_refused_by_name() {
        let node: SupplyNode = serde_yaml::from_str("name: n9\n").unwrap();
        let e = node.now(PluginKind::Nvidia).unwrap_err();
        assert_eq!(e.problem, NodeProblem::NoGpus);
        assert!(e.to_string().starts_with("node n9: no GPUs"), "{e}");
    }
}
