//! Durations as every gpu-share flag and environment variable takes them: Kubernetes style
//! (`15s`, `5m`, `1h30m`, `500ms`; humantime's grammar, which covers Go's `time.Duration`
//! spellings that Kubernetes manifests use), under a name without a unit (`--drain-timeout`).
//!
//! The flags these replaced carried their unit in the name (`--drain-timeout-secs 600`,
//! `--eviction-backoff-ms 500`) and are kept as hidden aliases, so a bare number is still read
//! in the unit the old name had: [`secs_or_duration`] or [`millis_or_duration`], per flag.

use std::time::Duration;

/// A duration flag or variable that cannot be read, each kind with what to write instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("{text:?} is not a duration (negative or not a number): write it as 15s, 5m or 1h30m")]
    NotANumber { text: String },
    #[error("{text:?} is not a duration ({why}): write it as 15s, 5m or 1h30m")]
    Unreadable { text: String, why: String },
    #[error("{text:?}: must be more than zero")]
    Zero { text: String },
    #[error("{text:?}: a Lease lasts whole seconds, from 1s to 1h")]
    NotALease { text: String },
}

/// `15s`, `5m`, or a bare number of seconds (`600`, `0.5`).
pub fn secs_or_duration(text: &str) -> Result<Duration, DurationError> {
    match text.trim().parse::<f64>() {
        Ok(secs) => Duration::try_from_secs_f64(secs).map_err(|_| DurationError::NotANumber {
            text: text.to_string(),
        }),
        Err(_) => with_unit(text),
    }
}

/// `500ms`, `2s`, or a bare number of milliseconds (`500`).
pub fn millis_or_duration(text: &str) -> Result<Duration, DurationError> {
    match text.trim().parse::<u64>() {
        Ok(millis) => Ok(Duration::from_millis(millis)),
        Err(_) => with_unit(text),
    }
}

/// [`secs_or_duration`], more than zero (a timeout of nothing fails every request).
pub fn positive_secs_or_duration(text: &str) -> Result<Duration, DurationError> {
    let d = secs_or_duration(text)?;
    if d.is_zero() {
        return Err(DurationError::Zero {
            text: text.to_string(),
        });
    }
    Ok(d)
}

/// A Lease's duration: whole seconds from 1s to 1h, since `leaseDurationSeconds` is an int32
/// of seconds (a Lease of 0 has always lapsed: see `crate::lease`) and a dead holder should not
/// hold the fleet up for longer than an hour.
pub fn lease_duration(text: &str) -> Result<Duration, DurationError> {
    let d = secs_or_duration(text)?;
    if d.subsec_nanos() != 0 || !(1..=3600).contains(&d.as_secs()) {
        return Err(DurationError::NotALease {
            text: text.to_string(),
        });
    }
    Ok(d)
}

fn with_unit(text: &str) -> Result<Duration, DurationError> {
    humantime::parse_duration(text.trim()).map_err(|e| DurationError::Unreadable {
        text: text.to_string(),
        why: e.to_string(),
    })
}

/// How a duration is shown back to the user: `10m`, `1m 30s`, `500ms`.
pub fn show(duration: Duration) -> String {
    humantime::format_duration(duration).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubernetes_spellings_parse() {
        assert_eq!(secs_or_duration("15s"), Ok(Duration::from_secs(15)));
        assert_eq!(secs_or_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(secs_or_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(millis_or_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(millis_or_duration("2s"), Ok(Duration::from_secs(2)));
    }

    #[test]
    fn a_bare_number_keeps_the_old_flags_unit() {
        assert_eq!(secs_or_duration("600"), Ok(Duration::from_secs(600)));
        assert_eq!(secs_or_duration("0.5"), Ok(Duration::from_millis(500)));
        assert_eq!(millis_or_duration("1000"), Ok(Duration::from_secs(1)));
    }

    #[test]
    fn nonsense_is_refused_with_the_spelling_to_use() {
        let e = secs_or_duration("soon").unwrap_err();
        assert!(matches!(e, DurationError::Unreadable { .. }), "{e:?}");
        let e = e.to_string();
        assert!(e.contains("\"soon\"") && e.contains("15s, 5m"), "{e}");
        for negative_or_nan in ["-3", "NaN"] {
            let e = secs_or_duration(negative_or_nan).unwrap_err();
            assert!(matches!(e, DurationError::NotANumber { .. }), "{e:?}");
            assert!(e.to_string().contains("negative or not a number"), "{e}");
        }
        assert!(millis_or_duration("5 parsecs").is_err());
    }

    #[test]
    fn leases_and_timeouts_have_bounds() {
        assert_eq!(lease_duration("15s"), Ok(Duration::from_secs(15)));
        assert!(lease_duration("0s").is_err());
        assert!(lease_duration("1500ms").is_err());
        assert!(lease_duration("2h").is_err());
        assert!(positive_secs_or_duration("0").is_err());
        assert_eq!(positive_secs_or_duration("30"), Ok(Duration::from_secs(30)));
    }

    #[test]
    fn shows_as_written() {
        assert_eq!(show(Duration::from_secs(600)), "10m");
        assert_eq!(show(Duration::from_millis(1500)), "1s 500ms");
    }
}
