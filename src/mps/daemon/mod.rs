//! MPS control daemons: one `nvidia-cuda-mps-control -d` per shared resource name, laid out the
//! way NVIDIA's mps-control-daemon does it (docs/sources.md#mps):
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
//!
//! By what each part owns: `settings` (what a daemon is asked to be, and the checks on it),
//! `from_plan` (the daemons a plan asks for), `lifecycle` (one daemon's health, start,
//! restart and stop), `state` (what daemons leave on disk) and `process` (pids and runs of
//! the control binary); this file holds [`reconcile`], [`health`] and what they report.

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

use crate::gpu::ObservedNode;
use crate::profile::MigStrategy;
use crate::sharing::{GpuPlan, PlannedMode};

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

mod from_plan;
mod lifecycle;
mod process;
mod settings;
mod state;

pub use from_plan::{mig_daemon_name, specs_from_plan};
use lifecycle::Daemon;
use process::*;
use settings::*;
pub use settings::{DaemonSpec, MpsGpu, MpsSettings};
pub use state::is_running;
use state::*;

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
        specs_from_plan(&plan.gpus, plan.mig_strategy, node)
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
        let plan =
            crate::plan::plan_for("test", &profile, &node, crate::sharing::PluginKind::Builtin)
                .expect("plan");
        let specs = specs_from_plan(&plan.gpus, plan.mig_strategy, &node).unwrap();
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
        let err = specs_from_plan(&plan.gpus, plan.mig_strategy, &no_uuid)
            .unwrap_err()
            .to_string();
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
        let text = specs_from_plan(&plan.gpus, plan.mig_strategy, &node)
            .unwrap_err()
            .to_string();
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
