//! A gRPC server on a Unix socket that can be stopped, its socket file removed: the shape of
//! every endpoint gpu-share serves to the kubelet (the built-in device plugin's per-resource
//! endpoints, the DRA plugin's registration and DRA sockets).

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::net::UnixListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tokio_stream::StreamExt;
use tonic::transport::server::Router;
use tracing::warn;

/// A running server: its socket and task.
pub struct Serving {
    pub socket: PathBuf,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Serving {
    /// Listen on `socket` (a stale file replaced) and serve the router `make_router` builds;
    /// it is given the receiver that turns true when [`Serving::stop`] is called, so services
    /// can end their open streams. `what` names the endpoint in the log if the server fails.
    pub fn start(
        socket: &Path,
        what: &'static str,
        make_router: impl FnOnce(watch::Receiver<bool>) -> Router,
    ) -> std::io::Result<Serving> {
        Self::start_with(socket, what, false, make_router)
    }

    /// As [`Serving::start`], for the socket the kubelet's plugin watcher dials: each connection
    /// goes through [`super::authority::front`], which fixes the `:authority` grpc-go sends
    /// there (the socket's path), which the HTTP/2 server would refuse.
    pub fn start_for_plugin_watcher(
        socket: &Path,
        what: &'static str,
        make_router: impl FnOnce(watch::Receiver<bool>) -> Router,
    ) -> std::io::Result<Serving> {
        Self::start_with(socket, what, true, make_router)
    }

    fn start_with(
        socket: &Path,
        what: &'static str,
        fronted: bool,
        make_router: impl FnOnce(watch::Receiver<bool>) -> Router,
    ) -> std::io::Result<Serving> {
        match std::fs::remove_file(socket) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let listener = UnixListener::bind(socket)?;
        let (stop, stopped) = watch::channel(false);
        let router = make_router(stopped.clone());
        let mut shutdown = stopped;
        let path = socket.to_path_buf();
        let task = tokio::spawn(async move {
            let incoming = UnixListenerStream::new(listener);
            let shutdown = async move {
                let _ = shutdown.wait_for(|s| *s).await;
            };
            let served = if fronted {
                let fronted = incoming.map(|c| c.map(super::authority::front));
                router.serve_with_incoming_shutdown(fronted, shutdown).await
            } else {
                router
                    .serve_with_incoming_shutdown(incoming, shutdown)
                    .await
            };
            if let Err(e) = served {
                warn!(socket = %path.display(), error = %e, "{what} failed");
            }
        });
        Ok(Serving {
            socket: socket.to_path_buf(),
            stop,
            task,
        })
    }

    /// Stop serving: open streams end, the server shuts down (or is cut off after a second if
    /// a call hangs), and the socket file is removed, so the kubelet does not dial a dead one.
    pub async fn stop(self) {
        self.stop.send_replace(true);
        let mut task = self.task;
        if tokio::time::timeout(Duration::from_secs(1), &mut task)
            .await
            .is_err()
        {
            task.abort();
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}
