//! Dynamic MIG figures (docs/dra.md, "Dynamic MIG"; benches/README.md, "dynamic_mig"), in three
//! parts, each a module:
//!
//! - [`order`]: the same random stream of MIG claims, allocated first fit (the way
//!   kube-scheduler's DRA allocator does: first listed device whose counters are free; the
//!   model is `gpu_share::dra::dynamic::first_fit`, checked against the real scheduler on the
//!   test bed) over the devices as gpu-share lists them and over the catalog's order.
//! - [`versus_static`]: one stream of claims of mixed MIG shapes on N H100s, served by dynamic
//!   MIG, by the static geometry `advise` picks for the stream, and by a fixed `all-1g.10gb`:
//!   claims refused and GPUs used.
//! - [`prepare`]: a claim prepared → its MIG device ready, through the real agent (`--plugin
//!   dra`, the simulated kubelet's gRPC call, the fake NVML), p50/p99, beside the NVML creates
//!   and destroys of the same instances alone.
//!
//! `cargo bench --bench dynamic_mig` prints Markdown tables. Knobs: `GPU_SHARE_BENCH_CLAIMS`
//! (200000), `GPU_SHARE_BENCH_GPUS` (8), `GPU_SHARE_BENCH_PREPARES` (400),
//! `GPU_SHARE_BENCH_PARTS` (`order,static,prepare`).

#[path = "figures.rs"]
mod figures;
#[path = "dynamic_mig/order.rs"]
mod order;
#[path = "dynamic_mig/prepare.rs"]
mod prepare;
#[path = "dynamic_mig/versus_static.rs"]
mod versus_static;

use std::collections::BTreeMap;
use std::time::Instant;

use figures::knob;

use gpu_share::dra::api::{Device, ResourceSlice};
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

/// A seeded xorshift64: the same stream on every run and for every policy compared.
struct Rng(u64);

impl Rng {
    fn new() -> Rng {
        Rng(0x9e37_79b9_7f4a_7c15)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in (0, 1].
    fn unit(&mut self) -> f64 {
        ((self.next() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    /// A profile of `mix`, by weight.
    fn profile(&mut self, mix: &[(String, u32)]) -> String {
        let total: u64 = mix.iter().map(|(_, w)| u64::from(*w)).sum();
        let mut pick = self.next() % total;
        for (profile, weight) in mix {
            if pick < u64::from(*weight) {
                return profile.clone();
            }
            pick -= u64::from(*weight);
        }
        unreachable!("pick < total")
    }
}

/// The slices a node of `gpus` × `model` publishes for profile `text` (`plan --plugin dra`).
fn slices_for(model: &GpuModel, gpus: u64, text: &str) -> Vec<ResourceSlice> {
    let profile = parse_profile("bench", text).unwrap();
    let node = ObservedNode::simulated(&vec![model.key.clone(); gpus as usize]);
    let plan = plan_for("bench", &profile, &node, PluginKind::Dra)
        .unwrap_or_else(|p| panic!("{text} does not plan: {p:?}"));
    resource_slices_with("node", 1, &plan.gpus, &node, &ClaimedInstances::default())
}

/// The slices of a node of dynamic GPUs, each GPU's devices in `order`.
fn slices(model: &GpuModel, gpus: u64, order: Order) -> Vec<ResourceSlice> {
    let mut slices = slices_for(model, gpus, DYNAMIC);
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

/// Every device of `slices`, in listing order.
fn devices(slices: &[ResourceSlice]) -> impl Iterator<Item = &Device> {
    slices.iter().flat_map(|s| s.spec.devices.iter())
}

fn main() {
    let parts =
        std::env::var("GPU_SHARE_BENCH_PARTS").unwrap_or_else(|_| "order,static,prepare".into());
    let claims = knob("GPU_SHARE_BENCH_CLAIMS", 200_000u64);
    let gpus = knob("GPU_SHARE_BENCH_GPUS", 8u64);
    // The prepare part first: it points this process's fake NVML at its own state before any
    // thread starts (the library reads FAKE_NVML_STATE from the environment).
    if parts.contains("prepare") {
        prepare::report(knob("GPU_SHARE_BENCH_PREPARES", 400));
    }
    if parts.contains("order") {
        order::report(claims, gpus);
    }
    if parts.contains("static") {
        versus_static::report(claims, gpus);
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
