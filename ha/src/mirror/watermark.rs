//! The mirror's position of one kind (HA.md "Position"): a **low watermark**, the highest resourceVersion R
//! such that the watch has delivered everything up to R (an event, a bookmark or a LIST at or above R) and no
//! change at or below R is still queued, in flight, retrying or failed. Never the highest version applied. It
//! only rises: a relist re-delivering old versions does not pull it back, since everything at or below it was
//! applied. Pure.

/// The watermark of one kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Watermark {
    delivered: Option<u64>,
    position: Option<u64>,
}

impl Watermark {
    /// Starting from `checkpoint` (the watch resumes from it: everything up to it was applied).
    #[must_use]
    pub fn resume(checkpoint: Option<u64>) -> Self {
        Watermark {
            delivered: checkpoint,
            position: checkpoint,
        }
    }

    /// The watch delivered everything up to `rv` (an event at `rv`, a bookmark, a LIST's version).
    pub fn delivered(&mut self, rv: u64) {
        self.delivered = Some(self.delivered.map_or(rv, |d| d.max(rv)));
    }

    /// The position, given the oldest pending change of the queue; it never goes back.
    pub fn advance(&mut self, oldest_pending: Option<u64>) -> Option<u64> {
        let d = self.delivered?;
        let now = match oldest_pending {
            Some(p) => d.min(p.saturating_sub(1)),
            None => d,
        };
        self.position = Some(self.position.map_or(now, |p| p.max(now)));
        self.position
    }

    /// The position last computed.
    #[must_use]
    pub fn position(&self) -> Option<u64> {
        self.position
    }
}

#[cfg(test)]
mod tests {
    use super::super::queue::{Backoff, RetryQueue};
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_retrying_change_below_a_later_applied_one_holds_the_position() {
        // Y's change at 100 retries, X's at 105 is applied; the token is 102: the highest version applied
        // (105) would pass it and lose Y's change
        let t = Duration::ZERO;
        let mut q = RetryQueue::new(Backoff::default());
        let mut w = Watermark::resume(Some(90));
        q.push(("ns".into(), "y".into()), 100, t);
        w.delivered(100);
        q.push(("ns".into(), "x".into()), 105, t);
        w.delivered(105);
        for _ in 0..2 {
            let k = q.pop(t).unwrap();
            if k.1 == "y" {
                q.retry(&k, t, "namespace missing");
            } else {
                q.done(&k, t);
            }
        }
        assert_eq!(
            w.advance(q.oldest_pending()),
            Some(99),
            "not 105: Y at 100 is pending"
        );
        assert!(w.position().unwrap() < 102);
        let y = q.pop(t + Duration::from_secs(1)).unwrap();
        q.done(&y, t);
        assert_eq!(w.advance(q.oldest_pending()), Some(105));
    }

    #[test]
    fn the_position_never_passes_an_in_flight_apply() {
        // eight workers take eight keys; the later ones end first, the bookmark is far above
        let t = Duration::ZERO;
        let mut q = RetryQueue::new(Backoff::default());
        let mut w = Watermark::resume(Some(90));
        for i in 0..8 {
            q.push(("ns".into(), format!("o{i}")), 100 + i, t);
            w.delivered(100 + i);
        }
        w.delivered(1000);
        let in_flight: Vec<_> = (0..8).map_while(|_| q.pop(t)).collect();
        assert_eq!(in_flight.len(), 8);
        assert_eq!(
            w.advance(q.oldest_pending()),
            Some(99),
            "all eight in flight"
        );
        // every apply but the oldest one's ends
        for k in in_flight.iter().filter(|k| k.1 != "o0") {
            q.done(k, t);
            assert_eq!(
                w.advance(q.oldest_pending()),
                Some(99),
                "o0's change at 100 is still in flight"
            );
        }
        // a change of a key in flight is re-queued after it, and holds the position at its version
        q.push(("ns".into(), "o0".into()), 1001, t);
        w.delivered(1001);
        q.done(&in_flight[0], t);
        assert_eq!(w.advance(q.oldest_pending()), Some(1000));
        let again = q.pop(t).unwrap();
        assert_eq!(w.advance(q.oldest_pending()), Some(1000), "in flight again");
        q.done(&again, t);
        assert_eq!(w.advance(q.oldest_pending()), Some(1001));
    }

    #[test]
    fn bookmarks_move_a_quiet_kind_and_the_position_never_goes_back() {
        let mut w = Watermark::resume(None);
        assert_eq!(w.advance(None), None, "nothing delivered yet");
        w.delivered(400);
        w.delivered(1000); // a bookmark
        assert_eq!(w.advance(None), Some(1000));
        // a relist re-delivers an old version: already applied, the position stays
        assert_eq!(w.advance(Some(400)), Some(1000));
        w.delivered(1200);
        assert_eq!(w.advance(Some(1100)), Some(1099));
    }
}
