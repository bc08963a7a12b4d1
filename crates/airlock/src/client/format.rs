//! Pure helpers of the client commands: aligned tables, ages, sizes, times
//! (RFC 3339 in, UTC out) and `K=V` arguments.

use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

/// A table of text columns, aligned with two spaces between columns. The
/// last column is not padded, so no line ends in spaces.
pub struct Table {
    headers: Vec<&'static str>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// An empty table with these column headers.
    pub fn new(headers: &[&'static str]) -> Table {
        Table {
            headers: headers.to_vec(),
            rows: Vec::new(),
        }
    }

    /// Appends a row; missing cells are empty, extra cells are dropped.
    pub fn push(&mut self, mut row: Vec<String>) {
        row.resize(self.headers.len(), String::new());
        self.rows.push(row);
    }

    /// The table as lines of text, the header first, each line ending in `\n`.
    pub fn render(&self) -> String {
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (width, cell) in widths.iter_mut().zip(row) {
                *width = (*width).max(cell.chars().count());
            }
        }
        let mut out = String::new();
        let header: Vec<String> = self.headers.iter().map(|h| (*h).to_owned()).collect();
        for row in std::iter::once(&header).chain(&self.rows) {
            let mut line = String::new();
            for (i, (cell, width)) in row.iter().zip(&widths).enumerate() {
                if i + 1 == row.len() {
                    line.push_str(cell);
                } else {
                    let pad = width - cell.chars().count();
                    line.push_str(cell);
                    line.extend(std::iter::repeat_n(' ', pad + 2));
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// A duration in whole seconds the way `docker ps` style tables show it:
/// `5s`, `3m`, `2h`, `4d`. Negative durations show as `0s`.
pub fn format_age(seconds: i64) -> String {
    let s = seconds.max(0);
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86400 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86400),
    }
}

/// When `at_ms` is relative to `now_ms`: `5m ago` or `in 5m`.
pub fn relative(at_ms: i64, now_ms: i64) -> String {
    let delta = (at_ms - now_ms) / 1000;
    if delta >= 0 {
        format!("in {}", format_age(delta))
    } else {
        format!("{} ago", format_age(-delta))
    }
}

/// Milliseconds since the Unix epoch, now.
pub fn now_millis() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// A byte count with the largest binary unit that keeps it short:
/// `536870912` → `512M`, `1610612736` → `1.5G`, `1000` → `1000B`.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [(&str, u32); 4] = [("T", 40), ("G", 30), ("M", 20), ("K", 10)];
    for (unit, shift) in UNITS {
        let one = 1u64 << shift;
        if bytes >= one {
            if bytes.trailing_zeros() >= shift {
                return format!("{}{unit}", bytes / one);
            }
            let tenths = (bytes as u128 * 10 + one as u128 / 2) / one as u128;
            return format!("{}.{}{unit}", tenths / 10, tenths % 10);
        }
    }
    format!("{bytes}B")
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's
/// `days_from_civil`).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date of a day count since 1970-01-01 (`civil_from_days`).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// Parses an RFC 3339 timestamp (`2026-11-30T05:00:00.000Z`,
/// `2026-11-30T06:00:00+01:00`) into milliseconds since the Unix epoch.
pub fn parse_rfc3339(text: &str) -> Option<i64> {
    let bytes = text.as_bytes();
    let number = |range: std::ops::Range<usize>| -> Option<i64> {
        let part = text.get(range)?;
        if part.bytes().all(|b| b.is_ascii_digit()) {
            part.parse().ok()
        } else {
            None
        }
    };
    if bytes.len() < 20
        || bytes[4] != b'-'
        || bytes[7] != b'-'
        || !matches!(bytes[10], b'T' | b't' | b' ')
        || bytes[13] != b':'
        || bytes[16] != b':'
    {
        return None;
    }
    let (year, month, day) = (number(0..4)?, number(5..7)?, number(8..10)?);
    let (hour, minute, second) = (number(11..13)?, number(14..16)?, number(17..19)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 {
        return None;
    }
    let mut rest = &text[19..];
    let mut millis = 0;
    if let Some(fraction) = rest.strip_prefix('.') {
        let digits = fraction.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        for (i, b) in fraction.bytes().take(3).enumerate().take(digits) {
            millis += i64::from(b - b'0') * 10i64.pow(2 - i as u32);
        }
        rest = &fraction[digits..];
    }
    let offset_minutes = match rest {
        "Z" | "z" => 0,
        _ => {
            let sign = match rest.as_bytes().first() {
                Some(b'+') => 1,
                Some(b'-') => -1,
                _ => return None,
            };
            let offset = rest.get(1..)?;
            let (h, m) = offset.split_once(':')?;
            if h.len() != 2 || m.len() != 2 {
                return None;
            }
            sign * (h.parse::<i64>().ok()? * 60 + m.parse::<i64>().ok()?)
        }
    };
    let days = days_from_civil(year, month, day);
    let seconds = days * 86_400 + hour * 3600 + minute * 60 + second - offset_minutes * 60;
    Some(seconds * 1000 + millis)
}

/// Milliseconds since the Unix epoch as `2026-11-30 05:00:00` (UTC).
pub fn format_utc(millis: i64) -> String {
    let seconds = millis.div_euclid(1000);
    let (year, month, day) = civil_from_days(seconds.div_euclid(86_400));
    let of_day = seconds.rem_euclid(86_400);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}",
        of_day / 3600,
        of_day % 3600 / 60,
        of_day % 60
    )
}

/// A time field of an API answer as milliseconds since the epoch: an RFC 3339
/// string, or a number of Unix milliseconds.
pub fn time_field(value: Option<&serde_json::Value>) -> Option<i64> {
    match value? {
        serde_json::Value::String(text) => parse_rfc3339(text),
        serde_json::Value::Number(n) => n.as_i64(),
        _ => None,
    }
}

/// Parses a `K=V` argument (clap value parser). The key must not be empty;
/// the value may be, and may contain `=`.
pub fn parse_kv(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_owned(), value.to_owned())),
        _ => Err(format!("`{text}` is not K=V")),
    }
}

/// Parses a duration such as `300s`, `5m` or `1h` (a bare number is
/// seconds) into whole seconds, rounding up (clap value parser).
pub fn parse_timeout_secs(text: &str) -> Result<u64, String> {
    let duration = airlock_policy::parse_duration(text).map_err(|e| e.to_string())?;
    let millis = duration.as_millis();
    Ok(u64::try_from(millis.div_ceil(1000)).unwrap_or(u64::MAX))
}

/// Checks a size such as `512M` and keeps its text (clap value parser).
pub fn parse_size_arg(text: &str) -> Result<String, String> {
    airlock_policy::parse_size(text)
        .map(|_| text.to_owned())
        .map_err(|e| e.to_string())
}

/// Parses a CPU count such as `1.5` (clap value parser).
pub fn parse_cpus_arg(text: &str) -> Result<f64, String> {
    airlock_policy::parse_cpus(text)
        .map(|millis| f64::from(millis) / 1000.0)
        .map_err(|e| e.to_string())
}

/// Percent-encodes everything but RFC 3986's unreserved characters, for a
/// path segment or one side of a `k=v` pair.
pub fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
    out
}

/// A JSON value as a table cell: strings without quotes, `null` as `-`,
/// anything else as compact JSON.
pub fn cell(value: Option<&serde_json::Value>) -> String {
    match value {
        None | Some(serde_json::Value::Null) => "-".to_owned(),
        Some(serde_json::Value::String(text)) => text.clone(),
        Some(other) => other.to_string(),
    }
}

/// An object as `k=v,k2=v2`, sorted; `-` when empty or absent.
pub fn pairs(value: Option<&serde_json::Value>, separator: &str) -> String {
    match value {
        Some(serde_json::Value::Object(map)) if !map.is_empty() => {
            let mut items: Vec<String> = map
                .iter()
                .map(|(k, v)| format!("{k}={}", cell(Some(v))))
                .collect();
            items.sort();
            items.join(separator)
        }
        None | Some(serde_json::Value::Null) => "-".to_owned(),
        Some(serde_json::Value::Object(_)) => "-".to_owned(),
        Some(other) => cell(Some(other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn table_aligns_columns_and_leaves_no_trailing_spaces() {
        let mut table = Table::new(&["ID", "STATE", "METADATA"]);
        table.push(vec!["sbx-1".into(), "running".into(), "a=b".into()]);
        table.push(vec!["sbx-22222".into(), "dead".into(), String::new()]);
        assert_eq!(
            table.render(),
            "ID         STATE    METADATA\n\
             sbx-1      running  a=b\n\
             sbx-22222  dead\n"
        );
    }

    #[test]
    fn table_counts_characters_not_bytes() {
        let mut table = Table::new(&["A", "B"]);
        table.push(vec!["é".into(), "x".into()]);
        assert_eq!(table.render(), "A  B\né  x\n");
    }

    #[test]
    fn table_pads_short_rows() {
        let mut table = Table::new(&["A", "B", "C"]);
        table.push(vec!["1".into()]);
        assert_eq!(table.render(), "A  B  C\n1\n");
    }

    #[test]
    fn ages() {
        assert_eq!(format_age(-3), "0s");
        assert_eq!(format_age(0), "0s");
        assert_eq!(format_age(59), "59s");
        assert_eq!(format_age(60), "1m");
        assert_eq!(format_age(3599), "59m");
        assert_eq!(format_age(7200), "2h");
        assert_eq!(format_age(86_400 * 3 + 5), "3d");
        assert_eq!(relative(10_000, 0), "in 10s");
        assert_eq!(relative(0, 180_000), "3m ago");
    }

    #[test]
    fn sizes() {
        assert_eq!(format_size(536_870_912), "512M");
        assert_eq!(format_size(1 << 30), "1G");
        assert_eq!(format_size(1_610_612_736), "1.5G");
        assert_eq!(format_size(1000), "1000B");
        assert_eq!(format_size(0), "0B");
        assert_eq!(format_size(1536), "1.5K");
    }

    #[test]
    fn rfc3339_round_trips_through_utc() {
        let ms = parse_rfc3339("2026-11-30T05:00:00.000Z");
        assert_eq!(ms.map(format_utc).as_deref(), Some("2026-11-30 05:00:00"));
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(parse_rfc3339("1970-01-01T00:00:01.5Z"), Some(1500));
        assert_eq!(parse_rfc3339("1970-01-01T00:00:01.123456789Z"), Some(1123));
        assert_eq!(parse_rfc3339("1970-01-01T01:00:00+01:00"), Some(0));
        assert_eq!(parse_rfc3339("1969-12-31T23:00:00-01:00"), Some(0));
        assert_eq!(parse_rfc3339("2000-02-29T12:34:56Z"), Some(951_827_696_000));
        assert_eq!(format_utc(951_827_696_000), "2000-02-29 12:34:56");
        for bad in [
            "",
            "2026-11-30",
            "2026-11-30T05:00:00",
            "2026-13-30T05:00:00Z",
            "2026-11-30T05:00:00.Z",
            "2026-11-30T05:00:00+0100",
            "2026/11/30T05:00:00Z",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
    }

    #[test]
    fn time_fields_take_strings_and_millis() {
        assert_eq!(time_field(Some(&json!("1970-01-01T00:00:02Z"))), Some(2000));
        assert_eq!(time_field(Some(&json!(1234))), Some(1234));
        assert_eq!(time_field(Some(&json!(null))), None);
        assert_eq!(time_field(None), None);
    }

    #[test]
    fn key_value_arguments() {
        assert_eq!(parse_kv("A=b"), Ok(("A".into(), "b".into())));
        assert_eq!(parse_kv("A="), Ok(("A".into(), String::new())));
        assert_eq!(parse_kv("A=b=c"), Ok(("A".into(), "b=c".into())));
        assert!(parse_kv("=b").is_err());
        assert!(parse_kv("A").is_err());
    }

    #[test]
    fn timeouts_round_up_to_seconds() {
        assert_eq!(parse_timeout_secs("300s"), Ok(300));
        assert_eq!(parse_timeout_secs("5m"), Ok(300));
        assert_eq!(parse_timeout_secs("30"), Ok(30));
        assert_eq!(parse_timeout_secs("1500ms"), Ok(2));
        assert!(parse_timeout_secs("5 minutes").is_err());
    }

    #[test]
    fn size_and_cpu_arguments() {
        assert_eq!(parse_size_arg("512M"), Ok("512M".into()));
        assert!(parse_size_arg("lots").is_err());
        assert_eq!(parse_cpus_arg("1.5"), Ok(1.5));
        assert!(parse_cpus_arg("-1").is_err());
    }

    #[test]
    fn percent_encoding() {
        assert_eq!(percent_encode("sbx-1_a.b~"), "sbx-1_a.b~");
        assert_eq!(percent_encode("a b/c&d=é"), "a%20b%2Fc%26d%3D%C3%A9");
    }

    #[test]
    fn cells_and_pairs() {
        assert_eq!(cell(Some(&json!("x"))), "x");
        assert_eq!(cell(Some(&json!(3))), "3");
        assert_eq!(cell(None), "-");
        assert_eq!(pairs(Some(&json!({"b": "2", "a": 1})), ","), "a=1,b=2");
        assert_eq!(pairs(Some(&json!({})), ","), "-");
    }
}
