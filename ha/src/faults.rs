//! The HA crate's fault points (feature `test-util`), declared with the core's one mechanism
//! ([`kube_shard::testing::faults`]). The elector's are planted per instance (an elector built with
//! [`Faults`]: several electors share a test's thread); the others per thread.

pub use kube_shard::testing::faults::{Fault, Faults};

/// Elector: date a takeover wait from the first observation of the Lease, not of the version written over
/// (a precondition from a later read than the one that started the wait).
pub const PRECONDITION_FROM_LATER_READ: Fault = Fault::new("ha-precondition-from-later-read");
/// Elector: create a missing Lease at once.
pub const CREATE_MISSING_AT_ONCE: Fault = Fault::new("ha-create-missing-at-once");
/// Elector: wait only this process's own `lease_duration` (+ grace) before a takeover, ignoring the
/// timings the holder published (a holder with a longer `renew_deadline` still holds).
pub const IGNORE_PUBLISHED_TIMINGS: Fault = Fault::new("ha-ignore-published-timings");
/// Elector: leave the renewals to another member of the cluster and read the Leases instead, counting a
/// read that shows this cluster's record at the led epoch as a renewal dated at the read's receipt.
pub const HOLD_FROM_READS: Fault = Fault::new("ha-hold-from-reads");
/// Elector: judge records by cluster id alone, ignoring the writer's identity (two clusters given one id
/// each take the other's record for their own term).
pub const IGNORE_IDENTITY: Fault = Fault::new("ha-ignore-identity");
/// Forced promotion: no hold of the mirror before the candidacy.
pub const NO_MIRROR_HOLD: Fault = Fault::new("ha-no-mirror-hold");
/// Adoption: admission opened before adoption runs.
pub const OPEN_BEFORE_ADOPTION: Fault = Fault::new("ha-open-before-adoption");
/// Mirror: a position that ignores the retry queue (the highest version delivered).
pub const WATERMARK_IGNORES_QUEUE: Fault = Fault::new("ha-watermark-ignores-queue");
/// Mirror: the source-version marker written first (with the main resource, before `/status`).
pub const MARKER_FIRST: Fault = Fault::new("ha-marker-first");

/// Every fault point of the HA crate.
pub const ALL: [Fault; 9] = [
    PRECONDITION_FROM_LATER_READ,
    CREATE_MISSING_AT_ONCE,
    IGNORE_PUBLISHED_TIMINGS,
    HOLD_FROM_READS,
    IGNORE_IDENTITY,
    NO_MIRROR_HOLD,
    OPEN_BEFORE_ADOPTION,
    WATERMARK_IGNORES_QUEUE,
    MARKER_FIRST,
];

#[cfg(test)]
mod tests {
    #[test]
    fn names_are_unique_and_distinct_from_the_cores() {
        let mut names: Vec<&str> = super::ALL.iter().map(|f| f.name()).collect();
        names.extend(kube_shard::testing::faults::CORE.iter().map(|f| f.name()));
        let n = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), n);
    }
}
