//! A claim prepared → its MIG device ready. The real `gpu-share agent --plugin dra` runs on a
//! simulated node of 8 H100s (MIG on, every GPU `dynamicMig: true`, the fake NVML) with the
//! API double; the bench plays the scheduler (first fit over the published counters) and the
//! kubelet (NodePrepareResources / NodeUnprepareResources over the plugin's gRPC socket, as
//! node-sim's `DraKubelet` dials it). A prepare is timed from the kubelet's call to its answer:
//! the claim read from the API, the placement checked against NVML and the journal, the
//! journal saved (durable) before and after the create, the GPU instance and its compute
//! instance made, the checkpoint and the CDI spec written. Beside it, the same creates and
//! destroys through gpu-share's NVML door alone, in this process, on the same fake NVML.
//!
//! The fake NVML keeps its state in a JSON file, so "NVML alone" is the fake's cost, not a
//! driver's: the figures say what the agent adds around NVML, not how long a real GPU takes
//! (we may not create instances on the lent H200, so that time is not measured here).

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use gpu_share::dra::api::Device;
use gpu_share::dra::dynamic::first_fit::{mig_profile, Pool};
use gpu_share::dra::dynamic::{DynamicDevice, Order};
use gpu_share::gpu::Gpus;
use gpu_share::mig::catalog;
use node_sim::{gpus, DraNode};
use nvidia_ml::{cdylib_path, State};

use crate::figures::percentile;
use crate::{devices, mix, slices, Rng, DYNAMIC};

const GPUS: u64 = 8;
/// Claims held at once: each prepare past this many unprepares the oldest first.
const HELD: usize = 12;

/// What the kubelet asks, in order.
enum Op {
    Prepare { claim: usize, device: Device },
    Unprepare { claim: usize },
}

/// `n` prepares (and the unprepares between them) of claims of mixed profiles, allocated first
/// fit as the scheduler would over the slices the agent publishes.
fn ops(n: usize) -> Vec<Op> {
    let model = catalog().model("h100-80gb-sxm").unwrap();
    let slices = slices(model, GPUS, Order::FirstFit);
    let by_name: BTreeMap<&str, &Device> = devices(&slices).map(|d| (d.name.as_str(), d)).collect();
    let mut pool = Pool::new(&slices);
    let mix = mix(model);
    let mut rng = Rng::new();
    let mut held: VecDeque<(usize, String)> = VecDeque::new();
    let mut ops = Vec::new();
    let release = |held: &mut VecDeque<(usize, String)>, ops: &mut Vec<Op>, pool: &mut Pool| {
        let (claim, device) = held.pop_front().expect("a claim to end");
        pool.release(&device);
        ops.push(Op::Unprepare { claim });
    };
    for claim in 0..n {
        let profile = rng.profile(&mix);
        let device = loop {
            match pool.allocate(mig_profile(&profile)) {
                Some(device) => break device,
                None => release(&mut held, &mut ops, &mut pool),
            }
        };
        ops.push(Op::Prepare {
            claim,
            device: by_name[device.as_str()].clone(),
        });
        held.push_back((claim, device));
        if held.len() > HELD {
            release(&mut held, &mut ops, &mut pool);
        }
    }
    while !held.is_empty() {
        release(&mut held, &mut ops, &mut pool);
    }
    ops
}

/// Milliseconds of each create and each destroy through `Gpus` alone.
fn nvml_alone(ops: &[Op]) -> (Vec<f64>, Vec<f64>) {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("nvml.json");
    State::with_gpus(gpus("h100", GPUS as usize, true))
        .write_to(&state)
        .unwrap();
    // Single-threaded still: main runs this part before anything starts a thread.
    std::env::set_var("FAKE_NVML_STATE", &state);
    std::env::remove_var("FAKE_NVML_LOG");
    let nvml = Gpus::open(Some(&cdylib_path())).unwrap();
    let model = catalog().model("h100-80gb-sxm").unwrap();
    let (mut creates, mut destroys) = (Vec::new(), Vec::new());
    let mut made: BTreeMap<usize, (u32, u32)> = BTreeMap::new();
    for op in ops {
        match op {
            Op::Prepare { claim, device } => {
                let Some(DynamicDevice::Mig {
                    gpu,
                    profile,
                    placement,
                }) = DynamicDevice::of(device)
                else {
                    panic!("{} is not a dynamic MIG device", device.name)
                };
                let profile = model.profile(&profile).unwrap();
                let started = Instant::now();
                let gi = nvml.create_instance(gpu, profile, placement).unwrap();
                creates.push(ms(started.elapsed()));
                made.insert(*claim, (gpu, gi));
            }
            Op::Unprepare { claim } => {
                let (gpu, gi) = made.remove(claim).unwrap();
                let started = Instant::now();
                nvml.destroy_instance(gpu, gi).unwrap();
                destroys.push(ms(started.elapsed()));
            }
        }
    }
    (creates, destroys)
}

/// Milliseconds of each prepare and unprepare through the agent.
fn through_agent(ops: &[Op]) -> (Vec<f64>, Vec<f64>) {
    // No MPS here, and `cargo bench` does not build the fake MPS control daemon.
    node_sim::mps_control_optional();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let profiles = [("dyn", DYNAMIC.to_string())];
        let gpus = gpus("h100", GPUS as usize, true);
        let node = DraNode::start("bench-prepare", gpus, &[], &profiles, &[]).await;
        node.apply("dyn", DYNAMIC);
        let published = node.device_names();
        let (mut prepares, mut unprepares) = (Vec::new(), Vec::new());
        let mut uids: BTreeMap<usize, String> = BTreeMap::new();
        for op in ops {
            match op {
                Op::Prepare { claim, device } => {
                    assert!(
                        published.contains(&device.name),
                        "{} unpublished",
                        device.name
                    );
                    let name = format!("claim-{claim}");
                    let uid = node.allocate(&name, &device.name).await;
                    let started = Instant::now();
                    let answer = node.prepare(&name, &uid).await;
                    prepares.push(ms(started.elapsed()));
                    assert!(answer.error.is_empty(), "{name}: {}", answer.error);
                    uids.insert(*claim, uid);
                }
                Op::Unprepare { claim } => {
                    let name = format!("claim-{claim}");
                    let uid = uids.remove(claim).unwrap();
                    let started = Instant::now();
                    let error = node.unprepare(&name, &uid).await;
                    unprepares.push(ms(started.elapsed()));
                    assert!(error.is_empty(), "{name}: {error}");
                }
            }
        }
        let left = node.node.nvml();
        assert!(
            left.gpus.iter().all(|g| g.gpu_instances.is_empty()),
            "every instance destroyed at the end"
        );
        (prepares, unprepares)
    })
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn row(what: &str, mut values: Vec<f64>) {
    values.sort_by(f64::total_cmp);
    println!(
        "| {what} | {} | {:.2} | {:.2} | {:.2} |",
        values.len(),
        percentile(&values, 50.0),
        percentile(&values, 99.0),
        values.last().copied().unwrap_or(0.0)
    );
}

pub fn report(n: usize) {
    let ops = ops(n);
    let (creates, destroys) = nvml_alone(&ops);
    let started = Instant::now();
    let (prepares, unprepares) = through_agent(&ops);
    println!(
        "# dynamic MIG: claim prepared → MIG device ready ({n} claims, {GPUS} × H100, {HELD} held at once, {:.1} s)\n",
        started.elapsed().as_secs_f64()
    );
    println!("| step | n | p50 ms | p99 ms | max ms |");
    println!("|---|---|---|---|---|");
    row("NodePrepareResources through the agent (claim read, journal, GI + CI, checkpoint, CDI spec)", prepares);
    row(
        "NVML alone: GPU instance at the placement + its default compute instance",
        creates,
    );
    row(
        "NodeUnprepareResources through the agent (journal, CI + GI destroyed, spec removed)",
        unprepares,
    );
    row(
        "NVML alone: compute instance + GPU instance destroyed",
        destroys,
    );
    println!();
}
