//! The writes the embedded server's fence policies refused, split by whose they were: a member that had
//! lost the shard, or the shard's current owner (which the policies must never refuse).
//!
//! A refusal is placed among the assignment's committed versions by the store's resourceVersion at the
//! refusal (testserver's [`AdmissionRefusal::resource_version`]). Its fence's `shard/epoch` was a
//! **deposed** member's when the shard's epoch is higher in the assignment in effect then, or in the next
//! one committed: the coordinator raises the per-shard parameter just *before* the write that activates
//! the new owner, so a write refused in between was already superseded by that next version. Otherwise it
//! was the **current owner**'s. Pure: no I/O.
//!
//! [`AdmissionRefusal::resource_version`]: kube_shard_testserver::AdmissionRefusal::resource_version

use std::collections::BTreeMap;

use kube_shard::token::FenceToken;
use serde::Serialize;

/// One committed version of the assignment: its resourceVersion and each shard's epoch.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Version {
    pub(crate) resource_version: u64,
    pub(crate) epochs: BTreeMap<u32, u64>,
}

/// One refused write: the store's resourceVersion then and the fence it carried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Refused {
    pub(crate) resource_version: u64,
    pub(crate) fence: Option<FenceToken>,
}

/// The counts for the report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Counts {
    /// Of a member that had lost the shard.
    pub deposed: u64,
    /// Of the shard's current owner (an invariant: 0).
    pub current_owner: u64,
    /// Without a fence header (not a kube-shard fenced write).
    pub unfenced: u64,
}

/// Classify `refused` against `versions` (in commit order).
pub(crate) fn classify(refused: &[Refused], versions: &[Version]) -> Counts {
    let mut c = Counts::default();
    for r in refused {
        // a mirror token (no shard) does not occur in the demo, which runs no HA mirror: counted unfenced
        let Some((shard, epoch)) = r.fence.and_then(|t| t.shard().zip(t.shard_epoch())) else {
            c.unfenced += 1;
            continue;
        };
        let split = versions.partition_point(|v| v.resource_version <= r.resource_version);
        let at = split.checked_sub(1).map(|i| &versions[i]);
        let next = versions.get(split);
        // no grant at all at the refusal (before the first assignment, or the shard unowned): not an owner
        let superseded = |v: Option<&Version>| {
            v.and_then(|v| v.epochs.get(&shard))
                .is_some_and(|&e| epoch < e)
        };
        let owned_then = at
            .and_then(|v| v.epochs.get(&shard))
            .is_some_and(|&e| e <= epoch);
        if owned_then && !superseded(next) {
            c.current_owner += 1;
        } else {
            c.deposed += 1;
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube_shard_ha::FailoverEpoch;

    fn v(rv: u64, epochs: &[(u32, u64)]) -> Version {
        Version {
            resource_version: rv,
            epochs: epochs.iter().copied().collect(),
        }
    }

    fn r(rv: u64, shard: u32, epoch: u64) -> Refused {
        Refused {
            resource_version: rv,
            fence: Some(FenceToken::shard_token(
                FailoverEpoch::default(),
                shard,
                epoch,
            )),
        }
    }

    #[test]
    fn splits_deposed_from_current_owners() {
        let versions = [v(10, &[(1, 100), (2, 100)]), v(20, &[(1, 200), (2, 100)])];
        let refused = [
            r(25, 1, 100), // after the handoff: deposed
            r(15, 1, 100), // before it, but the next version supersedes it (the parameter was raised): deposed
            r(15, 2, 100), // shard 2 never moved: the current owner's
            r(25, 2, 100), // likewise
            r(5, 1, 100),  // before any assignment: nobody's grant
            r(25, 3, 100), // an unowned shard
            Refused {
                resource_version: 25,
                fence: None,
            },
        ];
        assert_eq!(
            classify(&refused, &versions),
            Counts {
                deposed: 4,
                current_owner: 2,
                unfenced: 1
            }
        );
    }

    #[test]
    fn a_refusal_at_a_commit_sees_that_commit() {
        let versions = [v(10, &[(1, 100)]), v(20, &[(1, 200)])];
        assert_eq!(classify(&[r(20, 1, 200)], &versions).current_owner, 1);
        assert_eq!(classify(&[r(20, 1, 100)], &versions).deposed, 1);
    }
}
