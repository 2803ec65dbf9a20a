//! How the agent writes what it publishes on its Node (the vocabulary is
//! [`crate::published`]'s): the state label, the reason and applied-profile hash annotations,
//! and a cordon that always carries the reason it was made for.

use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use kube::Api;
use serde_json::json;

pub use crate::profile::PROFILE_LABEL;
pub use crate::published::{
    annotation, label, ExpectedEvictions, State, APPLIED_HASH_ANNOTATION, CORDON_ANNOTATION,
    EXPECTED_EVICTIONS_ANNOTATION, REASON_ANNOTATION, STATE_LABEL,
};

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
