//! What is at a kubelet socket path (listening, stale, not a socket, missing), and the check of
//! the kubelet's PodResources socket: shared by the device-plugin layer (`super::plugin`) and
//! the DRA layer (`super::dra`), which both look at the kubelet's sockets.

use std::io::ErrorKind;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixStream;
use std::path::Path;

use super::{Check, Ctx};

/// What is at a socket path.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Socket {
    Listening,
    /// A socket file, but connecting is refused: whoever made it is gone.
    Stale,
    WrongType,
    Missing,
}

/// What is at `path`: connecting tells a live socket from one whose maker is gone.
pub(super) fn probe(path: &Path) -> Socket {
    match std::fs::metadata(path) {
        Err(_) => Socket::Missing,
        Ok(m) if !m.file_type().is_socket() => Socket::WrongType,
        Ok(_) => match UnixStream::connect(path) {
            Ok(_) => Socket::Listening,
            // A listener whose backlog is full is alive.
            Err(e) if e.kind() == ErrorKind::WouldBlock => Socket::Listening,
            Err(_) => Socket::Stale,
        },
    }
}

pub(super) fn describe(s: &Socket) -> &'static str {
    match s {
        Socket::Listening => "listening",
        Socket::Stale => "a stale socket (nothing listens)",
        Socket::WrongType => "not a socket",
        Socket::Missing => "missing",
    }
}

/// The kubelet's PodResources API, which the agent's drain asks which pods hold the devices a
/// MIG change takes away.
pub(super) fn pod_resources(ctx: &Ctx<'_>, check: &mut Check) {
    let socket = &ctx.paths.pod_resources_socket;
    let state = probe(socket);
    if state != Socket::Listening {
        check.warn(
            format!(
                "the kubelet's PodResources API ({}) is {}: the agent's drain sees only the pods \
                 with GPU processes, not those holding a MIG device or GPU replica idle",
                socket.display(),
                describe(&state)
            ),
            "the kubelet serves it by default; mount /var/lib/kubelet/pod-resources into the \
             agent (deploy/base does); a kubelet with another --root-dir keeps it elsewhere: \
             point --pod-resources-socket there",
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tells_live_stale_and_missing_sockets_apart() {
        let dir = tempfile::tempdir().unwrap();
        let live = dir.path().join("live.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&live).unwrap();
        let stale = dir.path().join("stale.sock");
        drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
        let file = dir.path().join("file.sock");
        std::fs::write(&file, "").unwrap();
        assert_eq!(probe(&live), Socket::Listening);
        assert_eq!(probe(&stale), Socket::Stale);
        assert_eq!(probe(&file), Socket::WrongType);
        assert_eq!(probe(&dir.path().join("none.sock")), Socket::Missing);
    }
}
