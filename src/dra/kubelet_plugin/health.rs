//! The `DRAResourceHealth` v1alpha1 service on the DRA socket: kubelet 1.34+ (feature
//! ResourceHealthStatus, on in 1.36) opens `NodeWatchResources` on every registered driver and
//! shows each allocated device's health in the pod's status (`allocatedResourcesStatus`).
//! Without it, kubelet 1.36 logs "Error receiving from WatchResources stream … Unimplemented"
//! every 5 s.
//!
//! Every published device is streamed: Unhealthy while its GPU, or the MIG device it is or
//! shares, raised a critical XID ([`crate::gpu::xid`]), Healthy otherwise. The whole list goes
//! out when the stream opens and again whenever the published devices or the faults change.

use std::pin::Pin;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use futures::Stream;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::api::health::dra_resource_health_server::DraResourceHealth;
use super::api::health::{
    DeviceHealth, DeviceIdentifier, HealthStatus, NodeWatchResourcesRequest,
    NodeWatchResourcesResponse,
};
use crate::dra::api::ResourceSlice;
use crate::dra::taints::fault_of;
use crate::gpu::xid::{Fault, Faults};

/// The health service: the published slices and the XID faults.
#[derive(Clone)]
pub struct HealthService {
    pub slices: watch::Receiver<Arc<Vec<ResourceSlice>>>,
    pub faults: Faults,
}

/// One message: every device of `slices` with its health now.
pub fn health_of(
    slices: &[ResourceSlice],
    faults: &[(Fault, SystemTime)],
) -> NodeWatchResourcesResponse {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let devices = slices.iter().flat_map(|slice| {
        slice.spec.devices.iter().map(move |device| {
            let fault = fault_of(device, faults).map(|(f, _)| f);
            DeviceHealth {
                device: Some(DeviceIdentifier {
                    pool_name: slice.spec.pool.name.clone(),
                    device_name: device.name.clone(),
                }),
                health: match fault {
                    Some(_) => HealthStatus::Unhealthy,
                    None => HealthStatus::Healthy,
                } as i32,
                last_updated_time: now,
                health_check_timeout_seconds: 0,
                message: fault.map(|f| f.describe()).unwrap_or_default(),
            }
        })
    });
    NodeWatchResourcesResponse {
        devices: devices.collect(),
    }
}

type HealthStream = Pin<Box<dyn Stream<Item = Result<NodeWatchResourcesResponse, Status>> + Send>>;

#[tonic::async_trait]
impl DraResourceHealth for HealthService {
    type NodeWatchResourcesStream = HealthStream;

    async fn node_watch_resources(
        &self,
        _request: Request<NodeWatchResourcesRequest>,
    ) -> Result<Response<HealthStream>, Status> {
        let (tx, rx) = mpsc::channel(4);
        let (mut slices, faults) = (self.slices.clone(), self.faults.clone());
        let mut faulted = faults.subscribe();
        tokio::spawn(async move {
            loop {
                let message = health_of(&slices.borrow_and_update(), &faults.all_since());
                if tx.send(Ok(message)).await.is_err() {
                    return; // the kubelet closed the stream
                }
                tokio::select! {
                    changed = slices.changed() => if changed.is_err() { return },
                    changed = faulted.changed() => if changed.is_err() { return },
                    () = tx.closed() => return,
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dra::api::{Device, DeviceAttribute};

    fn device(name: &str, attributes: &[(&str, &str)]) -> Device {
        Device {
            name: name.into(),
            attributes: attributes
                .iter()
                .map(|(k, v)| (k.to_string(), DeviceAttribute::string(*v)))
                .collect(),
            capacity: Default::default(),
            consumes_counters: Vec::new(),
            taints: Vec::new(),
            allow_multiple_allocations: None,
        }
    }

    #[test]
    fn a_device_is_unhealthy_when_it_its_mig_device_or_its_gpu_faulted() {
        let faults = [
            Fault {
                gpu_uuid: "GPU-0".into(),
                mig_uuid: Some("MIG-a".into()),
                xid: 48,
            },
            Fault {
                gpu_uuid: "GPU-1".into(),
                mig_uuid: None,
                xid: 79,
            },
        ]
        .map(|f| (f, SystemTime::now()));
        let sick = |d: &Device| fault_of(d, &faults).map(|(f, _)| f.xid);
        let mig = device("gpu-0-mig-0", &[("uuid", "MIG-a"), ("parentUUID", "GPU-0")]);
        let other_mig = device("gpu-0-mig-1", &[("uuid", "MIG-b"), ("parentUUID", "GPU-0")]);
        let mig_share = device("gpu-0-mig-0-share-1", &[("migUUID", "MIG-a")]);
        let gpu_share = device("gpu-1-share-0", &[("parentUUID", "GPU-1")]);
        let whole = device("gpu-2", &[("uuid", "GPU-2")]);
        assert_eq!(sick(&mig), Some(48));
        assert_eq!(sick(&mig_share), Some(48));
        assert_eq!(sick(&other_mig), None, "the same GPU's other MIG device");
        assert_eq!(sick(&gpu_share), Some(79));
        assert_eq!(sick(&whole), None);
    }
}
