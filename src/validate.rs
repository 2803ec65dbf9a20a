//! Whether a profile can be applied: every rule on its own, against every catalog model it could
//! match, then the rules together (overlapping selectors, the MIG strategy the device plugin
//! will need), then what the plugin that advertises the node can express.
//!
//! It composes: the format (`crate::profile`), each sharing mode's own rules (`crate::mig`,
//! `crate::mps`, `crate::timeslice`), the NVIDIA plugin's refusals (`crate::nvidia_plugin`) and
//! the built-in plugin's limits (here: that plugin advertises exactly the plan, so what it cannot
//! do fits in [`builtin_plugin_limits`]). So it sits above all of them and below `crate::plan`,
//! which refuses to plan an invalid profile.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::mig::{catalog, rule as mig_rule};
use crate::profile::{
    mig_counts, DeviceSelector, MigStrategy, Mode, Problem, Profile, Rule, MAX_GPU_INDEX,
    MAX_RULES, VERSION,
};
use crate::sharing::PluginKind;
use crate::{mps, timeslice};

/// Every problem in a profile; an empty list means it is valid. `name` is the profile's name
/// (ConfigMap key or file stem), used in the messages. Checks what the NVIDIA device plugin can
/// express, as [`validate_for`] with [`PluginKind::Nvidia`].
pub fn validate(name: &str, profile: &Profile) -> Vec<Problem> {
    validate_for(name, profile, PluginKind::Nvidia)
}

/// [`validate`] for the device plugin that will advertise the node: the NVIDIA plugin's
/// refusals, or the built-in plugin's own rules.
pub fn validate_for(name: &str, profile: &Profile, plugin: PluginKind) -> Vec<Problem> {
    let mut problems = Vec::new();
    if profile.version != VERSION {
        problems.push(Problem::error(
            name,
            format!(
                "version {:?} is not supported: this gpu-share reads version {VERSION}",
                profile.version
            ),
        ));
    }
    if profile.rules.is_empty() {
        problems.push(Problem::error(
            name,
            "the profile has no rules: give at least one (e.g. {devices: all, timeSlicing: {replicas: 2}})",
        ));
    }
    if profile.rules.len() > MAX_RULES {
        problems.push(Problem::error(
            name,
            format!(
                "the profile has {} rules, but at most {MAX_RULES} are allowed: a node has at most {} GPUs, so the rules can be merged (one rule may select many GPUs)",
                profile.rules.len(),
                MAX_GPU_INDEX + 1
            ),
        ));
    }
    for (i, rule) in profile.rules.iter().enumerate() {
        problems.extend(validate_rule(name, i, rule));
    }
    problems.extend(overlapping_selectors(name, &profile.rules));
    problems.extend(check_mig_strategy(name, profile));
    if plugin != PluginKind::Dra {
        problems.extend(dynamic_mig_needs_dra(name, profile, plugin));
        problems.extend(consumable_needs_dra(name, profile, plugin));
    }
    problems.extend(match plugin {
        PluginKind::Nvidia => crate::nvidia_plugin::check_profile(name, profile),
        PluginKind::Builtin => builtin_plugin_limits(name, profile),
        // Each GPU (and MIG device) is its own DRA device with its own attributes: none of
        // the NVIDIA plugin's node-wide restrictions applies, but the MPS daemons gpu-share
        // runs are the same whichever plugin advertises their clients.
        PluginKind::Dra => mps::check_daemons(name, profile),
    });
    problems
}

/// `dynamicMig` rules under a device plugin: an error each. A device plugin advertises a fixed
/// list of devices to the kubelet, so nobody could ask for a placement that does not exist yet;
/// only DRA lets the scheduler pick one from every placement a GPU could hold.
fn dynamic_mig_needs_dra(name: &str, profile: &Profile, plugin: PluginKind) -> Vec<Problem> {
    profile
        .rule_modes()
        .into_iter()
        .filter(|(_, _, m)| matches!(m, Mode::DynamicMig))
        .map(|(i, rule, _)| {
            Problem::error(
                name,
                format!(
                    "dynamicMig needs `--plugin dra`: with --plugin {} the device plugin \
                     advertises a fixed list of devices, so no pod could ask for an instance \
                     that does not exist yet; use `mig: {{...}}` for a fixed geometry",
                    plugin.name()
                ),
            )
            .in_rule(i, rule)
        })
        .collect()
}

/// `mps.consumable` rules under a device plugin: an error each. A device plugin advertises a
/// count of identical devices, which the kubelet hands out whole; only DRA lets the scheduler
/// share one device by memory and compute.
fn consumable_needs_dra(name: &str, profile: &Profile, plugin: PluginKind) -> Vec<Problem> {
    profile
        .rule_modes()
        .into_iter()
        .filter(|(_, rule, _)| rule.mps.as_ref().is_some_and(|m| m.consumable.is_some()))
        .map(|(i, rule, _)| {
            Problem::error(
                name,
                format!(
                    "mps.consumable needs `--plugin dra`: with --plugin {} the device plugin \
                     advertises a count of identical devices, so no pod could ask for memory or \
                     compute; drop `consumable` for fixed shares",
                    plugin.name()
                ),
            )
            .in_rule(i, rule)
        })
        .collect()
}

/// What the rules alone show the built-in plugin (`--plugin builtin`) cannot do. It advertises
/// exactly the plan's resources, so most profiles are fine; what remains is MPS
/// ([`mps::check_daemons`]) and whole GPUs shared differently under one resource name (a
/// warning).
pub fn builtin_plugin_limits(name: &str, profile: &Profile) -> Vec<Problem> {
    let mut problems = mps::check_daemons(name, profile);
    let whole_kinds: BTreeSet<&str> = profile
        .rule_modes()
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

fn validate_rule(name: &str, index: usize, rule: &Rule) -> Vec<Problem> {
    let at = |message: String| Problem::error(name, message).in_rule(index, rule);
    let mut problems: Vec<Problem> = check_selector(&rule.devices).into_iter().map(at).collect();
    let mode = match rule.mode() {
        Ok(mode) => mode,
        Err(e) => {
            problems.push(at(e.to_string()));
            return problems;
        }
    };
    let messages = match mode {
        Mode::Exclusive => Vec::new(),
        Mode::DynamicMig => dynamic_mig_selects_mig_models(&rule.devices),
        Mode::TimeSlicing(ts) => timeslice::validate(ts),
        Mode::Mps(m) => {
            problems.extend(mps_on_the_selected_gpus(name, index, rule, m));
            mps::validate(m)
        }
        Mode::Mig {
            instances,
            time_slicing,
            mps,
        } => {
            let mut messages = time_slicing.map(timeslice::validate).unwrap_or_default();
            messages.extend(mps.map(mps::validate).unwrap_or_default());
            messages.extend(mig_counts_problems(instances));
            messages.extend(mig_on_a_tegra(&rule.devices));
            if let Some(m) = mps {
                problems.extend(mps_clients_on_mig(name, index, rule, m.replicas, instances));
            }
            problems.extend(messages.drain(..).map(at));
            if problems.is_empty() {
                problems.extend(
                    mig_rule::validate(&rule.devices, &mig_counts(instances))
                        .into_iter()
                        .map(|p| {
                            let mut problem = at(p.message);
                            if !p.fatal {
                                problem.severity = crate::profile::Severity::Warning;
                            }
                            match p.model {
                                Some(model) => problem.on_gpu(model),
                                None => problem,
                            }
                        }),
                );
            }
            Vec::new()
        }
    };
    problems.extend(messages.into_iter().map(at));
    problems
}

/// A dynamic rule whose product selector names only GPUs without MIG does nothing dynamic:
/// said as an error, since the writer meant MIG (an index or `all` selector may also meet MIG
/// GPUs, and the others are published whole, never refused).
fn dynamic_mig_selects_mig_models(selector: &DeviceSelector) -> Vec<String> {
    match selector {
        DeviceSelector::Product(product)
            if mig_rule::candidate_models(selector, &BTreeMap::new()).is_empty() =>
        {
            vec![format!(
                "dynamicMig selects {product:?}, which matches no MIG-capable model of the \
                 catalog (`gpu-share catalog` lists them): its GPUs would only be published whole"
            )]
        }
        _ => Vec::new(),
    }
}

/// A MIG rule whose product selector names a Jetson/Tegra board: its integrated GPU has no
/// MIG (and no NVML to make instances with), whatever the node.
fn mig_on_a_tegra(selector: &DeviceSelector) -> Option<String> {
    match selector {
        DeviceSelector::Product(product) if crate::gpu::tegra::names_a_tegra(product) => {
            Some(format!(
                "MIG is not available on {product}: a Jetson/Tegra integrated GPU has no MIG \
                 (nor the NVML that makes instances); share it by time-slicing \
                 (`timeSlicing: {{replicas: N}}`)"
            ))
        }
        _ => None,
    }
}

/// What the selector tells about MPS before a node is seen: a product selector naming a
/// Jetson/Tegra board cannot have MPS (an error), and a fixed pinned-memory limit above the
/// memory of every GPU the rule can select limits nothing (a warning; `plan` checks each GPU).
fn mps_on_the_selected_gpus(
    name: &str,
    index: usize,
    rule: &Rule,
    m: &crate::profile::Mps,
) -> Vec<Problem> {
    if let DeviceSelector::Product(product) = &rule.devices {
        if let Some(why) = mps::unavailable_on(product) {
            return vec![Problem::error(name, why).in_rule(index, rule)];
        }
    }
    let models = mig_rule::candidate_models(&rule.devices, &BTreeMap::new());
    mps::pinned_over_every_model(m, &models)
        .map(|why| Problem::warning(name, why).in_rule(index, rule))
        .into_iter()
        .collect()
}

/// MPS clients per MIG device, checked against every catalog model with the profile: an error
/// when no model's instance of that profile takes that many, a warning naming the models that
/// can't when only some can (`plan` checks the node's own model).
fn mps_clients_on_mig(
    name: &str,
    index: usize,
    rule: &Rule,
    replicas: i64,
    instances: &std::collections::BTreeMap<String, i64>,
) -> Vec<Problem> {
    let mut problems = Vec::new();
    for profile_name in instances.keys() {
        let (fit, refusals): (Vec<_>, Vec<_>) = catalog()
            .models
            .iter()
            .filter_map(|model| model.profile(profile_name).map(|p| (model, p)))
            .partition(|(model, p)| mps::too_many_clients_on_mig(replicas, p, model).is_none());
        for (model, p) in &refusals {
            let why = mps::too_many_clients_on_mig(replicas, p, model).expect("partitioned");
            if fit.is_empty() {
                problems.push(Problem::error(name, why).in_rule(index, rule));
                break;
            }
            problems.push(
                Problem::warning(name, why)
                    .in_rule(index, rule)
                    .on_gpu(model.nvml_name.clone()),
            );
        }
    }
    problems
}

fn mig_counts_problems(instances: &std::collections::BTreeMap<String, i64>) -> Vec<String> {
    if instances.is_empty() {
        return vec![
            "mig lists no instances: give profile: count pairs such as {1g.10gb: 7}".into(),
        ];
    }
    instances
        .iter()
        .filter(|(_, &c)| c < 1)
        .map(|(n, c)| format!("mig asks for {c} × {n}: a count must be at least 1 (leave the profile out instead)"))
        .collect()
}

fn check_selector(selector: &DeviceSelector) -> Vec<String> {
    match selector {
        DeviceSelector::Indices(list) if list.is_empty() => {
            vec!["devices is an empty list: it selects no GPU".into()]
        }
        DeviceSelector::Indices(list) => {
            let mut problems = Vec::new();
            let too_large: BTreeSet<u32> = list
                .iter()
                .filter(|&&i| i > MAX_GPU_INDEX)
                .copied()
                .collect();
            if !too_large.is_empty() {
                problems.push(format!(
                    "devices lists GPU {}, but GPU indices run from 0 to {MAX_GPU_INDEX} (NVML numbers a node's GPUs from 0; no node has more than {} GPUs)",
                    join(&too_large),
                    MAX_GPU_INDEX + 1
                ));
            }
            let mut seen = BTreeSet::new();
            let dups: BTreeSet<u32> = list.iter().filter(|i| !seen.insert(**i)).copied().collect();
            if !dups.is_empty() {
                problems.push(format!("devices lists GPU {} more than once", join(&dups)));
            }
            problems
        }
        DeviceSelector::Product(p) if p.trim().is_empty() => {
            vec!["devices.product is empty".into()]
        }
        _ => Vec::new(),
    }
}

/// A GPU takes exactly one rule, so two selectors that can pick the same GPU are an error.
/// Index and product selectors can only be compared on a concrete node; `plan` checks those.
///
/// Linear in the rules: each GPU index, catalog product name and product pattern remembers the
/// first rule that claimed it, and a later rule is checked against those claims, not against
/// every earlier rule (comparing all pairs took 10 s for 8k rules). Each rule that overlaps is
/// reported once, against the first earlier rule it meets.
fn overlapping_selectors(name: &str, rules: &[Rule]) -> Vec<Problem> {
    let mut claims = Claims::default();
    let mut problems = Vec::new();
    for (j, rule) in rules.iter().enumerate() {
        if let Some((i, why)) = claims.claim(j, &rule.devices) {
            problems.push(
                Problem::error(
                    name,
                    format!(
                        "its devices overlap rule {}'s: {why}; a GPU takes exactly one rule",
                        i + 1
                    ),
                )
                .in_rule(j, rule),
            );
        }
    }
    problems
}

/// What the rules seen so far select, each with the first rule that selected it.
#[derive(Default)]
struct Claims {
    first_all: Option<usize>,
    indices: HashMap<u32, usize>,
    /// Catalog product names matched by a product selector.
    products: HashMap<&'static str, usize>,
    /// Product patterns, lower-cased: two equal patterns overlap even when no catalog model
    /// matches them.
    patterns: HashMap<String, usize>,
}

impl Claims {
    /// Record what `selector` (rule `j`) selects, and return the first earlier rule it
    /// overlaps, with how.
    fn claim(&mut self, j: usize, selector: &DeviceSelector) -> Option<(usize, String)> {
        let after_all = self
            .first_all
            .map(|i| (i, "`all` selects every GPU".to_string()));
        let found = match selector {
            DeviceSelector::All => {
                self.first_all.get_or_insert(j);
                (j > 0).then(|| (0, "`all` selects every GPU".to_string()))
            }
            DeviceSelector::Indices(list) => self.claim_indices(j, list),
            DeviceSelector::Product(pattern) => self.claim_product(j, pattern),
        };
        [found, after_all]
            .into_iter()
            .flatten()
            .min_by_key(|(owner, _)| *owner)
    }

    fn claim_indices(&mut self, j: usize, list: &[u32]) -> Option<(usize, String)> {
        let mut common: BTreeMap<usize, BTreeSet<u32>> = BTreeMap::new();
        for &i in list {
            let owner = *self.indices.entry(i).or_insert(j);
            if owner != j {
                common.entry(owner).or_default().insert(i);
            }
        }
        let (owner, gpus) = common.into_iter().next()?;
        Some((owner, format!("both select GPU {}", join(&gpus))))
    }

    fn claim_product(&mut self, j: usize, pattern: &str) -> Option<(usize, String)> {
        let by_name = product_names_matching(pattern)
            .map(|n| (*self.products.entry(n).or_insert(j), n))
            .filter(|(owner, _)| *owner != j)
            .min_by_key(|(owner, _)| *owner)
            .map(|(owner, n)| (owner, format!("both match product {n:?}")));
        let by_pattern = Some(
            *self
                .patterns
                .entry(pattern.to_ascii_lowercase())
                .or_insert(j),
        )
        .filter(|owner| *owner != j)
        .map(|owner| (owner, format!("both match product {pattern:?}")));
        by_name
            .into_iter()
            .chain(by_pattern)
            .min_by_key(|(owner, _)| *owner)
    }
}

/// The catalog's product names that `pattern` matches.
fn product_names_matching(pattern: &str) -> impl Iterator<Item = &'static str> + '_ {
    catalog()
        .models
        .iter()
        .flat_map(|m| m.product_names())
        .filter(move |n| crate::profile::glob_matches(pattern, n))
}

fn join(set: &BTreeSet<u32>) -> String {
    set.iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The MIG strategy the device plugin will run with: the profile's, or derived — `single` when
/// one rule puts one MIG profile on every GPU, `mixed` for any other MIG use, `none` without MIG.
pub fn mig_strategy(profile: &Profile) -> MigStrategy {
    if let Some(s) = profile.plugin.mig_strategy {
        return s;
    }
    let mig_rules: Vec<&Rule> = profile.rules.iter().filter(|r| r.mig.is_some()).collect();
    match mig_rules.as_slice() {
        [] => MigStrategy::None,
        [only]
            if profile.rules.len() == 1
                && only.devices == DeviceSelector::All
                && mig_profile_names(profile).len() == 1 =>
        {
            MigStrategy::Single
        }
        _ => MigStrategy::Mixed,
    }
}

fn mig_profile_names(profile: &Profile) -> BTreeSet<&str> {
    profile
        .rules
        .iter()
        .filter_map(|r| r.mig.as_ref())
        .flat_map(|m| m.keys().map(String::as_str))
        .collect()
}

/// A strategy given explicitly must be one the device plugin can run with these rules; its
/// own refusals are quoted.
fn check_mig_strategy(name: &str, profile: &Profile) -> Vec<Problem> {
    let Some(strategy) = profile.plugin.mig_strategy else {
        return Vec::new();
    };
    let uses_mig = profile.rules.iter().any(|r| r.mig.is_some());
    let names = mig_profile_names(profile);
    let message = match strategy {
        MigStrategy::None if uses_mig => Some(
            "plugin.migStrategy none advertises MIG-enabled GPUs as whole nvidia.com/gpu, so the MIG instances this profile creates could not be requested: use mixed or single, or leave it out".to_string(),
        ),
        MigStrategy::Single if names.len() > 1 => Some(format!(
            "plugin.migStrategy single allows one MIG profile per node, but the rules use {} (the device plugin refuses: \"more than one MIG device type present on node\"): use mixed",
            names.into_iter().collect::<Vec<_>>().join(", ")
        )),
        MigStrategy::Single
            if uses_mig
                && (profile.rules.len() > 1 || profile.rules.iter().any(|r| r.devices != DeviceSelector::All)) =>
        {
            Some("plugin.migStrategy single needs every GPU in MIG mode, so one `devices: all` mig rule (the device plugin refuses otherwise: \"all devices on the node must be configured with the same migEnabled value\"): use mixed".to_string())
        }
        MigStrategy::Single | MigStrategy::Mixed if !uses_mig => {
            return vec![Problem::warning(
                name,
                format!("plugin.migStrategy {strategy} has no effect: no rule uses mig"),
            )]
        }
        _ => None,
    };
    message
        .map(|m| Problem::error(name, m))
        .into_iter()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::parse_profile;

    #[test]
    fn whole_gpus_shared_two_ways_under_one_name_is_a_builtin_warning() {
        let text = "version: v1\nrules:\n  - devices: [0]\n    mps: {replicas: 4}\n  - devices: [1]\n    timeSlicing: {replicas: 2}\n";
        let profile = parse_profile("p", text).unwrap();
        let problems = builtin_plugin_limits("p", &profile);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(!problems[0].is_error());
        assert!(
            problems[0].message.contains("mps, timeSlicing"),
            "{problems:?}"
        );
    }
}
