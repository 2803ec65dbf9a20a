//! advise's outputs for people: a text report, and a ConfigMap manifest with one key per
//! proposed profile followed by the `kubectl label` commands that select them.

use std::fmt::Write;

use super::proposal::{gib_text, Advice};
use crate::profile::{PROFILES_CONFIGMAP, PROFILE_LABEL};

/// The report as text.
pub fn text(advice: &Advice) -> String {
    let mut out = String::new();
    let t = &advice.totals;
    let _ = writeln!(
        out,
        "advise ({} plugin): {} unschedulable, {} pod(s) evicted, {} instance(s) destroyed, {} GPU(s) used, {} idle",
        advice.plugin.name(),
        t.unschedulable_pods, t.pods_evicted, t.instances_destroyed, t.gpus_used, t.gpus_idle
    );
    for node in &advice.nodes {
        let _ = writeln!(out, "\nnode {} → profile {}", node.node, node.profile_key);
        for rule in &node.profile.rules {
            let _ = writeln!(
                out,
                "  {}: GPU {} {}",
                rule.name.as_deref().unwrap_or("rule"),
                rule.devices,
                mode_text(rule)
            );
        }
        let _ = writeln!(
            out,
            "  instances: {} kept, {} destroyed, {} created; MIG mode changes: {}",
            node.instances_kept,
            node.instances_destroyed,
            node.instances_created,
            node.mig_mode_changes
        );
        let _ = writeln!(
            out,
            "  GPUs used: {:?}, idle: {:?}; stranded memory {}",
            node.gpus_used,
            node.gpus_idle,
            gib_text(node.stranded_memory_gib)
        );
        let _ = writeln!(out, "  pods: {}", list(&node.pods));
        if !node.pods_evicted.is_empty() {
            let _ = writeln!(out, "  evicted: {}", list(&node.pods_evicted));
        }
        let resources: Vec<String> = node
            .resources
            .iter()
            .map(|(r, n)| format!("{r}: {n}"))
            .collect();
        let _ = writeln!(out, "  advertises: {}", list(&resources));
        for p in &node.problems {
            let _ = writeln!(out, "  problem: {p}");
        }
    }
    if !advice.unschedulable.is_empty() {
        let _ = writeln!(out, "\nunschedulable:");
        for u in &advice.unschedulable {
            let _ = writeln!(out, "  {}: {}", u.pod, u.reason);
        }
    }
    out
}

fn mode_text(rule: &crate::profile::Rule) -> String {
    if let Some(m) = &rule.mig {
        let parts: Vec<String> = m.iter().map(|(p, n)| format!("{n}×{p}")).collect();
        format!("mig {}", parts.join(" + "))
    } else if let Some(ts) = &rule.time_slicing {
        format!("time-sliced ×{}", ts.replicas)
    } else if let Some(mps) = &rule.mps {
        format!(
            "mps ×{} (pinned memory {})",
            mps.replicas,
            mps.pinned_memory_limit.as_deref().unwrap_or("none")
        )
    } else {
        "exclusive".into()
    }
}

fn list(items: &[String]) -> String {
    if items.is_empty() {
        "none".into()
    } else {
        items.join(", ")
    }
}

/// A ConfigMap manifest holding every proposed profile, then, as comments, the commands that
/// point each node at its profile. Apply it server-side so the ConfigMap's other keys stay.
pub fn configmap(advice: &Advice) -> Result<String, serde_yaml::Error> {
    let mut data = serde_yaml::Mapping::new();
    for node in &advice.nodes {
        data.insert(
            node.profile_key.clone().into(),
            serde_yaml::to_string(&node.profile)?.into(),
        );
    }
    let manifest = serde_yaml::to_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": PROFILES_CONFIGMAP},
    }))?;
    let mut manifest = manifest.as_mapping().cloned().unwrap_or_default();
    manifest.insert("data".into(), data.into());
    let mut out = String::from(
        "# Proposed by gpu-share advise. Apply into the agent's namespace without touching other keys:\n\
         #   kubectl apply --server-side --field-manager=gpu-share-advise -n gpu-share -f <this file>\n",
    );
    out += &serde_yaml::to_string(&manifest)?;
    out += "# Then select each node's profile:\n";
    for node in &advice.nodes {
        let _ = writeln!(
            out,
            "# kubectl label node {} {PROFILE_LABEL}={} --overwrite",
            node.node, node.profile_key
        );
    }
    Ok(out)
}
