//! Chapter 5, "Demand decides the geometry": the node opts in to `gpu-share autopilot`, pods
//! arrive that its profile cannot serve, and the autopilot sizes a profile from them: first in
//! dry-run (it only publishes what it would do), then for real (it writes `advised-<node>` and
//! relabels the node; the agent does the rest). Every line is read back from the world: the
//! status ConfigMap and Events the autopilot wrote, the Node, the ConfigMap, the evictions.
//!
//! The autopilot runs as the demo runs the agent: its library, in this process. The deployed
//! loop (`gpu_share::autopilot::run`) waits for a quiet moment after each pod or node change and
//! then runs one [`Round`]; the story runs those rounds itself, one per step, so each step shows
//! exactly one round's result without waiting out a debounce.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use gpu_share::agent::devices_in_use::DEVICES_IN_USE_ANNOTATION;
use gpu_share::autopilot::publish::{PROPOSED, STATUS_KEY};
use gpu_share::autopilot::round::{Round, Settings, OPT_IN_LABEL};
use gpu_share::autopilot::AutopilotArgs;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::events::{Recorder, Reporter};
use node_sim::{is_applied, Workload, CM, NS, PROFILE_LABEL};

use crate::profiles::INFERENCE_MIXED_EDITED;
use crate::show::Show;
use crate::sim::{World, NODE};
use crate::story::{
    advertised, allocatable, pid_of, shorten, tenant_of, wait, wait_advertised, wait_applied, Step,
};

/// Where the new pods go.
const NAMESPACE: &str = "ml";

/// The pods that arrive: four want a 3g.40gb MIG instance (the node has two), two want a
/// time-sliced share of a GPU (`gpu-share.dev/isolation: shared`; the node has no shared GPU).
const ARRIVING: [(&str, &str, Option<&str>); 6] = [
    ("medium-0", "nvidia.com/mig-3g.40gb", None),
    ("medium-1", "nvidia.com/mig-3g.40gb", None),
    ("medium-2", "nvidia.com/mig-3g.40gb", None),
    ("medium-3", "nvidia.com/mig-3g.40gb", None),
    ("notebook-0", "nvidia.com/gpu", Some("shared")),
    ("notebook-1", "nvidia.com/gpu", Some("shared")),
];

#[derive(Parser)]
struct AutopilotCommandLine {
    #[command(flatten)]
    autopilot: AutopilotArgs,
}

pub fn demand_decides(world: &World, show: &Show) -> anyhow::Result<()> {
    show.chapter(5, "Demand decides the geometry: gpu-share autopilot");
    back_to_a_profile_that_plans(world, show)?;
    more_tenants(world, show);
    opt_in(world, show);
    arrive(world);
    fit(world, show, "with the current profile");
    dry_run(world, show)?;
    for_real(world, show)?;
    fit(world, show, "after the autopilot");
    Ok(())
}

/// The node is on the invalid profile of chapter 4: the autopilot leaves out a node whose
/// profile does not plan (it cannot tell what the GPUs hold), so the operator puts the last
/// good profile back first. Its layout is already on the GPUs: nothing to change.
fn back_to_a_profile_that_plans(world: &World, show: &Show) -> anyhow::Result<()> {
    let step = Step::begin(world);
    world
        .api
        .set_node_label(NODE, PROFILE_LABEL, Some("inference-mixed"));
    wait(show, "inference-mixed applied again", 30, || {
        is_applied(&world.api, NODE, INFERENCE_MIXED_EDITED)
            && step.last_state_seen(world, "success")
    })?;
    let mutations = world.node.mutations().len() - step.mutations;
    show.line(&format!(
        "kubectl label node {NODE} gpu-share.dev/profile=inference-mixed: {} ({mutations} NVML mutations)",
        node_sim::state_of(&world.api, NODE).unwrap_or_default()
    ));
    Ok(())
}

/// Two more running tenants on 1g.10gb instances, so the reader sees which pods a change
/// evicts: only those whose instance the new layout replaces.
fn more_tenants(world: &World, show: &Show) {
    let at_start = |gpu| world.node.gi_at(gpu, 0);
    let tenants = [
        Workload::on_mig("tenant-d", pid_of("tenant-d"), 3, at_start(3)),
        Workload::on_mig("tenant-e", pid_of("tenant-e"), 4, at_start(4)),
    ];
    world.node.add_workloads(&world.api, &tenants);
    world.hand_devices(&tenants);
    let running: Vec<String> = world
        .node
        .nvml()
        .gpus
        .iter()
        .enumerate()
        .flat_map(|(i, gpu)| {
            gpu.processes.iter().filter_map(move |p| {
                let pod = tenant_of(p.pid)?;
                Some(format!("default/{pod} on GPU {i} GI {}", p.gi_id?))
            })
        })
        .collect();
    show.line(&format!("running on MIG instances: {}", running.join(", ")));
    // The agent's next pass (a 2 s resync) publishes which instance each pod holds; the
    // autopilot reads it so its prediction names the pods the agent will evict.
    let published = node_sim::poll(Duration::from_secs(20), Duration::from_millis(100), || {
        node_sim::annotation(&world.api, NODE, DEVICES_IN_USE_ANNOTATION).is_some_and(|a| {
            tenants
                .iter()
                .all(|t| a.contains(&format!("\"default/{}\"", t.pod)))
        })
    });
    show.line(&format!(
        "agent annotation {DEVICES_IN_USE_ANNOTATION}: {}",
        node_sim::annotation(&world.api, NODE, DEVICES_IN_USE_ANNOTATION)
            .filter(|_| published)
            .unwrap_or_else(|| "(not published)".into())
    ));
}

/// The opt-in label, beside the GPU Feature Discovery labels the autopilot reads the GPUs from.
fn opt_in(world: &World, show: &Show) {
    world
        .api
        .set_node_label(NODE, OPT_IN_LABEL, Some("enabled"));
    let labels = node_labels(world);
    let shown: Vec<String> = [
        OPT_IN_LABEL,
        "nvidia.com/gpu.product",
        "nvidia.com/gpu.count",
    ]
    .iter()
    .map(|k| format!("{k}={}", labels.get(*k).map_or("(none)", String::as_str)))
    .collect();
    show.line(&format!("node labels: {}", shown.join(", ")));
}

fn arrive(world: &World) {
    for (name, resource, isolation) in ARRIVING {
        let annotations = isolation.map(|i| BTreeMap::from([("gpu-share.dev/isolation", i)]));
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": NAMESPACE, "annotations": annotations},
            "spec": {"containers": [{"name": "main", "resources": {"limits": {resource: "1"}}}]},
            "status": {"phase": "Pending"},
        }))
        .expect("a pod");
        world.api.put_pod(pod);
    }
}

/// Each arriving pod's request against the node's allocatable, after what the pods running on
/// the node hold (the order a scheduler would meet them in: running first, then by name).
fn fit(world: &World, show: &Show, when: &str) {
    let mut free = free_after_running(world);
    let mut fitting = 0;
    for (name, ..) in ARRIVING {
        let Some(pod) = world.api.pod(NAMESPACE, name) else {
            continue;
        };
        let requests = gpu_requests(&pod);
        let asked: Vec<String> = requests
            .iter()
            .map(|(r, n)| {
                let left = free.get(r).copied().unwrap_or(0);
                format!("{r}: {n}{}, {left} free", isolation(&pod))
            })
            .collect();
        let fits = requests
            .iter()
            .all(|(r, n)| free.get(r).copied().unwrap_or(0) >= *n);
        if fits {
            fitting += 1;
            for (r, n) in &requests {
                *free.get_mut(r).expect("fits") -= n;
            }
        }
        show.line(&format!(
            "{NAMESPACE}/{name} asks {} → {}",
            asked.join(", "),
            if fits { "fits" } else { "does not fit" }
        ));
    }
    show.line(&format!(
        "{fitting} of {} arriving pods fit {when}",
        ARRIVING.len()
    ));
}

/// The node's `nvidia.com/*` allocatable less what its running pods request.
fn free_after_running(world: &World) -> BTreeMap<String, u64> {
    let mut free = advertised(world);
    let running = world.api.pods_on(NODE).into_iter().filter(|p| {
        p.metadata.deletion_timestamp.is_none()
            && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
    });
    for pod in running {
        for (resource, n) in gpu_requests(&pod) {
            let left = free.entry(resource).or_default();
            *left = left.saturating_sub(n);
        }
    }
    free
}

/// ` (shared)` for a pod annotated `gpu-share.dev/isolation: shared`, empty otherwise.
fn isolation(pod: &Pod) -> String {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("gpu-share.dev/isolation"))
        .map_or(String::new(), |i| format!(" ({i})"))
}

/// One dry-run round: the status ConfigMap and the ProfileProposed Event say what it would
/// do; neither the node's label nor the profiles ConfigMap changes.
fn dry_run(world: &World, show: &Show) -> anyhow::Result<()> {
    let round = round(world, true)?;
    show.line("gpu-share autopilot --dry-run --plugin builtin: one round");
    world.block_on(round.run())?;
    let status = status_document(world, &round.settings)?;
    show_status(show, &round.settings, &status);
    for note in event_notes(world, PROPOSED) {
        show.line(&format!(
            "event {PROPOSED} on Node {NODE}: {}",
            shorten(&note)
        ));
    }
    let key = format!("advised-{NODE}");
    let written = profiles(world).contains_key(&key);
    show.line(&format!(
        "dry-run wrote nothing: node label {PROFILE_LABEL}={}, ConfigMap key {key} {}",
        node_labels(world)
            .get(PROFILE_LABEL)
            .map_or("(none)", String::as_str),
        if written { "WRITTEN" } else { "absent" }
    ));
    Ok(())
}

/// One round for real: it writes `advised-<node>` and relabels the node; then the agent
/// applies it as any profile (drains only the pods on changed instances).
fn for_real(world: &World, show: &Show) -> anyhow::Result<()> {
    let round = round(world, false)?;
    show.line("gpu-share autopilot --plugin builtin: one round");
    let step = Step::begin(world);
    world.block_on(round.run())?;
    let status = status_document(world, &round.settings)?;
    show_status(show, &round.settings, &status);
    let key = node_labels(world)
        .get(PROFILE_LABEL)
        .cloned()
        .unwrap_or_default();
    let text = profiles(world)
        .get(&key)
        .cloned()
        .with_context(|| format!("the node's label names {key:?}, not in the ConfigMap"))?;
    show.line(&format!(
        "autopilot wrote ConfigMap key {key} and labelled the node {PROFILE_LABEL}={key}; its rules:"
    ));
    for rule in rule_lines(&text)? {
        show.line(&format!("  {rule}"));
    }
    wait_applied(world, show, &step, &key, &text)?;
    step.report(world, show);
    let evicted: Vec<String> = step.evicted(world).into_iter().collect();
    let predicted = predicted_evictions(&status);
    // The autopilot reads which instance each pod holds from the agent's devices-in-use
    // annotation, so what it predicts is what the agent's drain does.
    show.line(&format!(
        "evicted by the agent: {}; the autopilot's status listed as evicted: {} ({})",
        list_or_none(&evicted),
        list_or_none(&predicted),
        if evicted == predicted {
            "the prediction held"
        } else {
            "the prediction MISSED"
        }
    ));
    wait_advertised(world, show, &key, &text)?;
    allocatable(world, show, "now advertised");
    Ok(())
}

/// A round of the real autopilot with the flags a user would give, on the world's API double.
fn round(world: &World, dry_run: bool) -> anyhow::Result<Round> {
    let mut argv = vec!["autopilot", "--namespace", NS, "--configmap", CM];
    argv.extend(["--plugin", "builtin", "--identity", "gpu-share-demo"]);
    if dry_run {
        argv.push("--dry-run");
    }
    let args = AutopilotCommandLine::try_parse_from(argv)?.autopilot;
    let client = world.client();
    let identity = args.identity.clone().unwrap_or_default();
    Ok(Round {
        recorder: Recorder::new(
            client.clone(),
            Reporter {
                controller: "gpu-share-autopilot".into(),
                instance: Some(identity.clone()),
            },
        ),
        client,
        settings: Settings {
            namespace: args.profiles.namespace,
            configmap: args.profiles.configmap,
            status_configmap: args.status_configmap,
            identity,
            plugin: args.plugin,
            max_changing: args.max_concurrent_drains.max(1),
            dry_run: args.dry_run,
        },
    })
}

/// The status ConfigMap's document, as the autopilot wrote it.
fn status_document(world: &World, settings: &Settings) -> anyhow::Result<serde_yaml::Value> {
    let name = &settings.status_configmap;
    let text = world
        .api
        .configmap(&settings.namespace, name)
        .and_then(|cm| cm.data?.get(STATUS_KEY).cloned())
        .with_context(|| format!("no {STATUS_KEY} in ConfigMap {name}"))?;
    Ok(serde_yaml::from_str(&text)?)
}

/// The status document's summary: the dry-run flag, unschedulable pods, this node's line.
fn show_status(show: &Show, settings: &Settings, status: &serde_yaml::Value) {
    let unschedulable = status["unschedulable"].as_sequence().map_or(0, Vec::len);
    show.line(&format!(
        "status ConfigMap {}/{}: dryRun {}, unschedulable pods {unschedulable}",
        settings.namespace,
        settings.status_configmap,
        status["dryRun"].as_bool().unwrap_or_default()
    ));
    let nodes = status["nodes"].as_sequence().cloned().unwrap_or_default();
    for node in nodes.iter().filter(|n| n["node"].as_str() == Some(NODE)) {
        let text = |k: &str| node[k].as_str().unwrap_or_default().to_string();
        let count = |k: &str| node[k].as_u64().unwrap_or_default();
        show.line(&format!(
            "  {NODE}: action {}, profileKey {}, pods {}, instances kept {} destroyed {} created {}",
            text("action"),
            text("profileKey"),
            count("pods"),
            count("instancesKept"),
            count("instancesDestroyed"),
            count("instancesCreated"),
        ));
        show.line(&format!("  reason: {}", shorten(&text("reason"))));
    }
}

/// One line per rule of a profile's YAML: its name, GPUs and the mode it gives them.
fn rule_lines(text: &str) -> anyhow::Result<Vec<String>> {
    let profile: serde_yaml::Value = serde_yaml::from_str(text)?;
    let rules = profile["rules"].as_sequence().cloned().unwrap_or_default();
    let flow = |v: &serde_yaml::Value| serde_json::to_string(v).unwrap_or_default();
    Ok(rules
        .iter()
        .map(|rule| {
            let Some(fields) = rule.as_mapping() else {
                return flow(rule);
            };
            let modes: Vec<String> = fields
                .iter()
                .filter(|(k, _)| !matches!(k.as_str(), Some("name" | "devices")))
                .map(|(k, v)| format!("{} {}", k.as_str().unwrap_or_default(), flow(v)))
                .collect();
            format!(
                "rule {}: GPUs {} → {}",
                rule["name"].as_str().unwrap_or("(unnamed)"),
                flow(&rule["devices"]),
                modes.join(", ")
            )
        })
        .collect())
}

fn predicted_evictions(status: &serde_yaml::Value) -> Vec<String> {
    let nodes = status["nodes"].as_sequence().cloned().unwrap_or_default();
    nodes
        .iter()
        .filter(|n| n["node"].as_str() == Some(NODE))
        .flat_map(|n| n["podsEvicted"].as_sequence().cloned().unwrap_or_default())
        .filter_map(|p| p.as_str().map(str::to_string))
        .collect()
}

fn list_or_none(items: &[String]) -> String {
    if items.is_empty() {
        "none".to_string()
    } else {
        items.join(", ")
    }
}

/// The notes of the Events with `reason` on the node.
fn event_notes(world: &World, reason: &str) -> Vec<String> {
    world
        .api
        .events()
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(NODE))
        .filter_map(|e| e.note)
        .collect()
}

fn node_labels(world: &World) -> BTreeMap<String, String> {
    world
        .api
        .node(NODE)
        .and_then(|n| n.metadata.labels)
        .unwrap_or_default()
}

fn profiles(world: &World) -> BTreeMap<String, String> {
    world
        .api
        .configmap(NS, CM)
        .and_then(|cm| cm.data)
        .unwrap_or_default()
}

/// A pod's `nvidia.com/*` limits summed over its containers.
fn gpu_requests(pod: &Pod) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let containers = pod.spec.iter().flat_map(|s| &s.containers);
    for c in containers {
        let limits = c.resources.iter().flat_map(|r| r.limits.iter().flatten());
        for (resource, q) in limits {
            if let (true, Ok(n)) = (resource.starts_with("nvidia.com/"), q.0.parse::<u64>()) {
                *out.entry(resource.clone()).or_default() += n;
            }
        }
    }
    out
}
