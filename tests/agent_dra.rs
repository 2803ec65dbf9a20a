//! `gpu-share agent --plugin dra` on the simulated node (tests/node-sim: fake NVML, simulated
//! kubelet for GPU processes) against the Kubernetes API double, which serves
//! resource.k8s.io/v1 ResourceSlices with the apiserver's registry rules (kube-double
//! README). The pool rules checked here are the API's (ResourcePool in the resource.k8s.io/v1
//! reference): every slice of the pool at one generation, which grows with every change;
//! `resourceSliceCount` slices make the pool.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use kube_double::{KubeDouble, Verb};
use node_sim::*;
use serde_json::Value;

const DRIVER: &str = "gpu.gpu-share.dev";

/// Every example profile (profiles/ and profiles/builtin/) with the simulated GPUs it plans
/// on: 8 × H100 for all but the H200 one, whose MIG profiles exist only on the H200 (the same
/// pairs as src/dra/tests.rs). [`every_example_profile_is_published_somewhere`] fails when a
/// profile file has no row.
const EXAMPLES: &[(&str, &str)] = &[
    ("h100-balanced", "h100"),
    ("h100-inference", "h100"),
    ("h100-mps", "h100"),
    ("exclusive", "h100"),
    ("homelab-timeslice", "h100"),
    // Selects no H100 (its rules pick Jetsons and GeForces): the GPUs are published whole.
    ("homelab-mixed", "h100"),
    ("a100-40gb-mixed", "h100"),
    ("a100-80gb-single", "h100"),
    ("builtin/h100-mixed-sharing", "h100"),
    ("builtin/h100-mps-in-mig", "h100"),
    ("h200-mig-timeslice", "h200"),
];

/// This node's slices of gpu-share's driver, as the API double holds them (by name).
fn published(api: &KubeDouble, node: &str) -> Vec<Value> {
    api.resource_slices()
        .into_iter()
        .filter(|s| s["spec"]["nodeName"] == node && s["spec"]["driver"] == DRIVER)
        .collect()
}

/// What `gpu-share plan --plugin dra` prints for `profile` on the node's GPUs as they are now
/// (`gpu-share status -o json` → `plan --current`): its `resourceSlices`.
fn planned(node: &AgentNode, profile: &str) -> Vec<Value> {
    planned_slices(node, &text_of(profile))
}

/// A profile of more shares than one slice holds (128 devices): 2 GPUs × 100 shares.
const MANY_SHARES: &str = "many-shares";

/// The text of example profile `name`, or of [`MANY_SHARES`].
fn text_of(name: &str) -> String {
    if name == MANY_SHARES {
        "version: v1\nrules:\n  - devices: all\n    timeSlicing: {replicas: 100}\n".into()
    } else {
        profile_text(name)
    }
}

/// Slice name → spec without the pool generation (the one thing a publish decides itself).
fn content(slices: &[Value]) -> BTreeMap<String, Value> {
    slices
        .iter()
        .map(|s| {
            let mut spec = s["spec"].clone();
            spec["pool"].as_object_mut().unwrap().remove("generation");
            (s["metadata"]["name"].as_str().unwrap().to_string(), spec)
        })
        .collect()
}

fn device_names(slices: &[Value]) -> BTreeSet<String> {
    slices
        .iter()
        // A counter slice has no `devices` at all (the apiserver refuses `devices: []` there).
        .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .map(|d| d["name"].as_str().unwrap().to_string())
        .collect()
}

/// The pool's one generation (every slice carries the same).
fn generation(slices: &[Value]) -> i64 {
    let all: BTreeSet<i64> = slices
        .iter()
        .map(|s| s["spec"]["pool"]["generation"].as_i64().unwrap())
        .collect();
    assert_eq!(all.len(), 1, "one generation across the pool: {all:?}");
    *all.first().unwrap()
}

/// Wait until the API's pool is exactly what `plan` prints for `profile` (each apply publishes
/// before its `success`, so this is immediate unless the test's own reads race it).
fn assert_published_as_planned(api: &KubeDouble, node: &AgentNode, profile: &str) -> Vec<Value> {
    let want = content(&planned(node, profile));
    let mut got = BTreeMap::new();
    let same = poll(Duration::from_secs(10), Duration::from_millis(50), || {
        got = content(&published(api, &node.name));
        got == want
    });
    if !same {
        let names = |m: &BTreeMap<String, Value>| -> BTreeSet<String> {
            m.values()
                .flat_map(|s| s["devices"].as_array().cloned().unwrap_or_default())
                .map(|d| d["name"].as_str().unwrap().to_string())
                .collect()
        };
        panic!(
            "{profile}: published ≠ planned\nonly published: {:?}\nonly planned: {:?}\nslices published {:?}, planned {:?}\n{}",
            names(&got).difference(&names(&want)).collect::<Vec<_>>(),
            names(&want).difference(&names(&got)).collect::<Vec<_>>(),
            got.keys().collect::<Vec<_>>(),
            want.keys().collect::<Vec<_>>(),
            node.log()
        );
    }
    let slices = published(api, &node.name);
    let count = slices.len() as i64;
    for slice in &slices {
        assert_eq!(slice["spec"]["pool"]["resourceSliceCount"], count);
        assert_eq!(slice["spec"]["pool"]["name"], node.name.as_str());
    }
    slices
}

/// Node `name` with 8 GPUs of `model` (MIG on), its agent started with `--plugin dra`.
fn dra_node(api: &Arc<KubeDouble>, name: &str, model: &str) -> AgentNode {
    let mut node = AgentNode::new(api, name, gpus(model, 8, true));
    node.start_agent(&["--plugin", "dra"], &[]);
    node
}

#[test]
fn every_example_profile_is_published_somewhere() {
    let mut files = BTreeSet::new();
    for dir in ["profiles", "profiles/builtin"] {
        for entry in std::fs::read_dir(repo().join(dir)).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "yaml") {
                let stem = path.file_stem().unwrap().to_str().unwrap();
                let prefix = dir
                    .strip_prefix("profiles")
                    .unwrap()
                    .trim_start_matches('/');
                files.insert(if prefix.is_empty() {
                    stem.to_string()
                } else {
                    format!("{prefix}/{stem}")
                });
            }
        }
    }
    let tested: BTreeSet<String> = EXAMPLES.iter().map(|(p, _)| p.to_string()).collect();
    assert_eq!(files, tested, "every example profile has a row in EXAMPLES");
}

/// Each example profile in turn on its node: the API holds exactly the slices `plan --plugin
/// dra` prints for the GPUs as applied (devices, attributes, capacities, counters), owned by
/// the Node; every change bumps the one pool generation. (Kept devices keeping their names
/// through a change: `devices_going_away_are_withdrawn_before_the_drain_and_kept_ones_stay`.)
#[test]
fn the_published_slices_are_what_plan_prints_for_every_example_profile() {
    let api = Arc::new(KubeDouble::start());
    let names: Vec<&str> = EXAMPLES.iter().map(|(p, _)| *p).collect();
    profiles_configmap(&api, &names, &[]);
    for model in ["h100", "h200"] {
        let name = format!("dra-{model}");
        let node = dra_node(&api, &name, model);
        let uid = api.node(&name).unwrap().metadata.uid.unwrap();
        let mut last: Option<(i64, Vec<Value>)> = None;
        for (profile, _) in EXAMPLES.iter().filter(|(_, m)| *m == model) {
            api.set_node_label(&name, PROFILE_LABEL, Some(profile));
            wait_applied(&api, &node, profile, Duration::from_secs(60));
            let slices = assert_published_as_planned(&api, &node, profile);
            let owners = &slices[0]["metadata"]["ownerReferences"];
            assert_eq!(owners[0]["kind"], "Node");
            assert_eq!(owners[0]["name"], name.as_str());
            assert_eq!(owners[0]["uid"], uid.as_str());
            let now = generation(&slices);
            if let Some((before, old)) = &last {
                if content(old) != content(&slices) {
                    assert!(now > *before, "{profile}: generation {before} → {now}");
                }
            } else {
                assert_eq!(now, 1, "{profile}: a first publish is generation 1");
            }
            last = Some((now, slices));
        }
    }
}

/// h100-balanced → h100-inference with a pod on the 3g.40gb that goes, held by a budget: the
/// pool is republished without the devices going away before the cordon and the first
/// eviction, the 1g.10gb devices that stay are published throughout, and once applied the
/// pool is the new plan's at a higher generation.
#[test]
fn devices_going_away_are_withdrawn_before_the_drain_and_kept_ones_stay() {
    let api = Arc::new(KubeDouble::start());
    profiles_configmap(&api, &["h100-balanced", "h100-inference"], &[]);
    let mut node = AgentNode::new(&api, "dra-w", h100s(1, true));
    node.start_agent(&["--plugin", "dra"], &[]);
    api.set_node_label("dra-w", PROFILE_LABEL, Some("h100-balanced"));
    wait_applied(&api, &node, "h100-balanced", Duration::from_secs(30));
    let before = assert_published_as_planned(&api, &node, "h100-balanced");
    let next = planned(&node, "h100-inference");
    let going: BTreeSet<String> = device_names(&before)
        .difference(&device_names(&next))
        .cloned()
        .collect();
    let staying: BTreeSet<String> = device_names(&before)
        .intersection(&device_names(&next))
        .cloned()
        .collect();
    assert!(!going.is_empty() && !staying.is_empty());

    let gi = node.gi_at(0, 4);
    node.add_workloads(&api, &[Workload::on_mig("held", 6001, 0, gi)]);
    guard(&api, "held", "hold");
    api.clear_requests();
    let events_before = api.events().len();
    api.set_node_label("dra-w", PROFILE_LABEL, Some("h100-inference"));
    assert!(
        api.wait_until(Duration::from_secs(20), |a| a
            .evictions()
            .iter()
            .any(|e| e.code == 429)),
        "{}",
        node.log()
    );
    // Draining, held by the budget: the pool lacks exactly the devices going away.
    let during = published(&api, "dra-w");
    assert_eq!(device_names(&during), staying, "{}", node.log());
    assert!(generation(&during) > generation(&before));
    // The withdrawal's write precedes every eviction request, and its Event the cordon's.
    let requests = api.requests();
    let first = |want: &dyn Fn(&kube_double::RequestRecord) -> bool| {
        requests.iter().position(want).unwrap_or(usize::MAX)
    };
    let withdrawal = first(&|r| r.resource == "resourceslices" && r.verb == Verb::Update);
    let eviction = first(&|r| r.resource == "pods/eviction");
    assert!(
        withdrawal < eviction,
        "withdrawn (request {withdrawal}) before the first eviction (request {eviction})"
    );
    let reasons: Vec<String> = api.events()[events_before..]
        .iter()
        .filter_map(|e| e.reason.clone())
        .collect();
    let at = |r: &str| reasons.iter().position(|x| x == r).unwrap_or(usize::MAX);
    assert!(
        at("DevicesWithdrawn") < at("Cordoned"),
        "events in order: {reasons:?}"
    );

    api.remove::<k8s_openapi::api::policy::v1::PodDisruptionBudget>(Some("default"), "hold");
    wait_applied(&api, &node, "h100-inference", Duration::from_secs(30));
    let after = assert_published_as_planned(&api, &node, "h100-inference");
    assert!(generation(&after) > generation(&during));
    assert!(staying.is_subset(&device_names(&after)));
}

/// Nothing is written while nothing changes (resyncs every 2 s), and a restarted agent
/// continues from the API's generation: it writes nothing for the same profile and the next
/// change is one above, never a new generation 1.
#[test]
fn an_unchanged_pool_is_not_rewritten_and_a_restart_keeps_the_generation() {
    let api = Arc::new(KubeDouble::start());
    profiles_configmap(
        &api,
        &["h100-balanced", "exclusive", "homelab-timeslice"],
        &[(MANY_SHARES, text_of(MANY_SHARES))],
    );
    let mut node = AgentNode::new(&api, "dra-r", h100s(2, true));
    node.start_agent(&["--plugin", "dra"], &[]);
    api.set_node_label("dra-r", PROFILE_LABEL, Some("h100-balanced"));
    wait_applied(&api, &node, "h100-balanced", Duration::from_secs(30));
    api.set_node_label("dra-r", PROFILE_LABEL, Some("exclusive"));
    wait_applied(&api, &node, "exclusive", Duration::from_secs(30));
    let at = generation(&assert_published_as_planned(&api, &node, "exclusive"));
    // 1: h100-balanced; 2: its MIG devices withdrawn before the re-partition; 3: exclusive.
    assert_eq!(at, 3);

    api.clear_requests();
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(
        api.writes_to("resourceslices"),
        0,
        "resyncs of an unchanged pool write nothing"
    );

    node.kill_agent();
    api.clear_requests();
    node.start_agent(&["--plugin", "dra"], &[]);
    // The restarted agent reconciles the same profile: it reads the pool (a list)...
    assert!(
        poll(Duration::from_secs(20), Duration::from_millis(100), || api
            .requests()
            .iter()
            .any(
                |r| r.resource == "resourceslices" && r.verb == Verb::List
            )),
        "{}",
        node.log()
    );
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        api.writes_to("resourceslices"),
        0,
        "a restart with the same profile writes nothing"
    );
    assert_eq!(generation(&published(&api, "dra-r")), at);

    api.set_node_label("dra-r", PROFILE_LABEL, Some("homelab-timeslice"));
    wait_applied(&api, &node, "homelab-timeslice", Duration::from_secs(30));
    let slices = assert_published_as_planned(&api, &node, "homelab-timeslice");
    assert_eq!(
        generation(&slices),
        at + 1,
        "one above the restarted agent's start"
    );

    // 200 shares need two slices; back to exclusive, the second slice is deleted.
    let many = text_of(MANY_SHARES);
    api.set_node_label("dra-r", PROFILE_LABEL, Some(MANY_SHARES));
    wait_applied_text(&api, &node, &many, Duration::from_secs(30), MANY_SHARES);
    let slices = assert_published_as_planned(&api, &node, MANY_SHARES);
    assert_eq!(slices.len(), 2);
    assert_eq!(generation(&slices), at + 2);
    api.set_node_label("dra-r", PROFILE_LABEL, Some("exclusive"));
    wait_applied(&api, &node, "exclusive", Duration::from_secs(30));
    let slices = assert_published_as_planned(&api, &node, "exclusive");
    assert_eq!(slices.len(), 1, "the slice no longer needed is deleted");
    assert_eq!(generation(&slices), at + 3);
}

/// A write the API server refuses fails the reconcile with a reason naming the slices (the
/// GPUs are applied; the retry publishes), and the agent touches only its own pool: another
/// node's slices and another driver's slices on this node stay as they were.
#[test]
fn a_refused_slice_write_fails_and_is_retried_and_other_pools_are_left_alone() {
    let api = Arc::new(KubeDouble::start());
    profiles_configmap(&api, &["h100-balanced"], &[]);
    let foreign = |name: &str, node: &str, driver: &str| {
        serde_json::json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": name},
            "spec": {"driver": driver, "nodeName": node,
                     "pool": {"name": node, "generation": 5, "resourceSliceCount": 1},
                     "devices": [{"name": "gpu-0"}]},
        })
    };
    let theirs = [
        api.put_resource_slice(foreign("other-node", "gpu-9", DRIVER)),
        api.put_resource_slice(foreign("other-driver", "dra-f", "gpu.nvidia.com")),
    ];
    api.fail_next(
        Verb::Create,
        "resourceslices.resource.k8s.io",
        1,
        kube_double::Fault::Status(500),
    );
    let mut node = AgentNode::new(&api, "dra-f", h100s(1, true));
    node.start_agent(&["--plugin", "dra"], &[]);
    api.set_node_label("dra-f", PROFILE_LABEL, Some("h100-balanced"));
    wait_state(&api, &node, "failed", Duration::from_secs(20));
    let reason = annotation(&api, "dra-f", REASON).unwrap_or_default();
    assert!(
        reason.contains("could not publish the ResourceSlices"),
        "{reason}"
    );
    wait_applied(&api, &node, "h100-balanced", Duration::from_secs(30));
    assert_published_as_planned(&api, &node, "h100-balanced");
    for slice in &theirs {
        let name = slice["metadata"]["name"].as_str().unwrap();
        let now = api
            .resource_slices()
            .into_iter()
            .find(|s| s["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("{name} deleted"));
        assert_eq!(now, *slice, "{name} untouched");
    }
}

/// Running pods on `node`, each holding its device of the node's pool through a claim of its
/// own (`<pod>-claim`), as the kubelet lists them.
fn hold_through_claims(
    api: &KubeDouble,
    kubelet: &PodResourcesKubelet,
    node: &str,
    holders: &[(&str, &str)],
) {
    for (pod, device) in holders {
        api.put_pod(kube_double::fixtures::running_pod(
            "default",
            pod,
            node,
            &[("app", pod)],
        ));
        let claim = format!("{pod}-claim");
        kubelet.allocate_claim("default", pod, &claim, "gpu.gpu-share.dev", node, device);
    }
}

/// The drain knows DRA holders: a pod whose claim holds a device the re-partition destroys is
/// evicted first, though it runs no process on it; a pod holding a kept device stays. The
/// kubelet lists claims' devices in PodResources (`dynamic_resources`: driver, pool, device),
/// as node-sim's kubelet does. Measured on a real kubelet 1.36 before this: the pod was not
/// evicted and kept running on a MIG device that no longer existed.
#[test]
fn a_pod_holding_a_destroyed_device_through_a_claim_is_evicted_and_kept_devices_holders_stay() {
    let api = Arc::new(KubeDouble::start());
    profiles_configmap(&api, &["h100-balanced", "h100-inference"], &[]);
    let mut node = AgentNode::new(&api, "dra-claims", h100s(1, true));
    let kubelet = PodResourcesKubelet::serve(&api, &node.name, &node.pod_resources_socket());
    node.start_agent(&["--plugin", "dra"], &[]);
    api.set_node_label("dra-claims", PROFILE_LABEL, Some("h100-balanced"));
    wait_applied(&api, &node, "h100-balanced", Duration::from_secs(30));
    let before = assert_published_as_planned(&api, &node, "h100-balanced");
    let next = planned(&node, "h100-inference");
    let going = device_names(&before)
        .difference(&device_names(&next))
        .next()
        .cloned()
        .expect("a device goes away");
    let staying = device_names(&before)
        .intersection(&device_names(&next))
        .next()
        .cloned()
        .expect("a device stays");
    hold_through_claims(
        &api,
        &kubelet,
        "dra-claims",
        &[("on-going", &going), ("on-staying", &staying)],
    );
    api.set_node_label("dra-claims", PROFILE_LABEL, Some("h100-inference"));
    wait_applied(&api, &node, "h100-inference", Duration::from_secs(30));
    assert_eq!(
        evicted(&api),
        BTreeSet::from(["on-going".to_string()]),
        "{going} goes, {staying} stays\n{}",
        node.log()
    );
    assert!(api.pod("default", "on-staying").is_some());
    assert!(node.log().contains("is not published by the new profile"));
}

/// A device that keeps its name but not its sharing is a re-allocation too (issue 37 item 3,
/// the hole docs/dra.md named): GPU 0 goes from two time-sliced shares to two MPS shares under
/// the same names `gpu-0-share-0/1`, so the claim holding `gpu-0-share-0` would run outside
/// the MPS daemon its neighbours now share the GPU through; its pod is drained, the Event says
/// why. GPU 1 keeps its shares as they were: its holder stays.
#[test]
fn a_claims_device_that_keeps_its_name_but_not_its_sharing_is_drained() {
    let rules = |gpu0: &str| {
        format!(
            "version: v1\nrules:\n  - devices: [\"0\"]\n    {gpu0}: {{replicas: 2}}\n  \
             - devices: [\"1\"]\n    timeSlicing: {{replicas: 2}}\n"
        )
    };
    let (ts, mps) = (rules("timeSlicing"), rules("mps"));
    let api = Arc::new(KubeDouble::start());
    profiles_configmap(&api, &[], &[("ts", ts.clone()), ("mps", mps.clone())]);
    let mut node = AgentNode::new(&api, "dra-terms", h100s(2, false));
    let kubelet = PodResourcesKubelet::serve(&api, &node.name, &node.pod_resources_socket());
    node.start_agent(&["--plugin", "dra"], &[]);
    api.set_node_label("dra-terms", PROFILE_LABEL, Some("ts"));
    wait_applied_text(&api, &node, &ts, Duration::from_secs(30), "ts");
    hold_through_claims(
        &api,
        &kubelet,
        "dra-terms",
        &[("changed", "gpu-0-share-0"), ("unchanged", "gpu-1-share-0")],
    );
    api.set_node_label("dra-terms", PROFILE_LABEL, Some("mps"));
    wait_applied_text(&api, &node, &mps, Duration::from_secs(30), "mps");
    assert_eq!(
        evicted(&api),
        BTreeSet::from(["changed".to_string()]),
        "{}",
        node.log()
    );
    assert!(api.pod("default", "unchanged").is_some());
    let why = "DRA device gpu-0-share-0 (claim default/changed-claim) goes from time-sliced to MPS";
    assert!(
        api.events()
            .iter()
            .filter(|e| e.reason.as_deref() == Some("Reallocating"))
            .any(|e| e.note.as_deref().is_some_and(|n| n.contains(why))),
        "the Reallocating Event names why\n{}",
        node.log()
    );
}

/// A slice the API server refuses as invalid (422) is said as such: state failed with reason
/// `SlicesRejected` (Event and annotation) naming what to check, not a generic publish failure;
/// the retry publishes once the server takes it.
#[test]
fn slices_the_api_server_refuses_are_reported_as_rejected() {
    let api = Arc::new(KubeDouble::start());
    profiles_configmap(&api, &["h100-balanced"], &[]);
    api.fail_next(
        Verb::Create,
        "resourceslices.resource.k8s.io",
        1,
        kube_double::Fault::Status(422),
    );
    let mut node = AgentNode::new(&api, "dra-422", h100s(1, true));
    node.start_agent(&["--plugin", "dra"], &[]);
    api.set_node_label("dra-422", PROFILE_LABEL, Some("h100-balanced"));
    wait_state(&api, &node, "failed", Duration::from_secs(20));
    let reason = annotation(&api, "dra-422", REASON).unwrap_or_default();
    assert!(
        reason.contains("the API server refused the ResourceSlices"),
        "{reason}"
    );
    assert!(api.wait_until(Duration::from_secs(10), |a| a
        .events()
        .iter()
        .any(|e| e.reason.as_deref() == Some("SlicesRejected"))));
    wait_applied(&api, &node, "h100-balanced", Duration::from_secs(30));
}

/// A server with `DRAPartitionableDevices` off (1.34/1.35 default; the double drops the fields
/// as the apiserver's ResourceSlice strategy does) still gets a static MIG profile: every
/// device `plan` prints, none with counters, and a Normal `CountersDropped` Event saying why
/// that is safe (each MIG device is an instance of its own). A later change still publishes.
#[test]
fn a_static_mig_profile_is_published_without_counters_where_the_server_drops_them() {
    let api = Arc::new(KubeDouble::start());
    api.set_partitionable_devices(false);
    profiles_configmap(&api, &["h100-inference", "h100-balanced"], &[]);
    let node = dra_node(&api, "dra-gate-off", "h100");
    for profile in ["h100-inference", "h100-balanced"] {
        api.set_node_label(&node.name, PROFILE_LABEL, Some(profile));
        wait_applied(&api, &node, profile, Duration::from_secs(30));
        let want = device_names(&planned(&node, profile));
        let published_all = api.wait_until(Duration::from_secs(10), |a| {
            device_names(&published(a, &node.name)) == want
        });
        let slices = published(&api, &node.name);
        assert!(published_all, "{profile}: {:?}", device_names(&slices));
        generation(&slices);
        for slice in &slices {
            assert!(slice["spec"].get("sharedCounters").is_none(), "{slice}");
            for device in slice["spec"]["devices"].as_array().unwrap() {
                assert!(device.get("consumesCounters").is_none(), "{device}");
            }
        }
    }
    let dropped = |a: &KubeDouble| -> Vec<_> {
        a.events()
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("CountersDropped"))
            .collect()
    };
    // Events are written in the background.
    api.wait_until(Duration::from_secs(10), |a| !dropped(a).is_empty());
    let events = dropped(&api);
    assert_eq!(events.len(), 1, "reported once: {events:?}");
    assert_eq!(events[0].type_.as_deref(), Some("Normal"));
    let note = events[0].note.clone().unwrap_or_default();
    assert!(note.contains("so none is handed out twice"), "{note}");
}

/// A DRA node of 8 H100s with `dra/h100-fractional` applied (under a key a real ConfigMap
/// takes: no `/`), on an API server with `DRAConsumableCapacity` on or off.
fn fractional_node(name: &str, consumable_capacity: bool) -> (Arc<KubeDouble>, AgentNode) {
    let api = Arc::new(KubeDouble::start());
    api.set_consumable_capacity(consumable_capacity);
    let text = profile_text("dra/h100-fractional");
    profiles_configmap(&api, &[], &[("h100-fractional", text.clone())]);
    let node = dra_node(&api, name, "h100");
    api.set_node_label(&node.name, PROFILE_LABEL, Some("h100-fractional"));
    let wait = Duration::from_secs(30);
    wait_applied_text(&api, &node, &text, wait, "h100-fractional");
    (api, node)
}

/// Fractional GPUs (`dra/h100-fractional`) on a 1.36 server: each GPU is published as one
/// consumable device, `gpu-<i>-mps`, exactly as `plan` prints it, stored with
/// `allowMultipleAllocations` and its capacities' request policies.
#[test]
fn a_fractional_profile_publishes_one_consumable_device_per_gpu() {
    let (api, node) = fractional_node("dra-fractional", true);
    let want = device_names(&planned(&node, "dra/h100-fractional"));
    assert_eq!(want.len(), 8);
    assert!(want.contains("gpu-7-mps"), "{want:?}");
    assert!(
        api.wait_until(Duration::from_secs(10), |a| device_names(&published(
            a, &node.name
        )) == want)
    );
    for slice in published(&api, &node.name) {
        for device in slice["spec"]["devices"].as_array().unwrap() {
            assert_eq!(device["allowMultipleAllocations"], true, "{device}");
            let memory = &device["capacity"]["memory"];
            assert_eq!(memory["requestPolicy"]["default"], "4096Mi", "{device}");
            assert_eq!(device["capacity"]["clients"]["value"], "16", "{device}");
            assert!(
                device["attributes"]["parentUUID"].is_null()
                    && device["attributes"]["uuid"]["string"].is_string()
            );
        }
    }
}

/// A server with `DRAConsumableCapacity` off (before 1.36; the double drops the fields as the
/// apiserver's ResourceSlice strategy does) never ends up with a consumable device one claim
/// would get whole: the agent finds the fields gone in the stored answer and publishes each
/// GPU as 16 fixed MPS shares with an even memory split, and says so once in a Warning Event
/// naming the GPUs and the gate.
#[test]
fn a_server_without_consumable_capacity_gets_fixed_shares_and_a_warning() {
    let (api, node) = fractional_node("dra-no-consumable", false);
    let shares_only = |a: &KubeDouble| {
        let names = device_names(&published(a, &node.name));
        names.len() == 128 && names.iter().all(|n| n.contains("-share-"))
    };
    assert!(
        api.wait_until(Duration::from_secs(10), shares_only),
        "{:?}",
        device_names(&published(&api, &node.name))
    );
    let slices = published(&api, &node.name);
    generation(&slices);
    for slice in &slices {
        for device in slice["spec"]["devices"].as_array().unwrap() {
            assert!(device.get("allowMultipleAllocations").is_none(), "{device}");
            assert_eq!(
                device["attributes"]["mpsPinnedMemoryLimitMiB"]["int"], 5097,
                "{device}"
            );
            assert!(
                device["attributes"]["parentUUID"]["string"].is_string(),
                "{device}"
            );
        }
    }
    api.wait_until(Duration::from_secs(10), |a| {
        !events_of(a, "ConsumableCapacityDropped").is_empty()
    });
    let events = events_of(&api, "ConsumableCapacityDropped");
    assert_eq!(events.len(), 1, "reported once: {events:?}");
    assert_eq!(events[0].type_.as_deref(), Some("Warning"));
    let note = events[0].note.clone().unwrap_or_default();
    assert!(note.contains("DRAConsumableCapacity off"), "{note}");
    assert!(note.contains("0 (16 shares of 5097 MiB)"), "{note}");
}

/// Fractional MIG devices on a server without consumable capacity: each MIG device is
/// published as its fixed MPS shares (an even split of its profile's memory), and the Warning
/// names the GPU's MIG devices and their shares.
#[test]
fn fractional_mig_devices_fall_back_to_fixed_shares_with_a_warning() {
    let api = Arc::new(KubeDouble::start());
    api.set_consumable_capacity(false);
    let text = "version: v1\nrules:\n  - devices: all\n    mig: {3g.40gb: 2}\n    mps:\n      replicas: 4\n      consumable:\n        memory: {default: 4Gi, min: 1Gi, step: 1Gi}\n        compute: {default: 10, min: 5, step: 5}\n";
    profiles_configmap(&api, &[], &[("fractional-mig", text.to_string())]);
    let mut node = AgentNode::new(&api, "dra-mig-no-consumable", gpus("h100", 1, true));
    node.start_agent(&["--plugin", "dra"], &[]);
    api.set_node_label(&node.name, PROFILE_LABEL, Some("fractional-mig"));
    wait_applied_text(&api, &node, text, Duration::from_secs(30), "fractional-mig");
    let want: BTreeSet<String> = ["gpu-0-mig-0-3g-40gb", "gpu-0-mig-4-3g-40gb"]
        .iter()
        .flat_map(|d| (0..4).map(move |k| format!("{d}-share-{k}")))
        .collect();
    assert!(
        api.wait_until(Duration::from_secs(10), |a| device_names(&published(
            a, &node.name
        )) == want),
        "{:?}",
        device_names(&published(&api, &node.name))
    );
    api.wait_until(Duration::from_secs(10), |a| {
        !events_of(a, "ConsumableCapacityDropped").is_empty()
    });
    let events = events_of(&api, "ConsumableCapacityDropped");
    assert_eq!(events.len(), 1, "{events:?}");
    let note = events[0].note.clone().unwrap_or_default();
    assert!(
        note.contains("0's MIG devices (3g.40gb: 4 shares of 10112 MiB)"),
        "{note}"
    );
}

/// Every published device of `node` with its taints (devices without taints left out).
fn taints_of(api: &KubeDouble, node: &str) -> BTreeMap<String, Value> {
    published(api, node)
        .iter()
        .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .filter(|d| d.get("taints").is_some())
        .map(|d| (d["name"].as_str().unwrap().to_string(), d["taints"].clone()))
        .collect()
}

/// Raise critical XID `xid` in the fake NVML of `node` on GPU `gpu`, on its first MIG device
/// when `on_mig`; returns the faulted device's UUID.
fn raise_xid(node: &AgentNode, gpu: usize, xid: u64, on_mig: bool) -> String {
    let path = node.nvml_state();
    let mut s = nvidia_ml::State::read_from(&path).unwrap();
    let (ids, uuid) = if on_mig {
        let gi = &s.gpus[gpu].gpu_instances[0];
        let ci = &gi.compute_instances[0];
        (Some((gi.id, ci.id)), ci.uuid.clone())
    } else {
        (None, s.gpus[gpu].uuid.clone())
    };
    s.gpus[gpu].raise_xid(xid, ids);
    s.write_to(&path).unwrap();
    uuid
}

fn events_of(api: &KubeDouble, reason: &str) -> Vec<k8s_openapi::api::events::v1::Event> {
    api.events()
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .collect()
}

/// Node `name` (8 H100s, MIG on) with its agent under `--plugin dra --xid-heal-after 3s`
/// (resync 300 s, so only a fault or a heal republishes), h100-inference applied and the XID
/// watch running.
fn healing_node(api: &Arc<KubeDouble>, name: &str) -> AgentNode {
    profiles_configmap(api, &["h100-inference"], &[]);
    let mut node = AgentNode::new(api, name, gpus("h100", 8, true));
    let flags = [
        "--plugin",
        "dra",
        "--xid-heal-after",
        "3s",
        "--resync-period",
        "300s",
    ];
    node.start_agent(&flags, &[]);
    api.set_node_label(&node.name, PROFILE_LABEL, Some("h100-inference"));
    wait_applied(api, &node, "h100-inference", Duration::from_secs(30));
    let watching = poll(Duration::from_secs(30), Duration::from_millis(50), || {
        node.log().contains("watching for critical XID errors")
    });
    assert!(watching, "no XID watch\n{}", node.log());
    node
}

/// A critical XID on a MIG device taints that device alone in the API (key
/// gpu.gpu-share.dev/xid, the XID as value, NoSchedule, the fault's time), at once and not at
/// the next resync; after `--xid-heal-after` without another XID, NVML still listing the device,
/// the taint goes and a DeviceHealed Event says why.
#[test]
fn a_faulted_device_is_tainted_and_the_taint_goes_when_it_heals() {
    let api = Arc::new(KubeDouble::start());
    let node = healing_node(&api, "dra-taint");
    assert_published_as_planned(&api, &node, "h100-inference");
    assert!(taints_of(&api, &node.name).is_empty());

    let mig = raise_xid(&node, 0, 48, true);
    let tainted = api.wait_until(Duration::from_secs(20), |a| {
        !taints_of(a, &node.name).is_empty()
    });
    assert!(tainted, "no taint published\n{}", node.log());
    let taints = taints_of(&api, &node.name);
    let faulted: Vec<String> = published(&api, &node.name)
        .iter()
        .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .filter(|d| d["attributes"]["uuid"]["string"] == mig.as_str())
        .map(|d| d["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        taints.keys().cloned().collect::<Vec<_>>(),
        faulted,
        "exactly the faulted MIG device"
    );
    let taint = &taints[&faulted[0]][0];
    assert_eq!(taint["key"], "gpu.gpu-share.dev/xid");
    assert_eq!(taint["value"], "48");
    assert_eq!(taint["effect"], "NoSchedule");
    assert!(taint["timeAdded"]
        .as_str()
        .is_some_and(|t| t.ends_with('Z')));
    // Every other device is still published as planned.
    assert_eq!(
        device_names(&published(&api, &node.name)),
        device_names(&planned(&node, "h100-inference"))
    );
    assert!(api.wait_until(Duration::from_secs(10), |a| {
        !events_of(a, "DeviceUnhealthy").is_empty()
    }));

    let healed = api.wait_until(Duration::from_secs(30), |a| {
        taints_of(a, &node.name).is_empty()
    });
    assert!(healed, "the taint stayed\n{}", node.log());
    assert_published_as_planned(&api, &node, "h100-inference");
    assert!(api.wait_until(Duration::from_secs(10), |a| {
        !events_of(a, "DeviceHealed").is_empty()
    }));
    let note = events_of(&api, "DeviceHealed")[0]
        .note
        .clone()
        .unwrap_or_default();
    assert!(
        note.contains(&mig) && note.contains("raised no critical XID for 3s"),
        "{note}"
    );
}

/// On a server that drops taints (`DRADeviceTaints` off, before 1.36) the agent finds the loss
/// in the stored slices and withdraws the faulted GPU's devices instead, with one Warning
/// `TaintsDropped`; when the GPU heals its devices come back.
#[test]
fn where_the_server_drops_taints_a_faulted_gpus_devices_are_withdrawn_instead() {
    let api = Arc::new(KubeDouble::start());
    api.set_device_taints(false);
    let node = healing_node(&api, "dra-taints-off");
    let all = device_names(&planned(&node, "h100-inference"));

    raise_xid(&node, 5, 79, false);
    let of_gpu_5 = |d: &String| d.starts_with("gpu-5");
    let gone = api.wait_until(Duration::from_secs(20), |a| {
        let now = device_names(&published(a, &node.name));
        !now.iter().any(of_gpu_5) && !now.is_empty()
    });
    assert!(
        gone,
        "{:?}\n{}",
        device_names(&published(&api, &node.name)),
        node.log()
    );
    let left = device_names(&published(&api, &node.name));
    let want: BTreeSet<String> = all.iter().filter(|d| !of_gpu_5(d)).cloned().collect();
    assert!(all.iter().any(of_gpu_5), "the profile publishes GPU 5");
    assert_eq!(left, want, "only the faulted GPU's devices withdrawn");
    assert!(taints_of(&api, &node.name).is_empty());
    assert!(api.wait_until(Duration::from_secs(10), |a| {
        !events_of(a, "TaintsDropped").is_empty()
    }));
    let dropped = events_of(&api, "TaintsDropped");
    assert_eq!(dropped.len(), 1, "{dropped:?}");
    assert_eq!(dropped[0].type_.as_deref(), Some("Warning"));

    let back = api.wait_until(Duration::from_secs(30), |a| {
        device_names(&published(a, &node.name)) == all
    });
    assert!(
        back,
        "the healed GPU's devices did not come back\n{}",
        node.log()
    );
}
