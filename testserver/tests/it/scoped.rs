//! Faults narrowed to a verb, a resource, a namespace or one object.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::{coordination::v1::Lease, core::v1::ConfigMap};
use kube::{
    api::{Api, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams},
    core::Request,
};
use kube_shard_testserver::{FailRule, Scope, TestServer, Verb};
use serde_json::json;

use crate::common::{cm, code};

fn lease(name: &str) -> Lease {
    serde_json::from_value(json!({"metadata": {"name": name}})).unwrap()
}

/// `default/old`, `legacy/old`, `legacy/new`.
async fn leases(server: &TestServer) {
    let admin = server.client("admin");
    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "legacy"}});
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(admin.clone());
    namespaces
        .create(&PostParams::default(), &serde_json::from_value(ns).unwrap())
        .await
        .unwrap();
    for (ns, name) in [("default", "old"), ("legacy", "old"), ("legacy", "new")] {
        Api::<Lease>::namespaced(admin.clone(), ns)
            .create(&PostParams::default(), &lease(name))
            .await
            .unwrap();
    }
}

fn touch() -> Patch<serde_json::Value> {
    Patch::Merge(json!({"spec": {"holderIdentity": "m0"}}))
}

#[tokio::test]
async fn a_403_on_gets_of_one_lease_only() {
    let server = TestServer::new();
    leases(&server).await;
    server.faults().fail_next(
        Scope::identity("m0"),
        FailRule::status(403)
            .times(u32::MAX)
            .verb(Verb::Get)
            .resource("leases")
            .namespace("legacy")
            .name("old"),
    );
    let legacy: Api<Lease> = Api::namespaced(server.client("m0"), "legacy");
    for _ in 0..3 {
        assert_eq!(code(&legacy.get("old").await.unwrap_err()), Some(403));
    }
    legacy.get("new").await.expect("another Lease");
    Api::<Lease>::namespaced(server.client("m0"), "default")
        .get("old")
        .await
        .expect("the same name in another namespace");
    Api::<Lease>::namespaced(server.client("m1"), "legacy")
        .get("old")
        .await
        .expect("another identity");
    legacy
        .patch("old", &PatchParams::default(), &touch())
        .await
        .expect("another verb");
    let one = ListParams::default().fields("metadata.name=old");
    assert_eq!(legacy.list(&one).await.expect("a LIST").items.len(), 1);
    Api::<ConfigMap>::namespaced(server.client("m0"), "legacy")
        .create(&PostParams::default(), &cm("old"))
        .await
        .expect("another resource");
    assert_eq!(code(&legacy.get("old").await.unwrap_err()), Some(403));
}

#[tokio::test]
async fn a_target_narrows_fail_next_and_covers_a_collection_read_of_one_object() {
    let server = TestServer::new();
    leases(&server).await;
    // The narrowing may sit on the target (scope) instead of the rule: both apply.
    server.faults().fail_next(
        Scope::All.resource("leases").name("old"),
        FailRule::status(500).times(2).verb(Verb::List),
    );
    let legacy: Api<Lease> = Api::namespaced(server.client("m0"), "legacy");
    assert_eq!(
        legacy
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        2,
        "a LIST of the whole collection names no object"
    );
    legacy.get("old").await.expect("a GET is not a LIST");
    // How `watch_object` reads one object: a LIST or WATCH with a name field selector.
    let one = ListParams::default().fields("metadata.name=old");
    assert_eq!(code(&legacy.list(&one).await.unwrap_err()), Some(500));
    let other_ns = Api::<Lease>::namespaced(server.client("m1"), "default");
    assert_eq!(code(&other_ns.list(&one).await.unwrap_err()), Some(500));
    assert!(legacy.list(&one).await.is_ok(), "two times only");
    // A namespace taken from the field selector of a list across namespaces.
    server.faults().fail_next(
        Scope::All.namespace("legacy"),
        FailRule::status(503).resource("leases"),
    );
    let all: Api<Lease> = Api::all(server.client("m0"));
    assert!(all.list(&ListParams::default()).await.is_ok());
    let in_legacy = ListParams::default().fields("metadata.namespace=legacy");
    assert_eq!(code(&all.list(&in_legacy).await.unwrap_err()), Some(503));
}

#[tokio::test(start_paused = true)]
async fn latency_narrowed_to_patches_of_one_resource() {
    let server = TestServer::new();
    leases(&server).await;
    let cms: Api<ConfigMap> = Api::namespaced(server.client("w"), "default");
    cms.create(&PostParams::default(), &cm("a")).await.unwrap();
    let slow = Scope::identity("w")
        .verb(Verb::Patch)
        .resource("configmaps");
    server
        .faults()
        .latency(slow.clone(), Some(Duration::from_secs(3)));
    let t0 = tokio::time::Instant::now();
    let p = Patch::Merge(json!({"data": {"k": "2"}}));
    cms.patch("a", &PatchParams::default(), &p).await.unwrap();
    assert!(t0.elapsed() >= Duration::from_secs(3), "the patch waited");
    let t0 = tokio::time::Instant::now();
    cms.get("a").await.unwrap();
    cms.list(&ListParams::default()).await.unwrap();
    Api::<Lease>::namespaced(server.client("w"), "default")
        .patch("old", &PatchParams::default(), &touch())
        .await
        .unwrap();
    assert!(
        t0.elapsed() < Duration::from_secs(1),
        "other verbs, other resources"
    );
    server.faults().latency(slow, None);
    let t0 = tokio::time::Instant::now();
    cms.patch("a", &PatchParams::default(), &p).await.unwrap();
    assert!(t0.elapsed() < Duration::from_secs(1), "removed");
}

type Events<K> = futures::stream::BoxStream<'static, kube::Result<WatchEvent<K>>>;

async fn watch_of<K>(server: &TestServer, identity: &str, url: &str, fields: &str) -> Events<K>
where
    K: k8s_openapi::serde::de::DeserializeOwned + Clone + std::fmt::Debug + Send + 'static,
{
    let rv = server.resource_version().to_string();
    let params = WatchParams::default().fields(fields).timeout(3000);
    let req = Request::new(url).watch(&params, &rv).unwrap();
    server
        .client(identity)
        .request_events::<K>(req)
        .await
        .unwrap()
        .boxed()
}

async fn quiet<K: std::fmt::Debug>(events: &mut Events<K>) -> bool {
    tokio::time::timeout(Duration::from_secs(600), events.next())
        .await
        .is_err()
}

#[tokio::test(start_paused = true)]
async fn watches_frozen_and_closed_per_resource_and_object() {
    const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/legacy/leases";
    const CMS: &str = "/api/v1/namespaces/legacy/configmaps";
    let server = TestServer::new();
    leases(&server).await;
    let mut all_leases: Events<Lease> = watch_of(&server, "m0", LEASES, "").await;
    let mut old_lease: Events<Lease> = watch_of(&server, "m0", LEASES, "metadata.name=old").await;
    let mut cms: Events<ConfigMap> = watch_of(&server, "m0", CMS, "").await;
    // The Lease watches of m0 go quiet while its ConfigMap watch and every write still work.
    let m0_leases = Scope::identity("m0").resource("leases");
    server.faults().freeze_watches(m0_leases.clone(), true);
    let writer: Api<Lease> = Api::namespaced(server.client("m1"), "legacy");
    writer
        .patch("old", &PatchParams::default(), &touch())
        .await
        .expect("writes work");
    Api::<ConfigMap>::namespaced(server.client("m1"), "legacy")
        .create(&PostParams::default(), &cm("c"))
        .await
        .unwrap();
    assert!(matches!(
        cms.next().await.unwrap().unwrap(),
        WatchEvent::Added(_)
    ));
    assert!(quiet(&mut all_leases).await, "frozen");
    assert!(quiet(&mut old_lease).await, "frozen");
    server.faults().freeze_watches(m0_leases, false);
    for events in [&mut all_leases, &mut old_lease] {
        match events.next().await.unwrap().unwrap() {
            WatchEvent::Modified(l) => assert_eq!(l.metadata.name.as_deref(), Some("old")),
            other => panic!("{other:?}"),
        }
    }
    // Closing the watches of one Lease ends the watch of that object only.
    server.faults().close_watches(
        Scope::All
            .resource("leases")
            .namespace("legacy")
            .name("old"),
    );
    assert!(old_lease.next().await.is_none(), "the stream ends");
    writer
        .patch("new", &PatchParams::default(), &touch())
        .await
        .unwrap();
    match all_leases.next().await.unwrap().unwrap() {
        WatchEvent::Modified(l) => assert_eq!(l.metadata.name.as_deref(), Some("new")),
        other => panic!("{other:?}"),
    }
    // A watch opened after the close is not affected.
    let mut again: Events<Lease> = watch_of(&server, "m0", LEASES, "metadata.name=old").await;
    writer
        .patch(
            "old",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"leaseDurationSeconds": 5}})),
        )
        .await
        .unwrap();
    assert!(matches!(
        again.next().await.unwrap().unwrap(),
        WatchEvent::Modified(_)
    ));
}
