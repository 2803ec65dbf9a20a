//! What one MPS daemon is asked to be: where daemons live and how they run ([`MpsSettings`]),
//! the GPUs and default limits of one daemon ([`DaemonSpec`]), the checks a spec must pass
//! before anything changes, and how to say what changed between two specs.

use super::*;

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

/// Refuse a spec that cannot make a daemon.
pub(super) fn check_spec(settings: &MpsSettings, spec: &DaemonSpec) -> Result<(), MpsError> {
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
pub(super) fn check_resource_name(resource: &str) -> Result<(), MpsError> {
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

/// A sentence per changed setting.
pub(super) fn describe_change(old: &DaemonSpec, new: &DaemonSpec) -> String {
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

pub(super) fn show<T: ToString>(value: Option<T>) -> String {
    value.map_or_else(|| "unset".to_string(), |v| v.to_string())
}
