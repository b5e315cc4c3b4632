//! The fence audit.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    api::{Api, Patch, PatchParams, PostParams},
    core::Request,
};
use kube_shard::token::{FENCE_ANNOTATION, FENCE_HEADER};
use kube_shard_testserver::{FenceSource, TestServer};
use serde_json::json;

use crate::common::cm;

fn fenced_patch(name: &str, fence: &str, patch: serde_json::Value) -> http::Request<Vec<u8>> {
    let mut req = Request::new("/api/v1/namespaces/default/configmaps")
        .patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .unwrap();
    req.headers_mut()
        .insert(FENCE_HEADER, fence.parse().unwrap());
    req
}

#[tokio::test]
async fn lower_epoch_commits_are_flagged() {
    let server = TestServer::new();
    let client = server.client("m1");
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let mut c = cm("obj");
    c.metadata.annotations = Some([(FENCE_ANNOTATION.to_string(), "7/100".to_string())].into());
    let created = api.create(&PostParams::default(), &c).await.unwrap();
    let uid = created.metadata.uid.clone().unwrap();

    // Header fences, higher epoch: fine.
    let _: ConfigMap = server
        .client("m2")
        .request(fenced_patch("obj", "7/200", json!({"data": {"a": "1"}})))
        .await
        .unwrap();
    assert_eq!(server.fence_violations(), 0);
    // The old owner commits late with epoch 100 (annotation): flagged.
    api.patch(
        "obj",
        &PatchParams::default(),
        &Patch::Merge(
            json!({"metadata": {"annotations": {FENCE_ANNOTATION: "7/100"}}, "data": {"a": "2"}}),
        ),
    )
    .await
    .unwrap();
    // Epochs are generations of one assignment, comparable across shards: a lower epoch under
    // another shard is flagged too.
    let _: ConfigMap = client
        .request(fenced_patch("obj", "8/1", json!({"data": {"b": "1"}})))
        .await
        .unwrap();
    // Another object's epochs are its own.
    let mut other = cm("other");
    other.metadata.annotations = Some([(FENCE_ANNOTATION.to_string(), "7/1".to_string())].into());
    let other = api.create(&PostParams::default(), &other).await.unwrap();
    let audit = server.fence_audit();
    assert_eq!(audit.commits.len(), 5);
    assert_eq!(audit.violation_count(), 2);
    let found: Vec<_> = audit
        .violations
        .iter()
        .map(|v| {
            (
                v.commit.token.shard().unwrap(),
                v.commit.token.shard_epoch().unwrap(),
                v.highest_epoch().unwrap(),
            )
        })
        .collect();
    assert_eq!(found, [(7, 100, 200), (8, 1, 200)]);
    let v = &audit.violations[0];
    assert_eq!(v.commit.identity, "m1");
    assert_eq!(v.commit.uid, uid);
    assert_eq!(v.commit.source, FenceSource::Annotation);
    assert_eq!(audit.violations[1].commit.source, FenceSource::Header);
    assert_eq!(audit.highest_epoch(&uid), Some(200));
    assert_eq!(
        audit.highest_epoch(other.metadata.uid.as_deref().unwrap()),
        Some(1)
    );
    assert_eq!(audit.highest_epoch("no-such-uid"), None);
}

/// Members of a group at S = 16 and of its successor at S = 32 name different shards for one object;
/// the epochs they write are generations of one assignment all the same. Keyed by (uid, shard), the
/// audit would see two unrelated histories here and flag nothing.
#[tokio::test]
async fn a_lower_epoch_under_another_shard_count_is_flagged() {
    let server = TestServer::new();
    let api: Api<ConfigMap> = Api::namespaced(server.client("admin"), "default");
    let created = api
        .create(&PostParams::default(), &cm("widget"))
        .await
        .unwrap();
    let uid = created.metadata.uid.unwrap();
    let _: ConfigMap = server
        .client("s32-member")
        .request(fenced_patch("widget", "3/10", json!({"data": {"a": "1"}})))
        .await
        .unwrap();
    let _: ConfigMap = server
        .client("s16-member")
        .request(fenced_patch("widget", "7/9", json!({"data": {"a": "2"}})))
        .await
        .unwrap();
    let audit = server.fence_audit();
    assert_eq!(server.fence_violations(), 1);
    let v = &audit.violations[0];
    assert_eq!(
        (
            v.commit.identity.as_str(),
            v.commit.token.shard().unwrap(),
            v.commit.token.shard_epoch().unwrap(),
            v.highest_epoch().unwrap()
        ),
        ("s16-member", 7, 9, 10)
    );
    assert_eq!(v.commit.uid, uid);
    assert_eq!(audit.highest_epoch(&uid), Some(10));
}

#[tokio::test]
async fn malformed_fences_are_audit_errors_not_failures() {
    let server = TestServer::new();
    let client = server.client("m");
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    api.create(&PostParams::default(), &cm("obj"))
        .await
        .unwrap();
    let _: ConfigMap = client
        .request(fenced_patch(
            "obj",
            "not-a-token",
            json!({"data": {"a": "1"}}),
        ))
        .await
        .unwrap();
    let audit = server.fence_audit();
    assert_eq!(audit.errors.len(), 1);
    assert_eq!(audit.errors[0].raw, "not-a-token");
    assert_eq!(audit.errors[0].source, FenceSource::Header);
    assert_eq!(audit.violation_count(), 0);
}

#[tokio::test]
async fn failed_writes_are_not_commits() {
    let server = TestServer::new();
    let client = server.client("m");
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    api.create(&PostParams::default(), &cm("obj"))
        .await
        .unwrap();
    let _: ConfigMap = client
        .request(fenced_patch("obj", "1/10", json!({"data": {"a": "1"}})))
        .await
        .unwrap();
    // A stale-RV fenced write with a lower epoch is refused (409), so nothing is flagged.
    let err = client
        .request::<ConfigMap>(fenced_patch(
            "obj",
            "1/5",
            json!({"metadata": {"resourceVersion": "1"}}),
        ))
        .await
        .unwrap_err();
    assert_eq!(crate::common::code(&err), Some(409));
    assert_eq!(server.fence_violations(), 0);
    assert_eq!(server.fence_audit().commits.len(), 1);
}

/// The oracle for the two-level token: a deposed Active's write at a lower failover epoch is flagged even
/// with a far higher shard epoch (a failover epoch is never compared with a shard epoch); a newer term's
/// write with a lower shard epoch, and the mirror's write at the highest failover epoch, are not.
#[tokio::test]
async fn a_planted_lower_failover_epoch_commit_is_flagged() {
    let server = TestServer::new();
    let api: Api<ConfigMap> = Api::namespaced(server.client("admin"), "default");
    let uid = api
        .create(&PostParams::default(), &cm("obj"))
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap();
    let write = |who: &'static str, token: &'static str, v: &'static str| {
        let client = server.client(who);
        async move {
            let _: ConfigMap = client
                .request(fenced_patch("obj", token, json!({"data": {"a": v}})))
                .await
                .unwrap();
        }
    };
    write("a", "1001:3/500", "1").await;
    // B promoted at 2002: its group's shard epochs are older (a shard epoch is compared only within one
    // failover epoch), and it writes over A's stamp
    write("b", "2002:9/7", "2").await;
    // B's mirror at failover epoch 2002: no shard epoch to compare
    write("mirror", "2002:mirror", "3").await;
    write("b", "2002:9/7", "4").await;
    assert_eq!(server.fence_violations(), 0, "{:?}", server.fence_audit());
    // the planted bug: deposed A writes late under its old term, shard epoch far higher
    write("a", "1001:3/900", "5").await;
    // and a legacy token (failover epoch 0) is behind every HA term's
    write("old-writer", "3/999", "6").await;
    let audit = server.fence_audit();
    let found: Vec<_> = audit
        .violations
        .iter()
        .map(|v| {
            (
                v.commit.identity.as_str(),
                v.commit.token.to_string(),
                v.highest.to_string(),
            )
        })
        .collect();
    assert_eq!(
        found,
        [
            ("a", "1001:3/900".to_owned(), "2002:9/7".to_owned()),
            ("old-writer", "0:3/999".to_owned(), "2002:9/7".to_owned()),
        ]
    );
    assert_eq!(
        audit.highest_token(&uid).map(|t| t.to_string()).as_deref(),
        Some("2002:9/7")
    );
    assert_eq!(audit.highest_epoch(&uid), Some(7));
    // the same shard epoch order still holds inside one failover epoch
    write("b-old", "2002:9/6", "7").await;
    assert_eq!(server.fence_violations(), 3);
}
