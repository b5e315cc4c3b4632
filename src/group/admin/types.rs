//! What the reader and the editor share: the group they address, the edits, the errors.

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Api, Client};

use crate::rt::Clock;

/// A group addressed from outside it: its namespace and name, a client, and the clock its ages and
/// generations are read on (the system clock unless [`clock`](GroupRef::clock) says otherwise).
#[derive(Clone)]
pub struct GroupRef {
    pub(super) namespace: String,
    pub(super) group: String,
    pub(super) cms: Api<ConfigMap>,
    pub(super) leases: Api<Lease>,
    pub(super) clock: Clock,
}

impl std::fmt::Debug for GroupRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupRef")
            .field("namespace", &self.namespace)
            .field("group", &self.group)
            .finish_non_exhaustive()
    }
}

impl GroupRef {
    /// The group `group` in `namespace`.
    #[must_use]
    pub fn new(client: Client, namespace: &str, group: &str) -> Self {
        GroupRef {
            namespace: namespace.to_owned(),
            group: group.to_owned(),
            cms: Api::namespaced(client.clone(), namespace),
            leases: Api::namespaced(client, namespace),
            clock: Clock::system(),
        }
    }

    /// Read Lease ages and stamp generations on `clock`'s wall clock (simulators).
    #[must_use]
    pub fn clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    pub(super) fn assignment_name(&self) -> String {
        format!("{}-assignment", self.group)
    }

    /// The wall clock in ms, as Lease timestamps compare with it.
    pub(super) fn now_ms(&self) -> i64 {
        i64::try_from(self.clock.wall_ms()).unwrap_or(i64::MAX)
    }
}

/// A change to the assignment's intent fields. The coordinator acts on it at its next pass.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Edit {
    /// Pin `shard` to the member named `member` (`kshard pin`).
    Pin {
        /// The shard.
        shard: u32,
        /// The member's name.
        member: String,
    },
    /// Remove the pin of a shard (`kshard unpin`).
    Unpin(u32),
    /// Start no new moves (`kshard pause`); takeovers still happen.
    Pause,
    /// Plan again (`kshard resume`).
    Resume,
    /// Plan the member named so with quota 0 (`kshard drain`).
    Drain(String),
    /// Plan it normally again (`kshard undrain`).
    Undrain(String),
}

/// Why a group could not be read or edited.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdminError {
    /// No assignment ConfigMap: the group has never run there (or the name is wrong).
    #[error("no assignment ConfigMap {namespace}/{name}: is group {group:?} running there?")]
    NoAssignment {
        /// The namespace.
        namespace: String,
        /// The ConfigMap's name.
        name: String,
        /// The group.
        group: String,
    },
    /// The assignment ConfigMap cannot be decoded: nothing is written over it.
    #[error("{name}: {why}")]
    Undecodable {
        /// The ConfigMap's name.
        name: String,
        /// Why.
        why: String,
    },
    /// A pin names a shard the group does not have.
    #[error("shard {shard} is out of range: the group has {shards} shards")]
    ShardOutOfRange {
        /// The shard.
        shard: u32,
        /// `S`.
        shards: u32,
    },
    /// A member name that no member can have.
    #[error("a member name is 1 to 253 characters")]
    MemberName,
    /// The stored assignment is older than one a live member applied (a restored backup, a re-applied
    /// manifest): an edit over it would make members follow owners that have moved on.
    #[error("the stored assignment (generation {stored}) is older than generation {applied} that {lease} applied (a restored backup or a re-applied manifest): not edited; the coordinator writes a newer one over it — retry once `kshard status` shows a generation of at least {applied}")]
    RolledBack {
        /// The stored generation.
        stored: u64,
        /// The highest generation a live member applied.
        applied: u64,
        /// That member's Lease.
        lease: String,
    },
    /// Every attempt met a concurrent write.
    #[error("{name}: too many conflicting writes, try again")]
    Conflicts {
        /// The ConfigMap's name.
        name: String,
    },
    /// A request failed (the cause is printed, not chained).
    #[error("{what}: {error}")]
    Api {
        /// What was being done.
        what: String,
        /// The error.
        error: kube::Error,
    },
}
