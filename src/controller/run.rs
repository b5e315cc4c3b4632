//! The running controller: kube's result stream, ended with the group task's failure.

use std::fmt::{self, Debug};
use std::future::Future as _;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use kube::runtime::controller::{self, Action};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::Resource;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{error, info};

use crate::group::GroupError;
use crate::watcher::DependentError;

/// Why [`Controller::run`](super::Controller::run)'s stream yields an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError<E: std::error::Error + 'static> {
    /// kube's controller error (a reconcile failed, an object is missing from the store, ...).
    #[error(transparent)]
    Controller(#[from] controller::Error<E, watcher::Error>),
    /// The shard group's task failed: the member no longer proves ownership of anything, and the
    /// controller stopped. Exit non-zero so the pod restarts.
    #[error("the shard group failed; the controller stopped")]
    Group(#[source] GroupError),
    /// The shard group's task panicked; the controller stopped.
    #[error("the shard group's task panicked: {0}")]
    GroupPanicked(String),
    /// A builder method was given what the group cannot use (the controller never started).
    #[error("the controller cannot start")]
    Setup(#[source] DependentError),
}

type Item<K, E> = Result<(ObjectRef<K>, Action), RunError<E>>;

/// What kube's controller stream yields.
type KubeItem<K, E> = Result<(ObjectRef<K>, Action), controller::Error<E, watcher::Error>>;

/// The stream [`Controller::run`](super::Controller::run) returns: kube's results, then the end — or one
/// [`RunError::Group`] and the end when the group's task fails.
#[must_use = "streams do nothing unless polled"]
pub struct Supervised<K: Resource, E: std::error::Error + 'static> {
    inner: Option<BoxStream<'static, KubeItem<K, E>>>,
    group: Option<JoinHandle<Result<(), GroupError>>>,
    pending: Option<RunError<E>>,
}

impl<K: Resource, E: std::error::Error + 'static> Debug for Supervised<K, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Supervised")
            .field("running", &self.inner.is_some())
            .field("group", &self.group.is_some())
            .finish()
    }
}

impl<K, E> Supervised<K, E>
where
    K: Resource + 'static,
    E: std::error::Error + 'static,
{
    pub(super) fn new(
        inner: impl Stream<Item = KubeItem<K, E>> + Send + 'static,
        group: JoinHandle<Result<(), GroupError>>,
    ) -> Self {
        Supervised {
            inner: Some(inner.boxed()),
            group: Some(group),
            pending: None,
        }
    }

    pub(super) fn failed(e: RunError<E>) -> Self {
        Supervised {
            inner: None,
            group: None,
            pending: Some(e),
        }
    }

    /// The group task's end, when it failed: what the stream yields before it ends.
    fn poll_group(&mut self, cx: &mut Context<'_>) -> Option<RunError<E>> {
        let group = self.group.as_mut()?;
        let Poll::Ready(res) = Pin::new(group).poll(cx) else {
            return None;
        };
        self.group = None;
        let err = match res {
            Ok(Ok(())) => {
                info!("left the shard group");
                return None;
            }
            Ok(Err(e)) => RunError::Group(e),
            Err(join) => RunError::GroupPanicked(join.to_string()),
        };
        error!(error = %err, cause = ?std::error::Error::source(&err).map(ToString::to_string), "stopping the controller");
        self.inner = None;
        Some(err)
    }
}

impl<K, E> Stream for Supervised<K, E>
where
    K: Resource + 'static,
    E: std::error::Error + 'static,
{
    type Item = Item<K, E>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if let Some(e) = this.pending.take() {
            return Poll::Ready(Some(Err(e)));
        }
        if let Some(e) = this.poll_group(cx) {
            return Poll::Ready(Some(Err(e)));
        }
        match this.inner.as_mut() {
            Some(s) => s
                .poll_next_unpin(cx)
                .map(|o| o.map(|r| r.map_err(RunError::Controller))),
            None => Poll::Ready(None),
        }
    }
}

impl<K: Resource, E: std::error::Error + 'static> Unpin for Supervised<K, E> {}

/// Dropping the stream stops the member like a killed process: the group's task is aborted (a member that
/// renews but no longer reconciles would hold its shards for nothing); the others take them over after a
/// lease. Shut down gracefully instead through a shutdown trigger.
impl<K: Resource, E: std::error::Error + 'static> Drop for Supervised<K, E> {
    fn drop(&mut self) {
        if let Some(group) = self.group.take() {
            group.abort();
        }
    }
}

/// Spawn the group's task; the receiver turns `true` when it ends (however it ends).
pub(super) fn spawn_group(
    task: BoxFuture<'static, Result<(), GroupError>>,
) -> (JoinHandle<Result<(), GroupError>>, watch::Receiver<bool>) {
    let (done_tx, done_rx) = watch::channel(false);
    let handle = tokio::spawn(async move {
        // a guard, so a panicking task still reports its end
        let _done = DoneOnDrop(done_tx);
        task.await
    });
    (handle, done_rx)
}

struct DoneOnDrop(watch::Sender<bool>);

impl Drop for DoneOnDrop {
    fn drop(&mut self) {
        self.0.send_replace(true);
    }
}
