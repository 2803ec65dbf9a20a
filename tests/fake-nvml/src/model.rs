//! What the fake derives from the shared MIG catalog: engine counts per model variant (the
//! catalog's [`Engines`] with each variant's SM counts, read from the same embedded YAML),
//! placement order, GI ids, names and UUIDs.

use std::collections::BTreeMap;
use std::sync::LazyLock;

pub use gpu_share::mig::catalog::Engines;
use gpu_share::mig::catalog::{
    ComputeInstanceProfile, GpuInstanceProfile, GpuModel, Placement, CATALOG_YAML,
};
use serde::Deserialize;

#[derive(Deserialize)]
struct ExtrasFile {
    models: Vec<ExtrasModel>,
}

#[derive(Deserialize)]
struct ExtrasModel {
    key: String,
    gpu_instance_profiles: Vec<ExtrasProfile>,
    #[serde(default)]
    ci_sm: BTreeMap<String, u32>,
    #[serde(default)]
    variants: BTreeMap<String, ExtrasVariant>,
}

#[derive(Deserialize)]
struct ExtrasProfile {
    name: String,
    #[serde(flatten)]
    engines: Engines,
}

#[derive(Deserialize)]
struct ExtrasVariant {
    #[serde(default)]
    sm_count_by_profile: BTreeMap<String, u32>,
}

/// Per model key: engine counts per GI profile name, and SMs per CI size (`per_1c`, …).
struct ModelExtras {
    engines: BTreeMap<String, Engines>,
    ci_sm: BTreeMap<String, u32>,
}

static EXTRAS: LazyLock<BTreeMap<String, ModelExtras>> = LazyLock::new(|| {
    let file: ExtrasFile = serde_yaml::from_str(CATALOG_YAML).expect("embedded catalog parses");
    let mut out = BTreeMap::new();
    for m in file.models {
        let engines: BTreeMap<_, _> = m
            .gpu_instance_profiles
            .iter()
            .map(|p| (p.name.clone(), p.engines))
            .collect();
        for (key, v) in &m.variants {
            let mut e = engines.clone();
            for (name, sm) in &v.sm_count_by_profile {
                e.entry(name.clone()).or_default().sm_count = Some(*sm);
            }
            let ci_sm = m.ci_sm.clone();
            out.insert(key.clone(), ModelExtras { engines: e, ci_sm });
        }
        out.insert(
            m.key,
            ModelExtras {
                engines,
                ci_sm: m.ci_sm,
            },
        );
    }
    out
});

/// Engine counts of a GI profile (zeros where the catalog does not know them).
pub fn gi_engines(model: &GpuModel, gi: &GpuInstanceProfile) -> Engines {
    EXTRAS
        .get(&model.key)
        .and_then(|x| x.engines.get(&gi.name))
        .copied()
        .unwrap_or_default()
}

/// SMs of a CI: the whole GI's for a full-size CI, else the model's `per_<n>c` figure, else a
/// proportional share.
pub fn ci_sm_count(model: &GpuModel, gi: &GpuInstanceProfile, ci: &ComputeInstanceProfile) -> u32 {
    let gi_sm = gi_engines(model, gi).sm_count.unwrap_or(0);
    if ci.slice_count >= gi.slice_count {
        return gi_sm;
    }
    EXTRAS
        .get(&model.key)
        .and_then(|x| x.ci_sm.get(&format!("per_{}c", ci.slice_count)))
        .copied()
        .unwrap_or(gi_sm * ci.slice_count / gi.slice_count.max(1))
}

/// `info.memorySizeMB`: the catalog's value, or for the few unverified rows the GI's share of the
/// framebuffer rounded down to 64 MiB (every observed value is a multiple of 64, mig-nvml.md 1.5).
pub fn gi_memory_mib(model: &GpuModel, gi: &GpuInstanceProfile) -> u64 {
    gi.memory_mib.unwrap_or_else(|| {
        let share = model.total_memory_mib * u64::from(gi.slots()) / u64::from(model.memory_slots);
        share / 64 * 64
    })
}

/// Whether the model is Ampere (A100/A30): there MIG mode changes need a GPU reset.
pub fn is_ampere(model: &GpuModel) -> bool {
    model.key.starts_with("a100") || model.key.starts_with("a30")
}

/// The order the driver tries placements in when `nvmlDeviceCreateGpuInstance` gets none.
///
/// 8-slot parts: observed on A100/H100/GH200 (mig-nvml.md 1.3): 1-slot 6,4,5,0,1,2,3; 2-slot
/// 4,0,2 (6 last, inferred); 4-slot 4,0; 8-slot 0. Other grids (A30, RTX PRO 6000): ascending,
/// as the RTX sequences show. Placements missing from a list are tried last, in catalog order.
pub fn default_placement_order(model: &GpuModel, gi: &GpuInstanceProfile) -> Vec<Placement> {
    let pref: &[u32] = match (model.memory_slots, gi.slots()) {
        (8, 1) => &[6, 4, 5, 0, 1, 2, 3],
        (8, 2) => &[4, 0, 2, 6],
        (8, 4) => &[4, 0],
        _ => &[],
    };
    let mut order: Vec<Placement> = pref
        .iter()
        .filter_map(|s| gi.placements.iter().find(|p| p.start == *s).copied())
        .collect();
    for p in &gi.placements {
        if !order.contains(p) {
            order.push(*p);
        }
    }
    order
}

/// The GI id ("swizzId") the driver usually gives a placement: a binary-tree index over the grid
/// in units of the smallest placement: 0 = whole GPU, 1-2 halves, 3-6 quarters, 7-14 eighths
/// (mig-nvml.md 1.4; real drivers sometimes deviate, which is why agents must read placements).
pub fn gi_id_for(model: &GpuModel, placement: Placement) -> u32 {
    let unit = model
        .gpu_instance_profiles
        .iter()
        .map(GpuInstanceProfile::slots)
        .filter(|s| *s > 0)
        .min()
        .unwrap_or(1);
    let nodes = model.memory_slots / unit;
    let size = (placement.size / unit).max(1);
    nodes / size - 1 + placement.start / unit / size
}

/// The profile name without its media/graphics attribute (`1g.10gb+me` → `1g.10gb`).
fn base_name(gi_name: &str) -> &str {
    let end = gi_name.find('+').unwrap_or(gi_name.len());
    gi_name[..end].trim_end_matches("-me")
}

/// `nvmlComputeInstanceProfileInfo_v2_t.name` without the `MIG ` prefix: `<c>c.<gi>` for a CI
/// smaller than its GI, else the GI's name without attributes (as `nvidia-smi mig -lcip` prints).
pub fn ci_profile_name(gi: &GpuInstanceProfile, ci: &ComputeInstanceProfile) -> String {
    if ci.slice_count < gi.slice_count {
        format!("{}c.{}", ci.slice_count, base_name(&gi.name))
    } else {
        base_name(&gi.name).to_string()
    }
}

/// The profile part of a MIG device's name: the GI profile name (with `+me`) for a full-size CI,
/// the CI profile name otherwise ("NVIDIA A100-SXM4-40GB MIG 1c.3g.20gb").
pub fn mig_device_profile_name(gi: &GpuInstanceProfile, ci: &ComputeInstanceProfile) -> String {
    if ci.slice_count < gi.slice_count {
        ci_profile_name(gi, ci)
    } else {
        gi.name.clone()
    }
}

fn fnv1a(bytes: &[u8], seed: u64) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325 ^ seed, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A deterministic UUID in NVML's format: `<prefix>xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
pub fn uuid_from(prefix: &str, seed: &str) -> String {
    let hex = format!(
        "{:016x}{:016x}",
        fnv1a(seed.as_bytes(), 1),
        fnv1a(seed.as_bytes(), 2)
    );
    format!(
        "{prefix}{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu_share::mig::catalog::catalog;

    fn pl(start: u32, size: u32) -> Placement {
        Placement { start, size }
    }

    #[test]
    fn gi_ids_follow_the_observed_tree() {
        let h100 = catalog().model("h100").unwrap();
        let ids: Vec<u32> = [6, 4, 5, 0]
            .iter()
            .map(|s| gi_id_for(h100, pl(*s, 1)))
            .collect();
        assert_eq!(ids, [13, 11, 12, 7]);
        assert_eq!(gi_id_for(h100, pl(0, 8)), 0);
        assert_eq!(gi_id_for(h100, pl(4, 2)), 5);
        let a30 = catalog().model("a30").unwrap();
        assert_eq!(gi_id_for(a30, pl(1, 1)), 4);
        assert_eq!(gi_id_for(a30, pl(2, 2)), 2);
        let rtx = catalog().model("rtx-pro-6000").unwrap();
        assert_eq!(gi_id_for(rtx, pl(9, 3)), 6);
        assert_eq!(gi_id_for(rtx, pl(0, 6)), 1);
    }

    #[test]
    fn engines_and_names_come_from_the_catalog() {
        let h100 = catalog().model("h100").unwrap();
        let gi = h100.profile("3g.40gb").unwrap();
        assert_eq!(gi_engines(h100, gi).sm_count, Some(60));
        let ci = &catalog().ci_profiles(gi)[0];
        assert_eq!(ci_profile_name(gi, ci), "1c.3g.40gb");
        assert_eq!(ci_sm_count(h100, gi, ci), 16);
        let pcie = catalog().model("NVIDIA H100 PCIe").unwrap();
        assert_eq!(gi_engines(pcie, gi).sm_count, Some(46));
        assert_eq!(base_name("1g.24gb+me.all"), "1g.24gb");
        assert_eq!(base_name("2g.48gb-me"), "2g.48gb");
    }

    #[test]
    fn uuids_have_nvml_shape() {
        let u = uuid_from("MIG-", "x");
        assert_eq!(u.len(), 4 + 36);
        assert_eq!(u, uuid_from("MIG-", "x"));
        assert_ne!(u, uuid_from("MIG-", "y"));
    }
}
