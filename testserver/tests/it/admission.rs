//! ValidatingAdmissionPolicies: the answers kube-apiserver v1.36.2 gave to the same writes (recorded by hand
//! on `../shared/realkube`, and by the ignored e2e test `fence_policy_on_real_server`).

use k8s_openapi::api::{apps::v1::Deployment, core::v1::ConfigMap};
use kube::{
    api::{Patch, PatchParams, PostParams},
    core::Status,
    Api,
};
use kube_shard::fence_policy::{messages, FencePolicyConfig};
use kube_shard_testserver::TestServer;
use serde_json::{json, Value};

use crate::common::cm;

const PREFIX: &str =
    "ValidatingAdmissionPolicy 'kube-shard-fence' with binding 'kube-shard-fence' denied request: ";

async fn install(server: &TestServer, docs: Vec<Value>) {
    let client = server.client("admin");
    for doc in docs {
        let kind = doc["kind"].as_str().unwrap();
        let plural = if kind == "ValidatingAdmissionPolicy" {
            "validatingadmissionpolicies"
        } else {
            "validatingadmissionpolicybindings"
        };
        let req = http::Request::post(format!("/apis/admissionregistration.k8s.io/v1/{plural}"))
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&doc).unwrap())
            .unwrap();
        client.request_text(req).await.unwrap();
    }
}

async fn install_fence_policy(server: &TestServer, resources: &[&str]) {
    let set = FencePolicyConfig::new(resources.iter().map(|r| r.parse().unwrap()).collect())
        .generate()
        .unwrap();
    let mut docs: Vec<Value> = set
        .policies
        .iter()
        .map(|p| serde_json::to_value(p).unwrap())
        .collect();
    docs.extend(
        set.bindings
            .iter()
            .map(|b| serde_json::to_value(b).unwrap()),
    );
    install(server, docs).await;
}

fn status(e: kube::Error) -> Box<Status> {
    match e {
        kube::Error::Api(s) => s,
        other => panic!("not an API error: {other}"),
    }
}

/// The real server's refusal: 422 Invalid, `<what> "<name>" is forbidden: <prefix><msg>`, one cause.
fn assert_refused(s: &Status, what: &str, name: &str, msg: &str) {
    assert_eq!((s.code, s.reason.as_str()), (422, "Invalid"), "{s:?}");
    assert_eq!(
        s.message,
        format!("{what} \"{name}\" is forbidden: {PREFIX}{msg}")
    );
    let d = s.details.as_ref().expect("details");
    assert_eq!(d.name, name);
    assert_eq!(d.kind, what.split('.').next().unwrap());
    assert_eq!(d.causes.len(), 1);
    assert_eq!(d.causes[0].message, format!("{PREFIX}{msg}"));
}

fn fence(token: Option<&str>) -> Patch<Value> {
    Patch::Merge(json!({"metadata": {"annotations": {"kube-shard.io/fence": token}}}))
}

#[tokio::test]
async fn trivial_policy_denies_like_the_real_server() {
    let server = TestServer::new();
    install(
        &server,
        vec![
            json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
                   "metadata": {"name": "trivial"},
                   "spec": {"failurePolicy": "Fail",
                            "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["*"],
                                "resources": ["configmaps"], "operations": ["CREATE"]}]},
                            "validations": [{"expression": "!object.metadata.name.startsWith('deny-')",
                                             "message": "names starting with deny- are refused"}]}}),
            json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
                   "metadata": {"name": "trivial-binding"},
                   "spec": {"policyName": "trivial", "validationActions": ["Deny"]}}),
        ],
    )
    .await;
    let api: Api<ConfigMap> = Api::namespaced(server.client("a"), "default");
    let s = status(
        api.create(&PostParams::default(), &cm("deny-x"))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        s.message,
        "configmaps \"deny-x\" is forbidden: ValidatingAdmissionPolicy 'trivial' with binding 'trivial-binding' denied request: names starting with deny- are refused"
    );
    assert_eq!((s.code, s.reason.as_str()), (422, "Invalid"));
    api.create(&PostParams::default(), &cm("allow-x"))
        .await
        .unwrap();
}

/// Test 1 of issue 16: a write that passes the uid and resourceVersion preconditions but carries a lower
/// epoch is refused; the same write without the policy commits.
#[tokio::test]
async fn lower_epoch_with_fresh_preconditions_is_refused() {
    for with_policy in [true, false] {
        let server = TestServer::new();
        if with_policy {
            install_fence_policy(&server, &["configmaps"]).await;
        }
        let api: Api<ConfigMap> = Api::namespaced(server.client("a"), "default");
        api.create(&PostParams::default(), &cm("t1")).await.unwrap();
        let pp = PatchParams::default();
        api.patch("t1", &pp, &fence(Some("3/1000"))).await.unwrap(); // the deposed owner's last write
        api.patch("t1", &pp, &fence(Some("3/2000"))).await.unwrap(); // the new owner's fenced write
                                                                     // the deposed owner re-reads (fresh uid and resourceVersion) and writes with its old fence
        let mut late = api.get("t1").await.unwrap();
        late.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert("kube-shard.io/fence".into(), "3/1000".into());
        let res = api.replace("t1", &PostParams::default(), &late).await;
        if with_policy {
            assert_refused(
                &status(res.unwrap_err()),
                "configmaps",
                "t1",
                messages::STALE,
            );
            let stored = api.get("t1").await.unwrap();
            assert_eq!(
                stored.metadata.annotations.unwrap()["kube-shard.io/fence"],
                "3/2000"
            );
        } else {
            assert_eq!(
                res.unwrap().metadata.annotations.unwrap()["kube-shard.io/fence"],
                "3/1000"
            );
        }
    }
}

/// The same matrix as on the real server: owners' writes pass; other shard, malformed, oversized and removed
/// fences are refused with their messages; a stale resourceVersion is a 409 before admission runs.
#[tokio::test]
async fn fence_policy_matrix() {
    let server = TestServer::new();
    install_fence_policy(&server, &["configmaps", "deployments.apps"]).await;
    let api: Api<ConfigMap> = Api::namespaced(server.client("a"), "default");
    let pp = PatchParams::default();
    let first = api.create(&PostParams::default(), &cm("t1")).await.unwrap();
    for ok in ["3/1000", "3/1000", "3/2000", "3/02000"] {
        api.patch("t1", &pp, &fence(Some(ok))).await.unwrap();
    }
    for (bad, msg) in [
        (Some("3/1500"), messages::STALE),
        (Some("4/3000"), messages::SHARD),
        (Some("x/3000"), messages::MALFORMED),
        (Some("3/1234567890123456789"), messages::MALFORMED),
        (None, messages::REMOVED),
    ] {
        let s = status(api.patch("t1", &pp, &fence(bad)).await.unwrap_err());
        assert_refused(&s, "configmaps", "t1", msg);
    }
    // an edit that keeps the fence (kubectl edit/patch) passes
    api.patch("t1", &pp, &Patch::Merge(json!({"data": {"b": "2"}})))
        .await
        .unwrap();
    // preconditions first: a stale resourceVersion is a 409 even with a stale fence
    let mut stale = first.clone();
    stale.metadata.annotations =
        Some([("kube-shard.io/fence".to_string(), "3/1".to_string())].into());
    let s = status(
        api.replace("t1", &PostParams::default(), &stale)
            .await
            .unwrap_err(),
    );
    assert_eq!(s.code, 409);
    // unfenced objects are not concerned
    api.create(&PostParams::default(), &cm("t2")).await.unwrap();
    api.patch("t2", &pp, &Patch::Merge(json!({"data": {"x": "y"}})))
        .await
        .unwrap();

    let deploys: Api<Deployment> = Api::namespaced(server.client("a"), "default");
    let d: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "d1", "annotations": {"kube-shard.io/fence": "2/500"}},
        "spec": {"selector": {"matchLabels": {"a": "b"}},
                 "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "x"}]}}}
    }))
    .unwrap();
    deploys.create(&PostParams::default(), &d).await.unwrap();
    let s = status(
        deploys
            .patch("d1", &pp, &fence(Some("2/400")))
            .await
            .unwrap_err(),
    );
    assert_refused(&s, "deployments.apps", "d1", messages::STALE);
    assert_eq!(s.details.unwrap().group, "apps");
}
