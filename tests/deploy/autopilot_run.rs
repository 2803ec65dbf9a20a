//! `gpu-share autopilot` run as deploy/components/autopilot deploys it, against the API double,
//! as the agent's RBAC test runs the agent: every request it makes is granted to its
//! ServiceAccount, every grant is used, and every write it makes passes the component's
//! admission policies.

use super::autopilot::*;
use super::*;

/// The autopilot's pod name, as the downward API gives it (`metadata.name`).
const AUTOPILOT_POD: &str = "gpu-share-autopilot-6b7c9d-x2k4p";

/// `gpu-share autopilot` with the Deployment's container args (`args`) and env, against `api`.
/// Only what makes the test quick is added: a short debounce and Lease.
fn start_autopilot(
    c: &Container,
    args: &[String],
    kubeconfig: &Path,
    log: &Path,
) -> std::process::Child {
    let mut cmd = Command::new(gpu_share_bin());
    cmd.args(args)
        .args(["--debounce", "200ms", "--lease-duration", "2s"])
        .env("KUBECONFIG", kubeconfig)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap());
    for e in c.env.iter().flatten() {
        let value = match (&e.value, &e.value_from) {
            (Some(v), None) => v.clone(),
            (None, Some(from)) => match from.field_ref.as_ref().unwrap().field_path.as_str() {
                "metadata.namespace" => NS.to_string(),
                "metadata.name" => AUTOPILOT_POD.to_string(),
                other => panic!("downward API field {other} is not simulated here"),
            },
            _ => panic!("env {} has neither a value nor a fieldRef", e.name),
        };
        cmd.env(&e.name, value);
    }
    cmd.spawn().unwrap()
}

/// Kills the autopilot (like a crash) when the test ends, passing or not.
struct Running(std::process::Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `gpu-share autopilot` run as the component deploys it (its args and env), on the API double:
/// first as shipped (dry-run, several rounds, so a repeated Event is patched), then live (the
/// docs' patch), until it has relabelled a node. Every request it made is granted to its
/// ServiceAccount, every grant was used, and every write it made to Nodes, ConfigMaps and
/// Leases passes the component's admission policies.
#[test]
fn the_autopilot_as_deployed_uses_exactly_its_grants_and_passes_its_policies() {
    let objects = render_with_autopilot("standalone").objects;
    let (_, pod) = deployment(&objects);
    let c = pod.containers[0].clone();
    let shipped = c.args.clone().unwrap();
    let live: Vec<String> = shipped
        .iter()
        .filter(|a| *a != "--dry-run")
        .cloned()
        .collect();
    assert_ne!(shipped, live, "ships in dry-run");

    let api = KubeDouble::start();
    api.put_configmap(one(&objects, "ConfigMap", PROFILES));
    // Two opted-in H100 nodes with GPU Feature Discovery's labels, one not opted in.
    for (name, opted_in) in [("gpu-1", true), ("gpu-2", true), ("gpu-manual", false)] {
        let mut labels = vec![
            ("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"),
            ("nvidia.com/gpu.count", "1"),
        ];
        if opted_in {
            labels.push((OPT_IN, "enabled"));
        }
        api.put_node(fixtures::node(name, &labels));
    }
    let pending = |name: &str, resource: &str| {
        api.put_pod(
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "ml"},
                "spec": {"containers": [{"name": "main",
                    "resources": {"limits": {resource: "1"}}}]},
                "status": {"phase": "Pending"},
            }))
            .unwrap(),
        )
    };
    for i in 0..4 {
        pending(&format!("infer-{i}"), "nvidia.com/mig-3g.40gb");
    }
    let nodes_before: BTreeMap<String, Value> = ["gpu-1", "gpu-2", "gpu-manual"]
        .iter()
        .map(|n| (n.to_string(), as_admitted(&api.node(n).unwrap())))
        .collect();
    let profiles_before = serde_json::to_value(api.configmap(NS, PROFILES).unwrap()).unwrap();
    let since = api.resource_version();
    api.clear_requests();

    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).unwrap();
    let log = dir.path().join("autopilot.log");
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();
    let proposed = |a: &KubeDouble| {
        a.events()
            .iter()
            .filter(|e| e.reason.as_deref() == Some("ProfileProposed"))
            .count()
    };
    {
        let _dry = Running(start_autopilot(&c, &shipped, &kubeconfig, &log));
        assert!(
            api.wait_until(Duration::from_secs(30), |a| proposed(a) > 0),
            "no ProfileProposed Event in dry-run:\n{}",
            log_text()
        );
        // More rounds with the same proposal: the Recorder patches the Event into a series.
        let rounds = |a: &KubeDouble| {
            a.requests()
                .iter()
                .filter(|r| r.group == "events.k8s.io" && verb_name(r) == "patch")
                .count()
        };
        for i in 0..10 {
            if rounds(&api) > 0 {
                break;
            }
            pending(&format!("late-{i}"), "nvidia.com/mig-1g.10gb");
            std::thread::sleep(Duration::from_millis(700));
        }
        assert!(rounds(&api) > 0, "no repeated Event:\n{}", log_text());
        for n in ["gpu-1", "gpu-2"] {
            assert_eq!(label(&api, n, PROFILE_LABEL), None, "dry-run labelled {n}");
        }
    }
    {
        let _live = Running(start_autopilot(&c, &live, &kubeconfig, &log));
        let relabelled = |a: &KubeDouble| {
            ["gpu-1", "gpu-2"]
                .iter()
                .any(|n| label(a, n, PROFILE_LABEL).is_some_and(|v| v.starts_with("advised-")))
        };
        assert!(
            api.wait_until(Duration::from_secs(30), relabelled),
            "the live autopilot relabelled no node:\n{}",
            log_text()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    assert_eq!(label(&api, "gpu-manual", PROFILE_LABEL), None);

    // 1. Every request is granted; 2. every grant was used.
    let (refused, unused) = rbac_misfits(&grants(&objects, NS, SA), &api.requests(), &[]);
    assert!(
        refused.is_empty(),
        "RBAC refuses requests the autopilot makes:\n{}",
        refused.join("\n")
    );
    assert!(
        unused.is_empty(),
        "granted but never used by the autopilot:\n{}",
        unused.join("\n")
    );

    // 3. Its writes pass the policies.
    let user = format!("system:serviceaccount:{NS}:{SA}");
    let (_, nodes_policy) = bound_policy(&objects, "gpu-share-autopilot-nodes");
    let me = user_request(&user, "UPDATE", Some("cpu-node-3"));
    let mut writes = 0;
    for (name, before) in &nodes_before {
        let mut previous = before.clone();
        for n in node_updates(&api, name, &since) {
            let now = as_admitted(&n);
            if now != previous {
                expect(
                    &format!("node write to {name}"),
                    &nodes_policy,
                    &me,
                    &previous,
                    &now,
                    "allow",
                );
                writes += 1;
            }
            previous = now;
        }
    }
    assert!(writes >= 1, "the relabelling was replayed");
    let (_, cm_policy) = bound_policy(&objects, "gpu-share-autopilot-configmaps");
    let profiles_after = serde_json::to_value(api.configmap(NS, PROFILES).unwrap()).unwrap();
    let strip = |v: &Value| {
        let mut v = v.clone();
        for k in [
            "resourceVersion",
            "managedFields",
            "generation",
            "uid",
            "creationTimestamp",
        ] {
            v["metadata"].as_object_mut().unwrap().remove(k);
        }
        v
    };
    assert_ne!(
        strip(&profiles_before),
        strip(&profiles_after),
        "an advised key was written"
    );
    expect(
        "its profiles ConfigMap patch",
        &cm_policy,
        &user_request(&user, "UPDATE", None),
        &strip(&profiles_before),
        &strip(&profiles_after),
        "allow",
    );
    let status =
        serde_json::to_value(api.configmap(NS, STATUS).expect("status ConfigMap")).unwrap();
    expect(
        "its status ConfigMap",
        &cm_policy,
        &user_request(&user, "CREATE", None),
        &Value::Null,
        &strip(&status),
        "allow",
    );
    let (_, lease_policy) = bound_policy(&objects, "gpu-share-autopilot-leases");
    let lease = serde_json::to_value(api.lease(NS, LEASE).expect("its Lease")).unwrap();
    expect(
        "its Lease",
        &lease_policy,
        &user_request(&user, "CREATE", None),
        &Value::Null,
        &strip(&lease),
        "allow",
    );
}
