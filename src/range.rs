//! Hash ranges `[start, end)` over the 64-bit hash space, and normalised sets of them.
//!
//! `end` may be 2^64 (the whole space ends there), so bounds are carried as `u128` and every range is
//! checked to lie within `[0, 2^64]`. A [`RangeSet`] is always normalised: sorted, merged (no two ranges
//! overlap or touch) and free of empty ranges, so two sets covering the same hashes are equal.
//!
//! Pure: no I/O, no async.

use std::fmt;

/// 2^64: the exclusive end of the hash space.
pub const HASH_SPACE_END: u128 = 1u128 << 64;

/// A non-empty half-open range `[start, end)` of 64-bit hashes, with `end ≤ 2^64`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HashRange {
    start: u128,
    end: u128,
}

impl HashRange {
    /// The whole hash space `[0, 2^64)`.
    pub const FULL: HashRange = HashRange {
        start: 0,
        end: HASH_SPACE_END,
    };

    /// A range `[start, end)`; `start < end ≤ 2^64` is required.
    ///
    /// ```
    /// use kube_shard::range::HashRange;
    /// let upper_half = HashRange::new(1 << 63, 1 << 64).unwrap();
    /// assert!(upper_half.contains(u64::MAX));
    /// assert!(HashRange::new(5, 5).is_err());
    /// ```
    pub fn new(start: u128, end: u128) -> Result<Self, RangeError> {
        if end > HASH_SPACE_END {
            return Err(RangeError::EndBeyondSpace { end });
        }
        if start >= end {
            return Err(RangeError::Empty { start, end });
        }
        Ok(HashRange { start, end })
    }

    /// The inclusive start.
    #[must_use]
    pub const fn start(&self) -> u64 {
        // start < end ≤ 2^64, so start fits in u64
        self.start as u64
    }

    /// The exclusive end, at most 2^64.
    #[must_use]
    pub const fn end(&self) -> u128 {
        self.end
    }

    /// How many hashes the range holds.
    #[must_use]
    pub const fn len(&self) -> u128 {
        self.end - self.start
    }

    /// Always false: a `HashRange` is never empty (kept for clippy's `len_without_is_empty`).
    #[must_use]
    pub const fn is_empty(&self) -> bool {
        false
    }

    /// Whether `hash` lies in the range.
    #[inline]
    #[must_use]
    pub const fn contains(&self, hash: u64) -> bool {
        let h = hash as u128;
        self.start <= h && h < self.end
    }
}

impl fmt::Debug for HashRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{:#018x}, {:#x})", self.start, self.end)
    }
}

impl fmt::Display for HashRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// A normalised set of hash ranges: sorted, merged, no empty ranges.
///
/// ```
/// use kube_shard::range::{HashRange, RangeSet};
/// let set: RangeSet = [HashRange::new(10, 20).unwrap(), HashRange::new(0, 10).unwrap()]
///     .into_iter()
///     .collect();
/// assert_eq!(set.ranges(), &[HashRange::new(0, 20).unwrap()]);
/// ```
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct RangeSet {
    ranges: Vec<HashRange>,
}

impl RangeSet {
    /// The empty set.
    #[must_use]
    pub const fn new() -> Self {
        RangeSet { ranges: Vec::new() }
    }

    /// The whole hash space.
    #[must_use]
    pub fn full() -> Self {
        RangeSet {
            ranges: vec![HashRange::FULL],
        }
    }

    /// The normalised ranges, in ascending order.
    #[must_use]
    pub fn ranges(&self) -> &[HashRange] {
        &self.ranges
    }

    /// Iterate the normalised ranges in ascending order.
    pub fn iter(&self) -> std::slice::Iter<'_, HashRange> {
        self.ranges.iter()
    }

    /// Whether the set holds no hash.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Whether the set is the whole hash space.
    #[must_use]
    pub fn is_full(&self) -> bool {
        self.ranges == [HashRange::FULL]
    }

    /// How many hashes the set holds.
    #[must_use]
    pub fn size(&self) -> u128 {
        self.ranges.iter().map(HashRange::len).sum()
    }

    /// Whether `hash` lies in the set (binary search; the set is sorted).
    #[must_use]
    pub fn contains(&self, hash: u64) -> bool {
        let h = hash as u128;
        // first range whose end is beyond h
        let idx = self.ranges.partition_point(|r| r.end <= h);
        self.ranges.get(idx).is_some_and(|r| r.start <= h)
    }

    /// The union of two sets.
    #[must_use]
    pub fn union(&self, other: &RangeSet) -> RangeSet {
        self.ranges
            .iter()
            .chain(other.ranges.iter())
            .copied()
            .collect()
    }

    /// The hashes in `self` that are not in `other`.
    #[must_use]
    pub fn difference(&self, other: &RangeSet) -> RangeSet {
        let mut out = Vec::new();
        let mut j = 0;
        for r in &self.ranges {
            let mut start = r.start;
            while j < other.ranges.len() && other.ranges[j].end <= start {
                j += 1;
            }
            let mut k = j;
            while start < r.end {
                match other.ranges.get(k) {
                    Some(o) if o.start < r.end => {
                        if o.start > start {
                            out.push(HashRange {
                                start,
                                end: o.start,
                            });
                        }
                        start = start.max(o.end);
                        k += 1;
                    }
                    _ => {
                        out.push(HashRange { start, end: r.end });
                        start = r.end;
                    }
                }
            }
        }
        RangeSet { ranges: out }
    }

    /// The hashes in both sets.
    #[must_use]
    pub fn intersection(&self, other: &RangeSet) -> RangeSet {
        self.difference(&self.difference(other))
    }

    /// Whether every hash of `self` is in `other`.
    #[must_use]
    pub fn is_subset(&self, other: &RangeSet) -> bool {
        self.difference(other).is_empty()
    }
}

impl FromIterator<HashRange> for RangeSet {
    fn from_iter<I: IntoIterator<Item = HashRange>>(iter: I) -> Self {
        let mut ranges: Vec<HashRange> = iter.into_iter().collect();
        ranges.sort_unstable();
        let mut merged: Vec<HashRange> = Vec::with_capacity(ranges.len());
        for r in ranges {
            match merged.last_mut() {
                // overlapping or touching: merge
                Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
                _ => merged.push(r),
            }
        }
        RangeSet { ranges: merged }
    }
}

impl<'a> IntoIterator for &'a RangeSet {
    type Item = &'a HashRange;
    type IntoIter = std::slice::Iter<'a, HashRange>;

    fn into_iter(self) -> Self::IntoIter {
        self.ranges.iter()
    }
}

impl fmt::Debug for RangeSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.ranges.iter()).finish()
    }
}

/// Why a range could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RangeError {
    /// `start >= end`: the range would hold no hash, which a selector cannot express.
    #[error("empty hash range: start {start:#x} is not below end {end:#x}")]
    Empty {
        /// The requested start.
        start: u128,
        /// The requested end.
        end: u128,
    },
    /// `end` lies beyond 2^64.
    #[error("hash range end {end:#x} lies beyond 2^64")]
    EndBeyondSpace {
        /// The requested end.
        end: u128,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn r(start: u128, end: u128) -> HashRange {
        HashRange::new(start, end).unwrap()
    }

    #[test]
    fn bounds_are_checked() {
        assert_eq!(
            HashRange::new(3, 3),
            Err(RangeError::Empty { start: 3, end: 3 })
        );
        assert_eq!(
            HashRange::new(4, 3),
            Err(RangeError::Empty { start: 4, end: 3 })
        );
        assert!(matches!(
            HashRange::new(0, HASH_SPACE_END + 1),
            Err(RangeError::EndBeyondSpace { .. })
        ));
        let last = r(HASH_SPACE_END - 1, HASH_SPACE_END);
        assert!(last.contains(u64::MAX));
        assert!(!last.contains(u64::MAX - 1));
        assert_eq!(last.start(), u64::MAX);
    }

    #[test]
    fn normalises_sorts_and_merges_touching() {
        let set: RangeSet = [r(30, 40), r(0, 10), r(10, 20), r(35, 50)]
            .into_iter()
            .collect();
        assert_eq!(set.ranges(), &[r(0, 20), r(30, 50)]);
        assert_eq!(set.size(), 40);
        assert!(set.contains(19) && !set.contains(20) && set.contains(30) && !set.contains(50));
    }

    #[test]
    fn set_algebra() {
        let a: RangeSet = [r(0, 100)].into_iter().collect();
        let b: RangeSet = [r(10, 20), r(50, 60), r(90, 200)].into_iter().collect();
        assert_eq!(a.difference(&b).ranges(), &[r(0, 10), r(20, 50), r(60, 90)]);
        assert_eq!(
            a.intersection(&b).ranges(),
            &[r(10, 20), r(50, 60), r(90, 100)]
        );
        assert_eq!(a.union(&b).ranges(), &[r(0, 200)]);
        assert!(RangeSet::new().is_subset(&a));
        assert!(!b.is_subset(&a));
        assert!(RangeSet::full().is_full());
    }

    fn arb_range() -> impl Strategy<Value = HashRange> {
        (0u128..=HASH_SPACE_END, 0u128..=HASH_SPACE_END)
            .prop_filter("non-empty", |(a, b)| a != b)
            .prop_map(|(a, b)| r(a.min(b), a.max(b)))
    }

    fn arb_set() -> impl Strategy<Value = RangeSet> {
        prop::collection::vec(arb_range(), 0..8).prop_map(|v| v.into_iter().collect())
    }

    fn probes(sets: &[&RangeSet]) -> Vec<u64> {
        let mut p = vec![0, u64::MAX];
        for s in sets {
            for r in s.iter() {
                for b in [r.start, r.end] {
                    for d in [b.wrapping_sub(1), b, b + 1] {
                        if d < HASH_SPACE_END {
                            p.push(d as u64);
                        }
                    }
                }
            }
        }
        p
    }

    proptest! {
        #[test]
        fn normalised_invariants(set in arb_set()) {
            for w in set.ranges().windows(2) {
                prop_assert!(w[0].end < w[1].start, "sorted, disjoint, not touching: {:?}", set);
            }
        }

        #[test]
        fn algebra_matches_membership(a in arb_set(), b in arb_set()) {
            let (u, d, i) = (a.union(&b), a.difference(&b), a.intersection(&b));
            for h in probes(&[&a, &b]) {
                prop_assert_eq!(u.contains(h), a.contains(h) || b.contains(h));
                prop_assert_eq!(d.contains(h), a.contains(h) && !b.contains(h));
                prop_assert_eq!(i.contains(h), a.contains(h) && b.contains(h));
            }
            prop_assert_eq!(u.size(), a.size() + b.size() - i.size());
        }
    }
}
