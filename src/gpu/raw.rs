//! The raw NVML calls (all the FFI; `super` only takes the raw device handles they need): the
//! NVML MIG calls nvml-wrapper 0.13 does not wrap (GPU- and
//! compute-instance enumeration, create, destroy, info), called through the wrapper's own
//! loaded library (`Nvml::lib()`) and raw device handles.
//!
//! Invariants every function here relies on:
//! - a device handle comes from `Device::handle()` of a `Device` borrowed from the same `Nvml`,
//!   which stays alive for the call (the `'n` lifetimes tie handles to it);
//! - a GPU/compute-instance handle comes from NVML through this module and is used only until it
//!   is destroyed (`destroy_*` take the handle by value);
//! - out-pointers point at initialised locals or at a buffer whose length is passed as the count;
//! - versioned structs are not used: the v1 info calls are what the NVML 13 header and
//!   nvml-wrapper-sys 0.10 agree on.
//!
//! Return codes are checked raw, before nvml-wrapper's mapping, because it folds
//! `NVML_ERROR_INSUFFICIENT_RESOURCES` (23) into `UnexpectedVariant`.

use std::ffi::CStr;
use std::marker::PhantomData;
use std::mem::MaybeUninit;

use nvml_wrapper::error::nvml_sym;
use nvml_wrapper::Nvml;
use nvml_wrapper_sys::bindings::{
    nvmlComputeInstanceInfo_t, nvmlComputeInstanceProfileInfo_t, nvmlComputeInstance_t,
    nvmlDevice_t, nvmlEventData_t, nvmlGpuInstanceInfo_t, nvmlGpuInstancePlacement_t,
    nvmlGpuInstanceProfileInfo_t, nvmlGpuInstance_t, nvmlReturn_t,
};

use crate::mig::Placement;

/// `NVML_SUCCESS`.
const SUCCESS: nvmlReturn_t = 0;
/// `NVML_ERROR_NOT_SUPPORTED`: a profile index this GPU does not have.
pub const NOT_SUPPORTED: u32 = 3;
/// `NVML_ERROR_NOT_FOUND`.
pub const NOT_FOUND: u32 = 6;
/// `NVML_ERROR_INSUFFICIENT_SIZE`.
const INSUFFICIENT_SIZE: u32 = 7;
/// `NVML_ERROR_IN_USE`: processes or compute instances still on the instance.
pub const IN_USE: u32 = 19;
/// `NVML_ERROR_INSUFFICIENT_RESOURCES`: the placement is taken.
pub const INSUFFICIENT_RESOURCES: u32 = 23;
/// `NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED`, the only engine profile.
const ENGINE_PROFILE_SHARED: u32 = 0;

/// An NVML call that returned an error, with the raw code kept.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{call} failed: {text} (NVML error {code})")]
pub struct NvmlCallError {
    pub call: &'static str,
    pub code: u32,
    pub text: String,
}

/// A GPU instance handle, valid while its `Nvml` lives and the instance is not destroyed.
#[derive(Debug)]
pub struct GpuInstance<'n> {
    handle: nvmlGpuInstance_t,
    _nvml: PhantomData<&'n Nvml>,
}

/// A compute instance handle, likewise.
#[derive(Debug)]
pub struct ComputeInstance<'n> {
    handle: nvmlComputeInstance_t,
    _nvml: PhantomData<&'n Nvml>,
}

/// What `nvmlGpuInstanceGetInfo` / `nvmlComputeInstanceGetInfo_v2` report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InstanceInfo {
    pub id: u32,
    pub profile_id: u32,
    pub placement: Placement,
}

fn check(nvml: &Nvml, call: &'static str, rc: nvmlReturn_t) -> Result<(), NvmlCallError> {
    if rc == SUCCESS {
        return Ok(());
    }
    Err(NvmlCallError {
        call,
        code: rc,
        text: error_text(nvml, rc),
    })
}

/// `nvmlErrorString`, or the code's name when the library lacks it.
fn error_text(nvml: &Nvml, rc: nvmlReturn_t) -> String {
    if let Ok(f) = nvml_sym(nvml.lib().nvmlErrorString.as_ref()) {
        // SAFETY: nvmlErrorString returns a static NUL-terminated string or null.
        let p = unsafe { f(rc) };
        if !p.is_null() {
            // SAFETY: non-null, NUL-terminated, static (the caller must not free it).
            return unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
        }
    }
    format!("error code {rc}")
}

/// Resolve a symbol or say which is missing.
macro_rules! sym {
    ($nvml:expr, $name:ident) => {
        nvml_sym($nvml.lib().$name.as_ref()).map_err(|e| NvmlCallError {
            call: stringify!($name),
            code: 13, // NVML_ERROR_FUNCTION_NOT_FOUND
            text: e.to_string(),
        })?
    };
}

/// `nvmlGpuInstanceGetInfo` and `nvmlComputeInstanceGetInfo_v2` fill structs that differ in
/// type but share the fields read here (`id`, `profileId`, `placement.start/size`): one body for
/// both. `$handle` must be a live handle of the kind `$call` takes.
macro_rules! instance_info {
    ($nvml:expr, $handle:expr, $call:ident, $info:ty) => {{
        let f = sym!($nvml, $call);
        let mut info = MaybeUninit::<$info>::zeroed();
        // SAFETY: the caller's live handle; a valid out-pointer.
        let rc = unsafe { f($handle, info.as_mut_ptr()) };
        check($nvml, stringify!($call), rc)?;
        // SAFETY: filled on success.
        let info = unsafe { info.assume_init() };
        Ok(InstanceInfo {
            id: info.id,
            profile_id: info.profileId,
            placement: Placement {
                start: info.placement.start,
                size: info.placement.size,
            },
        })
    }};
}

/// The profile id (`info.id`) and instance cap of GPU-instance profile `index`, or `None` when
/// this GPU does not have that profile.
pub fn gpu_instance_profile(
    nvml: &Nvml,
    device: nvmlDevice_t,
    index: u32,
) -> Result<Option<(u32, u32)>, NvmlCallError> {
    let f = sym!(nvml, nvmlDeviceGetGpuInstanceProfileInfo);
    let mut info = MaybeUninit::<nvmlGpuInstanceProfileInfo_t>::zeroed();
    // SAFETY: device from the same Nvml; info is a valid out-pointer.
    let rc = unsafe { f(device, index, info.as_mut_ptr()) };
    if rc == NOT_SUPPORTED || rc == 2 {
        return Ok(None);
    }
    check(nvml, "nvmlDeviceGetGpuInstanceProfileInfo", rc)?;
    // SAFETY: NVML filled it on success (and zeroed is a valid value anyway).
    let info = unsafe { info.assume_init() };
    Ok(Some((info.id, info.instanceCount)))
}

/// Every GPU instance of profile `profile_id` on the device.
pub fn gpu_instances<'n>(
    nvml: &'n Nvml,
    device: nvmlDevice_t,
    profile_id: u32,
    capacity: u32,
) -> Result<Vec<GpuInstance<'n>>, NvmlCallError> {
    let f = sym!(nvml, nvmlDeviceGetGpuInstances);
    let mut buf: Vec<nvmlGpuInstance_t> = vec![std::ptr::null_mut(); capacity.max(1) as usize];
    let mut count = buf.len() as u32;
    // SAFETY: buf holds `count` handles; count is a valid in/out pointer.
    let rc = unsafe { f(device, profile_id, buf.as_mut_ptr(), &mut count) };
    if rc == INSUFFICIENT_SIZE {
        return gpu_instances(nvml, device, profile_id, count.max(capacity * 2));
    }
    check(nvml, "nvmlDeviceGetGpuInstances", rc)?;
    buf.truncate(count as usize);
    Ok(buf.into_iter().map(GpuInstance::from_raw).collect())
}

/// The GPU instance with this id.
pub fn gpu_instance_by_id<'n>(
    nvml: &'n Nvml,
    device: nvmlDevice_t,
    id: u32,
) -> Result<GpuInstance<'n>, NvmlCallError> {
    let f = sym!(nvml, nvmlDeviceGetGpuInstanceById);
    let mut gi: nvmlGpuInstance_t = std::ptr::null_mut();
    // SAFETY: valid device and out-pointer.
    let rc = unsafe { f(device, id, &mut gi) };
    check(nvml, "nvmlDeviceGetGpuInstanceById", rc)?;
    Ok(GpuInstance::from_raw(gi))
}

/// Create a GPU instance of `profile_id` at `placement`.
pub fn create_gpu_instance<'n>(
    nvml: &'n Nvml,
    device: nvmlDevice_t,
    profile_id: u32,
    placement: Placement,
) -> Result<GpuInstance<'n>, NvmlCallError> {
    let f = sym!(nvml, nvmlDeviceCreateGpuInstanceWithPlacement);
    let pl = nvmlGpuInstancePlacement_t {
        start: placement.start,
        size: placement.size,
    };
    let mut gi: nvmlGpuInstance_t = std::ptr::null_mut();
    // SAFETY: valid device, placement and out-pointer.
    let rc = unsafe { f(device, profile_id, &pl, &mut gi) };
    check(nvml, "nvmlDeviceCreateGpuInstanceWithPlacement", rc)?;
    Ok(GpuInstance::from_raw(gi))
}

impl<'n> GpuInstance<'n> {
    fn from_raw(handle: nvmlGpuInstance_t) -> Self {
        GpuInstance {
            handle,
            _nvml: PhantomData,
        }
    }

    /// Id, profile id and placement.
    pub fn info(&self, nvml: &'n Nvml) -> Result<InstanceInfo, NvmlCallError> {
        // The macro needs a live handle: `self` holds one for the Nvml it borrows.
        instance_info!(
            nvml,
            self.handle,
            nvmlGpuInstanceGetInfo,
            nvmlGpuInstanceInfo_t
        )
    }

    /// The profile id and cap of compute-instance profile `index` inside this GI, or `None`.
    pub fn compute_instance_profile(
        &self,
        nvml: &'n Nvml,
        index: u32,
    ) -> Result<Option<(u32, u32)>, NvmlCallError> {
        let f = sym!(nvml, nvmlGpuInstanceGetComputeInstanceProfileInfo);
        let mut info = MaybeUninit::<nvmlComputeInstanceProfileInfo_t>::zeroed();
        // SAFETY: live GI handle; valid out-pointer.
        let rc = unsafe { f(self.handle, index, ENGINE_PROFILE_SHARED, info.as_mut_ptr()) };
        if rc == NOT_SUPPORTED || rc == 2 {
            return Ok(None);
        }
        check(nvml, "nvmlGpuInstanceGetComputeInstanceProfileInfo", rc)?;
        // SAFETY: filled on success.
        let info = unsafe { info.assume_init() };
        Ok(Some((info.id, info.instanceCount)))
    }

    /// The compute instances of `profile_id` in this GI.
    pub fn compute_instances(
        &self,
        nvml: &'n Nvml,
        profile_id: u32,
        capacity: u32,
    ) -> Result<Vec<ComputeInstance<'n>>, NvmlCallError> {
        let f = sym!(nvml, nvmlGpuInstanceGetComputeInstances);
        let mut buf: Vec<nvmlComputeInstance_t> =
            vec![std::ptr::null_mut(); capacity.max(1) as usize];
        let mut count = buf.len() as u32;
        // SAFETY: buf holds `count` handles.
        let rc = unsafe { f(self.handle, profile_id, buf.as_mut_ptr(), &mut count) };
        if rc == INSUFFICIENT_SIZE {
            return self.compute_instances(nvml, profile_id, count.max(capacity * 2));
        }
        check(nvml, "nvmlGpuInstanceGetComputeInstances", rc)?;
        buf.truncate(count as usize);
        Ok(buf.into_iter().map(ComputeInstance::from_raw).collect())
    }

    /// Create a compute instance of `profile_id` in this GI.
    pub fn create_compute_instance(
        &self,
        nvml: &'n Nvml,
        profile_id: u32,
    ) -> Result<ComputeInstance<'n>, NvmlCallError> {
        let f = sym!(nvml, nvmlGpuInstanceCreateComputeInstance);
        let mut ci: nvmlComputeInstance_t = std::ptr::null_mut();
        // SAFETY: live GI handle; valid out-pointer.
        let rc = unsafe { f(self.handle, profile_id, &mut ci) };
        check(nvml, "nvmlGpuInstanceCreateComputeInstance", rc)?;
        Ok(ComputeInstance::from_raw(ci))
    }

    /// Destroy this GI (its compute instances must be gone first).
    pub fn destroy(self, nvml: &'n Nvml) -> Result<(), NvmlCallError> {
        let f = sym!(nvml, nvmlGpuInstanceDestroy);
        // SAFETY: live GI handle, consumed here.
        let rc = unsafe { f(self.handle) };
        check(nvml, "nvmlGpuInstanceDestroy", rc)
    }
}

impl<'n> ComputeInstance<'n> {
    fn from_raw(handle: nvmlComputeInstance_t) -> Self {
        ComputeInstance {
            handle,
            _nvml: PhantomData,
        }
    }

    /// Id, profile id and placement inside its GI.
    pub fn info(&self, nvml: &'n Nvml) -> Result<InstanceInfo, NvmlCallError> {
        // The macro needs a live handle: `self` holds one for the Nvml it borrows.
        instance_info!(
            nvml,
            self.handle,
            nvmlComputeInstanceGetInfo_v2,
            nvmlComputeInstanceInfo_t
        )
    }

    /// Destroy this compute instance.
    pub fn destroy(self, nvml: &'n Nvml) -> Result<(), NvmlCallError> {
        let f = sym!(nvml, nvmlComputeInstanceDestroy);
        // SAFETY: live CI handle, consumed here.
        let rc = unsafe { f(self.handle) };
        check(nvml, "nvmlComputeInstanceDestroy", rc)
    }
}

/// The GPU-instance and compute-instance ids of a MIG device handle.
pub fn mig_device_ids(nvml: &Nvml, mig_device: nvmlDevice_t) -> Result<(u32, u32), NvmlCallError> {
    let gi_f = sym!(nvml, nvmlDeviceGetGpuInstanceId);
    let ci_f = sym!(nvml, nvmlDeviceGetComputeInstanceId);
    let (mut gi, mut ci) = (0u32, 0u32);
    // SAFETY: MIG device handle from the same Nvml; valid out-pointers.
    check(nvml, "nvmlDeviceGetGpuInstanceId", unsafe {
        gi_f(mig_device, &mut gi)
    })?;
    // SAFETY: as above.
    check(nvml, "nvmlDeviceGetComputeInstanceId", unsafe {
        ci_f(mig_device, &mut ci)
    })?;
    Ok((gi, ci))
}

/// One event from `nvmlEventSetWait_v2`, with the MIG device's ids that nvml-wrapper's
/// `EventSet::wait` drops (`None` for 0xFFFFFFFF: the event is the whole GPU's).
#[derive(Debug, Clone, Copy)]
pub struct RawEvent {
    pub device: nvmlDevice_t,
    pub event_type: u64,
    pub data: u64,
    pub gpu_instance: Option<u32>,
    pub compute_instance: Option<u32>,
}

/// `NVML_ERROR_TIMEOUT`: no event within the wait.
const TIMEOUT: nvmlReturn_t = 10;

/// Wait up to `timeout_ms` for the next event of `set`; `None` when none came.
pub fn wait_event(
    nvml: &Nvml,
    set: &nvml_wrapper::EventSet<'_>,
    timeout_ms: u32,
) -> Result<Option<RawEvent>, NvmlCallError> {
    let f = sym!(nvml, nvmlEventSetWait_v2);
    // SAFETY: zeroed plain-data struct, filled by the call.
    let mut data: nvmlEventData_t = unsafe { std::mem::zeroed() };
    // SAFETY: a live event set of this Nvml (borrowed for the call); a valid out-pointer.
    let rc = unsafe { f(set.handle(), &mut data, timeout_ms) };
    if rc == TIMEOUT {
        return Ok(None);
    }
    check(nvml, "nvmlEventSetWait_v2", rc)?;
    let id = |v: u32| (v != u32::MAX).then_some(v);
    Ok(Some(RawEvent {
        device: data.device,
        event_type: data.eventType,
        data: data.eventData,
        gpu_instance: id(data.gpuInstanceId),
        compute_instance: id(data.computeInstanceId),
    }))
}
