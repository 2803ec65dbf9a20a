//! The advise trace benchmark's simulation is honest (benches/advise_trace.rs): its lower
//! bound, the evictions and destroys a profile change counts, and a tiny trace's totals, each
//! worked out by hand here. Placements are the catalog's (data/mig-catalog.yaml, H100 80GB:
//! 1g.10gb at starts 0-6, 3g.40gb at 0 or 4, each 4 memory slots wide).

#[path = "../benches/advise_trace/fleet.rs"]
#[allow(dead_code)]
mod fleet;
#[path = "../benches/advise_trace/policy.rs"]
#[allow(dead_code)]
mod policy;
#[path = "../benches/advise_trace/run.rs"]
#[allow(dead_code)]
mod run;
#[path = "../benches/advise_trace/trace.rs"]
#[allow(dead_code)]
mod trace;

use fleet::{need_of, Fleet, Whole};
use policy::{static_profile, Policy};
use run::{lower_bound_gpus, lower_bound_slices};
use trace::{generate, Class, TracePod, TraceSpec};

/// Slices by hand: the smallest instance holding each class on H100, H200 or A100 80GB (all
/// 7 compute slices); MPS: 10 GiB of the H200's 143,771 MiB; shared: 1/16 of a GPU.
#[test]
fn the_lower_bound_counts_the_fewest_slices_each_pod_can_take() {
    assert_eq!(lower_bound_slices(Class::Mig1g), 1.0); // 1g.10gb / 1g.18gb
    assert_eq!(lower_bound_slices(Class::Mig2g), 2.0); // 2g.20gb (H100, A100)
    assert_eq!(lower_bound_slices(Class::Mig3g), 3.0); // 3g.40gb / 3g.71gb
    assert_eq!(lower_bound_slices(Class::Mig7g), 7.0); // 7g.80gb / 7g.141gb
    let mps = lower_bound_slices(Class::Mps);
    assert!((mps - 7.0 * 10240.0 / 143_771.0).abs() < 1e-9, "{mps}");
    assert_eq!(lower_bound_slices(Class::Shared), 7.0 / 16.0);
    // 7 × 1 slice fill one GPU exactly; one more needs a second.
    assert_eq!(lower_bound_gpus(std::iter::repeat_n(1.0, 7)), 1);
    assert_eq!(lower_bound_gpus(std::iter::repeat_n(1.0, 8)), 2);
    // 16 time-sliced pods are one GPU; 7 + 7 + 7/16 slices need three.
    assert_eq!(lower_bound_gpus(std::iter::repeat_n(7.0 / 16.0, 16)), 1);
    assert_eq!(lower_bound_gpus([7.0, 7.0, 7.0 / 16.0].into_iter()), 3);
    assert_eq!(lower_bound_gpus(std::iter::empty()), 0);
}

fn place(fleet: &mut Fleet, pod: usize, class: Class) {
    let need = need_of(&class.demand(format!("pod-{pod}"), None));
    assert_eq!(
        fleet.schedule(&[(pod, need)]),
        vec![pod],
        "{class:?} is placed"
    );
}

/// h100-balanced puts 3g.40gb at start 4 (at 0 only three 1g.10gb would fit beside it) and
/// 1g.10gb at 0-3; a100-80gb-single's 7 × 1g.10gb keeps those four, destroys the 3g.40gb and
/// creates three: one destroyed per GPU, and only the pod on a 3g.40gb is evicted.
#[test]
fn a_profile_change_evicts_the_pods_on_destroyed_instances_only() {
    let mut fleet = Fleet::new(1, 2);
    let (name, balanced) = static_profile(3, "h100");
    assert_eq!(name, "h100-balanced");
    let first = fleet.apply(0, &name, &balanced);
    assert_eq!(first, fleet::Applied::default(), "fresh GPUs lose nothing");
    place(&mut fleet, 0, Class::Mig1g);
    place(&mut fleet, 1, Class::Mig3g);
    let (_, g0, d0) = fleet.placed[0].unwrap();
    let kept = fleet.nodes[0].gpus[g0].devices[d0].instance.clone();
    assert_eq!(kept.as_ref().map(|(p, _)| p.as_str()), Some("1g.10gb"));
    let (_, g1, d1) = fleet.placed[1].unwrap();
    let gone = fleet.nodes[0].gpus[g1].devices[d1].instance.clone();
    assert_eq!(gone, Some(("3g.40gb".to_string(), 4)));

    let (name, single) = static_profile(2, "a100-80gb");
    let applied = fleet.apply(0, &name, &single);
    assert_eq!(applied.instances_destroyed, 8);
    assert_eq!(applied.evicted, vec![1]);
    assert_eq!(fleet.placed[1], None);
    let (_, g, d) = fleet.placed[0].expect("the 1g pod keeps its instance");
    assert_eq!(fleet.nodes[0].gpus[g].devices[d].instance, kept);
    assert_eq!(fleet.nodes[0].gpus[g].devices[d].holders, vec![0]);
}

/// h100-inference time-slices GPUs 4-7 (4 replicas); a100-80gb-single makes them MIG: the
/// time-sliced pod loses its device, nothing is destroyed (GPUs 0-3 already have 7 × 1g.10gb,
/// GPUs 4-7 had no instances).
#[test]
fn turning_mig_on_evicts_the_gpus_pods() {
    let mut fleet = Fleet::new(1, 2);
    let (name, inference) = static_profile(0, "h100");
    assert_eq!(name, "h100-inference");
    fleet.apply(0, &name, &inference);
    assert_eq!(fleet.nodes[0].gpus[4].whole, Some(Whole::TimeSliced));
    place(&mut fleet, 0, Class::Shared);
    place(&mut fleet, 1, Class::Mig1g);
    assert_eq!(fleet.placed[0].map(|(_, g, _)| g), Some(4));
    let (name, single) = static_profile(2, "a100-80gb");
    let applied = fleet.apply(0, &name, &single);
    assert_eq!(applied.instances_destroyed, 0);
    assert_eq!(applied.evicted, vec![0]);
    assert!(fleet.placed[1].is_some());
    assert_eq!(fleet.gpus_used(), 1);
}

/// h100-inference → exclusive: GPUs 0-3 leave MIG (7 instances each destroyed, the 1g pod
/// evicted); GPUs 4-7 go from time-slicing to exclusive, which the agent does not drain
/// (src/agent/drain.rs drains what MIG changes disturb), so the time-sliced pod stays.
#[test]
fn a_change_between_whole_gpu_modes_evicts_nobody() {
    let mut fleet = Fleet::new(1, 2);
    let (name, inference) = static_profile(0, "h100");
    fleet.apply(0, &name, &inference);
    place(&mut fleet, 0, Class::Shared);
    place(&mut fleet, 1, Class::Mig1g);
    let exclusive =
        gpu_share::profile::parse_profile("exclusive", include_str!("../profiles/exclusive.yaml"))
            .unwrap();
    let applied = fleet.apply(0, "exclusive", &exclusive);
    assert_eq!(applied.instances_destroyed, 28);
    assert_eq!(applied.evicted, vec![1]);
    assert_eq!(fleet.placed[0].map(|(_, g, _)| g), Some(4));
    assert_eq!(fleet.nodes[0].gpus[4].whole, Some(Whole::Exclusive));
    assert_eq!(fleet.nodes[0].gpus[4].devices[0].holders, vec![0]);
}

/// One H100 node, four rounds: a 1g pod (rounds 0-2), a 7g pod (rounds 0-1), a time-sliced
/// pod (rounds 1-3).
fn tiny_trace() -> Vec<TracePod> {
    vec![
        TracePod {
            class: Class::Mig1g,
            arrive: 0,
            depart: 3,
        },
        TracePod {
            class: Class::Mig7g,
            arrive: 0,
            depart: 2,
        },
        TracePod {
            class: Class::Shared,
            arrive: 1,
            depart: 4,
        },
    ]
}

/// Static h100-inference has no instance of 79 GiB: the 7g pod waits. Pod-rounds alive
/// 3 + 2 + 3 = 8, served 3 + 0 + 3 = 6. GPUs used per round 1, 2, 2, 1. Lower bound per
/// round: ⌈(1 + 7)/7⌉ = 2, ⌈(1 + 7 + 7/16)/7⌉ = 2, ⌈(1 + 7/16)/7⌉ = 1, 1.
#[test]
fn a_tiny_trace_counts_what_the_static_profile_serves() {
    let out = run::run(Policy::Static, &tiny_trace(), 1, 4);
    assert_eq!(out.pod_rounds_requested, 8);
    assert_eq!(out.pod_rounds_served, 6);
    assert_eq!(out.gpu_rounds_used, 6);
    assert_eq!(out.gpu_rounds_lower_bound, 6);
    // Only the 1g and time-sliced pods run: 1, 1 + 7/16, 1 + 7/16, 7/16 slices: 1 GPU each.
    assert_eq!(out.gpu_rounds_running_bound, 4);
    assert_eq!(out.evictions, 0);
    assert_eq!(out.instances_destroyed, 0);
    assert_eq!(out.profile_changes, 1);
    assert_eq!(out.decide_times.len(), 4);
}

/// advise sizes the node to the pods: all 8 pod-rounds served, nothing running evicted; the
/// 7g pod's GPU, the 1g pod's GPU and the time-sliced GPU are three GPUs in rounds 1.
#[test]
fn a_tiny_trace_is_served_whole_by_advise_without_evictions() {
    let out = run::run(Policy::Advise, &tiny_trace(), 1, 4);
    assert_eq!(out.pod_rounds_requested, 8);
    assert_eq!(out.pod_rounds_served, 8);
    assert_eq!(out.evictions, 0);
    // Rounds: {1g, 7g} = 2 GPUs, {1g, 7g, shared} = 3, {1g, shared} = 2, {shared} = 1.
    assert_eq!(out.gpu_rounds_used, 8);
    // Everything runs, so both bounds are ⌈8/7⌉ + ⌈8.44/7⌉ + ⌈1.44/7⌉ + ⌈0.44/7⌉ = 6.
    assert_eq!(out.gpu_rounds_lower_bound, 6);
    assert_eq!(out.gpu_rounds_running_bound, 6);
}

#[test]
fn the_same_seed_makes_the_same_trace() {
    let spec = TraceSpec {
        nodes: 16,
        hours: 4.0,
        round_minutes: 15.0,
        seed: 7,
        load: 0.7,
        mean_hours: 3.0,
    };
    let a = generate(&spec, &lower_bound_slices);
    assert_eq!(a, generate(&spec, &lower_bound_slices));
    assert_ne!(
        a,
        generate(
            &TraceSpec {
                seed: 8,
                ..spec.clone()
            },
            &lower_bound_slices
        )
    );
    assert_eq!(spec.rounds(), 16);
    // The population at time 0: 70% of 16 × 8 × 7 slices over the mix's mean slices.
    let at_start = a.iter().filter(|p| p.arrive == 0).count() as f64;
    let mean: f64 = Class::ALL
        .iter()
        .map(|&c| lower_bound_slices(c) * weight(c))
        .sum::<f64>()
        / 100.0;
    assert!((at_start - 0.7 * 896.0 / mean).abs() <= 1.0, "{at_start}");
    assert!(a
        .iter()
        .all(|p| p.depart > p.arrive && p.arrive <= spec.rounds()));
}

/// The arrival mix in percent, as benches/advise_trace/trace.rs documents it.
fn weight(class: Class) -> f64 {
    match class {
        Class::Mig1g => 30.0,
        Class::Mig7g => 10.0,
        _ => 15.0,
    }
}

/// The bench runs advise's steps itself to time the solver alone: its proposals and its
/// unschedulable count must be `gpu_share::advise::advise`'s, for the live start point and
/// from scratch. Three nodes (H100, H200, A100 80GB), the H100 running h100-inference with a
/// 1g pod and a time-sliced pod on it, and one pending pod of every class (7g twice).
#[test]
fn the_bench_answers_as_advise_does() {
    let classes = [
        Class::Mig1g,
        Class::Shared,
        Class::Mig1g,
        Class::Mig2g,
        Class::Mig3g,
        Class::Mig7g,
        Class::Mig7g,
        Class::Mps,
        Class::Shared,
    ];
    let mut fleet = Fleet::new(3, classes.len());
    let (name, inference) = static_profile(0, "h100");
    fleet.apply(0, &name, &inference);
    place(&mut fleet, 0, classes[0]);
    place(&mut fleet, 1, classes[1]);
    let alive: Vec<_> = classes
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let node = fleet.placed[i].map(|(n, _, _)| fleet.nodes[n].name.as_str());
            let mut pod = c.demand(format!("pod-{i}"), node);
            pod.devices = fleet.held_devices(i);
            pod
        })
        .collect();
    for (policy, from_scratch) in [(Policy::Advise, false), (Policy::Greedy, true)] {
        let decision = policy::propose(policy, 1, &fleet.nodes, &alive);
        let (supply, demand) = policy::supply_and_demand(&fleet.nodes, &alive, from_scratch);
        let advice =
            gpu_share::advise::advise(&demand, &supply, gpu_share::sharing::PluginKind::Nvidia)
                .expect("valid input");
        let expected: Vec<_> = advice
            .nodes
            .iter()
            .map(|a| Some((a.profile_key.clone(), a.profile.clone())))
            .collect();
        assert_eq!(decision.proposals, expected, "{policy:?}");
        assert_eq!(
            decision.unschedulable,
            advice.unschedulable.len(),
            "{policy:?}"
        );
        assert!(decision.solve.is_some_and(|s| s <= decision.took));
    }
    let running = alive.iter().filter(|p| p.node.is_some()).count();
    assert_eq!(running, 2, "the live start point has running pods");
    assert!(
        alive
            .iter()
            .filter(|p| p.node.is_some())
            .all(|p| p.devices.len() == 1),
        "running pods name the device they hold (advise checked it is on the node)"
    );
}

/// The pod that runs on GPU 1's 1g instance at start 6 of an H100 node cut into
/// 7 × 1g.10gb everywhere, and a pending 7g-sized pod. Told only the pod's node, advise matches
/// it to GPU 0's first free 1g, turns GPU 1 (idle to it) into the 7g, and applying that evicts
/// the pod. Told the pod's device (`Fleet::held_devices`, what the bench now passes), it keeps
/// GPU 1's instance and the change evicts nobody.
#[test]
fn advise_told_the_pods_device_does_not_evict_it() {
    let small = gpu_share::profile::parse_profile(
        "small",
        "version: v1\nrules:\n- devices: all\n  mig: {1g.10gb: 7}\n",
    )
    .unwrap();
    let evicted = |tell_device: bool| {
        let mut fleet = Fleet::new(1, 2);
        fleet.apply(0, "small", &small);
        let device = fleet.nodes[0].gpus[1]
            .devices
            .iter()
            .position(|d| d.instance == Some(("1g.10gb".into(), 6)))
            .expect("an instance at start 6");
        fleet.nodes[0].gpus[1].devices[device].holders.push(0);
        fleet.placed[0] = Some((0, 1, device));
        let mut running = Class::Mig1g.demand("pod-0".into(), Some("node-0"));
        if tell_device {
            running.devices = fleet.held_devices(0);
        }
        let alive = [running, Class::Mig7g.demand("pod-1".into(), None)];
        let decision = policy::propose(Policy::Advise, 1, &fleet.nodes, &alive);
        assert_eq!(decision.unschedulable, 0);
        let (name, profile) = decision.proposals[0].clone().expect("a proposal");
        fleet.apply(0, &name, &profile).evicted
    };
    assert_eq!(evicted(false), vec![0], "matched to any 1g, its own goes");
    assert_eq!(evicted(true), Vec::<usize>::new(), "pinned, it stays");
}
