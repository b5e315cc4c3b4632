//! The read path's shared leaf types: what a stream emits ([`Out`]), an object's key ([`RefKey`]), a
//! parsed resourceVersion, the stream's [`StreamRole`], and the idle-queue capacity rule.

use std::collections::VecDeque;

use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::Resource;

/// Whether a stream reads primaries (projects Owned and Outgoing shards, emits re-enqueues) or secondaries
/// (also projects Incoming and Activating shards, so children are in the store before their parent's
/// activation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StreamRole {
    /// The resource the controller reconciles.
    Primary,
    /// A resource the controller reads (children, references).
    Secondary,
}

/// What the manager hands to the consumer side, in order.
pub(crate) enum Out<K: Resource> {
    Event(watcher::Event<K>),
    /// Apply the object of this emission (numbered) waiting in the consumer's handover slot of this name,
    /// if it still waits there (a watcher with a store: see `handover.rs`).
    Handed(SharedKey, u64),
    /// Re-enqueue these: their shard became admitted and the events before this marker hold them.
    Reenqueue(Vec<ObjectRef<K>>),
    /// An informational, rate-limited error item.
    Error(watcher::Error),
}

/// `(namespace, name)`: what kube's store keys by (within one resource type).
pub(crate) type RefKey = (Option<String>, String);

/// A [`RefKey`] held once per object and shared by the index's maps and the output.
pub(crate) type SharedKey = std::sync::Arc<RefKey>;

/// A parsed resourceVersion. Kubernetes calls them opaque, but kube-apiserver's are etcd revisions; a
/// non-numeric one is treated as "unknown" and never wins a comparison against a known one.
pub(crate) fn parse_rv(rv: Option<&str>) -> Option<u64> {
    rv.and_then(|s| s.parse().ok())
}

/// Slots a drained queue keeps. A cold start queues one event per object at once (a `DynamicObject`'s
/// event is about 450 bytes inline), and a `VecDeque` keeps its capacity when it drains: left alone, the
/// index's output, this queue and the handover list would hold ≈ 1.5 KiB per object held for good, 40 %
/// on top of the objects themselves (`docs/performance.md`, `read`).
pub(crate) const IDLE_CAPACITY: usize = 64;

/// Give back what a drained queue holds beyond [`IDLE_CAPACITY`] slots (a no-op while it has items, or
/// when it never grew past that: a steady trickle of events does not reallocate).
pub(crate) fn release_idle<T>(queue: &mut VecDeque<T>) {
    if queue.is_empty() && queue.capacity() > IDLE_CAPACITY {
        queue.shrink_to(IDLE_CAPACITY);
    }
}
