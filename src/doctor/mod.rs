//! `gpu-share doctor`: check the node's GPU stack bottom-up and stop with a precise diagnosis
//! at the first broken layer.
//!
//! Layers, each one line in the report: the kernel driver (or a Jetson/Tegra integrated GPU),
//! NVML, the profile's features (MIG, MPS), the container runtime (containerd, CDI), the device
//! plugin's sockets, the allocatable check (always skipped: it needs the API server, which doctor
//! does not ask) and, when asked, the CUDA version the driver runs. A layer that fails stops the
//! walk: the layers above it are reported as not checked, since their failures would only echo
//! it.
//!
//! Everything is read from files under `--host-root` (default `/`), so tests point the doctor at a
//! fixture tree, and the NVML library is the one `--nvml-lib` names.
//!
//! `--plugin` (env `GPU_SHARE_PLUGIN`, as the agent's) says which device plugin advertises the
//! GPUs: `nvidia` plans the profile with the NVIDIA plugin's refusals and expects its sockets;
//! `builtin` plans it for the agent's own plugin, needs only `kubelet.sock` (the agent serves
//! the resource sockets once it runs), and for MPS the tmpfs at `<mps root>/shm`; `dra` looks
//! for the agent's DRA plugin in the kubelet's plugin registry instead. A node cannot offer the
//! same GPUs through DRA and a device plugin: either way round, doctor warns (`dra.rs`).

mod cdi;
mod containerd;
mod cuda;
mod dra;
mod driver;
mod nvml;
mod options;
mod plugin;
mod profile;
mod runtime;
mod socket;
mod version;

use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use crate::plan::{NodePlan, ObservedNode};
use crate::profile::NamedProfile;
use crate::sharing::PluginKind;

pub use cuda::CudaVersion;
pub use options::{DoctorOptions, EXIT_CODES};
pub use version::DriverVersion;

use options::{find_program, is_executable, under, Paths};

/// How one check came out. Ordered by badness.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    Skip,
    Warn,
    Fail,
}

impl Status {
    fn word(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Skip => "skip",
            Status::Warn => "warn",
            Status::Fail => "fail",
        }
    }
}

/// One line of the report: a layer (or one check of it), what was found, and what to try.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub status: Status,
    /// What was found, in one sentence.
    pub found: String,
    /// The individual problems (and facts worth seeing) behind the status.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub details: Vec<String>,
    /// What to try, for a warning or a failure.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub fix: Vec<String>,
}

impl Check {
    fn new(name: &'static str, found: impl Into<String>) -> Self {
        Check {
            name,
            status: Status::Ok,
            found: found.into(),
            details: Vec::new(),
            fix: Vec::new(),
        }
    }

    fn skip(name: &'static str, why: impl Into<String>) -> Self {
        Check {
            status: Status::Skip,
            ..Check::new(name, why)
        }
    }

    /// Record a problem: raise the status to `status`, keep the detail and the fix to try.
    fn problem(&mut self, status: Status, detail: impl Into<String>, fix: impl Into<String>) {
        self.status = self.status.max(status);
        self.details.push(detail.into());
        let fix = fix.into();
        if !fix.is_empty() && !self.fix.contains(&fix) {
            self.fix.push(fix);
        }
    }

    fn warn(&mut self, detail: impl Into<String>, fix: impl Into<String>) {
        self.problem(Status::Warn, detail, fix);
    }

    fn fail(&mut self, detail: impl Into<String>, fix: impl Into<String>) {
        self.problem(Status::Fail, detail, fix);
    }

    /// A check that failed outright: nothing found worth a separate detail line.
    fn failed(name: &'static str, found: impl Into<String>, fix: impl Into<String>) -> Self {
        let mut c = Check::new(name, found);
        c.status = Status::Fail;
        c.fix.push(fix.into());
        c
    }
}

/// The whole diagnosis.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// The worst status of any check (`skip` counts as ok).
    pub status: Status,
    /// The first layer that failed; nothing above it was checked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failed_at: Option<&'static str>,
    pub checks: Vec<Check>,
}

impl Report {
    /// 0 when nothing failed, 1 when a layer failed.
    pub fn exit_code(&self) -> u8 {
        u8::from(self.status == Status::Fail)
    }
}

/// Everything a check may need: options and the profile chosen.
struct Ctx<'a> {
    paths: Paths,
    nvml_lib: Option<&'a Path>,
    profile: Option<&'a NamedProfile>,
    profile_path: Option<&'a Path>,
    cuda: Option<CudaVersion>,
    /// The device plugin the profile is planned for and whose needs are checked.
    plugin: PluginKind,
}

/// What the layers below learnt, for the layers above.
#[derive(Default)]
struct Facts {
    /// The kernel module's version (`/proc/driver/nvidia/version`).
    kernel: Option<DriverVersion>,
    /// Set when the node is a Jetson/Tegra with an integrated GPU and no NVML.
    tegra: Option<crate::gpu::Tegra>,
    /// The driver version NVML reports.
    nvml_driver: Option<DriverVersion>,
    /// The newest CUDA version the driver supports, as NVML reports it.
    nvml_cuda: Option<CudaVersion>,
    /// The GPUs, from NVML (or the one integrated GPU of a Tegra).
    node: Option<ObservedNode>,
    /// The profile planned on the node.
    plan: Option<NodePlan>,
}

impl Facts {
    /// The driver version to judge features by: NVML's, else the kernel module's.
    fn driver(&self) -> Option<&DriverVersion> {
        self.nvml_driver.as_ref().or(self.kernel.as_ref())
    }
}

type Layer = fn(&Ctx<'_>, &mut Facts) -> Check;

/// The layer: DRA mode has its own check (`super::dra`); with a device plugin, its sockets, and
/// a warning when gpu-share's DRA plugin is registered on the same node.
fn plugin_layer(ctx: &Ctx<'_>, facts: &mut Facts) -> Check {
    if ctx.plugin == PluginKind::Dra {
        return dra::check(ctx);
    }
    let mut check = plugin::check(ctx, facts);
    dra::warn_if_dra_registered(ctx, &mut check);
    check
}

/// The layers, bottom-up. The flag says whether the check still runs after a failure below.
const LAYERS: [(&str, Layer, bool); 7] = [
    ("driver", driver::check, false),
    ("nvml", nvml::check, false),
    ("profile", profile::check, false),
    ("container-runtime", runtime::check, false),
    ("device-plugin", plugin_layer, false),
    ("allocatable", plugin::allocatable, true),
    ("cuda", cuda::check, false),
];

/// Run every layer bottom-up; after the first failure the rest are reported as not checked.
/// `profile` is the profile `options.profile` names, already read (a usage error otherwise).
pub fn run(
    options: &DoctorOptions,
    nvml_lib: Option<&Path>,
    profile: Option<&NamedProfile>,
) -> Report {
    let ctx = Ctx {
        paths: Paths::new(options),
        nvml_lib,
        profile,
        profile_path: options.profile.as_deref(),
        cuda: options.cuda,
        plugin: options.plugin,
    };
    let mut facts = Facts::default();
    let mut failed_at = None;
    let mut checks = Vec::new();
    for (name, layer, after_failure) in LAYERS {
        let check = match failed_at {
            Some(below) if !after_failure => {
                Check::skip(name, format!("not checked: {below} failed"))
            }
            _ => layer(&ctx, &mut facts),
        };
        if check.status == Status::Fail && failed_at.is_none() {
            failed_at = Some(name);
        }
        checks.push(check);
    }
    let status = checks
        .iter()
        .map(|c| c.status)
        .filter(|s| *s != Status::Skip)
        .max()
        .unwrap_or(Status::Ok);
    Report {
        status,
        failed_at,
        checks,
    }
}

/// The report for people: one line per check, details and fixes indented below it.
pub fn render_text(report: &Report) -> String {
    const NAME: usize = 18;
    let indent = " ".repeat(6 + NAME);
    let mut out = String::new();
    for c in &report.checks {
        let _ = writeln!(out, "{:<6}{:<NAME$}{}", c.status.word(), c.name, c.found);
        for d in &c.details {
            let _ = writeln!(out, "{indent}- {d}");
        }
        for f in &c.fix {
            let _ = writeln!(out, "{indent}fix: {f}");
        }
    }
    let warnings = report
        .checks
        .iter()
        .filter(|c| c.status == Status::Warn)
        .count();
    let _ = match report.failed_at {
        Some(at) => writeln!(
            out,
            "\nfailed at {at}: fix it first, then run the doctor again"
        ),
        None if warnings > 0 => writeln!(out, "\nno layer failed ({warnings} with warnings)"),
        None => writeln!(out, "\nevery layer is ok"),
    };
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skips_do_not_make_a_report_fail() {
        let mut c = Check::new("x", "found");
        c.warn("w", "fix w");
        c.warn("w2", "fix w");
        assert_eq!(c.status, Status::Warn);
        assert_eq!(c.fix, ["fix w"]);
        c.fail("f", "fix f");
        assert_eq!(c.status, Status::Fail);
        assert!(Status::Skip < Status::Warn);
    }
}
