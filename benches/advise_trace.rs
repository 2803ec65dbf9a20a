//! The advise trace benchmark: synthetic inference tenants arriving and
//! leaving over a simulated day on fleets of 16, 64 and 256 nodes × 8 GPUs (H100, H200 and
//! A100 80GB in turn), served by three policies on the same trace: `gpu-share advise` every
//! round, the static example profiles, and a greedy re-partition from scratch. Prints, per
//! fleet and policy, demand served, GPUs used against the lower bound, pods evicted and
//! instances destroyed per simulated hour, and the time advise takes per round.
//!
//! Run: `cargo bench --bench advise_trace` (benches/README.md, "advise trace").
//! Knobs: `GPU_SHARE_TRACE_NODES` (`16,64,256`), `GPU_SHARE_TRACE_HOURS` (24),
//! `GPU_SHARE_TRACE_ROUND_MINUTES` (15), `GPU_SHARE_TRACE_SEED` (1), `GPU_SHARE_TRACE_LOAD`
//! (0.7: mean lower bound over fleet slices).
//!
//! Modules: [`trace`] the seeded tenants, [`fleet`] the one placement model every policy is
//! served by, [`policy`] the three policies, [`run`] the round loop and its counts.

// Only its knobs: this harness prints no percentiles.
#[allow(dead_code)]
#[path = "figures.rs"]
mod figures;
#[path = "advise_trace/fleet.rs"]
mod fleet;
#[path = "advise_trace/policy.rs"]
mod policy;
#[path = "advise_trace/run.rs"]
mod run;
#[path = "advise_trace/trace.rs"]
mod trace;

use std::time::Duration;

use figures::knob;
use policy::Policy;
use run::{lower_bound_slices, Outcome};
use trace::{generate, TraceSpec};

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs this too: keep that short.
    let testing = !std::env::args().any(|a| a == "--bench");
    let nodes: Vec<usize> = std::env::var("GPU_SHARE_TRACE_NODES")
        .unwrap_or_else(|_| {
            if testing {
                "16".into()
            } else {
                "16,64,256".into()
            }
        })
        .split(',')
        .filter_map(|n| n.trim().parse().ok())
        .collect();
    let hours = knob("GPU_SHARE_TRACE_HOURS", if testing { 2.0 } else { 24.0 });
    let round_minutes = knob("GPU_SHARE_TRACE_ROUND_MINUTES", 15.0);
    let seed = knob("GPU_SHARE_TRACE_SEED", 1u64);
    let load = knob("GPU_SHARE_TRACE_LOAD", 0.7);
    println!("# advise trace: {hours} simulated hours, a round every {round_minutes} min, seed {seed}, mean load {load}");
    println!();
    println!("| nodes × 8 GPUs | pods | policy | demand served | GPUs used (avg) | lower bound (avg) | used / bound | bound of pods running (avg) | used / that bound | pods evicted / h | instances destroyed / h | profile changes / h |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut advise_times = Vec::new();
    let mut by_class = Vec::new();
    for &n in &nodes {
        let spec = TraceSpec {
            nodes: n,
            hours,
            round_minutes,
            seed,
            load,
            mean_hours: 3.0,
        };
        let pods = generate(&spec, &lower_bound_slices);
        for policy in Policy::ALL {
            let out = run::run(policy, &pods, n, spec.rounds());
            print_row(n, pods.len(), policy, &out, hours);
            let rounds = f64::from(out.rounds.max(1));
            let pending = (
                out.reported_unschedulable as f64 / rounds,
                out.left_pending as f64 / rounds,
            );
            by_class.push((n, policy, out.by_class, pending));
            if policy == Policy::Advise {
                advise_times.push((n, out.decide_times, out.solve_times));
            }
        }
    }
    println!();
    println!("Demand served by tenant class (% of its pod-rounds):");
    println!();
    let classes: Vec<&str> = trace::Class::ALL.iter().map(|c| c.label()).collect();
    println!(
        "| nodes | policy | {} | packer's unschedulable / round | left pending / round |",
        classes.join(" | ")
    );
    println!("|---|---|{}---|---|", "---|".repeat(classes.len()));
    for (n, policy, counts, (reported, pending)) in by_class {
        let cells: Vec<String> = counts
            .iter()
            .map(|&(asked, served)| format!("{:.1}%", 100.0 * served as f64 / asked.max(1) as f64))
            .collect();
        let reported = match policy {
            Policy::Static => "–".to_string(),
            _ => format!("{reported:.1}"),
        };
        println!(
            "| {n} | {} | {} | {reported} | {pending:.1} |",
            policy.label(),
            cells.join(" | ")
        );
    }
    println!();
    println!("advise per round: `Solver::solve` alone, and all of advise (read the fleet, solve, plan every proposal):");
    for (n, all, solve) in advise_times {
        println!(
            "  {n} nodes × 8 GPUs, {} rounds: solver {}; all of advise {}",
            all.len(),
            p50_max(solve),
            p50_max(all)
        );
    }
}

/// `p50 X ms, max Y ms` (nearest rank).
fn p50_max(mut times: Vec<Duration>) -> String {
    times.sort();
    let p50 = times.get(times.len() / 2).copied().unwrap_or_default();
    let max = times.last().copied().unwrap_or_default();
    format!("p50 {}, max {}", ms(p50), ms(max))
}

fn print_row(nodes: usize, pods: usize, policy: Policy, out: &Outcome, hours: f64) {
    let rounds = f64::from(out.rounds.max(1));
    let used = out.gpu_rounds_used as f64 / rounds;
    let bound = out.gpu_rounds_lower_bound as f64 / rounds;
    let running = out.gpu_rounds_running_bound as f64 / rounds;
    println!(
        "| {nodes} | {pods} | {} | {:.1}% | {used:.1} | {bound:.1} | {:.2} | {running:.1} | {:.2} | {:.1} | {:.1} | {:.1} |",
        policy.label(),
        out.served_percent(),
        used / bound.max(f64::MIN_POSITIVE),
        used / running.max(f64::MIN_POSITIVE),
        out.evictions as f64 / hours,
        out.instances_destroyed as f64 / hours,
        out.profile_changes as f64 / hours,
    );
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}
