//! Kubernetes resource quantities as the API writes them (`10Gi`, `10737418240`, `1500M`,
//! `250m`, `1e3`), read into whole numbers: what a claim's `consumedCapacity` and a device's
//! capacity say. The grammar is apimachinery's (k8s.io/apimachinery/pkg/api/resource,
//! `ParseQuantity`): a non-negative decimal number, then a binary suffix (`Ki` … `Ei`), a
//! decimal one (`n`, `u`, `m`, `k`, `M`, `G`, `T`, `P`, `E`) or an exponent (`e3`, `E-2`).

/// Why a quantity cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not a quantity such as 10Gi, 512Mi or 25 ({why})")]
pub struct QuantityError {
    pub text: String,
    pub why: &'static str,
}

/// The quantity in thousandths (`MilliValue`), rounded up as apimachinery rounds.
pub fn parse_milli(text: &str) -> Result<u128, QuantityError> {
    let bad = |why| QuantityError {
        text: text.to_string(),
        why,
    };
    let t = text.trim();
    let t = t.strip_prefix('+').unwrap_or(t);
    if t.starts_with('-') {
        return Err(bad("negative"));
    }
    let end = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, suffix) = t.split_at(end);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() || fraction.contains('.') {
        return Err(bad("no number"));
    }
    // value = digits × 2^binary × 10^(decimal - fraction digits) × 1000 (milli)
    let digits: u128 = format!("{whole}{fraction}")
        .parse()
        .map_err(|_| bad("too large"))?;
    let (binary, decimal): (u32, i32) = match suffix {
        "" => (0, 0),
        "Ki" => (10, 0),
        "Mi" => (20, 0),
        "Gi" => (30, 0),
        "Ti" => (40, 0),
        "Pi" => (50, 0),
        "Ei" => (60, 0),
        "n" => (0, -9),
        "u" => (0, -6),
        "m" => (0, -3),
        "k" => (0, 3),
        "M" => (0, 6),
        "G" => (0, 9),
        "T" => (0, 12),
        "P" => (0, 15),
        "E" => (0, 18),
        s if s.starts_with(['e', 'E']) => (0, s[1..].parse().map_err(|_| bad("bad suffix"))?),
        _ => return Err(bad("bad suffix")),
    };
    let scale = decimal + 3 - fraction.len() as i32;
    let scaled = digits
        .checked_mul(1u128 << binary)
        .ok_or_else(|| bad("too large"))?;
    if scale >= 0 {
        10u128
            .checked_pow(scale as u32)
            .and_then(|p| scaled.checked_mul(p))
            .ok_or_else(|| bad("too large"))
    } else {
        let divisor = 10u128
            .checked_pow(scale.unsigned_abs())
            .ok_or_else(|| bad("too small"))?;
        Ok(scaled.div_ceil(divisor))
    }
}

/// The quantity as a whole number, rounded up (`Value`).
pub fn parse_value(text: &str) -> Result<u128, QuantityError> {
    Ok(parse_milli(text)?.div_ceil(1000))
}

/// A quantity of bytes in whole MiB, rounded down: a limit set from it never exceeds it.
pub fn parse_mebibytes_floor(text: &str) -> Result<u64, QuantityError> {
    let bytes = parse_milli(text)? / 1000;
    u64::try_from(bytes >> 20).map_err(|_| QuantityError {
        text: text.to_string(),
        why: "too large",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_forms_the_api_writes_are_read() {
        assert_eq!(parse_value("10Gi").unwrap(), 10 << 30);
        assert_eq!(parse_value("10737418240").unwrap(), 10 << 30);
        assert_eq!(parse_value("1500M").unwrap(), 1_500_000_000);
        assert_eq!(parse_value("1.5Gi").unwrap(), 3 << 29);
        assert_eq!(parse_value("25").unwrap(), 25);
        assert_eq!(parse_milli("250m").unwrap(), 250);
        assert_eq!(parse_value("250m").unwrap(), 1, "Value rounds up");
        assert_eq!(parse_value("1e3").unwrap(), 1000);
        assert_eq!(parse_value("5E-1").unwrap(), 1);
        assert_eq!(parse_mebibytes_floor("81559Mi").unwrap(), 81559);
        assert_eq!(
            parse_mebibytes_floor("10G").unwrap(),
            9536,
            "10^10 B floored"
        );
    }

    #[test]
    fn what_is_not_a_quantity_is_refused() {
        for bad in [
            "",
            "Gi",
            "-1",
            "1.2.3",
            "10GB",
            "1Zi",
            "99999999999999999999999999999999999999Ei",
        ] {
            let e = parse_milli(bad).unwrap_err();
            assert!(e.to_string().contains("is not a quantity"), "{bad}: {e}");
        }
    }
}
