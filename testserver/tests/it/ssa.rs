//! Server-side apply, managedFields, strategic merge and the captured OpenAPI, through `kube::Client`.

use k8s_openapi::api::{apps::v1::Deployment, core::v1::ConfigMap};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube_shard_testserver::TestServer;
use serde_json::json;

use crate::common::{cm, code, get_json};

fn managers(cm: &ConfigMap) -> Vec<(String, String)> {
    let mut m: Vec<(String, String)> = cm
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .map(|e| (e.manager.clone().unwrap(), e.operation.clone().unwrap()))
        .collect();
    m.sort();
    m
}

fn apply(manager: &str) -> PatchParams {
    PatchParams::apply(manager)
}

#[tokio::test(start_paused = true)]
async fn two_appliers_conflict_then_force_and_share() {
    let server = TestServer::new();
    let api: Api<ConfigMap> = Api::namespaced(server.client("op"), "default");
    let c1 = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"},
                    "data": {"a": "1", "b": "2"}});
    let made = api
        .patch("c", &apply("m1"), &Patch::Apply(&c1))
        .await
        .unwrap();
    assert_eq!(managers(&made), [("m1".into(), "Apply".into())]);

    let c2 = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"},
                    "data": {"a": "9"}});
    let err = api
        .patch("c", &apply("m2"), &Patch::Apply(&c2))
        .await
        .unwrap_err();
    assert_eq!(code(&err), Some(409));
    let kube::Error::Api(status) = &err else {
        panic!("{err}")
    };
    assert_eq!(
        status.message,
        "Apply failed with 1 conflict: conflict with \"m1\": .data.a"
    );

    // The same value is shared ownership; force takes the field over.
    let same = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "1"}});
    api.patch("c", &apply("m2"), &Patch::Apply(&same))
        .await
        .unwrap();
    let forced = api
        .patch("c", &apply("m2").force(), &Patch::Apply(&c2))
        .await
        .unwrap();
    assert_eq!(forced.data.as_ref().unwrap()["a"], "9");
    let m1 = forced
        .metadata
        .managed_fields
        .as_ref()
        .unwrap()
        .iter()
        .find(|e| e.manager.as_deref() == Some("m1"))
        .unwrap();
    assert_eq!(
        m1.fields_v1.as_ref().unwrap().0,
        json!({"f:data": {"f:b": {}}})
    );

    // m1 stops applying b: it goes, as nobody else owns it.
    let c1b =
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {}});
    let after = api
        .patch("c", &apply("m1"), &Patch::Apply(&c1b))
        .await
        .unwrap();
    assert_eq!(after.data.unwrap().keys().collect::<Vec<_>>(), ["a"]);
}

#[tokio::test(start_paused = true)]
async fn every_write_records_an_update_entry() {
    let server = TestServer::new();
    let api: Api<ConfigMap> = Api::namespaced(server.client("op"), "default");
    let pp = PostParams {
        field_manager: Some("creator".into()),
        ..Default::default()
    };
    api.create(&pp, &cm("c")).await.unwrap();
    let patched = api
        .patch(
            "c",
            &PatchParams {
                field_manager: Some("editor".into()),
                ..Default::default()
            },
            &Patch::Merge(json!({"data": {"k": "2"}})),
        )
        .await
        .unwrap();
    assert_eq!(
        managers(&patched),
        [
            ("creator".into(), "Update".into()),
            ("editor".into(), "Update".into())
        ]
    );
    let entries = patched.metadata.managed_fields.unwrap();
    assert_eq!(
        entries[0].fields_v1.as_ref().unwrap().0,
        json!({"f:data": {}})
    );
    assert_eq!(
        entries[1].fields_v1.as_ref().unwrap().0,
        json!({"f:data": {"f:k": {}}})
    );
}

#[tokio::test(start_paused = true)]
async fn strategic_merge_patches_containers_by_name() {
    let server = TestServer::new();
    let api: Api<Deployment> = Api::namespaced(server.client("op"), "default");
    let d: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}},
                              "spec": {"containers": [{"name": "web", "image": "nginx:1"},
                                                      {"name": "side", "image": "busybox:1"}]}}}
    }))
    .unwrap();
    api.create(&PostParams::default(), &d).await.unwrap();
    let p = json!({"spec": {"template": {"spec": {"containers": [{"name": "side", "image": "busybox:2"}]}}}});
    let d = api
        .patch("web", &PatchParams::default(), &Patch::Strategic(p))
        .await
        .unwrap();
    let cs = d.spec.template.spec.unwrap().containers;
    let got: Vec<(String, String)> = cs
        .iter()
        .map(|c| (c.name.clone(), c.image.clone().unwrap()))
        .collect();
    assert_eq!(
        got,
        [
            ("web".into(), "nginx:1".into()),
            ("side".into(), "busybox:2".into())
        ]
    );
    // A merge patch replaces the list.
    let p =
        json!({"spec": {"template": {"spec": {"containers": [{"name": "only", "image": "x"}]}}}});
    let d = api
        .patch("web", &PatchParams::default(), &Patch::Merge(p))
        .await
        .unwrap();
    assert_eq!(d.spec.template.spec.unwrap().containers.len(), 1);
}

#[tokio::test]
async fn serves_the_captured_openapi() {
    let server = TestServer::new();
    let client = server.client("kubectl");
    let v3 = get_json(&client, "/openapi/v3").await.unwrap();
    assert!(v3["paths"]["apis/apps/v1"]["serverRelativeURL"]
        .as_str()
        .unwrap()
        .contains("hash="));
    let apps = get_json(&client, "/openapi/v3/apis/apps/v1").await.unwrap();
    let strategy = &apps["components"]["schemas"]["io.k8s.api.apps.v1.DeploymentSpec"]
        ["properties"]["strategy"];
    assert!(strategy.is_object(), "{strategy}");
    let v2 = get_json(&client, "/openapi/v2").await.unwrap();
    let containers = &v2["definitions"]["io.k8s.api.core.v1.PodSpec"]["properties"]["containers"];
    assert_eq!(containers["x-kubernetes-patch-merge-key"], "name");
}
