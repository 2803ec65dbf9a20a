//! Which GPUs a node has, from its labels: GPU Feature Discovery's (`nvidia.com/gpu.product`,
//! `nvidia.com/gpu.count`; docs/sources.md#gfd-labels) or, where GFD does not run, those
//! gpu-share's agent writes from what it found (`crate::gpu_labels`). Both present, they must
//! name the same GPUs. Read as `plan --gpu` specs: a product the MIG catalog knows becomes
//! that model, any other stays a GPU without MIG under its product name.

use k8s_openapi::api::core::v1::Node;

use crate::gpu_labels::{self, GFD_COUNT_LABEL as COUNT_LABEL, GFD_PRODUCT_LABEL as PRODUCT_LABEL};
use crate::mig::catalog;
use crate::profile::Profile;
use crate::published::label;

/// Why a node's GPU labels do not say which GPUs it has.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LabelError {
    #[error("no GPU labels")]
    NoLabels,
    #[error(
        "GPU Feature Discovery says {PRODUCT_LABEL}={product} ({count} GPUs) but gpu-share's \
         agent found {}={found} ({found_count}): the labels disagree, so the node is left out \
         until they agree (a GPU lost or replaced since one of them looked?)",
        gpu_labels::PRODUCT_LABEL
    )]
    Disagree {
        product: String,
        count: u32,
        found: String,
        found_count: u32,
    },
    #[error("{product_label}={product} but no numeric {count_label} label")]
    NotNumeric {
        product_label: &'static str,
        product: String,
        count_label: &'static str,
    },
    #[error(
        "{label}={product}: gpu-share's agent found GPUs of several products, and advise plans \
         a node of one",
        label = gpu_labels::PRODUCT_LABEL,
        product = .0
    )]
    SeveralProducts(String),
    #[error("{PRODUCT_LABEL}={0}: GPU Feature Discovery reports an invalid MIG layout")]
    InvalidMig(String),
    #[error(
        "{PRODUCT_LABEL}={product}: under the single MIG strategy {COUNT_LABEL}={devices} counts \
         {mig_profile} devices, and the node's profile does not say how many each GPU holds"
    )]
    SingleStrategyUnknown {
        product: String,
        devices: u32,
        mig_profile: String,
    },
}

/// Whether the node says which GPUs it has (GFD's product label or the agent's): a node with
/// neither is no GPU node.
pub(super) fn has_gpu_labels(node: &Node) -> bool {
    label(node, PRODUCT_LABEL).is_some() || label(node, gpu_labels::PRODUCT_LABEL).is_some()
}

/// The node's GPUs: its product label, how many GPUs, and the count label as read (for
/// messages); an error naming the labels when they cannot be read or GFD's and the agent's
/// disagree. `profile` is the node's current one (GFD's single-strategy count needs it).
pub(super) fn gpus_of<'a>(
    node: &'a Node,
    profile: Option<&Profile>,
) -> Result<(&'a str, u32, String), LabelError> {
    let found = label(node, gpu_labels::PRODUCT_LABEL)
        .map(|product| found_gpus(node, product))
        .transpose()?;
    let Some(product) = label(node, PRODUCT_LABEL) else {
        let (found, count) = found.ok_or(LabelError::NoLabels)?;
        return Ok((found, count, format!("{}={count}", gpu_labels::COUNT_LABEL)));
    };
    let devices = numeric(node, product, PRODUCT_LABEL, COUNT_LABEL)?;
    let count = gpu_count(product, devices, profile)?;
    if let Some((found, found_count)) = found {
        if gpu_spec(product, count) != gpu_spec(found, found_count) {
            return Err(LabelError::Disagree {
                product: product.to_string(),
                count,
                found: found.to_string(),
                found_count,
            });
        }
    }
    Ok((product, count, format!("{COUNT_LABEL}={devices}")))
}

/// A label's value as a number, or why not: `product_label=product` names the node's GPUs.
fn numeric(
    node: &Node,
    product: &str,
    product_label: &'static str,
    count_label: &'static str,
) -> Result<u32, LabelError> {
    match label(node, count_label).map(str::parse::<u32>) {
        Some(Ok(n)) => Ok(n),
        _ => Err(LabelError::NotNumeric {
            product_label,
            product: product.to_string(),
            count_label,
        }),
    }
}

/// The GPUs gpu-share's agent found on the node (its `gpu-share.dev/gpu.*` labels): the
/// product and how many whole GPUs; a node of several products cannot be one `plan --gpu` spec.
fn found_gpus<'a>(node: &'a Node, product: &'a str) -> Result<(&'a str, u32), LabelError> {
    if product == gpu_labels::MIXED {
        return Err(LabelError::SeveralProducts(product.to_string()));
    }
    let count = numeric(
        node,
        product,
        gpu_labels::PRODUCT_LABEL,
        gpu_labels::COUNT_LABEL,
    )?;
    Ok((product, count))
}

/// How many GPUs the node has. GFD's `gpu.count` counts what the device plugin advertises as
/// `nvidia.com/gpu`: whole GPUs, except under the `single` MIG strategy (product label
/// `…-MIG-<profile>`), where it counts the MIG devices (nvidia-stack.md §1.8). Then the GPUs
/// are the devices over the instances per GPU of the node's current profile (single strategy:
/// one rule, one MIG profile on every GPU). `-MIG-INVALID` is GFD saying the layout is broken.
fn gpu_count(product: &str, devices: u32, profile: Option<&Profile>) -> Result<u32, LabelError> {
    let product = product.strip_suffix("-SHARED").unwrap_or(product);
    let Some((_, mig_profile)) = product.split_once("-MIG-") else {
        return Ok(devices);
    };
    if mig_profile == "INVALID" {
        return Err(LabelError::InvalidMig(product.to_string()));
    }
    let per_gpu = profile
        .into_iter()
        .flat_map(|p| &p.rules)
        .filter_map(|r| r.mig.as_ref()?.get(mig_profile))
        .find(|n| **n > 0)
        .and_then(|n| u32::try_from(*n).ok());
    match per_gpu {
        Some(n) if devices.is_multiple_of(n) => Ok(devices / n),
        _ => Err(LabelError::SingleStrategyUnknown {
            product: product.to_string(),
            devices,
            mig_profile: mig_profile.to_string(),
        }),
    }
}

/// GFD's sanitised product label as a `plan --gpu` spec: `<catalog key>x<count>` when the
/// catalog knows the product, else the product name with its spaces back, `x<count>`.
///
/// GFD appends `-SHARED` when the GPU is shared with replicas, and under the `single` MIG
/// strategy the product carries `-MIG-<profile>` (or `-MIG-INVALID`): neither is part of the
/// GPU's model (nvidia-stack.md §1.8).
pub fn gpu_spec(product_label: &str, count: u32) -> String {
    let product = product_label
        .strip_suffix("-SHARED")
        .unwrap_or(product_label);
    let product = product.split("-MIG-").next().unwrap_or(product);
    let model = catalog().models.iter().find(|m| {
        m.product_names()
            .any(|n| same_product(&n.replace(' ', "-"), product))
    });
    match model {
        Some(m) => format!("{}x{count}", m.key),
        None => format!("{}x{count}", product.replace('-', " ")),
    }
}

/// Sanitised product names compare without case and without the `NVIDIA-` prefix that R470+
/// drivers add (as the catalog compares NVML names).
fn same_product(a: &str, b: &str) -> bool {
    fn strip(n: &str) -> &str {
        match n.get(..7) {
            Some(p) if p.eq_ignore_ascii_case("nvidia-") => &n[7..],
            _ => n,
        }
    }
    strip(a).eq_ignore_ascii_case(strip(b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::parse_profile;

    /// GFD product labels (nvidia-stack.md §1.8) map to catalog models, suffixes dropped.
    #[test]
    fn gfd_products_become_catalog_models() {
        assert_eq!(gpu_spec("NVIDIA-H100-80GB-HBM3", 8), "h100-80gb-sxmx8");
        assert_eq!(
            gpu_spec("NVIDIA-H100-80GB-HBM3-SHARED", 2),
            "h100-80gb-sxmx2"
        );
        assert_eq!(
            gpu_spec("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", 4),
            "a100-sxm4-40gbx4"
        );
        assert_eq!(gpu_spec("A100-SXM4-40GB", 1), "a100-sxm4-40gbx1");
        assert_eq!(gpu_spec("Tesla-T4", 1), "Tesla T4x1");
        // Each spec reads back through `plan --gpu`'s parser as that many GPUs of that model.
        let read = |product: &str, count: u32| {
            let node =
                crate::gpu::ObservedNode::from_gpu_specs(&[gpu_spec(product, count)]).unwrap();
            (
                node.gpus.len(),
                node.gpus[0].product.clone(),
                node.gpus[0].mig.is_some(),
            )
        };
        assert_eq!(read("Tesla-T4", 2), (2, "Tesla T4".to_string(), false));
        assert_eq!(
            read("NVIDIA-H100-80GB-HBM3", 8),
            (8, "NVIDIA H100 80GB HBM3".to_string(), true)
        );
    }

    #[test]
    fn the_single_strategy_count_is_read_through_the_profile() {
        let seven = parse_profile(
            "p",
            "version: v1\nrules:\n- devices: all\n  mig: {1g.10gb: 7}\n",
        )
        .unwrap();
        let product = "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb";
        assert_eq!(gpu_count(product, 14, Some(&seven)), Ok(2));
        assert_eq!(gpu_count("NVIDIA-H100-80GB-HBM3", 4, Some(&seven)), Ok(4));
        assert_eq!(gpu_count("NVIDIA-H100-80GB-HBM3-SHARED", 2, None), Ok(2));
        let e = gpu_count(product, 14, None).unwrap_err();
        assert!(
            matches!(e, LabelError::SingleStrategyUnknown { .. }),
            "{e:?}"
        );
        assert!(e.to_string().contains("counts 1g.10gb devices"), "{e}");
        assert!(
            gpu_count(product, 13, Some(&seven)).is_err(),
            "not whole GPUs"
        );
        let e = gpu_count("NVIDIA-H100-80GB-HBM3-MIG-INVALID", 0, None).unwrap_err();
        assert!(matches!(e, LabelError::InvalidMig(_)), "{e:?}");
        assert!(e.to_string().contains("invalid MIG layout"), "{e}");
    }
}
