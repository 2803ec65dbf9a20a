//! Layer 5, the device plugin: the kubelet's device-plugin directory holds `kubelet.sock` and
//! one socket per resource the plugin serves, `nvidia-<name after "nvidia.com/">.sock`
//! (`nvidia-gpu.sock`, `nvidia-mig-1g.10gb.sock`). A socket file nobody listens on is stale.
//! Whether the node's allocatable resources match is for the API server to say, and doctor does
//! not ask it: that check is always reported as skipped.
//!
//! With `--plugin builtin` the agent serves those sockets itself once it runs, so only
//! `kubelet.sock` must be live (a missing resource socket is a warning), and a profile with MPS
//! needs the tmpfs its clients share as `/dev/shm` at `<mps root>/shm`.
//!
//! With either plugin, the kubelet's PodResources socket should be live: without it the agent's
//! drain sees only the pods with GPU processes, not those holding a device idle (a warning).
//!
//! With `--plugin dra` the layer is `super::dra`'s instead (`super::plugin_layer` picks).

use super::profile::resources;
use super::socket::{describe, pod_resources, probe, Socket};
use super::{Check, Ctx, Facts};
use crate::builtin_plugin::socket_name;
use crate::mps::shm;
use crate::plan::{NodePlan, ObservedNode, PlannedMode};
use crate::sharing::PluginKind;

const NAME: &str = "device-plugin";

/// The device plugin's sockets (`nvidia` or `builtin`); DRA mode is `super::dra`'s.
pub(super) fn check(ctx: &Ctx<'_>, facts: &mut Facts) -> Check {
    let dir = &ctx.paths.device_plugin_dir;
    let kubelet = dir.join("kubelet.sock");
    let mut check = Check::new(NAME, "");
    match probe(&kubelet) {
        Socket::Listening => {}
        Socket::Missing => {
            return Check::failed(
                NAME,
                format!("{} does not exist: the kubelet is not running here", kubelet.display()),
                "start the kubelet (`systemctl status kubelet`, `journalctl -u kubelet`); a kubelet \
                 with another --root-dir keeps its sockets elsewhere: point --device-plugin-dir there",
            )
        }
        other => {
            return Check::failed(
                NAME,
                format!("{} is {}: the kubelet is not listening", kubelet.display(), describe(&other)),
                "restart the kubelet (`sudo systemctl restart kubelet`)",
            )
        }
    }
    pod_resources(ctx, &mut check);
    if ctx.plugin == PluginKind::Builtin {
        return builtin(ctx, facts, check);
    }
    let present: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .filter(|n| n.starts_with("nvidia") && n.ends_with(".sock"))
        .collect();
    let wanted: Vec<(String, u64)> = match &facts.plan {
        Some(plan) => plan
            .resources
            .iter()
            .map(|(r, n)| (r.clone(), *n))
            .collect(),
        None => Vec::new(),
    };
    if wanted.is_empty() {
        // No profile: any NVIDIA plugin socket will do.
        let mut live = Vec::new();
        for name in &present {
            match probe(&dir.join(name)) {
                Socket::Listening => live.push(name.clone()),
                other => check.warn(
                    format!("{name} is {}", describe(&other)),
                    "remove it; the plugin recreates its sockets when it starts",
                ),
            }
        }
        check.found = format!(
            "kubelet.sock listening in {}; NVIDIA plugin sockets: {}",
            dir.display(),
            if live.is_empty() {
                "none".into()
            } else {
                live.join(", ")
            }
        );
        if live.is_empty() {
            check.fail(
                "no NVIDIA device plugin is registered with the kubelet",
                "deploy the NVIDIA device plugin (or the GPU Operator) and look at its pod's log \
                 (`kubectl -n <namespace> logs <nvidia-device-plugin pod>`)",
            );
        }
        return check;
    }
    let mut ok = Vec::new();
    for (resource, count) in &wanted {
        let name = socket_name(resource);
        match probe(&dir.join(&name)) {
            Socket::Listening => ok.push(name),
            other => check.fail(
                format!(
                    "{resource} ({count} in the profile): {name} is {}",
                    describe(&other)
                ),
                "look at the device plugin pod's log: it serves only the resources it finds, so \
                 MIG resources need the instances (`gpu-share apply`) and migStrategy mixed, and \
                 shared ones need its sharing config; restart the pod once they are there",
            ),
        }
    }
    let expected: Vec<String> = wanted.iter().map(|(r, _)| socket_name(r)).collect();
    let extra: Vec<&String> = present.iter().filter(|p| !expected.contains(p)).collect();
    check.found = format!(
        "kubelet.sock listening in {}; the profile's resources ({}) need {}; listening: {}",
        dir.display(),
        resources(&wanted.iter().cloned().collect()),
        expected.join(", "),
        if ok.is_empty() {
            "none".into()
        } else {
            ok.join(", ")
        }
    );
    if !extra.is_empty() {
        check.details.push(format!(
            "also present, not in the profile: {}",
            extra
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    check
}

/// The agent's own plugin: the profile's sockets are reported (it serves them once it runs
/// with `--plugin builtin` and has applied the profile), and MPS's `/dev/shm` tmpfs checked.
fn builtin(ctx: &Ctx<'_>, facts: &Facts, mut check: Check) -> Check {
    let dir = &ctx.paths.device_plugin_dir;
    let wanted: Vec<String> = facts
        .plan
        .iter()
        .flat_map(|p| p.resources.keys())
        .map(|r| socket_name(r))
        .collect();
    let mut live = Vec::new();
    for name in &wanted {
        match probe(&dir.join(name)) {
            Socket::Listening => live.push(name.clone()),
            other => check.warn(
                format!(
                    "{name} is {}: the agent serves it once it runs with --plugin builtin and has \
                     applied the profile",
                    describe(&other)
                ),
                "look at the agent's log (`kubectl -n gpu-share logs <pod> -c agent`); deploy \
                 it with deploy/overlays/builtin",
            ),
        }
    }
    check.found = format!(
        "kubelet.sock listening in {}; built-in plugin (served by the agent){}",
        dir.display(),
        if wanted.is_empty() {
            String::new()
        } else {
            format!(
                ": the profile needs {}; listening: {}",
                wanted.join(", "),
                if live.is_empty() {
                    "none".into()
                } else {
                    live.join(", ")
                }
            )
        }
    );
    if facts
        .plan
        .as_ref()
        .is_some_and(|p| uses_mps(p, facts.node.as_ref()))
    {
        check_shm(ctx, &mut check);
    }
    check
}

/// Whether the plan runs MPS daemons: on whole GPUs, inside MIG devices, or any the daemon
/// layout derives.
fn uses_mps(plan: &NodePlan, node: Option<&ObservedNode>) -> bool {
    plan.gpus.iter().any(|g| {
        matches!(
            g.mode,
            PlannedMode::Mps { .. } | PlannedMode::Mig { mps: Some(_), .. }
        )
    }) || node.is_some_and(|n| {
        crate::mps::daemon::specs_from_plan(&plan.gpus, plan.mig_strategy, n)
            .is_ok_and(|s| !s.is_empty())
    })
}

/// MPS clients reach their server through `/dev/shm`, which the built-in plugin's clients and
/// the agent share as `<mps root>/shm`: NVIDIA mounts a tmpfs there.
fn check_shm(ctx: &Ctx<'_>, check: &mut Check) {
    let path = shm::shm_dir(&ctx.paths.mps_root);
    let fix = format!(
        "mount it: `gpu-share mps mount-shm --mps-root {}` as root with CAP_SYS_ADMIN \
         (deploy/overlays/builtin runs it as a privileged init container)",
        ctx.paths.mps_root.display()
    );
    let mountinfo = &ctx.paths.mountinfo;
    match std::fs::read_to_string(mountinfo).map(|t| shm::find_mount(&t, &path)) {
        Ok(Some(m)) if m.is_tmpfs() => check.details.push(format!(
            "MPS: {} is a tmpfs ({})",
            path.display(),
            m.options
        )),
        Ok(Some(m)) => check.warn(
            format!(
                "MPS: {} is a {} mount, not the tmpfs MPS clients share as /dev/shm",
                path.display(),
                m.fs_type
            ),
            format!("unmount it, then {fix}"),
        ),
        Ok(None) => check.warn(
            format!(
                "MPS: {} is not a mount point: MPS clients and the daemons share /dev/shm \
                 through it, and NVIDIA mounts a tmpfs there (noexec, half the node's memory)",
                path.display()
            ),
            fix,
        ),
        Err(e) => check.warn(
            format!(
                "MPS: cannot read {} to tell whether {} is a tmpfs: {e}",
                mountinfo.display(),
                path.display()
            ),
            "point --mountinfo at the mount table of a process that sees the MPS root \
             (/proc/self/mountinfo)",
        ),
    }
}

/// The allocatable check needs the API server, and doctor checks the node only: it never talks
/// to the API server, so it says so instead of passing.
pub(super) fn allocatable(_ctx: &Ctx<'_>, facts: &mut Facts) -> Check {
    let expect = facts.plan.as_ref().map_or_else(String::new, |p| {
        format!(" (the profile expects {})", resources(&p.resources))
    });
    Check::skip(
        "allocatable",
        format!(
            "not checked: comparing the node's allocatable resources with the plugin's needs \
             the API server, and doctor reads only this node; by hand: `kubectl get \
             node <node> -o jsonpath='{{.status.allocatable}}'`{expect}"
        ),
    )
}
