//! Layer 6 (asked for with `--cuda`): does the driver run that CUDA runtime? Newer drivers run
//! older CUDA; an older driver runs a newer CUDA of the same major release only through minor
//! version compatibility, with a limited feature set.

use std::fmt;

use super::{Check, Ctx, DriverVersion, Facts};

const NAME: &str = "cuda";

/// Where the table comes from, printed with every verdict.
const SOURCE: &str = "CUDA Toolkit release notes, Table 3 \"CUDA Toolkit and Corresponding \
     Driver Versions\", Linux x86_64 column";

/// Minimum Linux driver per CUDA release (its GA; an Update of the same release may need a
/// slightly newer driver). Source: NVIDIA CUDA Toolkit release notes,
/// <https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/index.html>, Table 3 "CUDA Toolkit
/// and Corresponding Driver Versions", Linux x86_64 column (12.7 was never released; 11.0 is
/// 11.0.2 GA). Read 2026; extend it when CUDA ships a release.
const MIN_DRIVER: &[((u32, u32), &str)] = &[
    ((10, 0), "410.48"),
    ((10, 1), "418.39"),
    ((10, 2), "440.33"),
    ((11, 0), "450.51.05"),
    ((11, 1), "455.23"),
    ((11, 2), "460.27.03"),
    ((11, 3), "465.19.01"),
    ((11, 4), "470.42.01"),
    ((11, 5), "495.29.05"),
    ((11, 6), "510.39.01"),
    ((11, 7), "515.43.04"),
    ((11, 8), "520.61.05"),
    ((12, 0), "525.60.13"),
    ((12, 1), "530.30.02"),
    ((12, 2), "535.54.03"),
    ((12, 3), "545.23.06"),
    ((12, 4), "550.54.14"),
    ((12, 5), "555.42.02"),
    ((12, 6), "560.28.03"),
    ((12, 8), "570.26"),
    ((12, 9), "575.51.03"),
    ((13, 0), "580.65.06"),
    ((13, 1), "590.44.01"),
    ((13, 2), "595.45.04"),
];

/// Minor version compatibility (CUDA 11 and later): an application built with any toolkit of
/// a major release runs, with a limited feature set, on a driver at least this new. Source:
/// CUDA Compatibility guide, "Minor Version Compatibility", Table 1
/// <https://docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility.html>
/// (11.x ≥ 450, 12.x ≥ 525, 13.x ≥ 580), with the exact 11.x/12.x minima from the release notes'
/// Table 2 (≥ 450.80.02, ≥ 525.60.13). CUDA 10 and older have none.
const MINOR_COMPAT: &[(u32, &str)] = &[(11, "450.80.02"), (12, "525.60.13"), (13, "580.0")];

/// A CUDA release, `MAJOR.MINOR`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct CudaVersion {
    pub major: u32,
    pub minor: u32,
}

impl CudaVersion {
    /// NVML's `major*1000 + minor*10` (13000 → 13.0).
    pub fn from_nvml(v: i32) -> Option<CudaVersion> {
        let v = u32::try_from(v).ok().filter(|v| *v > 0)?;
        Some(CudaVersion {
            major: v / 1000,
            minor: (v % 1000) / 10,
        })
    }
}

impl fmt::Display for CudaVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// A `--cuda` value that is not a version.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a CUDA version: expected MAJOR.MINOR, e.g. 12.4")]
pub struct NotACudaVersion(pub String);

/// `--cuda`: `12.4` (a patch, `12.4.1`, is accepted and ignored).
pub fn parse_version(s: &str) -> Result<CudaVersion, NotACudaVersion> {
    let bad = || NotACudaVersion(s.to_string());
    let mut it = s.trim().split('.');
    let mut num = || -> Result<u32, NotACudaVersion> {
        let p = it.next().ok_or_else(bad)?;
        if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        p.parse().map_err(|_| bad())
    };
    let version = CudaVersion {
        major: num()?,
        minor: num()?,
    };
    match it.next() {
        None => Ok(version),
        Some(p)
            if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) && it.next().is_none() =>
        {
            Ok(version)
        }
        Some(_) => Err(bad()),
    }
}

fn table_min(v: CudaVersion) -> Option<DriverVersion> {
    MIN_DRIVER
        .iter()
        .find(|(k, _)| *k == (v.major, v.minor))
        .and_then(|(_, d)| DriverVersion::parse(d))
}

fn minor_compat_min(major: u32) -> Option<DriverVersion> {
    MINOR_COMPAT
        .iter()
        .find(|(m, _)| *m == major)
        .and_then(|(_, d)| DriverVersion::parse(d))
}

pub(super) fn check(ctx: &Ctx<'_>, facts: &mut Facts) -> Check {
    let Some(wanted) = ctx.cuda else {
        return Check::skip(NAME, "no --cuda given");
    };
    if let Some(t) = &facts.tegra {
        return Check::skip(
            NAME,
            format!(
                "not checked on Jetson/Tegra ({}): CUDA comes with the JetPack release, the \
                 desktop driver table does not apply",
                t.describe()
            ),
        );
    }
    let Some(driver) = facts.driver().cloned() else {
        return Check::skip(NAME, "not checked: the driver version is unknown");
    };
    verdict(wanted, &driver, facts.nvml_cuda)
}

/// The verdict for running CUDA `wanted` on `driver` (NVML says it supports `supported`).
fn verdict(wanted: CudaVersion, driver: &DriverVersion, supported: Option<CudaVersion>) -> Check {
    let nvml = supported.map_or_else(String::new, |s| {
        format!("; NVML says the driver supports CUDA {s}")
    });
    let Some(min) = table_min(wanted) else {
        // Not in the table (newer than it, or no such release): trust what NVML reports.
        let mut c = Check::new(
            NAME,
            format!("CUDA {wanted} is not in the embedded table ({SOURCE}); driver {driver}{nvml}"),
        );
        match supported {
            Some(s) if s >= wanted => {}
            Some(s) if s.major == wanted.major => c.warn(
                format!("the driver supports CUDA {s}: CUDA {wanted} runs only through minor version compatibility (limited features)"),
                format!("upgrade the driver to the one CUDA {wanted}'s release notes name"),
            ),
            Some(s) => c.fail(
                format!("the driver supports CUDA {s}, older than {wanted}'s major release"),
                format!("upgrade the driver to one that supports CUDA {wanted}, or use a CUDA {s} runtime"),
            ),
            None => c.warn(
                "NVML did not report a CUDA version, so this cannot be judged",
                format!("compare the driver with the release notes of CUDA {wanted}"),
            ),
        }
        return c;
    };
    let mut c = Check::new(
        NAME,
        format!(
            "CUDA {wanted} needs driver ≥ {min}; this node runs {driver}{nvml} (source: {SOURCE})"
        ),
    );
    if *driver >= min {
        return c;
    }
    match minor_compat_min(wanted.major) {
        Some(floor) if *driver >= floor => c.warn(
            format!(
                "driver {driver} is older than CUDA {wanted} wants, but within CUDA {}.x minor \
                 version compatibility (≥ {floor}): it runs with a limited feature set (PTX \
                 built by the newer toolkit cannot be JIT-compiled; APIs newer than the driver \
                 return cudaErrorCallRequiresNewerDriver)",
                wanted.major
            ),
            format!(
                "upgrade the driver to ≥ {min}, or ship the forward-compatibility package \
                 (cuda-compat-{}-{}, data-center GPUs only)",
                wanted.major, wanted.minor
            ),
        ),
        floor => c.fail(
            format!(
                "driver {driver} is too old for CUDA {wanted}{}; newer drivers run older CUDA, \
                 not the reverse",
                floor.map_or_else(String::new, |f| format!(
                    " (even CUDA {}.x minor version compatibility needs ≥ {f})",
                    wanted.major
                ))
            ),
            format!(
                "upgrade the driver to ≥ {min}, or build/run with an older CUDA{}",
                supported.map_or_else(String::new, |s| format!(" (≤ {s})"))
            ),
        ),
    }
    c
}

#[cfg(test)]
mod tests {
    use super::super::Status;
    use super::*;

    fn v(s: &str) -> DriverVersion {
        DriverVersion::parse(s).unwrap()
    }

    fn cuda(s: &str) -> CudaVersion {
        parse_version(s).unwrap()
    }

    #[test]
    fn parses_cuda_versions() {
        assert_eq!(
            cuda("12.4"),
            CudaVersion {
                major: 12,
                minor: 4
            }
        );
        assert_eq!(
            cuda("12.4.1"),
            CudaVersion {
                major: 12,
                minor: 4
            }
        );
        for bad in ["12", "12.", "x.4", "12.4.1.0", "", "12.4.x"] {
            assert!(parse_version(bad).is_err(), "{bad}");
        }
        assert_eq!(CudaVersion::from_nvml(12040), Some(cuda("12.4")));
        assert_eq!(CudaVersion::from_nvml(0), None);
    }

    #[test]
    fn the_table_is_ordered_and_parses() {
        let mut last = None;
        for (k, d) in MIN_DRIVER {
            let d = v(d);
            assert!(
                last.as_ref().is_none_or(|(lk, ld)| lk < k && *ld < d),
                "{k:?}"
            );
            last = Some((*k, d));
        }
        for (_, d) in MINOR_COMPAT {
            v(d);
        }
    }

    #[test]
    fn newer_drivers_run_older_cuda_not_the_reverse() {
        assert_eq!(
            verdict(cuda("12.4"), &v("580.65.06"), None).status,
            Status::Ok
        );
        assert_eq!(
            verdict(cuda("12.4"), &v("550.54.14"), None).status,
            Status::Ok
        );
        // Minor version compatibility within 12.x.
        assert_eq!(
            verdict(cuda("12.4"), &v("535.104.05"), None).status,
            Status::Warn
        );
        // Another major release.
        let c = verdict(cuda("13.0"), &v("535.104.05"), None);
        assert_eq!(c.status, Status::Fail, "{c:?}");
        // Before CUDA 11 there is no minor version compatibility.
        assert_eq!(
            verdict(cuda("10.2"), &v("440.30"), None).status,
            Status::Fail
        );
    }

    #[test]
    fn versions_beyond_the_table_go_by_what_nvml_reports() {
        let d = v("600.10");
        assert_eq!(
            verdict(cuda("13.9"), &d, Some(cuda("13.9"))).status,
            Status::Ok
        );
        assert_eq!(
            verdict(cuda("13.9"), &d, Some(cuda("13.5"))).status,
            Status::Warn
        );
        assert_eq!(
            verdict(cuda("14.0"), &d, Some(cuda("13.5"))).status,
            Status::Fail
        );
        assert_eq!(verdict(cuda("14.0"), &d, None).status, Status::Warn);
    }
}
