//! Built-in kinds: every resource of the captured discovery is served and discovered as the real server
//! lists it, and the server-side behaviours that need no controller (defaults, generation, /scale,
//! /status, stringData, immutable data, Service clusterIP allocation, event field selectors, reviews).

use k8s_openapi::api::{
    apps::v1::Deployment,
    core::v1::{ConfigMap, Event, Secret, Service},
};
use kube::{
    api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams},
    core::{ApiResource, GroupVersionKind},
};
use kube_shard_testserver::TestServer;
use serde_json::{json, Value};

use crate::common::{code, enc, get_json};

const CAPTURED: &str = include_str!("../../kinds/discovery.json");

fn obj<T: serde::de::DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).unwrap()
}

/// The generated table agrees with the capture it was generated from: every resource (and the
/// subresources served: status, scale) is discovered with the real server's kind, scope, verbs and short
/// names, and every stored one takes a create, a get and a list.
#[tokio::test(start_paused = true)]
async fn every_captured_resource_is_discovered_and_stored() {
    let server = TestServer::new();
    let client = server.client("t");
    let captured: Value = serde_json::from_str(CAPTURED).unwrap();
    let mut stored = 0;
    for (gv, resources) in captured["resources"].as_object().unwrap() {
        let path = if gv.contains('/') {
            format!("/apis/{gv}")
        } else {
            format!("/api/{gv}")
        };
        let served = get_json(&client, &path).await.unwrap();
        let served = served["resources"].as_array().unwrap();
        for want in resources.as_array().unwrap() {
            let name = want["name"].as_str().unwrap();
            let sub = name.split_once('/').map(|(_, s)| s);
            if sub.is_some_and(|s| !["status", "scale", "finalize"].contains(&s)) {
                continue; // documented: not served
            }
            let got = served
                .iter()
                .find(|r| r["name"] == want["name"])
                .unwrap_or_else(|| panic!("{gv} {name} not discovered"));
            for f in ["kind", "namespaced"] {
                assert_eq!(got[f], want[f], "{gv} {name} {f}");
            }
            if sub.is_none() {
                for f in ["verbs", "shortNames", "categories", "singularName"] {
                    assert_eq!(got.get(f), want.get(f), "{gv} {name} {f}");
                }
            }
            let verbs = want["verbs"].as_array().unwrap();
            // CRDs are validated (and covered by the crd tests).
            let crd = name == "customresourcedefinitions";
            if sub.is_none() && verbs.contains(&json!("list")) && !crd {
                stored += 1;
                create_get_list(&client, gv, want).await;
            }
        }
    }
    assert!(stored >= 60, "{stored}");
    // autoscaling/v1 and v2 share one storage, as on the real server.
    let hpa = get_json(
        &client,
        "/apis/autoscaling/v1/namespaces/default/horizontalpodautoscalers",
    )
    .await
    .unwrap();
    assert_eq!(crate::common::item_names(&hpa), ["t-v1", "t-v2"]);
}

async fn create_get_list(client: &kube::Client, gv: &str, r: &Value) {
    let (group, version) = gv.split_once('/').unwrap_or(("", gv));
    let kind = r["kind"].as_str().unwrap();
    let plural = r["name"].as_str().unwrap();
    let ar =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural);
    let api: Api<DynamicObject> = if r["namespaced"] == json!(true) {
        Api::namespaced_with(client.clone(), "default", &ar)
    } else {
        Api::all_with(client.clone(), &ar)
    };
    let name = format!("t-{version}");
    let o = DynamicObject::new(&name, &ar);
    let created = api.create(&PostParams::default(), &o).await;
    if let Err(e) = &created {
        panic!("{gv} {plural}: create: {e}");
    }
    api.get(&name)
        .await
        .unwrap_or_else(|e| panic!("{gv} {plural}: get: {e}"));
    let listed = api.list(&ListParams::default()).await.unwrap();
    assert!(
        listed
            .items
            .iter()
            .any(|i| i.metadata.name.as_deref() == Some(&name)),
        "{gv} {plural}"
    );
}

fn deployment(name: &str) -> Deployment {
    obj(json!({
        "metadata": {"name": name},
        "spec": {"selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}},
                              "spec": {"containers": [{"name": "c", "image": "nginx:1.27"}]}}},
    }))
}

#[tokio::test(start_paused = true)]
async fn deployment_defaults_generation_scale_and_status() {
    let server = TestServer::new();
    let api: Api<Deployment> = Api::namespaced(server.client("t"), "default");
    let d = api
        .create(&PostParams::default(), &deployment("web"))
        .await
        .unwrap();
    assert_eq!(d.metadata.generation, Some(1));
    let spec = &d.spec;
    assert_eq!(spec.replicas, Some(1));
    assert_eq!(spec.revision_history_limit, Some(10));
    let pod = spec.template.spec.as_ref().unwrap();
    assert_eq!(pod.restart_policy.as_deref(), Some("Always"));
    assert_eq!(
        pod.containers[0].image_pull_policy.as_deref(),
        Some("IfNotPresent")
    );

    // Metadata changes keep the generation, spec changes bump it.
    let pp = PatchParams::default();
    let d = api
        .patch(
            "web",
            &pp,
            &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
        )
        .await
        .unwrap();
    assert_eq!(d.metadata.generation, Some(1));
    let d = api
        .patch("web", &pp, &Patch::Merge(json!({"spec": {"paused": true}})))
        .await
        .unwrap();
    assert_eq!(d.metadata.generation, Some(2));

    // /scale reads and writes spec.replicas (a spec change: generation bumped).
    let scale = api.get_scale("web").await.unwrap();
    assert_eq!(scale.spec.unwrap().replicas, Some(1));
    assert_eq!(scale.status.unwrap().selector.as_deref(), Some("app=web"));
    let scale = api
        .patch_scale("web", &pp, &Patch::Merge(json!({"spec": {"replicas": 3}})))
        .await
        .unwrap();
    assert_eq!(scale.spec.unwrap().replicas, Some(3));
    let d = api.get("web").await.unwrap();
    assert_eq!((d.spec.replicas, d.metadata.generation), (Some(3), Some(3)));

    // /status writes only status (and keep the generation); a main write ignores status.
    let st = json!({"status": {"replicas": 3, "observedGeneration": 3}});
    let d = api
        .patch_status("web", &pp, &Patch::Merge(st))
        .await
        .unwrap();
    assert_eq!(d.status.as_ref().unwrap().replicas, Some(3));
    assert_eq!(d.metadata.generation, Some(3));
    let d = api
        .patch(
            "web",
            &pp,
            &Patch::Merge(json!({"status": {"replicas": 9}})),
        )
        .await
        .unwrap();
    assert_eq!(d.status.unwrap().replicas, Some(3));
    assert_eq!(
        api.get_scale("web").await.unwrap().status.unwrap().replicas,
        3
    );
}

#[tokio::test(start_paused = true)]
async fn secret_string_data_and_immutable_data() {
    let server = TestServer::new();
    let client = server.client("t");
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "default");
    let s: Secret = obj(json!({"metadata": {"name": "s"}, "stringData": {"password": "hunter2"}}));
    let s = secrets.create(&PostParams::default(), &s).await.unwrap();
    assert_eq!(s.string_data, None);
    assert_eq!(s.type_.as_deref(), Some("Opaque"));
    assert_eq!(s.data.unwrap()["password"].0, b"hunter2");
    let pp = PatchParams::default();
    let s = secrets
        .patch(
            "s",
            &pp,
            &Patch::Merge(json!({"stringData": {"user": "admin"}})),
        )
        .await
        .unwrap();
    assert_eq!(s.data.as_ref().unwrap().len(), 2);

    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    let c: ConfigMap =
        obj(json!({"metadata": {"name": "frozen"}, "data": {"k": "v"}, "immutable": true}));
    cms.create(&PostParams::default(), &c).await.unwrap();
    for change in [
        json!({"data": {"k": "w"}}),
        json!({"immutable": false}),
        json!({"binaryData": {"b": "AA=="}}),
    ] {
        let e = cms
            .patch("frozen", &pp, &Patch::Merge(change.clone()))
            .await
            .unwrap_err();
        assert_eq!(code(&e), Some(422), "{change}");
        assert!(
            e.to_string()
                .contains("field is immutable when `immutable` is set"),
            "{e}"
        );
    }
    // Metadata still changes.
    let c = cms
        .patch(
            "frozen",
            &pp,
            &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}})),
        )
        .await
        .unwrap();
    assert_eq!(c.metadata.labels.unwrap()["a"], "b");
    // A mutable one changes freely.
    let c: ConfigMap = obj(json!({"metadata": {"name": "free"}, "data": {"k": "v"}}));
    cms.create(&PostParams::default(), &c).await.unwrap();
    cms.patch("free", &pp, &Patch::Merge(json!({"data": {"k": "w"}})))
        .await
        .unwrap();
}

#[tokio::test(start_paused = true)]
async fn services_get_cluster_ips_and_keep_them() {
    let server = TestServer::new();
    let api: Api<Service> = Api::namespaced(server.client("t"), "default");
    let k = api.get("kubernetes").await.unwrap();
    assert_eq!(k.spec.unwrap().cluster_ip.as_deref(), Some("10.96.0.1"));
    let svc = |n: &str| -> Service {
        obj(json!({"metadata": {"name": n}, "spec": {"ports": [{"port": 80}]}}))
    };
    let a = api.create(&PostParams::default(), &svc("a")).await.unwrap();
    let b = api.create(&PostParams::default(), &svc("b")).await.unwrap();
    let ip = |s: &Service| s.spec.as_ref().unwrap().cluster_ip.clone().unwrap();
    assert!(ip(&a).starts_with("10.96.0.") && ip(&b).starts_with("10.96.0."));
    assert_ne!(ip(&a), ip(&b));
    assert_ne!(ip(&a), "10.96.0.1");
    let spec = a.spec.as_ref().unwrap();
    assert_eq!(spec.type_.as_deref(), Some("ClusterIP"));
    assert_eq!(
        spec.ports.as_ref().unwrap()[0].protocol.as_deref(),
        Some("TCP")
    );
    // A replace without clusterIP keeps it; changing it is refused.
    let mut next = a.clone();
    next.spec.as_mut().unwrap().cluster_ip = None;
    next.spec.as_mut().unwrap().cluster_ips = None;
    let kept = api
        .replace("a", &PostParams::default(), &next)
        .await
        .unwrap();
    assert_eq!(ip(&kept), ip(&a));
    let e = api
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"clusterIP": "10.96.0.200"}})),
        )
        .await
        .unwrap_err();
    assert_eq!(code(&e), Some(422));
}

#[tokio::test(start_paused = true)]
async fn event_field_selectors_as_kubectl_describe_sends_them() {
    let server = TestServer::new();
    let client = server.client("t");
    let api: Api<Event> = Api::namespaced(client.clone(), "default");
    for (name, target) in [("e1", "web"), ("e2", "db")] {
        let e: Event = obj(json!({
            "metadata": {"name": name},
            "involvedObject": {"kind": "Deployment", "name": target, "namespace": "default", "uid": format!("uid-{target}")},
            "reason": "Scaled", "type": "Normal", "source": {"component": "deployment-controller"},
        }));
        api.create(&PostParams::default(), &e).await.unwrap();
    }
    let sel = "involvedObject.name=web,involvedObject.namespace=default,involvedObject.kind=Deployment,involvedObject.uid=uid-web";
    let got = api.list(&ListParams::default().fields(sel)).await.unwrap();
    let names: Vec<_> = got
        .items
        .iter()
        .map(|e| e.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(names, ["e1"]);
    let by_source = api
        .list(&ListParams::default().fields("source=deployment-controller,reason=Scaled"))
        .await
        .unwrap();
    assert_eq!(by_source.items.len(), 2);
    // A field the resource has no label for: 400, as the real server answers.
    let e = api
        .list(&ListParams::default().fields("spec.nodeName=x"))
        .await
        .unwrap_err();
    assert_eq!(code(&e), Some(400));
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let e = cms
        .list(&ListParams::default().fields("involvedObject.name=web"))
        .await
        .unwrap_err();
    assert_eq!(code(&e), Some(400));
    // fieldValidation is accepted (not enforced: there are no schemas).
    let uri = format!(
        "/api/v1/namespaces/default/events?fieldSelector={}",
        enc(sel)
    );
    assert_eq!(
        get_json(&client, &uri).await.unwrap()["items"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    let req = http::Request::post("/api/v1/namespaces/default/configmaps?fieldValidation=Strict")
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&json!({"metadata": {"name": "strict"}})).unwrap())
        .unwrap();
    client.request_text(req).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn reviews_allow_everything_and_are_not_stored() {
    let server = TestServer::new();
    let client = server.client("alice");
    let req = http::Request::post("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews")
        .header("content-type", "application/json")
        .body(
            serde_json::to_vec(
                &json!({"spec": {"resourceAttributes": {"verb": "delete", "resource": "pods"}}}),
            )
            .unwrap(),
        )
        .unwrap();
    let v: Value = serde_json::from_str(&client.request_text(req).await.unwrap()).unwrap();
    assert_eq!(v["status"]["allowed"], json!(true));
    let req = http::Request::post("/apis/authentication.k8s.io/v1/selfsubjectreviews")
        .header("content-type", "application/json")
        .body(b"{}".to_vec())
        .unwrap();
    let v: Value = serde_json::from_str(&client.request_text(req).await.unwrap()).unwrap();
    assert_eq!(v["status"]["userInfo"]["username"], json!("alice"));
    let e = get_json(
        &client,
        "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
    )
    .await
    .unwrap_err();
    assert_eq!(code(&e), Some(405));
}
