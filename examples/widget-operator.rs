//! A sharded operator in one file: the public API of `kube_shard` as an operator author uses it.
//!
//! Every replica joins a **shard group** (`ShardGroup`) and gets its `Ownership`; it reads only the Widgets
//! of its own shards (`ShardedWatcher`, KEP-5866 `shardSelector`) and their child ConfigMaps (a dependent
//! sharded watcher placed by the controller ownerReference), reconciles through `reconcile::wrap` (only
//! owned objects reach `apply`), and writes the child and the status `observedGeneration`/`reconciledBy`/
//! `epoch` with fenced writes (`FencedApi`). Work that must run once per group — deleting children whose
//! Widget is gone, as a bare API server has no garbage collector — runs as a singleton on the coordinator
//! (`run_singleton`, with a fencing term). On shutdown a member leaves gracefully (`handle.leave()`): its
//! shards move to the others first.
//!
//! ```sh
//! # self-contained and self-checking: an in-process API server, 3 members, 200 Widgets, then the
//! # coordinator leaves while every Widget changes; exits 0 when all checks held (non-zero after 60 s)
//! cargo run --example widget-operator
//!
//! # one member against a running API server, until Ctrl-C (then it leaves gracefully, within 30 s)
//! kshard-dev testserver --listen 127.0.0.1:0 --kubeconfig-out /tmp/wo.yaml --shard-selector on &
//! cargo run --example widget-operator -- --kubeconfig /tmp/wo.yaml --identity a [--replicas 2] [--create 20]
//! kshard status --kubeconfig /tmp/wo.yaml -n default --group widget-operator
//! ```
//!
//! `--replicas N` plans at once when N members are present; `--create N` creates N Widgets. The client is
//! built with this crate's `kube`, which has no TLS feature: only `http://` servers such as `kshard
//! testserver` work (enable `rustls-tls` in your operator). The last member to leave has nobody to hand
//! its shards to: it self-fences and ends at once (so do members that all leave together). Timings are
//! short for a demo; the
//! library defaults (lease 15 s, renew deadline 10 s, retry 2 s) suit production. The full version
//! (metrics, health endpoints, every flag) is `kshard operator`, whose start-up is `example-operator/src/run/`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams, Preconditions,
};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{controller::Action, watcher, Controller, WatchStreamExt};
use kube::{Api, Client, Resource, ResourceExt};
use kube_shard::group::{GroupError, GroupHandle, ShardGroup, SingletonGuard};
use kube_shard::jitter;
use kube_shard::{fenced_write, FencedApi};
use kube_shard::{reconcile, FenceError};
use kube_shard::{watcher::Dependency, Permit, ShardedWatcher};
use kube_shard_testserver::TestServer;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::task::JoinHandle;
use tokio::time::{sleep, timeout_at, Instant};

type BoxError = Box<dyn std::error::Error>;

const GROUP: &str = "widget-operator"; // the shard group: names its Leases and assignment ConfigMap
const NAMESPACE: &str = "default"; // of the group's Leases and of the Widgets created here
const CHILD_LABEL: &str = "example.kube-shard.io/widget"; // on every child ConfigMap
const CRD_NAME: &str = "widgets.example.kube-shard.io";

// ---- the Widget custom resource (reduced from example-operator/src/widget.rs) ----

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct Widget {
    api_version: String,
    kind: String,
    metadata: ObjectMeta,
    spec: WidgetSpec,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<WidgetStatus>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
struct WidgetSpec {
    size: Option<i64>,
    message: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct WidgetStatus {
    observed_generation: Option<i64>,
    reconciled_by: Option<String>,
    epoch: Option<u64>, // of the fence the status was written under
}

impl Resource for Widget {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;
    fn kind(_: &()) -> std::borrow::Cow<'_, str> {
        "Widget".into()
    }
    fn group(_: &()) -> std::borrow::Cow<'_, str> {
        "example.kube-shard.io".into()
    }
    fn version(_: &()) -> std::borrow::Cow<'_, str> {
        "v1".into()
    }
    fn plural(_: &()) -> std::borrow::Cow<'_, str> {
        "widgets".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

fn new_widget(name: &str, size: u32) -> Result<Widget, serde_json::Error> {
    serde_json::from_value(
        json!({"apiVersion": "example.kube-shard.io/v1", "kind": "Widget",
        "metadata": {"name": name}, "spec": {"size": size}}),
    )
}

/// `Ok` also when the object exists already (409): replicas may race to create it.
fn created<T>(result: Result<T, kube::Error>) -> Result<(), kube::Error> {
    match result {
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        r => r.map(drop),
    }
}

/// Install the CRD (every replica may) and wait until it is Established.
async fn install_crd(client: Client) -> Result<(), BoxError> {
    let schema = json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true});
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "metadata": {"name": CRD_NAME},
        "spec": {"group": "example.kube-shard.io", "scope": "Namespaced",
            "names": {"kind": "Widget", "plural": "widgets", "singular": "widget"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "subresources": {"status": {}}, "schema": {"openAPIV3Schema": schema}}]}}))?;
    let api: Api<CustomResourceDefinition> = Api::all(client);
    created(api.create(&PostParams::default(), &crd).await)?;
    for _ in 0..50 {
        let status = api.get(CRD_NAME).await?.status;
        let mut conditions = status.and_then(|s| s.conditions).into_iter().flatten();
        if conditions.any(|c| c.type_ == "Established" && c.status == "True") {
            return Ok(());
        }
        sleep(ms(200)).await;
    }
    Err("the Widget CRD did not become Established".into())
}

fn ms(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

// ---- one member of the group: ownership, the sharded read path, the controller, the singleton ----

struct Member {
    handle: GroupHandle,
    ctx: Arc<Ctx>,
    task: JoinHandle<Result<(), GroupError>>, // the member's renewals; ends after a graceful leave
    workers: [JoinHandle<()>; 2],             // the controller and the singleton
}

/// What `apply` and the singleton share.
struct Ctx {
    client: Client,
    name: String,
    children: Store<ConfigMap>, // this member's sharded cache of child ConfigMaps
    reconciles: AtomicU64,
    retries: AtomicU64,
    singleton_term: AtomicU64, // the last term this member ran the singleton in (0: never)
}

/// Join the group as `name` and run the operator. `replicas`: plan at once when that many have joined.
/// `own_thread`: run the member's renewals on their own thread and runtime, with a client from this config.
async fn start_member(
    client: Client,
    name: &str,
    replicas: Option<u32>,
    own_thread: Option<kube::Config>,
) -> Result<Member, BoxError> {
    let mut builder = ShardGroup::builder(client.clone(), GROUP, NAMESPACE)
        .member(name)
        .timings(ms(5000), ms(3500), ms(500)) // lease, renew deadline, retry period
        .takeover_grace(ms(500))
        .drain_timeout(ms(3000))
        .settle(ms(2000), ms(1000));
    if let Some(n) = replicas {
        builder = builder.expected_replicas(n);
    }
    if let Some(config) = own_thread {
        builder = builder.dedicated_thread(config);
    }
    let (handle, task) = builder.build()?.start();
    let ownership = handle.ownership();

    // The read streams exist before the group task first runs: a shard is warm when all have read it.
    let api = Api::<Widget>::all(client.clone());
    let widgets = ShardedWatcher::new(api, watcher::Config::default(), ownership.clone());
    let widgets = widgets.build_reflector();
    let api = Api::<ConfigMap>::all(client.clone());
    let ours = watcher::Config::default().labels(CHILD_LABEL);
    let children = ShardedWatcher::new(api, ours, ownership.clone())
        .dependent(Dependency::controller_owner())? // a child is read with its Widget's shard
        .build_reflector();
    let task = tokio::spawn(task);

    let ctx = Arc::new(Ctx {
        client,
        name: name.to_owned(),
        children: children.store.clone(),
        reconciles: AtomicU64::new(0),
        retries: AtomicU64::new(0),
        singleton_term: AtomicU64::new(0),
    });
    let store = widgets.store.clone();
    let controller = Controller::for_stream(widgets.events.applied_objects(), store)
        .owns_stream(children.events.touched_objects())
        .reconcile_on(widgets.reenqueue) // every Widget of a shard that became ours
        .run(reconcile::wrap(ownership, apply), error_policy, ctx.clone())
        .for_each(|_| async {});
    let c = ctx.clone();
    let singleton = handle
        .leadership()
        .run_singleton("orphans", move |g| collect_orphans(g, c.clone()));
    let workers = [tokio::spawn(controller), tokio::spawn(singleton)];
    Ok(Member {
        handle,
        ctx,
        task,
        workers,
    })
}

#[derive(Debug, thiserror::Error)]
enum ReconcileError {
    #[error("no longer the owner: {0}")]
    Fence(#[from] FenceError),
    #[error("fenced write: {0}")]
    Write(#[from] fenced_write::Error),
    #[error("a Widget without name, namespace, uid or resourceVersion")]
    Incomplete,
}

/// Runs only for Widgets this member owns now: `permit` proves it; a fence taken from it right before
/// each write makes the write fail once the shard has moved on.
async fn apply(w: Arc<Widget>, ctx: Arc<Ctx>, permit: Permit) -> Result<Action, ReconcileError> {
    ctx.reconciles.fetch_add(1, Relaxed);
    let m = &w.metadata;
    let (Some(name), Some(ns), Some(_), Some(_)) =
        (&m.name, &m.namespace, &m.uid, &m.resource_version)
    else {
        return Err(ReconcileError::Incomplete);
    };

    // 1. the child ConfigMap mirrors the spec (read from this member's sharded cache of children)
    let size = w.spec.size.map(|s| ("size".to_owned(), s.to_string()));
    let message = w.spec.message.clone().map(|s| ("message".to_owned(), s));
    let data: BTreeMap<_, _> = size.into_iter().chain(message).collect();
    let child_name = format!("{name}-widget");
    let cms = FencedApi::new(Api::<ConfigMap>::namespaced(ctx.client.clone(), ns));
    match ctx.children.get(&ObjectRef::new(&child_name).within(ns)) {
        None => {
            let mut child = ConfigMap::default();
            child.metadata.name = Some(child_name);
            child.metadata.labels = Some([(CHILD_LABEL.to_owned(), name.clone())].into());
            child.metadata.owner_references = w.controller_owner_ref(&()).map(|o| vec![o]);
            child.data = Some(data);
            match cms.create(&permit.fence()?, &child).await {
                // created before and not in our cache yet: its watch event triggers us again
                Err(e) if e.is_already_exists() => {}
                Err(e) => return Err(e.into()),
                Ok(_) => {}
            }
        }
        Some(child) if child.data.as_ref() != Some(&data) => {
            let mut child = (*child).clone(); // its uid and resourceVersion are the preconditions
            child.data = Some(data);
            cms.replace(&permit, &child).await?;
        }
        Some(_) => {}
    }

    // 2. the status, conditional on the uid and resourceVersion this reconcile read
    let fence = permit.fence()?;
    let want = WidgetStatus {
        observed_generation: m.generation,
        reconciled_by: Some(ctx.name.clone()),
        epoch: Some(fence.epoch()),
    };
    if w.status.as_ref() != Some(&want) {
        let widgets = FencedApi::new(Api::<Widget>::namespaced(ctx.client.clone(), ns));
        let patch = json!({ "status": want });
        widgets
            .patch_status(
                &fence,
                w.as_ref(),
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await?;
    }
    Ok(Action::await_change())
}

fn error_policy(_: Arc<Widget>, _: &ReconcileError, ctx: Arc<Ctx>) -> Action {
    ctx.retries.fetch_add(1, Relaxed); // mostly 409s: a newer version is on its way
    Action::requeue(jitter(ms(500)))
}

/// The singleton: while this member leads, delete the children whose Widget is gone. Children are listed
/// before Widgets, so a Widget missing from the later list was really deleted (not created since).
async fn collect_orphans(guard: SingletonGuard, ctx: Arc<Ctx>) {
    ctx.singleton_term.store(guard.term(), Relaxed);
    let children = Api::<ConfigMap>::all(ctx.client.clone());
    let widgets = Api::<Widget>::all(ctx.client.clone());
    loop {
        sleep(ms(1000)).await;
        let kids = children.list_metadata(&labelled()).await;
        let live = widgets.list_metadata(&ListParams::default()).await;
        let (Ok(kids), Ok(live)) = (kids, live) else {
            continue;
        };
        let live: BTreeSet<_> = live.items.iter().filter_map(|w| w.uid()).collect();
        for kid in kids.items {
            let owner = kid
                .owner_references()
                .iter()
                .find(|o| o.controller == Some(true));
            if owner.is_none_or(|o| live.contains(&o.uid)) {
                continue;
            }
            if guard.check().is_err() {
                return; // the term ended: whoever leads next collects the rest
            }
            let ns = kid.namespace().unwrap_or_default();
            let api = Api::<ConfigMap>::namespaced(ctx.client.clone(), &ns);
            let dp = DeleteParams::default().preconditions(Preconditions {
                uid: kid.uid(), // this child, never a successor of the same name
                resource_version: None,
            });
            let _ = api.delete(&kid.name_any(), &dp).await;
        }
    }
}

/// Leave gracefully (as on SIGTERM): the shards move to the others first, then the group task ends.
async fn leave(m: Member, deadline: Instant) -> Result<Duration, BoxError> {
    let started = Instant::now();
    m.handle.leave();
    let left = timeout_at(deadline, m.task).await;
    m.workers.iter().for_each(JoinHandle::abort);
    match left {
        Ok(result) => Ok(result?.map(|()| started.elapsed())?),
        // nobody took the shards (the last member, or all leaving at once): its Lease expires instead
        Err(_) => Err(format!("{}: the graceful leave did not finish in time", m.ctx.name).into()),
    }
}

fn describe(m: &Member) -> String {
    let (status, c) = (m.handle.status(), &m.ctx);
    let (name, owned, n) = (&c.name, &status.owned, status.owned.len());
    let leads = status.coordinator;
    let role = if leads { ", coordinator" } else { "" };
    let (count, retried) = (c.reconciles.load(Relaxed), c.retries.load(Relaxed));
    let term = c.singleton_term.load(Relaxed);
    let shards = format!("{name}{role}: owns {n} shards [{owned}]");
    format!("{shards}, {count} reconciles ({retried} retried), singleton term {term}")
}

fn labelled() -> ListParams {
    ListParams::default().labels(CHILD_LABEL)
}

// ---- default mode: self-contained and self-checking on the in-process API server ----

async fn self_check() -> Result<(), BoxError> {
    let (start, n) = (Instant::now(), 200);
    let deadline = start + Duration::from_secs(60);
    let server = TestServer::builder().shard_selector(true).build(); // KEP-5866 gate on
    let admin = server.client("admin");
    install_crd(admin.clone()).await?;
    let mut members = Vec::new();
    for i in 0..3 {
        let name = format!("member-{i}"); // each with its own client (and server-side accounting)
        members.push(start_member(server.client(&name), &name, Some(3), None).await?);
    }
    let widgets: Api<Widget> = Api::namespaced(admin.clone(), NAMESPACE);
    for i in 0..n {
        let widget = new_widget(&format!("widget-{i:03}"), i)?;
        widgets.create(&PostParams::default(), &widget).await?;
    }
    wait_reconciled(&admin, &members, deadline).await?;
    let took = start.elapsed();
    println!("{n} Widgets reconciled by the owners of their shards after {took:.1?}:");
    members.iter().for_each(|m| println!("  {}", describe(m)));

    // The coordinator leaves while every Widget changes and every 20th is deleted: its shards move to
    // the others; the singleton follows the coordinator Lease and collects the deleted ones' children.
    let i = members.iter().position(|m| m.handle.status().coordinator);
    let leaver = members.remove(i.unwrap_or(0));
    let (ctx, shards) = (leaver.ctx.clone(), leaver.handle.status().owned.len());
    let changes = async {
        let touch = json!({"spec": {"message": "touched"}});
        for i in 0..n {
            let name = format!("widget-{i:03}");
            if i % 20 == 0 {
                widgets.delete(&name, &DeleteParams::default()).await?;
            } else {
                let pp = PatchParams::default();
                widgets.patch(&name, &pp, &Patch::Merge(&touch)).await?;
            }
        }
        Ok::<_, kube::Error>(())
    };
    let (left, changed) = tokio::join!(leave(leaver, deadline), changes);
    let (took, (), changed_at) = (left?, changed?, Instant::now());
    wait_reconciled(&admin, &members, deadline).await?;
    let after = changed_at.elapsed();
    let who = &ctx.name;
    println!("{who} left in {took:.1?} under writes; all reconciled again {after:.1?} later:");
    members.iter().for_each(|m| println!("  {}", describe(m)));

    let violations = server.fence_violations();
    if violations > 0 {
        return Err(format!("the server saw {violations} fenced writes out of epoch order").into());
    }
    let terms = members.iter().map(|m| m.ctx.singleton_term.load(Relaxed));
    let (t0, t1) = (ctx.singleton_term.load(Relaxed), terms.max().unwrap_or(0));
    println!("summary: OK in {:.1?}", start.elapsed());
    println!("  3 members reconciled {n} Widgets, each by the owner of its shard");
    println!("  {who} left gracefully: its {shards} shards and the singleton moved to the others");
    let orphans = n / 20; // wait_reconciled saw no child left without its Widget
    println!("  singleton term {t0} -> {t1}; {orphans} orphaned children collected");
    println!("  0 fence violations seen by the server");
    Ok(())
}

/// Wait until every Widget's status shows its current generation reconciled by the member that owns
/// its shard, and each child ConfigMap has its Widget (the singleton deleted the orphans).
async fn wait_reconciled(admin: &Client, members: &[Member], end: Instant) -> Result<(), BoxError> {
    let widgets: Api<Widget> = Api::namespaced(admin.clone(), NAMESPACE);
    let children: Api<ConfigMap> = Api::namespaced(admin.clone(), NAMESPACE);
    let done = |w: &Widget| {
        let owns = |m: &&Member| {
            let shard = m.handle.ownership().shard_of(w);
            shard.is_ok_and(|s| m.handle.status().owned.contains(s))
        };
        let owner = members.iter().find(owns).map(|m| &m.ctx.name);
        let status = w.status.clone().unwrap_or_default();
        let by_owner = owner.is_some() && status.reconciled_by.as_ref() == owner;
        by_owner && status.observed_generation == w.metadata.generation
    };
    loop {
        let all = widgets.list(&ListParams::default()).await?.items;
        let kids = children.list_metadata(&labelled()).await?.items.len();
        let (n, ok) = (all.len(), all.iter().filter(|w| done(w)).count());
        if ok == n && kids == n {
            return Ok(());
        }
        if Instant::now() >= end {
            let msg = format!("{ok} of {n} Widgets reconciled by their owner, {kids} children");
            return Err(format!("timed out after 60 s: {msg}").into());
        }
        sleep(ms(200)).await;
    }
}

// ---- member mode: one member against a running API server, until Ctrl-C ----

async fn run_member(args: &BTreeMap<String, String>) -> Result<(), BoxError> {
    let (Some(path), Some(identity)) = (args.get("--kubeconfig"), args.get("--identity")) else {
        return Err("member mode needs --kubeconfig PATH and --identity NAME".into());
    };
    let number = |flag: &str| {
        let value = args.get(flag).map(|v| v.parse::<u32>()).transpose();
        value.map_err(|e| format!("{flag}: {e}"))
    };
    let (replicas, create) = (number("--replicas")?, number("--create")?.unwrap_or(0));
    let kubeconfig =
        kube::config::Kubeconfig::read_from(path).map_err(|e| format!("{path}: {e}"))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
    let client = Client::try_from(config.clone())?;
    install_crd(client.clone()).await?;
    let member = start_member(client.clone(), identity, replicas, Some(config)).await?;
    let widgets: Api<Widget> = Api::namespaced(client, NAMESPACE);
    for i in 0..create {
        let widget = new_widget(&format!("{identity}-{i}"), i)?;
        created(widgets.create(&PostParams::default(), &widget).await)?;
    }
    println!("{identity}: joined group {NAMESPACE}/{GROUP}; Ctrl-C leaves gracefully");
    let mut every = tokio::time::interval(Duration::from_secs(5));
    loop {
        tokio::select! {
            r = tokio::signal::ctrl_c() => { r?; break; }
            _ = every.tick() => println!("{}", describe(&member)),
        }
    }
    println!("{identity}: leaving (the shards move to the others first)");
    let took = leave(member, Instant::now() + Duration::from_secs(30)).await?;
    println!("{identity}: left after {took:.1?}");
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let known = ["--kubeconfig", "--identity", "--replicas", "--create"];
    let (mut args, mut it) = (BTreeMap::new(), std::env::args().skip(1));
    while let Some(flag) = it.next() {
        if !known.contains(&flag.as_str()) {
            return Err(format!("unknown argument {flag:?} (flags: {})", known.join(" ")).into());
        }
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        args.insert(flag, value);
    }
    if args.is_empty() {
        self_check().await
    } else {
        run_member(&args).await
    }
}
