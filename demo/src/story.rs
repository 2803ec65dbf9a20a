//! The scripted story: label → reconfigure → advertise; change profile (a PDB blocks for a
//! while); edit the ConfigMap; an invalid profile; then the autopilot sizes a profile from the
//! pods' demand (chapter 5, in [`crate::autopilot`]). Every line printed is read back from the
//! simulated world (API double, fake NVML, kubelet), never assumed.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::bail;
use gpu_share::plan::{plan_for, ObservedNode};
use gpu_share::profile::parse_profile;
use gpu_share::sharing::PluginKind;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube_double::EvictionOutcome;
use node_sim::{
    gpu_allocatable, guard, http_get, is_applied, metric, state_of, Workload, CM, NS, PROFILE_LABEL,
};

use crate::profiles::{BROKEN, INFERENCE_MIXED, INFERENCE_MIXED_EDITED, INFERENCE_SMALL};
use crate::show::Show;
use crate::sim::{World, NODE};

/// The demo's tenant pods and the PID of each one's GPU process: 0 and 1 on whole GPUs before
/// the first profile, a-c on MIG instances after it, d-e on MIG instances in chapter 5.
const TENANTS: [(&str, u32); 7] = [
    ("tenant-0", 4000),
    ("tenant-1", 4001),
    ("tenant-a", 5000),
    ("tenant-b", 5001),
    ("tenant-c", 5002),
    ("tenant-d", 5003),
    ("tenant-e", 5004),
];

pub(crate) fn pid_of(pod: &str) -> u32 {
    TENANTS
        .iter()
        .find(|(name, _)| *name == pod)
        .map(|(_, pid)| *pid)
        .expect("a tenant of TENANTS")
}

/// The tenant whose GPU process has `pid`.
pub(crate) fn tenant_of(pid: u32) -> Option<&'static str> {
    TENANTS
        .iter()
        .find(|(_, p)| *p == pid)
        .map(|(name, _)| *name)
}

/// A MIG instance as the story tracks it: (GPU, GI id, placement start, size).
type Instance = (usize, u32, u32, u32);

pub fn profiles() -> Vec<(&'static str, &'static str)> {
    vec![
        ("inference-small", INFERENCE_SMALL),
        ("inference-mixed", INFERENCE_MIXED),
        ("broken", BROKEN),
    ]
}

/// Chapters 0-4: the agent applies, changes and refuses profiles a person labels and edits.
/// Chapter 5, the autopilot, is `crate::autopilot`'s; [`done`] closes the story.
pub fn run(world: &World, show: &Show) -> anyhow::Result<()> {
    introduce(world, show)?;
    first_profile(world, show)?;
    change_profile(world, show)?;
    edit_configmap(world, show)?;
    invalid_profile(world, show)
}

/// The last chapter: how long the story took.
pub fn done(show: &Show) {
    show.chapter(6, "Done");
    show.line(&format!(
        "story complete in {:.1}s (the simulated node and its temp dir go now)",
        show.elapsed().as_secs_f64()
    ));
}

fn introduce(world: &World, show: &Show) -> anyhow::Result<()> {
    show.chapter(
        0,
        &format!("Node {NODE}: 8 × NVIDIA H100 80GB HBM3, MIG off"),
    );
    let tenants = [whole_gpu("tenant-0", 0), whole_gpu("tenant-1", 1)];
    world.node.add_workloads(&world.api, &tenants);
    world.hand_devices(&tenants);
    show.line("tenant pods default/tenant-0 and default/tenant-1 run on whole GPUs 0 and 1");
    allocatable(world, show, "advertised (no profile applied yet)");
    Ok(())
}

fn first_profile(world: &World, show: &Show) -> anyhow::Result<()> {
    show.chapter(
        1,
        "kubectl label node gpu-node-1 gpu-share.dev/profile=inference-small",
    );
    let step = Step::begin(world);
    world
        .api
        .set_node_label(NODE, PROFILE_LABEL, Some("inference-small"));
    wait_applied(world, show, &step, "inference-small", INFERENCE_SMALL)?;
    step.report(world, show);
    wait_advertised(world, show, "inference-small", INFERENCE_SMALL)?;
    allocatable(world, show, "now advertised");
    Ok(())
}

fn change_profile(world: &World, show: &Show) -> anyhow::Result<()> {
    show.chapter(
        2,
        "New tenants on MIG instances; relabel to inference-mixed",
    );
    let at_start = |gpu| world.node.gi_at(gpu, 0);
    let tenants = [
        Workload::on_mig("tenant-a", pid_of("tenant-a"), 0, at_start(0)),
        Workload::on_mig("tenant-b", pid_of("tenant-b"), 6, at_start(6)),
        Workload::on_mig("tenant-c", pid_of("tenant-c"), 7, at_start(7)),
    ];
    world.node.add_workloads(&world.api, &tenants);
    world.hand_devices(&tenants);
    for t in &tenants {
        show.line(&format!(
            "default/{} runs on GPU {} GI {}",
            t.pod,
            t.gpu,
            t.gi.unwrap_or(0)
        ));
    }
    guard(&world.api, "tenant-c", "tenant-c-budget");
    show.line("PodDisruptionBudget default/tenant-c-budget: minAvailable 1 for tenant-c");
    let step = Step::begin(world);
    world
        .api
        .set_node_label(NODE, PROFILE_LABEL, Some("inference-mixed"));
    wait(show, "the agent to try evicting tenant-c", 30, || {
        blocked(world).is_some()
    })?;
    let message = blocked(world).unwrap_or_default();
    show.line(&format!(
        "eviction of default/tenant-c refused (429): {message}"
    ));
    let since = Instant::now();
    while since.elapsed() < Duration::from_secs(2) {
        show.progress(since.elapsed(), "the agent waits for the budget");
        std::thread::sleep(Duration::from_millis(100));
    }
    report_waiting(world, show);
    world
        .api
        .remove::<PodDisruptionBudget>(Some("default"), "tenant-c-budget");
    show.line("demo: the tenant relaxes its budget (PDB deleted)");
    wait_applied(world, show, &step, "inference-mixed", INFERENCE_MIXED)?;
    step.report(world, show);
    wait_advertised(world, show, "inference-mixed", INFERENCE_MIXED)?;
    allocatable(world, show, "now advertised");
    Ok(())
}

/// What the agent says while the budget blocks it: its state and reason on the Node, its
/// log line, its eviction counter on /metrics.
fn report_waiting(world: &World, show: &Show) {
    let node = world.api.node(NODE);
    let state = state_of(&world.api, NODE).unwrap_or_default();
    let reason = node
        .and_then(|n| n.metadata.annotations?.get(node_sim::REASON).cloned())
        .unwrap_or_default();
    show.line(&format!("agent state while blocked: {state} ({reason})"));
    let log = std::fs::read_to_string(&world.agent_log).unwrap_or_default();
    if let Some(line) = log.lines().find(|l| l.contains("eviction refused")) {
        let said = line.split_once("INFO ").map_or(line, |(_, l)| l);
        show.line(&format!("agent log: {said}"));
    }
    let metrics = http_get(world.metrics_port, "/metrics").unwrap_or_default();
    let blocked = metric(&metrics, r#"gpu_share_evictions_total{outcome="blocked"}"#);
    show.line(&format!(
        "agent /metrics: gpu_share_evictions_total{{outcome=\"blocked\"}} {}",
        blocked.unwrap_or(0.0)
    ));
}

fn edit_configmap(world: &World, show: &Show) -> anyhow::Result<()> {
    show.chapter(
        3,
        "Edit the ConfigMap: inference-mixed trades a 3g.40gb for four 1g.10gb on GPUs 6-7",
    );
    let step = Step::begin(world);
    world
        .api
        .update_configmap_key(NS, CM, "inference-mixed", Some(INFERENCE_MIXED_EDITED));
    wait_applied(
        world,
        show,
        &step,
        "inference-mixed (edited)",
        INFERENCE_MIXED_EDITED,
    )?;
    step.report(world, show);
    wait_advertised(
        world,
        show,
        "inference-mixed (edited)",
        INFERENCE_MIXED_EDITED,
    )?;
    allocatable(world, show, "now advertised");
    Ok(())
}

fn invalid_profile(world: &World, show: &Show) -> anyhow::Result<()> {
    show.chapter(
        4,
        "An invalid profile: gpu-share.dev/profile=broken (8 × 1g.10gb per H100)",
    );
    let step = Step::begin(world);
    world
        .api
        .set_node_label(NODE, PROFILE_LABEL, Some("broken"));
    wait(show, "the agent to refuse the profile", 30, || {
        state_of(&world.api, NODE).as_deref() == Some("failed")
            && step.last_state_seen(world, "failed")
    })?;
    // A moment for anything the agent might still do to show up in the NVML log.
    std::thread::sleep(Duration::from_millis(500));
    step.report(world, show);
    let touched = world.node.mutations().len() - step.mutations;
    let same_layout = instances(world) == step.instances;
    show.line(&format!(
        "nothing touched: {touched} NVML mutations, MIG layout {}",
        if same_layout { "unchanged" } else { "CHANGED" }
    ));
    allocatable(world, show, "still advertised");
    if touched != 0 || !same_layout {
        bail!("the invalid profile changed the GPUs");
    }
    Ok(())
}

/// What a chapter compares against: the states, evictions, events, MIG instances and NVML
/// mutations when it began.
pub(crate) struct Step {
    started: Instant,
    states: usize,
    evictions: usize,
    /// The Events already there, name → resourceVersion: the step reports the new ones and
    /// those repeated since (a word-for-word repeat is PATCHed into the first one's series).
    events: BTreeMap<String, String>,
    pub(crate) mutations: usize,
    instances: BTreeSet<Instance>,
    pods: BTreeMap<String, Instance>,
}

impl Step {
    /// Whether the story's watch has seen `state` as the latest since the step began.
    pub(crate) fn last_state_seen(&self, world: &World, state: &str) -> bool {
        world
            .states_since(self.states)
            .last()
            .is_some_and(|s| s.state == state)
    }

    pub(crate) fn begin(world: &World) -> Step {
        Step {
            started: Instant::now(),
            states: world.mark(),
            evictions: world.api.evictions().len(),
            events: event_names(world),
            mutations: world.node.mutations().len(),
            instances: instances(world),
            pods: pods_on_instances(world),
        }
    }

    pub(crate) fn report(&self, world: &World, show: &Show) {
        let states: Vec<String> = world
            .states_since(self.states)
            .iter()
            .map(|s| {
                let t = s.at.saturating_duration_since(self.started).as_secs_f64();
                format!("{} {t:.1}s", s.state)
            })
            .collect();
        show.line(&format!("states: {}", states.join(" → ")));
        if let Some(last) = world.states_since(self.states).last() {
            show.line(&format!("reason: {}", shorten(&last.reason)));
        }
        self.report_evictions(world, show);
        let events = world.api.events();
        let new = events.iter().filter(|e| {
            let name = e.metadata.name.as_deref().unwrap_or("");
            self.events.get(name) != e.metadata.resource_version.as_ref()
        });
        for e in new {
            show.line(&format!(
                "event {}: {}",
                e.reason.as_deref().unwrap_or(""),
                shorten(e.note.as_deref().unwrap_or(""))
            ));
        }
        let after = instances(world);
        if after != self.instances {
            let kept = self.instances.intersection(&after).count();
            let gone = self.instances.difference(&after).count();
            let made = after.difference(&self.instances).count();
            let untouched: Vec<String> = (0..8)
                .filter(|g| on_gpu(&self.instances, *g) == on_gpu(&after, *g))
                .filter(|g| !on_gpu(&after, *g).is_empty())
                .map(|g| g.to_string())
                .collect();
            let untouched = if untouched.is_empty() {
                "no GPU untouched".to_string()
            } else {
                format!("GPUs {} untouched", untouched.join(","))
            };
            show.line(&format!(
                "MIG instances: {kept} kept ({untouched}), {gone} destroyed, {made} created"
            ));
        }
        let mutations = world.node.mutations().len() - self.mutations;
        show.line(&format!("NVML mutations: {mutations}"));
    }

    /// The pods evicted since the step began (`namespace/name`).
    pub(crate) fn evicted(&self, world: &World) -> BTreeSet<String> {
        world.api.evictions()[self.evictions..]
            .iter()
            .filter(|e| e.outcome == EvictionOutcome::Evicted)
            .map(|e| format!("{}/{}", e.namespace, e.pod))
            .collect()
    }

    fn report_evictions(&self, world: &World, show: &Show) {
        let evicted = self.evicted(world);
        let after = instances(world);
        for (pod, at) in &self.pods {
            let (gpu, gi, ..) = at;
            let place = if *gi == u32::MAX {
                format!("whole GPU {gpu}, which becomes MIG")
            } else {
                format!("GPU {gpu} GI {gi}, which the new layout replaces")
            };
            if evicted.contains(&format!("default/{pod}")) {
                show.line(&format!("evicted default/{pod}: it ran on {place}"));
            } else if *gi == u32::MAX || after.contains(at) {
                show.line(&format!(
                    "kept default/{pod} running: its GPU instance stays"
                ));
            }
        }
    }
}

/// Event notes list every MIG step; the story shows their start.
pub(crate) fn shorten(text: &str) -> String {
    const MAX: usize = 240;
    match text.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}… ({} chars)", &text[..cut], text.len()),
        None => text.to_string(),
    }
}

fn on_gpu(instances: &BTreeSet<Instance>, gpu: usize) -> Vec<Instance> {
    instances.iter().filter(|i| i.0 == gpu).cloned().collect()
}

fn instances(world: &World) -> BTreeSet<Instance> {
    let state = world.node.nvml();
    let mut out = BTreeSet::new();
    for (i, gpu) in state.gpus.iter().enumerate() {
        for gi in &gpu.gpu_instances {
            out.insert((i, gi.id, gi.placement.start, gi.placement.size));
        }
    }
    out
}

/// The running tenants and the instance (or whole GPU: GI `u32::MAX`) each one's process uses.
fn pods_on_instances(world: &World) -> BTreeMap<String, Instance> {
    let state = world.node.nvml();
    let names: BTreeMap<u32, &str> = TENANTS.iter().map(|(n, p)| (*p, *n)).collect();
    let mut out = BTreeMap::new();
    for (i, gpu) in state.gpus.iter().enumerate() {
        for p in &gpu.processes {
            let Some(name) = names.get(&p.pid) else {
                continue;
            };
            let at = match p.gi_id {
                Some(gi) => gpu
                    .gpu_instances
                    .iter()
                    .find(|g| g.id == gi)
                    .map_or((i, gi, 0, 0), |g| {
                        (i, gi, g.placement.start, g.placement.size)
                    }),
                None => (i, u32::MAX, 0, 0),
            };
            out.insert(name.to_string(), at);
        }
    }
    out
}

fn whole_gpu(pod: &str, gpu: usize) -> Workload {
    Workload {
        pod: pod.to_string(),
        pid: pid_of(pod),
        gpu,
        gi: None,
    }
}

/// The message of the latest eviction of tenant-c a budget refused.
fn blocked(world: &World) -> Option<String> {
    world
        .api
        .evictions()
        .into_iter()
        .rev()
        .find_map(|e| match e.outcome {
            EvictionOutcome::Blocked { message, .. } if e.pod == "tenant-c" => Some(message),
            _ => None,
        })
}

/// The Events at the API double now, name → resourceVersion.
fn event_names(world: &World) -> BTreeMap<String, String> {
    world
        .api
        .events()
        .into_iter()
        .filter_map(|e| Some((e.metadata.name?, e.metadata.resource_version?)))
        .collect()
}

/// Wait until the Node's allocatable is exactly what the plan of `text` advertises: every
/// resource of the new layout, not only the first one the kubelet heard of (each resource has
/// its own plugin socket and ListAndWatch stream, so their updates arrive one by one).
pub(crate) fn wait_advertised(
    world: &World,
    show: &Show,
    name: &str,
    text: &str,
) -> anyhow::Result<()> {
    let expected = planned_resources(name, text)?;
    wait(
        show,
        &format!("the devices of {name} advertised"),
        15,
        || advertised(world) == expected,
    )
}

/// The resources the agent's plan advertises for `text` on this node's 8 × H100.
fn planned_resources(name: &str, text: &str) -> anyhow::Result<BTreeMap<String, u64>> {
    let profile = parse_profile(name, text).map_err(|p| anyhow::anyhow!("{p}"))?;
    let node = ObservedNode::simulated(&["h100x8".to_string()]);
    let plan = plan_for(name, &profile, &node, PluginKind::Builtin)
        .map_err(|p| anyhow::anyhow!("profile {name} does not plan: {p:?}"))?;
    Ok(plan.resources)
}

/// The node's `nvidia.com/*` allocatable, resources at 0 left out.
pub(crate) fn advertised(world: &World) -> BTreeMap<String, u64> {
    gpu_allocatable(&world.api, NODE)
        .into_iter()
        .filter(|(_, n)| *n > 0)
        .collect()
}

pub(crate) fn allocatable(world: &World, show: &Show, what: &str) {
    let list: Vec<String> = advertised(world)
        .into_iter()
        .map(|(r, n)| format!("{r}: {n}"))
        .collect();
    let list = if list.is_empty() {
        "no nvidia.com/* resources".to_string()
    } else {
        list.join(", ")
    };
    show.line(&format!("node status.allocatable {what}: {list}"));
}

/// Wait until the Node says `text` is applied, until the story's own watch has seen the
/// step's `success` too (it may lag the direct read; the step prints the states it saw), and
/// until the agent's `Applied` Event for that text is there (the agent sends it in the
/// background after `success`; the step's report lists it).
pub(crate) fn wait_applied(
    world: &World,
    show: &Show,
    step: &Step,
    name: &str,
    text: &str,
) -> anyhow::Result<()> {
    let hash = gpu_share::agent::reconcile::content_hash(text);
    let applied_event = || {
        world.api.events().iter().any(|e| {
            e.reason.as_deref() == Some("Applied")
                && e.note.as_deref().is_some_and(|n| n.contains(&hash[..12]))
        })
    };
    wait(show, &format!("{name} applied"), 60, || {
        is_applied(&world.api, NODE, text)
            && step.last_state_seen(world, "success")
            && applied_event()
    })
}

/// Wait until `done`, showing progress on a terminal; an error naming `what` after `secs`.
pub(crate) fn wait(
    show: &Show,
    what: &str,
    secs: u64,
    mut done: impl FnMut() -> bool,
) -> anyhow::Result<()> {
    let started = Instant::now();
    while !done() {
        if started.elapsed() > Duration::from_secs(secs) {
            bail!("gave up waiting for {what} after {secs}s");
        }
        show.progress(started.elapsed(), &format!("waiting for {what}"));
        std::thread::sleep(Duration::from_millis(25));
    }
    Ok(())
}
