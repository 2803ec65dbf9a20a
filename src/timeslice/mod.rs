//! Time-slicing: the device plugin advertises each device `replicas` times and CUDA time-slices
//! the pods that land on it. No memory or fault isolation; this module owns its validation and
//! its share of the advertised resources.

use crate::profile::{MigStrategy, TimeSlicing};
use crate::sharing::{PlannedMode, GPU_RESOURCE};

/// The replica bounds are part of the profile format (its schema states them); this mode checks them.
pub use crate::profile::{
    MAX_TIME_SLICING_REPLICAS as MAX_REPLICAS, MIN_TIME_SLICING_REPLICAS as MIN_REPLICAS,
};

/// Problems with a `timeSlicing` block, as sentences.
pub fn validate(ts: &TimeSlicing) -> Vec<String> {
    if ts.replicas > MAX_REPLICAS {
        return vec![format!(
            "timeSlicing.replicas is {}, but it must be between {MIN_REPLICAS} and {MAX_REPLICAS}: each replica is one device listed to the kubelet, and a node runs at most 110 pods by default",
            ts.replicas
        )];
    }
    if ts.replicas < MIN_REPLICAS {
        let hint = if ts.replicas == 1 {
            " (one replica is not sharing: use `exclusive: true`)"
        } else {
            ""
        };
        return vec![format!(
            "timeSlicing.replicas is {}, but the number of replicas must be >= {MIN_REPLICAS}{hint}",
            ts.replicas
        )];
    }
    Vec::new()
}

/// How many schedulable devices one time-sliced device becomes.
pub fn replicas(ts: Option<&TimeSlicing>) -> u64 {
    ts.map_or(1, |t| t.replicas.max(1) as u64)
}

/// This mode's entries in the device plugin's `sharing.timeSlicing.resources`: the resource a
/// GPU's devices are advertised under, and its replicas. Whole GPUs are `nvidia.com/gpu`; time-
/// sliced MIG devices are their profile's resource (`nvidia.com/gpu` under `single`).
pub fn plugin_resources(mode: &PlannedMode, strategy: MigStrategy) -> Vec<(String, u64)> {
    match mode {
        PlannedMode::TimeSlicing { replicas } => vec![(GPU_RESOURCE.to_string(), *replicas)],
        PlannedMode::Mig {
            instances,
            replicas,
            mps: None,
        } if *replicas > 1 => instances
            .keys()
            .map(|p| match strategy {
                MigStrategy::Single => GPU_RESOURCE.to_string(),
                _ => crate::mig::catalog::resource_name(p),
            })
            .map(|name| (name, *replicas))
            .collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replicas_below_two_are_refused_with_the_plugins_reason() {
        for r in [-3, 0, 1] {
            let p = validate(&TimeSlicing { replicas: r });
            assert_eq!(p.len(), 1);
            assert!(p[0].contains("must be >= 2"), "{}", p[0]);
        }
        assert!(validate(&TimeSlicing { replicas: 1 })[0].contains("exclusive: true"));
        assert!(validate(&TimeSlicing { replicas: 2 }).is_empty());
    }

    #[test]
    fn time_slices_are_never_consumable() {
        let text = "version: v1\nrules:\n  - devices: all\n    timeSlicing: {replicas: 4, consumable: {}}\n";
        let e = crate::profile::parse_profile("p", text)
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown field `consumable`"), "{e}");
        assert!(e.contains("isolates neither memory nor compute"), "{e}");
    }

    #[test]
    fn replicas_above_the_cap_are_refused() {
        assert!(validate(&TimeSlicing {
            replicas: MAX_REPLICAS
        })
        .is_empty());
        let p = validate(&TimeSlicing {
            replicas: 1_000_000_000,
        });
        assert_eq!(p.len(), 1);
        assert!(
            p[0].contains("is 1000000000, but it must be between 2 and 1024"),
            "{}",
            p[0]
        );
    }
}
