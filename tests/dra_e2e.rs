//! DRA end to end through the agent ("prepare/unprepare round-trips", "claims on
//! kept devices stay prepared"): `gpu-share agent --plugin dra` as a process on the simulated
//! node (fake NVML, tests/node-sim), the simulated kubelet's DRA side (node-sim `DraKubelet`)
//! watching the agent's registration directory, and the Kubernetes API double serving
//! resource.k8s.io/v1 ResourceSlices and ResourceClaims. The test plays the scheduler: it
//! reads the slices the agent published and writes a claim's `status.allocation` naming one of
//! their devices, as kube-scheduler's DRA plugin does (`DeviceRequestAllocationResult`: request,
//! driver, pool, device); the kubelet then asks the driver to prepare the claim.

use std::collections::BTreeSet;
use std::time::Duration;

use gpu_share::dra::DRIVER;
use node_sim::*;

const NODE: &str = "dra-e2e";

/// 8 H100s (MIG on), the profiles ConfigMap (`h100-inference`, `h100-balanced`, `keep`), the
/// agent with `flags` beside its DRA ones.
async fn start_with(flags: &[&str]) -> DraNode {
    DraNode::start(
        NODE,
        h100s(8, true),
        &["h100-inference", "h100-balanced"],
        &[("keep", KEEP_GPU_0.to_string())],
        flags,
    )
    .await
}
const WAIT: Duration = Duration::from_secs(60);

/// h100-inference with GPUs 2-3 re-partitioned into two 3g.40gb each: a MIG change (withdrawal,
/// drain, apply) that keeps GPUs 0-1's 1g.10gb devices and GPUs 4-7's shares as they are.
const KEEP_GPU_0: &str = "version: v1
description: h100-inference with GPUs 2-3 as two 3g.40gb each
rules:
  - name: partitioned
    devices: [\"0-1\"]
    mig: {1g.10gb: 7}
  - name: medium
    devices: [\"2-3\"]
    mig: {3g.40gb: 2}
  - name: time-sliced
    devices: [\"4-7\"]
    timeSlicing: {replicas: 4}
";

/// The whole round trip: h100-inference applied and published; a claim on one of GPU 0's
/// 1g.10gb devices prepared with that MIG device's UUID; a re-partition of GPUs 2-3 that keeps
/// the device (the claim stays prepared, its spec untouched, a second Prepare answers the same,
/// the pool at a higher generation, a claim on a device the change created prepared with its
/// new UUID); then h100-balanced, which removes the device: while the drain is held by a
/// budget the device is out of the slices and a new claim for it is refused naming it; once
/// applied, Unprepare removes the first claim's spec.
#[test]
fn claims_round_trip_through_the_agent_and_kept_devices_stay_prepared() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let node = start_with(&[]).await;
        let inference = profile_text("h100-inference");
        node.apply("h100-inference", &inference);
        let first_generation = node.generation();

        // The device: one of GPU 0's 1g.10gb devices that h100-balanced will not keep (its
        // plan on the GPUs as they are now), so the last step can take it away.
        let balanced = profile_text("h100-balanced");
        let going: BTreeSet<String> = node
.device_names()
.difference(&node.planned_devices(&balanced))
.cloned()
.collect();
        let name = going
.iter()
.find(|d| d.starts_with("gpu-0-mig-") && d.ends_with("-1g-10gb"))
.unwrap_or_else(|| panic!("no 1g.10gb of GPU 0 goes away: {going:?}"))
.clone();
        let device = node.published(&name).unwrap();
        let start = attr_int(&device, "migPlacementStart");
        let uuid = node.mig_uuid(0, start);
        assert!(uuid.starts_with("MIG-"), "{uuid}");
        assert_eq!(attr_str(&device, "uuid"), uuid, "published with NVML's UUID");

        // Prepare: the CDI spec gives the container the MIG device the fake NVML created.
        let uid = node.allocate("inference", &name).await;
        let answer = node.prepare("inference", &uid).await;
        assert_eq!(answer.error, "", "{}", node.node.log());
        assert_eq!(answer.devices.len(), 1);
        assert_eq!(answer.devices[0].device_name, name);
        assert_eq!(answer.devices[0].pool_name, NODE);
        assert_eq!(
            answer.devices[0].cdi_device_ids,
            [format!("gpu.gpu-share.dev/claim={uid}-{name}")]
        );
        assert_eq!(
            node.spec_env(&uid),
            [format!("NVIDIA_VISIBLE_DEVICES={uuid}")]
        );
        let spec = std::fs::read(node.spec_file(&uid)).unwrap();

        // A MIG change that keeps the device: still published, still prepared, same answer.
        assert!(node.planned_devices(KEEP_GPU_0).contains(&name));
        node.apply("keep", KEEP_GPU_0);
        assert!(
            node.generation() > first_generation,
            "generation {first_generation} → {}",
            node.generation()
        );
        let kept = node.published(&name).expect("the kept device is published");
        assert_eq!(attr_str(&kept, "uuid"), uuid);
        assert_eq!(node.mig_uuid(0, start), uuid, "the MIG device was not remade");
        assert_eq!(std::fs::read(node.spec_file(&uid)).unwrap(), spec);
        assert!(node.checkpoint().prepared(&uid).is_some());
        assert_eq!(node.prepare("inference", &uid).await, answer);

        // A device the change created is prepared with the UUID it got just now (the plugin
        // had the applied devices before the slices named it).
        let medium = node
.device_names()
.into_iter()
.find(|d| d.starts_with("gpu-2-mig-") && d.ends_with("-3g-40gb"))
.expect("GPU 2's 3g.40gb devices are published");
        let medium_start = attr_int(&node.published(&medium).unwrap(), "migPlacementStart");
        let medium_uuid = node.mig_uuid(2, medium_start);
        let medium_uid = node.allocate("medium", &medium).await;
        let medium_answer = node.prepare("medium", &medium_uid).await;
        assert_eq!(medium_answer.error, "", "{}", node.node.log());
        assert_eq!(
            node.spec_env(&medium_uid),
            [format!("NVIDIA_VISIBLE_DEVICES={medium_uuid}")]
        );

        // h100-balanced removes the device. A pod on it, held by a budget, holds the drain.
        let gi = node.node.gi_at(0, start);
        node.node
.add_workloads(&node.api, &[Workload::on_mig("held", 7001, 0, gi)]);
        guard(&node.api, "held", "hold");
        let before = node.generation();
        node.api
.set_node_label(NODE, PROFILE_LABEL, Some("h100-balanced"));
        assert!(
            node.api
.wait_until(WAIT, |a| a.evictions().iter().any(|e| e.code == 429)),
            "{}",
            node.node.log()
        );
        assert!(
            node.published(&name).is_none(),
            "{name} withdrawn before the drain"
        );
        assert!(node.generation() > before);
        let late = node.allocate("late", &name).await;
        let refused = node.prepare("late", &late).await;
        assert_eq!(
            refused.error,
            format!(
                "ResourceClaim {CLAIM_NS}/late: device {name} (request \"gpu\") is not among the devices gpu-share publishes on node {NODE}"
            )
        );
        assert!(!node.spec_file(&late).exists());
        assert!(node.checkpoint().prepared(&late).is_none());

        node.api
.remove::<k8s_openapi::api::policy::v1::PodDisruptionBudget>(Some("default"), "hold");
        wait_applied(&node.api, &node.node, "h100-balanced", WAIT);
        assert!(node.published(&name).is_none());

        // Unprepare (the pod is gone): the spec and the checkpoint entry go.
        assert_eq!(node.unprepare("inference", &uid).await, "");
        assert!(!node.spec_file(&uid).exists(), "spec left");
        assert!(node.checkpoint().prepared(&uid).is_none());
        assert_eq!(node.unprepare("medium", &medium_uid).await, "");
        assert!(!node.spec_file(&medium_uid).exists());
        assert!(node.checkpoint().claims.is_empty());
    });
}

/// An agent killed and started again (an OOM kill, a crash): the prepared claim of a
/// time-sliced share keeps its spec and the kubelet's next Prepare answers the same, from the
/// checkpoint; the restarted agent rewrites no slice for the same profile (same generation),
/// and once it has reconciled, a new claim is prepared against the slices and devices it
/// announced to its plugin again (both start empty in a new process).
#[test]
fn a_restarted_agent_keeps_prepared_claims_and_prepares_new_ones() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut node = start_with(&[]).await;
        let inference = profile_text("h100-inference");
        node.apply("h100-inference", &inference);
        let generation = node.generation();
        let state = node.node.nvml();
        let gpu_uuid = |gpu: usize| state.gpus[gpu].uuid.clone();

        let share = "gpu-4-share-1";
        let device = node.published(share).expect("GPU 4's shares are published");
        assert_eq!(attr_str(&device, "sharing"), "timeSlicing");
        let uid = node.allocate("sliced", share).await;
        let answer = node.prepare("sliced", &uid).await;
        assert_eq!(answer.error, "", "{}", node.node.log());
        assert_eq!(
            node.spec_env(&uid),
            [format!("NVIDIA_VISIBLE_DEVICES={}", gpu_uuid(4))]
        );
        let spec = std::fs::read(node.spec_file(&uid)).unwrap();

        node.api.clear_requests();
        node.restart_agent();
        // The restarted agent reconciles the same profile: it lists the pool...
        let listed = node.api.wait_until(WAIT, |a| {
            a.requests()
                .iter()
                .any(|r| r.resource == "resourceslices" && r.verb == kube_double::Verb::List)
        });
        assert!(listed, "{}", node.node.log());
        assert_eq!(node.prepare("sliced", &uid).await, answer);
        assert_eq!(std::fs::read(node.spec_file(&uid)).unwrap(), spec);

        // ... and a new claim is prepared once the plugin has the slices again (the kubelet
        // retries a refused Prepare; a refusal leaves nothing behind).
        let other = "gpu-5-share-2";
        let new_uid = node.allocate("after-restart", other).await;
        let mut last = String::new();
        for _ in 0..100 {
            last = node.prepare("after-restart", &new_uid).await.error;
            if last.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(last, "", "{}", node.node.log());
        assert_eq!(
            node.spec_env(&new_uid),
            [format!("NVIDIA_VISIBLE_DEVICES={}", gpu_uuid(5))]
        );
        assert_eq!(
            node.api.writes_to("resourceslices"),
            0,
            "no slice rewritten"
        );
        assert_eq!(node.generation(), generation);
        assert_eq!(node.checkpoint().claims.len(), 2);
    });
}

/// A kubelet that restarts deletes the node's ResourceSlices and registers the plugin again;
/// the agent republishes on that registration, not at its next resync (300 s here: on a real
/// 1.36 node a pod waited 3 min 54 s for the slices).
#[test]
fn a_kubelet_restart_gets_the_slices_back_at_once() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let node = start_with(&["--resync-period", "300s"]).await;
        let inference = profile_text("h100-inference");
        node.apply("h100-inference", &inference);
        let published = node.device_names();
        assert!(!published.is_empty());

        // The kubelet restarts: it deletes this node's slices, then registers the plugin again.
        for slice in node.slices() {
            let name = slice["metadata"]["name"].as_str().unwrap().to_string();
            node.api.remove_resource_slice(&name);
        }
        assert!(node.slices().is_empty());
        node.kubelet.restart();
        assert!(node.kubelet.wait_registered(DRIVER, WAIT).await.is_some());
        let back = node.api.wait_until(Duration::from_secs(10), |_| {
            node.device_names() == published
        });
        assert!(back, "slices not republished\n{}", node.node.log());
    });
}
