//! The exported C ABI (x86-64 SysV), with nvml-wrapper-sys's struct layouts.
//!
//! # Safety contract (every export)
//! As with the real library: each pointer argument is null or valid for the pointed-to type
//! (buffers for the documented number of elements). Null out-pointers give INVALID_ARGUMENT.
//! Handles are never dereferenced: they are numbers looked up in a per-process table, so a stale
//! or forged handle gives INVALID_ARGUMENT instead of undefined behaviour.
#![allow(non_snake_case)]

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, CStr};
use std::os::unix::fs::MetadataExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::SystemTime;

use gpu_share::mig::catalog::{ComputeInstanceProfile, GpuInstanceProfile, GpuModel};
use nvml_wrapper_sys::bindings::*;
use serde_json::{json, Value};

use crate::codes::{self, *};
use crate::events::Watches;
use crate::faults::{self, LogEntry};
use crate::model::mig_device_profile_name;
use crate::model::{ci_profile_name, ci_sm_count, gi_engines, gi_memory_mib};
use crate::sim::{Change, GiProfile};
use crate::state::{ComputeMode, Gpu, Place, State};

const MIB: u64 = 1 << 20;
/// `gpuInstanceId`/`computeInstanceId` of a process outside MIG.
const NOT_MIG: c_uint = 0xFFFF_FFFF;
const MUTATIONS: &[&str] = &[
    "nvmlDeviceSetMigMode",
    "nvmlDeviceCreateGpuInstance",
    "nvmlDeviceCreateGpuInstanceWithPlacement",
    "nvmlGpuInstanceDestroy",
    "nvmlGpuInstanceCreateComputeInstance",
    "nvmlGpuInstanceCreateComputeInstanceWithPlacement",
    "nvmlComputeInstanceDestroy",
    "nvmlDeviceSetComputeMode",
];

/// `NVML_STRUCT_VERSION(data, ver)`: bindgen drops the macro, so compute it.
const fn struct_version<T>(ver: u32) -> u32 {
    std::mem::size_of::<T>() as u32 | (ver << 24)
}
const MEMORY_V2: u32 = struct_version::<nvmlMemory_v2_t>(2);
const GI_INFO_V2: u32 = struct_version::<nvmlGpuInstanceProfileInfo_v2_t>(2);
const GI_INFO_V3: u32 = struct_version::<nvmlGpuInstanceProfileInfo_v3_t>(3);
const CI_INFO_V2: u32 = struct_version::<nvmlComputeInstanceProfileInfo_v2_t>(2);
const CI_INFO_V3: u32 = struct_version::<nvmlComputeInstanceProfileInfo_v3_t>(3);

// ---------------------------------------------------------------------------------------------
// Session: the loaded state plus the handle table.

static WORLD: Mutex<Option<Session>> = Mutex::new(None);
/// Handle serials are never reused within a process, so a handle of a destroyed instance stays
/// invalid even after an instance with the same id is created again.
static NEXT_SERIAL: AtomicU64 = AtomicU64::new(1);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Obj {
    Gi(usize, u32),
    Ci(usize, u32, u32),
    Mig(usize, u32, u32),
    /// An event set (`nvmlEventSet_t`), by its own serial.
    Events(u64),
}

/// A `nvmlDevice_t`: a physical GPU or a MIG device.
#[derive(Debug, Clone, Copy)]
enum Dev {
    Phys(usize),
    Mig(usize, u32, u32),
}

const KIND_DEVICE: usize = 1;
const KIND_GI: usize = 2;
const KIND_CI: usize = 3;
const KIND_MIG: usize = 4;
const KIND_EVENT_SET: usize = 5;

fn encode(kind: usize, serial: u64) -> usize {
    (kind << 40) | ((serial as usize) << 4)
}

fn decode(h: usize) -> Option<(usize, u64)> {
    (h & 0xF == 0).then_some((h >> 40, ((h & ((1 << 40) - 1)) >> 4) as u64))
}

fn device_handle(index: usize) -> nvmlDevice_t {
    encode(KIND_DEVICE, index as u64 + 1) as nvmlDevice_t
}

type Stamp = (SystemTime, u64, u64);

fn stamp(path: &Path) -> Option<Stamp> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len(), m.ino()))
}

struct Session {
    refs: u32,
    state: State,
    path: PathBuf,
    stamp: Option<Stamp>,
    serials: HashMap<Obj, u64>,
    objects: HashMap<u64, Obj>,
    /// Live event sets: what each watches and has delivered.
    event_sets: HashMap<u64, Watches>,
}

impl Session {
    fn load() -> Result<Session, Ret> {
        let Some(path) = std::env::var_os("FAKE_NVML_STATE").map(PathBuf::from) else {
            eprintln!("fake-nvml: FAKE_NVML_STATE is not set; acting as if no driver is loaded");
            return Err(DRIVER_NOT_LOADED);
        };
        let state = State::read_from(&path).map_err(|e| {
            eprintln!("fake-nvml: {}: {e}", path.display());
            UNKNOWN
        })?;
        Ok(Session {
            refs: 1,
            stamp: stamp(&path),
            state,
            path,
            serials: HashMap::new(),
            objects: HashMap::new(),
            event_sets: HashMap::new(),
        })
        .inspect(Session::sync_procfs)
    }

    /// Keep the simulated host's MIG procfs files in step (`FAKE_NVML_PROC_ROOT`, see
    /// [`crate::procfs`]). A failure is reported on stderr and does not fail the NVML call, as
    /// the driver's procfs is not part of NVML's answer.
    fn sync_procfs(&self) {
        let Some(root) = std::env::var_os("FAKE_NVML_PROC_ROOT") else {
            return;
        };
        if let Err(e) = crate::procfs::sync(Path::new(&root), &self.state) {
            eprintln!("fake-nvml: updating {}: {e}", Path::new(&root).display());
        }
    }

    /// Pick up changes another process (or the test) made to the file since we last saw it.
    fn refresh(&mut self) {
        let now = stamp(&self.path);
        if now != self.stamp {
            match State::read_from(&self.path) {
                Ok(s) => {
                    self.state = s;
                    self.sync_procfs();
                }
                Err(e) => eprintln!(
                    "fake-nvml: {}: {e} (keeping the old state)",
                    self.path.display()
                ),
            }
            self.stamp = now;
        }
    }

    fn persist(&mut self) -> Result<(), Ret> {
        self.state.write_to(&self.path).map_err(|e| {
            eprintln!("fake-nvml: writing {}: {e}", self.path.display());
            UNKNOWN
        })?;
        self.stamp = stamp(&self.path);
        self.sync_procfs();
        Ok(())
    }

    fn gpu(&self, i: usize) -> Result<&Gpu, Ret> {
        self.state.gpus.get(i).ok_or(INVALID_ARGUMENT)
    }

    fn handle(&mut self, obj: Obj) -> usize {
        let kind = match obj {
            Obj::Gi(..) => KIND_GI,
            Obj::Ci(..) => KIND_CI,
            Obj::Mig(..) => KIND_MIG,
            Obj::Events(..) => KIND_EVENT_SET,
        };
        let next = || NEXT_SERIAL.fetch_add(1, Ordering::Relaxed);
        let serial = *self.serials.entry(obj).or_insert_with(next);
        self.objects.insert(serial, obj);
        encode(kind, serial)
    }

    fn forget(&mut self, obj: Obj) {
        if let Some(serial) = self.serials.remove(&obj) {
            self.objects.remove(&serial);
        }
    }

    /// The live object behind a handle of this kind.
    fn lookup(&self, h: usize, kind: usize) -> Result<Obj, Ret> {
        let (k, serial) = decode(h).ok_or(INVALID_ARGUMENT)?;
        let obj = *self
            .objects
            .get(&serial)
            .filter(|_| k == kind)
            .ok_or(INVALID_ARGUMENT)?;
        let alive = match obj {
            Obj::Gi(g, gi) => self.gpu(g)?.gpu_instance(gi).is_some(),
            Obj::Ci(g, gi, ci) | Obj::Mig(g, gi, ci) => {
                self.gpu(g)?.compute_instance(gi, ci).is_some()
            }
            Obj::Events(id) => self.event_sets.contains_key(&id),
        };
        alive.then_some(obj).ok_or(INVALID_ARGUMENT)
    }

    fn device(&self, h: nvmlDevice_t) -> Result<Dev, Ret> {
        let (kind, serial) = decode(h as usize).ok_or(INVALID_ARGUMENT)?;
        match kind {
            KIND_DEVICE => {
                let i = (serial as usize).checked_sub(1).ok_or(INVALID_ARGUMENT)?;
                self.gpu(i).map(|_| Dev::Phys(i))
            }
            KIND_MIG => match self.lookup(h as usize, KIND_MIG)? {
                Obj::Mig(g, gi, ci) => Ok(Dev::Mig(g, gi, ci)),
                _ => Err(INVALID_ARGUMENT),
            },
            _ => Err(INVALID_ARGUMENT),
        }
    }

    /// A physical GPU handle (MIG device handles are not accepted where NVML wants the parent).
    fn phys(&self, h: nvmlDevice_t) -> Result<usize, Ret> {
        match self.device(h)? {
            Dev::Phys(i) => Ok(i),
            Dev::Mig(..) => Err(INVALID_ARGUMENT),
        }
    }

    fn gi(&self, h: nvmlGpuInstance_t) -> Result<(usize, u32), Ret> {
        match self.lookup(h as usize, KIND_GI)? {
            Obj::Gi(g, gi) => Ok((g, gi)),
            _ => Err(INVALID_ARGUMENT),
        }
    }

    fn ci(&self, h: nvmlComputeInstance_t) -> Result<(usize, u32, u32), Ret> {
        match self.lookup(h as usize, KIND_CI)? {
            Obj::Ci(g, gi, ci) => Ok((g, gi, ci)),
            _ => Err(INVALID_ARGUMENT),
        }
    }

    /// Plan → abort hook → apply → persist → log. On a failed write the GPU is restored.
    fn mutate(
        &mut self,
        function: &str,
        gpu: usize,
        args: Value,
        target: (Option<u32>, Option<u32>),
        plan: Result<Change, Ret>,
    ) -> Result<Change, Ret> {
        let result = plan.and_then(|change| {
            faults::before_mutation();
            let before = self.state.gpus[gpu].clone();
            self.state.gpus[gpu].apply(change.clone());
            self.persist()
                .map(|()| change)
                .inspect_err(|_| self.state.gpus[gpu] = before)
        });
        let (gi, ci) = match &result {
            Ok(Change::AddGi(g)) => (Some(g.id), None),
            Ok(Change::AddCi(gi, c)) => (Some(*gi), Some(c.id)),
            _ => target,
        };
        let rc = result.as_ref().map_or_else(|e| *e, |_| SUCCESS);
        faults::log(&LogEntry {
            pid: std::process::id(),
            function: function.into(),
            gpu: Some(gpu),
            args,
            result: codes::name(rc).into(),
            injected: false,
            gi,
            ci,
        });
        result
    }
}

/// Declares exports: `fn name(s, args…) { body }` becomes `#[no_mangle] pub unsafe extern "C"
/// fn name(args…) -> nvmlReturn_t` that runs `body` (a `Result<(), Ret>`) through [`call`] with
/// the session bound to `s`. Keeps each export to its logic; rustfmt leaves macro input alone,
/// so bodies are formatted by hand.
macro_rules! exports {
    ($($(#[$doc:meta])* fn $name:ident($s:ident $(, $arg:ident: $ty:ty)*) $body:block)*) => {$(
        $(#[$doc])*
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> nvmlReturn_t {
            call(stringify!($name), |$s| $body)
        }
    )*};
}
/// Run an export: fault injection, lock, panic containment.
fn guarded(function: &'static str, f: impl FnOnce(&mut Option<Session>) -> Result<(), Ret>) -> Ret {
    contained(|| {
        if let Some(code) = faults::injected(function) {
            log_injected(function, code);
            return Err(code);
        }
        f(&mut WORLD.lock().unwrap_or_else(|e| e.into_inner()))
    })
}

/// `f`'s return code; a panic becomes UNKNOWN rather than crossing the C boundary.
fn contained(f: impl FnOnce() -> Result<(), Ret>) -> Ret {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => SUCCESS,
        Ok(Err(code)) => code,
        Err(_) => UNKNOWN,
    }
}

/// Another pass of a call already counted for fault injection (a blocking wait polls the
/// state): the lock and a fresh look at the state file, no second injection.
fn call_again(f: impl FnOnce(&mut Session) -> Result<(), Ret>) -> Ret {
    contained(|| {
        let mut world = WORLD.lock().unwrap_or_else(|e| e.into_inner());
        let s = world.as_mut().ok_or(UNINITIALIZED)?;
        s.refresh();
        f(s)
    })
}

/// As [`guarded`], for calls that need `nvmlInit` first.
fn call(function: &'static str, f: impl FnOnce(&mut Session) -> Result<(), Ret>) -> Ret {
    guarded(function, |world| {
        let s = world.as_mut().ok_or(UNINITIALIZED)?;
        s.refresh();
        f(s)
    })
}

fn log_injected(function: &str, code: Ret) {
    if MUTATIONS.contains(&function) {
        faults::log(&LogEntry {
            pid: std::process::id(),
            function: function.into(),
            gpu: None,
            args: Value::Null,
            result: codes::name(code).into(),
            injected: true,
            gi: None,
            ci: None,
        });
    }
}

// ---------------------------------------------------------------------------------------------
// Pointer helpers: the only places that touch caller memory.

/// # Safety
/// `p` is null or valid for a write of `T`.
unsafe fn put<T>(p: *mut T, v: T) -> Result<(), Ret> {
    if p.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    // SAFETY: non-null, and valid per this function's contract.
    unsafe { p.write(v) };
    Ok(())
}

/// # Safety
/// `p` is null or valid for a read of `T`.
unsafe fn get<T: Copy>(p: *const T) -> Result<T, Ret> {
    if p.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    // SAFETY: non-null, and valid per this function's contract.
    Ok(unsafe { p.read() })
}

/// Copy `s` and a NUL into a caller buffer of `len` bytes (INSUFFICIENT_SIZE if it won't fit).
///
/// # Safety
/// `buf` is null or valid for `len` bytes.
unsafe fn put_str(buf: *mut c_char, len: c_uint, s: &str) -> Result<(), Ret> {
    if buf.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    if (len as usize) < s.len() + 1 {
        return Err(INSUFFICIENT_SIZE);
    }
    // SAFETY: `buf` holds at least s.len()+1 bytes, checked above; the regions cannot overlap.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr().cast::<c_char>(), buf, s.len());
        buf.add(s.len()).write(0);
    }
    Ok(())
}

/// NVML's count protocol: `*count` in = capacity, out = needed; too small → INSUFFICIENT_SIZE.
/// With `null_queries`, a null buffer just asks for the count (the placements calls).
///
/// # Safety
/// `count` is null or valid; `buf` is null or valid for `*count` elements.
unsafe fn put_counted<T: Copy>(
    buf: *mut T,
    count: *mut c_uint,
    items: &[T],
    null_queries: bool,
) -> Result<(), Ret> {
    // SAFETY: per this function's contract.
    let cap = unsafe { get(count)? } as usize;
    // SAFETY: as above.
    unsafe { put(count, items.len() as c_uint)? };
    if buf.is_null() && null_queries {
        return Ok(());
    }
    if cap < items.len() {
        return Err(INSUFFICIENT_SIZE);
    }
    if items.is_empty() {
        return Ok(());
    }
    if buf.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    // SAFETY: `buf` holds `cap` >= items.len() elements.
    unsafe { std::ptr::copy_nonoverlapping(items.as_ptr(), buf, items.len()) };
    Ok(())
}

/// The instance-list calls: nvml.h says the buffer must hold `instanceCount` handles and go-nvml
/// passes `*count = 0`, so 0 means "big enough"; a non-zero `*count` below the number found is
/// treated as the capacity (INSUFFICIENT_SIZE with the count) rather than overrun.
///
/// # Safety
/// `count` is null or valid; `buf` is null or valid for `*count` elements, or for the profile's
/// `instanceCount` when `*count` is 0.
unsafe fn put_all<T: Copy>(buf: *mut T, count: *mut c_uint, items: &[T]) -> Result<(), Ret> {
    // SAFETY: per this function's contract.
    let cap = unsafe { get(count)? } as usize;
    if buf.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    // SAFETY: as above.
    unsafe { put(count, items.len() as c_uint)? };
    if cap != 0 && cap < items.len() {
        return Err(INSUFFICIENT_SIZE);
    }
    // SAFETY: `buf` holds at least items.len() elements (items never exceed instanceCount).
    unsafe { std::ptr::copy_nonoverlapping(items.as_ptr(), buf, items.len()) };
    Ok(())
}

/// The `version` field (first member) of a versioned struct, checked against `accepted`.
///
/// # Safety
/// `p` is null or valid for a read of `u32`.
unsafe fn version<T>(p: *mut T, accepted: &[u32]) -> Result<u32, Ret> {
    // SAFETY: per this function's contract.
    let v = unsafe { get(p.cast::<c_uint>())? };
    accepted
        .contains(&v)
        .then_some(v)
        .ok_or(ARGUMENT_VERSION_MISMATCH)
}

fn c_array<const N: usize>(s: &str) -> [c_char; N] {
    let mut out = [0 as c_char; N];
    for (o, b) in out.iter_mut().zip(s.bytes().take(N - 1)) {
        *o = b as c_char;
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Struct builders.

fn gi_info(m: &GpuModel, p: &GpuInstanceProfile) -> nvmlGpuInstanceProfileInfo_t {
    let e = gi_engines(m, p);
    nvmlGpuInstanceProfileInfo_t {
        id: p.profile_id,
        isP2pSupported: 0,
        sliceCount: p.slice_count,
        instanceCount: p.instance_count,
        multiprocessorCount: e.sm_count.unwrap_or(0),
        copyEngineCount: e.copy_engines.unwrap_or(0),
        decoderCount: e.decoders.unwrap_or(0),
        encoderCount: e.encoders.unwrap_or(0),
        jpegCount: e.jpeg.unwrap_or(0),
        ofaCount: e.ofa.unwrap_or(0),
        memorySizeMB: gi_memory_mib(m, p),
    }
}

/// Fill a v2 or v3 `nvmlGpuInstanceProfileInfo` (same size, different fields) per its version.
///
/// # Safety
/// `info` is null or valid for a v2/v3 struct.
unsafe fn put_gi_info_v(
    info: *mut nvmlGpuInstanceProfileInfo_v2_t,
    m: &GpuModel,
    p: &GpuInstanceProfile,
) -> Result<(), Ret> {
    // SAFETY: per this function's contract.
    let ver = unsafe { version(info, &[GI_INFO_V2, GI_INFO_V3])? };
    let b = gi_info(m, p);
    let name = c_array(&format!("MIG {}", p.name));
    if ver == GI_INFO_V2 {
        let v2 = nvmlGpuInstanceProfileInfo_v2_t {
            version: ver,
            id: b.id,
            isP2pSupported: 0,
            sliceCount: b.sliceCount,
            instanceCount: b.instanceCount,
            multiprocessorCount: b.multiprocessorCount,
            copyEngineCount: b.copyEngineCount,
            decoderCount: b.decoderCount,
            encoderCount: b.encoderCount,
            jpegCount: b.jpegCount,
            ofaCount: b.ofaCount,
            memorySizeMB: b.memorySizeMB,
            name,
        };
        // SAFETY: per this function's contract.
        return unsafe { put(info, v2) };
    }
    let gfx = p.name.contains("+gfx");
    let v3 = nvmlGpuInstanceProfileInfo_v3_t {
        version: ver,
        id: b.id,
        sliceCount: b.sliceCount,
        instanceCount: b.instanceCount,
        multiprocessorCount: b.multiprocessorCount,
        copyEngineCount: b.copyEngineCount,
        decoderCount: b.decoderCount,
        encoderCount: b.encoderCount,
        jpegCount: b.jpegCount,
        ofaCount: b.ofaCount,
        memorySizeMB: b.memorySizeMB,
        name,
        capabilities: if gfx {
            NVML_GPU_INSTANCE_PROFILE_CAPS_GFX
        } else {
            0
        },
    };
    // SAFETY: v3 has v2's size (152 bytes); `info` is valid for it per the contract.
    unsafe { put(info.cast::<nvmlGpuInstanceProfileInfo_v3_t>(), v3) }
}

fn ci_info(
    m: &GpuModel,
    gi: &GpuInstanceProfile,
    ci: &ComputeInstanceProfile,
) -> nvmlComputeInstanceProfileInfo_t {
    let e = gi_engines(m, gi);
    nvmlComputeInstanceProfileInfo_t {
        id: ci.profile_id,
        sliceCount: ci.slice_count,
        instanceCount: ci.instance_count,
        multiprocessorCount: ci_sm_count(m, gi, ci),
        sharedCopyEngineCount: e.copy_engines.unwrap_or(0),
        sharedDecoderCount: e.decoders.unwrap_or(0),
        sharedEncoderCount: e.encoders.unwrap_or(0),
        sharedJpegCount: e.jpeg.unwrap_or(0),
        sharedOfaCount: e.ofa.unwrap_or(0),
    }
}

fn process_info(p: &crate::state::Process) -> nvmlProcessInfo_t {
    nvmlProcessInfo_t {
        pid: p.pid,
        usedGpuMemory: p.used_memory_mib * MIB,
        gpuInstanceId: p.gi_id.unwrap_or(NOT_MIG),
        computeInstanceId: p.gi_id.map_or(NOT_MIG, |_| p.ci_id.unwrap_or(0)),
    }
}

/// (total, used) MiB as a device handle sees them: the whole GPU, or the MIG device's GI.
fn memory_mib(s: &Session, d: Dev) -> Result<(u64, u64), Ret> {
    match d {
        Dev::Phys(i) => {
            let g = s.gpu(i)?;
            Ok((
                g.total_memory_mib(),
                g.processes.iter().map(|p| p.used_memory_mib).sum(),
            ))
        }
        Dev::Mig(i, gi, ci) => {
            let g = s.gpu(i)?;
            let ((m, gp), _) = g.mig_device_profiles(gi, ci).ok_or(INVALID_ARGUMENT)?;
            let used = g
                .processes
                .iter()
                .filter(|p| p.in_gi(gi))
                .map(|p| p.used_memory_mib);
            Ok((gi_memory_mib(m, gp), used.sum()))
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Library and system.

fn init(function: &'static str) -> Ret {
    guarded(function, |world| {
        match world {
            Some(s) => s.refs += 1,
            None => *world = Some(Session::load()?),
        }
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn nvmlInit_v2() -> nvmlReturn_t {
    init("nvmlInit_v2")
}

/// The v1 name: nvml.h maps `nvmlInit` to `nvmlInit_v2`, and go-nvml binds it before it finds
/// `_v2`. v1 also fails on GPUs the caller may not access, which the fake does not simulate.
#[no_mangle]
pub extern "C" fn nvmlInit() -> nvmlReturn_t {
    init("nvmlInit")
}

/// Flags (NO_GPUS, NO_ATTACH) change nothing here: the fake never attaches to hardware.
#[no_mangle]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> nvmlReturn_t {
    init("nvmlInitWithFlags")
}

/// Reference-counted like the real one; the state is dropped (and re-read by the next init)
/// when the count reaches zero.
#[no_mangle]
pub extern "C" fn nvmlShutdown() -> nvmlReturn_t {
    guarded("nvmlShutdown", |world| {
        let s = world.as_mut().ok_or(UNINITIALIZED)?;
        s.refs -= 1;
        if s.refs == 0 {
            *world = None;
        }
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn nvmlErrorString(result: nvmlReturn_t) -> *const c_char {
    codes::text(result).as_ptr().cast()
}

mod board;
mod events;
mod exports;
