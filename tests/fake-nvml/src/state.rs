//! The simulated machine, as persisted in the JSON file named by `FAKE_NVML_STATE`.
//!
//! The file is the single source of truth shared by every process that loads the fake (the agent,
//! the CLI, the test itself): it is read at `nvmlInit`, re-read whenever it changes on disk, and
//! rewritten atomically after every successful mutation, so a crash never leaves half a change.

use std::io::{self, Write};
use std::path::Path;

use gpu_share::mig::catalog::{catalog, GpuModel, Placement};
use serde::{Deserialize, Serialize};

use crate::events::Event;
use crate::model::uuid_from;

/// Everything the fake library knows about the machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct State {
    /// `nvmlSystemGetDriverVersion`.
    #[serde(default = "default_driver")]
    pub driver_version: String,
    /// `nvmlSystemGetCudaDriverVersion[_v2]`: major*1000 + minor*10.
    #[serde(default = "default_cuda")]
    pub cuda_version: i32,
    #[serde(default)]
    pub gpus: Vec<Gpu>,
}

fn default_driver() -> String {
    "580.65.06".into()
}

fn default_cuda() -> i32 {
    13000
}

impl Default for State {
    fn default() -> Self {
        State {
            driver_version: default_driver(),
            cuda_version: default_cuda(),
            gpus: Vec::new(),
        }
    }
}

/// One physical GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gpu {
    /// A catalog key, alias or product name (`h100`, `NVIDIA A30`), or for a GPU without MIG any
    /// product name (then `memory_mib` is required).
    pub model: String,
    /// Framebuffer size; defaults to the catalog's `total_memory_mib`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mib: Option<u64>,
    /// `GPU-…`; filled in deterministically from the index when empty.
    #[serde(default)]
    pub uuid: String,
    /// `00000000:BB:00.0`; filled in from the index when empty.
    #[serde(default)]
    pub pci_bus_id: String,
    /// Absent: the GPU is not MIG-capable and `nvmlDeviceGetMigMode` says NOT_SUPPORTED.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig: Option<MigMode>,
    /// How a MIG mode change takes effect; absent = by architecture (Ampere needs a reset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_activation: Option<MigActivation>,
    /// `nvmlDeviceGetComputeMode` / `nvmlDeviceSetComputeMode`; absent = `default`.
    #[serde(default, skip_serializing_if = "ComputeMode::is_default")]
    pub compute_mode: ComputeMode,
    #[serde(default)]
    pub gpu_instances: Vec<GpuInstance>,
    #[serde(default)]
    pub processes: Vec<Process>,
    /// How many MIG UUIDs this GPU has handed out; mixed into new ones so a re-created compute
    /// instance gets a fresh UUID, as on real hardware, yet runs stay reproducible.
    #[serde(default)]
    pub mig_uuids_issued: u64,
    /// `nvmlDeviceGetMinorNumber` (the N of `/dev/nvidiaN`); filled in from the index when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minor_number: Option<u32>,
    /// `nvmlDeviceGetCudaComputeCapability` as `[major, minor]`; absent = from the product name
    /// (see `board::compute_capability`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_capability: Option<[u32; 2]>,
    /// Events raised on this GPU (XIDs, ECC errors), oldest first: what event sets deliver.
    /// A test appends one with [`Gpu::raise_xid`] and rewrites the file.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<Event>,
}

/// `nvmlDeviceGetMigMode`'s two values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigMode {
    pub current: bool,
    pub pending: bool,
}

/// `nvmlComputeMode_t`, by value: `default` 0, `exclusive_thread` 1 (support removed),
/// `prohibited` 2, `exclusive_process` 3.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ComputeMode {
    #[default]
    Default,
    ExclusiveThread,
    Prohibited,
    ExclusiveProcess,
}

impl ComputeMode {
    /// The `NVML_COMPUTEMODE_*` value.
    pub fn value(self) -> u32 {
        match self {
            ComputeMode::Default => 0,
            ComputeMode::ExclusiveThread => 1,
            ComputeMode::Prohibited => 2,
            ComputeMode::ExclusiveProcess => 3,
        }
    }

    /// From an `NVML_COMPUTEMODE_*` value; `None` beyond the enum.
    pub fn from_value(v: u32) -> Option<ComputeMode> {
        [
            ComputeMode::Default,
            ComputeMode::ExclusiveThread,
            ComputeMode::Prohibited,
            ComputeMode::ExclusiveProcess,
        ]
        .into_iter()
        .find(|m| m.value() == v)
    }

    /// `NVML_COMPUTEMODE_EXCLUSIVE_PROCESS`, for the log.
    pub fn name(self) -> &'static str {
        match self {
            ComputeMode::Default => "NVML_COMPUTEMODE_DEFAULT",
            ComputeMode::ExclusiveThread => "NVML_COMPUTEMODE_EXCLUSIVE_THREAD",
            ComputeMode::Prohibited => "NVML_COMPUTEMODE_PROHIBITED",
            ComputeMode::ExclusiveProcess => "NVML_COMPUTEMODE_EXCLUSIVE_PROCESS",
        }
    }

    fn is_default(&self) -> bool {
        *self == ComputeMode::Default
    }
}

/// What `nvmlDeviceSetMigMode` does when the GPU is idle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MigActivation {
    /// Hopper and later: the new mode is current at once.
    Immediate,
    /// Ampere in this simulation: the mode stays pending (`activationStatus` =
    /// NVML_ERROR_RESET_REQUIRED) until the test calls [`Gpu::reset`].
    ResetRequired,
}

/// A placement in JSON-friendly form (the catalog's `Placement` reads from `[start, size]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Place {
    pub start: u32,
    pub size: u32,
}

impl From<Placement> for Place {
    fn from(p: Placement) -> Self {
        Place {
            start: p.start,
            size: p.size,
        }
    }
}

impl From<Place> for Placement {
    fn from(p: Place) -> Self {
        Placement {
            start: p.start,
            size: p.size,
        }
    }
}

impl Place {
    pub fn new(start: u32, size: u32) -> Self {
        Place { start, size }
    }

    /// One bit per slot (memory slot for a GI, compute slice for a CI).
    pub fn mask(self) -> u32 {
        Placement::from(self).mask()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuInstance {
    pub id: u32,
    /// The profile *id* (`info.id`, e.g. 19), not the profile index.
    pub profile_id: u32,
    pub placement: Place,
    #[serde(default)]
    pub compute_instances: Vec<ComputeInstance>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ComputeInstance {
    pub id: u32,
    pub profile_id: u32,
    /// In compute-slice units inside the GPU instance.
    pub placement: Place,
    /// `MIG-…` UUID of the MIG device this compute instance is.
    #[serde(default)]
    pub uuid: String,
}

/// A process using a GPU; on a MIG GPU it runs in a GI/CI (`ci_id` absent means CI 0).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Process {
    pub pid: u32,
    pub used_memory_mib: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gi_id: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ci_id: Option<u32>,
}

impl Process {
    /// A process on a GPU not in MIG mode.
    pub fn on_gpu(pid: u32, used_memory_mib: u64) -> Self {
        Process {
            pid,
            used_memory_mib,
            gi_id: None,
            ci_id: None,
        }
    }

    /// A process on the MIG device (`gi_id`, `ci_id`).
    pub fn on_mig(pid: u32, used_memory_mib: u64, gi_id: u32, ci_id: u32) -> Self {
        Process {
            pid,
            used_memory_mib,
            gi_id: Some(gi_id),
            ci_id: Some(ci_id),
        }
    }

    /// Whether it runs inside this GPU instance (any of its compute instances).
    pub fn in_gi(&self, gi: u32) -> bool {
        self.gi_id == Some(gi)
    }

    /// Whether it runs on this MIG device.
    pub fn in_ci(&self, gi: u32, ci: u32) -> bool {
        self.in_gi(gi) && self.ci_id.unwrap_or(0) == ci
    }
}

impl Gpu {
    /// A MIG-capable GPU of a catalog model (key, alias or product name; a product name is kept
    /// as the device name), MIG disabled. Panics on an unknown model: the test is wrong.
    pub fn mig(model: &str) -> Gpu {
        let m = catalog()
            .model(model)
            .unwrap_or_else(|| panic!("{model}: not in data/mig-catalog.yaml"));
        Gpu {
            mig: Some(MigMode {
                current: false,
                pending: false,
            }),
            ..Gpu::plain(
                if m.has_product_name(model) {
                    model
                } else {
                    &m.nvml_name
                },
                None,
            )
        }
    }

    /// A GPU without MIG support (e.g. `NVIDIA GeForce RTX 3090`, 24576).
    pub fn non_mig(product_name: &str, memory_mib: u64) -> Gpu {
        Gpu::plain(product_name, Some(memory_mib))
    }

    fn plain(model: &str, memory_mib: Option<u64>) -> Gpu {
        Gpu {
            model: model.into(),
            memory_mib,
            uuid: String::new(),
            pci_bus_id: String::new(),
            mig: None,
            mig_activation: None,
            compute_mode: ComputeMode::Default,
            gpu_instances: Vec::new(),
            processes: Vec::new(),
            mig_uuids_issued: 0,
            minor_number: None,
            compute_capability: None,
            events: Vec::new(),
        }
    }

    /// MIG enabled, nothing pending: the state after a successful enable (and reset on Ampere).
    pub fn mig_enabled(mut self) -> Gpu {
        self.mig = Some(MigMode {
            current: true,
            pending: true,
        });
        self
    }

    pub fn with_process(mut self, p: Process) -> Gpu {
        self.processes.push(p);
        self
    }

    pub fn with_activation(mut self, a: MigActivation) -> Gpu {
        self.mig_activation = Some(a);
        self
    }

    /// A compute mode set beforehand (by an administrator's `nvidia-smi -c`).
    pub fn with_compute_mode(mut self, m: ComputeMode) -> Gpu {
        self.compute_mode = m;
        self
    }

    /// A simulated GPU reset (or reboot): a pending MIG mode becomes current, and GPU instances
    /// are gone because they do not survive a reset (mig-nvml.md 1.6).
    pub fn reset(&mut self) {
        if let Some(mig) = &mut self.mig {
            mig.current = mig.pending;
        }
        self.gpu_instances.clear();
        self.processes.retain(|p| p.gi_id.is_none());
    }

    /// The catalog model, if the name designates one.
    pub fn catalog_model(&self) -> Option<&'static GpuModel> {
        catalog().model(&self.model)
    }

    /// What `nvmlDeviceGetName` returns: the product name as given, or the model's NVML name
    /// when `model` is a key or alias.
    pub fn product_name(&self) -> String {
        match self.catalog_model() {
            Some(m) if !m.has_product_name(&self.model) => m.nvml_name.clone(),
            _ => self.model.clone(),
        }
    }

    pub fn total_memory_mib(&self) -> u64 {
        self.memory_mib
            .or_else(|| self.catalog_model().map(|m| m.total_memory_mib))
            .unwrap_or(0)
    }

    pub fn gpu_instance(&self, id: u32) -> Option<&GpuInstance> {
        self.gpu_instances.iter().find(|g| g.id == id)
    }

    pub fn compute_instance(&self, gi: u32, ci: u32) -> Option<&ComputeInstance> {
        self.gpu_instance(gi)?
            .compute_instances
            .iter()
            .find(|c| c.id == ci)
    }

    /// Fill in defaults and reject states the fake cannot simulate.
    fn normalise(&mut self, index: usize) -> Result<(), String> {
        if self.mig.is_some() && self.catalog_model().is_none() {
            return Err(format!(
                "gpu {index}: {}: MIG needs a catalog model",
                self.model
            ));
        }
        if self.total_memory_mib() == 0 {
            return Err(format!(
                "gpu {index}: {}: memory_mib is required",
                self.model
            ));
        }
        if self.uuid.is_empty() {
            self.uuid = uuid_from("GPU-", &format!("fake-nvml gpu {index} {}", self.model));
        }
        if self.pci_bus_id.is_empty() {
            self.pci_bus_id = format!("00000000:{:02X}:00.0", 0x18 + 0x10 * index);
        }
        self.minor_number.get_or_insert(index as u32);
        Ok(())
    }
}

impl State {
    /// A state with these GPUs (indices in order), defaults filled in.
    pub fn with_gpus(gpus: impl IntoIterator<Item = Gpu>) -> State {
        let mut s = State {
            gpus: gpus.into_iter().collect(),
            ..State::default()
        };
        s.normalise().unwrap_or_else(|e| panic!("{e}"));
        s
    }

    /// Fill in UUIDs and bus ids, check every GPU is simulable.
    pub fn normalise(&mut self) -> Result<(), String> {
        for (i, g) in self.gpus.iter_mut().enumerate() {
            g.normalise(i)?;
        }
        Ok(())
    }

    /// Parse a state file (defaults filled in).
    pub fn read_from(path: impl AsRef<Path>) -> io::Result<State> {
        let text = std::fs::read_to_string(path)?;
        let mut s: State = serde_json::from_str(&text).map_err(io::Error::other)?;
        s.normalise().map_err(io::Error::other)?;
        Ok(s)
    }

    /// Write atomically: temp file in the same directory, fsync, rename, fsync the directory.
    pub fn write_to(&self, path: impl AsRef<Path>) -> io::Result<()> {
        let path = path.as_ref();
        let text = serde_json::to_string_pretty(self).map_err(io::Error::other)?;
        let mut tmp_name = path.as_os_str().to_owned();
        tmp_name.push(format!(".tmp.{}", std::process::id()));
        let tmp = Path::new(&tmp_name);
        let mut f = std::fs::File::create(tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(tmp, path)?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    }
}
