//! What the autopilot tells people: the status ConfigMap (one YAML document under
//! `status.yaml`: when, who, the budget, and per node the proposal and the action) and Events
//! on the Nodes it proposes for.

use k8s_openapi::api::core::v1::{ConfigMap, Node};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, Patch};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::Resource;
use serde::Serialize;
use serde_json::json;
use tracing::warn;

use super::rollout::{Action, Decision};
use crate::advise::proposal::Unschedulable;
use crate::advise::NodeAdvice;
use crate::agent::events::event_action;

/// The status ConfigMap's one key.
pub const STATUS_KEY: &str = "status.yaml";

/// The most bytes the status document may take. The API server refuses a ConfigMap whose data
/// exceeds 1 MiB (`MaxSecretSize`, "The data stored in a ConfigMap cannot exceed 1 MiB":
/// kubernetes.io/docs/concepts/configuration/configmap); 4 KiB are left for the key and the
/// object's metadata. A larger document is cut ([`bounded`]) rather than failing the write.
pub const MAX_STATUS_BYTES: usize = 1024 * 1024 - 4096;

/// The most bytes of an Event's note: events.k8s.io/v1 `Event.note` "Maximal length of the
/// note is 1kB" (the API server refuses a longer one). kube-runtime's `Recorder` sends the
/// note as given, so it is cut here, at a character boundary.
pub const MAX_NOTE_BYTES: usize = 1024;

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
    /// Set when the document was cut to [`MAX_STATUS_BYTES`]: what was left out.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub truncated: Option<Truncated>,
}

/// What a cut status document left out, per list, and why.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Truncated {
    pub note: String,
    pub nodes_left_out: usize,
    pub unschedulable_left_out: usize,
    pub skipped_left_out: usize,
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

/// The status document as YAML, within [`MAX_STATUS_BYTES`]: entries are dropped, least
/// telling first, until it fits, and `truncated` says how many of each list went. Kept first:
/// nodes with an action (applied, dry-run, waiting, blocked), then unschedulable pods, then
/// the skipped list, then unchanged nodes. Linear in the document's size.
pub fn bounded(status: &Status) -> anyhow::Result<String> {
    let text = serde_yaml::to_string(status)?;
    if text.len() <= MAX_STATUS_BYTES {
        return Ok(text);
    }
    let mut cut = Status {
        changing_nodes: status.changing_nodes.clone(),
        unschedulable: Vec::new(),
        skipped: Vec::new(),
        nodes: Vec::new(),
        truncated: Some(Truncated::default()),
        ..status.clone()
    };
    // Room for the fixed fields, the truncation note and the list keys.
    let mut budget = MAX_STATUS_BYTES.saturating_sub(serde_yaml::to_string(&cut)?.len() + 512);
    let mut take = |size: usize| {
        let fits = size <= budget;
        if fits {
            budget -= size;
        }
        fits
    };
    let changed = |n: &&NodeStatus| n.action != Action::Unchanged;
    let mut keep_node = vec![false; status.nodes.len()];
    for (i, n) in status.nodes.iter().enumerate().filter(|(_, n)| changed(n)) {
        keep_node[i] = take(size(n));
    }
    let unschedulable: Vec<Unschedulable> = (status.unschedulable.iter())
        .filter(|u| take(size(u)))
        .cloned()
        .collect();
    let skipped: Vec<String> = (status.skipped.iter())
        .filter(|s| take(size(s)))
        .cloned()
        .collect();
    for (i, n) in status.nodes.iter().enumerate().filter(|(_, n)| !changed(n)) {
        keep_node[i] = take(size(n));
    }
    cut.nodes = (status.nodes.iter().zip(&keep_node))
        .filter(|(_, keep)| **keep)
        .map(|(n, _)| n.clone())
        .collect();
    cut.truncated = Some(Truncated {
        note: format!(
            "cut to fit a ConfigMap ({MAX_STATUS_BYTES} bytes of {}): nodes with an action, \
             unschedulable pods and skipped inputs are kept first; the log has every decision",
            text.len()
        ),
        nodes_left_out: status.nodes.len() - cut.nodes.len(),
        unschedulable_left_out: status.unschedulable.len() - unschedulable.len(),
        skipped_left_out: status.skipped.len() - skipped.len(),
    });
    cut.unschedulable = unschedulable;
    cut.skipped = skipped;
    let text = serde_yaml::to_string(&cut)?;
    anyhow::ensure!(
        text.len() <= MAX_STATUS_BYTES,
        "the cut status document is still {} bytes (changing nodes alone are too many)",
        text.len()
    );
    Ok(text)
}

/// The bytes `item` takes as an item of a list in the status document: a list item's YAML is
/// the same alone as inside the document (serde_yaml does not indent a sequence under a
/// mapping key).
fn size<T: Serialize>(item: &T) -> usize {
    serde_yaml::to_string(&[item]).map_or(usize::MAX, |t| t.len())
}

/// Write the status document into `name` (created when missing), cut to fit ([`bounded`]).
pub async fn write_status(api: &Api<ConfigMap>, name: &str, status: &Status) -> anyhow::Result<()> {
    let text = bounded(status)?;
    let patch = json!({ "data": { STATUS_KEY: text } });
    match api
        .patch(
            name,
            &crate::field_manager::patch(crate::field_manager::AUTOPILOT),
            &Patch::Merge(&patch),
        )
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
            api.create(
                &crate::field_manager::post(crate::field_manager::AUTOPILOT),
                &cm,
            )
            .await?;
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
    let note = cut_note(&decision.reason);
    Some(Event {
        type_,
        reason: reason.to_string(),
        action: event_action("Autopilot", &note),
        note: Some(note),
        secondary: None,
    })
}

/// `reason` within [`MAX_NOTE_BYTES`], cut at a character boundary and marked with `…`.
fn cut_note(reason: &str) -> String {
    if reason.len() <= MAX_NOTE_BYTES {
        return reason.to_string();
    }
    const MARK: &str = "…";
    let mut end = MAX_NOTE_BYTES - MARK.len();
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{MARK}", &reason[..end])
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

#[cfg(test)]
mod tests {
    use super::*;

    fn node(i: usize, action: Action) -> NodeStatus {
        NodeStatus {
            node: format!("gpu-node-{i:05}"),
            profile_key: format!("advised-gpu-node-{i:05}"),
            action,
            reason: "runs advised-gpu-node, the proposal".into(),
            pods: 3,
            pods_evicted: Vec::new(),
            instances_kept: 7,
            instances_destroyed: 0,
            instances_created: 0,
            mig_mode_changes: 0,
        }
    }

    fn status(nodes: Vec<NodeStatus>, unschedulable: usize) -> Status {
        Status {
            updated: "2026-12-04T08:00:00Z".into(),
            identity: "autopilot-0".into(),
            dry_run: false,
            max_changing_nodes: 1,
            changing_nodes: vec!["gpu-node-00001".into()],
            unschedulable: (0..unschedulable)
                .map(|i| Unschedulable {
                    pod: format!("serving/llm-{i}"),
                    reason: "no node has a GPU with 3 free MIG slices".into(),
                })
                .collect(),
            skipped: vec!["node cpu-1: not Ready (condition Ready is Unknown)".into()],
            nodes,
            truncated: None,
        }
    }

    /// 20,000 nodes and 10,000 unschedulable pods make a document of several MiB, which the API
    /// server would refuse (ConfigMap data over 1 MiB): it is cut, nodes with an action first.
    #[test]
    fn a_status_over_a_configmaps_limit_is_cut_with_a_note_keeping_actions_first() {
        let mut nodes: Vec<NodeStatus> = (0..20_000).map(|i| node(i, Action::Unchanged)).collect();
        nodes[1].action = Action::Applied;
        nodes[19_999].action = Action::BlockedPdb;
        let full = status(nodes, 10_000);
        assert!(serde_yaml::to_string(&full).unwrap().len() > 2 * MAX_STATUS_BYTES);
        let text = bounded(&full).unwrap();
        assert!(text.len() <= MAX_STATUS_BYTES, "{} bytes", text.len());
        let back: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
        let kept = back["nodes"].as_sequence().unwrap();
        let actions: Vec<&str> = kept.iter().map(|n| n["action"].as_str().unwrap()).collect();
        assert!(actions.contains(&"applied") && actions.contains(&"blocked-pdb"));
        let cut = &back["truncated"];
        assert!(cut["note"]
            .as_str()
            .unwrap()
            .contains("cut to fit a ConfigMap"));
        let left_out = cut["nodesLeftOut"].as_u64().unwrap() as usize;
        assert_eq!(kept.len() + left_out, 20_000);
        assert!(left_out > 0);
        let unschedulable = back["unschedulable"].as_sequence().unwrap().len();
        assert_eq!(
            unschedulable + cut["unschedulableLeftOut"].as_u64().unwrap() as usize,
            10_000
        );
        assert_eq!(back["changingNodes"][0].as_str(), Some("gpu-node-00001"));
    }

    #[test]
    fn a_status_within_the_limit_is_written_whole() {
        let small = status((0..10).map(|i| node(i, Action::Unchanged)).collect(), 2);
        let text = bounded(&small).unwrap();
        assert_eq!(text, serde_yaml::to_string(&small).unwrap());
        assert!(!text.contains("truncated"));
    }

    /// events.k8s.io/v1 caps a note at 1 kB (bytes); a reason of 600 two-byte characters is
    /// 1,200 bytes, which a cut at 1,000 characters would have sent whole.
    #[test]
    fn event_notes_stay_within_1_kib_cut_at_a_character_boundary() {
        let decision = Decision {
            node: "gpu-1".into(),
            profile_key: "advised-gpu-1".into(),
            action: Action::BlockedPdb,
            reason: "é".repeat(600),
            profile_text: String::new(),
            write_key: false,
            set_label: false,
            prediction: crate::agent::node::ExpectedEvictions {
                hash: String::new(),
                pods: Default::default(),
            },
            write_prediction: false,
        };
        let note = event_for(&decision).unwrap().note.unwrap();
        assert!(note.len() <= MAX_NOTE_BYTES, "{} bytes", note.len());
        assert!(note.ends_with('…') && note.starts_with("éé"));
        let short = Decision {
            reason: "profile p selected".into(),
            ..decision
        };
        assert_eq!(
            event_for(&short).unwrap().note.unwrap(),
            "profile p selected"
        );
    }
}
