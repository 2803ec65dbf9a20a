//! What the autopilot does with one round's advice, decided from what the API says now (pure):
//! which nodes get their proposal, which wait for the fleet drain budget, which a
//! PodDisruptionBudget blocks, which already run it.
//!
//! Stateless by design: a node is *changing* while its profile label names a profile its agent
//! has not settled yet (state label not `success` with the applied-hash of that key's text,
//! and not `failed`), or while it holds a fleet drain slot Lease. A restarted autopilot reads
//! the same labels, keys and Leases, so it resumes a rollout where the last one left it.

use std::collections::{BTreeMap, BTreeSet};

use kube::core::{Selector, SelectorExt};
use serde::Serialize;

use crate::advise::{Advice, NodeAdvice};
use crate::agent::node::{ExpectedEvictions, REASON_ANNOTATION as REASON};
use crate::agent::reconcile::content_hash;
use crate::profile::parse_profile;

/// What happens to one node this round (the status ConfigMap's `action`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Action {
    /// The proposal was written (ConfigMap key and/or node label).
    Applied,
    /// The proposal differs, but the budget of changing nodes is used up (or the node is
    /// still settling its previous change).
    WaitingBudget,
    /// Applying it would evict pods a PodDisruptionBudget protects beyond what it allows now.
    BlockedPdb,
    /// The node runs the proposal already.
    Unchanged,
    /// `--dry-run`: it would be applied this round.
    DryRun,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Applied => "applied",
            Action::WaitingBudget => "waiting-budget",
            Action::BlockedPdb => "blocked-pdb",
            Action::Unchanged => "unchanged",
            Action::DryRun => "dry-run",
        }
    }
}

/// A node as the API shows it now: the agent's labels and annotation.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeView {
    pub name: String,
    /// `gpu-share.dev/profile`.
    pub profile: Option<String>,
    /// `gpu-share.dev/profile.state`.
    pub state: Option<String>,
    /// `gpu-share.dev/profile.applied-hash`.
    pub applied_hash: Option<String>,
    /// `gpu-share.dev/expected-evictions`: the prediction written with the last proposal.
    pub expected: Option<ExpectedEvictions>,
}

impl NodeView {
    /// Whether the agent has finished with the profile its label names: `failed`, or
    /// `success` with the hash of that key's text now (a `success` left from the previous
    /// profile does not count). A node without the label has nothing to settle.
    pub fn settled(&self, profiles: &BTreeMap<String, String>) -> bool {
        let Some(key) = &self.profile else {
            return true;
        };
        match self.state.as_deref() {
            // `blocked`: the agent waits for a pod it may not evict; this round cannot help.
            Some("failed" | "blocked") => true,
            Some("success") => {
                let want = profiles.get(key).map(|t| content_hash(t));
                want.is_some() && self.applied_hash == want
            }
            _ => false,
        }
    }
}

/// A PodDisruptionBudget as the eviction API checks it.
#[derive(Debug, Clone)]
pub struct Budget {
    pub namespace: String,
    pub name: String,
    /// None: the PDB selects no pod (a null selector, as policy/v1 reads it).
    pub selector: Option<Selector>,
    pub disruptions_allowed: i32,
}

/// Everything one round decides from.
pub struct RolloutInput<'a> {
    pub advice: &'a Advice,
    /// Every node in the advice, by name.
    pub nodes: &'a BTreeMap<String, NodeView>,
    /// The profiles ConfigMap's keys.
    pub profiles: &'a BTreeMap<String, String>,
    /// Holders of fleet drain slot Leases (node names), lapsed ones left out.
    pub drain_holders: &'a BTreeSet<String>,
    /// `--max-concurrent-drains`.
    pub max_changing: u32,
    pub pdbs: &'a [Budget],
    /// Every pod's labels, by `namespace/name`.
    pub pod_labels: &'a BTreeMap<String, BTreeMap<String, String>>,
    /// `namespace/name` of the pods that are pending.
    pub pending: &'a BTreeSet<String>,
    /// Nodes whose current profile configures the GPUs exactly as their proposal would (same
    /// modes and resources, no instance changes): left alone.
    pub equivalent: &'a BTreeSet<String>,
    pub dry_run: bool,
}

/// The decision for one node.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub node: String,
    pub profile_key: String,
    pub action: Action,
    pub reason: String,
    /// The proposal as the ConfigMap holds it (YAML).
    pub profile_text: String,
    /// Write the ConfigMap key (its text differs from the proposal).
    pub write_key: bool,
    /// Point the node's label at the key.
    pub set_label: bool,
    /// The pods the proposal evicts, for the profile text as written: the agent drains no
    /// other pod for it (`ExpectedEvictions`).
    pub prediction: ExpectedEvictions,
    /// Write `prediction` on the node (it differs from the one there).
    pub write_prediction: bool,
}

/// The nodes changing now: labelled but not settled, or holding a drain slot.
pub fn changing(
    nodes: &BTreeMap<String, NodeView>,
    profiles: &BTreeMap<String, String>,
    drain_holders: &BTreeSet<String>,
) -> BTreeSet<String> {
    nodes
        .values()
        .filter(|n| !n.settled(profiles))
        .map(|n| n.name.clone())
        .chain(drain_holders.iter().cloned())
        .collect()
}

/// Decide every node of the advice. Nodes that place pending pods go first (most first),
/// then by name, so the budget serves waiting pods before tidying idle nodes.
pub fn decide(input: &RolloutInput<'_>) -> Vec<Decision> {
    let mut changing = changing(input.nodes, input.profiles, input.drain_holders);
    let mut order: Vec<&NodeAdvice> = input.advice.nodes.iter().collect();
    order.sort_by_key(|n| {
        let pending = n.pods.iter().filter(|p| input.pending.contains(*p)).count();
        (std::cmp::Reverse(pending), n.node.clone())
    });
    let mut decisions = Vec::new();
    for advice in order {
        let decision = decide_node(input, advice, &mut changing);
        decisions.push(decision);
    }
    decisions.sort_by(|a, b| a.node.cmp(&b.node));
    decisions
}

fn decide_node(
    input: &RolloutInput<'_>,
    advice: &NodeAdvice,
    changing: &mut BTreeSet<String>,
) -> Decision {
    let key = &advice.profile_key;
    let text = serde_yaml::to_string(&advice.profile).unwrap_or_default();
    let view = input.nodes.get(&advice.node).cloned().unwrap_or_default();
    let key_matches = input.profiles.get(key) == Some(&text);
    let prediction = ExpectedEvictions {
        hash: content_hash(&text),
        pods: advice.pods_evicted.iter().cloned().collect(),
    };
    let mut decision = Decision {
        node: advice.node.clone(),
        profile_key: key.clone(),
        action: Action::Unchanged,
        reason: String::new(),
        profile_text: text,
        write_key: !key_matches,
        set_label: view.profile.as_deref() != Some(key.as_str()),
        write_prediction: view.expected.as_ref() != Some(&prediction),
        prediction,
    };
    let equivalent = input.equivalent.contains(&advice.node);
    // The agent refused the drain of this very proposal: it would evict pods the prediction
    // left out (the devices-in-use annotation lagged). This round's prediction, made from what
    // the agent published since, is written; the proposal text itself may have changed too.
    let replan = view.state.as_deref() == Some("blocked")
        && view.profile.as_deref() == Some(key.as_str())
        && decision.write_prediction;
    if !replan {
        if let Some(why) = runs_it_already(&view, advice, input.profiles, key_matches, equivalent) {
            decision.reason = why;
            decision.write_key = false;
            decision.set_label = false;
            decision.write_prediction = false;
            return decision;
        }
    }
    if let Some(why) = blocked_by_pdb(advice, input.pdbs, input.pod_labels) {
        decision.action = Action::BlockedPdb;
        decision.reason = why;
        return decision;
    }
    if changing.contains(&advice.node) {
        decision.action = Action::WaitingBudget;
        decision.reason = format!(
            "still settling its previous change (state {})",
            view.state.as_deref().unwrap_or("not published yet")
        );
        return decision;
    }
    if changing.len() >= input.max_changing as usize {
        decision.action = Action::WaitingBudget;
        decision.reason = format!(
            "{} of {} changing node(s) in use: {}",
            changing.len(),
            input.max_changing,
            first_names(changing, SHOWN_NAMES)
        );
        return decision;
    }
    changing.insert(advice.node.clone());
    let what = match (decision.write_key, decision.set_label) {
        (true, true) => format!("profile {key} written and selected"),
        (true, false) => format!("profile {key} rewritten"),
        (false, true) => format!("profile {key} selected"),
        (false, false) => format!("profile {key}: evictions predicted again"),
    };
    let summary = format!(
        "{what}: {} pod(s) served, {} evicted, {} instance(s) destroyed, {} created",
        advice.pods.len(),
        advice.pods_evicted.len(),
        advice.instances_destroyed,
        advice.instances_created
    );
    if input.dry_run {
        decision.action = Action::DryRun;
        decision.reason = format!("would be applied: {summary}");
    } else {
        decision.action = Action::Applied;
        decision.reason = summary;
    }
    decision
}

/// How many node names a reason lists: every waiting node's reason names the changing ones,
/// and a fleet can have thousands, so the status document and the log stay linear in nodes.
pub const SHOWN_NAMES: usize = 10;

/// The first `shown` names, then how many more.
fn first_names(names: &BTreeSet<String>, shown: usize) -> String {
    let mut text = (names.iter().take(shown).cloned())
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > shown {
        text += &format!(" and {} more", names.len() - shown);
    }
    text
}

/// Why the node needs nothing: its label names the key and the key holds the proposal, or
/// the profile its label names is the proposal already (or plans the same: `equivalent`).
fn runs_it_already(
    view: &NodeView,
    advice: &NodeAdvice,
    profiles: &BTreeMap<String, String>,
    key_matches: bool,
    equivalent: bool,
) -> Option<String> {
    let Some(label) = view.profile.as_deref() else {
        return equivalent.then(|| {
            "has no profile, and the proposal leaves its GPUs whole and unshared as they are"
                .to_string()
        });
    };
    if label == advice.profile_key && key_matches {
        if view.state.as_deref() == Some("failed") {
            return Some(format!(
                "has {label}, the proposal, but its agent reports failed (the node's {REASON})"
            ));
        }
        if !view.settled(profiles) {
            return Some(format!(
                "has {label}, the proposal, not settled yet (state {})",
                view.state.as_deref().unwrap_or("not published yet")
            ));
        }
        return Some(format!("runs {label}, the proposal"));
    }
    if label == advice.profile_key {
        return None;
    }
    if equivalent {
        return Some(format!(
            "its profile {label} configures the GPUs as the proposal would"
        ));
    }
    let current = parse_profile(label, profiles.get(label)?).ok()?;
    (current == advice.profile).then(|| format!("its profile {label} is the proposal already"))
}

/// A PDB that would refuse the evictions the proposal needs: more of its pods evicted than its
/// `status.disruptionsAllowed`.
fn blocked_by_pdb(
    advice: &NodeAdvice,
    pdbs: &[Budget],
    pod_labels: &BTreeMap<String, BTreeMap<String, String>>,
) -> Option<String> {
    let mut blocked = Vec::new();
    for pdb in pdbs {
        let Some(selector) = &pdb.selector else {
            continue;
        };
        let evicted: Vec<&String> = advice
            .pods_evicted
            .iter()
            .filter(|id| id.split_once('/').map(|(ns, _)| ns) == Some(pdb.namespace.as_str()))
            .filter(|id| pod_labels.get(*id).is_some_and(|l| selector.matches(l)))
            .collect();
        if evicted.len() as i64 > i64::from(pdb.disruptions_allowed.max(0)) {
            blocked.push(format!(
                "PodDisruptionBudget {}/{} allows {} disruption(s) now; the proposal would evict {} of its pods ({})",
                pdb.namespace,
                pdb.name,
                pdb.disruptions_allowed.max(0),
                evicted.len(),
                evicted.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
            ));
        }
    }
    (!blocked.is_empty()).then(|| blocked.join("; "))
}

#[cfg(test)]
#[path = "rollout_tests.rs"]
mod tests;
