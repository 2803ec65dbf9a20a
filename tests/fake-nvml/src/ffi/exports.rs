//! The NVML functions gpu-share calls (directly or through nvml-wrapper), grouped as in nvml.h.
//! Every `unsafe` block below only passes the caller's pointers to the helpers in `mod.rs`,
//! under the module's safety contract.

use super::*;

fn device_name(s: &Session, d: Dev) -> Result<String, Ret> {
    match d {
        Dev::Phys(i) => Ok(s.gpu(i)?.product_name()),
        Dev::Mig(i, gi, ci) => {
            let g = s.gpu(i)?;
            let ((_, gp), cp) = g.mig_device_profiles(gi, ci).ok_or(INVALID_ARGUMENT)?;
            let profile = mig_device_profile_name(gp, cp);
            Ok(format!("{} MIG {profile}", g.product_name()))
        }
    }
}

/// GPU UUIDs and MIG UUIDs both resolve (a MIG UUID gives the MIG device handle).
fn find_by_uuid(s: &mut Session, wanted: &str) -> Option<nvmlDevice_t> {
    for (i, g) in s.state.gpus.iter().enumerate() {
        if g.uuid == wanted {
            return Some(device_handle(i));
        }
        let mut migs = g.mig_devices().into_iter();
        if let Some((gi, ci)) = migs.find(|(gi, ci)| {
            g.compute_instance(*gi, *ci)
                .is_some_and(|c| c.uuid == wanted)
        }) {
            return Some(s.handle(Obj::Mig(i, gi, ci)) as nvmlDevice_t);
        }
    }
    None
}

fn pci_info(g: &Gpu) -> nvmlPciInfo_t {
    let hex = |r: std::ops::Range<usize>| {
        let field = g.pci_bus_id.get(r);
        field
            .and_then(|h| u32::from_str_radix(h, 16).ok())
            .unwrap_or(0)
    };
    let (domain, bus, device) = (hex(0..8), hex(9..11), hex(12..14));
    nvmlPciInfo_t {
        busIdLegacy: c_array(&format!("{:04X}:{bus:02X}:{device:02X}.0", domain & 0xFFFF)),
        domain,
        bus,
        device,
        pciDeviceId: g.catalog_model().map_or(0, |m| m.pci_device_id),
        pciSubSystemId: 0,
        busId: c_array(&format!("{domain:08X}:{bus:02X}:{device:02X}.0")),
    }
}

/// `domain`, `bus`, `device` of a PCI bus id in one of the forms nvml.h accepts for
/// `nvmlDeviceGetHandleByPciBusId_v2` (hex): `domain:bus:device.function`,
/// `domain:bus:device`, `bus:device.function`. Only function 0 exists on a GPU.
fn parse_bus_id(text: &str) -> Option<(u32, u32, u32)> {
    let (location, function) = match text.split_once('.') {
        Some((l, f)) => (l, Some(u32::from_str_radix(f, 16).ok()?)),
        None => (text, None),
    };
    let hex: Vec<u32> = location
        .split(':')
        .map(|h| u32::from_str_radix(h, 16).ok())
        .collect::<Option<_>>()?;
    let (domain, bus, device) = match (hex.as_slice(), function) {
        ([d, b, v], _) => (*d, *b, *v),
        ([b, v], Some(_)) => (0, *b, *v),
        _ => return None,
    };
    (function.unwrap_or(0) == 0).then_some((domain, bus, device))
}

/// The physical GPU at a PCI bus id (MIG devices have no bus id of their own).
fn find_by_bus_id(s: &Session, wanted: (u32, u32, u32)) -> Option<nvmlDevice_t> {
    let at = |g: &Gpu| {
        let p = pci_info(g);
        (p.domain, p.bus, p.device)
    };
    let i = s.state.gpus.iter().position(|g| at(g) == wanted)?;
    Some(device_handle(i))
}

/// The legacy `nvmlPciInfo_t` that `nvmlDeviceGetPciInfo` (v1) and `_v2` fill: a 16-byte
/// `busId`, the five ids, four reserved words (nvml.h before API v10, e.g. the NVML 8 header;
/// `_v3` replaced the reserved words with the 32-byte `busId`). 52 bytes, so a legacy caller's
/// buffer is never overrun.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct LegacyPciInfo {
    bus_id: [c_char; 16],
    domain: c_uint,
    bus: c_uint,
    device: c_uint,
    pci_device_id: c_uint,
    pci_sub_system_id: c_uint,
    reserved: [c_uint; 4],
}

fn legacy_pci_info(g: &Gpu) -> LegacyPciInfo {
    let p = pci_info(g);
    LegacyPciInfo {
        bus_id: p.busIdLegacy,
        domain: p.domain,
        bus: p.bus,
        device: p.device,
        pci_device_id: p.pciDeviceId,
        pci_sub_system_id: p.pciSubSystemId,
        reserved: [0; 4],
    }
}

/// The v1 `nvmlComputeInstanceInfo_t`: `_v2` appended `placement` (nvml.h 11.1), so v1 fills
/// only the first four fields.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct ComputeInstanceInfoV1 {
    device: nvmlDevice_t,
    gpu_instance: nvmlGpuInstance_t,
    id: c_uint,
    profile_id: c_uint,
}

fn compute_instance_info(
    s: &mut Session,
    ci: nvmlComputeInstance_t,
) -> Result<nvmlComputeInstanceInfo_t, Ret> {
    let (i, gi, id) = s.ci(ci)?;
    let c = s.gpu(i)?.compute_instance(gi, id).ok_or(INVALID_ARGUMENT)?;
    let placement = nvmlComputeInstancePlacement_t {
        start: c.placement.start,
        size: c.placement.size,
    };
    let profile_id = c.profile_id;
    Ok(nvmlComputeInstanceInfo_t {
        device: device_handle(i),
        gpuInstance: s.handle(Obj::Gi(i, gi)) as nvmlGpuInstance_t,
        id,
        profileId: profile_id,
        placement,
    })
}

/// Processes a device handle sees: every one on a physical GPU (with GI/CI ids in MIG mode),
/// or a MIG device's own.
fn running_processes(s: &Session, device: nvmlDevice_t) -> Result<Vec<nvmlProcessInfo_v2_t>, Ret> {
    let (i, on) = match s.device(device)? {
        Dev::Phys(i) => (i, None),
        Dev::Mig(i, gi, ci) => (i, Some((gi, ci))),
    };
    let procs = s.gpu(i)?.processes.iter();
    let mine = procs.filter(|p| on.is_none_or(|(gi, ci)| p.in_ci(gi, ci)));
    Ok(mine.map(process_info).collect())
}

/// The `nvmlProcessInfo_v1_t` list of `nvmlDeviceGetComputeRunningProcesses` (v1): pid and
/// memory only, 16 bytes an entry.
fn v1_processes(list: &[nvmlProcessInfo_v2_t]) -> Vec<nvmlProcessInfo_v1_t> {
    let v1 = |p: &nvmlProcessInfo_v2_t| nvmlProcessInfo_v1_t {
        pid: p.pid,
        usedGpuMemory: p.usedGpuMemory,
    };
    list.iter().map(v1).collect()
}

/// # Safety
/// `bus_id` is null or NUL-terminated.
unsafe fn handle_by_bus_id(s: &Session, bus_id: *const c_char) -> Result<nvmlDevice_t, Ret> {
    if bus_id.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    // SAFETY: non-null, and NUL-terminated per this function's contract.
    let text = unsafe { CStr::from_ptr(bus_id) }
        .to_str()
        .map_err(|_| INVALID_ARGUMENT)?;
    let wanted = parse_bus_id(text.trim()).ok_or(INVALID_ARGUMENT)?;
    find_by_bus_id(s, wanted).ok_or(NOT_FOUND)
}

fn gi_placements(p: &GpuInstanceProfile) -> Vec<nvmlGpuInstancePlacement_t> {
    let to = |p: &gpu_share::mig::catalog::Placement| nvmlGpuInstancePlacement_t {
        start: p.start,
        size: p.size,
    };
    p.placements.iter().map(to).collect()
}

fn ci_placements(p: &ComputeInstanceProfile) -> Vec<nvmlComputeInstancePlacement_t> {
    let to = |p: &gpu_share::mig::catalog::Placement| nvmlComputeInstancePlacement_t {
        start: p.start,
        size: p.size,
    };
    p.placements.iter().map(to).collect()
}

fn create_gi(
    s: &mut Session,
    function: &str,
    (device, profile_id): (nvmlDevice_t, c_uint),
    at: Option<Place>,
    out: *mut nvmlGpuInstance_t,
) -> Result<(), Ret> {
    let i = s.phys(device)?;
    if out.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    let plan = s.gpu(i)?.plan_create_gpu_instance(profile_id, at);
    let args = json!({ "profile_id": profile_id, "placement": at });
    let Change::AddGi(g) = s.mutate(function, i, args, (None, None), plan)? else {
        unreachable!("planned a GI creation")
    };
    let h = s.handle(Obj::Gi(i, g.id));
    // SAFETY: `out` is non-null and valid per the NVML contract.
    unsafe { put(out, h as nvmlGpuInstance_t) }
}

fn create_ci(
    s: &mut Session,
    function: &str,
    (gi, profile_id): (nvmlGpuInstance_t, c_uint),
    at: Option<Place>,
    out: *mut nvmlComputeInstance_t,
) -> Result<(), Ret> {
    let (i, id) = s.gi(gi)?;
    if out.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    let plan = s.gpu(i)?.plan_create_compute_instance(id, profile_id, at);
    let args = json!({ "gi": id, "profile_id": profile_id, "placement": at });
    let Change::AddCi(_, c) = s.mutate(function, i, args, (Some(id), None), plan)? else {
        unreachable!("planned a CI creation")
    };
    let h = s.handle(Obj::Ci(i, id, c.id));
    // SAFETY: `out` is non-null and valid per the NVML contract.
    unsafe { put(out, h as nvmlComputeInstance_t) }
}

/// The GI and CI profiles for the CI-profile-info calls; `engProfile` must be SHARED (0).
fn ci_profile_for(
    s: &Session,
    gi: nvmlGpuInstance_t,
    profile: c_uint,
    eng: c_uint,
) -> Result<(GiProfile, &'static ComputeInstanceProfile), Ret> {
    let (i, id) = s.gi(gi)?;
    if eng != NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED {
        return Err(INVALID_ARGUMENT);
    }
    let g = s.gpu(i)?;
    let c = g.ci_profile(id, profile)?;
    Ok((g.ci_profiles(id)?.0, c))
}

/// Fill a v2 or v3 `nvmlComputeInstanceProfileInfo` per its version (v3 = v2 + `capabilities`).
///
/// # Safety
/// `info` is null or valid for the struct its `version` names.
unsafe fn put_ci_info_v(
    info: *mut nvmlComputeInstanceProfileInfo_v2_t,
    (m, p): GiProfile,
    c: &ComputeInstanceProfile,
) -> Result<(), Ret> {
    // SAFETY: per this function's contract.
    let ver = unsafe { version(info, &[CI_INFO_V2, CI_INFO_V3])? };
    let b = ci_info(m, p, c);
    let v2 = nvmlComputeInstanceProfileInfo_v2_t {
        version: ver,
        id: b.id,
        sliceCount: b.sliceCount,
        instanceCount: b.instanceCount,
        multiprocessorCount: b.multiprocessorCount,
        sharedCopyEngineCount: b.sharedCopyEngineCount,
        sharedDecoderCount: b.sharedDecoderCount,
        sharedEncoderCount: b.sharedEncoderCount,
        sharedJpegCount: b.sharedJpegCount,
        sharedOfaCount: b.sharedOfaCount,
        name: c_array(&format!("MIG {}", ci_profile_name(p, c))),
    };
    // SAFETY: per this function's contract; both versions start with v2's layout.
    unsafe { put(info, v2)? };
    if ver == CI_INFO_V3 {
        let caps = match p.name.contains("+gfx") {
            true => NVML_COMPUTE_INSTANCE_PROFILE_CAPS_GFX,
            false => 0,
        };
        let v3 = info.cast::<nvmlComputeInstanceProfileInfo_v3_t>();
        // SAFETY: `info` is a v3 struct (its version says so), valid per the contract.
        unsafe { (*v3).capabilities = caps };
    }
    Ok(())
}

exports! {
    fn nvmlSystemGetDriverVersion(s, version: *mut c_char, length: c_uint) {
        // SAFETY: caller's pointers.
        unsafe { put_str(version, length, &s.state.driver_version) }
    }

    /// `<CUDA major>.<driver version>`, e.g. `13.580.65.06`, the shape real NVML reports.
    fn nvmlSystemGetNVMLVersion(s, version: *mut c_char, length: c_uint) {
        let v = format!("{}.{}", s.state.cuda_version / 1000, s.state.driver_version);
        // SAFETY: caller's pointers.
        unsafe { put_str(version, length, &v) }
    }

    fn nvmlSystemGetCudaDriverVersion(s, v: *mut c_int) {
        // SAFETY: caller's pointers.
        unsafe { put(v, s.state.cuda_version) }
    }

    fn nvmlSystemGetCudaDriverVersion_v2(s, v: *mut c_int) {
        // SAFETY: caller's pointers.
        unsafe { put(v, s.state.cuda_version) }
    }

    /// Physical GPUs only: MIG devices are never counted.
    fn nvmlDeviceGetCount_v2(s, count: *mut c_uint) {
        // SAFETY: caller's pointers.
        unsafe { put(count, s.state.gpus.len() as c_uint) }
    }

    /// v1 differs from `_v2` only for GPUs the caller may not access (nvml.h), which the fake
    /// does not simulate.
    fn nvmlDeviceGetCount(s, count: *mut c_uint) {
        // SAFETY: caller's pointers.
        unsafe { put(count, s.state.gpus.len() as c_uint) }
    }

    fn nvmlDeviceGetHandleByIndex_v2(s, index: c_uint, device: *mut nvmlDevice_t) {
        s.gpu(index as usize)?;
        // SAFETY: caller's pointers.
        unsafe { put(device, device_handle(index as usize)) }
    }

    /// As `_v2` (the difference is the same as for the count).
    fn nvmlDeviceGetHandleByIndex(s, index: c_uint, device: *mut nvmlDevice_t) {
        s.gpu(index as usize)?;
        // SAFETY: caller's pointers.
        unsafe { put(device, device_handle(index as usize)) }
    }

    /// nvml.h: forms `domain:bus:device.function`, `domain:bus:device`, `bus:device.function`
    /// (hex, any case); a malformed id → INVALID_ARGUMENT, no GPU there → NOT_FOUND.
    fn nvmlDeviceGetHandleByPciBusId_v2(s, bus_id: *const c_char, device: *mut nvmlDevice_t) {
        // SAFETY: caller's pointers (NUL-terminated per the NVML contract).
        let h = unsafe { handle_by_bus_id(s, bus_id)? };
        // SAFETY: caller's pointers.
        unsafe { put(device, h) }
    }

    /// The unversioned (v1) name go-nvml binds before it finds `_v2`; same lookup.
    fn nvmlDeviceGetHandleByPciBusId(s, bus_id: *const c_char, device: *mut nvmlDevice_t) {
        // SAFETY: caller's pointers (NUL-terminated per the NVML contract).
        let h = unsafe { handle_by_bus_id(s, bus_id)? };
        // SAFETY: caller's pointers.
        unsafe { put(device, h) }
    }

    fn nvmlDeviceGetHandleByUUID(s, uuid: *const c_char, device: *mut nvmlDevice_t) {
        if uuid.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        // SAFETY: non-null, and NUL-terminated per the NVML contract.
        let wanted = unsafe { CStr::from_ptr(uuid) }.to_str().map_err(|_| INVALID_ARGUMENT)?;
        let h = find_by_uuid(s, wanted).ok_or(NOT_FOUND)?;
        // SAFETY: caller's pointers.
        unsafe { put(device, h) }
    }

    fn nvmlDeviceGetIndex(s, device: nvmlDevice_t, index: *mut c_uint) {
        let i = s.phys(device)?;
        // SAFETY: caller's pointers.
        unsafe { put(index, i as c_uint) }
    }

    /// MIG devices: "<parent name> MIG <profile>" (mig-nvml.md 1.5).
    fn nvmlDeviceGetName(s, device: nvmlDevice_t, name: *mut c_char, length: c_uint) {
        let n = device_name(s, s.device(device)?)?;
        // SAFETY: caller's pointers.
        unsafe { put_str(name, length, &n) }
    }

    fn nvmlDeviceGetUUID(s, device: nvmlDevice_t, uuid: *mut c_char, length: c_uint) {
        let u = match s.device(device)? {
            Dev::Phys(i) => s.gpu(i)?.uuid.clone(),
            Dev::Mig(i, gi, ci) => {
                let c = s.gpu(i)?.compute_instance(gi, ci).ok_or(INVALID_ARGUMENT)?;
                c.uuid.clone()
            }
        };
        // SAFETY: caller's pointers.
        unsafe { put_str(uuid, length, &u) }
    }

    /// A MIG device reports its parent's PCI location.
    fn nvmlDeviceGetPciInfo_v3(s, device: nvmlDevice_t, pci: *mut nvmlPciInfo_t) {
        let (Dev::Phys(i) | Dev::Mig(i, ..)) = s.device(device)?;
        let info = pci_info(s.gpu(i)?);
        // SAFETY: caller's pointers.
        unsafe { put(pci, info) }
    }

    /// The legacy 52-byte struct (see `LegacyPciInfo`).
    fn nvmlDeviceGetPciInfo_v2(s, device: nvmlDevice_t, pci: *mut LegacyPciInfo) {
        let (Dev::Phys(i) | Dev::Mig(i, ..)) = s.device(device)?;
        let info = legacy_pci_info(s.gpu(i)?);
        // SAFETY: caller's pointers.
        unsafe { put(pci, info) }
    }

    /// The legacy 52-byte struct, as `_v2`.
    fn nvmlDeviceGetPciInfo(s, device: nvmlDevice_t, pci: *mut LegacyPciInfo) {
        let (Dev::Phys(i) | Dev::Mig(i, ..)) = s.device(device)?;
        let info = legacy_pci_info(s.gpu(i)?);
        // SAFETY: caller's pointers.
        unsafe { put(pci, info) }
    }

    /// The aggregate on a physical GPU (nvml.h: with enough privileges, which the fake always
    /// has), the GPU instance's memory on a MIG device.
    fn nvmlDeviceGetMemoryInfo(s, device: nvmlDevice_t, memory: *mut nvmlMemory_t) {
        let (total, used) = memory_mib(s, s.device(device)?)?;
        let free = total.saturating_sub(used) * MIB;
        let m = nvmlMemory_t { total: total * MIB, free, used: used * MIB };
        // SAFETY: caller's pointers.
        unsafe { put(memory, m) }
    }

    /// As v1, `reserved` = 0; the version must be `nvmlMemory_v2` (nvml-wrapper sets it).
    fn nvmlDeviceGetMemoryInfo_v2(s, device: nvmlDevice_t, memory: *mut nvmlMemory_v2_t) {
        // SAFETY: caller's pointers.
        unsafe { version(memory, &[MEMORY_V2])? };
        let (total, used) = memory_mib(s, s.device(device)?)?;
        let free = total.saturating_sub(used) * MIB;
        let m = nvmlMemory_v2_t {
            version: MEMORY_V2, total: total * MIB, reserved: 0, free, used: used * MIB,
        };
        // SAFETY: caller's pointers.
        unsafe { put(memory, m) }
    }

    /// Every process on a physical GPU (with GI/CI ids in MIG mode), or a MIG device's own.
    /// `_v3` and `_v2` share the 24-byte `nvmlProcessInfo_v2_t` (nvml.h: `nvmlProcessInfo_t`
    /// is `nvmlProcessInfo_v2_t`).
    fn nvmlDeviceGetComputeRunningProcesses_v3(
        s, device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_t
    ) {
        let list = running_processes(s, device)?;
        // SAFETY: caller's pointers.
        unsafe { put_counted(infos, count, &list, false) }
    }

    fn nvmlDeviceGetComputeRunningProcesses_v2(
        s, device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_v2_t
    ) {
        let list = running_processes(s, device)?;
        // SAFETY: caller's pointers.
        unsafe { put_counted(infos, count, &list, false) }
    }

    /// v1 entries are `nvmlProcessInfo_v1_t` (pid, memory; 16 bytes).
    fn nvmlDeviceGetComputeRunningProcesses(
        s, device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_v1_t
    ) {
        let list = v1_processes(&running_processes(s, device)?);
        // SAFETY: caller's pointers.
        unsafe { put_counted(infos, count, &list, false) }
    }

    fn nvmlDeviceGetMigMode(s, device: nvmlDevice_t, current: *mut c_uint, pending: *mut c_uint) {
        let g = s.gpu(s.phys(device)?)?;
        g.mig_model()?;
        let mode = g.mig.ok_or(NOT_SUPPORTED)?;
        // SAFETY: caller's pointers.
        unsafe {
            put(current, c_uint::from(mode.current))?;
            put(pending, c_uint::from(mode.pending))
        }
    }

    /// SUCCESS, with the outcome in `*activationStatus` (mig-nvml.md 1.6; see `sim.rs`).
    fn nvmlDeviceSetMigMode(s, device: nvmlDevice_t, mode: c_uint, status: *mut nvmlReturn_t) {
        let i = s.phys(device)?;
        if status.is_null() || mode > NVML_DEVICE_MIG_ENABLE {
            return Err(INVALID_ARGUMENT);
        }
        let planned = s.gpu(i)?.plan_set_mig_mode(mode == NVML_DEVICE_MIG_ENABLE);
        let activation = planned.as_ref().map_or(SUCCESS, |(_, st)| *st);
        let args = json!({ "mode": mode, "activation_status": codes::name(activation) });
        let plan = planned.map(|(c, _)| c);
        s.mutate("nvmlDeviceSetMigMode", i, args, (None, None), plan)?;
        // SAFETY: caller's pointers.
        unsafe { put(status, activation) }
    }

    /// The GPU's mode as the state file has it (default DEFAULT). MIG device handles get
    /// NOT_SUPPORTED: per-MIG-device compute modes are not simulated.
    fn nvmlDeviceGetComputeMode(s, device: nvmlDevice_t, mode: *mut nvmlComputeMode_t) {
        let Dev::Phys(i) = s.device(device)? else {
            return Err(NOT_SUPPORTED);
        };
        let m = s.gpu(i)?.compute_mode.value();
        // SAFETY: caller's pointers.
        unsafe { put(mode, m) }
    }

    /// A mutation (logged, persisted); the refusals are in `sim.rs` (`plan_set_compute_mode`).
    fn nvmlDeviceSetComputeMode(s, device: nvmlDevice_t, mode: nvmlComputeMode_t) {
        let Dev::Phys(i) = s.device(device)? else {
            return Err(NOT_SUPPORTED);
        };
        let name = ComputeMode::from_value(mode).map_or("invalid", ComputeMode::name);
        let args = json!({ "mode": mode, "mode_name": name });
        let plan = s.gpu(i)?.plan_set_compute_mode(mode);
        s.mutate("nvmlDeviceSetComputeMode", i, args, (None, None), plan)?;
        Ok(())
    }

    /// Zero when MIG is unsupported or disabled (nvml.h).
    fn nvmlDeviceGetMaxMigDeviceCount(s, device: nvmlDevice_t, count: *mut c_uint) {
        let g = s.gpu(s.phys(device)?)?;
        let n = g.mig_enabled_model().map_or(0, |m| m.max_mig_devices);
        // SAFETY: caller's pointers.
        unsafe { put(count, n) }
    }

    /// Index order is (GI id, CI id); NOT_FOUND for an unused index below the maximum.
    fn nvmlDeviceGetMigDeviceHandleByIndex(
        s, device: nvmlDevice_t, index: c_uint, mig: *mut nvmlDevice_t
    ) {
        let i = s.phys(device)?;
        let g = s.gpu(i)?;
        if index >= g.mig_enabled_model()?.max_mig_devices {
            return Err(INVALID_ARGUMENT);
        }
        let (gi, ci) = *g.mig_devices().get(index as usize).ok_or(NOT_FOUND)?;
        let h = s.handle(Obj::Mig(i, gi, ci));
        // SAFETY: caller's pointers.
        unsafe { put(mig, h as nvmlDevice_t) }
    }

    fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(
        s, mig: nvmlDevice_t, device: *mut nvmlDevice_t
    ) {
        let Dev::Mig(i, ..) = s.device(mig)? else {
            return Err(INVALID_ARGUMENT);
        };
        // SAFETY: caller's pointers.
        unsafe { put(device, device_handle(i)) }
    }

    fn nvmlDeviceIsMigDeviceHandle(s, device: nvmlDevice_t, is_mig: *mut c_uint) {
        let v = matches!(s.device(device)?, Dev::Mig(..));
        // SAFETY: caller's pointers.
        unsafe { put(is_mig, c_uint::from(v)) }
    }

    fn nvmlDeviceGetGpuInstanceId(s, device: nvmlDevice_t, id: *mut c_uint) {
        let Dev::Mig(_, gi, _) = s.device(device)? else {
            return Err(NOT_SUPPORTED);
        };
        // SAFETY: caller's pointers.
        unsafe { put(id, gi) }
    }

    fn nvmlDeviceGetComputeInstanceId(s, device: nvmlDevice_t, id: *mut c_uint) {
        let Dev::Mig(_, _, ci) = s.device(device)? else {
            return Err(NOT_SUPPORTED);
        };
        // SAFETY: caller's pointers.
        unsafe { put(id, ci) }
    }

    /// v1 answers whenever the GPU is MIG-capable (go-nvlib calls it with MIG disabled).
    fn nvmlDeviceGetGpuInstanceProfileInfo(
        s, device: nvmlDevice_t, profile: c_uint, info: *mut nvmlGpuInstanceProfileInfo_t
    ) {
        let (m, p) = s.gpu(s.phys(device)?)?.gi_profile_by_index(profile)?;
        // SAFETY: caller's pointers.
        unsafe { put(info, gi_info(m, p)) }
    }

    /// nvml.h: NOT_SUPPORTED "if device doesn't have MIG mode enabled".
    fn nvmlDeviceGetGpuInstanceProfileInfoV(
        s, device: nvmlDevice_t, profile: c_uint, info: *mut nvmlGpuInstanceProfileInfo_v2_t
    ) {
        let g = s.gpu(s.phys(device)?)?;
        g.mig_enabled_model()?;
        let (m, p) = g.gi_profile_by_index(profile)?;
        // SAFETY: caller's pointers.
        unsafe { put_gi_info_v(info, m, p) }
    }

    fn nvmlDeviceGetGpuInstanceProfileInfoByIdV(
        s, device: nvmlDevice_t, profile_id: c_uint, info: *mut nvmlGpuInstanceProfileInfo_v2_t
    ) {
        let g = s.gpu(s.phys(device)?)?;
        g.mig_enabled_model()?;
        let (m, p) = g.gi_profile_by_id(profile_id)?;
        // SAFETY: caller's pointers.
        unsafe { put_gi_info_v(info, m, p) }
    }

    /// Answers "regardless of whether MIG is enabled or not" (nvml.h); a null buffer asks for
    /// the count, a short one gets INSUFFICIENT_SIZE with the count.
    fn nvmlDeviceGetGpuInstancePossiblePlacements_v2(
        s, device: nvmlDevice_t, profile_id: c_uint,
        placements: *mut nvmlGpuInstancePlacement_t, count: *mut c_uint
    ) {
        let (_, p) = s.gpu(s.phys(device)?)?.gi_profile_by_id(profile_id)?;
        // SAFETY: caller's pointers.
        unsafe { put_counted(placements, count, &gi_placements(p), true) }
    }

    /// The pre-`_v2` call: same list, but a null buffer is not a count query (inferred: the
    /// count query is what nvml.h documents as new in `_v2`).
    fn nvmlDeviceGetGpuInstancePossiblePlacements(
        s, device: nvmlDevice_t, profile_id: c_uint,
        placements: *mut nvmlGpuInstancePlacement_t, count: *mut c_uint
    ) {
        let (_, p) = s.gpu(s.phys(device)?)?.gi_profile_by_id(profile_id)?;
        // SAFETY: caller's pointers.
        unsafe { put_counted(placements, count, &gi_placements(p), false) }
    }

    fn nvmlDeviceGetGpuInstanceRemainingCapacity(
        s, device: nvmlDevice_t, profile_id: c_uint, count: *mut c_uint
    ) {
        let n = s.gpu(s.phys(device)?)?.gi_remaining_capacity(profile_id)?;
        // SAFETY: caller's pointers.
        unsafe { put(count, n) }
    }

    /// The driver picks the placement: first free one in the observed order (mig-nvml.md 1.3).
    fn nvmlDeviceCreateGpuInstance(
        s, device: nvmlDevice_t, profile_id: c_uint, gi: *mut nvmlGpuInstance_t
    ) {
        create_gi(s, "nvmlDeviceCreateGpuInstance", (device, profile_id), None, gi)
    }

    fn nvmlDeviceCreateGpuInstanceWithPlacement(
        s, device: nvmlDevice_t, profile_id: c_uint,
        placement: *const nvmlGpuInstancePlacement_t, gi: *mut nvmlGpuInstance_t
    ) {
        // SAFETY: caller's pointers.
        let p = unsafe { get(placement)? };
        let at = Some(Place::new(p.start, p.size));
        create_gi(s, "nvmlDeviceCreateGpuInstanceWithPlacement", (device, profile_id), at, gi)
    }

    /// IN_USE while compute instances or processes remain; the handle is invalid afterwards.
    fn nvmlGpuInstanceDestroy(s, gi: nvmlGpuInstance_t) {
        let (i, id) = s.gi(gi)?;
        let plan = s.gpu(i)?.plan_destroy_gpu_instance(id);
        s.mutate("nvmlGpuInstanceDestroy", i, json!({ "gi": id }), (Some(id), None), plan)?;
        s.forget(Obj::Gi(i, id));
        Ok(())
    }

    /// Only GIs of `profileId`, by id. `*count` = 0 means the buffer holds `instanceCount`
    /// entries (nvml.h; go-nvml), else it is the capacity (see `put_all`).
    fn nvmlDeviceGetGpuInstances(
        s, device: nvmlDevice_t, profile_id: c_uint, gis: *mut nvmlGpuInstance_t, count: *mut c_uint
    ) {
        let i = s.phys(device)?;
        let g = s.gpu(i)?;
        g.mig_enabled_model()?;
        g.gi_profile_by_id(profile_id)?;
        let mut ids: Vec<u32> = g.gpu_instances.iter()
            .filter(|x| x.profile_id == profile_id).map(|x| x.id).collect();
        ids.sort_unstable();
        let hs: Vec<nvmlGpuInstance_t> =
            ids.into_iter().map(|id| s.handle(Obj::Gi(i, id)) as nvmlGpuInstance_t).collect();
        // SAFETY: caller's pointers.
        unsafe { put_all(gis, count, &hs) }
    }

    fn nvmlDeviceGetGpuInstanceById(
        s, device: nvmlDevice_t, id: c_uint, gi: *mut nvmlGpuInstance_t
    ) {
        let i = s.phys(device)?;
        let g = s.gpu(i)?;
        g.mig_enabled_model()?;
        g.gpu_instance(id).ok_or(NOT_FOUND)?;
        let h = s.handle(Obj::Gi(i, id));
        // SAFETY: caller's pointers.
        unsafe { put(gi, h as nvmlGpuInstance_t) }
    }

    fn nvmlGpuInstanceGetInfo(s, gi: nvmlGpuInstance_t, info: *mut nvmlGpuInstanceInfo_t) {
        let (i, id) = s.gi(gi)?;
        let g = s.gpu(i)?.gpu_instance(id).ok_or(INVALID_ARGUMENT)?;
        let placement =
            nvmlGpuInstancePlacement_t { start: g.placement.start, size: g.placement.size };
        let v = nvmlGpuInstanceInfo_t {
            device: device_handle(i), id, profileId: g.profile_id, placement,
        };
        // SAFETY: caller's pointers.
        unsafe { put(info, v) }
    }

    fn nvmlGpuInstanceGetComputeInstanceProfileInfo(
        s, gi: nvmlGpuInstance_t, profile: c_uint, eng: c_uint,
        info: *mut nvmlComputeInstanceProfileInfo_t
    ) {
        let ((m, p), c) = ci_profile_for(s, gi, profile, eng)?;
        // SAFETY: caller's pointers.
        unsafe { put(info, ci_info(m, p, c)) }
    }

    fn nvmlGpuInstanceGetComputeInstanceProfileInfoV(
        s, gi: nvmlGpuInstance_t, profile: c_uint, eng: c_uint,
        info: *mut nvmlComputeInstanceProfileInfo_v2_t
    ) {
        let (gp, c) = ci_profile_for(s, gi, profile, eng)?;
        // SAFETY: caller's pointers.
        unsafe { put_ci_info_v(info, gp, c) }
    }

    fn nvmlGpuInstanceGetComputeInstanceRemainingCapacity(
        s, gi: nvmlGpuInstance_t, profile_id: c_uint, count: *mut c_uint
    ) {
        let (i, id) = s.gi(gi)?;
        let n = s.gpu(i)?.ci_remaining_capacity(id, profile_id)?;
        // SAFETY: caller's pointers.
        unsafe { put(count, n) }
    }

    fn nvmlGpuInstanceGetComputeInstancePossiblePlacements(
        s, gi: nvmlGpuInstance_t, profile_id: c_uint,
        placements: *mut nvmlComputeInstancePlacement_t, count: *mut c_uint
    ) {
        let (i, id) = s.gi(gi)?;
        let c = s.gpu(i)?.ci_profile(id, profile_id)?;
        // SAFETY: caller's pointers.
        unsafe { put_counted(placements, count, &ci_placements(c), true) }
    }

    fn nvmlGpuInstanceCreateComputeInstance(
        s, gi: nvmlGpuInstance_t, profile_id: c_uint, ci: *mut nvmlComputeInstance_t
    ) {
        create_ci(s, "nvmlGpuInstanceCreateComputeInstance", (gi, profile_id), None, ci)
    }

    fn nvmlGpuInstanceCreateComputeInstanceWithPlacement(
        s, gi: nvmlGpuInstance_t, profile_id: c_uint,
        placement: *const nvmlComputeInstancePlacement_t, ci: *mut nvmlComputeInstance_t
    ) {
        // SAFETY: caller's pointers.
        let p = unsafe { get(placement)? };
        let at = Some(Place::new(p.start, p.size));
        let f = "nvmlGpuInstanceCreateComputeInstanceWithPlacement";
        create_ci(s, f, (gi, profile_id), at, ci)
    }

    /// IN_USE while processes run on it; its CI and MIG device handles die with it.
    fn nvmlComputeInstanceDestroy(s, ci: nvmlComputeInstance_t) {
        let (i, gi, id) = s.ci(ci)?;
        let plan = s.gpu(i)?.plan_destroy_compute_instance(gi, id);
        let args = json!({ "gi": gi, "ci": id });
        s.mutate("nvmlComputeInstanceDestroy", i, args, (Some(gi), Some(id)), plan)?;
        s.forget(Obj::Ci(i, gi, id));
        s.forget(Obj::Mig(i, gi, id));
        Ok(())
    }

    /// Count protocol as `nvmlDeviceGetGpuInstances`.
    fn nvmlGpuInstanceGetComputeInstances(
        s, gi: nvmlGpuInstance_t, profile_id: c_uint,
        cis: *mut nvmlComputeInstance_t, count: *mut c_uint
    ) {
        let (i, id) = s.gi(gi)?;
        s.gpu(i)?.ci_profile(id, profile_id)?;
        let g = s.gpu(i)?.gpu_instance(id).ok_or(INVALID_ARGUMENT)?;
        let mut ids: Vec<u32> = g.compute_instances.iter()
            .filter(|c| c.profile_id == profile_id).map(|c| c.id).collect();
        ids.sort_unstable();
        let hs: Vec<nvmlComputeInstance_t> = ids.into_iter()
            .map(|c| s.handle(Obj::Ci(i, id, c)) as nvmlComputeInstance_t).collect();
        // SAFETY: caller's pointers.
        unsafe { put_all(cis, count, &hs) }
    }

    fn nvmlGpuInstanceGetComputeInstanceById(
        s, gi: nvmlGpuInstance_t, id: c_uint, ci: *mut nvmlComputeInstance_t
    ) {
        let (i, g) = s.gi(gi)?;
        s.gpu(i)?.compute_instance(g, id).ok_or(NOT_FOUND)?;
        let h = s.handle(Obj::Ci(i, g, id));
        // SAFETY: caller's pointers.
        unsafe { put(ci, h as nvmlComputeInstance_t) }
    }

    fn nvmlComputeInstanceGetInfo_v2(
        s, ci: nvmlComputeInstance_t, info: *mut nvmlComputeInstanceInfo_t
    ) {
        let v = compute_instance_info(s, ci)?;
        // SAFETY: caller's pointers.
        unsafe { put(info, v) }
    }

    /// v1: without `placement` (see `ComputeInstanceInfoV1`).
    fn nvmlComputeInstanceGetInfo(
        s, ci: nvmlComputeInstance_t, info: *mut ComputeInstanceInfoV1
    ) {
        let v = compute_instance_info(s, ci)?;
        let v1 = ComputeInstanceInfoV1 {
            device: v.device, gpu_instance: v.gpuInstance, id: v.id, profile_id: v.profileId,
        };
        // SAFETY: caller's pointers.
        unsafe { put(info, v1) }
    }
}
