//! Facts about the board a GPU sits on that NVIDIA's device plugin asks for besides MIG:
//! the device minor number, the CUDA compute capability, and the PCIe topology between GPUs
//! (docs/sources.md#device-plugin-nvml lists the calls and why it needs each).

use crate::state::Gpu;

/// `nvmlGpuTopologyLevel_t` values (nvml.h).
pub mod level {
    /// Same board (a GPU with itself).
    pub const INTERNAL: u32 = 0;
    /// Connected through one PCIe switch.
    pub const SINGLE: u32 = 10;
    /// Connected through the same CPU (NUMA node).
    pub const NODE: u32 = 40;
    /// Connected across CPUs (SMP interconnect).
    pub const SYSTEM: u32 = 50;
}

/// CUDA compute capability by product name, from NVIDIA's "CUDA GPUs" table
/// (developer.nvidia.com/cuda-gpus): the first entry whose text the name contains wins, so
/// longer names come first; case is ignored. Used when the state file gives no `compute_capability`.
const CAPABILITIES: &[(&str, [u32; 2])] = &[
    ("RTX PRO 6000 Blackwell", [12, 0]),
    ("GB200", [10, 0]),
    ("B200", [10, 0]),
    ("GH200", [9, 0]),
    ("H200", [9, 0]),
    ("H100", [9, 0]),
    ("H20", [9, 0]),
    ("L40", [8, 9]),
    ("L4", [8, 9]),
    ("RTX 40", [8, 9]),
    ("A100", [8, 0]),
    ("A30", [8, 0]),
    ("A10", [8, 6]),
    ("RTX 30", [8, 6]),
    ("Orin", [8, 7]),
    ("T4", [7, 5]),
    ("RTX 20", [7, 5]),
    ("V100", [7, 0]),
];

/// The compute capability a GPU reports: the state file's, else by product name; `None` for a
/// name the table lacks (the call then answers NOT_SUPPORTED, so a test notices).
pub fn compute_capability(gpu: &Gpu) -> Option<[u32; 2]> {
    let name = gpu.product_name().to_uppercase();
    let by_name = CAPABILITIES
        .iter()
        .find(|(n, _)| name.contains(&n.to_uppercase()));
    gpu.compute_capability.or(by_name.map(|(_, cc)| *cc))
}

/// How GPUs `a` and `b` (indices) are connected, on the layout of an 8-GPU HGX server: two GPUs
/// per PCIe switch, four per CPU. NVLink is not simulated (see README, Known gaps).
pub fn common_ancestor(a: usize, b: usize) -> u32 {
    if a == b {
        level::INTERNAL
    } else if a / 2 == b / 2 {
        level::SINGLE
    } else if a / 4 == b / 4 {
        level::NODE
    } else {
        level::SYSTEM
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capabilities_follow_the_product_name_unless_the_state_says_otherwise() {
        assert_eq!(compute_capability(&Gpu::mig("h100")), Some([9, 0]));
        assert_eq!(compute_capability(&Gpu::mig("a30")), Some([8, 0]));
        assert_eq!(compute_capability(&Gpu::mig("b200")), Some([10, 0]));
        let rtx = Gpu::non_mig("NVIDIA GeForce RTX 3090", 24576);
        assert_eq!(compute_capability(&rtx), Some([8, 6]));
        let odd = Gpu {
            compute_capability: Some([7, 2]),
            ..Gpu::non_mig("Xavier", 8000)
        };
        assert_eq!(compute_capability(&odd), Some([7, 2]));
        assert_eq!(compute_capability(&Gpu::non_mig("Mystery", 1)), None);
    }

    #[test]
    fn topology_levels_widen_with_distance() {
        assert_eq!(common_ancestor(3, 3), level::INTERNAL);
        assert_eq!(common_ancestor(0, 1), level::SINGLE);
        assert_eq!(common_ancestor(1, 2), level::NODE);
        assert_eq!(common_ancestor(3, 4), level::SYSTEM);
    }
}
