//! deploy/components/autopilot: the autopilot's Deployment, RBAC and admission policies
//! against its contract (the lead's autopilot spec, mirrored in docs/autopilot.md):
//! flags and env, the requests it makes, the writes it may make.
//!
//! RBAC is checked twice: here against the contract's list of requests ([`contract_requests`]),
//! and in `autopilot_run.rs` by running `gpu-share autopilot` as deployed against the API
//! double, as the agent's test does.

use super::*;

/// The ServiceAccount the autopilot runs as (its Deployment's, checked below).
pub(super) const SA: &str = "gpu-share-autopilot";
pub(super) const NS: &str = "gpu-share";
pub(super) const PROFILES: &str = "gpu-share-profiles";
pub(super) const STATUS: &str = "gpu-share-autopilot-status";
pub(super) const LEASE: &str = "gpu-share-autopilot";
pub(super) const OPT_IN: &str = "gpu-share.dev/autopilot";

fn component() -> PathBuf {
    deploy().join("components/autopilot")
}

/// `overlay` with the autopilot component added, as a user's kustomization does
/// (`resources: [overlay]`, `components: [autopilot]`).
pub(super) fn render_with_autopilot(overlay: &str) -> Rendered {
    let mut r = render(&deploy().join("overlays").join(overlay));
    render_into(&component(), &mut r);
    r
}

/// The same through `kubectl kustomize`, from a kustomization in a temporary directory that
/// names both by relative paths (kustomize refuses nothing else there).
pub(super) fn kubectl_kustomize_with_autopilot(overlay: &str) -> BTreeMap<String, Value> {
    let dir = tempfile::tempdir().unwrap();
    let rel = |p: PathBuf| relative_from(dir.path(), &p);
    std::fs::write(
        dir.path().join("kustomization.yaml"),
        format!(
            "resources: [{}]\ncomponents: [{}]\n",
            rel(deploy().join("overlays").join(overlay)),
            rel(component())
        ),
    )
    .unwrap();
    kubectl_kustomize(dir.path())
}

pub(super) fn deployment(objects: &[Value]) -> (Deployment, PodSpec) {
    let d: Deployment = one(objects, "Deployment", "gpu-share-autopilot");
    let pod = d.spec.clone().unwrap().template.spec.unwrap();
    (d, pod)
}

/// One Deployment, one replica (the Lease makes a second one wait anyway), dry-run by default,
/// the agent's image, no privileges, and the env the contract names.
#[test]
fn the_autopilot_deployment_runs_dry_run_unprivileged_with_the_contracts_env() {
    for overlay in overlays() {
        let objects = render_with_autopilot(&overlay).objects;
        let what = |s: &str| format!("overlay {overlay} + autopilot: {s}");
        let (d, pod) = deployment(&objects);
        assert_eq!(d.metadata.namespace.as_deref(), Some(NS));
        assert_eq!(d.spec.as_ref().unwrap().replicas, Some(1));
        assert_eq!(pod.service_account_name.as_deref(), Some(SA));
        let sa: ServiceAccount = one(&objects, "ServiceAccount", SA);
        assert_eq!(sa.metadata.namespace.as_deref(), Some(NS));
        assert_eq!(pod.containers.len(), 1);
        let c = &pod.containers[0];
        let args = c.args.clone().unwrap();
        let at = args
            .iter()
            .position(|a| a == "autopilot")
            .expect("runs `autopilot`");
        assert!(
            args[at + 1..].contains(&"--dry-run".to_string()),
            "{}",
            what("dry-run by default")
        );
        assert!(
            c.command.is_none(),
            "{}",
            what("the image's entrypoint runs")
        );
        // The agent's image: one `images:` entry retargets both (README's install section).
        let (_, agent_pod) = pod_spec(&objects);
        assert_eq!(
            c.image,
            container(&agent_pod, "agent").image,
            "{}",
            what("image")
        );
        // Nothing of the node: no privileges, no host access.
        let sc = c.security_context.as_ref().unwrap();
        assert_eq!(sc.privileged, None);
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        assert_eq!(
            sc.capabilities.as_ref().unwrap().drop,
            Some(vec!["ALL".to_string()])
        );
        assert_eq!(
            pod.security_context.as_ref().unwrap().run_as_non_root,
            Some(true)
        );
        assert!(pod.host_pid.is_none() && pod.host_network.is_none());
        assert!(pod.volumes.is_none(), "{}", what("no volumes"));
        // The contract's env: namespace and identity from the downward API, the plugin the
        // agents run, and the fleet drain budget the agents enforce.
        let field = |name: &str| {
            c.env
                .iter()
                .flatten()
                .find(|e| e.name == name)
                .and_then(|e| e.value_from.as_ref()?.field_ref.as_ref())
                .map(|f| f.field_path.clone())
        };
        assert_eq!(
            field("POD_NAMESPACE").as_deref(),
            Some("metadata.namespace")
        );
        assert_eq!(field("POD_NAME").as_deref(), Some("metadata.name"));
        let names: BTreeSet<&str> = c.env.iter().flatten().map(|e| e.name.as_str()).collect();
        assert_eq!(
            names,
            BTreeSet::from(["POD_NAMESPACE", "POD_NAME", "GPU_SHARE_MAX_DRAINS"]),
            "{}",
            what("the env vars the autopilot's contract names")
        );
        let agent = container(&agent_pod, "agent");
        assert_eq!(
            env_value(c, "GPU_SHARE_MAX_DRAINS"),
            env_value(agent, "GPU_SHARE_MAX_DRAINS"),
            "{}",
            what("the autopilot's drain budget is the agents'")
        );
        // No plugin named: the autopilot follows the plugin the agents publish on their nodes,
        // whichever overlay it is added to (tests/autopilot.rs runs it so on a builtin node).
        assert_eq!(env_value(c, "GPU_SHARE_PLUGIN"), None);
    }
}

/// The component renders on every overlay and adds only the autopilot's objects.
#[test]
fn the_autopilot_component_renders_on_every_overlay() {
    for overlay in overlays() {
        let alone = keyed(&render(&deploy().join("overlays").join(&overlay)).objects);
        let r = render_with_autopilot(&overlay);
        for o in &r.objects {
            typed_check(o, &format!("overlay {overlay} + autopilot"));
        }
        let with = keyed(&r.objects);
        let added: BTreeSet<&String> = with.keys().filter(|k| !alone.contains_key(*k)).collect();
        let want: BTreeSet<String> = [
            "ServiceAccount/gpu-share/gpu-share-autopilot",
            "ClusterRole//gpu-share-autopilot",
            "ClusterRoleBinding//gpu-share-autopilot",
            "Role/gpu-share/gpu-share-autopilot",
            "RoleBinding/gpu-share/gpu-share-autopilot",
            "Role/default/gpu-share-autopilot-events",
            "RoleBinding/default/gpu-share-autopilot-events",
            "Deployment/gpu-share/gpu-share-autopilot",
            "ValidatingAdmissionPolicy//gpu-share-autopilot-nodes",
            "ValidatingAdmissionPolicyBinding//gpu-share-autopilot-nodes",
            "ValidatingAdmissionPolicy//gpu-share-autopilot-configmaps",
            "ValidatingAdmissionPolicyBinding//gpu-share-autopilot-configmaps",
            "ValidatingAdmissionPolicy//gpu-share-autopilot-leases",
            "ValidatingAdmissionPolicyBinding//gpu-share-autopilot-leases",
        ]
        .into_iter()
        .map(String::from)
        .collect();
        assert_eq!(
            added,
            want.iter().collect(),
            "{overlay}: what the component adds"
        );
        for (key, o) in &alone {
            assert_eq!(&with[key], o, "{overlay}: the component changes {key}");
        }
    }
}

/// The component on every overlay as `kubectl kustomize` renders it.
#[test]
#[cfg_attr(
    no_kubectl,
    ignore = "kubectl is not installed here: the autopilot component is checked with this file's renderer only"
)]
fn the_autopilot_component_renders_on_every_overlay_as_kubectl_kustomize_does() {
    for overlay in overlays() {
        let ours = keyed(&render_with_autopilot(&overlay).objects);
        assert_renders_alike(
            &format!("{overlay} + autopilot"),
            &kubectl_kustomize_with_autopilot(&overlay),
            &ours,
        );
    }
}

// ---------------------------------------------------------------------------------------------
// RBAC
// ---------------------------------------------------------------------------------------------

fn named(r: RequestRecord, name: &str) -> RequestRecord {
    RequestRecord {
        name: Some(name.to_string()),
        ..r
    }
}

fn selecting(r: RequestRecord, name: &str) -> RequestRecord {
    RequestRecord {
        query: format!("watch=true&fieldSelector=metadata.name%3D{name}"),
        ..r
    }
}

/// Every request the autopilot's contract says it makes, as the apiserver's RBAC sees them.
fn contract_requests() -> Vec<(RequestRecord, &'static str)> {
    use kube_double::Verb::*;
    let core = |verb, resource: &str, ns: Option<&str>| request(verb, "", resource, ns);
    let lease = |verb| request(verb, "coordination.k8s.io", "leases", Some(NS));
    let event = |verb| request(verb, "events.k8s.io", "events", Some("default"));
    vec![
        (core(List, "nodes", None), "supply: GPU nodes"),
        (
            core(Watch, "nodes", None),
            "supply changes, settled state labels",
        ),
        (
            named(core(Patch, "nodes", None), "gpu-1"),
            "the profile label",
        ),
        (core(List, "pods", None), "demand: pods cluster-wide"),
        (core(Watch, "pods", None), "demand changes (debounced)"),
        (
            request(List, "policy", "poddisruptionbudgets", None),
            "PDBs",
        ),
        (
            request(Watch, "policy", "poddisruptionbudgets", None),
            "PDB changes",
        ),
        (
            named(core(Get, "configmaps", Some(NS)), PROFILES),
            "the profiles nodes run",
        ),
        (
            named(core(Patch, "configmaps", Some(NS)), PROFILES),
            "its advised-<node> keys",
        ),
        (
            named(core(Patch, "configmaps", Some(NS)), STATUS),
            "status ConfigMap",
        ),
        (
            core(Create, "configmaps", Some(NS)),
            "status ConfigMap, first time",
        ),
        (
            named(lease(Get), "gpu-share-drain-0"),
            "fleet budget in use",
        ),
        (lease(List), "fleet budget in use"),
        (named(lease(Get), LEASE), "its own Lease"),
        (lease(Create), "its own Lease, first time"),
        (named(lease(Update), LEASE), "take and renew its Lease"),
        (event(Create), "ProfileProposed Events on Nodes"),
        (event(Patch), "a repeated Event's series"),
    ]
}

/// Every request of the contract is allowed, every grant is used by one of them, and what the
/// autopilot must never do is refused: RBAC exactly as needed.
#[test]
fn autopilot_rbac_grants_exactly_the_requests_of_its_contract() {
    use kube_double::Verb::*;
    let objects = render_with_autopilot("standalone").objects;
    let grants = grants(&objects, NS, SA);
    let mut used = BTreeSet::new();
    for (r, why) in contract_requests() {
        assert!(
            grants.iter().any(|g| allows(g, &r)),
            "RBAC refuses the autopilot's {why}: {r:?}"
        );
        used.insert((r.group.clone(), r.resource.clone(), verb_name(&r)));
    }
    let mut unused = Vec::new();
    for g in &grants {
        for group in g.rule.api_groups.iter().flatten() {
            for res in g.rule.resources.iter().flatten() {
                for verb in &g.rule.verbs {
                    if !used.contains(&(group.clone(), res.clone(), verb.clone())) {
                        unused.push(format!("{} {group}/{res} {verb}", g.from));
                    }
                }
            }
        }
    }
    assert!(
        unused.is_empty(),
        "granted but not in the autopilot's contract:\n{}",
        unused.join("\n")
    );
    let core = |verb, resource: &str, ns: Option<&str>| request(verb, "", resource, ns);
    let lease = |verb| request(verb, "coordination.k8s.io", "leases", Some(NS));
    let refused = [
        // The agents evict and cordon; the autopilot only labels.
        core(Create, "pods/eviction", Some("ml")),
        core(Delete, "pods", Some("ml")),
        core(Update, "nodes", None),
        core(Patch, "nodes/status", None),
        core(Delete, "nodes", None),
        core(Get, "secrets", Some(NS)),
        // No other ConfigMap, and not these by delete or update.
        named(core(Patch, "configmaps", Some(NS)), "kube-root-ca.crt"),
        named(core(Get, "configmaps", Some(NS)), "kube-root-ca.crt"),
        core(Watch, "configmaps", Some(NS)),
        selecting(core(Watch, "configmaps", Some(NS)), PROFILES),
        named(core(Get, "configmaps", Some(NS)), STATUS),
        named(core(Delete, "configmaps", Some(NS)), PROFILES),
        named(core(Patch, "configmaps", Some("kube-system")), PROFILES),
        // Never an agent's drain slot.
        named(lease(Update), "gpu-share-drain-0"),
        named(lease(Delete), LEASE),
        request(Create, "coordination.k8s.io", "leases", Some("kube-system")),
        // Events only where Node events go, only events.k8s.io.
        request(Create, "events.k8s.io", "events", Some("ml")),
        core(Create, "events", Some("default")),
        // Nothing of DRA.
        request(Create, "resource.k8s.io", "resourceslices", None),
    ];
    for r in &refused {
        assert!(
            !grants.iter().any(|g| allows(g, r)),
            "granted to the autopilot but should not be: {r:?}"
        );
    }
    // The agent's ServiceAccount gains nothing from the component.
    let alone = render(&deploy().join("overlays/standalone")).objects;
    assert_eq!(
        super::grants(&objects, NS, "gpu-share").len(),
        super::grants(&alone, NS, "gpu-share").len()
    );
}

// ---------------------------------------------------------------------------------------------
// The admission policies
// ---------------------------------------------------------------------------------------------

/// The ValidatingAdmissionPolicy `name`, bound with Deny, failing closed.
pub(super) fn bound_policy(objects: &[Value], name: &str) -> (ValidatingAdmissionPolicy, Policy) {
    let vap: ValidatingAdmissionPolicy = one(objects, "ValidatingAdmissionPolicy", name);
    let binding: ValidatingAdmissionPolicyBinding =
        one(objects, "ValidatingAdmissionPolicyBinding", name);
    let bspec = binding.spec.unwrap();
    assert_eq!(bspec.policy_name.as_deref(), Some(name));
    assert_eq!(bspec.validation_actions, Some(vec!["Deny".to_string()]));
    assert_eq!(
        vap.spec.as_ref().unwrap().failure_policy.as_deref(),
        Some("Fail")
    );
    let p = load_policy(&vap);
    (vap, p)
}

/// The (group, resource, operations) a policy matches.
pub(super) fn matched(vap: &ValidatingAdmissionPolicy) -> Vec<(String, String, Vec<String>)> {
    let spec = vap.spec.as_ref().unwrap();
    let rules = spec
        .match_constraints
        .as_ref()
        .unwrap()
        .resource_rules
        .clone();
    rules
        .unwrap()
        .into_iter()
        .flat_map(|r| {
            let ops = r.operations.clone().unwrap();
            let groups = r.api_groups.clone().unwrap();
            r.resources
                .clone()
                .unwrap()
                .into_iter()
                .flat_map(move |res| {
                    let ops = ops.clone();
                    groups
                        .clone()
                        .into_iter()
                        .map(move |g| (g, res.clone(), ops.clone()))
                })
        })
        .collect()
}

pub(super) fn user_request(user: &str, operation: &str, node: Option<&str>) -> Value {
    let mut r = agent_request(user, node);
    r["operation"] = json!(operation);
    r
}

/// `check(what, policy, request, old, new, want)`: `want` is "allow", "not matched" or
/// "deny: <part of the message>".
pub(super) fn expect(
    what: &str,
    policy: &Policy,
    request: &Value,
    old: &Value,
    new: &Value,
    want: &str,
) {
    let got = admit(policy, request, old, new);
    let ok = match (&got, want) {
        (Verdict::Allowed, "allow") | (Verdict::NotMatched, "not matched") => true,
        (Verdict::Denied(why), w) => {
            w.starts_with("deny: ") && why.iter().any(|m| m.contains(&w["deny: ".len()..]))
        }
        _ => false,
    };
    assert!(ok, "{what}: wanted {want}, got {got:?}");
}

fn opted_in(name: &str) -> Value {
    let mut n = node_fixture(name);
    n["metadata"]["labels"][OPT_IN] = json!("enabled");
    n
}

fn edited(old: &Value, edit: impl Fn(&mut Value)) -> Value {
    let mut new = old.clone();
    edit(&mut new);
    new
}

fn set_label(key: &'static str, value: &'static str) -> impl Fn(&mut Value) {
    move |n: &mut Value| n["metadata"]["labels"][key] = json!(value)
}

fn remove_label(key: &'static str) -> impl Fn(&mut Value) {
    move |n: &mut Value| {
        n["metadata"]["labels"].as_object_mut().unwrap().remove(key);
    }
}

#[test]
fn the_node_policy_lets_the_autopilot_set_only_its_advised_profile_on_opted_in_nodes() {
    let objects = render_with_autopilot("standalone").objects;
    let (vap, policy) = bound_policy(&objects, "gpu-share-autopilot-nodes");
    assert_eq!(
        matched(&vap),
        [(
            String::new(),
            "nodes".to_string(),
            vec!["UPDATE".to_string()]
        )]
    );
    let user = format!("system:serviceaccount:{NS}:{SA}");
    // The autopilot's token is not bound to a node (a Deployment's pod on any node): the policy
    // must not depend on it.
    let me = user_request(&user, "UPDATE", Some("cpu-node-3"));
    let old = opted_in("gpu-1");
    let check = |what: &str, old: &Value, new: &Value, want: &str| {
        expect(what, &policy, &me, old, new, want)
    };
    let profile = |v: &'static str| set_label(PROFILE_LABEL, v);

    // What it does: a hand-written profile replaced by the node's advised key, a new advised
    // profile under the same key (the label does not change), the label removed again.
    let advised = edited(&old, profile("advised-gpu-1"));
    check("hand-written → advised-gpu-1", &old, &advised, "allow");
    check("advised-gpu-1 unchanged", &advised, &advised, "allow");
    check(
        "no label → advised-gpu-1",
        &edited(&old, remove_label(PROFILE_LABEL)),
        &advised,
        "allow",
    );
    check(
        "advised-gpu-1 → no label",
        &advised,
        &edited(&advised, remove_label(PROFILE_LABEL)),
        "allow",
    );

    // What it must not do.
    check(
        "a node not opted in",
        &node_fixture("gpu-1"),
        &edited(&node_fixture("gpu-1"), profile("advised-gpu-1")),
        "deny: only nodes labelled gpu-share.dev/autopilot=enabled, not gpu-1",
    );
    check(
        "opting a node in itself",
        &node_fixture("gpu-1"),
        &edited(&node_fixture("gpu-1"), set_label(OPT_IN, "enabled")),
        "deny: only nodes labelled gpu-share.dev/autopilot=enabled",
    );
    check(
        "opting a node out",
        &old,
        &edited(&old, remove_label(OPT_IN)),
        "deny: only the label gpu-share.dev/profile",
    );
    check(
        "a hand-written profile",
        &old,
        &edited(&old, profile("exclusive")),
        "deny: only to advised-gpu-1, not exclusive",
    );
    check(
        "another node's advised profile",
        &old,
        &edited(&old, profile("advised-gpu-2")),
        "deny: only to advised-gpu-1, not advised-gpu-2",
    );
    check(
        "removing a hand-written profile",
        &old,
        &edited(&old, remove_label(PROFILE_LABEL)),
        "deny: not remove it from h100-inference",
    );
    check(
        "advised → hand-written",
        &advised,
        &edited(&advised, profile("h100-inference")),
        "deny: not h100-inference",
    );
    check(
        "the agent's state label",
        &old,
        &edited(&old, set_label(STATE_LABEL, "pending")),
        "deny: only the label gpu-share.dev/profile",
    );
    check(
        "another label beside the profile",
        &old,
        &edited(
            &edited(&old, profile("advised-gpu-1")),
            set_label("team", "ml"),
        ),
        "deny: only the label gpu-share.dev/profile",
    );
    check(
        "removing someone else's label",
        &old,
        &edited(&old, remove_label("kubernetes.io/hostname")),
        "deny: only the label gpu-share.dev/profile",
    );
    check(
        "an annotation",
        &old,
        &edited(&old, |n| {
            n["metadata"]["annotations"]["gpu-share.dev/profile.reason"] = json!("mine")
        }),
        "deny: only the annotation gpu-share.dev/expected-evictions",
    );
    check(
        "the prediction of its proposal's evictions",
        &old,
        &edited(&old, |n| {
            n["metadata"]["annotations"]["gpu-share.dev/expected-evictions"] =
                json!(r#"{"hash":"ab","pods":["ml/a"]}"#)
        }),
        "allow",
    );
    check(
        "removing the annotations",
        &old,
        &edited(&old, |n| {
            n["metadata"].as_object_mut().unwrap().remove("annotations");
        }),
        "deny: only the annotation gpu-share.dev/expected-evictions",
    );
    check(
        "a taint",
        &old,
        &edited(&old, |n| n["spec"]["taints"] = json!([])),
        "deny: may not change a node's spec",
    );
    check(
        "a cordon",
        &old,
        &edited(&old, |n| n["spec"]["unschedulable"] = json!(true)),
        "deny: may not change a node's spec",
    );
    check(
        "a finalizer",
        &old,
        &edited(&old, |n| n["metadata"]["finalizers"] = json!(["x/hold"])),
        "deny: finalizers",
    );
    // Others are not its business.
    for other in [
        "kubernetes-admin",
        "system:serviceaccount:gpu-share:gpu-share",
    ] {
        expect(
            other,
            &policy,
            &user_request(other, "UPDATE", Some("gpu-1")),
            &old,
            &edited(&old, |n| n["spec"]["taints"] = json!([])),
            "not matched",
        );
    }
}

fn profiles_configmap(objects: &[Value]) -> Value {
    objects
        .iter()
        .find(|o| o["kind"] == "ConfigMap" && o["metadata"]["name"] == PROFILES)
        .unwrap()
        .clone()
}

#[test]
fn the_configmap_policy_lets_the_autopilot_write_only_advised_keys_and_its_status() {
    let objects = render_with_autopilot("standalone").objects;
    let (vap, policy) = bound_policy(&objects, "gpu-share-autopilot-configmaps");
    assert_eq!(
        matched(&vap),
        [(
            String::new(),
            "configmaps".to_string(),
            vec!["CREATE".to_string(), "UPDATE".to_string()]
        )]
    );
    let user = format!("system:serviceaccount:{NS}:{SA}");
    let update = user_request(&user, "UPDATE", None);
    let create = user_request(&user, "CREATE", None);
    let old = profiles_configmap(&objects);
    let check = |what: &str, request: &Value, old: &Value, new: &Value, want: &str| {
        expect(what, &policy, request, old, new, want)
    };
    let data =
        |key: &'static str, value: &'static str| move |c: &mut Value| c["data"][key] = json!(value);
    let drop_key = |key: &'static str| {
        move |c: &mut Value| {
            c["data"].as_object_mut().unwrap().remove(key);
        }
    };
    let profile =
        "version: v1\nrules:\n  - name: advised\n    devices: all\n    mig: {1g.10gb: 7}\n";
    let with_advised = edited(&old, data("advised-gpu-1", profile));
    check("add advised-gpu-1", &update, &old, &with_advised, "allow");
    check(
        "change advised-gpu-1",
        &update,
        &with_advised,
        &edited(
            &with_advised,
            data("advised-gpu-1", "version: v1\nrules: []\n"),
        ),
        "allow",
    );
    check(
        "remove advised-gpu-1",
        &update,
        &with_advised,
        &old,
        "allow",
    );
    check(
        "change a hand-written profile",
        &update,
        &old,
        &edited(&old, data("h100-inference", profile)),
        "deny: only advised-* keys",
    );
    check(
        "add a key not advised-*",
        &update,
        &old,
        &edited(&old, data("my-profile", profile)),
        "deny: only advised-* keys",
    );
    check(
        "remove a hand-written profile",
        &update,
        &old,
        &edited(&old, drop_key("h100-inference")),
        "deny: only advised-* keys",
    );
    check(
        "a label on the profiles ConfigMap",
        &update,
        &old,
        &edited(&old, |c| c["metadata"]["labels"]["x"] = json!("y")),
        "deny: only the data of gpu-share-profiles",
    );
    check(
        "binaryData",
        &update,
        &old,
        &edited(&old, |c| c["binaryData"] = json!({"advised-x": "AAAA"})),
        "deny: only the data of gpu-share-profiles",
    );
    let status = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": STATUS, "namespace": NS},
        "data": {"status.yaml": "nodes: {}\n"},
    });
    check("create its status", &create, &Value::Null, &status, "allow");
    check(
        "update its status",
        &update,
        &status,
        &edited(&status, data("status.yaml", "nodes: {gpu-1: dry-run}\n")),
        "allow",
    );
    let other = edited(&status, |c| {
        c["metadata"]["name"] = json!("kube-root-ca.crt")
    });
    check(
        "create another ConfigMap",
        &create,
        &Value::Null,
        &other,
        "deny: may create only ConfigMap gpu-share-autopilot-status",
    );
    check(
        "update another ConfigMap",
        &update,
        &other,
        &edited(&other, data("ca.crt", "x")),
        "deny: not kube-root-ca.crt",
    );
    check(
        "create the profiles ConfigMap",
        &create,
        &Value::Null,
        &with_advised,
        "deny: may create only ConfigMap gpu-share-autopilot-status",
    );
    check(
        "the administrator",
        &user_request("kubernetes-admin", "UPDATE", None),
        &old,
        &edited(&old, data("h100-inference", profile)),
        "not matched",
    );
}

#[test]
fn the_lease_policy_lets_the_autopilot_create_only_its_own_lease() {
    let objects = render_with_autopilot("standalone").objects;
    let (vap, policy) = bound_policy(&objects, "gpu-share-autopilot-leases");
    assert_eq!(
        matched(&vap),
        [(
            "coordination.k8s.io".to_string(),
            "leases".to_string(),
            vec!["CREATE".to_string()]
        )]
    );
    let user = format!("system:serviceaccount:{NS}:{SA}");
    let create = user_request(&user, "CREATE", None);
    let lease = |name: &str| {
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
               "metadata": {"name": name, "namespace": NS},
               "spec": {"holderIdentity": "gpu-share-autopilot-7f9c-x2"}})
    };
    expect(
        "its Lease",
        &policy,
        &create,
        &Value::Null,
        &lease(LEASE),
        "allow",
    );
    expect(
        "an agent's drain slot",
        &policy,
        &create,
        &Value::Null,
        &lease("gpu-share-drain-0"),
        "deny: only its own Lease gpu-share-autopilot, not gpu-share-drain-0",
    );
    // The agents create drain slots; the policy is not theirs.
    expect(
        "the agent",
        &policy,
        &user_request(
            "system:serviceaccount:gpu-share:gpu-share",
            "CREATE",
            Some("gpu-1"),
        ),
        &Value::Null,
        &lease("gpu-share-drain-0"),
        "not matched",
    );
}

/// docs/autopilot.md's go-live patch, applied to the component's Deployment as the page's
/// kustomization does, leaves it running the same command without `--dry-run`.
#[test]
fn the_docs_go_live_patch_drops_only_dry_run() {
    let page = std::fs::read_to_string(root().join("docs/autopilot.md")).unwrap();
    let snippet = page
        .split_once("cat > deploy/my-cluster/autopilot-live.yaml <<'EOF'\n")
        .and_then(|(_, rest)| rest.split_once("\nEOF\n"))
        .map(|(s, _)| s)
        .expect("docs/autopilot.md: the go-live patch heredoc");
    let ops = yaml_docs_in(snippet, "docs/autopilot.md patch").remove(0);
    let objects = render_with_autopilot("standalone").objects;
    let mut d = objects
        .iter()
        .find(|o| o["kind"] == "Deployment" && o["metadata"]["name"] == "gpu-share-autopilot")
        .unwrap()
        .clone();
    let args = |d: &Value| -> Vec<String> {
        serde_json::from_value(d["spec"]["template"]["spec"]["containers"][0]["args"].clone())
            .unwrap()
    };
    let before = args(&d);
    json_patch(&mut d, &ops);
    let after = args(&d);
    let expected: Vec<String> = before.into_iter().filter(|a| a != "--dry-run").collect();
    assert_eq!(after, expected);
    typed_check(&d, "the live Deployment");
}
