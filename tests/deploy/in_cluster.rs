//! docs/testbed/in-cluster/: what docs/testbed/in-cluster.sh adds to each overlay to run it on
//! the real node test bed (image overrides, and components standing in for the NVIDIA container
//! runtime), checked here without the test bed: deploy/ never refers to it, and each overlay
//! rendered with it by `kubectl kustomize` is the shipped overlay changed only where the
//! stand-in says (its own env, volumes and mounts; the RuntimeClass handler), every image one
//! the script imports, every env var one that the agent or the fake NVML reads.

use super::*;

fn in_cluster() -> PathBuf {
    root().join("docs/testbed/in-cluster")
}

/// Names the stand-in components give their volumes, env and hostPaths.
const STANDIN_VOLUME_PREFIX: &str = "testbed-";
const STANDIN_HOST_DIR: &str = "/var/lib/gpu-share-testbed";
/// The stand-in's env: the fake NVML's state file, and the agent's host root for its driver
/// checks (/proc/driver/nvidia/version, /dev/nvidia*).
const STANDIN_ENV: [&str; 2] = ["FAKE_NVML_STATE", "GPU_SHARE_HOST_ROOT"];

/// `overlay` as the script applies it: kustomization.yaml.in filled in as the script fills it,
/// in a temporary directory (kustomize takes other kustomizations by relative path only).
fn kubectl_kustomize_as_the_script_does(overlay: &str, components: &[&str]) -> Vec<Value> {
    let dir = tempfile::tempdir().unwrap();
    let up = relative_from(dir.path(), &root()) + "/";
    let components: Vec<String> = components
        .iter()
        .map(|c| format!("\"{up}docs/testbed/in-cluster/{c}\""))
        .collect();
    let template = std::fs::read_to_string(in_cluster().join("kustomization.yaml.in")).unwrap();
    let text = template
        .replace("@OVERLAY@", overlay)
        .replace("@UP@", &up)
        .replace("@COMPONENTS@", &components.join(", "))
        .replace("@TAG@", "test");
    std::fs::write(dir.path().join("kustomization.yaml"), text).unwrap();
    kubectl_kustomize(dir.path()).into_values().collect()
}

/// The stand-in components for an overlay: the runtime's part for the agent always, and for
/// NVIDIA's plugin container where the overlay has one (as the script chooses them).
fn standins_for(shipped: &[Value]) -> Vec<&'static str> {
    let (_, pod) = pod_spec(shipped);
    if try_container(&pod, "device-plugin").is_some() {
        vec!["runtime-standin", "plugin-standin"]
    } else {
        vec!["runtime-standin"]
    }
}

/// The DaemonSet's JSON with what the stand-in added taken out and the shipped images put back.
fn without_standin(mut ds: Value, shipped_images: &[String]) -> Value {
    let spec = &mut ds["spec"]["template"]["spec"];
    let ours = |name: &Value| {
        name.as_str()
            .is_some_and(|n| n.starts_with(STANDIN_VOLUME_PREFIX))
    };
    spec["volumes"]
        .as_array_mut()
        .unwrap()
        .retain(|v| !ours(&v["name"]));
    let mut i = 0;
    for list in ["initContainers", "containers"] {
        for c in spec[list].as_array_mut().into_iter().flatten() {
            // `get_mut`, not `c[...]`: indexing a missing key would insert a null.
            if let Some(mounts) = c.get_mut("volumeMounts").and_then(Value::as_array_mut) {
                mounts.retain(|m| !ours(&m["name"]));
            }
            if let Some(env) = c.get_mut("env").and_then(Value::as_array_mut) {
                env.retain(|e| !STANDIN_ENV.contains(&e["name"].as_str().unwrap_or_default()));
            }
            c["image"] = json!(shipped_images[i]);
            i += 1;
        }
    }
    ds
}

/// deploy/ never refers to the test-only stand-in: it cannot ship by accident.
#[test]
fn the_in_cluster_standin_is_not_shipped() {
    let mut files = Vec::new();
    yaml_files(&deploy(), &mut files);
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        for word in ["docs/testbed", "in-cluster", STANDIN_HOST_DIR, "FAKE_NVML"] {
            assert!(
                !text.contains(word),
                "{} mentions {word}: the test bed's stand-in must not ship",
                f.display()
            );
        }
    }
    // Every file of the stand-in is one the script or this test uses.
    for c in ["runtime-standin", "plugin-standin"] {
        assert!(in_cluster().join(c).join("kustomization.yaml").is_file());
    }
}

/// Each overlay as docs/testbed/in-cluster.sh applies it is the shipped overlay changed only by
/// the image overrides and the runtime stand-in: same objects, the same DaemonSet once the
/// stand-in's env, volumes and mounts are taken out, the RuntimeClass run by runc, every image
/// one the script imports (k8s.local/), every stand-in env var one that is read.
#[test]
#[cfg_attr(
    no_kubectl,
    ignore = "kubectl is not installed here: the test bed's kustomizations are not rendered"
)]
fn each_overlay_on_the_test_bed_is_the_shipped_one_with_only_images_and_the_runtime_stood_in_for() {
    let agent_env = agent_env_vars();
    assert!(agent_env.contains("GPU_SHARE_HOST_ROOT"), "{agent_env:?}");
    let fake_nvml = std::fs::read_to_string(root().join("tests/fake-nvml/src/ffi/mod.rs")).unwrap();
    assert!(fake_nvml.contains("\"FAKE_NVML_STATE\""));

    for overlay in overlays() {
        let shipped_map = kubectl_kustomize(&deploy().join("overlays").join(&overlay));
        let shipped: Vec<Value> = shipped_map.values().cloned().collect();
        let standins = standins_for(&shipped);
        let tested = kubectl_kustomize_as_the_script_does(&overlay, &standins);
        let tested_map = keyed(&tested);
        assert_eq!(
            tested_map.keys().collect::<Vec<_>>(),
            shipped_map.keys().collect::<Vec<_>>(),
            "{overlay}: the test bed applies other objects"
        );
        for image in agent_pod_images(&tested) {
            assert!(
                image.starts_with("k8s.local/"),
                "{overlay}: image {image} is not one the script imports (kustomization.yaml.in)"
            );
        }
        let shipped_images = agent_pod_images(&shipped);
        for (key, theirs) in &tested_map {
            let ours = &shipped_map[key];
            let (expected, got) = match key.as_str() {
                "DaemonSet/gpu-share/gpu-share" => (
                    ours.clone(),
                    without_standin(theirs.clone(), &shipped_images),
                ),
                "RuntimeClass//nvidia" => {
                    assert_eq!(theirs["handler"], "runc", "{overlay}");
                    let mut back = theirs.clone();
                    back["handler"] = ours["handler"].clone();
                    (ours.clone(), back)
                }
                _ => (ours.clone(), theirs.clone()),
            };
            assert!(
                expected == got,
                "{overlay}: {key} differs beyond the stand-in:\n{}",
                diff(&expected, &got, "")
            );
        }
        // What the stand-in adds is there: the fake NVML where the runtime injects the real one.
        let (_, pod) = pod_spec(&tested);
        let mounts: Vec<&str> = container(&pod, "agent")
            .volume_mounts
            .iter()
            .flatten()
            .map(|m| m.mount_path.as_str())
            .collect();
        assert!(
            mounts.contains(&"/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"),
            "{overlay}: {mounts:?}"
        );
    }
}

/// The gpu-operator overlay's init container, run by `sh` with its path and pace shortened: it
/// starts the pod at once once the operator's validator wrote its file, and on a cluster where
/// nothing does it says what it waits for and then fails naming the way out, instead of
/// waiting silently for ever.
#[test]
fn the_gpu_operator_wait_says_what_it_waits_for_and_gives_up() {
    let objects = render(&deploy().join("overlays/gpu-operator")).objects;
    let (_, pod) = pod_spec(&objects);
    let wait = &pod.init_containers.as_ref().unwrap()[0];
    let command = wait.command.as_ref().unwrap();
    assert_eq!(command[..2], ["sh".to_string(), "-c".to_string()]);
    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("toolkit-ready");
    let script = command[2]
        .replace(
            "/run/nvidia/validations/toolkit-ready",
            ready.to_str().unwrap(),
        )
        .replace("sleep 5", "sleep 0.01");
    assert_ne!(script, command[2], "the test must shorten the wait");
    let run = || Command::new("sh").arg("-c").arg(&script).output().unwrap();

    let out = run();
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.starts_with("waiting for the GPU Operator's validator"),
        "{said}"
    );
    assert_eq!(
        said.matches("waiting for").count(),
        10,
        "once a minute: {said}"
    );
    assert!(
        said.contains("gave up after 10m") && said.contains("deploy/overlays/standalone"),
        "{said}"
    );

    std::fs::write(&ready, "").unwrap();
    let out = run();
    assert_eq!(out.status.code(), Some(0));
    assert!(
        out.stdout.is_empty(),
        "no message when the validator has passed"
    );
}
