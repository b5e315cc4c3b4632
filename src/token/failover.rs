//! The failover epoch: the pair (n, rank of the cluster that took it), ordered by n, then rank, and sent on
//! the wire as one integer `n·K + rank` (K = [`RANKS`]). Two promotions never produce equal epochs, so "a
//! higher epoch ⇒ step down" always decides. It is part of every fence token; cross-cluster HA
//! (the `kube-shard-ha` crate) takes and compares them.

use std::fmt;

/// K: ranks are `0..RANKS`, and the wire form of an epoch is `n·RANKS + rank`.
pub const RANKS: u64 = 1000;

/// The largest n whose wire form still fits `spec.leaseTransitions` (an `i32`).
pub const MAX_N: u64 = (i32::MAX as u64 - (RANKS - 1)) / RANKS;

/// A failover epoch (n, rank). `FailoverEpoch::default()` is (0, 0): below every epoch a promotion writes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FailoverEpoch {
    n: u64,
    rank: u16,
}

/// An epoch out of range.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FailoverEpochError {
    /// The rank is not below [`RANKS`].
    #[error("rank {0} is not below {RANKS}")]
    Rank(u64),
    /// n is above [`MAX_N`] (the wire form would not fit `spec.leaseTransitions`).
    #[error("epoch number {0} is above {MAX_N}")]
    TooLarge(u64),
}

impl FailoverEpoch {
    /// The epoch (n, rank).
    pub fn new(n: u64, rank: u16) -> Result<Self, FailoverEpochError> {
        if u64::from(rank) >= RANKS {
            return Err(FailoverEpochError::Rank(rank.into()));
        }
        if n > MAX_N {
            return Err(FailoverEpochError::TooLarge(n));
        }
        Ok(FailoverEpoch { n, rank })
    }

    /// The epoch number n.
    #[must_use]
    pub fn n(self) -> u64 {
        self.n
    }

    /// The rank of the cluster that took it.
    #[must_use]
    pub fn rank(self) -> u16 {
        self.rank
    }

    /// The wire form `n·K + rank`.
    #[must_use]
    pub fn wire(self) -> u64 {
        self.n * RANKS + u64::from(self.rank)
    }

    /// The epoch of a wire integer.
    pub fn from_wire(w: u64) -> Result<Self, FailoverEpochError> {
        // the remainder is below RANKS (1000), so it fits a u16
        let rank = u16::try_from(w % RANKS).map_err(|_| FailoverEpochError::Rank(w % RANKS))?;
        FailoverEpoch::new(w / RANKS, rank)
    }

    /// The epoch a promotion by the cluster of `rank` takes over this one: (n + 1, rank).
    pub fn next(self, rank: u16) -> Result<Self, FailoverEpochError> {
        FailoverEpoch::new(self.n + 1, rank)
    }
}

impl fmt::Display for FailoverEpoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.wire())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn order_is_n_then_rank_and_the_wire_keeps_it() {
        let a = FailoverEpoch::new(5, 2).unwrap();
        let b = FailoverEpoch::new(5, 7).unwrap();
        let c = FailoverEpoch::new(6, 0).unwrap();
        assert!(a < b && b < c);
        assert!(a.wire() < b.wire() && b.wire() < c.wire());
        assert_eq!(b.wire(), 5007);
        assert_eq!(FailoverEpoch::from_wire(5007).unwrap(), b);
    }

    #[test]
    fn out_of_range_is_refused() {
        assert_eq!(
            FailoverEpoch::new(1, 1000),
            Err(FailoverEpochError::Rank(1000))
        );
        assert_eq!(
            FailoverEpoch::new(MAX_N + 1, 0),
            Err(FailoverEpochError::TooLarge(MAX_N + 1))
        );
        assert!(FailoverEpoch::new(MAX_N, 999).unwrap().wire() <= i32::MAX as u64);
        assert!(FailoverEpoch::from_wire(u64::MAX).is_err());
    }

    proptest! {
        #[test]
        fn wire_round_trips_and_orders(n1 in 0..MAX_N, r1 in 0u16..1000, n2 in 0..MAX_N, r2 in 0u16..1000) {
            let a = FailoverEpoch::new(n1, r1).unwrap();
            let b = FailoverEpoch::new(n2, r2).unwrap();
            prop_assert_eq!(FailoverEpoch::from_wire(a.wire()).unwrap(), a);
            prop_assert_eq!(a.cmp(&b), a.wire().cmp(&b.wire()));
        }
    }
}
