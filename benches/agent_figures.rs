//! Whole-process figures for the node agent: the real `gpu-share agent` binary (the bench
//! profile's build, i.e. release, which `cargo bench` builds next to this harness) against the
//! Kubernetes API double (tests/kube-double) and the fake `libnvidia-ml.so` (tests/fake-nvml).
//!
//! - `latency`: node label change → device-plugin config written, stage by stage (watch event
//!   at the harness's own raw watch, reconcile start, config written, success published;
//!   `agent_figures/stages.rs`) over 100 changes between two profiles that differ only in
//!   time-slicing replicas (no MIG change, no drain); p50/p99 over 10 changes between two MIG
//!   profiles (drain slot, cordon, the kubelet's PodResources `List`, MIG steps, uncordon),
//!   then the same without a PodResources API; the cost of the config write's fsyncs.
//! - `memory`: the agent's idle VmRSS under each runtime, with its binary warm in the page
//!   cache and cold (dropped before the agent starts), what holds it by mapping, then
//!   VmRSS/VmHWM idle and after 1,000 reconciles (label changes, each waited for until its
//!   success is published); `agent_figures/memory.rs`.
//! - `transitions`: the transition suite (every ordered pair of the H100 example profiles on 8
//!   simulated H100s) with a workload on every GPU instance and on every whole GPU: instances
//!   destroyed and pods evicted per transition, against a destroy-everything /
//!   evict-everything baseline on the same transitions.
//!
//! Run: `cargo bench --bench agent_figures` (all), or `-- latency`, `-- memory`,
//! `-- transitions`. Counts: `GPU_SHARE_BENCH_CHANGES` (100), `GPU_SHARE_BENCH_MIG_CHANGES`
//! (10), `GPU_SHARE_BENCH_RECONCILES` (1000). See benches/README.md.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use kube_double::KubeDouble;
use node_sim::*;

#[path = "figures.rs"]
mod figures;
use figures::{knob, percentile};
#[path = "agent_figures/memory.rs"]
mod memory;
#[path = "agent_figures/stages.rs"]
mod stages;
use stages::{between, Change, NodeEvents, STAGES};

/// Two profiles that differ only in time-slicing replicas: switching needs no MIG change.
fn time_slicing(replicas: u32) -> String {
    format!(
        "version: v1\ndescription: bench, every GPU time-sliced {replicas} ways\nrules:\n  - devices: all\n    timeSlicing: {{replicas: {replicas}}}\n"
    )
}

const TS: [&str; 2] = ["ts-4", "ts-8"];

fn ts_texts() -> [String; 2] {
    [time_slicing(4), time_slicing(8)]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

fn summary(name: &str, mut samples: Vec<Duration>) {
    samples.sort();
    println!(
        "| {name} | {} | {} | {} | {} | {} |",
        samples.len(),
        ms(percentile(&samples, 50.0)),
        ms(percentile(&samples, 99.0)),
        ms(samples[0]),
        ms(*samples.last().unwrap()),
    );
}

/// Change the node's label to `key` and time (config file rewritten, success published).
fn change(
    api: &KubeDouble,
    node: &AgentNode,
    key: &str,
    text: &str,
    timeout: Duration,
) -> (Duration, Duration) {
    let config = node.plugin_config();
    let before = std::fs::read(&config).unwrap_or_default();
    let t0 = Instant::now();
    api.set_node_label(&node.name, PROFILE_LABEL, Some(key));
    let written = poll(timeout, Duration::from_millis(1), || {
        std::fs::read(&config).is_ok_and(|now| now != before)
    });
    assert!(written, "{key}: config not written\n{}", node.log());
    let written = t0.elapsed();
    let ok = poll(timeout, Duration::from_millis(1), || {
        is_applied(api, &node.name, text)
    });
    assert!(
        ok,
        "{key}: not applied; state {:?}, reason {:?}\n{}",
        state_of(api, &node.name),
        annotation(api, &node.name, REASON),
        node.log()
    );
    (written, t0.elapsed())
}

fn latency() {
    let changes = knob("GPU_SHARE_BENCH_CHANGES", 100usize);
    let mig_changes = knob("GPU_SHARE_BENCH_MIG_CHANGES", 10usize);
    let api = Arc::new(KubeDouble::start());
    let texts = ts_texts();
    profiles_configmap(
        &api,
        &["h100-inference", "h100-balanced"],
        &[(TS[0], texts[0].clone()), (TS[1], texts[1].clone())],
    );

    // Time-slicing only, 8 H100s with MIG off, timed stage by stage (stages.rs).
    let mut node = AgentNode::new(&api, "bench-ts", h100s(8, false));
    api.set_node_label(&node.name, PROFILE_LABEL, Some(TS[0]));
    node.start_agent(&["--resync-period", "300s"], &[]);
    wait_applied_text(&api, &node, &texts[0], Duration::from_secs(60), TS[0]);
    let mut events = NodeEvents::start(&api, &node.name);
    let ts_changes: Vec<Change> = (0..changes)
        .map(|i| {
            let k = (i + 1) % 2;
            staged_change(&api, &node, &mut events, TS[k], &texts[k])
        })
        .collect();
    node.kill_agent();
    // MIG changes: h100-balanced ↔ h100-inference on 8 H100s (no pods to evict), first with
    // the kubelet's PodResources API answering, as on a real node (each drain asks it who holds
    // the devices), then without it (the drain goes on with NVML's processes alone).
    let (mig_written, mig_done) = mig_latency(&api, "bench-mig", mig_changes, true);
    let (bare_written, bare_done) = mig_latency(&api, "bench-mig-bare", mig_changes, false);

    println!("\n## label change → device-plugin config written (8 simulated H100s)\n");
    println!("time-slicing 4 ↔ 8 replicas (no MIG change, no drain), {changes} changes:\n");
    println!("| stage | n | p50 | p90 | p99 | min | max |");
    println!("|---|---|---|---|---|---|---|");
    for (name, from, to) in STAGES {
        let samples = ts_changes.iter().map(|c| between(from(c), to(c))).collect();
        stage_summary(name, samples);
    }
    println!("\nMIG changes (drain slot, cordon, MIG steps, uncordon), label set → …:\n");
    println!("| change | n | p50 | p99 | min | max |");
    println!("|---|---|---|---|---|---|");
    summary(
        "h100-balanced ↔ h100-inference (MIG): config written",
        mig_written,
    );
    summary(
        "h100-balanced ↔ h100-inference (MIG): success published",
        mig_done,
    );
    summary(
        "the same without a PodResources API: config written",
        bare_written,
    );
    summary(
        "the same without a PodResources API: success published",
        bare_done,
    );
}

/// Change the node's label to `key` and take the timestamps of every stage (stages.rs).
fn staged_change(
    api: &KubeDouble,
    node: &AgentNode,
    events: &mut NodeEvents,
    key: &str,
    text: &str,
) -> Change {
    let timeout = Duration::from_secs(30);
    let config = node.plugin_config();
    let before = std::fs::read(&config).unwrap_or_default();
    let hash = sha256(text);
    let label_set = SystemTime::now();
    api.set_node_label(&node.name, PROFILE_LABEL, Some(key));
    let written = stages::wait_rewritten(&config, &before, timeout)
        .unwrap_or_else(|| panic!("{key}: config not written\n{}", node.log()));
    events.collect();
    let event = events
        .first(timeout, |s| s.profile.as_deref() == Some(key))
        .unwrap_or_else(|| panic!("{key}: no watch event for the label"))
        .at;
    let success = events
        .first(timeout, |s| {
            s.state.as_deref() == Some("success") && s.hash.as_deref() == Some(hash.as_str())
        })
        .unwrap_or_else(|| panic!("{key}: success not published\n{}", node.log()))
        .at;
    let reconcile = stages::last_logged(&node.log(), "reconciling")
        .unwrap_or_else(|| panic!("{key}: no `reconciling` line\n{}", node.log()));
    // The agent's clock and ours are the same clock: a reconcile logged outside the change's
    // window means the log was misread.
    assert!(
        reconcile >= label_set && reconcile <= success,
        "{key}: reconcile start {reconcile:?} outside {label_set:?}..{success:?}"
    );
    Change {
        label_set,
        event,
        reconcile,
        written,
        success,
    }
}

fn us_or_ms(us: i64) -> String {
    if us.abs() < 1000 {
        format!("{us} µs")
    } else {
        format!("{:.1} ms", us as f64 / 1000.0)
    }
}

/// One row of signed µs samples: n, p50, p90, p99 (nearest rank), min, max.
fn stage_summary(name: &str, mut samples: Vec<i64>) {
    samples.sort();
    let rank = |p: f64| {
        let r = ((p / 100.0) * samples.len() as f64).ceil() as usize;
        samples[r.clamp(1, samples.len()) - 1]
    };
    println!(
        "| {name} | {} | {} | {} | {} | {} | {} |",
        samples.len(),
        us_or_ms(rank(50.0)),
        us_or_ms(rank(90.0)),
        us_or_ms(rank(99.0)),
        us_or_ms(samples[0]),
        us_or_ms(*samples.last().unwrap()),
    );
}

/// What durability would cost the config write: the journal's durable write (temp file, fsync,
/// rename, fsync of the directory) against the agent's config write (the same without the
/// fsyncs: the config is derived from the label and written again at every start,
/// `gpu_share::atomic_file`), in one directory, alternating the two time-slicing configs.
fn fsync_cost() {
    use gpu_share::atomic_file::{replace_derived_if_changed, replace_if_changed, READABLE_BY_ALL};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    let texts = ts_texts();
    let rounds = 200;
    let mut durable = Vec::new();
    let mut derived = Vec::new();
    for i in 0..rounds {
        let text = &texts[i % 2];
        let t0 = Instant::now();
        assert!(replace_if_changed(&path, text.as_bytes(), READABLE_BY_ALL).unwrap());
        durable.push(t0.elapsed().as_micros() as i64);
        // Different bytes again, so the next durable write has something to write.
        let other = format!("{text}# derived\n");
        let t0 = Instant::now();
        assert!(replace_derived_if_changed(&path, other.as_bytes(), READABLE_BY_ALL).unwrap());
        derived.push(t0.elapsed().as_micros() as i64);
    }
    println!("\nconfig write, {rounds} each, {}:\n", dir.path().display());
    println!("| stage | n | p50 | p90 | p99 | min | max |");
    println!("|---|---|---|---|---|---|---|");
    stage_summary(
        "atomic write with fsync of file and directory (the journal's)",
        durable,
    );
    stage_summary(
        "the same without the fsyncs (the agent's config write)",
        derived,
    );
}

/// `changes` label changes between h100-balanced and h100-inference on a new node `name`:
/// (config written, success published) of each.
fn mig_latency(
    api: &Arc<KubeDouble>,
    name: &str,
    changes: usize,
    pod_resources: bool,
) -> (Vec<Duration>, Vec<Duration>) {
    let mut mig = AgentNode::new(api, name, h100s(8, true));
    let _kubelet = pod_resources
        .then(|| PodResourcesKubelet::serve(api, &mig.name, &mig.pod_resources_socket()));
    api.set_node_label(&mig.name, PROFILE_LABEL, Some("h100-balanced"));
    mig.start_agent(&["--resync-period", "300s"], &[]);
    wait_applied(api, &mig, "h100-balanced", Duration::from_secs(60));
    let (mut written, mut done) = (Vec::new(), Vec::new());
    let names = ["h100-balanced", "h100-inference"];
    for i in 0..changes {
        let name = names[(i + 1) % 2];
        let (w, d) = change(
            api,
            &mig,
            name,
            &profile_text(name),
            Duration::from_secs(60),
        );
        written.push(w);
        done.push(d);
    }
    mig.kill_agent();
    (written, done)
}

struct Row {
    from: &'static str,
    to: &'static str,
    destroyed: usize,
    evicted: usize,
    /// Of `evicted`: pods whose device stays but is advertised otherwise.
    reallocated: usize,
    destroy_all: usize,
    evict_all: usize,
}

fn transition(from: &'static str, to: &'static str) -> Row {
    let api = Arc::new(KubeDouble::start());
    profiles_configmap(&api, H100_PROFILES, &[]);
    let mut node = AgentNode::new(&api, "bench-transition", h100s(8, true));
    let kubelet = PodResourcesKubelet::serve(&api, &node.name, &node.pod_resources_socket());
    api.set_node_label(&node.name, PROFILE_LABEL, Some(from));
    node.start_agent(&[], &[]);
    wait_applied(&api, &node, from, Duration::from_secs(60));

    let workloads = node.workloads_everywhere("w", 10_000);
    node.add_workloads(&api, &workloads);
    // Each pod holds its device as `from` advertises it (the first replica of a shared one),
    // as the kubelet lists it.
    let observed_before = observe(&node.nvml_state());
    let advertised_before = advertisement(&profile_text(from), &node.nvml_state());
    let held: Vec<Option<(String, String)>> = workloads
        .iter()
        .map(|w| advertised_id(&advertised_before, &observed_before, w))
        .collect();
    for (w, held) in workloads.iter().zip(&held) {
        let (resource, id) = held.clone().expect("every workload's device is advertised");
        kubelet.allocate("default", &w.pod, &resource, &[&id]);
    }
    let before = node.nvml();
    let destroyed_before = node.count("nvmlGpuInstanceDestroy");
    api.set_node_label(&node.name, PROFILE_LABEL, Some(to));
    wait_applied(&api, &node, to, Duration::from_secs(120));
    let after = node.nvml();
    let advertised_after = advertisement(&profile_text(to), &node.nvml_state());
    node.kill_agent();

    assert_no_orphans(&after, &format!("{from} → {to}"));
    let destroyed = node.count("nvmlGpuInstanceDestroy") - destroyed_before;
    let evicted = evicted(&api);
    // The baseline: every instance on every GPU whose MIG layout or mode changes is destroyed
    // (clear and recreate), and when any GPU changes every GPU pod on the node is evicted.
    let changed: Vec<usize> = (0..before.gpus.len())
        .filter(|&i| gpu_changed(&before.gpus[i], &after.gpus[i]))
        .collect();
    let destroy_all = changed
        .iter()
        .map(|&i| before.gpus[i].gpu_instances.len())
        .sum();
    let evict_all = if changed.is_empty() {
        0
    } else {
        workloads.len()
    };
    // gpu-share evicts only pods on instances it destroys or GPUs whose MIG mode changes, and
    // holders of devices `to` advertises otherwise (src/agent/readvertised.rs).
    let mut reallocated = 0;
    for (w, held) in workloads.iter().zip(&held) {
        if evicted.contains(&w.pod) {
            let (resource, id) = held.as_ref().expect("allocated above");
            let same = advertised_after.devices.get(id).is_some_and(|a| {
                &a.resource == resource
                    && Some(a.sharing) == advertised_before.devices.get(id).map(|b| b.sharing)
            });
            let (b, a) = (&before.gpus[w.gpu], &after.gpus[w.gpu]);
            let gone = match w.gi {
                Some(gi) => !a.gpu_instances.iter().any(|g| {
                    g.id == gi && b.gpu_instance(gi).map(|x| x.placement) == Some(g.placement)
                }),
                None => b.mig.map(|m| m.current) != a.mig.map(|m| m.current),
            };
            assert!(
                gone || !same,
                "{from} → {to}: {} evicted but its GPU instance stays, advertised as before",
                w.pod
            );
            if !gone {
                reallocated += 1;
            }
        }
    }
    Row {
        from,
        to,
        destroyed,
        evicted: evicted.len(),
        reallocated,
        destroy_all,
        evict_all,
    }
}

fn transitions() {
    let rows: Vec<Row> = node_sim::transitions()
        .into_iter()
        .map(|(from, to)| {
            let row = transition(from, to);
            eprintln!(
                "{from} → {to}: destroyed {} (baseline {}), evicted {} ({} re-advertised; baseline {})",
                row.destroyed, row.destroy_all, row.evicted, row.reallocated, row.evict_all
            );
            row
        })
        .collect();
    println!("\n## transition suite: 8 simulated H100s, one pod per GPU instance / whole GPU\n");
    println!("| from → to | instances destroyed | destroy-everything | pods evicted | of which re-advertised | evict-everything |");
    println!("|---|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} → {} | {} | {} | {} | {} | {} |",
            r.from, r.to, r.destroyed, r.destroy_all, r.evicted, r.reallocated, r.evict_all
        );
    }
    let sum = |f: fn(&Row) -> usize| rows.iter().map(f).sum::<usize>();
    let (d, da, e, ra, ea) = (
        sum(|r| r.destroyed),
        sum(|r| r.destroy_all),
        sum(|r| r.evicted),
        sum(|r| r.reallocated),
        sum(|r| r.evict_all),
    );
    println!(
        "| **all {} transitions** | **{d}** | **{da}** | **{e}** | **{ra}** | **{ea}** |",
        rows.len()
    );
    println!(
        "\nper transition: {:.2} instances destroyed vs {:.2} ({:.0}% of the baseline), {:.2} pods evicted vs {:.2} ({:.0}% of the baseline)",
        d as f64 / rows.len() as f64,
        da as f64 / rows.len() as f64,
        100.0 * d as f64 / da.max(1) as f64,
        e as f64 / rows.len() as f64,
        ea as f64 / rows.len() as f64,
        100.0 * e as f64 / ea.max(1) as f64,
    );
}

fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")?
                .split_once(':')
                .map(|x| x.1.trim())
        })
        .unwrap_or("unknown CPU")
        .to_string();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("{cores} cores, {}, {model}", std::env::consts::ARCH)
}

fn main() {
    // `cargo bench` passes `--bench`; other words pick figures.
    let picks: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let want = |name: &str| picks.is_empty() || picks.iter().any(|p| name.contains(p.as_str()));
    // No MPS profile here, and `cargo bench` does not build the fake MPS control daemon.
    mps_control_optional();
    println!("# gpu-share agent figures\n\nmachine: {}", machine());
    println!("agent: {}", gpu_share_bin().display());
    if want("latency") {
        latency();
        fsync_cost();
    }
    if want("memory") {
        memory::memory();
    }
    if want("transitions") {
        transitions();
    }
}
