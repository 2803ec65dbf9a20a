//! validate + plan throughput: how fast a profile is read, validated and planned for a node.
//!
//! Each iteration does what an agent does when its profile changes: parse the profile text,
//! validate it against the catalog, plan it for a node of 8 GPUs. The `10k_nodes` group does
//! that for 10,000 nodes × 8 GPUs; the goal is well under a second on one core.
//!
//! The `validate_rules` group parses and validates profiles of 1k to 10k rules (issue 13: it
//! grew faster than linearly). Profiles over the 1024-rule cap are refused, but every rule is
//! still checked, so the figures show the cost per rule; 1024 is the largest accepted profile.
//!
//! Run: `cargo bench --bench validate_plan`.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use gpu_share::plan::{plan, ObservedNode};
use gpu_share::profile::{parse_profile, validate, MAX_RULES};

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

criterion_group!(benches, per_node, ten_thousand_nodes, validate_rules);
criterion_main!(benches);
