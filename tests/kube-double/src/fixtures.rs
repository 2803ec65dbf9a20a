//! Small constructors for the objects agent tests seed.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    ConfigMap, Container, Node, NodeCondition, NodeSpec, NodeStatus, Pod, PodCondition, PodSpec,
    PodStatus, ResourceRequirements,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

fn labels(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, String>> {
    (!pairs.is_empty()).then(|| {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    })
}

/// A Ready, schedulable node with these labels.
pub fn node(name: &str, node_labels: &[(&str, &str)]) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: labels(node_labels),
            ..Default::default()
        },
        spec: Some(NodeSpec::default()),
        status: Some(NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: "True".into(),
                reason: Some("KubeletReady".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
    }
}

/// A Running, Ready pod bound to `node`, with these labels, owned by a ReplicaSet (as pods of
/// a Deployment are: an eviction replaces them). [`bare_pod`] makes one no controller owns.
pub fn running_pod(namespace: &str, name: &str, node: &str, pod_labels: &[(&str, &str)]) -> Pod {
    let mut pod = bare_pod(namespace, name, node, pod_labels);
    pod.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "apps/v1".into(),
        kind: "ReplicaSet".into(),
        name: format!("{name}-rs"),
        uid: format!("rs-uid-{namespace}-{name}"),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }]);
    pod
}

/// A Running, Ready pod bound to `node` that no controller owns (`kubectl run`, a bare
/// manifest): evicted, it is gone for good.
pub fn bare_pod(namespace: &str, name: &str, node: &str, pod_labels: &[(&str, &str)]) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            labels: labels(pod_labels),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.into()),
            containers: vec![Container {
                name: "main".into(),
                image: Some("registry.example/app:1".into()),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: Some(PodStatus {
            phase: Some("Running".into()),
            conditions: Some(vec![
                PodCondition {
                    type_: "Ready".into(),
                    status: "True".into(),
                    ..Default::default()
                },
                PodCondition {
                    type_: "ContainersReady".into(),
                    status: "True".into(),
                    ..Default::default()
                },
            ]),
            ..Default::default()
        }),
    }
}

/// [`running_pod`] whose container requests (and limits) `count` of an extended resource such
/// as `nvidia.com/mig-1g.10gb`.
pub fn gpu_pod(
    namespace: &str,
    name: &str,
    node: &str,
    pod_labels: &[(&str, &str)],
    resource: &str,
    count: u32,
) -> Pod {
    let mut pod = running_pod(namespace, name, node, pod_labels);
    let q: BTreeMap<String, Quantity> =
        [(resource.to_string(), Quantity(count.to_string()))].into();
    if let Some(spec) = pod.spec.as_mut() {
        spec.containers[0].resources = Some(ResourceRequirements {
            limits: Some(q.clone()),
            requests: Some(q),
            ..Default::default()
        });
    }
    pod
}

/// A ConfigMap with these data keys.
pub fn configmap(namespace: &str, name: &str, data: &[(&str, &str)]) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            ..Default::default()
        },
        data: Some(
            data.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ),
        ..Default::default()
    }
}

fn pdb(
    namespace: &str,
    name: &str,
    match_labels: &[(&str, &str)],
    min_available: Option<IntOrString>,
    max_unavailable: Option<IntOrString>,
) -> PodDisruptionBudget {
    PodDisruptionBudget {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            ..Default::default()
        },
        spec: Some(PodDisruptionBudgetSpec {
            min_available,
            max_unavailable,
            selector: Some(LabelSelector {
                match_labels: labels(match_labels).or_else(|| Some(BTreeMap::new())),
                ..Default::default()
            }),
            ..Default::default()
        }),
        status: None,
    }
}

/// A PDB with `minAvailable: min_available` over pods with these labels.
pub fn pdb_min_available(
    namespace: &str,
    name: &str,
    match_labels: &[(&str, &str)],
    min_available: i32,
) -> PodDisruptionBudget {
    pdb(
        namespace,
        name,
        match_labels,
        Some(IntOrString::Int(min_available)),
        None,
    )
}

/// A PDB with `maxUnavailable: max_unavailable` over pods with these labels.
pub fn pdb_max_unavailable(
    namespace: &str,
    name: &str,
    match_labels: &[(&str, &str)],
    max_unavailable: i32,
) -> PodDisruptionBudget {
    pdb(
        namespace,
        name,
        match_labels,
        None,
        Some(IntOrString::Int(max_unavailable)),
    )
}
