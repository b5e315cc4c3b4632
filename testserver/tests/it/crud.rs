//! Object semantics through `kube::Api`.

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube_shard_testserver::TestServer;
use serde_json::json;

use crate::common::{cm, code};

#[tokio::test]
async fn create_get_replace_patch_delete() {
    let server = TestServer::new();
    let api: Api<ConfigMap> = Api::namespaced(server.client("a"), "default");
    let created = api
        .create(&PostParams::default(), &cm("one"))
        .await
        .unwrap();
    let uid = created.metadata.uid.clone().unwrap();
    assert_eq!(uid.len(), 36);
    assert!(created.metadata.creation_timestamp.is_some());
    assert!(
        created.metadata.generation.is_none(),
        "configmaps have no generation"
    );
    let rv1: u64 = created
        .metadata
        .resource_version
        .clone()
        .unwrap()
        .parse()
        .unwrap();

    let err = api
        .create(&PostParams::default(), &cm("one"))
        .await
        .unwrap_err();
    assert_eq!(code(&err), Some(409));

    let got = api.get("one").await.unwrap();
    assert_eq!(got.metadata.uid, created.metadata.uid);

    let mut next = got.clone();
    next.data = Some([("k".into(), "v2".into())].into());
    let replaced = api
        .replace("one", &PostParams::default(), &next)
        .await
        .unwrap();
    let rv2: u64 = replaced
        .metadata
        .resource_version
        .clone()
        .unwrap()
        .parse()
        .unwrap();
    assert!(rv2 > rv1);

    // Stale resourceVersion → 409 Conflict.
    let err = api
        .replace("one", &PostParams::default(), &next)
        .await
        .unwrap_err();
    assert_eq!(code(&err), Some(409));
    // A different uid → 409.
    let mut other = replaced.clone();
    other.metadata.uid = Some("00000000-0000-0000-0000-000000000000".into());
    let err = api
        .replace("one", &PostParams::default(), &other)
        .await
        .unwrap_err();
    assert_eq!(code(&err), Some(409));

    // A no-op update keeps the resourceVersion.
    let same = api
        .replace("one", &PostParams::default(), &replaced)
        .await
        .unwrap();
    assert_eq!(
        same.metadata.resource_version,
        replaced.metadata.resource_version
    );

    let patched = api
        .patch(
            "one",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"x": "y"}})),
        )
        .await
        .unwrap();
    assert_eq!(patched.data.as_ref().unwrap()["x"], "y");
    assert_eq!(patched.data.as_ref().unwrap()["k"], "v2");

    let applied = api
        .patch("two", &PatchParams::apply("me"), &Patch::Apply(json!({
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "two"}, "data": {"a": "b"}
        })))
        .await
        .unwrap();
    assert_eq!(applied.data.unwrap()["a"], "b");

    let jp = api
        .patch(
            "two",
            &PatchParams::default(),
            &Patch::<()>::Json(
                serde_json::from_value(json!([{"op": "replace", "path": "/data/a", "value": "c"}]))
                    .unwrap(),
            ),
        )
        .await
        .unwrap();
    assert_eq!(jp.data.unwrap()["a"], "c");

    api.delete("one", &DeleteParams::default()).await.unwrap();
    assert_eq!(code(&api.get("one").await.unwrap_err()), Some(404));
    assert_eq!(
        code(
            &api.delete("one", &DeleteParams::default())
                .await
                .unwrap_err()
        ),
        Some(404)
    );
}

#[tokio::test]
async fn delete_preconditions() {
    let server = TestServer::new();
    let api: Api<ConfigMap> = Api::namespaced(server.client("a"), "default");
    let c = api.create(&PostParams::default(), &cm("p")).await.unwrap();
    let wrong_uid = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some("nope".into()),
            resource_version: None,
        }),
        ..Default::default()
    };
    assert_eq!(
        code(&api.delete("p", &wrong_uid).await.unwrap_err()),
        Some(409)
    );
    let wrong_rv = DeleteParams {
        preconditions: Some(Preconditions {
            uid: None,
            resource_version: Some("1".into()),
        }),
        ..Default::default()
    };
    assert_eq!(
        code(&api.delete("p", &wrong_rv).await.unwrap_err()),
        Some(409)
    );
    let right = DeleteParams {
        preconditions: Some(Preconditions {
            uid: c.metadata.uid.clone(),
            resource_version: c.metadata.resource_version.clone(),
        }),
        ..Default::default()
    };
    api.delete("p", &right).await.unwrap();
}

#[tokio::test]
async fn finalizers_keep_the_object_until_removed() {
    let server = TestServer::new();
    let api: Api<ConfigMap> = Api::namespaced(server.client("a"), "default");
    let mut c = cm("f");
    c.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    api.create(&PostParams::default(), &c).await.unwrap();
    let res = api.delete("f", &DeleteParams::default()).await.unwrap();
    let pending = res.left().expect("the object, still there");
    assert!(pending.metadata.deletion_timestamp.is_some());
    let still = api.get("f").await.unwrap();
    assert!(still.metadata.deletion_timestamp.is_some());
    api.patch(
        "f",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert_eq!(code(&api.get("f").await.unwrap_err()), Some(404));
}

#[tokio::test]
async fn namespaces_are_required_and_stay_terminating() {
    let server = TestServer::new();
    let client = server.client("a");
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "missing");
    assert_eq!(
        code(
            &api.create(&PostParams::default(), &cm("x"))
                .await
                .unwrap_err()
        ),
        Some(404)
    );
    let nss: Api<Namespace> = Api::all(client.clone());
    let names: Vec<String> = nss
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|n| n.metadata.name.unwrap())
        .collect();
    assert_eq!(
        names,
        ["default", "kube-node-lease", "kube-public", "kube-system"]
    );
    let ns = Namespace {
        metadata: kube::api::ObjectMeta {
            name: Some("t".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    nss.create(&PostParams::default(), &ns).await.unwrap();
    let inside: Api<ConfigMap> = Api::namespaced(client.clone(), "t");
    inside
        .create(&PostParams::default(), &cm("x"))
        .await
        .unwrap();
    nss.delete("t", &DeleteParams::default()).await.unwrap();
    let t = nss.get("t").await.unwrap();
    assert_eq!(t.status.unwrap().phase.as_deref(), Some("Terminating"));
    assert_eq!(
        code(
            &inside
                .create(&PostParams::default(), &cm("y"))
                .await
                .unwrap_err()
        ),
        Some(403)
    );
    assert!(
        inside.get("x").await.is_ok(),
        "no namespace controller in a bare apiserver"
    );
}

#[tokio::test]
async fn controllers_mode_finalises_namespaces_and_collects_garbage() {
    let server = TestServer::builder().controllers(true).build();
    let client = server.client("a");
    let nss: Api<Namespace> = Api::all(client.clone());
    let ns = Namespace {
        metadata: kube::api::ObjectMeta {
            name: Some("t".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    nss.create(&PostParams::default(), &ns).await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let owner = api
        .create(&PostParams::default(), &cm("owner"))
        .await
        .unwrap();
    let mut dep = cm("dep");
    dep.metadata.owner_references = Some(vec![
        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            name: "owner".into(),
            uid: owner.metadata.uid.clone().unwrap(),
            ..Default::default()
        },
    ]);
    api.create(&PostParams::default(), &dep).await.unwrap();
    api.delete("owner", &DeleteParams::default()).await.unwrap();
    assert_eq!(code(&api.get("dep").await.unwrap_err()), Some(404));
    let inside: Api<ConfigMap> = Api::namespaced(client.clone(), "t");
    inside
        .create(&PostParams::default(), &cm("x"))
        .await
        .unwrap();
    nss.delete("t", &DeleteParams::default()).await.unwrap();
    assert_eq!(code(&nss.get("t").await.unwrap_err()), Some(404));
}

#[tokio::test]
async fn bad_input_gets_status_errors() {
    let server = TestServer::new();
    let client = server.client("a");
    let raw = |method: &str, uri: &str, body: &str, ct: &str| {
        http::Request::builder()
            .method(method)
            .uri(uri)
            .header("content-type", ct)
            .body(body.as_bytes().to_vec())
            .unwrap()
    };
    for (method, uri, body, ct, want) in [
        (
            "POST",
            "/api/v1/namespaces/default/configmaps",
            "{not json",
            "application/json",
            400,
        ),
        (
            "POST",
            "/api/v1/namespaces/default/configmaps",
            "[1]",
            "application/json",
            400,
        ),
        (
            "POST",
            "/api/v1/namespaces/default/configmaps",
            "{\"metadata\":{\"name\":\"Bad_Name\"}}",
            "application/json",
            422,
        ),
        (
            "POST",
            "/api/v1/namespaces/default/configmaps",
            "{\"kind\":\"Secret\",\"metadata\":{\"name\":\"x\"}}",
            "application/json",
            400,
        ),
        (
            "GET",
            "/api/v1/namespaces/default/widgets",
            "",
            "application/json",
            404,
        ),
        ("GET", "/apis/nope/v1/things", "", "application/json", 404),
        (
            "GET",
            "/api/v1/namespaces/default/configmaps?labelSelector=a%20b",
            "",
            "application/json",
            400,
        ),
        (
            "GET",
            "/api/v1/namespaces/default/configmaps?fieldSelector=spec.x%3D1",
            "",
            "application/json",
            400,
        ),
        (
            "GET",
            "/api/v1/namespaces/default/configmaps?continue=garbage",
            "",
            "application/json",
            400,
        ),
        (
            "GET",
            "/api/v1/namespaces/default/configmaps?resourceVersionMatch=Exact",
            "",
            "application/json",
            422,
        ),
        (
            "GET",
            "/api/v1/namespaces/default/configmaps?resourceVersion=abc",
            "",
            "application/json",
            400,
        ),
        (
            "PATCH",
            "/api/v1/namespaces/default/configmaps/x",
            "{}",
            "text/plain",
            415,
        ),
        (
            "PUT",
            "/api/v1/namespaces/default/configmaps",
            "{}",
            "application/json",
            405,
        ),
        (
            "POST",
            "/api/v1/namespaces/default/configmaps",
            "{\"metadata\":{\"name\":\"x\",\"resourceVersion\":\"5\"}}",
            "application/json",
            500,
        ),
        (
            "PATCH",
            "/api/v1/namespaces/default/configmaps/nope?fieldManager=x",
            "[1]",
            "application/apply-patch+yaml",
            400,
        ),
        (
            "GET",
            "/api/v1/namespaces/default/configmaps/x/status",
            "",
            "application/json",
            404,
        ),
    ] {
        let err = client
            .request_text(raw(method, uri, body, ct))
            .await
            .expect_err(uri);
        assert_eq!(code(&err), Some(want), "{method} {uri} {body}: {err}");
    }
}

#[tokio::test]
async fn hostile_patches_are_errors_not_panics() {
    let server = TestServer::new();
    let client = server.client("a");
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    api.create(&PostParams::default(), &cm("h")).await.unwrap();
    let patch = |body: &str, ct: &str, uri: &str| {
        http::Request::builder()
            .method("PATCH")
            .uri(uri)
            .header("content-type", ct)
            .body(body.as_bytes().to_vec())
            .unwrap()
    };
    let uri = "/api/v1/namespaces/default/configmaps/h?fieldManager=x";
    for (body, ct) in [
        (
            r#"[{"op":"replace","path":"","value":5}]"#,
            "application/json-patch+json",
        ),
        (
            r#"[{"op":"remove","path":"/metadata"}]"#,
            "application/json-patch+json",
        ),
        (r#"[{"op":"bogus"}]"#, "application/json-patch+json"),
        (r#"{"metadata": 5}"#, "application/merge-patch+json"),
        (r#"5"#, "application/merge-patch+json"),
        (
            r#"{"metadata": {"annotations": {"kube-shard.io/fence": 12}}}"#,
            "application/merge-patch+json",
        ),
    ] {
        let _ = client.request_text(patch(body, ct, uri)).await;
    }
    // Namespaces with a non-object status can still be deleted.
    let ns = "/api/v1/namespaces/default/status";
    let _ = client
        .request_text(patch(
            r#"{"status": 5}"#,
            "application/merge-patch+json",
            ns,
        ))
        .await;
    let nss: Api<Namespace> = Api::all(client.clone());
    nss.delete("default", &DeleteParams::default())
        .await
        .unwrap();
    let after = api.list(&ListParams::default()).await;
    assert!(after.is_ok(), "still serving: {after:?}");
}

/// json-patch 4.2's own undo panicked on this patch: the `move` removed `/metadata/labels`, failed to add
/// it under a missing parent, and the undo of the first `replace` then met the missing path (found by the
/// `json_patch` fuzz target). The patch is refused as a whole and the object stays as it was.
#[tokio::test]
async fn a_json_patch_whose_move_fails_half_way_is_refused_and_changes_nothing() {
    let server = TestServer::new();
    let api: Api<ConfigMap> = Api::namespaced(server.client("a"), "default");
    let before = api
        .create(
            &PostParams::default(),
            &crate::common::cm_labeled("m", "a", "b"),
        )
        .await
        .unwrap();
    let body = r#"[{"op":"replace","path":"/metadata/labels/a","value":"x"},
        {"op":"move","from":"/metadata/labels","path":"/nope/labels"}]"#;
    let request = http::Request::builder()
        .method("PATCH")
        .uri("/api/v1/namespaces/default/configmaps/m")
        .header("content-type", "application/json-patch+json")
        .body(body.as_bytes().to_vec())
        .unwrap();
    let err = server.client("a").request_text(request).await.unwrap_err();
    assert_eq!(code(&err), Some(422), "{err:?}");
    let after = api.get("m").await.unwrap();
    assert_eq!(after.metadata.labels, before.metadata.labels);
    assert_eq!(
        after.metadata.resource_version,
        before.metadata.resource_version
    );
}

#[tokio::test]
async fn lease_compare_and_swap_has_one_winner() {
    use k8s_openapi::api::coordination::v1::Lease;
    let server = TestServer::new();
    let a: Api<Lease> = Api::namespaced(server.client("a"), "default");
    let b: Api<Lease> = Api::namespaced(server.client("b"), "default");
    let lease: Lease = serde_json::from_value(json!({
        "metadata": {"name": "l"},
        "spec": {"holderIdentity": "none", "leaseDurationSeconds": 15, "renewTime": "2026-01-01T00:00:00.000000Z"}
    }))
    .unwrap();
    a.create(&PostParams::default(), &lease).await.unwrap();
    let seen_a = a.get("l").await.unwrap();
    let seen_b = b.get("l").await.unwrap();
    let mut take_a = seen_a.clone();
    take_a.spec.as_mut().unwrap().holder_identity = Some("a".into());
    let mut take_b = seen_b.clone();
    take_b.spec.as_mut().unwrap().holder_identity = Some("b".into());
    let ra = a.replace("l", &PostParams::default(), &take_a).await;
    let rb = b.replace("l", &PostParams::default(), &take_b).await;
    assert!(ra.is_ok());
    assert_eq!(code(&rb.unwrap_err()), Some(409));
    let now = a.get("l").await.unwrap();
    assert_eq!(now.spec.unwrap().holder_identity.as_deref(), Some("a"));
    assert_eq!(
        now.metadata.resource_version,
        ra.unwrap().metadata.resource_version
    );
}

#[tokio::test]
async fn generate_name_dry_run_and_legacy_watch_paths() {
    use futures::StreamExt;
    let server = TestServer::new();
    let client = server.client("a");
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let mut g = cm("");
    g.metadata.name = None;
    g.metadata.generate_name = Some("gen-".into());
    let made = api.create(&PostParams::default(), &g).await.unwrap();
    let name = made.metadata.name.unwrap();
    assert!(name.starts_with("gen-") && name.len() == 9, "{name}");

    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    api.create(&dry, &cm("dry")).await.unwrap();
    assert_eq!(code(&api.get("dry").await.unwrap_err()), Some(404));
    let dp = DeleteParams {
        dry_run: true,
        ..Default::default()
    };
    api.delete(&name, &dp).await.unwrap();
    assert!(api.get(&name).await.is_ok());

    // GET /api/v1/watch/namespaces/default/configmaps/NAME watches one object.
    let rv = server.resource_version();
    let req = http::Request::get(format!(
        "/api/v1/watch/namespaces/default/configmaps/{name}?resourceVersion={rv}&timeoutSeconds=5"
    ))
    .body(Vec::new())
    .unwrap();
    let mut events = client
        .request_events::<ConfigMap>(req)
        .await
        .unwrap()
        .boxed();
    api.create(&PostParams::default(), &cm("other"))
        .await
        .unwrap();
    api.patch(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"z": "1"}})),
    )
    .await
    .unwrap();
    match events.next().await.unwrap().unwrap() {
        kube::api::WatchEvent::Modified(o) => {
            assert_eq!(o.metadata.name.as_deref(), Some(name.as_str()))
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn objects_can_be_inspected_without_a_client() {
    let server = TestServer::new();
    let api: Api<ConfigMap> = Api::namespaced(server.client("a"), "default");
    api.create(&PostParams::default(), &cm("seen"))
        .await
        .unwrap();
    let before = server.accounting("a");
    let o = server
        .object("", "configmaps", Some("default"), "seen")
        .unwrap();
    assert_eq!(o["kind"], "ConfigMap");
    assert_eq!(server.objects("", "configmaps").len(), 1);
    assert_eq!(server.objects("", "namespaces").len(), 4);
    assert!(server
        .object("", "configmaps", Some("default"), "nope")
        .is_none());
    assert_eq!(server.accounting("a"), before);
}

/// kube's `finalizer` helper adds the first finalizer with `test /metadata/finalizers == null` then `add`:
/// kube-apiserver passes a `test` of `null` on a missing path (and fails one of a value), so must this.
#[tokio::test]
async fn a_json_patch_test_of_null_passes_on_a_missing_path() {
    let server = TestServer::new();
    let api: Api<ConfigMap> = Api::namespaced(server.client("t"), "default");
    api.create(&PostParams::default(), &cm("fin"))
        .await
        .unwrap();
    let first: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/finalizers", "value": null},
        {"op": "add", "path": "/metadata/finalizers", "value": ["example.com/f"]},
    ]))
    .unwrap();
    let got = api
        .patch("fin", &PatchParams::default(), &Patch::<()>::Json(first))
        .await
        .unwrap();
    assert_eq!(
        got.metadata.finalizers,
        Some(vec!["example.com/f".to_owned()])
    );
    // the same test now meets a value: refused, nothing changed
    let again: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/finalizers", "value": null},
        {"op": "add", "path": "/metadata/labels", "value": {"a": "b"}},
    ]))
    .unwrap();
    let err = api
        .patch("fin", &PatchParams::default(), &Patch::<()>::Json(again))
        .await
        .unwrap_err();
    assert_eq!(code(&err), Some(422));
    assert!(api.get("fin").await.unwrap().metadata.labels.is_none());
}
