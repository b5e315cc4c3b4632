//! Status-field fences: on a CRD's `/status` UPDATE the stored metadata is copied over the request's, so the
//! fence travels in a status field (`.status.kubeShardFence`); the generated `-status` policies compare it
//! with the annotation's rules, per object and per shard. The answers are the real server's shape (422
//! Invalid, `widgets.example.com "<name>" is forbidden: ValidatingAdmissionPolicy ...`), checked on
//! kube-apiserver v1.36.2 by the ignored e2e test `status_fence_on_real_server`.

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{
    api::{Patch, PatchParams, PostParams},
    core::{ApiResource, DynamicObject, GroupVersionKind, Status},
    Api,
};
use kube_shard::fence_policy::FencePolicyConfig;
use kube_shard::testing::fence_messages as messages;
use kube_shard_testserver::TestServer;
use serde_json::{json, Value};

const FIELD: &str = ".status.kubeShardFence";

fn widget_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("example.com", "v1", "Widget"),
        "widgets",
    )
}

/// Which policies [`setup`] installs.
#[derive(Clone, Copy)]
enum Policies<'a> {
    None,
    /// The per-object ones (annotation and status field).
    PerObject,
    /// Both levels, the parameter ConfigMap `default/fence-params` created with this data.
    BothLevels(&'a [(&'a str, &'a str)]),
}

/// The Widget CRD (its schema declaring the fence field), `policies`, and the Widget `w1`.
async fn setup(server: &TestServer, policies: Policies<'_>) -> Api<DynamicObject> {
    let admin = server.client("admin");
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "names": {"kind": "Widget", "plural": "widgets", "singular": "widget", "listKind": "WidgetList"},
            "scope": "Namespaced",
            "versions": [{"name": "v1", "served": true, "storage": true, "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                    "status": {"type": "object", "properties": {
                        "phase": {"type": "string"}, "kubeShardFence": {"type": "string"}}}}}}}]
        }
    }))
    .unwrap();
    Api::<CustomResourceDefinition>::all(admin.clone())
        .create(&PostParams::default(), &crd)
        .await
        .unwrap();
    let mut cfg = FencePolicyConfig::new(vec!["widgets.example.com".parse().unwrap()])
        .status_field(FIELD.parse().unwrap());
    let params = match policies {
        Policies::BothLevels(data) => Some(data),
        _ => None,
    };
    if params.is_some() {
        cfg = cfg.params("default/fence-params".parse().unwrap());
    }
    let set = cfg.generate().unwrap();
    if let (Some(data), Some(cm)) = (params, &set.params) {
        let mut cm = cm.clone();
        cm.data = Some(
            data.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        Api::<ConfigMap>::namespaced(admin.clone(), "default")
            .create(&PostParams::default(), &cm)
            .await
            .unwrap();
    }
    let docs = set
        .policies
        .iter()
        .map(|p| {
            (
                "validatingadmissionpolicies",
                serde_json::to_vec(p).unwrap(),
            )
        })
        .chain(set.bindings.iter().map(|b| {
            (
                "validatingadmissionpolicybindings",
                serde_json::to_vec(b).unwrap(),
            )
        }))
        .filter(|_| !matches!(policies, Policies::None));
    for (plural, body) in docs {
        let req = http::Request::post(format!("/apis/admissionregistration.k8s.io/v1/{plural}"))
            .header("content-type", "application/json")
            .body(body)
            .unwrap();
        admin.request_text(req).await.unwrap();
    }
    let api = Api::namespaced_with(server.client("a"), "default", &widget_resource());
    let mut w = DynamicObject::new("w1", &widget_resource());
    w.data = json!({"spec": {"size": 1}});
    api.create(&PostParams::default(), &w).await.unwrap();
    api
}

fn status(e: kube::Error) -> Box<Status> {
    match e {
        kube::Error::Api(s) => s,
        other => panic!("not an API error: {other}"),
    }
}

/// A `/status` merge patch setting the fence field to `token` (`None`: removing it).
async fn write(
    api: &Api<DynamicObject>,
    token: Option<&str>,
) -> Result<DynamicObject, kube::Error> {
    let patch: Value = json!({"status": {"phase": "x", "kubeShardFence": token}});
    api.patch_status("w1", &PatchParams::default(), &Patch::Merge(patch))
        .await
}

fn assert_refused(s: &Status, policy: &str, msg: &str) {
    let inner = format!(
        "ValidatingAdmissionPolicy '{policy}' with binding '{policy}' denied request: {msg}"
    );
    assert_eq!((s.code, s.reason.as_str()), (422, "Invalid"), "{s:?}");
    assert_eq!(
        s.message,
        format!("widgets.example.com \"w1\" is forbidden: {inner}")
    );
    let d = s.details.as_ref().expect("details");
    assert_eq!(
        (d.name.as_str(), d.group.as_str(), d.kind.as_str()),
        ("w1", "example.com", "widgets")
    );
    assert_eq!(d.causes.len(), 1);
    assert_eq!(d.causes[0].message, inner);
}

#[tokio::test]
async fn status_field_policy_matrix() {
    let server = TestServer::new();
    let api = setup(&server, Policies::PerObject).await;
    let p = "kube-shard-fence-status";
    write(&api, Some("3/7")).await.unwrap(); // a first stamp
    write(&api, Some("3/7")).await.unwrap(); // the same epoch
    write(&api, Some("03/9")).await.unwrap(); // a higher one (shard compared as a number)
    assert_refused(
        &status(write(&api, Some("3/8")).await.unwrap_err()),
        p,
        messages::STALE,
    );
    assert_refused(
        &status(write(&api, Some("4/9")).await.unwrap_err()),
        p,
        messages::SHARD,
    );
    assert_refused(
        &status(write(&api, None).await.unwrap_err()),
        p,
        messages::STATUS_REMOVED,
    );
    for bad in ["x", "3/", "1234567890/1", "3/1234567890123456789"] {
        let s = status(write(&api, Some(bad)).await.unwrap_err());
        assert_refused(&s, p, messages::STATUS_MALFORMED);
    }
    let stored = api.get("w1").await.unwrap();
    assert_eq!(stored.data["status"]["kubeShardFence"], "03/9");
    // every refusal is in the log, in order, as a `/status` UPDATE of w1
    let log = server.admission_refusals();
    assert_eq!(log.len(), 7);
    assert!(log
        .iter()
        .all(|r| r.subresource.as_deref() == Some("status")
            && r.operation == "UPDATE"
            && r.name == "w1"
            && r.resource == "widgets.example.com"
            && r.fence.is_none()));
    assert!(log[0].message.ends_with(messages::STALE), "{:?}", log[0]);
    assert!(log
        .windows(2)
        .all(|w| w[0].resource_version <= w[1].resource_version));
    // the main resource is not this policy's: a spec write without any fence passes
    api.patch(
        "w1",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"size": 2}})),
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn status_field_per_shard_policy_refuses_below_the_published_epoch() {
    let server = TestServer::new();
    let api = setup(&server, Policies::BothLevels(&[("3", "9")])).await;
    let p = "kube-shard-fence-status-shard";
    // the object's own fence is absent (the per-object level passes), the shard's floor is 9
    assert_refused(
        &status(write(&api, Some("3/8")).await.unwrap_err()),
        p,
        messages::SHARD_STALE,
    );
    write(&api, Some("3/9")).await.unwrap();
    write(&api, Some("5/1")).await.unwrap_err(); // another shard than the stored fence's
    write(&api, Some("3/10")).await.unwrap();
}

#[tokio::test]
async fn without_the_policy_a_lower_status_fence_commits() {
    let server = TestServer::new();
    let api = setup(&server, Policies::None).await;
    write(&api, Some("3/9")).await.unwrap();
    let w = write(&api, Some("3/7")).await.unwrap();
    assert_eq!(w.data["status"]["kubeShardFence"], "3/7");
}
