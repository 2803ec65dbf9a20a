//! The reconcile's side of re-allocation ([`super::advertisement`]): before a change, which
//! pods hold devices the new profile advertises otherwise (asking the kubelet), and after an
//! apply, the advertisement to compare the next change with.

use tracing::{debug, info, warn};

use super::advertisement::{claims_reallocated, held_devices, judge, Advertisement, Held, Verdict};
use super::reconcile::{Reconciler, KUBELET_TIMEOUT};
use crate::builtin_plugin::inventory::Inventory;
use crate::kubelet::pod_resources::list as list_pod_resources;
use crate::plan::{NodePlan, ObservedNode};
use crate::profile::PluginOptions;

impl Reconciler {
    /// The devices pods hold that `plan` would advertise otherwise ([`reallocated`]), with
    /// why; each verdict is logged. Empty when the advertisement is the one last applied (the
    /// kubelet is not asked), and when the kubelet cannot be asked (a warning says so: as for
    /// the MIG drain, the change goes on).
    pub(super) async fn reallocated(
        &self,
        plan: &NodePlan,
        observed: &ObservedNode,
        options: &PluginOptions,
    ) -> Vec<(Held, String)> {
        let inventory = Inventory::from_plan(plan, observed, options, &self.apply.mps.root);
        let after = self.advertisement(&inventory, plan, observed);
        let before = Advertisement::load(&self.apply.state_dir);
        // With DRA a claim may hold a device no publish had (made out of band): always ask.
        if before.as_ref() == Some(&after) && self.dra.is_none() {
            return Vec::new();
        }
        let socket = &self.drain.pod_resources_socket;
        let list = match list_pod_resources(socket, KUBELET_TIMEOUT).await {
            Ok(list) => list,
            Err(e) => {
                warn!(error = %e, "cannot ask the kubelet which pods hold the devices this \
                      profile advertises otherwise; none of them is drained for it");
                return Vec::new();
            }
        };
        let mut out = Vec::new();
        if self.dra.is_some() {
            for (held, why) in claims_reallocated(&list, &self.node_name, before.as_ref(), &after) {
                info!(pod = %held.pod, %why, "device re-allocated: its holder is drained first");
                out.push((held, why));
            }
        }
        for held in held_devices(&list, observed) {
            match judge(&held, before.as_ref(), &after) {
                Verdict::Stays(why) => debug!(pod = %held.pod, %why, "holder stays"),
                Verdict::Reallocated(why) => {
                    info!(pod = %held.pod, %why, "device re-allocated: its holder is drained first");
                    out.push((held, why));
                }
            }
        }
        out
    }

    /// What `plan` advertises: the device plugin's IDs (`inventory`) and, with `--plugin dra`,
    /// the devices its slices publish.
    fn advertisement(
        &self,
        inventory: &Inventory,
        plan: &NodePlan,
        observed: &ObservedNode,
    ) -> Advertisement {
        let advertisement = Advertisement::of(inventory);
        if self.dra.is_none() {
            return advertisement;
        }
        let slices = crate::dra::resource_slices_with(
            &self.node_name,
            0,
            &plan.gpus,
            observed,
            &self.claimed_instances(),
        );
        advertisement.with_dra(&slices)
    }

    /// Remember what the node now advertises, for the next change to compare with. A failed
    /// write is a warning: the next change then compares device IDs and resources only.
    pub(super) fn save_advertisement(
        &self,
        inventory: &Inventory,
        plan: &NodePlan,
        observed: &ObservedNode,
    ) {
        let advertisement = self.advertisement(inventory, plan, observed);
        if let Err(e) = advertisement.save(&self.apply.state_dir) {
            warn!(error = %e, dir = %self.apply.state_dir.display(), "cannot save the node's \
                  advertisement; the next change compares device IDs and resources only");
        }
    }
}
