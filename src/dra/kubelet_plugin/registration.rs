//! The `Registration` service on the plugin's socket in the kubelet's plugins_registry
//! directory. The kubelet's plugin watcher finds the socket, calls `GetInfo`, validates what it
//! reads (type `DRAPlugin`, a driver name, an endpoint, a DRA service it speaks), dials the
//! endpoint and reports the outcome with `NotifyRegistrationStatus` (kubelet
//! `pkg/kubelet/pluginmanager` and `pkg/kubelet/cm/dra/plugin/registration.go`).

use std::sync::{Arc, Mutex};

use tonic::{Request, Response, Status};
use tracing::{info, warn};

use super::api::registration::registration_server::Registration;
use super::api::registration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use super::RepublishRequests;

/// The plugin type the kubelet's DRA handler is registered under
/// (`pluginregistration.DRAPlugin`).
pub const PLUGIN_TYPE: &str = "DRAPlugin";
/// The gRPC service this plugin serves, as a DRA plugin lists it in `supported_versions`
/// (k8s.io/kubelet/pkg/apis/dra/v1 `DRAPluginService`); the kubelet (1.34+) picks the newest
/// it knows from `v1.DRAPlugin` and `v1beta1.DRAPlugin`.
pub const DRA_SERVICE_V1: &str = "v1.DRAPlugin";

/// What `GetInfo` answers, the last registration status the kubelet sent, and how many
/// registrations it confirmed.
#[derive(Clone)]
pub struct RegistrationService {
    info: PluginInfo,
    last_status: Arc<Mutex<Option<RegistrationStatus>>>,
    /// Told of each confirmed registration: a kubelet that restarts deletes the node's
    /// ResourceSlices and registers the plugin again, so the agent republishes at once.
    republish: RepublishRequests,
}

impl RegistrationService {
    /// `driver` served at `endpoint`, the DRA socket's absolute path; each registration the
    /// kubelet confirms is a `republish` request.
    pub fn new(driver: &str, endpoint: &str, republish: RepublishRequests) -> Self {
        RegistrationService {
            info: PluginInfo {
                r#type: PLUGIN_TYPE.into(),
                name: driver.into(),
                endpoint: endpoint.into(),
                supported_versions: vec![DRA_SERVICE_V1.into()],
            },
            last_status: Arc::default(),
            republish,
        }
    }

    /// The kubelet's last word on the registration, if it has spoken.
    pub fn last_status(&self) -> Option<RegistrationStatus> {
        self.last_status.lock().expect("not poisoned").clone()
    }
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(self.info.clone()))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        if status.plugin_registered {
            info!(driver = %self.info.name, "the kubelet registered the DRA plugin");
            self.republish.request();
        } else {
            warn!(driver = %self.info.name, error = %status.error,
                  "the kubelet refused the DRA plugin's registration");
        }
        *self.last_status.lock().expect("not poisoned") = Some(status);
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}
