//! The NVML calls NVIDIA's k8s-device-plugin v0.20.0 makes beyond gpu-share's own, one test per
//! call (docs/sources.md#device-plugin-nvml: measured which ones it needs and what
//! breaks without each), plus the MIG procfs files it reads. Each scenario runs in a child
//! process (see `support`).

use std::ptr::null_mut;
use std::time::{Duration, Instant};

use nvidia_ml::{Gpu, State};
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::TopologyLevel;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;
use nvml_wrapper_sys::bindings::*;

mod support;
use support::{open, raw, scenario};

const NOT_MIG: u32 = 0xFFFF_FFFF;

/// A MIG device on GPU 0: one 1g.10gb instance (H100 profile id 19) with its full CI.
fn one_mig_device(nvml: &Nvml) -> (nvmlDevice_t, u32) {
    let mut state = State::read_from(std::env::var("FAKE_NVML_STATE").unwrap()).unwrap();
    let gi = state.gpus[0].create_gpu_instance(19, None).unwrap();
    state.gpus[0].create_compute_instance(gi, 0).unwrap();
    state
        .write_to(std::env::var("FAKE_NVML_STATE").unwrap())
        .unwrap();
    let dev = nvml.device_by_index(0).unwrap();
    let mig = dev.mig_device_by_index(0).unwrap();
    // SAFETY: the handle is only passed back to the library.
    (unsafe { mig.handle() }, gi)
}

fn h100s(n: usize) -> State {
    State::with_gpus((0..n).map(|_| Gpu::mig("h100").mig_enabled()))
}

/// Without it NVIDIA's plugin dies at start ("undefined symbol: nvmlDeviceGetMinorNumber").
#[test]
fn minor_numbers_are_the_index_unless_the_state_says_otherwise() {
    let mut state = h100s(2);
    state.gpus[1].minor_number = Some(7);
    let run = scenario(
        "minor_numbers_are_the_index_unless_the_state_says_otherwise",
        state,
        &[],
        || {
            let nvml = open();
            assert_eq!(nvml.device_by_index(0).unwrap().minor_number().unwrap(), 0);
            assert_eq!(nvml.device_by_index(1).unwrap().minor_number().unwrap(), 7);
            let (mig, _) = one_mig_device(&nvml);
            let f: unsafe extern "C" fn(nvmlDevice_t, *mut u32) -> nvmlReturn_t =
                raw("nvmlDeviceGetMinorNumber");
            let mut minor = 0;
            // SAFETY: the signature nvml.h declares.
            assert_eq!(
                unsafe { f(mig, &mut minor) },
                3,
                "NOT_SUPPORTED on a MIG device"
            );
            // SAFETY: as above.
            assert_eq!(unsafe { f(mig, null_mut()) }, 3);
        },
    );
    if let Some(run) = run {
        run.assert_passed();
    }
}

#[test]
fn compute_capability_comes_from_the_product_and_mig_devices_share_it() {
    let state = State::with_gpus([
        Gpu::mig("h100").mig_enabled(),
        Gpu::mig("a30"),
        Gpu::non_mig("NVIDIA GeForce RTX 3090", 24576),
        Gpu::non_mig("Unheard-of Accelerator", 1024),
    ]);
    let run = scenario(
        "compute_capability_comes_from_the_product_and_mig_devices_share_it",
        state,
        &[],
        || {
            let nvml = open();
            let cc = |i| {
                let c = nvml.device_by_index(i).unwrap().cuda_compute_capability();
                c.map(|c| (c.major, c.minor))
            };
            assert_eq!(cc(0).unwrap(), (9, 0));
            assert_eq!(cc(1).unwrap(), (8, 0));
            assert_eq!(cc(2).unwrap(), (8, 6));
            assert!(matches!(cc(3), Err(NvmlError::NotSupported)));
            let (mig, _) = one_mig_device(&nvml);
            let f: unsafe extern "C" fn(nvmlDevice_t, *mut i32, *mut i32) -> nvmlReturn_t =
                raw("nvmlDeviceGetCudaComputeCapability");
            let (mut major, mut minor) = (0, 0);
            // SAFETY: the signature nvml.h declares.
            assert_eq!(unsafe { f(mig, &mut major, &mut minor) }, 0);
            assert_eq!((major, minor), (9, 0));
        },
    );
    if let Some(run) = run {
        run.assert_passed();
    }
}

/// Without it NVIDIA's plugin exits on every MIG device ("error getting MIG device attributes:
/// Not Supported"); it builds the `1g.10gb` resource name from these numbers.
#[test]
fn mig_device_attributes_come_from_the_catalog_under_both_names() {
    let run = scenario(
        "mig_device_attributes_come_from_the_catalog_under_both_names",
        h100s(1),
        &[],
        || {
            let nvml = open();
            let gpu = nvml.device_by_index(0).unwrap();
            assert!(matches!(gpu.attributes(), Err(NvmlError::NotSupported)));
            one_mig_device(&nvml);
            let a = gpu.mig_device_by_index(0).unwrap().attributes().unwrap();
            assert_eq!(
                (a.gpu_instance_slice_count, a.compute_instance_slice_count),
                (1, 1)
            );
            assert_eq!(a.memory_size_mb, 9984, "H100 1g.10gb (mig-nvml.md 1.5)");
            assert_eq!(a.multiprocessor_count, 16);
            let v1: unsafe extern "C" fn(
                nvmlDevice_t,
                *mut nvmlDeviceAttributes_t,
            ) -> nvmlReturn_t = raw("nvmlDeviceGetAttributes");
            let mig = gpu.mig_device_by_index(0).unwrap();
            // SAFETY: zeroed plain-data struct, filled by the call.
            let mut out: nvmlDeviceAttributes_t = unsafe { std::mem::zeroed() };
            // SAFETY: the signature nvml.h declares; the handle is the library's.
            assert_eq!(unsafe { v1(mig.handle(), &mut out) }, 0);
            assert_eq!(out.memorySizeMB, 9984);
        },
    );
    if let Some(run) = run {
        run.assert_passed();
    }
}

/// Without it the kubelet fails pods asking for more than one whole GPU (GetPreferredAllocation
/// "failed to get commmon anscestor: Not Supported").
#[test]
fn topology_follows_an_hgx_board() {
    let run = scenario("topology_follows_an_hgx_board", h100s(8), &[], || {
        let nvml = open();
        let d = |i| nvml.device_by_index(i).unwrap();
        let level = |a, b| d(a).topology_common_ancestor(d(b)).unwrap();
        assert_eq!(level(0, 0), TopologyLevel::Internal);
        assert_eq!(level(0, 1), TopologyLevel::Single);
        assert_eq!(level(1, 3), TopologyLevel::Node);
        assert_eq!(level(2, 7), TopologyLevel::System);
        assert_eq!(level(7, 2), TopologyLevel::System, "symmetric");
    });
    if let Some(run) = run {
        run.assert_passed();
    }
}

/// NVIDIA's plugin tolerates NOT_SUPPORTED here (the reference's table); links past
/// `NVML_NVLINK_MAX_LINKS` are invalid.
#[test]
fn nvlink_state_is_not_supported_on_every_link() {
    let run = scenario(
        "nvlink_state_is_not_supported_on_every_link",
        h100s(1),
        &[],
        || {
            let nvml = open();
            let gpu = nvml.device_by_index(0).unwrap();
            for link in 0..NVML_NVLINK_MAX_LINKS {
                let state = gpu.link_wrapper_for(link).is_active();
                assert!(matches!(state, Err(NvmlError::NotSupported)), "link {link}");
            }
            let beyond = gpu.link_wrapper_for(NVML_NVLINK_MAX_LINKS).is_active();
            assert!(matches!(beyond, Err(NvmlError::InvalidArg)));
        },
    );
    if let Some(run) = run {
        run.assert_passed();
    }
}

/// Event sets, through nvml-wrapper as gpu-share uses them: ECC and XID supported on an H100,
/// only XID on a GeForce; an XID raised in the state file after registration is delivered,
/// one raised before is not; a wait without an event times out after its timeout.
#[test]
fn xid_events_reach_a_registered_set() {
    let state = State::with_gpus([
        Gpu::mig("h100").mig_enabled(),
        Gpu::non_mig("NVIDIA GeForce RTX 3090", 24576),
    ]);
    let run = scenario("xid_events_reach_a_registered_set", state, &[], || {
        let path = std::env::var("FAKE_NVML_STATE").unwrap();
        let raise = move |gpu: usize, xid: u64, mig: Option<(u32, u32)>| {
            let mut s = State::read_from(&path).unwrap();
            s.gpus[gpu].raise_xid(xid, mig);
            s.write_to(&path).unwrap();
        };
        let nvml = open();
        let (h100, rtx) = (
            nvml.device_by_index(0).unwrap(),
            nvml.device_by_index(1).unwrap(),
        );
        let all = EventTypes::CRITICAL_XID_ERROR
            | EventTypes::SINGLE_BIT_ECC_ERROR
            | EventTypes::DOUBLE_BIT_ECC_ERROR;
        assert_eq!(h100.supported_event_types().unwrap(), all);
        assert_eq!(
            rtx.supported_event_types().unwrap(),
            EventTypes::CRITICAL_XID_ERROR
        );
        raise(0, 31, None);
        let set = nvml.create_event_set().unwrap();
        let set = h100.register_events(all, set).unwrap();
        let refused = rtx.register_events(all, nvml.create_event_set().unwrap());
        assert!(
            refused.is_err(),
            "ECC events on a GPU without them: NOT_SUPPORTED"
        );
        let started = Instant::now();
        assert!(
            matches!(set.wait(50), Err(NvmlError::Timeout)),
            "XID 31 came before"
        );
        assert!(started.elapsed() >= Duration::from_millis(50));
        let (gi, ci) = (7, 0);
        std::thread::spawn({
            let raise = raise.clone();
            move || {
                std::thread::sleep(Duration::from_millis(30));
                raise(0, 79, Some((gi, ci)));
            }
        });
        let e = set.wait(5_000).unwrap();
        assert_eq!(e.event_type, EventTypes::CRITICAL_XID_ERROR);
        assert_eq!(
            e.event_data,
            Some(nvml_wrapper::enums::event::XidError::Value(79))
        );
        assert_eq!(e.device.uuid().unwrap(), h100.uuid().unwrap());
        set.release_events().unwrap();
    });
    if let Some(run) = run {
        run.assert_passed();
    }
}

/// The raw calls: `_v2` carries the MIG device's ids (0xFFFFFFFF for a whole-GPU event), v1
/// fills only its 24 bytes, a freed set is an invalid argument.
#[test]
fn raw_event_calls_carry_mig_ids_and_respect_struct_versions() {
    let run = scenario(
        "raw_event_calls_carry_mig_ids_and_respect_struct_versions",
        h100s(1),
        &[],
        || {
            let path = std::env::var("FAKE_NVML_STATE").unwrap();
            let nvml = open();
            let (mig, gi) = one_mig_device(&nvml);
            type Wait<T> = unsafe extern "C" fn(nvmlEventSet_t, *mut T, u32) -> nvmlReturn_t;
            let create: unsafe extern "C" fn(*mut nvmlEventSet_t) -> nvmlReturn_t =
                raw("nvmlEventSetCreate");
            let register: unsafe extern "C" fn(nvmlDevice_t, u64, nvmlEventSet_t) -> nvmlReturn_t =
                raw("nvmlDeviceRegisterEvents");
            let free: unsafe extern "C" fn(nvmlEventSet_t) -> nvmlReturn_t =
                raw("nvmlEventSetFree");
            let wait_v2: Wait<nvmlEventData_t> = raw("nvmlEventSetWait_v2");
            let wait_v1: Wait<[u64; 4]> = raw("nvmlEventSetWait");
            let gpu = nvml.device_by_index(0).unwrap();
            let mut set: nvmlEventSet_t = null_mut();
            // SAFETY (this block): the signatures nvml.h declares, pointers to locals.
            unsafe {
                assert_eq!(create(&mut set), 0);
                assert_eq!(register(mig, 8, set), 3, "MIG handles: NOT_SUPPORTED");
                assert_eq!(register(gpu.handle(), 8, set), 0);
                let mut s = State::read_from(&path).unwrap();
                s.gpus[0].raise_xid(48, Some((gi, 0))).raise_xid(79, None);
                s.write_to(&path).unwrap();
                let mut e: nvmlEventData_t = std::mem::zeroed();
                assert_eq!(wait_v2(set, &mut e, 0), 0);
                assert_eq!(
                    (e.eventData, e.gpuInstanceId, e.computeInstanceId),
                    (48, gi, 0)
                );
                assert_eq!(e.device, gpu.handle());
                let mut v1 = [0u64, 0, 0, 0xDEAD];
                assert_eq!(wait_v1(set, &mut v1, 0), 0);
                assert_eq!((v1[1], v1[2]), (8, 79), "type XID, data 79");
                assert_eq!(v1[3], 0xDEAD, "v1 writes 24 bytes only");
                assert_eq!(wait_v2(set, &mut e, 0), 10, "TIMEOUT: nothing left");
                assert_eq!(wait_v2(set, null_mut(), 0), 2);
                assert_eq!(free(set), 0);
                assert_eq!(free(set), 2, "freed: INVALID_ARGUMENT");
                assert_eq!(wait_v2(set, &mut e, 0), 2);
            }
            let _ = NOT_MIG;
        },
    );
    if let Some(run) = run {
        run.assert_passed();
    }
}

/// With `FAKE_NVML_PROC_ROOT`, instances created through NVML get their capability files and
/// `mig-minors` exists; a destroyed instance's files go (NVIDIA's plugin exits without them).
#[test]
fn mig_procfs_files_follow_instances_made_through_nvml() {
    let proc_root = tempfile::tempdir().unwrap();
    let root = proc_root.path().to_str().unwrap().to_string();
    let run = scenario(
        "mig_procfs_files_follow_instances_made_through_nvml",
        h100s(1),
        &[("FAKE_NVML_PROC_ROOT", &root)],
        || {
            let root = std::path::PathBuf::from(std::env::var("FAKE_NVML_PROC_ROOT").unwrap());
            let nvml = open();
            assert!(root.join("driver/nvidia-caps/mig-minors").is_file());
            let gpu = nvml.device_by_index(0).unwrap();
            let create: unsafe extern "C" fn(
                nvmlDevice_t,
                u32,
                *mut nvmlGpuInstance_t,
            ) -> nvmlReturn_t = raw("nvmlDeviceCreateGpuInstance");
            let destroy: unsafe extern "C" fn(nvmlGpuInstance_t) -> nvmlReturn_t =
                raw("nvmlGpuInstanceDestroy");
            let mut gi: nvmlGpuInstance_t = null_mut();
            // SAFETY: the signature nvml.h declares; profile id 19 = H100 1g.10gb.
            assert_eq!(unsafe { create(gpu.handle(), 19, &mut gi) }, 0);
            let access = root.join("driver/nvidia/capabilities/gpu0/mig/gi13/access");
            let text = std::fs::read_to_string(&access).unwrap();
            assert!(text.starts_with("DeviceFileMinor: 120\n"), "{text}");
            // SAFETY: as above.
            assert_eq!(unsafe { destroy(gi) }, 0);
            assert!(!access.exists());
        },
    );
    if let Some(run) = run {
        run.assert_passed();
    }
}
