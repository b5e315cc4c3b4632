//! Scenario families of the safety review (issue 14, steps 4 and 5) on testserver's in-memory API server
//! in paused time, with the whole stack where the scenario needs it: a `ShardGroup`, a sharded reflector
//! and a kube `Controller` whose trigger stream goes through `predicate_filter(generation)`.
//!
//! No lost work through `predicate_filter`: the filter drops every re-emission of a generation it has
//! already passed, and the admission wrapper answers `await_change` to a held or self-fenced member, so an
//! object whose last reconcile did not succeed and that never changes again is reconciled only if the
//! library re-enqueues it (`Sharded::reenqueue`) when its shard becomes admitted.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ObjectMeta, PostParams};
use kube::Api;
use kube_shard::group::ShardGroupBuilder;
use kube_shard::ownership::fenced_write::FencedApi;
use kube_shard_testserver::TestServer;

use crate::group::{
    builder, check_fences, each_shard_owned_once, owned_count, until, FenceLog, Freeze, Member,
};
use crate::read_path::watcher::shard_of_uid;

const NS: &str = "widgets";

// === Widgets: a custom resource, so `metadata.generation` is maintained ===

fn widget_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("example.kube-shard.io", "v1", "Widget"),
        "widgets",
    )
}

fn widgets(server: &TestServer, who: &str) -> Api<DynamicObject> {
    Api::namespaced_with(server.client(who), NS, &widget_resource())
}

/// Install the Widget CRD and create `n` Widgets; name → uid.
async fn seed_widgets(server: &TestServer, n: usize) -> BTreeMap<String, String> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let admin = server.client("admin");
    let crd: CustomResourceDefinition = serde_json::from_value(serde_json::json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.kube-shard.io"},
        "spec": {
            "group": "example.kube-shard.io",
            "names": {"kind": "Widget", "plural": "widgets", "singular": "widget", "listKind": "WidgetList"},
            "scope": "Namespaced",
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}
            }]
        }
    }))
    .unwrap();
    Api::<CustomResourceDefinition>::all(admin.clone())
        .create(&PostParams::default(), &crd)
        .await
        .unwrap();
    Api::<Namespace>::all(admin)
        .create(
            &PostParams::default(),
            &Namespace {
                metadata: ObjectMeta {
                    name: Some(NS.into()),
                    ..ObjectMeta::default()
                },
                ..Namespace::default()
            },
        )
        .await
        .unwrap();
    let api = widgets(server, "admin");
    let mut out = BTreeMap::new();
    for i in 0..n {
        let mut w = DynamicObject::new(&format!("w-{i}"), &widget_resource()).within(NS);
        w.data = serde_json::json!({"spec": {"v": 0}});
        let w = api.create(&PostParams::default(), &w).await.unwrap();
        out.insert(w.metadata.name.unwrap(), w.metadata.uid.unwrap());
    }
    out
}

/// Change every Widget's spec (a new generation).
async fn bump_widgets(server: &TestServer, names: impl Iterator<Item = &String>, v: u32) {
    let api = widgets(server, "writer");
    for n in names {
        let patch = serde_json::json!({"spec": {"v": v}});
        api.patch(n, &Default::default(), &kube::api::Patch::Merge(&patch))
            .await
            .unwrap();
    }
}

// === a full-stack worker that records every reconcile ===

/// One reconcile the worker's reconciler ran (past the admission wrapper).
#[derive(Clone, Debug)]
struct Rec {
    member: String,
    name: String,
    generation: i64,
    ok: bool,
    at: tokio::time::Instant,
}

/// The reconciles the workers ran, and how many fenced stamps they committed.
#[derive(Clone, Default)]
struct Recs(Arc<Mutex<Vec<Rec>>>, Arc<AtomicUsize>);

impl Recs {
    fn any(&self, f: impl Fn(&Rec) -> bool) -> bool {
        self.0.lock().unwrap().iter().any(f)
    }

    /// `member` reconciled `name` at `generation` successfully.
    fn done(&self, member: &str, name: &str, generation: i64) -> bool {
        self.any(|r| r.ok && r.member == member && r.name == name && r.generation == generation)
    }

    fn failed(&self, member: &str, name: &str) -> bool {
        self.any(|r| !r.ok && r.member == member && r.name == name)
    }

    /// How many fenced stamps the workers committed.
    fn writes(&self) -> usize {
        self.1.load(Ordering::Relaxed)
    }
}

/// The annotation the Widget workers stamp, through `FencedApi`, with the generation they reconciled (a
/// metadata change: no new generation, so `predicate_filter` does not trigger on it).
const RECONCILED: &str = "example.kube-shard.io/reconciled";

/// A member with the whole stack: its group (from `b`), a sharded reflector of Widgets, and a Controller
/// whose trigger stream goes through `predicate_filter(generation)` and whose reconciles go through the
/// admission wrapper and stamp the generation on the Widget with a fenced patch. While `failing` is set,
/// every reconcile this member runs fails (the error policy retries it after a second); so does one whose
/// stamp does not commit (a conflict with the writer).
fn spawn_widget_worker(
    server: &TestServer,
    b: ShardGroupBuilder,
    name: &str,
    log: &FenceLog,
    recs: &Recs,
    failing: Arc<AtomicBool>,
) -> Member {
    spawn_widget_worker_late(server, b, name, log, recs, failing, None)
}

/// [`spawn_widget_worker`], whose watcher and Controller are created `late` after the group started
/// (`None`: before its task runs).
fn spawn_widget_worker_late(
    server: &TestServer,
    b: ShardGroupBuilder,
    name: &str,
    log: &FenceLog,
    recs: &Recs,
    failing: Arc<AtomicBool>,
    late: Option<Duration>,
) -> Member {
    use futures::FutureExt;

    let group = b.build().expect("valid config");
    let (handle, task) = group.start();
    let ownership = handle.ownership();
    log.observe(&ownership);
    let controller = match late {
        None => widget_controller(server, name, ownership, recs, failing).boxed(),
        Some(delay) => {
            let (server, name, recs) = (server.clone(), name.to_owned(), recs.clone());
            async move {
                tokio::time::sleep(delay).await;
                widget_controller(&server, &name, ownership, &recs, failing).await;
            }
            .boxed()
        }
    };
    let freeze = Freeze::default();
    let task = tokio::spawn(freeze.wrap(async move {
        let group = async move {
            if let Err(e) = task.await {
                panic!("member task failed: {e}");
            }
        };
        futures::future::join(group, controller).await;
    }));
    let logger = tokio::spawn(freeze.wrap(crate::group::fence_logger(
        name.to_owned(),
        handle.ownership(),
        log.clone(),
    )));
    Member {
        name: name.to_owned(),
        handle,
        task,
        logger,
        freeze,
    }
}

/// The sharded reflector of Widgets and the Controller over it (built now, run by the future).
fn widget_controller(
    server: &TestServer,
    name: &str,
    ownership: kube_shard::ownership::Ownership,
    recs: &Recs,
    failing: Arc<AtomicBool>,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    use futures::StreamExt;
    use kube::runtime::predicates;
    use kube::runtime::{controller::Action, watcher, Controller, PredicateConfig, WatchStreamExt};
    use kube_shard::ownership::reconcile;

    let sharded = kube_shard::ShardedWatcher::new_with(
        widgets(server, name),
        watcher::Config::default(),
        ownership.clone(),
        widget_resource(),
    )
    .barrier_timeout(Duration::from_secs(1))
    .build_reflector();
    let store = sharded.store.clone();
    let trigger = sharded
        .events
        .applied_objects()
        .predicate_filter(predicates::generation, PredicateConfig::default());
    let who = name.to_owned();
    let recs = recs.clone();
    let fenced = FencedApi::new(widgets(server, name));
    Controller::for_stream_with(trigger, store, widget_resource())
        .reconcile_on(sharded.reenqueue)
        .run(
            reconcile::wrap(
                ownership.clone(),
                move |w: Arc<DynamicObject>, _ctx: Arc<()>, permit| {
                    let fence = permit.fence();
                    let rec = Rec {
                        member: who.clone(),
                        name: w.metadata.name.clone().unwrap_or_default(),
                        generation: w.metadata.generation.unwrap_or_default(),
                        ok: !failing.load(Ordering::Relaxed) && fence.is_ok(),
                        at: tokio::time::Instant::now(),
                    };
                    let ok = rec.ok;
                    recs.0.lock().unwrap().push(rec);
                    let (fenced, writes) = (fenced.clone(), recs.1.clone());
                    async move {
                        let (true, Ok(fence)) = (ok, fence) else {
                            return Err(std::io::Error::other("reconcile failed"));
                        };
                        stamp(&fenced, &fence, &w).await?;
                        writes.fetch_add(1, Ordering::Relaxed);
                        Ok(Action::await_change())
                    }
                },
            ),
            |_, _, _| Action::requeue(Duration::from_secs(1)),
            Arc::new(()),
        )
        .for_each(|_| async {})
}

/// Stamp `w`'s generation on it through `FencedApi` (conditional on the version reconciled), unless there.
async fn stamp(
    fenced: &FencedApi<DynamicObject>,
    fence: &kube_shard::Fence,
    w: &DynamicObject,
) -> Result<(), std::io::Error> {
    let g = w.metadata.generation.unwrap_or_default().to_string();
    let meta = &w.metadata;
    if meta.annotations.as_ref().and_then(|a| a.get(RECONCILED)) == Some(&g) {
        return Ok(());
    }
    let patch = serde_json::json!({"metadata": {"annotations": {RECONCILED: g}}});
    fenced
        .patch(
            fence,
            w,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .map(|_| ())
        .map_err(|e| std::io::Error::other(e.to_string()))
}

/// A leader-election Lease held by `holder` (renewed by `safety_group::renew_lease_forever`).
fn legacy_lease(name: &str, holder: &str) -> k8s_openapi::api::coordination::v1::Lease {
    use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    Lease {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(3),
            renew_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
            ..LeaseSpec::default()
        }),
    }
}

/// 20 Widgets, a legacy leader's Lease `old-leader` renewed until `stop`, and a Widget worker `a` gated on
/// it (its watcher and Controller created `late` after the start, or at once) that owns every shard.
struct Held {
    server: TestServer,
    uids: BTreeMap<String, String>,
    stop: Arc<AtomicBool>,
    renewer: tokio::task::JoinHandle<()>,
    log: FenceLog,
    recs: Recs,
    a: Member,
}

async fn held_widget_worker(late: Option<Duration>) -> Held {
    let (server, log) = crate::support::group_server().await;
    let uids = seed_widgets(&server, 20).await;
    let stop = Arc::new(AtomicBool::new(false));
    let renewer = crate::safety::group::renew_lease_forever(
        &server,
        "old",
        legacy_lease("old-leader", "old-0"),
        stop.clone(),
    );
    let recs = Recs::default();
    let a = spawn_widget_worker_late(
        &server,
        builder(&server, "a").legacy_leader_lease("old-leader"),
        "a",
        &log,
        &recs,
        Arc::new(AtomicBool::new(false)),
        late,
    );
    until(Duration::from_secs(30), "a owns everything", || {
        owned_count(&a) == 16
    })
    .await;
    Held {
        server,
        uids,
        stop,
        renewer,
        log,
        recs,
        a,
    }
}

/// The hold lifts (the legacy leader stops renewing): `a` reconciles every Widget, fences clean.
async fn lift_and_reconcile_all(h: Held) {
    h.stop.store(true, Ordering::Relaxed);
    h.renewer.await.unwrap();
    until(Duration::from_secs(30), "a reconciled every widget", || {
        h.uids.keys().all(|n| h.recs.done("a", n, 1))
    })
    .await;
    check_fences(&h.log);
    assert_eq!(h.server.fence_violations(), 0);
}

fn admits(m: &Member, uid: &str) -> bool {
    m.ownership().admit_shard(shard_of_uid(uid)).is_ok()
}

// === 1. no lost work through predicate_filter ===

/// An object whose reconciles keep failing on its owner `a` while its shard moves to `b` (a scale-up, then
/// `a`'s graceful leave), and that never changes again, is reconciled by `b`.
#[tokio::test(start_paused = true)]
async fn a_failed_reconcile_moved_with_its_shard_is_done_by_the_new_owner() {
    let (server, log) = crate::support::group_server().await;
    let uids = seed_widgets(&server, 40).await;
    let recs = Recs::default();
    let a = spawn_widget_worker(
        &server,
        builder(&server, "a"),
        "a",
        &log,
        &recs,
        Arc::new(AtomicBool::new(true)),
    );
    until(Duration::from_secs(30), "a tried every widget", || {
        uids.keys().all(|n| recs.failed("a", n))
    })
    .await;
    let b = spawn_widget_worker(
        &server,
        builder(&server, "b"),
        "b",
        &log,
        &recs,
        Arc::new(AtomicBool::new(false)),
    );
    until(Duration::from_secs(60), "a and b settle", || {
        owned_count(&b) > 0 && each_shard_owned_once(&[&a, &b])
    })
    .await;
    until(
        Duration::from_secs(30),
        "b reconciled every widget of the shards it received",
        || {
            uids.iter()
                .filter(|(_, u)| admits(&b, u))
                .all(|(n, _)| recs.done("b", n, 1))
        },
    )
    .await;
    a.handle.leave();
    until(Duration::from_secs(60), "b owns everything", || {
        owned_count(&b) == 16
    })
    .await;
    until(Duration::from_secs(30), "b reconciled every widget", || {
        uids.keys().all(|n| recs.done("b", n, 1))
    })
    .await;
    assert!(
        !recs.any(|r| r.ok && r.member == "a"),
        "a's reconciles all failed: the work was b's to do"
    );
    check_fences(&log);
    assert_eq!(server.fence_violations(), 0);
}

/// A Widget seen while its owner is held by the legacy leader gate was refused by the admission wrapper
/// (`await_change`) and the filter will never pass its generation again: it is reconciled when the hold
/// lifts.
#[tokio::test(start_paused = true)]
async fn a_widget_refused_under_a_hold_is_done_when_the_hold_lifts() {
    let h = held_widget_worker(None).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(h.a.ownership().admission_hold().is_some(), "held");
    assert!(
        !h.recs.any(|_| true),
        "nothing reconciled beside a live legacy leader"
    );
    lift_and_reconcile_all(h).await;
}

/// A Widget changed while its owner is self-fenced (its Lease writes fail) is refused by the admission
/// wrapper (`await_change`); the filter will not pass that generation again: it is reconciled once the
/// member renews and un-fences.
#[tokio::test(start_paused = true)]
async fn a_widget_changed_while_its_owner_is_self_fenced_is_done_after_the_renewal() {
    use kube_shard_testserver::{FailRule, Scope};

    let (server, log) = crate::support::group_server().await;
    let uids = seed_widgets(&server, 20).await;
    let recs = Recs::default();
    let a = spawn_widget_worker(
        &server,
        builder(&server, "a"),
        "a",
        &log,
        &recs,
        Arc::new(AtomicBool::new(false)),
    );
    until(Duration::from_secs(30), "a reconciled every widget", || {
        uids.keys().all(|n| recs.done("a", n, 1))
    })
    .await;
    server.faults().fail_next(
        Scope::identity("a"),
        FailRule::status(500).resource("leases").times(1_000_000),
    );
    until(Duration::from_secs(30), "a self-fences", || {
        a.ownership().is_self_fenced()
    })
    .await;
    bump_widgets(&server, uids.keys(), 1).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(a.ownership().is_self_fenced(), "still self-fenced");
    assert!(
        !recs.any(|r| r.generation == 2),
        "nothing reconciled while self-fenced"
    );
    server.faults().clear();
    until(Duration::from_secs(60), "a reconciled every change", || {
        uids.keys().all(|n| recs.done("a", n, 2))
    })
    .await;
    check_fences(&log);
    assert_eq!(server.fence_violations(), 0);
}

// === 2. mixed S in one group ===

/// `a` and `b` at S = 16 settle (full stack, Widgets); `c` at S = 32 joins the same group and namespace and
/// becomes the coordinator once the old one leaves (`b` cannot take the coordinator Lease). `c` refuses the
/// assignment loudly (a Warning `InvalidAssignment` Event), never writes over it, and reconciles nothing: no
/// Widget is reconciled by two generations. Extends
/// `safety_group::a_coordinator_never_overwrites_an_assignment_it_cannot_decode` with the whole stack, a
/// second S = 16 member and the Event.
#[tokio::test(start_paused = true)]
async fn a_member_at_another_s_refuses_loudly_admits_nothing_and_writes_nothing() {
    use k8s_openapi::api::events::v1::Event;
    use kube_shard::ShardCount;
    use kube_shard_testserver::{FailRule, Scope};

    let (server, log) = crate::support::group_server().await;
    let uids = seed_widgets(&server, 40).await;
    let recs = Recs::default();
    let ok = || Arc::new(AtomicBool::new(false));
    let a = spawn_widget_worker(&server, builder(&server, "a"), "a", &log, &recs, ok());
    let b = spawn_widget_worker(&server, builder(&server, "b"), "b", &log, &recs, ok());
    until(Duration::from_secs(60), "a and b settle", || {
        owned_count(&a) > 0 && each_shard_owned_once(&[&a, &b])
    })
    .await;
    until(Duration::from_secs(30), "every widget reconciled", || {
        uids.keys()
            .all(|n| recs.done("a", n, 1) || recs.done("b", n, 1))
    })
    .await;
    let before = crate::group::assignment(&server).await.expect("S = 16");
    // the old coordinator leaves; b may not take the coordinator Lease, so c (S = 32) coordinates
    let (lead, other) = if a.handle.status().coordinator {
        (&a, &b)
    } else {
        (&b, &a)
    };
    assert!(lead.handle.status().coordinator, "a coordinator");
    server.faults().fail_next(
        Scope::identity(other.name.as_str()),
        FailRule::status(500)
            .resource("leases")
            .name(format!("{}-coordinator", crate::group::GROUP))
            .times(1_000_000),
    );
    let c = spawn_widget_worker(
        &server,
        builder(&server, "c").shards(ShardCount::new(32).unwrap()),
        "c",
        &log,
        &recs,
        ok(),
    );
    tokio::time::sleep(crate::group::LEASE).await;
    lead.handle.leave();
    until(Duration::from_secs(30), "c coordinates", || {
        c.handle.status().coordinator
    })
    .await;
    for _ in 0..200 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = crate::group::assignment(&server).await;
        let now = now.expect("the S = 16 assignment was overwritten");
        assert!(
            now.view.generation >= before.view.generation,
            "generation went back"
        );
        assert!(
            now.view
                .shards
                .values()
                .all(|e| ["a", "b"].contains(&e.owner.name.as_ref())),
            "an owner outside the S = 16 members: {now:?}"
        );
        assert!(c.handle.status().owned.is_empty(), "c owns shards");
        for s in 0..32 {
            assert!(c.ownership().admit_shard(s).is_err(), "c admits shard {s}");
        }
    }
    assert!(
        !recs.any(|r| r.member == "c"),
        "c reconciled a Widget beside the S = 16 owners"
    );
    let events: Api<Event> = Api::namespaced(server.client("admin"), crate::group::CP_NS);
    let refused = events
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .any(|e| e.reason.as_deref() == Some("InvalidAssignment"));
    assert!(refused, "c's refusal is not visible as an Event");
    let health = c.handle.health();
    assert!(
        health
            .assignment_refused()
            .is_some_and(|why| why.contains("16")),
        "c's health does not say why it refuses the assignment: {:?}",
        health.assignment_refused()
    );
    assert!(
        !health.is_ready(),
        "c is ready while it refuses the assignment"
    );
    check_fences(&log);
    assert_eq!(server.fence_violations(), 0);
}

// === 3. a change of S is a new group ===

/// `builder` for `name` in group `group` (the suite's timings).
fn builder_in(server: &TestServer, group: &str, name: &str) -> ShardGroupBuilder {
    use kube_shard::group::ShardGroup;
    ShardGroup::builder(server.client(name), group, crate::group::CP_NS)
        .member(name)
        .shards(crate::group::s())
        .key(kube_shard::ShardKey::Uid)
        .timings(
            crate::group::LEASE,
            crate::group::RENEW,
            crate::group::RETRY,
        )
        .takeover_grace(crate::group::GRACE)
        .drain_timeout(crate::group::DRAIN)
        .fence_margin(crate::group::MARGIN)
        .settle(Duration::from_secs(1), Duration::from_millis(500))
}

/// Step 5: roll S = 16 (group `old`, two members) to S = 32 (group `new`, two members) under a writer that
/// keeps changing Widgets. The new group is configured with `legacy_leader_lease("control/old-coordinator")`:
/// it admits nothing while the old group's coordinator Lease has a live holder. Then the old members leave
/// gracefully. No Widget is reconciled by both generations at overlapping times (every success of an old
/// member precedes every success of a new one, per Widget), and at the end every Widget's latest
/// generation is reconciled by a new member.
#[tokio::test(start_paused = true)]
async fn changing_s_is_a_new_group_gated_on_the_old_coordinator_lease() {
    use kube_shard::ShardCount;

    let (server, log) = crate::support::group_server().await;
    let uids = seed_widgets(&server, 30).await;
    let widget_filter = kube_shard_testserver::ResourceFilter::resource("widgets").namespace(NS);
    server.history().record(widget_filter.clone());
    let recs = Recs::default();
    let ok = || Arc::new(AtomicBool::new(false));
    let old: Vec<Member> = ["o1", "o2"]
        .iter()
        .map(|n| spawn_widget_worker(&server, builder_in(&server, "old", n), n, &log, &recs, ok()))
        .collect();
    until(Duration::from_secs(60), "the old group settles", || {
        old.iter().map(owned_count).sum::<usize>() == 16
    })
    .await;
    until(Duration::from_secs(30), "every widget reconciled", || {
        uids.keys()
            .all(|n| recs.done("o1", n, 1) || recs.done("o2", n, 1))
    })
    .await;
    // the writer changes every Widget, round after round
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (server, stop) = (server.clone(), stop.clone());
        let names: Vec<String> = uids.keys().cloned().collect();
        tokio::spawn(async move {
            let mut v = 0;
            while !stop.load(Ordering::Relaxed) {
                v += 1;
                bump_widgets(&server, names.iter(), v).await;
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        })
    };
    let new: Vec<Member> = ["n1", "n2"]
        .iter()
        .map(|n| {
            let b = builder_in(&server, "new", n)
                .shards(ShardCount::new(32).unwrap())
                .legacy_leader_lease(format!("{}/old-coordinator", crate::group::CP_NS));
            spawn_widget_worker(&server, b, n, &log, &recs, ok())
        })
        .collect();
    tokio::time::sleep(crate::group::LEASE * 3).await;
    for m in &new {
        assert!(
            m.ownership().admission_hold().is_some(),
            "{} admits beside the old group's live coordinator",
            m.name
        );
    }
    assert!(!recs.any(|r| r.member.starts_with('n')), "held");
    for m in &old {
        m.handle.leave();
    }
    until(
        Duration::from_secs(60),
        "the new group owns every shard",
        || {
            new.iter().map(owned_count).sum::<usize>() == 32
                && new.iter().all(|m| m.ownership().admission_hold().is_none())
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::Relaxed);
    writer.await.unwrap();
    let api = widgets(&server, "admin");
    let latest: BTreeMap<String, i64> = api
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|w| (w.metadata.name.unwrap(), w.metadata.generation.unwrap()))
        .collect();
    until(
        Duration::from_secs(60),
        "every widget's latest generation reconciled by a new member",
        || {
            latest
                .iter()
                .all(|(n, g)| recs.done("n1", n, *g) || recs.done("n2", n, *g))
        },
    )
    .await;
    let all = recs.0.lock().unwrap().clone();
    for n in uids.keys() {
        let last_old = all
            .iter()
            .filter(|r| r.ok && &r.name == n && r.member.starts_with('o'))
            .map(|r| r.at)
            .max();
        let first_new = all
            .iter()
            .filter(|r| r.ok && &r.name == n && r.member.starts_with('n'))
            .map(|r| r.at)
            .min();
        if let (Some(o), Some(f)) = (last_old, first_new) {
            assert!(
                o < f,
                "{n}: reconciled by the old group at {o:?} after the new group at {f:?}"
            );
        }
    }
    // the fenced stamps: the epoch check (and testserver's fence audit) judged real writes of every Widget
    let commits = crate::oracle_support::fenced_commits(&server, &widget_filter);
    let judged = kube_shard::testing::oracles::quiescence::fenced_versions(&commits);
    eprintln!(
        "S change: {} fenced stamps committed; the epoch check judged {judged} fenced versions",
        recs.writes()
    );
    assert!(
        recs.writes() > 0,
        "the reconcilers committed no fenced write"
    );
    assert!(judged >= recs.writes(), "{judged} < {}", recs.writes());
    for uid in uids.values() {
        assert!(
            server.fence_audit().highest_epoch(uid).is_some(),
            "no fenced write of {uid} audited"
        );
    }
    kube_shard::testing::oracles::quiescence::assert_quiescent(
        &commits,
        &[],
        &BTreeMap::new(),
        &[],
    );
    check_fences(&log);
    assert_eq!(server.fence_violations(), 0);
}

// === 4. observers with partial or lagging views ===

/// Only the coordinator's Lease watch goes quiet (the fault is narrowed to `leases`; its assignment watch and
/// every write work) during a scale-up with moves in flight. For three lease periods: no move to the joiner
/// is cancelled ("target not live"), no shard leaves its owner for anyone but the joiner (no takeover of a
/// renewing member, no Draining re-granted to its source). Extends
/// `safety_group::a_silent_lease_watch_cancels_no_move` (which freezes every watch of the coordinator) to the
/// narrowed fault and to every shard.
#[tokio::test(start_paused = true)]
async fn a_lease_watch_down_during_a_scale_up_judges_nobody() {
    use kube_shard::group::assignment::Handoff;
    use kube_shard_testserver::Scope;

    let (server, log, mut ms) = crate::support::settled_group(&["a", "b", "c"]).await;
    tokio::time::sleep(crate::group::LEASE).await;
    let lead = ms
        .iter()
        .position(|m| m.handle.status().coordinator)
        .expect("a coordinator");
    let lead_name = ms[lead].name.clone();
    ms.push(crate::group::spawn(&server, "d", &log));
    let to_d = |h: &Handoff| match h {
        Handoff::Moving { to, .. } | Handoff::Draining { to, .. } => to.name.as_ref() == "d",
        _ => false,
    };
    let mut before = None;
    for _ in 0..1000 {
        tokio::time::sleep(Duration::from_millis(10)).await;
        if let Some(a) = crate::group::assignment(&server).await {
            if a.view.shards.values().any(|e| to_d(&e.handoff)) {
                before = Some(a);
                break;
            }
        }
    }
    let before = before.expect("no move to d started");
    let frozen = Scope::identity(lead_name.as_str()).resource("leases");
    server.faults().freeze_watches(frozen.clone(), true);
    let mut prev = before.clone();
    for _ in 0..(3 * crate::group::LEASE.as_millis() / 50) {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = crate::group::assignment(&server).await.expect("decodable");
        for (s, e) in &now.view.shards {
            let was = &before.view.shards[s];
            assert!(
                e.owner == was.owner || e.owner.name.as_ref() == "d",
                "shard {s} left {} for {} while every member renews",
                was.owner,
                e.owner
            );
            let p = &prev.view.shards[s];
            if to_d(&p.handoff) {
                let cancelled = e.owner.name.as_ref() != "d" && e.handoff == Handoff::Stable;
                assert!(
                    !cancelled,
                    "move of shard {s} to d cancelled while d renews"
                );
            }
        }
        prev = now;
    }
    server.faults().freeze_watches(frozen, false);
    let refs: Vec<&Member> = ms.iter().collect();
    until(Duration::from_secs(30), "d owns its share", || {
        owned_count(refs[3]) > 0 && each_shard_owned_once(&refs)
    })
    .await;
    check_fences(&log);
}

/// A watcher (and its Controller) registered after the group started, while the member is held by the legacy
/// leader gate, sees every Widget once (the filter passes generation 1, the wrapper refuses); when the hold
/// lifts, its shards' objects are re-enqueued to it and reconciled.
#[tokio::test(start_paused = true)]
async fn a_watcher_registered_after_the_start_gets_the_work_of_a_hold_lift() {
    let h = held_widget_worker(Some(Duration::from_secs(8))).await;
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert!(h.a.ownership().admission_hold().is_some(), "held");
    assert!(!h.recs.any(|_| true), "nothing reconciled while held");
    lift_and_reconcile_all(h).await;
}
