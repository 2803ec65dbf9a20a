//! A gRPC server on a Unix socket that can be stopped, its socket file removed: the shape of
//! both of the kubelet plugin's endpoints (registration and DRA).

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::net::UnixListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::server::Router;
use tracing::warn;

/// A running server: its socket and task.
pub struct Serving {
    pub socket: PathBuf,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Serving {
    /// Listen on `socket` (its directory created, a stale file replaced) and serve `router`.
    pub fn start(socket: &Path, router: Router) -> std::io::Result<Serving> {
        if let Some(dir) = socket.parent() {
            std::fs::create_dir_all(dir)?;
        }
        match std::fs::remove_file(socket) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let listener = UnixListener::bind(socket)?;
        let (stop, mut stopped) = watch::channel(false);
        let path = socket.to_path_buf();
        let task = tokio::spawn(async move {
            let incoming = UnixListenerStream::new(listener);
            let shutdown = async move {
                let _ = stopped.wait_for(|s| *s).await;
            };
            if let Err(e) = router
                .serve_with_incoming_shutdown(incoming, shutdown)
                .await
            {
                warn!(socket = %path.display(), error = %e, "kubelet plugin endpoint failed");
            }
        });
        Ok(Serving {
            socket: socket.to_path_buf(),
            stop,
            task,
        })
    }

    /// Stop serving (cut off after a second if a call hangs) and remove the socket file, so
    /// the kubelet does not dial a dead one.
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
