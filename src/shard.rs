//! Logical shards: `S` fixed, equal, contiguous slices of the 64-bit hash space.
//!
//! Shard `i` of `S` is `[i·2^64/S, (i+1)·2^64/S)`, so `shard_of(h) = h >> (64 − log2 S)`. `S` is a power of
//! two from 1 to 65 536 ([`ShardCount::MAX`]); a shard group caps it at 4096
//! ([`ShardCount::GROUP_MAX`]). `S` never depends on the replica count.
//!
//! Pure: no I/O, no async.

use std::{collections::BTreeSet, fmt, str::FromStr};

use crate::range::{HashRange, RangeSet};

/// The number of logical shards `S`: a power of two from 1 to 65 536.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ShardCount {
    log2: u32,
}

impl ShardCount {
    /// The largest `S` for hashing (2^16).
    pub const MAX: u32 = 1 << 16;
    /// The largest `S` a shard group accepts (4096).
    pub const GROUP_MAX: u32 = 1 << 12;
    /// The default `S` (256).
    pub const DEFAULT: ShardCount = ShardCount { log2: 8 };

    /// `S` shards; `S` must be a power of two from 1 to 65 536.
    ///
    /// ```
    /// use kube_shard::shard::ShardCount;
    /// let s = ShardCount::new(4).unwrap();
    /// assert_eq!(s.shard_of(u64::MAX), 3);
    /// assert!(ShardCount::new(3).is_err());
    /// ```
    pub fn new(count: u32) -> Result<Self, ShardError> {
        if count == 0 || !count.is_power_of_two() || count > Self::MAX {
            return Err(ShardError::InvalidCount { count });
        }
        Ok(ShardCount {
            log2: count.trailing_zeros(),
        })
    }

    /// `S`.
    #[must_use]
    pub const fn get(self) -> u32 {
        1 << self.log2
    }

    /// log2 `S`.
    #[must_use]
    pub const fn log2(self) -> u32 {
        self.log2
    }

    /// The logical shard holding `hash`.
    #[inline]
    #[must_use]
    pub const fn shard_of(self, hash: u64) -> u32 {
        if self.log2 == 0 {
            0
        } else {
            (hash >> (64 - self.log2)) as u32
        }
    }

    /// The hash range of shard `shard`.
    pub fn range_of(self, shard: u32) -> Result<HashRange, ShardError> {
        self.check(shard)?;
        let width = 1u128 << (64 - self.log2);
        let start = u128::from(shard) * width;
        HashRange::new(start, start + width).map_err(|_| ShardError::OutOfRange {
            shard,
            count: self.get(),
        })
    }

    /// The minimal (normalised) range set covering exactly the given shards: adjacent shards merge into
    /// one range, so owning every shard gives the single full range.
    pub fn ranges_of<I: IntoIterator<Item = u32>>(self, shards: I) -> Result<RangeSet, ShardError> {
        shards
            .into_iter()
            .map(|s| self.range_of(s))
            .collect::<Result<RangeSet, _>>()
    }

    /// Whether `shard` is a valid index for this `S`.
    pub fn check(self, shard: u32) -> Result<(), ShardError> {
        if shard < self.get() {
            Ok(())
        } else {
            Err(ShardError::OutOfRange {
                shard,
                count: self.get(),
            })
        }
    }

    /// Check `S` against the group limit of 4096.
    pub fn for_group(self) -> Result<Self, ShardError> {
        if self.get() > Self::GROUP_MAX {
            Err(ShardError::TooManyForGroup { count: self.get() })
        } else {
            Ok(self)
        }
    }
}

impl Default for ShardCount {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl fmt::Debug for ShardCount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ShardCount({})", self.get())
    }
}

impl fmt::Display for ShardCount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.get())
    }
}

impl FromStr for ShardCount {
    type Err = ShardError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let count = s
            .trim()
            .parse::<u32>()
            .map_err(|_| ShardError::NotANumber { text: s.to_owned() })?;
        ShardCount::new(count)
    }
}

/// A set of logical shard indices, written like `0-63,128,130-131`.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct ShardSet {
    shards: BTreeSet<u32>,
}

impl ShardSet {
    /// The empty set.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Parse a list like `0-63,128,130-131` (ranges inclusive) and check every index against `count`.
    ///
    /// ```
    /// use kube_shard::shard::{ShardCount, ShardSet};
    /// let set = ShardSet::parse("0-1,3", ShardCount::new(4).unwrap()).unwrap();
    /// assert_eq!(set.iter().collect::<Vec<_>>(), vec![0, 1, 3]);
    /// assert_eq!(set.to_string(), "0-1,3");
    /// ```
    pub fn parse(text: &str, count: ShardCount) -> Result<Self, ShardError> {
        let set: ShardSet = text.parse()?;
        if let Some(&max) = set.shards.last() {
            count.check(max)?;
        }
        Ok(set)
    }

    /// Add one shard.
    pub fn insert(&mut self, shard: u32) -> bool {
        self.shards.insert(shard)
    }

    /// Whether `shard` is in the set.
    #[must_use]
    pub fn contains(&self, shard: u32) -> bool {
        self.shards.contains(&shard)
    }

    /// Number of shards in the set.
    #[must_use]
    pub fn len(&self) -> usize {
        self.shards.len()
    }

    /// Whether the set is empty.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.shards.is_empty()
    }

    /// The shards in ascending order.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.shards.iter().copied()
    }

    /// The minimal range set of these shards for `count`.
    pub fn ranges(&self, count: ShardCount) -> Result<RangeSet, ShardError> {
        count.ranges_of(self.iter())
    }
}

impl FromIterator<u32> for ShardSet {
    fn from_iter<I: IntoIterator<Item = u32>>(iter: I) -> Self {
        ShardSet {
            shards: iter.into_iter().collect(),
        }
    }
}

impl FromStr for ShardSet {
    type Err = ShardError;

    /// Parse `0-63,128,130-131` without an upper bound check (see [`ShardSet::parse`]).
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = |why: &str| ShardError::BadList {
            text: text.to_owned(),
            why: why.to_owned(),
        };
        let mut shards = BTreeSet::new();
        if text.trim().is_empty() {
            return Ok(ShardSet { shards });
        }
        for part in text.split(',') {
            let part = part.trim();
            if part.is_empty() {
                return Err(bad("empty item between commas"));
            }
            let num = |s: &str| {
                s.trim()
                    .parse::<u32>()
                    .map_err(|_| bad(&format!("{s:?} is not a shard index")))
            };
            match part.split_once('-') {
                Some((a, b)) => {
                    let (a, b) = (num(a)?, num(b)?);
                    if a > b {
                        return Err(bad(&format!("range {a}-{b} runs backwards")));
                    }
                    if b >= ShardCount::MAX {
                        return Err(ShardError::OutOfRange {
                            shard: b,
                            count: ShardCount::MAX,
                        });
                    }
                    shards.extend(a..=b);
                }
                None => {
                    let n = num(part)?;
                    if n >= ShardCount::MAX {
                        return Err(ShardError::OutOfRange {
                            shard: n,
                            count: ShardCount::MAX,
                        });
                    }
                    shards.insert(n);
                }
            }
        }
        Ok(ShardSet { shards })
    }
}

impl fmt::Display for ShardSet {
    /// The compact form `0-63,128,130-131`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut iter = self.shards.iter().copied().peekable();
        let mut first = true;
        while let Some(start) = iter.next() {
            let mut end = start;
            while iter.peek() == Some(&(end + 1)) {
                end += 1;
                iter.next();
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if start == end {
                write!(f, "{start}")?;
            } else {
                write!(f, "{start}-{end}")?;
            }
        }
        Ok(())
    }
}

impl fmt::Debug for ShardSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ShardSet({self})")
    }
}

/// Why a shard count, index or list was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ShardError {
    /// `S` is not a power of two from 1 to 65 536.
    #[error("invalid shard count {count}: must be a power of two from 1 to 65536")]
    InvalidCount {
        /// The requested count.
        count: u32,
    },
    /// `S` is above the shard-group limit of 4096.
    #[error("shard count {count} is above the shard-group limit of 4096")]
    TooManyForGroup {
        /// The requested count.
        count: u32,
    },
    /// The shard count is not a number.
    #[error("invalid shard count {text:?}: not a number")]
    NotANumber {
        /// The text given.
        text: String,
    },
    /// A shard index is not below `S`.
    #[error("shard {shard} does not exist: there are {count} shards (0 to {})", count - 1)]
    OutOfRange {
        /// The index.
        shard: u32,
        /// `S`.
        count: u32,
    },
    /// A shard list could not be parsed.
    #[error("invalid shard list {text:?}: {why}")]
    BadList {
        /// The text given.
        text: String,
        /// What is wrong.
        why: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::range::HASH_SPACE_END;
    use proptest::prelude::*;

    #[test]
    fn counts() {
        for bad in [0, 3, 6, 100, 1 << 17, u32::MAX] {
            assert_eq!(
                ShardCount::new(bad),
                Err(ShardError::InvalidCount { count: bad })
            );
        }
        for log2 in 0..=16 {
            assert_eq!(ShardCount::new(1 << log2).unwrap().get(), 1 << log2);
        }
        assert!(ShardCount::new(8192).unwrap().for_group().is_err());
        assert!(ShardCount::new(4096).unwrap().for_group().is_ok());
        assert_eq!("256".parse::<ShardCount>(), Ok(ShardCount::DEFAULT));
        assert!(matches!(
            "x".parse::<ShardCount>(),
            Err(ShardError::NotANumber { .. })
        ));
    }

    #[test]
    fn single_shard_is_everything() {
        let one = ShardCount::new(1).unwrap();
        assert_eq!(one.shard_of(0), 0);
        assert_eq!(one.shard_of(u64::MAX), 0);
        assert_eq!(one.range_of(0).unwrap(), HashRange::FULL);
    }

    #[test]
    fn ranges_of_two_and_four() {
        let two = ShardCount::new(2).unwrap();
        assert_eq!(
            two.range_of(0).unwrap(),
            HashRange::new(0, 1 << 63).unwrap()
        );
        assert_eq!(
            two.range_of(1).unwrap(),
            HashRange::new(1 << 63, 1 << 64).unwrap()
        );
        assert!(matches!(
            two.range_of(2),
            Err(ShardError::OutOfRange { shard: 2, count: 2 })
        ));
        let four = ShardCount::new(4).unwrap();
        let all = four.ranges_of(0..4).unwrap();
        assert!(all.is_full());
        let ends = four.ranges_of([0, 3]).unwrap();
        assert_eq!(ends.ranges().len(), 2);
    }

    #[test]
    fn shard_lists() {
        let s = ShardCount::DEFAULT;
        let set = ShardSet::parse("0-63,128,130-131", s).unwrap();
        assert_eq!(set.len(), 67);
        assert_eq!(set.to_string(), "0-63,128,130-131");
        assert_eq!(set.ranges(s).unwrap().ranges().len(), 3);
        assert_eq!(ShardSet::parse(" 1 , 2-3 ", s).unwrap().to_string(), "1-3");
        assert!(ShardSet::parse("", s).unwrap().is_empty());
        for bad in ["1,,2", "a", "3-1", "1-", "-1", "1-2-3"] {
            assert!(
                matches!(ShardSet::parse(bad, s), Err(ShardError::BadList { .. })),
                "{bad:?}"
            );
        }
        assert_eq!(
            ShardSet::parse("0-256", s),
            Err(ShardError::OutOfRange {
                shard: 256,
                count: 256
            })
        );
        assert!(ShardSet::parse("70000", s).is_err());
        assert!(
            "0-4294967295".parse::<ShardSet>().is_err(),
            "no giant allocation"
        );
    }

    proptest! {
        #[test]
        fn every_hash_in_exactly_one_shard(hash: u64, log2 in 0u32..=16) {
            let s = ShardCount::new(1 << log2).unwrap();
            let shard = s.shard_of(hash);
            prop_assert!(shard < s.get());
            prop_assert!(s.range_of(shard).unwrap().contains(hash));
            // and in no neighbour
            if shard > 0 {
                prop_assert!(!s.range_of(shard - 1).unwrap().contains(hash));
            }
            if shard + 1 < s.get() {
                prop_assert!(!s.range_of(shard + 1).unwrap().contains(hash));
            }
        }

        #[test]
        fn minimal_range_set_covers_exactly(log2 in 0u32..=10, picks in prop::collection::vec(any::<u32>(), 0..64), probes in prop::collection::vec(any::<u64>(), 32)) {
            let s = ShardCount::new(1 << log2).unwrap();
            let set: ShardSet = picks.iter().map(|p| p % s.get()).collect();
            let ranges = set.ranges(s).unwrap();
            // no two ranges adjacent or overlapping
            for w in ranges.ranges().windows(2) {
                prop_assert!(w[0].end() < u128::from(w[1].start()));
            }
            // every range boundary is a shard boundary, and membership is exact
            let width = HASH_SPACE_END >> log2;
            for r in ranges.iter() {
                prop_assert_eq!(u128::from(r.start()) % width, 0);
                prop_assert_eq!(r.end() % width, 0);
            }
            for shard in 0..s.get().min(1024) {
                let r = s.range_of(shard).unwrap();
                prop_assert_eq!(ranges.contains(r.start()), set.contains(shard));
                prop_assert_eq!(ranges.contains((r.end() - 1) as u64), set.contains(shard));
            }
            for h in probes {
                prop_assert_eq!(ranges.contains(h), set.contains(s.shard_of(h)));
            }
            // number of ranges == number of maximal runs
            prop_assert_eq!(ranges.ranges().len(), set.to_string().split(',').filter(|p| !p.is_empty()).count());
        }
    }
}
