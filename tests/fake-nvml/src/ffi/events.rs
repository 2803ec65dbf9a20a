//! Event sets: `nvmlEventSetCreate`, `nvmlDeviceGetSupportedEventTypes`,
//! `nvmlDeviceRegisterEvents`, `nvmlEventSetWait[_v2]`, `nvmlEventSetFree`. The events come
//! from the state file (`crate::events`), so a test raises an XID while a client waits.

use std::time::{Duration, Instant};

use super::*;
use crate::events::Event;

/// How often a blocked `nvmlEventSetWait` looks at the state file again.
const POLL: Duration = Duration::from_millis(10);

/// The v1 `nvmlEventData_t` that `nvmlEventSetWait` (v1) fills: `_v2` appended
/// `gpuInstanceId` and `computeInstanceId` (nvml.h 11.0, where `_v2` appeared), so a v1 caller's
/// 24-byte buffer is never overrun (inferred from the struct's history).
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct EventDataV1 {
    device: nvmlDevice_t,
    event_type: u64,
    event_data: u64,
}

impl Session {
    fn event_set(&self, set: nvmlEventSet_t) -> Result<u64, Ret> {
        match self.lookup(set as usize, KIND_EVENT_SET)? {
            Obj::Events(id) => Ok(id),
            _ => Err(INVALID_ARGUMENT),
        }
    }

    /// The next event set `id` has to deliver, as nvml.h's `nvmlEventData_t`: the physical
    /// GPU's handle, the type, the XID, and the MIG device's ids or 0xFFFFFFFF.
    fn next_event(&mut self, id: u64) -> Option<nvmlEventData_t> {
        let watches = self.event_sets.get_mut(&id)?;
        let (i, e): (usize, Event) = watches.next(&self.state.gpus)?;
        Some(nvmlEventData_t {
            device: device_handle(i),
            eventType: e.event_type,
            eventData: e.data,
            gpuInstanceId: e.gi_id.unwrap_or(NOT_MIG),
            computeInstanceId: e.ci_id.unwrap_or(NOT_MIG),
        })
    }
}

/// `nvmlEventSetWait[_v2]`: an event that is already due returns at once; otherwise wait up to
/// `timeout_ms` for one (nvml.h), then TIMEOUT. The lock is not held while waiting, so other
/// threads' calls (and the test's state changes) go on.
///
/// # Safety
/// `data` is null or valid for a write of `T`.
unsafe fn wait<T>(
    function: &'static str,
    set: nvmlEventSet_t,
    data: *mut T,
    timeout_ms: c_uint,
    shape: fn(nvmlEventData_t) -> T,
) -> nvmlReturn_t {
    let deadline = Instant::now() + Duration::from_millis(timeout_ms.into());
    let poll = |s: &mut Session| {
        let id = s.event_set(set)?;
        if data.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        let e = s.next_event(id).ok_or(TIMEOUT)?;
        // SAFETY: non-null, valid per this function's contract.
        unsafe { put(data, shape(e)) }
    };
    let mut rc = call(function, poll);
    while rc == TIMEOUT && Instant::now() < deadline {
        std::thread::sleep(POLL.min(deadline - Instant::now()));
        rc = call_again(poll);
    }
    rc
}

exports! {
    fn nvmlEventSetCreate(s, set: *mut nvmlEventSet_t) {
        if set.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        let id = NEXT_SERIAL.fetch_add(1, Ordering::Relaxed);
        s.event_sets.insert(id, Watches::default());
        let h = s.handle(Obj::Events(id));
        // SAFETY: caller's pointer, non-null.
        unsafe { put(set, h as nvmlEventSet_t) }
    }

    /// XID everywhere, ECC on data-centre models (`Gpu::supported_event_types`). MIG device
    /// handles: NOT_SUPPORTED (inferred; NVIDIA's plugin registers the parent GPU).
    fn nvmlDeviceGetSupportedEventTypes(s, device: nvmlDevice_t, types: *mut u64) {
        let i = match s.device(device)? {
            Dev::Phys(i) => i,
            Dev::Mig(..) => return Err(NOT_SUPPORTED),
        };
        let supported = s.gpu(i)?.supported_event_types();
        // SAFETY: caller's pointer.
        unsafe { put(types, supported) }
    }

    /// Types the GPU does not support: NOT_SUPPORTED (nvml.h: "some of requested event types").
    fn nvmlDeviceRegisterEvents(s, device: nvmlDevice_t, types: u64, set: nvmlEventSet_t) {
        let i = match s.device(device)? {
            Dev::Phys(i) => i,
            Dev::Mig(..) => return Err(NOT_SUPPORTED),
        };
        let id = s.event_set(set)?;
        let gpu = s.state.gpus.get(i).ok_or(INVALID_ARGUMENT)?;
        if types & !gpu.supported_event_types() != 0 {
            return Err(NOT_SUPPORTED);
        }
        let watches = s.event_sets.get_mut(&id).ok_or(INVALID_ARGUMENT)?;
        watches.register(i, gpu, types);
        Ok(())
    }

    fn nvmlEventSetFree(s, set: nvmlEventSet_t) {
        let id = s.event_set(set)?;
        s.event_sets.remove(&id);
        s.forget(Obj::Events(id));
        Ok(())
    }
}

/// Waits for the next event (see [`wait`]); fills the full `nvmlEventData_t` with the MIG ids.
///
/// # Safety
/// `data` is null or valid for a `nvmlEventData_t`.
#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    set: nvmlEventSet_t,
    data: *mut nvmlEventData_t,
    timeoutms: c_uint,
) -> nvmlReturn_t {
    // SAFETY: the caller's pointer, per this function's contract.
    unsafe { wait("nvmlEventSetWait_v2", set, data, timeoutms, |e| e) }
}

/// The v1 name: the 24-byte struct without the MIG ids ([`EventDataV1`]).
///
/// # Safety
/// `data` is null or valid for the v1 struct.
#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetWait(
    set: nvmlEventSet_t,
    data: *mut EventDataV1,
    timeoutms: c_uint,
) -> nvmlReturn_t {
    let v1 = |e: nvmlEventData_t| EventDataV1 {
        device: e.device,
        event_type: e.eventType,
        event_data: e.eventData,
    };
    // SAFETY: the caller's pointer, per this function's contract.
    unsafe { wait("nvmlEventSetWait", set, data, timeoutms, v1) }
}
