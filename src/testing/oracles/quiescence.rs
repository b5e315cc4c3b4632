//! Oracle 3: committed fence epochs per object never go back, and after quiescence every object's latest
//! generation was reconciled by its owner.
//!
//! - [`check_epochs`]: per uid, over the committed versions of the objects the members wrote
//!   ([`FencedCommit`]), the fence token never goes behind the highest committed before
//!   ([`FenceToken::is_behind`]); a version without a token is skipped, an unparsable one is a violation.
//! - [`check_reconciled`]: once the group is quiet, each object's latest generation was reconciled by the
//!   owner of its shard in the final assignment.
//!
//! See `docs/protocol.md#checking-it-the-quiescence-oracle-testingoraclesquiescence-feature-test-util`.

use std::{collections::BTreeMap, fmt};

use serde::{Deserialize, Serialize};

use crate::token::FenceToken;

/// One committed version of a written object.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FencedCommit {
    /// Its resourceVersion.
    pub rv: u64,
    /// The object's uid.
    pub uid: String,
    /// The raw [`FENCE_ANNOTATION`](crate::token::FENCE_ANNOTATION), if any.
    pub fence: Option<String>,
}

/// What [`check_epochs`] found wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum EpochViolation {
    /// A commit carried a lower epoch than one committed before for the same uid.
    Back {
        /// The object's uid.
        uid: String,
        /// The commit with the highest epoch before (rv, token).
        highest: (u64, String),
        /// The later commit with a lower epoch (rv, token).
        later: (u64, String),
    },
    /// A fence annotation that does not parse.
    Unparsable {
        /// The object's uid.
        uid: String,
        /// The commit.
        rv: u64,
        /// The annotation.
        raw: String,
    },
}

impl fmt::Display for EpochViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EpochViolation::Back {
                uid,
                highest,
                later,
            } => write!(
                f,
                "uid {uid}: fence epoch went back: {} committed at rv {} after {} at rv {}",
                later.1, later.0, highest.1, highest.0
            ),
            EpochViolation::Unparsable { uid, rv, raw } => {
                write!(
                    f,
                    "uid {uid}: unparsable fence {raw:?} committed at rv {rv}"
                )
            }
        }
    }
}

/// Check the committed fence epochs; empty when no uid's epoch went back.
#[must_use]
pub fn check_epochs(commits: &[FencedCommit]) -> Vec<EpochViolation> {
    let mut sorted: Vec<&FencedCommit> = commits.iter().collect();
    sorted.sort_by_key(|c| c.rv);
    let mut highest: BTreeMap<&str, (FenceToken, u64, &str)> = BTreeMap::new();
    let mut out = Vec::new();
    for c in sorted {
        let Some(raw) = c.fence.as_deref() else {
            continue;
        };
        let Ok(token) = raw.trim().parse::<FenceToken>() else {
            out.push(EpochViolation::Unparsable {
                uid: c.uid.clone(),
                rv: c.rv,
                raw: raw.to_owned(),
            });
            continue;
        };
        match highest.get(c.uid.as_str()) {
            Some((h, rv, tok)) if token.is_behind(h) => {
                out.push(EpochViolation::Back {
                    uid: c.uid.clone(),
                    highest: (*rv, (*tok).to_owned()),
                    later: (c.rv, raw.to_owned()),
                });
            }
            prev => {
                // a mirror token at the same failover epoch keeps the shard epoch seen before
                if prev.is_none_or(|p| token.raise(Some(&p.0)) == token) {
                    highest.insert(&c.uid, (token, c.rv, raw));
                }
            }
        }
    }
    out
}

/// How many committed versions carry a fence annotation: what [`check_epochs`] judges (a version written
/// without one by someone else carries the last fenced write's annotation along).
#[must_use]
pub fn fenced_versions(commits: &[FencedCommit]) -> usize {
    commits.iter().filter(|c| c.fence.is_some()).count()
}

/// An object at quiescence.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectState {
    /// How the reconciles name it (name or uid).
    pub key: String,
    /// Its shard.
    pub shard: u32,
    /// Its latest generation.
    pub generation: u64,
}

/// One reconcile that ran.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reconcile {
    /// Who ran it (as the owners are named).
    pub member: String,
    /// The object's key.
    pub key: String,
    /// The generation it saw.
    pub generation: u64,
}

/// What [`check_reconciled`] found wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReconcileViolation {
    /// The object's shard has no owner in the final assignment.
    Unowned {
        /// The object.
        key: String,
        /// Its shard.
        shard: u32,
    },
    /// Its owner never reconciled its latest generation.
    Missed {
        /// The object.
        key: String,
        /// Its latest generation.
        generation: u64,
        /// The owner of its shard.
        owner: String,
        /// The highest generation the owner did reconcile, if any.
        owner_saw: Option<u64>,
    },
}

impl fmt::Display for ReconcileViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReconcileViolation::Unowned { key, shard } => {
                write!(f, "{key}: shard {shard} has no owner at quiescence")
            }
            ReconcileViolation::Missed {
                key,
                generation,
                owner,
                owner_saw,
            } => write!(
                f,
                "{key}: latest generation {generation} never reconciled by its owner {owner} \
                 (highest it reconciled: {owner_saw:?})"
            ),
        }
    }
}

/// Check that every object's latest generation was reconciled by the owner of its shard.
#[must_use]
pub fn check_reconciled(
    objects: &[ObjectState],
    owners: &BTreeMap<u32, String>,
    reconciles: &[Reconcile],
) -> Vec<ReconcileViolation> {
    let mut best: BTreeMap<(&str, &str), u64> = BTreeMap::new();
    for r in reconciles {
        let e = best.entry((&r.member, &r.key)).or_insert(r.generation);
        *e = (*e).max(r.generation);
    }
    let mut out = Vec::new();
    for o in objects {
        let Some(owner) = owners.get(&o.shard) else {
            out.push(ReconcileViolation::Unowned {
                key: o.key.clone(),
                shard: o.shard,
            });
            continue;
        };
        let saw = best.get(&(owner.as_str(), o.key.as_str())).copied();
        if saw.is_none_or(|g| g < o.generation) {
            out.push(ReconcileViolation::Missed {
                key: o.key.clone(),
                generation: o.generation,
                owner: owner.clone(),
                owner_saw: saw,
            });
        }
    }
    out
}

/// Panic with every violation of both checks, one per line.
///
/// # Panics
/// When [`check_epochs`] or [`check_reconciled`] finds a violation.
pub fn assert_quiescent(
    commits: &[FencedCommit],
    objects: &[ObjectState],
    owners: &BTreeMap<u32, String>,
    reconciles: &[Reconcile],
) {
    let mut lines: Vec<String> = check_epochs(commits)
        .iter()
        .map(ToString::to_string)
        .collect();
    lines.extend(
        check_reconciled(objects, owners, reconciles)
            .iter()
            .map(ToString::to_string),
    );
    assert!(
        lines.is_empty(),
        "quiescence oracle: {} violation(s):\n{}",
        lines.len(),
        lines.join("\n")
    );
}

#[cfg(test)]
mod tests;
