//! What the agent publishes on its Node, as everyone who reads it sees it: the profile state
//! label, the reason, applied-hash, cordon and expected-evictions annotations, and the devices
//! each pod holds. The agent writes these (`agent::node`, `agent::devices_in_use`); `advise
//! --live`, the autopilot and `doctor` read them. A room of its own, below all of them, so that
//! a reader never imports the agent for a key (issue 39: advise beside the agent, not above it).

use k8s_openapi::api::core::v1::Node;
use sha2::{Digest, Sha256};

/// `pending`, `draining`, `applying`, `success` or `failed`.
pub const STATE_LABEL: &str = "gpu-share.dev/profile.state";
/// Why the state is what it is, in a sentence.
pub const REASON_ANNOTATION: &str = "gpu-share.dev/profile.reason";
/// sha256 of the profile text last applied successfully.
pub const APPLIED_HASH_ANNOTATION: &str = "gpu-share.dev/profile.applied-hash";
/// Present while gpu-share holds the node cordoned; its value says why.
pub const CORDON_ANNOTATION: &str = "gpu-share.dev/cordoned";
/// The pods the author of a profile (the autopilot) predicted its change evicts, as JSON
/// [`ExpectedEvictions`]: the agent drains no pod outside it for that profile.
pub const EXPECTED_EVICTIONS_ANNOTATION: &str = "gpu-share.dev/expected-evictions";

/// A prediction of the pods a profile's change evicts on a node. It holds for the profile
/// text whose sha256 is `hash` only, so a prediction left from an earlier proposal, or a
/// profile a person labelled, is not checked against it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ExpectedEvictions {
    /// sha256 of the profile text it was made for (the applied-hash of that text).
    pub hash: String,
    /// `namespace/name` of each pod.
    pub pods: std::collections::BTreeSet<String>,
}

impl ExpectedEvictions {
    /// The prediction on `node` made for the profile text hashed `hash`, if any.
    pub fn on(node: &Node, hash: &str) -> Option<Self> {
        let text = annotation(node, EXPECTED_EVICTIONS_ANNOTATION)?;
        serde_json::from_str::<Self>(text)
            .ok()
            .filter(|e| e.hash == hash)
    }
}

/// The reconcile states, as the state label spells them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Pending,
    Draining,
    Applying,
    Success,
    Failed,
    /// Waiting for a pod the drain may not evict (a bare pod, emptyDir data) to go, or for the
    /// profile's author to predict the evictions the drain needs.
    Blocked,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Pending => "pending",
            State::Draining => "draining",
            State::Applying => "applying",
            State::Success => "success",
            State::Failed => "failed",
            State::Blocked => "blocked",
        }
    }
}

/// A label or annotation of `node`.
pub fn label<'a>(node: &'a Node, key: &str) -> Option<&'a str> {
    node.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

pub fn annotation<'a>(node: &'a Node, key: &str) -> Option<&'a str> {
    node.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

/// The sha256 of a profile's text, as published in the applied-hash annotation.
pub fn content_hash(text: &str) -> String {
    let digest = Sha256::digest(text.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// Node label: the device plugin the node's agent runs (`nvidia`, `builtin`, `dra`), so the
/// autopilot plans for the plugin its agents drive, or leaves the node out saying why.
pub const PLUGIN_LABEL: &str = "gpu-share.dev/plugin";

/// Node annotation: which devices each pod on the node holds (compact JSON,
/// `agent::devices_in_use`).
pub const DEVICES_IN_USE_ANNOTATION: &str = "gpu-share.dev/devices-in-use";
