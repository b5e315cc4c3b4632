//! The JSON forms of apimachinery types that are not plain objects (`Time`, `MicroTime`, `Duration`),
//! and kube-apiserver's summary of a body it could not decode.

use serde_json::{Map, Value};

/// kube-apiserver's `summarizeData`: JSON-looking text as text, anything else in hex, 30 bytes at most.
pub(super) fn summarize(data: &[u8]) -> String {
    const MAX: usize = 30;
    let (head, more) = if data.len() > MAX {
        (&data[..MAX], " ...")
    } else {
        (data, "")
    };
    match data.first() {
        None => "<empty>".into(),
        Some(b'{') => format!("{}{more}", String::from_utf8_lossy(head)),
        Some(_) => {
            let hex: String = head.iter().map(|b| format!("{b:02x}")).collect();
            format!("{hex}{more}")
        }
    }
}

/// `metav1.Time` (RFC 3339 to the second) or `MicroTime` (to the microsecond), in UTC; zero is `null`.
pub(super) fn time(m: &Map<String, Value>, micro: bool) -> Value {
    let secs = m.get("seconds").and_then(Value::as_i64).unwrap_or(0);
    let nanos = m.get("nanos").and_then(Value::as_i64).unwrap_or(0);
    if secs == 0 && nanos == 0 {
        return Value::Null;
    }
    let Ok(ts) = jiff::Timestamp::new(secs, i32::try_from(nanos).unwrap_or(0)) else {
        return Value::Null;
    };
    let base = ts.strftime("%Y-%m-%dT%H:%M:%S").to_string();
    Value::String(if micro {
        format!("{base}.{:06}Z", ts.subsec_microsecond())
    } else {
        format!("{base}Z")
    })
}

/// Go's `time.Duration.String()`: `1h2m3.5s`, `150ms`, `0s`.
pub(super) fn go_duration(ns: i64) -> String {
    if ns == 0 {
        return "0s".into();
    }
    let neg = if ns < 0 { "-" } else { "" };
    let u = ns.unsigned_abs();
    if u < 1_000_000_000 {
        let (unit, div) = if u < 1_000 {
            ("ns", 1)
        } else if u < 1_000_000 {
            ("µs", 1_000)
        } else {
            ("ms", 1_000_000)
        };
        return format!("{neg}{}{unit}", frac(u, div));
    }
    let (h, rem) = (u / 3_600_000_000_000, u % 3_600_000_000_000);
    let (m, s) = (rem / 60_000_000_000, rem % 60_000_000_000);
    let secs = format!("{}s", frac(s, 1_000_000_000));
    match (h, m) {
        (0, 0) => format!("{neg}{secs}"),
        (0, m) => format!("{neg}{m}m{secs}"),
        (h, m) => format!("{neg}{h}h{m}m{secs}"),
    }
}

/// `v / div` with the fraction's trailing zeros cut, as Go prints it.
fn frac(v: u64, div: u64) -> String {
    let (whole, rest) = (v / div, v % div);
    if rest == 0 {
        return whole.to_string();
    }
    let width = div.to_string().len() - 1;
    let digits = format!("{rest:0width$}");
    format!("{whole}.{}", digits.trim_end_matches('0'))
}
