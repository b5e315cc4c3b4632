//! Re-enqueues for a plain kube `Store`: admission-only use (kube's own watcher and `Controller`, the
//! reconcile wrapper in front) learns which objects became this member's to reconcile.

use std::collections::BTreeSet;

use kube::runtime::reflector::{ObjectRef, Store};
use kube::Resource;
use tokio::sync::mpsc::UnboundedSender;
use tracing::debug;

use crate::ownership::Ownership;

/// Until `tx`'s receiver is dropped: for every shard transition into "admitted" (activation, cancel-back,
/// un-fencing, a lifted hold), send an `ObjectRef` of each object in `store` that falls in that shard.
pub(super) async fn run<K>(ownership: Ownership, store: Store<K>, tx: UnboundedSender<ObjectRef<K>>)
where
    K: Resource + Clone + 'static,
    K::DynamicType: Clone + Default + Eq + std::hash::Hash,
{
    let mut transitions = ownership.transitions();
    while let Some(first) = transitions.next_transition().await {
        // a batch: every transition already queued, so one store scan serves a whole takeover
        let mut shards = BTreeSet::new();
        let mut next = Some(first);
        while let Some(t) = next {
            if t.is_reenqueue() {
                shards.insert(t.shard);
            }
            next = transitions.try_next_transition();
        }
        if shards.is_empty() || planted!(DROP_REENQUEUE) {
            continue;
        }
        let mut sent = 0usize;
        for obj in store.state() {
            if !matches!(ownership.shard_of(obj.as_ref()), Ok(s) if shards.contains(&s)) {
                continue;
            }
            if tx.send(ObjectRef::from_obj(obj.as_ref())).is_err() {
                return;
            }
            sent += 1;
        }
        debug!(
            shards = shards.len(),
            objects = sent,
            "re-enqueued the objects of admitted shards"
        );
        if tx.is_closed() {
            return;
        }
    }
}
