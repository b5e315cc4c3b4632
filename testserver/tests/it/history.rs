//! The recorder of committed history.

use k8s_openapi::api::{coordination::v1::Lease, core::v1::ConfigMap};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube_shard::token::{FenceToken, FENCE_ANNOTATION};
use kube_shard_testserver::{CommitKind, ResourceFilter, TestServer, Verb};
use serde_json::json;

use crate::common::cm;

fn fenced(name: &str, fence: &str) -> ConfigMap {
    let mut c = cm(name);
    c.metadata.annotations = Some([(FENCE_ANNOTATION.to_string(), fence.to_string())].into());
    c
}

#[tokio::test]
async fn every_commit_of_one_object_in_order() {
    let server = TestServer::new();
    let a: Api<ConfigMap> = Api::namespaced(server.client("a"), "default");
    let b: Api<ConfigMap> = Api::namespaced(server.client("b"), "default");
    a.create(&PostParams::default(), &cm("before"))
        .await
        .unwrap();
    let target = ResourceFilter::resource("configmaps")
        .namespace("default")
        .name("obj");
    server.history().record(target.clone());

    let created = a
        .create(&PostParams::default(), &fenced("obj", "3/10"))
        .await
        .unwrap();
    a.create(&PostParams::default(), &cm("other"))
        .await
        .unwrap();
    let mut next = created.clone();
    next.data = Some([("k".to_string(), "2".to_string())].into());
    b.replace("obj", &PostParams::default(), &next)
        .await
        .unwrap();
    b.patch(
        "other",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "3"}})),
    )
    .await
    .unwrap();
    // A refused write (stale resourceVersion) and a no-op are not commits.
    assert!(b
        .replace("obj", &PostParams::default(), &next)
        .await
        .is_err());
    a.patch(
        "obj",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "2"}})),
    )
    .await
    .unwrap();
    a.delete("obj", &DeleteParams::default()).await.unwrap();

    let history = server.history().of(&target);
    let got: Vec<_> = history
        .iter()
        .map(|c| (c.verb, c.identity.as_str(), c.change))
        .collect();
    assert_eq!(
        got,
        [
            (Verb::Create, "a", CommitKind::Created),
            (Verb::Update, "b", CommitKind::Updated),
            (Verb::Delete, "a", CommitKind::Deleted),
        ]
    );
    assert!(history
        .windows(2)
        .all(|w| w[0].resource_version < w[1].resource_version));
    assert!(history[2].deleted() && !history[1].deleted());
    assert_eq!(
        history[0].fence,
        Some(FenceToken::shard_token(Default::default(), 3, 10))
    );
    let second: ConfigMap = history[1].object_as().unwrap();
    assert_eq!(second.data.unwrap()["k"], "2");
    assert_eq!(
        second.metadata.resource_version,
        Some(history[1].resource_version.to_string())
    );
    let uid = created.metadata.uid.unwrap();
    assert!(history
        .iter()
        .all(|c| c.uid == uid && c.kind == "ConfigMap"));
    // Nothing else was recorded: not the other objects, not what came before.
    assert_eq!(server.history().commits(), history);
}

#[tokio::test]
async fn nothing_is_kept_unless_asked() {
    let server = TestServer::new();
    let api: Api<ConfigMap> = Api::namespaced(server.client("a"), "default");
    api.create(&PostParams::default(), &cm("x")).await.unwrap();
    assert!(server.history().commits().is_empty());
    server.history().record(ResourceFilter::resource("leases"));
    api.create(&PostParams::default(), &cm("y")).await.unwrap();
    assert!(server.history().commits().is_empty(), "another resource");
    server.history().stop();
    let leases: Api<Lease> = Api::namespaced(server.client("a"), "default");
    let l: Lease = serde_json::from_value(json!({"metadata": {"name": "l"}})).unwrap();
    leases.create(&PostParams::default(), &l).await.unwrap();
    assert!(server.history().commits().is_empty(), "stopped");
}

#[tokio::test]
async fn by_kind_and_uid_across_a_re_create() {
    let server = TestServer::new();
    let leases: Api<Lease> = Api::namespaced(server.client("m0"), "default");
    server.history().record(ResourceFilter::resource("Lease"));
    let l: Lease = serde_json::from_value(json!({"metadata": {"name": "m"}})).unwrap();
    let first = leases.create(&PostParams::default(), &l).await.unwrap();
    leases.delete("m", &DeleteParams::default()).await.unwrap();
    let second = leases.create(&PostParams::default(), &l).await.unwrap();
    let by_name = server
        .history()
        .of(&ResourceFilter::resource("leases.coordination.k8s.io").name("m"));
    assert_eq!(by_name.len(), 3);
    assert!(by_name
        .iter()
        .all(|c| c.resource == "leases.coordination.k8s.io"));
    let first_uid = first.metadata.uid.unwrap();
    let of_first = server.history().of(&ResourceFilter::all().uid(&first_uid));
    assert_eq!(
        of_first.iter().map(|c| c.change).collect::<Vec<_>>(),
        [CommitKind::Created, CommitKind::Deleted]
    );
    let of_second = server
        .history()
        .of(&ResourceFilter::all().uid(second.metadata.uid.unwrap()));
    assert_eq!(of_second.len(), 1);
    server.history().clear();
    assert!(server.history().commits().is_empty());
    leases.delete("m", &DeleteParams::default()).await.unwrap();
    assert_eq!(server.history().commits().len(), 1, "still recording");
}

#[tokio::test]
async fn a_delete_held_by_a_finalizer_is_an_update_until_the_last_one_goes() {
    let server = TestServer::new();
    let api: Api<ConfigMap> = Api::namespaced(server.client("op"), "default");
    server
        .history()
        .record(ResourceFilter::resource("configmaps").name("f"));
    let mut c = cm("f");
    c.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    api.create(&PostParams::default(), &c).await.unwrap();
    api.delete("f", &DeleteParams::default()).await.unwrap();
    api.patch(
        "f",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    let got: Vec<_> = server
        .history()
        .commits()
        .iter()
        .map(|c| (c.verb, c.change))
        .collect();
    assert_eq!(
        got,
        [
            (Verb::Create, CommitKind::Created),
            (Verb::Delete, CommitKind::Updated),
            (Verb::Patch, CommitKind::Deleted),
        ]
    );
}
