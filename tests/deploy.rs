//! The deployment manifests (`deploy/`) against the agent they deploy.
//!
//! - Every YAML file under `deploy/` parses into its typed Kubernetes object (k8s-openapi), with
//!   nothing dropped on the way (a misspelt field fails), and both overlays render: with a small
//!   renderer for the kustomize features the manifests use, cross-checked with
//!   `kubectl kustomize` (those tests are reported ignored, with the reason, where the build
//!   found no kubectl: build.rs).
//! - RBAC: the real `gpu-share agent`, configured from the DaemonSet's own env and args, runs
//!   against the Kubernetes API double (tests/kube-double) through a reconcile that cordons,
//!   evicts and applies; every request it made must be allowed by the manifests' RBAC, and every
//!   verb they grant must have been used (or be in a short documented list).
//! - The ValidatingAdmissionPolicy: its CEL compiles (cel-interpreter), it allows and denies the
//!   right fixtures, and it admits every Node write the agent made in that run.
//! - The DaemonSet's env and mounts match the agent's flags; the profiles ConfigMap validates.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use cel_interpreter::{Context, Program, Value as Cel};
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, Namespace, Node, NodeConfigSource, NodeSpec, Pod, PodSpec, Service,
    ServiceAccount,
};
use k8s_openapi::api::node::v1::RuntimeClass;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};
use kube_double::{fixtures, KubeDouble, RequestRecord};
use node_sim::{
    gpu_share_bin, wait_applied, AgentNode, Workload, PROFILE_LABEL, REASON, STATE_LABEL,
};
use nvidia_ml::Gpu;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

#[path = "deploy/autopilot.rs"]
mod autopilot;
#[path = "deploy/autopilot_run.rs"]
mod autopilot_run;
#[path = "deploy/dra.rs"]
mod dra;
#[path = "deploy/in_cluster.rs"]
mod in_cluster;

/// Env vars in the agent container that the NVIDIA container runtime reads, not gpu-share.
const RUNTIME_ENV: [&str; 4] = [
    "NVIDIA_VISIBLE_DEVICES",
    "NVIDIA_DRIVER_CAPABILITIES",
    "NVIDIA_MIG_CONFIG_DEVICES",
    "NVIDIA_MIG_MONITOR_DEVICES",
];
/// Granted (group, resource, verb) that the agent needs but the test run below does not reach,
/// each with why. Empty: the run reaches every grant. Add an entry only with its reason.
const NEEDED_OUTSIDE_THE_TEST: &[(&str, &str, &str, &str)] = &[];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn deploy() -> PathBuf {
    root().join("deploy")
}

/// The installable variants: every directory under deploy/overlays.
fn overlays() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(deploy().join("overlays"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    names.sort();
    assert!(
        names.contains(&"standalone".to_string()) && names.contains(&"gpu-operator".to_string())
    );
    names
}

// ---------------------------------------------------------------------------------------------
// Reading and rendering the manifests
// ---------------------------------------------------------------------------------------------

/// Every document of a (multi-document) YAML file, as JSON; empty documents are skipped.
fn yaml_docs(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    yaml_docs_in(&text, &path.display().to_string())
}

fn yaml_docs_in(text: &str, what: &str) -> Vec<Value> {
    use serde::Deserialize;
    serde_yaml::Deserializer::from_str(text)
        .map(|doc| {
            let v = serde_yaml::Value::deserialize(doc)
                .unwrap_or_else(|e| panic!("{what}: bad YAML: {e}"));
            serde_json::to_value(v).unwrap_or_else(|e| panic!("{what}: not JSON-like: {e}"))
        })
        .filter(|v| !v.is_null())
        .collect()
}

/// What rendering an overlay read, and what it produced.
#[derive(Default)]
struct Rendered {
    objects: Vec<Value>,
    /// Files read: kustomization.yaml files, resources, patches.
    manifests: BTreeSet<PathBuf>,
    /// configMapGenerator sources: (ConfigMap name, key, file).
    generated_from: Vec<(String, String, PathBuf)>,
    patches: BTreeSet<PathBuf>,
}

/// Render a kustomization directory as kustomize does, for the features the manifests use:
/// `resources` (files and directories), `components`, `configMapGenerator` (files, fixed name,
/// `generatorOptions.labels`) and JSON 6902 `patches`, in kustomize's order (resources,
/// components, generators, patches). Anything else fails the test, so a kustomize feature this
/// renderer does not know cannot slip through unchecked.
fn render(dir: &Path) -> Rendered {
    let mut out = Rendered::default();
    render_into(dir, &mut out);
    out
}

fn render_into(dir: &Path, out: &mut Rendered) {
    let file = dir.join("kustomization.yaml");
    out.manifests.insert(canonical(&file));
    let k = yaml_docs(&file).remove(0);
    let known = [
        "apiVersion",
        "kind",
        "resources",
        "components",
        "patches",
        "generatorOptions",
        "configMapGenerator",
    ];
    for key in k.as_object().unwrap().keys() {
        assert!(
            known.contains(&key.as_str()),
            "{}: kustomization field {key} is not understood by this test's renderer",
            file.display()
        );
    }
    assert!(
        k["kind"] == "Kustomization" || k["kind"] == "Component",
        "{}",
        file.display()
    );
    for r in k["resources"].as_array().into_iter().flatten() {
        let path = dir.join(r.as_str().unwrap());
        if path.is_dir() {
            // A kustomization of its own: its patches apply to its objects only.
            let sub = render(&path);
            out.objects.extend(sub.objects);
            out.manifests.extend(sub.manifests);
            out.generated_from.extend(sub.generated_from);
            out.patches.extend(sub.patches);
        } else {
            out.manifests.insert(canonical(&path));
            out.objects.extend(yaml_docs(&path));
        }
    }
    // A component works on what this kustomization has gathered so far.
    for c in k["components"].as_array().into_iter().flatten() {
        render_into(&dir.join(c.as_str().unwrap()), out);
    }
    let options = &k["generatorOptions"];
    if let Some(gens) = k["configMapGenerator"].as_array() {
        assert_eq!(
            options["disableNameSuffixHash"], true,
            "the agent watches the profiles ConfigMap by a fixed name"
        );
        for g in gens {
            let name = g["name"].as_str().unwrap().to_string();
            let mut data = serde_json::Map::new();
            for f in g["files"].as_array().unwrap() {
                let (key, rel) = f.as_str().unwrap().split_once('=').unwrap();
                let path = dir.join(rel);
                let text = std::fs::read_to_string(&path).unwrap();
                data.insert(key.to_string(), Value::String(text));
                out.generated_from
                    .push((name.clone(), key.to_string(), canonical(&path)));
            }
            let mut cm = json!({
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": name},
                "data": data,
            });
            if let Some(ns) = g["namespace"].as_str() {
                cm["metadata"]["namespace"] = json!(ns);
            }
            if let Some(labels) = options["labels"].as_object() {
                cm["metadata"]["labels"] = Value::Object(labels.clone());
            }
            out.objects.push(cm);
        }
    }
    for p in k["patches"].as_array().into_iter().flatten() {
        let path = dir.join(p["path"].as_str().unwrap());
        out.manifests.insert(canonical(&path));
        out.patches.insert(canonical(&path));
        let ops = yaml_docs(&path).remove(0);
        let target = &p["target"];
        let mut hits = 0;
        for obj in &mut out.objects[..] {
            let api = obj["apiVersion"].as_str().unwrap_or("");
            let (group, version) = api.rsplit_once('/').unwrap_or(("", api));
            let wanted = |field: &str, have: &str| {
                target[field].is_null() || target[field].as_str() == Some(have)
            };
            let matches = wanted("kind", obj["kind"].as_str().unwrap_or(""))
                && wanted("name", obj["metadata"]["name"].as_str().unwrap_or(""))
                && wanted(
                    "namespace",
                    obj["metadata"]["namespace"].as_str().unwrap_or(""),
                )
                && wanted("group", group)
                && wanted("version", version);
            if matches {
                json_patch(obj, &ops);
                hits += 1;
            }
        }
        assert_eq!(
            hits,
            1,
            "{}: the patch target matches one object",
            path.display()
        );
    }
}

fn canonical(p: &Path) -> PathBuf {
    p.canonicalize()
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// RFC 6902 add / remove / replace, the operations the overlays use.
fn json_patch(doc: &mut Value, ops: &Value) {
    for op in ops
        .as_array()
        .expect("a JSON 6902 patch is a list of operations")
    {
        let path = op["path"].as_str().unwrap();
        let (parent, last) = path.rsplit_once('/').unwrap();
        let last = last.replace("~1", "/").replace("~0", "~");
        let target = doc
            .pointer_mut(parent)
            .unwrap_or_else(|| panic!("patch path {path} does not exist"));
        match (op["op"].as_str().unwrap(), target) {
            ("add", Value::Array(items)) => {
                let at = if last == "-" {
                    items.len()
                } else {
                    last.parse().unwrap()
                };
                items.insert(at, op["value"].clone());
            }
            ("add" | "replace", Value::Object(map)) => {
                map.insert(last, op["value"].clone());
            }
            ("replace", Value::Array(items)) => {
                items[last.parse::<usize>().unwrap()] = op["value"].clone();
            }
            ("remove", Value::Array(items)) => {
                items.remove(last.parse::<usize>().unwrap());
            }
            ("remove", Value::Object(map)) => {
                map.remove(&last);
            }
            (other, _) => panic!("patch op {other} at {path} is not supported here"),
        }
    }
}

/// The object of `kind` named `name` (in any namespace), as its typed k8s-openapi value.
fn one<K: DeserializeOwned>(objects: &[Value], kind: &str, name: &str) -> K {
    let found: Vec<&Value> = objects
        .iter()
        .filter(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .collect();
    assert_eq!(found.len(), 1, "exactly one {kind} {name}");
    serde_json::from_value(found[0].clone()).unwrap()
}

fn all<K: DeserializeOwned>(objects: &[Value], kind: &str) -> Vec<K> {
    objects
        .iter()
        .filter(|o| o["kind"] == kind)
        .map(|o| serde_json::from_value(o.clone()).unwrap())
        .collect()
}

/// Deserialize `doc` as `K` and serialize it back: the result must be the document itself, so
/// a field k8s-openapi does not know (a typo, a wrong level) fails instead of vanishing.
fn round_trip<K: DeserializeOwned + serde::Serialize>(doc: &Value, what: &str) {
    let typed: K = serde_json::from_value(doc.clone())
        .unwrap_or_else(|e| panic!("{what}: not a valid {}: {e}", doc["kind"]));
    let back = serde_json::to_value(&typed).unwrap();
    if &back != doc {
        panic!(
            "{what}: {} {} loses or changes fields when read as its Kubernetes type:\n{}",
            doc["kind"],
            doc["metadata"]["name"],
            diff(doc, &back, "")
        );
    }
}

fn diff(a: &Value, b: &Value, at: &str) -> String {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            keys.into_iter()
                .map(|k| {
                    diff(
                        x.get(k).unwrap_or(&Value::Null),
                        y.get(k).unwrap_or(&Value::Null),
                        &format!("{at}.{k}"),
                    )
                })
                .collect()
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .enumerate()
            .map(|(i, (p, q))| diff(p, q, &format!("{at}[{i}]")))
            .collect(),
        _ if a == b => String::new(),
        _ => format!("  {at}: written {a}, read back {b}\n"),
    }
}

fn typed_check(doc: &Value, what: &str) {
    match doc["kind"].as_str().unwrap_or_default() {
        "Namespace" => round_trip::<Namespace>(doc, what),
        "ServiceAccount" => round_trip::<ServiceAccount>(doc, what),
        "ClusterRole" => round_trip::<ClusterRole>(doc, what),
        "ClusterRoleBinding" => round_trip::<ClusterRoleBinding>(doc, what),
        "Role" => round_trip::<Role>(doc, what),
        "RoleBinding" => round_trip::<RoleBinding>(doc, what),
        "DaemonSet" => round_trip::<DaemonSet>(doc, what),
        "Service" => round_trip::<Service>(doc, what),
        "ConfigMap" => round_trip::<ConfigMap>(doc, what),
        "ValidatingAdmissionPolicy" => round_trip::<ValidatingAdmissionPolicy>(doc, what),
        "ValidatingAdmissionPolicyBinding" => {
            round_trip::<ValidatingAdmissionPolicyBinding>(doc, what)
        }
        "RuntimeClass" => round_trip::<RuntimeClass>(doc, what),
        "Deployment" => round_trip::<Deployment>(doc, what),
        "Pod" => round_trip::<Pod>(doc, what),
        "DeviceClass" | "ResourceClaimTemplate" => dra::round_trip_v1(doc, what),
        other => panic!("{what}: kind {other:?} is not one this test knows how to check"),
    }
}

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            yaml_files(&p, out);
        } else if matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml")) {
            out.push(canonical(&p));
        }
    }
}

/// `path` as a kustomization in `dir` names it: "../" up to the root, then `path` (kustomize
/// takes other kustomizations by relative path only).
fn relative_from(dir: &Path, path: &Path) -> String {
    let up = "../".repeat(dir.components().count() - 1);
    format!("{up}{}", path.strip_prefix("/").unwrap().display())
}

/// `kubectl kustomize <dir>` as objects keyed by kind/namespace/name.
fn kubectl_kustomize(dir: &Path) -> BTreeMap<String, Value> {
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(dir)
        .output()
        .expect("kubectl (build.rs found it; rebuild if it was removed)");
    assert!(
        out.status.success(),
        "kubectl kustomize {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    keyed(&yaml_docs_in(
        &String::from_utf8(out.stdout).unwrap(),
        "kubectl kustomize",
    ))
}

/// `theirs` (kubectl's rendering) and `ours` hold the same objects, each the same.
fn assert_renders_alike(
    what: &str,
    theirs: &BTreeMap<String, Value>,
    ours: &BTreeMap<String, Value>,
) {
    assert_eq!(
        theirs.keys().collect::<Vec<_>>(),
        ours.keys().collect::<Vec<_>>(),
        "{what}: kubectl kustomize renders other objects"
    );
    for (key, o) in ours {
        assert!(
            &theirs[key] == o,
            "{what}: {key} differs from kubectl kustomize:\n{}",
            diff(&theirs[key], o, "")
        );
    }
}

/// The overlays as `kubectl kustomize` renders them: the same objects as this file's renderer,
/// which the other tests read.
#[test]
#[cfg_attr(
    no_kubectl,
    ignore = "kubectl is not installed here: the overlays are checked with this file's renderer only"
)]
fn every_overlay_renders_as_kubectl_kustomize_does() {
    for overlay in overlays() {
        let dir = deploy().join("overlays").join(&overlay);
        let ours = keyed(&render(&dir).objects);
        assert_renders_alike(&overlay, &kubectl_kustomize(&dir), &ours);
    }
}

fn keyed(objects: &[Value]) -> BTreeMap<String, Value> {
    let mut map = BTreeMap::new();
    for o in objects {
        let key = format!(
            "{}/{}/{}",
            o["kind"].as_str().unwrap(),
            o["metadata"]["namespace"].as_str().unwrap_or(""),
            o["metadata"]["name"].as_str().unwrap()
        );
        assert!(map.insert(key.clone(), o.clone()).is_none(), "{key} twice");
    }
    map
}

#[test]
fn every_manifest_parses_into_its_kubernetes_type_and_the_overlays_render() {
    let mut read = BTreeSet::new();
    let mut generated = BTreeSet::new();
    let mut patches = BTreeSet::new();
    for overlay in overlays() {
        let dir = deploy().join("overlays").join(&overlay);
        let r = render(&dir);
        for o in &r.objects {
            typed_check(o, &format!("overlay {overlay}"));
        }
        // What a cluster gets: one of each object, the DaemonSet and its policy included.
        let objects = keyed(&r.objects);
        for must in [
            "Namespace//gpu-share",
            "DaemonSet/gpu-share/gpu-share",
            "ConfigMap/gpu-share/gpu-share-profiles",
            "ValidatingAdmissionPolicy//gpu-share-agent-scope",
            "ValidatingAdmissionPolicyBinding//gpu-share-agent-scope",
            "Service/gpu-share/gpu-share-metrics",
        ] {
            assert!(objects.contains_key(must), "{overlay}: no {must}");
        }
        read.extend(r.manifests);
        generated.extend(r.generated_from.into_iter().map(|(_, _, p)| p));
        patches.extend(r.patches);
        // Optional components a user adds to an overlay (tests/deploy/autopilot.rs renders
        // them and compares with kubectl).
        let r = autopilot::render_with_autopilot(&overlay);
        read.extend(r.manifests);
        patches.extend(r.patches);
    }
    // Examples a user applies in a workload namespace: deploy/examples/<what>/, each read by
    // its test (tests/deploy/dra.rs) and typed-checked below.
    read.extend(dra::example_files());
    // Every YAML file under deploy/ is used, and each document is its typed object.
    let mut files = Vec::new();
    yaml_files(&deploy(), &mut files);
    for f in files {
        let what = f.strip_prefix(root()).unwrap().display().to_string();
        if generated.contains(&f) {
            continue; // profiles: checked with `gpu-share validate` below
        }
        assert!(
            read.contains(&f),
            "{what} is not used by any overlay, component or example test"
        );
        if f.file_name().unwrap() == "kustomization.yaml" || patches.contains(&f) {
            continue; // kustomize's own files, read above
        }
        let docs = yaml_docs(&f);
        assert!(!docs.is_empty(), "{what} is empty");
        for d in &docs {
            typed_check(d, &what);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// RBAC, from the manifests, as the apiserver's RBAC authorizer applies it
// ---------------------------------------------------------------------------------------------

/// A rule, and the namespace it applies in (`None`: every namespace and cluster-scoped objects).
struct Grant {
    namespace: Option<String>,
    rule: PolicyRule,
    from: String,
}

/// The rules bound to ServiceAccount `ns/name`.
fn grants(objects: &[Value], ns: &str, name: &str) -> Vec<Grant> {
    let is_us = |subjects: &Option<Vec<k8s_openapi::api::rbac::v1::Subject>>| {
        subjects.iter().flatten().any(|s| {
            s.kind == "ServiceAccount" && s.name == name && s.namespace.as_deref() == Some(ns)
        })
    };
    let mut out = Vec::new();
    for b in all::<ClusterRoleBinding>(objects, "ClusterRoleBinding") {
        if is_us(&b.subjects) {
            assert_eq!(b.role_ref.kind, "ClusterRole");
            let role: ClusterRole = one(objects, "ClusterRole", &b.role_ref.name);
            for rule in role.rules.into_iter().flatten() {
                out.push(Grant {
                    namespace: None,
                    rule,
                    from: format!("ClusterRole {}", b.role_ref.name),
                });
            }
        }
    }
    for b in all::<RoleBinding>(objects, "RoleBinding") {
        if is_us(&b.subjects) {
            let bns = b.metadata.namespace.clone().unwrap();
            let rules = if b.role_ref.kind == "Role" {
                let role: Role = one(objects, "Role", &b.role_ref.name);
                assert_eq!(role.metadata.namespace.as_deref(), Some(bns.as_str()));
                role.rules
            } else {
                one::<ClusterRole>(objects, "ClusterRole", &b.role_ref.name).rules
            };
            for rule in rules.into_iter().flatten() {
                out.push(Grant {
                    namespace: Some(bns.clone()),
                    rule,
                    from: format!("{} {}/{}", b.role_ref.kind, bns, b.role_ref.name),
                });
            }
        }
    }
    for g in &out {
        for list in [
            &g.rule.verbs,
            g.rule.api_groups.as_ref().unwrap(),
            g.rule.resources.as_ref().unwrap(),
        ] {
            assert!(!list.iter().any(|x| x == "*"), "{}: no wildcards", g.from);
        }
        assert!(g.rule.non_resource_urls.is_none(), "{}", g.from);
    }
    out
}

fn verb_name(r: &RequestRecord) -> String {
    format!("{:?}", r.verb).to_lowercase()
}

/// `%xx` decoding of a query string value (`+` is a space).
fn url_decode(s: &str) -> String {
    let mut out = Vec::new();
    let mut bytes = s.bytes();
    while let Some(b) = bytes.next() {
        match b {
            b'%' => {
                let hex: String = bytes.by_ref().take(2).map(char::from).collect();
                out.push(u8::from_str_radix(&hex, 16).unwrap());
            }
            b'+' => out.push(b' '),
            c => out.push(c),
        }
    }
    String::from_utf8(out).unwrap()
}

fn query_param(query: &str, key: &str) -> Option<String> {
    query.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == key).then(|| url_decode(v))
    })
}

/// The object name RBAC sees: the URL's, or for a list/watch the value of an exact
/// `metadata.name=` field selector (the apiserver's request info does this, which is what lets
/// resourceNames restrict a list or watch).
fn request_name(r: &RequestRecord) -> Option<String> {
    if let Some(n) = &r.name {
        return Some(n.clone());
    }
    let selector = query_param(&r.query, "fieldSelector")?;
    let value = selector
        .strip_prefix("metadata.name==")
        .or_else(|| selector.strip_prefix("metadata.name="))?;
    (!value.contains(',')).then(|| value.to_string())
}

fn allows(g: &Grant, r: &RequestRecord) -> bool {
    let verb = verb_name(r);
    let rule = &g.rule;
    let in_scope = match (&g.namespace, &r.namespace) {
        (None, _) => true,
        (Some(ns), Some(rns)) => ns == rns,
        (Some(_), None) => false,
    };
    let names_ok = match rule.resource_names.as_deref() {
        None | Some([]) => true,
        // A create of a top-level object has no name at authorization time.
        Some(_) if verb == "create" && !r.resource.contains('/') => false,
        Some(names) => request_name(r).is_some_and(|n| names.contains(&n)),
    };
    in_scope
        && names_ok
        && rule.verbs.contains(&verb)
        && rule.api_groups.as_ref().unwrap().contains(&r.group)
        && rule.resources.as_ref().unwrap().contains(&r.resource)
}

fn request(
    verb: kube_double::Verb,
    group: &str,
    resource: &str,
    ns: Option<&str>,
) -> RequestRecord {
    RequestRecord {
        method: String::new(),
        path: String::new(),
        query: String::new(),
        verb,
        resource: resource.to_string(),
        group: group.to_string(),
        namespace: ns.map(str::to_string),
        name: None,
        content_type: None,
        field_manager: String::new(),
        code: None,
        injected: false,
    }
}

/// What RBAC makes of `requests` by a ServiceAccount holding `grants`: the requests it refuses,
/// and the granted (group, resource, verb) no request used, but those in `outside` (needed
/// outside the run, each with its reason). Discovery and health GETs need no grant.
fn rbac_misfits(
    grants: &[Grant],
    requests: &[RequestRecord],
    outside: &[(&str, &str, &str, &str)],
) -> (Vec<String>, Vec<String>) {
    let mut used = BTreeSet::new();
    let mut refused = Vec::new();
    for r in requests {
        if r.resource.is_empty() {
            assert_eq!(r.method, "GET", "{r:?}");
            continue;
        }
        if grants.iter().any(|g| allows(g, r)) {
            used.insert((r.group.clone(), r.resource.clone(), verb_name(r)));
        } else {
            refused.push(format!(
                "{} {} ns={:?} name={:?} query={}",
                verb_name(r),
                r.path,
                r.namespace,
                r.name,
                r.query
            ));
        }
    }
    let mut unused = Vec::new();
    for g in grants {
        for group in g.rule.api_groups.iter().flatten() {
            for res in g.rule.resources.iter().flatten() {
                for verb in &g.rule.verbs {
                    let listed = outside
                        .iter()
                        .any(|(lg, lr, lv, _)| (*lg, *lr, *lv) == (group, res, verb));
                    if !listed && !used.contains(&(group.clone(), res.clone(), verb.clone())) {
                        unused.push(format!("{} {group}/{res} {verb}", g.from));
                    }
                }
            }
        }
    }
    (refused, unused)
}

/// The RBAC model above refuses what the manifests do not grant, so the agent run's "allowed"
/// means something.
#[test]
fn the_rbac_model_refuses_what_the_manifests_do_not_grant() {
    use kube_double::Verb;
    let objects = render(&deploy().join("overlays/standalone")).objects;
    let grants = grants(&objects, "gpu-share", "gpu-share");
    let allowed = |r: &RequestRecord| grants.iter().any(|g| allows(g, r));
    let cm_watch = |query: &str| RequestRecord {
        query: query.to_string(),
        ..request(Verb::Watch, "", "configmaps", Some("gpu-share"))
    };
    assert!(allowed(&cm_watch(
        "watch=true&fieldSelector=metadata.name%3Dgpu-share-profiles"
    )));
    assert!(!allowed(&cm_watch("watch=true")), "every ConfigMap");
    assert!(!allowed(&cm_watch(
        "watch=true&fieldSelector=metadata.name%3Dkube-root-ca.crt"
    )));
    let refused = [
        request(Verb::Delete, "", "pods", Some("ml")),
        request(Verb::Watch, "", "pods", None),
        request(Verb::Get, "", "pods", Some("ml")),
        request(Verb::Update, "", "nodes", None),
        request(Verb::Patch, "", "nodes/status", None),
        request(Verb::Delete, "", "nodes", None),
        request(Verb::Get, "", "secrets", Some("gpu-share")),
        request(Verb::Update, "", "configmaps", Some("gpu-share")),
        request(Verb::Create, "events.k8s.io", "events", Some("ml")),
        request(Verb::Create, "", "events", Some("default")),
        request(
            Verb::Create,
            "coordination.k8s.io",
            "leases",
            Some("kube-system"),
        ),
        request(
            Verb::Delete,
            "coordination.k8s.io",
            "leases",
            Some("gpu-share"),
        ),
    ];
    for r in &refused {
        assert!(!allowed(r), "granted but should not be: {r:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// The ValidatingAdmissionPolicy, evaluated with cel-interpreter
// ---------------------------------------------------------------------------------------------

struct Compiled {
    source: String,
    program: Program,
}

struct Policy {
    conditions: Vec<Compiled>,
    variables: Vec<(String, Compiled)>,
    /// (expression, message, messageExpression)
    validations: Vec<(Compiled, String, Option<Compiled>)>,
}

#[derive(Debug, PartialEq)]
enum Verdict {
    /// The policy's match conditions leave the request alone.
    NotMatched,
    Allowed,
    Denied(Vec<String>),
}

fn compile(source: &str, what: &str) -> Compiled {
    let program = Program::compile(source)
        .unwrap_or_else(|e| panic!("{what}: CEL does not compile: {e}\n{source}"));
    // Only the variables Kubernetes gives a ValidatingAdmissionPolicy without params.
    let known = [
        "object",
        "oldObject",
        "request",
        "variables",
        "namespaceObject",
        "authorizer",
    ];
    for v in program.references().variables() {
        // Comprehension variables (`k` in `.all(k, ...)`) and the parser's accumulators.
        let bound = source.contains(&format!("({v},")) || v.starts_with('@') || v.starts_with('_');
        assert!(
            known.contains(&v) || bound,
            "{what}: unknown variable {v}\n{source}"
        );
    }
    Compiled {
        source: source.to_string(),
        program,
    }
}

fn load_policy(vap: &ValidatingAdmissionPolicy) -> Policy {
    let spec = vap.spec.as_ref().unwrap();
    let conditions = spec
        .match_conditions
        .iter()
        .flatten()
        .map(|c| compile(&c.expression, &format!("matchCondition {}", c.name)))
        .collect();
    let variables: Vec<(String, Compiled)> = spec
        .variables
        .iter()
        .flatten()
        .map(|v| {
            (
                v.name.clone(),
                compile(&v.expression, &format!("variable {}", v.name)),
            )
        })
        .collect();
    let validations: Vec<(Compiled, String, Option<Compiled>)> = spec
        .validations
        .iter()
        .flatten()
        .enumerate()
        .map(|(i, v)| {
            let what = format!("validation {i}");
            (
                compile(&v.expression, &what),
                v.message.clone().unwrap_or_default(),
                v.message_expression
                    .as_deref()
                    .map(|m| compile(m, &format!("{what} messageExpression"))),
            )
        })
        .collect();
    // `variables.x` names a variable defined before it is used.
    let defined: Vec<&str> = variables.iter().map(|(n, _)| n.as_str()).collect();
    let sources = variables
        .iter()
        .map(|(_, c)| &c.source)
        .chain(validations.iter().map(|(c, _, _)| &c.source))
        .chain(
            validations
                .iter()
                .filter_map(|(_, _, m)| m.as_ref().map(|m| &m.source)),
        );
    for s in sources {
        for (i, _) in s.match_indices("variables.") {
            let name: String = s[i + "variables.".len()..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            assert!(
                defined.contains(&name.as_str()),
                "undefined variables.{name} in {s}"
            );
        }
    }
    Policy {
        conditions,
        variables,
        validations,
    }
}

fn cel(v: &Value) -> Cel {
    cel_interpreter::to_value(v).unwrap()
}

/// Admit an UPDATE of `old` to `new` by the user in `request`, as the apiserver would.
fn admit(policy: &Policy, request: &Value, old: &Value, new: &Value) -> Verdict {
    let mut ctx = Context::default();
    ctx.add_variable_from_value("request", cel(request));
    ctx.add_variable_from_value("object", cel(new));
    ctx.add_variable_from_value("oldObject", cel(old));
    for c in &policy.conditions {
        match c.program.execute(&ctx) {
            Ok(Cel::Bool(true)) => {}
            Ok(Cel::Bool(false)) => return Verdict::NotMatched,
            other => panic!("match condition {}: {other:?}", c.source),
        }
    }
    let mut vars: HashMap<String, Cel> = HashMap::new();
    for (name, c) in &policy.variables {
        ctx.add_variable_from_value("variables", vars.clone());
        match c.program.execute(&ctx) {
            Ok(v) => {
                vars.insert(name.clone(), v);
            }
            // failurePolicy: Fail. An error makes the validations that use it fail.
            Err(e) => return Verdict::Denied(vec![format!("variable {name}: {e:?}")]),
        }
    }
    ctx.add_variable_from_value("variables", vars);
    let mut denied = Vec::new();
    for (c, message, message_expr) in &policy.validations {
        match c.program.execute(&ctx) {
            Ok(Cel::Bool(true)) => {}
            Ok(Cel::Bool(false)) => denied.push(match message_expr {
                Some(m) => match m.program.execute(&ctx) {
                    Ok(Cel::String(s)) => s.to_string(),
                    other => panic!("messageExpression {}: {other:?}", m.source),
                },
                None => message.clone(),
            }),
            other => denied.push(format!("error {other:?} in {}", c.source)),
        }
    }
    if denied.is_empty() {
        Verdict::Allowed
    } else {
        Verdict::Denied(denied)
    }
}

fn agent_request(sa_user: &str, node: Option<&str>) -> Value {
    let extra = match node {
        Some(n) => json!({
            "authentication.kubernetes.io/node-name": [n],
            "authentication.kubernetes.io/pod-name": ["gpu-share-x7k2p"],
        }),
        None => json!({}),
    };
    json!({
        "operation": "UPDATE",
        "resource": {"group": "", "version": "v1", "resource": "nodes"},
        "userInfo": {"username": sa_user, "groups": ["system:serviceaccounts"], "extra": extra},
    })
}

fn policy_from(objects: &[Value]) -> (Policy, String) {
    let vap: ValidatingAdmissionPolicy = one(
        objects,
        "ValidatingAdmissionPolicy",
        "gpu-share-agent-scope",
    );
    let binding: ValidatingAdmissionPolicyBinding = one(
        objects,
        "ValidatingAdmissionPolicyBinding",
        "gpu-share-agent-scope",
    );
    let bspec = binding.spec.unwrap();
    assert_eq!(bspec.policy_name.as_deref(), Some("gpu-share-agent-scope"));
    assert_eq!(bspec.validation_actions, Some(vec!["Deny".to_string()]));
    let spec = vap.spec.as_ref().unwrap();
    assert_eq!(spec.failure_policy.as_deref(), Some("Fail"));
    let rules = spec
        .match_constraints
        .as_ref()
        .unwrap()
        .resource_rules
        .clone()
        .unwrap();
    assert_eq!(rules.len(), 1);
    assert_eq!(rules[0].api_groups, Some(vec![String::new()]));
    assert_eq!(rules[0].resources, Some(vec!["nodes".to_string()]));
    assert_eq!(rules[0].operations, Some(vec!["UPDATE".to_string()]));
    let ds: DaemonSet = one(objects, "DaemonSet", "gpu-share");
    let user = format!(
        "system:serviceaccount:{}:{}",
        ds.metadata.namespace.unwrap(),
        ds.spec
            .unwrap()
            .template
            .spec
            .unwrap()
            .service_account_name
            .unwrap()
    );
    let p = load_policy(&vap);
    assert!(
        p.conditions.iter().any(|c| c.source.contains(&user)),
        "the policy matches the agent's ServiceAccount, {user}"
    );
    (p, user)
}

/// A GPU node as the cluster has it: other owners' labels and annotations, a taint.
fn node_fixture(name: &str) -> Value {
    let mut node = serde_json::to_value(fixtures::node(
        name,
        &[
            ("kubernetes.io/hostname", name),
            ("nvidia.com/gpu.present", "true"),
            (PROFILE_LABEL, "h100-inference"),
            (STATE_LABEL, "success"),
        ],
    ))
    .unwrap();
    node["metadata"]["annotations"] = json!({
        "node.alpha.kubernetes.io/ttl": "0",
        "gpu-share.dev/profile.reason": "profile h100-inference applied",
    });
    node["spec"] = json!({
        "providerID": format!("aws:///us-east-1a/{name}"),
        "podCIDR": "10.0.1.0/24",
        "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
    });
    node
}

#[test]
fn the_admission_policy_compiles_and_lets_the_agent_change_only_its_own_fields() {
    let objects = render(&deploy().join("overlays/standalone")).objects;
    let (policy, user) = policy_from(&objects);
    let me = agent_request(&user, Some("gpu-1"));
    let old = node_fixture("gpu-1");
    let check =
        |what: &str, request: &Value, old: &Value, edit: &dyn Fn(&mut Value), want: &str| {
            let mut new = old.clone();
            edit(&mut new);
            let got = admit(&policy, request, old, &new);
            let ok = match (&got, want) {
                (Verdict::Allowed, "allow") | (Verdict::NotMatched, "not matched") => true,
                (Verdict::Denied(why), w) => {
                    w.starts_with("deny") && why.iter().any(|m| m.contains(&w["deny: ".len()..]))
                }
                _ => false,
            };
            assert!(ok, "{what}: wanted {want}, got {got:?}");
        };
    let state = |n: &mut Value| {
        n["metadata"]["labels"][STATE_LABEL] = json!("applying");
        n["metadata"]["annotations"]["gpu-share.dev/profile.reason"] = json!("applying profile x");
        n["metadata"]["annotations"]["gpu-share.dev/profile.applied-hash"] = json!("ab12");
    };
    check("its own state label", &me, &old, &state, "allow");
    // What src/agent/devices_in_use.rs publishes for advise --live.
    let devices_in_use = |n: &mut Value| {
        n["metadata"]["annotations"]["gpu-share.dev/devices-in-use"] =
            json!(r#"{"serving/llm-0":[{"gpu":3,"migPlacementStart":4,"migProfile":"1g.10gb"}]}"#);
    };
    check(
        "the devices each pod holds",
        &me,
        &old,
        &devices_in_use,
        "allow",
    );
    check(
        "removing its own state",
        &me,
        &old,
        &|n| {
            n["metadata"]["labels"]
                .as_object_mut()
                .unwrap()
                .remove(STATE_LABEL);
            n["metadata"]["annotations"]
                .as_object_mut()
                .unwrap()
                .remove("gpu-share.dev/profile.reason");
        },
        "allow",
    );
    let cordon = |n: &mut Value| {
        n["spec"]["unschedulable"] = json!(true);
        n["metadata"]["annotations"]["gpu-share.dev/cordoned"] = json!("gpu-share: reconfiguring");
    };
    check("cordon, marked as its own", &me, &old, &cordon, "allow");
    let mut cordoned = old.clone();
    cordon(&mut cordoned);
    let uncordon = |n: &mut Value| {
        n["spec"].as_object_mut().unwrap().remove("unschedulable");
        n["metadata"]["annotations"]
            .as_object_mut()
            .unwrap()
            .remove("gpu-share.dev/cordoned");
    };
    check(
        "uncordon what it cordoned",
        &me,
        &cordoned,
        &uncordon,
        "allow",
    );
    check(
        "another node",
        &agent_request(&user, Some("gpu-2")),
        &old,
        &state,
        "deny: may change only the node its pod runs on (gpu-2), not gpu-1",
    );
    check(
        "a token bound to no node",
        &agent_request(&user, None),
        &old,
        &state,
        "deny: its token names no node",
    );
    check(
        "someone else's label",
        &me,
        &old,
        &|n| n["metadata"]["labels"]["nvidia.com/gpu.present"] = json!("false"),
        "deny: only labels under gpu-share.dev/",
    );
    check(
        "a new label of its own choosing",
        &me,
        &old,
        &|n| n["metadata"]["labels"]["team"] = json!("ml"),
        "deny: only labels under gpu-share.dev/",
    );
    check(
        "removing someone else's label",
        &me,
        &old,
        &|n| {
            n["metadata"]["labels"]
                .as_object_mut()
                .unwrap()
                .remove("kubernetes.io/hostname");
        },
        "deny: only labels under gpu-share.dev/",
    );
    check(
        "the profile label the administrator sets",
        &me,
        &old,
        &|n| n["metadata"]["labels"][PROFILE_LABEL] = json!("exclusive"),
        "deny: not gpu-share.dev/profile",
    );
    check(
        "opting its own node in to the autopilot",
        &me,
        &old,
        &|n| n["metadata"]["labels"]["gpu-share.dev/autopilot"] = json!("enabled"),
        "deny: nor gpu-share.dev/autopilot",
    );
    check(
        "someone else's annotation",
        &me,
        &old,
        &|n| n["metadata"]["annotations"]["node.alpha.kubernetes.io/ttl"] = json!("30"),
        "deny: only annotations under gpu-share.dev/",
    );
    check(
        "a taint",
        &me,
        &old,
        &|n| n["spec"]["taints"] = json!([]),
        "deny: not taints",
    );
    check(
        "a new taint",
        &me,
        &old,
        &|n| {
            n["spec"]["taints"]
                .as_array_mut()
                .unwrap()
                .push(json!({"key": "x", "effect": "NoExecute"}))
        },
        "deny: not taints",
    );
    check(
        "the provider ID",
        &me,
        &old,
        &|n| n["spec"]["providerID"] = json!("aws:///elsewhere"),
        "deny: may change only spec.unschedulable",
    );
    check(
        "a finalizer",
        &me,
        &old,
        &|n| n["metadata"]["finalizers"] = json!(["example.com/hold"]),
        "deny: finalizers",
    );
    check(
        "cordon without its mark",
        &me,
        &old,
        &|n| n["spec"]["unschedulable"] = json!(true),
        "deny: cordon only with its gpu-share.dev/cordoned annotation",
    );
    let mut admin_cordoned = old.clone();
    admin_cordoned["spec"]["unschedulable"] = json!(true);
    check(
        "uncordon an administrator's cordon",
        &me,
        &admin_cordoned,
        &|n| {
            n["spec"].as_object_mut().unwrap().remove("unschedulable");
        },
        "deny: uncordon only a node it cordoned",
    );
    check(
        "claim an administrator's cordon",
        &me,
        &admin_cordoned,
        &|n| n["metadata"]["annotations"]["gpu-share.dev/cordoned"] = json!("mine"),
        "deny: may not claim a cordon",
    );
    check(
        "an administrator (the policy does not apply)",
        &agent_request("kubernetes-admin", None),
        &old,
        &|n| n["spec"]["taints"] = json!([]),
        "not matched",
    );

    // The spec check names every NodeSpec field but unschedulable. A new field in k8s-openapi
    // makes this struct literal fail to compile: then add it to the policy.
    let spec = NodeSpec {
        config_source: Some(NodeConfigSource::default()),
        external_id: Some(String::new()),
        pod_cidr: Some(String::new()),
        pod_cidrs: Some(vec![]),
        provider_id: Some(String::new()),
        taints: Some(vec![]),
        unschedulable: Some(false),
    };
    let fields = serde_json::to_value(spec).unwrap();
    let spec_check = policy
        .validations
        .iter()
        .find(|(c, _, _)| c.source.contains("object.spec.taints"))
        .expect("a validation of the spec");
    for field in fields.as_object().unwrap().keys() {
        if field != "unschedulable" {
            for side in ["object", "oldObject"] {
                let needle = format!("{side}.spec.{field}");
                let named = spec_check.0.source.match_indices(&needle).any(|(i, _)| {
                    let before = spec_check.0.source[..i].chars().next_back();
                    let after = spec_check.0.source[i + needle.len()..].chars().next();
                    !before.is_some_and(|c| c.is_alphanumeric() || c == '.')
                        && !after.is_some_and(char::is_alphanumeric)
                });
                assert!(named, "the spec check misses {needle}");
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The agent, run as the DaemonSet configures it, against the API double
// ---------------------------------------------------------------------------------------------

fn container<'a>(pod: &'a PodSpec, name: &str) -> &'a Container {
    pod.containers
        .iter()
        .chain(pod.init_containers.iter().flatten())
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no container {name}"))
}

fn env_value(c: &Container, name: &str) -> Option<String> {
    c.env
        .iter()
        .flatten()
        .find(|e| e.name == name)
        .and_then(|e| e.value.clone())
}

fn pod_spec(objects: &[Value]) -> (DaemonSet, PodSpec) {
    let ds: DaemonSet = one(objects, "DaemonSet", "gpu-share");
    let pod = ds.spec.clone().unwrap().template.spec.unwrap();
    (ds, pod)
}

/// The agent pod's UID, as the downward API gives it (`metadata.uid`).
const AGENT_POD_UID: &str = "5e1f0c2a-7b3d-4e8f-9a6b-1c2d3e4f5a6b";

/// `gpu-share agent` with the DaemonSet's args and env, as `node`'s agent. Only what must point
/// into the test's fixtures changes: host paths, the fake NVML and MPS control, the listen
/// address (the overrides here and [`AgentNode::fixture_env`]); the downward-API values are what
/// the kubelet would fill in.
/// Every container image of the agent's pod in a rendered overlay, init containers first.
fn agent_pod_images(objects: &[Value]) -> Vec<String> {
    let (_, pod) = pod_spec(objects);
    pod.init_containers
        .iter()
        .flatten()
        .chain(&pod.containers)
        .filter_map(|c| c.image.clone())
        .collect()
}

fn start_agent(pod: &PodSpec, node: &mut AgentNode, namespace: &str) {
    start_agent_with(pod, node, namespace, &[]);
}

/// [`start_agent`], with `defaults` (env the DaemonSet leaves to the agent's default host paths)
/// pointed into the test's fixtures too.
fn start_agent_with(
    pod: &PodSpec,
    node: &mut AgentNode,
    namespace: &str,
    defaults: &[(&str, PathBuf)],
) {
    let c = container(pod, "agent");
    let overrides: BTreeMap<&str, PathBuf> = [
        ("GPU_SHARE_STATE_DIR", node.path("state")),
        ("GPU_SHARE_PLUGIN_CONFIG", node.plugin_config()),
        ("GPU_SHARE_PROC_ROOT", node.path("proc")),
        (
            "GPU_SHARE_POD_RESOURCES_SOCKET",
            node.pod_resources_socket(),
        ),
        ("GPU_SHARE_MPS_ROOT", node.path("mps")),
        ("GPU_SHARE_LISTEN", PathBuf::from("127.0.0.1:0")),
    ]
    .into_iter()
    .collect();
    let mut cmd = Command::new(gpu_share_bin());
    cmd.args(c.args.iter().flatten())
        // Test speed: short leases, fast retries.
        .args([
            "--lease-duration",
            "2s",
            "--eviction-backoff",
            "100ms",
            "--resync-period",
            "2s",
        ]);
    for e in c.env.iter().flatten() {
        let value = match (&e.value, &e.value_from) {
            (Some(v), None) => overrides
                .get(e.name.as_str())
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| v.clone()),
            (None, Some(from)) => match from.field_ref.as_ref().unwrap().field_path.as_str() {
                "spec.nodeName" => node.name.clone(),
                "metadata.namespace" => namespace.to_string(),
                "metadata.uid" => AGENT_POD_UID.to_string(),
                other => panic!("downward API field {other} is not simulated here"),
            },
            _ => panic!("env {} has neither a value nor a fieldRef", e.name),
        };
        cmd.env(&e.name, value);
    }
    // Every override is one the DaemonSet sets, but the NVIDIA plugin's config file, which only
    // the nvidia overlays have; it is pointed into the fixture either way.
    let nvidia = env_value(c, "GPU_SHARE_PLUGIN").is_none_or(|p| p == "nvidia");
    for (name, path) in &overrides {
        if env_value(c, name).is_none() {
            assert!(
                *name == "GPU_SHARE_PLUGIN_CONFIG" && !nvidia,
                "the DaemonSet sets {name}"
            );
            cmd.env(name, path);
        }
    }
    for (name, path) in defaults {
        assert!(env_value(c, name).is_none(), "the DaemonSet sets {name}");
        cmd.env(name, path);
    }
    node.fixture_env(&mut cmd);
    node.spawn(cmd);
}

fn label(api: &KubeDouble, node: &str, key: &str) -> Option<String> {
    api.node(node)?.metadata.labels?.get(key).cloned()
}

/// Every update of `node` since `since`, replayed from the double's watch history.
fn node_updates(api: &KubeDouble, node: &str, since: &str) -> Vec<Node> {
    use futures::StreamExt;
    use kube::api::{Api, WatchEvent, WatchParams};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let nodes: Api<Node> = Api::all(api.client());
        let params = WatchParams::default()
            .fields(&format!("metadata.name={node}"))
            .timeout(1);
        let mut stream = nodes.watch(&params, since).await.unwrap().boxed();
        let mut out = Vec::new();
        while let Some(event) = stream.next().await {
            match event.unwrap() {
                WatchEvent::Added(n) | WatchEvent::Modified(n) => out.push(n),
                WatchEvent::Bookmark(_) => {}
                other => panic!("unexpected watch event {other:?}"),
            }
        }
        out
    })
}

/// The node as admission sees it: without the fields the apiserver maintains itself.
fn as_admitted(n: &Node) -> Value {
    let mut v = serde_json::to_value(n).unwrap();
    let meta = v["metadata"].as_object_mut().unwrap();
    for k in ["resourceVersion", "managedFields", "generation"] {
        meta.remove(k);
    }
    v
}

/// A stand-in device-plugin process (`sleep 600`) that SIGHUP ends. An ignored signal stays
/// ignored across exec, so under `nohup` (SIGHUP ignored) a plain `sleep` would survive the
/// agent's SIGHUP and the test would fail for its runner's sake (it did, in a fresh clone run
/// under nohup).
fn dies_of_sighup() -> std::process::Child {
    use std::os::unix::process::CommandExt;
    let mut command = Command::new("sleep");
    command.arg("600");
    // SAFETY: between fork and exec the child only calls signal(2), which is
    // async-signal-safe, and allocates nothing.
    unsafe {
        command.pre_exec(|| {
            nix::sys::signal::signal(
                nix::sys::signal::Signal::SIGHUP,
                nix::sys::signal::SigHandler::SigDfl,
            )
            .map(drop)
            .map_err(std::io::Error::from)
        });
    }
    command.spawn().unwrap()
}

#[test]
fn rbac_grants_exactly_what_the_agent_uses_and_the_policy_admits_its_node_writes() {
    let objects = render(&deploy().join("overlays/standalone")).objects;
    let (ds, pod) = pod_spec(&objects);
    let namespace = ds.metadata.namespace.clone().unwrap();
    let sa = pod.service_account_name.clone().unwrap();
    let agent_c = container(&pod, "agent");
    let cm_name = env_value(agent_c, "GPU_SHARE_CONFIGMAP").unwrap();

    let api = Arc::new(KubeDouble::start());
    api.put_configmap(one(&objects, "ConfigMap", &cm_name));
    let node = "gpu-1";
    let fixture: Node = serde_json::from_value(node_fixture(node)).unwrap();
    let mut fixture_node = fixture.clone();
    // Starts unlabelled and without gpu-share state; other owners' labels and a taint stay.
    for l in [PROFILE_LABEL, STATE_LABEL] {
        fixture_node.metadata.labels.as_mut().unwrap().remove(l);
    }
    fixture_node
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .remove(REASON);
    api.put_node(fixture_node);
    let since = api.resource_version();
    let first = api.node(node).unwrap();

    let mut sim = AgentNode::for_node(&api, node, vec![Gpu::mig("h100").mig_enabled()]);
    // The device plugin, as the agent finds it through /proc: a process in the agent's pod
    // whose argv[0] is the DaemonSet's plugin command. The agent's SIGHUP ends it, which shows
    // it was signalled. Started first, with a lower PID: another pod's plugin of the same name
    // (the GPU Operator's, say), which must never be signalled.
    let plugin_c = container(&pod, "device-plugin");
    let argv0 = &plugin_c.command.as_ref().unwrap()[0];
    let other_pod = "9f8e7d6c-5b4a-4321-8fed-cba987654321";
    let mut other_plugin = dies_of_sighup();
    let mut plugin = dies_of_sighup();
    for (process, pod_uid) in [(&other_plugin, other_pod), (&plugin, AGENT_POD_UID)] {
        let proc_dir = sim.path(&format!("proc/{}", process.id()));
        std::fs::create_dir_all(&proc_dir).unwrap();
        std::fs::write(proc_dir.join("cmdline"), format!("{argv0}\0")).unwrap();
        std::fs::write(
            proc_dir.join("cgroup"),
            format!("0::/kubepods/besteffort/pod{pod_uid}/c0ffee\n"),
        )
        .unwrap();
    }

    start_agent(&pod, &mut sim, &namespace);
    // A profile with MIG changes: drain slot, cordon, apply, uncordon.
    api.set_node_label(node, PROFILE_LABEL, Some("h100-balanced"));
    wait_applied(&api, &sim, "h100-balanced", Duration::from_secs(40));
    // A pod on an instance the next profile keeps and one on an instance it destroys. PIDs
    // above Linux's pid_max, so they never name a real process.
    sim.add_workloads_in(
        &api,
        "ml",
        &[
            Workload::on_mig("stays", 5_000_001, 0, sim.gi_at(0, 0)),
            Workload::on_mig("moves", 5_000_002, 0, sim.gi_at(0, 4)),
        ],
    );
    api.set_node_label(node, PROFILE_LABEL, Some("h100-inference"));
    wait_applied(&api, &sim, "h100-inference", Duration::from_secs(40));
    let evicted: Vec<String> = api.evictions().iter().map(|e| e.pod.clone()).collect();
    assert_eq!(evicted, ["moves"], "{}", sim.log());
    // No label: the agent drops its state and leaves the GPUs alone.
    api.set_node_label(node, PROFILE_LABEL, None);
    assert!(
        api.wait_until(Duration::from_secs(20), |a| label(a, node, STATE_LABEL)
            .is_none())
    );
    // The same profile again: its `Applied` Event repeats word for word, which the Recorder
    // PATCHes into the first one's series (events.k8s.io patch).
    api.set_node_label(node, PROFILE_LABEL, Some("h100-inference"));
    wait_applied(&api, &sim, "h100-inference", Duration::from_secs(40));
    api.set_node_label(node, PROFILE_LABEL, None);
    assert!(
        api.wait_until(Duration::from_secs(20), |a| label(a, node, STATE_LABEL)
            .is_none())
    );
    std::thread::sleep(Duration::from_millis(500));
    let requests = api.requests();
    // A process signalled on a busy machine may take a moment to be scheduled and die.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let plugin_status = loop {
        match plugin.try_wait().unwrap() {
            None if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50))
            }
            status => break status,
        }
    };
    let agent_log = sim.log();
    drop(sim);
    let other_status = other_plugin.try_wait().unwrap();
    for p in [&mut plugin, &mut other_plugin] {
        let _ = p.kill();
        let _ = p.wait();
    }
    assert_eq!(
        plugin_status.and_then(|s| s.signal()),
        Some(1),
        "the plugin process got SIGHUP\n{agent_log}"
    );
    assert!(
        other_status.is_none(),
        "another pod's plugin was signalled: {other_status:?}"
    );

    // 1. Everything the agent asked for is granted to its ServiceAccount.
    let grants = grants(&objects, &namespace, &sa);
    let mut used: BTreeSet<(String, String, String, String)> = BTreeSet::new();
    let mut refused = Vec::new();
    for r in &requests {
        if r.resource.is_empty() {
            // Discovery and health paths: open to every authenticated client
            // (system:discovery), and the agent makes none today.
            assert_eq!(r.method, "GET", "{r:?}");
            continue;
        }
        let verb = verb_name(r);
        match grants.iter().find(|g| allows(g, r)) {
            Some(g) => {
                used.insert((r.group.clone(), r.resource.clone(), verb, g.from.clone()));
            }
            None => refused.push(format!(
                "{} {} {}/{} ns={:?} name={:?} query={}",
                verb, r.path, r.group, r.resource, r.namespace, r.name, r.query
            )),
        }
    }
    assert!(
        refused.is_empty(),
        "RBAC refuses requests the agent makes:\n{}",
        refused.join("\n")
    );
    // 2. Everything granted was used (or is needed outside this run, with a reason).
    let used_triples: BTreeSet<(String, String, String)> = used
        .iter()
        .map(|(g, r, v, _)| (g.clone(), r.clone(), v.clone()))
        .collect();
    let mut unused = Vec::new();
    for g in &grants {
        for group in g.rule.api_groups.iter().flatten() {
            for res in g.rule.resources.iter().flatten() {
                for verb in &g.rule.verbs {
                    let t = (group.clone(), res.clone(), verb.clone());
                    let listed = NEEDED_OUTSIDE_THE_TEST
                        .iter()
                        .any(|(lg, lr, lv, _)| (*lg, *lr, *lv) == (group, res, verb));
                    if !used_triples.contains(&t) && !listed {
                        unused.push(format!("{} {group}/{res} {verb}", g.from));
                    }
                }
            }
        }
    }
    assert!(
        unused.is_empty(),
        "granted but never used by the agent:\n{}",
        unused.join("\n")
    );
    for (g, r, v, why) in NEEDED_OUTSIDE_THE_TEST {
        assert!(
            !used_triples.contains(&(g.to_string(), r.to_string(), v.to_string())),
            "{g}/{r} {v} is used in the test now; drop it from the list ({why})"
        );
    }
    eprintln!("requests by the agent, as RBAC sees them:");
    for (g, r, v, from) in &used {
        eprintln!(
            "  {v:<7} {}/{r:<14} via {from}",
            if g.is_empty() { "core" } else { g }
        );
    }

    // 3. The admission policy admits every write the agent made to its node.
    let (policy, user) = policy_from(&objects);
    let me = agent_request(&user, Some(node));
    let mut previous = first;
    let mut agent_writes = 0;
    for n in node_updates(&api, node, &since) {
        let (old, new) = (as_admitted(&previous), as_admitted(&n));
        // The test's own label changes: only the profile label differs.
        let without_profile = |v: &Value| {
            let mut v = v.clone();
            if let Some(l) = v["metadata"]["labels"].as_object_mut() {
                l.remove(PROFILE_LABEL);
            }
            v
        };
        let test_write = without_profile(&old) == without_profile(&new);
        if !test_write {
            agent_writes += 1;
            let verdict = admit(&policy, &me, &old, &new);
            assert_eq!(
                verdict,
                Verdict::Allowed,
                "the policy refuses a node write the agent made:\nbefore {old}\nafter {new}"
            );
        }
        previous = n;
    }
    eprintln!("{agent_writes} node writes by the agent admitted by the policy");
    assert!(
        agent_writes >= 6,
        "the agent's state, cordon and uncordon writes were replayed ({agent_writes})"
    );
    // The other owners' labels and taint are as they were.
    let last = api.node(node).unwrap();
    assert_eq!(last.spec, fixture.spec);
    assert_eq!(
        label(&api, node, "nvidia.com/gpu.present").as_deref(),
        Some("true")
    );
}

// ---------------------------------------------------------------------------------------------
// The DaemonSet against the agent's flags
// ---------------------------------------------------------------------------------------------

/// The env vars `gpu-share agent --help` lists (`[env: NAME=...]`).
fn agent_env_vars() -> BTreeSet<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_gpu-share"))
        .args(["agent", "--help"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    help.match_indices("[env: ")
        .map(|(i, m)| {
            help[i + m.len()..]
                .split('=')
                .next()
                .unwrap()
                .trim_end_matches(']')
                .to_string()
        })
        .collect()
}

/// The host path behind `path` in container `c`: the deepest mount containing it, which must be
/// a hostPath volume. `None` when no mount holds it. Also says whether the mount is read-only.
fn host_path(pod: &PodSpec, c: &Container, path: &str) -> Option<(PathBuf, bool)> {
    let path = Path::new(path);
    let mount = c
        .volume_mounts
        .iter()
        .flatten()
        .filter(|m| path.starts_with(&m.mount_path))
        .max_by_key(|m| m.mount_path.len())?;
    assert!(mount.sub_path.is_none(), "{}: no subPath mounts", c.name);
    let volume = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == mount.name)
        .unwrap_or_else(|| panic!("{}: no volume {}", c.name, mount.name));
    let host = volume
        .host_path
        .as_ref()
        .unwrap_or_else(|| panic!("{}: {} is not a hostPath", c.name, mount.name));
    let rest = path.strip_prefix(&mount.mount_path).unwrap();
    Some((
        Path::new(&host.path).join(rest),
        mount.read_only.unwrap_or(false),
    ))
}

fn try_container<'a>(pod: &'a PodSpec, name: &str) -> Option<&'a Container> {
    pod.containers
        .iter()
        .chain(pod.init_containers.iter().flatten())
        .find(|c| c.name == name)
}

#[test]
fn the_daemonset_env_and_mounts_match_the_agent_flags() {
    let reads = agent_env_vars();
    for must in ["NODE_NAME", "POD_NAMESPACE", "GPU_SHARE_STATE_DIR"] {
        assert!(reads.contains(must), "agent --help lists {must}: {reads:?}");
    }
    for overlay in overlays() {
        let objects = render(&deploy().join("overlays").join(&overlay)).objects;
        let (ds, pod) = pod_spec(&objects);
        let what = |s: &str| format!("overlay {overlay}: {s}");
        let agent = container(&pod, "agent");
        let env = |name: &str| {
            env_value(agent, name).unwrap_or_else(|| panic!("{}", what(&format!("no {name}"))))
        };

        // Every env var is one the agent reads (or the NVIDIA container runtime reads).
        for e in agent.env.iter().flatten() {
            assert!(
                reads.contains(&e.name) || RUNTIME_ENV.contains(&e.name.as_str()),
                "{}",
                what(&format!(
                    "{} is not an env var `gpu-share agent` reads",
                    e.name
                ))
            );
        }
        let field = |name: &str| {
            agent
                .env
                .iter()
                .flatten()
                .find(|e| e.name == name)
                .and_then(|e| e.value_from.as_ref()?.field_ref.as_ref())
                .map(|f| f.field_path.clone())
        };
        assert_eq!(field("NODE_NAME").as_deref(), Some("spec.nodeName"));
        assert_eq!(
            field("POD_NAMESPACE").as_deref(),
            Some("metadata.namespace")
        );
        let args = agent.args.clone().unwrap_or_default();
        assert!(
            args.contains(&"agent".to_string()),
            "{}",
            what("runs `agent`")
        );

        // The names the agent is given are the objects that exist.
        let namespace = ds.metadata.namespace.clone().unwrap();
        let cm: ConfigMap = one(&objects, "ConfigMap", &env("GPU_SHARE_CONFIGMAP"));
        assert_eq!(cm.metadata.namespace.as_deref(), Some(namespace.as_str()));
        let role: Role = one(&objects, "Role", "gpu-share-agent");
        assert_eq!(role.metadata.namespace.as_deref(), Some(namespace.as_str()));
        let cm_rule = role
            .rules
            .iter()
            .flatten()
            .find(|r| r.resources.iter().flatten().any(|x| x == "configmaps"))
            .unwrap();
        assert_eq!(
            cm_rule.resource_names,
            Some(vec![env("GPU_SHARE_CONFIGMAP")])
        );
        let sa: ServiceAccount = one(&objects, "ServiceAccount", "gpu-share");
        assert_eq!(pod.service_account_name, sa.metadata.name);
        assert_eq!(sa.metadata.namespace.as_deref(), Some(namespace.as_str()));
        // The image's entrypoint is gpu-share (Dockerfile), so the pod gives only args.
        assert!(
            agent.command.is_none(),
            "{}",
            what("the image's entrypoint runs")
        );
        let dockerfile = std::fs::read_to_string(root().join("Dockerfile")).unwrap();
        assert!(dockerfile.contains(r#"ENTRYPOINT ["/usr/bin/gpu-share"]"#));
        let version = env!("CARGO_PKG_VERSION");
        assert_eq!(
            agent.image.as_deref(),
            Some(format!("gpu-share:{version}").as_str()),
            "{}",
            what("the agent image is this version")
        );

        // Every path in the agent's env is on a hostPath mount, except /proc, which is the
        // host's through hostPID.
        for e in agent.env.iter().flatten() {
            let Some(v) = e.value.as_deref().filter(|v| v.starts_with('/')) else {
                continue;
            };
            if e.name == "GPU_SHARE_PROC_ROOT" {
                assert_eq!(v, "/proc", "{}", what("the host's /proc"));
                assert_eq!(pod.host_pid, Some(true), "{}", what("hostPID"));
                assert!(host_path(&pod, agent, "/proc/1/cgroup").is_none());
            } else {
                assert!(
                    host_path(&pod, agent, v).is_some(),
                    "{}",
                    what(&format!("{}={v} is not on a host mount", e.name))
                );
            }
        }
        assert_ne!(pod.share_process_namespace, Some(true));
        // The journal is on the host (it must survive the pod), writable.
        let state = host_path(&pod, agent, &env("GPU_SHARE_STATE_DIR")).unwrap();
        assert!(!state.1, "{}", what("the state dir is writable"));
        // MPS: the plugin hands <root>/<resource>/pipe to the kubelet as a host path, so the
        // agent's MPS root is mounted at its host path.
        let mps = env("GPU_SHARE_MPS_ROOT");
        assert_eq!(
            host_path(&pod, agent, &mps),
            Some((PathBuf::from(&mps), false)),
            "{}",
            what("MPS root mounted writable at its host path")
        );
        let shm = Path::new(&mps).join("shm");
        assert_eq!(
            host_path(&pod, agent, "/dev/shm").map(|h| h.0),
            Some(shm.clone())
        );
        // The kubelet's PodResources socket is the host's, where the kubelet serves it.
        assert_eq!(
            host_path(&pod, agent, &env("GPU_SHARE_POD_RESOURCES_SOCKET")).map(|h| h.0),
            Some(PathBuf::from(
                gpu_share::kubelet::pod_resources::DEFAULT_SOCKET
            )),
            "{}",
            what("the PodResources socket at the kubelet's path")
        );
        env("GPU_SHARE_MAX_DRAINS").parse::<u32>().unwrap();
        gpu_share::duration::secs_or_duration(&env("GPU_SHARE_DRAIN_TIMEOUT")).unwrap();

        // Something advertises what the agent configures: NVIDIA's plugin beside it, or the
        // agent's built-in plugin.
        let plugin_kind = env_value(agent, "GPU_SHARE_PLUGIN");
        let builtin = plugin_kind.as_deref() == Some("builtin");
        let dra = plugin_kind.as_deref() == Some("dra");
        match try_container(&pod, "device-plugin") {
            Some(plugin) => {
                assert!(!builtin && !dra, "{}", what("one device plugin, not two"));
                // The file the agent writes is the file the plugin reads and the bootstrap
                // creates: one host file, outliving the pod; only the plugin mounts it read-only.
                let written = host_path(&pod, agent, &env("GPU_SHARE_PLUGIN_CONFIG")).unwrap();
                let read =
                    host_path(&pod, plugin, &env_value(plugin, "CONFIG_FILE").unwrap()).unwrap();
                let boot = container(&pod, "plugin-config-bootstrap");
                let boot_file = env_value(boot, "GPU_SHARE_PLUGIN_CONFIG").unwrap();
                let booted = host_path(&pod, boot, &boot_file).unwrap();
                assert_eq!(
                    boot.image,
                    agent.image,
                    "{}",
                    what("the bootstrap is the agent's image")
                );
                // Its args, run by this build, create the empty file the plugin needs.
                let dir = tempfile::tempdir().unwrap();
                let file = dir.path().join("device-plugin/config.yaml");
                let run = Command::new(gpu_share_bin())
                    .args(boot.args.iter().flatten())
                    .env("GPU_SHARE_PLUGIN_CONFIG", &file)
                    .output()
                    .unwrap();
                assert!(run.status.success(), "{}", node_sim::text(&run));
                assert_eq!(
                    std::fs::read(&file).unwrap(),
                    b"",
                    "{}",
                    what("an empty config")
                );
                assert_eq!(
                    written.0,
                    read.0,
                    "{}",
                    what("the agent writes what the plugin reads")
                );
                assert_eq!(
                    written.0,
                    booted.0,
                    "{}",
                    what("the bootstrap creates that file")
                );
                assert!(!written.1 && !booted.1 && read.1, "{}", what("mount modes"));
                // Reloaded by SIGHUP to its argv[0], under the host's /proc.
                assert_eq!(env("GPU_SHARE_PLUGIN_RELOAD"), "signal");
                let argv0 = plugin.command.as_ref().unwrap()[0].clone();
                assert_eq!(
                    argv0.rsplit('/').next(),
                    Some(env("GPU_SHARE_PLUGIN_PROCESS").as_str()),
                    "{}",
                    what("the agent finds the plugin by its argv[0]")
                );
                // The plugin sees the agent's MPS daemons at /mps, and the same /dev/shm.
                assert_eq!(
                    host_path(&pod, plugin, "/mps").map(|h| h.0),
                    Some(PathBuf::from(&mps))
                );
                assert_eq!(host_path(&pod, plugin, "/dev/shm").map(|h| h.0), Some(shm));
                assert_eq!(
                    host_path(&pod, plugin, "/var/lib/kubelet/device-plugins/kubelet.sock")
                        .map(|h| h.0),
                    Some(PathBuf::from(
                        "/var/lib/kubelet/device-plugins/kubelet.sock"
                    ))
                );
                // Env vars would override the config file the agent writes.
                for e in plugin.env.iter().flatten() {
                    assert!(
                        ["CONFIG_FILE"].contains(&e.name.as_str()) || e.name.starts_with("NVIDIA_"),
                        "{}",
                        what(&format!(
                            "plugin env {} overrides the agent's config",
                            e.name
                        ))
                    );
                }
            }
            // DRA: the agent publishes ResourceSlices and is the kubelet's DRA plugin.
            None if dra => dra::check_kubelet_plugin_mounts(&pod, agent, &what),
            None => {
                assert!(builtin, "{}", what("no device plugin advertises the GPUs"));
                let dir = env("GPU_SHARE_DEVICE_PLUGIN_DIR");
                assert_eq!(
                    host_path(&pod, agent, &dir),
                    Some((PathBuf::from(&dir), false)),
                    "{}",
                    what("the kubelet's device-plugin directory at its host path")
                );
            }
        }

        // Health and metrics on the port the agent listens on.
        let port: i32 = env("GPU_SHARE_LISTEN")
            .rsplit(':')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        let metrics = agent
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some("metrics"))
            .unwrap();
        assert_eq!(metrics.container_port, port);
        for (probe, path) in [
            (&agent.liveness_probe, "/healthz"),
            (&agent.readiness_probe, "/readyz"),
        ] {
            let get = probe.as_ref().unwrap().http_get.as_ref().unwrap();
            assert_eq!(get.path.as_deref(), Some(path));
            assert_eq!(serde_json::to_value(&get.port).unwrap(), json!("metrics"));
        }
        let svc: Service = one(&objects, "Service", "gpu-share-metrics");
        let sport = &svc.spec.as_ref().unwrap().ports.as_ref().unwrap()[0];
        assert_eq!(sport.port, port);
        assert_eq!(
            serde_json::to_value(&sport.target_port).unwrap(),
            json!("metrics")
        );
        assert_eq!(
            svc.spec.as_ref().unwrap().selector,
            ds.spec.as_ref().unwrap().selector.match_labels
        );
        // A not-ready agent (its /readyz says why) is still scraped.
        assert_eq!(
            svc.spec.as_ref().unwrap().publish_not_ready_addresses,
            Some(true),
            "{}",
            what("the metrics Service keeps not-ready agents")
        );

        // What a GPU node agent needs of its pod.
        assert_eq!(
            agent.security_context.as_ref().unwrap().privileged,
            Some(true),
            "{}",
            what("MIG needs a privileged agent")
        );
        assert_eq!(
            pod.priority_class_name.as_deref(),
            Some("system-node-critical")
        );
        assert!(pod
            .node_selector
            .as_ref()
            .unwrap()
            .contains_key("nvidia.com/gpu.present"));
        assert!(pod
            .tolerations
            .iter()
            .flatten()
            .any(|t| t.key.as_deref() == Some("nvidia.com/gpu")));
        // Every volume is mounted somewhere.
        for v in pod.volumes.iter().flatten() {
            let used = pod
                .containers
                .iter()
                .chain(pod.init_containers.iter().flatten())
                .flat_map(|c| c.volume_mounts.iter().flatten())
                .any(|m| m.name == v.name);
            assert!(
                used,
                "{}",
                what(&format!("volume {} is not mounted", v.name))
            );
        }
    }
    // The GPU Operator overlay waits for the operator's validation before anything starts.
    let objects = render(&deploy().join("overlays/gpu-operator")).objects;
    let (_, pod) = pod_spec(&objects);
    assert_eq!(
        pod.init_containers.as_ref().unwrap()[0].name,
        "wait-for-nvidia-toolkit"
    );
}

/// The env vars `gpu-share <args> --help` lists (`[env: NAME=...]`); the args must parse.
fn help_env_vars(args: &[String]) -> BTreeSet<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_gpu-share"))
        .args(args)
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "gpu-share {} --help: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    help.match_indices("[env: ")
        .map(|(i, m)| help[i + m.len()..].split('=').next().unwrap().to_string())
        .collect()
}

/// The `mount-shm` init container of `overlay`'s pod, and the agent's /dev/shm on its tmpfs.
fn check_mount_shm(overlay: &str, pod: &PodSpec) {
    let agent = container(pod, "agent");
    let init = container(pod, "mount-shm");
    assert!(
        pod.init_containers
            .iter()
            .flatten()
            .any(|c| c.name == "mount-shm"),
        "{overlay}: mount-shm is an init container: the tmpfs is there before the agent starts MPS"
    );

    // It runs the agent's image (one `kustomize edit set image` changes both), whose entrypoint
    // is gpu-share; `gpu-share <args>` is a command that exists and reads the env it is given.
    assert_eq!(init.image, agent.image);
    assert!(init.command.is_none(), "the image's entrypoint runs");
    let args = init.args.clone().unwrap();
    assert_eq!(args[..2], ["mps", "mount-shm"]);
    let reads = help_env_vars(&args);
    for e in init.env.iter().flatten() {
        assert!(
            reads.contains(&e.name),
            "{} is not an env var `gpu-share {}` reads: {reads:?}",
            e.name,
            args.join(" ")
        );
    }
    // The MPS root is the agent's, mounted at its host path, Bidirectional (so the tmpfs appears
    // on the host and in the agent's mounts), which Kubernetes allows only when privileged;
    // mounting needs CAP_SYS_ADMIN anyway.
    let root = env_value(init, "GPU_SHARE_MPS_ROOT").unwrap();
    assert_eq!(
        env_value(agent, "GPU_SHARE_MPS_ROOT").as_deref(),
        Some(&*root)
    );
    assert_eq!(
        host_path(pod, init, &root),
        Some((PathBuf::from(&root), false))
    );
    let mount_of = |c: &Container, at: &str| {
        c.volume_mounts
            .iter()
            .flatten()
            .find(|m| m.mount_path == at)
            .unwrap_or_else(|| panic!("{}: nothing mounted at {at}", c.name))
            .clone()
    };
    assert_eq!(
        mount_of(init, &root).mount_propagation.as_deref(),
        Some("Bidirectional")
    );
    assert_eq!(
        init.security_context.as_ref().unwrap().privileged,
        Some(true)
    );

    // The agent's /dev/shm, where the MPS daemons it starts talk to their clients, is that
    // tmpfs's host directory, following mounts made on the host.
    let shm = Path::new(&root).join("shm");
    assert_eq!(
        host_path(pod, agent, "/dev/shm"),
        Some((shm.clone(), false))
    );
    assert_eq!(
        mount_of(agent, "/dev/shm").mount_propagation.as_deref(),
        Some("HostToContainer")
    );
}

#[test]
fn every_overlay_mounts_the_tmpfs_the_agent_and_mps_clients_share_as_dev_shm() {
    // The agent runs the MPS daemons with either device plugin, so every overlay has it.
    for overlay in overlays() {
        let objects = render(&deploy().join("overlays").join(&overlay)).objects;
        let (_, pod) = pod_spec(&objects);
        check_mount_shm(&overlay, &pod);
    }
}

/// The init container's command, run for real in a private mount namespace with its MPS root
/// moved into a temporary directory: it mounts the tmpfs, and a second run (a restarted pod)
/// leaves it alone.
#[test]
#[cfg_attr(
    no_mount_namespace,
    ignore = "unshare --mount is refused here (needs root): the init container's mount is not exercised"
)]
fn the_mount_shm_init_container_mounts_the_tmpfs_once() {
    let overlay = overlays().pop().expect("overlays");
    let (_, pod) = pod_spec(&render(&deploy().join("overlays").join(&overlay)).objects);
    let init = container(&pod, "mount-shm");
    let args = init.args.clone().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let script = r#"set -e
"$0" "$@"
"$0" "$@"
grep " $GPU_SHARE_MPS_ROOT/shm " /proc/self/mountinfo"#;
    let mut cmd = Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "sh", "-c", script])
        .arg(env!("CARGO_BIN_EXE_gpu-share"))
        .args(&args);
    for e in init.env.iter().flatten() {
        cmd.env(&e.name, e.value.as_deref().unwrap_or_default());
    }
    let out = cmd.env("GPU_SHARE_MPS_ROOT", dir.path()).output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = said.lines().collect();
    assert!(lines[0].starts_with("mounted a tmpfs at"), "{said}");
    assert!(lines[1].contains("already a mount point"), "{said}");
    assert!(
        lines[2].contains(" - tmpfs shm ") && lines[2].contains("nosuid,nodev,noexec"),
        "{said}"
    );
    assert_eq!(lines.len(), 3, "one tmpfs, not two: {said}");
}

#[test]
fn the_runtime_class_ships_where_no_gpu_operator_brings_it() {
    for overlay in overlays() {
        let objects = render(&deploy().join("overlays").join(&overlay)).objects;
        let (_, pod) = pod_spec(&objects);
        let classes: Vec<RuntimeClass> = all(&objects, "RuntimeClass");
        if overlay == "gpu-operator" {
            assert!(classes.is_empty(), "the GPU Operator creates its own");
            continue;
        }
        assert_eq!(classes.len(), 1, "{overlay}: one RuntimeClass");
        assert_eq!(
            classes[0].metadata.name, pod.runtime_class_name,
            "{overlay}: the pod's RuntimeClass"
        );
        assert_eq!(classes[0].handler, "nvidia", "{overlay}");
    }
}

// ---------------------------------------------------------------------------------------------
// The profiles ConfigMap
// ---------------------------------------------------------------------------------------------

fn validate(path: &Path) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_gpu-share"))
        .arg("validate")
        .arg(path)
        .output()
        .unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn every_profile_in_the_configmap_validates_and_is_the_example_it_copies() {
    let r = render(&deploy().join("base"));
    let mut keys = BTreeSet::new();
    for (cm, key, file) in &r.generated_from {
        assert_eq!(cm, "gpu-share-profiles");
        let (ok, out) = validate(file);
        assert!(
            ok,
            "{key} ({}): gpu-share validate fails:\n{out}",
            file.display()
        );
        let example = root().join("profiles").join(format!("{key}.yaml"));
        assert_eq!(
            std::fs::read(file).unwrap(),
            std::fs::read(&example).unwrap_or_default(),
            "{} must be a copy of {}",
            file.display(),
            example.display()
        );
        keys.insert(key.clone());
    }
    // Every example profile is in the ConfigMap.
    let mut examples = BTreeSet::new();
    for e in std::fs::read_dir(root().join("profiles")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().and_then(|e| e.to_str()) == Some("yaml") {
            examples.insert(p.file_stem().unwrap().to_string_lossy().to_string());
        }
    }
    assert_eq!(
        keys, examples,
        "the ConfigMap holds every example in profiles/"
    );
    // The ConfigMap as rendered, as one manifest.
    let dir = tempfile::tempdir().unwrap();
    let cm = r.objects.iter().find(|o| o["kind"] == "ConfigMap").unwrap();
    let file = dir.path().join("configmap.yaml");
    std::fs::write(&file, serde_yaml::to_string(cm).unwrap()).unwrap();
    let (ok, out) = validate(&file);
    assert!(ok, "the rendered ConfigMap does not validate:\n{out}");
}

/// The README's "Install on a real cluster" kustomization: its `images:` entry must name the
/// image the manifests use (name and tag), or `kubectl kustomize` would silently leave the
/// agent on `gpu-share:0.1.0`, an image the user never pushed.
#[test]
fn the_readme_install_kustomization_retargets_every_gpu_share_image() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let snippet = readme
        .split_once("cat > deploy/my-cluster/kustomization.yaml <<'EOF'\n")
        .and_then(|(_, rest)| rest.split_once("\nEOF\n"))
        .map(|(s, _)| s)
        .expect("README: the install section's kustomization heredoc");
    let k = yaml_docs_in(snippet, "README kustomization").remove(0);
    let image = &k["images"][0];
    let (name, tag) = (
        image["name"].as_str().expect("images[0].name"),
        image["newTag"].as_str().expect("images[0].newTag"),
    );
    let ours = format!("{name}:{tag}");
    for overlay in overlays() {
        let images = agent_pod_images(&render(&deploy().join("overlays").join(&overlay)).objects);
        assert!(images.contains(&ours), "{overlay}: no {ours} in {images:?}");
        for i in &images {
            let repository = i.rsplit_once(':').map_or(i.as_str(), |(r, _)| r);
            assert!(
                i == &ours || repository != name,
                "{overlay}: image {i} is gpu-share's but not {ours}, which the README retargets"
            );
        }
    }
}

/// docs/homelab.md's overlay, rendered by `kubectl kustomize` over the standalone overlay as
/// the page lays it out: the container it names by index is NVIDIA's plugin, which gets
/// `CONTAINER_DRIVER_ROOT=/`, and the volumes it names by index are the kubelet's
/// (pod-resources, device-plugins), and both move.
#[test]
#[cfg_attr(
    no_kubectl,
    ignore = "kubectl is not installed here: the overlay in docs/homelab.md is not rendered"
)]
fn the_homelab_overlay_patches_what_it_says() {
    let page = std::fs::read_to_string(root().join("docs/homelab.md")).unwrap();
    let start = "```yaml\n# my-homelab/kustomization.yaml\n";
    let block = page
        .split(start)
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("docs/homelab.md has the my-homelab kustomization");
    // Laid out as the page says: my-homelab/ beside a gpu-share checkout (kustomize takes
    // no absolute path to a base), the block written verbatim.
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(root(), dir.path().join("gpu-share")).unwrap();
    let overlay = dir.path().join("my-homelab");
    std::fs::create_dir(&overlay).unwrap();
    std::fs::write(overlay.join("kustomization.yaml"), block).unwrap();
    let rendered = kubectl_kustomize(&overlay);
    let daemonset = rendered
        .values()
        .find(|o| o["kind"] == "DaemonSet")
        .expect("a DaemonSet");
    let plugin = &daemonset["spec"]["template"]["spec"]["containers"][1];
    assert_eq!(plugin["name"], "device-plugin");
    assert!(
        plugin["env"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["name"] == "CONTAINER_DRIVER_ROOT" && e["value"] == "/"),
        "{plugin}"
    );
    let volumes = daemonset["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .unwrap();
    let path_of = |name: &str| {
        volumes
            .iter()
            .find(|v| v["name"] == name)
            .map(|v| v["hostPath"]["path"].clone())
    };
    assert_eq!(
        path_of("pod-resources"),
        Some("/var/lib/rancher/k3s/agent/kubelet/pod-resources".into())
    );
    assert_eq!(
        path_of("device-plugins"),
        Some("/var/lib/rancher/k3s/agent/kubelet/device-plugins".into())
    );
}
