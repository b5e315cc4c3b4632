//! The per-shard fence level (issue 16, test 2) with a real coordinator on testserver, in paused time: the
//! coordinator publishes each shard's epoch in the parameter ConfigMap before activating a new owner, and
//! the per-shard policy refuses what the preconditions and the per-object policy let through — a deposed
//! owner's write that was delayed in flight to an object the new owner never wrote, and a CREATE with a
//! stale epoch — while the current owners' writes all pass under handoffs and takeovers.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::PostParams;
use kube::Api;
use kube_shard::fence_policy::FencePolicyConfig;
use kube_shard::ownership::fenced_write::FencedApi;
use kube_shard::testing::fence_messages as messages;
use kube_shard_testserver::{Scope, TestServer};
use serde_json::json;

use crate::group::{builder, each_shard_owned_once, owned_count, spawn_with, until, Member, CP_NS};
use crate::read_path::watcher::{seed, shard_of_uid, NS};

const PARAMS: &str = "demo-fence";
const LATE: Duration = Duration::from_secs(20);

/// Both fence levels for ConfigMaps, the parameter ConfigMap `control/demo-fence` created first (the
/// per-shard binding refuses every ConfigMap write while it is missing, the group's own included).
async fn install(server: &TestServer) {
    let set = FencePolicyConfig::new(vec!["configmaps".parse().unwrap()])
        .params(format!("{CP_NS}/{PARAMS}").parse().unwrap())
        .generate()
        .unwrap();
    let client = server.client("admin");
    Api::<ConfigMap>::namespaced(client.clone(), CP_NS)
        .create(&PostParams::default(), set.params.as_ref().unwrap())
        .await
        .unwrap();
    crate::fences::policy::post_policies(server, &set).await;
}

fn spawn(server: &TestServer, name: &str, publish: bool, log: &crate::group::FenceLog) -> Member {
    let b = builder(server, name);
    let b = if publish { b.fence_params(PARAMS) } else { b };
    spawn_with(b, name, log)
}

async fn published(server: &TestServer) -> BTreeMap<String, String> {
    Api::<ConfigMap>::namespaced(server.client("admin"), CP_NS)
        .get(PARAMS)
        .await
        .unwrap()
        .data
        .unwrap_or_default()
}

/// `a` owns everything and sends one fenced write per object, each delayed in flight (testserver commits it
/// `LATE` after arrival, after the client gave up at its fence's end); `b` joins and takes half the shards
/// meanwhile, and writes nothing. Returns (objects whose late write committed, per object: whether its shard
/// moved to `b`), with the coordinator publishing the parameters when `publish`.
async fn late_writes_across_a_handoff(publish: bool) -> (BTreeMap<String, bool>, Vec<String>) {
    let (server, log) = crate::support::group_server().await;
    install(&server).await;
    let objects = seed(&server.client("admin"), 24).await;
    let a = spawn(&server, "a", publish, &log);
    until(Duration::from_secs(30), "a owns every shard", || {
        owned_count(&a) == 16
    })
    .await;
    let writer = FencedApi::new(Api::<ConfigMap>::namespaced(server.client("a-writer"), NS));
    server
        .faults()
        .late_commit(Scope::identity("a-writer"), LATE);
    let reader: Api<ConfigMap> = Api::namespaced(server.client("admin"), NS);
    // all sent at once: each is never answered (the client gives up when its fence ends, and a drain
    // waits for that), and the server commits each `LATE` after its arrival
    let sends = objects.keys().map(|name| {
        let (reader, writer, a) = (reader.clone(), writer.clone(), a.ownership());
        async move {
            let cm = reader.get(name).await.unwrap();
            let fence = a.admit(&cm).unwrap().fence().unwrap();
            let patch = json!({"data": {"late": "deposed"}});
            writer
                .patch(
                    &fence,
                    &cm,
                    &kube::api::PatchParams::default(),
                    &kube::api::Patch::Merge(&patch),
                )
                .await
        }
    });
    for res in futures::future::join_all(sends).await {
        assert!(
            matches!(
                res,
                Err(kube_shard::ownership::fenced_write::Error::Timeout(_))
            ),
            "{res:?}"
        );
    }
    let b = spawn(&server, "b", publish, &log);
    until(
        LATE - Duration::from_secs(5),
        "b takes half the shards",
        || owned_count(&b) == 8 && each_shard_owned_once(&[&a, &b]),
    )
    .await;
    tokio::time::sleep(LATE).await; // every late write reached the server
    let b_shards: Vec<u32> = b.handle.status().owned.iter().collect();
    let mut moved = BTreeMap::new();
    let mut committed = Vec::new();
    for (name, uid) in &objects {
        moved.insert(name.clone(), b_shards.contains(&shard_of_uid(uid)));
        let cm = reader.get(name).await.unwrap();
        if cm.data.unwrap_or_default().contains_key("late") {
            committed.push(name.clone());
        }
    }
    if publish {
        // every shard b owns is published at b's epoch or above
        let params = published(&server).await;
        for (s, st) in b.ownership().shard_states() {
            let e = st.epoch().unwrap();
            let p: u64 = params[&s.to_string()].parse().unwrap();
            assert!(p >= e, "shard {s}: published {p} < owner's epoch {e}");
        }
    }
    crate::group::check_fences(&log);
    (moved, committed)
}

/// With the parameters published, exactly the late writes to shards that moved are refused: those of the
/// current owner commit. Planted bug: the same run with the coordinator not publishing (no `fence_params`)
/// commits the deposed owner's late writes — the policy alone, without the publication, does not catch them.
#[tokio::test(start_paused = true)]
async fn a_deposed_owners_delayed_write_is_refused_once_the_epoch_is_published() {
    let (moved, committed) = late_writes_across_a_handoff(true).await;
    let moved_names: Vec<&String> = moved.iter().filter(|(_, m)| **m).map(|(n, _)| n).collect();
    assert!(!moved_names.is_empty(), "some objects' shards moved");
    for (name, m) in &moved {
        assert_eq!(
            committed.contains(name),
            !m,
            "{name}: a late write commits exactly when its writer still owns the shard"
        );
    }
    // the plant: no publication
    let (moved, committed) = late_writes_across_a_handoff(false).await;
    let deposed_committed = moved
        .iter()
        .filter(|(n, m)| **m && committed.contains(n))
        .count();
    assert!(
        deposed_committed > 0,
        "without the publication the deposed owner's late writes commit (caught by this test)"
    );
}

/// After a handoff, a CREATE (a child, typically) stamped with the deposed owner's epoch is refused by the
/// per-shard policy with the real server's answer; the same CREATE with the new owner's epoch passes.
#[tokio::test(start_paused = true)]
async fn a_create_with_a_stale_epoch_is_refused() {
    let (server, log) = crate::support::group_server().await;
    install(&server).await;
    seed(&server.client("admin"), 1).await;
    let a = spawn(&server, "a", true, &log);
    until(Duration::from_secs(30), "a owns every shard", || {
        owned_count(&a) == 16
    })
    .await;
    let a_epochs: BTreeMap<u32, u64> = a
        .ownership()
        .shard_states()
        .into_iter()
        .map(|(s, st)| (s, st.epoch().unwrap()))
        .collect();
    let b = spawn(&server, "b", true, &log);
    until(Duration::from_secs(30), "b takes half the shards", || {
        owned_count(&b) == 8 && each_shard_owned_once(&[&a, &b])
    })
    .await;
    let (shard, st) = b.ownership().shard_states().into_iter().next().unwrap();
    let api: Api<ConfigMap> = Api::namespaced(server.client("a-writer"), NS);
    let child = |name: &str, token: String| {
        let mut c = crate::read_path::watcher::cm(name, "1");
        c.metadata.annotations = Some([("kube-shard.io/fence".to_string(), token)].into());
        c
    };
    let stale = format!("0:{shard}/{}", a_epochs[&shard]);
    let err = api
        .create(&PostParams::default(), &child("child-1", stale))
        .await
        .unwrap_err();
    let kube::Error::Api(s) = err else {
        panic!("not an API error: {err}")
    };
    let inner = format!(
        "ValidatingAdmissionPolicy 'kube-shard-fence-shard' with binding 'kube-shard-fence-shard' denied request: {}",
        messages::SHARD_STALE
    );
    assert_eq!((s.code, s.reason.as_str()), (422, "Invalid"), "{s:?}");
    assert_eq!(
        s.message,
        format!("configmaps \"child-1\" is forbidden: {inner}")
    );
    let current = format!("0:{shard}/{}", st.epoch().unwrap());
    api.create(&PostParams::default(), &child("child-1", current))
        .await
        .unwrap();
    crate::group::check_fences(&log);
}

/// Test 3 (the owners' side): every member writes, every 300 ms, each object it admits, through
/// `FencedApi`, while members join (handoffs), one is killed (a takeover) and one leaves: no write of a
/// current owner is ever refused by either policy.
#[tokio::test(start_paused = true)]
async fn current_owners_writes_all_pass_under_handoffs_and_takeovers() {
    let (server, log) = crate::support::group_server().await;
    install(&server).await;
    let objects = seed(&server.client("admin"), 24).await;
    let mut members = vec![spawn(&server, "a", true, &log)];
    let counts = std::sync::Arc::new(std::sync::Mutex::new((
        0usize,
        0usize,
        Vec::<String>::new(),
    )));
    let writer = {
        let (server, counts) = (server.clone(), counts.clone());
        let owns: std::sync::Arc<std::sync::Mutex<Vec<kube_shard::ownership::Ownership>>> =
            Default::default();
        (
            owns.clone(),
            tokio::spawn(async move {
                let api = FencedApi::new(Api::<ConfigMap>::namespaced(server.client("owners"), NS));
                let mut n = 0u64;
                loop {
                    n += 1;
                    for name in objects.keys() {
                        let Ok(cm) = api.api().get(name).await else {
                            continue;
                        };
                        let ownerships = owns.lock().unwrap().clone();
                        for o in ownerships {
                            let Ok(permit) = o.admit(&cm) else { continue };
                            let Ok(fence) = permit.fence() else { continue };
                            let res = api
                                .patch(
                                    &fence,
                                    &cm,
                                    &kube::api::PatchParams::default(),
                                    &kube::api::Patch::Merge(
                                        &json!({"data": {"n": n.to_string()}}),
                                    ),
                                )
                                .await;
                            let mut c = counts.lock().unwrap();
                            match res {
                                Ok(_) => c.0 += 1,
                                Err(e) if e.is_fence_refused() => {
                                    c.1 += 1;
                                    c.2.push(format!("{name}: {e:?}"))
                                }
                                Err(_) => {}
                            }
                            break;
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
            }),
        )
    };
    let (owns, task) = writer;
    let track = |m: &Member| owns.lock().unwrap().push(m.ownership());
    track(&members[0]);
    until(Duration::from_secs(30), "a owns every shard", || {
        owned_count(&members[0]) == 16
    })
    .await;
    for name in ["b", "c"] {
        let m = spawn(&server, name, true, &log);
        track(&m);
        members.push(m);
        tokio::time::sleep(Duration::from_secs(10)).await;
    }
    members[2].kill(); // c: taken over
    tokio::time::sleep(Duration::from_secs(15)).await;
    members[0].handle.leave(); // a: hands its set to b
    tokio::time::sleep(Duration::from_secs(15)).await;
    crate::support::ends_owned_once(&[&members[1]], &log).await;
    task.abort();
    let (ok, refused, which) = counts.lock().unwrap().clone();
    assert_eq!(refused, 0, "current owners' writes refused: {which:?}");
    assert!(ok > 24 * 20, "the owners kept writing ({ok} writes)");
}

/// The committed assignment, decoded.
async fn committed_assignment(
    server: &TestServer,
) -> (kube_shard::group::assignment::Assignment, String) {
    let cm = Api::<ConfigMap>::namespaced(server.client("admin"), CP_NS)
        .get(&format!("{}-assignment", crate::group::GROUP))
        .await
        .unwrap();
    let text = &cm.data.unwrap()[kube_shard::group::assignment::DATA_KEY];
    let a = kube_shard::group::assignment::Assignment::decode(
        text,
        crate::group::s(),
        kube_shard::ShardKey::Uid,
    )
    .unwrap();
    (a, cm.metadata.resource_version.unwrap())
}

/// Shards whose published key is below their committed epoch.
fn below(
    params: &BTreeMap<String, String>,
    a: &kube_shard::group::assignment::Assignment,
) -> Vec<String> {
    a.view
        .shards
        .iter()
        .filter(|(s, e)| {
            params
                .get(&s.to_string())
                .and_then(|v| v.parse::<u64>().ok())
                .is_none_or(|p| p < e.epoch)
        })
        .map(|(s, e)| {
            format!(
                "shard {s}: key {:?} < epoch {}",
                params.get(&s.to_string()),
                e.epoch
            )
        })
        .collect()
}

/// Two coordinators racing (issue 16, the put-back weakness): `a` coordinates; its write that completes
/// the handoff to `b` is delayed in flight (after `a` raised the keys for it); meanwhile a second
/// coordinator — this test — commits the same completion, writing nothing to the parameters (its epochs
/// are at or below the keys `a` just raised). `a`'s write then fails with a 409. Whatever `a` does next, no
/// published key may go below the committed epoch of its shard: the per-shard policy would let the deposed
/// owner's late writes through. (The put-back that restored the keys after a 409 did exactly that: this
/// test caught it.)
#[tokio::test(start_paused = true)]
async fn a_conflicting_assignment_write_never_lowers_a_published_key() {
    use kube_shard::group::assignment::{Handoff, ShardAssignment};
    use kube_shard_testserver::Verb;
    let (server, log) = crate::support::group_server().await;
    let a = spawn(&server, "a", true, &log);
    until(Duration::from_secs(30), "a owns every shard", || {
        owned_count(&a) == 16
    })
    .await;
    let assignment = format!("{}-assignment", crate::group::GROUP);
    server.faults().latency(
        Scope::identity("a")
            .verb(Verb::Update)
            .resource("configmaps")
            .name(assignment.clone()),
        Some(Duration::from_millis(300)),
    );
    let b = spawn(&server, "b", true, &log);
    let cms: Api<ConfigMap> = Api::namespaced(server.client("second-coordinator"), CP_NS);
    let mut raced = None;
    let start = tokio::time::Instant::now();
    while raced.is_none() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no handoff completion to race"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
        let params = published(&server).await;
        let (mut cur, rv) = committed_assignment(&server).await;
        // a raised keys for Draining shards: its completing write is in flight
        let raised: Vec<(u32, u64, kube_shard::ownership::MemberId)> = cur
            .view
            .shards
            .iter()
            .filter_map(|(s, e)| {
                let key: u64 = params.get(&s.to_string())?.parse().ok()?;
                match &e.handoff {
                    Handoff::Draining { to, .. } if key > e.epoch => Some((*s, key, to.clone())),
                    _ => None,
                }
            })
            .collect();
        let Some(&(_, generation, _)) = raised.first() else {
            continue;
        };
        for (s, key, to) in &raised {
            cur.view
                .shards
                .insert(*s, ShardAssignment::owned(to.clone(), *key));
        }
        cur.view.generation = generation;
        let mut cm = cms.get(&assignment).await.unwrap();
        cm.metadata.resource_version = Some(rv);
        cm.data
            .get_or_insert_with(Default::default)
            .insert(kube_shard::group::assignment::DATA_KEY.into(), cur.encode());
        if cms
            .replace(&assignment, &PostParams::default(), &cm)
            .await
            .is_ok()
        {
            raced = Some(raised.len());
        }
    }
    server.faults().latency(
        Scope::identity("a")
            .verb(Verb::Update)
            .resource("configmaps")
            .name(assignment.clone()),
        None,
    );
    // from now on, for a while: no key below its shard's committed epoch
    for _ in 0..200 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let (cur, _) = committed_assignment(&server).await;
        let params = published(&server).await;
        let low = below(&params, &cur);
        assert!(
            low.is_empty(),
            "published keys below committed epochs: {low:?}"
        );
    }
    until(Duration::from_secs(30), "b takes half the shards", || {
        owned_count(&b) == 8 && each_shard_owned_once(&[&a, &b])
    })
    .await;
    crate::group::check_fences(&log);
}
