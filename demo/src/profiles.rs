//! The profiles ConfigMap of the demo: what a platform team would keep in `gpu-share-profiles`.

/// Every H100 cut into seven 1g.10gb instances: 56 small inference slots.
pub const INFERENCE_SMALL: &str = "\
version: v1
description: Every H100 cut into seven 1g.10gb instances for small models
rules:
  - name: small
    devices: [\"0-7\"]
    mig: {1g.10gb: 7}
";

/// GPUs 0-5 keep their seven 1g.10gb instances; GPUs 6-7 become two 3g.40gb each.
pub const INFERENCE_MIXED: &str = "\
version: v1
description: Small models on GPUs 0-5, two medium 3g.40gb instances on GPUs 6-7
rules:
  - name: small
    devices: [\"0-5\"]
    mig: {1g.10gb: 7}
  - name: medium
    devices: [\"6-7\"]
    mig: {3g.40gb: 2}
";

/// The ConfigMap edit: GPUs 6-7 trade one 3g.40gb for four 1g.10gb.
pub const INFERENCE_MIXED_EDITED: &str = "\
version: v1
description: Small models on GPUs 0-5, one medium and four small instances on GPUs 6-7
rules:
  - name: small
    devices: [\"0-5\"]
    mig: {1g.10gb: 7}
  - name: medium
    devices: [\"6-7\"]
    mig: {3g.40gb: 1, 1g.10gb: 4}
";

/// Eight 1g.10gb instances on every H100 do not fit (seven slices): the agent must refuse it before
/// touching any GPU.
pub const BROKEN: &str = "\
version: v1
description: One 1g.10gb too many
rules:
  - name: too-many
    devices: {product: \"NVIDIA H100 80GB HBM3\"}
    mig: {1g.10gb: 8}
";
