//! `gpu-share autopilot` as a process, with the real kube client talking HTTP to the Kubernetes
//! API double (tests/kube-double). No agents run here: where a test needs a node to finish a
//! change, it publishes what the agent publishes on success (src/agent/node.rs: the state
//! label `success` and the applied-hash annotation, sha256 of the profile text applied).
//!
//! The fleet: H100 nodes with GPU Feature Discovery's labels (nvidia-stack.md §1.8) and the
//! autopilot's opt-in label; pending pods requesting `nvidia.com/mig-3g.40gb` (an H100 holds
//! two).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use gpu_share::agent::reconcile::content_hash;
use gpu_share::plan::plan_for;
use gpu_share::profile::parse_profile;
use gpu_share::sharing::PluginKind;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube_double::{fixtures, KubeDouble, Verb};
use node_sim::{gpu_allocatable, h100s, AgentNode, DevicePluginKubelet};
use std::sync::Arc;

const NS: &str = "gpu-share";
const PROFILES: &str = "gpu-share-profiles";
const STATUS: &str = "gpu-share-autopilot-status";
const PROFILE_LABEL: &str = "gpu-share.dev/profile";
const STATE_LABEL: &str = "gpu-share.dev/profile.state";
const APPLIED_HASH: &str = "gpu-share.dev/profile.applied-hash";
const WAIT: Duration = Duration::from_secs(20);

/// A running `gpu-share autopilot`, killed (SIGKILL, like a crash) when dropped.
struct Autopilot {
    child: Child,
    log: PathBuf,
}

impl Autopilot {
    fn start(dir: &Path, api: &KubeDouble, identity: &str, extra: &[&str]) -> Autopilot {
        let kubeconfig = dir.join("kubeconfig");
        api.write_kubeconfig(&kubeconfig).unwrap();
        let log = dir.join(format!("autopilot-{identity}.log"));
        let child = Command::new(env!("CARGO_BIN_EXE_gpu-share"))
            .env("KUBECONFIG", &kubeconfig)
            .env("RUST_LOG", "info")
            .env_remove("POD_NAMESPACE")
            .env_remove("GPU_SHARE_MAX_DRAINS")
            .env_remove("GPU_SHARE_PLUGIN")
            .args([
                "autopilot",
                "--identity",
                identity,
                "--debounce",
                "200ms",
                "--lease-duration",
                "2s",
            ])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Autopilot { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Autopilot {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An opt-in H100 node with GFD's labels (and more labels given).
fn h100_node(api: &KubeDouble, name: &str, extra: &[(&str, &str)]) {
    let mut labels = vec![
        ("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"),
        ("nvidia.com/gpu.count", "1"),
        ("gpu-share.dev/autopilot", "enabled"),
    ];
    labels.extend_from_slice(extra);
    api.put_node(fixtures::node(name, &labels));
}

fn pending_pod(api: &KubeDouble, name: &str, resource: &str) {
    api.put_pod(
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "ml"},
            "spec": {"containers": [{"name": "main", "resources": {"limits": {resource: "1"}}}]},
            "status": {"phase": "Pending"},
        }))
        .unwrap(),
    );
}

/// Two opt-in H100 nodes, no profile yet, and four pending pods that need both.
fn two_nodes_four_pending_pods(api: &KubeDouble, profiles: &[(&str, &str)]) {
    api.put_configmap(fixtures::configmap(NS, PROFILES, profiles));
    h100_node(api, "gpu-1", &[]);
    h100_node(api, "gpu-2", &[]);
    // A GPU node without the opt-in label: never changed.
    api.put_node(fixtures::node(
        "gpu-manual",
        &[
            ("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"),
            ("nvidia.com/gpu.count", "1"),
        ],
    ));
    for i in 0..4 {
        pending_pod(api, &format!("infer-{i}"), "nvidia.com/mig-3g.40gb");
    }
}

fn label(api: &KubeDouble, node: &str, key: &str) -> Option<String> {
    api.node(node)?.metadata.labels?.get(key).cloned()
}

/// The status document, parsed.
fn status(api: &KubeDouble) -> Option<serde_yaml::Value> {
    let cm = api.configmap(NS, STATUS)?;
    serde_yaml::from_str(cm.data?.get("status.yaml")?).ok()
}

fn action(api: &KubeDouble, node: &str) -> Option<String> {
    status(api)?["nodes"]
        .as_sequence()?
        .iter()
        .find(|n| n["node"].as_str() == Some(node))?["action"]
        .as_str()
        .map(str::to_string)
}

fn reason(api: &KubeDouble, node: &str) -> Option<String> {
    status(api)?["nodes"]
        .as_sequence()?
        .iter()
        .find(|n| n["node"].as_str() == Some(node))?["reason"]
        .as_str()
        .map(str::to_string)
}

/// The `pending_pods` of the autopilot's last `round done` log line: a round logs it after it
/// acted and published, so a count that includes a new pod marks a round that saw the pod.
fn last_round_pending(pilot: &Autopilot) -> Option<usize> {
    let log = pilot.log();
    let line = log.lines().rev().find(|l| l.contains("round done"))?;
    let value = line.split("pending_pods=").nth(1)?;
    value.split_whitespace().next()?.parse().ok()
}

fn wait_action(api: &KubeDouble, pilot: &Autopilot, node: &str, want: &str) {
    assert!(
        api.wait_until(WAIT, |a| action(a, node).as_deref() == Some(want)),
        "{node} never {want}: status {:?}\n{}",
        status(api),
        pilot.log()
    );
}

/// What the agent publishes once it applied the profile the node's label names.
fn settle(api: &KubeDouble, node: &str) {
    let key = label(api, node, PROFILE_LABEL).unwrap();
    let text = api.configmap(NS, PROFILES).unwrap().data.unwrap()[&key].clone();
    api.modify::<Node>(None, node, |n| {
        n.metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert(STATE_LABEL.into(), "success".into());
        n.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(APPLIED_HASH.into(), content_hash(&text));
    });
}

/// What the agent publishes as soon as it sees a new label.
fn set_state(api: &KubeDouble, node: &str, state: &str) {
    api.set_node_label(node, STATE_LABEL, Some(state));
}

/// The profile the ConfigMap holds for `node`'s proposal, planned on one H100: what it
/// advertises (an independent check that the written profile serves the pods).
fn advertised(api: &KubeDouble, node: &str) -> BTreeMap<String, u64> {
    let key = format!("advised-{node}");
    let text = api.configmap(NS, PROFILES).unwrap().data.unwrap()[&key].clone();
    let profile = parse_profile(&key, &text).unwrap();
    let gpus = gpu_share::plan::ObservedNode::from_gpu_specs(&["h100x1".into()]).unwrap();
    plan_for(&key, &profile, &gpus, PluginKind::Nvidia)
        .unwrap()
        .resources
}

fn events_for(api: &KubeDouble, node: &str, reason: &str) -> Vec<String> {
    api.events()
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(node))
        .filter(|e| e.reason.as_deref() == Some(reason))
        .map(|e| {
            format!(
                "{} {}",
                e.type_.unwrap_or_default(),
                e.note.unwrap_or_default()
            )
        })
        .collect()
}

/// Writes by the autopilot to Nodes or to the profiles ConfigMap, as the double logged them.
fn writes_to_nodes_or_profiles(api: &KubeDouble) -> Vec<String> {
    api.requests()
        .into_iter()
        .filter(|r| r.method != "GET")
        .filter(|r| {
            r.resource.starts_with("nodes")
                || (r.resource == "configmaps" && r.name.as_deref() == Some(PROFILES))
        })
        .map(|r| format!("{} {}", r.method, r.path))
        .collect()
}

#[test]
fn dry_run_writes_only_the_status_and_events() {
    let api = KubeDouble::start();
    two_nodes_four_pending_pods(&api, &[]);
    // A pod advise cannot serve is left out with advise's reason; the rest goes on.
    api.put_pod(
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "odd", "namespace": "ml",
                         "annotations": {"gpu-share.dev/isolation": "vgpu"}},
            "spec": {"containers": [{"name": "main",
                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
            "status": {"phase": "Pending"},
        }))
        .unwrap(),
    );
    api.clear_requests();
    let dir = tempfile::tempdir().unwrap();
    let pilot = Autopilot::start(
        dir.path(),
        &api,
        "a",
        &["--dry-run", "--max-concurrent-drains", "2"],
    );
    wait_action(&api, &pilot, "gpu-1", "dry-run");
    wait_action(&api, &pilot, "gpu-2", "dry-run");
    for node in ["gpu-1", "gpu-2"] {
        let proposed = events_for(&api, node, "ProfileProposed");
        assert!(
            proposed
                .iter()
                .any(|e| e.starts_with("Normal would be applied: profile advised-")),
            "{node}: {proposed:?}"
        );
        assert_eq!(label(&api, node, PROFILE_LABEL), None);
    }
    let st = status(&api).unwrap();
    assert_eq!(st["dryRun"], true);
    assert_eq!(st["identity"], "a");
    let nodes: Vec<&str> = st["nodes"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|n| n["node"].as_str().unwrap())
        .collect();
    assert_eq!(
        nodes,
        ["gpu-1", "gpu-2"],
        "the node without opt-in is no supply"
    );
    assert_eq!(
        st["skipped"][0],
        "pod ml/odd: gpu-share.dev/isolation: \"vgpu\" is not mig, mps or shared"
    );
    // Another round (a pod change) and still nothing written: first a round that saw the pod.
    let before = last_round_pending(&pilot).expect("a round was logged");
    pending_pod(&api, "infer-late", "nvidia.com/mig-1g.10gb");
    assert!(
        api.wait_until(WAIT, |_| last_round_pending(&pilot) > Some(before)),
        "no round saw the new pod\n{}",
        pilot.log()
    );
    assert_eq!(writes_to_nodes_or_profiles(&api), Vec::<String>::new());
    let keys = api
        .configmap(NS, PROFILES)
        .unwrap()
        .data
        .unwrap_or_default();
    assert!(keys.is_empty(), "{keys:?}");
}

#[test]
fn a_real_run_relabels_one_node_at_a_time_within_the_budget() {
    let api = KubeDouble::start();
    two_nodes_four_pending_pods(&api, &[]);
    let dir = tempfile::tempdir().unwrap();
    let pilot = Autopilot::start(dir.path(), &api, "a", &["--max-concurrent-drains", "1"]);
    wait_action(&api, &pilot, "gpu-2", "waiting-budget");
    let first = ["gpu-1", "gpu-2"]
        .into_iter()
        .find(|n| label(&api, n, PROFILE_LABEL).is_some())
        .expect("one node relabelled");
    let second = if first == "gpu-1" { "gpu-2" } else { "gpu-1" };
    assert_eq!(
        label(&api, first, PROFILE_LABEL).unwrap(),
        format!("advised-{first}")
    );
    assert_eq!(label(&api, second, PROFILE_LABEL), None);
    assert!(
        advertised(&api, first)["nvidia.com/mig-3g.40gb"] >= 2,
        "the written profile serves two pending pods"
    );
    assert!(events_for(&api, first, "ProfileAdvised")
        .iter()
        .any(|e| e.starts_with("Normal profile advised-")));
    // The agent works through its states; every change is a round, and the second node waits.
    for state in ["pending", "draining", "applying"] {
        set_state(&api, first, state);
        // A round that saw the state says so in the first node's reason.
        let seen = format!("(state {state})");
        assert!(
            api.wait_until(WAIT, |a| reason(a, first)
                .is_some_and(|r| r.contains(&seen))),
            "no round saw {state}: {:?}\n{}",
            reason(&api, first),
            pilot.log()
        );
        assert_eq!(label(&api, second, PROFILE_LABEL), None, "during {state}");
    }
    assert_eq!(action(&api, second).as_deref(), Some("waiting-budget"));
    settle(&api, first);
    assert!(
        api.wait_until(WAIT, |a| label(a, second, PROFILE_LABEL).is_some()),
        "{}",
        pilot.log()
    );
    assert_eq!(
        label(&api, second, PROFILE_LABEL).unwrap(),
        format!("advised-{second}")
    );
    assert!(advertised(&api, second)["nvidia.com/mig-3g.40gb"] >= 2);
    wait_action(&api, &pilot, first, "unchanged");
    assert_eq!(label(&api, "gpu-manual", PROFILE_LABEL), None);
    // Only its own keys and the profile label: no other Node field was written.
    let keys: Vec<String> = api
        .configmap(NS, PROFILES)
        .unwrap()
        .data
        .unwrap()
        .into_keys()
        .collect();
    assert_eq!(keys, ["advised-gpu-1", "advised-gpu-2"]);
    // Every write (labels, profiles, status, Lease, Events) is recorded as the autopilot's
    // (src/field_manager.rs); the test's own changes do not go through HTTP.
    let others: Vec<String> = api
        .requests()
        .into_iter()
        .filter(|r| matches!(r.verb, Verb::Create | Verb::Update | Verb::Patch))
        .filter(|r| r.field_manager != "gpu-share-autopilot")
        .map(|r| format!("{:?} {} as {:?}", r.verb, r.path, r.field_manager))
        .collect();
    assert!(others.is_empty(), "{others:#?}");
}

#[test]
fn a_pdb_that_forbids_the_eviction_blocks_the_node_until_it_allows_it() {
    let api = KubeDouble::start();
    let whole = "version: v1\nrules:\n- devices: all\n  exclusive: true\n";
    api.put_configmap(fixtures::configmap(NS, PROFILES, &[("whole", whole)]));
    h100_node(
        &api,
        "gpu-1",
        &[(PROFILE_LABEL, "whole"), (STATE_LABEL, "success")],
    );
    api.modify::<Node>(None, "gpu-1", |n| {
        n.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(APPLIED_HASH.into(), content_hash(whole));
    });
    // A running pod holding a MIG device the node's profile no longer has: advise counts it as
    // evicted by any change (it restarts on the new instance). Its PDB allows no disruption.
    api.put_pod(fixtures::gpu_pod(
        "ml",
        "web-0",
        "gpu-1",
        &[("app", "web")],
        "nvidia.com/mig-1g.10gb",
        1,
    ));
    api.put_pdb(fixtures::pdb_min_available(
        "ml",
        "web",
        &[("app", "web")],
        1,
    ));
    let dir = tempfile::tempdir().unwrap();
    let pilot = Autopilot::start(dir.path(), &api, "a", &[]);
    wait_action(&api, &pilot, "gpu-1", "blocked-pdb");
    let st = status(&api).unwrap();
    let reason = st["nodes"][0]["reason"].as_str().unwrap().to_string();
    assert!(
        reason.contains("PodDisruptionBudget ml/web allows 0 disruption(s) now; the proposal would evict 1 of its pods (ml/web-0)"),
        "{reason}"
    );
    let blocked = events_for(&api, "gpu-1", "ProfileProposalBlocked");
    assert!(
        blocked
            .iter()
            .any(|e| e.starts_with("Warning PodDisruptionBudget ml/web")),
        "{blocked:?}"
    );
    assert_eq!(
        label(&api, "gpu-1", PROFILE_LABEL).as_deref(),
        Some("whole")
    );
    // The budget relaxes: the disruption controller allows one, and the node goes ahead.
    api.modify::<PodDisruptionBudget>(Some("ml"), "web", |p| {
        p.spec.as_mut().unwrap().min_available = Some(IntOrString::Int(0));
    });
    assert!(
        api.wait_until(WAIT, |a| label(a, "gpu-1", PROFILE_LABEL).as_deref()
            == Some("advised-gpu-1")),
        "{:?}\n{}",
        status(&api),
        pilot.log()
    );
    assert!(advertised(&api, "gpu-1")["nvidia.com/mig-1g.10gb"] >= 1);
}

#[test]
fn a_restarted_autopilot_resumes_the_rollout() {
    let api = KubeDouble::start();
    two_nodes_four_pending_pods(&api, &[]);
    let dir = tempfile::tempdir().unwrap();
    let first_pilot = Autopilot::start(dir.path(), &api, "a", &[]);
    wait_action(&api, &first_pilot, "gpu-2", "waiting-budget");
    let first = ["gpu-1", "gpu-2"]
        .into_iter()
        .find(|n| label(&api, n, PROFILE_LABEL).is_some())
        .unwrap();
    let second = if first == "gpu-1" { "gpu-2" } else { "gpu-1" };
    set_state(&api, first, "draining");
    // Crash mid-rollout: the first node is still draining, the second not started.
    drop(first_pilot);
    let pilot = Autopilot::start(dir.path(), &api, "b", &[]);
    assert!(
        api.wait_until(WAIT, |a| status(a).is_some_and(|s| s["identity"] == "b")),
        "b takes over once a's lease lapses\n{}",
        pilot.log()
    );
    assert_eq!(
        api.lease(NS, "gpu-share-autopilot")
            .and_then(|l| l.spec?.holder_identity)
            .as_deref(),
        Some("b")
    );
    assert_eq!(action(&api, second).as_deref(), Some("waiting-budget"));
    assert!(
        status(&api).unwrap()["changingNodes"]
            .as_sequence()
            .unwrap()
            .iter()
            .any(|n| n.as_str() == Some(first)),
        "the restarted autopilot sees the first node still changing, from its labels"
    );
    assert_eq!(label(&api, second, PROFILE_LABEL), None);
    settle(&api, first);
    assert!(
        api.wait_until(WAIT, |a| label(a, second, PROFILE_LABEL).as_deref()
            == Some(format!("advised-{second}").as_str())),
        "{}",
        pilot.log()
    );
}

/// The status ConfigMap is created by the autopilot when missing, in its namespace.
#[test]
fn the_status_configmap_is_created_in_the_namespace() {
    let api = KubeDouble::start();
    two_nodes_four_pending_pods(&api, &[]);
    assert!(api.get::<ConfigMap>(Some(NS), STATUS).is_none());
    let dir = tempfile::tempdir().unwrap();
    let pilot = Autopilot::start(dir.path(), &api, "a", &["--dry-run"]);
    wait_action(&api, &pilot, "gpu-1", "dry-run");
    let st = status(&api).unwrap();
    assert_eq!(st["maxChangingNodes"], 1);
    assert!(st["updated"].as_str().unwrap().ends_with('Z'));
}

/// The whole path on simulated nodes: real agents (`--plugin builtin`, fake NVML, the simulated
/// kubelet's device-plugin manager writing `status.allocatable`) and the autopilot. Four pending
/// pods need two nodes' worth of 3g.40gb; with a budget of one the nodes change one after the
/// other (sampled throughout: never two relabelled and unsettled at once), and in the end the
/// nodes advertise what the pending pods request, so they become schedulable. Nothing ran on
/// the GPUs before, so nothing is evicted.
#[test]
fn on_simulated_nodes_pending_pods_become_schedulable_one_node_at_a_time() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    let api = Arc::new(KubeDouble::start());
    api.put_configmap(fixtures::configmap(NS, PROFILES, &[]));
    let (nodes, _kubelets): (Vec<_>, Vec<_>) = ["gpu-1", "gpu-2"]
        .iter()
        .map(|n| simulated_node(&api, n))
        .unzip();
    for i in 0..4 {
        pending_pod(&api, &format!("infer-{i}"), "nvidia.com/mig-3g.40gb");
    }
    // Sample how many nodes are relabelled and not yet settled by their agent.
    let most_changing = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (api, most, done) = (
            Arc::clone(&api),
            Arc::clone(&most_changing),
            Arc::clone(&done),
        );
        std::thread::spawn(move || {
            while !done.load(Ordering::SeqCst) {
                let changing = ["gpu-1", "gpu-2"]
                    .iter()
                    .filter(|n| {
                        label(&api, n, PROFILE_LABEL).is_some()
                            && label(&api, n, STATE_LABEL).as_deref() != Some("success")
                    })
                    .count();
                most.fetch_max(changing, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(10));
            }
        })
    };
    let dir = tempfile::tempdir().unwrap();
    let pilot = Autopilot::start(dir.path(), &api, "a", &["--plugin", "builtin"]);
    let served = |a: &KubeDouble| {
        ["gpu-1", "gpu-2"]
            .iter()
            .map(|n| {
                gpu_allocatable(a, n)
                    .get("nvidia.com/mig-3g.40gb")
                    .copied()
                    .unwrap_or(0)
            })
            .sum::<u64>()
    };
    let ok = api.wait_until(Duration::from_secs(60), |a| served(a) >= 4);
    done.store(true, Ordering::SeqCst);
    sampler.join().unwrap();
    assert!(
        ok,
        "allocatable {:?} / {:?}\nstatus {:?}\n{}\n{}\n{}",
        gpu_allocatable(&api, "gpu-1"),
        gpu_allocatable(&api, "gpu-2"),
        status(&api),
        pilot.log(),
        nodes[0].log(),
        nodes[1].log()
    );
    for node in ["gpu-1", "gpu-2"] {
        assert_eq!(
            label(&api, node, PROFILE_LABEL).unwrap(),
            format!("advised-{node}")
        );
        assert_eq!(
            gpu_allocatable(&api, node)["nvidia.com/mig-3g.40gb"],
            2,
            "{node}"
        );
    }
    assert_eq!(
        most_changing.load(Ordering::SeqCst),
        1,
        "never two nodes changing with a budget of one"
    );
    assert!(api.evictions().is_empty(), "{:?}", api.evictions());
    wait_action(&api, &pilot, "gpu-1", "unchanged");
    wait_action(&api, &pilot, "gpu-2", "unchanged");
}

/// The builtin and dra overlays install no GPU Feature Discovery: the autopilot knows the
/// node's GPUs from the labels its agent writes from what it found (`gpu-share.dev/gpu.*`)
/// and sizes it; no GFD label is ever set. Started as deploy/components/autopilot starts it,
/// with no --plugin, it plans for the plugin the agent runs (builtin, as the node's
/// `gpu-share.dev/plugin` says): the component works on the builtin overlay as shipped.
#[test]
fn a_node_without_gfd_is_sized_from_what_its_agent_found() {
    let api = Arc::new(KubeDouble::start());
    api.put_configmap(fixtures::configmap(NS, PROFILES, &[]));
    let (node, _kubelet) = opted_in_node(&api, "gpu-1", 1, "2", &[]);
    for i in 0..2 {
        pending_pod(&api, &format!("infer-{i}"), "nvidia.com/mig-3g.40gb");
    }
    assert!(
        api.wait_until(WAIT, |a| label(a, "gpu-1", "gpu-share.dev/plugin")
            .is_some()),
        "the agent labels its plugin\n{}",
        node.log()
    );
    let dir = tempfile::tempdir().unwrap();
    let pilot = Autopilot::start(dir.path(), &api, "a", &[]);
    let served = |a: &KubeDouble| {
        gpu_allocatable(a, "gpu-1")
            .get("nvidia.com/mig-3g.40gb")
            .copied()
            .unwrap_or(0)
    };
    assert!(
        api.wait_until(Duration::from_secs(60), |a| served(a) >= 2),
        "allocatable {:?}\nstatus {:?}\n{}\n{}",
        gpu_allocatable(&api, "gpu-1"),
        status(&api),
        pilot.log(),
        node.log()
    );
    assert_eq!(
        label(&api, "gpu-1", PROFILE_LABEL).as_deref(),
        Some("advised-gpu-1")
    );
    assert_eq!(
        label(&api, "gpu-1", "gpu-share.dev/gpu.product").as_deref(),
        Some("NVIDIA-H100-80GB-HBM3")
    );
    assert_eq!(label(&api, "gpu-1", "nvidia.com/gpu.product"), None);
    assert!(pilot.log().contains("plugin=builtin"), "{}", pilot.log());
}

/// An autopilot whose --plugin differs from the plugin a node's agent runs (the agent labels
/// its node `gpu-share.dev/plugin`) plans nothing for that node: a profile for the NVIDIA
/// plugin handed to a builtin agent would advertise what it does not mean. The node is left
/// out with the reason, in the status it publishes and its log; nothing is written to it.
#[test]
fn a_node_whose_agent_runs_another_plugin_is_left_out_naming_both() {
    let api = Arc::new(KubeDouble::start());
    api.put_configmap(fixtures::configmap(NS, PROFILES, &[]));
    let (node, _kubelet) = opted_in_node(&api, "gpu-1", 1, "2", &[]);
    pending_pod(&api, "infer-0", "nvidia.com/mig-3g.40gb");
    assert!(
        api.wait_until(WAIT, |a| label(a, "gpu-1", "gpu-share.dev/plugin")
            .is_some()),
        "the agent labels its plugin\n{}",
        node.log()
    );
    assert_eq!(
        label(&api, "gpu-1", "gpu-share.dev/plugin").as_deref(),
        Some("builtin")
    );
    let dir = tempfile::tempdir().unwrap();
    let pilot = Autopilot::start(dir.path(), &api, "a", &["--plugin", "nvidia"]);
    let skipped = |a: &KubeDouble| {
        status(a).and_then(|st| {
            st["skipped"]
                .as_sequence()?
                .iter()
                .filter_map(|s| s.as_str())
                .find(|s| s.starts_with("node gpu-1:"))
                .map(str::to_string)
        })
    };
    assert!(
        api.wait_until(WAIT, |a| skipped(a).is_some()),
        "status {:?}\n{}",
        status(&api),
        pilot.log()
    );
    assert_eq!(
        skipped(&api).unwrap(),
        "node gpu-1: its agent runs --plugin builtin (gpu-share.dev/plugin), but this plans for \
         --plugin nvidia: give the same --plugin to both, or leave the node out"
    );
    assert!(pilot.log().contains("--plugin builtin"), "{}", pilot.log());
    assert_eq!(label(&api, "gpu-1", PROFILE_LABEL), None);
}

/// SIGTERM (a rolling update of the Deployment) gives the Lease back at once, so the next
/// replica does not wait for it to lapse.
#[test]
fn sigterm_gives_the_lease_back() {
    let api = KubeDouble::start();
    two_nodes_four_pending_pods(&api, &[]);
    let dir = tempfile::tempdir().unwrap();
    let mut pilot = Autopilot::start(dir.path(), &api, "a", &["--dry-run"]);
    let holder = |a: &KubeDouble| {
        a.lease(NS, "gpu-share-autopilot")
            .and_then(|l| l.spec?.holder_identity)
    };
    assert!(api.wait_until(WAIT, |a| holder(a).as_deref() == Some("a")));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pilot.child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let exit = pilot.child.wait().unwrap();
    assert!(exit.success(), "{exit:?}\n{}", pilot.log());
    assert_eq!(holder(&api), None, "{}", pilot.log());
}

/// An opt-in node with one H100 (MIG off), GFD's labels, the simulated kubelet's device-plugin
/// manager and a real agent running the built-in plugin.
fn simulated_node(api: &Arc<KubeDouble>, name: &str) -> (AgentNode, DevicePluginKubelet) {
    simulated_node_of(api, name, 1, "2")
}

/// [`simulated_node`] with `gpus` H100s and the agent's resync every `resync` seconds.
fn simulated_node_of(
    api: &Arc<KubeDouble>,
    name: &str,
    gpus: usize,
    resync: &str,
) -> (AgentNode, DevicePluginKubelet) {
    let count = gpus.to_string();
    let gfd = [
        ("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"),
        ("nvidia.com/gpu.count", count.as_str()),
    ];
    opted_in_node(api, name, gpus, resync, &gfd)
}

/// An opted-in node with `gpus` H100s (MIG off), these labels (GFD's, or none), the simulated
/// kubelet's device-plugin manager and a real agent running the built-in plugin.
fn opted_in_node(
    api: &Arc<KubeDouble>,
    name: &str,
    gpus: usize,
    resync: &str,
    labels: &[(&str, &str)],
) -> (AgentNode, DevicePluginKubelet) {
    let mut node = AgentNode::new(api, name, h100s(gpus, false));
    for (k, v) in labels
        .iter()
        .copied()
        .chain([("gpu-share.dev/autopilot", "enabled")])
    {
        api.set_node_label(name, k, Some(v));
    }
    let dp = node.path("device-plugins");
    let kubelet = DevicePluginKubelet::serve(api, name, &dp);
    let mut cmd = node.agent_command();
    cmd.args(["agent", "--plugin", "builtin", "--plugin-reload", "none"])
        .args([
            "--plugin-health-interval",
            "200ms",
            "--kubelet-poll-interval",
            "100ms",
        ])
        .args(["--lease-duration", "2s", "--resync-period", resync])
        .arg("--device-plugin-dir")
        .arg(&dp);
    node.spawn(cmd);
    (node, kubelet)
}

/// A node running pods on MIG instances: the proposal for two pending 1g.10gb pods adds two
/// instances in the free slices beside them, so the agent destroys nothing and evicts nobody,
/// and the running pods keep their devices.
#[test]
fn on_a_simulated_node_with_running_pods_the_proposal_adds_beside_them_and_evicts_nobody() {
    use k8s_openapi::api::core::v1::Pod;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use node_sim::{wait_state, Workload};

    let api = Arc::new(KubeDouble::start());
    let start = "version: v1\nrules:\n- devices: all\n  mig: {3g.40gb: 1, 1g.10gb: 1}\n";
    api.put_configmap(fixtures::configmap(NS, PROFILES, &[("start", start)]));
    let (node, _kubelet) = simulated_node(&api, "gpu-1");
    api.set_node_label("gpu-1", PROFILE_LABEL, Some("start"));
    wait_state(&api, &node, "success", WAIT);
    let state = node.nvml();
    let gis: Vec<(u32, u32, u32)> = state.gpus[0]
        .gpu_instances
        .iter()
        .map(|g| (g.id, g.placement.start, g.placement.size))
        .collect();
    let (big, small) = {
        let big = gis.iter().find(|g| g.2 == 4).expect("a 3g.40gb").0;
        let small = gis.iter().find(|g| g.2 == 1).expect("a 1g.10gb").0;
        (big, small)
    };
    node.add_workloads(
        &api,
        &[
            Workload::on_mig("big", 4001, 0, big),
            Workload::on_mig("small", 4002, 0, small),
        ],
    );
    // add_workloads requests a 1g.10gb for every MIG pod: "big" holds the 3g.40gb.
    api.modify::<Pod>(Some("default"), "big", |p| {
        let c = &mut p.spec.as_mut().unwrap().containers[0];
        let q = BTreeMap::from([("nvidia.com/mig-3g.40gb".to_string(), Quantity("1".into()))]);
        let r = c.resources.as_mut().unwrap();
        r.limits = Some(q.clone());
        r.requests = Some(q);
    });
    let destroyed_before = node.count("nvmlGpuInstanceDestroy");
    let created_before = node.count("nvmlDeviceCreateGpuInstanceWithPlacement");
    let dir = tempfile::tempdir().unwrap();
    let pilot = Autopilot::start(dir.path(), &api, "a", &["--plugin", "builtin"]);
    // Nothing pending: the hand-written profile already serves the running pods, so advise
    // proposes it, unchanged and under its own key (src/advise/keep.rs): no relabel, no
    // re-apply.
    wait_action(&api, &pilot, "gpu-1", "unchanged");
    let reason = status(&api).unwrap()["nodes"][0]["reason"].clone();
    assert_eq!(reason.as_str(), Some("runs start, the proposal"));
    assert_eq!(
        label(&api, "gpu-1", PROFILE_LABEL).as_deref(),
        Some("start")
    );
    pending_pod(&api, "more-0", "nvidia.com/mig-1g.10gb");
    pending_pod(&api, "more-1", "nvidia.com/mig-1g.10gb");
    let ok = api.wait_until(Duration::from_secs(60), |a| {
        gpu_allocatable(a, "gpu-1")
            .get("nvidia.com/mig-1g.10gb")
            .is_some_and(|n| *n >= 3)
    });
    assert!(
        ok,
        "instances {gis:?}\nstatus {:?}\n{}\n{}",
        status(&api),
        pilot.log(),
        node.log()
    );
    assert_eq!(
        label(&api, "gpu-1", PROFILE_LABEL).as_deref(),
        Some("advised-gpu-1")
    );
    wait_state(&api, &node, "success", WAIT);
    assert_eq!(
        node.count("nvmlGpuInstanceDestroy"),
        destroyed_before,
        "nothing destroyed"
    );
    assert!(api.evictions().is_empty(), "{:?}", api.evictions());
    assert!(api.pod("default", "big").is_some() && api.pod("default", "small").is_some());
    let allocatable = gpu_allocatable(&api, "gpu-1");
    assert_eq!(allocatable["nvidia.com/mig-3g.40gb"], 1, "{allocatable:?}");
    assert_eq!(allocatable["nvidia.com/mig-1g.10gb"], 3, "{allocatable:?}");
    assert_eq!(
        node.count("nvmlDeviceCreateGpuInstanceWithPlacement") - created_before,
        2
    );
}

/// A fleet of 32 opt-in nodes × 8 H100 and 448 pending pods (1g/2g/3g MIG): one dry-run round
/// leaves no pod unschedulable, proposes for every node, and within the budget of 4 says which
/// 4 would change now. Prints the round's duration from the autopilot's `round done` log line
/// (a figure, not asserted).
#[test]
fn a_dry_run_round_over_a_fleet_serves_every_pending_pod() {
    let api = KubeDouble::start();
    api.put_configmap(fixtures::configmap(NS, PROFILES, &[]));
    for n in 0..32 {
        api.put_node(fixtures::node(
            &format!("gpu-{n:02}"),
            &[
                ("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"),
                ("nvidia.com/gpu.count", "8"),
                ("gpu-share.dev/autopilot", "enabled"),
            ],
        ));
    }
    let sizes = [
        ("nvidia.com/mig-3g.40gb", 128),
        ("nvidia.com/mig-2g.20gb", 64),
        ("nvidia.com/mig-1g.10gb", 256),
    ];
    for (resource, count) in sizes {
        for i in 0..count {
            let name = format!(
                "{}-{i}",
                &resource["nvidia.com/mig-".len()..].replace('.', "-")
            );
            pending_pod(&api, &name, resource);
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let pilot = Autopilot::start(
        dir.path(),
        &api,
        "a",
        &["--dry-run", "--max-concurrent-drains", "4"],
    );
    assert!(
        api.wait_until(Duration::from_secs(120), |a| status(a).is_some()),
        "{}",
        pilot.log()
    );
    let st = status(&api).unwrap();
    assert_eq!(st["unschedulable"].as_sequence().unwrap().len(), 0);
    let nodes = st["nodes"].as_sequence().unwrap();
    assert_eq!(nodes.len(), 32);
    let count = |a: &str| nodes.iter().filter(|n| n["action"] == a).count();
    assert_eq!(count("dry-run"), 4);
    assert_eq!(
        count("dry-run") + count("waiting-budget") + count("unchanged"),
        32
    );
    let served: u64 = nodes.iter().map(|n| n["pods"].as_u64().unwrap()).sum();
    assert_eq!(served, 448, "every pending pod placed on some node");
    let round = pilot
        .log()
        .lines()
        .find(|l| l.contains("round done"))
        .map(str::to_string)
        .unwrap_or_default();
    eprintln!("figure: {round}");
}

/// Flags it cannot run with are refused at start, before it touches the API: `--plugin dra`
/// (advise sizes device-plugin resources; DRA nodes publish devices) and a debounce out of
/// range.
#[test]
fn unusable_flags_are_refused_at_start() {
    for (args, says) in [
        (
            &["--plugin", "dra"][..],
            "--plugin dra: the autopilot plans for nodes running the nvidia or builtin device plugin only",
        ),
        (
            &["--debounce", "5000s"][..],
            "--debounce 1h 23m 20s: must be at most 1h",
        ),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_gpu-share"))
            .env("KUBECONFIG", "/nonexistent")
            .arg("autopilot")
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(says),
            "{args:?}: {err}"
        );
    }
}

/// A round whose advise takes seconds (many nodes and pods that fit nowhere, a debug build)
/// must not stop the Lease renewal: the autopilot's runtime has one thread, so advise runs
/// off it (`spawn_blocking`). Were it run on that thread, the Lease (2 s here) would go
/// unrenewed for the whole round and a second replica could take it while this one acts.
#[test]
fn the_lease_is_renewed_while_a_long_round_advises() {
    let api = KubeDouble::start();
    fleet_advised_for_seconds(&api);
    let dir = tempfile::tempdir().unwrap();
    // `start` gives a 2 s Lease, renewed every 667 ms.
    let mut pilot = Autopilot::start(dir.path(), &api, "a", &["--dry-run"]);
    let mut stalest = Duration::ZERO;
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while !pilot.log().contains("round done") {
        assert!(std::time::Instant::now() < deadline, "{}", pilot.log());
        assert!(
            pilot.child.try_wait().unwrap().is_none(),
            "exited\n{}",
            pilot.log()
        );
        let renewed = api
            .lease(NS, "gpu-share-autopilot")
            .and_then(|l| l.spec?.renew_time);
        if let Some(renewed) = renewed {
            let age = k8s_openapi::jiff::Timestamp::now().duration_since(renewed.0);
            stalest = stalest.max(Duration::try_from(age).unwrap_or_default());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = pilot.log();
    let round_ms: u64 = log
        .split("round_ms=")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|ms| ms.parse().ok())
        .unwrap_or_else(|| panic!("no round_ms in the log\n{log}"));
    // The premise: the round outlasted the Lease several times over.
    assert!(
        round_ms >= 4_000,
        "round took {round_ms} ms: too short to show anything"
    );
    // Advise on the runtime thread left it unrenewed for most of the round (3.5 s of 4.7 s);
    // off it, it is renewed every 667 ms (more on a loaded machine, never half the round).
    assert!(
        stalest < Duration::from_millis(round_ms / 2),
        "the Lease went {stalest:?} unrenewed during a {round_ms} ms round\n{log}"
    );
    assert!(!log.contains("no longer the leader"), "{log}");
}

/// 500 opt-in H100s and 12,000 pending 3g.40gb pods: the H100s hold 1,000, the rest fit
/// nowhere and each looks at every node, so a debug build advises for several seconds.
fn fleet_advised_for_seconds(api: &KubeDouble) {
    api.put_configmap(fixtures::configmap(NS, PROFILES, &[]));
    for n in 0..500 {
        h100_node(api, &format!("gpu-{n:03}"), &[]);
    }
    for p in 0..12_000 {
        pending_pod(api, &format!("llm-{p}"), "nvidia.com/mig-3g.40gb");
    }
}

/// A SIGTERM that arrives while a round advises is not lost: the autopilot finishes the round,
/// gives the Lease back and exits 0. (With a SIGTERM listener made afresh for each wait, the
/// runtime took the signal during the round, when no listener existed, and the process ran on.)
#[test]
fn sigterm_during_a_long_round_is_not_lost() {
    let api = KubeDouble::start();
    fleet_advised_for_seconds(&api);
    let dir = tempfile::tempdir().unwrap();
    let mut pilot = Autopilot::start(dir.path(), &api, "a", &["--dry-run"]);
    // The round reads the profiles ConfigMap after listing pods and nodes (only a round reads
    // it), then PDBs and drain slot Leases, then advises; the log says nothing until it is done.
    let profiles = format!("/api/v1/namespaces/{NS}/configmaps/{PROFILES}");
    let round_started =
        |a: &KubeDouble| (a.requests().iter()).any(|r| r.method == "GET" && r.path == profiles);
    assert!(api.wait_until(WAIT, round_started));
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        !pilot.log().contains("round done"),
        "too late: {}",
        pilot.log()
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pilot.child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let exit = loop {
        if let Some(exit) = pilot.child.try_wait().unwrap() {
            break exit;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "still running a minute after SIGTERM\n{}",
            pilot.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(exit.success(), "{exit:?}\n{}", pilot.log());
    assert!(
        pilot.log().contains("round done"),
        "the round finished first"
    );
    let holder = api
        .lease(NS, "gpu-share-autopilot")
        .and_then(|l| l.spec?.holder_identity);
    assert_eq!(holder, None, "{}", pilot.log());
}

/// The measured loss: the devices-in-use annotation lagged (the agent refreshes it after a
/// reconcile), so advise matched a running pod to the wrong GPU and predicted no eviction,
/// while the agent's drain, asking the kubelet, would evict it. Now the agent checks its drain
/// against the prediction the autopilot wrote with the proposal: it refuses (state `blocked`,
/// naming the pod, nothing evicted), publishes what the kubelet lists, and the autopilot
/// re-plans around the pod.
#[test]
fn a_lagging_devices_in_use_annotation_blocks_the_drain_and_the_autopilot_replans() {
    use node_sim::{wait_state, PodResourcesKubelet};

    let api = Arc::new(KubeDouble::start());
    let start = "version: v1\nrules:\n- devices: all\n  exclusive: true\n";
    api.put_configmap(fixtures::configmap(NS, PROFILES, &[("start", start)]));
    // A resync of 300 s: after its first pass the agent republishes nothing on its own.
    let (node, _plugins) = simulated_node_of(&api, "gpu-1", 2, "300");
    let kubelet = PodResourcesKubelet::serve(&api, "gpu-1", &node.pod_resources_socket());
    api.set_node_label("gpu-1", PROFILE_LABEL, Some("start"));
    wait_state(&api, &node, "success", WAIT);
    // The agent's passes for `start` are over (the ConfigMap watch's catch-up pass included):
    // it has published its devices-in-use, nobody, and with its long resync publishes no more.
    assert!(api.wait_until(WAIT, |a| a
        .node("gpu-1")
        .and_then(|n| n
            .metadata
            .annotations?
            .get("gpu-share.dev/devices-in-use")
            .cloned())
        .is_some()));
    std::thread::sleep(Duration::from_secs(1));
    // Now the kubelet gives GPU 1 to `held`; the annotation still lists nobody.
    let gpu1 = node.nvml().gpus[1].uuid.clone();
    api.put_pod(fixtures::gpu_pod(
        "default",
        "held",
        "gpu-1",
        &[("app", "held")],
        "nvidia.com/gpu",
        1,
    ));
    kubelet.allocate("default", "held", "nvidia.com/gpu", &[&gpu1]);
    pending_pod(&api, "mig-0", "nvidia.com/mig-3g.40gb");

    let dir = tempfile::tempdir().unwrap();
    let pilot = Autopilot::start(dir.path(), &api, "a", &["--plugin", "builtin"]);
    // Whatever the first proposal's guess, `held` is never evicted: either the guess was right
    // (MIG on GPU 0), or the agent refuses to drain GPU 1 and the autopilot re-plans.
    let ok = api.wait_until(Duration::from_secs(60), |a| {
        gpu_allocatable(a, "gpu-1")
            .get("nvidia.com/mig-3g.40gb")
            .is_some_and(|n| *n >= 1)
            && state(a, "gpu-1").as_deref() == Some("success")
    });
    assert!(
        ok,
        "status {:?}\n{}\n{}",
        status(&api),
        pilot.log(),
        node.log()
    );
    assert!(
        api.evictions().is_empty(),
        "{:?}\n{}\n{}",
        api.evictions(),
        pilot.log(),
        node.log()
    );
    assert!(api.pod("default", "held").is_some());
    assert_eq!(node.nvml().gpus[1].mig.map(|m| m.current), Some(false));
    // The first proposal guessed wrong (advise matches an unnamed pod to the first free GPU):
    // the refusal is on record, naming the pod.
    let refusals = events_for(&api, "gpu-1", "EvictionsNotPredicted");
    assert!(
        refusals.iter().any(|e| e.contains("default/held")),
        "{refusals:?}\n{}",
        node.log()
    );
}

fn state(api: &KubeDouble, node: &str) -> Option<String> {
    label(api, node, STATE_LABEL)
}
