//! CRD registration, custom resources, the status subresource and discovery.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{
    api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams},
    core::{ApiResource, DynamicObject, GroupVersionKind},
    discovery::Discovery,
};
use kube_shard_testserver::TestServer;
use serde_json::json;

use crate::common::code;

pub fn widget_crd(scope: &str, status: bool) -> CustomResourceDefinition {
    let mut version = json!({
        "name": "v1", "served": true, "storage": true,
        "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
    });
    if status {
        version["subresources"] = json!({"status": {}});
    }
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "shortNames": ["wd"]},
            "scope": scope,
            "versions": [version],
        },
    }))
    .unwrap()
}

pub fn widget_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("example.com", "v1", "Widget"),
        "widgets",
    )
}

pub fn widget(name: &str, spec: serde_json::Value) -> DynamicObject {
    DynamicObject::new(name, &widget_resource()).data(json!({"spec": spec}))
}

pub async fn install_widgets(server: &TestServer, scope: &str, status: bool) {
    let crds: Api<CustomResourceDefinition> = Api::all(server.client("admin"));
    let crd = crds
        .create(&PostParams::default(), &widget_crd(scope, status))
        .await
        .unwrap();
    let conds = crd.status.unwrap().conditions.unwrap();
    assert!(conds
        .iter()
        .any(|c| c.type_ == "Established" && c.status == "True"));
}

#[tokio::test]
async fn crd_registration_serves_the_resource_and_discovery_sees_it() {
    let server = TestServer::new();
    let client = server.client("a");
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), "default", &widget_resource());
    assert_eq!(
        code(&api.list(&ListParams::default()).await.unwrap_err()),
        Some(404)
    );
    install_widgets(&server, "Namespaced", true).await;
    let w = api
        .create(&PostParams::default(), &widget("w1", json!({"size": 1})))
        .await
        .unwrap();
    assert_eq!(w.metadata.generation, Some(1));
    assert_eq!(w.types.as_ref().unwrap().api_version, "example.com/v1");
    let list = api.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 1);

    let discovery = Discovery::new(client.clone()).run().await.unwrap();
    let (ar, caps) = discovery
        .groups()
        .flat_map(|g| g.recommended_resources())
        .find(|(ar, _)| ar.plural == "widgets")
        .expect("widgets discovered");
    assert_eq!(ar.group, "example.com");
    assert_eq!(caps.scope, kube::discovery::Scope::Namespaced);
    assert!(caps
        .subresources
        .iter()
        .any(|(s, _)| s.plural == "status" || s.plural == "widgets/status"));
    assert!(discovery
        .groups()
        .any(|g| g.name() == "coordination.k8s.io"));

    // Deleting the CRD deletes the instances and stops serving.
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.delete("widgets.example.com", &DeleteParams::default())
        .await
        .unwrap();
    assert_eq!(
        code(&crds.get("widgets.example.com").await.unwrap_err()),
        Some(404)
    );
    assert_eq!(
        code(&api.list(&ListParams::default()).await.unwrap_err()),
        Some(404)
    );
}

#[tokio::test]
async fn invalid_crds_are_refused() {
    let server = TestServer::new();
    let crds: Api<CustomResourceDefinition> = Api::all(server.client("a"));
    let mut bad = widget_crd("Namespaced", false);
    bad.metadata.name = Some("wrong.example.com".into());
    assert_eq!(
        code(&crds.create(&PostParams::default(), &bad).await.unwrap_err()),
        Some(422)
    );
}

#[tokio::test]
async fn status_subresource_and_generation() {
    let server = TestServer::new();
    install_widgets(&server, "Namespaced", true).await;
    let api: Api<DynamicObject> =
        Api::namespaced_with(server.client("a"), "default", &widget_resource());
    let mut w = widget("w", json!({"size": 1}));
    w.data["status"] = json!({"ready": true});
    let created = api.create(&PostParams::default(), &w).await.unwrap();
    assert!(
        created.data.get("status").is_none(),
        "create drops status when the subresource exists"
    );

    // A status write changes only .status: metadata and spec in it are ignored, generation kept.
    let st = api
        .patch_status(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}, "spec": {"size": 9}, "status": {"ready": true}})),
        )
        .await
        .unwrap();
    assert_eq!(st.data["status"]["ready"], true);
    assert_eq!(st.data["spec"]["size"], 1);
    assert!(st.metadata.labels.is_none());
    assert_eq!(st.metadata.generation, Some(1));

    // A main-resource write ignores .status and bumps generation on spec changes only.
    let main = api
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": 2}, "status": {"ready": false}})),
        )
        .await
        .unwrap();
    assert_eq!(main.metadata.generation, Some(2));
    assert_eq!(main.data["status"]["ready"], true);
    let labels = api
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}})),
        )
        .await
        .unwrap();
    assert_eq!(labels.metadata.generation, Some(2));

    // replace_status with a stale resourceVersion conflicts.
    let mut stale = created.clone();
    stale.data["status"] = json!({"ready": false});
    let err = api
        .replace_status("w", &PostParams::default(), &stale)
        .await
        .unwrap_err();
    assert_eq!(code(&err), Some(409));
    let got = api.get_status("w").await.unwrap();
    assert_eq!(got.data["status"]["ready"], true);
}

#[tokio::test]
async fn cluster_scoped_crd_without_status() {
    let server = TestServer::new();
    install_widgets(&server, "Cluster", false).await;
    let api: Api<DynamicObject> = Api::all_with(server.client("a"), &widget_resource());
    let mut w = widget("c", json!({"size": 1}));
    w.data["status"] = json!({"phase": "x"});
    let c = api.create(&PostParams::default(), &w).await.unwrap();
    assert!(c.metadata.namespace.is_none());
    assert_eq!(
        c.data["status"]["phase"], "x",
        "no status subresource: status is ordinary data"
    );
    let err = api.get_status("c").await.unwrap_err();
    assert_eq!(code(&err), Some(404));
    // Without a status subresource, a status change bumps generation.
    let p = api
        .patch(
            "c",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "y"}})),
        )
        .await
        .unwrap();
    assert_eq!(p.metadata.generation, Some(2));
    let namespaced: Api<DynamicObject> =
        Api::namespaced_with(server.client("a"), "default", &widget_resource());
    assert_eq!(code(&namespaced.get("c").await.unwrap_err()), Some(404));
}
