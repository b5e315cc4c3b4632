//! The pre-wired controller: kube-runtime's `Controller` over the shards this member owns, with everything
//! sharding needs already wired — the sharded reflector, the re-enqueue of gained, un-fenced and un-held
//! objects (`reconcile_on`), admission and fences around the reconciler, the group's task supervised, and a
//! graceful leave before the controller stops.
//!
//! ```no_run
//! use std::sync::Arc;
//! use futures::StreamExt;
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube::{api::{Patch, PatchParams}, runtime::{controller::Action, watcher}, Api};
//! use kube_shard::{Controller, Current, FencedApi, ShardGroup};
//!
//! async fn reconcile(cm: Arc<ConfigMap>, api: Arc<FencedApi<ConfigMap>>)
//!     -> Result<Action, kube_shard::fenced_write::Error> {
//!     // server-side apply, fenced by this reconcile's permit, conditional on the uid and
//!     // resourceVersion `cm` was read at
//!     let seen = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "data": {"seen": "yes"}});
//!     api.patch(&Current, &cm, &PatchParams::apply("my-operator"), &Patch::Apply(seen)).await?;
//!     Ok(Action::await_change())
//! }
//!
//! # async fn doc(client: kube::Client) -> Result<(), Box<dyn std::error::Error>> {
//! let group = ShardGroup::builder(client.clone(), "configmaps", "operators").build()?;
//! let api = Api::<ConfigMap>::all(client);
//! Controller::new(api.clone(), watcher::Config::default(), group)
//!     .shutdown_on_signal() // SIGTERM: leave the group first, then stop
//!     .run(reconcile, |_, _, _| Action::requeue(std::time::Duration::from_secs(5)), Arc::new(FencedApi::new(api)))
//!     .for_each(|res| async move {
//!         if let Err(e) = res { tracing::warn!("reconcile failed: {e}") }
//!     })
//!     .await;
//! # Ok(()) }
//! ```
//!
//! See `docs/porting.md` for a whole operator ported, line by line.

mod run;
mod shutdown;

use std::fmt::{self, Debug};
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;

use futures::future::BoxFuture;
use futures::{FutureExt, Stream};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{self, Action};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;

pub use run::{RunError, Supervised};

use crate::group::{GroupError, GroupHandle, ShardGroup};
use crate::ownership::{reconcile, Ownership, Permit};
use crate::watcher::{Dependency, DependentError, ShardedWatcher};

/// kube-runtime's [`Controller`](kube::runtime::Controller) for the objects of the shards this member owns.
/// Its builder methods take `self` by value like kube's and forward to it; [`run`](Self::run) wraps the
/// reconciler in admission and fences.
#[must_use = "a controller does nothing until it runs"]
pub struct Controller<K>
where
    K: Resource + Clone + Debug + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    inner: kube::runtime::Controller<K>,
    handle: GroupHandle,
    task: BoxFuture<'static, Result<(), GroupError>>,
    triggers: Vec<BoxFuture<'static, ()>>,
    signals: bool,
    setup: Option<DependentError>,
}

impl<K> Debug for Controller<K>
where
    K: Resource + Clone + Debug + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Controller")
            .field("member", &self.handle.ownership().member())
            .field("signals", &self.signals)
            .finish_non_exhaustive()
    }
}

impl<K> Controller<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Default + Debug + Unpin + Send + Sync,
{
    /// Join `group` and read the objects of `api` in the shards it gives this member (every
    /// `watcher::Config` field honoured). The group's task starts when [`run`](Self::run) is polled, after
    /// every stream of this builder exists (a shard is warm only when all of them synced it).
    pub fn new(api: Api<K>, config: watcher::Config, group: ShardGroup) -> Self {
        let (handle, task) = group.start();
        #[cfg(feature = "test-util")]
        crate::testing::fence_log::install_from_env(&handle.ownership());
        let sharded = ShardedWatcher::new(api, config, handle.ownership())
            .metrics(&handle.read_path_metrics())
            .build_reflector();
        let inner =
            kube::runtime::Controller::for_stream(sharded.events.applied_objects(), sharded.store)
                .reconcile_on(sharded.reenqueue);
        Controller {
            inner,
            handle,
            task: task.boxed(),
            triggers: Vec::new(),
            signals: false,
            setup: None,
        }
    }

    /// The member's handle: status, health, metrics, leadership, [`leave`](GroupHandle::leave).
    #[must_use]
    pub fn handle(&self) -> GroupHandle {
        self.handle.clone()
    }

    /// The member's ownership (for [`crate::FencedApi`] writes outside the reconciler, `admit_key`, ...).
    #[must_use]
    pub fn ownership(&self) -> Ownership {
        self.handle.ownership()
    }

    /// The controller's store: the objects of the shards this member serves.
    #[must_use]
    pub fn store(&self) -> Store<K> {
        self.inner.store()
    }

    /// Children of `Child` owned by `K` (their controller ownerReference), read sharded with their parents
    /// (metadata only), like kube's `owns`: a child's change reconciles its parent.
    pub fn owns<Child>(self, api: Api<Child>, config: watcher::Config) -> Self
    where
        Child:
            Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    {
        self.owns_by(api, config, Dependency::controller_owner())
    }

    /// Children of `Child` placed by `dependency` (a [`crate::watcher::DependencyMap`] mapper, the shard
    /// label), metadata only. A strategy the group cannot use ends [`run`](Self::run) with
    /// [`RunError::Setup`].
    pub fn owns_by<Child>(
        mut self,
        api: Api<Child>,
        config: watcher::Config,
        dependency: Dependency<PartialObjectMeta<Child>>,
    ) -> Self
    where
        Child:
            Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    {
        let read = ShardedWatcher::metadata(api, config, self.handle.ownership())
            .metrics(&self.handle.read_path_metrics());
        match read.dependent(dependency) {
            Ok(w) => {
                let children = w.build();
                self.inner = self.inner.owns_stream(children.events.touched_objects());
            }
            Err(e) => self.setup = Some(e),
        }
        self
    }

    /// kube's `owns_stream`: a stream you built (e.g. [`crate::dependent_watcher`]'s events).
    pub fn owns_stream<Child: Resource<DynamicType = ()> + Send + 'static>(
        mut self,
        trigger: impl Stream<Item = Result<Child, watcher::Error>> + Send + 'static,
    ) -> Self {
        self.inner = self.inner.owns_stream(trigger);
        self
    }

    /// kube's `watches_stream`: objects related to `K` by `mapper`.
    pub fn watches_stream<Other, I>(
        mut self,
        trigger: impl Stream<Item = Result<Other, watcher::Error>> + Send + 'static,
        mapper: impl Fn(Other) -> I + Sync + Send + 'static,
    ) -> Self
    where
        Other: Clone + Resource + DeserializeOwned + Debug + Send + 'static,
        Other::DynamicType: Default + Debug + Clone,
        I: 'static + IntoIterator<Item = ObjectRef<K>>,
        I::IntoIter: Send,
    {
        self.inner = self.inner.watches_stream(trigger, mapper);
        self
    }

    /// kube's `reconcile_on`: more objects to reconcile (the member's own re-enqueues are wired already).
    pub fn reconcile_on(
        mut self,
        trigger: impl Stream<Item = ObjectRef<K>> + Send + 'static,
    ) -> Self {
        self.inner = self.inner.reconcile_on(trigger);
        self
    }

    /// kube's `reconcile_all_on`.
    pub fn reconcile_all_on(mut self, trigger: impl Stream<Item = ()> + Send + 'static) -> Self {
        self.inner = self.inner.reconcile_all_on(trigger);
        self
    }

    /// kube's `with_config` (concurrency, debounce).
    pub fn with_config(mut self, config: controller::Config) -> Self {
        self.inner = self.inner.with_config(config);
        self
    }

    /// Shut down when `trigger` completes: **leave the group first** (the member keeps reconciling until
    /// each of its shards has moved to another member), then stop the controller gracefully. Additive, like
    /// kube's: the first trigger to complete starts it.
    pub fn graceful_shutdown_on(
        mut self,
        trigger: impl Future<Output = ()> + Send + 'static,
    ) -> Self {
        self.triggers.push(trigger.boxed());
        self
    }

    /// Shut down on SIGTERM or Ctrl+C: leave the group first, then stop gracefully. A second signal stops
    /// without waiting for the leave to finish (the other members then take the rest over after a lease).
    pub fn shutdown_on_signal(mut self) -> Self {
        self.signals = true;
        self
    }

    /// Start: the group's task, and the controller with `reconciler` — kube's signature — run only for
    /// objects this member admits, inside the admission's permit: [`FencedApi`](crate::FencedApi) writes
    /// fenced by [`Current`](crate::Current) take their fence from it (or pass a permit yourself:
    /// [`run_with_permit`](Self::run_with_permit)). A reconcile error that is
    /// [routine](reconcile::Routine) — a lost shard, a failed precondition — is requeued and counted, never
    /// handed to `error_policy`.
    ///
    /// The stream yields kube's results; it ends after a shutdown, or with [`RunError::Group`] when the
    /// group's task fails (RBAC, a lost Lease that cannot be re-joined): the member can no longer prove it
    /// owns anything, so the controller stops too. Poll it to the end (`for_each`) and exit non-zero on
    /// that error, so the pod restarts. Dropping the stream stops the member like a killed process.
    pub fn run<F, Fut, E, Ctx>(
        self,
        mut reconciler: F,
        error_policy: impl Fn(Arc<K>, &E, Arc<Ctx>) -> Action + Send + Sync + 'static,
        context: Arc<Ctx>,
    ) -> Supervised<K, E>
    where
        F: FnMut(Arc<K>, Arc<Ctx>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<Action, E>> + Send + 'static,
        E: std::error::Error + Send + Sync + 'static,
        Ctx: Send + Sync + 'static,
    {
        self.run_with_permit(
            move |obj, ctx, permit: Permit| permit.scope(reconciler(obj, ctx)),
            error_policy,
            context,
        )
    }

    /// [`run`](Self::run) with the [`Permit`] as the reconciler's third argument.
    pub fn run_with_permit<F, Fut, E, Ctx>(
        self,
        reconciler: F,
        error_policy: impl Fn(Arc<K>, &E, Arc<Ctx>) -> Action + Send + Sync + 'static,
        context: Arc<Ctx>,
    ) -> Supervised<K, E>
    where
        F: FnMut(Arc<K>, Arc<Ctx>, Permit) -> Fut + Send + 'static,
        Fut: Future<Output = Result<Action, E>> + Send + 'static,
        E: std::error::Error + Send + Sync + 'static,
        Ctx: Send + Sync + 'static,
    {
        if let Some(e) = self.setup {
            return Supervised::failed(RunError::Setup(e));
        }
        let ownership = self.handle.ownership();
        let metrics = self.handle.fence_metrics();
        let (group, done) = run::spawn_group(self.task);
        let stop = shutdown::spawn(self.triggers, self.signals, self.handle, done);
        let stream = self.inner.graceful_shutdown_on(stop).run(
            reconcile::wrap_fenced(ownership, metrics, reconciler),
            error_policy,
            context,
        );
        Supervised::new(stream, group)
    }
}
