//! The kubelet DRA plugin (`src/dra/kubelet_plugin`) in-process, against the simulated
//! kubelet's DRA side (tests/node-sim/src/dra_kubelet.rs: registration through the
//! plugins_registry directory, then Prepare/Unprepare calls) and the Kubernetes API double
//! serving resource.k8s.io/v1 ResourceClaims (tests/kube-double).
//!
//! The devices the plugin may prepare are `dra::resource_slices` for the example profile
//! `builtin/h100-mixed-sharing` (MIG 1g.10gb × 7 on GPUs 0-1, time-slicing × 4 on 2-3, MPS × 8
//! on 4-5, exclusive 6-7) on 8 simulated H100s as NVML shows them after the apply (UUIDs on
//! every GPU and MIG device, [`applied`]); what each device needs is the built-in plugin's
//! `Inventory` of the same node, which the CDI specs are checked against.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use gpu_share::builtin_plugin::{DeviceListStrategy, DeviceListing, Inventory};
use gpu_share::dra::api::{Device, ResourceSlice};
use gpu_share::dra::kubelet_plugin::api::dra::NodePrepareResourceResponse;
use gpu_share::dra::kubelet_plugin::cdi::Spec;
use gpu_share::dra::kubelet_plugin::checkpoint::Checkpoint;
use gpu_share::dra::kubelet_plugin::dynamic_mig::DynamicMig;
use gpu_share::dra::kubelet_plugin::mig_journal::SharedMigJournal;
use gpu_share::dra::kubelet_plugin::{self, Inputs, KubeletPlugin, Settings};
use gpu_share::dra::{resource_slices, DRIVER};
use gpu_share::gpu::xid::{Fault, Faults};
use gpu_share::gpu::{MigMode, ObservedComputeInstance, ObservedNode, SharedGpus};
use gpu_share::mig::ExistingInstance;
use gpu_share::plan::{plan_for, NodePlan};
use gpu_share::profile::{parse_profile, PluginOptions};
use gpu_share::sharing::PluginKind;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube_double::KubeDouble;
use node_sim::consumable_scheduler::{consumed_capacity, fits, Consumed, NotAllocated};
use node_sim::{claim, profile_text, DraKubelet};
use serde_json::json;
use tokio::sync::watch;

const NODE: &str = "worker-1";
const NS: &str = "team-a";
const MPS_ROOT: &str = "/run/nvidia/mps";
const WAIT: Duration = Duration::from_secs(10);

/// The node after applying `plan`: every GPU with a UUID, and on MIG GPUs the planned GPU
/// instances with one compute instance each and a MIG UUID, as NVML lists them once the apply
/// created them (GI ids in placement order, as the fake NVML hands them out).
fn applied(plan: &NodePlan, node: &ObservedNode) -> ObservedNode {
    let mut node = node.clone();
    for gpu in &mut node.gpus {
        gpu.uuid = Some(format!(
            "GPU-0000000{}-aaaa-bbbb-cccc-dddddddddddd",
            gpu.index
        ));
        let Some(geometry) = plan
            .gpus
            .iter()
            .find(|p| p.index == gpu.index)
            .and_then(|p| p.geometry.as_ref())
        else {
            continue;
        };
        gpu.mig = Some(MigMode {
            current: true,
            pending: false,
        });
        for (k, instance) in geometry.target().into_iter().enumerate() {
            let gi_id = k as u32 + 1;
            gpu.instances.push(ExistingInstance {
                profile: instance.profile.clone(),
                placement: instance.placement,
                gi_id: Some(gi_id),
            });
            gpu.compute_instances.push(ObservedComputeInstance {
                gi_id,
                ci_id: 0,
                profile_id: 0,
                uuid: Some(format!("MIG-{}-{gi_id}", gpu.index)),
            });
        }
    }
    node
}

/// What the agent hands the plugin for example profile `name` on 8 × H100: the slices and the
/// inventory.
fn published(name: &str) -> (Vec<ResourceSlice>, Inventory) {
    published_text(&profile_text(name))
}

/// [`published`] for a profile's text.
fn published_text(text: &str) -> (Vec<ResourceSlice>, Inventory) {
    let profile = parse_profile("p", text).unwrap();
    let node = ObservedNode::simulated(&["h100x8".to_string()]);
    let plan = plan_for("p", &profile, &node, PluginKind::Dra).unwrap();
    let node = applied(&plan, &node);
    let slices = resource_slices(NODE, 1, &plan.gpus, &node);
    let options: PluginOptions = profile.plugin.clone();
    let inventory = Inventory::from_plan(&plan, &node, &options, Path::new(MPS_ROOT));
    (slices, inventory)
}

struct Node {
    _dir: tempfile::TempDir,
    listing: DeviceListing,
    settings: Settings,
    api: KubeDouble,
    slices: watch::Sender<Arc<Vec<ResourceSlice>>>,
    inventory: watch::Sender<Arc<Inventory>>,
    faults: Faults,
    kubelet: DraKubelet,
}

impl Node {
    fn new() -> Node {
        Node::with_profile("builtin/h100-mixed-sharing")
    }

    fn with_profile(profile: &str) -> Node {
        Node::with_profile_text(&profile_text(profile))
    }

    fn with_profile_text(text: &str) -> Node {
        let dir = tempfile::tempdir().unwrap();
        let settings = Settings {
            node_name: NODE.into(),
            registration_dir: dir.path().join("plugins_registry"),
            plugin_dir: dir.path().join("plugins").join(DRIVER),
            cdi_root: dir.path().join("cdi"),
        };
        std::fs::create_dir_all(&settings.registration_dir).unwrap();
        let (slices, inventory) = published_text(text);
        Node {
            listing: DeviceListing::default(),
            kubelet: DraKubelet::watch(&settings.registration_dir),
            settings,
            _dir: dir,
            api: KubeDouble::start(),
            slices: watch::channel(Arc::new(slices)).0,
            inventory: watch::channel(Arc::new(inventory)).0,
            faults: Faults::default(),
        }
    }

    /// Start the plugin and wait until the simulated kubelet registered it.
    async fn start(&self) -> KubeletPlugin {
        let plugin = self.start_plugin().unwrap();
        assert!(
            self.kubelet.wait_registered(DRIVER, WAIT).await.is_some(),
            "the kubelet did not register {DRIVER}: {:?}",
            self.kubelet.refused()
        );
        plugin
    }

    fn start_plugin(&self) -> Result<KubeletPlugin, gpu_share::dra::kubelet_plugin::StartError> {
        KubeletPlugin::start(
            &self.settings,
            self.api.client(),
            Inputs {
                slices: self.slices.subscribe(),
                inventory: self.inventory.subscribe(),
                listing: self.listing.clone(),
                faults: self.faults.clone(),
                // No fake NVML here: no dynamic-MIG device is published, so none is called.
                dynamic_mig: DynamicMig {
                    gpus: SharedGpus::new(None, "/".into()),
                    journal: SharedMigJournal::new(&self.settings.plugin_dir),
                    republish: Default::default(),
                },
            },
        )
    }

    fn published_devices(&self) -> Vec<Device> {
        self.slices
            .borrow()
            .iter()
            .flat_map(|s| s.spec.devices.clone())
            .collect()
    }

    /// The first published device shared as `sharing` (`mig`, `timeSlicing`, `mps`,
    /// `exclusive`), past the first `skip`.
    fn device(&self, sharing: &str, skip: usize) -> Device {
        self.published_devices()
            .into_iter()
            .filter(|d| d.attributes["sharing"].string.as_deref() == Some(sharing))
            .nth(skip)
            .unwrap_or_else(|| panic!("no {sharing} device #{skip}"))
    }

    /// Create a claim and allocate it `devices` of this node's pool, as the scheduler does
    /// (the allocation is written through the status subresource). Returns its UID.
    async fn allocated_claim(&self, name: &str, devices: &[(&str, &str)]) -> String {
        let api = claims(&self.api);
        let mut obj = DynamicObject::new(name, &kubelet_plugin::claim::resource()).within(NS);
        obj.data = json!({"spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": "gpu.gpu-share.dev"}}
        ]}}});
        let created = api.create(&PostParams::default(), &obj).await.unwrap();
        let results: Vec<_> = devices
.iter()
.map(|(request, device)| {
                json!({"request": request, "driver": DRIVER, "pool": NODE, "device": device})
            })
.collect();
        let status = json!({"status": {"allocation": {"devices": {"results": results}}}});
        api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .unwrap();
        created.metadata.uid.unwrap()
    }

    /// Create a claim and allocate it one share of the consumable `device` per entry of
    /// `shares` (request name, shareID, consumedCapacity), as the scheduler writes a share of a
    /// device with `allowMultipleAllocations`. Returns its UID.
    async fn allocated_shares(
        &self,
        name: &str,
        device: &str,
        shares: &[(&str, &str, &Consumed)],
    ) -> String {
        let api = claims(&self.api);
        let mut obj = DynamicObject::new(name, &kubelet_plugin::claim::resource()).within(NS);
        obj.data = json!({"spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": "gpu.gpu-share.dev"}}
        ]}}});
        let created = api.create(&PostParams::default(), &obj).await.unwrap();
        let results: Vec<_> = shares
            .iter()
            .map(|(request, share_id, consumed)| {
                json!({"request": request, "driver": DRIVER, "pool": NODE, "device": device,
                       "shareID": share_id, "consumedCapacity": consumed})
            })
            .collect();
        let status = json!({"status": {"allocation": {"devices": {"results": results}}}});
        api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .unwrap();
        created.metadata.uid.unwrap()
    }

    async fn prepare(&self, name: &str, uid: &str) -> NodePrepareResourceResponse {
        let mut answer = self
            .kubelet
            .prepare(DRIVER, vec![claim(NS, name, uid)])
            .await
            .unwrap();
        answer.claims.remove(uid).expect("an answer for the claim")
    }

    async fn unprepare(&self, name: &str, uid: &str) -> String {
        let mut answer = self
            .kubelet
            .unprepare(DRIVER, vec![claim(NS, name, uid)])
            .await
            .unwrap();
        answer
            .claims
            .remove(uid)
            .expect("an answer for the claim")
            .error
    }

    fn spec_path(&self, uid: &str) -> PathBuf {
        kubelet_plugin::cdi::spec_path(&self.settings.cdi_root, uid)
    }

    fn spec(&self, uid: &str) -> Spec {
        serde_json::from_slice(&std::fs::read(self.spec_path(uid)).unwrap()).unwrap()
    }

    fn checkpoint(&self) -> Checkpoint {
        Checkpoint::load(&self.settings.plugin_dir.join("checkpoint.json")).unwrap()
    }

    /// What the built-in plugin's Allocate answers for device ID `id`, as CDI env lines
    /// (sorted) and mounts (host, container).
    fn builtin_answer(&self, id: &str) -> (Vec<String>, Vec<(String, String)>) {
        let inventory = self.inventory.borrow().clone();
        let resource = inventory
            .resources
            .values()
            .find(|r| r.devices.iter().any(|d| d.id == id))
            .unwrap_or_else(|| panic!("{id} is not advertised"));
        let answer = resource.allocate(&[id.to_string()]).unwrap();
        let mut env: Vec<String> = answer
            .envs
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        env.sort();
        let mounts = answer
            .mounts
            .iter()
            .map(|m| (m.host_path.clone(), m.container_path.clone()))
            .collect();
        (env, mounts)
    }
}

fn claims(api: &KubeDouble) -> Api<DynamicObject> {
    Api::namespaced_with(api.client(), NS, &kubelet_plugin::claim::resource())
}

fn text<'a>(device: &'a Device, key: &str) -> &'a str {
    device.attributes[key].string.as_deref().unwrap()
}

fn int(device: &Device, key: &str) -> i64 {
    device.attributes[key].int.unwrap()
}

/// The spec's edits for its only device, as (env, mounts (host, container)).
fn spec_edits(spec: &Spec) -> (Vec<String>, Vec<(String, String)>) {
    assert_eq!(spec.devices.len(), 1, "{spec:?}");
    let edits = &spec.devices[0].container_edits;
    let mounts = edits
        .mounts
        .iter()
        .map(|m| (m.host_path.clone(), m.container_path.clone()))
        .collect();
    (edits.env.clone(), mounts)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubelet_registers_the_driver_at_its_dra_socket_and_shutdown_deregisters_it() {
    let node = Node::new();
    let plugin = node.start().await;
    let info = node.kubelet.wait_registered(DRIVER, WAIT).await.unwrap();
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, "gpu.gpu-share.dev");
    let dra_socket = node.settings.plugin_dir.join("dra.sock");
    assert_eq!(info.endpoint, dra_socket.display().to_string());
    assert_eq!(info.supported_versions, ["v1.DRAPlugin"]);
    let reg_socket = node
        .settings
        .registration_dir
        .join("gpu.gpu-share.dev-reg.sock");
    assert!(reg_socket.exists());
    // The kubelet reports back, and the plugin keeps what it said.
    for _ in 0..500 {
        if plugin.registered().is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(plugin.registered(), Some(Ok(())));

    plugin.shutdown().await;
    assert!(!reg_socket.exists(), "registration socket left behind");
    assert!(!dra_socket.exists(), "DRA socket left behind");
    for _ in 0..500 {
        if !node.kubelet.is_registered(DRIVER) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!node.kubelet.is_registered(DRIVER));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mig_device_a_time_sliced_share_and_an_mps_share_get_the_builtin_plugins_edits() {
    let node = Node::new();
    let plugin = node.start().await;
    let mig = node.device("mig", 3);
    let sliced = node.device("timeSlicing", 6);
    let mps = node.device("mps", 9);
    // The built-in plugin's device IDs for the same devices, from the applied node: the MIG
    // device's UUID, replica k of the time-sliced GPU, replica k of the MPS GPU.
    let cases = [
        (&mig, text(&mig, "uuid").to_string()),
        (
            &sliced,
            format!(
                "{}::{}",
                text(&sliced, "parentUUID"),
                int(&sliced, "shareIndex")
            ),
        ),
        (
            &mps,
            format!("{}::{}", text(&mps, "parentUUID"), int(&mps, "shareIndex")),
        ),
    ];
    assert!(text(&mig, "uuid").starts_with("MIG-"));
    for (i, (device, builtin_id)) in cases.iter().enumerate() {
        let name = format!("claim-{i}");
        let uid = node.allocated_claim(&name, &[("gpu", &device.name)]).await;
        let answer = node.prepare(&name, &uid).await;
        assert_eq!(answer.error, "", "{}", device.name);
        assert_eq!(answer.devices.len(), 1);
        let prepared = &answer.devices[0];
        assert_eq!(prepared.device_name, device.name);
        assert_eq!(prepared.pool_name, NODE);
        assert_eq!(prepared.request_names, ["gpu"]);
        assert_eq!(
            prepared.cdi_device_ids,
            [format!("gpu.gpu-share.dev/claim={uid}-{}", device.name)]
        );
        let spec = node.spec(&uid);
        assert_eq!(spec.kind, "gpu.gpu-share.dev/claim");
        assert_eq!(spec.devices[0].name, format!("{uid}-{}", device.name));
        assert_eq!(
            spec_edits(&spec),
            node.builtin_answer(builtin_id),
            "{}",
            device.name
        );

        assert_eq!(node.unprepare(&name, &uid).await, "");
        assert!(!node.spec_path(&uid).exists(), "{}: spec left", device.name);
        assert!(node.checkpoint().claims.is_empty());
    }
    // What the edits are, beyond equal: the UUID, and for MPS the daemon's pipe and /dev/shm.
    let (env, _) = node.builtin_answer(&cases[0].1);
    assert_eq!(env, [format!("NVIDIA_VISIBLE_DEVICES={}", cases[0].1)]);
    let (env, mounts) = node.builtin_answer(&cases[2].1);
    assert!(
        env.contains(&"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25".to_string()),
        "{env:?}"
    );
    assert!(
        env.iter()
            .any(|e| e.starts_with("CUDA_MPS_PIPE_DIRECTORY=/mps/")),
        "{env:?}"
    );
    assert!(
        mounts
            .iter()
            .any(|(h, c)| h == "/run/nvidia/mps/shm" && c == "/dev/shm"),
        "{mounts:?}"
    );
    plugin.shutdown().await;
}

/// MPS inside MIG devices (`builtin/h100-mps-in-mig`): a share is a replica of its MIG device
/// and reaches that device's own daemon, as the built-in plugin sends it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mps_share_of_a_mig_device_reaches_that_devices_daemon() {
    let node = Node::with_profile("builtin/h100-mps-in-mig");
    let plugin = node.start().await;
    let share = node.device("mps", 5);
    let mig_uuid = text(&share, "migUUID").to_string();
    assert!(mig_uuid.starts_with("MIG-"), "{mig_uuid}");
    let uid = node
        .allocated_claim("mps-mig", &[("gpu", &share.name)])
        .await;
    let answer = node.prepare("mps-mig", &uid).await;
    assert_eq!(answer.error, "");
    let builtin_id = format!("{mig_uuid}::{}", int(&share, "shareIndex"));
    let (env, mounts) = spec_edits(&node.spec(&uid));
    assert_eq!((env.clone(), mounts), node.builtin_answer(&builtin_id));
    assert!(
        env.contains(&format!("NVIDIA_VISIBLE_DEVICES={mig_uuid}")),
        "{env:?}"
    );
    let pipe = env
        .iter()
        .find_map(|e| e.strip_prefix("CUDA_MPS_PIPE_DIRECTORY="))
        .unwrap();
    assert!(pipe.ends_with(&format!("/{mig_uuid}/pipe")), "{pipe}");
    plugin.shutdown().await;
}

/// `--device-list-strategy cdi-cri` (without `envvar`), as the built-in plugin takes it: each
/// device's answer names the device in the NVIDIA CDI spec (`nvidia.com/gpu=<uuid>`, which
/// brings the device nodes) and the claim's spec drops `NVIDIA_VISIBLE_DEVICES`; a device left
/// with no edits gets no CDI device of the claim (the CDI library refuses a spec with an empty
/// device: "invalid device, empty device edits"), and a claim of only such devices no spec.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cdi_cri_names_the_nvidia_cdi_device_beside_the_claims_own() {
    let mut node = Node::new();
    node.listing = DeviceListing::new(
        &[DeviceListStrategy::CdiCri],
        "nvidia.com/gpu",
        "cdi.k8s.io/",
    )
    .unwrap();
    let plugin = node.start().await;
    let mig = node.device("mig", 0);
    let mig_uuid = text(&mig, "uuid").to_string();
    let uid = node.allocated_claim("cri", &[("gpu", &mig.name)]).await;
    let answer = node.prepare("cri", &uid).await;
    assert_eq!(answer.error, "");
    assert_eq!(
        answer.devices[0].cdi_device_ids,
        [format!("nvidia.com/gpu={mig_uuid}")]
    );
    assert!(!node.spec_path(&uid).exists());
    assert!(node.checkpoint().prepared(&uid).is_some());

    // An MPS share keeps its MPS edits in the claim's spec, beside the NVIDIA CDI device.
    let mps = node.device("mps", 0);
    let gpu_uuid = text(&mps, "parentUUID").to_string();
    let uid = node.allocated_claim("cri-mps", &[("gpu", &mps.name)]).await;
    let answer = node.prepare("cri-mps", &uid).await;
    assert_eq!(answer.error, "");
    assert_eq!(
        answer.devices[0].cdi_device_ids,
        [
            format!("gpu.gpu-share.dev/claim={uid}-{}", mps.name),
            format!("nvidia.com/gpu={gpu_uuid}"),
        ]
    );
    let (env, mounts) = spec_edits(&node.spec(&uid));
    assert!(
        !env.iter().any(|e| e.starts_with("NVIDIA_VISIBLE_DEVICES=")),
        "{env:?}"
    );
    assert!(
        env.iter()
            .any(|e| e.starts_with("CUDA_MPS_PIPE_DIRECTORY=")),
        "{env:?}"
    );
    assert_eq!(mounts.len(), 2, "{mounts:?}");
    plugin.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepare_twice_answers_the_same_and_unprepare_of_an_unknown_claim_succeeds() {
    let node = Node::new();
    let plugin = node.start().await;
    let whole = node.device("exclusive", 0);
    let share = node.device("timeSlicing", 0);
    let uid = node
        .allocated_claim("two", &[("a", &whole.name), ("b", &share.name)])
        .await;
    let first = node.prepare("two", &uid).await;
    assert_eq!(first.error, "");
    assert_eq!(first.devices.len(), 2);
    let spec = std::fs::read(node.spec_path(&uid)).unwrap();
    let second = node.prepare("two", &uid).await;
    assert_eq!(second, first);
    assert_eq!(std::fs::read(node.spec_path(&uid)).unwrap(), spec);
    assert_eq!(node.spec(&uid).devices.len(), 2);
    assert_eq!(node.checkpoint().claims.len(), 1);

    assert_eq!(node.unprepare("never", "no-such-uid").await, "");
    assert_eq!(node.unprepare("two", &uid).await, "");
    assert_eq!(node.unprepare("two", &uid).await, "");
    assert!(!node.spec_path(&uid).exists());
    plugin.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_keeps_prepared_claims_and_removes_interrupted_and_stale_specs() {
    let node = Node::new();
    let plugin = node.start().await;
    let device = node.device("mps", 0);
    let uid = node.allocated_claim("kept", &[("gpu", &device.name)]).await;
    let answer = node.prepare("kept", &uid).await;
    assert_eq!(answer.error, "");
    let spec = std::fs::read(node.spec_path(&uid)).unwrap();
    plugin.shutdown().await;

    // A prepare cut off between its checkpoint entry and its answer, a spec no claim owns, and
    // another vendor's spec in the same directory.
    let checkpoint_path = node.settings.plugin_dir.join("checkpoint.json");
    let mut checkpoint = Checkpoint::load(&checkpoint_path).unwrap();
    let mut interrupted = checkpoint.claims[&uid].clone();
    interrupted.state = kubelet_plugin::checkpoint::ClaimState::Preparing;
    interrupted.devices.clear();
    checkpoint.claims.insert("cut-off".into(), interrupted);
    checkpoint.save(&checkpoint_path).unwrap();
    std::fs::write(node.spec_path("cut-off"), "{\"partly\": ").unwrap();
    std::fs::write(node.spec_path("stale"), "{}").unwrap();
    let other = node.settings.cdi_root.join("nvidia.yaml");
    std::fs::write(&other, "cdiVersion: 0.5.0\n").unwrap();

    let plugin = node.start().await;
    assert!(
        !node.spec_path("cut-off").exists(),
        "interrupted prepare's spec leaked"
    );
    assert!(!node.spec_path("stale").exists(), "stale spec leaked");
    assert!(other.exists(), "another vendor's spec was removed");
    assert_eq!(std::fs::read(node.spec_path(&uid)).unwrap(), spec);
    let claims: Vec<String> = node.checkpoint().claims.into_keys().collect();
    assert_eq!(claims, std::slice::from_ref(&uid));

    // The kubelet asks again after the restart: the same answer, from the checkpoint (the
    // claim is gone from the API, so nothing was read or prepared a second time).
    claims_api_delete(&node, "kept").await;
    assert_eq!(node.prepare("kept", &uid).await, answer);
    let spec_files = std::fs::read_dir(&node.settings.cdi_root).unwrap().count();
    assert_eq!(spec_files, 2, "one claim spec and nvidia.yaml");
    assert_eq!(node.unprepare("kept", &uid).await, "");
    assert!(!node.spec_path(&uid).exists());
    plugin.shutdown().await;
}

async fn claims_api_delete(node: &Node, name: &str) {
    claims(&node.api)
        .delete(name, &Default::default())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_for_a_device_not_published_fails_alone_and_names_the_device() {
    let node = Node::new();
    let plugin = node.start().await;
    let good = node.device("mig", 0);
    let good_uid = node.allocated_claim("good", &[("gpu", &good.name)]).await;
    let bad_uid = node.allocated_claim("bad", &[("gpu", "gpu-9")]).await;
    let answer = node
        .kubelet
        .prepare(
            DRIVER,
            vec![claim(NS, "good", &good_uid), claim(NS, "bad", &bad_uid)],
        )
        .await
        .unwrap();
    assert_eq!(answer.claims[&good_uid].error, "");
    assert_eq!(answer.claims[&good_uid].devices.len(), 1);
    let error = &answer.claims[&bad_uid].error;
    assert_eq!(
        error,
        "ResourceClaim team-a/bad: device gpu-9 (request \"gpu\") is not among the devices gpu-share publishes on node worker-1"
    );
    assert!(answer.claims[&bad_uid].devices.is_empty());
    assert!(!node.spec_path(&bad_uid).exists());
    assert!(node.checkpoint().prepared(&bad_uid).is_none());

    // A device withdrawn from the slices (a re-partition about to remove it) is refused too.
    let withdrawn = node.device("timeSlicing", 1);
    node.slices.send_modify(|slices| {
        let mut kept = (**slices).clone();
        for slice in &mut kept {
            slice.spec.devices.retain(|d| d.name != withdrawn.name);
        }
        *slices = Arc::new(kept);
    });
    let uid = node
        .allocated_claim("late", &[("gpu", &withdrawn.name)])
        .await;
    let answer = node.prepare("late", &uid).await;
    assert!(
        answer
            .error
            .contains(&format!("device {} ", withdrawn.name)),
        "{}",
        answer.error
    );

    // A UID that is not the claim's: the claim was deleted and created again.
    let answer = node.prepare("good", "not-the-uid").await;
    assert!(
        answer.error.contains(&format!(
            "ResourceClaim team-a/good has UID {good_uid}, not not-the-uid"
        )),
        "{}",
        answer.error
    );
    plugin.shutdown().await;
}

/// `gpu-share agent --plugin dra` as a process: it serves the kubelet plugin at the directories
/// its flags name, the simulated kubelet registers it, and SIGTERM removes both sockets (the
/// checkpoint stays: prepared claims outlive the agent's pod).
#[test]
fn the_agent_serves_the_dra_plugin_and_removes_its_sockets_on_sigterm() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let api = Arc::new(KubeDouble::start());
        api.put_configmap(kube_double::fixtures::configmap(
            node_sim::NS,
            node_sim::CM,
            &[("whole", &profile_text("exclusive"))],
        ));
        let mut node = node_sim::AgentNode::new(&api, "gpu-1", node_sim::h100s(2, false));
        let registry = node.path("kubelet/plugins_registry");
        let plugin_dir = node.path("kubelet/plugins/gpu.gpu-share.dev");
        let cdi_root = node.path("cdi");
        std::fs::create_dir_all(&registry).unwrap();
        let kubelet = DraKubelet::watch(&registry);
        let mut cmd = node.agent_command();
        cmd.args(["agent", "--plugin", "dra", "--lease-duration", "2s"])
            .arg("--dra-registration-dir")
            .arg(&registry)
            .arg("--dra-plugin-dir")
            .arg(&plugin_dir)
            .arg("--cdi-root")
            .arg(&cdi_root);
        node.spawn(cmd);
        let info = kubelet
            .wait_registered(DRIVER, Duration::from_secs(60))
            .await;
        let info = info.unwrap_or_else(|| panic!("not registered\n{}", node.log()));
        let dra_socket = plugin_dir.join("dra.sock");
        assert_eq!(info.endpoint, dra_socket.display().to_string());
        let reg_socket = registry.join("gpu.gpu-share.dev-reg.sock");
        assert!(reg_socket.exists());
        // The agent applies profiles as in the other modes (and is in its loop, where SIGTERM
        // is handled, once it has).
        api.set_node_label("gpu-1", node_sim::PROFILE_LABEL, Some("whole"));
        node_sim::wait_applied(&api, &node, "exclusive", Duration::from_secs(60));

        let pid = nix::unistd::Pid::from_raw(i32::try_from(node.agent_pid()).unwrap());
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        let sent = std::time::Instant::now();
        let status = loop {
            if let Some(status) = node.agent.as_mut().unwrap().try_wait().unwrap() {
                break status;
            }
            assert!(sent.elapsed() < Duration::from_secs(10), "{}", node.log());
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert!(status.success(), "{status:?}\n{}", node.log());
        assert!(
            !reg_socket.exists(),
            "registration socket left\n{}",
            node.log()
        );
        assert!(!dra_socket.exists(), "DRA socket left\n{}", node.log());
        assert!(plugin_dir.join("checkpoint.json").exists());
    });
}

/// A CDI spec that cannot be written fails the claim and leaves nothing behind (no checkpoint
/// entry, no spec), so the kubelet's retry prepares it afresh once the directory is usable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spec_that_cannot_be_written_fails_the_claim_and_a_retry_prepares_it() {
    let node = Node::new();
    let plugin = node.start().await;
    let device = node.device("exclusive", 0);
    let uid = node
        .allocated_claim("blocked", &[("gpu", &device.name)])
        .await;
    // The CDI directory is a plain file: no spec can be written under it.
    let _ = std::fs::remove_dir_all(&node.settings.cdi_root);
    std::fs::write(&node.settings.cdi_root, "not a directory").unwrap();
    let answer = node.prepare("blocked", &uid).await;
    assert!(
        answer.error.starts_with("cannot write the CDI spec"),
        "{}",
        answer.error
    );
    assert!(answer.devices.is_empty());
    assert!(node.checkpoint().claims.is_empty());

    std::fs::remove_file(&node.settings.cdi_root).unwrap();
    let answer = node.prepare("blocked", &uid).await;
    assert_eq!(answer.error, "");
    assert!(node.spec_path(&uid).exists());
    assert!(node.checkpoint().prepared(&uid).is_some());
    plugin.shutdown().await;
}

/// Kubelet 1.36 opens the DRAResourceHealth stream on the DRA socket (before this,
/// the plugin answered Unimplemented and the kubelet logged it every 5 s). Every published
/// device is listed Healthy; a critical XID on a MIG device makes that device and its shares
/// Unhealthy on the open stream, with the fault in the message, and the rest stay Healthy.
#[tokio::test]
async fn the_health_stream_lists_every_device_and_a_faulted_mig_device_turns_unhealthy() {
    use gpu_share::dra::kubelet_plugin::api::health::HealthStatus;
    let node = Node::new();
    let _plugin = node.start().await;
    let mut stream = node.kubelet.watch_health(DRIVER).await.unwrap();
    let first = stream.message().await.unwrap().expect("a first list");
    let published = node.published_devices();
    assert_eq!(first.devices.len(), published.len());
    assert!(first
        .devices
        .iter()
        .all(|d| d.health == HealthStatus::Healthy as i32));
    let mig = node.device("mig", 0);
    let mig_uuid = text(&mig, "uuid").to_string();
    let gpu_uuid = text(&mig, "parentUUID").to_string();
    node.faults.record(Fault {
        gpu_uuid,
        mig_uuid: Some(mig_uuid.clone()),
        xid: 48,
    });
    let next = tokio::time::timeout(WAIT, stream.message())
        .await
        .expect("a new list after the fault")
        .unwrap()
        .unwrap();
    let sick: Vec<&str> = next
        .devices
        .iter()
        .filter(|d| d.health == HealthStatus::Unhealthy as i32)
        .map(|d| d.device.as_ref().unwrap().device_name.as_str())
        .collect();
    let expected: Vec<&str> = published
        .iter()
        .filter(|d| {
            ["uuid", "migUUID"]
                .iter()
                .any(|k| d.attributes.get(*k).and_then(|a| a.string.as_deref()) == Some(&mig_uuid))
        })
        .map(|d| d.name.as_str())
        .collect();
    assert_eq!(sick, expected);
    assert!(sick.contains(&mig.name.as_str()));
    let message = &next
        .devices
        .iter()
        .find(|d| d.device.as_ref().unwrap().device_name == mig.name)
        .unwrap()
        .message;
    assert!(
        message.contains("XID 48") && message.contains(&mig_uuid),
        "{message}"
    );
}

/// The kubelet's plugin watcher dials the registration socket by path through grpc-go,
/// which sends the path as `:authority`. A plain tonic (h2) server resets that stream with
/// PROTOCOL_ERROR, what a real kubelet 1.36 logged ("failed to get plugin info using RPC
/// GetInfo … RST_STREAM with error code: PROTOCOL_ERROR"); served through the front the agent
/// uses for that socket (`kubelet::authority`), GetInfo answers. node-sim's kubelet registers
/// with the same grpc-go-shaped calls (`node_sim::grpc_go`), so every DRA test goes this way.
#[tokio::test]
async fn registration_answers_grpc_gos_socket_path_authority_only_through_the_front() {
    use gpu_share::dra::kubelet_plugin::api::registration::registration_server::RegistrationServer;
    use gpu_share::dra::kubelet_plugin::api::registration::{InfoRequest, PluginInfo};
    use gpu_share::dra::kubelet_plugin::registration::RegistrationService;
    use gpu_share::kubelet::serving::Serving;

    let dir = tempfile::tempdir().unwrap();
    let service = RegistrationService::new(
        DRIVER,
        "/var/lib/kubelet/plugins/x/dra.sock",
        Default::default(),
    );
    let router = |_| {
        tonic::transport::Server::builder().add_service(RegistrationServer::new(service.clone()))
    };
    let (plain, fronted) = (
        dir.path().join("plain.sock"),
        dir.path().join("fronted.sock"),
    );
    let plain_server = Serving::start(&plain, "plain", router).unwrap();
    let fronted_server = Serving::start_for_plugin_watcher(&fronted, "fronted", router).unwrap();
    let get_info = "/pluginregistration.Registration/GetInfo";
    let call = |socket: PathBuf, authority: String| async move {
        node_sim::grpc_go::unary::<_, PluginInfo>(&socket, &authority, get_info, &InfoRequest {})
            .await
    };
    let path = |p: &Path| p.display().to_string();

    let refused = call(plain.clone(), path(&plain)).await.unwrap_err();
    assert!(
        refused.contains("RST_STREAM") && refused.contains("PROTOCOL_ERROR"),
        "{refused}"
    );
    let info = call(plain.clone(), "localhost".into()).await.unwrap();
    assert_eq!(info.name, DRIVER, "a valid authority is served as it is");
    let info = call(fronted.clone(), path(&fronted)).await.unwrap();
    assert_eq!(info.name, DRIVER);
    assert_eq!(info.endpoint, "/var/lib/kubelet/plugins/x/dra.sock");
    plain_server.stop().await;
    fronted_server.stop().await;
}

/// A claim with several devices gets edits a container can take together. Each
/// device's CDI device used to set `NVIDIA_VISIBLE_DEVICES` to its own UUID, and the runtime
/// keeps the last: the container saw one GPU. Now every device carries the whole list (and MPS
/// shares of one daemon its one pipe, their pinned-memory limits re-indexed); MPS beside a
/// device without it fails the claim, naming both, as the built-in plugin refuses such a
/// request.
#[tokio::test]
async fn a_claims_devices_are_all_visible_to_its_container() {
    let node = Node::new();
    let plugin = node.start().await;
    let visible = |spec: &Spec| -> Vec<String> {
        let lists: BTreeSet<String> = spec
            .devices
            .iter()
            .map(|d| {
                let env = &d.container_edits.env;
                let v = env
                    .iter()
                    .find_map(|e| e.strip_prefix("NVIDIA_VISIBLE_DEVICES="));
                v.expect("NVIDIA_VISIBLE_DEVICES").to_string()
            })
            .collect();
        assert_eq!(
            lists.len(),
            1,
            "every device carries the same list: {lists:?}"
        );
        lists
            .into_iter()
            .next()
            .unwrap()
            .split(',')
            .map(String::from)
            .collect()
    };

    let (mig, sliced) = (node.device("mig", 0), node.device("timeSlicing", 0));
    let uid = node
        .allocated_claim("two", &[("a", &mig.name), ("b", &sliced.name)])
        .await;
    let answer = node.prepare("two", &uid).await;
    assert_eq!(answer.error, "");
    assert_eq!(answer.devices.len(), 2);
    let spec = node.spec(&uid);
    assert_eq!(
        visible(&spec),
        [text(&mig, "uuid"), text(&sliced, "parentUUID")],
        "the MIG device and the time-sliced GPU"
    );

    let shares: Vec<Device> = node
        .published_devices()
        .into_iter()
        .filter(|d| d.attributes["sharing"].string.as_deref() == Some("mps"))
        .filter(|d| int(d, "shareIndex") == 0)
        .collect();
    assert_eq!(shares.len(), 2, "share 0 of each MPS GPU");
    let uid = node
        .allocated_claim("mps-two", &[("a", &shares[0].name), ("b", &shares[1].name)])
        .await;
    assert_eq!(node.prepare("mps-two", &uid).await.error, "");
    let spec = node.spec(&uid);
    let gpus: Vec<&str> = shares.iter().map(|d| text(d, "parentUUID")).collect();
    assert_eq!(visible(&spec), gpus);
    let env = &spec.devices[1].container_edits.env;
    let pinned = env
        .iter()
        .find_map(|e| e.strip_prefix("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="))
        .expect("the pinned-memory limits");
    assert!(
        pinned.starts_with("0=") && pinned.contains(",1="),
        "{pinned}"
    );
    assert_eq!(
        env.iter()
            .filter(|e| e.starts_with("CUDA_MPS_PIPE_DIRECTORY="))
            .count(),
        1
    );

    let uid = node
        .allocated_claim("mixed", &[("a", &shares[0].name), ("b", &mig.name)])
        .await;
    let refused = node.prepare("mixed", &uid).await.error;
    assert!(
        refused.contains(&shares[0].name) && refused.contains(&mig.name),
        "{refused}"
    );
    assert!(
        !node.spec_path(&uid).exists(),
        "nothing written for a refused claim"
    );
    plugin.shutdown().await;
}

/// What a claim asks of a consumable device, as `capacity: {requests: {...}}`.
fn asks(pairs: &[(&str, &str)]) -> std::collections::BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The spec env of the claim's only device, and that device's CDI name.
fn share_env(node: &Node, uid: &str) -> (String, Vec<String>) {
    let spec = node.spec(uid);
    assert_eq!(spec.devices.len(), 1, "{spec:?}");
    (
        spec.devices[0].name.clone(),
        spec.devices[0].container_edits.env.clone(),
    )
}

/// Fractional GPUs (`dra/h100-fractional`): claims sharing one consumable MPS GPU each get a
/// CDI device of their own (named with the shareID) whose MPS limits are what the scheduler
/// gave that claim (its `consumedCapacity`, computed by the port of the scheduler's arithmetic
/// in node-sim); the daemon is the GPU's one daemon. Unpreparing one claim leaves the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_sharing_a_consumable_gpu_get_their_own_mps_limits() {
    let node = Node::with_profile("dra/h100-fractional");
    let plugin = node.start().await;
    let gpu = node.device("mps", 0);
    assert_eq!(gpu.name, "gpu-0-mps");
    assert!(gpu.is_consumable());

    // A 10 GiB, 25 % claim; one asking nothing (the policy's defaults, 4Gi and 10);
    // one asking 9.5 GiB and 12 %, rounded up to the next steps (10Gi, 15): what the real
    // 1.36.2 scheduler of ../shared/testbed wrote for the same ask and policy
    // (docs/testbed/agent-checks.sh check 15: consumed {"clients":"1","compute":"15","memory":"10Gi"}).
    let big = consumed_capacity(&gpu, &asks(&[("memory", "10Gi"), ("compute", "25")])).unwrap();
    let plain = consumed_capacity(&gpu, &asks(&[])).unwrap();
    let rounded =
        consumed_capacity(&gpu, &asks(&[("memory", "9728Mi"), ("compute", "12")])).unwrap();
    assert_eq!(
        (plain["memory"].as_str(), plain["compute"].as_str()),
        ("4Gi", "10")
    );
    assert_eq!(
        (rounded["memory"].as_str(), rounded["compute"].as_str()),
        ("10Gi", "15")
    );
    let mut held: Vec<Consumed> = Vec::new();
    let mut uids = Vec::new();
    for (name, consumed, share) in [
        ("big", &big, "s-1"),
        ("plain", &plain, "s-2"),
        ("rounded", &rounded, "s-3"),
    ] {
        fits(&gpu, &held, consumed).unwrap();
        held.push(consumed.clone());
        let uid = node
            .allocated_shares(name, &gpu.name, &[("gpu", share, consumed)])
            .await;
        let answer = node.prepare(name, &uid).await;
        assert_eq!(answer.error, "", "{name}");
        assert_eq!(answer.devices[0].share_id.as_deref(), Some(share));
        assert_eq!(
            answer.devices[0].cdi_device_ids[0],
            format!("gpu.gpu-share.dev/claim={uid}-gpu-0-mps-{share}")
        );
        uids.push(uid);
    }
    let limits = |uid: &str| {
        let (_, env) = share_env(&node, uid);
        let get = |key: &str| {
            env.iter()
                .find_map(|e| e.strip_prefix(&format!("{key}=")))
                .unwrap_or_else(|| panic!("{key} in {env:?}"))
                .to_string()
        };
        (
            get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"),
            get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"),
            get("CUDA_MPS_PIPE_DIRECTORY"),
        )
    };
    let (pinned, threads, pipe) = limits(&uids[0]);
    assert_eq!((pinned.as_str(), threads.as_str()), ("0=10240M", "25"));
    assert_eq!(limits(&uids[1]).0, "0=4096M");
    assert_eq!(limits(&uids[1]).1, "10");
    assert_eq!(limits(&uids[2]).0, "0=10240M");
    assert_eq!(limits(&uids[2]).1, "15");
    assert!(
        uids.iter().all(|u| limits(u).2 == pipe),
        "one daemon for the GPU"
    );
    let shares: Vec<_> = node
        .checkpoint()
        .claims
        .values()
        .flat_map(|c| c.devices.iter().filter_map(|d| d.share))
        .collect();
    assert_eq!(shares.len(), 3, "the checkpoint keeps each share");

    assert_eq!(node.unprepare("big", &uids[0]).await, "");
    assert!(!node.spec_path(&uids[0]).exists());
    assert_eq!(limits(&uids[1]).0, "0=4096M", "the others stay");
    assert!(node.spec_path(&uids[2]).exists());
    plugin.shutdown().await;
}

/// Bad allocations of a consumable GPU fail their own claim only, each with a message naming
/// the claim, the device and the amount: no `consumedCapacity` (a scheduler without the
/// feature), more than the device publishes, and shares that together exceed the device (not
/// what the scheduler allocates: nothing is handed out twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_shares_of_a_consumable_gpu_fail_alone_and_say_why() {
    let node = Node::with_profile("dra/h100-fractional");
    let plugin = node.start().await;
    let gpu = node.device("mps", 0);
    let half = consumed_capacity(&gpu, &asks(&[("memory", "36Gi"), ("compute", "50")])).unwrap();
    let first = node
        .allocated_shares("first", &gpu.name, &[("gpu", "s-1", &half)])
        .await;
    assert_eq!(node.prepare("first", &first).await.error, "");

    let none = node
        .allocated_shares("none", &gpu.name, &[("gpu", "s-2", &Consumed::new())])
        .await;
    let error = node.prepare("none", &none).await.error;
    assert!(
        error.starts_with("ResourceClaim team-a/none: device gpu-0-mps is shared by capacity, but the allocation gives no consumedCapacity \"memory\""),
        "{error}"
    );
    let mut over = half.clone();
    over.insert("memory".into(), "100Gi".into());
    let too_big = node
        .allocated_shares("too-big", &gpu.name, &[("gpu", "s-3", &over)])
        .await;
    let error = node.prepare("too-big", &too_big).await.error;
    assert!(
        error.contains("team-a/too-big")
            && error.contains(
                "consumedCapacity \"memory\" is 100Gi, more than the 81559Mi the device publishes"
            ),
        "{error}"
    );
    // The scheduler would not allocate a third 36Gi/50 % share beside two: the port says so,
    // and Prepare refuses such an allocation all the same.
    let second = node
        .allocated_shares("second", &gpu.name, &[("gpu", "s-4", &half)])
        .await;
    assert_eq!(node.prepare("second", &second).await.error, "");
    assert_eq!(
        fits(&gpu, &[half.clone(), half.clone()], &half),
        Err(NotAllocated::Full {
            capacity: "compute".into()
        })
    );
    let third = node
        .allocated_shares("third", &gpu.name, &[("gpu", "s-5", &half)])
        .await;
    let error = node.prepare("third", &third).await.error;
    assert!(
        error.contains("team-a/third") && error.contains("device gpu-0-mps: the prepared shares would hold 110592 MiB of its 81559 MiB memory"),
        "{error}"
    );
    for refused in [&none, &too_big, &third] {
        assert!(
            !node.spec_path(refused).exists(),
            "nothing written for a refused claim"
        );
    }
    assert!(node.spec_path(&first).exists() && node.spec_path(&second).exists());
    assert_eq!(
        node.checkpoint().claims.len(),
        2,
        "only the good claims are prepared"
    );
    plugin.shutdown().await;
}

/// The scheduler's refusals for consumable capacity (the port of consumable_capacity.go the
/// tests play the scheduler with, checked against gpu-share's published policy): an ask for a
/// capacity the device lacks, an ask past what is left, and more clients than `replicas`.
#[test]
fn the_scheduler_port_refuses_what_the_scheduler_refuses() {
    let (slices, _) = published("dra/h100-fractional");
    let gpu = slices[0].spec.devices[0].clone();
    assert_eq!(
        consumed_capacity(&gpu, &asks(&[("sms", "10")])),
        Err(NotAllocated::UnknownCapacity("sms".into()))
    );
    assert_eq!(
        consumed_capacity(&gpu, &asks(&[("clients", "2")])),
        Err(NotAllocated::ViolatesPolicy {
            capacity: "clients".into(),
            amount: "2".into()
        })
    );
    let whole = consumed_capacity(&gpu, &asks(&[("memory", "90Gi")])).unwrap();
    assert_eq!(
        fits(&gpu, &[], &whole),
        Err(NotAllocated::Full {
            capacity: "memory".into()
        })
    );
    let small = consumed_capacity(&gpu, &asks(&[("memory", "1Gi"), ("compute", "5")])).unwrap();
    let sixteen = vec![small.clone(); 16];
    assert_eq!(fits(&gpu, &sixteen[..15], &small), Ok(()));
    assert_eq!(
        fits(&gpu, &sixteen, &small),
        Err(NotAllocated::Full {
            capacity: "clients".into()
        }),
        "16 MPS clients at most"
    );
}

/// A restarted plugin keeps each prepared share of a consumable GPU from its checkpoint: the
/// kubelet's repeated Prepare gets the same answer (shareID, CDI device) and spec, and the
/// shares prepared before the restart still count against the device for the next claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_keeps_prepared_shares_and_counts_them() {
    let node = Node::with_profile("dra/h100-fractional");
    let plugin = node.start().await;
    let gpu = node.device("mps", 0);
    let half = consumed_capacity(&gpu, &asks(&[("memory", "36Gi"), ("compute", "40")])).unwrap();
    let uid = node
        .allocated_shares("kept", &gpu.name, &[("gpu", "s-1", &half)])
        .await;
    let answer = node.prepare("kept", &uid).await;
    assert_eq!(answer.error, "");
    let spec = std::fs::read(node.spec_path(&uid)).unwrap();
    plugin.shutdown().await;

    let plugin = node.start().await;
    assert_eq!(node.prepare("kept", &uid).await, answer, "the same answer");
    assert_eq!(std::fs::read(node.spec_path(&uid)).unwrap(), spec);
    let second = node
        .allocated_shares("second", &gpu.name, &[("gpu", "s-2", &half)])
        .await;
    assert_eq!(node.prepare("second", &second).await.error, "");
    let third = node
        .allocated_shares("third", &gpu.name, &[("gpu", "s-3", &half)])
        .await;
    let error = node.prepare("third", &third).await.error;
    assert!(
        error.contains("would hold 110592 MiB of its 81559 MiB memory"),
        "the shares from before the restart count: {error}"
    );
    plugin.shutdown().await;
}

/// Fractional MIG devices: `mig: {3g.40gb: 2}` beside `mps: {replicas: 8, consumable: ...}`
/// publishes each MIG device as one consumable device (its profile's memory, 100 % of its SMs,
/// 8 clients), and a claim's share reaches that MIG device's own MPS daemon with its own limits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_share_of_a_fractional_mig_device_reaches_its_daemon_with_its_limits() {
    let text = "version: v1\nrules:\n  - devices: all\n    mig: {3g.40gb: 2}\n    mps:\n      replicas: 8\n      consumable:\n        memory: {default: 4Gi, min: 1Gi, step: 1Gi}\n        compute: {default: 10, min: 5, step: 5}\n";
    let node = Node::with_profile_text(text);
    let plugin = node.start().await;
    let mig = node.device("mps", 0);
    assert!(mig.is_consumable());
    assert!(mig.name.ends_with("-3g-40gb-mps"), "{}", mig.name);
    assert!(mig.consumes_counters.is_empty());
    assert_eq!(mig.capacity["clients"].value.0, "8");
    let mig_uuid = text_attr(&mig, "uuid");
    assert!(mig_uuid.starts_with("MIG-"), "{mig_uuid}");
    let ask = consumed_capacity(&mig, &asks(&[("memory", "12Gi"), ("compute", "50")])).unwrap();
    // Two such claims fit one MIG device (a capacity without a policy would be charged whole to
    // each: the real scheduler kept a second claim Pending until `computeSlices` went).
    fits(&mig, std::slice::from_ref(&ask), &ask).unwrap();
    let uid = node
        .allocated_shares("mig-share", &mig.name, &[("gpu", "s-1", &ask)])
        .await;
    let answer = node.prepare("mig-share", &uid).await;
    assert_eq!(answer.error, "");
    let (_, env) = share_env(&node, &uid);
    assert!(
        env.contains(&"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=12288M".to_string()),
        "{env:?}"
    );
    assert!(
        env.contains(&"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50".to_string()),
        "{env:?}"
    );
    assert!(
        env.contains(&format!("NVIDIA_VISIBLE_DEVICES={mig_uuid}")),
        "{env:?}"
    );
    let pipe = env
        .iter()
        .find_map(|e| e.strip_prefix("CUDA_MPS_PIPE_DIRECTORY="))
        .unwrap();
    assert!(
        pipe.contains(&mig_uuid),
        "the MIG device's own daemon: {pipe}"
    );
    plugin.shutdown().await;
}

fn text_attr(device: &Device, key: &str) -> String {
    device.attributes[key].string.clone().unwrap_or_default()
}
