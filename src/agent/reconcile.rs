//! One reconcile: make this node match the profile its label names, safely.
//!
//! profile → observe → plan (pure) → if the MIG layout changes: `pending`, a fleet drain slot,
//! cordon (remembering that we did), `draining` (only the pods on the instances that change),
//! `applying` (MIG, MPS, plugin config, verify), the node advertising the plan, uncordon,
//! `success`. A plan without MIG change is applied at once, without cordon, eviction or a Node
//! write first (the plugin config is what the user waits for), then `success`; `applying` is
//! published only if it runs past 20 ms (MPS daemons starting). Such a change the watch brought is
//! planned against the Node the watch delivered and the GPUs as last read, confirmed by a fresh
//! NVML read before `success` (see `plan_inventory`). Any failure: `failed` with the reason, an
//! Event, the node uncordoned if we cordoned it, and nothing changed on the GPUs when the profile
//! or geometry is invalid. A reconcile without a MIG change also lifts a cordon of ours left
//! behind; a Node write (state, uncordon) that fails fails the reconcile with `ApiError` instead of
//! publishing `success` (which would claim a schedulable node), so the retry puts it right. The
//! state dir is checked before the drain slot and the cordon.
//!
//! One plan per reconcile, read top-down in [`Reconciler::make_match`]: the label's text is
//! parsed and validated once ([`ValidProfile`]); `plan_inventory` plans it on the GPUs (the
//! last inventory, or fresh reads); that plan decides the path, names the holders to drain
//! (`reallocated`) and the devices to withdraw (`withdraw_going_away`), and is the one the
//! apply carries out when it needs no MIG step ([`crate::apply::apply_decided`]). The profile
//! is planned again, never validated again, only where the hardware may have moved: after a
//! drain (on fresh reads), after MIG steps (`verify`), and to confirm a plan made from memory
//! (`still_no_mig_step`).

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, ObjectReference, Pod};
use kube::api::{DeleteParams, ListParams};
use kube::runtime::events::{EventType, Recorder};
use kube::Api;
use tracing::{info, info_span, warn, Instrument};

use super::advertisement::Held;
use super::drain::{drain, Disturbed, DrainError, DrainSettings};
use super::lease::{DrainSlot, DrainSlots};
use super::metrics::Metrics;
use super::node::{self, State};
use super::outcome::{failed, invalid, Outcome, Reason};
use super::pods::{disturbed_devices, disturbed_processes};
use crate::apply::{apply_decided, check_state_dir, ApplyError, ApplyOptions, Decided};
use crate::builtin_plugin::{Inventory, PluginManager};
use crate::gpu::{Gpus, SharedGpus};
use crate::kubelet::pod_resources::holders_of;
use crate::plan::{steps, NodePlan, ObservedNode, Step, ValidProfile};
use crate::profile::{parse_profile, PluginOptions};

/// How long the kubelet's PodResources `List` may take before the drain goes on without it.
pub(super) const KUBELET_TIMEOUT: Duration = Duration::from_secs(10);

/// An apply without MIG steps that takes longer than this (MPS daemons starting, a compute-mode
/// change) is announced as `applying` while it runs. A plugin-config rewrite takes well under a
/// millisecond: it goes straight to `success`, so the user's wait is not a Node write longer.
const APPLYING_AFTER: Duration = Duration::from_millis(20);

/// What the labels and the ConfigMap ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Desired {
    /// No profile label: leave the GPUs alone.
    Nothing,
    /// The label names a key the ConfigMap lacks (or the ConfigMap is missing).
    MissingKey { key: String },
    /// The label's key and its profile text.
    Profile { key: String, text: String },
}

pub use crate::published::content_hash;

/// Everything a reconcile needs.
pub struct Reconciler {
    pub client: kube::Client,
    /// A client without kube's own 429 retries, for evictions.
    pub eviction_client: kube::Client,
    pub node_name: String,
    pub node_ref: ObjectReference,
    pub recorder: Recorder,
    pub metrics: Metrics,
    pub slots: DrainSlots,
    pub drain: DrainSettings,
    pub apply: ApplyOptions,
    /// The agent's one NVML session.
    pub gpus: SharedGpus,
    /// Label selector of the device-plugin pods to delete after a config change, when the
    /// plugin is restarted rather than signalled.
    pub plugin_pod_selector: Option<String>,
    pub configmap: String,
    /// The built-in device plugin (`--plugin builtin`), told what to advertise after each apply.
    pub plugins: Option<PluginManager>,
    /// `--plugin dra`: publishes the node's ResourceSlices after each apply (`super::dra`).
    pub dra: Option<crate::dra::publish::Publisher>,
    /// The devices faulted by critical XIDs now: `--plugin dra` publishes them tainted.
    pub faults: crate::gpu::xid::Faults,
    /// `--xid-taint-effect`: what the fault taint does.
    pub taint_effect: crate::dra::taints::TaintEffect,
    /// `--plugin dra`: which instances on dynamic-MIG GPUs claims made (the others are out of
    /// band), as the kubelet plugin journals them.
    pub mig_journal: Option<crate::dra::kubelet_plugin::mig_journal::SharedMigJournal>,
    /// Writes to the Node (state, uncordon) that failed during the reconcile in progress. Any
    /// left at its end fail it with `ApiError`, so it is retried with backoff rather than
    /// leaving a stale state or our cordon until the next resync or label change.
    pub node_write_failures: Mutex<Vec<String>>,
    /// The last Node write of the reconcile in progress that the API server refused (403):
    /// RBAC or the admission policy, which no retry mends, so the agent says it is not ready.
    pub node_write_refused: Mutex<Option<String>>,
    /// `--cdi-refresh-command`, split into words; empty when not given.
    pub cdi_refresh: Vec<String>,
    /// Set at start and by each MIG change, cleared when the CDI refresh command succeeds: a
    /// failed refresh is retried by the next reconcile.
    pub cdi_refresh_owed: std::sync::atomic::AtomicBool,
    /// The GPUs as last read from NVML, kept while nothing but plugin-config and MPS work was
    /// done since: see [`Reconciler::plan_inventory`] for when it may stand in for a read.
    pub inventory: Mutex<Option<ObservedNode>>,
    /// `--plugin dra`: after each apply, the applied devices as the built-in plugin would
    /// advertise them, which is what the kubelet DRA plugin gives a container for each.
    pub dra_devices: Option<tokio::sync::watch::Sender<std::sync::Arc<Inventory>>>,
    /// How long `success` waits for the Node's allocatable to show the plan
    /// ([`super::allocatable`]); zero: not at all.
    pub allocatable_timeout: Duration,
}

impl Reconciler {
    fn nodes(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }

    /// Reconcile towards `desired`, reading the Node and the GPUs afresh (a resync, a retry);
    /// never returns an error, only an outcome it has published.
    pub async fn reconcile(&self, desired: &Desired) -> Outcome {
        self.reconcile_seen(desired, None).await
    }

    /// Reconcile towards `desired` right after the watch brought a change, with `seen`, the
    /// Node as the watch last delivered it. It stands in for a GET: the watch delivers the
    /// Node's versions in order and the change that woke us is the newest, so it already
    /// holds this agent's own earlier writes. The GPUs' last inventory may stand in for NVML
    /// reads when no MIG step follows ([`Self::plan_inventory`]).
    ///
    /// Everything it logs is inside a `reconcile` span naming the node, the profile key and
    /// the first 12 hex digits of its content hash, and each long step (`drain`, `apply`,
    /// `allocatable`) in a span of its own, so a log reader can follow one change.
    pub async fn reconcile_seen(&self, desired: &Desired, seen: Option<&Node>) -> Outcome {
        let (profile, hash) = match desired {
            Desired::Profile { key, text } => (key.as_str(), content_hash(text)),
            Desired::MissingKey { key } => (key.as_str(), String::new()),
            Desired::Nothing => ("", String::new()),
        };
        let span = info_span!(
            "reconcile",
            node = %self.node_name,
            profile,
            hash = %&hash[..hash.len().min(12)]
        );
        self.reconcile_in_span(desired, seen).instrument(span).await
    }

    async fn reconcile_in_span(&self, desired: &Desired, seen: Option<&Node>) -> Outcome {
        let started = Instant::now();
        self.node_write_failures
            .lock()
            .expect("not poisoned")
            .clear();
        *self.node_write_refused.lock().expect("not poisoned") = None;
        let mut outcome = match desired {
            Desired::Nothing => self.leave_alone().await,
            Desired::MissingKey { key } => Outcome::Failed {
                reason: Reason::MissingProfile,
                message: format!(
                    "the node's label {}={key} names no key of ConfigMap {}",
                    node::PROFILE_LABEL,
                    self.configmap
                ),
            },
            Desired::Profile { key, text } => self.make_match(key, text, seen).await,
        };
        if !matches!(outcome, Outcome::Failed { .. }) {
            if let Some(failed) = self.failed_node_writes() {
                outcome = failed;
            }
        }
        if let Outcome::Failed { reason, message } = &outcome {
            // Whatever failed may have left the GPUs other than last read.
            self.forget_inventory();
            self.fail(*reason, message).await;
        }
        let result = match &outcome {
            Outcome::Noop => "noop",
            Outcome::Success => "success",
            Outcome::Failed { .. } => "failed",
        };
        self.metrics.reconciled(result, started.elapsed());
        // After a refused prediction too: its author re-plans from what the kubelet lists now.
        if !matches!(outcome, Outcome::Failed { reason, .. } if reason != Reason::EvictionsNotPredicted)
        {
            self.publish_devices_in_use(seen).await;
        }
        self.publish_found_gpus(seen);
        outcome
    }

    /// No label: uncordon a node we left cordoned and drop our state; the GPUs stay as they are.
    async fn leave_alone(&self) -> Outcome {
        self.release_cordon(None).await;
        let nodes = self.nodes();
        if let Ok(n) = nodes.get(&self.node_name).await {
            if node::label(&n, node::STATE_LABEL).is_some() {
                let _ = node::clear_state(&nodes, &self.node_name).await;
            }
        }
        self.metrics.set_profile(None);
        Outcome::Noop
    }

    async fn make_match(&self, key: &str, text: &str, seen: Option<&Node>) -> Outcome {
        let hash = content_hash(text);
        let profile = match parse_profile(key, text) {
            Ok(p) => p,
            Err(problem) => return invalid(&[problem]),
        };
        // Validated once: every plan below (on the last inventory or fresh reads) starts here.
        let valid = match ValidProfile::check(key, &profile, self.apply.plugin) {
            Ok(valid) => valid,
            Err(problems) => return invalid(&problems),
        };
        let (observed, node_plan, todo, from_memory) = match self.plan_inventory(&valid, seen).await
        {
            Ok(planned) => planned,
            Err(outcome) => return outcome,
        };
        let reallocated = self
            .reallocated(&node_plan, &observed, &profile.plugin)
            .await;
        let fetched;
        let current = match seen {
            Some(node) => Some(node),
            None => {
                fetched = self.nodes().get(&self.node_name).await.ok();
                fetched.as_ref()
            }
        };
        let published = current.is_some_and(|n| {
            node::label(n, node::STATE_LABEL) == Some(State::Success.as_str())
                && node::annotation(n, node::APPLIED_HASH_ANNOTATION) == Some(hash.as_str())
        });
        let mig_change = !todo.is_empty();
        let reconfigured = mig_change || !reallocated.is_empty();
        let outcome = if reconfigured {
            if mig_change {
                // The MIG steps change the layout: the next plan reads the GPUs again.
                self.forget_inventory();
            }
            let change = Change {
                valid: &valid,
                hash: &hash,
                observed: &observed,
                node_plan: &node_plan,
                todo: &todo,
                reallocated: &reallocated,
            };
            self.reconfigure(&change).await
        } else {
            // The decision's plan is the one applied: no MIG step, so nothing it rests on moves.
            let decided = Decided {
                observed,
                plan: node_plan.clone(),
            };
            let applied = self
                .apply_without_mig(&valid, decided, published)
                .instrument(info_span!("step", step = "apply"))
                .await;
            // Without a MIG change nothing is in progress: a cordon of ours still there (its
            // uncordon lost to an API error) goes now.
            self.release_cordon(current).await;
            applied
        };
        match outcome {
            Ok(()) => {
                if from_memory && !self.still_no_mig_step(&valid).await {
                    // Something changed the GPUs behind the agent's back since they were last
                    // read: plan again from fresh reads (this time with the MIG path).
                    warn!("the GPUs changed since they were last read; planning again");
                    return Box::pin(self.make_match(key, text, None)).await;
                }
                self.metrics.set_profile(Some((key, &hash)));
                if published && !mig_change && reallocated.is_empty() {
                    return Outcome::Noop;
                }
                // `success` is read as "done, node schedulable": not while a state or the
                // uncordon of this pass is lost. The retry publishes it.
                if let Some(failed) = self.failed_node_writes() {
                    return failed;
                }
                // A reconfigure waited for it already, before its uncordon.
                if !reconfigured {
                    if let Err(short) = self.advertised(key, &node_plan.resources).await {
                        return short;
                    }
                }
                self.publish(
                    State::Success,
                    &format!("profile {key} applied"),
                    Some(&hash),
                )
                .await;
                self.event_in_background(
                    EventType::Normal,
                    "Applied",
                    &format!("profile {key} applied ({hash:.12})"),
                );
                Outcome::Success
            }
            Err(failure) => failure,
        }
    }

    /// The GPUs to plan `profile` against, and the MIG steps the plan needs; whether the GPUs
    /// came from memory. For a change the watch brought (`seen`), the last inventory serves
    /// when the plan against it needs no MIG step: what it feeds (which GPUs, their MIG
    /// layout, compute modes) changes only through NVML writes, and this agent forgets it
    /// after any of its own (MIG steps, compute modes) and after any failure; drift made by
    /// someone else is caught by the fresh read that confirms the apply before `success`
    /// ([`Self::still_no_mig_step`]). MIG steps (and the drain, which needs the processes now
    /// running) are always planned from fresh reads, as are resyncs and retries.
    async fn plan_inventory(
        &self,
        valid: &ValidProfile,
        seen: Option<&Node>,
    ) -> Result<(ObservedNode, NodePlan, Vec<Step>, bool), Outcome> {
        if let Some(observed) = seen.and(self.remembered_inventory()) {
            if let Ok(node_plan) = valid.plan(&observed) {
                let todo = steps(&node_plan, &observed);
                if todo.is_empty() {
                    return Ok((observed, node_plan, todo, true));
                }
            }
        }
        let observed = self
            .observe()
            .await
            .map_err(|e| failed(Reason::GpuError, e.to_string()))?;
        let node_plan = valid.plan(&observed).map_err(|p| invalid(&p))?;
        let todo = steps(&node_plan, &observed);
        Ok((observed, node_plan, todo, false))
    }

    /// Whether fresh NVML reads still show no MIG step due for the profile; a failed read or a
    /// plan the GPUs refuse counts as a change (the pass that follows reports it).
    async fn still_no_mig_step(&self, valid: &ValidProfile) -> bool {
        let Ok(observed) = self.observe().await else {
            return false;
        };
        valid
            .plan(&observed)
            .is_ok_and(|node_plan| steps(&node_plan, &observed).is_empty())
    }

    /// An apply without MIG steps (sharing settings, MPS daemons, the plugin config): no
    /// cordon, no drain, and no Node write before it, so the plugin config is written as soon
    /// as the change is known. `applying` is published only when it runs longer than
    /// [`APPLYING_AFTER`]; `success` follows only once it returned (the caller publishes it),
    /// and a failed write fails the reconcile as before.
    async fn apply_without_mig(
        &self,
        valid: &ValidProfile,
        decided: Decided,
        published: bool,
    ) -> Result<(), Outcome> {
        let key = valid.name();
        let apply = self.run_apply(valid, Some(decided));
        tokio::pin!(apply);
        tokio::select! {
            applied = &mut apply => return applied,
            () = tokio::time::sleep(APPLYING_AFTER) => {}
        }
        if !published {
            self.publish(State::Applying, &format!("applying profile {key}"), None)
                .await;
        }
        apply.await
    }

    /// A MIG change, or devices advertised otherwise: drain what it disturbs under a fleet
    /// slot, apply, wait for the node to advertise the plan, uncordon.
    async fn reconfigure(&self, change: &Change<'_>) -> Result<(), Outcome> {
        let key = change.valid.name();
        // The journal is written only once the drain is done: an unwritable state dir found
        // then would have evicted pods for a change that cannot start.
        let opts = self.apply.clone();
        tokio::task::spawn_blocking(move || check_state_dir(&opts))
            .await
            .map_err(|e| failed(Reason::StateDirUnwritable, e))?
            .map_err(|e| {
                failed(
                    Reason::StateDirUnwritable,
                    format!("{e}; nothing was cordoned or evicted"),
                )
            })?;
        self.publish(
            State::Pending,
            &format!("waiting for a drain slot to apply profile {key}"),
            None,
        )
        .await;
        let slot = self
            .slots
            .acquire(self.drain.timeout)
            .await
            .map_err(|e| failed(Reason::DrainSlotTimeout, e))?;
        let renewal = slot.spawn_renewal();
        let mut result = self
            .drain_and_apply(change, &slot)
            .instrument(info_span!("step", step = "drain-and-apply", slot = %slot.name()))
            .await;
        if result.is_ok() {
            // Cordoned until the node advertises the plan ([`Self::advertised`] says why).
            result = self.advertised(key, &change.node_plan.resources).await;
        }
        renewal.abort();
        self.release_cordon(None).await;
        slot.release().await;
        result
    }

    async fn drain_and_apply(&self, change: &Change<'_>, slot: &DrainSlot) -> Result<(), Outcome> {
        let Change {
            valid,
            hash,
            observed,
            node_plan,
            todo,
            reallocated,
        } = *change;
        let key = valid.name();
        self.withdraw_going_away(key, node_plan, observed).await?;
        let what = if todo.is_empty() {
            "re-allocating the devices it advertises otherwise"
        } else {
            "reconfiguring MIG"
        };
        let reason = format!("gpu-share: {what} for profile {key} ({hash:.12})");
        let cordoned = node::cordon(&self.nodes(), &self.node_name, &reason)
            .await
            .map_err(|e| {
                let what = format!("could not cordon: {}", node::describe(&e));
                self.note_refusal(&what, &e);
                failed(Reason::ApiError, what)
            })?;
        if cordoned {
            self.event(EventType::Normal, "Cordoned", &reason).await;
        }
        let mut disturbed = self.disturbed(todo, observed).await;
        disturbed.predicted = self.predicted_evictions(hash).await;
        disturbed
            .holders
            .extend(reallocated.iter().map(|(held, _)| held.pod.clone()));
        if !reallocated.is_empty() {
            self.event(
                EventType::Normal,
                "Reallocating",
                &super::advertisement::note(key, reallocated),
            )
            .await;
        }
        if !disturbed.is_empty() {
            self.publish(
                State::Draining,
                &format!(
                    "evicting the pods that use the GPU devices profile {key} changes or \
                     advertises otherwise"
                ),
                None,
            )
            .await;
            let gpus = self.gpus.clone();
            let evicted = drain(
                self.client.clone(),
                self.eviction_client.clone(),
                &self.node_name,
                &disturbed,
                &self.drain,
                &self.metrics,
                move |pids| still_running(gpus.clone(), pids),
                &|blocked| {
                    self.event_in_background(
                        EventType::Warning,
                        "EvictionBlocked",
                        &format!("waiting for the eviction of {blocked}; retrying until the drain timeout"),
                    )
                },
            )
            .await
            .map_err(|e| match e {
                DrainError::NotEvictable { .. } => failed(Reason::PodNotEvictable, e),
                DrainError::NotPredicted { .. } => failed(Reason::EvictionsNotPredicted, e),
                _ => failed(Reason::DrainTimeout, e),
            })?;
            self.event(
                EventType::Normal,
                "Drained",
                &format!("{evicted} pod(s) evicted from the GPU devices that change"),
            )
            .await;
        }
        if slot.is_lost() {
            // Renewals failed long enough for another node to take the slot: applying now could
            // put more nodes into reconfiguration than the fleet budget allows.
            return Err(Outcome::Failed {
                reason: Reason::DrainSlotLost,
                message: format!(
                    "lost drain slot {} before applying; will retry",
                    slot.name()
                ),
            });
        }
        self.publish(State::Applying, &format!("applying profile {key}"), None)
            .await;
        // The drain let processes go and took time: the apply plans on fresh reads.
        self.run_apply(valid, None).await
    }

    /// The autopilot's prediction of the evictions for the profile text hashed `hash`, from a
    /// fresh read of the Node; none when there is none for this text (or the read fails: the
    /// drain then goes on as for a profile a person wrote).
    async fn predicted_evictions(&self, hash: &str) -> Option<BTreeSet<String>> {
        let node = self.nodes().get(&self.node_name).await.ok()?;
        node::ExpectedEvictions::on(&node, hash).map(|e| e.pods)
    }

    /// What the MIG steps disturb: the processes NVML shows on the devices that go away, and
    /// the pods the kubelet lists as holding those devices (idle ones included). When the
    /// kubelet cannot be asked, the processes alone (a warning says so).
    async fn disturbed(&self, todo: &[crate::plan::Step], observed: &ObservedNode) -> Disturbed {
        let pids = disturbed_processes(todo, observed)
            .into_iter()
            .map(|(_, pid)| pid)
            .collect();
        let devices = disturbed_devices(todo, observed);
        let holders = if devices.is_empty() {
            BTreeSet::new()
        } else {
            let socket = &self.drain.pod_resources_socket;
            match holders_of(socket, &devices, KUBELET_TIMEOUT).await {
                Ok(holders) => holders,
                Err(e) => {
                    warn!(
                        error = %e,
                        "cannot ask the kubelet which pods hold the GPU devices that change; only \
                         pods with processes on them are drained"
                    );
                    BTreeSet::new()
                }
            }
        };
        Disturbed {
            pids,
            holders,
            predicted: None,
        }
    }

    /// `gpu-share apply` on this node (blocking NVML work off the async threads), then restart
    /// the plugin pods when that is how the plugin reloads. `decided`: the reconcile's plan,
    /// carried out as it is when it needs no MIG step ([`apply_decided`]).
    async fn run_apply(
        &self,
        valid: &ValidProfile,
        decided: Option<Decided>,
    ) -> Result<(), Outcome> {
        let plugin_options = valid.profile().plugin.clone();
        let (gpus, opts) = (self.gpus.clone(), self.apply.clone());
        let valid = valid.clone();
        let report = tokio::task::spawn_blocking(move || {
            gpus.with(|gpus| apply_decided(gpus, &valid, &opts, decided))
        })
        .await
        .map_err(|e| failed(Reason::ApplyFailed, e))?
        .map_err(|e| match e {
            ApplyError::Invalid(problems) => invalid(&problems),
            other => failed(Reason::ApplyFailed, other),
        })?;
        if !report.steps.is_empty() || !report.compute_mode.changed.is_empty() {
            // The GPUs are no longer as last read.
            self.forget_inventory();
        }
        if !report.steps.is_empty() {
            let steps: Vec<String> = report.steps.iter().map(ToString::to_string).collect();
            self.event(EventType::Normal, "Reconfigured", &steps.join("; "))
                .await;
        }
        if !report.reset_required.is_empty() {
            return Err(Outcome::Failed {
                reason: Reason::ResetRequired,
                message: format!(
                    "the MIG mode change on GPU {:?} waits for a GPU reset or reboot",
                    report.reset_required
                ),
            });
        }
        if report.plugin_config_written || !report.steps.is_empty() {
            self.restart_plugin_pods().await;
        }
        let (inventory, observed) = self
            .applied_inventory(&report.plan, &plugin_options)
            .await?;
        self.save_advertisement(&inventory, &report.plan, &observed);
        if let Some(plugins) = &self.plugins {
            self.refresh_cdi(!report.steps.is_empty()).await?;
            plugins.update(inventory.clone()).await;
        }
        if let Some(devices) = &self.dra_devices {
            // The kubelet DRA plugin learns the applied devices before their slices are
            // published: the scheduler may allocate a new device as soon as it sees it.
            devices.send_replace(std::sync::Arc::new(inventory));
            return self.publish_slices(&report.plan, &observed).await;
        }
        Ok(())
    }

    /// The devices of what was just applied, with the device UUIDs NVML now shows (MIG devices
    /// just created included), for whichever plugin advertises them, and that observation.
    async fn applied_inventory(
        &self,
        plan: &NodePlan,
        plugin_options: &PluginOptions,
    ) -> Result<(Inventory, ObservedNode), Outcome> {
        let observed = self
            .observe()
            .await
            .map_err(|e| failed(Reason::GpuError, e.to_string()))?;
        let inventory = Inventory::from_plan(plan, &observed, plugin_options, &self.apply.mps.root);
        Ok((inventory, observed))
    }

    /// Run the CDI refresh command when one is configured and owed (after a MIG change, or
    /// not yet since the agent started, or failed before).
    async fn refresh_cdi(&self, mig_changed: bool) -> Result<(), Outcome> {
        use std::sync::atomic::Ordering;
        if self.cdi_refresh.is_empty() {
            return Ok(());
        }
        if mig_changed {
            self.cdi_refresh_owed.store(true, Ordering::SeqCst);
        }
        if !self.cdi_refresh_owed.load(Ordering::SeqCst) {
            return Ok(());
        }
        crate::builtin_plugin::cdi::refresh(&self.cdi_refresh)
            .await
            .map_err(|e| failed(Reason::CdiRefreshFailed, e))?;
        info!(command = %self.cdi_refresh.join(" "), "CDI spec refreshed");
        self.cdi_refresh_owed.store(false, Ordering::SeqCst);
        Ok(())
    }

    async fn restart_plugin_pods(&self) {
        let Some(selector) = &self.plugin_pod_selector else {
            return;
        };
        let pods: Api<Pod> = Api::all(self.client.clone());
        let params = ListParams::default()
            .labels(selector)
            .fields(&format!("spec.nodeName={}", self.node_name));
        match pods.list(&params).await {
            Ok(list) => {
                for p in list.items {
                    let (ns, name) = (
                        p.metadata.namespace.unwrap_or_default(),
                        p.metadata.name.unwrap_or_default(),
                    );
                    let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
                    match api.delete(&name, &DeleteParams::default()).await {
                        Ok(_) => {
                            info!(pod = %format!("{ns}/{name}"), "device-plugin pod restarted to load the new config")
                        }
                        Err(e) => warn!(error = %e, "could not restart the device-plugin pod"),
                    }
                }
            }
            Err(e) => warn!(error = %e, "could not list the device-plugin pods"),
        }
    }

    async fn publish(&self, state: State, reason: &str, hash: Option<&str>) {
        self.metrics.set_state(state.as_str());
        if let Err(e) = node::set_state(&self.nodes(), &self.node_name, state, reason, hash).await {
            warn!(error = %e, state = state.as_str(), "could not publish the state on the node");
            let what = format!(
                "could not publish state {} on the node: {}",
                state.as_str(),
                node::describe(&e)
            );
            self.node_write_failed(what, &e);
        }
    }

    /// Uncordon the node if we cordoned it (never a cordon someone else made). `known`, a
    /// recent read of the node, saves a request when it shows no cordon of ours.
    async fn release_cordon(&self, known: Option<&Node>) {
        if known.is_some_and(|n| node::annotation(n, node::CORDON_ANNOTATION).is_none()) {
            return;
        }
        match node::uncordon_if_ours(&self.nodes(), &self.node_name).await {
            Ok(true) => info!("node uncordoned"),
            Ok(false) => {}
            Err(e) => {
                warn!(error = %e, "could not uncordon; will retry");
                let what = format!("could not uncordon the node: {}", node::describe(&e));
                self.node_write_failed(what, &e);
            }
        }
    }

    /// The Node writes of this reconcile that failed, as its outcome (`ApiError`, retried with
    /// backoff); `None` while all went through.
    fn failed_node_writes(&self) -> Option<Outcome> {
        let failures = self.node_write_failures.lock().expect("not poisoned");
        (!failures.is_empty()).then(|| Outcome::Failed {
            reason: Reason::ApiError,
            message: format!("{}; will retry", failures.join("; ")),
        })
    }

    fn node_write_failed(&self, what: String, error: &kube::Error) {
        self.note_refusal(&what, error);
        self.node_write_failures
            .lock()
            .expect("not poisoned")
            .push(what);
    }

    /// Remember a write the API server refused with 403 (see [`Self::refused_node_write`]).
    fn note_refusal(&self, what: &str, error: &kube::Error) {
        if matches!(error, kube::Error::Api(s) if s.code == 403) {
            *self.node_write_refused.lock().expect("not poisoned") = Some(what.to_string());
        }
    }

    /// The Node write of the last reconcile that the API server refused (403), if any.
    pub fn refused_node_write(&self) -> Option<String> {
        self.node_write_refused
            .lock()
            .expect("not poisoned")
            .clone()
    }

    async fn fail(&self, reason: Reason, message: &str) {
        warn!(reason = reason.as_str(), message, "reconcile failed");
        self.metrics.failed(reason.as_str());
        // A drain that would lose a pod waits for a person (or the pod's end), not for a fix
        // of the profile: `blocked`, not `failed`. It is retried like any failure.
        let state = if reason.blocks() {
            State::Blocked
        } else {
            State::Failed
        };
        self.publish(state, message, None).await;
        self.event(EventType::Warning, reason.as_str(), message)
            .await;
        match node::uncordon_if_ours(&self.nodes(), &self.node_name).await {
            Ok(true) => info!("node uncordoned after the failure"),
            Ok(false) => {}
            Err(e) => warn!(error = %e, "could not uncordon after the failure"),
        }
    }
}

/// One change a reconcile carries out with a drain: the profile, the GPUs as read, the MIG
/// steps and the held devices the new advertisement re-allocates.
#[derive(Clone, Copy)]
struct Change<'a> {
    valid: &'a ValidProfile,
    hash: &'a str,
    /// The GPUs before the change, and the plan of the profile on them.
    observed: &'a ObservedNode,
    node_plan: &'a NodePlan,
    todo: &'a [Step],
    reallocated: &'a [(Held, String)],
}

/// Which of `pids` NVML still lists.
async fn still_running(gpus: SharedGpus, pids: Vec<u32>) -> Vec<u32> {
    tokio::task::spawn_blocking(move || {
        let Ok(node) = gpus.with(Gpus::observe) else {
            return pids;
        };
        pids.into_iter()
            .filter(|pid| {
                node.gpus
                    .iter()
                    .any(|g| g.processes.iter().any(|p| p.pid == *pid))
            })
            .collect()
    })
    .await
    .unwrap_or_default()
}
