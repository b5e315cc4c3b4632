//! Whether the server filters a resource by `shardSelector`: detected from the data, with hysteresis.
//!
//! A resource starts in **server** mode; any item or event outside the ranges a sub-watch asked for, or an
//! `invalid shard selector` HTTP 500 (an alarm), flips it to **fallback** at once. Server mode comes back
//! only after a quiet period that doubles with every flip and a re-probe LIST the server filtered (or a
//! `shardInfo` echo); after an alarm, only when the watcher is rebuilt.
//!
//! Pure: no I/O, no async (instants are passed in). See `docs/read-path.md#server-mode-and-fallback-mode`.

use std::time::Duration;

use tokio::time::Instant;

/// How a resource is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadMode {
    /// Server-side filtering: each sub-watch reads only its ranges.
    Server,
    /// One full watch and the local hash filter.
    Fallback,
}

impl ReadMode {
    /// `"server"` or `"fallback"`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            ReadMode::Server => "server",
            ReadMode::Fallback => "fallback",
        }
    }
}

/// Why the mode flipped to fallback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FlipCause {
    OutOfRange,
    InvalidSelector,
}

/// The per-resource mode detector.
#[derive(Debug, Clone)]
pub(crate) struct ModeDetector {
    mode: ReadMode,
    flips: u32,
    probe_after: Option<Instant>,
    base: Duration,
    max: Duration,
    /// An `invalid shard selector` alarm was raised: never re-probe.
    invalid_selector: bool,
}

impl ModeDetector {
    /// A detector that starts in server mode; the first re-probe comes `base` after the first flip.
    pub(crate) fn new(base: Duration, max: Duration) -> Self {
        ModeDetector {
            mode: ReadMode::Server,
            flips: 0,
            probe_after: None,
            base,
            max,
            invalid_selector: false,
        }
    }

    pub(crate) fn mode(&self) -> ReadMode {
        self.mode
    }

    /// Evidence that the server does not filter. Returns whether the mode flipped.
    pub(crate) fn fall_back(&mut self, cause: FlipCause, now: Instant) -> bool {
        if cause == FlipCause::InvalidSelector {
            self.invalid_selector = true;
        }
        if self.mode == ReadMode::Fallback {
            return false;
        }
        self.mode = ReadMode::Fallback;
        self.flips += 1;
        let factor = 1u32.checked_shl(self.flips - 1).unwrap_or(u32::MAX);
        let wait = self.base.saturating_mul(factor).min(self.max);
        self.probe_after = Some(now + wait);
        true
    }

    /// Whether a re-probe is due.
    pub(crate) fn probe_due(&self, now: Instant) -> bool {
        self.next_probe().is_some_and(|t| now >= t)
    }

    /// When the next re-probe is due, in fallback (never after an invalid-selector alarm).
    pub(crate) fn next_probe(&self) -> Option<Instant> {
        (self.mode == ReadMode::Fallback && !self.invalid_selector)
            .then_some(self.probe_after)
            .flatten()
    }

    /// The result of a re-probe: `filtered` = the server filtered it. Returns whether the mode flipped back.
    pub(crate) fn probed(&mut self, filtered: bool, now: Instant) -> bool {
        if self.mode != ReadMode::Fallback || self.invalid_selector {
            return false;
        }
        if filtered {
            self.mode = ReadMode::Server;
            self.probe_after = None;
            true
        } else {
            let factor = 1u32
                .checked_shl(self.flips.saturating_sub(1))
                .unwrap_or(u32::MAX);
            self.probe_after = Some(now + self.base.saturating_mul(factor).min(self.max));
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn flips_and_backs_off() {
        let base = Duration::from_secs(60);
        let mut d = ModeDetector::new(base, Duration::from_secs(1800));
        let t0 = Instant::now();
        assert_eq!(d.mode(), ReadMode::Server);
        assert!(d.fall_back(FlipCause::OutOfRange, t0));
        assert!(
            !d.fall_back(FlipCause::OutOfRange, t0),
            "already in fallback"
        );
        assert!(!d.probe_due(t0 + Duration::from_secs(59)));
        assert!(d.probe_due(t0 + base));
        assert!(!d.probed(false, t0 + base), "still unfiltered: stay");
        assert!(d.probed(true, t0 + base * 2));
        assert_eq!(d.mode(), ReadMode::Server);
        // second flip waits twice as long
        let t1 = t0 + base * 3;
        assert!(d.fall_back(FlipCause::OutOfRange, t1));
        assert!(!d.probe_due(t1 + base));
        assert!(d.probe_due(t1 + base * 2));
        // capped
        for _ in 0..40 {
            d.probed(true, t1);
            d.fall_back(FlipCause::OutOfRange, t1);
        }
        assert_eq!(d.next_probe(), Some(t1 + Duration::from_secs(1800)));
    }

    /// After an invalid-selector alarm, no re-probe brings the refused selectors back.
    #[tokio::test(start_paused = true)]
    async fn invalid_selector_stops_reprobes() {
        let base = Duration::from_secs(60);
        let mut d = ModeDetector::new(base, Duration::from_secs(1800));
        let t0 = Instant::now();
        assert!(d.fall_back(FlipCause::InvalidSelector, t0));
        assert_eq!(d.next_probe(), None);
        assert!(!d.probe_due(t0 + base * 100));
        assert!(
            !d.probed(true, t0 + base),
            "a passing probe does not flip back"
        );
        assert_eq!(d.mode(), ReadMode::Fallback);
        // also when the alarm comes while already in fallback
        let mut d = ModeDetector::new(base, Duration::from_secs(1800));
        assert!(d.fall_back(FlipCause::OutOfRange, t0));
        assert!(!d.fall_back(FlipCause::InvalidSelector, t0));
        assert!(!d.probe_due(t0 + base * 100));
    }
}
