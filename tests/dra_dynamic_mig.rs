//! Dynamic MIG end to end (docs/dra.md, "Dynamic MIG"): `gpu-share agent --plugin dra` on a
//! simulated node (fake NVML with the catalog's placement rules), the simulated kubelet's DRA
//! side and the API double. The test plays the scheduler as kube-scheduler's DRA allocator
//! does: first fit, in the order the devices are listed (KEP-4815); it also plays a scheduler
//! gone wrong, to see the plugin check what it is given.

use std::time::Duration;

use gpu_share::dra::kubelet_plugin::mig_journal::{MigJournal, State as EntryState, FILE};
use gpu_share::dra::DRIVER;
use node_sim::*;
use nvidia_ml::state::{ComputeInstance, Gpu, GpuInstance, Place, State};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(60);

const DYNAMIC: &str = "version: v1
description: every GPU dynamic MIG
rules:
  - devices: all
    dynamicMig: true
";

/// GPU 0 back to a fixed geometry (seven 1g.18gb), the others whole.
const STATIC: &str = "version: v1
rules:
  - devices: [0]
    mig: {1g.18gb: 7}
  - devices: [1, 2]
    exclusive: true
";

/// Two H200s (MIG `mig_on`) and an L4 (no MIG), the agent applying [`DYNAMIC`].
async fn start(name: &str, mig_on: bool) -> DraNode {
    start_with(name, mig_on, &[]).await
}

/// [`start`] with agent `flags`.
async fn start_with(name: &str, mig_on: bool, flags: &[&str]) -> DraNode {
    let mut gpus = gpus("h200", 2, mig_on);
    gpus.push(Gpu::non_mig("NVIDIA L4", 23034));
    let profiles = [("dyn", DYNAMIC.to_string()), ("static", STATIC.to_string())];
    let node = DraNode::start(name, gpus, &[], &profiles, flags).await;
    node.apply("dyn", DYNAMIC);
    node
}

/// The devices as the scheduler walks them: slices in name order (`<node>-gpu-share-<k>`, by
/// `k`), each slice's devices in order.
fn listed(node: &DraNode) -> Vec<Value> {
    let mut slices = node.slices();
    slices.sort_by_key(|s| {
        let name = s["metadata"]["name"].as_str().unwrap();
        name.rsplit('-').next().unwrap().parse::<u32>().unwrap()
    });
    slices
        .iter()
        .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .collect()
}

/// First fit for one MIG device of `profile`: the first listed device of that profile whose
/// placement no device in `held` overlaps on its GPU (what the counters would allow).
fn first_fit(node: &DraNode, profile: &str, held: &[&str]) -> String {
    let devices = listed(node);
    let slots = |d: &Value| -> (u32, u32) {
        let start = attr_int(d, "migPlacementStart");
        (
            attr_int(d, "parentIndex"),
            ((1 << attr_int(d, "migPlacementSize")) - 1) << start,
        )
    };
    let taken: Vec<(u32, u32)> = devices
        .iter()
        .filter(|d| held.contains(&d["name"].as_str().unwrap()))
        .map(slots)
        .collect();
    devices
        .iter()
        .filter(|d| d["attributes"]["migProfile"]["string"] == profile)
        .find(|d| {
            let (gpu, mask) = slots(d);
            !taken.iter().any(|&(g, m)| g == gpu && m & mask != 0)
        })
        .map(|d| d["name"].as_str().unwrap().to_string())
        .unwrap_or_else(|| panic!("no free {profile}"))
}

/// Prepare as the kubelet does after an agent restart: a Prepare refused because the restarted
/// plugin has not published yet is retried (nothing is made for a refused claim).
async fn prepare_retrying(
    node: &DraNode,
    name: &str,
    uid: &str,
) -> gpu_share::dra::kubelet_plugin::api::dra::NodePrepareResourceResponse {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let answer = node.prepare(name, uid).await;
        if !answer.error.contains("is not among the devices")
            || std::time::Instant::now() > deadline
        {
            return answer;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn journal(node: &DraNode) -> MigJournal {
    MigJournal::load(&node.plugin_dir.join(FILE)).unwrap()
}

fn gi_at(state: &State, gpu: usize, start: u32) -> Option<&GpuInstance> {
    state.gpus[gpu]
        .gpu_instances
        .iter()
        .find(|g| g.placement.start == start)
}

/// Prepare makes the instance at the allocated placement (MIG turned on first), Unprepare
/// destroys it once its processes are gone; a placement the scheduler should not have given
/// (overlapping an instance) and a whole GPU with instances on it are refused naming what is in
/// the way, touching nothing; the whole GPU is given with MIG off; an L4 is published whole.
#[test]
fn claims_make_their_instances_at_prepare_and_destroy_them_at_unprepare() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let node = start("dyn-a", false).await;
        let names = node.device_names();
        assert!(names.contains("gpu-0-mig-6-1g-18gb"), "{names:?}");
        assert!(names.contains("gpu-1-mig-0-7g-141gb"), "{names:?}");
        assert!(names.contains("gpu-0"), "{names:?}");
        assert!(
            names.contains("gpu-2"),
            "the L4 is published whole: {names:?}"
        );
        assert!(
            !names.iter().any(|n| n.starts_with("gpu-2-mig")),
            "{names:?}"
        );
        let generation = node.generation();

        // First fit puts a 1g at slot 5: slot 6 would strand slot 7, slots 0-3 are the 4g's.
        let small = first_fit(&node, "1g.18gb", &[]);
        assert_eq!(small, "gpu-0-mig-5-1g-18gb");
        let uid = node.allocate("small", &small).await;
        let answer = node.prepare("small", &uid).await;
        assert_eq!(answer.error, "", "{}", node.node.log());
        let state = node.node.nvml();
        assert!(state.gpus[0].mig.as_ref().unwrap().current, "MIG turned on");
        let gi = gi_at(&state, 0, 5).expect("a GPU instance at slot 5");
        let uuid = gi.compute_instances[0].uuid.clone();
        assert_eq!(
            node.spec_env(&uid),
            [format!("NVIDIA_VISIBLE_DEVICES={uuid}")]
        );
        // Prepare again (the kubelet retries): the same answer, nothing made twice.
        let creates = node.node.count("nvmlDeviceCreateGpuInstanceWithPlacement");
        assert_eq!(node.prepare("small", &uid).await, answer);
        assert_eq!(
            node.node.count("nvmlDeviceCreateGpuInstanceWithPlacement"),
            creates
        );

        let medium = first_fit(&node, "3g.71gb", &[&small]);
        assert_eq!(medium, "gpu-0-mig-0-3g-71gb");
        let medium_uid = node.allocate("medium", &medium).await;
        assert_eq!(node.prepare("medium", &medium_uid).await.error, "");

        // A scheduler gone wrong: 3g at 4:4 overlaps the 1g at slot 5.
        let before = node.node.mutations().len();
        let wrong = node.allocate("wrong", "gpu-0-mig-4-3g-71gb").await;
        let refused = node.prepare("wrong", &wrong).await;
        assert!(
            refused.error.contains("gpu-0-mig-4-3g-71gb"),
            "{}",
            refused.error
        );
        assert!(
            refused.error.contains("1g.18gb at 5:1"),
            "{}",
            refused.error
        );
        assert!(
            refused.error.contains("nothing was changed"),
            "{}",
            refused.error
        );
        let whole = node.allocate("whole", "gpu-0").await;
        let refused = node.prepare("whole", &whole).await;
        assert!(refused.error.contains("holds"), "{}", refused.error);
        assert_eq!(
            node.node.mutations().len(),
            before,
            "refusals touch nothing"
        );
        assert!(!node.spec_file(&wrong).exists());

        // The whole of GPU 1: MIG stays off, the GPU's UUID.
        let whole1 = node.allocate("whole1", "gpu-1").await;
        assert_eq!(node.prepare("whole1", &whole1).await.error, "");
        let state = node.node.nvml();
        assert!(!state.gpus[1].mig.as_ref().unwrap().current);
        assert_eq!(
            node.spec_env(&whole1),
            [format!("NVIDIA_VISIBLE_DEVICES={}", state.gpus[1].uuid)]
        );

        // Unprepare waits for the instance's processes.
        let gi_id = gi_at(&node.node.nvml(), 0, 5).unwrap().id;
        node.node
            .add_workloads(&node.api, &[Workload::on_mig("small-pod", 7100, 0, gi_id)]);
        let busy = node.unprepare("small", &uid).await;
        assert!(busy.contains("7100") && busy.contains("retries"), "{busy}");
        assert!(gi_at(&node.node.nvml(), 0, 5).is_some());
        let mut state = node.node.nvml();
        state.gpus[0].processes.clear();
        state.write_to(node.node.nvml_state()).unwrap();
        assert_eq!(node.unprepare("small", &uid).await, "");
        assert!(
            gi_at(&node.node.nvml(), 0, 5).is_none(),
            "the instance is destroyed"
        );
        assert!(!node.spec_file(&uid).exists());
        let left: Vec<String> = journal(&node)
            .entries
            .iter()
            .map(|e| e.device.clone())
            .collect();
        assert_eq!(left, ["gpu-0-mig-0-3g-71gb", "gpu-1"]);
        // Claims' instances are not out of band: the pool never changed.
        assert_eq!(node.generation(), generation);
    });
}

/// A crash between the GPU instance and its compute instance: the restarted agent destroys the
/// half-made instance (no prepared claim holds it) and the kubelet's retry makes it whole; a
/// prepared claim's instance that lost its compute instance gets it back; and a create that
/// fails half way is rolled back at once.
#[test]
fn a_crash_mid_create_leaves_no_half_instance_and_prepared_claims_keep_theirs() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut node = start("dyn-b", true).await;
        let kept = first_fit(&node, "2g.35gb", &[]);
        let kept_uid = node.allocate("kept", &kept).await;
        assert_eq!(node.prepare("kept", &kept_uid).await.error, "");
        let kept_start = attr_int(&node.published(&kept).unwrap(), "migPlacementStart");

        // Abort right before the second mutation: the GPU instance is made, its compute
        // instance not.
        node.restart_agent_with(&[("FAKE_NVML_ABORT_AT_MUTATION", "2".into())]);
        let small = first_fit(&node, "1g.18gb", &[&kept]);
        let start_slot = attr_int(&node.published(&small).unwrap(), "migPlacementStart");
        let uid = node.allocate("small", &small).await;
        let crashed = node
            .kubelet
            .prepare(DRIVER, vec![claim(CLAIM_NS, "small", &uid)])
            .await;
        assert!(crashed.is_err(), "the agent aborted: {crashed:?}");
        let state = node.node.nvml();
        let half = gi_at(&state, 0, start_slot).unwrap_or_else(|| {
            panic!(
                "no half-made GPU instance at {start_slot}: {:?}\n{}",
                state.gpus[0].gpu_instances,
                node.node.log()
            )
        });
        assert!(half.compute_instances.is_empty());
        assert_eq!(
            journal(&node)
                .entries
                .iter()
                .filter(|e| e.state == EntryState::Creating)
                .count(),
            1
        );

        // The prepared claim's instance loses its compute instance too (as after a crash in
        // an earlier version's create).
        let mut state = node.node.nvml();
        let gi = state.gpus[0]
            .gpu_instances
            .iter_mut()
            .find(|g| g.placement.start == kept_start)
            .unwrap();
        gi.compute_instances.clear();
        state.write_to(node.node.nvml_state()).unwrap();

        node.restart_agent();
        let state = node.node.nvml();
        assert!(
            gi_at(&state, 0, start_slot).is_none(),
            "half instance destroyed: {}",
            node.node.log()
        );
        let kept_gi = gi_at(&state, 0, kept_start).expect("the prepared claim's instance stays");
        assert_eq!(
            kept_gi.compute_instances.len(),
            1,
            "completed: {}",
            node.node.log()
        );
        let entries: Vec<String> = journal(&node)
            .entries
            .iter()
            .map(|e| e.device.clone())
            .collect();
        assert_eq!(entries, std::slice::from_ref(&kept));
        // The kubelet retries: made whole this time.
        let answer = prepare_retrying(&node, "small", &uid).await;
        assert_eq!(answer.error, "", "{}", node.node.log());
        let gi = gi_at(&node.node.nvml(), 0, start_slot).cloned().unwrap();
        assert_eq!(gi.compute_instances.len(), 1);

        // A compute instance that fails to be made: the GPU instance is rolled back.
        node.restart_agent_with(&[(
            "FAKE_NVML_FAIL",
            "nvmlGpuInstanceCreateComputeInstance:1:NVML_ERROR_INSUFFICIENT_RESOURCES".into(),
        )]);
        let other = first_fit(&node, "1g.18gb", &[&kept, &small]);
        let other_start = attr_int(&node.published(&other).unwrap(), "migPlacementStart");
        let other_uid = node.allocate("other", &other).await;
        let failed = prepare_retrying(&node, "other", &other_uid).await;
        assert!(
            failed.error.contains("creating 1g.18gb"),
            "{}",
            failed.error
        );
        assert!(
            gi_at(&node.node.nvml(), 0, other_start).is_none(),
            "rolled back"
        );
        assert!(journal(&node).entries.iter().all(|e| e.device != other));
        assert_eq!(
            node.prepare("other", &other_uid).await.error,
            "",
            "the retry makes it"
        );
    });
}

/// An instance made out of band on a dynamic GPU (here written into the fake NVML's state as
/// `nvidia-smi mig -cgi` would make it): a claim allocated on top of it before the agent saw it
/// is refused naming it, and the refusal has the agent reconcile at once (resyncs are 5 min
/// apart here), withdrawing the devices it overlaps with an Event naming it; they come back
/// once it is gone (here at a restart).
#[test]
fn out_of_band_instances_are_refused_then_withdrawn_until_destroyed() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut node = start_with("dyn-c", true, &["--resync-period", "5m"]).await;
        assert!(node.published("gpu-1-mig-0-1g-18gb").is_some());
        let wrong = node.allocate("wrong", "gpu-1-mig-0-2g-35gb").await;
        let mut state = node.node.nvml();
        state.gpus[1].gpu_instances.push(GpuInstance {
            id: 5,
            profile_id: 19,
            placement: Place::new(0, 1),
            compute_instances: vec![ComputeInstance {
                id: 0,
                profile_id: 0,
                placement: Place::new(0, 1),
                uuid: "MIG-out-of-band".into(),
            }],
        });
        state.write_to(node.node.nvml_state()).unwrap();
        let before = node.node.mutations().len();
        let refused = node.prepare("wrong", &wrong).await;
        assert!(
            refused.error.contains(
                "it overlaps GPU instance 5 (1g.18gb at 0:1), which the scheduler did not know of"
            ),
            "{}",
            refused.error
        );
        assert_eq!(node.node.mutations().len(), before, "nothing was changed");

        // The refusal has the agent republish at once (its resync is 5 min away).
        let gone = node.api.wait_until(WAIT, |_| {
            let names = node.device_names();
            !names.contains("gpu-1-mig-0-1g-18gb") && !names.contains("gpu-1")
        });
        assert!(gone, "{:?}\n{}", node.device_names(), node.node.log());
        let names = node.device_names();
        assert!(
            names.contains("gpu-1-mig-6-1g-18gb"),
            "what it does not overlap stays"
        );
        assert!(
            names.contains("gpu-0-mig-0-1g-18gb"),
            "other GPUs keep theirs"
        );
        let out_of_band = |api: &kube_double::KubeDouble| {
            api.events()
                .into_iter()
                .find(|e| e.reason.as_deref() == Some("OutOfBandMig"))
        };
        // Events are written in the background.
        node.api.wait_until(WAIT, |a| out_of_band(a).is_some());
        let event = out_of_band(&node.api).unwrap_or_else(|| {
            panic!(
                "no OutOfBandMig Event: {:?}\n{}",
                node.api.events(),
                node.node.log()
            )
        });
        let note = event.note.unwrap_or_default();
        assert!(note.contains("GPU 1 instance 5 (1g.18gb at 0:1)"), "{note}");

        let mut state = node.node.nvml();
        state.gpus[1].gpu_instances.clear();
        state.write_to(node.node.nvml_state()).unwrap();
        node.restart_agent();
        let back = node.api.wait_until(WAIT, |_| {
            node.device_names().contains("gpu-1-mig-0-1g-18gb")
        });
        assert!(back, "{}", node.node.log());
    });
}

/// Leaving dynamic MIG: a claim's instance that the new fixed geometry keeps becomes the
/// profile's (its journal entry goes before the drain), so the claim's Unprepare no longer
/// destroys it.
#[test]
fn leaving_dynamic_mig_hands_the_claims_instances_to_the_profile() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let node = start("dyn-d", true).await;
        let small = first_fit(&node, "1g.18gb", &[]);
        let uid = node.allocate("small", &small).await;
        assert_eq!(node.prepare("small", &uid).await.error, "");
        let start_slot = attr_int(&node.published(&small).unwrap(), "migPlacementStart");
        let gi = gi_at(&node.node.nvml(), 0, start_slot).unwrap().id;

        node.apply("static", STATIC);
        let state = node.node.nvml();
        assert_eq!(state.gpus[0].gpu_instances.len(), 7, "the fixed geometry");
        assert_eq!(
            gi_at(&state, 0, start_slot).unwrap().id,
            gi,
            "the claim's instance kept"
        );
        assert!(journal(&node).entries.is_empty(), "{:?}", journal(&node));
        assert_eq!(node.unprepare("small", &uid).await, "");
        assert_eq!(
            gi_at(&node.node.nvml(), 0, start_slot).map(|g| g.id),
            Some(gi),
            "Unprepare left the profile's instance alone: {}",
            node.node.log()
        );
    });
}

/// Every version of a ResourceSlice the API stores from now on, as a watch delivers them.
fn record_slices(
    api: &kube_double::KubeDouble,
) -> std::sync::Arc<std::sync::Mutex<Vec<gpu_share::dra::api::ResourceSlice>>> {
    use futures::StreamExt;
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let slices: kube::Api<gpu_share::dra::api::ResourceSlice> = kube::Api::all(api.client());
    let sink = seen.clone();
    tokio::spawn(async move {
        let config = kube::runtime::watcher::Config::default();
        let mut events = kube::runtime::watcher(slices, config).boxed();
        while let Some(Ok(event)) = events.next().await {
            if let kube::runtime::watcher::Event::Apply(s)
            | kube::runtime::watcher::Event::InitApply(s) = event
            {
                sink.lock().unwrap().push(s);
            }
        }
    });
    seen
}

/// An API server with `DRAPartitionableDevices` off (the 1.34 and 1.35 default) stores slices
/// without their counters (the API double drops them as strategy.go does), which would make a
/// dynamic GPU's placements independent devices the scheduler could allocate overlapping. The
/// agent finds the loss at the first counter slice it writes, before any placement is stored,
/// publishes the dynamic GPUs whole only and says why in a `CountersDropped` Warning; a claim
/// for a placement is refused, a whole dynamic GPU is prepared.
#[test]
fn a_server_that_drops_counters_is_never_offered_a_dynamic_placement() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut gpus = gpus("h200", 2, false);
        gpus.push(Gpu::non_mig("NVIDIA L4", 23034));
        let profiles = [("dyn", DYNAMIC.to_string())];
        let node = DraNode::start("dyn-gate-off", gpus, &[], &profiles, &[]).await;
        node.api.set_partitionable_devices(false);
        let seen = record_slices(&node.api);
        node.api
            .set_node_label(&node.name, PROFILE_LABEL, Some("dyn"));

        let whole: std::collections::BTreeSet<String> =
            ["gpu-0", "gpu-1", "gpu-2"].map(String::from).into();
        let dropped = |api: &kube_double::KubeDouble| {
            api.events()
                .into_iter()
                .find(|e| e.reason.as_deref() == Some("CountersDropped"))
        };
        let published = node.api.wait_until(WAIT, |api| {
            node.device_names() == whole && dropped(api).is_some()
        });
        assert!(published, "{:?}\n{}", node.device_names(), node.node.log());
        let event = dropped(&node.api).unwrap();
        assert_eq!(event.type_.as_deref(), Some("Warning"));
        let note = event.note.unwrap_or_default();
        assert!(note.contains("DRAPartitionableDevices off"), "{note}");
        assert!(
            note.contains("dynamic-MIG GPU(s) 0, 1 of profile dyn are offered whole only"),
            "{note}"
        );
        assert!(node
            .slices()
            .iter()
            .all(|s| s["spec"].get("sharedCounters").is_none()));

        // Nothing the API ever stored held a placement: the counter slice went first.
        let placements: Vec<String> = seen
            .lock()
            .unwrap()
            .iter()
            .flat_map(|s| &s.spec.devices)
            .filter(|d| d.name.contains("-mig-"))
            .map(|d| d.name.clone())
            .collect();
        assert!(placements.is_empty(), "stored: {placements:?}");

        let placement = node.allocate("placement", "gpu-0-mig-0-1g-18gb").await;
        let refused = node.prepare("placement", &placement).await;
        assert!(
            refused.error.contains("is not among the devices"),
            "{}",
            refused.error
        );
        assert!(node.node.nvml().gpus[0].gpu_instances.is_empty());
        let gpu = node.allocate("whole", "gpu-1").await;
        let answer = node.prepare("whole", &gpu).await;
        assert!(answer.error.is_empty(), "{}", answer.error);
    });
}
