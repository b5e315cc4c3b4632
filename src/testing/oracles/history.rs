//! Oracle 2: every owner change of a shard in the assignment's committed history is justified.
//!
//! Input: the committed versions of the assignment ConfigMap and of the group's member Leases, decoded into
//! an [`OwnershipHistory`] (see [`AssignmentVersion::from_assignment`] and [`LeaseVersion::from_report`]).
//! [`check`] asserts that a version that gives a shard another owner, or drops it, is preceded by evidence
//! from the previous owner `name/incarnation`: its `released` ack under the shard's move id, a takeover
//! mark, or its Lease claimed by another incarnation or deleted. A deletion of the ConfigMap
//! ([`AssignmentVersion::deleted`]) drops nothing; an older assignment written back changes nothing.
//!
//! See `docs/protocol.md#displaced-incarnations` and the ownership-history oracle section above it.

use std::{collections::BTreeMap, fmt};

use serde::{Deserialize, Serialize};

use crate::group::{assignment::Assignment, report::MemberReport};
use crate::ownership::state::Handoff;
use crate::ownership::MoveId;

/// `name/incarnation` of a member.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Holder {
    /// The stable name.
    pub name: String,
    /// The incarnation.
    pub incarnation: String,
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.name, self.incarnation)
    }
}

/// One shard in one assignment version.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardOwner {
    /// Its owner.
    pub owner: Holder,
    /// The id of the move in progress (`Moving` or `Draining`), if any.
    pub move_id: Option<MoveId>,
    /// The epoch it is owned at (0: not recorded, as in fixtures from before epochs were kept).
    #[serde(default)]
    pub epoch: u64,
}

/// One committed version of the assignment.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AssignmentVersion {
    /// Its resourceVersion.
    pub rv: u64,
    /// Shard → owner (a deleted ConfigMap: empty).
    pub shards: BTreeMap<u32, ShardOwner>,
    /// The ConfigMap was deleted (a version with no shards that drops nothing).
    #[serde(default)]
    pub deleted: bool,
}

impl AssignmentVersion {
    /// From a decoded assignment committed at `rv`.
    #[must_use]
    pub fn from_assignment(rv: u64, a: &Assignment) -> Self {
        let shards = a
            .view
            .shards
            .iter()
            .map(|(s, sa)| {
                let move_id = match &sa.handoff {
                    Handoff::Stable => None,
                    Handoff::Moving { id, .. } | Handoff::Draining { id, .. } => Some(*id),
                };
                let owner = Holder {
                    name: sa.owner.name.to_string(),
                    incarnation: sa.owner.incarnation.to_string(),
                };
                (
                    *s,
                    ShardOwner {
                        owner,
                        move_id,
                        epoch: sa.epoch,
                    },
                )
            })
            .collect();
        AssignmentVersion {
            rv,
            shards,
            deleted: false,
        }
    }

    /// The ConfigMap deleted at `rv`.
    #[must_use]
    pub fn deletion(rv: u64) -> Self {
        AssignmentVersion {
            rv,
            shards: BTreeMap::new(),
            deleted: true,
        }
    }
}

/// One committed version of a member's Lease: what it says about the evidence of its holder's exit.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseVersion {
    /// Its resourceVersion.
    pub rv: u64,
    /// The member's name.
    pub name: String,
    /// The incarnation the Lease carries (`kube-shard.io/incarnation`), if any.
    pub incarnation: Option<String>,
    /// `released` acks of its report: move id → shards.
    pub released: BTreeMap<MoveId, Vec<u32>>,
    /// The incarnation marked taken over (`kube-shard.io/taken-over`), if any.
    pub taken_over: Option<String>,
    /// The Lease was deleted at `rv` (the other fields are empty).
    #[serde(default)]
    pub deleted: bool,
}

impl LeaseVersion {
    /// From the annotations of a member Lease committed at `rv` (`report`: its decoded report, if any).
    #[must_use]
    pub fn from_report(
        rv: u64,
        name: &str,
        incarnation: Option<&str>,
        report: Option<&MemberReport>,
        taken_over: Option<&str>,
    ) -> Self {
        let released = report
            .map(|r| {
                r.released_acks
                    .iter()
                    .map(|(id, set)| (*id, set.iter().collect()))
                    .collect()
            })
            .unwrap_or_default();
        LeaseVersion {
            rv,
            name: name.to_owned(),
            incarnation: incarnation.map(str::to_owned),
            released,
            taken_over: taken_over.map(str::to_owned),
            deleted: false,
        }
    }

    /// The Lease of member `name` deleted at `rv`.
    #[must_use]
    pub fn deletion(rv: u64, name: &str) -> Self {
        LeaseVersion {
            rv,
            name: name.to_owned(),
            deleted: true,
            ..LeaseVersion::default()
        }
    }
}

/// The oracle's input: the assignment's and the member Leases' committed versions.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnershipHistory {
    /// The assignment's versions.
    pub assignments: Vec<AssignmentVersion>,
    /// The member Leases' versions.
    pub leases: Vec<LeaseVersion>,
}

/// What the oracle found wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Violation {
    /// A shard changed owner with no release and no takeover of the previous owner before.
    Unjustified {
        /// The shard.
        shard: u32,
        /// The assignment version that made the change.
        rv: u64,
        /// The previous owner.
        from: Holder,
        /// The new owner.
        to: Holder,
        /// The move the previous owner's last version carried, if any.
        move_id: Option<MoveId>,
    },
    /// A committed assignment dropped a shard (no owner any more) with no release and no takeover of its
    /// previous owner before.
    Dropped {
        /// The shard.
        shard: u32,
        /// The assignment version that dropped it.
        rv: u64,
        /// The previous owner.
        from: Holder,
        /// The move the previous owner's last version carried, if any.
        move_id: Option<MoveId>,
    },
}

fn move_text(move_id: Option<MoveId>) -> String {
    move_id.map_or_else(|| "no move".to_owned(), |m| format!("move {m}"))
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::Unjustified {
                shard,
                rv,
                from,
                to,
                move_id,
            } => {
                let m = move_text(*move_id);
                write!(
                    f,
                    "shard {shard}: owner {from} -> {to} at rv {rv} ({m}) with neither a released ack \
                     nor a takeover mark of {from} committed before"
                )
            }
            Violation::Dropped {
                shard,
                rv,
                from,
                move_id,
            } => {
                let m = move_text(*move_id);
                write!(
                    f,
                    "shard {shard}: dropped from its owner {from} at rv {rv} ({m}) with neither a released \
                     ack nor a takeover mark of {from} committed before"
                )
            }
        }
    }
}

/// One owner change: (shard, assignment rv, previous owner's last version, new owner or none: dropped).
type Change<'a> = (u32, u64, &'a ShardOwner, Option<&'a ShardOwner>);

/// Every owner change (and drop) in the history, in resourceVersion order.
fn changes(history: &OwnershipHistory) -> Vec<Change<'_>> {
    let mut versions: Vec<&AssignmentVersion> = history.assignments.iter().collect();
    versions.sort_by_key(|v| v.rv);
    let mut last: BTreeMap<u32, &ShardOwner> = BTreeMap::new();
    let mut out = Vec::new();
    for v in versions {
        if v.deleted {
            continue;
        }
        for (shard, prev) in &last {
            if !v.shards.contains_key(shard) {
                out.push((*shard, v.rv, *prev, None));
            }
        }
        last.retain(|shard, _| v.shards.contains_key(shard));
        for (shard, now) in &v.shards {
            if let Some(prev) = last.get(shard) {
                if rolled_back(prev, now) {
                    // names another owner at or below the last known owner's epoch: no member follows
                    // that (the holder keeps the shard, the one named never activates it), so the last
                    // known owner stays
                    continue;
                }
                if prev.owner != now.owner {
                    out.push((*shard, v.rv, *prev, Some(now)));
                }
            }
            last.insert(*shard, now);
        }
    }
    out
}

/// `now` names another owner than `prev` at an epoch at or below `prev`'s (both recorded): an older
/// assignment written back (a restore, a re-applied manifest), which transfers nothing.
fn rolled_back(prev: &ShardOwner, now: &ShardOwner) -> bool {
    prev.owner != now.owner && prev.epoch > 0 && now.epoch > 0 && now.epoch <= prev.epoch
}

/// How many owner changes and drops (not counting first assignments) the history holds: what [`check`]
/// judges.
#[must_use]
pub fn owner_changes(history: &OwnershipHistory) -> usize {
    changes(history).len()
}

/// Check the history; empty when every owner change was justified.
#[must_use]
pub fn check(history: &OwnershipHistory) -> Vec<Violation> {
    changes(history)
        .into_iter()
        .filter(|(shard, rv, prev, _)| !justified(history, *shard, prev, *rv))
        .map(|(shard, rv, prev, now)| match now {
            Some(now) => Violation::Unjustified {
                shard,
                rv,
                from: prev.owner.clone(),
                to: now.owner.clone(),
                move_id: prev.move_id,
            },
            None => Violation::Dropped {
                shard,
                rv,
                from: prev.owner.clone(),
                move_id: prev.move_id,
            },
        })
        .collect()
}

/// A Lease version of `prev.owner` committed before `rv` releases `shard` under its move or marks it taken
/// over, or the owner was displaced before `rv` (see the module doc).
fn justified(history: &OwnershipHistory, shard: u32, prev: &ShardOwner, rv: u64) -> bool {
    let who = &prev.owner;
    displaced_before(history, who, rv)
        || history
            .leases
            .iter()
            .filter(|l| l.rv < rv && l.name == who.name && !l.deleted)
            .any(|l| {
                let taken = l.taken_over.as_deref() == Some(who.incarnation.as_str());
                let released = l.incarnation.as_deref() == Some(who.incarnation.as_str())
                    && prev
                        .move_id
                        .and_then(|m| l.released.get(&m))
                        .is_some_and(|s| s.contains(&shard));
                taken || released
            })
}

/// `who`'s Lease was replaced by another incarnation or deleted before `rv`, after a version of `who`'s
/// own, and `who` never wrote a version after that (a displaced incarnation cannot renew again).
fn displaced_before(history: &OwnershipHistory, who: &Holder, rv: u64) -> bool {
    let mine = |l: &LeaseVersion| !l.deleted && l.incarnation.as_deref() == Some(&who.incarnation);
    let of_name = || history.leases.iter().filter(|l| l.name == who.name);
    let Some(last_mine) = of_name().filter(|l| mine(l)).map(|l| l.rv).max() else {
        return false;
    };
    of_name().any(|l| l.rv > last_mine && l.rv < rv && !mine(l))
}

/// Panic with every violation, one per line, when an owner change was not justified.
///
/// # Panics
/// When [`check`] finds a violation.
pub fn assert_justified(history: &OwnershipHistory) {
    let v = check(history);
    assert!(
        v.is_empty(),
        "ownership history oracle: {} violation(s):\n{}",
        v.len(),
        v.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[cfg(test)]
mod tests;
