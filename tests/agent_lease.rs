//! The fleet drain budget (src/agent/lease.rs) against the Kubernetes API double, through the
//! real kube client: slot Leases `gpu-share-drain-<i>` in the agent's namespace.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gpu_share::agent::lease::{slot_name, DrainSlots, LeaseError};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube_double::{Fault, KubeDouble, Verb};

const NS: &str = "gpu-share";
const LEASE: Duration = Duration::from_secs(1);

fn slots(double: &KubeDouble, holder: &str, n: u32) -> DrainSlots {
    DrainSlots::new(double.client(), NS, holder, n, LEASE)
}

/// [`slots`] whose client names `holder` as its User-Agent, so the double records this node's
/// reads under that name (the API server's `managerOrUserAgent`, kube-double/src/server.rs).
fn slots_seen_as(double: &KubeDouble, holder: &str, n: u32) -> DrainSlots {
    let mut config = double.client_config();
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_str(holder).expect("a node name is a header value"),
    ));
    let client = kube::Client::try_from(config).expect("kube client");
    DrainSlots::new(client, NS, holder, n, LEASE)
}

/// How many times `node` (a [`slots_seen_as`] client) has read a slot Lease.
fn lease_reads_by(double: &KubeDouble, node: &str) -> usize {
    double
        .requests()
        .into_iter()
        .filter(|r| r.resource == "leases" && r.verb == Verb::Get && r.field_manager == node)
        .count()
}

fn spec(double: &KubeDouble, slot: u32) -> LeaseSpec {
    double
        .lease(NS, &slot_name(slot))
        .unwrap_or_else(|| panic!("no lease {}", slot_name(slot)))
        .spec
        .expect("lease spec")
}

fn holder(double: &KubeDouble, slot: u32) -> Option<String> {
    spec(double, slot).holder_identity.filter(|h| !h.is_empty())
}

/// A slot Lease as another node would have left it.
fn put_slot(
    double: &KubeDouble,
    slot: u32,
    holder: Option<&str>,
    renewed_ago: Duration,
    secs: i32,
    transitions: i32,
) {
    let renewed = Timestamp::from_millisecond(
        Timestamp::now().as_millisecond() - renewed_ago.as_millis() as i64,
    )
    .unwrap();
    double.put_lease(Lease {
        metadata: ObjectMeta {
            name: Some(slot_name(slot)),
            namespace: Some(NS.into()),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: holder.map(str::to_string),
            acquire_time: Some(MicroTime(renewed)),
            renew_time: Some(MicroTime(renewed)),
            lease_duration_seconds: Some(secs),
            lease_transitions: Some(transitions),
            ..Default::default()
        }),
    });
}

/// `call`'s answer; a call that never returns (a timeout not honoured) fails the test after
/// 30 s. How long calls take is measured in benches, not asserted on a busy machine.
async fn returns<T>(call: impl std::future::Future<Output = T>) -> T {
    returns_within(Duration::from_secs(30), call).await
}

async fn returns_within<T>(limit: Duration, call: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(limit, call)
        .await
        .unwrap_or_else(|_| panic!("no answer within {limit:?}"))
}

fn lease_writes(double: &KubeDouble, verb: Verb) -> Vec<(u16, bool)> {
    double
        .requests()
        .into_iter()
        .filter(|r| r.resource == "leases" && r.verb == verb)
        .map(|r| (r.code.unwrap_or(0), r.injected))
        .collect()
}

#[tokio::test]
async fn one_slot_second_node_waits_until_the_first_releases() {
    let double = KubeDouble::start();
    let a = slots(&double, "node-a", 1);
    let b = slots_seen_as(&double, "node-b", 1);

    let slot_a = a.acquire(Duration::ZERO).await.unwrap();
    assert_eq!(slot_a.name(), "gpu-share-drain-0");
    assert_eq!(holder(&double, 0).as_deref(), Some("node-a"));
    assert_eq!(spec(&double, 0).lease_transitions, Some(0));
    assert_eq!(spec(&double, 0).lease_duration_seconds, Some(1));
    let renewal = slot_a.spawn_renewal();

    let waiter = tokio::spawn(async move { b.acquire(Duration::from_secs(30)).await });
    // Only the renewals keep node-b out once the first term has passed. Seen, not slept on:
    // node-a's renewals have carried the Lease past its first term, and node-b has then looked
    // twice (a look that found the slot free would have taken it, not looked again).
    let acquired = spec(&double, 0).acquire_time.unwrap().0;
    let carried = double
        .wait_until_async(Duration::from_secs(30), |d| {
            let renewed = d.lease(NS, &slot_name(0)).and_then(|l| l.spec?.renew_time);
            renewed.is_some_and(|r| {
                r.0.as_millisecond() - acquired.as_millisecond() > LEASE.as_millis() as i64
            })
        })
        .await;
    assert!(
        carried,
        "node-a's renewals never carried the Lease past its first term"
    );
    let looks_before = lease_reads_by(&double, "node-b");
    let looked = double
        .wait_until_async(Duration::from_secs(30), |d| {
            lease_reads_by(d, "node-b") >= looks_before + 2
        })
        .await;
    assert!(
        looked,
        "node-b never looked again while node-a held the slot"
    );
    assert!(!waiter.is_finished(), "node-b got a slot node-a holds");
    assert_eq!(
        a.held_by().await,
        vec![("gpu-share-drain-0".to_string(), "node-a".to_string())]
    );
    let renewed = spec(&double, 0).renew_time.unwrap().0;
    assert!(
        Timestamp::now().as_millisecond() - renewed.as_millisecond() < 1000,
        "renewTime not kept fresh"
    );

    slot_a.release().await;
    // Released, not left to lapse: the holder is cleared (or node-b has taken it already), so
    // node-b may take it at its next look (a free Lease is taken: src/lease.rs). How soon that
    // look comes is timing, not behaviour, and is not asserted here.
    let after_release = holder(&double, 0);
    assert!(
        after_release.is_none() || after_release.as_deref() == Some("node-b"),
        "{after_release:?}"
    );
    assert!(renewal.await.unwrap_err().is_cancelled());
    let slot_b = waiter.await.unwrap().unwrap();
    assert_eq!(slot_b.name(), "gpu-share-drain-0");
    let s = spec(&double, 0);
    assert_eq!(s.holder_identity.as_deref(), Some("node-b"));
    assert_eq!(s.lease_transitions, Some(1));
    // node-b took it after node-a's last renewal, not during node-a's hold.
    let b_acquired = s.acquire_time.unwrap().0;
    assert!(
        b_acquired >= renewed,
        "node-b acquired at {b_acquired}, node-a renewed at {renewed}"
    );
}

#[tokio::test]
async fn two_slots_let_two_nodes_drain_and_a_third_waits() {
    let double = KubeDouble::start();
    let a = slots(&double, "node-a", 2);
    let b = slots(&double, "node-b", 2);
    let c = slots(&double, "node-c", 2);

    let (sa, sb) = tokio::join!(a.acquire(Duration::ZERO), b.acquire(Duration::from_secs(2)));
    let (sa, sb) = (sa.unwrap(), sb.unwrap());
    assert_ne!(sa.name(), sb.name());
    let mut names = vec![sa.name().to_string(), sb.name().to_string()];
    names.sort();
    assert_eq!(names, ["gpu-share-drain-0", "gpu-share-drain-1"]);
    assert_eq!(double.leases().len(), 2);

    // Its own 300 ms timeout ends the wait (the guard only catches a wait that never ends).
    let err = returns(c.acquire(Duration::from_millis(300)))
        .await
        .unwrap_err();
    let LeaseError::Timeout { holders, .. } = &err else {
        panic!("want a timeout, got {err}");
    };
    let mut holders = holders.clone();
    holders.sort();
    let mut want = vec![
        (sa.name().to_string(), "node-a".to_string()),
        (sb.name().to_string(), "node-b".to_string()),
    ];
    want.sort();
    assert_eq!(holders, want);
    let msg = err.to_string();
    assert!(msg.starts_with("no drain slot became free within"), "{msg}");
    assert!(
        msg.contains("node-a (") && msg.contains("node-b ("),
        "{msg}"
    );

    let freed = sb.name().to_string();
    sb.release().await;
    let sc = c.acquire(Duration::from_secs(1)).await.unwrap();
    assert_eq!(sc.name(), freed);
}

#[tokio::test]
async fn an_expired_holder_is_taken_over_and_a_live_one_is_not() {
    let double = KubeDouble::start();
    put_slot(&double, 0, Some("node-dead"), Duration::from_secs(10), 1, 3);
    let a = slots(&double, "node-a", 1);
    let slot = a.acquire(Duration::ZERO).await.unwrap();
    assert_eq!(slot.name(), "gpu-share-drain-0");
    let s = spec(&double, 0);
    assert_eq!(s.holder_identity.as_deref(), Some("node-a"));
    assert_eq!(s.lease_transitions, Some(4));
    let acquired = s.acquire_time.unwrap().0.as_millisecond();
    assert!(Timestamp::now().as_millisecond() - acquired < 2000);

    // A holder within its (long) lease duration keeps the slot, however long ago it took it.
    put_slot(
        &double,
        0,
        Some("node-live"),
        Duration::from_secs(20),
        30,
        7,
    );
    let err = slots(&double, "node-b", 1)
        .acquire(Duration::from_millis(200))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, LeaseError::Timeout { holders, .. }
            if holders == &[("gpu-share-drain-0".to_string(), "node-live".to_string())]),
        "{err}"
    );
    assert_eq!(holder(&double, 0).as_deref(), Some("node-live"));
}

#[tokio::test]
async fn a_lapsed_slot_is_taken_and_the_old_holder_learns_it_lost() {
    let double = KubeDouble::start();
    let a = slots(&double, "node-a", 1);
    let b = slots(&double, "node-b", 1);
    let slot_a = a.acquire(Duration::ZERO).await.unwrap();
    // node-a stops renewing (hung); node-b waits out its 1 s lease.
    let started = Instant::now();
    let slot_b = b.acquire(Duration::from_secs(4)).await.unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(slot_b.name(), slot_a.name());
    assert_eq!(holder(&double, 0).as_deref(), Some("node-b"));

    let err = slot_a.renew().await.unwrap_err();
    assert!(
        matches!(&err, LeaseError::Lost { holder: Some(h), .. } if h == "node-b"),
        "{err}"
    );
    assert!(slot_a.is_lost());
    assert!(err.to_string().contains("now held by node-b"), "{err}");
    // Releasing a lost slot leaves the new holder alone.
    slot_a.try_release().await.unwrap();
    assert_eq!(holder(&double, 0).as_deref(), Some("node-b"));
    slot_b.renew().await.unwrap();
}

#[tokio::test]
async fn a_restarted_holder_gets_its_own_slot_back() {
    let double = KubeDouble::start();
    let b = slots(&double, "node-b", 3);
    let before = slots(&double, "node-a", 3);
    let slot_b = b.acquire(Duration::ZERO).await.unwrap();
    let slot_a = before.acquire(Duration::ZERO).await.unwrap();
    assert_eq!(
        (slot_b.name(), slot_a.name()),
        ("gpu-share-drain-0", "gpu-share-drain-1")
    );
    let first = spec(&double, 1);
    // The agent is killed mid-drain: nothing is released.
    drop(slot_a);
    drop(before);
    tokio::time::sleep(Duration::from_millis(20)).await;

    let after = slots(&double, "node-a", 3);
    let again = after.acquire(Duration::ZERO).await.unwrap();
    // Its own slot, not the free gpu-share-drain-2.
    assert_eq!(again.name(), "gpu-share-drain-1");
    assert!(double.lease(NS, "gpu-share-drain-2").is_none());
    let s = spec(&double, 1);
    assert_eq!(s.holder_identity.as_deref(), Some("node-a"));
    assert_eq!(s.lease_transitions, first.lease_transitions);
    assert_eq!(s.acquire_time, first.acquire_time);
    assert!(s.renew_time > first.renew_time);
    assert_eq!(holder(&double, 0).as_deref(), Some("node-b"));

    // At start-up with no drain pending, a leftover slot can be given back at once.
    drop(again);
    assert_eq!(slots(&double, "node-a", 3).release_own().await.unwrap(), 1);
    assert_eq!(holder(&double, 1), None);
    assert_eq!(holder(&double, 0).as_deref(), Some("node-b"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_acquirers_never_share_a_slot() {
    let double = KubeDouble::start();
    for n in [1u32, 2] {
        // Who holds which slot, by our own bookkeeping, checked against the apiserver's.
        let held: Arc<Mutex<HashMap<String, String>>> = Arc::default();
        let peak = Arc::new(Mutex::new(0usize));
        // Clients first (building one takes a while), then all acquirers start together.
        let start = Arc::new(tokio::sync::Barrier::new(5));
        let mut tasks = Vec::new();
        for i in 0..5 {
            let node = format!("node-{n}-{i}");
            let slots = DrainSlots::new(double.client(), NS, &node, n, LEASE);
            let (held, peak, start) = (Arc::clone(&held), Arc::clone(&peak), Arc::clone(&start));
            let client = double.client();
            tasks.push(tokio::spawn(async move {
                start.wait().await;
                let slot = slots.acquire(Duration::from_secs(8)).await.unwrap();
                {
                    let mut h = held.lock().unwrap();
                    if let Some(other) = h.insert(slot.name().to_string(), node.clone()) {
                        panic!("{} given to {node} while {other} holds it", slot.name());
                    }
                    let mut p = peak.lock().unwrap();
                    *p = (*p).max(h.len());
                }
                let api: kube::Api<Lease> = kube::Api::namespaced(client, NS);
                let lease = api.get(slot.name()).await.unwrap();
                assert_eq!(
                    lease.spec.unwrap().holder_identity.as_deref(),
                    Some(node.as_str())
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
                held.lock().unwrap().remove(slot.name());
                slot.try_release().await.unwrap();
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert!(*peak.lock().unwrap() <= n as usize);
        assert_eq!(double.leases().len(), n as usize);
    }
    // Simultaneous first acquirers raced to create the Leases; the losers saw 409.
    assert!(
        lease_writes(&double, Verb::Create)
            .iter()
            .any(|(code, _)| *code == 409),
        "no create race happened: {:?}",
        lease_writes(&double, Verb::Create)
    );
}

#[tokio::test]
async fn a_stale_update_conflicts_and_the_loser_does_not_get_the_slot() {
    let double = KubeDouble::start();
    put_slot(&double, 0, None, Duration::ZERO, 1, 2);
    // node-a's update is held back 400 ms, after it read the free Lease; node-b reads the
    // same version meanwhile and writes first.
    double.fail_next(
        Verb::Update,
        "leases",
        1,
        Fault::Delay(Duration::from_millis(400)),
    );
    let a = slots(&double, "node-a", 1);
    let b = slots(&double, "node-b", 1);
    let loser = tokio::spawn(async move { a.acquire(Duration::ZERO).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let winner = b.acquire(Duration::ZERO).await.unwrap();
    assert_eq!(winner.name(), "gpu-share-drain-0");
    let err = loser.await.unwrap().unwrap_err();
    assert!(matches!(err, LeaseError::Timeout { .. }), "{err}");

    assert_eq!(holder(&double, 0).as_deref(), Some("node-b"));
    assert_eq!(spec(&double, 0).lease_transitions, Some(3));
    let updates = lease_writes(&double, Verb::Update);
    assert!(updates.contains(&(409, true)), "{updates:?}");
    assert!(updates.contains(&(200, false)), "{updates:?}");
}

#[tokio::test]
async fn api_500s_are_retried_then_surfaced() {
    let double = KubeDouble::start();
    put_slot(&double, 0, None, Duration::ZERO, 1, 0);
    let a = slots(&double, "node-a", 1);

    // Two failed updates, then the apiserver recovers: the slot is taken.
    double.fail_next(Verb::Update, "leases", 2, Fault::Status(500));
    let slot = a.acquire(Duration::from_secs(5)).await.unwrap();
    assert_eq!(holder(&double, 0).as_deref(), Some("node-a"));
    let updates = lease_writes(&double, Verb::Update);
    assert_eq!(updates, [(500, true), (500, true), (200, false)]);
    slot.try_release().await.unwrap();

    // The apiserver keeps failing: the error names the Lease and the status.
    double.fail_next(Verb::Update, "leases", 1000, Fault::Status(500));
    let err = returns(a.acquire(Duration::from_millis(500)))
        .await
        .unwrap_err();
    let LeaseError::Api { lease, op, .. } = &err else {
        panic!("want an API error, got {err}");
    };
    assert_eq!((lease.as_str(), *op), ("gpu-share-drain-0", "update"));
    let msg = err.to_string();
    assert!(
        msg.starts_with("lease gpu-share/gpu-share-drain-0: update failed: 500"),
        "{msg}"
    );
    assert!(lease_writes(&double, Verb::Update).len() > 4);
    double.clear_faults();

    // 503s: kube's client retries them itself, for minutes; each call is cut short instead.
    double.remove::<Lease>(Some(NS), &slot_name(0));
    double.fail_next(Verb::Create, "leases", 1000, Fault::Status(503));
    let err = returns(a.acquire(Duration::from_millis(300)))
        .await
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.starts_with("lease gpu-share/gpu-share-drain-0: create failed:")
            && msg.contains("no answer within 1s"),
        "{msg}"
    );
    assert!(lease_writes(&double, Verb::Create)
        .iter()
        .all(|(code, _)| *code == 503));
    double.clear_faults();
    a.acquire(Duration::ZERO).await.unwrap();
}

#[tokio::test]
async fn a_non_retryable_error_is_returned_at_once() {
    let double = KubeDouble::start();
    double.fail_next(Verb::Get, "leases", 1, Fault::Status(403));
    // At once: long before its own 10 s timeout (the guard) would end the wait.
    let err = returns_within(
        Duration::from_secs(9),
        slots(&double, "node-a", 2).acquire(Duration::from_secs(10)),
    )
    .await
    .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("lease gpu-share/gpu-share-drain-0: get failed: 403"),
        "{err}"
    );
}

#[tokio::test]
async fn a_deleted_slot_is_lost_and_release_tolerates_it() {
    let double = KubeDouble::start();
    let a = slots(&double, "node-a", 1);
    let slot = a.acquire(Duration::ZERO).await.unwrap();
    double.remove::<Lease>(Some(NS), &slot_name(0));
    let err = slot.renew().await.unwrap_err();
    assert!(
        matches!(&err, LeaseError::Lost { holder: None, .. }),
        "{err}"
    );
    slot.try_release().await.unwrap();
    assert!(a.held_by().await.is_empty());
}
