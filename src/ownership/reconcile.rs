//! The reconcile wrapper for `Controller::run`: the user's reconciler runs only for objects this member
//! admits, with the [`Permit`] as its third argument (take a fence from it right before each side effect).
//!
//! An object another member owns, or one held back for the whole member (self-fenced, shadow mode, a live
//! legacy leader), gets [`Action::await_change`]; [`Ownership::transitions`] re-enqueues it when that
//! changes. An object of a shard this member holds but may not admit yet gets [`Action::requeue`] after
//! [`OwnershipConfig::not_admitted_requeue`]. Admission is checked inside the reconcile, not at trigger time.
//!
//! See `docs/protocol.md#the-reconcile-wrapper`.
//!
//! [`OwnershipConfig::not_admitted_requeue`]: super::OwnershipConfig::not_admitted_requeue

use std::{future::Future, sync::Arc};

use futures::future::{self, Either, Ready};
use kube::{runtime::controller::Action, Resource};
use tracing::{debug, warn};

use super::{AdmitError, Ownership, Permit};

/// The future [`wrap`] returns: the user's reconcile, or an immediate [`Action`] when not admitted.
pub type Wrapped<Fut, E> = Either<Ready<Result<Action, E>>, Fut>;

/// Wrap `reconcile(obj, ctx, permit)` into a reconciler for `Controller::run`.
///
/// ```no_run
/// use std::sync::Arc;
/// use futures::StreamExt;
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use kube::{runtime::{controller::{Action, Controller}, watcher}, Api, Client};
/// use kube_shard::ownership::{reconcile, Ownership, Permit};
///
/// #[derive(Debug, thiserror::Error)]
/// #[error("reconcile failed")]
/// struct Error;
///
/// async fn apply(cm: Arc<ConfigMap>, _ctx: Arc<()>, permit: Permit) -> Result<Action, Error> {
///     let _fence = permit.fence().map_err(|_| Error)?;
///     // ... fenced writes ...
///     Ok(Action::await_change())
/// }
///
/// # async fn doc(client: Client, ownership: Ownership) {
/// let api: Api<ConfigMap> = Api::all(client);
/// Controller::new(api, watcher::Config::default())
///     .run(
///         reconcile::wrap(ownership, apply),
///         |_, _, _| Action::requeue(std::time::Duration::from_secs(5)),
///         Arc::new(()),
///     )
///     .for_each(|_| async {})
///     .await;
/// # }
/// ```
pub fn wrap<K, Ctx, F, Fut, E>(
    ownership: Ownership,
    reconcile: F,
) -> impl FnMut(Arc<K>, Arc<Ctx>) -> Wrapped<Fut, E>
where
    K: Resource,
    F: FnMut(Arc<K>, Arc<Ctx>, Permit) -> Fut,
    Fut: Future<Output = Result<Action, E>>,
{
    let mut reconcile = reconcile;
    move |obj, ctx| match admit(&ownership, obj.as_ref()) {
        Ok(permit) => Either::Right(reconcile(obj, ctx, permit)),
        Err(action) => Either::Left(future::ready(Ok(action))),
    }
}

/// The admission decision the wrapper makes, for callers that write their own wrapper: a permit, or the
/// [`Action`] to return without reconciling.
pub fn admit<K: Resource>(ownership: &Ownership, obj: &K) -> Result<Permit, Action> {
    match ownership.admit(obj) {
        Ok(permit) => Ok(permit),
        Err(e @ AdmitError::NotAdmitted { .. }) => {
            debug!(error = %e, "held but not admitted: requeue");
            Err(Action::requeue(ownership.requeue_delay()))
        }
        Err(e @ (AdmitError::SelfFenced { .. } | AdmitError::Held { .. })) => {
            debug!(error = %e, "member held back: the shard is re-enqueued when it is admitted again");
            Err(Action::await_change())
        }
        Err(AdmitError::NotOwned { shard }) => {
            debug!(shard, "not owned: left to its owner");
            Err(Action::await_change())
        }
        Err(e) => {
            warn!(error = %e, "object cannot be placed in a shard: not reconciled");
            Err(Action::await_change())
        }
    }
}

/// What [`wrap_fenced`] counts: reconciles that ended because this member had lost the shard.
#[derive(Debug, Clone, Default)]
pub struct FenceMetrics {
    lost: prometheus_client::metrics::counter::Counter,
    refused: prometheus_client::metrics::counter::Counter,
}

impl FenceMetrics {
    /// Register `kube_shard_reconcile_fence_lost` (a fenced write found its fence invalid at send time) and
    /// `kube_shard_reconcile_fence_refused` (the apiserver's fence policy refused a fenced write).
    pub fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        registry.register(
            "kube_shard_reconcile_fence_lost",
            "Reconciles requeued because a fenced write found its fence invalid at send time",
            self.lost.clone(),
        );
        registry.register(
            "kube_shard_reconcile_fence_refused",
            "Reconciles requeued because the apiserver's fence policy refused a fenced write",
            self.refused.clone(),
        );
    }

    /// Reconciles requeued because a fence was invalid at send time.
    #[must_use]
    pub fn lost(&self) -> u64 {
        self.lost.get()
    }

    /// Reconciles requeued because the apiserver refused a stale fence.
    #[must_use]
    pub fn refused(&self) -> u64 {
        self.refused.get()
    }
}

/// A reconcile error that may carry a [`fenced_write::Error`](super::fenced_write::Error), so [`wrap_fenced`]
/// can tell a lost shard from a failure.
pub trait FencedWriteFailure {
    /// The fenced-write error inside, if any.
    fn fenced_write_error(&self) -> Option<&super::fenced_write::Error>;
}

impl FencedWriteFailure for super::fenced_write::Error {
    fn fenced_write_error(&self) -> Option<&super::fenced_write::Error> {
        Some(self)
    }
}

/// [`wrap`], and a reconcile that failed because this member lost the shard — a fence invalid at send time
/// ([`is_fenced`]) or a write the apiserver's fence policy refused ([`is_fence_refused`]) — is requeued after
/// [`Ownership::requeue_delay`] and counted in `metrics`, never returned as a reconcile error (the shard's new
/// owner, or this member when the shard comes back, reconciles the object).
///
/// [`is_fenced`]: super::fenced_write::Error::is_fenced
/// [`is_fence_refused`]: super::fenced_write::Error::is_fence_refused
///
/// ```no_run
/// use std::sync::Arc;
/// use futures::StreamExt;
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use kube::{runtime::{controller::{Action, Controller}, watcher}, Api, Client};
/// use kube_shard::ownership::{fenced_write, reconcile, Ownership, Permit};
///
/// async fn apply(cm: Arc<ConfigMap>, _ctx: Arc<()>, permit: Permit) -> Result<Action, fenced_write::Error> {
///     let _fence = permit.fence().map_err(fenced_write::Error::Fence)?;
///     // ... fenced writes, `?` on their errors ...
///     Ok(Action::await_change())
/// }
///
/// # async fn doc(client: Client, ownership: Ownership) {
/// let metrics = reconcile::FenceMetrics::default();
/// Controller::new(Api::<ConfigMap>::all(client), watcher::Config::default())
///     .run(
///         reconcile::wrap_fenced(ownership, metrics.clone(), apply),
///         |_, _, _| Action::requeue(std::time::Duration::from_secs(5)),
///         Arc::new(()),
///     )
///     .for_each(|_| async {})
///     .await;
/// # }
/// ```
pub fn wrap_fenced<K, Ctx, F, Fut, E>(
    ownership: Ownership,
    metrics: FenceMetrics,
    reconcile: F,
) -> impl FnMut(Arc<K>, Arc<Ctx>) -> futures::future::BoxFuture<'static, Result<Action, E>>
where
    K: Resource,
    F: FnMut(Arc<K>, Arc<Ctx>, Permit) -> Fut,
    Fut: Future<Output = Result<Action, E>> + Send + 'static,
    E: FencedWriteFailure + Send + 'static,
{
    let mut inner = wrap(ownership.clone(), reconcile);
    move |obj, ctx| {
        let fut = inner(obj, ctx);
        let ownership = ownership.clone();
        let metrics = metrics.clone();
        Box::pin(async move {
            let res = fut.await;
            match res
                .as_ref()
                .err()
                .and_then(FencedWriteFailure::fenced_write_error)
            {
                Some(e) if e.is_fence_refused() => {
                    match e.failover_refusal() {
                        Some(m) => warn!(refusal = m, "the apiserver refused a write for its failover epoch: this cluster was deposed, or its HA pair runs below the epoch this object carries (see `kshard ha check`)"),
                        None => debug!(error = %e, "the apiserver refused a stale fence: shard lost, requeue"),
                    }
                    metrics.refused.inc();
                    Ok(Action::requeue(ownership.requeue_delay()))
                }
                Some(e) if e.is_fenced() => {
                    debug!(error = %e, "fence invalid at send time: shard lost, requeue");
                    metrics.lost.inc();
                    Ok(Action::requeue(ownership.requeue_delay()))
                }
                _ => res,
            }
        })
    }
}
