//! NVIDIA driver versions (`580.65.06`, `570.26`), compared number by number.

use std::cmp::Ordering;
use std::fmt;

use serde::Serialize;

/// A driver version as the kernel module or NVML prints it.
#[derive(Debug, Clone, Serialize)]
#[serde(into = "String")]
pub struct DriverVersion {
    parts: Vec<u32>,
    text: String,
}

impl DriverVersion {
    /// `580.65.06` → [580, 65, 6]. At least two numbers, digits and dots only.
    pub fn parse(text: &str) -> Option<DriverVersion> {
        let text = text.trim();
        let parts = text
            .split('.')
            .map(|p| {
                if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) {
                    p.parse().ok()
                } else {
                    None
                }
            })
            .collect::<Option<Vec<u32>>>()?;
        (parts.len() >= 2).then(|| DriverVersion {
            parts,
            text: text.to_string(),
        })
    }

    /// The driver branch, e.g. 580.
    pub fn branch(&self) -> u32 {
        self.parts[0]
    }
}

impl PartialEq for DriverVersion {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for DriverVersion {}

impl PartialOrd for DriverVersion {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for DriverVersion {
    /// Number by number; missing trailing numbers count as 0 (`570.26` = `570.26.0`).
    fn cmp(&self, other: &Self) -> Ordering {
        let n = self.parts.len().max(other.parts.len());
        let at = |v: &DriverVersion, i: usize| v.parts.get(i).copied().unwrap_or(0);
        (0..n)
            .map(|i| at(self, i).cmp(&at(other, i)))
            .find(|o| o.is_ne())
            .unwrap_or(Ordering::Equal)
    }
}

impl fmt::Display for DriverVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl From<DriverVersion> for String {
    fn from(v: DriverVersion) -> String {
        v.text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> DriverVersion {
        DriverVersion::parse(s).unwrap()
    }

    #[test]
    fn compares_number_by_number() {
        assert!(v("570.26") < v("570.124.06"));
        assert!(v("580.65.06") > v("575.57.08"));
        assert_eq!(v("580.65.06"), v("580.65.6"));
        assert_eq!(v("570.26"), v("570.26.0"));
        assert_eq!(v("580.65.06").to_string(), "580.65.06");
        assert_eq!(v("580.65.06").branch(), 580);
    }

    #[test]
    fn rejects_what_is_not_a_version() {
        for bad in ["", "580", "x86_64", "580.65.", "580.a.1", "R36"] {
            assert!(DriverVersion::parse(bad).is_none(), "{bad}");
        }
    }
}
