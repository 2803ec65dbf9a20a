//! What every bench harness here needs to print figures: its knobs (environment variables with
//! defaults) and nearest-rank percentiles. One file, included by each harness with `#[path]`
//! (each `[[bench]]` is its own crate).

/// `$name` parsed, else `default` (unset or unparsable).
pub fn knob<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Nearest-rank percentile `p` (0-100) of `sorted`, which must not be empty.
pub fn percentile<T: Copy>(sorted: &[T], p: f64) -> T {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}
