//! validate + plan throughput: how fast a profile is read, validated and planned for a node.
//!
//! Each iteration does what an agent does when its profile changes: parse the profile text,
//! validate it against the catalog, plan it for a node of 8 GPUs. The `10k_nodes` group does
//! that for 10,000 nodes × 8 GPUs; the goal is well under a second on one core.
//!
//! The `validate_rules` group parses and validates profiles of 1k to 10k rules (it
//! grew faster than linearly). Profiles over the 1024-rule cap are refused, but every rule is
//! still checked, so the figures show the cost per rule; 1024 is the largest accepted profile.
//!
//! The `advise_256_nodes_x8` group times `gpu-share advise` for a fleet of 256 nodes
//! × 8 GPUs (H100, H200, A100 80GB; a third running the h100-inference profile with pods on
//! it) and 2,560 pending pods of every kind: reading the nodes, solving, and planning every
//! proposal. The goal: well under a second.
//!
//! Run: `cargo bench --bench validate_plan`.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use gpu_share::advise::{advise, Demand, Phase, PodDemand, Supply, SupplyNode};
use gpu_share::plan::{plan, ObservedNode};
use gpu_share::profile::{parse_profile, MAX_RULES};
use gpu_share::sharing::PluginKind;
use gpu_share::validate::validate;

const CASES: &[(&str, &str, &str)] = &[
    (
        "h100-inference",
        include_str!("../profiles/h100-inference.yaml"),
        "h100x8",
    ),
    (
        "h200-mig-timeslice",
        include_str!("../profiles/h200-mig-timeslice.yaml"),
        "h200x8",
    ),
    (
        "a100-40gb-mixed",
        include_str!("../profiles/a100-40gb-mixed.yaml"),
        "a100-40gbx8",
    ),
    (
        "homelab-timeslice",
        include_str!("../profiles/homelab-timeslice.yaml"),
        "NVIDIA GeForce RTX 3090x8",
    ),
];

fn validate_and_plan(name: &str, text: &str, node: &ObservedNode) -> usize {
    let profile = parse_profile(name, text).expect("example profiles parse");
    let plan = plan(name, &profile, node).expect("example profiles plan");
    plan.gpus.len()
}

fn per_node(c: &mut Criterion) {
    let mut group = c.benchmark_group("validate_plan_one_node_8_gpus");
    group.throughput(Throughput::Elements(8));
    for (name, text, gpus) in CASES {
        let node = ObservedNode::simulated(&[gpus.to_string()]);
        group.bench_with_input(BenchmarkId::from_parameter(name), &node, |b, node| {
            b.iter(|| validate_and_plan(name, text, node))
        });
    }
    group.finish();
}

fn ten_thousand_nodes(c: &mut Criterion) {
    let mut group = c.benchmark_group("10k_nodes");
    group.sample_size(10);
    group.throughput(Throughput::Elements(10_000 * 8));
    let (name, text, gpus) = CASES[0];
    let node = ObservedNode::simulated(&[gpus.to_string()]);
    group.bench_function(name, |b| {
        b.iter(|| {
            (0..10_000)
                .map(|_| validate_and_plan(name, text, &node))
                .sum::<usize>()
        })
    });
    group.finish();
}

/// A profile of `n` time-slicing rules, each selecting its own product name.
fn many_rules(n: usize) -> String {
    let mut text = String::from("version: v1\nrules:\n");
    for i in 0..n {
        text.push_str(&format!(
            "  - {{name: r{i}, devices: {{product: \"GPU model {i}\"}}, timeSlicing: {{replicas: 4}}}}\n"
        ));
    }
    text
}

fn validate_rules(c: &mut Criterion) {
    let mut group = c.benchmark_group("validate_rules");
    group.sample_size(10);
    for n in [1_000, MAX_RULES, 2_000, 4_000, 8_000, 10_000] {
        let text = many_rules(n);
        group.throughput(Throughput::Elements(n as u64));
        group.bench_with_input(BenchmarkId::from_parameter(n), &text, |b, text| {
            b.iter(|| {
                let profile = parse_profile("many", text).expect("parses");
                let problems = validate("many", &profile);
                assert_eq!(problems.iter().any(|p| p.is_error()), n > MAX_RULES);
                problems.len()
            })
        });
    }
    group.finish();
}

/// 256 nodes of 8 GPUs; every third an H100 node running h100-inference with pods on it.
fn fleet() -> (Supply, Demand) {
    let inference = parse_profile("inference", CASES[0].1).expect("example parses");
    let mut nodes = Vec::new();
    let mut pods = Vec::new();
    let pod = |name: String, node: Option<String>, resource: &str, annotations: &[(&str, &str)]| {
        PodDemand {
            namespace: "bench".into(),
            name,
            phase: if node.is_some() {
                Phase::Running
            } else {
                Phase::Pending
            },
            node,
            requests: [(resource.to_string(), 1)].into(),
            annotations: annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            devices: Vec::new(),
        }
    };
    for n in 0..256 {
        let name = format!("node-{n}");
        let model = ["h100x8", "h200x8", "a100-80gbx8"][n % 3];
        let running = n % 3 == 0;
        nodes.push(SupplyNode {
            name: name.clone(),
            gpus: vec![model.into()],
            current: None,
            profile_name: running.then(|| "inference".into()),
            profile: running.then(|| inference.clone()),
        });
        if running {
            for i in 0..12 {
                pods.push(pod(
                    format!("{name}-small-{i}"),
                    Some(name.clone()),
                    "nvidia.com/mig-1g.10gb",
                    &[],
                ));
            }
            for i in 0..6 {
                let shared = [("gpu-share.dev/isolation", "shared")];
                pods.push(pod(
                    format!("{name}-ts-{i}"),
                    Some(name.clone()),
                    "nvidia.com/gpu",
                    &shared,
                ));
            }
        }
        for (i, gib) in ["8", "8", "18", "35", "70", "18"].iter().enumerate() {
            let sized = [
                ("gpu-share.dev/isolation", "mig"),
                ("gpu-share.dev/memory-gib", *gib),
            ];
            pods.push(pod(
                format!("{name}-mig-{i}"),
                None,
                "nvidia.com/gpu",
                &sized,
            ));
        }
        let mps = [
            ("gpu-share.dev/isolation", "mps"),
            ("gpu-share.dev/memory-gib", "10"),
        ];
        pods.push(pod(format!("{name}-mps-0"), None, "nvidia.com/gpu", &mps));
        let shared = [("gpu-share.dev/isolation", "shared")];
        pods.push(pod(
            format!("{name}-shared-0"),
            None,
            "nvidia.com/gpu",
            &shared,
        ));
        pods.push(pod(
            format!("{name}-shared-1"),
            None,
            "nvidia.com/gpu",
            &shared,
        ));
        pods.push(pod(format!("{name}-whole-0"), None, "nvidia.com/gpu", &[]));
    }
    (Supply { nodes }, Demand { pods })
}

fn advise_fleet(c: &mut Criterion) {
    let (supply, demand) = fleet();
    let advice = advise(&demand, &supply, PluginKind::Nvidia).expect("the bench fleet is valid");
    let t = &advice.totals;
    println!(
        "advise_256_nodes_x8: {} pods, {} unschedulable, {} evicted, {} instances destroyed, {} GPUs used, {} idle",
        demand.pods.len(), t.unschedulable_pods, t.pods_evicted, t.instances_destroyed, t.gpus_used, t.gpus_idle
    );
    let mut group = c.benchmark_group("advise_256_nodes_x8");
    group.sample_size(10);
    group.throughput(Throughput::Elements(256 * 8));
    group.bench_function("nvidia", |b| {
        b.iter(|| {
            advise(&demand, &supply, PluginKind::Nvidia)
                .expect("valid")
                .totals
                .gpus_used
        })
    });
    group.finish();
}

criterion_group!(
    benches,
    per_node,
    ten_thousand_nodes,
    validate_rules,
    advise_fleet
);
criterion_main!(benches);
