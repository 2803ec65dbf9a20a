//! The kubelet's device-plugin side for a simulated node: the `Registration` service on
//! `<dir>/kubelet.sock`, and for each registered plugin a `ListAndWatch` client whose device
//! lists become the Node's `status.capacity` and `status.allocatable` at the API double.
//!
//! What it copies from the kubelet (Kubernetes' "Device Plugins" documentation, and the
//! device-plugin API v1beta1 in `proto/deviceplugin-v1beta1.proto`):
//! - a plugin registers its resource name and its socket (`endpoint`, relative to the
//!   device-plugin directory); the kubelet then dials that socket and calls `ListAndWatch`;
//! - every list the plugin sends replaces the resource's devices: capacity is how many devices
//!   it lists, allocatable how many of them are `Healthy`;
//! - a new registration for a resource replaces the old endpoint;
//! - when the endpoint's stream ends (the plugin stopped), the resource's devices are gone:
//!   capacity and allocatable go to 0. (The kubelet first marks them unhealthy and drops the
//!   capacity after a grace period; the simulation does both at once.)

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use gpu_share::builtin_plugin::api::device_plugin_client::DevicePluginClient;
use gpu_share::builtin_plugin::api::registration_server::{Registration, RegistrationServer};
use gpu_share::builtin_plugin::api::{Empty, ListAndWatchResponse, RegisterRequest};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube_double::KubeDouble;
use tokio::net::{UnixListener, UnixStream};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

/// Resource name → (healthy, listed) device counts, as last advertised.
pub type Advertised = BTreeMap<String, (usize, usize)>;

#[derive(Clone)]
struct Kubelet {
    api: Arc<KubeDouble>,
    node: String,
    dir: PathBuf,
    /// Per resource: the number of its latest registration (an older endpoint's lists and end
    /// are ignored once a newer one registered).
    generations: Arc<Mutex<BTreeMap<String, u64>>>,
    registrations: Arc<Mutex<Vec<RegisterRequest>>>,
    advertised: Arc<Mutex<Advertised>>,
}

#[tonic::async_trait]
impl Registration for Kubelet {
    async fn register(&self, request: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        let request = request.into_inner();
        let generation = {
            let mut generations = self.generations.lock().unwrap();
            let g = generations
                .entry(request.resource_name.clone())
                .or_default();
            *g += 1;
            *g
        };
        self.registrations.lock().unwrap().push(request.clone());
        let kubelet = self.clone();
        tokio::spawn(async move { kubelet.watch_endpoint(request, generation).await });
        Ok(Response::new(Empty {}))
    }
}

impl Kubelet {
    fn is_current(&self, resource: &str, generation: u64) -> bool {
        self.generations.lock().unwrap().get(resource) == Some(&generation)
    }

    /// Follow one plugin endpoint's `ListAndWatch` until it ends.
    async fn watch_endpoint(&self, request: RegisterRequest, generation: u64) {
        let resource = request.resource_name.clone();
        if let Some(mut stream) = self.list_and_watch(&request.endpoint).await {
            while let Ok(Some(list)) = stream.message().await {
                if !self.is_current(&resource, generation) {
                    return;
                }
                self.advertise(&resource, &list);
            }
        }
        if self.is_current(&resource, generation) {
            self.set_counts(&resource, 0, 0);
        }
    }

    async fn list_and_watch(
        &self,
        endpoint: &str,
    ) -> Option<tonic::Streaming<ListAndWatchResponse>> {
        let mut client = dial_plugin(self.dir.join(endpoint)).await?;
        Some(client.list_and_watch(Empty {}).await.ok()?.into_inner())
    }

    fn advertise(&self, resource: &str, list: &ListAndWatchResponse) {
        let healthy = list
            .devices
            .iter()
            .filter(|d| d.health == "Healthy")
            .count();
        self.set_counts(resource, healthy, list.devices.len());
    }

    /// Publish a resource's counts on the Node, as the kubelet's status update does.
    fn set_counts(&self, resource: &str, healthy: usize, listed: usize) {
        self.advertised
            .lock()
            .unwrap()
            .insert(resource.to_string(), (healthy, listed));
        set_node_counts(&self.api, &self.node, resource, healthy, listed);
    }
}

/// Set one resource's `status.capacity` (`listed`) and `status.allocatable` (`healthy`) on
/// Node `node`, as the kubelet's node-status update does.
pub(crate) fn set_node_counts(
    api: &KubeDouble,
    node: &str,
    resource: &str,
    healthy: usize,
    listed: usize,
) {
    api.modify::<Node>(None, node, |n| {
        let status = n.status.get_or_insert_with(Default::default);
        status
            .capacity
            .get_or_insert_with(Default::default)
            .insert(resource.to_string(), Quantity(listed.to_string()));
        status
            .allocatable
            .get_or_insert_with(Default::default)
            .insert(resource.to_string(), Quantity(healthy.to_string()));
    });
}

/// A device-plugin client over the plugin's Unix socket, as the kubelet dials it (gRPC over
/// `unix://`); `None` while nothing listens there.
pub async fn dial_plugin(socket: PathBuf) -> Option<DevicePluginClient<tonic::transport::Channel>> {
    let connector = tower::service_fn(move |_: tonic::transport::Uri| {
        let path = socket.clone();
        async move {
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                UnixStream::connect(path).await?,
            ))
        }
    });
    let channel = tonic::transport::Endpoint::from_static("http://plugin")
        .connect_with_connector(connector)
        .await
        .ok()?;
    Some(DevicePluginClient::new(channel))
}

/// The simulated kubelet's device-plugin manager for one node; it stops when dropped.
pub struct DevicePluginKubelet {
    kubelet: Kubelet,
    _runtime: tokio::runtime::Runtime,
}

impl DevicePluginKubelet {
    /// Serve `Registration` on `<dir>/kubelet.sock` for node `node` at `api`.
    pub fn serve(api: &Arc<KubeDouble>, node: &str, dir: &Path) -> DevicePluginKubelet {
        std::fs::create_dir_all(dir).unwrap();
        let socket = dir.join("kubelet.sock");
        let _ = std::fs::remove_file(&socket);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let kubelet = Kubelet {
            api: Arc::clone(api),
            node: node.to_string(),
            dir: dir.to_path_buf(),
            generations: Arc::default(),
            registrations: Arc::default(),
            advertised: Arc::default(),
        };
        let listener = runtime
            .block_on(async { UnixListener::bind(&socket) })
            .unwrap();
        let service = RegistrationServer::new(kubelet.clone());
        let _guard = runtime.enter();
        runtime.spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(UnixListenerStream::new(listener)),
        );
        DevicePluginKubelet {
            kubelet,
            _runtime: runtime,
        }
    }

    /// Every registration so far.
    pub fn registrations(&self) -> Vec<RegisterRequest> {
        self.kubelet.registrations.lock().unwrap().clone()
    }

    /// What each resource last advertised: (healthy, listed) devices.
    pub fn advertised(&self) -> Advertised {
        self.kubelet.advertised.lock().unwrap().clone()
    }
}

/// The Node's `status.allocatable` entries for `nvidia.com/*` resources, as numbers.
pub fn gpu_allocatable(api: &KubeDouble, node: &str) -> BTreeMap<String, u64> {
    api.node(node)
        .and_then(|n| n.status?.allocatable)
        .unwrap_or_default()
        .into_iter()
        .filter(|(k, _)| k.starts_with("nvidia.com/"))
        .filter_map(|(k, q)| Some((k, q.0.parse().ok()?)))
        .collect()
}
