//! One autopilot round: read the cluster, advise, decide ([`super::rollout`]), write what was
//! decided through the existing path (profiles ConfigMap key, node label; never in dry-run),
//! then publish Events and the status ConfigMap.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::Context;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, Patch};
use kube::core::Selector;
use kube::runtime::events::Recorder;
use serde_json::json;
use tracing::{info, warn};

use super::leader::{holder, Holder};
use super::publish::{self, NodeStatus, Status};
use super::rollout::{self, Action, Budget, Decision, NodeView, RolloutInput};
use crate::advise::live::{self, Cluster};
use crate::advise::{self, Phase};
use crate::agent::lease::SLOT_PREFIX;
use crate::agent::node::{
    annotation, label, APPLIED_HASH_ANNOTATION, EXPECTED_EVICTIONS_ANNOTATION, PROFILE_LABEL,
    STATE_LABEL,
};
use crate::plan::plan_for;
use crate::sharing::{PlannedMode, PluginKind};

/// The opt-in label: only nodes with it are supply the autopilot may change.
pub const OPT_IN_LABEL: &str = "gpu-share.dev/autopilot";
pub const OPT_IN_SELECTOR: &str = "gpu-share.dev/autopilot=enabled";

/// What a round needs to know, from the flags.
#[derive(Debug, Clone)]
pub struct Settings {
    pub namespace: String,
    pub configmap: String,
    pub status_configmap: String,
    pub identity: String,
    /// `--plugin`; none: the plugin the nodes' agents run ([`plugin_the_agents_run`]).
    pub plugin: Option<PluginKind>,
    pub max_changing: u32,
    pub dry_run: bool,
}

/// A round's clients.
pub struct Round {
    pub client: kube::Client,
    pub recorder: Recorder,
    pub settings: Settings,
}

/// What a round saw: the cluster, the advice for it, and what the decisions need.
struct Observed {
    cluster: Cluster,
    advice: advise::Advice,
    nodes: BTreeMap<String, NodeView>,
    equivalent: BTreeSet<String>,
    pdbs: Vec<Budget>,
    drain_holders: BTreeSet<String>,
    pod_labels: BTreeMap<String, BTreeMap<String, String>>,
    pending: BTreeSet<String>,
    /// Nodes left out of the supply and pods left out of the demand, each with why.
    left_out: Vec<String>,
    /// The device plugin the round planned for.
    plugin: PluginKind,
}

impl Round {
    /// Run one round: observe, decide, act (not in dry-run), publish; the status published.
    pub async fn run(&self) -> anyhow::Result<Status> {
        let started = std::time::Instant::now();
        let seen = self.observe().await?;
        let mut decisions = self.decide(&seen);
        self.act(&mut decisions).await;
        let status = self.publish(&seen, &decisions).await?;
        // Rounds run on changes only: each says what it left out (also in the status).
        for why in &seen.left_out {
            info!(%why, "left out of the round");
        }
        let count = |a: Action| decisions.iter().filter(|d| d.action == a).count();
        info!(
            round_ms = started.elapsed().as_millis() as u64,
            nodes = decisions.len(),
            pending_pods = seen.pending.len(),
            unschedulable = seen.advice.unschedulable.len(),
            applied = count(Action::Applied),
            waiting = count(Action::WaitingBudget),
            blocked = count(Action::BlockedPdb),
            plugin = %seen.plugin.name(),
            "round done"
        );
        Ok(status)
    }

    async fn observe(&self) -> anyhow::Result<Observed> {
        let s = &self.settings;
        let cluster = live::read_cluster(
            &self.client,
            &s.namespace,
            &s.configmap,
            Some(OPT_IN_SELECTOR),
        )
        .await
        .context("cannot read pods, nodes or the profiles ConfigMap")?;
        let pdbs = self.budgets().await?;
        let drain_holders = self.drain_holders().await?;
        let plugin = s
            .plugin
            .unwrap_or_else(|| plugin_the_agents_run(&cluster.nodes));
        // Advising is CPU work, seconds for thousands of nodes and pending pods
        // (docs/autopilot.md, "Bounds"). The runtime has one thread: run there, it would stop
        // the Lease renewal, and a round longer than the Lease would let a second replica lead.
        tokio::task::spawn_blocking(move || advised(cluster, plugin, pdbs, drain_holders))
            .await
            .context("the advise task failed")?
    }

    fn decide(&self, seen: &Observed) -> Vec<Decision> {
        rollout::decide(&RolloutInput {
            advice: &seen.advice,
            nodes: &seen.nodes,
            profiles: &seen.cluster.profiles,
            drain_holders: &seen.drain_holders,
            max_changing: self.settings.max_changing,
            pdbs: &seen.pdbs,
            pod_labels: &seen.pod_labels,
            pending: &seen.pending,
            equivalent: &seen.equivalent,
            dry_run: self.settings.dry_run,
        })
    }

    /// Write the applied decisions; one that cannot be written waits for the next round, with
    /// the error as its reason. Dry-run decisions are never `Applied`, so nothing is written.
    async fn act(&self, decisions: &mut [Decision]) {
        for decision in decisions.iter_mut().filter(|d| d.action == Action::Applied) {
            if let Err(e) = self.write(decision).await {
                warn!(node = %decision.node, error = format!("{e:#}"), "could not apply the proposal");
                decision.action = Action::WaitingBudget;
                decision.reason =
                    format!("could not write the proposal (retried next round): {e:#}");
            }
        }
    }

    /// Events on the nodes, then the status ConfigMap.
    async fn publish(&self, seen: &Observed, decisions: &[Decision]) -> anyhow::Result<Status> {
        let s = &self.settings;
        let by_name: BTreeMap<&str, &Node> = (seen.cluster.nodes.iter())
            .filter_map(|n| Some((n.metadata.name.as_deref()?, n)))
            .collect();
        for decision in decisions {
            if let Some(node) = by_name.get(decision.node.as_str()) {
                publish::event(&self.recorder, node, decision).await;
            }
            if decision.action != Action::Unchanged {
                info!(node = %decision.node, action = decision.action.as_str(), reason = %decision.reason, "autopilot");
            }
        }
        let status = self.status(seen, decisions);
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &s.namespace);
        publish::write_status(&api, &s.status_configmap, &status)
            .await
            .with_context(|| format!("cannot write the status ConfigMap {}", s.status_configmap))?;
        Ok(status)
    }

    /// Apply a decision: the prediction of its evictions first (the agent checks its drain
    /// against it as soon as it sees the new text), then the ConfigMap key (the agent reads it
    /// when the label moves), then the label. Nothing else on the Node or the ConfigMap is
    /// touched.
    async fn write(&self, decision: &Decision) -> anyhow::Result<()> {
        let s = &self.settings;
        if decision.write_prediction || decision.write_key || decision.set_label {
            let api: Api<Node> = Api::all(self.client.clone());
            let prediction = serde_json::to_string(&decision.prediction)?;
            let patch = json!({ "metadata": { "annotations": {
                EXPECTED_EVICTIONS_ANNOTATION: prediction } } });
            api.patch(
                &decision.node,
                &crate::field_manager::patch(crate::field_manager::AUTOPILOT),
                &Patch::Merge(&patch),
            )
            .await
            .with_context(|| {
                format!(
                    "node {} annotation {EXPECTED_EVICTIONS_ANNOTATION}",
                    decision.node
                )
            })?;
        }
        if decision.write_key {
            let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &s.namespace);
            let patch = json!({ "data": { &decision.profile_key: &decision.profile_text } });
            api.patch(
                &s.configmap,
                &crate::field_manager::patch(crate::field_manager::AUTOPILOT),
                &Patch::Merge(&patch),
            )
            .await
            .with_context(|| {
                format!(
                    "ConfigMap {}/{} key {}",
                    s.namespace, s.configmap, decision.profile_key
                )
            })?;
        }
        if decision.set_label {
            let api: Api<Node> = Api::all(self.client.clone());
            let patch =
                json!({ "metadata": { "labels": { PROFILE_LABEL: &decision.profile_key } } });
            api.patch(
                &decision.node,
                &crate::field_manager::patch(crate::field_manager::AUTOPILOT),
                &Patch::Merge(&patch),
            )
            .await
            .with_context(|| format!("node {} label {PROFILE_LABEL}", decision.node))?;
        }
        Ok(())
    }

    /// Every PodDisruptionBudget, as the eviction API would judge it now.
    async fn budgets(&self) -> anyhow::Result<Vec<Budget>> {
        let api: Api<PodDisruptionBudget> = Api::all(self.client.clone());
        let list = api
            .list(&ListParams::default())
            .await
            .context("cannot list PodDisruptionBudgets")?;
        Ok(list.items.iter().map(budget).collect())
    }

    /// Nodes holding a fleet drain slot now (lapsed holders left out).
    async fn drain_holders(&self) -> anyhow::Result<BTreeSet<String>> {
        let api: Api<Lease> = Api::namespaced(self.client.clone(), &self.settings.namespace);
        let list = api
            .list(&ListParams::default())
            .await
            .context("cannot list the drain slot Leases")?;
        let now = Timestamp::now();
        let default = std::time::Duration::from_secs(60);
        Ok(list
            .items
            .iter()
            .filter(|l| {
                l.metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.starts_with(SLOT_PREFIX))
            })
            .filter_map(|l| match holder(l, "", now, default) {
                Holder::Other(h) => Some(h),
                _ => None,
            })
            .collect())
    }

    fn status(&self, seen: &Observed, decisions: &[Decision]) -> Status {
        let s = &self.settings;
        let mut changing =
            rollout::changing(&seen.nodes, &seen.cluster.profiles, &seen.drain_holders);
        changing.extend(
            decisions
                .iter()
                .filter(|d| d.action == Action::Applied)
                .map(|d| d.node.clone()),
        );
        let advice: BTreeMap<&str, &advise::NodeAdvice> = (seen.advice.nodes.iter())
            .map(|a| (a.node.as_str(), a))
            .collect();
        Status {
            updated: Timestamp::now().to_string(),
            identity: s.identity.clone(),
            dry_run: s.dry_run,
            max_changing_nodes: s.max_changing,
            changing_nodes: changing.into_iter().collect(),
            unschedulable: seen.advice.unschedulable.clone(),
            skipped: seen.left_out.clone(),
            truncated: None,
            nodes: decisions
                .iter()
                .filter_map(|d| Some(NodeStatus::new(d, advice.get(d.node.as_str())?)))
                .collect(),
        }
    }
}

/// What a round saw, advised: the pure part of [`Round::observe`].
fn advised(
    cluster: Cluster,
    plugin: PluginKind,
    pdbs: Vec<Budget>,
    drain_holders: BTreeSet<String>,
) -> anyhow::Result<Observed> {
    let mut input = live::from_cluster(&cluster, plugin);
    let mut left_out = std::mem::take(&mut input.skipped);
    left_out.extend(drop_unservable_pods(&mut input.demand));
    let advice = advise::advise(&input.demand, &input.supply, plugin)
        .map_err(|errors| anyhow::anyhow!("advise refused its input: {}", errors.join("; ")))?;
    let pending = input
        .demand
        .pods
        .iter()
        .filter(|p| p.phase == Phase::Pending)
        .map(|p| p.id())
        .collect();
    Ok(Observed {
        equivalent: equivalent_nodes(&input.supply, &advice, plugin),
        nodes: node_views(&cluster),
        pdbs,
        drain_holders,
        pod_labels: pod_labels(&cluster),
        pending,
        left_out,
        advice,
        cluster,
        plugin,
    })
}

/// The device plugin the agents run, as each publishes it on its node
/// ([`crate::published::PLUGIN_LABEL`]): the one most nodes name (ties: nvidia, then builtin),
/// nvidia where none names one the autopilot plans for. Nodes that run another are then left
/// out of the round with the reason ([`live::from_cluster`]).
pub fn plugin_the_agents_run(nodes: &[Node]) -> PluginKind {
    use crate::published::{label, PLUGIN_LABEL};
    let named = |kind: PluginKind| {
        nodes
            .iter()
            .filter(|n| label(n, PLUGIN_LABEL) == Some(kind.name()))
            .count()
    };
    let (nvidia, builtin) = (named(PluginKind::Nvidia), named(PluginKind::Builtin));
    if builtin > nvidia {
        PluginKind::Builtin
    } else {
        PluginKind::Nvidia
    }
}

/// Nodes whose current profile configures the GPUs as the proposal would: no instance created
/// or destroyed, no MIG mode change, the same mode per GPU (instances, replicas, MPS settings)
/// and the same advertised resources. Relabelling them would change nothing but the label (and
/// make the agent re-apply), so a hand-written profile that already serves the demand stays.
/// A node without a profile whose GPUs are whole and unshared is equivalent to a proposal that
/// leaves every GPU whole and unshared (what advise proposes for an idle node): without a label
/// the agent writes nothing and the device plugin advertises whole GPUs, as that proposal would.
fn equivalent_nodes(
    supply: &advise::Supply,
    advice: &advise::Advice,
    plugin: PluginKind,
) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for node in &supply.nodes {
        let Some(proposal) = advice.nodes.iter().find(|a| a.node == node.name) else {
            continue;
        };
        if proposal.instances_created + proposal.instances_destroyed + proposal.mig_mode_changes > 0
        {
            continue;
        }
        let Ok(now) = node.now(plugin) else { continue };
        let Ok(proposed) = plan_for(
            &proposal.profile_key,
            &proposal.profile,
            &now.observed,
            plugin,
        ) else {
            continue;
        };
        let modes = |p: &crate::plan::NodePlan| -> Vec<_> {
            p.gpus.iter().map(|g| g.mode.clone()).collect()
        };
        let same = match (&node.profile_name, &node.profile) {
            (Some(name), Some(profile)) => plan_for(name, profile, &now.observed, plugin)
                .is_ok_and(|current| {
                    modes(&current) == modes(&proposed) && current.resources == proposed.resources
                }),
            (None, None) => {
                let whole = |m: &PlannedMode| *m == PlannedMode::Exclusive;
                now.modes.iter().all(whole) && proposed.gpus.iter().all(|g| whole(&g.mode))
            }
            _ => false,
        };
        if same {
            out.insert(node.name.clone());
        }
    }
    out
}

/// Pods whose requests advise cannot serve (an unknown isolation, two GPU resources) are left
/// out, each with advise's reason, so one odd pod does not stop the autopilot.
fn drop_unservable_pods(demand: &mut advise::Demand) -> Vec<String> {
    let mut refused = Vec::new();
    demand.pods.retain(|p| match p.need() {
        Ok(_) => true,
        Err(e) => {
            refused.push(e.to_string());
            false
        }
    });
    refused
}

fn node_views(cluster: &Cluster) -> BTreeMap<String, NodeView> {
    cluster
        .nodes
        .iter()
        .filter_map(|n| {
            let name = n.metadata.name.clone()?;
            let view = NodeView {
                name: name.clone(),
                profile: label(n, PROFILE_LABEL).map(str::to_string),
                state: label(n, STATE_LABEL).map(str::to_string),
                applied_hash: annotation(n, APPLIED_HASH_ANNOTATION).map(str::to_string),
                expected: annotation(n, EXPECTED_EVICTIONS_ANNOTATION)
                    .and_then(|t| serde_json::from_str(t).ok()),
            };
            Some((name, view))
        })
        .collect()
}

fn pod_labels(cluster: &Cluster) -> BTreeMap<String, BTreeMap<String, String>> {
    cluster
        .pods
        .iter()
        .map(|p| {
            let id = format!(
                "{}/{}",
                p.metadata.namespace.as_deref().unwrap_or("default"),
                p.metadata.name.as_deref().unwrap_or_default()
            );
            (id, p.metadata.labels.clone().unwrap_or_default())
        })
        .collect()
}

/// A PDB as the eviction API reads it: a null selector selects nothing; a selector that cannot
/// be read is taken as selecting every pod of the namespace (the careful side); no status yet
/// means no disruption allowed.
fn budget(pdb: &PodDisruptionBudget) -> Budget {
    let selector = pdb
        .spec
        .as_ref()
        .and_then(|s| s.selector.clone())
        .map(|s| Selector::try_from(s).unwrap_or_default());
    Budget {
        namespace: pdb.metadata.namespace.clone().unwrap_or_default(),
        name: pdb.metadata.name.clone().unwrap_or_default(),
        selector,
        disruptions_allowed: pdb.status.as_ref().map_or(0, |s| s.disruptions_allowed),
    }
}

#[cfg(test)]
mod tests {
    use super::equivalent_nodes;
    use crate::advise::{self, parse, Demand, Supply};
    use crate::sharing::PluginKind;

    fn equivalent(demand: &str) -> Vec<String> {
        let supply: Supply =
            parse("supply", "nodes: [{name: idle, gpus: [h100x2]}]").expect("supply");
        let demand: Demand = parse("demand", demand).expect("demand");
        let advice = advise::advise(&demand, &supply, PluginKind::Nvidia).expect("advice");
        equivalent_nodes(&supply, &advice, PluginKind::Nvidia)
            .into_iter()
            .collect()
    }

    /// An idle node without a profile: advise proposes every GPU whole and exclusive, which is
    /// what the node does without a label, so it is equivalent; a pending MIG pod makes the
    /// proposal turn MIG on, which is a change.
    #[test]
    fn an_idle_unlabelled_node_is_equivalent_to_an_all_exclusive_proposal() {
        assert_eq!(equivalent("pods: []"), ["idle"]);
        let mig_pod = "pods: [{name: p, phase: pending, requests: {nvidia.com/mig-1g.10gb: 1}}]";
        assert!(equivalent(mig_pod).is_empty());
    }

    fn node_running(plugin: Option<&str>) -> k8s_openapi::api::core::v1::Node {
        let mut node = k8s_openapi::api::core::v1::Node::default();
        node.metadata.labels = plugin.map(|p| {
            [(crate::published::PLUGIN_LABEL.to_string(), p.to_string())]
                .into_iter()
                .collect()
        });
        node
    }

    /// With no --plugin the autopilot plans for the plugin the agents publish: the majority's,
    /// nvidia on a tie or where none publishes one it plans for (dra nodes do not count).
    #[test]
    fn the_plugin_followed_is_the_one_most_agents_run() {
        use super::plugin_the_agents_run as follow;
        let nodes =
            |names: &[Option<&str>]| names.iter().map(|p| node_running(*p)).collect::<Vec<_>>();
        assert_eq!(follow(&[]), PluginKind::Nvidia);
        assert_eq!(follow(&nodes(&[None, None])), PluginKind::Nvidia);
        assert_eq!(
            follow(&nodes(&[Some("builtin"), None])),
            PluginKind::Builtin
        );
        assert_eq!(
            follow(&nodes(&[Some("builtin"), Some("nvidia")])),
            PluginKind::Nvidia
        );
        let two_builtin = [Some("builtin"), Some("nvidia"), Some("builtin")];
        assert_eq!(follow(&nodes(&two_builtin)), PluginKind::Builtin);
        assert_eq!(
            follow(&nodes(&[Some("dra"), Some("dra")])),
            PluginKind::Nvidia
        );
    }
}
