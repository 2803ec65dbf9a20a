//! The node as observed: its GPUs, their MIG mode and the GPU instances on them. NVML produces
//! it on a real node; `plan --gpu` simulates one; `plan --current FILE` reads one.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{ComputeMode, GpuProcess, ObservedComputeInstance, Tegra};
use crate::mig::{catalog, ExistingInstance};

/// Every GPU on one node.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ObservedNode {
    pub gpus: Vec<ObservedGpu>,
}

/// One GPU as NVML reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ObservedGpu {
    /// NVML index.
    pub index: u32,
    /// `nvmlDeviceGetName()`, e.g. `NVIDIA H100 80GB HBM3`.
    pub product: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mib: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_bus_id: Option<String>,
    /// MIG mode; absent when the GPU cannot do MIG.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig: Option<MigMode>,
    /// `nvmlDeviceGetComputeMode`; absent when NVML could not say (or in files written before
    /// gpu-share read it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_mode: Option<ComputeMode>,
    /// GPU instances that exist now.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(with = "Vec<serde_json::Value>")]
    pub instances: Vec<ExistingInstance>,
    /// Compute instances (MIG devices) inside those GPU instances.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub compute_instances: Vec<ObservedComputeInstance>,
    /// Processes with a CUDA context, with their GPU/compute instance under MIG.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub processes: Vec<GpuProcess>,
    /// Set when this is a Jetson/Tegra's integrated GPU, known from the system's files (no
    /// NVML): it can be time-sliced, never partitioned (MIG) or shared through MPS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tegra: Option<Tegra>,
}

/// A MIG device as NVML shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MigDevice<'a> {
    /// Its GPU instance's profile, e.g. `1g.10gb`.
    pub profile: &'a str,
    /// `MIG-…`, what `NVIDIA_VISIBLE_DEVICES` and `CUDA_VISIBLE_DEVICES` name.
    pub uuid: Option<&'a str>,
    pub gi_id: u32,
    pub ci_id: u32,
}

/// MIG mode now and after the next GPU reset (they differ while a change is pending).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MigMode {
    pub current: bool,
    pub pending: bool,
}

impl ObservedGpu {
    /// A fresh GPU of this model: MIG off, no instances; MIG-capable when the catalog knows it.
    pub fn simulated(index: u32, name: &str) -> Self {
        let model = catalog().model(name);
        ObservedGpu {
            index,
            product: model.map_or_else(|| name.to_string(), |m| m.nvml_name.clone()),
            uuid: None,
            memory_mib: model.map(|m| m.total_memory_mib),
            pci_bus_id: None,
            mig: model.map(|_| MigMode::default()),
            compute_mode: None,
            instances: Vec::new(),
            compute_instances: Vec::new(),
            processes: Vec::new(),
            tegra: None,
        }
    }

    /// A Jetson/Tegra's one integrated GPU: index 0 (NVIDIA's device plugin serves it as the
    /// one device `tegra`), named by the board's model, without MIG, memory of its own or
    /// compute mode.
    pub fn tegra(board: &Tegra) -> Self {
        ObservedGpu {
            tegra: Some(board.clone()),
            ..ObservedGpu::simulated(0, &board.product())
        }
    }

    /// The MIG devices (compute instances) with their GPU instance's profile, in GI/CI id
    /// order: the order the device plugins advertise them in.
    pub fn mig_devices(&self) -> Vec<MigDevice<'_>> {
        let mut devices: Vec<MigDevice<'_>> = self
            .compute_instances
            .iter()
            .filter_map(|ci| {
                let gi = self.instances.iter().find(|i| i.gi_id == Some(ci.gi_id))?;
                Some(MigDevice {
                    profile: &gi.profile,
                    uuid: ci.uuid.as_deref(),
                    gi_id: ci.gi_id,
                    ci_id: ci.ci_id,
                })
            })
            .collect();
        devices.sort_by_key(|d| (d.gi_id, d.ci_id));
        devices
    }

    /// `GPU 3 (NVIDIA H100 80GB HBM3)`, for messages.
    pub fn describe(&self) -> String {
        format!("{} ({})", self.index, self.product)
    }
}

/// The most GPUs one simulated node may have (`--gpu h100x16`): the largest NVIDIA boards
/// (HGX-2, DGX-2) hold 16. A count above it is refused rather than read as part of a name.
/// Device indices in profiles have their own, larger bound (src/profile); the two are separate
/// limits on separate inputs.
pub const MAX_SIMULATED_GPUS: u32 = 16;

impl ObservedNode {
    /// Whether NVML lists a GPU or a MIG device (compute instance) with this UUID.
    pub fn lists(&self, uuid: &str) -> bool {
        self.gpus.iter().any(|g| {
            g.uuid.as_deref() == Some(uuid)
                || g.compute_instances
                    .iter()
                    .any(|c| c.uuid.as_deref() == Some(uuid))
        })
    }

    /// A simulated node from `--gpu` specs such as `h100x4`, `H200`, `"NVIDIA GeForce RTX 3090x2"`.
    ///
    /// # Panics
    /// On a spec [`ObservedNode::from_gpu_specs`] refuses: for tests and benches, whose specs
    /// are fixed. The command line uses `from_gpu_specs`.
    pub fn simulated(specs: &[String]) -> Self {
        Self::from_gpu_specs(specs).unwrap_or_else(|e| panic!("{e}"))
    }

    /// A simulated node from `--gpu MODEL[xN]` specs, or why a spec is refused: an empty
    /// model, a count of 0 or above [`MAX_SIMULATED_GPUS`] (in all), or a short name one typo
    /// away from a catalog model (`h10` → `h100`), which would otherwise become a GPU without
    /// MIG. A product name with a space (`NVIDIA A10`) is always taken as it is.
    pub fn from_gpu_specs(specs: &[String]) -> Result<Self, GpuSpecError> {
        let mut gpus = Vec::new();
        for spec in specs {
            let (name, count) = parse_gpu_spec(spec)?;
            if gpus.len() as u64 + u64::from(count) > u64::from(MAX_SIMULATED_GPUS) {
                return Err(GpuSpecError::NodeTooLarge {
                    spec: spec.clone(),
                    total: gpus.len() as u64 + u64::from(count),
                });
            }
            for _ in 0..count {
                gpus.push(ObservedGpu::simulated(gpus.len() as u32, name));
            }
        }
        Ok(ObservedNode { gpus })
    }
}

/// A `--gpu` spec that would mislead: each kind says what to write instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GpuSpecError {
    #[error(
        "--gpu {0:?}: no GPU model; give a catalog model (`h100x8`, see `gpu-share catalog`) or \
         a product name (`\"NVIDIA GeForce RTX 3090x2\"`)"
    )]
    NoModel(String),
    #[error(
        "--gpu {spec:?}: {count} GPUs of {name}; a simulated node holds 1 to \
         {MAX_SIMULATED_GPUS} (MAX_SIMULATED_GPUS)"
    )]
    Count {
        spec: String,
        count: u64,
        name: String,
    },
    /// A short name one typo away from a catalog model (`h10` → `h100`).
    #[error(
        "--gpu {spec:?}: {name:?} is not in the MIG catalog; did you mean {close}? (`gpu-share \
         catalog` lists the models; a GPU without MIG is given by its product name, with its \
         space, e.g. \"NVIDIA A10\")"
    )]
    NearCatalogName {
        spec: String,
        name: String,
        close: String,
    },
    #[error(
        "--gpu {spec:?}: a simulated node holds at most {MAX_SIMULATED_GPUS} GPUs \
         (MAX_SIMULATED_GPUS); this one would have {total}"
    )]
    NodeTooLarge { spec: String, total: u64 },
}

/// One `--gpu` spec: its model name and how many GPUs of it.
fn parse_gpu_spec(spec: &str) -> Result<(&str, u32), GpuSpecError> {
    let (name, count) = split_count(spec);
    if name.is_empty() {
        return Err(GpuSpecError::NoModel(spec.to_string()));
    }
    let count = match count {
        Count::One => 1,
        Count::Given(n) if (1..=u64::from(MAX_SIMULATED_GPUS)).contains(&n) => n as u32,
        Count::Given(n) => {
            return Err(GpuSpecError::Count {
                spec: spec.to_string(),
                count: n,
                name: name.to_string(),
            })
        }
    };
    if let Some(close) = near_catalog_names(name) {
        return Err(GpuSpecError::NearCatalogName {
            spec: spec.to_string(),
            name: name.to_string(),
            close,
        });
    }
    Ok((name, count))
}

/// A `--gpu` count: none written, or the number after the last `x`.
#[derive(Debug, PartialEq, Eq)]
enum Count {
    One,
    Given(u64),
}

/// `MODEL[xN]`: a trailing `x<N>` is a count when N is 1–[`MAX_SIMULATED_GPUS`], or when what
/// precedes it is a catalog model (so `h100x17` is a count that is too large, while `rtx4090`
/// stays a name).
fn split_count(spec: &str) -> (&str, Count) {
    let spec = spec.trim();
    if catalog().model(spec).is_some() {
        return (spec, Count::One);
    }
    let Some((name, digits)) = spec.rsplit_once(['x', 'X']) else {
        return (spec, Count::One);
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return (spec, Count::One);
    }
    let n = digits.parse::<u64>().unwrap_or(u64::MAX);
    let name = name.trim();
    if (1..=u64::from(MAX_SIMULATED_GPUS)).contains(&n) || catalog().model(name).is_some() {
        (name, Count::Given(n))
    } else {
        (spec, Count::One)
    }
}

/// The catalog's short names (keys and aliases) one typo from `name`, as "`h100` or `h20`"; none
/// when `name` is a product name (it has a space) or matches nothing closely. One edit for
/// names of up to 4 characters, two above (transpositions count as one).
fn near_catalog_names(name: &str) -> Option<String> {
    if name.contains(char::is_whitespace) || catalog().model(name).is_some() {
        return None;
    }
    let wanted = name.to_lowercase();
    let allowed = if wanted.chars().count() <= 4 { 1 } else { 2 };
    let mut close: Vec<&str> = catalog()
        .models
        .iter()
        .flat_map(|m| std::iter::once(&m.key).chain(&m.aliases))
        .map(String::as_str)
        .filter(|n| strsim::osa_distance(&n.to_lowercase(), &wanted) <= allowed)
        .collect();
    close.sort_unstable();
    close.dedup_by(|a, b| a.eq_ignore_ascii_case(b));
    match close.as_slice() {
        [] => None,
        [one] => Some(format!("`{one}`")),
        [init @ .., last] => Some(format!(
            "{} or `{last}`",
            init.iter()
                .map(|n| format!("`{n}`"))
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_specs() {
        assert_eq!(parse_gpu_spec("h100x4"), Ok(("h100", 4)));
        assert_eq!(parse_gpu_spec("rtx4090"), Ok(("rtx4090", 1)));
        assert_eq!(
            parse_gpu_spec("NVIDIA GeForce RTX 3090x2"),
            Ok(("NVIDIA GeForce RTX 3090", 2))
        );
        let node = ObservedNode::simulated(&["h100x2".into(), "NVIDIA GeForce RTX 3090".into()]);
        assert_eq!(node.gpus.len(), 3);
        assert_eq!(node.gpus[1].product, "NVIDIA H100 80GB HBM3");
        assert!(node.gpus[1].mig.is_some());
        assert_eq!(node.gpus[2].index, 2);
        assert!(node.gpus[2].mig.is_none());
    }

    /// Each of these used to become a node silently.
    #[test]
    fn gpu_specs_that_would_mislead_are_refused() {
        let refused = |spec: &str| {
            ObservedNode::from_gpu_specs(&[spec.to_string()])
                .unwrap_err()
                .to_string()
        };
        // Became 8 GPUs without MIG named "h10".
        let e = refused("h10x8");
        assert!(
            e.contains("\"h10\" is not in the MIG catalog; did you mean `h100` or `h20`?"),
            "{e}"
        );
        // Became one GPU named "h100x17".
        let e = refused("h100x17");
        assert!(
            e.contains("17 GPUs of h100; a simulated node holds 1 to 16 (MAX_SIMULATED_GPUS)"),
            "{e}"
        );
        assert!(refused("h100x99999999999999999999").contains("a simulated node holds 1 to 16"));
        assert!(refused("h100x0").contains("0 GPUs of h100"));
        // Was a GPU with an empty name.
        assert!(refused("").contains("no GPU model"));
        assert!(refused("  ").contains("no GPU model"));
        assert!(refused("x4").contains("no GPU model"));
        // The limit holds for a node built from several specs.
        let e = ObservedNode::from_gpu_specs(&["h100x8".into(), "a100x8".into(), "h200".into()])
            .unwrap_err();
        assert!(matches!(e, GpuSpecError::NodeTooLarge { total: 17, .. }));
        let e = e.to_string();
        assert!(
            e.contains("at most 16 GPUs (MAX_SIMULATED_GPUS); this one would have 17"),
            "{e}"
        );
    }

    #[test]
    fn names_far_from_the_catalog_and_product_names_stay_gpus_without_mig() {
        let node = ObservedNode::from_gpu_specs(&[
            "rtx4090".into(),
            "NVIDIA A10x2".into(),
            "Tesla T4".into(),
            "h100x12".into(),
        ])
        .unwrap();
        let products: Vec<&str> = node.gpus.iter().map(|g| g.product.as_str()).collect();
        assert_eq!(
            products[..4],
            ["rtx4090", "NVIDIA A10", "NVIDIA A10", "Tesla T4"]
        );
        assert!(node.gpus[..4].iter().all(|g| g.mig.is_none()));
        // 4 + 12: exactly the limit.
        assert_eq!(node.gpus.len(), 16);
        assert!(node.gpus[4..].iter().all(|g| g.mig.is_some()));
    }
}
