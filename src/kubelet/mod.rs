//! What the kubelet exposes on the node itself: its local gRPC APIs, on Unix sockets under
//! `/var/lib/kubelet` (device-plugin registration, spoken by [`crate::builtin_plugin`], and
//! [`pod_resources`], which says which pod holds which device), and the pod cgroups it lays out
//! ([`cgroup`], which says which pod a process belongs to). [`serving`] is the server side of
//! those sockets for the endpoints gpu-share serves to the kubelet.

pub mod authority;
pub mod cgroup;
pub mod pod_resources;
pub mod serving;

use std::path::PathBuf;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

/// A gRPC channel to the Unix socket `path` (the kubelet's, or a device plugin's).
pub async fn dial(path: PathBuf) -> Result<Channel, tonic::transport::Error> {
    let connector = tower::service_fn(move |_: Uri| {
        let path = path.clone();
        async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
    });
    // The URI is required by the API but unused: the connector dials the socket.
    Endpoint::from_static("http://kubelet.sock")
        .connect_with_connector(connector)
        .await
}
