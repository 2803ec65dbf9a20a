//! deploy/overlays/dra and deploy/examples/dra: the agent in DRA mode, its
//! DeviceClasses, RBAC and ResourceSlice admission policy, and the example claims.
//!
//! The DeviceClass and claim selectors are evaluated with cel-interpreter on the devices
//! `gpu-share plan --plugin dra` publishes (src/dra), built into the `device` object the DRA
//! scheduler gives a selector: `driver`, and `attributes` / `capacity` grouped by domain, where
//! a name without a domain is in the driver's (the API reference of CELDeviceSelector,
//! resource.k8s.io/v1). Capacities are given as quantity strings: the selectors here do not use
//! them (cel-interpreter has no Kubernetes quantity library).

use super::*;
use gpu_share::dra::DRIVER;
use k8s_openapi::api::resource::v1beta2;

/// The DeviceClass each way of sharing is published under.
const CLASSES: [(&str, &str); 4] = [
    ("exclusive", "gpu.gpu-share.dev"),
    ("mig", "mig.gpu-share.dev"),
    ("timeSlicing", "timeslice.gpu-share.dev"),
    ("mps", "mps.gpu-share.dev"),
];

fn examples() -> PathBuf {
    deploy().join("examples/dra")
}

/// Every YAML file under deploy/examples (read by the tests below).
pub(super) fn example_files() -> Vec<PathBuf> {
    let mut files = Vec::new();
    yaml_files(&deploy().join("examples"), &mut files);
    files
}

/// A resource.k8s.io/v1 DeviceClass or ResourceClaimTemplate, checked field by field against
/// k8s-openapi's v1beta2 type: the workspace's `v1_33` feature has no v1 types, and v1 is
/// v1beta2 promoted with the same fields for what these manifests use (DeviceClassSpec
/// selectors; ResourceClaimSpec devices.requests[].exactly with deviceClassName, selectors,
/// count, allocationMode).
pub(super) fn round_trip_v1(doc: &Value, what: &str) {
    assert_eq!(
        doc["apiVersion"], "resource.k8s.io/v1",
        "{what}: DRA objects use the GA API"
    );
    let mut beta = doc.clone();
    beta["apiVersion"] = json!("resource.k8s.io/v1beta2");
    if let Some(spec) = beta["spec"].as_object_mut() {
        if let Some(name) = spec.remove("extendedResourceName") {
            let name = name.as_str().unwrap_or_default();
            assert!(
                is_extended_resource_name(name),
                "{what}: extendedResourceName {name:?} is not an extended resource name"
            );
        }
    }
    match doc["kind"].as_str().unwrap() {
        "DeviceClass" => round_trip::<v1beta2::DeviceClass>(&beta, what),
        "ResourceClaimTemplate" => round_trip::<v1beta2::ResourceClaimTemplate>(&beta, what),
        other => panic!("{what}: {other} is not a DRA kind this test knows"),
    }
}

/// What the API server accepts as a DeviceClass's `extendedResourceName` (validateDeviceClass in
/// kubernetes pkg/apis/resource/validation/validation.go calls `IsExtendedResourceName`,
/// pkg/apis/core/v1/helper/helpers.go): not a native resource (one without a `/`, or within
/// `kubernetes.io/`), not `requests.`-prefixed, and `requests.<name>` a qualified name (the
/// double's rule, which its taint keys use too).
fn is_extended_resource_name(name: &str) -> bool {
    let native = !name.contains('/') || name.contains("kubernetes.io/");
    !native
        && !name.starts_with("requests.")
        && kube_double::is_qualified_name(&format!("requests.{name}"))
}

/// In DRA mode the agent is the kubelet's DRA plugin: its registration directory, its own
/// plugin directory and the CDI spec directory are the host's, at the host's paths (the kubelet
/// dials the socket path the registration names; containerd reads CDI specs there), writable;
/// and no device-plugin directory, since no device plugin may serve the same GPUs.
pub(super) fn check_kubelet_plugin_mounts(
    pod: &PodSpec,
    agent: &Container,
    what: &dyn Fn(&str) -> String,
) {
    for dir in [
        "/var/lib/kubelet/plugins_registry".to_string(),
        format!("/var/lib/kubelet/plugins/{DRIVER}"),
        "/var/run/cdi".to_string(),
    ] {
        assert_eq!(
            host_path(pod, agent, &dir),
            Some((PathBuf::from(&dir), false)),
            "{}",
            what(&format!("{dir} mounted writable at its host path"))
        );
    }
    assert!(
        host_path(pod, agent, "/var/lib/kubelet/device-plugins/kubelet.sock").is_none(),
        "{}",
        what("no device-plugin directory in DRA mode")
    );
    assert!(env_value(agent, "GPU_SHARE_DEVICE_PLUGIN_DIR").is_none());
}

/// One published device, as a selector sees it, with the class its GPU's planned mode puts it
/// in (from the plan, not from the device's own attributes).
struct Published {
    name: String,
    cel: Cel,
    expected_class: &'static str,
    /// The `migProfile` attribute: a MIG device, or a share of one.
    mig_profile: Option<String>,
}

fn class_of(sharing: &str) -> &'static str {
    CLASSES
        .iter()
        .find(|(s, _)| *s == sharing)
        .unwrap_or_else(|| panic!("no class for sharing {sharing}"))
        .1
}

/// The class `device` of a GPU planned as `mode` belongs in (`plan -o json`'s `mode`): a
/// dynamic-MIG GPU publishes MIG devices and itself whole.
fn expected_class(mode: &Value, device: &Value) -> &'static str {
    let shared = mode["replicas"].as_u64().unwrap_or(1) > 1;
    let is_mig = device["attributes"].get("migProfile").is_some();
    class_of(match mode["type"].as_str().unwrap() {
        "dynamicMig" if is_mig => "mig",
        "dynamicMig" => "exclusive",
        "mig" if shared && mode["mps"].is_object() => "mps",
        "mig" if shared => "timeSlicing",
        other => other,
    })
}

/// A device of a slice as the `device` variable of a DRA CEL selector.
fn device_cel(driver: &str, device: &Value) -> Cel {
    let attributes: HashMap<String, Cel> = device["attributes"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| {
            let value = match (&v["string"], &v["int"], &v["bool"]) {
                (Value::String(s), _, _) => Cel::String(Arc::new(s.clone())),
                (_, Value::Number(n), _) => Cel::Int(n.as_i64().unwrap()),
                (_, _, Value::Bool(b)) => Cel::Bool(*b),
                _ => panic!("attribute {k}: {v}"),
            };
            (k.clone(), value)
        })
        .collect();
    let capacity: HashMap<String, Cel> = device["capacity"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| {
            let q = v["value"].as_str().unwrap().to_string();
            (k.clone(), Cel::String(Arc::new(q)))
        })
        .collect();
    let mut d: HashMap<String, Cel> = HashMap::new();
    d.insert("driver".into(), Cel::String(Arc::new(driver.to_string())));
    d.insert(
        "attributes".into(),
        HashMap::from([(driver.to_string(), Cel::from(attributes))]).into(),
    );
    d.insert(
        "capacity".into(),
        HashMap::from([(driver.to_string(), Cel::from(capacity))]).into(),
    );
    d.into()
}

/// What `gpu-share plan --plugin dra` publishes for `profile` on `gpus`, as node `gpu-1`.
fn published(profile: &str, gpus: &str) -> (Vec<Value>, Vec<Published>) {
    let out = Command::new(env!("CARGO_BIN_EXE_gpu-share"))
        .args([
            "plan",
            "--plugin",
            "dra",
            "--node-name",
            "gpu-1",
            "-o",
            "json",
        ])
        .args(["--profile", profile, "--gpu", gpus])
        .current_dir(root())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", node_sim::text(&out));
    let plan: Value = serde_json::from_slice(&out.stdout).unwrap();
    let modes: HashMap<u64, Value> = plan["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| (g["index"].as_u64().unwrap(), g["mode"].clone()))
        .collect();
    let slices = plan["resourceSlices"].as_array().unwrap().clone();
    let mut devices = Vec::new();
    for s in &slices {
        let driver = s["spec"]["driver"].as_str().unwrap();
        for d in s["spec"]["devices"].as_array().into_iter().flatten() {
            let parent = d["attributes"]["parentIndex"]["int"].as_u64().unwrap();
            devices.push(Published {
                name: d["name"].as_str().unwrap().to_string(),
                cel: device_cel(driver, d),
                expected_class: expected_class(&modes[&parent], d),
                mig_profile: d["attributes"]["migProfile"]["string"]
                    .as_str()
                    .map(str::to_string),
            });
        }
    }
    (slices, devices)
}

/// The first device the first mixed profile publishes, as another driver's.
fn foreign_device() -> Published {
    let (slices, _) = published(MIXED[0].0, MIXED[0].1);
    Published {
        name: "foreign".into(),
        cel: device_cel("gpu.nvidia.com", &slices[0]["spec"]["devices"][0]),
        expected_class: "",
        mig_profile: None,
    }
}

/// A DRA CEL selector: it compiles and uses no variable but `device`.
fn selector(source: &str, what: &str) -> Program {
    let program = Program::compile(source)
        .unwrap_or_else(|e| panic!("{what}: CEL does not compile: {e}\n{source}"));
    for v in program.references().variables() {
        assert!(
            v == "device" || v.starts_with('@'),
            "{what}: a DRA selector sees only `device`, not {v}\n{source}"
        );
    }
    program
}

/// Whether every selector selects `device` (a selector that errors fails allocation).
fn selects(programs: &[(String, Program)], device: &Published) -> bool {
    programs.iter().all(|(source, p)| {
        let mut ctx = Context::default();
        ctx.add_variable_from_value("device", device.cel.clone());
        match p.execute(&ctx) {
            Ok(Cel::Bool(b)) => b,
            other => panic!("{source} on device {}: {other:?}", device.name),
        }
    })
}

/// The extended resource a DeviceClass serves (`spec.extendedResourceName`, resource.k8s.io/v1
/// from 1.34; the v1_33 types of k8s-openapi this crate builds with do not have the field).
fn extended_resource_of(class: &Value) -> Option<&str> {
    class["spec"]["extendedResourceName"].as_str()
}

/// The DeviceClasses claims name by sharing mode (deploy/overlays/dra/device-classes.yaml).
fn sharing_classes(objects: &[Value]) -> BTreeMap<String, Vec<(String, Program)>> {
    class_selectors(objects, |c| extended_resource_of(c).is_none())
}

/// The DeviceClasses that serve classic extended-resource limits
/// (deploy/overlays/dra/extended-resource-classes.yaml), by the resource each serves.
fn extended_classes(objects: &[Value]) -> BTreeMap<String, Vec<(String, Program)>> {
    let resources: BTreeMap<String, String> = objects
        .iter()
        .filter(|o| o["kind"] == "DeviceClass")
        .filter_map(|o| {
            let name = o["metadata"]["name"].as_str()?.to_string();
            Some((name, extended_resource_of(o)?.to_string()))
        })
        .collect();
    let by_class = class_selectors(objects, |c| extended_resource_of(c).is_some());
    assert_eq!(
        by_class.len(),
        resources.values().collect::<BTreeSet<_>>().len(),
        "one DeviceClass per extended resource: {resources:?}"
    );
    by_class
        .into_iter()
        .map(|(class, selectors)| (resources[&class].clone(), selectors))
        .collect()
}

fn class_selectors(
    objects: &[Value],
    which: impl Fn(&Value) -> bool,
) -> BTreeMap<String, Vec<(String, Program)>> {
    all::<v1beta2::DeviceClass>(
        &objects
            .iter()
            .filter(|o| o["kind"] == "DeviceClass" && which(o))
            .map(|o| {
                let mut o = o.clone();
                o["apiVersion"] = json!("resource.k8s.io/v1beta2");
                o
            })
            .collect::<Vec<_>>(),
        "DeviceClass",
    )
    .into_iter()
    .map(|c| {
        let name = c.metadata.name.unwrap();
        let sources: Vec<(String, Program)> = c
            .spec
            .selectors
            .into_iter()
            .flatten()
            .map(|s| {
                let source = s.cel.unwrap().expression;
                let p = selector(&source, &format!("DeviceClass {name}"));
                (source, p)
            })
            .collect();
        (name, sources)
    })
    .collect()
}

/// Profiles with every way of sharing between them, dynamic MIG included, on the nodes they
/// are written for.
const MIXED: [(&str, &str); 4] = [
    ("profiles/builtin/h100-mixed-sharing.yaml", "h100x8"),
    ("profiles/builtin/h100-mps-in-mig.yaml", "h100x8"),
    ("profiles/h200-mig-timeslice.yaml", "h200x8"),
    ("profiles/dra/h200-dynamic-mig.yaml", "h200x8"),
];

#[test]
fn each_published_device_is_in_exactly_the_device_class_of_its_sharing_mode() {
    let objects = render(&deploy().join("overlays/dra")).objects;
    let classes = sharing_classes(&objects);
    assert_eq!(
        classes.keys().map(String::as_str).collect::<BTreeSet<_>>(),
        CLASSES.iter().map(|(_, c)| *c).collect(),
        "one DeviceClass per sharing mode"
    );
    for (name, selectors) in &classes {
        assert!(!selectors.is_empty(), "{name}: selects by something");
        assert!(
            selectors[0]
                .0
                .contains(&format!("device.driver == \"{DRIVER}\"")),
            "{name}: only gpu-share's devices"
        );
    }
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for (profile, gpus) in MIXED {
        let (_, devices) = published(profile, gpus);
        assert!(!devices.is_empty());
        for d in &devices {
            let chosen: Vec<&String> = classes
                .iter()
                .filter(|(_, s)| selects(s, d))
                .map(|(n, _)| n)
                .collect();
            assert_eq!(
                chosen,
                [d.expected_class],
                "{profile} on {gpus}: device {} is selected by {chosen:?}",
                d.name
            );
            *seen.entry(d.expected_class).or_default() += 1;
        }
    }
    // The profiles reach every class, so each selector has met devices it must take.
    assert_eq!(seen.len(), CLASSES.len(), "{seen:?}");
    // Another driver's device with the same attributes is nobody's.
    assert!(classes.values().all(|s| !selects(s, &foreign_device())));
}

/// The extended resource a device plugin advertises for `device` under the `mixed` MIG
/// strategy, shared or not (src/plan: `nvidia.com/gpu`, or `nvidia.com/mig-<profile>`), and so
/// the classic limit a pod asks it by.
fn classic_resource(device: &Published) -> String {
    match &device.mig_profile {
        Some(profile) => gpu_share::mig::catalog::resource_name(profile),
        None => gpu_share::sharing::GPU_RESOURCE.to_string(),
    }
}

/// deploy/overlays/dra/extended-resource-classes.yaml as it must read: `nvidia.com/gpu` for
/// every device outside MIG, and `nvidia.com/mig-<profile>` for each MIG profile of the catalog,
/// shares of MIG devices included (a device plugin advertises them under the same name).
fn extended_resource_classes_yaml() -> String {
    let profiles: BTreeSet<&str> = gpu_share::mig::catalog::catalog()
        .models
        .iter()
        .flat_map(|m| m.gpu_instance_profiles.iter().map(|p| p.name.as_str()))
        .collect();
    let mut out = String::from(EXTENDED_CLASSES_HEAD);
    out += &extended_class(
        "nvidia-gpu.gpu-share.dev",
        gpu_share::sharing::GPU_RESOURCE,
        "A whole GPU or a share of one (time-sliced or MPS), not MIG: what `nvidia.com/gpu` is\n    # on a device-plugin node.",
        &format!("!(\"migProfile\" in device.attributes[\"{DRIVER}\"])"),
    );
    for p in profiles {
        let resource = gpu_share::mig::catalog::resource_name(p);
        let class = format!(
            "{}.gpu-share.dev",
            resource.trim_start_matches("nvidia.com/")
        );
        out += &extended_class(
            &class,
            &resource,
            &format!("A {p} MIG device, or a share of one."),
            &format!(
                "\"migProfile\" in device.attributes[\"{DRIVER}\"] &&\n          device.attributes[\"{DRIVER}\"].migProfile == \"{p}\""
            ),
        );
    }
    out
}

const EXTENDED_CLASSES_HEAD: &str = "\
# DeviceClasses that serve a pod's classic limits (`nvidia.com/gpu: 1`, `nvidia.com/mig-1g.10gb:
# 1`) from gpu-share's DRA devices, unchanged pod specs on a `--plugin dra` node (Kubernetes
# 1.34+ `DRAExtendedResource`: beta and on by default in 1.36; docs/dra.md \"Classic pods on
# DRA\"). The scheduler serves such a limit from DRA only on a node whose allocatable does not
# list the resource, so on device-plugin nodes the same spec keeps using the device plugin.
#
# One class per resource: `nvidia.com/gpu` takes every device outside MIG (a whole GPU, or a
# time-sliced or MPS share when the profile shares the GPU), `nvidia.com/mig-<profile>` every
# device of that MIG profile (shared or not), as a device plugin advertises them under the
# `mixed` strategy. `<name>.shared` (a profile's `renameByDefault`) is not mapped: it exists to
# make pods opt in to sharing, and a DRA claim says what it wants with a class instead.
#
# Generated from the MIG catalog (data/mig-catalog.yaml): tests/deploy/dra.rs checks it and
# `UPDATE_GOLDEN=1 cargo test --test deploy extended_resource` writes it again.
";

fn extended_class(name: &str, resource: &str, what: &str, selects: &str) -> String {
    format!(
        "---
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata:
  name: {name}
  labels:
    app.kubernetes.io/name: gpu-share
spec:
  extendedResourceName: {resource}
  selectors:
    # {what}
    - cel:
        expression: |-
          device.driver == \"{DRIVER}\" &&
          {selects}
"
    )
}

#[test]
fn the_extended_resource_classes_are_generated_from_the_catalog() {
    let path = deploy().join("overlays/dra/extended-resource-classes.yaml");
    let want = extended_resource_classes_yaml();
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, &want).unwrap();
    }
    let have = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (UPDATE_GOLDEN=1 writes it)", path.display()));
    assert!(
        have == want,
        "{} is not what the catalog gives (UPDATE_GOLDEN=1 cargo test --test deploy \
         extended_resource writes it; review the diff)",
        path.display()
    );
}

/// Each device the mixed profiles publish is served to a classic limit by exactly one class,
/// the one of the resource a device plugin would advertise it as; no other driver's device is.
#[test]
fn each_published_device_serves_the_classic_limit_a_device_plugin_advertises_it_as() {
    let objects = render(&deploy().join("overlays/dra")).objects;
    let classes = extended_classes(&objects);
    assert!(classes.contains_key(gpu_share::sharing::GPU_RESOURCE));
    for profile in gpu_share::mig::catalog::catalog()
        .models
        .iter()
        .flat_map(|m| &m.gpu_instance_profiles)
    {
        assert!(
            classes.contains_key(&profile.resource_name()),
            "no class serves {}",
            profile.resource_name()
        );
    }
    let mut seen = BTreeSet::new();
    for (profile, gpus) in MIXED {
        for d in published(profile, gpus).1 {
            let serving: Vec<&String> = classes
                .iter()
                .filter(|(_, s)| selects(s, &d))
                .map(|(r, _)| r)
                .collect();
            let want = classic_resource(&d);
            assert_eq!(
                serving,
                [&want],
                "{profile} on {gpus}: device {} serves {serving:?}",
                d.name
            );
            seen.insert(format!("{want} ({})", d.expected_class));
        }
    }
    // Whole GPUs, time-sliced and MPS shares of GPUs and of MIG devices, and MIG devices were
    // all among them.
    for kind in [
        "nvidia.com/gpu (gpu.gpu-share.dev)",
        "nvidia.com/gpu (timeslice.gpu-share.dev)",
        "nvidia.com/gpu (mps.gpu-share.dev)",
        "nvidia.com/mig-1g.10gb (mig.gpu-share.dev)",
        "nvidia.com/mig-3g.40gb (mps.gpu-share.dev)",
    ] {
        assert!(seen.contains(kind), "{kind} not met: {seen:?}");
    }
    // Another driver's device with the same attributes is nobody's.
    assert!(classes.values().all(|s| !selects(s, &foreign_device())));
}

/// Each case was put to the real kube-apiserver 1.36.2 of ../shared/testbed as a DeviceClass
/// (`kubectl apply --dry-run=server`): the accepted ones were created, the refused ones answered
/// `spec.extendedResourceName: Invalid value: …: must be a valid extended resource name`.
#[test]
fn extended_resource_names_are_checked_as_the_api_server_does() {
    for ok in [
        "nvidia.com/gpu",
        "nvidia.com/mig-1g.10gb",
        "nvidia.com/mig-1g.24gb.me.all",
        "example.com/a_b",
    ] {
        assert!(is_extended_resource_name(ok), "{ok}");
    }
    for refused in [
        "gpu",                       // no prefix: a native resource name
        "kubernetes.io/gpu",         // the kubernetes.io domain is native
        "node.kubernetes.io/gpu",    // and so are its subdomains
        "requests.nvidia.com/gpu",   // the quota prefix
        "nvidia.com/mig-1g.10gb+me", // `+` is not a name character
        "nvidia.com/-gpu",           // names start alphanumeric
        "Nvidia.com/gpu",            // the prefix is a lowercase DNS subdomain
    ] {
        assert!(!is_extended_resource_name(refused), "{refused}");
    }
}

fn claim_templates() -> Vec<Value> {
    yaml_docs(&examples().join("resource-claim-templates.yaml"))
}

/// Each example claim's selectors, within its class, choose the devices its comment promises on
/// profiles/builtin/h100-mixed-sharing.yaml (GPUs 0-1: 7 × 1g.10gb each, 2-3: 4 time-sliced
/// shares each, 4-5: 8 MPS shares at 25 % each, 6-7: whole) and h100-mps-in-mig.yaml (MPS shares
/// of 3g.40gb devices at 50 %) and profiles/dra/h200-dynamic-mig.yaml on 8 H200s (GPUs 0-5
/// dynamic, 6-7 time-sliced), and the example pod uses one of them.
#[test]
fn the_example_claims_select_the_devices_they_describe() {
    let objects = render(&deploy().join("overlays/dra")).objects;
    let classes = sharing_classes(&objects);
    let count_on = |template: &str, profile: &str, gpus: &str| -> usize {
        let t = claim_templates()
            .into_iter()
            .find(|t| t["metadata"]["name"] == template)
            .unwrap_or_else(|| panic!("no template {template}"));
        let requests = t["spec"]["spec"]["devices"]["requests"].as_array().unwrap();
        assert_eq!(requests.len(), 1, "{template}");
        let exactly = &requests[0]["exactly"];
        let class = exactly["deviceClassName"].as_str().unwrap();
        let mut programs: Vec<(String, Program)> = classes
            .get(class)
            .unwrap_or_else(|| panic!("{template}: no DeviceClass {class}"))
            .iter()
            .map(|(s, _)| (s.clone(), selector(s, class)))
            .collect();
        for s in exactly["selectors"].as_array().into_iter().flatten() {
            let source = s["cel"]["expression"].as_str().unwrap();
            programs.push((source.to_string(), selector(source, template)));
        }
        let (_, devices) = published(profile, gpus);
        devices.iter().filter(|d| selects(&programs, d)).count()
    };
    let count = |template: &str, profile: &str| count_on(template, profile, "h100x8");
    let mixed = MIXED[0].0;
    let mps_in_mig = MIXED[1].0;
    assert_eq!(count("whole-gpu", mixed), 2);
    assert_eq!(count("mig-1g-10gb", mixed), 14);
    assert_eq!(
        count("mig-1g-10gb", mps_in_mig),
        0,
        "its MIG devices are MPS-shared"
    );
    assert_eq!(count("h100-time-slice", mixed), 8);
    assert_eq!(count("mps-quarter", mixed), 16);
    assert_eq!(
        count("mps-quarter", mps_in_mig),
        64,
        "8 GPUs × 2 × 3g.40gb × 4 shares"
    );
    let dynamic = MIXED[3].0;
    assert_eq!(
        count_on("dynamic-mig-3g", dynamic, "h200x8"),
        12,
        "6 dynamic H200s × the two 3g.71gb placements (0 and 4)"
    );
    assert_eq!(
        count("dynamic-mig-3g", mixed),
        0,
        "static MIG devices are not dynamic"
    );
    assert_eq!(
        count_on("whole-gpu", dynamic, "h200x8"),
        6,
        "a dynamic GPU is also published whole; the time-sliced ones are not"
    );
    assert_eq!(
        count_on("mig-1g-10gb", dynamic, "h200x8"),
        0,
        "no 1g.10gb on an H200"
    );

    // The pod's claim comes from an example template, and its container uses it.
    let pod: Pod =
        serde_json::from_value(yaml_docs(&examples().join("pod.yaml")).remove(0)).unwrap();
    let spec = pod.spec.unwrap();
    let claims = spec.resource_claims.unwrap();
    let template = claims[0].resource_claim_template_name.clone().unwrap();
    assert!(claim_templates()
        .iter()
        .any(|t| t["metadata"]["name"] == template.as_str()));
    let used = spec.containers[0]
        .resources
        .as_ref()
        .unwrap()
        .claims
        .clone()
        .unwrap();
    assert_eq!(used[0].name, claims[0].name);
    assert_eq!(spec.runtime_class_name.as_deref(), Some("nvidia"));
    for f in example_files() {
        for d in yaml_docs(&f) {
            typed_check(&d, &f.display().to_string());
        }
    }
}

/// The dra overlay: the agent in DRA mode and no device plugin of any kind.
#[test]
fn the_dra_overlay_runs_the_agent_as_dra_plugin_and_no_device_plugin() {
    let objects = render(&deploy().join("overlays/dra")).objects;
    let (_, pod) = pod_spec(&objects);
    let agent = container(&pod, "agent");
    assert_eq!(env_value(agent, "GPU_SHARE_PLUGIN").as_deref(), Some("dra"));
    assert!(
        try_container(&pod, "device-plugin").is_none(),
        "no NVIDIA device plugin beside DRA"
    );
    assert!(try_container(&pod, "plugin-config-bootstrap").is_none());
    assert!(env_value(agent, "GPU_SHARE_PLUGIN_CONFIG").is_none());
    check_kubelet_plugin_mounts(&pod, agent, &|s| format!("overlay dra: {s}"));
    // Only this overlay has DRA objects.
    for overlay in overlays() {
        let objects = render(&deploy().join("overlays").join(&overlay)).objects;
        let dra_objects = objects
            .iter()
            .filter(|o| {
                o["apiVersion"]
                    .as_str()
                    .unwrap()
                    .starts_with("resource.k8s.io")
            })
            .count();
        assert_eq!(dra_objects > 0, overlay == "dra", "{overlay}");
    }
}

/// RBAC for DRA: exactly the verbs the agent's slice publishing and kubelet plugin use (read
/// from their branches; a run of the agent in DRA mode against the API double should replace
/// this list once both are merged), on top of base/rbac.yaml, and nothing of DRA in the other
/// overlays.
#[test]
fn dra_rbac_grants_slice_publishing_and_claim_reads_only() {
    use kube_double::Verb::*;
    let objects = render(&deploy().join("overlays/dra")).objects;
    let grants = grants(&objects, "gpu-share", "gpu-share");
    let allowed = |verb, resource: &str| {
        let r = request(verb, "resource.k8s.io", resource, None);
        grants.iter().any(|g| allows(g, &r))
    };
    // What the agent's publisher does (branch h5: list by field selector, create, replace,
    // delete) and its kubelet plugin (branch h6: GET each claim it prepares).
    for verb in [Create, Update, Delete, List] {
        assert!(allowed(verb, "resourceslices"), "resourceslices {verb:?}");
    }
    for verb in [Get, Watch, Patch, DeleteCollection] {
        assert!(!allowed(verb, "resourceslices"), "resourceslices {verb:?}");
    }
    assert!(allowed(Get, "resourceclaims"));
    for verb in [List, Watch, Create, Update, Patch, Delete] {
        assert!(!allowed(verb, "resourceclaims"), "resourceclaims {verb:?}");
    }
    for resource in [
        "resourceclaims/status",
        "deviceclasses",
        "resourceclaimtemplates",
    ] {
        assert!(
            !allowed(Create, resource) && !allowed(Update, resource),
            "{resource}"
        );
    }
    let standalone = render(&deploy().join("overlays/standalone")).objects;
    assert!(super::grants(&standalone, "gpu-share", "gpu-share")
        .iter()
        .all(|g| !g
            .rule
            .api_groups
            .iter()
            .flatten()
            .any(|x| x == "resource.k8s.io")));
}

#[test]
fn the_resourceslice_policy_lets_the_agent_write_only_its_own_nodes_slices() {
    let objects = render(&deploy().join("overlays/dra")).objects;
    let (vap, policy) = autopilot::bound_policy(&objects, "gpu-share-agent-resourceslices");
    let ops = ["CREATE", "UPDATE", "DELETE"].map(String::from).to_vec();
    assert_eq!(
        autopilot::matched(&vap),
        [(
            "resource.k8s.io".to_string(),
            "resourceslices".to_string(),
            ops
        )]
    );
    // The agent's user, as the Node policy names it.
    let (_, user) = policy_from(&objects);
    let as_agent = |op: &str, node: Option<&str>| autopilot::user_request(&user, op, node);
    let (slices, _) = published(MIXED[0].0, MIXED[0].1);
    let mine = slices[0].clone();
    let mut next = mine.clone();
    next["spec"]["pool"]["generation"] = json!(2);
    let check = |what: &str, request: &Value, old: &Value, new: &Value, want: &str| {
        autopilot::expect(what, &policy, request, old, new, want)
    };
    let null = Value::Null;
    let me = |op| as_agent(op, Some("gpu-1"));
    check("create its slice", &me("CREATE"), &null, &mine, "allow");
    check("bump its generation", &me("UPDATE"), &mine, &next, "allow");
    check("delete its slice", &me("DELETE"), &mine, &null, "allow");

    let edit = |f: &dyn Fn(&mut Value)| {
        let mut s = mine.clone();
        f(&mut s);
        s
    };
    let elsewhere = edit(&|s| s["spec"]["nodeName"] = json!("gpu-2"));
    let other_pool = edit(&|s| s["spec"]["pool"]["name"] = json!("gpu-2"));
    let other_driver = edit(&|s| s["spec"]["driver"] = json!("gpu.nvidia.com"));
    let all_nodes = edit(&|s| {
        let spec = s["spec"].as_object_mut().unwrap();
        spec.remove("nodeName");
        spec.insert("allNodes".into(), json!(true));
    });
    let theirs = edit(&|s| {
        s["spec"]["nodeName"] = json!("gpu-2");
        s["spec"]["pool"]["name"] = json!("gpu-2");
        s["metadata"]["name"] = json!("gpu-2-gpu-share-0");
    });
    let denied =
        "deny: only ResourceSlices of driver gpu.gpu-share.dev on the node its pod runs on (gpu-1)";
    check(
        "a slice on another node",
        &me("CREATE"),
        &null,
        &elsewhere,
        denied,
    );
    check(
        "another node's pool",
        &me("CREATE"),
        &null,
        &other_pool,
        denied,
    );
    check(
        "another driver's slice",
        &me("CREATE"),
        &null,
        &other_driver,
        denied,
    );
    check(
        "a slice for all nodes",
        &me("CREATE"),
        &null,
        &all_nodes,
        denied,
    );
    check(
        "moving its slice away",
        &me("UPDATE"),
        &mine,
        &elsewhere,
        denied,
    );
    check(
        "taking another node's slice",
        &me("UPDATE"),
        &theirs,
        &mine,
        denied,
    );
    check(
        "deleting another node's slice",
        &me("DELETE"),
        &theirs,
        &null,
        "deny: not gpu-2-gpu-share-0",
    );
    check(
        "another node's agent",
        &as_agent("CREATE", Some("gpu-2")),
        &null,
        &mine,
        "deny: on the node its pod runs on (gpu-2)",
    );
    check(
        "a token bound to no node",
        &as_agent("CREATE", None),
        &null,
        &mine,
        "deny: its token names no node",
    );
    check(
        "the scheduler or an administrator",
        &autopilot::user_request("kubernetes-admin", "DELETE", None),
        &theirs,
        &null,
        "not matched",
    );
}

/// The node's ResourceSlices as the API holds them, read with the kube client (untyped: the
/// workspace's k8s-openapi has no v1 types).
fn slices_at(api: &KubeDouble) -> Vec<Value> {
    use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let gvk = GroupVersionKind::gvk("resource.k8s.io", "v1", "ResourceSlice");
    let resource = ApiResource::from_gvk_with_plural(&gvk, "resourceslices");
    rt.block_on(async {
        let slices: Api<DynamicObject> = Api::all_with(api.client(), &resource);
        let list = slices.list(&ListParams::default()).await.unwrap();
        list.items
            .into_iter()
            .map(|o| serde_json::to_value(o).unwrap())
            .collect()
    })
}

/// The agent in DRA mode, run as the dra overlay's DaemonSet configures it (its args and env;
/// the DRA socket and CDI directories, left to the agent's defaults there, moved into the
/// fixture), on the simulated node, through profile changes that create, replace and delete
/// slices: every request it made is granted by the overlay's RBAC, every grant was used (the
/// claim `get` of the kubelet plugin needs a simulated kubelet preparing a claim, not run here),
/// and the slices it published pass the ResourceSlice policy for its node.
#[test]
fn the_agent_in_dra_mode_uses_only_its_grants_and_its_slices_pass_the_policy() {
    const NEEDED_OUTSIDE_THIS_RUN: &[(&str, &str, &str, &str)] = &[(
        "resource.k8s.io",
        "resourceclaims",
        "get",
        "the kubelet plugin reads each claim the kubelet asks it to prepare",
    )];
    let objects = render(&deploy().join("overlays/dra")).objects;
    let (ds, pod) = pod_spec(&objects);
    let namespace = ds.metadata.namespace.clone().unwrap();
    let agent = container(&pod, "agent");
    let cm_name = env_value(agent, "GPU_SHARE_CONFIGMAP").unwrap();
    let api = Arc::new(KubeDouble::start());
    api.put_configmap(one(&objects, "ConfigMap", &cm_name));
    // More shares than one slice holds (128 devices): a pool of two slices, which the next
    // profile shrinks to one (a delete).
    let many = "version: v1\nrules:\n  - devices: all\n    timeSlicing: {replicas: 100}\n";
    api.update_configmap_key(&namespace, &cm_name, "many-shares", Some(many));
    let node = "gpu-1";
    // Unlabelled and without gpu-share state; other owners' labels and a taint.
    let mut fixture = node_fixture(node);
    for l in [PROFILE_LABEL, STATE_LABEL] {
        fixture["metadata"]["labels"]
            .as_object_mut()
            .unwrap()
            .remove(l);
    }
    fixture["metadata"]["annotations"]
        .as_object_mut()
        .unwrap()
        .remove(REASON);
    api.put_node(serde_json::from_value(fixture).unwrap());
    let mut sim = AgentNode::for_node(
        &api,
        node,
        vec![
            Gpu::mig("h100").mig_enabled(),
            Gpu::mig("h100").mig_enabled(),
        ],
    );
    let defaults = [
        (
            "GPU_SHARE_DRA_REGISTRATION_DIR",
            sim.path("plugins_registry"),
        ),
        (
            "GPU_SHARE_DRA_PLUGIN_DIR",
            sim.path(&format!("plugins/{DRIVER}")),
        ),
        ("GPU_SHARE_CDI_ROOT", sim.path("cdi")),
    ];
    for (_, dir) in &defaults {
        std::fs::create_dir_all(dir).unwrap();
    }
    api.clear_requests();
    start_agent_with(&pod, &mut sim, &namespace, &defaults);
    let slice_writes = |a: &KubeDouble, verb: &str| {
        a.requests()
            .iter()
            .filter(|r| r.resource == "resourceslices" && verb_name(r) == verb)
            .count()
    };
    api.set_node_label(node, PROFILE_LABEL, Some("h100-balanced"));
    wait_applied(&api, &sim, "h100-balanced", Duration::from_secs(40));
    api.set_node_label(node, PROFILE_LABEL, Some("many-shares"));
    node_sim::wait_applied_text(&api, &sim, many, Duration::from_secs(40), "many-shares");
    let two = slices_at(&api);
    assert_eq!(two.len(), 2, "{}", sim.log());
    api.set_node_label(node, PROFILE_LABEL, Some("exclusive"));
    wait_applied(&api, &sim, "exclusive", Duration::from_secs(40));
    for verb in ["create", "update", "delete"] {
        assert!(
            slice_writes(&api, verb) > 0,
            "no slice {verb}:\n{}",
            sim.log()
        );
    }
    std::thread::sleep(Duration::from_millis(500));
    let requests = api.requests();
    let last = slices_at(&api);
    drop(sim);

    // 1. Every request is granted; 2. every grant was used.
    let grants = grants(&objects, &namespace, "gpu-share");
    let (refused, mut unused) = rbac_misfits(&grants, &requests, NEEDED_OUTSIDE_THIS_RUN);
    assert!(
        refused.is_empty(),
        "RBAC refuses requests the agent makes in DRA mode:\n{}",
        refused.join("\n")
    );
    // The base grants that only a drain uses (evictions) are the standalone test's; here only
    // DRA's own grants must all be used.
    unused.retain(|u| u.contains("resource.k8s.io"));
    assert!(
        unused.is_empty(),
        "granted but never used in DRA mode:\n{}",
        unused.join("\n")
    );

    // 3. Its slices, as published, pass the policy for its node, and not for another node.
    let (_, policy) = autopilot::bound_policy(&objects, "gpu-share-agent-resourceslices");
    let (_, user) = policy_from(&objects);
    let clean = |v: &Value| {
        let mut v = v.clone();
        let meta = v["metadata"].as_object_mut().unwrap();
        for k in [
            "resourceVersion",
            "managedFields",
            "generation",
            "uid",
            "creationTimestamp",
        ] {
            meta.remove(k);
        }
        v
    };
    let mine = autopilot::user_request(&user, "CREATE", Some(node));
    let other = autopilot::user_request(&user, "CREATE", Some("gpu-2"));
    for s in two.iter().chain(&last) {
        let s = clean(s);
        autopilot::expect(
            "a slice it published",
            &policy,
            &mine,
            &Value::Null,
            &s,
            "allow",
        );
        autopilot::expect(
            "its slice, by another node's agent",
            &policy,
            &other,
            &Value::Null,
            &s,
            "deny: (gpu-2)",
        );
    }
}
