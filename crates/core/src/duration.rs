//! The one way a duration is written, in flags, pool files, app specs and policies:
//! `500ms`, `2s`, `1.5m`, `1h30m`, `1d`, or a bare number of seconds. Each field then
//! says what range (and precision) it takes; the grammar is the same everywhere.
//!
//! ```text
//! duration ::= number | (number unit)+
//! number   ::= digits ["." digits]
//! unit     ::= "ms" | "s" | "m" | "h" | "d"
//! ```

use std::time::Duration;

/// Longest duration written anywhere: a year is no timeout or window anyone means.
pub const MAX: Duration = Duration::from_secs(366 * 86_400);

const UNITS: [(&str, u128); 5] = [
    ("ms", 1_000_000),
    ("s", 1_000_000_000),
    ("m", 60_000_000_000),
    ("h", 3_600_000_000_000),
    ("d", 86_400_000_000_000),
];

/// Parses `text` (see the module doc); at most [`MAX`], exact to the nanosecond.
pub fn parse(text: &str) -> Result<Duration, String> {
    let s = text.trim();
    let bad = || format!("{s:?} is not a duration like 500ms, 2s, 1.5m, 1h30m or 1d");
    if s.is_empty() {
        return Err(bad());
    }
    let mut rest = s;
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        let (number, after) = rest.split_at(digits);
        let (unit, ns) = match UNITS.iter().find(|(u, _)| after.starts_with(u)) {
            Some((u, ns)) => (*u, *ns),
            // A bare number is seconds, and only on its own.
            None if after.is_empty() && rest.len() == s.len() => ("", 1_000_000_000),
            None => return Err(bad()),
        };
        total = total.checked_add(scaled(number, ns).ok_or_else(bad)?).ok_or_else(bad)?;
        rest = &after[unit.len()..];
    }
    if total > MAX.as_nanos() {
        return Err(format!("{s:?} is longer than a year"));
    }
    u64::try_from(total / 1_000_000_000)
        .map(|secs| Duration::new(secs, (total % 1_000_000_000) as u32))
        .map_err(|_| bad())
}

/// `number` (digits, at most one '.') times `unit` nanoseconds, rounded down.
fn scaled(number: &str, unit: u128) -> Option<u128> {
    let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
    if (whole.is_empty() && frac.is_empty()) || frac.contains('.') || whole.len() + frac.len() > 18 {
        return None;
    }
    let whole: u128 = if whole.is_empty() { 0 } else { whole.parse().ok()? };
    let frac_value: u128 = if frac.is_empty() { 0 } else { frac.parse().ok()? };
    let frac_ns = frac_value.checked_mul(unit)? / 10u128.pow(frac.len() as u32);
    whole.checked_mul(unit)?.checked_add(frac_ns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_grammar_from_milliseconds_to_days() {
        let ok = |s: &str| parse(s).unwrap_or_else(|e| panic!("{s}: {e}"));
        assert_eq!(ok("500ms"), Duration::from_millis(500));
        assert_eq!(ok("2s"), Duration::from_secs(2));
        assert_eq!(ok("90"), Duration::from_secs(90));
        assert_eq!(ok("1.5m"), Duration::from_secs(90));
        assert_eq!(ok("1h30m"), Duration::from_secs(5400));
        assert_eq!(ok("1d"), Duration::from_secs(86_400));
        assert_eq!(ok(" 0.25s "), Duration::from_millis(250));
        assert_eq!(ok("1ms"), Duration::from_millis(1));
        assert_eq!(ok("0s"), Duration::ZERO);
        for bad in ["", "s", "1x", "1.2.3s", "-1s", "1 s", "10 m", "1s2", "1e3s", "2w", "."] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
        assert!(parse("367d").unwrap_err().contains("longer than a year"));
        assert!(parse("99999999999999999999s").is_err());
    }
}
