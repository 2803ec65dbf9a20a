//! `gpu-share advise`: from the GPU demand of a cluster's pods and its GPU nodes to a profile
//! per node that serves the demand (offline part). Pure: it reads two files' worth of
//! data and plans; nothing here touches a GPU or the API server.
//!
//! [`demand`] owns the pods and what they need, [`supply`] the nodes as they are, [`solver`]
//! the placement (`running` its starting point) (its module doc says how it minimises), [`proposal`] the per-node profiles and
//! their diff, [`render`] the text and ConfigMap outputs. It sits above `plan`, which checks
//! every proposal. [`live`] reads the same demand and supply from the API server.

pub mod demand;
mod keep;
pub mod live;
mod node_gpus;
pub mod proposal;
pub mod render;
mod running;
pub mod solver;
pub mod state;
pub mod supply;

pub use demand::{from_pod, Demand, HeldDevice, Need, Phase, PodDemand};
pub use proposal::{profile_key, Advice, NodeAdvice};
pub use supply::{Supply, SupplyNode};

use crate::sharing::PluginKind;

/// The most nodes advise plans for: Kubernetes' documented largest cluster ("No more than
/// 5,000 nodes", kubernetes.io/docs/setup/best-practices/cluster-large).
pub const MAX_NODES: usize = 5_000;
/// The most pods in the demand: Kubernetes' documented largest cluster ("No more than 150,000
/// total pods", same page). The solver's time grows with pods × nodes (docs/advise.md, "Bounds").
pub const MAX_PODS: usize = 150_000;
/// The most bytes of a demand or supply file: 150,000 pods take about 25 MB as JSON.
pub const MAX_INPUT_BYTES: u64 = 64 * 1024 * 1024;

/// Advise for `demand` on `supply`, or every reason the input cannot be used (each names the
/// pod or node).
pub fn advise(demand: &Demand, supply: &Supply, plugin: PluginKind) -> Result<Advice, Vec<String>> {
    check_counts(demand, supply)?;
    let mut errors = Vec::new();
    let mut nows = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for node in &supply.nodes {
        if !seen.insert(node.name.as_str()) {
            errors.push(format!("node {}: listed twice in the supply", node.name));
            continue;
        }
        match node.now(plugin) {
            Ok(now) => nows.push(now),
            Err(e) => errors.push(e.to_string()),
        }
    }
    let mut needs = Vec::new();
    for pod in &demand.pods {
        match pod.need() {
            Ok(need) => needs.push(need),
            Err(e) => {
                errors.push(e.to_string());
                needs.push(None);
            }
        }
        if pod.phase == Phase::Running && pod.node.is_none() {
            errors.push(format!("pod {}: running, but no node given", pod.id()));
        }
    }
    errors.extend(running::check_held_devices(&demand.pods, &needs, &nows));
    if !errors.is_empty() {
        return Err(errors);
    }
    let solution = solver::Solver::new(plugin).solve(&nows, &demand.pods, &needs);
    Ok(proposal::propose(&solution, &nows, &demand.pods, plugin))
}

/// Refuse more nodes or pods than [`MAX_NODES`] / [`MAX_PODS`], before any is read.
fn check_counts(demand: &Demand, supply: &Supply) -> Result<(), Vec<String>> {
    let mut errors = Vec::new();
    if supply.nodes.len() > MAX_NODES {
        errors.push(format!(
            "supply: {} nodes, over {MAX_NODES} (Kubernetes' largest documented cluster)",
            supply.nodes.len()
        ));
    }
    if demand.pods.len() > MAX_PODS {
        errors.push(format!(
            "demand: {} pods, over {MAX_PODS} (Kubernetes' largest documented cluster)",
            demand.pods.len()
        ));
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

/// A demand or supply file advise cannot read.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("{}: the {what} is over {MAX_INPUT_BYTES} bytes (MAX_INPUT_BYTES)", path.display())]
    TooLarge {
        path: std::path::PathBuf,
        what: String,
    },
    #[error("cannot read {}: not UTF-8 ({source})", path.display())]
    NotUtf8 {
        path: std::path::PathBuf,
        source: std::string::FromUtf8Error,
    },
    #[error("cannot read the {what}: {source}")]
    Yaml {
        what: String,
        source: serde_yaml::Error,
    },
}

/// A demand or supply file's text, refused unread past [`MAX_INPUT_BYTES`] (at most one byte
/// past the bound is read).
pub fn read_input(what: &str, path: &std::path::Path) -> Result<String, InputError> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_INPUT_BYTES + 1).read_to_end(&mut bytes))
        .map_err(|source| InputError::Read {
            path: path.to_path_buf(),
            source,
        })?;
    if bytes.len() as u64 > MAX_INPUT_BYTES {
        return Err(InputError::TooLarge {
            path: path.to_path_buf(),
            what: what.to_string(),
        });
    }
    String::from_utf8(bytes).map_err(|source| InputError::NotUtf8 {
        path: path.to_path_buf(),
        source,
    })
}

/// Read a demand or supply file: YAML or JSON (JSON is YAML).
pub fn parse<T: serde::de::DeserializeOwned>(what: &str, text: &str) -> Result<T, InputError> {
    serde_yaml::from_str(text).map_err(|source| InputError::Yaml {
        what: what.to_string(),
        source,
    })
}

/// The solver's criteria and their order, end to end through [`advise`].
#[cfg(test)]
mod solver_criteria;

#[cfg(test)]
mod bounds {
    use super::*;

    #[test]
    fn more_nodes_or_pods_than_kubernetes_documents_are_refused_before_planning() {
        let node = |i: usize| SupplyNode {
            name: format!("n{i}"),
            gpus: vec!["h100x8".into()],
            current: None,
            profile_name: None,
            profile: None,
        };
        let pod = |i: usize| PodDemand {
            namespace: "ml".into(),
            name: format!("p{i}"),
            node: None,
            phase: Phase::Pending,
            requests: [("nvidia.com/mig-1g.10gb".to_string(), 1)].into(),
            annotations: Default::default(),
            devices: Vec::new(),
        };
        let supply = Supply {
            nodes: (0..=MAX_NODES).map(node).collect(),
        };
        let demand = Demand {
            pods: (0..=MAX_PODS).map(pod).collect(),
        };
        let errors = advise(&demand, &supply, PluginKind::Nvidia).unwrap_err();
        assert_eq!(
            errors,
            [
                "supply: 5001 nodes, over 5000 (Kubernetes' largest documented cluster)",
                "demand: 150001 pods, over 150000 (Kubernetes' largest documented cluster)",
            ]
        );
        let within = Supply {
            nodes: supply.nodes[..2].to_vec(),
        };
        let one = Demand {
            pods: demand.pods[..1].to_vec(),
        };
        assert!(advise(&one, &within, PluginKind::Nvidia).is_ok());
    }

    #[test]
    fn an_input_file_over_the_bound_is_refused_unread() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("demand.yaml");
        std::fs::write(&path, "pods: []\n").unwrap();
        assert_eq!(read_input("demand", &path).unwrap(), "pods: []\n");
        let file = std::fs::File::create(&path).unwrap();
        file.set_len(MAX_INPUT_BYTES + 1).unwrap();
        let e = read_input("demand", &path).unwrap_err();
        assert!(matches!(e, InputError::TooLarge { .. }), "{e:?}");
        let e = e.to_string();
        assert!(
            e.ends_with("demand.yaml: the demand is over 67108864 bytes (MAX_INPUT_BYTES)"),
            "{e}"
        );
    }
}
