//! The manager's queue of output for the consumer, bounded by the objects rather than by the writes.
//!
//! The manager never waits for a consumer that pauses polling (that would stall handoffs behind a slow
//! reconciler); instead queued `Apply`/`Delete` events are **coalesced per object** (`(namespace, name)`,
//! what kube's store keys by): a newer event replaces the queued one in place, so a re-enqueue marker
//! queued after it still follows it.
//!
//! Pure: no I/O, no async. See `docs/read-path.md#memory-usage`.

use std::collections::{BTreeMap, VecDeque};

use kube::runtime::watcher::Event;
use kube::Resource;

use super::types::{release_idle, Out, RefKey};

/// A FIFO of [`Out`] items that coalesces queued `Apply`/`Delete` events of one name.
pub(crate) struct OutQueue<K: Resource> {
    items: VecDeque<Out<K>>,
    /// The absolute position of `items[0]`.
    base: u64,
    /// Where the queued `Apply`/`Delete` of a name sits (absolute position).
    slots: BTreeMap<RefKey, u64>,
}

impl<K: Resource> Default for OutQueue<K> {
    fn default() -> Self {
        OutQueue {
            items: VecDeque::new(),
            base: 0,
            slots: BTreeMap::new(),
        }
    }
}

fn coalescing_key<K: Resource>(item: &Out<K>) -> Option<RefKey> {
    match item {
        Out::Handed(key, _) => Some(RefKey::clone(key)),
        Out::Event(Event::Apply(o) | Event::Delete(o)) => {
            let meta = o.meta();
            Some((
                meta.namespace.clone(),
                meta.name.clone().unwrap_or_default(),
            ))
        }
        _ => None,
    }
}

impl<K: Resource> OutQueue<K> {
    /// Queue `item`; an `Apply`/`Delete` replaces a queued `Apply`/`Delete` of the same name.
    pub(crate) fn push(&mut self, item: Out<K>) {
        if let Some(key) = coalescing_key(&item) {
            if let Some(slot) = self
                .slots
                .get(&key)
                .and_then(|pos| pos.checked_sub(self.base))
                .and_then(|i| self.items.get_mut(usize::try_from(i).ok()?))
            {
                *slot = item;
                return;
            }
            self.slots.insert(key, self.base + self.items.len() as u64);
        }
        self.items.push_back(item);
    }

    /// The oldest item.
    pub(crate) fn pop(&mut self) -> Option<Out<K>> {
        let item = self.items.pop_front()?;
        release_idle(&mut self.items);
        let pos = self.base;
        self.base += 1;
        if let Some(key) = coalescing_key(&item) {
            if self.slots.get(&key) == Some(&pos) {
                self.slots.remove(&key);
            }
        }
        Some(item)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.items.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::watcher::types::IDLE_CAPACITY;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;
    use kube::runtime::reflector::ObjectRef;

    fn cm(name: &str, rv: u64) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                resource_version: Some(rv.to_string()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        }
    }

    fn show(item: &Out<ConfigMap>) -> String {
        let rv = |o: &ConfigMap| {
            format!(
                "{}@{}",
                o.metadata.name.clone().unwrap(),
                o.metadata.resource_version.clone().unwrap()
            )
        };
        match item {
            Out::Event(Event::Apply(o)) => format!("apply {}", rv(o)),
            Out::Event(Event::Delete(o)) => format!("delete {}", rv(o)),
            Out::Event(Event::InitApply(o)) => format!("initapply {}", rv(o)),
            Out::Event(Event::Init) => "init".into(),
            Out::Event(Event::InitDone) => "initdone".into(),
            Out::Handed(key, _) => format!("handed {}", key.1),
            Out::Reenqueue(refs) => format!("reenqueue {}", refs.len()),
            Out::Error(_) => "error".into(),
        }
    }

    fn drain(q: &mut OutQueue<ConfigMap>) -> Vec<String> {
        std::iter::from_fn(|| q.pop()).map(|i| show(&i)).collect()
    }

    /// Many writes of few objects while nobody polls queue one event per object.
    #[test]
    fn unpolled_queue_is_bounded_by_the_names() {
        let mut q = OutQueue::default();
        q.push(Out::Event(Event::Init));
        q.push(Out::Event(Event::InitApply(cm("a", 1))));
        q.push(Out::Event(Event::InitDone));
        for rv in 2..10_000 {
            q.push(Out::Event(Event::Apply(cm(&format!("o{}", rv % 10), rv))));
        }
        assert_eq!(q.len(), 3 + 10);
        let out = drain(&mut q);
        assert_eq!(out[..3], ["init", "initapply a@1", "initdone"]);
        assert!(out[3..].iter().all(|e| e.starts_with("apply o")));
        assert!(
            out.contains(&"apply o9@9999".to_owned()),
            "the newest version"
        );
    }

    #[test]
    fn a_marker_still_follows_the_replaced_event() {
        let mut q = OutQueue::default();
        q.push(Out::Event(Event::Apply(cm("a", 1))));
        q.push(Out::Reenqueue(vec![ObjectRef::new("a").within("ns")]));
        q.push(Out::Event(Event::Apply(cm("a", 2))));
        q.push(Out::Event(Event::Delete(cm("b", 3))));
        q.push(Out::Event(Event::Apply(cm("b", 4))));
        assert_eq!(
            drain(&mut q),
            ["apply a@2", "reenqueue 1", "apply b@4"],
            "replaced in place, before the marker"
        );
        // once taken, a name queues anew
        q.push(Out::Event(Event::Apply(cm("a", 5))));
        assert_eq!(q.pop().map(|i| show(&i)).as_deref(), Some("apply a@5"));
        q.push(Out::Event(Event::Delete(cm("a", 6))));
        assert_eq!(drain(&mut q), ["delete a@6"]);
        assert!(q.is_empty());
    }

    /// A cold start queues one event per object; once the consumer has taken them, the queue must not keep
    /// a slot per object (≈ 450 bytes each for a `DynamicObject`) for the rest of the process.
    #[test]
    fn a_drained_queue_gives_its_capacity_back() {
        let mut q = OutQueue::default();
        q.push(Out::Event(Event::Init));
        for i in 0..5_000 {
            q.push(Out::Event(Event::InitApply(cm(&format!("o{i}"), i))));
        }
        q.push(Out::Event(Event::InitDone));
        assert!(q.items.capacity() >= 5_002);
        assert_eq!(drain(&mut q).len(), 5_002);
        assert!(
            q.items.capacity() <= IDLE_CAPACITY,
            "{} slots kept",
            q.items.capacity()
        );
        // a trickle below the idle capacity does not reallocate
        let before = q.items.capacity();
        for rv in 0..10 {
            q.push(Out::Event(Event::Apply(cm("a", rv))));
            q.pop();
        }
        assert_eq!(q.items.capacity(), before);
    }
}
