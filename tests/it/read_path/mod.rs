//! The sharded read path: watchers, the activation barrier, re-enqueues, secondary caches.

mod dependent;
mod entry_points;
pub(crate) mod watcher;
