//! The NVIDIA device plugin's own validation, applied to what we render before it is written:
//! the plugin exits on a config it rejects, even on a SIGHUP reload, so we must never write one.
//! Messages are the plugin's (docs/sources.md#device-plugin-refusals).

use super::config::{PluginConfig, ReplicatedResources};
use crate::profile::MigStrategy;
use crate::profile::MAX_MPS_REPLICAS as MAX_REPLICAS;

/// Every reason the plugin (or its MPS daemon) would refuse this config.
pub fn check(config: &PluginConfig) -> Vec<String> {
    let mut problems = Vec::new();
    if config.version != "v1" {
        problems.push(format!("unknown version: {}", config.version));
    }
    let sharing = &config.sharing;
    if sharing.time_slicing.is_some() && sharing.mps.is_some() {
        problems.push(
            "both sharing.timeSlicing and sharing.mps are set: the plugin would use MPS and silently ignore time-slicing"
                .into(),
        );
    }
    if let Some(ts) = &sharing.time_slicing {
        problems.extend(check_resources(ts));
    }
    if let Some(mps) = &sharing.mps {
        problems.extend(check_resources(mps));
        match config.flags.mig_strategy {
            MigStrategy::Mixed => {
                problems.push("using --mig-strategy=mixed is not supported with MPS".into())
            }
            MigStrategy::Single => {
                problems.push("sharing using MPS is not supported for MIG devices".into())
            }
            MigStrategy::None => {}
        }
        if config.flags.mps_root.as_deref().is_none_or(str::is_empty) {
            problems.push("using MPS requires --mps-root to be specified".into());
        }
        for r in mps
            .resources
            .iter()
            .filter(|r| r.replicas > MAX_REPLICAS as u64)
        {
            problems.push(format!(
                "invalid MPS configuration: invalid device maximum allowed replicas exceeded: {} > {MAX_REPLICAS}",
                r.replicas
            ));
        }
    }
    problems
}

fn check_resources(block: &ReplicatedResources) -> Vec<String> {
    if block.resources.is_empty() {
        return vec!["no resources specified".into()];
    }
    let mut problems = Vec::new();
    for (i, r) in block.resources.iter().enumerate() {
        if r.replicas < 2 {
            problems.push("number of replicas must be >= 2".into());
        }
        problems.extend(check_resource_name(&r.name));
        if block.resources[..i].iter().any(|o| o.name == r.name) {
            problems.push(format!("resource {} is listed twice", r.name));
        }
    }
    problems
}

/// `nvidia.com/<name>`: at most 63 characters in all, the part after the prefix a DNS
/// subdomain (lowercase alphanumerics, `-` and `.`, alphanumeric at both ends).
fn check_resource_name(name: &str) -> Option<String> {
    if name.len() > 63 {
        return Some(format!(
            "fully-qualified resource name must be 63 characters or less: {name}"
        ));
    }
    let local = name.strip_prefix("nvidia.com/").unwrap_or(name);
    let ok_chars = local
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
    let ok_ends = local.starts_with(|c: char| c.is_ascii_alphanumeric())
        && local.ends_with(|c: char| c.is_ascii_alphanumeric());
    (!(ok_chars && ok_ends)).then(|| {
        format!("incorrect format for resource name '{name}': must be a lowercase DNS subdomain")
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nvidia_plugin::config::{Flags, ReplicatedResource, Sharing};

    fn config(strategy: MigStrategy, sharing: Sharing, mps_root: Option<&str>) -> PluginConfig {
        PluginConfig {
            version: "v1".into(),
            flags: Flags {
                mig_strategy: strategy,
                mps_root: mps_root.map(str::to_string),
            },
            sharing,
        }
    }

    fn block(resources: Vec<ReplicatedResource>) -> Option<ReplicatedResources> {
        Some(ReplicatedResources {
            resources,
            ..Default::default()
        })
    }

    #[test]
    fn the_plugins_refusals_are_quoted() {
        let gpu = |r| ReplicatedResource::all_devices("nvidia.com/gpu", r);
        let mps_mixed = config(
            MigStrategy::Mixed,
            Sharing {
                mps: block(vec![gpu(4)]),
                time_slicing: None,
            },
            None,
        );
        assert_eq!(
            check(&mps_mixed),
            [
                "using --mig-strategy=mixed is not supported with MPS",
                "using MPS requires --mps-root to be specified"
            ]
        );
        let one = config(
            MigStrategy::None,
            Sharing {
                time_slicing: block(vec![gpu(1)]),
                mps: None,
            },
            None,
        );
        assert_eq!(check(&one), ["number of replicas must be >= 2"]);
        let empty = config(
            MigStrategy::None,
            Sharing {
                time_slicing: block(vec![]),
                mps: None,
            },
            None,
        );
        assert_eq!(check(&empty), ["no resources specified"]);
        let too_many = config(
            MigStrategy::None,
            Sharing {
                mps: block(vec![gpu(64)]),
                time_slicing: None,
            },
            Some("/run/nvidia/mps"),
        );
        assert_eq!(
            check(&too_many),
            ["invalid MPS configuration: invalid device maximum allowed replicas exceeded: 64 > 48"]
        );
    }

    #[test]
    fn resource_names() {
        assert!(check_resource_name("nvidia.com/mig-1g.10gb.me").is_none());
        assert!(check_resource_name("nvidia.com/GPU").is_some());
        assert!(check_resource_name(&format!("nvidia.com/{}", "a".repeat(60))).is_some());
    }
}
