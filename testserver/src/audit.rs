//! The fence audit: every committed write that carries a fence token, the highest epoch committed per
//! object uid, and every later commit with a lower epoch for that uid, whatever shard its token names.
//!
//! Epochs are generations of one assignment: they only grow, across every shard and across a change of
//! the shard count (a member of an `S = 32` group that takes an object over from an `S = 16` one writes
//! under a later generation). So a commit below the highest epoch already committed for its object was
//! made under an older assignment: two owners wrote the object.

use std::{collections::BTreeMap, sync::Mutex};

use kube_shard::token::FenceToken;

use crate::accounting::Verb;

/// Where a write carried its fence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FenceSource {
    /// The `x-kube-shard-fence` request header (it wins when both are present).
    Header,
    /// The `kube-shard.io/fence` annotation in the request body.
    Annotation,
}

/// One committed fenced write.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct FencedCommit {
    /// Who wrote.
    pub identity: String,
    /// The verb (create, update, patch, delete, deletecollection).
    pub verb: Verb,
    /// `plural` or `plural.group`.
    pub resource: String,
    /// Empty for cluster-scoped objects.
    pub namespace: String,
    /// The object's name.
    pub name: String,
    /// The object's uid.
    pub uid: String,
    /// The fence.
    pub token: FenceToken,
    /// Where it came from.
    pub source: FenceSource,
    /// The resourceVersion the write committed at.
    pub resource_version: u64,
}

/// A commit whose epoch is below one already committed for the same object (under any shard).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct FenceViolation {
    /// The offending commit.
    pub commit: FencedCommit,
    /// The highest epoch committed before it for that uid.
    pub highest_epoch: u64,
}

/// A write whose fence could not be parsed (the write itself is committed, as a real server would).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct FenceAuditError {
    /// Who wrote.
    pub identity: String,
    /// `plural` or `plural.group`.
    pub resource: String,
    /// Empty for cluster-scoped objects.
    pub namespace: String,
    /// The object's name.
    pub name: String,
    /// The raw header or annotation value (at most 256 characters).
    pub raw: String,
    /// Where it came from.
    pub source: FenceSource,
    /// Why it is malformed.
    pub error: String,
}

/// A snapshot of the fence audit.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct FenceAudit {
    /// Every fenced commit, in commit order.
    pub commits: Vec<FencedCommit>,
    /// Every lower-epoch commit, in commit order.
    pub violations: Vec<FenceViolation>,
    /// Malformed fences.
    pub errors: Vec<FenceAuditError>,
    /// The highest epoch committed per object uid.
    pub highest: BTreeMap<String, u64>,
}

impl FenceAudit {
    /// The number of lower-epoch commits.
    #[must_use]
    pub fn violation_count(&self) -> usize {
        self.violations.len()
    }

    /// The highest epoch committed for an object, under any shard.
    #[must_use]
    pub fn highest_epoch(&self, uid: &str) -> Option<u64> {
        self.highest.get(uid).copied()
    }
}

/// The raw fence of a write, before parsing.
#[derive(Debug, Clone)]
pub(crate) struct RawFence {
    pub(crate) raw: String,
    pub(crate) source: FenceSource,
}

/// What the write was.
#[derive(Debug)]
pub(crate) struct WriteFacts<'a> {
    pub(crate) identity: &'a str,
    pub(crate) verb: Verb,
    pub(crate) resource: String,
    pub(crate) namespace: &'a str,
    pub(crate) name: &'a str,
    pub(crate) uid: &'a str,
    pub(crate) rv: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Auditor {
    state: Mutex<FenceAudit>,
}

impl Auditor {
    /// Record a committed write. Called under the store lock, so commit order is RV order.
    pub(crate) fn record(&self, fence: &RawFence, w: &WriteFacts<'_>) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let token = match fence.raw.trim().parse::<FenceToken>() {
            Ok(t) => t,
            Err(e) => {
                st.errors.push(FenceAuditError {
                    identity: w.identity.to_string(),
                    resource: w.resource.clone(),
                    namespace: w.namespace.to_string(),
                    name: w.name.to_string(),
                    raw: fence.raw.chars().take(256).collect(),
                    source: fence.source,
                    error: e.to_string(),
                });
                return;
            }
        };
        let commit = FencedCommit {
            identity: w.identity.to_string(),
            verb: w.verb,
            resource: w.resource.clone(),
            namespace: w.namespace.to_string(),
            name: w.name.to_string(),
            uid: w.uid.to_string(),
            token,
            source: fence.source,
            resource_version: w.rv,
        };
        match st.highest.get(w.uid).copied() {
            Some(h) if token.epoch < h => {
                tracing::warn!(
                    uid = w.uid,
                    shard = token.shard,
                    epoch = token.epoch,
                    highest = h,
                    "fence audit: lower-epoch commit"
                );
                st.violations.push(FenceViolation {
                    commit: commit.clone(),
                    highest_epoch: h,
                });
            }
            _ => {
                st.highest.insert(w.uid.to_string(), token.epoch);
            }
        }
        st.commits.push(commit);
    }

    pub(crate) fn snapshot(&self) -> FenceAudit {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub(crate) fn violation_count(&self) -> usize {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .violations
            .len()
    }

    pub(crate) fn reset(&self) {
        *self.state.lock().unwrap_or_else(|e| e.into_inner()) = FenceAudit::default();
    }
}
