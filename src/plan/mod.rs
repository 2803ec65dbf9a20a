//! Planning: from an observed node and a profile to what must change, per GPU, and what the
//! node will advertise afterwards. Pure: nothing here touches a GPU or the API server.

mod observed;
mod steps;

use std::collections::BTreeMap;

use serde::Serialize;

pub use observed::{MigDevice, MigMode, ObservedGpu, ObservedNode};
pub use steps::{steps, Step};

use crate::builtin_plugin::PluginKind;
use crate::device_plugin::{self, PluginConfig};
use crate::mig::{self, catalog, Geometry, GpuModel};
use crate::mps::{parse_pinned_memory_limit, PinnedMemoryLimit};
use crate::profile::{
    mig_counts, mig_strategy, validate_for, MigStrategy, Mode, Mps, Problem, Profile, Rule, RuleRef,
};
use crate::timeslice;

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

/// What one GPU needs.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuPlan {
    pub index: u32,
    pub product: String,
    /// The rule that selected this GPU; none means it stays exclusive.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule: Option<RuleRef>,
    pub mode: PlannedMode,
    /// A MIG mode change, when needed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mig_mode: Option<MigModeChange>,
    /// GPU instances to keep, destroy and create.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub geometry: Option<Geometry>,
    pub resources: BTreeMap<String, u64>,
}

impl GpuPlan {
    pub fn changes_no_mig(&self) -> bool {
        self.mig_mode.is_none() && self.geometry.as_ref().is_none_or(Geometry::is_unchanged)
    }
}

/// Turn MIG mode on or off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MigModeChange {
    Enable,
    Disable,
}

/// The mode a GPU ends up in, with the numbers the executors need.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum PlannedMode {
    Exclusive,
    TimeSlicing {
        replicas: u64,
    },
    #[serde(rename_all = "camelCase")]
    Mps {
        replicas: u64,
        #[serde(skip_serializing_if = "Option::is_none")]
        active_thread_percentage: Option<u32>,
        /// Pinned device memory per client, with `auto` worked out from the GPU's memory.
        #[serde(skip_serializing_if = "Option::is_none")]
        pinned_memory_limit_mib: Option<u64>,
    },
    Mig {
        instances: BTreeMap<String, u32>,
        /// Replicas of each MIG device, time-sliced or MPS clients (1: not shared).
        replicas: u64,
        /// Set when the MIG devices are shared through MPS rather than time-sliced.
        #[serde(skip_serializing_if = "Option::is_none")]
        mps: Option<MigMps>,
    },
}

/// MPS inside MIG devices: one control daemon per MIG device (MIG User Guide), with these
/// defaults for its clients.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MigMps {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub active_thread_percentage: Option<u32>,
    /// Pinned device memory per client, by MIG profile (`auto`: the profile's memory divided by
    /// the replicas).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub pinned_memory_limit_mib: BTreeMap<String, u64>,
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
    let mut problems = validate_for(name, profile, plugin);
    if problems.iter().any(Problem::is_error) {
        return Err(problems);
    }
    // Validation warns about models a rule may not fit; on a concrete node each GPU is checked
    // below, so those warnings would only repeat (or be about models this node lacks).
    problems.retain(|p| p.gpu.is_none());
    let strategy = mig_strategy(profile);
    let mut gpus = Vec::new();
    let mut unselected = Vec::new();
    for gpu in &node.gpus {
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
                    .map_err(|m| Problem::error(name, m).on_gpu(gpu.describe()))
            }
            [(i, rule)] => {
                let mode = rule.mode().expect("validate() checked every rule's mode");
                plan_gpu(gpu, Some((*i, rule)), mode, strategy, profile).map_err(|m| {
                    Problem::error(name, m)
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
        match planned {
            Ok(gpu_plan) => gpus.push(gpu_plan),
            Err(problem) => problems.push(problem),
        }
    }
    if problems.iter().any(Problem::is_error) {
        return Err(problems);
    }
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
            device_plugin::render(&gpus, strategy, profile, device_plugin::DEFAULT_MPS_ROOT)
                .map_err(|refusals| {
                    refusals
                        .into_iter()
                        .map(|r| Problem::error(name, r))
                        .collect::<Vec<_>>()
                })?,
        ),
        PluginKind::Builtin => None,
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

/// One GPU's plan, or a sentence saying why the rule can't apply to it.
fn plan_gpu(
    gpu: &ObservedGpu,
    rule: Option<(usize, &Rule)>,
    mode: Mode<'_>,
    strategy: MigStrategy,
    profile: &Profile,
) -> Result<GpuPlan, String> {
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
        let mps = mps.map(|m| plan_mig_mps(m, model, &wanted)).transpose()?;
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
                return Err(why);
            }
            let replicas = mps.replicas as u64;
            let pinned = pinned_per_client(mps, gpu.memory_mib, "this GPU's")?;
            plan.mode = PlannedMode::Mps {
                replicas,
                active_thread_percentage: mps.active_thread_percentage.map(|p| p as u32),
                pinned_memory_limit_mib: pinned,
            };
            replicas
        }
        _ => 1,
    };
    plan.resources
        .insert(shared_name("nvidia.com/gpu", rename, replicas), replicas);
    Ok(plan)
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

/// The pinned device memory per MPS client of a device with `memory_mib` (`whose` names it in
/// the error when `auto` meets an unknown size).
fn pinned_per_client(
    mps: &Mps,
    memory_mib: Option<u64>,
    whose: &str,
) -> Result<Option<u64>, String> {
    let limit = mps
        .pinned_memory_limit
        .as_deref()
        .map(parse_pinned_memory_limit)
        .transpose()?;
    match (limit, memory_mib) {
        (Some(PinnedMemoryLimit::Auto), None) => Err(format!(
            "mps.pinnedMemoryLimit is auto, but {whose} memory size is unknown"
        )),
        (Some(l), mem) => Ok(Some(
            l.per_client_mib(mem.unwrap_or(0), mps.replicas as u64),
        )),
        (None, _) => Ok(None),
    }
}

/// MPS inside the MIG devices of `model`: the client limit of each wanted profile (exact for
/// this model), and the pinned memory per client from each profile's memory.
fn plan_mig_mps(
    mps: &Mps,
    model: &GpuModel,
    wanted: &BTreeMap<String, u32>,
) -> Result<MigMps, String> {
    let mut pinned = BTreeMap::new();
    for name in wanted.keys() {
        let profile = model
            .profile(name)
            .expect("plan_mig only places the model's profiles");
        if let Some(why) = crate::mps::too_many_clients_on_mig(mps.replicas, profile, model) {
            return Err(why);
        }
        let whose = format!("the {name} MIG profile's");
        if let Some(mib) = pinned_per_client(mps, profile.memory_mib, &whose)? {
            pinned.insert(name.clone(), mib);
        }
    }
    Ok(MigMps {
        active_thread_percentage: mps.active_thread_percentage.map(|p| p as u32),
        pinned_memory_limit_mib: pinned,
    })
}

/// The GPU's catalog model and its MIG geometry, keeping what can stay.
fn plan_mig(
    gpu: &ObservedGpu,
    wanted: &BTreeMap<String, u32>,
) -> Result<(&'static GpuModel, Geometry), String> {
    if gpu.mig.is_none() {
        return Err("this GPU cannot run MIG, but the rule asks for MIG instances".into());
    }
    let model = catalog().model_by_product(&gpu.product).ok_or_else(|| {
        format!(
            "the MIG catalog has no entry for {:?}, so its placements are unknown (`gpu-share catalog` lists the models)",
            gpu.product
        )
    })?;
    let existing = if gpu.mig.is_some_and(|m| m.current) {
        gpu.instances.as_slice()
    } else {
        &[]
    };
    let geometry = mig::solve(model, wanted, existing).map_err(|e| e.to_string())?;
    Ok((model, geometry))
}

/// The resource a MIG device of `profile` is advertised under: `nvidia.com/mig-<profile>`, or
/// `nvidia.com/gpu` under the single strategy, `.shared` when renamed.
pub fn mig_resource(profile: &str, strategy: MigStrategy, rename: bool, replicas: u64) -> String {
    let base = match strategy {
        MigStrategy::Single => timeslice::GPU_RESOURCE.to_string(),
        _ => catalog::resource_name(profile),
    };
    shared_name(&base, rename, replicas)
}

/// Shared devices get the `.shared` suffix when the profile asks for `renameByDefault`, as the
/// device plugin does.
pub fn shared_name(resource: &str, rename_by_default: bool, replicas: u64) -> String {
    if rename_by_default && replicas > 1 {
        format!("{resource}.shared")
    } else {
        resource.to_string()
    }
}
