//! Which device each pod on this node holds, published on the Node for `advise --live` and the
//! autopilot (docs/advise.md, "Live"): the API server does not say which GPU or MIG instance
//! the kubelet gave a pod, and without it advise matches a running pod to any free device of
//! its kind and predicts no eviction where the agent's drain then evicts.
//!
//! The annotation [`DEVICES_IN_USE_ANNOTATION`] holds compact JSON, pod (`namespace/name`) →
//! the devices it holds as advise's demand names them ([`HeldDevice`], the shape of
//! `crate::advise::HeldDevice`), e.g.
//! `{"serving/llm-0":[{"gpu":3,"migPlacementStart":4,"migProfile":"1g.10gb"}]}`. It is built
//! from the kubelet's PodResources `List` (device IDs as the device plugin advertised them: a
//! GPU UUID, `<uuid>::<n>` for a replica, or a MIG device UUID) and the GPUs as NVML reports
//! them (a MIG device UUID → its GPU instance → that instance's placement and profile).
//!
//! Size: the API server caps a Node's annotations at 256 KiB in all. A node has at most 8 GPUs
//! × 48 MPS clients ≈ 400 GPU pods, about 25 KB of this JSON; the text is cut at
//! [`MAX_ANNOTATION_BYTES`] (64 KiB, a quarter of the cap) all the same: the pods that do not
//! fit are left out and the key [`TRUNCATED_KEY`] says how many (a namespace holds no `.`, so
//! no pod's key can be it), with a warning, rather than a write the API server refuses.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};

use k8s_openapi::api::core::v1::Node;
use kube::api::Patch;
use kube::Api;
use serde::Serialize;
use serde_json::{json, Value};

use tracing::{debug, warn};

use super::reconcile::{Reconciler, KUBELET_TIMEOUT};
use crate::kubelet::pod_resources::api::ListPodResourcesResponse;
use crate::kubelet::pod_resources::list as list_pod_resources;
use crate::plan::ObservedNode;

pub use crate::published::DEVICES_IN_USE_ANNOTATION;
/// The key that, when present, says how many pods were left out of a cut annotation.
pub const TRUNCATED_KEY: &str = "gpu-share.dev/truncated";
/// The most bytes of JSON the annotation holds (a quarter of the API's 256 KiB annotation cap).
pub const MAX_ANNOTATION_BYTES: usize = 64 * 1024;

/// A device a pod holds, in the shape of advise's demand `devices` entries
/// (`crate::advise::HeldDevice`, which reads it back: the agent sits below advise, so it
/// writes its own type; `src/advise/live.rs` tests that the two agree).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HeldDevice {
    /// NVML index of the GPU.
    pub gpu: u32,
    /// For a MIG instance: its GPU instance's placement start.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mig_placement_start: Option<u32>,
    /// For a MIG instance: its profile, e.g. `1g.10gb`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mig_profile: Option<String>,
}

/// Pod (`namespace/name`) → the GPU devices it holds, in the order the kubelet lists them.
pub type DevicesInUse = BTreeMap<String, Vec<HeldDevice>>;

/// Each pod in `list` holding a device of `observed` (device IDs naming nothing on these GPUs,
/// such as another plugin's devices or a MIG device gone since, are left out; so are pods
/// left with none).
pub fn devices_in_use(list: &ListPodResourcesResponse, observed: &ObservedNode) -> DevicesInUse {
    let mut held = DevicesInUse::new();
    for pod in &list.pod_resources {
        let devices: Vec<HeldDevice> = pod
            .containers
            .iter()
            .flat_map(|c| &c.devices)
            .flat_map(|d| &d.device_ids)
            .filter_map(|id| device_of(id, observed))
            .collect();
        if !devices.is_empty() {
            held.insert(format!("{}/{}", pod.namespace, pod.name), devices);
        }
    }
    held
}

/// The device a plugin's device ID names: a GPU by UUID (a replica `<uuid>::<n>` names its
/// GPU), or a MIG device by UUID, placed through its GPU instance.
fn device_of(id: &str, observed: &ObservedNode) -> Option<HeldDevice> {
    let uuid = crate::kubelet::pod_resources::device_uuid(id);
    for gpu in &observed.gpus {
        if gpu.uuid.as_deref() == Some(uuid) {
            return Some(HeldDevice {
                gpu: gpu.index,
                mig_placement_start: None,
                mig_profile: None,
            });
        }
        let Some(ci) = gpu
            .compute_instances
            .iter()
            .find(|ci| ci.uuid.as_deref() == Some(uuid))
        else {
            continue;
        };
        let instance = gpu.instances.iter().find(|i| i.gi_id == Some(ci.gi_id))?;
        return Some(HeldDevice {
            gpu: gpu.index,
            mig_placement_start: Some(instance.placement.start),
            mig_profile: Some(instance.profile.clone()),
        });
    }
    None
}

/// The annotation's text for `held`, at most `max_bytes` long, and how many pods were cut.
/// Pods are kept in name order until the next would not fit with the truncation marker.
pub fn annotation_text(held: &DevicesInUse, max_bytes: usize) -> (String, usize) {
    let whole = serde_json::to_string(held).expect("plain data serialises");
    if whole.len() <= max_bytes {
        return (whole, 0);
    }
    let mut kept = serde_json::Map::new();
    for (i, (pod, devices)) in held.iter().enumerate() {
        kept.insert(pod.clone(), json!(devices));
        let cut = held.len() - i - 1;
        let mut with_marker = kept.clone();
        with_marker.insert(TRUNCATED_KEY.into(), json!(cut));
        if serde_json::to_string(&with_marker).expect("json").len() > max_bytes {
            kept.remove(pod);
            break;
        }
    }
    let cut = held.len() - kept.len();
    kept.insert(TRUNCATED_KEY.into(), json!(cut));
    (Value::Object(kept).to_string(), cut)
}

/// Write `text` as the annotation on `node` unless `current` (the Node as last read) already
/// holds it; whether it wrote. A JSON merge patch of that one key.
pub async fn publish(
    api: &Api<Node>,
    node: &str,
    current: Option<&Node>,
    text: &str,
) -> kube::Result<bool> {
    if current.is_some_and(|n| super::node::annotation(n, DEVICES_IN_USE_ANNOTATION) == Some(text))
    {
        return Ok(false);
    }
    let patch = json!({"metadata": {"annotations": {DEVICES_IN_USE_ANNOTATION: text}}});
    api.patch(
        node,
        &crate::field_manager::patch(crate::field_manager::AGENT),
        &Patch::Merge(&patch),
    )
    .await?;
    Ok(true)
}

/// Whether the last PodResources read failed, so an agent without a kubelet socket warns once.
static KUBELET_READ_FAILING: AtomicBool = AtomicBool::new(false);

impl Reconciler {
    /// Publish which device each pod holds ([`devices_in_use`]) when it changed since `seen`
    /// (or a fresh read of the Node). Never fails the reconcile: a kubelet or NVML read or a
    /// Node write that fails is logged and tried again on the next pass.
    pub(super) async fn publish_devices_in_use(&self, seen: Option<&Node>) {
        let socket = &self.drain.pod_resources_socket;
        let list = match list_pod_resources(socket, KUBELET_TIMEOUT).await {
            Ok(list) => {
                KUBELET_READ_FAILING.store(false, Ordering::Relaxed);
                list
            }
            Err(e) => {
                // Once per outage, not on every pass of the resync.
                if !KUBELET_READ_FAILING.swap(true, Ordering::Relaxed) {
                    warn!(error = %e, "cannot read which pods hold which devices; not published \
                          until the kubelet's PodResources API answers");
                } else {
                    debug!(error = %e, "PodResources still unreadable");
                }
                return;
            }
        };
        let observed = match self.remembered_inventory() {
            Some(observed) => observed,
            None => match self.observe().await {
                Ok(observed) => observed,
                Err(e) => {
                    warn!(error = %e, "cannot read the GPUs; devices in use not published");
                    return;
                }
            },
        };
        let held = devices_in_use(&list, &observed);
        let (text, cut) = annotation_text(&held, MAX_ANNOTATION_BYTES);
        if cut > 0 {
            warn!(
                left_out = cut,
                limit = MAX_ANNOTATION_BYTES,
                "too many pods hold devices for the devices-in-use annotation; cut"
            );
        }
        let fetched;
        let current = match seen {
            Some(node) => Some(node),
            None => {
                fetched = Api::<Node>::all(self.client.clone())
                    .get(&self.node_name)
                    .await
                    .ok();
                fetched.as_ref()
            }
        };
        if let Err(e) = publish(
            &Api::all(self.client.clone()),
            &self.node_name,
            current,
            &text,
        )
        .await
        {
            warn!(error = %e, "could not publish the devices in use on the node");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubelet::pod_resources::api::{ContainerDevices, ContainerResources, PodResources};

    /// GPU 0 with MIG: a 3g.40gb (GI 1) at placement 4 and a 1g.10gb (GI 9) at 0; GPU 1 whole.
    fn observed() -> ObservedNode {
        serde_json::from_value(json!({"gpus": [
            {"index": 0, "product": "NVIDIA H100 80GB HBM3", "uuid": "GPU-0000",
             "mig": {"current": true, "pending": true},
             "instances": [
                {"profile": "1g.10gb", "placement": [0, 1], "giId": 9},
                {"profile": "3g.40gb", "placement": [4, 4], "giId": 1}],
             "computeInstances": [
                {"giId": 9, "ciId": 0, "profileId": 0, "uuid": "MIG-aaaa"},
                {"giId": 1, "ciId": 0, "profileId": 2, "uuid": "MIG-bbbb"}]},
            {"index": 1, "product": "NVIDIA H100 80GB HBM3", "uuid": "GPU-1111"}
        ]}))
        .expect("an observed node")
    }

    fn pod(namespace: &str, name: &str, ids: &[&str]) -> PodResources {
        PodResources {
            name: name.into(),
            namespace: namespace.into(),
            containers: vec![ContainerResources {
                name: "main".into(),
                devices: vec![ContainerDevices {
                    resource_name: "nvidia.com/whatever".into(),
                    device_ids: ids.iter().map(|s| s.to_string()).collect(),
                }],
                dynamic_resources: vec![],
            }],
        }
    }

    #[test]
    fn mig_devices_are_placed_through_their_gpu_instance_and_replicas_name_their_gpu() {
        let list = ListPodResourcesResponse {
            pod_resources: vec![
                pod("serving", "on-3g", &["MIG-bbbb"]),
                pod("serving", "on-1g", &["MIG-aaaa"]),
                pod("batch", "replica", &["GPU-1111::3"]),
                pod("batch", "other-plugin", &["some-nic-0"]),
                pod("batch", "nothing", &[]),
            ],
        };
        let held = devices_in_use(&list, &observed());
        let text = serde_json::to_string(&held).unwrap();
        assert_eq!(
            text,
            r#"{"batch/replica":[{"gpu":1}],"serving/on-1g":[{"gpu":0,"migPlacementStart":0,"migProfile":"1g.10gb"}],"serving/on-3g":[{"gpu":0,"migPlacementStart":4,"migProfile":"3g.40gb"}]}"#
        );
    }

    #[test]
    fn an_annotation_over_the_bound_is_cut_with_a_marker_saying_how_many_pods_were_left_out() {
        let held: DevicesInUse = (0..100)
            .map(|i| {
                (
                    format!("ns/pod-{i:03}"),
                    vec![HeldDevice {
                        gpu: 0,
                        mig_placement_start: None,
                        mig_profile: None,
                    }],
                )
            })
            .collect();
        let (whole, cut) = annotation_text(&held, MAX_ANNOTATION_BYTES);
        assert_eq!(cut, 0);
        assert!(!whole.contains(TRUNCATED_KEY));

        let (text, cut) = annotation_text(&held, 500);
        assert!(text.len() <= 500, "{} bytes", text.len());
        let read: BTreeMap<String, Value> = serde_json::from_str(&text).unwrap();
        let pods = read.len() - 1;
        assert!(pods > 0 && cut > 0);
        assert_eq!(pods + cut, 100);
        assert_eq!(read[TRUNCATED_KEY], json!(cut));
        assert!(
            read.contains_key("ns/pod-000"),
            "the first pods in name order are kept"
        );
    }
}
