//! The home lab: the agent on a Jetson (an integrated GPU, no NVML, known from the system's
//! files) and on a GeForce PC (NVML, no MIG), served by one profiles ConfigMap.
//!
//! The Jetson's files are those of L4T R36.4 (`AgentNode::make_jetson`); NVIDIA's device
//! plugin double counts the one `tegra` device its Tegra resource manager serves
//! (node-sim's nvidia_plugin.rs, from k8s-device-plugin v0.20.0).

use std::sync::Arc;
use std::time::Duration;

use kube_double::KubeDouble;
use node_sim::*;
use nvidia_ml::Gpu;

const ORIN_NANO: &str = "NVIDIA Jetson Orin Nano Developer Kit";

fn label(api: &KubeDouble, node: &str, key: &str) -> Option<String> {
    api.node(node)?.metadata.labels?.get(key).cloned()
}

fn no_nvml() -> [(&'static str, String); 1] {
    [("GPU_SHARE_NVML_LIB", NO_NVML.to_string())]
}

/// A Jetson node `name` whose agent runs with `extra` flags.
fn jetson(api: &Arc<KubeDouble>, name: &str, extra: &[&str]) -> AgentNode {
    let mut node = AgentNode::new(api, name, Vec::new());
    node.make_jetson(ORIN_NANO);
    node.start_agent(extra, &no_nvml());
    node
}

fn allocatable(api: &KubeDouble, node: &str, resource: &str) -> Option<u64> {
    gpu_allocatable(api, node).get(resource).copied()
}

fn reason(api: &KubeDouble, node: &str) -> String {
    annotation(api, node, REASON).unwrap_or_default()
}

/// Wait until `node` failed with a reason that says `says` (the profile, or a file); the reason.
fn wait_failed(api: &KubeDouble, node: &AgentNode, says: &str) -> String {
    let failed = api.wait_until(Duration::from_secs(20), |a| {
        state_of(a, &node.name).as_deref() == Some("failed") && reason(a, &node.name).contains(says)
    });
    assert!(
        failed,
        "{says}: state {:?}, reason {:?}\n{}",
        state_of(api, &node.name),
        reason(api, &node.name),
        node.log()
    );
    reason(api, &node.name)
}

#[test]
fn a_jetson_without_nvml_applies_time_slicing_and_says_what_it_found() {
    let api = Arc::new(KubeDouble::start());
    profiles_configmap(&api, &["homelab-timeslice", "exclusive"], &[]);
    let node = jetson(&api, "jetson-1", &[]);
    api.set_node_label("jetson-1", PROFILE_LABEL, Some("homelab-timeslice"));
    wait_applied(&api, &node, "homelab-timeslice", Duration::from_secs(20));

    let config = std::fs::read_to_string(node.plugin_config()).unwrap();
    assert!(config.contains("replicas: 4"), "{config}");
    assert!(config.contains("migStrategy: none"), "{config}");
    // What NVIDIA's plugin advertises from that config on a Tegra: its one device, 4 ways.
    assert_eq!(
        allocatable(&api, "jetson-1", "nvidia.com/gpu.shared"),
        Some(4)
    );
    assert!(
        api.wait_until(Duration::from_secs(10), |a| label(
            a,
            "jetson-1",
            "gpu-share.dev/gpu.platform"
        )
        .as_deref()
            == Some("tegra")),
        "{}",
        node.log()
    );
    assert_eq!(
        label(&api, "jetson-1", "gpu-share.dev/gpu.product").as_deref(),
        Some("NVIDIA-Jetson-Orin-Nano-Developer-Kit")
    );
    assert_eq!(
        label(&api, "jetson-1", "gpu-share.dev/gpu.count").as_deref(),
        Some("1")
    );
    let log = node.log();
    assert!(!log.contains("cannot load NVML"), "{log}");
    assert!(log.contains("no XID health watch"), "{log}");

    // Back to exclusive: one whole device.
    api.set_node_label("jetson-1", PROFILE_LABEL, Some("exclusive"));
    wait_applied(&api, &node, "exclusive", Duration::from_secs(20));
    assert_eq!(allocatable(&api, "jetson-1", "nvidia.com/gpu"), Some(1));
}

/// MIG and MPS are refused on a Jetson at reconcile, naming Tegra, and nothing is written:
/// the plugin config stays the one of the last good profile.
#[test]
fn mig_or_mps_labelled_onto_a_jetson_fails_naming_tegra_and_writes_nothing() {
    let api = Arc::new(KubeDouble::start());
    profiles_configmap(
        &api,
        &["homelab-timeslice", "h100-inference", "h100-mps"],
        &[],
    );
    let node = jetson(&api, "jetson-1", &[]);
    api.set_node_label("jetson-1", PROFILE_LABEL, Some("homelab-timeslice"));
    wait_applied(&api, &node, "homelab-timeslice", Duration::from_secs(20));
    let good = std::fs::read(node.plugin_config()).unwrap();

    for (profile, what) in [("h100-inference", "MIG"), ("h100-mps", "MPS")] {
        api.set_node_label("jetson-1", PROFILE_LABEL, Some(profile));
        let why = wait_failed(&api, &node, profile);
        assert!(why.contains("Jetson/Tegra") && why.contains(what), "{why}");
        assert!(why.contains(ORIN_NANO), "{why}");
        assert_eq!(
            std::fs::read(node.plugin_config()).unwrap(),
            good,
            "{profile}"
        );
    }
}

/// gpu-share's own plugins serve what NVML lists; on a Tegra the reconcile refuses them,
/// pointing at NVIDIA's plugin.
#[test]
fn the_builtin_plugin_on_a_jetson_is_refused_with_the_way_out() {
    let api = Arc::new(KubeDouble::start());
    profiles_configmap(&api, &["homelab-timeslice"], &[]);
    let mut node = AgentNode::new(&api, "jetson-1", Vec::new());
    node.make_jetson(ORIN_NANO);
    let plugins = node.path("device-plugins");
    let plugins = plugins.to_str().unwrap();
    node.start_agent(
        &["--plugin", "builtin", "--device-plugin-dir", plugins],
        &no_nvml(),
    );
    api.set_node_label("jetson-1", PROFILE_LABEL, Some("homelab-timeslice"));
    let why = wait_failed(&api, &node, "homelab-timeslice");
    assert!(
        why.contains("--plugin builtin cannot serve a Jetson/Tegra")
            && why.contains("--plugin nvidia"),
        "{why}"
    );
}

/// Files that identify a Tegra but disagree: the reconcile fails naming both files.
#[test]
fn contradictory_tegra_files_fail_naming_the_files() {
    let api = Arc::new(KubeDouble::start());
    profiles_configmap(&api, &["homelab-timeslice"], &[]);
    let mut node = AgentNode::new(&api, "jetson-1", Vec::new());
    node.make_jetson(ORIN_NANO);
    std::fs::write(node.path("host/sys/devices/soc0/family"), "jep106:0426\n").unwrap();
    node.start_agent(&[], &no_nvml());
    api.set_node_label("jetson-1", PROFILE_LABEL, Some("homelab-timeslice"));
    let why = wait_failed(&api, &node, "nv_tegra_release");
    assert!(
        why.contains("nv_tegra_release") && why.contains("soc0/family") && why.contains("jep106"),
        "{why}"
    );
    assert!(!node.plugin_config().exists(), "nothing written");
}

/// One ConfigMap, one profile (profiles/homelab-mixed.yaml) on a Jetson and a GeForce PC:
/// each node's rule picks it by product, and the labels tell the two apart.
#[test]
fn one_configmap_serves_a_jetson_and_a_geforce_pc() {
    let api = Arc::new(KubeDouble::start());
    profiles_configmap(&api, &["homelab-mixed"], &[]);
    let orin = jetson(&api, "jetson-1", &[]);
    let mut pc = AgentNode::new(
        &api,
        "gaming-pc",
        vec![Gpu::non_mig("NVIDIA GeForce RTX 3090", 24576)],
    );
    pc.start_agent(&[], &[]);
    for node in ["jetson-1", "gaming-pc"] {
        api.set_node_label(node, PROFILE_LABEL, Some("homelab-mixed"));
    }
    wait_applied(&api, &orin, "homelab-mixed", Duration::from_secs(20));
    wait_applied(&api, &pc, "homelab-mixed", Duration::from_secs(20));
    assert_eq!(
        allocatable(&api, "jetson-1", "nvidia.com/gpu.shared"),
        Some(2),
        "the Jetson rule: 2 ways"
    );
    assert_eq!(
        allocatable(&api, "gaming-pc", "nvidia.com/gpu.shared"),
        Some(4),
        "the GeForce rule: 4 ways"
    );
    for (node, platform, product) in [
        ("jetson-1", "tegra", "NVIDIA-Jetson-Orin-Nano-Developer-Kit"),
        ("gaming-pc", "nvml", "NVIDIA-GeForce-RTX-3090"),
    ] {
        assert!(
            api.wait_until(Duration::from_secs(10), |a| label(
                a,
                node,
                "gpu-share.dev/gpu.product"
            )
            .as_deref()
                == Some(product)),
            "{node}"
        );
        assert_eq!(
            label(&api, node, "gpu-share.dev/gpu.platform").as_deref(),
            Some(platform)
        );
    }
}

/// A Jetson's host root, without an agent: for `status`, `plan` and `doctor` run on it.
fn jetson_root() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let files = [
        ("etc/nv_tegra_release", TEGRA_RELEASE.as_bytes().to_vec()),
        ("sys/devices/soc0/family", b"Tegra\n".to_vec()),
        (
            "sys/firmware/devicetree/base/model",
            format!("{ORIN_NANO}\0").into_bytes(),
        ),
    ];
    for (path, bytes) in files {
        let path = dir.path().join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, bytes).unwrap();
    }
    dir
}

fn gpu_share_on(root: &std::path::Path, args: &[&str]) -> std::process::Output {
    std::process::Command::new(gpu_share_bin())
        .args(args)
        .arg("--host-root")
        .arg(root)
        .env("GPU_SHARE_NVML_LIB", NO_NVML)
        .current_dir(repo())
        .output()
        .unwrap()
}

#[test]
fn status_and_plan_on_a_jetson_say_what_the_agent_does() {
    let root = jetson_root();
    let out = gpu_share_on(root.path(), &["status"]);
    assert!(out.status.success(), "{}", text(&out));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains(&format!(
            "GPU 0  {ORIN_NANO}  Jetson/Tegra integrated GPU (L4T R36.4.0)"
        )),
        "{said}"
    );
    let out = gpu_share_on(root.path(), &["status", "-o", "json"]);
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(status["gpus"][0]["product"], ORIN_NANO);
    assert_eq!(status["gpus"][0]["tegra"]["release"], "L4T R36.4.0");

    let out = gpu_share_on(
        root.path(),
        &[
            "plan",
            "--profile",
            "profiles/homelab-mixed.yaml",
            "-o",
            "json",
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        plan["resources"],
        serde_json::json!({"nvidia.com/gpu.shared": 2})
    );

    for profile in ["profiles/h100-mps.yaml", "profiles/h100-inference.yaml"] {
        let out = gpu_share_on(root.path(), &["plan", "--profile", profile]);
        assert!(!out.status.success(), "{profile}");
        assert!(
            text(&out).contains("Jetson/Tegra integrated GPU"),
            "{}",
            text(&out)
        );
    }
    // gpu-share's own plugins serve what NVML lists: refused on a Tegra, whatever the mode.
    for plugin in ["builtin", "dra"] {
        let out = gpu_share_on(
            root.path(),
            &[
                "plan",
                "--profile",
                "profiles/homelab-timeslice.yaml",
                "--plugin",
                plugin,
            ],
        );
        assert!(!out.status.success(), "{plugin}");
        let said = text(&out);
        assert!(
            said.contains(&format!("--plugin {plugin} cannot serve a Jetson/Tegra")),
            "{said}"
        );
    }
}

#[test]
fn validate_refuses_mig_and_mps_for_rules_that_name_a_jetson() {
    let dir = tempfile::tempdir().unwrap();
    for (name, rule) in [("mig", "mig: {1g.10gb: 7}"), ("mps", "mps: {replicas: 4}")] {
        let path = dir.path().join(format!("{name}.yaml"));
        std::fs::write(
            &path,
            format!("version: v1\nrules:\n  - devices: {{product: \"*Jetson*\"}}\n    {rule}\n"),
        )
        .unwrap();
        let out = std::process::Command::new(gpu_share_bin())
            .arg("validate")
            .arg(&path)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{name}");
        let said = text(&out);
        assert!(
            said.contains(&format!(
                "{} is not available on *Jetson*",
                name.to_uppercase()
            )),
            "{said}"
        );
    }
}

/// The NVIDIA plugin shares every whole GPU of a node one way, so two product rules sharing
/// differently are a warning at validate (a node meets one of them) and an error at plan on a
/// node that holds GPUs of both products.
#[test]
fn product_rules_sharing_differently_are_refused_only_where_they_meet() {
    let run = |args: &[&str]| {
        std::process::Command::new(gpu_share_bin())
            .args(args)
            .current_dir(repo())
            .output()
            .unwrap()
    };
    let out = run(&["validate", "profiles/homelab-mixed.yaml"]);
    assert!(out.status.success(), "{}", text(&out));
    let said = text(&out);
    assert!(
        said.contains("a node with GPUs of both products is refused at plan"),
        "{said}"
    );
    for gpu in ["NVIDIA GeForce RTX 3090", "NVIDIA Jetson AGX Orin"] {
        let out = run(&[
            "plan",
            "--profile",
            "profiles/homelab-mixed.yaml",
            "--gpu",
            gpu,
        ]);
        assert!(out.status.success(), "{gpu}: {}", text(&out));
    }
    let out = run(&[
        "plan",
        "--profile",
        "profiles/homelab-mixed.yaml",
        "--gpu",
        "NVIDIA GeForce RTX 3090",
        "--gpu",
        "NVIDIA Jetson AGX Orin",
    ]);
    assert!(!out.status.success());
    let said = text(&out);
    assert!(
        said.contains("time-sliced × 4") && said.contains("time-sliced × 2"),
        "{said}"
    );
}
