//! The example operator's start-up, [`run`] (what `kshard operator` calls, and what a harness can call
//! in-process): from its flags ([`OperatorArgs`]) it builds the `ShardGroup` (renewals on a dedicated
//! thread, HA attached when asked), the workload of this crate, the metrics and health endpoint, and turns
//! SIGTERM (or SIGINT) into a graceful leave: the shards move away, then it returns.
//!
//! Output contract (for `kshard-dev demo`): with `--metrics-addr`, the first stdout line is
//! `metrics http://ADDR` once the endpoint listens (`/metrics`, `/healthz`, `/readyz`).

mod duration;
pub mod http;

pub use duration::parse_duration;

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate as example;
use crate::{OnWrite, WriteRecord};
use clap::Args;
use kube::Client;
use kube_shard::group::ShardGroup;
use kube_shard::watcher::ReadPathMetrics;
use kube_shard::{Ownership, ShardCount, ShardKey};
use kube_shard_ha::adoption::{AdoptConfig, ShardSpec};
use kube_shard_ha::duty::MirrorDuty;
use kube_shard_ha::failback::FailbackOptions;
use kube_shard_ha::mirror::{KindSet, MirrorConfig, MirrorWiring};
use kube_shard_ha::switchover::Kind;
use kube_shard_ha::{HaClients, HaConfig, HaMode};
use prometheus_client::registry::Registry;

use crate::widget;

/// Why the operator stopped (or never started).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// The flags do not make sense together (exit code 2 in `kshard`).
    #[error("{0}")]
    Usage(String),
    /// Something failed at run time.
    #[error("{0}")]
    Failed(String),
    /// An I/O error (the runtime, the metrics listener, the fence log).
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

impl RunError {
    fn failed(msg: impl Into<String>) -> Self {
        RunError::Failed(msg.into())
    }
}

/// The example operator's flags (`kshard operator --help`).
#[derive(Debug, Args)]
pub struct OperatorArgs {
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
    /// Install the fence ValidatingAdmissionPolicies (per object and per shard) for Widgets and their child
    /// ConfigMaps if missing, and keep the per-shard parameter ConfigMap `<group>-fence` (idempotent).
    #[arg(long)]
    install_fence_policy: bool,
    /// Shadow mode: join, plan and report ownership, but reconcile nothing (to watch the assignment beside
    /// the current deployment first).
    #[arg(long)]
    shadow: bool,
    /// Admit nothing while this leader-election Lease (`name` in `--namespace`, or `namespace/name`) has a
    /// live holder: roll the sharded operator out beside a leader-elected one.
    #[arg(long, value_name = "LEASE")]
    legacy_leader_lease: Option<String>,
    /// Cross-cluster HA: `active` or `standby` names the role at bootstrap only (while no HA Lease
    /// exists); empty (the default) or `standalone` is no HA. Anything else is a start-up error.
    #[arg(long, default_value = "", value_name = "MODE")]
    ha_mode: String,
    /// This cluster's stable id (HA).
    #[arg(long, default_value = "", value_name = "ID")]
    ha_cluster_id: String,
    /// This cluster's rank, below 1000 (HA; required with `--ha-mode active|standby`): the two clusters
    /// must differ, or two promotions during a partition take equal epochs and neither steps down.
    #[arg(long, value_name = "RANK")]
    ha_rank: Option<u64>,
    /// Kubeconfig of the peer cluster (HA; required with a mode).
    #[arg(long, value_name = "PATH")]
    ha_remote_kubeconfig: Option<PathBuf>,
    /// Kubeconfig of the witness cluster (HA; without one promotion is a command).
    #[arg(long, value_name = "PATH")]
    ha_witness_kubeconfig: Option<PathBuf>,
    /// The HA Lease namespace (default: the pod's namespace from POD_NAMESPACE, else `--namespace`).
    #[arg(long, value_name = "NS")]
    ha_namespace: Option<String>,
    /// HA: run the mirror duty in this process: mirror the peer's Widgets while it is Active (after
    /// failback if this cluster was Active), adopt the copies before admitting at a new epoch. One
    /// process per cluster: run the group with one member.
    #[arg(long, requires = "ha_peer_cluster_id")]
    ha_mirror: bool,
    /// The peer cluster's id (`--ha-cluster-id` of its operator): the mirror's source.
    #[arg(long, value_name = "ID")]
    ha_peer_cluster_id: Option<String>,
    /// Kubeconfig of the mirror duty's writes to this cluster (the copies, adoption, failback, its
    /// checkpoint): the writer identity of `deploy/ha/mirror-rbac.yaml`, which a planned switchover's
    /// freeze exempts (`kshard ha demote --freeze-exempt`). Default: the operator's own identity (then
    /// the freeze must exempt the operator, and loses its use as a backstop).
    #[arg(long, value_name = "PATH", requires = "ha_mirror")]
    ha_mirror_kubeconfig: Option<PathBuf>,
    /// The mirror's label selector (`kubectl -l` syntax): only Widgets that match are mirrored (and
    /// frozen at a switchover).
    #[arg(long, value_name = "SELECTOR", requires = "ha_mirror")]
    ha_mirror_labels: Option<String>,
    /// Copy writes in flight at once per kind (1–64; an object's writes stay in order).
    #[arg(long, value_name = "N", default_value_t = 8, requires = "ha_mirror")]
    ha_mirror_workers: usize,
    /// At most this many copy requests per second over every kind (default: no limit).
    #[arg(long, value_name = "PER_SECOND", requires = "ha_mirror")]
    ha_mirror_rate_limit: Option<f64>,
    /// Witness mode: promote automatically only while the mirror's lag (time since the latest source
    /// probe its position passed, every kind) is below this; before the mirror's first confirmation,
    /// never. Needs `--ha-mirror` (the mirror confirms) and `--ha-witness-kubeconfig`. Choose it above
    /// the takeover wait (`lease_duration + grace`) plus the mirror's probe period (10 s).
    /// With a witness and `--ha-mirror`, the bound defaults to `2 × (lease duration + grace) + 20 s`.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, requires_all = ["ha_mirror", "ha_witness_kubeconfig"])]
    ha_max_auto_promote_lag: Option<Duration>,
    /// Witness mode without a lag bound: promote automatically whatever the mirror's lag, also with no
    /// mirror (everything the old Active wrote after the mirror's position is lost, silently). Without
    /// `--ha-mirror` a witness needs it: nothing else confirms the lag.
    #[arg(
        long,
        requires = "ha_witness_kubeconfig",
        conflicts_with = "ha_max_auto_promote_lag"
    )]
    ha_auto_promote_without_lag_bound: bool,
    /// Failback: delete objects only this cluster holds (divergent) once seen for this long.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    ha_prune_grace: Duration,
    /// Failback: report divergent objects, never delete them.
    #[arg(long)]
    ha_keep_divergent: bool,
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

/// The HA configuration of the `--ha-*` flags (`None`: standalone, today's behaviour).
async fn ha_setup(
    args: &OperatorArgs,
    local: &Client,
) -> Result<Option<(HaConfig, HaClients)>, RunError> {
    let ha = HaConfig::builder(&args.group)
        .mode_word(&args.ha_mode)
        .cluster(&args.ha_cluster_id, args.ha_rank.unwrap_or(0))
        .kubeconfigs(
            args.kubeconfig.clone(),
            args.ha_remote_kubeconfig.clone(),
            args.ha_witness_kubeconfig.clone(),
        )
        .max_auto_promote_lag(args.ha_max_auto_promote_lag)
        // the fenced kind: a start reads its stamps, so a reinstalled pair starts above them
        .stamped_kinds([widgets_kind()]);
    // the identity publishes what this side's mirror covers (compared by the peer and `kshard ha check`)
    let ha = if args.ha_mirror {
        ha.mirrored_kinds([widgets_kind()])
    } else {
        ha
    };
    let ha = if args.ha_auto_promote_without_lag_bound {
        ha.auto_promote_without_lag_bound()
    } else {
        ha
    };
    let ha = ha
        // the pod's namespace (downward API, else the service account's), else the group's namespace
        .pod_namespace(
            std::env::var("POD_NAMESPACE")
                .ok()
                .or_else(|| {
                    std::fs::read_to_string(
                        "/var/run/secrets/kubernetes.io/serviceaccount/namespace",
                    )
                    .ok()
                })
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .or(Some(args.namespace.clone())),
        );
    let ha = match &args.ha_namespace {
        Some(ns) => ha.namespace(ns),
        None => ha,
    }
    .build()
    .map_err(|e| RunError::Usage(format!("HA: {e}")))?;
    if ha.mode == HaMode::Standalone {
        return Ok(None);
    }
    if args.ha_rank.is_none() {
        return Err(RunError::Usage(
            "HA: --ha-rank is required with --ha-mode: give the two clusters different ranks (say 1 and 2)"
                .into(),
        ));
    }
    if ha.has_witness() && !args.ha_mirror && !args.ha_auto_promote_without_lag_bound {
        return Err(RunError::Usage(
            "HA: with a witness, automatic promotion waits for the mirror's lag to be confirmed below a bound: give --ha-mirror (the mirror confirms it), or --ha-auto-promote-without-lag-bound to promote whatever the lag".into(),
        ));
    }
    let peer = client_from(ha.remote_kubeconfig.as_deref()).await?;
    let witness = match &ha.witness_kubeconfig {
        Some(p) => Some(client_from(Some(p)).await?),
        None => None,
    };
    Ok(Some((ha, HaClients::new(local.clone(), peer, witness))))
}

/// The operator's kind, Widgets.
fn widgets_kind() -> Kind {
    Kind {
        plural: "widgets".into(),
        group: "example.kube-shard.io".into(),
        version: "v1".into(),
    }
}

/// The mirror duty of `--ha-mirror`: Widgets mirrored (in `--watch-namespace` if given), their child
/// ConfigMaps derived (the reconcile recreates them).
fn mirror_duty(
    args: &OperatorArgs,
    cfg: &HaConfig,
    clients: HaClients,
    ha: kube_shard_ha::HaHandle,
    control: Option<kube_shard_ha::HaControl>,
) -> Result<MirrorDuty, RunError> {
    let kind = |k: &str| {
        k.parse::<Kind>()
            .map_err(|e| RunError::failed(e.to_string()))
    };
    let (widgets, cms) = (widgets_kind(), kind("configmaps/v1")?);
    let set = KindSet::builder()
        .mirrored(widgets.clone())
        .derived(cms.clone())
        .build(&[widgets, cms])
        .map_err(|e| RunError::Usage(format!("HA mirror: {e}")))?;
    let peer = args.ha_peer_cluster_id.clone().unwrap_or_default();
    if !(1..=64).contains(&args.ha_mirror_workers) {
        return Err(RunError::Usage(format!(
            "--ha-mirror-workers {}: give 1 to 64",
            args.ha_mirror_workers
        )));
    }
    if let Some(r) = args
        .ha_mirror_rate_limit
        .filter(|r| !(r.is_finite() && *r > 0.0))
    {
        return Err(RunError::Usage(format!(
            "--ha-mirror-rate-limit {r}: give a positive number of requests per second"
        )));
    }
    let mut m = MirrorConfig::new(cfg.clone(), peer, set)
        .workers(args.ha_mirror_workers)
        .rate_limit(args.ha_mirror_rate_limit);
    if let Some(ns) = &args.watch_namespace {
        m = m.namespaces([ns.clone()]);
    }
    if let Some(l) = &args.ha_mirror_labels {
        m = m
            .labels(l)
            .map_err(|e| RunError::Usage(format!("--ha-mirror-labels: {e}")))?;
    }
    let adopt = AdoptConfig::new(m).shard(ShardSpec {
        key: args.hash_key,
        count: args.shards,
    });
    let opts = FailbackOptions::default()
        .prune_grace(args.ha_prune_grace)
        .keep_divergent(args.ha_keep_divergent);
    let wiring = MirrorWiring::new(ha.clock(), control);
    Ok(MirrorDuty::spawn(ha, clients, adopt, wiring, opts))
}

/// A kube config from a kubeconfig file, or inferred (`$KUBECONFIG`, `~/.kube/config`, in-cluster).
pub async fn config_from(path: Option<&Path>) -> Result<kube::Config, RunError> {
    match path {
        Some(p) => {
            let kc = kube::config::Kubeconfig::read_from(p)
                .map_err(|e| RunError::failed(format!("kubeconfig {}: {e}", p.display())))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| RunError::failed(format!("kubeconfig {}: {e}", p.display())))
        }
        None => kube::Config::infer()
            .await
            .map_err(|e| RunError::failed(format!("no kube config: {e}"))),
    }
}

/// A kube client from a kubeconfig file, or inferred (`$KUBECONFIG`, `~/.kube/config`, in-cluster).
pub async fn client_from(path: Option<&Path>) -> Result<Client, RunError> {
    let config = config_from(path).await?;
    Client::try_from(config).map_err(|e| RunError::failed(format!("kube client: {e}")))
}

/// Appends one line per committed fenced write (wall-clock nanoseconds), flushed at once.
fn fence_log_hook(file: std::fs::File) -> OnWrite {
    let file = Mutex::new(file);
    Arc::new(move |w: &WriteRecord| {
        let line = format!(
            "{}\t{}\t{}\t{}\t{}\n",
            w.member,
            w.shard,
            w.epoch,
            unix_ns(w.sent_wall),
            unix_ns(SystemTime::now())
        );
        let mut f = file.lock().unwrap_or_else(|e| e.into_inner());
        let _ = f.write_all(line.as_bytes());
    })
}

fn unix_ns(t: SystemTime) -> u128 {
    t.duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos()
}

pub fn run(args: OperatorArgs) -> Result<(), RunError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(operate(args))
}

async fn operate(args: OperatorArgs) -> Result<(), RunError> {
    let config = config_from(args.kubeconfig.as_deref()).await?;
    let client = Client::try_from(config.clone())
        .map_err(|e| RunError::failed(format!("kube client: {e}")))?;
    let read_client = match &args.widget_kubeconfig {
        Some(p) => client_from(Some(p)).await?,
        None => client.clone(),
    };
    if args.install_crd {
        widget::install_crd(client.clone(), Duration::from_secs(30))
            .await
            .map_err(|e| RunError::failed(format!("installing the Widget CRD: {e}")))?;
    }
    if args.install_fence_policy {
        widget::install_fence_policy(client.clone(), &args.group, &args.namespace)
            .await
            .map_err(|e| RunError::failed(format!("installing the fence policies: {e}")))?;
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
    if args.install_fence_policy {
        builder = builder.fence_params(widget::fence_params_name(&args.group));
    }
    if let Some(lease) = &args.legacy_leader_lease {
        builder = builder.legacy_leader_lease(lease.clone());
    }
    let ha = ha_setup(&args, &client).await?;
    let mut attached = None;
    if let Some((ha, clients)) = &ha {
        let (b, a) = kube_shard_ha::attach(builder, ha.clone(), clients.clone());
        (builder, attached) = (b, a);
    }
    let group = builder
        .build()
        .map_err(|e| RunError::failed(format!("shard group: {e}")))?;
    let (handle, group_task) = group.start();
    let ownership: Ownership = handle.ownership();
    let duty = match (&ha, attached) {
        (Some((cfg, clients)), Some(a)) if args.ha_mirror => {
            let local = match &args.ha_mirror_kubeconfig {
                Some(p) => client_from(Some(p)).await?,
                None => clients.local.clone(),
            };
            let clients = HaClients::new(local, clients.peer.clone(), clients.witness.clone());
            Some(mirror_duty(&args, cfg, clients, a.handle, Some(a.control))?)
        }
        (None, _) if args.ha_mirror => {
            return Err(RunError::Usage("--ha-mirror needs --ha-mode".into()))
        }
        _ => None,
    };

    // the operator: built before the group task first runs, so its watchers' warm reports are awaited
    let mut config = example::Config::new(identity.clone())
        .watch_namespace(args.watch_namespace.clone())
        .key(args.hash_key)
        .gc_interval(args.gc_interval);
    if let Some(p) = &args.fence_log {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)?;
        config = config.on_write(fence_log_hook(file));
    }
    let read_metrics = ReadPathMetrics::new();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let workload = example::build(
        example::Clients::split(client.clone(), read_client),
        ownership.clone(),
        handle.leadership(),
        config,
        &read_metrics,
        async move {
            let _ = stop_rx.await;
        },
    )
    .map_err(|e| RunError::failed(e.to_string()))?;

    // metrics
    let mut registry = Registry::default();
    read_metrics.register(&mut registry);
    workload.metrics.register(&mut registry);
    handle.metrics().register(&mut registry);
    if let Some(d) = &duty {
        d.metrics().register(&mut registry);
    }
    workload.gc_metrics.register(&mut registry);

    let group_task = tokio::spawn(group_task);
    if let Some(addr) = args.metrics_addr {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let local = listener.local_addr()?;
        let state = http::State {
            registry: Arc::new(registry),
            handle: handle.clone(),
            stats: workload.stats.clone(),
            metrics: workload.metrics.clone(),
        };
        tokio::spawn(http::serve(listener, state));
        println!("metrics http://{local}");
        let _ = std::io::stdout().flush();
    }
    let controller = tokio::spawn(workload.controller);
    let singleton = tokio::spawn(workload.singleton);

    let mut group_task = group_task;
    tokio::select! {
        biased; // the group task's end first: when both are ready, its error is what to report
        r = &mut group_task => {
            let _ = stop_tx.send(());
            let _ = controller.await;
            return match r {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(RunError::failed(format!("shard group ended: {e}"))),
                Err(e) => Err(RunError::failed(format!("shard group task: {e}"))),
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
        Ok(Ok(Err(e))) => Err(RunError::failed(format!("shard group ended: {e}"))),
        Ok(Err(e)) => Err(RunError::failed(format!("shard group task: {e}"))),
        Err(_) => Err(RunError::failed(format!(
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
pub async fn shutdown_signal() -> std::io::Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        biased; // either signal means leave; the order only makes the choice deterministic
        r = tokio::signal::ctrl_c() => r,
        _ = term.recv() => Ok(()),
    }
}

#[cfg(not(unix))]
pub async fn shutdown_signal() -> std::io::Result<()> {
    tokio::signal::ctrl_c().await
}
