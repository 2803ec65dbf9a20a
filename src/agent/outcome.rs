//! How a reconcile ended ([`Outcome`]) and, when it failed, why: one [`Reason`] per kind of
//! failure. Its code is the Warning Event's reason on the Node, the `reason` label of
//! `gpu_share_reconcile_failures_total` and what decides between the states `failed` and
//! `blocked`; deriving all of them from one enum (as kube-rs's controller-rs derives its metric
//! labels from its error enum) keeps them from drifting apart, and a new kind of failure cannot
//! be published without one.

use std::fmt;

use crate::profile::Problem;

/// How a reconcile ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing to do (no label, or already matching and published).
    Noop,
    Success,
    /// Failed; retry later without waiting for a label change.
    Failed {
        reason: Reason,
        message: String,
    },
}

/// An invalid profile: its errors, and that nothing was changed.
pub(super) fn invalid(problems: &[Problem]) -> Outcome {
    let errors: Vec<String> = problems
        .iter()
        .filter(|p| p.is_error())
        .map(ToString::to_string)
        .collect();
    Outcome::Failed {
        reason: Reason::InvalidProfile,
        message: format!("nothing was changed: {}", errors.join("; ")),
    }
}

/// A failure for `reason`, saying `e`.
pub(super) fn failed(reason: Reason, e: impl std::fmt::Display) -> Outcome {
    Outcome::Failed {
        reason,
        message: e.to_string(),
    }
}

/// The reason codes, as Events and metrics spell them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// The label names a key the profiles ConfigMap lacks.
    MissingProfile,
    /// The profile does not parse or validate; nothing was changed.
    InvalidProfile,
    /// NVML could not be read.
    GpuError,
    /// The crash-safety journal's directory cannot be written (checked before any cordon).
    StateDirUnwritable,
    /// No fleet drain slot came free within the drain timeout.
    DrainSlotTimeout,
    /// The drain slot's Lease was lost before the apply.
    DrainSlotLost,
    /// A request to the API server failed or got no answer.
    ApiError,
    /// The drain did not finish within `--drain-timeout`.
    DrainTimeout,
    /// The drain would lose a pod (no controller, emptyDir data): state `blocked`.
    PodNotEvictable,
    /// The drain would evict pods the profile's author did not predict: state `blocked`.
    EvictionsNotPredicted,
    /// Applying the MIG steps, compute modes, MPS daemons or plugin config failed.
    ApplyFailed,
    /// The GPU needs a reset (or reboot) before the change can be applied.
    ResetRequired,
    /// The CDI refresh command failed.
    CdiRefreshFailed,
    /// The node's allocatable did not show the plan within `--allocatable-timeout`.
    AllocatableMismatch,
    /// `--plugin dra`: the API server refused the node's ResourceSlices (422).
    SlicesRejected,
    /// `--plugin dra`: the ResourceSlices could not be published.
    PublishFailed,
}

impl Reason {
    /// Every reason, pre-registered at 0 in the failure metric so rates work from the first
    /// scrape.
    pub const ALL: [Reason; 16] = [
        Reason::MissingProfile,
        Reason::InvalidProfile,
        Reason::GpuError,
        Reason::StateDirUnwritable,
        Reason::DrainSlotTimeout,
        Reason::DrainSlotLost,
        Reason::ApiError,
        Reason::DrainTimeout,
        Reason::PodNotEvictable,
        Reason::EvictionsNotPredicted,
        Reason::ApplyFailed,
        Reason::ResetRequired,
        Reason::CdiRefreshFailed,
        Reason::AllocatableMismatch,
        Reason::SlicesRejected,
        Reason::PublishFailed,
    ];

    /// The code as Events and metrics spell it (the variant's name).
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::MissingProfile => "MissingProfile",
            Reason::InvalidProfile => "InvalidProfile",
            Reason::GpuError => "GpuError",
            Reason::StateDirUnwritable => "StateDirUnwritable",
            Reason::DrainSlotTimeout => "DrainSlotTimeout",
            Reason::DrainSlotLost => "DrainSlotLost",
            Reason::ApiError => "ApiError",
            Reason::DrainTimeout => "DrainTimeout",
            Reason::PodNotEvictable => "PodNotEvictable",
            Reason::EvictionsNotPredicted => "EvictionsNotPredicted",
            Reason::ApplyFailed => "ApplyFailed",
            Reason::ResetRequired => "ResetRequired",
            Reason::CdiRefreshFailed => "CdiRefreshFailed",
            Reason::AllocatableMismatch => "AllocatableMismatch",
            Reason::SlicesRejected => "SlicesRejected",
            Reason::PublishFailed => "PublishFailed",
        }
    }

    /// Whether the node waits for a person or a pod's end (`blocked`) rather than for a retry
    /// to succeed (`failed`). Either is retried.
    pub fn blocks(self) -> bool {
        matches!(
            self,
            Reason::PodNotEvictable | Reason::EvictionsNotPredicted
        )
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_code_is_its_variants_name_and_listed_once() {
        let codes: std::collections::BTreeSet<&str> =
            Reason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(codes.len(), Reason::ALL.len());
        for r in Reason::ALL {
            assert_eq!(format!("{r:?}"), r.as_str());
        }
    }

    #[test]
    fn only_the_drains_that_would_lose_a_pod_block() {
        let blocking: Vec<Reason> = Reason::ALL.into_iter().filter(|r| r.blocks()).collect();
        assert_eq!(
            blocking,
            [Reason::PodNotEvictable, Reason::EvictionsNotPredicted]
        );
    }
}
