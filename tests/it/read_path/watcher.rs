//! The read path against testserver's in-memory API server, in paused time.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{DeleteParams, ObjectMeta, PostParams};
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::{Api, Client};
use kube_shard::group::assignment::{AssignmentView, Handoff, ShardAssignment};
use kube_shard::ownership::{MemberId, Ownership, OwnershipConfig};
use kube_shard::testing::{self, TestDriver};
use kube_shard::watcher::{ReadMode, ShardedWatcher, WatcherStats};
use kube_shard::{fnv1a64, ShardCount, ShardKey};
use kube_shard_testserver::{FailRule, GateSkew, Scope, TestServer, Verb};

pub(crate) const NS: &str = "sharded";

pub(crate) fn shards() -> ShardCount {
    ShardCount::new(16).unwrap()
}

pub(crate) fn shard_of_uid(uid: &str) -> u32 {
    shards().shard_of(fnv1a64(uid.as_bytes()))
}

pub(crate) async fn seed(client: &Client, n: usize) -> BTreeMap<String, String> {
    let ns: Api<Namespace> = Api::all(client.clone());
    let _ = ns
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
        .await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    let created: Vec<ConfigMap> = futures::stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            async move {
                api.create(&PostParams::default(), &cm(&format!("cm-{i}"), "0"))
                    .await
                    .unwrap()
            }
        })
        .buffer_unordered(64)
        .collect()
        .await;
    created
        .into_iter()
        .map(|c| (c.metadata.name.unwrap(), c.metadata.uid.unwrap()))
        .collect()
}

pub(crate) fn cm(name: &str, value: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(NS.into()),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([("v".to_owned(), value.to_owned())])),
        ..ConfigMap::default()
    }
}

pub(crate) fn member(name: &str) -> (MemberId, Ownership, TestDriver) {
    let me = MemberId::new(name, "i1");
    let (o, d) = testing::driver(OwnershipConfig::new(shards(), ShardKey::Uid), me.clone());
    d.renew();
    (me, o, d)
}

pub(crate) fn grant(
    view: AssignmentView,
    owner: &MemberId,
    shards: impl IntoIterator<Item = u32>,
    epoch: u64,
) -> AssignmentView {
    shards.into_iter().fold(view, |v, s| {
        v.with(s, ShardAssignment::owned(owner.clone(), epoch))
    })
}

pub(crate) struct Reader {
    pub(crate) store: Store<ConfigMap>,
    pub(crate) stats: WatcherStats,
    pub(crate) task: tokio::task::JoinHandle<()>,
}

pub(crate) fn read(server: &TestServer, identity: &str, ownership: &Ownership) -> Reader {
    let api: Api<ConfigMap> = Api::all(server.client(identity));
    let sharded = ShardedWatcher::new(api, watcher::Config::default(), ownership.clone())
        .barrier_timeout(Duration::from_secs(1))
        .probe_interval(Duration::from_secs(30))
        .build_reflector();
    let store = sharded.store.clone();
    let stats = sharded.stats.clone();
    let events = sharded.events;
    let task = tokio::spawn(async move {
        let mut events = std::pin::pin!(events);
        while let Some(item) = events.next().await {
            if let Err(e) = item {
                tracing::debug!("informational error item: {e}");
            }
        }
    });
    Reader { store, stats, task }
}

/// Wait (in paused time) until `cond` holds, at most `limit` of virtual time.
pub(crate) async fn until(limit: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let start = tokio::time::Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub(crate) fn names(store: &Store<ConfigMap>) -> BTreeSet<String> {
    store
        .state()
        .iter()
        .map(|c| c.metadata.name.clone().unwrap())
        .collect()
}

fn owned_names(objects: &BTreeMap<String, String>, owned: &BTreeSet<u32>) -> BTreeSet<String> {
    objects
        .iter()
        .filter(|(_, uid)| owned.contains(&shard_of_uid(uid)))
        .map(|(n, _)| n.clone())
        .collect()
}

/// Four members with fixed ownership over many objects: disjoint, covering projections; read amplification
/// near 1 in server mode; identical projections in fallback.
async fn four_members(gate: bool, objects: usize) -> (Vec<f64>, Vec<ReadMode>, Vec<u64>) {
    let (server, all) = crate::support::seeded(gate, objects).await;
    let mut readers = Vec::new();
    let mut expected = Vec::new();
    let mut keep = Vec::new();
    for m in 0..4u32 {
        let (me, o, d) = member(&format!("m{m}"));
        let owned: BTreeSet<u32> = (m * 4..m * 4 + 4).collect();
        d.apply(&grant(
            AssignmentView::new(1),
            &me,
            owned.iter().copied(),
            1,
        ));
        expected.push(owned_names(&all, &owned));
        readers.push(read(&server, &format!("m{m}"), &o));
        keep.push((o, d));
    }
    for (m, r) in readers.iter().enumerate() {
        let want = expected[m].len();
        until(Duration::from_secs(60), "projection", || {
            r.store.len() == want
        })
        .await;
    }
    // settle a little longer: nothing more may arrive
    tokio::time::sleep(Duration::from_secs(5)).await;
    let mut union = BTreeSet::new();
    let mut amplification = Vec::new();
    let mut modes = Vec::new();
    let mut subwatches = Vec::new();
    for (m, r) in readers.iter().enumerate() {
        let got = names(&r.store);
        assert_eq!(got, expected[m], "member {m} projects exactly its shards");
        assert!(union.is_disjoint(&got), "projections are disjoint");
        union.extend(got);
        assert_eq!(
            r.stats.handed_over(),
            expected[m].len() as u64,
            "each projected object is held once, by the store"
        );
        let acct = server.accounting(&format!("m{m}"));
        let by_server = acct.distinct_uids as f64 / expected[m].len() as f64;
        amplification.push(by_server);
        // the member's own metric agrees with the server's accounting
        let received = r.stats.objects_received() as f64;
        let by_metric = received / (received - r.stats.objects_unwanted() as f64);
        assert!(
            (by_metric - by_server).abs() <= 0.05 * by_server,
            "member {m}: metric amplification {by_metric} vs server accounting {by_server}"
        );
        modes.push(r.stats.mode());
        subwatches.push(r.stats.subwatches());
    }
    assert_eq!(union.len(), all.len(), "projections cover every object");
    for r in &readers {
        r.task.abort();
    }
    (amplification, modes, subwatches)
}

#[tokio::test(start_paused = true)]
async fn four_members_server_mode_read_only_what_they_own() {
    let (amp, modes, subs) = four_members(true, 10_000).await;
    eprintln!("server mode: read amplification per member {amp:?}, sub-watches {subs:?}");
    for (a, m) in amp.iter().zip(&modes) {
        assert_eq!(*m, ReadMode::Server);
        assert!(*a <= 1.05, "read amplification {a} > 1.05");
    }
}

#[tokio::test(start_paused = true)]
async fn four_members_fallback_mode_same_projections() {
    let (amp, modes, subs) = four_members(false, 10_000).await;
    eprintln!("fallback mode: read amplification per member {amp:?}, sub-watches {subs:?}");
    for m in &modes {
        assert_eq!(*m, ReadMode::Fallback);
    }
}

#[tokio::test(start_paused = true)]
async fn nothing_owned_still_initializes() {
    let server = TestServer::builder().shard_selector(true).build();
    seed(&server.client("admin"), 20).await;
    let (_me, o, _d) = member("idle");
    let api: Api<ConfigMap> = Api::all(server.client("idle"));
    let mut events = std::pin::pin!(kube_shard::watcher(api, watcher::Config::default(), o).events);
    assert!(matches!(
        events.try_next().await.unwrap(),
        Some(watcher::Event::Init)
    ));
    assert!(matches!(
        events.try_next().await.unwrap(),
        Some(watcher::Event::InitDone)
    ));
    let acct = server.accounting("idle");
    assert_eq!(
        acct.requests(Verb::List) + acct.requests(Verb::Watch),
        0,
        "owning nothing sends nothing"
    );
}

/// `base` at `generation`, with `shards` still owned by `owner` at epoch 1 and in `handoff`.
fn handoff_view(
    base: &AssignmentView,
    generation: u64,
    shards: &[u32],
    owner: &MemberId,
    handoff: Handoff,
) -> AssignmentView {
    let mut view = base.clone();
    view.generation = generation;
    shards.iter().fold(view, |v, s| {
        v.with(
            *s,
            ShardAssignment::owned(owner.clone(), 1).with_handoff(handoff.clone()),
        )
    })
}

/// Ownership moves while a writer keeps updating: final stores equal the owned objects at their latest
/// resourceVersion; the narrowed member lists nothing, the gaining member lists only the gained range.
#[tokio::test(start_paused = true)]
async fn handoff_under_writes_loses_nothing_and_lists_only_gains() {
    let (server, all) = crate::support::seeded(true, 800).await;
    let admin = server.client("admin");
    let (a, oa, da) = member("a");
    let (b, ob, db) = member("b");
    let view1 = grant(grant(AssignmentView::new(1), &a, 0..8, 1), &b, 8..16, 1);
    da.apply(&view1);
    db.apply(&view1);
    let ra = read(&server, "a", &oa);
    let rb = read(&server, "b", &ob);
    let own_a: BTreeSet<u32> = (0..8).collect();
    let own_b: BTreeSet<u32> = (8..16).collect();
    until(Duration::from_secs(60), "initial", || {
        ra.store.len() == owned_names(&all, &own_a).len()
            && rb.store.len() == owned_names(&all, &own_b).len()
    })
    .await;
    let lists_a = ra.stats.lists();
    let lists_b = rb.stats.lists();

    // a writer that keeps touching every object
    let api: Api<ConfigMap> = Api::namespaced(admin.clone(), NS);
    let names_all: Vec<String> = all.keys().cloned().collect();
    let writer = {
        let api = api.clone();
        let names_all = names_all.clone();
        tokio::spawn(async move {
            for round in 1..=6 {
                for n in &names_all {
                    let patch = serde_json::json!({"data": {"v": round.to_string()}});
                    api.patch(
                        n,
                        &kube::api::PatchParams::default(),
                        &kube::api::Patch::Merge(&patch),
                    )
                    .await
                    .unwrap();
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };

    // move shards 2 and 3 from a to b: Moving -> (b warm) -> Draining -> (a released) -> Owned(b)
    let moving: Vec<u32> = vec![2, 3];
    let view2 = handoff_view(
        &view1,
        2,
        &moving,
        &a,
        Handoff::Moving {
            id: 7,
            to: b.clone(),
        },
    );
    da.apply(&view2);
    db.apply(&view2);
    until(Duration::from_secs(30), "warm", || {
        let acks = kube_shard::testing::member_state(&ob).acks();
        moving.iter().all(|s| acks.iter().any(|k| matches!(k, kube_shard::group::report::Ack::Warm { shard, move_id: 7 } if shard == s)))
    })
    .await;
    let view3 = handoff_view(
        &view1,
        3,
        &moving,
        &a,
        Handoff::Draining {
            id: 7,
            to: b.clone(),
        },
    );
    da.apply(&view3);
    db.apply(&view3);
    until(Duration::from_secs(30), "released", || {
        let acks = kube_shard::testing::member_state(&oa).acks();
        moving.iter().all(|s| acks.iter().any(|k| matches!(k, kube_shard::group::report::Ack::Released { shard, move_id: 7 } if shard == s)))
    })
    .await;
    let mut view4 = view1.clone();
    view4.generation = 4;
    for s in &moving {
        view4 = view4.with(*s, ShardAssignment::owned(b.clone(), 4));
    }
    da.apply(&view4);
    db.apply(&view4);
    writer.await.unwrap();

    let own_a: BTreeSet<u32> = (0..8).filter(|s| !moving.contains(s)).collect();
    let own_b: BTreeSet<u32> = (8..16).chain(moving.iter().copied()).collect();
    let want_a = owned_names(&all, &own_a);
    let want_b = owned_names(&all, &own_b);
    until(Duration::from_secs(60), "final projections", || {
        names(&ra.store) == want_a
            && names(&rb.store) == want_b
            && ra
                .store
                .state()
                .iter()
                .chain(rb.store.state().iter())
                .all(|c| c.data.as_ref().and_then(|d| d.get("v")).map(String::as_str) == Some("6"))
    })
    .await;
    // every object at its latest resourceVersion
    let live: BTreeMap<String, String> = api
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|c| {
            (
                c.metadata.name.unwrap(),
                c.metadata.resource_version.unwrap(),
            )
        })
        .collect();
    for c in ra.store.state().iter().chain(rb.store.state().iter()) {
        assert_eq!(
            c.metadata.resource_version.as_ref(),
            live.get(c.metadata.name.as_ref().unwrap()),
            "stale object in a store"
        );
    }
    assert_eq!(ra.stats.lists(), lists_a, "narrowing issues no LIST");
    assert_eq!(
        rb.stats.lists(),
        lists_b + 1,
        "one LIST for the gained range"
    );
    ra.task.abort();
    rb.task.abort();
}

/// Delete and recreate one name so the new uid lands in another shard: the store ends with the live object.
#[tokio::test(start_paused = true)]
async fn delete_and_recreate_across_shards_ends_with_the_live_object() {
    let server = TestServer::builder().shard_selector(true).build();
    let admin = server.client("admin");
    seed(&admin, 0).await;
    let (me, o, d) = member("solo");
    d.apply(&grant(AssignmentView::new(1), &me, 0..16, 1));
    let r = read(&server, "solo", &o);
    let api: Api<ConfigMap> = Api::namespaced(admin.clone(), NS);
    let mut last_uid = String::new();
    let mut shards_seen = BTreeSet::new();
    for round in 0..12 {
        let _ = api.delete("x", &DeleteParams::default()).await;
        let c = api
            .create(&PostParams::default(), &cm("x", &round.to_string()))
            .await
            .unwrap();
        last_uid = c.metadata.uid.clone().unwrap();
        shards_seen.insert(shard_of_uid(&last_uid));
    }
    assert!(
        shards_seen.len() > 1,
        "recreations landed in several shards"
    );
    until(Duration::from_secs(30), "live object", || {
        r.store
            .state()
            .iter()
            .any(|c| c.metadata.uid.as_deref() == Some(last_uid.as_str()))
    })
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let state = r.store.state();
    assert_eq!(state.len(), 1);
    assert_eq!(state[0].metadata.uid.as_deref(), Some(last_uid.as_str()));
    r.task.abort();
}

/// Each fault ends with the same final store, and the mode flips as specified.
async fn fault_scenario(gate: bool, fault: impl FnOnce(&TestServer), expect_mode: ReadMode) {
    let server = TestServer::builder()
        .shard_selector(gate)
        .bookmark_interval(Duration::from_secs(5))
        .build();
    let admin = server.client("admin");
    let all = seed(&admin, 300).await;
    let (me, o, d) = member("f");
    let owned: BTreeSet<u32> = (0..6).collect();
    d.apply(&grant(
        AssignmentView::new(1),
        &me,
        owned.iter().copied(),
        1,
    ));
    fault(&server);
    let r = read(&server, "f", &o);
    let api: Api<ConfigMap> = Api::namespaced(admin.clone(), NS);
    // keep writing through the fault
    for (i, n) in all.keys().enumerate().take(60) {
        let patch = serde_json::json!({"data": {"v": "w"}});
        api.patch(
            n,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .unwrap();
        if i % 10 == 0 {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
    let want = owned_names(&all, &owned);
    until(Duration::from_secs(600), "final store", || {
        names(&r.store) == want
            && r.store.state().iter().all(|c| {
                let touched = all
                    .keys()
                    .take(60)
                    .any(|n| Some(n) == c.metadata.name.as_ref());
                !touched
                    || c.data.as_ref().and_then(|d| d.get("v")).map(String::as_str) == Some("w")
            })
    })
    .await;
    assert_eq!(r.stats.mode(), expect_mode, "mode after the fault");
    r.task.abort();
}

#[tokio::test(start_paused = true)]
async fn fault_gate_skew_per_request() {
    fault_scenario(
        true,
        |s| s.faults().gate_skew(GateSkew::PerRequest),
        ReadMode::Fallback,
    )
    .await;
}

#[tokio::test(start_paused = true)]
async fn fault_gate_skew_per_connection() {
    fault_scenario(
        true,
        |s| s.faults().gate_skew(GateSkew::PerConnection),
        ReadMode::Fallback,
    )
    .await;
}

#[tokio::test(start_paused = true)]
async fn fault_list_filtered_watch_not() {
    fault_scenario(
        true,
        |s| s.faults().unfiltered_watch("configmaps", true),
        ReadMode::Fallback,
    )
    .await;
}

#[tokio::test(start_paused = true)]
async fn fault_compaction_forces_relist() {
    fault_scenario(
        true,
        |s| {
            let f = s.faults();
            f.compact();
        },
        ReadMode::Server,
    )
    .await;
}

#[tokio::test(start_paused = true)]
async fn fault_server_errors_burst() {
    fault_scenario(
        true,
        |s| {
            s.faults()
                .fail_next(Scope::identity("f"), FailRule::status(503).times(5));
            s.faults().fail_next(
                Scope::identity("f"),
                FailRule::status(500).times(3).verb(Verb::Watch),
            );
        },
        ReadMode::Server,
    )
    .await;
}

#[tokio::test(start_paused = true)]
async fn fault_closed_and_frozen_watches() {
    let (server, all) = crate::support::seeded(true, 100).await;
    let admin = server.client("admin");
    let (me, o, d) = member("w");
    let owned: BTreeSet<u32> = (0..16).collect();
    d.apply(&grant(
        AssignmentView::new(1),
        &me,
        owned.iter().copied(),
        1,
    ));
    let r = read(&server, "w", &o);
    until(Duration::from_secs(30), "initial", || {
        r.store.len() == all.len()
    })
    .await;
    let api: Api<ConfigMap> = Api::namespaced(admin.clone(), NS);
    server.faults().close_watches(Scope::All);
    api.patch(
        "cm-1",
        &Default::default(),
        &kube::api::Patch::Merge(&serde_json::json!({"data":{"v":"closed"}})),
    )
    .await
    .unwrap();
    until(Duration::from_secs(60), "event after close", || {
        r.store.state().iter().any(|c| {
            c.metadata.name.as_deref() == Some("cm-1") && c.data.as_ref().unwrap()["v"] == "closed"
        })
    })
    .await;
    server.faults().freeze_watches(Scope::All, true);
    api.patch(
        "cm-2",
        &Default::default(),
        &kube::api::Patch::Merge(&serde_json::json!({"data":{"v":"frozen"}})),
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    server.faults().freeze_watches(Scope::All, false);
    // the frozen connection is noticed at its idle timeout and re-watched
    until(Duration::from_secs(400), "event after freeze", || {
        r.store.state().iter().any(|c| {
            c.metadata.name.as_deref() == Some("cm-2") && c.data.as_ref().unwrap()["v"] == "frozen"
        })
    })
    .await;
    assert_eq!(r.stats.mode(), ReadMode::Server);
    r.task.abort();
}

#[tokio::test(start_paused = true)]
async fn fault_lagging_lists() {
    fault_scenario(true, |s| s.faults().lagging_lists(true), ReadMode::Server).await;
}

/// `Controller::for_stream` end to end: every owned object is reconciled; a shard that becomes Owned is
/// reconciled; and an un-fencing (no object changes at all) re-enqueues the owned objects through
/// `reconcile_on` — the path that bypasses trigger-stream predicates.
#[tokio::test(start_paused = true)]
async fn controller_for_stream_reconciles_owned_and_reenqueued_objects() {
    use kube::runtime::{controller::Action, Controller, WatchStreamExt};
    use std::sync::{Arc, Mutex};

    let (server, all) = crate::support::seeded(true, 300).await;
    let (me, o, d) = member("ctl");
    d.apply(&grant(AssignmentView::new(1), &me, 0..8, 1));
    let api: Api<ConfigMap> = Api::all(server.client("ctl"));
    let sharded = ShardedWatcher::new(api, watcher::Config::default(), o.clone())
        .barrier_timeout(Duration::from_secs(1))
        .build_reflector();
    let store = sharded.store.clone();
    let seen: Arc<Mutex<BTreeMap<String, usize>>> = Arc::default();
    let ctx = seen.clone();
    let ctrl = Controller::for_stream(sharded.events.applied_objects(), store.clone())
        .reconcile_on(sharded.reenqueue)
        .run(
            |obj: Arc<ConfigMap>, ctx: Arc<Mutex<BTreeMap<String, usize>>>| async move {
                *ctx.lock()
                    .unwrap()
                    .entry(obj.metadata.name.clone().unwrap())
                    .or_default() += 1;
                Ok::<_, std::convert::Infallible>(Action::await_change())
            },
            |_, _, _| Action::await_change(),
            ctx,
        )
        .for_each(|_| async {});
    let task = tokio::spawn(ctrl);
    let count = |owned: &BTreeSet<u32>, at_least: usize| {
        let seen = seen.lock().unwrap();
        owned_names(&all, owned)
            .iter()
            .all(|n| seen.get(n).copied().unwrap_or(0) >= at_least)
    };
    let first: BTreeSet<u32> = (0..8).collect();
    until(Duration::from_secs(60), "first reconciles", || {
        count(&first, 1)
    })
    .await;
    // no object outside the owned shards was ever reconciled
    {
        let seen = seen.lock().unwrap();
        let owned = owned_names(&all, &first);
        assert!(
            seen.keys().all(|n| owned.contains(n)),
            "only owned objects are reconciled"
        );
    }
    // gain shards 8..12: reconciled once they are Owned
    d.apply(&grant(
        grant(AssignmentView::new(2), &me, 0..8, 1),
        &me,
        8..12,
        2,
    ));
    let second: BTreeSet<u32> = (0..12).collect();
    until(
        Duration::from_secs(60),
        "reconciles after activation",
        || count(&second, 1),
    )
    .await;
    // self-fence and renew: nothing changes in the objects, yet every owned object is reconciled again
    let before: BTreeMap<String, usize> = seen.lock().unwrap().clone();
    d.taken_over();
    tokio::time::sleep(Duration::from_secs(1)).await;
    d.renew();
    until(
        Duration::from_secs(60),
        "re-enqueue after un-fencing",
        || {
            let seen = seen.lock().unwrap();
            owned_names(&all, &second)
                .iter()
                .all(|n| seen.get(n).copied().unwrap_or(0) > before.get(n).copied().unwrap_or(0))
        },
    )
    .await;
    task.abort();
}

/// Streaming lists (`sendInitialEvents=true`) project the same objects, and are filtered by the server.
#[tokio::test(start_paused = true)]
async fn streaming_list_initial_sync() {
    let (server, all) = crate::support::seeded(true, 400).await;
    let (me, o, d) = member("s");
    let owned: BTreeSet<u32> = (4..12).collect();
    d.apply(&grant(
        AssignmentView::new(1),
        &me,
        owned.iter().copied(),
        1,
    ));
    let api: Api<ConfigMap> = Api::all(server.client("s"));
    let sharded = ShardedWatcher::new(api, watcher::Config::default().streaming_lists(), o.clone())
        .barrier_timeout(Duration::from_secs(1))
        .build_reflector();
    let store = sharded.store.clone();
    let stats = sharded.stats.clone();
    let task = tokio::spawn(sharded.events.for_each(|_| async {}));
    let want = owned_names(&all, &owned);
    until(Duration::from_secs(60), "streamed projection", || {
        names(&store) == want
    })
    .await;
    assert_eq!(stats.mode(), ReadMode::Server);
    let acct = server.accounting("s");
    assert_eq!(
        acct.requests(Verb::List) - stats.activations() - stats.targeted_lists(),
        0,
        "no LIST besides barrier probes"
    );
    assert!(acct.distinct_uids as f64 / want.len() as f64 <= 1.05);
    task.abort();
}

/// A metadata-only watcher projects `PartialObjectMeta` of the owned objects.
#[tokio::test(start_paused = true)]
async fn metadata_watcher_projects_owned_metadata() {
    let (server, all) = crate::support::seeded(true, 200).await;
    let (me, o, d) = member("meta");
    let owned: BTreeSet<u32> = (0..5).collect();
    d.apply(&grant(
        AssignmentView::new(1),
        &me,
        owned.iter().copied(),
        1,
    ));
    let api: Api<ConfigMap> = Api::all(server.client("meta"));
    let sharded = ShardedWatcher::metadata(api, watcher::Config::default(), o.clone())
        .barrier_timeout(Duration::from_secs(1))
        .build_reflector();
    let store = sharded.store.clone();
    let task = tokio::spawn(sharded.events.for_each(|_| async {}));
    let want = owned_names(&all, &owned);
    until(Duration::from_secs(60), "metadata projection", || {
        store
            .state()
            .iter()
            .map(|m| m.metadata.name.clone().unwrap())
            .collect::<BTreeSet<_>>()
            == want
    })
    .await;
    task.abort();
}

/// After a fallback, server mode comes back once the server filters again (re-probe), without losing objects.
#[tokio::test(start_paused = true)]
async fn server_mode_returns_after_reprobe() {
    let (server, all) = crate::support::seeded(false, 200).await;
    let (me, o, d) = member("p");
    let owned: BTreeSet<u32> = (0..8).collect();
    d.apply(&grant(
        AssignmentView::new(1),
        &me,
        owned.iter().copied(),
        1,
    ));
    let r = read(&server, "p", &o);
    let want = owned_names(&all, &owned);
    until(Duration::from_secs(60), "fallback projection", || {
        names(&r.store) == want
    })
    .await;
    assert_eq!(r.stats.mode(), ReadMode::Fallback);
    server.set_shard_selector(true);
    until(Duration::from_secs(120), "server mode again", || {
        r.stats.mode() == ReadMode::Server
    })
    .await;
    assert!(r.stats.probes() >= 1);
    server.reset_accounting();
    let api: Api<ConfigMap> = Api::namespaced(server.client("admin"), NS);
    for n in all.keys() {
        api.patch(
            n,
            &Default::default(),
            &kube::api::Patch::Merge(&serde_json::json!({"data":{"v":"after"}})),
        )
        .await
        .unwrap();
    }
    until(Duration::from_secs(60), "updates after re-probe", || {
        names(&r.store) == want
            && r.store
                .state()
                .iter()
                .all(|c| c.data.as_ref().unwrap()["v"] == "after")
    })
    .await;
    let acct = server.accounting("p");
    assert!(
        acct.distinct_uids as usize <= want.len() + want.len() / 20,
        "back in server mode the member reads only what it owns: {} uids for {} owned",
        acct.distinct_uids,
        want.len()
    );
    r.task.abort();
}

/// A server that refuses our selectors with HTTP 500 `invalid shard selector` (a stricter or newer rule
/// set than ours): the resource flips to fallback, the alarm is raised, and owned objects are still served.
#[tokio::test(start_paused = true)]
async fn invalid_selector_500_falls_back_and_alarms() {
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    let (server, all) = crate::support::seeded(true, 150).await;
    let inner = server.service("strict");
    let strict = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let inner = inner.clone();
        async move {
            if req
                .uri()
                .query()
                .is_some_and(|q| q.contains("shardSelector="))
            {
                let status = serde_json::json!({
                    "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                    "message": "invalid shard selector: refused by a stricter server", "reason": "", "code": 500
                });
                let body = http_body_util::Full::new(bytes::Bytes::from(status.to_string()))
                    .boxed_unsync();
                return Ok(http::Response::builder()
                    .status(500)
                    .header("content-type", "application/json")
                    .body(body)
                    .unwrap());
            }
            inner.oneshot(req).await
        }
    });
    let client = Client::new(strict, "default");
    let (me, o, d) = member("strict");
    let owned: BTreeSet<u32> = (0..8).collect();
    d.apply(&grant(
        AssignmentView::new(1),
        &me,
        owned.iter().copied(),
        1,
    ));
    let sharded = ShardedWatcher::new(
        Api::<ConfigMap>::all(client),
        watcher::Config::default(),
        o.clone(),
    )
    .barrier_timeout(Duration::from_secs(1))
    .build_reflector();
    let store = sharded.store.clone();
    let stats = sharded.stats.clone();
    let task = tokio::spawn(sharded.events.for_each(|_| async {}));
    let want = owned_names(&all, &owned);
    until(Duration::from_secs(120), "projection in fallback", || {
        names(&store) == want
    })
    .await;
    assert_eq!(stats.mode(), ReadMode::Fallback);
    assert!(stats.invalid_selector_alarms() >= 1, "the alarm is raised");
    // the refused selector is not retried in a hot loop: a handful of selector requests at most
    let selector_requests = server.accounting("strict").total_requests();
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert!(
        server.accounting("strict").total_requests() <= selector_requests + 4,
        "no hot loop on a refused selector"
    );
    task.abort();
}

/// `DynamicObject` with its `ApiResource`, and a transform applied before indexing.
#[tokio::test(start_paused = true)]
async fn dynamic_objects_with_a_transform() {
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind};

    let (server, all) = crate::support::seeded(true, 120).await;
    let (me, o, d) = member("dyn");
    let owned: BTreeSet<u32> = (8..16).collect();
    d.apply(&grant(
        AssignmentView::new(1),
        &me,
        owned.iter().copied(),
        1,
    ));
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk("", "v1", "ConfigMap"));
    let api: Api<DynamicObject> = Api::all_with(server.client("dyn"), &ar);
    let sharded = ShardedWatcher::new_with(api, watcher::Config::default(), o.clone(), ar)
        .transform(|obj: &mut DynamicObject| {
            obj.metadata.managed_fields = None;
            obj.metadata
                .labels
                .get_or_insert_with(Default::default)
                .insert("seen-by".into(), "kube-shard".into());
        })
        .barrier_timeout(Duration::from_secs(1))
        .build_reflector();
    let store = sharded.store.clone();
    let task = tokio::spawn(sharded.events.for_each(|_| async {}));
    let want = owned_names(&all, &owned);
    until(Duration::from_secs(60), "dynamic projection", || {
        store
            .state()
            .iter()
            .map(|o| o.metadata.name.clone().unwrap())
            .collect::<BTreeSet<_>>()
            == want
    })
    .await;
    assert!(store.state().iter().all(|o| {
        o.metadata.managed_fields.is_none()
            && o.metadata
                .labels
                .as_ref()
                .is_some_and(|l| l["seen-by"] == "kube-shard")
    }));
    task.abort();
}

/// Gains one shard at a time: each gets its own LIST, and synced sub-watches are merged under the cap.
#[tokio::test(start_paused = true)]
async fn subwatches_are_capped_and_merged() {
    let (server, all) = crate::support::seeded(true, 200).await;
    let (me, o, d) = member("cap");
    d.apply(&grant(AssignmentView::new(1), &me, [0], 1));
    let r = read(&server, "cap", &o);
    let mut owned: BTreeSet<u32> = BTreeSet::from([0]);
    let first = owned_names(&all, &owned);
    until(Duration::from_secs(60), "initial", || {
        names(&r.store) == first
    })
    .await;
    for (i, s) in [2u32, 4, 6, 8, 10, 12, 14].into_iter().enumerate() {
        owned.insert(s);
        let gen = i as u64 + 2;
        d.apply(&grant(
            AssignmentView::new(gen),
            &me,
            owned.iter().copied(),
            gen,
        ));
        let want = owned_names(&all, &owned);
        until(Duration::from_secs(60), "gain", || names(&r.store) == want).await;
        assert!(
            r.stats.subwatches() <= 4,
            "at most 4 sub-watches, got {}",
            r.stats.subwatches()
        );
    }
    assert_eq!(
        r.stats.lists(),
        8,
        "one LIST per gained range, none for merges"
    );
    let acct = server.accounting("cap");
    assert!(acct.distinct_uids as usize <= owned_names(&all, &owned).len() + 10);
    r.task.abort();
}

/// The state of `shard` in this member's ownership, if it holds or reads it.
fn shard_state(o: &Ownership, shard: u32) -> Option<kube_shard::ownership::ShardState> {
    o.shard_states()
        .into_iter()
        .find(|(s, _)| *s == shard)
        .map(|(_, st)| st)
}

/// A shard this member did not read before (a takeover, a cold start) passes its activation barrier on
/// the sub-watch started for it: that sub-watch's first LIST is a consistent read issued after the
/// activation was seen. Before, the barrier waited for its own `limit=1` version, and when that LIST was
/// answered after the sub-watch's (here: its first attempt fails) with a write of another resource in
/// between (Lease renewals, in a group), the quiet collection's watch never passed it: activation waited
/// for a bookmark (every 60 s) or `barrier_timeout`, then a targeted LIST — 2 s per takeover by default.
#[tokio::test(start_paused = true)]
async fn a_fresh_sub_watch_list_is_the_activation_barrier() {
    use k8s_openapi::api::core::v1::Secret;
    use kube_shard::ownership::ShardState;
    let (server, all) = crate::support::seeded(true, 400).await;
    let (me, o, d) = member("fresh");
    let first: BTreeSet<u32> = (0..8).collect();
    d.apply(&grant(
        AssignmentView::new(1),
        &me,
        first.iter().copied(),
        1,
    ));
    let api: Api<ConfigMap> = Api::all(server.client("fresh"));
    let timeout = Duration::from_secs(600);
    let sharded = ShardedWatcher::new(api, watcher::Config::default(), o.clone())
        .barrier_timeout(timeout)
        .probe_interval(Duration::from_secs(3600))
        .build_reflector();
    let store = sharded.store.clone();
    let stats = sharded.stats.clone();
    let task = tokio::spawn(sharded.events.for_each(|_| async {}));
    let owned = |shards: &BTreeSet<u32>| {
        shards
            .iter()
            .all(|s| matches!(shard_state(&o, *s), Some(ShardState::Owned { .. })))
    };
    until(
        Duration::from_secs(60),
        "the first shards activated",
        || owned(&first),
    )
    .await;
    let admin: Api<ConfigMap> = Api::namespaced(server.client("admin"), NS);
    let gained: BTreeSet<u32> = (8..12).collect();
    let changed = owned_names(&all, &gained).into_iter().next().unwrap();
    admin
        .patch(
            &changed,
            &Default::default(),
            &kube::api::Patch::Merge(&serde_json::json!({"data":{"v":"before the grant"}})),
        )
        .await
        .unwrap();
    // writes of another resource go on (as Lease renewals do); the barrier's first LIST fails
    let secrets: Api<Secret> = Api::namespaced(server.client("admin"), NS);
    let writer = tokio::spawn(async move {
        for i in 0..100 {
            let s = Secret {
                metadata: ObjectMeta {
                    name: Some(format!("other-{i}")),
                    ..ObjectMeta::default()
                },
                ..Secret::default()
            };
            let _ = secrets.create(&PostParams::default(), &s).await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    server.faults().fail_next(
        Scope::identity("fresh"),
        FailRule::status(500)
            .verb(Verb::List)
            .resource("configmaps")
            .times(1),
    );
    let granted = tokio::time::Instant::now();
    d.apply(&grant(
        grant(AssignmentView::new(2), &me, first.iter().copied(), 1),
        &me,
        gained.iter().copied(),
        2,
    ));
    until(
        Duration::from_secs(120),
        "the gained shards activated",
        || owned(&gained),
    )
    .await;
    assert!(
        granted.elapsed() < Duration::from_secs(5),
        "activated {:?} after the grant: it waited for a bookmark or the barrier timeout",
        granted.elapsed()
    );
    assert_eq!(stats.targeted_lists(), 0, "no targeted barrier LIST");
    // what the activation promises: the write before the grant is in the store
    let held = store
        .state()
        .into_iter()
        .find(|c| c.metadata.name.as_deref() == Some(changed.as_str()))
        .expect("the changed object is held");
    assert_eq!(held.data.as_ref().unwrap()["v"], "before the grant");
    writer.abort();
    task.abort();
}

/// The other side of the rule above: a sub-watch started *before* a shard's activation was seen never
/// counts as that shard's barrier, even when its own first LIST was a consistent one (it was started for
/// another activation). Here one sub-watch is started for shard 8 (activating) and shard 9 (incoming);
/// its watch then freezes, the old owner of 9 writes, and 9 is granted: 9 must wait for the barrier's
/// targeted LIST and be activated with that write in the store. Without the sub-watch id check it was
/// activated at once, on the store from before the write.
#[tokio::test(start_paused = true)]
async fn a_sub_watch_started_before_an_activation_is_not_its_barrier() {
    use kube_shard::ownership::ShardState;
    let (server, all) = crate::support::seeded(true, 400).await;
    let (me, o, d) = member("early");
    let old = MemberId::new("old", "i1");
    let (x, y) = (8u32, 9u32);
    let view1 = grant(AssignmentView::new(1), &me, [x], 1).with(
        y,
        ShardAssignment::owned(old.clone(), 1).with_handoff(Handoff::Moving {
            id: 7,
            to: me.clone(),
        }),
    );
    d.apply(&view1);
    let api: Api<ConfigMap> = Api::all(server.client("early"));
    let sharded = ShardedWatcher::new(api, watcher::Config::default(), o.clone())
        .barrier_timeout(Duration::from_secs(5))
        .probe_interval(Duration::from_secs(3600))
        .build_reflector();
    let store = sharded.store.clone();
    let stats = sharded.stats.clone();
    let task = tokio::spawn(sharded.events.for_each(|_| async {}));
    let state = |s: u32| shard_state(&o, s);
    until(Duration::from_secs(60), "x activated and y warm", || {
        matches!(state(x), Some(ShardState::Owned { .. }))
            && matches!(state(y), Some(ShardState::Incoming { warm: true, .. }))
    })
    .await;
    assert_eq!(
        stats.targeted_lists(),
        0,
        "x passed on the sub-watch's LIST"
    );
    // the sub-watch's watch freezes; the old owner of y writes; y is granted to us
    server
        .faults()
        .freeze_watches(Scope::identity("early"), true);
    let name = owned_names(&all, &BTreeSet::from([y]))
        .into_iter()
        .next()
        .unwrap();
    let admin: Api<ConfigMap> = Api::namespaced(server.client("admin"), NS);
    admin
        .patch(
            &name,
            &Default::default(),
            &kube::api::Patch::Merge(&serde_json::json!({"data":{"v":"late"}})),
        )
        .await
        .unwrap();
    let view2 = grant(grant(AssignmentView::new(2), &me, [x], 1), &me, [y], 2);
    d.apply(&view2);
    let value = || {
        store
            .state()
            .iter()
            .find(|c| c.metadata.name.as_deref() == Some(name.as_str()))
            .and_then(|c| c.data.as_ref()?.get("v").cloned())
    };
    let start = tokio::time::Instant::now();
    loop {
        if matches!(state(y), Some(ShardState::Owned { .. })) {
            assert_eq!(
                value().as_deref(),
                Some("late"),
                "y was activated before the write made before its grant was read"
            );
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "y never activated"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(stats.targeted_lists() >= 1, "y's barrier needed its LIST");
    server
        .faults()
        .freeze_watches(Scope::identity("early"), false);
    task.abort();
}

/// A connection that black-holes requests (a load-balancer failover, a lost conntrack entry, an apiserver
/// gone) must not hold a granted shard unadmitted: every read-path LIST page is time-limited, and a LIST
/// that runs out of time starts again. Here the member's LISTs of the watched kind get no answer for an
/// hour while it is granted a shard it did not read (its new sub-watch's LIST) and the shard it was
/// the target of a move for (its barrier's `limit=1` LIST). The hole closes a second later; both shards
/// are activated (what admission waits for) within `barrier_timeout + 40 s` of that.
#[tokio::test(start_paused = true)]
async fn a_black_holed_list_does_not_hold_a_shard_unadmitted() {
    use kube_shard::ownership::ShardState;
    let (server, _all) = crate::support::seeded(true, 400).await;
    let (me, o, d) = member("a");
    let old = MemberId::new("old", "i1");
    let first: BTreeSet<u32> = (0..8).collect();
    let (taken, moved) = (8u32, 9u32);
    d.apply(
        &grant(AssignmentView::new(1), &me, first.iter().copied(), 1).with(
            moved,
            ShardAssignment::owned(old, 1).with_handoff(Handoff::Moving {
                id: 7,
                to: me.clone(),
            }),
        ),
    );
    let barrier_timeout = Duration::from_secs(2);
    let api: Api<ConfigMap> = Api::all(server.client("a"));
    let sharded = ShardedWatcher::new(api, watcher::Config::default(), o.clone())
        .barrier_timeout(barrier_timeout)
        .probe_interval(Duration::from_secs(3600))
        .build_reflector();
    let stats = sharded.stats.clone();
    let task = tokio::spawn(sharded.events.for_each(|_| async {}));
    // activated: what admission waits for (this test's member does not renew, so it is not admitted)
    let activated = |shards: &[u32]| {
        shards
            .iter()
            .all(|s| matches!(shard_state(&o, *s), Some(ShardState::Owned { .. })))
    };
    let first: Vec<u32> = first.into_iter().collect();
    until(
        Duration::from_secs(60),
        "the first shards activated and the moved one warm",
        || {
            activated(&first)
                && matches!(
                    shard_state(&o, moved),
                    Some(ShardState::Incoming { warm: true, .. })
                )
        },
    )
    .await;
    let hole = Scope::identity("a").verb(Verb::List).resource("configmaps");
    server
        .faults()
        .latency(hole.clone(), Some(Duration::from_secs(3600)));
    d.apply(&grant(
        grant(AssignmentView::new(2), &me, first.iter().copied(), 1),
        &me,
        [taken, moved],
        2,
    ));
    // the LISTs go out into the hole, then it closes: only new requests are answered
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        !activated(&[taken]) && !activated(&[moved]),
        "no LIST was answered"
    );
    server.faults().latency(hole, None);
    let closed = tokio::time::Instant::now();
    until(
        barrier_timeout + Duration::from_secs(40),
        "the granted shards activated after the hole closed",
        || activated(&[taken, moved]),
    )
    .await;
    eprintln!("activated {:?} after the hole closed", closed.elapsed());
    assert!(
        stats.errors() >= 2,
        "the sub-watch's and the barrier's timed-out LISTs count as errors: {}",
        stats.errors()
    );
    task.abort();
}

/// The same for a watch start: a granted shard whose sub-watch's WATCH goes into a black hole is
/// activated on its LIST, but would never see another event; the watch start is time-limited and retried
/// from the LIST's resourceVersion, so a write after the hole closed is in the store within
/// `barrier_timeout + 40 s`.
#[tokio::test(start_paused = true)]
async fn a_black_holed_watch_start_does_not_leave_a_shard_stale() {
    use kube_shard::ownership::ShardState;
    let (server, all) = crate::support::seeded(true, 400).await;
    let (me, o, d) = member("a");
    let first: BTreeSet<u32> = (0..8).collect();
    let taken = 8u32;
    let activated = |s: &u32| matches!(shard_state(&o, *s), Some(ShardState::Owned { .. }));
    d.apply(&grant(
        AssignmentView::new(1),
        &me,
        first.iter().copied(),
        1,
    ));
    let barrier_timeout = Duration::from_secs(2);
    let api: Api<ConfigMap> = Api::all(server.client("a"));
    let sharded = ShardedWatcher::new(api, watcher::Config::default(), o.clone())
        .barrier_timeout(barrier_timeout)
        .probe_interval(Duration::from_secs(3600))
        .build_reflector();
    let store = sharded.store.clone();
    let task = tokio::spawn(sharded.events.for_each(|_| async {}));
    until(
        Duration::from_secs(60),
        "the first shards activated",
        || first.iter().all(activated),
    )
    .await;
    let hole = Scope::identity("a")
        .verb(Verb::Watch)
        .resource("configmaps");
    server
        .faults()
        .latency(hole.clone(), Some(Duration::from_secs(3600)));
    d.apply(&grant(
        grant(AssignmentView::new(2), &me, first.iter().copied(), 1),
        &me,
        [taken],
        2,
    ));
    until(
        barrier_timeout + Duration::from_secs(10),
        "the granted shard activated on its LIST",
        || activated(&taken),
    )
    .await;
    // the sub-watch's watch start is in the hole; the hole closes, then the shard's object changes
    tokio::time::sleep(Duration::from_secs(1)).await;
    server.faults().latency(hole, None);
    let closed = tokio::time::Instant::now();
    let name = owned_names(&all, &BTreeSet::from([taken]))
        .into_iter()
        .next()
        .unwrap();
    let admin: Api<ConfigMap> = Api::namespaced(server.client("admin"), NS);
    admin
        .patch(
            &name,
            &Default::default(),
            &kube::api::Patch::Merge(&serde_json::json!({"data":{"v":"after the hole"}})),
        )
        .await
        .unwrap();
    until(
        barrier_timeout + Duration::from_secs(40),
        "the write after the hole closed in the store",
        || {
            store.state().iter().any(|c| {
                c.metadata.name.as_deref() == Some(name.as_str())
                    && c.data.as_ref().and_then(|d| d.get("v")).map(String::as_str)
                        == Some("after the hole")
            })
        },
    )
    .await;
    eprintln!(
        "the write arrived {:?} after the hole closed",
        closed.elapsed()
    );
    task.abort();
}
