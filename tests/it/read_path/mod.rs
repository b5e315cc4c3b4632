//! The sharded read path: watchers, the activation barrier, re-enqueues, secondary caches.

mod dependent;
pub(crate) mod watcher;
