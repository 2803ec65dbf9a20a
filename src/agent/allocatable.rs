//! `success` means the node advertises the plan: after an apply the agent waits until the
//! Node's `status.allocatable` (what the scheduler counts) shows every resource of the plan with
//! the planned count.
//!
//! Writing the device-plugin config is not enough. Measured with NVIDIA's device plugin
//! v0.20.0 on a real kubelet 1.36: the plugin exited on a new config, gpu-share still published
//! `success`, and the node advertised `nvidia.com/gpu: 0` until someone restarted the plugin.
//! The kubelet updates the Node's status on its node-status period (10 s by default), so a
//! healthy change is seen within seconds; a node still short after the agent's
//! `--allocatable-timeout` fails with reason `AllocatableMismatch`, naming each resource with
//! the expected and seen counts (Event, `gpu_share_reconcile_failures_total`), and is retried
//! with backoff: it turns `success` once the plugin is back.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use tracing::{debug, info, info_span, Instrument};

use super::outcome::Outcome;
use super::reconcile::Reconciler;

/// How often the Node is read while waiting.
const POLL: Duration = Duration::from_millis(250);

/// Each resource of `expected` whose count in `allocatable` differs: (resource, expected,
/// seen); a resource the Node does not list is seen as 0.
pub fn shortfalls(
    expected: &BTreeMap<String, u64>,
    allocatable: &BTreeMap<String, u64>,
) -> Vec<(String, u64, u64)> {
    expected
        .iter()
        .filter_map(|(resource, &want)| {
            let seen = allocatable.get(resource).copied().unwrap_or(0);
            (seen != want).then(|| (resource.clone(), want, seen))
        })
        .collect()
}

/// The Node's allocatable as counts; quantities that are not whole numbers (memory, CPU in
/// millicores) are left out: extended resources are always integers.
pub fn allocatable_counts(node: &Node) -> BTreeMap<String, u64> {
    node.status
        .as_ref()
        .and_then(|s| s.allocatable.as_ref())
        .map(|a| {
            a.iter()
                .filter_map(|(r, q)| Some((r.clone(), q.0.parse().ok()?)))
                .collect()
        })
        .unwrap_or_default()
}

/// `nvidia.com/gpu: expected 8, seen 0; …`
pub fn describe(shortfalls: &[(String, u64, u64)]) -> String {
    shortfalls
        .iter()
        .map(|(r, want, seen)| format!("{r}: expected {want}, seen {seen}"))
        .collect::<Vec<_>>()
        .join("; ")
}

impl Reconciler {
    /// [`Self::wait_for_allocatable`], in a step span of its own. A change that cordoned the
    /// node waits for this before its uncordon: uncordoned while the device plugin restarts on
    /// its new config, the scheduler still sees the old allocatable and binds pods that the
    /// kubelet then rejects (UnexpectedAdmissionError: the pod fails; a bare pod is lost). Seen
    /// on the real kubelet with NVIDIA's plugin (docs/testbed/in-cluster.sh, time-slicing to
    /// exclusive with holders: some twenty failed pods before this wait).
    pub(super) async fn advertised(
        &self,
        key: &str,
        expected: &BTreeMap<String, u64>,
    ) -> Result<(), Outcome> {
        self.wait_for_allocatable(key, expected)
            .instrument(info_span!("step", step = "allocatable"))
            .await
    }

    /// Wait until the Node's allocatable shows `expected` (the plan's resources), at most
    /// `self.allocatable_timeout`; zero waits not at all (the check is off).
    pub(super) async fn wait_for_allocatable(
        &self,
        key: &str,
        expected: &BTreeMap<String, u64>,
    ) -> Result<(), Outcome> {
        let timeout = self.allocatable_timeout;
        if timeout.is_zero() {
            return Ok(());
        }
        let nodes: Api<Node> = Api::all(self.client.clone());
        let started = Instant::now();
        let mut last = String::new();
        loop {
            let short = match nodes.get(&self.node_name).await {
                Ok(node) => shortfalls(expected, &allocatable_counts(&node)),
                Err(e) => {
                    debug!(error = %e, "cannot read the node's allocatable; trying again");
                    vec![(String::from("(node unreadable)"), 0, 0)]
                }
            };
            if short.is_empty() {
                debug!(waited = ?started.elapsed(), "the node advertises the plan");
                return Ok(());
            }
            let now = describe(&short);
            if now != last {
                info!(short = %now, "waiting for the node to advertise what profile {key} plans");
                last = now;
            }
            if started.elapsed() >= timeout {
                return Err(Outcome::Failed {
                    reason: super::outcome::Reason::AllocatableMismatch,
                    message: format!(
                        "profile {key} is applied but after {} the node does not advertise it: \
                         {last} (is the device plugin running? kubectl describe node shows its \
                         allocatable)",
                        crate::duration::show(timeout)
                    ),
                });
            }
            tokio::time::sleep(POLL.min(timeout.saturating_sub(started.elapsed()))).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
        pairs.iter().map(|(r, n)| (r.to_string(), *n)).collect()
    }

    #[test]
    fn a_missing_resource_is_seen_as_zero_and_extra_resources_do_not_matter() {
        let expected = counts(&[("nvidia.com/gpu", 16), ("nvidia.com/mig-1g.10gb", 28)]);
        let seen = counts(&[("nvidia.com/gpu", 16), ("cpu", 64)]);
        let short = shortfalls(&expected, &seen);
        assert_eq!(
            describe(&short),
            "nvidia.com/mig-1g.10gb: expected 28, seen 0"
        );
        let all = counts(&[("nvidia.com/gpu", 16), ("nvidia.com/mig-1g.10gb", 28)]);
        assert!(shortfalls(&expected, &all).is_empty());
    }

    #[test]
    fn more_than_planned_is_a_mismatch_too() {
        // The old config still served: 8 whole GPUs where the plan has 4 × 4 replicas.
        let short = shortfalls(
            &counts(&[("nvidia.com/gpu", 16)]),
            &counts(&[("nvidia.com/gpu", 32)]),
        );
        assert_eq!(short, [("nvidia.com/gpu".to_string(), 16, 32)]);
    }

    #[test]
    fn allocatable_quantities_that_are_not_counts_are_left_out() {
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n"},
            "status": {"allocatable": {"cpu": "3500m", "memory": "64Gi", "nvidia.com/gpu": "8"}}
        }))
        .unwrap();
        assert_eq!(allocatable_counts(&node), counts(&[("nvidia.com/gpu", 8)]));
    }
}
