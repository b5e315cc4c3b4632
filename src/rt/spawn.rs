//! Where the library starts its background tasks: [`Spawner`].
//!
//! The group's Events, a sharded watcher's manager, its sub-watches and its barrier LISTs are tasks of
//! their own. By default they go to `tokio::spawn`. A simulator gives each member a spawner that wraps every
//! task it starts in a pausable future, so **pausing a member freezes every task it started**, not only
//! the futures it holds ([`ShardGroupBuilder::spawner`](crate::group::ShardGroupBuilder::spawner),
//! [`ShardedWatcher::spawner`](crate::ShardedWatcher::spawner)).

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use futures::future::BoxFuture;
use futures::FutureExt;

type SpawnFn = dyn Fn(BoxFuture<'static, ()>) + Send + Sync;

/// Starts a background task. Cheap to clone. The default is `tokio::spawn` (detached).
#[derive(Clone)]
pub struct Spawner(Arc<SpawnFn>);

impl fmt::Debug for Spawner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Spawner").finish_non_exhaustive()
    }
}

impl Default for Spawner {
    fn default() -> Self {
        Spawner::tokio()
    }
}

impl Spawner {
    /// `tokio::spawn`, detached.
    #[must_use]
    pub fn tokio() -> Self {
        Spawner(Arc::new(|f| {
            tokio::spawn(f);
        }))
    }

    /// Spawn through `f` (it must run the future to completion, or drop it to cancel the task).
    ///
    /// ```
    /// use std::sync::{Arc, atomic::{AtomicUsize, Ordering}};
    /// use kube_shard::rt::Spawner;
    /// let started = Arc::new(AtomicUsize::new(0));
    /// let n = started.clone();
    /// let spawner = Spawner::new(move |task| {
    ///     n.fetch_add(1, Ordering::SeqCst);
    ///     tokio::spawn(task); // a simulator would wrap `task` in its pause switch here
    /// });
    /// # let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    /// # rt.block_on(async {
    /// spawner.spawn(async {});
    /// # });
    /// assert_eq!(started.load(Ordering::SeqCst), 1);
    /// ```
    pub fn new(f: impl Fn(BoxFuture<'static, ()>) + Send + Sync + 'static) -> Self {
        Spawner(Arc::new(f))
    }

    /// Start `task`.
    pub fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        (self.0)(task.boxed());
    }
}
