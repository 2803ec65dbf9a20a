//! The kubelet's PodResources API (v1) for a simulated node: a gRPC server on a Unix socket,
//! speaking the messages gpu-share's agent reads (`src/kubelet/pod_resources.rs`).
//!
//! As the kubelet does (Kubernetes' device-plugin documentation, "Monitoring device plugin
//! resources"), `List` answers with the pods bound to the node and, per container, the device
//! IDs the device plugin handed it; a pod leaves the list once it is gone. Here the devices are
//! what the test allocated with [`PodResourcesKubelet::allocate`], and the pods are those the
//! API double still holds.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use gpu_share::kubelet::pod_resources::api::pod_resources_lister_server::{
    PodResourcesLister, PodResourcesListerServer,
};
use gpu_share::kubelet::pod_resources::api::{
    ClaimResource, ContainerDevices, ContainerResources, DynamicResource, ListPodResourcesRequest,
    ListPodResourcesResponse, PodResources,
};
use kube_double::KubeDouble;
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

/// (namespace, pod) → (resource, device IDs) handed to its one container.
type Allocations = BTreeMap<(String, String), (String, Vec<String>)>;
/// (namespace, pod) → the DRA devices its container got: (claim, driver, pool, device).
type ClaimAllocations = BTreeMap<(String, String), Vec<(String, String, String, String)>>;

#[derive(Clone)]
struct Lister {
    api: Arc<KubeDouble>,
    node: String,
    allocations: Arc<Mutex<Allocations>>,
    claims: Arc<Mutex<ClaimAllocations>>,
    calls: Arc<AtomicUsize>,
}

#[tonic::async_trait]
impl PodResourcesLister for Lister {
    async fn list(
        &self,
        _: Request<ListPodResourcesRequest>,
    ) -> Result<Response<ListPodResourcesResponse>, Status> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let allocations = self.allocations.lock().unwrap().clone();
        let claims = self.claims.lock().unwrap().clone();
        let pod_resources =
            self.api
                .pods_on(&self.node)
                .into_iter()
                .map(|p| {
                    let namespace = p.metadata.namespace.unwrap_or_default();
                    let name = p.metadata.name.unwrap_or_default();
                    let devices = allocations.get(&(namespace.clone(), name.clone())).map(
                        |(resource, ids)| ContainerDevices {
                            resource_name: resource.clone(),
                            device_ids: ids.clone(),
                        },
                    );
                    let dynamic_resources = claims
                        .get(&(namespace.clone(), name.clone()))
                        .into_iter()
                        .flatten()
                        .map(|(claim, driver, pool, device)| DynamicResource {
                            claim_name: claim.clone(),
                            claim_namespace: namespace.clone(),
                            claim_resources: vec![ClaimResource {
                                cdi_devices: vec![],
                                driver_name: driver.clone(),
                                pool_name: pool.clone(),
                                device_name: device.clone(),
                            }],
                        })
                        .collect();
                    PodResources {
                        name,
                        namespace,
                        containers: vec![ContainerResources {
                            name: "main".into(),
                            devices: devices.into_iter().collect(),
                            dynamic_resources,
                        }],
                    }
                })
                .collect();
        Ok(Response::new(ListPodResourcesResponse { pod_resources }))
    }
}

/// The simulated kubelet's PodResources endpoint; it stops when dropped.
pub struct PodResourcesKubelet {
    lister: Lister,
    _runtime: tokio::runtime::Runtime,
}

impl PodResourcesKubelet {
    /// Serve on `socket` for the pods of `node` at `api`.
    pub fn serve(api: &Arc<KubeDouble>, node: &str, socket: &Path) -> PodResourcesKubelet {
        std::fs::create_dir_all(socket.parent().unwrap()).unwrap();
        let _ = std::fs::remove_file(socket);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let lister = Lister {
            api: Arc::clone(api),
            node: node.to_string(),
            allocations: Arc::default(),
            claims: Arc::default(),
            calls: Arc::default(),
        };
        let listener = runtime
            .block_on(async { UnixListener::bind(socket) })
            .unwrap();
        let service = PodResourcesListerServer::new(lister.clone());
        runtime.spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(UnixListenerStream::new(listener)),
        );
        PodResourcesKubelet {
            lister,
            _runtime: runtime,
        }
    }

    /// Record that the device plugin handed pod `namespace/pod` these device IDs of `resource`.
    pub fn allocate(&self, namespace: &str, pod: &str, resource: &str, ids: &[&str]) {
        self.lister.allocations.lock().unwrap().insert(
            (namespace.to_string(), pod.to_string()),
            (
                resource.to_string(),
                ids.iter().map(|s| s.to_string()).collect(),
            ),
        );
    }

    /// Record that claim `claim` of pod `namespace/pod` was allocated `device` of `pool` of
    /// DRA driver `driver` and prepared for its container, as the kubelet lists it
    /// (`dynamic_resources`, Kubernetes 1.34+).
    pub fn allocate_claim(
        &self,
        namespace: &str,
        pod: &str,
        claim: &str,
        driver: &str,
        pool: &str,
        device: &str,
    ) {
        self.lister
            .claims
            .lock()
            .unwrap()
            .entry((namespace.to_string(), pod.to_string()))
            .or_default()
            .push((claim.into(), driver.into(), pool.into(), device.into()));
    }

    /// How many `List` calls were answered.
    pub fn lists(&self) -> usize {
        self.lister.calls.load(Ordering::SeqCst)
    }
}
