//! validate + plan throughput: how fast a profile is read, validated and planned for a node.
//!
//! Each iteration does what an agent does when its profile changes: parse the profile text,
//! validate it against the catalog, plan it for a node of 8 GPUs. The `10k_nodes` group does
//! that for 10,000 nodes × 8 GPUs; the goal is well under a second on one core.
//!
//! Run: `cargo bench --bench validate_plan`.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use gpu_share::plan::{plan, ObservedNode};
use gpu_share::profile::parse_profile;

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

criterion_group!(benches, per_node, ten_thousand_nodes);
criterion_main!(benches);
