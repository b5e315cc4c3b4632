//! Objects on their way from the index to a reflecting consumer's store, held once.
//!
//! A watcher built with a store (`build_reflector`) applies every event to that store before it yields it,
//! on the consumer's side of the output channel. The index emits an `Apply` there by **moving** its own
//! copy into a slot here and queueing only the name ([`Out::Handed`](super::types::Out::Handed)); the
//! consumer takes the object out of the slot and applies it to the store while holding the slot's lock.
//! So at every moment the object is in exactly one of three places the index can read without waiting —
//! its own entry, a slot here, the store — and the index never keeps a second copy of an object the
//! consumer has not applied yet (that copy cost a clone and a drop per event).
//!
//! One slot per name (what the store keys by): a newer emission replaces the older one in place, which is
//! the output queue's coalescing, and a `Delete` of the name empties the slot first. Each emission is
//! numbered, and the consumer delivers a slot only for its own number: an earlier name of the same slot
//! still on its way (sent before a `Delete` that is also on its way) must not deliver the newer object
//! ahead of that `Delete`, which would then remove it from the store.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher::Event;
use kube::Resource;

use super::types::{parse_rv, RefKey, SharedKey, IDLE_CAPACITY};

/// The slots, shared by the manager's index and the consumer's event stream.
pub(crate) struct Handover<K> {
    /// Per name: the number of the emission and its object — boxed, as the index holds it, so that moving
    /// it in and out copies a pointer and a slot costs a pointer's width, not the object's inline size.
    slots: Mutex<HashMap<SharedKey, (u64, Box<K>)>>,
}

impl<K> Default for Handover<K> {
    fn default() -> Self {
        Handover {
            slots: Mutex::new(HashMap::new()),
        }
    }
}

impl<K: Resource + Clone> Handover<K> {
    fn slots(&self) -> MutexGuard<'_, HashMap<SharedKey, (u64, Box<K>)>> {
        // a panic elsewhere cannot leave a slot half-written: each operation is one map call
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Remove the slot of `key`; once every slot is empty, give back the capacity a burst left (a map
    /// keeps its largest size otherwise: thousands of slots after a cold start).
    fn remove(slots: &mut HashMap<SharedKey, (u64, Box<K>)>, key: &RefKey) -> Option<Box<K>> {
        let removed = slots.remove(key).map(|(_, o)| o);
        if slots.is_empty() && slots.capacity() > IDLE_CAPACITY {
            slots.shrink_to(IDLE_CAPACITY);
        }
        removed
    }

    /// Put `obj`, emission number `seq`, in the slot of `key`, replacing what it held (superseded before
    /// the consumer took it).
    pub(crate) fn put(&self, key: &SharedKey, seq: u64, obj: Box<K>) {
        let displaced = self.slots().insert(key.clone(), (seq, obj));
        drop(displaced);
    }

    /// Empty the slot of `key` (the consumer is to hold nothing under it, or another object).
    pub(crate) fn discard(&self, key: &RefKey) {
        let displaced = Self::remove(&mut self.slots(), key);
        drop(displaced);
    }

    /// Take back the object of `uid` at `rv` if the consumer has not taken it yet.
    pub(crate) fn take_back(&self, key: &RefKey, uid: &str, rv: Option<u64>) -> Option<Box<K>> {
        let mut slots = self.slots();
        if slots.get(key).is_some_and(|(_, o)| is(&**o, uid, rv)) {
            return Self::remove(&mut slots, key);
        }
        None
    }

    /// A copy of the object of `uid` at `rv` if the consumer has not taken it yet.
    pub(crate) fn copy_of(&self, key: &RefKey, uid: &str, rv: Option<u64>) -> Option<K> {
        self.slots()
            .get(key)
            .map(|(_, o)| &**o)
            .filter(|o| is(*o, uid, rv))
            .cloned()
    }

    /// The consumer's side: take the object of emission `seq` of `key`, apply it to `writer` and return
    /// its event — under the slot's lock, so the index finds it either here or in the store. `None`:
    /// taken back, replaced by a `Delete` or by a newer emission (whose own name follows).
    pub(crate) fn deliver(&self, key: &RefKey, seq: u64, writer: &mut Writer<K>) -> Option<Event<K>>
    where
        K::DynamicType: Clone + Eq + std::hash::Hash,
    {
        let mut slots = self.slots();
        if slots.get(key).is_none_or(|(s, _)| *s != seq) {
            return None;
        }
        let ev = Event::Apply(*Self::remove(&mut slots, key)?);
        writer.apply_watcher_event(&ev);
        drop(slots);
        Some(ev)
    }

    /// How many objects wait for the consumer.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.slots().len()
    }

    /// How many slots the map has room for.
    #[cfg(test)]
    pub(crate) fn capacity(&self) -> usize {
        self.slots().capacity()
    }
}

/// Whether `obj` is the object `uid` at `rv`.
pub(crate) fn is<K: Resource>(obj: &K, uid: &str, rv: Option<u64>) -> bool {
    obj.meta().uid.as_deref() == Some(uid) && parse_rv(obj.meta().resource_version.as_deref()) == rv
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;

    use super::*;

    fn object(i: usize) -> Box<ConfigMap> {
        Box::new(ConfigMap {
            metadata: ObjectMeta {
                name: Some(format!("cm-{i}")),
                namespace: Some("ns".into()),
                uid: Some(format!("uid-{i}")),
                resource_version: Some("1".into()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        })
    }

    fn key(i: usize) -> SharedKey {
        SharedKey::new((Some("ns".to_owned()), format!("cm-{i}")))
    }

    #[test]
    fn the_slots_give_back_a_bursts_room_once_every_object_is_delivered() {
        let handover = Handover::<ConfigMap>::default();
        let (_store, mut writer) = kube::runtime::reflector::store::<ConfigMap>();
        for i in 0..2000 {
            handover.put(&key(i), i as u64, object(i));
        }
        assert!(handover.capacity() >= 2000);
        // one taken back by the index, one emptied by a deletion, the rest delivered to the store
        assert!(handover.take_back(&key(0), "uid-0", Some(1)).is_some());
        handover.discard(&key(1));
        for i in 2..2000 {
            assert!(handover.deliver(&key(i), i as u64, &mut writer).is_some());
        }
        assert_eq!(handover.len(), 0);
        assert!(
            handover.capacity() <= 2 * IDLE_CAPACITY,
            "the map kept room for {} slots",
            handover.capacity()
        );
    }
}
