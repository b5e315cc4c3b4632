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
    conflicts: prometheus_client::metrics::counter::Counter,
}

impl FenceMetrics {
    /// Register `kube_shard_reconcile_fence_lost` (a fenced write found its fence invalid at send time),
    /// `kube_shard_reconcile_fence_refused` (the apiserver's fence policy refused a fenced write) and
    /// `kube_shard_reconcile_conflicts` (a precondition failed).
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
        registry.register(
            "kube_shard_reconcile_conflicts",
            "Reconciles requeued because a write's precondition failed (the object changed since it was read)",
            self.conflicts.clone(),
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

    /// Reconciles requeued because a precondition failed.
    #[must_use]
    pub fn conflicts(&self) -> u64 {
        self.conflicts.get()
    }
}

/// Why a reconcile's error is routine rather than a failure, found by walking the error's `source()` chain
/// (so it is found inside your own error enum, `kube::runtime::finalizer::Error`, a `Box`, or an
/// `anyhow::Error` through [`Routine::of_any`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Routine {
    /// A fence was invalid at send time, or a request outlived it: this member lost the shard.
    Fenced,
    /// The apiserver's fence policy refused a stale fence: this member lost the shard.
    Refused,
    /// A precondition failed (409 Conflict: the object changed or was re-created since it was read): its
    /// newer version triggers a reconcile of its own.
    Conflict,
}

impl Routine {
    /// The routine cause in `err` or its sources, if any (the outermost one found).
    #[must_use]
    pub fn of(err: &(dyn std::error::Error + 'static)) -> Option<Routine> {
        chain(err).find_map(Self::at)
    }

    /// [`Routine::of`] for an error that is not itself a `std::error::Error` but refers to one:
    /// `anyhow::Error`, `Box<dyn Error>`.
    #[must_use]
    pub fn of_any<E>(err: &E) -> Option<Routine>
    where
        E: AsRef<dyn std::error::Error + 'static> + ?Sized,
    {
        Self::of(err.as_ref())
    }

    /// Whether this member lost the shard ([`Fenced`](Self::Fenced) or [`Refused`](Self::Refused)).
    #[must_use]
    pub fn lost_shard(self) -> bool {
        matches!(self, Routine::Fenced | Routine::Refused)
    }

    fn at(e: &(dyn std::error::Error + 'static)) -> Option<Routine> {
        use super::fenced_write::Error as W;
        if let Some(w) = e.downcast_ref::<W>() {
            return match w {
                W::Fence(_) | W::Timeout(_) => Some(Routine::Fenced),
                W::Api(k) => Self::of_kube(k),
                _ => None,
            };
        }
        if e.downcast_ref::<super::FenceError>().is_some() {
            return Some(Routine::Fenced);
        }
        e.downcast_ref::<kube::Error>().and_then(Self::of_kube)
    }

    fn of_kube(e: &kube::Error) -> Option<Routine> {
        match e {
            kube::Error::Api(s) if super::fenced_write::is_refusal(s) => Some(Routine::Refused),
            kube::Error::Api(s) if super::fenced_write::is_precondition_conflict(s) => {
                Some(Routine::Conflict)
            }
            _ => None,
        }
    }
}

/// [`wrap`], and a reconcile whose error is [routine](Routine) is requeued after
/// [`Ownership::requeue_delay`] and counted in `metrics`, never returned as a reconcile error: a lost shard
/// (a fence invalid at send time, or a write the apiserver's fence policy refused: the shard's new owner,
/// or this member when the shard comes back, reconciles the object) or a failed precondition (the
/// object's newer version is on its way). The error is found anywhere in the `source()` chain: inside your
/// own error enum, `kube::runtime::finalizer::Error` or a `Box`.
///
/// ```no_run
/// use std::sync::Arc;
/// use futures::StreamExt;
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use kube::{api::{Patch, PatchParams}, runtime::{controller::{Action, Controller}, watcher}, Api, Client};
/// use kube_shard::{fenced_write, reconcile, FencedApi, Ownership, Permit};
///
/// async fn apply(cm: Arc<ConfigMap>, ctx: Arc<FencedApi<ConfigMap>>, permit: Permit) -> Result<Action, fenced_write::Error> {
///     let patch = Patch::Merge(serde_json::json!({"data": {"seen": "yes"}}));
///     // a lost shard or a conflict: requeued, not an error
///     ctx.patch(&permit, &cm, &PatchParams::default(), &patch).await?;
///     Ok(Action::await_change())
/// }
///
/// # async fn doc(client: Client, ownership: Ownership) {
/// let api = Api::<ConfigMap>::all(client);
/// let metrics = reconcile::FenceMetrics::default();
/// let controller = Controller::new(api.clone(), watcher::Config::default());
/// let gained = kube_shard::watcher::gained(ownership.clone(), controller.store());
/// controller
///     .reconcile_on(gained)
///     .run(
///         reconcile::wrap_fenced(ownership, metrics.clone(), apply),
///         |_, _, _| Action::requeue(std::time::Duration::from_secs(5)),
///         Arc::new(FencedApi::new(api)),
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
    E: std::error::Error + Send + 'static,
{
    let mut inner = wrap(ownership.clone(), reconcile);
    move |obj, ctx| {
        let fut = inner(obj, ctx);
        let ownership = ownership.clone();
        let metrics = metrics.clone();
        Box::pin(async move {
            let res = fut.await;
            match res.as_ref().err().map(|e| (Routine::of(e), e)) {
                Some((Some(routine), e)) => {
                    metrics.count(routine, e);
                    Ok(Action::requeue(ownership.requeue_delay()))
                }
                _ => res,
            }
        })
    }
}

impl FenceMetrics {
    fn count(&self, routine: Routine, e: &(dyn std::error::Error + 'static)) {
        match routine {
            Routine::Refused => {
                match failover_refusal(e) {
                    Some(m) => warn!(refusal = m, "the apiserver refused a write for its failover epoch: this cluster was deposed, or its HA pair runs below the epoch this object carries (see `kshard ha check`)"),
                    None => debug!(error = %e, "the apiserver refused a stale fence: shard lost, requeue"),
                }
                self.refused.inc();
            }
            Routine::Fenced => {
                debug!(error = %e, "fence invalid at send time: shard lost, requeue");
                self.lost.inc();
            }
            Routine::Conflict => {
                debug!(error = %e, "a precondition failed (the object changed since it was read): requeue");
                self.conflicts.inc();
            }
        }
    }
}

/// The failover refusal message anywhere in `e`'s chain.
fn failover_refusal<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a str> {
    chain(e)
        .filter_map(|e| e.downcast_ref::<super::fenced_write::Error>())
        .find_map(super::fenced_write::Error::failover_refusal)
}

/// `e` and its sources, outermost first.
fn chain<'a>(
    e: &'a (dyn std::error::Error + 'static),
) -> impl Iterator<Item = &'a (dyn std::error::Error + 'static)> {
    std::iter::successors(Some(e), |e| e.source())
}

#[cfg(test)]
mod tests {
    use super::Routine;
    use crate::ownership::{fenced_write, FenceError};
    use kube::core::Status;
    use kube::runtime::finalizer;

    /// A typical operator's error: its own enum, writes through `#[from]`, kube's finalizer boxed.
    #[derive(Debug, thiserror::Error)]
    enum UserError {
        #[error("write failed")]
        Write(#[from] fenced_write::Error),
        #[error("kube")]
        Kube(#[source] kube::Error),
        #[error("finalizer")]
        Finalizer(#[source] Box<finalizer::Error<UserError>>),
        #[error("illegal document")]
        Illegal,
    }

    fn lost() -> fenced_write::Error {
        fenced_write::Error::Fence(FenceError::NotHeld { shard: 3, epoch: 7 })
    }

    fn api(code: u16, reason: &str, message: &str) -> kube::Error {
        let mut s = Status::failure(message, reason);
        s.code = code;
        kube::Error::Api(Box::new(s))
    }

    #[test]
    fn a_lost_shard_is_found_through_the_users_enum_and_kubes_finalizer() {
        assert_eq!(Routine::of(&UserError::from(lost())), Some(Routine::Fenced));
        let nested = UserError::Finalizer(Box::new(finalizer::Error::ApplyFailed(
            UserError::from(lost()),
        )));
        assert_eq!(Routine::of(&nested), Some(Routine::Fenced));
        let cleanup =
            UserError::Finalizer(Box::new(finalizer::Error::CleanupFailed(UserError::Write(
                fenced_write::Error::Timeout(std::time::Duration::from_secs(1)),
            ))));
        assert_eq!(Routine::of(&cleanup), Some(Routine::Fenced));
        assert!(Routine::of(&nested).unwrap().lost_shard());
        // a bare FenceError (from `permit.fence()?`) counts too: one notion of "lost the shard"
        assert_eq!(
            Routine::of(&FenceError::SelfFenced { shard: 1 }),
            Some(Routine::Fenced)
        );
    }

    #[test]
    fn anyhow_and_boxed_errors_are_walked_too() {
        let any = anyhow::Error::new(lost()).context("reconciling doc-1");
        assert_eq!(Routine::of_any(&any), Some(Routine::Fenced));
        let boxed: Box<dyn std::error::Error> = Box::new(UserError::from(lost()));
        assert_eq!(Routine::of_any(&boxed), Some(Routine::Fenced));
        let unrelated = anyhow::anyhow!("disk full");
        assert_eq!(Routine::of_any(&unrelated), None);
    }

    #[test]
    fn only_precondition_conflicts_and_fence_refusals_are_routine() {
        let modified = api(
            409,
            "Conflict",
            "Operation cannot be fulfilled on documents \"d\": the object has been modified",
        );
        assert_eq!(
            Routine::of(&UserError::Kube(modified)),
            Some(Routine::Conflict)
        );
        let add_finalizer = UserError::Finalizer(Box::new(finalizer::Error::AddFinalizer(api(
            409,
            "Conflict",
            "Precondition failed: UID in precondition: a, UID in object meta: b",
        ))));
        assert_eq!(Routine::of(&add_finalizer), Some(Routine::Conflict));
        // a field-manager conflict of server-side apply and a taken name do not cure themselves
        let ssa = api(
            409,
            "Conflict",
            "Apply failed with 1 conflict: conflict with \"x\": .spec",
        );
        assert_eq!(Routine::of(&UserError::Kube(ssa)), None);
        let exists = api(409, "AlreadyExists", "configmaps \"c\" already exists");
        assert_eq!(Routine::of(&UserError::Kube(exists)), None);
        assert_eq!(Routine::of(&UserError::Illegal), None);
        let refused = api(
            422,
            "Invalid",
            &format!(
                "ValidatingAdmissionPolicy 'p' with binding 'b' denied request: {}",
                crate::fence_policy::messages::MARK
            ),
        );
        assert_eq!(
            Routine::of(&UserError::Write(fenced_write::Error::Api(refused))),
            Some(Routine::Refused)
        );
    }
}
