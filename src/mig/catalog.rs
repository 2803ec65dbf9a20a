//! The MIG placement catalog: every MIG-capable GPU model as NVML names it, with its GPU-instance
//! profiles, their NVML profile ids and the placements the driver accepts.
//!
//! The numbers live in one embedded data file, `data/mig-catalog.yaml`, so that the planner and
//! the fake `libnvidia-ml.so` used in tests read the very same facts. Each model there carries a
//! `basis:` line that says what its numbers rest on (real `nvidia-smi mig -lgip/-lgipp` output,
//! NVIDIA's MIG user guide), `sources:` that a reader can open to check them (see
//! [`is_public_reference`]), and `verified:` that says whether the placements were quoted
//! verbatim or inferred from the same chip family.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use serde::{Deserialize, Serialize};

/// The embedded catalog text (also read by the fake NVML library in `tests/fake-nvml`).
pub const CATALOG_YAML: &str = include_str!("../../data/mig-catalog.yaml");

static CATALOG: LazyLock<Catalog> = LazyLock::new(|| {
    Catalog::parse(CATALOG_YAML).unwrap_or_else(|e| panic!("embedded data/mig-catalog.yaml: {e}"))
});

/// The catalog compiled into this binary.
pub fn catalog() -> &'static Catalog {
    &CATALOG
}

/// A GPU-instance placement in memory-slot units, as `nvmlGpuInstancePlacement_t` has it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(from = "PlacementRepr")]
pub struct Placement {
    pub start: u32,
    pub size: u32,
}

/// Placements are read as `[start, size]` (the catalog, hand-written states) or as
/// `{start, size}` (what we print), so printed states can be read back.
#[derive(Deserialize)]
#[serde(untagged)]
enum PlacementRepr {
    Pair([u32; 2]),
    Fields { start: u32, size: u32 },
}

impl From<PlacementRepr> for Placement {
    fn from(repr: PlacementRepr) -> Self {
        match repr {
            PlacementRepr::Pair([start, size]) | PlacementRepr::Fields { start, size } => {
                Placement { start, size }
            }
        }
    }
}

impl Placement {
    /// The memory slots this placement occupies, one bit per slot.
    pub fn mask(self) -> u32 {
        ((1u32 << self.size) - 1) << self.start
    }

    /// The last slot it occupies.
    pub fn end(self) -> u32 {
        self.start + self.size - 1
    }
}

impl std::fmt::Display for Placement {
    /// `start:size`, the notation of `nvidia-smi mig -lgi`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.start, self.size)
    }
}

/// A compute-instance profile available inside a GPU instance.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ComputeInstanceProfile {
    /// The `profile` argument of `nvmlGpuInstanceGetComputeInstanceProfileInfo`.
    pub ci_profile_index: u32,
    /// `info.id`, passed to the create calls.
    pub profile_id: u32,
    pub slice_count: u32,
    pub instance_count: u32,
    /// `nvidia-smi` marks the default CI profile of a GI with `*`; we create that one.
    #[serde(default)]
    pub default: bool,
    pub placements: Vec<Placement>,
    /// True when real `nvidia-smi mig -lcip` output (or an NVIDIA document) shows this profile,
    /// with this instance count, inside GIs of this shape; false when it is inferred.
    #[serde(default)]
    pub verified: bool,
}

/// One GPU-instance profile of one model (a row of `nvidia-smi mig -lgip`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GpuInstanceProfile {
    /// Short name, e.g. `1g.10gb`, `1g.10gb+me`.
    pub name: String,
    /// `NVML_GPU_INSTANCE_PROFILE_*`: only for `nvmlDeviceGetGpuInstanceProfileInfo`.
    pub nvml_profile_index: u32,
    /// `info.id`: what the create/placement calls take and what instances report.
    pub profile_id: u32,
    pub slice_count: u32,
    /// Most instances of this profile that can exist at once.
    pub instance_count: u32,
    /// `info.memorySizeMB`; unknown for a few unverified models.
    pub memory_mib: Option<u64>,
    /// What `memory_mib` rests on: read through NVML on a real GPU, or derived.
    #[serde(default)]
    pub memory_from: MemorySource,
    pub placements: Vec<Placement>,
    /// `info.multiprocessorCount` and the engine counts of `nvidia-smi mig -lgip`.
    #[serde(flatten)]
    pub engines: Engines,
    pub ci_profile_set: String,
    #[serde(default)]
    pub verified: bool,
    #[serde(default)]
    pub placements_verified: bool,
}

/// What `nvmlGpuInstanceProfileInfo_t` reports beside the geometry (unknown for a few
/// unverified models). Dynamic MIG publishes them as device capacities, and the OFA as a
/// counter (a GPU has one); the fake NVML reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Engines {
    #[serde(default)]
    pub sm_count: Option<u32>,
    #[serde(default)]
    pub copy_engines: Option<u32>,
    #[serde(default)]
    pub decoders: Option<u32>,
    #[serde(default)]
    pub encoders: Option<u32>,
    #[serde(default)]
    pub jpeg: Option<u32>,
    #[serde(default)]
    pub ofa: Option<u32>,
}

/// Where a profile's `memory_mib` comes from. Only [`MemorySource::Nvml`] is exact: the other
/// figures were derived, and a real H200 (NVML 580.159.04) reported 256 MiB more than the figure
/// derived from an older driver's `nvidia-smi mig -lgip` on five of its seven profiles
/// (docs/measured/h200-nvml.md).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MemorySource {
    /// `memorySizeMB` of `nvmlDeviceGetGpuInstanceProfileInfo`, read on a real GPU.
    Nvml,
    /// Derived from the two-decimal GiB `nvidia-smi mig -lgip` prints (round(GiB × 16) × 64
    /// MiB); drivers have printed different figures for the same profile.
    #[default]
    NvidiaSmi,
    /// A third party's measurement, not NVIDIA's output.
    ThirdParty,
}

impl GpuInstanceProfile {
    /// Memory slots one instance occupies (all placements of a profile have the same size).
    pub fn slots(&self) -> u32 {
        self.placements.first().map_or(0, |p| p.size)
    }

    /// The extended resource the device plugin advertises for this profile under the `mixed`
    /// strategy: `nvidia.com/mig-<name>` with `+` replaced by `.` (k8s-device-plugin v0.20).
    pub fn resource_name(&self) -> String {
        resource_name(&self.name)
    }

    /// `+me.all` profiles take every media engine: nvml.h says such an instance "prevents
    /// allocation of all but _NO_ME profiles".
    pub fn takes_all_media_engines(&self) -> bool {
        self.name.ends_with("+me.all")
    }

    /// `-me` profiles have no media engines and may sit beside a `+me.all` instance.
    pub fn has_no_media_engines(&self) -> bool {
        self.name.ends_with("-me")
    }
}

/// A MIG-capable GPU model.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GpuModel {
    /// Short stable id, e.g. `h100-80gb-sxm`.
    pub key: String,
    /// What `nvmlDeviceGetName()` returns, e.g. `NVIDIA H100 80GB HBM3`.
    pub nvml_name: String,
    /// Other names accepted on the command line (`--gpu h100`).
    #[serde(default)]
    pub aliases: Vec<String>,
    /// Other product names (SKUs) with the same MIG geometry.
    #[serde(default)]
    pub also_named: Vec<String>,
    /// Oldest driver that supports MIG on this model.
    #[serde(default)]
    pub min_driver: Option<String>,
    pub pci_device_id: u32,
    pub total_memory_mib: u64,
    pub memory_slots: u32,
    pub compute_slices: u32,
    pub max_mig_devices: u32,
    /// What the numbers rest on, in words (which outputs or documents; no references).
    pub basis: String,
    /// Public documents a reader can open to check the numbers: `https://` URLs or
    /// `owner/repo@tag:path` repository files (see [`is_public_reference`]).
    #[serde(default)]
    pub sources: Vec<String>,
    /// True when the placements were seen verbatim in real output or NVIDIA documentation.
    #[serde(default)]
    pub verified: bool,
    pub gpu_instance_profiles: Vec<GpuInstanceProfile>,
}

impl GpuModel {
    /// The GPU-instance profile with this name (`1g.10gb`), if the model has it.
    pub fn profile(&self, name: &str) -> Option<&GpuInstanceProfile> {
        self.gpu_instance_profiles.iter().find(|p| p.name == name)
    }

    /// The GPU-instance profile with this NVML profile id, as instances report it.
    pub fn profile_by_id(&self, profile_id: u32) -> Option<&GpuInstanceProfile> {
        self.gpu_instance_profiles
            .iter()
            .find(|p| p.profile_id == profile_id)
    }

    /// Profile names, in catalog order, for error messages.
    pub fn profile_names(&self) -> Vec<&str> {
        self.gpu_instance_profiles
            .iter()
            .map(|p| p.name.as_str())
            .collect()
    }

    /// Whether `name` (a product name or a CLI alias) designates this model, ignoring case and
    /// the `NVIDIA ` prefix that R470+ drivers add.
    pub fn answers_to(&self, name: &str) -> bool {
        std::iter::once(&self.key)
            .chain(std::iter::once(&self.nvml_name))
            .chain(&self.aliases)
            .chain(&self.also_named)
            .any(|n| same_name(n, name))
    }

    /// Whether a product name NVML reports is this model (`answers_to` minus the CLI aliases).
    pub fn has_product_name(&self, product: &str) -> bool {
        self.product_names().any(|n| same_name(n, product))
    }

    /// Every product name of this model, the main one first.
    pub fn product_names(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.nvml_name.as_str()).chain(self.also_named.iter().map(String::as_str))
    }
}

/// Names compare without case and without the `NVIDIA ` prefix (allocation-free: the planner
/// looks models up for every GPU of every node).
fn same_name(a: &str, b: &str) -> bool {
    fn strip(n: &str) -> &str {
        let n = n.trim();
        match n.get(..7) {
            Some(p) if p.eq_ignore_ascii_case("nvidia ") => &n[7..],
            _ => n,
        }
    }
    strip(a).eq_ignore_ascii_case(strip(b))
}

/// The `mixed`-strategy resource of a MIG profile: `nvidia.com/mig-<name>`, `+` replaced by
/// `.` (k8s-device-plugin v0.20, nvidia-stack.md §1.3).
pub fn resource_name(profile: &str) -> String {
    format!("nvidia.com/mig-{}", profile.replace('+', "."))
}

/// Measurements made for this project on real GPUs live in this repository, under this folder
/// (a test checks every such source exists).
pub const MEASURED_DOCS: &str = "docs/measured/";

/// Whether a catalog source is a public document a reader can open: an `https://` URL with a
/// host, a repository file pinned to a tag or commit, `owner/repo@tag:path` (GitHub), or a
/// measurement in this repository, `docs/measured/<file>.md`.
/// Search-index ids and other private handles are none of these, and the catalog refuses them.
pub fn is_public_reference(source: &str) -> bool {
    if source.chars().any(char::is_whitespace) {
        return false;
    }
    if let Some(path) = source.strip_prefix(MEASURED_DOCS) {
        return path.ends_with(".md") && !path.contains("..") && !path.contains('/');
    }
    if let Some(rest) = source.strip_prefix("https://") {
        let host = rest.split('/').next().unwrap_or("");
        return host.contains('.') && !host.starts_with('.') && !host.ends_with('.');
    }
    let Some((repo, pinned)) = source.split_once('@') else {
        return false;
    };
    let Some((tag, path)) = pinned.split_once(':') else {
        return false;
    };
    let mut parts = repo.split('/');
    let (owner, name) = (parts.next(), parts.next());
    let plain = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    parts.next().is_none()
        && owner.is_some_and(plain)
        && name.is_some_and(plain)
        && plain(tag)
        && !path.is_empty()
        && !path.starts_with('/')
}

/// Every MIG-capable model we know and the compute-instance profile sets they share.
#[derive(Debug, Clone)]
pub struct Catalog {
    pub models: Vec<GpuModel>,
    pub ci_profile_sets: BTreeMap<String, Vec<ComputeInstanceProfile>>,
}

/// The file's shape; only the fields we use are read, the rest is documentation.
#[derive(Deserialize)]
struct CatalogFile {
    ci_profile_sets: BTreeMap<String, Vec<ComputeInstanceProfile>>,
    models: Vec<ModelEntry>,
}

#[derive(Deserialize)]
struct ModelEntry {
    #[serde(flatten)]
    model: GpuModel,
    /// SKUs that share the parent's profile table but differ in name/PCI id/memory.
    #[serde(default)]
    variants: BTreeMap<String, VariantEntry>,
}

#[derive(Deserialize)]
struct VariantEntry {
    nvml_name: String,
    pci_device_id: u32,
    total_memory_mib: u64,
    basis: String,
    #[serde(default)]
    sources: Vec<String>,
    #[serde(default)]
    placements_verified: bool,
}

/// A catalog file that is not one, or breaks an invariant the solver relies on.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error(transparent)]
    Yaml(#[from] serde_yaml::Error),
    #[error("{model}: source {source_text:?} is neither an https:// URL nor owner/repo@tag:path")]
    Source { model: String, source_text: String },
    #[error("{0}: more than 16 memory slots")]
    MemorySlots(String),
    #[error("{model} {profile}: bad placement {placement}")]
    Placement {
        model: String,
        profile: String,
        placement: Placement,
    },
    #[error("{model} {profile}: unknown ci_profile_set")]
    CiProfileSet { model: String, profile: String },
}

impl Catalog {
    /// Parse a catalog file and check that it is internally consistent.
    pub fn parse(text: &str) -> Result<Catalog, CatalogError> {
        let file: CatalogFile = serde_yaml::from_str(text)?;
        let mut models = Vec::new();
        for entry in file.models {
            for (key, v) in &entry.variants {
                let mut variant = entry.model.clone();
                variant.key = key.clone();
                variant.nvml_name = v.nvml_name.clone();
                variant.aliases = vec![];
                variant.also_named = vec![];
                variant.pci_device_id = v.pci_device_id;
                variant.total_memory_mib = v.total_memory_mib;
                variant.basis = v.basis.clone();
                variant.sources = v.sources.clone();
                variant.verified = v.placements_verified;
                for p in &mut variant.gpu_instance_profiles {
                    p.placements_verified &= v.placements_verified;
                }
                models.push(variant);
            }
            models.push(entry.model);
        }
        models.sort_by(|a, b| a.key.cmp(&b.key));
        let catalog = Catalog {
            models,
            ci_profile_sets: file.ci_profile_sets,
        };
        catalog.check()?;
        Ok(catalog)
    }

    /// Invariants the solver relies on: placements inside the grid, one size per profile,
    /// known CI profile sets.
    fn check(&self) -> Result<(), CatalogError> {
        for m in &self.models {
            if let Some(bad) = m.sources.iter().find(|s| !is_public_reference(s)) {
                return Err(CatalogError::Source {
                    model: m.key.clone(),
                    source_text: bad.clone(),
                });
            }
            if m.memory_slots > 16 {
                return Err(CatalogError::MemorySlots(m.key.clone()));
            }
            for p in &m.gpu_instance_profiles {
                let size = p.slots();
                for pl in &p.placements {
                    if pl.size != size || pl.size == 0 || pl.start + pl.size > m.memory_slots {
                        return Err(CatalogError::Placement {
                            model: m.key.clone(),
                            profile: p.name.clone(),
                            placement: *pl,
                        });
                    }
                }
                if !self.ci_profile_sets.contains_key(&p.ci_profile_set) {
                    return Err(CatalogError::CiProfileSet {
                        model: m.key.clone(),
                        profile: p.name.clone(),
                    });
                }
            }
        }
        Ok(())
    }

    /// The model a name designates (catalog key, alias, or NVML product name).
    pub fn model(&self, name: &str) -> Option<&GpuModel> {
        self.models.iter().find(|m| m.answers_to(name))
    }

    /// The model whose NVML product name is `product` (aliases don't count).
    pub fn model_by_product(&self, product: &str) -> Option<&GpuModel> {
        self.models.iter().find(|m| m.has_product_name(product))
    }

    /// The compute-instance profiles available inside a GI of this profile.
    pub fn ci_profiles(&self, gi: &GpuInstanceProfile) -> &[ComputeInstanceProfile] {
        self.ci_profile_sets
            .get(&gi.ci_profile_set)
            .map_or(&[], Vec::as_slice)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_catalog_parses_and_has_the_models_the_issue_names() {
        for name in [
            "NVIDIA A100-SXM4-40GB",
            "NVIDIA A100-SXM4-80GB",
            "NVIDIA A30",
            "NVIDIA H100 80GB HBM3",
            "NVIDIA H100 NVL",
            "NVIDIA H200",
            "NVIDIA B200",
            "NVIDIA H100 PCIe",
        ] {
            assert!(catalog().model_by_product(name).is_some(), "{name}");
        }
    }

    #[test]
    fn names_ignore_case_and_the_nvidia_prefix() {
        let c = catalog();
        assert_eq!(c.model("h100").unwrap().key, "h100-80gb-sxm");
        assert_eq!(c.model("H100 80GB HBM3").unwrap().key, "h100-80gb-sxm");
        assert_eq!(c.model("A100-SXM4-40GB").unwrap().key, "a100-sxm4-40gb");
        assert!(
            c.model_by_product("h100").is_none(),
            "aliases are not product names"
        );
    }

    #[test]
    fn resource_names_follow_the_device_plugin() {
        let h100 = catalog().model("h100").unwrap();
        let me = h100.profile("1g.10gb+me").unwrap();
        assert_eq!(me.resource_name(), "nvidia.com/mig-1g.10gb.me");
    }

    #[test]
    fn public_references_are_urls_or_pinned_repository_files() {
        for ok in [
            "https://docs.nvidia.com/datacenter/tesla/mig-user-guide/index.html",
            "https://github.com/NVIDIA/mig-parted/issues/120",
            "NVIDIA/mig-parted@v0.12.1:deployments/systemd/config-default.yaml",
        ] {
            assert!(is_public_reference(ok), "{ok}");
        }
        for bad in [
            "find_string id 37196432096",
            "real nvidia-smi -lgip (find_string id 34587168427)",
            "37196432096",
            "http://example.com/x",
            "https://localhost/x",
            "NVIDIA/mig-parted:deployments/systemd/config-default.yaml",
            "NVIDIA/mig-parted@v0.12.1",
            "mig-parted@v1:x",
            "",
        ] {
            assert!(!is_public_reference(bad), "{bad}");
        }
    }

    #[test]
    fn every_model_cites_public_sources_and_no_search_ids() {
        for m in &catalog().models {
            assert!(!m.sources.is_empty(), "{}: no sources", m.key);
            for s in &m.sources {
                assert!(is_public_reference(s), "{}: {s}", m.key);
            }
        }
        // Ids of the research search index mean nothing to a reader, wherever they hide
        // (sources, notes, comments).
        for (n, line) in CATALOG_YAML.lines().enumerate() {
            let lower = line.to_lowercase();
            for private in ["find_string", "search id", "read_file", "(ids "] {
                assert!(!lower.contains(private), "line {}: {line}", n + 1);
            }
        }
    }

    #[test]
    fn every_measurement_cited_is_in_the_repository() {
        let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let measured = catalog().models.iter().flat_map(|m| &m.sources);
        for source in measured.filter(|s| s.starts_with(MEASURED_DOCS)) {
            assert!(
                repo.join(source).is_file(),
                "{source} is not in the repository"
            );
        }
        for bad in [
            "docs/measured/../README.md",
            "docs/measured/a/b.md",
            "docs/h200.md",
        ] {
            assert!(!is_public_reference(bad), "{bad}");
        }
    }

    /// The real H200 (NVML 580.159.04, MIG off; docs/measured/h200-nvml.md): memorySizeMB by
    /// profile, every profile read through NVML, placements seen verbatim.
    #[test]
    fn the_h200_is_the_one_measured_through_nvml() {
        let h200 = catalog().model("NVIDIA H200").unwrap();
        let measured = [
            ("1g.18gb", 16384),
            ("1g.18gb+me", 16384),
            ("1g.35gb", 33280),
            ("2g.35gb", 33280),
            ("3g.71gb", 71424),
            ("4g.71gb", 71424),
            ("7g.141gb", 143360),
        ];
        assert_eq!(h200.gpu_instance_profiles.len(), measured.len());
        for (name, mib) in measured {
            let p = h200.profile(name).unwrap();
            assert_eq!(p.memory_mib, Some(mib), "{name}");
            assert_eq!(p.memory_from, MemorySource::Nvml, "{name}");
            assert!(p.verified && p.placements_verified, "{name}");
        }
        assert!(h200.verified);
        assert!(h200
            .sources
            .iter()
            .any(|s| s == "docs/measured/h200-nvml.md"));
    }

    #[test]
    fn a_source_that_no_reader_can_open_is_refused() {
        let text = CATALOG_YAML.replacen(
            "    sources:\n",
            "    sources:\n      - \"find_string id 37196432096\"\n",
            1,
        );
        let err = Catalog::parse(&text).unwrap_err();
        assert!(matches!(err, CatalogError::Source { .. }), "{err:?}");
        assert!(
            err.to_string().contains("find_string id 37196432096"),
            "{err}"
        );
    }

    #[test]
    fn one_slice_rev2_gis_accept_the_plain_one_slice_compute_instance() {
        // NVIDIA's default mig-parted configs create 1g.20gb devices with CI profile 1_SLICE (0);
        // nvidia-smi's default CI there is 1_SLICE_REV1 (7). Both must be offered.
        let c = catalog();
        let h100 = c.model("h100").unwrap();
        let cis = c.ci_profiles(h100.profile("1g.20gb").unwrap());
        let by_index = |i: u32| cis.iter().find(|ci| ci.ci_profile_index == i);
        assert!(by_index(0).is_some_and(|ci| ci.slice_count == 1 && !ci.default));
        assert!(by_index(7).is_some_and(|ci| ci.slice_count == 1 && ci.default));
    }

    #[test]
    fn placement_masks() {
        assert_eq!(Placement { start: 4, size: 4 }.mask(), 0b1111_0000);
        assert_eq!(Placement { start: 6, size: 2 }.mask(), 0b1100_0000);
    }

    #[test]
    fn every_profile_has_a_default_compute_instance_profile() {
        let c = catalog();
        for m in &c.models {
            for p in &m.gpu_instance_profiles {
                let cis = c.ci_profiles(p);
                assert_eq!(
                    cis.iter().filter(|ci| ci.default).count(),
                    1,
                    "{} {}",
                    m.key,
                    p.name
                );
            }
        }
    }

    /// The compute instance made with a GPU instance (statically or at a dynamic Prepare) is
    /// the whole GI: its default CI profile spans every compute slice. NVIDIA's DRA driver
    /// made a 7g.80gb on an A100 with a smaller CI (dra-driver-nvidia-gpu #1480), leaving
    /// multiprocessors of the claim unusable.
    #[test]
    fn every_default_compute_instance_spans_its_gpu_instance() {
        let c = catalog();
        for m in &c.models {
            for p in &m.gpu_instance_profiles {
                let default = c.ci_profiles(p).iter().find(|ci| ci.default).unwrap();
                assert_eq!(
                    default.slice_count, p.slice_count,
                    "{} {}: default CI profile {} takes {} of {} compute slices",
                    m.key, p.name, default.ci_profile_index, default.slice_count, p.slice_count
                );
            }
        }
    }
}
