//! Lag as confirmation (HA.md "Lag"): every probe period a `limit=1` LIST reads the kind's current
//! resourceVersion; the kind is confirmed up to the latest probe its watermark has passed, and the lag is the
//! time since that probe — so a frozen watch shows as growing lag, never as 0. Pure: times are the caller's
//! (local monotonic clock offsets).

use std::collections::VecDeque;
use std::time::Duration;

/// Probes of one kind not yet passed by the watermark, and the latest passed.
#[derive(Clone, Debug, Default)]
pub struct Confirmations {
    pending: VecDeque<(Duration, u64)>,
    confirmed: Option<Duration>,
}

impl Confirmations {
    /// A probe at `at` read the collection at `rv`.
    pub fn probe(&mut self, at: Duration, rv: u64) {
        self.pending.push_back((at, rv));
    }

    /// The watermark is at `position`: the latest probe it has passed is confirmed.
    pub fn passed(&mut self, position: Option<u64>) -> Option<Duration> {
        let Some(p) = position else {
            return self.confirmed;
        };
        while let Some(&(at, rv)) = self.pending.front() {
            if rv > p {
                break;
            }
            self.confirmed = Some(at);
            self.pending.pop_front();
        }
        self.confirmed
    }

    /// The time of the latest confirmed probe.
    #[must_use]
    pub fn confirmed(&self) -> Option<Duration> {
        self.confirmed
    }

    /// The lag at `now`: the time since the latest confirmed probe (`None`: never confirmed).
    #[must_use]
    pub fn lag(&self, now: Duration) -> Option<Duration> {
        self.confirmed.map(|c| now.saturating_sub(c))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn a_frozen_watermark_shows_as_growing_lag() {
        let mut c = Confirmations::default();
        c.probe(S, 100);
        assert_eq!(c.passed(Some(100)), Some(S));
        c.probe(2 * S, 150);
        c.probe(3 * S, 160);
        // the watch froze at 120: nothing newer is confirmed, the lag grows with time
        assert_eq!(c.passed(Some(120)), Some(S));
        assert_eq!(c.lag(10 * S), Some(9 * S));
        assert_eq!(c.lag(20 * S), Some(19 * S));
        assert_eq!(c.passed(Some(160)), Some(3 * S));
        assert_eq!(c.lag(3 * S), Some(Duration::ZERO));
    }

    #[test]
    fn never_confirmed_is_not_zero_lag() {
        let mut c = Confirmations::default();
        c.probe(S, 100);
        assert_eq!(c.passed(None), None);
        assert_eq!(c.lag(5 * S), None);
    }
}
