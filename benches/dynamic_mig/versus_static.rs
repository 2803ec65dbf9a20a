//! Dynamic MIG against static geometries, on one stream of claims of mixed MIG shapes on N
//! H100s: one claim arrives per step, each holds its device for a random (exponential)
//! lifetime, and the mean lifetime sets the offered load (the memory slices the claims would
//! hold if none were refused). The stream is drawn once and played against each policy:
//!
//! - **dynamic**: every GPU `dynamicMig: true`; a claim takes the first listed placement of
//!   its profile whose counters are free (kube-scheduler's first fit, `first_fit::Pool`).
//! - **advise**: the static geometry `gpu-share advise` proposes for the stream: its demand is
//!   the stream's mean concurrent claims per profile, scaled so the node's memory slices are
//!   all asked for (the stream's mix at the node's size); advise picks the instances.
//! - **all-1g.10gb**: every GPU seven 1g.10gb (what a node gets when one profile is fixed).
//!
//! A static claim takes the first free instance of its profile, as the scheduler does. "GPUs
//! holding a claim" is the mean over steps of the GPUs with at least one claim on them; a
//! dynamic GPU holding none is a whole GPU again (its MIG devices are never made), a static
//! GPU stays partitioned.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use gpu_share::advise::{advise, Demand, Phase, PodDemand, Supply, SupplyNode};
use gpu_share::dra::api::ResourceSlice;
use gpu_share::dra::dynamic::first_fit::{mig_profile, Pool};
use gpu_share::mig::{catalog, GpuModel};
use gpu_share::sharing::PluginKind;

use crate::{devices, mix, slices_for, Rng, DYNAMIC};

/// One claim of the stream: its profile and how many steps it holds its device.
struct Claim {
    profile: String,
    lifetime: u64,
}

/// `claims` arrivals whose lifetimes make the offered load `load` of the node's memory slices.
fn stream(model: &GpuModel, gpus: u64, claims: u64, load: f64) -> Vec<Claim> {
    let mix = mix(model);
    let total: f64 = mix.iter().map(|(_, w)| f64::from(*w)).sum();
    let mean_slots: f64 = mix
        .iter()
        .map(|(p, w)| f64::from(*w) / total * f64::from(model.profile(p).unwrap().slots()))
        .sum();
    let capacity = (gpus * u64::from(model.memory_slots)) as f64;
    let mean_life = load * capacity / mean_slots;
    let mut rng = Rng::new();
    (0..claims)
        .map(|_| Claim {
            profile: rng.profile(&mix),
            lifetime: (-rng.unit().ln() * mean_life).ceil().max(1.0) as u64,
        })
        .collect()
}

struct Played {
    refused: BTreeMap<String, u64>,
    mean_busy_gpus: f64,
    peak_busy_gpus: usize,
}

/// Play `stream` on the pool `slices` publish.
fn play(slices: &[ResourceSlice], gpus: u64, stream: &[Claim]) -> Played {
    let gpu_of: BTreeMap<String, usize> = devices(slices)
        .map(|d| {
            (
                d.name.clone(),
                d.attributes["parentIndex"].int.unwrap() as usize,
            )
        })
        .collect();
    let mut pool = Pool::new(slices);
    let mut ends: BinaryHeap<Reverse<(u64, String)>> = BinaryHeap::new();
    let mut on_gpu = vec![0u32; gpus as usize];
    let mut out = Played {
        refused: BTreeMap::new(),
        mean_busy_gpus: 0.0,
        peak_busy_gpus: 0,
    };
    let mut busy_sum = 0u64;
    for (now, claim) in stream.iter().enumerate() {
        let now = now as u64;
        while ends.peek().is_some_and(|Reverse((end, _))| *end <= now) {
            let Reverse((_, device)) = ends.pop().unwrap();
            pool.release(&device);
            on_gpu[gpu_of[&device]] -= 1;
        }
        match pool.allocate(mig_profile(&claim.profile)) {
            Some(device) => {
                on_gpu[gpu_of[&device]] += 1;
                ends.push(Reverse((now + claim.lifetime, device)));
            }
            None => *out.refused.entry(claim.profile.clone()).or_default() += 1,
        }
        let busy = on_gpu.iter().filter(|&&n| n > 0).count();
        busy_sum += busy as u64;
        out.peak_busy_gpus = out.peak_busy_gpus.max(busy);
    }
    out.mean_busy_gpus = busy_sum as f64 / stream.len() as f64;
    out
}

/// The profile advise proposes for the stream's mix at the node's size, and the pods of that
/// demand it could not place.
fn advised(model: &GpuModel, gpus: u64, stream: &[Claim]) -> (String, usize) {
    let mut held: BTreeMap<&str, f64> = BTreeMap::new();
    for claim in stream {
        *held.entry(&claim.profile).or_default() += claim.lifetime as f64;
    }
    let slots = |p: &str| f64::from(model.profile(p).unwrap().slots());
    let used: f64 = held
        .iter()
        .map(|(p, t)| t / stream.len() as f64 * slots(p))
        .sum();
    let scale = (gpus * u64::from(model.memory_slots)) as f64 / used;
    let mut pods = Vec::new();
    for (profile, time) in &held {
        let count = (time / stream.len() as f64 * scale).round() as usize;
        for k in 0..count {
            pods.push(PodDemand {
                namespace: "bench".into(),
                name: format!("{profile}-{k}"),
                node: None,
                phase: Phase::Pending,
                requests: [(format!("nvidia.com/mig-{profile}"), 1)].into(),
                annotations: BTreeMap::new(),
                devices: Vec::new(),
            });
        }
    }
    let supply = Supply {
        nodes: vec![SupplyNode {
            name: "node".into(),
            gpus: vec![format!("{}x{gpus}", model.key)],
            current: None,
            profile_name: None,
            profile: None,
        }],
    };
    let advice = advise(&Demand { pods }, &supply, PluginKind::Dra)
        .unwrap_or_else(|e| panic!("advise refused the bench's demand: {e:?}"));
    let profile = serde_yaml::to_string(&advice.nodes[0].profile).unwrap();
    (profile, advice.totals.unschedulable_pods)
}

/// The MIG instances a static profile makes on the node, by profile: `3 × 3g.40gb, …`.
fn geometry(slices: &[ResourceSlice]) -> String {
    let mut count: BTreeMap<String, usize> = BTreeMap::new();
    for d in devices(slices) {
        if let Some(p) = d
            .attributes
            .get("migProfile")
            .and_then(|a| a.string.clone())
        {
            *count.entry(p).or_default() += 1;
        }
    }
    count
        .iter()
        .map(|(p, n)| format!("{n} × {p}"))
        .collect::<Vec<_>>()
        .join(", ")
}

pub fn report(claims: u64, gpus: u64) {
    let model = catalog().model("h100-80gb-sxm").unwrap();
    println!(
        "# dynamic MIG against static geometries: {claims} claims, {gpus} × {}\n",
        model.nvml_name
    );
    let all_1g = "version: v1\nrules:\n  - devices: all\n    mig: {1g.10gb: 7}\n";
    for load in [0.5, 0.9] {
        let stream = stream(model, gpus, claims, load);
        let (advised, unplaced) = advised(model, gpus, &stream);
        let policies = [
            ("dynamic", slices_for(model, gpus, DYNAMIC)),
            ("advise", slices_for(model, gpus, &advised)),
            ("all-1g.10gb", slices_for(model, gpus, all_1g)),
        ];
        println!(
            "## offered load {:.0} % of the memory slices\n",
            load * 100.0
        );
        println!("| policy | static instances | claims refused | refused % | of them 1g.10gb | GPUs holding a claim: mean / peak | GPUs partitioned |");
        println!("|---|---|---|---|---|---|---|");
        for (name, slices) in &policies {
            let played = play(slices, gpus, &stream);
            let refused: u64 = played.refused.values().sum();
            let partitioned = if *name == "dynamic" {
                format!("{:.1} (mean)", played.mean_busy_gpus)
            } else {
                let mut parents: Vec<i64> = devices(slices)
                    .filter(|d| d.attributes.contains_key("migProfile"))
                    .map(|d| d.attributes["parentIndex"].int.unwrap())
                    .collect();
                parents.dedup();
                parents.len().to_string()
            };
            println!(
                "| {name} | {} | {refused} | {:.1} % | {} | {:.1} / {} | {partitioned} |",
                if *name == "dynamic" {
                    "made per claim".to_string()
                } else {
                    geometry(slices)
                },
                refused as f64 * 100.0 / claims as f64,
                played.refused.get("1g.10gb").copied().unwrap_or(0),
                played.mean_busy_gpus,
                played.peak_busy_gpus,
            );
        }
        let mut asked: BTreeMap<&str, u64> = BTreeMap::new();
        for claim in &stream {
            *asked.entry(&claim.profile).or_default() += 1;
        }
        let asked: Vec<String> = asked.iter().map(|(p, n)| format!("{p} {n}")).collect();
        println!(
            "\nasked, by profile: {}; advise's demand (the stream's mean mix at the node's size) left {unplaced} pods unplaced\n",
            asked.join(", ")
        );
    }
}
