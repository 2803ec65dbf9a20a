//! MPS control daemons: one `nvidia-cuda-mps-control -d` per shared resource name, laid out the
//! way NVIDIA's mps-control-daemon does it (shared/reference/nvidia-stack.md §1.7):
//!
//! ```text
//! <root>/<resource>/pipe/      CUDA_MPS_PIPE_DIRECTORY (the daemon's pid file and socket)
//! <root>/<resource>/log/       CUDA_MPS_LOG_DIRECTORY (control.log)
//! <root>/<resource>/.started   the daemon runs and has its settings
//! <root>/.ready                every wanted daemon runs
//! ```
//!
//! e.g. `/run/nvidia/mps/nvidia.com/gpu/pipe`. MPS inside MIG devices needs one daemon per MIG
//! device (MIG User Guide), each in `<root>/<resource>/<MIG UUID>/`, e.g.
//! `/run/nvidia/mps/nvidia.com/mig-3g.40gb/MIG-…/pipe`; a daemon's "resource" below is this
//! directory name. `<root>/shm` is the tmpfs daemons and clients share as `/dev/shm`.
//!
//! The daemon sees its GPUs through
//! `CUDA_VISIBLE_DEVICES` (their UUIDs), so a device index in a control command is the GPU's
//! position in that list. Limits are set as the daemon's defaults (`set_default_*`), which only
//! reach servers spawned later: changing them means restarting the daemon. What was applied is
//! kept in `<root>/<resource>/.gpu-share-mps.json`, with the daemon's pid.
//!
//! [`reconcile`] is idempotent; the agent calls it periodically. Every control command goes
//! through the control binary's client mode (`echo CMD | nvidia-cuda-mps-control`), as NVIDIA's
//! plugin does: the daemon's own transport is private.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};
use tracing::{debug, info, warn};

use crate::plan::{GpuPlan, NodePlan, ObservedNode, PlannedMode};

/// The control binary, found on `PATH`.
pub const DEFAULT_CONTROL_BINARY: &str = "nvidia-cuda-mps-control";
/// The root NVIDIA's helm chart and GPU Operator use.
pub const DEFAULT_ROOT: &str = "/run/nvidia/mps";
/// Written by the daemon into its pipe directory.
pub const PID_FILE: &str = "nvidia-cuda-mps-control.pid";
/// What the plugin sends to check a daemon, and what reads back the thread percentage.
pub const HEALTH_COMMAND: &str = "get_default_active_thread_percentage";
/// `<root>/shm`: the tmpfs mounted as `/dev/shm` for the daemons and their clients.
pub const SHM_DIR: &str = "shm";
const STARTED: &str = ".started";
const READY: &str = ".ready";
const APPLIED: &str = ".gpu-share-mps.json";
/// The daemon listens on `<pipe dir>/control`; a Unix socket path has at most 107 bytes.
const SOCKET_NAME: &str = "control";
const MAX_SOCKET_PATH: usize = 107;
/// What the client prints when nothing listens on the pipe directory.
const NO_DAEMON: &str = "Cannot find MPS control daemon process";
const POLL: Duration = Duration::from_millis(20);

/// Where the daemons live and how to run them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpsSettings {
    /// `nvidia-cuda-mps-control`: a path, or a name looked up on `PATH`. Its file name must be
    /// the daemon's process name (`/proc/<pid>/comm`), which tells a live daemon from a process
    /// that got a crashed daemon's pid.
    pub control_binary: PathBuf,
    /// Parent of every daemon's directories.
    pub root: PathBuf,
    /// The longest wait for one control command, for a new daemon to come up, or for a stopped
    /// one to exit (then it is sent SIGTERM, and SIGKILL after as long again).
    pub timeout: Duration,
    /// What `<root>/.ready` holds. Empty by default; NVIDIA's own `mps-control-daemon` writes
    /// the JSON of the plugin config's `sharing.mps` there, and its `wait` command compares it.
    pub ready_contents: String,
}

impl Default for MpsSettings {
    fn default() -> Self {
        MpsSettings {
            control_binary: PathBuf::from(DEFAULT_CONTROL_BINARY),
            root: PathBuf::from(DEFAULT_ROOT),
            timeout: Duration::from_secs(10),
            ready_contents: String::new(),
        }
    }
}

impl MpsSettings {
    /// `CUDA_MPS_PIPE_DIRECTORY` of `resource`'s daemon (also what its clients must use).
    pub fn pipe_dir(&self, resource: &str) -> PathBuf {
        self.root.join(resource).join("pipe")
    }

    /// `CUDA_MPS_LOG_DIRECTORY` of `resource`'s daemon.
    pub fn log_dir(&self, resource: &str) -> PathBuf {
        self.root.join(resource).join("log")
    }

    /// `<root>/.ready`: present while every wanted daemon runs.
    pub fn ready_file(&self) -> PathBuf {
        self.root.join(READY)
    }

    /// `<root>/<resource>/.started`.
    pub fn started_file(&self, resource: &str) -> PathBuf {
        self.root.join(resource).join(STARTED)
    }
}

/// One daemon: the GPUs shared under one resource name, and its default limits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DaemonSpec {
    /// The advertised resource, e.g. `nvidia.com/gpu`; also the directory under the root.
    pub resource: String,
    /// In daemon order: `gpus[i].index_in_daemon == i`.
    pub gpus: Vec<MpsGpu>,
    /// `set_default_active_thread_percentage`; `None` leaves the daemon's 100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_thread_percentage: Option<u32>,
}

/// A GPU of a daemon.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MpsGpu {
    /// NVML index.
    pub nvml_index: u32,
    /// `GPU-…`; `None` when unknown (a simulated node). If any GPU of a daemon has none, the
    /// daemon gets NVML indices in `CUDA_VISIBLE_DEVICES` instead, with
    /// `CUDA_DEVICE_ORDER=PCI_BUS_ID` so CUDA numbers the GPUs the way NVML does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// The device index in the daemon's commands: its position in `CUDA_VISIBLE_DEVICES`.
    pub index_in_daemon: u32,
    /// `set_default_device_pinned_mem_limit <index_in_daemon> <N>M`; `None`: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pinned_memory_limit_mib: Option<u64>,
}

impl DaemonSpec {
    /// The daemon's `CUDA_VISIBLE_DEVICES`, and whether it lists NVML indices (no UUIDs known).
    pub fn visible_devices(&self) -> (String, bool) {
        if self.gpus.iter().all(|g| g.uuid.is_some()) {
            let ids: Vec<&str> = self.gpus.iter().filter_map(|g| g.uuid.as_deref()).collect();
            (ids.join(","), false)
        } else {
            let ids: Vec<String> = self.gpus.iter().map(|g| g.nvml_index.to_string()).collect();
            (ids.join(","), true)
        }
    }

    /// The control commands that give a fresh daemon this spec's settings, in the order
    /// NVIDIA's mps-control-daemon sends them: pinned memory per device, then threads.
    pub fn commands(&self) -> Vec<String> {
        let mut commands: Vec<String> = self
            .gpus
            .iter()
            .filter_map(|g| {
                g.pinned_memory_limit_mib.map(|mib| {
                    format!(
                        "set_default_device_pinned_mem_limit {} {mib}M",
                        g.index_in_daemon
                    )
                })
            })
            .collect();
        if let Some(p) = self.active_thread_percentage {
            commands.push(format!("set_default_active_thread_percentage {p}"));
        }
        commands
    }
}

/// What [`reconcile`] did, by resource.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MpsReport {
    /// Daemons started where none had been.
    pub started: Vec<String>,
    /// Daemons replaced: crashed, hung, or with other settings.
    pub restarted: Vec<Restart>,
    /// Daemons no longer wanted, quit and cleaned up.
    pub stopped: Vec<String>,
    /// Daemons already running as wanted.
    pub unchanged: Vec<String>,
    /// `<root>/.ready` exists: every wanted daemon runs (false when none is wanted).
    pub ready: bool,
}

impl MpsReport {
    /// True when nothing was started, restarted or stopped.
    pub fn is_unchanged(&self) -> bool {
        self.started.is_empty() && self.restarted.is_empty() && self.stopped.is_empty()
    }
}

/// A daemon replaced, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Restart {
    pub resource: String,
    pub reason: String,
}

/// Why a daemon could not be brought to its spec. Each names the resource and its pipe
/// directory; a failed command is quoted.
#[derive(Debug, thiserror::Error)]
pub enum MpsError {
    #[error("MPS resource {resource:?}: {message}")]
    Spec { resource: String, message: String },
    #[error("MPS resource {resource:?} (pipe dir {}): cannot {action} {}: {cause}", .pipe_dir.display(), .path.display())]
    Io {
        resource: String,
        pipe_dir: PathBuf,
        action: &'static str,
        path: PathBuf,
        cause: io::Error,
    },
    #[error("MPS resource {resource:?} (pipe dir {}): `{command}` failed: {detail}", .pipe_dir.display())]
    Command {
        resource: String,
        pipe_dir: PathBuf,
        command: String,
        detail: String,
    },
    #[error("MPS root {}: cannot {action} {}: {cause}", .root.display(), .path.display())]
    Root {
        root: PathBuf,
        action: &'static str,
        path: PathBuf,
        cause: io::Error,
    },
    /// Some daemons could not be brought up or stopped; the others were, as the report says.
    #[error("{}", .errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Incomplete {
        report: Box<MpsReport>,
        errors: Vec<MpsError>,
    },
}

/// The daemon directory of MIG device `uuid` advertised as `resource`.
pub fn mig_daemon_name(resource: &str, uuid: &str) -> String {
    format!("{resource}/{uuid}")
}

/// One daemon per resource name that MPS GPUs are advertised under, with the GPUs in NVML
/// order, and one per MIG device shared through MPS. Fails when GPUs of one resource want
/// different active thread percentages: a daemon has one default. Pinned memory limits are per
/// GPU, so they may differ.
pub fn specs_from_plan(
    plan: &NodePlan,
    observed: &ObservedNode,
) -> Result<Vec<DaemonSpec>, MpsError> {
    let mut specs = whole_gpu_specs(plan, observed)?;
    specs.extend(mig_device_specs(plan, observed)?);
    Ok(specs)
}

/// A daemon for each MIG device of a GPU whose plan shares its MIG devices through MPS, seeing
/// only that device (`CUDA_VISIBLE_DEVICES=<MIG UUID>`, so its device index is 0).
fn mig_device_specs(plan: &NodePlan, observed: &ObservedNode) -> Result<Vec<DaemonSpec>, MpsError> {
    let mut specs = Vec::new();
    for gpu in &plan.gpus {
        let PlannedMode::Mig {
            replicas,
            mps: Some(mps),
            ..
        } = &gpu.mode
        else {
            continue;
        };
        let Some(seen) = observed.gpus.iter().find(|o| o.index == gpu.index) else {
            continue;
        };
        for device in seen.mig_devices() {
            let resource = crate::plan::mig_resource(
                device.profile,
                plan.mig_strategy,
                renamed(gpu),
                *replicas,
            );
            let Some(uuid) = device.uuid else {
                return Err(MpsError::Spec {
                    resource,
                    message: format!(
                        "the {} MIG device (GPU {}, GPU instance {}, compute instance {}) has no UUID, which its MPS daemon's CUDA_VISIBLE_DEVICES needs",
                        device.profile, gpu.index, device.gi_id, device.ci_id
                    ),
                });
            };
            specs.push(DaemonSpec {
                resource: mig_daemon_name(&resource, uuid),
                gpus: vec![MpsGpu {
                    nvml_index: gpu.index,
                    uuid: Some(uuid.to_string()),
                    index_in_daemon: 0,
                    pinned_memory_limit_mib: mps
                        .pinned_memory_limit_mib
                        .get(device.profile)
                        .copied(),
                }],
                active_thread_percentage: mps.active_thread_percentage,
            });
        }
    }
    Ok(specs)
}

/// Whether `gpu`'s shared devices are advertised renamed (`renameByDefault`, `….shared`): read
/// back from the resource names the planner gave them.
fn renamed(gpu: &GpuPlan) -> bool {
    gpu.resources.keys().any(|r| r.ends_with(".shared"))
}

/// The daemons for whole GPUs: one per resource name.
fn whole_gpu_specs(plan: &NodePlan, observed: &ObservedNode) -> Result<Vec<DaemonSpec>, MpsError> {
    /// The MPS settings of a GPU planned for MPS.
    fn mps(gpu: &GpuPlan) -> Option<(Option<u32>, Option<u64>)> {
        match gpu.mode {
            PlannedMode::Mps {
                active_thread_percentage,
                pinned_memory_limit_mib,
                ..
            } => Some((active_thread_percentage, pinned_memory_limit_mib)),
            _ => None,
        }
    }
    let mut groups: BTreeMap<String, Vec<&GpuPlan>> = BTreeMap::new();
    for gpu in plan.gpus.iter().filter(|g| mps(g).is_some()) {
        // An MPS GPU advertises one resource: nvidia.com/gpu, or nvidia.com/gpu.shared.
        let resource = gpu
            .resources
            .keys()
            .next()
            .cloned()
            .unwrap_or_else(|| "nvidia.com/gpu".to_string());
        groups.entry(resource).or_default().push(gpu);
    }
    let mut specs = Vec::new();
    for (resource, mut gpus) in groups {
        gpus.sort_by_key(|g| g.index);
        let percentages: BTreeSet<Option<u32>> =
            gpus.iter().filter_map(|g| mps(g)).map(|m| m.0).collect();
        if percentages.len() > 1 {
            let list: Vec<String> = gpus
                .iter()
                .map(|g| match mps(g).and_then(|m| m.0) {
                    Some(p) => format!("GPU {}: {p}", g.index),
                    None => format!("GPU {}: unset", g.index),
                })
                .collect();
            return Err(MpsError::Spec {
                resource,
                message: format!(
                    "its GPUs want different activeThreadPercentage values ({}), but one MPS \
                     daemon per resource has one default; give them the same value",
                    list.join(", ")
                ),
            });
        }
        let gpus: Vec<MpsGpu> = gpus
            .iter()
            .enumerate()
            .map(|(position, g)| MpsGpu {
                nvml_index: g.index,
                uuid: observed
                    .gpus
                    .iter()
                    .find(|o| o.index == g.index)
                    .and_then(|o| o.uuid.clone()),
                index_in_daemon: position as u32,
                pinned_memory_limit_mib: mps(g).and_then(|m| m.1),
            })
            .collect();
        specs.push(DaemonSpec {
            active_thread_percentage: percentages.into_iter().next().flatten(),
            resource,
            gpus,
        });
    }
    Ok(specs)
}

/// Send `get_default_active_thread_percentage` to `resource`'s daemon, as NVIDIA's plugin does
/// before it registers.
pub fn health(settings: &MpsSettings, resource: &str) -> Result<(), MpsError> {
    check_resource_name(resource)?;
    Daemon::new(settings, resource)
        .send(HEALTH_COMMAND)
        .map(drop)
}

/// Make the daemons under `settings.root` match `wanted`: start the missing ones, restart crashed,
/// hung or differently configured ones, quit the ones no longer wanted, and keep `.started` and
/// `.ready` true. Idempotent: when everything matches, only a health check goes to each daemon.
///
/// A broken spec fails before anything changes. A daemon that cannot be started or stopped does
/// not stop the others: the error is [`MpsError::Incomplete`], with the report of what was done.
pub fn reconcile(settings: &MpsSettings, wanted: &[DaemonSpec]) -> Result<MpsReport, MpsError> {
    let mut seen = BTreeSet::new();
    for spec in wanted {
        check_spec(settings, spec)?;
        if !seen.insert(spec.resource.as_str()) {
            return Err(MpsError::Spec {
                resource: spec.resource.clone(),
                message: "wanted twice; one daemon per resource".into(),
            });
        }
    }
    let mut ready = Readiness {
        path: settings.ready_file(),
        removed: false,
    };
    let mut report = MpsReport::default();
    let mut errors = Vec::new();

    // Unwanted daemons go first, so a GPU moving between resources is never in two daemons.
    let present = discover(&settings.root).map_err(|e| MpsError::Root {
        root: settings.root.clone(),
        action: "list",
        path: settings.root.clone(),
        cause: e,
    })?;
    for resource in present.iter().filter(|r| !seen.contains(r.as_str())) {
        let daemon = Daemon::new(settings, resource);
        match daemon.remove(&mut ready) {
            Ok(true) => report.stopped.push(resource.clone()),
            Ok(false) => {}
            Err(e) => errors.push(e),
        }
    }
    for spec in wanted {
        let daemon = Daemon::new(settings, &spec.resource);
        match daemon.ensure(spec, &mut ready) {
            Ok(Outcome::Unchanged) => report.unchanged.push(spec.resource.clone()),
            Ok(Outcome::Started) => report.started.push(spec.resource.clone()),
            Ok(Outcome::Restarted(reason)) => report.restarted.push(Restart {
                resource: spec.resource.clone(),
                reason,
            }),
            Err(e) => errors.push(e),
        }
    }

    if errors.is_empty() && !wanted.is_empty() {
        let current = fs::read(&ready.path).ok();
        if current.as_deref() != Some(settings.ready_contents.as_bytes()) {
            fs::create_dir_all(&settings.root)
                .and_then(|()| fs::write(&ready.path, &settings.ready_contents))
                .map_err(|e| MpsError::Root {
                    root: settings.root.clone(),
                    action: "write",
                    path: ready.path.clone(),
                    cause: e,
                })?;
            info!(path = %ready.path.display(), "every MPS daemon is up");
        }
        report.ready = true;
    } else {
        ready.remove();
    }
    if errors.is_empty() {
        Ok(report)
    } else {
        Err(MpsError::Incomplete {
            report: Box::new(report),
            errors,
        })
    }
}

/// `<root>/.ready`, removed once before the first change of a reconcile.
struct Readiness {
    path: PathBuf,
    removed: bool,
}

impl Readiness {
    fn changing(&mut self) {
        if !self.removed {
            self.remove();
        }
    }

    fn remove(&mut self) {
        self.removed = true;
        match fs::remove_file(&self.path) {
            Ok(()) => debug!(path = %self.path.display(), "removed"),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => warn!(path = %self.path.display(), error = %e, "cannot remove"),
        }
    }
}

enum Outcome {
    Unchanged,
    Started,
    Restarted(String),
}

/// What is left of a spec once applied, to compare with the next one.
#[derive(Debug, Serialize, Deserialize)]
struct Applied {
    pid: i32,
    spec: DaemonSpec,
}

/// How a daemon's directory looks now.
enum Found {
    /// Alive and answering, with its answer to the health command.
    Healthy(i32, String),
    /// Alive, but the health command failed.
    Hung(i32, String),
    /// No live daemon; the stale pid if there was one.
    Gone(Option<i32>),
}

/// The daemon of one resource.
struct Daemon<'a> {
    settings: &'a MpsSettings,
    resource: &'a str,
    dir: PathBuf,
    pipe: PathBuf,
    log: PathBuf,
}

impl<'a> Daemon<'a> {
    fn new(settings: &'a MpsSettings, resource: &'a str) -> Self {
        Daemon {
            settings,
            resource,
            dir: settings.root.join(resource),
            pipe: settings.pipe_dir(resource),
            log: settings.log_dir(resource),
        }
    }

    fn io_error(&self, action: &'static str, path: &Path, cause: io::Error) -> MpsError {
        MpsError::Io {
            resource: self.resource.to_string(),
            pipe_dir: self.pipe.clone(),
            action,
            path: path.to_path_buf(),
            cause,
        }
    }

    fn command_error(&self, command: &str, detail: impl Into<String>) -> MpsError {
        MpsError::Command {
            resource: self.resource.to_string(),
            pipe_dir: self.pipe.clone(),
            command: command.to_string(),
            detail: detail.into(),
        }
    }

    /// Bring this daemon to `spec`.
    fn ensure(&self, spec: &DaemonSpec, ready: &mut Readiness) -> Result<Outcome, MpsError> {
        let applied = self.applied();
        let reason = match self.find()? {
            Found::Healthy(pid, answer) => {
                let Some(reason) = self.differs(pid, &answer, applied.as_ref(), spec) else {
                    let started = self.dir.join(STARTED);
                    if !started.exists() {
                        fs::write(&started, b"")
                            .map_err(|e| self.io_error("write", &started, e))?;
                    }
                    return Ok(Outcome::Unchanged);
                };
                ready.changing();
                info!(resource = self.resource, pid, %reason, "restarting the MPS control daemon");
                self.stop(pid)?;
                reason
            }
            Found::Hung(pid, detail) => {
                ready.changing();
                warn!(resource = self.resource, pid, %detail, "the MPS control daemon does not answer; killing it");
                self.terminate(pid, "kill")?;
                format!("the daemon (pid {pid}) did not answer `{HEALTH_COMMAND}`: {detail}")
            }
            Found::Gone(pid) => {
                ready.changing();
                let had_one = pid.is_some() || applied.is_some() || self.dir.join(STARTED).exists();
                if !had_one {
                    self.start(spec)?;
                    return Ok(Outcome::Started);
                }
                let reason = match pid {
                    Some(pid) => format!("the daemon (pid {pid}) is not running"),
                    None => "the daemon is not running (no pid file)".to_string(),
                };
                warn!(resource = self.resource, %reason, "restarting the MPS control daemon");
                reason
            }
        };
        self.start(spec)?;
        Ok(Outcome::Restarted(reason))
    }

    /// Why the running daemon `pid` does not match `spec`, if it doesn't.
    fn differs(
        &self,
        pid: i32,
        answer: &str,
        applied: Option<&Applied>,
        spec: &DaemonSpec,
    ) -> Option<String> {
        let Some(applied) = applied else {
            return Some(format!(
                "a daemon (pid {pid}) runs without a record of its settings"
            ));
        };
        if applied.pid != pid {
            return Some(format!(
                "the daemon (pid {pid}) is not the one configured (pid {})",
                applied.pid
            ));
        }
        if applied.spec != *spec {
            return Some(describe_change(&applied.spec, spec));
        }
        let want = f64::from(spec.active_thread_percentage.unwrap_or(100));
        match answer.trim().parse::<f64>() {
            Ok(have) if (have - want).abs() > 0.05 => Some(format!(
                "its default active thread percentage is {have}, not {want}"
            )),
            _ => None,
        }
    }

    /// Stop the daemon, if any, and remove its directory. True if there was something to stop.
    fn remove(&self, ready: &mut Readiness) -> Result<bool, MpsError> {
        let found = self.find()?;
        let marked = self.dir.join(STARTED).exists() || self.dir.join(APPLIED).exists();
        if matches!(found, Found::Gone(None)) && !marked && !self.pipe.exists() {
            return Ok(false);
        }
        ready.changing();
        match found {
            Found::Healthy(pid, _) => self.stop(pid)?,
            Found::Hung(pid, _) => self.terminate(pid, "kill")?,
            Found::Gone(_) => {}
        }
        for file in [STARTED, APPLIED] {
            let path = self.dir.join(file);
            remove_file(&path).map_err(|e| self.io_error("remove", &path, e))?;
        }
        for dir in [&self.log, &self.pipe] {
            match fs::remove_dir_all(dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(self.io_error("remove", dir, e)),
            }
        }
        // The resource's directory and its now-empty parents up to the root (nvidia.com/).
        let mut dir = self.dir.as_path();
        while dir != self.settings.root && fs::remove_dir(dir).is_ok() {
            match dir.parent() {
                Some(parent) => dir = parent,
                None => break,
            }
        }
        info!(
            resource = self.resource,
            "MPS control daemon stopped and removed"
        );
        Ok(!matches!(found, Found::Gone(None)) || marked)
    }

    /// The daemon's state; an error only when the control binary cannot be run at all.
    fn find(&self) -> Result<Found, MpsError> {
        let Some(pid) = self.pid() else {
            return Ok(Found::Gone(None));
        };
        if !alive(pid) || !self.is_control_daemon(pid) {
            return Ok(Found::Gone(Some(pid)));
        }
        match self.client(HEALTH_COMMAND) {
            Ok(run) if run.success => Ok(Found::Healthy(pid, run.stdout)),
            Ok(run) => Ok(Found::Hung(pid, run.describe())),
            Err(RunError::Timeout(detail)) => Ok(Found::Hung(pid, detail)),
            // Not the daemon's fault: leave it alone.
            Err(RunError::Spawn(detail)) => Err(self.command_error(HEALTH_COMMAND, detail)),
        }
    }

    fn pid(&self) -> Option<i32> {
        read_pid(&self.pipe)
    }

    /// Whether `pid` still runs the control binary (and not another process that got its pid
    /// after a crash): `/proc/<pid>/comm` is the binary's name, cut to 15 bytes. True where
    /// `/proc` cannot tell.
    fn is_control_daemon(&self, pid: i32) -> bool {
        let Ok(comm) = fs::read_to_string(format!("/proc/{pid}/comm")) else {
            return true;
        };
        let Some(name) = self.settings.control_binary.file_name() else {
            return true;
        };
        let name = name.to_string_lossy();
        let short: String = name.chars().take(15).collect();
        let is = comm.trim_end() == short;
        if !is {
            warn!(
                resource = self.resource,
                pid,
                comm = comm.trim_end(),
                "the pid file names another process; treating the daemon as gone"
            );
        }
        is
    }

    fn applied(&self) -> Option<Applied> {
        let path = self.dir.join(APPLIED);
        let text = fs::read_to_string(&path).ok()?;
        match serde_json::from_str(&text) {
            Ok(a) => Some(a),
            Err(e) => {
                warn!(path = %path.display(), error = %e, "unreadable record of MPS settings; the daemon will be restarted");
                None
            }
        }
    }

    /// Start a daemon (none runs), give it `spec`'s settings, and mark it started.
    fn start(&self, spec: &DaemonSpec) -> Result<(), MpsError> {
        for dir in [&self.pipe, &self.log] {
            fs::create_dir_all(dir).map_err(|e| self.io_error("create", dir, e))?;
        }
        // No daemon runs: whatever it left in its pipe directory is stale. The directory itself
        // stays, as running pods may have it mounted.
        let entries = fs::read_dir(&self.pipe).map_err(|e| self.io_error("list", &self.pipe, e))?;
        for entry in entries.flatten() {
            let path = entry.path();
            let removed = if entry.file_type().is_ok_and(|t| t.is_dir()) {
                fs::remove_dir_all(&path)
            } else {
                fs::remove_file(&path)
            };
            removed.map_err(|e| self.io_error("remove", &path, e))?;
        }
        for file in [STARTED, APPLIED] {
            let path = self.dir.join(file);
            remove_file(&path).map_err(|e| self.io_error("remove", &path, e))?;
        }

        let (visible, by_index) = spec.visible_devices();
        if by_index {
            warn!(resource = self.resource, devices = %visible, "GPU UUIDs unknown; the MPS daemon gets NVML indices with CUDA_DEVICE_ORDER=PCI_BUS_ID");
        }
        let start_command = format!("{} -d", self.settings.control_binary.display());
        let mut command = Command::new(&self.settings.control_binary);
        command
            .arg("-d")
            .env("CUDA_MPS_PIPE_DIRECTORY", &self.pipe)
            .env("CUDA_MPS_LOG_DIRECTORY", &self.log)
            .env("CUDA_VISIBLE_DEVICES", &visible);
        if by_index {
            command.env("CUDA_DEVICE_ORDER", "PCI_BUS_ID");
        }
        let run = run(command, None, self.settings.timeout)
            .map_err(|e| self.command_error(&start_command, e.to_string()))?;
        if !run.success {
            return Err(self.command_error(&start_command, run.describe()));
        }
        let pid = self.wait_for_pid().ok_or_else(|| {
            self.command_error(
                &start_command,
                format!(
                    "no live daemon wrote {} within {:?}{}",
                    self.pipe.join(PID_FILE).display(),
                    self.settings.timeout,
                    run.output_suffix()
                ),
            )
        })?;
        info!(resource = self.resource, pid, devices = %visible, "MPS control daemon started");

        if let Err(e) = self.configure(spec, pid) {
            // Clients must not find a daemon without its limits.
            if alive(pid) {
                let _ = self.stop(pid);
            }
            return Err(e);
        }
        let applied = serde_json::to_string_pretty(&Applied {
            pid,
            spec: spec.clone(),
        })
        .expect("the applied spec serializes");
        let path = self.dir.join(APPLIED);
        fs::write(&path, applied).map_err(|e| self.io_error("write", &path, e))?;
        let path = self.dir.join(STARTED);
        fs::write(&path, b"").map_err(|e| self.io_error("write", &path, e))?;
        Ok(())
    }

    /// Send the spec's settings, then read the thread percentage back.
    fn configure(&self, spec: &DaemonSpec, pid: i32) -> Result<(), MpsError> {
        let mut commands = spec.commands();
        commands.push(HEALTH_COMMAND.to_string());
        for (i, command) in commands.iter().enumerate() {
            // `-d` may return before the daemon listens: the first command may wait for it.
            let answer = if i == 0 {
                self.send_when_up(command, pid)?
            } else {
                self.send(command)?
            };
            if command == HEALTH_COMMAND {
                let want = f64::from(spec.active_thread_percentage.unwrap_or(100));
                if let Ok(have) = answer.trim().parse::<f64>() {
                    if (have - want).abs() > 0.05 {
                        return Err(self.command_error(
                            command,
                            format!("the daemon reports {have}, but {want} was set"),
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    fn send_when_up(&self, command: &str, pid: i32) -> Result<String, MpsError> {
        let deadline = Instant::now() + self.settings.timeout;
        loop {
            match self.send(command) {
                Err(MpsError::Command { ref detail, .. })
                    if detail.contains(NO_DAEMON) && alive(pid) && Instant::now() < deadline =>
                {
                    thread::sleep(POLL);
                }
                other => return other,
            }
        }
    }

    fn wait_for_pid(&self) -> Option<i32> {
        let deadline = Instant::now() + self.settings.timeout;
        loop {
            if let Some(pid) = self.pid().filter(|p| alive(*p)) {
                return Some(pid);
            }
            if Instant::now() >= deadline {
                return None;
            }
            thread::sleep(POLL);
        }
    }

    /// `echo COMMAND | nvidia-cuda-mps-control`: its output, or why it failed.
    fn send(&self, command: &str) -> Result<String, MpsError> {
        let run = self
            .client(command)
            .map_err(|e| self.command_error(command, e.to_string()))?;
        if run.success {
            Ok(run.stdout)
        } else {
            Err(self.command_error(command, run.describe()))
        }
    }

    fn client(&self, command: &str) -> Result<Run, RunError> {
        debug!(resource = self.resource, command, "MPS control command");
        let mut client = Command::new(&self.settings.control_binary);
        client
            .env("CUDA_MPS_PIPE_DIRECTORY", &self.pipe)
            .env("CUDA_MPS_LOG_DIRECTORY", &self.log);
        run(client, Some(command), self.settings.timeout)
    }

    /// `quit`, and wait for the daemon to exit; signals if it doesn't.
    fn stop(&self, pid: i32) -> Result<(), MpsError> {
        match self.send("quit") {
            Ok(_) => {
                if wait_exit(pid, self.settings.timeout) {
                    info!(resource = self.resource, pid, "MPS control daemon quit");
                    return Ok(());
                }
                warn!(resource = self.resource, pid, timeout = ?self.settings.timeout, "the MPS control daemon did not exit after quit");
            }
            Err(e) => warn!(resource = self.resource, pid, error = %e, "quit failed"),
        }
        self.terminate(pid, "quit")
    }

    /// SIGTERM, then SIGKILL, each with the timeout to exit.
    fn terminate(&self, pid: i32, command: &str) -> Result<(), MpsError> {
        for signal in [Signal::SIGTERM, Signal::SIGKILL] {
            match kill(Pid::from_raw(pid), signal) {
                Ok(()) => {}
                Err(Errno::ESRCH) => return Ok(()),
                Err(e) => {
                    return Err(self.command_error(
                        command,
                        format!("the daemon (pid {pid}) cannot be sent {signal}: {e}"),
                    ))
                }
            }
            warn!(resource = self.resource, pid, %signal, "signalled the MPS control daemon");
            if wait_exit(pid, self.settings.timeout) {
                return Ok(());
            }
        }
        Err(self.command_error(
            command,
            format!("the daemon (pid {pid}) is still running after SIGKILL"),
        ))
    }
}

/// Refuse a spec that cannot make a daemon.
fn check_spec(settings: &MpsSettings, spec: &DaemonSpec) -> Result<(), MpsError> {
    check_resource_name(&spec.resource)?;
    let bad = |message: String| MpsError::Spec {
        resource: spec.resource.clone(),
        message,
    };
    if spec.gpus.is_empty() {
        return Err(bad("no GPUs".into()));
    }
    for (i, gpu) in spec.gpus.iter().enumerate() {
        if gpu.index_in_daemon as usize != i {
            return Err(bad(format!(
                "GPU {} has index_in_daemon {}, but it is number {i} in CUDA_VISIBLE_DEVICES",
                gpu.nvml_index, gpu.index_in_daemon
            )));
        }
        if let Some(uuid) = &gpu.uuid {
            if uuid.is_empty() || uuid.contains([',', '\n']) || uuid.contains(char::is_whitespace) {
                return Err(bad(format!(
                    "GPU {} has UUID {uuid:?}, which cannot go into CUDA_VISIBLE_DEVICES",
                    gpu.nvml_index
                )));
            }
        }
        if gpu.pinned_memory_limit_mib == Some(0) {
            return Err(bad(format!(
                "GPU {} has a pinned memory limit of 0",
                gpu.nvml_index
            )));
        }
    }
    if let Some(p) = spec.active_thread_percentage {
        if !(1..=100).contains(&p) {
            return Err(bad(format!(
                "active thread percentage {p} is not between 1 and 100"
            )));
        }
    }
    let socket = settings.pipe_dir(&spec.resource).join(SOCKET_NAME);
    if socket.as_os_str().len() > MAX_SOCKET_PATH {
        return Err(bad(format!(
            "the daemon's socket {} is longer than a Unix socket path may be ({MAX_SOCKET_PATH} bytes); use a shorter root",
            socket.display()
        )));
    }
    Ok(())
}

/// A resource name is a relative path of plain components: `nvidia.com/gpu.shared`.
fn check_resource_name(resource: &str) -> Result<(), MpsError> {
    let ok = !resource.is_empty()
        && resource.split('/').all(|c| {
            !c.is_empty()
                && !c.starts_with('.')
                && c.chars()
                    .all(|ch| ch.is_ascii_alphanumeric() || matches!(ch, '.' | '-' | '_'))
        });
    if ok {
        Ok(())
    } else {
        Err(MpsError::Spec {
            resource: resource.to_string(),
            message: "not a resource name (plain path components such as nvidia.com/gpu)".into(),
        })
    }
}

/// Resource directories under `root`: those holding a `pipe` directory, `.started` or the
/// applied-settings record, up to four levels down. `shm` at the root (NVIDIA's tmpfs for
/// clients) and hidden entries are skipped; symlinks are not followed.
fn discover(root: &Path) -> io::Result<Vec<String>> {
    fn walk(root: &Path, dir: &Path, depth: usize, found: &mut Vec<String>) -> io::Result<()> {
        let entries = match fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        for entry in entries {
            let entry = entry?;
            if !entry.file_type()?.is_dir() {
                continue;
            }
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with('.') || (depth == 0 && name == SHM_DIR) {
                continue;
            }
            let path = entry.path();
            let is_daemon = path.join("pipe").is_dir()
                || path.join(STARTED).exists()
                || path.join(APPLIED).exists();
            if is_daemon {
                let relative = path.strip_prefix(root).unwrap_or(&path);
                found.push(relative.to_string_lossy().into_owned());
            } else if depth < 3 {
                walk(root, &path, depth + 1, found)?;
            }
        }
        Ok(())
    }
    let mut found = Vec::new();
    walk(root, root, 0, &mut found)?;
    found.sort();
    Ok(found)
}

/// A sentence per changed setting.
fn describe_change(old: &DaemonSpec, new: &DaemonSpec) -> String {
    let mut changes = Vec::new();
    let (old_devices, _) = old.visible_devices();
    let (new_devices, _) = new.visible_devices();
    if old_devices != new_devices {
        changes.push(format!("GPUs {old_devices} → {new_devices}"));
    }
    if old.active_thread_percentage != new.active_thread_percentage {
        changes.push(format!(
            "active thread percentage {} → {}",
            show(old.active_thread_percentage),
            show(new.active_thread_percentage)
        ));
    }
    let limits = |s: &DaemonSpec| -> Vec<Option<u64>> {
        s.gpus.iter().map(|g| g.pinned_memory_limit_mib).collect()
    };
    if limits(old) != limits(new) {
        let list = |s: &DaemonSpec| {
            s.gpus
                .iter()
                .map(|g| show(g.pinned_memory_limit_mib.map(|m| format!("{m}M"))))
                .collect::<Vec<_>>()
                .join(",")
        };
        changes.push(format!(
            "pinned memory limits {} → {}",
            list(old),
            list(new)
        ));
    }
    if changes.is_empty() {
        changes.push("the GPUs' NVML indices changed".into());
    }
    format!("settings changed: {}", changes.join("; "))
}

fn show<T: ToString>(value: Option<T>) -> String {
    value.map_or_else(|| "unset".to_string(), |v| v.to_string())
}

fn remove_file(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// Alive: `kill(pid, 0)` finds it and it is not a zombie (a daemon that crashed after its
/// parent, `-d`, exited is a child of whoever adopts orphans, who may never reap it).
/// Whether a control daemon runs for the pipe directory `pipe_dir`: its pid file names a live
/// process. Cheap enough for the device plugin's health loop: no control command is sent.
pub fn is_running(pipe_dir: &Path) -> bool {
    read_pid(pipe_dir).is_some_and(alive)
}

/// The pid the daemon wrote into its pipe directory.
fn read_pid(pipe_dir: &Path) -> Option<i32> {
    fs::read_to_string(pipe_dir.join(PID_FILE))
        .ok()?
        .trim()
        .parse()
        .ok()
        .filter(|p| *p > 0)
}

fn alive(pid: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    match kill(Pid::from_raw(pid), None) {
        Ok(()) | Err(Errno::EPERM) => !is_zombie(pid),
        Err(_) => false,
    }
}

fn is_zombie(pid: i32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            stat.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

fn wait_exit(pid: i32, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while alive(pid) {
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(POLL);
    }
    true
}

/// A finished run of the control binary.
struct Run {
    success: bool,
    status: String,
    stdout: String,
    stderr: String,
}

impl Run {
    fn output(&self) -> String {
        let mut text = self.stdout.trim().to_string();
        let err = self.stderr.trim();
        if !err.is_empty() {
            if !text.is_empty() {
                text.push_str(" / ");
            }
            text.push_str(err);
        }
        text
    }

    fn output_suffix(&self) -> String {
        match self.output() {
            t if t.is_empty() => String::new(),
            t => format!(" (it printed: {t})"),
        }
    }

    fn describe(&self) -> String {
        match self.output() {
            t if t.is_empty() => self.status.clone(),
            t => format!("{}: {t}", self.status),
        }
    }
}

/// Why the control binary gave no exit status.
#[derive(Debug)]
enum RunError {
    /// It could not be started.
    Spawn(String),
    /// It was killed after the timeout.
    Timeout(String),
}

impl std::fmt::Display for RunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RunError::Spawn(d) | RunError::Timeout(d) => f.write_str(d),
        }
    }
}

/// Run `command` with `input` on stdin (closed right after), killing it after `timeout`.
/// Output goes to unnamed temp files rather than pipes: a daemon forked by `-d` may keep its
/// parent's stdout open, and a pipe would then never reach EOF.
fn run(mut command: Command, input: Option<&str>, timeout: Duration) -> Result<Run, RunError> {
    let program = command.get_program().to_string_lossy().into_owned();
    let spawn_error = |e: io::Error| RunError::Spawn(format!("cannot run {program}: {e}"));
    let mut stdout = tempfile::tempfile().map_err(spawn_error)?;
    let mut stderr = tempfile::tempfile().map_err(spawn_error)?;
    let mut child = command
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(stdout.try_clone().map_err(spawn_error)?)
        .stderr(stderr.try_clone().map_err(spawn_error)?)
        .spawn()
        .map_err(spawn_error)?;
    if let (Some(input), Some(mut stdin)) = (input, child.stdin.take()) {
        // A client that died at once closes the pipe; its exit status says why.
        let _ = stdin.write_all(input.as_bytes());
        let _ = stdin.write_all(b"\n");
    }
    let status = match wait_child(&mut child, timeout) {
        Ok(Some(status)) => status,
        Ok(None) | Err(_) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(RunError::Timeout(format!(
                "no answer within {timeout:?}; killed {program}"
            )));
        }
    };
    Ok(Run {
        success: status.success(),
        status: status.to_string(),
        stdout: read_all(&mut stdout),
        stderr: read_all(&mut stderr),
    })
}

fn read_all(file: &mut fs::File) -> String {
    let mut bytes = Vec::new();
    let _ = file
        .seek(SeekFrom::Start(0))
        .and_then(|_| file.read_to_end(&mut bytes));
    String::from_utf8_lossy(&bytes).into_owned()
}

fn wait_child(
    child: &mut Child,
    timeout: Duration,
) -> io::Result<Option<std::process::ExitStatus>> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        thread::sleep(Duration::from_millis(5));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::plan;
    use crate::profile::parse_profile;

    fn node(uuids: bool) -> ObservedNode {
        let mut node = ObservedNode::simulated(&["h100x4".into()]);
        if uuids {
            for g in &mut node.gpus {
                g.uuid = Some(format!("GPU-{:08x}", g.index));
            }
        }
        node
    }

    fn specs(yaml: &str, node: &ObservedNode) -> Result<Vec<DaemonSpec>, MpsError> {
        let profile = parse_profile("test", yaml).expect("profile parses");
        let plan = plan("test", &profile, node).expect("plan");
        specs_from_plan(&plan, node)
    }

    /// GPU 0 of an H100 node with two 3g.40gb MIG devices, as NVML shows it after the apply.
    fn node_with_mig_devices() -> ObservedNode {
        use crate::gpu::ObservedComputeInstance;
        use crate::mig::{ExistingInstance, Placement};
        let mut node = node(true);
        let gpu = &mut node.gpus[0];
        gpu.mig = Some(crate::plan::MigMode {
            current: true,
            pending: true,
        });
        for (gi, start) in [(1, 0), (2, 4)] {
            gpu.instances.push(ExistingInstance {
                profile: "3g.40gb".into(),
                placement: Placement { start, size: 4 },
                gi_id: Some(gi),
            });
            gpu.compute_instances.push(ObservedComputeInstance {
                gi_id: gi,
                ci_id: 0,
                profile_id: 2,
                uuid: Some(format!("MIG-{gi:08x}")),
            });
        }
        node
    }

    #[test]
    fn one_daemon_per_mig_device_shared_through_mps() {
        let node = node_with_mig_devices();
        let profile = parse_profile(
            "test",
            "version: v1\nrules:\n  - devices: [0]\n    mig: {3g.40gb: 2}\n    mps: {replicas: 4, activeThreadPercentage: 50, pinnedMemoryLimit: auto}\n  - devices: [1]\n    mps: {replicas: 2}\n",
        )
        .unwrap();
        let plan = crate::plan::plan_for(
            "test",
            &profile,
            &node,
            crate::builtin_plugin::PluginKind::Builtin,
        )
        .expect("plan");
        let specs = specs_from_plan(&plan, &node).unwrap();
        let names: Vec<&str> = specs.iter().map(|s| s.resource.as_str()).collect();
        assert_eq!(
            names,
            [
                "nvidia.com/gpu",
                "nvidia.com/mig-3g.40gb/MIG-00000001",
                "nvidia.com/mig-3g.40gb/MIG-00000002"
            ]
        );
        let mig_memory = crate::mig::catalog()
            .model_by_product(&node.gpus[0].product)
            .and_then(|m| m.profile("3g.40gb"))
            .and_then(|p| p.memory_mib)
            .unwrap();
        for spec in &specs[1..] {
            assert_eq!(spec.gpus.len(), 1);
            assert_eq!(spec.gpus[0].nvml_index, 0);
            assert_eq!(spec.active_thread_percentage, Some(50));
            let uuid = spec.resource.rsplit('/').next().unwrap();
            assert_eq!(spec.visible_devices(), (uuid.to_string(), false));
            assert_eq!(
                spec.commands(),
                [
                    format!("set_default_device_pinned_mem_limit 0 {}M", mig_memory / 4),
                    "set_default_active_thread_percentage 50".to_string()
                ]
            );
            assert!(check_spec(&MpsSettings::default(), spec).is_ok());
        }
        // The whole-GPU daemon only sees GPU 1.
        assert_eq!(specs[0].visible_devices(), ("GPU-00000001".into(), false));

        let mut no_uuid = node.clone();
        no_uuid.gpus[0].compute_instances[1].uuid = None;
        let err = specs_from_plan(&plan, &no_uuid).unwrap_err().to_string();
        assert!(err.contains("has no UUID"), "{err}");
    }

    #[test]
    fn one_daemon_for_all_mps_gpus() {
        let node = node(true);
        let specs = specs(
            "version: v1\nrules:\n  - devices: all\n    mps: {replicas: 4, activeThreadPercentage: 25, pinnedMemoryLimit: auto}\n",
            &node,
        )
        .unwrap();
        assert_eq!(specs.len(), 1);
        let s = &specs[0];
        assert_eq!(s.resource, "nvidia.com/gpu");
        assert_eq!(s.active_thread_percentage, Some(25));
        assert_eq!(s.gpus.len(), 4);
        let mem = node.gpus[0].memory_mib.unwrap();
        for (i, g) in s.gpus.iter().enumerate() {
            assert_eq!(g.index_in_daemon, i as u32);
            assert_eq!(g.nvml_index, i as u32);
            assert_eq!(g.uuid.as_deref(), Some(format!("GPU-{i:08x}").as_str()));
            assert_eq!(g.pinned_memory_limit_mib, Some(mem / 4));
        }
        assert_eq!(
            s.visible_devices(),
            (
                "GPU-00000000,GPU-00000001,GPU-00000002,GPU-00000003".into(),
                false
            )
        );
        let limit = mem / 4;
        assert_eq!(
            s.commands(),
            [
                format!("set_default_device_pinned_mem_limit 0 {limit}M"),
                format!("set_default_device_pinned_mem_limit 1 {limit}M"),
                format!("set_default_device_pinned_mem_limit 2 {limit}M"),
                format!("set_default_device_pinned_mem_limit 3 {limit}M"),
                "set_default_active_thread_percentage 25".to_string(),
            ]
        );
    }

    #[test]
    fn renamed_resource_and_indices_when_uuids_are_unknown() {
        let node = node(false);
        let specs = specs(
            "version: v1\nplugin: {renameByDefault: true}\nrules:\n  - devices: all\n    mps: {replicas: 2}\n",
            &node,
        )
        .unwrap();
        assert_eq!(specs.len(), 1, "{specs:?}");
        let s = &specs[0];
        assert_eq!(s.resource, "nvidia.com/gpu.shared");
        assert_eq!(s.active_thread_percentage, None);
        assert_eq!(
            s.gpus
                .iter()
                .map(|g| (g.nvml_index, g.index_in_daemon, g.uuid.is_none()))
                .collect::<Vec<_>>(),
            [(0, 0, true), (1, 1, true), (2, 2, true), (3, 3, true)]
        );
        assert_eq!(s.visible_devices(), ("0,1,2,3".into(), true));
        assert!(s.commands().is_empty());
    }

    #[test]
    fn conflicting_thread_percentages_are_refused() {
        // The planner refuses such a profile (the NVIDIA plugin shares all whole GPUs alike), so
        // the conflict is made by hand.
        let node = node(true);
        let profile = parse_profile(
            "test",
            "version: v1\nrules:\n  - devices: all\n    mps: {replicas: 2, activeThreadPercentage: 50}\n",
        )
        .unwrap();
        let mut plan = plan("test", &profile, &node).unwrap();
        if let PlannedMode::Mps {
            active_thread_percentage,
            ..
        } = &mut plan.gpus[2].mode
        {
            *active_thread_percentage = Some(25);
        }
        let text = specs_from_plan(&plan, &node).unwrap_err().to_string();
        assert!(text.contains("nvidia.com/gpu"), "{text}");
        assert!(
            text.contains("GPU 0: 50") && text.contains("GPU 2: 25"),
            "{text}"
        );
    }

    #[test]
    fn no_mps_no_daemons() {
        let specs = specs(
            "version: v1\nrules:\n  - devices: all\n    timeSlicing: {replicas: 2}\n",
            &node(true),
        )
        .unwrap();
        assert!(specs.is_empty());
    }

    #[test]
    fn bad_specs_are_refused_before_anything_runs() {
        let settings = MpsSettings {
            control_binary: "/nonexistent/nvidia-cuda-mps-control".into(),
            root: std::env::temp_dir().join("gpu-share-mps-never-created"),
            ..MpsSettings::default()
        };
        let gpu = |i: u32, pos: u32| MpsGpu {
            nvml_index: i,
            uuid: Some(format!("GPU-{i}")),
            index_in_daemon: pos,
            pinned_memory_limit_mib: None,
        };
        let spec = |resource: &str, gpus: Vec<MpsGpu>, atp: Option<u32>| DaemonSpec {
            resource: resource.into(),
            gpus,
            active_thread_percentage: atp,
        };
        for (bad, why) in [
            (spec("../etc", vec![gpu(0, 0)], None), "not a resource name"),
            (spec("/abs", vec![gpu(0, 0)], None), "not a resource name"),
            (spec("nvidia.com/gpu", vec![], None), "no GPUs"),
            (
                spec("nvidia.com/gpu", vec![gpu(0, 1)], None),
                "index_in_daemon",
            ),
            (
                spec("nvidia.com/gpu", vec![gpu(0, 0)], Some(0)),
                "between 1 and 100",
            ),
            (
                spec(&"x".repeat(120), vec![gpu(0, 0)], None),
                "longer than a Unix socket path",
            ),
        ] {
            let err = reconcile(&settings, &[bad]).unwrap_err().to_string();
            assert!(err.contains(why), "{err}");
        }
        let twice = [
            spec("nvidia.com/gpu", vec![gpu(0, 0)], None),
            spec("nvidia.com/gpu", vec![gpu(1, 0)], None),
        ];
        assert!(reconcile(&settings, &twice)
            .unwrap_err()
            .to_string()
            .contains("wanted twice"));
        assert!(!settings.root.exists());
    }

    #[test]
    fn changes_are_described() {
        let a = DaemonSpec {
            resource: "nvidia.com/gpu".into(),
            gpus: vec![MpsGpu {
                nvml_index: 0,
                uuid: Some("GPU-a".into()),
                index_in_daemon: 0,
                pinned_memory_limit_mib: Some(1024),
            }],
            active_thread_percentage: Some(25),
        };
        let mut b = a.clone();
        b.active_thread_percentage = Some(50);
        b.gpus[0].pinned_memory_limit_mib = None;
        assert_eq!(
            describe_change(&a, &b),
            "settings changed: active thread percentage 25 → 50; pinned memory limits 1024M → unset"
        );
    }
}
