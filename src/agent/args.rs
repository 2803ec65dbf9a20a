//! The agent's flags (`gpu-share agent --help`), each with its environment variable for the
//! DaemonSet, and the apply options they make.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::apply::{ApplyOptions, DevicePluginOutput};
use crate::duration;
use crate::mps::daemon::{self, MpsSettings};
use crate::nvidia_plugin::SignalTarget;
use crate::sharing::PluginKind;

/// The agent's configuration: flags, each with an environment variable for the DaemonSet.
#[derive(clap::Args, Debug, Clone)]
pub struct AgentArgs {
    /// This node's name (downward API `spec.nodeName`).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,
    #[command(flatten)]
    pub profiles: crate::profile::ProfilesSource,
    /// The NVML library (default: the system's libnvidia-ml.so.1).
    #[arg(long, env = "GPU_SHARE_NVML_LIB")]
    pub nvml_lib: Option<PathBuf>,
    /// Where the crash-safety journal is kept (a hostPath, so it survives the pod).
    #[arg(
        long,
        env = "GPU_SHARE_STATE_DIR",
        default_value = "/var/lib/gpu-share"
    )]
    pub state_dir: PathBuf,
    /// The device plugin's config file (shared with the plugin container).
    #[arg(long, env = "GPU_SHARE_PLUGIN_CONFIG")]
    pub plugin_config: Option<PathBuf>,
    /// How the plugin reloads a new config: `signal` (SIGHUP to --plugin-process or
    /// --plugin-pid-file), `restart` (delete its pod on this node, selected by
    /// --plugin-pod-selector) or `none`.
    #[arg(long, env = "GPU_SHARE_PLUGIN_RELOAD", value_enum, default_value_t = Reload::Signal)]
    pub plugin_reload: Reload,
    /// The NVIDIA plugin's process name, which `--plugin-reload signal` sends SIGHUP (hostPID
    /// shows it) when no --plugin-pid-file names its PID.
    #[arg(
        long,
        env = "GPU_SHARE_PLUGIN_PROCESS",
        default_value = "nvidia-device-plugin"
    )]
    pub plugin_process: String,
    /// This agent's pod UID (downward API `metadata.uid`): the plugin found by
    /// --plugin-process is signalled only when it runs in this pod, never another pod's plugin
    /// (the GPU Operator's, say) that hostPID also shows. Unset: any process of that name.
    #[arg(long, env = "POD_UID")]
    pub pod_uid: Option<String>,
    /// A file holding the NVIDIA plugin's PID (a shared volume): signalled instead of searching
    /// for --plugin-process.
    #[arg(long, env = "GPU_SHARE_PLUGIN_PID_FILE")]
    pub plugin_pid_file: Option<PathBuf>,
    /// With `--plugin-reload restart`: the label selector of the NVIDIA plugin's pods; the one
    /// on this node is deleted so its DaemonSet starts it again on the new config.
    #[arg(
        long,
        env = "GPU_SHARE_PLUGIN_POD_SELECTOR",
        default_value = "app=nvidia-device-plugin-daemonset"
    )]
    pub plugin_pod_selector: String,
    /// Host /proc (hostPID): process names for the reload signal, pod cgroups for the drain.
    #[arg(long, env = "GPU_SHARE_PROC_ROOT", default_value = "/proc")]
    pub proc_root: PathBuf,
    /// The kubelet's PodResources socket: the drain also evicts the pods it lists as holding a
    /// device that goes away, running on it or not. Unreachable: a warning, and only pods with
    /// processes on those devices are drained.
    #[arg(long, env = "GPU_SHARE_POD_RESOURCES_SOCKET",
          default_value = crate::kubelet::pod_resources::DEFAULT_SOCKET)]
    pub pod_resources_socket: PathBuf,
    /// The MPS control binary (`nvidia-cuda-mps-control`: a path, or a name searched on PATH).
    #[arg(long, env = "GPU_SHARE_MPS_CONTROL", default_value = daemon::DEFAULT_CONTROL_BINARY)]
    pub mps_control: PathBuf,
    /// The MPS root shared with the plugin and the clients: each daemon's pipe and log
    /// directories, and the tmpfs at <root>/shm.
    #[arg(long, env = "GPU_SHARE_MPS_ROOT", default_value = daemon::DEFAULT_ROOT)]
    pub mps_root: PathBuf,
    /// At most this many nodes drain at once, fleet-wide (coordination.k8s.io Leases).
    #[arg(long, env = "GPU_SHARE_MAX_DRAINS", default_value_t = 1)]
    pub max_concurrent_drains: u32,
    /// Give up a drain (state failed, node uncordoned) after this long (`10m`, `1h`).
    #[arg(long, env = "GPU_SHARE_DRAIN_TIMEOUT", default_value = "10m",
          alias = "drain-timeout-secs", value_parser = duration::secs_or_duration)]
    pub drain_timeout: Duration,
    /// Evict GPU pods that no controller owns. Off by default, as `kubectl drain` refuses them
    /// without --force: evicted, a bare pod is gone for good; the agent waits in `blocked`,
    /// naming it, until it is deleted or this is set.
    #[arg(long, env = "GPU_SHARE_EVICT_BARE_PODS")]
    pub evict_bare_pods: bool,
    /// Evict GPU pods that use emptyDir volumes, whose data goes with them. Off by default, as
    /// `kubectl drain` refuses them without the option of the same name.
    #[arg(long, env = "GPU_SHARE_DELETE_EMPTYDIR_DATA")]
    pub delete_emptydir_data: bool,
    /// First wait after a refused eviction (HTTP 429, `500ms`, `2s`); doubles up to 30s.
    #[arg(long, env = "GPU_SHARE_EVICTION_BACKOFF", default_value = "1s",
          alias = "eviction-backoff-ms", value_parser = duration::millis_or_duration)]
    pub eviction_backoff: Duration,
    /// How long a drain slot's Lease outlives its last renewal (renewed every third of it).
    #[arg(long, env = "GPU_SHARE_LEASE_DURATION", default_value = "1m",
          alias = "lease-duration-secs", value_parser = duration::lease_duration)]
    pub lease_duration: Duration,
    /// Re-check a matching node this often (MPS daemons, plugin config).
    #[arg(long, env = "GPU_SHARE_RESYNC_PERIOD", default_value = "5m",
          alias = "resync-secs", value_parser = duration::secs_or_duration)]
    pub resync_period: Duration,
    /// Give up an API request (other than a watch) that has not answered for this long; the
    /// reconcile then fails and is retried with backoff.
    #[arg(long, env = "GPU_SHARE_API_TIMEOUT", default_value = "30s",
          alias = "api-timeout-secs", value_parser = duration::positive_secs_or_duration)]
    pub api_timeout: Duration,
    /// After an apply, wait this long for the Node's allocatable to show what the plan
    /// advertises before publishing `success` (`30s`, `2m`); past it the reconcile fails with
    /// reason AllocatableMismatch, naming each resource's expected and seen counts, and is
    /// retried. `0s`: do not wait. Not used with `--plugin dra` (no extended resources).
    #[arg(long, env = "GPU_SHARE_ALLOCATABLE_TIMEOUT", default_value = "2m",
          value_parser = duration::secs_or_duration)]
    pub allocatable_timeout: Duration,
    /// /healthz, /readyz and /metrics.
    #[arg(long, env = "GPU_SHARE_LISTEN", default_value = "0.0.0.0:9464")]
    pub listen: SocketAddr,
    /// The host's root as mounted in the pod, for the start-up driver and NVML checks and, on
    /// a Jetson/Tegra without NVML, the files that identify its GPU (etc/nv_tegra_release,
    /// sys/devices/soc0/family, the device tree).
    #[arg(long, env = "GPU_SHARE_HOST_ROOT", default_value = "/")]
    pub host_root: PathBuf,
    /// Which device plugin advertises the GPUs: `nvidia` (the stock plugin, through
    /// --plugin-config), `builtin` (served by this agent on the kubelet's device-plugin
    /// sockets; for profiles the stock plugin cannot express) or `dra` (this agent publishes
    /// the node's devices as resource.k8s.io/v1 ResourceSlices; docs/dra.md).
    #[arg(long, env = "GPU_SHARE_PLUGIN", value_enum, default_value_t = PluginKind::Nvidia)]
    pub plugin: PluginKind,
    /// builtin: the kubelet's device-plugin directory (kubelet.sock and the plugin sockets).
    #[arg(long, env = "GPU_SHARE_DEVICE_PLUGIN_DIR", default_value = crate::builtin_plugin::DEFAULT_DIR)]
    pub device_plugin_dir: PathBuf,
    /// builtin: how often device health is read from NVML (tests shorten it).
    #[arg(long, env = "GPU_SHARE_PLUGIN_HEALTH_INTERVAL", default_value = "5s", hide = true,
          alias = "plugin-health-ms", value_parser = duration::millis_or_duration)]
    pub plugin_health_interval: Duration,
    /// How long a device that raised a critical XID must stay quiet (no new critical XID, and
    /// NVML still answering for it) to be healthy again: the built-in plugin reports it Healthy,
    /// the DRA plugin's health stream too, and its taint goes. `0s`: never, NVIDIA's device
    /// plugin's rule (unhealthy until the agent restarts).
    #[arg(long, env = "GPU_SHARE_XID_HEAL_AFTER", default_value = "10m",
          value_parser = duration::secs_or_duration)]
    pub xid_heal_after: Duration,
    /// dra: the effect of the taint a faulted device carries: `NoSchedule` (claims that do not
    /// tolerate it are not allocated the device) or `NoExecute` (the pods holding it are also
    /// evicted by kube-controller-manager).
    #[arg(
        long,
        env = "GPU_SHARE_XID_TAINT_EFFECT",
        value_enum,
        default_value = "NoSchedule"
    )]
    pub xid_taint_effect: crate::dra::taints::TaintEffect,
    /// builtin: how often kubelet.sock is checked for a kubelet restart (tests shorten it).
    #[arg(long, env = "GPU_SHARE_KUBELET_POLL_INTERVAL", default_value = "1s", hide = true,
          alias = "kubelet-poll-ms", value_parser = duration::millis_or_duration)]
    pub kubelet_poll_interval: Duration,
    /// builtin: how Allocate names the devices, comma-separated as NVIDIA's plugin takes it:
    /// `envvar` (NVIDIA_VISIBLE_DEVICES), `cdi-cri` (CDI names in the CRI field), `cdi-annotations`.
    /// dra: `cdi-cri` adds `<cdi kind>=<uuid>` to each prepared device's CDI IDs, and without
    /// `envvar` the claim's CDI spec sets no NVIDIA_VISIBLE_DEVICES.
    #[arg(
        long,
        env = "GPU_SHARE_DEVICE_LIST_STRATEGY",
        value_enum,
        value_delimiter = ',',
        default_value = "envvar"
    )]
    pub device_list_strategy: Vec<crate::builtin_plugin::DeviceListStrategy>,
    /// builtin, dra: the CDI kind of the device names (`<kind>=<uuid>`); the default is the kind
    /// `nvidia-ctk cdi generate` writes.
    #[arg(long, env = "GPU_SHARE_CDI_KIND", default_value = crate::builtin_plugin::cdi::DEFAULT_KIND,
          value_parser = crate::builtin_plugin::cdi::parse_kind)]
    pub cdi_kind: String,
    /// builtin: the key prefix of the `cdi-annotations` annotation.
    #[arg(long, env = "GPU_SHARE_CDI_ANNOTATION_PREFIX",
          default_value = crate::builtin_plugin::cdi::DEFAULT_ANNOTATION_PREFIX,
          value_parser = crate::builtin_plugin::cdi::parse_annotation_prefix)]
    pub cdi_annotation_prefix: String,
    /// builtin: a command run after each apply that changed the MIG layout (and once after the
    /// agent starts), before the new devices are advertised, so the CDI spec names the new MIG
    /// devices; split on whitespace. E.g. `nvidia-ctk cdi generate
    /// --output=/var/run/cdi/nvidia.yaml --device-name-strategy=uuid`.
    #[arg(long, env = "GPU_SHARE_CDI_REFRESH_COMMAND", value_name = "COMMAND")]
    pub cdi_refresh_command: Option<String>,
    /// dra: the kubelet's plugin-registration directory, where the DRA plugin's registration
    /// socket (`gpu.gpu-share.dev-reg.sock`) goes.
    #[arg(long, env = "GPU_SHARE_DRA_REGISTRATION_DIR",
          default_value = crate::dra::kubelet_plugin::DEFAULT_REGISTRATION_DIR)]
    pub dra_registration_dir: PathBuf,
    /// dra: the driver's directory: the DRA socket (`dra.sock`) and the prepared claims'
    /// checkpoint.
    #[arg(long, env = "GPU_SHARE_DRA_PLUGIN_DIR",
          default_value = crate::dra::kubelet_plugin::DEFAULT_PLUGIN_DIR)]
    pub dra_plugin_dir: PathBuf,
    /// dra: where the CDI spec of each prepared claim is written (the runtime's CDI spec dir).
    #[arg(long, env = "GPU_SHARE_CDI_ROOT",
          default_value = crate::dra::kubelet_plugin::DEFAULT_CDI_ROOT)]
    pub cdi_root: PathBuf,
}

/// How the device plugin picks up a new config.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reload {
    Signal,
    Restart,
    None,
}

impl AgentArgs {
    pub(super) fn apply_options(&self) -> ApplyOptions {
        let reload = match self.plugin_reload {
            Reload::Signal => Some(match &self.plugin_pid_file {
                Some(f) => SignalTarget::PidFile(f.clone()),
                None => SignalTarget::ProcessName {
                    name: self.plugin_process.clone(),
                    proc_root: self.proc_root.clone(),
                    pod_uid: self.pod_uid.clone(),
                },
            }),
            Reload::Restart | Reload::None => None,
        };
        ApplyOptions {
            state_dir: self.state_dir.clone(),
            force: false,
            device_plugin: self.plugin_config.as_ref().map(|p| DevicePluginOutput {
                config_path: p.clone(),
                reload,
            }),
            mps: MpsSettings {
                control_binary: self.mps_control.clone(),
                root: self.mps_root.clone(),
                ..MpsSettings::default()
            },
            plugin: self.plugin,
        }
    }
}
