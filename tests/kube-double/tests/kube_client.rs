//! The double driven by the real kube client (kube 5 / kube-runtime) over HTTP.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{
    Api, DeleteParams, EvictParams, ListParams, Patch, PatchParams, PostParams, WatchEvent,
    WatchParams,
};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use kube_double::{fixtures, EvictionOutcome, Fault, KubeDouble, PodTermination, Verb};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(10);

fn api_status(e: kube::Error) -> kube::core::Status {
    match e {
        kube::Error::Api(s) => *s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// Runs the future with a deadline so a hung stream fails the test instead of stalling CI.
async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(WAIT, f)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

#[tokio::test]
async fn node_get_patch_and_conflicting_update() {
    let double = KubeDouble::start();
    double.put_node(fixtures::node(
        "gpu-1",
        &[("kubernetes.io/hostname", "gpu-1")],
    ));
    let nodes: Api<Node> = Api::all(double.client());

    let n = nodes.get("gpu-1").await.unwrap();
    let rv0 = n.resource_version().unwrap();
    assert_eq!(n.labels()["kubernetes.io/hostname"], "gpu-1");
    assert!(n.uid().is_some());

    // Merge patch: add a label and an annotation.
    let patched = nodes
        .patch(
            "gpu-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {
                "labels": {"gpu-share.dev/profile": "small"},
                "annotations": {"gpu-share.dev/reason": "test"}
            }})),
        )
        .await
        .unwrap();
    assert_eq!(patched.labels()["gpu-share.dev/profile"], "small");
    assert_ne!(patched.resource_version().unwrap(), rv0);

    // Strategic merge patch: cordon, and a state label.
    nodes
        .patch(
            "gpu-1",
            &PatchParams::default(),
            &Patch::Strategic(json!({
                "metadata": {"labels": {"gpu-share.dev/profile.state": "pending"}},
                "spec": {"unschedulable": true}
            })),
        )
        .await
        .unwrap();
    let stored = double.node("gpu-1").unwrap();
    assert_eq!(stored.spec.as_ref().unwrap().unschedulable, Some(true));
    assert_eq!(stored.labels()["gpu-share.dev/profile.state"], "pending");
    assert_eq!(stored.labels()["gpu-share.dev/profile"], "small");

    // A no-op patch keeps the resourceVersion (no write, no watch event).
    let same = nodes
        .patch(
            "gpu-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": true}})),
        )
        .await
        .unwrap();
    assert_eq!(same.resource_version(), stored.resource_version());

    // Optimistic concurrency: an update with the stale object gets 409 Conflict.
    let mut stale = n.clone();
    stale.labels_mut().insert("x".into(), "y".into());
    let err = api_status(
        nodes
            .replace("gpu-1", &PostParams::default(), &stale)
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 409);
    assert!(err.is_conflict());
    assert!(
        err.message.contains("the object has been modified"),
        "{}",
        err.message
    );

    // With the current version the update goes through (and spec.unschedulable comes back off).
    let mut fresh = nodes.get("gpu-1").await.unwrap();
    fresh.spec.as_mut().unwrap().unschedulable = None;
    let updated = nodes
        .replace("gpu-1", &PostParams::default(), &fresh)
        .await
        .unwrap();
    assert_eq!(updated.spec.unwrap().unschedulable, None);

    // A merge patch that carries a stale resourceVersion is a conflict too.
    let err = api_status(
        nodes
            .patch(
                "gpu-1",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"resourceVersion": rv0, "labels": {"a": "b"}}})),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 409);

    // JSON patch with a failing test op is rejected (422) and changes nothing.
    let err = api_status(
        nodes
            .patch(
                "gpu-1",
                &PatchParams::default(),
                &Patch::Json::<()>(
                    serde_json::from_value(json!([
                        {"op": "test", "path": "/metadata/labels/gpu-share.dev~1profile", "value": "large"},
                        {"op": "remove", "path": "/metadata/labels/gpu-share.dev~1profile"}
                    ]))
                    .unwrap(),
                ),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 422);
    assert_eq!(
        double.node("gpu-1").unwrap().labels()["gpu-share.dev/profile"],
        "small"
    );

    // The main endpoint ignores status; the status subresource takes only status.
    let mut with_status = nodes.get("gpu-1").await.unwrap();
    with_status.status.as_mut().unwrap().conditions = None;
    nodes
        .replace("gpu-1", &PostParams::default(), &with_status)
        .await
        .unwrap();
    assert!(double
        .node("gpu-1")
        .unwrap()
        .status
        .unwrap()
        .conditions
        .is_some());

    // Server-side apply is not implemented: 415, never a silent half-apply.
    let err = api_status(
        nodes
            .patch(
                "gpu-1",
                &PatchParams::apply("test"),
                &Patch::Apply(
                    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-1"}}),
                ),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 415);

    // Not found is a proper 404 Status.
    let err = api_status(nodes.get("gpu-9").await.unwrap_err());
    assert!(err.is_not_found());
    assert_eq!(err.message, "nodes \"gpu-9\" not found");
}

#[tokio::test]
async fn pods_by_node_field_selector_and_labels() {
    let double = KubeDouble::start();
    for (ns, name, node, app) in [
        ("default", "a", "gpu-1", "web"),
        ("team-x", "b", "gpu-1", "train"),
        ("team-x", "c", "gpu-2", "train"),
        ("default", "d", "gpu-2", "web"),
    ] {
        double.put_pod(fixtures::running_pod(ns, name, node, &[("app", app)]));
    }
    let client = double.client();

    let all: Api<Pod> = Api::all(client.clone());
    let on_1 = all
        .list(&ListParams::default().fields("spec.nodeName=gpu-1"))
        .await
        .unwrap();
    let mut names: Vec<String> = on_1.items.iter().map(|p| p.name_any()).collect();
    names.sort();
    assert_eq!(names, ["a", "b"]);
    assert!(on_1.metadata.resource_version.is_some());

    let team: Api<Pod> = Api::namespaced(client.clone(), "team-x");
    let l = team
        .list(
            &ListParams::default()
                .fields("spec.nodeName=gpu-2")
                .labels("app=train"),
        )
        .await
        .unwrap();
    assert_eq!(
        l.items.iter().map(|p| p.name_any()).collect::<Vec<_>>(),
        ["c"]
    );

    let none = all
        .list(&ListParams::default().fields("spec.nodeName!=gpu-1,spec.nodeName!=gpu-2"))
        .await
        .unwrap();
    assert!(none.items.is_empty());

    let err = api_status(
        all.list(&ListParams::default().fields("spec.bogus=1"))
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 400);

    // Pagination: limit and continue walk a consistent snapshot.
    let page1 = all.list(&ListParams::default().limit(3)).await.unwrap();
    assert_eq!(page1.items.len(), 3);
    let token = page1.metadata.continue_.clone().expect("continue token");
    double.put_pod(fixtures::running_pod("default", "e", "gpu-3", &[]));
    let page2 = all
        .list(&ListParams::default().limit(3).continue_token(&token))
        .await
        .unwrap();
    assert_eq!(page2.items.len(), 1, "the snapshot predates pod e");
    assert!(page2.metadata.continue_.is_none());
    assert_eq!(
        page1.metadata.resource_version,
        page2.metadata.resource_version
    );

    // Get and delete.
    let pods: Api<Pod> = Api::namespaced(client, "default");
    assert_eq!(pods.get("a").await.unwrap().name_any(), "a");
    pods.delete("a", &DeleteParams::default()).await.unwrap();
    assert!(double.pod("default", "a").is_none());
    assert_eq!(double.pods_on("gpu-2").len(), 2);
}

#[tokio::test]
async fn eviction_blocked_by_pdb_then_allowed() {
    let double = KubeDouble::start();
    for name in ["w1", "w2", "w3"] {
        double.put_pod(fixtures::running_pod(
            "apps",
            name,
            "gpu-1",
            &[("app", "web")],
        ));
    }
    double.put_pod(fixtures::running_pod(
        "apps",
        "free",
        "gpu-1",
        &[("app", "other")],
    ));
    let pdb = double.put_pdb(fixtures::pdb_min_available(
        "apps",
        "web",
        &[("app", "web")],
        3,
    ));
    let st = pdb.status.unwrap();
    assert_eq!(
        (
            st.current_healthy,
            st.desired_healthy,
            st.disruptions_allowed,
            st.expected_pods
        ),
        (3, 3, 0, 3)
    );

    // kube's default retry layer would retry each 429 for minutes; see every answer instead.
    let client = double.client_no_retry();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "apps");

    // A pod no budget covers is evicted (201 Status Success).
    let ok = pods.evict("free", &EvictParams::default()).await.unwrap();
    assert!(ok.is_success());
    assert!(double.pod("apps", "free").is_none());

    // minAvailable 3 of 3 healthy: 429 with the apiserver's message and cause.
    let err = api_status(pods.evict("w1", &EvictParams::default()).await.unwrap_err());
    assert_eq!(err.code, 429);
    assert_eq!(err.reason, "TooManyRequests");
    assert_eq!(
        err.message,
        "Cannot evict pod as it would violate the pod's disruption budget."
    );
    let cause = &err.details.unwrap().causes[0];
    assert_eq!(cause.reason, "DisruptionBudget");
    assert_eq!(
        cause.message,
        "The disruption budget web needs 3 healthy pods and has 3 currently"
    );
    assert!(double.pod("apps", "w1").is_some());

    // The budget changes (through the REST API): one disruption allowed.
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), "apps");
    pdbs.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"minAvailable": 2}})),
    )
    .await
    .unwrap();
    assert_eq!(
        pdbs.get("web")
            .await
            .unwrap()
            .status
            .unwrap()
            .disruptions_allowed,
        1
    );

    // Slow shutdown: the evicted pod stays terminating until the "kubelet" finishes.
    double.set_pod_termination(PodTermination::Manual);
    pods.evict("w1", &EvictParams::default()).await.unwrap();
    let terminating = double.pod("apps", "w1").expect("still terminating");
    assert!(terminating.metadata.deletion_timestamp.is_some());
    assert!(terminating
        .status
        .unwrap()
        .conditions
        .unwrap()
        .iter()
        .any(|c| c.type_ == "DisruptionTarget" && c.status == "True"));
    // The terminating pod no longer counts as healthy: the next eviction is refused.
    let err = api_status(pods.evict("w2", &EvictParams::default()).await.unwrap_err());
    assert_eq!(err.code, 429);
    assert!(double.finish_pod_termination("apps", "w1"));
    assert!(double.pod("apps", "w1").is_none());

    // An unready pod with the default IfHealthyBudget policy is still protected when the
    // budget is not met ...
    double.set_pod_ready("apps", "w3", false);
    let err = api_status(pods.evict("w3", &EvictParams::default()).await.unwrap_err());
    assert_eq!(err.code, 429);
    // ... and evictable with AlwaysAllow.
    pdbs.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"unhealthyPodEvictionPolicy": "AlwaysAllow"}})),
    )
    .await
    .unwrap();
    double.set_pod_termination(PodTermination::Immediate);
    pods.evict("w3", &EvictParams::default()).await.unwrap();
    assert!(double.pod("apps", "w3").is_none());

    // Unknown pod: 404.
    let err = api_status(
        pods.evict("nope", &EvictParams::default())
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 404);

    let log: Vec<(String, u16)> = double
        .evictions()
        .iter()
        .map(|e| (e.pod.clone(), e.code))
        .collect();
    assert_eq!(
        log,
        [
            ("free".to_string(), 201),
            ("w1".into(), 429),
            ("w1".into(), 201),
            ("w2".into(), 429),
            ("w3".into(), 429),
            ("w3".into(), 201),
            ("nope".into(), 404),
        ]
    );
    assert!(matches!(
        &double.evictions()[1].outcome,
        EvictionOutcome::Blocked { pdb, .. } if pdb == "web"
    ));
}

#[tokio::test]
async fn two_pdbs_over_one_pod_is_a_500() {
    let double = KubeDouble::start();
    double.put_pod(fixtures::running_pod(
        "apps",
        "p",
        "gpu-1",
        &[("app", "web")],
    ));
    double.put_pdb(fixtures::pdb_max_unavailable(
        "apps",
        "a",
        &[("app", "web")],
        1,
    ));
    double.put_pdb(fixtures::pdb_max_unavailable("apps", "b", &[], 1));
    let pods: Api<Pod> = Api::namespaced(double.client_no_retry(), "apps");
    let err = api_status(pods.evict("p", &EvictParams::default()).await.unwrap_err());
    assert_eq!(err.code, 500);
    assert!(err.message.contains("more than one PodDisruptionBudget"));
}

#[tokio::test]
async fn stale_pdb_status_and_pinned_expected_pods() {
    let double = KubeDouble::start();
    for name in ["a", "b"] {
        double.put_pod(fixtures::running_pod(
            "apps",
            name,
            "gpu-1",
            &[("app", "web")],
        ));
    }
    double.put_pdb(fixtures::pdb_max_unavailable(
        "apps",
        "web",
        &[("app", "web")],
        1,
    ));
    let client = double.client_no_retry();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "apps");
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client, "apps");

    // The controller has not seen the new spec yet: 429 "still being processed".
    double.pause_disruption_controller(true);
    pdbs.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"maxUnavailable": 2}})),
    )
    .await
    .unwrap();
    let err = api_status(pods.evict("a", &EvictParams::default()).await.unwrap_err());
    assert_eq!(err.code, 429);
    assert!(err.details.unwrap().causes[0]
        .message
        .contains("is still being processed"));
    double.pause_disruption_controller(false);

    // The owning controller wants 4 replicas: 2 healthy of 4 expected, maxUnavailable 2 →
    // no disruption allowed.
    double.set_pdb_expected_pods("apps", "web", Some(4));
    let st = double.pdb("apps", "web").unwrap().status.unwrap();
    assert_eq!(
        (st.expected_pods, st.desired_healthy, st.disruptions_allowed),
        (4, 2, 0)
    );
    assert_eq!(
        api_status(pods.evict("a", &EvictParams::default()).await.unwrap_err()).code,
        429
    );
    double.set_pdb_expected_pods("apps", "web", None);
    pods.evict("a", &EvictParams::default()).await.unwrap();

    // A pod seeded as terminating stays until the kubelet part finishes it.
    let mut t = fixtures::running_pod("apps", "t", "gpu-1", &[]);
    t.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::now(),
    ));
    double.put_pod(t);
    assert!(double.pod("apps", "t").is_some());
    assert!(double.finish_pod_termination("apps", "t"));
    assert!(double.pod("apps", "t").is_none());
}

#[tokio::test]
async fn graceful_delete_keeps_pod_terminating_for_a_while() {
    let double = KubeDouble::start();
    double.set_pod_termination(PodTermination::After(Duration::from_millis(300)));
    double.put_pod(fixtures::running_pod("default", "slow", "gpu-1", &[]));
    let pods: Api<Pod> = Api::default_namespaced(double.client());
    let resp = pods.delete("slow", &DeleteParams::default()).await.unwrap();
    let pod = resp.left().expect("the terminating pod");
    assert!(pod.metadata.deletion_timestamp.is_some());
    assert_eq!(pod.metadata.deletion_grace_period_seconds, Some(30));
    assert!(pods.get("slow").await.is_ok());
    assert!(
        double
            .wait_until_async(WAIT, |d| d.pod("default", "slow").is_none())
            .await
    );
}

type WatcherItem = Result<watcher::Event<Node>, watcher::Error>;

/// Drives a kube-runtime watcher in its own task (as an agent would), so its watch stays open
/// while the test does other things, and hands the items over a channel.
fn spawn_watcher(
    api: Api<Node>,
    config: watcher::Config,
) -> tokio::sync::mpsc::UnboundedReceiver<WatcherItem> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut stream = watcher(api, config).boxed();
        while let Some(item) = stream.next().await {
            if tx.send(item).is_err() {
                break;
            }
        }
    });
    rx
}

async fn next_item(rx: &mut tokio::sync::mpsc::UnboundedReceiver<WatcherItem>) -> WatcherItem {
    within("a watcher event", rx.recv())
        .await
        .expect("watcher ended")
}

async fn next_event(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<WatcherItem>,
) -> watcher::Event<Node> {
    loop {
        if let Ok(e) = next_item(rx).await {
            return e;
        }
    }
}

fn profile(n: &Node) -> Option<String> {
    n.labels().get("gpu-share.dev/profile").cloned()
}

#[tokio::test]
async fn watcher_follows_label_changes_through_drops_and_410() {
    let double = KubeDouble::start();
    double.set_bookmark_interval(Duration::from_millis(100));
    double.put_node(fixtures::node("gpu-1", &[]));
    double.put_node(fixtures::node("gpu-2", &[]));
    let nodes: Api<Node> = Api::all(double.client());
    let mut stream = spawn_watcher(
        nodes,
        watcher::Config::default().fields("metadata.name=gpu-1"),
    );

    // Initial list.
    assert!(matches!(
        next_event(&mut stream).await,
        watcher::Event::Init
    ));
    match next_event(&mut stream).await {
        watcher::Event::InitApply(n) => assert_eq!(n.name_any(), "gpu-1"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        next_event(&mut stream).await,
        watcher::Event::InitDone
    ));
    assert!(
        double
            .wait_until_async(WAIT, |d| d.open_watches() == 1)
            .await
    );

    // A label change on the watched node arrives; one on another node does not.
    double.set_node_label("gpu-2", "gpu-share.dev/profile", Some("ignored"));
    double.set_node_label("gpu-1", "gpu-share.dev/profile", Some("small"));
    match next_event(&mut stream).await {
        watcher::Event::Apply(n) => {
            assert_eq!(n.name_any(), "gpu-1");
            assert_eq!(profile(&n).as_deref(), Some("small"));
        }
        other => panic!("{other:?}"),
    }

    // The watch connection drops; a change made meanwhile is replayed on the resumed watch
    // (no re-list).
    assert_eq!(double.drop_watches(), 1);
    double.set_node_label("gpu-1", "gpu-share.dev/profile", Some("medium"));
    match next_event(&mut stream).await {
        watcher::Event::Apply(n) => assert_eq!(profile(&n).as_deref(), Some("medium")),
        other => panic!("{other:?}"),
    }
    let lists = |d: &KubeDouble| {
        d.requests()
            .iter()
            .filter(|r| r.resource == "nodes" && r.verb == Verb::List)
            .count()
    };
    assert_eq!(lists(&double), 1);

    // History is compacted while the watch is down: the resume gets 410 and the watcher
    // re-lists, seeing the change it missed.
    assert!(
        double
            .wait_until_async(WAIT, |d| d.open_watches() == 1)
            .await
    );
    double.set_node_label("gpu-1", "gpu-share.dev/profile", Some("large"));
    // Let the live watch deliver "large", then cut it and compact.
    match next_event(&mut stream).await {
        watcher::Event::Apply(n) => assert_eq!(profile(&n).as_deref(), Some("large")),
        other => panic!("{other:?}"),
    }
    double.drop_watches();
    double.compact();
    double.set_node_label("gpu-1", "gpu-share.dev/profile", None);
    let mut saw_410 = false;
    let relisted = loop {
        match next_item(&mut stream).await {
            Err(watcher::Error::WatchError(s)) if s.code == 410 => saw_410 = true,
            Err(e) => panic!("unexpected watcher error {e:?}"),
            Ok(watcher::Event::InitApply(n)) => break n,
            Ok(_) => {}
        }
    };
    assert!(saw_410, "the resumed watch must fail with 410 Expired");
    assert_eq!(profile(&relisted), None);
    assert_eq!(lists(&double), 2);
    assert!(matches!(
        next_event(&mut stream).await,
        watcher::Event::InitDone
    ));
}

#[tokio::test]
async fn raw_watch_bookmarks_timeout_and_expired() {
    let double = KubeDouble::start();
    double.set_bookmark_interval(Duration::from_millis(100));
    double.put_configmap(fixtures::configmap(
        "gpu-share",
        "profiles",
        &[("small", "v1")],
    ));
    double.put_configmap(fixtures::configmap("gpu-share", "other", &[]));
    let cms: Api<ConfigMap> = Api::namespaced(double.client(), "gpu-share");

    let list = cms
        .list(&ListParams::default().fields("metadata.name=profiles"))
        .await
        .unwrap();
    assert_eq!(list.items.len(), 1);
    let rv = list.metadata.resource_version.unwrap();

    let wp = WatchParams::default()
        .fields("metadata.name=profiles")
        .timeout(2);
    let mut events = cms.watch(&wp, &rv).await.unwrap().boxed();
    double.update_configmap_key("gpu-share", "profiles", "small", Some("v2"));
    double.update_configmap_key("gpu-share", "other", "x", Some("y"));
    let mut saw_modified = false;
    let mut saw_bookmark = false;
    let start = std::time::Instant::now();
    while let Some(ev) = within("the watch to time out", events.next()).await {
        match ev.unwrap() {
            WatchEvent::Modified(cm) => {
                assert_eq!(cm.name_any(), "profiles");
                assert_eq!(cm.data.unwrap()["small"], "v2");
                saw_modified = true;
            }
            WatchEvent::Bookmark(b) => {
                assert!(b.metadata.resource_version.parse::<u64>().unwrap() > rv.parse().unwrap());
                saw_bookmark = true;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(saw_modified && saw_bookmark);
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(1500) && took < Duration::from_secs(5),
        "timeoutSeconds=2 honoured, took {took:?}"
    );

    // A watch from a compacted version: one ERROR event with a 410 Status.
    double.compact();
    let mut events = cms
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    match within("the 410", events.next()).await {
        Some(Ok(WatchEvent::Error(s))) => {
            assert_eq!(s.code, 410);
            assert_eq!(s.reason, "Expired");
        }
        other => panic!("expected a 410 ERROR event, got {other:?}"),
    }
    assert!(within("the stream end", events.next()).await.is_none());
}

#[tokio::test]
async fn streaming_list_watcher() {
    let double = KubeDouble::start();
    double.put_node(fixtures::node(
        "gpu-1",
        &[("gpu-share.dev/profile", "small")],
    ));
    let nodes: Api<Node> = Api::all(double.client());
    let mut stream = spawn_watcher(nodes, watcher::Config::default().streaming_lists());
    assert!(matches!(
        next_event(&mut stream).await,
        watcher::Event::Init
    ));
    assert!(matches!(
        next_event(&mut stream).await,
        watcher::Event::InitApply(_)
    ));
    assert!(matches!(
        next_event(&mut stream).await,
        watcher::Event::InitDone
    ));
    double.set_node_label("gpu-1", "gpu-share.dev/profile", Some("large"));
    match next_event(&mut stream).await {
        watcher::Event::Apply(n) => assert_eq!(profile(&n).as_deref(), Some("large")),
        other => panic!("{other:?}"),
    }
    // No list request: the initial state came from the watch (sendInitialEvents).
    assert!(!double.requests().iter().any(|r| r.verb == Verb::List));
}

#[tokio::test]
async fn recorder_publishes_events_and_series() {
    let double = KubeDouble::start();
    let node = double.put_node(fixtures::node("gpu-1", &[]));
    let recorder = Recorder::new(
        double.client(),
        Reporter {
            controller: "gpu-share-agent".into(),
            instance: Some("gpu-1".into()),
        },
    );
    let ev = Event {
        type_: EventType::Normal,
        reason: "ProfileApplied".into(),
        note: Some("applied profile small".into()),
        action: "Reconcile".into(),
        secondary: None,
    };
    let reference = node.object_ref(&());
    recorder.publish(&ev, &reference).await.unwrap();
    let events = double.events();
    assert_eq!(events.len(), 1);
    let e = &events[0];
    assert_eq!(e.reason.as_deref(), Some("ProfileApplied"));
    assert_eq!(e.note.as_deref(), Some("applied profile small"));
    assert_eq!(e.reporting_controller.as_deref(), Some("gpu-share-agent"));
    assert_eq!(e.metadata.namespace.as_deref(), Some("default"));
    let regarding = e.regarding.as_ref().unwrap();
    assert_eq!(regarding.kind.as_deref(), Some("Node"));
    assert_eq!(regarding.name.as_deref(), Some("gpu-1"));

    // The same event again becomes a series (a merge PATCH of the first one).
    recorder.publish(&ev, &reference).await.unwrap();
    let events = double.events();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].series.as_ref().unwrap().count, 2);
    assert!(double
        .requests()
        .iter()
        .any(|r| r.verb == Verb::Patch && r.group == "events.k8s.io"));

    // The apiserver's validation applies: a note over 1 kB is refused (422).
    let long = Event {
        note: Some("x".repeat(1025)),
        reason: "Failed".into(),
        ..ev
    };
    let err = api_status(recorder.publish(&long, &reference).await.unwrap_err());
    assert_eq!(err.code, 422);
    assert!(err.message.contains("note"), "{}", err.message);

    // Events can be listed back through the API by what they regard.
    let api: Api<K8sEvent> = Api::namespaced(double.client(), "default");
    let listed = api
        .list(&ListParams::default().fields("regarding.name=gpu-1,reason=ProfileApplied"))
        .await
        .unwrap();
    assert_eq!(listed.items.len(), 1);
}

#[tokio::test]
async fn lease_create_update_conflicts() {
    let double = KubeDouble::start();
    let leases: Api<Lease> = Api::namespaced(double.client(), "gpu-share");
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some("drain-slot-0".into()),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some("gpu-1".into()),
            lease_duration_seconds: Some(30),
            ..Default::default()
        }),
    };
    let created = leases.create(&PostParams::default(), &lease).await.unwrap();
    assert_eq!(created.namespace().as_deref(), Some("gpu-share"));

    let err = api_status(
        leases
            .create(&PostParams::default(), &lease)
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 409);
    assert!(err.is_already_exists());
    assert_eq!(
        err.message,
        "leases.coordination.k8s.io \"drain-slot-0\" already exists"
    );

    // Two holders race from the same read: the first update wins, the second conflicts.
    let mut a = leases.get("drain-slot-0").await.unwrap();
    let mut b = a.clone();
    a.spec.as_mut().unwrap().holder_identity = Some("gpu-2".into());
    b.spec.as_mut().unwrap().holder_identity = Some("gpu-3".into());
    leases
        .replace("drain-slot-0", &PostParams::default(), &a)
        .await
        .unwrap();
    let err = api_status(
        leases
            .replace("drain-slot-0", &PostParams::default(), &b)
            .await
            .unwrap_err(),
    );
    assert!(err.is_conflict());
    assert_eq!(
        double
            .lease("gpu-share", "drain-slot-0")
            .unwrap()
            .spec
            .unwrap()
            .holder_identity
            .as_deref(),
        Some("gpu-2")
    );

    // Leases need a resourceVersion on update.
    let mut unconditional = leases.get("drain-slot-0").await.unwrap();
    unconditional.metadata.resource_version = None;
    let err = api_status(
        leases
            .replace("drain-slot-0", &PostParams::default(), &unconditional)
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 409);

    assert_eq!(
        leases
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        1
    );
    leases
        .delete("drain-slot-0", &DeleteParams::default())
        .await
        .unwrap();
    assert!(double.leases().is_empty());
    assert!(api_status(leases.get("drain-slot-0").await.unwrap_err()).is_not_found());
}

#[tokio::test]
async fn injected_faults() {
    let double = KubeDouble::start();
    double.put_node(fixtures::node("gpu-1", &[]));

    // kube's default client retries 503s by itself: two injected ones are absorbed.
    double.fail_next(Verb::Get, "nodes", 2, Fault::Status(503));
    let retrying: Api<Node> = Api::all(double.client());
    retrying.get("gpu-1").await.unwrap();
    let gets = double
        .requests()
        .iter()
        .filter(|r| r.verb == Verb::Get && r.resource == "nodes")
        .map(|r| r.code)
        .collect::<Vec<_>>();
    assert_eq!(gets, [Some(503), Some(503), Some(200)]);

    // Without it, each failure surfaces.
    let nodes: Api<Node> = Api::all(double.client_no_retry());
    double.fail_next(Verb::Get, "nodes", 1, Fault::Status(503));
    double.fail_next(Verb::Patch, "*", 1, Fault::Status(500));
    let err = api_status(nodes.get("gpu-1").await.unwrap_err());
    assert_eq!((err.code, err.reason.as_str()), (503, "ServiceUnavailable"));
    nodes.get("gpu-1").await.unwrap();
    let err = api_status(
        nodes
            .patch("gpu-1", &PatchParams::default(), &Patch::Merge(json!({})))
            .await
            .unwrap_err(),
    );
    assert_eq!((err.code, err.reason.as_str()), (500, "InternalError"));

    // An injected 429 on an eviction is logged as injected, not as a budget refusal.
    double.put_pod(fixtures::running_pod("default", "p", "gpu-1", &[]));
    double.fail_next(Verb::Create, "pods/eviction", 1, Fault::Status(429));
    let pods: Api<Pod> = Api::default_namespaced(double.client_no_retry());
    let err = api_status(pods.evict("p", &EvictParams::default()).await.unwrap_err());
    assert_eq!(err.code, 429);
    assert_eq!(double.evictions()[0].outcome, EvictionOutcome::Injected);

    // A hung request stays unanswered; a delayed one answers late.
    double.fail_next(Verb::List, "nodes", 1, Fault::Hang);
    let hung = tokio::time::timeout(
        Duration::from_millis(300),
        nodes.list(&ListParams::default()),
    )
    .await;
    assert!(hung.is_err(), "the request should hang");
    double.fail_next(
        Verb::List,
        "nodes",
        1,
        Fault::Delay(Duration::from_millis(200)),
    );
    let start = std::time::Instant::now();
    nodes.list(&ListParams::default()).await.unwrap();
    assert!(start.elapsed() >= Duration::from_millis(200));

    let injected = double.requests().iter().filter(|r| r.injected).count();
    assert_eq!(injected, 7);
}

#[test]
fn usable_from_sync_code() {
    let double = KubeDouble::start();
    double.put_node(fixtures::node("n", &[]));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let labels = rt.block_on(async {
        let nodes: Api<Node> = Api::all(double.client());
        nodes
            .patch(
                "n",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"k": "v"}}})),
            )
            .await
            .unwrap()
            .labels()
            .clone()
    });
    assert_eq!(labels["k"], "v");
    assert_eq!(double.node("n").unwrap().labels()["k"], "v");
    assert!(double.kubeconfig_yaml().contains(&double.url()));
    let url = double.url();
    drop(double);
    // The server is gone once dropped.
    assert!(std::net::TcpStream::connect(url.trim_start_matches("http://")).is_err());
}

#[tokio::test]
async fn kubeconfig_round_trip() {
    let double = KubeDouble::start();
    double.put_node(fixtures::node("n", &[]));
    let kc = kube::config::Kubeconfig::from_yaml(&double.kubeconfig_yaml()).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    let client = kube::Client::try_from(config).unwrap();
    let nodes: Api<Node> = Api::all(client);
    assert_eq!(
        nodes
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        1
    );
    let version = within("version", nodes.into_client().apiserver_version())
        .await
        .unwrap();
    assert_eq!(version.major, "1");
}

#[tokio::test]
async fn watch_event_kinds_follow_selectors() {
    // An object that stops matching a label selector is DELETED for that watch; one that starts
    // matching is ADDED.
    let double = KubeDouble::start();
    double.put_pod(fixtures::running_pod(
        "default",
        "p",
        "gpu-1",
        &[("tier", "gpu")],
    ));
    let pods: Api<Pod> = Api::default_namespaced(double.client());
    let rv = pods
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut w = pods
        .watch(&WatchParams::default().labels("tier=gpu"), &rv)
        .await
        .unwrap()
        .boxed();
    double.modify::<Pod>(Some("default"), "p", |p| {
        p.labels_mut().insert("tier".into(), "cpu".into());
    });
    double.modify::<Pod>(Some("default"), "p", |p| {
        p.labels_mut().insert("tier".into(), "gpu".into());
    });
    let first = within("deleted", w.try_next()).await.unwrap().unwrap();
    assert!(matches!(first, WatchEvent::Deleted(_)), "{first:?}");
    let second = within("added", w.try_next()).await.unwrap().unwrap();
    assert!(matches!(second, WatchEvent::Added(_)), "{second:?}");
}

/// resource.k8s.io/v1 for DRA, as a driver and the scheduler use it (the apiserver's
/// resourceslice and deviceclass registry strategies, cited in src/kinds.rs): discovery lists
/// both kinds, cluster-scoped; slices are selected by `spec.nodeName` and `spec.driver`, the
/// only fields the strategy adds; `metadata.generation` starts at 1 and follows spec changes;
/// a PUT to a missing slice is 404 (no create on update).
#[tokio::test]
async fn dra_resource_slices_and_device_classes() {
    use kube::api::{DynamicObject, GroupVersionKind};
    use kube::discovery::pinned_kind;

    let double = KubeDouble::start();
    let client = double.client();
    let gvk = GroupVersionKind::gvk("resource.k8s.io", "v1", "ResourceSlice");
    let (resource, caps) = pinned_kind(&client, &gvk).await.unwrap();
    assert_eq!(resource.plural, "resourceslices");
    assert_eq!(caps.scope, kube::discovery::Scope::Cluster);
    let classes = GroupVersionKind::gvk("resource.k8s.io", "v1", "DeviceClass");
    let (class_resource, _) = pinned_kind(&client, &classes).await.unwrap();
    assert_eq!(class_resource.plural, "deviceclasses");

    let slices: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    let slice = |name: &str, node: &str, driver: &str| -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": name},
            "spec": {"driver": driver, "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": "gpu-0"}]},
        }))
        .unwrap()
    };
    let pp = PostParams::default();
    for (name, node, driver) in [
        ("a", "gpu-1", "gpu.gpu-share.dev"),
        ("b", "gpu-1", "gpu.nvidia.com"),
        ("c", "gpu-2", "gpu.gpu-share.dev"),
    ] {
        let created = slices
            .create(&pp, &slice(name, node, driver))
            .await
            .unwrap();
        assert_eq!(created.metadata.generation, Some(1));
    }
    let ours = slices
        .list(&ListParams::default().fields("spec.nodeName=gpu-1,spec.driver=gpu.gpu-share.dev"))
        .await
        .unwrap();
    assert_eq!(
        ours.items.iter().map(|s| s.name_any()).collect::<Vec<_>>(),
        ["a"]
    );
    let err = api_status(
        slices
            .list(&ListParams::default().fields("spec.pool.name=gpu-1"))
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 400);

    let mut a = slices.get("a").await.unwrap();
    a.data["spec"]["devices"] = json!([{"name": "gpu-0"}, {"name": "gpu-1"}]);
    let replaced = slices.replace("a", &pp, &a).await.unwrap();
    assert_eq!(replaced.metadata.generation, Some(2), "a spec change");
    let err = api_status(
        slices
            .replace("z", &pp, &slice("z", "gpu-1", "gpu.gpu-share.dev"))
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 404);
    slices.delete("a", &DeleteParams::default()).await.unwrap();
    assert_eq!(double.resource_slices().len(), 2);
}

/// The ResourceSlice API of `double`, through the kube client's dynamic API.
async fn resource_slice_api(double: &KubeDouble) -> Api<kube::api::DynamicObject> {
    use kube::api::GroupVersionKind;
    let client = double.client();
    let gvk = GroupVersionKind::gvk("resource.k8s.io", "v1", "ResourceSlice");
    let (resource, _) = kube::discovery::pinned_kind(&client, &gvk).await.unwrap();
    Api::all_with(client, &resource)
}

/// ResourceSlice `name` of node gpu-1's pool, with the fields of `spec` added.
fn resource_slice(name: &str, spec: serde_json::Value) -> kube::api::DynamicObject {
    let mut full = json!({"driver": "gpu.gpu-share.dev", "nodeName": "gpu-1",
        "pool": {"name": "gpu-1", "generation": 1, "resourceSliceCount": 1}});
    full.as_object_mut()
        .unwrap()
        .extend(spec.as_object().unwrap().clone());
    serde_json::from_value(json!({"apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice", "metadata": {"name": name}, "spec": full}))
    .unwrap()
}

/// The apiserver's ResourceSlice refusals the double copies (src/validation.rs, the limits
/// of the resource.k8s.io/v1 types as Kubernetes 1.36 documents them), one case per rule: each
/// object is refused with 422 and the apiserver's field and detail; each limit itself passes.
#[tokio::test]
async fn dra_resource_slices_the_apiserver_refuses_are_refused() {
    let double = KubeDouble::start();
    let slices = resource_slice_api(&double).await;
    let slice = resource_slice;
    let devices = |n: usize, consumes: bool| -> serde_json::Value {
        (0..n)
            .map(|i| {
                let mut d = json!({"name": format!("d-{i}")});
                if consumes {
                    d["consumesCounters"] =
                        json!([{"counterSet": "gpu-0", "counters": {"c": {"value": "1"}}}]);
                }
                d
            })
            .collect()
    };
    let set = |name: &str, counters: usize| -> serde_json::Value {
        let counters: serde_json::Map<String, serde_json::Value> = (0..counters)
            .map(|i| (format!("c-{i}"), json!({"value": "1"})))
            .collect();
        json!({"name": name, "counters": counters})
    };
    let pp = PostParams::default();
    let refused = [
        (
            "both",
            json!({"devices": devices(1, false), "sharedCounters": [set("gpu-0", 2)]}),
            "ResourceSlice.resource.k8s.io \"both\" is invalid: spec: Invalid value: \"\": only \
             one of sharedCounters or devices is allowed",
        ),
        (
            // Go's check is `!= nil`: an empty `devices: []` beside counters is refused too
            // (a real 1.36.2 server refused gpu-share's counter slices for exactly this).
            "empty-devices",
            json!({"devices": [], "sharedCounters": [set("gpu-0", 2)]}),
            "only one of sharedCounters or devices is allowed",
        ),
        (
            "too-many",
            json!({"devices": devices(129, false)}),
            "spec.devices: Too many: 129: must have at most 128 items",
        ),
        (
            "too-many-consuming",
            json!({"devices": devices(65, true)}),
            "spec.devices: Too many: 65: must have at most 64 items",
        ),
        (
            "too-many-sets",
            json!({"sharedCounters": (0..9).map(|i| set(&format!("gpu-{i}"), 1)).collect::<Vec<_>>()}),
            "spec.sharedCounters: Too many: 9: must have at most 8 items",
        ),
        (
            "too-many-counters",
            json!({"sharedCounters": [set("gpu-0", 33)]}),
            "spec.sharedCounters[0].counters: Too many: 33: must have at most 32 items",
        ),
        (
            "too-many-consumptions",
            json!({"devices": [{"name": "d", "consumesCounters": [
                {"counterSet": "a", "counters": {}}, {"counterSet": "b", "counters": {}},
                {"counterSet": "c", "counters": {}}]}]}),
            "spec.devices[0].consumesCounters: Too many: 3: must have at most 2 items",
        ),
        (
            "same-set-twice",
            json!({"devices": [{"name": "d", "consumesCounters": [
                {"counterSet": "a", "counters": {}}, {"counterSet": "a", "counters": {}}]}]}),
            "spec.devices[0].consumesCounters[1].counterSet: Duplicate value: \"a\"",
        ),
        (
            "too-many-attributes",
            json!({"devices": [{"name": "d",
                "attributes": (0..20).map(|i| (format!("a{i}"), json!({"int": i}))).collect::<serde_json::Map<_, _>>(),
                "capacity": (0..13).map(|i| (format!("c{i}"), json!({"value": "1"}))).collect::<serde_json::Map<_, _>>()}]}),
            "spec.devices[0]: Too many: 33: must have at most 32 items",
        ),
    ];
    for (name, spec, message) in refused {
        let err = api_status(slices.create(&pp, &slice(name, spec)).await.unwrap_err());
        assert_eq!(err.code, 422, "{name}");
        assert!(err.message.contains(message), "{name}: {}", err.message);
    }
    for (name, spec) in [
        ("limit", json!({"devices": devices(128, false)})),
        ("limit-consuming", json!({"devices": devices(64, true)})),
        (
            "limit-sets",
            json!({"sharedCounters": (0..8).map(|i| set(&format!("gpu-{i}"), 32)).collect::<Vec<_>>()}),
        ),
    ] {
        slices.create(&pp, &slice(name, spec)).await.unwrap();
    }
}

/// Device taints the API server refuses (`validateDeviceTaint` in
/// pkg/apis/resource/validation/validation.go, 1.36), one case per rule, each message as the
/// real 1.36.2 server of ../shared/testbed answered the same slice (`kubectl create
/// --dry-run=server`); a taint without `timeAdded` is stored with the write's time.
#[tokio::test]
async fn dra_device_taints_the_apiserver_refuses_are_refused() {
    let double = KubeDouble::start();
    let slices = resource_slice_api(&double).await;
    let tainted = |taints: serde_json::Value| json!({"devices": [{"name": "d", "taints": taints}]});
    let pp = PostParams::default();
    let refused = [
        (
            "no-key",
            json!([{"effect": "NoSchedule"}]),
            "spec.devices[0].taints[0].key: Invalid value: \"\": name part must be non-empty",
        ),
        (
            "bad-key",
            json!([{"key": "a b", "effect": "NoSchedule"}]),
            "spec.devices[0].taints[0].key: Invalid value: \"a b\": name part must consist of \
             alphanumeric characters",
        ),
        (
            "bad-value",
            json!([{"key": "gpu.gpu-share.dev/xid", "value": "a b", "effect": "NoSchedule"}]),
            "spec.devices[0].taints[0].value: Invalid value: \"a b\": a valid label must be an \
             empty string",
        ),
        (
            "no-effect",
            json!([{"key": "gpu.gpu-share.dev/xid"}]),
            "spec.devices[0].taints[0].effect: Required value",
        ),
        (
            "node-effect",
            json!([{"key": "gpu.gpu-share.dev/xid", "effect": "PreferNoSchedule"}]),
            "spec.devices[0].taints[0].effect: Unsupported value: \"PreferNoSchedule\": \
             supported values: \"NoExecute\", \"NoSchedule\", \"None\"",
        ),
        (
            "too-many",
            (0..17)
                .map(|i| json!({"key": format!("k{i}"), "effect": "NoSchedule"}))
                .collect(),
            "spec.devices[0].taints: Too many: 17: must have at most 16 items",
        ),
    ];
    for (name, taints, message) in refused {
        let err = api_status(
            slices
                .create(&pp, &resource_slice(name, tainted(taints)))
                .await
                .unwrap_err(),
        );
        assert_eq!(err.code, 422, "{name}");
        assert!(err.message.contains(message), "{name}: {}", err.message);
    }
    let limit: serde_json::Value = (0..16)
        .map(|i| json!({"key": format!("k{i}"), "effect": "None"}))
        .collect();
    slices
        .create(&pp, &resource_slice("limit", tainted(limit)))
        .await
        .unwrap();
    let xid = json!([{"key": "gpu.gpu-share.dev/xid", "value": "79", "effect": "NoSchedule"}]);
    let stored = slices
        .create(&pp, &resource_slice("defaulted", tainted(xid)))
        .await
        .unwrap();
    let added = stored.data["spec"]["devices"][0]["taints"][0]["timeAdded"]
        .as_str()
        .expect("timeAdded defaulted");
    assert!(
        added.ends_with('Z') && !added.contains('.'),
        "to the second: {added}"
    );
}

/// Consumable capacity the API server refuses (`validateMultiAllocatableDeviceCapacity`,
/// `validateSingleAllocatableDeviceCapacity`, `validateRequestPolicy` and its helpers in
/// pkg/apis/resource/validation/validation.go, Kubernetes 1.36, as vendored by
/// openshift/microshift), one case per rule, each message the server's field error (the
/// `single`, `default-off-step`, `values-unsorted` and `min-over-capacity` messages are the ones
/// the real 1.36.2 server of ../shared/testbed returned, `kubectl create --dry-run=server`); the
/// policy gpu-share publishes (`dra::consumable`) is accepted, as the real server accepted it.
#[tokio::test]
async fn dra_consumable_capacity_the_apiserver_refuses_is_refused() {
    let double = KubeDouble::start();
    let slices = resource_slice_api(&double).await;
    let pp = PostParams::default();
    let device = |multiple: bool, policy: serde_json::Value| {
        json!({"devices": [{"name": "gpu-0-mps", "allowMultipleAllocations": multiple,
            "capacity": {"memory": {"value": "80Gi", "requestPolicy": policy}}}]})
    };
    let range = |default: &str, min: &str, step: &str| json!({"default": default, "validRange": {"min": min, "step": step}});
    let at = "spec.devices[0].capacity[memory].requestPolicy";
    let refused = [
        (
            "single",
            device(false, range("4Gi", "1Gi", "1Gi")),
            format!("{at}: Forbidden: allowMultipleAllocations must be true"),
        ),
        (
            "both",
            device(true, json!({"default": "1Gi", "validValues": ["1Gi"], "validRange": {"min": "1Gi"}})),
            format!("{at}: Forbidden: exactly one policy can be specified"),
        ),
        (
            "values-no-default",
            device(true, json!({"validValues": ["1Gi"]})),
            format!("{at}.default: Required value: required when validValues is defined"),
        ),
        (
            "range-no-default",
            device(true, json!({"validRange": {"min": "1Gi"}})),
            format!("{at}.default: Required value: required when validRange is defined"),
        ),
        (
            "range-no-min",
            device(true, json!({"default": "1Gi", "validRange": {"step": "1Gi"}})),
            format!("{at}.validRange.min: Required value: required when validRange is defined"),
        ),
        (
            "min-over-capacity",
            device(true, range("90Gi", "90Gi", "1Gi")),
            format!("{at}.validRange.min: Invalid value: \"90Gi\": min is larger than capacity value: 80Gi"),
        ),
        (
            "default-under-min",
            device(true, range("1Gi", "2Gi", "1Gi")),
            format!("{at}.validRange.min: Invalid value: \"1Gi\": default is less than min: 2Gi"),
        ),
        (
            "step-over-capacity",
            device(true, range("1Gi", "1Gi", "80Gi")),
            format!("{at}.validRange.step: Invalid value: \"80Gi\": one step"),
        ),
        (
            "default-off-step",
            device(true, range("3Gi", "1Gi", "4Gi")),
            format!("{at}.validRange.step: Invalid value: \"3Gi\": value is not a multiple of a given step (4Gi) from (1Gi)"),
        ),
        (
            "values-unsorted",
            device(true, json!({"default": "1Gi", "validValues": ["2Gi", "1Gi"]})),
            format!("{at}.validValues[1]: Invalid value: \"1Gi\": values must be sorted in ascending order"),
        ),
        (
            "value-over-capacity",
            device(true, json!({"default": "1Gi", "validValues": ["1Gi", "90Gi"]})),
            format!("{at}.validValues[1]: Invalid value: \"90Gi\": option is larger than capacity value: 80Gi"),
        ),
        (
            "default-not-a-value",
            device(true, json!({"default": "3Gi", "validValues": ["1Gi", "2Gi"]})),
            format!("{at}.validValues: Invalid value: \"3Gi\": default value is not valid according to the requestPolicy"),
        ),
    ];
    for (name, spec, message) in refused {
        let err = api_status(
            slices
                .create(&pp, &resource_slice(name, spec))
                .await
                .unwrap_err(),
        );
        assert_eq!(err.code, 422, "{name}");
        assert!(err.message.contains(&message), "{name}: {}", err.message);
    }
    slices
        .create(
            &pp,
            &resource_slice("accepted", device(true, range("4Gi", "1Gi", "1Gi"))),
        )
        .await
        .unwrap();
}

/// With `DRAConsumableCapacity` off (before 1.36) the API server stores a slice without
/// `allowMultipleAllocations` and without any capacity's `requestPolicy`
/// (`dropDisabledDRAConsumableCapacityFields`, pkg/registry/resource/resourceslice/strategy.go,
/// 1.36) and accepts the write; a stored slice already using them keeps them.
#[tokio::test]
async fn dra_consumable_capacity_is_dropped_when_the_gate_is_off() {
    let double = KubeDouble::start();
    let slices = resource_slice_api(&double).await;
    let pp = PostParams::default();
    let shared = json!({"devices": [{"name": "gpu-0-mps", "allowMultipleAllocations": true,
        "capacity": {"memory": {"value": "80Gi",
            "requestPolicy": {"default": "4Gi", "validRange": {"min": "1Gi", "step": "1Gi"}}}}}]});
    let kept = slices
        .create(&pp, &resource_slice("on", shared.clone()))
        .await
        .unwrap();
    assert_eq!(
        kept.data["spec"]["devices"][0]["allowMultipleAllocations"],
        true
    );

    double.set_consumable_capacity(false);
    let stored = slices
        .create(&pp, &resource_slice("off", shared.clone()))
        .await
        .unwrap();
    let device = &stored.data["spec"]["devices"][0];
    assert_eq!(device.get("allowMultipleAllocations"), None, "dropped");
    assert_eq!(
        device["capacity"]["memory"].get("requestPolicy"),
        None,
        "dropped"
    );
    assert_eq!(
        device["capacity"]["memory"]["value"], "80Gi",
        "the capacity stays"
    );
    let mut again = resource_slice("on", shared);
    again.metadata.resource_version = kept.metadata.resource_version.clone();
    let replaced = slices.replace("on", &pp, &again).await.unwrap();
    assert_eq!(
        replaced.data["spec"]["devices"][0]["allowMultipleAllocations"], true,
        "in use: kept"
    );
}

/// With `DRADeviceTaints` off (before 1.36) the API server stores a slice without its devices'
/// taints (`dropDisabledDRADeviceTaintsFields`, pkg/registry/resource/resourceslice/strategy.go),
/// unless the stored slice already has a tainted device; the write succeeds.
#[tokio::test]
async fn dra_device_taints_are_dropped_when_the_gate_is_off() {
    let double = KubeDouble::start();
    let slices = resource_slice_api(&double).await;
    let pp = PostParams::default();
    let tainted = json!({"devices": [{"name": "d", "taints": [
        {"key": "gpu.gpu-share.dev/xid", "value": "79", "effect": "NoSchedule"}]}]});
    let kept = slices
        .create(&pp, &resource_slice("on", tainted.clone()))
        .await
        .unwrap();
    assert!(kept.data["spec"]["devices"][0].get("taints").is_some());

    double.set_device_taints(false);
    let stored = slices
        .create(&pp, &resource_slice("off", tainted.clone()))
        .await
        .unwrap();
    assert_eq!(stored.data["spec"]["devices"][0]["name"], "d");
    assert_eq!(
        stored.data["spec"]["devices"][0].get("taints"),
        None,
        "dropped"
    );
    let mut again = resource_slice("on", tainted);
    again.metadata.resource_version = kept.metadata.resource_version.clone();
    let replaced = slices.replace("on", &pp, &again).await.unwrap();
    assert!(
        replaced.data["spec"]["devices"][0].get("taints").is_some(),
        "in use: kept"
    );
}

/// With `DRAPartitionableDevices` off (the 1.34 and 1.35 default) the API server accepts a
/// slice with counters and stores it without them: `dropDisabledDRAPartitionableDevicesFields`
/// in pkg/registry/resource/resourceslice/strategy.go (Kubernetes 1.36) clears
/// `sharedCounters` and each device's `consumesCounters` before validation, unless the stored
/// slice already uses them. The write succeeds; only reading it back shows the loss.
#[tokio::test]
async fn dra_resource_slices_lose_counters_when_partitionable_devices_is_off() {
    let double = KubeDouble::start();
    let slices = resource_slice_api(&double).await;
    let slice = resource_slice;
    let counters = json!({"sharedCounters": [{"name": "gpu-0",
        "counters": {"memory-slice-0": {"value": "1"}}}]});
    let consuming = json!({"devices": [{"name": "gpu-0-mig-0-1g-10gb", "consumesCounters": [
        {"counterSet": "gpu-0", "counters": {"memory-slice-0": {"value": "1"}}}]}]});
    let pp = PostParams::default();
    let spec_of = |o: &kube::api::DynamicObject| o.data["spec"].clone();

    // Gate on (1.36's default): stored as written.
    let kept = slices
        .create(&pp, &slice("on", counters.clone()))
        .await
        .unwrap();
    assert!(spec_of(&kept).get("sharedCounters").is_some());

    double.set_partitionable_devices(false);
    let stored = slices
        .create(&pp, &slice("sets", counters.clone()))
        .await
        .unwrap();
    assert_eq!(
        spec_of(&stored).get("sharedCounters"),
        None,
        "counter sets dropped"
    );
    assert_eq!(
        spec_of(&stored).get("devices"),
        None,
        "stored empty, and accepted"
    );
    let stored = slices
        .create(&pp, &slice("devices", consuming))
        .await
        .unwrap();
    assert_eq!(
        spec_of(&stored)["devices"][0]["name"],
        "gpu-0-mig-0-1g-10gb"
    );
    assert_eq!(spec_of(&stored)["devices"][0].get("consumesCounters"), None);
    // Dropped before validation: devices and counters in one slice pass (as the 1.36.2 test
    // bed with the gate off accepted gpu-share's old layout).
    let both = json!({"devices": [{"name": "d"}], "sharedCounters": counters["sharedCounters"]});
    slices.create(&pp, &slice("both", both)).await.unwrap();
    // A slice written while the gate was on keeps its counters on update.
    let mut again = slice("on", counters);
    again.metadata.resource_version = kept.metadata.resource_version.clone();
    let replaced = slices.replace("on", &pp, &again).await.unwrap();
    assert!(
        spec_of(&replaced).get("sharedCounters").is_some(),
        "in use: kept"
    );
}
