//! The sharing-profile format: types (serde + schemars), reading from files and ConfigMaps, and
//! the problems validation reports ([`Problem`], naming the profile, the rule and the GPU model).
//! Whether a profile is valid is `crate::validate`'s to say: it needs every mode's rules, which
//! sit above the format.

mod format;
mod parse;
mod problem;

use std::collections::BTreeMap;

pub use format::{
    glob_matches, ComputePolicy, Consumable, DeviceSelector, MemoryPolicy, MigStrategy, Mps,
    PluginOptions, Profile, Rule, TimeSlicing, MAX_GPU_INDEX, MAX_MIG_COUNT, MAX_MPS_REPLICAS,
    MAX_PROFILE_BYTES, MAX_RULES, MAX_TIME_SLICING_REPLICAS, MIN_TIME_SLICING_REPLICAS,
};
pub use parse::{check_key, check_size, parse_profile, read_profiles, NamedProfile};
pub use problem::{Problem, RuleRef, Severity};

/// The one version this build reads.
pub const VERSION: &str = "v1";

/// The node label that names a node's profile: a key of the profiles ConfigMap. The agent
/// reads it, advise and the autopilot write it.
pub const PROFILE_LABEL: &str = "gpu-share.dev/profile";
/// The ConfigMap whose keys are the profiles (the agent's and the autopilot's `--configmap`
/// default; advise's manifest names it).
pub const PROFILES_CONFIGMAP: &str = "gpu-share-profiles";

/// Where the profiles live: the flags the agent, the autopilot and `advise --live` share, one
/// definition so one name means one thing in every subcommand.
#[derive(clap::Args, Debug, Clone, PartialEq, Eq)]
pub struct ProfilesSource {
    /// gpu-share's namespace: the profiles ConfigMap lives here, and so do the agents' drain
    /// Leases and the autopilot's Lease and status.
    #[arg(long, env = "POD_NAMESPACE", default_value = "gpu-share")]
    pub namespace: String,
    /// The ConfigMap whose keys are profiles.
    #[arg(long, env = "GPU_SHARE_CONFIGMAP", default_value = PROFILES_CONFIGMAP)]
    pub configmap: String,
}

/// The sharing mode a rule gives its GPUs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Mode<'a> {
    Exclusive,
    TimeSlicing(&'a TimeSlicing),
    Mps(&'a Mps),
    /// MIG instances, optionally each shared: time-sliced, or through one MPS control daemon
    /// per MIG device (built-in plugin only).
    Mig {
        instances: &'a BTreeMap<String, i64>,
        time_slicing: Option<&'a TimeSlicing>,
        mps: Option<&'a Mps>,
    },
    /// Dynamic MIG: every placement published, each instance made for the claim that gets it.
    DynamicMig,
}

impl Mode<'_> {
    /// The mode's name as written in a profile.
    pub fn keyword(&self) -> &'static str {
        match self {
            Mode::Exclusive => "exclusive",
            Mode::TimeSlicing(_) => "timeSlicing",
            Mode::Mps(_) => "mps",
            Mode::Mig { .. } => "mig",
            Mode::DynamicMig => "dynamicMig",
        }
    }
}

impl Profile {
    /// Each rule whose mode is clear, with its index (a rule without one is `validate`'s to
    /// report).
    pub fn rule_modes(&self) -> Vec<(usize, &Rule, Mode<'_>)> {
        self.rules
            .iter()
            .enumerate()
            .filter_map(|(i, r)| r.mode().ok().map(|m| (i, r, m)))
            .collect()
    }
}

/// Why a rule has no single mode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModeError {
    #[error("the rule gives no mode: set one of exclusive, timeSlicing, mps, mig or dynamicMig")]
    None,
    #[error(
        "the rule sets {}; a rule gives exactly one mode (timeSlicing or mps may only accompany \
         mig, to share its MIG devices, and not both)",
        .0.join(" and ")
    )]
    Several(Vec<&'static str>),
    /// `exclusive: false` or `dynamicMig: false`: a switch set to off says nothing.
    #[error("`{0}: false` means nothing: write `{0}: true` or give another mode")]
    SetToFalse(&'static str),
}

impl Rule {
    /// The rule's single mode, or why it has none or too many. `timeSlicing` or `mps` may
    /// accompany `mig`: it then shares each MIG device.
    pub fn mode(&self) -> Result<Mode<'_>, ModeError> {
        let mut set = Vec::new();
        if self.exclusive.is_some() {
            set.push("exclusive");
        }
        // Beside mig, one of timeSlicing or mps shares the MIG devices; both is two modes.
        let shares_mig_twice =
            self.mig.is_some() && self.time_slicing.is_some() && self.mps.is_some();
        if self.time_slicing.is_some() && (self.mig.is_none() || shares_mig_twice) {
            set.push("timeSlicing");
        }
        if self.mps.is_some() && (self.mig.is_none() || shares_mig_twice) {
            set.push("mps");
        }
        if self.mig.is_some() {
            set.push("mig");
        }
        if self.dynamic_mig.is_some() {
            // Shares inside dynamic instances are not offered: each instance is one claim's.
            set.extend(self.time_slicing.as_ref().map(|_| "timeSlicing"));
            set.extend(self.mps.as_ref().map(|_| "mps"));
            set.push("dynamicMig");
        }
        match set.as_slice() {
            [] => return Err(ModeError::None),
            [_] => {}
            many => return Err(ModeError::Several(many.to_vec())),
        }
        if self.exclusive == Some(false) {
            return Err(ModeError::SetToFalse("exclusive"));
        }
        if self.dynamic_mig == Some(false) {
            return Err(ModeError::SetToFalse("dynamicMig"));
        }
        Ok(if self.dynamic_mig.is_some() {
            Mode::DynamicMig
        } else if let Some(instances) = &self.mig {
            Mode::Mig {
                instances,
                time_slicing: self.time_slicing.as_ref(),
                mps: self.mps.as_ref(),
            }
        } else if let Some(ts) = &self.time_slicing {
            Mode::TimeSlicing(ts)
        } else if let Some(mps) = &self.mps {
            Mode::Mps(mps)
        } else {
            Mode::Exclusive
        })
    }
}

/// MIG counts as the solver takes them; negative or zero counts (refused by `validate`) are
/// dropped.
pub fn mig_counts(instances: &BTreeMap<String, i64>) -> BTreeMap<String, u32> {
    instances
        .iter()
        .filter(|(_, &c)| c > 0)
        .map(|(n, &c)| (n.clone(), u32::try_from(c).unwrap_or(u32::MAX)))
        .collect()
}
