//! Fractional GPUs: an MPS GPU offered as one DRA device that claims share by memory, compute
//! and clients (`mps: {replicas: N, consumable: {...}}`). This module checks a profile's
//! `consumable` block and works out the request policies the device is published with;
//! `crate::dra` publishes them and the kubelet plugin sets each claim's MPS limits from what
//! the scheduler gave it.
//!
//! The policy rules are the ones the API server applies to a capacity's `requestPolicy`
//! (`validateRequestPolicyRange`, pkg/apis/resource/validation/validation.go, Kubernetes 1.36):
//! `min` no larger than the capacity, `default` at least `min`, `min` plus one `step` within
//! the capacity, `default` a whole number of steps from `min`. They are checked here, with the
//! profile's words, so that a profile the server would refuse is refused before anything is
//! published. Compute's capacity (100 %) is known from the profile alone; memory's only from
//! the GPU, so those checks wait for the plan ([`shares`]).
//!
//! The daemon gets no default limits of its own: a client's environment only tightens the
//! daemon's defaults, never loosens them (measured on a real H200,
//! ../shared/reference/h200-mps-measured.md), so a default below a claim's share would hold
//! that claim under what it was given.

use super::{parse_pinned_memory_limit, MpsError, PinnedMemoryLimit};
use crate::profile::{Consumable, Mps};
use crate::sharing::{ConsumableShares, RequestPolicy, WHOLE_COMPUTE_PERCENT};

/// Problems with an `mps` block's `consumable` part, as sentences (none without one).
pub fn validate(mps: &Mps) -> Vec<String> {
    let Some(consumable) = &mps.consumable else {
        return Vec::new();
    };
    let mut problems = Vec::new();
    for (field, set) in [
        (
            "activeThreadPercentage",
            mps.active_thread_percentage.is_some(),
        ),
        ("pinnedMemoryLimit", mps.pinned_memory_limit.is_some()),
    ] {
        if set {
            problems.push(format!(
                "mps.{field} cannot be given beside mps.consumable: it would be the MPS daemon's \
                 default, and a client can only tighten the daemon's default, so a claim given \
                 more than it would be held below its share; each claim's limit comes from what \
                 the scheduler gave it"
            ));
        }
    }
    match memory_policy(consumable) {
        Ok(memory) => problems.extend(policy_problems("memory", "MiB", memory, None)),
        Err(e) => problems.extend(e),
    }
    let compute = compute_policy(consumable);
    // The profile's own numbers in the message (the policy reads a negative one as 0).
    let raw = &consumable.compute;
    for (field, value) in [("default", raw.default), ("min", raw.min)] {
        if !(1..=WHOLE_COMPUTE_PERCENT as i64).contains(&value) {
            problems.push(format!(
                "mps.consumable.compute.{field} is {value}, but it must be between 1 and 100 (percent of the GPU's SMs)"
            ));
        }
    }
    if consumable.compute.default < 0 || consumable.compute.min < 0 || consumable.compute.step < 0 {
        problems.push("mps.consumable.compute values must not be negative".into());
    } else {
        problems.extend(policy_problems(
            "compute",
            "%",
            compute,
            Some(WHOLE_COMPUTE_PERCENT),
        ));
    }
    problems
}

/// The consumable shares of a device with `memory_mib` (`whose` names it when unknown), or
/// `None` for an `mps` block without `consumable`.
pub fn shares(
    mps: &Mps,
    memory_mib: Option<u64>,
    whose: &str,
) -> Result<Option<ConsumableShares>, MpsError> {
    let Some(consumable) = &mps.consumable else {
        return Ok(None);
    };
    let memory_mib = memory_mib.ok_or_else(|| {
        MpsError::Consumable(format!(
            "mps.consumable shares {whose} memory, but its size is unknown"
        ))
    })?;
    let memory = memory_policy(consumable).map_err(|e| MpsError::Consumable(e.join("; ")))?;
    if let Some(why) = policy_problems("memory", "MiB", memory, Some(memory_mib))
        .into_iter()
        .next()
    {
        return Err(MpsError::Consumable(format!("{why} ({whose})")));
    }
    Ok(Some(ConsumableShares {
        memory_mib,
        memory,
        compute: compute_policy(consumable),
    }))
}

/// The pinned memory of one of `replicas` equal shares of a consumable device: what each gets
/// when the API server cannot share the device by capacity and fixed shares are published
/// instead (`pinnedMemoryLimit: auto`'s split).
pub fn fixed_share_mib(shares: &ConsumableShares, replicas: u64) -> u64 {
    shares.memory_mib / replicas.max(1)
}

fn memory_policy(c: &Consumable) -> Result<RequestPolicy, Vec<String>> {
    let size = |field: &str, text: &str| {
        match parse_pinned_memory_limit(text) {
        Ok(PinnedMemoryLimit::Mib(mib)) => Ok(mib),
        _ => Err(format!(
            "mps.consumable.memory.{field} {text:?} is not a size such as 4Gi or 512Mi (more than 0)"
        )),
    }
    };
    let parsed = [
        size("default", &c.memory.default),
        size("min", &c.memory.min),
        size("step", &c.memory.step),
    ];
    let problems: Vec<String> = parsed.iter().filter_map(|r| r.clone().err()).collect();
    match parsed {
        [Ok(default), Ok(min), Ok(step)] => Ok(RequestPolicy { default, min, step }),
        _ => Err(problems),
    }
}

fn compute_policy(c: &Consumable) -> RequestPolicy {
    let n = |v: i64| u64::try_from(v).unwrap_or(0);
    RequestPolicy {
        default: n(c.compute.default),
        min: n(c.compute.min),
        step: n(c.compute.step),
    }
}

/// What the API server would refuse in `policy` for a capacity of `capacity` (when known), and
/// a default above the capacity, which no claim could be given.
fn policy_problems(
    what: &str,
    unit: &str,
    policy: RequestPolicy,
    capacity: Option<u64>,
) -> Vec<String> {
    let RequestPolicy { default, min, step } = policy;
    let field = |f: &str| format!("mps.consumable.{what}.{f}");
    let mut problems = Vec::new();
    if step == 0 {
        problems.push(format!("{} must be more than 0", field("step")));
        return problems;
    }
    if default < min {
        problems.push(format!(
            "{} is {default} {unit}, less than {} ({min} {unit})",
            field("default"),
            field("min")
        ));
    } else if (default - min) % step != 0 {
        problems.push(format!(
            "{} is {default} {unit}, which is not min ({min} {unit}) plus a whole number of steps ({step} {unit}): the scheduler gives claims only such amounts",
            field("default")
        ));
    }
    if let Some(capacity) = capacity {
        if min.saturating_add(step) > capacity {
            problems.push(format!(
                "{} plus one {} is {} {unit}, more than the device's {capacity} {unit}",
                field("min"),
                field("step"),
                min.saturating_add(step)
            ));
        }
        if default > capacity {
            problems.push(format!(
                "{} is {default} {unit}, more than the device's {capacity} {unit}",
                field("default")
            ));
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::{ComputePolicy, MemoryPolicy};

    fn mps(memory: [&str; 3], compute: [i64; 3]) -> Mps {
        Mps {
            replicas: 16,
            active_thread_percentage: None,
            pinned_memory_limit: None,
            consumable: Some(Consumable {
                memory: MemoryPolicy {
                    default: memory[0].into(),
                    min: memory[1].into(),
                    step: memory[2].into(),
                },
                compute: ComputePolicy {
                    default: compute[0],
                    min: compute[1],
                    step: compute[2],
                },
            }),
        }
    }

    #[test]
    fn a_policy_the_server_accepts_is_valid_and_resolves_in_mib_and_percent() {
        let m = mps(["4Gi", "1Gi", "1Gi"], [10, 5, 5]);
        assert!(validate(&m).is_empty(), "{:?}", validate(&m));
        let shares = shares(&m, Some(81559), "this GPU's").unwrap().unwrap();
        assert_eq!(
            shares.memory,
            RequestPolicy {
                default: 4096,
                min: 1024,
                step: 1024
            }
        );
        assert_eq!(shares.compute.default, 10);
        assert_eq!(shares.memory_mib, 81559);
        assert_eq!(fixed_share_mib(&shares, 16), 5097);
    }

    // Each refusal below is one of validateRequestPolicyRange's (validation.go, 1.36).
    #[test]
    fn a_default_below_min_is_refused() {
        let p = validate(&mps(["512Mi", "1Gi", "1Gi"], [10, 5, 5]));
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(
            p[0].contains("memory.default is 512 MiB, less than"),
            "{p:?}"
        );
    }

    #[test]
    fn a_default_off_the_step_is_refused() {
        let p = validate(&mps(["4Gi", "1Gi", "1Gi"], [12, 5, 5]));
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(p[0].contains("compute.default is 12 %"), "{p:?}");
        assert!(p[0].contains("whole number of steps (5 %)"), "{p:?}");
    }

    #[test]
    fn one_step_past_the_capacity_is_refused() {
        let p = validate(&mps(["4Gi", "1Gi", "1Gi"], [100, 100, 5]));
        assert!(
            p.iter()
                .any(|m| m.contains("plus one") && m.contains("105 %")),
            "{p:?}"
        );
        let m = mps(["1Gi", "1Gi", "80Gi"], [10, 5, 5]);
        let e = shares(&m, Some(81559), "this GPU's").unwrap_err();
        assert!(
            e.to_string()
                .contains("more than the device's 81559 MiB (this GPU's)"),
            "{e}"
        );
    }

    #[test]
    fn daemon_defaults_beside_consumable_are_refused() {
        let mut m = mps(["4Gi", "1Gi", "1Gi"], [10, 5, 5]);
        m.active_thread_percentage = Some(50);
        m.pinned_memory_limit = Some("auto".into());
        let p = validate(&m);
        assert_eq!(p.len(), 2, "{p:?}");
        assert!(p.iter().all(|m| m.contains("can only tighten")), "{p:?}");
    }

    /// The daemon of consumable GPUs gets no defaults (module doc: a client only tightens
    /// them), and a fixed-MPS rule with a thread default beside a consumable one is refused: the
    /// two would share one daemon and its default would cap every claim.
    #[test]
    fn the_daemon_of_consumable_gpus_has_no_defaults() {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/profiles/dra/h100-fractional.yaml"
        ))
        .unwrap();
        let profile = crate::profile::parse_profile("f", &text).unwrap();
        let node = crate::gpu::ObservedNode::simulated(&["h100x2".to_string()]);
        let plan =
            crate::plan::plan_for("f", &profile, &node, crate::sharing::PluginKind::Dra).unwrap();
        let specs =
            super::super::daemon::specs_from_plan(&plan.gpus, plan.mig_strategy, &node).unwrap();
        assert_eq!(specs.len(), 1);
        assert_eq!(specs[0].active_thread_percentage, None);
        assert_eq!(specs[0].gpus.len(), 2);
        assert!(specs[0]
            .gpus
            .iter()
            .all(|g| g.pinned_memory_limit_mib.is_none()));

        let mixed = text.replace("devices: all", "devices: [0]")
            + "  - devices: [1]\n    mps: {replicas: 4, activeThreadPercentage: 25}\n";
        let profile = crate::profile::parse_profile("f", &mixed).unwrap();
        let problems =
            crate::validate::validate_for("f", &profile, crate::sharing::PluginKind::Dra);
        assert!(
            problems
                .iter()
                .any(|p| p.is_error() && p.message.contains("one MPS control daemon")),
            "{problems:?}"
        );
    }

    #[test]
    fn bad_sizes_and_percentages_are_named() {
        let p = validate(&mps(["lots", "1Gi", "0Mi"], [0, 101, 5]));
        assert!(
            p.iter()
                .any(|m| m.contains("memory.default \"lots\" is not a size")),
            "{p:?}"
        );
        assert!(p.iter().any(|m| m.contains("memory.step \"0Mi\"")), "{p:?}");
        assert!(
            p.iter().any(|m| m.contains("compute.default is 0")),
            "{p:?}"
        );
        assert!(p.iter().any(|m| m.contains("compute.min is 101")), "{p:?}");
        let p = validate(&mps(["4Gi", "1Gi", "1Gi"], [-5, 5, 5]));
        assert!(
            p.iter()
                .any(|m| m.contains("compute.default is -5, but it must be between 1 and 100")),
            "the profile's number, not the 0 it is read as: {p:?}"
        );
    }
}
