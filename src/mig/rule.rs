//! What a profile's `mig:` rule asks of the catalog: which models it can apply to, and whether
//! its geometry fits on each of them. Checked at `validate` time, before any GPU is touched.

use std::collections::BTreeMap;

use super::catalog::{catalog, GpuModel};
use super::solver::solve;
use crate::profile::{glob_matches, DeviceSelector};

/// A problem with a MIG rule; `model` is set when it shows on one model only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigRuleProblem {
    pub model: Option<String>,
    pub message: String,
    /// False when the rule fails only on some of the models it might meet (see [`validate`]).
    pub fatal: bool,
}

/// Whether a name looks like a MIG GPU-instance profile (`1g.10gb`, `1g.10gb+me`,
/// `1g.24gb+me.all`, `1g.24gb-me`, `2g.48gb+gfx`).
pub fn is_profile_name(name: &str) -> bool {
    let base = name
        .strip_suffix("+me.all")
        .or_else(|| name.strip_suffix("+me"))
        .or_else(|| name.strip_suffix("+gfx"))
        .or_else(|| name.strip_suffix("-me"))
        .unwrap_or(name);
    let Some((g, mem)) = base.split_once("g.") else {
        return false;
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    digits(g) && mem.strip_suffix("gb").is_some_and(digits)
}

/// The catalog models a selector can land on that this rule could be meant for: by product
/// name for a product selector, else every model that has all the named profiles.
pub fn candidate_models<'a>(
    selector: &DeviceSelector,
    wanted: &BTreeMap<String, u32>,
) -> Vec<&'a GpuModel> {
    let models = &catalog().models;
    match selector {
        DeviceSelector::Product(pattern) => models
            .iter()
            .filter(|m| m.product_names().any(|n| glob_matches(pattern, n)))
            .collect(),
        _ => models
            .iter()
            .filter(|m| wanted.keys().all(|p| m.profile(p).is_some()))
            .collect(),
    }
}

/// Check a MIG rule against every catalog model it could apply to.
///
/// A product selector names its models, so a failure on any of them is fatal. An index or `all`
/// selector may meet any model that has the named profiles, and the same name can mean different
/// geometry on different models (`1g.10gb` is a 1-slot profile, 7 per GPU, on an H100 but a
/// 2-slot one, 4 per GPU, on an A100 40GB). Such a rule is an error only when it fits no model;
/// the models where it does not fit are reported as warnings, since a node of that model would
/// refuse the profile at plan time.
pub fn validate(selector: &DeviceSelector, wanted: &BTreeMap<String, u32>) -> Vec<MigRuleProblem> {
    if let Some(bad) = wanted.keys().find(|n| !is_profile_name(n)) {
        return vec![MigRuleProblem {
            model: None,
            message: format!(
                "{bad:?} is not a MIG profile name (they look like 1g.10gb, 3g.40gb, 1g.10gb+me)"
            ),
            fatal: true,
        }];
    }
    let models = candidate_models(selector, wanted);
    if models.is_empty() {
        return vec![no_model_problem(selector, wanted)];
    }
    let failures: Vec<MigRuleProblem> = models
        .iter()
        .filter_map(|m| {
            solve(m, wanted, &[]).err().map(|e| MigRuleProblem {
                model: Some(m.nvml_name.clone()),
                message: e.to_string(),
                fatal: true,
            })
        })
        .collect();
    let fits_somewhere = failures.len() < models.len();
    let by_product = matches!(selector, DeviceSelector::Product(_));
    failures
        .into_iter()
        .map(|mut p| {
            if fits_somewhere && !by_product {
                p.fatal = false;
                p.message.push_str(
                    " (the rule fits other models; select GPUs by product to say which it is for)",
                );
            }
            p
        })
        .collect()
}

fn no_model_problem(selector: &DeviceSelector, wanted: &BTreeMap<String, u32>) -> MigRuleProblem {
    let models = &catalog().models;
    let message = match selector {
        DeviceSelector::Product(p) => format!(
            "product {p:?} matches no MIG-capable GPU model (known: {})",
            models
                .iter()
                .map(|m| m.nvml_name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        _ => {
            let per_profile: Vec<String> = wanted
                .keys()
                .map(|p| {
                    let having: Vec<&str> = models
                        .iter()
                        .filter(|m| m.profile(p).is_some())
                        .map(|m| m.nvml_name.as_str())
                        .collect();
                    if having.is_empty() {
                        format!("{p} exists on no known model")
                    } else {
                        format!("{p} exists on {}", having.join(", "))
                    }
                })
                .collect();
            format!(
                "no MIG-capable GPU model has all of these profiles: {}",
                per_profile.join("; ")
            )
        }
    };
    MigRuleProblem {
        model: None,
        message,
        fatal: true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn want(pairs: &[(&str, u32)]) -> BTreeMap<String, u32> {
        pairs.iter().map(|(n, c)| (n.to_string(), *c)).collect()
    }

    #[test]
    fn profile_names() {
        for ok in [
            "1g.10gb",
            "7g.141gb",
            "1g.10gb+me",
            "1g.24gb+me.all",
            "1g.24gb-me",
            "2g.48gb+gfx",
        ] {
            assert!(is_profile_name(ok), "{ok}");
        }
        for bad in [
            "1g",
            "10gb",
            "1g.10",
            "g.10gb",
            "1g.10gb+foo",
            "mig-1g.10gb",
        ] {
            assert!(!is_profile_name(bad), "{bad}");
        }
    }

    #[test]
    fn a_profile_on_no_model_names_where_each_exists() {
        let p = validate(
            &DeviceSelector::All,
            &want(&[("1g.10gb", 1), ("1g.18gb", 1)]),
        );
        assert_eq!(p.len(), 1);
        assert!(
            p[0].message.contains("1g.18gb exists on NVIDIA H200"),
            "{}",
            p[0].message
        );
    }

    #[test]
    fn a_rule_that_fits_some_models_warns_about_the_others() {
        let p = validate(&DeviceSelector::All, &want(&[("1g.10gb", 7)]));
        assert_eq!(p.len(), 1);
        assert!(!p[0].fatal);
        assert_eq!(p[0].model.as_deref(), Some("NVIDIA A100-SXM4-40GB"));
        let p = validate(&DeviceSelector::All, &want(&[("1g.10gb", 8)]));
        assert!(p.iter().all(|p| p.fatal), "fits nowhere: {p:?}");
    }

    #[test]
    fn product_selectors_check_the_matched_models_only() {
        let sel = DeviceSelector::Product("NVIDIA H100 80GB*".into());
        assert!(validate(&sel, &want(&[("1g.10gb", 7)])).is_empty());
        let p = validate(&sel, &want(&[("1g.18gb", 1)]));
        assert_eq!(p[0].model.as_deref(), Some("NVIDIA H100 80GB HBM3"));
        assert!(
            p[0].message.contains("no MIG profile \"1g.18gb\""),
            "{}",
            p[0].message
        );
    }
}
