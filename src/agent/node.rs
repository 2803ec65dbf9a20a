//! What the agent publishes on its Node: the state label, the reason and applied-profile hash
//! annotations, and a cordon that always carries the reason it was made for.

use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use kube::Api;
use serde_json::json;

pub use crate::profile::PROFILE_LABEL;
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

fn params() -> PatchParams {
    crate::field_manager::patch(crate::field_manager::AGENT)
}

/// Publish a state and its reason (and, on success, the applied hash).
pub async fn set_state(
    api: &Api<Node>,
    node: &str,
    state: State,
    reason: &str,
    applied_hash: Option<&str>,
) -> kube::Result<()> {
    let mut annotations = json!({ REASON_ANNOTATION: truncate(reason, 1024) });
    if let Some(hash) = applied_hash {
        annotations[APPLIED_HASH_ANNOTATION] = json!(hash);
    }
    let patch = json!({
        "metadata": {
            "labels": { STATE_LABEL: state.as_str() },
            "annotations": annotations,
        }
    });
    api.patch(node, &params(), &Patch::Merge(&patch)).await?;
    Ok(())
}

/// Remove the state label and reason (no profile label: gpu-share leaves the node alone).
pub async fn clear_state(api: &Api<Node>, node: &str) -> kube::Result<()> {
    let patch = json!({
        "metadata": {
            "labels": { STATE_LABEL: null },
            "annotations": { REASON_ANNOTATION: null },
        }
    });
    api.patch(node, &params(), &Patch::Merge(&patch)).await?;
    Ok(())
}

/// Cordon the node, recording why. Returns false, changing nothing, when someone else already
/// cordoned it: then it is not ours to uncordon.
pub async fn cordon(api: &Api<Node>, node: &str, reason: &str) -> kube::Result<bool> {
    let current = api.get(node).await?;
    let ours = annotation(&current, CORDON_ANNOTATION).is_some();
    let unschedulable = current
        .spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false);
    if unschedulable && !ours {
        return Ok(false);
    }
    let patch = json!({
        "metadata": { "annotations": { CORDON_ANNOTATION: truncate(reason, 1024) } },
        "spec": { "unschedulable": true },
    });
    api.patch(node, &params(), &Patch::Merge(&patch)).await?;
    Ok(true)
}

/// Uncordon the node if gpu-share cordoned it. Returns whether it did.
pub async fn uncordon_if_ours(api: &Api<Node>, node: &str) -> kube::Result<bool> {
    let current = api.get(node).await?;
    if annotation(&current, CORDON_ANNOTATION).is_none() {
        return Ok(false);
    }
    let patch = json!({
        "metadata": { "annotations": { CORDON_ANNOTATION: null } },
        "spec": { "unschedulable": null },
    });
    api.patch(node, &params(), &Patch::Merge(&patch)).await?;
    Ok(true)
}

/// An API error in words, with its causes: kube's own text for a request that timed out is only
/// "client error (SendRequest)", the cause says "timed out".
pub fn describe(e: &kube::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    let mut timed_out = false;
    while let Some(cause) = source {
        let part = cause.to_string();
        if !text.contains(&part) {
            text = format!("{text}: {part}");
        }
        timed_out |= cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut);
        source = cause.source();
    }
    if timed_out {
        text.push_str(" (no answer within the API timeout, --api-timeout)");
    }
    text
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::describe;

    #[test]
    fn a_request_that_timed_out_says_so() {
        let cause = std::io::Error::new(std::io::ErrorKind::TimedOut, "timed out");
        let text = describe(&kube::Error::Service(Box::new(cause)));
        assert!(
            text.contains("timed out") && text.contains("API timeout"),
            "{text}"
        );
        let other = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let text = describe(&kube::Error::Service(Box::new(other)));
        assert_eq!(text, "ServiceError: refused");
    }
}
