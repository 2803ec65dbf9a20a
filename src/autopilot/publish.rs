//! What the autopilot tells people: the status ConfigMap (one YAML document under
//! `status.yaml`: when, who, the budget, and per node the proposal and the action) and Events
//! on the Nodes it proposes for.

use k8s_openapi::api::core::v1::{ConfigMap, Node};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::Resource;
use serde::Serialize;
use serde_json::json;
use tracing::warn;

use super::rollout::{Action, Decision};
use crate::advise::proposal::Unschedulable;
use crate::advise::NodeAdvice;
use crate::agent::reconcile::event_action;

/// The status ConfigMap's one key.
pub const STATUS_KEY: &str = "status.yaml";

/// Event reasons, on the Node.
pub const PROPOSED: &str = "ProfileProposed";
pub const ADVISED: &str = "ProfileAdvised";
pub const BLOCKED: &str = "ProfileProposalBlocked";

/// The status document.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    /// RFC 3339, when this round ended.
    pub updated: String,
    pub identity: String,
    pub dry_run: bool,
    pub max_changing_nodes: u32,
    /// Nodes changing after this round (settling a change, or holding a drain slot).
    pub changing_nodes: Vec<String>,
    pub unschedulable: Vec<Unschedulable>,
    /// GPU nodes left out of the supply and pods left out of the demand, each with why.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<String>,
    pub nodes: Vec<NodeStatus>,
}

/// One node's line.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeStatus {
    pub node: String,
    pub profile_key: String,
    pub action: Action,
    pub reason: String,
    pub pods: usize,
    pub pods_evicted: Vec<String>,
    pub instances_kept: usize,
    pub instances_destroyed: usize,
    pub instances_created: usize,
    pub mig_mode_changes: usize,
}

impl NodeStatus {
    pub fn new(decision: &Decision, advice: &NodeAdvice) -> Self {
        NodeStatus {
            node: decision.node.clone(),
            profile_key: decision.profile_key.clone(),
            action: decision.action,
            reason: decision.reason.clone(),
            pods: advice.pods.len(),
            pods_evicted: advice.pods_evicted.clone(),
            instances_kept: advice.instances_kept,
            instances_destroyed: advice.instances_destroyed,
            instances_created: advice.instances_created,
            mig_mode_changes: advice.mig_mode_changes,
        }
    }
}

/// Write the status document into `name` (created when missing).
pub async fn write_status(api: &Api<ConfigMap>, name: &str, status: &Status) -> anyhow::Result<()> {
    let text = serde_yaml::to_string(status)?;
    let patch = json!({ "data": { STATUS_KEY: text } });
    match api
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => {
            let cm = ConfigMap {
                metadata: ObjectMeta {
                    name: Some(name.to_string()),
                    ..Default::default()
                },
                data: Some([(STATUS_KEY.to_string(), text)].into()),
                ..Default::default()
            };
            api.create(&PostParams::default(), &cm).await?;
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

/// The Event a decision deserves, if any: proposed (dry-run), advised (applied), blocked.
/// Waiting for the budget and unchanged nodes are in the status only (they would repeat every
/// round).
pub fn event_for(decision: &Decision) -> Option<Event> {
    let (type_, reason) = match decision.action {
        Action::DryRun => (EventType::Normal, PROPOSED),
        Action::Applied => (EventType::Normal, ADVISED),
        Action::BlockedPdb => (EventType::Warning, BLOCKED),
        Action::WaitingBudget | Action::Unchanged => return None,
    };
    let note: String = decision.reason.chars().take(1000).collect();
    Some(Event {
        type_,
        reason: reason.to_string(),
        action: event_action("Autopilot", &note),
        note: Some(note),
        secondary: None,
    })
}

/// Publish the decision's Event on its Node (best effort: a failure is logged).
pub async fn event(recorder: &Recorder, node: &Node, decision: &Decision) {
    let Some(event) = event_for(decision) else {
        return;
    };
    if let Err(e) = recorder.publish(&event, &node.object_ref(&())).await {
        warn!(node = %decision.node, error = %e, "could not publish an event");
    }
}
