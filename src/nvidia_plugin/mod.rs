//! The NVIDIA k8s-device-plugin config: assembled here from the parts each mode renders
//! (`timeslice`, `mps`, `mig`'s strategy and resource names), checked with the plugin's own
//! rules, written atomically only when it changed, and followed by a reload.
//!
//! The stock plugin (v0.20) cannot express everything a profile can: it applies one sharing
//! setting to every whole GPU on a node (it drops per-resource `devices`), refuses MPS beside
//! MIG, and advertises one replica count per resource name. Profiles that need more are refused
//! here with that reason, at `validate` time where the rules alone show it and at `plan` time
//! on a concrete node otherwise.

mod config;
mod file;
mod rules;

use std::collections::BTreeMap;

pub use config::{Flags, PluginConfig, ReplicatedResource, ReplicatedResources, Sharing};
pub use file::{create_empty_unless_present, reload, write_if_changed, ReloadError, SignalTarget};
pub use rules::check as plugin_rules;

use crate::profile::{mig_counts, DeviceSelector, MigStrategy, Mode, Problem, Profile, Rule};
use crate::sharing::{GpuPlan, PlannedMode};
use crate::{mps, timeslice};

/// Where the NVIDIA plugin and its MPS daemon keep MPS pipes (helm and GPU Operator default).
pub const DEFAULT_MPS_ROOT: &str = "/run/nvidia/mps";

/// Why the NVIDIA plugin cannot give whole GPUs different sharing.
const ONE_SHARING_FOR_WHOLE_GPUS: &str = "the NVIDIA device plugin shares every whole GPU on a node the same way (it ignores per-resource `devices`, k8s-device-plugin v0.20)";

/// Render the config for a planned node, or say why the NVIDIA plugin cannot express it.
pub fn render(
    gpus: &[GpuPlan],
    strategy: MigStrategy,
    profile: &Profile,
    mps_root: &str,
) -> Result<PluginConfig, Vec<String>> {
    check_whole_gpus_share_alike(gpus)?;
    let time_slicing = replicated(gpus, |m| timeslice::plugin_resources(m, strategy))?;
    let mps = replicated(gpus, mps::plugin_resources)?;
    let options = |resources: Vec<ReplicatedResource>| ReplicatedResources {
        rename_by_default: profile.plugin.rename_by_default,
        fail_requests_greater_than_one: profile.plugin.fail_requests_greater_than_one,
        resources,
    };
    let config = PluginConfig {
        version: "v1".into(),
        flags: Flags {
            mig_strategy: strategy,
            mps_root: (!mps.is_empty()).then(|| mps_root.to_string()),
        },
        sharing: Sharing {
            time_slicing: (!time_slicing.is_empty()).then(|| options(time_slicing)),
            mps: (!mps.is_empty()).then(|| options(mps)),
        },
    };
    let refused = rules::check(&config);
    if refused.is_empty() {
        Ok(config)
    } else {
        Err(refused
            .into_iter()
            .map(|r| format!("the NVIDIA device plugin would refuse this profile: {r}"))
            .collect())
    }
}

/// Whole GPUs (not in MIG mode) must all be exclusive, or all time-sliced alike, or all MPS alike.
fn check_whole_gpus_share_alike(gpus: &[GpuPlan]) -> Result<(), Vec<String>> {
    let whole: Vec<&GpuPlan> = gpus
        .iter()
        .filter(|g| !matches!(g.mode, PlannedMode::Mig { .. }))
        .collect();
    let Some(first) = whole.first() else {
        return Ok(());
    };
    match whole.iter().find(|g| g.mode != first.mode) {
        Some(other) => Err(vec![format!(
            "{ONE_SHARING_FOR_WHOLE_GPUS}, but GPU {} is {} and GPU {} is {}: give every whole GPU one mode",
            first.index,
            describe(&first.mode),
            other.index,
            describe(&other.mode)
        )]),
        None => Ok(()),
    }
}

fn describe(mode: &PlannedMode) -> String {
    match mode {
        PlannedMode::Exclusive => "exclusive".into(),
        PlannedMode::TimeSlicing { replicas } => format!("time-sliced × {replicas}"),
        PlannedMode::Mps { replicas, .. } => format!("shared by MPS × {replicas}"),
        PlannedMode::Mig { .. } => "in MIG mode".into(),
        PlannedMode::DynamicMig => "dynamic MIG".into(),
    }
}

/// One entry per resource name; the same name with two replica counts cannot be expressed.
fn replicated(
    gpus: &[GpuPlan],
    part: impl Fn(&PlannedMode) -> Vec<(String, u64)>,
) -> Result<Vec<ReplicatedResource>, Vec<String>> {
    let mut by_name: BTreeMap<String, (u64, u32)> = BTreeMap::new();
    for gpu in gpus {
        for (name, replicas) in part(&gpu.mode) {
            match by_name.get(&name) {
                Some(&(r, other)) if r != replicas => {
                    return Err(vec![format!(
                        "the NVIDIA device plugin takes one replica count per resource, but {name} is shared × {r} on GPU {other} and × {replicas} on GPU {}",
                        gpu.index
                    )])
                }
                Some(_) => {}
                None => {
                    by_name.insert(name, (replicas, gpu.index));
                }
            }
        }
    }
    Ok(by_name
        .into_iter()
        .map(|(name, (replicas, _))| ReplicatedResource::all_devices(&name, replicas))
        .collect())
}

/// The NVIDIA plugin's refusal of MPS where MIG is on (nvidia-stack.md §1.4, §1.7).
const MPS_ON_MIG: &str = "the NVIDIA device plugin refuses MPS on a node with MIG devices (\"sharing using MPS is not supported for MIG devices\")";

/// What the rules alone show the NVIDIA plugin cannot express (before any node is known).
pub fn check_profile(name: &str, profile: &Profile) -> Vec<Problem> {
    let modes: Vec<(usize, &Rule, Mode)> = profile
        .rules
        .iter()
        .enumerate()
        .filter_map(|(i, r)| r.mode().ok().map(|m| (i, r, m)))
        .collect();
    let mut problems = Vec::new();
    let has_mig = modes.iter().any(|(_, _, m)| matches!(m, Mode::Mig { .. }));
    let mut first_whole: Option<(usize, Mode)> = None;
    let mut mig_replicas: BTreeMap<String, (u64, usize)> = BTreeMap::new();
    for (i, rule, mode) in &modes {
        let refuse = |message: String| Problem::error(name, message).in_rule(*i, rule);
        match mode {
            Mode::Mps(_) if has_mig => problems.push(refuse(format!(
                "{MPS_ON_MIG}; with the mixed strategy: \"using --mig-strategy=mixed is not supported with MPS\" (gpu-share's built-in plugin can: --plugin builtin)"
            ))),
            Mode::Mig { mps: Some(_), .. } => problems.push(refuse(
                format!("{MPS_ON_MIG}: run it with gpu-share's built-in plugin (--plugin builtin), which starts one MPS control daemon per MIG device"),
            )),
            Mode::Mig {
                instances,
                time_slicing,
                mps: None,
            } => {
                let replicas = timeslice::replicas(*time_slicing);
                for profile_name in mig_counts(instances).keys() {
                    match mig_replicas.get(profile_name) {
                        Some(&(r, j)) if r != replicas => problems.push(refuse(format!(
                            "{profile_name} devices are shared × {replicas} here but × {r} by rule {}: the NVIDIA device plugin takes one replica count per resource",
                            j + 1
                        ))),
                        _ => {
                            mig_replicas.insert(profile_name.clone(), (replicas, *i));
                        }
                    }
                }
            }
            whole => match &first_whole {
                // Two product rules may never meet on one node (a Jetson and a GeForce PC
                // served by one profile): only a node holding both is refused, at `plan`.
                Some((j, m))
                    if !same_whole_mode(m, whole)
                        && selects_by_product(rule)
                        && selects_by_product(&profile.rules[*j]) =>
                {
                    problems.push(
                        Problem::warning(
                            name,
                            format!(
                                "{ONE_SHARING_FOR_WHOLE_GPUS}: this rule gives whole GPUs {} and \
                                 rule {} gives them {}, so a node with GPUs of both products is \
                                 refused at plan; nodes with only one of them are served",
                                whole.keyword(),
                                j + 1,
                                m.keyword()
                            ),
                        )
                        .in_rule(*i, rule),
                    )
                }
                Some((j, m)) if !same_whole_mode(m, whole) => problems.push(refuse(format!(
                    "{ONE_SHARING_FOR_WHOLE_GPUS}, but this rule gives whole GPUs {} and rule {} gives them {}",
                    whole.keyword(),
                    j + 1,
                    m.keyword()
                ))),
                Some(_) => {}
                None => first_whole = Some((*i, *whole)),
            },
        }
    }
    problems
}

fn selects_by_product(rule: &Rule) -> bool {
    matches!(rule.devices, DeviceSelector::Product(_))
}

fn same_whole_mode(a: &Mode, b: &Mode) -> bool {
    match (a, b) {
        (Mode::Exclusive, Mode::Exclusive) => true,
        (Mode::TimeSlicing(x), Mode::TimeSlicing(y)) => x == y,
        (Mode::Mps(x), Mode::Mps(y)) => x == y,
        _ => false,
    }
}
