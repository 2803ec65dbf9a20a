//! `gpu-share agent`: the node agent, run as a DaemonSet pod on every GPU node.
//!
//! It watches its own Node (for the `gpu-share.dev/profile` label) and the profiles ConfigMap
//! with kube-runtime watchers, and reconciles when the label or the selected key's content
//! changes, after a failure (with backoff, no label change needed) and periodically (MPS daemons
//! and the plugin config are re-checked). State is published on the Node as a label,
//! annotations and Events; `/healthz`, `/readyz` and `/metrics` are served over HTTP.
//!
//! Why a loop of its own (`reconcile_loop`) and not kube-runtime's `Controller` (decided for
//! issue 39; controller-rs and akri use `Controller`): the agent keeps kube-runtime's
//! `watcher` (relists, its backoff) and replaces only the queue. It reconciles one object, its
//! own Node, from two sources (the Node and the profiles ConfigMap), and acts on a change of
//! what they *want* (the label and the selected key's text), compared in `desired`; each source
//! is a latest-value `tokio::sync::watch`, so a burst of events collapses into one reconcile of
//! the last value, which is the de-duplication a `Controller` queue gives. A `Controller` runs
//! its reconciler on every event of the watched object, and the agent's own writes to its Node
//! are such events: a change without MIG steps writes the Node once (state and annotations in
//! one PATCH), a MIG change 5 times (`pending`, the cordon, `applying`, the uncordon,
//! `success`; `tests/agent.rs`, `the_agents_own_node_writes_wake_the_loop_but_reconcile_nothing`
//! counts them and checks they start no reconcile), so it would need a predicate that computes
//! the same desire. Its backoff
//! is the loop's (5 s doubling to 5 min, reset by success) and its timer the resync. What a queue
//! could save is not there to save: watch event → reconcile start is 44 µs at p50 (165 µs p90;
//! benches/README.md, "Label change → device-plugin config written").

pub mod advertisement;
pub mod allocatable;
mod args;
pub mod device_health;
pub mod devices_in_use;
mod dra;
pub mod drain;
pub mod events;
pub mod found_gpus;
mod heap;
pub mod http;
mod inventory;
pub mod lease;
pub mod metrics;
pub mod node;
pub mod outcome;
pub mod pods;
pub mod readvertised;
pub mod reconcile;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::api::ListParams;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::watcher::{self, watcher};
use kube::runtime::WatchStreamExt;
use kube::{Api, Resource};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::builtin_plugin::{Inventory, ManagerSettings, PluginManager};
use crate::doctor::{self, DoctorOptions, Status};
use crate::dra::api::ResourceSlice;
use crate::dra::kubelet_plugin::dynamic_mig::DynamicMig;
use crate::dra::kubelet_plugin::mig_journal::SharedMigJournal;
use crate::dra::kubelet_plugin::{Inputs as DraInputs, KubeletPlugin, Settings as DraSettings};
use crate::gpu::SharedGpus;
use crate::sharing::PluginKind;
use drain::DrainSettings;
use http::Health;
use lease::DrainSlots;
use metrics::Metrics;
use outcome::Outcome;
use reconcile::{Desired, Reconciler};

pub use args::{AgentArgs, Reload};

/// The agent's tokio runtime: one thread for all of its async work (the two watches, the
/// reconcile loop, the HTTP endpoints, lease renewals), which waits on the network nearly all
/// the time; NVML, file and process work goes to tokio's blocking pool, whose threads end after
/// 10 s idle. A multi-thread runtime adds a worker per core (2 on a 2-core node, 64 on a large
/// one), each with its stack and, under glibc, its malloc arena: resident memory for nothing
/// (benches/README.md, "Agent memory"). `GPU_SHARE_AGENT_WORKERS=N` (N ≥ 1) asks for a
/// multi-thread runtime of N workers instead. glibc's arena cap is left alone: with one
/// runtime thread, 16, 2 or 1 arenas measured the same idle RSS (`MALLOC_ARENA_MAX` still
/// applies); what the blocking threads freed is given back as each ends (`heap`).
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    let workers = std::env::var("GPU_SHARE_AGENT_WORKERS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|n| *n > 0);
    let mut builder = match workers {
        Some(n) => {
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            builder.worker_threads(n);
            builder
        }
        None => tokio::runtime::Builder::new_current_thread(),
    };
    builder
        .on_thread_stop(heap::return_freed_heap)
        .enable_all()
        .build()
}

/// Run until SIGTERM/SIGINT.
pub async fn run(args: AgentArgs) -> anyhow::Result<()> {
    let mut config = kube::Config::infer()
        .await
        .context("cannot find the Kubernetes API (in-cluster config or KUBECONFIG)")?;
    crate::field_manager::identify(&mut config, crate::field_manager::AGENT);
    // Watches are long requests that may rightly stay silent for minutes: they get kube's
    // defaults (no read timeout; kube-runtime's watcher has its own idle timeout). Every other
    // request goes through a client whose reads time out, so a request the API server never
    // answers fails like any other API error instead of stalling the reconcile loop.
    let watch_client = kube::Client::try_from(config.clone())?;
    let config = short_request_config(config, args.api_timeout);
    let client = kube::Client::try_from(config.clone())?;
    // kube's default client retries 429s by itself (up to 15 times): evictions refused by a
    // PodDisruptionBudget must come back to the drain loop, which owns their backoff, timeout
    // and progress lines.
    let mut no_retry = config;
    no_retry.default_retry = false;
    let eviction_client = kube::Client::try_from(no_retry)?;
    let metrics = Metrics::new();
    let health = Health::new();
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    info!(addr = %listener.local_addr()?, "serving /healthz, /readyz and /metrics");
    tokio::spawn(http::serve(listener, metrics.clone(), health.clone()));
    health.set_live();

    let nodes: Api<Node> = Api::all(client.clone());
    let node_ref = nodes
        .get(&args.node_name)
        .await
        .with_context(|| format!("cannot read this node, {}", args.node_name))?
        .object_ref(&());
    // --plugin dra: the node's published devices, for the kubelet DRA plugin
    // (`published.subscribe()`); the publisher sends after each publish and withdrawal.
    let published = (args.plugin == PluginKind::Dra).then(|| {
        watch::channel(std::sync::Arc::new(
            Vec::<crate::dra::api::ResourceSlice>::new(),
        ))
        .0
    });
    let dra = published.map(|published| {
        info!("publishing the node's GPUs as ResourceSlices (--plugin dra)");
        let uid = node_ref.uid.as_deref().unwrap_or_default();
        crate::dra::publish::Publisher::new(client.clone(), &args.node_name, uid, published)
    });
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "gpu-share".into(),
            instance: Some(args.node_name.clone()),
        },
    );
    let device_listing = crate::builtin_plugin::DeviceListing::new(
        &args.device_list_strategy,
        &args.cdi_kind,
        &args.cdi_annotation_prefix,
    )
    .map_err(anyhow::Error::msg)?;
    let gpus = SharedGpus::new(args.nvml_lib.clone(), args.host_root.clone());
    let faults = match gpus.tegra() {
        // XIDs come through NVML, which a Tegra lacks: nothing to watch, and a watch would
        // only retry loading NVML every 30 s.
        Some(board) => {
            info!(board = %board.describe(), "Jetson/Tegra integrated GPU found without NVML: \
                  no XID health watch");
            crate::gpu::xid::Faults::default()
        }
        None => device_health::start(
            args.nvml_lib.clone(),
            gpus.clone(),
            args.xid_heal_after,
            device_health::Reporting {
                recorder: recorder.clone(),
                node_ref: node_ref.clone(),
                metrics: metrics.clone(),
            },
        ),
    };
    // --plugin dra: the applied devices (sent after each apply) the kubelet plugin prepares
    // claims from, beside the published slices (`dra.subscribe()`).
    let dra_devices = watch::channel(Arc::new(Inventory::default()));
    let published_slices = dra.as_ref().map(crate::dra::publish::Publisher::subscribe);
    let mig_journal = SharedMigJournal::new(&args.dra_plugin_dir);
    let reconciler = Reconciler {
        client: client.clone(),
        eviction_client,
        node_name: args.node_name.clone(),
        node_ref,
        recorder,
        metrics: metrics.clone(),
        slots: DrainSlots::new(
            client.clone(),
            &args.profiles.namespace,
            &args.node_name,
            args.max_concurrent_drains,
            args.lease_duration,
        ),
        drain: DrainSettings {
            timeout: args.drain_timeout,
            proc_root: args.proc_root.clone(),
            pod_resources_socket: args.pod_resources_socket.clone(),
            backoff: args.eviction_backoff,
            max_backoff: Duration::from_secs(30),
            evict_bare_pods: args.evict_bare_pods,
            delete_emptydir_data: args.delete_emptydir_data,
        },
        apply: args.apply_options(),
        gpus: gpus.clone(),
        plugin_pod_selector: (args.plugin_reload == Reload::Restart)
            .then(|| args.plugin_pod_selector.clone()),
        configmap: format!("{}/{}", args.profiles.namespace, args.profiles.configmap),
        plugins: (args.plugin == PluginKind::Builtin).then(|| {
            info!(dir = %args.device_plugin_dir.display(), "serving the built-in device plugin");
            PluginManager::start(ManagerSettings {
                dir: args.device_plugin_dir.clone(),
                gpus,
                faults: faults.clone(),
                health_interval: args.plugin_health_interval,
                kubelet_poll: args.kubelet_poll_interval,
                device_listing,
            })
        }),
        dra,
        faults: faults.clone(),
        taint_effect: args.xid_taint_effect,
        node_write_failures: Default::default(),
        node_write_refused: Default::default(),
        cdi_refresh: args
            .cdi_refresh_command
            .as_deref()
            .map(|c| c.split_whitespace().map(str::to_string).collect())
            .unwrap_or_default(),
        cdi_refresh_owed: true.into(),
        inventory: Default::default(),
        dra_devices: (args.plugin == PluginKind::Dra).then(|| dra_devices.0.clone()),
        mig_journal: (args.plugin == PluginKind::Dra).then(|| mig_journal.clone()),
        allocatable_timeout: match args.plugin {
            PluginKind::Dra => Duration::ZERO,
            PluginKind::Nvidia | PluginKind::Builtin => args.allocatable_timeout,
        },
    };
    let dra_plugin = match published_slices {
        Some(slices) => Some(start_dra_plugin(
            &args,
            client.clone(),
            slices,
            &dra_devices.0,
            faults.clone(),
            DynamicMig {
                gpus: reconciler.gpus.clone(),
                journal: mig_journal,
                republish: Default::default(),
            },
        )?),
        None => None,
    };
    let doctor_ok = start_up_checks(&args, &reconciler).await;
    release_forgotten_slot(&reconciler).await;

    let (node_tx, node_rx) = watch::channel(None::<Node>);
    let (cm_tx, cm_rx) = watch::channel(None::<Option<ConfigMap>>);
    tokio::spawn(watch_node(
        Api::all(watch_client.clone()),
        args.node_name.clone(),
        node_tx,
    ));
    let cms: Api<ConfigMap> = Api::namespaced(watch_client, &args.profiles.namespace);
    tokio::spawn(watch_configmap(cms, args.profiles.configmap.clone(), cm_tx));

    let republish = dra_plugin.as_ref().map(KubeletPlugin::republish_requests);
    let loop_ = reconcile_loop(
        &args,
        &reconciler,
        node_rx,
        cm_rx,
        republish,
        &health,
        doctor_ok,
    );
    tokio::select! {
        () = loop_ => {}
        () = shutdown_signal() => info!("shutting down"),
    }
    // The built-in plugin's sockets go with the agent, so the kubelet does not dial a dead one.
    if let Some(plugins) = &reconciler.plugins {
        plugins.shutdown().await;
    }
    if let Some(plugin) = dra_plugin {
        plugin.shutdown().await;
    }
    Ok(())
}

/// Serve the kubelet DRA plugin (`--plugin dra`) from the `published` slices and the applied
/// `devices`, with device health from `faults`.
fn start_dra_plugin(
    args: &AgentArgs,
    client: kube::Client,
    published: watch::Receiver<Arc<Vec<ResourceSlice>>>,
    devices: &watch::Sender<Arc<Inventory>>,
    faults: crate::gpu::xid::Faults,
    dynamic_mig: DynamicMig,
) -> anyhow::Result<KubeletPlugin> {
    let settings = DraSettings {
        node_name: args.node_name.clone(),
        registration_dir: args.dra_registration_dir.clone(),
        plugin_dir: args.dra_plugin_dir.clone(),
        cdi_root: args.cdi_root.clone(),
    };
    let inputs = DraInputs {
        slices: published,
        inventory: devices.subscribe(),
        listing: crate::builtin_plugin::DeviceListing::new(
            &args.device_list_strategy,
            &args.cdi_kind,
            &args.cdi_annotation_prefix,
        )
        .map_err(anyhow::Error::msg)?,
        faults,
        dynamic_mig,
    };
    info!(registration = %settings.registration_dir.display(),
          plugin = %settings.plugin_dir.display(), "serving the kubelet DRA plugin");
    Ok(KubeletPlugin::start(&settings, client, inputs)?)
}

/// `config` with every read and write bounded by `limit`, counted from when the request is
/// sent (not from when its pooled connection went idle). A read timeout bounds a silent server,
/// which is how a hung request looks; kube's own retries of 429/503/504 answers stay on.
pub(crate) fn short_request_config(mut config: kube::Config, limit: Duration) -> kube::Config {
    config.read_timeout = Some(limit);
    config.reset_reader_on_write = true;
    config.write_timeout = Some(config.write_timeout.map_or(limit, |t| t.min(limit)));
    config.connect_timeout = Some(config.connect_timeout.map_or(limit, |t| t.min(limit)));
    config
}

/// Why the start-up check of the GPU stack did not pass; either keeps the agent unready.
#[derive(Debug, thiserror::Error)]
enum GpuStackError {
    /// The driver or NVML layer failed: each failed check, as doctor reports it.
    #[error("{0}")]
    Broken(String),
    /// The check itself did not finish (its blocking task panicked or was cancelled).
    #[error("the check did not finish: {0}")]
    NotRun(#[from] tokio::task::JoinError),
}

/// The driver and NVML layers of `gpu-share doctor`, reported as an Event and in /readyz.
async fn start_up_checks(args: &AgentArgs, reconciler: &Reconciler) -> Result<(), GpuStackError> {
    let options = DoctorOptions {
        host_root: args.host_root.clone(),
        ..DoctorOptions::default()
    };
    let lib = args.nvml_lib.clone();
    let report =
        tokio::task::spawn_blocking(move || doctor::run(&options, lib.as_deref(), None)).await?;
    let lower: Vec<&doctor::Check> = report
        .checks
        .iter()
        .filter(|c| c.name == "driver" || c.name == "nvml")
        .collect();
    let summary: Vec<String> = lower
        .iter()
        .map(|c| format!("{}: {:?} — {}", c.name, c.status, c.found))
        .collect();
    let failed = lower.iter().any(|c| c.status == Status::Fail);
    let (type_, reason) = if failed {
        (kube::runtime::events::EventType::Warning, "GpuStackBroken")
    } else {
        (kube::runtime::events::EventType::Normal, "GpuStackChecked")
    };
    let note = summary.join("; ");
    let event = kube::runtime::events::Event {
        type_,
        reason: reason.into(),
        action: events::event_action("Doctor", &note),
        note: Some(note),
        secondary: None,
    };
    if let Err(e) = reconciler
        .recorder
        .publish(&event, &reconciler.node_ref)
        .await
    {
        warn!(error = %e, "could not publish the start-up check event");
    }
    if failed {
        warn!(checks = %summary.join("; "), "the GPU stack below gpu-share is broken");
        Err(GpuStackError::Broken(summary.join("; ")))
    } else {
        Ok(())
    }
}

/// A drain slot still held from before a crash, with no reconfiguration in progress (the node
/// is not cordoned by us), would make other nodes wait out its lease: free it.
async fn release_forgotten_slot(reconciler: &Reconciler) {
    let nodes: Api<Node> = Api::all(reconciler.client.clone());
    let in_progress = nodes
        .get(&reconciler.node_name)
        .await
        .map(|n| node::annotation(&n, node::CORDON_ANNOTATION).is_some())
        .unwrap_or(true);
    if !in_progress {
        if let Err(e) = reconciler.slots.release_own().await {
            warn!(error = %e, "could not free a drain slot left from before a restart");
        }
    }
}

/// Keep the latest version of this node in `tx` (a watcher, with its own relists, and
/// kube-runtime's default backoff after an error: 800 ms doubling to 30 s, reset once it works).
async fn watch_node(api: Api<Node>, name: String, tx: watch::Sender<Option<Node>>) {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut stream = watcher(api, config).default_backoff().boxed();
    while let Some(event) = stream.next().await {
        match event {
            Ok(watcher::Event::Apply(n) | watcher::Event::InitApply(n)) => {
                tx.send_replace(Some(n));
            }
            Ok(_) => {}
            Err(e) => {
                warn!(error = %e, "node watch failed; retrying with backoff");
            }
        }
    }
}

/// Keep the profiles ConfigMap in `tx`: `Some(None)` once known to be absent.
async fn watch_configmap(
    api: Api<ConfigMap>,
    name: String,
    tx: watch::Sender<Option<Option<ConfigMap>>>,
) {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut stream = watcher(api, config).default_backoff().boxed();
    let mut seen_in_init = false;
    while let Some(event) = stream.next().await {
        match event {
            Ok(watcher::Event::Apply(cm) | watcher::Event::InitApply(cm)) => {
                seen_in_init = true;
                tx.send_replace(Some(Some(cm)));
            }
            Ok(watcher::Event::Delete(_)) => {
                tx.send_replace(Some(None));
            }
            Ok(watcher::Event::Init) => seen_in_init = false,
            Ok(watcher::Event::InitDone) => {
                if !seen_in_init {
                    tx.send_replace(Some(None));
                }
            }
            Err(e) => {
                warn!(error = %e, "configmap watch failed; retrying with backoff");
            }
        }
    }
}

/// What the node's label and the ConfigMap ask for.
fn desired(node: &Node, cm: Option<&ConfigMap>) -> Desired {
    let Some(key) = node::label(node, node::PROFILE_LABEL) else {
        return Desired::Nothing;
    };
    match cm.and_then(|c| c.data.as_ref()).and_then(|d| d.get(key)) {
        Some(text) => Desired::Profile {
            key: key.to_string(),
            text: text.clone(),
        },
        None => Desired::MissingKey {
            key: key.to_string(),
        },
    }
}

/// The ConfigMap watch can lag the Node watch: a label set right after its key was added (the
/// usual way to roll out a new profile) may arrive first. Calling the key missing then would
/// flash state `failed` (MissingProfile) for a profile that exists, so the ConfigMap is read
/// afresh first: a list without a resourceVersion is served from the API's current state, not
/// a watch cache, and a list by `metadata.name` is what the agent's Role grants (list and
/// watch of that one ConfigMap; no get). A key the read lacks too stays missing: a mistyped
/// label should fail at once, not wait as `pending`.
async fn confirm_missing_key(want: Desired, cms: &Api<ConfigMap>, name: &str) -> Desired {
    let Desired::MissingKey { key } = &want else {
        return want;
    };
    let by_name = ListParams::default().fields(&format!("metadata.name={name}"));
    match cms.list(&by_name).await {
        Ok(list) => {
            let text = list
                .items
                .into_iter()
                .find_map(|cm| cm.data.and_then(|mut d| d.remove(key)));
            match text {
                Some(text) => {
                    info!(
                        key,
                        "the profile key is in the ConfigMap; its watch had not caught up"
                    );
                    Desired::Profile {
                        key: key.clone(),
                        text,
                    }
                }
                None => want,
            }
        }
        Err(e) => {
            warn!(error = %e, "could not read the ConfigMap to confirm a missing key");
            want
        }
    }
}

async fn reconcile_loop(
    args: &AgentArgs,
    reconciler: &Reconciler,
    mut node_rx: watch::Receiver<Option<Node>>,
    mut cm_rx: watch::Receiver<Option<Option<ConfigMap>>>,
    mut republish: Option<watch::Receiver<u64>>,
    health: &Health,
    doctor: Result<(), GpuStackError>,
) {
    // Wait until both watchers have synced: acting on a half-known world is how the NVIDIA
    // config-manager advertised 0 GPUs at start-up (DP#1645).
    let _ = node_rx.wait_for(Option::is_some).await;
    let _ = cm_rx.wait_for(Option::is_some).await;
    // A restarted agent's first scrape says the state the Node says, not 0 for every state
    // until the next change (the first reconcile of an unchanged profile publishes nothing).
    if let Some(state) = node_rx
        .borrow()
        .as_ref()
        .and_then(|n| node::label(n, node::STATE_LABEL))
        .filter(|s| metrics::STATES.contains(s))
    {
        reconciler.metrics.set_state(state);
    }
    set_readiness(health, &doctor, None);
    let cms: Api<ConfigMap> = Api::namespaced(reconciler.client.clone(), &args.profiles.namespace);
    let resync = args.resync_period;
    let mut last: Option<Desired> = None;
    let mut retry = Duration::from_secs(5);
    let mut next_run = tokio::time::Instant::now();
    loop {
        // Read in place: our own state patches wake this loop too, and most wakes change nothing.
        let want = desired(
            node_rx.borrow_and_update().as_ref().expect("synced"),
            cm_rx.borrow_and_update().as_ref().expect("synced").as_ref(),
        );
        let changed = last.as_ref() != Some(&want);
        if changed || tokio::time::Instant::now() >= next_run {
            // Only a changed desire (or the retry/resync timer) reconciles. A change is acted
            // on at once, with the Node the watch just delivered; the timer reads afresh.
            // `last` keeps the cached desire: the ConfigMap watch catching up reconciles once more.
            let acted_on = confirm_missing_key(want.clone(), &cms, &args.profiles.configmap).await;
            let outcome = if changed {
                info!(want = ?acted_on, "reconciling");
                let seen = node_rx.borrow().clone().expect("synced");
                reconciler.reconcile_seen(&acted_on, Some(&seen)).await
            } else {
                reconciler.reconcile(&acted_on).await
            };
            next_run = match outcome {
                Outcome::Failed { .. } => {
                    let at = tokio::time::Instant::now() + retry;
                    retry = (retry * 2).min(Duration::from_secs(300));
                    at
                }
                Outcome::Success | Outcome::Noop => {
                    retry = Duration::from_secs(5);
                    tokio::time::Instant::now() + resync
                }
            };
            set_readiness(health, &doctor, reconciler.refused_node_write());
            last = Some(want);
        }
        tokio::select! {
            _ = node_rx.changed() => {}
            _ = cm_rx.changed() => {}
            () = tokio::time::sleep_until(next_run) => {}
            requested = next_request(&mut republish) => {
                if requested {
                    // The kubelet (re)registered the DRA plugin (a restarted kubelet deleted
                    // the node's slices first), or a Prepare met an out-of-band MIG instance:
                    // publish now, not at the next resync.
                    info!("reconciling to republish the ResourceSlices");
                    next_run = tokio::time::Instant::now();
                }
            }
        }
    }
}

/// Wait for the DRA plugin's next republish request: true when one came, false when the plugin
/// is gone (then never again); never resolves without a DRA plugin.
async fn next_request(requests: &mut Option<watch::Receiver<u64>>) -> bool {
    let Some(rx) = requests.as_mut() else {
        return std::future::pending().await;
    };
    if rx.changed().await.is_ok() {
        return true;
    }
    *requests = None;
    false
}

/// Ready once the watchers synced, unless the start-up GPU stack check failed or the API server
/// refuses the agent's writes to its Node (403: RBAC or the admission policy; retries cannot
/// mend it, and without the state label nobody would see why nothing happens).
fn set_readiness(health: &Health, doctor: &Result<(), GpuStackError>, refused: Option<String>) {
    match (doctor, refused) {
        (Err(why), _) => health.set_ready(false, format!("GPU stack check failed: {why}")),
        (Ok(()), Some(write)) => health.set_ready(
            false,
            format!(
                "the API server refuses the agent's Node writes ({write}): check the ClusterRole \
                 gpu-share-agent and the ValidatingAdmissionPolicy gpu-share-agent-scope"
            ),
        ),
        (Ok(()), None) => health.set_ready(true, "watchers synced".into()),
    }
}

pub(crate) async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
