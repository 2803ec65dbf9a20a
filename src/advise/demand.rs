//! Demand: the pods that want GPUs, pending or running, with what they request.
//!
//! The file format mirrors the parts of a Kubernetes Pod advise reads (namespace/name,
//! `spec.nodeName`, `status.phase`, the containers' extended-resource limits, annotations), so
//! the live mode builds the same structure from real Pods ([`from_pod`]).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::sharing::GPU_RESOURCE;

/// Annotation: the memory a pod needs on its GPU device, in GiB (e.g. `"20"`, `"7.5"`).
pub const MEMORY_ANNOTATION: &str = "gpu-share.dev/memory-gib";
/// Annotation: how a `nvidia.com/gpu` request wants to be isolated: `mig`, `mps` or `shared`.
pub const ISOLATION_ANNOTATION: &str = "gpu-share.dev/isolation";
/// The most GiB `gpu-share.dev/memory-gib` may say: more than any GPU holds (the largest in
/// the MIG catalog has 288 GB), and small enough that MiB figures times any request count stay
/// far from `u64` overflow in the solver's arithmetic.
pub const MAX_MEMORY_GIB: f64 = 1024.0;
/// MIG resources are `nvidia.com/mig-<profile>` (mixed strategy).
const MIG_RESOURCE_PREFIX: &str = "nvidia.com/mig-";

/// Every pod that wants a GPU.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Demand {
    pub pods: Vec<PodDemand>,
}

/// One pod, as much of it as advise reads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PodDemand {
    #[serde(default = "default_namespace")]
    pub namespace: String,
    pub name: String,
    /// The node it runs on (`spec.nodeName`); required for a running pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    pub phase: Phase,
    /// GPU requests summed over the pod's containers: `nvidia.com/gpu`, `nvidia.com/mig-1g.10gb`.
    #[serde(default)]
    pub requests: BTreeMap<String, u32>,
    /// `gpu-share.dev/memory-gib` and `gpu-share.dev/isolation`; others are ignored.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// The devices a running pod holds, one per unit it requests (optional). With them advise
    /// keeps the pod on those very devices; without, on any free device of its kind on its node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<HeldDevice>,
}

/// A device a running pod holds, as `gpu-share status --output json` shows its node: the GPU's
/// NVML index and, for a MIG instance, the instance's placement start (unique on its GPU) and
/// optionally its profile (checked). E.g. `{gpu: 3, migPlacementStart: 4, migProfile: 1g.10gb}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HeldDevice {
    /// NVML index of the GPU.
    pub gpu: u32,
    /// For a MIG instance: its placement start on that GPU (`instances[].placement.start`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_placement_start: Option<u32>,
    /// For a MIG instance: its profile, e.g. `1g.10gb` (checked against the node when given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_profile: Option<String>,
}

impl std::fmt::Display for HeldDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GPU {}", self.gpu)?;
        if let Some(profile) = &self.mig_profile {
            write!(f, " MIG {profile}")?;
        }
        if let Some(start) = self.mig_placement_start {
            write!(f, " instance at placement {start}")?;
        }
        Ok(())
    }
}

fn default_namespace() -> String {
    "default".into()
}

/// Only the two phases that hold or wait for a device matter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    Pending,
    Running,
}

/// What a pod needs, classified.
#[derive(Debug, Clone, PartialEq)]
pub enum Need {
    /// `count` MIG instances: of a named profile, or the smallest whose memory holds
    /// `memory_mib` on the GPU it lands on.
    Mig {
        profile: Option<String>,
        memory_mib: Option<u64>,
        count: u32,
    },
    /// `count` time-sliced replicas of a whole GPU.
    Shared { count: u32, memory_mib: Option<u64> },
    /// `count` MPS clients of a whole GPU, each capped at `memory_mib` when given.
    Mps { count: u32, memory_mib: Option<u64> },
    /// `count` whole GPUs, not shared.
    Whole { count: u32 },
}

/// A pod whose requests advise cannot serve, named.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("pod {pod}: {problem}")]
pub struct PodError {
    pub pod: String,
    pub problem: PodProblem,
}

/// What in a pod's requests advise cannot serve.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PodProblem {
    #[error("requests {0}: advise handles one GPU resource per pod")]
    SeveralResources(String),
    #[error(
        "{ISOLATION_ANNOTATION}: mig on nvidia.com/gpu needs {MEMORY_ANNOTATION} to pick a MIG \
         profile (or request nvidia.com/mig-<profile>)"
    )]
    MigWithoutMemory,
    #[error("{ISOLATION_ANNOTATION}: {0:?} is not mig, mps or shared")]
    Isolation(String),
    #[error("{MEMORY_ANNOTATION}: {0:?} GiB is over {MAX_MEMORY_GIB}, more than any GPU holds")]
    MemoryOver(String),
    #[error("{MEMORY_ANNOTATION}: {0:?} is not a positive number of GiB")]
    MemoryNotANumber(String),
}

impl PodDemand {
    /// `namespace/name`.
    pub fn id(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// What the pod needs; none when it requests no GPU, an error naming the pod for requests
    /// advise cannot serve (two GPU resources, an unknown isolation, a bad memory figure).
    pub fn need(&self) -> Result<Option<Need>, PodError> {
        let at = |problem: PodProblem| PodError {
            pod: self.id(),
            problem,
        };
        let gpu: Vec<(&String, &u32)> = self
            .requests
            .iter()
            .filter(|(r, n)| **n > 0 && (*r == GPU_RESOURCE || r.starts_with(MIG_RESOURCE_PREFIX)))
            .collect();
        let (resource, &count) = match gpu.as_slice() {
            [] => return Ok(None),
            [one] => *one,
            _ => {
                return Err(at(PodProblem::SeveralResources(
                    gpu.iter()
                        .map(|(r, _)| r.as_str())
                        .collect::<Vec<_>>()
                        .join(" and "),
                )))
            }
        };
        let memory_mib = self.memory_mib().map_err(at)?;
        if let Some(profile) = resource.strip_prefix(MIG_RESOURCE_PREFIX) {
            return Ok(Some(Need::Mig {
                profile: Some(profile.to_string()),
                memory_mib,
                count,
            }));
        }
        let isolation = self
            .annotations
            .get(ISOLATION_ANNOTATION)
            .map(String::as_str);
        Ok(Some(match isolation {
            None => Need::Whole { count },
            Some("shared") => Need::Shared { count, memory_mib },
            Some("mps") => Need::Mps { count, memory_mib },
            Some("mig") if memory_mib.is_some() => Need::Mig {
                profile: None,
                memory_mib,
                count,
            },
            Some("mig") => return Err(at(PodProblem::MigWithoutMemory)),
            Some(other) => return Err(at(PodProblem::Isolation(other.to_string()))),
        }))
    }

    fn memory_mib(&self) -> Result<Option<u64>, PodProblem> {
        let Some(text) = self.annotations.get(MEMORY_ANNOTATION) else {
            return Ok(None);
        };
        match text.trim().parse::<f64>() {
            Ok(gib) if gib > MAX_MEMORY_GIB => Err(PodProblem::MemoryOver(text.clone())),
            Ok(gib) if gib > 0.0 => Ok(Some((gib * 1024.0).ceil() as u64)),
            _ => Err(PodProblem::MemoryNotANumber(text.clone())),
        }
    }
}

/// A Pod as the API server returns it, as advise's demand; none for a pod in another phase
/// (succeeded, failed) or without GPU requests. Requests are the containers' limits summed
/// (extended resources cannot be overcommitted, so Kubernetes sets requests equal to limits),
/// falling back to requests when a container gives no limits.
pub fn from_pod(pod: &Pod) -> Option<PodDemand> {
    let phase = match pod.status.as_ref()?.phase.as_deref()? {
        "Pending" => Phase::Pending,
        "Running" => Phase::Running,
        _ => return None,
    };
    let spec = pod.spec.as_ref()?;
    let mut requests: BTreeMap<String, u32> = BTreeMap::new();
    for container in &spec.containers {
        let Some(resources) = &container.resources else {
            continue;
        };
        let quantities = resources.limits.as_ref().or(resources.requests.as_ref());
        for (name, quantity) in quantities.into_iter().flatten() {
            if name == GPU_RESOURCE || name.starts_with(MIG_RESOURCE_PREFIX) {
                // Counts past u32 (the API allows int64) saturate: no node holds that many
                // devices either way, and the pod is reported unschedulable.
                let n = quantity.0.trim().parse::<u64>().map_or(0, saturate_u32);
                let sum = requests.entry(name.clone()).or_insert(0);
                *sum = sum.saturating_add(n);
            }
        }
    }
    if requests.values().all(|n| *n == 0) {
        return None;
    }
    let annotations = pod
        .metadata
        .annotations
        .iter()
        .flatten()
        .filter(|(k, _)| *k == MEMORY_ANNOTATION || *k == ISOLATION_ANNOTATION)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    Some(PodDemand {
        namespace: pod
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(default_namespace),
        name: pod.metadata.name.clone().unwrap_or_default(),
        node: spec.node_name.clone(),
        phase,
        requests,
        annotations,
        devices: Vec::new(),
    })
}

fn saturate_u32(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(requests: &[(&str, u32)], annotations: &[(&str, &str)]) -> PodDemand {
        PodDemand {
            namespace: "ml".into(),
            name: "p".into(),
            node: None,
            phase: Phase::Pending,
            requests: requests.iter().map(|(r, n)| (r.to_string(), *n)).collect(),
            annotations: annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            devices: Vec::new(),
        }
    }

    #[test]
    fn requests_and_annotations_classify_the_need() {
        let mig = pod(&[("nvidia.com/mig-1g.10gb", 2)], &[]);
        assert_eq!(
            mig.need().unwrap(),
            Some(Need::Mig {
                profile: Some("1g.10gb".into()),
                memory_mib: None,
                count: 2
            })
        );
        let sized = pod(
            &[("nvidia.com/gpu", 1)],
            &[(ISOLATION_ANNOTATION, "mig"), (MEMORY_ANNOTATION, "15")],
        );
        assert_eq!(
            sized.need().unwrap(),
            Some(Need::Mig {
                profile: None,
                memory_mib: Some(15 * 1024),
                count: 1
            })
        );
        let shared = pod(
            &[("nvidia.com/gpu", 1)],
            &[(ISOLATION_ANNOTATION, "shared")],
        );
        assert_eq!(
            shared.need().unwrap(),
            Some(Need::Shared {
                count: 1,
                memory_mib: None
            })
        );
        let mps = pod(
            &[("nvidia.com/gpu", 1)],
            &[(ISOLATION_ANNOTATION, "mps"), (MEMORY_ANNOTATION, "7.5")],
        );
        assert_eq!(
            mps.need().unwrap(),
            Some(Need::Mps {
                count: 1,
                memory_mib: Some(7680)
            })
        );
        assert_eq!(
            pod(&[("nvidia.com/gpu", 2)], &[]).need().unwrap(),
            Some(Need::Whole { count: 2 })
        );
        assert_eq!(pod(&[("cpu", 2)], &[]).need().unwrap(), None);
    }

    #[test]
    fn requests_advise_cannot_serve_are_refused_naming_the_pod() {
        let e = pod(&[("nvidia.com/gpu", 1)], &[(ISOLATION_ANNOTATION, "vgpu")])
            .need()
            .unwrap_err();
        assert!(matches!(e.problem, PodProblem::Isolation(_)), "{e:?}");
        let e = e.to_string();
        assert!(
            e.contains("pod ml/p") && e.contains("\"vgpu\" is not mig, mps or shared"),
            "{e}"
        );
        let e = pod(&[("nvidia.com/gpu", 1)], &[(ISOLATION_ANNOTATION, "mig")])
            .need()
            .unwrap_err()
            .to_string();
        assert!(e.contains("needs gpu-share.dev/memory-gib"), "{e}");
        let e = pod(&[("nvidia.com/gpu", 1), ("nvidia.com/mig-1g.10gb", 1)], &[])
            .need()
            .unwrap_err()
            .to_string();
        assert!(e.contains("one GPU resource per pod"), "{e}");
        let e = pod(&[("nvidia.com/gpu", 1)], &[(MEMORY_ANNOTATION, "-3")])
            .need()
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a positive number of GiB"), "{e}");
    }

    /// 1e308 GiB is finite as an f64 but not as MiB in a u64 (it became u64::MAX, and the
    /// solver's size × count ordering then overflowed): refused, naming the bound.
    #[test]
    fn memory_figures_past_any_gpu_are_refused_naming_the_bound() {
        for huge in ["1e308", "inf", "1025"] {
            let e = pod(&[("nvidia.com/gpu", 1)], &[(MEMORY_ANNOTATION, huge)])
                .need()
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("is over 1024, more than any GPU holds"),
                "{huge}: {e}"
            );
        }
        for bad in ["NaN", "0", "-1", "lots"] {
            let e = pod(&[("nvidia.com/gpu", 1)], &[(MEMORY_ANNOTATION, bad)])
                .need()
                .unwrap_err()
                .to_string();
            assert!(e.contains("not a positive number of GiB"), "{bad}: {e}");
        }
        let most = pod(
            &[("nvidia.com/gpu", 1)],
            &[(ISOLATION_ANNOTATION, "mps"), (MEMORY_ANNOTATION, "1024")],
        );
        assert!(most.need().is_ok());
    }

    /// The API's quantities are int64: a count past u32, or two containers whose sum is, would
    /// have been read as no request (a parse error) or overflowed the sum.
    #[test]
    fn request_counts_past_u32_saturate_instead_of_vanishing_or_overflowing() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "greedy", "namespace": "ml"},
            "spec": {"containers": [
                {"name": "a", "resources": {"limits": {"nvidia.com/mig-1g.10gb": "99999999999"}}},
                {"name": "b", "resources": {"limits": {"nvidia.com/mig-1g.10gb": "4294967295"}}},
                {"name": "c", "resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}}}]},
            "status": {"phase": "Pending"}
        }))
        .unwrap();
        let demand = from_pod(&pod).expect("a GPU request, not none");
        assert_eq!(demand.requests["nvidia.com/mig-1g.10gb"], u32::MAX);
    }

    /// A Pod fixture as the API server serves it (JSON), converted.
    #[test]
    fn a_kubernetes_pod_becomes_the_same_demand() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "llm-0", "namespace": "serving", "annotations": {
                "gpu-share.dev/memory-gib": "30", "gpu-share.dev/isolation": "mig", "other": "x"}},
            "spec": {"nodeName": "gpu-1", "containers": [
                {"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1", "cpu": "2"}}},
                {"name": "b", "resources": {"requests": {"nvidia.com/gpu": "1"}}},
                {"name": "c"}]},
            "status": {"phase": "Running"}
        }))
        .unwrap();
        let demand = from_pod(&pod).unwrap();
        assert_eq!(demand.id(), "serving/llm-0");
        assert_eq!(demand.node.as_deref(), Some("gpu-1"));
        assert_eq!(demand.phase, Phase::Running);
        assert_eq!(
            demand.requests,
            BTreeMap::from([("nvidia.com/gpu".to_string(), 2)])
        );
        assert_eq!(demand.annotations.len(), 2);
        assert_eq!(
            demand.need().unwrap(),
            Some(Need::Mig {
                profile: None,
                memory_mib: Some(30 * 1024),
                count: 2
            })
        );
        let done: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "x"}, "spec": {"containers": [
                {"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
            "status": {"phase": "Succeeded"}}))
        .unwrap();
        assert_eq!(from_pod(&done), None);
    }
}
