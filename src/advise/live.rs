//! Live advise: the demand and supply read from the API server instead of files.
//!
//! Demand is every Pod that requests a GPU resource ([`from_pod`]): pending ones anywhere,
//! running ones on the nodes in the supply (a pod running elsewhere holds a device advise may
//! not change). A pending pod already bound to a node (`spec.nodeName` set: the kubelet has or
//! will have given it a device there) counts as running on that node.
//!
//! Supply is every node with the GPU Feature Discovery labels `nvidia.com/gpu.product` and
//! `nvidia.com/gpu.count` (GFD's labels, docs/sources.md#gfd-labels) or, where GFD does not
//! run, the `gpu-share.dev/gpu.product` and `gpu.count` labels gpu-share's agent writes from
//! what it found (`crate::gpu_labels`; both present, they must agree), read as
//! `plan --gpu` specs: a product the MIG catalog knows becomes that model, any other stays a
//! GPU without MIG under its product name. Its current profile is the ConfigMap key its
//! `gpu-share.dev/profile` label names. A node whose labels or profile cannot be read is left
//! out, with the reason (advise must not propose a change from a state it cannot see).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use kube::api::ListParams;
use kube::Api;

use super::demand::{from_pod, Demand, HeldDevice, Phase, PodDemand};
use super::node_gpus::{gpu_spec, gpus_of, has_gpu_labels};
use super::running::check_held_devices;
use super::supply::{Supply, SupplyNode};
use crate::gpu::MAX_SIMULATED_GPUS;
use crate::profile::parse_profile;
use crate::profile::PROFILE_LABEL;
use crate::published::{
    annotation as node_annotation, content_hash, label, APPLIED_HASH_ANNOTATION, CORDON_ANNOTATION,
    DEVICES_IN_USE_ANNOTATION, PLUGIN_LABEL,
};
use crate::sharing::PluginKind;

/// What advise reads from the cluster, as the API server returned it.
#[derive(Debug, Clone, Default)]
pub struct Cluster {
    /// The pods that request a GPU ([`from_pod`] reads them), in every namespace.
    pub pods: Vec<Pod>,
    pub nodes: Vec<Node>,
    /// The profiles ConfigMap's keys (empty when it does not exist).
    pub profiles: BTreeMap<String, String>,
}

/// Demand and supply for [`super::advise`], and the nodes left out with why.
#[derive(Debug, Clone, Default)]
pub struct LiveInput {
    pub demand: Demand,
    pub supply: Supply,
    /// `node <name>: <why>` for every node with GPU labels that is not in the supply.
    pub skipped: Vec<String>,
    /// Devices a node's agent says a running pod holds that advise could not use (stale or
    /// unreadable), each naming pod and node: that pod is matched to any device of its kind.
    pub stale_devices: Vec<String>,
}

/// List Pods (all namespaces), Nodes (those `node_selector` selects, all when none) and the
/// profiles ConfigMap `namespace/configmap`.
pub async fn read_cluster(
    client: &kube::Client,
    namespace: &str,
    configmap: &str,
    node_selector: Option<&str>,
) -> kube::Result<Cluster> {
    let pods: Api<Pod> = Api::all(client.clone());
    let nodes: Api<Node> = Api::all(client.clone());
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let mut node_params = ListParams::default();
    if let Some(selector) = node_selector {
        node_params = node_params.labels(selector);
    }
    let pods = gpu_pods(&pods).await?;
    let nodes = nodes.list(&node_params).await?.items;
    let profiles = configmaps
        .get_opt(configmap)
        .await?
        .and_then(|cm| cm.data)
        .unwrap_or_default();
    Ok(Cluster {
        pods,
        nodes,
        profiles,
    })
}

/// Pods per list request. The autopilot lists every pod each round: a page at a time (the
/// API server's `limit`/`continue`), keeping only pods that request a GPU, its memory follows
/// the GPU pods and one page, not every pod of the cluster (500 is client-go's pager default).
pub const POD_PAGE: u32 = 500;

/// Every Pod [`from_pod`] reads as demand, listed page by page; `managedFields` dropped.
async fn gpu_pods(api: &Api<Pod>) -> kube::Result<Vec<Pod>> {
    let mut params = ListParams::default().limit(POD_PAGE);
    let mut kept = Vec::new();
    loop {
        let page = api.list(&params).await?;
        kept.extend(page.items.into_iter().filter_map(|mut pod| {
            from_pod(&pod)?;
            pod.metadata.managed_fields = None;
            Some(pod)
        }));
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => return Ok(kept),
        }
    }
}

/// The demand and supply the cluster holds (see the module doc for what is read and how), for
/// nodes that run `plugin`.
pub fn from_cluster(cluster: &Cluster, plugin: PluginKind) -> LiveInput {
    let mut input = LiveInput::default();
    for node in &cluster.nodes {
        let name = node.metadata.name.as_deref().unwrap_or_default();
        // `now` names the node in its errors; supply_node's reasons get the name here.
        let checked = match supply_node(node, &cluster.profiles, plugin) {
            Ok(Some(n)) => n.now(plugin).map(|_| Some(n)).map_err(|e| e.to_string()),
            Ok(None) => Ok(None),
            Err(why) => Err(format!("node {name}: {why}")),
        };
        match checked {
            Ok(Some(n)) => input.supply.nodes.push(n),
            Ok(None) => {}
            Err(why) => input.skipped.push(why),
        }
    }
    input.supply.nodes.sort_by(|a, b| a.name.cmp(&b.name));
    let supply: std::collections::BTreeSet<&str> = (input.supply.nodes.iter())
        .map(|n| n.name.as_str())
        .collect();
    let in_supply = |node: &str| supply.contains(node);
    let mut pods: Vec<PodDemand> = cluster
        .pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(from_pod)
        .map(bound_pending_as_running)
        .filter(|p| match (&p.phase, &p.node) {
            (Phase::Running, Some(node)) => in_supply(node),
            _ => true,
        })
        .collect();
    pods.sort_by_key(PodDemand::id);
    input.demand.pods = pods;
    input.stale_devices = pin_held_devices(cluster, &mut input, plugin);
    input
}

/// Give each running pod on a supply node the devices its node's agent says it holds (the
/// Node annotation `gpu-share.dev/devices-in-use`, `src/agent/devices_in_use.rs`). A pod the
/// annotation does not name keeps matching any device of its kind; so does one whose named
/// devices do not fit the node as advise reads it (the annotation lags a change: live input
/// races), with a warning naming pod and node rather than a failed run.
fn pin_held_devices(cluster: &Cluster, input: &mut LiveInput, plugin: PluginKind) -> Vec<String> {
    let mut warnings = Vec::new();
    let nows: Vec<_> = input
        .supply
        .nodes
        .iter()
        .filter_map(|n| n.now(plugin).ok())
        .collect();
    let mut annotations: BTreeMap<&str, BTreeMap<String, serde_json::Value>> = BTreeMap::new();
    for node in &cluster.nodes {
        let name = node.metadata.name.as_deref().unwrap_or_default();
        let Some(text) = node_annotation(node, DEVICES_IN_USE_ANNOTATION) else {
            continue;
        };
        match serde_json::from_str(text) {
            Ok(by_pod) => {
                annotations.insert(name, by_pod);
            }
            Err(e) => warnings.push(format!(
                "node {name}: annotation {DEVICES_IN_USE_ANNOTATION} cannot be read ({e}); \
                 its running pods match any device of their kind"
            )),
        }
    }
    for pod in &mut input.demand.pods {
        let (Phase::Running, Some(node)) = (pod.phase, pod.node.as_deref()) else {
            continue;
        };
        let Some(named) = annotations.get(node).and_then(|a| a.get(&pod.id())) else {
            continue;
        };
        let held = serde_json::from_value::<Vec<HeldDevice>>(named.clone())
            .map_err(|e| vec![e.to_string()])
            .and_then(|devices| {
                let mut pinned = pod.clone();
                pinned.devices = devices;
                let need = pinned.need().map_err(|e| vec![e.to_string()])?;
                let errors = check_held_devices(std::slice::from_ref(&pinned), &[need], &nows);
                errors.is_empty().then_some(pinned.devices).ok_or(errors)
            });
        match held {
            Ok(devices) => pod.devices = devices,
            Err(why) => warnings.push(format!(
                "pod {} on node {node}: the devices its node's agent names are stale ({}); \
                 matched to any device of its kind",
                pod.id(),
                why.join("; ")
            )),
        }
    }
    warnings
}

/// A pending pod with `spec.nodeName` is bound: its device is on that node.
fn bound_pending_as_running(mut pod: PodDemand) -> PodDemand {
    if pod.phase == Phase::Pending && pod.node.is_some() {
        pod.phase = Phase::Running;
    }
    pod
}

/// Why a GPU node is left out of the supply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum Skipped {
    #[error("not Ready (condition Ready is {0})")]
    NotReady(String),
    #[error("cordoned, not by gpu-share")]
    CordonedByOthers,
    #[error("{PROFILE_LABEL}={0}, but the profiles ConfigMap has no key {0}")]
    NoProfile(String),
    #[error("{PROFILE_LABEL}={key} cannot be read: {problem}")]
    UnreadableProfile { key: String, problem: String },
    #[error(transparent)]
    Labels(#[from] super::node_gpus::LabelError),
    #[error("{count_read}: {count} GPUs, over the {MAX_SIMULATED_GPUS} a node holds")]
    TooManyGpus { count_read: String, count: u32 },
    /// Its agent runs another device plugin: a profile planned for this one would advertise
    /// what that plugin does not (the NVIDIA plugin shares every whole GPU alike).
    #[error(
        "its agent runs --plugin {runs} ({PLUGIN_LABEL}), but this plans for --plugin {asked}: \
         give the same --plugin to both, or leave the node out"
    )]
    OtherPlugin { runs: String, asked: &'static str },
}

/// The node as supply; none for a node without GFD's GPU labels (not a GPU node), an error
/// when its labels or its profile cannot be read.
fn supply_node(
    node: &Node,
    profiles: &BTreeMap<String, String>,
    plugin: PluginKind,
) -> Result<Option<SupplyNode>, Skipped> {
    if !has_gpu_labels(node) {
        return Ok(None);
    }
    if let Some(why) = unusable(node) {
        return Err(why);
    }
    if let Some(runs) = label(node, PLUGIN_LABEL).filter(|runs| *runs != plugin.name()) {
        return Err(Skipped::OtherPlugin {
            runs: runs.to_string(),
            asked: plugin.name(),
        });
    }
    let name = node.metadata.name.clone().unwrap_or_default();
    let (profile_name, profile) = match running_profile(node, profiles) {
        None => (None, None),
        Some(key) => {
            let text = profiles
                .get(key)
                .ok_or_else(|| Skipped::NoProfile(key.to_string()))?;
            let profile = parse_profile(key, text).map_err(|p| Skipped::UnreadableProfile {
                key: key.to_string(),
                problem: p.to_string(),
            })?;
            (Some(key.to_string()), Some(profile))
        }
    };
    let (product, count, count_read) = gpus_of(node, profile.as_ref())?;
    if count == 0 {
        return Ok(None);
    }
    if count > MAX_SIMULATED_GPUS {
        return Err(Skipped::TooManyGpus { count_read, count });
    }
    Ok(Some(SupplyNode {
        name,
        gpus: vec![gpu_spec(product, count)],
        current: None,
        profile_name,
        profile,
    }))
}

/// The key of the profile the node runs: the one its label names, unless the agent has not
/// applied that text (it is blocked or failed on it, or still working) while it did apply the
/// text of another key (its `applied-hash`): then that one. advise plans from the GPUs as they
/// are; a proposal the agent refused is not taken as applied (its layout would hide the pods
/// it refused to evict).
fn running_profile<'a>(node: &'a Node, profiles: &'a BTreeMap<String, String>) -> Option<&'a str> {
    let labelled = label(node, PROFILE_LABEL)?;
    let Some(applied) = node_annotation(node, APPLIED_HASH_ANNOTATION) else {
        return Some(labelled);
    };
    let is_applied = |key: &str| {
        profiles
            .get(key)
            .is_some_and(|t| content_hash(t) == applied)
    };
    if is_applied(labelled) {
        return Some(labelled);
    }
    profiles
        .keys()
        .map(String::as_str)
        .find(|k| is_applied(k))
        .or(Some(labelled))
}

/// Why pods cannot be placed on the node now: not Ready, or cordoned by someone other than
/// gpu-share (the agent cordons with its annotation while it changes a node; that node stays
/// supply). Advice for such a node would wait on a node nobody schedules to.
fn unusable(node: &Node) -> Option<Skipped> {
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .map(|c| c.status.as_str());
    if ready != Some("True") {
        return Some(Skipped::NotReady(ready.unwrap_or("missing").to_string()));
    }
    let cordoned = node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true);
    let by_us = node
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(CORDON_ANNOTATION));
    (cordoned && !by_us).then_some(Skipped::CordonedByOthers)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu_labels::{
        self, GFD_COUNT_LABEL as COUNT_LABEL, GFD_PRODUCT_LABEL as PRODUCT_LABEL,
    };

    /// A Ready node with these labels.
    fn node(name: &str, labels: &[(&str, &str)]) -> Node {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": labels.iter().cloned().collect::<BTreeMap<_, _>>()},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}
        }))
        .unwrap()
    }

    #[test]
    fn nodes_pods_cannot_be_placed_on_are_left_out() {
        let gpu = [(PRODUCT_LABEL, "NVIDIA-H100-80GB-HBM3"), (COUNT_LABEL, "1")];
        let mut not_ready = node("a", &gpu);
        not_ready
            .status
            .as_mut()
            .unwrap()
            .conditions
            .as_mut()
            .unwrap()[0]
            .status = "Unknown".into();
        let mut cordoned = node("b", &gpu);
        cordoned.spec = Some(Default::default());
        cordoned.spec.as_mut().unwrap().unschedulable = Some(true);
        let mut ours = cordoned.clone();
        ours.metadata.name = Some("c".into());
        ours.metadata.annotations =
            Some([(CORDON_ANNOTATION.to_string(), "reconfiguring".to_string())].into());
        let cluster = Cluster {
            nodes: vec![not_ready, cordoned, ours],
            ..Default::default()
        };
        let input = from_cluster(&cluster, PluginKind::Nvidia);
        let names: Vec<&str> = input.supply.nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(
            names,
            ["c"],
            "a node gpu-share cordoned mid-change stays supply"
        );
        assert_eq!(
            input.skipped,
            [
                "node a: not Ready (condition Ready is Unknown)",
                "node b: cordoned, not by gpu-share"
            ]
        );
    }

    fn pod(name: &str, phase: &str, node: Option<&str>, resource: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "ml"},
            "spec": {"nodeName": node, "containers": [
                {"name": "a", "resources": {"limits": {resource: "1"}}}]},
            "status": {"phase": phase}
        }))
        .unwrap()
    }

    /// Under the single MIG strategy GFD's `gpu.count` counts MIG devices: 14 1g.10gb devices
    /// on a node whose profile puts 7 on every GPU are 2 GPUs.
    #[test]
    fn a_gpu_count_past_any_node_leaves_the_node_out_naming_the_label() {
        let gpu = |count: &str| {
            node(
                "big",
                &[
                    (PRODUCT_LABEL, "NVIDIA-H100-80GB-HBM3"),
                    (COUNT_LABEL, count),
                ],
            )
        };
        let cluster = Cluster {
            nodes: vec![gpu("99999")],
            ..Default::default()
        };
        let input = from_cluster(&cluster, PluginKind::Nvidia);
        assert!(input.supply.nodes.is_empty());
        assert_eq!(
            input.skipped,
            ["node big: nvidia.com/gpu.count=99999: 99999 GPUs, over the 16 a node holds"]
        );
        let cluster = Cluster {
            nodes: vec![gpu("16")],
            ..Default::default()
        };
        assert_eq!(
            from_cluster(&cluster, PluginKind::Nvidia)
                .supply
                .nodes
                .len(),
            1
        );
    }

    /// Without GFD (a Jetson; a cluster without the GPU Operator) the labels gpu-share's agent
    /// writes are the supply; with both, they must name the same GPUs or the node is left out
    /// naming both (the autopilot publishes the reason with its status).
    #[test]
    fn without_gfd_the_agents_labels_are_the_supply_and_with_gfd_they_must_agree() {
        let ours = [
            (gpu_labels::PRODUCT_LABEL, "NVIDIA-H100-80GB-HBM3"),
            (gpu_labels::COUNT_LABEL, "2"),
        ];
        let supply_of = |nodes: Vec<Node>| {
            let input = from_cluster(
                &Cluster {
                    nodes,
                    ..Default::default()
                },
                PluginKind::Nvidia,
            );
            let gpus: Vec<Vec<String>> =
                input.supply.nodes.iter().map(|n| n.gpus.clone()).collect();
            (gpus, input.skipped)
        };
        assert_eq!(
            supply_of(vec![node("no-gfd", &ours)]),
            (vec![vec!["h100-80gb-sxmx2".to_string()]], vec![])
        );
        let jetson = [
            (
                gpu_labels::PRODUCT_LABEL,
                "NVIDIA-Jetson-Orin-Nano-Developer-Kit",
            ),
            (gpu_labels::COUNT_LABEL, "1"),
        ];
        assert_eq!(
            supply_of(vec![node("jetson", &jetson)]).0,
            [["NVIDIA Jetson Orin Nano Developer Kitx1"]]
        );
        // GFD beside the agent, shared replicas: the same two H100s.
        let agreeing = [
            ours[0],
            ours[1],
            (PRODUCT_LABEL, "NVIDIA-H100-80GB-HBM3-SHARED"),
            (COUNT_LABEL, "2"),
        ];
        assert_eq!(supply_of(vec![node("both", &agreeing)]).0.len(), 1);
        let disagreeing = [
            ours[0],
            ours[1],
            (PRODUCT_LABEL, "NVIDIA-H100-80GB-HBM3"),
            (COUNT_LABEL, "1"),
        ];
        let (gpus, skipped) = supply_of(vec![node("lost-one", &disagreeing)]);
        assert!(gpus.is_empty());
        assert!(
            skipped[0].starts_with("node lost-one: GPU Feature Discovery says")
                && skipped[0].contains("(1 GPUs)")
                && skipped[0].contains("found gpu-share.dev/gpu.product=NVIDIA-H100-80GB-HBM3 (2)"),
            "{skipped:?}"
        );
        let mixed = [
            (gpu_labels::PRODUCT_LABEL, gpu_labels::MIXED),
            (gpu_labels::COUNT_LABEL, "2"),
        ];
        let (_, skipped) = supply_of(vec![node("mixed", &mixed)]);
        assert!(
            skipped[0].contains("GPUs of several products"),
            "{skipped:?}"
        );
        let no_count = [(gpu_labels::PRODUCT_LABEL, "NVIDIA-H100-80GB-HBM3")];
        let (_, skipped) = supply_of(vec![node("half", &no_count)]);
        assert_eq!(
            skipped,
            ["node half: gpu-share.dev/gpu.product=NVIDIA-H100-80GB-HBM3 but no numeric gpu-share.dev/gpu.count label"]
        );
    }

    #[test]
    fn nodes_pods_and_profiles_become_supply_and_demand() {
        let profiles = BTreeMap::from([(
            "small".to_string(),
            "version: v1\nrules:\n- devices: all\n  mig: {1g.10gb: 7}\n".to_string(),
        )]);
        let cluster = Cluster {
            nodes: vec![
                node(
                    "gpu-a",
                    &[
                        (PRODUCT_LABEL, "NVIDIA-H100-80GB-HBM3"),
                        (COUNT_LABEL, "2"),
                        (PROFILE_LABEL, "small"),
                    ],
                ),
                node("cpu-1", &[]),
                node(
                    "gpu-b",
                    &[
                        (PRODUCT_LABEL, "NVIDIA-H100-80GB-HBM3"),
                        (COUNT_LABEL, "1"),
                        (PROFILE_LABEL, "missing"),
                    ],
                ),
            ],
            pods: vec![
                pod("wait", "Pending", None, "nvidia.com/mig-3g.40gb"),
                pod("bound", "Pending", Some("gpu-a"), "nvidia.com/mig-1g.10gb"),
                pod("elsewhere", "Running", Some("gpu-b"), "nvidia.com/gpu"),
                pod("done", "Succeeded", Some("gpu-a"), "nvidia.com/gpu"),
                pod("cpu", "Pending", None, "cpu"),
            ],
            profiles,
        };
        let input = from_cluster(&cluster, PluginKind::Nvidia);
        assert_eq!(input.supply.nodes.len(), 1);
        let a = &input.supply.nodes[0];
        assert_eq!(
            (a.name.as_str(), a.gpus.as_slice()),
            ("gpu-a", &["h100-80gb-sxmx2".to_string()][..])
        );
        assert_eq!(a.profile_name.as_deref(), Some("small"));
        assert!(a.profile.is_some());
        assert_eq!(input.skipped.len(), 1);
        assert!(
            input.skipped[0].starts_with("node gpu-b:")
                && input.skipped[0].contains("no key missing"),
            "{:?}",
            input.skipped
        );
        let ids: Vec<(String, Phase)> = input
            .demand
            .pods
            .iter()
            .map(|p| (p.name.clone(), p.phase))
            .collect();
        assert_eq!(
            ids,
            [
                ("bound".to_string(), Phase::Running),
                ("wait".to_string(), Phase::Pending)
            ]
        );
    }

    /// Node `g` (one H100, profile `small`: seven 1g.10gb) carrying `devices_in_use` as the
    /// agent's annotation, and running pods `ml/<name>` on it each asking one 1g.10gb.
    fn annotated_cluster(devices_in_use: &str, pods: &[&str]) -> Cluster {
        let mut g = node(
            "g",
            &[
                (PRODUCT_LABEL, "NVIDIA-H100-80GB-HBM3"),
                (COUNT_LABEL, "1"),
                (PROFILE_LABEL, "small"),
            ],
        );
        g.metadata.annotations = Some(
            [(
                DEVICES_IN_USE_ANNOTATION.to_string(),
                devices_in_use.to_string(),
            )]
            .into(),
        );
        Cluster {
            nodes: vec![g],
            pods: pods
                .iter()
                .map(|p| pod(p, "Running", Some("g"), "nvidia.com/mig-1g.10gb"))
                .collect(),
            profiles: [(
                "small".to_string(),
                "version: v1\nrules: [{devices: all, mig: {1g.10gb: 7}}]\n".to_string(),
            )]
            .into(),
        }
    }

    fn devices_of<'a>(input: &'a LiveInput, pod: &str) -> &'a [HeldDevice] {
        &input
            .demand
            .pods
            .iter()
            .find(|p| p.name == pod)
            .expect("the pod is demand")
            .devices
    }

    #[test]
    fn running_pods_get_the_devices_their_nodes_agent_names_and_stale_ones_are_dropped() {
        let annotation = r#"{"ml/pinned":[{"gpu":0,"migPlacementStart":6,"migProfile":"1g.10gb"}],
            "ml/stale":[{"gpu":0,"migPlacementStart":9,"migProfile":"1g.10gb"}],
            "ml/gone":[{"gpu":0,"migPlacementStart":1}],
            "gpu-share.dev/truncated":0}"#;
        let cluster = annotated_cluster(annotation, &["pinned", "stale", "unnamed"]);
        let input = from_cluster(&cluster, PluginKind::Nvidia);
        assert_eq!(
            devices_of(&input, "pinned"),
            [HeldDevice {
                gpu: 0,
                mig_placement_start: Some(6),
                mig_profile: Some("1g.10gb".into())
            }]
        );
        assert!(
            devices_of(&input, "stale").is_empty(),
            "a stale device is dropped"
        );
        assert!(
            devices_of(&input, "unnamed").is_empty(),
            "not named: any device"
        );
        assert_eq!(input.stale_devices.len(), 1, "{:?}", input.stale_devices);
        let warning = &input.stale_devices[0];
        assert!(
            warning.starts_with("pod ml/stale on node g:") && warning.contains("placement"),
            "{warning}"
        );
        // The pinned pod is held where the agent says, so advise runs on this input.
        crate::advise::advise(&input.demand, &input.supply, PluginKind::Nvidia)
            .expect("advise accepts the pinned devices");
    }

    /// The agent writes its own device type (it may not import advise); advise reads it as
    /// the demand's `HeldDevice`, unknown fields refused: the two must agree.
    #[test]
    fn what_the_agent_writes_reads_back_as_the_demands_held_devices() {
        use crate::agent::devices_in_use as agent;
        let written: agent::DevicesInUse = [(
            "ml/p".to_string(),
            vec![
                agent::HeldDevice {
                    gpu: 2,
                    mig_placement_start: Some(4),
                    mig_profile: Some("3g.40gb".into()),
                },
                agent::HeldDevice {
                    gpu: 5,
                    mig_placement_start: None,
                    mig_profile: None,
                },
            ],
        )]
        .into();
        let (text, _) = agent::annotation_text(&written, agent::MAX_ANNOTATION_BYTES);
        let read: BTreeMap<String, Vec<HeldDevice>> = serde_json::from_str(&text).unwrap();
        assert_eq!(
            read["ml/p"],
            [
                HeldDevice {
                    gpu: 2,
                    mig_placement_start: Some(4),
                    mig_profile: Some("3g.40gb".into())
                },
                HeldDevice {
                    gpu: 5,
                    mig_placement_start: None,
                    mig_profile: None
                }
            ]
        );
    }

    #[test]
    fn an_unreadable_annotation_is_a_warning_naming_the_node_and_pins_nothing() {
        let cluster = annotated_cluster("{not json", &["p"]);
        let input = from_cluster(&cluster, PluginKind::Nvidia);
        assert!(devices_of(&input, "p").is_empty());
        assert_eq!(input.stale_devices.len(), 1);
        assert!(
            input.stale_devices[0].starts_with("node g: annotation gpu-share.dev/devices-in-use"),
            "{:?}",
            input.stale_devices
        );
    }
}
