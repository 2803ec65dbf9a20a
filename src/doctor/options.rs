//! The doctor's options and the paths they resolve to: every default under `--host-root`, a path
//! given with its own flag as written.

use std::path::{Path, PathBuf};

use super::cuda::{self, CudaVersion};
use crate::sharing::PluginKind;

/// What `gpu-share doctor --help` says about its exit codes.
pub const EXIT_CODES: &str = "\
Exit codes:
  0  every layer is ok (warnings and skipped checks allowed)
  1  a layer failed; the layers above it were not checked
  2  bad usage or an internal error (unreadable --profile, bad --cuda, ...)

Paths: every default path is resolved under --host-root (default /); a path given with its own
flag is used as written. Example: gpu-share doctor --host-root /host --profile profile.yaml --cuda 12.4";

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
    /// What advertises the GPUs, as the agent's --plugin: `nvidia` (profiles planned with its
    /// refusals, its sockets checked), `builtin` (the agent's own plugin: kubelet.sock, and for
    /// MPS the tmpfs at <mps root>/shm) or `dra` (the agent's DRA plugin registered, and no
    /// device plugin serving the same GPUs).
    #[arg(long, env = "GPU_SHARE_PLUGIN", value_enum, default_value_t = PluginKind::Nvidia)]
    pub plugin: PluginKind,
    /// Resolve every default path below under DIR (e.g. the host's root mounted in a pod; the
    /// agent's --host-root).
    #[arg(
        long,
        env = "GPU_SHARE_HOST_ROOT",
        value_name = "DIR",
        default_value = "/",
        alias = "root",
        help_heading = "Paths"
    )]
    pub host_root: PathBuf,
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
    /// containerd's config; its `imports` and conf.d drop-ins are read too [default:
    /// /etc/containerd/config.toml, or where it is missing and k3s's or RKE2's embedded
    /// containerd runs, /var/lib/rancher/{k3s,rke2}/agent/etc/containerd/config.toml].
    #[arg(long, value_name = "FILE", help_heading = "Paths")]
    pub containerd_config: Option<PathBuf>,
    /// Where CDI specs are (the agent's --cdi-root); repeat for several
    /// [default: /etc/cdi and /var/run/cdi].
    #[arg(
        long = "cdi-root",
        value_name = "DIR",
        alias = "cdi-dir",
        help_heading = "Paths"
    )]
    pub cdi_roots: Vec<PathBuf>,
    /// The kubelet's device-plugin directory [default: /var/lib/kubelet/device-plugins].
    #[arg(long, value_name = "DIR", help_heading = "Paths")]
    pub device_plugin_dir: Option<PathBuf>,
    /// The kubelet's plugin registry, where DRA kubelet plugins register (the agent's
    /// --dra-registration-dir) [default: /var/lib/kubelet/plugins_registry].
    #[arg(long, value_name = "DIR", help_heading = "Paths")]
    pub dra_registration_dir: Option<PathBuf>,
    /// The kubelet's PodResources socket, which the agent's drain asks which pods hold a
    /// device [default: /var/lib/kubelet/pod-resources/kubelet.sock].
    #[arg(long, value_name = "FILE", help_heading = "Paths")]
    pub pod_resources_socket: Option<PathBuf>,
    /// The MPS control daemon binary: a path (used as written), or a name searched on PATH,
    /// each directory under --host-root [default: nvidia-cuda-mps-control].
    #[arg(long, value_name = "PATH", help_heading = "Paths")]
    pub mps_control: Option<PathBuf>,
    /// The MPS root; with --plugin builtin and an MPS profile, <DIR>/shm must be a tmpfs mount
    /// [default: /run/nvidia/mps].
    #[arg(long, value_name = "DIR", help_heading = "Paths")]
    pub mps_root: Option<PathBuf>,
    /// The mount table that says whether <mps root>/shm is mounted; its mount points are as the
    /// doctor's own process sees them, so with --host-root they include the root
    /// [default: /proc/self/mountinfo].
    #[arg(long, value_name = "FILE", help_heading = "Paths")]
    pub mountinfo: Option<PathBuf>,
}

impl Default for DoctorOptions {
    fn default() -> Self {
        DoctorOptions {
            profile: None,
            key: None,
            cuda: None,
            plugin: PluginKind::Nvidia,
            host_root: PathBuf::from("/"),
            driver_version_file: None,
            dev_dir: None,
            tegra_release: None,
            device_tree: None,
            containerd_config: None,
            cdi_roots: Vec::new(),
            device_plugin_dir: None,
            dra_registration_dir: None,
            pod_resources_socket: None,
            mps_control: None,
            mps_root: None,
            mountinfo: None,
        }
    }
}

/// The paths the doctor reads, defaults resolved under `--host-root`.
#[derive(Debug, Clone)]
pub(super) struct Paths {
    pub(super) root: PathBuf,
    pub(super) driver_version: PathBuf,
    pub(super) dev: PathBuf,
    pub(super) tegra_release: PathBuf,
    pub(super) device_tree: PathBuf,
    pub(super) containerd_config: PathBuf,
    pub(super) cdi_dirs: Vec<PathBuf>,
    pub(super) device_plugin_dir: PathBuf,
    pub(super) dra_registration_dir: PathBuf,
    pub(super) pod_resources_socket: PathBuf,
    pub(super) mps_control: PathBuf,
    pub(super) mps_root: PathBuf,
    pub(super) mountinfo: PathBuf,
}

impl Paths {
    pub(super) fn new(o: &DoctorOptions) -> Self {
        let root = o.host_root.clone();
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
            containerd_config: o
                .containerd_config
                .clone()
                .unwrap_or_else(|| containerd_config_under(&root)),
            cdi_dirs: if o.cdi_roots.is_empty() {
                vec![
                    under(&root, Path::new("/etc/cdi")),
                    under(&root, Path::new("/var/run/cdi")),
                ]
            } else {
                o.cdi_roots.clone()
            },
            device_plugin_dir: pick(&o.device_plugin_dir, "/var/lib/kubelet/device-plugins"),
            dra_registration_dir: pick(
                &o.dra_registration_dir,
                "/var/lib/kubelet/plugins_registry",
            ),
            pod_resources_socket: pick(
                &o.pod_resources_socket,
                crate::kubelet::pod_resources::DEFAULT_SOCKET,
            ),
            mps_control: o
                .mps_control
                .clone()
                .unwrap_or_else(|| PathBuf::from("nvidia-cuda-mps-control")),
            mps_root: pick(&o.mps_root, crate::mps::daemon::DEFAULT_ROOT),
            mountinfo: pick(&o.mountinfo, "/proc/self/mountinfo"),
            root,
        }
    }
}

/// `path` (absolute, as the host sees it) inside `root`.
/// Where k3s and RKE2 write the config of the containerd they embed (regenerated at each start
/// from their own template; docs.k3s.io, "Advanced Options": "Configuring containerd").
pub(super) const EMBEDDED_CONTAINERD_CONFIGS: [&str; 2] = [
    "/var/lib/rancher/k3s/agent/etc/containerd/config.toml",
    "/var/lib/rancher/rke2/agent/etc/containerd/config.toml",
];

/// containerd's config under `root`: the system's, or where it is missing the first of k3s's
/// and RKE2's that exists, so `doctor` on a k3s node needs no `--containerd-config`.
fn containerd_config_under(root: &Path) -> PathBuf {
    let system = under(root, Path::new("/etc/containerd/config.toml"));
    if system.exists() {
        return system;
    }
    EMBEDDED_CONTAINERD_CONFIGS
        .iter()
        .map(|p| under(root, Path::new(p)))
        .find(|p| p.exists())
        .unwrap_or(system)
}

/// Whether `config` is one k3s or RKE2 generates, which `nvidia-ctk runtime configure` must not
/// edit (the next start overwrites it).
pub(super) fn is_embedded_containerd(config: &Path) -> bool {
    let text = config.to_string_lossy();
    EMBEDDED_CONTAINERD_CONFIGS
        .iter()
        .any(|p| text.ends_with(p))
}

pub(super) fn under(root: &Path, path: &Path) -> PathBuf {
    root.join(path.strip_prefix("/").unwrap_or(path))
}

/// A program named by a host file (a config's `BinaryName`) or a bare name: an absolute path is
/// resolved under `root`, a bare name searched on PATH, each directory under `root`. Returns
/// the candidate found, if any.
pub(super) fn find_program(root: &Path, program: &Path) -> Option<PathBuf> {
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
pub(super) fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_resolve_under_root_and_given_paths_stay() {
        let o = DoctorOptions {
            host_root: PathBuf::from("/host"),
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
        assert_eq!(p.mps_root, Path::new("/host/run/nvidia/mps"));
        assert_eq!(p.mountinfo, Path::new("/host/proc/self/mountinfo"));
    }
}
