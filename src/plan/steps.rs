//! From a node plan to the ordered MIG steps an executor performs. Pure.
//!
//! Per GPU: destroy what the target doesn't keep (compute instances go with their GPU
//! instance), switch MIG mode, create the new instances. A GPU instance that exists but lost
//! its compute instance (an interrupted create) is completed rather than recreated.

use serde::{Deserialize, Serialize};

use super::{GpuPlan, MigModeChange, NodePlan, ObservedNode};
use crate::mig::Placement;

/// One change to one GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "step", rename_all = "camelCase")]
pub enum Step {
    /// Destroy GPU instance `gi_id` and its compute instances.
    #[serde(rename_all = "camelCase")]
    DestroyInstance {
        gpu: u32,
        gi_id: u32,
        profile: String,
        placement: Placement,
    },
    /// Turn MIG mode on or off.
    SetMigMode { gpu: u32, enable: bool },
    /// Create a GPU instance and its default compute instance.
    CreateInstance {
        gpu: u32,
        profile: String,
        placement: Placement,
    },
    /// Create the missing default compute instance of a kept GPU instance.
    #[serde(rename_all = "camelCase")]
    CompleteInstance {
        gpu: u32,
        gi_id: u32,
        profile: String,
    },
}

impl Step {
    pub fn gpu(&self) -> u32 {
        match self {
            Step::DestroyInstance { gpu, .. }
            | Step::SetMigMode { gpu, .. }
            | Step::CreateInstance { gpu, .. }
            | Step::CompleteInstance { gpu, .. } => *gpu,
        }
    }
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Step::DestroyInstance {
                gpu,
                gi_id,
                profile,
                placement,
            } => write!(
                f,
                "GPU {gpu}: destroy {profile} at {placement} (GI {gi_id})"
            ),
            Step::SetMigMode { gpu, enable } => write!(
                f,
                "GPU {gpu}: {} MIG mode",
                if *enable { "enable" } else { "disable" }
            ),
            Step::CreateInstance {
                gpu,
                profile,
                placement,
            } => write!(f, "GPU {gpu}: create {profile} at {placement}"),
            Step::CompleteInstance {
                gpu,
                gi_id,
                profile,
            } => write!(
                f,
                "GPU {gpu}: create the missing compute instance of {profile} (GI {gi_id})"
            ),
        }
    }
}

/// The steps that take `node` to `plan`, in the order they must run.
pub fn steps(plan: &NodePlan, node: &ObservedNode) -> Vec<Step> {
    plan.gpus.iter().flat_map(|g| gpu_steps(g, node)).collect()
}

fn gpu_steps(plan: &GpuPlan, node: &ObservedNode) -> Vec<Step> {
    let gpu = plan.index;
    let mut out = Vec::new();
    if let Some(g) = &plan.geometry {
        for d in &g.destroy {
            if let Some(gi_id) = d.gi_id {
                out.push(Step::DestroyInstance {
                    gpu,
                    gi_id,
                    profile: d.profile.clone(),
                    placement: d.placement,
                });
            }
        }
    }
    if let Some(change) = plan.mig_mode {
        out.push(Step::SetMigMode {
            gpu,
            enable: change == MigModeChange::Enable,
        });
    }
    if let Some(g) = &plan.geometry {
        let observed = node.gpus.iter().find(|o| o.index == gpu);
        for k in &g.keep {
            let has_ci = |gi: u32| {
                observed.is_some_and(|o| o.compute_instances.iter().any(|c| c.gi_id == gi))
            };
            if let Some(gi_id) = k.gi_id.filter(|gi| !has_ci(*gi)) {
                out.push(Step::CompleteInstance {
                    gpu,
                    gi_id,
                    profile: k.profile.clone(),
                });
            }
        }
        out.extend(g.create.iter().map(|c| Step::CreateInstance {
            gpu,
            profile: c.profile.clone(),
            placement: c.placement,
        }));
    }
    out
}
