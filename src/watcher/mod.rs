//! The read path: a drop-in for `kube_runtime::watcher` that reads only the shards a member serves.
//!
//! [`watcher()`] returns events with the item type of `kube_runtime::watcher` (they never end) **and** the
//! re-enqueue stream for `Controller::reconcile_on`; [`reflector()`] also owns the store; [`ShardedWatcher`]
//! is the builder behind both; [`gained`] re-enqueues for a plain kube `Store` (admission only). No entry
//! point returns events without re-enqueues: a consumer that drops them loses work. How it reads and hands off: `docs/read-path.md`.
//!
//! # Events
//! One `Init … InitDone` for the first sync, then `Apply`/`Delete` as shards are activated and released.
//!
//! # Secondaries
//! [`dependent_watcher`], [`dependent_reflector`]: children placed by a [`Dependency`] (`docs/secondary-caches.md`).
//!
//! # Memory Usage
//! With [`reflector`] each projected object is held once; with [`watcher`] the index keeps its own copy.

mod dependent;
mod depkey;
mod gained;
mod handover;
mod index;
mod manager;
mod metrics;
mod mode;
mod outq;
mod pace;
mod plan;
mod request;
mod stats;
mod subwatch;
mod types;

use std::fmt::{self, Debug};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{store::Writer, ObjectRef, Store};
use kube::runtime::watcher as kube_watcher;
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;

pub use dependent::{owner_shard, Dependency, DependencyMap, DependentError};
pub use depkey::{shard_of_parent, stamp_shard_label, LABEL_MAX_SHARDS, SHARD_LABEL};
use handover::Handover;
use manager::{Manager, Settings};
pub use metrics::ReadPathMetrics;
pub use mode::ReadMode;
use pace::Pace;
use stats::Stats;
pub use stats::WatcherStats;
use types::Out;
pub use types::StreamRole;

use crate::ownership::Ownership;

/// A sharded watcher of `K`: [`Sharded::events`] has the item type of `kube_runtime::watcher` (so
/// `WatchStreamExt` works), and [`Sharded::reenqueue`] carries what an event stream cannot — the objects
/// of shards that became admitted (after a takeover, an un-fencing, a lifted hold), for
/// `Controller::reconcile_on`. Most operators want [`crate::Controller`], which wires both.
///
/// ```no_run
/// use futures::TryStreamExt;
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use kube::{runtime::{watcher, WatchStreamExt}, Api, Client};
/// # async fn run(client: Client, ownership: kube_shard::Ownership) -> Result<(), watcher::Error> {
/// let api: Api<ConfigMap> = Api::all(client);
/// let sharded = kube_shard::watcher(api, watcher::Config::default(), ownership);
/// let mut applied = std::pin::pin!(sharded.events.applied_objects());
/// # let _ = sharded.reenqueue; // give it to `Controller::reconcile_on`
/// while let Some(cm) = applied.try_next().await? {
///     println!("owned: {:?}", cm.metadata.name);
/// }
/// # Ok(())
/// # }
/// ```
pub fn watcher<K>(api: Api<K>, config: kube_watcher::Config, ownership: Ownership) -> Sharded<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Clone + Default + Send + Sync + Eq + std::hash::Hash,
{
    ShardedWatcher::new(api, config, ownership).build()
}

/// A sharded metadata-only watcher (`PartialObjectMetadata`), like `kube_runtime::metadata_watcher`, with
/// its re-enqueue stream (see [`watcher()`]).
pub fn metadata_watcher<K>(
    api: Api<K>,
    config: kube_watcher::Config,
    ownership: Ownership,
) -> Sharded<PartialObjectMeta<K>>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Clone + Default + Send + Sync + Eq + std::hash::Hash,
{
    ShardedWatcher::metadata(api, config, ownership).build()
}

/// A sharded watcher that owns its store: the event stream applies each event to the store before
/// yielding it (do not `.reflect()` it again). Give the re-enqueues to `Controller::reconcile_on`.
///
/// ```no_run
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use kube::{runtime::{watcher, Controller, WatchStreamExt}, Api, Client};
/// # async fn run(client: Client, ownership: kube_shard::Ownership) {
/// let api: Api<ConfigMap> = Api::all(client);
/// let r = kube_shard::reflector(api, watcher::Config::default(), ownership);
/// let controller = Controller::for_stream(r.events.applied_objects(), r.store)
///     .reconcile_on(r.reenqueue);
/// # }
/// ```
pub fn reflector<K>(
    api: Api<K>,
    config: kube_watcher::Config,
    ownership: Ownership,
) -> ShardedReflector<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Clone + Default + Send + Sync + Eq + std::hash::Hash,
{
    ShardedWatcher::new(api, config, ownership).build_reflector()
}

/// Re-enqueues for **admission-only** use, where kube's own watcher fills a plain `Store` and the reconcile
/// wrapper ([`crate::reconcile::wrap`]) decides: the `ObjectRef` of every object in `store` whose shard
/// became admitted (a shard taken over from a dead member, an un-fencing, a lifted hold), for
/// `Controller::reconcile_on`. Without it such objects, answered `await_change` while another member owned
/// them or while held, wait until they change. Paced like [`ReenqueueStream`]; call it inside a tokio
/// runtime (it spawns the task that scans the store, which ends when the stream is dropped).
///
/// ```no_run
/// use std::sync::Arc;
/// use futures::StreamExt;
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use kube::{runtime::{controller::{Action, Controller}, watcher}, Api, Client};
/// use kube_shard::{reconcile, Ownership, Permit};
///
/// async fn apply(cm: Arc<ConfigMap>, _ctx: Arc<()>, permit: Permit) -> Result<Action, kube_shard::fenced_write::Error> {
///     Ok(Action::await_change())
/// }
///
/// # async fn doc(client: Client, ownership: Ownership) {
/// let controller = Controller::new(Api::<ConfigMap>::all(client), watcher::Config::default());
/// let gained = kube_shard::watcher::gained(ownership.clone(), controller.store());
/// controller
///     .reconcile_on(gained)
///     .run(reconcile::wrap(ownership, apply), |_, _, _| Action::requeue(std::time::Duration::from_secs(5)), Arc::new(()))
///     .for_each(|_| async {})
///     .await;
/// # }
/// ```
pub fn gained<K>(ownership: Ownership, store: Store<K>) -> ReenqueueStream<K>
where
    K: Resource + Clone + Send + Sync + 'static,
    K::DynamicType: Clone + Default + Send + Sync + Eq + std::hash::Hash,
{
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(gained::run(ownership, store, tx));
    ReenqueueStream {
        rx,
        pace: Pace::new(),
    }
}

/// A sharded **secondary** watcher of metadata only (`PartialObjectMeta`, the default for children whose
/// bodies the reconciler does not need), placed by `dependency`; for `Controller::owns_stream` /
/// `watches_stream` (or [`crate::Controller::owns`], which builds it). Full objects:
/// `ShardedWatcher::new(..).dependent(..)`. A secondary re-enqueues nothing itself (its parents' watcher
/// does); its [`Sharded::reenqueue`] stays empty.
///
/// ```no_run
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use kube::{runtime::{watcher, Controller, WatchStreamExt}, Api, Client};
/// use kube_shard::watcher::Dependency;
/// # async fn run(client: Client, ownership: kube_shard::Ownership) -> Result<(), kube_shard::watcher::DependentError> {
/// let parents = kube_shard::reflector(
///     Api::<ConfigMap>::all(client.clone()), watcher::Config::default(), ownership.clone());
/// let children = kube_shard::dependent_watcher(
///     Api::<ConfigMap>::all(client), watcher::Config::default(), ownership, Dependency::controller_owner())?;
/// let controller = Controller::for_stream(parents.events.applied_objects(), parents.store)
///     .reconcile_on(parents.reenqueue)
///     .owns_stream(children.events.touched_objects());
/// # Ok(())
/// # }
/// ```
///
/// # Errors
/// A strategy the group cannot use (see [`DependentError`]).
pub fn dependent_watcher<K>(
    api: Api<K>,
    config: kube_watcher::Config,
    ownership: Ownership,
    dependency: Dependency<PartialObjectMeta<K>>,
) -> Result<Sharded<PartialObjectMeta<K>>, DependentError>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Clone + Default + Send + Sync + Eq + std::hash::Hash,
{
    Ok(ShardedWatcher::metadata(api, config, ownership)
        .dependent(dependency)?
        .build())
}

/// [`dependent_watcher`] that owns its store (metadata only).
///
/// # Errors
/// A strategy the group cannot use (see [`DependentError`]).
pub fn dependent_reflector<K>(
    api: Api<K>,
    config: kube_watcher::Config,
    ownership: Ownership,
    dependency: Dependency<PartialObjectMeta<K>>,
) -> Result<ShardedReflector<PartialObjectMeta<K>>, DependentError>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Clone + Default + Send + Sync + Eq + std::hash::Hash,
{
    Ok(ShardedWatcher::metadata(api, config, ownership)
        .dependent(dependency)?
        .build_reflector())
}

/// The builder behind [`watcher`] and [`reflector`].
#[must_use]
pub struct ShardedWatcher<K: Resource> {
    api_url: String,
    client: kube::Client,
    config: kube_watcher::Config,
    ownership: Ownership,
    metadata: bool,
    settings: Settings<K>,
    metrics: Option<ReadPathMetrics>,
}

impl<K: Resource> Debug for ShardedWatcher<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShardedWatcher")
            .field("url", &self.api_url)
            .field("metadata", &self.metadata)
            .field("name", &self.settings.name)
            .finish_non_exhaustive()
    }
}

/// What [`ShardedWatcher::build`] and [`watcher()`] return: the event stream and the re-enqueue stream,
/// which belong together — pass the events to the reflector or controller and **the re-enqueues to
/// `Controller::reconcile_on`**, or objects of gained, un-fenced or un-held shards that were held back
/// (`await_change`) are never reconciled until they change.
#[non_exhaustive]
pub struct Sharded<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Clone + Eq + std::hash::Hash,
{
    /// The event stream (never ends while its manager runs).
    pub events: EventStream<K>,
    /// `ObjectRef`s to pass to `Controller::reconcile_on`: the objects of shards that became admitted.
    pub reenqueue: ReenqueueStream<K>,
    /// Live counters.
    pub stats: WatcherStats,
}

/// What [`ShardedWatcher::build_reflector`] and [`reflector()`] return: [`Sharded`] and the store the event
/// stream writes to (the controller's store: `Controller::for_stream(events.applied_objects(), store)
/// .reconcile_on(reenqueue)`, which [`crate::Controller`] does for you).
#[non_exhaustive]
pub struct ShardedReflector<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Clone + Eq + std::hash::Hash,
{
    /// The store: each event is applied to it before the event stream yields it.
    pub store: Store<K>,
    /// The event stream (never ends while its manager runs).
    pub events: EventStream<K>,
    /// `ObjectRef`s to pass to `Controller::reconcile_on`: the objects of shards that became admitted.
    pub reenqueue: ReenqueueStream<K>,
    /// Live counters.
    pub stats: WatcherStats,
}

impl<K> Debug for Sharded<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Clone + Eq + std::hash::Hash,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sharded")
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl<K> Debug for ShardedReflector<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Clone + Eq + std::hash::Hash,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShardedReflector")
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl<K> ShardedWatcher<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Clone + Default + Send + Sync + Eq + std::hash::Hash,
{
    /// A sharded watcher of `api`'s collection, with every `watcher::Config` field honoured.
    pub fn new(api: Api<K>, config: kube_watcher::Config, ownership: Ownership) -> Self {
        Self::new_with(api, config, ownership, K::DynamicType::default())
    }
}

impl<K> ShardedWatcher<PartialObjectMeta<K>>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Clone + Default + Send + Sync + Eq + std::hash::Hash,
{
    /// A sharded metadata-only watcher of `api`'s collection.
    pub fn metadata(api: Api<K>, config: kube_watcher::Config, ownership: Ownership) -> Self {
        let url = api.resource_url().to_owned();
        let url_for_name = url.clone();
        let client = api.into_client();
        ShardedWatcher {
            api_url: url,
            client,
            config,
            ownership,
            metadata: true,
            settings: Settings {
                name: format!("{url_for_name}#metadata"),
                ..Settings::defaults(K::DynamicType::default())
            },
            metrics: None,
        }
    }
}

impl<K: Resource> Settings<K> {
    fn defaults(dyntype: K::DynamicType) -> Self {
        Settings {
            role: StreamRole::Primary,
            max_subwatches: 4,
            barrier_timeout: Duration::from_secs(2),
            probe_interval: Duration::from_secs(60),
            probe_max: Duration::from_secs(30 * 60),
            error_interval: Duration::from_secs(10),
            transform: None,
            dyntype,
            name: String::new(),
            placement: None,
            local_only: false,
            shard_label: false,
            feeds: None,
            depends: None,
            depends_changed: None,
            dep_observer: None,
            spawner: crate::rt::Spawner::tokio(),
        }
    }
}

impl<K> ShardedWatcher<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Clone + Send + Sync + Eq + std::hash::Hash,
{
    /// A sharded watcher of a dynamically typed resource (`DynamicObject` and its `ApiResource`).
    pub fn new_with(
        api: Api<K>,
        config: kube_watcher::Config,
        ownership: Ownership,
        dyntype: K::DynamicType,
    ) -> Self {
        let url = api.resource_url().to_owned();
        let client = api.into_client();
        let name = url.clone();
        let mut settings = Settings::defaults(dyntype);
        settings.name = name;
        ShardedWatcher {
            api_url: url,
            client,
            config,
            ownership,
            metadata: false,
            settings,
            metrics: None,
        }
    }

    /// Apply `f` to every object before it is indexed (for example, drop `managedFields`).
    pub fn transform(mut self, f: impl Fn(&mut K) + Send + Sync + 'static) -> Self {
        self.settings.transform = Some(Arc::new(f));
        self
    }

    /// At most this many sub-watches in server mode, merging synced ones above it (default 4).
    pub fn max_subwatches(mut self, n: usize) -> Self {
        self.settings.max_subwatches = n.max(1);
        self
    }

    /// How long the activation barrier waits for an event or bookmark before a targeted LIST (default 2 s).
    pub fn barrier_timeout(mut self, d: Duration) -> Self {
        self.settings.barrier_timeout = d;
        self
    }

    /// The first re-probe of server filtering after a fallback (default 60 s, doubling per flip, ≤ 30 min).
    pub fn probe_interval(mut self, d: Duration) -> Self {
        self.settings.probe_interval = d;
        self
    }

    /// Where this watcher starts its tasks (its manager, sub-watches and barrier LISTs); default
    /// `tokio::spawn`. A simulator passes the member's pausable spawner, so pausing the member freezes them.
    pub fn spawner(mut self, spawner: crate::rt::Spawner) -> Self {
        self.settings.spawner = spawner;
        self
    }

    /// Primary (default) or secondary.
    pub fn role(mut self, role: StreamRole) -> Self {
        self.settings.role = role;
        self
    }

    /// A **secondary** watcher placed by `dependency` (children by their owner, referenced objects by their
    /// referrers, the shard label): [`StreamRole::Secondary`], and read with the server filter, the shard label
    /// selector or a full watch filtered locally, as the strategy allows. See [`Dependency`].
    ///
    /// # Errors
    /// A strategy the group cannot use (see [`DependentError`]).
    pub fn dependent(mut self, dependency: Dependency<K>) -> Result<Self, DependentError> {
        let d = dependency.settings(self.ownership.config())?;
        self.settings.role = StreamRole::Secondary;
        self.settings.placement = d.placement;
        self.settings.local_only = d.local_only;
        self.settings.shard_label = d.shard_label;
        self.settings.depends = d.depends;
        self.settings.depends_changed = d.changed;
        self.settings.dep_observer = d.observer;
        Ok(self)
    }

    /// Feed `map` from this (primary) watcher's index: every primary it reads, Incoming shards included,
    /// and its warm and activation reports. Secondary watchers placed through `map` follow it.
    pub fn feeds(mut self, map: &DependencyMap<K>) -> Self {
        self.settings.feeds = Some(map.observer());
        self
    }

    /// Report this watcher's counters through `metrics`.
    pub fn metrics(mut self, metrics: &ReadPathMetrics) -> Self {
        self.metrics = Some(metrics.clone());
        self
    }

    /// A name for logs and metrics (default: the collection URL).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.settings.name = name.into();
        self
    }

    fn start(self, writer: Option<Writer<K>>) -> Sharded<K> {
        let stats = Arc::new(Stats {
            name: self.settings.name.clone(),
            ..Stats::default()
        });
        let stats_handle = WatcherStats(stats.clone());
        if let Some(metrics) = &self.metrics {
            metrics.track(&stats_handle);
        }
        let (tx, rx) = mpsc::channel(256);
        let handover = writer.as_ref().map(|_| Arc::new(Handover::default()));
        let mut requests = request::Requests::new(&self.api_url, self.config, self.metadata);
        if self.settings.shard_label {
            requests = requests.with_shard_label(self.ownership.config().shards);
        }
        let manager = Manager::new(
            self.client,
            requests,
            self.ownership,
            self.settings,
            stats.clone(),
            tx,
            writer.as_ref().map(|w| w.as_reader()).zip(handover.clone()),
        );
        let (re_tx, re_rx) = mpsc::unbounded_channel();
        Sharded {
            events: EventStream {
                manager: Some(Box::new(manager)),
                rx,
                writer: writer.map(Box::new),
                handover,
                reenqueue: re_tx,
            },
            reenqueue: ReenqueueStream {
                rx: re_rx,
                pace: Pace::new(),
            },
            stats: stats_handle,
        }
    }

    /// Build the streams. The manager task starts on the first poll of the event stream (inside a tokio
    /// runtime) and stops when the event stream is dropped.
    pub fn build(self) -> Sharded<K> {
        self.start(None)
    }

    /// Build the streams with a store: each event is applied to the store before it is yielded.
    pub fn build_reflector(self) -> ShardedReflector<K> {
        let writer = Writer::new(self.settings.dyntype.clone());
        let store = writer.as_reader();
        let Sharded {
            events,
            reenqueue,
            stats,
        } = self.start(Some(writer));
        ShardedReflector {
            store,
            events,
            reenqueue,
            stats,
        }
    }
}

/// The event stream of a sharded watcher.
#[must_use = "streams do nothing unless polled"]
pub struct EventStream<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Clone + Eq + std::hash::Hash,
{
    manager: Option<Box<Manager<K>>>,
    rx: mpsc::Receiver<Out<K>>,
    writer: Option<Box<Writer<K>>>,
    /// Where the manager leaves the objects of `Out::Handed` (with `writer`).
    handover: Option<Arc<Handover<K>>>,
    reenqueue: mpsc::UnboundedSender<ObjectRef<K>>,
}

impl<K> Debug for EventStream<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Clone + Eq + std::hash::Hash,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventStream").finish_non_exhaustive()
    }
}

impl<K> Stream for EventStream<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Clone + Send + Sync + Eq + std::hash::Hash,
{
    type Item = kube_watcher::Result<kube_watcher::Event<K>>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if let Some(manager) = this.manager.take() {
            let spawner = manager.spawner();
            spawner.spawn(manager.run());
        }
        loop {
            match this.rx.poll_recv(cx) {
                Poll::Ready(Some(Out::Event(ev))) => {
                    if let Some(w) = this.writer.as_mut() {
                        w.apply_watcher_event(&ev);
                    }
                    return Poll::Ready(Some(Ok(ev)));
                }
                Poll::Ready(Some(Out::Handed(key, seq))) => {
                    // applied to the store under the slot's lock, then yielded; nothing waits when the
                    // manager took it back or replaced it by a `Delete` meanwhile
                    let (Some(h), Some(w)) = (this.handover.as_ref(), this.writer.as_mut()) else {
                        continue;
                    };
                    if let Some(ev) = h.deliver(&key, seq, w) {
                        return Poll::Ready(Some(Ok(ev)));
                    }
                }
                Poll::Ready(Some(Out::Reenqueue(refs))) => {
                    // every event before this marker was yielded (and reflected): the store holds them
                    if planted!(DROP_REENQUEUE) {
                        continue;
                    }
                    for r in refs {
                        let _ = this.reenqueue.send(r);
                    }
                }
                Poll::Ready(Some(Out::Error(err))) => return Poll::Ready(Some(Err(err))),
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

/// `ObjectRef`s of shards that became admitted, for `Controller::reconcile_on`. Paced: bursts of up to
/// 1000, then about 1000 per second with ±20 % jitter, so a takeover of many shards does not arrive as one
/// thundering herd. Ends when the event stream is dropped.
#[must_use = "streams do nothing unless polled"]
pub struct ReenqueueStream<K: Resource> {
    rx: mpsc::UnboundedReceiver<ObjectRef<K>>,
    pace: Pace,
}

impl<K: Resource> Debug for ReenqueueStream<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReenqueueStream").finish_non_exhaustive()
    }
}

impl<K: Resource> Stream for ReenqueueStream<K> {
    type Item = ObjectRef<K>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.pace.poll_ready(cx).is_pending() {
            return Poll::Pending;
        }
        match this.rx.poll_recv(cx) {
            Poll::Ready(Some(r)) => {
                this.pace.tokens -= 1.0;
                Poll::Ready(Some(r))
            }
            other => other,
        }
    }
}
