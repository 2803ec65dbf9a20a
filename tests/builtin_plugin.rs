//! `gpu-share agent --plugin builtin` as a process, against a fake kubelet written here on the
//! device-plugin API v1beta1 (a Registration server on a temp dir's `kubelet.sock`, and a
//! client that calls ListAndWatch, GetPreferredAllocation and Allocate on the plugin's sockets),
//! the Kubernetes API double (tests/kube-double) and the fake NVML (tests/fake-nvml).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gpu_share::builtin_plugin::api::device_plugin_client::DevicePluginClient;
use gpu_share::builtin_plugin::api::registration_server::{Registration, RegistrationServer};
use gpu_share::builtin_plugin::api::{
    AllocateRequest, ContainerAllocateRequest, ContainerPreferredAllocationRequest, Empty,
    ListAndWatchResponse, PreferredAllocationRequest, RegisterRequest,
};
use kube_double::{fixtures, KubeDouble};
use node_sim::{h100s, profile_text, AgentNode, CM, NS, PROFILE_LABEL};
use nvidia_ml::{Gpu, State};
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::Channel;
use tonic::{Request, Response, Status, Streaming};

const KEY: &str = "mixed";
const GPU: &str = "nvidia.com/gpu";
const MIG: &str = "nvidia.com/mig-1g.10gb";

fn mixed_profile() -> String {
    profile_text("builtin/h100-mixed-sharing")
}

/// The kubelet's Registration service: records every request.
#[derive(Clone, Default)]
struct FakeKubelet {
    registered: Arc<Mutex<Vec<RegisterRequest>>>,
}

#[tonic::async_trait]
impl Registration for FakeKubelet {
    async fn register(&self, request: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        self.registered.lock().unwrap().push(request.into_inner());
        Ok(Response::new(Empty {}))
    }
}

impl FakeKubelet {
    /// Serve on `dir/kubelet.sock` until the returned sender is dropped or fired.
    fn serve(&self, dir: &Path) -> tokio::sync::oneshot::Sender<()> {
        let socket = dir.join("kubelet.sock");
        let _ = std::fs::remove_file(&socket);
        let listener = UnixListener::bind(&socket).unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let service = RegistrationServer::new(self.clone());
        tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                    let _ = rx.await;
                })
                .await;
        });
        tx
    }

    fn registrations(&self) -> Vec<RegisterRequest> {
        self.registered.lock().unwrap().clone()
    }
}

async fn plugin(socket: PathBuf) -> DevicePluginClient<Channel> {
    let shown = socket.display().to_string();
    node_sim::dial_plugin(socket)
        .await
        .unwrap_or_else(|| panic!("no device plugin listens on {shown}"))
}

/// The plugin's ListAndWatch stream.
async fn watch(plugin: &mut DevicePluginClient<Channel>) -> Streaming<ListAndWatchResponse> {
    plugin.list_and_watch(Empty {}).await.unwrap().into_inner()
}

async fn next_list(stream: &mut Streaming<ListAndWatchResponse>) -> ListAndWatchResponse {
    tokio::time::timeout(Duration::from_secs(20), stream.message())
        .await
        .expect("a device list within 20 s")
        .unwrap()
        .expect("the stream stays open")
}

/// Read lists until one satisfies `ok` (or fail after 30 s).
async fn list_until(
    stream: &mut Streaming<ListAndWatchResponse>,
    ok: impl Fn(&ListAndWatchResponse) -> bool,
) -> ListAndWatchResponse {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let list = next_list(stream).await;
        if ok(&list) {
            return list;
        }
        assert!(Instant::now() < deadline, "last list: {list:?}");
    }
}

async fn wait_for(what: &str, timeout: Duration, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn allocate_one(ids: &[&str]) -> AllocateRequest {
    AllocateRequest {
        container_requests: vec![ContainerAllocateRequest {
            devices_ids: ids.iter().map(|s| s.to_string()).collect(),
        }],
    }
}

/// Node `gpu-1` with `gpus`, at the API double with the profile `key` in the ConfigMap, and its
/// device-plugin directory (where the fake kubelet serves `kubelet.sock`).
fn builtin_node(
    api: &Arc<KubeDouble>,
    gpus: Vec<Gpu>,
    key: &str,
    profile: &str,
) -> (AgentNode, PathBuf) {
    api.put_configmap(fixtures::configmap(NS, CM, &[(key, profile)]));
    let node = AgentNode::new(api, "gpu-1", gpus);
    let dp = node.path("device-plugins");
    std::fs::create_dir_all(&dp).unwrap();
    (node, dp)
}

/// `gpu-share agent --plugin builtin` with `extra` flags on `node`, serving `dp`. This file's
/// kubelet is the Registration side only (its test dials the plugins itself), so nothing puts
/// the lists on the Node: `success` does not wait for the Node's allocatable here
/// (`--allocatable-timeout 0s`); tests/allocatable.rs tests that wait with node-sim's kubelet.
fn start_builtin_agent(node: &mut AgentNode, dp: &Path, extra: &[&str]) {
    let mut cmd = node.agent_command();
    cmd.args(["agent", "--plugin", "builtin"])
        .args(extra)
        .args(["--allocatable-timeout", "0s"])
        .args([
            "--plugin-health-interval",
            "200ms",
            "--kubelet-poll-interval",
            "100ms",
        ])
        .args(["--lease-duration", "2s"])
        .arg("--device-plugin-dir")
        .arg(dp);
    node.spawn(cmd);
}

#[test]
fn builtin_plugin_serves_a_mixed_profile_to_the_kubelet() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(scenario());
}

async fn scenario() {
    let api = Arc::new(KubeDouble::start());
    // GPUs 0-1 in MIG mode (no instances yet), 2-5 whole.
    let gpus = [h100s(2, true), h100s(4, false)].concat();
    let (mut node, dp) = builtin_node(&api, gpus, KEY, &mixed_profile());
    let nvml = node.nvml_state();

    let kubelet = FakeKubelet::default();
    let mut kubelet_server = kubelet.serve(&dp);
    start_builtin_agent(&mut node, &dp, &[]);
    api.set_node_label("gpu-1", PROFILE_LABEL, Some(KEY));

    // Registration: one endpoint per resource, named like NVIDIA's sockets.
    wait_for("two registrations", Duration::from_secs(60), || {
        kubelet.registrations().len() >= 2
    })
    .await;
    let regs: BTreeMap<String, RegisterRequest> = kubelet
        .registrations()
        .into_iter()
        .map(|r| (r.resource_name.clone(), r))
        .collect();
    assert_eq!(regs.len(), 2, "{regs:?}\n{}", node.log());
    assert_eq!(regs[GPU].endpoint, "nvidia-gpu.sock");
    assert_eq!(regs[MIG].endpoint, "nvidia-mig-1g.10gb.sock");
    for r in regs.values() {
        assert_eq!(r.version, "v1beta1");
        assert!(
            r.options
                .as_ref()
                .unwrap()
                .get_preferred_allocation_available
        );
    }

    // ListAndWatch: the right counts and IDs per resource.
    let state = State::read_from(&nvml).unwrap();
    let uuid = |i: usize| state.gpus[i].uuid.clone();
    let mut gpu_plugin = plugin(dp.join("nvidia-gpu.sock")).await;
    let mut mig_plugin = plugin(dp.join("nvidia-mig-1g.10gb.sock")).await;
    let options = gpu_plugin
        .get_device_plugin_options(Empty {})
        .await
        .unwrap()
        .into_inner();
    assert!(options.get_preferred_allocation_available);
    let mut gpu_stream = watch(&mut gpu_plugin).await;
    let mut mig_stream = watch(&mut mig_plugin).await;
    let gpus = next_list(&mut gpu_stream).await;
    let migs = next_list(&mut mig_stream).await;
    assert_eq!(gpus.devices.len(), 2 * 4 + 2 * 8, "{gpus:?}");
    assert_eq!(migs.devices.len(), 2 * 7, "{migs:?}");
    assert!(gpus.devices.iter().all(|d| d.health == "Healthy"));
    for (i, replicas) in [(2, 4), (3, 4), (4, 8), (5, 8)] {
        let prefix = format!("{}::", uuid(i));
        let n = gpus
            .devices
            .iter()
            .filter(|d| d.id.starts_with(&prefix))
            .count();
        assert_eq!(n, replicas, "GPU {i}");
    }
    let mig_uuids: Vec<String> = State::read_from(&nvml).unwrap().gpus[..2]
        .iter()
        .flat_map(|g| g.gpu_instances.iter())
        .flat_map(|gi| gi.compute_instances.iter().map(|ci| ci.uuid.clone()))
        .collect();
    let mut advertised: Vec<String> = migs.devices.iter().map(|d| d.id.clone()).collect();
    let mut expected = mig_uuids.clone();
    advertised.sort();
    expected.sort();
    assert_eq!(
        advertised, expected,
        "MIG devices are advertised by their MIG UUIDs"
    );

    // GetPreferredAllocation: two replicas stay on one GPU, the least loaded.
    let all: Vec<String> = gpus.devices.iter().map(|d| d.id.clone()).collect();
    let without_gpu2: Vec<String> = all
        .iter()
        .filter(|id| !id.starts_with(&format!("{}::0", uuid(2))))
        .cloned()
        .collect();
    let preferred = gpu_plugin
        .get_preferred_allocation(PreferredAllocationRequest {
            container_requests: vec![ContainerPreferredAllocationRequest {
                available_device_i_ds: without_gpu2,
                must_include_device_i_ds: vec![],
                allocation_size: 2,
            }],
        })
        .await
        .unwrap()
        .into_inner();
    let picked = &preferred.container_responses[0].device_i_ds;
    assert_eq!(picked.len(), 2);
    let gpu_of = |id: &str| id.split("::").next().unwrap().to_string();
    assert_eq!(gpu_of(&picked[0]), gpu_of(&picked[1]), "{picked:?}");
    assert_ne!(gpu_of(&picked[0]), uuid(2), "GPU 2 has a replica in use");

    // Allocate: time-sliced replicas → the GPU's UUID, once, and no MPS env.
    let ts = gpu_plugin
        .allocate(allocate_one(&[
            &format!("{}::1", uuid(3)),
            &format!("{}::2", uuid(3)),
        ]))
        .await
        .unwrap()
        .into_inner();
    let c = &ts.container_responses[0];
    assert_eq!(c.envs["NVIDIA_VISIBLE_DEVICES"], uuid(3));
    assert!(!c.envs.contains_key("CUDA_MPS_PIPE_DIRECTORY"));
    // An MPS replica → the pipe directory and the per-client limits.
    let mps = gpu_plugin
        .allocate(allocate_one(&[&format!("{}::5", uuid(4))]))
        .await
        .unwrap()
        .into_inner();
    let c = &mps.container_responses[0];
    assert_eq!(c.envs["NVIDIA_VISIBLE_DEVICES"], uuid(4));
    assert_eq!(
        c.envs["CUDA_MPS_PIPE_DIRECTORY"],
        "/mps/nvidia.com/gpu/pipe"
    );
    assert_eq!(c.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "25");
    let memory = state.gpus[4].total_memory_mib();
    assert_eq!(
        c.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"],
        format!("0={}M", memory / 8)
    );
    assert_eq!(c.mounts[0].container_path, "/mps/nvidia.com/gpu/pipe");
    assert_eq!(
        PathBuf::from(&c.mounts[0].host_path),
        node.path("mps/nvidia.com/gpu/pipe")
    );
    // Two MPS replicas: refused as the NVIDIA plugin does (failRequestsGreaterThanOne).
    let refused = gpu_plugin
        .allocate(allocate_one(&[
            &format!("{}::0", uuid(5)),
            &format!("{}::1", uuid(5)),
        ]))
        .await
        .unwrap_err();
    assert_eq!(
        refused.message(),
        "invalid allocation request for \"nvidia.com/gpu\": invalid request: maximum request size for shared resources is 1; found 2"
    );
    // A MIG device → its MIG UUID.
    let m = mig_plugin
        .allocate(allocate_one(&[&mig_uuids[3]]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        m.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"],
        mig_uuids[3]
    );

    // Kubelet restart: kubelet.sock and the plugin sockets go, a new kubelet.sock appears.
    let _ = kubelet_server.send(());
    for e in std::fs::read_dir(&dp).unwrap().flatten() {
        std::fs::remove_file(e.path()).unwrap();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = kubelet.registrations().len();
    kubelet_server = kubelet.serve(&dp);
    wait_for("re-registration", Duration::from_secs(20), || {
        kubelet.registrations().len() >= before + 2
    })
    .await;
    let again: Vec<String> = kubelet.registrations()[before..]
        .iter()
        .map(|r| r.resource_name.clone())
        .collect();
    assert!(
        again.contains(&GPU.to_string()) && again.contains(&MIG.to_string()),
        "{again:?}"
    );
    let mut gpu_plugin = plugin(dp.join("nvidia-gpu.sock")).await;
    let mut mig_plugin = plugin(dp.join("nvidia-mig-1g.10gb.sock")).await;
    let mut gpu_stream = watch(&mut gpu_plugin).await;
    let mut mig_stream = watch(&mut mig_plugin).await;
    assert_eq!(next_list(&mut gpu_stream).await.devices.len(), 24);
    assert_eq!(next_list(&mut mig_stream).await.devices.len(), 14);

    // A profile change (time-slicing × 4 → × 2): new lists on the open stream.
    let changed =
        mixed_profile().replace("timeSlicing: {replicas: 4}", "timeSlicing: {replicas: 2}");
    assert_ne!(changed, mixed_profile());
    api.update_configmap_key(NS, CM, KEY, Some(&changed));
    let list = list_until(&mut gpu_stream, |l| l.devices.len() == 2 * 2 + 2 * 8).await;
    assert!(list.devices.iter().all(|d| d.health == "Healthy"));
    // The new lists come before the reconcile ends; one still running when the instance is
    // removed below would find it missing and make it again (a new UUID, healthy), so the
    // stream would never say Unhealthy (seen once in CI on 2 busy cores).
    wait_for("the change applied", Duration::from_secs(30), || {
        node_sim::is_applied(&api, "gpu-1", &changed)
    })
    .await;

    // A MIG device removed behind the agent's back → Unhealthy on the open stream.
    let mut s = State::read_from(&nvml).unwrap();
    let gi = s.gpus[0].gpu_instances.pop().expect("GPU 0 has instances");
    let gone = gi.compute_instances[0].uuid.clone();
    s.write_to(&nvml).unwrap();
    let list = list_until(&mut mig_stream, |l| {
        l.devices.iter().any(|d| d.health == "Unhealthy")
    })
    .await;
    let unhealthy: Vec<&str> = list
        .devices
        .iter()
        .filter(|d| d.health == "Unhealthy")
        .map(|d| d.id.as_str())
        .collect();
    assert_eq!(unhealthy, [gone.as_str()]);
    drop(kubelet_server);
    drop(node);
}

/// A small node for the tests below: GPU 0 in MIG mode (seven 1g.10gb), GPU 1 whole and not
/// shared, GPU 2 time-sliced four ways; `nvidia.com/gpu` and the MIG resource registered.
const SMALL_PROFILE: &str = "version: v1
plugin:
  migStrategy: mixed
rules:
  - devices: [0]
    mig: {1g.10gb: 7}
  - devices: [1]
    exclusive: true
  - devices: [2]
    timeSlicing: {replicas: 4}
";

/// The node (its agent killed first) drops before the fake kubelet and the API double.
struct SmallNode {
    sim: AgentNode,
    dp: PathBuf,
    nvml: PathBuf,
    _kubelet_server: tokio::sync::oneshot::Sender<()>,
    _api: Arc<KubeDouble>,
}

/// Start the agent (with `extra` flags) on [`SMALL_PROFILE`] and wait for its two registrations.
async fn small_node(extra: &[&str]) -> SmallNode {
    let gpus = [h100s(1, true), h100s(2, false)].concat();
    node_with(SMALL_PROFILE, gpus, extra, &[GPU, MIG]).await
}

/// Start the agent (with `extra` flags) on `profile` over `gpus`, and wait until each of
/// `resources` is registered.
async fn node_with(profile: &str, gpus: Vec<Gpu>, extra: &[&str], resources: &[&str]) -> SmallNode {
    let api = Arc::new(KubeDouble::start());
    let (mut sim, dp) = builtin_node(&api, gpus, "small", profile);
    let kubelet = FakeKubelet::default();
    let kubelet_server = kubelet.serve(&dp);
    start_builtin_agent(&mut sim, &dp, extra);
    api.set_node_label("gpu-1", PROFILE_LABEL, Some("small"));
    wait_for("the registrations", Duration::from_secs(60), || {
        kubelet.registrations().len() >= resources.len()
    })
    .await;
    let registered: Vec<String> = kubelet
        .registrations()
        .iter()
        .map(|r| r.resource_name.clone())
        .collect();
    assert!(
        resources
            .iter()
            .all(|r| registered.contains(&r.to_string())),
        "{registered:?}\n{}",
        sim.log()
    );
    SmallNode {
        nvml: sim.nvml_state(),
        sim,
        dp,
        _kubelet_server: kubelet_server,
        _api: api,
    }
}

#[test]
fn cdi_cri_names_gpus_replicas_and_mig_devices_by_uuid() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let node = small_node(&["--device-list-strategy", "cdi-cri"]).await;
        let state = State::read_from(&node.nvml).unwrap();
        let uuid = |i: usize| state.gpus[i].uuid.clone();
        let mut gpu_plugin = plugin(node.dp.join("nvidia-gpu.sock")).await;
        let mut mig_plugin = plugin(node.dp.join("nvidia-mig-1g.10gb.sock")).await;
        let mut stream = watch(&mut gpu_plugin).await;
        let ids: Vec<String> = next_list(&mut stream)
            .await
            .devices
            .into_iter()
            .map(|d| d.id)
            .collect();
        assert!(ids.contains(&uuid(1)), "{ids:?}");
        let cdi = |r: &gpu_share::builtin_plugin::api::ContainerAllocateResponse| {
            r.cdi_devices
                .iter()
                .map(|d| d.name.clone())
                .collect::<Vec<_>>()
        };

        // A whole GPU → its UUID under the nvidia-ctk kind; no NVIDIA_VISIBLE_DEVICES.
        let whole = gpu_plugin
            .allocate(allocate_one(&[&uuid(1)]))
            .await
            .unwrap()
            .into_inner();
        let c = &whole.container_responses[0];
        assert_eq!(cdi(c), [format!("nvidia.com/gpu={}", uuid(1))]);
        assert!(c.envs.is_empty(), "{:?}", c.envs);
        assert!(c.annotations.is_empty());

        // Two replicas of one GPU → the GPU once.
        let replicas = gpu_plugin
            .allocate(allocate_one(&[
                &format!("{}::1", uuid(2)),
                &format!("{}::3", uuid(2)),
            ]))
            .await
            .unwrap()
            .into_inner();
        let c = &replicas.container_responses[0];
        assert_eq!(cdi(c), [format!("nvidia.com/gpu={}", uuid(2))]);
        assert!(!c.envs.contains_key("NVIDIA_VISIBLE_DEVICES"));

        // A MIG device → its MIG UUID.
        let mig_uuid = State::read_from(&node.nvml).unwrap().gpus[0].gpu_instances[2]
            .compute_instances[0]
            .uuid
            .clone();
        assert!(mig_uuid.starts_with("MIG-"), "{mig_uuid}");
        let m = mig_plugin
            .allocate(allocate_one(&[&mig_uuid]))
            .await
            .unwrap()
            .into_inner();
        let c = &m.container_responses[0];
        assert_eq!(cdi(c), [format!("nvidia.com/gpu={mig_uuid}")]);
        assert!(!c.envs.contains_key("NVIDIA_VISIBLE_DEVICES"));
        drop(node);
    });
}

#[test]
fn sigterm_removes_only_the_agents_sockets_and_exits_zero() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut node = small_node(&[]).await;
        // Another plugin's live socket and a plain file: not the agent's to remove.
        let foreign_socket = node.dp.join("other-vendor.sock");
        let _foreign = std::os::unix::net::UnixListener::bind(&foreign_socket).unwrap();
        let foreign_file = node.dp.join("notes.txt");
        std::fs::write(&foreign_file, "keep").unwrap();
        let ours = [
            node.dp.join("nvidia-gpu.sock"),
            node.dp.join("nvidia-mig-1g.10gb.sock"),
        ];
        for s in &ours {
            assert!(s.exists(), "{}", s.display());
        }

        let pid = nix::unistd::Pid::from_raw(i32::try_from(node.sim.agent_pid()).unwrap());
        let sent = Instant::now();
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        let status = loop {
            if let Some(status) = node.sim.agent.as_mut().unwrap().try_wait().unwrap() {
                break status;
            }
            assert!(
                sent.elapsed() < Duration::from_secs(10),
                "the agent still runs 10 s after SIGTERM\n{}",
                node.sim.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let took = sent.elapsed();
        assert!(status.success(), "{status:?}\n{}", node.sim.log());
        for s in &ours {
            assert!(!s.exists(), "{} is left behind", s.display());
        }
        assert!(node.dp.join("kubelet.sock").exists());
        assert!(foreign_socket.exists());
        assert_eq!(std::fs::read_to_string(&foreign_file).unwrap(), "keep");
        assert!(
            node.sim.log().contains("sockets removed"),
            "{}",
            node.sim.log()
        );
        eprintln!("SIGTERM to exit: {took:?}");
    });
}

#[test]
fn mps_inside_mig_devices_sends_each_client_to_its_devices_daemon() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        const RESOURCE: &str = "nvidia.com/mig-3g.40gb";
        let profile = profile_text("builtin/h100-mps-in-mig");
        let node = node_with(&profile, h100s(2, false), &[], &[RESOURCE]).await;
        let mut mig_plugin = plugin(node.dp.join("nvidia-mig-3g.40gb.sock")).await;
        let mut stream = watch(&mut mig_plugin).await;
        // 2 GPUs × 2 × 3g.40gb, each advertised as 4 MPS clients.
        let list = list_until(&mut stream, |l| l.devices.len() == 16).await;
        let mig_uuids: Vec<String> = State::read_from(&node.nvml)
            .unwrap()
            .gpus
            .iter()
            .flat_map(|g| g.gpu_instances.iter())
            .flat_map(|gi| gi.compute_instances.iter().map(|ci| ci.uuid.clone()))
            .collect();
        assert_eq!(mig_uuids.len(), 4);
        for uuid in &mig_uuids {
            let replicas = list
                .devices
                .iter()
                .filter(|d| d.id.starts_with(&format!("{uuid}::")))
                .count();
            assert_eq!(replicas, 4, "{uuid}: {list:?}");
        }

        // One client on the second MIG device: its UUID, its own daemon's pipe, /dev/shm, and
        // the per-client limits (50% threads; 40448 MiB / 4 pinned, the catalog's H100 3g.40gb).
        let uuid = &mig_uuids[1];
        let response = mig_plugin
            .allocate(allocate_one(&[&format!("{uuid}::2")]))
            .await
            .unwrap()
            .into_inner();
        let c = &response.container_responses[0];
        assert_eq!(c.envs["NVIDIA_VISIBLE_DEVICES"], *uuid);
        let pipe = format!("/mps/{RESOURCE}/{uuid}/pipe");
        assert_eq!(c.envs["CUDA_MPS_PIPE_DIRECTORY"], pipe);
        assert_eq!(c.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "50");
        assert_eq!(
            c.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"],
            format!("0={}M", 40448 / 4)
        );
        let host_pipe = node.sim.path("mps").join(RESOURCE).join(uuid).join("pipe");
        assert_eq!(c.mounts[0].container_path, pipe);
        assert_eq!(c.mounts[0].host_path, host_pipe.display().to_string());
        assert_eq!(c.mounts[1].container_path, "/dev/shm");
        // The daemon the client is sent to is running there (the fake's pid file).
        assert!(
            host_pipe.join("nvidia-cuda-mps-control.pid").exists(),
            "{}",
            node.sim.log()
        );

        // The daemon dies: its four clients are marked Unhealthy, the other devices stay.
        let pid: i32 = std::fs::read_to_string(host_pipe.join("nvidia-cuda-mps-control.pid"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        let list = list_until(&mut stream, |l| {
            l.devices.iter().any(|d| d.health != "Healthy")
        })
        .await;
        let mut unhealthy: Vec<&str> = list
            .devices
            .iter()
            .filter(|d| d.health != "Healthy")
            .map(|d| d.id.as_str())
            .collect();
        unhealthy.sort();
        let expected: Vec<String> = (0..4).map(|n| format!("{uuid}::{n}")).collect();
        assert_eq!(unhealthy, expected);

        // MPS replicas default to one per request, as NVIDIA's failRequestsGreaterThanOne.
        let two = mig_plugin
            .allocate(allocate_one(&[
                &format!("{}::0", mig_uuids[0]),
                &format!("{}::0", mig_uuids[1]),
            ]))
            .await
            .unwrap_err();
        assert!(
            two.message()
                .contains("maximum request size for shared resources is 1"),
            "{two:?}"
        );
    });
}

/// A device that raises a critical XID is reported Unhealthy to the kubelet,
/// with a Warning Event and metrics; an application XID changes nothing. The XIDs are raised in
/// the fake NVML's state file, which delivers them through NVML event sets, as the driver does.
/// As in NVIDIA's plugin (k8s-device-plugin `internal/rm/health.go`): an XID carrying a MIG
/// device's ids marks that MIG device only, one without marks the GPU's devices (here its four
/// time-sliced replicas); XID 31 (an application's page fault) is skipped.
#[test]
fn a_critical_xid_marks_its_devices_unhealthy_with_an_event_and_metrics() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let node = small_node(&[]).await;
        wait_for("the XID watch", Duration::from_secs(30), || {
            node.sim.log().contains("watching for critical XID errors")
        })
        .await;
        let mut gpu_plugin = plugin(node.dp.join("nvidia-gpu.sock")).await;
        let mut mig_plugin = plugin(node.dp.join("nvidia-mig-1g.10gb.sock")).await;
        let mut gpu_stream = watch(&mut gpu_plugin).await;
        let mut mig_stream = watch(&mut mig_plugin).await;
        let healthy = |l: &ListAndWatchResponse| l.devices.iter().all(|d| d.health == "Healthy");
        list_until(&mut gpu_stream, |l| l.devices.len() == 5 && healthy(l)).await;
        list_until(&mut mig_stream, |l| l.devices.len() == 7 && healthy(l)).await;

        let mut s = State::read_from(&node.nvml).unwrap();
        let gi = &s.gpus[0].gpu_instances[0];
        let (gi_id, ci) = (gi.id, &gi.compute_instances[0]);
        let (ci_id, faulted_mig) = (ci.id, ci.uuid.clone());
        let (gpu1, gpu2) = (s.gpus[1].uuid.clone(), s.gpus[2].uuid.clone());
        s.gpus[0].raise_xid(31, Some((gi_id, ci_id)));
        s.gpus[0].raise_xid(48, Some((gi_id, ci_id)));
        s.gpus[2].raise_xid(79, None);
        s.write_to(&node.nvml).unwrap();

        let unhealthy = |l: &ListAndWatchResponse| -> Vec<String> {
            let sick = l.devices.iter().filter(|d| d.health == "Unhealthy");
            sick.map(|d| d.id.clone()).collect()
        };
        let migs = list_until(&mut mig_stream, |l| !unhealthy(l).is_empty()).await;
        assert_eq!(unhealthy(&migs), std::slice::from_ref(&faulted_mig));
        let gpus = list_until(&mut gpu_stream, |l| unhealthy(l).len() == 4).await;
        let replicas: Vec<String> = (0..4).map(|r| format!("{gpu2}::{r}")).collect();
        let mut sick = unhealthy(&gpus);
        sick.sort();
        assert_eq!(
            sick, replicas,
            "GPU 2's replicas; GPU 1 ({gpu1}) stays healthy"
        );

        wait_for(
            "two DeviceUnhealthy events",
            Duration::from_secs(20),
            || {
                let events = node._api.events();
                events
                    .iter()
                    .filter(|e| e.reason.as_deref() == Some("DeviceUnhealthy"))
                    .count()
                    == 2
            },
        )
        .await;
        let notes: Vec<String> = node
            ._api
            .events()
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("DeviceUnhealthy"))
            .filter_map(|e| e.note)
            .collect();
        assert!(notes
            .iter()
            .any(|n| n.contains(&faulted_mig) && n.contains("XID 48")));
        assert!(notes
            .iter()
            .any(|n| n.contains(&gpu2) && n.contains("XID 79")));
        assert!(!notes.iter().any(|n| n.contains("XID 31")), "{notes:?}");

        let metrics = node_sim::http_get(node.sim.http_port(), "/metrics").unwrap();
        for line in [
            "gpu_share_unhealthy_devices 2",
            "gpu_share_critical_xids_total{xid=\"48\"} 1",
            "gpu_share_critical_xids_total{xid=\"79\"} 1",
        ] {
            assert!(metrics.contains(line), "{line} in\n{metrics}");
        }
        assert!(!metrics.contains("xid=\"31\""));
    });
}
