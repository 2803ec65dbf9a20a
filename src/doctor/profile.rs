//! Layer 3 (with `--profile`): the profile plans on this node, each GPU it puts in MIG mode can
//! do MIG with this driver, and MPS has its control daemon binary.

use std::collections::BTreeMap;

use super::{find_program, is_executable, Check, Ctx, Facts};
use crate::mig::catalog;
use crate::plan::{plan_for, NodePlan, ObservedGpu, ObservedNode, PlannedMode};
use crate::profile::{Mode, Problem, Profile, Severity};
use crate::sharing::PluginKind;

const NAME: &str = "profile";

pub(super) fn check(ctx: &Ctx<'_>, facts: &mut Facts) -> Check {
    let Some(named) = ctx.profile else {
        return Check::skip(NAME, "no --profile given: MIG and MPS needs not checked");
    };
    let file = ctx
        .profile_path
        .map_or_else(|| "FILE".into(), |p| p.display().to_string());
    // The commands suggested below check the profile for the same plugin.
    let file = match ctx.plugin {
        PluginKind::Nvidia => file,
        PluginKind::Builtin => format!("{file} --plugin builtin"),
        PluginKind::Dra => format!("{file} --plugin dra"),
    };
    let profile = match &named.profile {
        Ok(p) => p,
        Err(problem) => {
            return Check::failed(
                NAME,
                format!("profile {:?} is not valid: {problem}", named.name),
                format!("`gpu-share validate {file}` lists what to correct"),
            )
        }
    };
    let node = match (&facts.node, &facts.tegra) {
        (Some(node), _) => node.clone(),
        (None, Some(tegra)) => ObservedNode {
            gpus: vec![ObservedGpu::tegra(tegra)],
        },
        (None, None) => return Check::skip(NAME, "not checked: no GPU was observed"),
    };
    let planned = match plan_for(&named.name, profile, &node, ctx.plugin) {
        Ok(p) => p,
        Err(problems) => return does_not_fit(&named.name, profile, &node, &problems, &file),
    };
    let mut check = Check::new(
        NAME,
        format!(
            "profile {:?} plans on this node: {}; advertises {}",
            named.name,
            modes(&planned),
            resources(&planned.resources)
        ),
    );
    check_mig(&planned, facts, &mut check);
    check_mps(ctx, &planned, facts, &mut check);
    if !planned.changes_no_mig() {
        let gpus: Vec<String> = planned
            .gpus
            .iter()
            .filter(|g| !g.changes_no_mig())
            .map(|g| g.index.to_string())
            .collect();
        check.warn(
            format!(
                "the GPUs do not match the profile yet: GPU {} need{} MIG changes",
                gpus.join(", "),
                if gpus.len() == 1 { "s" } else { "" }
            ),
            format!("`gpu-share apply --profile {file}`"),
        );
    }
    check
        .details
        .extend(planned.warnings.iter().map(ToString::to_string));
    facts.plan = Some(planned);
    check
}

/// The profile cannot be applied here: list why, with the most useful fix.
fn does_not_fit(
    name: &str,
    profile: &Profile,
    node: &ObservedNode,
    problems: &[Problem],
    file: &str,
) -> Check {
    let no_mig = gpus_without_mig_under_mig_rules(profile, node);
    let fix = if no_mig.is_empty() {
        format!(
            "change the rules so they fit this node's GPUs (`gpu-share status` lists them; \
             `gpu-share plan --profile {file} --current <(gpu-share status -o json)` replays this)"
        )
    } else {
        format!(
            "GPU {} cannot do MIG: give {} timeSlicing or mps instead, or make the MIG rule \
             select only MIG-capable GPUs (devices: {{product: \"NVIDIA H100*\"}})",
            no_mig.join(", "),
            if no_mig.len() == 1 { "it" } else { "them" }
        )
    };
    let mut c = Check::failed(
        NAME,
        format!("profile {name:?} does not fit this node"),
        fix,
    );
    c.details = problems
        .iter()
        .filter(|p| p.severity == Severity::Error)
        .map(ToString::to_string)
        .collect();
    c
}

/// `0 (NVIDIA GeForce RTX 3090)` for each GPU without MIG that a MIG rule selects.
fn gpus_without_mig_under_mig_rules(profile: &Profile, node: &ObservedNode) -> Vec<String> {
    node.gpus
        .iter()
        .filter(|g| g.mig.is_none())
        .filter(|g| {
            profile.rules.iter().any(|r| {
                matches!(r.mode(), Ok(Mode::Mig { .. })) && r.devices.selects(g.index, &g.product)
            })
        })
        .map(ObservedGpu::describe)
        .collect()
}

/// Each GPU the plan puts in MIG mode: MIG-capable, and the driver at least the model's minimum.
fn check_mig(planned: &NodePlan, facts: &Facts, check: &mut Check) {
    let driver = facts.driver();
    for gpu in &planned.gpus {
        if !matches!(gpu.mode, PlannedMode::Mig { .. }) {
            continue;
        }
        let observed = facts
            .node
            .as_ref()
            .and_then(|n| n.gpus.iter().find(|g| g.index == gpu.index));
        if observed.is_some_and(|g| g.mig.is_none()) {
            check.fail(
                format!("GPU {} ({}) is not MIG-capable", gpu.index, gpu.product),
                "give it timeSlicing or mps instead",
            );
            continue;
        }
        let model = catalog().model_by_product(&gpu.product);
        let min = model
            .and_then(|m| m.min_driver.as_deref())
            .and_then(super::DriverVersion::parse);
        match (min, driver) {
            (Some(min), Some(driver)) if *driver < min => check.fail(
                format!(
                    "GPU {} ({}): MIG on this model needs driver ≥ {min} (MIG user guide, \
                     \"Deployment Considerations\"); this node runs {driver}",
                    gpu.index, gpu.product
                ),
                format!("upgrade the NVIDIA driver to ≥ {min}"),
            ),
            (Some(_), Some(_)) => {}
            (None, _) => check.details.push(format!(
                "GPU {} ({}): the catalog has no minimum driver for MIG on this model",
                gpu.index, gpu.product
            )),
            (_, None) => check.details.push(format!(
                "GPU {}: driver version unknown, MIG's minimum driver not checked",
                gpu.index
            )),
        }
    }
}

/// The driver branch commonly cited for MPS inside MIG devices (CUDA 11.4 / R470); NVIDIA's MIG
/// User Guide, which documents MPS on MIG, gives no minimum (docs/sources.md#nvidia-mig-user-guide).
const MPS_ON_MIG_BRANCH: u32 = 470;

/// MPS needs its control daemon, and is not available on Tegra; MPS inside MIG devices wants a
/// driver that has it.
fn check_mps(ctx: &Ctx<'_>, planned: &NodePlan, facts: &Facts, check: &mut Check) {
    let inside_mig =
        |g: &&crate::plan::GpuPlan| matches!(g.mode, PlannedMode::Mig { mps: Some(_), .. });
    let mps: Vec<String> = planned
        .gpus
        .iter()
        .filter(|g| matches!(g.mode, PlannedMode::Mps { .. }) || inside_mig(g))
        .map(|g| g.index.to_string())
        .collect();
    if mps.is_empty() {
        return;
    }
    if facts.tegra.is_some() {
        check.fail(
            "the profile asks for MPS, which Jetson/Tegra integrated GPUs do not have",
            "use timeSlicing on Jetson",
        );
        return;
    }
    let mig_mps: Vec<String> = planned
        .gpus
        .iter()
        .filter(inside_mig)
        .map(|g| g.index.to_string())
        .collect();
    match facts.driver() {
        Some(d) if !mig_mps.is_empty() && d.branch() < MPS_ON_MIG_BRANCH => check.warn(
            format!(
                "the profile runs MPS inside the MIG devices of GPU {}, but driver {} is older than R{MPS_ON_MIG_BRANCH}, the branch commonly cited for MPS on MIG (NVIDIA names no minimum)",
                mig_mps.join(", "),
                d
            ),
            "upgrade the driver, or share those MIG devices by time-slicing (`timeSlicing` beside `mig`)",
        ),
        Some(d) if !mig_mps.is_empty() => check.details.push(format!(
            "MPS inside MIG devices (GPU {}): driver {} is R{MPS_ON_MIG_BRANCH} or later",
            mig_mps.join(", "),
            d
        )),
        _ => {}
    }
    let wanted = &ctx.paths.mps_control;
    // A path given with --mps-control is used as written; a bare name is searched on PATH.
    let found = if wanted.is_absolute() {
        wanted.exists().then(|| wanted.clone())
    } else {
        find_program(&ctx.paths.root, wanted)
    };
    match found {
        Some(path) if is_executable(&path) => check.details.push(format!(
            "MPS (GPU {}): control daemon {}",
            mps.join(", "),
            path.display()
        )),
        Some(path) => check.fail(
            format!("MPS control daemon {} is not executable", path.display()),
            format!("`sudo chmod 0755 {}`", path.display()),
        ),
        None => check.fail(
            format!(
                "the profile runs MPS on GPU {}, but the MPS control daemon {} is not found{}",
                mps.join(", "),
                wanted.display(),
                if wanted.components().count() > 1 {
                    String::new()
                } else {
                    format!(" on PATH (under {})", ctx.paths.root.display())
                }
            ),
            format!(
                "install the driver's compute utilities, same version as the driver (Ubuntu: \
                 `nvidia-compute-utils-{}`; RHEL: `nvidia-driver-cuda`), or name the binary \
                 with --mps-control",
                facts
                    .driver()
                    .map_or_else(|| "<branch>".into(), |d| d.branch().to_string())
            ),
        ),
    }
}

/// `MIG on GPU 0, 1; time-slicing on GPU 2`.
fn modes(planned: &NodePlan) -> String {
    let mut by_mode: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for g in &planned.gpus {
        let mode = match g.mode {
            PlannedMode::Exclusive => "exclusive",
            PlannedMode::TimeSlicing { .. } => "time-slicing",
            PlannedMode::Mps { .. } => "MPS",
            PlannedMode::Mig { .. } => "MIG",
            PlannedMode::DynamicMig => "dynamic MIG",
        };
        by_mode.entry(mode).or_default().push(g.index.to_string());
    }
    by_mode
        .iter()
        .map(|(m, gpus)| format!("{m} on GPU {}", gpus.join(", ")))
        .collect::<Vec<_>>()
        .join("; ")
}

/// `nvidia.com/gpu: 4, nvidia.com/mig-1g.10gb: 7`.
pub(super) fn resources(resources: &BTreeMap<String, u64>) -> String {
    if resources.is_empty() {
        return "nothing".into();
    }
    resources
        .iter()
        .map(|(r, n)| format!("{r}: {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}
