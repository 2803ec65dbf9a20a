//! One `DevicePlugin` gRPC endpoint per advertised resource, on a Unix socket in the kubelet's
//! device-plugins directory, and the `Register` call that tells the kubelet about it.

use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use tokio::sync::watch;
use tokio_stream::wrappers::WatchStream;
use tonic::{Request, Response, Status};
use tracing::{debug, warn};

use super::api::device_plugin_server::{DevicePlugin, DevicePluginServer};
use super::api::registration_client::RegistrationClient;
use super::api::{self, Empty};
use super::cdi::DeviceListing;
use super::inventory::ResourceDevices;
use crate::kubelet::serving::Serving;

/// The kubelet's registration socket, in the device-plugins directory.
pub const KUBELET_SOCKET: &str = "kubelet.sock";

/// The options every endpoint announces: GetPreferredAllocation is implemented,
/// PreStartContainer is not needed.
pub fn options() -> api::DevicePluginOptions {
    api::DevicePluginOptions {
        pre_start_required: false,
        get_preferred_allocation_available: true,
    }
}

/// The service behind one resource's socket.
struct ResourcePlugin {
    devices: watch::Receiver<Arc<ResourceDevices>>,
    /// How Allocate names the devices (`NVIDIA_VISIBLE_DEVICES`, CDI).
    listing: Arc<DeviceListing>,
    /// Flips to true when the endpoint stops: open ListAndWatch streams end with it.
    stopped: watch::Receiver<bool>,
}

type ListStream = Pin<Box<dyn Stream<Item = Result<api::ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl DevicePlugin for ResourcePlugin {
    async fn get_device_plugin_options(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<api::DevicePluginOptions>, Status> {
        Ok(Response::new(options()))
    }

    type ListAndWatchStream = ListStream;

    /// The current list at once, then every change (profile applied, health), until the
    /// endpoint stops.
    async fn list_and_watch(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let mut stopped = self.stopped.clone();
        let until_stopped = async move {
            let _ = stopped.wait_for(|s| *s).await;
        };
        let stream = WatchStream::new(self.devices.clone())
            .map(|devices| Ok(devices.list()))
            .take_until(until_stopped);
        Ok(Response::new(Box::pin(stream)))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<api::PreferredAllocationRequest>,
    ) -> Result<Response<api::PreferredAllocationResponse>, Status> {
        let devices = self.devices.borrow().clone();
        let container_responses = request
            .into_inner()
            .container_requests
            .iter()
            .map(|c| api::ContainerPreferredAllocationResponse {
                device_i_ds: devices.preferred(
                    &c.available_device_i_ds,
                    &c.must_include_device_i_ds,
                    usize::try_from(c.allocation_size).unwrap_or(0),
                ),
            })
            .collect();
        Ok(Response::new(api::PreferredAllocationResponse {
            container_responses,
        }))
    }

    async fn allocate(
        &self,
        request: Request<api::AllocateRequest>,
    ) -> Result<Response<api::AllocateResponse>, Status> {
        let devices = self.devices.borrow().clone();
        let container_responses = request
            .into_inner()
            .container_requests
            .iter()
            .map(|c| {
                let mut response = devices.allocate(&c.devices_ids)?;
                self.listing
                    .apply(&c.devices_ids, &response_id(), &mut response);
                Ok(response)
            })
            .collect::<Result<Vec<_>, super::inventory::AllocateError>>()
            .map_err(|e| {
                warn!(resource = %devices.resource, error = %e, "allocation refused");
                Status::invalid_argument(e.to_string())
            })?;
        Ok(Response::new(api::AllocateResponse {
            container_responses,
        }))
    }

    async fn pre_start_container(
        &self,
        _: Request<api::PreStartContainerRequest>,
    ) -> Result<Response<api::PreStartContainerResponse>, Status> {
        Ok(Response::new(api::PreStartContainerResponse {}))
    }
}

/// A running endpoint: its socket and server task.
pub struct Endpoint(Serving);

impl Endpoint {
    /// Listen on `socket` (replacing a stale file) and serve `devices` there.
    pub fn start(
        socket: &Path,
        devices: watch::Receiver<Arc<ResourceDevices>>,
        listing: Arc<DeviceListing>,
    ) -> std::io::Result<Endpoint> {
        let serving = Serving::start(socket, "device-plugin endpoint", |stopped| {
            tonic::transport::Server::builder().add_service(DevicePluginServer::new(
                ResourcePlugin {
                    devices,
                    listing,
                    stopped,
                },
            ))
        })?;
        Ok(Endpoint(serving))
    }

    /// Stop serving: open streams end, the server shuts down (or is cut off after a second),
    /// and the socket file is removed.
    pub async fn stop(self) {
        self.0.stop().await;
    }
}

/// A random ID for a CDI annotation key, formatted as a UUID as the NVIDIA plugin's are: 128 bits
/// from the standard library's randomly keyed hasher (seeded by the OS per process).
fn response_id() -> String {
    use std::hash::{BuildHasher, RandomState};
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let hi = RandomState::new().hash_one(n);
    let lo = RandomState::new().hash_one(n);
    let bits = (u128::from(hi) << 64) | u128::from(lo);
    let hex = format!("{bits:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// Why the kubelet did not take a plugin's registration.
#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    #[error("cannot connect to the kubelet: {0}")]
    Connect(String),
    #[error("the kubelet refused the registration: {0}")]
    Refused(String),
    #[error("the kubelet did not answer the registration within 10 s")]
    NoAnswer,
}

/// `Register` `resource` (served on `endpoint`, a file name in `dir`) with the kubelet at
/// `dir/kubelet.sock`.
pub async fn register(dir: &Path, endpoint: &str, resource: &str) -> Result<(), RegisterError> {
    let call = async {
        let channel = crate::kubelet::dial(dir.join(KUBELET_SOCKET))
            .await
            .map_err(|e| RegisterError::Connect(e.to_string()))?;
        RegistrationClient::new(channel)
            .register(api::RegisterRequest {
                version: api::VERSION.into(),
                endpoint: endpoint.into(),
                resource_name: resource.into(),
                options: Some(options()),
            })
            .await
            .map_err(|s| RegisterError::Refused(s.message().to_string()))?;
        Ok(())
    };
    let result = tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .map_err(|_| RegisterError::NoAnswer)?;
    debug!(resource, endpoint, "registered with the kubelet");
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn response_ids_look_like_uuids_and_differ() {
        let a = response_id();
        let b = response_id();
        assert_ne!(a, b);
        let parts: Vec<usize> = a.split('-').map(str::len).collect();
        assert_eq!(parts, [8, 4, 4, 4, 12], "{a}");
        assert!(a.chars().all(|c| c == '-' || c.is_ascii_hexdigit()));
        // The CDI annotation key's name part (`nvidia-device-plugin_<id>`) fits in 63 bytes.
        assert!("nvidia-device-plugin_".len() + a.len() <= 63);
    }
}
