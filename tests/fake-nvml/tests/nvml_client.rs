//! Drive the built `libnvidia_ml.so` through nvml-wrapper 0.13, as gpu-share does: safe wrappers
//! where they exist, raw `nvml_wrapper_sys` symbols for the MIG calls it does not wrap.
//!
//! The library keeps per-process state and reads its environment once, so each scenario runs in
//! a child process: the test re-executes its own binary filtered to itself with
//! `FAKE_NVML_TEST_CHILD` set; the child runs the body, the parent checks the exit status and
//! the state file and log the child left behind.

use std::os::unix::process::ExitStatusExt;
use std::ptr::null_mut;

use nvidia_ml::{cdylib_path, Gpu, Place, Process, State};
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings::*;

mod support;
use support::{open, raw, scenario};

fn enabled(model: &str) -> Gpu {
    Gpu::mig(model).mig_enabled()
}

fn create_gi(
    nvml: &Nvml,
    dev: &Device,
    profile_id: u32,
    at: Option<Place>,
) -> Result<nvmlGpuInstance_t, u32> {
    let mut gi = null_mut();
    // SAFETY: valid device handle and out-pointers.
    let rc = unsafe {
        match at {
            Some(p) => {
                let pl = nvmlGpuInstancePlacement_t {
                    start: p.start,
                    size: p.size,
                };
                sym!(nvml, nvmlDeviceCreateGpuInstanceWithPlacement)(
                    dev.handle(),
                    profile_id,
                    &pl,
                    &mut gi,
                )
            }
            None => sym!(nvml, nvmlDeviceCreateGpuInstance)(dev.handle(), profile_id, &mut gi),
        }
    };
    if rc == 0 {
        Ok(gi)
    } else {
        Err(rc)
    }
}

fn gi_info(nvml: &Nvml, gi: nvmlGpuInstance_t) -> nvmlGpuInstanceInfo_t {
    // SAFETY: zeroed C struct, filled by the call.
    let mut info = unsafe { std::mem::zeroed() };
    // SAFETY: handle from the library, valid out-pointer.
    assert_eq!(
        unsafe { sym!(nvml, nvmlGpuInstanceGetInfo)(gi, &mut info) },
        0
    );
    info
}

fn create_ci(
    nvml: &Nvml,
    gi: nvmlGpuInstance_t,
    profile_id: u32,
) -> Result<nvmlComputeInstance_t, u32> {
    let mut ci = null_mut();
    // SAFETY: handle from the library, valid out-pointer.
    let rc = unsafe { sym!(nvml, nvmlGpuInstanceCreateComputeInstance)(gi, profile_id, &mut ci) };
    if rc == 0 {
        Ok(ci)
    } else {
        Err(rc)
    }
}

/// `nvmlDeviceGetGpuInstancePossiblePlacements_v2` the NVML way: ask the count, then fill.
fn placements(nvml: &Nvml, dev: &Device, profile_id: u32) -> Vec<(u32, u32)> {
    let f = sym!(nvml, nvmlDeviceGetGpuInstancePossiblePlacements_v2);
    let mut count = 0;
    // SAFETY: null buffer asks for the count.
    assert_eq!(
        unsafe { f(dev.handle(), profile_id, null_mut(), &mut count) },
        0
    );
    let mut buf = vec![nvmlGpuInstancePlacement_t { start: 0, size: 0 }; count as usize];
    // SAFETY: `buf` holds `count` entries.
    assert_eq!(
        unsafe { f(dev.handle(), profile_id, buf.as_mut_ptr(), &mut count) },
        0
    );
    buf.iter().map(|p| (p.start, p.size)).collect()
}

#[test]
fn enumerates_gpus_like_a_driver() {
    let state = State::with_gpus([
        Gpu::mig("h100"),
        Gpu::mig("NVIDIA A100-PCIE-40GB"),
        Gpu::non_mig("NVIDIA GeForce RTX 3090", 24576).with_process(Process::on_gpu(4242, 1000)),
    ]);
    let uuids: Vec<String> = state.gpus.iter().map(|g| g.uuid.clone()).collect();
    let run = scenario("enumerates_gpus_like_a_driver", state, &[], move || {
        let nvml = open();
        assert_eq!(nvml.device_count().unwrap(), 3);
        assert_eq!(nvml.sys_driver_version().unwrap(), "580.65.06");
        assert_eq!(nvml.sys_cuda_driver_version().unwrap(), 13000);
        let names: Vec<String> = (0..3)
            .map(|i| nvml.device_by_index(i).unwrap().name().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "NVIDIA H100 80GB HBM3",
                "NVIDIA A100-PCIE-40GB",
                "NVIDIA GeForce RTX 3090"
            ]
        );
        let h100 = nvml.device_by_uuid(uuids[0].as_str()).unwrap();
        assert_eq!(h100.index().unwrap(), 0);
        assert_eq!(h100.memory_info().unwrap().total, 81559 << 20);
        assert_eq!(h100.pci_info().unwrap().bus_id, "00000000:18:00.0");
        assert_eq!(h100.pci_info().unwrap().pci_device_id, 0x2330_10DE);
        let rtx = nvml.device_by_index(2).unwrap();
        assert!(matches!(rtx.mig_mode(), Err(NvmlError::NotSupported)));
        assert_eq!(rtx.mig_device_count().unwrap(), 0);
        let procs = rtx.running_compute_processes().unwrap();
        assert_eq!(
            (procs.len(), procs[0].pid, procs[0].gpu_instance_id),
            (1, 4242, None)
        );
        assert_eq!(rtx.memory_info().unwrap().used, 1000 << 20);
        assert!(matches!(
            nvml.device_by_index(3),
            Err(NvmlError::InvalidArg)
        ));
    });
    if let Some(run) = run {
        run.assert_passed();
    }
}

#[test]
fn mig_mode_is_immediate_on_hopper_and_pending_on_ampere() {
    let busy = Gpu::mig("h200").with_process(Process::on_gpu(7, 100));
    let state = State::with_gpus([Gpu::mig("h100"), Gpu::mig("a100"), busy]);
    let run = scenario(
        "mig_mode_is_immediate_on_hopper_and_pending_on_ampere",
        state,
        &[],
        || {
            let nvml = open();
            let dev = |i| nvml.device_by_index(i).unwrap();
            assert_eq!(
                dev(0).set_mig_mode(true).unwrap(),
                nvmlReturn_enum_NVML_SUCCESS
            );
            let m = dev(0).mig_mode().unwrap();
            assert_eq!((m.current, m.pending), (1, 1));
            assert_eq!(dev(0).mig_device_count().unwrap(), 7);
            assert_eq!(
                dev(1).set_mig_mode(true).unwrap(),
                nvmlReturn_enum_NVML_ERROR_RESET_REQUIRED
            );
            let m = dev(1).mig_mode().unwrap();
            assert_eq!((m.current, m.pending), (0, 1));
            assert_eq!(dev(1).mig_device_count().unwrap(), 0);
            assert_eq!(
                dev(2).set_mig_mode(true).unwrap(),
                nvmlReturn_enum_NVML_ERROR_IN_USE
            );
        },
    );
    let Some(run) = run else { return };
    run.assert_passed();
    let modes: Vec<_> = run
        .state
        .gpus
        .iter()
        .map(|g| g.mig.unwrap())
        .map(|m| (m.current, m.pending))
        .collect();
    assert_eq!(modes, [(true, true), (false, true), (false, true)]);
    assert_eq!(run.logged("nvmlDeviceSetMigMode").len(), 3);
}

#[test]
fn profiles_by_index_and_placements_by_id() {
    let state = State::with_gpus([enabled("h100"), Gpu::mig("a30")]);
    let run = scenario("profiles_by_index_and_placements_by_id", state, &[], || {
        let nvml = open();
        let dev = nvml.device_by_index(0).unwrap();
        let p = dev.profile_info(NVML_GPU_INSTANCE_PROFILE_1_SLICE).unwrap();
        assert_eq!(
            (p.id, p.slice_count, p.instance_count, p.memory_size_mb),
            (19, 1, 7, 9984)
        );
        assert_eq!(
            dev.profile_info(NVML_GPU_INSTANCE_PROFILE_7_SLICE)
                .unwrap()
                .id,
            0
        );
        assert!(matches!(
            dev.profile_info(NVML_GPU_INSTANCE_PROFILE_8_SLICE),
            Err(NvmlError::NotSupported)
        ));
        assert!(matches!(dev.profile_info(18), Err(NvmlError::InvalidArg)));
        assert_eq!(
            placements(&nvml, &dev, 19),
            (0..7).map(|s| (s, 1)).collect::<Vec<_>>()
        );
        assert_eq!(placements(&nvml, &dev, 9), [(0, 4), (4, 4)]);
        // A30 answers with MIG disabled; its 2g profile id is 5 (index 1).
        let a30 = nvml.device_by_index(1).unwrap();
        assert_eq!(
            a30.profile_info(NVML_GPU_INSTANCE_PROFILE_2_SLICE)
                .unwrap()
                .id,
            5
        );
        assert_eq!(placements(&nvml, &a30, 5), [(0, 2), (2, 2)]);
        // Too small a buffer: INSUFFICIENT_SIZE with the count.
        let f = sym!(nvml, nvmlDeviceGetGpuInstancePossiblePlacements_v2);
        let mut one = [nvmlGpuInstancePlacement_t { start: 9, size: 9 }];
        let mut count = 1;
        // SAFETY: one-element buffer, count says so.
        let rc = unsafe { f(dev.handle(), 19, one.as_mut_ptr(), &mut count) };
        assert_eq!(
            (rc, count),
            (nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE, 7)
        );
        // Versioned struct: v2 carries the name, a wrong version is refused.
        let v = sym!(nvml, nvmlDeviceGetGpuInstanceProfileInfoByIdV);
        // SAFETY: zeroed C struct.
        let mut info: nvmlGpuInstanceProfileInfo_v2_t = unsafe { std::mem::zeroed() };
        info.version = std::mem::size_of::<nvmlGpuInstanceProfileInfo_v2_t>() as u32 | (2 << 24);
        // SAFETY: valid handle and struct.
        assert_eq!(unsafe { v(dev.handle(), 15, &mut info) }, 0);
        let name = unsafe { std::ffi::CStr::from_ptr(info.name.as_ptr()) };
        assert_eq!((info.id, name.to_str().unwrap()), (15, "MIG 1g.20gb"));
        info.version = 7;
        // SAFETY: as above.
        assert_eq!(
            unsafe { v(dev.handle(), 15, &mut info) },
            nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        );
    });
    if let Some(run) = run {
        run.assert_passed();
    }
}

#[test]
fn gpu_instances_with_and_without_placement() {
    let state = State::with_gpus([enabled("h100")]);
    let run = scenario(
        "gpu_instances_with_and_without_placement",
        state,
        &[],
        || {
            let nvml = open();
            let dev = nvml.device_by_index(0).unwrap();
            let one = create_gi(&nvml, &dev, 19, None).unwrap();
            let info = gi_info(&nvml, one);
            assert_eq!(
                (
                    info.id,
                    info.profileId,
                    info.placement.start,
                    info.placement.size
                ),
                (13, 19, 6, 1)
            );
            let three = create_gi(&nvml, &dev, 9, Some(Place::new(0, 4))).unwrap();
            assert_eq!(gi_info(&nvml, three).id, 1);
            assert_eq!(
                create_gi(&nvml, &dev, 9, None),
                Err(nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES)
            );
            assert_eq!(
                create_gi(&nvml, &dev, 19, Some(Place::new(2, 1))),
                Err(nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES)
            );
            assert_eq!(
                create_gi(&nvml, &dev, 14, Some(Place::new(1, 2))),
                Err(nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT)
            );
            let mut left = 0;
            // SAFETY: valid handle and out-pointer.
            assert_eq!(
                unsafe {
                    sym!(nvml, nvmlDeviceGetGpuInstanceRemainingCapacity)(
                        dev.handle(),
                        19,
                        &mut left,
                    )
                },
                0
            );
            assert_eq!(left, 2);
            let mut list = [null_mut(); 7];
            let mut count = 0;
            // SAFETY: buffer of instanceCount (7) handles, as nvml.h asks.
            let rc = unsafe {
                sym!(nvml, nvmlDeviceGetGpuInstances)(
                    dev.handle(),
                    19,
                    list.as_mut_ptr(),
                    &mut count,
                )
            };
            assert_eq!((rc, count, list[0]), (0, 1, one));
            let mut by_id = null_mut();
            // SAFETY: valid handle and out-pointer.
            assert_eq!(
                unsafe { sym!(nvml, nvmlDeviceGetGpuInstanceById)(dev.handle(), 2, &mut by_id) },
                nvmlReturn_enum_NVML_ERROR_NOT_FOUND
            );
        },
    );
    let Some(run) = run else { return };
    run.assert_passed();
    let gis: Vec<(u32, u32)> = run.state.gpus[0]
        .gpu_instances
        .iter()
        .map(|g| (g.id, g.profile_id))
        .collect();
    assert_eq!(gis, [(13, 19), (1, 9)]);
    let creates = run
        .log
        .iter()
        .filter(|e| e.function.starts_with("nvmlDeviceCreateGpuInstance"));
    let results: Vec<&str> = creates.map(|e| e.result.as_str()).collect();
    assert_eq!(
        results,
        [
            "NVML_SUCCESS",
            "NVML_SUCCESS",
            "NVML_ERROR_INSUFFICIENT_RESOURCES",
            "NVML_ERROR_INSUFFICIENT_RESOURCES",
            "NVML_ERROR_INVALID_ARGUMENT"
        ]
    );
}

#[test]
fn compute_instances_become_mig_devices() {
    let state = State::with_gpus([enabled("h100")]);
    let run = scenario("compute_instances_become_mig_devices", state, &[], || {
        let nvml = open();
        let dev = nvml.device_by_index(0).unwrap();
        let gi = create_gi(&nvml, &dev, 9, Some(Place::new(4, 4))).unwrap();
        let ci = create_ci(&nvml, gi, 2).unwrap();
        let mig = dev.mig_device_by_index(0).unwrap();
        assert_eq!(mig.name().unwrap(), "NVIDIA H100 80GB HBM3 MIG 3g.40gb");
        assert!(mig.uuid().unwrap().starts_with("MIG-"));
        assert!(mig.mig_is_mig_device_handle().unwrap());
        assert_eq!(mig.memory_info().unwrap().total, 40448 << 20);
        assert_eq!(mig.mig_parent_device().unwrap().index().unwrap(), 0);
        let mut id = 9;
        // SAFETY: MIG device handle from the library, valid out-pointer.
        assert_eq!(
            unsafe { sym!(nvml, nvmlDeviceGetGpuInstanceId)(mig.handle(), &mut id) },
            0
        );
        assert_eq!(id, 2);
        assert!(matches!(
            dev.mig_device_by_index(1),
            Err(NvmlError::NotFound)
        ));
        // GI with a CI is in use; destroy the CI first, as nvidia-smi must.
        let destroy_gi = sym!(nvml, nvmlGpuInstanceDestroy);
        // SAFETY: handles from the library.
        assert_eq!(unsafe { destroy_gi(gi) }, nvmlReturn_enum_NVML_ERROR_IN_USE);
        assert_eq!(unsafe { sym!(nvml, nvmlComputeInstanceDestroy)(ci) }, 0);
        assert!(
            mig.name().is_err(),
            "a destroyed MIG device's handle is stale"
        );
        let (a, b) = (
            create_ci(&nvml, gi, 0).unwrap(),
            create_ci(&nvml, gi, 0).unwrap(),
        );
        // SAFETY: zeroed C struct, filled by the call.
        let mut info: nvmlComputeInstanceInfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: handle from the library, valid out-pointer.
        assert_eq!(
            unsafe { sym!(nvml, nvmlComputeInstanceGetInfo_v2)(b, &mut info) },
            0
        );
        assert_eq!(
            (info.id, info.placement.start, info.gpuInstance),
            (1, 1, gi)
        );
        assert_eq!(
            dev.mig_device_by_index(1).unwrap().name().unwrap(),
            "NVIDIA H100 80GB HBM3 MIG 1c.3g.40gb"
        );
        // SAFETY: handles from the library.
        unsafe {
            assert_eq!(sym!(nvml, nvmlComputeInstanceDestroy)(a), 0);
            assert_eq!(sym!(nvml, nvmlComputeInstanceDestroy)(b), 0);
            assert_eq!(destroy_gi(gi), 0);
            assert_eq!(destroy_gi(gi), nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT);
        }
    });
    let Some(run) = run else { return };
    run.assert_passed();
    assert!(run.state.gpus[0].gpu_instances.is_empty());
    let ok = |f: &str| {
        run.logged(f)
            .iter()
            .filter(|e| e.result == "NVML_SUCCESS")
            .count()
    };
    assert_eq!(
        (
            ok("nvmlGpuInstanceCreateComputeInstance"),
            ok("nvmlComputeInstanceDestroy")
        ),
        (3, 3)
    );
    assert_eq!(ok("nvmlGpuInstanceDestroy"), 1);
}

#[test]
fn processes_keep_instances_in_use() {
    let mut gpu = enabled("a30");
    let gi = gpu.create_gpu_instance(5, None).unwrap();
    let ci = gpu.create_compute_instance(gi, 1).unwrap();
    let state = State::with_gpus([gpu.with_process(Process::on_mig(99, 512, gi, ci))]);
    let run = scenario("processes_keep_instances_in_use", state, &[], move || {
        let nvml = open();
        let dev = nvml.device_by_index(0).unwrap();
        let mig = dev.mig_device_by_index(0).unwrap();
        let procs = mig.running_compute_processes().unwrap();
        assert_eq!(
            (
                procs[0].pid,
                procs[0].gpu_instance_id,
                procs[0].compute_instance_id
            ),
            (99, Some(gi), Some(ci))
        );
        assert_eq!(mig.memory_info().unwrap().used, 512 << 20);
        let (mut g, mut c) = (null_mut(), null_mut());
        // SAFETY: valid handles and out-pointers.
        unsafe {
            assert_eq!(
                sym!(nvml, nvmlDeviceGetGpuInstanceById)(dev.handle(), gi, &mut g),
                0
            );
            assert_eq!(
                sym!(nvml, nvmlGpuInstanceGetComputeInstanceById)(g, ci, &mut c),
                0
            );
            assert_eq!(
                sym!(nvml, nvmlComputeInstanceDestroy)(c),
                nvmlReturn_enum_NVML_ERROR_IN_USE
            );
            assert_eq!(
                sym!(nvml, nvmlGpuInstanceDestroy)(g),
                nvmlReturn_enum_NVML_ERROR_IN_USE
            );
        }
        assert_eq!(
            dev.set_mig_mode(false).unwrap(),
            nvmlReturn_enum_NVML_ERROR_IN_USE
        );
    });
    let Some(run) = run else { return };
    run.assert_passed();
    let g = &run.state.gpus[0];
    assert_eq!(
        (
            g.gpu_instances.len(),
            g.mig.unwrap().current,
            g.mig.unwrap().pending
        ),
        (1, true, false)
    );
}

#[test]
fn raw_calls_check_init_pointers_and_handles() {
    let state = State::with_gpus([enabled("h100")]);
    let run = scenario(
        "raw_calls_check_init_pointers_and_handles",
        state,
        &[],
        || {
            // SAFETY: loading the fake library; the calls below follow the NVML contract except
            // where a null pointer or forged handle is the point of the check.
            unsafe {
                let lib = NvmlLib::new(cdylib_path()).unwrap();
                let mut n = 0;
                assert_eq!(
                    lib.nvmlDeviceGetCount_v2(&mut n),
                    nvmlReturn_enum_NVML_ERROR_UNINITIALIZED
                );
                assert_eq!(lib.nvmlInit_v2(), 0);
                assert_eq!(
                    lib.nvmlDeviceGetCount_v2(std::ptr::null_mut()),
                    nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT
                );
                let forged = 0x1234_0000 as nvmlDevice_t;
                assert_eq!(
                    lib.nvmlDeviceGetIndex(forged, &mut n),
                    nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT
                );
                let mut dev = null_mut();
                assert_eq!(lib.nvmlDeviceGetHandleByIndex_v2(0, &mut dev), 0);
                let mut small = [0 as std::ffi::c_char; 8];
                assert_eq!(
                    lib.nvmlDeviceGetName(dev, small.as_mut_ptr(), 8),
                    nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE
                );
                let text = std::ffi::CStr::from_ptr(
                    lib.nvmlErrorString(nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES),
                );
                assert_eq!(text.to_str().unwrap(), "Insufficient Resources");
                assert_eq!(lib.nvmlShutdown(), 0);
                assert_eq!(lib.nvmlShutdown(), nvmlReturn_enum_NVML_ERROR_UNINITIALIZED);
            }
        },
    );
    if let Some(run) = run {
        run.assert_passed();
    }
}

#[test]
fn injected_faults_hit_the_nth_call_only() {
    let state = State::with_gpus([enabled("h100")]);
    let fail = "nvmlDeviceGetCount_v2:1:IN_USE,nvmlDeviceCreateGpuInstance:2:NVML_ERROR_UNKNOWN";
    let env = [("FAKE_NVML_FAIL", fail)];
    let run = scenario("injected_faults_hit_the_nth_call_only", state, &env, || {
        let nvml = open();
        assert!(matches!(nvml.device_count(), Err(NvmlError::InUse)));
        assert_eq!(nvml.device_count().unwrap(), 1);
        let dev = nvml.device_by_index(0).unwrap();
        assert!(create_gi(&nvml, &dev, 19, None).is_ok());
        assert_eq!(
            create_gi(&nvml, &dev, 19, None),
            Err(nvmlReturn_enum_NVML_ERROR_UNKNOWN)
        );
        assert!(create_gi(&nvml, &dev, 19, None).is_ok());
    });
    let Some(run) = run else { return };
    run.assert_passed();
    assert_eq!(run.state.gpus[0].gpu_instances.len(), 2);
    let creates = run.logged("nvmlDeviceCreateGpuInstance");
    let injected: Vec<bool> = creates.iter().map(|e| e.injected).collect();
    assert_eq!(injected, [false, true, false]);
}

#[test]
fn abort_at_mutation_leaves_the_earlier_ones_persisted() {
    let state = State::with_gpus([Gpu::mig("h100")]);
    let env = [("FAKE_NVML_ABORT_AT_MUTATION", "3")];
    let run = scenario(
        "abort_at_mutation_leaves_the_earlier_ones_persisted",
        state,
        &env,
        || {
            let nvml = open();
            let dev = nvml.device_by_index(0).unwrap();
            dev.set_mig_mode(true).unwrap();
            let gi = create_gi(&nvml, &dev, 0, None).unwrap();
            let _ = create_ci(&nvml, gi, 4);
            unreachable!("the third mutation aborts");
        },
    );
    let Some(run) = run else { return };
    assert_eq!(
        run.status.signal(),
        Some(6),
        "SIGABRT expected:\n{}",
        run.output
    );
    let g = &run.state.gpus[0];
    assert!(g.mig.unwrap().current);
    assert_eq!(g.gpu_instances.len(), 1);
    assert!(g.gpu_instances[0].compute_instances.is_empty());
    assert_eq!(run.log.len(), 2);
}

#[test]
fn changes_to_the_state_file_are_seen_by_a_running_client() {
    let state = State::with_gpus([Gpu::non_mig("NVIDIA L4", 23034)]);
    let run = scenario(
        "changes_to_the_state_file_are_seen_by_a_running_client",
        state,
        &[],
        || {
            let nvml = open();
            let dev = nvml.device_by_index(0).unwrap();
            assert_eq!(dev.running_compute_processes_count().unwrap(), 0);
            let path = std::env::var("FAKE_NVML_STATE").unwrap();
            let mut s = State::read_from(&path).unwrap();
            s.gpus[0].processes.push(Process::on_gpu(1, 10));
            s.write_to(&path).unwrap();
            assert_eq!(dev.running_compute_processes_count().unwrap(), 1);
        },
    );
    if let Some(run) = run {
        run.assert_passed();
    }
}

#[test]
fn compute_modes_are_kept_logged_and_refused_as_nvml_does() {
    use nvidia_ml::ComputeMode;
    use nvml_wrapper::enum_wrappers::device::ComputeMode as Mode;
    let state = State::with_gpus([
        Gpu::non_mig("NVIDIA L4", 23034),
        enabled("h100"),
        Gpu::non_mig("NVIDIA L4", 23034).with_compute_mode(ComputeMode::Prohibited),
    ]);
    let env = [("FAKE_NVML_FAIL", "nvmlDeviceSetComputeMode:2:NOT_SUPPORTED")];
    let run = scenario(
        "compute_modes_are_kept_logged_and_refused_as_nvml_does",
        state,
        &env,
        || {
            let nvml = open();
            let dev = |i| nvml.device_by_index(i).unwrap();
            assert_eq!(dev(0).compute_mode().unwrap(), Mode::Default);
            assert_eq!(dev(2).compute_mode().unwrap(), Mode::Prohibited);
            dev(0).set_compute_mode(Mode::ExclusiveProcess).unwrap();
            assert_eq!(dev(0).compute_mode().unwrap(), Mode::ExclusiveProcess);
            // The second set is the injected failure, and changes nothing.
            assert!(matches!(
                dev(0).set_compute_mode(Mode::Default),
                Err(NvmlError::NotSupported)
            ));
            assert_eq!(dev(0).compute_mode().unwrap(), Mode::ExclusiveProcess);
            // MIG mode on: EXCLUSIVE_PROCESS is refused, DEFAULT is not.
            assert!(matches!(
                dev(1).set_compute_mode(Mode::ExclusiveProcess),
                Err(NvmlError::NotSupported)
            ));
            dev(1).set_compute_mode(Mode::Default).unwrap();
            // A value beyond nvmlComputeMode_t.
            let set = sym!(nvml, nvmlDeviceSetComputeMode);
            // SAFETY: a device handle of this Nvml, passed by value.
            let rc = unsafe { set(dev(2).handle(), 7) };
            assert_eq!(rc, nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT);
            assert_eq!(dev(2).compute_mode().unwrap(), Mode::Prohibited);
        },
    );
    let Some(run) = run else { return };
    run.assert_passed();
    let modes: Vec<ComputeMode> = run.state.gpus.iter().map(|g| g.compute_mode).collect();
    assert_eq!(
        modes,
        [
            ComputeMode::ExclusiveProcess,
            ComputeMode::Default,
            ComputeMode::Prohibited
        ]
    );
    let sets: Vec<(Option<usize>, &str, bool)> = run
        .logged("nvmlDeviceSetComputeMode")
        .iter()
        .map(|e| (e.gpu, e.result.as_str(), e.injected))
        .collect();
    assert_eq!(
        sets,
        [
            (Some(0), "NVML_SUCCESS", false),
            (None, "NVML_ERROR_NOT_SUPPORTED", true),
            (Some(1), "NVML_ERROR_NOT_SUPPORTED", false),
            (Some(1), "NVML_SUCCESS", false),
            (Some(2), "NVML_ERROR_INVALID_ARGUMENT", false),
        ]
    );
    let first = &run.logged("nvmlDeviceSetComputeMode")[0];
    assert_eq!(
        first.args["mode_name"],
        "NVML_COMPUTEMODE_EXCLUSIVE_PROCESS"
    );
}

/// Go-nvml looks GPUs up by PCI bus id; before the fix the symbol was missing
/// (nvml-wrapper: FailedToLoadSymbol, go-nvml: "symbol lookup error").
#[test]
fn gpus_are_found_by_pci_bus_id_in_every_form_nvml_accepts() {
    let state = State::with_gpus([enabled("h100"), Gpu::mig("a100")]);
    let run = scenario(
        "gpus_are_found_by_pci_bus_id_in_every_form_nvml_accepts",
        state,
        &[],
        || {
            let nvml = open();
            let second = nvml.device_by_index(1).unwrap();
            let bus_id = second.pci_info().unwrap().bus_id;
            assert_eq!(bus_id, "00000000:28:00.0");
            // nvml.h: domain:bus:device.function, domain:bus:device, bus:device.function (hex).
            for form in [
                bus_id.as_str(),
                "0000:28:00.0",
                "0:28:0",
                "28:00.0",
                "00000000:28:00.0 ",
            ] {
                let dev = nvml.device_by_pci_bus_id(form).unwrap();
                assert_eq!(dev.index().unwrap(), 1, "{form}");
            }
            assert!(matches!(
                nvml.device_by_pci_bus_id("00000000:99:00.0"),
                Err(NvmlError::NotFound)
            ));
            assert!(matches!(
                nvml.device_by_pci_bus_id("not-a-bus-id"),
                Err(NvmlError::InvalidArg)
            ));
            type ByBusId = unsafe extern "C" fn(*const std::ffi::c_char, *mut nvmlDevice_t) -> u32;
            let v1: ByBusId = raw("nvmlDeviceGetHandleByPciBusId");
            let mut h = null_mut();
            // SAFETY: NUL-terminated id, valid out-pointer.
            assert_eq!(unsafe { v1(c"0000:18:00.0".as_ptr(), &mut h) }, 0);
            // SAFETY: handle from the library.
            assert_eq!(unsafe { Device::new(h, &nvml) }.index().unwrap(), 0);
        },
    );
    let Some(run) = run else { return };
    run.assert_passed();
}

/// The unversioned (v1) and `_v2` names go-nvml binds before the newest one,
/// each with its own struct layout (nvml.h: legacy `nvmlPciInfo_t` with a 16-byte busId and
/// reserved words; `nvmlProcessInfo_v1_t`; `nvmlComputeInstanceInfo_t` without placement).
#[test]
fn legacy_names_fill_their_own_struct_versions() {
    let mut gpu = enabled("a30");
    let gi = gpu.create_gpu_instance(5, None).unwrap();
    let ci = gpu.create_compute_instance(gi, 1).unwrap();
    let gpu = gpu.with_process(Process::on_mig(7, 512, gi, ci));
    let run = scenario(
        "legacy_names_fill_their_own_struct_versions",
        State::with_gpus([gpu]),
        &[],
        || {
            type Count = unsafe extern "C" fn(*mut u32) -> u32;
            type ByIndex = unsafe extern "C" fn(u32, *mut nvmlDevice_t) -> u32;
            type Pci = unsafe extern "C" fn(nvmlDevice_t, *mut [u8; 68]) -> u32;
            type Procs<T> = unsafe extern "C" fn(nvmlDevice_t, *mut u32, *mut T) -> u32;
            type CiInfo = unsafe extern "C" fn(nvmlComputeInstance_t, *mut [u8; 40]) -> u32;
            let init: unsafe extern "C" fn() -> u32 = raw("nvmlInit");
            // SAFETY: no arguments.
            assert_eq!(unsafe { init() }, 0);
            let mut n = 0;
            // SAFETY: valid out-pointer.
            assert_eq!(unsafe { raw::<Count>("nvmlDeviceGetCount")(&mut n) }, 0);
            assert_eq!(n, 1);
            let mut dev = null_mut();
            // SAFETY: valid out-pointer.
            assert_eq!(
                unsafe { raw::<ByIndex>("nvmlDeviceGetHandleByIndex")(0, &mut dev) },
                0
            );

            for name in ["nvmlDeviceGetPciInfo", "nvmlDeviceGetPciInfo_v2"] {
                let mut buf = [0xAAu8; 68];
                // SAFETY: handle from the library; 68 bytes >= the legacy 52.
                assert_eq!(unsafe { raw::<Pci>(name)(dev, &mut buf) }, 0);
                assert_eq!(
                    &buf[..13],
                    b"0000:18:00.0\0",
                    "{name}: 16-byte legacy busId"
                );
                let word = |at: usize| u32::from_ne_bytes(buf[at..at + 4].try_into().unwrap());
                assert_eq!((word(16), word(20), word(24)), (0, 0x18, 0), "{name}");
                assert_eq!(word(28), 0x20B7_10DE, "{name}: pciDeviceId");
                assert_eq!(&buf[36..52], &[0; 16], "{name}: reserved words");
                assert_eq!(
                    &buf[52..],
                    &[0xAA; 16],
                    "{name} wrote past the legacy struct"
                );
            }

            let mut count = 4;
            let mut v1 = [nvmlProcessInfo_v1_t {
                pid: 0,
                usedGpuMemory: 0,
            }; 4];
            let f: Procs<nvmlProcessInfo_v1_t> = raw("nvmlDeviceGetComputeRunningProcesses");
            // SAFETY: buffer of `count` entries.
            assert_eq!(unsafe { f(dev, &mut count, v1.as_mut_ptr()) }, 0);
            assert_eq!((count, v1[0].pid, v1[0].usedGpuMemory), (1, 7, 512 << 20));
            let mut v2 = [nvmlProcessInfo_v2_t {
                pid: 0,
                usedGpuMemory: 0,
                gpuInstanceId: 0,
                computeInstanceId: 9,
            }; 4];
            let f: Procs<nvmlProcessInfo_v2_t> = raw("nvmlDeviceGetComputeRunningProcesses_v2");
            count = 4;
            // SAFETY: buffer of `count` entries.
            assert_eq!(unsafe { f(dev, &mut count, v2.as_mut_ptr()) }, 0);
            assert_eq!(
                (
                    count,
                    v2[0].pid,
                    v2[0].gpuInstanceId,
                    v2[0].computeInstanceId
                ),
                (1, 7, gi, ci)
            );

            type GetGi = unsafe extern "C" fn(nvmlDevice_t, u32, *mut nvmlGpuInstance_t) -> u32;
            type GetCi =
                unsafe extern "C" fn(nvmlGpuInstance_t, u32, *mut nvmlComputeInstance_t) -> u32;
            let (mut gih, mut cih) = (null_mut(), null_mut());
            // SAFETY: handles from the library, valid out-pointers.
            unsafe {
                assert_eq!(
                    raw::<GetGi>("nvmlDeviceGetGpuInstanceById")(dev, gi, &mut gih),
                    0
                );
                assert_eq!(
                    raw::<GetCi>("nvmlGpuInstanceGetComputeInstanceById")(gih, ci, &mut cih),
                    0
                );
            }
            let mut info = [0xAAu8; 40];
            // SAFETY: handle from the library; 40 bytes = the v2 struct.
            assert_eq!(
                unsafe { raw::<CiInfo>("nvmlComputeInstanceGetInfo")(cih, &mut info) },
                0
            );
            let word = |at: usize| u32::from_ne_bytes(info[at..at + 4].try_into().unwrap());
            assert_eq!((word(16), word(20)), (ci, 1), "v1 id, profileId");
            assert_eq!(&info[24..32], &[0xAA; 8], "v1 has no placement");

            let shutdown: unsafe extern "C" fn() -> u32 = raw("nvmlShutdown");
            // SAFETY: no arguments.
            assert_eq!(unsafe { shutdown() }, 0);
        },
    );
    let Some(run) = run else { return };
    run.assert_passed();
}

/// A real client (go-nvml through mig-parted's default configs) creates
/// `1g.20gb` devices with CI profile index 0 (`NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE`); the fake
/// answered NOT_SUPPORTED. The driver's own default CI there stays 1_SLICE_REV1 (7).
#[test]
fn one_slice_compute_instance_on_a_1g_20gb_gpu_instance() {
    let state = State::with_gpus([enabled("h100")]);
    let run = scenario(
        "one_slice_compute_instance_on_a_1g_20gb_gpu_instance",
        state,
        &[],
        || {
            let nvml = open();
            let dev = nvml.device_by_index(0).unwrap();
            let gi = create_gi(&nvml, &dev, 15, None).unwrap();
            // SAFETY: zeroed C struct, filled by the call.
            let mut info: nvmlComputeInstanceProfileInfo_t = unsafe { std::mem::zeroed() };
            let get = sym!(nvml, nvmlGpuInstanceGetComputeInstanceProfileInfo);
            // SAFETY: handle from the library, valid out-pointer.
            assert_eq!(unsafe { get(gi, 0, 0, &mut info) }, 0);
            assert_eq!((info.id, info.sliceCount, info.instanceCount), (0, 1, 1));
            // SAFETY: as above.
            assert_eq!(unsafe { get(gi, 7, 0, &mut info) }, 0);
            assert_eq!(info.id, 7);
            let ci = create_ci(&nvml, gi, 0).expect("1_SLICE CI on a 1g.20gb GI");
            assert_eq!(
                dev.mig_device_by_index(0).unwrap().name().unwrap(),
                "NVIDIA H100 80GB HBM3 MIG 1g.20gb"
            );
            // The GI has one compute slice: a second CI, of either profile, does not fit.
            assert_eq!(
                create_ci(&nvml, gi, 7),
                Err(nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES)
            );
            // SAFETY: handle from the library.
            assert_eq!(unsafe { sym!(nvml, nvmlComputeInstanceDestroy)(ci) }, 0);
            create_ci(&nvml, gi, 7).expect("the default 1_SLICE_REV1 CI");
        },
    );
    let Some(run) = run else { return };
    run.assert_passed();
    let gi = &run.state.gpus[0].gpu_instances[0];
    assert_eq!((gi.profile_id, gi.compute_instances[0].profile_id), (15, 7));
}
