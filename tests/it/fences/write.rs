//! Fenced writes against testserver: preconditions, the fence header and annotation, the fence audit,
//! and an expired fence sending nothing.

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube_shard::group::assignment::AssignmentView;
use kube_shard::ownership::fenced_write::FencedApi;
use kube_shard_testserver::{TestServer, Verb};

use crate::read_path::watcher::{grant, member, seed, shard_of_uid, NS};

#[tokio::test(start_paused = true)]
async fn fenced_writes_carry_preconditions_and_the_fence_and_are_audited() {
    let server = TestServer::builder().build();
    let all = seed(&server.client("admin"), 1).await;
    let (name, uid) = all.into_iter().next().unwrap();
    let shard = shard_of_uid(&uid);
    let (me, o, d) = member("writer");
    d.apply(&grant(AssignmentView::new(7), &me, [shard], 7));
    d.activate(shard, 7);
    let api: Api<ConfigMap> = Api::namespaced(server.client("writer"), NS);
    let fenced = FencedApi::new(api.clone());
    let cm = api.get(&name).await.unwrap();
    let permit = o.admit(&cm).unwrap();
    let fence = permit.fence().unwrap();
    let mut changed = cm.clone();
    changed
        .data
        .get_or_insert_with(Default::default)
        .insert("k".into(), "v".into());
    let written = fenced.replace(&fence, &changed).await.unwrap();
    assert_eq!(
        written.metadata.annotations.as_ref().unwrap()["kube-shard.io/fence"],
        format!("0:{shard}/7"),
        "the annotation is stamped"
    );
    let audit = server.fence_audit();
    assert_eq!(
        audit.highest_epoch(&uid),
        Some(7),
        "the server saw the fence"
    );
    // a stale copy (old resourceVersion) is refused by the precondition, not silently applied
    let err = fenced.replace(&fence, &changed).await.unwrap_err();
    assert!(err.is_conflict() && !err.is_fenced(), "{err:?}");
    // a lower epoch committed later is flagged by the audit
    let (me2, o2, d2) = member("stale");
    d2.apply(&grant(AssignmentView::new(3), &me2, [shard], 3));
    d2.activate(shard, 3);
    let stale_api = FencedApi::new(Api::<ConfigMap>::namespaced(server.client("stale"), NS));
    let fresh = api.get(&name).await.unwrap();
    let stale_fence = o2.admit(&fresh).unwrap().fence().unwrap();
    stale_api.replace(&stale_fence, &fresh).await.unwrap();
    assert_eq!(
        server.fence_violations(),
        1,
        "a commit at epoch 3 after epoch 7 is a violation"
    );
    drop(permit);
}

#[tokio::test(start_paused = true)]
async fn an_expired_fence_sends_nothing() {
    let server = TestServer::builder().build();
    let all = seed(&server.client("admin"), 1).await;
    let (name, uid) = all.into_iter().next().unwrap();
    let shard = shard_of_uid(&uid);
    let (me, o, d) = member("late");
    d.apply(&grant(AssignmentView::new(2), &me, [shard], 2));
    d.activate(shard, 2);
    let api: Api<ConfigMap> = Api::namespaced(server.client("late"), NS);
    let cm = api.get(&name).await.unwrap();
    let fence = o.admit(&cm).unwrap().fence().unwrap();
    // past the renew deadline: the fence has expired
    tokio::time::sleep(Duration::from_secs(30)).await;
    let before = server.accounting("late").requests(Verb::Update);
    let err = FencedApi::new(api).replace(&fence, &cm).await.unwrap_err();
    assert!(err.to_string().to_lowercase().contains("fence"), "{err}");
    assert_eq!(
        server.accounting("late").requests(Verb::Update),
        before,
        "nothing was sent"
    );
}
