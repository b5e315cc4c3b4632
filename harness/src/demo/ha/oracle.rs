//! The demo's checkers, pure (no I/O): lost writes, writes accepted under a lower epoch, the time two
//! clusters admitted at once, divergent objects at failback, and percentiles.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::Serialize;

/// What a write did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Op {
    /// Created or updated the Widget with `spec.size` = the write's sequence number.
    Put,
    /// Deleted the Widget.
    Delete,
}

/// A write: acknowledged, or of unknown outcome (`maybe`: a transport error; it may have committed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Write {
    pub(crate) name: String,
    /// Rises with every write the writer sends (a Put stores it as `spec.size`).
    pub(crate) seq: u64,
    pub(crate) op: Op,
}

/// A write the new Active does not hold.
#[derive(Clone, Debug, PartialEq, Eq, Ord, PartialOrd, Serialize)]
pub struct Lost {
    pub name: String,
    pub seq: u64,
    /// What the new Active holds: its `spec.size`, or `None` when it has no such Widget.
    pub holds: Option<u64>,
}

/// The acknowledged writes the new Active does not hold at that version or a newer one. Per name only the
/// latest acknowledged write counts (a later one supersedes it). `held`: the new Active's Widgets, name →
/// `spec.size`. A write of unknown outcome can explain a state: a later `maybe` delete an absent Widget,
/// a later `maybe` put a Widget whose size is above the acknowledged delete.
pub(crate) fn lost(acked: &[Write], maybe: &[Write], held: &BTreeMap<String, u64>) -> Vec<Lost> {
    let mut latest: BTreeMap<&str, &Write> = BTreeMap::new();
    for w in acked {
        let e = latest.entry(&w.name).or_insert(w);
        if w.seq > e.seq {
            *e = w;
        }
    }
    let mut out = Vec::new();
    for (name, w) in latest {
        let holds = held.get(name).copied();
        let later_maybe = |op: Op| {
            maybe
                .iter()
                .any(|m| m.name == name && m.op == op && m.seq > w.seq)
        };
        let ok = match (w.op, holds) {
            (Op::Put, Some(s)) => s >= w.seq,
            (Op::Put, None) => later_maybe(Op::Delete),
            (Op::Delete, None) => true,
            (Op::Delete, Some(s)) => s > w.seq,
        };
        if !ok {
            out.push(Lost {
                name: name.to_owned(),
                seq: w.seq,
                holds,
            });
        }
    }
    out
}

/// One (cluster, epoch) admission interval of an operator, on the demo's monotonic clock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Interval {
    pub(crate) cluster: String,
    pub(crate) epoch: u64,
    pub(crate) start: Duration,
    /// The last completion of a request sent under it (or now, while one is in flight).
    pub(crate) end: Duration,
}

/// The total time during which two different clusters both had an admission interval open.
pub(crate) fn overlap(intervals: &[Interval]) -> Duration {
    // sweep: for every elementary segment between two boundaries, count the clusters open in it
    let mut points: Vec<Duration> = intervals.iter().flat_map(|i| [i.start, i.end]).collect();
    points.sort();
    points.dedup();
    let mut total = Duration::ZERO;
    for w in points.windows(2) {
        let (a, b) = (w[0], w[1]);
        let open: BTreeSet<&str> = intervals
            .iter()
            .filter(|i| i.start <= a && i.end >= b)
            .map(|i| i.cluster.as_str())
            .collect();
        if open.len() > 1 {
            total += b - a;
        }
    }
    total
}

/// An operator write acknowledged under `epoch` at `at`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct EpochWrite {
    pub(crate) cluster: String,
    pub(crate) epoch: u64,
    pub(crate) at: Duration,
}

/// Writes acknowledged after some cluster had already admitted under a higher epoch.
pub(crate) fn lower_epoch_writes(intervals: &[Interval], writes: &[EpochWrite]) -> u64 {
    writes
        .iter()
        .filter(|w| {
            intervals
                .iter()
                .any(|i| i.epoch > w.epoch && i.start < w.at)
        })
        .count() as u64
}

/// The `q` quantile (0..=1) of `v` (nearest rank), `None` when empty.
pub(crate) fn quantile(v: &[Duration], q: f64) -> Option<Duration> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort();
    let rank = ((q * s.len() as f64).ceil() as usize).clamp(1, s.len());
    Some(s[rank - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(name: &str, seq: u64, op: Op) -> Write {
        Write {
            name: name.into(),
            seq,
            op,
        }
    }

    fn held(v: &[(&str, u64)]) -> BTreeMap<String, u64> {
        v.iter().map(|(n, s)| ((*n).to_owned(), *s)).collect()
    }

    #[test]
    fn the_latest_put_held_at_that_size_or_newer_is_not_lost() {
        let acked = [w("a", 1, Op::Put), w("a", 5, Op::Put), w("b", 2, Op::Put)];
        assert_eq!(lost(&acked, &[], &held(&[("a", 5), ("b", 9)])), vec![]);
    }

    #[test]
    fn an_older_size_or_a_missing_object_is_lost() {
        let acked = [w("a", 1, Op::Put), w("a", 5, Op::Put), w("b", 2, Op::Put)];
        let l = lost(&acked, &[], &held(&[("a", 1)]));
        assert_eq!(
            l,
            vec![
                Lost {
                    name: "a".into(),
                    seq: 5,
                    holds: Some(1)
                },
                Lost {
                    name: "b".into(),
                    seq: 2,
                    holds: None
                }
            ]
        );
    }

    #[test]
    fn a_lost_delete_is_a_resurrected_object() {
        let acked = [w("a", 1, Op::Put), w("a", 3, Op::Delete)];
        assert_eq!(lost(&acked, &[], &held(&[("a", 1)])).len(), 1);
        assert_eq!(lost(&acked, &[], &held(&[])), vec![]);
        // a later write of unknown outcome explains a newer object
        assert_eq!(lost(&acked, &[], &held(&[("a", 4)])), vec![]);
    }

    #[test]
    fn a_maybe_delete_explains_a_missing_object_but_an_earlier_one_does_not() {
        let acked = [w("a", 3, Op::Put)];
        assert_eq!(lost(&acked, &[w("a", 4, Op::Delete)], &held(&[])), vec![]);
        assert_eq!(lost(&acked, &[w("a", 2, Op::Delete)], &held(&[])).len(), 1);
    }

    fn iv(c: &str, e: u64, s: u64, t: u64) -> Interval {
        Interval {
            cluster: c.into(),
            epoch: e,
            start: Duration::from_millis(s),
            end: Duration::from_millis(t),
        }
    }

    #[test]
    fn overlap_counts_only_time_two_clusters_admit() {
        let v = [
            iv("a", 1001, 0, 100),
            iv("a", 1001, 50, 120),
            iv("b", 2002, 200, 300),
        ];
        assert_eq!(overlap(&v), Duration::ZERO);
        let v = [iv("a", 1001, 0, 250), iv("b", 2002, 200, 300)];
        assert_eq!(overlap(&v), Duration::from_millis(50));
    }

    #[test]
    fn a_write_after_a_higher_epoch_admitted_is_counted() {
        let v = [iv("a", 1001, 0, 100), iv("b", 2002, 200, 300)];
        let wr = |c: &str, e, at| EpochWrite {
            cluster: c.into(),
            epoch: e,
            at: Duration::from_millis(at),
        };
        let writes = [wr("a", 1001, 90), wr("b", 2002, 250)];
        assert_eq!(lower_epoch_writes(&v, &writes), 0);
        let late = [wr("a", 1001, 210)];
        assert_eq!(lower_epoch_writes(&v, &late), 1);
    }

    #[test]
    fn quantiles() {
        let v: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(quantile(&v, 0.5), Some(Duration::from_millis(50)));
        assert_eq!(quantile(&v, 0.99), Some(Duration::from_millis(99)));
        assert_eq!(quantile(&[], 0.5), None);
    }
}
