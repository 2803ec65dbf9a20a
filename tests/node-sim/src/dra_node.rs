//! A simulated node running `gpu-share agent --plugin dra` with the kubelet's DRA side
//! ([`DraKubelet`]) and the Kubernetes API double serving resource.k8s.io/v1, for the DRA
//! integration tests. The test plays the scheduler: it reads the slices the agent published
//! and writes a claim's `status.allocation` naming one of their devices, as kube-scheduler's
//! DRA plugin does (`DeviceRequestAllocationResult`: request, driver, pool, device); the
//! kubelet then asks the driver to prepare the claim.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use gpu_share::dra::kubelet_plugin::api::dra::NodePrepareResourceResponse;
use gpu_share::dra::kubelet_plugin::cdi::{spec_path, Spec};
use gpu_share::dra::kubelet_plugin::checkpoint::Checkpoint;
use gpu_share::dra::kubelet_plugin::claim::resource as claim_resource;
use gpu_share::dra::DRIVER;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube_double::KubeDouble;
use serde_json::{json, Value};

use crate::*;

/// The namespace claims are made in.
pub const CLAIM_NS: &str = "team-a";
const WAIT: Duration = Duration::from_secs(60);

/// The simulated node with its agent (`--plugin dra`) and the kubelet's DRA side.
pub struct DraNode {
    pub api: Arc<KubeDouble>,
    pub node: AgentNode,
    pub kubelet: DraKubelet,
    pub plugin_dir: PathBuf,
    pub cdi_root: PathBuf,
    /// The Node's name, which is also the pool's.
    pub name: String,
    /// The agent's flags (`--plugin dra` and the DRA directories), for a restart.
    flags: Vec<String>,
}

impl DraNode {
    /// Node `name` with `gpus` and the profiles ConfigMap (`examples` from profiles/, `extra`
    /// as given), the agent started with `--plugin dra`, its DRA directories under the node's
    /// temp dir and `flags`, registered by the simulated kubelet.
    pub async fn start(
        name: &str,
        gpus: Vec<Gpu>,
        examples: &[&str],
        extra: &[(&str, String)],
        flags: &[&str],
    ) -> DraNode {
        let api = Arc::new(KubeDouble::start());
        profiles_configmap(&api, examples, extra);
        let mut node = AgentNode::new(&api, name, gpus);
        let registry = node.path("kubelet/plugins_registry");
        let plugin_dir = node.path("kubelet/plugins/gpu.gpu-share.dev");
        let cdi_root = node.path("cdi");
        std::fs::create_dir_all(&registry).unwrap();
        let kubelet = DraKubelet::watch(&registry);
        let mut agent_flags: Vec<String> = vec![
            "--plugin".into(),
            "dra".into(),
            "--dra-registration-dir".into(),
            registry.display().to_string(),
            "--dra-plugin-dir".into(),
            plugin_dir.display().to_string(),
            "--cdi-root".into(),
            cdi_root.display().to_string(),
        ];
        agent_flags.extend(flags.iter().map(|f| f.to_string()));
        node.start_agent(&as_strs(&agent_flags), &[]);
        if kubelet.wait_registered(DRIVER, WAIT).await.is_none() {
            panic!(
                "the kubelet did not register {DRIVER}: {:?}\n{}",
                kubelet.refused(),
                node.log()
            );
        }
        DraNode {
            api,
            node,
            kubelet,
            plugin_dir,
            cdi_root,
            name: name.to_string(),
            flags: agent_flags,
        }
    }

    /// Kill the agent (SIGKILL: no shutdown, its sockets stay behind) and start it again.
    pub fn restart_agent(&mut self) {
        self.restart_agent_with(&[]);
    }

    /// [`DraNode::restart_agent`] with `env` (fault injection: `FAKE_NVML_*`), returning once
    /// the new agent serves its sockets: its reconcile loop, which starts after them, logged
    /// its first reconcile (the logs of every agent run are kept, so one more than before).
    pub fn restart_agent_with(&mut self, env: &[(&str, String)]) {
        const STARTED: &str = "reconciling want=";
        let before = self.node.log().matches(STARTED).count();
        self.node.kill_agent();
        self.node.start_agent(&as_strs(&self.flags), env);
        let deadline = std::time::Instant::now() + WAIT;
        while self.node.log().matches(STARTED).count() <= before {
            assert!(
                std::time::Instant::now() < deadline,
                "the restarted agent did not start:\n{}",
                self.node.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Label the node with `key` and wait until the agent applied `text`.
    pub fn apply(&self, key: &str, text: &str) {
        self.api
            .set_node_label(&self.name, PROFILE_LABEL, Some(key));
        wait_applied_text(&self.api, &self.node, text, WAIT, key);
    }

    /// This node's slices of the driver, as the API holds them.
    pub fn slices(&self) -> Vec<Value> {
        self.api
            .resource_slices()
            .into_iter()
            .filter(|s| s["spec"]["nodeName"] == self.name && s["spec"]["driver"] == DRIVER)
            .collect()
    }

    /// The published device `name`, if the API's slices have it.
    pub fn published(&self, name: &str) -> Option<Value> {
        self.slices()
            .iter()
            .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
            .find(|d| d["name"] == name)
    }

    pub fn device_names(&self) -> BTreeSet<String> {
        device_names(&self.slices())
    }

    /// The pool's one generation.
    pub fn generation(&self) -> i64 {
        let all: BTreeSet<i64> = self
            .slices()
            .iter()
            .map(|s| s["spec"]["pool"]["generation"].as_i64().unwrap())
            .collect();
        assert_eq!(all.len(), 1, "one generation across the pool: {all:?}");
        *all.first().unwrap()
    }

    /// What `gpu-share plan --plugin dra` prints for profile `text` on the GPUs as they are now:
    /// the names of its devices.
    pub fn planned_devices(&self, profile: &str) -> BTreeSet<String> {
        device_names(&planned_slices(&self.node, profile))
    }

    /// The UUID of the MIG device at placement `start` of GPU `gpu`, as the fake NVML made it.
    pub fn mig_uuid(&self, gpu: usize, start: u32) -> String {
        let gi = self.node.gi_at(gpu, start);
        let state = self.node.nvml();
        let instance = state.gpus[gpu]
            .gpu_instances
            .iter()
            .find(|g| g.id == gi)
            .unwrap();
        instance.compute_instances[0].uuid.clone()
    }

    pub fn claims(&self) -> Api<DynamicObject> {
        Api::namespaced_with(self.api.client(), CLAIM_NS, &claim_resource())
    }

    /// Play the scheduler: create claim `name` and allocate it `device` of this node's pool
    /// (written through the status subresource). Returns its UID.
    pub async fn allocate(&self, name: &str, device: &str) -> String {
        let mut obj = DynamicObject::new(name, &claim_resource()).within(CLAIM_NS);
        obj.data = json!({"spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": "gpu.gpu-share.dev"}}
        ]}}});
        let created = self
            .claims()
            .create(&PostParams::default(), &obj)
            .await
            .unwrap();
        let status = json!({"status": {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": DRIVER, "pool": &self.name, "device": device}
        ]}}}});
        self.claims()
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .unwrap();
        created.metadata.uid.unwrap()
    }

    pub async fn prepare(&self, name: &str, uid: &str) -> NodePrepareResourceResponse {
        let mut answer = self
            .kubelet
            .prepare(DRIVER, vec![claim(CLAIM_NS, name, uid)])
            .await
            .unwrap_or_else(|e| panic!("NodePrepareResources: {e}\n{}", self.node.log()));
        answer.claims.remove(uid).expect("an answer for the claim")
    }

    pub async fn unprepare(&self, name: &str, uid: &str) -> String {
        let mut answer = self
            .kubelet
            .unprepare(DRIVER, vec![claim(CLAIM_NS, name, uid)])
            .await
            .unwrap();
        answer.claims.remove(uid).expect("an answer").error
    }

    pub fn spec_file(&self, uid: &str) -> PathBuf {
        spec_path(&self.cdi_root, uid)
    }

    /// The claim's CDI spec: its environment lines, all devices together.
    pub fn spec_env(&self, uid: &str) -> Vec<String> {
        let spec: Spec = serde_json::from_slice(&std::fs::read(self.spec_file(uid)).unwrap())
            .unwrap_or_else(|e| panic!("spec of {uid}: {e}"));
        spec.devices
            .iter()
            .flat_map(|d| d.container_edits.env.clone())
            .collect()
    }

    pub fn checkpoint(&self) -> Checkpoint {
        Checkpoint::load(&self.plugin_dir.join("checkpoint.json")).unwrap()
    }
}

/// The `resourceSlices` of `gpu-share plan --plugin dra` for `profile_text` on `node`'s GPUs as
/// NVML shows them now (`status -o json` → `plan --current`).
pub fn planned_slices(node: &AgentNode, profile_text: &str) -> Vec<Value> {
    let current = node.path("observed.json");
    let observed = observe(&node.nvml_state());
    std::fs::write(&current, serde_json::to_vec(&observed).unwrap()).unwrap();
    let file = node.path("next.yaml");
    std::fs::write(&file, profile_text).unwrap();
    let out = Command::new(gpu_share_bin())
        .args(["plan", "--plugin", "dra", "--output", "json"])
        .args(["--node-name", &node.name, "--profile"])
        .arg(&file)
        .arg("--current")
        .arg(&current)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    assert!(out.status.success(), "plan: {}", text(&out));
    let plan: Value = serde_json::from_slice(&out.stdout).unwrap();
    plan["resourceSlices"].as_array().unwrap().clone()
}

pub fn as_strs(flags: &[String]) -> Vec<&str> {
    flags.iter().map(String::as_str).collect()
}

pub fn device_names(slices: &[Value]) -> BTreeSet<String> {
    slices
        .iter()
        .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .map(|d| d["name"].as_str().unwrap().to_string())
        .collect()
}

/// A published device's string attribute (attributes are `{"string": …}` / `{"int": …}`).
pub fn attr_str(device: &Value, key: &str) -> String {
    device["attributes"][key]["string"]
        .as_str()
        .unwrap_or_else(|| panic!("{key} of {device}"))
        .to_string()
}

pub fn attr_int(device: &Value, key: &str) -> u32 {
    let value = device["attributes"][key]["int"]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} of {device}"));
    u32::try_from(value).unwrap()
}
