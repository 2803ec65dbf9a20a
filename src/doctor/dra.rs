//! Layer 5 in DRA mode, and the rule every mode shares: a node cannot offer the same GPUs both
//! through Dynamic Resource Allocation and through a device plugin. The kubelet keeps the two
//! apart (extended resources from device plugins, ResourceClaims from DRA drivers), so the
//! scheduler would give one GPU to a pod that asked for `nvidia.com/gpu` and to another that
//! claimed it as a DRA device.
//!
//! What is registered is read from the kubelet's two registration directories:
//! - the device-plugin directory: a device plugin serving `nvidia.com/<name>` listens on
//!   `nvidia-<name>.sock` (NVIDIA's plugin and gpu-share's built-in one alike);
//! - the plugin registry (`/var/lib/kubelet/plugins_registry`), where a DRA kubelet plugin puts
//!   its registration socket. The kubelet's plugin watcher recommends `<plugin name>[-<any
//!   suffix>].sock` with the plugin name ending in its DNS domain (pluginwatcher README,
//!   kubernetes/kubernetes pkg/kubelet/pluginmanager), so gpu-share's is `gpu.gpu-share.dev*.sock`
//!   (k8s.io/dynamic-resource-allocation's helper names it `<driver>-reg.sock`), and NVIDIA's
//!   DRA driver's `gpu.nvidia.com*.sock`.
//!
//! Only listening sockets count: a stale file is a leftover of a plugin that is gone.

use std::path::Path;

use super::socket::{describe, pod_resources, probe, Socket};
use super::{Check, Ctx};
use crate::dra::DRIVER;

const NAME: &str = "device-plugin";

/// NVIDIA's DRA driver, which publishes the same GPUs when it runs on the node.
const NVIDIA_DRA_DRIVER: &str = "gpu.nvidia.com";

/// The socket files in `dir` whose names `wanted` accepts, with what is at each.
fn sockets(dir: &Path, wanted: impl Fn(&str) -> bool) -> Vec<(String, Socket)> {
    let mut found: Vec<(String, Socket)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .filter(|n| wanted(n))
        .map(|n| {
            let state = probe(&dir.join(&n));
            (n, state)
        })
        .collect();
    found.sort_by(|a, b| a.0.cmp(&b.0));
    found
}

/// A registration socket of the DRA driver `driver`: `<driver>.sock` or `<driver>-<x>.sock`.
fn is_registration_of(name: &str, driver: &str) -> bool {
    name.strip_prefix(driver)
        .is_some_and(|rest| rest == ".sock" || (rest.starts_with('-') && rest.ends_with(".sock")))
}

/// A device plugin's socket for an `nvidia.com/*` resource.
fn is_nvidia_device_plugin(name: &str) -> bool {
    name.starts_with("nvidia-") && name.ends_with(".sock")
}

fn listening(found: &[(String, Socket)]) -> Vec<&str> {
    found
        .iter()
        .filter(|(_, s)| *s == Socket::Listening)
        .map(|(n, _)| n.as_str())
        .collect()
}

/// `--plugin dra`: the agent is the node's DRA plugin. The plugin registry must exist (the
/// kubelet makes it), gpu-share's registration is reported, and a device plugin or NVIDIA's
/// DRA driver serving the GPUs too is a warning.
pub(super) fn check(ctx: &Ctx<'_>) -> Check {
    let registry = &ctx.paths.dra_registration_dir;
    if !registry.is_dir() {
        return Check::failed(
            NAME,
            format!(
                "{} does not exist: no kubelet registers DRA plugins here",
                registry.display()
            ),
            "start the kubelet (`systemctl status kubelet`); a kubelet with another --root-dir \
             keeps it elsewhere: point --dra-registration-dir there",
        );
    }
    let mut check = Check::new(NAME, "");
    let ours = sockets(registry, |n| is_registration_of(n, DRIVER));
    let live = listening(&ours);
    check.found = format!(
        "DRA mode: {DRIVER} registered in {}: {}",
        registry.display(),
        if live.is_empty() {
            "no".to_string()
        } else {
            live.join(", ")
        }
    );
    if live.is_empty() {
        check.warn(
            format!(
                "no live registration socket of {DRIVER} in {}{}: the agent registers its DRA \
                 plugin with the kubelet once it runs with --plugin dra",
                registry.display(),
                stale_note(&ours)
            ),
            "look at the agent's log (`kubectl -n gpu-share logs <pod> -c agent`); deploy it \
             with deploy/overlays/dra",
        );
    }
    device_plugins_beside_dra(ctx, &mut check);
    let nvidia = sockets(registry, |n| is_registration_of(n, NVIDIA_DRA_DRIVER));
    let nvidia = listening(&nvidia);
    if !nvidia.is_empty() {
        check.warn(
            format!(
                "NVIDIA's DRA driver is registered too ({}): it publishes the same GPUs as \
                 {NVIDIA_DRA_DRIVER} devices, so two drivers would hand them out",
                nvidia.join(", ")
            ),
            "run one DRA driver for these GPUs: uninstall NVIDIA's DRA driver from this node \
             (its kubelet plugin DaemonSet's nodeSelector), or run gpu-share with a device plugin",
        );
    }
    pod_resources(ctx, &mut check);
    check
}

/// In DRA mode, a device plugin serving `nvidia.com/*` resources offers the same GPUs again.
fn device_plugins_beside_dra(ctx: &Ctx<'_>, check: &mut Check) {
    let dir = &ctx.paths.device_plugin_dir;
    let found = sockets(dir, is_nvidia_device_plugin);
    let live = listening(&found);
    if !live.is_empty() {
        check.warn(
            format!(
                "a device plugin serves nvidia.com resources on this node ({} in {}): a node \
                 cannot run DRA and a device plugin for the same GPUs; pods asking for \
                 nvidia.com/* and DRA claims would be given the same GPUs",
                live.join(", "),
                dir.display()
            ),
            "remove the device plugin from this node: NVIDIA's DaemonSet (GPU Operator: \
             --set devicePlugin.enabled=false, or label the node \
             nvidia.com/gpu.deploy.device-plugin=false), or an agent run with --plugin \
             builtin; gpu-share's dra overlay runs none",
        );
    }
}

/// With a device plugin (`nvidia` or `builtin`): gpu-share's own DRA plugin registered on the
/// same node would publish the same GPUs as DRA devices.
pub(super) fn warn_if_dra_registered(ctx: &Ctx<'_>, check: &mut Check) {
    let registry = &ctx.paths.dra_registration_dir;
    let ours = sockets(registry, |n| is_registration_of(n, DRIVER));
    let live = listening(&ours);
    if !live.is_empty() {
        check.warn(
            format!(
                "gpu-share's DRA plugin is registered with the kubelet ({} in {}): a node cannot \
                 run DRA and a device plugin for the same GPUs; DRA claims and pods asking for \
                 nvidia.com/* would be given the same GPUs",
                live.join(", "),
                registry.display()
            ),
            "run every agent on this node with one --plugin: deploy one overlay \
             (deploy/overlays/dra, or builtin / standalone / gpu-operator), not two",
        );
    }
}

/// ", and a stale one (…)" when registration files exist but nothing listens on them.
fn stale_note(found: &[(String, Socket)]) -> String {
    let stale: Vec<String> = found
        .iter()
        .filter(|(_, s)| *s != Socket::Listening)
        .map(|(n, s)| format!("{n} is {}", describe(s)))
        .collect();
    if stale.is_empty() {
        String::new()
    } else {
        format!(" ({})", stale.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registration_sockets_are_the_drivers_own_names() {
        for name in [
            "gpu.gpu-share.dev.sock",
            "gpu.gpu-share.dev-reg.sock",
            "gpu.gpu-share.dev-1a2b.sock",
        ] {
            assert!(is_registration_of(name, DRIVER), "{name}");
        }
        for name in [
            "gpu.gpu-share.dev",
            "gpu.gpu-share.devx.sock",
            "xgpu.gpu-share.dev.sock",
            "gpu.nvidia.com-reg.sock",
            "gpu.gpu-share.dev-reg.sock.tmp",
        ] {
            assert!(!is_registration_of(name, DRIVER), "{name}");
        }
        assert!(is_registration_of(
            "gpu.nvidia.com-reg.sock",
            NVIDIA_DRA_DRIVER
        ));
        assert!(is_nvidia_device_plugin("nvidia-mig-1g.10gb.sock"));
        assert!(!is_nvidia_device_plugin("kubelet.sock"));
    }
}
