//! First fit over gpu-share's device order against the catalog's order: the difference is
//! fragmentation, a small instance placed where a large one would go. Per model and order it
//! prints the claims refused while the node had enough free memory slices for them (refused
//! only because of where earlier ones were put), by profile, and the mean share of slices in
//! use.

use std::collections::BTreeMap;
use std::time::Instant;

use gpu_share::dra::dynamic::first_fit::{mig_profile, Pool};
use gpu_share::dra::dynamic::Order;
use gpu_share::mig::{catalog, GpuModel};

use crate::{mix, slices, Rng};

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
    let slots = |name: &str| model.profile(name).unwrap().slots() as u64;
    let capacity = gpus * model.memory_slots as u64;
    let mut held: Vec<(String, String)> = Vec::new();
    let mut used = 0u64;
    let mut use_sum = 0f64;
    let mut rng = Rng::new();
    let mut out = Outcome {
        refused: BTreeMap::new(),
        refused_with_room: BTreeMap::new(),
        asked: BTreeMap::new(),
        mean_use: 0.0,
    };
    for _ in 0..claims {
        // A claim ends now and then, so the node churns near full.
        while !held.is_empty() && rng.next() % 100 < 45 {
            let (device, profile) = held.swap_remove((rng.next() % held.len() as u64) as usize);
            pool.release(&device);
            used -= slots(&profile);
        }
        let profile = rng.profile(&mix);
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

pub fn report(claims: u64, gpus: u64) {
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
}
