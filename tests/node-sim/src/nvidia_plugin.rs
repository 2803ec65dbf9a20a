//! NVIDIA's device plugin (k8s-device-plugin v0.20) and the kubelet's node-status update, for
//! a simulated node in the agent's default mode (`--plugin nvidia`): what the Node's
//! `status.capacity` and `status.allocatable` say once the plugin read the config file the agent
//! wrote and the GPUs NVML shows.
//!
//! The counting rules are NVIDIA's, written here from NVIDIA/k8s-device-plugin v0.20.0 (the
//! source files named below and its README, "Shared Access to GPUs with CUDA Time-Slicing"),
//! not taken from gpu-share's planner, which the agent's wait checks against:
//! - `flags.migStrategy` (default `none`): `none` advertises every GPU whole as
//!   `nvidia.com/gpu`, MIG on or not; `single` advertises the MIG devices of a MIG GPU as
//!   `nvidia.com/gpu`; `mixed` as `nvidia.com/mig-<profile>`; a GPU with MIG off is one
//!   `nvidia.com/gpu` (internal/rm/rm.go, `AddDefaultResourcesToConfig`);
//! - sharing: `sharing.mps` wins over `sharing.timeSlicing` when both are set; each entry of
//!   `resources` turns every device of resource `name` (`nvidia.com/` prepended when missing)
//!   into `replicas` devices, under `<name>.shared` when `renameByDefault` is true; `devices`
//!   is always `all` (the plugin ignores anything else, `DisableResourceNamingInConfig`); an
//!   entry naming no resource is skipped (api/config/v1/replicas.go, internal/rm/device_map.go);
//! - a resource the plugin no longer serves stays on the Node with 0, as the kubelet keeps an
//!   extended resource it saw until it restarts.
//!
//! - on a Jetson/Tegra (go-nvlib's `ResolvePlatform`: Tegra files and no NVML), one device,
//!   `tegra`, under `nvidia.com/gpu`, replicated like any other (internal/rm/tegra_manager.go,
//!   tegra_devices.go); here "no NVML" is a node without a fake NVML state file
//!   ([`crate::AgentNode::make_jetson`]).
//!
//! The plugin re-reads when the agent makes it (SIGHUP or a pod restart); the agent's tests do
//! not reload it (`GPU_SHARE_PLUGIN_RELOAD=none`), so the double re-counts whenever the config
//! file or the NVML state changes, as a plugin reloaded at each change. A test can stop it
//! ([`crate::AgentNode::stop_nvidia_plugin`]): its resources then drop to 0, as when the
//! plugin exited on a config it refused.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use gpu_share::plan::ObservedNode;
use kube_double::KubeDouble;
use serde_yaml::Value;

use crate::device_plugins::set_node_counts;

/// What the plugin advertises for `config` (the YAML text) on `gpus`: resource → devices.
pub fn nvidia_plugin_counts(config: &str, gpus: &ObservedNode) -> BTreeMap<String, usize> {
    let config: Value = serde_yaml::from_str(config).unwrap_or(Value::Null);
    let strategy = config["flags"]["migStrategy"].as_str().unwrap_or("none");
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for gpu in &gpus.gpus {
        let mig_on = gpu.mig.is_some_and(|m| m.current);
        if mig_on && strategy != "none" {
            for device in gpu.mig_devices() {
                let resource = match strategy {
                    "single" => "nvidia.com/gpu".to_string(),
                    _ => format!("nvidia.com/mig-{}", device.profile.replace('+', ".")),
                };
                *counts.entry(resource).or_default() += 1;
            }
        } else {
            *counts.entry("nvidia.com/gpu".to_string()).or_default() += 1;
        }
    }
    let sharing = &config["sharing"];
    let block = if sharing["mps"]["resources"].is_sequence() {
        &sharing["mps"]
    } else {
        &sharing["timeSlicing"]
    };
    let rename = block["renameByDefault"].as_bool().unwrap_or(false);
    for entry in block["resources"].as_sequence().into_iter().flatten() {
        let Some(name) = entry["name"].as_str() else {
            continue;
        };
        let name = if name.contains('/') {
            name.to_string()
        } else {
            format!("nvidia.com/{name}")
        };
        let replicas = entry["replicas"].as_u64().unwrap_or(1) as usize;
        let Some(devices) = counts.remove(&name) else {
            continue;
        };
        let advertised = if rename {
            format!("{name}.shared")
        } else {
            name
        };
        *counts.entry(advertised).or_default() += devices * replicas;
    }
    counts
}

/// go-nvlib's `HasTegraFiles` (vendor/github.com/NVIDIA/go-nvlib/pkg/nvlib/info/
/// property-extractor.go at k8s-device-plugin v0.20.0): `<root>/etc/nv_tegra_release` is a
/// file, or `<root>/sys/devices/soc0/family` starts with `tegra` in any case.
pub fn has_tegra_files(root: &Path) -> bool {
    root.join("etc/nv_tegra_release").is_file()
        || std::fs::read_to_string(root.join("sys/devices/soc0/family"))
            .is_ok_and(|f| f.to_ascii_lowercase().starts_with("tegra"))
}

/// The one device NVIDIA's plugin serves on a Tegra, as a GPU without MIG.
fn tegra_device() -> ObservedNode {
    ObservedNode {
        gpus: vec![gpu_share::plan::ObservedGpu::simulated(0, "tegra")],
    }
}

/// The double's thread: re-counts on each change of the config file or the NVML state and
/// publishes the counts on the Node; while `up` is false its resources read 0.
pub(crate) fn run(
    api: Arc<KubeDouble>,
    node: String,
    config: PathBuf,
    nvml_state: PathBuf,
    host_root: PathBuf,
    alive: Arc<AtomicBool>,
    up: Arc<AtomicBool>,
) {
    std::thread::spawn(move || {
        let mut last: Option<(Vec<u8>, Vec<u8>, bool)> = None;
        let mut served: BTreeMap<String, usize> = BTreeMap::new();
        while alive.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(50));
            // No config file: the plugin does not run (the agent serves `builtin` or `dra`).
            let Ok(text) = std::fs::read(&config) else {
                continue;
            };
            let nvml = std::fs::read(&nvml_state).unwrap_or_default();
            let running = up.load(Ordering::SeqCst);
            let now = (text, nvml, running);
            if last.as_ref() == Some(&now) {
                continue;
            }
            let counts = if running {
                let gpus = if !nvml_state.exists() && has_tegra_files(&host_root) {
                    tegra_device()
                } else {
                    // A state caught mid-write is read again on the next tick.
                    let Ok(gpus) = crate::try_observe(&nvml_state) else {
                        continue;
                    };
                    gpus
                };
                nvidia_plugin_counts(&String::from_utf8_lossy(&now.0), &gpus)
            } else {
                BTreeMap::new()
            };
            for gone in served.keys().filter(|r| !counts.contains_key(*r)) {
                set_node_counts(&api, &node, gone, 0, 0);
            }
            for (resource, n) in &counts {
                set_node_counts(&api, &node, resource, *n, *n);
            }
            served.extend(counts);
            last = Some(now);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(json: serde_json::Value) -> ObservedNode {
        serde_json::from_value(json).unwrap()
    }

    /// Two GPUs: GPU 0 with MIG on and two 1g.10gb and one 3g.40gb devices, GPU 1 whole.
    fn two_gpus() -> ObservedNode {
        node(serde_json::json!({"gpus": [
            {"index": 0, "product": "NVIDIA H100 80GB HBM3", "uuid": "GPU-0",
             "mig": {"current": true, "pending": true},
             "instances": [
                {"profile": "1g.10gb", "placement": [0, 1], "giId": 9},
                {"profile": "1g.10gb", "placement": [1, 1], "giId": 10},
                {"profile": "3g.40gb", "placement": [4, 4], "giId": 1}],
             "computeInstances": [
                {"giId": 9, "ciId": 0, "profileId": 0, "uuid": "MIG-a"},
                {"giId": 10, "ciId": 0, "profileId": 0, "uuid": "MIG-b"},
                {"giId": 1, "ciId": 0, "profileId": 2, "uuid": "MIG-c"}]},
            {"index": 1, "product": "NVIDIA H100 80GB HBM3", "uuid": "GPU-1"}
        ]}))
    }

    fn counts(pairs: &[(&str, usize)]) -> BTreeMap<String, usize> {
        pairs.iter().map(|(r, n)| (r.to_string(), *n)).collect()
    }

    #[test]
    fn mig_strategies_name_mig_devices_as_nvidia_does() {
        let gpus = two_gpus();
        assert_eq!(
            nvidia_plugin_counts("version: v1\nflags: {migStrategy: mixed}\n", &gpus),
            counts(&[
                ("nvidia.com/gpu", 1),
                ("nvidia.com/mig-1g.10gb", 2),
                ("nvidia.com/mig-3g.40gb", 1)
            ])
        );
        assert_eq!(
            nvidia_plugin_counts("version: v1\nflags: {migStrategy: single}\n", &gpus),
            counts(&[("nvidia.com/gpu", 4)])
        );
        // `none` (also an empty config): MIG devices are not advertised, the GPU is.
        assert_eq!(
            nvidia_plugin_counts("", &gpus),
            counts(&[("nvidia.com/gpu", 2)])
        );
    }

    #[test]
    fn replicas_multiply_a_resource_and_rename_by_default_adds_shared() {
        let gpus = two_gpus();
        let config = "version: v1\nflags: {migStrategy: mixed}\nsharing:\n  timeSlicing:\n    \
                      renameByDefault: true\n    resources:\n    - {name: nvidia.com/gpu, \
                      devices: all, replicas: 4}\n    - {name: mig-1g.10gb, replicas: 2}\n    \
                      - {name: nvidia.com/mig-7g.80gb, replicas: 2}\n";
        assert_eq!(
            nvidia_plugin_counts(config, &gpus),
            counts(&[
                ("nvidia.com/gpu.shared", 4),
                ("nvidia.com/mig-1g.10gb.shared", 4),
                ("nvidia.com/mig-3g.40gb", 1)
            ])
        );
    }

    #[test]
    fn mps_wins_over_time_slicing() {
        let gpus = two_gpus();
        let config = "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - {name: \
                      nvidia.com/gpu, replicas: 4}\n  mps:\n    resources:\n    - {name: \
                      nvidia.com/gpu, replicas: 8}\n";
        assert_eq!(
            nvidia_plugin_counts(config, &gpus),
            counts(&[("nvidia.com/gpu", 16)])
        );
    }
}
