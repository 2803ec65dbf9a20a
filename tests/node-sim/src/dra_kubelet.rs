//! The kubelet's DRA side for a simulated node: it watches the plugin-registration directory,
//! registers each DRA plugin whose socket appears there, and calls the plugin's
//! `NodePrepareResources` / `NodeUnprepareResources` when a test asks, as the kubelet does for a
//! pod's ResourceClaims.
//!
//! What it copies from the kubelet (pkg/kubelet/pluginmanager and
//! pkg/kubelet/cm/dra/plugin/registration.go, protos in proto/pluginregistration-v1.proto and
//! proto/dra-v1.proto):
//! - a socket appearing in the registration directory is dialled and asked `GetInfo` (files
//!   starting with `.` are ignored);
//! - the plugin must say type `DRAPlugin`, a driver name, an endpoint (the DRA socket's path)
//!   and a DRA service the kubelet speaks among `supported_versions`; the kubelet speaks
//!   `v1.DRAPlugin` and `v1beta1.DRAPlugin` and picks the first of those it finds in that order
//!   (only v1 is simulated here: a plugin offering only v1beta1 is refused);
//! - it dials the endpoint and reports with `NotifyRegistrationStatus` (registered, or the
//!   reason it was refused);
//! - a socket that disappears deregisters its driver.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gpu_share::dra::kubelet_plugin::api::dra::dra_plugin_client::DraPluginClient;
use gpu_share::dra::kubelet_plugin::api::dra::{
    Claim, NodePrepareResourcesRequest, NodePrepareResourcesResponse,
    NodeUnprepareResourcesRequest, NodeUnprepareResourcesResponse,
};
use gpu_share::dra::kubelet_plugin::api::health::dra_resource_health_client::DraResourceHealthClient;
use gpu_share::dra::kubelet_plugin::api::health::{
    NodeWatchResourcesRequest, NodeWatchResourcesResponse,
};
use gpu_share::dra::kubelet_plugin::api::registration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};

/// The Registration service's methods (pluginregistration/api.proto).
const GET_INFO: &str = "/pluginregistration.Registration/GetInfo";
const NOTIFY_REGISTRATION_STATUS: &str =
    "/pluginregistration.Registration/NotifyRegistrationStatus";
use tonic::transport::Channel;

/// The DRA services the kubelet speaks, newest first (kubelet `servicesSupportedByKubelet`);
/// the simulation implements the first.
pub const KUBELET_DRA_SERVICES: [&str; 2] = ["v1.DRAPlugin", "v1beta1.DRAPlugin"];

/// One registered driver.
#[derive(Clone)]
struct Registered {
    info: PluginInfo,
    registration_socket: PathBuf,
    client: DraPluginClient<Channel>,
    /// The DRA socket's connection, for the health service on it.
    channel: Channel,
}

/// The simulated kubelet's DRA plugin manager.
pub struct DraKubelet {
    drivers: Arc<Mutex<BTreeMap<String, Registered>>>,
    /// Why a socket's plugin was refused, by socket path.
    refused: Arc<Mutex<BTreeMap<PathBuf, String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for DraKubelet {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl DraKubelet {
    /// Watch `registration_dir` (polled every 20 ms; the kubelet uses inotify).
    pub fn watch(registration_dir: &Path) -> DraKubelet {
        let drivers: Arc<Mutex<BTreeMap<String, Registered>>> = Arc::default();
        let refused: Arc<Mutex<BTreeMap<PathBuf, String>>> = Arc::default();
        let dir = registration_dir.to_path_buf();
        let task = tokio::spawn(watch_dir(dir, drivers.clone(), refused.clone()));
        DraKubelet {
            drivers,
            refused,
            task,
        }
    }

    /// The kubelet restarts: it forgets every registration, and its plugin watcher finds the
    /// registration sockets again and registers their plugins anew.
    pub fn restart(&self) {
        self.drivers.lock().unwrap().clear();
        self.refused.lock().unwrap().clear();
    }

    /// The driver's `GetInfo` answer once it is registered, waiting up to `timeout`.
    pub async fn wait_registered(&self, driver: &str, timeout: Duration) -> Option<PluginInfo> {
        let start = Instant::now();
        loop {
            if let Some(r) = self.drivers.lock().unwrap().get(driver) {
                return Some(r.info.clone());
            }
            if start.elapsed() > timeout {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Whether `driver` is registered now.
    pub fn is_registered(&self, driver: &str) -> bool {
        self.drivers.lock().unwrap().contains_key(driver)
    }

    /// Why plugins were refused, by registration socket.
    pub fn refused(&self) -> BTreeMap<PathBuf, String> {
        self.refused.lock().unwrap().clone()
    }

    fn client(&self, driver: &str) -> Result<DraPluginClient<Channel>, tonic::Status> {
        self.drivers
            .lock()
            .unwrap()
            .get(driver)
            .map(|r| r.client.clone())
            .ok_or_else(|| {
                tonic::Status::unavailable(format!("DRA driver {driver} is not registered"))
            })
    }

    /// `NodeWatchResources` (DRAResourceHealth v1alpha1), which kubelet 1.34+ opens on every
    /// registered driver's DRA socket (feature ResourceHealthStatus, on in 1.36).
    pub async fn watch_health(
        &self,
        driver: &str,
    ) -> Result<tonic::Streaming<NodeWatchResourcesResponse>, tonic::Status> {
        let channel = self
            .drivers
            .lock()
            .unwrap()
            .get(driver)
            .map(|r| r.channel.clone())
            .ok_or_else(|| {
                tonic::Status::unavailable(format!("DRA driver {driver} is not registered"))
            })?;
        let mut client = DraResourceHealthClient::new(channel);
        let stream = client
            .node_watch_resources(NodeWatchResourcesRequest {})
            .await?;
        Ok(stream.into_inner())
    }

    /// `NodePrepareResources` for `claims`, as the kubelet calls it before a pod's containers.
    pub async fn prepare(
        &self,
        driver: &str,
        claims: Vec<Claim>,
    ) -> Result<NodePrepareResourcesResponse, tonic::Status> {
        let mut client = self.client(driver)?;
        client
            .node_prepare_resources(NodePrepareResourcesRequest { claims })
            .await
            .map(tonic::Response::into_inner)
    }

    /// `NodeUnprepareResources` for `claims`, as the kubelet calls it once the pod is gone.
    pub async fn unprepare(
        &self,
        driver: &str,
        claims: Vec<Claim>,
    ) -> Result<NodeUnprepareResourcesResponse, tonic::Status> {
        let mut client = self.client(driver)?;
        client
            .node_unprepare_resources(NodeUnprepareResourcesRequest { claims })
            .await
            .map(tonic::Response::into_inner)
    }
}

/// A claim as the kubelet names it in a call.
pub fn claim(namespace: &str, name: &str, uid: &str) -> Claim {
    Claim {
        namespace: namespace.into(),
        name: name.into(),
        uid: uid.into(),
    }
}

async fn watch_dir(
    dir: PathBuf,
    drivers: Arc<Mutex<BTreeMap<String, Registered>>>,
    refused: Arc<Mutex<BTreeMap<PathBuf, String>>>,
) {
    loop {
        let sockets = sockets_in(&dir);
        // Deregister drivers whose registration socket went away.
        drivers
            .lock()
            .unwrap()
            .retain(|_, r| sockets.contains(&r.registration_socket));
        refused.lock().unwrap().retain(|s, _| sockets.contains(s));
        for socket in sockets {
            let known = drivers
                .lock()
                .unwrap()
                .values()
                .any(|r| r.registration_socket == socket)
                || refused.lock().unwrap().contains_key(&socket);
            if known {
                continue;
            }
            match register(&socket).await {
                Ok(r) => {
                    drivers.lock().unwrap().insert(r.info.name.clone(), r);
                }
                Err(e) => {
                    refused.lock().unwrap().insert(socket, e);
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn sockets_in(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .filter(|e| {
            use std::os::unix::fs::FileTypeExt;
            e.file_type().is_ok_and(|t| t.is_socket())
        })
        .map(|e| e.path())
        .collect()
}

/// GetInfo, validate, dial the endpoint, report the outcome. The registration calls go as the
/// kubelet's plugin watcher makes them: grpc-go dialled by the socket's path, which it sends
/// as `:authority` ([`crate::grpc_go`]); a server that refuses that is refused here too.
async fn register(socket: &Path) -> Result<Registered, String> {
    let authority = socket.display().to_string();
    let info: PluginInfo = crate::grpc_go::unary(socket, &authority, GET_INFO, &InfoRequest {})
        .await
        .map_err(|e| {
            format!("failed to get plugin info using RPC GetInfo at socket {authority}, err: {e}")
        })?;
    let outcome = validate(&info);
    let channel = match outcome {
        Ok(()) => gpu_share::kubelet::dial(PathBuf::from(&info.endpoint))
            .await
            .map_err(|e| format!("cannot dial the DRA endpoint {}: {e}", info.endpoint)),
        Err(e) => Err(e),
    };
    let client = channel.clone().map(DraPluginClient::new);
    let status = RegistrationStatus {
        plugin_registered: client.is_ok(),
        error: client.as_ref().err().cloned().unwrap_or_default(),
    };
    let _: RegistrationStatusResponse =
        crate::grpc_go::unary(socket, &authority, NOTIFY_REGISTRATION_STATUS, &status)
            .await
            .map_err(|e| format!("NotifyRegistrationStatus failed: {e}"))?;
    Ok(Registered {
        info,
        registration_socket: socket.to_path_buf(),
        client: client?,
        channel: channel?,
    })
}

/// The kubelet's checks of a DRA plugin's `GetInfo` answer.
fn validate(info: &PluginInfo) -> Result<(), String> {
    if info.r#type != "DRAPlugin" {
        return Err(format!("plugin type {:?} is not DRAPlugin", info.r#type));
    }
    if info.name.is_empty() {
        return Err("the DRA plugin gave no driver name".into());
    }
    if info.endpoint.is_empty() {
        return Err(format!("DRA driver {} gave no endpoint", info.name));
    }
    if !info
        .supported_versions
        .iter()
        .any(|v| v == KUBELET_DRA_SERVICES[0])
    {
        return Err(format!(
            "none of the DRA services {:?} of driver {} is supported by the kubelet (the simulation speaks {})",
            info.supported_versions, info.name, KUBELET_DRA_SERVICES[0]
        ));
    }
    Ok(())
}
