//! The simulated world: the Kubernetes API double, one 8 × H100 node (fake NVML, host
//! fixtures, simulated kubelet with PodResources and the device-plugin manager) and the real
//! agent, in-process, serving the built-in device plugin.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::Context;
use clap::Parser;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::watcher::{self, watcher};
use kube::Api;
use kube_double::KubeDouble;
use node_sim::{
    h100s, AgentNode, DevicePluginKubelet, PodResourcesKubelet, Workload, CM, NS, REASON,
    STATE_LABEL,
};

pub const NODE: &str = "gpu-node-1";

/// What GPU Feature Discovery labels an 8 × H100 node with (mixed MIG strategy: the product
/// without a `-MIG-` suffix, the count of whole GPUs; nvidia-stack.md §1.8). The agent ignores
/// them; the autopilot reads the node's GPUs from them.
pub const GFD_LABELS: [(&str, &str); 2] = [
    ("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"),
    ("nvidia.com/gpu.count", "8"),
];

/// One state the agent published on the Node: when the demo's watch saw it, the state label
/// and the reason annotation.
#[derive(Debug, Clone)]
pub struct Seen {
    pub at: Instant,
    pub state: String,
    pub reason: String,
}

/// Where the fixtures live; chosen before anything starts (see [`point_environment_here`]).
pub struct Paths {
    pub dir: tempfile::TempDir,
}

impl Paths {
    pub fn new() -> anyhow::Result<Paths> {
        Ok(Paths {
            dir: tempfile::Builder::new()
                .prefix("gpu-share-demo-")
                .tempdir()?,
        })
    }

    pub fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }
}

/// The fake NVML finds its state, mutation log and the host's procfs (where it keeps the MIG
/// capability files, as the driver does) through environment variables, read by the
/// library the agent loads into this process, and the agent finds the API (the double) through
/// `KUBECONFIG`: they are set once, first thing, while the process has a single thread
/// (setting the environment races with threads that read it).
pub fn point_environment_here(paths: &Paths) {
    std::env::set_var("KUBECONFIG", paths.path("kubeconfig"));
    std::env::set_var("FAKE_NVML_STATE", paths.path("nvml.json"));
    std::env::set_var("FAKE_NVML_LOG", paths.path("nvml.log"));
    std::env::set_var("FAKE_NVML_PROC_ROOT", paths.path("host/proc"));
}

/// The agent's log goes to a file in the fixtures, so the story on stdout stays readable.
pub fn log_agent_to(path: &Path) -> anyhow::Result<()> {
    let file = std::fs::File::create(path)?;
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("info"))
        .with_ansi(false)
        .with_writer(Mutex::new(file))
        .init();
    Ok(())
}

/// Fields drop in order: the agent (on `runtime`) stops before the node's temp dir goes.
pub struct World {
    runtime: tokio::runtime::Runtime,
    pub api: Arc<KubeDouble>,
    pub node: AgentNode,
    _plugins: DevicePluginKubelet,
    pod_resources: PodResourcesKubelet,
    pub metrics_port: u16,
    pub agent_log: PathBuf,
    seen: Arc<Mutex<Vec<Seen>>>,
}

#[derive(Parser)]
struct AgentCommandLine {
    #[command(flatten)]
    agent: gpu_share::agent::AgentArgs,
}

impl World {
    /// Start everything; the API double listens on `api_addr` (port 0: any free port).
    pub fn start(
        paths: Paths,
        api_addr: SocketAddr,
        profiles: &[(&str, &str)],
    ) -> anyhow::Result<World> {
        let api = Arc::new(KubeDouble::start_on(api_addr).context("start the API double")?);
        api.put_configmap(kube_double::fixtures::configmap(NS, CM, profiles));
        api.put_node(kube_double::fixtures::node(NODE, &[]));
        let agent_log = paths.path("agent.log");
        let node = AgentNode::for_node_in(&api, NODE, h100s(8, false), paths.dir);
        for (key, value) in GFD_LABELS {
            api.set_node_label(NODE, key, Some(value));
        }
        let plugins = DevicePluginKubelet::serve(&api, NODE, &node.path("device-plugins"));
        let pod_resources = PodResourcesKubelet::serve(&api, NODE, &node.pod_resources_socket());
        let metrics_port = node_sim::free_port();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        let seen = Arc::new(Mutex::new(Vec::new()));
        let client = {
            let _in_runtime = runtime.enter();
            api.client()
        };
        runtime.spawn(watch_states(client, Arc::clone(&seen)));
        let world = World {
            api,
            node,
            _plugins: plugins,
            pod_resources,
            metrics_port,
            agent_log,
            seen,
            runtime,
        };
        world.start_agent()?;
        Ok(world)
    }

    /// Tell the simulated kubelet which device the device plugin handed each of `workloads`'
    /// pods (namespace `default`, as `add_workloads` puts them): the MIG device's UUID for one
    /// on a GPU instance, the GPU's UUID otherwise, as the built-in plugin names them. The
    /// agent reads this through PodResources `List` and publishes it on the Node.
    pub fn hand_devices(&self, workloads: &[Workload]) {
        // Read in this process, through NVML as `gpu-share status` reads it: the demo runs
        // without the `gpu-share` binary beside it (`cargo run -p gpu-share-demo` builds only
        // this package).
        let observed = gpu_share::gpu::Gpus::open(Some(&fake_nvml_library()))
            .and_then(|gpus| gpus.observe())
            .expect("the simulated node's GPUs, read through the fake NVML");
        for w in workloads {
            let gpu = &observed.gpus[w.gpu];
            let (resource, id) = match w.gi {
                Some(gi) => (
                    "nvidia.com/mig-1g.10gb",
                    gpu.compute_instances
                        .iter()
                        .find(|ci| ci.gi_id == gi)
                        .and_then(|ci| ci.uuid.clone()),
                ),
                None => ("nvidia.com/gpu", gpu.uuid.clone()),
            };
            let id = id.expect("the fake NVML gives every device a UUID");
            self.pod_resources
                .allocate("default", &w.pod, resource, &[&id]);
        }
    }

    /// `gpu-share agent --plugin builtin` with the short timings the tests use, in this process.
    fn start_agent(&self) -> anyhow::Result<()> {
        let node = &self.node;
        let p = |s: &str| node.path(s).display().to_string();
        let lib = fake_nvml_library().display().to_string();
        let listen = format!("127.0.0.1:{}", self.metrics_port);
        let args = AgentCommandLine::try_parse_from([
            "agent",
            "--node-name",
            NODE,
            "--namespace",
            NS,
            "--configmap",
            CM,
            "--nvml-lib",
            &lib,
            "--state-dir",
            &p("state"),
            "--plugin-reload",
            "none",
            "--proc-root",
            &p("proc"),
            "--pod-resources-socket",
            &p("pod-resources/kubelet.sock"),
            "--mps-root",
            &p("mps"),
            "--listen",
            &listen,
            "--host-root",
            &p("host"),
            "--plugin",
            "builtin",
            "--device-plugin-dir",
            &p("device-plugins"),
            "--plugin-health-interval",
            "200ms",
            "--kubelet-poll-interval",
            "100ms",
            "--lease-duration",
            "2s",
            "--eviction-backoff",
            "200ms",
            "--resync-period",
            "2s",
            "--drain-timeout",
            "60s",
        ])?
        .agent;
        self.runtime.spawn(async move {
            if let Err(e) = gpu_share::agent::run(args).await {
                eprintln!("the agent stopped: {e:#}");
            }
        });
        Ok(())
    }

    /// How many states the watch has seen so far (a mark for [`Self::states_since`]).
    pub fn mark(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    pub fn states_since(&self, mark: usize) -> Vec<Seen> {
        self.seen.lock().unwrap()[mark..].to_vec()
    }

    /// A client of the API double, made on the world's runtime (it needs one to start).
    pub fn client(&self) -> kube::Client {
        let _in_runtime = self.runtime.enter();
        self.api.client()
    }

    pub fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.runtime.block_on(f)
    }
}

/// The fake `libnvidia-ml.so` cargo built with this binary (in the `deps/` beside it: only a
/// library built on its own is copied up next to the binary, and that copy may be stale).
fn fake_nvml_library() -> PathBuf {
    nvidia_ml::cdylib_path()
}

/// Follow the Node's state label and reason annotation with a watch (not polling: a state the
/// agent holds for a few milliseconds is still seen), recording each change.
async fn watch_states(client: kube::Client, seen: Arc<Mutex<Vec<Seen>>>) {
    let nodes: Api<Node> = Api::all(client);
    let config = watcher::Config::default().fields(&format!("metadata.name={NODE}"));
    let mut stream = watcher(nodes, config).boxed();
    while let Some(event) = stream.next().await {
        let (Ok(watcher::Event::Apply(n)) | Ok(watcher::Event::InitApply(n))) = event else {
            continue;
        };
        let label = |m: Option<&std::collections::BTreeMap<String, String>>, k: &str| {
            m.and_then(|m| m.get(k)).cloned().unwrap_or_default()
        };
        let state = label(n.metadata.labels.as_ref(), STATE_LABEL);
        let reason = label(n.metadata.annotations.as_ref(), REASON);
        let mut seen = seen.lock().unwrap();
        let changed = seen
            .last()
            .is_none_or(|s| s.state != state || s.reason != reason);
        if changed && !state.is_empty() {
            seen.push(Seen {
                at: Instant::now(),
                state,
                reason,
            });
        }
    }
}
