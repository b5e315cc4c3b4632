//! Small statistics helpers: percentiles and ratios, formatted.

/// The `p`-th percentile (0–100, nearest rank) of `values`; `None` when empty.
#[must_use]
pub fn percentile(values: &[f64], p: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    Some(v[rank.clamp(1, v.len()) - 1])
}

/// `a / b`, or NaN when `b` is 0.
#[must_use]
pub fn ratio(a: f64, b: f64) -> f64 {
    if b == 0.0 {
        f64::NAN
    } else {
        a / b
    }
}

/// Two decimals (or `-` for NaN).
#[must_use]
pub fn f2(x: f64) -> String {
    if x.is_nan() {
        "-".into()
    } else {
        format!("{x:.2}")
    }
}

/// The build these figures come from: `release`, or `debug` — where the workspace's dev profile compiles
/// kube-shard's own code at `opt-level` 1 and every dependency (kube-runtime's `Controller`, the stock
/// leader's code) at 2, which makes CPU comparisons with the leader lean its way.
#[must_use]
pub fn build_profile() -> &'static str {
    if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    }
}

/// `ok` or `MISSED` for a target check.
#[must_use]
pub fn verdict(met: bool) -> &'static str {
    if met {
        "ok"
    } else {
        "MISSED"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), Some(50.0));
        assert_eq!(percentile(&v, 99.0), Some(99.0));
        assert_eq!(percentile(&v, 100.0), Some(100.0));
        assert_eq!(percentile(&[3.0], 50.0), Some(3.0));
        assert_eq!(percentile(&[], 50.0), None);
        assert!(ratio(1.0, 0.0).is_nan());
        assert_eq!(f2(f64::NAN), "-");
    }
}
