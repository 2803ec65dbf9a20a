//! Fractional GPUs against fixed MPS shares (docs/dra.md, "Fractional GPUs"; benches/README.md,
//! "fractional"): one seeded trace of inference tenants, each a model of some size and
//! precision with the memory and compute it needs, placed in arrival order on N H100s
//!
//! - (a) with fixed MPS replicas, every count from 1 to 48 tried and the best one kept: each
//!   GPU is R shares of `memory / R` (`pinnedMemoryLimit: auto`); a tenant is placed on a free
//!   share only when it fits that share's memory (a generous baseline: users pick the resource
//!   whose share fits); compute is not enforced per share, so a GPU whose tenants need more
//!   than 100 % of it is over-committed;
//! - (b) with consumable capacity: each GPU is the device gpu-share publishes for
//!   `mps: {replicas: 48, consumable: ...}`, each tenant's claim asks for its memory and compute
//!   (`capacity: {requests: {memory, compute}}`), and the first device where the share fits is
//!   taken, with the scheduler's rounding and fit test (the port in
//!   tests/node-sim/src/consumable_scheduler.rs of consumable_capacity.go).
//!
//! Printed: tenants served, GPU memory not used by a served tenant (stranded: held by a share
//! beyond its tenant's need, or never handed out), over-commits (GPUs whose tenants need more
//! memory or compute than the GPU has), and the ratio of tenants served. The goal (issue 36):
//! ≥ 1.5× the tenants of the best fixed count, 0 over-commits.
//!
//! `cargo bench --bench fractional`. Knobs: `GPU_SHARE_BENCH_GPUS` (8),
//! `GPU_SHARE_BENCH_TENANTS` (600), `GPU_SHARE_BENCH_SEED` (printed).

#[path = "figures.rs"]
mod figures;

use std::collections::BTreeMap;

use figures::knob;
use gpu_share::dra::api::Device;
use gpu_share::dra::resource_slices;
use gpu_share::gpu::ObservedNode;
use gpu_share::plan::plan_for;
use gpu_share::profile::parse_profile;
use gpu_share::sharing::PluginKind;
use node_sim::consumable_scheduler::{consumed_capacity, fits, Consumed};

const PROFILE: &str = "version: v1
rules:
  - devices: all
    mps:
      replicas: 48
      consumable:
        memory: {default: 4Gi, min: 1Gi, step: 1Gi}
        compute: {default: 10, min: 5, step: 5}
";

/// One tenant: the memory (MiB) and compute (percent of an H100's SMs) it needs.
#[derive(Debug, Clone, Copy)]
struct Tenant {
    memory_mib: u64,
    compute_percent: u64,
}

/// A seeded xorshift64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn pick<T: Copy>(&mut self, weighted: &[(T, u64)]) -> T {
        let total: u64 = weighted.iter().map(|(_, w)| w).sum();
        let mut r = self.next() % total;
        for (item, w) in weighted {
            if r < *w {
                return *item;
            }
            r -= w;
        }
        weighted[0].0
    }
}

/// Inference tenants: models from 0.5 to 70 billion parameters (many small, few large), in
/// FP16, INT8 or INT4. Memory: the weights plus 30 % for KV cache and activations plus a 600 MiB
/// CUDA context. Compute: what serving the model at a modest request rate takes, growing with
/// the weights read per token, between 5 % and 60 % of an H100, times a load factor of ½ to 2.
fn trace(seed: u64, n: usize) -> Vec<Tenant> {
    let mut rng = Rng(seed | 1);
    let models: &[(f64, u64)] = &[
        (0.5, 10),
        (1.5, 15),
        (3.0, 15),
        (7.0, 20),
        (8.0, 15),
        (13.0, 8),
        (14.0, 7),
        (32.0, 5),
        (70.0, 5),
    ];
    let precisions: &[(f64, u64)] = &[(2.0, 40), (1.0, 35), (0.5, 25)];
    let loads: &[(f64, u64)] = &[(0.5, 30), (1.0, 40), (2.0, 30)];
    (0..n)
        .map(|_| {
            let params = rng.pick(models);
            let bytes = rng.pick(precisions);
            let load = rng.pick(loads);
            let weights_gib = params * bytes;
            let memory_mib = (weights_gib * 1.3 * 1024.0) as u64 + 600;
            let compute = (5.0 + weights_gib * 0.8) * load;
            Tenant {
                memory_mib,
                compute_percent: (compute.round() as u64).clamp(5, 60),
            }
        })
        .collect()
}

/// What a placement policy achieved on the trace.
#[derive(Debug, Default, Clone)]
struct Outcome {
    served: usize,
    /// GiB of GPU memory not used by a served tenant.
    stranded_gib: f64,
    /// GPUs whose tenants need more memory or compute than the GPU has.
    over_committed_gpus: usize,
}

fn gpu_memory_mib() -> u64 {
    let node = ObservedNode::simulated(&["h100x1".to_string()]);
    node.gpus[0]
        .memory_mib
        .expect("the catalog knows an H100's memory")
}

/// (a): `replicas` fixed shares per GPU, a tenant placed on the first free share it fits.
fn fixed(tenants: &[Tenant], gpus: usize, replicas: u64, memory_mib: u64) -> Outcome {
    let share_mib = memory_mib / replicas;
    let mut on_gpu: Vec<Vec<Tenant>> = vec![Vec::new(); gpus];
    for tenant in tenants {
        if tenant.memory_mib > share_mib {
            continue;
        }
        if let Some(gpu) = on_gpu.iter_mut().find(|t| (t.len() as u64) < replicas) {
            gpu.push(*tenant);
        }
    }
    outcome(&on_gpu, memory_mib)
}

/// (b): every GPU the consumable device gpu-share publishes; each tenant asks its needs and
/// gets a share of the first device where the scheduler's fit test passes.
fn consumable(tenants: &[Tenant], devices: &[Device], memory_mib: u64) -> Outcome {
    let mut held: Vec<Vec<Consumed>> = vec![Vec::new(); devices.len()];
    let mut on_gpu: Vec<Vec<Tenant>> = vec![Vec::new(); devices.len()];
    let mut over = 0;
    for tenant in tenants {
        let asks = BTreeMap::from([
            ("memory".to_string(), format!("{}Mi", tenant.memory_mib)),
            ("compute".to_string(), tenant.compute_percent.to_string()),
        ]);
        for (k, device) in devices.iter().enumerate() {
            let Ok(consumed) = consumed_capacity(device, &asks) else {
                continue;
            };
            if fits(device, &held[k], &consumed).is_ok() {
                held[k].push(consumed);
                on_gpu[k].push(*tenant);
                break;
            }
        }
    }
    // What was handed out never exceeds a device: checked, not assumed.
    for (k, device) in devices.iter().enumerate() {
        if fits(
            device,
            &held[k][..held[k].len().saturating_sub(1)],
            held[k].last().unwrap_or(&Consumed::new()),
        )
        .is_err()
        {
            over += 1;
        }
    }
    let mut result = outcome(&on_gpu, memory_mib);
    result.over_committed_gpus += over;
    result
}

fn outcome(on_gpu: &[Vec<Tenant>], memory_mib: u64) -> Outcome {
    let served: usize = on_gpu.iter().map(Vec::len).sum();
    let used: u64 = on_gpu.iter().flatten().map(|t| t.memory_mib).sum();
    let over = on_gpu
        .iter()
        .filter(|ts| {
            ts.iter().map(|t| t.memory_mib).sum::<u64>() > memory_mib
                || ts.iter().map(|t| t.compute_percent).sum::<u64>() > 100
        })
        .count();
    Outcome {
        served,
        stranded_gib: (memory_mib * on_gpu.len() as u64 - used) as f64 / 1024.0,
        over_committed_gpus: over,
    }
}

fn main() {
    let gpus: usize = knob("GPU_SHARE_BENCH_GPUS", 8);
    let n: usize = knob("GPU_SHARE_BENCH_TENANTS", 600);
    let seed: u64 = knob("GPU_SHARE_BENCH_SEED", 0x5eed_f4ac_7104_a1u64);
    let tenants = trace(seed, n);
    let memory_mib = gpu_memory_mib();
    println!(
        "fractional: {n} tenants (seed {seed:#x}) on {gpus} × H100 ({memory_mib} MiB each); \
         mean ask {:.1} GiB, {:.1} % compute",
        tenants.iter().map(|t| t.memory_mib).sum::<u64>() as f64 / n as f64 / 1024.0,
        tenants.iter().map(|t| t.compute_percent).sum::<u64>() as f64 / n as f64
    );

    let (best_replicas, best) = (1..=48)
        .map(|r| (r, fixed(&tenants, gpus, r, memory_mib)))
        .max_by_key(|(r, o)| (o.served, std::cmp::Reverse(*r)))
        .expect("48 counts tried");
    let best_safe = (1..=48)
        .map(|r| (r, fixed(&tenants, gpus, r, memory_mib)))
        .filter(|(_, o)| o.over_committed_gpus == 0)
        .max_by_key(|(r, o)| (o.served, std::cmp::Reverse(*r)));

    let profile = parse_profile("bench", PROFILE).expect("the bench profile parses");
    let node = ObservedNode::simulated(&[format!("h100x{gpus}")]);
    let plan = plan_for("bench", &profile, &node, PluginKind::Dra).expect("it plans");
    let devices: Vec<Device> = resource_slices("bench", 1, &plan.gpus, &node)
        .into_iter()
        .flat_map(|s| s.spec.devices)
        .collect();
    assert!(devices.iter().all(Device::is_consumable));
    let shared = consumable(&tenants, &devices, memory_mib);

    println!();
    println!("| placement | tenants served | memory stranded | GPUs over-committed |");
    println!("|---|---|---|---|");
    let total_gib = (memory_mib * gpus as u64) as f64 / 1024.0;
    let row = |name: String, o: &Outcome| {
        println!(
            "| {name} | {} | {:.0} GiB ({:.0} %) | {} |",
            o.served,
            o.stranded_gib,
            100.0 * o.stranded_gib / total_gib,
            o.over_committed_gpus
        );
    };
    row(format!("fixed MPS × {best_replicas} (most served)"), &best);
    if let Some((r, o)) = &best_safe {
        if *r != best_replicas {
            row(
                format!("fixed MPS × {r} (most served, none over-committed)"),
                o,
            );
        }
    }
    row("consumable capacity, first fit".into(), &shared);
    println!();
    println!(
        "ratio: consumable serves {:.2}× the tenants of the best fixed count (× {best_replicas}); \
         over-commits: {} (consumable) vs {} (fixed)",
        shared.served as f64 / best.served.max(1) as f64,
        shared.over_committed_gpus,
        best.over_committed_gpus
    );
}
