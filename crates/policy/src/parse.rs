//! Parsers for the human forms of limits: sizes (`512M`), CPU counts (`1.5`)
//! and durations (`30s`).

use std::time::Duration;

/// A limit written by a person could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ParseError {
    #[error("`{0}` is not a size; use a number with an optional unit K, M, G or T (powers of 1024), like 512M")]
    Size(String),
    #[error("`{0}` is not a CPU count; use a positive decimal number like 1.5")]
    Cpus(String),
    #[error("`{0}` is not a duration; use a number with a unit ms, s, m or h, like 30s")]
    Duration(String),
}

/// Parses `512M`, `1G`, `64KiB`, `1048576` into bytes. Units are binary.
pub fn parse_size(text: &str) -> Result<u64, ParseError> {
    let err = || ParseError::Size(text.to_owned());
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (digits, unit) = trimmed.split_at(split);
    if digits.is_empty() {
        return Err(err());
    }
    let number: u64 = digits.parse().map_err(|_| err())?;
    let shift = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(err()),
    };
    number.checked_mul(1u64 << shift).ok_or_else(err)
}

/// Parses a CPU count like `1.5` into thousandths of a CPU (1500).
pub fn parse_cpus(text: &str) -> Result<u32, ParseError> {
    let err = || ParseError::Cpus(text.to_owned());
    let trimmed = text.trim();
    if trimmed.is_empty() || !trimmed.chars().all(|c| c.is_ascii_digit() || c == '.') {
        return Err(err());
    }
    let (whole, frac) = match trimmed.split_once('.') {
        Some((w, f)) => (w, f),
        None => (trimmed, ""),
    };
    if (whole.is_empty() && frac.is_empty()) || frac.len() > 3 || frac.contains('.') {
        return Err(err());
    }
    let whole: u32 = if whole.is_empty() {
        0
    } else {
        whole.parse().map_err(|_| err())?
    };
    let mut frac_millis: u32 = 0;
    for (i, c) in frac.chars().enumerate() {
        let digit = c.to_digit(10).ok_or_else(err)?;
        frac_millis += digit * 10u32.pow(2 - i as u32);
    }
    whole
        .checked_mul(1000)
        .and_then(|m| m.checked_add(frac_millis))
        .ok_or_else(err)
}

/// Parses `250ms`, `30s`, `5m`, `1h` (a bare number means seconds).
pub fn parse_duration(text: &str) -> Result<Duration, ParseError> {
    let err = || ParseError::Duration(text.to_owned());
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (digits, unit) = trimmed.split_at(split);
    if digits.is_empty() {
        return Err(err());
    }
    let number: u64 = digits.parse().map_err(|_| err())?;
    let millis = match unit {
        "ms" => Some(number),
        "" | "s" => number.checked_mul(1000),
        "m" => number.checked_mul(60_000),
        "h" => number.checked_mul(3_600_000),
        "d" => number.checked_mul(86_400_000),
        _ => None,
    }
    .ok_or_else(err)?;
    Ok(Duration::from_millis(millis))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("64KiB"), Ok(64 << 10));
        assert_eq!(parse_size("100"), Ok(100));
        assert_eq!(parse_size("0"), Ok(0));
        for bad in ["", "M", "-1M", "1.5G", "12Q", "99999999999999999999T"] {
            assert!(parse_size(bad).is_err(), "{bad} should not parse");
        }
    }

    #[test]
    fn cpus() {
        assert_eq!(parse_cpus("1.5"), Ok(1500));
        assert_eq!(parse_cpus("2"), Ok(2000));
        assert_eq!(parse_cpus(".25"), Ok(250));
        assert_eq!(parse_cpus("0.001"), Ok(1));
        for bad in ["", "-1", "1.0001", "abc", "1.2.3", "."] {
            assert!(parse_cpus(bad).is_err(), "{bad} should not parse");
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("2"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("30d"), Ok(Duration::from_secs(30 * 86_400)));
        for bad in ["", "s", "-1s", "1w", "1.5s"] {
            assert!(parse_duration(bad).is_err(), "{bad} should not parse");
        }
    }
}
