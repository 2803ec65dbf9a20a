//! Dynamic MIG packing: the same random stream of MIG claims, allocated first fit (the way
//! kube-scheduler's DRA allocator does: first listed device whose counters are free; the model
//! is `gpu_share::dra::dynamic::first_fit`, checked against the real scheduler on the test bed)
//! over the devices as gpu-share lists them (first-fit order) and over the catalog's order. The
//! difference is fragmentation: a small instance placed where a large one would go.
//!
//! `cargo bench --bench dynamic_mig` prints, per model and order, the claims refused while the
//! node had enough free memory slices for them (refused only because of where earlier ones were
//! put), by profile, and the mean share of slices in use. Knobs: `GPU_SHARE_BENCH_CLAIMS`
//! (200000), `GPU_SHARE_BENCH_GPUS` (8).

use std::collections::BTreeMap;
use std::time::Instant;

use gpu_share::dra::api::ResourceSlice;
use gpu_share::dra::dynamic::first_fit::{mig_profile, Pool};
use gpu_share::dra::dynamic::{placements, ClaimedInstances, Order};
use gpu_share::dra::resource_slices_with;
use gpu_share::gpu::ObservedNode;
use gpu_share::mig::{catalog, GpuModel};
use gpu_share::plan::plan_for;
use gpu_share::profile::parse_profile;
use gpu_share::sharing::PluginKind;

const DYNAMIC: &str = "version: v1\nrules:\n  - devices: all\n    dynamicMig: true\n";

/// Claim mix by profile slot size: many small, few large (inference tenants).
fn mix(model: &GpuModel) -> Vec<(String, u32)> {
    let weight = |slices: u32| match slices {
        1 => 40,
        2 => 20,
        3 => 15,
        4 => 10,
        _ => 5,
    };
    model
        .gpu_instance_profiles
        .iter()
        .filter(|p| !p.name.contains("+me"))
        .map(|p| (p.name.clone(), weight(p.slice_count)))
        .collect()
}

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn slices(model: &GpuModel, gpus: u64, order: Order) -> Vec<ResourceSlice> {
    let profile = parse_profile("dyn", DYNAMIC).unwrap();
    let node = ObservedNode::simulated(&vec![model.key.clone(); gpus as usize]);
    let plan = plan_for("dyn", &profile, &node, PluginKind::Dra).unwrap();
    let mut slices =
        resource_slices_with("node", 1, &plan.gpus, &node, &ClaimedInstances::default());
    if order == Order::Catalog {
        // The same devices, each GPU's in catalog order (profile, then placement start).
        let rank: BTreeMap<(String, u32), usize> = placements(model, Order::Catalog)
            .into_iter()
            .enumerate()
            .map(|(k, (p, placement))| ((p.name.clone(), placement.start), k))
            .collect();
        for slice in &mut slices {
            slice.spec.devices.sort_by_key(|d| {
                let a = &d.attributes;
                let gpu = a["parentIndex"].int.unwrap();
                let key = a.get("migProfile").map(|p| {
                    let start = a["migPlacementStart"].int.unwrap() as u32;
                    rank[&(p.string.clone().unwrap(), start)]
                });
                (gpu, key.unwrap_or(usize::MAX))
            });
        }
    }
    slices
}

struct Outcome {
    refused: BTreeMap<String, u64>,
    refused_with_room: BTreeMap<String, u64>,
    asked: BTreeMap<String, u64>,
    mean_use: f64,
}

fn run(model: &GpuModel, gpus: u64, order: Order, claims: u64) -> Outcome {
    let slices = slices(model, gpus, order);
    let mut pool = Pool::new(&slices);
    let mix = mix(model);
    let total_weight: u64 = mix.iter().map(|(_, w)| *w as u64).sum();
    let slots = |name: &str| model.profile(name).unwrap().slots() as u64;
    let capacity = gpus * model.memory_slots as u64;
    let mut held: Vec<(String, String)> = Vec::new();
    let mut used = 0u64;
    let mut use_sum = 0f64;
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut out = Outcome {
        refused: BTreeMap::new(),
        refused_with_room: BTreeMap::new(),
        asked: BTreeMap::new(),
        mean_use: 0.0,
    };
    for _ in 0..claims {
        // A claim ends now and then, so the node churns near full.
        while !held.is_empty() && next() % 100 < 45 {
            let (device, profile) = held.swap_remove((next() % held.len() as u64) as usize);
            pool.release(&device);
            used -= slots(&profile);
        }
        let mut pick = next() % total_weight;
        let profile = mix
            .iter()
            .find(|(_, w)| {
                let hit = pick < *w as u64;
                pick = pick.saturating_sub(*w as u64);
                hit
            })
            .map(|(p, _)| p.clone())
            .unwrap();
        *out.asked.entry(profile.clone()).or_default() += 1;
        match pool.allocate(mig_profile(&profile)) {
            Some(device) => {
                used += slots(&profile);
                held.push((device, profile));
            }
            None => {
                *out.refused.entry(profile.clone()).or_default() += 1;
                if capacity - used >= slots(&profile) {
                    *out.refused_with_room.entry(profile).or_default() += 1;
                }
            }
        }
        use_sum += used as f64 / capacity as f64;
    }
    out.mean_use = use_sum / claims as f64;
    out
}

fn main() {
    let claims = env("GPU_SHARE_BENCH_CLAIMS", 200_000);
    let gpus = env("GPU_SHARE_BENCH_GPUS", 8);
    println!("# dynamic MIG packing: {claims} claims, {gpus} GPUs, first fit\n");
    for key in ["h100-80gb-sxm", "a30-24gb", "rtx-pro-6000-blackwell"] {
        let model = catalog().model(key).unwrap();
        let started = Instant::now();
        let ours = run(model, gpus, Order::FirstFit, claims);
        let theirs = run(model, gpus, Order::Catalog, claims);
        println!(
            "## {} ({:.1} s)\n",
            model.nvml_name,
            started.elapsed().as_secs_f64()
        );
        println!("| profile | asked | refused, first-fit order | refused, catalog order | of which with room: first-fit / catalog |");
        println!("|---|---|---|---|---|");
        for (profile, asked) in &ours.asked {
            let get = |m: &BTreeMap<String, u64>| m.get(profile).copied().unwrap_or(0);
            println!(
                "| {profile} | {asked} | {} | {} | {} / {} |",
                get(&ours.refused),
                get(&theirs.refused),
                get(&ours.refused_with_room),
                get(&theirs.refused_with_room)
            );
        }
        let sum = |m: &BTreeMap<String, u64>| m.values().sum::<u64>();
        println!(
            "| **all** | {} | {} | {} | {} / {} |",
            sum(&ours.asked),
            sum(&ours.refused),
            sum(&theirs.refused),
            sum(&ours.refused_with_room),
            sum(&theirs.refused_with_room)
        );
        println!(
            "\nmean memory slices in use: {:.1} % first-fit order, {:.1} % catalog order; refused with room: catalog / first-fit = {:.2}\n",
            ours.mean_use * 100.0,
            theirs.mean_use * 100.0,
            sum(&theirs.refused_with_room) as f64 / sum(&ours.refused_with_room).max(1) as f64
        );
    }
    // What a publish costs: the slices of a node of 8 dynamic H200s.
    let model = catalog().model("h200-141gb").unwrap();
    let started = Instant::now();
    let n = 1000;
    for _ in 0..n {
        std::hint::black_box(slices(model, 8, Order::FirstFit));
    }
    println!(
        "plan + slices of 8 dynamic H200s: {:.0} µs each ({n} runs)",
        started.elapsed().as_secs_f64() * 1e6 / n as f64
    );
}
