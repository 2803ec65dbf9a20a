//! gpu-share's own device plugin (`--plugin builtin`): the kubelet device-plugin API v1beta1
//! over gRPC on Unix sockets, served from the agent process, for profiles the stock NVIDIA
//! plugin cannot express (whole GPUs shared in different ways on one node, MPS beside MIG, one
//! MIG profile with different replica counts per GPU).
//!
//! - [`PluginKind`]: which plugin advertises the node's GPUs; `validate`/`plan` take it, since
//!   the NVIDIA plugin's refusals (`device_plugin::check_profile` and the node-level checks of
//!   `device_plugin::render`) only apply to `nvidia`, and [`check_profile`] to `builtin`.
//! - [`inventory`] (pure): from the applied plan and the GPUs NVML shows, the devices of every
//!   advertised resource (`<uuid>` or `<uuid>::<n>` replica IDs), health, and what `Allocate`
//!   and `GetPreferredAllocation` answer.
//! - [`cdi`] (pure): how `Allocate` names the devices to the runtime, `--device-list-strategy`
//!   as NVIDIA's (`envvar`, `cdi-cri`, `cdi-annotations`), CDI names `nvidia.com/gpu=<uuid>`.
//! - [`server`]: one `DevicePlugin` endpoint per resource, socket named as NVIDIA's
//!   (`nvidia-gpu.sock`, `nvidia-mig-1g.10gb.sock`).
//! - [`manager`]: registers the endpoints with the kubelet, registers again when `kubelet.sock`
//!   is recreated (kubelet restart), re-advertises when the agent applies a new profile, and
//!   marks devices Unhealthy when NVML stops listing them; on agent shutdown stops the
//!   endpoints and removes their sockets.
//!
//! What the driver must support: MPS needs `nvidia-cuda-mps-control` from the driver's compute
//! utilities (`gpu-share doctor --profile` checks it); each MPS resource gets one daemon whose
//! `CUDA_VISIBLE_DEVICES` names only its whole GPUs, so MPS on some GPUs beside MIG on others
//! needs nothing beyond a MIG-capable driver (the catalog's `min_driver`). MPS *inside* MIG
//! devices (`mig` with `mps` in one rule) gets one daemon per MIG device, as the MIG User Guide
//! shows; `validate` states what that needs ([`MPS_ON_MIG_NEEDS`]): the minimum driver could not
//! be sourced (CUDA 11.4 / R470 is commonly cited, unverified).

pub mod api;
pub mod cdi;
pub mod inventory;
pub mod manager;
pub mod server;

use std::collections::BTreeSet;

use crate::profile::{Mode, Problem, Profile, Rule};

pub use crate::sharing::PluginKind;
pub use cdi::{DeviceListStrategy, DeviceListing};
pub use inventory::{DeviceEntry, Inventory, MpsClient, ResourceDevices};
pub use manager::{ManagerSettings, PluginManager};

/// The kubelet's device-plugin directory: `kubelet.sock` and the plugins' sockets.
pub const DEFAULT_DIR: &str = "/var/lib/kubelet/device-plugins";
/// Where a container finds an MPS pipe directory (the NVIDIA plugin's layout).
pub const CONTAINER_MPS_ROOT: &str = "/mps";

/// What the rules alone show the built-in plugin cannot do. It advertises exactly the plan's
/// resources, so most profiles are fine; what remains is MPS ([`check_mps_daemons`]) and
/// whole GPUs shared differently under one resource name (a warning).
pub fn check_profile(name: &str, profile: &Profile) -> Vec<Problem> {
    let mut problems = check_mps_daemons(name, profile);
    let whole_kinds: BTreeSet<&str> = rule_modes(profile)
        .iter()
        .filter(|(_, _, m)| !matches!(m, Mode::Mig { .. }))
        .map(|(_, _, m)| m.keyword())
        .collect();
    if whole_kinds.len() > 1 {
        problems.push(Problem::warning(
            name,
            format!(
                "whole GPUs are shared in different ways ({}) but advertised under one resource name, so a pod cannot choose which it gets; the built-in plugin keeps each container on one GPU and gives MPS settings only to containers placed on MPS GPUs",
                whole_kinds.into_iter().collect::<Vec<_>>().join(", ")
            ),
        ));
    }
    problems
}

fn rule_modes(profile: &Profile) -> Vec<(usize, &Rule, Mode<'_>)> {
    profile
        .rules
        .iter()
        .enumerate()
        .filter_map(|(i, r)| r.mode().ok().map(|m| (i, r, m)))
        .collect()
}

/// What the MPS daemons gpu-share runs (`crate::mps::daemon`: one control daemon per resource
/// name, one per MIG device inside MIG) cannot do, whichever plugin advertises the GPUs: whole
/// MPS GPUs share one daemon, so one default active-thread percentage; MPS inside MIG has
/// needs `validate` states.
pub fn check_mps_daemons(name: &str, profile: &Profile) -> Vec<Problem> {
    let modes = rule_modes(profile);
    let mut problems = Vec::new();
    let mut first_mps: Option<(usize, Option<i64>)> = None;
    for (i, rule, mode) in &modes {
        if let Mode::Mps(mps) = mode {
            match first_mps {
                Some((j, pct)) if pct != mps.active_thread_percentage => problems.push(
                    Problem::error(
                        name,
                        format!(
                            "mps.activeThreadPercentage is {} here but {} in rule {}: MPS GPUs are advertised under one resource, served by one MPS control daemon with one default (give both rules the same value)",
                            show(mps.active_thread_percentage),
                            show(pct),
                            j + 1
                        ),
                    )
                    .in_rule(*i, rule),
                ),
                Some(_) => {}
                None => first_mps = Some((*i, mps.active_thread_percentage)),
            }
        }
    }
    for (i, rule, mode) in &modes {
        if let Mode::Mig { mps: Some(_), .. } = mode {
            problems.push(Problem::warning(name, MPS_ON_MIG_NEEDS).in_rule(*i, rule));
        }
    }
    problems
}

/// What a node must have for MPS inside MIG devices, said by `validate`.
pub const MPS_ON_MIG_NEEDS: &str = "MPS runs inside each MIG device, one control daemon per device (MIG User Guide): the node needs a MIG-capable GPU, an nvidia-cuda-mps-control whose driver supports MPS on MIG (CUDA 11.4 / driver R470 or later is commonly cited; NVIDIA's text found gives no minimum), and compute mode left at Default (EXCLUSIVE_PROCESS is not supported in MIG mode); each device takes fewer clients than 48, in proportion to its compute slices";

fn show(pct: Option<i64>) -> String {
    pct.map_or_else(|| "unset".into(), |p| p.to_string())
}

/// The socket file NVIDIA's plugin would use for `resource`: `nvidia-gpu.sock`,
/// `nvidia-mig-1g.10gb.sock`.
pub fn socket_name(resource: &str) -> String {
    let local = resource.rsplit('/').next().unwrap_or(resource);
    format!("nvidia-{local}.sock")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::parse_profile;

    #[test]
    fn sockets_are_named_like_nvidias() {
        assert_eq!(socket_name("nvidia.com/gpu"), "nvidia-gpu.sock");
        assert_eq!(
            socket_name("nvidia.com/mig-1g.10gb"),
            "nvidia-mig-1g.10gb.sock"
        );
        assert_eq!(
            socket_name("nvidia.com/gpu.shared"),
            "nvidia-gpu.shared.sock"
        );
    }

    #[test]
    fn mps_inside_mig_says_what_the_node_needs() {
        let text = "version: v1\nrules:\n  - devices: all\n    mig: {3g.40gb: 2}\n    mps: {replicas: 4}\n";
        let profile = parse_profile("p", text).unwrap();
        let problems = check_profile("p", &profile);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(!problems[0].is_error());
        assert!(problems[0]
            .message
            .contains("one control daemon per device"));
        assert!(problems[0].message.contains("R470"));
    }

    #[test]
    fn mps_rules_must_agree_on_threads() {
        let text = "version: v1\nrules:\n  - devices: [0]\n    mps: {replicas: 4, activeThreadPercentage: 25}\n  - devices: [1]\n    mps: {replicas: 8, activeThreadPercentage: 50}\n";
        let profile = parse_profile("p", text).unwrap();
        let problems = check_profile("p", &profile);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].is_error());
        assert!(problems[0].to_string().contains("one MPS control daemon"));
    }
}
