//! Planning: from an observed node and a profile to what must change, per GPU, and what the
//! node will advertise afterwards. Pure: nothing here touches a GPU or the API server.

mod steps;

use std::collections::BTreeMap;

use serde::Serialize;

pub use crate::gpu::{MigDevice, MigMode, ObservedGpu, ObservedNode};

use crate::gpu::Tegra;
pub use crate::sharing::{mig_resource, shared_name, GpuPlan, MigModeChange, MigMps, PlannedMode};
pub use steps::{steps, Step};

use crate::mig::{self, catalog, Geometry, GpuModel};
use crate::mps::planned::{mig_mps, pinned_per_client};
use crate::nvidia_plugin::{self, PluginConfig};
use crate::profile::{
    mig_counts, DeviceSelector, MigStrategy, Mode, Problem, Profile, Rule, RuleRef,
};
use crate::sharing::{PluginKind, GPU_RESOURCE};
use crate::timeslice;
use crate::validate::{mig_strategy, validate_for};

/// What a node needs to match a profile.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodePlan {
    pub profile: String,
    pub mig_strategy: MigStrategy,
    /// Whether `mig_strategy` came from the profile or was derived.
    pub mig_strategy_derived: bool,
    pub gpus: Vec<GpuPlan>,
    /// Extended resources the node advertises once applied, name → count.
    pub resources: BTreeMap<String, u64>,
    /// The NVIDIA device-plugin config that advertises them; none when the built-in plugin
    /// does (`--plugin builtin`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_plugin_config: Option<PluginConfig>,
    pub warnings: Vec<Problem>,
}

impl NodePlan {
    /// True when no GPU needs a MIG change (replica or plugin changes may remain).
    pub fn changes_no_mig(&self) -> bool {
        self.gpus.iter().all(GpuPlan::changes_no_mig)
    }
}

/// Plan `profile` (named `name`) for `node`. Any error in the profile, or a rule the node's
/// GPUs cannot satisfy, comes back as problems, and nothing is planned.
pub fn plan(name: &str, profile: &Profile, node: &ObservedNode) -> Result<NodePlan, Vec<Problem>> {
    plan_for(name, profile, node, PluginKind::Nvidia)
}

/// [`plan`] for the device plugin that will advertise the node: the NVIDIA plugin's refusals
/// and config only apply to [`PluginKind::Nvidia`].
pub fn plan_for(
    name: &str,
    profile: &Profile,
    node: &ObservedNode,
    plugin: PluginKind,
) -> Result<NodePlan, Vec<Problem>> {
    let warnings = checked_warnings(name, profile, plugin)?;
    plan_checked(name, profile, plugin, warnings, node)
}

/// A profile [`validate_for`] accepted for one plugin kind, with the warnings that hold on any
/// node. The agent validates a profile once per reconcile and plans from this as often as it
/// reads the GPUs (before the drain, after the MIG steps, to confirm): a plan on fresh reads
/// never validates the same text again.
#[derive(Debug, Clone)]
pub struct ValidProfile {
    name: String,
    profile: Profile,
    plugin: PluginKind,
    warnings: Vec<Problem>,
}

impl ValidProfile {
    /// `profile` (named `name`) when it is valid for `plugin`, else every problem.
    pub fn check(name: &str, profile: &Profile, plugin: PluginKind) -> Result<Self, Vec<Problem>> {
        Ok(ValidProfile {
            warnings: checked_warnings(name, profile, plugin)?,
            name: name.to_string(),
            profile: profile.clone(),
            plugin,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn profile(&self) -> &Profile {
        &self.profile
    }

    pub fn plugin(&self) -> PluginKind {
        self.plugin
    }

    /// The plan for `node`: what [`plan_for`] gives, without validating again.
    pub fn plan(&self, node: &ObservedNode) -> Result<NodePlan, Vec<Problem>> {
        plan_checked(
            &self.name,
            &self.profile,
            self.plugin,
            self.warnings.clone(),
            node,
        )
    }
}

/// The warnings of a valid profile that hold on any node, or every problem of an invalid one.
fn checked_warnings(
    name: &str,
    profile: &Profile,
    plugin: PluginKind,
) -> Result<Vec<Problem>, Vec<Problem>> {
    let mut problems = validate_for(name, profile, plugin);
    if problems.iter().any(Problem::is_error) {
        return Err(problems);
    }
    // Validation warns about models a rule may not fit; on a concrete node each GPU is checked
    // in the plan, so those warnings would only repeat (or be about models this node lacks).
    problems.retain(|p| p.gpu.is_none());
    Ok(problems)
}

/// The plan of a profile validated already (`problems`: its warnings).
fn plan_checked(
    name: &str,
    profile: &Profile,
    plugin: PluginKind,
    mut problems: Vec<Problem>,
    node: &ObservedNode,
) -> Result<NodePlan, Vec<Problem>> {
    let strategy = mig_strategy(profile);
    let mut gpus = Vec::new();
    let mut unselected = Vec::new();
    for gpu in &node.gpus {
        if let (Some(board), PluginKind::Builtin | PluginKind::Dra) = (&gpu.tegra, plugin) {
            let why = tegra_needs_nvidias_plugin(board, plugin);
            problems.push(Problem::error(name, why).on_gpu(gpu.describe()));
            continue;
        }
        let matching: Vec<(usize, &Rule)> = profile
            .rules
            .iter()
            .enumerate()
            .filter(|(_, r)| r.devices.selects(gpu.index, &gpu.product))
            .collect();
        let planned = match matching.as_slice() {
            [] => {
                unselected.push(gpu.index.to_string());
                plan_gpu(gpu, None, Mode::Exclusive, strategy, profile)
                    .map_err(|m| Problem::error(name, m.to_string()).on_gpu(gpu.describe()))
            }
            [(i, rule)] => {
                let mode = rule.mode().expect("validate() checked every rule's mode");
                plan_gpu(gpu, Some((*i, rule)), mode, strategy, profile).map_err(|m| {
                    Problem::error(name, m.to_string())
                        .in_rule(*i, rule)
                        .on_gpu(gpu.describe())
                })
            }
            [(i, _), (j, second), ..] => Err(Problem::error(
                name,
                format!(
                    "GPU {} is selected by rule {} and rule {}; a GPU takes exactly one rule",
                    gpu.describe(),
                    i + 1,
                    j + 1
                ),
            )
            .in_rule(*j, second)
            .on_gpu(gpu.describe())),
        };
        if let (Ok(gpu_plan), [(i, rule)]) = (&planned, matching.as_slice()) {
            if matches!(rule.mode(), Ok(Mode::DynamicMig))
                && gpu_plan.mode == PlannedMode::Exclusive
            {
                problems.push(
                    Problem::warning(
                        name,
                        "this GPU has no MIG the catalog knows, so dynamicMig publishes it as \
                         one whole GPU",
                    )
                    .in_rule(*i, rule)
                    .on_gpu(gpu.describe()),
                );
            }
        }
        match planned {
            Ok(gpu_plan) => gpus.push(gpu_plan),
            Err(problem) => problems.push(problem),
        }
    }
    if problems.iter().any(Problem::is_error) {
        return Err(problems);
    }
    problems.extend(absent_gpus(name, profile, node));
    problems.extend(pinned_memory_warnings(name, &gpus, node));
    if !unselected.is_empty() {
        problems.push(Problem::warning(
            name,
            format!(
                "no rule selects GPU {}: it stays exclusive (one whole nvidia.com/gpu, MIG off)",
                unselected.join(", ")
            ),
        ));
    }
    let device_plugin_config = match plugin {
        PluginKind::Nvidia => Some(
            nvidia_plugin::render(&gpus, strategy, profile, nvidia_plugin::DEFAULT_MPS_ROOT)
                .map_err(|refusals| {
                    refusals
                        .into_iter()
                        .map(|r| Problem::error(name, r))
                        .collect::<Vec<_>>()
                })?,
        ),
        PluginKind::Builtin | PluginKind::Dra => None,
    };
    let mut resources = BTreeMap::new();
    for g in &gpus {
        for (r, n) in &g.resources {
            *resources.entry(r.clone()).or_insert(0) += n;
        }
    }
    Ok(NodePlan {
        profile: name.to_string(),
        mig_strategy: strategy,
        mig_strategy_derived: profile.plugin.mig_strategy.is_none(),
        gpus,
        resources,
        device_plugin_config,
        warnings: problems,
    })
}

/// A warning for each rule that names GPU indices this node does not have: that part of the rule
/// does nothing here (a profile written for an 8-GPU node, on a 2-GPU one), which would
/// otherwise go unsaid.
fn absent_gpus(name: &str, profile: &Profile, node: &ObservedNode) -> Vec<Problem> {
    let present: Vec<u32> = node.gpus.iter().map(|g| g.index).collect();
    let has = if present.is_empty() {
        "it has no GPUs".to_string()
    } else {
        format!("it has GPU {}", index_ranges(&present))
    };
    profile
        .rules
        .iter()
        .enumerate()
        .filter_map(|(i, rule)| {
            let DeviceSelector::Indices(indices) = &rule.devices else {
                return None;
            };
            let absent: Vec<u32> = indices
                .iter()
                .copied()
                .filter(|i| !present.contains(i))
                .collect();
            (!absent.is_empty()).then(|| {
                Problem::warning(
                    name,
                    format!(
                        "selects GPU {}, which this node does not have ({has}): nothing is planned for {}",
                        index_ranges(&absent),
                        if absent.len() == 1 { "it" } else { "them" }
                    ),
                )
                .in_rule(i, rule)
            })
        })
        .collect()
}

/// `4-7, 9` for 4, 5, 6, 7, 9 (sorted, duplicates dropped).
fn index_ranges(indices: &[u32]) -> String {
    let mut sorted = indices.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut runs: Vec<(u32, u32)> = Vec::new();
    for i in sorted {
        match runs.last_mut() {
            Some((_, hi)) if *hi + 1 == i => *hi = i,
            _ => runs.push((i, i)),
        }
    }
    runs.iter()
        .map(|&(lo, hi)| {
            if lo == hi {
                lo.to_string()
            } else {
                format!("{lo}-{hi}")
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Why a rule cannot apply to one GPU; `plan_for` says it as a Problem naming the GPU and the
/// rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GpuRefusal {
    /// A Jetson/Tegra's integrated GPU asked for MIG or MPS.
    #[error("{0}")]
    Tegra(String),
    /// MIG instances asked of a GPU NVML reports no MIG mode for.
    #[error("{0}")]
    NoMigMode(String),
    #[error(
        "the MIG catalog has no entry for {product:?}, so its placements are unknown \
         (`gpu-share catalog` lists the models)"
    )]
    NotInCatalog { product: String },
    #[error(transparent)]
    Geometry(#[from] mig::GeometryError),
    #[error(transparent)]
    Mps(#[from] crate::mps::MpsError),
    /// MPS asked of a GPU it does not run on.
    #[error("{0}")]
    MpsUnavailable(String),
}

/// One GPU's plan, or why the rule can't apply to it.
fn plan_gpu(
    gpu: &ObservedGpu,
    rule: Option<(usize, &Rule)>,
    mode: Mode<'_>,
    strategy: MigStrategy,
    profile: &Profile,
) -> Result<GpuPlan, GpuRefusal> {
    if let Some(why) = gpu.tegra.as_ref().and_then(|b| tegra_cannot(b, &mode)) {
        return Err(GpuRefusal::Tegra(why));
    }
    let rename = profile.plugin.rename_by_default;
    let mut plan = GpuPlan {
        index: gpu.index,
        product: gpu.product.clone(),
        rule: rule.map(|(i, r)| RuleRef::new(i, r)),
        mode: PlannedMode::Exclusive,
        mig_mode: None,
        geometry: None,
        resources: BTreeMap::new(),
    };
    if matches!(mode, Mode::DynamicMig) && dynamic_mig_capable(gpu) {
        plan.mode = PlannedMode::DynamicMig;
        return Ok(plan);
    }
    if let Mode::Mig {
        instances,
        time_slicing,
        mps,
    } = mode
    {
        let wanted = mig_counts(instances);
        let replicas = match mps {
            Some(m) => m.replicas as u64,
            None => timeslice::replicas(time_slicing),
        };
        let (model, geometry) = plan_mig(gpu, &wanted)?;
        let mps = mps.map(|m| mig_mps(m, model, &wanted)).transpose()?;
        for instance in geometry.target() {
            *plan
                .resources
                .entry(mig_resource(&instance.profile, strategy, rename, replicas))
                .or_insert(0) += replicas;
        }
        plan.mig_mode = gpu
            .mig
            .filter(|m| !(m.current && m.pending))
            .map(|_| MigModeChange::Enable);
        plan.geometry = Some(geometry);
        plan.mode = PlannedMode::Mig {
            instances: wanted,
            replicas,
            mps,
        };
        return Ok(plan);
    }
    // Every other mode wants the whole GPU: MIG off, its instances gone.
    if let Some(m) = gpu.mig.filter(|m| m.current || m.pending) {
        plan.mig_mode = Some(MigModeChange::Disable);
        if m.current && !gpu.instances.is_empty() {
            plan.geometry = Some(Geometry {
                destroy: gpu.instances.clone(),
                ..Geometry::default()
            });
        }
    }
    let replicas = match mode {
        Mode::TimeSlicing(ts) => {
            plan.mode = PlannedMode::TimeSlicing {
                replicas: timeslice::replicas(Some(ts)),
            };
            timeslice::replicas(Some(ts))
        }
        Mode::Mps(mps) => {
            if let Some(why) = crate::mps::unavailable_on(&gpu.product) {
                return Err(GpuRefusal::MpsUnavailable(why));
            }
            let replicas = mps.replicas as u64;
            let pinned = pinned_per_client(mps, gpu.memory_mib, "this GPU's")?;
            plan.mode = PlannedMode::Mps {
                replicas,
                active_thread_percentage: mps.active_thread_percentage.map(|p| p as u32),
                pinned_memory_limit_mib: pinned,
                consumable: crate::mps::consumable::shares(mps, gpu.memory_mib, "this GPU's")?,
            };
            replicas
        }
        _ => 1,
    };
    plan.resources
        .insert(shared_name(GPU_RESOURCE, rename, replicas), replicas);
    Ok(plan)
}

/// Why a Jetson/Tegra's integrated GPU cannot take `mode`, if it cannot: it has no NVML, so
/// no MIG (nor the memory partitions MIG needs) and no MPS control daemon. Exclusive and
/// time-sliced are what NVIDIA's device plugin serves on it.
fn tegra_cannot(board: &Tegra, mode: &Mode<'_>) -> Option<String> {
    let what = match mode {
        Mode::Mig { .. } | Mode::DynamicMig => "MIG instances",
        Mode::Mps(_) => "MPS",
        Mode::Exclusive | Mode::TimeSlicing(_) => return None,
    };
    Some(format!(
        "the rule asks for {what}, but this is a Jetson/Tegra integrated GPU ({}): it has no \
         NVML, so neither MIG nor MPS; share it by time-slicing (`timeSlicing: {{replicas: N}}`) \
         or leave it exclusive",
        board.describe()
    ))
}

/// Why `plugin` cannot serve a Jetson/Tegra: gpu-share's own plugins hand out the GPUs NVML
/// lists (device nodes, CDI specs from NVML's UUIDs, XID health), and a Tegra has no NVML.
/// NVIDIA's device plugin finds the integrated GPU by itself and serves it as `tegra`.
fn tegra_needs_nvidias_plugin(board: &Tegra, plugin: PluginKind) -> String {
    format!(
        "--plugin {} cannot serve a Jetson/Tegra integrated GPU ({}): gpu-share's own plugins \
         hand out the GPUs NVML lists, and a Tegra has no NVML; run the agent with --plugin \
         nvidia (NVIDIA's device plugin detects the Tegra itself and serves it as the device \
         `tegra`)",
        plugin.name(),
        board.describe()
    )
}

/// Whether a dynamic rule makes this GPU dynamic: it runs MIG and the catalog knows its
/// placements. Any other GPU the rule selects is published whole (a warning says so), so a
/// node with an L4 beside its H100s never fails for it.
fn dynamic_mig_capable(gpu: &ObservedGpu) -> bool {
    gpu.mig.is_some() && catalog().model_by_product(&gpu.product).is_some()
}

/// A warning for each MPS GPU whose pinned-memory limit per client exceeds its whole memory.
fn pinned_memory_warnings(name: &str, gpus: &[GpuPlan], node: &ObservedNode) -> Vec<Problem> {
    gpus.iter()
        .filter_map(|planned| {
            let PlannedMode::Mps {
                pinned_memory_limit_mib: Some(limit),
                ..
            } = planned.mode
            else {
                return None;
            };
            let observed = node.gpus.iter().find(|g| g.index == planned.index)?;
            let why = crate::mps::pinned_over_memory(limit, observed.memory_mib?, "this GPU")?;
            let warning = Problem::warning(name, why).on_gpu(observed.describe());
            Some(match &planned.rule {
                Some(rule) => Problem {
                    rule: Some(Box::new(rule.clone())),
                    ..warning
                },
                None => warning,
            })
        })
        .collect()
}

/// The GPU's catalog model and its MIG geometry, keeping what can stay.
fn plan_mig(
    gpu: &ObservedGpu,
    wanted: &BTreeMap<String, u32>,
) -> Result<(&'static GpuModel, Geometry), GpuRefusal> {
    if gpu.mig.is_none() {
        return Err(GpuRefusal::NoMigMode(no_mig_mode(&gpu.product)));
    }
    let model =
        catalog()
            .model_by_product(&gpu.product)
            .ok_or_else(|| GpuRefusal::NotInCatalog {
                product: gpu.product.clone(),
            })?;
    let existing = if gpu.mig.is_some_and(|m| m.current) {
        gpu.instances.as_slice()
    } else {
        &[]
    };
    let geometry = mig::solve(model, wanted, existing)?;
    Ok((model, geometry))
}

/// Why a GPU without a MIG mode cannot take MIG instances. A product the catalog does not know
/// is the usual reason (a typo'd `--gpu`, a GPU without MIG, or a MIG GPU missing from the
/// catalog), and "cannot run MIG" alone would hide that the name was not recognised.
fn no_mig_mode(product: &str) -> String {
    if catalog().model_by_product(product).is_some() {
        "this GPU cannot run MIG (NVML reports no MIG mode), but the rule asks for MIG instances"
            .into()
    } else {
        format!(
            "the rule asks for MIG instances, but {product:?} is not in the MIG catalog, so it is \
             taken as a GPU without MIG (`gpu-share catalog` lists the MIG-capable models)"
        )
    }
}
