//! The permit of the reconcile in progress: [`Controller::run`](crate::Controller::run) admits each object
//! and runs the reconciler inside the permit's scope (a tokio task-local), so the reconciler keeps kube's
//! signature and a fenced write takes its fence from [`Current`].

use std::future::Future;

use super::{Fence, FenceError, Permit};

tokio::task_local! {
    static PERMIT: Permit;
}

/// The permit of the reconcile in progress, as a source of fences for [`crate::FencedApi`] writes:
/// `fenced.patch_status(&Current, obj, &params, &patch)`. Valid inside a reconciler run by
/// [`Controller::run`](crate::Controller::run) (or inside [`Permit::scope`]); anywhere else — a task the
/// reconciler spawned, code outside a reconcile — a write fails with
/// [`fenced_write::Error::NoPermit`](super::fenced_write::Error::NoPermit), never unfenced.
#[derive(Debug, Clone, Copy, Default)]
pub struct Current;

impl Current {
    /// A fence from the permit in scope, now.
    ///
    /// # Errors
    /// `None` when no permit is in scope; the fence's own error when the shard was lost.
    pub fn fence() -> Option<Result<Fence, FenceError>> {
        match PERMIT.try_with(Permit::fence) {
            Ok(fence) => Some(fence),
            Err(_) => test_permit().map(|p| p.fence()),
        }
    }

    /// The shard and epoch of the permit in scope.
    #[must_use]
    pub fn shard_epoch() -> Option<(u32, u64)> {
        PERMIT.try_with(|p| (p.shard(), p.epoch())).ok()
    }
}

impl Permit {
    /// Run `fut` with this permit in scope: [`Current`] fences its writes. The permit is held until `fut`
    /// ends (a drain of its shard waits for it).
    pub fn scope<F: Future>(self, fut: F) -> impl Future<Output = F::Output> {
        PERMIT.scope(self, fut)
    }
}

#[cfg(any(test, feature = "test-util"))]
thread_local! {
    static TEST_PERMITS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// For unit tests that call a reconciler directly (`kube_shard::testing`): from now on, on this thread, [`Current`]
/// outside a reconcile's scope fences with a permit that never expires ([`Permit::for_test`]'s). Use a
/// current-thread runtime (`#[tokio::test]`'s default) so the reconciler runs on this thread.
#[cfg(any(test, feature = "test-util"))]
#[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
pub fn admit_all_on_this_thread() {
    TEST_PERMITS.with(|t| t.set(true));
}

#[cfg(any(test, feature = "test-util"))]
fn test_permit() -> Option<Permit> {
    if !TEST_PERMITS.with(std::cell::Cell::get) {
        return None;
    }
    let everything = super::Ownership::new_static(super::OwnershipConfig::default(), 0, 1)
        .expect("one static member of one is a valid static configuration");
    everything.admit_shard(0).ok()
}

#[cfg(not(any(test, feature = "test-util")))]
fn test_permit() -> Option<Permit> {
    None
}

#[cfg(test)]
mod tests {
    use super::{admit_all_on_this_thread, Current};
    use crate::ownership::{Ownership, OwnershipConfig};

    #[tokio::test]
    async fn the_permit_is_in_scope_only_inside_its_future() {
        assert!(Current::fence().is_none(), "no permit outside a reconcile");
        let own = Ownership::new_static(OwnershipConfig::default(), 0, 1).unwrap();
        let permit = own.admit_shard(7).unwrap();
        let inside = permit
            .scope(async { (Current::shard_epoch(), Current::fence().map(|f| f.is_ok())) })
            .await;
        assert_eq!(inside, (Some((7, 0)), Some(true)));
        // a task spawned from a reconcile does not inherit it: its writes fail, never go unfenced
        let permit = own.admit_shard(7).unwrap();
        let spawned = permit
            .scope(async { tokio::spawn(async { Current::fence().is_none() }).await })
            .await
            .unwrap();
        assert!(spawned);
    }

    #[test]
    fn a_thread_that_admits_all_fences_outside_a_scope() {
        std::thread::spawn(|| {
            assert!(Current::fence().is_none());
            admit_all_on_this_thread();
            assert!(matches!(Current::fence(), Some(Ok(_))));
        })
        .join()
        .unwrap();
    }
}

#[cfg(test)]
mod for_test {
    use crate::ownership::Permit;
    use k8s_openapi::api::core::v1::ConfigMap;

    #[test]
    fn test_permits_and_fences_need_only_a_uid() {
        let mut cm = ConfigMap::default();
        assert!(Permit::for_test(&cm).is_err(), "no uid: no shard");
        cm.metadata.uid = Some("u1".into());
        let permit = Permit::for_test(&cm).unwrap();
        assert_eq!(permit.epoch(), 0);
        let fence = crate::ownership::Fence::for_test(&cm).unwrap();
        assert_eq!(fence.shard(), permit.shard());
        assert!(fence.check().is_ok());
    }
}
