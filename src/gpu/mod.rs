//! The one door to NVML: read the node's GPUs and change their MIG configuration and compute
//! mode.
//!
//! Built on nvml-wrapper; the MIG calls it lacks go through [`raw`], which holds the FFI calls.
//! The only unsafe code here takes a device's raw handle for them (`Device::handle()`, unsafe
//! in nvml-wrapper), each block with its SAFETY comment. The
//! library path is configurable (`--nvml-lib` / `GPU_SHARE_NVML_LIB`), so tests point the real
//! code at the fake `libnvidia-ml.so` in `tests/fake-nvml`.

mod observed;
pub mod raw;
pub mod tegra;
pub mod xid;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};
use serde::{Deserialize, Serialize};

use crate::mig::{catalog, ExistingInstance, GpuInstanceProfile, GpuModel, Placement};
pub use observed::{
    GpuSpecError, MigDevice, MigMode, ObservedGpu, ObservedNode, MAX_SIMULATED_GPUS,
};
pub use raw::NvmlCallError;
pub use tegra::Tegra;

/// `NVML_GPU_INSTANCE_PROFILE_COUNT` in the NVML 13 header nvml-wrapper-sys 0.10 binds.
const GPU_INSTANCE_PROFILE_COUNT: u32 = 17;
/// The library nvml-wrapper loads when no path is given.
pub const DEFAULT_LIBRARY: &str = "libnvidia-ml.so.1";

/// Why the door could not do what was asked.
///
/// Each message already says its cause (NVML's words), so no variant reports that cause again
/// as its `source()`: printed with its chain (`{:#}`), a cause would show twice.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("cannot load NVML from {library}: {} (is the NVIDIA driver installed? `gpu-share doctor` checks each layer)", load_failure(.cause))]
    Load { library: String, cause: NvmlError },
    #[error("GPU {index}: {what}: {cause}")]
    Wrapper {
        index: u32,
        what: &'static str,
        cause: NvmlError,
    },
    #[error("GPU {index}: {cause}")]
    Call { index: u32, cause: NvmlCallError },
    #[error("GPU {index} ({product}) is not in the MIG catalog")]
    UnknownModel { index: u32, product: String },
    #[error("GPU {index}: no GPU instance with id {gi_id}")]
    NoSuchInstance { index: u32, gi_id: u32 },
    #[error("cannot {what} on a Jetson/Tegra integrated GPU ({board}): it has no NVML, so no MIG and no compute modes; share it by time-slicing")]
    Tegra { what: &'static str, board: String },
    #[error(transparent)]
    TegraFiles(#[from] tegra::TegraError),
}

/// What went wrong loading the library: libloading's own words (`…: cannot open shared object
/// file: …`) without nvml-wrapper's "a libloading error occurred" around them.
fn load_failure(cause: &NvmlError) -> String {
    match cause {
        NvmlError::LibloadingError(e) => e.to_string(),
        other => other.to_string(),
    }
}

/// A compute instance: a MIG device that CUDA and the device plugin see.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObservedComputeInstance {
    pub gi_id: u32,
    pub ci_id: u32,
    pub profile_id: u32,
    /// `MIG-…` UUID, what `NVIDIA_VISIBLE_DEVICES` names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
}

/// A process with a CUDA context on a GPU (or on one of its MIG devices).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuProcess {
    pub pid: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used_memory_mib: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gi_id: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ci_id: Option<u32>,
}

/// `nvmlComputeMode_t`: which processes may open a CUDA context on a GPU. Named as `nvidia-smi
/// -c` names them. Not persistent on Linux: a reboot or driver reload brings back `DEFAULT`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ComputeMode {
    /// Any number of contexts from any processes.
    Default,
    /// One context, one thread at a time (support removed by NVIDIA).
    ExclusiveThread,
    /// No context at all.
    Prohibited,
    /// Contexts of one process only: with MPS, the MPS server's.
    ExclusiveProcess,
}

impl ComputeMode {
    /// `DEFAULT`, `EXCLUSIVE_PROCESS`, … as `nvidia-smi -c` takes them.
    pub fn name(self) -> &'static str {
        match self {
            ComputeMode::Default => "DEFAULT",
            ComputeMode::ExclusiveThread => "EXCLUSIVE_THREAD",
            ComputeMode::Prohibited => "PROHIBITED",
            ComputeMode::ExclusiveProcess => "EXCLUSIVE_PROCESS",
        }
    }

    fn from_wrapper(mode: nvml_wrapper::enum_wrappers::device::ComputeMode) -> Self {
        use nvml_wrapper::enum_wrappers::device::ComputeMode as W;
        match mode {
            W::Default => ComputeMode::Default,
            W::ExclusiveThread => ComputeMode::ExclusiveThread,
            W::Prohibited => ComputeMode::Prohibited,
            W::ExclusiveProcess => ComputeMode::ExclusiveProcess,
        }
    }

    fn to_wrapper(self) -> nvml_wrapper::enum_wrappers::device::ComputeMode {
        use nvml_wrapper::enum_wrappers::device::ComputeMode as W;
        match self {
            ComputeMode::Default => W::Default,
            ComputeMode::ExclusiveThread => W::ExclusiveThread,
            ComputeMode::Prohibited => W::Prohibited,
            ComputeMode::ExclusiveProcess => W::ExclusiveProcess,
        }
    }
}

impl std::fmt::Display for ComputeMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The `NVML_ERROR_*` name of an error nvml-wrapper mapped, for messages that must name the
/// NVML error (`NVML_ERROR_NOT_SUPPORTED`); errors that are not NVML return codes keep their text.
pub fn nvml_error_name(e: &NvmlError) -> String {
    let name = match e {
        NvmlError::Uninitialized => "UNINITIALIZED",
        NvmlError::InvalidArg => "INVALID_ARGUMENT",
        NvmlError::NotSupported => "NOT_SUPPORTED",
        NvmlError::NoPermission => "NO_PERMISSION",
        NvmlError::NotFound => "NOT_FOUND",
        NvmlError::DriverNotLoaded => "DRIVER_NOT_LOADED",
        NvmlError::Timeout => "TIMEOUT",
        NvmlError::GpuLost => "GPU_IS_LOST",
        NvmlError::ResetRequired => "RESET_REQUIRED",
        NvmlError::OperatingSystem => "OPERATING_SYSTEM",
        NvmlError::InUse => "IN_USE",
        NvmlError::Unknown => "UNKNOWN",
        other => return other.to_string(),
    };
    format!("NVML_ERROR_{name}")
}

/// What a MIG mode change did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MigModeOutcome {
    /// Current mode is now the one asked for.
    Applied,
    /// The driver accepted it as pending: a GPU reset (or reboot) must follow. The status is
    /// NVML's activation status code (e.g. 16, RESET_REQUIRED; 19, IN_USE).
    Pending { activation_status: u32 },
}

/// The node's GPUs, as the door reaches them: through NVML, or, on a Jetson/Tegra without
/// NVML, from the system's files ([`tegra`]). Reads work on both; MIG and compute-mode changes
/// only through NVML (a Tegra has neither: [`GpuError::Tegra`]).
pub enum Gpus {
    /// Boxed: nvml-wrapper's function table is 12 KB, a Tegra's names a few strings.
    Nvml(Box<NvmlGpus>),
    Tegra(Tegra),
}

/// An open NVML library.
pub struct NvmlGpus {
    nvml: Nvml,
}

/// One NVML session for a long-running process (the agent), opened on first use and kept, as
/// NVIDIA's device plugin keeps its own: loading and initialising NVML for every reconcile and
/// health check costs time (`nvmlInit` can take seconds on a node without persistence mode) and
/// memory. After any error the session is dropped, so the next use opens a fresh one (a driver
/// reloaded under the agent leaves the old session useless). NVML is thread-safe; clones share
/// the session.
#[derive(Clone)]
pub struct SharedGpus {
    library: Option<PathBuf>,
    /// The host's root as this process sees it, where a Tegra's files are looked for.
    host_root: PathBuf,
    open: Arc<Mutex<Option<Arc<Gpus>>>>,
}

impl std::fmt::Debug for SharedGpus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedGpus")
            .field("library", &self.library)
            .field("open", &self.lock().is_some())
            .finish()
    }
}

impl SharedGpus {
    /// Nothing is loaded until the first [`SharedGpus::with`].
    pub fn new(library: Option<PathBuf>, host_root: PathBuf) -> Self {
        SharedGpus {
            library,
            host_root,
            open: Arc::default(),
        }
    }

    /// Run `f` on the session, opening it if needed.
    pub fn with<T, E: From<GpuError>>(
        &self,
        f: impl FnOnce(&Gpus) -> Result<T, E>,
    ) -> Result<T, E> {
        let gpus = self.session()?;
        let result = f(&gpus);
        if result.is_err() {
            *self.lock() = None;
        }
        result
    }

    /// The Jetson/Tegra these GPUs are, when they were found that way (opening the session if
    /// needed); `None` when NVML serves them or nothing could be opened.
    pub fn tegra(&self) -> Option<Tegra> {
        self.session().ok()?.tegra().cloned()
    }

    fn session(&self) -> Result<Arc<Gpus>, GpuError> {
        let mut open = self.lock();
        if let Some(gpus) = &*open {
            return Ok(gpus.clone());
        }
        let gpus = Arc::new(Gpus::open_node(self.library.as_deref(), &self.host_root)?);
        *open = Some(gpus.clone());
        Ok(gpus)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Arc<Gpus>>> {
        // A panic while holding the lock leaves only an Option behind: still usable.
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Gpus {
    /// The GPUs of the node whose root is `host_root`: NVML from `library` (a path, or the
    /// system's `libnvidia-ml.so.1`) when it loads; when it does not and the Tegra files under
    /// `host_root` say this is a Jetson/Tegra, its one integrated GPU (what NVIDIA's device
    /// plugin decides the same way: Tegra files and no NVML). Otherwise NVML's load error.
    pub fn open_node(library: Option<&Path>, host_root: &Path) -> Result<Gpus, GpuError> {
        match NvmlGpus::open(library) {
            Ok(nvml) => Ok(Gpus::Nvml(Box::new(nvml))),
            Err(load @ GpuError::Load { .. }) => {
                match tegra::detect(&tegra::TegraFiles::under(host_root))? {
                    Some(found) => Ok(Gpus::Tegra(found)),
                    None => Err(load),
                }
            }
            Err(other) => Err(other),
        }
    }

    /// NVML alone, for what only NVML can do (the doctor's NVML layer, the XID watch).
    pub fn open(library: Option<&Path>) -> Result<Gpus, GpuError> {
        NvmlGpus::open(library).map(|n| Gpus::Nvml(Box::new(n)))
    }

    /// The Jetson/Tegra these GPUs are, if they are one.
    pub fn tegra(&self) -> Option<&Tegra> {
        match self {
            Gpus::Tegra(t) => Some(t),
            Gpus::Nvml(_) => None,
        }
    }

    /// NVML, or why a Tegra cannot do `what`.
    fn nvml(&self, what: &'static str) -> Result<&NvmlGpus, GpuError> {
        match self {
            Gpus::Nvml(n) => Ok(n),
            Gpus::Tegra(t) => Err(GpuError::Tegra {
                what,
                board: t.describe(),
            }),
        }
    }

    /// The driver version NVML reports; a Tegra's L4T release.
    pub fn driver_version(&self) -> Option<String> {
        match self {
            Gpus::Nvml(n) => n.driver_version(),
            Gpus::Tegra(t) => t.release.clone(),
        }
    }

    /// The newest CUDA version the driver supports, as NVML reports it (none on a Tegra).
    pub fn cuda_driver_version(&self) -> Option<i32> {
        self.nvml("").ok()?.cuda_driver_version()
    }

    /// The product name of GPU `index`.
    pub fn observe_product(&self, index: u32) -> Result<String, GpuError> {
        match self {
            Gpus::Nvml(n) => n.observe_product(index),
            Gpus::Tegra(t) => Ok(t.product()),
        }
    }

    /// Every GPU: identity, MIG mode, GPU and compute instances, MIG device UUIDs, processes.
    /// A Tegra has one GPU, index 0, without MIG, compute mode or process list.
    pub fn observe(&self) -> Result<ObservedNode, GpuError> {
        match self {
            Gpus::Nvml(n) => n.observe(),
            Gpus::Tegra(t) => Ok(ObservedNode {
                gpus: vec![ObservedGpu::tegra(t)],
            }),
        }
    }

    /// See [`NvmlGpus::set_mig_mode`].
    pub fn set_mig_mode(&self, index: u32, enable: bool) -> Result<MigModeOutcome, GpuError> {
        self.nvml("change MIG mode")?.set_mig_mode(index, enable)
    }

    /// See [`NvmlGpus::set_compute_mode`].
    pub fn set_compute_mode(&self, index: u32, mode: ComputeMode) -> Result<(), GpuError> {
        self.nvml("set a compute mode")?
            .set_compute_mode(index, mode)
    }

    /// See [`NvmlGpus::create_instance`].
    pub fn create_instance(
        &self,
        index: u32,
        profile: &GpuInstanceProfile,
        placement: Placement,
    ) -> Result<u32, GpuError> {
        self.nvml("create a MIG instance")?
            .create_instance(index, profile, placement)
    }

    /// See [`NvmlGpus::complete_instance`].
    pub fn complete_instance(
        &self,
        index: u32,
        gi_id: u32,
        profile: &GpuInstanceProfile,
    ) -> Result<(), GpuError> {
        self.nvml("create a MIG compute instance")?
            .complete_instance(index, gi_id, profile)
    }

    /// See [`NvmlGpus::destroy_instance`].
    pub fn destroy_instance(&self, index: u32, gi_id: u32) -> Result<(), GpuError> {
        self.nvml("destroy a MIG instance")?
            .destroy_instance(index, gi_id)
    }
}

impl NvmlGpus {
    /// Load NVML from `library` (a path, or the system's `libnvidia-ml.so.1`) and initialise it.
    pub fn open(library: Option<&Path>) -> Result<NvmlGpus, GpuError> {
        let path = library.map_or_else(|| OsStr::new(DEFAULT_LIBRARY), Path::as_os_str);
        let nvml = Nvml::builder()
            .lib_path(path)
            .init()
            .map_err(|cause| GpuError::Load {
                library: path.to_string_lossy().into_owned(),
                cause,
            })?;
        Ok(NvmlGpus { nvml })
    }

    /// The driver version NVML reports.
    pub fn driver_version(&self) -> Option<String> {
        self.nvml.sys_driver_version().ok()
    }

    /// The newest CUDA version the driver supports, as NVML reports it (major*1000 + minor*10).
    pub fn cuda_driver_version(&self) -> Option<i32> {
        self.nvml.sys_cuda_driver_version().ok()
    }

    fn device(&self, index: u32) -> Result<Device<'_>, GpuError> {
        self.nvml
            .device_by_index(index)
            .map_err(|cause| GpuError::Wrapper {
                index,
                what: "open device",
                cause,
            })
    }

    /// The product name of GPU `index`, as NVML reports it.
    pub fn observe_product(&self, index: u32) -> Result<String, GpuError> {
        self.device(index)?
            .name()
            .map_err(|cause| GpuError::Wrapper {
                index,
                what: "read name",
                cause,
            })
    }

    /// Every GPU: identity, MIG mode, GPU and compute instances, MIG device UUIDs, processes.
    pub fn observe(&self) -> Result<ObservedNode, GpuError> {
        let count = self
            .nvml
            .device_count()
            .map_err(|cause| GpuError::Wrapper {
                index: 0,
                what: "count devices",
                cause,
            })?;
        let gpus = (0..count)
            .map(|i| self.observe_gpu(i))
            .collect::<Result<_, _>>()?;
        Ok(ObservedNode { gpus })
    }

    fn observe_gpu(&self, index: u32) -> Result<ObservedGpu, GpuError> {
        let dev = self.device(index)?;
        let wrap = |what| move |cause| GpuError::Wrapper { index, what, cause };
        let product = dev.name().map_err(wrap("read name"))?;
        let mig = match dev.mig_mode() {
            Ok(m) => Some(MigMode {
                current: m.current == 1,
                pending: m.pending == 1,
            }),
            Err(NvmlError::NotSupported) => None,
            Err(source) => return Err(wrap("read MIG mode")(source)),
        };
        // Unreadable (NOT_SUPPORTED on some GPUs; newer nvml.h wants a MIG device handle once MIG
        // is on) is not an error: the mode is then unknown.
        let compute_mode = dev.compute_mode().ok().map(ComputeMode::from_wrapper);
        let mut gpu = ObservedGpu {
            index,
            uuid: Some(dev.uuid().map_err(wrap("read UUID"))?),
            memory_mib: Some(dev.memory_info().map_err(wrap("read memory"))?.total >> 20),
            pci_bus_id: Some(dev.pci_info().map_err(wrap("read PCI info"))?.bus_id),
            product,
            mig,
            compute_mode,
            instances: Vec::new(),
            compute_instances: Vec::new(),
            processes: Vec::new(),
            tegra: None,
        };
        if mig.is_some_and(|m| m.current) {
            self.observe_mig(&dev, &mut gpu)?;
        } else {
            gpu.processes = processes(&dev, None).map_err(wrap("list processes"))?;
        }
        Ok(gpu)
    }

    /// GPU instances (with their placements as NVML reports them: never derived from ids),
    /// compute instances, and per MIG device its UUID and processes.
    fn observe_mig(&self, dev: &Device<'_>, gpu: &mut ObservedGpu) -> Result<(), GpuError> {
        let index = gpu.index;
        let call = |cause| GpuError::Call { index, cause };
        let model = catalog().model_by_product(&gpu.product);
        // SAFETY: `dev` is borrowed from `self.nvml` for this whole function.
        let handle = unsafe { dev.handle() };
        for profile_index in 0..GPU_INSTANCE_PROFILE_COUNT {
            let Some((profile_id, cap)) =
                raw::gpu_instance_profile(&self.nvml, handle, profile_index).map_err(call)?
            else {
                continue;
            };
            for gi in raw::gpu_instances(&self.nvml, handle, profile_id, cap).map_err(call)? {
                let info = gi.info(&self.nvml).map_err(call)?;
                gpu.instances.push(ExistingInstance {
                    profile: profile_name(model, profile_id),
                    placement: info.placement,
                    gi_id: Some(info.id),
                });
                gpu.compute_instances
                    .extend(self.compute_instances_of(&gi, info.id).map_err(call)?);
            }
        }
        gpu.instances.sort_by_key(|i| i.placement);
        self.observe_mig_devices(dev, gpu)
    }

    fn compute_instances_of(
        &self,
        gi: &raw::GpuInstance<'_>,
        gi_id: u32,
    ) -> Result<Vec<ObservedComputeInstance>, NvmlCallError> {
        self.all_compute_instances(gi)?
            .iter()
            .map(|ci| {
                let info = ci.info(&self.nvml)?;
                Ok(ObservedComputeInstance {
                    gi_id,
                    ci_id: info.id,
                    profile_id: info.profile_id,
                    uuid: None,
                })
            })
            .collect()
    }

    /// Every compute instance of a GI, whatever its CI profile.
    fn all_compute_instances<'n>(
        &'n self,
        gi: &raw::GpuInstance<'n>,
    ) -> Result<Vec<raw::ComputeInstance<'n>>, NvmlCallError> {
        let mut out = Vec::new();
        // CI profile indices 0..NVML_COMPUTE_INSTANCE_PROFILE_COUNT (8 in nvml-wrapper-sys 0.10).
        for ci_index in 0..8 {
            if let Some((ci_profile_id, cap)) = gi.compute_instance_profile(&self.nvml, ci_index)? {
                out.extend(gi.compute_instances(&self.nvml, ci_profile_id, cap)?);
            }
        }
        Ok(out)
    }

    /// Walk the MIG device handles to learn each compute instance's UUID and processes.
    fn observe_mig_devices(&self, dev: &Device<'_>, gpu: &mut ObservedGpu) -> Result<(), GpuError> {
        let index = gpu.index;
        let wrap = |what| move |cause| GpuError::Wrapper { index, what, cause };
        let max = dev.mig_device_count().map_err(wrap("count MIG devices"))?;
        for i in 0..max {
            let mig = match dev.mig_device_by_index(i) {
                Ok(m) => m,
                Err(NvmlError::NotFound | NvmlError::InvalidArg) => continue,
                Err(source) => return Err(wrap("open MIG device")(source)),
            };
            // SAFETY: `mig` is a MIG device handle borrowed from `self.nvml`.
            let (gi_id, ci_id) = raw::mig_device_ids(&self.nvml, unsafe { mig.handle() })
                .map_err(|cause| GpuError::Call { index, cause })?;
            let uuid = mig.uuid().map_err(wrap("read MIG device UUID"))?;
            if let Some(ci) = gpu
                .compute_instances
                .iter_mut()
                .find(|c| c.gi_id == gi_id && c.ci_id == ci_id)
            {
                ci.uuid = Some(uuid);
            }
            let procs = processes(&mig, Some((gi_id, ci_id))).map_err(wrap("list processes"))?;
            gpu.processes.extend(procs);
        }
        Ok(())
    }

    /// Turn MIG mode on or off. On Ampere the driver may leave the change pending until a GPU
    /// reset; that is reported, never papered over.
    pub fn set_mig_mode(&self, index: u32, enable: bool) -> Result<MigModeOutcome, GpuError> {
        let dev = self.device(index)?;
        let wrap = |what| move |cause| GpuError::Wrapper { index, what, cause };
        let status = dev.set_mig_mode(enable).map_err(wrap("set MIG mode"))?;
        let mode = dev.mig_mode().map_err(wrap("read MIG mode"))?;
        if (mode.current == 1) == enable {
            Ok(MigModeOutcome::Applied)
        } else {
            Ok(MigModeOutcome::Pending {
                activation_status: status,
            })
        }
    }

    /// Set the compute mode of whole GPU `index` (needs root; NOT_SUPPORTED on some GPUs, and
    /// EXCLUSIVE_PROCESS in MIG mode). Takes effect at once; lost on reboot or driver reload.
    pub fn set_compute_mode(&self, index: u32, mode: ComputeMode) -> Result<(), GpuError> {
        let mut dev = self.device(index)?;
        dev.set_compute_mode(mode.to_wrapper())
            .map_err(|cause| GpuError::Wrapper {
                index,
                what: "set compute mode",
                cause,
            })
    }

    /// Create a GPU instance of `profile` at `placement`, then its default compute instance,
    /// so it becomes a usable MIG device. Returns the GI id.
    pub fn create_instance(
        &self,
        index: u32,
        profile: &GpuInstanceProfile,
        placement: Placement,
    ) -> Result<u32, GpuError> {
        let dev = self.device(index)?;
        let call = |cause| GpuError::Call { index, cause };
        // SAFETY: `dev` is borrowed from `self.nvml` for this whole function.
        let handle = unsafe { dev.handle() };
        let gi = raw::create_gpu_instance(&self.nvml, handle, profile.profile_id, placement)
            .map_err(call)?;
        let gi_id = gi.info(&self.nvml).map_err(call)?.id;
        self.create_default_ci(&gi, profile).map_err(call)?;
        Ok(gi_id)
    }

    /// Give an existing GPU instance its default compute instance (after an interrupted
    /// create left it without one).
    pub fn complete_instance(
        &self,
        index: u32,
        gi_id: u32,
        profile: &GpuInstanceProfile,
    ) -> Result<(), GpuError> {
        let dev = self.device(index)?;
        let call = |cause| GpuError::Call { index, cause };
        // SAFETY: as in create_instance.
        let gi =
            raw::gpu_instance_by_id(&self.nvml, unsafe { dev.handle() }, gi_id).map_err(call)?;
        self.create_default_ci(&gi, profile).map_err(call)
    }

    fn create_default_ci(
        &self,
        gi: &raw::GpuInstance<'_>,
        profile: &GpuInstanceProfile,
    ) -> Result<(), NvmlCallError> {
        let ci_profile = catalog()
            .ci_profiles(profile)
            .iter()
            .find(|c| c.default)
            .expect("the catalog gives every GI profile a default CI profile");
        let (ci_profile_id, _) = gi
            .compute_instance_profile(&self.nvml, ci_profile.ci_profile_index)?
            .unwrap_or((ci_profile.profile_id, 1));
        gi.create_compute_instance(&self.nvml, ci_profile_id)?;
        Ok(())
    }

    /// Destroy GPU instance `gi_id`: its compute instances first, as NVML requires.
    pub fn destroy_instance(&self, index: u32, gi_id: u32) -> Result<(), GpuError> {
        let dev = self.device(index)?;
        let call = |cause| GpuError::Call { index, cause };
        // SAFETY: as in create_instance.
        let handle = unsafe { dev.handle() };
        let gi = match raw::gpu_instance_by_id(&self.nvml, handle, gi_id) {
            Ok(gi) => gi,
            Err(e) if e.code == raw::NOT_FOUND => {
                return Err(GpuError::NoSuchInstance { index, gi_id })
            }
            Err(e) => return Err(call(e)),
        };
        for ci in self.all_compute_instances(&gi).map_err(call)? {
            ci.destroy(&self.nvml).map_err(call)?;
        }
        gi.destroy(&self.nvml).map_err(call)
    }
}

/// The catalog name of a profile id on this model, or `id<N>` for one the catalog lacks.
fn profile_name(model: Option<&GpuModel>, profile_id: u32) -> String {
    model
        .and_then(|m| m.profile_by_id(profile_id))
        .map_or_else(|| format!("id{profile_id}"), |p| p.name.clone())
}

fn processes(dev: &Device<'_>, mig: Option<(u32, u32)>) -> Result<Vec<GpuProcess>, NvmlError> {
    use nvml_wrapper::enums::device::UsedGpuMemory;
    Ok(dev
        .running_compute_processes()?
        .into_iter()
        .map(|p| GpuProcess {
            pid: p.pid,
            used_memory_mib: match p.used_gpu_memory {
                UsedGpuMemory::Used(bytes) => Some(bytes >> 20),
                UsedGpuMemory::Unavailable => None,
            },
            gi_id: p.gpu_instance_id.or(mig.map(|m| m.0)),
            ci_id: p.compute_instance_id.or(mig.map(|m| m.1)),
        })
        .collect())
}
