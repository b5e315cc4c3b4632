//! The two sides: a stock `kube_runtime` leader (`watcher` + `reflector` + `Controller`), and kube-shard
//! members (`ShardGroup` + `ShardedWatcher` + the reconcile wrapper + `FencedApi`), both with
//! `predicate_filter(generation)` (or without, for the relist comparison), the controller's default
//! trigger backoff, and the same reconcile body.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::controller::{self, Action};
use kube::runtime::reflector::{self, store::Writer};
use kube::runtime::{predicates, watcher, Controller, WatchStreamExt};
use kube_shard::group::{GroupHandle, PodRef, ShardGroup};
use kube_shard::ownership::fenced_write::{self, FencedApi};
use kube_shard::ownership::{reconcile, FenceError};
use kube_shard::{Permit, ShardedWatcher};
use kube_shard_testserver::{Scope, TestServer};
use serde_json::json;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::cluster::{item_resource, items, Ledger, NS};
use crate::BenchError;

/// The reconcile's simulated work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Workload {
    /// Simulated external I/O per reconcile (a sleep).
    pub io: Duration,
    /// Busy CPU work per reconcile (a spin on the worker thread).
    pub cpu: Duration,
}

/// The group's timings (the same for every kube-shard run; a stock leader waits `lease` after a kill).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Timings {
    /// `lease_duration`.
    pub lease: Duration,
    /// `renew_deadline`.
    pub renew: Duration,
    /// `retry_period`.
    pub retry: Duration,
    /// `takeover_grace`.
    pub grace: Duration,
}

impl Timings {
    /// Lease 6 s, renew deadline 4 s, retry 0.5 s, grace 0.5 s (the demo's scale).
    #[must_use]
    pub fn bench() -> Self {
        Timings {
            lease: Duration::from_secs(6),
            renew: Duration::from_secs(4),
            retry: Duration::from_millis(500),
            grace: Duration::from_millis(500),
        }
    }
}

/// Who reconciles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Side {
    /// One stock leader at this concurrency.
    Leader {
        /// `controller::Config::concurrency`.
        concurrency: u16,
    },
    /// kube-shard members, each at concurrency 4.
    Sharded {
        /// N.
        replicas: usize,
    },
}

impl Side {
    /// A short label for tables.
    #[must_use]
    pub fn label(self) -> String {
        match self {
            Side::Leader { concurrency } => format!("1 leader, concurrency {concurrency}"),
            Side::Sharded { replicas } => format!("kube-shard N={replicas}, concurrency 4 each"),
        }
    }
}

/// Per-replica context.
pub(crate) struct Ctx {
    ledger: Arc<Ledger>,
    api: Api<DynamicObject>,
    work: Workload,
    /// (start of the phase, first reconcile since then)
    clock: Mutex<(Instant, Option<Duration>)>,
}

impl Ctx {
    /// Seconds from the start of the phase until this replica's first reconcile.
    pub(crate) fn first_reconcile(&self) -> Option<f64> {
        self.clock
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .1
            .map(|d| d.as_secs_f64())
    }

    /// A new phase starts at `at`.
    pub(crate) fn reset_clock(&self, at: Instant) {
        *self.clock.lock().unwrap_or_else(|e| e.into_inner()) = (at, None);
    }

    /// The shared reconcile body: simulated work, then whether the status is behind.
    async fn work(&self, obj: &DynamicObject) -> Result<(String, i64, bool), Error> {
        self.ledger
            .reconciles
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        {
            let mut c = self.clock.lock().unwrap_or_else(|e| e.into_inner());
            let since = c.0;
            c.1.get_or_insert_with(|| since.elapsed());
        }
        if !self.work.io.is_zero() {
            tokio::time::sleep(self.work.io).await;
        }
        if !self.work.cpu.is_zero() {
            let end = std::time::Instant::now() + self.work.cpu;
            while std::time::Instant::now() < end {
                std::hint::spin_loop();
            }
        }
        let name = obj.metadata.name.clone().ok_or(Error::Missing("name"))?;
        let generation = obj.metadata.generation.unwrap_or(0);
        let observed = obj.data["status"]["observedGeneration"]
            .as_i64()
            .unwrap_or(0);
        Ok((name, generation, observed < generation))
    }
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    #[error("{0}")]
    Kube(#[from] kube::Error),
    #[error("{0}")]
    Fence(#[from] FenceError),
    #[error("{0}")]
    Write(#[from] fenced_write::Error),
    #[error("item without metadata.{0}")]
    Missing(&'static str),
}

fn status(generation: i64) -> serde_json::Value {
    json!({"status": {"observedGeneration": generation}})
}

async fn reconcile_leader(obj: Arc<DynamicObject>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let (name, generation, behind) = ctx.work(&obj).await?;
    if behind {
        ctx.api
            .patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(status(generation)),
            )
            .await?;
        ctx.ledger.written(&name, generation);
    }
    Ok(Action::await_change())
}

async fn reconcile_member(
    obj: Arc<DynamicObject>,
    ctx: Arc<Ctx>,
    permit: Permit,
) -> Result<Action, Error> {
    let (name, generation, behind) = ctx.work(&obj).await?;
    if behind {
        FencedApi::new(ctx.api.clone())
            .patch_status(
                &permit,
                obj.as_ref(),
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&status(generation)),
            )
            .await?;
        ctx.ledger.written(&name, generation);
    }
    Ok(Action::await_change())
}

fn error_policy(_obj: Arc<DynamicObject>, err: &Error, _ctx: Arc<Ctx>) -> Action {
    let quick = matches!(err, Error::Write(e) if e.is_conflict());
    let base = if quick { 200 } else { 500 };
    Action::requeue(kube_shard::jitter(Duration::from_millis(base)))
}

/// How every replica of a configuration runs.
#[derive(Clone, Copy, Debug)]
pub(crate) struct How {
    pub(crate) work: Workload,
    pub(crate) timings: Timings,
    pub(crate) predicate: bool,
}

/// A running replica: its tasks, its client identity and its context.
pub(crate) struct Replica {
    pub(crate) identity: String,
    pub(crate) ctx: Arc<Ctx>,
    tasks: Vec<JoinHandle<()>>,
    group: Option<GroupHandle>,
    /// A member's Pod (its name in [`NS`]): created at its start, deleted at its kill, as a Deployment's.
    pod: Option<String>,
}

/// Self-fences of every kube-shard replica so far (a renewal delayed past `renew_deadline`, e.g. by a
/// loaded machine): un-fencing re-enqueues the member's owned shards, by design.
pub(crate) fn self_fences(replicas: &[Replica]) -> u64 {
    replicas
        .iter()
        .filter_map(|r| r.group.as_ref())
        .map(|g| g.metrics().snapshot().self_fences)
        .sum()
}

/// What each replica's group status says (for an error message when a phase does not finish).
pub(crate) fn describe(replicas: &[Replica]) -> String {
    replicas
        .iter()
        .map(|r| match &r.group {
            Some(g) => {
                let s = g.status();
                format!(
                    "{}: joined {} coordinator {} generation {} owned {} live {} moving {} self-fenced {}",
                    s.member, s.joined, s.coordinator, s.generation, s.owned.len(), s.live_members,
                    s.moves_in_flight, s.self_fenced
                )
            }
            None => format!("{}: leader", r.identity),
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Whether any member is coordinator, and how many shards the members own in all (`None` for a leader).
pub(crate) fn group_progress(replicas: &[Replica]) -> Option<(bool, usize)> {
    let groups: Vec<_> = replicas.iter().filter_map(|r| r.group.as_ref()).collect();
    if groups.is_empty() {
        return None;
    }
    let st: Vec<_> = groups.iter().map(|g| g.status()).collect();
    Some((
        st.iter().any(|s| s.coordinator),
        st.iter().map(|s| s.owned.len()).sum(),
    ))
}

/// Start `side` (every replica) on `server`; `round` makes the client identities unique per start.
pub(crate) async fn start(
    side: Side,
    server: &TestServer,
    ledger: &Arc<Ledger>,
    how: How,
    round: usize,
    same_names: bool,
) -> Result<Vec<Replica>, BenchError> {
    let How {
        work,
        timings,
        predicate,
    } = how;
    let since = Instant::now();
    match side {
        Side::Leader { concurrency } => {
            let identity = format!("leader-r{round}");
            let ctx = new_ctx(server, &identity, ledger, work, since);
            let task = tokio::spawn(run_leader(
                items(server.client(&identity)),
                concurrency,
                ctx.clone(),
                predicate,
            ));
            Ok(vec![Replica {
                identity,
                ctx,
                tasks: vec![task],
                group: None,
                pod: None,
            }])
        }
        Side::Sharded { replicas } => {
            let mut out = Vec::new();
            for i in 0..replicas {
                let identity = format!("member-{i}-r{round}");
                // a Deployment's pods come back under new names, a StatefulSet's under the same
                let name = if same_names {
                    format!("member-{i}")
                } else {
                    identity.clone()
                };
                let ctx = new_ctx(server, &identity, ledger, work, since);
                let pod = create_pod(server, &name).await?;
                let (tasks, group) = start_member(
                    server,
                    (&identity, &name, pod),
                    replicas,
                    timings,
                    ctx.clone(),
                    predicate,
                )?;
                out.push(Replica {
                    identity,
                    ctx,
                    tasks,
                    group: Some(group),
                    pod: Some(name),
                });
            }
            Ok(out)
        }
    }
}

fn new_ctx(
    server: &TestServer,
    identity: &str,
    ledger: &Arc<Ledger>,
    work: Workload,
    since: Instant,
) -> Arc<Ctx> {
    Arc::new(Ctx {
        ledger: ledger.clone(),
        api: items(server.client(identity)),
        work,
        clock: Mutex::new((since, None)),
    })
}

async fn run_leader(api: Api<DynamicObject>, concurrency: u16, ctx: Arc<Ctx>, predicate: bool) {
    let ar = item_resource();
    let writer = Writer::<DynamicObject>::new(ar.clone());
    let reader = writer.as_reader();
    let applied =
        reflector::reflector(writer, watcher(api, watcher::Config::default())).applied_objects();
    let config = controller::Config::default().concurrency(concurrency);
    let run = |c: Controller<DynamicObject>| {
        c.with_config(config.clone())
            .run(reconcile_leader, error_policy, ctx.clone())
            .for_each(|_| async {})
    };
    if predicate {
        let s = applied.predicate_filter(predicates::generation, Default::default());
        run(Controller::for_stream_with(s, reader, ar)).await;
    } else {
        run(Controller::for_stream_with(applied, reader, ar)).await;
    }
}

/// The member's Pod `name` in [`NS`] (what the downward API would tell it: its uid).
async fn create_pod(server: &TestServer, name: &str) -> Result<PodRef, BenchError> {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NS},
        "spec": {"containers": [{"name": "operator", "image": "bench/operator:1"}]},
    }))
    .map_err(|e| BenchError::Library(format!("a Pod: {e}")))?;
    let made = Api::<Pod>::namespaced(server.client("bench-kubelet"), NS)
        .create(&PostParams::default(), &pod)
        .await
        .map_err(|e| BenchError::Cluster(format!("creating Pod {name}: {e}")))?;
    Ok(PodRef::new(NS, name, made.metadata.uid.unwrap_or_default()))
}

fn start_member(
    server: &TestServer,
    (identity, name, pod): (&str, &str, PodRef),
    replicas: usize,
    t: Timings,
    ctx: Arc<Ctx>,
    predicate: bool,
) -> Result<(Vec<JoinHandle<()>>, GroupHandle), BenchError> {
    let client = server.client(identity);
    let group = ShardGroup::builder(client.clone(), "bench", NS)
        .member(name)
        .pod(Some(pod))
        .timings(t.lease, t.renew, t.retry)
        .takeover_grace(t.grace)
        .fence_margin(Duration::from_millis(500))
        .drain_timeout(t.renew)
        .settle(Duration::from_secs(2), Duration::from_secs(1))
        .expected_replicas(replicas as u32)
        .build()
        .map_err(|e| BenchError::Library(format!("shard group: {e}")))?;
    let (handle, group_task) = group.start();
    let ownership = handle.ownership();
    let ar = item_resource();
    let sharded = ShardedWatcher::new_with(
        items(client),
        watcher::Config::default(),
        ownership.clone(),
        ar.clone(),
    )
    .build_reflector();
    let store = sharded.store.clone();
    let group_handle = handle.clone();
    let group_task = tokio::spawn(async move {
        let _ = group_task.await;
    });
    let applied = sharded.events.applied_objects();
    let reenqueue = sharded.reenqueue;
    let config = controller::Config::default().concurrency(4);
    let wrapped = reconcile::wrap(ownership, reconcile_member);
    let controller = if predicate {
        let s = applied.predicate_filter(predicates::generation, Default::default());
        tokio::spawn(
            Controller::for_stream_with(s, store, ar)
                .with_config(config)
                .reconcile_on(reenqueue)
                .run(wrapped, error_policy, ctx)
                .for_each(|_| async {}),
        )
    } else {
        tokio::spawn(
            Controller::for_stream_with(applied, store, ar)
                .with_config(config)
                .reconcile_on(reenqueue)
                .run(wrapped, error_policy, ctx)
                .for_each(|_| async {}),
        )
    };
    Ok((vec![group_task, controller], group_handle))
}

/// SIGKILL, in process: abort every task and cut the old identity off for good, so whatever the aborted
/// tasks left running (spawned streams) can no longer reach the server — as with a dead process; and
/// delete the members' Pods, as a restart of a Deployment (a rollout, a node pool replaced) does.
pub(crate) async fn kill(server: &TestServer, replicas: Vec<Replica>) {
    let pods: Api<Pod> = Api::namespaced(server.client("bench-kubelet"), NS);
    for r in replicas {
        for t in r.tasks {
            t.abort();
        }
        server
            .faults()
            .partition(Scope::identity(r.identity.clone()), true);
        if let Some(p) = r.pod {
            let _ = pods.delete(&p, &DeleteParams::default()).await;
        }
    }
}

/// The client identities of running replicas.
pub(crate) fn identities(replicas: &[Replica]) -> Vec<String> {
    replicas.iter().map(|r| r.identity.clone()).collect()
}

/// Reset every replica's first-reconcile clock to `at`.
pub(crate) fn reset_clocks(replicas: &[Replica], at: Instant) {
    for r in replicas {
        r.ctx.reset_clock(at);
    }
}

/// Each replica's first reconcile since its clock was reset (s; NaN for none).
pub(crate) fn firsts(replicas: &[Replica]) -> Vec<f64> {
    replicas
        .iter()
        .map(|r| r.ctx.first_reconcile().unwrap_or(f64::NAN))
        .collect()
}
