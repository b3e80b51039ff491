//! The unit grammar of policy files: sizes in bytes and rates in bytes per
//! second, written as plain integers or as strings with a unit.
//!
//! A quantity string is a non-negative decimal number (digits, optionally a
//! `.` and up to 9 more digits; no sign, no exponent, no `_`), optionally
//! followed by spaces, then a unit. Units are case-sensitive because `b`
//! (bits) and `B` (bytes) differ:
//!
//! * sizes: `B`; decimal `kB`/`KB`, `MB`, `GB`, `TB` (powers of 1000); binary
//!   `KiB`, `MiB`, `GiB`, `TiB` (powers of 1024).
//! * byte rates: any size unit followed by `/s` (`B/s`, `MB/s`, `GiB/s`, ...).
//! * bit rates (decimal, as link speeds are quoted): `bit`, `Kbit`/`kbit`,
//!   `Mbit`, `Gbit`, `Tbit`, each also with `/s`, and `bps`, `Kbps`/`kbps`,
//!   `Mbps`, `Gbps`, `Tbps`. Eight bits are one byte.
//! * a number without a unit is bytes (or bytes per second).
//!
//! Fractional values such as `"1.5GiB"` or `"2.5Gbit"` are allowed; the
//! result is rounded to the nearest whole byte (halves round up). A result
//! above `u64::MAX` is an error, never a wrap-around.

/// What a quantity measures, which decides the units it accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A size in bytes.
    Size,
    /// A rate in bytes per second.
    ByteRate,
}

/// Why a quantity string was refused; turned into a sentence by the caller,
/// who knows the tenant and the field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum UnitError {
    /// Not a number followed by a known unit.
    Malformed,
    /// More than 9 digits after the decimal point.
    TooPrecise,
    /// The value does not fit in 64 bits.
    TooLarge,
}

/// Parses `text` as a quantity of `kind`, in bytes (or bytes per second).
pub(crate) fn parse_quantity(text: &str, kind: Kind) -> Result<u64, UnitError> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let unit = unit.trim_start_matches(' ');
    let (multiplier, divisor) = unit_factor(unit, kind).ok_or(UnitError::Malformed)?;
    let (mantissa, scale) = parse_decimal(number)?;
    // value = mantissa / scale * multiplier / divisor, rounded half up.
    let numerator = mantissa
        .checked_mul(multiplier)
        .and_then(|n| n.checked_mul(2))
        .ok_or(UnitError::TooLarge)?;
    let denominator = scale * divisor;
    let rounded = numerator
        .checked_add(denominator)
        .ok_or(UnitError::TooLarge)?
        / (2 * denominator);
    u64::try_from(rounded).map_err(|_| UnitError::TooLarge)
}

/// A decimal number as `(mantissa, 10^fraction_digits)`.
fn parse_decimal(number: &str) -> Result<(u128, u128), UnitError> {
    let (int_part, frac_part) = match number.split_once('.') {
        Some((i, f)) => (i, f),
        None => (number, ""),
    };
    if int_part.is_empty() || (number.contains('.') && frac_part.is_empty()) {
        return Err(UnitError::Malformed);
    }
    if !int_part.bytes().all(|b| b.is_ascii_digit())
        || !frac_part.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(UnitError::Malformed);
    }
    if frac_part.len() > 9 {
        return Err(UnitError::TooPrecise);
    }
    let mut mantissa: u128 = 0;
    for b in int_part.bytes().chain(frac_part.bytes()) {
        mantissa = mantissa
            .checked_mul(10)
            .and_then(|m| m.checked_add(u128::from(b - b'0')))
            .ok_or(UnitError::TooLarge)?;
    }
    // frac_part.len() <= 9, so the exponent is at most 9.
    let scale = 10u128.pow(frac_part.len() as u32);
    Ok((mantissa, scale))
}

/// `(multiplier, divisor)` turning a value in `unit` into bytes (per second).
fn unit_factor(unit: &str, kind: Kind) -> Option<(u128, u128)> {
    const K: u128 = 1_000;
    const KI: u128 = 1 << 10;
    let size = |u: &str| -> Option<u128> {
        Some(match u {
            "B" => 1,
            "kB" | "KB" => K,
            "MB" => K.pow(2),
            "GB" => K.pow(3),
            "TB" => K.pow(4),
            "KiB" => KI,
            "MiB" => KI.pow(2),
            "GiB" => KI.pow(3),
            "TiB" => KI.pow(4),
            _ => return None,
        })
    };
    match kind {
        _ if unit.is_empty() => Some((1, 1)),
        Kind::Size => size(unit).map(|m| (m, 1)),
        Kind::ByteRate => {
            if let Some(bytes) = unit.strip_suffix("/s").and_then(size) {
                return Some((bytes, 1));
            }
            let bits = unit.strip_suffix("/s").unwrap_or(unit);
            let prefix = bits
                .strip_suffix("bit")
                .or_else(|| unit.strip_suffix("bps"))?;
            let multiplier = match prefix {
                "" => 1,
                "k" | "K" => K,
                "M" => K.pow(2),
                "G" => K.pow(3),
                "T" => K.pow(4),
                _ => return None,
            };
            Some((multiplier, 8))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn size(text: &str) -> Result<u64, UnitError> {
        parse_quantity(text, Kind::Size)
    }

    fn rate(text: &str) -> Result<u64, UnitError> {
        parse_quantity(text, Kind::ByteRate)
    }

    #[test]
    fn sizes() {
        for (text, bytes) in [
            ("4096", 4096),
            ("64KiB", 65_536),
            ("64 KiB", 65_536),
            ("1MB", 1_000_000),
            ("1.5GiB", 1_610_612_736),
            ("0.5B", 1),
            ("0.4B", 0),
        ] {
            assert_eq!(size(text), Ok(bytes), "{text:?}");
        }
        for text in [
            "64XB", "1Gbit", "1MB/s", "", ".5KB", "5.KB", "1.2.3KB", "-1KB",
        ] {
            assert_eq!(size(text), Err(UnitError::Malformed), "{text:?}");
        }
        assert_eq!(size("1.0000000001KB"), Err(UnitError::TooPrecise));
    }

    #[test]
    fn rates() {
        assert_eq!(rate("100Gbit"), Ok(12_500_000_000));
        assert_eq!(rate("10Gbps"), Ok(1_250_000_000));
        assert_eq!(rate("10Gbit/s"), Ok(1_250_000_000));
        assert_eq!(rate("1.25GB/s"), Ok(1_250_000_000));
        assert_eq!(rate("500MiB/s"), Ok(524_288_000));
        assert_eq!(rate("8bit"), Ok(1));
        assert_eq!(rate("1000"), Ok(1000));
        assert_eq!(rate("1GB"), Err(UnitError::Malformed));
        assert_eq!(rate("1gbit"), Err(UnitError::Malformed));
    }

    #[test]
    fn limits() {
        assert_eq!(size("18446744073709551615B"), Ok(u64::MAX));
        assert_eq!(size("18446744073709551616B"), Err(UnitError::TooLarge));
        assert_eq!(size("20000000TiB"), Err(UnitError::TooLarge));
        let long = "9".repeat(60);
        assert_eq!(size(&long), Err(UnitError::TooLarge));
    }
}
