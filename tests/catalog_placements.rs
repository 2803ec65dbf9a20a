//! Every catalog model's documented placements, checked against the reference text.
//!
//! The placements of five models were quoted verbatim (`nvidia-smi mig -lgipp`) in
//! the MIG User Guide and in GitHub issues quoting real output
//! (docs/sources.md#nvidia-mig-user-guide); those texts are embedded here unchanged, parsed,
//! and compared with the embedded catalog profile by profile. The other models' placements are
//! inferred from the same chip family (an inference, not a quote), so they are compared with
//! the eight-slot family table. The profile names are checked against NVIDIA/go-nvlib's MIG
//! profile naming rule, and a few structural invariants the solver relies on are checked for
//! every model.

use std::collections::{BTreeMap, BTreeSet};

use gpu_share::mig::{catalog, GpuModel, Placement};

// ------------------------------------------------------------------------------------------------
// Verbatim `nvidia-smi mig -lgipp` outputs as the MIG User Guide prints them, prompt lines
// included.
// ------------------------------------------------------------------------------------------------

/// mig-nvml.md §1.2: "A100-40GB (MIG User Guide v580) — identical text quoted for H100 80GB HBM3
/// and H100 NVL". Also the eight-slot family table the inferred models are assumed to share.
const LGIPP_EIGHT_SLOT: &str = "\
$ nvidia-smi mig -lgipp
GPU  0 Profile ID 19 Placements: {0,1,2,3,4,5,6}:1
GPU  0 Profile ID 20 Placements: {0,1,2,3,4,5,6}:1
GPU  0 Profile ID 15 Placements: {0,2,4,6}:2
GPU  0 Profile ID 14 Placements: {0,2,4}:2
GPU  0 Profile ID  9 Placements: {0,4}:4
GPU  0 Profile ID  5 Placement : {0}:4
GPU  0 Profile ID  0 Placement : {0}:8
";

/// mig-nvml.md §1.2: "A30 (driver 535.183.01)".
const LGIPP_A30: &str = "\
GPU  0 Profile ID 14 Placements: {0,1,2,3}:1
GPU  0 Profile ID 21 Placements: {0,1,2,3}:1
GPU  0 Profile ID  5 Placements: {0,2}:2
GPU  0 Profile ID  6 Placements: {0,2}:2
GPU  0 Profile ID  0 Placement : {0}:4
";

/// mig-nvml.md §1.2: "RTX PRO 6000 Blackwell Server Edition".
const LGIPP_RTX_PRO_6000: &str = "\
root@gpu-rtxpro6000-8:~# nvidia-smi mig -i 0 -lgipp
GPU  0 Profile ID 14 Placements: {0,3,6,9}:3
GPU  0 Profile ID 21 Placements: {0,3,6,9}:3
GPU  0 Profile ID 47 Placements: {0,3,6,9}:3
GPU  0 Profile ID 65 Placements: {0,3,6,9}:3
GPU  0 Profile ID 67 Placements: {0,3,6,9}:3
GPU  0 Profile ID  5 Placements: {0,6}:6
GPU  0 Profile ID 35 Placements: {0,6}:6
GPU  0 Profile ID 64 Placements: {0,6}:6
GPU  0 Profile ID 66 Placements: {0,6}:6
GPU  0 Profile ID  0 Placement : {0}:12
GPU  0 Profile ID 32 Placement : {0}:12
";

/// Models whose `-lgipp` output was quoted verbatim for that very model (§1.2).
const QUOTED: &[(&str, &str)] = &[
    ("a100-sxm4-40gb", LGIPP_EIGHT_SLOT),
    ("h100-80gb-sxm", LGIPP_EIGHT_SLOT),
    ("h100-94gb-nvl", LGIPP_EIGHT_SLOT),
    ("a30-24gb", LGIPP_A30),
    ("rtx-pro-6000-blackwell", LGIPP_RTX_PRO_6000),
    // Read through NVML (nvmlDeviceGetGpuInstancePossiblePlacements_v2, MIG off) on a real H200,
    // driver 580.159.04, whose `nvidia-smi mig -lgipp` printed the same list with the same
    // profile ids: docs/measured/h200-nvml.md.
    ("h200-141gb", LGIPP_EIGHT_SLOT),
];

/// Models whose placements were never quoted: §1.2 says "H200, GH200, H20, B200, GB200: `-lgipp`
/// not found; same ID set → assume the 8-slot list **[inferred]**". A100 80GB (its `-lgip` table is
/// quoted in §1.8, its `-lgipp` is not) and H100 PCIe (a variant of the SXM entry; the catalog
/// says "-lgipp not quoted for PCIe; assume eight_slot") are in the same position.
const INFERRED_EIGHT_SLOT: &[&str] = &[
    "a100-80gb",
    "h100-pcie",
    "h100-96gb-gh200",
    "h20-96gb",
    "b200-180gb",
    "gb200",
];

// ------------------------------------------------------------------------------------------------
// Parsing `nvidia-smi mig -lgipp`
// ------------------------------------------------------------------------------------------------

/// Parse `nvidia-smi mig -lgipp` output into (profile id, placements) in line order. Lines that
/// are not placement lines (the shell prompt) are skipped; placement lines that do not parse
/// panic, so a typo in the embedded text cannot silently drop a profile.
fn parse_lgipp(text: &str) -> Vec<(u32, Vec<Placement>)> {
    let mut out = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.trim().strip_prefix("GPU") else {
            continue;
        };
        let (_gpu, rest) = rest
            .split_once("Profile ID")
            .unwrap_or_else(|| panic!("no `Profile ID` in {line:?}"));
        let (id, rest) = rest
            .split_once("Placement")
            .unwrap_or_else(|| panic!("no `Placement` in {line:?}"));
        let id: u32 = id
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("profile id in {line:?}: {e}"));
        // `Placements: {a,b,c}:size` for several placements, `Placement : {a}:size` for one.
        let (plural, rest) = match rest.strip_prefix("s:") {
            Some(r) => (true, r),
            None => (
                false,
                rest.strip_prefix(" :")
                    .unwrap_or_else(|| panic!("bad `Placement :` in {line:?}")),
            ),
        };
        let rest = rest.trim();
        let (starts, size) = rest
            .strip_prefix('{')
            .and_then(|r| r.split_once("}:"))
            .unwrap_or_else(|| panic!("bad `{{starts}}:size` in {line:?}"));
        let size: u32 = size
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("size in {line:?}: {e}"));
        let placements: Vec<Placement> = starts
            .split(',')
            .map(|s| Placement {
                start: s
                    .trim()
                    .parse()
                    .unwrap_or_else(|e| panic!("start {s:?} in {line:?}: {e}")),
                size,
            })
            .collect();
        assert_eq!(
            plural,
            placements.len() > 1,
            "nvidia-smi says `Placements` exactly when there are several: {line:?}"
        );
        out.push((id, placements));
    }
    out
}

/// The parsed table as a map, checking that no profile id is listed twice.
fn lgipp_table(text: &str) -> BTreeMap<u32, Vec<Placement>> {
    let lines = parse_lgipp(text);
    let mut table = BTreeMap::new();
    for (id, placements) in lines {
        assert!(
            table.insert(id, placements).is_none(),
            "profile id {id} listed twice in the -lgipp text"
        );
    }
    assert!(!table.is_empty(), "no placement line parsed");
    table
}

/// The catalog model's placements, keyed by NVML profile id (what `-lgipp` prints).
fn catalog_table(model: &GpuModel) -> BTreeMap<u32, Vec<Placement>> {
    let mut table = BTreeMap::new();
    for p in &model.gpu_instance_profiles {
        assert!(
            table.insert(p.profile_id, p.placements.clone()).is_none(),
            "{}: profile id {} used twice",
            model.key,
            p.profile_id
        );
    }
    table
}

fn model(key: &str) -> &'static GpuModel {
    catalog()
        .models
        .iter()
        .find(|m| m.key == key)
        .unwrap_or_else(|| panic!("catalog has no model with key {key:?}"))
}

/// How a model's placements differ from an `-lgipp` text, or `None` when they are the same:
/// the same set of profile ids, and per id the same placements in the same order.
fn lgipp_mismatch(m: &GpuModel, lgipp: &str) -> Option<String> {
    let expected = lgipp_table(lgipp);
    let actual = catalog_table(m);
    let (a, e): (BTreeSet<_>, BTreeSet<_>) = (actual.keys().collect(), expected.keys().collect());
    if a != e {
        return Some(format!(
            "{}: profile ids {a:?} differ from the -lgipp text's {e:?}",
            m.key
        ));
    }
    expected
        .iter()
        .find(|(id, placements)| &actual[id] != *placements)
        .map(|(id, placements)| {
            format!(
                "{}: profile id {id} has placements {:?}, the -lgipp text {placements:?}",
                m.key, actual[id]
            )
        })
}

fn assert_model_matches(key: &str, lgipp: &str) {
    if let Some(why) = lgipp_mismatch(model(key), lgipp) {
        panic!("{why}");
    }
}

// ------------------------------------------------------------------------------------------------
// Tests
// ------------------------------------------------------------------------------------------------

#[test]
fn the_parser_reads_the_quoted_lines() {
    let t = parse_lgipp(LGIPP_EIGHT_SLOT);
    assert_eq!(t.len(), 7);
    assert_eq!(
        t[0],
        (
            19,
            (0..7).map(|s| Placement { start: s, size: 1 }).collect()
        )
    );
    assert_eq!(t[5], (5, vec![Placement { start: 0, size: 4 }]));
    assert_eq!(t[6], (0, vec![Placement { start: 0, size: 8 }]));
    assert_eq!(parse_lgipp(LGIPP_A30).len(), 5);
    let rtx = parse_lgipp(LGIPP_RTX_PRO_6000);
    assert_eq!(rtx.len(), 11);
    assert_eq!(
        rtx[5],
        (
            5,
            vec![
                Placement { start: 0, size: 6 },
                Placement { start: 6, size: 6 }
            ]
        )
    );
}

#[test]
fn the_comparison_catches_wrong_order_missing_and_extra_profiles() {
    let h100 = model("h100-80gb-sxm");
    assert_eq!(lgipp_mismatch(h100, LGIPP_EIGHT_SLOT), None);
    // Same placements, other order.
    let mut reordered = h100.clone();
    reordered.gpu_instance_profiles[0].placements.reverse();
    assert!(lgipp_mismatch(&reordered, LGIPP_EIGHT_SLOT).is_some());
    // A profile missing.
    let mut missing = h100.clone();
    missing.gpu_instance_profiles.pop();
    assert!(lgipp_mismatch(&missing, LGIPP_EIGHT_SLOT).is_some());
    // A placement missing.
    let mut short = h100.clone();
    short.gpu_instance_profiles[0].placements.pop();
    assert!(lgipp_mismatch(&short, LGIPP_EIGHT_SLOT).is_some());
    // The A30 text on an eight-slot model.
    assert!(lgipp_mismatch(h100, LGIPP_A30).is_some());
}

#[test]
fn every_catalog_model_is_classified_as_quoted_or_inferred() {
    // A model added to the catalog must be added to one of the two lists above, with its source.
    let classified: BTreeSet<&str> = QUOTED
        .iter()
        .map(|(k, _)| *k)
        .chain(INFERRED_EIGHT_SLOT.iter().copied())
        .collect();
    assert_eq!(
        classified.len(),
        QUOTED.len() + INFERRED_EIGHT_SLOT.len(),
        "a model is listed twice"
    );
    let keys: BTreeSet<&str> = catalog().models.iter().map(|m| m.key.as_str()).collect();
    assert_eq!(keys, classified);
}

#[test]
fn quoted_models_match_their_lgipp_text_exactly() {
    for (key, text) in QUOTED {
        assert_model_matches(key, text);
    }
}

#[test]
fn quoted_models_are_marked_verified() {
    for (key, _) in QUOTED {
        let m = model(key);
        assert!(
            m.verified,
            "{key}: placements were quoted, model says unverified"
        );
        for p in &m.gpu_instance_profiles {
            assert!(
                p.placements_verified,
                "{key} {}: placements were quoted, profile says unverified",
                p.name
            );
        }
    }
}

/// `placements_verified` should be false where the reference has no `-lgipp` text for the model.
/// Two catalog entries disagree; they are listed here rather than skipped silently.
const KNOWN_FLAG_EXCEPTIONS: &[(&str, &str)] = &[(
    "a100-80gb",
    "the catalog marks the model and 6 of its 7 profiles verified, citing the A100 40GB \
         -lgipp text of the MIG guide (source: \"placements = A100 family\"); mig-nvml.md §1.2 \
         quotes -lgipp for A100 40GB, H100 80GB HBM3 and H100 NVL only",
)];

#[test]
fn inferred_models_are_not_marked_verified_except_known_exceptions() {
    for key in INFERRED_EIGHT_SLOT {
        let m = model(key);
        let claims_verified = m.verified
            || m.gpu_instance_profiles
                .iter()
                .any(|p| p.placements_verified);
        let excused = KNOWN_FLAG_EXCEPTIONS.iter().any(|(k, _)| k == key);
        assert_eq!(
            claims_verified, excused,
            "{key}: placements are inferred; claims verified = {claims_verified}, \
             listed as known exception = {excused}"
        );
    }
}

#[test]
fn inferred_models_equal_the_eight_slot_family_table() {
    // mig-nvml.md §1.2: "H200, GH200, H20, B200, GB200: `-lgipp` not found; same ID set → assume the
    // 8-slot list [inferred]". A100 80GB and H100 PCIe likewise (see INFERRED_EIGHT_SLOT).
    for key in INFERRED_EIGHT_SLOT {
        let m = model(key);
        assert_eq!(m.memory_slots, 8, "{key}");
        assert_eq!(m.compute_slices, 7, "{key}");
        assert_model_matches(key, LGIPP_EIGHT_SLOT);
    }
}

/// go-nvlib `getMigMemorySizeGB` (mig-nvml.md §1.5), in the same f64 arithmetic:
/// frac = ceil(memory_mib*MiB / total_bytes * 8) / 8; totalGB = ceil(total_bytes / GiB);
/// GB = round(frac * totalGB).
fn go_nvlib_memory_gb(total_memory_mib: u64, memory_mib: u64) -> u64 {
    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;
    let total_bytes = total_memory_mib * MIB;
    let frac = (memory_mib * MIB) as f64 / total_bytes as f64;
    let frac = (frac * 8.0).ceil() / 8.0;
    let total_gb = total_bytes.div_ceil(GIB) as f64;
    (frac * total_gb).round() as u64
}

/// The attribute suffix go-nvlib derives from the NVML profile index (§1.5: "REV1→+me,
/// ALL_ME→+me.all, GFX→+gfx, NO_ME→-me"; index values from nvml.h, mig-nvml.md §2.1).
fn suffix_for_index(nvml_profile_index: u32) -> &'static str {
    match nvml_profile_index {
        // 1_SLICE, 2_SLICE, 3_SLICE, 4_SLICE, 7_SLICE, 8_SLICE, 6_SLICE, 1_SLICE_REV2
        0..=6 | 9 => "",
        7 | 8 => "+me",         // 1_SLICE_REV1, 2_SLICE_REV1
        10..=12 | 17 => "+gfx", // 1/2/4_SLICE_GFX, 3_SLICE_GFX
        13 | 14 => "-me",       // 1/2_SLICE_NO_ME
        15 | 16 => "+me.all",   // 1/2_SLICE_ALL_ME
        other => panic!("unknown NVML_GPU_INSTANCE_PROFILE index {other}"),
    }
}

/// Profiles whose name does not reproduce from (memory_mib, total_memory_mib), with the reason.
/// Empty: every profile with a known memory_mib reproduces (checked against the catalog of
/// commit eab9103). Add `(model key, profile name, reason)` here only for documented driver
/// variations, never to make a wrong number pass.
const KNOWN_NAME_EXCEPTIONS: &[(&str, &str, &str)] = &[];

#[test]
fn profile_names_follow_the_go_nvlib_rule() {
    let mut checked = 0;
    let mut unknown_memory = Vec::new();
    let mut failures = Vec::new();
    for m in &catalog().models {
        for p in &m.gpu_instance_profiles {
            let (base, suffix) = match p.name.find(['+', '-']) {
                Some(i) => p.name.split_at(i),
                None => (p.name.as_str(), ""),
            };
            assert_eq!(
                suffix,
                suffix_for_index(p.nvml_profile_index),
                "{} {}: suffix vs NVML profile index {}",
                m.key,
                p.name,
                p.nvml_profile_index
            );
            let (g, gb) = base
                .strip_suffix("gb")
                .and_then(|b| b.split_once("g."))
                .unwrap_or_else(|| panic!("{} {}: name is not <G>g.<GB>gb", m.key, p.name));
            let g: u32 = g.parse().unwrap();
            let gb: u64 = gb.parse().unwrap();
            assert_eq!(
                g, p.slice_count,
                "{} {}: <G>g vs slice_count",
                m.key, p.name
            );
            let Some(mib) = p.memory_mib else {
                unknown_memory.push(format!("{} {}", m.key, p.name));
                continue;
            };
            let computed = go_nvlib_memory_gb(m.total_memory_mib, mib);
            let excused = KNOWN_NAME_EXCEPTIONS
                .iter()
                .any(|(k, n, _)| *k == m.key && *n == p.name);
            if computed != gb && !excused {
                failures.push(format!(
                    "{} {}: memory_mib {mib} of total {} MiB gives {computed}gb",
                    m.key, p.name, m.total_memory_mib
                ));
            }
            if computed == gb && excused {
                failures.push(format!(
                    "{} {}: listed as a known exception but reproduces now",
                    m.key, p.name
                ));
            }
            checked += 1;
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
    // Memory unknown: H20 (every row) and GB200 3g/4g/7g (mig-nvml.md §6, "Unverified / missing").
    assert_eq!(
        unknown_memory,
        [
            "gb200 3g.93gb",
            "gb200 4g.93gb",
            "gb200 7g.186gb",
            "h20-96gb 1g.12gb",
            "h20-96gb 1g.12gb+me",
            "h20-96gb 1g.24gb",
            "h20-96gb 2g.24gb",
            "h20-96gb 3g.48gb",
            "h20-96gb 4g.48gb",
            "h20-96gb 7g.96gb",
        ]
    );
    assert!(checked >= 70, "only {checked} profiles checked");
}

#[test]
fn go_nvlib_rule_on_the_reference_examples() {
    // Worked by hand from §1.5's formula: the fractional names where rounding matters.
    assert_eq!(go_nvlib_memory_gb(95830, 10880), 12); // H100 NVL 1g.12gb: 1/8 × 94 = 11.75
    assert_eq!(go_nvlib_memory_gb(143771, 16384), 18); // H200 1g.18gb: 1/8 × 141 = 17.625
    assert_eq!(go_nvlib_memory_gb(143771, 71424), 71); // H200 3g.71gb: 1/2 × 141 = 70.5
    assert_eq!(go_nvlib_memory_gb(183359, 20992), 23); // B200 1g.23gb: 1/8 × 180 = 22.5
    assert_eq!(go_nvlib_memory_gb(40960, 4864), 5); // A100 40GB 1g.5gb
}

#[test]
fn placements_lie_inside_the_memory_grid() {
    for m in &catalog().models {
        for p in &m.gpu_instance_profiles {
            assert!(
                !p.placements.is_empty(),
                "{} {}: no placement",
                m.key,
                p.name
            );
            for pl in &p.placements {
                assert!(pl.size > 0, "{} {} {pl}", m.key, p.name);
                assert!(
                    pl.start + pl.size <= m.memory_slots,
                    "{} {}: {pl} outside {} slots",
                    m.key,
                    p.name,
                    m.memory_slots
                );
                assert_eq!(pl.size, p.slots(), "{} {}: mixed sizes", m.key, p.name);
            }
            let mut sorted = p.placements.clone();
            sorted.sort();
            sorted.dedup();
            assert_eq!(
                sorted, p.placements,
                "{} {}: not strictly increasing",
                m.key, p.name
            );
        }
    }
}

#[test]
fn instance_counts_fit_the_placements_and_the_gpu() {
    for m in &catalog().models {
        assert!(
            m.max_mig_devices >= 1 && m.max_mig_devices <= m.compute_slices,
            "{}",
            m.key
        );
        for p in &m.gpu_instance_profiles {
            assert!(p.instance_count >= 1, "{} {}", m.key, p.name);
            assert!(
                p.instance_count as usize <= p.placements.len(),
                "{} {}: instance_count {} > {} placements",
                m.key,
                p.name,
                p.instance_count,
                p.placements.len()
            );
            assert!(
                p.instance_count * p.slice_count <= m.compute_slices,
                "{} {}: {} instances of {} slices exceed {} compute slices",
                m.key,
                p.name,
                p.instance_count,
                p.slice_count,
                m.compute_slices
            );
        }
    }
}

#[test]
fn a_full_one_slice_layout_fits_the_compute_slices() {
    // Fill the GPU with the plain 1-slice profile (the one with the most instances): its slices
    // must not exceed compute_slices; on every model so far it uses them all.
    for m in &catalog().models {
        let one = m
            .gpu_instance_profiles
            .iter()
            .filter(|p| p.slice_count == 1)
            .max_by_key(|p| (p.instance_count, std::cmp::Reverse(p.nvml_profile_index)))
            .unwrap_or_else(|| panic!("{}: no 1-slice profile", m.key));
        let mut used = 0u32;
        let mut placed = 0u32;
        for pl in &one.placements {
            if placed == one.instance_count.min(m.max_mig_devices) {
                break;
            }
            if used & pl.mask() == 0 {
                used |= pl.mask();
                placed += 1;
            }
        }
        let slices = placed * one.slice_count;
        assert!(
            slices <= m.compute_slices,
            "{} {}: {slices}",
            m.key,
            one.name
        );
        assert_eq!(slices, m.compute_slices, "{} {}", m.key, one.name);
    }
}

#[test]
fn no_non_overlapping_layout_exceeds_the_compute_slices() {
    // Stronger than the 1-slice layout: every set of pairwise disjoint placements (any profiles,
    // each profile at most instance_count times) needs at most compute_slices slices. §1.2: "with
    // these placement lists the compute-slice total can never exceed 7".
    fn best(
        m: &GpuModel,
        options: &[(usize, Placement)],
        from: usize,
        used: u32,
        counts: &mut Vec<u32>,
    ) -> u32 {
        let mut top = 0;
        for k in from..options.len() {
            let (pi, pl) = options[k];
            let p = &m.gpu_instance_profiles[pi];
            if used & pl.mask() != 0 || counts[pi] == p.instance_count {
                continue;
            }
            counts[pi] += 1;
            top = top.max(p.slice_count + best(m, options, k + 1, used | pl.mask(), counts));
            counts[pi] -= 1;
        }
        top
    }
    for m in &catalog().models {
        let options: Vec<(usize, Placement)> = m
            .gpu_instance_profiles
            .iter()
            .enumerate()
            .flat_map(|(i, p)| p.placements.iter().map(move |pl| (i, *pl)))
            .collect();
        let mut counts = vec![0; m.gpu_instance_profiles.len()];
        let most = best(m, &options, 0, 0, &mut counts);
        assert_eq!(most, m.compute_slices, "{}", m.key);
    }
}

#[test]
fn profile_ids_and_names_are_unique_per_model() {
    for m in &catalog().models {
        let ids: BTreeSet<u32> = m
            .gpu_instance_profiles
            .iter()
            .map(|p| p.profile_id)
            .collect();
        assert_eq!(
            ids.len(),
            m.gpu_instance_profiles.len(),
            "{}: duplicate profile id",
            m.key
        );
        let names: BTreeSet<&str> = m
            .gpu_instance_profiles
            .iter()
            .map(|p| p.name.as_str())
            .collect();
        assert_eq!(
            names.len(),
            m.gpu_instance_profiles.len(),
            "{}: duplicate name",
            m.key
        );
        let indices: BTreeSet<u32> = m
            .gpu_instance_profiles
            .iter()
            .map(|p| p.nvml_profile_index)
            .collect();
        assert_eq!(
            indices.len(),
            m.gpu_instance_profiles.len(),
            "{}: duplicate index",
            m.key
        );
    }
}
