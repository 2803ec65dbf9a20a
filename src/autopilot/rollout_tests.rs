//! The rollout decisions, one rule per test: budget, settling, PDBs, unchanged, dry-run, order.

use super::*;
use crate::advise::proposal::Totals;
use crate::profile::Profile;
use crate::sharing::PluginKind;

const MIG_3G: &str = "version: v1\nrules:\n- devices: all\n  mig: {3g.40gb: 2}\n";
const MIG_1G: &str = "version: v1\nrules:\n- devices: all\n  mig: {1g.10gb: 7}\n";

fn profile(text: &str) -> Profile {
    parse_profile("t", text).unwrap()
}

fn node_advice(node: &str, text: &str, pods: &[&str], evicted: &[&str]) -> NodeAdvice {
    NodeAdvice {
        node: node.into(),
        profile_key: crate::advise::profile_key(node),
        profile: profile(text),
        pods: pods.iter().map(|p| p.to_string()).collect(),
        pods_evicted: evicted.iter().map(|p| p.to_string()).collect(),
        instances_kept: 0,
        instances_destroyed: 0,
        instances_created: 2,
        mig_mode_changes: 1,
        gpus_used: vec![0],
        gpus_idle: vec![],
        stranded_memory_gib: 0.0,
        resources: BTreeMap::new(),
        problems: vec![],
    }
}

fn advice(nodes: Vec<NodeAdvice>) -> Advice {
    Advice {
        plugin: PluginKind::Builtin,
        nodes,
        unschedulable: vec![],
        totals: Totals::default(),
    }
}

fn view(name: &str, profile: Option<&str>, state: Option<&str>, hash: Option<&str>) -> NodeView {
    NodeView {
        name: name.into(),
        profile: profile.map(str::to_string),
        state: state.map(str::to_string),
        applied_hash: hash.map(str::to_string),
        expected: None,
    }
}

/// The decision inputs, with defaults a test changes.
struct World {
    advice: Advice,
    nodes: BTreeMap<String, NodeView>,
    profiles: BTreeMap<String, String>,
    drain_holders: BTreeSet<String>,
    max: u32,
    pdbs: Vec<Budget>,
    pod_labels: BTreeMap<String, BTreeMap<String, String>>,
    pending: BTreeSet<String>,
    equivalent: BTreeSet<String>,
    dry_run: bool,
}

impl World {
    /// Two fresh nodes, each proposed 2×3g.40gb for two pending pods.
    fn two_fresh_nodes() -> Self {
        let pending = ["ml/a", "ml/b", "ml/c", "ml/d"];
        World {
            advice: advice(vec![
                node_advice("n1", MIG_3G, &pending[..2], &[]),
                node_advice("n2", MIG_3G, &pending[2..], &[]),
            ]),
            nodes: ["n1", "n2"]
                .iter()
                .map(|n| (n.to_string(), view(n, None, None, None)))
                .collect(),
            profiles: BTreeMap::new(),
            drain_holders: BTreeSet::new(),
            max: 1,
            pdbs: vec![],
            pod_labels: BTreeMap::new(),
            pending: pending.iter().map(|p| p.to_string()).collect(),
            equivalent: BTreeSet::new(),
            dry_run: false,
        }
    }

    fn decide(&self) -> Vec<Decision> {
        decide(&RolloutInput {
            advice: &self.advice,
            nodes: &self.nodes,
            profiles: &self.profiles,
            drain_holders: &self.drain_holders,
            max_changing: self.max,
            pdbs: &self.pdbs,
            pod_labels: &self.pod_labels,
            pending: &self.pending,
            equivalent: &self.equivalent,
            dry_run: self.dry_run,
        })
    }

    /// As the autopilot writes it and the agent then reports it: the key holds the proposal,
    /// the label names it, and the state is `state` (with the key's hash on success).
    fn applied(&mut self, node: &str, state: &str) {
        let key = crate::advise::profile_key(node);
        let text = serde_yaml::to_string(&profile(MIG_3G)).unwrap();
        let hash = (state == "success").then(|| content_hash(&text));
        self.profiles.insert(key.clone(), text);
        self.nodes.insert(
            node.into(),
            view(node, Some(&key), Some(state), hash.as_deref()),
        );
    }
}

fn actions(decisions: &[Decision]) -> Vec<(&str, Action)> {
    decisions
        .iter()
        .map(|d| (d.node.as_str(), d.action))
        .collect()
}

#[test]
fn never_more_nodes_changing_than_the_budget() {
    let mut world = World::two_fresh_nodes();
    let d = world.decide();
    assert_eq!(
        actions(&d),
        [("n1", Action::Applied), ("n2", Action::WaitingBudget)]
    );
    assert!(d[0].write_key && d[0].set_label);
    assert!(
        d[1].reason.contains("1 of 1 changing node(s) in use: n1"),
        "{}",
        d[1].reason
    );
    world.max = 2;
    assert_eq!(
        actions(&world.decide()),
        [("n1", Action::Applied), ("n2", Action::Applied)]
    );
}

#[test]
fn the_next_node_waits_until_the_first_settles_with_the_new_profile() {
    let mut world = World::two_fresh_nodes();
    // Relabelled, the agent has not answered yet: a `success` from the old profile (another
    // hash) does not count as settled.
    world.applied("n1", "success");
    world.nodes.get_mut("n1").unwrap().applied_hash = Some("old".into());
    assert_eq!(
        actions(&world.decide()),
        [("n1", Action::Unchanged), ("n2", Action::WaitingBudget)],
        "n1 is given the proposal already but has not settled it: n2 waits for the budget"
    );
    assert!(
        world.decide()[0].reason.contains("not settled yet"),
        "{:?}",
        world.decide()[0]
    );
    for state in ["pending", "draining", "applying"] {
        world.applied("n1", state);
        assert_eq!(world.decide()[1].action, Action::WaitingBudget, "{state}");
    }
    world.applied("n1", "success");
    assert_eq!(
        actions(&world.decide()),
        [("n1", Action::Unchanged), ("n2", Action::Applied)]
    );
    world.applied("n1", "failed");
    let d = world.decide();
    assert_eq!(d[1].action, Action::Applied, "failed is settled");
    assert_eq!(
        d[0].action,
        Action::Unchanged,
        "a failed proposal is not retried in a loop"
    );
    assert!(
        d[0].reason
            .contains("its agent reports failed (the node's gpu-share.dev/profile.reason)"),
        "{}",
        d[0].reason
    );
}

#[test]
fn drain_slot_holders_count_against_the_budget() {
    let mut world = World::two_fresh_nodes();
    world.drain_holders.insert("other-node".into());
    let d = world.decide();
    assert_eq!(
        actions(&d),
        [("n1", Action::WaitingBudget), ("n2", Action::WaitingBudget)]
    );
    assert!(d[0].reason.contains("other-node"), "{}", d[0].reason);
}

#[test]
fn a_pdb_that_allows_fewer_disruptions_than_the_evictions_blocks_the_node() {
    let mut world = World::two_fresh_nodes();
    world.advice.nodes[0].pods_evicted = vec!["ml/web-0".into(), "ml/web-1".into()];
    for p in ["ml/web-0", "ml/web-1", "other/web-2"] {
        world
            .pod_labels
            .insert(p.into(), BTreeMap::from([("app".into(), "web".into())]));
    }
    let budget = |ns: &str, allowed: i32| Budget {
        namespace: ns.into(),
        name: "web".into(),
        selector: Some(Selector::from_iter([(
            "app".to_string(),
            "web".to_string(),
        )])),
        disruptions_allowed: allowed,
    };
    world.pdbs = vec![budget("ml", 1)];
    let d = world.decide();
    assert_eq!(
        actions(&d),
        [("n1", Action::BlockedPdb), ("n2", Action::Applied)],
        "the blocked node takes no budget: the next one goes"
    );
    assert!(
        d[0].reason.contains(
            "PodDisruptionBudget ml/web allows 1 disruption(s) now; the proposal would evict 2 of its pods (ml/web-0, ml/web-1)"
        ),
        "{}",
        d[0].reason
    );
    world.pdbs = vec![budget("ml", 2)];
    assert_eq!(world.decide()[0].action, Action::Applied);
    // A PDB in another namespace, or one selecting nothing, does not count.
    world.pdbs = vec![budget("other", 0)];
    assert_eq!(world.decide()[0].action, Action::Applied);
    world.pdbs = vec![Budget {
        selector: None,
        ..budget("ml", 0)
    }];
    assert_eq!(world.decide()[0].action, Action::Applied);
}

#[test]
fn a_node_whose_own_profile_is_the_proposal_is_left_alone() {
    let mut world = World::two_fresh_nodes();
    world.profiles.insert("hand".into(), MIG_3G.into());
    world.profiles.insert("other".into(), MIG_1G.into());
    world.nodes.insert(
        "n1".into(),
        view(
            "n1",
            Some("hand"),
            Some("success"),
            Some(&content_hash(MIG_3G)),
        ),
    );
    world.nodes.insert(
        "n2".into(),
        view(
            "n2",
            Some("other"),
            Some("success"),
            Some(&content_hash(MIG_1G)),
        ),
    );
    let d = world.decide();
    assert_eq!(
        actions(&d),
        [("n1", Action::Unchanged), ("n2", Action::Applied)]
    );
    assert!(!d[0].write_key && !d[0].set_label);
    assert!(d[0]
        .reason
        .contains("its profile hand is the proposal already"));
    // A profile written differently that plans the same (the round finds it so) stays too.
    world.equivalent.insert("n2".into());
    let d = world.decide();
    assert_eq!(d[1].action, Action::Unchanged);
    assert!(
        d[1].reason
            .contains("its profile other configures the GPUs as the proposal would"),
        "{}",
        d[1].reason
    );
}

#[test]
fn a_changed_proposal_for_the_same_key_rewrites_only_the_key() {
    let mut world = World::two_fresh_nodes();
    world.applied("n1", "success");
    world.advice.nodes[0].profile = profile(MIG_1G);
    let d = world.decide();
    assert_eq!(d[0].action, Action::Applied);
    assert!(d[0].write_key && !d[0].set_label, "{:?}", d[0]);
}

#[test]
fn dry_run_reports_what_this_round_would_do() {
    let mut world = World::two_fresh_nodes();
    world.dry_run = true;
    let d = world.decide();
    assert_eq!(
        actions(&d),
        [("n1", Action::DryRun), ("n2", Action::WaitingBudget)]
    );
    assert!(d[0]
        .reason
        .starts_with("would be applied: profile advised-n1 written and selected"));
}

#[test]
fn nodes_placing_pending_pods_go_before_idle_ones() {
    let mut world = World::two_fresh_nodes();
    // n1 serves no pending pod now; n2 serves all four.
    world.advice.nodes[0].pods.clear();
    world.advice.nodes[1].pods = world.pending.iter().cloned().collect();
    assert_eq!(
        actions(&world.decide()),
        [("n1", Action::WaitingBudget), ("n2", Action::Applied)]
    );
}

/// A node without a profile that the round finds equivalent (idle, GPUs whole, the proposal
/// leaves them whole) is not labelled: before, `runs_it_already` needed a label, so every idle
/// opted-in node was relabelled to an all-exclusive `advised-<node>` for nothing.
#[test]
fn an_unlabelled_node_the_proposal_leaves_as_it_is_is_not_labelled() {
    let mut world = World::two_fresh_nodes();
    world.equivalent.insert("n1".into());
    let d = world.decide();
    assert_eq!(
        actions(&d),
        [("n1", Action::Unchanged), ("n2", Action::Applied)]
    );
    assert!(!d[0].write_key && !d[0].set_label, "{:?}", d[0]);
    assert!(d[0].reason.contains("has no profile"), "{}", d[0].reason);
}
