//! Text output for people. Scripts use `--output json`.

use std::fmt::Write;

use super::Checked;
use crate::apply::{ApplyReport, Interrupted, InterruptedOutcome};
use crate::mig::{Geometry, GpuModel};
use crate::plan::{GpuPlan, MigModeChange, NodePlan, ObservedGpu, ObservedNode, PlannedMode};

pub(super) fn validation(results: &[Checked]) -> String {
    let mut out = String::new();
    for r in results {
        if r.problems.is_empty() {
            let _ = writeln!(out, "ok: profile {:?} ({})", r.profile, r.file);
        }
        for p in &r.problems {
            let _ = writeln!(out, "{p} ({})", r.file);
        }
    }
    let bad = results.iter().filter(|r| !r.valid).count();
    let _ = writeln!(
        out,
        "{} profile{} checked: {} valid, {bad} with errors",
        results.len(),
        if results.len() == 1 { "" } else { "s" },
        results.len() - bad
    );
    out
}

pub(super) fn plan(plan: &NodePlan, simulated: bool) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Plan for profile {:?} on {} GPU{}{}",
        plan.profile,
        plan.gpus.len(),
        if plan.gpus.len() == 1 { "" } else { "s" },
        if simulated {
            " (simulated, no instances yet)"
        } else {
            ""
        }
    );
    let _ = writeln!(
        out,
        "MIG strategy: {}{}",
        plan.mig_strategy,
        if plan.mig_strategy_derived {
            " (derived from the rules)"
        } else {
            ""
        }
    );
    for gpu in &plan.gpus {
        out.push('\n');
        gpu_section(&mut out, gpu);
    }
    let _ = writeln!(out, "\nResources the node will advertise:");
    let width = plan.resources.keys().map(String::len).max().unwrap_or(0);
    for (name, count) in &plan.resources {
        let _ = writeln!(out, "  {name:<width$}  {count}");
    }
    for w in &plan.warnings {
        let _ = writeln!(out, "\n{w}");
    }
    out
}

fn gpu_section(out: &mut String, gpu: &GpuPlan) {
    let rule = gpu.rule.as_ref().map_or("no rule".to_string(), |r| {
        let name = r
            .name
            .as_ref()
            .map(|n| format!(" {n:?}"))
            .unwrap_or_default();
        format!("rule {}{name}", r.number)
    });
    let _ = writeln!(
        out,
        "GPU {}  {}  ({rule}: {})",
        gpu.index,
        gpu.product,
        mode_summary(&gpu.mode)
    );
    match gpu.mig_mode {
        Some(MigModeChange::Enable) => out.push_str("  enable MIG mode\n"),
        Some(MigModeChange::Disable) => {}
        None => {}
    }
    if let Some(g) = &gpu.geometry {
        geometry_lines(out, g);
    }
    if gpu.mig_mode == Some(MigModeChange::Disable) {
        out.push_str("  disable MIG mode\n");
    }
    if gpu.changes_no_mig() {
        out.push_str("  no MIG change\n");
    }
}

fn geometry_lines(out: &mut String, g: &Geometry) {
    let gi = |id: Option<u32>| id.map(|i| format!(" (GI {i})")).unwrap_or_default();
    for e in &g.destroy {
        let _ = writeln!(
            out,
            "  destroy {:<10} at {}{}",
            e.profile,
            e.placement,
            gi(e.gi_id)
        );
    }
    for e in &g.keep {
        let _ = writeln!(
            out,
            "  keep    {:<10} at {}{}",
            e.profile,
            e.placement,
            gi(e.gi_id)
        );
    }
    for c in &g.create {
        let _ = writeln!(out, "  create  {:<10} at {}", c.profile, c.placement);
    }
}

fn mode_summary(mode: &PlannedMode) -> String {
    match mode {
        PlannedMode::Exclusive => "exclusive".into(),
        PlannedMode::DynamicMig => "dynamic MIG (instances made per ResourceClaim)".into(),
        PlannedMode::TimeSlicing { replicas } => format!("time-sliced × {replicas}"),
        PlannedMode::Mps {
            replicas,
            active_thread_percentage,
            pinned_memory_limit_mib,
            consumable,
        } => {
            if let Some(c) = consumable {
                return format!(
                    "MPS, consumable by up to {replicas} claims: {} MiB of memory (ask rounded to {} + n × {} MiB, {} by default) and 100% compute (rounded to {} + n × {}%, {}% by default), each claim's MPS limits its share",
                    c.memory_mib,
                    c.memory.min,
                    c.memory.step,
                    c.memory.default,
                    c.compute.min,
                    c.compute.step,
                    c.compute.default
                );
            }
            let mut s = format!("MPS × {replicas}");
            if let Some(p) = active_thread_percentage {
                let _ = write!(s, ", {p}% threads");
            }
            if let Some(m) = pinned_memory_limit_mib {
                let _ = write!(s, ", {m} MiB pinned per client");
            }
            s
        }
        PlannedMode::Mig {
            instances,
            replicas,
            mps,
        } => {
            let list: Vec<String> = instances
                .iter()
                .map(|(p, n)| format!("{n} × {p}"))
                .collect();
            let shared = match mps {
                Some(m) if !m.consumable.is_empty() => format!(
                    ", each with its own MPS daemon, consumable by up to {replicas} claims ({})",
                    m.consumable
                        .iter()
                        .map(|(profile, c)| format!(
                            "{profile}: {} MiB, asks rounded to {} + n × {} MiB and {} + n × {}% compute",
                            c.memory_mib, c.memory.min, c.memory.step, c.compute.min, c.compute.step
                        ))
                        .collect::<Vec<_>>()
                        .join("; ")
                ),
                Some(m) => {
                    let mut s = format!(", each with its own MPS daemon × {replicas}");
                    if let Some(p) = m.active_thread_percentage {
                        let _ = write!(s, ", {p}% threads");
                    }
                    for (profile, mib) in &m.pinned_memory_limit_mib {
                        let _ = write!(s, ", {mib} MiB pinned per {profile} client");
                    }
                    s
                }
                None if *replicas > 1 => format!(", each time-sliced × {replicas}"),
                None => String::new(),
            };
            format!("MIG {}{shared}", list.join(" + "))
        }
    }
}

pub(super) fn catalog(models: &Vec<GpuModel>) -> String {
    let mut out = String::new();
    for m in models {
        let _ = writeln!(
            out,
            "{}  {}  ({} memory slots, {} compute slices, {} MiB, MIG from driver {}){}",
            m.key,
            m.nvml_name,
            m.memory_slots,
            m.compute_slices,
            m.total_memory_mib,
            m.min_driver.as_deref().unwrap_or("?"),
            if m.verified {
                ""
            } else {
                "  [placements inferred]"
            }
        );
        for p in &m.gpu_instance_profiles {
            let starts: Vec<String> = p.placements.iter().map(|pl| pl.start.to_string()).collect();
            let mem = p.memory_mib.map_or("?".into(), |m| m.to_string());
            let _ = writeln!(
                out,
                "    {:<16} id {:>2}  max {}  {:>6} MiB  starts {{{}}}:{}",
                p.name,
                p.profile_id,
                p.instance_count,
                mem,
                starts.join(","),
                p.slots()
            );
            let _ = writeln!(out, "      compute instances: {}", compute_instances(p));
        }
        let _ = writeln!(out, "    memory: {}", memory_sources(m));
        let _ = writeln!(out, "    basis: {}", m.basis);
        for source in &m.sources {
            let _ = writeln!(out, "    source: {source}");
        }
    }
    out.push_str(
        "\ncompute instances: <CI profile index>:<slices>cx<max>; * = the one gpu-share creates \
         (nvidia-smi's default), ? = not seen in real nvidia-smi mig -lcip output\n",
    );
    out
}

/// What a model's MiB figures rest on, grouped by source: only NVML's are exact.
fn memory_sources(m: &GpuModel) -> String {
    use crate::mig::catalog::MemorySource;
    let mut groups: Vec<(Option<MemorySource>, Vec<&str>)> = Vec::new();
    for p in &m.gpu_instance_profiles {
        let source = p.memory_mib.map(|_| p.memory_from);
        match groups.iter_mut().find(|(s, _)| *s == source) {
            Some((_, names)) => names.push(&p.name),
            None => groups.push((source, vec![&p.name])),
        }
    }
    let parts: Vec<String> = groups
        .iter()
        .map(|(source, names)| {
            let what = match source {
                Some(MemorySource::Nvml) => "read through NVML on a real GPU (exact)",
                Some(MemorySource::NvidiaSmi) => {
                    "derived from nvidia-smi's printed GiB (drivers differ by up to 256 MiB)"
                }
                Some(MemorySource::ThirdParty) => "a third party's measurement",
                None => "unknown (no figure seen)",
            };
            if groups.len() == 1 {
                what.to_string()
            } else {
                format!("{what} for {}", names.join(", "))
            }
        })
        .collect();
    parts.join("; ")
}

/// The CI profiles a GI of this profile offers: `index:<c>cx<max>`, `*` on the one gpu-share
/// creates (nvidia-smi's default), `?` where no real `-lcip` output backs the entry.
fn compute_instances(p: &crate::mig::catalog::GpuInstanceProfile) -> String {
    let cis = crate::mig::catalog::catalog().ci_profiles(p);
    let entry = |c: &crate::mig::catalog::ComputeInstanceProfile| {
        format!(
            "{}:{}cx{}{}{}",
            c.ci_profile_index,
            c.slice_count,
            c.instance_count,
            if c.default { "*" } else { "" },
            if c.verified { "" } else { "?" }
        )
    };
    cis.iter().map(entry).collect::<Vec<_>>().join(" ")
}

/// `plan --plugin dra`: per slice, its devices by sharing mode (`--output yaml` shows them whole).
pub(super) fn resource_slices(slices: &[crate::dra::api::ResourceSlice]) -> String {
    let mut out = format!(
        "\nDRA ResourceSlices (driver {}, {} slice(s); --output yaml prints them):\n",
        crate::dra::DRIVER,
        slices.len()
    );
    for slice in slices {
        let mut by_sharing: std::collections::BTreeMap<String, usize> = Default::default();
        for device in &slice.spec.devices {
            let sharing = (device.attributes.get("sharing"))
                .and_then(|a| a.string.clone())
                .unwrap_or_else(|| "?".into());
            *by_sharing.entry(sharing).or_default() += 1;
        }
        let counts: Vec<String> = by_sharing.iter().map(|(s, n)| format!("{n} {s}")).collect();
        let _ = writeln!(
            out,
            "  {}: {} device(s) ({}), {} counter set(s)",
            slice.metadata.name.as_deref().unwrap_or("?"),
            slice.spec.devices.len(),
            counts.join(", "),
            slice.spec.shared_counters.len()
        );
    }
    out
}

/// The device-plugin config the plan would write, or its difference from the file there now.
pub(super) fn plugin_config(
    plan: &NodePlan,
    current: Option<&(std::path::PathBuf, Option<String>)>,
) -> String {
    let Some(config) = &plan.device_plugin_config else {
        return "\nDevice plugin: built-in (gpu-share's agent advertises these resources itself; no NVIDIA config)\n".into();
    };
    let new = config.to_file_text(&plan.profile);
    let mut out = String::from("\nNVIDIA device-plugin config");
    match current {
        None => {
            out.push_str(":\n");
            for line in new.lines() {
                let _ = writeln!(out, "  {line}");
            }
        }
        Some((path, Some(old))) if *old == new => {
            let _ = writeln!(out, " {}: unchanged", path.display());
        }
        Some((path, old)) => {
            let old = old.as_deref().unwrap_or("");
            let _ = writeln!(out, " {}: would change", path.display());
            let diff = similar::TextDiff::from_lines(old, &new);
            let header_old = path.display().to_string();
            let _ = write!(
                out,
                "{}",
                diff.unified_diff()
                    .context_radius(3)
                    .header(&header_old, "planned")
            );
        }
    }
    out
}

/// What became of an interrupted apply, and what of it had been done.
fn interrupted(old: &Interrupted, new_profile: &str) -> String {
    let done = match old.steps_done.as_slice() {
        [] => format!("none of its {} steps had been done", old.steps_planned),
        steps => format!(
            "{} of its {} steps had been done ({})",
            steps.len(),
            old.steps_planned,
            steps
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ")
        ),
    };
    match old.outcome {
        InterruptedOutcome::RolledForward => {
            format!("rolled forward an interrupted apply of profile {:?}: {done}", old.profile)
        }
        InterruptedOutcome::Superseded => format!(
            "an interrupted apply of profile {:?} was superseded by profile {new_profile:?}: {done}; \
             the GPUs went from where it left them to {new_profile:?}",
            old.profile
        ),
    }
}

pub(super) fn applied(report: &ApplyReport) -> String {
    let mut out = String::new();
    if let Some(old) = &report.interrupted {
        let _ = writeln!(out, "{}", interrupted(old, &report.profile));
    }
    for step in &report.steps {
        let _ = writeln!(out, "done: {step}");
    }
    for gpu in &report.reset_required {
        let _ = writeln!(
            out,
            "GPU {gpu}: the MIG mode change is pending: reset the GPU (nvidia-smi --gpu-reset -i {gpu}) or reboot, then run `gpu-share apply --resume`"
        );
    }
    let _ = writeln!(
        out,
        "profile {:?}: {} step{} ({} instance{} destroyed, {} created){}",
        report.profile,
        report.steps.len(),
        if report.steps.len() == 1 { "" } else { "s" },
        report.destroyed(),
        if report.destroyed() == 1 { "" } else { "s" },
        report.created(),
        if report.steps.is_empty() && report.reset_required.is_empty() {
            ", the GPUs already matched"
        } else {
            ""
        }
    );
    for c in &report.compute_mode.changed {
        let _ = writeln!(
            out,
            "GPU {} ({}): compute mode {} -> {}",
            c.gpu,
            c.uuid,
            c.from.map_or("unknown", |m| m.name()),
            c.to
        );
    }
    for f in &report.compute_mode.failed {
        let _ = writeln!(out, "warning: {}", f.message);
    }
    if report.plugin_config_written {
        out.push_str("device-plugin config written\n");
    }
    if let Some(pid) = report.plugin_reloaded {
        let _ = writeln!(out, "device plugin (PID {pid}) signalled to reload");
    }
    for w in &report.plan.warnings {
        let _ = writeln!(out, "{w}");
    }
    out
}

pub(super) fn status(node: &ObservedNode) -> String {
    let mut out = String::new();
    for gpu in &node.gpus {
        gpu_status(&mut out, gpu);
    }
    if node.gpus.is_empty() {
        out.push_str("no GPUs found\n");
    }
    out
}

fn gpu_status(out: &mut String, gpu: &ObservedGpu) {
    if let Some(board) = &gpu.tegra {
        let _ = writeln!(
            out,
            "GPU {}  {}  Jetson/Tegra integrated GPU ({}), found without NVML: time-slicing only \
             (no MIG, no MPS)",
            gpu.index,
            gpu.product,
            [&board.release, &board.soc]
                .into_iter()
                .flatten()
                .cloned()
                .collect::<Vec<_>>()
                .join(", "),
        );
        return;
    }
    let mig = match gpu.mig {
        None => "MIG not supported".to_string(),
        Some(m) if m.current == m.pending => format!("MIG {}", on_off(m.current)),
        Some(m) => format!(
            "MIG {} (pending {}: needs a GPU reset)",
            on_off(m.current),
            on_off(m.pending)
        ),
    };
    let compute = gpu
        .compute_mode
        .map_or(String::new(), |m| format!("  compute mode {m}"));
    let _ = writeln!(
        out,
        "GPU {}  {}  {}  {}  {} MiB  {mig}{compute}",
        gpu.index,
        gpu.product,
        gpu.uuid.as_deref().unwrap_or("-"),
        gpu.pci_bus_id.as_deref().unwrap_or("-"),
        gpu.memory_mib.map_or("?".into(), |m| m.to_string()),
    );
    for i in &gpu.instances {
        let gi = i.gi_id;
        let cis: Vec<String> = gpu
            .compute_instances
            .iter()
            .filter(|c| Some(c.gi_id) == gi)
            .map(|c| format!("CI {} {}", c.ci_id, c.uuid.as_deref().unwrap_or("-")))
            .collect();
        let pids: Vec<String> = gpu
            .processes
            .iter()
            .filter(|p| p.gi_id.is_some() && p.gi_id == gi)
            .map(|p| p.pid.to_string())
            .collect();
        let _ = writeln!(
            out,
            "  GI {:<3} {:<12} at {}  {}{}",
            gi.map_or("?".into(), |g| g.to_string()),
            i.profile,
            i.placement,
            if cis.is_empty() {
                "no compute instance".to_string()
            } else {
                cis.join(", ")
            },
            if pids.is_empty() {
                String::new()
            } else {
                format!("  PIDs {}", pids.join(", "))
            }
        );
    }
    if gpu.instances.is_empty() {
        let pids: Vec<String> = gpu.processes.iter().map(|p| p.pid.to_string()).collect();
        if !pids.is_empty() {
            let _ = writeln!(out, "  PIDs {}", pids.join(", "));
        }
    }
}

fn on_off(on: bool) -> &'static str {
    if on {
        "on"
    } else {
        "off"
    }
}

/// An error and its causes, each said once: `message: cause: cause`, leaving out a cause whose
/// words are already there. gpu-share's own errors either say their cause or return it as
/// `source()`, never both; some libraries' errors do both (kube's config errors quote the
/// file error and return it too, nvml-wrapper's quote libloading's), and `{:#}` would repeat
/// them.
pub(super) fn error_chain(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let part = cause.to_string();
        if text.is_empty() {
            text = part;
        } else if !text.contains(&part) {
            text = format!("{text}: {part}");
        }
    }
    text
}

/// `plan --advertised`: per device ID advertised now, whether a pod holding it stays or is
/// evicted before the new advertisement is written, and why.
pub fn reallocation(
    path: &std::path::Path,
    verdicts: &[crate::agent::advertisement::DeviceVerdict],
) -> String {
    let evicted = verdicts.iter().filter(|v| v.evicts_holder).count();
    let mut out = format!(
        "\nDevices advertised now ({}): a pod holding one of {evicted} of {} is evicted first\n",
        path.display(),
        verdicts.len()
    );
    for v in verdicts {
        let fate = if v.evicts_holder {
            "holder evicted"
        } else {
            "holder stays  "
        };
        out += &format!("  {fate}  {}: {}\n", v.id, v.why);
    }
    out
}

#[cfg(test)]
mod tests {
    use std::error::Error;

    use super::*;
    use crate::apply::compute_mode::RecordError;
    use crate::apply::ApplyError;
    use crate::gpu::{GpuError, NvmlCallError};
    use crate::mps::daemon::MpsError;
    use crate::nvidia_plugin::ReloadError;

    /// Whether some error in `e`'s chain says its cause and also returns it as `source()`.
    fn says_a_cause_twice(e: &(dyn Error + 'static)) -> bool {
        let mut level = Some(e);
        while let Some(error) = level {
            if let Some(source) = error.source() {
                if error.to_string().contains(&source.to_string()) {
                    return true;
                }
            }
            level = error.source();
        }
        false
    }

    fn io() -> std::io::Error {
        std::io::Error::from(std::io::ErrorKind::NotFound)
    }

    /// At the root: each of our error types that wraps a cause says it once,
    /// whatever prints it (`{e}` in logs and Events, the chain on the command line).
    #[test]
    fn our_errors_say_their_cause_once() {
        let call = NvmlCallError {
            call: "nvmlComputeInstanceDestroy",
            code: 19,
            text: "In use by another client".into(),
        };
        let errors: Vec<Box<dyn Error + 'static>> = vec![
            Box::new(ApplyError::Gpu(GpuError::Call {
                index: 0,
                cause: call,
            })),
            Box::new(ApplyError::Journal {
                dir: "/var/lib/gpu-share".into(),
                cause: io(),
            }),
            Box::new(ApplyError::PluginConfig {
                path: "/config.yaml".into(),
                cause: io(),
            }),
            Box::new(ApplyError::Reload(ReloadError::PidFile {
                path: "/plugin.pid".into(),
                cause: io(),
            })),
            Box::new(ApplyError::ComputeModeRecord(RecordError {
                action: "write",
                path: "/record.json".into(),
                cause: io(),
            })),
            Box::new(ApplyError::Mps(MpsError::Root {
                root: "/run/nvidia/mps".into(),
                action: "list",
                path: "/run/nvidia/mps".into(),
                cause: io(),
            })),
        ];
        for e in &errors {
            assert!(!says_a_cause_twice(e.as_ref()), "{e}");
        }
    }

    #[test]
    fn a_library_error_that_repeats_its_cause_is_printed_with_it_once() {
        /// As kube's config errors are: the cause in the message and as `source()`.
        #[derive(Debug, thiserror::Error)]
        #[error("failed to read kubeconfig: {0}")]
        struct Repeats(#[source] std::io::Error);

        let e = anyhow::Error::new(Repeats(io())).context("cannot find the Kubernetes API");
        assert_eq!(
            error_chain(&e),
            format!(
                "cannot find the Kubernetes API: failed to read kubeconfig: {}",
                io()
            )
        );
    }
}
