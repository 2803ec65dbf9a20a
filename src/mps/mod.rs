//! CUDA MPS: one control daemon per GPU set, clients share SMs with optional per-client limits
//! on active threads and pinned device memory. This module owns the `mps` block's validation and
//! how its limits are derived.

pub mod consumable;
pub mod daemon;
pub mod planned;
pub mod shm;

use crate::profile::{Mode, Mps, Problem, Profile};
use crate::sharing::PlannedMode;

/// The client bound is part of the profile format (its schema states it); this mode checks it.
pub use crate::profile::MAX_MPS_REPLICAS as MAX_REPLICAS;

/// The most MPS clients one MIG device takes. The MIG User Guide: "CUDA MPS is supported on top
/// of MIG. The only limitation is that the maximum number of clients (48) is lowered
/// proportionally to the Compute Instance size." It gives no table, so we read it as
/// 48 × the instance's compute slices / the GPU's, rounded down: 6 clients on an H100 `1g.10gb`
/// (1 of 7 slices), 20 on a `3g.40gb`, 48 on a `7g.80gb`, 12 on an A30 `1g.6gb` (1 of 4).
pub fn max_clients_on_mig(instance_compute_slices: u32, gpu_compute_slices: u32) -> i64 {
    if gpu_compute_slices == 0 {
        return MAX_REPLICAS;
    }
    MAX_REPLICAS * i64::from(instance_compute_slices.min(gpu_compute_slices))
        / i64::from(gpu_compute_slices)
}

/// Why `replicas` MPS clients are too many for a MIG device of `profile` on `model`, if they are.
pub fn too_many_clients_on_mig(
    replicas: i64,
    profile: &crate::mig::catalog::GpuInstanceProfile,
    model: &crate::mig::GpuModel,
) -> Option<String> {
    let max = max_clients_on_mig(profile.slice_count, model.compute_slices);
    (replicas > max).then(|| {
        format!(
            "mps.replicas is {replicas}, but an MPS server on a {} MIG device of {} takes at most {max} clients (48 lowered in proportion to its {} of {} compute slices, MIG User Guide)",
            profile.name, model.nvml_name, profile.slice_count, model.compute_slices
        )
    })
}

/// A pinned device-memory limit per client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PinnedMemoryLimit {
    /// GPU memory divided by the number of replicas.
    Auto,
    Mib(u64),
}

/// A pinned-memory limit that cannot be read or worked out, or MPS clients a MIG device
/// cannot take: each said as the sentence a profile author reads.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MpsError {
    #[error("mps.pinnedMemoryLimit {text:?} is not `auto` or a size such as 8Gi or 512Mi")]
    PinnedUnit { text: String },
    #[error("mps.pinnedMemoryLimit {text:?} has no number")]
    PinnedNoNumber { text: String },
    #[error("mps.pinnedMemoryLimit must be more than 0")]
    PinnedZero,
    #[error("mps.pinnedMemoryLimit {text:?} is larger than any GPU's memory")]
    PinnedTooLarge { text: String },
    /// `auto` divides a device's memory, which is not known (`whose` names the device).
    #[error("mps.pinnedMemoryLimit is auto, but {whose} memory size is unknown")]
    AutoWithoutMemory { whose: String },
    /// More clients than an MPS server inside this MIG device takes (the sentence says which).
    #[error("{0}")]
    TooManyClientsOnMig(String),
    /// A consumable policy this device cannot hold (the sentence says which rule).
    #[error("{0}")]
    Consumable(String),
}

/// Parse `auto` or a quantity (`8Gi`, `8G`, `8192Mi`, `8192M`; binary units either way, as
/// `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` reads `M` and `G`).
pub fn parse_pinned_memory_limit(text: &str) -> Result<PinnedMemoryLimit, MpsError> {
    let t = text.trim();
    if t.eq_ignore_ascii_case("auto") {
        return Ok(PinnedMemoryLimit::Auto);
    }
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let text = || text.to_string();
    let factor = match unit {
        "Gi" | "G" => 1024,
        "Mi" | "M" => 1,
        _ => return Err(MpsError::PinnedUnit { text: text() }),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| MpsError::PinnedNoNumber { text: text() })?;
    if n == 0 {
        return Err(MpsError::PinnedZero);
    }
    n.checked_mul(factor)
        .map(PinnedMemoryLimit::Mib)
        .ok_or_else(|| MpsError::PinnedTooLarge { text: text() })
}

impl PinnedMemoryLimit {
    /// The limit per client on a GPU with `gpu_memory_mib`, shared by `replicas` clients.
    pub fn per_client_mib(self, gpu_memory_mib: u64, replicas: u64) -> u64 {
        match self {
            PinnedMemoryLimit::Auto => gpu_memory_mib / replicas.max(1),
            PinnedMemoryLimit::Mib(m) => m,
        }
    }
}

/// Why MPS cannot run on the GPU named `product`, if it is a Jetson/Tegra integrated GPU (its
/// NVML name, or the device tree's model, says Tegra, Jetson, Orin or Xavier). Those boards have
/// no NVML, and MPS control daemons are started per GPU found through NVML (the NVIDIA device
/// plugin's MPS daemon and ours alike); `gpu-share doctor` says the same of a Tegra node.
pub fn unavailable_on(product: &str) -> Option<String> {
    crate::gpu::tegra::names_a_tegra(product).then(|| {
            format!(
                "MPS is not available on {product}: a Jetson/Tegra integrated GPU has no NVML, through which MPS control daemons are started; share it by time-slicing (`timeSlicing: {{replicas: N}}`)"
            )
        })
}

/// A warning when `mps.pinnedMemoryLimit` gives each client more than the whole device has:
/// the limit then limits nothing. `device` names the device (`this GPU`, `the 1g.10gb MIG
/// device`).
pub fn pinned_over_memory(limit_mib: u64, memory_mib: u64, device: &str) -> Option<String> {
    (limit_mib > memory_mib).then(|| {
        format!(
            "mps.pinnedMemoryLimit gives each client {limit_mib} MiB, but {device} has {memory_mib} MiB: the limit limits nothing (give at most the device's memory, or `auto`)"
        )
    })
}

/// A warning when a fixed `mps.pinnedMemoryLimit` exceeds the memory of every GPU the rule can
/// meet: `models` are the catalog models its selector matches (every catalog model for an index
/// or `all` selector). Nothing is said when no model is known.
pub fn pinned_over_every_model(mps: &Mps, models: &[&crate::mig::GpuModel]) -> Option<String> {
    let Ok(PinnedMemoryLimit::Mib(limit)) =
        parse_pinned_memory_limit(mps.pinned_memory_limit.as_deref()?)
    else {
        return None;
    };
    let largest = models.iter().max_by_key(|m| m.total_memory_mib)?;
    (limit > largest.total_memory_mib).then(|| {
        format!(
            "mps.pinnedMemoryLimit gives each client {limit} MiB, more than any GPU this rule can select has (the largest, {}, has {} MiB): the limit limits nothing",
            largest.nvml_name, largest.total_memory_mib
        )
    })
}

/// This mode's entries in the device plugin's `sharing.mps.resources`: the NVIDIA plugin's MPS
/// only shares whole GPUs (it refuses MIG devices), advertised as `nvidia.com/gpu`.
pub fn plugin_resources(mode: &PlannedMode) -> Vec<(String, u64)> {
    match mode {
        PlannedMode::Mps { replicas, .. } => {
            vec![(crate::sharing::GPU_RESOURCE.to_string(), *replicas)]
        }
        _ => Vec::new(),
    }
}

/// What the MPS daemons gpu-share runs ([`daemon`]: one control daemon per resource
/// name, one per MIG device inside MIG) cannot do, whichever plugin advertises the GPUs: whole
/// MPS GPUs share one daemon, so one default active-thread percentage; MPS inside MIG has
/// needs `validate` states.
pub fn check_daemons(name: &str, profile: &Profile) -> Vec<Problem> {
    let modes = profile.rule_modes();
    let mut problems = Vec::new();
    let mut first_mps: Option<(usize, Option<i64>)> = None;
    for (i, rule, mode) in &modes {
        if let Mode::Mps(mps) = mode {
            match first_mps {
                Some((j, pct)) if pct != mps.active_thread_percentage => problems.push(
                    Problem::error(
                        name,
                        format!(
                            "mps.activeThreadPercentage is {} here but {} in rule {}: MPS GPUs are advertised under one resource, served by one MPS control daemon with one default (give both rules the same value)",
                            show(mps.active_thread_percentage),
                            show(pct),
                            j + 1
                        ),
                    )
                    .in_rule(*i, rule),
                ),
                Some(_) => {}
                None => first_mps = Some((*i, mps.active_thread_percentage)),
            }
        }
    }
    for (i, rule, mode) in &modes {
        if let Mode::Mig { mps: Some(_), .. } = mode {
            problems.push(Problem::warning(name, MPS_ON_MIG_NEEDS).in_rule(*i, rule));
        }
    }
    problems
}

/// What a node must have for MPS inside MIG devices, said by `validate`.
pub const MPS_ON_MIG_NEEDS: &str = "MPS runs inside each MIG device, one control daemon per device (MIG User Guide): the node needs a MIG-capable GPU, an nvidia-cuda-mps-control whose driver supports MPS on MIG (CUDA 11.4 / driver R470 or later is commonly cited; NVIDIA's text found gives no minimum), and compute mode left at Default (EXCLUSIVE_PROCESS is not supported in MIG mode); each device takes fewer clients than 48, in proportion to its compute slices";

fn show(pct: Option<i64>) -> String {
    pct.map_or_else(|| "unset".into(), |p| p.to_string())
}

/// Problems with an `mps` block, as sentences.
pub fn validate(mps: &Mps) -> Vec<String> {
    let mut problems = Vec::new();
    if mps.replicas < 2 {
        problems.push(format!(
            "mps.replicas is {}, but the number of replicas must be >= 2",
            mps.replicas
        ));
    } else if mps.replicas > MAX_REPLICAS {
        problems.push(format!(
            "mps.replicas is {}, but an MPS server takes at most {MAX_REPLICAS} clients per GPU",
            mps.replicas
        ));
    }
    if let Some(p) = mps.active_thread_percentage {
        if !(1..=100).contains(&p) {
            problems.push(format!(
                "mps.activeThreadPercentage is {p}, but it must be between 1 and 100"
            ));
        }
    }
    if let Some(limit) = &mps.pinned_memory_limit {
        if let Err(e) = parse_pinned_memory_limit(limit) {
            problems.push(e.to_string());
        }
    }
    problems.extend(consumable::validate(mps));
    problems
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::parse_profile;

    fn mps(replicas: i64, pct: Option<i64>, mem: Option<&str>) -> Mps {
        Mps {
            replicas,
            active_thread_percentage: pct,
            pinned_memory_limit: mem.map(str::to_string),
            consumable: None,
        }
    }

    #[test]
    fn limits_parse() {
        assert_eq!(
            parse_pinned_memory_limit("auto"),
            Ok(PinnedMemoryLimit::Auto)
        );
        assert_eq!(
            parse_pinned_memory_limit("8Gi"),
            Ok(PinnedMemoryLimit::Mib(8192))
        );
        assert_eq!(
            parse_pinned_memory_limit("512M"),
            Ok(PinnedMemoryLimit::Mib(512))
        );
        assert!(parse_pinned_memory_limit("8GB").is_err());
        assert!(parse_pinned_memory_limit("0Gi").is_err());
        assert_eq!(PinnedMemoryLimit::Auto.per_client_mib(81559, 4), 20389);
    }

    #[test]
    fn clients_on_mig_shrink_with_the_compute_instance() {
        assert_eq!(max_clients_on_mig(1, 7), 6);
        assert_eq!(max_clients_on_mig(2, 7), 13);
        assert_eq!(max_clients_on_mig(3, 7), 20);
        assert_eq!(max_clients_on_mig(4, 7), 27);
        assert_eq!(max_clients_on_mig(7, 7), 48);
        assert_eq!(max_clients_on_mig(1, 4), 12);
        assert_eq!(max_clients_on_mig(2, 4), 24);
        let model = crate::mig::catalog().model("h100").unwrap();
        let one = model.profile("1g.10gb").unwrap();
        assert!(too_many_clients_on_mig(6, one, model).is_none());
        let why = too_many_clients_on_mig(7, one, model).unwrap();
        assert!(why.contains("at most 6 clients"), "{why}");
        assert!(why.contains("1 of 7 compute slices"), "{why}");
    }

    #[test]
    fn bad_blocks_are_refused() {
        assert!(validate(&mps(4, Some(25), Some("auto"))).is_empty());
        assert!(validate(&mps(0, None, None))[0].contains(">= 2"));
        assert!(validate(&mps(49, None, None))[0].contains("at most 48"));
        assert!(validate(&mps(4, Some(0), None))[0].contains("between 1 and 100"));
        assert!(validate(&mps(4, None, Some("lots")))[0].contains("not `auto`"));
        // 2^64 MiB overflows: refused, not wrapped around to a small limit.
        let huge = format!("{}Gi", u64::MAX / 512);
        assert!(validate(&mps(4, None, Some(&huge)))[0].contains("larger than any GPU"));
    }

    #[test]
    fn tegra_boards_have_no_mps() {
        for product in [
            "NVIDIA Jetson AGX Orin Developer Kit",
            "Orin",
            "NVIDIA Tegra X1",
            "Xavier",
        ] {
            let why = unavailable_on(product).expect(product);
            assert!(
                why.starts_with(&format!("MPS is not available on {product}: ")),
                "{why}"
            );
        }
        assert!(unavailable_on("NVIDIA H100 80GB HBM3").is_none());
    }

    #[test]
    fn mps_inside_mig_says_what_the_node_needs() {
        let text = "version: v1\nrules:\n  - devices: all\n    mig: {3g.40gb: 2}\n    mps: {replicas: 4}\n";
        let profile = parse_profile("p", text).unwrap();
        let problems = check_daemons("p", &profile);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(!problems[0].is_error());
        assert!(problems[0]
            .message
            .contains("one control daemon per device"));
        assert!(problems[0].message.contains("R470"));
    }

    #[test]
    fn mps_rules_must_agree_on_threads() {
        let text = "version: v1\nrules:\n  - devices: [0]\n    mps: {replicas: 4, activeThreadPercentage: 25}\n  - devices: [1]\n    mps: {replicas: 8, activeThreadPercentage: 50}\n";
        let profile = parse_profile("p", text).unwrap();
        let problems = check_daemons("p", &profile);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].is_error());
        assert!(problems[0].to_string().contains("one MPS control daemon"));
    }
}
