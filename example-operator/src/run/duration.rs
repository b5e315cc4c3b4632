//! Durations on the command line: `6s`, `500ms`, `1.5s`, `2m`.

use std::time::Duration;

/// Parse `<number><unit>` with unit `ms`, `s`, `m` or `h` (the number may have a fraction).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| format!("{s:?}: a duration needs a unit (ms, s, m, h), like 6s or 500ms"))?;
    let (num, unit) = s.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("{s:?}: {num:?} is not a number"))?;
    let secs = match unit {
        "ms" => value / 1000.0,
        "s" => value,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (use ms, s, m or h)")),
    };
    if !secs.is_finite() || !(0.0..=1e9).contains(&secs) {
        return Err(format!("{s:?}: out of range"));
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(parse_duration("6s").unwrap(), Duration::from_secs(6));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("3.5s").unwrap(), Duration::from_millis(3500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert!(parse_duration("6").is_err());
        assert!(parse_duration("s").is_err());
        assert!(parse_duration("5d").is_err());
    }
}
