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

// Only its knobs: this harness prints no percentiles.
#[allow(dead_code)]
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

/// Inference tenants: embedding and small models up to 70 billion parameters (many small, few
/// large), in FP16, INT8 or INT4. Memory: the weights plus 20 % for KV cache and activations plus
/// a 512 MiB CUDA context. Compute: what serving the model at a modest request rate takes, by
/// size (5 % of an H100 up to 3B parameters, 10 % at 7-8B, 15 % at 13-14B, 25 % at 32B, 35 % at
/// 70B), times a load factor of ½, 1 or 1½, at least 5 %.
fn trace(seed: u64, n: usize) -> Vec<Tenant> {
    let mut rng = Rng(seed | 1);
    // (billions of parameters, compute percent at load 1), weight in the mix.
    let models: &[((f64, f64), u64)] = &[
        ((0.3, 5.0), 10),
        ((1.5, 5.0), 15),
        ((3.0, 5.0), 15),
        ((7.0, 10.0), 20),
        ((8.0, 10.0), 15),
        ((13.0, 15.0), 8),
        ((14.0, 15.0), 7),
        ((32.0, 25.0), 6),
        ((70.0, 35.0), 4),
    ];
    let precisions: &[(f64, u64)] = &[(2.0, 40), (1.0, 30), (0.5, 30)];
    let loads: &[(f64, u64)] = &[(0.5, 30), (1.0, 40), (1.5, 30)];
    (0..n)
        .map(|_| {
            let (params, compute) = rng.pick(models);
            let bytes = rng.pick(precisions);
            let load = rng.pick(loads);
            let weights_gib = params * bytes;
            Tenant {
                memory_mib: (weights_gib * 1.2 * 1024.0) as u64 + 512,
                compute_percent: ((compute * load).round() as u64).max(5),
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

/// The best fixed count for `tenants`: most served, and most served with no GPU
/// over-committed (fewer replicas on a tie).
fn best_fixed(
    tenants: &[Tenant],
    gpus: usize,
    memory_mib: u64,
) -> ((u64, Outcome), Option<(u64, Outcome)>) {
    let all: Vec<(u64, Outcome)> = (1..=48)
        .map(|r| (r, fixed(tenants, gpus, r, memory_mib)))
        .collect();
    let key = |(r, o): &&(u64, Outcome)| (o.served, std::cmp::Reverse(*r));
    let best = all
        .iter()
        .max_by_key(key)
        .cloned()
        .expect("48 counts tried");
    let safe = all
        .iter()
        .filter(|(_, o)| o.over_committed_gpus == 0)
        .max_by_key(key)
        .cloned();
    (best, safe)
}

fn main() {
    let gpus: usize = knob("GPU_SHARE_BENCH_GPUS", 8);
    let n: usize = knob("GPU_SHARE_BENCH_TENANTS", 2000);
    let seed: u64 = knob("GPU_SHARE_BENCH_SEED", 0x005e_edf4_ac71_04a1_u64);
    let tenants = trace(seed, n);
    let memory_mib = gpu_memory_mib();
    println!(
        "fractional: tenants of one trace (seed {seed:#x}) on {gpus} × H100 ({memory_mib} MiB each); \
         mean ask {:.1} GiB, {:.1} % compute",
        tenants.iter().map(|t| t.memory_mib).sum::<u64>() as f64 / n as f64 / 1024.0,
        tenants.iter().map(|t| t.compute_percent).sum::<u64>() as f64 / n as f64
    );

    let profile = parse_profile("bench", PROFILE).expect("the bench profile parses");
    let node = ObservedNode::simulated(&[format!("h100x{gpus}")]);
    let plan = plan_for("bench", &profile, &node, PluginKind::Dra).expect("it plans");
    let devices: Vec<Device> = resource_slices("bench", 1, &plan.gpus, &node)
        .into_iter()
        .flat_map(|s| s.spec.devices)
        .collect();
    assert!(devices.iter().all(Device::is_consumable));

    // Demand: the trace's first tenants, as many as ask for this multiple of the GPUs' memory.
    let total_mib = memory_mib * gpus as u64;
    println!();
    println!(
        "| demand (asked memory / GPU memory) | tenants | fixed MPS, most served (count) | fixed MPS, none over-committed (count) | consumable capacity | consumable / fixed none over-committed | memory stranded: fixed none over-committed / consumable | GPUs over-committed: fixed most served / consumable |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for level in [0.5, 1.0, 1.5, 2.0, 4.0] {
        let mut asked = 0u64;
        let count = tenants
            .iter()
            .take_while(|t| {
                let under = (asked as f64) < level * total_mib as f64;
                asked += t.memory_mib;
                under
            })
            .count();
        let offered = &tenants[..count];
        let ((r, best), safe) = best_fixed(offered, gpus, memory_mib);
        let shared = consumable(offered, &devices, memory_mib);
        let (safe_text, ratio, stranded) = match &safe {
            Some((sr, so)) => (
                format!("{} (× {sr})", so.served),
                format!("{:.2}×", shared.served as f64 / so.served.max(1) as f64),
                format!("{:.0} / {:.0} GiB", so.stranded_gib, shared.stranded_gib),
            ),
            None => ("none".into(), "-".into(), "-".into()),
        };
        println!(
            "| {level}× | {count} | {} (× {r}) | {safe_text} | {} | {ratio} | {stranded} | {} / {} |",
            best.served, shared.served, best.over_committed_gpus, shared.over_committed_gpus
        );
    }
}
