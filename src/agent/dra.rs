//! The reconcile's `--plugin dra` side: publish the node's ResourceSlices after each apply,
//! and withdraw the devices a re-partition takes away before its cordon and drain, so the
//! scheduler stops allocating them while the pods on them are evicted (docs/dra.md).

use kube::runtime::events::EventType;
use tracing::{info, warn};

use crate::dra::dynamic::ClaimedInstances;

use super::outcome::{failed, Outcome};
use super::reconcile::Reconciler;
use crate::dra::{self, publish};
use crate::plan::{NodePlan, ObservedNode};

/// The failure of a refused or failed publish. A 422 is the API server refusing the slices as
/// invalid (on a real 1.36 server every MIG profile was, until counter sets moved to slices of
/// their own): reason `SlicesRejected` with the server's message, which a retry with backoff
/// will meet again until the agent or the server changes, so it names what to check; anything
/// else is `PublishFailed`.
fn publish_failure(e: &kube::Error) -> Outcome {
    match e {
        kube::Error::Api(status) if status.code == 422 => failed(
            super::outcome::Reason::SlicesRejected,
            format!(
                "the API server refused the ResourceSlices: {}; check that it serves \
                 resource.k8s.io/v1 as Kubernetes 1.34+ does (docs/dra.md, API limits)",
                status.message
            ),
        ),
        other => failed(
            super::outcome::Reason::PublishFailed,
            format!("could not publish the ResourceSlices: {other}"),
        ),
    }
}

impl Reconciler {
    /// The instances claims made on dynamic-MIG GPUs (none without `--plugin dra`).
    pub(super) fn claimed_instances(&self) -> ClaimedInstances {
        self.mig_journal
            .as_ref()
            .map(|j| j.claimed())
            .unwrap_or_default()
    }

    /// Instances claims made on GPUs that `plan` no longer makes dynamic become the profile's:
    /// their journal entries go, so the kubelet plugin does not destroy them at Unprepare (the
    /// new geometry may keep an instance, or put its own at the same placement). Done before
    /// the drain, whose evictions bring those Unprepares; the apply keeps or destroys them as
    /// for any instance.
    fn adopt_claims_instances(&self, plan: &NodePlan) {
        let Some(journal) = &self.mig_journal else {
            return;
        };
        let dynamic: Vec<u32> = plan
            .gpus
            .iter()
            .filter(|g| g.mode == crate::sharing::PlannedMode::DynamicMig)
            .map(|g| g.index)
            .collect();
        let mut entries = journal.lock();
        let (kept, adopted): (Vec<_>, Vec<_>) = std::mem::take(&mut entries.entries)
            .into_iter()
            .partition(|e| dynamic.contains(&e.gpu));
        entries.entries = kept;
        if adopted.is_empty() {
            return;
        }
        let devices: Vec<String> = adopted.iter().map(|e| e.device.clone()).collect();
        info!(devices = %devices.join(","), profile = %plan.profile,
              "instances claims made on GPUs no longer dynamic are the profile's now");
        if let Err(error) = journal.save(&entries) {
            warn!(%error, "cannot write the dynamic-MIG journal; a restart would destroy those instances at Unprepare");
        }
    }

    /// A Warning Event naming the instances on dynamic-MIG GPUs that no claim made: the
    /// devices they overlap were just withdrawn from the slices, and stay so until they go.
    fn name_out_of_band(
        &self,
        plan: &NodePlan,
        observed: &ObservedNode,
        claimed: &ClaimedInstances,
    ) {
        let found: Vec<String> = plan
            .gpus
            .iter()
            .filter(|g| g.mode == crate::sharing::PlannedMode::DynamicMig)
            .filter_map(|g| observed.gpus.iter().find(|o| o.index == g.index))
            .flat_map(|o| {
                dra::out_of_band(o, claimed).into_iter().map(move |i| {
                    format!(
                        "GPU {} instance {} ({} at {})",
                        o.index,
                        i.gi_id.map_or_else(|| "?".into(), |id| id.to_string()),
                        i.profile,
                        i.placement
                    )
                })
            })
            .collect();
        if found.is_empty() {
            return;
        }
        warn!(instances = %found.join(", "), "MIG instances made out of band on dynamic GPUs");
        self.event_in_background(
            EventType::Warning,
            "OutOfBandMig",
            &format!(
                "MIG instances no claim made are on dynamic GPUs: {}; the devices they overlap \
                 are withdrawn from the ResourceSlices until they are destroyed",
                found.join(", ")
            ),
        );
    }

    /// After an apply: the pool becomes the applied plan's devices, with the UUIDs NVML shows
    /// now (MIG devices just created included). Nothing is written when the API holds them.
    pub(super) async fn publish_slices(
        &self,
        plan: &NodePlan,
        observed: &ObservedNode,
    ) -> Result<(), Outcome> {
        let Some(publisher) = &self.dra else {
            return Ok(());
        };
        self.adopt_claims_instances(plan);
        let claimed = self.claimed_instances();
        let slices = self.pool_slices(plan, observed, &claimed);
        match publisher.publish(slices).await {
            Ok(publish::Outcome::Unchanged) => Ok(()),
            Ok(publish::Outcome::CountersDropped { generation }) => {
                self.counters_dropped_event(plan);
                self.slices_published_event(generation);
                Ok(())
            }
            Ok(publish::Outcome::TaintsDropped { generation }) => {
                self.taints_dropped_event();
                self.slices_published_event(generation);
                Ok(())
            }
            Ok(publish::Outcome::ConsumableDropped { generation }) => {
                self.consumable_dropped_event(plan);
                self.slices_published_event(generation);
                Ok(())
            }
            Ok(publish::Outcome::Written { generation }) => {
                self.name_out_of_band(plan, observed, &claimed);
                self.slices_published_event(generation);
                Ok(())
            }
            Err(e) => Err(publish_failure(&e)),
        }
    }

    /// The pool `plan` publishes on `observed`, each device a critical XID touched tainted
    /// (`dra::taints`).
    fn pool_slices(
        &self,
        plan: &NodePlan,
        observed: &ObservedNode,
        claimed: &dra::dynamic::ClaimedInstances,
    ) -> Vec<dra::api::ResourceSlice> {
        let slices = dra::resource_slices_with(&self.node_name, 0, &plan.gpus, observed, claimed);
        dra::taints::tainted(&slices, &self.faults.all_since(), self.taint_effect)
    }

    /// The Warning for an API server found dropping taints: faulted devices are withdrawn
    /// instead, for as long as the agent runs.
    fn taints_dropped_event(&self) {
        let message = "the API server drops ResourceSlice device taints (feature gate \
                       DRADeviceTaints off, the default before Kubernetes 1.36): devices a \
                       critical XID faulted are withdrawn from the slices instead of tainted \
                       (a claim cannot tolerate them), and come back when they heal";
        warn!(message, "ResourceSlice taints dropped");
        self.event_in_background(EventType::Warning, "TaintsDropped", message);
    }

    /// The Warning for an API server found dropping consumable capacity: the consumable GPUs
    /// are offered as fixed shares instead, for as long as the agent runs.
    fn consumable_dropped_event(&self, plan: &NodePlan) {
        let gpus: Vec<String> = plan
            .gpus
            .iter()
            .filter_map(|g| match &g.mode {
                crate::sharing::PlannedMode::Mps {
                    replicas,
                    consumable: Some(c),
                    ..
                } => Some(format!(
                    "{} ({replicas} shares of {} MiB)",
                    g.index,
                    crate::mps::consumable::fixed_share_mib(c, *replicas)
                )),
                crate::sharing::PlannedMode::Mig {
                    replicas,
                    mps: Some(m),
                    ..
                } if !m.consumable.is_empty() => Some(format!(
                    "{}'s MIG devices ({})",
                    g.index,
                    m.consumable
                        .iter()
                        .map(|(profile, c)| format!(
                            "{profile}: {replicas} shares of {} MiB",
                            crate::mps::consumable::fixed_share_mib(c, *replicas)
                        ))
                        .collect::<Vec<_>>()
                        .join(", ")
                )),
                _ => None,
            })
            .collect();
        let message = format!(
            "the API server drops allowMultipleAllocations and requestPolicy (feature gate \
             DRAConsumableCapacity off, the default before Kubernetes 1.36): consumable MPS \
             GPU(s) {} of profile {} are published as fixed MPS shares, each with an even split \
             of the memory as its pinned limit, so no claim can ask for memory or compute; turn \
             the gate on (kube-apiserver and kube-scheduler) and restart the agent to share them \
             by capacity",
            gpus.join(", "),
            plan.profile
        );
        warn!(%message, "consumable capacity dropped");
        self.event_in_background(EventType::Warning, "ConsumableCapacityDropped", &message);
    }

    fn slices_published_event(&self, generation: i64) {
        self.event_in_background(
            EventType::Normal,
            "SlicesPublished",
            &format!(
                "ResourceSlices of pool {} published at generation {generation}",
                self.node_name
            ),
        );
    }

    /// The Event for an API server found dropping counters: a Warning naming the dynamic-MIG
    /// GPUs now offered whole only (what the profile asked for is not served), Normal when
    /// only static MIG devices lost counters they do not need to stay apart.
    fn counters_dropped_event(&self, plan: &NodePlan) {
        let dynamic: Vec<String> = plan
            .gpus
            .iter()
            .filter(|g| g.mode == crate::sharing::PlannedMode::DynamicMig)
            .map(|g| g.index.to_string())
            .collect();
        let cause = "the API server drops ResourceSlice counters (feature gate \
                     DRAPartitionableDevices off, the default before Kubernetes 1.36)";
        let (kind, message) = if dynamic.is_empty() {
            (
                EventType::Normal,
                format!(
                    "{cause}: slices published without them; each MIG device is an instance \
                     of its own, so none is handed out twice"
                ),
            )
        } else {
            (
                EventType::Warning,
                format!(
                    "{cause}: dynamic-MIG GPU(s) {} of profile {} are offered whole only, since \
                     without counters the scheduler could allocate overlapping MIG placements; \
                     turn the gate on (kube-apiserver and kube-scheduler) \
                     and restart the agent to offer placements",
                    dynamic.join(", "),
                    plan.profile
                ),
            )
        };
        warn!(%message, "ResourceSlice counters dropped");
        self.event_in_background(kind, "CountersDropped", &message);
    }

    /// Before a re-partition's cordon: republish the pool without the devices the new plan of
    /// `profile` (on `observed`, the GPUs before the change) does not keep alike. Kept devices
    /// stay published; the post-apply publish brings the new ones.
    pub(super) async fn withdraw_going_away(
        &self,
        key: &str,
        next: &NodePlan,
        observed: &ObservedNode,
    ) -> Result<(), Outcome> {
        let Some(publisher) = &self.dra else {
            return Ok(());
        };
        self.adopt_claims_instances(next);
        let slices = self.pool_slices(next, observed, &self.claimed_instances());
        let gone = publisher.withdraw(&slices).await.map_err(|e| {
            failed(
                super::outcome::Reason::PublishFailed,
                format!("could not withdraw the devices profile {key} removes from the ResourceSlices; nothing was cordoned or evicted: {e}"),
            )
        })?;
        if !gone.is_empty() {
            info!(devices = %gone.join(","), "devices withdrawn from the ResourceSlices before the drain");
            self.event(
                EventType::Normal,
                "DevicesWithdrawn",
                &format!(
                    "{} device(s) withdrawn from the ResourceSlices before the drain: {}",
                    gone.len(),
                    gone.join(", ")
                ),
            )
            .await;
        }
        Ok(())
    }
}
