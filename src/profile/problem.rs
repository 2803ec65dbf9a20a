//! What is wrong with a profile, said so that a person can find and fix it: which profile,
//! which rule, which GPU model, which rule of the format was broken.

use std::fmt;

use serde::Serialize;

use super::Rule;

/// How bad a problem is: errors stop `validate`, `plan` and `apply`; warnings don't.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Warning,
    Error,
}

/// Which rule a problem is about.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RuleRef {
    /// 1-based position in `rules:`.
    pub number: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The rule's `devices:` as written.
    pub devices: String,
}

impl RuleRef {
    pub fn new(index: usize, rule: &Rule) -> Self {
        RuleRef {
            number: index + 1,
            name: rule.name.clone(),
            devices: rule.devices.to_string(),
        }
    }
}

/// One problem found in a profile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    pub severity: Severity,
    /// The profile's name: its ConfigMap key, or the file's stem.
    pub profile: String,
    /// Boxed to keep `Result<_, Problem>` small.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule: Option<Box<RuleRef>>,
    /// The GPU (model, or index and model) the problem shows on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu: Option<String>,
    pub message: String,
}

impl Problem {
    pub fn error(profile: &str, message: impl Into<String>) -> Self {
        Problem {
            severity: Severity::Error,
            profile: profile.to_string(),
            rule: None,
            gpu: None,
            message: message.into(),
        }
    }

    pub fn warning(profile: &str, message: impl Into<String>) -> Self {
        Problem {
            severity: Severity::Warning,
            ..Problem::error(profile, message)
        }
    }

    pub fn in_rule(mut self, index: usize, rule: &Rule) -> Self {
        self.rule = Some(Box::new(RuleRef::new(index, rule)));
        self
    }

    pub fn on_gpu(mut self, gpu: impl Into<String>) -> Self {
        self.gpu = Some(gpu.into());
        self
    }

    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}

impl fmt::Display for Problem {
    /// `error: profile "p", rule 2 "name" (devices [0, 1]), GPU NVIDIA A100-SXM4-40GB: message`
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let severity = match self.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        write!(f, "{severity}: profile {:?}", self.profile)?;
        if let Some(rule) = &self.rule {
            write!(f, ", rule {}", rule.number)?;
            if let Some(name) = &rule.name {
                write!(f, " {name:?}")?;
            }
            write!(f, " (devices {})", rule.devices)?;
        }
        if let Some(gpu) = &self.gpu {
            write!(f, ", GPU {gpu}")?;
        }
        write!(f, ": {}", self.message)
    }
}
