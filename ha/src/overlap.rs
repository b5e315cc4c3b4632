//! The cross-cluster overlap checker. Per (cluster, failover epoch), the interval from
//! its first admission to the last completion of a request sent under it (requests in flight included)
//! must not overlap any other (cluster, epoch)'s interval, and intervals ordered by start have rising
//! epochs. On one machine the monotonic clock is shared, so the check is exact in tests.
//!
//! Feed it with [`HaOverlap::admit`] (the returned [`Work`] records the completion when dropped), then call
//! [`HaOverlap::violations`].

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tokio::time::Instant;

/// One (cluster, epoch-wire) interval.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Interval {
    /// First admission.
    pub start: Instant,
    /// Last completion (or admission, while none completed).
    pub end: Instant,
    /// Requests still in flight.
    pub open: u32,
}

/// A violation found.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Violation {
    /// Two (cluster, epoch) intervals overlap.
    Overlap {
        /// The first (cluster, epoch).
        a: (String, u64),
        /// The second.
        b: (String, u64),
    },
    /// An interval that starts later has a lower or equal epoch.
    EpochWentDown {
        /// The earlier (cluster, epoch).
        earlier: (String, u64),
        /// The later one.
        later: (String, u64),
    },
}

type Tag = (String, u64);

/// The recorder. Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct HaOverlap {
    inner: Arc<Mutex<BTreeMap<Tag, Interval>>>,
}

/// A request in flight under a (cluster, epoch); its completion is recorded when dropped.
#[derive(Debug)]
#[must_use = "the completion is recorded when this is dropped"]
pub struct Work {
    rec: HaOverlap,
    tag: Tag,
}

impl Drop for Work {
    fn drop(&mut self) {
        let now = Instant::now();
        let mut g = self.rec.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = g.get_mut(&self.tag) {
            i.end = i.end.max(now);
            i.open = i.open.saturating_sub(1);
        }
    }
}

impl HaOverlap {
    /// Record an admission under (`cluster`, `epoch`) now.
    pub fn admit(&self, cluster: &str, epoch: u64) -> Work {
        let now = Instant::now();
        let tag = (cluster.to_string(), epoch);
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let i = g.entry(tag.clone()).or_insert(Interval {
            start: now,
            end: now,
            open: 0,
        });
        i.end = i.end.max(now);
        i.open += 1;
        Work {
            rec: self.clone(),
            tag,
        }
    }

    /// The intervals recorded so far.
    #[must_use]
    pub fn intervals(&self) -> BTreeMap<(String, u64), Interval> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Every violation among the intervals recorded so far (an interval with requests in flight extends to
    /// now).
    #[must_use]
    pub fn violations(&self) -> Vec<Violation> {
        let now = Instant::now();
        let mut v: Vec<(Tag, Instant, Instant)> = self
            .intervals()
            .into_iter()
            .map(|(t, i)| (t, i.start, if i.open > 0 { now } else { i.end }))
            .collect();
        v.sort_by_key(|x| x.1);
        let mut out = Vec::new();
        for (k, a) in v.iter().enumerate() {
            for b in &v[k + 1..] {
                // b starts at or after a's start: they overlap unless a ended strictly before b began
                if a.2 >= b.1 {
                    out.push(Violation::Overlap {
                        a: a.0.clone(),
                        b: b.0.clone(),
                    });
                }
                if b.0 .1 <= a.0 .1 {
                    out.push(Violation::EpochWentDown {
                        earlier: a.0.clone(),
                        later: b.0.clone(),
                    });
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn disjoint_rising_intervals_pass() {
        let o = HaOverlap::default();
        drop(o.admit("a", 1001));
        tokio::time::advance(Duration::from_secs(1)).await;
        drop(o.admit("b", 2002));
        assert_eq!(o.violations(), vec![]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_in_flight_across_the_other_clusters_admission_is_an_overlap() {
        let o = HaOverlap::default();
        let w = o.admit("a", 1001);
        tokio::time::advance(Duration::from_secs(1)).await;
        drop(o.admit("b", 2002));
        tokio::time::advance(Duration::from_secs(1)).await;
        drop(w);
        assert_eq!(
            o.violations(),
            vec![Violation::Overlap {
                a: ("a".into(), 1001),
                b: ("b".into(), 2002)
            }]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_lower_epoch_after_a_higher_one_is_found() {
        let o = HaOverlap::default();
        drop(o.admit("b", 2002));
        tokio::time::advance(Duration::from_secs(1)).await;
        drop(o.admit("a", 1001));
        assert!(matches!(
            o.violations()[..],
            [Violation::EpochWentDown { .. }]
        ));
    }
}
