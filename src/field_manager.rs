//! Who gpu-share's writes to the API server are recorded as: the `fieldManager` of each create,
//! update and patch, which the API server keeps in the object's `managedFields` and which
//! `kubectl get -o yaml --show-managed-fields` and audit logs show. Without one the API server
//! records the client's user agent or `unknown` (measured on a real kube-apiserver 1.36: the
//! agent's Node writes showed as `unknown`), and nobody can tell gpu-share's label and cordon
//! from a person's. The agent (with its DRA publisher) writes as [`AGENT`], the autopilot as
//! [`AUTOPILOT`].

use http::header::{HeaderValue, USER_AGENT};
use kube::api::{EvictParams, PatchParams, PostParams};

/// The node agent's field manager.
pub const AGENT: &str = "gpu-share";
/// The autopilot's field manager.
pub const AUTOPILOT: &str = "gpu-share-autopilot";

/// Send `User-Agent: <manager>/<version>` on every request of clients built from `config`.
/// Writes made with default parameters (kube-runtime's Event recorder creates its Events so)
/// are then recorded under `manager` too: the API server takes a missing field manager from
/// the user agent's product. Audit logs show it as well.
pub fn identify(config: &mut kube::Config, manager: &str) {
    let agent = format!("{manager}/{}", env!("CARGO_PKG_VERSION"));
    let value = HeaderValue::from_str(&agent).expect("a manager name is a valid header value");
    config.headers.retain(|(name, _)| name != USER_AGENT);
    config.headers.push((USER_AGENT, value));
}

/// Patch parameters naming `manager`.
pub fn patch(manager: &str) -> PatchParams {
    PatchParams {
        field_manager: Some(manager.to_string()),
        ..PatchParams::default()
    }
}

/// Create and replace parameters naming `manager`.
pub fn post(manager: &str) -> PostParams {
    PostParams {
        field_manager: Some(manager.to_string()),
        ..PostParams::default()
    }
}

/// Eviction parameters naming `manager`.
pub fn evict(manager: &str) -> EvictParams {
    EvictParams {
        post_options: post(manager),
        ..EvictParams::default()
    }
}
