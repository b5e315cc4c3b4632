//! The member's registered readers: a shard is **warm** only when every registered read stream synced it,
//! and **activated** only when every one passed the activation barrier.
//!
//! Each sharded watcher registers when it starts and deregisters when it is dropped (RAII). When a reader
//! goes away, pending shards are re-evaluated: the remaining readers may all be done. With no reader
//! registered, nothing is reported here: the control plane decides what an unread shard needs.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, Weak};

use super::state::{Event, MoveId};

#[derive(Debug, Default)]
struct ReaderState {
    /// Shards this stream serves now: read, synced and not failing.
    serving: BTreeSet<u32>,
    warm: BTreeSet<(u32, MoveId)>,
    activated: BTreeSet<(u32, u64)>,
}

#[derive(Debug, Default)]
struct Inner {
    next: u64,
    readers: BTreeMap<u64, ReaderState>,
    /// What was already forwarded to the state machine (never twice).
    warm_sent: BTreeSet<(u32, MoveId)>,
    activated_sent: BTreeSet<(u32, u64)>,
}

/// The registry, shared by every handle of one member's [`Ownership`](super::Ownership).
#[derive(Debug, Default)]
pub(crate) struct Readers {
    inner: Mutex<Inner>,
}

/// Where a reader's reports go: the member's state machine.
type Apply = Arc<dyn Fn(Event) + Send + Sync>;

/// A registration; dropping it deregisters the reader.
pub(crate) struct ReaderGuard {
    id: u64,
    apply: Apply,
    readers: Weak<Readers>,
}

impl std::fmt::Debug for ReaderGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReaderGuard")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl Readers {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Register a reader whose reports `apply` hands to the member's state machine.
    pub(crate) fn register(
        self: &Arc<Self>,
        apply: impl Fn(Event) + Send + Sync + 'static,
    ) -> ReaderGuard {
        let mut inner = self.lock();
        inner.next += 1;
        let id = inner.next;
        inner.readers.insert(id, ReaderState::default());
        ReaderGuard {
            id,
            apply: Arc::new(apply),
            readers: Arc::downgrade(self),
        }
    }

    /// The shards every registered stream serves (`None` when no stream is registered).
    pub(crate) fn serving(&self) -> Option<BTreeSet<u32>> {
        let inner = self.lock();
        let mut readers = inner.readers.values();
        let first = readers.next()?.serving.clone();
        Some(readers.fold(first, |acc, r| {
            acc.intersection(&r.serving).copied().collect()
        }))
    }

    /// Whether no read stream is registered.
    pub(crate) fn is_empty(&self) -> bool {
        self.lock().readers.is_empty()
    }

    fn evaluate(&self) -> Vec<Event> {
        let mut inner = self.lock();
        let mut events = Vec::new();
        if inner.readers.is_empty() {
            return events;
        }
        let candidates: BTreeSet<(u32, MoveId)> = inner
            .readers
            .values()
            .flat_map(|r| r.warm.iter().copied())
            .collect();
        for c in candidates {
            if !inner.warm_sent.contains(&c) && inner.readers.values().all(|r| r.warm.contains(&c))
            {
                inner.warm_sent.insert(c);
                events.push(Event::Warm {
                    shard: c.0,
                    move_id: c.1,
                });
            }
        }
        let candidates: BTreeSet<(u32, u64)> = inner
            .readers
            .values()
            .flat_map(|r| r.activated.iter().copied())
            .collect();
        for c in candidates {
            if !inner.activated_sent.contains(&c)
                && inner.readers.values().all(|r| r.activated.contains(&c))
            {
                inner.activated_sent.insert(c);
                events.push(Event::Activated {
                    shard: c.0,
                    epoch: c.1,
                });
            }
        }
        events
    }
}

impl ReaderGuard {
    fn with(&self, f: impl FnOnce(&mut ReaderState)) {
        if let Some(readers) = self.readers.upgrade() {
            {
                let mut inner = readers.lock();
                if let Some(r) = inner.readers.get_mut(&self.id) {
                    f(r);
                }
            }
            for event in readers.evaluate() {
                (self.apply)(event);
            }
        }
    }

    /// This reader synced `shard` for move `move_id`.
    pub(crate) fn report_warm(&self, shard: u32, move_id: MoveId) {
        self.with(|r| {
            r.warm.insert((shard, move_id));
        });
    }

    /// This reader passed the activation barrier of `shard` at `epoch`.
    pub(crate) fn report_activated(&self, shard: u32, epoch: u64) {
        self.with(|r| {
            r.activated.insert((shard, epoch));
        });
    }

    /// Publish the shards this stream serves now.
    pub(crate) fn set_serving(&self, serving: BTreeSet<u32>) {
        if let Some(readers) = self.readers.upgrade() {
            if let Some(r) = readers.lock().readers.get_mut(&self.id) {
                r.serving = serving;
            }
        }
    }

    /// Forget reports for shards no longer Incoming/Activating (keeps the sets small).
    pub(crate) fn retain(&self, keep: impl Fn(u32) -> bool) {
        if let Some(readers) = self.readers.upgrade() {
            let mut inner = readers.lock();
            if let Some(r) = inner.readers.get_mut(&self.id) {
                r.warm.retain(|(s, _)| keep(*s));
                r.activated.retain(|(s, _)| keep(*s));
            }
            inner.warm_sent.retain(|(s, _)| keep(*s));
            inner.activated_sent.retain(|(s, _)| keep(*s));
        }
    }
}

impl Drop for ReaderGuard {
    fn drop(&mut self) {
        if let Some(readers) = self.readers.upgrade() {
            readers.lock().readers.remove(&self.id);
            for event in readers.evaluate() {
                (self.apply)(event);
            }
        }
    }
}
