//! How advise's time grows with the fleet: 10,000 pending pods (1g/2g/3g MIG, MIG by memory, MPS
//! and shared requests, in turn) on 256, 1,280 and 5,000 idle `h100x8` nodes (5,000 is advise's
//! node bound, Kubernetes' largest documented cluster). Before nodes still as they started
//! alike were evaluated once per placement, each pod looked at every node: time grew with
//! pods × nodes (22.6 s at 5,000 nodes, release CLI). Now it grows with the nodes in use, so
//! the three cases should take about the same time.
//!
//! Run: `cargo bench --bench advise_scale`.

use std::collections::BTreeMap;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use gpu_share::advise::{advise, Demand, Phase, PodDemand, Supply, SupplyNode};
use gpu_share::sharing::PluginKind;

const PODS: usize = 10_000;

/// The n-th pod's request and annotations, cycling through every kind advise reads.
fn request(i: usize) -> (&'static str, &'static [(&'static str, &'static str)]) {
    const KINDS: [(&str, &[(&str, &str)]); 6] = [
        ("nvidia.com/mig-1g.10gb", &[]),
        ("nvidia.com/mig-3g.40gb", &[]),
        (
            "nvidia.com/gpu",
            &[
                ("gpu-share.dev/isolation", "mps"),
                ("gpu-share.dev/memory-gib", "10"),
            ],
        ),
        ("nvidia.com/gpu", &[("gpu-share.dev/isolation", "shared")]),
        (
            "nvidia.com/gpu",
            &[
                ("gpu-share.dev/isolation", "mig"),
                ("gpu-share.dev/memory-gib", "15"),
            ],
        ),
        ("nvidia.com/mig-2g.20gb", &[]),
    ];
    KINDS[i % KINDS.len()]
}

fn demand() -> Demand {
    let pods = (0..PODS)
        .map(|i| {
            let (resource, annotations) = request(i);
            PodDemand {
                namespace: "ns".into(),
                name: format!("p{i}"),
                node: None,
                phase: Phase::Pending,
                requests: BTreeMap::from([(resource.to_string(), 1)]),
                annotations: (annotations.iter())
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                devices: Vec::new(),
            }
        })
        .collect();
    Demand { pods }
}

fn supply(nodes: usize) -> Supply {
    let nodes = (0..nodes)
        .map(|i| SupplyNode {
            name: format!("n{i:05}"),
            gpus: vec!["h100x8".into()],
            current: None,
            profile_name: None,
            profile: None,
        })
        .collect();
    Supply { nodes }
}

fn advise_scale(c: &mut Criterion) {
    let demand = demand();
    let mut group = c.benchmark_group("advise_scale_10k_pods");
    group.sample_size(10);
    for nodes in [256, 1_280, 5_000] {
        let supply = supply(nodes);
        group.bench_with_input(BenchmarkId::from_parameter(nodes), &supply, |b, supply| {
            b.iter(|| {
                advise(&demand, supply, PluginKind::Nvidia)
                    .expect("the bench fleet is valid")
                    .totals
                    .gpus_used
            })
        });
    }
    group.finish();
}

criterion_group!(benches, advise_scale);
criterion_main!(benches);
