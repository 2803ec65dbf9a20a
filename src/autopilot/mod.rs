//! `gpu-share autopilot`: runs `advise` on the live cluster when pods or nodes change
//! (debounced) and applies the result only through the agents' path: profiles under its own
//! ConfigMap keys (`advised-<node>`) and the nodes' `gpu-share.dev/profile` label. The agents
//! then drain only the affected pods, honour PDBs and the fleet drain budget.
//!
//! One active replica ([`leader`]: a Lease). Each round ([`round`]) decides per node from what
//! the API says now ([`rollout`], pure: budget, PDBs, what runs already), so it keeps no state
//! of its own and a restarted autopilot resumes a rollout. [`publish`] writes the status
//! ConfigMap and the Events. The contract (flags, names, RBAC): docs/autopilot.md.

pub mod leader;
pub mod publish;
pub mod rollout;
pub mod round;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::watcher::{self, watcher};
use kube::runtime::WatchStreamExt;
use kube::Api;
use tokio::sync::Notify;
use tracing::{info, warn};

use crate::duration;
use crate::sharing::PluginKind;
use leader::Leader;
use round::{Round, Settings, OPT_IN_SELECTOR};

/// The autopilot's flags, each with its environment variable for the Deployment.
#[derive(clap::Args, Debug, Clone)]
pub struct AutopilotArgs {
    /// The agents' profiles; the autopilot writes only its `advised-<node>` keys.
    #[command(flatten)]
    pub profiles: crate::profile::ProfilesSource,
    /// What it did or would do, under the key `status.yaml`.
    #[arg(
        long,
        env = "GPU_SHARE_STATUS_CONFIGMAP",
        default_value = "gpu-share-autopilot-status"
    )]
    pub status_configmap: String,
    /// The leader-election Lease: one active replica.
    #[arg(long, env = "GPU_SHARE_LEASE", default_value = "gpu-share-autopilot")]
    pub lease: String,
    /// This replica's identity in the Lease (default: the host name).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// How long a Lease outlives its last renewal (renewed every third of it; 1s to 1h).
    #[arg(long, env = "GPU_SHARE_LEASE_DURATION", default_value = "15s",
          alias = "lease-duration-seconds", value_parser = duration::lease_duration)]
    pub lease_duration: Duration,
    /// Publish Events and the status ConfigMap only; never write profiles or node labels.
    #[arg(long, env = "GPU_SHARE_DRY_RUN")]
    pub dry_run: bool,
    /// The device plugin the nodes run. Default: the one their agents run, as each publishes it
    /// on its node (`gpu-share.dev/plugin`), so the autopilot follows the overlay installed; the
    /// one most opted-in nodes run where they differ (the others are left out, with the reason),
    /// nvidia where no agent has published one yet.
    #[arg(long, env = "GPU_SHARE_PLUGIN", value_enum)]
    pub plugin: Option<PluginKind>,
    /// Advise runs this long after the last pod/node change (at most 6× this after the first,
    /// so steady churn cannot postpone it for ever).
    #[arg(long, env = "GPU_SHARE_DEBOUNCE", default_value = "10s",
          alias = "debounce-seconds", value_parser = duration::secs_or_duration)]
    pub debounce: Duration,
    /// The fleet drain budget, the agents' own (same flag, same variable): never more nodes
    /// relabelled and not yet settled than this.
    #[arg(
        long,
        env = "GPU_SHARE_MAX_DRAINS",
        default_value_t = 1,
        alias = "max-changing-nodes"
    )]
    pub max_concurrent_drains: u32,
}

/// `--debounce` at most: an hour of quiet before acting is already no autopilot.
pub const MAX_DEBOUNCE: Duration = Duration::from_secs(3600);

/// Refuse flags outside their bounds (docs/autopilot.md, "Bounds"), each naming the flag.
pub fn check_args(args: &AutopilotArgs) -> anyhow::Result<()> {
    // advise sizes device-plugin resources; DRA nodes publish devices, not resources.
    if args.plugin == Some(PluginKind::Dra) {
        anyhow::bail!(
            "--plugin dra: the autopilot plans for nodes running the nvidia or builtin device \
             plugin only (docs/autopilot.md)"
        );
    }
    // `--lease-duration`'s bounds are its parser's (`duration::lease_duration`): 0 would be a
    // Lease that has always lapsed, and its `leaseDurationSeconds` is an int32 that an
    // unbounded flag would wrap to a negative duration every other replica reads as lapsed.
    if args.debounce > MAX_DEBOUNCE {
        anyhow::bail!(
            "--debounce {}: must be at most {}",
            duration::show(args.debounce),
            duration::show(MAX_DEBOUNCE)
        );
    }
    Ok(())
}

/// A round also runs this long after the last one without any change seen (a missed watch
/// event, a drain slot Lease freed: Leases are not watched).
const RESYNC: Duration = Duration::from_secs(60);

/// Run until SIGTERM/SIGINT (then give the Lease back) or until leadership is lost (an error:
/// the Deployment restarts the process, which then waits for the Lease).
pub async fn run(args: AutopilotArgs) -> anyhow::Result<()> {
    check_args(&args)?;
    let mut config = kube::Config::infer()
        .await
        .context("cannot find the Kubernetes API (in-cluster config or KUBECONFIG)")?;
    crate::field_manager::identify(&mut config, crate::field_manager::AUTOPILOT);
    let watch_client = kube::Client::try_from(config.clone())?;
    let client = kube::Client::try_from(crate::agent::short_request_config(
        config,
        Duration::from_secs(30),
    ))?;
    let identity = args.identity.clone().unwrap_or_else(host_name);
    let leader = Leader::new(
        client.clone(),
        &args.profiles.namespace,
        &args.lease,
        &identity,
        args.lease_duration,
    );
    // One SIGTERM listener for the whole run: a listener made afresh each loop would miss a
    // signal that arrives during a round (advise runs off this thread, so the runtime takes
    // the signal while no listener exists).
    let shutdown = crate::agent::shutdown_signal();
    tokio::pin!(shutdown);
    let mut leadership = tokio::select! {
        l = leader.acquire() => l,
        _ = &mut shutdown => {
            // The acquire's write may have landed before the signal: give it back.
            leader.release().await;
            return Ok(());
        }
    };
    let changes = Arc::new(Notify::new());
    spawn_watchers(&watch_client, &changes);
    let round = Round {
        recorder: Recorder::new(
            client.clone(),
            Reporter {
                controller: "gpu-share-autopilot".into(),
                instance: Some(identity.clone()),
            },
        ),
        client,
        settings: Settings {
            namespace: args.profiles.namespace.clone(),
            configmap: args.profiles.configmap.clone(),
            status_configmap: args.status_configmap.clone(),
            identity,
            plugin: args.plugin,
            max_changing: args.max_concurrent_drains.max(1),
            dry_run: args.dry_run,
        },
    };
    if args.max_concurrent_drains == 0 {
        warn!("--max-concurrent-drains 0 would never change a node; using 1");
    }
    let debounce = args.debounce;
    info!(
        dry_run = args.dry_run,
        max_concurrent_drains = args.max_concurrent_drains,
        "autopilot running"
    );
    loop {
        tokio::select! {
            _ = wait_quiet(&changes, debounce) => {}
            why = leadership.lost() => anyhow::bail!("no longer the leader: {why}"),
            _ = &mut shutdown => {
                leadership.release().await;
                return Ok(());
            }
        }
        if let Err(e) = round.run().await {
            warn!(
                error = format!("{e:#}"),
                "autopilot round failed; retrying on the next change"
            );
        }
    }
}

/// Wait for a change (or [`RESYNC`]), then until none came for `debounce` (at most 6×
/// `debounce` in all).
async fn wait_quiet(changes: &Notify, debounce: Duration) {
    tokio::select! {
        _ = changes.notified() => {}
        _ = tokio::time::sleep(RESYNC) => return,
    }
    let deadline = tokio::time::Instant::now() + debounce * 6;
    loop {
        let quiet = tokio::time::sleep(debounce);
        tokio::select! {
            _ = changes.notified() => {
                if tokio::time::Instant::now() >= deadline {
                    return;
                }
            }
            _ = quiet => return,
        }
    }
}

/// Watch pods (all), opt-in nodes and PDBs; every event is a change.
fn spawn_watchers(client: &kube::Client, changes: &Arc<Notify>) {
    let pods: Api<Pod> = Api::all(client.clone());
    let nodes: Api<Node> = Api::all(client.clone());
    let pdbs: Api<PodDisruptionBudget> = Api::all(client.clone());
    let config = watcher::Config::default();
    tokio::spawn(notify_on(
        watcher(pods, config.clone()),
        changes.clone(),
        "pods",
    ));
    tokio::spawn(notify_on(
        watcher(nodes, config.clone().labels(OPT_IN_SELECTOR)),
        changes.clone(),
        "nodes",
    ));
    tokio::spawn(notify_on(
        watcher(pdbs, config),
        changes.clone(),
        "poddisruptionbudgets",
    ));
}

async fn notify_on<K>(
    stream: impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send,
    changes: Arc<Notify>,
    what: &'static str,
) {
    // kube-runtime's default backoff after an error (800 ms doubling to 30 s, reset once the
    // watch works again), so an API server that refuses the watch is not asked every second.
    let mut stream = std::pin::pin!(stream.default_backoff());
    while let Some(event) = stream.next().await {
        match event {
            Ok(_) => changes.notify_one(),
            Err(e) => warn!(error = %e, what, "watch failed; retrying with backoff"),
        }
    }
}

/// The host name (a pod's name by default), for the Lease identity.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "gpu-share-autopilot".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: AutopilotArgs,
    }

    /// What the autopilot says of `flags`: none when it takes them, else its refusal.
    fn refusal(flags: &[&str]) -> Option<String> {
        let cli = Cli::try_parse_from(std::iter::once("autopilot").chain(flags.iter().copied()));
        match cli {
            Err(e) => Some(e.to_string()),
            Ok(cli) => check_args(&cli.args).err().map(|e| e.to_string()),
        }
    }

    #[test]
    fn flags_outside_their_bounds_are_refused_naming_the_flag() {
        assert_eq!(refusal(&["--plugin", "nvidia"]), None);
        let e = refusal(&["--lease-duration", "0s"]).expect("refused");
        assert!(
            e.contains("--lease-duration") && e.contains("from 1s to 1h"),
            "{e}"
        );
        // An int32 Lease field: 2^32 + 1 would have been written as 1, 2^31 as negative.
        let e = refusal(&["--lease-duration", "2147483648s"]).expect("refused");
        assert!(e.contains("from 1s to 1h"), "{e}");
        let e = refusal(&["--debounce", "NaN"]).expect("refused");
        assert!(
            e.contains("--debounce") && e.contains("not a duration"),
            "{e}"
        );
        let e = refusal(&["--debounce", "2h"]).expect("refused");
        assert_eq!(e, "--debounce 2h: must be at most 1h");
        let e = refusal(&["--plugin", "dra"]).expect("refused");
        assert!(e.starts_with("--plugin dra"), "{e}");
    }
}
