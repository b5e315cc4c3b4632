//! `kshard operator`: the example sharded operator (hidden subcommand; `kshard demo` re-executes its own
//! binary with it for each replica).
//!
//! It reconciles `Widget`s (`example.kube-shard.io/v1`): for each one a child ConfigMap `<name>-widget`
//! mirroring the spec, and the status `observedGeneration`, `reconciledBy` (the member) and `epoch` (of
//! the fence it wrote under). Every write is a fenced write (uid and resourceVersion preconditions, the
//! fence header, the fence annotation on main-resource writes). Widgets are read through kube-shard's
//! sharded read path; ownership comes from a `ShardGroup`. SIGTERM (or SIGINT) leaves the group
//! gracefully: the shards move away, then the process exits.
//!
//! One piece of work runs once per group, on the coordinator (`Leadership::run_singleton`, with a fencing
//! term): collecting child ConfigMaps whose Widget is gone (see `gc`), every `--gc-interval`.
//!
//! Output contract (for `kshard demo`): with `--metrics-addr`, the first stdout line is
//! `metrics http://ADDR` once the endpoint listens (`/metrics`, `/healthz`, `/readyz`).

mod gc;
pub(crate) mod http;
pub(crate) mod widget;

use std::collections::BTreeMap;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Args;
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::ObjectMeta;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{watcher, Controller, WatchStreamExt};
use kube::{Api, Client, Resource};
use kube_shard::group::ShardGroup;
use kube_shard::ownership::fenced_write::{self, FencedApi};
use kube_shard::ownership::{reconcile, FenceError};
use kube_shard::watcher::{Dependency, ReadPathMetrics};
use kube_shard::{Fence, Ownership, Permit, ShardCount, ShardKey, ShardedWatcher};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::cli::CliError;
use crate::duration::parse_duration;
use widget::{Widget, CHILD_LABEL};

/// The name the Widget read path is reported under (metrics label `resource`).
pub(crate) const WIDGET_STREAM: &str = "widgets";
/// The name the child ConfigMap read path is reported under.
pub(crate) const CHILD_STREAM: &str = "widget-children";

#[derive(Debug, Args)]
pub(crate) struct OperatorArgs {
    /// Kubeconfig to use (default: $KUBECONFIG, ~/.kube/config, else the in-cluster config).
    #[arg(long, value_name = "PATH")]
    kubeconfig: Option<PathBuf>,
    /// The shard group (names its Leases and assignment ConfigMap).
    #[arg(long, default_value = "widget-operator")]
    group: String,
    /// The namespace of the group's Leases and assignment ConfigMap.
    #[arg(long, short = 'n', default_value = "default")]
    namespace: String,
    /// Watch Widgets in this namespace only (default: all namespaces).
    #[arg(long, value_name = "NS")]
    watch_namespace: Option<String>,
    /// This member's stable name (default: $POD_NAME, else the hostname).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// Lease duration: a member not seen renewing for this long (+ grace) is taken over.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    lease_duration: Duration,
    /// A member that has not renewed for this long admits nothing (self-fenced).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    renew_deadline: Duration,
    /// Renewal period.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    retry_period: Duration,
    /// Extra wait before a takeover.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    takeover_grace: Duration,
    /// How long a drain waits for in-flight work.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    drain_timeout: Duration,
    /// Fences end this much before the renew deadline.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    fence_margin: Duration,
    /// Cold-start settle window (no membership change for this long before the first plan).
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    settle: Duration,
    /// Join debounce.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    join_debounce: Duration,
    /// Cold start: plan as soon as this many members are present.
    #[arg(long)]
    expected_replicas: Option<u32>,
    /// The shard key: `uid` or `namespace` (immutable for a group).
    #[arg(long, default_value = "uid", value_parser = parse_key)]
    hash_key: ShardKey,
    /// The number of logical shards S (immutable for a group).
    #[arg(long, default_value = "256", value_parser = parse_count)]
    shards: ShardCount,
    /// Install the Widget CRD if missing (idempotent: every replica may pass it).
    #[arg(long)]
    install_crd: bool,
    /// Shadow mode: join, plan and report ownership, but reconcile nothing (to watch the assignment beside
    /// the current deployment first).
    #[arg(long)]
    shadow: bool,
    /// Admit nothing while this leader-election Lease (`name` in `--namespace`, or `namespace/name`) has a
    /// live holder: roll the sharded operator out beside a leader-elected one.
    #[arg(long, value_name = "LEASE")]
    legacy_leader_lease: Option<String>,
    /// How often the singleton (on the coordinator) collects child ConfigMaps whose Widget is gone.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    gc_interval: Duration,
    /// Serve `/metrics`, `/healthz` and `/readyz` on this address (off unless given; port 0 picks one).
    #[arg(long, value_name = "ADDR")]
    metrics_addr: Option<SocketAddr>,
    /// A second kubeconfig for the Widget read path only (the demo accounts reads per identity).
    #[arg(long, value_name = "PATH", hide = true)]
    widget_kubeconfig: Option<PathBuf>,
    /// Append one line per committed fenced write: `member shard epoch start_ns end_ns` (wall clock).
    #[arg(long, value_name = "PATH", hide = true)]
    fence_log: Option<PathBuf>,
}

fn parse_key(s: &str) -> Result<ShardKey, String> {
    s.parse().map_err(|e: kube_shard::KeyError| e.to_string())
}

fn parse_count(s: &str) -> Result<ShardCount, String> {
    s.parse().map_err(|e: kube_shard::ShardError| e.to_string())
}

/// A kube config from a kubeconfig file, or inferred (`$KUBECONFIG`, `~/.kube/config`, in-cluster).
pub(crate) async fn config_from(path: Option<&Path>) -> Result<kube::Config, CliError> {
    match path {
        Some(p) => {
            let kc = kube::config::Kubeconfig::read_from(p)
                .map_err(|e| CliError::failed(format!("kubeconfig {}: {e}", p.display())))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| CliError::failed(format!("kubeconfig {}: {e}", p.display())))
        }
        None => kube::Config::infer()
            .await
            .map_err(|e| CliError::failed(format!("no kube config: {e}"))),
    }
}

/// A kube client from a kubeconfig file, or inferred (`$KUBECONFIG`, `~/.kube/config`, in-cluster).
pub(crate) async fn client_from(path: Option<&Path>) -> Result<Client, CliError> {
    let config = config_from(path).await?;
    Client::try_from(config).map_err(|e| CliError::failed(format!("kube client: {e}")))
}

/// The operator's own metrics.
#[derive(Clone, Default)]
pub(crate) struct OpMetrics {
    reconciles: Counter,
    writes: Counter,
    write_conflicts: Counter,
    errors: Counter,
    fence_refused: Counter,
    ready: Gauge,
}

impl OpMetrics {
    fn register(&self, r: &mut Registry) {
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
            "kshard_ready",
            "1 when /readyz succeeds",
            self.ready.clone(),
        );
    }
}

/// Appends one line per committed fenced write (wall-clock nanoseconds), flushed at once.
#[derive(Clone)]
struct FenceLog(Option<Arc<Mutex<std::fs::File>>>);

fn unix_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos()
}

impl FenceLog {
    fn record(&self, member: &str, fence: &Fence, start: u128) {
        if let Some(f) = &self.0 {
            let line = format!(
                "{member}\t{}\t{}\t{start}\t{}\n",
                fence.shard(),
                fence.epoch(),
                unix_ns()
            );
            let mut f = f.lock().unwrap_or_else(|e| e.into_inner());
            let _ = f.write_all(line.as_bytes());
        }
    }
}

struct Ctx {
    client: Client,
    /// The member's ownership: its current `name/incarnation` (it changes on a rejoin) for the fence log.
    ownership: Ownership,
    name: String,
    children: Store<ConfigMap>,
    metrics: OpMetrics,
    fence_log: FenceLog,
}

#[derive(Debug, thiserror::Error)]
enum ReconcileError {
    #[error("fence: {0}")]
    Fence(#[from] FenceError),
    #[error("write: {0}")]
    Write(#[from] fenced_write::Error),
    #[error("widget without metadata.{0}")]
    Missing(&'static str),
}

fn child_name(widget: &str) -> String {
    format!("{widget}-widget")
}

fn desired_data(w: &Widget) -> BTreeMap<String, String> {
    let mut d = BTreeMap::new();
    if let Some(size) = w.spec.size {
        d.insert("size".to_owned(), size.to_string());
    }
    if let Some(c) = &w.spec.color {
        d.insert("color".to_owned(), c.clone());
    }
    if let Some(m) = &w.spec.message {
        d.insert("message".to_owned(), m.clone());
    }
    d.insert(
        "widgetGeneration".to_owned(),
        w.metadata.generation.unwrap_or(0).to_string(),
    );
    d
}

/// Run one fenced write, counting and logging it.
async fn fenced<T>(
    ctx: &Ctx,
    fence: &Fence,
    write: impl std::future::Future<Output = Result<T, fenced_write::Error>>,
) -> Result<T, ReconcileError> {
    let start = unix_ns();
    // the incarnation the fence was issued to: a rejoin revokes every fence of the old one, so a write
    // that passes its fence check was sent by this incarnation
    let member = ctx.ownership.snapshot().state().me().to_string();
    match write.await {
        Ok(v) => {
            ctx.metrics.writes.inc();
            ctx.fence_log.record(&member, fence, start);
            Ok(v)
        }
        Err(e) => {
            if e.is_fenced() {
                ctx.metrics.fence_refused.inc();
            } else if e.is_conflict() {
                ctx.metrics.write_conflicts.inc();
            }
            Err(e.into())
        }
    }
}

async fn reconcile_widget(
    w: Arc<Widget>,
    ctx: Arc<Ctx>,
    permit: Permit,
) -> Result<Action, ReconcileError> {
    ctx.metrics.reconciles.inc();
    let name = w
        .metadata
        .name
        .as_deref()
        .ok_or(ReconcileError::Missing("name"))?;
    let ns = w
        .metadata
        .namespace
        .as_deref()
        .ok_or(ReconcileError::Missing("namespace"))?;
    let uid = w
        .metadata
        .uid
        .as_deref()
        .ok_or(ReconcileError::Missing("uid"))?;
    let rv = w
        .metadata
        .resource_version
        .as_deref()
        .ok_or(ReconcileError::Missing("resourceVersion"))?;
    let generation = w.metadata.generation.unwrap_or(0);

    // the child ConfigMap
    let data = desired_data(&w);
    let cname = child_name(name);
    let child = ctx.children.get(&ObjectRef::new(&cname).within(ns));
    let cms: FencedApi<ConfigMap> = FencedApi::new(Api::namespaced(ctx.client.clone(), ns));
    match child {
        None => {
            let owner = OwnerReference {
                api_version: Widget::api_version(&()).into_owned(),
                kind: "Widget".to_owned(),
                name: name.to_owned(),
                uid: uid.to_owned(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            };
            let cm = ConfigMap {
                metadata: ObjectMeta {
                    name: Some(cname.clone()),
                    namespace: Some(ns.to_owned()),
                    labels: Some([(CHILD_LABEL.to_owned(), name.to_owned())].into()),
                    owner_references: Some(vec![owner]),
                    ..ObjectMeta::default()
                },
                data: Some(data),
                ..ConfigMap::default()
            };
            let fence = permit.fence()?;
            match fenced(&ctx, &fence, cms.create(&fence, &cm)).await {
                Ok(_) => {}
                // created before and not in our cache yet: the cache catches up and triggers us
                Err(ReconcileError::Write(e)) if e.is_conflict() => {
                    return Ok(Action::requeue(Duration::from_millis(300)));
                }
                Err(e) => return Err(e),
            }
        }
        Some(c) if c.data.as_ref() != Some(&data) => {
            let mut c = (*c).clone();
            c.data = Some(data);
            let fence = permit.fence()?;
            fenced(&ctx, &fence, cms.replace(&fence, &cname, &c)).await?;
        }
        Some(_) => {}
    }

    // the status
    let fence = permit.fence()?;
    let want = widget::WidgetStatus {
        observed_generation: Some(generation),
        reconciled_by: Some(ctx.name.clone()),
        epoch: Some(fence.epoch()),
    };
    if w.status.as_ref() != Some(&want) {
        let widgets: FencedApi<Widget> = FencedApi::new(Api::namespaced(ctx.client.clone(), ns));
        let patch = serde_json::json!({ "status": want });
        fenced(
            &ctx,
            &fence,
            widgets.patch_status(&fence, name, uid, rv, &patch),
        )
        .await?;
    }
    Ok(Action::await_change())
}

fn error_policy(_w: Arc<Widget>, err: &ReconcileError, ctx: Arc<Ctx>) -> Action {
    ctx.metrics.errors.inc();
    let quick = matches!(err, ReconcileError::Write(e) if e.is_conflict());
    let base = if quick {
        Duration::from_millis(200)
    } else {
        Duration::from_millis(500)
    };
    Action::requeue(kube_shard::ownership::jitter(base))
}

pub(crate) fn run(args: OperatorArgs) -> Result<(), CliError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(operate(args))
}

async fn operate(args: OperatorArgs) -> Result<(), CliError> {
    let config = config_from(args.kubeconfig.as_deref()).await?;
    let client = Client::try_from(config.clone())
        .map_err(|e| CliError::failed(format!("kube client: {e}")))?;
    let read_client = match &args.widget_kubeconfig {
        Some(p) => client_from(Some(p)).await?,
        None => client.clone(),
    };
    if args.install_crd {
        widget::install_crd(client.clone(), Duration::from_secs(30))
            .await
            .map_err(|e| CliError::failed(format!("installing the Widget CRD: {e}")))?;
    }
    let identity = match &args.identity {
        Some(i) => i.clone(),
        None => hostname(),
    };
    let mut builder = ShardGroup::builder(client.clone(), &args.group, &args.namespace)
        .member(identity.clone())
        .shards(args.shards)
        .key(args.hash_key)
        .timings(args.lease_duration, args.renew_deadline, args.retry_period)
        .takeover_grace(args.takeover_grace)
        .drain_timeout(args.drain_timeout)
        .fence_margin(args.fence_margin)
        .settle(args.settle, args.join_debounce)
        // renewals on their own thread and client: a burst of reconciles never delays them
        .dedicated_thread(config);
    if let Some(n) = args.expected_replicas {
        builder = builder.expected_replicas(n);
    }
    if args.shadow {
        builder = builder.shadow(true);
    }
    if let Some(lease) = &args.legacy_leader_lease {
        builder = builder.legacy_leader_lease(lease.clone());
    }
    let group = builder
        .build()
        .map_err(|e| CliError::failed(format!("shard group: {e}")))?;
    let (handle, group_task) = group.start();
    let ownership: Ownership = handle.ownership();

    // metrics
    let read_metrics = ReadPathMetrics::new();
    let op_metrics = OpMetrics::default();
    let mut registry = Registry::default();
    read_metrics.register(&mut registry);
    op_metrics.register(&mut registry);
    handle.metrics().register(&mut registry);
    let gc_metrics = gc::GcMetrics::default();
    registry.register(
        "kshard_singleton_term",
        "The term this member runs the singleton in (0 when it does not lead)",
        gc_metrics.term.clone(),
    );
    registry.register(
        "kshard_orphans_collected",
        "Child ConfigMaps whose Widget was gone, deleted by the singleton",
        gc_metrics.collected.clone(),
    );
    registry.register(
        "kshard_singleton_passes",
        "Orphan collection passes completed",
        gc_metrics.passes.clone(),
    );

    // the read path: created before the group task first runs, so its warm reports are awaited
    let widgets: Api<Widget> = match &args.watch_namespace {
        Some(ns) => Api::namespaced(read_client, ns),
        None => Api::all(read_client),
    };
    let sharded = ShardedWatcher::new(widgets, watcher::Config::default(), ownership.clone())
        .name(WIDGET_STREAM)
        .metrics(&read_metrics)
        .transform(|w: &mut Widget| w.metadata.managed_fields = None)
        .build_reflector();
    let stats = sharded.stats.clone();
    let widget_store = sharded.store.clone().expect("a reflector has a store");

    // children: a secondary watcher placed by the dependency-key map (the controller ownerReference's
    // uid under the `uid` key, the server filter under the `namespace` key), created before the group
    // task runs so a shard is warm only when its children are in the store too
    let cms: Api<ConfigMap> = match &args.watch_namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let dependency = match args.hash_key {
        ShardKey::Namespace => Dependency::same_key(),
        _ => Dependency::controller_owner(),
    };
    let child_watch = ShardedWatcher::new(
        cms,
        watcher::Config::default().labels(CHILD_LABEL),
        ownership.clone(),
    )
    .dependent(dependency)
    .map_err(|e| CliError::failed(format!("child ConfigMaps: {e}")))?
    .name(CHILD_STREAM)
    .metrics(&read_metrics)
    .transform(|cm: &mut ConfigMap| cm.metadata.managed_fields = None)
    .build_reflector();
    let children = child_watch.store.clone().expect("a reflector has a store");
    let child_stream = child_watch.events.touched_objects();

    let group_task = tokio::spawn(group_task);
    let fence_log = match &args.fence_log {
        Some(p) => FenceLog(Some(Arc::new(Mutex::new(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)?,
        )))),
        None => FenceLog(None),
    };
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        ownership: ownership.clone(),
        name: identity.clone(),
        children,
        metrics: op_metrics.clone(),
        fence_log,
    });

    if let Some(addr) = args.metrics_addr {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let local = listener.local_addr()?;
        let state = http::State {
            registry: Arc::new(registry),
            handle: handle.clone(),
            stats: stats.clone(),
            metrics: op_metrics.clone(),
        };
        tokio::spawn(http::serve(listener, state));
        println!("metrics http://{local}");
        let _ = std::io::stdout().flush();
    }

    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let controller = Controller::for_stream(sharded.events.applied_objects(), widget_store)
        .owns_stream(child_stream)
        .reconcile_on(sharded.reenqueue)
        .graceful_shutdown_on(async move {
            let _ = stop_rx.await;
        })
        .run(
            reconcile::wrap(ownership.clone(), reconcile_widget),
            error_policy,
            ctx,
        )
        .for_each(|_| async {});
    let controller = tokio::spawn(controller);
    let singleton = {
        let (client, ns, every) = (
            client.clone(),
            args.watch_namespace.clone(),
            args.gc_interval,
        );
        tokio::spawn(
            handle
                .leadership()
                .run_singleton("orphan-children", move |guard| {
                    gc::collect_orphans(
                        client.clone(),
                        ns.clone(),
                        every,
                        guard,
                        gc_metrics.clone(),
                    )
                }),
        )
    };

    let mut group_task = group_task;
    tokio::select! {
        r = &mut group_task => {
            let _ = stop_tx.send(());
            let _ = controller.await;
            return match r {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(CliError::failed(format!("shard group ended: {e}"))),
                Err(e) => Err(CliError::failed(format!("shard group task: {e}"))),
            };
        }
        r = shutdown_signal() => { r?; }
    }
    eprintln!("{identity}: leaving the group");
    handle.leave();
    let _singleton = singleton; // ends with the member's leadership
    let budget = args.drain_timeout + args.lease_duration * 2 + Duration::from_secs(10);
    let left = tokio::time::timeout(budget, &mut group_task).await;
    let _ = stop_tx.send(());
    let _ = tokio::time::timeout(Duration::from_secs(5), controller).await;
    match left {
        Ok(Ok(Ok(()))) => {
            eprintln!("{identity}: left");
            Ok(())
        }
        Ok(Ok(Err(e))) => Err(CliError::failed(format!("shard group ended: {e}"))),
        Ok(Err(e)) => Err(CliError::failed(format!("shard group task: {e}"))),
        Err(_) => Err(CliError::failed(format!(
            "the graceful leave did not finish within {budget:?}"
        ))),
    }
}

fn hostname() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|s| s.trim().to_owned())
        })
        .unwrap_or_else(|| "widget-operator".to_owned())
}

#[cfg(unix)]
pub(crate) async fn shutdown_signal() -> std::io::Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r,
        _ = term.recv() => Ok(()),
    }
}

#[cfg(not(unix))]
pub(crate) async fn shutdown_signal() -> std::io::Result<()> {
    tokio::signal::ctrl_c().await
}
