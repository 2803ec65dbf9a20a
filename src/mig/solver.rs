//! The geometry solver: where each wanted GPU instance goes on one GPU.
//!
//! MIG instances can only start at the placements the driver lists for their profile, and no two
//! may share a memory slot. Counting slices is not enough: on an A100 40GB, `3g.20gb` plus two
//! `2g.10gb` fits only with the 3g instance at slot 4, while `4g.20gb` plus two `2g.10gb` never
//! fits. The grid has at most 16 slots and a GPU at most 7 instances, so the solver searches
//! exhaustively (depth-first, with bitmasks and a bound) and is still fast.
//!
//! Among the valid layouts it prefers the one that keeps the most existing instances where they
//! are, because every instance destroyed is a workload evicted; ties go to the layout whose
//! placements come first in the catalog's order, so the answer is deterministic.

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;

use super::catalog::{GpuInstanceProfile, GpuModel, Placement};

/// A GPU instance that exists on the GPU now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExistingInstance {
    /// Profile name, e.g. `3g.40gb`.
    pub profile: String,
    pub placement: Placement,
    /// NVML GPU-instance id, when observed on hardware.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gi_id: Option<u32>,
}

/// A GPU instance at a chosen placement.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct PlacedInstance {
    pub profile: String,
    pub placement: Placement,
}

/// The solver's answer for one GPU: what to keep, destroy and create.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Geometry {
    /// Existing instances left where they are.
    pub keep: Vec<ExistingInstance>,
    /// Existing instances the target has no room for, destroyed first.
    pub destroy: Vec<ExistingInstance>,
    /// New instances, created after the destroys, in placement order.
    pub create: Vec<PlacedInstance>,
}

impl Geometry {
    /// Every instance of the target layout, kept or created, in placement order.
    pub fn target(&self) -> Vec<PlacedInstance> {
        let mut all: Vec<PlacedInstance> = self
            .keep
            .iter()
            .map(|e| PlacedInstance {
                profile: e.profile.clone(),
                placement: e.placement,
            })
            .chain(self.create.iter().cloned())
            .collect();
        all.sort_by(|a, b| (a.placement, &a.profile).cmp(&(b.placement, &b.profile)));
        all
    }

    /// True when nothing on the GPU changes.
    pub fn is_unchanged(&self) -> bool {
        self.destroy.is_empty() && self.create.is_empty()
    }
}

/// Why no layout exists. Messages name the profiles and the limit broken; the caller adds the
/// profile, rule and GPU model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GeometryError {
    UnknownProfile {
        profile: String,
        available: Vec<String>,
    },
    TooManyOfProfile {
        profile: String,
        wanted: u32,
        max: u32,
    },
    TooManyInstances {
        wanted: u32,
        max: u32,
    },
    TooManyComputeSlices {
        wanted: u32,
        available: u32,
    },
    TooMuchMemory {
        wanted_slots: u32,
        available_slots: u32,
        wanted_mib: Option<u64>,
        total_mib: u64,
    },
    MediaEngines {
        all_media: String,
        other: String,
    },
    NoCoexistingPlacement {
        fitting: u32,
        wanted: u32,
        example: Vec<PlacedInstance>,
        starts: Vec<(String, Vec<u32>, u32)>,
    },
}

impl fmt::Display for GeometryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GeometryError::UnknownProfile { profile, available } => write!(
                f,
                "this model has no MIG profile {profile:?}; it has {}",
                available.join(", ")
            ),
            GeometryError::TooManyOfProfile {
                profile,
                wanted,
                max,
            } => write!(
                f,
                "{wanted} × {profile} asked, but at most {max} instance{} of {profile} can exist at once",
                if *max == 1 { "" } else { "s" }
            ),
            GeometryError::TooManyInstances { wanted, max } => write!(
                f,
                "{wanted} MIG instances asked, but this GPU holds at most {max}"
            ),
            GeometryError::TooManyComputeSlices { wanted, available } => write!(
                f,
                "too many compute slices: the instances need {wanted}, the GPU has {available}"
            ),
            GeometryError::TooMuchMemory {
                wanted_slots,
                available_slots,
                wanted_mib,
                total_mib,
            } => {
                write!(
                    f,
                    "too much memory: the instances need {wanted_slots} of the GPU's {available_slots} memory slices"
                )?;
                if let Some(mib) = wanted_mib {
                    write!(f, " ({mib} MiB of {total_mib} MiB)")?;
                }
                Ok(())
            }
            GeometryError::MediaEngines { all_media, other } => write!(
                f,
                "{all_media} takes every media engine, so only `-me` profiles may sit beside it, not {other}"
            ),
            GeometryError::NoCoexistingPlacement {
                fitting,
                wanted,
                example,
                starts,
            } => {
                let where_: Vec<String> = starts
                    .iter()
                    .map(|(name, s, size)| {
                        let s: Vec<String> = s.iter().map(u32::to_string).collect();
                        format!("{name} only at slot {} ({size} slots)", s.join(", "))
                    })
                    .collect();
                let ex: Vec<String> = example
                    .iter()
                    .map(|i| format!("{}@{}", i.profile, i.placement))
                    .collect();
                write!(
                    f,
                    "the instances cannot be placed together: {}; at most {fitting} of the {wanted} fit at once (e.g. {})",
                    where_.join("; "),
                    if ex.is_empty() { "none".to_string() } else { ex.join(" + ") }
                )
            }
        }
    }
}

impl std::error::Error for GeometryError {}

/// Check the counts without placing anything: the cheap, explainable limits first.
fn check_limits(model: &GpuModel, wanted: &BTreeMap<String, u32>) -> Result<(), GeometryError> {
    let mut instances = 0;
    let mut slices = 0;
    let mut slots = 0;
    let mut mib = Some(0u64);
    for (name, &count) in wanted.iter().filter(|(_, &c)| c > 0) {
        let p = model
            .profile(name)
            .ok_or_else(|| GeometryError::UnknownProfile {
                profile: name.clone(),
                available: model
                    .profile_names()
                    .iter()
                    .map(|s| s.to_string())
                    .collect(),
            })?;
        if count > p.instance_count {
            return Err(GeometryError::TooManyOfProfile {
                profile: name.clone(),
                wanted: count,
                max: p.instance_count,
            });
        }
        instances += count;
        slices += count * p.slice_count;
        slots += count * p.slots();
        mib = mib.zip(p.memory_mib).map(|(a, b)| a + b * count as u64);
    }
    if instances > model.max_mig_devices {
        return Err(GeometryError::TooManyInstances {
            wanted: instances,
            max: model.max_mig_devices,
        });
    }
    if slices > model.compute_slices {
        return Err(GeometryError::TooManyComputeSlices {
            wanted: slices,
            available: model.compute_slices,
        });
    }
    if slots > model.memory_slots {
        return Err(GeometryError::TooMuchMemory {
            wanted_slots: slots,
            available_slots: model.memory_slots,
            wanted_mib: mib,
            total_mib: model.total_memory_mib,
        });
    }
    check_media_engines(model, wanted)
}

fn check_media_engines(
    model: &GpuModel,
    wanted: &BTreeMap<String, u32>,
) -> Result<(), GeometryError> {
    let present: Vec<&GpuInstanceProfile> = wanted
        .iter()
        .filter(|(_, &c)| c > 0)
        .filter_map(|(n, _)| model.profile(n))
        .collect();
    if let Some(all) = present.iter().find(|p| p.takes_all_media_engines()) {
        if let Some(other) = present
            .iter()
            .find(|p| p.name != all.name && !p.has_no_media_engines())
        {
            return Err(GeometryError::MediaEngines {
                all_media: all.name.clone(),
                other: other.name.clone(),
            });
        }
    }
    Ok(())
}

/// One profile's wanted instances, prepared for the search.
struct Item<'a> {
    profile: &'a GpuInstanceProfile,
    count: u32,
    masks: Vec<u32>,
    /// Bit j set when an existing instance of this profile sits at placement j.
    existing: u64,
}

/// Depth-first search over placement combinations, one profile after another.
struct Search<'a> {
    items: Vec<Item<'a>>,
    /// Upper bound of instances keepable from item i on (for pruning).
    keepable_from: Vec<u32>,
    /// When true, instances may be left out and the score is how many are placed.
    partial: bool,
    chosen: Vec<(usize, usize)>,
    best: Option<(u32, Vec<(usize, usize)>)>,
    best_possible: u32,
}

impl<'a> Search<'a> {
    fn new(
        model: &'a GpuModel,
        wanted: &BTreeMap<String, u32>,
        existing: &[ExistingInstance],
        partial: bool,
    ) -> Self {
        let mut items: Vec<Item> = wanted
            .iter()
            .filter(|(_, &c)| c > 0)
            .filter_map(|(name, &count)| {
                let profile = model.profile(name)?;
                let existing = profile
                    .placements
                    .iter()
                    .enumerate()
                    .filter(|(_, pl)| {
                        existing
                            .iter()
                            .any(|e| e.profile == profile.name && e.placement == **pl)
                    })
                    .fold(0u64, |bits, (j, _)| bits | 1 << j);
                Some(Item {
                    profile,
                    count,
                    masks: profile.placements.iter().map(|p| p.mask()).collect(),
                    existing,
                })
            })
            .collect();
        // Biggest and most constrained first: they fail fastest.
        items.sort_by(|a, b| {
            (b.profile.slots(), a.masks.len(), &a.profile.name).cmp(&(
                a.profile.slots(),
                b.masks.len(),
                &b.profile.name,
            ))
        });
        let mut keepable_from = vec![0; items.len() + 1];
        for i in (0..items.len()).rev() {
            let cap = items[i].count.min(items[i].existing.count_ones());
            keepable_from[i] = keepable_from[i + 1] + cap;
        }
        let best_possible = if partial {
            items.iter().map(|i| i.count).sum()
        } else {
            keepable_from[0]
        };
        Search {
            items,
            keepable_from,
            partial,
            chosen: Vec::new(),
            best: None,
            best_possible,
        }
    }

    fn done(&self) -> bool {
        matches!(&self.best, Some((score, _)) if *score >= self.best_possible)
    }

    fn run(&mut self) {
        if self.items.is_empty() {
            self.best = Some((0, Vec::new()));
            return;
        }
        let count = self.items[0].count;
        self.place(0, 0, count, 0, 0);
    }

    fn record(&mut self, score: u32) {
        if self.best.as_ref().is_none_or(|(b, _)| score > *b) {
            self.best = Some((score, self.chosen.clone()));
        }
    }

    /// Place `left` more instances of item `i`, using placements from index `from` on.
    fn place(&mut self, i: usize, from: usize, left: u32, used: u32, score: u32) {
        if self.done() {
            return;
        }
        if left == 0 || (self.partial && from >= self.items[i].masks.len()) {
            return self.next_item(i, used, score);
        }
        let bound = if self.partial {
            score + left + self.items[i + 1..].iter().map(|it| it.count).sum::<u32>()
        } else {
            score + left.min(self.items[i].existing.count_ones()) + self.keepable_from[i + 1]
        };
        if matches!(&self.best, Some((b, _)) if bound <= *b) {
            return;
        }
        let n = self.items[i].masks.len();
        for j in from..n {
            if !self.partial && ((n - j) as u32) < left {
                break;
            }
            let mask = self.items[i].masks[j];
            if used & mask != 0 {
                continue;
            }
            let gain = if self.partial {
                1
            } else {
                (self.items[i].existing >> j & 1) as u32
            };
            self.chosen.push((i, j));
            self.place(i, j + 1, left - 1, used | mask, score + gain);
            self.chosen.pop();
            if self.done() {
                return;
            }
        }
        if self.partial {
            // Leave the rest of this profile out.
            self.next_item(i, used, score);
        }
    }

    fn next_item(&mut self, i: usize, used: u32, score: u32) {
        if i + 1 == self.items.len() {
            return self.record(score);
        }
        let count = self.items[i + 1].count;
        self.place(i + 1, 0, count, used, score);
    }

    fn placed(&self, chosen: &[(usize, usize)]) -> Vec<PlacedInstance> {
        let mut out: Vec<PlacedInstance> = chosen
            .iter()
            .map(|&(i, j)| PlacedInstance {
                profile: self.items[i].profile.name.clone(),
                placement: self.items[i].profile.placements[j],
            })
            .collect();
        out.sort_by(|a, b| (a.placement, &a.profile).cmp(&(b.placement, &b.profile)));
        out
    }
}

/// Find the layout for `wanted` (profile name → count) on a GPU of `model` that already holds
/// `existing`, keeping as many existing instances in place as any valid layout can.
pub fn solve(
    model: &GpuModel,
    wanted: &BTreeMap<String, u32>,
    existing: &[ExistingInstance],
) -> Result<Geometry, GeometryError> {
    check_limits(model, wanted)?;
    let mut search = Search::new(model, wanted, existing, false);
    search.run();
    let Some((_, chosen)) = search.best.take() else {
        return Err(explain_no_placement(model, wanted));
    };
    let target = search.placed(&chosen);
    Ok(split_against_existing(target, existing))
}

/// Which existing instances the target keeps, which go, and what is new.
fn split_against_existing(target: Vec<PlacedInstance>, existing: &[ExistingInstance]) -> Geometry {
    let mut geometry = Geometry::default();
    let mut unmatched: Vec<&ExistingInstance> = existing.iter().collect();
    for t in target {
        let same = unmatched
            .iter()
            .position(|e| e.profile == t.profile && e.placement == t.placement);
        match same {
            Some(k) => geometry.keep.push(unmatched.swap_remove(k).clone()),
            None => geometry.create.push(t),
        }
    }
    geometry.destroy = unmatched.into_iter().cloned().collect();
    geometry.keep.sort_by_key(|e| e.placement);
    geometry.destroy.sort_by_key(|e| e.placement);
    geometry
}

fn explain_no_placement(model: &GpuModel, wanted: &BTreeMap<String, u32>) -> GeometryError {
    let mut search = Search::new(model, wanted, &[], true);
    search.run();
    let (fitting, chosen) = search.best.take().unwrap_or_default();
    let starts = search
        .items
        .iter()
        .map(|it| {
            let p = it.profile;
            (
                p.name.clone(),
                p.placements.iter().map(|pl| pl.start).collect(),
                p.slots(),
            )
        })
        .collect();
    GeometryError::NoCoexistingPlacement {
        fitting,
        wanted: wanted.values().sum(),
        example: search.placed(&chosen),
        starts,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mig::catalog::catalog;

    fn want(pairs: &[(&str, u32)]) -> BTreeMap<String, u32> {
        pairs.iter().map(|(n, c)| (n.to_string(), *c)).collect()
    }

    fn at(profile: &str, start: u32, size: u32) -> ExistingInstance {
        ExistingInstance {
            profile: profile.into(),
            placement: Placement { start, size },
            gi_id: None,
        }
    }

    #[test]
    fn a100_3g_plus_two_2g_needs_the_3g_at_slot_4() {
        let a100 = catalog().model("a100-40gb").unwrap();
        let g = solve(a100, &want(&[("3g.20gb", 1), ("2g.10gb", 2)]), &[]).unwrap();
        let t = g.target();
        assert!(t.contains(&PlacedInstance {
            profile: "3g.20gb".into(),
            placement: Placement { start: 4, size: 4 }
        }));
        assert_eq!(t.len(), 3);
    }

    #[test]
    fn a100_4g_plus_two_2g_never_fits_and_says_why() {
        // 4 + 2 × 2 slots fill the 8 memory slots exactly, but 4 + 2 × 2 compute slices exceed 7.
        let a100 = catalog().model("a100-40gb").unwrap();
        let err = solve(a100, &want(&[("4g.20gb", 1), ("2g.10gb", 2)]), &[]).unwrap_err();
        assert_eq!(
            err,
            GeometryError::TooManyComputeSlices {
                wanted: 8,
                available: 7
            }
        );
        assert_eq!(
            err.to_string(),
            "too many compute slices: the instances need 8, the GPU has 7"
        );
    }

    #[test]
    fn placements_that_cannot_coexist_are_explained() {
        // On the real 8-slot tables every count that passes the slice and memory checks can be
        // placed (checked exhaustively for up to 3 of each profile while writing this solver), so
        // this takes an A100 40GB whose 3g.20gb may only start at slot 0: then 3g + 2 × 2g.10gb
        // passes every count but has no layout.
        let mut a100 = catalog().model("a100-40gb").unwrap().clone();
        let three_g = a100
            .gpu_instance_profiles
            .iter_mut()
            .find(|p| p.name == "3g.20gb")
            .unwrap();
        three_g.placements.retain(|p| p.start == 0);
        let err = solve(&a100, &want(&[("3g.20gb", 1), ("2g.10gb", 2)]), &[]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the instances cannot be placed together: 3g.20gb only at slot 0 (4 slots); \
             2g.10gb only at slot 0, 2, 4 (2 slots); at most 2 of the 3 fit at once \
             (e.g. 3g.20gb@0:4 + 2g.10gb@4:2)"
        );
    }

    #[test]
    fn keeps_existing_instances_a_naive_layout_would_move() {
        // A 1g.10gb sits at slot 6 on an H100. The fresh-GPU answer for 3g.40gb + 1g.10gb would be
        // 3g@0 + 1g@4; keeping the 1g where it is must win instead.
        let h100 = catalog().model("h100").unwrap();
        let existing = [at("1g.10gb", 6, 1)];
        let g = solve(h100, &want(&[("3g.40gb", 1), ("1g.10gb", 1)]), &existing).unwrap();
        assert_eq!(g.keep, existing.to_vec());
        assert!(g.destroy.is_empty());
        assert_eq!(g.create[0].placement, Placement { start: 0, size: 4 });
    }
}
