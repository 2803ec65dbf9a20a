//! The executor: observe the GPUs, plan, and carry out the MIG steps through the NVML door,
//! journaled so that a crash at any step is rolled forward by the next run.
//!
//! Safety rules, in order: an invalid profile or impossible geometry changes nothing; an
//! instance (or a GPU whose MIG mode changes) with running processes is not touched unless
//! forced, and the PIDs are named; a MIG mode change the driver leaves pending is reported as
//! needing a reset, not as applied; after the steps the node is read back and must match.
//!
//! Then the sharing: whole GPUs shared through MPS are put in EXCLUSIVE_PROCESS compute mode
//! ([`compute_mode`]), the MPS daemons are reconciled, GPUs that left MPS go back to DEFAULT, and
//! the device-plugin config is published.

pub mod compute_mode;
mod journal;

use std::path::PathBuf;

use serde::Serialize;
use tracing::{info, warn};

pub use compute_mode::ComputeModeReport;
pub use journal::Journal;

use crate::gpu::{GpuError, Gpus, MigModeOutcome};
use crate::mig::catalog;
use crate::mps::daemon::{self, MpsError, MpsReport, MpsSettings};
use crate::nvidia_plugin::{reload, write_if_changed, ReloadError, SignalTarget};
use crate::plan::{steps, NodePlan, ObservedNode, Step, ValidProfile};
use crate::profile::{Problem, Profile};
use crate::sharing::PluginKind;

/// How to apply.
#[derive(Debug, Clone)]
pub struct ApplyOptions {
    /// Where the journal lives.
    pub state_dir: PathBuf,
    /// Skip the running-process check (the driver may still refuse with "In use").
    pub force: bool,
    /// Where to write the NVIDIA device-plugin config, and how to make the plugin reload it.
    pub device_plugin: Option<DevicePluginOutput>,
    /// MPS control daemons: started for the GPUs the profile shares by MPS, stopped when it no
    /// longer asks for them.
    pub mps: MpsSettings,
    /// Which device plugin advertises the GPUs: the profile is planned for it, and only the
    /// NVIDIA plugin gets a config file.
    pub plugin: PluginKind,
}

/// The device plugin's config file and its reload.
#[derive(Debug, Clone)]
pub struct DevicePluginOutput {
    pub config_path: PathBuf,
    /// `None`: write only (the plugin is restarted some other way).
    pub reload: Option<SignalTarget>,
}

/// What an apply did.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ApplyReport {
    pub profile: String,
    /// An interrupted apply found in the journal, when there was one, and what became of it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interrupted: Option<Interrupted>,
    /// Steps carried out, in order.
    pub steps: Vec<Step>,
    /// GPUs whose MIG mode change waits for a GPU reset or reboot.
    pub reset_required: Vec<u32>,
    /// Whether the device-plugin config file was rewritten (false: unchanged or not asked).
    pub plugin_config_written: bool,
    /// The PID of the device plugin that was sent SIGHUP.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plugin_reloaded: Option<i32>,
    /// MPS daemons started, restarted and stopped.
    pub mps: MpsReport,
    /// Compute modes set for MPS (EXCLUSIVE_PROCESS) and back (DEFAULT), and those NVML refused.
    pub compute_mode: ComputeModeReport,
    pub plan: NodePlan,
}

impl ApplyReport {
    pub fn destroyed(&self) -> usize {
        self.count(|s| matches!(s, Step::DestroyInstance { .. }))
    }

    pub fn created(&self) -> usize {
        self.count(|s| matches!(s, Step::CreateInstance { .. }))
    }

    fn count(&self, f: impl Fn(&Step) -> bool) -> usize {
        self.steps.iter().filter(|s| f(s)).count()
    }
}

/// An interrupted apply found in the journal: what it had done, and whether this apply finished
/// its job or replaced it with another profile.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Interrupted {
    /// The profile the interrupted apply was making the node match.
    pub profile: String,
    pub outcome: InterruptedOutcome,
    /// Its steps that had completed before it stopped, in order (none when it failed at once).
    pub steps_done: Vec<Step>,
    /// How many steps it had planned.
    pub steps_planned: usize,
}

/// What an apply did with the interrupted one it found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum InterruptedOutcome {
    /// Same profile (`apply --resume`, or the same file again): its job is finished from the
    /// GPUs' current state.
    RolledForward,
    /// Another profile (or another version of it) was applied instead: the interrupted one's
    /// remaining steps were dropped and the GPUs taken from where they were to the new one.
    Superseded,
}

impl Interrupted {
    /// What `journal` left becomes when `name`'s `profile` is applied.
    fn found(journal: Journal, name: &str, profile: &Profile) -> Self {
        let outcome = if journal.profile_name == name && journal.profile == *profile {
            InterruptedOutcome::RolledForward
        } else {
            InterruptedOutcome::Superseded
        };
        Interrupted {
            steps_done: journal.carried_out().cloned().collect(),
            steps_planned: journal.steps.len(),
            profile: journal.profile_name,
            outcome,
        }
    }
}

/// An instance that cannot be touched because processes run on it.
#[derive(Debug, Clone, Serialize)]
pub struct Busy {
    pub step: Step,
    pub pids: Vec<u32>,
}

/// Why an apply stopped. A message that says its cause does not also return it as `source()`
/// (printed with its chain, the cause would show twice).
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("the profile cannot be applied to this node; nothing was changed")]
    Invalid(Vec<Problem>),
    #[error("{}", busy_message(.0))]
    Busy(Vec<Busy>),
    #[error(transparent)]
    Gpu(#[from] GpuError),
    #[error("cannot write the journal in {dir}: {cause}")]
    Journal { dir: String, cause: std::io::Error },
    #[error("after applying, the GPUs still differ from the plan: {}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Verify(Vec<Step>),
    #[error("no interrupted apply to resume: the state dir {0} has no journal")]
    NothingToResume(String),
    #[error("cannot write the device-plugin config {path}: {cause}")]
    PluginConfig { path: String, cause: std::io::Error },
    #[error(transparent)]
    Reload(#[from] ReloadError),
    #[error(transparent)]
    Mps(#[from] MpsError),
    #[error(transparent)]
    ComputeModeRecord(#[from] compute_mode::RecordError),
}

fn busy_message(busy: &[Busy]) -> String {
    let parts: Vec<String> = busy
        .iter()
        .map(|b| {
            let pids: Vec<String> = b.pids.iter().map(u32::to_string).collect();
            format!("{} is in use by PID {}", b.step, pids.join(", "))
        })
        .collect();
    format!(
        "refusing to change instances with running processes (stop them, or pass --force): {}",
        parts.join("; ")
    )
}

/// Make the node match `profile` (named `name`).
pub fn apply(
    gpus: &Gpus,
    name: &str,
    profile: &Profile,
    opts: &ApplyOptions,
) -> Result<ApplyReport, ApplyError> {
    let valid = ValidProfile::check(name, profile, opts.plugin).map_err(ApplyError::Invalid)?;
    apply_decided(gpus, &valid, opts, None)
}

/// A plan the caller decided on: the GPUs as it read them and the plan of the profile on them.
pub struct Decided {
    pub observed: ObservedNode,
    pub plan: NodePlan,
}

/// [`apply`] of a profile validated already (`valid`), carrying out the caller's `decided`
/// plan (the agent's, made from its last inventory or fresh reads) when it needs no MIG step:
/// the sharing settings and the plugin config follow from the GPUs' identities and MIG
/// layout, which only MIG steps change, so neither NVML is read nor the profile planned again.
/// MIG steps are never run from it: when the decided plan has any, or an interrupted apply is
/// to be rolled forward, the GPUs are read again and planned on.
pub fn apply_decided(
    gpus: &Gpus,
    valid: &ValidProfile,
    opts: &ApplyOptions,
    decided: Option<Decided>,
) -> Result<ApplyReport, ApplyError> {
    let (name, profile) = (valid.name(), valid.profile());
    let interrupted = leftover(opts)?.map(|j| Interrupted::found(j, name, profile));
    if let Some(i) = &interrupted {
        let what = match i.outcome {
            InterruptedOutcome::RolledForward => {
                "found an interrupted apply; rolling forward from the GPUs' current state"
            }
            InterruptedOutcome::Superseded => {
                "found an interrupted apply of another profile; the new profile supersedes it"
            }
        };
        warn!(
            profile = %i.profile,
            done = i.steps_done.len(),
            steps = i.steps_planned,
            "{what}"
        );
    }
    let decided = decided.filter(|_| interrupted.is_none()).map(|d| {
        let todo = steps(&d.plan, &d.observed);
        (d.observed, d.plan, todo)
    });
    let (observed, node_plan, todo) = match decided {
        Some((observed, node_plan, todo)) if todo.is_empty() => (observed, node_plan, todo),
        // MIG steps to run: decided on fresh reads only.
        _ => planned(valid, gpus.observe()?)?,
    };
    let busy = busy_steps(&todo, &observed);
    if !busy.is_empty() && !opts.force {
        return Err(ApplyError::Busy(busy));
    }
    let mut report = ApplyReport {
        profile: name.to_string(),
        interrupted,
        steps: Vec::new(),
        reset_required: Vec::new(),
        plugin_config_written: false,
        plugin_reloaded: None,
        mps: MpsReport::default(),
        compute_mode: ComputeModeReport::default(),
        plan: node_plan,
    };
    if todo.is_empty() {
        info!(profile = name, "the GPUs already match the profile");
        remove_journal(opts)?;
        share(gpus, &mut report, &observed, opts)?;
        return Ok(report);
    }
    let mut journal = Journal {
        profile_name: name.to_string(),
        profile: profile.clone(),
        steps: todo.clone(),
        done: 0,
        waiting_for_reset: Vec::new(),
    };
    save_journal(&journal, opts)?;
    for step in todo {
        if report.reset_required.contains(&step.gpu()) {
            journal.done += 1;
            continue;
        }
        info!(%step, "applying");
        if execute(gpus, &step)? == MigModeOutcome::Applied {
            report.steps.push(step);
        } else {
            warn!(%step, "MIG mode change is pending: the GPU needs a reset (or reboot) before its instances can be created");
            report.reset_required.push(step.gpu());
            journal.waiting_for_reset.push(step.gpu());
        }
        journal.done += 1;
        save_journal(&journal, opts)?;
    }
    let observed = verify(gpus, valid, &report.reset_required)?;
    if report.reset_required.is_empty() {
        remove_journal(opts)?;
    }
    share(gpus, &mut report, &observed, opts)?;
    Ok(report)
}

/// After the MIG layout: EXCLUSIVE_PROCESS on whole MPS GPUs, the MPS daemons the plan needs
/// (the plugin waits for them), DEFAULT back on GPUs that left MPS, then the device-plugin
/// config. A compute mode NVML refuses is a warning in the report, never a reason to stop.
fn share(
    gpus: &Gpus,
    report: &mut ApplyReport,
    observed: &ObservedNode,
    opts: &ApplyOptions,
) -> Result<(), ApplyError> {
    let specs = daemon::specs_from_plan(&report.plan.gpus, report.plan.mig_strategy, observed)?;
    let mut settings = opts.mps.clone();
    if let Some(config) = &mut report.plan.device_plugin_config {
        if config.flags.mps_root.is_some() {
            // The plugin mounts the daemons' pipes from where they really are.
            config.flags.mps_root = Some(settings.root.display().to_string());
        }
        if let Some(mps) = &config.sharing.mps {
            // NVIDIA's `mps-control-daemon wait` compares `.ready` with the config's sharing.mps.
            settings.ready_contents = serde_json::to_string(mps).expect("serialisable");
        }
    }
    if !specs.is_empty() {
        // Clients reach the daemons through /dev/shm: NVIDIA's tmpfs at <root>/shm is expected
        // there (`gpu-share mps mount-shm`); without it MPS may still work, so only warn.
        let proc = std::path::Path::new("/proc");
        if let Some(why) = crate::mps::shm::warning(&settings.root, proc) {
            warn!("{why}");
        }
    }
    let mut modes =
        compute_mode::Executor::new(gpus, &opts.state_dir, &report.plan, &observed.gpus)?;
    modes.before_mps(&mut report.compute_mode)?;
    if !specs.is_empty() || settings.root.exists() {
        report.mps = daemon::reconcile(&settings, &specs)?;
    }
    modes.after_mps(&mut report.compute_mode)?;
    publish_plugin_config(report, opts)
}

/// Write the device-plugin config if it changed, then signal the plugin to reload it.
fn publish_plugin_config(report: &mut ApplyReport, opts: &ApplyOptions) -> Result<(), ApplyError> {
    // The built-in plugin (no NVIDIA config planned) is updated by the agent, not through a file.
    let (Some(out), Some(config)) = (&opts.device_plugin, &report.plan.device_plugin_config) else {
        return Ok(());
    };
    let text = config.to_file_text(&report.profile);
    // A reload that is due is remembered in the state dir until the plugin has taken it: a
    // plugin that is down when signalled (or a crash before the signal) must not be masked by
    // the next run finding the file already up to date.
    let owed = out.reload.is_some() && reload_owed(opts);
    if out.reload.is_some()
        && !owed
        && (!report.steps.is_empty() || config_differs(&out.config_path, &text))
    {
        set_reload_owed(opts, true)?;
    }
    report.plugin_config_written =
        write_if_changed(&out.config_path, &text).map_err(|cause| ApplyError::PluginConfig {
            path: out.config_path.display().to_string(),
            cause,
        })?;
    if report.plugin_config_written {
        info!(path = %out.config_path.display(), "device-plugin config written");
    }
    // The plugin enumerates MIG devices when it (re)starts: a MIG change under an unchanged
    // config (same profile names, other counts) must reload it too (NVIDIA DP#992).
    if !report.plugin_config_written && report.steps.is_empty() && !owed {
        return Ok(());
    }
    if let Some(target) = &out.reload {
        if owed {
            info!("retrying a device-plugin reload that has not succeeded yet");
        }
        let pid = reload(target)?;
        info!(pid, "device plugin signalled to reload (SIGHUP)");
        report.plugin_reloaded = Some(pid);
        set_reload_owed(opts, false)?;
    }
    Ok(())
}

/// In the state dir while a device-plugin reload is due and has not succeeded.
const RELOAD_OWED: &str = "device-plugin-reload-owed";

fn reload_owed(opts: &ApplyOptions) -> bool {
    opts.state_dir.join(RELOAD_OWED).exists()
}

fn set_reload_owed(opts: &ApplyOptions, owed: bool) -> Result<(), ApplyError> {
    let path = opts.state_dir.join(RELOAD_OWED);
    let result = if owed {
        crate::atomic_file::replace(
            &path,
            b"the device plugin has not reloaded its config since it last changed\n",
            crate::atomic_file::READABLE_BY_ALL,
        )
    } else {
        crate::atomic_file::remove(&path)
    };
    result.map_err(|source| journal_error(opts, source))
}

fn config_differs(path: &std::path::Path, text: &str) -> bool {
    std::fs::read(path).map_or(true, |current| current != text.as_bytes())
}

/// Whether the state dir can hold the journal (created if missing): checked before anything
/// irreversible that precedes the first journal write, such as the agent's drain.
pub fn check_state_dir(opts: &ApplyOptions) -> Result<(), ApplyError> {
    std::fs::create_dir_all(&opts.state_dir)
        .and_then(|()| tempfile::NamedTempFile::new_in(&opts.state_dir))
        .map(drop)
        .map_err(|source| journal_error(opts, source))
}

/// Roll an interrupted apply forward to its profile, as recorded in the journal.
pub fn resume(gpus: &Gpus, opts: &ApplyOptions) -> Result<ApplyReport, ApplyError> {
    let journal = leftover(opts)?
        .ok_or_else(|| ApplyError::NothingToResume(opts.state_dir.display().to_string()))?;
    apply(gpus, &journal.profile_name, &journal.profile, opts)
}

fn execute(gpus: &Gpus, step: &Step) -> Result<MigModeOutcome, GpuError> {
    let profile_of = |gpu: u32, name: &str| {
        let product = gpus.observe_product(gpu)?;
        catalog()
            .model_by_product(&product)
            .and_then(|m| m.profile(name))
            .cloned()
            .ok_or(GpuError::UnknownModel {
                index: gpu,
                product,
            })
    };
    match step {
        Step::DestroyInstance { gpu, gi_id, .. } => gpus.destroy_instance(*gpu, *gi_id)?,
        Step::SetMigMode { gpu, enable } => return gpus.set_mig_mode(*gpu, *enable),
        Step::CreateInstance {
            gpu,
            profile,
            placement,
        } => {
            gpus.create_instance(*gpu, &profile_of(*gpu, profile)?, *placement)?;
        }
        Step::CompleteInstance {
            gpu,
            gi_id,
            profile,
        } => gpus.complete_instance(*gpu, *gi_id, &profile_of(*gpu, profile)?)?,
    }
    Ok(MigModeOutcome::Applied)
}

/// Steps that would touch instances (or whole GPUs) with running processes.
fn busy_steps(todo: &[Step], observed: &ObservedNode) -> Vec<Busy> {
    todo.iter()
        .filter_map(|step| {
            let gpu = observed.gpus.iter().find(|g| g.index == step.gpu())?;
            let pids: Vec<u32> = gpu
                .processes
                .iter()
                .filter(|p| match step {
                    Step::DestroyInstance { gi_id, .. } => p.gi_id == Some(*gi_id),
                    Step::SetMigMode { .. } => true,
                    _ => false,
                })
                .map(|p| p.pid)
                .collect();
            (!pids.is_empty()).then(|| Busy {
                step: step.clone(),
                pids,
            })
        })
        .collect()
}

/// `observed`, the plan of `profile` for it, and the MIG steps that plan needs.
fn planned(
    valid: &ValidProfile,
    observed: ObservedNode,
) -> Result<(ObservedNode, NodePlan, Vec<Step>), ApplyError> {
    let node_plan = valid.plan(&observed).map_err(ApplyError::Invalid)?;
    let todo = steps(&node_plan, &observed);
    Ok((observed, node_plan, todo))
}

/// Read the GPUs back: every GPU not waiting for a reset must now need no step.
fn verify(gpus: &Gpus, valid: &ValidProfile, waiting: &[u32]) -> Result<ObservedNode, ApplyError> {
    let observed = gpus.observe()?;
    let node_plan = valid.plan(&observed).map_err(ApplyError::Invalid)?;
    let left: Vec<Step> = steps(&node_plan, &observed)
        .into_iter()
        .filter(|s| !waiting.contains(&s.gpu()))
        .collect();
    if left.is_empty() {
        Ok(observed)
    } else {
        Err(ApplyError::Verify(left))
    }
}

fn leftover(opts: &ApplyOptions) -> Result<Option<Journal>, ApplyError> {
    Journal::load(&opts.state_dir).map_err(|source| journal_error(opts, source))
}

fn save_journal(journal: &Journal, opts: &ApplyOptions) -> Result<(), ApplyError> {
    journal
        .save(&opts.state_dir)
        .map_err(|source| journal_error(opts, source))
}

fn remove_journal(opts: &ApplyOptions) -> Result<(), ApplyError> {
    Journal::remove(&opts.state_dir).map_err(|source| journal_error(opts, source))
}

fn journal_error(opts: &ApplyOptions, source: std::io::Error) -> ApplyError {
    ApplyError::Journal {
        dir: opts.state_dir.display().to_string(),
        cause: source,
    }
}
