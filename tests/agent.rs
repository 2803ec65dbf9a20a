//! `gpu-share agent` as a process, with the real kube client talking HTTP to the Kubernetes API
//! double (tests/kube-double) and NVML served by the fake library (tests/fake-nvml).
//!
//! The simulated node (tests/node-sim) plays the kubelet's part for GPU processes: each
//! simulated pod owns NVML processes (with a `/proc/<pid>/cgroup` naming its pod UID in a fixture
//! proc tree); when the pod is deleted, its processes leave the fake NVML state, as they would
//! when the container stops.

use std::io::Read;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube_double::{Fault, KubeDouble, Verb};
use node_sim::*;

/// The profiles ConfigMap with a few example profiles, under their file names.
fn configmap(api: &KubeDouble) {
    let names = [
        "h100-balanced",
        "h100-inference",
        "exclusive",
        "homelab-timeslice",
    ];
    profiles_configmap(api, &names, &[]);
}

/// One H100 node `name` whose agent (with `extra` flags) applied h100-balanced.
fn balanced_node(api: &Arc<KubeDouble>, name: &str, extra: &[&str]) -> AgentNode {
    let mut node = AgentNode::new(api, name, h100s(1, true));
    api.set_node_label(name, PROFILE_LABEL, Some("h100-balanced"));
    node.start_agent(extra, &[]);
    wait_state(api, &node, "success", Duration::from_secs(20));
    node
}

/// Pod `pod` (process `pid`) on GPU 0's 3g.40gb, which h100-inference destroys, guarded by
/// budget `pdb`.
fn guarded_workload(api: &KubeDouble, node: &AgentNode, pod: &str, pid: u32, pdb: &str) {
    let gi = node.gi_at(0, 4);
    node.add_workloads(api, &[Workload::on_mig(pod, pid, 0, gi)]);
    guard(api, pod, pdb);
}

/// GET `path` from the agent's HTTP endpoint (its address is in its first log line).
fn http_get(node: &AgentNode, path: &str) -> String {
    use std::io::Write;
    let log = node.log();
    let addr = log
        .lines()
        .find_map(|l| l.split("addr=").nth(1))
        .map(|a| a.split_whitespace().next().unwrap().to_string())
        .expect("the agent logs its address");
    let mut stream = std::net::TcpStream::connect(&addr).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
}

#[test]
fn label_set_changed_and_removed() {
    let api = Arc::new(KubeDouble::start());
    configmap(&api);
    let mut node = AgentNode::new(&api, "gpu-1", h100s(2, true));
    node.start_agent(&[], &[]);
    // The agent saw the Node without a label and finished that reconcile: only then is "no
    // mutation" a finding.
    node.wait_reconciled("noop", 0.0, Duration::from_secs(20));
    assert_eq!(
        node.mutations().len(),
        0,
        "no label: the GPUs are left alone"
    );

    let t0 = Instant::now();
    api.set_node_label("gpu-1", PROFILE_LABEL, Some("h100-balanced"));
    let config = node.plugin_config();
    assert!(
        api.wait_until(Duration::from_secs(20), |_| config.exists()),
        "{}",
        node.log()
    );
    eprintln!(
        "label set → device-plugin config written: {:?}",
        t0.elapsed()
    );
    wait_state(&api, &node, "success", Duration::from_secs(20));
    assert_eq!(
        annotation(&api, "gpu-1", APPLIED_HASH),
        Some(sha256(&profile_text("h100-balanced")))
    );
    assert_eq!(node.nvml().gpus[0].gpu_instances.len(), 5);
    assert!(!unschedulable(&api, "gpu-1"), "uncordoned after the change");
    // The Event follows the state label.
    assert!(
        api.wait_until(Duration::from_secs(10), |a| a
            .events()
            .iter()
            .any(|e| e.reason.as_deref() == Some("Applied"))),
        "no Applied event"
    );

    // A workload on a 1g.10gb that h100-inference keeps, and one on the 3g.40gb it destroys.
    let keep_gi = node.gi_at(0, 0);
    let gone_gi = node.gi_at(0, 4);
    node.add_workloads(
        &api,
        &[
            Workload::on_mig("stays", 4001, 0, keep_gi),
            Workload::on_mig("moves", 4002, 0, gone_gi),
        ],
    );
    let destroyed_before = node.count("nvmlGpuInstanceDestroy");
    api.set_node_label("gpu-1", PROFILE_LABEL, Some("h100-inference"));
    wait_applied(&api, &node, "h100-inference", Duration::from_secs(30));
    let evicted: Vec<String> = api.evictions().iter().map(|e| e.pod.clone()).collect();
    assert_eq!(
        evicted,
        ["moves"],
        "only the pod on the destroyed instance is evicted"
    );
    assert!(api.pod("default", "stays").is_some());
    // h100-balanced → h100-inference on 2 GPUs (both in its "0-3" MIG rule): only the two
    // 3g.40gb go; the eight 1g.10gb stay where they are.
    assert_eq!(node.count("nvmlGpuInstanceDestroy") - destroyed_before, 2);
    assert!(!unschedulable(&api, "gpu-1"));
    assert!(annotation(&api, "gpu-1", CORDONED).is_none());

    // Removing the label leaves the GPUs alone and drops the state.
    let before = node.mutations().len();
    let noops = node.reconciles("noop");
    api.set_node_label("gpu-1", PROFILE_LABEL, None);
    assert!(api.wait_until(Duration::from_secs(10), |a| state_of(a, "gpu-1").is_none()));
    node.wait_reconciled("noop", noops, Duration::from_secs(10));
    assert_eq!(node.mutations().len(), before);

    // The agent's own endpoints.
    let metrics = http_get(&node, "/metrics");
    assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
    assert!(
        metrics.contains("gpu_share_reconciles_total{result=\"success\"}"),
        "{metrics}"
    );
    assert!(
        metrics.contains("gpu_share_evictions_total{outcome=\"evicted\"} 1"),
        "{metrics}"
    );
    assert!(http_get(&node, "/readyz").starts_with("HTTP/1.1 200"));
    assert!(http_get(&node, "/healthz").starts_with("HTTP/1.1 200"));

    // Idle resident memory, for the note.
    let (rss, _) = node.agent_memory_kb();
    eprintln!("agent idle VmRSS: {rss} kB");
}

#[test]
fn an_edited_configmap_key_is_applied_and_an_invalid_one_changes_nothing() {
    let api = Arc::new(KubeDouble::start());
    configmap(&api);
    let node = balanced_node(&api, "gpu-2", &[]);

    let edited = profile_text("h100-balanced").replace("1g.10gb: 4", "1g.10gb: 3");
    api.update_configmap_key(NS, CM, "h100-balanced", Some(&edited));
    assert!(
        api.wait_until(Duration::from_secs(20), |a| {
            annotation(a, "gpu-2", APPLIED_HASH) == Some(sha256(&edited))
        }),
        "{}",
        node.log()
    );
    assert_eq!(node.nvml().gpus[0].gpu_instances.len(), 4);

    let before = node.mutations().len();
    let broken = edited.replace("1g.10gb: 3", "1g.10gb: 9");
    api.update_configmap_key(NS, CM, "h100-balanced", Some(&broken));
    wait_state(&api, &node, "failed", Duration::from_secs(20));
    let reason = annotation(&api, "gpu-2", REASON).unwrap();
    assert!(
        reason.contains("nothing was changed") && reason.contains("rule 1"),
        "{reason}"
    );
    assert!(
        reason.contains("9 × 1g.10gb asked, but at most 7"),
        "{reason}"
    );
    assert_eq!(
        node.mutations().len(),
        before,
        "an invalid profile changes nothing on the GPUs"
    );
    assert!(!unschedulable(&api, "gpu-2"));
}

/// Each profile applied gets an Event that names it. kube-runtime's Recorder folds events of
/// the same type, action and reason into one series and keeps the first note: with a fixed
/// action the second `Applied` still said "profile h100-balanced applied".
#[test]
fn each_applied_profile_has_an_event_naming_it() {
    let api = Arc::new(KubeDouble::start());
    configmap(&api);
    let node = balanced_node(&api, "gpu-8", &[]);
    api.set_node_label("gpu-8", PROFILE_LABEL, Some("h100-inference"));
    wait_applied(&api, &node, "h100-inference", Duration::from_secs(30));
    let applied_notes = |a: &KubeDouble| -> Vec<String> {
        a.events()
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("Applied"))
            .filter_map(|e| e.note)
            .collect()
    };
    assert!(
        api.wait_until(Duration::from_secs(10), |a| {
            let notes = applied_notes(a);
            notes
                .iter()
                .any(|n| n.contains("profile h100-balanced applied"))
                && notes
                    .iter()
                    .any(|n| n.contains("profile h100-inference applied"))
        }),
        "Applied events: {:?}",
        applied_notes(&api)
    );
    // A log reader follows one change: what the reconcile logs carries the node, the profile
    // and its hash, and the drain-and-apply step its own span.
    let log = node.log();
    let traced = log.lines().find(|l| {
        l.contains("reconcile{node=gpu-8")
            && l.contains("h100-inference")
            && l.contains("hash=")
            && l.contains("drain-and-apply")
    });
    assert!(
        traced.is_some(),
        "no line in the reconcile and step spans:\n{log}"
    );
}

#[test]
fn a_pdb_blocks_the_drain_then_allows_it_and_a_restarted_agent_finishes() {
    let api = Arc::new(KubeDouble::start());
    configmap(&api);
    let mut node = balanced_node(&api, "gpu-3", &[]);
    guarded_workload(&api, &node, "guarded", 5001, "guard");

    api.set_node_label("gpu-3", PROFILE_LABEL, Some("h100-inference"));
    wait_state(&api, &node, "draining", Duration::from_secs(20));
    assert!(api.wait_until(Duration::from_secs(10), |a| a
        .evictions()
        .iter()
        .any(|e| e.code == 429)));
    assert!(unschedulable(&api, "gpu-3"), "cordoned while draining");
    // The wait is said where an operator looks, on the Node's Events, naming pod and budget.
    assert!(
        api.wait_until(Duration::from_secs(10), |a| a.events().iter().any(|e| {
            e.reason.as_deref() == Some("EvictionBlocked")
                && e.type_.as_deref() == Some("Warning")
                && e.note.as_deref().is_some_and(|n| {
                    n.contains("default/guarded") && n.contains("PodDisruptionBudget")
                })
        })),
        "no EvictionBlocked event: {:?}",
        api.events()
            .iter()
            .map(|e| (e.reason.clone(), e.note.clone()))
            .collect::<Vec<_>>()
    );
    let cordon_reason = annotation(&api, "gpu-3", CORDONED).unwrap();
    assert!(cordon_reason.contains("h100-inference"), "{cordon_reason}");

    // The agent dies mid-drain; the node stays cordoned with its reason on it.
    node.kill_agent();
    assert!(unschedulable(&api, "gpu-3"));
    node.start_agent(&[], &[]);
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(
        state_of(&api, "gpu-3").as_deref(),
        Some("draining"),
        "{}",
        node.log()
    );

    // The budget allows it now: the restarted agent finishes and uncordons.
    api.remove::<k8s_openapi::api::policy::v1::PodDisruptionBudget>(Some("default"), "guard");
    wait_applied(&api, &node, "h100-inference", Duration::from_secs(30));
    assert!(!unschedulable(&api, "gpu-3"));
    assert!(api.pod("default", "guarded").is_none());
    assert!(
        node.log().contains("draining"),
        "progress lines while waiting"
    );
}

#[test]
fn a_drain_that_never_ends_fails_clearly_and_uncordons() {
    let api = Arc::new(KubeDouble::start());
    configmap(&api);
    let node = balanced_node(&api, "gpu-4", &["--drain-timeout", "2s"]);
    guarded_workload(&api, &node, "pinned", 6001, "pin");
    let before = node.mutations().len();

    api.set_node_label("gpu-4", PROFILE_LABEL, Some("h100-inference"));
    wait_state(&api, &node, "failed", Duration::from_secs(20));
    let reason = annotation(&api, "gpu-4", REASON).unwrap();
    assert!(
        reason.contains("drain timed out") && reason.contains("default/pinned"),
        "{reason}"
    );
    assert!(!unschedulable(&api, "gpu-4"), "uncordoned after giving up");
    assert_eq!(
        node.mutations().len(),
        before,
        "nothing changed on the GPUs"
    );
    assert!(api.pod("default", "pinned").is_some());
}

#[test]
fn two_nodes_share_one_drain_slot() {
    let api = Arc::new(KubeDouble::start());
    configmap(&api);
    let mut a = AgentNode::new(&api, "gpu-a", h100s(1, true));
    let mut b = AgentNode::new(&api, "gpu-b", h100s(1, true));
    for n in [&a, &b] {
        api.set_node_label(&n.name, PROFILE_LABEL, Some("h100-balanced"));
    }
    a.start_agent(&[], &[]);
    b.start_agent(&[], &[]);
    wait_state(&api, &a, "success", Duration::from_secs(20));
    wait_state(&api, &b, "success", Duration::from_secs(20));
    // Both get a workload that must be evicted, each held by a budget for a while.
    for (n, pid) in [(&a, 7001), (&b, 7002)] {
        guarded_workload(
            &api,
            n,
            &format!("w-{}", n.name),
            pid,
            &format!("pdb-{}", n.name),
        );
    }
    api.set_node_label("gpu-a", PROFILE_LABEL, Some("h100-inference"));
    api.set_node_label("gpu-b", PROFILE_LABEL, Some("h100-inference"));
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut max_cordoned = 0;
    while Instant::now() < deadline {
        let cordoned = ["gpu-a", "gpu-b"]
            .iter()
            .filter(|n| unschedulable(&api, n))
            .count();
        max_cordoned = max_cordoned.max(cordoned);
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(max_cordoned, 1, "one node drains at a time");
    let waiting = [&a, &b]
        .iter()
        .filter(|n| state_of(&api, &n.name).as_deref() == Some("pending"))
        .count();
    assert_eq!(waiting, 1, "the other waits for the slot");
    for n in ["gpu-a", "gpu-b"] {
        api.remove::<k8s_openapi::api::policy::v1::PodDisruptionBudget>(
            Some("default"),
            &format!("pdb-{n}"),
        );
    }
    let mut max_cordoned = 0;
    let done = api.wait_until(Duration::from_secs(40), |api| {
        let cordoned = ["gpu-a", "gpu-b"]
            .iter()
            .filter(|n| unschedulable(api, n))
            .count();
        max_cordoned = max_cordoned.max(cordoned);
        state_of(api, "gpu-a").as_deref() == Some("success")
            && state_of(api, "gpu-b").as_deref() == Some("success")
    });
    assert!(done, "a: {}\nb: {}", a.log(), b.log());
    assert!(max_cordoned <= 1, "never two nodes cordoned at once");
    a.kill_agent();
    b.kill_agent();
}

#[test]
fn api_errors_and_dropped_watches_are_survived() {
    use kube_double::{Fault, Verb};
    let api = Arc::new(KubeDouble::start());
    configmap(&api);
    let mut node = AgentNode::new(&api, "gpu-5", h100s(1, true));
    node.start_agent(&[], &[]);
    wait_gpus_labelled(&api, &node);
    api.fail_next(Verb::Patch, "nodes", 3, Fault::Status(500));
    api.drop_watches();
    api.compact();
    api.set_node_label("gpu-5", PROFILE_LABEL, Some("h100-balanced"));
    wait_state(&api, &node, "success", Duration::from_secs(30));
    assert_eq!(node.nvml().gpus[0].gpu_instances.len(), 5);
}

/// GET /readyz until its answer satisfies `ok` (or fail after `timeout`); the last answer.
fn readyz_until(node: &AgentNode, timeout: Duration, ok: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + timeout;
    while !node.log().contains("addr=") {
        assert!(
            Instant::now() < deadline,
            "the agent never logged its address"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    loop {
        let answer = http_get(node, "/readyz");
        if ok(&answer) {
            return answer;
        }
        assert!(Instant::now() < deadline, "last /readyz answer: {answer}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn node_writes_refused_with_403_make_the_agent_not_ready_until_they_go_through() {
    let api = Arc::new(KubeDouble::start());
    configmap(&api);
    let mut node = AgentNode::new(&api, "gpu-forbidden", h100s(1, false));
    node.start_agent(&[], &[]);
    readyz_until(&node, Duration::from_secs(20), |a| {
        a.starts_with("HTTP/1.1 200")
    });
    wait_gpus_labelled(&api, &node);

    // RBAC or the admission policy refuses the state writes of one reconcile: `applying`, and
    // the `failed` that reports it. Retrying cannot mend that, so /readyz says so.
    api.fail_next(Verb::Patch, "nodes", 2, Fault::Status(403));
    api.set_node_label(&node.name, PROFILE_LABEL, Some("homelab-timeslice"));
    let answer = readyz_until(&node, Duration::from_secs(20), |a| {
        a.starts_with("HTTP/1.1 503")
    });
    assert!(
        answer.contains("the API server refuses the agent's Node writes")
            && answer.contains("could not publish state")
            && answer.contains("gpu-share-agent-scope"),
        "{answer}"
    );

    // The refusals end (the grant is fixed): the retry publishes and the agent is ready again.
    wait_applied(&api, &node, "homelab-timeslice", Duration::from_secs(30));
    readyz_until(&node, Duration::from_secs(10), |a| {
        a.starts_with("HTTP/1.1 200")
    });
}

/// A ConfigMap key over 1 MiB (more than a ConfigMap can hold) is refused
/// before it is parsed: state `failed` naming the key and the limit, nothing done to the GPUs.
#[test]
fn a_configmap_key_over_1_mib_fails_unparsed_and_changes_nothing() {
    let api = Arc::new(KubeDouble::start());
    configmap(&api);
    let node = balanced_node(&api, "gpu-9", &[]);
    let before = node.mutations().len();

    let mut huge = profile_text("h100-inference");
    huge.push('#');
    huge.push_str(&"x".repeat(gpu_share::profile::MAX_PROFILE_BYTES));
    api.update_configmap_key(NS, CM, "huge", Some(&huge));
    api.set_node_label("gpu-9", PROFILE_LABEL, Some("huge"));
    wait_state(&api, &node, "failed", Duration::from_secs(20));
    let reason = annotation(&api, "gpu-9", REASON).unwrap();
    assert!(
        reason.contains("profile \"huge\"") && reason.contains("larger than 1048576 bytes"),
        "{reason}"
    );
    assert_eq!(
        node.mutations().len(),
        before,
        "a profile refused for its size changes nothing on the GPUs"
    );
    assert!(!unschedulable(&api, "gpu-9"));
}

/// A new ConfigMap key and the label naming it, set one after the other (how a profile is
/// rolled out), when the agent's ConfigMap watch lags its Node watch: the agent must not call
/// the key missing (state `failed`, MissingProfile) for a profile the API has. The lag is made
/// certain: every watch is dropped and the ConfigMap watch's next 3 attempts are refused, so
/// the label arrives ~3 s before the key does. A key the API lacks too still fails at once,
/// naming the key.
#[test]
fn a_label_seen_before_its_configmap_key_applies_it_and_a_missing_key_fails() {
    let api = Arc::new(KubeDouble::start());
    configmap(&api);
    let node = balanced_node(&api, "gpu-10", &[]);
    let events_before = api.events().len();

    api.fail_next(Verb::Watch, "configmaps", 3, Fault::Status(500));
    api.drop_watches();
    let fresh = profile_text("h100-inference");
    api.update_configmap_key(NS, CM, "fresh", Some(&fresh));
    api.set_node_label("gpu-10", PROFILE_LABEL, Some("fresh"));
    wait_applied_text(&api, &node, &fresh, Duration::from_secs(30), "fresh");
    let lagged = api
        .requests()
        .iter()
        .filter(|r| r.resource == "configmaps" && r.verb == Verb::Watch && r.injected)
        .count();
    assert!(lagged >= 1, "the ConfigMap watch was held back");
    // The confirming read is a list by name: the agent's Role grants list and watch of the
    // profiles ConfigMap, not get (deploy/base/rbac.yaml).
    let configmap_reads: Vec<(Verb, String)> = api
        .requests()
        .into_iter()
        .filter(|r| r.resource == "configmaps" && r.verb != Verb::Watch)
        .map(|r| (r.verb, r.query))
        .collect();
    assert!(
        configmap_reads
            .iter()
            .any(|(v, q)| *v == Verb::List
                && q.contains(&format!("fieldSelector=metadata.name%3D{CM}"))),
        "{configmap_reads:?}"
    );
    assert!(
        !configmap_reads.iter().any(|(v, _)| *v == Verb::Get),
        "{configmap_reads:?}"
    );
    assert!(
        node.log().contains("its watch had not caught up"),
        "the label came before the key's watch event\n{}",
        node.log()
    );
    let reasons: Vec<String> = api.events()[events_before..]
        .iter()
        .filter_map(|e| e.reason.clone())
        .collect();
    assert!(
        !reasons.iter().any(|r| r == "MissingProfile"),
        "no MissingProfile for a key the API has: {reasons:?}\n{}",
        node.log()
    );

    let mutations = node.mutations().len();
    api.set_node_label("gpu-10", PROFILE_LABEL, Some("no-such-key"));
    wait_state(&api, &node, "failed", Duration::from_secs(20));
    let reason = annotation(&api, "gpu-10", REASON).unwrap();
    assert!(
        reason.contains("gpu-share.dev/profile=no-such-key names no key of ConfigMap"),
        "{reason}"
    );
    assert_eq!(
        node.mutations().len(),
        mutations,
        "nothing changed on the GPUs"
    );
}

/// A profile that time-slices every GPU `replicas` ways: two of them differ by no MIG step.
fn time_sliced(replicas: u32) -> String {
    format!(
        "version: v1\ndescription: every GPU time-sliced {replicas} ways\nrules:\n  - devices: all\n    timeSlicing: {{replicas: {replicas}}}\n"
    )
}

/// A node of `gpus` whose agent applied `ts-4` (ConfigMap keys `ts-4`, `ts-8`), with `extra`
/// flags; resyncs are 300 s apart, so only label changes reconcile.
fn time_sliced_node(api: &Arc<KubeDouble>, name: &str, gpus: usize, extra: &[&str]) -> AgentNode {
    profiles_configmap(
        api,
        &[],
        &[("ts-4", time_sliced(4)), ("ts-8", time_sliced(8))],
    );
    let mut node = AgentNode::new(api, name, h100s(gpus, false));
    api.set_node_label(name, PROFILE_LABEL, Some("ts-4"));
    let mut flags = vec!["--resync-period", "300s"];
    flags.extend_from_slice(extra);
    node.start_agent(&flags, &[]);
    wait_applied_text(api, &node, &time_sliced(4), Duration::from_secs(20), "ts-4");
    wait_gpus_labelled(api, &node);
    node
}

#[test]
fn a_change_without_mig_writes_the_plugin_config_before_any_node_write() {
    // The config is what the user waits for when nothing is disrupted; the state
    // writes come after it. The next Node PATCH hangs until the 12 s API timeout: before the
    // fix the `applying` write was awaited first, so the config came only after that timeout.
    let api = Arc::new(KubeDouble::start());
    let node = time_sliced_node(&api, "gpu-no-wait", 2, &["--api-timeout", "12s"]);
    let config = node.plugin_config();
    let before = std::fs::read(&config).unwrap();
    api.fail_next(Verb::Patch, "nodes", 1, Fault::Hang);
    api.set_node_label(&node.name, PROFILE_LABEL, Some("ts-8"));
    let written = poll(Duration::from_secs(8), Duration::from_millis(5), || {
        std::fs::read(&config).is_ok_and(|now| now != before)
    });
    assert!(
        written,
        "config not written while a Node write hangs\n{}",
        node.log()
    );
    assert!(std::fs::read_to_string(&config)
        .unwrap()
        .contains("replicas: 8"));
    // Nothing claimed ahead of the write: the node still shows ts-4 applied (the hung PATCH
    // is this change's `success`, which comes only after the write).
    assert_eq!(
        annotation(&api, &node.name, APPLIED_HASH),
        Some(sha256(&time_sliced(4)))
    );
    // A lost `success` fails the reconcile (ApiError) and the retry publishes it.
    wait_applied_text(
        &api,
        &node,
        &time_sliced(8),
        Duration::from_secs(40),
        "ts-8",
    );
    // The hung PATCH is the first Node write after the config: `success`, or, when the apply
    // ran past APPLYING_AFTER (20 ms; a loaded 2-core CI machine), the `applying` announcement
    // (logged and retried). Either way it was reported, and it came after the config.
    let hung_write_reported = |n: &str| {
        n.contains("could not publish state success")
            || n.contains("could not publish state applying")
    };
    assert!(
        api.events()
            .iter()
            .any(|e| e.note.as_deref().is_some_and(hung_write_reported)),
        "the hung Node write was not reported: {:?}",
        api.events()
            .iter()
            .map(|e| e.note.clone())
            .collect::<Vec<_>>()
    );
}

#[test]
fn gpus_changed_behind_the_agents_back_are_read_again_before_success() {
    // A change without MIG steps is planned against the GPUs as the agent last read them
    //; a fresh read confirms it before `success`. An administrator enables MIG by
    // hand (`nvidia-smi -mig 1`; H100s need no reset, the MIG User Guide, docs/sources.md) after
    // that last read: the time-slicing profile needs it off again, so the agent must notice.
    let api = Arc::new(KubeDouble::start());
    let node = time_sliced_node(&api, "gpu-drift", 1, &[]);
    let mut state = node.nvml();
    state.gpus[0].mig = Some(nvidia_ml::state::MigMode {
        current: true,
        pending: true,
    });
    state.write_to(node.nvml_state()).unwrap();

    api.set_node_label(&node.name, PROFILE_LABEL, Some("ts-8"));
    wait_applied_text(
        &api,
        &node,
        &time_sliced(8),
        Duration::from_secs(30),
        "ts-8",
    );
    let mig = node.nvml().gpus[0].mig.unwrap();
    assert!(
        !mig.current,
        "success published with MIG still on\n{}",
        node.log()
    );
    assert!(
        node.log()
            .contains("the GPUs changed since they were last read"),
        "{}",
        node.log()
    );
}

/// Rewrite pod `namespace/name` at the double (same UID) with `change` applied.
fn edit_pod(
    api: &KubeDouble,
    namespace: &str,
    name: &str,
    change: impl FnOnce(&mut k8s_openapi::api::core::v1::Pod),
) {
    let mut pod = api.pod(namespace, name).expect("the pod exists");
    let uid = pod.metadata.uid.clone();
    change(&mut pod);
    let put = api.put_pod(pod);
    assert_eq!(put.metadata.uid, uid, "the same pod, not a new one");
}

/// The reason annotation the agent published on `node`.
fn reason_of(api: &KubeDouble, node: &str) -> String {
    annotation(api, node, REASON).unwrap_or_default()
}

/// A pod no controller owns is not evicted by default, as `kubectl drain` refuses one without
/// `--force` (k8s.io/kubectl/pkg/drain/filters.go, unreplicatedFilter: "cannot delete Pods
/// that declare no controller"): evicted, it would be gone for good. The drain stops before its
/// first eviction (the managed pod beside it stays too), the node waits in `blocked` naming the
/// pod and the way out, and nothing on the GPU changes. With `--evict-bare-pods` it goes.
#[test]
fn a_bare_pod_blocks_the_drain_by_name_and_nothing_is_evicted() {
    let api = Arc::new(KubeDouble::start());
    configmap(&api);
    let mut node = balanced_node(&api, "gpu-bare", &[]);
    let gi = node.gi_at(0, 4);
    node.add_workloads(
        &api,
        &[
            Workload::on_mig("managed", 7001, 0, gi),
            Workload::on_mig("bare", 7002, 0, gi),
        ],
    );
    edit_pod(&api, "default", "bare", |p| {
        p.metadata.owner_references = None
    });
    let before = node.mutations().len();

    api.set_node_label("gpu-bare", PROFILE_LABEL, Some("h100-inference"));
    wait_state(&api, &node, "blocked", Duration::from_secs(20));
    let reason = reason_of(&api, "gpu-bare");
    assert!(
        reason.contains("default/bare") && reason.contains("--evict-bare-pods"),
        "{reason}"
    );
    assert!(!reason.contains("default/managed"), "{reason}");
    assert!(api.evictions().is_empty(), "{:?}", api.evictions());
    assert!(api.pod("default", "bare").is_some());
    assert!(api.pod("default", "managed").is_some());
    assert_eq!(node.mutations().len(), before, "the GPU was changed");
    assert!(
        api.wait_until(Duration::from_secs(10), |a| !unschedulable(a, "gpu-bare")),
        "the node is left uncordoned while it waits"
    );
    // The Event follows the `blocked` state (src/agent/reconcile.rs `fail`).
    assert!(
        api.wait_until(Duration::from_secs(10), |a| a.events().iter().any(|e| {
            e.reason.as_deref() == Some("PodNotEvictable")
                && e.note
                    .as_deref()
                    .is_some_and(|n| n.contains("default/bare"))
        }))
    );

    // An operator who accepts the loss says so; both pods go and the profile is applied.
    node.kill_agent();
    node.start_agent(&["--evict-bare-pods"], &[]);
    wait_applied(&api, &node, "h100-inference", Duration::from_secs(30));
    assert!(api.pod("default", "bare").is_none());
    assert!(api.pod("default", "managed").is_none());
}

/// A pod with an emptyDir volume is not evicted by default, as `kubectl drain` refuses one
/// without `--delete-emptydir-data` (filters.go, localStorageFilter); with that agent option it
/// goes.
#[test]
fn a_pod_with_emptydir_data_blocks_the_drain_until_allowed() {
    let api = Arc::new(KubeDouble::start());
    configmap(&api);
    let mut node = balanced_node(&api, "gpu-scratch", &[]);
    let gi = node.gi_at(0, 4);
    node.add_workloads(&api, &[Workload::on_mig("scratch", 7101, 0, gi)]);
    edit_pod(&api, "default", "scratch", |p| {
        p.spec.as_mut().unwrap().volumes = Some(vec![k8s_openapi::api::core::v1::Volume {
            name: "cache".into(),
            empty_dir: Some(Default::default()),
            ..Default::default()
        }]);
    });

    api.set_node_label("gpu-scratch", PROFILE_LABEL, Some("h100-inference"));
    wait_state(&api, &node, "blocked", Duration::from_secs(20));
    let reason = reason_of(&api, "gpu-scratch");
    assert!(
        reason.contains("default/scratch")
            && reason.contains("emptyDir")
            && reason.contains("--delete-emptydir-data"),
        "{reason}"
    );
    assert!(api.evictions().is_empty(), "{:?}", api.evictions());

    node.kill_agent();
    node.start_agent(&["--delete-emptydir-data"], &[]);
    wait_applied(&api, &node, "h100-inference", Duration::from_secs(30));
    assert!(api.pod("default", "scratch").is_none());
}

/// The loop reconciles when what the node wants changes (its label, the selected key's text),
/// not on every Node event: each of the agent's own writes to its Node (the state label, the
/// applied-hash and reason annotations, its found-GPU labels) comes back as a watch event, and
/// is dropped by comparing the desire. The second label change is the sign that the loop has
/// handled every event before it: its reconcile runs after them. The figure behind the agent
/// module doc's choice of this loop over kube-runtime's `Controller` (issue 39 item 7).
#[test]
fn the_agents_own_node_writes_wake_the_loop_but_reconcile_nothing() {
    let api = Arc::new(KubeDouble::start());
    configmap(&api);
    let mut node = AgentNode::new(&api, "gpu-own-writes", h100s(1, true));
    node.start_agent(&[], &[]);
    node.wait_reconciled("noop", 0.0, Duration::from_secs(20));
    let reconciles = |node: &AgentNode| {
        ["success", "noop", "failed"]
            .iter()
            .map(|r| node.reconciles(r))
            .sum::<f64>()
    };
    let node_writes = |api: &KubeDouble| {
        api.requests()
            .iter()
            .filter(|r| r.resource.starts_with("nodes"))
            .filter(|r| matches!(r.verb, Verb::Create | Verb::Update | Verb::Patch))
            .count()
    };
    let (runs_before, writes_before) = (reconciles(&node), node_writes(&api));
    // A MIG change: pending, the cordon, applying, the uncordon and success are Node writes.
    api.set_node_label("gpu-own-writes", PROFILE_LABEL, Some("h100-balanced"));
    wait_applied(&api, &node, "h100-balanced", Duration::from_secs(20));
    wait_gpus_labelled(&api, &node);
    let writes = node_writes(&api) - writes_before;
    api.set_node_label("gpu-own-writes", PROFILE_LABEL, Some("exclusive"));
    wait_applied(&api, &node, "exclusive", Duration::from_secs(20));
    // The second change's reconcile is counted as it ends, after its success is published.
    let deadline = Instant::now() + Duration::from_secs(20);
    while reconciles(&node) - runs_before < 2.0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let runs = reconciles(&node) - runs_before;
    eprintln!(
        "a MIG change: {writes} Node writes by the agent; 2 label changes: {runs} reconciles"
    );
    assert!(
        writes >= 4,
        "the MIG change wrote its states and the cordon: {writes}"
    );
    assert_eq!(runs, 2.0, "one reconcile per label change\n{}", node.log());
}
