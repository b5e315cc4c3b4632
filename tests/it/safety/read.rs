//! Read-path guarantees, each reproduced against testserver's in-memory API server in paused time:
//! re-watches start from what was processed, a shard's re-enqueue marker waits for its objects, fallback
//! barriers share one LIST, and the smaller rules (unparseable barrier versions, refused selectors, a
//! cancelled drain's re-grant, an unpolled consumer's backlog).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::{Api, Client};
use kube_shard::group::assignment::{AssignmentView, Handoff, ShardAssignment};
use kube_shard::ownership::{MemberId, Ownership, ShardState};
use kube_shard::watcher::{ReadMode, ShardedWatcher, WatcherStats};
use kube_shard_testserver::{Scope, TestServer, Verb};

use crate::read_path::watcher::{cm, grant, member, names, seed, shard_of_uid, until, NS};

/// What the consumer saw, in order: `("apply" | "delete" | "init", name, uid)`.
type Seen = Arc<Mutex<Vec<(&'static str, String, String)>>>;

struct Recorder {
    store: Store<ConfigMap>,
    stats: WatcherStats,
    seen: Seen,
    reenqueued: Arc<Mutex<BTreeSet<String>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Recorder {
    /// Events of `uid` after `after` (an Apply and its Delete may have been coalesced into the Delete).
    fn events_of(&self, uid: &str, after: usize) -> Vec<(&'static str, String, String)> {
        self.seen.lock().unwrap()[after..]
            .iter()
            .filter(|(_, _, u)| u == uid)
            .cloned()
            .collect()
    }

    fn mark(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    /// Create an object `x` in a shard `want` accepts, delete it, and wait until the consumer saw the
    /// delete; its uid.
    async fn created_and_deleted(
        &self,
        api: &Api<ConfigMap>,
        want: impl Fn(u32) -> bool,
    ) -> String {
        let (x, x_uid) = create_in(api, "x", want).await;
        api.delete(&x, &DeleteParams::default()).await.unwrap();
        until(Duration::from_secs(30), "X deleted in the store", || {
            self.seen
                .lock()
                .unwrap()
                .iter()
                .any(|(k, _, u)| *k == "delete" && *u == x_uid)
        })
        .await;
        x_uid
    }

    fn abort(&self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

fn record_with(client: Client, ownership: &Ownership, barrier: Duration) -> Recorder {
    record_config(client, ownership, barrier, watcher::Config::default())
}

fn record_config(
    client: Client,
    ownership: &Ownership,
    barrier: Duration,
    config: watcher::Config,
) -> Recorder {
    let api: Api<ConfigMap> = Api::all(client);
    let sharded = ShardedWatcher::new(api, config, ownership.clone())
        .barrier_timeout(barrier)
        .probe_interval(Duration::from_secs(30))
        .build_reflector();
    let store = sharded.store.clone();
    let stats = sharded.stats.clone();
    let seen: Seen = Arc::default();
    let log = seen.clone();
    let events = sharded.events;
    let t1 = tokio::spawn(async move {
        let mut events = std::pin::pin!(events);
        while let Some(item) = events.next().await {
            let entry = |k: &'static str, c: &ConfigMap| {
                (
                    k,
                    c.metadata.name.clone().unwrap_or_default(),
                    c.metadata.uid.clone().unwrap_or_default(),
                )
            };
            let e = match item {
                Ok(watcher::Event::Apply(c) | watcher::Event::InitApply(c)) => entry("apply", &c),
                Ok(watcher::Event::Delete(c)) => entry("delete", &c),
                Ok(watcher::Event::Init) => ("init", String::new(), String::new()),
                _ => continue,
            };
            log.lock().unwrap().push(e);
        }
    });
    let reenqueued: Arc<Mutex<BTreeSet<String>>> = Arc::default();
    let re = reenqueued.clone();
    let mut stream = sharded.reenqueue;
    let t2 = tokio::spawn(async move {
        while let Some(r) = stream.next().await {
            re.lock().unwrap().insert(r.name.clone());
        }
    });
    Recorder {
        store,
        stats,
        seen,
        reenqueued,
        tasks: vec![t1, t2],
    }
}

fn record(server: &TestServer, identity: &str, ownership: &Ownership) -> Recorder {
    record_with(server.client(identity), ownership, Duration::from_secs(1))
}

fn in_shards(all: &BTreeMap<String, String>, shards: impl Fn(u32) -> bool) -> BTreeSet<String> {
    all.iter()
        .filter(|(_, uid)| shards(shard_of_uid(uid)))
        .map(|(n, _)| n.clone())
        .collect()
}

/// Create objects named `prefix-<i>` until one lands in a shard `want` accepts; returns its name and uid.
async fn create_in(
    api: &Api<ConfigMap>,
    prefix: &str,
    want: impl Fn(u32) -> bool,
) -> (String, String) {
    for i in 0.. {
        let name = format!("{prefix}-{i}");
        let c = api
            .create(&PostParams::default(), &cm(&name, "0"))
            .await
            .unwrap();
        let uid = c.metadata.uid.unwrap();
        if want(shard_of_uid(&uid)) {
            return (name, uid);
        }
        api.delete(&name, &DeleteParams::default()).await.unwrap();
    }
    unreachable!()
}

fn owned_all(o: &Ownership, shards: impl IntoIterator<Item = u32>) -> bool {
    let states: BTreeMap<u32, ShardState> = o.shard_states();
    shards
        .into_iter()
        .all(|s| matches!(states.get(&s), Some(ShardState::Owned { .. })))
}

/// A narrowing re-watches from what the sub-watch processed, not from its first LIST: an object created and
/// deleted since is never applied again.
#[tokio::test(start_paused = true)]
async fn narrowing_replays_no_deleted_object() {
    let (server, all) = crate::support::seeded(true, 100).await;
    let admin = server.client("admin");
    let (me, o, d) = member("f14");
    d.apply(&grant(AssignmentView::new(1), &me, 0..8, 1));
    let r = record(&server, "f14", &o);
    let want = in_shards(&all, |s| s < 8);
    until(Duration::from_secs(60), "initial", || {
        names(&r.store) == want
    })
    .await;
    let api: Api<ConfigMap> = Api::namespaced(admin.clone(), NS);
    // X in a shard that stays read; created and deleted after the sub-watch's LIST
    let x_uid = r.created_and_deleted(&api, |s| s < 4).await;
    let mark = r.mark();
    let lists = server.accounting("f14").requests(Verb::List);
    // narrow: drop shards 4..8
    d.apply(&grant(AssignmentView::new(2), &me, 0..4, 1));
    tokio::time::sleep(Duration::from_secs(10)).await;
    let replayed = r.events_of(&x_uid, mark);
    assert!(
        replayed.is_empty(),
        "a deleted object is replayed after a narrowing: {replayed:?}"
    );
    assert_eq!(names(&r.store), in_shards(&all, |s| s < 4));
    assert_eq!(
        server.accounting("f14").requests(Verb::List),
        lists,
        "narrowing issues no LIST"
    );
    r.abort();
}

/// After the server's history window has moved past the sub-watch's LIST, a narrowing still needs no LIST
/// (bookmarks carried the sub-watch forward).
#[tokio::test(start_paused = true)]
async fn narrowing_after_the_history_window_lists_nothing() {
    let server = TestServer::builder()
        .shard_selector(true)
        .history(30)
        .bookmark_interval(Duration::from_secs(1))
        .build();
    let admin = server.client("admin");
    let all = seed(&admin, 100).await;
    let (me, o, d) = member("f14h");
    d.apply(&grant(AssignmentView::new(1), &me, 0..8, 1));
    let r = record(&server, "f14h", &o);
    let want = in_shards(&all, |s| s < 8);
    until(Duration::from_secs(60), "initial", || {
        names(&r.store) == want
    })
    .await;
    // many writes, only outside the read shards: the LIST's version leaves the history
    let api: Api<ConfigMap> = Api::namespaced(admin.clone(), NS);
    let others: Vec<String> = in_shards(&all, |s| s >= 8).into_iter().collect();
    for round in 0..3 {
        for n in &others {
            let patch = serde_json::json!({"data": {"v": format!("r{round}")}});
            api.patch(n, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .unwrap();
        }
    }
    // bookmarks arrive
    tokio::time::sleep(Duration::from_secs(5)).await;
    let lists = server.accounting("f14h").requests(Verb::List);
    d.apply(&grant(AssignmentView::new(2), &me, 0..4, 1));
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(names(&r.store), in_shards(&all, |s| s < 4));
    assert_eq!(
        server.accounting("f14h").requests(Verb::List),
        lists,
        "a narrowing outside the history window relisted"
    );
    r.abort();
}

/// A targeted barrier LIST settles a shard while its sub-watch is behind; the sub-watch's later replay of an
/// object created and deleted before that LIST must not apply it.
#[tokio::test(start_paused = true)]
async fn barrier_relist_floor_ignores_replayed_creates() {
    let (server, all) = crate::support::seeded(true, 100).await;
    let admin = server.client("admin");
    let (me, o, d) = member("f14b");
    let other = MemberId::new("z", "i1");
    let view1 = grant(
        grant(AssignmentView::new(1), &me, 0..4, 1),
        &other,
        4..16,
        1,
    );
    d.apply(&view1);
    let r = record(&server, "f14b", &o);
    until(Duration::from_secs(60), "initial", || {
        names(&r.store) == in_shards(&all, |s| s < 4)
    })
    .await;
    // shard 9 moves to us: read while Incoming
    let mut view2 = view1.clone();
    view2.generation = 2;
    let view2 = view2.with(
        9,
        ShardAssignment::owned(other.clone(), 1).with_handoff(Handoff::Moving {
            id: 5,
            to: me.clone(),
        }),
    );
    d.apply(&view2);
    until(Duration::from_secs(30), "warm", || {
        r.stats.warm_reports() >= 1
    })
    .await;
    // our watches stall; Y is created and deleted meanwhile
    server
        .faults()
        .freeze_watches(Scope::identity("f14b"), true);
    let api: Api<ConfigMap> = Api::namespaced(admin.clone(), NS);
    let (y, y_uid) = create_in(&api, "y", |s| s == 9).await;
    api.delete(&y, &DeleteParams::default()).await.unwrap();
    // granted: the barrier times out and a targeted LIST settles it
    let view3 = grant(view1.clone(), &me, [9], 3);
    let mut view3 = view3;
    view3.generation = 3;
    d.apply(&view3);
    until(Duration::from_secs(30), "activated", || owned_all(&o, [9])).await;
    let mark = r.mark();
    server
        .faults()
        .freeze_watches(Scope::identity("f14b"), false);
    tokio::time::sleep(Duration::from_secs(10)).await;
    let replayed = r.events_of(&y_uid, mark);
    assert!(
        replayed.is_empty(),
        "the replay applied an object deleted before the barrier LIST: {replayed:?}"
    );
    assert_eq!(names(&r.store), in_shards(&all, |s| s < 4 || s == 9));
    r.abort();
}

/// Back to server mode narrows the full watch from what it processed: an object created and deleted during
/// fallback is not applied again.
#[tokio::test(start_paused = true)]
async fn back_to_server_replays_no_deleted_object() {
    let (server, all) = crate::support::seeded(false, 100).await;
    let admin = server.client("admin");
    let (me, o, d) = member("f14s");
    d.apply(&grant(AssignmentView::new(1), &me, 0..8, 1));
    let r = record(&server, "f14s", &o);
    let want = in_shards(&all, |s| s < 8);
    until(Duration::from_secs(60), "fallback projection", || {
        names(&r.store) == want
    })
    .await;
    assert_eq!(r.stats.mode(), ReadMode::Fallback);
    let api: Api<ConfigMap> = Api::namespaced(admin.clone(), NS);
    let x_uid = r.created_and_deleted(&api, |s| s < 8).await;
    let mark = r.mark();
    server.set_shard_selector(true);
    until(Duration::from_secs(120), "server mode again", || {
        r.stats.mode() == ReadMode::Server
    })
    .await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    // no replay of X at all: neither a phantom Apply nor (when the queue coalesced it away) its Delete
    let replayed = r.events_of(&x_uid, mark);
    assert!(
        replayed.is_empty(),
        "X, deleted before the return to server mode, was replayed: {replayed:?}"
    );
    assert_eq!(names(&r.store), want);
    r.abort();
}

/// In fallback mode, the barriers of a takeover of 8 shards that time out together cost one LIST of the
/// collection, not one per shard.
#[tokio::test(start_paused = true)]
async fn fallback_barriers_cost_one_full_list() {
    const N: usize = 10_000;
    let (server, all) = crate::support::seeded(false, N).await;
    let (me, o, d) = member("f16");
    d.apply(&grant(AssignmentView::new(1), &me, 0..8, 1));
    let r = record_with(server.client("f16"), &o, Duration::from_millis(100));
    let want = in_shards(&all, |s| s < 8);
    until(Duration::from_secs(120), "initial", || {
        names(&r.store) == want
    })
    .await;
    assert_eq!(r.stats.mode(), ReadMode::Fallback);
    // a quiet collection in a busy cluster: writes elsewhere move the version the barriers wait for, no
    // ConfigMap event or bookmark passes it within the barrier timeout
    let ns: Api<Namespace> = Api::all(server.client("admin"));
    for i in 0..3 {
        let mut other = Namespace::default();
        other.metadata.name = Some(format!("elsewhere-{i}"));
        ns.create(&PostParams::default(), &other).await.unwrap();
    }
    let before = server.accounting("f16");
    let targeted = r.stats.targeted_lists();
    // a takeover of 8 shards
    d.apply(&grant(
        grant(AssignmentView::new(2), &me, 0..8, 1),
        &me,
        8..16,
        2,
    ));
    until(Duration::from_secs(60), "activated", || {
        owned_all(&o, 0..16)
    })
    .await;
    until(Duration::from_secs(60), "projection", || r.store.len() == N).await;
    let after = server.accounting("f16");
    let items = after.list_items - before.list_items;
    assert_eq!(
        r.stats.targeted_lists() - targeted,
        1,
        "one targeted LIST for the 8 barriers"
    );
    assert!(
        items < 2 * N as u64,
        "the barriers listed {items} items for a {N}-object collection"
    );
    r.abort();
}

/// A shard activated before its objects were read keeps its re-enqueue marker until they are: every object of
/// the shard is re-enqueued.
#[tokio::test(start_paused = true)]
async fn reenqueue_marker_waits_for_the_shards_objects() {
    let (server, all) = crate::support::seeded(true, 300).await;
    let (me, o, d) = member("f15");
    d.apply(&grant(AssignmentView::new(1), &me, 0..4, 1));
    let r = record(&server, "f15", &o);
    until(Duration::from_secs(60), "initial", || {
        names(&r.store) == in_shards(&all, |s| s < 4)
    })
    .await;
    // granted and activated at once (as a runtime that counts no reader does): the LIST comes later
    d.apply(&grant(
        grant(AssignmentView::new(2), &me, 0..4, 1),
        &me,
        8..12,
        2,
    ));
    for s in 8..12 {
        d.activate(s, 2);
    }
    let gained = in_shards(&all, |s| (8..12).contains(&s));
    until(
        Duration::from_secs(60),
        "gained objects in the store",
        || names(&r.store).is_superset(&gained),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let re = r.reenqueued.lock().unwrap().clone();
    let missing: Vec<&String> = gained.iter().filter(|n| !re.contains(*n)).collect();
    assert!(
        missing.is_empty(),
        "{} of {} objects of the activated shards never re-enqueued",
        missing.len(),
        gained.len()
    );
    r.abort();
}

/// A barrier whose version cannot be parsed is settled by a consistent LIST, never by `resourceVersion=0`
/// (any cached state).
#[tokio::test(start_paused = true)]
async fn unparseable_barrier_version_lists_consistently() {
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    let (server, all) = crate::support::seeded(true, 100).await;
    let inner = server.service("f17a");
    let uris: Arc<Mutex<Vec<String>>> = Arc::default();
    let log = uris.clone();
    let svc = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let inner = inner.clone();
        let log = log.clone();
        async move {
            let query = req.uri().query().unwrap_or_default().to_owned();
            let is_watch = query.contains("watch=true");
            if !is_watch {
                log.lock().unwrap().push(query.clone());
            }
            let barrier_version = !is_watch && query.split('&').any(|p| p == "limit=1");
            let resp = match inner.oneshot(req).await {
                Ok(resp) => resp,
                Err(refused) => return Err(refused),
            };
            if !barrier_version || query.contains("resourceVersion") {
                return Ok(resp);
            }
            // an opaque, non-numeric version
            let (parts, body) = resp.into_parts();
            let bytes = body.collect().await.unwrap().to_bytes();
            let mut v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
            v["metadata"]["resourceVersion"] = serde_json::json!("opaque-version");
            let body = http_body_util::Full::new(bytes::Bytes::from(v.to_string())).boxed_unsync();
            Ok(http::Response::from_parts(parts, body))
        }
    });
    let client = Client::new(svc, "default");
    let (me, o, d) = member("f17a");
    d.apply(&grant(AssignmentView::new(1), &me, 0..4, 1));
    // without a page size: kube drops `resourceVersion=0` only from paged LISTs
    let config = watcher::Config {
        page_size: None,
        ..watcher::Config::default()
    };
    let r = record_config(client, &o, Duration::from_secs(1), config);
    until(Duration::from_secs(60), "activated", || owned_all(&o, 0..4)).await;
    assert_eq!(names(&r.store), in_shards(&all, |s| s < 4));
    let stale: Vec<String> = uris
        .lock()
        .unwrap()
        .iter()
        .filter(|q| q.contains("resourceVersion=0"))
        .cloned()
        .collect();
    assert!(
        stale.is_empty(),
        "barrier settled from any cached state: {stale:?}"
    );
    r.abort();
}

/// After an `invalid shard selector` 500, a successful re-probe does not send the refused selectors again
/// every quiet period.
#[tokio::test(start_paused = true)]
async fn invalid_selector_is_not_retried_after_a_probe() {
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    let (server, all) = crate::support::seeded(true, 100).await;
    let inner = server.service("f17b");
    // refuses every selector except on `limit=1` LISTs (the re-probe and barrier versions)
    let svc = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let inner = inner.clone();
        async move {
            let q = req.uri().query().unwrap_or_default().to_owned();
            let small = q.split('&').any(|p| p == "limit=1");
            if q.contains("shardSelector=") && !small {
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
    let (me, o, d) = member("f17b");
    d.apply(&grant(AssignmentView::new(1), &me, 0..8, 1));
    let r = record_with(Client::new(svc, "default"), &o, Duration::from_secs(1));
    let want = in_shards(&all, |s| s < 8);
    until(Duration::from_secs(120), "fallback projection", || {
        names(&r.store) == want
    })
    .await;
    assert_eq!(r.stats.invalid_selector_alarms(), 1);
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert_eq!(
        r.stats.invalid_selector_alarms(),
        1,
        "the refused selectors were sent again after re-probes"
    );
    assert_eq!(r.stats.mode(), ReadMode::Fallback);
    assert_eq!(names(&r.store), want);
    r.abort();
}

/// A move cancelled while Draining re-grants the shard to its owner: the store keeps its objects (no
/// Delete-then-Apply of the whole shard), and the activation re-enqueues them.
#[tokio::test(start_paused = true)]
async fn cancel_from_draining_regrant_keeps_the_store() {
    let (server, all) = crate::support::seeded(true, 200).await;
    let (me, o, d) = member("f17c");
    let b = MemberId::new("b", "i1");
    let view1 = grant(AssignmentView::new(1), &me, 0..4, 1);
    d.apply(&view1);
    let r = record(&server, "f17c", &o);
    until(Duration::from_secs(60), "initial", || {
        names(&r.store) == in_shards(&all, |s| s < 4)
    })
    .await;
    let moving = |generation: u64, handoff: Handoff| {
        let mut v = view1.clone();
        v.generation = generation;
        v.with(
            2,
            ShardAssignment::owned(me.clone(), 1).with_handoff(handoff),
        )
    };
    // a reconcile in flight keeps the drain open: the cancel comes while the shard is Outgoing
    let permit = o.admit_shard(2).expect("shard 2 is admitted");
    d.apply(&moving(
        2,
        Handoff::Moving {
            id: 7,
            to: b.clone(),
        },
    ));
    d.apply(&moving(
        3,
        Handoff::Draining {
            id: 7,
            to: b.clone(),
        },
    ));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        matches!(
            kube_shard::testing::member_state(&o)
                .shards()
                .find(|(s, _)| *s == 2),
            Some((_, ShardState::Outgoing { .. }))
        ),
        "draining"
    );
    let mark = r.mark();
    let reenqueued = r.stats.reenqueued();
    // cancelled from Draining: granted back to us at a new epoch
    let mut view4 = view1.with(2, ShardAssignment::owned(me.clone(), 4));
    view4.generation = 4;
    d.apply(&view4);
    drop(permit);
    until(Duration::from_secs(30), "activated again", || {
        owned_all(&o, [2])
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let shard2 = in_shards(&all, |s| s == 2);
    let flapped: Vec<_> = r.seen.lock().unwrap()[mark..]
        .iter()
        .filter(|(_, n, _)| shard2.contains(n))
        .cloned()
        .collect();
    assert!(
        flapped.is_empty(),
        "the re-grant flapped the store: {flapped:?}"
    );
    assert_eq!(names(&r.store), in_shards(&all, |s| s < 4));
    assert!(
        r.stats.reenqueued() >= reenqueued + shard2.len() as u64,
        "the activation re-enqueues the shard"
    );
    r.abort();
}

/// A consumer that stops polling does not make the manager queue every event: queued events are coalesced per
/// object, so the backlog is bounded by the objects, not by the writes.
#[tokio::test(start_paused = true)]
async fn unpolled_consumer_backlog_is_bounded_by_objects() {
    const OBJECTS: usize = 20;
    const ROUNDS: usize = 100;
    let (server, all) = crate::support::seeded(true, OBJECTS).await;
    let admin = server.client("admin");
    let (me, o, d) = member("f17d");
    d.apply(&grant(AssignmentView::new(1), &me, 0..16, 1));
    let api: Api<ConfigMap> = Api::all(server.client("f17d"));
    let events = ShardedWatcher::new(api, watcher::Config::default(), o.clone())
        .barrier_timeout(Duration::from_secs(1))
        .build()
        .events;
    let mut events = std::pin::pin!(events);
    // the initial sync, then the consumer stops polling
    loop {
        match events.next().await {
            Some(Ok(watcher::Event::InitDone)) => break,
            Some(_) => {}
            None => panic!("the stream ended"),
        }
    }
    let writes: Api<ConfigMap> = Api::namespaced(admin.clone(), NS);
    for round in 1..=ROUNDS {
        for n in all.keys() {
            let patch = serde_json::json!({"data": {"v": round.to_string()}});
            writes
                .patch(n, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .unwrap();
        }
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    // resume: everything queued arrives at once
    let mut received = 0usize;
    let mut last: BTreeMap<String, String> = BTreeMap::new();
    while let Ok(Some(item)) = tokio::time::timeout(Duration::from_secs(1), events.next()).await {
        if let Ok(watcher::Event::Apply(c)) = item {
            received += 1;
            last.insert(
                c.metadata.name.clone().unwrap(),
                c.data.unwrap()["v"].clone(),
            );
        }
    }
    assert!(
        last.len() == OBJECTS && last.values().all(|v| *v == ROUNDS.to_string()),
        "every object ends at its last write"
    );
    // the channel to the consumer holds 256; the manager's own queue at most one event per object
    assert!(
        received <= 256 + 2 * OBJECTS,
        "{received} events queued for {} writes of {OBJECTS} objects",
        OBJECTS * ROUNDS
    );
}
