//! The calls NVIDIA's device plugin makes besides MIG management
//! (docs/sources.md#device-plugin-nvml): minor number, CUDA compute capability,
//! MIG device attributes, PCIe topology and NVLink state.

use super::*;
use crate::board::{common_ancestor, compute_capability};

/// `nvmlDeviceAttributes_t` of a MIG device, from the catalog: its CI's SMs, its GI's shared
/// engines, both slice counts, and the GI profile's memory.
fn mig_attributes(s: &Session, d: Dev) -> Result<nvmlDeviceAttributes_t, Ret> {
    // nvml.h: "This API currently only supports MIG device handles."
    let Dev::Mig(i, gi, ci) = d else {
        return Err(NOT_SUPPORTED);
    };
    let ((m, gp), cp) = s
        .gpu(i)?
        .mig_device_profiles(gi, ci)
        .ok_or(INVALID_ARGUMENT)?;
    let e = gi_engines(m, gp);
    Ok(nvmlDeviceAttributes_t {
        multiprocessorCount: ci_sm_count(m, gp, cp),
        sharedCopyEngineCount: e.copy_engines.unwrap_or(0),
        sharedDecoderCount: e.decoders.unwrap_or(0),
        sharedEncoderCount: e.encoders.unwrap_or(0),
        sharedJpegCount: e.jpeg.unwrap_or(0),
        sharedOfaCount: e.ofa.unwrap_or(0),
        gpuInstanceSliceCount: gp.slice_count,
        computeInstanceSliceCount: cp.slice_count,
        memorySizeMB: gi_memory_mib(m, gp),
    })
}

/// The physical GPU behind a handle (a MIG device's parent).
fn parent(d: Dev) -> usize {
    match d {
        Dev::Phys(i) | Dev::Mig(i, ..) => i,
    }
}

exports! {
    /// The N of `/dev/nvidiaN`. MIG device handles: NOT_SUPPORTED (inferred; clients ask the
    /// parent, as go-nvlib does).
    fn nvmlDeviceGetMinorNumber(s, device: nvmlDevice_t, minor: *mut c_uint) {
        let i = match s.device(device)? {
            Dev::Phys(i) => i,
            Dev::Mig(..) => return Err(NOT_SUPPORTED),
        };
        let n = s.gpu(i)?.minor_number.unwrap_or(i as u32);
        // SAFETY: caller's pointer.
        unsafe { put(minor, n) }
    }

    /// Major and minor CUDA compute capability; a MIG device answers its parent's.
    fn nvmlDeviceGetCudaComputeCapability(s, device: nvmlDevice_t, major: *mut c_int, minor: *mut c_int) {
        let g = s.gpu(parent(s.device(device)?))?;
        let [ma, mi] = compute_capability(g).ok_or(NOT_SUPPORTED)?;
        if major.is_null() || minor.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        // SAFETY: caller's pointers, both non-null.
        unsafe { put(major, ma as c_int)?; put(minor, mi as c_int) }
    }

    /// MIG devices only (nvml.h); a physical GPU gives NOT_SUPPORTED.
    fn nvmlDeviceGetAttributes_v2(s, device: nvmlDevice_t, attributes: *mut nvmlDeviceAttributes_t) {
        let a = mig_attributes(s, s.device(device)?)?;
        // SAFETY: caller's pointer.
        unsafe { put(attributes, a) }
    }

    /// The v1 name (go-nvml binds it before it finds `_v2`); same struct and answer.
    fn nvmlDeviceGetAttributes(s, device: nvmlDevice_t, attributes: *mut nvmlDeviceAttributes_t) {
        let a = mig_attributes(s, s.device(device)?)?;
        // SAFETY: caller's pointer.
        unsafe { put(attributes, a) }
    }

    /// Path between two GPUs on a simulated 8-GPU HGX board (`board::common_ancestor`). MIG
    /// device handles: NOT_SUPPORTED (inferred).
    fn nvmlDeviceGetTopologyCommonAncestor(s, device1: nvmlDevice_t, device2: nvmlDevice_t, path: *mut nvmlGpuTopologyLevel_t) {
        let (Dev::Phys(a), Dev::Phys(b)) = (s.device(device1)?, s.device(device2)?) else {
            return Err(NOT_SUPPORTED);
        };
        // SAFETY: caller's pointer.
        unsafe { put(path, common_ancestor(a, b) as nvmlGpuTopologyLevel_t) }
    }

    /// NVLink is not simulated: NOT_SUPPORTED for every link a GPU could have, as on a PCIe
    /// board (NVIDIA's plugin tolerates it); a link beyond `NVML_NVLINK_MAX_LINKS` is an invalid
    /// argument (nvml.h).
    fn nvmlDeviceGetNvLinkState(s, device: nvmlDevice_t, link: c_uint, is_active: *mut nvmlEnableState_t) {
        s.device(device)?;
        if link >= NVML_NVLINK_MAX_LINKS || is_active.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        Err(NOT_SUPPORTED)
    }
}
