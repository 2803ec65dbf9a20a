//! A faulted DRA device: how soon the API shows it tainted, and how soon the taint goes once it
//! may heal, beside the kubelet's health stream for the same transitions (issue 37 item 5).
//!
//! The real `gpu-share agent --plugin dra --xid-heal-after 1s` runs on a simulated node of 8
//! H100s, each seven 1g.10gb MIG devices (the fake NVML), with the API double; node-sim's
//! kubelet holds the `NodeWatchResources` stream open as kubelet 1.34+ does. Each round raises a
//! critical XID on one MIG device (written into the fake NVML's state, as the driver would
//! report it) and times, from that write:
//!
//! - **XID → Unhealthy on the health stream** (what the pod's `allocatedResourcesStatus` shows);
//! - **XID → taint in the API** (the ResourceSlice the scheduler reads, polled every 1 ms in this
//!   process);
//!
//! then, from the moment the device may heal (its XID + the 1 s window):
//!
//! - **heal due → taint gone in the API**, and **→ Healthy on the stream**.
//!
//! The heal check runs every quarter of the window, at least 1 s apart, so the heal figures
//! are that tick, not the publish. Both XID paths start at the same NVML event, so their
//! difference is what the taint adds: the republish through the reconcile and the API write.
//!
//! `cargo build --release -p fake-mps-control && cargo bench --bench dra_health`
//! (GPU_SHARE_BENCH_ROUNDS, default 40; the agent's node needs the fake MPS control binary,
//! which `cargo bench` does not build).

#[path = "figures.rs"]
mod figures;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use figures::{knob, percentile};
use gpu_share::dra::kubelet_plugin::api::health::HealthStatus;
use node_sim::{gpus, DraNode};
use nvidia_ml::State;
use serde_json::Value;

const DRIVER: &str = "gpu.gpu-share.dev";
const MIG: &str = "version: v1\nrules:\n- devices: all\n  mig: {1g.10gb: 7}\n";
const WINDOW: Duration = Duration::from_secs(1);
const LIMIT: Duration = Duration::from_secs(30);

/// When each device last turned Unhealthy and Healthy on the stream.
#[derive(Default)]
struct StreamSeen {
    unhealthy: BTreeMap<String, Instant>,
    healthy: BTreeMap<String, Instant>,
}

fn main() {
    let rounds: usize = knob("GPU_SHARE_BENCH_ROUNDS", 40);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let profiles = [("mig", MIG.to_string())];
        let flags = ["--xid-heal-after", "1s", "--resync-period", "300s"];
        let node = DraNode::start(
            "bench-health",
            gpus("h100", 8, true),
            &[],
            &profiles,
            &flags,
        )
        .await;
        node.apply("mig", MIG);
        wait("the XID watch", || {
            node.node.log().contains("watching for critical XID errors")
        })
        .await;
        let seen = Arc::new(Mutex::new(StreamSeen::default()));
        follow_stream(&node, Arc::clone(&seen)).await;

        let mut figures: BTreeMap<&str, Vec<Duration>> = BTreeMap::new();
        for round in 0..rounds {
            let (name, started) = raise(&node, round);
            wait("the taint", || tainted(&node, &name)).await;
            figures
                .entry("XID → taint in the API")
                .or_default()
                .push(started.elapsed());
            wait("Unhealthy on the stream", || {
                seen.lock()
                    .unwrap()
                    .unhealthy
                    .get(&name)
                    .is_some_and(|t| *t >= started)
            })
            .await;
            let unhealthy = seen.lock().unwrap().unhealthy[&name];
            figures
                .entry("XID → Unhealthy on the health stream")
                .or_default()
                .push(unhealthy - started);
            let due = started + WINDOW;
            wait("the taint gone", || !tainted(&node, &name)).await;
            figures
                .entry("heal due → taint gone in the API")
                .or_default()
                .push(due.elapsed());
            wait("Healthy on the stream", || {
                seen.lock()
                    .unwrap()
                    .healthy
                    .get(&name)
                    .is_some_and(|t| *t >= due)
            })
            .await;
            let healthy = seen.lock().unwrap().healthy[&name];
            figures
                .entry("heal due → Healthy on the health stream")
                .or_default()
                .push(healthy - due);
        }
        report(rounds, &figures);
    });
}

/// Read the health stream in the background, noting each device's transitions.
async fn follow_stream(node: &DraNode, seen: Arc<Mutex<StreamSeen>>) {
    let mut stream = node.kubelet.watch_health(DRIVER).await.unwrap();
    tokio::spawn(async move {
        let mut last: BTreeMap<String, i32> = BTreeMap::new();
        while let Ok(Some(message)) = stream.message().await {
            let now = Instant::now();
            let mut seen = seen.lock().unwrap();
            for d in message.devices {
                let name = d.device.map(|id| id.device_name).unwrap_or_default();
                if last.get(&name) == Some(&d.health) {
                    continue;
                }
                if d.health == HealthStatus::Unhealthy as i32 {
                    seen.unhealthy.insert(name.clone(), now);
                } else if d.health == HealthStatus::Healthy as i32 {
                    seen.healthy.insert(name.clone(), now);
                }
                last.insert(name, d.health);
            }
        }
    });
}

/// Raise XID 48 on the MIG device of round `round` (GPU and instance in turn); its published
/// name and when the XID was written (just before the state file is replaced).
fn raise(node: &DraNode, round: usize) -> (String, Instant) {
    let path = node.node.nvml_state();
    let mut state = State::read_from(&path).unwrap();
    let gpu = round % state.gpus.len();
    let instances = &state.gpus[gpu].gpu_instances;
    let gi = &instances[(round / state.gpus.len()) % instances.len()];
    let ci = &gi.compute_instances[0];
    let (ids, uuid) = ((gi.id, ci.id), ci.uuid.clone());
    let name = node
        .slices()
        .iter()
        .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .find(|d| d["attributes"]["uuid"]["string"] == uuid.as_str())
        .and_then(|d| d["name"].as_str().map(str::to_string))
        .expect("the MIG device is published");
    state.gpus[gpu].raise_xid(48, Some(ids));
    // Timed from before the write: the watcher may see the event before the write returns.
    let raised = Instant::now();
    state.write_to(&path).unwrap();
    (name, raised)
}

fn tainted(node: &DraNode, name: &str) -> bool {
    node.published(name)
        .and_then(|d| {
            d.get("taints")
                .and_then(Value::as_array)
                .map(|t| !t.is_empty())
        })
        .unwrap_or(false)
}

/// Poll `done` every 1 ms; panics after 30 s, naming `what`.
async fn wait(what: &str, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < LIMIT, "no {what} within {LIMIT:?}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

fn report(rounds: usize, figures: &BTreeMap<&str, Vec<Duration>>) {
    println!("# faulted DRA devices: taint and health stream ({rounds} rounds, 8 simulated H100s × 7 1g.10gb)\n");
    println!("| transition | p50 | p99 | max |");
    println!("|---|---|---|---|");
    let ms = |d: Duration| format!("{:.1} ms", d.as_secs_f64() * 1000.0);
    for (what, samples) in figures {
        let mut sorted = samples.clone();
        sorted.sort();
        println!(
            "| {what} | {} | {} | {} |",
            ms(percentile(&sorted, 50.0)),
            ms(percentile(&sorted, 99.0)),
            ms(*sorted.last().unwrap())
        );
    }
    let p50 = |what: &str| {
        let mut s = figures[what].clone();
        s.sort();
        percentile(&s, 50.0).as_secs_f64()
    };
    println!(
        "\nratio at p50, taint in the API / Unhealthy on the stream: {:.2}",
        p50("XID → taint in the API") / p50("XID → Unhealthy on the health stream")
    );
}
