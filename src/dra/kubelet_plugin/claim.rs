//! The ResourceClaim a `NodePrepareResources` call names: read from the API server (the kubelet
//! sends only namespace, name and UID) and reduced to the devices allocated from this driver's
//! pool on this node.
//!
//! resource.k8s.io/v1 is read as JSON (`DynamicObject`): k8s-openapi has the v1 types only under
//! its `v1_34` feature and the workspace pins `v1_33` (`src/dra/api.rs` says why). The fields
//! read are the API's `ResourceClaimStatus.allocation.devices.results[]`
//! (`DeviceRequestAllocationResult`: request, driver, pool, device).

use kube::api::{Api, ApiResource, DynamicObject};
use serde::Deserialize;

/// resource.k8s.io/v1 ResourceClaim, for the dynamic client.
pub fn resource() -> ApiResource {
    ApiResource {
        group: "resource.k8s.io".into(),
        version: "v1".into(),
        api_version: "resource.k8s.io/v1".into(),
        kind: "ResourceClaim".into(),
        plural: "resourceclaims".into(),
    }
}

/// The most devices one claim's allocation holds: resource.k8s.io/v1
/// `AllocationResultsMaxSize` ("the maximum number of entries in allocation.devices.results",
/// kubernetes staging/src/k8s.io/api/resource/v1/types.go). The API server refuses more, so a
/// claim with more did not come from it; refused before any device is looked up.
pub const MAX_ALLOCATION_RESULTS: usize = 32;

/// One device the scheduler allocated to the claim from this driver.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AllocatedDevice {
    /// The claim's request it satisfies (`<request>` or `<request>/<subrequest>`).
    pub request: String,
    pub driver: String,
    pub pool: String,
    pub device: String,
    /// Set by the scheduler for a device with `allowMultipleAllocations`: which of its shares
    /// this is (`shareID`).
    #[serde(default, rename = "shareID")]
    pub share_id: Option<String>,
    /// What this share consumes of the device's capacities, as quantities
    /// (`consumedCapacity`), with the policies' defaults and rounding applied.
    #[serde(default)]
    pub consumed_capacity: std::collections::BTreeMap<String, String>,
}

#[derive(Debug, Default, Deserialize)]
struct ClaimStatus {
    allocation: Option<Allocation>,
}

#[derive(Debug, Default, Deserialize)]
struct Allocation {
    devices: Option<DeviceAllocation>,
}

#[derive(Debug, Default, Deserialize)]
struct DeviceAllocation {
    #[serde(default)]
    results: Vec<AllocatedDevice>,
}

/// Why the claim the kubelet names cannot be prepared as the API server has it.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    #[error("cannot read ResourceClaim {claim}: {source}")]
    Read { claim: String, source: kube::Error },
    /// Deleted and created again under the same name: another claim.
    #[error(
        "ResourceClaim {claim} has UID {found}, not {uid} as the kubelet asked (deleted and \
         created again?)"
    )]
    OtherUid {
        claim: String,
        found: String,
        uid: String,
    },
    #[error("{claim}: unreadable status: {source}")]
    UnreadableStatus {
        claim: String,
        source: serde_json::Error,
    },
    #[error("{claim} is not allocated")]
    NotAllocated { claim: String },
    #[error(
        "{claim}: {count} allocated devices, over the API's {MAX_ALLOCATION_RESULTS} per claim \
         (allocation.devices.results)"
    )]
    TooManyResults { claim: String, count: usize },
    #[error("{claim}: device {device} of request {request:?} is from pool {pool:?}, not this node's ({ours:?})")]
    OtherPool {
        claim: String,
        device: String,
        request: String,
        pool: String,
        ours: String,
    },
}

/// GET `namespace/name` and check it is the claim the kubelet means (`uid`): a claim deleted
/// and recreated under the same name is another claim.
pub async fn fetch(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    uid: &str,
) -> Result<DynamicObject, ClaimError> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &resource());
    let shown = || format!("{namespace}/{name}");
    let claim = api.get(name).await.map_err(|source| ClaimError::Read {
        claim: shown(),
        source,
    })?;
    match claim.metadata.uid.as_deref() {
        Some(found) if found == uid => Ok(claim),
        found => Err(ClaimError::OtherUid {
            claim: shown(),
            found: found.unwrap_or("(none)").to_string(),
            uid: uid.to_string(),
        }),
    }
}

/// The devices allocated to `claim` by `driver`, which must all come from `pool` (this node's).
/// A claim not allocated yet, or allocated another node's devices, is an error naming it.
pub fn allocated_devices(
    claim: &DynamicObject,
    driver: &str,
    pool: &str,
) -> Result<Vec<AllocatedDevice>, ClaimError> {
    let shown = format!(
        "ResourceClaim {}/{}",
        claim.metadata.namespace.as_deref().unwrap_or(""),
        claim.metadata.name.as_deref().unwrap_or("")
    );
    let status: ClaimStatus = match claim.data.get("status") {
        Some(value) => serde_json::from_value(value.clone()).map_err(|source| {
            ClaimError::UnreadableStatus {
                claim: shown.clone(),
                source,
            }
        })?,
        None => ClaimStatus::default(),
    };
    let results = status
        .allocation
        .ok_or_else(|| ClaimError::NotAllocated {
            claim: shown.clone(),
        })?
        .devices
        .unwrap_or_default()
        .results;
    if results.len() > MAX_ALLOCATION_RESULTS {
        return Err(ClaimError::TooManyResults {
            claim: shown,
            count: results.len(),
        });
    }
    let ours: Vec<AllocatedDevice> = results.into_iter().filter(|r| r.driver == driver).collect();
    if let Some(other) = ours.iter().find(|r| r.pool != pool) {
        return Err(ClaimError::OtherPool {
            claim: shown,
            device: other.device.clone(),
            request: other.request.clone(),
            pool: other.pool.clone(),
            ours: pool.to_string(),
        });
    }
    Ok(ours)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn claim(status: serde_json::Value) -> DynamicObject {
        let mut obj = DynamicObject::new("c", &resource()).within("ns");
        obj.data = json!({ "status": status });
        obj
    }

    #[test]
    fn only_this_drivers_results_count_and_must_be_from_this_pool() {
        let c = claim(json!({"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": "gpu.gpu-share.dev", "pool": "node-a", "device": "gpu-0"},
            {"request": "nic", "driver": "net.example.com", "pool": "x", "device": "eth0"},
        ]}}}));
        let ours = allocated_devices(&c, "gpu.gpu-share.dev", "node-a").unwrap();
        assert_eq!(ours.len(), 1);
        assert_eq!(ours[0].device, "gpu-0");
        let e = allocated_devices(&c, "gpu.gpu-share.dev", "node-b").unwrap_err();
        assert!(matches!(e, ClaimError::OtherPool { .. }), "{e:?}");
        let e = e.to_string();
        assert!(e.contains("ResourceClaim ns/c: device gpu-0"), "{e}");
        assert!(e.contains("not this node's (\"node-b\")"), "{e}");
    }

    #[test]
    fn a_claim_with_more_results_than_the_api_allows_is_refused_by_name() {
        let results = |n: usize| -> Vec<serde_json::Value> {
            (0..n)
                .map(|i| {
                    json!({"request": "gpu", "driver": "gpu.gpu-share.dev",
                                "pool": "node-a", "device": format!("gpu-{i}")})
                })
                .collect()
        };
        let most = claim(json!({"allocation": {"devices": {"results": results(32)}}}));
        assert_eq!(
            allocated_devices(&most, "gpu.gpu-share.dev", "node-a")
                .unwrap()
                .len(),
            32
        );
        let over = claim(json!({"allocation": {"devices": {"results": results(33)}}}));
        let e = allocated_devices(&over, "gpu.gpu-share.dev", "node-a").unwrap_err();
        assert!(matches!(e, ClaimError::TooManyResults { count: 33, .. }));
        assert_eq!(
            e.to_string(),
            "ResourceClaim ns/c: 33 allocated devices, over the API's 32 per claim (allocation.devices.results)"
        );
    }

    #[test]
    fn an_unallocated_claim_is_named() {
        let e = allocated_devices(&claim(json!({})), "d", "p").unwrap_err();
        assert!(matches!(e, ClaimError::NotAllocated { .. }));
        assert_eq!(e.to_string(), "ResourceClaim ns/c is not allocated");
        let mut bare = claim(json!({}));
        bare.data = json!({});
        assert!(allocated_devices(&bare, "d", "p").is_err());
    }
}
