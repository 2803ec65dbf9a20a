//! Layer 2, NVML: the library loads, its driver version is the kernel module's, it says which
//! CUDA version the driver supports, and every GPU can be read.

use nvml_wrapper::error::NvmlError;

use super::{Check, Ctx, CudaVersion, DriverVersion, Facts};
use crate::gpu::{GpuError, Gpus, DEFAULT_LIBRARY};
use crate::plan::ObservedGpu;

const NAME: &str = "nvml";

/// What to do about "Driver/library version mismatch".
const MISMATCH_FIX: &str = "the driver's libraries were upgraded (or downgraded) but the old \
     kernel module is still loaded: reboot, or stop every GPU client and reload the module \
     (`sudo rmmod nvidia_uvm nvidia_drm nvidia_modeset nvidia && sudo modprobe nvidia`); if they \
     still differ, reinstall one driver version so libraries and module match";

pub(super) fn check(ctx: &Ctx<'_>, facts: &mut Facts) -> Check {
    if let Some(tegra) = &facts.tegra {
        let mut c = Check::new(
            NAME,
            format!(
                "skipped: a Jetson/Tegra integrated GPU has no NVML ({})",
                tegra.describe()
            ),
        );
        c.warn(
            "GPUs are not listed or checked through NVML on Tegra; MIG and MPS are unavailable",
            "nothing to repair: share the integrated GPU by time-slicing (the device plugin \
             finds it with deviceDiscoveryStrategy tegra)",
        );
        return c;
    }
    let library = ctx
        .nvml_lib
        .map_or_else(|| DEFAULT_LIBRARY.to_string(), |p| p.display().to_string());
    let gpus = match Gpus::open(ctx.nvml_lib) {
        Ok(g) => g,
        Err(GpuError::Load { cause, .. }) => return load_failed(&library, cause, facts),
        Err(e) => return Check::failed(NAME, e.to_string(), "reinstall the NVIDIA driver"),
    };
    let mut check = Check::new(NAME, "");
    let nvml_driver = gpus.driver_version().and_then(|v| DriverVersion::parse(&v));
    let cuda = gpus.cuda_driver_version().and_then(CudaVersion::from_nvml);
    match (&facts.kernel, &nvml_driver) {
        (Some(kernel), Some(lib)) if kernel != lib => {
            return Check::failed(
                NAME,
                format!(
                    "Driver/library version mismatch: the kernel module is {kernel}, NVML \
                     ({library}) is {lib}"
                ),
                MISMATCH_FIX,
            )
        }
        (_, None) => check.warn(
            "NVML did not say its driver version, so it cannot be compared with the kernel module's",
            "check `nvidia-smi` works; reinstall the driver if it does not",
        ),
        _ => {}
    }
    let node = match gpus.observe() {
        Ok(node) => node,
        Err(e) => {
            return Check::failed(
                NAME,
                format!(
                    "NVML {} loaded, but a GPU cannot be read: {e}",
                    show(&nvml_driver)
                ),
                "look at `nvidia-smi -q` and `sudo dmesg | grep -i xid`: a GPU that fell off \
                 the bus or has a fatal Xid needs a reset (`nvidia-smi -r -i N`) or a reboot",
            )
        }
    };
    check.found = format!(
        "NVML {} ({library}){}; CUDA {} supported; {} GPU{} readable",
        show(&nvml_driver),
        if facts.kernel.is_some() && nvml_driver.is_some() {
            " = kernel module"
        } else {
            ""
        },
        cuda.map_or_else(|| "version unknown".into(), |c| c.to_string()),
        node.gpus.len(),
        if node.gpus.len() == 1 { "" } else { "s" },
    );
    if node.gpus.is_empty() {
        check.fail(
            "NVML sees no GPU",
            "check `lspci | grep -i nvidia` and `sudo dmesg | grep -i nvrm`; in a container the \
             GPUs must be passed in (NVIDIA_VISIBLE_DEVICES, the NVIDIA runtime)",
        );
    }
    for gpu in &node.gpus {
        check.details.push(describe(gpu));
        if let Some(m) = gpu.mig.filter(|m| m.current != m.pending) {
            check.warn(
                format!(
                    "GPU {}: MIG mode change pending (now {}, after a reset {})",
                    gpu.index,
                    on_off(m.current),
                    on_off(m.pending)
                ),
                format!(
                    "reset the GPU with nothing running on it (`sudo nvidia-smi -r -i {}`) or \
                     reboot, then `gpu-share apply --resume`",
                    gpu.index
                ),
            );
        }
    }
    facts.nvml_driver = nvml_driver;
    facts.nvml_cuda = cuda;
    facts.node = Some(node);
    check
}

/// Why NVML did not load, said as precisely as NVML's error allows.
fn load_failed(library: &str, source: NvmlError, facts: &Facts) -> Check {
    let kernel = facts
        .kernel
        .as_ref()
        .map_or_else(|| "the kernel module's".into(), |k| k.to_string());
    let (found, fix) = match &source {
        NvmlError::LibloadingError(e) => (
            format!("NVML library not found: cannot load {library}: {e}"),
            format!(
                "install the driver's user-space libraries, same version as the kernel module \
                 ({kernel}; e.g. `apt install libnvidia-compute-{branch}`), or point --nvml-lib \
                 (GPU_SHARE_NVML_LIB) at libnvidia-ml.so.1; in a container the NVIDIA runtime \
                 mounts it",
                branch = facts.kernel.as_ref().map_or(0, |k| k.branch())
            ),
        ),
        NvmlError::LibRmVersionMismatch => (
            format!("Driver/library version mismatch: NVML ({library}) refuses the loaded kernel module ({kernel})"),
            MISMATCH_FIX.to_string(),
        ),
        NvmlError::DriverNotLoaded => (
            format!("NVML ({library}) loaded but finds no driver"),
            "load the kernel module (`sudo modprobe nvidia`); in a container, run it with the \
             NVIDIA runtime so the driver is reachable"
                .to_string(),
        ),
        NvmlError::NoPermission => (
            format!("NVML ({library}) may not open the GPUs: no permission"),
            "run as root, or give the user access to /dev/nvidia* (the video group)".to_string(),
        ),
        NvmlError::FailedToLoadSymbol(s) => (
            format!("{library} lacks NVML function {s}: not NVML, or a driver too old"),
            "point --nvml-lib at the driver's libnvidia-ml.so.1".to_string(),
        ),
        other => (
            format!("NVML ({library}) did not initialise: {other}"),
            "run `nvidia-smi`: it fails the same way and usually says more".to_string(),
        ),
    };
    Check::failed(NAME, found, fix)
}

fn show(v: &Option<DriverVersion>) -> String {
    v.as_ref()
        .map_or_else(|| "(version unknown)".into(), ToString::to_string)
}

fn on_off(b: bool) -> &'static str {
    if b {
        "on"
    } else {
        "off"
    }
}

/// `GPU 0 NVIDIA H100 80GB HBM3: MIG on, 7 instances`.
fn describe(gpu: &ObservedGpu) -> String {
    let mig = match gpu.mig {
        None => "no MIG".to_string(),
        Some(m) if m.current => format!("MIG on, {} instances", gpu.instances.len()),
        Some(_) => "MIG off".to_string(),
    };
    format!("GPU {} {}: {mig}", gpu.index, gpu.product)
}
