//! Drain only what a MIG change disturbs: evict, through the Eviction API, the pods whose CUDA
//! processes run on instances that go away and the pods the kubelet says hold those devices,
//! respecting PodDisruptionBudgets (a 429 is retried with backoff until the drain timeout),
//! then wait until those pods are gone and their NVML processes have exited. Progress is logged
//! while it waits.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::Api;
use tracing::{info, warn};

use super::metrics::Metrics;
use crate::kubelet::cgroup::pod_uid_of;
use crate::kubelet::pod_resources::PodName;

/// How to drain.
#[derive(Debug, Clone)]
pub struct DrainSettings {
    /// Give up (state `failed`, node uncordoned) after this long.
    pub timeout: Duration,
    /// Where host PIDs' cgroups are read (`/proc`; the agent runs with hostPID).
    pub proc_root: PathBuf,
    /// The kubelet's PodResources socket, which says which pods hold which devices.
    pub pod_resources_socket: PathBuf,
    /// First wait after a refused eviction; doubles up to `max_backoff`.
    pub backoff: Duration,
    pub max_backoff: Duration,
    /// Evict pods no controller owns (`kubectl drain --force`).
    pub evict_bare_pods: bool,
    /// Evict pods with emptyDir volumes (`kubectl drain --delete-emptydir-data`).
    pub delete_emptydir_data: bool,
}

/// Why a drain stopped.
#[derive(Debug, thiserror::Error)]
pub enum DrainError {
    #[error("drain timed out after {waited:?}: {}", .left.join("; "))]
    Timeout { waited: Duration, left: Vec<String> },
    #[error("listing the pods on the node: {0}")]
    Api(#[from] kube::Error),
    /// Nothing was evicted: evicting these pods would lose them or their data.
    #[error("not draining: {}; nothing was evicted", .pods.join("; "))]
    NotEvictable { pods: Vec<String> },
    /// Nothing was evicted: the profile's author predicted other evictions.
    #[error(
        "not draining: the drain would evict {}, which the proposal did not predict (it \
         predicted {}); nothing was evicted; its author re-plans with what the kubelet lists now",
        .pods.join(", "),
        if .predicted.is_empty() { "none".to_string() } else { .predicted.join(", ") }
    )]
    NotPredicted {
        pods: Vec<String>,
        predicted: Vec<String>,
    },
}

/// A pod to evict, by namespace/name, and the UID that ties it to its processes.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Target {
    namespace: String,
    name: String,
    uid: String,
    /// What evicting it would lose (each needs its own permission, as kubectl's filters do).
    loses: Vec<Loss>,
}

/// What an eviction would lose, as `kubectl drain` checks before it evicts anything
/// (k8s.io/kubectl/pkg/drain/filters.go: unreplicatedFilter, localStorageFilter).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Loss {
    /// No controller owns it: nothing recreates it (kubectl: "cannot delete Pods that declare
    /// no controller (use --force to override)").
    BarePod,
    /// An emptyDir volume, deleted with the pod (kubectl: "cannot delete Pods with local
    /// storage (use --delete-emptydir-data to override)").
    EmptyDirData,
}

impl Loss {
    /// Every loss an eviction of `pod` would cause: a bare pod with emptyDir data has both.
    fn of(pod: &Pod) -> Vec<Loss> {
        let owned = pod.metadata.owner_references.iter().flatten();
        let controlled = owned.into_iter().any(|o| o.controller == Some(true));
        let volumes = pod.spec.iter().flat_map(|s| s.volumes.iter().flatten());
        let empty_dir = volumes.into_iter().any(|v| v.empty_dir.is_some());
        let mut losses = Vec::new();
        if !controlled {
            losses.push(Loss::BarePod);
        }
        if empty_dir {
            losses.push(Loss::EmptyDirData);
        }
        losses
    }

    fn allowed(self, settings: &DrainSettings) -> bool {
        match self {
            Loss::BarePod => settings.evict_bare_pods,
            Loss::EmptyDirData => settings.delete_emptydir_data,
        }
    }

    fn explain(self) -> &'static str {
        match self {
            Loss::BarePod => {
                "no controller owns it, so an eviction would delete it for good; delete or \
                 move it yourself, or start the agent with --evict-bare-pods"
            }
            Loss::EmptyDirData => {
                "its emptyDir data would be deleted with it; move it yourself, or start the \
                 agent with --delete-emptydir-data"
            }
        }
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// The pods on `node` behind `pids` or named in `holders`, and the PIDs that belong to no pod.
async fn targets(
    pods: &Api<Pod>,
    node: &str,
    pids: &[u32],
    holders: &BTreeSet<PodName>,
    settings: &DrainSettings,
) -> Result<(Vec<Target>, Vec<u32>), kube::Error> {
    let mut uids: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    let mut host = Vec::new();
    for &pid in pids {
        match pod_uid_of(&settings.proc_root, pid) {
            Some(uid) => uids.entry(uid).or_default().push(pid),
            None => host.push(pid),
        }
    }
    let on_node = pods
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await?;
    let targets = on_node
        .items
        .into_iter()
        .filter_map(|p| {
            let target = Target {
                namespace: p.metadata.namespace.clone().unwrap_or_default(),
                name: p.metadata.name.clone().unwrap_or_default(),
                uid: p.metadata.uid.clone()?,
                loses: Loss::of(&p),
            };
            let held = holders.contains(&PodName {
                namespace: target.namespace.clone(),
                name: target.name.clone(),
            });
            (held || uids.contains_key(&target.uid)).then_some(target)
        })
        .collect();
    Ok((targets, host))
}

/// What a MIG change disturbs on this node.
#[derive(Debug, Default)]
pub struct Disturbed {
    /// Host PIDs of the CUDA processes on the devices that go away (NVML).
    pub pids: Vec<u32>,
    /// Pods the kubelet lists as holding those devices, running or not.
    pub holders: BTreeSet<PodName>,
    /// The pods the profile's author said the change evicts (`namespace/name`), when it said:
    /// a pod to evict outside it stops the drain before its first eviction.
    pub predicted: Option<BTreeSet<String>>,
}

impl Disturbed {
    pub fn is_empty(&self) -> bool {
        self.pids.is_empty() && self.holders.is_empty()
    }
}

/// Evict the pods behind the disturbed PIDs and the pods holding a disturbed device, and wait
/// until they and the processes are gone. `still_running` re-reads NVML and returns which of
/// the PIDs still run. `on_blocked` hears, once per pod and reason, that an eviction is
/// refused and the drain waits (`namespace/name: why`), so the agent can say so on the Node's
/// Events while it waits, not only in its log.
#[allow(clippy::too_many_arguments)]
pub async fn drain<F, Fut>(
    client: kube::Client,
    eviction_client: kube::Client,
    node: &str,
    disturbed: &Disturbed,
    settings: &DrainSettings,
    metrics: &Metrics,
    still_running: F,
    on_blocked: &(dyn Fn(&str) + Sync),
) -> Result<usize, DrainError>
where
    F: Fn(Vec<u32>) -> Fut,
    Fut: std::future::Future<Output = Vec<u32>>,
{
    let started = Instant::now();
    let all_pods: Api<Pod> = Api::all(client.clone());
    let pids = &disturbed.pids;
    let (targets, host_pids) = targets(&all_pods, node, pids, &disturbed.holders, settings).await?;
    // All or nothing: one pod that may not be evicted stops the drain before the first
    // eviction, so no pod is evicted for a change that cannot happen yet.
    let not_evictable: Vec<String> = targets
        .iter()
        .flat_map(|t| t.loses.iter().map(move |loss| (t, loss)))
        .filter(|(_, loss)| !loss.allowed(settings))
        .map(|(t, loss)| format!("{t}: {}", loss.explain()))
        .collect();
    if let Some(predicted) = &disturbed.predicted {
        let unpredicted: Vec<String> = targets
            .iter()
            .map(ToString::to_string)
            .filter(|pod| !predicted.contains(pod))
            .collect();
        if !unpredicted.is_empty() {
            return Err(DrainError::NotPredicted {
                pods: unpredicted,
                predicted: predicted.iter().cloned().collect(),
            });
        }
    }
    if !not_evictable.is_empty() {
        return Err(DrainError::NotEvictable {
            pods: not_evictable,
        });
    }
    if !host_pids.is_empty() {
        warn!(
            ?host_pids,
            "processes outside any pod use the GPUs that change; waiting for them to exit"
        );
    }
    info!(
        pods = %targets.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "),
        "draining the pods that use the GPU instances that change"
    );
    let mut left: BTreeSet<Target> = targets.iter().cloned().collect();
    let mut blocked: BTreeMap<Target, String> = BTreeMap::new();
    let mut backoff = settings.backoff;
    let mut last_progress = Instant::now();
    while !left.is_empty() {
        for t in left.clone() {
            let api: Api<Pod> = Api::namespaced(eviction_client.clone(), &t.namespace);
            // A request that never answers must not outlive the drain timeout.
            let limit = settings
                .timeout
                .saturating_sub(started.elapsed())
                .clamp(Duration::from_millis(100), Duration::from_secs(30));
            let answer = tokio::time::timeout(
                limit,
                api.evict(
                    &t.name,
                    &crate::field_manager::evict(crate::field_manager::AGENT),
                ),
            )
            .await
            .unwrap_or_else(|_| {
                Err(kube::Error::Service(
                    format!("eviction request gave no answer within {limit:?}").into(),
                ))
            });
            match answer {
                Ok(_) => {
                    metrics.eviction("evicted");
                    info!(pod = %t, "evicted");
                    left.remove(&t);
                    blocked.remove(&t);
                }
                Err(kube::Error::Api(s)) if s.code == 404 => {
                    left.remove(&t);
                    blocked.remove(&t);
                }
                Err(kube::Error::Api(s)) if s.code == 429 => {
                    metrics.eviction("blocked");
                    let why = format!("blocked by a PodDisruptionBudget: {}", s.message);
                    // Said at once, not only in the 10 s progress line: an operator watching a
                    // drain that does not move wants the budget's name now.
                    if blocked.get(&t) != Some(&why) {
                        info!(pod = %t, %why, "eviction refused; waiting and retrying");
                        on_blocked(&format!("{t}: {why}"));
                    }
                    blocked.insert(t, why);
                }
                Err(e) => {
                    blocked.insert(t, format!("eviction failed: {e}"));
                }
            }
        }
        if left.is_empty() {
            break;
        }
        check_deadline(started, settings, || {
            left.iter()
                .map(|t| {
                    format!(
                        "{t} {}",
                        blocked.get(t).map_or("not evicted", String::as_str)
                    )
                })
                .collect()
        })?;
        if last_progress.elapsed() >= Duration::from_secs(10) {
            info!(
                left = left.len(),
                of = targets.len(),
                waited = ?started.elapsed(),
                timeout = ?settings.timeout,
                blocked = %blocked.iter().map(|(t, why)| format!("{t}: {why}")).collect::<Vec<_>>().join("; "),
                "draining"
            );
            last_progress = Instant::now();
        }
        let remaining = settings.timeout.saturating_sub(started.elapsed());
        tokio::time::sleep(backoff.min(remaining)).await;
        backoff = (backoff * 2).min(settings.max_backoff);
    }
    wait_until_gone(
        &all_pods,
        node,
        pids,
        &targets,
        started,
        settings,
        still_running,
    )
    .await?;
    Ok(targets.len())
}

/// Wait for the evicted pods to leave the API and for the PIDs to leave NVML.
async fn wait_until_gone<F, Fut>(
    pods: &Api<Pod>,
    node: &str,
    pids: &[u32],
    targets: &[Target],
    started: Instant,
    settings: &DrainSettings,
    still_running: F,
) -> Result<(), DrainError>
where
    F: Fn(Vec<u32>) -> Fut,
    Fut: std::future::Future<Output = Vec<u32>>,
{
    let uids: BTreeSet<&str> = targets.iter().map(|t| t.uid.as_str()).collect();
    let mut last_progress = Instant::now();
    loop {
        let on_node = pods
            .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
            .await?;
        let pods_left: Vec<String> = on_node
            .items
            .iter()
            .filter(|p| p.metadata.uid.as_deref().is_some_and(|u| uids.contains(u)))
            .map(|p| {
                format!(
                    "{}/{} still terminating",
                    p.metadata.namespace.as_deref().unwrap_or(""),
                    p.metadata.name.as_deref().unwrap_or("")
                )
            })
            .collect();
        let running = still_running(pids.to_vec()).await;
        if pods_left.is_empty() && running.is_empty() {
            return Ok(());
        }
        let describe = || {
            let mut left = pods_left.clone();
            left.extend(
                running
                    .iter()
                    .map(|p| format!("PID {p} still uses the GPU")),
            );
            left
        };
        check_deadline(started, settings, describe)?;
        if last_progress.elapsed() >= Duration::from_secs(10) {
            info!(left = %describe().join("; "), waited = ?started.elapsed(), "waiting for GPU processes to exit");
            last_progress = Instant::now();
        }
        tokio::time::sleep(settings.backoff.min(Duration::from_millis(500))).await;
    }
}

fn check_deadline(
    started: Instant,
    settings: &DrainSettings,
    left: impl FnOnce() -> Vec<String>,
) -> Result<(), DrainError> {
    if started.elapsed() >= settings.timeout {
        return Err(DrainError::Timeout {
            waited: started.elapsed(),
            left: left(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodSpec, Volume};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    fn pod(controller: Option<bool>, empty_dir: bool) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.owner_references = controller.map(|c| {
            vec![OwnerReference {
                kind: "ReplicaSet".into(),
                controller: Some(c),
                ..Default::default()
            }]
        });
        let volume = Volume {
            name: "scratch".into(),
            empty_dir: Some(Default::default()),
            ..Default::default()
        };
        pod.spec = Some(PodSpec {
            volumes: empty_dir.then(|| vec![volume]),
            ..Default::default()
        });
        pod
    }

    /// kubectl's filters are independent (k8s.io/kubectl/pkg/drain/filters.go): `--force`
    /// does not allow deleting emptyDir data, so a bare pod with emptyDir has both losses.
    #[test]
    fn each_loss_is_found_on_its_own() {
        assert_eq!(Loss::of(&pod(Some(true), false)), []);
        assert_eq!(Loss::of(&pod(None, false)), [Loss::BarePod]);
        // An owner that is not the controller does not recreate the pod.
        assert_eq!(Loss::of(&pod(Some(false), false)), [Loss::BarePod]);
        assert_eq!(Loss::of(&pod(Some(true), true)), [Loss::EmptyDirData]);
        assert_eq!(
            Loss::of(&pod(None, true)),
            [Loss::BarePod, Loss::EmptyDirData]
        );
    }
}
