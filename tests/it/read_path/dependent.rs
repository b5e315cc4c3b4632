//! Secondary caches against testserver, in paused time: children placed by their controller owner, by the
//! shard label (and its migration), referenced objects through the dependency-key map, and the namespace key.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Client, Resource};
use kube_shard::group::assignment::{AssignmentView, Handoff, ShardAssignment};
use kube_shard::group::report::Ack;
use kube_shard::ownership::{MemberId, Ownership, OwnershipConfig};
use kube_shard::testing::{self, TestDriver};
use kube_shard::watcher::{stamp_shard_label, SHARD_LABEL};
use kube_shard::watcher::{
    Dependency, DependencyMap, DependentError, ReadMode, ShardedReflector, ShardedWatcher,
    WatcherStats,
};
use kube_shard::{fnv1a64, ShardCount, ShardKey};
use kube_shard_testserver::TestServer;

use crate::read_path::watcher::{grant, member, seed, shard_of_uid, shards, until, NS};

struct Running<K: Resource + Clone + 'static>
where
    K::DynamicType: Clone + Eq + std::hash::Hash,
{
    store: Store<K>,
    stats: WatcherStats,
    task: tokio::task::JoinHandle<()>,
}

fn run<K>(sharded: ShardedReflector<K>) -> Running<K>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Clone + Eq + std::hash::Hash + Send + Sync,
{
    let store = sharded.store.clone();
    let stats = sharded.stats.clone();
    let task = tokio::spawn(sharded.events.for_each(|_| async {}));
    Running { store, stats, task }
}

fn config(role: &str) -> watcher::Config {
    watcher::Config::default().labels(&format!("role={role}"))
}

/// Primaries (parents, referrers) of one role.
fn primaries(
    server: &TestServer,
    identity: &str,
    o: &Ownership,
    role: &str,
) -> ShardedWatcher<ConfigMap> {
    ShardedWatcher::new(Api::all(server.client(identity)), config(role), o.clone())
        .barrier_timeout(Duration::from_secs(1))
}

/// Metadata-only secondaries of one role placed by `dep`.
fn secondaries(
    server: &TestServer,
    identity: &str,
    o: &Ownership,
    role: &str,
    dep: Dependency<PartialObjectMeta<ConfigMap>>,
) -> Running<PartialObjectMeta<ConfigMap>> {
    run(ShardedWatcher::metadata(
        Api::<ConfigMap>::all(server.client(identity)),
        config(role),
        o.clone(),
    )
    .dependent(dep)
    .unwrap()
    .barrier_timeout(Duration::from_secs(1))
    .build_reflector())
}

fn names_of<K>(store: &Store<K>) -> BTreeSet<String>
where
    K: Resource + Clone,
    K::DynamicType: Clone + Eq + std::hash::Hash,
{
    store
        .state()
        .iter()
        .map(|o| o.meta().name.clone().unwrap())
        .collect()
}

fn object(name: &str, role: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(NS.into()),
            labels: Some(BTreeMap::from([("role".to_owned(), role.to_owned())])),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    }
}

fn owned_by(mut c: ConfigMap, parent: &ConfigMap) -> ConfigMap {
    c.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        name: parent.metadata.name.clone().unwrap(),
        uid: parent.metadata.uid.clone().unwrap(),
        controller: Some(true),
        ..OwnerReference::default()
    }]);
    c
}

async fn create(api: &Api<ConfigMap>, c: &ConfigMap) -> ConfigMap {
    api.create(&PostParams::default(), c).await.unwrap()
}

/// The parents, and per parent name its children's names.
struct Family {
    parents: BTreeMap<String, ConfigMap>,
    children: BTreeMap<String, BTreeSet<String>>,
}

impl Family {
    fn shard_of(&self, parent: &str) -> u32 {
        shard_of_uid(self.parents[parent].metadata.uid.as_deref().unwrap())
    }

    fn children_of_shards(&self, shards: &BTreeSet<u32>) -> BTreeSet<String> {
        self.children
            .iter()
            .filter(|(p, _)| shards.contains(&self.shard_of(p)))
            .flat_map(|(_, c)| c.iter().cloned())
            .collect()
    }

    fn parents_in(&self, shards: &BTreeSet<u32>) -> Vec<String> {
        self.parents
            .keys()
            .filter(|p| shards.contains(&self.shard_of(p)))
            .cloned()
            .collect()
    }
}

/// `n` parents with `k` children each (controller ownerReferences; `label` stamps the shard label).
async fn family(client: &Client, n: usize, k: usize, label: bool) -> Family {
    seed(client, 0).await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    let mut f = Family {
        parents: BTreeMap::new(),
        children: BTreeMap::new(),
    };
    for i in 0..n {
        let p = create(&api, &object(&format!("p-{i}"), "parent")).await;
        let mut kids = BTreeSet::new();
        for j in 0..k {
            let mut c = owned_by(object(&format!("c-{i}-{j}"), "child"), &p);
            if label {
                stamp_shard_label(
                    &mut c.metadata,
                    shard_of_uid(p.metadata.uid.as_deref().unwrap()),
                );
            }
            kids.insert(create(&api, &c).await.metadata.name.unwrap());
        }
        f.children.insert(p.metadata.name.clone().unwrap(), kids);
        f.parents.insert(p.metadata.name.clone().unwrap(), p);
    }
    // noise: orphans and a non-controller owner are never placed
    create(&api, &object("orphan", "child")).await;
    let mut weak = owned_by(object("weak", "child"), f.parents.values().next().unwrap());
    weak.metadata.owner_references.as_mut().unwrap()[0].controller = Some(false);
    create(&api, &weak).await;
    f
}

fn view(
    gen: u64,
    a: &MemberId,
    sa: impl IntoIterator<Item = u32>,
    b: &MemberId,
    sb: impl IntoIterator<Item = u32>,
) -> AssignmentView {
    grant(grant(AssignmentView::new(gen), a, sa, 1), b, sb, 1)
}

fn with_move(
    base: &AssignmentView,
    gen: u64,
    from: &MemberId,
    to: &MemberId,
    moving: &[u32],
    h: impl Fn(MemberId) -> Handoff,
) -> AssignmentView {
    let mut v = base.clone();
    v.generation = gen;
    for s in moving {
        v = v.with(
            *s,
            ShardAssignment::owned(from.clone(), 1).with_handoff(h(to.clone())),
        );
    }
    v
}

async fn wait_acks(o: &Ownership, moving: &[u32], warm: bool, what: &str) {
    until(Duration::from_secs(60), what, || {
        let acks = kube_shard::testing::member_state(o).acks();
        moving.iter().all(|s| {
            acks.iter().any(|k| match k {
                Ack::Warm { shard, move_id: 7 } => warm && shard == s,
                Ack::Released {
                    shard, move_id: 7, ..
                } => !warm && shard == s,
                _ => false,
            })
        })
    })
    .await;
}

/// Move `moving` from `a` to `b` (move id 7): Moving → b warm → Draining → a released → Owned(b, gen 4).
/// `during` runs while b is Incoming and before b acked warm, `draining` while a drains.
#[allow(clippy::too_many_arguments)]
async fn move_shards(
    base: &AssignmentView,
    (a, oa, da): (&MemberId, &Ownership, &TestDriver),
    (b, ob, db): (&MemberId, &Ownership, &TestDriver),
    moving: &[u32],
    during: impl std::future::Future<Output = ()>,
    after_warm: impl std::future::Future<Output = ()>,
    draining: impl std::future::Future<Output = ()>,
) {
    let v2 = with_move(base, 2, a, b, moving, |to| Handoff::Moving { id: 7, to });
    da.apply(&v2);
    db.apply(&v2);
    during.await;
    wait_acks(ob, moving, true, "warm").await;
    after_warm.await;
    let v3 = with_move(base, 3, a, b, moving, |to| Handoff::Draining { id: 7, to });
    da.apply(&v3);
    db.apply(&v3);
    draining.await;
    wait_acks(oa, moving, false, "released").await;
    let mut v4 = base.clone();
    v4.generation = 4;
    for s in moving {
        v4 = v4.with(*s, ShardAssignment::owned(b.clone(), 4));
    }
    da.apply(&v4);
    db.apply(&v4);
}

type Log = Arc<Mutex<BTreeMap<String, Vec<BTreeSet<String>>>>>;

/// The referenced objects' store, reconciles that missed theirs, and reconcile counts.
type RefCtx = (
    Store<ConfigMap>,
    Arc<Mutex<Vec<String>>>,
    Arc<Mutex<BTreeMap<String, usize>>>,
);

#[tokio::test(start_paused = true)]
async fn children_by_owner_reference_move_with_their_parents_server_mode() {
    children_by_owner_reference_move_with_their_parents(true, false).await;
}

/// The same children labelled and read with the shard label selector: a gained shard's children are listed
/// by label while it is Incoming.
#[tokio::test(start_paused = true)]
async fn children_by_shard_label_move_with_their_parents() {
    children_by_owner_reference_move_with_their_parents(true, true).await;
}

/// The same without KEP-5866 on the server: the primaries fall back to a full watch; secondaries are read
/// the same way.
#[tokio::test(start_paused = true)]
async fn children_by_owner_reference_move_with_their_parents_fallback_mode() {
    children_by_owner_reference_move_with_their_parents(false, false).await;
}

/// Children by controller ownerReference: each member's child store holds exactly the children of its
/// owned and Incoming parents; after a move the new owner's first reconcile of every moved parent sees all
/// of its children, although they changed during the move (timebertt/kubernetes-controller-sharding#639).
async fn children_by_owner_reference_move_with_their_parents(gate: bool, label: bool) {
    let dep = || {
        if label {
            Dependency::shard_label()
        } else {
            Dependency::controller_owner()
        }
    };
    // a child of `parent`, stamped with its shard under the label strategy
    let child = move |name: String, parent: &ConfigMap| {
        let mut c = owned_by(object(&name, "child"), parent);
        if label {
            stamp_shard_label(
                &mut c.metadata,
                shard_of_uid(parent.metadata.uid.as_deref().unwrap()),
            );
        }
        c
    };
    use kube::runtime::{controller::Action, Controller, WatchStreamExt};

    let server = TestServer::builder().shard_selector(gate).build();
    let admin = server.client("admin");
    let mut fam = family(&admin, 48, 3, label).await;
    let (a, oa, da) = member("a");
    let (b, ob, db) = member("b");
    let base = view(1, &a, 0..8, &b, 8..16);
    da.apply(&base);
    db.apply(&base);

    let pa = run(primaries(&server, "a-parents", &oa, "parent").build_reflector());
    let ca = secondaries(&server, "a-children", &oa, "child", dep());
    // b: a Controller with owns_stream over its child watcher; reconcile logs what the child store holds
    let pb = primaries(&server, "b-parents", &ob, "parent").build_reflector();
    let cb = ShardedWatcher::metadata(
        Api::<ConfigMap>::all(server.client("b-children")),
        config("child"),
        ob.clone(),
    )
    .dependent(dep())
    .unwrap()
    .barrier_timeout(Duration::from_secs(1))
    .build_reflector();
    let cb_store = cb.store.clone();
    let pb_store = pb.store.clone();
    let log: Log = Arc::default();
    let ctx = Arc::new((cb_store.clone(), log.clone()));
    let ctrl = Controller::for_stream(pb.events.applied_objects(), pb_store.clone())
        .owns_stream(cb.events.touched_objects())
        .reconcile_on(pb.reenqueue)
        .run(
            |p: Arc<ConfigMap>, ctx: Arc<(Store<PartialObjectMeta<ConfigMap>>, Log)>| async move {
                let uid = p.metadata.uid.clone();
                let kids: BTreeSet<String> = ctx
                    .0
                    .state()
                    .iter()
                    .filter(|c| {
                        c.metadata.owner_references.as_ref().is_some_and(|o| {
                            o.iter()
                                .any(|r| r.controller == Some(true) && Some(&r.uid) == uid.as_ref())
                        })
                    })
                    .map(|c| c.metadata.name.clone().unwrap())
                    .collect();
                ctx.1
                    .lock()
                    .unwrap()
                    .entry(p.metadata.name.clone().unwrap())
                    .or_default()
                    .push(kids);
                Ok::<_, std::convert::Infallible>(Action::await_change())
            },
            |_, _, _| Action::await_change(),
            ctx,
        )
        .for_each(|_| async {});
    let ctl_task = tokio::spawn(ctrl);

    let own_a: BTreeSet<u32> = (0..8).collect();
    let own_b: BTreeSet<u32> = (8..16).collect();
    until(Duration::from_secs(60), "initial child stores", || {
        names_of(&ca.store) == fam.children_of_shards(&own_a)
            && names_of(&cb_store) == fam.children_of_shards(&own_b)
    })
    .await;
    assert_eq!(
        ca.stats.mode(),
        if label {
            ReadMode::Server
        } else {
            ReadMode::Fallback
        },
        "label: filtered by the server; owner: a full watch, filtered locally"
    );
    assert_eq!(names_of(&pa.store).len(), fam.parents_in(&own_a).len());

    // move shards 2 and 3 to b; their parents' children change before b is warm, and while a drains
    // the two of a's shards with the most parents: uids are random, a fixed pair may carry none
    let mut of_a: Vec<u32> = own_a.iter().copied().collect();
    of_a.sort_by_key(|s| std::cmp::Reverse(fam.parents_in(&BTreeSet::from([*s])).len()));
    let moving = [of_a[0], of_a[1]];
    let moved: BTreeSet<u32> = moving.into_iter().collect();
    let moved_parents = fam.parents_in(&moved);
    assert!(moved_parents.len() >= 2, "the move carries parents");
    let api: Api<ConfigMap> = Api::namespaced(admin.clone(), NS);
    let during = {
        let (api, parents, fam_parents) = (api.clone(), moved_parents.clone(), fam.parents.clone());
        async move {
            for p in &parents {
                let i = p.trim_start_matches("p-");
                api.delete(&format!("c-{i}-0"), &Default::default())
                    .await
                    .unwrap();
                create(&api, &child(format!("c-{i}-new"), &fam_parents[p])).await;
            }
        }
    };
    let after_warm = async {
        // Incoming: b's child store already holds the moved parents' children; its parent store does not
        let want: BTreeSet<String> = moved_parents
            .iter()
            .flat_map(|p| {
                let i = p.trim_start_matches("p-").to_owned();
                [format!("c-{i}-1"), format!("c-{i}-2"), format!("c-{i}-new")]
            })
            .collect();
        until(
            Duration::from_secs(30),
            "children of Incoming parents",
            || want.is_subset(&names_of(&cb_store)),
        )
        .await;
        assert!(
            moved_parents
                .iter()
                .all(|p| !names_of(&pb_store).contains(p)),
            "primaries project no Incoming shard"
        );
    };
    let draining = {
        let (api, parents, fam_parents) = (api.clone(), moved_parents.clone(), fam.parents.clone());
        async move {
            for p in &parents {
                let i = p.trim_start_matches("p-");
                create(&api, &child(format!("c-{i}-late"), &fam_parents[p])).await;
            }
        }
    };
    move_shards(
        &base,
        (&a, &oa, &da),
        (&b, &ob, &db),
        &moving,
        during,
        after_warm,
        draining,
    )
    .await;
    for p in &moved_parents {
        let i = p.trim_start_matches("p-");
        let kids = fam.children.get_mut(p).unwrap();
        kids.remove(&format!("c-{i}-0"));
        kids.insert(format!("c-{i}-new"));
        kids.insert(format!("c-{i}-late"));
    }
    until(
        Duration::from_secs(60),
        "every moved parent reconciled on b",
        || {
            let log = log.lock().unwrap();
            moved_parents.iter().all(|p| log.contains_key(p))
        },
    )
    .await;
    {
        let log = log.lock().unwrap();
        for p in &moved_parents {
            assert_eq!(
                log[p][0], fam.children[p],
                "b's first reconcile of {p} sees all of its children"
            );
        }
    }
    let own_a: BTreeSet<u32> = own_a.difference(&moved).copied().collect();
    let own_b: BTreeSet<u32> = own_b.union(&moved).copied().collect();
    until(
        Duration::from_secs(60),
        "child stores after the move",
        || {
            names_of(&ca.store) == fam.children_of_shards(&own_a)
                && names_of(&cb_store) == fam.children_of_shards(&own_b)
        },
    )
    .await;
    let children: usize = fam.children.values().map(BTreeSet::len).sum();
    let held = names_of(&ca.store).len() + names_of(&cb_store).len();
    assert_eq!(held, children, "disjoint and covering after the move");
    let read = server.accounting("a-children").distinct_uids
        + server.accounting("b-children").distinct_uids;
    eprintln!(
        "{}: 2 members hold {held} children, read {read} distinct uids in all: read amplification {:.2}",
        if label { "shard label" } else { "controller ownerReference" },
        read as f64 / held as f64
    );
    ctl_task.abort();
    pa.task.abort();
    ca.task.abort();
}

/// The `kube_shard::dependent_reflector` shortcut: metadata-only children of the owned parents.
#[tokio::test(start_paused = true)]
async fn dependent_reflector_shortcut() {
    let server = TestServer::builder().shard_selector(true).build();
    let fam = family(&server.client("admin"), 24, 2, false).await;
    let (me, o, d) = member("s");
    let own: BTreeSet<u32> = (4..12).collect();
    d.apply(&grant(AssignmentView::new(1), &me, own.iter().copied(), 1));
    let children = kube_shard::dependent_reflector(
        Api::<ConfigMap>::all(server.client("s")),
        config("child"),
        o,
        Dependency::controller_owner(),
    )
    .unwrap();
    let store = children.store;
    let task = tokio::spawn(children.events.for_each(|_| async {}));
    until(Duration::from_secs(30), "children of owned parents", || {
        names_of(&store) == fam.children_of_shards(&own)
    })
    .await;
    task.abort();
}

/// A full-watch secondary in a quiet collection: many shards activated at once (a takeover) cost one
/// LIST of the collection for their barriers, not one per shard.
#[tokio::test(start_paused = true)]
async fn quiet_activations_cost_one_list() {
    let server = TestServer::builder().shard_selector(true).build();
    let admin = server.client("admin");
    let fam = family(&admin, 16, 2, false).await;
    let (me, o, d) = member("t");
    let children = secondaries(&server, "t", &o, "child", Dependency::controller_owner());
    until(Duration::from_secs(30), "synced", || {
        children.stats.initialized()
    })
    .await;
    // the collection's resourceVersion moves on without a child event
    let api: Api<ConfigMap> = Api::namespaced(admin.clone(), NS);
    create(&api, &object("unrelated", "other")).await;
    d.apply(&grant(AssignmentView::new(1), &me, 0..8, 1));
    until(Duration::from_secs(30), "activation", || {
        (0..8).all(|s| kube_shard::testing::member_state(&o).is_admitted(s))
    })
    .await;
    assert_eq!(
        (
            children.stats.activations(),
            children.stats.targeted_lists()
        ),
        (8, 1),
        "8 shards activated by one LIST"
    );
    let own: BTreeSet<u32> = (0..8).collect();
    assert_eq!(names_of(&children.store), fam.children_of_shards(&own));
    children.task.abort();
}

#[tokio::test(start_paused = true)]
async fn referenced_objects_follow_their_referrers_server_mode() {
    referenced_objects_follow_their_referrers(true).await;
}

/// The same without KEP-5866 on the server: the primaries fall back to a full watch; secondaries are read
/// the same way.
#[tokio::test(start_paused = true)]
async fn referenced_objects_follow_their_referrers_fallback_mode() {
    referenced_objects_follow_their_referrers(false).await;
}

/// A primary naming the object it depends on (a job pointing at its deployment, here ConfigMaps): the
/// referenced object is in the store of every member that reads a referrer — owned or Incoming — also when
/// the reference changes and when the referrer's shard moves; `Dependency::mapped` (secondary → primary
/// refs) resolves through the same map.
async fn referenced_objects_follow_their_referrers(gate: bool) {
    use kube::runtime::{controller::Action, Controller, WatchStreamExt};

    let server = TestServer::builder().shard_selector(gate).build();
    let admin = server.client("admin");
    seed(&admin, 0).await;
    let api: Api<ConfigMap> = Api::namespaced(admin.clone(), NS);
    let dep_of = |c: &ConfigMap| c.data.as_ref().and_then(|d| d.get("deployment")).cloned();
    let mut jobs: BTreeMap<String, (String, String)> = BTreeMap::new(); // name -> (uid, deployment)
    for i in 0..20 {
        create(&api, &object(&format!("d-{i}"), "dep")).await;
    }
    for i in 0..32 {
        let mut j = object(&format!("j-{i}"), "job");
        j.data = Some(BTreeMap::from([(
            "deployment".to_owned(),
            format!("d-{}", i % 12),
        )]));
        let j = create(&api, &j).await;
        jobs.insert(
            format!("j-{i}"),
            (j.metadata.uid.clone().unwrap(), format!("d-{}", i % 12)),
        );
        // a note that names its job (secondary -> primary mapper)
        let mut n = object(&format!("n-{i}"), "note");
        n.data = Some(BTreeMap::from([("for".to_owned(), format!("j-{i}"))]));
        create(&api, &n).await;
    }
    let want_deps =
        |jobs: &BTreeMap<String, (String, String)>, shards: &BTreeSet<u32>| -> BTreeSet<String> {
            jobs.values()
                .filter(|(u, _)| shards.contains(&shard_of_uid(u)))
                .map(|(_, d)| d.clone())
                .collect()
        };
    let want_notes =
        |jobs: &BTreeMap<String, (String, String)>, shards: &BTreeSet<u32>| -> BTreeSet<String> {
            jobs.iter()
                .filter(|(_, (u, _))| shards.contains(&shard_of_uid(u)))
                .map(|(n, _)| n.replace("j-", "n-"))
                .collect()
        };
    let refs = move |j: &ConfigMap| -> Vec<ObjectRef<ConfigMap>> {
        dep_of(j)
            .map(|d| ObjectRef::new(&d).within(NS))
            .into_iter()
            .collect()
    };
    let note_mapper = |n: &PartialObjectMeta<ConfigMap>| -> Vec<ObjectRef<ConfigMap>> {
        // metadata only: the note names its job in an annotation-free way, by its own name
        let name = n.metadata.name.clone().unwrap_or_default();
        vec![ObjectRef::new(&name.replace("n-", "j-")).within(NS)]
    };
    let (a, oa, da) = member("a");
    let (b, ob, db) = member("b");
    let base = view(1, &a, 0..8, &b, 8..16);
    da.apply(&base);
    db.apply(&base);

    let map_a = DependencyMap::<ConfigMap>::with_references(refs);
    let ja = run(primaries(&server, "a-jobs", &oa, "job")
        .feeds(&map_a)
        .build_reflector());
    let deps_a = run(ShardedWatcher::new(
        Api::<ConfigMap>::all(server.client("a-deps")),
        config("dep"),
        oa.clone(),
    )
    .dependent(Dependency::referenced_by(&map_a))
    .unwrap()
    .barrier_timeout(Duration::from_secs(1))
    .build_reflector());
    let notes_a = secondaries(
        &server,
        "a-notes",
        &oa,
        "note",
        Dependency::mapped(&map_a, note_mapper),
    );

    let map_b = DependencyMap::<ConfigMap>::with_references(refs);
    let jb = primaries(&server, "b-jobs", &ob, "job")
        .feeds(&map_b)
        .build_reflector();
    let deps_b = ShardedWatcher::new(
        Api::<ConfigMap>::all(server.client("b-deps")),
        config("dep"),
        ob.clone(),
    )
    .dependent(Dependency::referenced_by(&map_b))
    .unwrap()
    .barrier_timeout(Duration::from_secs(1))
    .build_reflector();
    let deps_b_store = deps_b.store.clone();
    let jb_store = jb.store.clone();
    // b's reconcile checks that the job's deployment is in the dependency store when it runs
    let missing: Arc<Mutex<Vec<String>>> = Arc::default();
    let reconciled: Arc<Mutex<BTreeMap<String, usize>>> = Arc::default();
    let ctx = Arc::new((deps_b_store.clone(), missing.clone(), reconciled.clone()));
    let map_for_watch = map_b.clone();
    let ctrl = Controller::for_stream(jb.events.applied_objects(), jb_store.clone())
        .watches_stream(deps_b.events.touched_objects(), move |d| {
            map_for_watch.referrers(&d)
        })
        .reconcile_on(jb.reenqueue)
        .run(
            |j: Arc<ConfigMap>, ctx: Arc<RefCtx>| async move {
                let name = j.metadata.name.clone().unwrap();
                let dep = j.data.as_ref().unwrap()["deployment"].clone();
                if ctx.0.get(&ObjectRef::new(&dep).within(NS)).is_none() {
                    ctx.1.lock().unwrap().push(format!("{name} -> {dep}"));
                }
                *ctx.2.lock().unwrap().entry(name).or_default() += 1;
                Ok::<_, std::convert::Infallible>(Action::await_change())
            },
            |_, _, _| Action::await_change(),
            ctx,
        )
        .for_each(|_| async {});
    let ctl_task = tokio::spawn(ctrl);

    let mut own_a: BTreeSet<u32> = (0..8).collect();
    let mut own_b: BTreeSet<u32> = (8..16).collect();
    until(Duration::from_secs(60), "initial dependency stores", || {
        names_of(&deps_a.store) == want_deps(&jobs, &own_a)
            && names_of(&deps_b_store) == want_deps(&jobs, &own_b)
            && names_of(&notes_a.store) == want_notes(&jobs, &own_a)
    })
    .await;
    assert!(
        want_deps(&jobs, &own_a).len() < 20,
        "unreferenced objects exist and are not projected"
    );
    // fed from the primary index: what a reads (in fallback mode, every job), not only what it projects
    assert_eq!(
        map_a.len(),
        if gate {
            names_of(&ja.store).len()
        } else {
            jobs.len()
        },
        "the map holds every job a reads"
    );

    // the reference changes: a job of a's now points at a deployment nobody referenced
    let (j_a, _) = jobs
        .iter()
        .find(|(_, (u, _))| own_a.contains(&shard_of_uid(u)))
        .map(|(n, v)| (n.clone(), v.clone()))
        .unwrap();
    api.patch(
        &j_a,
        &PatchParams::default(),
        &Patch::Merge(&serde_json::json!({"data": {"deployment": "d-19"}})),
    )
    .await
    .unwrap();
    jobs.get_mut(&j_a).unwrap().1 = "d-19".into();
    until(
        Duration::from_secs(30),
        "store follows the new reference",
        || names_of(&deps_a.store) == want_deps(&jobs, &own_a),
    )
    .await;
    assert!(names_of(&deps_a.store).contains("d-19"));

    // move shards 0 and 1 to b; a moving job's reference changes while b is Incoming
    // the two of a's shards with the most jobs: uids are random, a fixed pair may carry none
    let jobs_in = |shard: u32| {
        jobs.values()
            .filter(|(u, _)| shard_of_uid(u) == shard)
            .count()
    };
    let mut of_a: Vec<u32> = own_a.iter().copied().collect();
    of_a.sort_by_key(|s| std::cmp::Reverse(jobs_in(*s)));
    let moving = [of_a[0], of_a[1]];
    let moved: BTreeSet<u32> = moving.into_iter().collect();
    let moving_jobs: Vec<String> = jobs
        .iter()
        .filter(|(_, (u, _))| moved.contains(&shard_of_uid(u)))
        .map(|(n, _)| n.clone())
        .collect();
    assert!(!moving_jobs.is_empty());
    let changed = moving_jobs[0].clone();
    let during = {
        let (api, changed) = (api.clone(), changed.clone());
        async move {
            api.patch(
                &changed,
                &PatchParams::default(),
                &Patch::Merge(&serde_json::json!({"data": {"deployment": "d-18"}})),
            )
            .await
            .unwrap();
        }
    };
    let after_warm = async {
        let mut incoming: BTreeSet<u32> = own_b.clone();
        incoming.extend(moved.iter().copied());
        let mut jobs_now = jobs.clone();
        jobs_now.get_mut(&changed).unwrap().1 = "d-18".into();
        until(
            Duration::from_secs(30),
            "deps of Incoming referrers",
            || names_of(&deps_b_store) == want_deps(&jobs_now, &incoming),
        )
        .await;
    };
    move_shards(
        &base,
        (&a, &oa, &da),
        (&b, &ob, &db),
        &moving,
        during,
        after_warm,
        async {},
    )
    .await;
    jobs.get_mut(&changed).unwrap().1 = "d-18".into();
    own_a = own_a.difference(&moved).copied().collect();
    own_b.extend(moved.iter().copied());
    until(
        Duration::from_secs(60),
        "moved jobs reconciled on b",
        || {
            let r = reconciled.lock().unwrap();
            moving_jobs.iter().all(|j| r.contains_key(j))
        },
    )
    .await;
    assert!(
        missing.lock().unwrap().is_empty(),
        "reconciles without their referenced object: {:?}",
        missing.lock().unwrap()
    );
    until(
        Duration::from_secs(60),
        "dependency stores after the move",
        || {
            names_of(&deps_a.store) == want_deps(&jobs, &own_a)
                && names_of(&deps_b_store) == want_deps(&jobs, &own_b)
                && names_of(&notes_a.store) == want_notes(&jobs, &own_a)
        },
    )
    .await;
    // a change of a referenced object reconciles its referrers on b (watches_stream + map.referrers)
    let (j_b, (_, d_b)) = jobs
        .iter()
        .find(|(_, (u, _))| own_b.contains(&shard_of_uid(u)))
        .map(|(n, v)| (n.clone(), v.clone()))
        .unwrap();
    let before = reconciled.lock().unwrap().get(&j_b).copied().unwrap_or(0);
    api.patch(
        &d_b,
        &PatchParams::default(),
        &Patch::Merge(&serde_json::json!({"data": {"touched": "1"}})),
    )
    .await
    .unwrap();
    until(
        Duration::from_secs(30),
        "referrer reconciled after its deployment changed",
        || reconciled.lock().unwrap().get(&j_b).copied().unwrap_or(0) > before,
    )
    .await;
    let held = names_of(&deps_a.store).len() + names_of(&deps_b_store).len();
    let read =
        server.accounting("a-deps").distinct_uids + server.accounting("b-deps").distinct_uids;
    eprintln!("referenced_by: 2 members hold {held} referenced objects (of 20), read {read} uids: read amplification {:.2}", read as f64 / held as f64);
    ctl_task.abort();
    for t in [ja.task, deps_a.task, notes_a.task] {
        t.abort();
    }
}

fn member_ns(name: &str) -> (MemberId, Ownership, TestDriver) {
    let me = MemberId::new(name, "i1");
    let (o, d) = testing::driver(
        OwnershipConfig::new(shards(), ShardKey::Namespace),
        me.clone(),
    );
    d.renew();
    (me, o, d)
}

/// Under the namespace key, children and their parents are read through the same server filter: each
/// member reads only its namespaces' children (testserver accounting).
#[tokio::test(start_paused = true)]
async fn namespace_key_children_through_the_server_filter() {
    let server = TestServer::builder().shard_selector(true).build();
    let admin = server.client("admin");
    let mut children_by_ns: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let ns_shard = |ns: &str| shards().shard_of(fnv1a64(ns.as_bytes()));
    // 12 namespaces in each half of the shards
    let (mut low, mut high) = (Vec::new(), Vec::new());
    for i in 0..1000 {
        let ns = format!("tenant-{i}");
        let half = if ns_shard(&ns) < 8 {
            &mut low
        } else {
            &mut high
        };
        if half.len() < 12 {
            half.push(ns);
        }
    }
    for ns in low.into_iter().chain(high) {
        let nsapi: Api<Namespace> = Api::all(admin.clone());
        nsapi
            .create(
                &PostParams::default(),
                &Namespace {
                    metadata: ObjectMeta {
                        name: Some(ns.clone()),
                        ..ObjectMeta::default()
                    },
                    ..Namespace::default()
                },
            )
            .await
            .unwrap();
        let api: Api<ConfigMap> = Api::namespaced(admin.clone(), &ns);
        let mut p = object("parent", "parent");
        p.metadata.namespace = Some(ns.clone());
        let p = create(&api, &p).await;
        for j in 0..3 {
            let mut c = owned_by(object(&format!("{ns}-c{j}"), "child"), &p);
            c.metadata.namespace = Some(ns.clone());
            create(&api, &c).await;
            children_by_ns
                .entry(ns.clone())
                .or_default()
                .insert(format!("{ns}-c{j}"));
        }
    }
    let mut readers = Vec::new();
    let mut keep = Vec::new();
    for (m, owned) in [("a", 0..8u32), ("b", 8..16)] {
        let (me, o, d) = member_ns(m);
        let owned: BTreeSet<u32> = owned.collect();
        d.apply(&grant(
            AssignmentView::new(1),
            &me,
            owned.iter().copied(),
            1,
        ));
        let want: BTreeSet<String> = children_by_ns
            .iter()
            .filter(|(ns, _)| owned.contains(&ns_shard(ns)))
            .flat_map(|(_, c)| c.iter().cloned())
            .collect();
        let parents =
            run(primaries(&server, &format!("{m}-parents"), &o, "parent").build_reflector());
        // controller_owner under the namespace key is the same key: server-filtered
        let children = secondaries(
            &server,
            &format!("{m}-children"),
            &o,
            "child",
            Dependency::controller_owner(),
        );
        readers.push((m, want, parents, children));
        keep.push((o, d));
    }
    for (m, want, parents, children) in &readers {
        until(Duration::from_secs(60), "namespace projection", || {
            names_of(&children.store) == *want
        })
        .await;
        assert_eq!(
            children.stats.mode(),
            ReadMode::Server,
            "{m}: the server filters the children"
        );
        assert_eq!(
            parents.store.state().len() * 3,
            want.len(),
            "{m}: parents and children together"
        );
        let acct = server.accounting(&format!("{m}-children"));
        eprintln!(
            "namespace key: member {m} holds {} children, read {} uids: read amplification {:.2}",
            want.len(),
            acct.distinct_uids,
            acct.distinct_uids as f64 / want.len() as f64
        );
        assert_eq!(
            acct.distinct_uids as usize,
            want.len(),
            "{m} reads only its namespaces' children"
        );
    }
    // the same_key strategy needs the namespace key
    let (_, o, _d) = member("uid-keyed");
    let err = ShardedWatcher::metadata(
        Api::<ConfigMap>::all(server.client("x")),
        watcher::Config::default(),
        o,
    )
    .dependent(Dependency::same_key())
    .unwrap_err();
    assert_eq!(err, DependentError::SameKeyNeedsNamespace);
    for (_, _, p, c) in readers {
        p.task.abort();
        c.task.abort();
    }
}

/// The shard label strategy: a member reads only the labelled children of the shards it reads (testserver
/// accounting); during the labelling migration `shard_label_or_owner` reads every child of its parents
/// (labelled or not, full watch); after the backfill `shard_label` alone sees them all; a gained shard is
/// listed alone.
#[tokio::test(start_paused = true)]
async fn shard_label_reads_only_labelled_children_of_owned_shards() {
    let server = TestServer::builder().shard_selector(true).build();
    let admin = server.client("admin");
    let fam = family(&admin, 40, 3, true).await;
    let api: Api<ConfigMap> = Api::namespaced(admin.clone(), NS);
    // legacy children, created before the operator stamped labels
    let mut legacy: BTreeMap<String, String> = BTreeMap::new(); // child -> parent
    for (p, parent) in &fam.parents {
        let i = p.trim_start_matches("p-");
        create(
            &api,
            &owned_by(object(&format!("legacy-{i}"), "child"), parent),
        )
        .await;
        legacy.insert(format!("legacy-{i}"), p.clone());
    }
    let legacy_of = |shards: &BTreeSet<u32>| -> BTreeSet<String> {
        legacy
            .iter()
            .filter(|(_, p)| shards.contains(&fam.shard_of(p)))
            .map(|(c, _)| c.clone())
            .collect()
    };
    let (me, o, d) = member("a");
    let mut owned: BTreeSet<u32> = (0..8).collect();
    d.apply(&grant(
        AssignmentView::new(1),
        &me,
        owned.iter().copied(),
        1,
    ));
    let labelled = secondaries(&server, "a-label", &o, "child", Dependency::shard_label());
    let migrating = secondaries(
        &server,
        "a-migrate",
        &o,
        "child",
        Dependency::shard_label_or_owner(),
    );
    let stamped = fam.children_of_shards(&owned);
    let mut all_kids = stamped.clone();
    all_kids.extend(legacy_of(&owned));
    until(
        Duration::from_secs(60),
        "label and migration projections",
        || names_of(&labelled.store) == stamped && names_of(&migrating.store) == all_kids,
    )
    .await;
    assert_eq!(labelled.stats.mode(), ReadMode::Server);
    let total = fam.children.values().map(BTreeSet::len).sum::<usize>() + legacy.len() + 2;
    let acct = server.accounting("a-label");
    eprintln!(
        "shard label: holds {}, read {} uids of {total} children: read amplification {:.2}",
        stamped.len(),
        acct.distinct_uids,
        acct.distinct_uids as f64 / stamped.len() as f64
    );
    assert_eq!(
        acct.distinct_uids as usize,
        stamped.len(),
        "only labelled children of owned shards are read"
    );
    let acct = server.accounting("a-migrate");
    eprintln!(
        "migration (label or owner): holds {}, read {} uids: read amplification {:.2}",
        all_kids.len(),
        acct.distinct_uids,
        acct.distinct_uids as f64 / all_kids.len() as f64
    );
    assert_eq!(
        acct.distinct_uids as usize, total,
        "the migration reads everything"
    );

    // backfill: label every legacy child with its parent's shard; the label reader then sees them all
    for (c, p) in &legacy {
        let shard = fam.shard_of(p).to_string();
        api.patch(
            c,
            &PatchParams::default(),
            &Patch::Merge(&serde_json::json!({"metadata": {"labels": {SHARD_LABEL: shard}}})),
        )
        .await
        .unwrap();
    }
    until(
        Duration::from_secs(60),
        "labelled after the backfill",
        || names_of(&labelled.store) == all_kids,
    )
    .await;
    assert_eq!(
        names_of(&migrating.store),
        all_kids,
        "the migration view is unchanged by labelling"
    );

    // gain shards 8 and 9: one LIST of the gained shards' label selector
    let lists = labelled.stats.lists();
    server.reset_accounting();
    owned.extend([8, 9]);
    // the held shards keep their epoch (no new barrier); the gained ones activate at epoch 2
    d.apply(&grant(
        grant(AssignmentView::new(2), &me, 0..8, 1),
        &me,
        [8, 9],
        2,
    ));
    let mut want = fam.children_of_shards(&owned);
    want.extend(legacy_of(&owned));
    until(Duration::from_secs(60), "gained shards", || {
        names_of(&labelled.store) == want
    })
    .await;
    assert_eq!(
        labelled.stats.lists(),
        lists + 1,
        "one LIST, for the gained shards only"
    );
    let gained: BTreeSet<u32> = [8, 9].into();
    let mut gained_kids = fam.children_of_shards(&gained);
    gained_kids.extend(legacy_of(&gained));
    assert!(
        server.accounting("a-label").distinct_uids as usize <= gained_kids.len(),
        "the gain reads only the gained shards' children"
    );

    // S above the cap is refused
    let (_, big, _d) = {
        let me = MemberId::new("big", "i1");
        let (o, d) = testing::driver(
            OwnershipConfig::new(ShardCount::new(4096).unwrap(), ShardKey::Uid),
            me.clone(),
        );
        (me, o, d)
    };
    let err = ShardedWatcher::metadata(
        Api::<ConfigMap>::all(server.client("x")),
        watcher::Config::default(),
        big,
    )
    .dependent(Dependency::shard_label())
    .unwrap_err();
    assert!(matches!(
        err,
        DependentError::TooManyShardsForLabel {
            shards: 4096,
            max: 256
        }
    ));
    labelled.task.abort();
    migrating.task.abort();
}
