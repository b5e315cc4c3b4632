//! The fence audit: every committed write that carries a fence token (`<failover-epoch>:<shard>/<epoch>`,
//! `<failover-epoch>:mirror`, or a legacy `<shard>/<epoch>` read as failover epoch 0: [`kube_shard::token`]),
//! the highest token committed per object uid, and every later commit *behind* it for that uid, whatever
//! shard its token names ([`FenceToken::is_behind`]):
//!
//! - a **lower failover epoch**: a deposed Active (or the mirror of an old term) wrote after a newer term's
//!   write;
//! - an equal failover epoch and a **lower shard epoch** (mirror tokens have none): shard epochs are
//!   generations of one assignment, they only grow, across every shard and across a change of the shard
//!   count (a member of an `S = 32` group that takes an object over from an `S = 16` one writes under a later
//!   generation). So such a commit was made under an older assignment: two owners wrote the object.
//!
//! A failover epoch is never compared with a shard epoch.

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

/// A commit behind the highest token already committed for the same object (under any shard): a lower
/// failover epoch, or an equal one and a lower shard epoch.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct FenceViolation {
    /// The offending commit.
    pub commit: FencedCommit,
    /// The highest token committed before it for that uid.
    pub highest: FenceToken,
}

impl FenceViolation {
    /// The highest shard epoch committed before it (`None`: only mirror tokens at that failover epoch).
    #[must_use]
    pub fn highest_epoch(&self) -> Option<u64> {
        self.highest.shard_epoch()
    }
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
    /// Every commit behind its object's highest token, in commit order.
    pub violations: Vec<FenceViolation>,
    /// Malformed fences.
    pub errors: Vec<FenceAuditError>,
    /// The highest token committed per object uid.
    pub highest: BTreeMap<String, FenceToken>,
}

impl FenceAudit {
    /// The number of commits behind their object's highest token.
    #[must_use]
    pub fn violation_count(&self) -> usize {
        self.violations.len()
    }

    /// The highest shard epoch committed for an object under its highest failover epoch, under any shard
    /// (`None`: none, or only mirror tokens there).
    #[must_use]
    pub fn highest_epoch(&self, uid: &str) -> Option<u64> {
        self.highest.get(uid).and_then(FenceToken::shard_epoch)
    }

    /// The highest token committed for an object.
    #[must_use]
    pub fn highest_token(&self, uid: &str) -> Option<FenceToken> {
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
        let highest = st.highest.get(w.uid).copied();
        match highest {
            Some(h) if token.is_behind(&h) => {
                tracing::warn!(
                    uid = w.uid,
                    token = %token,
                    highest = %h,
                    "fence audit: commit behind the object's highest fence"
                );
                st.violations.push(FenceViolation {
                    commit: commit.clone(),
                    highest: h,
                });
            }
            _ => {
                st.highest
                    .insert(w.uid.to_string(), token.raise(highest.as_ref()));
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
