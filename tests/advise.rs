//! `gpu-share advise` run as a process on the example files in tests/data/advise/: every
//! proposed profile validates, and planned on its node (independently of advise's own report)
//! it advertises at least what the pods placed there request, so every pending pod fits.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};

use gpu_share::advise::{Demand, Phase, Supply};
use gpu_share::plan::plan_for;
use gpu_share::profile::{read_profiles, Profile};
use gpu_share::sharing::PluginKind;
use gpu_share::validate::validate_for;

const DEMAND: &str = "tests/data/advise/demand.yaml";
const SUPPLY: &str = "tests/data/advise/supply.yaml";

fn data(path: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(path)).unwrap()
}

fn advise(plugin: &str, output: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gpu-share"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args([
            "advise", "--demand", DEMAND, "--supply", SUPPLY, "--plugin", plugin, "--output",
            output,
        ])
        .output()
        .unwrap()
}

fn plugin_kind(plugin: &str) -> PluginKind {
    match plugin {
        "nvidia" => PluginKind::Nvidia,
        _ => PluginKind::Builtin,
    }
}

/// Plan each node's proposal on the node as the supply file gives it, and check that what the
/// plan advertises covers, per resource, the requests of the pods advise put there (the count
/// the kubelet schedules by).
fn check_proposals_serve_their_pods(report: &serde_json::Value, plugin: PluginKind) {
    let supply: Supply = serde_yaml::from_str(&data(SUPPLY)).unwrap();
    let demand: Demand = serde_yaml::from_str(&data(DEMAND)).unwrap();
    let mut placed = Vec::new();
    for node_report in report["nodes"].as_array().unwrap() {
        let name = node_report["node"].as_str().unwrap();
        let key = node_report["profileKey"].as_str().unwrap();
        let profile: Profile = serde_json::from_value(node_report["profile"].clone()).unwrap();
        let problems = validate_for(key, &profile, plugin);
        assert!(
            problems.iter().all(|p| !p.is_error()),
            "{key}: {problems:?}"
        );
        let node = supply.nodes.iter().find(|n| n.name == name).unwrap();
        let now = node.now(plugin).unwrap();
        let plan = plan_for(key, &profile, &now.observed, plugin)
            .unwrap_or_else(|p| panic!("{key} does not plan on {name}: {p:?}"));
        let mut requested: BTreeMap<String, u64> = BTreeMap::new();
        for pod_id in node_report["pods"].as_array().unwrap() {
            let pod = demand
                .pods
                .iter()
                .find(|p| p.id() == pod_id.as_str().unwrap())
                .unwrap();
            for (resource, n) in &pod.requests {
                *requested.entry(resource.clone()).or_insert(0) += u64::from(*n);
            }
            placed.push(pod.id());
        }
        for (resource, n) in &requested {
            let advertised = plan.resources.get(resource).copied().unwrap_or(0);
            assert!(
                advertised >= *n,
                "{name}: {resource}: {n} requested, {advertised} advertised by {key}"
            );
        }
    }
    for pod in demand
        .pods
        .iter()
        .filter(|p| !p.requests.keys().all(|r| r == "cpu"))
    {
        assert!(placed.contains(&pod.id()), "{} is placed nowhere", pod.id());
        if pod.phase == Phase::Running {
            let on = report["nodes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|n| n["pods"].as_array().unwrap().iter().any(|p| p == &pod.id()));
            assert_eq!(
                on.unwrap()["node"],
                pod.node.as_deref().unwrap(),
                "{} moved",
                pod.id()
            );
        }
    }
}

#[test]
fn every_pending_pod_fits_the_proposals_with_either_plugin() {
    for plugin in ["nvidia", "builtin"] {
        let out = advise(plugin, "json");
        assert!(
            out.status.success(),
            "{plugin}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(report["totals"]["unschedulablePods"], 0);
        assert_eq!(
            report["totals"]["podsEvicted"], 0,
            "running pods keep their devices"
        );
        assert_eq!(
            report["totals"]["instancesDestroyed"], 0,
            "only free capacity is reshaped"
        );
        check_proposals_serve_their_pods(&report, plugin_kind(plugin));
    }
}

/// The ConfigMap output is a ConfigMap the agent reads (every key a valid profile) followed by
/// one label command per node.
#[test]
fn the_configmap_output_holds_every_proposal_and_the_label_commands() {
    let out = advise("nvidia", "configmap");
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let profiles = read_profiles("advice", &text);
    let keys: Vec<&str> = profiles.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(
        keys,
        [
            "advised-gpu-a",
            "advised-gpu-b",
            "advised-gpu-c",
            "advised-gpu-d"
        ]
    );
    for named in &profiles {
        let profile = named.profile.as_ref().unwrap();
        assert!(validate_for(&named.name, profile, PluginKind::Nvidia)
            .iter()
            .all(|p| !p.is_error()));
    }
    for node in ["gpu-a", "gpu-b", "gpu-c", "gpu-d"] {
        let command =
            format!("# kubectl label node {node} gpu-share.dev/profile=advised-{node} --overwrite");
        assert!(
            text.lines().any(|l| l == command),
            "{command} missing:\n{text}"
        );
    }
}

#[test]
fn the_text_report_says_what_changes_per_node() {
    let out = advise("nvidia", "text");
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.starts_with(
            "advise (nvidia plugin): 0 unschedulable, 0 pod(s) evicted, 0 instance(s) destroyed"
        ),
        "{text}"
    );
    assert!(
        text.contains("node gpu-a → profile advised-gpu-a"),
        "{text}"
    );
    assert!(text.contains("mig 1×7g.80gb"), "{text}");
}

/// Bad input is refused with the pod named, nothing proposed, exit 1.
#[test]
fn a_bad_request_is_refused_naming_the_pod() {
    let dir = tempfile::tempdir().unwrap();
    let demand = dir.path().join("demand.yaml");
    std::fs::write(&demand, "pods:\n  - {name: x, phase: pending, requests: {nvidia.com/gpu: 1}, annotations: {gpu-share.dev/isolation: vgpu}}\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_gpu-share"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args([
            "advise",
            "--demand",
            demand.to_str().unwrap(),
            "--supply",
            SUPPLY,
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "error: pod default/x: gpu-share.dev/isolation: \"vgpu\" is not mig, mps or shared"
        ),
        "{err}"
    );
}

/// A running pod may name the device it holds: the demand schema documents it, and a
/// device its node does not have is refused naming pod, node and device, exit 1.
#[test]
fn a_held_device_not_on_the_node_is_refused_naming_pod_node_and_device() {
    let schema = Command::new(env!("CARGO_BIN_EXE_gpu-share"))
        .args(["schema", "--of", "demand"])
        .output()
        .unwrap();
    assert!(schema.status.success());
    let schema: serde_json::Value = serde_json::from_slice(&schema.stdout).unwrap();
    let device = &schema["$defs"]["HeldDevice"]["properties"];
    for field in ["gpu", "migPlacementStart", "migProfile"] {
        assert!(device[field].is_object(), "{field} in {device}");
    }
    let dir = tempfile::tempdir().unwrap();
    let demand = dir.path().join("demand.yaml");
    // gpu-a has 4 H100s (indexes 0-3); GPU 0 holds seven 1g.10gb at placements 0-6.
    std::fs::write(
        &demand,
        "pods:\n  - {name: r, node: gpu-a, phase: running, requests: {nvidia.com/mig-1g.10gb: 1},\n     devices: [{gpu: 9, migPlacementStart: 2}]}\n  - {name: ok, node: gpu-a, phase: running, requests: {nvidia.com/mig-1g.10gb: 1},\n     devices: [{gpu: 0, migPlacementStart: 2, migProfile: 1g.10gb}]}\n",
    )
.unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_gpu-share"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args([
            "advise",
            "--demand",
            demand.to_str().unwrap(),
            "--supply",
            SUPPLY,
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("error: pod default/r: device GPU 9 instance at placement 2 on node gpu-a: no such GPU (the node has GPUs 0, 1, 2, 3)"),
        "{err}"
    );
    assert!(!err.contains("pod default/ok"), "{err}");
}

/// `advise --live` on the Kubernetes API double (the real kube client over HTTP): the example
/// demand seeded as Pods, the example supply as Nodes with GPU Feature Discovery labels
/// (`nvidia.com/gpu.product` sanitised as GFD writes it, nvidia-stack.md §1.8) and the profiles
/// ConfigMap their `gpu-share.dev/profile` labels name. The proposals are checked the same way
/// as the file mode's: validated, planned on each node independently, every pending pod placed
/// and served.
#[test]
fn live_advise_reads_pods_nodes_and_profiles_from_the_api_and_every_pending_pod_fits() {
    use kube_double::KubeDouble;
    let api = KubeDouble::start();
    let supply: Supply = serde_yaml::from_str(&data(SUPPLY)).unwrap();
    let demand: Demand = serde_yaml::from_str(&data(DEMAND)).unwrap();
    let mut profiles = serde_json::Map::new();
    for node in &supply.nodes {
        let now = node.now(PluginKind::Nvidia).unwrap();
        let product = now.observed.gpus[0].product.replace(' ', "-");
        let count = now.observed.gpus.len().to_string();
        let mut labels = vec![
            ("nvidia.com/gpu.product", product.as_str()),
            ("nvidia.com/gpu.count", count.as_str()),
        ];
        if let (Some(key), Some(profile)) = (&node.profile_name, &node.profile) {
            labels.push(("gpu-share.dev/profile", key.as_str()));
            profiles.insert(key.clone(), serde_yaml::to_string(profile).unwrap().into());
        }
        api.put_node(kube_double::fixtures::node(&node.name, &labels));
    }
    // A CPU-only node: no GFD labels, not supply.
    api.put_node(kube_double::fixtures::node("cpu-1", &[]));
    api.put(
        serde_json::from_value::<k8s_openapi::api::core::v1::ConfigMap>(serde_json::json!({
            "metadata": {"name": "gpu-share-profiles", "namespace": "gpu-share"},
            "data": profiles,
        }))
        .unwrap(),
    );
    for pod in &demand.pods {
        let limits: BTreeMap<&String, String> = pod
            .requests
            .iter()
            .map(|(r, n)| (r, n.to_string()))
            .collect();
        let phase = match pod.phase {
            Phase::Pending => "Pending",
            Phase::Running => "Running",
        };
        api.put_pod(
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": pod.name, "namespace": pod.namespace,
                             "annotations": pod.annotations},
                "spec": {"nodeName": pod.node, "containers": [
                    {"name": "main", "resources": {"limits": limits}}]},
                "status": {"phase": phase},
            }))
            .unwrap(),
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).unwrap();
    for plugin in ["nvidia", "builtin"] {
        let out = Command::new(env!("CARGO_BIN_EXE_gpu-share"))
            .env("KUBECONFIG", &kubeconfig)
            .env_remove("POD_NAMESPACE")
            .args(["advise", "--live", "--plugin", plugin, "--output", "json"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{plugin}: {stderr}");
        assert!(!stderr.contains("warning"), "no node is left out: {stderr}");
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let nodes: Vec<&str> = report["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["node"].as_str().unwrap())
            .collect();
        assert_eq!(
            nodes,
            ["gpu-a", "gpu-b", "gpu-c", "gpu-d"],
            "cpu-1 is no supply"
        );
        assert_eq!(report["totals"]["unschedulablePods"], 0);
        assert_eq!(report["totals"]["podsEvicted"], 0);
        check_proposals_serve_their_pods(&report, plugin_kind(plugin));
    }
    // What advise read: a cluster-wide pod list, the nodes, the profiles ConfigMap; no writes.
    let requests = api.requests();
    assert!(
        requests.iter().all(|r| r.method == "GET"),
        "advise only reads: {:?}",
        requests
            .iter()
            .map(|r| (&r.method, &r.path))
            .collect::<Vec<_>>()
    );
}

/// A node whose profile label names a key the ConfigMap lacks is left out with a warning
/// naming node, label and key; advise does not propose a change from a state it cannot read.
#[test]
fn live_advise_leaves_out_a_node_whose_profile_cannot_be_read() {
    use kube_double::KubeDouble;
    let api = KubeDouble::start();
    api.put_node(kube_double::fixtures::node(
        "gpu-x",
        &[
            ("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"),
            ("nvidia.com/gpu.count", "1"),
            ("gpu-share.dev/profile", "gone"),
        ],
    ));
    api.put_node(kube_double::fixtures::node(
        "gpu-y",
        &[
            ("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"),
            ("nvidia.com/gpu.count", "1"),
        ],
    ));
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_gpu-share"))
        .env("KUBECONFIG", &kubeconfig)
        .env_remove("POD_NAMESPACE")
        .args(["advise", "--from-cluster", "--output", "json"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("warning: node gpu-x: gpu-share.dev/profile=gone, but the profiles ConfigMap has no key gone; left out of the supply"),
        "{stderr}"
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let nodes: Vec<&str> = report["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["node"].as_str().unwrap())
        .collect();
    assert_eq!(nodes, ["gpu-y"]);
}

/// The autopilot lists every pod each round: page by page (`limit`/`continue`, as client-go's
/// pager), keeping only the pods that request a GPU, so its memory follows the GPU pods.
#[test]
fn live_advise_lists_pods_page_by_page_and_keeps_only_gpu_pods() {
    use kube_double::KubeDouble;
    let api = KubeDouble::start();
    let pod = |name: String, limits: serde_json::Value| {
        serde_json::from_value::<k8s_openapi::api::core::v1::Pod>(serde_json::json!({
            "metadata": {"name": name, "namespace": "web"},
            "spec": {"containers": [{"name": "main", "resources": {"limits": limits}}]},
            "status": {"phase": "Pending"},
        }))
        .unwrap()
    };
    for i in 0..1_100 {
        api.put_pod(pod(format!("web-{i}"), serde_json::json!({"cpu": "1"})));
    }
    for i in 0..3 {
        api.put_pod(pod(
            format!("llm-{i}"),
            serde_json::json!({"nvidia.com/mig-1g.10gb": "1"}),
        ));
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let cluster = runtime
        .block_on(async {
            let client = api.client();
            gpu_share::advise::live::read_cluster(&client, "gpu-share", "gpu-share-profiles", None)
                .await
        })
        .unwrap();
    let names: Vec<&str> = (cluster.pods.iter())
        .map(|p| p.metadata.name.as_deref().unwrap())
        .collect();
    assert_eq!(names.len(), 3, "{names:?}");
    assert!(names.iter().all(|n| n.starts_with("llm-")));
    let pod_lists: Vec<String> = (api.requests().into_iter())
        .filter(|r| r.method == "GET" && r.path == "/api/v1/pods")
        .map(|r| r.query)
        .collect();
    assert_eq!(
        pod_lists.len(),
        3,
        "1,103 pods in pages of 500: {pod_lists:?}"
    );
    assert!(pod_lists.iter().all(|q| q.contains("limit=500")));
    assert!(pod_lists[1].contains("continue="));
}
