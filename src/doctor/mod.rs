//! `gpu-share doctor`: check the node's GPU stack bottom-up and stop with a precise diagnosis
//! at the first broken layer.
//!
//! Layers, each one line in the report: the kernel driver (or a Jetson/Tegra integrated GPU),
//! NVML, the profile's features (MIG, MPS), the container runtime (containerd, CDI), the device
//! plugin's sockets, the allocatable check (not done yet: it needs the API server) and, when
//! asked, the CUDA version the driver runs. A layer that fails stops the walk: the layers above
//! it are reported as not checked, since their failures would only echo it.
//!
//! Everything is read from files under `--root` (default `/`), so tests point the doctor at a
//! fixture tree, and the NVML library is the one `--nvml-lib` names.

mod cuda;
mod driver;
mod nvml;
mod plugin;
mod profile;
mod runtime;
mod version;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::plan::{NodePlan, ObservedNode};
use crate::profile::NamedProfile;

pub use cuda::CudaVersion;
pub use version::DriverVersion;

/// What `gpu-share doctor --help` says about its exit codes.
pub const EXIT_CODES: &str = "\
Exit codes:
  0  every layer is ok (warnings and skipped checks allowed)
  1  a layer failed; the layers above it were not checked
  2  bad usage or an internal error (unreadable --profile, bad --cuda, ...)

Paths: every default path is resolved under --root (default /); a path given with its own
flag is used as written. Example: gpu-share doctor --root /host --profile profile.yaml --cuda 12.4";

/// The doctor's command-line options (the CLI adds `--nvml-lib` and `--output`).
#[derive(clap::Args, Debug, Clone)]
pub struct DoctorOptions {
    /// Also check the profile's needs: it plans on this node, MIG GPUs have a new enough
    /// driver, MPS has its control binary, and the device plugin serves its resources.
    #[arg(long)]
    pub profile: Option<PathBuf>,
    /// Which ConfigMap key of --profile, when it holds more than one.
    #[arg(long, requires = "profile")]
    pub key: Option<String>,
    /// Check that the driver runs this CUDA runtime version (MAJOR.MINOR, e.g. 12.4).
    #[arg(long, value_name = "VERSION", value_parser = cuda::parse_version)]
    pub cuda: Option<CudaVersion>,
    /// Resolve every default path below under DIR (e.g. the host's root mounted in a pod).
    #[arg(long, value_name = "DIR", default_value = "/", help_heading = "Paths")]
    pub root: PathBuf,
    /// The kernel module's version file [default: /proc/driver/nvidia/version].
    #[arg(long, value_name = "FILE", help_heading = "Paths")]
    pub driver_version_file: Option<PathBuf>,
    /// Where the device nodes are [default: /dev].
    #[arg(long, value_name = "DIR", help_heading = "Paths")]
    pub dev_dir: Option<PathBuf>,
    /// Jetson's L4T release file [default: /etc/nv_tegra_release].
    #[arg(long, value_name = "FILE", help_heading = "Paths")]
    pub tegra_release: Option<PathBuf>,
    /// The device tree, for Tegra's `compatible` and `model` [default: /proc/device-tree].
    #[arg(long, value_name = "DIR", help_heading = "Paths")]
    pub device_tree: Option<PathBuf>,
    /// containerd's config; its `imports` and conf.d drop-ins are read too
    /// [default: /etc/containerd/config.toml; k3s: /var/lib/rancher/k3s/agent/etc/containerd/config.toml].
    #[arg(long, value_name = "FILE", help_heading = "Paths")]
    pub containerd_config: Option<PathBuf>,
    /// Where CDI specs are; repeat for several [default: /etc/cdi and /var/run/cdi].
    #[arg(long = "cdi-dir", value_name = "DIR", help_heading = "Paths")]
    pub cdi_dirs: Vec<PathBuf>,
    /// The kubelet's device-plugin directory [default: /var/lib/kubelet/device-plugins].
    #[arg(long, value_name = "DIR", help_heading = "Paths")]
    pub device_plugin_dir: Option<PathBuf>,
    /// The MPS control daemon binary: a path, or a name searched on PATH (under --root)
    /// [default: nvidia-cuda-mps-control].
    #[arg(long, value_name = "PATH", help_heading = "Paths")]
    pub mps_control: Option<PathBuf>,
}

impl Default for DoctorOptions {
    fn default() -> Self {
        DoctorOptions {
            profile: None,
            key: None,
            cuda: None,
            root: PathBuf::from("/"),
            driver_version_file: None,
            dev_dir: None,
            tegra_release: None,
            device_tree: None,
            containerd_config: None,
            cdi_dirs: Vec::new(),
            device_plugin_dir: None,
            mps_control: None,
        }
    }
}

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

/// The paths the doctor reads, defaults resolved under `--root`.
#[derive(Debug, Clone)]
struct Paths {
    root: PathBuf,
    driver_version: PathBuf,
    dev: PathBuf,
    tegra_release: PathBuf,
    device_tree: PathBuf,
    containerd_config: PathBuf,
    cdi_dirs: Vec<PathBuf>,
    device_plugin_dir: PathBuf,
    mps_control: PathBuf,
}

impl Paths {
    fn new(o: &DoctorOptions) -> Self {
        let root = o.root.clone();
        let pick = |given: &Option<PathBuf>, default: &str| {
            given
                .clone()
                .unwrap_or_else(|| under(&root, Path::new(default)))
        };
        Paths {
            driver_version: pick(&o.driver_version_file, "/proc/driver/nvidia/version"),
            dev: pick(&o.dev_dir, "/dev"),
            tegra_release: pick(&o.tegra_release, "/etc/nv_tegra_release"),
            device_tree: pick(&o.device_tree, "/proc/device-tree"),
            containerd_config: pick(&o.containerd_config, "/etc/containerd/config.toml"),
            cdi_dirs: if o.cdi_dirs.is_empty() {
                vec![
                    under(&root, Path::new("/etc/cdi")),
                    under(&root, Path::new("/var/run/cdi")),
                ]
            } else {
                o.cdi_dirs.clone()
            },
            device_plugin_dir: pick(&o.device_plugin_dir, "/var/lib/kubelet/device-plugins"),
            mps_control: o
                .mps_control
                .clone()
                .unwrap_or_else(|| PathBuf::from("nvidia-cuda-mps-control")),
            root,
        }
    }
}

/// `path` (absolute, as the host sees it) inside `root`.
fn under(root: &Path, path: &Path) -> PathBuf {
    root.join(path.strip_prefix("/").unwrap_or(path))
}

/// A program: a path (with a `/`) is resolved under `root` when absolute; a bare name is
/// searched on PATH, each directory under `root`. Returns the candidate found, if any.
fn find_program(root: &Path, program: &Path) -> Option<PathBuf> {
    if program.components().count() > 1 {
        let p = if program.is_absolute() {
            under(root, program)
        } else {
            program.to_path_buf()
        };
        return p.exists().then_some(p);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| under(root, &dir).join(program))
        .find(|p| p.is_file())
}

/// Whether `path` is a regular file someone may execute.
fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Everything a check may need: options and the profile chosen.
struct Ctx<'a> {
    paths: Paths,
    nvml_lib: Option<&'a Path>,
    profile: Option<&'a NamedProfile>,
    profile_path: Option<&'a Path>,
    cuda: Option<CudaVersion>,
}

/// What the layers below learnt, for the layers above.
#[derive(Default)]
struct Facts {
    /// The kernel module's version (`/proc/driver/nvidia/version`).
    kernel: Option<DriverVersion>,
    /// Set when the node is a Jetson/Tegra with an integrated GPU and no NVML.
    tegra: Option<driver::Tegra>,
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

/// The layers, bottom-up. The flag says whether the check still runs after a failure below.
const LAYERS: [(&str, Layer, bool); 7] = [
    ("driver", driver::check, false),
    ("nvml", nvml::check, false),
    ("profile", profile::check, false),
    ("container-runtime", runtime::check, false),
    ("device-plugin", plugin::check, false),
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
    fn defaults_resolve_under_root_and_given_paths_stay() {
        let o = DoctorOptions {
            root: PathBuf::from("/host"),
            dev_dir: Some(PathBuf::from("/elsewhere/dev")),
            ..DoctorOptions::default()
        };
        let p = Paths::new(&o);
        assert_eq!(
            p.driver_version,
            Path::new("/host/proc/driver/nvidia/version")
        );
        assert_eq!(p.dev, Path::new("/elsewhere/dev"));
        assert_eq!(
            p.cdi_dirs,
            [Path::new("/host/etc/cdi"), Path::new("/host/var/run/cdi")]
        );
        assert_eq!(p.mps_control, Path::new("nvidia-cuda-mps-control"));
    }

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
