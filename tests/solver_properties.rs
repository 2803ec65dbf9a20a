//! Properties of the MIG geometry solver, `gpu_share::mig::solve(model, &wanted, &existing)`.
//!
//! Random cases: a random catalog model, a random valid EXISTING layout on it and random WANTED
//! counts (often infeasible). For each case:
//!   A. validity: an `Ok` geometry is a layout the driver would accept and it accounts for every
//!      existing instance exactly once;
//!   B. minimal disruption: an independent brute-force search (below, no bitmasks, no pruning)
//!      agrees on feasibility and on the most existing instances that can stay in place, and no
//!      destroyed instance of a wanted profile could have stayed together with the kept ones;
//!   C. determinism: the same input gives the same geometry, whatever the order of `existing`
//!      and whether absent profiles are given as zero counts.
//! Then explicit transitions where a naive first-fit layout would move instances ours keeps.
//!
//! Runtime measured while writing (debug build, 2-core machine, `cargo test --test
//! solver_properties` once built): the test binary reports about 0.02 s for all tests, the three
//! properties at 256 cases each included; a one-off run at 20,000 cases per property took 0.5 s
//! and found nothing.

use std::collections::BTreeMap;

use gpu_share::mig::{
    catalog, solve, ExistingInstance, Geometry, GeometryError, GpuModel, PlacedInstance, Placement,
};
use proptest::prelude::*;

// ------------------------------------------------------------------------------------------------
// Helpers
// ------------------------------------------------------------------------------------------------

fn want(pairs: &[(&str, u32)]) -> BTreeMap<String, u32> {
    pairs.iter().map(|(n, c)| (n.to_string(), *c)).collect()
}

fn at(profile: &str, start: u32, size: u32, gi_id: u32) -> ExistingInstance {
    ExistingInstance {
        profile: profile.into(),
        placement: Placement { start, size },
        gi_id: Some(gi_id),
    }
}

fn placed(profile: &str, start: u32, size: u32) -> PlacedInstance {
    PlacedInstance {
        profile: profile.into(),
        placement: Placement { start, size },
    }
}

fn model(name: &str) -> &'static GpuModel {
    catalog()
        .model(name)
        .unwrap_or_else(|| panic!("no model {name}"))
}

/// Do two placements share a memory slot? Plain interval arithmetic, independent of `mask`.
fn overlap(a: Placement, b: Placement) -> bool {
    a.start < b.start + b.size && b.start < a.start + a.size
}

fn takes_all_media(name: &str) -> bool {
    name.ends_with("+me.all")
}

fn has_no_media(name: &str) -> bool {
    name.ends_with("-me")
}

/// nvml.h: "Allocation of instance of this profile [ALL_ME] prevents allocation of all but _NO_ME
/// profiles". True when the set of profile names breaks that.
fn media_conflict<'a>(names: impl IntoIterator<Item = &'a str> + Clone) -> bool {
    names.clone().into_iter().any(|all| {
        takes_all_media(all)
            && names
                .clone()
                .into_iter()
                .any(|other| other != all && !has_no_media(other))
    })
}

/// (profile, start, size, gi_id), sortable, for multiset comparisons.
fn key(e: &ExistingInstance) -> (String, u32, u32, Option<u32>) {
    (
        e.profile.clone(),
        e.placement.start,
        e.placement.size,
        e.gi_id,
    )
}

fn sorted_keys<'a>(
    it: impl IntoIterator<Item = &'a ExistingInstance>,
) -> Vec<(String, u32, u32, Option<u32>)> {
    let mut v: Vec<_> = it.into_iter().map(key).collect();
    v.sort();
    v
}

// ------------------------------------------------------------------------------------------------
// Independent brute force
// ------------------------------------------------------------------------------------------------

/// The most existing instances any valid layout of `wanted` keeps in place, among the layouts
/// that contain every `(profile, placement)` of `required`; `None` when there is no such layout.
///
/// Straight recursion over the wanted instances (sorted by profile name so that instances of one
/// profile are adjacent); each takes one of its profile's placements, instances of the same
/// profile at increasing placement indices. Limits are those of the hardware: count per profile
/// ≤ instance_count, total ≤ max_mig_devices, slices ≤ compute_slices, the +me.all rule, and no
/// shared memory slot.
fn brute_max_keep(
    model: &GpuModel,
    wanted: &BTreeMap<String, u32>,
    existing: &[ExistingInstance],
    required: &[(String, Placement)],
) -> Option<usize> {
    let mut instances = Vec::new();
    let mut slices = 0;
    for (name, &count) in wanted {
        if count == 0 {
            continue;
        }
        let p = model.profile(name)?;
        if count > p.instance_count {
            return None;
        }
        slices += count * p.slice_count;
        for _ in 0..count {
            instances.push((name.as_str(), p.placements.as_slice()));
        }
    }
    if instances.len() as u32 > model.max_mig_devices || slices > model.compute_slices {
        return None;
    }
    if media_conflict(instances.iter().map(|(n, _)| *n)) {
        return None;
    }

    fn go(
        k: usize,
        instances: &[(&str, &[Placement])],
        chosen: &mut Vec<(usize, Placement)>,
        existing: &[ExistingInstance],
        required: &[(String, Placement)],
    ) -> Option<usize> {
        if k == instances.len() {
            let target: Vec<(&str, Placement)> = chosen
                .iter()
                .enumerate()
                .map(|(i, &(_, pl))| (instances[i].0, pl))
                .collect();
            if !required
                .iter()
                .all(|(n, pl)| target.contains(&(n.as_str(), *pl)))
            {
                return None;
            }
            // Match target instances against existing ones, each existing one at most once.
            let mut unmatched: Vec<&ExistingInstance> = existing.iter().collect();
            let mut kept = 0;
            for (n, pl) in &target {
                if let Some(i) = unmatched
                    .iter()
                    .position(|e| e.profile == *n && e.placement == *pl)
                {
                    unmatched.remove(i);
                    kept += 1;
                }
            }
            return Some(kept);
        }
        let (name, placements) = instances[k];
        let first = match (k.checked_sub(1), chosen.last()) {
            (Some(prev), Some(&(j, _))) if instances[prev].0 == name => j + 1,
            _ => 0,
        };
        let mut best = None;
        for (j, &pl) in placements.iter().enumerate().skip(first) {
            if chosen.iter().any(|&(_, c)| overlap(c, pl)) {
                continue;
            }
            chosen.push((j, pl));
            let r = go(k + 1, instances, chosen, existing, required);
            chosen.pop();
            best = best.max(r);
        }
        best
    }
    go(0, &instances, &mut Vec::new(), existing, required)
}

// ------------------------------------------------------------------------------------------------
// Random cases
// ------------------------------------------------------------------------------------------------

#[derive(Clone)]
struct Case {
    model: &'static GpuModel,
    existing: Vec<ExistingInstance>,
    wanted: BTreeMap<String, u32>,
}

/// Shrunk failures print the model key, not the whole catalog entry.
impl std::fmt::Debug for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let existing: Vec<String> = self
            .existing
            .iter()
            .map(|e| format!("{}@{} (gi {:?})", e.profile, e.placement, e.gi_id))
            .collect();
        f.debug_struct("Case")
            .field("model", &self.model.key)
            .field("existing", &existing)
            .field("wanted", &self.wanted)
            .finish()
    }
}

/// Build a case from raw random numbers.
/// - `picks`: (profile index, placement index) tries for the existing layout; a try is kept only
///   when it overlaps nothing chosen so far and respects instance_count, max_mig_devices,
///   compute_slices and the +me.all rule, so the existing layout is one the driver could hold.
/// - `wants`: per profile (selector, count, delta); `from_existing` says whether counts are
///   random or the existing counts nudged by delta (so that many cases keep a lot).
fn build_case(
    model: &'static GpuModel,
    picks: Vec<(usize, usize)>,
    wants: Vec<(u8, u32, i32)>,
    from_existing: bool,
) -> Case {
    let profiles = &model.gpu_instance_profiles;
    let mut existing: Vec<ExistingInstance> = Vec::new();
    for (pi, pj) in picks {
        let p = &profiles[pi];
        let pl = p.placements[pj % p.placements.len()];
        let same = existing.iter().filter(|e| e.profile == p.name).count() as u32;
        let slices: u32 = existing
            .iter()
            .map(|e| model.profile(&e.profile).unwrap().slice_count)
            .sum();
        if existing.iter().any(|e| overlap(e.placement, pl))
            || same == p.instance_count
            || existing.len() as u32 == model.max_mig_devices
            || slices + p.slice_count > model.compute_slices
            || media_conflict(
                existing
                    .iter()
                    .map(|e| e.profile.as_str())
                    .chain([p.name.as_str()]),
            )
        {
            continue;
        }
        let gi_id = Some(existing.len() as u32 + 1);
        existing.push(ExistingInstance {
            profile: p.name.clone(),
            placement: pl,
            gi_id,
        });
    }
    let mut wanted = BTreeMap::new();
    for (p, (sel, count, delta)) in profiles.iter().zip(wants) {
        let max = p.instance_count;
        let n = if from_existing {
            let base = existing.iter().filter(|e| e.profile == p.name).count() as i32;
            let n = (base + delta).clamp(0, max as i32) as u32;
            // Keep explicit zeros now and then, drop most of them.
            if n == 0 && sel != 0 {
                continue;
            }
            n
        } else {
            match sel {
                0 | 1 => continue,
                2 => count % (max + 1),
                _ => 1,
            }
        };
        wanted.insert(p.name.clone(), n);
    }
    Case {
        model,
        existing,
        wanted,
    }
}

fn case() -> impl Strategy<Value = Case> {
    (0..catalog().models.len()).prop_flat_map(|mi| {
        let m = &catalog().models[mi];
        let n = m.gpu_instance_profiles.len();
        let max_placements = m
            .gpu_instance_profiles
            .iter()
            .map(|p| p.placements.len())
            .max()
            .unwrap();
        (
            Just(m),
            prop::collection::vec((0..n, 0..max_placements), 0..=12),
            prop::collection::vec((0u8..4, 0u32..8, -1i32..=1), n),
            any::<bool>(),
        )
            .prop_map(|(m, picks, wants, from_existing)| build_case(m, picks, wants, from_existing))
    })
}

// ------------------------------------------------------------------------------------------------
// Property checks
// ------------------------------------------------------------------------------------------------

/// Property A: the geometry is a valid layout and accounts for every existing instance.
fn check_valid(c: &Case, g: &Geometry) -> Result<(), TestCaseError> {
    let m = c.model;
    let target: Vec<PlacedInstance> = g
        .keep
        .iter()
        .map(|e| PlacedInstance {
            profile: e.profile.clone(),
            placement: e.placement,
        })
        .chain(g.create.iter().cloned())
        .collect();

    let mut counts: BTreeMap<&str, u32> = BTreeMap::new();
    let mut slices = 0;
    for t in &target {
        let p = m.profile(&t.profile);
        prop_assert!(p.is_some(), "unknown profile {} in target", t.profile);
        let p = p.unwrap();
        prop_assert!(
            p.placements.contains(&t.placement),
            "{}@{} is not a catalog placement of {}",
            t.profile,
            t.placement,
            m.key
        );
        *counts.entry(t.profile.as_str()).or_default() += 1;
        slices += p.slice_count;
    }
    for (i, a) in target.iter().enumerate() {
        for b in &target[i + 1..] {
            prop_assert_eq!(
                a.placement.mask() & b.placement.mask(),
                0,
                "{}@{} overlaps {}@{}",
                a.profile,
                a.placement,
                b.profile,
                b.placement
            );
        }
    }
    let wanted: BTreeMap<&str, u32> = c
        .wanted
        .iter()
        .filter(|(_, &n)| n > 0)
        .map(|(k, &n)| (k.as_str(), n))
        .collect();
    prop_assert_eq!(&counts, &wanted, "counts per profile");
    prop_assert!(target.len() as u32 <= m.max_mig_devices);
    prop_assert!(slices <= m.compute_slices, "{} slices", slices);
    prop_assert!(!media_conflict(target.iter().map(|t| t.profile.as_str())));

    // keep ∪ destroy is exactly the existing multiset (gi ids included).
    prop_assert_eq!(
        sorted_keys(g.keep.iter().chain(&g.destroy)),
        sorted_keys(&c.existing)
    );
    for k in &g.keep {
        prop_assert!(c.existing.contains(k), "kept {:?} does not exist", k);
    }
    for cr in &g.create {
        for k in &g.keep {
            prop_assert!(
                !overlap(cr.placement, k.placement),
                "create {}@{} sits on kept {}@{}",
                cr.profile,
                cr.placement,
                k.profile,
                k.placement
            );
        }
        // Destroying an instance and creating the same one in the same place is a needless move.
        prop_assert!(
            !c.existing
                .iter()
                .any(|e| e.profile == cr.profile && e.placement == cr.placement),
            "create {}@{} re-creates an existing instance",
            cr.profile,
            cr.placement
        );
    }
    // Documented: "New instances ... in placement order".
    prop_assert!(g
        .create
        .windows(2)
        .all(|w| w[0].placement <= w[1].placement));
    prop_assert_eq!(
        g.is_unchanged(),
        g.destroy.is_empty() && g.create.is_empty()
    );
    Ok(())
}

/// Property B: the solver keeps as many existing instances as the brute force can.
fn check_minimal(c: &Case, result: &Result<Geometry, GeometryError>) -> Result<(), TestCaseError> {
    let best = brute_max_keep(c.model, &c.wanted, &c.existing, &[]);
    match (result, best) {
        (Err(_), None) => Ok(()),
        (Err(e), Some(k)) => Err(TestCaseError::fail(format!(
            "solve failed ({e}) but a layout keeping {k} exists"
        ))),
        (Ok(g), None) => Err(TestCaseError::fail(format!(
            "solve returned {g:?} but brute force finds no layout"
        ))),
        (Ok(g), Some(k)) => {
            prop_assert_eq!(g.keep.len(), k, "kept {:?}", g.keep);
            // The wording: no destroyed instance of a wanted profile could have stayed
            // together with everything that was kept.
            let kept: Vec<(String, Placement)> = g
                .keep
                .iter()
                .map(|e| (e.profile.clone(), e.placement))
                .collect();
            for d in &g.destroy {
                if c.wanted.get(&d.profile).copied().unwrap_or(0) == 0 {
                    continue;
                }
                let mut required = kept.clone();
                required.push((d.profile.clone(), d.placement));
                prop_assert!(
                    brute_max_keep(c.model, &c.wanted, &c.existing, &required).is_none(),
                    "{}@{} was destroyed but could stay with {:?}",
                    d.profile,
                    d.placement,
                    kept
                );
            }
            Ok(())
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn a_solutions_are_valid_layouts(c in case()) {
        if let Ok(g) = solve(c.model, &c.wanted, &c.existing) {
            check_valid(&c, &g)?;
        }
    }

    #[test]
    fn b_solutions_keep_as_many_existing_instances_as_possible(c in case()) {
        let result = solve(c.model, &c.wanted, &c.existing);
        check_minimal(&c, &result)?;
    }

    #[test]
    fn c_solving_is_deterministic(c in case(), rotate in 0usize..8) {
        let first = solve(c.model, &c.wanted, &c.existing);
        let second = solve(c.model, &c.wanted, &c.existing);
        prop_assert_eq!(&first, &second);

        // NVML lists instances in GI-id order, not placement order: the answer must not depend
        // on the order of `existing`.
        let mut reordered = c.existing.clone();
        reordered.reverse();
        if !reordered.is_empty() {
            let r = rotate % reordered.len();
            reordered.rotate_left(r);
        }
        prop_assert_eq!(&first, &solve(c.model, &c.wanted, &reordered));

        // A zero count is the same as leaving the profile out.
        let nonzero: BTreeMap<String, u32> =
            c.wanted.iter().filter(|(_, &n)| n > 0).map(|(k, &n)| (k.clone(), n)).collect();
        prop_assert_eq!(&first, &solve(c.model, &nonzero, &c.existing));
    }
}

/// The generator must produce the cases the properties are about; if it drifted (say, every
/// wanted set infeasible, or existing always empty), the properties above would pass vacuously.
#[test]
fn the_generator_covers_interesting_cases() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;

    let mut runner = TestRunner::deterministic();
    let strategy = case();
    let (mut ok, mut err, mut kept_some, mut destroyed_wanted, mut full) = (0, 0, 0, 0, 0);
    let mut models = std::collections::BTreeSet::new();
    for _ in 0..512 {
        let c = strategy.new_tree(&mut runner).unwrap().current();
        models.insert(c.model.key.clone());
        let slots: u32 = c.existing.iter().map(|e| e.placement.size).sum();
        if slots >= c.model.memory_slots - 1 {
            full += 1;
        }
        match solve(c.model, &c.wanted, &c.existing) {
            Ok(g) => {
                ok += 1;
                if !g.keep.is_empty() {
                    kept_some += 1;
                }
                if g.destroy
                    .iter()
                    .any(|d| c.wanted.get(&d.profile).is_some_and(|&n| n > 0))
                {
                    destroyed_wanted += 1;
                }
            }
            Err(_) => err += 1,
        }
    }
    assert_eq!(models.len(), catalog().models.len(), "every model drawn");
    assert!(ok >= 100, "{ok} feasible of 512");
    assert!(err >= 50, "{err} infeasible of 512");
    assert!(kept_some >= 50, "{kept_some} keep something");
    assert!(
        destroyed_wanted >= 10,
        "{destroyed_wanted} destroy an instance of a wanted profile"
    );
    assert!(full >= 20, "{full} existing layouts nearly full");
}

#[test]
fn the_brute_force_agrees_with_hand_worked_examples() {
    let a100 = model("a100-40gb");
    // 3g.20gb + 2 × 2g.10gb fits only with the 3g at 4:4 (solver module docs).
    assert_eq!(
        brute_max_keep(a100, &want(&[("3g.20gb", 1), ("2g.10gb", 2)]), &[], &[]),
        Some(0)
    );
    assert_eq!(
        brute_max_keep(
            a100,
            &want(&[("3g.20gb", 1), ("2g.10gb", 2)]),
            &[],
            &[("3g.20gb".into(), Placement { start: 0, size: 4 })]
        ),
        None
    );
    // 4g.20gb + 2 × 2g.10gb: 8 slices on a 7-slice GPU.
    assert_eq!(
        brute_max_keep(a100, &want(&[("4g.20gb", 1), ("2g.10gb", 2)]), &[], &[]),
        None
    );
    // 7 × 1g.5gb keeps all seven existing ones.
    let seven: Vec<ExistingInstance> = (0..7).map(|s| at("1g.5gb", s, 1, 7 + s)).collect();
    assert_eq!(
        brute_max_keep(a100, &want(&[("1g.5gb", 7)]), &seven, &[]),
        Some(7)
    );
}

// ------------------------------------------------------------------------------------------------
// Explicit transitions a naive solver gets wrong
// ------------------------------------------------------------------------------------------------

/// The naive layout: profiles biggest first (then catalog order), each instance at the first free
/// placement, existing instances ignored, no backtracking. `None` when it gets stuck.
fn naive_first_fit(m: &GpuModel, wanted: &BTreeMap<String, u32>) -> Option<Vec<PlacedInstance>> {
    let mut order: Vec<_> = m
        .gpu_instance_profiles
        .iter()
        .enumerate()
        .filter(|(_, p)| wanted.get(&p.name).copied().unwrap_or(0) > 0)
        .collect();
    order.sort_by_key(|(i, p)| (std::cmp::Reverse(p.slots()), *i));
    let mut out: Vec<PlacedInstance> = Vec::new();
    for (_, p) in order {
        for _ in 0..wanted[&p.name] {
            let pl = *p
                .placements
                .iter()
                .find(|pl| out.iter().all(|o| !overlap(o.placement, **pl)))?;
            out.push(PlacedInstance {
                profile: p.name.clone(),
                placement: pl,
            });
        }
    }
    Some(out)
}

/// How many existing instances the naive layout would keep (0 when it finds none).
fn naive_kept(
    m: &GpuModel,
    wanted: &BTreeMap<String, u32>,
    existing: &[ExistingInstance],
) -> usize {
    naive_first_fit(m, wanted).map_or(0, |layout| {
        existing
            .iter()
            .filter(|e| {
                layout
                    .iter()
                    .any(|t| t.profile == e.profile && t.placement == e.placement)
            })
            .count()
    })
}

/// Solve, check the exact answer, and check that the case really separates us from naive.
fn assert_transition(
    gpu: &str,
    wanted: &BTreeMap<String, u32>,
    existing: &[ExistingInstance],
    keep: &[ExistingInstance],
    destroy: &[ExistingInstance],
    create: &[PlacedInstance],
) {
    let m = model(gpu);
    let g = solve(m, wanted, existing).unwrap();
    assert_eq!(g.keep, keep, "{gpu}: keep");
    assert_eq!(g.destroy, destroy, "{gpu}: destroy");
    assert_eq!(g.create, create, "{gpu}: create");
    let c = Case {
        model: m,
        existing: existing.to_vec(),
        wanted: wanted.clone(),
    };
    check_valid(&c, &g).unwrap();
    check_minimal(&c, &Ok(g.clone())).unwrap();
    assert!(
        naive_kept(m, wanted, existing) < g.keep.len(),
        "{gpu}: the naive layout {:?} keeps as much; the case proves nothing",
        naive_first_fit(m, wanted)
    );
}

#[test]
fn h100_two_1g_at_slots_0_and_1_stay_when_a_3g_is_added() {
    // Naive: 3g.40gb@0:4 first, then 1g.10gb@4:1 and @5:1: both running 1g instances destroyed
    // and re-created two slots over. Ours: the 3g goes to 4:4 and nothing moves.
    let existing = [at("1g.10gb", 0, 1, 7), at("1g.10gb", 1, 1, 8)];
    assert_transition(
        "h100",
        &want(&[("3g.40gb", 1), ("1g.10gb", 2)]),
        &existing,
        &existing,
        &[],
        &[placed("3g.40gb", 4, 4)],
    );
}

#[test]
fn h100_of_two_3g_the_one_that_leaves_room_stays() {
    // Two 3g.40gb exist; the target is one 3g.40gb + 2g.20gb + 2 × 1g.10gb. 1-slot placements end
    // at slot 6, so 2g + two 1g do not fit in slots 4..7: only the 3g at 4:4 can stay. Naive puts
    // the 3g at 0:4 and then gets stuck on the second 1g (no layout at all without backtracking;
    // a fresh-GPU solver with backtracking would keep 3g@4:4 only by luck of the order).
    let existing = [at("3g.40gb", 0, 4, 1), at("3g.40gb", 4, 4, 2)];
    assert_transition(
        "h100",
        &want(&[("3g.40gb", 1), ("2g.20gb", 1), ("1g.10gb", 2)]),
        &existing,
        &[at("3g.40gb", 4, 4, 2)],
        &[at("3g.40gb", 0, 4, 1)],
        &[
            placed("2g.20gb", 0, 2),
            placed("1g.10gb", 2, 1),
            placed("1g.10gb", 3, 1),
        ],
    );
}

#[test]
fn a100_40gb_2g_and_1g_stay_and_only_the_1g_in_the_way_goes() {
    // Existing 2g.10gb@0:2, 1g.5gb@2:1, 1g.5gb@5:1; wanted 3g.20gb + 2g.10gb + 1g.5gb.
    // Naive: 3g@0:4, 2g@4:2, 1g@6:1, destroying all three. Ours: 3g@4:4 keeps the 2g and the 1g at
    // slot 2; only the 1g at slot 5 (inside 4:4, and one more than wanted) is destroyed.
    let existing = [
        at("2g.10gb", 0, 2, 3),
        at("1g.5gb", 2, 1, 9),
        at("1g.5gb", 5, 1, 12),
    ];
    assert_transition(
        "a100-40gb",
        &want(&[("3g.20gb", 1), ("2g.10gb", 1), ("1g.5gb", 1)]),
        &existing,
        &[at("2g.10gb", 0, 2, 3), at("1g.5gb", 2, 1, 9)],
        &[at("1g.5gb", 5, 1, 12)],
        &[placed("3g.20gb", 4, 4)],
    );
}

#[test]
fn a30_two_1g_at_slots_0_and_1_stay_when_a_2g_is_added() {
    // Naive: 2g.12gb@0:2, then 1g.6gb@2:1 and @3:1: both 1g moved. Ours: 2g at 2:2, nothing moves.
    let existing = [at("1g.6gb", 0, 1, 3), at("1g.6gb", 1, 1, 4)];
    assert_transition(
        "a30",
        &want(&[("2g.12gb", 1), ("1g.6gb", 2)]),
        &existing,
        &existing,
        &[],
        &[placed("2g.12gb", 2, 2)],
    );
}

#[test]
fn h200_2g_and_1g_35gb_stay_when_a_3g_is_added() {
    // 1g.35gb is the two-slot 1g profile (id 15). Existing 2g.35gb@0:2 and 1g.35gb@2:2; wanted
    // 3g.71gb + 2g.35gb + 1g.35gb. Naive: 3g@0:4, 2g@4:2, 1g.35gb@6:2: both moved. Ours: 3g@4:4.
    let existing = [at("2g.35gb", 0, 2, 3), at("1g.35gb", 2, 2, 4)];
    assert_transition(
        "h200",
        &want(&[("3g.71gb", 1), ("2g.35gb", 1), ("1g.35gb", 1)]),
        &existing,
        &existing,
        &[],
        &[placed("3g.71gb", 4, 4)],
    );
}

#[test]
fn rtx_pro_6000_1g_at_units_0_and_3_stay_when_a_2g_is_added() {
    // 12-unit grid: 1g = 3 units, 2g = 6. Existing 1g.24gb@0:3 and @3:3; wanted 2g.48gb + 2 × 1g.
    // Naive: 2g@0:6, 1g@6:3, 1g@9:3: both moved. Ours: 2g@6:6.
    let existing = [at("1g.24gb", 0, 3, 3), at("1g.24gb", 3, 3, 4)];
    assert_transition(
        "rtx-pro-6000",
        &want(&[("2g.48gb", 1), ("1g.24gb", 2)]),
        &existing,
        &existing,
        &[],
        &[placed("2g.48gb", 6, 6)],
    );
}

#[test]
fn the_checks_reject_wrong_answers() {
    // The property checks themselves, fed answers a buggy solver could give (H100, 1g.10gb at
    // slots 0 and 1, wanting 3g.40gb + 2 × 1g.10gb).
    let existing = vec![at("1g.10gb", 0, 1, 7), at("1g.10gb", 1, 1, 8)];
    let c = Case {
        model: model("h100"),
        existing: existing.clone(),
        wanted: want(&[("3g.40gb", 1), ("1g.10gb", 2)]),
    };
    // The naive answer is a valid layout but moves both instances.
    let naive = Geometry {
        keep: vec![],
        destroy: existing.clone(),
        create: vec![
            placed("3g.40gb", 0, 4),
            placed("1g.10gb", 4, 1),
            placed("1g.10gb", 5, 1),
        ],
    };
    check_valid(&c, &naive).unwrap();
    assert!(check_minimal(&c, &Ok(naive)).is_err());
    // Overlap: the 3g on top of the kept 1g instances.
    let overlapping = Geometry {
        keep: existing.clone(),
        destroy: vec![],
        create: vec![placed("3g.40gb", 0, 4)],
    };
    assert!(check_valid(&c, &overlapping).is_err());
    // Wrong count: one 1g kept, the other forgotten (neither kept nor destroyed).
    let forgotten = Geometry {
        keep: vec![existing[0].clone()],
        destroy: vec![],
        create: vec![placed("3g.40gb", 4, 4), placed("1g.10gb", 2, 1)],
    };
    assert!(check_valid(&c, &forgotten).is_err());
    // Not a catalog placement: 3g.40gb at 2:4.
    let off_grid = Geometry {
        keep: existing.clone(),
        destroy: vec![],
        create: vec![placed("3g.40gb", 2, 4)],
    };
    assert!(check_valid(&c, &off_grid).is_err());
    // Destroy and re-create in the same place.
    let churn = Geometry {
        keep: vec![existing[0].clone()],
        destroy: vec![existing[1].clone()],
        create: vec![placed("1g.10gb", 1, 1), placed("3g.40gb", 4, 4)],
    };
    assert!(check_valid(&c, &churn).is_err());
    // An error where a layout exists.
    let err = GeometryError::TooManyInstances { wanted: 3, max: 7 };
    assert!(check_minimal(&c, &Err(err)).is_err());
}
