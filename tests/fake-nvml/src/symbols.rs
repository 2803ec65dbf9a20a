//! The symbols `libnvidia_ml.so` exports: one list that README.md's table, the dlopen test
//! (`tests/symbols.rs`) and a source scan of `src/ffi` are all checked against, so none of the
//! three can drift from the others.
//!
//! Real clients resolve more than one name per call. nvml.h maps the plain name to the newest
//! version (`#define nvmlDeviceGetPciInfo nvmlDeviceGetPciInfo_v3`), so C clients built against
//! it link the versioned name, while go-nvml (`pkg/nvml/lib.go`, `updateVersionedSymbols`) binds
//! the unversioned (v1) name first and switches to `_v2`/`_v3` when `dlsym` finds them. A client
//! that calls a name the library lacks dies with "symbol lookup error", so every call the fake
//! implements is exported under each name of its family in [`VERSIONED_FAMILIES`].

/// One NVML call and the names it is exported under, oldest first.
#[derive(Debug, Clone, Copy)]
pub struct Family {
    /// The name nvml.h documents the call under.
    pub call: &'static str,
    /// Every exported name of the call: the v1 (unversioned) symbol and the versioned ones.
    pub names: &'static [&'static str],
    /// What differs between the names, for the README.
    pub note: &'static str,
}

/// Calls exported under more than one name (nvml.h `#define`s and go-nvml's versioned lookups).
pub const VERSIONED_FAMILIES: &[Family] = &[
    Family {
        call: "nvmlInit",
        names: &["nvmlInit", "nvmlInit_v2", "nvmlInitWithFlags"],
        note: "same behaviour (the fake never attaches to hardware)",
    },
    Family {
        call: "nvmlDeviceGetCount",
        names: &["nvmlDeviceGetCount", "nvmlDeviceGetCount_v2"],
        note: "same count (inaccessible GPUs are not simulated)",
    },
    Family {
        call: "nvmlDeviceGetHandleByIndex",
        names: &["nvmlDeviceGetHandleByIndex", "nvmlDeviceGetHandleByIndex_v2"],
        note: "same handle",
    },
    Family {
        call: "nvmlDeviceGetHandleByPciBusId",
        names: &["nvmlDeviceGetHandleByPciBusId", "nvmlDeviceGetHandleByPciBusId_v2"],
        note: "same lookup; `domain:bus:device.function`, `domain:bus:device`, `bus:device.function`",
    },
    Family {
        call: "nvmlDeviceGetPciInfo",
        names: &["nvmlDeviceGetPciInfo", "nvmlDeviceGetPciInfo_v2", "nvmlDeviceGetPciInfo_v3"],
        note: "v1/_v2 fill the legacy 52-byte struct (16-byte busId + 4 reserved words); _v3 the 68-byte one",
    },
    Family {
        call: "nvmlDeviceGetMemoryInfo",
        names: &["nvmlDeviceGetMemoryInfo", "nvmlDeviceGetMemoryInfo_v2"],
        note: "_v2 takes the versioned `nvmlMemory_v2_t`",
    },
    Family {
        call: "nvmlDeviceGetComputeRunningProcesses",
        names: &[
            "nvmlDeviceGetComputeRunningProcesses",
            "nvmlDeviceGetComputeRunningProcesses_v2",
            "nvmlDeviceGetComputeRunningProcesses_v3",
        ],
        note: "v1 entries are 16 bytes (pid, memory); _v2/_v3 24 bytes (+ GI and CI ids)",
    },
    Family {
        call: "nvmlSystemGetCudaDriverVersion",
        names: &["nvmlSystemGetCudaDriverVersion", "nvmlSystemGetCudaDriverVersion_v2"],
        note: "same value",
    },
    Family {
        call: "nvmlDeviceGetGpuInstanceProfileInfo",
        names: &[
            "nvmlDeviceGetGpuInstanceProfileInfo",
            "nvmlDeviceGetGpuInstanceProfileInfoV",
            "nvmlDeviceGetGpuInstanceProfileInfoByIdV",
        ],
        note: "v1 struct by index (MIG on or off); V (v2/v3 struct) by index and ById, MIG on only",
    },
    Family {
        call: "nvmlDeviceGetGpuInstancePossiblePlacements",
        names: &[
            "nvmlDeviceGetGpuInstancePossiblePlacements",
            "nvmlDeviceGetGpuInstancePossiblePlacements_v2",
        ],
        note: "_v2 also takes a null buffer as a count query",
    },
    Family {
        call: "nvmlGpuInstanceGetComputeInstanceProfileInfo",
        names: &[
            "nvmlGpuInstanceGetComputeInstanceProfileInfo",
            "nvmlGpuInstanceGetComputeInstanceProfileInfoV",
        ],
        note: "V takes the versioned v2/v3 struct",
    },
    Family {
        call: "nvmlDeviceGetAttributes",
        names: &["nvmlDeviceGetAttributes", "nvmlDeviceGetAttributes_v2"],
        note: "same struct and answer (MIG devices only)",
    },
    Family {
        call: "nvmlEventSetWait",
        names: &["nvmlEventSetWait", "nvmlEventSetWait_v2"],
        note: "v1 fills the 24-byte struct without `gpuInstanceId`/`computeInstanceId`",
    },
    Family {
        call: "nvmlComputeInstanceGetInfo",
        names: &["nvmlComputeInstanceGetInfo", "nvmlComputeInstanceGetInfo_v2"],
        note: "v1 fills the struct without `placement`",
    },
];

/// Every exported symbol, grouped as in nvml.h (README.md lists the same, group by group).
pub const EXPORTED: &[(&str, &[&str])] = &[
    (
        "Library/system",
        &[
            "nvmlInit",
            "nvmlInit_v2",
            "nvmlInitWithFlags",
            "nvmlShutdown",
            "nvmlErrorString",
            "nvmlSystemGetDriverVersion",
            "nvmlSystemGetNVMLVersion",
            "nvmlSystemGetCudaDriverVersion",
            "nvmlSystemGetCudaDriverVersion_v2",
        ],
    ),
    (
        "Devices",
        &[
            "nvmlDeviceGetCount",
            "nvmlDeviceGetCount_v2",
            "nvmlDeviceGetHandleByIndex",
            "nvmlDeviceGetHandleByIndex_v2",
            "nvmlDeviceGetHandleByPciBusId",
            "nvmlDeviceGetHandleByPciBusId_v2",
            "nvmlDeviceGetHandleByUUID",
            "nvmlDeviceGetIndex",
            "nvmlDeviceGetName",
            "nvmlDeviceGetUUID",
            "nvmlDeviceGetPciInfo",
            "nvmlDeviceGetPciInfo_v2",
            "nvmlDeviceGetPciInfo_v3",
            "nvmlDeviceGetMemoryInfo",
            "nvmlDeviceGetMemoryInfo_v2",
            "nvmlDeviceGetComputeRunningProcesses",
            "nvmlDeviceGetComputeRunningProcesses_v2",
            "nvmlDeviceGetComputeRunningProcesses_v3",
            "nvmlDeviceGetComputeMode",
            "nvmlDeviceSetComputeMode",
        ],
    ),
    (
        "MIG mode and MIG devices",
        &[
            "nvmlDeviceGetMigMode",
            "nvmlDeviceSetMigMode",
            "nvmlDeviceGetMaxMigDeviceCount",
            "nvmlDeviceGetMigDeviceHandleByIndex",
            "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
            "nvmlDeviceIsMigDeviceHandle",
            "nvmlDeviceGetGpuInstanceId",
            "nvmlDeviceGetComputeInstanceId",
        ],
    ),
    (
        "GPU instances",
        &[
            "nvmlDeviceGetGpuInstanceProfileInfo",
            "nvmlDeviceGetGpuInstanceProfileInfoV",
            "nvmlDeviceGetGpuInstanceProfileInfoByIdV",
            "nvmlDeviceGetGpuInstancePossiblePlacements",
            "nvmlDeviceGetGpuInstancePossiblePlacements_v2",
            "nvmlDeviceGetGpuInstanceRemainingCapacity",
            "nvmlDeviceCreateGpuInstance",
            "nvmlDeviceCreateGpuInstanceWithPlacement",
            "nvmlDeviceGetGpuInstances",
            "nvmlDeviceGetGpuInstanceById",
            "nvmlGpuInstanceGetInfo",
            "nvmlGpuInstanceDestroy",
        ],
    ),
    (
        "Compute instances",
        &[
            "nvmlGpuInstanceGetComputeInstanceProfileInfo",
            "nvmlGpuInstanceGetComputeInstanceProfileInfoV",
            "nvmlGpuInstanceGetComputeInstanceRemainingCapacity",
            "nvmlGpuInstanceGetComputeInstancePossiblePlacements",
            "nvmlGpuInstanceCreateComputeInstance",
            "nvmlGpuInstanceCreateComputeInstanceWithPlacement",
            "nvmlGpuInstanceGetComputeInstances",
            "nvmlGpuInstanceGetComputeInstanceById",
            "nvmlComputeInstanceGetInfo",
            "nvmlComputeInstanceGetInfo_v2",
            "nvmlComputeInstanceDestroy",
        ],
    ),
    (
        "Board and topology (NVIDIA's device plugin)",
        &[
            "nvmlDeviceGetMinorNumber",
            "nvmlDeviceGetCudaComputeCapability",
            "nvmlDeviceGetAttributes",
            "nvmlDeviceGetAttributes_v2",
            "nvmlDeviceGetTopologyCommonAncestor",
            "nvmlDeviceGetNvLinkState",
        ],
    ),
    (
        "Events",
        &[
            "nvmlEventSetCreate",
            "nvmlDeviceGetSupportedEventTypes",
            "nvmlDeviceRegisterEvents",
            "nvmlEventSetWait",
            "nvmlEventSetWait_v2",
            "nvmlEventSetFree",
        ],
    ),
];

/// Every exported symbol, in [`EXPORTED`] order.
pub fn exported_names() -> impl Iterator<Item = &'static str> {
    EXPORTED.iter().flat_map(|(_, names)| names.iter().copied())
}

/// README.md's "Exported symbols" section, between its `symbols:begin`/`symbols:end` markers.
/// `tests/symbols.rs` fails when the README differs, and prints this text to paste.
pub fn readme_section() -> String {
    let mut out = format!("## Exported symbols ({})\n\n", exported_names().count());
    for (group, names) in EXPORTED {
        let list: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
        out += &format!("{group}: {}.\n\n", list.join(", "));
    }
    out +=
        "Calls exported under several names (nvml.h's `#define nvmlX nvmlX_vN`; go-nvml binds the \
            unversioned name, then the newest version `dlsym` finds):\n\n";
    out += "| call | names | difference |\n|---|---|---|\n";
    for f in VERSIONED_FAMILIES {
        let names: Vec<String> = f.names.iter().map(|n| format!("`{n}`")).collect();
        out += &format!("| `{}` | {} | {} |\n", f.call, names.join(", "), f.note);
    }
    out
}
