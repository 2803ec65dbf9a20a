//! The reconcile's `--plugin dra` side: publish the node's ResourceSlices after each apply,
//! and withdraw the devices a re-partition takes away before its cordon and drain, so the
//! scheduler stops allocating them while the pods on them are evicted (docs/dra.md).

use kube::runtime::events::EventType;
use tracing::info;

use super::outcome::{failed, invalid, Outcome};
use super::reconcile::Reconciler;
use crate::dra::{self, publish};
use crate::plan::{plan_for, NodePlan, ObservedNode};
use crate::profile::Profile;

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
        let slices = dra::resource_slices(&self.node_name, 0, &plan.gpus, observed);
        match publisher.publish(slices).await {
            Ok(publish::Outcome::Unchanged) => Ok(()),
            Ok(publish::Outcome::Written { generation }) => {
                self.event_in_background(
                    EventType::Normal,
                    "SlicesPublished",
                    &format!(
                        "ResourceSlices of pool {} published at generation {generation}",
                        self.node_name
                    ),
                );
                Ok(())
            }
            Err(e) => Err(publish_failure(&e)),
        }
    }

    /// Before a re-partition's cordon: republish the pool without the devices the new plan of
    /// `profile` (on `observed`, the GPUs before the change) does not keep alike. Kept devices
    /// stay published; the post-apply publish brings the new ones.
    pub(super) async fn withdraw_going_away(
        &self,
        key: &str,
        profile: &Profile,
        observed: &ObservedNode,
    ) -> Result<(), Outcome> {
        let Some(publisher) = &self.dra else {
            return Ok(());
        };
        let next = plan_for(key, profile, observed, self.apply.plugin).map_err(|p| invalid(&p))?;
        let slices = dra::resource_slices(&self.node_name, 0, &next.gpus, observed);
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
