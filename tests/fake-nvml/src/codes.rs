//! `nvmlReturn_t` values (from nvml-wrapper-sys, so they match the client's), their names for
//! `FAKE_NVML_FAIL` and the log, and the texts `nvmlErrorString` returns.

use nvml_wrapper_sys::bindings as b;

/// `nvmlReturn_t`.
pub type Ret = b::nvmlReturn_t;

pub const SUCCESS: Ret = b::nvmlReturn_enum_NVML_SUCCESS;
pub const UNINITIALIZED: Ret = b::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED;
pub const INVALID_ARGUMENT: Ret = b::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
pub const NOT_SUPPORTED: Ret = b::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;
pub const NOT_FOUND: Ret = b::nvmlReturn_enum_NVML_ERROR_NOT_FOUND;
pub const INSUFFICIENT_SIZE: Ret = b::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE;
pub const DRIVER_NOT_LOADED: Ret = b::nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED;
pub const RESET_REQUIRED: Ret = b::nvmlReturn_enum_NVML_ERROR_RESET_REQUIRED;
pub const IN_USE: Ret = b::nvmlReturn_enum_NVML_ERROR_IN_USE;
pub const INSUFFICIENT_RESOURCES: Ret = b::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES;
pub const ARGUMENT_VERSION_MISMATCH: Ret = b::nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
pub const TIMEOUT: Ret = b::nvmlReturn_enum_NVML_ERROR_TIMEOUT;
pub const UNKNOWN: Ret = b::nvmlReturn_enum_NVML_ERROR_UNKNOWN;

/// (code, enum name, `nvmlErrorString` text). Texts for 3, 4, 6, 19 and 23 are quoted from real
/// `nvidia-smi` output (mig-nvml.md 2.1); the others follow the same style and are unverified.
const TABLE: &[(Ret, &str, &str)] = &[
    (0, "NVML_SUCCESS", "Success\0"),
    (1, "NVML_ERROR_UNINITIALIZED", "Uninitialized\0"),
    (2, "NVML_ERROR_INVALID_ARGUMENT", "Invalid Argument\0"),
    (3, "NVML_ERROR_NOT_SUPPORTED", "Not Supported\0"),
    (4, "NVML_ERROR_NO_PERMISSION", "Insufficient Permissions\0"),
    (5, "NVML_ERROR_ALREADY_INITIALIZED", "Already Initialized\0"),
    (6, "NVML_ERROR_NOT_FOUND", "Not Found\0"),
    (7, "NVML_ERROR_INSUFFICIENT_SIZE", "Insufficient Size\0"),
    (
        8,
        "NVML_ERROR_INSUFFICIENT_POWER",
        "Insufficient External Power\0",
    ),
    (9, "NVML_ERROR_DRIVER_NOT_LOADED", "Driver Not Loaded\0"),
    (10, "NVML_ERROR_TIMEOUT", "Timeout\0"),
    (11, "NVML_ERROR_IRQ_ISSUE", "Interrupt Request Issue\0"),
    (
        12,
        "NVML_ERROR_LIBRARY_NOT_FOUND",
        "NVML Shared Library Not Found\0",
    ),
    (13, "NVML_ERROR_FUNCTION_NOT_FOUND", "Function Not Found\0"),
    (14, "NVML_ERROR_CORRUPTED_INFOROM", "Corrupted infoROM\0"),
    (15, "NVML_ERROR_GPU_IS_LOST", "GPU is lost\0"),
    (16, "NVML_ERROR_RESET_REQUIRED", "GPU requires restart\0"),
    (
        17,
        "NVML_ERROR_OPERATING_SYSTEM",
        "The operating system has blocked the request.\0",
    ),
    (
        18,
        "NVML_ERROR_LIB_RM_VERSION_MISMATCH",
        "RM has detected an NVML/RM version mismatch.\0",
    ),
    (19, "NVML_ERROR_IN_USE", "In use by another client\0"),
    (20, "NVML_ERROR_MEMORY", "Insufficient Memory\0"),
    (21, "NVML_ERROR_NO_DATA", "No data\0"),
    (
        22,
        "NVML_ERROR_VGPU_ECC_NOT_SUPPORTED",
        "The requested vgpu operation is not available on target device, because ECC is enabled\0",
    ),
    (
        23,
        "NVML_ERROR_INSUFFICIENT_RESOURCES",
        "Insufficient Resources\0",
    ),
    (
        24,
        "NVML_ERROR_FREQ_NOT_SUPPORTED",
        "Frequency not supported\0",
    ),
    (
        25,
        "NVML_ERROR_ARGUMENT_VERSION_MISMATCH",
        "Argument version mismatch\0",
    ),
    (26, "NVML_ERROR_DEPRECATED", "Deprecated\0"),
    (27, "NVML_ERROR_NOT_READY", "Not Ready\0"),
    (28, "NVML_ERROR_GPU_NOT_FOUND", "GPU not found\0"),
    (29, "NVML_ERROR_INVALID_STATE", "Invalid state\0"),
    (
        30,
        "NVML_ERROR_RESET_TYPE_NOT_SUPPORTED",
        "Reset type not supported\0",
    ),
    (999, "NVML_ERROR_UNKNOWN", "Unknown Error\0"),
];

fn entry(code: Ret) -> &'static (Ret, &'static str, &'static str) {
    TABLE
        .iter()
        .find(|e| e.0 == code)
        .unwrap_or(&TABLE[TABLE.len() - 1])
}

/// `NVML_ERROR_IN_USE` for 19; unknown codes read as `NVML_ERROR_UNKNOWN`.
pub fn name(code: Ret) -> &'static str {
    entry(code).1
}

/// The NUL-terminated text `nvmlErrorString` hands out (static: callers must not free it).
pub fn text(code: Ret) -> &'static str {
    entry(code).2
}

/// A code given as a number (`23`) or a name, with or without the prefix (`IN_USE`).
pub fn parse(s: &str) -> Option<Ret> {
    let s = s.trim();
    s.parse().ok().or_else(|| {
        TABLE
            .iter()
            .find(|e| e.1 == s || e.1.strip_prefix("NVML_ERROR_") == Some(s))
            .map(|e| e.0)
    })
}
