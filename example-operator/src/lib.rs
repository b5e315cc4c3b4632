//! The example sharded operator's reconcile path, as a library: `kshard operator` runs it on a real cluster,
//! the fault simulator (`kube-shard-chaos`) runs several copies of it against testserver.
//!
//! It reconciles `Widget`s (`example.kube-shard.io/v1`): for each one a child ConfigMap `<name>-widget`
//! mirroring the spec, and the status `observedGeneration`, `reconciledBy` (the member) and `epoch` (of
//! the fence it wrote under). Every write is a fenced write (uid and resourceVersion preconditions, the
//! fence header, the fence annotation on main-resource writes). Widgets are read through kube-shard's
//! sharded read path; ownership comes from the caller's `ShardGroup`.
//!
//! One piece of work runs once per group, on the coordinator (`Leadership::run_singleton`, with a fencing
//! term): collecting child ConfigMaps whose Widget is gone (see [`gc`]).
//!
//! [`build`] takes the clients, the member's ownership and leadership and a [`Config`], and returns the
//! futures to run ([`Workload`]); the caller spawns them (and decides where renewals run, e.g.
//! `ShardGroupBuilder::dedicated_thread`). [`run::run`] is the whole process around it, from its flags:
//! what `kshard operator` calls.
#![forbid(unsafe_code)]

pub mod gc;
mod reconcile;
pub mod run;
pub mod widget;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::{controller, watcher, Controller, WatchStreamExt};
use kube::{Api, Client};
use kube_shard::group::Leadership;
use kube_shard::reconcile as admission;
use kube_shard::rt::Spawner;
use kube_shard::watcher::{Dependency, ReadPathMetrics, WatcherStats};
use kube_shard::{Fence, Ownership, ShardKey, ShardedWatcher};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

pub use reconcile::ReconcileError;
use widget::{Widget, CHILD_LABEL};

/// The name the Widget read path is reported under (metrics label `resource`).
pub const WIDGET_STREAM: &str = "widgets";
/// The name the child ConfigMap read path is reported under.
pub const CHILD_STREAM: &str = "widget-children";

/// One committed fenced write, as reported to [`Config::on_write`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct WriteRecord {
    /// `name/incarnation` of the member the fence was issued to.
    pub member: String,
    /// The fence's shard.
    pub shard: u32,
    /// The fence's epoch.
    pub epoch: u64,
    /// When the write was sent (runtime clock).
    pub sent: tokio::time::Instant,
    /// When the write was sent (wall clock).
    pub sent_wall: std::time::SystemTime,
}

/// One reconcile that succeeded, as reported to [`Config::on_reconciled`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Reconciled {
    /// The member's name (not its incarnation).
    pub member: String,
    /// `namespace/name` of the Widget.
    pub key: String,
    /// The Widget's uid.
    pub uid: String,
    /// The generation reconciled.
    pub generation: i64,
}

/// What a [`Config::before_write`] hook decides for one reconcile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Injected {
    /// Go on.
    Proceed,
    /// Fail this reconcile (the error policy retries it).
    Fail,
}

/// Called with a reconcile's Widget key after admission and before its writes; may delay (the future) or fail
/// it. The simulator's fault hook.
pub type BeforeWrite = Arc<dyn Fn(&str) -> BoxFuture<'static, Injected> + Send + Sync>;
/// Called after every committed fenced write.
pub type OnWrite = Arc<dyn Fn(&WriteRecord) + Send + Sync>;
/// Called after every successful reconcile.
pub type OnReconciled = Arc<dyn Fn(&Reconciled) + Send + Sync>;

/// The operator's settings.
#[derive(Clone)]
#[non_exhaustive]
pub struct Config {
    /// This member's stable name (`reconciledBy`).
    pub name: String,
    /// Watch Widgets in this namespace only (`None`: all namespaces).
    pub watch_namespace: Option<String>,
    /// The group's shard key (decides how children are placed).
    pub key: ShardKey,
    /// How often the singleton collects child ConfigMaps whose Widget is gone.
    pub gc_interval: Duration,
    /// The Controller's reconcile concurrency (0: unbounded, kube's default).
    pub concurrency: u16,
    /// See [`BeforeWrite`].
    pub before_write: Option<BeforeWrite>,
    /// See [`OnWrite`].
    pub on_write: Option<OnWrite>,
    /// See [`OnReconciled`].
    pub on_reconciled: Option<OnReconciled>,
    /// Where the read path starts its tasks (default `tokio::spawn`; see `ShardedWatcher::spawner`).
    pub spawner: Spawner,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("name", &self.name)
            .field("watch_namespace", &self.watch_namespace)
            .field("key", &self.key)
            .field("gc_interval", &self.gc_interval)
            .field("concurrency", &self.concurrency)
            .finish_non_exhaustive()
    }
}

impl Config {
    /// Defaults: every namespace, the `uid` key, a GC pass every 10 s, unbounded concurrency, no hooks.
    pub fn new(name: impl Into<String>) -> Self {
        Config {
            name: name.into(),
            watch_namespace: None,
            key: ShardKey::Uid,
            gc_interval: Duration::from_secs(10),
            concurrency: 0,
            before_write: None,
            on_write: None,
            on_reconciled: None,
            spawner: Spawner::tokio(),
        }
    }

    /// Where the read path starts its tasks.
    #[must_use]
    pub fn spawner(mut self, spawner: Spawner) -> Self {
        self.spawner = spawner;
        self
    }

    /// Watch one namespace only.
    #[must_use]
    pub fn watch_namespace(mut self, ns: Option<String>) -> Self {
        self.watch_namespace = ns;
        self
    }

    /// The group's shard key.
    #[must_use]
    pub fn key(mut self, key: ShardKey) -> Self {
        self.key = key;
        self
    }

    /// The singleton's pass interval.
    #[must_use]
    pub fn gc_interval(mut self, every: Duration) -> Self {
        self.gc_interval = every;
        self
    }

    /// The Controller's concurrency (0: unbounded).
    #[must_use]
    pub fn concurrency(mut self, n: u16) -> Self {
        self.concurrency = n;
        self
    }

    /// See [`BeforeWrite`].
    #[must_use]
    pub fn before_write(mut self, hook: BeforeWrite) -> Self {
        self.before_write = Some(hook);
        self
    }

    /// See [`OnWrite`].
    #[must_use]
    pub fn on_write(mut self, hook: OnWrite) -> Self {
        self.on_write = Some(hook);
        self
    }

    /// See [`OnReconciled`].
    #[must_use]
    pub fn on_reconciled(mut self, hook: OnReconciled) -> Self {
        self.on_reconciled = Some(hook);
        self
    }
}

/// The clients the operator talks through.
#[derive(Clone)]
#[non_exhaustive]
pub struct Clients {
    /// Writes, child reads and the singleton.
    pub write: Client,
    /// The Widget read path (the demo accounts reads per identity).
    pub read: Client,
}

impl Clients {
    /// One client for everything.
    pub fn one(client: Client) -> Self {
        Clients {
            write: client.clone(),
            read: client,
        }
    }

    /// A separate client for the Widget read path.
    pub fn split(write: Client, read: Client) -> Self {
        Clients { write, read }
    }
}

/// The operator's own metrics.
#[derive(Clone, Default, Debug)]
pub struct OperatorMetrics {
    /// Widget reconciles run (admitted).
    pub reconciles: Counter,
    /// Fenced writes committed.
    pub writes: Counter,
    /// Fenced writes refused by a precondition (409).
    pub write_conflicts: Counter,
    /// Reconciles that failed.
    pub errors: Counter,
    /// Writes not sent because the fence was no longer valid.
    pub fence_refused: Counter,
    /// Fenced writes the apiserver's fence policy refused (422: the writer lost the shard); requeued, never
    /// a reconcile error.
    pub server_refused: Counter,
    /// 1 when `/readyz` succeeds (set by the caller).
    pub ready: Gauge,
}

impl OperatorMetrics {
    /// Register every metric (names `kshard_widget_*`, `kshard_ready`).
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "kshard_widget_reconciles",
            "Widget reconciles run (admitted)",
            self.reconciles.clone(),
        );
        r.register(
            "kshard_widget_writes",
            "Fenced writes committed",
            self.writes.clone(),
        );
        r.register(
            "kshard_widget_write_conflicts",
            "Fenced writes refused by a precondition (409)",
            self.write_conflicts.clone(),
        );
        r.register(
            "kshard_widget_reconcile_errors",
            "Reconciles that failed",
            self.errors.clone(),
        );
        r.register(
            "kshard_widget_fence_refused",
            "Writes not sent because the fence was no longer valid",
            self.fence_refused.clone(),
        );
        r.register(
            "kshard_widget_server_refused",
            "Fenced writes the apiserver's fence policy refused (the writer lost the shard)",
            self.server_refused.clone(),
        );
        r.register(
            "kshard_ready",
            "1 when /readyz succeeds",
            self.ready.clone(),
        );
    }
}

/// What [`build`] could not set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// The child ConfigMaps' dependent watcher.
    #[error("child ConfigMaps: {0}")]
    Children(String),
}

/// The operator, ready to run: the caller spawns [`Workload::controller`] and [`Workload::singleton`].
#[non_exhaustive]
pub struct Workload {
    /// The Controller; ends after `stop` resolved and the running reconciles finished.
    pub controller: BoxFuture<'static, ()>,
    /// The orphan-collecting singleton; ends with the member's leadership.
    pub singleton: BoxFuture<'static, ()>,
    /// The Widget read path's statistics (readiness).
    pub stats: WatcherStats,
    /// The operator's metrics.
    pub metrics: OperatorMetrics,
    /// The singleton's metrics.
    pub gc_metrics: gc::GcMetrics,
}

/// Build the operator's read path, Controller and singleton for one member. Call it before the group task
/// first runs, so the watchers' warm reports are awaited.
///
/// # Errors
/// When the child ConfigMaps' dependency cannot be set up.
pub fn build(
    clients: Clients,
    ownership: Ownership,
    leadership: Leadership,
    config: Config,
    read_metrics: &ReadPathMetrics,
    stop: impl Future<Output = ()> + Send + Sync + 'static,
) -> Result<Workload, BuildError> {
    let widgets: Api<Widget> = match &config.watch_namespace {
        Some(ns) => Api::namespaced(clients.read.clone(), ns),
        None => Api::all(clients.read.clone()),
    };
    let sharded = ShardedWatcher::new(widgets, watcher::Config::default(), ownership.clone())
        .name(WIDGET_STREAM)
        .spawner(config.spawner.clone())
        .metrics(read_metrics)
        .transform(|w: &mut Widget| w.metadata.managed_fields = None)
        .build_reflector();
    let stats = sharded.stats.clone();
    let widget_store = sharded.store.clone();

    // children: a secondary watcher placed by the dependency-key map (the controller ownerReference's uid
    // under the `uid` key, the server filter under the `namespace` key), created before the group task runs
    // so a shard is warm only when its children are in the store too
    let cms: Api<ConfigMap> = match &config.watch_namespace {
        Some(ns) => Api::namespaced(clients.write.clone(), ns),
        None => Api::all(clients.write.clone()),
    };
    let dependency = match config.key {
        ShardKey::Namespace => Dependency::same_key(),
        _ => Dependency::controller_owner(),
    };
    let child_watch = ShardedWatcher::new(
        cms,
        watcher::Config::default().labels(CHILD_LABEL),
        ownership.clone(),
    )
    .dependent(dependency)
    .map_err(|e| BuildError::Children(e.to_string()))?
    .name(CHILD_STREAM)
    .spawner(config.spawner.clone())
    .metrics(read_metrics)
    .transform(|cm: &mut ConfigMap| cm.metadata.managed_fields = None)
    .build_reflector();
    let children = child_watch.store.clone();
    let child_stream = child_watch.events.touched_objects();

    let metrics = OperatorMetrics::default();
    let ctx = Arc::new(reconcile::Ctx {
        client: clients.write.clone(),
        ownership: ownership.clone(),
        children,
        metrics: metrics.clone(),
        config: config.clone(),
    });
    let controller = Controller::for_stream(sharded.events.applied_objects(), widget_store)
        .with_config(controller::Config::default().concurrency(config.concurrency))
        .owns_stream(child_stream)
        .reconcile_on(sharded.reenqueue)
        .graceful_shutdown_on(stop)
        .run(
            admission::wrap(ownership, reconcile::reconcile_widget),
            reconcile::error_policy,
            ctx,
        )
        .for_each(|_| async {})
        .boxed();
    let gc_metrics = gc::GcMetrics::default();
    let singleton = {
        let (client, ns, every, m) = (
            clients.write,
            config.watch_namespace.clone(),
            config.gc_interval,
            gc_metrics.clone(),
        );
        leadership
            .run_singleton("orphan-children", move |guard| {
                gc::collect_orphans(client.clone(), ns.clone(), every, guard, m.clone())
            })
            .boxed()
    };
    Ok(Workload {
        controller,
        singleton,
        stats,
        metrics,
        gc_metrics,
    })
}

/// The fence a write was sent under, for [`WriteRecord`].
fn record(
    member: String,
    fence: &Fence,
    sent: (tokio::time::Instant, std::time::SystemTime),
) -> WriteRecord {
    WriteRecord {
        member,
        shard: fence.shard(),
        epoch: fence.epoch(),
        sent: sent.0,
        sent_wall: sent.1,
    }
}
