//! `gpu-share-demo` run as a user runs it, its stdout captured: the story's outcomes, chapter by
//! chapter, not only the exit code. Every figure asserted here is one the demo read back from
//! the simulated world (the API double's Node, evictions and Events; the fake NVML's state and
//! mutation log; the agent's /metrics and log).

use std::process::Command;

fn run_demo() -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_gpu-share-demo"))
        .output()
        .expect("run gpu-share-demo");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "exit {:?}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Chapter `n`'s text (from its `== n.` title to the next title).
fn chapter(out: &str, n: usize) -> &str {
    let start = out
        .find(&format!("== {n}. "))
        .unwrap_or_else(|| panic!("no chapter {n} in:\n{out}"));
    let rest = &out[start..];
    let end = rest[3..].find("\n== ").map_or(rest.len(), |e| e + 3);
    &rest[..end]
}

/// The states line of a chapter, as state names in order (timings dropped).
fn states(chapter: &str) -> Vec<&str> {
    let line = chapter
        .lines()
        .find_map(|l| l.trim().strip_prefix("states: "))
        .unwrap_or_else(|| panic!("no states line in:\n{chapter}"));
    line.split(" → ")
        .map(|s| s.split_whitespace().next().unwrap())
        .collect()
}

fn has(chapter: &str, line: &str) {
    assert!(
        chapter.lines().any(|l| l.trim() == line),
        "missing line {line:?} in:\n{chapter}"
    );
}

fn has_prefix(chapter: &str, prefix: &str) {
    assert!(
        chapter.lines().any(|l| l.trim().starts_with(prefix)),
        "no line starting {prefix:?} in:\n{chapter}"
    );
}

#[test]
fn the_demo_tells_the_whole_agent_story_and_exits_zero() {
    let out = run_demo();
    println!("{out}");

    let start = chapter(&out, 0);
    has(
        start,
        "node status.allocatable advertised (no profile applied yet): no nvidia.com/* resources",
    );

    // 1. The first label: every state the agent publishes, in order; the tenants on the whole
    // GPUs that become MIG are evicted; the built-in plugin's devices reach the Node.
    let first = chapter(&out, 1);
    assert_eq!(
        states(first),
        ["pending", "draining", "applying", "success"]
    );
    has(
        first,
        "evicted default/tenant-0: it ran on whole GPU 0, which becomes MIG",
    );
    has(
        first,
        "evicted default/tenant-1: it ran on whole GPU 1, which becomes MIG",
    );
    has(
        first,
        "MIG instances: 0 kept (no GPU untouched), 0 destroyed, 56 created",
    );
    has(
        first,
        "node status.allocatable now advertised: nvidia.com/mig-1g.10gb: 56",
    );

    // 2. Relabel: a budget blocks one eviction, the agent waits and says so (its state, its
    // log, its metric); once relaxed, only the pods on changed instances were evicted, and
    // GPUs 0-5 kept their instances.
    let change = chapter(&out, 2);
    has_prefix(change, "eviction of default/tenant-c refused (429): ");
    has_prefix(change, "agent state while blocked: draining (");
    has_prefix(
        change,
        "event EvictionBlocked: waiting for the eviction of default/tenant-c: blocked by a PodDisruptionBudget",
    );
    // The chapter's own Events, naming its profile (not the first profile's words again).
    has_prefix(
        change,
        "event Cordoned: gpu-share: reconfiguring MIG for profile inference-mixed",
    );
    has_prefix(change, "event Applied: profile inference-mixed applied");
    // The agent's line, inside the spans that say which reconcile and step it belongs to.
    has_prefix(
        change,
        "agent log: reconcile{node=gpu-node-1 profile=\"inference-mixed\" hash=",
    );
    assert!(
        change.lines().any(|l| l.contains(
            "}:step{step=\"drain-and-apply\" slot=gpu-share-drain-0}: gpu_share::agent::drain: \
             eviction refused; waiting and retrying pod=default/tenant-c"
        )),
        "{change}"
    );
    let blocked: f64 = change
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix(r#"agent /metrics: gpu_share_evictions_total{outcome="blocked"} "#)
        })
        .expect("blocked evictions metric line")
        .parse()
        .unwrap();
    assert!(blocked >= 1.0, "{change}");
    assert_eq!(
        states(change),
        ["pending", "draining", "applying", "success"]
    );
    has(
        change,
        "kept default/tenant-a running: its GPU instance stays",
    );
    has_prefix(change, "evicted default/tenant-b: it ran on GPU 6 GI");
    has_prefix(change, "evicted default/tenant-c: it ran on GPU 7 GI");
    assert!(!change.contains("evicted default/tenant-a"), "{change}");
    has(
        change,
        "MIG instances: 42 kept (GPUs 0,1,2,3,4,5 untouched), 14 destroyed, 4 created",
    );
    has(
        change,
        "node status.allocatable now advertised: nvidia.com/mig-1g.10gb: 42, nvidia.com/mig-3g.40gb: 4",
    );

    // 3. A ConfigMap edit is re-applied without a label change; nobody runs on the changed
    // instances, so there is no drain.
    let edit = chapter(&out, 3);
    assert_eq!(states(edit), ["pending", "applying", "success"]);
    assert!(!edit.contains("evicted default/"), "{edit}");
    has(
        edit,
        "node status.allocatable now advertised: nvidia.com/mig-1g.10gb: 50, nvidia.com/mig-3g.40gb: 2",
    );

    // 4. An invalid profile: failed, naming profile, rule, GPU and the rule broken; no NVML
    // mutation, same layout, same devices advertised.
    let invalid = chapter(&out, 4);
    assert_eq!(states(invalid), ["failed"]);
    has_prefix(
        invalid,
        r#"reason: nothing was changed: error: profile "broken", rule 1 "too-many""#,
    );
    assert!(
        invalid.contains("8 × 1g.10gb asked, but at most 7"),
        "{invalid}"
    );
    has(
        invalid,
        "nothing touched: 0 NVML mutations, MIG layout unchanged",
    );
    has(
        invalid,
        "node status.allocatable still advertised: nvidia.com/mig-1g.10gb: 50, nvidia.com/mig-3g.40gb: 2",
    );

    demand_decides_the_geometry(chapter(&out, 5));

    has_prefix(chapter(&out, 6), "story complete in ");
}

/// Chapter 5, the autopilot: the node opts in, arriving pods the profile cannot serve, a
/// dry-run round that only publishes, a real round that writes `advised-gpu-node-1` and
/// relabels; told by the agent which instance each tenant holds, it keeps them all and predicts
/// the agent's evictions (none), and every arriving pod fits afterwards.
fn demand_decides_the_geometry(autopilot: &str) {
    has(
        autopilot,
        "kubectl label node gpu-node-1 gpu-share.dev/profile=inference-mixed: success (0 NVML mutations)",
    );
    has(
        autopilot,
        "node labels: gpu-share.dev/autopilot=enabled, nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3, nvidia.com/gpu.count=8",
    );
    let (before, rest) = autopilot
        .split_once("gpu-share autopilot --dry-run --plugin builtin: one round")
        .expect("a dry-run round");
    let (dry, real) = rest
        .split_once("gpu-share autopilot --plugin builtin: one round")
        .expect("a real round after the dry-run");

    // What the current profile serves: two of four 3g.40gb, no shared GPU.
    for (pod, verdict) in [
        ("medium-0 asks nvidia.com/mig-3g.40gb: 1, 2 free", "fits"),
        ("medium-1 asks nvidia.com/mig-3g.40gb: 1, 1 free", "fits"),
        (
            "medium-2 asks nvidia.com/mig-3g.40gb: 1, 0 free",
            "does not fit",
        ),
        (
            "medium-3 asks nvidia.com/mig-3g.40gb: 1, 0 free",
            "does not fit",
        ),
        (
            "notebook-0 asks nvidia.com/gpu: 1 (shared), 0 free",
            "does not fit",
        ),
        (
            "notebook-1 asks nvidia.com/gpu: 1 (shared), 0 free",
            "does not fit",
        ),
    ] {
        has(before, &format!("ml/{pod} → {verdict}"));
    }
    has(before, "2 of 6 arriving pods fit with the current profile");
    // The agent published which instance each tenant holds (GPU, placement, profile).
    has(
        before,
        r#"agent annotation gpu-share.dev/devices-in-use: {"default/tenant-a":[{"gpu":0,"migPlacementStart":0,"migProfile":"1g.10gb"}],"default/tenant-d":[{"gpu":3,"migPlacementStart":0,"migProfile":"1g.10gb"}],"default/tenant-e":[{"gpu":4,"migPlacementStart":0,"migProfile":"1g.10gb"}]}"#,
    );

    // Dry-run: the status ConfigMap and a ProfileProposed Event, nothing written.
    has(
        dry,
        "status ConfigMap gpu-share/gpu-share-autopilot-status: dryRun true, unschedulable pods 0",
    );
    has_prefix(
        dry,
        "gpu-node-1: action dry-run, profileKey advised-gpu-node-1, pods 9,",
    );
    has_prefix(
        dry,
        "event ProfileProposed on Node gpu-node-1: would be applied: profile advised-gpu-node-1 written and selected",
    );
    has(
        dry,
        "dry-run wrote nothing: node label gpu-share.dev/profile=inference-mixed, ConfigMap key advised-gpu-node-1 absent",
    );

    // For real: key written, node relabelled. The autopilot knew from the agent's
    // devices-in-use annotation which instance each tenant holds, so it chose a layout that
    // keeps them all, predicted no eviction, and the agent evicted none: no drain at all.
    has(
        real,
        "status ConfigMap gpu-share/gpu-share-autopilot-status: dryRun false, unschedulable pods 0",
    );
    has_prefix(
        real,
        "gpu-node-1: action applied, profileKey advised-gpu-node-1, pods 9,",
    );
    has(
        real,
        "autopilot wrote ConfigMap key advised-gpu-node-1 and labelled the node gpu-share.dev/profile=advised-gpu-node-1; its rules:",
    );
    has_prefix(
        real,
        "event ProfileAdvised: profile advised-gpu-node-1 written and selected",
    );
    has_prefix(real, "event Applied: profile advised-gpu-node-1 applied");
    assert_eq!(states(real), ["pending", "applying", "success"]);
    for tenant in ["tenant-a", "tenant-d", "tenant-e"] {
        has(
            real,
            &format!("kept default/{tenant} running: its GPU instance stays"),
        );
    }
    has(
        real,
        "evicted by the agent: none; the autopilot's status listed as evicted: none (the prediction held)",
    );
    for (pod, free) in [
        ("medium-0 asks nvidia.com/mig-3g.40gb: 1", 4),
        ("medium-1 asks nvidia.com/mig-3g.40gb: 1", 3),
        ("medium-2 asks nvidia.com/mig-3g.40gb: 1", 2),
        ("medium-3 asks nvidia.com/mig-3g.40gb: 1", 1),
        ("notebook-0 asks nvidia.com/gpu: 1 (shared)", 2),
        ("notebook-1 asks nvidia.com/gpu: 1 (shared)", 1),
    ] {
        has(real, &format!("ml/{pod}, {free} free → fits"));
    }
    has(real, "6 of 6 arriving pods fit after the autopilot");
}
